//! Replicated partition logs on one shard: [`ReplicaHost`] drives each partition's
//! [`Replica`] (its Raft group over its segment log) with the shard's [`PeerTransport`], and
//! [`ReplicatedLog`] puts a replica behind the broker's [`PartitionLog`] seam.
//!
//! ```text
//!  partition actor ──stage──► ReplicatedLog ──propose──► Replica ◄──step── router ◄── PeerTransport
//!        ▲                        │                         │                           ▲
//!        └──── committed ◄────────┘ ticket                  └─ driver: tick, Ready, ────┘
//!                                                              send, flush
//! ```
//!
//! - **One driver task per replica.** It steps what the router queued for its group, ticks the
//!   core every [`TICK_INTERVAL_MS`], runs `handle_ready` (hard state, truncation, staging,
//!   catch-up reads, commits), sends the outbox (the leader's appends leave while its own write
//!   is in flight), then flushes and runs `handle_ready` again. A proposal or a message wakes
//!   it at once; a round that found nothing to do sleeps until the next tick.
//! - **One router task per shard** reads the transport's inbox and queues each envelope for the
//!   replica of its group (a heartbeat names its groups; envelopes for groups this shard does
//!   not host are dropped and counted).
//! - **What the broker sees.** [`ReplicatedLog::open`] returns only on the leader, once it has
//!   committed an entry of its term and every entry it holds is committed and durable here:
//!   the engine replays exactly the committed prefix (a deposed leader rebuilds the same way).
//!   Elsewhere it fails with `StorageError::NotLeader` (a retryable 503 to clients). `stage`
//!   proposes (the core assigns offset and term, synchronously, in staging order);
//!   `committed` resolves once a majority has the batch on disk in this leader's term *and*
//!   it is durable here (reads of it must succeed), or fails with `LeadershipLost` (outcome
//!   unknown). A handle stages only in the term it opened in (a node that lost and regained
//!   leadership rebuilds its engine first). Reads stop at the committed end. Leases replayed by a new leader end
//!   [`MAX_CLOCK_SKEW_MS`] later than recorded (`PartitionLog::inherited_lease_margin_ms`):
//!   they were granted on another node's clock.
//!
//! Not yet (issue 41): engine snapshots and retention on a replicated log (a replica keeps its
//! whole log, so a follower can always be caught up without Raft snapshots); one `MultiRaft`
//! per shard sharing heartbeats among its groups (each replica runs its own today).

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use glommio::channels::local_channel::LocalReceiver;
use sluice_cluster::{ProposalTicket, Replica, ReplicaError};
use sluice_raft::{Envelope, GroupId, NodeId};
use sluice_storage::fs::Fs;
use sluice_storage::{
    AppendInfo, LogConfig, LogStats, ReadBatch, Result, RetentionOutcome, SegmentInfo, StorageError,
};

use super::clock::MAX_CLOCK_SKEW_MS;
use super::transport::{PeerTransport, Received};
use crate::partition_log::{PartitionLog, Staged};
use crate::runtime::{Clock, Event};

/// How often a driver ticks its replica's core (elections, heartbeats, check-quorum), ms.
/// Far below the heartbeat interval (150 ms) and the election timeout (1.5 s).
pub const TICK_INTERVAL_MS: u64 = 20;
/// Envelopes queued for one replica beyond which new ones are dropped (Raft retransmits).
pub const REPLICA_INBOX_MAX: usize = 4096;

/// Counters of one shard's hosting (metrics, and tests showing a path was taken).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostStats {
    /// Envelopes for a group this shard does not host.
    pub unroutable: u64,
    /// Envelopes dropped because a replica's inbox was full.
    pub inbox_full: u64,
    /// Envelopes a replica refused (`step` failed: malformed, a damaged batch, a stale group).
    pub refused: u64,
    /// Envelopes the transport could not queue (unknown peer, full queue, closed).
    pub send_failed: u64,
    /// Drivers stopped by a storage failure (the replica must be reopened).
    pub drivers_failed: u64,
    /// Times a hosted replica saw its group's leader change (elections, as this node saw them).
    pub leader_changes: u64,
    /// Batches this node's leaders committed, and their time from proposal to committed and
    /// durable here, summed (µs): the mean commit latency is their ratio.
    pub commits: u64,
    pub commit_us_sum: u64,
}

