//! The disk model: a durable state and a volatile state on top of it, with no FUSE in it.
//!
//! Every operation changes the volatile state, which reads see; `fsync`/`fdatasync` of a file,
//! an `O_DSYNC`/`O_SYNC` write, and `fsync` of a directory copy parts of it into the durable
//! state. [`Disk::power_off`] throws the volatile state away and rebuilds it from the durable
//! one. The precise rules are in the crate docs (lib.rs) and README.md.
//!
//! Durable file bytes live in the backing directory, one file per inode (`<backing>/<ino>`), so
//! large preallocated segments cost disk, not memory; the durable namespace (which names each
//! directory holds) lives in memory, as small as the tree. Volatile bytes live in memory, bounded
//! by [`Limits::volatile_bytes_max`].

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::SystemTime;

pub type Ino = u64;

/// The root directory's inode (FUSE's fixed root id).
pub const ROOT_INO: Ino = 1;
/// The control file's inode: served by the FUSE layer, never stored.
pub const CTL_INO: Ino = 2;
/// The first inode number handed to a created file or directory. Numbers are never reused, so a
/// kernel that still holds an inode from before a power off cannot mistake a new file for it.
const FIRST_FREE_INO: Ino = 3;

/// Default bound on volatile (unsynced) bytes held in memory: 1 GiB. Past it writes fail with
/// ENOSPC (never a silent flush, which would make unsynced data durable and hide the bug).
pub const VOLATILE_BYTES_MAX_DEFAULT: u64 = 1 << 30;

/// Errors of the model, each mapped to one errno at the FUSE edge.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("volatile memory limit reached ({limit_bytes} bytes unsynced)")]
    NoSpace { limit_bytes: u64 },
    #[error("file handle from before a power off")]
    StaleHandle,
    #[error("invalid argument")]
    Invalid,
    #[error("operation not supported by faultfs")]
    Unsupported,
    #[error("backing directory I/O: {0}")]
    Backing(#[from] io::Error),
}

impl FsError {
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound => libc::ENOENT,
            FsError::Exists => libc::EEXIST,
            FsError::NotDir => libc::ENOTDIR,
            FsError::IsDir => libc::EISDIR,
            FsError::NotEmpty => libc::ENOTEMPTY,
            FsError::NoSpace { .. } => libc::ENOSPC,
            // The process that held it is gone after a power off; EIO is what it would see.
            FsError::StaleHandle => libc::EIO,
            FsError::Invalid => libc::EINVAL,
            FsError::Unsupported => libc::EOPNOTSUPP,
            FsError::Backing(_) => libc::EIO,
        }
    }
}

pub type Result<T> = std::result::Result<T, FsError>;

/// Bounds of the model.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Unsynced bytes (all files' volatile extents) held in memory at most.
    pub volatile_bytes_max: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            volatile_bytes_max: VOLATILE_BYTES_MAX_DEFAULT,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
}

/// Attributes that are not modelled as volatile: mode, owner and times change at once and
/// survive a power off (faultfs models data and names, not metadata timestamps).
#[derive(Clone, Copy, Debug)]
pub struct Meta {
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
}

/// What `getattr` reports.
#[derive(Clone, Copy, Debug)]
pub struct Stat {
    pub ino: Ino,
    pub kind: Kind,
    pub size: u64,
    pub nlink: u32,
    pub meta: Meta,
}

/// A regular file: durable bytes in its backing file, volatile extents over them.
#[derive(Debug, Default)]
struct FileNode {
    /// The size reads see.
    size: u64,
    /// The durable size: the backing file's length.
    durable_size: u64,
    /// How much of the backing file reads still see: a truncate below it hides the rest (which
    /// stays durable until the file is synced).
    base_len: u64,
    /// Volatile bytes by offset; extents do not overlap.
    overlay: BTreeMap<u64, Vec<u8>>,
    /// The latest write not yet durable: (sequence number, offset, length), for a torn write.
    last_write: Option<(u64, u64, u64)>,
}

#[derive(Debug, Default)]
struct DirNode {
    /// The names reads see.
    children: BTreeMap<OsString, Ino>,
    /// The names a power off leaves: `children` as of this directory's last fsync.
    durable: BTreeMap<OsString, Ino>,
}

#[derive(Debug)]
enum Body {
    File(FileNode),
    Dir(DirNode),
}

