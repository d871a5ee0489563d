//! Frames: the unit every Sluice QUIC stream carries.
//!
//! # Byte layout (frame format version 1)
//!
//! All integers are little-endian. A frame is a 16-byte header, a body of `body_len` bytes, and
//! an optional 8-byte checksum trailer:
//!
//! ```text
//!  offset  size  field
//!  ------  ----  -----------------------------------------------------------------------
//!       0     1  magic       0xF1: "frame layout 1". A new header layout gets a new magic.
//!       1     1  flags       bit 0 = CHECKSUM (an xxh3-64 trailer follows the body);
//!                            bits 1-7 reserved, must be 0.
//!       2     2  kind        u16 frame kind (see `FrameKind`); bit 15 set = a response.
//!       4     4  body_len    u32 length of the body in bytes (0 allowed).
//!       8     8  request_id  u64 chosen by the requester, echoed in its response.
//!      16  body_len          body: one rkyv 0.8 archive (little-endian, aligned primitives,
//!                            32-bit relative pointers) of the message type `kind` names,
//!                            root object at the end as rkyv writes it.
//!  16+body_len  8            xxh3-64 (seed 0) of header bytes 0..16 and the body, present
//!                            only when the CHECKSUM flag is set.
//! ```
//!
//! The whole frame (header + body + trailer) is at most [`FRAME_BYTES_MAX`] bytes; a receiver may
//! set a lower limit (the server advertises its own in `HelloOk`). The header is 16 bytes so that
//! a body written right after it into a 16-byte-aligned buffer stays aligned; receivers still copy
//! bodies into an `rkyv::util::AlignedVec` because rkyv 0.8 refuses misaligned input.
//!
//! # Streams, pipelining, request ids
//!
//! A client opens bidirectional QUIC streams and writes request frames back to back without
//! waiting (pipelining); the server answers each request with exactly one response frame on the
//! same stream, possibly out of order (a long-poll ReceiveMessage must not hold back a
//! SendMessage behind it), and the client matches answers by `request_id`. Request ids are the
//! client's choice and must be distinct among its requests in flight on the connection; id 0 is
//! reserved for connection-level frames (`Hello`, `HelloOk`, and `Error` frames that answer no
//! particular request).
//!
//! # The checksum flag
//!
//! QUIC already authenticates every packet, so client traffic goes without a trailer. Frames that
//! cross the network unencrypted (replication, later plaintext paths) or that are kept as bytes
//! (record batches, which travel on the wire in the bytes they have on disk) set CHECKSUM; a
//! receiver verifies the trailer before it reads the header's kind or the body.

use rkyv::util::AlignedVec;

/// The version of the frame layout above. It is carried by [`FRAME_MAGIC`]; bump both together.
pub const FRAME_FORMAT_VERSION: u8 = 1;
/// First byte of every layout-1 frame. Chosen outside ASCII and outside the TLS record types
/// (0x14-0x17), so a peer speaking HTTP or TLS at the port is told apart at its first byte.
pub const FRAME_MAGIC: u8 = 0xF0 | FRAME_FORMAT_VERSION;

pub const FRAME_HEADER_BYTES: usize = 16;
pub const FRAME_TRAILER_BYTES: usize = 8;

/// Flag bit: an xxh3-64 trailer follows the body.
pub const FLAG_CHECKSUM: u8 = 0x01;
/// Flag bits this version understands; any other bit set is an error.
pub const FLAGS_KNOWN: u8 = FLAG_CHECKSUM;

/// SQS's limits that size frames: 1 MiB a message and a whole batch, 10 batch entries (and
/// at most 10 messages a ReceiveMessage answer). Defined in [`crate::limits`].
pub use crate::limits::{BATCH_ENTRIES_MAX, MESSAGE_BYTES_MAX};
/// What one message costs a frame beyond its body and attributes: ids (message id, receipt
/// handle, batch entry id ≤ 80, group and dedup ids ≤ 128 each), MD5s, system attributes and
/// rkyv's relative pointers and map nodes. Measured needs are a few hundred bytes to ~2 KiB;
/// this is generous on purpose, it only bounds memory.
pub const MESSAGE_OVERHEAD_BYTES_MAX: usize = 16 * 1024;
/// Per-frame overhead beyond the messages: header, trailer, queue URL, request fields.
pub const FRAME_OVERHEAD_BYTES_MAX: usize = 64 * 1024;

