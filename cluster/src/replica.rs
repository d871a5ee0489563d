//! `Replica`: one partition's replicated log — a Raft group driven over a storage log.
//!
//! The driver owns the Raft core (`sluice_raft`, sans-I/O) and the partition's segment log, and
//! runs the core's `Ready` loop in the order raft/README.md states:
//!
//! 1. the hard state (term, vote, disk id) is made durable (`state.rs`) before anything of the
//!    same `Ready` is sent — and before a membership entry is staged (so the state file lists
//!    every membership entry the log can hold);
//! 2. a truncation (`truncate_to`) cuts the log (`Log::truncate_from`), then the entries are
//!    staged at exactly the offsets and terms Raft gave them (`Log::stage_replicated`, on the
//!    leader too: a disagreement between the core's view and the log is an error, not a
//!    silent shift);
//! 3. the messages go to the caller's outbox; the leader's go out while its own write is in
//!    flight (the caller sends them before it calls [`Replica::flush`]);
//! 4. catch-up reads (`fetches`) are answered from the log (only durable data is readable:
//!    a read beyond it waits for the next flush);
//! 5. the commit advances, and proposal tickets resolve, only when Raft reports them
//!    committed: flushed on a majority of voters, in the leader's confirmed term.
//!
//! [`Replica::flush`] waits for the staged batches' group commit and reports them to the core
//! (`on_appended`/`on_flushed`, quoting the log epoch of their `Ready`, so a report from before
//! a truncation is ignored).
//!
//! Time is an argument (`now_ms`); there is no clock, no socket and no task in here. A caller
//! (the broker's shard, or a test) loops: `step` what arrived, `tick`, `handle_ready`, send the
//! outbox, `flush`, `handle_ready` again.
//!
//! The core is driven through a `MultiRaft` holding this one group: heartbeats (and the
//! check-quorum they feed) are coalesced per node there and are not reachable on a bare
//! `RaftGroup`. A shard holding many partitions will share one `MultiRaft` instead.

use crate::entry::{
    batch_membership, batch_to_entry, entry_to_batch, normalize_proposal, verify_entry,
};
use crate::error::ReplicaError;
use crate::state::{self, PersistedState};
use futures::channel::oneshot;
use sluice_raft::{
    Body, Config, DiskId, Entry, EntryKind, Envelope, Fetch, GroupId, HardState, Membership,
    MultiRaft, NodeId, Offset, ProposeError, RaftGroup, RaftRole, Ready, Restore, SnapshotMeta,
    Term,
};
use sluice_storage::fs::Fs;
use sluice_storage::{AppendInfo, AppendTicket, Log, LogConfig};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

/// Rounds of `Ready` one [`Replica::handle_ready`] runs at most: answering a catch-up read
/// makes the core send, which is the next round's work. Bounded so a caller's loop keeps
/// control (what is left is done by its next call).
const READY_ROUNDS_MAX: usize = 8;

/// The commit floor (`state.rs`) is rewritten at most this often while the commit advances: a
/// file replacement (write, fsync, rename, directory sync) per interval, not per commit.
pub const COMMIT_FLOOR_INTERVAL_MS: u64 = 1_000;
/// ... or sooner, once the commit is this many offsets past the floor on disk (bounds what a
/// restarted replica reports too little, at high rates).
pub const COMMIT_FLOOR_OFFSETS_MAX: u64 = 4_096;

/// Who this replica is.
#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    pub node: NodeId,
    pub group: GroupId,
    pub raft: Config,
    /// Drives election-timeout jitter only.
    pub seed: u64,
}

/// How a replica whose log directory holds nothing yet begins. Ignored when the directory has
/// a hard-state file (a restart).
#[derive(Clone, Debug)]
pub enum Create {
    /// A group formed with this membership (every member's disk id chosen at formation, as
    /// KIP-853's `--initial-controllers`): this node's entry names its disk.
    Bootstrap(Membership),
    /// An empty replica on a new disk, caught up by the leader once a membership lists it
    /// (added later, or back after losing its disk). `disk` must be new: generated for this
    /// log, never reused.
    Empty { disk: DiskId },
}

/// A proposal's outcome: the committed batch's offsets, or why it did not commit.
pub struct ProposalTicket {
    pub term: Term,
    pub offset: Offset,
    /// One past the batch's last offset.
    pub end: Offset,
    rx: oneshot::Receiver<Result<AppendInfo, ReplicaError>>,
}

