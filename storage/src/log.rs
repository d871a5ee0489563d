//! The partition log: segments, group commit, reads by offset and time, recovery, retention.
//!
//! One `Log` is owned by one shard (thread); it is not `Send`. Appends are staged in memory and
//! committed in groups: whoever waits on an uncommitted batch while a commit may start becomes
//! the committer, writes what is staged in one durable (O_DSYNC) write, and wakes the others.
//! A second commit may start while one is in flight (from the next block boundary, leaving a
//! gap of zeros that readers step over); commits take effect in the order they started. An
//! append resolves only after its bytes (and any segment file it needed) are durable, and after
//! every batch before it. Only durable bytes are ever read.

use crate::batch::{self, BatchHeader, BatchView, Record, BATCH_HEADER_BYTES};
use crate::config::LogConfig;
use crate::error::{Result, StorageError};
use crate::fs::{align_down, align_up, File, Fs, BLOCK_BYTES};
use crate::index::{OffsetEntry, OffsetIndex, TimeEntry, TimeIndex};
use bytes::Bytes;
use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

/// Disk reads of batches are done in windows of this size (or one batch, if larger).
const READ_WINDOW_BYTES: usize = 256 * 1024;
/// Zeros are written in pieces of this size when pre-filling segment space.
const ZERO_FILL_PIECE_BYTES: usize = 1024 * 1024;
/// Zero-ahead step: at most this much zeroing (or one commit's size, if larger) rides along
/// with a commit. Small, because the disk serves a durable write queued behind a zero write
/// only after it: measured with fio on the AMD host, 20 KiB O_DSYNC writes beside 1 MiB zero
/// writes at the same pace had p99 3.2 ms, beside 256 KiB ones 0.85 ms (alone 0.2 ms); the
/// storage bench's 20 KiB appends went from p99 4.1-4.3 to 1.4 ms at one appender (5.4-6.6
/// to 1.6-2.7 ms at two and four) at even or better appends/s.
const ZERO_AHEAD_STEP_BYTES: u64 = 256 * 1024;
/// Only commits smaller than this carry zero-ahead (small fdatasyncs are the ones an extension
/// makes 2-4x slower; large ones are bandwidth, which zeroing would halve).
const ZERO_AHEAD_CHUNK_BYTES_MAX: usize = 256 * 1024;

/// Group commits that may be in flight at once. A second one starts while the first is on
/// its way to the disk, so a batch staged meanwhile waits about one durable write instead of the
/// rest of that one and all of its own.
pub const COMMITS_IN_FLIGHT_MAX: usize = 2;
/// A commit starts beside others only while the bytes of all of them stay within this (and
/// within the write buffer): the overlap is for small, latency-bound commits; large ones are
/// bandwidth-bound and gain nothing from it.
const OVERLAP_BYTES_MAX: usize = 512 * 1024;

/// The term a log stamps on the batches it appends until told another ([`Log::set_term`]):
/// 0, no election held. The single-node broker never changes it; a replicated log stamps the
/// term of the leader that appends (from 1 on). Batches of format v1 read as term 0 too.
pub const SINGLE_NODE_TERM: u64 = 0;

pub fn segment_file_name(base: u64, ext: &str) -> String {
    format!("{base:020}.{ext}")
}

fn parse_segment_name(name: &str) -> Option<(u64, &str)> {
    let (stem, ext) = name.split_once('.')?;
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((stem.parse().ok()?, ext))
}

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
/// durable writes run ~150-400 µs p50 and 2-4 ms p99 (DESIGN §5): the buckets are finest there.
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

type Slot = Rc<RefCell<Option<Result<()>>>>;

struct StagedBatch {
    header: BatchHeader,
    /// Position within the chunk's bytes.
    at: usize,
    slot: Slot,
}

struct Chunk {
    /// Base offset of the segment this chunk goes to.
    segment: u64,
    /// Seal the current active segment and create `segment` first.
    roll: bool,
    /// The chunk's bytes, in order: each part holds whole batches (small ones coalesced,
    /// large ones alone, as they were staged).
    parts: Vec<Vec<u8>>,
    /// Bytes in `parts`.
    len: usize,
    batches: Vec<StagedBatch>,
}

impl Chunk {
    /// Appends a staged batch: one smaller than `coalesce_max` after a last part still smaller
    /// than that (copied), anything else as a part of its own (moved).
    fn push_bytes(&mut self, bytes: Vec<u8>, coalesce_max: usize) {
        self.len += bytes.len();
        match self.parts.last_mut() {
            Some(last) if bytes.len() < coalesce_max && last.len() < coalesce_max => {
                last.extend_from_slice(&bytes)
            }
            _ => self.parts.push(bytes),
        }
    }

    /// The last `n` bytes of `head` followed by the chunk's parts (`n` ≤ their length).
    fn last_bytes(&self, head: &[u8], n: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n);
        let mut skip = (head.len() + self.len) - n;
        for part in std::iter::once(head).chain(self.parts.iter().map(Vec::as_slice)) {
            if skip >= part.len() {
                skip -= part.len();
                continue;
            }
            out.extend_from_slice(&part[skip..]);
            skip = 0;
        }
        debug_assert_eq!(out.len(), n);
        out
    }
}

struct Segment<F: Fs> {
    base: u64,
    file: Rc<F::File>,
    /// Bytes of durable, verified batches.
    size: u64,
    next_offset: u64,
    first_ts: Option<i64>,
    max_ts: Option<i64>,
    sealed: bool,
    /// Active segment only: in-memory indexes (sealed ones are loaded through the cache).
    index: OffsetIndex,
    timeindex: TimeIndex,
    bytes_since_index: u64,
    index_persisted_entries: usize,
    /// Active segment only: bytes `[align_down(size), size)`, rewritten with each commit.
    tail: Vec<u8>,
    zeroed_until: u64,
    /// Active segment only: where the last commit started writes to (`size` when none is in
    /// flight); a commit started beside others writes from the next block boundary after it.
    write_end: u64,
    /// Active segment only: where a zero-ahead write in flight starts (`u64::MAX` if none). No
    /// commit may write data there until it lands.
    zeroing_from: u64,
}

struct SealedIndexes {
    index: OffsetIndex,
    timeindex: TimeIndex,
}

struct Inner<F: Fs> {
    segments: BTreeMap<u64, Segment<F>>,
    staged: Vec<Chunk>,
    staged_bytes: usize,
    /// Next offset to assign to a staged batch.
    next_offset: u64,
    /// The term stamped on staged batches (see [`SINGLE_NODE_TERM`]); it never decreases.
    term: u64,
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
    closed: bool,
    flush_gen: u64,
    waiters: Vec<Waker>,
    /// Recently committed chunks by (segment base, position), evicted oldest first.
    cache: BTreeMap<(u64, u64), Bytes>,
    cache_order: VecDeque<(u64, u64)>,
    cache_bytes: usize,
    index_cache: VecDeque<(u64, Rc<SealedIndexes>)>,
    index_cache_bytes: usize,
    stats: LogStats,
}

/// What one group commit writes (see `Log::start_commit`).
struct CommitJob {
    seq: u64,
    chunks: Vec<Chunk>,
    /// Where a commit started beside others writes (a block boundary); `None`: from the
    /// durable end.
    at: Option<u64>,
    bytes: usize,
    rolls: bool,
}

impl<F: Fs> Inner<F> {
    fn finish_commit(&mut self, seq: u64, bytes: usize, rolls: bool) {
        self.in_flight -= 1;
        self.in_flight_bytes -= bytes;
        self.turn_seq = self.turn_seq.max(seq + 1);
        if rolls {
            self.rolling = false;
        }
    }
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