/// The largest request frame: a SendMessageBatch of 1 MiB of messages, ten entries' overhead and
/// the frame's own. Servers decode requests with this limit (or lower, see `HelloOk`).
pub const REQUEST_FRAME_BYTES_MAX: usize =
    MESSAGE_BYTES_MAX + BATCH_ENTRIES_MAX * MESSAGE_OVERHEAD_BYTES_MAX + FRAME_OVERHEAD_BYTES_MAX;

/// The largest frame of any kind: a ReceiveMessage answer of ten 1 MiB messages (SQS applies the
/// 1 MiB limit per message on receive, not per response). Clients decode responses with this
/// limit. ~10.3 MiB.
pub const FRAME_BYTES_MAX: usize =
    BATCH_ENTRIES_MAX * (MESSAGE_BYTES_MAX + MESSAGE_OVERHEAD_BYTES_MAX) + FRAME_OVERHEAD_BYTES_MAX;

/// No receiver may set its limit below this: a `Hello`, `HelloOk` or `Error` must always fit.
pub const FRAME_BYTES_MIN: usize = 64 * 1024;

const _: () = assert!(FRAME_BYTES_MAX <= u32::MAX as usize, "body_len is a u32");
const _: () = assert!(FRAME_BYTES_MIN <= REQUEST_FRAME_BYTES_MAX);
const _: () = assert!(REQUEST_FRAME_BYTES_MAX <= FRAME_BYTES_MAX);
// Sized for SQS: a full batch fits a request with under 512 KiB to spare for overhead; ten
// full-size messages fit a response.
const _: () = assert!(REQUEST_FRAME_BYTES_MAX > MESSAGE_BYTES_MAX);
const _: () = assert!(REQUEST_FRAME_BYTES_MAX < MESSAGE_BYTES_MAX + 512 * 1024);
const _: () = assert!(FRAME_BYTES_MAX > 10 * MESSAGE_BYTES_MAX);
const _: () = assert!(FRAME_BYTES_MAX < 11 * MESSAGE_BYTES_MAX);

/// Bit 15 of a kind marks a response.
pub const KIND_RESPONSE_BIT: u16 = 0x8000;

/// Every frame kind of protocol version 1. Requests have bit 15 clear; the response to request
/// kind `k` is `k | 0x8000`; `Error` (0x8000) answers any request.
///
/// Ranges (request numbers; responses are the same | 0x8000):
///
/// | range         | use                                                                   |
/// |---------------|-----------------------------------------------------------------------|
/// | 0x0000        | invalid as a request; its response form 0x8000 is `Error`             |
/// | 0x00FF        | invalid as a request; its response form 0x80FF is `NotLeader` (v2)    |
/// | 0x0001-0x00FF | connection control (`Hello` = 0x0001, `GetRouting` = 0x0002)           |
/// | 0x0100-0x01FF | SQS queue administration                                               |
/// | 0x0200-0x02FF | SQS message operations                                                 |
/// | 0x0300-0x03FF | reserved: streams (produce, fetch, list offsets, offset commit/fetch, consumer groups, topics) |
/// | 0x0400-0x04FF | reserved: node-to-node replication (Raft over QUIC)                    |
/// | 0x0500-0x7FFF | reserved, unassigned                                                   |
///
/// A receiver answers a kind it does not know with an `Error` frame (`UnknownFrameKind`)
/// carrying the frame's request id; the stream stays usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u16)]
pub enum FrameKind {
    Hello = 0x0001,
    HelloOk = 0x8001,
    GetRouting = 0x0002,
    GetRoutingResult = 0x8002,
    Error = 0x8000,
    /// Protocol v2: answers any request on a node that does not lead its partition (no request
    /// kind 0x00FF exists).
    NotLeader = 0x80FF,

    CreateQueue = 0x0101,
    DeleteQueue = 0x0102,
    GetQueueUrl = 0x0103,
    ListQueues = 0x0104,
    GetQueueAttributes = 0x0105,
    SetQueueAttributes = 0x0106,
    PurgeQueue = 0x0107,
    TagQueue = 0x0108,
    UntagQueue = 0x0109,
    ListQueueTags = 0x010A,
    ListDeadLetterSourceQueues = 0x010B,
    StartMessageMoveTask = 0x010C,
    ListMessageMoveTasks = 0x010D,
    CancelMessageMoveTask = 0x010E,

    SendMessage = 0x0201,
    SendMessageBatch = 0x0202,
    ReceiveMessage = 0x0203,
    DeleteMessage = 0x0204,
    DeleteMessageBatch = 0x0205,
    ChangeMessageVisibility = 0x0206,
    ChangeMessageVisibilityBatch = 0x0207,

