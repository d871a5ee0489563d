//! A node's identity: its node id and disk id, generated at the first start in cluster mode
//! and kept in `<data>/node.id`.
//!
//! **Why never reused.** Raft's safety rests on each voter remembering what it voted and
//! acknowledged. A node restarted on an empty disk under its old id would vote and ack as if it
//! remembered, and a majority could then lose committed entries (issue 41: "a new empty disk
//! under an old id is a known way to lose data"). So the ids live *on the disk they describe*:
//!
//! - a data dir without `node.id` and without data gets a fresh node id and disk id (a wiped
//!   disk comes back as a *new* node, which the cluster does not count as the old one);
//! - a data dir that holds data ([`DATA_DIRS`]) but no `node.id` is refused
//!   ([`IdentityError::DataWithoutIdentity`]): a single node's or a foreign data dir must not
//!   pass as a cluster member;
//! - a damaged `node.id` is refused ([`IdentityError::Damaged`]), never regenerated.
//!
//! Layout (little-endian, [`NODE_ID_FILE_BYTES`] bytes):
//!
//! ```text
//! magic "SLNI" | u8 version (1) | u64 node id | u128 disk id | u64 xxh3-64 of every byte before it
//! ```
//!
//! Written once: to `node.id.tmp` (mode 0600), synced, renamed to `node.id`, the directory
//! synced. A crash leaves no `node.id` (and no data yet: the identity is made before anything
//! else is written) or the whole file.

use sluice_raft::{DiskId, NodeId};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use xxhash_rust::xxh3::xxh3_64;

/// The file's name in the data dir.
pub const NODE_ID_FILE: &str = "node.id";
const NODE_ID_TMP_FILE: &str = "node.id.tmp";
const MAGIC: &[u8; 4] = b"SLNI";
/// The layout version; another one is refused, never guessed at.
pub const NODE_ID_VERSION: u8 = 1;
/// Size of the file: magic, version, node id, disk id, checksum.
pub const NODE_ID_FILE_BYTES: usize = 4 + 1 + 8 + 16 + 8;
/// Entries of a data dir that hold a node's data: their presence without a `node.id` means the
/// dir was used by a broker that had no cluster identity (or lost it).
pub const DATA_DIRS: &[&str] = &["queues", "meta", "topics", "groups"];
/// Node ids are drawn below 2^63, so that they are plain TOML (and JSON) integers in the
/// members list of a config file.
pub const NODE_ID_MAX: NodeId = i64::MAX as NodeId;

/// Who this node is: the ids Raft knows it by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NodeIdentity {
    /// Non-zero, at most [`NODE_ID_MAX`]; named in the node's certificate.
    pub node: NodeId,
    /// Non-zero; names this data dir's incarnation (a wiped disk gets a new one).
    pub disk: DiskId,
}

impl NodeIdentity {
    /// The disk id as the config file and the CLI write it: 32 lowercase hex digits.
    pub fn disk_hex(&self) -> String {
        format_disk(self.disk)
    }

    fn encode(&self) -> [u8; NODE_ID_FILE_BYTES] {
        let mut b = [0u8; NODE_ID_FILE_BYTES];
        b[..4].copy_from_slice(MAGIC);
        b[4] = NODE_ID_VERSION;
        b[5..13].copy_from_slice(&self.node.to_le_bytes());
        b[13..29].copy_from_slice(&self.disk.0.to_le_bytes());
        let sum = xxh3_64(&b[..29]);
        b[29..].copy_from_slice(&sum.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Result<NodeIdentity, String> {
        if b.len() != NODE_ID_FILE_BYTES {
            return Err(format!("{} bytes, expected {NODE_ID_FILE_BYTES}", b.len()));
        }
        let (body, sum) = b.split_at(NODE_ID_FILE_BYTES - 8);
        if xxh3_64(body) != u64::from_le_bytes(sum.try_into().expect("8 bytes")) {
            return Err("checksum mismatch".into());
        }
        if &body[..4] != MAGIC {
            return Err("bad magic".into());
        }
        if body[4] != NODE_ID_VERSION {
            return Err(format!(
                "version {}; this build reads {NODE_ID_VERSION}",
                body[4]
            ));
        }
        let node = u64::from_le_bytes(body[5..13].try_into().expect("8 bytes"));
        let disk = u128::from_le_bytes(body[13..29].try_into().expect("16 bytes"));
        if node == 0 || node > NODE_ID_MAX || disk == 0 {
            return Err(format!("out-of-range ids (node {node}, disk {disk:032x})"));
        }
        Ok(NodeIdentity {
            node,
            disk: DiskId(disk),
        })
    }
}

/// A disk id as 32 lowercase hex digits.
pub fn format_disk(disk: DiskId) -> String {
    format!("{:032x}", disk.0)
}

/// Parses [`format_disk`]'s form (an optional `0x` prefix allowed); `None` if it is not 1-32
/// hex digits or is zero.
pub fn parse_disk(s: &str) -> Option<DiskId> {
    let hex = s.strip_prefix("0x").unwrap_or(s);
    if hex.is_empty() || hex.len() > 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u128::from_str_radix(hex, 16)
        .ok()
        .filter(|&d| d != 0)
        .map(DiskId)
}

/// Why this node has no usable identity.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error(
        "data dir {dir} holds data ({found}) but no {NODE_ID_FILE}: it was used by a broker \
         without a cluster identity (a single node, or a node whose {NODE_ID_FILE} was removed). \
         Refusing to give it a new identity: its data would pass as a new node's. Fix: start \
         this cluster node on an empty data dir (move {dir} away), or run without [cluster]"
    )]
    DataWithoutIdentity { dir: PathBuf, found: String },
    #[error(
        "{path} is damaged ({why}). Refusing to start: a node never takes a new identity over \
         its old data. Fix: restore the file from a backup; or, to bring this machine back as a \
         new node, move the whole data dir away (the cluster then treats it as a new member)"
    )]
    Damaged { path: PathBuf, why: String },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Whether [`load_or_create`] made a new identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provenance {
    Created,
    Loaded,
}

