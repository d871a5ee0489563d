//! Read-ahead for consumers behind the tail: a partition's next window is read from disk while
//! the last answer is on its way.
//!
//! Segments are read with O_DIRECT, so the kernel's page-cache read-ahead, which Kafka's
//! sequential consumers lean on, does nothing for Sluice: without this, a lagging consumer's
//! fetch waited for its disk read (1.4 ms for 2 MiB alone on the test VM's disk, 6.6 ms with
//! four partitions' reads at once) and only then was sent, so the disk and the transport took
//! turns. When a fetch answer is full (the consumer is behind), the partition starts reading
//! what that consumer will ask for next — the same `PartitionLog::read` at the answer's next
//! offset, verified as any read — and the consumer's next fetch takes it.
//!
//! Bounds (CONTRACT.md C8): at most [`SLOTS_PER_PARTITION`] reads ahead per partition (one per
//! group reading it, typically; the oldest is dropped for a new one), at most
//! [`BYTES_PER_SHARD`] of them on a shard (a read that does not fit is not started), and each is
//! dropped [`SLOT_TTL_MS`] after it completes if nobody took it (a consumer that stopped or
//! sought elsewhere). What a slot holds was durable and verified when read; a log's suffix is
//! never rewritten under a slot on a single node (a follower's truncation, once replicated,
//! must call [`ReadAhead::clear`]).

use crate::partition_log::PartitionLog;
use crate::runtime::{self, Event};
use sluice_storage::ReadBatch;
use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};
use std::time::Duration;

/// Reads ahead kept per partition.
pub const SLOTS_PER_PARTITION: usize = 4;
/// Bytes all reads ahead on one shard may hold (reserved at `max_bytes` when a read starts).
pub const BYTES_PER_SHARD: usize = 64 * 1024 * 1024;
/// A completed read ahead nobody took is dropped after this.
pub const SLOT_TTL_MS: u64 = 2_000;

thread_local! {
    /// Bytes the shard's reads ahead hold or have reserved.
    static RESERVED: Cell<usize> = const { Cell::new(0) };
    /// The shard's counts, over all its partitions (metrics).
    static SHARD: Cell<ReadAheadStats> = const { Cell::new(ReadAheadStats::ZERO) };
}

/// The shard's read-ahead bytes in use (metrics and tests).
pub fn reserved_bytes() -> usize {
    RESERVED.with(Cell::get)
}

/// The shard's counts since start, over every partition it has held.
pub fn shard_stats() -> ReadAheadStats {
    SHARD.with(Cell::get)
}

/// A share of [`BYTES_PER_SHARD`], given back when dropped.
struct Reservation(Cell<usize>);

impl Reservation {
    fn take(bytes: usize, limit: usize) -> Option<Reservation> {
        RESERVED.with(|r| {
            let now = r.get();
            (now + bytes <= limit).then(|| {
                r.set(now + bytes);
                Reservation(Cell::new(bytes))
            })
        })
    }

    /// Holds `bytes` instead (a read may return one batch past its `max_bytes`).
    fn resize(&self, bytes: usize) {
        RESERVED.with(|r| r.set(r.get() - self.0.get() + bytes));
        self.0.set(bytes);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        RESERVED.with(|r| r.set(r.get() - self.0.get()));
    }
}

enum State {
    Reading,
    Ready(Vec<ReadBatch>),
    Failed,
}

struct Slot {
    from: u64,
    max_bytes: usize,
    state: RefCell<State>,
    done: Event,
    reservation: Reservation,
}

/// Reads started, fetches answered from them, reads not started and reads dropped untaken:
/// for tests and operators (`/metrics`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReadAheadStats {
    pub started: u64,
    pub hits: u64,
    /// Reads not started because the shard's budget was spent.
    pub over_budget: u64,
    /// Completed reads dropped untaken (their TTL passed, or a newer one took their place).
    pub expired: u64,
}

impl ReadAheadStats {
    const ZERO: ReadAheadStats = ReadAheadStats {
        started: 0,
        hits: 0,
        over_budget: 0,
        expired: 0,
    };
}

/// One partition's reads ahead.
pub struct ReadAhead {
    slots: Rc<RefCell<Vec<Rc<Slot>>>>,
    stats: Rc<Cell<ReadAheadStats>>,
    budget: usize,
    ttl: Duration,
}

impl Default for ReadAhead {
    fn default() -> Self {
        ReadAhead::new(BYTES_PER_SHARD, Duration::from_millis(SLOT_TTL_MS))
    }
}

