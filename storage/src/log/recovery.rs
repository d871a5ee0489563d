//! Opening a log: the directory's format version, orphan files, sealed segments, and the
//! recovery of the active segment — resume from an index entry that checks out, verify every
//! batch after it, zero a torn tail, and tell corruption (valid data beyond a bad batch,
//! further than any torn write reaches) from a torn tail.

use super::append::SINGLE_NODE_TERM;
use super::commit::{write_all, ZERO_FILL_PIECE_BYTES};
use super::segment::{is_gap, parse_segment_name, ActiveSegment, Segment};
use super::{Inner, Log, LogStats, ReadBatch};
use crate::batch::{BatchHeader, BatchView, BATCH_HEADER_BYTES};
use crate::config::LogConfig;
use crate::error::{Result, StorageError};
use crate::fs::{align_down, align_up, File, Fs};
use crate::index::{OffsetEntry, OffsetIndex, TimeEntry, TimeIndex};
use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::rc::Rc;

/// Whether a gap (see `is_gap`) starts at `pos` in a file under recovery: zeros up to the next
/// block boundary, and there the batch with the `expected` offset.
pub(super) async fn padding_gap<T: File>(
    file: &T,
    pos: u64,
    expected: u64,
    file_size: u64,
) -> bool {
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
pub(super) async fn any_nonzero<T: File>(file: &T, from: u64, to: u64) -> std::io::Result<bool> {
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

/// The verified batch at `pos`: `Ok(None)` if the header bytes there are all zero (the clean end
/// of a pre-filled segment), `Err` if they are not a valid batch.
pub(super) async fn read_batch_verified<T: File>(
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
    Ok(Some(ReadBatch { header, bytes }))
}

/// Why the batch at `pos` is one this build refuses by its format version, not a torn write:
/// a version it does not know (a newer build's; not 0, which is what a write torn before the
/// version byte leaves in pre-zeroed space), or version and Kafka codec bits that disagree (a
/// compressed batch of the build that stored them before v3) under a checksum that holds (a
/// torn write leaves none). Recovery reports it instead of cutting it off as a torn tail,
/// which would drop acknowledged batches.
pub(super) async fn refused_by_version<T: File>(
    file: &T,
    pos: u64,
    file_size: u64,
) -> Option<String> {
    let avail = file_size.saturating_sub(pos);
    let head = file
        .read_at(pos, (BATCH_HEADER_BYTES as u64).min(avail) as usize)
        .await
        .ok()?;
    let e = match BatchHeader::parse(&head) {
        Err(e @ crate::batch::BatchError::UnsupportedVersion(v)) if v != 0 => e,
        Err(e @ crate::batch::BatchError::CodecVersionMismatch { .. }) => {
            let len = u64::from(u32::from_le_bytes(head.get(8..12)?.try_into().ok()?));
            if len > avail {
                return None;
            }
            let bytes = file.read_at(pos, len as usize).await.ok()?;
            if !crate::batch::checksum_holds(&bytes) {
                return None;
            }
            e
        }
        _ => return None,
    };
    Some(format!("batch refused by its format version: {e}"))
}

pub(super) async fn read_batch_header_verified<T: File>(
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
pub(super) async fn find_valid_batch_from<T: File>(
    file: &T,
    from: u64,
    file_size: u64,
) -> Option<u64> {
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

impl<F: Fs> Log<F> {
    /// Opens (or creates) the log in `dir`, recovering the active segment.
    pub async fn open(fs: F, dir: impl Into<PathBuf>, config: LogConfig) -> Result<Log<F>> {
        config.validate()?;
        let dir = dir.into();
        // Durably: a directory lost with the power takes every acknowledged append with it.
        crate::fs::create_dir_all_durable(&fs, &dir)
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
                last_term: SINGLE_NODE_TERM,
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
                truncating: false,
                closed: false,
                flush_gen: 0,
                waiters: Vec::new(),
                cache: BTreeMap::new(),
                cache_order: VecDeque::new(),
                cache_bytes: 0,
                index_cache: VecDeque::new(),
                index_cache_bytes: 0,
                reads_in_flight: Default::default(),
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
        // Index files whose segment is gone (a crash during deletion) are removed, and so are
        // deleted segments whose space was still being reclaimed (in the background again).
        let mut removed_orphan = false;
        for n in &names {
            let p = dir.join(n);
            if n.ends_with(crate::fs::reclaim::DELETED_SUFFIX) {
                fs.reclaim(&p)
                    .await
                    .map_err(|e| StorageError::io("remove", &p, e))?;
                continue;
            }
            let orphan = match parse_segment_name(n) {
                Some((b, "index" | "timeindex")) => bases.binary_search(&b).is_err(),
                _ => n.ends_with(".tmp"),
            };
            if orphan {
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
        // A restarted replica must know the term its log ends in (Raft compares it in votes,
        // and a follower may not append below it): the last batch's, not 0.
        log.restore_last_term().await?;
        Ok(log)
    }

    pub(super) async fn open_sealed(&self, base: u64, next_base: u64) -> Result<()> {
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
            active: None,
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

    /// Recovers the last segment: resumes from its last index entry that checks out, verifies
    /// every batch after it, and truncates a torn tail — or reports corruption when valid data
    /// lies beyond a bad batch further than any torn commit could reach.
    pub(super) async fn recover_active(&self, base: u64) -> Result<()> {
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
                        if let Some(why) = refused_by_version(&file, pos, file_size).await {
                            return Err(self.corruption(path, pos, why));
                        }
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
            let mut buf = tail.to_vec();
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
                active: Some(ActiveSegment {
                    index,
                    timeindex,
                    bytes_since_index: since_index,
                    index_persisted_entries: keep_entries,
                    tail: tail.to_vec(),
                    zeroed_until: align_up(file_size.max(pos)),
                    write_end: pos,
                    zeroing_from: u64::MAX,
                }),
            },
        );
        Ok(())
    }
}
