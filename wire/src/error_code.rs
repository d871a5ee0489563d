//! Error codes: one stable number per error a Sluice server can answer with, and its SQS face.
//!
//! Numbers never change meaning once released; new codes take new numbers. A receiver that meets
//! a number it does not know reads it as [`ErrorCode::Unknown`] (the raw number stays in the
//! `Error` frame, so nothing is lost).
//!
//! Ranges: 1-19 the queue engine's errors (1:1 with `broker::engine::EngineError`), 20-29 queue
//! metadata, 30-39 security and throttling, 40-49 KMS, 50-59 server faults, 60-69 streams, 100-119 the native
//! protocol itself (never produced by the SQS HTTP API).
//!
//! Two SQS names exist for most errors (see `reference/sqs-api-model.json`): the Smithy shape
//! name (`QueueDoesNotExist`, the AWS JSON protocol's `__type` is `com.amazonaws.sqs#` + it) and
//! the legacy Query code (`AWS.SimpleQueueService.NonExistentQueue`, in the Query protocol's
//! `<Code>` and in the JSON protocol's `x-amzn-query-error` header, which SDKs map to their error
//! types). [`ErrorCode::as_sqs_code`] gives the legacy code, [`ErrorCode::sqs_shape_name`] the
//! shape name; errors the model does not declare (`InvalidParameterValue`, `MissingParameter`,
//! `AccessDenied`, `InternalFailure`, `ServiceUnavailable`) are AWS common errors whose two names
//! coincide.

/// A stable error number. See the module documentation for ranges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u16)]
pub enum ErrorCode {
    /// A number this build does not know (a newer peer), or 0, which is never assigned.
    Unknown = 0,

    // The engine's errors, in `EngineError` order.
    InvalidAttributeName = 1,
    InvalidAttributeValue = 2,
    InvalidParameterValue = 3,
    InvalidMessageContents = 4,
    ReceiptHandleIsInvalid = 5,
    MessageNotInflight = 6,
    OverLimit = 7,
    PurgeQueueInProgress = 8,
    EmptyBatchRequest = 9,
    TooManyEntriesInBatchRequest = 10,
    BatchEntryIdsNotDistinct = 11,
    InvalidBatchEntryId = 12,
    BatchRequestTooLong = 13,
    UnsupportedOperation = 14,

    // Queue metadata.
    QueueDoesNotExist = 20,
    QueueNameExists = 21,
    QueueDeletedRecently = 22,
    ResourceNotFoundException = 23,
    InvalidAddress = 24,
    /// Deprecated by SQS (folded into ReceiptHandleIsInvalid); kept so its number is never reused.
    InvalidIdFormat = 25,
    MissingParameter = 26,

    // Security and throttling.
    InvalidSecurity = 30,
    RequestThrottled = 31,
    AccessDenied = 32,

    // KMS (server-side encryption with customer keys).
    KmsAccessDenied = 40,
    KmsDisabled = 41,
    KmsInvalidKeyUsage = 42,
    KmsInvalidState = 43,
    KmsNotFound = 44,
    KmsOptInRequired = 45,
    KmsThrottled = 46,

    // Server faults.
    InternalFailure = 50,
    ServiceUnavailable = 51,
    /// In a cluster: the node does not lead the partition the request is for (or lost the lead
    /// while it ran). Protocol v2 answers it with a `NotLeader` frame that names the leader's
    /// client address when the node knows it; a v1 connection gets `ServiceUnavailable`.
    NotLeader = 52,

    // Streams (no SQS counterpart; their SQS-shaped names are their own).
    /// The topic does not exist.
    UnknownTopic = 60,
    /// A topic with this name exists with another configuration.
    TopicExists = 61,
    /// The offset is not in the partition (below its start or past its end).
    OffsetOutOfRange = 62,
    /// A record batch failed verification.
    InvalidBatch = 63,
    /// Not a member of the group (expired or left): join again.
    UnknownMember = 64,
    /// The group rebalanced since this generation.
    StaleGeneration = 65,
    /// The partition is not assigned to this member.
    PartitionNotAssigned = 66,