impl ReadAhead {
    /// With a shard budget and a TTL of its own (tests).
    pub fn new(budget: usize, ttl: Duration) -> ReadAhead {
        ReadAhead {
            slots: Rc::default(),
            stats: Rc::default(),
            budget,
            ttl,
        }
    }

    pub fn stats(&self) -> ReadAheadStats {
        self.stats.get()
    }

    fn count(&self, f: impl Fn(&mut ReadAheadStats)) {
        count(&self.stats, f);
    }

    /// The batches read ahead from `from` (waiting for the read if it is still in flight), at
    /// most about `max_bytes` of them; `None` if nothing was read from there or the read failed
    /// (the caller reads for itself and gets the error first hand).
    pub async fn take(&self, from: u64, max_bytes: usize) -> Option<Vec<ReadBatch>> {
        let slot = {
            let mut slots = self.slots.borrow_mut();
            let i = slots.iter().position(|s| s.from == from)?;
            slots.remove(i)
        };
        loop {
            let done = slot.done.listen();
            let state = std::mem::replace(&mut *slot.state.borrow_mut(), State::Failed);
            match state {
                State::Reading => *slot.state.borrow_mut() = State::Reading,
                // Nothing read (the log changed under it): the caller reads for itself, and
                // waits for data if there is none.
                State::Ready(batches) if batches.is_empty() => return None,
                State::Ready(batches) => {
                    self.count(|s| s.hits += 1);
                    return Some(trim(batches, max_bytes));
                }
                State::Failed => return None,
            }
            done.await;
        }
    }

    /// Starts reading `max_bytes` from `from` of `log`, unless a read from there is already held,
    /// or the shard's budget is spent.
    pub fn start<L: PartitionLog + 'static>(&self, log: Rc<L>, from: u64, max_bytes: usize) {
        if self.slots.borrow().iter().any(|s| s.from == from) {
            return;
        }
        let Some(reservation) = Reservation::take(max_bytes, self.budget) else {
            self.count(|s| s.over_budget += 1);
            return;
        };
        let slot = Rc::new(Slot {
            from,
            max_bytes,
            state: RefCell::new(State::Reading),
            done: Event::default(),
            reservation,
        });
        {
            let mut slots = self.slots.borrow_mut();
            if slots.len() >= SLOTS_PER_PARTITION {
                let old = slots.remove(0);
                if matches!(*old.state.borrow(), State::Ready(_)) {
                    self.count(|s| s.expired += 1);
                }
            }
            slots.push(slot.clone());
        }
        self.count(|s| s.started += 1);
        let (slots, stats, ttl) = (Rc::downgrade(&self.slots), self.stats.clone(), self.ttl);
        runtime::spawn(async move {
            let read = log.read(slot.from, slot.max_bytes).await;
            // Not held through the wait below: a deleted topic's files close with its log.
            drop(log);
            let state = match read {
                Ok(batches) => {
                    slot.reservation
                        .resize(batches.iter().map(|b| b.bytes.len()).sum());
                    State::Ready(batches)
                }
                Err(_) => State::Failed,
            };
            *slot.state.borrow_mut() = state;
            slot.done.notify();
            // Held from here by its partition's list (and a reader waiting for it) only.
            let weak = Rc::downgrade(&slot);
            drop(slot);
            runtime::sleep(ttl).await;
            drop_untaken(&slots, &weak, &stats);
        });
    }

    /// Drops every read ahead (the partition closes, or its log's suffix changed).
    pub fn clear(&self) {
        self.slots.borrow_mut().clear();
    }
}

/// Counts in the partition's stats and the shard's.
fn count(stats: &Cell<ReadAheadStats>, f: impl Fn(&mut ReadAheadStats)) {
    let mut s = stats.get();
    f(&mut s);
    stats.set(s);
    SHARD.with(|shard| {
        let mut s = shard.get();
        f(&mut s);
        shard.set(s);
    });
}

/// Takes a completed slot nobody took out of its partition's list (its memory goes with it).
fn drop_untaken(
    slots: &Weak<RefCell<Vec<Rc<Slot>>>>,
    slot: &Weak<Slot>,
    stats: &Cell<ReadAheadStats>,
) {
    let (Some(slots), Some(slot)) = (slots.upgrade(), slot.upgrade()) else {
        return;
    };
    let mut slots = slots.borrow_mut();
    if let Some(i) = slots.iter().position(|s| Rc::ptr_eq(s, &slot)) {
        slots.remove(i);
        count(stats, |s| s.expired += 1);
    }
}

