//! The group coordinator on shard 0: the [`Groups`] state machine, its durable log of commits
//! (`<data>/groups/`, replayed at start) and the session-expiry timer.

use super::group::{Assignment, GroupRecord, Groups, TopicPartition};
use super::{StreamError, StreamResult};
use crate::runtime;
use sluice_storage::fs::DmaFs;
use sluice_storage::{BatchBuilder, Log};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

/// Session expiry is checked this often.
pub const EXPIRY_CHECK_INTERVAL_MS: u64 = 50;
const REPLAY_READ_BYTES: usize = 1 << 20;

pub type PartitionsOf = dyn Fn(&str) -> Option<u32>;

pub struct Coordinator {
    log: Rc<Log<DmaFs>>,
    groups: RefCell<Groups>,
    closed: Cell<bool>,
}

impl Coordinator {
    /// Opens the groups log, replays it, and starts the expiry timer (`partitions` resolves a
    /// topic's partition count at the time of a rebalance).
    pub async fn open(
        fs: DmaFs,
        dir: PathBuf,
        partitions: Rc<PartitionsOf>,
    ) -> StreamResult<Rc<Coordinator>> {
        let log = Log::open(fs, dir, crate::config::meta_log_config()).await?;
        let mut groups = Groups::new(runtime::now_ms());
        let mut at = log.start_offset();
        let mut n = 0usize;
        while at < log.end_offset() {
            for b in log.read(at, REPLAY_READ_BYTES).await? {
                for r in b.view().records() {
                    let r = r.map_err(|e| StreamError::Internal(e.to_string()))?;
                    groups.replay(&GroupRecord::decode(r.value).map_err(StreamError::Internal)?);
                    n += 1;
                }
                at = b.header.next_offset();
            }
        }
        tracing::info!(records = n, "consumer group commits loaded");
        let c = Rc::new(Coordinator {
            log: Rc::new(log),
            groups: RefCell::new(groups),
            closed: Cell::new(false),
        });
        let weak = Rc::downgrade(&c);
        runtime::spawn(async move {
            loop {
                runtime::sleep(Duration::from_millis(EXPIRY_CHECK_INTERVAL_MS)).await;
                let Some(c) = weak.upgrade() else { break };
                if c.closed.get() {
                    break;
                }
                let expired = c.groups.borrow_mut().tick(runtime::now_ms(), &*partitions);
                if expired > 0 {
                    tracing::info!(expired, "consumer group members expired");
                }
            }
        });
        Ok(c)
    }

    pub fn join(
        &self,
        group: &str,
        member_id: Option<&str>,
        topics: Vec<String>,
        session_timeout_ms: u64,
        partitions: &PartitionsOf,
    ) -> StreamResult<Assignment> {
        self.groups.borrow_mut().join(
            runtime::now_ms(),
            group,
            member_id,
            topics,
            session_timeout_ms,
            partitions,
        )
    }

    pub fn heartbeat(&self, group: &str, member_id: &str) -> StreamResult<Assignment> {
        self.groups
            .borrow_mut()
            .heartbeat(runtime::now_ms(), group, member_id)
    }

    pub fn leave(
        &self,
        group: &str,
        member_id: &str,
        partitions: &PartitionsOf,
    ) -> StreamResult<()> {
        self.groups.borrow_mut().leave(group, member_id, partitions)
    }

    /// Checks, stages and applies a commit with no await in between (so commits reach the log
    /// in the order they were accepted), then waits for its fdatasync before answering.
    pub async fn commit(
        &self,
        group: &str,
        member_id: &str,
        generation: u64,
        offsets: &[(TopicPartition, u64)],
    ) -> StreamResult<()> {
        if offsets.is_empty() {
            return Ok(());
        }
        self.log.wait_for_space(offsets.len() * 256 + 4096).await?;
        let now = runtime::now_ms();
        let records = self
            .groups
            .borrow_mut()
            .plan_commit(now, group, member_id, generation, offsets)?;
        let mut b = BatchBuilder::new();
        for r in &records {
            b.push_parts(now as i64, None, &r.encode(), std::iter::empty());
        }
        let ticket = self
            .log
            .stage_batch(b.finish().expect("a commit has records"))?;
        {
            let mut g = self.groups.borrow_mut();
            for r in &records {
                g.replay(r);
            }
        }
        self.log.durable(ticket).await?;
        Ok(())
    }

    pub fn describe(&self, group: &str) -> Option<super::group::GroupDescription> {
        self.groups.borrow().describe(group)
    }

    pub fn committed(&self, group: &str) -> BTreeMap<TopicPartition, u64> {
        self.groups.borrow().committed(group)
    }

    pub async fn close(&self) {
        self.closed.set(true);
        let _ = self.log.close().await;
    }
}
