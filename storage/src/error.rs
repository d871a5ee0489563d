//! Typed errors of the storage engine.

use std::path::PathBuf;

/// Why a batch failed to decode or verify (the batch format lives in `sluice-wire`).
pub use sluice_wire::batch::BatchError;

/// Errors of the log and its segments.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("I/O error during {op} on {path:?}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The disk is full. Nothing acknowledged before is lost; the append that hit it failed.
    #[error("no space left on device during {op} on {path:?}")]
    NoSpace { op: &'static str, path: PathBuf },
    /// Stored bytes failed verification where they cannot be a torn tail: they are never served.
    #[error("corruption in {path:?} at byte {position}: {reason}")]
    Corruption {
        path: PathBuf,
        position: u64,
        reason: String,
    },
    #[error("offset {offset} out of range [{start}, {end})")]
    OffsetOutOfRange { offset: u64, start: u64, end: u64 },
    #[error(transparent)]
    InvalidBatch(#[from] BatchError),
    /// A previous write or fsync failed and could not be repaired; the log only serves reads
    /// until it is reopened (recovery decides what is on disk).
    #[error("log is read-only after an unrecoverable write failure; reopen to recover")]
    Poisoned,
    #[error("log is closed")]
    Closed,
    /// `Log::truncate_from` at an offset inside a batch: a log is cut between batches only.
    #[error("offset {offset} is not a batch boundary")]
    NotBatchBoundary { offset: u64 },
    /// A suffix of the log is being removed (`Log::truncate_from`); retry once it is done.
    #[error("log is truncating a suffix")]
    Truncating,
    /// `Log::stage_replicated` at an offset other than the log's end: the follower's log and
    /// the leader's disagree on where this batch goes (the caller truncates first, or re-syncs).
    #[error("replicated batch at offset {offset}, the log ends at {expected}")]
    ReplicaOffsetMismatch { offset: u64, expected: u64 },
    /// `Log::stage_replicated` with a term below the last batch's, or `Log::set_term` below the
    /// log's term: terms never go back along a log (a stale leader's message or call).
    #[error("term {term} below the log's term {last}")]
    TermRegressed { term: u64, last: u64 },
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A replicated log on a replica that does not lead (or not yet: it has not committed an
    /// entry of its term): nothing was staged. `leader_hint` is the leader it knows, if any.
    #[error("this replica is not the leader (term {term}, leader {leader_hint:?})")]
    NotLeader { leader_hint: Option<u64>, term: u64 },
    /// A replicated log lost its leadership before a staged batch committed: the batch may or
    /// may not commit under the next leader (the outcome is unknown, as after a timeout).
    #[error("leadership lost before the batch committed (term {term}, leader {leader_hint:?})")]
    LeadershipLost { leader_hint: Option<u64>, term: u64 },
    /// The log directory was written in a layout newer than this build reads
    /// ([`crate::format`]): nothing in it was read or changed.
    #[error(
        "log {path:?} has format version {found}; this build reads versions up to {supported}"
    )]
    UnsupportedFormat {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
}

impl StorageError {
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        let path = path.into();
        if source.raw_os_error() == Some(libc::ENOSPC) {
            StorageError::NoSpace { op, path }
        } else {
            StorageError::Io { op, path, source }
        }
    }

    /// A stable short name, used for metrics labels and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            StorageError::Io { .. } => "io",
            StorageError::NoSpace { .. } => "no_space",
            StorageError::Corruption { .. } => "corruption",
            StorageError::OffsetOutOfRange { .. } => "offset_out_of_range",
            StorageError::InvalidBatch(_) => "invalid_batch",
            StorageError::Poisoned => "poisoned",
            StorageError::Closed => "closed",
            StorageError::Truncating => "truncating",
            StorageError::NotBatchBoundary { .. } => "not_batch_boundary",
            StorageError::ReplicaOffsetMismatch { .. } => "replica_offset_mismatch",
            StorageError::TermRegressed { .. } => "term_regressed",
            StorageError::Config(_) => "config",
            StorageError::NotLeader { .. } => "not_leader",
            StorageError::LeadershipLost { .. } => "leadership_lost",
            StorageError::UnsupportedFormat { .. } => "unsupported_format",
        }
    }
}

pub type Result<T, E = StorageError> = std::result::Result<T, E>;

impl StorageError {
    /// A copy for every waiter of a failed group commit (io::Error is not Clone).
    pub fn duplicate(&self) -> StorageError {
        match self {
            StorageError::Io { op, path, source } => StorageError::Io {
                op,
                path: path.clone(),
                source: match source.raw_os_error() {
                    Some(code) => std::io::Error::from_raw_os_error(code),
                    None => std::io::Error::new(source.kind(), source.to_string()),
                },
            },
            StorageError::NoSpace { op, path } => StorageError::NoSpace {
                op,
                path: path.clone(),
            },
            StorageError::Corruption {
                path,
                position,
                reason,
            } => StorageError::Corruption {
                path: path.clone(),
                position: *position,
                reason: reason.clone(),
            },
            StorageError::OffsetOutOfRange { offset, start, end } => {
                StorageError::OffsetOutOfRange {
                    offset: *offset,
                    start: *start,
                    end: *end,
                }
            }
            StorageError::InvalidBatch(b) => StorageError::InvalidBatch(b.clone()),
            StorageError::Poisoned => StorageError::Poisoned,
            StorageError::Closed => StorageError::Closed,
            StorageError::Truncating => StorageError::Truncating,
            StorageError::NotBatchBoundary { offset } => {
                StorageError::NotBatchBoundary { offset: *offset }
            }
            StorageError::ReplicaOffsetMismatch { offset, expected } => {
                StorageError::ReplicaOffsetMismatch {
                    offset: *offset,
                    expected: *expected,
                }
            }
            StorageError::TermRegressed { term, last } => StorageError::TermRegressed {
                term: *term,
                last: *last,
            },
            StorageError::Config(s) => StorageError::Config(s.clone()),
            StorageError::NotLeader { leader_hint, term } => StorageError::NotLeader {
                leader_hint: *leader_hint,
                term: *term,
            },
            StorageError::LeadershipLost { leader_hint, term } => StorageError::LeadershipLost {
                leader_hint: *leader_hint,
                term: *term,
            },
            StorageError::UnsupportedFormat {
                path,
                found,
                supported,
            } => StorageError::UnsupportedFormat {
                path: path.clone(),
                found: *found,
                supported: *supported,
            },
        }
    }
}
