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
    #[error("unknown codec version {0}")]
    UnknownVersion(u8),
    #[error("unknown envelope kind {0}")]
    UnknownKind(u8),
    #[error("unknown message body {0}")]
    UnknownBody(u8),
    #[error("unknown entry kind {0}")]
    UnknownEntryKind(u8),
    #[error("flag byte {0:#04x} has reserved bits set")]
    BadFlags(u8),
    #[error("{0} bytes after the end of the message")]
    TrailingBytes(usize),
    #[error("append of {count} entries, limit {limit}")]
    TooManyEntries { count: u64, limit: usize },
    #[error("heartbeat of {count} groups, limit {limit}")]
    TooManyHeartbeatGroups { count: u64, limit: usize },
    #[error("entry of {size_bytes} bytes, limit {limit_bytes}")]
    EntryTooLarge { size_bytes: u64, limit_bytes: usize },
    #[error("append of several entries totalling {size_bytes} bytes, limit {limit_bytes}")]
    AppendTooLarge { size_bytes: u64, limit_bytes: usize },
    #[error("snapshot of {size_bytes} bytes, limit {limit_bytes}")]
    SnapshotTooLarge { size_bytes: u64, limit_bytes: usize },
    #[error("entry at offset {offset} covering {count} offsets overflows the offset space")]
    OffsetOverflow { offset: u64, count: u32 },
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