    CreateQueueResult = 0x8101,
    DeleteQueueResult = 0x8102,
    GetQueueUrlResult = 0x8103,
    ListQueuesResult = 0x8104,
    GetQueueAttributesResult = 0x8105,
    SetQueueAttributesResult = 0x8106,
    PurgeQueueResult = 0x8107,
    TagQueueResult = 0x8108,
    UntagQueueResult = 0x8109,
    ListQueueTagsResult = 0x810A,
    ListDeadLetterSourceQueuesResult = 0x810B,
    StartMessageMoveTaskResult = 0x810C,
    ListMessageMoveTasksResult = 0x810D,
    CancelMessageMoveTaskResult = 0x810E,

    SendMessageResult = 0x8201,
    SendMessageBatchResult = 0x8202,
    ReceiveMessageResult = 0x8203,
    DeleteMessageResult = 0x8204,
    DeleteMessageBatchResult = 0x8205,
    ChangeMessageVisibilityResult = 0x8206,
    ChangeMessageVisibilityBatchResult = 0x8207,

    // Streams (`KIND_RANGE_STREAMS`): topics, produce/fetch, consumer groups.
    CreateTopic = 0x0301,
    DeleteTopic = 0x0302,
    DescribeTopic = 0x0303,
    Produce = 0x0304,
    Fetch = 0x0305,
    ListOffsets = 0x0306,
    JoinGroup = 0x0307,
    Heartbeat = 0x0308,
    LeaveGroup = 0x0309,
    CommitOffsets = 0x030A,
    FetchCommitted = 0x030B,
    GroupLag = 0x030C,
    ListTopics = 0x030D,
    ListGroups = 0x030E,
    DescribeGroup = 0x030F,

    CreateTopicResult = 0x8301,
    DeleteTopicResult = 0x8302,
    DescribeTopicResult = 0x8303,
    ProduceResult = 0x8304,
    FetchResult = 0x8305,
    ListOffsetsResult = 0x8306,
    JoinGroupResult = 0x8307,
    HeartbeatResult = 0x8308,
    LeaveGroupResult = 0x8309,
    CommitOffsetsResult = 0x830A,
    FetchCommittedResult = 0x830B,
    GroupLagResult = 0x830C,
    ListTopicsResult = 0x830D,
    ListGroupsResult = 0x830E,
    DescribeGroupResult = 0x830F,
}

/// Request-kind ranges of subsystems (streams: 0x0301..=0x030F in use); documented so nobody
/// reuses them.
pub const KIND_RANGE_STREAMS: std::ops::RangeInclusive<u16> = 0x0300..=0x03FF;
pub const KIND_RANGE_REPLICATION: std::ops::RangeInclusive<u16> = 0x0400..=0x04FF;

impl FrameKind {
    /// Every kind, in numeric order of requests then responses (tests, docs, fuzzing).
    pub const ALL: [FrameKind; 78] = [
        FrameKind::Hello,
        FrameKind::GetRouting,
        FrameKind::CreateQueue,
        FrameKind::DeleteQueue,
        FrameKind::GetQueueUrl,
        FrameKind::ListQueues,
        FrameKind::GetQueueAttributes,
        FrameKind::SetQueueAttributes,
        FrameKind::PurgeQueue,
        FrameKind::TagQueue,
        FrameKind::UntagQueue,
        FrameKind::ListQueueTags,
        FrameKind::ListDeadLetterSourceQueues,
        FrameKind::StartMessageMoveTask,
        FrameKind::ListMessageMoveTasks,
        FrameKind::CancelMessageMoveTask,
        FrameKind::SendMessage,
        FrameKind::SendMessageBatch,
        FrameKind::ReceiveMessage,
        FrameKind::DeleteMessage,
        FrameKind::DeleteMessageBatch,
        FrameKind::ChangeMessageVisibility,
        FrameKind::ChangeMessageVisibilityBatch,
        FrameKind::CreateTopic,
        FrameKind::DeleteTopic,
        FrameKind::DescribeTopic,
        FrameKind::Produce,
        FrameKind::Fetch,
        FrameKind::ListOffsets,
        FrameKind::JoinGroup,
        FrameKind::Heartbeat,
        FrameKind::LeaveGroup,
        FrameKind::CommitOffsets,
        FrameKind::FetchCommitted,
        FrameKind::GroupLag,
        FrameKind::ListTopics,
        FrameKind::ListGroups,
        FrameKind::DescribeGroup,
        FrameKind::Error,
        FrameKind::HelloOk,
        FrameKind::GetRoutingResult,
        FrameKind::NotLeader,
        FrameKind::CreateQueueResult,
        FrameKind::DeleteQueueResult,
        FrameKind::GetQueueUrlResult,
        FrameKind::ListQueuesResult,
        FrameKind::GetQueueAttributesResult,
        FrameKind::SetQueueAttributesResult,
        FrameKind::PurgeQueueResult,
        FrameKind::TagQueueResult,
        FrameKind::UntagQueueResult,
        FrameKind::ListQueueTagsResult,
        FrameKind::ListDeadLetterSourceQueuesResult,
        FrameKind::StartMessageMoveTaskResult,
        FrameKind::ListMessageMoveTasksResult,
        FrameKind::CancelMessageMoveTaskResult,
        FrameKind::SendMessageResult,
        FrameKind::SendMessageBatchResult,
        FrameKind::ReceiveMessageResult,
        FrameKind::DeleteMessageResult,
        FrameKind::DeleteMessageBatchResult,
        FrameKind::ChangeMessageVisibilityResult,
        FrameKind::ChangeMessageVisibilityBatchResult,
        FrameKind::CreateTopicResult,
        FrameKind::DeleteTopicResult,
        FrameKind::DescribeTopicResult,
        FrameKind::ProduceResult,
        FrameKind::FetchResult,
        FrameKind::ListOffsetsResult,
        FrameKind::JoinGroupResult,
        FrameKind::HeartbeatResult,
        FrameKind::LeaveGroupResult,
        FrameKind::CommitOffsetsResult,
        FrameKind::FetchCommittedResult,
        FrameKind::GroupLagResult,
        FrameKind::ListTopicsResult,
        FrameKind::ListGroupsResult,
        FrameKind::DescribeGroupResult,
    ];

