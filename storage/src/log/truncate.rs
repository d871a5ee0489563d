//! Truncating a suffix: every batch from an offset on is removed, durably, so that the next
//! staged batch takes that offset. A replicated log needs it when a follower's uncommitted
//! entries conflict with a new leader's (REPLICATION.md); the single-node broker never calls it.
//!
//! Crash safety: at every point a power loss leaves a log that recovery opens as a prefix of
//! the log before the truncation, at least as long as the truncated one (the caller redoes an
//! unfinished truncation; it never returns success before the result is durable):
//! - segments after the one holding the cut are removed newest first, each removal synced, so
//!   no hole between segments can survive;
//! - the cut segment's index files are emptied (they are hints: recovery scans the segment);
//! - the cut segment's bytes from the cut on are zeroed **back to front**, each step durable: a
//!   crash leaves batches up to some point and zeros after (a torn batch at that point is a
//!   torn tail to recovery, within its window by construction), never zeros followed by valid
//!   batches, which recovery would have to call corruption.
//!
//! Then the segment is recovered as the active one, from its file, as `Log::open` would.

use super::commit::write_all_with;
use super::segment::segment_file_name;
use super::Log;
use crate::error::{Result, StorageError};
use crate::fs::{align_down, align_up, File, Fs, BLOCK_BYTES};

/// Bytes zeroed by one durable write while truncating (back to front), at most: see
/// `Log::truncate_zero_step`.
const TRUNCATE_ZERO_STEP_BYTES: u64 = 256 * 1024;

impl<F: Fs> Log<F> {
    /// Removes every batch at `offset` and after, durably; the next batch staged gets `offset`.
    /// Commits what is staged first (a staged batch at or after `offset` is committed, then
    /// removed). `offset` must be a batch boundary in `[start_offset, end_offset]`; at
    /// `end_offset` nothing changes.
    pub async fn truncate_from(&self, offset: u64) -> Result<()> {
        self.check_writable()?;
        self.drain_commits().await;
        self.check_writable()?;
        let (start, end) = (self.start_offset(), self.end_offset());
        if offset < start || offset > end {
            return Err(StorageError::OffsetOutOfRange { offset, start, end });
        }
        if offset == end {
            return Ok(());
        }
        let base = {
            let i = self.inner.borrow();
            *i.segments
                .range(..=offset)
                .next_back()
                .expect("offset >= start_offset")
                .0
        };
        // Where the cut lies in its segment: a batch must start there.
        let cut = self.batch_position(base, offset).await?;
        // From here on the log is unusable until the segment is recovered: no appends meanwhile.
        self.inner.borrow_mut().truncating = true;
        let result = self.truncate_segments(base, cut).await;
        let mut i = self.inner.borrow_mut();
        i.truncating = false;
        if result.is_err() {
            // What is on disk is a prefix, but memory may not match it: reopen to recover.
            i.poisoned = true;
        }
        result
    }

    /// Commits everything staged and waits for commits in flight.
    pub(super) async fn drain_commits(&self) {
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
    }

    /// The byte position in segment `base` of the batch whose base offset is `offset`.
    async fn batch_position(&self, base: u64, offset: u64) -> Result<u64> {
        if offset == base {
            return Ok(0);
        }
        let (_, from) = self
            .position_for(offset)
            .await?
            .expect("offset lies in the log");
        let mut found = None;
        let mut inside = false;
        self.scan(base, from, offset, |pos, b| {
            if b.header.base_offset == offset {
                found = Some(pos);
                return false;
            }
            if b.header.last_offset() >= offset {
                inside = true;
                return false;
            }
            true
        })
        .await?;
        match found {
            Some(p) => Ok(p),
            None if inside => Err(StorageError::NotBatchBoundary { offset }),
            None => Err(StorageError::OffsetOutOfRange {
                offset,
                start: self.start_offset(),
                end: self.end_offset(),
            }),
        }
    }

