//! One topic partition on its owning shard: a segment log, the event that wakes long-polling
//! fetches after an append, the retention timer, and the floor below which records were
//! deleted on request (Kafka's DeleteRecords: the log start offset moves up at once, whole
//! segments below it go from the disk).

use super::readahead::{Answer, ReadAhead};
use super::txn_index::{TxnControl, TxnIndex, CONTROL_BATCH_BYTES_MAX};
use super::{FetchReply, StreamError, StreamResult};
use crate::partition_log::{LocalLog, PartitionLog};
use crate::runtime::{self, Clock, Event, WallClock};
use sluice_storage::fs::DmaFs;
use sluice_storage::{AppendInfo, BatchView, LogConfig, SegmentInfo};
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::rc::Rc;

/// Long-polling fetches parked on one partition at once; more are answered `Throttled`.
pub const FETCH_WAITERS_PER_PARTITION_MAX: usize = 10_000;
/// Retention looks at each partition this often.
pub const RETENTION_INTERVAL_MS: u64 = 500;
/// Idempotent producers remembered per partition; beyond it the least recently seen is
/// forgotten (its next batch is taken as a new producer's).
pub const PRODUCERS_PER_PARTITION_MAX: usize = 1_000;
/// Batches remembered per producer to answer a retry with its first offsets (Kafka's
/// `max.in.flight.requests.per.connection` is at most 5 with idempotence).
pub const PRODUCER_BATCHES_REMEMBERED: usize = 5;

/// The version of the partition's snapshot (`PartitionLog::write_snapshot`): the floor below
/// which records were deleted on request; v2 adds `txn_seen`. v1 is still read (no
/// transactions). A build that reads only v1 refuses v2: it would show aborted records.
const FLOOR_SNAPSHOT_VERSION: u32 = 2;
const FLOOR_SNAPSHOT_VERSIONS_READ: [u32; 2] = [1, 2];

#[derive(serde::Serialize, serde::Deserialize)]
struct FloorSnapshot {
    v: u32,
    /// Records below this offset were deleted (DeleteRecords): never served again.
    deleted_below: u64,
    /// The log holds transaction control records (`txn_index`): its index is rebuilt by
    /// reading the log at open. Partitions that never saw a transaction skip that read.
    #[serde(default)]
    txn_seen: bool,
}

/// A transactional write waits this long between looks while another writes `txn_seen`.
const TXN_SEEN_POLL_MS: u64 = 1;
/// Bytes read at a time when the transaction index is rebuilt at open.
const TXN_REPLAY_READ_BYTES: usize = 1 << 20;

/// What a fetch may see: Kafka's isolation levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// Everything committed to the log, open and aborted transactions' records too (Kafka's
    /// read_uncommitted).
    Uncommitted,
    /// Nothing at or past the last stable offset, no aborted transaction's record: Kafka's
    /// read_committed, and every non-Kafka reader (native protocol).
    Committed,
}

/// Retention limits, changeable while the partition is open (AlterConfigs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetentionLimits {
    pub retention_ms: Option<u64>,
    pub retention_bytes: Option<u64>,
}

/// The offset below which whole sealed segments are past `limits` at `now_ms` (the storage's
/// rule, `Log::enforce_retention`, with limits read here so that they can change): segments
/// go from the front while they are sealed, not the last one, and past the age (their newest
/// record older than `retention_ms`) or the size (the rest still at least `retention_bytes`).
pub fn retention_cut(segments: &[SegmentInfo], now_ms: i64, limits: RetentionLimits) -> u64 {
    let mut total: u64 = segments.iter().map(|s| s.size_bytes).sum();
    let mut cut = segments.first().map_or(0, |s| s.base_offset);
    for (i, s) in segments.iter().enumerate() {
        if i + 1 == segments.len() || !s.sealed {
            break;
        }
        let by_time = limits.retention_ms.is_some_and(|r| {
            s.max_timestamp_ms
                .is_none_or(|m| m < now_ms.saturating_sub(r as i64))
        });
        let by_size = limits
            .retention_bytes
            .is_some_and(|r| total - s.size_bytes >= r);
        if !(by_time || by_size) {
            break;
        }
        total -= s.size_bytes;
        cut = s.next_offset;
    }
    cut
}

/// An idempotent producer's batch: who sent it and its sequence numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerBatch {
    pub producer_id: i64,
    pub epoch: i16,
    pub first_sequence: i32,
    pub last_sequence: i32,
}

