//! The durability semantics of the crate docs, each checked through a real mount: a fresh faultfs
//! on a temp dir per test, unmounted when the test ends (also on failure: `Mounted` unmounts on
//! drop). Skipped, with the reason printed, only where /dev/fuse is missing.

use sluice_faultfs::{Limits, Mounted, CTL_NAME};
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

struct Fixture {
    // Declared first: dropped (unmounted) before the temp dir is removed.
    fs: Mounted,
    _dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Option<Fixture> {
        Fixture::with_limits(Limits::default())
    }

    fn with_limits(limits: Limits) -> Option<Fixture> {
        if !sluice_faultfs::fuse_available() {
            eprintln!("skipped: /dev/fuse is missing, faultfs cannot mount here");
            return None;
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let mnt = dir.path().join("mnt");
        fs::create_dir(&mnt).expect("mount point");
        let fs = Mounted::mount(&dir.path().join("backing"), &mnt, limits).expect("mount");
        Some(Fixture { fs, _dir: dir })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.fs.mountpoint().join(name)
    }

    fn root(&self) -> PathBuf {
        self.fs.mountpoint().to_path_buf()
    }

    /// Power off and on again.
    fn power_off(&self) {
        self.fs.power_off().expect("power off");
        assert!(!self.fs.is_on());
        self.fs.power_on();
    }
}

fn sync_dir(dir: &Path) {
    File::open(dir)
        .expect("open dir")
        .sync_all()
        .expect("fsync dir");
}

fn write_synced(path: &Path, data: &[u8]) {
    let mut f = File::create(path).expect("create");
    f.write_all(data).expect("write");
    f.sync_all().expect("fsync");
}

fn read(path: &Path) -> std::io::Result<Vec<u8>> {
    fs::read(path)
}

#[test]
fn fsynced_data_survives_power_off() {
    let Some(fx) = Fixture::new() else { return };
    write_synced(&fx.path("a"), b"durable bytes");
    sync_dir(&fx.root());
    fx.power_off();
    assert_eq!(read(&fx.path("a")).expect("read"), b"durable bytes");
}

#[test]
fn fdatasync_makes_data_durable_too() {
    let Some(fx) = Fixture::new() else { return };
    let mut f = File::create(fx.path("a")).expect("create");
    sync_dir(&fx.root());
    f.write_all(b"data").expect("write");
    f.sync_data().expect("fdatasync");
    fx.power_off();
    assert_eq!(read(&fx.path("a")).expect("read"), b"data");
}

#[test]
fn unsynced_data_does_not_survive() {
    let Some(fx) = Fixture::new() else { return };
    write_synced(&fx.path("a"), b"synced;");
    sync_dir(&fx.root());
    let mut f = OpenOptions::new()
        .append(true)
        .open(fx.path("a"))
        .expect("open");
    f.write_all(b" and then not").expect("write");
    f.write_all_at(b"S", 0).expect("overwrite");
    drop(f); // close() makes nothing durable.
    fx.power_off();
    assert_eq!(read(&fx.path("a")).expect("read"), b"synced;");
}

#[test]
fn reads_see_volatile_data_before_the_power_off() {
    let Some(fx) = Fixture::new() else { return };
    fs::write(fx.path("a"), b"only in the cache").expect("write");
    fs::create_dir(fx.path("d")).expect("mkdir");
    assert_eq!(read(&fx.path("a")).expect("read"), b"only in the cache");
    let names: Vec<_> = fs::read_dir(fx.root())
        .expect("readdir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, ["a", "d"], "the control file is not listed");
    assert_eq!(fs::metadata(fx.path("a")).expect("stat").len(), 17);
    fx.power_off();
    assert_eq!(
        read(&fx.path("a")).map_err(|e| e.kind()),
        Err(ErrorKind::NotFound)
    );
    assert!(!fx.path("d").exists());
}

#[test]
fn a_created_file_whose_directory_was_not_fsynced_disappears() {
    let Some(fx) = Fixture::new() else { return };
    fs::create_dir(fx.path("d")).expect("mkdir");
    sync_dir(&fx.root());
    // The file's own fsync does not make its name durable.
    write_synced(&fx.path("d/new"), b"synced data, unsynced name");
    fx.power_off();
    assert!(fx.path("d").is_dir(), "the directory's own name was synced");
    assert!(!fx.path("d/new").exists());
}

#[test]
fn a_name_synced_without_its_data_holds_an_empty_file() {
    let Some(fx) = Fixture::new() else { return };
    fs::write(fx.path("a"), b"never synced").expect("write");
    sync_dir(&fx.root());
    fx.power_off();
    assert_eq!(read(&fx.path("a")).expect("read"), b"");
}

#[test]
fn a_rename_not_followed_by_a_directory_fsync_reverts() {
    let Some(fx) = Fixture::new() else { return };
    write_synced(&fx.path("old"), b"v1");
    write_synced(&fx.path("tmp"), b"v2");
    sync_dir(&fx.root());
    fs::rename(fx.path("tmp"), fx.path("old")).expect("rename");
    assert_eq!(read(&fx.path("old")).expect("read"), b"v2");
    fx.power_off();
    assert_eq!(read(&fx.path("old")).expect("read"), b"v1");
    assert_eq!(read(&fx.path("tmp")).expect("read"), b"v2");

    // With the directory's fsync it sticks.
    fs::rename(fx.path("tmp"), fx.path("old")).expect("rename");
    sync_dir(&fx.root());
    fx.power_off();
    assert_eq!(read(&fx.path("old")).expect("read"), b"v2");
    assert!(!fx.path("tmp").exists());
}

#[test]
fn an_unlink_not_followed_by_a_directory_fsync_reverts() {
    let Some(fx) = Fixture::new() else { return };
    write_synced(&fx.path("a"), b"still here");
    sync_dir(&fx.root());
    fs::remove_file(fx.path("a")).expect("unlink");
    assert!(!fx.path("a").exists());
    fx.power_off();
    assert_eq!(read(&fx.path("a")).expect("read"), b"still here");
}

#[test]
fn o_dsync_writes_survive_without_fsync() {
    let Some(fx) = Fixture::new() else { return };
    File::create(fx.path("log")).expect("create");
    sync_dir(&fx.root());
    let f = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DSYNC)
        .open(fx.path("log"))
        .expect("open O_DSYNC");
    f.write_all_at(b"acknowledged", 0).expect("write");
    fx.power_off();
    assert_eq!(read(&fx.path("log")).expect("read"), b"acknowledged");
}

/// A 4 KiB-aligned buffer for O_DIRECT.
#[repr(C, align(4096))]
struct Block([u8; 4096]);

#[test]
fn o_direct_opens_work_and_rwf_dsync_writes_survive() {
    let Some(fx) = Fixture::new() else { return };
    File::create(fx.path("seg")).expect("create");
    sync_dir(&fx.root());
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(fx.path("seg"))
        .expect("O_DIRECT open");
    let block = Block([7u8; 4096]);
    let iov = libc::iovec {
        iov_base: block.0.as_ptr() as *mut libc::c_void,
        iov_len: block.0.len(),
    };
    // The per-write durability flag io_uring uses (RWF_DSYNC), through pwritev2.
    // SAFETY: the iovec points at `block`, alive and unchanged for the call; the fd is open.
    let n = unsafe {
        libc::pwritev2(
            std::os::fd::AsRawFd::as_raw_fd(&f),
            &iov,
            1,
            0,
            libc::RWF_DSYNC,
        )
    };
    assert_eq!(n, 4096, "pwritev2: {}", std::io::Error::last_os_error());
    // A plain write after it is not durable.
    f.write_all_at(&[9u8; 4096], 4096).expect("write");
    fx.power_off();
    assert_eq!(read(&fx.path("seg")).expect("read"), vec![7u8; 4096]);
}

#[test]
fn a_truncate_not_synced_reverts() {
    let Some(fx) = Fixture::new() else { return };
    write_synced(&fx.path("a"), b"0123456789");
    sync_dir(&fx.root());
    let f = OpenOptions::new()
        .write(true)
        .open(fx.path("a"))
        .expect("open");
    f.set_len(3).expect("truncate");
    f.set_len(6).expect("extend");
    assert_eq!(read(&fx.path("a")).expect("read"), b"012\0\0\0");
    fx.power_off();
    assert_eq!(read(&fx.path("a")).expect("read"), b"0123456789");

    // Synced, it sticks.
    let f = OpenOptions::new()
        .write(true)
        .open(fx.path("a"))
        .expect("open");
    f.set_len(3).expect("truncate");
    f.sync_all().expect("fsync");
    fx.power_off();
    assert_eq!(read(&fx.path("a")).expect("read"), b"012");
}

#[test]
fn a_torn_write_leaves_a_prefix_of_the_last_write() {
    let Some(fx) = Fixture::new() else { return };
    const LEN: usize = 4096;
    write_synced(&fx.path("a"), &[b'a'; LEN]);
    sync_dir(&fx.root());
    let f = OpenOptions::new()
        .write(true)
        .open(fx.path("a"))
        .expect("open");
    f.write_all_at(&[b'x'; 100], 0).expect("earlier write");
    f.write_all_at(&[b'b'; LEN], 0).expect("last write");
    drop(f);
    // From another process's point of view: the control file.
    fs::write(fx.path(CTL_NAME), b"tear 12345").expect("tear");
    fs::write(fx.path(CTL_NAME), b"poweron").expect("power on");
    let data = read(&fx.path("a")).expect("read");
    assert_eq!(data.len(), LEN);
    let kept = data.iter().take_while(|&&b| b == b'b').count();
    assert!(kept < LEN, "a torn write is not whole");
    assert!(
        data[kept..].iter().all(|&b| b == b'a'),
        "past the prefix the durable bytes: {:?}",
        &data[kept..kept + 16.min(LEN - kept)]
    );
    // The same seed tears at the same byte.
    let mut status = String::new();
    File::open(fx.path(CTL_NAME))
        .expect("ctl")
        .read_to_string(&mut status)
        .expect("read ctl");
    assert!(status.starts_with("epoch 1\n"), "{status}");
    let f = OpenOptions::new()
        .write(true)
        .open(fx.path("a"))
        .expect("open");
    f.write_all_at(&[b'c'; LEN], 0).expect("write");
    drop(f);
    let report = fx.fs.power_off_torn(12345).expect("tear");
    fx.fs.power_on();
    let (_, _, kept_again, written) = report.torn.expect("a write was torn");
    assert_eq!(written, LEN as u64);
    assert_eq!(kept_again as usize, kept);
}

#[test]
fn handles_from_before_a_power_off_fail_and_bad_commands_are_refused() {
    let Some(fx) = Fixture::new() else { return };
    write_synced(&fx.path("a"), b"x");
    sync_dir(&fx.root());
    let f = File::open(fx.path("a")).expect("open");
    fs::write(fx.path(CTL_NAME), b"poweroff\n").expect("power off");
    fs::write(fx.path(CTL_NAME), b"poweron\n").expect("power on");
    assert_eq!(fx.fs.epoch(), 1);
    let mut buf = [0u8; 1];
    let err = f.read_at(&mut buf, 0).expect_err("stale handle");
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    let err = fs::write(fx.path(CTL_NAME), b"reboot").expect_err("unknown command");
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
    assert_eq!(fx.fs.epoch(), 1);
}

#[test]
fn a_directory_tree_survives_only_as_far_as_it_was_synced() {
    let Some(fx) = Fixture::new() else { return };
    fs::create_dir_all(fx.path("q/p0")).expect("mkdir -p");
    write_synced(&fx.path("q/p0/seg"), b"records");
    sync_dir(&fx.path("q/p0"));
    sync_dir(&fx.path("q"));
    // The root was never synced: q, and all under it, is gone.
    fx.power_off();
    assert!(!fx.path("q").exists());

    fs::create_dir_all(fx.path("q/p0")).expect("mkdir -p");
    write_synced(&fx.path("q/p0/seg"), b"records");
    sync_dir(&fx.path("q/p0"));
    sync_dir(&fx.path("q"));
    sync_dir(&fx.root());
    fx.power_off();
    assert_eq!(read(&fx.path("q/p0/seg")).expect("read"), b"records");
}

#[test]
fn past_the_volatile_bound_writes_fail_with_enospc() {
    let Some(fx) = Fixture::with_limits(Limits {
        volatile_bytes_max: 64 * 1024,
    }) else {
        return;
    };
    let f = File::create(fx.path("a")).expect("create");
    f.write_all_at(&[1u8; 64 * 1024], 0).expect("fits");
    let err = f.write_all_at(&[1u8; 1], 64 * 1024).expect_err("over");
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    f.sync_all().expect("fsync frees the room");
    f.write_all_at(&[1u8; 1], 64 * 1024).expect("fits again");
}

#[test]
fn a_rename_across_directories_needs_both_fsynced() {
    let Some(fx) = Fixture::new() else { return };
    fs::create_dir(fx.path("a")).expect("mkdir a");
    fs::create_dir(fx.path("b")).expect("mkdir b");
    sync_dir(&fx.root());
    write_synced(&fx.path("a/f"), b"payload");
    sync_dir(&fx.path("a"));

    // Only the target synced: the file is under both names after a power off.
    fs::rename(fx.path("a/f"), fx.path("b/f")).expect("rename");
    sync_dir(&fx.path("b"));
    fx.power_off();
    assert_eq!(read(&fx.path("a/f")).expect("old name"), b"payload");
    assert_eq!(read(&fx.path("b/f")).expect("new name"), b"payload");

    // Only the source synced: the file is lost.
    fs::remove_file(fx.path("b/f")).expect("unlink");
    sync_dir(&fx.path("b"));
    fs::rename(fx.path("a/f"), fx.path("b/f")).expect("rename");
    sync_dir(&fx.path("a"));
    fx.power_off();
    assert!(!fx.path("a/f").exists());
    assert!(!fx.path("b/f").exists());
}

#[test]
fn fallocate_extends_the_size_only_until_a_power_off() {
    let Some(fx) = Fixture::new() else { return };
    write_synced(&fx.path("seg"), b"head");
    sync_dir(&fx.root());
    let f = OpenOptions::new()
        .write(true)
        .open(fx.path("seg"))
        .expect("open");
    // SAFETY: a plain syscall on an open descriptor.
    let rc = unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, 1 << 20) };
    assert_eq!(rc, 0, "fallocate: {}", std::io::Error::last_os_error());
    assert_eq!(fs::metadata(fx.path("seg")).expect("stat").len(), 1 << 20);
    fx.power_off();
    assert_eq!(read(&fx.path("seg")).expect("read"), b"head");
}

