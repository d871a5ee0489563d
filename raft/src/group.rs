//! `RaftGroup`: one partition's Raft state machine — its state, `Ready`, the owner's callbacks,
//! `step` dispatch and `tick`. Elections, replication and membership live in their own files as
//! further `impl RaftGroup` blocks.

use crate::config::{Config, Durability};
use crate::error::{ProposeError, StepError};
use crate::log_view::LogView;
use crate::message::{Body, Message};
use crate::progress::Progress;
use crate::rng::SplitMix64;
use crate::types::{
    DiskId, Entry, EntryKind, GroupId, HardState, Membership, NodeId, Offset, Restore, Snapshot,
    SnapshotMeta, Term,
};
use bytes::Bytes;
use std::collections::{BTreeMap, VecDeque};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum RaftRole {
    Follower,
    PreCandidate,
    Candidate,
    Leader,
}

/// A proposal the leader appended: acknowledged to the client only once reported committed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Proposal {
    pub term: Term,
    pub offset: Offset,
    pub end: Offset,
    pub bytes: usize,
}

/// A request to read the log for catch-up: entries from the batch covering `from`, up to
/// `max_bytes` (at least one batch). Answer with [`RaftGroup::on_fetched`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Fetch {
    pub peer: NodeId,
    pub from: Offset,
    pub max_bytes: usize,
}

/// What the owner must do, in this order: persist `hard_state` (durably); install `snapshot`;
/// truncate the log at `truncate_to`; write `entries` (report with `on_appended`, and once
/// durable `on_flushed`, quoting `log_epoch`); then send `messages`, answer `fetches` and
/// `snapshot_requests`, apply up to `commit`, and answer clients of `committed` (success) and
/// `dropped` (outcome unknown: this node lost leadership before they committed).
#[derive(Debug, Default)]
pub struct Ready {
    pub hard_state: Option<HardState>,
    pub snapshot: Option<Snapshot>,
    pub truncate_to: Option<Offset>,
    pub entries: Vec<Entry>,
    pub log_epoch: u64,
    pub messages: Vec<Message>,
    pub fetches: Vec<Fetch>,
    /// Peers that need the snapshot at this log's start: answer with `on_snapshot_built`.
    pub snapshot_requests: Vec<NodeId>,
    pub commit: Option<Offset>,
    pub committed: Vec<Proposal>,
    pub dropped: Vec<Proposal>,
}

impl Ready {
    pub fn is_empty(&self) -> bool {
        self.hard_state.is_none()
            && self.snapshot.is_none()
            && self.truncate_to.is_none()
            && self.entries.is_empty()
            && self.messages.is_empty()
            && self.fetches.is_empty()
            && self.snapshot_requests.is_empty()
            && self.commit.is_none()
            && self.committed.is_empty()
            && self.dropped.is_empty()
    }
}

pub struct RaftGroup {
    pub(crate) id: GroupId,
    pub(crate) me: NodeId,
    pub(crate) cfg: Config,
    pub(crate) hs: HardState,
    pub(crate) role: RaftRole,
    pub(crate) leader: Option<NodeId>,
    pub(crate) log: LogView,
    /// Memberships by the offset of their entry; the first is the one at or below the log start
    /// (committed), the last is active (a membership takes effect when appended).
    pub(crate) configs: Vec<(Offset, Membership)>,
    pub(crate) commit: Offset,

    // The log owner's progress on this replica, in the current log epoch.
    pub(crate) appended: Offset,
    pub(crate) flushed: Offset,
    pub(crate) log_epoch: u64,
    /// Follower: how far this log is verified equal to the current leader's (reset with the term).
    pub(crate) leader_match: Offset,
    /// Follower: the (appended, flushed) last reported to the leader; `respond`: answer anyway.
    pub(crate) reported: (Offset, Offset),
    pub(crate) respond: bool,

    pub(crate) now_ms: u64,
    pub(crate) created_ms: u64,
    pub(crate) election_deadline_ms: u64,
    /// When a leader was last heard from (the pre-vote/vote lease), or, on a leader, when a
    /// quorum last answered.
    pub(crate) leader_contact_ms: Option<u64>,
    pub(crate) rng: SplitMix64,
    pub(crate) votes: BTreeMap<NodeId, bool>,

    // Leader only.
    pub(crate) progress: BTreeMap<NodeId, Progress>,
    /// Offset of this leader's no-op: once committed, the term is confirmed and the leader serves.
    pub(crate) noop_end: Option<Offset>,
    pub(crate) quorum_deadline_ms: u64,
    pub(crate) transfer: Option<(NodeId, u64)>,
    pub(crate) pending: VecDeque<Proposal>,
    pub(crate) pending_bytes: usize,