impl ProposalTicket {
    /// The outcome, if known yet (for callers that poll instead of awaiting).
    pub fn try_take(&mut self) -> Option<Result<AppendInfo, ReplicaError>> {
        match self.rx.try_recv() {
            Ok(r) => r,
            Err(oneshot::Canceled) => Some(Err(ReplicaError::Closed)),
        }
    }
}

impl Future for ProposalTicket {
    type Output = Result<AppendInfo, ReplicaError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match Pin::new(&mut self.rx).poll(cx) {
            Poll::Ready(Ok(r)) => Poll::Ready(r),
            Poll::Ready(Err(oneshot::Canceled)) => Poll::Ready(Err(ReplicaError::Closed)),
            Poll::Pending => Poll::Pending,
        }
    }
}

type TicketTx = oneshot::Sender<Result<AppendInfo, ReplicaError>>;

/// Counters of what the driver did (for metrics, and for tests to show a path was taken).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplicaStats {
    /// Hard-state file replacements (each a durable write, rename and directory sync).
    pub hard_state_writes: u64,
    /// Suffixes cut because a leader's log disagreed (`truncate_to`).
    pub truncations: u64,
    /// Batches staged (the leader's own and replicated ones).
    pub batches_staged: u64,
    /// Catch-up reads answered from the log.
    pub fetches_served: u64,
    /// Proposals resolved committed, and resolved with leadership lost.
    pub proposals_committed: u64,
    pub proposals_dropped: u64,
    /// Commit-floor file replacements.
    pub commit_floor_writes: u64,
}

/// One replica of one partition: the Raft group and the log it drives.
///
/// Shared by reference (`Rc<Replica>` on one executor): one task *drives* it ([`Replica::step`],
/// [`Replica::tick`], [`Replica::handle_ready`], [`Replica::flush`] — never two of these at
/// once), while the partition that owns it proposes and reads from its own task. The mutable
/// state sits in a `RefCell` that no method holds across an await: a proposal that arrives
/// while the driver waits on the disk lands in the core and goes out with the next `Ready`.
pub struct Replica<F: Fs> {
    fs: F,
    dir: PathBuf,
    node: NodeId,
    group: GroupId,
    log: Log<F>,
    inner: RefCell<Inner>,
}

/// What the driver and the proposers change.
struct Inner {
    raft: MultiRaft,
    state: PersistedState,
    /// Staged batches not yet reported flushed: (log epoch, end offset, ticket).
    staged: Vec<(u64, Offset, AppendTicket)>,
    /// Catch-up reads that reached past the durable end: answered after the next flush.
    deferred_fetches: Vec<Fetch>,
    /// Open proposals by (term, offset).
    tickets: BTreeMap<(Term, Offset), TicketTx>,
    /// Known committed below this offset: restored from the commit-floor file at open (the
    /// core restarts with no commit) and raised as the commit is written back.
    commit_floor: Offset,
    /// The floor on disk, and when it was written (`now_ms` of the caller's clock).
    floor_stored: Offset,
    floor_stored_ms: u64,
    /// The caller's latest time (from `tick` and `step`), for the floor's write interval.
    now_ms: u64,
    stats: ReplicaStats,
}

impl Inner {
    fn g(&self, group: GroupId) -> &RaftGroup {
        self.raft.group(group).expect("the replica's group")
    }
}

