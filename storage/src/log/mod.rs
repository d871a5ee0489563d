//! The partition log: segments, group commit, reads by offset and time, recovery, retention.
//!
//! One `Log` is owned by one shard (thread); it is not `Send`. Appends are staged in memory and
//! committed in groups: whoever waits on an uncommitted batch while a commit may start becomes
//! the committer, writes what is staged in one durable (O_DSYNC) write, and wakes the others.
//! A second commit may start while one is in flight (from the next block boundary, leaving a
//! gap of zeros that readers step over); commits take effect in the order they started. An
//! append resolves only after its bytes (and any segment file it needed) are durable, and after
//! every batch before it. Only durable bytes are ever read.
//!
//! | module      | purpose                                                                     |
//! |-------------|-----------------------------------------------------------------------------|
//! | `recovery`  | `Log::open`: format version, segments, torn tail cut, corruption told apart |
//! | `append`    | the append API: verify, stamp (base offset, term), stage; wait for durable  |
//! | `commit`    | group commit: what one durable write takes, its turn, failure and repair    |
//! | `segment`   | segment files and state (active vs sealed), roll, index files and cache     |
//! | `read`      | reads by offset (commit cache, then disk windows) and by timestamp          |
//! | `retention` | deleting whole sealed segments by time, size or a compaction floor          |
//! | `truncate`  | removing a suffix durably (`truncate_from`), crash-safe back to front       |
//! | `terms`     | the last batch's term, restored at open; term starts by binary search       |
//!
//! This file holds the `Log` itself, its shared state (`Inner`), the public result types, and
//! what does not belong to one step (offsets, statistics, close).

mod append;
mod commit;
mod read;
mod recovery;
mod retention;
mod segment;
mod terms;
mod truncate;

pub use append::SINGLE_NODE_TERM;
pub use commit::COMMITS_IN_FLIGHT_MAX;
pub use segment::segment_file_name;

use crate::batch::{BatchHeader, BatchView};
use crate::config::LogConfig;
use crate::error::{Result, StorageError};
use crate::fs::{File, Fs};
use bytes::Bytes;
use commit::{Chunk, Slot};
use segment::{SealedIndexes, Segment};
use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::task::Waker;

/// Where an appended batch landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendInfo {
    pub base_offset: u64,
    pub last_offset: u64,
}

/// A staged batch: where it will land, and the slot its commit result arrives in.
#[must_use = "a staged batch is durable only once `Log::durable` resolves"]
pub struct AppendTicket {
    pub info: AppendInfo,
    slot: Slot,
}

/// A verified batch read from the log, in its on-disk bytes.
#[derive(Debug, Clone)]
pub struct ReadBatch {
    pub header: BatchHeader,
    pub bytes: Bytes,
}

impl ReadBatch {
    pub fn view(&self) -> BatchView<'_> {
        BatchView {
            header: self.header,
            bytes: &self.bytes,
        }
    }
}

/// Upper bounds of [`FsyncHistogram`]'s buckets, microseconds (+Inf beyond). This disk's
/// durable writes run ~150-400 µs p50 and 2-4 ms p99 (ARCHITECTURE.md, runtime facts): the
/// buckets are finest there.
pub const FSYNC_BUCKETS_US: [u64; 14] = [
    50, 100, 200, 300, 500, 750, 1_000, 2_000, 4_000, 8_000, 16_000, 50_000, 250_000, 1_000_000,
];

/// Durations of the commit path's durable writes (one per group commit, an O_DSYNC write: the
/// data and its flush), measured around the write itself: the disk's share of a commit,
/// without the group-commit wait.
/// Plain counters; the broker sums them per shard and renders a Prometheus histogram.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FsyncHistogram {
    /// Per bucket of [`FSYNC_BUCKETS_US`] (not cumulative); the last slot is +Inf.
    pub buckets: [u64; FSYNC_BUCKETS_US.len() + 1],
    pub sum_us: u64,
    pub count: u64,
}

impl FsyncHistogram {
    pub fn observe(&mut self, elapsed: std::time::Duration) {
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let i = FSYNC_BUCKETS_US
            .iter()
            .position(|b| us <= *b)
            .unwrap_or(FSYNC_BUCKETS_US.len());
        self.buckets[i] += 1;
        self.sum_us = self.sum_us.saturating_add(us);
        self.count += 1;
    }

    /// Adds another histogram's counts (summing partitions of a shard).
    pub fn add(&mut self, o: &FsyncHistogram) {
        for (a, b) in self.buckets.iter_mut().zip(o.buckets.iter()) {
            *a += b;
        }
        self.sum_us = self.sum_us.saturating_add(o.sum_us);
        self.count += o.count;
    }
}

/// Counters for metrics.
#[derive(Debug, Clone, Default)]
pub struct LogStats {
    pub batches_appended: u64,
    pub records_appended: u64,
    pub bytes_appended: u64,
    pub commits: u64,
    /// Commits that started while another was in flight (each wrote from a block boundary).
    pub commits_overlapped: u64,
    pub fsyncs: u64,
    pub commit_failures: u64,
    pub corruptions_detected: u64,
    pub cache_hits: u64,
    pub disk_reads: u64,
    /// Bytes those reads asked of the disk.
    pub disk_read_bytes: u64,
    /// Reads answered by another reader's disk read of the same window, in flight.
    pub shared_reads: u64,
    pub segments_deleted: u64,
    pub torn_tail_bytes_truncated: u64,
    /// Durable-write durations of successful group commits.
    pub fsync: FsyncHistogram,
}