/// Reads `<data_dir>/node.id`: `None` if there is none; a damaged file is an error.
pub fn load(data_dir: &Path) -> Result<Option<NodeIdentity>, IdentityError> {
    let path = data_dir.join(NODE_ID_FILE);
    let io = |what, source| IdentityError::Io {
        what,
        path: path.clone(),
        source,
    };
    let mut file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("opening", e)),
    };
    // One byte more than the layout: a longer file is damaged, and is not read whole.
    let mut bytes = Vec::with_capacity(NODE_ID_FILE_BYTES + 1);
    (&mut file)
        .take(NODE_ID_FILE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| io("reading", e))?;
    NodeIdentity::decode(&bytes)
        .map(Some)
        .map_err(|why| IdentityError::Damaged { path, why })
}

/// This data dir's identity: read from `node.id`, or created there (with the data dir, mode
/// 0700, durably) when the dir holds no data. See the module doc for what is refused.
pub fn load_or_create(data_dir: &Path) -> Result<(NodeIdentity, Provenance), IdentityError> {
    if let Some(id) = load(data_dir)? {
        return Ok((id, Provenance::Loaded));
    }
    let found: Vec<&str> = DATA_DIRS
        .iter()
        .copied()
        .filter(|d| data_dir.join(d).exists())
        .collect();
    if !found.is_empty() {
        return Err(IdentityError::DataWithoutIdentity {
            dir: data_dir.to_path_buf(),
            found: found.join(", "),
        });
    }
    crate::config_perms::create_data_dir(data_dir).map_err(|source| IdentityError::Io {
        what: "creating data dir",
        path: data_dir.to_path_buf(),
        source,
    })?;
    let id = generate().map_err(|source| IdentityError::Io {
        what: "reading random bytes from",
        path: PathBuf::from("/dev/urandom"),
        source,
    })?;
    store(data_dir, &id)?;
    Ok((id, Provenance::Created))
}

/// Fresh random ids (non-zero; the node id at most [`NODE_ID_MAX`]).
fn generate() -> std::io::Result<NodeIdentity> {
    let mut urandom = std::fs::File::open("/dev/urandom")?;
    loop {
        let mut b = [0u8; 24];
        urandom.read_exact(&mut b)?;
        let node = u64::from_le_bytes(b[..8].try_into().expect("8 bytes")) & NODE_ID_MAX;
        let disk = u128::from_le_bytes(b[8..].try_into().expect("16 bytes"));
        // Zero is "no node" / "no disk" to Raft; a draw of it (p = 2^-63) is drawn again.
        if node != 0 && disk != 0 {
            return Ok(NodeIdentity {
                node,
                disk: DiskId(disk),
            });
        }
    }
}

