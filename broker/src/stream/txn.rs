//! Kafka's transaction coordinator on shard 0: transactional ids with producer ids and epochs
//! (a new InitProducerId fences the older producer), the partitions and groups a transaction
//! touches, its offsets held until it commits, commit and abort (markers written to every
//! partition, `txn_index`), and the timeout: an open transaction older than its
//! `transaction.timeout.ms` on the coordinator's clock is aborted with the epoch bumped, so a
//! hung producer cannot hold the last stable offset back for ever.
//!
//! ## The transactions log (`<data>/txns/`), record format version 1
//!
//! One JSON record per change of a transactional id (data records, one per batch), the whole
//! state restated each time, so replay keeps the last record of each id:
//!
//! ```text
//! {"v":1, "txn_id":"<tenant>/<id>", "producer_id":i64, "epoch":i16, "timeout_ms":u64,
//!  "state":"Empty"|"Ongoing"|"PrepareCommit"|"PrepareAbort"|"CompleteCommit"|"CompleteAbort",
//!  "started_ms":u64, "partitions":[["<tenant>/<topic>",p],..], "groups":["<tenant>/<group>",..],
//!  "offsets":[["<tenant>/<group>","<tenant>/<topic>",p,offset],..]}
//! ```
//!
//! A decided transaction (`Prepare*`, durable before any marker) is completed again after a
//! restart or a failed marker write (the timer retries); a second marker for the same
//! transaction changes nothing in a partition. After [`RESTATE_EVERY_RECORDS`] records every
//! id is restated at the end and the segments wholly below are deleted, so the log stays
//! bounded by the number of ids.

use super::group::TopicPartition;
use super::{StreamError, StreamOp, StreamReply, StreamResult};
use crate::partition_log::{LocalLog, PartitionLog};
use crate::runtime::{Clock, WallClock};
use crate::shard::Shard;
use futures::future::LocalBoxFuture;
use serde::{Deserialize, Serialize};
use sluice_storage::fs::DmaFs;
use sluice_storage::BatchBuilder;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::rc::{Rc, Weak};

/// The version of the transactions log's records.
pub const TXN_RECORD_VERSION: u32 = 1;
/// Open transactions are checked against their timeout this often.
pub const TXN_TIMEOUT_CHECK_INTERVAL_MS: u64 = 100;
/// The longest `transaction.timeout.ms` taken (Kafka's `transaction.max.timeout.ms` default).
pub const TXN_TIMEOUT_MS_MAX: u64 = 900_000;
/// Transactional ids one coordinator keeps; InitProducerId for a new one beyond it is refused.
pub const TXN_IDS_MAX: usize = 100_000;
/// Partitions and groups one transaction may touch.
pub const TXN_PARTITIONS_MAX: usize = 10_000;
/// Records after which the log is restated (module doc).
pub const RESTATE_EVERY_RECORDS: usize = 10_000;
/// Ids per restatement batch.
const RESTATE_RECORDS_PER_BATCH: usize = 1_000;
const REPLAY_READ_BYTES: usize = 1 << 20;
/// Kafka's epochs are i16: a producer id whose epoch would pass this gets a new id.
const EPOCH_MAX: i16 = i16::MAX - 1;

/// Kafka's error codes the coordinator answers with.
pub mod txn_code {
    pub const INVALID_PRODUCER_EPOCH: i16 = 47;
    pub const INVALID_TXN_STATE: i16 = 48;
    pub const INVALID_PRODUCER_ID_MAPPING: i16 = 49;
    pub const INVALID_TRANSACTION_TIMEOUT: i16 = 50;
    pub const CONCURRENT_TRANSACTIONS: i16 = 51;
    pub const POLICY_VIOLATION: i16 = 44;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnState {
    Empty,
    Ongoing,
    PrepareCommit,
    PrepareAbort,
    CompleteCommit,
    CompleteAbort,
}

/// One transactional id's state: also its record in the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnRecord {
    pub v: u32,
    pub txn_id: String,
    pub producer_id: i64,
    pub epoch: i16,
    pub timeout_ms: u64,
    pub state: TxnState,
    pub started_ms: u64,
    pub partitions: Vec<(String, u32)>,
    pub groups: Vec<String>,
    pub offsets: Vec<(String, String, u32, u64)>,
}

impl TxnRecord {
    fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a transaction record serializes")
    }

    fn decode(b: &[u8]) -> StreamResult<TxnRecord> {
        let r: TxnRecord = serde_json::from_slice(b)
            .map_err(|e| StreamError::Internal(format!("transactions log: {e}")))?;
        if r.v != TXN_RECORD_VERSION {
            return Err(StreamError::Internal(format!(
                "transactions log record version {} (this build reads {TXN_RECORD_VERSION})",
                r.v
            )));
        }
        Ok(r)
    }
}

