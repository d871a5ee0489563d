//! One partition of a queue on its shard: the sans-I/O engine, its log, its timer and its
//! long-poll waiters.
//!
//! The order that makes replay exact: wait for log space, then — with no await in between —
//! let the engine decide and apply a command and stage its records in the log. Records reach
//! the log in the order the engine applied them. The reply waits until they are committed
//! (`stage_records` then `wait_committed`: the one place a command's records become a reply,
//! for requests and timers alike). If a commit fails, the engine's state is ahead of the log:
//! the partition rebuilds itself from the log before serving again.
//!
//! The actor is generic over its log (the [`PartitionLog`] seam: `LocalLog` on DMA files in a
//! broker, on `SimFs` in the simulated-shard test, a replicated log later) and its clock
//! (wall clock or virtual time).
//!
//! The engine keeps no message content (ARCHITECTURE.md): what a receive hands out and what a DLQ
//! move forwards is read here from the messages' `Sent` records, in as few log reads as the
//! offsets allow, issued together (`read_contents`). A log read returns only committed records:
//! when every `Sent` needed is committed already (a backlog), the reads run while the
//! command's own records commit; otherwise once they are (the `Sent` records precede them in
//! the log, so they are committed too). The reply waits for both.

use crate::engine::{
    Command, Counters, Delivery, MoveRequest, MoveStart, Partition, PartitionConfig, Payload,
    Record as EngineRecord, RecordKind, Reply,
};
use crate::error::{ServiceError, ServiceResult};
use crate::partition_log::{LocalLog, PartitionLog, Staged};
use crate::runtime::{self, Clock, Event, WallClock};
use sluice_storage::batch::BatchBuilder;
use sluice_storage::fs::DmaFs;
use sluice_storage::{LogConfig, ReadBatch};
use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::rc::{Rc, Weak};
use std::sync::Arc;

/// Long-poll waiters parked on one partition at once; more get `OverLimit`-style back-pressure.
pub const WAITERS_PER_PARTITION_MAX: usize = 10_000;
/// Bytes read per step when replaying the log at start-up.
const REPLAY_READ_BYTES: usize = 4 * 1024 * 1024;
/// Bytes asked of one log read when fetching the `Sent` records of a receive's messages or of
/// DLQ moves: a receive's messages usually sit in a few consecutive batches, which one read
/// returns; offsets beyond what it returned get reads of their own (a read always returns the
/// batch holding its offset, however large).
/// (A few hundred bytes in unit tests, so that the simulated partition's reads end before the
/// offsets a receive wants and the rounds of `read_contents` are exercised.)
const CONTENT_READ_BYTES: usize = if cfg!(test) { 300 } else { 256 * 1024 };
/// A wanted offset this many records or more past the one being read gets a read of its own,
/// and that one reads only the batch holding its offset: a FIFO receive's messages, one group's,
/// sit as far apart in the log as the groups interleave (a long read would verify and copy
/// hundreds of other groups' messages per message).
/// (Four in unit tests, so that the simulated partition's small logs take the far-apart path.)
const CONTENT_READ_GAP_RECORDS: u64 = if cfg!(test) { 4 } else { 256 };
/// Reads of one `read_contents` round in flight at once (a receive's ten far-apart messages
/// are read together; a DLQ move step's hundreds, this many at a time).
const CONTENT_READS_AT_ONCE: usize = 16;
/// Bytes asked of one log read when loading never-received messages from the tail (the
/// engine's `Tail`): a receive's worth and more of 2 KiB messages per read.
const LOAD_READ_BYTES: usize = 1024 * 1024;
/// Reads one command may spend loading from the tail before it runs with what it has.
const LOAD_READS_PER_COMMAND_MAX: usize = 16;
/// While fewer available entries than this precede the tail, a receive starts the next load in
/// the background (read-ahead), so that receives seldom wait for the disk.
const LOAD_AHEAD_ENTRIES: usize = 2048;
/// Contents of messages just loaded from the tail, kept for the receives that follow (so a cold
/// message is read and decoded once, not once to load and again to deliver): bytes per
/// partition, oldest dropped first.
const LOADED_CONTENT_BYTES_MAX: usize = 8 * LOAD_READ_BYTES;
/// Contents of messages just sent, kept for the receive that follows while the queue has no
/// backlog in its log (a closed loop's consumer takes them within a group commit or two): bytes
/// per partition, oldest dropped first. The same bytes sit in the log's read cache; keeping
/// them decoded spares the receive a read and a decode of each.
const SENT_CONTENT_BYTES_MAX: usize = LOAD_READ_BYTES;
/// A snapshot is written after this many records since the last one...
const SNAPSHOT_INTERVAL_RECORDS: u64 = 50_000;
/// ...or after this long, if any record was written since...
const SNAPSHOT_INTERVAL_MS: u64 = 30_000;
/// ...or as often as compaction runs while the newest holds compaction back and the engine
/// holds at most this many entries (a snapshot of ~1 MiB)...
const SNAPSHOT_CHEAP_ENTRIES: usize = 10_000;
/// ...but, once the last one took more than [`SNAPSHOT_SMALL_BYTES`], never before the log has
/// grown by this many times its bytes. A large state (a FIFO backlog's dedup table and wait
/// lists: ~25 bytes a message) then costs at most half again the log's writes, and a restart
/// reads one snapshot plus at most twice its bytes of log, whatever the state's size.
const SNAPSHOT_LOG_RATIO: u64 = 2;
/// A snapshot this small is cheap whatever the log did since (see [`SNAPSHOT_LOG_RATIO`]).
const SNAPSHOT_SMALL_BYTES: u64 = 1 << 20;
/// Compaction looks at a partition's log at most this often.
pub const COMPACTION_INTERVAL_MS: u64 = 1000;

/// What decides whether a partition's next snapshot is due.
#[derive(Debug, Clone, Copy)]
struct SnapshotPace {
    /// Records the engine applied since the last snapshot's offset.
    records_since: u64,
    /// Since the last snapshot was started.
    ms_since: u64,
    /// The last snapshot holds compaction back and a new one would be cheap.
    holds_back: bool,
    /// The last snapshot's size (0 before the first).
    last_bytes: u64,
    /// Bytes of log staged since the last snapshot.
    log_bytes_since: u64,
}

/// The snapshot rule: after [`SNAPSHOT_INTERVAL_RECORDS`] records, after
/// [`SNAPSHOT_INTERVAL_MS`] with any record, or sooner while a cheap one holds compaction back —
/// but a large last snapshot first waits for [`SNAPSHOT_LOG_RATIO`] times its bytes of log.
fn snapshot_due(p: SnapshotPace) -> bool {
    let paid = p.last_bytes <= SNAPSHOT_SMALL_BYTES
        || p.log_bytes_since >= SNAPSHOT_LOG_RATIO.saturating_mul(p.last_bytes);
    paid && (p.records_since >= SNAPSHOT_INTERVAL_RECORDS
        || (p.records_since > 0 && p.ms_since >= SNAPSHOT_INTERVAL_MS)
        || (p.records_since > 0 && p.holds_back))
}

