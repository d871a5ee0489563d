//! glommio DMA files: O_DIRECT reads and writes through io_uring.

use super::{File, Fs};
use bytes::Bytes;
use glommio::io::{DmaFile, OpenOptions};
use std::cell::RefCell;
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The production file system: glommio DMA files. Must be used on a glommio executor.
#[derive(Clone, Default)]
pub struct DmaFs {
    _private: (),
}

impl DmaFs {
    /// Prepares the data directory for DMA use on the current executor.
    ///
    /// glommio probes polled-I/O support with the first file it opens on a disk and caches the
    /// answer per thread; an empty first file makes it believe iopoll works and every later read
    /// fails with EOPNOTSUPP (glommio issues #605, #670). Opening a non-empty file first avoids it.
    /// Each call probes its own file: executors starting at once on one data directory must not
    /// see each other's probe half-written (truncated, hence empty).
    pub async fn new(data_dir: &Path) -> io::Result<DmaFs> {
        static PROBES: AtomicU64 = AtomicU64::new(0);
        super::create_dir_all_durable_blocking(data_dir, |d| std::fs::create_dir_all(d))?;
        let n = PROBES.fetch_add(1, Ordering::Relaxed);
        let probe = data_dir.join(format!(".sluice-dma-probe-{}-{n}", std::process::id()));
        std::fs::write(&probe, [0u8; 4096])?;
        let result = async {
            let f = OpenOptions::new()
                .read(true)
                .dma_open(&probe)
                .await
                .map_err(io::Error::from)?;
            f.read_at(0, 4096).await.map_err(io::Error::from)?;
            f.close().await.map_err(io::Error::from)
        }
        .await;
        let _ = std::fs::remove_file(&probe);
        result.map(|()| DmaFs { _private: () })
    }
}

/// Raises the soft RLIMIT_MEMLOCK to the hard limit: glommio registers its I/O memory, and
/// the default soft limit is too small for several executors.
pub fn raise_memlock_limit() -> io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit write/read a plain struct we own; no other invariants.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) != 0 {
            return Err(io::Error::last_os_error());
        }
        lim.rlim_cur = lim.rlim_max;
        if libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(lim.rlim_cur)
}

pub struct DmaHandle {
    file: Rc<DmaFile>,
    path: PathBuf,
    /// A second descriptor of the same file, opened O_DSYNC on its first durable write: each
    /// write on it completes once durable, in one io_uring operation (no fdatasync handed to a
    /// kernel worker thread).
    dsync: RefCell<Option<Rc<DmaFile>>>,
}

impl DmaHandle {
    async fn dsync_file(&self) -> io::Result<Rc<DmaFile>> {
        if let Some(f) = self.dsync.borrow().as_ref() {
            return Ok(f.clone());
        }
        let f = Rc::new(
            OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_DSYNC)
                .dma_open(&self.path)
                .await
                .map_err(io::Error::from)?,
        );
        *self.dsync.borrow_mut() = Some(f.clone());
        Ok(f)
    }
}

impl File for DmaHandle {
    async fn read_at(&self, pos: u64, len: usize) -> io::Result<Bytes> {
        let r = self.file.read_at(pos, len).await.map_err(io::Error::from)?;
        // The read's own buffer, handed over (vendor/glommio.patch): copying it out was ~10%
        // of a shard's time serving consumers from disk. A buffer that is shared or registered
        // with io_uring is copied as before.
        Ok(match r.into_owned() {
            Ok(owned) => Bytes::from_owner(owned),
            Err(r) => Bytes::copy_from_slice(&r),
        })
    }

    async fn write_at(&self, pos: u64, data: &[u8]) -> io::Result<usize> {
        let mut buf = self.file.alloc_dma_buffer(data.len());
        buf.as_bytes_mut().copy_from_slice(data);
        self.file.write_at(buf, pos).await.map_err(io::Error::from)
    }

    async fn write_zeros_at(&self, pos: u64, len: usize) -> io::Result<usize> {
        // The I/O buffer is zeroed in place: no zeroed heap vector to allocate and copy from.
        let mut buf = self.file.alloc_dma_buffer(len);
        buf.as_bytes_mut().fill(0);
        self.file.write_at(buf, pos).await.map_err(io::Error::from)
    }

    async fn write_durable_at(&self, pos: u64, data: &[u8]) -> io::Result<usize> {
        let file = self.dsync_file().await?;
        let mut buf = file.alloc_dma_buffer(data.len());
        buf.as_bytes_mut().copy_from_slice(data);
        file.write_at(buf, pos).await.map_err(io::Error::from)
    }

    async fn write_durable_parts(
        &self,
        pos: u64,
        parts: &[&[u8]],
        len: usize,
    ) -> io::Result<usize> {
        let file = self.dsync_file().await?;
        let mut buf = file.alloc_dma_buffer(len);
        super::fill_parts(buf.as_bytes_mut(), parts);
        file.write_at(buf, pos).await.map_err(io::Error::from)
    }

    async fn sync_data(&self) -> io::Result<()> {
        self.file.fdatasync().await.map_err(io::Error::from)
    }

    async fn size(&self) -> io::Result<u64> {
        self.file.file_size().await.map_err(io::Error::from)
    }

    async fn truncate(&self, size: u64) -> io::Result<()> {
        self.file.truncate(size).await.map_err(io::Error::from)
    }

    async fn close(&self) -> io::Result<()> {
        // Dropping the last Rc closes the descriptor; glommio's explicit close needs ownership.
        Ok(())
    }
}

impl Fs for DmaFs {
    type File = DmaHandle;

    async fn open(&self, path: &Path, create: bool) -> io::Result<DmaHandle> {
        // Not DmaFile::create: it opens write-only and later reads fail with EBADF.
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .dma_open(path)
            .await
            .map_err(io::Error::from)?;
        Ok(DmaHandle {
            file: Rc::new(f),
            path: path.to_path_buf(),
            dsync: RefCell::new(None),
        })
    }

    async fn remove(&self, path: &Path) -> io::Result<()> {
        glommio::io::remove(path).await.map_err(io::Error::from)
    }

    async fn reclaim(&self, path: &Path) -> io::Result<()> {
        super::reclaim::reclaim_in_background(path.to_path_buf(), false);
        Ok(())
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        glommio::io::rename(from, to).await.map_err(io::Error::from)
    }

    async fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        // glommio's Directory::open fails with EBADF on relative paths.
        let dir = std::path::absolute(dir)?;
        let d = glommio::io::Directory::open(&dir)
            .await
            .map_err(io::Error::from)?;
        d.sync().await.map_err(io::Error::from)?;
        d.close().await.map_err(io::Error::from)
    }

    async fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }

    async fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            if let Some(n) = e.file_name().to_str() {
                out.push(n.to_string());
            }
        }
        Ok(out)
    }

    async fn exists(&self, path: &Path) -> bool {
        path.exists()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raise_memlock_is_idempotent() {
        let a = raise_memlock_limit().expect("raise");
        let b = raise_memlock_limit().expect("raise again");
        assert_eq!(a, b);
    }
}
