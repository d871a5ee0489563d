//! Group commit: what one durable write takes from the staged batches, where it writes (from
//! the durable end, or beside a commit in flight from the next block boundary), the order in
//! which commits take effect, and what a failed one repairs. Also the block-wise write helpers.

use super::{Inner, Log};
use crate::batch::BatchHeader;
use crate::error::{Result, StorageError};
use crate::fs::{align_down, align_up, File, Fs, BLOCK_BYTES};
use crate::index::{OffsetEntry, TimeEntry};
use bytes::Bytes;
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

/// Zeros are written in pieces of this size when pre-filling segment space.
pub(super) const ZERO_FILL_PIECE_BYTES: usize = 1024 * 1024;

/// Zero-ahead step: at most this much zeroing (or one commit's size, if larger) rides along
/// with a commit. Small, because the disk serves a durable write queued behind a zero write
/// only after it: measured with fio on the AMD host, 20 KiB O_DSYNC writes beside 1 MiB zero
/// writes at the same pace had p99 3.2 ms, beside 256 KiB ones 0.85 ms (alone 0.2 ms); the
/// storage bench's 20 KiB appends went from p99 4.1-4.3 to 1.4 ms at one appender (5.4-6.6
/// to 1.6-2.7 ms at two and four) at even or better appends/s.
pub(super) const ZERO_AHEAD_STEP_BYTES: u64 = 256 * 1024;

/// Only commits smaller than this carry zero-ahead (small fdatasyncs are the ones an extension
/// makes 2-4x slower; large ones are bandwidth, which zeroing would halve).
pub(super) const ZERO_AHEAD_CHUNK_BYTES_MAX: usize = 256 * 1024;

/// Group commits that may be in flight at once. A second one starts while the first is on
/// its way to the disk, so a batch staged meanwhile waits about one durable write instead of the
/// rest of that one and all of its own.
pub const COMMITS_IN_FLIGHT_MAX: usize = 2;

/// A commit starts beside others only while the bytes of all of them stay within this (and
/// within the write buffer): the overlap is for small, latency-bound commits; large ones are
/// bandwidth-bound and gain nothing from it.
pub(super) const OVERLAP_BYTES_MAX: usize = 512 * 1024;

pub(super) type Slot = Rc<RefCell<Option<Result<()>>>>;

pub(super) struct StagedBatch {
    pub(super) header: BatchHeader,
    /// Position within the chunk's bytes.
    pub(super) at: usize,
    pub(super) slot: Slot,
}

pub(super) struct Chunk {
    /// Base offset of the segment this chunk goes to.
    pub(super) segment: u64,
    /// Seal the current active segment and create `segment` first.
    pub(super) roll: bool,
    /// The chunk's bytes, in order: each part holds whole batches (small ones coalesced,
    /// large ones alone, as they were staged).
    pub(super) parts: Vec<Vec<u8>>,
    /// Bytes in `parts`.
    pub(super) len: usize,
    pub(super) batches: Vec<StagedBatch>,
}

impl Chunk {
    /// Appends a staged batch: one smaller than `coalesce_max` after a last part still smaller
    /// than that (copied), anything else as a part of its own (moved).
    pub(super) fn push_bytes(&mut self, bytes: Vec<u8>, coalesce_max: usize) {
        self.len += bytes.len();
        match self.parts.last_mut() {
            Some(last) if bytes.len() < coalesce_max && last.len() < coalesce_max => {
                last.extend_from_slice(&bytes)
            }
            _ => self.parts.push(bytes),
        }
    }

