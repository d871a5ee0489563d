//! The FUSE edge: kernel requests to [`Disk`] calls, errors to errnos, and the control file.

use crate::model::{Disk, FsError, Ino, Kind, Stat, CTL_INO, ROOT_INO};
use fuser::{
    FileAttr, FileType, Filesystem, KernelConfig, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
};
use std::ffi::OsStr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

/// The control file's name in the mount's root. Writing `poweroff` or `tear <seed>` to it powers
/// the disk off; reading it tells the epoch (power offs so far) and the unsynced bytes.
pub const CTL_NAME: &str = ".faultfs-ctl";

/// Entries and attributes are never cached by the kernel: after a power off a cached name or
/// size would show state that is gone.
const TTL: Duration = Duration::ZERO;

/// The block size reported to stat: the O_DIRECT alignment callers pick from it.
const BLOCK_SIZE_BYTES: u32 = 4096;

/// Largest write request the kernel sends (it splits larger writes): 1 MiB.
const MAX_WRITE_BYTES: u32 = 1 << 20;

/// statfs numbers: a large, mostly free disk (capacity is not modelled).
const STATFS_BLOCKS: u64 = 1 << 30;
const STATFS_FILES: u64 = 1 << 24;
const NAME_LEN_MAX: u32 = 255;

/// Every open bypasses the kernel's page cache: reads and writes reach the model, which is the
/// page cache. It also lets O_DIRECT opens through.
const OPEN_FLAGS: u32 = fuser::consts::FOPEN_DIRECT_IO;

/// The control file's handle (real handles start at 1).
const CTL_FH: u64 = 0;

pub(crate) struct FaultFuse {
    pub(crate) disk: Arc<Mutex<Disk>>,
    /// Log each changing request and its result to stderr (`FAULTFS_TRACE=1`): to see which
    /// fsyncs a program makes and which it misses.
    pub(crate) trace: bool,
}

/// The environment variable that turns the request trace on.
pub const TRACE_ENV: &str = "FAULTFS_TRACE";

macro_rules! trace {
    ($fs:expr, $($arg:tt)*) => {
        if $fs.trace {
            eprintln!("faultfs: {}", format_args!($($arg)*));
        }
    };
}

pub(crate) fn lock(disk: &Mutex<Disk>) -> MutexGuard<'_, Disk> {
    // A panic in another holder leaves the model as consistent as its last whole call; keep going.
    disk.lock().unwrap_or_else(|p| p.into_inner())
}

fn attr(s: &Stat) -> FileAttr {
    FileAttr {
        ino: s.ino,
        size: s.size,
        blocks: s.size.div_ceil(512),
        atime: s.meta.atime,
        mtime: s.meta.mtime,
        ctime: s.meta.ctime,
        crtime: s.meta.ctime,
        kind: match s.kind {
            Kind::File => FileType::RegularFile,
            Kind::Dir => FileType::Directory,
        },
        perm: s.meta.perm,
        nlink: s.nlink,
        uid: s.meta.uid,
        gid: s.meta.gid,
        rdev: 0,
        blksize: BLOCK_SIZE_BYTES,
        flags: 0,
    }
}

fn ctl_attr() -> FileAttr {
    let t = SystemTime::UNIX_EPOCH;
    FileAttr {
        ino: CTL_INO,
        size: 0,
        blocks: 0,
        atime: t,
        mtime: t,
        ctime: t,
        crtime: t,
        kind: FileType::RegularFile,
        perm: 0o600,
        nlink: 1,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: BLOCK_SIZE_BYTES,
        flags: 0,
    }
}

fn is_ctl(parent: Ino, name: &OsStr) -> bool {
    parent == ROOT_INO && name == CTL_NAME
}

fn time(t: TimeOrNow) -> SystemTime {
    match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    }
}

/// A control command, as written to the control file.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    PowerOff,
    Tear { seed: u64 },
    PowerOn,
}

impl Command {
    pub fn parse(text: &[u8]) -> Option<Command> {
        let text = std::str::from_utf8(text).ok()?;
        let mut words = text.split_whitespace();
        let cmd = match (words.next()?, words.next()) {
            ("poweroff", None) => Command::PowerOff,
            ("poweron", None) => Command::PowerOn,
            ("tear", Some(seed)) => Command::Tear {
                seed: seed.parse().ok()?,
            },
            _ => return None,
        };
        words.next().is_none().then_some(cmd)
    }
}

