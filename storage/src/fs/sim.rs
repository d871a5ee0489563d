//! An in-memory file system with the durability rules of a real disk, for power-loss tests.
//!
//! Each file keeps its durable image (as of its last completed `sync_data`) and the writes since.
//! Each directory keeps its durable entries (as of its last `sync_dir`): files, and directories
//! too — a `create_dir_all` is volatile until each new level's parent is synced, as `mkdir` is
//! on a real disk, and a power loss takes an unsynced directory with everything in it. Roots
//! (`/`, or the empty parent of a relative name) always exist. [`SimFs::crash`]
//! simulates a power loss: it builds a new file system from the durable state, where each write
//! not covered by a sync is — depending on the mode — dropped, kept, or torn (a random subset of
//! its 512-byte sectors lands), and each unsynced directory change may or may not have happened.

use super::{File, Fs};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;

const SECTOR_BYTES: usize = 512;

#[derive(Debug, Clone)]
enum PendingOp {
    /// `durable`: an O_DSYNC write the disk acknowledged; it survives a crash whole.
    Write {
        pos: u64,
        data: Vec<u8>,
        durable: bool,
    },
    Truncate {
        size: u64,
    },
}

#[derive(Debug, Default)]
struct Inode {
    data: Vec<u8>,
    durable: Vec<u8>,
    unsynced: Vec<PendingOp>,
}

#[derive(Default)]
struct State {
    files: BTreeMap<PathBuf, Rc<RefCell<Inode>>>,
    durable_files: BTreeMap<PathBuf, Rc<RefCell<Inode>>>,
    dirs: BTreeSet<PathBuf>,
    /// The directories whose name is durable in their parent (as of its last `sync_dir`).
    durable_dirs: BTreeSet<PathBuf>,
    syncs: u64,
    /// Scheduling points a durable write stays in flight (torn by a crash) after it is issued,
    /// beyond the first.
    durable_write_extra_polls: u32,
}

/// What happens to writes and directory changes not yet made durable when the power goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashMode {
    /// Everything not synced is lost.
    DropUnsynced,
    /// Each unsynced write is dropped, kept or torn at random; unsynced directory changes
    /// happen or not at random.
    Random { seed: u64 },
}

/// An in-memory, crashable file system. Clones share the same state.
#[derive(Clone, Default)]
pub struct SimFs {
    state: Rc<RefCell<State>>,
}

struct SplitMix(u64);
impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Mixed into a crash's seed for the directories' draws.
const DIR_RNG_SALT: u64 = 0xD1F5_D1F5_D1F5_D1F5;

/// A root: `/`, or the empty parent of a relative path. It always exists.
fn is_root(p: &Path) -> bool {
    p.as_os_str().is_empty() || p.parent().is_none()
}

fn apply(data: &mut Vec<u8>, op: &PendingOp) {
    match op {
        PendingOp::Write { pos, data: d, .. } => write_into(data, *pos, d),
        PendingOp::Truncate { size } => data.resize(*size as usize, 0),
    }
}

fn write_into(buf: &mut Vec<u8>, pos: u64, d: &[u8]) {
    let pos = pos as usize;
    if buf.len() < pos + d.len() {
        buf.resize(pos + d.len(), 0);
    }
    buf[pos..pos + d.len()].copy_from_slice(d);
}

impl SimFs {
    pub fn new() -> SimFs {
        SimFs::default()
    }

    /// Keeps each durable write in flight for `n` more scheduling points (a slower disk), so
    /// that a test can have several in flight at once. Not kept across [`SimFs::crash`].
    pub fn set_durable_write_extra_polls(&self, n: u32) {
        self.state.borrow_mut().durable_write_extra_polls = n;
    }

    /// Number of `sync_data` calls and durable writes so far (to check that commits really sync).
    pub fn sync_count(&self) -> u64 {
        self.state.borrow().syncs
    }

