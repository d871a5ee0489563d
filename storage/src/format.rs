//! The version of a log directory's on-disk layout, kept in a small marker file beside the
//! segments, `log.format`: one line, `sluice log format <version>`.
//!
//! | version | layout                                                                        |
//! |---------|-------------------------------------------------------------------------------|
//! | 1       | no marker. Segments `<base>.log` of batches (format v1) end to end from       |
//! |         | position 0, pre-zeroed space after the end; sparse `.index`, `.timeindex`     |
//! | 2       | no marker (2026-12-05). Version 1 with gaps: zeros a commit started beside    |
//! |         | another skipped, up to the next 4 KiB boundary                                |
//! | 3       | the marker. Version 2, with batches in format v2 (the term) as well as v1     |
//! | 4       | version 3, with batches in format v3 (Kafka-compressed) as well               |
//!
//! The marker went to 4 with batch format v3: a build of layout 3 refuses a directory marked
//! 4 with [`StorageError::UnsupportedFormat`] instead of opening a log that may hold v3
//! batches (it would take one at the end of the active segment for a torn tail).
//!
//! This code reads all of them the same way (a reader that steps over gaps reads a log without
//! any), so a directory without a marker is taken as version 2.
//!
//! [`Log::open`](crate::Log::open) reads the marker before it touches anything in the
//! directory: a version newer than [`SEGMENT_FORMAT_VERSION`] is refused with
//! [`StorageError::UnsupportedFormat`]; an older one (or none) is read as it is, and the marker
//! is then brought to the current version, durably, before the log takes an append that an
//! older build could not read. (Older builds do not look at the marker: once a log holds v2
//! batches, a downgrade past this version is not supported.)

use crate::error::{Result, StorageError};
use crate::fs::{align_up, File, Fs};
use std::path::{Path, PathBuf};

/// The layout version this code writes (and the newest it reads).
pub const SEGMENT_FORMAT_VERSION: u32 = 4;
/// The version of a directory without a marker (1 and 2 read alike; see the table).
pub const SEGMENT_FORMAT_VERSION_UNMARKED: u32 = 2;
/// The marker's file name in a log directory.
pub const FORMAT_FILE_NAME: &str = "log.format";
const MARKER_PREFIX: &str = "sluice log format ";
/// A marker longer than this is not one (bounds the read).
const MARKER_BYTES_MAX: u64 = 64;

pub(crate) fn marker_path(dir: &Path) -> PathBuf {
    dir.join(FORMAT_FILE_NAME)
}

/// The marker's text for `version`.
fn marker_text(version: u32) -> String {
    format!("{MARKER_PREFIX}{version}\n")
}

/// The version a marker's bytes name, or why they do not name one.
pub(crate) fn parse_marker(bytes: &[u8]) -> std::result::Result<u32, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "marker is not text".to_string())?;
    let version = text
        .strip_prefix(MARKER_PREFIX)
        .and_then(|rest| rest.strip_suffix('\n'))
        .ok_or_else(|| format!("marker {text:?} is not `{MARKER_PREFIX}<version>`"))?;
    version
        .parse::<u32>()
        .map_err(|_| format!("marker version {version:?} is not a number"))
}

/// The directory's layout version: the marker's, [`SEGMENT_FORMAT_VERSION_UNMARKED`] if there
/// is none; an error for a version newer than this code's or a marker that cannot be read.
pub(crate) async fn read_version<F: Fs>(fs: &F, dir: &Path) -> Result<u32> {
    let path = marker_path(dir);
    if !fs.exists(&path).await {
        return Ok(SEGMENT_FORMAT_VERSION_UNMARKED);
    }
    let file = fs
        .open(&path, false)
        .await
        .map_err(|e| StorageError::io("open", &path, e))?;
    let size = file
        .size()
        .await
        .map_err(|e| StorageError::io("stat", &path, e))?;
    let corrupt = |reason: String| StorageError::Corruption {
        path: path.clone(),
        position: 0,
        reason,
    };
    if size > MARKER_BYTES_MAX {
        return Err(corrupt(format!("format marker of {size} bytes")));
    }
    let bytes = file
        .read_at(0, size as usize)
        .await
        .map_err(|e| StorageError::io("read", &path, e))?;
    let version = parse_marker(&bytes).map_err(corrupt)?;
    if version > SEGMENT_FORMAT_VERSION {
        return Err(StorageError::UnsupportedFormat {
            path,
            found: version,
            supported: SEGMENT_FORMAT_VERSION,
        });
    }
    Ok(version)
}

/// Writes the current version's marker durably and atomically: a temporary file, synced,
/// renamed over the marker, the directory synced. (A crash leaves the old marker or the new
/// one; a stray temporary file is removed at the next open, as every `*.tmp` is.)
pub(crate) async fn write_version<F: Fs>(fs: &F, dir: &Path) -> Result<()> {
    let path = marker_path(dir);
    let tmp = dir.join(format!("{FORMAT_FILE_NAME}.tmp"));
    let text = marker_text(SEGMENT_FORMAT_VERSION);
    let file = fs
        .open(&tmp, true)
        .await
        .map_err(|e| StorageError::io("create", &tmp, e))?;
    // Writes are whole blocks (O_DIRECT); the file is then cut to the text.
    let mut block = text.clone().into_bytes();
    block.resize(align_up(text.len() as u64) as usize, 0);
    let written = file
        .write_at(0, &block)
        .await
        .map_err(|e| StorageError::io("write", &tmp, e))?;
    if written < block.len() {
        return Err(StorageError::io(
            "write",
            &tmp,
            std::io::Error::new(std::io::ErrorKind::WriteZero, "short write of a marker"),
        ));
    }
    file.truncate(text.len() as u64)
        .await
        .map_err(|e| StorageError::io("truncate", &tmp, e))?;
    file.sync_data()
        .await
        .map_err(|e| StorageError::io("fdatasync", &tmp, e))?;
    file.close()
        .await
        .map_err(|e| StorageError::io("close", &tmp, e))?;
    fs.rename(&tmp, &path)
        .await
        .map_err(|e| StorageError::io("rename", &tmp, e))?;
    fs.sync_dir(dir)
        .await
        .map_err(|e| StorageError::io("sync_dir", dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_parse_and_garbage_does_not() {
        assert_eq!(parse_marker(marker_text(3).as_bytes()), Ok(3));
        assert_eq!(parse_marker(b"sluice log format 17\n"), Ok(17));
        for bad in [
            &b""[..],
            b"sluice log format 2",
            b"sluice log format x\n",
            b"sluice log format -1\n",
            b"other 2\n",
            b"\xff\xfe",
        ] {
            assert!(parse_marker(bad).is_err(), "{bad:?}");
        }
    }
}