/// A coordinator request, names qualified (`tenant/name`).
#[derive(Debug, Clone)]
pub enum TxnRequest {
    InitProducerId {
        txn_id: String,
        timeout_ms: i64,
        /// KIP-360: the producer's current id and epoch (-1 when it has none).
        producer_id: i64,
        epoch: i16,
    },
    AddPartitions {
        txn_id: String,
        producer_id: i64,
        epoch: i16,
        partitions: Vec<(String, u32)>,
    },
    AddOffsets {
        txn_id: String,
        producer_id: i64,
        epoch: i16,
        group: String,
    },
    OffsetCommit {
        txn_id: String,
        producer_id: i64,
        epoch: i16,
        group: String,
        offsets: Vec<(TopicPartition, u64)>,
    },
    End {
        txn_id: String,
        producer_id: i64,
        epoch: i16,
        commit: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnAnswer {
    Producer { producer_id: i64, epoch: i16 },
    Done,
}

/// What the coordinator writes elsewhere: markers to topic partitions (wherever they live)
/// and a committed transaction's offsets to the groups log.
pub trait TxnSink {
    fn write_marker(
        &self,
        topic: String,
        partition: u32,
        producer_id: i64,
        epoch: i16,
        commit: bool,
    ) -> LocalBoxFuture<'static, StreamResult<()>>;
    fn commit_offsets(
        &self,
        group: String,
        offsets: Vec<(TopicPartition, u64)>,
    ) -> LocalBoxFuture<'static, StreamResult<()>>;
}

/// Generic over its log (the seam) and its clock (timeouts read time there).
pub struct TxnCoordinator<L: PartitionLog = LocalLog<DmaFs>, C: Clock = WallClock> {
    log: Rc<L>,
    clock: C,
    sink: Rc<dyn TxnSink>,
    txns: RefCell<BTreeMap<String, TxnRecord>>,
    /// Ids whose decided transaction a task is completing now.
    completing: RefCell<HashSet<String>>,
    last_producer_id: Cell<i64>,
    records_since_restate: Cell<usize>,
    restating: Cell<bool>,
    closed: Rc<Cell<bool>>,
}

fn txn_log_config() -> sluice_storage::LogConfig {
    const MIB: u64 = 1024 * 1024;
    sluice_storage::LogConfig {
        segment_bytes_max: 4 * MIB,
        ..crate::config::meta_log_config()
    }
}

impl TxnCoordinator {
    pub async fn open(
        fs: DmaFs,
        dir: PathBuf,
        sink: Rc<dyn TxnSink>,
    ) -> StreamResult<Rc<TxnCoordinator>> {
        Self::open_on(&fs, WallClock, dir, sink, txn_log_config()).await
    }
}

impl<L: PartitionLog, C: Clock> TxnCoordinator<L, C> {
    /// Opens the transactions log, replays it, and starts the timer (timeouts, and decided
    /// transactions left incomplete).
    pub async fn open_on(
        env: &L::Env,
        clock: C,
        dir: PathBuf,
        sink: Rc<dyn TxnSink>,
        log_config: sluice_storage::LogConfig,
    ) -> StreamResult<Rc<TxnCoordinator<L, C>>> {
        let log = L::open(env, dir, log_config).await?;
        let mut txns = BTreeMap::new();
        let mut last_pid = 0i64;
        let mut at = log.start_offset();
        while at < log.end_offset() {
            for b in log.read(at, REPLAY_READ_BYTES).await? {
                for r in b.view().data_records() {
                    let r = r.map_err(|e| StreamError::Internal(e.to_string()))?;
                    let rec = TxnRecord::decode(r.value)?;
                    last_pid = last_pid.max(rec.producer_id);
                    txns.insert(rec.txn_id.clone(), rec);
                }
                at = b.header.next_offset();
            }
        }
        let closed = Rc::new(Cell::new(false));
        let c = Rc::new(TxnCoordinator {
            log: Rc::new(log),
            clock: clock.clone(),
            sink,
            txns: RefCell::new(txns),
            completing: RefCell::new(HashSet::new()),
            last_producer_id: Cell::new(last_pid),
            records_since_restate: Cell::new(0),
            restating: Cell::new(false),
            closed: closed.clone(),
        });
        let weak = Rc::downgrade(&c);
        crate::runtime::spawn(async move {
            while !closed.get() {
                let next = clock.now_ms() + TXN_TIMEOUT_CHECK_INTERVAL_MS;
                clock.sleep_until_ms(next).await;
                let Some(c) = weak.upgrade() else { break };
                if closed.get() {
                    break;
                }
                c.tick().await;
            }
        });
        Ok(c)
    }

    /// Aborts what timed out and completes what was decided but not completed.
    async fn tick(self: &Rc<Self>) {
        let now = self.clock.now_ms();
        let due: Vec<(String, TxnState)> = self
            .txns
            .borrow()
            .values()
            .filter(|t| {
                (t.state == TxnState::Ongoing && now >= t.started_ms.saturating_add(t.timeout_ms))
                    || matches!(t.state, TxnState::PrepareCommit | TxnState::PrepareAbort)
            })
            .map(|t| (t.txn_id.clone(), t.state))
            .collect();
        for (id, state) in due {
            if self.completing.borrow().contains(&id) {
                continue;
            }
            let r = if state == TxnState::Ongoing {
                tracing::info!(txn = %id, "transaction timed out: aborting it");
                self.abort_fencing(&id).await
            } else {
                self.complete(&id).await
            };
            if let Err(e) = r {
                tracing::warn!(txn = %id, error = %e, "completing a transaction (retried)");
            }
        }
    }

    /// A producer id no other producer had: the clock in ms with `0xFF` in the shard byte
    /// (`kafka::handlers` hands out idempotent producers' ids with their shard there), above
    /// every id in the log.
    fn new_producer_id(&self) -> i64 {
        let candidate = ((self.clock.now_ms() as i64) << 16) | (0xFF << 8);
        let id = candidate.max(self.last_producer_id.get() + 1);
        self.last_producer_id.set(id);
        id
    }

    /// Writes the record and applies it (no await in between), then waits for the commit.
    async fn persist(&self, rec: TxnRecord) -> StreamResult<()> {
        let bytes = rec.encode();
        self.log.wait_for_space(bytes.len() + 4096).await?;
        let mut b = BatchBuilder::new();
        b.push_parts(self.clock.now_ms() as i64, None, &bytes, std::iter::empty());
        let staged = self.log.stage(b.finish().expect("one record"))?;
        self.txns.borrow_mut().insert(rec.txn_id.clone(), rec);
        self.log.committed(staged.ticket).await?;
        self.records_since_restate
            .set(self.records_since_restate.get() + 1);
        if self.records_since_restate.get() >= RESTATE_EVERY_RECORDS && !self.restating.get() {
            self.restating.set(true);
            let r = self.restate().await;
            self.restating.set(false);
            if let Err(e) = r {
                tracing::warn!(error = %e, "restating the transactions log");
            }
        }
        Ok(())
    }

    /// Every id's record again at the end of the log (staged with no await in between), then
    /// the segments wholly below the restatement go.
    async fn restate(&self) -> StreamResult<()> {
        let all: Vec<TxnRecord> = self.txns.borrow().values().cloned().collect();
        self.log.wait_for_space(all.len() * 512 + 4096).await?;
        let all: Vec<TxnRecord> = self.txns.borrow().values().cloned().collect();
        let now = self.clock.now_ms() as i64;
        let mut first = None;
        let mut last = None;
        for chunk in all.chunks(RESTATE_RECORDS_PER_BATCH) {
            let mut b = BatchBuilder::new();
            for r in chunk {
                b.push_parts(now, None, &r.encode(), std::iter::empty());
            }
            let staged = self.log.stage(b.finish().expect("records"))?;
            first.get_or_insert(staged.info.base_offset);
            last = Some(staged.ticket);
        }
        self.records_since_restate.set(0);
        if let (Some(first), Some(ticket)) = (first, last) {
            self.log.committed(ticket).await?;
            self.log.delete_segments_below(first).await?;
        }
        Ok(())
    }

    fn entry(&self, id: &str) -> Option<TxnRecord> {
        self.txns.borrow().get(id).cloned()
    }

    /// The producer's id and epoch must be the id's current ones: an older epoch was fenced.
    fn check(&self, id: &str, producer_id: i64, epoch: i16) -> Result<TxnRecord, i16> {
        let e = self
            .entry(id)
            .ok_or(txn_code::INVALID_PRODUCER_ID_MAPPING)?;
        if e.producer_id != producer_id {
            return Err(txn_code::INVALID_PRODUCER_ID_MAPPING);
        }
        if e.epoch != epoch {
            return Err(txn_code::INVALID_PRODUCER_EPOCH);
        }
        Ok(e)
    }

    /// Serves one request; `Ok(Err(code))` is Kafka's answer to a refused one (nothing
    /// changed), `Err` a storage failure.
    pub async fn handle(self: &Rc<Self>, req: TxnRequest) -> StreamResult<Result<TxnAnswer, i16>> {
        if self.closed.get() {
            return Err(StreamError::Unavailable(
                "transaction coordinator closed".into(),
            ));
        }
        match req {
            TxnRequest::InitProducerId {
                txn_id,
                timeout_ms,
                producer_id,
                epoch,
            } => {
                self.init_producer(txn_id, timeout_ms, producer_id, epoch)
                    .await
            }
            TxnRequest::AddPartitions {
                txn_id,
                producer_id,
                epoch,
                partitions,
            } => {
                self.add(&txn_id, producer_id, epoch, |e| {
                    for p in partitions {
                        if !e.partitions.contains(&p) {
                            e.partitions.push(p);
                        }
                    }
                })
                .await
            }
            TxnRequest::AddOffsets {
                txn_id,
                producer_id,
                epoch,
                group,
            } => {
                self.add(&txn_id, producer_id, epoch, |e| {
                    if !e.groups.contains(&group) {
                        e.groups.push(group);
                    }
                })
                .await
            }
            TxnRequest::OffsetCommit {
                txn_id,
                producer_id,
                epoch,
                group,
                offsets,
            } => {
                let e = match self.check(&txn_id, producer_id, epoch) {
                    Ok(e) => e,
                    Err(c) => return Ok(Err(c)),
                };
                // The group must have been added (AddOffsetsToTxn) in this transaction.
                if e.state != TxnState::Ongoing || !e.groups.contains(&group) {
                    return Ok(Err(txn_code::INVALID_TXN_STATE));
                }
                let mut e = e;
                for ((topic, p), o) in offsets {
                    e.offsets
                        .retain(|(g, t, q, _)| !(*g == group && *t == topic && *q == p));
                    e.offsets.push((group.clone(), topic, p, o));
                }
                if e.offsets.len() > TXN_PARTITIONS_MAX {
                    return Ok(Err(txn_code::POLICY_VIOLATION));
                }
                self.persist(e).await?;
                Ok(Ok(TxnAnswer::Done))
            }
            TxnRequest::End {
                txn_id,
                producer_id,
                epoch,
                commit,
            } => self.end(&txn_id, producer_id, epoch, commit).await,
        }
    }

    async fn init_producer(
        self: &Rc<Self>,
        txn_id: String,
        timeout_ms: i64,
        producer_id: i64,
        epoch: i16,
    ) -> StreamResult<Result<TxnAnswer, i16>> {
        let Some(timeout_ms) = u64::try_from(timeout_ms)
            .ok()
            .filter(|t| (1..=TXN_TIMEOUT_MS_MAX).contains(t))
        else {
            return Ok(Err(txn_code::INVALID_TRANSACTION_TIMEOUT));
        };
        let existing = self.entry(&txn_id);
        let rec = match existing {
            None => {
                if self.txns.borrow().len() >= TXN_IDS_MAX {
                    return Ok(Err(txn_code::POLICY_VIOLATION));
                }
                TxnRecord {
                    v: TXN_RECORD_VERSION,
                    txn_id: txn_id.clone(),
                    producer_id: self.new_producer_id(),
                    epoch: 0,
                    timeout_ms,
                    state: TxnState::Empty,
                    started_ms: 0,
                    partitions: Vec::new(),
                    groups: Vec::new(),
                    offsets: Vec::new(),
                }
            }
            Some(e) => {
                if producer_id >= 0 && (producer_id != e.producer_id || epoch != e.epoch) {
                    // KIP-360: a producer naming an id and epoch that are no longer current.
                    return Ok(Err(txn_code::INVALID_PRODUCER_EPOCH));
                }
                match e.state {
                    TxnState::PrepareCommit | TxnState::PrepareAbort => {
                        return Ok(Err(txn_code::CONCURRENT_TRANSACTIONS))
                    }
                    TxnState::Ongoing => {
                        // The previous producer's open transaction is aborted, in an epoch
                        // above its own: its later writes are fenced everywhere.
                        if let Err(err) = self.abort_fencing(&txn_id).await {
                            tracing::warn!(txn = %txn_id, error = %err, "aborting a fenced producer's transaction");
                            return Ok(Err(txn_code::CONCURRENT_TRANSACTIONS));
                        }
                    }
                    _ => {}
                }
                let Some(mut e) = self.entry(&txn_id) else {
                    return Ok(Err(txn_code::CONCURRENT_TRANSACTIONS));
                };
                if matches!(e.state, TxnState::PrepareCommit | TxnState::PrepareAbort) {
                    return Ok(Err(txn_code::CONCURRENT_TRANSACTIONS));
                }
                if e.epoch >= EPOCH_MAX {
                    e.producer_id = self.new_producer_id();
                    e.epoch = 0;
                } else {
                    e.epoch += 1;
                }
                e.timeout_ms = timeout_ms;
                e.state = TxnState::Empty;
                e.partitions.clear();
                e.groups.clear();
                e.offsets.clear();
                e
            }
        };
        let answer = TxnAnswer::Producer {
            producer_id: rec.producer_id,
            epoch: rec.epoch,
        };
        self.persist(rec).await?;
        Ok(Ok(answer))
    }

    /// AddPartitionsToTxn and AddOffsetsToTxn: the first addition begins the transaction
    /// (its timeout runs from here).
    async fn add(
        &self,
        txn_id: &str,
        producer_id: i64,
        epoch: i16,
        change: impl FnOnce(&mut TxnRecord),
    ) -> StreamResult<Result<TxnAnswer, i16>> {
        let mut e = match self.check(txn_id, producer_id, epoch) {
            Ok(e) => e,
            Err(c) => return Ok(Err(c)),
        };
        match e.state {
            TxnState::PrepareCommit | TxnState::PrepareAbort => {
                return Ok(Err(txn_code::CONCURRENT_TRANSACTIONS))
            }
            TxnState::Ongoing => {}
            TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort => {
                e.state = TxnState::Ongoing;
                e.started_ms = self.clock.now_ms();
                e.partitions.clear();
                e.groups.clear();
                e.offsets.clear();
            }
        }
        let before = e.clone();
        change(&mut e);
        if e.partitions.len() + e.groups.len() > TXN_PARTITIONS_MAX {
            return Ok(Err(txn_code::POLICY_VIOLATION));
        }
        if e != before || self.entry(txn_id).as_ref() != Some(&e) {
            self.persist(e).await?;
        }
        Ok(Ok(TxnAnswer::Done))
    }

    async fn end(
        self: &Rc<Self>,
        txn_id: &str,
        producer_id: i64,
        epoch: i16,
        commit: bool,
    ) -> StreamResult<Result<TxnAnswer, i16>> {
        let mut e = match self.check(txn_id, producer_id, epoch) {
            Ok(e) => e,
            Err(c) => return Ok(Err(c)),
        };
        match (e.state, commit) {
            (TxnState::Ongoing, _) => {}
            // Nothing was added: nothing to end.
            (TxnState::Empty, _) => return Ok(Ok(TxnAnswer::Done)),
            // A retry of what was done.
            (TxnState::CompleteCommit, true) | (TxnState::CompleteAbort, false) => {
                return Ok(Ok(TxnAnswer::Done))
            }
            (TxnState::PrepareCommit, true) | (TxnState::PrepareAbort, false) => {
                return Ok(Err(txn_code::CONCURRENT_TRANSACTIONS))
            }
            _ => return Ok(Err(txn_code::INVALID_TXN_STATE)),
        }
        e.state = if commit {
            TxnState::PrepareCommit
        } else {
            TxnState::PrepareAbort
        };
        // Decided once this is durable: completed now, or by the timer after a failure.
        self.persist(e).await?;
        if let Err(err) = self.complete(txn_id).await {
            tracing::warn!(txn = %txn_id, error = %err, "completing a transaction (the timer retries)");
        }
        Ok(Ok(TxnAnswer::Done))
    }

    /// Aborts the id's open transaction in the next epoch (a timeout, or a new producer of
    /// the id): its producer's later requests and batches are fenced.
    async fn abort_fencing(self: &Rc<Self>, txn_id: &str) -> StreamResult<()> {
        let Some(mut e) = self.entry(txn_id) else {
            return Ok(());
        };
        if e.state != TxnState::Ongoing {
            return Ok(());
        }
        // With no epoch left to fence in, the abort keeps the epoch (the id gets a new
        // producer id at its next InitProducerId).
        if e.epoch < EPOCH_MAX {
            e.epoch += 1;
        }
        e.state = TxnState::PrepareAbort;
        self.persist(e).await?;
        self.complete(txn_id).await
    }

    /// Writes the decided transaction's markers (and, committed, its offsets), then records
    /// it complete. One task at a time per id.
    async fn complete(&self, txn_id: &str) -> StreamResult<()> {
        if !self.completing.borrow_mut().insert(txn_id.to_string()) {
            return Ok(());
        }
        let r = self.complete_now(txn_id).await;
        self.completing.borrow_mut().remove(txn_id);
        r
    }

    async fn complete_now(&self, txn_id: &str) -> StreamResult<()> {
        let Some(mut e) = self.entry(txn_id) else {
            return Ok(());
        };
        let commit = match e.state {
            TxnState::PrepareCommit => true,
            TxnState::PrepareAbort => false,
            _ => return Ok(()),
        };
        let markers = e.partitions.iter().map(|(t, p)| {
            self.sink
                .write_marker(t.clone(), *p, e.producer_id, e.epoch, commit)
        });
        for r in futures::future::join_all(markers).await {
            r?;
        }
        if commit {
            for g in &e.groups {
                let offsets: Vec<(TopicPartition, u64)> = e
                    .offsets
                    .iter()
                    .filter(|(og, _, _, _)| og == g)
                    .map(|(_, t, p, o)| ((t.clone(), *p), *o))
                    .collect();
                if !offsets.is_empty() {
                    self.sink.commit_offsets(g.clone(), offsets).await?;
                }
            }
        }
        e.state = if commit {
            TxnState::CompleteCommit
        } else {
            TxnState::CompleteAbort
        };
        e.partitions.clear();
        e.groups.clear();
        e.offsets.clear();
        self.persist(e).await
    }

    /// The id's state (tests and the admin view).
    pub fn state_of(&self, txn_id: &str) -> Option<TxnRecord> {
        self.entry(txn_id)
    }

    pub async fn close(&self) {
        self.closed.set(true);
        let _ = self.log.close().await;
    }
}

// ---------------------------------------------------------------------------- on the shards

/// What one shard asks another about transactions (`StreamOp::Txn`).
#[derive(Debug)]
pub enum TxnOp {
    /// To shard 0's coordinator.
    Coordinator(TxnRequest),
    /// To a partition's owner: a transactional producer's batch.
    Produce {
        topic_id: u64,
        partition: u32,
        batch: Vec<u8>,
        producer: super::ProducerBatch,
    },
    /// To a partition's owner: a commit or abort marker.
    Marker {
        topic_id: u64,
        partition: u32,
        producer_id: i64,
        epoch: i16,
        commit: bool,
    },
    /// To a partition's owner: a fetch at an isolation level.
    Fetch {
        topic_id: u64,
        partition: u32,
        offset: u64,
        max_bytes: usize,
        max_records: u32,
        deadline_ms: u64,
        isolation: super::partition::Isolation,
    },
    /// To a partition's owner: its last stable offset.
    LastStable { topic_id: u64, partition: u32 },
}

/// The coordinator's answer crossing the mesh (`StreamReply::Txn`).
pub type TxnReply = Result<TxnAnswer, i16>;

/// The broker's sink: markers go to the partitions' owners over the mesh, offsets to the
/// groups log on this shard (0).
struct ShardSink {
    shard: Weak<Shard>,
}

impl TxnSink for ShardSink {
    fn write_marker(
        &self,
        topic: String,
        partition: u32,
        producer_id: i64,
        epoch: i16,
        commit: bool,
    ) -> LocalBoxFuture<'static, StreamResult<()>> {
        let shard = self.shard.clone();
        Box::pin(async move {
            let s = shard
                .upgrade()
                .ok_or(StreamError::Unavailable("shutting down".into()))?;
            let Some((tenant, name)) = topic.split_once('/') else {
                return Ok(());
            };
            let Ok(t) = s.streams.catalog.borrow().lookup(tenant, name) else {
                // The topic was deleted: nothing left to mark.
                return Ok(());
            };
            if partition >= t.partitions() {
                return Ok(());
            }
            let op = StreamOp::Txn(TxnOp::Marker {
                topic_id: t.id,
                partition,
                producer_id,
                epoch,
                commit,
            });
            s.stream_request(s.owner(t.id, partition), op).await?;
            Ok(())
        })
    }

    fn commit_offsets(
        &self,
        group: String,
        offsets: Vec<(TopicPartition, u64)>,
    ) -> LocalBoxFuture<'static, StreamResult<()>> {
        let shard = self.shard.clone();
        Box::pin(async move {
            let s = shard
                .upgrade()
                .ok_or(StreamError::Unavailable("shutting down".into()))?;
            s.coordinator()?.txn_commit(&group, &offsets).await
        })
    }
}