    /// The kind with this number, or `None` for unassigned and reserved numbers.
    pub fn from_u16(raw: u16) -> Option<FrameKind> {
        FrameKind::ALL.into_iter().find(|k| *k as u16 == raw)
    }

    pub fn as_u16(self) -> u16 {
        self as u16
    }

    pub fn is_response(self) -> bool {
        self as u16 & KIND_RESPONSE_BIT != 0
    }

    /// The success response kind for a request kind (`None` for responses).
    pub fn response_kind(self) -> Option<FrameKind> {
        if self.is_response() {
            return None;
        }
        FrameKind::from_u16(self as u16 | KIND_RESPONSE_BIT)
    }
}

/// The fixed 16-byte header of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Raw kind: the decoder hands over frames of any kind it could delimit, so that an unknown
    /// kind can be answered with an error frame; [`FrameKind::from_u16`] names it.
    pub kind: u16,
    pub flags: u8,
    pub body_len: u32,
    pub request_id: u64,
}

impl FrameHeader {
    pub fn to_bytes(&self) -> [u8; FRAME_HEADER_BYTES] {
        let mut b = [0u8; FRAME_HEADER_BYTES];
        b[0] = FRAME_MAGIC;
        b[1] = self.flags;
        b[2..4].copy_from_slice(&self.kind.to_le_bytes());
        b[4..8].copy_from_slice(&self.body_len.to_le_bytes());
        b[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        b
    }

    /// Reads the fields without judging them (the decoder checks magic, flags and length).
    pub fn parse(b: &[u8; FRAME_HEADER_BYTES]) -> FrameHeader {
        FrameHeader {
            flags: b[1],
            kind: u16::from_le_bytes([b[2], b[3]]),
            body_len: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            request_id: u64::from_le_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]),
        }
    }

    pub fn has_checksum(&self) -> bool {
        self.flags & FLAG_CHECKSUM != 0
    }

    /// Header + body + trailer, in bytes.
    pub fn frame_bytes(&self) -> usize {
        FRAME_HEADER_BYTES
            + self.body_len as usize
            + if self.has_checksum() {
                FRAME_TRAILER_BYTES
            } else {
                0
            }
    }
}

/// Whether to append the xxh3-64 trailer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Checksum {
    /// QUIC-protected client traffic.
    #[default]
    None,
    /// Frames that cross the network unencrypted or are stored as bytes.
    Xxh3,
}

/// One whole frame as the decoder yields it: the body sits in a 16-byte-aligned buffer, ready
/// for `rkyv::access`, and its checksum (if any) has been verified.
#[derive(Debug, Clone)]
pub struct Frame {
    pub header: FrameHeader,
    pub body: AlignedVec,
}

impl PartialEq for Frame {
    fn eq(&self, other: &Self) -> bool {
        self.header == other.header && self.body.as_slice() == other.body.as_slice()
    }
}

impl Eq for Frame {}