impl FaultFuse {
    fn run(&self, cmd: Command) -> Result<(), FsError> {
        let mut d = lock(&self.disk);
        match cmd {
            Command::PowerOff => {
                let report = d.power_off()?;
                eprintln!("faultfs: {cmd:?}: {report:?}");
            }
            Command::Tear { seed } => {
                let report = d.power_off_torn(seed)?;
                eprintln!("faultfs: {cmd:?}: {report:?}");
            }
            Command::PowerOn => {
                d.power_on();
                eprintln!("faultfs: {cmd:?}");
            }
        }
        Ok(())
    }

    /// While the power is off every request but the control file's fails with EIO, as a dead
    /// disk's would: nothing a process does between the cut and its kill reaches the disk.
    fn off(&self) -> bool {
        !lock(&self.disk).is_on()
    }

    fn entry(&self, ino: Ino, reply: ReplyEntry) {
        match lock(&self.disk).stat(ino) {
            Ok(s) => reply.entry(&TTL, &attr(&s), 0),
            Err(e) => reply.error(e.errno()),
        }
    }
}

impl Filesystem for FaultFuse {
    fn init(&mut self, _req: &Request<'_>, config: &mut KernelConfig) -> Result<(), libc::c_int> {
        // The kernel may offer less; what it grants is fine.
        let _ = config.set_max_write(MAX_WRITE_BYTES);
        Ok(())
    }

    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        if is_ctl(parent, name) {
            return reply.entry(&TTL, &ctl_attr(), 0);
        }
        if self.off() {
            return reply.error(libc::EIO);
        }
        let found = lock(&self.disk).lookup(parent, name);
        match found {
            Ok(ino) => self.entry(ino, reply),
            Err(e) => reply.error(e.errno()),
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        if ino == CTL_INO {
            return reply.attr(&TTL, &ctl_attr());
        }
        // The root's attributes stay readable while off: the kernel checks them on the way to
        // the control file.
        if ino != ROOT_INO && self.off() {
            return reply.error(libc::EIO);
        }
        match lock(&self.disk).stat(ino) {
            Ok(s) => reply.attr(&TTL, &attr(&s)),
            Err(e) => reply.error(e.errno()),
        }
    }

    fn setattr(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<u64>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<u32>,
        reply: ReplyAttr,
    ) {
        if ino == CTL_INO {
            // `echo poweroff > ctl` truncates first; nothing to truncate.
            return reply.attr(&TTL, &ctl_attr());
        }
        if self.off() {
            return reply.error(libc::EIO);
        }
        let mut d = lock(&self.disk);
        let result = (|| {
            if let Some(fh) = fh {
                d.handle(fh)?;
            }
            if let Some(size) = size {
                let done = d.set_size(ino, size);
                trace!(self, "truncate {ino} to {size} -> {done:?}");
                done?;
            }
            // Permission bits only: the file type is fixed at creation.
            let perm = mode.map(|m| (m & 0o7777) as u16);
            d.set_meta(ino, perm, uid, gid, atime.map(time), mtime.map(time))?;
            d.stat(ino)
        })();
        match result {
            Ok(s) => reply.attr(&TTL, &attr(&s)),
            Err(e) => reply.error(e.errno()),
        }
    }