impl<F: Fs> Replica<F> {
    /// Opens (or creates) the replica whose log lives in `dir`, and restores its Raft group
    /// from the hard-state file and the log: log end, term starts (from batch headers), the
    /// membership entries the log holds.
    pub async fn open(
        fs: F,
        dir: impl Into<PathBuf>,
        log_config: LogConfig,
        cfg: ReplicaConfig,
        create: Create,
        now_ms: u64,
    ) -> Result<Self, ReplicaError> {
        let dir = dir.into();
        let log = Log::open(fs.clone(), dir.clone(), log_config).await?;
        let (mut state, floor) = match state::load(&fs, &dir).await? {
            Some(s) => {
                let floor = match state::load_commit_floor(&fs, &dir).await {
                    Ok(f) => f.unwrap_or(0),
                    // Claiming less than was committed is safe (the leader's commit raises it
                    // again); refusing to open over a damaged hint would not be.
                    Err(e) => {
                        tracing::warn!(error = %e, "commit floor unreadable; starting from none");
                        0
                    }
                };
                (s, floor)
            }
            None => {
                if log.end_offset() > log.start_offset() {
                    return Err(ReplicaError::MissingHardState(dir));
                }
                let s = new_state(cfg.node, log.start_offset(), create)?;
                // A floor left from another life of this directory would claim offsets of
                // a log that is not this one.
                state::store_commit_floor(&fs, &dir, log.start_offset()).await?;
                state::store(&fs, &dir, &s).await?;
                (s, log.start_offset())
            }
        };
        let mut repaired = false;
        if floor > log.end_offset() {
            // The log lost entries it held durably and knew committed: a batch below the floor
            // failed its checksum and recovery cut the log there (a torn tail is only ever
            // unsynced data, which the floor never covers). This disk no longer holds what it
            // acknowledged, so it may not count or vote as the disk the membership lists: it
            // comes back on a new disk id, which the leader demotes to a learner (`Rejoin`),
            // catches up from the cut and promotes (raft/src/membership.rs). Term and vote are
            // kept (a vote given in this term stays given).
            let old = state.hard.disk;
            state.hard.disk = repair_disk_id(old, state.hard.term, log.end_offset(), now_ms);
            tracing::warn!(
                group = cfg.group,
                floor,
                log_end = log.end_offset(),
                old_disk = old.0,
                new_disk = state.hard.disk.0,
                "log lost committed entries; rejoining on a new disk id until caught up"
            );
            state::store(&fs, &dir, &state).await?;
            repaired = true;
        }
        // Never above the log's end: what the log lost is not readable, and comes back from
        // the leader, committed, below the floor it had.
        let commit_floor = floor.clamp(log.start_offset(), log.end_offset());
        if repaired {
            state::store_commit_floor(&fs, &dir, commit_floor).await?;
        }
        let restore = restore_from(&log, cfg.node, &state).await?;
        let mut raft = MultiRaft::new(cfg.node, cfg.raft.clone());
        raft.add_group(cfg.group, restore, now_ms, cfg.seed)?;
        Ok(Replica {
            fs,
            dir,
            node: cfg.node,
            group: cfg.group,
            log,
            inner: RefCell::new(Inner {
                raft,
                state,
                staged: Vec::new(),
                deferred_fetches: Vec::new(),
                tickets: BTreeMap::new(),
                commit_floor,
                floor_stored: commit_floor,
                floor_stored_ms: now_ms,
                now_ms,
                stats: ReplicaStats::default(),
            }),
        })
    }

    /// Reads the core (a short borrow, never across an await).
    fn with_group<T>(&self, f: impl FnOnce(&RaftGroup) -> T) -> T {
        f(self.inner.borrow().g(self.group))
    }

    // ---- What the broker asks ---------------------------------------------------------------

    pub fn node(&self) -> NodeId {
        self.node
    }
    pub fn group(&self) -> GroupId {
        self.group
    }
    pub fn role(&self) -> RaftRole {
        self.with_group(|g| g.role())
    }
    pub fn term(&self) -> Term {
        self.with_group(|g| g.term())
    }
    pub fn leader(&self) -> Option<NodeId> {
        self.with_group(|g| g.leader())
    }
    pub fn disk(&self) -> DiskId {
        self.with_group(|g| g.disk())
    }
    pub fn hard_state(&self) -> HardState {
        self.with_group(|g| g.hard_state())
    }
    pub fn membership(&self) -> Membership {
        self.with_group(|g| g.membership().clone())
    }
    /// On a leader: each other member's flushed offset (what it holds durably and verified
    /// equal to this log), for replication lag. Empty on a follower.
    pub fn follower_flushed(&self) -> Vec<(NodeId, Offset)> {
        let me = self.node;
        self.with_group(|g| {
            if g.role() != RaftRole::Leader {
                return Vec::new();
            }
            g.progress()
                .filter(|(n, _)| *n != me)
                .map(|(n, p)| (n, p.flushed))
                .collect()
        })
    }
    /// Whether this replica leads and has committed an entry of its term: it takes proposals
    /// and may answer reads.
    pub fn is_serving(&self) -> bool {
        self.with_group(|g| g.is_serving())
    }
    /// One past the last committed offset this replica holds durably: what readers may see.
    /// (Raft's commit may run ahead of this replica's own flushed end on a follower.) After a
    /// restart it is at least the commit floor restored from disk, until the leader's commit
    /// arrives; it is never above what was committed.
    pub fn committed_end(&self) -> Offset {
        let inner = self.inner.borrow();
        inner
            .g(self.group)
            .commit()
            .max(inner.commit_floor)
            .min(self.log.end_offset())
    }

