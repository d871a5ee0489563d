//! Disk space as a first-class state: sends stop *before* the disk is full.
//!
//! Each shard looks at the free space of the data directory's file system (statvfs) at most
//! every [`DISK_CHECK_INTERVAL_MS`]. Below the reserve (`BrokerConfig::disk_free_bytes_min`) the
//! broker refuses what adds data — sends, batch sends, stream produces, new queues — with a
//! retryable error that names the cause (`ServiceUnavailable`, "the disk is full"), before
//! anything reaches a queue's engine or log: nothing is half-applied, no partition rebuilds, the
//! approximate counts stay right. Receives, deletes and visibility changes go on (their records
//! are small and land in segment space already allocated and zeroed, which the reserve leaves
//! room for), so consumers can drain the queue; once space is back — a drained segment deleted
//! by compaction, a file removed by the operator — sends resume by themselves, no restart.
//! `/ready` and the `sluice_disk_*` metrics report it.

use crate::error::{ServiceError, ServiceResult};
use std::cell::Cell;
use std::path::PathBuf;

/// How stale a shard's view of the free space may be, ms.
pub const DISK_CHECK_INTERVAL_MS: u64 = 100;
/// Free bytes under which sends stop, unless configured: room for the receives, deletes,
/// checkpoints and segment rolls that drain a queue.
pub const DISK_FREE_BYTES_MIN_DEFAULT: u64 = 256 * 1024 * 1024;

/// One shard's view of its data disk.
#[derive(Debug)]
pub struct DiskGuard {
    dir: PathBuf,
    free_bytes_min: u64,
    checked_ms: Cell<Option<u64>>,
    free_bytes: Cell<u64>,
}

impl DiskGuard {
    pub fn new(dir: PathBuf, free_bytes_min: u64) -> Self {
        DiskGuard {
            dir,
            free_bytes_min,
            checked_ms: Cell::new(None),
            free_bytes: Cell::new(u64::MAX),
        }
    }

    /// Free bytes for an unprivileged writer (`f_bavail`), as of at most
    /// [`DISK_CHECK_INTERVAL_MS`] ago. A file system that cannot be asked reads as unlimited
    /// (storage's own ENOSPC handling still applies).
    pub fn free_bytes(&self, now_ms: u64) -> u64 {
        let fresh = self
            .checked_ms
            .get()
            .is_some_and(|at| now_ms.saturating_sub(at) < DISK_CHECK_INTERVAL_MS && now_ms >= at);
        if !fresh {
            let free = rustix::fs::statvfs(&self.dir)
                .map(|s| s.f_bavail.saturating_mul(s.f_frsize))
                .unwrap_or(u64::MAX);
            self.free_bytes.set(free);
            self.checked_ms.set(Some(now_ms));
        }
        self.free_bytes.get()
    }

    pub fn is_full(&self, now_ms: u64) -> bool {
        self.free_bytes(now_ms) < self.free_bytes_min
    }

    /// `Ok` while there is room for new data, else the retryable disk-full error.
    pub fn check(&self, now_ms: u64) -> ServiceResult<()> {
        let free = self.free_bytes(now_ms);
        if free < self.free_bytes_min {
            return Err(ServiceError::DiskFull {
                free_bytes: free,
                reserve_bytes: self.free_bytes_min,
            });
        }
        Ok(())
    }

    pub fn free_bytes_min(&self) -> u64 {
        self.free_bytes_min
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserve_above_the_free_space_refuses_and_names_the_cause() {
        let dir = tempfile::tempdir().expect("dir");
        let roomy = DiskGuard::new(dir.path().to_path_buf(), 1);
        roomy.check(0).expect("a byte is free");
        let full = DiskGuard::new(dir.path().to_path_buf(), u64::MAX);
        let e = full.check(0).expect_err("no disk has u64::MAX bytes free");
        let info = e.info();
        assert_eq!((info.code, info.http_status), ("ServiceUnavailable", 503));
        assert!(info.retryable);
        assert!(e.to_string().contains("disk is full"), "{e}");
        // The view is cached for the interval, then refreshed.
        let g = DiskGuard::new(dir.path().to_path_buf(), 1);
        let a = g.free_bytes(1_000);
        g.free_bytes.set(7);
        assert_eq!(g.free_bytes(1_050), 7, "cached");
        assert_eq!(
            g.free_bytes(1_000 + DISK_CHECK_INTERVAL_MS),
            g.free_bytes.get()
        );
        assert!(g.free_bytes.get() > 7 || a == 7);
    }
}
