//! One topic partition on its owning shard: a segment log, the event that wakes long-polling
//! fetches after an append, and the retention timer.

use super::{FetchReply, StreamError, StreamResult};
use crate::partition_log::{LocalLog, PartitionLog};
use crate::runtime::{self, Event};
use sluice_storage::fs::DmaFs;
use sluice_storage::{AppendInfo, BatchView, LogConfig};
use std::cell::Cell;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

/// Long-polling fetches parked on one partition at once; more are answered `Throttled`.
pub const FETCH_WAITERS_PER_PARTITION_MAX: usize = 10_000;
/// Retention looks at each partition this often.
pub const RETENTION_INTERVAL_MS: u64 = 500;

pub struct TopicPartition {
    pub topic_id: u64,
    pub partition: u32,
    pub dir: PathBuf,
    log: Rc<LocalLog<DmaFs>>,
    appended: Event,
    waiters: Cell<usize>,
    closed: Rc<Cell<bool>>,
}

impl TopicPartition {
    pub async fn open(
        fs: DmaFs,
        dir: PathBuf,
        topic_id: u64,
        partition: u32,
        log_config: LogConfig,
    ) -> StreamResult<Rc<TopicPartition>> {
        let log = Rc::new(LocalLog::open(&fs, dir.clone(), log_config).await?);
        let closed = Rc::new(Cell::new(false));
        let tp = Rc::new(TopicPartition {
            topic_id,
            partition,
            dir,
            log: log.clone(),
            appended: Event::default(),
            waiters: Cell::new(0),
            closed: closed.clone(),
        });
        if log.config().retention_ms.is_some() || log.config().retention_bytes.is_some() {
            runtime::spawn(async move {
                while !closed.get() {
                    runtime::sleep(Duration::from_millis(RETENTION_INTERVAL_MS)).await;
                    if closed.get() {
                        break;
                    }
                    match log.enforce_retention(runtime::now_ms() as i64, None).await {
                        Ok(o) if o.segments_deleted > 0 => tracing::debug!(
                            topic = topic_id,
                            partition,
                            segments = o.segments_deleted,
                            start = o.new_start_offset,
                            "retention"
                        ),
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!(topic = topic_id, partition, error = %e, "retention")
                        }
                    }
                }
            });
        }
        Ok(tp)
    }

    /// Appends a producer's batch as it is (verified by the log: checksum and record
    /// structure); resolves after its fdatasync, with the offsets it got.
    pub async fn produce(&self, batch: Vec<u8>) -> StreamResult<AppendInfo> {
        if self.closed.get() {
            return Err(StreamError::Unavailable("partition closed".into()));
        }
        let view =
            BatchView::parse(&batch).map_err(|e| StreamError::InvalidBatch(e.to_string()))?;
        if view.header.is_control() {
            return Err(StreamError::InvalidBatch(
                "producers may not write control batches".into(),
            ));
        }
        let info = self.log.append(batch).await?;
        self.appended.notify();
        Ok(info)
    }

    /// Whole batches from `offset` on (the first one may start before it), up to about
    /// `max_bytes` and `max_records`; waits until `deadline_ms` for data if there is none.
    pub async fn fetch(
        &self,
        offset: u64,
        max_bytes: usize,
        max_records: u32,
        deadline_ms: u64,
    ) -> StreamResult<FetchReply> {
        loop {
            if self.closed.get() {
                return Err(StreamError::Unavailable("partition closed".into()));
            }
            let (start, end) = (self.log.start_offset(), self.log.end_offset());
            if offset < start || offset > end {
                return Err(StreamError::OffsetOutOfRange { offset, start, end });
            }
            if offset < end {
                let mut batches = Vec::new();
                let mut records = 0u64;
                for b in self.log.read(offset, max_bytes).await? {
                    if records >= u64::from(max_records) {
                        break;
                    }
                    records += b
                        .header
                        .last_offset()
                        .saturating_sub(offset.max(b.header.base_offset))
                        + 1;
                    batches.push(b.bytes);
                }
                return Ok(FetchReply {
                    batches,
                    start_offset: self.log.start_offset(),
                    end_offset: self.log.end_offset(),
                });
            }
            if runtime::now_ms() >= deadline_ms {
                return Ok(FetchReply {
                    batches: Vec::new(),
                    start_offset: start,
                    end_offset: end,
                });
            }
            if self.waiters.get() >= FETCH_WAITERS_PER_PARTITION_MAX {
                return Err(StreamError::Throttled(
                    "too many fetches waiting on a partition",
                ));
            }
            self.waiters.set(self.waiters.get() + 1);
            self.appended.listen_until(deadline_ms).await;
            self.waiters.set(self.waiters.get() - 1);
        }
    }

    pub fn offsets(&self) -> (u64, u64) {
        (self.log.start_offset(), self.log.end_offset())
    }

    pub async fn offset_for_timestamp(&self, ts_ms: i64) -> StreamResult<u64> {
        Ok(self
            .log
            .offset_for_timestamp(ts_ms)
            .await?
            .unwrap_or_else(|| self.log.end_offset()))
    }

    pub fn segment_count(&self) -> usize {
        self.log.segments().len()
    }

    pub async fn close(&self) -> StreamResult<()> {
        self.closed.set(true);
        self.appended.notify();
        self.log.close().await?;
        Ok(())
    }
}