    fn mknod(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(libc::EPERM);
        }
        if is_ctl(parent, name) {
            return reply.error(libc::EEXIST);
        }
        if self.off() {
            return reply.error(libc::EIO);
        }
        let perm = (mode & !umask & 0o7777) as u16;
        let made = lock(&self.disk).make(parent, name, Kind::File, perm, req.uid(), req.gid());
        trace!(self, "mknod {parent}/{name:?} -> {made:?}");
        match made {
            Ok(ino) => self.entry(ino, reply),
            Err(e) => reply.error(e.errno()),
        }
    }

    fn mkdir(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        if is_ctl(parent, name) {
            return reply.error(libc::EEXIST);
        }
        if self.off() {
            return reply.error(libc::EIO);
        }
        let perm = (mode & !umask & 0o7777) as u16;
        let made = lock(&self.disk).make(parent, name, Kind::Dir, perm, req.uid(), req.gid());
        trace!(self, "mkdir {parent}/{name:?} -> {made:?}");
        match made {
            Ok(ino) => self.entry(ino, reply),
            Err(e) => reply.error(e.errno()),
        }
    }

    fn unlink(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        if is_ctl(parent, name) {
            return reply.error(libc::EPERM);
        }
        if self.off() {
            return reply.error(libc::EIO);
        }
        let done = lock(&self.disk).remove(parent, name, false);
        trace!(self, "unlink {parent}/{name:?} -> {done:?}");
        match done {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e.errno()),
        }
    }

    fn rmdir(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        if self.off() {
            return reply.error(libc::EIO);
        }
        let done = lock(&self.disk).remove(parent, name, true);
        trace!(self, "rmdir {parent}/{name:?} -> {done:?}");
        match done {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e.errno()),
        }
    }

    fn rename(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
        reply: ReplyEmpty,
    ) {
        if is_ctl(parent, name) || is_ctl(newparent, newname) {
            return reply.error(libc::EPERM);
        }
        if self.off() {
            return reply.error(libc::EIO);
        }
        let done = lock(&self.disk).rename(parent, name, newparent, newname, flags);
        trace!(
            self,
            "rename {parent}/{name:?} -> {newparent}/{newname:?} -> {done:?}"
        );
        match done {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e.errno()),
        }
    }

    fn link(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        _newparent: u64,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        // Hard links are not modelled (a file has one name at a time).
        reply.error(libc::EPERM);
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, flags: i32, reply: ReplyOpen) {
        if ino == CTL_INO {
            return reply.opened(CTL_FH, OPEN_FLAGS);
        }
        if self.off() {
            return reply.error(libc::EIO);
        }
        match lock(&self.disk).open(ino, flags) {
            Ok(fh) => reply.opened(fh, OPEN_FLAGS),
            Err(e) => reply.error(e.errno()),
        }
    }

    fn create(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        if is_ctl(parent, name) {
            return reply.error(libc::EEXIST);
        }
        if self.off() {
            return reply.error(libc::EIO);
        }
        let perm = (mode & !umask & 0o7777) as u16;
        let mut d = lock(&self.disk);
        let result = d
            .make(parent, name, Kind::File, perm, req.uid(), req.gid())
            .and_then(|ino| Ok((d.open(ino, flags)?, d.stat(ino)?)));
        trace!(
            self,
            "create {parent}/{name:?} flags {flags:#x} -> {:?}",
            result.as_ref().map(|(fh, s)| (s.ino, fh))
        );
        match result {
            Ok((fh, s)) => reply.created(&TTL, &attr(&s), 0, fh, OPEN_FLAGS),
            Err(e) => reply.error(e.errno()),
        }
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        if ino == CTL_INO {
            let d = lock(&self.disk);
            let text = format!(
                "epoch {}\nvolatile_bytes {}\npower {}\n",
                d.epoch(),
                d.volatile_bytes(),
                if d.is_on() { "on" } else { "off" }
            );
            let start = usize::try_from(offset)
                .unwrap_or(usize::MAX)
                .min(text.len());
            let end = start.saturating_add(size as usize).min(text.len());
            return reply.data(&text.as_bytes()[start..end]);
        }
        if self.off() {
            return reply.error(libc::EIO);
        }
        let Ok(offset) = u64::try_from(offset) else {
            return reply.error(libc::EINVAL);
        };
        let d = lock(&self.disk);
        match d.handle(fh).and_then(|_| d.read(ino, offset, size)) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e.errno()),
        }
    }

    fn write(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        fh: u64,
        offset: i64,
        data: &[u8],
        _write_flags: u32,
        flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyWrite,
    ) {
        if ino == CTL_INO {
            let Some(cmd) = Command::parse(data) else {
                return reply.error(libc::EINVAL);
            };
            return match self.run(cmd) {
                Ok(()) => reply.written(data.len() as u32),
                Err(e) => reply.error(e.errno()),
            };
        }
        if self.off() {
            return reply.error(libc::EIO);
        }
        let Ok(offset) = u64::try_from(offset) else {
            return reply.error(libc::EINVAL);
        };
        let mut d = lock(&self.disk);
        let result = d.handle(fh).and_then(|(_, open_flags)| {
            // The kernel passes the file's flags with RWF_DSYNC/RWF_SYNC of this write folded
            // in (O_SYNC includes the O_DSYNC bit); the open flags are checked too.
            let durable = (flags | open_flags) & libc::O_DSYNC != 0;
            let n = d.write(ino, offset, data, durable);
            trace!(
                self,
                "write {ino} @{offset} +{} durable={durable} -> {n:?}",
                data.len()
            );
            n
        });
        match result {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(e.errno()),
        }
    }

    fn flush(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _lo: u64, reply: ReplyEmpty) {
        // close() makes nothing durable.
        reply.ok();
    }

    fn release(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        _flags: i32,
        _lock_owner: Option<u64>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if fh != CTL_FH {
            lock(&self.disk).release(fh);
        }
        reply.ok();
    }

    fn fsync(&mut self, _req: &Request<'_>, ino: u64, fh: u64, _datasync: bool, reply: ReplyEmpty) {
        if ino == CTL_INO {
            return reply.ok();
        }
        if self.off() {
            return reply.error(libc::EIO);
        }
        // fsync and fdatasync alike: size is the only metadata modelled, and fdatasync syncs it
        // too when reading the data needs it.
        let mut d = lock(&self.disk);
        let done = d.handle(fh).and_then(|_| d.sync_file(ino));
        trace!(self, "fsync {ino} -> {done:?}");
        match done {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e.errno()),
        }
    }

    fn opendir(&mut self, _req: &Request<'_>, ino: u64, flags: i32, reply: ReplyOpen) {
        if self.off() {
            return reply.error(libc::EIO);
        }
        match lock(&self.disk).open(ino, flags) {
            Ok(fh) => reply.opened(fh, 0),
            Err(e) => reply.error(e.errno()),
        }
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        fh: u64,
        offset: i64,
        mut reply: ReplyDirectory,
    ) {
        if self.off() {
            return reply.error(libc::EIO);
        }
        let d = lock(&self.disk);
        let listed = d.handle(fh).and_then(|_| d.list(ino));
        let children = match listed {
            Ok(c) => c,
            Err(e) => return reply.error(e.errno()),
        };
        let dots = [
            (OsStr::new(".").to_owned(), ino, Kind::Dir),
            (OsStr::new("..").to_owned(), ino, Kind::Dir),
        ];
        let skip = usize::try_from(offset).unwrap_or(0);
        for (i, (name, child, kind)) in dots.into_iter().chain(children).enumerate().skip(skip) {
            let t = match kind {
                Kind::File => FileType::RegularFile,
                Kind::Dir => FileType::Directory,
            };
            // The offset is the next entry's index.
            if reply.add(child, (i + 1) as i64, t, &name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(&mut self, _req: &Request<'_>, _ino: u64, fh: u64, _f: i32, reply: ReplyEmpty) {
        lock(&self.disk).release(fh);
        reply.ok();
    }

    fn fsyncdir(&mut self, _req: &Request<'_>, ino: u64, fh: u64, _ds: bool, reply: ReplyEmpty) {
        if self.off() {
            return reply.error(libc::EIO);
        }
        let mut d = lock(&self.disk);
        let done = d.handle(fh).and_then(|_| d.sync_dir(ino));
        trace!(self, "fsyncdir {ino} -> {done:?}");
        match done {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e.errno()),
        }
    }

    fn statfs(&mut self, _req: &Request<'_>, _ino: u64, reply: ReplyStatfs) {
        if self.off() {
            return reply.error(libc::EIO);
        }
        reply.statfs(
            STATFS_BLOCKS,
            STATFS_BLOCKS,
            STATFS_BLOCKS,
            STATFS_FILES,
            STATFS_FILES,
            BLOCK_SIZE_BYTES,
            NAME_LEN_MAX,
            BLOCK_SIZE_BYTES,
        );
    }

    fn access(&mut self, _req: &Request<'_>, _ino: u64, _mask: i32, reply: ReplyEmpty) {
        // Permissions are checked by the kernel (mounted with default_permissions).
        reply.ok();
    }

    fn fallocate(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        fh: u64,
        offset: i64,
        length: i64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if self.off() {
            return reply.error(libc::EIO);
        }
        let (Ok(offset), Ok(length)) = (u64::try_from(offset), u64::try_from(length)) else {
            return reply.error(libc::EINVAL);
        };
        let mut d = lock(&self.disk);
        let done = d
            .handle(fh)
            .and_then(|_| d.fallocate(ino, offset, length, mode));
        trace!(
            self,
            "fallocate {ino} @{offset} +{length} mode {mode:#x} -> {done:?}"
        );
        match done {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e.errno()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_commands_parse_strictly() {
        assert_eq!(Command::parse(b"poweroff\n"), Some(Command::PowerOff));
        assert_eq!(Command::parse(b"poweron"), Some(Command::PowerOn));
        assert_eq!(Command::parse(b"tear 42"), Some(Command::Tear { seed: 42 }));
        assert_eq!(Command::parse(b"tear"), None);
        assert_eq!(Command::parse(b"tear x"), None);
        assert_eq!(Command::parse(b"poweroff now"), None);
        assert_eq!(Command::parse(b"\xff"), None);
    }
}
