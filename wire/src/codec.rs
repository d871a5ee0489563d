//! Requests and responses as Rust enums, and their encoding into frames and back.
//!
//! Each frame body is the rkyv archive of the one struct its kind names (not of the enum), so
//! the kind in the header alone says how to read the body, and a receiver can look at an
//! archived body in place (`access_body`) without deserialising it.

use rkyv::api::high::{HighDeserializer, HighSerializer, HighValidator};
use rkyv::bytecheck::CheckBytes;
use rkyv::rancor;
use rkyv::ser::allocator::ArenaHandle;
use rkyv::util::AlignedVec;
use rkyv::{Archive, Deserialize, Serialize};
use thiserror::Error;

use crate::error_code::ErrorCode;
use crate::frame::{encode_frame, Checksum, Frame, FrameKind};
use crate::messages::*;

/// Why a message could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EncodeError {
    #[error("frame of {frame_bytes} bytes exceeds the limit of {limit_bytes} bytes")]
    FrameTooLarge {
        frame_bytes: usize,
        limit_bytes: usize,
    },
    #[error("rkyv serialisation failed: {0}")]
    Archive(String),
}

impl EncodeError {
    pub fn error_code(&self) -> ErrorCode {
        match self {
            // What SQS answers for an over-long message.
            EncodeError::FrameTooLarge { .. } => ErrorCode::InvalidParameterValue,
            EncodeError::Archive(_) => ErrorCode::InternalFailure,
        }
    }
}

/// Why a whole frame is not the message it claims to be. The frame boundaries are intact: answer
/// with an `Error` frame for the same request id and carry on.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MessageError {
    #[error("unknown frame kind 0x{kind:04x}")]
    UnknownKind { kind: u16 },
    #[error("{kind:?} is a response, expected a request")]
    NotARequest { kind: FrameKind },
    #[error("{kind:?} is a request, expected a response")]
    NotAResponse { kind: FrameKind },
    #[error("malformed {kind:?} body: {reason}")]
    Malformed { kind: FrameKind, reason: String },
}

impl MessageError {
    pub fn error_code(&self) -> ErrorCode {
        match self {
            MessageError::UnknownKind { .. } | MessageError::NotARequest { .. } => {
                ErrorCode::UnknownFrameKind
            }
            MessageError::NotAResponse { .. } => ErrorCode::ProtocolViolation,
            MessageError::Malformed { .. } => ErrorCode::MalformedFrame,
        }
    }

    pub fn to_error_response(&self) -> ErrorResponse {
        ErrorResponse::new(self.error_code(), self.to_string())
    }
}

/// A type that can be a frame body: archivable, validatable, deserialisable.
pub trait WireMessage:
    Sized + Archive + for<'a> Serialize<HighSerializer<AlignedVec, ArenaHandle<'a>, rancor::Error>>
where
    Self::Archived: for<'a> CheckBytes<HighValidator<'a, rancor::Error>>
        + Deserialize<Self, HighDeserializer<rancor::Error>>,
{
    /// The frame kind whose body this type is.
    const KIND: FrameKind;
}

/// Encodes `value` as an rkyv archive (the body of a frame of kind `T::KIND`).
pub fn encode_body<T>(value: &T) -> Result<AlignedVec, EncodeError>
where
    T: WireMessage,
    T::Archived: for<'a> CheckBytes<HighValidator<'a, rancor::Error>>
        + Deserialize<T, HighDeserializer<rancor::Error>>,
{
    rkyv::to_bytes::<rancor::Error>(value).map_err(|e| EncodeError::Archive(e.to_string()))
}

/// Validates a frame's body as the archive of `T` and returns it in place (zero-copy). The kind
/// must be `T::KIND`.
pub fn access_body<T>(frame: &Frame) -> Result<&T::Archived, MessageError>
where
    T: WireMessage,
    T::Archived: for<'a> CheckBytes<HighValidator<'a, rancor::Error>>
        + Deserialize<T, HighDeserializer<rancor::Error>>,
{
    let Some(kind) = frame.kind() else {
        return Err(MessageError::UnknownKind {
            kind: frame.header.kind,
        });
    };
    if kind != T::KIND {
        return Err(MessageError::Malformed {
            kind,
            reason: format!("expected a {:?} frame", T::KIND),
        });
    }
    // bytecheck validation: every pointer, length, UTF-8 string and enum tag is checked before
    // the archive is read. The body is 16-byte aligned (AlignedVec), as rkyv requires.
    rkyv::access::<T::Archived, rancor::Error>(&frame.body).map_err(|e| MessageError::Malformed {
        kind,
        reason: e.to_string(),
    })
}