    /// Opens (or creates) the log in `dir`, recovering the active segment.
    pub async fn open(fs: F, dir: impl Into<PathBuf>, config: LogConfig) -> Result<Log<F>> {
        config.validate()?;
        let dir = dir.into();
        fs.create_dir_all(&dir)
            .await
            .map_err(|e| StorageError::io("create_dir", &dir, e))?;
        let names = fs
            .list(&dir)
            .await
            .map_err(|e| StorageError::io("list", &dir, e))?;
        let mut bases: Vec<u64> = names
            .iter()
            .filter_map(|n| parse_segment_name(n))
            .filter(|(_, ext)| *ext == "log")
            .map(|(b, _)| b)
            .collect();
        bases.sort_unstable();
        let log = Log {
            fs: fs.clone(),
            dir: dir.clone(),
            config,
            inner: RefCell::new(Inner {
                segments: BTreeMap::new(),
                staged: Vec::new(),
                staged_bytes: 0,
                next_offset: 0,
                term: SINGLE_NODE_TERM,
                proj_segment: 0,
                proj_size: 0,
                proj_first_ts: None,
                in_flight: 0,
                in_flight_bytes: 0,
                rolling: false,
                next_seq: 0,
                turn_seq: 0,
                failure: None,
                poisoned: false,
                closed: false,
                flush_gen: 0,
                waiters: Vec::new(),
                cache: BTreeMap::new(),
                cache_order: VecDeque::new(),
                cache_bytes: 0,
                index_cache: VecDeque::new(),
                index_cache_bytes: 0,
                stats: LogStats::default(),
            }),
        };
        // The layout version, before anything in the directory is touched: a newer one than
        // this code knows is refused (see `crate::format`).
        let format = crate::format::read_version(&fs, &dir)
            .await
            .map_err(|e| match e {
                StorageError::Corruption {
                    path,
                    position,
                    reason,
                } => log.corruption(path, position, reason),
                e => e,
            })?;
        // Index files whose segment is gone (a crash during deletion) are removed.
        let mut removed_orphan = false;
        for n in &names {
            let orphan = match parse_segment_name(n) {
                Some((b, "index" | "timeindex")) => bases.binary_search(&b).is_err(),
                _ => n.ends_with(".tmp"),
            };
            if orphan {
                let p = dir.join(n);
                fs.remove(&p)
                    .await
                    .map_err(|e| StorageError::io("remove", &p, e))?;
                removed_orphan = true;
            }
        }
        if removed_orphan {
            fs.sync_dir(&dir)
                .await
                .map_err(|e| StorageError::io("sync_dir", &dir, e))?;
        }
        if bases.is_empty() {
            log.create_segment(0).await?;
        } else {
            for (i, &b) in bases.iter().enumerate() {
                let next = bases.get(i + 1).copied();
                match next {
                    Some(next_base) => log.open_sealed(b, next_base).await?,
                    None => log.recover_active(b).await?,
                }
            }
        }
        if format != crate::format::SEGMENT_FORMAT_VERSION {
            // Durable before the log takes an append in the current format.
            crate::format::write_version(&fs, &dir).await?;
        }
        {
            let mut inner = log.inner.borrow_mut();
            let (&base, active) = inner
                .segments
                .iter()
                .next_back()
                .expect("a log has an active segment");
            let (size, first_ts, next) = (active.size, active.first_ts, active.next_offset);
            inner.next_offset = next;
            inner.proj_segment = base;
            inner.proj_size = size;
            inner.proj_first_ts = first_ts;
        }
        Ok(log)
    }

    async fn open_sealed(&self, base: u64, next_base: u64) -> Result<()> {
        let file = self
            .fs
            .open(&self.path(base, "log"), false)
            .await
            .map_err(|e| self.io_err("open", base, "log", e))?;
        let size = file
            .size()
            .await
            .map_err(|e| self.io_err("stat", base, "log", e))?;
        let seg = Segment {
            base,
            file: Rc::new(file),
            size,
            next_offset: next_base,
            first_ts: None,
            max_ts: None,
            sealed: true,
            index: OffsetIndex::default(),
            timeindex: TimeIndex::default(),
            bytes_since_index: 0,
            index_persisted_entries: 0,
            tail: Vec::new(),
            zeroed_until: size,
            write_end: size,
            zeroing_from: u64::MAX,
        };
        self.inner.borrow_mut().segments.insert(base, seg);
        // The segment's newest timestamp (for retention and time lookups) comes from its time
        // index; a missing or damaged one is rebuilt from the log.
        let ix = self.sealed_indexes(base).await?;
        let max_ts = ix.timeindex.last().map(|e| e.max_timestamp_ms);
        if let Some(s) = self.inner.borrow_mut().segments.get_mut(&base) {
            s.max_ts = max_ts;
        }
        Ok(())
    }

    /// Creates an empty segment durably: file, zero-filled first chunk, directory entry.
    async fn create_segment(&self, base: u64) -> Result<()> {
        let path = self.path(base, "log");
        let file = self
            .fs
            .open(&path, true)
            .await
            .map_err(|e| StorageError::io("create", &path, e))?;
        let zeroed = align_up(
            self.config
                .prealloc_chunk_bytes
                .min(self.config.segment_bytes_max),
        );
        zero_fill(&file, 0, zeroed)
            .await
            .map_err(|e| StorageError::io("zero_fill", &path, e))?;
        file.truncate(zeroed)
            .await
            .map_err(|e| StorageError::io("truncate", &path, e))?;
        file.sync_data()
            .await
            .map_err(|e| StorageError::io("fdatasync", &path, e))?;
        self.fs
            .sync_dir(&self.dir)
            .await
            .map_err(|e| StorageError::io("sync_dir", &self.dir, e))?;
        let mut inner = self.inner.borrow_mut();
        inner.stats.fsyncs += 2;
        inner.segments.insert(
            base,
            Segment {
                base,
                file: Rc::new(file),
                size: 0,
                next_offset: base,
                first_ts: None,
                max_ts: None,
                sealed: false,
                index: OffsetIndex::default(),
                timeindex: TimeIndex::default(),
                bytes_since_index: 0,
                index_persisted_entries: 0,
                tail: Vec::new(),
                zeroed_until: zeroed,
                write_end: 0,
                zeroing_from: u64::MAX,
            },
        );
        Ok(())
    }

    /// Recovers the last segment: resumes from its last index entry that checks out, verifies
    /// every batch after it, and truncates a torn tail — or reports corruption when valid data
    /// lies beyond a bad batch further than any torn commit could reach.
    async fn recover_active(&self, base: u64) -> Result<()> {
        let path = self.path(base, "log");
        let file = self
            .fs
            .open(&path, false)
            .await
            .map_err(|e| StorageError::io("open", &path, e))?;
        let file_size = file
            .size()
            .await
            .map_err(|e| StorageError::io("stat", &path, e))?;
        let mut index = OffsetIndex::parse(&self.read_whole(base, "index").await);
        let mut timeindex = TimeIndex::parse(&self.read_whole(base, "timeindex").await);

        // The last index entry that points at a valid batch with the right offset.
        let mut start = (0u64, base, 0usize);
        for i in (0..index.len()).rev() {
            let e = index.get(i);
            if u64::from(e.position) >= file_size {
                continue;
            }
            if let Ok(Some(h)) = read_batch_header_verified(&file, u64::from(e.position)).await {
                if h.base_offset == base + u64::from(e.rel_offset) {
                    start = (u64::from(e.position), h.base_offset, i + 1);
                    break;
                }
            }
        }
        let (mut pos, mut expected, keep_entries) = start;
        index.truncate_entries(keep_entries);
        let rel_limit = (expected - base) as u32;
        let keep_time = (0..timeindex.len())
            .take_while(|&i| timeindex.get(i).rel_offset <= rel_limit)
            .count();
        timeindex.truncate_entries(keep_time);
        let mut max_ts = timeindex.last().map(|e| e.max_timestamp_ms);
        let mut first_ts = None;
        if pos == 0 {
            max_ts = None;
        } else if let Ok(Some(b)) = read_batch_verified(&file, 0, file_size).await {
            first_ts = Some(b.header.first_timestamp_ms);
        }
        let mut since_index = 0u64;
        let mut bad_at = None;
        while pos < file_size {
            let b = match read_batch_verified(&file, pos, file_size).await {
                Ok(Some(b)) if b.header.base_offset == expected => b,
                found => {
                    if padding_gap(&file, pos, expected, file_size).await {
                        pos = align_up(pos);
                        continue;
                    }
                    if !matches!(found, Ok(None)) {
                        bad_at = Some(pos);
                    }
                    break; // zeros: the clean end
                }
            };
            let h = b.header;
            if pos == 0 {
                first_ts = Some(h.first_timestamp_ms);
            }
            if since_index >= self.config.index_interval_bytes {
                let rel = (h.base_offset - base) as u32;
                if index.last().is_none_or(|l| l.rel_offset < rel) {
                    index.push(OffsetEntry {
                        rel_offset: rel,
                        position: pos as u32,
                    });
                    let m = max_ts.map_or(h.max_timestamp_ms, |m| m.max(h.max_timestamp_ms));
                    timeindex.push(TimeEntry {
                        max_timestamp_ms: m,
                        rel_offset: rel,
                    });
                }
                since_index = 0;
            }
            max_ts = Some(max_ts.map_or(h.max_timestamp_ms, |m| m.max(h.max_timestamp_ms)));
            pos += u64::from(h.batch_len);
            since_index += u64::from(h.batch_len);
            expected = h.next_offset();
        }
        if let Some(bad) = bad_at {
            let window_end = bad + self.config.torn_window_bytes();
            if let Some(q) = find_valid_batch_from(&file, window_end, file_size).await {
                return Err(self.corruption(
                    path,
                    bad,
                    format!(
                        "invalid batch followed by valid data at byte {q}, beyond any torn write"
                    ),
                ));
            }
        }
        // Past the end, as far as a torn commit can reach, everything is zeroed durably: a torn
        // commit's bytes, or whole batches of a commit that landed while one started before it
        // did not (never acknowledged), must never be taken for batches once later commits
        // reach up to them. After a clean end only the second kind can be there, within the
        // reach of overlapping commits (a bounded read at every open, not a torn window's).
        let reach = match bad_at {
            Some(_) => self.config.torn_window_bytes(),
            None => self.overlap_reach_bytes(),
        };
        let scrub_end = (pos + reach).min(file_size);
        if any_nonzero(&file, pos, scrub_end)
            .await
            .map_err(|e| StorageError::io("read", &path, e))?
        {
            let tail = file
                .read_at(align_down(pos), (pos - align_down(pos)) as usize)
                .await
                .map_err(|e| StorageError::io("read", &path, e))?;
            let mut buf = tail;
            buf.resize((align_up(scrub_end) - align_down(pos)) as usize, 0);
            write_all(&file, align_down(pos), &buf)
                .await
                .map_err(|e| StorageError::io("write", &path, e))?;
            file.sync_data()
                .await
                .map_err(|e| StorageError::io("fdatasync", &path, e))?;
            let mut inner = self.inner.borrow_mut();
            inner.stats.torn_tail_bytes_truncated += scrub_end - pos;
            tracing::warn!(path = %path.display(), position = pos, "truncated torn tail of active segment");
        }
        let tail = file
            .read_at(align_down(pos), (pos - align_down(pos)) as usize)
            .await
            .map_err(|e| StorageError::io("read", &path, e))?;
        self.inner.borrow_mut().segments.insert(
            base,
            Segment {
                base,
                file: Rc::new(file),
                size: pos,
                next_offset: expected,
                first_ts,
                max_ts,
                sealed: false,
                index,
                timeindex,
                bytes_since_index: since_index,
                index_persisted_entries: keep_entries,
                tail,
                zeroed_until: align_up(file_size.max(pos)),
                write_end: pos,
                zeroing_from: u64::MAX,
            },
        );
        Ok(())
    }