    /// Simulates a power loss and returns the file system as it is when power returns.
    /// Handles opened before keep working on the old state, which nobody can see any more.
    pub fn crash(&self, mode: CrashMode) -> SimFs {
        let st = self.state.borrow();
        let mut rng = SplitMix(match mode {
            CrashMode::DropUnsynced => 0,
            CrashMode::Random { seed } => seed,
        });
        let random = matches!(mode, CrashMode::Random { .. });
        // Directories first, each after its parent (paths order by components): one survives
        // if its parent did and its name is durable — or, in a random crash, by chance, as an
        // unsynced creation may have reached the disk. Their own generator, so that the files'
        // draws for a seed are what they were before directories were modelled.
        let mut dir_rng = SplitMix(rng.0 ^ DIR_RNG_SALT);
        let mut dirs = BTreeSet::new();
        for d in &st.dirs {
            let survives = match d.parent() {
                None => true,
                Some(p) if p.as_os_str().is_empty() => true,
                Some(p) => {
                    (is_root(p) || dirs.contains(p))
                        && (st.durable_dirs.contains(d) || (random && dir_rng.below(2) == 0))
                }
            };
            if survives {
                dirs.insert(d.clone());
            }
        }
        let parent_survived = |p: &Path| p.parent().is_some_and(|q| is_root(q) || dirs.contains(q));
        let mut names: BTreeSet<&PathBuf> = st.durable_files.keys().collect();
        if random {
            // An unsynced creation may have reached the disk; an unsynced removal may not have.
            for p in st.files.keys() {
                if !st.durable_files.contains_key(p) && rng.below(2) == 0 {
                    names.insert(p);
                }
            }
            for p in st.durable_files.keys() {
                if !st.files.contains_key(p) && rng.below(2) == 0 {
                    names.remove(p);
                }
            }
        }
        names.retain(|p| parent_survived(p));
        let mut out = State {
            durable_dirs: dirs.clone(),
            dirs,
            ..State::default()
        };
        for p in names {
            let inode = if random && rng.below(2) == 0 {
                st.files.get(p).or_else(|| st.durable_files.get(p))
            } else {
                st.durable_files.get(p).or_else(|| st.files.get(p))
            }
            .expect("name came from one of the maps");
            let ino = inode.borrow();
            let mut data = ino.durable.clone();
            for op in &ino.unsynced {
                if matches!(op, PendingOp::Write { durable: true, .. }) {
                    // Acknowledged durable: it lands, over whatever earlier writes did there.
                    apply(&mut data, op);
                } else if random {
                    match rng.below(3) {
                        0 => {}
                        1 => apply(&mut data, op),
                        _ => match op {
                            PendingOp::Write { pos, data: d, .. } => {
                                for (i, sector) in d.chunks(SECTOR_BYTES).enumerate() {
                                    if rng.below(2) == 0 {
                                        write_into(
                                            &mut data,
                                            pos + (i * SECTOR_BYTES) as u64,
                                            sector,
                                        );
                                    }
                                }
                            }
                            PendingOp::Truncate { .. } => apply(&mut data, op),
                        },
                    }
                }
            }
            let new = Rc::new(RefCell::new(Inode {
                durable: data.clone(),
                data,
                unsynced: Vec::new(),
            }));
            out.files.insert(p.clone(), new.clone());
            out.durable_files.insert(p.clone(), new);
        }
        SimFs {
            state: Rc::new(RefCell::new(out)),
        }
    }

    /// Reads a whole file as it is now (for tests that corrupt or inspect bytes).
    pub fn read_file(&self, path: &Path) -> Option<Vec<u8>> {
        let st = self.state.borrow();
        st.files.get(path).map(|i| i.borrow().data.clone())
    }

    /// Replaces a file's content, durably (a test's stand-in for a bit flip on the platter).
    pub fn write_file_durably(&self, path: &Path, content: Vec<u8>) {
        let mut st = self.state.borrow_mut();
        let inode = Rc::new(RefCell::new(Inode {
            durable: content.clone(),
            data: content,
            unsynced: Vec::new(),
        }));
        st.files.insert(path.to_path_buf(), inode.clone());
        st.durable_files.insert(path.to_path_buf(), inode);
    }
}

/// Every simulated I/O is a point where a test can stop the world (and crash) between two
/// operations, as a real disk's latency would allow.
async fn io_point() {
    super::yield_now().await
}

pub struct SimFile {
    inode: Rc<RefCell<Inode>>,
    fs: SimFs,
}

impl File for SimFile {
    async fn read_at(&self, pos: u64, len: usize) -> io::Result<bytes::Bytes> {
        io_point().await;
        let ino = self.inode.borrow();
        let start = (pos as usize).min(ino.data.len());
        let end = start.saturating_add(len).min(ino.data.len());
        Ok(bytes::Bytes::copy_from_slice(&ino.data[start..end]))
    }

    async fn write_at(&self, pos: u64, data: &[u8]) -> io::Result<usize> {
        io_point().await;
        let mut ino = self.inode.borrow_mut();
        write_into(&mut ino.data, pos, data);
        ino.unsynced.push(PendingOp::Write {
            pos,
            data: data.to_vec(),
            durable: false,
        });
        Ok(data.len())
    }