#[derive(Debug)]
struct Node {
    body: Body,
    meta: Meta,
}

impl Node {
    fn kind(&self) -> Kind {
        match self.body {
            Body::File(_) => Kind::File,
            Body::Dir(_) => Kind::Dir,
        }
    }
}

/// An open file or directory.
#[derive(Clone, Copy, Debug)]
struct Handle {
    ino: Ino,
    /// Open flags: `O_DSYNC`/`O_SYNC` make every write through it durable.
    flags: i32,
}

/// What a power off did, for the harness's log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PowerOffReport {
    /// Volatile bytes dropped.
    pub volatile_bytes_dropped: u64,
    /// Files and directories that existed only in the volatile state.
    pub nodes_dropped: u64,
    /// For a torn power off: the torn write's (inode, offset, bytes kept, bytes written).
    pub torn: Option<(Ino, u64, u64, u64)>,
}

/// The disk: durable and volatile state, and the open handles.
pub struct Disk {
    backing: PathBuf,
    limits: Limits,
    nodes: HashMap<Ino, Node>,
    handles: HashMap<u64, Handle>,
    next_ino: Ino,
    next_fh: u64,
    write_seq: u64,
    volatile_bytes: u64,
    /// Power offs so far.
    epoch: u64,
    /// False from a power off until [`Disk::power_on`]: the FUSE layer refuses requests then.
    on: bool,
}

fn now() -> SystemTime {
    SystemTime::now()
}

impl Disk {
    /// A fresh, empty disk whose durable bytes go to `backing` (created; must be empty: the
    /// durable namespace lives in this process, so files left by another would be orphans).
    pub fn new(backing: PathBuf, limits: Limits) -> Result<Disk> {
        std::fs::create_dir_all(&backing)?;
        if std::fs::read_dir(&backing)?.next().is_some() {
            return Err(FsError::Exists);
        }
        let t = now();
        let root = Node {
            body: Body::Dir(DirNode::default()),
            meta: Meta {
                perm: 0o755,
                uid: 0,
                gid: 0,
                atime: t,
                mtime: t,
                ctime: t,
            },
        };
        let mut nodes = HashMap::new();
        nodes.insert(ROOT_INO, root);
        Ok(Disk {
            backing,
            limits,
            nodes,
            handles: HashMap::new(),
            next_ino: FIRST_FREE_INO,
            next_fh: 1,
            write_seq: 0,
            volatile_bytes: 0,
            epoch: 0,
            on: true,
        })
    }

    /// Whether the disk serves requests (false between a power off and a power on).
    pub fn is_on(&self) -> bool {
        self.on
    }

    /// Serves requests again after a power off, from the durable state.
    pub fn power_on(&mut self) {
        self.on = true;
    }

    /// Power offs so far.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Unsynced bytes held in memory now.
    pub fn volatile_bytes(&self) -> u64 {
        self.volatile_bytes
    }

    fn node(&self, ino: Ino) -> Result<&Node> {
        self.nodes.get(&ino).ok_or(FsError::NotFound)
    }

    fn node_mut(&mut self, ino: Ino) -> Result<&mut Node> {
        self.nodes.get_mut(&ino).ok_or(FsError::NotFound)
    }

    fn dir(&self, ino: Ino) -> Result<&DirNode> {
        match &self.node(ino)?.body {
            Body::Dir(d) => Ok(d),
            Body::File(_) => Err(FsError::NotDir),
        }
    }

    fn dir_mut(&mut self, ino: Ino) -> Result<&mut DirNode> {
        match &mut self.node_mut(ino)?.body {
            Body::Dir(d) => Ok(d),
            Body::File(_) => Err(FsError::NotDir),
        }
    }

    fn file_mut(&mut self, ino: Ino) -> Result<&mut FileNode> {
        match &mut self.node_mut(ino)?.body {
            Body::File(f) => Ok(f),
            Body::Dir(_) => Err(FsError::IsDir),
        }
    }

    fn backing_path(&self, ino: Ino) -> PathBuf {
        self.backing.join(ino.to_string())
    }

