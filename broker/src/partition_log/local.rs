//! The single-node [`PartitionLog`]: committed means durable on this disk (the storage log's
//! group commit, `sluice_storage::log`). Generic over the file system, so a partition runs on
//! glommio's DMA files in production and on `SimFs` (power loss) in tests.

use super::{PartitionLog, Staged};
use sluice_storage::fs::{File as _, Fs};
use sluice_storage::{
    AppendInfo, AppendTicket, Log, LogConfig, LogStats, ReadBatch, Result, RetentionOutcome,
    SegmentInfo, StorageError,
};
use std::path::PathBuf;

/// A partition log on one node: the storage log, committed when durable.
pub struct LocalLog<F: Fs> {
    log: Log<F>,
    fs: F,
    dir: PathBuf,
}

/// The snapshot's file in the log's directory (the storage log ignores names it does not own,
/// and removes stray `*.tmp` files when it opens).
const SNAPSHOT_FILE: &str = "engine.snapshot";
/// A snapshot is read and written in pieces of this size (block-aligned): each I/O buffer is
/// a piece, not a second copy of a snapshot that can take a hundred MiB (a large FIFO state).
const SNAPSHOT_IO_BYTES: usize = 8 << 20;

impl<F: Fs> LocalLog<F> {
    /// The storage log underneath (offline tools and tests).
    pub fn storage(&self) -> &Log<F> {
        &self.log
    }
}

impl<F: Fs> PartitionLog for LocalLog<F> {
    type Env = F;
    type Ticket = AppendTicket;

    async fn open(env: &F, dir: PathBuf, config: LogConfig) -> Result<Self> {
        Ok(LocalLog {
            log: Log::open(env.clone(), dir.clone(), config).await?,
            fs: env.clone(),
            dir,
        })
    }

    fn start_offset(&self) -> u64 {
        self.log.start_offset()
    }

    async fn read_snapshot(&self) -> Result<Option<Vec<u8>>> {
        let path = self.dir.join(SNAPSHOT_FILE);
        if !self.fs.exists(&path).await {
            return Ok(None);
        }
        let io = |op| {
            let path = path.clone();
            move |e| StorageError::io(op, path, e)
        };
        let f = self.fs.open(&path, false).await.map_err(io("open"))?;
        let size = f.size().await.map_err(io("stat"))? as usize;
        let mut bytes = Vec::with_capacity(size);
        while bytes.len() < size {
            let want = SNAPSHOT_IO_BYTES.min(size - bytes.len());
            let piece = f
                .read_at(bytes.len() as u64, want)
                .await
                .map_err(io("read"))?;
            if piece.is_empty() {
                break;
            }
            bytes.extend_from_slice(&piece);
        }
        f.close().await.map_err(io("close"))?;
        Ok(Some(bytes))
    }

    async fn write_snapshot(&self, bytes: Vec<u8>) -> Result<()> {
        let path = self.dir.join(SNAPSHOT_FILE);
        let tmp = self.dir.join(format!("{SNAPSHOT_FILE}.tmp"));
        let io = |op| {
            let tmp = tmp.clone();
            move |e| StorageError::io(op, tmp, e)
        };
        // Whole blocks (O_DIRECT), then cut to the length.
        let len = bytes.len();
        let mut block = bytes;
        block.resize(len.div_ceil(4096) * 4096, 0);
        let f = self.fs.open(&tmp, true).await.map_err(io("create"))?;
        let mut pos = 0;
        while pos < block.len() {
            let n = f
                .write_at(
                    pos as u64,
                    &block[pos..block.len().min(pos + SNAPSHOT_IO_BYTES)],
                )
                .await
                .map_err(io("write"))?;
            if n == 0 {
                return Err(StorageError::io(
                    "write",
                    tmp.clone(),
                    std::io::Error::new(std::io::ErrorKind::WriteZero, "short write"),
                ));
            }
            pos += n;
        }
        f.truncate(len as u64).await.map_err(io("truncate"))?;
        f.sync_data().await.map_err(io("fdatasync"))?;
        f.close().await.map_err(io("close"))?;
        self.fs.rename(&tmp, &path).await.map_err(io("rename"))?;
        self.fs
            .sync_dir(&self.dir)
            .await
            .map_err(|e| StorageError::io("sync_dir", self.dir.clone(), e))
    }

    async fn remove_snapshot(&self) -> Result<()> {
        let path = self.dir.join(SNAPSHOT_FILE);
        if self.fs.exists(&path).await {
            self.fs
                .remove(&path)
                .await
                .map_err(|e| StorageError::io("remove", path.clone(), e))?;
        }
        Ok(())
    }

    fn end_offset(&self) -> u64 {
        self.log.end_offset()
    }

    fn term(&self) -> u64 {
        self.log.term()
    }

    async fn wait_for_space(&self, len_bytes: usize) -> Result<()> {
        self.log.wait_for_space(len_bytes).await
    }

    fn stage(&self, batch: Vec<u8>) -> Result<Staged<AppendTicket>> {
        let term = self.log.term();
        let ticket = self.log.stage_batch(batch)?;
        Ok(Staged {
            info: ticket.info,
            term,
            ticket,
        })
    }

    async fn committed(&self, ticket: AppendTicket) -> Result<AppendInfo> {
        self.log.durable(ticket).await
    }

    async fn read(&self, offset: u64, max_bytes: usize) -> Result<Vec<ReadBatch>> {
        self.log.read(offset, max_bytes).await
    }

    async fn offset_for_timestamp(&self, ts_ms: i64) -> Result<Option<u64>> {
        self.log.offset_for_timestamp(ts_ms).await
    }

    async fn truncate_from(&self, offset: u64) -> Result<()> {
        self.log.truncate_from(offset).await
    }

    async fn delete_segments_below(&self, offset: u64) -> Result<RetentionOutcome> {
        self.log.delete_segments_below(offset).await
    }

    async fn enforce_retention(
        &self,
        now_ms: i64,
        keep_from: Option<u64>,
    ) -> Result<RetentionOutcome> {
        self.log.enforce_retention(now_ms, keep_from).await
    }

    fn config(&self) -> &LogConfig {
        self.log.config()
    }

    fn segments(&self) -> Vec<SegmentInfo> {
        self.log.segments()
    }

    fn size_bytes(&self) -> u64 {
        self.log.size_bytes()
    }

    fn stats(&self) -> LogStats {
        self.log.stats()
    }

    async fn close(&self) -> Result<()> {
        self.log.close().await
    }
}