/// Writes `node.id` atomically and durably (tmp, fsync, rename, fsync of the dir).
fn store(data_dir: &Path, id: &NodeIdentity) -> Result<(), IdentityError> {
    let tmp = data_dir.join(NODE_ID_TMP_FILE);
    let path = data_dir.join(NODE_ID_FILE);
    let io = |what, p: &Path, source| IdentityError::Io {
        what,
        path: p.to_path_buf(),
        source,
    };
    // A crash during an earlier first start may have left one behind.
    if let Err(e) = std::fs::remove_file(&tmp) {
        if e.kind() != std::io::ErrorKind::NotFound {
            return Err(io("removing", &tmp, e));
        }
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| io("creating", &tmp, e))?;
    f.write_all(&id.encode())
        .map_err(|e| io("writing", &tmp, e))?;
    f.sync_all().map_err(|e| io("syncing", &tmp, e))?;
    drop(f);
    std::fs::rename(&tmp, &path).map_err(|e| io("renaming into", &path, e))?;
    std::fs::File::open(data_dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io("syncing", data_dir, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_start_creates_an_identity_and_later_starts_keep_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data");
        let (id, how) = load_or_create(&dir).unwrap();
        assert_eq!(how, Provenance::Created);
        assert!(id.node != 0 && id.node <= NODE_ID_MAX && id.disk.0 != 0);
        assert!(!dir.join(NODE_ID_TMP_FILE).exists());
        // Data written after it does not matter: the identity is read back.
        std::fs::create_dir(dir.join("queues")).unwrap();
        let (again, how) = load_or_create(&dir).unwrap();
        assert_eq!((again, how), (id, Provenance::Loaded));
        assert_eq!(load(&dir).unwrap(), Some(id));
    }

    #[test]
    fn a_wiped_data_dir_gets_a_new_node_and_disk() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data");
        let (old, _) = load_or_create(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let (new, how) = load_or_create(&dir).unwrap();
        assert_eq!(how, Provenance::Created);
        assert_ne!(new.node, old.node);
        assert_ne!(new.disk, old.disk);
    }

    #[test]
    fn data_without_an_identity_is_refused_by_name() {
        for marker in DATA_DIRS {
            let tmp = tempfile::tempdir().unwrap();
            std::fs::create_dir(tmp.path().join(marker)).unwrap();
            let e = load_or_create(tmp.path()).unwrap_err();
            assert!(
                matches!(&e, IdentityError::DataWithoutIdentity { found, .. } if found == marker),
                "{e}"
            );
            assert!(e.to_string().contains("empty data dir"), "{e}");
            assert!(!tmp.path().join(NODE_ID_FILE).exists());
        }
        // Files every broker writes at start (keys, certificates) are not data.
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("receipt.key"), [0u8; 32]).unwrap();
        assert_eq!(load_or_create(tmp.path()).unwrap().1, Provenance::Created);
    }

    #[test]
    fn a_damaged_file_is_refused_and_left_as_it_is() {
        let tmp = tempfile::tempdir().unwrap();
        let (id, _) = load_or_create(tmp.path()).unwrap();
        let path = tmp.path().join(NODE_ID_FILE);
        let good = std::fs::read(&path).unwrap();
        let mut cases: Vec<(&str, Vec<u8>)> = vec![
            ("empty", Vec::new()),
            ("truncated", good[..good.len() - 1].to_vec()),
            ("longer", [good.clone(), vec![0]].concat()),
        ];
        for i in 0..good.len() {
            let mut b = good.clone();
            b[i] ^= 0x10;
            cases.push(("flipped", b));
        }
        for (what, bytes) in cases {
            std::fs::write(&path, &bytes).unwrap();
            let e = load_or_create(tmp.path()).unwrap_err();
            assert!(matches!(e, IdentityError::Damaged { .. }), "{what}: {e}");
            assert_eq!(std::fs::read(&path).unwrap(), bytes, "{what}: rewritten");
        }
        std::fs::write(&path, &good).unwrap();
        assert_eq!(load_or_create(tmp.path()).unwrap().0, id);
    }

    #[test]
    fn a_newer_version_is_refused() {
        let id = NodeIdentity {
            node: 7,
            disk: DiskId(9),
        };
        let mut b = id.encode();
        b[4] = NODE_ID_VERSION + 1;
        let sum = xxh3_64(&b[..29]);
        b[29..].copy_from_slice(&sum.to_le_bytes());
        let e = NodeIdentity::decode(&b).unwrap_err();
        assert!(e.contains("version"), "{e}");
        assert_eq!(NodeIdentity::decode(&id.encode()), Ok(id));
    }

    #[test]
    fn a_stray_temporary_file_does_not_stop_the_first_start() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join(NODE_ID_TMP_FILE), b"half").unwrap();
        let (id, how) = load_or_create(tmp.path()).unwrap();
        assert_eq!(how, Provenance::Created);
        assert_eq!(load(tmp.path()).unwrap(), Some(id));
    }

    #[test]
    fn disk_ids_print_and_parse_back() {
        let d = DiskId(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
        assert_eq!(parse_disk(&format_disk(d)), Some(d));
        assert_eq!(parse_disk("0x1f"), Some(DiskId(0x1f)));
        for bad in ["", "0", "xyz", "0x", &"f".repeat(33)] {
            assert_eq!(parse_disk(bad), None, "{bad:?}");
        }
    }
}