/// Where DLQ moves go: the shard forwards them to the dead-letter queue's partition.
pub type MoveSink = Rc<dyn Fn(MoveRequest)>;

/// A partition actor: by default on the broker's log and clock.
pub struct PartitionActor<L: PartitionLog = LocalLog<DmaFs>, C: Clock = WallClock> {
    pub queue_id: u64,
    pub partition: u32,
    dir: PathBuf,
    fs: L::Env,
    clock: C,
    log_config: LogConfig,
    config: RefCell<PartitionConfig>,
    engine: RefCell<Partition>,
    log: RefCell<Rc<L>>,
    /// Something may have become deliverable (a send, an expired lease, a released message):
    /// long polls wake on it. A command notifies it as soon as the engine has applied it, before
    /// its records are durable, so a woken receive stages its lease into the same group commit
    /// (a receive's reply waits for its own records, which follow the send's in the log).
    ready: Event,
    /// Records became durable: readers of the log as a stream wake on it (they see only
    /// durable records).
    appended: Event,
    /// The next timer deadline may have moved earlier.
    rearm: Event,
    broken: Cell<bool>,
    closed: Cell<bool>,
    waiters: Cell<usize>,
    moves: MoveSink,
    /// When compaction last looked at the log (ms), and whether it runs now.
    compacted_ms: Cell<u64>,
    compacting: Cell<bool>,
    /// The newest snapshot on disk: (its offset, the lowest offset it needs); compaction keeps
    /// what it needs. When the last one was started, and whether one is being written.
    snapshot: Cell<Option<(u64, u64)>>,
    snapshot_ms: Cell<u64>,
    snapshotting: Cell<bool>,
    /// Bytes of the last snapshot taken (0 before the first since start), and of the batches
    /// staged since it was taken (see [`SNAPSHOT_LOG_RATIO`]).
    snapshot_bytes: Cell<u64>,
    staged_since_snapshot: Cell<u64>,
    /// Counts rebuilds: a snapshot taken before one must not be written after it.
    generation: Cell<u64>,
    /// Contents read while loading from the tail (see [`LOADED_CONTENT_BYTES_MAX`]).
    loaded: RefCell<KeptContents>,
    /// Contents of messages just sent (see [`SENT_CONTENT_BYTES_MAX`]).
    sent: RefCell<KeptContents>,
    /// A load from the tail is reading: other commands wait for it instead of reading the
    /// same bytes (`load_done` wakes them).
    loading: Cell<bool>,
    load_done: Event,
    /// Message counts for metrics.
    ops: crate::metrics::PartitionOps,
    this: Weak<PartitionActor<L, C>>,
}

/// Message contents kept in memory by the offset of their `Sent` record, up to a budget of
/// bytes (the oldest offsets go first). A content is taken when it is handed out: a message
/// delivered again is read from the log.
#[derive(Debug)]
struct KeptContents {
    by_offset: std::collections::BTreeMap<u64, Arc<Payload>>,
    bytes: usize,
    max_bytes: usize,
}

impl KeptContents {
    fn new(max_bytes: usize) -> Self {
        KeptContents {
            by_offset: Default::default(),
            bytes: 0,
            max_bytes,
        }
    }

    fn keep(&mut self, offset: u64, content: Arc<Payload>) {
        self.bytes += content.size_bytes();
        if let Some(old) = self.by_offset.insert(offset, content) {
            self.bytes -= old.size_bytes();
        }
        while self.bytes > self.max_bytes {
            let Some((_, p)) = self.by_offset.pop_first() else {
                break;
            };
            self.bytes -= p.size_bytes();
        }
    }

    fn take(&mut self, offset: u64) -> Option<Arc<Payload>> {
        let p = self.by_offset.remove(&offset)?;
        self.bytes -= p.size_bytes();
        Some(p)
    }

    fn clear(&mut self) {
        self.by_offset.clear();
        self.bytes = 0;
    }
}

/// The offsets of the `Sent` records whose contents a command's reply and moves need.
fn content_offsets<'a>(
    reply: &'a Reply<Delivery>,
    moves: &'a [MoveStart],
) -> impl Iterator<Item = u64> + 'a {
    let delivered: &[Delivery] = match reply {
        Reply::Received(v) => v,
        _ => &[],
    };
    delivered
        .iter()
        .map(|d| d.sent_offset)
        .chain(moves.iter().map(|m| m.sent_offset))
}

/// One log read of `read_contents`: from a wanted offset, either a long read covering the
/// wanted offsets close after it, or only the batch holding it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ContentRead {
    from: u64,
    max_bytes: usize,
    one_batch: bool,
}

/// The reads of one `read_contents` round, from its wanted offsets (sorted, distinct): a read
/// starts at each wanted offset [`CONTENT_READ_GAP_RECORDS`] or more past the last read's
/// start; a read followed by wanted offsets within that distance reads
/// [`CONTENT_READ_BYTES`], one alone reads only its batch.
fn plan_content_reads(want: &[(u64, usize)]) -> Vec<ContentRead> {
    let mut plan: Vec<ContentRead> = Vec::new();
    for &(offset, _) in want {
        match plan.last_mut() {
            Some(last) if offset - last.from < CONTENT_READ_GAP_RECORDS => {
                last.max_bytes = CONTENT_READ_BYTES;
                last.one_batch = false;
            }
            _ => plan.push(ContentRead {
                from: offset,
                max_bytes: 1,
                one_batch: true,
            }),
        }
    }
    plan
}

/// The engine's records as one log batch, each encoded straight into it, the batch's buffer
/// sized up front (no growth copies).
fn encode_records(records: &[EngineRecord], now_ms: u64) -> Vec<u8> {
    // Each record's batch framing (length, index, time, key and value lengths, header count)
    // is 26 bytes on top of its value; the hint is an estimate, so round up.
    let hint = records.iter().map(|r| r.encoded_len_hint() + 32).sum();
    let mut b = BatchBuilder::with_capacity(hint);
    for r in records {
        b.push_value_with(now_ms as i64, |out| r.encode_into(out));
    }
    b.finish().expect("effects with records are not empty")
}

impl PartitionActor {
    /// Opens the partition's log and rebuilds the engine by replaying it.
    pub async fn open(
        fs: DmaFs,
        dir: PathBuf,
        config: PartitionConfig,
        log_config: LogConfig,
        moves: MoveSink,
    ) -> ServiceResult<Rc<PartitionActor>> {
        Self::open_on(fs, WallClock, dir, config, log_config, moves).await
    }
}