/// What retention removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionOutcome {
    pub segments_deleted: usize,
    pub bytes_deleted: u64,
    pub new_start_offset: u64,
}

/// Facts about one segment, for operators and retention hooks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentInfo {
    pub base_offset: u64,
    pub next_offset: u64,
    pub size_bytes: u64,
    pub max_timestamp_ms: Option<i64>,
    pub sealed: bool,
}

struct Inner<F: Fs> {
    segments: BTreeMap<u64, Segment<F>>,
    staged: Vec<Chunk>,
    staged_bytes: usize,
    /// Next offset to assign to a staged batch.
    next_offset: u64,
    /// The term stamped on staged batches (see [`SINGLE_NODE_TERM`]); it never decreases.
    term: u64,
    /// The term of the last batch in the log (staged included): a replicated batch may not
    /// carry a lower one. Restored from the last batch at open and after a truncation.
    last_term: u64,
    /// Where the last staged chunk's segment stands (size and first timestamp, staged included).
    proj_segment: u64,
    proj_size: u64,
    proj_first_ts: Option<i64>,
    /// Commits started and not yet finished (at most [`COMMITS_IN_FLIGHT_MAX`]).
    in_flight: usize,
    /// Bytes of the batches those commits write.
    in_flight_bytes: usize,
    /// A commit in flight seals a segment: no other commit may start beside it.
    rolling: bool,
    /// Sequence number of the next commit to start, and of the one whose turn it is to finish
    /// (commits finish, and acknowledge, in the order they started).
    next_seq: u64,
    turn_seq: u64,
    /// Set while a failed commit waits for the ones started after it (they fail too) before it
    /// repairs the tail; no commit starts meanwhile.
    failure: Option<StorageError>,
    poisoned: bool,
    /// A suffix is being removed (`truncate_from`): nothing may be staged meanwhile.
    truncating: bool,
    closed: bool,
    flush_gen: u64,
    waiters: Vec<Waker>,
    /// Recently committed chunks by (segment base, position), evicted oldest first.
    cache: BTreeMap<(u64, u64), Bytes>,
    cache_order: VecDeque<(u64, u64)>,
    cache_bytes: usize,
    index_cache: VecDeque<(u64, Rc<SealedIndexes>)>,
    index_cache_bytes: usize,
    /// Disk reads in flight by (segment base, position, length), with the readers waiting to
    /// share each one's bytes (`Log::read_window`).
    reads_in_flight: std::collections::HashMap<(u64, u64, usize), Vec<read::WindowWaiter>>,
    stats: LogStats,
}

/// A partition log in a directory of segments.
pub struct Log<F: Fs> {
    fs: F,
    dir: PathBuf,
    config: LogConfig,
    inner: RefCell<Inner<F>>,
}

impl<F: Fs> Log<F> {
    /// Counts and logs corrupt data found (recovery or a read), and makes its error: the one
    /// way corruption is reported, so none goes unlogged.
    fn corruption(&self, path: PathBuf, position: u64, reason: String) -> StorageError {
        self.inner.borrow_mut().stats.corruptions_detected += 1;
        tracing::error!(path = %path.display(), position, %reason, "corrupt data detected; not served");
        StorageError::Corruption {
            path,
            position,
            reason,
        }
    }

    fn path(&self, base: u64, ext: &str) -> PathBuf {
        self.dir.join(segment_file_name(base, ext))
    }

    fn io_err(&self, op: &'static str, base: u64, ext: &str, e: std::io::Error) -> StorageError {
        StorageError::io(op, self.path(base, ext), e)
    }

    /// The first offset still in the log.
    pub fn start_offset(&self) -> u64 {
        *self
            .inner
            .borrow()
            .segments
            .keys()
            .next()
            .expect("a log has a segment")
    }

    /// One past the last durable offset: what readers can see.
    pub fn end_offset(&self) -> u64 {
        self.inner
            .borrow()
            .segments
            .values()
            .next_back()
            .expect("a log has a segment")
            .next_offset
    }

    pub fn stats(&self) -> LogStats {
        self.inner.borrow().stats.clone()
    }

    pub fn segments(&self) -> Vec<SegmentInfo> {
        self.inner
            .borrow()
            .segments
            .values()
            .map(|s| SegmentInfo {
                base_offset: s.base,
                next_offset: s.next_offset,
                size_bytes: s.size,
                max_timestamp_ms: s.max_ts,
                sealed: s.is_sealed(),
            })
            .collect()
    }

    pub fn size_bytes(&self) -> u64 {
        self.inner.borrow().segments.values().map(|s| s.size).sum()
    }

    /// Commits what is staged, writes the active segment's index durably and closes the log.
    pub async fn close(&self) -> Result<()> {
        loop {
            let (staged, in_flight) = {
                let i = self.inner.borrow();
                (!i.staged.is_empty(), i.in_flight > 0)
            };
            if in_flight || (staged && !self.commit().await) {
                self.wait_flush_gen().await;
            } else if !staged {
                break;
            }
        }
        let (base, index, timeindex, file) = {
            let mut i = self.inner.borrow_mut();
            i.closed = true;
            let s = i.segments.values().next_back().expect("active segment");
            (
                s.base,
                s.active().index.bytes().to_vec(),
                s.active().timeindex.bytes().to_vec(),
                s.file.clone(),
            )
        };
        self.write_index_file(base, "index", &index, 0, true)
            .await?;
        self.write_index_file(base, "timeindex", &timeindex, 0, true)
            .await?;
        file.close()
            .await
            .map_err(|e| StorageError::io("close", self.path(base, "log"), e))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn config(&self) -> &LogConfig {
        &self.config
    }
}