fn qualify(tenant: &str, name: &str) -> String {
    super::qualify(tenant, name)
}

impl Shard {
    /// On shard 0 at start, after the group coordinator: opens the transaction coordinator.
    pub(crate) async fn txn_start(&self) -> StreamResult<()> {
        if self.id != 0 {
            return Ok(());
        }
        let c = TxnCoordinator::open(
            self.fs().clone(),
            self.config.data_dir.join("txns"),
            Rc::new(ShardSink { shard: self.weak() }),
        )
        .await?;
        *self.streams.txn.borrow_mut() = Some(c);
        Ok(())
    }

    pub(crate) async fn txn_shutdown(&self) {
        let c = self.streams.txn.borrow_mut().take();
        if let Some(c) = c {
            c.close().await;
        }
    }

    /// Serves `StreamOp::Txn` on this shard.
    pub(crate) async fn txn_handle(&self, op: TxnOp) -> StreamResult<StreamReply> {
        match op {
            TxnOp::Coordinator(req) => {
                let c = self
                    .streams
                    .txn
                    .borrow()
                    .clone()
                    .ok_or(StreamError::Unavailable(
                        "no transaction coordinator here".into(),
                    ))?;
                Ok(StreamReply::Txn(c.handle(req).await?))
            }
            TxnOp::Produce {
                topic_id,
                partition,
                batch,
                producer,
            } => Ok(StreamReply::Produced(
                self.local_partition(topic_id, partition)?
                    .produce_transactional(batch, producer)
                    .await?,
            )),
            TxnOp::Marker {
                topic_id,
                partition,
                producer_id,
                epoch,
                commit,
            } => {
                self.local_partition(topic_id, partition)?
                    .write_marker(producer_id, epoch, commit)
                    .await?;
                Ok(StreamReply::Done)
            }
            TxnOp::Fetch {
                topic_id,
                partition,
                offset,
                max_bytes,
                max_records,
                deadline_ms,
                isolation,
            } => Ok(StreamReply::Fetched(
                self.local_partition(topic_id, partition)?
                    .fetch_isolated(offset, max_bytes, max_records, deadline_ms, isolation)
                    .await?,
            )),
            TxnOp::LastStable {
                topic_id,
                partition,
            } => Ok(StreamReply::Offset(
                self.local_partition(topic_id, partition)?
                    .last_stable_offset(),
            )),
        }
    }