impl<L: PartitionLog, C: Clock> PartitionActor<L, C> {
    /// [`PartitionActor::open`] on any log and clock (a simulated world in tests).
    pub async fn open_on(
        fs: L::Env,
        clock: C,
        dir: PathBuf,
        config: PartitionConfig,
        log_config: LogConfig,
        moves: MoveSink,
    ) -> ServiceResult<Rc<PartitionActor<L, C>>> {
        let (log, engine, snapshot) = Self::load(&fs, &dir, &config, &log_config).await?;
        let started_ms = clock.now_ms();
        let actor = Rc::new_cyclic(|this| PartitionActor {
            queue_id: config.queue_id,
            partition: config.partition,
            dir,
            fs,
            clock,
            log_config,
            config: RefCell::new(config),
            engine: RefCell::new(engine),
            log: RefCell::new(Rc::new(log)),
            ready: Event::default(),
            appended: Event::default(),
            rearm: Event::default(),
            broken: Cell::new(false),
            closed: Cell::new(false),
            waiters: Cell::new(0),
            moves,
            compacted_ms: Cell::new(0),
            compacting: Cell::new(false),
            snapshot: Cell::new(snapshot),
            snapshot_ms: Cell::new(started_ms),
            snapshotting: Cell::new(false),
            snapshot_bytes: Cell::new(0),
            staged_since_snapshot: Cell::new(0),
            generation: Cell::new(0),
            loaded: RefCell::new(KeptContents::new(LOADED_CONTENT_BYTES_MAX)),
            sent: RefCell::new(KeptContents::new(SENT_CONTENT_BYTES_MAX)),
            loading: Cell::new(false),
            load_done: Event::default(),
            ops: Default::default(),
            this: this.clone(),
        });
        // Moves that were started but not completed before a restart go out again.
        actor.forward_pending_moves().await?;
        runtime::spawn(Self::timer_loop(actor.clone()));
        Ok(actor)
    }

    /// Forwards every move the engine lists as started and not completed (after a restart or
    /// a rebuild; the destination's `AcceptMove` is idempotent by origin).
    async fn forward_pending_moves(&self) -> ServiceResult<()> {
        let pending = self.engine.borrow().pending_moves();
        if pending.is_empty() {
            return Ok(());
        }
        let (_, moves) = self.with_contents(Reply::None, pending).await?;
        for mv in moves {
            (self.moves)(mv);
        }
        Ok(())
    }

    /// The contents of the `Sent` records at `offsets` (any order, distinct), by position;
    /// `None` for an offset the log no longer holds (compacted away: the message is gone).
    ///
    /// Sorted, the wanted offsets are read in rounds: each round plans reads from the offsets
    /// not settled yet (`plan_content_reads`) and issues them all at once, so that a receive
    /// whose messages sit far apart in the log (a FIFO group's) waits for one round of small
    /// reads, not for each in turn. A wanted offset inside what a read returned is settled
    /// (found, or `None`); one past it goes to the next round.
    async fn read_contents(&self, offsets: &[u64]) -> ServiceResult<Vec<Option<Arc<Payload>>>> {
        let log = self.log();
        let mut out = vec![None; offsets.len()];
        let mut want: Vec<(u64, usize)> = Vec::with_capacity(offsets.len());
        for (i, &offset) in offsets.iter().enumerate() {
            match self.take_kept(offset) {
                Some(p) => out[i] = Some(p),
                None => want.push((offset, i)),
            }
        }
        want.sort_unstable();
        while !want.is_empty() {
            let (start, end) = (log.start_offset(), log.end_offset());
            want.retain(|w| w.0 >= start && w.0 < end);
            let plan = plan_content_reads(&want);
            let mut reads = Vec::with_capacity(plan.len());
            for chunk in plan.chunks(CONTENT_READS_AT_ONCE) {
                let batch = chunk.iter().map(|r| log.read(r.from, r.max_bytes));
                reads.extend(futures::future::join_all(batch).await);
            }
            // What each read covered, [from, end): wanted offsets inside are settled.
            let mut covered: Vec<(u64, u64)> = Vec::with_capacity(plan.len());
            let mut others = Vec::new();
            let next_offset = self.engine.borrow().next_offset();
            for (r, batches) in plan.iter().zip(reads) {
                let mut reached = r.from;
                for b in batches? {
                    for rec in b.view().data_records() {
                        let rec =
                            rec.map_err(|e| ServiceError::Internal(format!("log record: {e}")))?;
                        let Ok(at) = want.binary_search_by_key(&rec.offset, |w| w.0) else {
                            // A one-batch read keeps the batch's other messages for the
                            // receives that follow: a FIFO backlog's batches hold the heads
                            // of the groups served next.
                            if r.one_batch && rec.offset < next_offset {
                                if let Ok(e) = EngineRecord::decode(rec.value) {
                                    if matches!(e.kind, RecordKind::Sent(_)) {
                                        others.push((rec.offset, e));
                                    }
                                }
                            }
                            continue;
                        };
                        let e = EngineRecord::decode(rec.value).map_err(|e| {
                            ServiceError::Internal(format!("engine record at {}: {e}", rec.offset))
                        })?;
                        let RecordKind::Sent(sent) = e.kind else {
                            return Err(ServiceError::Internal(format!(
                                "no Sent record at offset {}",
                                rec.offset
                            )));
                        };
                        out[want[at].1] = Some(sent.payload);
                    }
                    reached = reached.max(b.header.next_offset());
                }
                // A read that returned nothing at its offset: the log ends there.
                covered.push((r.from, reached.max(r.from + 1)));
            }
            if !others.is_empty() {
                self.keep_loaded(others);
            }
            covered.sort_unstable();
            want.retain(|&(offset, _)| {
                let i = covered.partition_point(|c| c.0 <= offset);
                !(i > 0 && offset < covered[i - 1].1)
            });
        }
        Ok(out)
    }

    /// Joins the engine's decisions with the messages' contents, read from the log. A
    /// delivered message whose `Sent` record is gone was deleted meanwhile (a standard queue
    /// accepts a delete by an older handle, and compaction may then drop its record): it is
    /// left out of the reply. A move's record stays while it is pending (a moving message is
    /// neither deleted, purged nor expired), so a missing one is an error.
    async fn with_contents(
        &self,
        reply: Reply<Delivery>,
        moves: Vec<MoveStart>,
    ) -> ServiceResult<(Reply, Vec<MoveRequest>)> {
        let offsets: Vec<u64> = content_offsets(&reply, &moves).collect();
        if offsets.is_empty() {
            let reply = reply.map_received(|_| Ok::<_, ServiceError>(Vec::new()))?;
            return Ok((reply, Vec::new()));
        }
        let mut contents = self.read_contents(&offsets).await?.into_iter();
        let reply = reply.map_received(|v| {
            Ok::<_, ServiceError>(
                v.into_iter()
                    .zip(contents.by_ref())
                    .filter_map(|(d, c)| match c {
                        Some(p) => Some(d.with_payload(p)),
                        None => {
                            tracing::debug!(
                                queue = self.queue_id,
                                partition = self.partition,
                                offset = d.sent_offset,
                                "a received message was deleted before its content was read"
                            );
                            None
                        }
                    })
                    .collect(),
            )
        })?;
        let moves = moves
            .into_iter()
            .zip(contents)
            .map(|(m, c)| match c {
                Some(p) => Ok(m.with_payload(p)),
                None => Err(ServiceError::Internal(format!(
                    "the Sent record of a pending move is gone (offset {})",
                    m.sent_offset
                ))),
            })
            .collect::<ServiceResult<Vec<_>>>()?;
        Ok((reply, moves))
    }

