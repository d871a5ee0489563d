//! The replica's hard state on disk: term, vote and disk id (what Raft requires durable before
//! any message of the same `Ready` goes out), the log's base, and the membership entries the
//! log may hold.
//!
//! One small file in the log's directory, replaced atomically: written whole to a temporary
//! file, synced, renamed over the old one, the directory synced. A crash leaves the old file or
//! the new one (a stray `*.tmp` is removed when the log opens). Layout, little-endian:
//!
//! ```text
//! magic "SLHS" | u8 version (1) | u64 term | u8 has_vote | u64 vote | u128 disk
//! | u8 has_base [ u64 offset | u64 term | u32 len | membership ]
//! | u16 configs | per config: u64 offset | u64 term | u32 len | membership
//! | u64 xxh3-64 of every byte before it
//! ```
//!
//! **Why the membership entries are here.** Raft must restore with every membership entry in
//! its log, and those are control batches anywhere in it; finding them would take a scan of
//! the whole log. Instead the driver writes this file, listing the new entry, *before* it
//! stages a membership entry, so no membership entry is ever in the log without being listed.
//! The list may name more than the log holds (a crash before the staging, or a truncation): at
//! restore each listed entry is checked against the batch at its offset (a Raft control batch
//! of the same term and membership; a truncated-and-rewritten offset holds another term), and
//! only those that match are kept.

use crate::error::ReplicaError;
use sluice_raft::{DiskId, HardState, Membership, Offset, SnapshotMeta, Term};
use sluice_storage::fs::{align_up, File, Fs};
use sluice_storage::StorageError;
use std::path::{Path, PathBuf};
use xxhash_rust::xxh3::xxh3_64;

/// The file's name in the log directory.
pub const HARD_STATE_FILE: &str = "raft.state";
const MAGIC: &[u8; 4] = b"SLHS";
/// The layout version; a newer one is refused, never guessed at.
pub const HARD_STATE_VERSION: u8 = 1;
/// Upper bound of the file (a membership is at most ~1.6 KiB; hundreds of changes fit).
pub const HARD_STATE_BYTES_MAX: u64 = 1024 * 1024;

/// What the file holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PersistedState {
    pub hard: HardState,
    /// What stands below the log's first offset: the bootstrap membership at offset 0 for a
    /// group created here; `None` for a replica created empty to be caught up by a leader.
    pub base: Option<SnapshotMeta>,
    /// Membership entries the log may hold, ascending by offset: `(offset, term, membership)`.
    pub configs: Vec<(Offset, Term, Membership)>,
}