/// What the partition remembers of one producer (memory only: see `produce_idempotent`).
#[derive(Debug, Clone)]
struct ProducerState {
    epoch: i16,
    last_seen_ms: u64,
    /// (first sequence, last sequence, where it went), newest last.
    batches: VecDeque<(i32, i32, AppendInfo)>,
}

/// Generic over its log (the seam: `LocalLog` on one node, a replicated log in a cluster) and
/// its clock (retention and producer ages read time there: the wall clock in a broker, virtual
/// time in a simulation).
pub struct TopicPartition<L: PartitionLog = LocalLog<DmaFs>, C: Clock = WallClock> {
    pub topic_id: u64,
    pub partition: u32,
    pub dir: PathBuf,
    log: Rc<L>,
    clock: C,
    appended: Event,
    waiters: Cell<usize>,
    closed: Rc<Cell<bool>>,
    producers: RefCell<HashMap<i64, ProducerState>>,
    /// What lagging consumers will fetch next, read while their last answer is sent.
    readahead: ReadAhead,
    /// Records below this were deleted on request (persisted in the log's snapshot).
    floor: Cell<u64>,
    retention: Rc<Cell<RetentionLimits>>,
    /// Kafka transactions in this partition (`txn_index`), rebuilt from the log at open.
    txn: RefCell<TxnIndex>,
    /// The snapshot says the log holds transaction records (`FloorSnapshot::txn_seen`).
    txn_seen: Cell<bool>,
    txn_seen_writing: Cell<bool>,
}

impl TopicPartition {
    /// A partition on this node's disk and the wall clock.
    pub async fn open(
        fs: DmaFs,
        dir: PathBuf,
        topic_id: u64,
        partition: u32,
        log_config: LogConfig,
    ) -> StreamResult<Rc<TopicPartition>> {
        Self::open_on(&fs, WallClock, dir, topic_id, partition, log_config).await
    }
}