    /// Reads the log from `from` (one read of [`LOAD_READ_BYTES`]) and hands its records to
    /// the engine's tail loading. Returns false when nothing could be read there (the records
    /// are not durable yet).
    async fn load_tail(
        log: &L,
        engine: &RefCell<Partition>,
        from: u64,
    ) -> ServiceResult<Option<Vec<(u64, EngineRecord)>>> {
        if from < log.start_offset() || from >= log.end_offset() {
            return Ok(None);
        }
        let batches = log.read(from, LOAD_READ_BYTES).await?;
        let mut records = Vec::new();
        let mut end = from;
        for b in &batches {
            for r in b.view().data_records() {
                let r = r.map_err(|e| ServiceError::Internal(format!("log record: {e}")))?;
                if r.offset < from {
                    continue;
                }
                let rec = EngineRecord::decode(r.value).map_err(|e| {
                    ServiceError::Internal(format!("engine record at {}: {e}", r.offset))
                })?;
                records.push((r.offset, rec));
            }
            end = b.header.next_offset();
        }
        if end <= from {
            return Ok(None);
        }
        let loaded = engine.borrow_mut().load(from, &records, end);
        // Only the contents of messages that got an entry are worth keeping.
        let mut loaded = loaded.into_iter().peekable();
        records.retain(|(offset, _)| {
            while loaded.next_if(|&o| o < *offset).is_some() {}
            loaded.next_if_eq(offset).is_some()
        });
        Ok(Some(records))
    }

    /// Keeps the contents of the `Sent` records just loaded for the receives that follow.
    fn keep_loaded(&self, records: Vec<(u64, EngineRecord)>) {
        let mut kept = self.loaded.borrow_mut();
        for (offset, rec) in records {
            if let RecordKind::Sent(sent) = rec.kind {
                kept.keep(offset, sent.payload);
            }
        }
    }

    /// Keeps the contents of the `Sent` records just staged at `first_offset..` for the
    /// receives that follow, unless the queue has a backlog in its log (they joined its tail,
    /// and the oldest messages go out first).
    fn keep_sent(&self, records: &[EngineRecord], first_offset: u64) {
        if self.engine.borrow().tail_load_offset().is_some() {
            return;
        }
        let mut kept = self.sent.borrow_mut();
        for (offset, rec) in (first_offset..).zip(records) {
            if let RecordKind::Sent(sent) = &rec.kind {
                kept.keep(offset, sent.payload.clone());
            }
        }
    }

    /// The content kept for the `Sent` record at `offset`, if any (taken: a message is
    /// delivered once from memory).
    fn take_kept(&self, offset: u64) -> Option<Arc<Payload>> {
        let sent = self.sent.borrow_mut().take(offset);
        sent.or_else(|| self.loaded.borrow_mut().take(offset))
    }

    /// Before a receive or a redrive step: loads never-received messages from the tail while
    /// the engine wants them, a bounded number of reads per command.
    async fn load_for_command(&self, cmd: &Command) -> ServiceResult<()> {
        if !matches!(cmd, Command::Receive(_) | Command::StartMoves(_)) {
            return Ok(());
        }
        let log = self.log();
        let mut reads = 0;
        while reads < LOAD_READS_PER_COMMAND_MAX {
            let Some(from) = self.engine.borrow().load_wanted() else {
                break;
            };
            if self.loading.get() {
                // Another command is reading this very chunk: wait for it, then look again.
                let until = self.clock.now_ms() + 1000;
                self.load_done.listen_until_on(&self.clock, until).await;
                reads += 1;
                continue;
            }
            self.loading.set(true);
            let read = Self::load_tail(&log, &self.engine, from).await;
            self.loading.set(false);
            self.load_done.notify();
            reads += 1;
            match read? {
                Some(records) => self.keep_loaded(records),
                None => break,
            }
        }
        self.read_ahead();
        Ok(())
    }

    /// Starts one load from the tail in the background if the entries ahead of it run low and
    /// no load is reading.
    ///
    /// Also passes tail messages whose retention ran out before anyone received them: until a
    /// load passes them they hold the compaction floor (the space of an expired backlog comes
    /// back only once it is read past), so the timer loop calls this too, and it keeps reading
    /// while expired messages remain.
    fn read_ahead(&self) {
        if self.loading.get() || self.broken.get() || self.closed.get() {
            return;
        }
        let expired = self.engine.borrow().tail_expired() > 0;
        // Only while what it reads can stay in memory until it is received (else it would be
        // read again).
        if !expired && self.loaded.borrow().bytes + LOAD_READ_BYTES > LOADED_CONTENT_BYTES_MAX {
            return;
        }
        let from = if expired {
            self.engine.borrow().tail_load_offset()
        } else {
            self.engine.borrow().load_wanted_below(LOAD_AHEAD_ENTRIES)
        };
        let Some(mut from) = from else {
            return;
        };
        let Some(this) = self.this.upgrade() else {
            return;
        };
        self.loading.set(true);
        runtime::spawn(async move {
            loop {
                let log = this.log();
                let read = Self::load_tail(&log, &this.engine, from).await;
                match read {
                    Ok(Some(records)) => this.keep_loaded(records),
                    Ok(None) => break,
                    Err(e) => {
                        tracing::debug!(
                            queue = this.queue_id,
                            partition = this.partition,
                            error = %e,
                            "read-ahead from the tail failed; receives will load"
                        );
                        break;
                    }
                }
                let engine = this.engine.borrow();
                if engine.tail_expired() == 0 || this.closed.get() || this.broken.get() {
                    break;
                }
                match engine.tail_load_offset() {
                    Some(f) => from = f,
                    None => break,
                }
            }
            this.loading.set(false);
            this.load_done.notify();
        });
    }

