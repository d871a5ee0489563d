//! Kafka transactions inside one topic partition: the control records a transactional
//! producer's data and the coordinator's commit/abort markers leave in the partition's log, and
//! the index rebuilt from them (open transactions, the last stable offset, aborted batches).
//!
//! ## Transaction control record, format version 1
//!
//! A one-record **control batch** (attribute bit 0, `wire/src/batch.rs`), so every replay that
//! reads `BatchView::data_records` steps over it. Its key is `sluice.txn` (a Raft no-op or
//! membership entry has another key); its value, big-endian:
//!
//! ```text
//!   0  u8   format version    1
//!   1  u8   kind              0 data, 1 commit marker, 2 abort marker
//!   2  i64  producer id
//!  10  i16  producer epoch    for a marker: the epoch the coordinator ended the transaction in
//!                             (after a fence or a timeout, one above the producer's)
//!  12  u64  data checksum     kind 0: the xxh3 checksum (header bytes 16..24) of the data batch
//!                             that follows at the next offset; 0 for markers
//! ```
//!
//! A transactional producer's batch is staged right after a `data` record naming it (both
//! staged with no await in between, so nothing lands between them). On replay a `data` record
//! claims the batch at the next offset only if that batch's checksum is the one it names: a
//! commit torn between the two leaves an unclaimed record, never a wrong claim. The
//! transaction is open from its first `data` record until a marker for its producer id.
//!
//! The index is memory rebuilt from the log at open (no side file): the open transactions,
//! each producer's newest epoch (a stale one is fenced), and every aborted batch still in the
//! log (read_committed readers never get them).

use super::{StreamError, StreamResult};
use sluice_storage::{BatchBuilder, BatchView, Record};
use std::collections::{BTreeMap, HashMap};

/// The key of a transaction control record.
pub const TXN_CONTROL_KEY: &[u8] = b"sluice.txn";
/// The format version of the control record's value (module doc).
pub const TXN_CONTROL_VERSION: u8 = 1;
const CONTROL_VALUE_BYTES: usize = 20;
/// A control batch's size on the log, at most (back-pressure estimate).
pub const CONTROL_BATCH_BYTES_MAX: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnControl {
    /// The next batch belongs to `producer_id`'s open transaction.
    Data {
        producer_id: i64,
        epoch: i16,
        checksum: u64,
    },
    /// The producer's transaction ended: committed or aborted.
    Marker {
        producer_id: i64,
        epoch: i16,
        commit: bool,
    },
}

impl TxnControl {
    pub fn producer_id(&self) -> i64 {
        match self {
            TxnControl::Data { producer_id, .. } | TxnControl::Marker { producer_id, .. } => {
                *producer_id
            }
        }
    }

    fn encode_value(&self) -> Vec<u8> {
        let (kind, pid, epoch, sum) = match *self {
            TxnControl::Data {
                producer_id,
                epoch,
                checksum,
            } => (0u8, producer_id, epoch, checksum),
            TxnControl::Marker {
                producer_id,
                epoch,
                commit,
            } => (if commit { 1 } else { 2 }, producer_id, epoch, 0),
        };
        let mut v = Vec::with_capacity(CONTROL_VALUE_BYTES);
        v.push(TXN_CONTROL_VERSION);
        v.push(kind);
        v.extend_from_slice(&pid.to_be_bytes());
        v.extend_from_slice(&epoch.to_be_bytes());
        v.extend_from_slice(&sum.to_be_bytes());
        v
    }

    /// The control batch holding this record.
    pub fn to_batch(&self, timestamp_ms: i64) -> Vec<u8> {
        let mut b = BatchBuilder::new().control();
        b.push(&Record {
            timestamp_ms,
            key: Some(TXN_CONTROL_KEY.to_vec()),
            value: self.encode_value(),
            headers: Vec::new(),
        });
        b.finish().expect("one record")
    }

    /// The transaction control record of a batch, if it is one. `Err` for a record with the
    /// key and a value this build cannot read (a newer version, or damaged).
    pub fn of_batch(view: &BatchView<'_>) -> StreamResult<Option<TxnControl>> {
        if !view.header.is_control() || view.header.record_count != 1 {
            return Ok(None);
        }
        let Some(Ok(r)) = view.records().next() else {
            return Ok(None);
        };
        if r.key != Some(TXN_CONTROL_KEY) {
            return Ok(None);
        }
        Self::decode_value(r.value).map(Some)
    }