    async fn read_whole(&self, base: u64, ext: &str) -> Vec<u8> {
        // Indexes are hints: an unreadable one is treated as missing and rebuilt.
        let Ok(f) = self.fs.open(&self.path(base, ext), false).await else {
            return Vec::new();
        };
        let Ok(size) = f.size().await else {
            return Vec::new();
        };
        f.read_at(0, size as usize).await.unwrap_or_default()
    }

    // ---------------------------------------------------------------- appends

    /// Appends records as one batch; resolves once it is durable.
    pub async fn append_records(&self, records: &[Record]) -> Result<AppendInfo> {
        let bytes = batch::encode(records)
            .ok_or(StorageError::InvalidBatch(crate::error::BatchError::Empty))?;
        self.append(bytes).await
    }

    /// Appends an encoded batch (as a producer sent it: verified here, then stored unchanged but
    /// for its base offset); resolves once it is durable.
    pub async fn append(&self, bytes: Vec<u8>) -> Result<AppendInfo> {
        self.wait_for_space(bytes.len()).await?;
        let ticket = self.stage_batch(bytes)?;
        self.durable(ticket).await
    }

    /// Waits until a batch of `len_bytes` fits in the write buffer (back-pressure). Callers that
    /// must keep an order between their own state and the log's (the queue engine) wait here
    /// first, then change their state and [`Log::stage_batch`] with no await in between.
    pub async fn wait_for_space(&self, len_bytes: usize) -> Result<()> {
        loop {
            self.check_writable()?;
            let (full, in_flight) = {
                let i = self.inner.borrow();
                (
                    i.staged_bytes > 0
                        && i.staged_bytes + len_bytes > self.config.write_buffer_bytes_max,
                    i.in_flight > 0,
                )
            };
            if !full {
                return Ok(());
            }
            if in_flight || !self.commit().await {
                self.wait_flush_gen().await;
            }
        }
    }

    /// The term stamped on the batches staged from now on.
    pub fn term(&self) -> u64 {
        self.inner.borrow().term
    }

    /// Sets the term stamped on the batches staged from now on (a leader's epoch: it only
    /// grows; a smaller one is a caller's bug).
    pub fn set_term(&self, term: u64) {
        let mut i = self.inner.borrow_mut();
        assert!(
            term >= i.term,
            "a log's term never decreases ({} -> {term})",
            i.term
        );
        i.term = term;
    }

    /// Verifies a batch and stages it at the end of the log, synchronously: batches are
    /// committed in the order they were staged. The batch is not durable until
    /// [`Log::durable`] resolves for the returned ticket. May exceed the write buffer by one
    /// batch if the caller skipped [`Log::wait_for_space`].
    ///
    /// The log stores the current batch format (v2): a v1 batch from an older producer is
    /// rewritten as v2 once verified ([`batch::upgraded`]); a v2 batch is stored in the bytes it
    /// came in, but for the base offset and term the log stamps.
    pub fn stage_batch(&self, bytes: Vec<u8>) -> Result<AppendTicket> {
        if bytes.len() > self.config.batch_bytes_max {
            return Err(crate::error::BatchError::TooLarge {
                size_bytes: bytes.len(),
                limit_bytes: self.config.batch_bytes_max,
            }
            .into());
        }
        let view = BatchView::parse(&bytes)?;
        view.validate_records()?;
        if view.bytes.len() != bytes.len() {
            return Err(crate::error::BatchError::BadLength(view.header.batch_len).into());
        }
        let bytes = if view.header.version == batch::BATCH_FORMAT_VERSION {
            bytes
        } else {
            batch::upgraded(&view)
        };
        self.check_writable()?;
        let (info, slot) = self.stage(bytes);
        Ok(AppendTicket { info, slot })
    }

    /// Resolves when the staged batch is durable (driving a group commit if one may start).
    pub async fn durable(&self, ticket: AppendTicket) -> Result<AppendInfo> {
        loop {
            if let Some(r) = ticket.slot.borrow_mut().take() {
                return r.map(|()| ticket.info);
            }
            let may_start = {
                let i = self.inner.borrow();
                i.failure.is_none()
                    && !i.staged.is_empty()
                    && (i.in_flight == 0 || (i.in_flight < COMMITS_IN_FLIGHT_MAX && !i.rolling))
            };
            if may_start {
                // Gather first: every task that is ready to run now (requests just decoded,
                // long polls just woken) gets to stage before the commit takes what is staged,
                // instead of waiting a whole commit for the next one.
                crate::fs::yield_now().await;
                if self.commit().await || ticket.slot.borrow().is_some() {
                    continue;
                }
            }
            // Every reason a commit could not start ends when one in flight finishes (and the
            // flush generation is read now, with no await since the checks above).
            self.wait_flush_gen().await;
        }
    }

    fn check_writable(&self) -> Result<()> {
        let i = self.inner.borrow();
        if i.closed {
            Err(StorageError::Closed)
        } else if i.poisoned {
            Err(StorageError::Poisoned)
        } else {
            Ok(())
        }
    }

    fn stage(&self, mut bytes: Vec<u8>) -> (AppendInfo, Slot) {
        let mut guard = self.inner.borrow_mut();
        let i = &mut *guard;
        let mut header = BatchHeader::parse(&bytes).expect("verified by the caller");
        header.base_offset = i.next_offset;
        header.term = i.term;
        batch::set_base_offset(&mut bytes, header.base_offset);
        batch::set_term(&mut bytes, header.term).expect("staged batches are in the current format");
        let len = bytes.len() as u64;
        let too_big = i.proj_size > 0 && i.proj_size + len > self.config.segment_bytes_max;
        let too_old = match (i.proj_first_ts, self.config.segment_age_ms_max) {
            (Some(first), Some(age)) if i.proj_size > 0 => {
                header.max_timestamp_ms.saturating_sub(first) >= age as i64
            }
            _ => false,
        };
        let roll = too_big || too_old;
        if roll {
            i.proj_segment = header.base_offset;
            i.proj_size = 0;
            i.proj_first_ts = None;
        }
        let needs_new_chunk = roll || i.staged.last().is_none_or(|c| c.segment != i.proj_segment);
        if needs_new_chunk {
            i.staged.push(Chunk {
                segment: i.proj_segment,
                roll,
                parts: Vec::new(),
                len: 0,
                batches: Vec::new(),
            });
        }
        let chunk = i.staged.last_mut().expect("pushed above");
        let slot: Slot = Rc::new(RefCell::new(None));
        chunk.batches.push(StagedBatch {
            header,
            at: chunk.len,
            slot: slot.clone(),
        });
        i.staged_bytes += bytes.len();
        // A large batch moves in: it is never copied to be staged.
        chunk.push_bytes(bytes, self.config.coalesce_batch_bytes_max);
        i.proj_size += len;
        i.proj_first_ts.get_or_insert(header.first_timestamp_ms);
        i.next_offset = header.next_offset();
        (
            AppendInfo {
                base_offset: header.base_offset,
                last_offset: header.last_offset(),
            },
            slot,
        )
    }

