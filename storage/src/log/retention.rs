//! Retention: whole sealed segments deleted from the front, by time, by size, or below an
//! offset the owner no longer needs; the active segment always stays.

use super::segment::Segment;
use super::{Log, RetentionOutcome};
use crate::error::{Result, StorageError};
use crate::fs::Fs;

impl<F: Fs> Log<F> {
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
    pub(super) async fn delete_front_segments(
        &self,
        victim: impl Fn(&Segment<F>, u64) -> bool,
    ) -> Result<RetentionOutcome> {
        let mut out = RetentionOutcome::default();
        let mut reclaim = Vec::new();
        loop {
            let victim = {
                let i = self.inner.borrow();
                let total: u64 = i.segments.values().map(|s| s.size).sum();
                let mut it = i.segments.values();
                let (Some(s), Some(_)) = (it.next(), it.next()) else {
                    break;
                };
                if !s.is_sealed() || !victim(s, total) {
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
            // Its descriptors close here, while the file still has its name: the close frees
            // nothing on this thread.
            drop(seg);
            // The data file leaves the log under a name recovery ignores, and its space is
            // freed in the background (`crate::fs::reclaim`: freeing 256 MiB at once held the
            // shard and the disk for 50-100 ms); the index files are small and go now.
            let log = self.path(victim, "log");
            if self.fs.exists(&log).await {
                let deleted = crate::fs::reclaim::deleted_path(&log);
                self.fs
                    .rename(&log, &deleted)
                    .await
                    .map_err(|e| StorageError::io("rename", &log, e))?;
                reclaim.push(deleted);
            }
            for ext in ["index", "timeindex"] {
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
        // Only once the renames are durable: a crash part-way through reclaiming leaves a
        // shortened `.deleted` file, never a shortened segment.
        for p in reclaim {
            self.fs
                .reclaim(&p)
                .await
                .map_err(|e| StorageError::io("remove", &p, e))?;
        }
        out.new_start_offset = self.start_offset();
        Ok(out)
    }
}