/// A fetch answer cut from what was read: whole batches, until `max_records` records from
/// `offset` on were included.
pub struct Answer {
    pub batches: Vec<bytes::Bytes>,
    pub records: u64,
    pub bytes: usize,
    /// The offset after the last batch included (the consumer's next fetch), or `offset`.
    pub next: u64,
}

impl Answer {
    pub fn cut(read: Vec<ReadBatch>, offset: u64, max_records: u32) -> Answer {
        let mut a = Answer {
            batches: Vec::new(),
            records: 0,
            bytes: 0,
            next: offset,
        };
        for b in read {
            if a.records >= u64::from(max_records) {
                break;
            }
            a.records += b
                .header
                .last_offset()
                .saturating_sub(offset.max(b.header.base_offset))
                + 1;
            a.bytes += b.bytes.len();
            a.next = b.header.next_offset();
            a.batches.push(b.bytes);
        }
        a
    }

    /// Whether the answer hit a limit (the consumer is behind), and so how much to read ahead
    /// from `next`: about as much again (an answer held to `max_records` used `bytes` of its
    /// read; reading `max_bytes` would read records from disk that the next answer drops).
    pub fn read_ahead_bytes(&self, max_records: u32, max_bytes: usize) -> Option<usize> {
        let full = self.records >= u64::from(max_records) || self.bytes >= max_bytes;
        full.then(|| self.bytes.clamp(1, max_bytes))
    }
}