impl<L: PartitionLog, C: Clock> TopicPartition<L, C> {
    /// A partition over any log and clock; retention runs on `clock`'s time.
    pub async fn open_on(
        env: &L::Env,
        clock: C,
        dir: PathBuf,
        topic_id: u64,
        partition: u32,
        log_config: LogConfig,
    ) -> StreamResult<Rc<TopicPartition<L, C>>> {
        let log = Rc::new(L::open(env, dir.clone(), log_config).await?);
        let (floor, txn_seen) = match log.read_snapshot().await? {
            None => (0, false),
            Some(b) => {
                let f: FloorSnapshot = serde_json::from_slice(&b)
                    .map_err(|e| StreamError::Internal(format!("partition snapshot: {e}")))?;
                if !FLOOR_SNAPSHOT_VERSIONS_READ.contains(&f.v) {
                    return Err(StreamError::Internal(format!(
                        "partition snapshot version {} (this build reads {FLOOR_SNAPSHOT_VERSIONS_READ:?})",
                        f.v
                    )));
                }
                // Never past what the log holds (a floor is written only at or below its end).
                (f.deleted_below.min(log.end_offset()), f.txn_seen)
            }
        };
        let mut txn = TxnIndex::default();
        if txn_seen {
            let mut at = log.start_offset();
            while at < log.end_offset() {
                for b in log.read(at, TXN_REPLAY_READ_BYTES).await? {
                    txn.apply(&b.view())?;
                    at = b.header.next_offset();
                }
            }
        }
        let retention = Rc::new(Cell::new(RetentionLimits {
            retention_ms: log.config().retention_ms,
            retention_bytes: log.config().retention_bytes,
        }));
        let closed = Rc::new(Cell::new(false));
        let tp = Rc::new(TopicPartition {
            topic_id,
            partition,
            dir,
            log: log.clone(),
            clock: clock.clone(),
            appended: Event::default(),
            waiters: Cell::new(0),
            closed: closed.clone(),
            producers: RefCell::new(HashMap::new()),
            readahead: ReadAhead::default(),
            floor: Cell::new(floor),
            retention: retention.clone(),
            txn: RefCell::new(txn),
            txn_seen: Cell::new(txn_seen),
            txn_seen_writing: Cell::new(false),
        });
        {
            // Always running: AlterConfigs may set limits on a topic created without them.
            runtime::spawn(async move {
                while !closed.get() {
                    let next_ms = clock.now_ms() + RETENTION_INTERVAL_MS;
                    clock.sleep_until_ms(next_ms).await;
                    if closed.get() {
                        break;
                    }
                    let limits = retention.get();
                    if limits == RetentionLimits::default() {
                        continue;
                    }
                    let cut = retention_cut(&log.segments(), clock.now_ms() as i64, limits);
                    match log.delete_segments_below(cut).await {
                        Ok(o) if o.segments_deleted > 0 => tracing::debug!(
                            topic = topic_id,
                            partition,
                            segments = o.segments_deleted,
                            start = o.new_start_offset,
                            "retention"
                        ),
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!(topic = topic_id, partition, error = %e, "retention")
                        }
                    }
                }
            });
        }
        Ok(tp)
    }

    /// New retention limits, applied from the next retention round on.
    pub fn set_retention(&self, limits: RetentionLimits) {
        self.retention.set(limits);
    }

    /// The first offset served: the log's start, or the floor DeleteRecords set above it.
    fn start_offset(&self) -> u64 {
        self.log.start_offset().max(self.floor.get())
    }

    /// Kafka's DeleteRecords: records below `offset` (the end when `None`) are deleted — never
    /// served again, durably (the floor is in the log's snapshot before this returns), and
    /// the whole segments below it leave the disk. Returns the new first offset (Kafka's low
    /// watermark). An offset past the end is out of range.
    pub async fn delete_records(&self, offset: Option<u64>) -> StreamResult<u64> {
        if self.closed.get() {
            return Err(StreamError::Unavailable("partition closed".into()));
        }
        let (start, end) = (self.start_offset(), self.log.end_offset());
        let target = offset.unwrap_or(end);
        if target > end {
            return Err(StreamError::OffsetOutOfRange {
                offset: target,
                start,
                end,
            });
        }
        if target <= start {
            return Ok(start);
        }
        self.write_floor_snapshot(target).await?;
        // Floors only rise: two deletions racing over the await keep the higher one.
        self.floor.set(self.floor.get().max(target));
        self.log.delete_segments_below(self.floor.get()).await?;
        self.txn.borrow_mut().forget_below(self.start_offset());
        Ok(self.start_offset())
    }

    async fn write_floor_snapshot(&self, deleted_below: u64) -> StreamResult<()> {
        let snapshot = FloorSnapshot {
            v: FLOOR_SNAPSHOT_VERSION,
            deleted_below,
            txn_seen: self.txn_seen.get(),
        };
        let bytes = serde_json::to_vec(&snapshot)
            .map_err(|e| StreamError::Internal(format!("partition snapshot: {e}")))?;
        self.log.write_snapshot(bytes).await?;
        Ok(())
    }

    /// The bytes this partition's log holds (its segments).
    pub fn size_bytes(&self) -> u64 {
        self.log.size_bytes()
    }

    /// Appends a producer's batch as it is (verified by the log: checksum and record
    /// structure); resolves after its fdatasync, with the offsets it got.
    pub async fn produce(&self, batch: Vec<u8>) -> StreamResult<AppendInfo> {
        if self.closed.get() {
            return Err(StreamError::Unavailable("partition closed".into()));
        }
        let view =
            BatchView::parse(&batch).map_err(|e| StreamError::InvalidBatch(e.to_string()))?;
        if view.header.is_control() {
            return Err(StreamError::InvalidBatch(
                "producers may not write control batches".into(),
            ));
        }
        let info = self.log.append(batch).await?;
        self.appended.notify();
        Ok(info)
    }

    /// Appends a batch from an idempotent producer at most once: a retry of one of its last
    /// [`PRODUCER_BATCHES_REMEMBERED`] batches gets the offsets the first one got, a gap in
    /// the sequence is refused, a stale epoch is fenced. The state is memory only: after a
    /// restart (or once a producer is forgotten) its next batch is accepted whatever its
    /// sequence, so a retry that crosses a restart may be stored twice (ARCHITECTURE.md).
    /// Batches of one producer on one partition must not overlap in time (the Kafka front
    /// end answers one request of a connection at a time, as Kafka does).
    pub async fn produce_idempotent(
        &self,
        batch: Vec<u8>,
        producer: ProducerBatch,
    ) -> StreamResult<AppendInfo> {
        self.produce_sequenced(batch, producer, false).await
    }

    /// A transactional producer's batch: sequenced as [`Self::produce_idempotent`], fenced by
    /// the epoch of the newest marker too, and written after a `data` control record that puts
    /// it in the producer's open transaction (`txn_index`): read_committed readers see it only
    /// once a commit marker follows.
    pub async fn produce_transactional(
        &self,
        batch: Vec<u8>,
        producer: ProducerBatch,
    ) -> StreamResult<AppendInfo> {
        self.txn
            .borrow()
            .check_epoch(producer.producer_id, producer.epoch)?;
        self.produce_sequenced(batch, producer, true).await
    }

    async fn produce_sequenced(
        &self,
        batch: Vec<u8>,
        producer: ProducerBatch,
        transactional: bool,
    ) -> StreamResult<AppendInfo> {
        let now = self.clock.now_ms();
        {
            let producers = self.producers.borrow();
            if let Some(st) = producers.get(&producer.producer_id) {
                if producer.epoch < st.epoch {
                    return Err(StreamError::ProducerFenced(format!(
                        "epoch {} is older than {}",
                        producer.epoch, st.epoch
                    )));
                }
                if producer.epoch == st.epoch {
                    if let Some((_, _, info)) = st.batches.iter().find(|(f, l, _)| {
                        *f == producer.first_sequence && *l == producer.last_sequence
                    }) {
                        return Ok(*info);
                    }
                    let last = st.batches.back().map_or(-1, |(_, l, _)| *l);
                    if producer.first_sequence != last.wrapping_add(1) & i32::MAX {
                        return Err(StreamError::OutOfOrderSequence(format!(
                            "expected sequence {}, got {}",
                            last.wrapping_add(1) & i32::MAX,
                            producer.first_sequence
                        )));
                    }
                }
            }
        }
        let info = if transactional {
            self.produce_in_txn(batch, producer).await?
        } else {
            self.produce(batch).await?
        };
        let mut producers = self.producers.borrow_mut();
        if !producers.contains_key(&producer.producer_id)
            && producers.len() >= PRODUCERS_PER_PARTITION_MAX
        {
            let oldest = producers
                .iter()
                .min_by_key(|(_, s)| s.last_seen_ms)
                .map(|(id, _)| *id);
            if let Some(id) = oldest {
                producers.remove(&id);
            }
        }
        let st = producers
            .entry(producer.producer_id)
            .or_insert_with(|| ProducerState {
                epoch: producer.epoch,
                last_seen_ms: now,
                batches: VecDeque::new(),
            });
        if st.epoch != producer.epoch {
            st.epoch = producer.epoch;
            st.batches.clear();
        }
        st.last_seen_ms = now;
        st.batches
            .push_back((producer.first_sequence, producer.last_sequence, info));
        while st.batches.len() > PRODUCER_BATCHES_REMEMBERED {
            st.batches.pop_front();
        }
        Ok(info)
    }

    /// The transaction records go to the log only once the snapshot says the log holds some
    /// (so that the index is rebuilt at the next open): the first transactional write of a
    /// partition writes it, the others wait for it.
    async fn ensure_txn_seen(&self) -> StreamResult<()> {
        while !self.txn_seen.get() {
            if self.txn_seen_writing.get() {
                runtime::sleep(std::time::Duration::from_millis(TXN_SEEN_POLL_MS)).await;
                continue;
            }
            self.txn_seen_writing.set(true);
            self.txn_seen.set(true);
            let written = self.write_floor_snapshot(self.floor.get()).await;
            self.txn_seen_writing.set(false);
            if let Err(e) = written {
                self.txn_seen.set(false);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Stages the `data` control record and the batch with no await in between (adjacent in
    /// the log), claims the batch for the producer's open transaction, and waits for both.
    async fn produce_in_txn(
        &self,
        batch: Vec<u8>,
        producer: ProducerBatch,
    ) -> StreamResult<AppendInfo> {
        if self.closed.get() {
            return Err(StreamError::Unavailable("partition closed".into()));
        }
        let checksum = {
            let view =
                BatchView::parse(&batch).map_err(|e| StreamError::InvalidBatch(e.to_string()))?;
            if view.header.is_control() {
                return Err(StreamError::InvalidBatch(
                    "producers may not write control batches".into(),
                ));
            }
            view.header.checksum
        };
        self.ensure_txn_seen().await?;
        self.log
            .wait_for_space(batch.len() + CONTROL_BATCH_BYTES_MAX)
            .await?;
        // Again after the awaits: a marker (a fence, a timeout) may have come meanwhile.
        self.txn
            .borrow()
            .check_epoch(producer.producer_id, producer.epoch)?;
        let control = TxnControl::Data {
            producer_id: producer.producer_id,
            epoch: producer.epoch,
            checksum,
        }
        .to_batch(self.clock.now_ms() as i64);
        let c = self.log.stage(control)?;
        let d = self.log.stage(batch)?;
        self.txn.borrow_mut().claim(
            producer.producer_id,
            producer.epoch,
            c.info.base_offset,
            d.info.base_offset,
            d.info.last_offset,
        );
        let info = self.log.committed(d.ticket).await?;
        self.appended.notify();
        Ok(info)
    }

    /// Ends `producer_id`'s transaction here with a commit or abort marker (the transaction
    /// coordinator's call). `epoch` is the coordinator's: above the producer's after a fence
    /// or a timeout, so the producer's later batches are refused. With nothing open here no
    /// marker is written (the epoch is still remembered). Returns the marker's offset.
    pub async fn write_marker(
        &self,
        producer_id: i64,
        epoch: i16,
        commit: bool,
    ) -> StreamResult<Option<u64>> {
        if self.closed.get() {
            return Err(StreamError::Unavailable("partition closed".into()));
        }
        if !self.txn.borrow().is_open(producer_id) {
            self.txn.borrow_mut().raise_epoch(producer_id, epoch);
            return Ok(None);
        }
        self.log.wait_for_space(CONTROL_BATCH_BYTES_MAX).await?;
        let marker = TxnControl::Marker {
            producer_id,
            epoch,
            commit,
        }
        .to_batch(self.clock.now_ms() as i64);
        let staged = self.log.stage(marker)?;
        self.txn
            .borrow_mut()
            .end(producer_id, epoch, commit, staged.info.base_offset);
        let info = self.log.committed(staged.ticket).await?;
        self.appended.notify();
        Ok(Some(info.base_offset))
    }

    /// Kafka's last stable offset (`txn_index`).
    pub fn last_stable_offset(&self) -> u64 {
        self.txn.borrow().last_stable_offset(self.log.end_offset())
    }

    /// Whole batches from `offset` on (the first one may start before it), up to about
    /// `max_bytes` and `max_records`; waits until `deadline_ms` for data if there is none.
    /// Read committed: what every non-Kafka reader gets.
    pub async fn fetch(
        &self,
        offset: u64,
        max_bytes: usize,
        max_records: u32,
        deadline_ms: u64,
    ) -> StreamResult<FetchReply> {
        self.fetch_isolated(
            offset,
            max_bytes,
            max_records,
            deadline_ms,
            Isolation::Committed,
        )
        .await
    }

    /// [`Self::fetch`] at an isolation level. Read committed, nothing at or past the last
    /// stable offset is returned (a fetch there waits as at the end) and no aborted batch;
    /// the answer names the aborted transactions in its range (Kafka's index).
    pub async fn fetch_isolated(
        &self,
        offset: u64,
        max_bytes: usize,
        max_records: u32,
        deadline_ms: u64,
        isolation: Isolation,
    ) -> StreamResult<FetchReply> {
        loop {
            if self.closed.get() {
                return Err(StreamError::Unavailable("partition closed".into()));
            }
            let (start, end) = (self.start_offset(), self.log.end_offset());
            if offset < start || offset > end {
                return Err(StreamError::OffsetOutOfRange { offset, start, end });
            }
            let visible = match isolation {
                Isolation::Uncommitted => end,
                Isolation::Committed => self.last_stable_offset(),
            };
            if offset < visible {
                let mut at = offset;
                loop {
                    let read = match self.readahead.take(at, max_bytes).await {
                        Some(read) => read,
                        None => self.log.read(at, max_bytes).await?,
                    };
                    let mut answer = Answer::cut(read, at, max_records);
                    // A full answer: the consumer is behind, and will ask for `next` next.
                    if let Some(ahead) = answer.read_ahead_bytes(max_records, max_bytes) {
                        if answer.next < self.log.end_offset() && !self.closed.get() {
                            self.readahead.start(self.log.clone(), answer.next, ahead);
                        }
                    }
                    if isolation == Isolation::Committed {
                        let txn = self.txn.borrow();
                        answer.batches.retain(|b| {
                            sluice_storage::BatchHeader::parse(b).is_ok_and(|h| {
                                h.base_offset < visible
                                    && (h.is_control() || !txn.is_aborted(h.base_offset))
                            })
                        });
                    }
                    // Everything read was hidden (aborted): read on, up to what is visible.
                    if answer.batches.is_empty() && answer.next > at && answer.next < visible {
                        at = answer.next;
                        continue;
                    }
                    let aborted = match isolation {
                        Isolation::Uncommitted => Vec::new(),
                        Isolation::Committed => self
                            .txn
                            .borrow()
                            .aborted_in(offset, answer.next.max(offset + 1))
                            .into_iter()
                            .map(|a| (a.producer_id, a.first_offset))
                            .collect(),
                    };
                    return Ok(FetchReply {
                        batches: answer.batches,
                        start_offset: self.start_offset(),
                        end_offset: self.log.end_offset(),
                        last_stable_offset: self.last_stable_offset(),
                        aborted,
                    });
                }
            }
            if runtime::now_ms() >= deadline_ms {
                return Ok(FetchReply {
                    batches: Vec::new(),
                    start_offset: start,
                    end_offset: end,
                    last_stable_offset: self.last_stable_offset(),
                    aborted: Vec::new(),
                });
            }
            if self.waiters.get() >= FETCH_WAITERS_PER_PARTITION_MAX {
                return Err(StreamError::Throttled(
                    "too many fetches waiting on a partition",
                ));
            }
            self.waiters.set(self.waiters.get() + 1);
            self.appended.listen_until(deadline_ms).await;
            self.waiters.set(self.waiters.get() - 1);
        }
    }

    pub fn offsets(&self) -> (u64, u64) {
        (self.start_offset(), self.log.end_offset())
    }

    pub async fn offset_for_timestamp(&self, ts_ms: i64) -> StreamResult<u64> {
        Ok(self
            .log
            .offset_for_timestamp(ts_ms)
            .await?
            .unwrap_or_else(|| self.log.end_offset())
            .max(self.start_offset()))
    }

    pub fn segment_count(&self) -> usize {
        self.log.segments().len()
    }

    pub async fn close(&self) -> StreamResult<()> {
        self.closed.set(true);
        self.readahead.clear();
        self.appended.notify();
        self.log.close().await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::SimClock;
    use sluice_storage::fs::SimFs;
    use sluice_storage::BatchBuilder;

    /// Records stamped in 2100: the wall clock will not pass their retention for decades.
    const T0_MS: u64 = 4_102_444_800_000;
    const RETENTION_MS: u64 = 60_000;

    fn batch(ts_ms: u64, value_bytes: usize) -> Vec<u8> {
        let mut b = BatchBuilder::new();
        b.push_parts(
            ts_ms as i64,
            None,
            &vec![7u8; value_bytes],
            std::iter::empty(),
        );
        b.finish().expect("one record")
    }

    /// Retention reads time from the partition's clock (the seam), not from the system clock:
    /// on virtual time, sealed segments go once the clock passes their records' retention, and
    /// not before. Reading the wall clock instead, nothing would ever be deleted here.
    #[test]
    fn topic_retention_runs_on_the_partitions_clock() {
        sluice_storage::rt::run("topic-retention-clock", || async {
            let fs = SimFs::new();
            let clock = SimClock::new(T0_MS);
            let config = LogConfig {
                segment_bytes_max: 16 * 1024,
                prealloc_chunk_bytes: 16 * 1024,
                batch_bytes_max: 8 * 1024,
                write_buffer_bytes_max: 64 * 1024,
                retention_ms: Some(RETENTION_MS),
                ..LogConfig::default()
            };
            let tp: Rc<TopicPartition<LocalLog<SimFs>, SimClock>> =
                TopicPartition::open_on(&fs, clock.clone(), PathBuf::from("/t/p0"), 1, 0, config)
                    .await
                    .expect("open");
            for i in 0..40u64 {
                tp.produce(batch(T0_MS + i, 2_000)).await.expect("produce");
            }
            let segments = tp.segment_count();
            assert!(segments > 2, "the test needs sealed segments: {segments}");
            let (start, _) = tp.offsets();
            // Within retention: a few timer rounds change nothing.
            for step in 1..=4 {
                clock.advance_to(T0_MS + step * RETENTION_INTERVAL_MS);
                runtime::sleep(std::time::Duration::from_millis(5)).await;
            }
            assert_eq!(tp.offsets().0, start, "deleted within retention");
            // Past it: the next round deletes every sealed segment.
            let past = T0_MS + 40 + RETENTION_MS + 1;
            for step in 1..=4 {
                clock.advance_to(past + step * RETENTION_INTERVAL_MS);
                runtime::sleep(std::time::Duration::from_millis(5)).await;
            }
            assert!(
                tp.offsets().0 > start,
                "retention did not run on the partition's clock: start still {start}"
            );
            assert_eq!(tp.segment_count(), 1, "only the active segment is left");
            tp.close().await.expect("close");
        })
        .expect("executor");
    }

    /// DeleteRecords: the floor moves up at once, survives a reopen (the log's snapshot),
    /// fetches below it are out of range, and an offset past the end is refused.
    #[test]
    fn deleted_records_stay_deleted_across_a_reopen() {
        sluice_storage::rt::run("topic-delete-records", || async {
            let fs = SimFs::new();
            let clock = SimClock::new(T0_MS);
            let dir = PathBuf::from("/t/p0");
            let open = || {
                TopicPartition::<LocalLog<SimFs>, SimClock>::open_on(
                    &fs,
                    clock.clone(),
                    dir.clone(),
                    1,
                    0,
                    LogConfig::default(),
                )
            };
            let tp = open().await.expect("open");
            for i in 0..10u64 {
                tp.produce(batch(T0_MS + i, 10)).await.expect("produce");
            }
            assert!(matches!(
                tp.delete_records(Some(11)).await,
                Err(StreamError::OffsetOutOfRange { .. })
            ));
            assert_eq!(tp.delete_records(Some(4)).await.expect("delete"), 4);
            // Lower than the floor: nothing moves back.
            assert_eq!(tp.delete_records(Some(2)).await.expect("delete"), 4);
            assert_eq!(tp.offsets(), (4, 10));
            assert!(matches!(
                tp.fetch(3, 1 << 20, 100, 0).await,
                Err(StreamError::OffsetOutOfRange { start: 4, .. })
            ));
            tp.close().await.expect("close");
            let tp = open().await.expect("reopen");
            assert_eq!(tp.offsets(), (4, 10), "the floor did not survive a reopen");
            assert_eq!(tp.offset_for_timestamp(0).await.expect("ts"), 4);
            // -1 (None): everything up to the end.
            assert_eq!(tp.delete_records(None).await.expect("delete"), 10);
            tp.close().await.expect("close");
        })
        .expect("executor");
    }

    /// Retention limits set while the partition is open (AlterConfigs) are enforced from the
    /// next round on, for a partition opened without any.
    #[test]
    fn retention_set_while_open_is_enforced() {
        sluice_storage::rt::run("topic-retention-set", || async {
            let fs = SimFs::new();
            let clock = SimClock::new(T0_MS);
            let config = LogConfig {
                segment_bytes_max: 16 * 1024,
                prealloc_chunk_bytes: 16 * 1024,
                batch_bytes_max: 8 * 1024,
                write_buffer_bytes_max: 64 * 1024,
                ..LogConfig::default()
            };
            let tp: Rc<TopicPartition<LocalLog<SimFs>, SimClock>> =
                TopicPartition::open_on(&fs, clock.clone(), PathBuf::from("/t/p1"), 1, 0, config)
                    .await
                    .expect("open");
            for i in 0..40u64 {
                tp.produce(batch(T0_MS + i, 2_000)).await.expect("produce");
            }
            assert!(tp.segment_count() > 2);
            let past = T0_MS + 40 + RETENTION_MS + 1;
            for step in 1..=3 {
                clock.advance_to(past + step * RETENTION_INTERVAL_MS);
                runtime::sleep(std::time::Duration::from_millis(5)).await;
            }
            assert!(tp.segment_count() > 2, "deleted with no retention set");
            tp.set_retention(RetentionLimits {
                retention_ms: Some(RETENTION_MS),
                retention_bytes: None,
            });
            for step in 4..=7 {
                clock.advance_to(past + step * RETENTION_INTERVAL_MS);
                runtime::sleep(std::time::Duration::from_millis(5)).await;
            }
            assert_eq!(tp.segment_count(), 1, "the new retention was not enforced");
            tp.close().await.expect("close");
        })
        .expect("executor");
    }
}