/// Validates and deserialises a frame's body as `T`.
pub fn decode_body<T>(frame: &Frame) -> Result<T, MessageError>
where
    T: WireMessage,
    T::Archived: for<'a> CheckBytes<HighValidator<'a, rancor::Error>>
        + Deserialize<T, HighDeserializer<rancor::Error>>,
{
    let archived = access_body::<T>(frame)?;
    rkyv::deserialize::<T, rancor::Error>(archived).map_err(|e| MessageError::Malformed {
        kind: T::KIND,
        reason: e.to_string(),
    })
}

/// Generates the `Request`/`Response` enums and their kind tables from one list, so a message
/// type, its kind and its enum variant cannot drift apart.
macro_rules! messages {
    (
        requests { $($req:ident($req_ty:ty),)* }
        responses { $($resp:ident($resp_ty:ty) = $resp_kind:ident,)* }
    ) => {
        $(impl WireMessage for $req_ty { const KIND: FrameKind = FrameKind::$req; })*
        $(impl WireMessage for $resp_ty { const KIND: FrameKind = FrameKind::$resp_kind; })*

        /// Every request a client can send.
        #[derive(Debug, Clone, PartialEq, Eq)]
        #[cfg_attr(test, derive(proptest_derive::Arbitrary))]
        pub enum Request {
            $($req($req_ty),)*
        }

        /// Every response a server can send.
        #[derive(Debug, Clone, PartialEq, Eq)]
        #[cfg_attr(test, derive(proptest_derive::Arbitrary))]
        pub enum Response {
            $($resp($resp_ty),)*
        }

        impl Request {
            pub fn kind(&self) -> FrameKind {
                match self {
                    $(Request::$req(_) => FrameKind::$req,)*
                }
            }

            fn encode_body(&self) -> Result<AlignedVec, EncodeError> {
                match self {
                    $(Request::$req(m) => encode_body(m),)*
                }
            }

            fn decode_frame(kind: FrameKind, frame: &Frame) -> Result<Request, MessageError> {
                match kind {
                    $(FrameKind::$req => decode_body::<$req_ty>(frame).map(Request::$req),)*
                    _ if kind.is_response() => Err(MessageError::NotARequest { kind }),
                    _ => Err(MessageError::UnknownKind { kind: kind.as_u16() }),
                }
            }
        }

        impl Response {
            pub fn kind(&self) -> FrameKind {
                match self {
                    $(Response::$resp(_) => FrameKind::$resp_kind,)*
                }
            }

            fn encode_body(&self) -> Result<AlignedVec, EncodeError> {
                match self {
                    $(Response::$resp(m) => encode_body(m),)*
                }
            }

            fn decode_frame(kind: FrameKind, frame: &Frame) -> Result<Response, MessageError> {
                match kind {
                    $(FrameKind::$resp_kind => decode_body::<$resp_ty>(frame).map(Response::$resp),)*
                    _ if !kind.is_response() => Err(MessageError::NotAResponse { kind }),
                    _ => Err(MessageError::UnknownKind { kind: kind.as_u16() }),
                }
            }
        }
    };
}