    fn wait_flush_gen(&self) -> WaitGen<'_, F> {
        WaitGen {
            log: self,
            seen: self.inner.borrow().flush_gen,
        }
    }

    fn wake_all(&self) {
        let wakers = {
            let mut i = self.inner.borrow_mut();
            i.flush_gen += 1;
            std::mem::take(&mut i.waiters)
        };
        for w in wakers {
            w.wake();
        }
    }

    /// The furthest past the durable end that commits in flight together can write: the bytes
    /// they may hold, a partial block rewritten and a block skipped by each.
    fn overlap_reach_bytes(&self) -> u64 {
        self.overlap_bytes_max() as u64 + (COMMITS_IN_FLIGHT_MAX as u64 + 2) * BLOCK_BYTES
    }

    /// The bytes commits in flight together may hold when one started beside another.
    fn overlap_bytes_max(&self) -> usize {
        OVERLAP_BYTES_MAX.min(self.config.write_buffer_bytes_max)
    }

    /// Takes what the next commit writes, if one may start now. With none in flight: everything
    /// staged, written from the durable end (rewriting its partial last block). Beside commits
    /// in flight: the first staged chunk, written from the block boundary after their end, so
    /// no two writes in flight share a block (the disk may land them in any order); the bytes
    /// skipped are zeros, which readers step over (see `scan`). A chunk that seals a segment,
    /// or that would not fit beside the ones in flight, waits until none is.
    fn start_commit(&self) -> Option<CommitJob> {
        let mut guard = self.inner.borrow_mut();
        let i = &mut *guard;
        if i.staged.is_empty() || i.failure.is_some() {
            return None;
        }
        let (chunks, at) = if i.in_flight == 0 {
            let chunks = std::mem::take(&mut i.staged);
            i.staged_bytes = 0;
            (chunks, None)
        } else {
            let first = &i.staged[0];
            if i.in_flight >= COMMITS_IN_FLIGHT_MAX
                || i.rolling
                || first.roll
                || i.in_flight_bytes + first.len > self.overlap_bytes_max()
            {
                return None;
            }
            let (&base, s) = i.segments.iter_mut().next_back()?;
            let at = align_up(s.write_end);
            let end = at + first.len as u64;
            if first.segment != base
                || end > self.config.segment_bytes_max
                || align_up(end) > s.zeroing_from
            {
                return None;
            }
            let gap = at - s.write_end;
            s.write_end = end;
            let chunk = i.staged.remove(0);
            i.staged_bytes -= chunk.len;
            if chunk.segment == i.proj_segment {
                i.proj_size += gap;
            }
            i.stats.commits_overlapped += 1;
            (vec![chunk], Some(at))
        };
        let rolls = chunks.iter().any(|c| c.roll);
        i.rolling |= rolls;
        let bytes = chunks.iter().map(|c| c.len).sum();
        i.in_flight += 1;
        i.in_flight_bytes += bytes;
        let seq = i.next_seq;
        i.next_seq += 1;
        Some(CommitJob {
            seq,
            chunks,
            at,
            bytes,
            rolls,
        })
    }

    /// Runs one group commit, if one may start (returns whether it did). Results go to each
    /// batch's slot, in the order the commits started.
    async fn commit(&self) -> bool {
        let Some(job) = self.start_commit() else {
            return false;
        };
        let CommitJob {
            seq,
            mut chunks,
            at,
            bytes,
            rolls,
        } = job;
        let mut guard = CommitGuard {
            log: self,
            seq,
            bytes,
            rolls,
            slots: chunks
                .iter()
                .flat_map(|c| &c.batches)
                .map(|b| b.slot.clone())
                .collect(),
            armed: true,
        };
        for n in 0..chunks.len() {
            let chunk = &mut chunks[n];
            let result = async {
                if self.inner.borrow().poisoned {
                    return Err(StorageError::Poisoned);
                }
                if chunk.roll {
                    self.roll(chunk.segment).await?;
                }
                self.write_chunk(chunk, at, seq).await
            }
            .await;
            match result {
                Ok(()) => {
                    for b in &chunk.batches {
                        *b.slot.borrow_mut() = Some(Ok(()));
                    }
                }
                Err(e) => {
                    for b in chunks[n..].iter().flat_map(|c| &c.batches) {
                        *b.slot.borrow_mut() = Some(Err(e.duplicate()));
                    }
                    self.wait_turn(seq).await;
                    // A failure of an earlier commit failed this one too; that one repairs.
                    if self.inner.borrow().failure.is_none() {
                        self.fail_commit(&e, seq).await;
                    }
                    break;
                }
            }
        }
        guard.armed = false;
        self.inner.borrow_mut().finish_commit(seq, bytes, rolls);
        self.wake_all();
        true
    }

    /// Waits until every commit started before `seq` has finished.
    async fn wait_turn(&self, seq: u64) {
        loop {
            {
                let i = self.inner.borrow();
                if i.turn_seq >= seq || i.poisoned {
                    return;
                }
            }
            self.wait_flush_gen().await;
        }
    }

    /// After a failed commit (at its turn): fail the commits started after it and every batch
    /// staged meanwhile (their offsets assumed the failed ones), reset the next offset to the
    /// durable end, and zero whatever the failed writes may have left beyond it. If that repair
    /// fails too, the log becomes read-only (poisoned).
    async fn fail_commit(&self, e: &StorageError, seq: u64) {
        tracing::error!(error = %e, "commit failed");
        {
            let mut i = self.inner.borrow_mut();
            i.failure = Some(e.duplicate());
            i.turn_seq = i.turn_seq.max(seq + 1);
        }
        self.wake_all();
        while self.inner.borrow().in_flight > 1 {
            self.wait_flush_gen().await;
        }
        let (active_base, staged) = {
            let mut i = self.inner.borrow_mut();
            i.stats.commit_failures += 1;
            let staged = std::mem::take(&mut i.staged);
            i.staged_bytes = 0;
            let (&base, active) = i.segments.iter_mut().next_back().expect("active segment");
            active.write_end = active.size;
            let (size, first_ts, next) = (active.size, active.first_ts, active.next_offset);
            i.next_offset = next;
            i.proj_segment = base;
            i.proj_size = size;
            i.proj_first_ts = first_ts;
            (base, staged)
        };
        for b in staged.iter().flat_map(|c| &c.batches) {
            *b.slot.borrow_mut() = Some(Err(e.duplicate()));
        }
        if let Err(re) = self.repair_tail(active_base).await {
            tracing::error!(error = %re, "repair after a failed commit failed; log is read-only");
            self.inner.borrow_mut().poisoned = true;
        }
        self.inner.borrow_mut().failure = None;
    }

    async fn repair_tail(&self, base: u64) -> Result<()> {
        let (file, size, tail) = {
            let i = self.inner.borrow();
            let s = i.segments.get(&base).expect("active segment");
            (s.file.clone(), s.size, s.tail.clone())
        };
        let end = (size + self.config.torn_window_bytes()).min(self.config.segment_bytes_max);
        let mut buf = tail;
        buf.resize((align_up(end) - align_down(size)) as usize, 0);
        let path = self.path(base, "log");
        write_all(&*file, align_down(size), &buf)
            .await
            .map_err(|e| StorageError::io("write", &path, e))?;
        file.sync_data()
            .await
            .map_err(|e| StorageError::io("fdatasync", &path, e))?;
        let mut i = self.inner.borrow_mut();
        if let Some(s) = i.segments.get_mut(&base) {
            s.zeroed_until = s.zeroed_until.max(align_up(end));
        }
        Ok(())
    }
}

