//! The I/O seam: everything the log does to a disk goes through [`Fs`] and [`File`].
//!
//! Two implementations: [`DmaFs`] (glommio DMA files, O_DIRECT on io_uring — production) and
//! [`SimFs`] (in memory, with the durability rules of a real disk: writes not covered by a
//! completed fdatasync, and directory changes not covered by a directory fsync, can be lost or
//! torn at a simulated power loss). [`FaultyFs`] wraps either and injects short writes, EIO,
//! ENOSPC and fsync failures on a schedule, so error paths are tested without a broken disk.
//!
//! The traits are deliberately not `Send`: each shard owns its files on its own thread.

mod dma;
mod faulty;
pub mod reclaim;
mod sim;

pub use dma::{raise_memlock_limit, DmaFs};
pub use faulty::{Fault, FaultPlan, FaultyFs, Op};
pub use sim::{CrashMode, SimFs};

use std::io;
use std::path::Path;

/// Positions and lengths of writes are multiples of this (O_DIRECT on 512 B and 4 KiB sector
/// disks alike).
pub const BLOCK_BYTES: u64 = 4096;

pub fn align_down(v: u64) -> u64 {
    v & !(BLOCK_BYTES - 1)
}

pub fn align_up(v: u64) -> u64 {
    (v + BLOCK_BYTES - 1) & !(BLOCK_BYTES - 1)
}

/// `parts` laid end to end, then zeros up to `len` bytes, into `out` (exactly `len` long).
fn fill_parts(out: &mut [u8], parts: &[&[u8]]) {
    let mut at = 0;
    for p in parts {
        out[at..at + p.len()].copy_from_slice(p);
        at += p.len();
    }
    out[at..].fill(0);
}

/// Returns `Pending` once (waking itself): whatever else is ready runs first. The log's group
/// commit gathers with it, simulated I/O yields this way, and tests use it to pause a task
/// between operations. Runtime-agnostic.
pub async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            std::task::Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    })
    .await
}

/// A file opened for reading and writing.
#[allow(async_fn_in_trait)] // single-threaded by design: futures are not Send
pub trait File: 'static {
    /// Reads up to `len` bytes at `pos` (fewer at end of file). The bytes are the read's own
    /// buffer where the file system can hand it over (the io_uring one does: no copy).
    async fn read_at(&self, pos: u64, len: usize) -> io::Result<bytes::Bytes>;
    /// Writes `data` at `pos`; both block-aligned. May write less (a short write): returns
    /// the count written.
    async fn write_at(&self, pos: u64, data: &[u8]) -> io::Result<usize>;
    /// Writes `data` at `pos` like [`File::write_at`], and returns only once the bytes written
    /// (and whatever metadata reading them back needs, such as the file size) are durable:
    /// O_DSYNC semantics. Other writes are not made durable by it.
    async fn write_durable_at(&self, pos: u64, data: &[u8]) -> io::Result<usize>;
    /// Writes `len` zero bytes at `pos` like [`File::write_at`] (both block-aligned; may write
    /// less). [`DmaFs`] fills its I/O buffer in place; this default writes a zeroed vector.
    async fn write_zeros_at(&self, pos: u64, len: usize) -> io::Result<usize> {
        self.write_at(pos, &vec![0u8; len]).await
    }
    /// [`File::write_durable_at`] of `parts` laid end to end and zero-padded to `len` bytes
    /// (`len` block-aligned, at least their total). [`DmaFs`] assembles them straight in the
    /// I/O buffer; this default concatenates first.
    async fn write_durable_parts(
        &self,
        pos: u64,
        parts: &[&[u8]],
        len: usize,
    ) -> io::Result<usize> {
        let mut buf = vec![0u8; len];
        fill_parts(&mut buf, parts);
        self.write_durable_at(pos, &buf).await
    }
    /// Makes all completed writes (and the file size) durable.
    async fn sync_data(&self) -> io::Result<()>;
    async fn size(&self) -> io::Result<u64>;
    /// Sets the file size (shrinking drops data; growing adds zeros).
    async fn truncate(&self, size: u64) -> io::Result<()>;
    async fn close(&self) -> io::Result<()>;
}