    /// A transaction coordinator request in `tenant`: `Ok(Err(code))` is Kafka's refusal.
    pub async fn txn_request(&self, tenant: &str, req: TxnRequest) -> StreamResult<TxnReply> {
        let q = |n: &str| qualify(tenant, n);
        let req = match req {
            TxnRequest::InitProducerId {
                txn_id,
                timeout_ms,
                producer_id,
                epoch,
            } => TxnRequest::InitProducerId {
                txn_id: q(&txn_id),
                timeout_ms,
                producer_id,
                epoch,
            },
            TxnRequest::AddPartitions {
                txn_id,
                producer_id,
                epoch,
                partitions,
            } => TxnRequest::AddPartitions {
                txn_id: q(&txn_id),
                producer_id,
                epoch,
                partitions: partitions.into_iter().map(|(t, p)| (q(&t), p)).collect(),
            },
            TxnRequest::AddOffsets {
                txn_id,
                producer_id,
                epoch,
                group,
            } => TxnRequest::AddOffsets {
                txn_id: q(&txn_id),
                producer_id,
                epoch,
                group: Self::group_key(tenant, &group)?,
            },
            TxnRequest::OffsetCommit {
                txn_id,
                producer_id,
                epoch,
                group,
                offsets,
            } => TxnRequest::OffsetCommit {
                txn_id: q(&txn_id),
                producer_id,
                epoch,
                group: Self::group_key(tenant, &group)?,
                offsets: offsets
                    .into_iter()
                    .map(|((t, p), o)| ((q(&t), p), o))
                    .collect(),
            },
            TxnRequest::End {
                txn_id,
                producer_id,
                epoch,
                commit,
            } => TxnRequest::End {
                txn_id: q(&txn_id),
                producer_id,
                epoch,
                commit,
            },
        };
        match self
            .group_request(StreamOp::Txn(TxnOp::Coordinator(req)))
            .await?
        {
            StreamReply::Txn(r) => Ok(r),
            other => Err(StreamError::Internal(format!("unexpected {other:?}"))),
        }
    }