    /// One past the last entry the core holds (proposed, staged or replicated), committed or
    /// not: a leader whose `committed_end` equals it has nothing in flight.
    pub fn raft_log_end(&self) -> Offset {
        self.with_group(|g| g.log_end())
    }

    /// The commit floor as last written to disk (what a restart would restore, at most).
    pub fn stored_commit_floor(&self) -> Offset {
        self.inner.borrow().floor_stored
    }
    /// The log, for reads (below [`Replica::committed_end`] only: above it nothing counts yet).
    /// Raft's control batches (no-ops, membership) are in it: replay skips control batches.
    pub fn log(&self) -> &Log<F> {
        &self.log
    }
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    pub fn stats(&self) -> ReplicaStats {
        self.inner.borrow().stats.clone()
    }

    /// Proposes a producer's batch. The ticket resolves with the batch's offsets once it is
    /// committed (flushed on a majority in this leader's confirmed term), or with
    /// [`ReplicaError::LeadershipLost`] if leadership goes first. Refused at once, with
    /// [`ReplicaError::NotLeader`], on a replica that does not lead.
    pub fn propose(&self, batch: Vec<u8>) -> Result<ProposalTicket, ReplicaError> {
        let limit_bytes = self.log.config().batch_bytes_max;
        if batch.len() > limit_bytes {
            return Err(ReplicaError::InvalidBatch(
                sluice_storage::batch::BatchError::TooLarge {
                    size_bytes: batch.len(),
                    limit_bytes,
                },
            ));
        }
        let (bytes, count) = normalize_proposal(batch)?;
        let term = self.term();
        let mut inner = self.inner.borrow_mut();
        let p = inner
            .raft
            .propose(self.group, bytes, count)
            .map_err(|e| match e {
                ProposeError::NotLeader { leader } => ReplicaError::NotLeader {
                    leader_hint: leader,
                    term,
                },
                e => ReplicaError::Propose(e),
            })?;
        let (tx, rx) = oneshot::channel();
        inner.tickets.insert((p.term, p.offset), tx);
        Ok(ProposalTicket {
            term: p.term,
            offset: p.offset,
            end: p.end,
            rx,
        })
    }

    // ---- Driving the core -------------------------------------------------------------------

    /// Feeds one message from a peer. A malformed one is refused (typed) and changes nothing:
    /// the entries of an append are verified first (a batch failing its checksum is never
    /// taken; the leader sends it again when this follower shows no progress).
    pub fn step(&self, now_ms: u64, env: Envelope) -> Result<(), ReplicaError> {
        let mut inner = self.inner.borrow_mut();
        inner.now_ms = inner.now_ms.max(now_ms);
        if let Envelope::Group(m) = &env {
            if let Body::Append { entries, .. } = &m.body {
                for e in entries {
                    verify_entry(e)?;
                }
            }
        }
        Ok(inner.raft.step(now_ms, env)?)
    }

    /// Advances time: elections, heartbeats, check-quorum.
    pub fn tick(&self, now_ms: u64) {
        let mut inner = self.inner.borrow_mut();
        inner.now_ms = inner.now_ms.max(now_ms);
        inner.raft.tick(now_ms);
    }

    /// Runs the `Ready` loop (see the module doc): persists, truncates, stages, answers reads,
    /// resolves tickets, and appends the messages to send to `outbox`. Send them, then
    /// [`Replica::flush`].
    ///
    /// An error leaves the core and the log possibly apart (a storage failure, or a leader's
    /// entry that does not verify): the caller drops the replica and reopens it, which
    /// restores the core from what is durable.
    pub async fn handle_ready(&self, outbox: &mut Vec<Envelope>) -> Result<(), ReplicaError> {
        for _ in 0..READY_ROUNDS_MAX {
            let mr = self.inner.borrow_mut().raft.ready();
            let mut progressed = !mr.messages.is_empty();
            for (_, rd) in mr.groups {
                progressed = true;
                self.apply_ready(rd).await?;
            }
            // After the hard state of this round is durable (apply_ready awaited it).
            outbox.extend(mr.messages);
            if !progressed || !self.with_group(|g| g.has_ready()) {
                break;
            }
        }
        self.maybe_store_commit_floor().await
    }