/// A file system: directories, names and the files in them.
#[allow(async_fn_in_trait)]
pub trait Fs: Clone + 'static {
    type File: File;
    /// Opens for read and write, creating the file if `create`.
    async fn open(&self, path: &Path, create: bool) -> io::Result<Self::File>;
    async fn remove(&self, path: &Path) -> io::Result<()>;
    /// Deletes `path`, a file nothing will read again, in the background where the file system
    /// can ([`DmaFs`]: on the [`reclaim`] thread, its space freed a step at a time); returns
    /// before the space is free. The default removes it now. Give the file a name recovery
    /// ignores first: until it is gone, it may be seen shortened.
    async fn reclaim(&self, path: &Path) -> io::Result<()> {
        self.remove(path).await
    }
    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes directory entries (creations, renames, removals) in `dir` durable.
    async fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Creates `dir` and its missing parents. Like `mkdir`, the new names are volatile until
    /// each parent is synced: use [`create_dir_all_durable`], which does that.
    async fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// File names (not paths) in `dir`.
    async fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    async fn exists(&self, path: &Path) -> bool;
}

/// The directory whose entry names `p` (`.` for a relative name of one component); `None` for
/// a root.
fn parent_dir(p: &Path) -> Option<&Path> {
    match p.parent() {
        Some(q) if q.as_os_str().is_empty() => Some(Path::new(".")),
        other => other,
    }
}

/// Creates `dir` and its missing parents durably: before it returns, the parent of every level
/// it created is synced, so that a power loss cannot take away a directory (and so everything
/// the caller then makes durable in it: segments, acknowledged appends). `mkdir` alone is
/// volatile until its parent is fsynced, like a file's creation (issue 43: sluiced lost every
/// acknowledged send at the first power loss because `data/queues/<id>/p00000` vanished).
///
/// Cheap: syncs happen only when something was created, never for a directory that was there.
/// One level more is synced then (best effort): the parent of the nearest level that already
/// existed, which another thread may have just created and not yet synced (two partitions of a
/// new queue opened at once on two shards). Not covered: a directory created by a process that
/// crashed before syncing its parent, found by the next start and used as it is.
pub async fn create_dir_all_durable<F: Fs>(fs: &F, dir: &Path) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut level = Some(dir);
    while let Some(p) = level {
        if p.as_os_str().is_empty() || fs.exists(p).await {
            break;
        }
        missing.push(p);
        level = p.parent();
    }
    fs.create_dir_all(dir).await?;
    let Some(&outermost) = missing.last() else {
        return Ok(());
    };
    if let Some(existing) = outermost.parent().filter(|p| !p.as_os_str().is_empty()) {
        if let Some(parent) = parent_dir(existing) {
            // Best effort: outside what this call created, maybe outside the data dir.
            let _ = fs.sync_dir(parent).await;
        }
    }
    for p in missing.iter().rev() {
        if let Some(parent) = parent_dir(p) {
            fs.sync_dir(parent).await?;
        }
    }
    Ok(())
}

/// Blocking form of [`create_dir_all_durable`] for code outside an executor (the broker's data
/// dir and key files): `create` makes the directories (e.g. a `DirBuilder` with a mode), then
/// the parent of each level that was missing is fsynced.
pub fn create_dir_all_durable_blocking(
    dir: &Path,
    create: impl FnOnce(&Path) -> io::Result<()>,
) -> io::Result<()> {
    let missing: Vec<&Path> = dir
        .ancestors()
        .take_while(|p| !p.as_os_str().is_empty() && !p.exists())
        .collect();
    create(dir)?;
    for p in missing.iter().rev() {
        if let Some(parent) = parent_dir(p) {
            std::fs::File::open(parent)?.sync_all()?;
        }
    }
    Ok(())
}