impl<F: Fs> Log<F> {
    /// Seals the active segment (exact size, index files, all durable) and creates the next.
    async fn roll(&self, new_base: u64) -> Result<()> {
        let (old_base, file, size, index_bytes, timeindex) = {
            let mut i = self.inner.borrow_mut();
            let (&b, s) = i.segments.iter_mut().next_back().expect("active segment");
            if let (Some(m), Some(_)) = (s.max_ts, s.first_ts) {
                let rel = u32::try_from(s.next_offset - 1 - b).expect("segment offsets fit u32");
                s.timeindex.push(TimeEntry {
                    max_timestamp_ms: m,
                    rel_offset: rel,
                });
            }
            (
                b,
                s.file.clone(),
                s.size,
                s.index.bytes().to_vec(),
                s.timeindex.clone(),
            )
        };
        let path = self.path(old_base, "log");
        file.truncate(size)
            .await
            .map_err(|e| StorageError::io("truncate", &path, e))?;
        file.sync_data()
            .await
            .map_err(|e| StorageError::io("fdatasync", &path, e))?;
        if let Some(s) = self.inner.borrow_mut().segments.get_mut(&old_base) {
            s.zeroed_until = size;
        }
        self.write_index_file(old_base, "index", &index_bytes, 0, true)
            .await?;
        self.write_index_file(old_base, "timeindex", timeindex.bytes(), 0, true)
            .await?;
        if let Err(e) = self.create_segment(new_base).await {
            // The old segment stays active; a half-created successor must not survive a crash,
            // or recovery would end the old segment at `new_base`.
            let p = self.path(new_base, "log");
            if self.fs.exists(&p).await {
                let cleaned = async {
                    self.fs.remove(&p).await?;
                    self.fs.sync_dir(&self.dir).await
                }
                .await;
                if cleaned.is_err() {
                    self.inner.borrow_mut().poisoned = true;
                }
            }
            return Err(e);
        }
        let mut i = self.inner.borrow_mut();
        let s = i.segments.get_mut(&old_base).expect("old segment");
        s.sealed = true;
        s.tail = Vec::new();
        let index = std::mem::take(&mut s.index);
        let timeindex = std::mem::take(&mut s.timeindex);
        i.stats.fsyncs += 3;
        insert_index_cache(
            &mut i,
            old_base,
            Rc::new(SealedIndexes { index, timeindex }),
            self.config.index_cache_bytes_max,
        );
        Ok(())
    }

    /// Writes `bytes[from..]` of an index file (whole blocks from `align_down(from)`).
    async fn write_index_file(
        &self,
        base: u64,
        ext: &str,
        bytes: &[u8],
        from: usize,
        sync: bool,
    ) -> Result<()> {
        let path = self.path(base, ext);
        let f = self
            .fs
            .open(&path, true)
            .await
            .map_err(|e| StorageError::io("open", &path, e))?;
        let start = align_down(from as u64) as usize;
        let mut buf = bytes[start..].to_vec();
        buf.resize(align_up(buf.len() as u64) as usize, 0);
        if !buf.is_empty() {
            write_all(&f, start as u64, &buf)
                .await
                .map_err(|e| StorageError::io("write", &path, e))?;
        }
        if sync {
            f.sync_data()
                .await
                .map_err(|e| StorageError::io("fdatasync", &path, e))?;
        }
        Ok(())
    }

    /// Writes one chunk into the active segment with one durable (O_DSYNC) write: from the
    /// durable end, or from `at` (a block boundary) for a commit started beside others. Takes
    /// the commit's results into the segment at its turn (`seq`).
    async fn write_chunk(&self, chunk: &mut Chunk, at: Option<u64>, seq: u64) -> Result<()> {
        let seg_max = align_up(self.config.segment_bytes_max);
        let (base, file, start, tail, zero) = {
            let mut i = self.inner.borrow_mut();
            let (&b, s) = i.segments.iter_mut().next_back().expect("active segment");
            assert_eq!(b, chunk.segment, "a chunk goes to the active segment");
            let (start, tail) = match at {
                Some(p) => (p, Vec::new()),
                None => (s.size, s.tail.clone()),
            };
            let data_end = align_up(start + chunk.len as u64);
            // Zero-ahead: keep about `prealloc_chunk_bytes` of zeroed space past the data, so
            // that commits overwrite allocated blocks (their flush need not journal an
            // extension). The zeros go out in steps, plain writes concurrent with this commit's
            // durable data write — never as a separate stall of a whole chunk plus its own sync.
            // They need no sync of their own: the first durable write into a step makes its
            // allocation durable with it, as O_DSYNC does for whatever metadata reading the
            // data back needs. Only a commit with none beside it zeroes; the range is claimed
            // now, and no commit writes data into it until it lands (`start_commit`).
            let want_until = (data_end + self.config.prealloc_chunk_bytes).min(seg_max);
            // A large commit skips it: its flush's extension cost is spread over many bytes,
            // while zeroing ahead of it would double the bytes written (measured, 512 KiB
            // commits: 377-395 MB/s with zero-ahead, 484-575 MB/s without; fio 1.0-1.35 GB/s).
            let small = chunk.len < ZERO_AHEAD_CHUNK_BYTES_MAX;
            let zero = (at.is_none() && small && s.zeroed_until < want_until)
                .then(|| {
                    let from = s.zeroed_until.max(data_end);
                    let step = ZERO_AHEAD_STEP_BYTES.max(data_end - align_down(start));
                    (from, (from + step).min(seg_max))
                })
                .filter(|(from, to)| from < to);
            if let Some((from, to)) = zero {
                s.zeroed_until = to;
                s.zeroing_from = from;
            }
            if at.is_none() {
                s.write_end = start + chunk.len as u64;
            }
            (b, s.file.clone(), start, tail, zero)
        };
        let path = self.path(base, "log");
        let end = start + chunk.len as u64;
        let wpos = align_down(start);
        let data_end = align_up(end);
        let len = (data_end - wpos) as usize;
        // The data goes out in durable writes (O_DSYNC): one io_uring operation, where a write
        // then an fdatasync took two, the second handed to a kernel worker thread (measured,
        // 4 KiB appends at concurrency 16: 17.8-23.5k appends/s with fdatasync, 36.2-37.1k).
        let started = std::time::Instant::now();
        // The rewritten partial tail block and the chunk's parts go straight into the I/O
        // buffer: the one copy of each byte on its way to disk.
        let data_write = async {
            let parts: Vec<&[u8]> = std::iter::once(tail.as_slice())
                .chain(chunk.parts.iter().map(Vec::as_slice))
                .collect();
            let n = file.write_durable_parts(wpos, &parts, len).await?;
            if n < len {
                // A short write: the rest from a contiguous copy (rare; not worth avoiding).
                let done = advanced(n)?;
                let mut buf = parts.concat();
                buf.resize(len, 0);
                write_all_with(&*file, wpos + done as u64, &buf[done..], true).await?;
            }
            Ok(())
        };
        let data_write = async {
            data_write
                .await
                .map_err(|e| StorageError::io("write", &path, e))
        };
        let written = match zero {
            Some((from, to)) => {
                let zeros = async {
                    zero_fill(&*file, from, to)
                        .await
                        .map_err(|e| StorageError::io("zero_fill", &path, e))
                };
                let (written, zeroed) = futures::join!(data_write, zeros);
                let mut i = self.inner.borrow_mut();
                if let Some(s) = i.segments.get_mut(&base) {
                    s.zeroing_from = u64::MAX;
                    if zeroed.is_err() {
                        s.zeroed_until = s.zeroed_until.min(from);
                    }
                }
                written.and(zeroed)
            }
            None => data_write.await,
        };
        let fsync_took = started.elapsed();
        written?;
        {
            let mut i = self.inner.borrow_mut();
            i.stats.fsync.observe(fsync_took);
            if let Some(s) = i.segments.get_mut(&base) {
                s.zeroed_until = s.zeroed_until.max(data_end);
            }
        }
        // Commits take effect, and are acknowledged, in the order they started.
        self.wait_turn(seq).await;
        {
            let i = self.inner.borrow();
            if let Some(e) = &i.failure {
                return Err(e.duplicate());
            }
            if i.poisoned {
                return Err(StorageError::Poisoned);
            }
        }

        let persist = {
            let mut guard = self.inner.borrow_mut();
            let i = &mut *guard;
            let s = i.segments.get_mut(&base).expect("active segment");
            let mut records = 0u64;
            for b in &chunk.batches {
                let h = b.header;
                let pos = start + b.at as u64;
                if s.bytes_since_index >= self.config.index_interval_bytes {
                    let rel = u32::try_from(h.base_offset - base).expect("segment offsets fit u32");
                    s.index.push(OffsetEntry {
                        rel_offset: rel,
                        position: u32::try_from(pos).expect("segment < 4 GiB"),
                    });
                    let m = s
                        .max_ts
                        .map_or(h.max_timestamp_ms, |m| m.max(h.max_timestamp_ms));
                    s.timeindex.push(TimeEntry {
                        max_timestamp_ms: m,
                        rel_offset: rel,
                    });
                    s.bytes_since_index = 0;
                }
                s.bytes_since_index += u64::from(h.batch_len);
                s.first_ts.get_or_insert(h.first_timestamp_ms);
                s.max_ts = Some(
                    s.max_ts
                        .map_or(h.max_timestamp_ms, |m| m.max(h.max_timestamp_ms)),
                );
                s.next_offset = h.next_offset();
                records += u64::from(h.record_count);
            }
            s.size = end;
            // The new partial last block: [align_down(end), end) of tail ++ chunk.
            s.tail = chunk.last_bytes(&tail, (end - align_down(end)) as usize);
            let persist = (s.index.len() - s.index_persisted_entries
                >= self.config.index_persist_entries)
                .then(|| {
                    let from = s.index_persisted_entries;
                    s.index_persisted_entries = s.index.len();
                    (s.index.bytes().to_vec(), from, s.timeindex.bytes().to_vec())
                });
            i.stats.commits += 1;
            i.stats.fsyncs += 1;
            i.stats.batches_appended += chunk.batches.len() as u64;
            i.stats.records_appended += records;
            i.stats.bytes_appended += chunk.len as u64;
            // Keep the chunk's parts for tail reads, each at its position (they are not needed
            // any more: moved, not copied).
            let mut at = start;
            for part in std::mem::take(&mut chunk.parts) {
                let len = part.len();
                i.cache_bytes += len;
                i.cache.insert((base, at), Bytes::from(part));
                i.cache_order.push_back((base, at));
                at += len as u64;
            }
            while i.cache_bytes > self.config.read_cache_bytes_max {
                let Some(k) = i.cache_order.pop_front() else {
                    break;
                };
                if let Some(b) = i.cache.remove(&k) {
                    i.cache_bytes -= b.len();
                }
            }
            persist
        };
        if let Some((index, from, timeindex)) = persist {
            // A hint for faster recovery: not synced, verified when used.
            let _ = self
                .write_index_file(base, "index", &index, from * 8, false)
                .await;
            let _ = self
                .write_index_file(base, "timeindex", &timeindex, 0, false)
                .await;
        }
        Ok(())
    }

