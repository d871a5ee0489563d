//! The single-node [`PartitionLog`]: committed means durable on this disk (the storage log's
//! group commit, `sluice_storage::log`). Generic over the file system, so a partition runs on
//! glommio's DMA files in production and on `SimFs` (power loss) in tests.

use super::{PartitionLog, Staged};
use sluice_storage::fs::Fs;
use sluice_storage::{
    AppendInfo, AppendTicket, Log, LogConfig, LogStats, ReadBatch, Result, RetentionOutcome,
    SegmentInfo,
};
use std::path::PathBuf;

/// A partition log on one node: the storage log, committed when durable.
pub struct LocalLog<F: Fs> {
    log: Log<F>,
}

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
            log: Log::open(env.clone(), dir, config).await?,
        })
    }

    fn start_offset(&self) -> u64 {
        self.log.start_offset()
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
