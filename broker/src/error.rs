//! Errors of the broker's service layer: the engine's, plus what only the broker knows (queues,
//! storage, shards). Mapped once to SQS codes here; the front ends only render them.

use crate::engine::EngineError;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("the specified queue does not exist")]
    NonExistentQueue,
    #[error("a queue with this name already exists with different attributes")]
    QueueNameExists,
    #[error("the queue was deleted recently; wait 60 seconds before creating it again")]
    QueueDeletedRecently,
    #[error("too many queues for this tenant (limit {0})")]
    TooManyQueues(usize),
    /// Storage failed; the request may or may not have taken effect (like a timeout).
    #[error("internal error: {0}")]
    Internal(String),
    /// The broker is starting, stopping or a limit of in-flight work is reached: retry.
    #[error("service unavailable: {0}")]
    Unavailable(&'static str),
    #[error("request throttled: {0}")]
    Throttled(&'static str),
    /// In a cluster: this node does not lead the partition (or lost the lead mid-request, when
    /// `outcome_unknown`: the change may still commit under the next leader). Retryable; the
    /// hint names the leader this node knows of.
    #[error(
        "the partition's leader is elsewhere or being elected (term {term}, leader {leader_hint:?}{}); retry",
        if *outcome_unknown { ", outcome unknown" } else { "" }
    )]
    NotLeader {
        leader_hint: Option<u64>,
        term: u64,
        outcome_unknown: bool,
    },
    /// The account's queue and topic logs hold its stored-bytes quota
    /// (`[quotas] stored_bytes_per_account`): nothing new is stored until consumers drain.
    #[error(
        "request throttled: this account's stored-bytes quota is used up ({stored_bytes} bytes \
         stored, quota {quota_bytes}); sends are refused until messages are deleted and their \
         space compacted, or queues deleted; retry with back-off"
    )]
    StoredBytesQuota { stored_bytes: u64, quota_bytes: u64 },
    /// Free space is below the reserve: nothing new is stored until there is room again.
    #[error(
        "the broker's disk is full ({free_bytes} bytes free, under the {reserve_bytes}-byte \
         reserve): sends are refused until space is freed; receives and deletes go on"
    )]
    DiskFull { free_bytes: u64, reserve_bytes: u64 },
    /// A queue URL that is not `http(s)://<host>/<account>/<name>`.
    #[error("The address {0} is not valid for this endpoint.")]
    InvalidAddress(String),
    /// A named resource other than a queue (a message move task, a queue named by ARN in a
    /// move task request) does not exist.
    #[error("{0}")]
    ResourceNotFound(String),
    /// A valid request the resource's state does not allow (a second move task on a queue,
    /// cancelling a finished task).
    #[error("{0}")]
    Unsupported(String),
}

/// The SQS error an error is reported as: its code (as `x-amzn-query-error` carries it, the
/// JSON `__type` suffix), HTTP status, and whether a client should retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorInfo {
    pub code: &'static str,
    pub http_status: u16,
    pub sender_fault: bool,
    pub retryable: bool,
}

impl ServiceError {
    pub fn info(&self) -> ErrorInfo {
        let (code, http_status, retryable) = match self {
            ServiceError::Engine(e) => {
                let c = e.sqs_code();
                (c.code, c.http_status, false)
            }
            ServiceError::NonExistentQueue => {
                ("AWS.SimpleQueueService.NonExistentQueue", 400, false)
            }
            ServiceError::QueueNameExists => ("QueueAlreadyExists", 400, false),
            ServiceError::QueueDeletedRecently => {
                ("AWS.SimpleQueueService.QueueDeletedRecently", 400, true)
            }
            ServiceError::TooManyQueues(_) => ("OverLimit", 403, false),
            ServiceError::Internal(_) => ("InternalFailure", 500, true),
            ServiceError::Unavailable(_) => ("ServiceUnavailable", 503, true),
            ServiceError::Throttled(_) => ("RequestThrottled", 403, true),
            // What AWS SDKs retry by themselves during an election.
            ServiceError::NotLeader { .. } => ("ServiceUnavailable", 503, true),
            // SQS has no storage quota; RequestThrottled is the error SendMessage(Batch) model
            // for a limit of the recipient, typed and retried with back-off by the SDKs.
            ServiceError::StoredBytesQuota { .. } => ("RequestThrottled", 403, true),
            ServiceError::DiskFull { .. } => ("ServiceUnavailable", 503, true),
            ServiceError::InvalidAddress(_) => ("InvalidAddress", 404, false),
            ServiceError::ResourceNotFound(_) => ("ResourceNotFoundException", 404, false),
            ServiceError::Unsupported(_) => {
                ("AWS.SimpleQueueService.UnsupportedOperation", 400, false)
            }
        };
        ErrorInfo {
            code,
            http_status,
            sender_fault: http_status < 500,
            retryable,
        }
    }
}

impl From<sluice_storage::StorageError> for ServiceError {
    fn from(e: sluice_storage::StorageError) -> Self {
        match e {
            // The reserve was not enough (another program filled the disk): the same
            // retryable error as the reserve's own refusal.
            sluice_storage::StorageError::NoSpace { .. } => ServiceError::DiskFull {
                free_bytes: 0,
                reserve_bytes: 0,
            },
            sluice_storage::StorageError::NotLeader { leader_hint, term } => {
                ServiceError::NotLeader {
                    leader_hint,
                    term,
                    outcome_unknown: false,
                }
            }
            sluice_storage::StorageError::LeadershipLost { leader_hint, term } => {
                ServiceError::NotLeader {
                    leader_hint,
                    term,
                    outcome_unknown: true,
                }
            }
            other => ServiceError::Internal(format!("storage: {other}")),
        }
    }
}

pub type ServiceResult<T> = Result<T, ServiceError>;