    pub(crate) out: Ready,
    /// Set by anything that may have produced output; cleared by `ready()`.
    pub(crate) dirty: bool,
}

impl RaftGroup {
    /// Opens a group from what the owner recovered. `seed` drives election-timeout jitter only.
    pub fn new(
        id: GroupId,
        cfg: Config,
        restore: Restore,
        now_ms: u64,
        seed: u64,
    ) -> Result<Self, StepError> {
        let base = restore.base.clone().unwrap_or(SnapshotMeta {
            offset: 0,
            term: 0,
            membership: Membership::default(),
        });
        if restore.log_end < base.offset {
            return Err(StepError::BadRestore("log end below its start"));
        }
        let log = LogView::restore(
            base.offset,
            base.term,
            restore.log_end,
            &restore.term_starts,
        )
        .ok_or(StepError::BadRestore("term starts out of order or range"))?;
        if log.last_term() > restore.hard_state.term {
            return Err(StepError::BadRestore(
                "log holds a term above the hard state's",
            ));
        }
        let mut configs = vec![(base.offset, base.membership)];
        for (o, m) in restore.configs {
            if o < configs.last().expect("non-empty").0 || o >= restore.log_end {
                return Err(StepError::BadRestore(
                    "config offsets out of order or range",
                ));
            }
            configs.push((o, m));
        }
        let mut g = RaftGroup {
            id,
            me: restore.node,
            cfg,
            hs: restore.hard_state,
            role: RaftRole::Follower,
            leader: None,
            log,
            configs,
            commit: base.offset,
            appended: restore.log_end,
            flushed: restore.log_end,
            log_epoch: 0,
            leader_match: 0,
            reported: (0, 0),
            respond: false,
            now_ms,
            created_ms: now_ms,
            election_deadline_ms: 0,
            leader_contact_ms: None,
            rng: SplitMix64::new(seed ^ id.rotate_left(17) ^ restore.node),
            votes: BTreeMap::new(),
            progress: BTreeMap::new(),
            noop_end: None,
            quorum_deadline_ms: 0,
            transfer: None,
            pending: VecDeque::new(),
            pending_bytes: 0,
            out: Ready::default(),
            dirty: true,
        };
        g.reset_election_deadline();
        Ok(g)
    }

    // ---- Accessors --------------------------------------------------------------------------

    pub fn id(&self) -> GroupId {
        self.id
    }
    pub fn role(&self) -> RaftRole {
        self.role
    }
    pub fn term(&self) -> Term {
        self.hs.term
    }
    pub fn leader(&self) -> Option<NodeId> {
        self.leader
    }
    pub fn commit(&self) -> Offset {
        self.commit
    }
    pub fn log_start(&self) -> Offset {
        self.log.start
    }
    pub fn log_end(&self) -> Offset {
        self.log.end
    }
    pub fn last_term(&self) -> Term {
        self.log.last_term()
    }
    pub fn hard_state(&self) -> HardState {
        self.hs
    }
    pub fn disk(&self) -> DiskId {
        self.hs.disk
    }
    /// Term of the entry covering `offset`, if this log holds it.
    pub fn term_at(&self, offset: Offset) -> Option<Term> {
        self.log.term_at(offset)
    }
    /// The active membership (the latest in the log, committed or not).
    pub fn membership(&self) -> &Membership {
        &self.configs.last().expect("configs never empty").1
    }
    /// Whether this replica (node and disk) votes in the active membership.
    pub fn is_voter(&self) -> bool {
        self.membership().is_voter(self.me, self.hs.disk)
    }
    /// A leader serves (accepts proposals, answers reads) only once it has committed an entry
    /// of its own term: before that it cannot know which earlier entries are committed.
    pub fn is_serving(&self) -> bool {
        self.role == RaftRole::Leader
            && self.noop_end.is_some_and(|e| self.commit >= e)
            && self.transfer.is_none()
    }
    /// The leader's view of each follower (empty on followers).
    pub fn progress(&self) -> impl Iterator<Item = (NodeId, &Progress)> {
        self.progress.iter().map(|(n, p)| (*n, p))
    }
    /// Whether this group needs `ready()` to be called.
    pub fn has_ready(&self) -> bool {
        self.dirty
    }
    /// Whether the leader's followers are all caught up and nothing is in flight: a group that
    /// only needs heartbeats.
    pub fn is_idle(&self) -> bool {
        self.progress.values().all(|p| p.matched == self.log.end)
    }

