//! Reads: whole verified batches by offset (from the commit cache, else through disk windows),
//! stepping over the gaps overlapping commits leave; and the first offset at a timestamp.

use super::segment::is_gap;
use super::{Log, ReadBatch};
use crate::batch::{BatchHeader, BatchView, BATCH_HEADER_BYTES};
use crate::error::{Result, StorageError};
use crate::fs::{align_up, File, Fs, BLOCK_BYTES};
use bytes::Bytes;

/// A reader waiting for another's read of the same window (`Log::read_window`).
pub(super) type WindowWaiter =
    futures::channel::oneshot::Sender<std::result::Result<Bytes, SharedIoError>>;

/// A disk read's error, as each reader that shared the read gets it.
#[derive(Debug, Clone)]
pub(super) struct SharedIoError {
    raw: Option<i32>,
    kind: std::io::ErrorKind,
    message: String,
}

impl SharedIoError {
    fn of(e: &std::io::Error) -> Self {
        SharedIoError {
            raw: e.raw_os_error(),
            kind: e.kind(),
            message: e.to_string(),
        }
    }

    fn to_io(&self) -> std::io::Error {
        match self.raw {
            Some(code) => std::io::Error::from_raw_os_error(code),
            None => std::io::Error::new(self.kind, self.message.clone()),
        }
    }
}

/// Disk reads of batches are done in windows of this size (or one batch, if larger), or of
/// what a smaller read asked for, down to [`READ_WINDOW_BYTES_MIN`]...
pub(super) const READ_WINDOW_BYTES: usize = 256 * 1024;
/// ...or, for a read that asked for more, of what it asked for up to this: a consumer's fetch
/// of 1,000 × 2 KiB records is one disk read, not eight (each awaited in turn) plus a re-read
/// of every batch that did not fit the window it started in.
pub(super) const READ_WINDOW_BYTES_MAX: usize = 8 * 1024 * 1024;
/// The smallest window of a read that asked for less: a read of one far-off batch (a FIFO
/// delivery; the index has an entry every 4 KiB) reads tens of KiB, not 256 (with 256 KiB, the
/// cold FIFO backlog bench spent 85 µs of CPU per delivery, mostly copying and reading the rest
/// of the window; with 32 KiB, 33 µs).
pub(super) const READ_WINDOW_BYTES_MIN: usize = 32 * 1024;