    fn backing_file(&self, ino: Ino) -> io::Result<File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(self.backing_path(ino))
    }

    pub fn lookup(&self, parent: Ino, name: &OsStr) -> Result<Ino> {
        self.dir(parent)?
            .children
            .get(name)
            .copied()
            .ok_or(FsError::NotFound)
    }

    pub fn stat(&self, ino: Ino) -> Result<Stat> {
        let node = self.node(ino)?;
        let (size, nlink) = match &node.body {
            Body::File(f) => (f.size, 1),
            Body::Dir(d) => {
                let subdirs = d
                    .children
                    .values()
                    .filter(|c| matches!(self.nodes.get(c).map(Node::kind), Some(Kind::Dir)))
                    .count();
                (0, 2 + u32::try_from(subdirs).unwrap_or(u32::MAX - 2))
            }
        };
        Ok(Stat {
            ino,
            kind: node.kind(),
            size,
            nlink,
            meta: node.meta,
        })
    }

    /// Children of a directory as (name, inode, kind), in name order.
    pub fn list(&self, dir: Ino) -> Result<Vec<(OsString, Ino, Kind)>> {
        let d = self.dir(dir)?;
        Ok(d.children
            .iter()
            .filter_map(|(name, &ino)| self.nodes.get(&ino).map(|n| (name.clone(), ino, n.kind())))
            .collect())
    }

    /// Creates a file or directory: volatile until `parent` is fsynced.
    pub fn make(
        &mut self,
        parent: Ino,
        name: &OsStr,
        kind: Kind,
        perm: u16,
        uid: u32,
        gid: u32,
    ) -> Result<Ino> {
        if self.dir(parent)?.children.contains_key(name) {
            return Err(FsError::Exists);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        let t = now();
        let body = match kind {
            Kind::File => Body::File(FileNode::default()),
            Kind::Dir => Body::Dir(DirNode::default()),
        };
        let meta = Meta {
            perm,
            uid,
            gid,
            atime: t,
            mtime: t,
            ctime: t,
        };
        self.nodes.insert(ino, Node { body, meta });
        let p = self.node_mut(parent)?;
        p.meta.mtime = t;
        p.meta.ctime = t;
        self.dir_mut(parent)?.children.insert(name.to_owned(), ino);
        Ok(ino)
    }

    /// Removes a name (`unlink` or, with `dir`, `rmdir`): volatile until `parent` is fsynced.
    pub fn remove(&mut self, parent: Ino, name: &OsStr, dir: bool) -> Result<()> {
        let ino = self.lookup(parent, name)?;
        match (&self.node(ino)?.body, dir) {
            (Body::Dir(d), true) if !d.children.is_empty() => return Err(FsError::NotEmpty),
            (Body::Dir(_), true) | (Body::File(_), false) => {}
            (Body::Dir(_), false) => return Err(FsError::IsDir),
            (Body::File(_), true) => return Err(FsError::NotDir),
        }
        self.dir_mut(parent)?.children.remove(name);
        let t = now();
        let p = self.node_mut(parent)?;
        p.meta.mtime = t;
        p.meta.ctime = t;
        Ok(())
    }

    /// Renames: the removal of the old name is volatile until `parent` is fsynced, the new name
    /// until `new_parent` is (one fsync when they are the same directory).
    pub fn rename(
        &mut self,
        parent: Ino,
        name: &OsStr,
        new_parent: Ino,
        new_name: &OsStr,
        flags: u32,
    ) -> Result<()> {
        if flags & !(libc::RENAME_NOREPLACE) != 0 {
            // RENAME_EXCHANGE and RENAME_WHITEOUT are not modelled.
            return Err(FsError::Invalid);
        }
        let ino = self.lookup(parent, name)?;
        let kind = self.node(ino)?.kind();
        self.dir(new_parent)?;
        if let Ok(target) = self.lookup(new_parent, new_name) {
            if target == ino {
                return Ok(());
            }
            if flags & libc::RENAME_NOREPLACE != 0 {
                return Err(FsError::Exists);
            }
            match (&self.node(target)?.body, kind) {
                (Body::Dir(d), Kind::Dir) if !d.children.is_empty() => {
                    return Err(FsError::NotEmpty)
                }
                (Body::Dir(_), Kind::Dir) | (Body::File(_), Kind::File) => {}
                (Body::Dir(_), Kind::File) => return Err(FsError::IsDir),
                (Body::File(_), Kind::Dir) => return Err(FsError::NotDir),
            }
        }
        self.dir_mut(parent)?.children.remove(name);
        self.dir_mut(new_parent)?
            .children
            .insert(new_name.to_owned(), ino);
        let t = now();
        for p in [parent, new_parent] {
            let n = self.node_mut(p)?;
            n.meta.mtime = t;
            n.meta.ctime = t;
        }
        Ok(())
    }

    pub fn set_meta(
        &mut self,
        ino: Ino,
        perm: Option<u16>,
        uid: Option<u32>,
        gid: Option<u32>,
        atime: Option<SystemTime>,
        mtime: Option<SystemTime>,
    ) -> Result<()> {
        let m = &mut self.node_mut(ino)?.meta;
        if let Some(p) = perm {
            m.perm = p;
        }
        if let Some(u) = uid {
            m.uid = u;
        }
        if let Some(g) = gid {
            m.gid = g;
        }
        if let Some(a) = atime {
            m.atime = a;
        }
        if let Some(t) = mtime {
            m.mtime = t;
        }
        m.ctime = now();
        Ok(())
    }

    /// Truncates or extends: volatile until the file is fsynced.
    pub fn set_size(&mut self, ino: Ino, size: u64) -> Result<()> {
        let f = self.file_mut(ino)?;
        let freed = overlay_truncate(&mut f.overlay, size);
        f.size = size;
        f.base_len = f.base_len.min(size);
        self.volatile_bytes -= freed;
        self.touch(ino);
        Ok(())
    }

    fn touch(&mut self, ino: Ino) {
        if let Some(n) = self.nodes.get_mut(&ino) {
            let t = now();
            n.meta.mtime = t;
            n.meta.ctime = t;
        }
    }

    /// Writes `data` at `offset`; `durable` (an O_DSYNC/O_SYNC write) makes the file's data
    /// durable before returning, as a write followed by fdatasync would.
    pub fn write(&mut self, ino: Ino, offset: u64, data: &[u8], durable: bool) -> Result<usize> {
        let limit_bytes = self.limits.volatile_bytes_max;
        let len = data.len() as u64;
        let end = offset.checked_add(len).ok_or(FsError::Invalid)?;
        // The bound is checked before the write, on the worst case (no overlap): a write that
        // would pass it fails whole instead of half-applied.
        if self.volatile_bytes + len > limit_bytes {
            return Err(FsError::NoSpace { limit_bytes });
        }
        self.write_seq += 1;
        let seq = self.write_seq;
        let f = self.file_mut(ino)?;
        let (added, removed) = overlay_write(&mut f.overlay, offset, data);
        f.size = f.size.max(end);
        f.last_write = Some((seq, offset, len));
        self.volatile_bytes = self.volatile_bytes + added - removed;
        self.touch(ino);
        if durable {
            self.sync_file(ino)?;
        }
        Ok(data.len())
    }

    /// Reads what a page cache would hold: volatile extents over durable bytes.
    pub fn read(&self, ino: Ino, offset: u64, len: u32) -> Result<Vec<u8>> {
        let f = match &self.node(ino)?.body {
            Body::File(f) => f,
            Body::Dir(_) => return Err(FsError::IsDir),
        };
        if offset >= f.size {
            return Ok(Vec::new());
        }
        let end = f.size.min(offset + u64::from(len));
        let mut buf = vec![0u8; (end - offset) as usize];
        let base_end = end.min(f.base_len);
        if offset < base_end {
            let want = (base_end - offset) as usize;
            let file = self.backing_file(ino)?;
            let mut done = 0;
            while done < want {
                let n = file.read_at(&mut buf[done..want], offset + done as u64)?;
                if n == 0 {
                    break; // past the backing file's end: zeros (a hole).
                }
                done += n;
            }
        }
        overlay_read(&f.overlay, offset, &mut buf);
        Ok(buf)
    }

    /// fsync/fdatasync of a file: its bytes and size become durable. Its name does not: that
    /// takes an fsync of the directory holding it.
    pub fn sync_file(&mut self, ino: Ino) -> Result<()> {
        let file = self.backing_file(ino)?;
        let f = self.file_mut(ino)?;
        if f.base_len < f.durable_size {
            file.set_len(f.base_len)?;
        }
        for (&off, bytes) in &f.overlay {
            file.write_all_at(bytes, off)?;
        }
        file.set_len(f.size)?;
        let freed: u64 = f.overlay.values().map(|v| v.len() as u64).sum();
        f.overlay.clear();
        f.durable_size = f.size;
        f.base_len = f.size;
        f.last_write = None;
        self.volatile_bytes -= freed;
        Ok(())
    }

    /// fsync of a directory: its current names become its durable names (creations, removals
    /// and renames into or out of it). The entries' own contents are not synced by it.
    pub fn sync_dir(&mut self, ino: Ino) -> Result<()> {
        let d = self.dir_mut(ino)?;
        d.durable = d.children.clone();
        Ok(())
    }

    /// `fallocate`: mode 0 extends the size (volatile, like a truncate up); KEEP_SIZE changes
    /// nothing visible. Block allocation itself is not modelled; other modes are refused.
    pub fn fallocate(&mut self, ino: Ino, offset: u64, len: u64, mode: i32) -> Result<()> {
        let end = offset.checked_add(len).ok_or(FsError::Invalid)?;
        match mode {
            0 => {
                let f = self.file_mut(ino)?;
                if end > f.size {
                    f.size = end;
                }
                self.touch(ino);
                Ok(())
            }
            libc::FALLOC_FL_KEEP_SIZE => self.file_mut(ino).map(|_| ()),
            _ => Err(FsError::Unsupported),
        }
    }

    /// Opens a handle; handles die at a power off.
    pub fn open(&mut self, ino: Ino, flags: i32) -> Result<u64> {
        self.node(ino)?;
        let fh = self.next_fh;
        self.next_fh += 1;
        self.handles.insert(fh, Handle { ino, flags });
        Ok(fh)
    }

    /// The inode and open flags of a live handle.
    pub fn handle(&self, fh: u64) -> Result<(Ino, i32)> {
        self.handles
            .get(&fh)
            .map(|h| (h.ino, h.flags))
            .ok_or(FsError::StaleHandle)
    }

    pub fn release(&mut self, fh: u64) {
        self.handles.remove(&fh);
    }

    /// Power off: everything volatile is gone; the durable state is what remains. The disk stays
    /// off (see [`Disk::is_on`]) until [`Disk::power_on`].
    pub fn power_off(&mut self) -> Result<PowerOffReport> {
        self.reset(None)
    }

    /// Power off during the latest unsynced write to a file that keeps a durable name: a prefix
    /// of it, of a length drawn from `seed` in `0..len`, reached the disk; everything else
    /// volatile is gone.
    pub fn power_off_torn(&mut self, seed: u64) -> Result<PowerOffReport> {
        self.reset(Some(seed))
    }

    fn reset(&mut self, tear_seed: Option<u64>) -> Result<PowerOffReport> {
        let mut report = PowerOffReport {
            volatile_bytes_dropped: self.volatile_bytes,
            ..PowerOffReport::default()
        };
        // What survives: the tree of durable names from the root. A directory reachable twice
        // (a cross-directory rename with both directories fsynced at different times) keeps its
        // first name in breadth-first order, so the tree stays a tree.
        let mut reachable = HashSet::from([ROOT_INO]);
        let mut queue = VecDeque::from([ROOT_INO]);
        while let Some(dir) = queue.pop_front() {
            let names: Vec<(OsString, Ino)> = match self.nodes.get(&dir).map(|n| &n.body) {
                Some(Body::Dir(d)) => d.durable.iter().map(|(n, i)| (n.clone(), *i)).collect(),
                _ => continue,
            };
            for (name, child) in names {
                let is_dir = matches!(self.nodes.get(&child).map(Node::kind), Some(Kind::Dir));
                if is_dir && reachable.contains(&child) {
                    if let Some(Body::Dir(d)) = self.nodes.get_mut(&dir).map(|n| &mut n.body) {
                        d.durable.remove(&name);
                    }
                    continue;
                }
                if reachable.insert(child) && is_dir {
                    queue.push_back(child);
                }
            }
        }
        if let Some(seed) = tear_seed {
            report.torn = self.tear(seed, &reachable)?;
        }
        let dead: Vec<Ino> = self
            .nodes
            .keys()
            .copied()
            .filter(|i| !reachable.contains(i))
            .collect();
        for ino in dead {
            if let Some(Node {
                body: Body::File(_),
                ..
            }) = self.nodes.remove(&ino)
            {
                match std::fs::remove_file(self.backing_path(ino)) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e.into()),
                    _ => {}
                }
            }
            report.nodes_dropped += 1;
        }
        for node in self.nodes.values_mut() {
            match &mut node.body {
                Body::Dir(d) => d.children = d.durable.clone(),
                Body::File(f) => {
                    f.size = f.durable_size;
                    f.base_len = f.durable_size;
                    f.overlay.clear();
                    f.last_write = None;
                }
            }
        }
        self.handles.clear();
        self.volatile_bytes = 0;
        self.epoch += 1;
        self.on = false;
        Ok(report)
    }

    /// Writes a seeded prefix of the latest unsynced write into the durable bytes. Only files
    /// that keep a durable name count: a torn write to a file the power off drops changes nothing.
    fn tear(
        &mut self,
        seed: u64,
        survivors: &HashSet<Ino>,
    ) -> Result<Option<(Ino, u64, u64, u64)>> {
        let latest = self
            .nodes
            .iter()
            .filter(|(ino, _)| survivors.contains(ino))
            .filter_map(|(&ino, n)| match &n.body {
                Body::File(f) => f.last_write.map(|w| (w, ino)),
                Body::Dir(_) => None,
            })
            .max_by_key(|((seq, _, _), _)| *seq);
        let Some(((_, offset, len), ino)) = latest else {
            return Ok(None);
        };
        let kept = if len == 0 { 0 } else { splitmix64(seed) % len };
        // The bytes as they are now (a later truncate may have cut them).
        let prefix = self.read(ino, offset, u32::try_from(kept).unwrap_or(u32::MAX))?;
        let file = self.backing_file(ino)?;
        file.write_all_at(&prefix, offset)?;
        let written_end = offset + prefix.len() as u64;
        let f = self.file_mut(ino)?;
        // The torn bytes carry their own length: the disk extended the file as far as they reach.
        f.durable_size = f.durable_size.max(written_end);
        if file.metadata()?.len() < f.durable_size {
            file.set_len(f.durable_size)?;
        }
        Ok(Some((ino, offset, prefix.len() as u64, len)))
    }
}

