//! The seam between the broker and its logs: [`PartitionLog`]. Every log the broker writes goes
//! through it — a queue partition (`shard/partition.rs`), the metadata log on shard 0
//! (`shard/mod.rs`, `metadata.rs`), the consumer-group log (`stream/coordinator.rs`) and topic
//! partitions (`stream/partition.rs`) — so that the moment a record *counts* is defined once.
//!
//! | module     | purpose                                                                  |
//! |------------|--------------------------------------------------------------------------|
//! | `mod.rs`   | the trait: stage, learn when committed, read, truncate, report offsets    |
//! | `local.rs` | [`LocalLog`]: the single-node implementation over `sluice_storage::Log`  |
//!
//! **Committed.** A batch is *committed* when it can no longer be lost: today, when it is
//! durable on this node's disk (`LocalLog`); with replication (REPLICATION.md, CONTRACT.md C10),
//! when it is durable on a majority in the leader's confirmed term. A user never asks "is it on
//! disk": it stages (synchronously, so that its own state and the log keep one order), then
//! awaits [`PartitionLog::committed`], and only then replies. Readers see committed batches
//! only ([`PartitionLog::end_offset`] is the committed end).
//!
//! **Shaped for a replicated implementation** (the `raft/` crate, not wired in yet):
//! - commit is asynchronous and may come from elsewhere (a quorum's acknowledgements): the
//!   ticket is a handle to wait on, not a write to perform;
//! - the log, not the caller, assigns what a leader stamps: the base offset and the term
//!   ([`PartitionLog::term`]; the batch format v2 carries it, `wire/src/batch.rs`);
//! - a follower whose uncommitted suffix conflicts with a new leader's cuts it
//!   ([`PartitionLog::truncate_from`]); only uncommitted batches are ever cut there;
//! - opening is part of the seam ([`PartitionLog::open`] over an environment: a file system
//!   today, a file system plus a Raft group handle later), so a partition can be rebuilt from
//!   whatever the log says is committed.
//!
//! Errors are `StorageError` today; a replicated log will add "not the leader" (with a hint)
//! to them, mapped at the same edges.

mod local;

pub use local::LocalLog;

use sluice_storage::Result;
use sluice_storage::{AppendInfo, LogConfig, LogStats, ReadBatch, RetentionOutcome, SegmentInfo};
use std::path::PathBuf;

/// A staged batch: where it will land, the term it was stamped with, and the handle to learn
/// when it is committed.
#[must_use = "a staged batch counts only once `PartitionLog::committed` resolves"]
pub struct Staged<T> {
    pub info: AppendInfo,
    pub term: u64,
    pub ticket: T,
}

/// One partition's log as the broker uses it. Single-threaded (one shard owns it): futures are
/// not `Send`.
#[allow(async_fn_in_trait)]
pub trait PartitionLog: Sized + 'static {
    /// What the log is opened over: a file system for [`LocalLog`].
    type Env: Clone + 'static;
    /// The handle a staged batch's commit arrives in.
    type Ticket;

    /// Opens (or creates) the log in `dir`; what it holds is what it has committed.
    async fn open(env: &Self::Env, dir: PathBuf, config: LogConfig) -> Result<Self>;

    /// The first offset still held.
    fn start_offset(&self) -> u64;
    /// One past the last committed offset: what readers see.
    fn end_offset(&self) -> u64;
    /// The term stamped on batches staged now (`SINGLE_NODE_TERM`, 0, on a single node).
    fn term(&self) -> u64;

    /// Waits until a batch of about `len_bytes` may be staged (back-pressure). Callers that keep
    /// their own state in the log's order wait here, then change their state and
    /// [`PartitionLog::stage`] with no await in between.
    async fn wait_for_space(&self, len_bytes: usize) -> Result<()>;
    /// Verifies an encoded batch, stamps its base offset and term, and stages it at the end of
    /// the log, synchronously: batches commit in the order they were staged.
    fn stage(&self, batch: Vec<u8>) -> Result<Staged<Self::Ticket>>;
    /// Resolves once the staged batch is committed (and every batch staged before it).
    async fn committed(&self, ticket: Self::Ticket) -> Result<AppendInfo>;

    /// Stage and wait for the commit: for users with no state of their own to order.
    async fn append(&self, batch: Vec<u8>) -> Result<AppendInfo> {
        self.wait_for_space(batch.len()).await?;
        let s = self.stage(batch)?;
        self.committed(s.ticket).await
    }

    /// Whole, verified, committed batches from `offset` on: at least one (if any), then up to
    /// about `max_bytes`.
    async fn read(&self, offset: u64, max_bytes: usize) -> Result<Vec<ReadBatch>>;
    /// The first offset whose batch has a timestamp at or after `ts_ms`.
    async fn offset_for_timestamp(&self, ts_ms: i64) -> Result<Option<u64>>;

    /// Removes every batch at `offset` and after, durably (a follower's conflicting suffix).
    async fn truncate_from(&self, offset: u64) -> Result<()>;
    /// Deletes the sealed segments wholly below `offset` (compaction: the owner needs nothing
    /// there).
    async fn delete_segments_below(&self, offset: u64) -> Result<RetentionOutcome>;
    /// Deletes whole sealed segments past the configured retention.
    async fn enforce_retention(
        &self,
        now_ms: i64,
        keep_from: Option<u64>,
    ) -> Result<RetentionOutcome>;

    /// The newest snapshot of the state machine over this log, kept with it (a replicated log
    /// will send it to a follower that falls behind the log's start); `None` if there is none.
    async fn read_snapshot(&self) -> Result<Option<Vec<u8>>>;
    /// Replaces the snapshot, atomically and durably. Its writer makes sure every record below
    /// the offset it resumes at is committed first.
    async fn write_snapshot(&self, bytes: Vec<u8>) -> Result<()>;
    /// Forgets the snapshot (one that does not fit the log any more).
    async fn remove_snapshot(&self) -> Result<()>;

    /// How much later than recorded the leases replayed from this log must end: 0 on one node
    /// (the clock that granted them is this one); on a replicated log, the cluster's maximum
    /// clock skew (a new leader inherits leases granted on another node's clock).
    fn inherited_lease_margin_ms(&self) -> u64 {
        0
    }

    fn config(&self) -> &LogConfig;
    fn segments(&self) -> Vec<SegmentInfo>;
    fn size_bytes(&self) -> u64;
    fn stats(&self) -> LogStats;
    /// Commits what is staged and closes the log.
    async fn close(&self) -> Result<()>;
}
