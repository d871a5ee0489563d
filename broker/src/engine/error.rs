//! Engine errors. Each variant maps to exactly one SQS error code (`sqs_code`), so the HTTP and
//! QUIC front ends translate once, at their edge, and never invent codes of their own.

use thiserror::Error;

/// An SQS error code and the HTTP status the SQS API returns with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SqsCode {
    /// The code of the AWS JSON protocol's `__type` / the Query protocol's `Code`.
    pub code: &'static str,
    pub http_status: u16,
}

/// Everything a partition command can fail with.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EngineError {
    #[error("invalid attribute name: {0}")]
    InvalidAttributeName(String),
    #[error("invalid value for attribute {name}: {reason}")]
    InvalidAttributeValue { name: String, reason: String },
    #[error("invalid value for parameter {name}: {reason}")]
    InvalidParameterValue { name: String, reason: String },
    #[error("message contents are invalid: {0}")]
    InvalidMessageContents(String),
    #[error("the receipt handle is invalid: {0}")]
    ReceiptHandleIsInvalid(&'static str),
    #[error("the message is not in flight")]
    MessageNotInflight,
    #[error("over limit: {0}")]
    OverLimit(&'static str),
    #[error("a purge of this queue is already in progress (one per 60 s)")]
    PurgeQueueInProgress,
    #[error("the batch request contains no entries")]
    EmptyBatchRequest,
    #[error("the batch request contains more than 10 entries")]
    TooManyEntriesInBatchRequest,
    #[error("batch entry ids are not distinct: {0}")]
    BatchEntryIdsNotDistinct(String),
    #[error("invalid batch entry id: {0}")]
    InvalidBatchEntryId(String),
    #[error("the batch request is too long: {size_bytes} bytes")]
    BatchRequestTooLong { size_bytes: usize },
    #[error("unsupported operation: {0}")]
    UnsupportedOperation(&'static str),
}

impl EngineError {
    /// The SQS error this engine error is reported as (names from the SQS Smithy model; the
    /// codes are the legacy Query codes that `x-amzn-query-error` carries).
    pub fn sqs_code(&self) -> SqsCode {
        let (code, http_status) = match self {
            EngineError::InvalidAttributeName(_) => ("InvalidAttributeName", 400),
            EngineError::InvalidAttributeValue { .. } => ("InvalidAttributeValue", 400),
            EngineError::InvalidParameterValue { .. } => ("InvalidParameterValue", 400),
            EngineError::InvalidMessageContents(_) => ("InvalidMessageContents", 400),
            EngineError::ReceiptHandleIsInvalid(_) => ("ReceiptHandleIsInvalid", 404),
            EngineError::MessageNotInflight => ("AWS.SimpleQueueService.MessageNotInflight", 400),
            EngineError::OverLimit(_) => ("OverLimit", 403),
            EngineError::PurgeQueueInProgress => {
                ("AWS.SimpleQueueService.PurgeQueueInProgress", 403)
            }
            EngineError::EmptyBatchRequest => ("AWS.SimpleQueueService.EmptyBatchRequest", 400),
            EngineError::TooManyEntriesInBatchRequest => {
                ("AWS.SimpleQueueService.TooManyEntriesInBatchRequest", 400)
            }
            EngineError::BatchEntryIdsNotDistinct(_) => {
                ("AWS.SimpleQueueService.BatchEntryIdsNotDistinct", 400)
            }
            EngineError::InvalidBatchEntryId(_) => {
                ("AWS.SimpleQueueService.InvalidBatchEntryId", 400)
            }
            EngineError::BatchRequestTooLong { .. } => {
                ("AWS.SimpleQueueService.BatchRequestTooLong", 400)
            }
            EngineError::UnsupportedOperation(_) => {
                ("AWS.SimpleQueueService.UnsupportedOperation", 400)
            }
        };
        SqsCode { code, http_status }
    }

    pub(crate) fn param(name: &str, reason: impl Into<String>) -> Self {
        EngineError::InvalidParameterValue {
            name: name.to_string(),
            reason: reason.into(),
        }
    }

    pub(crate) fn attr(name: &str, reason: impl Into<String>) -> Self {
        EngineError::InvalidAttributeValue {
            name: name.to_string(),
            reason: reason.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_match_the_sqs_model() {
        assert_eq!(
            EngineError::ReceiptHandleIsInvalid("x").sqs_code(),
            SqsCode {
                code: "ReceiptHandleIsInvalid",
                http_status: 404
            }
        );
        assert_eq!(EngineError::OverLimit("x").sqs_code().code, "OverLimit");
        assert_eq!(
            EngineError::MessageNotInflight.sqs_code().code,
            "AWS.SimpleQueueService.MessageNotInflight"
        );
    }
}