#[test]
fn while_the_power_is_off_only_the_control_file_answers() {
    let Some(fx) = Fixture::new() else { return };
    write_synced(&fx.path("a"), b"durable");
    sync_dir(&fx.root());
    fs::write(fx.path(CTL_NAME), b"poweroff").expect("power off");
    let eio = Some(libc::EIO);
    assert_eq!(read(&fx.path("a")).map_err(|e| e.raw_os_error()), Err(eio));
    assert_eq!(
        fs::write(fx.path("b"), b"after the cut").map_err(|e| e.raw_os_error()),
        Err(eio)
    );
    assert_eq!(
        fs::create_dir(fx.path("d")).map_err(|e| e.raw_os_error()),
        Err(eio)
    );
    assert_eq!(
        fs::read_dir(fx.root())
            .map(|_| ())
            .map_err(|e| e.raw_os_error()),
        Err(eio)
    );
    let status = fs::read_to_string(fx.path(CTL_NAME)).expect("ctl answers");
    assert!(status.ends_with("power off\n"), "{status}");
    fs::write(fx.path(CTL_NAME), b"poweron").expect("power on");
    assert_eq!(read(&fx.path("a")).expect("read"), b"durable");
    assert!(
        !fx.path("b").exists(),
        "nothing done while off reached the disk"
    );
    assert!(!fx.path("d").exists());
}