impl Frame {
    pub fn kind(&self) -> Option<FrameKind> {
        FrameKind::from_u16(self.header.kind)
    }

    pub fn request_id(&self) -> u64 {
        self.header.request_id
    }
}

/// The xxh3-64 a CHECKSUM trailer carries: over the header bytes as sent, then the body.
pub fn frame_checksum(header: &[u8; FRAME_HEADER_BYTES], body: &[u8]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(header);
    h.update(body);
    h.digest()
}

/// The header of a frame around `body`, and its trailer if `checksum` asks for one. Fails only
/// if the frame would exceed [`FRAME_BYTES_MAX`] (which no receiver would accept). Shared by
/// [`encode_frame`] and the codec, which archives bodies in place after room for the header.
pub(crate) fn seal_frame(
    kind: u16,
    request_id: u64,
    body: &[u8],
    checksum: Checksum,
) -> Result<([u8; FRAME_HEADER_BYTES], Option<[u8; FRAME_TRAILER_BYTES]>), crate::EncodeError> {
    let flags = match checksum {
        Checksum::None => 0,
        Checksum::Xxh3 => FLAG_CHECKSUM,
    };
    let frame_bytes =
        FRAME_HEADER_BYTES + body.len() + if flags != 0 { FRAME_TRAILER_BYTES } else { 0 };
    if frame_bytes > FRAME_BYTES_MAX {
        return Err(crate::EncodeError::FrameTooLarge {
            frame_bytes,
            limit_bytes: FRAME_BYTES_MAX,
        });
    }
    let header = FrameHeader {
        kind,
        flags,
        // Fits: checked against FRAME_BYTES_MAX, which is below u32::MAX (const assert).
        body_len: body.len() as u32,
        request_id,
    };
    debug_assert_eq!(header.frame_bytes(), frame_bytes);
    let header_bytes = header.to_bytes();
    let trailer = (flags != 0).then(|| frame_checksum(&header_bytes, body).to_le_bytes());
    Ok((header_bytes, trailer))
}

/// Lays out one frame around an already-encoded body. Fails only if the frame would exceed
/// [`FRAME_BYTES_MAX`] (which no receiver would accept).
pub fn encode_frame(
    kind: u16,
    request_id: u64,
    body: &[u8],
    checksum: Checksum,
) -> Result<Vec<u8>, crate::EncodeError> {
    let (header, trailer) = seal_frame(kind, request_id, body, checksum)?;
    let mut out = Vec::with_capacity(FRAME_HEADER_BYTES + body.len() + FRAME_TRAILER_BYTES);
    out.extend_from_slice(&header);
    out.extend_from_slice(body);
    if let Some(t) = trailer {
        out.extend_from_slice(&t);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_distinct_and_round_trip() {
        let mut seen = std::collections::BTreeSet::new();
        for k in FrameKind::ALL {
            assert!(seen.insert(k as u16), "{k:?} assigned twice");
            assert_eq!(FrameKind::from_u16(k as u16), Some(k));
        }
        // Every request has its response and vice versa (except Error and NotLeader, which
        // answer all).
        for k in FrameKind::ALL {
            if k.is_response() {
                if k != FrameKind::Error && k != FrameKind::NotLeader {
                    let req = FrameKind::from_u16(k as u16 & !KIND_RESPONSE_BIT)
                        .expect("every response has a request");
                    assert_eq!(req.response_kind(), Some(k));
                }
            } else {
                assert!(k.response_kind().is_some(), "{k:?} has no response kind");
            }
        }
        // Streams use 0x0301..=0x030F; the rest of their range and replication's stay free.
        for raw in (0x0310..=*KIND_RANGE_STREAMS.end()).chain(KIND_RANGE_REPLICATION) {
            assert_eq!(FrameKind::from_u16(raw), None);
            assert_eq!(FrameKind::from_u16(raw | KIND_RESPONSE_BIT), None);
        }
        assert_eq!(FrameKind::from_u16(0), None);
    }

    #[test]
    fn header_layout_is_as_documented() {
        let h = FrameHeader {
            kind: 0x0201,
            flags: FLAG_CHECKSUM,
            body_len: 0x0403_0201,
            request_id: 0x0807_0605_0403_0201,
        };
        let b = h.to_bytes();
        assert_eq!(
            b,
            [
                0xF1, 0x01, 0x01, 0x02, 0x01, 0x02, 0x03, 0x04, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06,
                0x07, 0x08
            ]
        );
        assert_eq!(FrameHeader::parse(&b), h);
        assert_eq!(h.frame_bytes(), 16 + 0x0403_0201 + 8);
    }
}