impl PersistedState {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(128);
        b.extend_from_slice(MAGIC);
        b.push(HARD_STATE_VERSION);
        b.extend_from_slice(&self.hard.term.to_le_bytes());
        b.push(u8::from(self.hard.vote.is_some()));
        b.extend_from_slice(&self.hard.vote.unwrap_or(0).to_le_bytes());
        b.extend_from_slice(&self.hard.disk.0.to_le_bytes());
        let put_membership = |b: &mut Vec<u8>, o: Offset, t: Term, m: &Membership| {
            b.extend_from_slice(&o.to_le_bytes());
            b.extend_from_slice(&t.to_le_bytes());
            let m = m.encode();
            b.extend_from_slice(&(m.len() as u32).to_le_bytes());
            b.extend_from_slice(&m);
        };
        match &self.base {
            Some(s) => {
                b.push(1);
                put_membership(&mut b, s.offset, s.term, &s.membership);
            }
            None => b.push(0),
        }
        b.extend_from_slice(&(self.configs.len() as u16).to_le_bytes());
        for (o, t, m) in &self.configs {
            put_membership(&mut b, *o, *t, m);
        }
        let sum = xxh3_64(&b);
        b.extend_from_slice(&sum.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self, String> {
        if b.len() < 8 {
            return Err(format!("{} bytes, too short", b.len()));
        }
        let mut r = Reader::framed(b, MAGIC, HARD_STATE_VERSION)?;
        let term = r.u64()?;
        let has_vote = r.u8()? != 0;
        let vote = r.u64()?;
        let disk = DiskId(u128::from_le_bytes(r.take(16)?.try_into().expect("16")));
        let membership = |r: &mut Reader<'_>| -> Result<(Offset, Term, Membership), String> {
            let o = r.u64()?;
            let t = r.u64()?;
            let len = u32::from_le_bytes(r.take(4)?.try_into().expect("4")) as usize;
            let m = Membership::decode(r.take(len)?).map_err(|e| e.to_string())?;
            Ok((o, t, m))
        };
        let base = match r.u8()? {
            0 => None,
            _ => {
                let (offset, term, membership) = membership(&mut r)?;
                Some(SnapshotMeta {
                    offset,
                    term,
                    membership,
                })
            }
        };
        let n = u16::from_le_bytes(r.take(2)?.try_into().expect("2"));
        let mut configs = Vec::with_capacity(usize::from(n));
        for _ in 0..n {
            configs.push(membership(&mut r)?);
        }
        if !r.0.is_empty() {
            return Err(format!("{} trailing bytes", r.0.len()));
        }
        Ok(PersistedState {
            hard: HardState {
                term,
                vote: has_vote.then_some(vote),
                disk,
            },
            base,
            configs,
        })
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    /// The body of one of this module's files (`magic | version | fields | xxh3-64 of all
    /// before it`), past its magic and version: the checksum, magic and version checked. `b`
    /// holds at least the 8-byte checksum (callers check the length first).
    fn framed(b: &'a [u8], magic: &[u8], version: u8) -> Result<Reader<'a>, String> {
        let (body, sum) = b.split_at(b.len() - 8);
        if xxh3_64(body) != u64::from_le_bytes(sum.try_into().expect("8 bytes")) {
            return Err("checksum mismatch".into());
        }
        let mut r = Reader(body);
        if r.take(4)? != magic {
            return Err("bad magic".into());
        }
        let found = r.u8()?;
        if found != version {
            return Err(format!("version {found}; this build reads {version}"));
        }
        Ok(r)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("truncated".into());
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
}

fn path(dir: &Path) -> PathBuf {
    dir.join(HARD_STATE_FILE)
}

/// Reads the file: `None` if there is none.
pub async fn load<F: Fs>(fs: &F, dir: &Path) -> Result<Option<PersistedState>, ReplicaError> {
    let p = path(dir);
    let Some(bytes) = read_small(fs, &p, HARD_STATE_BYTES_MAX).await? else {
        return Ok(None);
    };
    PersistedState::decode(&bytes)
        .map(Some)
        .map_err(|why| ReplicaError::BadHardState { path: p, why })
}

/// Reads a small file whole: `None` if there is none; refused above `size_bytes_max`.
async fn read_small<F: Fs>(
    fs: &F,
    p: &Path,
    size_bytes_max: u64,
) -> Result<Option<Vec<u8>>, ReplicaError> {
    if !fs.exists(p).await {
        return Ok(None);
    }
    let io = |op, e| ReplicaError::Storage(StorageError::io(op, p, e));
    let file = fs.open(p, false).await.map_err(|e| io("open", e))?;
    let size = file.size().await.map_err(|e| io("stat", e))?;
    if size > size_bytes_max {
        return Err(ReplicaError::BadHardState {
            path: p.to_path_buf(),
            why: format!("{size} bytes, above the limit"),
        });
    }
    let bytes = file
        .read_at(0, size as usize)
        .await
        .map_err(|e| io("read", e))?;
    file.close().await.map_err(|e| io("close", e))?;
    Ok(Some(bytes.to_vec()))
}

/// Replaces the file durably and atomically (temporary file, sync, rename, directory sync).
pub async fn store<F: Fs>(fs: &F, dir: &Path, s: &PersistedState) -> Result<(), ReplicaError> {
    let bytes = s.encode();
    if bytes.len() as u64 > HARD_STATE_BYTES_MAX {
        return Err(ReplicaError::BadHardState {
            path: path(dir),
            why: format!("{} bytes to write, above the limit", bytes.len()),
        });
    }
    replace(fs, dir, HARD_STATE_FILE, &bytes).await
}

/// Replaces `dir/name` with `bytes` durably and atomically: written whole to `name.tmp`,
/// synced, renamed over the old file, the directory synced. A crash leaves the old or the new.
async fn replace<F: Fs>(fs: &F, dir: &Path, name: &str, bytes: &[u8]) -> Result<(), ReplicaError> {
    let p = dir.join(name);
    let tmp = dir.join(format!("{name}.tmp"));
    let io = |op, at: &Path, e| ReplicaError::Storage(StorageError::io(op, at, e));
    let file = fs
        .open(&tmp, true)
        .await
        .map_err(|e| io("create", &tmp, e))?;
    // Writes are whole blocks (O_DIRECT); the file is then cut to its length.
    let mut block = bytes.to_vec();
    block.resize(align_up(bytes.len() as u64) as usize, 0);
    let mut at = 0;
    while at < block.len() {
        let n = file
            .write_at(at as u64, &block[at..])
            .await
            .map_err(|e| io("write", &tmp, e))?;
        if n == 0 {
            return Err(io(
                "write",
                &tmp,
                std::io::Error::new(std::io::ErrorKind::WriteZero, "short write"),
            ));
        }
        at += n;
    }
    file.truncate(bytes.len() as u64)
        .await
        .map_err(|e| io("truncate", &tmp, e))?;
    file.sync_data()
        .await
        .map_err(|e| io("fdatasync", &tmp, e))?;
    file.close().await.map_err(|e| io("close", &tmp, e))?;
    fs.rename(&tmp, &p)
        .await
        .map_err(|e| io("rename", &tmp, e))?;
    fs.sync_dir(dir).await.map_err(|e| io("sync_dir", dir, e))
}

// ---- The commit floor ------------------------------------------------------------------------

/// The commit floor's file in the log directory: an offset known committed (every offset below
/// it is committed), so a restarted replica reports a committed prefix at once instead of none
/// (its Raft core restarts with no commit and re-learns it from the leader). It lags the true
/// commit (written every so often, not on every commit) and is never above it. Layout,
/// little-endian: `magic "SLCF" | u8 version (1) | u64 floor | u64 xxh3-64 of the bytes before`.
pub const COMMIT_FLOOR_FILE: &str = "raft.commit";
const COMMIT_FLOOR_MAGIC: &[u8; 4] = b"SLCF";
/// The commit floor's layout version; another one is refused, never guessed at.
pub const COMMIT_FLOOR_VERSION: u8 = 1;
const COMMIT_FLOOR_BYTES: usize = 4 + 1 + 8 + 8;

pub fn encode_commit_floor(floor: Offset) -> Vec<u8> {
    let mut b = Vec::with_capacity(COMMIT_FLOOR_BYTES);
    b.extend_from_slice(COMMIT_FLOOR_MAGIC);
    b.push(COMMIT_FLOOR_VERSION);
    b.extend_from_slice(&floor.to_le_bytes());
    let sum = xxh3_64(&b);
    b.extend_from_slice(&sum.to_le_bytes());
    b
}

pub fn decode_commit_floor(b: &[u8]) -> Result<Offset, String> {
    if b.len() != COMMIT_FLOOR_BYTES {
        return Err(format!("{} bytes; expected {COMMIT_FLOOR_BYTES}", b.len()));
    }
    let mut r = Reader::framed(b, COMMIT_FLOOR_MAGIC, COMMIT_FLOOR_VERSION)?;
    r.u64()
}

/// Reads the commit floor: `None` if there is none (never written yet).
///
/// A damaged file is an error here; the replica then starts from no floor (claiming less than
/// was committed is safe: Raft raises it again), rather than refusing to open.
pub async fn load_commit_floor<F: Fs>(fs: &F, dir: &Path) -> Result<Option<Offset>, ReplicaError> {
    let p = dir.join(COMMIT_FLOOR_FILE);
    let Some(bytes) = read_small(fs, &p, COMMIT_FLOOR_BYTES as u64).await? else {
        return Ok(None);
    };
    decode_commit_floor(&bytes)
        .map(Some)
        .map_err(|why| ReplicaError::BadHardState { path: p, why })
}

/// Replaces the commit floor durably and atomically.
pub async fn store_commit_floor<F: Fs>(
    fs: &F,
    dir: &Path,
    floor: Offset,
) -> Result<(), ReplicaError> {
    replace(fs, dir, COMMIT_FLOOR_FILE, &encode_commit_floor(floor)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_raft::Replica;

    fn sample() -> PersistedState {
        let m = Membership::voters(&[
            Replica {
                node: 1,
                disk: DiskId(7),
            },
            Replica {
                node: 2,
                disk: DiskId(u128::MAX),
            },
        ]);
        PersistedState {
            hard: HardState {
                term: 9,
                vote: Some(2),
                disk: DiskId(7),
            },
            base: Some(SnapshotMeta {
                offset: 0,
                term: 0,
                membership: m.clone(),
            }),
            configs: vec![(12, 3, m)],
        }
    }

    #[test]
    fn round_trips_and_every_flipped_bit_is_caught() {
        let s = sample();
        let b = s.encode();
        assert_eq!(PersistedState::decode(&b), Ok(s.clone()));
        let none = PersistedState {
            hard: HardState {
                term: 0,
                vote: None,
                disk: DiskId(1),
            },
            base: None,
            configs: vec![],
        };
        assert_eq!(PersistedState::decode(&none.encode()), Ok(none));
        for i in 0..b.len() * 8 {
            let mut x = b.clone();
            x[i / 8] ^= 1 << (i % 8);
            assert!(PersistedState::decode(&x).is_err(), "bit {i}");
        }
        for n in 0..b.len() {
            assert!(PersistedState::decode(&b[..n]).is_err(), "prefix {n}");
        }
    }

    #[test]
    fn a_store_survives_power_loss_and_replaces_the_old_state() {
        use sluice_storage::fs::{CrashMode, SimFs};
        let fs = SimFs::new();
        let dir = PathBuf::from("/d/g1");
        futures::executor::block_on(async {
            sluice_storage::fs::create_dir_all_durable(&fs, &dir)
                .await
                .expect("dir");
            assert_eq!(load(&fs, &dir).await.expect("load"), None);
            let mut s = sample();
            store(&fs, &dir, &s).await.expect("store");
            s.hard.term = 10;
            store(&fs, &dir, &s).await.expect("store");
            let fs2 = fs.crash(CrashMode::DropUnsynced);
            assert_eq!(load(&fs2, &dir).await.expect("load"), Some(s));
        });
    }

    #[test]
    fn the_commit_floor_round_trips_and_every_flipped_bit_is_caught() {
        let b = encode_commit_floor(0x0102_0304_0506);
        assert_eq!(decode_commit_floor(&b), Ok(0x0102_0304_0506));
        for i in 0..b.len() * 8 {
            let mut x = b.clone();
            x[i / 8] ^= 1 << (i % 8);
            assert!(decode_commit_floor(&x).is_err(), "bit {i}");
        }
        for n in 0..b.len() {
            assert!(decode_commit_floor(&b[..n]).is_err(), "prefix {n}");
        }
        use sluice_storage::fs::{CrashMode, SimFs};
        let fs = SimFs::new();
        let dir = PathBuf::from("/d/g1");
        futures::executor::block_on(async {
            sluice_storage::fs::create_dir_all_durable(&fs, &dir)
                .await
                .expect("dir");
            assert_eq!(load_commit_floor(&fs, &dir).await.expect("load"), None);
            store_commit_floor(&fs, &dir, 7).await.expect("store");
            store_commit_floor(&fs, &dir, 9).await.expect("store");
            let fs2 = fs.crash(CrashMode::DropUnsynced);
            assert_eq!(load_commit_floor(&fs2, &dir).await.expect("load"), Some(9));
        });
    }
}