    fn decode_value(v: &[u8]) -> StreamResult<TxnControl> {
        let bad = |why: &str| StreamError::Internal(format!("transaction control record: {why}"));
        if v.len() < CONTROL_VALUE_BYTES {
            return Err(bad("short"));
        }
        if v[0] != TXN_CONTROL_VERSION {
            return Err(bad(&format!(
                "version {} (this build reads {TXN_CONTROL_VERSION})",
                v[0]
            )));
        }
        let producer_id = i64::from_be_bytes(v[2..10].try_into().expect("8 bytes"));
        let epoch = i16::from_be_bytes(v[10..12].try_into().expect("2 bytes"));
        let checksum = u64::from_be_bytes(v[12..20].try_into().expect("8 bytes"));
        match v[1] {
            0 => Ok(TxnControl::Data {
                producer_id,
                epoch,
                checksum,
            }),
            1 | 2 => Ok(TxnControl::Marker {
                producer_id,
                epoch,
                commit: v[1] == 1,
            }),
            k => Err(bad(&format!("kind {k}"))),
        }
    }
}

/// A batch's checksum as its header stores it (what a `data` record names).
pub fn batch_checksum(batch: &[u8]) -> Option<u64> {
    sluice_storage::BatchHeader::parse(batch)
        .ok()
        .map(|h| h.checksum)
}

#[derive(Debug, Clone, Default)]
struct OpenTxn {
    /// The offset of the transaction's first `data` record in this partition.
    first_offset: u64,
    /// (base, last) offsets of its data batches.
    batches: Vec<(u64, u64)>,
}

/// An aborted transaction as Kafka's Fetch reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedTxn {
    pub producer_id: i64,
    pub first_offset: u64,
    /// The offset of its abort marker.
    pub marker_offset: u64,
}

/// One partition's transaction state (sans-I/O): applied in log order, live and on replay.
#[derive(Debug, Default)]
pub struct TxnIndex {
    epochs: HashMap<i64, i16>,
    open: HashMap<i64, OpenTxn>,
    /// By abort marker offset.
    aborted: Vec<AbortedTxn>,
    /// base offset → last offset of every aborted data batch still indexed.
    aborted_batches: BTreeMap<u64, u64>,
    /// A `data` record waiting for its batch at the next offset: (record offset, record).
    pending: Option<(u64, TxnControl)>,
}

impl TxnIndex {
    /// Refuses a producer epoch older than the newest this partition has seen for the id.
    pub fn check_epoch(&self, producer_id: i64, epoch: i16) -> StreamResult<()> {
        match self.epochs.get(&producer_id) {
            Some(e) if epoch < *e => Err(StreamError::ProducerFenced(format!(
                "epoch {epoch} is older than {e}"
            ))),
            _ => Ok(()),
        }
    }

    /// Applies one batch of the log, in order: control records and the data batches they
    /// claim.
    pub fn apply(&mut self, view: &BatchView<'_>) -> StreamResult<()> {
        let base = view.header.base_offset;
        let pending = self.pending.take();
        match TxnControl::of_batch(view)? {
            Some(c @ TxnControl::Data { .. }) => self.pending = Some((base, c)),
            Some(TxnControl::Marker {
                producer_id,
                epoch,
                commit,
            }) => self.end(producer_id, epoch, commit, base),
            None => {
                if let Some((
                    at,
                    TxnControl::Data {
                        producer_id,
                        epoch,
                        checksum,
                    },
                )) = pending
                {
                    if at + 1 == base
                        && !view.header.is_control()
                        && view.header.checksum == checksum
                    {
                        self.claim(producer_id, epoch, at, base, view.header.last_offset());
                    }
                }
            }
        }
        Ok(())
    }

    /// Puts the data batch `[base, last]` in the producer's open transaction (opened at
    /// `first`, its `data` record, if not open yet).
    pub fn claim(&mut self, producer_id: i64, epoch: i16, first: u64, base: u64, last: u64) {
        let e = self.epochs.entry(producer_id).or_insert(epoch);
        *e = (*e).max(epoch);
        self.open
            .entry(producer_id)
            .or_insert_with(|| OpenTxn {
                first_offset: first,
                batches: Vec::new(),
            })
            .batches
            .push((base, last));
    }

    /// Ends the producer's open transaction at its marker's offset.
    pub fn end(&mut self, producer_id: i64, epoch: i16, commit: bool, marker_offset: u64) {
        let e = self.epochs.entry(producer_id).or_insert(epoch);
        *e = (*e).max(epoch);
        let Some(txn) = self.open.remove(&producer_id) else {
            // A marker for nothing open here (written again after a coordinator restart).
            return;
        };
        if !commit {
            for (b, l) in &txn.batches {
                self.aborted_batches.insert(*b, *l);
            }
            self.aborted.push(AbortedTxn {
                producer_id,
                first_offset: txn.first_offset,
                marker_offset,
            });
        }
    }

    /// Kafka's last stable offset: the first offset of the oldest open transaction, else the
    /// log's end. read_committed readers see nothing at or past it.
    pub fn last_stable_offset(&self, end: u64) -> u64 {
        self.open
            .values()
            .map(|t| t.first_offset)
            .min()
            .unwrap_or(end)
            .min(end)
    }

    /// Whether the data batch starting at `base` belongs to an aborted transaction.
    pub fn is_aborted(&self, base: u64) -> bool {
        self.aborted_batches.contains_key(&base)
    }