    /// Writes the commit floor when the commit moved past it, at most every
    /// [`COMMIT_FLOOR_INTERVAL_MS`] or every [`COMMIT_FLOOR_OFFSETS_MAX`] offsets. What is
    /// written is this replica's readable committed prefix: committed, and durable here.
    async fn maybe_store_commit_floor(&self) -> Result<(), ReplicaError> {
        let end = self.committed_end();
        let now_ms = {
            let mut inner = self.inner.borrow_mut();
            inner.commit_floor = inner.commit_floor.max(end);
            if end <= inner.floor_stored {
                return Ok(());
            }
            let due = inner.now_ms.saturating_sub(inner.floor_stored_ms)
                >= COMMIT_FLOOR_INTERVAL_MS
                || end - inner.floor_stored >= COMMIT_FLOOR_OFFSETS_MAX;
            if !due {
                return Ok(());
            }
            inner.now_ms
        };
        state::store_commit_floor(&self.fs, &self.dir, end).await?;
        let mut inner = self.inner.borrow_mut();
        inner.floor_stored = inner.floor_stored.max(end);
        inner.floor_stored_ms = now_ms;
        inner.stats.commit_floor_writes += 1;
        Ok(())
    }

    /// Waits until every staged batch is durable and tells the core (`on_appended`,
    /// `on_flushed`); then answers catch-up reads that waited for durable data. Call
    /// [`Replica::handle_ready`] after it: the core has news (acknowledgements, commits).
    pub async fn flush(&self) -> Result<(), ReplicaError> {
        let staged = std::mem::take(&mut self.inner.borrow_mut().staged);
        for (epoch, end, ticket) in staged {
            self.log.durable(ticket).await?;
            let mut inner = self.inner.borrow_mut();
            inner.raft.on_appended(self.group, epoch, end)?;
            inner.raft.on_flushed(self.group, epoch, end)?;
        }
        let fetches = std::mem::take(&mut self.inner.borrow_mut().deferred_fetches);
        for f in fetches {
            self.serve_fetch(f).await?;
        }
        Ok(())
    }

    /// Whether staged batches wait for [`Replica::flush`].
    pub fn has_unflushed(&self) -> bool {
        !self.inner.borrow().staged.is_empty()
    }

    /// Whether the core has work for [`Replica::handle_ready`] (messages, entries, commits).
    pub fn has_ready(&self) -> bool {
        self.inner.borrow().raft.has_ready()
    }

    async fn apply_ready(&self, rd: Ready) -> Result<(), ReplicaError> {
        // 1. Hard state, and the membership entries about to be staged, durable first.
        let new_configs: Vec<(Offset, Term, Membership)> = rd
            .entries
            .iter()
            .filter(|e| e.kind == EntryKind::Config)
            .filter_map(|e| Some((e.offset, e.term, Membership::decode(&e.data).ok()?)))
            .collect();
        let to_store = {
            let mut inner = self.inner.borrow_mut();
            let mut persist = false;
            if let Some(hs) = rd.hard_state {
                persist |= hs != inner.state.hard;
                inner.state.hard = hs;
            }
            (persist || !new_configs.is_empty()).then(|| {
                // Listed before they are staged; stale entries (at or after a truncation
                // below) stay listed until the truncation is done, and are told apart at
                // restore anyway.
                let mut s = inner.state.clone();
                s.configs.extend(new_configs.iter().cloned());
                s
            })
        };
        if let Some(s) = to_store {
            state::store(&self.fs, &self.dir, &s).await?;
            self.inner.borrow_mut().stats.hard_state_writes += 1;
        }
        if rd.snapshot.is_some() {
            return Err(ReplicaError::SnapshotUnsupported);
        }
        // 2. Truncate, then stage at the core's offsets and terms.
        if let Some(t) = rd.truncate_to {
            self.log.truncate_from(t).await?;
            let mut inner = self.inner.borrow_mut();
            inner.stats.truncations += 1;
            inner.state.configs.retain(|(o, _, _)| *o < t);
        }
        {
            let mut inner = self.inner.borrow_mut();
            inner.state.configs.extend(new_configs);
            for e in &rd.entries {
                let bytes = entry_to_batch(e)?;
                let ticket = self.log.stage_replicated(bytes, e.offset, e.term)?;
                inner.staged.push((rd.log_epoch, e.end(), ticket));
                inner.stats.batches_staged += 1;
            }
        }
        // 4. Catch-up reads.
        for f in rd.fetches {
            self.serve_fetch(f).await?;
        }
        if !rd.snapshot_requests.is_empty() {
            // Never asked while no log is compacted (this driver compacts none).
            tracing::warn!(
                group = self.group,
                "snapshot requested; snapshots not supported yet"
            );
        }
        // 5. Commit and the clients' outcomes.
        let (leader_hint, term) = (self.leader(), self.term());
        let mut inner = self.inner.borrow_mut();
        for p in rd.committed {
            if let Some(tx) = inner.tickets.remove(&(p.term, p.offset)) {
                inner.stats.proposals_committed += 1;
                let _ = tx.send(Ok(AppendInfo {
                    base_offset: p.offset,
                    last_offset: p.end - 1,
                }));
            }
        }
        for p in rd.dropped {
            if let Some(tx) = inner.tickets.remove(&(p.term, p.offset)) {
                inner.stats.proposals_dropped += 1;
                let _ = tx.send(Err(ReplicaError::LeadershipLost { leader_hint, term }));
            }
        }
        Ok(())
    }