    // ---------------------------------------------------------------- reads

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
                sealed: s.sealed,
            })
            .collect()
    }

    pub fn size_bytes(&self) -> u64 {
        self.inner.borrow().segments.values().map(|s| s.size).sum()
    }

    /// Reads whole, verified batches from `offset` on, at least one batch (if any) and then up
    /// to about `max_bytes`. Only durable data is returned. Corrupted data is an error, never
    /// returned.
    pub async fn read(&self, offset: u64, max_bytes: usize) -> Result<Vec<ReadBatch>> {
        let (start, end) = (self.start_offset(), self.end_offset());
        if offset < start || offset > end {
            return Err(StorageError::OffsetOutOfRange { offset, start, end });
        }
        let mut out = Vec::new();
        let mut total = 0usize;
        let mut want = offset;
        while want < self.end_offset() && total < max_bytes {
            let Some((base, pos)) = self.position_for(want).await? else {
                break;
            };
            let mut done = false;
            self.scan(base, pos, want, |_, b| {
                if b.header.last_offset() < want {
                    return true;
                }
                want = b.header.next_offset();
                total += b.bytes.len();
                out.push(b);
                if total >= max_bytes {
                    done = true;
                }
                !done
            })
            .await?;
            if done {
                break;
            }
            // The segment ended: go on in the next one, if `want` lies there.
        }
        Ok(out)
    }

    /// The segment holding `offset` and a position at or before its batch.
    async fn position_for(&self, offset: u64) -> Result<Option<(u64, u64)>> {
        let (base, sealed) = {
            let i = self.inner.borrow();
            let Some((&b, s)) = i.segments.range(..=offset).next_back() else {
                return Ok(None);
            };
            if offset >= s.next_offset {
                return Ok(None);
            }
            if !s.sealed {
                let rel = (offset - b) as u32;
                return Ok(Some((
                    b,
                    s.index.floor(rel).map_or(0, |e| u64::from(e.position)),
                )));
            }
            (b, s.sealed)
        };
        debug_assert!(sealed);
        let ix = self.sealed_indexes(base).await?;
        let rel = (offset - base) as u32;
        Ok(Some((
            base,
            ix.index.floor(rel).map_or(0, |e| u64::from(e.position)),
        )))
    }

    /// Calls `f` with each verified batch of segment `base` from `pos` on, and its position,
    /// until it returns false or the segment ends; gaps (see `is_gap`) are stepped over. A batch
    /// out of offset sequence or failing its checksum is corruption (unless the first batch
    /// disagrees with a stale index hint: then the scan restarts at the segment's start).
    async fn scan(
        &self,
        base: u64,
        mut pos: u64,
        want: u64,
        mut f: impl FnMut(u64, ReadBatch) -> bool,
    ) -> Result<()> {
        let (file, seg_size) = {
            let i = self.inner.borrow();
            let s = i
                .segments
                .get(&base)
                .ok_or(StorageError::OffsetOutOfRange {
                    offset: want,
                    start: i.segments.keys().next().copied().unwrap_or(0),
                    end: 0,
                })?;
            (s.file.clone(), s.size)
        };
        let mut expected: Option<u64> = (pos == 0).then_some(base);
        let mut window: Option<(u64, Bytes)> = None;
        while pos < seg_size {
            if self.cached_gap(base, pos) {
                pos = align_up(pos);
                continue;
            }
            let bytes = match self.cached_batch(base, pos) {
                Some(b) => b,
                None => {
                    self.batch_from_disk(&*file, base, pos, seg_size, &mut window)
                        .await?
                }
            };
            let path = || self.path(base, "log");
            let view = match BatchView::parse(&bytes) {
                Ok(v) => v,
                Err(_) if is_gap(&bytes, pos) => {
                    pos = align_up(pos);
                    continue;
                }
                Err(e) => return Err(self.corruption(path(), pos, e.to_string())),
            };
            let h = view.header;
            match expected {
                Some(x) if x != h.base_offset => {
                    return Err(self.corruption(
                        path(),
                        pos,
                        format!("batch base offset {} where {x} expected", h.base_offset),
                    ));
                }
                None if h.base_offset > want => {
                    // A stale index hint: restart from the segment's start.
                    pos = 0;
                    expected = Some(base);
                    window = None;
                    continue;
                }
                _ => {}
            }
            let len = u64::from(h.batch_len);
            let batch = ReadBatch {
                header: h,
                bytes: bytes.slice(..h.batch_len as usize),
            };
            let at = pos;
            pos += len;
            expected = Some(h.next_offset());
            if !f(at, batch) {
                break;
            }
        }
        Ok(())
    }

    /// Whether `pos` starts the zeros that a commit started beside another skipped, as the
    /// cache knows it: a part ends at `pos`, none starts there, one starts at the next block
    /// boundary. (Parts enter the cache in position order and leave it oldest first, so it
    /// holds every part after the oldest one it still has.)
    fn cached_gap(&self, base: u64, pos: u64) -> bool {
        if pos.is_multiple_of(BLOCK_BYTES) {
            return false;
        }
        let i = self.inner.borrow();
        !i.cache.contains_key(&(base, pos))
            && i.cache.contains_key(&(base, align_up(pos)))
            && i.cache
                .range(..(base, pos))
                .next_back()
                .is_some_and(|(&(b, at), c)| b == base && at + c.len() as u64 == pos)
    }

    fn cached_batch(&self, base: u64, pos: u64) -> Option<Bytes> {
        let mut i = self.inner.borrow_mut();
        let (&(b, start), chunk) = i.cache.range(..=(base, pos)).next_back()?;
        if b != base || pos >= start + chunk.len() as u64 {
            return None;
        }
        let from = (pos - start) as usize;
        let hdr = BatchHeader::parse(&chunk[from..]).ok()?;
        let end = from + hdr.batch_len as usize;
        if end > chunk.len() {
            return None;
        }
        let out = chunk.slice(from..end);
        i.stats.cache_hits += 1;
        Some(out)
    }

    /// The bytes of the batch at `pos` (possibly more after it), read through a window.
    async fn batch_from_disk(
        &self,
        file: &F::File,
        base: u64,
        pos: u64,
        seg_size: u64,
        window: &mut Option<(u64, Bytes)>,
    ) -> Result<Bytes> {
        let path = || self.path(base, "log");
        // A header, or the zeros up to the next block boundary (a gap; see `is_gap`).
        let need_header = (BATCH_HEADER_BYTES as u64).max(align_up(pos) - pos);
        let in_window = |w: &Option<(u64, Bytes)>, len: u64| {
            w.as_ref()
                .is_some_and(|(s, b)| pos >= *s && pos + len <= s + b.len() as u64)
        };
        if !in_window(window, need_header.min(seg_size - pos)) {
            let len = (READ_WINDOW_BYTES as u64).min(seg_size - pos) as usize;
            let data = file
                .read_at(pos, len)
                .await
                .map_err(|e| StorageError::io("read", path(), e))?;
            self.inner.borrow_mut().stats.disk_reads += 1;
            *window = Some((pos, Bytes::from(data)));
        }
        let (ws, wb) = window.as_ref().expect("filled above");
        let from = (pos - ws) as usize;
        let batch_len = BatchHeader::parse(&wb[from..])
            .map(|h| u64::from(h.batch_len))
            .unwrap_or(need_header);
        let batch_len = batch_len.min(seg_size - pos);
        if !in_window(window, batch_len) {
            let data = file
                .read_at(
                    pos,
                    batch_len.max(READ_WINDOW_BYTES as u64).min(seg_size - pos) as usize,
                )
                .await
                .map_err(|e| StorageError::io("read", path(), e))?;
            self.inner.borrow_mut().stats.disk_reads += 1;
            *window = Some((pos, Bytes::from(data)));
        }
        let (ws, wb) = window.as_ref().expect("filled above");
        Ok(wb.slice((pos - ws) as usize..))
    }

    /// The indexes of a sealed segment, from the cache or its files (rebuilt if missing).
    async fn sealed_indexes(&self, base: u64) -> Result<Rc<SealedIndexes>> {
        {
            let mut i = self.inner.borrow_mut();
            if let Some(at) = i.index_cache.iter().position(|(b, _)| *b == base) {
                let e = i.index_cache.remove(at).expect("found");
                let ix = e.1.clone();
                i.index_cache.push_back(e);
                return Ok(ix);
            }
        }
        let size = self
            .inner
            .borrow()
            .segments
            .get(&base)
            .map_or(0, |s| s.size);
        let index = OffsetIndex::parse(&self.read_whole(base, "index").await);
        let timeindex = TimeIndex::parse(&self.read_whole(base, "timeindex").await);
        let usable = index.last().is_none_or(|e| u64::from(e.position) < size)
            && (size == 0 || !timeindex.is_empty());
        let ix = if usable {
            SealedIndexes { index, timeindex }
        } else {
            tracing::warn!(
                segment = base,
                "rebuilding a missing or damaged segment index"
            );
            let ix = self.rebuild_indexes(base).await?;
            self.write_index_file(base, "index", ix.index.bytes(), 0, true)
                .await?;
            self.write_index_file(base, "timeindex", ix.timeindex.bytes(), 0, true)
                .await?;
            ix
        };
        let ix = Rc::new(ix);
        insert_index_cache(
            &mut self.inner.borrow_mut(),
            base,
            ix.clone(),
            self.config.index_cache_bytes_max,
        );
        Ok(ix)
    }

    async fn rebuild_indexes(&self, base: u64) -> Result<SealedIndexes> {
        let mut index = OffsetIndex::default();
        let mut timeindex = TimeIndex::default();
        let mut since = 0u64;
        let mut max_ts: Option<i64> = None;
        let mut last_rel = 0u32;
        let interval = self.config.index_interval_bytes;
        self.scan(base, 0, base, |pos, b| {
            let h = b.header;
            let rel = (h.base_offset - base) as u32;
            let m = max_ts.map_or(h.max_timestamp_ms, |m| m.max(h.max_timestamp_ms));
            if since >= interval {
                index.push(OffsetEntry {
                    rel_offset: rel,
                    position: pos as u32,
                });
                timeindex.push(TimeEntry {
                    max_timestamp_ms: m,
                    rel_offset: rel,
                });
                since = 0;
            }
            max_ts = Some(m);
            since += u64::from(h.batch_len);
            last_rel = (h.last_offset() - base) as u32;
            true
        })
        .await?;
        if let Some(m) = max_ts {
            timeindex.push(TimeEntry {
                max_timestamp_ms: m,
                rel_offset: last_rel,
            });
        }
        Ok(SealedIndexes { index, timeindex })
    }

    /// The first offset whose record timestamp is >= `ts_ms`, or `None` if every record is
    /// older (a consumer then starts at the end).
    pub async fn offset_for_timestamp(&self, ts_ms: i64) -> Result<Option<u64>> {
        let segs: Vec<(u64, Option<i64>, bool)> = self
            .inner
            .borrow()
            .segments
            .values()
            .map(|s| (s.base, s.max_ts, s.sealed))
            .collect();
        for (base, max_ts, sealed) in segs {
            if max_ts.is_none_or(|m| m < ts_ms) {
                continue;
            }
            let start_rel = if sealed {
                let ix = self.sealed_indexes(base).await?;
                ix.timeindex.last_before(ts_ms).map(|e| e.rel_offset)
            } else {
                let i = self.inner.borrow();
                let s = i.segments.get(&base).expect("listed above");
                s.timeindex.last_before(ts_ms).map(|e| e.rel_offset)
            };
            let from = base + start_rel.map_or(0, u64::from);
            let Some((b, pos)) = self.position_for(from).await? else {
                continue;
            };
            let mut found = None;
            let mut bad = None;
            self.scan(b, pos, from, |_, batch| {
                if batch.header.max_timestamp_ms < ts_ms || batch.header.last_offset() < from {
                    return true;
                }
                for r in batch.view().records() {
                    match r {
                        Ok(r) if r.timestamp_ms >= ts_ms => {
                            found = Some(r.offset);
                            return false;
                        }
                        Ok(_) => {}
                        Err(e) => {
                            bad = Some(e);
                            return false;
                        }
                    }
                }
                true
            })
            .await?;
            if let Some(e) = bad {
                return Err(e.into());
            }
            if found.is_some() {
                return Ok(found);
            }
        }
        Ok(None)
    }

    // ---------------------------------------------------------------- retention and close

    /// Deletes whole sealed segments past the retention limits of the configuration. Segments
    /// holding any offset >= `keep_from` are kept (a pin: undelivered queue messages, segments
    /// not yet tiered).
    pub async fn enforce_retention(
        &self,
        now_ms: i64,
        keep_from: Option<u64>,
    ) -> Result<RetentionOutcome> {
        self.delete_front_segments(|s, total| {
            if keep_from.is_some_and(|k| s.next_offset > k) {
                return false;
            }
            let by_time = self
                .config
                .retention_ms
                .is_some_and(|r| s.max_ts.is_none_or(|m| m < now_ms.saturating_sub(r as i64)));
            let by_size = self
                .config
                .retention_bytes
                .is_some_and(|r| total - s.size >= r);
            by_time || by_size
        })
        .await
    }

    /// Deletes the sealed segments that lie wholly below `offset` (every record in them has a
    /// smaller offset): compaction for a log whose owner knows that nothing below `offset` is
    /// needed any more (the queue engine's compaction floor). The active segment stays.
    pub async fn delete_segments_below(&self, offset: u64) -> Result<RetentionOutcome> {
        self.delete_front_segments(|s, _| s.next_offset <= offset)
            .await
    }

    /// Deletes the oldest sealed segment while `victim(segment, total bytes)` says so, then
    /// syncs the directory once, before returning (so the deletions are durable).
    async fn delete_front_segments(
        &self,
        victim: impl Fn(&Segment<F>, u64) -> bool,
    ) -> Result<RetentionOutcome> {
        let mut out = RetentionOutcome::default();
        loop {
            let victim = {
                let i = self.inner.borrow();
                let total: u64 = i.segments.values().map(|s| s.size).sum();
                let mut it = i.segments.values();
                let (Some(s), Some(_)) = (it.next(), it.next()) else {
                    break;
                };
                if !s.sealed || !victim(s, total) {
                    break;
                }
                s.base
            };
            let seg = {
                let mut i = self.inner.borrow_mut();
                i.index_cache.retain(|(b, _)| *b != victim);
                let keys: Vec<_> = i
                    .cache
                    .range((victim, 0)..=(victim, u64::MAX))
                    .map(|(k, _)| *k)
                    .collect();
                for k in keys {
                    if let Some(b) = i.cache.remove(&k) {
                        i.cache_bytes -= b.len();
                    }
                }
                i.cache_order.retain(|(b, _)| *b != victim);
                i.stats.segments_deleted += 1;
                i.segments.remove(&victim).expect("victim exists")
            };
            out.segments_deleted += 1;
            out.bytes_deleted += seg.size;
            for ext in ["log", "index", "timeindex"] {
                let p = self.path(victim, ext);
                if self.fs.exists(&p).await {
                    self.fs
                        .remove(&p)
                        .await
                        .map_err(|e| StorageError::io("remove", &p, e))?;
                }
            }
        }
        if out.segments_deleted > 0 {
            self.fs
                .sync_dir(&self.dir)
                .await
                .map_err(|e| StorageError::io("sync_dir", &self.dir, e))?;
        }
        out.new_start_offset = self.start_offset();
        Ok(out)
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
                s.index.bytes().to_vec(),
                s.timeindex.bytes().to_vec(),
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

fn insert_index_cache<F: Fs>(i: &mut Inner<F>, base: u64, ix: Rc<SealedIndexes>, max: usize) {
    i.index_cache.retain(|(b, _)| *b != base);
    i.index_cache.push_back((base, ix));
    i.index_cache_bytes = i
        .index_cache
        .iter()
        .map(|(_, x)| x.index.bytes().len() + x.timeindex.bytes().len())
        .sum();
    while i.index_cache_bytes > max && i.index_cache.len() > 1 {
        if let Some((_, x)) = i.index_cache.pop_front() {
            i.index_cache_bytes -= x.index.bytes().len() + x.timeindex.bytes().len();
        }
    }
}

/// Resolves when the log's flush generation moves past the one seen at creation.
struct WaitGen<'a, F: Fs> {
    log: &'a Log<F>,
    seen: u64,
}