    // ---- Client API -------------------------------------------------------------------------

    /// Appends a batch of `count` records. Returns where it landed; acknowledge the client only
    /// when `Ready::committed` lists it.
    pub fn propose(&mut self, data: Bytes, count: u32) -> Result<Proposal, ProposeError> {
        self.check_can_propose(data.len())?;
        if count == 0 {
            return Err(ProposeError::EmptyBatch);
        }
        Ok(self.append_as_leader(EntryKind::Data, data, count))
    }

    pub(crate) fn check_can_propose(&self, size_bytes: usize) -> Result<(), ProposeError> {
        if self.role != RaftRole::Leader {
            return Err(ProposeError::NotLeader {
                leader: self.leader,
            });
        }
        if self.transfer.is_some() {
            return Err(ProposeError::TransferInProgress);
        }
        if !self.is_serving() {
            return Err(ProposeError::TermNotConfirmed);
        }
        // Not `max_append_bytes`: that only decides how entries are packed into appends; a batch
        // above it is sent in an append of its own.
        if size_bytes > self.cfg.max_entry_bytes {
            return Err(ProposeError::BatchTooLarge {
                size_bytes,
                limit_bytes: self.cfg.max_entry_bytes,
            });
        }
        if self.pending_bytes + size_bytes > self.cfg.max_uncommitted_bytes {
            return Err(ProposeError::Backpressure {
                pending_bytes: self.pending_bytes,
                limit_bytes: self.cfg.max_uncommitted_bytes,
            });
        }
        Ok(())
    }

    /// Compacts: a snapshot of the state machine at `offset` now exists, the log below may go.
    /// Only committed offsets can be compacted; returns whether the log start moved.
    pub fn compact(&mut self, offset: Offset) -> bool {
        if offset <= self.log.start || offset > self.commit || offset > self.log.end {
            return false;
        }
        self.log.compact(offset);
        // Keep the membership in force at `offset` as the base.
        let keep = self.configs.partition_point(|(o, _)| *o <= offset).max(1) - 1;
        self.configs.drain(..keep);
        true
    }

    // ---- Owner callbacks --------------------------------------------------------------------

    /// The owner wrote the log up to `offset` (not yet durable) in `log_epoch`.
    pub fn on_appended(&mut self, log_epoch: u64, offset: Offset) {
        if log_epoch != self.log_epoch {
            return; // A write from before a truncation: its offsets may name other entries.
        }
        let offset = offset.min(self.log.end);
        if offset > self.appended {
            self.appended = offset;
            self.after_local_progress();
        }
    }

    /// The owner made the log durable up to `offset` in `log_epoch`.
    pub fn on_flushed(&mut self, log_epoch: u64, offset: Offset) {
        if log_epoch != self.log_epoch {
            return;
        }
        let offset = offset.min(self.log.end);
        self.appended = self.appended.max(offset);
        if offset > self.flushed {
            self.flushed = offset;
            self.after_local_progress();
        }
    }

    /// What this replica counts toward commit: flushed, or written in the relaxed mode.
    pub(crate) fn durable(&self) -> Offset {
        match self.cfg.durability {
            Durability::Flushed => self.flushed,
            Durability::RelaxedWritten { .. } => self.appended,
        }
    }

    fn after_local_progress(&mut self) {
        self.dirty = true;
        if self.role == RaftRole::Leader {
            self.maybe_commit();
        }
    }

    // ---- Step and tick ----------------------------------------------------------------------

