//! File modes of the broker's data and configuration: the data dir holds every tenant's
//! messages, the receipt-handle key and the TLS key, so nothing in it is for other users.
//!
//! - The data dir is created 0700 ([`create_data_dir`]).
//! - `sluiced` (and `sluice serve`) run with umask 0077 ([`restrict_umask`]), so every file the
//!   broker creates — segments, indices, metadata, keys — is 0600 and every directory 0700,
//!   whichever module creates it (the storage crate opens its files with the default 0666).
//! - At start, anything in the data dir still open to group or others (an older version's
//!   0644 segments) is tightened ([`tighten_data_dir`]) and the count logged.
//! - A config file that holds secrets (access keys) and is readable by others is warned about
//!   ([`secret_file_exposed`]); the broker still starts — the operator owns that file.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

/// Mode of the data dir and every directory in it.
pub const DATA_DIR_MODE: u32 = 0o700;
/// The umask of the broker process: files 0600, directories 0700.
pub const BROKER_UMASK: u32 = 0o077;
/// How deep [`tighten_data_dir`] walks (the layout is `queues/<id>/p<n>/<segment>`: 4 levels);
/// a bound, so that a symlink loop or a stray tree cannot make start-up walk forever.
pub const DATA_DIR_WALK_DEPTH_MAX: usize = 8;

/// Creates `dir` (and missing parents) with mode 0700, durably (each created level's parent
/// fsynced: a data dir lost with the power takes the receipt key and every queue with it); an
/// existing dir is left as it is here (see [`tighten_data_dir`]).
pub fn create_data_dir(dir: &Path) -> std::io::Result<()> {
    sluice_storage::fs::create_dir_all_durable_blocking(dir, |d| {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(DATA_DIR_MODE)
            .create(d)
    })
}

/// Sets the process umask to [`BROKER_UMASK`]; returns the previous one. For the daemon only:
/// the umask is process-wide, so an embedding program decides its own.
pub fn restrict_umask() -> u32 {
    // SAFETY: umask(2) cannot fail and touches no memory; it changes the process's file
    // creation mask, which is exactly the intent (called before the broker creates files).
    let old = unsafe { libc::umask(BROKER_UMASK as libc::mode_t) };
    old as u32
}

/// Removes group and other permissions from `dir` and everything under it (directories and
/// regular files; symlinks are not followed). Returns how many entries were changed.
pub fn tighten_data_dir(dir: &Path) -> std::io::Result<usize> {
    fn walk(path: &Path, depth: usize, changed: &mut usize) -> std::io::Result<()> {
        let meta = std::fs::symlink_metadata(path)?;
        if meta.file_type().is_symlink() {
            return Ok(());
        }
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & !0o077))?;
            *changed += 1;
        }
        if meta.is_dir() && depth < DATA_DIR_WALK_DEPTH_MAX {
            for entry in std::fs::read_dir(path)? {
                walk(&entry?.path(), depth + 1, changed)?;
            }
        }
        Ok(())
    }
    let mut changed = 0;
    walk(dir, 0, &mut changed)?;
    Ok(changed)
}

/// The mode of `path` if it is readable by users other than its owner's group (world-readable).
pub fn secret_file_exposed(path: &Path) -> Option<u32> {
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
    (mode & 0o004 != 0).then_some(mode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_dir_is_created_private_and_old_modes_are_tightened() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path().join("a/b/data");
        create_data_dir(&dir).expect("create");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        std::fs::create_dir(dir.join("queues")).unwrap();
        std::fs::set_permissions(dir.join("queues"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        std::fs::write(dir.join("queues/seg.log"), b"x").unwrap();
        std::fs::set_permissions(
            dir.join("queues/seg.log"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        assert_eq!(tighten_data_dir(&dir).unwrap(), 2);
        assert_eq!(mode(&dir.join("queues")), 0o700);
        assert_eq!(mode(&dir.join("queues/seg.log")), 0o600);
        assert_eq!(tighten_data_dir(&dir).unwrap(), 0, "nothing left to change");
        assert_eq!(secret_file_exposed(&dir.join("queues/seg.log")), None);
        std::fs::set_permissions(
            dir.join("queues/seg.log"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        assert_eq!(
            secret_file_exposed(&dir.join("queues/seg.log")),
            Some(0o644)
        );
    }
}