    /// The engine restored from the snapshot file, if there is a usable one: it is this
    /// partition's, intact, not ahead of the log, and the log still holds what it needs. An
    /// unusable one is only logged (the caller replays the log instead); one ahead of the log
    /// is removed, since records appended later at its offsets would be other records.
    async fn restore_snapshot(config: &PartitionConfig, log: &L) -> Option<Partition> {
        let bytes = match log.read_snapshot().await {
            Ok(Some(b)) => b,
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!(error = %e, "snapshot unreadable; replaying the log");
                return None;
            }
        };
        let restored = Partition::restore(config.clone(), &bytes);
        if bytes.len() as u64 > SNAPSHOT_SMALL_BYTES {
            drop(bytes);
            crate::memory::release_freed_memory();
        }
        let engine = match restored {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(
                    queue = config.queue_id,
                    partition = config.partition,
                    error = %e,
                    "snapshot refused; replaying the log"
                );
                return None;
            }
        };
        if engine.snapshot_offset() > log.end_offset() {
            tracing::warn!(
                queue = config.queue_id,
                partition = config.partition,
                snapshot = engine.snapshot_offset(),
                log_end = log.end_offset(),
                "snapshot ahead of the log; removed, replaying the log"
            );
            let _ = log.remove_snapshot().await;
            return None;
        }
        if engine.snapshot_needs_from() < log.start_offset() {
            tracing::warn!(
                queue = config.queue_id,
                partition = config.partition,
                "snapshot older than the log's start; replaying the log"
            );
            return None;
        }
        Some(engine)
    }

    /// Writes `bytes`, a snapshot at `offset`, once the log is durable up to `offset`: a
    /// temporary file, synced, renamed over the snapshot, the directory synced. Returns false
    /// if the partition failed or closed before (nothing written).
    async fn write_snapshot(&self, offset: u64, bytes: Vec<u8>) -> ServiceResult<bool> {
        let generation = self.generation.get();
        loop {
            if self.broken.get() || self.generation.get() != generation {
                return Ok(false);
            }
            if self.log().end_offset() >= offset {
                break;
            }
            let until = self.clock.now_ms() + 100;
            self.appended.listen_until_on(&self.clock, until).await;
        }
        self.log().write_snapshot(bytes).await?;
        Ok(true)
    }

    /// Starts writing a snapshot in the background when one is due.
    fn maybe_snapshot(&self, now: u64) {
        if self.snapshotting.get() || self.closed.get() || self.broken.get() {
            return;
        }
        let engine = self.engine.borrow();
        let offset = engine.snapshot_offset();
        let (last, last_need) = self.snapshot.get().unwrap_or((0, 0));
        let since = offset.saturating_sub(last);
        // A small snapshot that holds compaction back is renewed sooner (a backlog drained
        // from the tail moves the floor all the time; its snapshot is a few KiB).
        let holds_back = self.snapshot.get().is_some()
            && last_need < engine.compaction_floor()
            && engine.entries() <= SNAPSHOT_CHEAP_ENTRIES
            && now >= self.snapshot_ms.get() + COMPACTION_INTERVAL_MS;
        let due = snapshot_due(SnapshotPace {
            records_since: since,
            ms_since: now.saturating_sub(self.snapshot_ms.get()),
            holds_back,
            last_bytes: self.snapshot_bytes.get(),
            log_bytes_since: self.staged_since_snapshot.get(),
        });
        if !due {
            return;
        }
        let Some(bytes) = engine.snapshot() else {
            return;
        };
        self.snapshot_bytes.set(bytes.len() as u64);
        self.staged_since_snapshot.set(0);
        let need = engine.snapshot_needs_from();
        drop(engine);
        let Some(this) = self.this.upgrade() else {
            return;
        };
        self.snapshotting.set(true);
        self.snapshot_ms.set(now);
        let large = bytes.len() as u64 > SNAPSHOT_SMALL_BYTES;
        runtime::spawn(async move {
            let written = this.write_snapshot(offset, bytes).await;
            if large {
                // Its buffer is freed: give the memory back now, not when the shard next works.
                crate::memory::release_freed_memory();
            }
            match written {
                Ok(true) => this.snapshot.set(Some((offset, need))),
                Ok(false) => {}
                Err(e) => tracing::warn!(
                    queue = this.queue_id,
                    partition = this.partition,
                    error = %e,
                    "snapshot failed; will retry"
                ),
            }
            this.snapshotting.set(false);
        });
    }

    async fn load(
        fs: &L::Env,
        dir: &Path,
        config: &PartitionConfig,
        log_config: &LogConfig,
    ) -> ServiceResult<(L, Partition, Option<(u64, u64)>)> {
        let log = L::open(fs, dir.to_path_buf(), log_config.clone()).await?;
        let (engine, mut at, snapshot) = match Self::restore_snapshot(config, &log).await {
            Some(p) => {
                let (offset, need) = (p.snapshot_offset(), p.snapshot_needs_from());
                (p, offset, Some((offset, need)))
            }
            None => (Partition::new(config.clone())?, log.start_offset(), None),
        };
        let engine = RefCell::new(engine);
        let end = log.end_offset();
        // Each read is issued before the batches of the one before are applied, so the disk
        // and the engine work at once (a replay is otherwise a read, then the CPU, in turn).
        let mut batches = if at < end {
            log.read(at, REPLAY_READ_BYTES).await?
        } else {
            Vec::new()
        };
        while !batches.is_empty() {
            let next_at = batches.last().map_or(at, |b| b.header.next_offset());
            let read_next = async {
                if next_at < end {
                    log.read(next_at, REPLAY_READ_BYTES).await.map(Some)
                } else {
                    Ok(None)
                }
            };
            let apply = async {
                // Let the runtime submit the read first (glommio submits at its ring polls,
                // which a task that computes without yielding holds back).
                sluice_storage::fs::yield_now().await;
                Self::replay_batches(&log, &engine, &batches, &mut at).await
            };
            let (next, applied) = futures::join!(read_next, apply);
            applied?;
            match next? {
                Some(b) => batches = b,
                None => break,
            }
        }
        let mut engine = engine.into_inner();
        engine
            .finish_replay(end)
            .map_err(|e| ServiceError::Internal(format!("replay of {}: {e}", dir.display())))?;
        engine.extend_leases(log.inherited_lease_margin_ms());
        Ok((log, engine, snapshot))
    }

    /// Applies `batches` (read from `*at` on) to the engine being replayed, moving `*at` past
    /// each.
    async fn replay_batches(
        log: &L,
        engine: &RefCell<Partition>,
        batches: &[ReadBatch],
        at: &mut u64,
    ) -> ServiceResult<()> {
        for b in batches {
            let h = &b.header;
            if h.is_control() {
                // A Raft no-op or membership entry: offsets without an engine record.
                if h.next_offset() > *at {
                    engine
                        .borrow_mut()
                        .step_over_control(h.base_offset.max(*at), h.next_offset())
                        .map_err(|e| {
                            ServiceError::Internal(format!(
                                "replay at offset {}: {e}",
                                h.base_offset
                            ))
                        })?;
                }
                *at = h.next_offset();
                continue;
            }
            for r in b.view().data_records() {
                let r = r.map_err(|e| ServiceError::Internal(format!("log record: {e}")))?;
                if r.offset < *at {
                    continue;
                }
                let rec = EngineRecord::decode_without_content(r.value).map_err(|e| {
                    ServiceError::Internal(format!("engine record at {}: {e}", r.offset))
                })?;
                // A record about a message the partition had loaded from its tail after the
                // state replay started from: load it here too first.
                loop {
                    let Some(from) = engine.borrow().load_needed_for(&rec) else {
                        break;
                    };
                    if Self::load_tail(log, engine, from).await?.is_none()
                        || engine.borrow().load_needed_for(&rec) == Some(from)
                    {
                        return Err(ServiceError::Internal(format!(
                            "replay at offset {}: the tail cannot be loaded from {from}",
                            r.offset
                        )));
                    }
                }
                engine.borrow_mut().replay_at(r.offset, &rec).map_err(|e| {
                    ServiceError::Internal(format!("replay at offset {}: {e}", r.offset))
                })?;
            }
            *at = b.header.next_offset();
        }
        Ok(())
    }

    /// After a failed commit the engine is ahead of the log: reopen the log (recovery decides
    /// what is on disk) and replay it.
    async fn rebuild(&self) -> ServiceResult<()> {
        tracing::warn!(
            queue = self.queue_id,
            partition = self.partition,
            "rebuilding partition from its log after a failed commit"
        );
        let config = self.config.borrow().clone();
        let (log, engine, snapshot) =
            Self::load(&self.fs, &self.dir, &config, &self.log_config).await?;
        self.snapshot.set(snapshot);
        self.generation.set(self.generation.get() + 1);
        self.loaded.borrow_mut().clear();
        self.sent.borrow_mut().clear();
        *self.log.borrow_mut() = Rc::new(log);
        *self.engine.borrow_mut() = engine;
        self.broken.set(false);
        self.ready.notify();
        self.appended.notify();
        self.rearm.notify();
        // A move started before the failure may not have been forwarded.
        self.forward_pending_moves().await
    }

    /// The current log (swapped when the partition rebuilds: take it per use).
    pub(crate) fn log(&self) -> Rc<L> {
        self.log.borrow().clone()
    }

    /// Runs one command: decide and apply, stage, wait until durable, then reply.
    pub async fn execute(&self, cmd: Command) -> ServiceResult<Reply> {
        if self.closed.get() {
            return Err(ServiceError::Unavailable("partition closed"));
        }
        if self.broken.get() {
            self.rebuild().await?;
        }
        self.load_for_command(&cmd).await?;
        let log = self.log();
        let estimate = match &cmd {
            Command::Send(s) => s.body.len() + 1024,
            Command::SendBatch(e) => e.iter().map(|e| e.request.body.len() + 1024).sum(),
            _ => 4096,
        };
        log.wait_for_space(estimate).await?;
        if self.broken.get() {
            return Err(ServiceError::Unavailable("partition is rebuilding"));
        }
        let wakes = matches!(
            cmd,
            Command::Send(_)
                | Command::SendBatch(_)
                | Command::ChangeVisibility { .. }
                | Command::ChangeVisibilityBatch(_)
                | Command::AcceptMove(_)
                | Command::SetAttributes(_)
        );
        // A delete may free the next message of a FIFO group for long polls parked meanwhile.
        let deletes = matches!(cmd, Command::Delete { .. } | Command::DeleteBatch(_));
        let now = self.clock.now_ms();
        let effects = self.engine.borrow_mut().execute(now, cmd)?;
        let ticket = self
            .stage_records(&log, &effects.records, effects.first_offset, now)
            .await?;
        // Staged is enough: nothing is handed out before a commit that covers these records,
        // and a failed one rebuilds the partition, which forgets what was kept.
        self.keep_sent(&effects.records, effects.first_offset);
        // Wake parked long polls now, not after the commit: a woken receive on this shard runs
        // before the commit starts (`Log::durable` lets ready tasks stage first) and its lease
        // joins the send's commit, so publish→receive costs one durable write, not two in a row.
        let wake_polls = self.waiters.get() > 0
            && (wakes || (deletes && self.engine.borrow().has_deliverable()));
        if wake_polls {
            self.ready.notify();
        }
        let commit = async {
            if let Some(t) = ticket {
                let staged = crate::runtime::monotonic_now();
                self.wait_committed(&log, t).await?;
                crate::metrics::record_durable_wait(staged.elapsed());
            }
            Ok::<_, ServiceError>(())
        };
        // The contents a reply hands out come from `Sent` records. When every one of them is
        // already committed (a backlog's), they are read while the command's own records
        // commit: a cold receive waits for the longer of its write and its reads, not both.
        // Otherwise (a message sent in this very group commit) they are read after it.
        let committed_end = log.end_offset();
        let read_now = content_offsets(&effects.reply, &effects.moves).all(|o| o < committed_end);
        let contents = if read_now {
            let (committed, contents) =
                futures::join!(commit, self.with_contents(effects.reply, effects.moves));
            committed?;
            contents
        } else {
            commit.await?;
            self.with_contents(effects.reply, effects.moves).await
        };
        self.rearm.notify();
        if wakes {
            self.appended.notify();
        }
        self.maybe_compact(now);
        let (reply, moves) = match contents {
            Ok(c) => c,
            Err(e) => {
                // The leases are durable: the messages come back when they expire. Moves the
                // engine started are forwarded again by the rebuild.
                self.broken.set(true);
                return Err(e);
            }
        };
        self.ops.count(&reply, moves.len(), now);
        for mv in moves {
            (self.moves)(mv);
        }
        Ok(reply)
    }

    /// Stages the engine's records as one batch, where the engine placed them (`first_offset`):
    /// synchronous up to the staging, so records reach the log in the order the engine applied
    /// them. `None` if there are none. On any failure the partition is marked broken (the engine
    /// is ahead of the log) and rebuilds before serving again.
    async fn stage_records(
        &self,
        log: &L,
        records: &[EngineRecord],
        first_offset: u64,
        now: u64,
    ) -> ServiceResult<Option<L::Ticket>> {
        if records.is_empty() {
            return Ok(None);
        }
        let batch = encode_records(records, now);
        self.staged_since_snapshot
            .set(self.staged_since_snapshot.get() + batch.len() as u64);
        match log.stage(batch) {
            Ok(Staged { info, ticket, .. }) if info.base_offset == first_offset => Ok(Some(ticket)),
            Ok(Staged { info, ticket, .. }) => {
                // The engine's offsets feed its compaction floor: they must be the log's.
                tracing::error!(
                    queue = self.queue_id,
                    partition = self.partition,
                    log = info.base_offset,
                    engine = first_offset,
                    "engine and log disagree on offsets; rebuilding"
                );
                self.broken.set(true);
                drop(log.committed(ticket).await);
                Err(ServiceError::Internal("partition offsets diverged".into()))
            }
            Err(e) => {
                self.broken.set(true);
                Err(e.into())
            }
        }
    }

    /// Waits until staged records are committed (durable here; with replication, on a quorum):
    /// only then may anything they decided be told. A failure marks the partition broken.
    async fn wait_committed(&self, log: &L, ticket: L::Ticket) -> ServiceResult<()> {
        if let Err(e) = log.committed(ticket).await {
            self.broken.set(true);
            return Err(e.into());
        }
        Ok(())
    }

    /// At most once per [`COMPACTION_INTERVAL_MS`], in the background: deletes the sealed
    /// segments wholly below the engine's compaction floor, so the space of deleted and expired
    /// messages comes back — except those with records younger than the queue's
    /// `StreamRetentionPeriod` (kept for readers of the queue as a stream). The floor is a checkpoint offset; only a durable one counts (below
    /// `end_offset`), so that a crash cannot leave a log that starts without its checkpoint.
    fn maybe_compact(&self, now: u64) {
        if self.compacting.get() || now < self.compacted_ms.get() + COMPACTION_INTERVAL_MS {
            return;
        }
        self.compacted_ms.set(now);
        let Some(this) = self.this.upgrade() else {
            return;
        };
        self.maybe_snapshot(now);
        let log = self.log();
        let mut floor = self.engine.borrow().compaction_floor();
        // What a restart from the newest snapshot reads stays too.
        if let Some((_, need)) = self.snapshot.get() {
            floor = floor.min(need);
        }
        // Stream readers of the queue keep what is younger than StreamRetentionPeriod: nothing
        // from the first segment holding a record that recent on is deleted.
        let keep_s = self.config.borrow().attributes.stream_retention_s;
        if keep_s > 0 {
            let cutoff = now.saturating_sub(u64::from(keep_s) * 1000) as i64;
            if let Some(young) = log
                .segments()
                .iter()
                .find(|s| s.max_timestamp_ms.is_none_or(|t| t >= cutoff))
            {
                floor = floor.min(young.base_offset);
            }
        }
        let first_sealed_end = log
            .segments()
            .first()
            .filter(|s| s.sealed)
            .map(|s| s.next_offset);
        if floor >= log.end_offset() || first_sealed_end.is_none_or(|end| end > floor) {
            return;
        }
        this.compacting.set(true);
        runtime::spawn(async move {
            match log.delete_segments_below(floor).await {
                Ok(out) if out.segments_deleted > 0 => tracing::debug!(
                    queue = this.queue_id,
                    partition = this.partition,
                    segments = out.segments_deleted,
                    bytes = out.bytes_deleted,
                    "compacted"
                ),
                Ok(_) => {}
                Err(e) => tracing::warn!(
                    queue = this.queue_id,
                    partition = this.partition,
                    error = %e,
                    "compaction failed; will retry"
                ),
            }
            this.compacting.set(false);
        });
    }

    /// Resolves true as soon as the partition may have a deliverable message, false at the
    /// deadline. Does not lease anything: the caller receives afterwards.
    pub async fn wait_ready(&self, deadline_ms: u64) -> ServiceResult<bool> {
        if self.waiters.get() >= WAITERS_PER_PARTITION_MAX {
            return Err(ServiceError::Throttled(
                "too many long polls parked on this partition",
            ));
        }
        self.waiters.set(self.waiters.get() + 1);
        let _guard = WaiterGuard(&self.waiters);
        loop {
            if self.closed.get() {
                return Ok(false);
            }
            if self.engine.borrow().has_deliverable() {
                return Ok(true);
            }
            if self.clock.now_ms() >= deadline_ms {
                return Ok(false);
            }
            self.ready.listen_until_on(&self.clock, deadline_ms).await;
        }
    }

    /// Waits until records next become durable (a send, among others) or the deadline,
    /// whatever is deliverable now: for readers of the log as a stream
    /// (`crate::stream::queue_view`), which must not spin while messages sit visible.
    pub(crate) async fn wait_notified(&self, deadline_ms: u64) -> ServiceResult<bool> {
        if self.waiters.get() >= WAITERS_PER_PARTITION_MAX {
            return Err(ServiceError::Throttled(
                "too many long polls parked on this partition",
            ));
        }
        self.waiters.set(self.waiters.get() + 1);
        let _guard = WaiterGuard(&self.waiters);
        Ok(self
            .appended
            .listen_until_on(&self.clock, deadline_ms)
            .await)
    }

    pub fn counters(&self) -> Counters {
        self.engine.borrow().counters()
    }

    /// This partition as a metrics scrape sees it.
    pub fn metrics(&self) -> crate::metrics::PartitionSnapshot {
        let log = self.log();
        crate::metrics::PartitionSnapshot {
            queue_id: self.queue_id,
            partition: self.partition,
            counters: self.counters(),
            oldest_age_ms: self
                .engine
                .borrow()
                .oldest_arrival_ms()
                .map(|at| self.clock.now_ms().saturating_sub(at)),
            ops: self.ops.snapshot(),
            log: log.stats(),
            segments: log.segments().len() as u64,
            size_bytes: log.size_bytes(),
        }
    }

    pub fn set_config(&self, config: PartitionConfig) {
        *self.config.borrow_mut() = config;
    }

    /// Stops serving and the timer; commits what is staged and closes the log.
    pub async fn close(&self) -> ServiceResult<()> {
        self.closed.set(true);
        self.rearm.notify();
        self.ready.notify();
        self.appended.notify();
        self.log().close().await?;
        // A clean stop leaves a snapshot at the log's end: the next start replays nothing.
        // (After the one being written, if any: both use the same temporary file.)
        for _ in 0..1000 {
            if !self.snapshotting.get() {
                break;
            }
            let until = self.clock.now_ms() + 5;
            self.clock.sleep_until_ms(until).await;
        }
        if self.snapshotting.get() {
            return Ok(());
        }
        let last = self.snapshot.get().map_or(0, |s| s.0);
        let (offset, bytes) = {
            let engine = self.engine.borrow();
            let offset = engine.snapshot_offset();
            let due = !self.broken.get() && offset > last && offset == self.log().end_offset();
            (offset, due.then(|| engine.snapshot()).flatten())
        };
        if let Some(bytes) = bytes {
            if let Err(e) = self.write_snapshot(offset, bytes).await {
                tracing::warn!(
                    queue = self.queue_id,
                    partition = self.partition,
                    error = %e,
                    "snapshot at close failed; the next start replays the log"
                );
            }
        }
        Ok(())
    }

    /// Stops serving and the timer at once, committing nothing: the process is gone (a
    /// simulated power loss; the test then reopens the partition on what the disk kept). A
    /// cluster halts a partition whose replica stopped leading: its engine may hold effects
    /// that never committed, so it is rebuilt from the committed log before serving again.
    pub fn halt(&self) {
        self.closed.set(true);
        self.rearm.notify();
        self.ready.notify();
        self.appended.notify();
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Fires the engine's timers (lease expiry, delay end, retention, dedup windows) when due.
    async fn timer_loop(this: Rc<PartitionActor<L, C>>) {
        loop {
            if this.closed.get() {
                return;
            }
            let next = this.engine.borrow().next_deadline_ms();
            match next {
                Some(d) if d > this.clock.now_ms() => {
                    this.rearm.listen_until_on(&this.clock, d).await;
                }
                Some(_) => {}
                None => {
                    this.rearm.listen().await;
                }
            }
            if this.closed.get() {
                return;
            }
            if this.broken.get() {
                // The next request rebuilds the partition; don't spin meanwhile.
                let until = this.clock.now_ms() + 10;
                this.clock.sleep_until_ms(until).await;
                continue;
            }
            let now = this.clock.now_ms();
            if this
                .engine
                .borrow()
                .next_deadline_ms()
                .is_none_or(|d| d > now)
            {
                continue;
            }
            let log = this.log();
            if log.wait_for_space(4096).await.is_err() {
                this.broken.set(true);
                continue;
            }
            let effects = this.engine.borrow_mut().tick(now);
            // Failures mark the partition broken; the next request rebuilds it.
            if let Ok(Some(t)) = this
                .stage_records(&log, &effects.records, effects.first_offset, now)
                .await
            {
                let _ = this.wait_committed(&log, t).await;
            }
            // Tail messages may have expired: read past them so their space comes back.
            this.read_ahead();
            this.maybe_compact(now);
            if !effects.moves.is_empty() {
                match this.with_contents(Reply::None, effects.moves).await {
                    Ok((_, moves)) => moves.into_iter().for_each(|mv| (this.moves)(mv)),
                    Err(_) => this.broken.set(true),
                }
            }
            this.ready.notify();
            this.appended.notify();
            if this
                .engine
                .borrow()
                .next_deadline_ms()
                .is_some_and(|d| d <= now)
            {
                // A deadline the tick did not clear: never spin on it.
                let until = this.clock.now_ms() + 1;
                this.clock.sleep_until_ms(until).await;
            }
        }
    }
}