/// A seeded 64-bit mix (splitmix64): the tear's length, repeatable from the seed.
fn splitmix64(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Puts `data` at `offset` over the extents; returns (bytes added, bytes removed).
fn overlay_write(ov: &mut BTreeMap<u64, Vec<u8>>, offset: u64, data: &[u8]) -> (u64, u64) {
    if data.is_empty() {
        return (0, 0);
    }
    let end = offset + data.len() as u64;
    let mut removed = 0u64;
    let mut added = 0u64;
    // Extents overlapping [offset, end): the one starting before `offset`, and those inside.
    let mut hits: Vec<u64> = ov.range(offset..end).map(|(&s, _)| s).collect();
    if let Some((&s, v)) = ov.range(..offset).next_back() {
        if s + v.len() as u64 > offset {
            hits.push(s);
        }
    }
    for s in hits {
        let v = ov.remove(&s).expect("key listed just above");
        removed += v.len() as u64;
        let v_end = s + v.len() as u64;
        if s < offset {
            let head = v[..(offset - s) as usize].to_vec();
            added += head.len() as u64;
            ov.insert(s, head);
        }
        if v_end > end {
            let tail = v[(end - s) as usize..].to_vec();
            added += tail.len() as u64;
            ov.insert(end, tail);
        }
    }
    added += data.len() as u64;
    // Sequential appends grow one extent instead of adding one per write.
    let prev = ov
        .range_mut(..offset)
        .next_back()
        .filter(|(&s, v)| s + v.len() as u64 == offset);
    match prev {
        Some((_, v)) => v.extend_from_slice(data),
        None => {
            ov.insert(offset, data.to_vec());
        }
    }
    (added, removed)
}

/// Cuts the extents at `size`; returns the bytes freed.
fn overlay_truncate(ov: &mut BTreeMap<u64, Vec<u8>>, size: u64) -> u64 {
    let mut freed = 0u64;
    let after = ov.split_off(&size);
    freed += after.values().map(|v| v.len() as u64).sum::<u64>();
    if let Some((&s, v)) = ov.range_mut(..size).next_back() {
        let keep = (size - s) as usize;
        if v.len() > keep {
            freed += (v.len() - keep) as u64;
            v.truncate(keep);
        }
    }
    freed
}

/// Copies the extents overlapping `[offset, offset + buf.len())` into `buf`.
fn overlay_read(ov: &BTreeMap<u64, Vec<u8>>, offset: u64, buf: &mut [u8]) {
    let end = offset + buf.len() as u64;
    let first = ov
        .range(..=offset)
        .next_back()
        .map(|(&s, _)| s)
        .unwrap_or(offset);
    for (&s, v) in ov.range(first..end) {
        let v_end = s + v.len() as u64;
        let from = s.max(offset);
        let to = v_end.min(end);
        if from >= to {
            continue;
        }
        buf[(from - offset) as usize..(to - offset) as usize]
            .copy_from_slice(&v[(from - s) as usize..(to - s) as usize]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk() -> (tempfile::TempDir, Disk) {
        let dir = tempfile::tempdir().expect("temp dir");
        let d = Disk::new(dir.path().join("b"), Limits::default()).expect("disk");
        (dir, d)
    }

    #[test]
    fn overlay_writes_split_and_merge_extents() {
        let mut ov = BTreeMap::new();
        assert_eq!(overlay_write(&mut ov, 0, b"aaaa"), (4, 0));
        assert_eq!(overlay_write(&mut ov, 4, b"bb"), (2, 0));
        assert_eq!(ov.len(), 1, "an append grows the extent");
        assert_eq!(overlay_write(&mut ov, 2, b"XX"), (2 + 2 + 2, 6));
        let mut buf = [0u8; 8];
        overlay_read(&ov, 0, &mut buf);
        assert_eq!(&buf, b"aaXXbb\0\0");
        assert_eq!(overlay_truncate(&mut ov, 3), 3);
        let mut buf = [0u8; 6];
        overlay_read(&ov, 0, &mut buf);
        assert_eq!(&buf, b"aaX\0\0\0");
    }

    #[test]
    fn a_truncate_hides_durable_bytes_until_synced_and_power_off_brings_them_back() {
        let (_t, mut d) = disk();
        let f = d
            .make(ROOT_INO, OsStr::new("f"), Kind::File, 0o644, 0, 0)
            .expect("make");
        d.write(f, 0, b"hello world", false).expect("write");
        d.sync_file(f).expect("sync");
        d.sync_dir(ROOT_INO).expect("sync dir");
        d.set_size(f, 2).expect("truncate");
        d.set_size(f, 5).expect("extend");
        assert_eq!(d.read(f, 0, 100).expect("read"), b"he\0\0\0");
        d.power_off().expect("power off");
        assert_eq!(d.read(f, 0, 100).expect("read"), b"hello world");
    }

    #[test]
    fn a_tear_picks_the_latest_write_to_a_file_that_survives() {
        let (_t, mut d) = disk();
        let kept = d
            .make(ROOT_INO, OsStr::new("kept"), Kind::File, 0o644, 0, 0)
            .expect("make");
        d.sync_dir(ROOT_INO).expect("sync dir");
        let gone = d
            .make(ROOT_INO, OsStr::new("gone"), Kind::File, 0o644, 0, 0)
            .expect("make");
        d.write(kept, 0, &[1u8; 1000], false).expect("write");
        d.write(gone, 0, &[2u8; 1000], false)
            .expect("later write, to a file with no durable name");
        let report = d.power_off_torn(99).expect("tear");
        let (ino, offset, kept_bytes, written) = report.torn.expect("torn");
        assert_eq!((ino, offset, written), (kept, 0, 1000));
        assert!(kept_bytes < 1000);
        assert_eq!(
            d.read(kept, 0, 2000).expect("read"),
            vec![1u8; kept_bytes as usize]
        );
    }

    #[test]
    fn the_volatile_bound_refuses_writes_instead_of_flushing() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut d = Disk::new(
            dir.path().join("b"),
            Limits {
                volatile_bytes_max: 8,
            },
        )
        .expect("disk");
        let f = d
            .make(ROOT_INO, OsStr::new("f"), Kind::File, 0o644, 0, 0)
            .expect("make");
        d.write(f, 0, b"12345678", false).expect("fits");
        assert!(matches!(
            d.write(f, 8, b"9", false),
            Err(FsError::NoSpace { .. })
        ));
        d.sync_file(f).expect("sync");
        assert_eq!(d.volatile_bytes(), 0);
        d.write(f, 8, b"9", false).expect("room again after a sync");
    }
}
