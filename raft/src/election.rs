//! Elections: pre-vote (always on), votes, becoming leader or follower, the check-quorum lease,
//! and leadership transfer (TimeoutNow).
//!
//! Disk identity is checked on both sides: a replica votes and campaigns only while the active
//! membership lists it as a voter *with its current disk*, and a candidate counts a vote only from
//! a voter whose answer names the disk the membership lists. A node that lost its disk comes back
//! with a new disk id and an empty log, so it can neither elect itself nor hand its vote out.

use crate::group::{RaftGroup, RaftRole};
use crate::message::Body;
use crate::progress::Progress;
use crate::types::{DiskId, EntryKind, NodeId, Offset, Term};
use bytes::Bytes;

impl RaftGroup {
    pub(crate) fn reset_election_deadline(&mut self) {
        let t = self.cfg.election_timeout_ms;
        self.election_deadline_ms = self.now_ms + self.rng.range(t, 2 * t);
    }

    /// A leader was heard from within the election timeout (or this node leads and its quorum
    /// answered): votes for a higher term are ignored, so a node that was partitioned away and
    /// comes back cannot depose a working leader.
    pub(crate) fn in_lease(&self) -> bool {
        self.leader.is_some()
            && self
                .leader_contact_ms
                .is_some_and(|t| self.now_ms < t + self.cfg.election_timeout_ms)
    }

    /// A voter of the active membership may campaign; so may a voter of the last committed one
    /// while a newer one is pending. Otherwise a leader that appended its own removal and then
    /// lost its quorum leaves a cluster where the only replica holding the change may not
    /// campaign and the others may not win without it (their logs are behind it). Elected, it
    /// commits the change and steps down (`after_commit`).
    pub(crate) fn can_campaign(&self) -> bool {
        if self.is_voter() {
            return true;
        }
        if self.rescue_campaign_due() {
            return true;
        }
        // The base (index 0) is committed; a later entry once the commit passed it.
        let n = self.configs.len();
        let committed = (0..n)
            .rev()
            .find(|&i| i == 0 || self.configs[i].0 < self.commit)
            .map(|i| &self.configs[i]);
        let pending = n > 1 && self.configs[n - 1].0 >= self.commit;
        pending && committed.is_some_and(|(_, m)| m.is_voter(self.me, self.hs.disk))
    }

    /// A replica that is not a voter in its own view may still hold the most up-to-date log of
    /// the voters that can be reached: it missed its own promotion, and the log holding the
    /// promotion lost the election to it (seen in the simulator: a disk loss, a 4-voter group,
    /// the only replica with the newest term a not-yet-promoted learner, every election stuck).
    /// After long enough without a leader (4 election timeouts, so it never races the voters'
    /// own elections) it campaigns; voters still check its log, so this is safe, and elected
    /// it commits its term and steps down (`after_commit`) for a voter to take over.
    fn rescue_campaign_due(&self) -> bool {
        let silent_since = self.leader_contact_ms.unwrap_or(self.created_ms);
        !self.membership().members.is_empty()
            && self.may_vote()
            && self.now_ms >= silent_since + 4 * self.cfg.election_timeout_ms
    }

    /// Whether this replica may grant votes: not when its membership lists this node on another
    /// disk (it is the replacement of a lost disk and knows it). A replica that knows no
    /// membership yet may answer: the candidate counts a vote only if the answer names the disk
    /// its membership lists, so the vote of a replacement disk is never counted, while a member
    /// whose disk is intact but holds nothing durable yet (added, never flushed) still votes —
    /// without it a group can lose its quorum for good (seen in the simulator).
    pub(crate) fn may_vote(&self) -> bool {
        self.membership()
            .get(self.me)
            .is_none_or(|(r, _)| r.disk == self.hs.disk)
    }

