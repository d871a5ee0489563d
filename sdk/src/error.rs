//! The SDK's one error type.

use std::time::Duration;

use sluice_wire::{ErrorCode, VersionRange};

/// Everything a call can fail with.
///
/// Errors the broker answered carry its [`ErrorCode`] (stable numbers, each with its SQS code:
/// [`Error::sqs_code`]). Match on [`Error::code`] for those:
///
/// ```
/// # use sluice_sdk::{Error, ErrorCode};
/// fn is_missing_queue(e: &Error) -> bool {
///     e.code() == Some(ErrorCode::QueueDoesNotExist)
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The broker refused the request (a queue that does not exist, an invalid receipt handle,
    /// a parameter out of range, …).
    #[error("{} ({:?}): {message}", code.as_sqs_code(), code)]
    Service { code: ErrorCode, message: String },
    /// In a cluster: the node does not lead the partition the request is for. The client
    /// follows `leader_addr` by itself (bounded hops, `crate::leader`); this reaches the caller
    /// when the hops ran out, no leader was known after backing off (retryable), or
    /// `outcome_unknown` on a send that cannot be resent safely (the node lost the lead while
    /// it ran: the message may or may not be stored, as after a timeout).
    #[error("{message} (term {term}, leader {}{})", leader_addr.as_deref().unwrap_or("unknown"), if *outcome_unknown { ", outcome unknown" } else { "" })]
    NotLeader {
        message: String,
        /// The leader's client address, `host:port`, if the node knew one.
        leader_addr: Option<String>,
        term: u64,
        outcome_unknown: bool,
    },
    /// The broker speaks no protocol version this SDK speaks.
    #[error("the broker speaks protocol versions {}..={}, this SDK {}..={}: {message}", server.min, server.max, sluice_wire::PROTOCOL_VERSION_MIN, sluice_wire::PROTOCOL_VERSION)]
    UnsupportedVersion {
        server: VersionRange,
        message: String,
    },
    /// The connection could not be set up (address, TLS, handshake).
    #[error("connect: {0}")]
    Connect(String),
    /// The connection or stream went away while the request was in flight; the request may or
    /// may not have taken effect.
    #[error("connection lost: {0}")]
    ConnectionLost(String),
    /// No answer within the request timeout; the request may or may not have taken effect.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The request cannot be sent (too large to encode).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// TLS settings could not be used (unreadable or invalid PEM files).
    #[error("TLS configuration: {0}")]
    Tls(String),
    /// The broker answered something this SDK did not expect (a bug on one side).
    #[error("protocol error: {0}")]
    Protocol(String),
}

impl Error {
    /// The broker's error code, for errors the broker answered.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Error::Service { code, .. } => Some(*code),
            Error::UnsupportedVersion { .. } => Some(ErrorCode::UnsupportedVersion),
            Error::NotLeader { .. } => Some(ErrorCode::NotLeader),
            _ => None,
        }
    }

    /// Whether a group member's request was refused because the group rebalanced since its
    /// last heartbeat (a stale generation, a partition it no longer owns, or a membership the
    /// group dropped): the member learns its new assignment by heartbeating.
    pub fn is_rebalance(&self) -> bool {
        matches!(
            self.code(),
            Some(ErrorCode::StaleGeneration)
                | Some(ErrorCode::PartitionNotAssigned)
                | Some(ErrorCode::UnknownMember)
        )
    }

    /// The SQS error code (`AWS.SimpleQueueService.NonExistentQueue`, …), for errors the broker
    /// answered.
    pub fn sqs_code(&self) -> Option<&'static str> {
        self.code().map(ErrorCode::as_sqs_code)
    }

    /// Whether the same request may succeed if sent again after a backoff: throttling, server
    /// faults, lost connections and timeouts. (A send retried after a lost connection or a
    /// timeout may be stored twice; FIFO queues deduplicate it by its deduplication id.)
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Service { code, .. } => code.is_retryable(),
            Error::ConnectionLost(_) | Error::Timeout(_) | Error::Connect(_) => true,
            // With an unknown outcome a resent send may be stored twice: the caller decides.
            Error::NotLeader {
                outcome_unknown, ..
            } => !outcome_unknown,
            _ => false,
        }
    }

    pub(crate) fn from_not_leader(n: sluice_wire::NotLeaderResponse) -> Self {
        Error::NotLeader {
            message: n.message,
            leader_addr: n.leader_addr,
            term: n.term,
            outcome_unknown: n.outcome_unknown,
        }
    }

    pub(crate) fn from_response(e: sluice_wire::ErrorResponse) -> Self {
        let code = e.error_code();
        match (code, e.supported_versions) {
            (ErrorCode::UnsupportedVersion, Some(server)) => Error::UnsupportedVersion {
                server,
                message: e.message,
            },
            _ => Error::Service {
                code,
                message: e.message,
            },
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;