struct WaiterGuard<'a>(&'a Cell<usize>);

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

#[cfg(test)]
mod tests {
    use super::{
        plan_content_reads, snapshot_due, ContentRead, KeptContents, SnapshotPace,
        CONTENT_READ_BYTES, CONTENT_READ_GAP_RECORDS, SNAPSHOT_INTERVAL_MS,
        SNAPSHOT_INTERVAL_RECORDS, SNAPSHOT_SMALL_BYTES,
    };
    use crate::engine::record::Payload;
    use std::sync::Arc;

    #[test]
    fn kept_contents_stay_within_their_bytes_and_are_handed_out_once() {
        let content = |n: usize| Arc::new(Payload::new("x".repeat(n), Vec::new(), None, None));
        let mut kept = KeptContents::new(1000);
        kept.keep(10, content(400));
        kept.keep(11, content(400));
        assert_eq!(kept.bytes, 800);
        // A third goes over the budget: the oldest offset makes room.
        kept.keep(12, content(400));
        assert_eq!(kept.bytes, 800);
        assert!(kept.take(10).is_none());
        // Taken once: a second delivery reads the log.
        assert_eq!(kept.take(11).map(|p| p.body.len()), Some(400));
        assert!(kept.take(11).is_none());
        assert_eq!(kept.bytes, 400);
        // Kept again at the same offset (a load after a rebuild): counted once.
        kept.keep(12, content(300));
        assert_eq!(kept.bytes, 300);
        // One content larger than the budget is not kept at all.
        kept.keep(13, content(2000));
        assert_eq!((kept.bytes, kept.by_offset.len()), (0, 0));
        kept.keep(14, content(10));
        kept.clear();
        assert_eq!((kept.bytes, kept.take(14)), (0, None));
    }