    /// Starts a pre-vote (`pre`) or a real election. A pre-vote changes neither term nor vote:
    /// a node that cannot win (stale log, or a leader still alive) never bumps the term.
    pub(crate) fn campaign(&mut self, pre: bool, transfer: bool) {
        self.votes.clear();
        self.leader = None;
        self.reset_election_deadline();
        let term = if pre {
            self.role = RaftRole::PreCandidate;
            self.hs.term + 1
        } else {
            self.role = RaftRole::Candidate;
            self.hs.term += 1;
            self.hs.vote = Some(self.me);
            self.leader_match = 0;
            self.persist_hard_state();
            self.hs.term
        };
        self.votes.insert(self.me, true);
        if self.tally() {
            return;
        }
        let me = self.me;
        let voters: Vec<NodeId> = self.membership().voter_ids().filter(|&v| v != me).collect();
        for v in voters {
            self.send(
                v,
                term,
                Body::Vote {
                    pre,
                    transfer,
                    disk: self.hs.disk,
                    last_offset: self.log.end,
                    last_term: self.log.last_term(),
                },
            );
        }
    }

    pub(crate) fn handle_vote(
        &mut self,
        from: NodeId,
        term: Term,
        pre: bool,
        disk: DiskId,
        last_offset: Offset,
        last_term: Term,
    ) {
        let m = self.membership();
        // The candidate must not be a known node on another disk (an amnesiac replica).
        let candidate_ok = m.get(from).is_none_or(|(r, _)| r.disk == disk);
        let up_to_date = (last_term, last_offset) >= (self.log.last_term(), self.log.end);
        let granted = self.may_vote()
            && candidate_ok
            && up_to_date
            && if pre {
                // Would vote for it in `term` (> ours, checked in `step`), lease permitting.
                term > self.hs.term
            } else {
                // One vote per term; none for others while this term's leader is known.
                self.hs.vote == Some(from) || (self.hs.vote.is_none() && self.leader.is_none())
            };
        if granted && !pre {
            self.hs.vote = Some(from);
            self.persist_hard_state();
            self.reset_election_deadline();
        }
        // A granted pre-vote answers in the asked term; anything else in ours.
        let reply_term = if pre && granted { term } else { self.hs.term };
        self.send(
            from,
            reply_term,
            Body::VoteResp {
                pre,
                granted,
                disk: self.hs.disk,
            },
        );
    }

    pub(crate) fn handle_vote_resp(
        &mut self,
        from: NodeId,
        pre: bool,
        granted: bool,
        disk: DiskId,
    ) {
        let expected = if pre {
            RaftRole::PreCandidate
        } else {
            RaftRole::Candidate
        };
        if self.role != expected || !self.membership().is_voter(from, disk) {
            return;
        }
        self.votes.entry(from).or_insert(granted);
        self.tally();
    }

    /// Counts votes; acts on a decided election. Returns whether it was decided.
    fn tally(&mut self) -> bool {
        let m = self.membership();
        let quorum = m.quorum();
        let mut yes = 0;
        let mut no = 0;
        for v in m.voter_ids() {
            match self.votes.get(&v) {
                Some(true) => yes += 1,
                Some(false) => no += 1,
                None => {}
            }
        }
        if yes >= quorum {
            if self.role == RaftRole::PreCandidate {
                self.campaign(false, false);
            } else {
                self.become_leader();
            }
            true
        } else if no >= quorum {
            let term = self.hs.term;
            self.become_follower(term, None);
            true
        } else {
            false
        }
    }

    pub(crate) fn become_follower(&mut self, term: Term, leader: Option<NodeId>) {
        if term > self.hs.term {
            self.hs.term = term;
            self.hs.vote = None;
            self.persist_hard_state();
            self.leader_match = 0;
        }
        if self.role == RaftRole::Leader {
            self.drop_pending();
            self.progress.clear();
            self.log.clear_cache();
            self.transfer = None;
            self.noop_end = None;
            self.leader_contact_ms = Some(self.now_ms);
        }
        self.dirty = true;
        self.role = RaftRole::Follower;
        self.votes.clear();
        if leader.is_some() && leader != self.leader {
            self.leader_contact_ms = Some(self.now_ms);
        }
        self.leader = leader;
        self.reported = (0, 0);
        self.reset_election_deadline();
    }

