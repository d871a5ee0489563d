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
use bytes::Bytes;

use crate::frame::{
    seal_frame, Checksum, Frame, FrameKind, FRAME_BYTES_MAX, FRAME_HEADER_BYTES,
    FRAME_TRAILER_BYTES,
};
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

            fn write_body(&self, frame: FrameWriter) -> Result<FrameWriter, EncodeError> {
                match self {
                    $(Request::$req(m) => frame.body(m),)*
                }
            }

            /// The body archived on its own (tests: the in-place frame must hold these bytes).
            #[cfg(test)]
            fn standalone_body(&self) -> AlignedVec {
                match self {
                    $(Request::$req(m) => encode_body(m).expect("encodes"),)*
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

            fn write_body(&self, frame: FrameWriter) -> Result<FrameWriter, EncodeError> {
                match self {
                    $(Response::$resp(m) => frame.body(m),)*
                }
            }

            /// The body archived on its own (tests: the in-place frame must hold these bytes).
            #[cfg(test)]
            fn standalone_body(&self) -> AlignedVec {
                match self {
                    $(Response::$resp(m) => encode_body(m).expect("encodes"),)*
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
        GetRouting(GetRoutingRequest),
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
        CreateTopic(CreateTopicRequest),
        DeleteTopic(DeleteTopicRequest),
        DescribeTopic(DescribeTopicRequest),
        Produce(ProduceRequest),
        Fetch(FetchRequest),
        ListOffsets(ListOffsetsRequest),
        JoinGroup(JoinGroupRequest),
        Heartbeat(HeartbeatRequest),
        LeaveGroup(LeaveGroupRequest),
        CommitOffsets(CommitOffsetsRequest),
        FetchCommitted(FetchCommittedRequest),
        GroupLag(GroupLagRequest),
        ListTopics(ListTopicsRequest),
        ListGroups(ListGroupsRequest),
        DescribeGroup(DescribeGroupRequest),
    }
    responses {
        Error(ErrorResponse) = Error,
        NotLeader(NotLeaderResponse) = NotLeader,
        HelloOk(HelloOk) = HelloOk,
        GetRouting(GetRoutingResult) = GetRoutingResult,
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
        CreateTopic(CreateTopicResult) = CreateTopicResult,
        DeleteTopic(DeleteTopicResult) = DeleteTopicResult,
        DescribeTopic(DescribeTopicResult) = DescribeTopicResult,
        Produce(ProduceResult) = ProduceResult,
        Fetch(FetchResult) = FetchResult,
        ListOffsets(ListOffsetsResult) = ListOffsetsResult,
        JoinGroup(JoinGroupResult) = JoinGroupResult,
        Heartbeat(HeartbeatResult) = HeartbeatResult,
        LeaveGroup(LeaveGroupResult) = LeaveGroupResult,
        CommitOffsets(CommitOffsetsResult) = CommitOffsetsResult,
        FetchCommitted(FetchCommittedResult) = FetchCommittedResult,
        GroupLag(GroupLagResult) = GroupLagResult,
        ListTopics(ListTopicsResult) = ListTopicsResult,
        ListGroups(ListGroupsResult) = ListGroupsResult,
        DescribeGroup(DescribeGroupResult) = DescribeGroupResult,
    }
}

/// Encodes a request frame (no checksum trailer: QUIC protects client traffic).
pub fn encode_request(request_id: u64, request: &Request) -> Result<Bytes, EncodeError> {
    encode_request_with(request_id, request, Checksum::None)
}

pub fn encode_request_with(
    request_id: u64,
    request: &Request,
    checksum: Checksum,
) -> Result<Bytes, EncodeError> {
    let frame = FrameWriter::new(request.body_bytes_hint(), checksum);
    request
        .write_body(frame)?
        .finish(request.kind().as_u16(), request_id)
}

/// Encodes a response frame; `request_id` is the id of the request it answers.
pub fn encode_response(request_id: u64, response: &Response) -> Result<Bytes, EncodeError> {
    encode_response_with(request_id, response, Checksum::None)
}

pub fn encode_response_with(
    request_id: u64,
    response: &Response,
    checksum: Checksum,
) -> Result<Bytes, EncodeError> {
    let frame = FrameWriter::new(response.body_bytes_hint(), checksum);
    response
        .write_body(frame)?
        .finish(response.kind().as_u16(), request_id)
}

/// A frame built in one buffer: room for the header, the body archived right after it, the
/// header filled in last. The buffer is 16-byte aligned and the header is 16 bytes, so the body
/// sits aligned as rkyv lays it out, and its bytes are the same as an archive made on its own
/// (rkyv's positions are relative). The body is never copied: the buffer becomes the `Bytes`
/// that a QUIC stream takes without copying either.
struct FrameWriter {
    buf: AlignedVec,
    checksum: Checksum,
}

const _: () = assert!(
    FRAME_HEADER_BYTES.is_multiple_of(16),
    "the body must start 16-byte aligned"
);

impl FrameWriter {
    fn new(body_bytes_hint: usize, checksum: Checksum) -> FrameWriter {
        let cap = FRAME_HEADER_BYTES + body_bytes_hint.min(FRAME_BYTES_MAX) + FRAME_TRAILER_BYTES;
        let mut buf = AlignedVec::with_capacity(cap);
        buf.extend_from_slice(&[0u8; FRAME_HEADER_BYTES]);
        FrameWriter { buf, checksum }
    }

    fn body<T: WireMessage>(self, value: &T) -> Result<FrameWriter, EncodeError>
    where
        T::Archived: for<'a> CheckBytes<HighValidator<'a, rancor::Error>>
            + Deserialize<T, HighDeserializer<rancor::Error>>,
    {
        let buf = rkyv::api::high::to_bytes_in::<_, rancor::Error>(value, self.buf)
            .map_err(|e| EncodeError::Archive(e.to_string()))?;
        Ok(FrameWriter {
            buf,
            checksum: self.checksum,
        })
    }

    fn finish(mut self, kind: u16, request_id: u64) -> Result<Bytes, EncodeError> {
        let (header, trailer) = seal_frame(
            kind,
            request_id,
            &self.buf[FRAME_HEADER_BYTES..],
            self.checksum,
        )?;
        self.buf[..FRAME_HEADER_BYTES].copy_from_slice(&header);
        if let Some(t) = trailer {
            self.buf.extend_from_slice(&t);
        }
        Ok(Bytes::from_owner(self.buf))
    }
}

/// A `FetchResult` response frame built from the fetched batches as they are held (the log's
/// cache or read buffers), as the pieces to write one after the other: the frame header, the
/// batches themselves (not copied: a QUIC stream takes each `Bytes` as it is), and the tail.
/// Laid end to end the pieces are the same bytes as `encode_response` of a `Response::Fetch`
/// whose `batches` is their concatenation (a test checks it byte for byte). The layout is
/// rkyv's (little-endian, aligned, 32-bit relative pointers; pinned in Cargo.toml): the bytes,
/// zero padding to 8, then the root `{ batches: { rel_ptr: i32, len: u32 }, start_offset: u64,
/// end_offset: u64 }`. The frame carries no checksum of its own: every batch has one.
pub fn encode_fetch_response(
    request_id: u64,
    batches: &[Bytes],
    start_offset: u64,
    end_offset: u64,
) -> Result<Vec<Bytes>, EncodeError> {
    let len: usize = batches.iter().map(Bytes::len).sum();
    if len == 0 {
        // rkyv's own spelling of an empty vector.
        let empty = FetchResult {
            batches: Vec::new(),
            start_offset,
            end_offset,
        };
        return Ok(vec![encode_response(request_id, &Response::Fetch(empty))?]);
    }
    let len_u32 = u32::try_from(len).map_err(|_| EncodeError::Archive("fetch too large".into()))?;
    const ROOT_BYTES: usize = 24;
    let pad = len.next_multiple_of(8) - len;
    let mut tail = Vec::with_capacity(pad + ROOT_BYTES);
    tail.resize(pad, 0);
    // The root's pointer is relative to itself: back over the padding and the bytes (the
    // body starts right after the 16-byte header, aligned as rkyv lays it out).
    let rel = i32::try_from(-((len + pad) as i64))
        .map_err(|_| EncodeError::Archive("fetch too large".into()))?;
    tail.extend_from_slice(&rel.to_le_bytes());
    tail.extend_from_slice(&len_u32.to_le_bytes());
    tail.extend_from_slice(&start_offset.to_le_bytes());
    tail.extend_from_slice(&end_offset.to_le_bytes());
    let header = frame_header_unchecked(
        FrameKind::FetchResult.as_u16(),
        request_id,
        len + tail.len(),
    )?;
    let mut parts = Vec::with_capacity(batches.len() + 2);
    parts.push(Bytes::copy_from_slice(&header));
    parts.extend(batches.iter().filter(|b| !b.is_empty()).cloned());
    parts.push(Bytes::from(tail));
    Ok(parts)
}

/// The header of a frame of `body_len` bytes with no checksum (the trailer's hash would need
/// the body in one piece).
fn frame_header_unchecked(
    kind: u16,
    request_id: u64,
    body_len: usize,
) -> Result<[u8; FRAME_HEADER_BYTES], EncodeError> {
    let frame_bytes = FRAME_HEADER_BYTES + body_len;
    if frame_bytes > FRAME_BYTES_MAX {
        return Err(EncodeError::FrameTooLarge {
            frame_bytes,
            limit_bytes: FRAME_BYTES_MAX,
        });
    }
    Ok(crate::frame::FrameHeader {
        kind,
        flags: 0,
        // Fits: checked against FRAME_BYTES_MAX, which is below u32::MAX.
        body_len: body_len as u32,
        request_id,
    }
    .to_bytes())
}

/// About how many bytes an archived body takes: its payloads plus a little for everything
/// else. Only a capacity hint (a frame that outgrows it grows its buffer), so that large bodies
/// are archived without reallocating and copying as they go.
fn payload_hint(payload_bytes: usize, items: usize) -> usize {
    const SMALL_BODY_BYTES: usize = 256;
    const PER_ITEM_BYTES: usize = 192;
    SMALL_BODY_BYTES + payload_bytes + items * PER_ITEM_BYTES
}

fn attributes_hint(attrs: &MessageAttributeMap) -> usize {
    attrs.len() * 64
}

impl Request {
    fn body_bytes_hint(&self) -> usize {
        match self {
            Request::SendMessage(m) => payload_hint(
                m.message_body.len() + attributes_hint(&m.message_attributes),
                1,
            ),
            Request::SendMessageBatch(b) => payload_hint(
                b.entries
                    .iter()
                    .map(|e| e.message_body.len() + attributes_hint(&e.message_attributes))
                    .sum(),
                b.entries.len(),
            ),
            Request::Produce(p) => payload_hint(p.batch.len() + p.topic.len(), 0),
            _ => payload_hint(0, 0),
        }
    }
}

impl Response {
    fn body_bytes_hint(&self) -> usize {
        match self {
            Response::ReceiveMessage(r) => payload_hint(
                r.messages
                    .iter()
                    .map(|m| {
                        m.body.len()
                            + m.receipt_handle.len()
                            + attributes_hint(&m.message_attributes)
                    })
                    .sum(),
                r.messages.len(),
            ),
            Response::Fetch(f) => payload_hint(f.batches.len(), 0),
            _ => payload_hint(0, 0),
        }
    }
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

/// A `FetchResult` answer whose batches are a view of the frame's own buffer: what a client
/// decodes a fetch into, without copying its megabytes out of the frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedBatches {
    pub batches: Bytes,
    pub start_offset: u64,
    pub end_offset: u64,
}

impl From<FetchedBatches> for FetchResult {
    fn from(f: FetchedBatches) -> FetchResult {
        FetchResult {
            batches: f.batches.to_vec(),
            start_offset: f.start_offset,
            end_offset: f.end_offset,
        }
    }
}

/// Decodes a `FetchResult` frame (validated as [`decode_body`] validates it) without copying
/// its batches: they stay in the frame's buffer, which the answer now owns.
pub fn decode_fetch_result(frame: Frame) -> Result<FetchedBatches, MessageError> {
    let (at, len, start_offset, end_offset) = {
        let a = access_body::<FetchResult>(&frame)?;
        let batches = a.batches.as_slice();
        let at = (batches.as_ptr() as usize).wrapping_sub(frame.body.as_ptr() as usize);
        (
            at,
            batches.len(),
            a.start_offset.to_native(),
            a.end_offset.to_native(),
        )
    };
    let batches = if len == 0 {
        Bytes::new()
    } else if at
        .checked_add(len)
        .is_some_and(|end| end <= frame.body.len())
    {
        Bytes::from_owner(frame.body).slice(at..at + len)
    } else {
        // Validation keeps an archive's bytes inside its buffer: not reached.
        return Err(MessageError::Malformed {
            kind: FrameKind::FetchResult,
            reason: "batches outside the frame".into(),
        });
    };
    Ok(FetchedBatches {
        batches,
        start_offset,
        end_offset,
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The direct fetch encoder writes exactly what rkyv writes for the concatenation, for
    /// any number and sizes of batches (alignment of the end included), and it decodes.
    #[test]
    fn fetch_frames_built_from_parts_equal_rkyv_s() {
        let seed = std::env::var("SLUICE_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(29u64);
        let mut x = seed;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for case in 0..200 {
            let parts: Vec<Bytes> = (0..next() % 5)
                .map(|_| {
                    let n = (next() % 3000) as usize;
                    Bytes::from(
                        (0..n)
                            .map(|i| (i as u8).wrapping_mul(31))
                            .collect::<Vec<u8>>(),
                    )
                })
                .collect();
            let (start, end) = (next(), next());
            let pieces = encode_fetch_response(case + 1, &parts, start, end).expect("direct");
            let direct: Vec<u8> = pieces.iter().flat_map(|b| b.iter().copied()).collect();
            let concat: Vec<u8> = parts.iter().flat_map(|b| b.iter().copied()).collect();
            let via_rkyv = encode_response(
                case + 1,
                &Response::Fetch(FetchResult {
                    batches: concat.clone(),
                    start_offset: start,
                    end_offset: end,
                }),
            )
            .expect("rkyv");
            assert_eq!(direct, via_rkyv[..], "seed {seed}, case {case}");
            let frame = crate::decoder::decode_one(&direct, FRAME_BYTES_MAX).expect("frame");
            match decode_response(&frame).expect("decodes") {
                Response::Fetch(f) => {
                    assert_eq!(f.batches, concat, "seed {seed}, case {case}");
                    assert_eq!((f.start_offset, f.end_offset), (start, end));
                }
                other => panic!("seed {seed}: {other:?}"),
            }
            let view = decode_fetch_result(frame).expect("decodes in place");
            assert_eq!(view.batches[..], concat[..], "seed {seed}, case {case}");
            assert_eq!((view.start_offset, view.end_offset), (start, end));
        }
    }
    use crate::decoder::{decode_one, FrameDecoder};
    use crate::frame::{FRAME_BYTES_MAX, FRAME_HEADER_BYTES};
    use proptest::prelude::*;

    /// Decodes `bytes` through a decoder fed in `chunk`-byte pieces, as a stream would.
    fn decode_chunked(bytes: &[u8], chunk: usize) -> Frame {
        let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX);
        let mut frames = Vec::new();
        for piece in bytes.chunks(chunk.max(1)) {
            let mut input = piece;
            while let Some(frame) = decoder.decode(&mut input).expect("valid frame") {
                frames.push(frame);
            }
        }
        decoder.finish().expect("ends on a frame boundary");
        assert_eq!(frames.len(), 1);
        frames.pop().expect("one frame")
    }

    /// The body archived in place after the header is byte for byte the archive made on its
    /// own, laid out by `encode_frame`: building frames in one buffer changes no wire byte.
    fn assert_frame_is_standalone_archive(frame: &[u8], body: &[u8], checksum: Checksum) {
        let header =
            crate::frame::FrameHeader::parse(frame[..FRAME_HEADER_BYTES].try_into().expect("16"));
        let laid_out = crate::frame::encode_frame(header.kind, header.request_id, body, checksum)
            .expect("fits");
        assert_eq!(frame, &laid_out[..]);
    }

    fn check_request(request: Request, request_id: u64, chunk: usize) {
        for checksum in [Checksum::None, Checksum::Xxh3] {
            let bytes = encode_request_with(request_id, &request, checksum).expect("encodes");
            assert_frame_is_standalone_archive(&bytes, &request.standalone_body(), checksum);
            let frame = decode_chunked(&bytes, chunk);
            assert_eq!(frame.kind(), Some(request.kind()));
            assert!(!request.kind().is_response());
            assert_eq!(frame.request_id(), request_id);
            assert_eq!(frame.header.has_checksum(), checksum == Checksum::Xxh3);
            assert_eq!(decode_request(&frame), Ok(request.clone()));
            // A request is never mistaken for a response.
            assert!(matches!(
                decode_response(&frame),
                Err(MessageError::NotAResponse { .. })
            ));
        }
    }

    fn check_response(response: Response, request_id: u64, chunk: usize) {
        for checksum in [Checksum::None, Checksum::Xxh3] {
            let bytes = encode_response_with(request_id, &response, checksum).expect("encodes");
            assert_frame_is_standalone_archive(&bytes, &response.standalone_body(), checksum);
            let frame = decode_chunked(&bytes, chunk);
            assert_eq!(frame.kind(), Some(response.kind()));
            assert!(response.kind().is_response());
            assert_eq!(frame.request_id(), request_id);
            assert_eq!(decode_response(&frame), Ok(response.clone()));
            assert!(matches!(
                decode_request(&frame),
                Err(MessageError::NotARequest { .. })
            ));
        }
    }

    /// One round-trip property per message kind, so a failure names the kind.
    macro_rules! round_trips {
        ($(
            $test:ident: $enum:ident::$variant:ident($ty:ty);
        )*) => {
            proptest! {
                #![proptest_config(ProptestConfig::with_cases(64))]
                $(
                    #[test]
                    fn $test(m in any::<$ty>(), id in any::<u64>(), chunk in 1usize..4096) {
                        round_trips!(@check $enum, $variant, m, id, chunk);
                    }
                )*
            }
        };
        (@check Request, $variant:ident, $m:ident, $id:ident, $chunk:ident) => {
            check_request(Request::$variant($m), $id, $chunk)
        };
        (@check Response, $variant:ident, $m:ident, $id:ident, $chunk:ident) => {
            check_response(Response::$variant($m), $id, $chunk)
        };
    }

    round_trips! {
        hello: Request::Hello(Hello);
        get_routing: Request::GetRouting(GetRoutingRequest);
        create_queue: Request::CreateQueue(CreateQueueRequest);
        delete_queue: Request::DeleteQueue(DeleteQueueRequest);
        get_queue_url: Request::GetQueueUrl(GetQueueUrlRequest);
        list_queues: Request::ListQueues(ListQueuesRequest);
        get_queue_attributes: Request::GetQueueAttributes(GetQueueAttributesRequest);
        set_queue_attributes: Request::SetQueueAttributes(SetQueueAttributesRequest);
        purge_queue: Request::PurgeQueue(PurgeQueueRequest);
        tag_queue: Request::TagQueue(TagQueueRequest);
        untag_queue: Request::UntagQueue(UntagQueueRequest);
        list_queue_tags: Request::ListQueueTags(ListQueueTagsRequest);
        list_dead_letter_source_queues:
            Request::ListDeadLetterSourceQueues(ListDeadLetterSourceQueuesRequest);
        start_message_move_task: Request::StartMessageMoveTask(StartMessageMoveTaskRequest);
        list_message_move_tasks: Request::ListMessageMoveTasks(ListMessageMoveTasksRequest);
        cancel_message_move_task: Request::CancelMessageMoveTask(CancelMessageMoveTaskRequest);
        send_message: Request::SendMessage(SendMessageRequest);
        send_message_batch: Request::SendMessageBatch(SendMessageBatchRequest);
        receive_message: Request::ReceiveMessage(ReceiveMessageRequest);
        delete_message: Request::DeleteMessage(DeleteMessageRequest);
        delete_message_batch: Request::DeleteMessageBatch(DeleteMessageBatchRequest);
        change_message_visibility:
            Request::ChangeMessageVisibility(ChangeMessageVisibilityRequest);
        change_message_visibility_batch:
            Request::ChangeMessageVisibilityBatch(ChangeMessageVisibilityBatchRequest);

        error_response: Response::Error(ErrorResponse);
        hello_ok: Response::HelloOk(HelloOk);
        get_routing_result: Response::GetRouting(GetRoutingResult);
        create_queue_result: Response::CreateQueue(CreateQueueResult);
        delete_queue_result: Response::DeleteQueue(DeleteQueueResult);
        get_queue_url_result: Response::GetQueueUrl(GetQueueUrlResult);
        list_queues_result: Response::ListQueues(ListQueuesResult);
        get_queue_attributes_result: Response::GetQueueAttributes(GetQueueAttributesResult);
        set_queue_attributes_result: Response::SetQueueAttributes(SetQueueAttributesResult);
        purge_queue_result: Response::PurgeQueue(PurgeQueueResult);
        tag_queue_result: Response::TagQueue(TagQueueResult);
        untag_queue_result: Response::UntagQueue(UntagQueueResult);
        list_queue_tags_result: Response::ListQueueTags(ListQueueTagsResult);
        list_dead_letter_source_queues_result:
            Response::ListDeadLetterSourceQueues(ListDeadLetterSourceQueuesResult);
        start_message_move_task_result:
            Response::StartMessageMoveTask(StartMessageMoveTaskResult);
        list_message_move_tasks_result:
            Response::ListMessageMoveTasks(ListMessageMoveTasksResult);
        cancel_message_move_task_result:
            Response::CancelMessageMoveTask(CancelMessageMoveTaskResult);
        send_message_result: Response::SendMessage(SendMessageResult);
        send_message_batch_result: Response::SendMessageBatch(SendMessageBatchResult);
        receive_message_result: Response::ReceiveMessage(ReceiveMessageResult);
        delete_message_result: Response::DeleteMessage(DeleteMessageResult);
        delete_message_batch_result: Response::DeleteMessageBatch(DeleteMessageBatchResult);
        change_message_visibility_result:
            Response::ChangeMessageVisibility(ChangeMessageVisibilityResult);
        change_message_visibility_batch_result:
            Response::ChangeMessageVisibilityBatch(ChangeMessageVisibilityBatchResult);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Many requests back to back in one stream, cut anywhere: each comes out whole, in
        /// order, with its own request id (pipelining).
        #[test]
        fn pipelined_requests_in_arbitrary_chunks(
            requests in proptest::collection::vec(any::<Request>(), 1..8),
            chunk in 1usize..512,
        ) {
            let mut stream = Vec::new();
            for (i, r) in requests.iter().enumerate() {
                let checksum = if i % 2 == 0 { Checksum::None } else { Checksum::Xxh3 };
                stream.extend(encode_request_with(i as u64 + 1, r, checksum).expect("encodes"));
            }
            let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX);
            let mut got = Vec::new();
            for piece in stream.chunks(chunk) {
                let mut input = piece;
                while let Some(frame) = decoder.decode(&mut input).expect("valid stream") {
                    got.push((frame.request_id(), decode_request(&frame).expect("valid request")));
                }
            }
            decoder.finish().expect("ends on a boundary");
            let want: Vec<_> = requests.into_iter().enumerate().map(|(i, r)| (i as u64 + 1, r)).collect();
            prop_assert_eq!(got, want);
        }

        /// Flipping any one bit of an unchecksummed frame's body gives a typed error or some
        /// valid message, never a panic.
        #[test]
        fn body_bit_flips_never_panic(request in any::<Request>(), bit in any::<proptest::sample::Index>()) {
            let mut bytes = encode_request(7, &request).expect("encodes").to_vec();
            let body_bits = (bytes.len() - FRAME_HEADER_BYTES) * 8;
            if body_bits > 0 {
                let b = FRAME_HEADER_BYTES * 8 + bit.index(body_bits);
                bytes[b / 8] ^= 1 << (b % 8);
            }
            let frame = decode_one(&bytes, FRAME_BYTES_MAX).expect("boundaries intact");
            if let Err(e) = decode_request(&frame) {
                prop_assert_eq!(e.error_code(), ErrorCode::MalformedFrame);
            }
        }
    }

    #[test]
    fn every_kind_has_a_message_type() {
        // The enums cover every kind: build each variant from Default and compare kinds.
        let kinds: Vec<FrameKind> = [
            Request::Hello(Default::default()),
            Request::GetRouting(Default::default()),
            Request::CreateQueue(Default::default()),
            Request::DeleteQueue(Default::default()),
            Request::GetQueueUrl(Default::default()),
            Request::ListQueues(Default::default()),
            Request::GetQueueAttributes(Default::default()),
            Request::SetQueueAttributes(Default::default()),
            Request::PurgeQueue(Default::default()),
            Request::TagQueue(Default::default()),
            Request::UntagQueue(Default::default()),
            Request::ListQueueTags(Default::default()),
            Request::ListDeadLetterSourceQueues(Default::default()),
            Request::StartMessageMoveTask(Default::default()),
            Request::ListMessageMoveTasks(Default::default()),
            Request::CancelMessageMoveTask(Default::default()),
            Request::SendMessage(Default::default()),
            Request::SendMessageBatch(Default::default()),
            Request::ReceiveMessage(Default::default()),
            Request::DeleteMessage(Default::default()),
            Request::DeleteMessageBatch(Default::default()),
            Request::ChangeMessageVisibility(Default::default()),
            Request::ChangeMessageVisibilityBatch(Default::default()),
            Request::CreateTopic(Default::default()),
            Request::DeleteTopic(Default::default()),
            Request::DescribeTopic(Default::default()),
            Request::Produce(Default::default()),
            Request::Fetch(Default::default()),
            Request::ListOffsets(Default::default()),
            Request::JoinGroup(Default::default()),
            Request::Heartbeat(Default::default()),
            Request::LeaveGroup(Default::default()),
            Request::CommitOffsets(Default::default()),
            Request::FetchCommitted(Default::default()),
            Request::GroupLag(Default::default()),
            Request::ListTopics(Default::default()),
            Request::ListGroups(Default::default()),
            Request::DescribeGroup(Default::default()),
        ]
        .iter()
        .map(Request::kind)
        .collect();
        let requests: Vec<FrameKind> = FrameKind::ALL
            .into_iter()
            .filter(|k| !k.is_response())
            .collect();
        assert_eq!(kinds, requests);
        let responses = FrameKind::ALL.iter().filter(|k| k.is_response()).count();
        // Error and NotLeader answer any request; the others are one request's.
        assert_eq!(responses, 40);
    }

    #[test]
    fn a_body_of_the_wrong_kind_is_malformed_not_misread() {
        // A SendMessage body under a DeleteMessage header: validation catches it or it reads as
        // some DeleteMessage; it is never trusted blindly.
        let send = Request::SendMessage(SendMessageRequest {
            queue_url: "http://localhost:9324/000000000000/q".into(),
            message_body: "hello".into(),
            ..Default::default()
        });
        let Request::SendMessage(m) = &send else {
            unreachable!("built above")
        };
        let body = encode_body(m).expect("encodes");
        let bytes =
            crate::frame::encode_frame(FrameKind::DeleteMessage.as_u16(), 3, &body, Checksum::None)
                .expect("fits");
        let frame = decode_one(&bytes, FRAME_BYTES_MAX).expect("frame is well delimited");
        let _ = decode_request(&frame);
        // A truncated archive is always caught.
        let short = crate::frame::encode_frame(
            FrameKind::SendMessage.as_u16(),
            3,
            &body[..body.len() / 2],
            Checksum::None,
        )
        .expect("fits");
        let frame = decode_one(&short, FRAME_BYTES_MAX).expect("frame is well delimited");
        let err = decode_request(&frame).expect_err("half an archive");
        assert_eq!(err.error_code(), ErrorCode::MalformedFrame);
        assert_eq!(
            err.to_error_response().error_code(),
            ErrorCode::MalformedFrame
        );
    }

    #[test]
    fn zero_copy_access_reads_in_place() {
        let send = SendMessageRequest {
            queue_url: "http://localhost:9324/000000000000/q".into(),
            message_body: "in place".into(),
            ..Default::default()
        };
        let bytes = encode_request(1, &Request::SendMessage(send)).expect("encodes");
        let frame = decode_one(&bytes, FRAME_BYTES_MAX).expect("decodes");
        let archived = access_body::<SendMessageRequest>(&frame).expect("valid");
        assert_eq!(archived.message_body.as_str(), "in place");
        assert!(matches!(
            access_body::<DeleteMessageRequest>(&frame),
            Err(MessageError::Malformed { .. })
        ));
    }

    #[test]
    fn oversized_messages_fail_to_encode() {
        let send = Request::SendMessage(SendMessageRequest {
            message_body: "x".repeat(FRAME_BYTES_MAX),
            ..Default::default()
        });
        let err = encode_request(1, &send).expect_err("over the frame limit");
        assert!(matches!(err, EncodeError::FrameTooLarge { .. }));
        assert_eq!(err.error_code(), ErrorCode::InvalidParameterValue);
    }

    #[test]
    fn a_full_sqs_batch_fits_a_request_frame() {
        // Ten entries of ~100 KiB bodies with ten attributes each and maximal ids: 1 MiB of
        // messages, as SQS allows in one SendMessageBatch.
        let attrs: MessageAttributeMap = (0..10)
            .map(|i| {
                (
                    format!("attr-{i:0>250}"),
                    MessageAttributeValue {
                        data_type: "String".into(),
                        value: AttributeValue::String("v".repeat(10)),
                    },
                )
            })
            .collect();
        let attr_bytes: usize = attrs
            .iter()
            .map(|(k, v)| k.len() + v.data_type.len() + 10)
            .sum();
        let body_bytes = crate::frame::MESSAGE_BYTES_MAX / 10 - attr_bytes;
        let entries = (0..10)
            .map(|i| SendMessageBatchRequestEntry {
                id: format!("{i:0>80}"),
                message_body: "b".repeat(body_bytes),
                delay_seconds: Some(900),
                message_attributes: attrs.clone(),
                message_system_attributes: Default::default(),
                message_deduplication_id: Some("d".repeat(128)),
                message_group_id: Some("g".repeat(128)),
            })
            .collect();
        let batch = Request::SendMessageBatch(SendMessageBatchRequest {
            queue_url: format!("http://localhost:9324/000000000000/{}", "q".repeat(80)),
            entries,
        });
        let bytes = encode_request(1, &batch).expect("encodes");
        assert!(
            bytes.len() <= crate::frame::REQUEST_FRAME_BYTES_MAX,
            "{} bytes",
            bytes.len()
        );
        let frame = decode_one(&bytes, crate::frame::REQUEST_FRAME_BYTES_MAX).expect("fits");
        assert_eq!(decode_request(&frame), Ok(batch));
    }

    #[test]
    fn ten_full_size_messages_fit_a_response_frame() {
        let message = Message {
            message_id: "0".repeat(36),
            receipt_handle: "r".repeat(1024),
            md5_of_body: "0".repeat(32),
            body: "m".repeat(crate::frame::MESSAGE_BYTES_MAX),
            attributes: [
                "SenderId",
                "SentTimestamp",
                "ApproximateReceiveCount",
                "ApproximateFirstReceiveTimestamp",
                "SequenceNumber",
                "MessageDeduplicationId",
                "MessageGroupId",
                "AWSTraceHeader",
                "DeadLetterQueueSourceArn",
            ]
            .into_iter()
            .map(|k| (k.to_string(), "x".repeat(128)))
            .collect(),
            md5_of_message_attributes: Some("0".repeat(32)),
            message_attributes: Default::default(),
        };
        let response = Response::ReceiveMessage(ReceiveMessageResult {
            messages: vec![message; 10],
        });
        let bytes = encode_response(9, &response).expect("fits FRAME_BYTES_MAX");
        let frame = decode_one(&bytes, FRAME_BYTES_MAX).expect("decodes");
        assert_eq!(decode_response(&frame), Ok(response));
    }

    /// The exact bytes of one frame. If this changes, the wire format changed: bump
    /// `PROTOCOL_VERSION` (or `FRAME_FORMAT_VERSION` for the header) and update the fixture.
    #[test]
    fn golden_hello_frame() {
        let hello = Request::Hello(Hello {
            versions: crate::messages::VersionRange { min: 1, max: 1 },
            client_name: "sdk".into(),
            client_version: "0.1.0".into(),
            auth_token: None,
        });
        let bytes = encode_request_with(0, &hello, Checksum::Xxh3).expect("encodes");
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, GOLDEN_HELLO_HEX);
    }

    /// `f1` magic, `01` CHECKSUM, `0100` kind Hello, `20000000` 32-byte body, request id 0,
    /// the archive (versions 1..=1, two inline strings, `None`), then the xxh3-64 trailer.
    const GOLDEN_HELLO_HEX: &str = concat!(
        "f1010100200000000000000000000000",
        "0100010073646bffffffffff302e312e30ffffff000000000000000000000000",
        "65cc836b17c641b6",
    );
}
