//! faultfs: a FUSE file system that forgets what was not made durable.
//!
//! `kill -9` cannot show a missing fsync: the page cache survives the process. faultfs models a
//! disk with a volatile cache under a mount point, so a harness can cut the power under a real
//! process (`sluiced`) and restart it on what a real disk would hold.
//!
//! # Semantics
//!
//! There are two states: the **volatile** state, which every read, `stat` and `readdir` sees (as a
//! page cache would), and the **durable** state, what survives a power off.
//!
//! * **File bytes** become durable by `fsync` or `fdatasync` of the file (any handle of it), or
//!   by a write through a handle opened `O_DSYNC`/`O_SYNC` or issued with `RWF_DSYNC`/`RWF_SYNC`
//!   (io_uring's per-write flag): such a write returns only once the file's bytes and size are
//!   durable (faultfs syncs the whole file, not only the written range: a real disk could lose
//!   other unsynced ranges of the file that faultfs keeps).
//! * **File size** changes (`ftruncate` down or up, writes past the end, `fallocate` mode 0) are
//!   volatile until the file is fsynced or fdatasynced. A truncate that is not synced reverts at
//!   a power off: the cut bytes come back.
//! * **Names**: `creat`/`mknod`/`mkdir`, `unlink`/`rmdir` and `rename` change the directory's
//!   volatile entries. An `fsync` of a directory makes all its current entries durable, as they
//!   are then (a creation not followed by the directory's fsync disappears; a rename reverts). A
//!   rename across directories needs both fsynced: only the target's fsync leaves the file under
//!   both names after a power off; only the source's loses it. A file's fsync does not make its
//!   name durable, nor does a directory's fsync make its entries' contents durable.
//! * A durable name whose file was never synced holds a file of size 0 after a power off.
//! * Not modelled (they change at once and survive): mode, owner, times. Hard links and symlinks
//!   are refused (`EPERM`/`ENOSYS`), as are `fallocate` modes other than 0 and `KEEP_SIZE`
//!   (`EOPNOTSUPP`), `RENAME_EXCHANGE` and `RENAME_WHITEOUT` (`EINVAL`).
//!
//! **Power off** ([`Mounted::power_off`], or `poweroff` written to [`CTL_NAME`]) drops the whole
//! volatile state: files and directories not reachable through durable names are gone, the others
//! get their durable entries and bytes back. The disk then stays **off**: every request but the
//! control file's fails with `EIO`, so nothing a process does between the cut and its kill
//! reaches the disk, until **power on** ([`Mounted::power_on`], `poweron`). Every handle opened
//! before the power off fails with `EIO` for good: the harness kills the processes that held them
//! and restarts them on the same mount after the power on (no remount needed: the kernel caches
//! no names, attributes or pages of faultfs, see below). A round under load: `poweroff` (or
//! `tear <seed>`), `kill -9`, `poweron`, restart. **Torn power off** (`tear <seed>`, [`Mounted::power_off_torn`]) first
//! writes a prefix of the latest write that is not yet durable (to a file that keeps a durable
//! name: a tear elsewhere would change nothing) into the durable state, of a
//! length drawn from the seed in `0..len` (the disk extends the durable size as far as the prefix
//! reaches), then powers off.
//!
//! # Control
//!
//! In-process: the [`Mounted`] handle. From another process: write `poweroff`, `tear <seed>` or
//! `poweron` to `<mount>/.faultfs-ctl` (one write; `EINVAL` for anything else); read it for
//! `epoch <power offs>`, `volatile_bytes <n>` and `power on|off`. The file is not listed by `readdir` and cannot
//! be created, renamed or removed. The `faultfs` binary mounts one from the command line.
//!
//! # Limits
//!
//! Unsynced bytes are held in memory, at most [`Limits::volatile_bytes_max`] (default
//! [`model::VOLATILE_BYTES_MAX_DEFAULT`], 1 GiB); a write past it fails with `ENOSPC`. faultfs
//! never flushes to make room: that would make unsynced data durable and hide the bug it exists
//! to find. Durable bytes live in the backing directory (one file per inode, named by its number;
//! the backing directory must start empty); the durable namespace lives in memory. Both last as
//! long as the faultfs process: the "disk" is the process, and a new mount starts empty.
//!
//! # Kernel caches and O_DIRECT
//!
//! Every open is answered with `FOPEN_DIRECT_IO`: reads and writes bypass the kernel's page
//! cache (faultfs is the page cache), and `O_DIRECT` opens work (glommio's DMA files). Entry and
//! attribute timeouts are zero, so the kernel asks again after a power off instead of showing
//! a name or size that is gone. mmap of a file is therefore not supported (the kernel refuses
//! shared writable maps of direct-I/O files).