/// One hosted replica and its driver's inputs.
struct Hosted<F: Fs> {
    replica: Rc<Replica<F>>,
    inbox: RefCell<VecDeque<Envelope>>,
    /// Set when there is input the driver has not looked at (a message, a proposal).
    pending: Cell<bool>,
    wake: Event,
    /// Notified after every driver round (flushes, commits, role changes show here).
    progressed: Event,
    stopped: Cell<bool>,
    failed: Cell<bool>,
    /// Handles opened over this replica: only the newest may stage (see `ReplicatedLog`).
    opens: Cell<u64>,
    /// The leader the driver saw last (leader changes are counted).
    last_leader: Cell<Option<NodeId>>,
}

impl<F: Fs> Hosted<F> {
    fn poke(&self) {
        self.pending.set(true);
        self.wake.notify();
    }
}

/// One shard's replicas, their drivers and the router between them and the transport.
pub struct ReplicaHost<F: Fs, C: Clock> {
    node: NodeId,
    clock: C,
    transport: Rc<PeerTransport>,
    hosted: RefCell<HashMap<GroupId, Rc<Hosted<F>>>>,
    by_dir: RefCell<HashMap<PathBuf, GroupId>>,
    /// How long [`ReplicatedLog::open`] waits for this replica to lead and serve, ms.
    open_wait_ms: u64,
    /// How much later than recorded inherited leases end ([`MAX_CLOCK_SKEW_MS`] by default).
    lease_margin_ms: Cell<u64>,
    stats: Cell<HostStats>,
    closed: Cell<bool>,
    isolated: Cell<bool>,
}

impl<F: Fs, C: Clock> ReplicaHost<F, C> {
    /// A host for `transport`'s node; starts the router over the transport's inbox.
    pub fn start(
        transport: Rc<PeerTransport>,
        inbox: LocalReceiver<Received>,
        clock: C,
        open_wait_ms: u64,
    ) -> Rc<Self> {
        let host = Rc::new(ReplicaHost {
            node: transport.node_id(),
            clock,
            transport,
            hosted: RefCell::new(HashMap::new()),
            by_dir: RefCell::new(HashMap::new()),
            open_wait_ms,
            lease_margin_ms: Cell::new(MAX_CLOCK_SKEW_MS),
            stats: Cell::new(HostStats::default()),
            closed: Cell::new(false),
            isolated: Cell::new(false),
        });
        glommio::spawn_local(route(Rc::downgrade(&host), inbox)).detach();
        host
    }

    pub fn node(&self) -> NodeId {
        self.node
    }

    pub fn stats(&self) -> HostStats {
        self.stats.get()
    }

    /// Sets how much later than recorded the leases a new leader inherits end (the cluster's
    /// maximum clock skew; tests set 0 to show what the margin prevents).
    pub fn set_lease_margin_ms(&self, ms: u64) {
        self.lease_margin_ms.set(ms);
    }

    /// The highest record time in `group`'s committed log (0 if none): where a new leader's
    /// engine clock starts at the earliest (`cluster::LeaderClock`).
    pub async fn last_record_ms(&self, group: GroupId) -> Result<u64> {
        let Some(r) = self.replica(group) else {
            return Ok(0);
        };
        // The last data batch's time: Raft's own entries (a new leader's no-op, membership
        // changes) carry time 0, and the entry a serving leader committed last is its no-op.
        // Record times never go back along the log (every leader's clock starts at this floor),
        // so the last data batch holds the highest.
        let start = r.log().start_offset();
        let mut end = r.committed_end();
        while end > start {
            let batches = r.log().read(end - 1, 1).await?;
            let Some(b) = batches.iter().find(|b| b.header.base_offset < end) else {
                return Ok(0);
            };
            if b.header.max_timestamp_ms > 0 {
                return Ok(u64::try_from(b.header.max_timestamp_ms).unwrap_or(0));
            }
            end = b.header.base_offset;
        }
        Ok(0)
    }