    #[test]
    fn a_large_snapshot_waits_for_twice_its_bytes_of_log() {
        let quiet = SnapshotPace {
            records_since: 0,
            ms_since: 0,
            holds_back: false,
            last_bytes: 0,
            log_bytes_since: 0,
        };
        // Small (or no) last snapshot: the record and time rules alone.
        assert!(!snapshot_due(quiet));
        let busy = SnapshotPace {
            records_since: SNAPSHOT_INTERVAL_RECORDS,
            ..quiet
        };
        assert!(snapshot_due(busy));
        assert!(snapshot_due(SnapshotPace {
            records_since: 1,
            ms_since: SNAPSHOT_INTERVAL_MS,
            ..quiet
        }));
        assert!(snapshot_due(SnapshotPace {
            records_since: 1,
            holds_back: true,
            ..quiet
        }));
        assert!(!snapshot_due(SnapshotPace {
            records_since: 0,
            ms_since: SNAPSHOT_INTERVAL_MS,
            holds_back: true,
            ..quiet
        }));
        // A 130 MB last snapshot (a FIFO backlog's dedup table): no rule fires before 260 MB of
        // log, every rule may after.
        let large = 130 << 20;
        for pace in [
            busy,
            SnapshotPace {
                records_since: 1,
                ms_since: 10 * SNAPSHOT_INTERVAL_MS,
                holds_back: true,
                ..quiet
            },
        ] {
            let with = |log| SnapshotPace {
                last_bytes: large,
                log_bytes_since: log,
                ..pace
            };
            assert!(!snapshot_due(with(0)));
            assert!(!snapshot_due(with(2 * large - 1)));
            assert!(snapshot_due(with(2 * large)));
        }
        // The line is the last snapshot's size, not the state's.
        assert!(snapshot_due(SnapshotPace {
            last_bytes: SNAPSHOT_SMALL_BYTES,
            ..busy
        }));
        assert!(!snapshot_due(SnapshotPace {
            last_bytes: SNAPSHOT_SMALL_BYTES + 1,
            ..busy
        }));
    }

    #[test]
    fn content_reads_are_planned_one_per_cluster_of_near_offsets() {
        let gap = CONTENT_READ_GAP_RECORDS;
        let want: Vec<(u64, usize)> = [10, 11, 10 + gap - 1, 10 + gap, 10 + 3 * gap, 10 + 5 * gap]
            .into_iter()
            .enumerate()
            .map(|(i, o)| (o, i))
            .collect();
        let dense = |from| ContentRead {
            from,
            max_bytes: CONTENT_READ_BYTES,
            one_batch: false,
        };
        let alone = |from| ContentRead {
            from,
            max_bytes: 1,
            one_batch: true,
        };
        assert_eq!(
            plan_content_reads(&want),
            vec![
                dense(10),
                alone(10 + gap),
                alone(10 + 3 * gap),
                alone(10 + 5 * gap)
            ]
        );
        assert!(plan_content_reads(&[]).is_empty());
    }
}