    /// Reads the log for a lagging follower; a read past the durable end waits for a flush.
    async fn serve_fetch(&self, f: Fetch) -> Result<(), ReplicaError> {
        if f.from >= self.log.end_offset() {
            self.inner.borrow_mut().deferred_fetches.push(f);
            return Ok(());
        }
        let batches = self.log.read(f.from, f.max_bytes).await?;
        let mut entries: Vec<Entry> = Vec::with_capacity(batches.len());
        let mut bytes = 0;
        for b in &batches {
            let e = batch_to_entry(b)?;
            if !entries.is_empty() && bytes + e.data.len() > f.max_bytes {
                break;
            }
            bytes += e.data.len();
            entries.push(e);
        }
        let mut inner = self.inner.borrow_mut();
        inner.raft.on_fetched(self.group, f.peer, f.from, entries)?;
        inner.stats.fetches_served += 1;
        Ok(())
    }
}

impl<F: Fs> Drop for Replica<F> {
    fn drop(&mut self) {
        for (_, tx) in std::mem::take(&mut self.inner.get_mut().tickets) {
            let _ = tx.send(Err(ReplicaError::Closed));
        }
    }
}

/// A new disk id for a replica whose log lost committed entries: derived from the old one, the
/// term, the cut and the time, so it differs from the old id and from any this replica had.
fn repair_disk_id(old: DiskId, term: Term, log_end: Offset, now_ms: u64) -> DiskId {
    let mut b = Vec::with_capacity(64);
    b.extend_from_slice(b"sluice.repair");
    b.extend_from_slice(&old.0.to_le_bytes());
    b.extend_from_slice(&term.to_le_bytes());
    b.extend_from_slice(&log_end.to_le_bytes());
    b.extend_from_slice(&now_ms.to_le_bytes());
    let id = xxhash_rust::xxh3::xxh3_128(&b);
    DiskId(if id == old.0 { id ^ 1 } else { id })
}

fn new_state(node: NodeId, start: Offset, create: Create) -> Result<PersistedState, ReplicaError> {
    let (disk, base) = match create {
        Create::Bootstrap(m) => {
            let (me, _) =
                m.get(node)
                    .ok_or(ReplicaError::Step(sluice_raft::StepError::BadRestore(
                        "the bootstrap membership omits this node",
                    )))?;
            (
                me.disk,
                Some(SnapshotMeta {
                    offset: start,
                    term: 0,
                    membership: m,
                }),
            )
        }
        Create::Empty { disk } => (disk, None),
    };
    Ok(PersistedState {
        hard: HardState {
            term: 0,
            vote: None,
            disk,
        },
        base,
        configs: Vec::new(),
    })
}

/// What the core needs to reopen: the hard state, the base, the log's end and term starts (by
/// binary search over batch headers), and the membership entries the log really holds (each
/// listed one checked against the batch at its offset).
async fn restore_from<F: Fs>(
    log: &Log<F>,
    node: NodeId,
    s: &PersistedState,
) -> Result<Restore, ReplicaError> {
    let (start, end) = (log.start_offset(), log.end_offset());
    let mut configs = Vec::new();
    for (o, t, m) in &s.configs {
        if *o < start || *o >= end {
            continue;
        }
        let batches = log.read(*o, 1).await?;
        let holds = batches.first().is_some_and(|b| {
            b.header.base_offset == *o
                && b.header.term == *t
                && batch_membership(b).as_ref() == Some(m)
        });
        if holds {
            configs.push((*o, m.clone()));
        }
    }
    configs.sort_by_key(|(o, _)| *o);
    let term_starts = log
        .term_starts()
        .await?
        .into_iter()
        .filter(|&(t, _)| t > s.base.as_ref().map_or(0, |b| b.term))
        .collect();
    Ok(Restore {
        node,
        hard_state: s.hard,
        base: s.base.clone(),
        log_end: end,
        term_starts,
        configs,
    })
}