    /// The last `n` bytes of `head` followed by the chunk's parts (`n` ≤ their length).
    pub(super) fn last_bytes(&self, head: &[u8], n: usize) -> Vec<u8> {
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

/// What one group commit writes (see `Log::start_commit`).
pub(super) struct CommitJob {
    pub(super) seq: u64,
    pub(super) chunks: Vec<Chunk>,
    /// Where a commit started beside others writes (a block boundary); `None`: from the
    /// durable end.
    pub(super) at: Option<u64>,
    pub(super) bytes: usize,
    pub(super) rolls: bool,
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

/// Resolves when the log's flush generation moves past the one seen at creation.
pub(super) struct WaitGen<'a, F: Fs> {
    pub(super) log: &'a Log<F>,
    pub(super) seen: u64,
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
pub(super) struct CommitGuard<'a, F: Fs> {
    pub(super) log: &'a Log<F>,
    pub(super) seq: u64,
    pub(super) bytes: usize,
    pub(super) rolls: bool,
    pub(super) slots: Vec<Slot>,
    pub(super) armed: bool,
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
pub(super) async fn zero_fill<T: File>(file: &T, from: u64, to: u64) -> std::io::Result<()> {
    let mut pos = from;
    while pos < to {
        let n = ((to - pos) as usize).min(ZERO_FILL_PIECE_BYTES);
        pos += advanced(file.write_zeros_at(pos, n).await?)? as u64;
    }
    Ok(())
}

/// Writes all of `data` at `pos`, resuming after short writes from the last whole block.
pub(super) async fn write_all<T: File>(file: &T, pos: u64, data: &[u8]) -> std::io::Result<()> {
    write_all_with(file, pos, data, false).await
}

/// [`write_all`], each write durable when it completes if `durable` (O_DSYNC semantics).
pub(super) async fn write_all_with<T: File>(
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
pub(super) fn advanced(n: usize) -> std::io::Result<usize> {
    match align_down(n as u64) as usize {
        0 => Err(std::io::Error::new(
            std::io::ErrorKind::WriteZero,
            "write made no progress",
        )),
        a => Ok(a),
    }
}

impl<F: Fs> Log<F> {
    pub(super) fn wait_flush_gen(&self) -> WaitGen<'_, F> {
        WaitGen {
            log: self,
            seen: self.inner.borrow().flush_gen,
        }
    }

    pub(super) fn wake_all(&self) {
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
    pub(super) fn overlap_reach_bytes(&self) -> u64 {
        self.overlap_bytes_max() as u64 + (COMMITS_IN_FLIGHT_MAX as u64 + 2) * BLOCK_BYTES
    }

    /// The bytes commits in flight together may hold when one started beside another.
    pub(super) fn overlap_bytes_max(&self) -> usize {
        OVERLAP_BYTES_MAX.min(self.config.write_buffer_bytes_max)
    }

    /// Takes what the next commit writes, if one may start now. With none in flight: everything
    /// staged, written from the durable end (rewriting its partial last block). Beside commits
    /// in flight: the first staged chunk, written from the block boundary after their end, so
    /// no two writes in flight share a block (the disk may land them in any order); the bytes
    /// skipped are zeros, which readers step over (see `scan`). A chunk that seals a segment,
    /// or that would not fit beside the ones in flight, waits until none is.
    pub(super) fn start_commit(&self) -> Option<CommitJob> {
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
            let a = s.active_mut();
            let at = align_up(a.write_end);
            let end = at + first.len as u64;
            if first.segment != base
                || end > self.config.segment_bytes_max
                || align_up(end) > a.zeroing_from
            {
                return None;
            }
            let gap = at - a.write_end;
            a.write_end = end;
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
    pub(super) async fn commit(&self) -> bool {
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
    pub(super) async fn wait_turn(&self, seq: u64) {
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
    pub(super) async fn fail_commit(&self, e: &StorageError, seq: u64) {
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
            active.active_mut().write_end = active.size;
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

    pub(super) async fn repair_tail(&self, base: u64) -> Result<()> {
        let (file, size, tail) = {
            let i = self.inner.borrow();
            let s = i.segments.get(&base).expect("active segment");
            (s.file.clone(), s.size, s.active().tail.clone())
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
        if let Some(a) = i.segments.get_mut(&base).and_then(|s| s.active.as_mut()) {
            a.zeroed_until = a.zeroed_until.max(align_up(end));
        }
        Ok(())
    }

    /// Writes one chunk into the active segment with one durable (O_DSYNC) write: from the
    /// durable end, or from `at` (a block boundary) for a commit started beside others. Takes
    /// the commit's results into the segment at its turn (`seq`).
    pub(super) async fn write_chunk(
        &self,
        chunk: &mut Chunk,
        at: Option<u64>,
        seq: u64,
    ) -> Result<()> {
        let seg_max = align_up(self.config.segment_bytes_max);
        let (base, file, start, tail, zero) = {
            let mut i = self.inner.borrow_mut();
            let (&b, s) = i.segments.iter_mut().next_back().expect("active segment");
            assert_eq!(b, chunk.segment, "a chunk goes to the active segment");
            let size = s.size;
            let file = s.file.clone();
            let s = s.active_mut();
            let (start, tail) = match at {
                Some(p) => (p, Vec::new()),
                None => (size, s.tail.clone()),
            };
            let data_end = align_up(start + chunk.len as u64);
            // Zero-ahead: keep zeroed space past the data — as far again as the data, between
            // `prealloc_initial_bytes` and `prealloc_chunk_bytes` (`LogConfig::zero_ahead_bytes`)
            // — so that commits overwrite allocated blocks (their flush need not journal an
            // extension). Once below that reach, zeroing runs to twice it, so a growing segment
            // is zeroed in a few steps rather than a small one per commit. The zeros go out in steps, plain writes concurrent with this commit's
            // durable data write — never as a separate stall of a whole chunk plus its own sync.
            // They need no sync of their own: the first durable write into a step makes its
            // allocation durable with it, as O_DSYNC does for whatever metadata reading the
            // data back needs. Only a commit with none beside it zeroes; the range is claimed
            // now, and no commit writes data into it until it lands (`start_commit`).
            let ahead = self.config.zero_ahead_bytes(data_end);
            let want_until = (data_end + ahead).min(seg_max);
            // A large commit skips it: its flush's extension cost is spread over many bytes,
            // while zeroing ahead of it would double the bytes written (measured, 512 KiB
            // commits: 377-395 MB/s with zero-ahead, 484-575 MB/s without; fio 1.0-1.35 GB/s).
            let small = chunk.len < ZERO_AHEAD_CHUNK_BYTES_MAX;
            let zero = (at.is_none() && small && s.zeroed_until < want_until)
                .then(|| {
                    let from = s.zeroed_until.max(data_end);
                    let step = ZERO_AHEAD_STEP_BYTES.max(data_end - align_down(start));
                    (from, (from + step).min(data_end + 2 * ahead).min(seg_max))
                })
                .filter(|(from, to)| from < to);
            if let Some((from, to)) = zero {
                s.zeroed_until = to;
                s.zeroing_from = from;
            }
            if at.is_none() {
                s.write_end = start + chunk.len as u64;
            }
            (b, file, start, tail, zero)
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
        let no_fsync = self.config.unsafe_no_fsync_before_ack;
        let data_write = async {
            let parts: Vec<&[u8]> = std::iter::once(tail.as_slice())
                .chain(chunk.parts.iter().map(Vec::as_slice))
                .collect();
            if no_fsync {
                // UNSAFE, tests only (`LogConfig::unsafe_no_fsync_before_ack`): a plain write,
                // acknowledged while it is still in the disk's cache.
                let mut buf = parts.concat();
                buf.resize(len, 0);
                return write_all_with(&*file, wpos, &buf, false).await;
            }
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
                if let Some(a) = i.segments.get_mut(&base).and_then(|s| s.active.as_mut()) {
                    a.zeroing_from = u64::MAX;
                    if zeroed.is_err() {
                        a.zeroed_until = a.zeroed_until.min(from);
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
            if let Some(a) = i.segments.get_mut(&base).and_then(|s| s.active.as_mut()) {
                a.zeroed_until = a.zeroed_until.max(data_end);
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
            let a = s.active.as_mut().expect("the active segment");
            let mut records = 0u64;
            for b in &chunk.batches {
                let h = b.header;
                let pos = start + b.at as u64;
                if a.bytes_since_index >= self.config.index_interval_bytes {
                    let rel = u32::try_from(h.base_offset - base).expect("segment offsets fit u32");
                    a.index.push(OffsetEntry {
                        rel_offset: rel,
                        position: u32::try_from(pos).expect("segment < 4 GiB"),
                    });
                    let m = s
                        .max_ts
                        .map_or(h.max_timestamp_ms, |m| m.max(h.max_timestamp_ms));
                    a.timeindex.push(TimeEntry {
                        max_timestamp_ms: m,
                        rel_offset: rel,
                    });
                    a.bytes_since_index = 0;
                }
                a.bytes_since_index += u64::from(h.batch_len);
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
            a.tail = chunk.last_bytes(&tail, (end - align_down(end)) as usize);
            let persist = (a.index.len() - a.index_persisted_entries
                >= self.config.index_persist_entries)
                .then(|| {
                    let from = a.index_persisted_entries;
                    a.index_persisted_entries = a.index.len();
                    (a.index.bytes().to_vec(), from, a.timeindex.bytes().to_vec())
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
}
