//! `MultiRaft`: the groups of one core (~1,000 partitions) behind one tick, with heartbeats
//! coalesced into one message per peer node per interval.
//!
//! An idle group has no timer of its own: the registry's tick visits each group for a couple of
//! comparisons, and the heartbeat round builds one `Heartbeat` per peer carrying a
//! (group, term, commit) tuple for every group this core leads with that peer as a member.

use crate::config::Config;
use crate::error::{ProposeError, StepError};
use crate::group::{Proposal, RaftGroup, Ready};
use crate::message::{Envelope, Heartbeat, HeartbeatGroup, HeartbeatResp, HEARTBEAT_GROUPS_MAX};
use crate::types::{Entry, GroupId, NodeId, Offset, Restore, Snapshot};
use bytes::Bytes;
use std::collections::BTreeMap;

/// Output of one `ready()` round: per-group work for the log owner, and every message to send.
#[derive(Debug, Default)]
pub struct MultiReady {
    pub groups: Vec<(GroupId, Ready)>,
    pub messages: Vec<Envelope>,
}

pub struct MultiRaft {
    me: NodeId,
    cfg: Config,
    // BTreeMap, not HashMap: iteration order must not depend on a per-process hash seed, or a
    // simulation would not replay.
    groups: BTreeMap<GroupId, RaftGroup>,
    next_heartbeat_ms: u64,
    outbox: Vec<Envelope>,
}

impl MultiRaft {
    pub fn new(me: NodeId, cfg: Config) -> Self {
        MultiRaft {
            me,
            cfg,
            groups: BTreeMap::new(),
            next_heartbeat_ms: 0,
            outbox: Vec::new(),
        }
    }

    pub fn node(&self) -> NodeId {
        self.me
    }

    pub fn add_group(
        &mut self,
        id: GroupId,
        restore: Restore,
        now_ms: u64,
        seed: u64,
    ) -> Result<(), StepError> {
        if self.groups.contains_key(&id) {
            return Err(StepError::GroupExists(id));
        }
        if restore.node != self.me {
            return Err(StepError::BadRestore("restore names another node"));
        }
        let g = RaftGroup::new(id, self.cfg.clone(), restore, now_ms, seed)?;
        self.groups.insert(id, g);
        Ok(())
    }

    pub fn remove_group(&mut self, id: GroupId) -> Option<RaftGroup> {
        self.groups.remove(&id)
    }

    pub fn group(&self, id: GroupId) -> Option<&RaftGroup> {
        self.groups.get(&id)
    }

    pub fn group_mut(&mut self, id: GroupId) -> Option<&mut RaftGroup> {
        self.groups.get_mut(&id)
    }

    pub fn groups(&self) -> impl Iterator<Item = &RaftGroup> {
        self.groups.values()
    }

    fn get(&mut self, id: GroupId) -> Result<&mut RaftGroup, StepError> {
        self.groups.get_mut(&id).ok_or(StepError::UnknownGroup(id))
    }

    pub fn propose(
        &mut self,
        group: GroupId,
        data: Bytes,
        count: u32,
    ) -> Result<Proposal, ProposeError> {
        match self.groups.get_mut(&group) {
            Some(g) => g.propose(data, count),
            None => Err(ProposeError::NotLeader { leader: None }),
        }
    }

    pub fn on_appended(
        &mut self,
        group: GroupId,
        log_epoch: u64,
        offset: Offset,
    ) -> Result<(), StepError> {
        self.get(group)?.on_appended(log_epoch, offset);
        Ok(())
    }

    pub fn on_flushed(
        &mut self,
        group: GroupId,
        log_epoch: u64,
        offset: Offset,
    ) -> Result<(), StepError> {
        self.get(group)?.on_flushed(log_epoch, offset);
        Ok(())
    }

    pub fn on_fetched(
        &mut self,
        group: GroupId,
        peer: NodeId,
        from: Offset,
        entries: Vec<Entry>,
    ) -> Result<(), StepError> {
        self.get(group)?.on_fetched(peer, from, entries);
        Ok(())
    }

    pub fn on_snapshot_built(
        &mut self,
        group: GroupId,
        peer: NodeId,
        s: Snapshot,
    ) -> Result<(), StepError> {
        self.get(group)?.on_snapshot_built(peer, s);
        Ok(())
    }

    /// Feeds one message from the network.
    pub fn step(&mut self, now_ms: u64, env: Envelope) -> Result<(), StepError> {
        if env.to() != self.me {
            return Err(StepError::WrongNode {
                to: env.to(),
                me: self.me,
            });
        }
        match env {
            Envelope::Group(m) => self.get(m.group)?.step(now_ms, m),
            Envelope::Heartbeat(hb) => {
                let mut groups = Vec::with_capacity(hb.groups.len());
                for h in hb.groups {
                    // A group not (yet) created here is skipped: the leader learns nothing and
                    // keeps sending, which costs a tuple per heartbeat, not an error.
                    if let Some(g) = self.groups.get_mut(&h.group) {
                        groups.push(g.handle_heartbeat(now_ms, hb.from, h));
                    }
                }
                if !groups.is_empty() {
                    self.outbox.push(Envelope::HeartbeatResp(HeartbeatResp {
                        from: self.me,
                        to: hb.from,
                        sent_ms: hb.sent_ms,
                        groups,
                    }));
                }
                Ok(())
            }
            Envelope::HeartbeatResp(r) => {
                for h in r.groups {
                    if let Some(g) = self.groups.get_mut(&h.group) {
                        g.handle_heartbeat_resp(now_ms, r.from, r.sent_ms, h);
                    }
                }
                Ok(())
            }
        }
    }

    /// Advances time for every group; every `heartbeat_interval_ms`, queues one coalesced
    /// heartbeat per peer node.
    pub fn tick(&mut self, now_ms: u64) {
        for g in self.groups.values_mut() {
            g.tick(now_ms);
        }
        if now_ms < self.next_heartbeat_ms {
            return;
        }
        self.next_heartbeat_ms = now_ms + self.cfg.heartbeat_interval_ms;
        let mut per_peer: BTreeMap<NodeId, Vec<HeartbeatGroup>> = BTreeMap::new();
        for g in self.groups.values() {
            if g.role() != crate::RaftRole::Leader {
                continue;
            }
            for &peer in g.progress.keys() {
                if let Some(h) = g.heartbeat_for(peer) {
                    per_peer.entry(peer).or_default().push(h);
                }
            }
        }
        for (to, groups) in per_peer {
            // More groups than one message may carry (the codec's bound) go in several.
            for chunk in groups.chunks(HEARTBEAT_GROUPS_MAX) {
                self.outbox.push(Envelope::Heartbeat(Heartbeat {
                    from: self.me,
                    to,
                    sent_ms: now_ms,
                    groups: chunk.to_vec(),
                }));
            }
        }
    }

    /// Whether [`MultiRaft::ready`] has anything: messages queued, or a group with work.
    pub fn has_ready(&self) -> bool {
        !self.outbox.is_empty() || self.groups.values().any(|g| g.has_ready())
    }

    /// Collects the work of every group that has some, and all messages to send.
    pub fn ready(&mut self) -> MultiReady {
        let mut out = MultiReady {
            groups: Vec::new(),
            messages: std::mem::take(&mut self.outbox),
        };
        for (id, g) in self.groups.iter_mut() {
            if !g.has_ready() {
                continue;
            }
            let mut r = g.ready();
            out.messages
                .extend(r.messages.drain(..).map(Envelope::Group));
            if !r.is_empty() {
                out.groups.push((*id, r));
            }
        }
        out
    }
}