/// The first batches up to about `max_bytes` (at least one), as a read of that size returns.
fn trim(mut batches: Vec<ReadBatch>, max_bytes: usize) -> Vec<ReadBatch> {
    let mut total = 0usize;
    let keep = batches
        .iter()
        .position(|b| {
            total += b.bytes.len();
            total >= max_bytes
        })
        .map_or(batches.len(), |i| i + 1);
    batches.truncate(keep);
    batches
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition_log::LocalLog;
    use sluice_storage::fs::{Fault, FaultPlan, FaultyFs, Op, SimFs};
    use sluice_storage::{LogConfig, Record};
    use std::path::PathBuf;

    const RECORD_BYTES: usize = 2048;
    const BATCH_RECORDS: usize = 16;

    fn batch(n: usize) -> Vec<Record> {
        (0..BATCH_RECORDS)
            .map(|i| Record {
                timestamp_ms: 1,
                key: None,
                value: vec![(n * BATCH_RECORDS + i) as u8; RECORD_BYTES],
                headers: Vec::new(),
            })
            .collect()
    }

    async fn log_with<F: sluice_storage::fs::Fs>(fs: &F, batches: usize) -> Rc<LocalLog<F>> {
        // No cache of what was appended: every read goes to the (simulated) disk.
        let config = LogConfig {
            read_cache_bytes_max: 0,
            ..LogConfig::default()
        };
        let log = LocalLog::open(fs, PathBuf::from("/p"), config)
            .await
            .expect("open");
        for n in 0..batches {
            let bytes = sluice_storage::batch::encode(&batch(n)).expect("encode");
            log.append(bytes).await.expect("append");
        }
        Rc::new(log)
    }

    fn offsets(batches: &[ReadBatch]) -> Vec<u64> {
        batches.iter().map(|b| b.header.base_offset).collect()
    }

    fn run<T: Send + 'static, Fut: std::future::Future<Output = T> + 'static>(
        f: impl FnOnce() -> Fut + Send + 'static,
    ) -> T {
        sluice_storage::rt::run("readahead-test", f).expect("executor")
    }

    #[test]
    fn a_sequential_reader_takes_what_was_read_ahead_and_it_equals_a_direct_read() {
        run(|| async {
            let log = log_with(&SimFs::new(), 40).await;
            let ra = ReadAhead::default();
            let window = 8 * BATCH_RECORDS * RECORD_BYTES;
            let mut at = 0u64;
            while at < log.end_offset() {
                let got = match ra.take(at, window).await {
                    Some(b) => b,
                    None => log.read(at, window).await.expect("read"),
                };
                let direct = log.read(at, window).await.expect("read");
                assert_eq!(offsets(&got), offsets(&direct), "at {at}");
                for (a, b) in got.iter().zip(&direct) {
                    assert_eq!(a.bytes, b.bytes);
                }
                at = got.last().expect("a batch").header.next_offset();
                ra.start(log.clone(), at, window);
            }
            let s = ra.stats();
            assert_eq!(s.started, 5, "{s:?}");
            assert_eq!(
                s.hits, 4,
                "every read after the first was read ahead: {s:?}"
            );
            // The read ahead from the end found nothing: it holds nothing, and is no answer
            // (a fetch there must wait for data, not return at once with none).
            assert_eq!(reserved_bytes(), 0, "an empty read holds nothing");
            assert!(ra.take(at, window).await.is_none());
        });
    }

    #[test]
    fn a_smaller_fetch_gets_a_trimmed_answer_and_another_offset_misses() {
        run(|| async {
            let log = log_with(&SimFs::new(), 8).await;
            let ra = ReadAhead::default();
            let big = 4 * BATCH_RECORDS * RECORD_BYTES;
            ra.start(log.clone(), 0, big);
            assert!(ra.take(16, big).await.is_none(), "another offset misses");
            let got = ra.take(0, 1).await.expect("a hit");
            assert_eq!(offsets(&got), vec![0], "trimmed to one batch");
            assert!(ra.take(0, big).await.is_none(), "taken once");
        });
    }

    #[test]
    fn untaken_reads_expire_and_the_shard_budget_bounds_what_is_held() {
        run(|| async {
            let log = log_with(&SimFs::new(), 16).await;
            let one = BATCH_RECORDS * RECORD_BYTES;
            let ra = ReadAhead::new(3 * one, Duration::from_millis(50));
            ra.start(log.clone(), 0, one);
            ra.start(log.clone(), 16, one);
            ra.start(log.clone(), 32, one);
            ra.start(log.clone(), 48, one);
            assert_eq!(ra.stats().over_budget, 1, "{:?}", ra.stats());
            assert!(reserved_bytes() <= 3 * one + 3 * 64);
            runtime::sleep(Duration::from_millis(200)).await;
            assert_eq!(ra.stats().expired, 3, "{:?}", ra.stats());
            assert_eq!(reserved_bytes(), 0, "expired reads give their bytes back");
            // More partitions' slots than one partition keeps: the oldest goes.
            let ra = ReadAhead::default();
            for n in 0..=SLOTS_PER_PARTITION as u64 {
                ra.start(log.clone(), n * 16, one);
            }
            assert!(ra.take(0, one).await.is_none(), "the oldest was dropped");
            assert!(ra.take(16, one).await.is_some());
            ra.clear();
            assert!(ra.take(32, one).await.is_none(), "cleared");
        });
    }

    fn env_u64(name: &str) -> Option<u64> {
        std::env::var(name).ok().and_then(|v| v.parse().ok())
    }

    /// `got` is a non-empty prefix of `direct`, batch for batch and byte for byte.
    fn is_prefix(got: &[ReadBatch], direct: &[ReadBatch]) -> Result<(), String> {
        if got.is_empty() || got.len() > direct.len() {
            return Err(format!(
                "{} batches read ahead, {} read directly",
                got.len(),
                direct.len()
            ));
        }
        for (a, b) in got.iter().zip(direct) {
            if a.header.base_offset != b.header.base_offset || a.bytes != b.bytes {
                return Err(format!(
                    "batch at {} read ahead differs from the direct read's at {}",
                    a.header.base_offset, b.header.base_offset
                ));
            }
        }
        Ok(())
    }

    /// One random case: appends of random batches, two consumers fetching as
    /// `TopicPartition::fetch` does (taking a read ahead or reading directly, starting the next
    /// read ahead on a full answer), seeks, retention below a position, pauses past the TTL.
    /// Every answer taken from a read ahead must be a prefix of a direct read made now, and the
    /// shard's reserved bytes stay within the budget (plus one batch per slot).
    async fn random_case(seed: u64) -> Result<String, String> {
        use rand::rngs::SmallRng;
        use rand::{Rng, SeedableRng};
        let mut rng = SmallRng::seed_from_u64(seed);
        let config = LogConfig {
            segment_bytes_max: 64 * 1024,
            batch_bytes_max: 32 * 1024,
            read_cache_bytes_max: if rng.gen_bool(0.5) { 0 } else { 96 * 1024 },
            ..LogConfig::default()
        };
        let log = Rc::new(
            LocalLog::open(&SimFs::new(), PathBuf::from("/p"), config)
                .await
                .map_err(|e| e.to_string())?,
        );
        let budget = [16 * 1024, 64 * 1024, BYTES_PER_SHARD][rng.gen_range(0..3)];
        let ttl = Duration::from_millis(rng.gen_range(1..30));
        let ra = ReadAhead::new(budget, ttl);
        let mut pos = [0u64; 2];
        let (mut hits, mut seeks) = (0, 0);
        for step in 0..150 {
            match rng.gen_range(0..10) {
                0..=2 => {
                    let batch: Vec<Record> = (0..rng.gen_range(1..8))
                        .map(|_| Record {
                            timestamp_ms: 1,
                            key: None,
                            value: vec![step as u8; rng.gen_range(1..3000)],
                            headers: Vec::new(),
                        })
                        .collect();
                    let bytes = sluice_storage::batch::encode(&batch).expect("encode");
                    log.append(bytes).await.map_err(|e| e.to_string())?;
                }
                3 => {
                    let (start, end) = (log.start_offset(), log.end_offset());
                    let c = rng.gen_range(0..2);
                    pos[c] = rng.gen_range(start..=end);
                    seeks += 1;
                }
                4 if rng.gen_bool(0.3) => {
                    let below = pos[rng.gen_range(0..2)];
                    log.delete_segments_below(below)
                        .await
                        .map_err(|e| e.to_string())?;
                }
                5 => runtime::sleep(Duration::from_millis(rng.gen_range(0..40))).await,
                _ => {
                    let c = rng.gen_range(0..2);
                    let offset = pos[c].max(log.start_offset());
                    if offset >= log.end_offset() {
                        continue;
                    }
                    let max_bytes = [1, 4096, 16 * 1024, 64 * 1024][rng.gen_range(0..4)];
                    let max_records: u32 = rng.gen_range(1..40);
                    let read = match ra.take(offset, max_bytes).await {
                        Some(read) => {
                            let direct = log
                                .read(offset, max_bytes)
                                .await
                                .map_err(|e| e.to_string())?;
                            is_prefix(&read, &direct)
                                .map_err(|e| format!("step {step}, fetch at {offset}: {e}"))?;
                            hits += 1;
                            read
                        }
                        None => log
                            .read(offset, max_bytes)
                            .await
                            .map_err(|e| e.to_string())?,
                    };
                    let answer = Answer::cut(read, offset, max_records);
                    let next = answer.next;
                    if next <= offset {
                        return Err(format!("step {step}: a fetch at {offset} did not advance"));
                    }
                    pos[c] = next;
                    if let (Some(ahead), true) = (
                        answer.read_ahead_bytes(max_records, max_bytes),
                        next < log.end_offset(),
                    ) {
                        ra.start(log.clone(), next, ahead);
                    }
                }
            }
            let slack = SLOTS_PER_PARTITION * 32 * 1024;
            if reserved_bytes() > budget + slack {
                return Err(format!(
                    "step {step}: {} bytes reserved, budget {budget}",
                    reserved_bytes()
                ));
            }
        }
        runtime::sleep(ttl + Duration::from_millis(50)).await;
        if reserved_bytes() != 0 {
            return Err(format!(
                "{} bytes still held after the TTL",
                reserved_bytes()
            ));
        }
        Ok(format!("{hits} hits, {seeks} seeks"))
    }

    #[test]
    fn reads_ahead_agree_with_direct_reads_on_random_appends_seeks_and_retention() {
        let base = env_u64("SLUICE_SEED").unwrap_or_else(rand::random);
        let cases = env_u64("SLUICE_CASES").unwrap_or(40);
        let outcome = run(move || async move {
            let mut hits = 0usize;
            for i in 0..cases {
                let seed = base.wrapping_add(i);
                match random_case(seed).await {
                    Ok(summary) => {
                        hits += summary
                            .split_whitespace()
                            .next()
                            .and_then(|n| n.parse::<usize>().ok())
                            .unwrap_or(0);
                    }
                    Err(e) => {
                        return Err(format!(
                            "{e}; replay with SLUICE_SEED={seed} SLUICE_CASES=1"
                        ))
                    }
                }
            }
            Ok(hits)
        });
        match outcome {
            Ok(hits) => {
                eprintln!("readahead model: {cases} cases from SLUICE_SEED={base}: {hits} answers taken from reads ahead");
                assert!(
                    cases < 20 || hits > 0,
                    "no case exercised a read ahead (SLUICE_SEED={base})"
                );
            }
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn a_failed_read_ahead_leaves_the_reader_to_read_for_itself() {
        run(|| async {
            let plan = FaultPlan::new();
            let fs = FaultyFs::new(SimFs::new(), plan.clone());
            let log = log_with(&fs, 4).await;
            let ra = ReadAhead::default();
            plan.fail(Op::Read, 0, 1, Fault::Eio);
            ra.start(log.clone(), 0, 1 << 20);
            assert!(
                ra.take(0, 1 << 20).await.is_none(),
                "a failed read is no answer"
            );
            assert_eq!(reserved_bytes(), 0);
            let direct = log.read(0, 1 << 20).await.expect("read");
            assert_eq!(direct.len(), 4);
        });
    }
}
