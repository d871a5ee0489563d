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
            ServiceError::InvalidAddress(_) => ("InvalidAddress", 404, false),
            ServiceError::ResourceNotFound(_) => ("ResourceNotFoundException", 400, false),
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
        ServiceError::Internal(format!("storage: {e}"))
    }
}

pub type ServiceResult<T> = Result<T, ServiceError>;