    // The native protocol. Their SQS faces are the nearest AWS codes, for the rare case one is
    // reported through an SQS-shaped surface (a CLI printing codes, per-entry batch results).
    /// The client's `Hello` range shares no version with the server's.
    UnsupportedVersion = 100,
    /// A frame kind the receiver does not know (or a response kind sent as a request).
    UnknownFrameKind = 101,
    /// A body that is not a valid archive of the type its kind names.
    MalformedFrame = 102,
    /// A frame over the receiver's limit.
    FrameTooLarge = 103,
    /// A CHECKSUM trailer that does not match.
    ChecksumMismatch = 104,
    /// Out of order: a request before `Hello`, a second `Hello`, a reused request id, bad magic.
    ProtocolViolation = 105,
    /// More requests in flight on the connection than `HelloOk` allowed.
    TooManyInFlightRequests = 106,
}

impl ErrorCode {
    /// Every assigned code (not `Unknown`), in numeric order.
    pub const ALL: [ErrorCode; 48] = [
        ErrorCode::InvalidAttributeName,
        ErrorCode::InvalidAttributeValue,
        ErrorCode::InvalidParameterValue,
        ErrorCode::InvalidMessageContents,
        ErrorCode::ReceiptHandleIsInvalid,
        ErrorCode::MessageNotInflight,
        ErrorCode::OverLimit,
        ErrorCode::PurgeQueueInProgress,
        ErrorCode::EmptyBatchRequest,
        ErrorCode::TooManyEntriesInBatchRequest,
        ErrorCode::BatchEntryIdsNotDistinct,
        ErrorCode::InvalidBatchEntryId,
        ErrorCode::BatchRequestTooLong,
        ErrorCode::UnsupportedOperation,
        ErrorCode::QueueDoesNotExist,
        ErrorCode::QueueNameExists,
        ErrorCode::QueueDeletedRecently,
        ErrorCode::ResourceNotFoundException,
        ErrorCode::InvalidAddress,
        ErrorCode::InvalidIdFormat,
        ErrorCode::MissingParameter,
        ErrorCode::InvalidSecurity,
        ErrorCode::RequestThrottled,
        ErrorCode::AccessDenied,
        ErrorCode::KmsAccessDenied,
        ErrorCode::KmsDisabled,
        ErrorCode::KmsInvalidKeyUsage,
        ErrorCode::KmsInvalidState,
        ErrorCode::KmsNotFound,
        ErrorCode::KmsOptInRequired,
        ErrorCode::KmsThrottled,
        ErrorCode::InternalFailure,
        ErrorCode::ServiceUnavailable,
        ErrorCode::NotLeader,
        ErrorCode::UnknownTopic,
        ErrorCode::TopicExists,
        ErrorCode::OffsetOutOfRange,
        ErrorCode::InvalidBatch,
        ErrorCode::UnknownMember,
        ErrorCode::StaleGeneration,
        ErrorCode::PartitionNotAssigned,
        ErrorCode::UnsupportedVersion,
        ErrorCode::UnknownFrameKind,
        ErrorCode::MalformedFrame,
        ErrorCode::FrameTooLarge,
        ErrorCode::ChecksumMismatch,
        ErrorCode::ProtocolViolation,
        ErrorCode::TooManyInFlightRequests,
    ];

    /// Never fails: numbers this build does not know become `Unknown`.
    pub fn from_u16(raw: u16) -> ErrorCode {
        ErrorCode::ALL
            .into_iter()
            .find(|c| *c as u16 == raw)
            .unwrap_or(ErrorCode::Unknown)
    }

    pub fn as_u16(self) -> u16 {
        self as u16
    }