messages! {
    requests {
        Hello(Hello),
        CreateQueue(CreateQueueRequest),
        DeleteQueue(DeleteQueueRequest),
        GetQueueUrl(GetQueueUrlRequest),
        ListQueues(ListQueuesRequest),
        GetQueueAttributes(GetQueueAttributesRequest),
        SetQueueAttributes(SetQueueAttributesRequest),
        PurgeQueue(PurgeQueueRequest),
        TagQueue(TagQueueRequest),
        UntagQueue(UntagQueueRequest),
        ListQueueTags(ListQueueTagsRequest),
        ListDeadLetterSourceQueues(ListDeadLetterSourceQueuesRequest),
        StartMessageMoveTask(StartMessageMoveTaskRequest),
        ListMessageMoveTasks(ListMessageMoveTasksRequest),
        CancelMessageMoveTask(CancelMessageMoveTaskRequest),
        SendMessage(SendMessageRequest),
        SendMessageBatch(SendMessageBatchRequest),
        ReceiveMessage(ReceiveMessageRequest),
        DeleteMessage(DeleteMessageRequest),
        DeleteMessageBatch(DeleteMessageBatchRequest),
        ChangeMessageVisibility(ChangeMessageVisibilityRequest),
        ChangeMessageVisibilityBatch(ChangeMessageVisibilityBatchRequest),
    }
    responses {
        Error(ErrorResponse) = Error,
        HelloOk(HelloOk) = HelloOk,
        CreateQueue(CreateQueueResult) = CreateQueueResult,
        DeleteQueue(DeleteQueueResult) = DeleteQueueResult,
        GetQueueUrl(GetQueueUrlResult) = GetQueueUrlResult,
        ListQueues(ListQueuesResult) = ListQueuesResult,
        GetQueueAttributes(GetQueueAttributesResult) = GetQueueAttributesResult,
        SetQueueAttributes(SetQueueAttributesResult) = SetQueueAttributesResult,
        PurgeQueue(PurgeQueueResult) = PurgeQueueResult,
        TagQueue(TagQueueResult) = TagQueueResult,
        UntagQueue(UntagQueueResult) = UntagQueueResult,
        ListQueueTags(ListQueueTagsResult) = ListQueueTagsResult,
        ListDeadLetterSourceQueues(ListDeadLetterSourceQueuesResult) = ListDeadLetterSourceQueuesResult,
        StartMessageMoveTask(StartMessageMoveTaskResult) = StartMessageMoveTaskResult,
        ListMessageMoveTasks(ListMessageMoveTasksResult) = ListMessageMoveTasksResult,
        CancelMessageMoveTask(CancelMessageMoveTaskResult) = CancelMessageMoveTaskResult,
        SendMessage(SendMessageResult) = SendMessageResult,
        SendMessageBatch(SendMessageBatchResult) = SendMessageBatchResult,
        ReceiveMessage(ReceiveMessageResult) = ReceiveMessageResult,
        DeleteMessage(DeleteMessageResult) = DeleteMessageResult,
        DeleteMessageBatch(DeleteMessageBatchResult) = DeleteMessageBatchResult,
        ChangeMessageVisibility(ChangeMessageVisibilityResult) = ChangeMessageVisibilityResult,
        ChangeMessageVisibilityBatch(ChangeMessageVisibilityBatchResult) = ChangeMessageVisibilityBatchResult,
    }
}

/// Encodes a request frame (no checksum trailer: QUIC protects client traffic).
pub fn encode_request(request_id: u64, request: &Request) -> Result<Vec<u8>, EncodeError> {
    encode_request_with(request_id, request, Checksum::None)
}

pub fn encode_request_with(
    request_id: u64,
    request: &Request,
    checksum: Checksum,
) -> Result<Vec<u8>, EncodeError> {
    let body = request.encode_body()?;
    encode_frame(request.kind().as_u16(), request_id, &body, checksum)
}

/// Encodes a response frame; `request_id` is the id of the request it answers.
pub fn encode_response(request_id: u64, response: &Response) -> Result<Vec<u8>, EncodeError> {
    encode_response_with(request_id, response, Checksum::None)
}

pub fn encode_response_with(
    request_id: u64,
    response: &Response,
    checksum: Checksum,
) -> Result<Vec<u8>, EncodeError> {
    let body = response.encode_body()?;
    encode_frame(response.kind().as_u16(), request_id, &body, checksum)
}

/// Reads a request out of a decoded frame (server side).
pub fn decode_request(frame: &Frame) -> Result<Request, MessageError> {
    match frame.kind() {
        Some(kind) => Request::decode_frame(kind, frame),
        None => Err(MessageError::UnknownKind {
            kind: frame.header.kind,
        }),
    }
}

/// Reads a response out of a decoded frame (client side).
pub fn decode_response(frame: &Frame) -> Result<Response, MessageError> {
    match frame.kind() {
        Some(kind) => Response::decode_frame(kind, frame),
        None => Err(MessageError::UnknownKind {
            kind: frame.header.kind,
        }),
    }
}
