//! Fault injection: a wrapper around any [`Fs`] that fails chosen operations on a plan.

use super::{File, Fs};
use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::rc::Rc;

/// The operations a plan can fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Read,
    Write,
    Sync,
    Truncate,
    Open,
    SyncDir,
    Remove,
}

/// What an injected fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// EIO.
    Eio,
    /// ENOSPC.
    NoSpace,
    /// A write that stores only its first half (in whole 4 KiB blocks) and reports so.
    ShortWrite,
}

#[derive(Debug, Clone)]
struct Rule {
    op: Op,
    /// Fires on the operations numbered `from..from + count` (0-based per op kind).
    from: u64,
    count: u64,
    fault: Fault,
}

#[derive(Debug, Default)]
struct PlanState {
    rules: Vec<Rule>,
    seen: HashMap<Op, u64>,
    fired: u64,
}

/// A schedule of faults, shared by every handle of a [`FaultyFs`]; change it at any time.
#[derive(Debug, Clone, Default)]
pub struct FaultPlan {
    state: Rc<RefCell<PlanState>>,
}

impl FaultPlan {
    pub fn new() -> FaultPlan {
        FaultPlan::default()
    }

    /// Fails `count` operations of kind `op`, starting with the `from`-th one from now.
    pub fn fail(&self, op: Op, from_now: u64, count: u64, fault: Fault) {
        let mut st = self.state.borrow_mut();
        let from = st.seen.get(&op).copied().unwrap_or(0) + from_now;
        st.rules.push(Rule {
            op,
            from,
            count,
            fault,
        });
    }

    /// Removes every rule (the disk is healthy again).
    pub fn heal(&self) {
        self.state.borrow_mut().rules.clear();
    }

    /// How many faults have fired so far.
    pub fn fired(&self) -> u64 {
        self.state.borrow().fired
    }

    fn check(&self, op: Op) -> Option<Fault> {
        let mut st = self.state.borrow_mut();
        let n = {
            let c = st.seen.entry(op).or_insert(0);
            let n = *c;
            *c += 1;
            n
        };
        let hit = st
            .rules
            .iter()
            .find(|r| r.op == op && n >= r.from && n - r.from < r.count)
            .map(|r| r.fault);
        if hit.is_some() {
            st.fired += 1;
        }
        hit
    }

    fn err(&self, op: Op) -> io::Result<()> {
        match self.check(op) {
            None => Ok(()),
            Some(Fault::NoSpace) => Err(io::Error::from_raw_os_error(libc::ENOSPC)),
            Some(_) => Err(io::Error::from_raw_os_error(libc::EIO)),
        }
    }
}

/// Wraps a file system and fails operations as its [`FaultPlan`] says.
#[derive(Clone)]
pub struct FaultyFs<F: Fs> {
    inner: F,
    plan: FaultPlan,
}

impl<F: Fs> FaultyFs<F> {
    pub fn new(inner: F, plan: FaultPlan) -> Self {
        FaultyFs { inner, plan }
    }

    pub fn inner(&self) -> &F {
        &self.inner
    }
}

/// A short write's part: O_DIRECT writes are short by whole blocks, never by less than one.
fn short(data: &[u8]) -> &[u8] {
    let half = super::align_down(data.len() as u64 / 2).max(super::BLOCK_BYTES);
    &data[..(half as usize).min(data.len())]
}

pub struct FaultyFile<T: File> {
    inner: T,
    plan: FaultPlan,
}

impl<T: File> File for FaultyFile<T> {
    async fn read_at(&self, pos: u64, len: usize) -> io::Result<bytes::Bytes> {
        self.plan.err(Op::Read)?;
        self.inner.read_at(pos, len).await
    }

    async fn write_at(&self, pos: u64, data: &[u8]) -> io::Result<usize> {
        match self.plan.check(Op::Write) {
            None => self.inner.write_at(pos, data).await,
            Some(Fault::ShortWrite) => self.inner.write_at(pos, short(data)).await,
            Some(Fault::NoSpace) => Err(io::Error::from_raw_os_error(libc::ENOSPC)),
            Some(Fault::Eio) => Err(io::Error::from_raw_os_error(libc::EIO)),
        }
    }

    /// Faults of a write, then of a sync (a durable write is both; its flush can fail alone).
    async fn write_durable_at(&self, pos: u64, data: &[u8]) -> io::Result<usize> {
        let data = match self.plan.check(Op::Write) {
            None => data,
            Some(Fault::ShortWrite) => short(data),
            Some(Fault::NoSpace) => return Err(io::Error::from_raw_os_error(libc::ENOSPC)),
            Some(Fault::Eio) => return Err(io::Error::from_raw_os_error(libc::EIO)),
        };
        if let Some(fault) = self.plan.check(Op::Sync) {
            // The bytes may have reached the disk; the caller cannot know they are durable.
            self.inner.write_at(pos, data).await?;
            return Err(io::Error::from_raw_os_error(match fault {
                Fault::NoSpace => libc::ENOSPC,
                _ => libc::EIO,
            }));
        }
        self.inner.write_durable_at(pos, data).await
    }

    async fn sync_data(&self) -> io::Result<()> {
        self.plan.err(Op::Sync)?;
        self.inner.sync_data().await
    }

    async fn size(&self) -> io::Result<u64> {
        self.inner.size().await
    }

    async fn truncate(&self, size: u64) -> io::Result<()> {
        self.plan.err(Op::Truncate)?;
        self.inner.truncate(size).await
    }

    async fn close(&self) -> io::Result<()> {
        self.inner.close().await
    }
}

impl<F: Fs> Fs for FaultyFs<F> {
    type File = FaultyFile<F::File>;

    async fn open(&self, path: &Path, create: bool) -> io::Result<Self::File> {
        self.plan.err(Op::Open)?;
        Ok(FaultyFile {
            inner: self.inner.open(path, create).await?,
            plan: self.plan.clone(),
        })
    }

    async fn remove(&self, path: &Path) -> io::Result<()> {
        self.plan.err(Op::Remove)?;
        self.inner.remove(path).await
    }

    async fn reclaim(&self, path: &Path) -> io::Result<()> {
        self.plan.err(Op::Remove)?;
        self.inner.reclaim(path).await
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to).await
    }

    async fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.plan.err(Op::SyncDir)?;
        self.inner.sync_dir(dir).await
    }

    async fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.inner.create_dir_all(dir).await
    }

    async fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.inner.list(dir).await
    }

    async fn exists(&self, path: &Path) -> bool {
        self.inner.exists(path).await
    }
}
