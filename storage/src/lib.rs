//! Sluice storage engine: per-partition append-only logs of record batches.
//!
//! A log is a directory of segments named by base offset (`00000000000000000000.log`, `.index`,
//! `.timeindex`). Appends are group-committed (one write and one fdatasync for many batches) into
//! pre-zeroed segment space through O_DIRECT files; reads by offset go through a sparse index,
//! reads by time through a time index; recovery verifies the active segment and truncates a torn
//! tail; retention deletes whole sealed segments. All disk access goes through the [`fs`] seam.

/// The record-batch format lives in `sluice-wire` (clients encode batches without the storage
/// engine); re-exported here so that `sluice_storage::batch` keeps naming it.
pub use sluice_wire::batch;
pub mod config;
pub mod error;
pub mod format;
pub mod fs;
pub mod index;
pub mod log;
pub mod rt;

pub use batch::{BatchBuilder, BatchHeader, BatchView, Record, RecordView};
pub use config::LogConfig;
pub use error::{BatchError, Result, StorageError};
pub use format::SEGMENT_FORMAT_VERSION;
pub use log::{
    AppendInfo, AppendTicket, FsyncHistogram, Log, LogStats, ReadBatch, RetentionOutcome,
    SegmentInfo, FSYNC_BUCKETS_US, SINGLE_NODE_TERM,
};
