//! Membership changes, one voter at a time: a membership takes effect when appended, a leader
//! proposes one only after committing an entry of its own term (Ongaro's fix for the
//! single-server change bug) and while no other change is uncommitted. Learners catch up before
//! promotion; a member seen on a new disk is demoted to a learner and promoted back once caught up.

use crate::error::ChangeError;
use crate::group::{Proposal, RaftGroup, RaftRole};
use crate::types::{DiskId, EntryKind, Membership, NodeId, Replica, Role};

/// One single-server change.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ConfChange {
    /// A new replica that receives the log and does not vote.
    AddLearner {
        replica: Replica,
        auto_promote: bool,
    },
    /// A caught-up learner becomes a voter.
    Promote(NodeId),
    /// A voter becomes a learner (before removal, or for a drain).
    Demote(NodeId),
    Remove(NodeId),
    /// `node` is back on a new, empty disk: whatever it was, it is now a learner on `disk`,
    /// promoted once caught up. Removes at most one voter, so it is a single-server change.
    Rejoin {
        node: NodeId,
        disk: DiskId,
    },
}

impl RaftGroup {
    /// Proposes a membership change. Acknowledge it once `Ready::committed` lists it.
    pub fn propose_change(&mut self, change: ConfChange) -> Result<Proposal, ChangeError> {
        self.check_can_propose(0)?;
        // The base (index 0) is committed; any later one is pending until the commit passes it.
        if let Some(&(o, _)) = self.configs.last().filter(|_| self.configs.len() > 1) {
            if o >= self.commit {
                return Err(ChangeError::ChangePending(o));
            }
        }
        let next = self.apply_change(self.membership().clone(), change)?;
        self.dirty = true;
        Ok(self.append_as_leader(EntryKind::Config, next.encode(), 1))
    }

    fn apply_change(
        &self,
        mut m: Membership,
        change: ConfChange,
    ) -> Result<Membership, ChangeError> {
        let pos = |m: &Membership, n: NodeId| m.members.iter().position(|(r, _)| r.node == n);
        match change {
            ConfChange::AddLearner {
                replica,
                auto_promote,
            } => {
                if pos(&m, replica.node).is_some() {
                    return Err(ChangeError::AlreadyMember(replica.node));
                }
                if m.members.len() >= crate::types::MEMBERS_MAX {
                    return Err(ChangeError::TooManyMembers);
                }
                m.members.push((replica, Role::Learner { auto_promote }));
            }
            ConfChange::Promote(n) => {
                let i = pos(&m, n).ok_or(ChangeError::UnknownNode(n))?;
                if m.members[i].1 == Role::Voter {
                    return Err(ChangeError::AlreadyMember(n));
                }
                let lag = self.learner_lag(n);
                if lag > self.cfg.learner_caught_up_offsets {
                    return Err(ChangeError::LearnerBehind {
                        node: n,
                        lag_offsets: lag,
                    });
                }
                m.members[i].1 = Role::Voter;
            }
            ConfChange::Demote(n) => {
                let i = pos(&m, n).ok_or(ChangeError::UnknownNode(n))?;
                if m.members[i].1 != Role::Voter {
                    return Err(ChangeError::NotVoter(n));
                }
                m.members[i].1 = Role::Learner {
                    auto_promote: false,
                };
            }
            ConfChange::Remove(n) => {
                let i = pos(&m, n).ok_or(ChangeError::UnknownNode(n))?;
                m.members.remove(i);
            }
            ConfChange::Rejoin { node, disk } => {
                let i = pos(&m, node).ok_or(ChangeError::UnknownNode(node))?;
                m.members[i] = (Replica { node, disk }, Role::Learner { auto_promote: true });
            }
        }
        if m.voter_count() == 0 {
            return Err(ChangeError::NoVoterLeft);
        }
        Ok(m)
    }

    /// Offsets a member's verified log is behind the leader's end.
    fn learner_lag(&self, n: NodeId) -> u64 {
        self.progress
            .get(&n)
            .map_or(u64::MAX, |p| self.log.end.saturating_sub(p.matched))
    }

    /// The active membership changed (appended, truncated or installed).
    pub(crate) fn on_membership_changed(&mut self) {
        self.dirty = true;
        if self.role == RaftRole::Leader {
            self.sync_progress();
        }
    }

    /// A leader whose removal (or demotion) committed steps down; others elect a leader. With
    /// the change committed, the next one may go: promote a caught-up learner.
    pub(crate) fn after_commit(&mut self) {
        if self.role != RaftRole::Leader {
            return;
        }
        let (o, m) = self.configs.last().expect("configs never empty");
        if *o < self.commit && !m.is_voter(self.me, self.hs.disk) {
            let term = self.hs.term;
            self.become_follower(term, None);
            return;
        }
        let learners: Vec<NodeId> = m
            .members
            .iter()
            .filter(|(_, r)| matches!(r, Role::Learner { auto_promote: true }))
            .map(|(r, _)| r.node)
            .collect();
        for n in learners {
            self.maybe_promote(n);
        }
    }

    /// Leader: an auto-promote learner that caught up becomes a voter.
    pub(crate) fn maybe_promote(&mut self, node: NodeId) {
        let auto = matches!(
            self.membership().get(node),
            Some((_, Role::Learner { auto_promote: true }))
        );
        if auto && self.learner_lag(node) <= self.cfg.learner_caught_up_offsets {
            let _ = self.propose_change(ConfChange::Promote(node));
        }
    }

    /// Leader: `node` answered from a disk the membership does not list for it. Its log is not
    /// the one the membership counted on: demote it to a learner on the new disk (not counted,
    /// never voting) until it has caught up again.
    pub(crate) fn on_foreign_disk(&mut self, node: NodeId, disk: DiskId) {
        let _ = self.propose_change(ConfChange::Rejoin { node, disk });
    }
}