    /// A transactional producer's batch to its partition (the checks of `produce_as`).
    pub async fn produce_transactional(
        &self,
        t: &super::TopicMeta,
        partition: u32,
        batch: Vec<u8>,
        producer: super::ProducerBatch,
    ) -> StreamResult<super::Produced> {
        self.check_stream_ready()?;
        self.disk.check(crate::runtime::now_ms())?;
        self.check_stored_bytes(&t.tenant).await?;
        Self::check_partition(t, partition)?;
        let op = StreamOp::Txn(TxnOp::Produce {
            topic_id: t.id,
            partition,
            batch,
            producer,
        });
        match self.stream_request(self.owner(t.id, partition), op).await? {
            StreamReply::Produced(i) => Ok(super::Produced {
                partition,
                base_offset: i.base_offset,
                last_offset: i.last_offset,
            }),
            other => Err(StreamError::Internal(format!("unexpected {other:?}"))),
        }
    }

    /// [`Shard::fetch`] at an isolation level (Kafka's read_uncommitted sees open and
    /// aborted transactions' records; everything else reads committed).
    pub async fn fetch_isolated(
        &self,
        t: &super::TopicMeta,
        partition: u32,
        req: super::FetchRequest,
        isolation: super::partition::Isolation,
    ) -> StreamResult<super::FetchReply> {
        self.check_stream_ready()?;
        Self::check_partition(t, partition)?;
        let op = StreamOp::Txn(TxnOp::Fetch {
            topic_id: t.id,
            partition,
            offset: req.offset,
            max_bytes: req.max_bytes.clamp(1, super::FETCH_BYTES_MAX),
            max_records: req.max_records.max(1),
            deadline_ms: crate::runtime::now_ms() + req.wait_ms.min(super::FETCH_WAIT_MS_MAX),
            isolation,
        });
        match self.stream_request(self.owner(t.id, partition), op).await? {
            StreamReply::Fetched(f) => Ok(f),
            other => Err(StreamError::Internal(format!("unexpected {other:?}"))),
        }
    }

