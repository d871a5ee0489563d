//! Typed errors. Bad input from the network or the log owner gets one of these, never a panic.

use crate::types::{GroupId, NodeId, Offset};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("truncated encoding")]
    Truncated,
    #[error("membership lists {0} replicas, above the limit")]
    TooManyMembers(usize),
    #[error("unknown replica role {0}")]
    BadRole(u8),
    #[error("node {0} listed twice")]
    DuplicateNode(NodeId),
}

/// Why a proposal was refused. The caller retries elsewhere (`NotLeader`) or later.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProposeError {
    #[error("not the leader (leader hint: {leader:?})")]
    NotLeader { leader: Option<NodeId> },
    #[error("leader has not yet committed an entry of its term")]
    TermNotConfirmed,
    #[error("a leadership transfer is in progress")]
    TransferInProgress,
    #[error("{pending_bytes} bytes already uncommitted, limit {limit_bytes}")]
    Backpressure {
        pending_bytes: usize,
        limit_bytes: usize,
    },
    #[error("a batch must cover at least one offset")]
    EmptyBatch,
    #[error("batch of {size_bytes} bytes is over max_entry_bytes {limit_bytes}")]
    BatchTooLarge {
        size_bytes: usize,
        limit_bytes: usize,
    },
}

/// Why a membership change or transfer was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ChangeError {
    #[error(transparent)]
    Propose(#[from] ProposeError),
    #[error("another membership change (at offset {0}) is not yet committed")]
    ChangePending(Offset),
    #[error("node {0} is not a member")]
    UnknownNode(NodeId),
    #[error("node {0} is already a member")]
    AlreadyMember(NodeId),
    #[error("learner {node} is {lag_offsets} offsets behind; promote once caught up")]
    LearnerBehind { node: NodeId, lag_offsets: u64 },
    #[error("node {0} is not a voter")]
    NotVoter(NodeId),
    #[error("the membership is full")]
    TooManyMembers,
    #[error("the change would leave no voter")]
    NoVoterLeft,
}

/// Errors of stepping a message or feeding a callback into the core.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StepError {
    #[error("unknown group {0}")]
    UnknownGroup(GroupId),
    #[error("message addressed to node {to}, this is node {me}")]
    WrongNode { to: NodeId, me: NodeId },
    #[error("malformed append: {0}")]
    MalformedAppend(&'static str),
    #[error("malformed entry: {0}")]
    BadEntry(#[from] DecodeError),
    #[error("group {0} already exists")]
    GroupExists(GroupId),
    #[error("restore state inconsistent: {0}")]
    BadRestore(&'static str),
}
