//! Freeing the space of deleted files without holding up a shard.
//!
//! Deleting a file frees its blocks at once, and a file system mounted with online discard
//! (ext4 `-o discard`, common on cloud VMs) then sends the device a discard of all of them,
//! waiting for it in the thread whose `unlink` or last `close` freed the inode. On the 2-vCPU
//! VM this was measured on, freeing a sealed 256 MiB queue segment held the thread for
//! 50–100 ms and the disk's flushes behind it: every durable write in flight waited that long
//! (a publish→receive p99.9 of 60–100 ms in `latency-5k-2k`, one such stall per run). The
//! shard did it itself when it dropped the last descriptor of a segment that was already
//! unlinked, and when it removed a deleted queue's directory.
//!
//! So a file to delete is handed to one reclaimer thread per process. After
//! [`RECLAIM_GRACE_MS`] (reads that began before the deletion finish first), it shrinks the file
//! [`RECLAIM_STEP_BYTES`] at a time from the end, pausing [`RECLAIM_PAUSE_MS`] between steps —
//! each step's discard is small, and durable writes pass between them — and then removes the
//! name. Whoever closes the file last then frees nothing. RocksDB's delete scheduler truncates
//! large files in steps for the same reason.
//!
//! The caller gives the file a name that recovery ignores *before* handing it over (the log
//! renames a segment to `<base>.log.deleted` and syncs its directory): a crash part-way leaves a
//! shortened file under that name, never a shortened segment.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Bytes freed per step.
pub const RECLAIM_STEP_BYTES: u64 = 8 * 1024 * 1024;
/// Pause between two steps, ms.
pub const RECLAIM_PAUSE_MS: u64 = 5;
/// How long after its hand-over a file is first shrunk, ms.
pub const RECLAIM_GRACE_MS: u64 = 1_000;
/// The suffix of a deleted segment's file while its space is reclaimed.
pub const DELETED_SUFFIX: &str = ".deleted";

struct Job {
    path: PathBuf,
    /// Also remove the parent directory if that leaves it empty.
    then_parent: bool,
    not_before: Instant,
}

static RECLAIMER: OnceLock<mpsc::Sender<Job>> = OnceLock::new();

/// Hands `path` (a file, or a directory and everything under it) to the reclaimer thread and
/// returns at once. With `then_parent`, the parent directory goes too once empty. Failures are
/// logged, not returned: the space of what is left is reclaimed at the next start (the log
/// removes `*.deleted` files when it opens, the broker the directories of deleted queues).
pub fn reclaim_in_background(path: PathBuf, then_parent: bool) {
    let job = Job {
        path,
        then_parent,
        not_before: Instant::now() + Duration::from_millis(RECLAIM_GRACE_MS),
    };
    let sender = RECLAIMER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        let spawned = std::thread::Builder::new()
            .name("sluice-reclaim".into())
            .spawn(move || {
                for job in rx {
                    if let Some(wait) = job.not_before.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    if let Err(e) = reclaim_now(&job.path, job.then_parent) {
                        tracing::warn!(path = %job.path.display(), error = %e, "reclaiming a deleted file's space");
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "the reclaimer thread did not start");
        }
        tx
    });
    if sender.send(job).is_err() {
        tracing::warn!("the reclaimer thread is gone; a deleted file waits for the next start");
    }
}

/// `path` with [`DELETED_SUFFIX`] appended: the name a file or directory takes before it is
/// handed to the reclaimer, so that nothing created later under the old name is reached.
pub fn deleted_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(DELETED_SUFFIX);
    PathBuf::from(name)
}

/// Shrinks and removes `path` now, on the calling thread (a directory: every file under it,
/// then the directories), then its parent if `then_parent` and it is empty. A path already gone
/// is not an error.
pub fn reclaim_now(path: &Path, then_parent: bool) -> std::io::Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        // Someone else removed it (a test or a tool wiping the data directory): its parent
        // is not this job's to remove either.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            reclaim_now(&entry?.path(), false)?;
        }
        ignore_gone(std::fs::remove_dir(path))?;
    } else {
        if meta.is_file() && meta.len() > RECLAIM_STEP_BYTES {
            shrink_in_steps(path, meta.len())?;
        }
        ignore_gone(std::fs::remove_file(path))?;
    }
    if then_parent {
        if let Some(parent) = path.parent() {
            // Not empty (another shard's partitions are still there): that shard removes it.
            let _ = std::fs::remove_dir(parent);
        }
    }
    Ok(())
}

fn shrink_in_steps(path: &Path, len: u64) -> std::io::Result<()> {
    let file = match std::fs::OpenOptions::new().write(true).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let mut size = len;
    while size > 0 {
        size = size.saturating_sub(RECLAIM_STEP_BYTES);
        file.set_len(size)?;
        std::thread::sleep(Duration::from_millis(RECLAIM_PAUSE_MS));
    }
    Ok(())
}

fn ignore_gone(r: std::io::Result<()>) -> std::io::Result<()> {
    match r {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_is_reclaimed_with_its_empty_parent_and_a_busy_parent_stays() {
        let dir = tempfile::tempdir().expect("temp dir");
        let queue = dir.path().join("queue");
        let part = queue.join("p0");
        std::fs::create_dir_all(&part).expect("dirs");
        let big = part.join("00000000000000000000.log");
        std::fs::write(&big, vec![7u8; (2 * RECLAIM_STEP_BYTES + 123) as usize]).expect("write");
        std::fs::write(part.join("small.index"), b"x").expect("write");
        // Read through a descriptor opened before the reclaim: it sees the file shrink, and
        // its close frees nothing (the point of shrinking first).
        let held = std::fs::File::open(&big).expect("open");
        reclaim_now(&part, true).expect("reclaim");
        assert!(
            !part.exists() && !queue.exists(),
            "the partition and its empty queue dir go"
        );
        assert_eq!(
            held.metadata().expect("stat").len(),
            0,
            "shrunk to nothing first"
        );
        drop(held);

        let other = dir.path().join("other");
        std::fs::create_dir_all(other.join("p1")).expect("dirs");
        std::fs::create_dir_all(other.join("p2")).expect("dirs");
        reclaim_now(&other.join("p1"), true).expect("reclaim");
        assert!(
            other.join("p2").exists(),
            "a parent with other partitions stays"
        );
        reclaim_now(&dir.path().join("never-was"), false).expect("gone is fine");
    }

    #[test]
    fn a_background_reclaim_waits_out_its_grace_then_removes() {
        let dir = tempfile::tempdir().expect("temp dir");
        let f = dir.path().join("x.log.deleted");
        std::fs::write(&f, vec![1u8; 4096]).expect("write");
        let started = Instant::now();
        reclaim_in_background(f.clone(), false);
        assert!(f.exists(), "not before the grace period");
        while f.exists() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "reclaimed in time"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(started.elapsed() >= Duration::from_millis(RECLAIM_GRACE_MS));
    }
}