mod fuse;
pub mod model;

pub use fuse::{Command, CTL_NAME};
pub use model::{FsError, Limits, PowerOffReport};

use fuser::MountOption;
use model::Disk;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Why a mount failed.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("backing directory {path}: {source}")]
    Backing { path: PathBuf, source: FsError },
    #[error("mounting on {path}: {source}")]
    Mount {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A mounted faultfs. Dropping it unmounts.
pub struct Mounted {
    disk: Arc<Mutex<Disk>>,
    session: Option<fuser::BackgroundSession>,
    mountpoint: PathBuf,
}

impl Mounted {
    /// Mounts a fresh, empty faultfs on `mountpoint`, its durable bytes in `backing` (created if
    /// missing; must be empty).
    pub fn mount(backing: &Path, mountpoint: &Path, limits: Limits) -> Result<Mounted, MountError> {
        let disk =
            Disk::new(backing.to_path_buf(), limits).map_err(|source| MountError::Backing {
                path: backing.to_path_buf(),
                source,
            })?;
        let disk = Arc::new(Mutex::new(disk));
        let mut options = vec![
            MountOption::FSName("faultfs".into()),
            MountOption::DefaultPermissions,
        ];
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            // Other users' processes (a broker run as another user) may use it; only root may
            // ask for this without /etc/fuse.conf's user_allow_other.
            options.push(MountOption::AllowOther);
        }
        let fs = fuse::FaultFuse {
            disk: disk.clone(),
            trace: std::env::var_os(fuse::TRACE_ENV).is_some_and(|v| v == "1"),
        };
        let session =
            fuser::spawn_mount2(fs, mountpoint, &options).map_err(|source| MountError::Mount {
                path: mountpoint.to_path_buf(),
                source,
            })?;
        Ok(Mounted {
            disk,
            session: Some(session),
            mountpoint: mountpoint.to_path_buf(),
        })
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Drops everything volatile (see the crate docs); requests fail with EIO until
    /// [`Mounted::power_on`].
    pub fn power_off(&self) -> Result<PowerOffReport, FsError> {
        fuse::lock(&self.disk).power_off()
    }

    /// Tears the latest unsynced write at a seeded byte, then powers off.
    pub fn power_off_torn(&self, seed: u64) -> Result<PowerOffReport, FsError> {
        fuse::lock(&self.disk).power_off_torn(seed)
    }

    /// Serves requests again, from the durable state.
    pub fn power_on(&self) {
        fuse::lock(&self.disk).power_on()
    }

    /// Whether requests are served (false between a power off and a power on).
    pub fn is_on(&self) -> bool {
        fuse::lock(&self.disk).is_on()
    }

    /// Power offs so far.
    pub fn epoch(&self) -> u64 {
        fuse::lock(&self.disk).epoch()
    }

    /// Unsynced bytes held in memory.
    pub fn volatile_bytes(&self) -> u64 {
        fuse::lock(&self.disk).volatile_bytes()
    }

    /// Unmounts. If a process still uses the mount, it is detached lazily (it goes once the last
    /// user closes) and the serving thread is left to end then.
    pub fn unmount(mut self) {
        self.unmount_inner();
    }

    fn unmount_inner(&mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        let Ok(path) = CString::new(self.mountpoint.as_os_str().as_bytes()) else {
            return;
        };
        // SAFETY: `path` is a valid NUL-terminated string that outlives the call.
        let plain = unsafe { libc::umount2(path.as_ptr(), 0) } == 0;
        if plain {
            // The kernel ends the session: the serving thread returns.
            let _ = session.guard.join();
            return;
        }
        // SAFETY: as above.
        unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
        drop(session);
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        self.unmount_inner();
    }
}

/// Whether FUSE can be used here (`/dev/fuse` exists): tests skip without it.
pub fn fuse_available() -> bool {
    Path::new("/dev/fuse").exists()
}