impl<F: Fs> Log<F> {
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
            let window = (max_bytes - total).clamp(READ_WINDOW_BYTES_MIN, READ_WINDOW_BYTES_MAX);
            self.scan_with_window(base, pos, want, window, true, |_, b| {
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
    pub(super) async fn position_for(&self, offset: u64) -> Result<Option<(u64, u64)>> {
        let (base, sealed) = {
            let i = self.inner.borrow();
            let Some((&b, s)) = i.segments.range(..=offset).next_back() else {
                return Ok(None);
            };
            if offset >= s.next_offset {
                return Ok(None);
            }
            if let Some(a) = &s.active {
                let rel = (offset - b) as u32;
                return Ok(Some((
                    b,
                    a.index.floor(rel).map_or(0, |e| u64::from(e.position)),
                )));
            }
            (b, s.is_sealed())
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
    pub(super) async fn scan(
        &self,
        base: u64,
        pos: u64,
        want: u64,
        f: impl FnMut(u64, ReadBatch) -> bool,
    ) -> Result<()> {
        self.scan_with_window(base, pos, want, READ_WINDOW_BYTES, false, f)
            .await
    }

    /// [`Log::scan`] reading the disk in windows of `window_bytes` (at least one batch). With
    /// `bounded`, `window_bytes` is all the caller wants from `pos` (a read of at most that
    /// much): a window read after the first asks only for what is left of it (a batch that
    /// crosses the first window's end is read alone, not with a whole new window the caller
    /// will not use — which made a sequential reader read the disk twice over).
    pub(super) async fn scan_with_window(
        &self,
        base: u64,
        mut pos: u64,
        want: u64,
        window_bytes: usize,
        bounded: bool,
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
        let mut first = pos;
        while pos < seg_size {
            let window_now = if bounded {
                window_bytes
                    .saturating_sub(pos.saturating_sub(first) as usize)
                    .max(BLOCK_BYTES as usize)
            } else {
                window_bytes
            };
            if self.cached_gap(base, pos) {
                pos = align_up(pos);
                continue;
            }
            // The cache holds what this log appended, verified when it was staged: a hit is
            // not hashed again (for a consumer reading the tail, that was every byte once more).
            let (bytes, cached) = match self.cached_batch(base, pos) {
                Some(b) => (b, true),
                None => (
                    self.batch_from_disk(&*file, base, pos, seg_size, window_now, &mut window)
                        .await?,
                    false,
                ),
            };
            let path = || self.path(base, "log");
            let parsed = if cached {
                BatchView::parse_verified_before(&bytes)
            } else {
                BatchView::parse(&bytes)
            };
            let view = match parsed {
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
                    first = 0;
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
    pub(super) fn cached_gap(&self, base: u64, pos: u64) -> bool {
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

    pub(super) fn cached_batch(&self, base: u64, pos: u64) -> Option<Bytes> {
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
    pub(super) async fn batch_from_disk(
        &self,
        file: &F::File,
        base: u64,
        pos: u64,
        seg_size: u64,
        window_bytes: usize,
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
            let len = (window_bytes as u64).min(seg_size - pos) as usize;
            *window = Some((pos, self.read_window(file, base, pos, len).await?));
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
                    batch_len.max(window_bytes as u64).min(seg_size - pos) as usize,
                )
                .await
                .map_err(|e| StorageError::io("read", path(), e))?;
            self.count_disk_read(data.len());
            *window = Some((pos, data));
        }
        let (ws, wb) = window.as_ref().expect("filled above");
        Ok(wb.slice((pos - ws) as usize..))
    }

    /// Counts one read of the disk of `bytes` bytes in the stats.
    fn count_disk_read(&self, bytes: usize) {
        let mut i = self.inner.borrow_mut();
        i.stats.disk_reads += 1;
        i.stats.disk_read_bytes += bytes as u64;
    }

    /// Reads `len` bytes at `pos` of segment `base` from disk. Readers that want the same
    /// window while one read of it is in flight wait for that read and share its bytes: a FIFO
    /// queue's concurrent receives each want a message of the same far-off batch (the groups
    /// served one after another are the ones sent together), and read it once, not once each.
    /// If the first reader goes away before its read completes, the others read for themselves.
    async fn read_window(&self, file: &F::File, base: u64, pos: u64, len: usize) -> Result<Bytes> {
        let key = (base, pos, len);
        let waiting = {
            let mut i = self.inner.borrow_mut();
            match i.reads_in_flight.get_mut(&key) {
                Some(waiters) => {
                    let (tx, rx) = futures::channel::oneshot::channel();
                    waiters.push(tx);
                    Some(rx)
                }
                None => {
                    i.reads_in_flight.insert(key, Vec::new());
                    None
                }
            }
        };
        let path = || self.path(base, "log");
        if let Some(rx) = waiting {
            match rx.await {
                Ok(Ok(bytes)) => {
                    self.inner.borrow_mut().stats.shared_reads += 1;
                    return Ok(bytes);
                }
                Ok(Err(e)) => return Err(StorageError::io("read", path(), e.to_io())),
                Err(futures::channel::oneshot::Canceled) => {
                    let data = file
                        .read_at(pos, len)
                        .await
                        .map_err(|e| StorageError::io("read", path(), e))?;
                    self.count_disk_read(data.len());
                    return Ok(data);
                }
            }
        }
        /// Takes the window's entry out of the map when the read ends or is dropped (its
        /// waiters' senders dropped with it: they read for themselves).
        struct InFlight<'a, F: Fs> {
            log: &'a Log<F>,
            key: (u64, u64, usize),
        }
        impl<F: Fs> InFlight<'_, F> {
            fn finish(self) -> Vec<WindowWaiter> {
                let waiters = self
                    .log
                    .inner
                    .borrow_mut()
                    .reads_in_flight
                    .remove(&self.key);
                std::mem::forget(self);
                waiters.unwrap_or_default()
            }
        }
        impl<F: Fs> Drop for InFlight<'_, F> {
            fn drop(&mut self) {
                self.log
                    .inner
                    .borrow_mut()
                    .reads_in_flight
                    .remove(&self.key);
            }
        }
        let in_flight = InFlight { log: self, key };
        let read = file.read_at(pos, len).await;
        let waiters = in_flight.finish();
        self.count_disk_read(read.as_ref().map_or(0, Bytes::len));
        match read {
            Ok(bytes) => {
                for w in waiters {
                    let _ = w.send(Ok(bytes.clone()));
                }
                Ok(bytes)
            }
            Err(e) => {
                let shared = SharedIoError::of(&e);
                for w in waiters {
                    let _ = w.send(Err(shared.clone()));
                }
                Err(StorageError::io("read", path(), e))
            }
        }
    }

    /// The first offset whose record timestamp is >= `ts_ms`, or `None` if every record is
    /// older (a consumer then starts at the end).
    pub async fn offset_for_timestamp(&self, ts_ms: i64) -> Result<Option<u64>> {
        let segs: Vec<(u64, Option<i64>, bool)> = self
            .inner
            .borrow()
            .segments
            .values()
            .map(|s| (s.base, s.max_ts, s.is_sealed()))
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
                // Sealed since it was listed (a roll meanwhile): no time index in hand, so the
                // scan starts at the segment's start.
                s.active
                    .as_ref()
                    .and_then(|a| a.timeindex.last_before(ts_ms))
                    .map(|e| e.rel_offset)
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
                if batch.header.kafka_codec() != 0 {
                    // A Kafka-compressed batch (batch.rs): its records are not read here; its
                    // first offset answers, as its max timestamp reaches `ts_ms` (a Kafka
                    // consumer skips the earlier records itself).
                    found = Some(batch.header.base_offset.max(from));
                    return false;
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
}
