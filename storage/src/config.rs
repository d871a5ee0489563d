//! Log configuration: every limit named, with its unit.

use crate::error::StorageError;
use crate::fs::BLOCK_BYTES;

#[derive(Debug, Clone)]
pub struct LogConfig {
    /// Roll the active segment before it would exceed this size.
    pub segment_bytes_max: u64,
    /// Roll the active segment once a batch is this much newer than its first record.
    pub segment_age_ms_max: Option<u64>,
    /// One offset index entry per this many bytes of log (at a batch boundary).
    pub index_interval_bytes: u64,
    /// Segment space is zero-filled ahead of the write position, at most this far, so that
    /// commits write into allocated, zeroed blocks (fdatasync into a growing file is 2–4× slower).
    pub prealloc_chunk_bytes: u64,
    /// A new segment starts with this much zeroed space; the zero-ahead distance then grows with
    /// the data (as far again as written, [`LogConfig::zero_ahead_bytes`]) up to
    /// `prealloc_chunk_bytes`. Small, because a broker holds many partitions that never fill:
    /// a whole chunk up front made an empty queue cost 8 MiB of disk (CONTRACT.md C8).
    pub prealloc_initial_bytes: u64,
    /// Bytes staged but not yet written; appends wait (back-pressure) beyond it. It also bounds
    /// one commit's write, and so the region a torn write can damage.
    pub write_buffer_bytes_max: usize,
    /// The largest batch accepted.
    pub batch_bytes_max: usize,
    /// Staged batches smaller than this are copied together into one buffer (small copies are
    /// cheap); larger ones stay buffers of their own and reach the I/O buffer without a copy
    /// before it (a 512 KiB producer batch used to be copied, and re-copied as the staging
    /// buffer grew, before the copy into the I/O buffer; at 64 KiB, a SendMessageBatch of ten
    /// 2 KiB messages was still copied, and grew the buffer it was copied into).
    pub coalesce_batch_bytes_max: usize,
    /// Recently committed bytes kept in memory for tail reads.
    pub read_cache_bytes_max: usize,
    /// Indexes of sealed segments kept in memory (loaded on demand, least recently used evicted).
    pub index_cache_bytes_max: usize,
    /// Write the active segment's new index entries to disk (a hint, not synced) every this many.
    pub index_persist_entries: usize,
    /// Delete sealed segments whose newest record is older than this.
    pub retention_ms: Option<u64>,
    /// Delete the oldest sealed segments while the log is larger than this.
    pub retention_bytes: Option<u64>,
    /// **UNSAFE, TESTS ONLY.** Commits write their data without O_DSYNC (plain writes that sit
    /// in the disk's cache) and acknowledge at once: every acknowledged append since the last
    /// incidental sync is lost at a power loss. It exists so that the power-loss harness can
    /// show it catches a broker that acknowledges before its data is durable (issue 43: if it
    /// cannot, it is not testing power loss). Only `sluiced --test-unsafe-no-fsync-before-ack`
    /// sets it; false by default.
    pub unsafe_no_fsync_before_ack: bool,
}

pub const MIB: u64 = 1024 * 1024;

/// The zeroed space a new segment starts with: four blocks, room for a first few small
/// batches before the first zero-ahead (which rides along with a commit).
pub const PREALLOC_INITIAL_BYTES_DEFAULT: u64 = 4 * BLOCK_BYTES;

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes_max: 1024 * MIB,
            segment_age_ms_max: Some(7 * 24 * 3600 * 1000),
            index_interval_bytes: 4096,
            prealloc_chunk_bytes: 64 * MIB,
            prealloc_initial_bytes: PREALLOC_INITIAL_BYTES_DEFAULT,
            write_buffer_bytes_max: 8 * MIB as usize,
            batch_bytes_max: 4 * MIB as usize,
            coalesce_batch_bytes_max: 4 * 1024,
            read_cache_bytes_max: 8 * MIB as usize,
            index_cache_bytes_max: 16 * MIB as usize,
            index_persist_entries: 512,
            retention_ms: None,
            retention_bytes: None,
            unsafe_no_fsync_before_ack: false,
        }
    }
}

impl LogConfig {
    pub fn validate(&self) -> Result<(), StorageError> {
        let bad = |s: &str| Err(StorageError::Config(s.to_string()));
        if self.segment_bytes_max < 4 * BLOCK_BYTES || self.segment_bytes_max > u64::from(u32::MAX)
        {
            return bad("segment_bytes_max must be within [16 KiB, 4 GiB)");
        }
        if self.batch_bytes_max as u64 > self.segment_bytes_max {
            return bad("batch_bytes_max must not exceed segment_bytes_max");
        }
        if self.write_buffer_bytes_max < self.batch_bytes_max {
            return bad("write_buffer_bytes_max must be at least batch_bytes_max");
        }
        if self.index_interval_bytes == 0 || self.prealloc_chunk_bytes < BLOCK_BYTES {
            return bad("index_interval_bytes must be > 0 and prealloc_chunk_bytes >= 4 KiB");
        }
        if self.prealloc_initial_bytes < BLOCK_BYTES {
            return bad("prealloc_initial_bytes must be >= 4 KiB");
        }
        if self.index_persist_entries == 0 {
            return bad("index_persist_entries must be > 0");
        }
        Ok(())
    }

    /// The zeroed space a new segment is created with (block-aligned, within the segment).
    pub fn segment_initial_bytes(&self) -> u64 {
        crate::fs::align_up(
            self.prealloc_initial_bytes
                .min(self.prealloc_chunk_bytes)
                .min(self.segment_bytes_max),
        )
    }

    /// How far ahead of `data_end` (the end of a segment's data) zeroed space should reach:
    /// as far again as the data, within `[prealloc_initial_bytes, prealloc_chunk_bytes]`. The
    /// space allocated thus grows geometrically, so an empty or small segment costs little
    /// disk, a growing one is zeroed in O(log n) steps up to the chunk, and a full one keeps a
    /// whole chunk ahead as before.
    pub fn zero_ahead_bytes(&self, data_end: u64) -> u64 {
        data_end
            .max(self.prealloc_initial_bytes)
            .min(self.prealloc_chunk_bytes)
    }

    /// The furthest a torn commit can reach past the durable end of the active segment: bytes
    /// found beyond this after a bad batch cannot be a torn tail, so they signal corruption.
    /// The commits in flight write at most a write buffer's bytes (those started beside others
    /// are bounded by it too), plus a partial block rewritten and a block skipped by each.
    pub fn torn_window_bytes(&self) -> u64 {
        self.write_buffer_bytes_max as u64
            + (crate::log::COMMITS_IN_FLIGHT_MAX as u64 + 2) * BLOCK_BYTES
    }
}