    fn become_leader(&mut self) {
        self.role = RaftRole::Leader;
        self.leader = Some(self.me);
        self.votes.clear();
        self.transfer = None;
        self.leader_contact_ms = Some(self.now_ms);
        self.quorum_deadline_ms = self.now_ms + self.cfg.election_timeout_ms;
        self.progress.clear();
        self.sync_progress();
        // The no-op confirms the term: once it commits, everything before it is committed too.
        let p = self.append_as_leader(EntryKind::Noop, Bytes::new(), 1);
        self.noop_end = Some(p.end);
    }

    /// Check-quorum: a leader that has not heard from a quorum within an election timeout steps
    /// down, so a leader cut off from the majority stops serving and a new one can be elected.
    pub(crate) fn tick_leader(&mut self) {
        if let Some((_, deadline)) = self.transfer {
            if self.now_ms >= deadline {
                self.transfer = None; // The target did not take over in time: serve again.
                self.dirty = true;
            }
        }
        if self.now_ms < self.quorum_deadline_ms {
            return;
        }
        self.dirty = true;
        let m = self.membership().clone();
        let mut active = 0;
        for v in m.voter_ids() {
            if v == self.me {
                active += usize::from(m.is_voter(self.me, self.hs.disk));
            } else if let Some(p) = self.progress.get_mut(&v) {
                active += usize::from(p.recent_active);
                p.recent_active = false;
            }
        }
        if active >= m.quorum() {
            self.leader_contact_ms = Some(self.now_ms);
            self.quorum_deadline_ms = self.now_ms + self.cfg.election_timeout_ms;
        } else {
            let term = self.hs.term;
            self.become_follower(term, None);
        }
    }

    /// Hands leadership to `target` (a voter): stop accepting proposals, bring it up to date,
    /// then tell it to campaign at once. Aborted after an election timeout.
    pub fn transfer_leadership(&mut self, target: NodeId) -> Result<(), crate::ChangeError> {
        self.check_can_propose(0)?;
        let m = self.membership();
        match m.get(target) {
            Some((_, crate::Role::Voter)) if target != self.me => {}
            Some(_) if target != self.me => return Err(crate::ChangeError::NotVoter(target)),
            _ => return Err(crate::ChangeError::UnknownNode(target)),
        }
        self.dirty = true;
        self.transfer = Some((target, self.now_ms + self.cfg.election_timeout_ms));
        self.maybe_send_timeout_now(target);
        Ok(())
    }

    pub(crate) fn maybe_send_timeout_now(&mut self, peer: NodeId) {
        if self.transfer.map(|(t, _)| t) != Some(peer) {
            return;
        }
        let caught_up = self
            .progress
            .get(&peer)
            .is_some_and(|p| p.matched == self.log.end);
        if caught_up {
            self.send(peer, self.hs.term, crate::message::Body::TimeoutNow);
        } else {
            self.send_append(peer);
        }
    }

    /// Starts a pre-vote now instead of waiting for the election timeout (an operator's
    /// "campaign", or a test). Returns false if this replica may not campaign.
    pub fn campaign_now(&mut self) -> bool {
        if self.role == RaftRole::Leader || !self.can_campaign() {
            return false;
        }
        self.dirty = true;
        self.campaign(true, false);
        true
    }

    pub(crate) fn handle_timeout_now(&mut self) {
        if self.role != RaftRole::Leader && self.can_campaign() {
            self.campaign(false, true);
        }
    }

    /// Makes `progress` match the active membership (leader only).
    pub(crate) fn sync_progress(&mut self) {
        let members = self.membership().members.clone();
        let end = self.log.end;
        self.progress.retain(|n, p| {
            members
                .iter()
                .any(|(r, _)| r.node == *n && r.disk == p.disk)
        });
        for (r, _) in members {
            if r.node != self.me {
                self.progress
                    .entry(r.node)
                    .or_insert_with(|| Progress::new(r.disk, end));
            }
        }
    }
}