    /// Feeds one message of this group. Messages from stale terms are answered or dropped;
    /// malformed ones return an error and change nothing.
    pub fn step(&mut self, now_ms: u64, m: Message) -> Result<(), StepError> {
        self.now_ms = self.now_ms.max(now_ms);
        if m.to != self.me {
            return Err(StepError::WrongNode {
                to: m.to,
                me: self.me,
            });
        }
        self.dirty = true;
        if m.term > self.hs.term {
            match &m.body {
                Body::Vote { transfer, .. } if !transfer && self.in_lease() => {
                    // A leader was heard from recently: ignore a disruptive (pre-)candidate
                    // without adopting its term (check-quorum's lease, as etcd).
                    return Ok(());
                }
                Body::Vote { pre: true, .. } => {}
                Body::VoteResp {
                    pre: true,
                    granted: true,
                    ..
                } => {}
                Body::Append { .. } | Body::InstallSnapshot { .. } | Body::TimeoutNow => {
                    self.become_follower(m.term, Some(m.from));
                }
                _ => self.become_follower(m.term, None),
            }
        } else if m.term < self.hs.term {
            match &m.body {
                Body::Append { .. } | Body::InstallSnapshot { .. } => {
                    // A deposed leader: tell it the newer term so it steps down.
                    self.send_append_resp(m.from, Some(self.commit));
                }
                Body::Vote { pre: true, .. } => {
                    self.send(
                        m.from,
                        self.hs.term,
                        Body::VoteResp {
                            pre: true,
                            granted: false,
                            disk: self.hs.disk,
                        },
                    );
                }
                _ => {}
            }
            return Ok(());
        }
        match m.body {
            Body::Vote {
                pre,
                transfer: _,
                disk,
                last_offset,
                last_term,
            } => self.handle_vote(m.from, m.term, pre, disk, last_offset, last_term),
            Body::VoteResp { pre, granted, disk } => {
                self.handle_vote_resp(m.from, pre, granted, disk)
            }
            Body::Append {
                prev_offset,
                prev_term,
                entries,
                commit,
            } => self.handle_append(m.from, prev_offset, prev_term, entries, commit)?,
            Body::AppendResp {
                disk,
                appended,
                flushed,
                reject,
            } => self.handle_append_resp(m.from, disk, appended, flushed, reject),
            Body::InstallSnapshot { snapshot } => self.handle_snapshot(m.from, snapshot),
            Body::TimeoutNow => self.handle_timeout_now(),
        }
        Ok(())
    }

    /// Advances time. Cheap for an idle group: a comparison or two.
    pub fn tick(&mut self, now_ms: u64) {
        self.now_ms = self.now_ms.max(now_ms);
        match self.role {
            RaftRole::Leader => self.tick_leader(),
            _ => {
                if self.now_ms >= self.election_deadline_ms {
                    self.dirty = true;
                    if self.can_campaign() {
                        self.campaign(true, false);
                    } else {
                        self.reset_election_deadline();
                    }
                }
            }
        }
    }

    /// Collects what the owner must do. Cheap when nothing happened.
    pub fn ready(&mut self) -> Ready {
        self.dirty = false;
        if self.role != RaftRole::Leader && self.leader.is_some() {
            self.maybe_report();
        }
        let mut r = std::mem::take(&mut self.out);
        r.log_epoch = self.log_epoch;
        r
    }

    pub(crate) fn send(&mut self, to: NodeId, term: Term, body: Body) {
        self.out.messages.push(Message {
            group: self.id,
            from: self.me,
            to,
            term,
            body,
        });
    }

    pub(crate) fn persist_hard_state(&mut self) {
        self.out.hard_state = Some(self.hs);
    }

    pub(crate) fn set_commit(&mut self, commit: Offset) {
        if commit > self.commit {
            self.commit = commit;
            self.out.commit = Some(commit);
            self.dirty = true;
            while let Some(p) = self.pending.front() {
                if p.end > commit {
                    break;
                }
                let p = self.pending.pop_front().expect("checked");
                self.pending_bytes -= p.bytes;
                self.out.committed.push(p);
            }
            self.after_commit();
        }
    }

    pub(crate) fn drop_pending(&mut self) {
        self.out.dropped.extend(self.pending.drain(..));
        self.pending_bytes = 0;
    }

    /// Queues entries for the owner to write, after a truncation if one is pending.
    pub(crate) fn queue_append(&mut self, e: Entry, cache: bool) {
        self.log.append(&e, cache, self.cfg.max_cache_bytes);
        if e.kind == EntryKind::Config {
            if let Ok(m) = Membership::decode(&e.data) {
                self.configs.push((e.offset, m));
                self.on_membership_changed();
            }
        }
        self.out.entries.push(e);
    }

    /// Drops the log at and after `to` (a follower's conflicting suffix; never committed).
    pub(crate) fn truncate(&mut self, to: Offset) {
        debug_assert!(to >= self.commit, "never truncate committed entries");
        self.log.truncate(to);
        self.out.entries.retain(|e| e.end() <= to);
        let first_pending = self.out.entries.first().map(|e| e.offset);
        if first_pending.is_none_or(|o| o > to) || self.out.truncate_to.is_some() {
            self.out.truncate_to = Some(self.out.truncate_to.map_or(to, |t| t.min(to)));
        }
        self.appended = self.appended.min(to);
        self.flushed = self.flushed.min(to);
        self.log_epoch += 1;
        let before = self.configs.len();
        while self.configs.len() > 1 && self.configs.last().is_some_and(|(o, _)| *o >= to) {
            self.configs.pop();
        }
        if self.configs.len() != before {
            self.on_membership_changed();
        }
    }
}
