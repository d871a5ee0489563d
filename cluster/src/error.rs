//! Typed errors of the replicated log.

use sluice_raft::{NodeId, ProposeError, StepError, Term};
use sluice_storage::batch::BatchError;
use sluice_storage::StorageError;
use std::path::PathBuf;

/// Why a proposal, a message or a `Ready` round failed.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    /// This replica does not lead (or no longer does): nothing was appended; retry at the hint.
    #[error("not the leader (term {term}, leader hint {leader_hint:?})")]
    NotLeader {
        leader_hint: Option<NodeId>,
        term: Term,
    },
    /// Leadership was lost after the proposal was appended here and before it committed: it
    /// may or may not commit under the next leader. The client retries (idempotently).
    #[error("leadership lost before the proposal committed (term {term}, hint {leader_hint:?}); outcome unknown")]
    LeadershipLost {
        leader_hint: Option<NodeId>,
        term: Term,
    },
    /// The leader has not committed an entry of its term yet (just elected), or pushes back.
    #[error(transparent)]
    Propose(ProposeError),
    #[error("invalid batch: {0}")]
    InvalidBatch(BatchError),
    /// Control batches are the log's own (Raft no-ops and membership changes).
    #[error("clients may not propose control batches")]
    ControlBatchRefused,
    /// A replicated entry that does not verify (checksum, structure): never stored.
    #[error("replicated entry does not verify: {0}")]
    BadEntry(BatchError),
    /// A replicated entry whose batch disagrees with the entry (count, kind), or a stored
    /// control batch that is not a Raft entry.
    #[error("entry at offset {offset} does not match its batch: {why}")]
    EntryMismatch { offset: u64, why: &'static str },
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error(transparent)]
    Step(#[from] StepError),
    /// The hard-state file is unreadable: it is never guessed (a replica that forgot its vote
    /// could vote twice in a term, one that forgot its disk id could pose as its old self).
    #[error("hard state {path:?}: {why}")]
    BadHardState { path: PathBuf, why: String },
    /// The log holds batches but its hard-state file is gone: the replica's identity and vote
    /// are lost, so it may not take part until re-added on a new disk.
    #[error("log in {0:?} holds data but has no hard-state file")]
    MissingHardState(PathBuf),
    /// A snapshot arrived: this driver keeps whole logs (no compaction yet) and installs none.
    #[error("snapshots are not supported yet")]
    SnapshotUnsupported,
    /// The replica was closed (or its task dropped) before the proposal's outcome was known.
    #[error("replica closed")]
    Closed,
}