    /// A partition's last stable offset.
    pub async fn last_stable_offset(
        &self,
        t: &super::TopicMeta,
        partition: u32,
    ) -> StreamResult<u64> {
        self.check_stream_ready()?;
        Self::check_partition(t, partition)?;
        let op = StreamOp::Txn(TxnOp::LastStable {
            topic_id: t.id,
            partition,
        });
        match self.stream_request(self.owner(t.id, partition), op).await? {
            StreamReply::Offset(o) => Ok(o),
            other => Err(StreamError::Internal(format!("unexpected {other:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{self, SimClock};
    use crate::stream::partition::{Isolation, TopicPartition as Partition};
    use crate::stream::ProducerBatch;
    use sluice_storage::fs::SimFs;
    use sluice_storage::LogConfig;

    type SimPartition = Partition<LocalLog<SimFs>, SimClock>;
    type SimCoordinator = TxnCoordinator<LocalLog<SimFs>, SimClock>;

    const T0_MS: u64 = 4_102_444_800_000;
    const TIMEOUT_MS: u64 = 1_000;
    const TOPIC: &str = "acct/topic";
    const TXN: &str = "acct/tx";

    /// Markers go straight to one partition (the broker's sink goes over the mesh).
    struct OnePartition(Rc<SimPartition>);

    impl TxnSink for OnePartition {
        fn write_marker(
            &self,
            _topic: String,
            _partition: u32,
            producer_id: i64,
            epoch: i16,
            commit: bool,
        ) -> LocalBoxFuture<'static, StreamResult<()>> {
            let tp = self.0.clone();
            Box::pin(async move {
                tp.write_marker(producer_id, epoch, commit).await?;
                Ok(())
            })
        }

        fn commit_offsets(
            &self,
            _group: String,
            _offsets: Vec<(TopicPartition, u64)>,
        ) -> LocalBoxFuture<'static, StreamResult<()>> {
            Box::pin(async { Ok(()) })
        }
    }

    fn batch(value: &[u8]) -> Vec<u8> {
        let mut b = BatchBuilder::new();
        b.push_parts(T0_MS as i64, None, value, std::iter::empty());
        b.finish().expect("one record")
    }

    async fn values(tp: &SimPartition, isolation: Isolation) -> Vec<Vec<u8>> {
        let f = tp
            .fetch_isolated(0, 1 << 20, u32::MAX, 0, isolation)
            .await
            .expect("fetch");
        f.records(0)
            .expect("records")
            .into_iter()
            .map(|r| r.record.value)
            .collect()
    }

    async fn settle(clock: &SimClock, to_ms: u64) {
        let mut at = clock.now_ms();
        while at < to_ms {
            at = (at + TXN_TIMEOUT_CHECK_INTERVAL_MS).min(to_ms);
            clock.advance_to(at);
            runtime::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// The coordinator reads time from its clock (the seam): on virtual time an open
    /// transaction is left alone before its timeout and aborted at it, in a later epoch (the
    /// hung producer is fenced: its batch and its EndTxn are refused, nothing changes); its
    /// records never reach a committed reader; the decision survives reopening both logs.
    #[test]
    fn a_timed_out_transaction_is_aborted_on_the_coordinators_clock() {
        sluice_storage::rt::run("txn-timeout-clock", || async {
            let fs = SimFs::new();
            let clock = SimClock::new(T0_MS);
            let open_partition = || {
                SimPartition::open_on(
                    &fs,
                    clock.clone(),
                    PathBuf::from("/t/p0"),
                    1,
                    0,
                    LogConfig::default(),
                )
            };
            let tp = open_partition().await.expect("partition");
            let open_coordinator = |tp: Rc<SimPartition>| {
                SimCoordinator::open_on(
                    &fs,
                    clock.clone(),
                    PathBuf::from("/txns"),
                    Rc::new(OnePartition(tp)),
                    LogConfig::default(),
                )
            };
            let c = open_coordinator(tp.clone()).await.expect("coordinator");
            let Ok(TxnAnswer::Producer { producer_id, epoch }) = c
                .handle(TxnRequest::InitProducerId {
                    txn_id: TXN.into(),
                    timeout_ms: TIMEOUT_MS as i64,
                    producer_id: -1,
                    epoch: -1,
                })
                .await
                .expect("init")
            else {
                panic!("no producer id");
            };
            let add = c
                .handle(TxnRequest::AddPartitions {
                    txn_id: TXN.into(),
                    producer_id,
                    epoch,
                    partitions: vec![(TOPIC.into(), 0)],
                })
                .await
                .expect("add");
            assert_eq!(add, Ok(TxnAnswer::Done));
            let producer = |seq| ProducerBatch {
                producer_id,
                epoch,
                first_sequence: seq,
                last_sequence: seq,
            };
            tp.produce_transactional(batch(b"open"), producer(0))
                .await
                .expect("produce");
            tp.produce(batch(b"plain")).await.expect("produce");
            assert_eq!(values(&tp, Isolation::Uncommitted).await.len(), 2);
            assert!(
                values(&tp, Isolation::Committed).await.is_empty(),
                "a committed reader saw past the open transaction"
            );
            // Every non-Kafka reader (native protocol, console) reads committed.
            let native = tp.fetch(0, 1 << 20, u32::MAX, 0).await.expect("fetch");
            assert!(native.records(0).expect("records").is_empty());

            settle(&clock, T0_MS + TIMEOUT_MS - TXN_TIMEOUT_CHECK_INTERVAL_MS).await;
            let st = c.state_of(TXN).expect("state");
            assert_eq!(st.state, TxnState::Ongoing, "aborted before its timeout");

            settle(
                &clock,
                T0_MS + TIMEOUT_MS + 3 * TXN_TIMEOUT_CHECK_INTERVAL_MS,
            )
            .await;
            let st = c.state_of(TXN).expect("state");
            assert_eq!(
                st.state,
                TxnState::CompleteAbort,
                "not aborted at its timeout"
            );
            assert_eq!(st.epoch, epoch + 1, "the abort did not fence the producer");
            assert_eq!(
                values(&tp, Isolation::Committed).await,
                vec![b"plain".to_vec()]
            );
            assert_eq!(tp.last_stable_offset(), tp.offsets().1);

            // The hung producer comes back: fenced everywhere, nothing changes.
            let end = tp.offsets().1;
            assert!(matches!(
                tp.produce_transactional(batch(b"late"), producer(1)).await,
                Err(StreamError::ProducerFenced(_))
            ));
            let refused = c
                .handle(TxnRequest::End {
                    txn_id: TXN.into(),
                    producer_id,
                    epoch,
                    commit: true,
                })
                .await
                .expect("end");
            assert_eq!(refused, Err(txn_code::INVALID_PRODUCER_EPOCH));
            assert_eq!(
                c.state_of(TXN),
                Some(st.clone()),
                "a fenced EndTxn changed state"
            );
            assert_eq!(tp.offsets().1, end);

            // Both logs replay to the same state.
            c.close().await;
            tp.close().await.expect("close");
            let tp = open_partition().await.expect("reopen");
            assert_eq!(
                values(&tp, Isolation::Committed).await,
                vec![b"plain".to_vec()]
            );
            let c = open_coordinator(tp.clone()).await.expect("reopen");
            assert_eq!(c.state_of(TXN), Some(st));
            c.close().await;
            tp.close().await.expect("close");
        })
        .expect("executor");
    }
}