    /// A write that may be torn by a crash until the disk acknowledges it (one scheduling point
    /// later); from then on it survives whole.
    async fn write_durable_at(&self, pos: u64, data: &[u8]) -> io::Result<usize> {
        let n = self.write_at(pos, data).await?;
        let extra = self.fs.state.borrow().durable_write_extra_polls;
        for _ in 0..=extra {
            io_point().await;
        }
        let mut ino = self.inode.borrow_mut();
        // Still pending unless a sync_data covered it meanwhile.
        if let Some(PendingOp::Write { durable, .. }) = ino.unsynced.iter_mut().rev().find(
            |op| matches!(op, PendingOp::Write { pos: p, data: d, .. } if *p == pos && d == data),
        ) {
            *durable = true;
        }
        drop(ino);
        self.fs.state.borrow_mut().syncs += 1;
        Ok(n)
    }

    async fn sync_data(&self) -> io::Result<()> {
        io_point().await;
        let mut ino = self.inode.borrow_mut();
        ino.durable = ino.data.clone();
        ino.unsynced.clear();
        self.fs.state.borrow_mut().syncs += 1;
        Ok(())
    }

    async fn size(&self) -> io::Result<u64> {
        io_point().await;
        Ok(self.inode.borrow().data.len() as u64)
    }

    async fn truncate(&self, size: u64) -> io::Result<()> {
        io_point().await;
        let mut ino = self.inode.borrow_mut();
        ino.data.resize(size as usize, 0);
        ino.unsynced.push(PendingOp::Truncate { size });
        Ok(())
    }

    async fn close(&self) -> io::Result<()> {
        io_point().await;
        Ok(())
    }
}

fn not_found(p: &Path) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("{p:?} not found"))
}

impl Fs for SimFs {
    type File = SimFile;

    async fn open(&self, path: &Path, create: bool) -> io::Result<SimFile> {
        io_point().await;
        let mut st = self.state.borrow_mut();
        let parent = path.parent().unwrap_or(Path::new(""));
        if !st.dirs.contains(parent) {
            return Err(not_found(parent));
        }
        let inode = match st.files.get(path) {
            Some(i) => i.clone(),
            None if create => {
                let i = Rc::new(RefCell::new(Inode::default()));
                st.files.insert(path.to_path_buf(), i.clone());
                i
            }
            None => return Err(not_found(path)),
        };
        Ok(SimFile {
            inode,
            fs: self.clone(),
        })
    }

    async fn remove(&self, path: &Path) -> io::Result<()> {
        io_point().await;
        let mut st = self.state.borrow_mut();
        st.files
            .remove(path)
            .map(|_| ())
            .ok_or_else(|| not_found(path))
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        io_point().await;
        let mut st = self.state.borrow_mut();
        let i = st.files.remove(from).ok_or_else(|| not_found(from))?;
        st.files.insert(to.to_path_buf(), i);
        Ok(())
    }

    async fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        io_point().await;
        let mut st = self.state.borrow_mut();
        let in_dir = |p: &Path| p.parent() == Some(dir);
        st.durable_files.retain(|p, _| !in_dir(p));
        let now: Vec<_> = st
            .files
            .iter()
            .filter(|(p, _)| in_dir(p))
            .map(|(p, i)| (p.clone(), i.clone()))
            .collect();
        st.durable_files.extend(now);
        // Subdirectories too (SimFs has no rmdir: a directory once created stays).
        let subdirs: Vec<PathBuf> = st.dirs.iter().filter(|p| in_dir(p)).cloned().collect();
        st.durable_dirs.extend(subdirs);
        Ok(())
    }

    /// Volatile, like `mkdir`: each new level is lost at a crash unless its parent was synced
    /// (see [`super::create_dir_all_durable`]).
    async fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        io_point().await;
        let mut st = self.state.borrow_mut();
        let mut d = Some(dir);
        while let Some(p) = d {
            st.dirs.insert(p.to_path_buf());
            d = p.parent();
        }
        Ok(())
    }

    async fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        io_point().await;
        let st = self.state.borrow();
        if !st.dirs.contains(dir) {
            return Err(not_found(dir));
        }
        Ok(st
            .files
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name()?.to_str().map(str::to_string))
            .collect())
    }

    async fn exists(&self, path: &Path) -> bool {
        io_point().await;
        let st = self.state.borrow();
        st.files.contains_key(path) || st.dirs.contains(path)
    }
}