impl<F: Fs> Future for WaitGen<'_, F> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut i = self.log.inner.borrow_mut();
        if i.flush_gen != self.seen {
            Poll::Ready(())
        } else {
            i.waiters.push(cx.waker().clone());
            Poll::Pending
        }
    }
}

/// If a committer's future is dropped mid-commit, what reached the disk is unknown: the log
/// turns read-only (reopen recovers), and everyone waiting is told.
struct CommitGuard<'a, F: Fs> {
    log: &'a Log<F>,
    seq: u64,
    bytes: usize,
    rolls: bool,
    slots: Vec<Slot>,
    armed: bool,
}

impl<F: Fs> Drop for CommitGuard<'_, F> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        for s in &self.slots {
            let mut s = s.borrow_mut();
            if s.is_none() {
                *s = Some(Err(StorageError::Poisoned));
            }
        }
        {
            let mut i = self.log.inner.borrow_mut();
            i.poisoned = true;
            i.finish_commit(self.seq, self.bytes, self.rolls);
        }
        self.log.wake_all();
    }
}

/// Writes zeros over `from..to` (block-aligned), in pieces of at most
/// [`ZERO_FILL_PIECE_BYTES`], resuming after short writes from the last whole block.
async fn zero_fill<T: File>(file: &T, from: u64, to: u64) -> std::io::Result<()> {
    let mut pos = from;
    while pos < to {
        let n = ((to - pos) as usize).min(ZERO_FILL_PIECE_BYTES);
        pos += advanced(file.write_zeros_at(pos, n).await?)? as u64;
    }
    Ok(())
}