    fn bump(&self, f: impl FnOnce(&mut HostStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    /// Takes `replica` (opened by the caller on this node) into the host and starts its driver.
    pub fn host(self: &Rc<Self>, replica: Replica<F>) {
        let group = replica.group();
        let dir = replica.dir().to_path_buf();
        let hosted = Rc::new(Hosted {
            replica: Rc::new(replica),
            inbox: RefCell::new(VecDeque::new()),
            pending: Cell::new(true),
            wake: Event::default(),
            progressed: Event::default(),
            stopped: Cell::new(false),
            failed: Cell::new(false),
            opens: Cell::new(0),
            last_leader: Cell::new(None),
        });
        self.by_dir.borrow_mut().insert(dir, group);
        if let Some(old) = self.hosted.borrow_mut().insert(group, hosted.clone()) {
            old.stopped.set(true);
            old.wake.notify();
        }
        glommio::spawn_local(drive(Rc::downgrade(self), hosted)).detach();
    }

    /// Stops hosting `group` (its queue was deleted): its driver stops and its handles close.
    pub fn unhost(&self, group: GroupId) {
        let Some(h) = self.hosted.borrow_mut().remove(&group) else {
            return;
        };
        self.by_dir.borrow_mut().retain(|_, g| *g != group);
        h.stopped.set(true);
        h.wake.notify();
        h.progressed.notify();
    }

    /// The event notified after each driver round of `group`'s replica, if hosted here.
    pub fn progressed(&self, group: GroupId) -> Option<Event> {
        self.hosted
            .borrow()
            .get(&group)
            .map(|h| h.progressed.clone())
    }

    /// Fault injection (tests, the fault harness): an isolated host drops every envelope it
    /// would send or receive, as if its node were cut off the network; its replicas go on.
    pub fn set_isolated(&self, isolated: bool) {
        self.isolated.set(isolated);
    }

    /// Every replica hosted here.
    pub fn replicas(&self) -> Vec<Rc<Replica<F>>> {
        self.hosted
            .borrow()
            .values()
            .map(|h| h.replica.clone())
            .collect()
    }

    /// The replica of `group`, if hosted here.
    pub fn replica(&self, group: GroupId) -> Option<Rc<Replica<F>>> {
        self.hosted.borrow().get(&group).map(|h| h.replica.clone())
    }

    /// Stops every driver and closes the transport (a node going down).
    pub async fn close(&self) {
        self.closed.set(true);
        for h in self.hosted.borrow_mut().drain().map(|(_, h)| h) {
            h.stopped.set(true);
            h.wake.notify();
        }
        self.transport.close().await;
    }

    fn hosted_at(&self, dir: &Path) -> Option<Rc<Hosted<F>>> {
        let group = *self.by_dir.borrow().get(dir)?;
        self.hosted.borrow().get(&group).cloned()
    }

    fn send_all(&self, out: &mut Vec<Envelope>) {
        if self.isolated.get() {
            out.clear();
            return;
        }
        for env in out.drain(..) {
            if self.transport.send(&env).is_err() {
                self.bump(|s| s.send_failed += 1);
            }
        }
    }
}

/// Queues each received envelope for its group's replica.
async fn route<F: Fs, C: Clock>(
    host: std::rc::Weak<ReplicaHost<F, C>>,
    inbox: LocalReceiver<Received>,
) {
    while let Some(r) = inbox.recv().await {
        let Some(host) = host.upgrade() else { return };
        if host.closed.get() {
            return;
        }
        if host.isolated.get() {
            continue;
        }
        let group = match &r.envelope {
            Envelope::Group(m) => Some(m.group),
            Envelope::Heartbeat(h) => h.groups.first().map(|g| g.group),
            Envelope::HeartbeatResp(h) => h.groups.first().map(|g| g.group),
        };
        let hosted = group.and_then(|g| host.hosted.borrow().get(&g).cloned());
        let Some(hosted) = hosted else {
            host.bump(|s| s.unroutable += 1);
            continue;
        };
        let mut q = hosted.inbox.borrow_mut();
        if q.len() >= REPLICA_INBOX_MAX {
            host.bump(|s| s.inbox_full += 1);
            continue;
        }
        q.push_back(r.envelope);
        drop(q);
        hosted.poke();
    }
}

/// One replica's driver loop (see the module doc).
async fn drive<F: Fs, C: Clock>(host: std::rc::Weak<ReplicaHost<F, C>>, hosted: Rc<Hosted<F>>) {
    let mut out = Vec::new();
    let mut next_tick_ms = 0;
    loop {
        let Some(h) = host.upgrade() else { return };
        if hosted.stopped.get() {
            hosted.progressed.notify();
            return;
        }
        let clock = h.clock.clone();
        drop(h);
        if !hosted.pending.get() {
            let now = clock.now_ms();
            if now < next_tick_ms {
                hosted.wake.listen_until_on(&clock, next_tick_ms).await;
            }
        }
        if hosted.stopped.get() {
            hosted.progressed.notify();
            return;
        }
        hosted.pending.set(false);
        let Some(h) = host.upgrade() else { return };
        if let Err(e) = round(&h, &hosted, &mut out, &mut next_tick_ms).await {
            tracing::error!(
                node = h.node,
                group = hosted.replica.group(),
                error = %e,
                "replica driver stopped: the replica must be reopened"
            );
            h.bump(|s| s.drivers_failed += 1);
            hosted.failed.set(true);
            hosted.stopped.set(true);
            hosted.progressed.notify();
            return;
        }
        let leader = hosted.replica.leader();
        if leader.is_some() && leader != hosted.last_leader.get() {
            hosted.last_leader.set(leader);
            h.bump(|s| s.leader_changes += 1);
        }
        hosted.progressed.notify();
    }
}

async fn round<F: Fs, C: Clock>(
    host: &ReplicaHost<F, C>,
    hosted: &Hosted<F>,
    out: &mut Vec<Envelope>,
    next_tick_ms: &mut u64,
) -> std::result::Result<(), ReplicaError> {
    let r = &hosted.replica;
    let now = host.clock.now_ms();
    let msgs: Vec<Envelope> = hosted.inbox.borrow_mut().drain(..).collect();
    for env in msgs {
        if let Err(e) = r.step(now, env) {
            tracing::debug!(group = r.group(), error = %e, "envelope refused");
            host.bump(|s| s.refused += 1);
        }
    }
    if now >= *next_tick_ms {
        r.tick(now);
        *next_tick_ms = now + TICK_INTERVAL_MS;
    }
    r.handle_ready(out).await?;
    host.send_all(out);
    if r.has_unflushed() {
        r.flush().await?;
        r.handle_ready(out).await?;
        host.send_all(out);
    }
    if r.has_ready() || r.has_unflushed() {
        hosted.pending.set(true);
    }
    Ok(())
}

/// A committed batch's ticket: the proposal, and where the batch ends.
pub struct ReplicatedTicket {
    proposal: ProposalTicket,
    /// When it was proposed (for the commit latency metric only, never engine time).
    proposed: std::time::Instant,
}

/// A partition's replicated log, as the broker's log users see it (see the module doc).
pub struct ReplicatedLog<F: Fs> {
    hosted: Rc<Hosted<F>>,
    lease_margin_ms: u64,
    /// The term this handle opened in: it stages only in that term. An engine that replayed
    /// the log as of one term must never append in a later one (another leader may have
    /// appended in between, and its records would not follow from this engine's state).
    term: Cell<u64>,
    /// Which open of the replica this handle is: an older handle (an engine rebuilt since, in
    /// the same term) may not stage, or its records would follow from a state the new engine
    /// never had.
    open_seq: Cell<u64>,
    /// Counts a commit and its latency (µs) in the host's stats.
    on_commit: Rc<dyn Fn(u64)>,
}

impl<F: Fs> ReplicatedLog<F> {
    fn replica(&self) -> &Replica<F> {
        &self.hosted.replica
    }

    fn not_leader(&self) -> StorageError {
        StorageError::NotLeader {
            leader_hint: self.replica().leader(),
            term: self.replica().term(),
        }
    }

    /// Whether this replica serves: it leads, has committed an entry of its term, and holds
    /// every entry it has committed and durable, with nothing proposed and uncommitted (an
    /// engine replaying now sees the whole log it will append to).
    fn serves(&self) -> bool {
        let r = self.replica();
        let end = r.committed_end();
        r.is_serving()
            && !r.has_unflushed()
            && end == r.log().end_offset()
            && end == r.raft_log_end()
    }

    /// Waits until `end` is durable on this replica (the leader's own write may finish after
    /// a majority of followers acknowledged).
    async fn durable_to(&self, end: u64) -> Result<()> {
        while self.replica().log().end_offset() < end {
            if self.hosted.stopped.get() {
                return Err(StorageError::Closed);
            }
            self.hosted.progressed.listen().await;
        }
        Ok(())
    }
}

/// Finds the replica hosted at a partition's directory.
type Lookup<F> = Rc<dyn Fn(&Path) -> Option<Rc<Hosted<F>>>>;
/// A clock's "wait until", erased.
type SleepUntil = Rc<dyn Fn(u64) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>>;

/// `PartitionLog::Env` for a replicated log: a shard's host, erased over the clock.
pub struct ReplicaEnv<F: Fs> {
    lookup: Lookup<F>,
    sleep_until: SleepUntil,
    now_ms: Rc<dyn Fn() -> u64>,
    open_wait_ms: u64,
    lease_margin_ms: u64,
    on_commit: Rc<dyn Fn(u64)>,
}

impl<F: Fs> Clone for ReplicaEnv<F> {
    fn clone(&self) -> Self {
        ReplicaEnv {
            lookup: self.lookup.clone(),
            sleep_until: self.sleep_until.clone(),
            now_ms: self.now_ms.clone(),
            open_wait_ms: self.open_wait_ms,
            lease_margin_ms: self.lease_margin_ms,
            on_commit: self.on_commit.clone(),
        }
    }
}

impl<F: Fs, C: Clock> ReplicaHost<F, C> {
    /// The environment partition logs of this host open over.
    pub fn env(self: &Rc<Self>) -> ReplicaEnv<F> {
        let weak = Rc::downgrade(self);
        let clock = self.clock.clone();
        let clock2 = self.clock.clone();
        let stats = Rc::downgrade(self);
        ReplicaEnv {
            on_commit: Rc::new(move |us| {
                if let Some(h) = stats.upgrade() {
                    h.bump(|s| {
                        s.commits += 1;
                        s.commit_us_sum += us;
                    });
                }
            }),
            lookup: Rc::new(move |dir| weak.upgrade()?.hosted_at(dir)),
            sleep_until: Rc::new(move |t| Box::pin(clock.sleep_until_ms(t))),
            now_ms: Rc::new(move || clock2.now_ms()),
            open_wait_ms: self.open_wait_ms,
            lease_margin_ms: self.lease_margin_ms.get(),
        }
    }
}

impl<F: Fs> PartitionLog for ReplicatedLog<F> {
    type Env = ReplicaEnv<F>;
    type Ticket = ReplicatedTicket;

    /// The log of the replica hosted at `dir`, once it serves (see the module doc); the host's
    /// `open_wait_ms` at most, then `NotLeader`.
    async fn open(env: &ReplicaEnv<F>, dir: PathBuf, _config: LogConfig) -> Result<Self> {
        let hosted = (env.lookup)(&dir).ok_or_else(|| {
            StorageError::Config(format!("no replica is hosted at {}", dir.display()))
        })?;
        let log = ReplicatedLog {
            hosted,
            lease_margin_ms: env.lease_margin_ms,
            term: Cell::new(0),
            open_seq: Cell::new(0),
            on_commit: env.on_commit.clone(),
        };
        let deadline = (env.now_ms)() + env.open_wait_ms;
        loop {
            if log.hosted.stopped.get() {
                return Err(StorageError::Closed);
            }
            if log.serves() {
                log.term.set(log.replica().term());
                let seq = log.hosted.opens.get() + 1;
                log.hosted.opens.set(seq);
                log.open_seq.set(seq);
                return Ok(log);
            }
            let now = (env.now_ms)();
            if now >= deadline {
                return Err(log.not_leader());
            }
            // A replica that knows another leader will not lead soon: answer at once.
            if log
                .replica()
                .leader()
                .is_some_and(|l| l != log.replica().node())
            {
                return Err(log.not_leader());
            }
            let l = std::pin::pin!(log.hosted.progressed.listen());
            let t = std::pin::pin!((env.sleep_until)(deadline.min(now + TICK_INTERVAL_MS)));
            futures::future::select(l, t).await;
        }
    }

    fn start_offset(&self) -> u64 {
        self.replica().log().start_offset()
    }

    fn end_offset(&self) -> u64 {
        self.replica().committed_end()
    }

    fn term(&self) -> u64 {
        self.replica().term()
    }

    async fn wait_for_space(&self, len_bytes: usize) -> Result<()> {
        self.replica().log().wait_for_space(len_bytes).await
    }

    fn stage(&self, batch: Vec<u8>) -> Result<Staged<ReplicatedTicket>> {
        if self.hosted.stopped.get() {
            return Err(StorageError::Closed);
        }
        // Fenced to the term it opened in (checked and proposed with no await between).
        if self.replica().term() != self.term.get()
            || self.hosted.opens.get() != self.open_seq.get()
        {
            return Err(self.not_leader());
        }
        let proposal = self.replica().propose(batch).map_err(|e| match e {
            ReplicaError::NotLeader { leader_hint, term } => {
                StorageError::NotLeader { leader_hint, term }
            }
            ReplicaError::InvalidBatch(b) => StorageError::InvalidBatch(b),
            ReplicaError::Storage(s) => s,
            other => StorageError::Config(format!("propose: {other}")),
        })?;
        self.hosted.poke();
        Ok(Staged {
            info: AppendInfo {
                base_offset: proposal.offset,
                last_offset: proposal.end - 1,
            },
            term: proposal.term,
            ticket: ReplicatedTicket {
                proposal,
                proposed: crate::runtime::monotonic_now(),
            },
        })
    }

    async fn committed(&self, ticket: ReplicatedTicket) -> Result<AppendInfo> {
        let proposed = ticket.proposed;
        let info = ticket.proposal.await.map_err(|e| match e {
            ReplicaError::LeadershipLost { leader_hint, term } => {
                StorageError::LeadershipLost { leader_hint, term }
            }
            ReplicaError::NotLeader { leader_hint, term } => {
                StorageError::NotLeader { leader_hint, term }
            }
            ReplicaError::Storage(s) => s,
            ReplicaError::Closed => StorageError::LeadershipLost {
                leader_hint: None,
                term: self.replica().term(),
            },
            other => StorageError::Config(format!("commit: {other}")),
        })?;
        self.durable_to(info.last_offset + 1).await?;
        (self.on_commit)(proposed.elapsed().as_micros() as u64);
        Ok(info)
    }

    async fn read(&self, offset: u64, max_bytes: usize) -> Result<Vec<ReadBatch>> {
        let end = self.end_offset();
        if offset >= end {
            return Ok(Vec::new());
        }
        let mut batches = self.replica().log().read(offset, max_bytes).await?;
        batches.retain(|b| b.header.base_offset < end);
        Ok(batches)
    }

    async fn offset_for_timestamp(&self, ts_ms: i64) -> Result<Option<u64>> {
        let found = self.replica().log().offset_for_timestamp(ts_ms).await?;
        Ok(found.filter(|&o| o < self.end_offset()))
    }

    /// Raft cuts a replicated log's conflicting suffix itself; no user may.
    async fn truncate_from(&self, _offset: u64) -> Result<()> {
        Err(StorageError::Config(
            "a replicated log's suffix is cut by Raft only".into(),
        ))
    }

    /// Keeps everything: a follower behind the log's start could only be caught up by a Raft
    /// snapshot, which the replicated log does not send yet.
    async fn delete_segments_below(&self, _offset: u64) -> Result<RetentionOutcome> {
        Ok(self.kept())
    }

    async fn enforce_retention(
        &self,
        _now_ms: i64,
        _keep_from: Option<u64>,
    ) -> Result<RetentionOutcome> {
        Ok(self.kept())
    }

    /// No engine snapshot is kept on a replicated log yet: the engine replays its whole log.
    async fn read_snapshot(&self) -> Result<Option<Vec<u8>>> {
        Ok(None)
    }

    async fn write_snapshot(&self, _bytes: Vec<u8>) -> Result<()> {
        Ok(())
    }

    async fn remove_snapshot(&self) -> Result<()> {
        Ok(())
    }

    /// Leases replayed here were granted by whichever node led before, on its clock.
    fn inherited_lease_margin_ms(&self) -> u64 {
        self.lease_margin_ms
    }

    fn config(&self) -> &LogConfig {
        self.replica().log().config()
    }

    fn segments(&self) -> Vec<SegmentInfo> {
        self.replica().log().segments()
    }

    fn size_bytes(&self) -> u64 {
        self.replica().log().size_bytes()
    }

    fn stats(&self) -> LogStats {
        self.replica().log().stats()
    }

    /// The replica stays with its host (it goes on following); only this handle ends.
    async fn close(&self) -> Result<()> {
        Ok(())
    }
}

impl<F: Fs> ReplicatedLog<F> {
    fn kept(&self) -> RetentionOutcome {
        RetentionOutcome {
            segments_deleted: 0,
            bytes_deleted: 0,
            new_start_offset: self.start_offset(),
        }
    }
}