    /// The aborted transactions overlapping `[from, to)` (Kafka's index in a Fetch answer).
    pub fn aborted_in(&self, from: u64, to: u64) -> Vec<AbortedTxn> {
        self.aborted
            .iter()
            .filter(|a| a.marker_offset >= from && a.first_offset < to)
            .copied()
            .collect()
    }

    /// Forgets what lies wholly below `start` (retention or DeleteRecords took it).
    pub fn forget_below(&mut self, start: u64) {
        self.aborted.retain(|a| a.marker_offset >= start);
        self.aborted_batches = self.aborted_batches.split_off(&start);
    }

    pub fn is_open(&self, producer_id: i64) -> bool {
        self.open.contains_key(&producer_id)
    }

    /// Remembers a newer epoch for the producer (a fence with nothing open here).
    pub fn raise_epoch(&mut self, producer_id: i64, epoch: i16) {
        let e = self.epochs.entry(producer_id).or_insert(epoch);
        *e = (*e).max(epoch);
    }

    pub fn open_count(&self) -> usize {
        self.open.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data_batch(base: u64, n: usize) -> Vec<u8> {
        let mut b = BatchBuilder::new();
        for i in 0..n {
            b.push_parts(i as i64, None, b"v", std::iter::empty());
        }
        let mut bytes = b.finish().expect("records");
        bytes[0..8].copy_from_slice(&base.to_le_bytes());
        bytes
    }

    fn control_at(c: TxnControl, base: u64) -> Vec<u8> {
        let mut bytes = c.to_batch(0);
        bytes[0..8].copy_from_slice(&base.to_le_bytes());
        bytes
    }

    fn apply(ix: &mut TxnIndex, bytes: &[u8]) {
        ix.apply(&BatchView::parse(bytes).expect("batch"))
            .expect("apply");
    }

    #[test]
    fn control_records_round_trip_and_refuse_unknown_versions() {
        for c in [
            TxnControl::Data {
                producer_id: 7 << 40,
                epoch: 3,
                checksum: u64::MAX - 1,
            },
            TxnControl::Marker {
                producer_id: 9,
                epoch: i16::MAX,
                commit: true,
            },
            TxnControl::Marker {
                producer_id: 9,
                epoch: 0,
                commit: false,
            },
        ] {
            let bytes = c.to_batch(5);
            let v = BatchView::parse(&bytes).expect("batch");
            assert!(v.header.is_control());
            assert_eq!(TxnControl::of_batch(&v).expect("decodes"), Some(c));
        }
        let mut value = TxnControl::Marker {
            producer_id: 1,
            epoch: 0,
            commit: true,
        }
        .encode_value();
        value[0] = TXN_CONTROL_VERSION + 1;
        assert!(TxnControl::decode_value(&value).is_err());
    }

    /// Open → LSO held at the first record; abort → batches hidden, LSO released, the
    /// aborted index names the transaction; commit → nothing hidden; a data record whose
    /// batch did not follow (torn) claims nothing.
    #[test]
    fn the_index_follows_the_log() {
        let mut ix = TxnIndex::default();
        let d1 = data_batch(1, 3);
        let sum = batch_checksum(&d1).expect("checksum");
        let data = |pid, checksum| TxnControl::Data {
            producer_id: pid,
            epoch: 0,
            checksum,
        };
        apply(&mut ix, &control_at(data(5, sum), 0));
        apply(&mut ix, &d1);
        assert_eq!(ix.last_stable_offset(4), 0);
        let d2 = data_batch(5, 1);
        apply(
            &mut ix,
            &control_at(data(6, batch_checksum(&d2).expect("sum")), 4),
        );
        apply(&mut ix, &d2);
        apply(
            &mut ix,
            &control_at(
                TxnControl::Marker {
                    producer_id: 5,
                    epoch: 1,
                    commit: false,
                },
                6,
            ),
        );
        assert!(ix.is_aborted(1));
        assert!(!ix.is_aborted(5));
        assert_eq!(ix.last_stable_offset(7), 4, "pid 6 still open");
        assert!(ix.check_epoch(5, 0).is_err(), "the abort fenced epoch 0");
        assert_eq!(ix.aborted_in(0, 7).len(), 1);
        apply(
            &mut ix,
            &control_at(
                TxnControl::Marker {
                    producer_id: 6,
                    epoch: 0,
                    commit: true,
                },
                7,
            ),
        );
        assert_eq!(ix.last_stable_offset(8), 8);
        assert!(!ix.is_aborted(5));
        // A data record naming a checksum the next batch does not have claims nothing.
        apply(&mut ix, &control_at(data(8, 12345), 8));
        apply(&mut ix, &data_batch(9, 1));
        assert_eq!(ix.open_count(), 0);
        assert_eq!(ix.last_stable_offset(10), 10);
        ix.forget_below(7);
        assert!(!ix.is_aborted(1));
        assert!(ix.aborted_in(0, 10).is_empty());
    }
}