/// Writes all of `data` at `pos`, resuming after short writes from the last whole block.
async fn write_all<T: File>(file: &T, pos: u64, data: &[u8]) -> std::io::Result<()> {
    write_all_with(file, pos, data, false).await
}

/// [`write_all`], each write durable when it completes if `durable` (O_DSYNC semantics).
async fn write_all_with<T: File>(
    file: &T,
    pos: u64,
    data: &[u8],
    durable: bool,
) -> std::io::Result<()> {
    let mut done = 0usize;
    while done < data.len() {
        let at = pos + done as u64;
        let n = if durable {
            file.write_durable_at(at, &data[done..]).await?
        } else {
            file.write_at(at, &data[done..]).await?
        };
        done += advanced(n)?;
    }
    Ok(())
}

/// How far a write that wrote `n` bytes moves its position: whole blocks only (a short write
/// resumes from the last whole block), and an error if not even one.
fn advanced(n: usize) -> std::io::Result<usize> {
    match align_down(n as u64) as usize {
        0 => Err(std::io::Error::new(
            std::io::ErrorKind::WriteZero,
            "write made no progress",
        )),
        a => Ok(a),
    }
}

/// Whether a gap (see `is_gap`) starts at `pos` in a file under recovery: zeros up to the next
/// block boundary, and there the batch with the `expected` offset.
async fn padding_gap<T: File>(file: &T, pos: u64, expected: u64, file_size: u64) -> bool {
    let next = align_up(pos);
    if next == pos || next >= file_size {
        return false;
    }
    match file.read_at(pos, (next - pos) as usize).await {
        Ok(b) if is_gap(&b, pos) => {}
        _ => return false,
    }
    matches!(
        read_batch_verified(file, next, file_size).await,
        Ok(Some(b)) if b.header.base_offset == expected
    )
}

/// Whether any byte in `[from, to)` of `file` is not zero.
async fn any_nonzero<T: File>(file: &T, from: u64, to: u64) -> std::io::Result<bool> {
    let mut pos = from;
    while pos < to {
        let n = ((to - pos) as usize).min(ZERO_FILL_PIECE_BYTES);
        let data = file.read_at(pos, n).await?;
        if data.iter().any(|b| *b != 0) {
            return Ok(true);
        }
        if data.len() < n {
            break;
        }
        pos += n as u64;
    }
    Ok(false)
}

/// Whether `bytes` (read from `pos` on, no batch parsed there) start with the zeros a commit
/// started beside another left before the next block boundary: a gap that readers skip.
fn is_gap(bytes: &[u8], pos: u64) -> bool {
    let gap = (align_up(pos) - pos) as usize;
    gap > 0 && bytes.len() >= gap && bytes[..gap].iter().all(|b| *b == 0)
}

/// The verified batch at `pos`: `Ok(None)` if the header bytes there are all zero (the clean end
/// of a pre-filled segment), `Err` if they are not a valid batch.
async fn read_batch_verified<T: File>(
    file: &T,
    pos: u64,
    file_size: u64,
) -> std::result::Result<Option<ReadBatch>, ()> {
    let avail = file_size.saturating_sub(pos);
    let head = file
        .read_at(pos, (BATCH_HEADER_BYTES as u64).min(avail) as usize)
        .await
        .map_err(|_| ())?;
    if head.iter().all(|b| *b == 0) {
        return Ok(None);
    }
    let h = BatchHeader::parse(&head).map_err(|_| ())?;
    if u64::from(h.batch_len) > avail {
        return Err(());
    }
    let bytes = file
        .read_at(pos, h.batch_len as usize)
        .await
        .map_err(|_| ())?;
    let v = BatchView::parse(&bytes).map_err(|_| ())?;
    v.validate_records().map_err(|_| ())?;
    let header = v.header;
    Ok(Some(ReadBatch {
        header,
        bytes: Bytes::from(bytes),
    }))
}

async fn read_batch_header_verified<T: File>(
    file: &T,
    pos: u64,
) -> std::result::Result<Option<BatchHeader>, ()> {
    let size = file.size().await.map_err(|_| ())?;
    Ok(read_batch_verified(file, pos, size)
        .await?
        .map(|b| b.header))
}

/// Looks for any valid batch starting at or after `from` (used to tell corruption from a torn
/// tail). Scans for the magic, then verifies the candidate.
async fn find_valid_batch_from<T: File>(file: &T, from: u64, file_size: u64) -> Option<u64> {
    let magic = crate::batch::BATCH_MAGIC.to_le_bytes();
    let mut pos = from;
    const PIECE: usize = 1024 * 1024;
    while pos + BATCH_HEADER_BYTES as u64 <= file_size {
        let data = file
            .read_at(pos, PIECE.min((file_size - pos) as usize))
            .await
            .ok()?;
        if data.len() < BATCH_HEADER_BYTES {
            return None;
        }
        for at in 12..=data.len() - 4 {
            if data[at..at + 4] == magic {
                let cand = pos + at as u64 - 12;
                if cand >= from {
                    if let Ok(Some(_)) = read_batch_verified(file, cand, file_size).await {
                        return Some(cand);
                    }
                }
            }
        }
        if pos + data.len() as u64 >= file_size {
            return None; // scanned to the end of the file
        }
        // The next piece overlaps this one by a header, so a magic across the seam is found;
        // it always advances (a piece is far longer than a header).
        pos += (data.len() - BATCH_HEADER_BYTES).max(1) as u64;
    }
    None
}