    async fn truncate_segments(&self, base: u64, cut: u64) -> Result<()> {
        // 1. Later segments go, newest first, each removal durable before the next.
        let later: Vec<u64> = {
            let i = self.inner.borrow();
            i.segments
                .range(base + 1..)
                .map(|(b, _)| *b)
                .rev()
                .collect()
        };
        for b in later {
            for ext in ["log", "index", "timeindex"] {
                let p = self.path(b, ext);
                if self.fs.exists(&p).await {
                    self.fs
                        .remove(&p)
                        .await
                        .map_err(|e| StorageError::io("remove", &p, e))?;
                }
            }
            self.fs
                .sync_dir(&self.dir)
                .await
                .map_err(|e| StorageError::io("sync_dir", &self.dir, e))?;
            self.forget_segment(b);
        }
        // 2. The cut segment's indexes are emptied: recovery rebuilds them from the log.
        for ext in ["index", "timeindex"] {
            let p = self.dir.join(segment_file_name(base, ext));
            if self.fs.exists(&p).await {
                let f = self
                    .fs
                    .open(&p, false)
                    .await
                    .map_err(|e| StorageError::io("open", &p, e))?;
                f.truncate(0)
                    .await
                    .map_err(|e| StorageError::io("truncate", &p, e))?;
                f.sync_data()
                    .await
                    .map_err(|e| StorageError::io("fdatasync", &p, e))?;
            }
        }
        // 3. Zero [cut, size) back to front, each step durable; the block holding the cut keeps
        //    its bytes before the cut.
        let (file, size) = {
            let i = self.inner.borrow();
            let s = i.segments.get(&base).expect("cut segment");
            (s.file.clone(), s.size)
        };
        let path = self.path(base, "log");
        let mut hi = align_up(size);
        let lo = align_up(cut);
        let step = self.truncate_zero_step();
        while hi > lo {
            let from = hi.saturating_sub(step).max(lo);
            let zeros = vec![0u8; (hi - from) as usize];
            write_all_with(&*file, from, &zeros, true)
                .await
                .map_err(|e| StorageError::io("write", &path, e))?;
            hi = from;
        }
        if !cut.is_multiple_of(BLOCK_BYTES) && cut < size {
            let head = file
                .read_at(align_down(cut), (cut - align_down(cut)) as usize)
                .await
                .map_err(|e| StorageError::io("read", &path, e))?;
            let mut block = head.to_vec();
            block.resize(BLOCK_BYTES as usize, 0);
            write_all_with(&*file, align_down(cut), &block, true)
                .await
                .map_err(|e| StorageError::io("write", &path, e))?;
        }
        // 4. The cut segment is recovered as the active one, as `Log::open` would.
        self.forget_segment(base);
        drop(file);
        self.recover_active(base).await?;
        {
            let mut guard = self.inner.borrow_mut();
            let i = &mut *guard;
            let s = i.segments.get(&base).expect("recovered");
            debug_assert_eq!(s.size, cut, "recovery ends the segment at the cut");
            let (size, first_ts, next) = (s.size, s.first_ts, s.next_offset);
            i.next_offset = next;
            i.proj_segment = base;
            i.proj_size = size;
            i.proj_first_ts = first_ts;
            i.stats.fsyncs += 1;
        }
        // The removed suffix may have held newer terms: the log's last term is the cut's.
        self.restore_last_term().await
    }

    /// Bytes zeroed by one durable write of a truncation. A power loss during the write may
    /// leave any of its blocks zeroed and the others not: the first batch it broke may start up
    /// to a batch before the step, and data may survive to the step's end. Recovery takes
    /// invalid bytes followed by valid data for a torn write only within its torn window of
    /// the first invalid batch, and for corruption beyond: so a step and a batch together
    /// stay within that window.
    fn truncate_zero_step(&self) -> u64 {
        let fits = self
            .config
            .torn_window_bytes()
            .saturating_sub(self.config.batch_bytes_max as u64 + BLOCK_BYTES);
        align_down(fits.min(TRUNCATE_ZERO_STEP_BYTES)).max(BLOCK_BYTES)
    }

    /// Drops a segment from memory and every cache.
    fn forget_segment(&self, base: u64) {
        let mut i = self.inner.borrow_mut();
        i.index_cache.retain(|(b, _)| *b != base);
        i.index_cache_bytes = i
            .index_cache
            .iter()
            .map(|(_, x)| x.index.bytes().len() + x.timeindex.bytes().len())
            .sum();
        let keys: Vec<_> = i
            .cache
            .range((base, 0)..=(base, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            if let Some(b) = i.cache.remove(&k) {
                i.cache_bytes -= b.len();
            }
        }
        i.cache_order.retain(|(b, _)| *b != base);
        i.segments.remove(&base);
    }
}