    /// The legacy SQS error code (Query protocol `<Code>`, JSON protocol `x-amzn-query-error`),
    /// exactly as the SQS model's `awsQueryError` trait spells it.
    pub fn as_sqs_code(self) -> &'static str {
        self.sqs().0
    }

    /// The Smithy shape name in the SQS model (JSON `__type` is `com.amazonaws.sqs#` + this).
    pub fn sqs_shape_name(self) -> &'static str {
        self.sqs().1
    }

    /// The HTTP status SQS answers this error with.
    pub fn http_status(self) -> u16 {
        self.sqs().2
    }

    /// Whether the fault is the caller's (`Sender`) rather than the service's (`Receiver`), as the
    /// `x-amzn-query-error: Code;Sender` header and batch entries' `SenderFault` say.
    pub fn is_sender_fault(self) -> bool {
        self.http_status() < 500
    }

    /// Whether resending the same request, after a backoff, may succeed. Errors that need a
    /// different request or a long wait (PurgeQueueInProgress: 60 s; QueueDeletedRecently: 60 s)
    /// are not retryable in this sense, as the AWS SDKs treat them.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::RequestThrottled
                | ErrorCode::KmsThrottled
                | ErrorCode::InternalFailure
                | ErrorCode::ServiceUnavailable
                | ErrorCode::NotLeader
                | ErrorCode::ChecksumMismatch
                | ErrorCode::TooManyInFlightRequests
        )
    }

    /// Reads an SQS error code in either spelling (legacy code or shape name), as the broker maps
    /// `EngineError::sqs_code()` and as the SDK maps batch entries' `Code`. Native-protocol codes
    /// have no SQS spelling of their own and are not found this way.
    pub fn from_sqs_code(code: &str) -> Option<ErrorCode> {
        ErrorCode::ALL
            .into_iter()
            .filter(|c| c.as_u16() < 100)
            .find(|c| c.as_sqs_code() == code || c.sqs_shape_name() == code)
    }

    /// (legacy code, shape name, HTTP status). From `sqs-api-model.json`: shapes with an
    /// `awsQueryError` trait use its code and status; shapes without one (InvalidAttributeName,
    /// InvalidAttributeValue, InvalidMessageContents, InvalidIdFormat) use the shape name and
    /// 400, the default for client errors.
    fn sqs(self) -> (&'static str, &'static str, u16) {
        use ErrorCode::*;
        match self {
            Unknown => ("InternalFailure", "InternalFailure", 500),
            InvalidAttributeName => ("InvalidAttributeName", "InvalidAttributeName", 400),
            InvalidAttributeValue => ("InvalidAttributeValue", "InvalidAttributeValue", 400),
            InvalidParameterValue => ("InvalidParameterValue", "InvalidParameterValue", 400),
            InvalidMessageContents => ("InvalidMessageContents", "InvalidMessageContents", 400),
            ReceiptHandleIsInvalid => ("ReceiptHandleIsInvalid", "ReceiptHandleIsInvalid", 404),
            MessageNotInflight => (
                "AWS.SimpleQueueService.MessageNotInflight",
                "MessageNotInflight",
                400,
            ),
            OverLimit => ("OverLimit", "OverLimit", 403),
            PurgeQueueInProgress => (
                "AWS.SimpleQueueService.PurgeQueueInProgress",
                "PurgeQueueInProgress",
                403,
            ),
            EmptyBatchRequest => (
                "AWS.SimpleQueueService.EmptyBatchRequest",
                "EmptyBatchRequest",
                400,
            ),
            TooManyEntriesInBatchRequest => (
                "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
                "TooManyEntriesInBatchRequest",
                400,
            ),
            BatchEntryIdsNotDistinct => (
                "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
                "BatchEntryIdsNotDistinct",
                400,
            ),
            InvalidBatchEntryId => (
                "AWS.SimpleQueueService.InvalidBatchEntryId",
                "InvalidBatchEntryId",
                400,
            ),
            BatchRequestTooLong => (
                "AWS.SimpleQueueService.BatchRequestTooLong",
                "BatchRequestTooLong",
                400,
            ),
            UnsupportedOperation => (
                "AWS.SimpleQueueService.UnsupportedOperation",
                "UnsupportedOperation",
                400,
            ),
            QueueDoesNotExist => (
                "AWS.SimpleQueueService.NonExistentQueue",
                "QueueDoesNotExist",
                400,
            ),
            QueueNameExists => ("QueueAlreadyExists", "QueueNameExists", 400),
            QueueDeletedRecently => (
                "AWS.SimpleQueueService.QueueDeletedRecently",
                "QueueDeletedRecently",
                400,
            ),
            ResourceNotFoundException => (
                "ResourceNotFoundException",
                "ResourceNotFoundException",
                404,
            ),
            InvalidAddress => ("InvalidAddress", "InvalidAddress", 404),
            InvalidIdFormat => ("InvalidIdFormat", "InvalidIdFormat", 400),
            MissingParameter => ("MissingParameter", "MissingParameter", 400),
            InvalidSecurity => ("InvalidSecurity", "InvalidSecurity", 403),
            RequestThrottled => ("RequestThrottled", "RequestThrottled", 403),
            AccessDenied => ("AccessDenied", "AccessDenied", 403),
            KmsAccessDenied => ("KMS.AccessDeniedException", "KmsAccessDenied", 400),
            KmsDisabled => ("KMS.DisabledException", "KmsDisabled", 400),
            KmsInvalidKeyUsage => ("KMS.InvalidKeyUsageException", "KmsInvalidKeyUsage", 400),
            KmsInvalidState => ("KMS.InvalidStateException", "KmsInvalidState", 400),
            KmsNotFound => ("KMS.NotFoundException", "KmsNotFound", 400),
            KmsOptInRequired => ("KMS.OptInRequired", "KmsOptInRequired", 403),
            KmsThrottled => ("KMS.ThrottlingException", "KmsThrottled", 400),
            InternalFailure => ("InternalFailure", "InternalFailure", 500),
            ServiceUnavailable => ("ServiceUnavailable", "ServiceUnavailable", 503),
            // What the HTTP front end answers during an election, and AWS SDKs retry.
            NotLeader => ("ServiceUnavailable", "ServiceUnavailable", 503),
            UnknownTopic => ("UnknownTopic", "UnknownTopic", 404),
            TopicExists => ("TopicExists", "TopicExists", 400),
            OffsetOutOfRange => ("OffsetOutOfRange", "OffsetOutOfRange", 400),
            InvalidBatch => ("InvalidBatch", "InvalidBatch", 400),
            UnknownMember => ("UnknownMember", "UnknownMember", 400),
            StaleGeneration => ("StaleGeneration", "StaleGeneration", 400),
            PartitionNotAssigned => ("PartitionNotAssigned", "PartitionNotAssigned", 400),
            // Native protocol: nearest AWS faces.
            UnsupportedVersion => (
                "AWS.SimpleQueueService.UnsupportedOperation",
                "UnsupportedOperation",
                400,
            ),
            UnknownFrameKind => ("InvalidAction", "InvalidAction", 400),
            MalformedFrame => ("InvalidParameterValue", "InvalidParameterValue", 400),
            // SQS reports an over-long message as InvalidParameterValue.
            FrameTooLarge => ("InvalidParameterValue", "InvalidParameterValue", 400),
            ChecksumMismatch => ("InvalidParameterValue", "InvalidParameterValue", 400),
            ProtocolViolation => ("InvalidAction", "InvalidAction", 400),
            TooManyInFlightRequests => ("RequestThrottled", "RequestThrottled", 403),
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} ({})", self, self.as_u16())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_stable_and_round_trip() {
        // Released numbers: changing one breaks every deployed peer.
        assert_eq!(ErrorCode::InvalidAttributeName as u16, 1);
        assert_eq!(ErrorCode::UnsupportedOperation as u16, 14);
        assert_eq!(ErrorCode::QueueDoesNotExist as u16, 20);
        assert_eq!(ErrorCode::InternalFailure as u16, 50);
        assert_eq!(ErrorCode::UnsupportedVersion as u16, 100);
        assert_eq!(ErrorCode::TooManyInFlightRequests as u16, 106);
        let mut seen = std::collections::BTreeSet::new();
        for c in ErrorCode::ALL {
            assert!(seen.insert(c as u16), "{c:?} assigned twice");
            assert_eq!(ErrorCode::from_u16(c as u16), c);
        }
        assert_eq!(ErrorCode::UnknownTopic as u16, 60);
        assert_eq!(ErrorCode::NotLeader as u16, 52);
        assert_eq!(seen.len(), 48);
    }

    #[test]
    fn unknown_numbers_never_fail() {
        for raw in [0u16, 15, 19, 27, 99, 107, 999, 0x7FFF, u16::MAX] {
            assert_eq!(ErrorCode::from_u16(raw), ErrorCode::Unknown);
        }
        assert!(!ErrorCode::Unknown.is_retryable());
        assert_eq!(ErrorCode::Unknown.http_status(), 500);
    }

    #[test]
    fn codes_match_the_sqs_model() {
        assert_eq!(
            ErrorCode::QueueDoesNotExist.as_sqs_code(),
            "AWS.SimpleQueueService.NonExistentQueue"
        );
        assert_eq!(
            ErrorCode::QueueDoesNotExist.sqs_shape_name(),
            "QueueDoesNotExist"
        );
        assert_eq!(
            ErrorCode::QueueNameExists.as_sqs_code(),
            "QueueAlreadyExists"
        );
        assert_eq!(ErrorCode::ReceiptHandleIsInvalid.http_status(), 404);
        assert_eq!(
            ErrorCode::KmsThrottled.as_sqs_code(),
            "KMS.ThrottlingException"
        );
        assert!(ErrorCode::RequestThrottled.is_retryable());
        assert!(!ErrorCode::QueueDoesNotExist.is_retryable());
        assert!(ErrorCode::ServiceUnavailable.http_status() >= 500);
        assert!(!ErrorCode::InternalFailure.is_sender_fault());
        assert!(ErrorCode::OverLimit.is_sender_fault());
    }

    /// Every code the engine can produce (`broker/src/engine/error.rs`, `EngineError::sqs_code`),
    /// copied here because `wire` must not depend on `broker`: each maps to one `ErrorCode` with
    /// the same HTTP status, and distinct engine codes map to distinct numbers. The broker keeps
    /// the mirror test over its own enum.
    #[test]
    fn engine_codes_map_one_to_one() {
        let engine = [
            ("InvalidAttributeName", 400),
            ("InvalidAttributeValue", 400),
            ("InvalidParameterValue", 400),
            ("InvalidMessageContents", 400),
            ("ReceiptHandleIsInvalid", 404),
            ("AWS.SimpleQueueService.MessageNotInflight", 400),
            ("OverLimit", 403),
            ("AWS.SimpleQueueService.PurgeQueueInProgress", 403),
            ("AWS.SimpleQueueService.EmptyBatchRequest", 400),
            ("AWS.SimpleQueueService.TooManyEntriesInBatchRequest", 400),
            ("AWS.SimpleQueueService.BatchEntryIdsNotDistinct", 400),
            ("AWS.SimpleQueueService.InvalidBatchEntryId", 400),
            ("AWS.SimpleQueueService.BatchRequestTooLong", 400),
            ("AWS.SimpleQueueService.UnsupportedOperation", 400),
        ];
        let mut seen = std::collections::BTreeSet::new();
        for (i, (code, status)) in engine.into_iter().enumerate() {
            let c = ErrorCode::from_sqs_code(code).expect("engine code has a wire code");
            assert_eq!(c.as_sqs_code(), code);
            assert_eq!(c.http_status(), status, "{code}");
            // Engine errors take numbers 1..=14 in EngineError order.
            assert_eq!(c.as_u16() as usize, i + 1);
            assert!(seen.insert(c));
        }
    }

    #[test]
    fn every_model_error_shape_has_a_code() {
        // Error shapes of sqs-api-model.json (the `smithy.api#error` structures).
        let shapes = [
            "BatchEntryIdsNotDistinct",
            "BatchRequestTooLong",
            "EmptyBatchRequest",
            "InvalidAddress",
            "InvalidAttributeName",
            "InvalidAttributeValue",
            "InvalidBatchEntryId",
            "InvalidIdFormat",
            "InvalidMessageContents",
            "InvalidSecurity",
            "KmsAccessDenied",
            "KmsDisabled",
            "KmsInvalidKeyUsage",
            "KmsInvalidState",
            "KmsNotFound",
            "KmsOptInRequired",
            "KmsThrottled",
            "MessageNotInflight",
            "OverLimit",
            "PurgeQueueInProgress",
            "QueueDeletedRecently",
            "QueueDoesNotExist",
            "QueueNameExists",
            "ReceiptHandleIsInvalid",
            "RequestThrottled",
            "ResourceNotFoundException",
            "TooManyEntriesInBatchRequest",
            "UnsupportedOperation",
        ];
        for shape in shapes {
            let c = ErrorCode::from_sqs_code(shape).expect("model shape has a code");
            assert_eq!(c.sqs_shape_name(), shape);
            assert_eq!(ErrorCode::from_sqs_code(c.as_sqs_code()), Some(c));
        }
    }
}
