//! The partition's log records: every durable state change of a partition is one [`Record`], and
//! replaying the records rebuilds the partition (see `partition.rs`).
//!
//! # Encoding (format versions 1, 2 and 3)
//!
//! Hand-written, compact and versioned; these bytes are the value of one storage-log record.
//!
//! ```text
//! record   = version:u8 (1, 2 or 3) | kind:u8 | at_ms:u64 | fields(kind)
//! Sent (1) = id:u64 | message_id:[16] | visible_at_ms:u64 | flags:u8
//!            [group:str16 if flags&1] [dedup:str16 if flags&2]
//!            [origin: queue_id:u64 partition:u32 msg_id:u64 sent_ms:u64 if flags&4]
//!            (v2: flags&8 = redriven: the origin is an idempotency key only, needs flags&4)
//!            [v3: md5_body:[16] if flags&16]
//!            body:str32 | n_attrs:u8 | n × (name:str16 type:str16 transport:u8 value:bytes32)
//! Received (2)          = id:u64 | receive_count:u32 | deadline_ms:u64 | flags:u8
//!                         (1 = attempt id follows, 2 = first delivery of a receive) [attempt:str16]
//! VisibilityChanged (3) = id:u64 | epoch:u32 | deadline_ms:u64 | flags:u8 (1 = attempt-id retry)
//! Deleted (4)           = id:u64
//! Purged (5)            = before_id:u64
//! DlqMoveStarted (6)    = id:u64                                  (v1: to the redrive target)
//!                         v2: id:u64 | dest:u8 (0 redrive target, 1 dead-letter source,
//!                         2 queue) [queue_id:u64 if dest = 2]
//! DlqMoveDone (7)       = id:u64
//! Configured (8)        = retention_s:u32 | dedup_scope:u8 (0 queue, 1 messageGroup)
//! Checkpoint (9, v2)    = next_id:u64 | receive_seq:u64 | retention_ms:u64 | dedup_scope:u8
//!                         | flags:u8 (1 = last purge follows) [last_purge_ms:u64]
//!                         | live_floor:u64 | live_count:u64
//!                         | n_groups:u32 | n × (name:str16 last_served:u64)
//! str16/str32/bytes32   = little-endian u16/u32/u32 length, then the bytes (strings UTF-8)
//! ```
//!
//! Fixed fields are little-endian. Decoding checks every length against the bytes left before
//! allocating, rejects unknown versions, kinds, flags and trailing bytes, and never panics: any
//! input gives a record or a [`DecodeError`].
//!
//! **Versions.** Version 2 adds the redrive destination of `DlqMoveStarted`, the `redriven` flag
//! of `Sent` and the `Checkpoint` kind; everything else is laid out as in version 1. The encoder
//! writes the lowest version that can express a record, so a record that uses none of the new
//! fields is byte-for-byte what version 1 wrote (a log without redrives or checkpoints stays
//! readable by a version-1 binary), and the decoder reads both, rejecting version-2 fields under
//! a version-1 byte.
//!
//! Version 3 adds the body's MD5 to `Sent` (flag 16). The engine keeps no bodies, so every
//! message a receive hands out is decoded from its `Sent` record; without the digest there, each
//! would be hashed again at every receive (it was computed at send, for the send's reply). A
//! `Sent` whose payload has its digest — every one sent live — is written as version 3.

use std::sync::{Arc, OnceLock};

use thiserror::Error;

use super::attributes::{AttributeValue, DedupScope, MessageAttribute, MESSAGE_ATTRIBUTES_MAX};
use super::md5::{md5_of_attributes, md5_of_bodies, md5_of_body, Md5Digest};

/// The newest record format this code writes and reads (see the module documentation).
pub const RECORD_FORMAT_VERSION: u8 = 3;
/// Redrive destinations, the `redriven` flag and checkpoints.
pub const RECORD_FORMAT_V2: u8 = 2;
/// The first format: still read, and still written for every record it can express.
pub const RECORD_FORMAT_V1: u8 = 1;

/// A message's SQS MessageId: 16 bytes shown as a UUID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(pub [u8; 16]);

impl MessageId {
    /// Deterministic and unique per (queue, partition, id): queue id (8 bytes) | partition
    /// (2 bytes) | id (6 bytes), big-endian so the text sorts like the triple. Replicas and
    /// replays agree on it without storing randomness; queue ids are never reused, partitions
    /// stay below [`PARTITIONS_MAX`] and ids below [`MSG_ID_MAX`].
    pub fn derive(queue_id: u64, partition: u32, id: u64) -> Self {
        debug_assert!(partition < PARTITIONS_MAX && id < MSG_ID_MAX);
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&queue_id.to_be_bytes());
        b[8..10].copy_from_slice(&(partition as u16).to_be_bytes());
        b[10..16].copy_from_slice(&id.to_be_bytes()[2..]);
        MessageId(b)
    }
}

/// Partitions per queue: the partition index takes 16 bits of a MessageId.
pub const PARTITIONS_MAX: u32 = 1 << 16;
/// Message ids per partition: 48 bits of a MessageId (2.8e14; nine years at 1M msg/s).
pub const MSG_ID_MAX: u64 = 1 << 48;

impl MessageId {
    /// The UUID text (8-4-4-4-12 lower-case hex digits), without going through the formatter:
    /// it is made once per message sent and per message received, and `write!` per byte cost
    /// ~2.5% of the broker's CPU in the closed-loop throughput scenario.
    pub fn text(&self) -> [u8; 36] {
        let hex = super::md5::hex16(&self.0);
        let mut out = [b'-'; 36];
        // Digit runs of 8-4-4-4-12, each after the dash that ends the previous one.
        for (from, to, at) in [
            (0, 8, 0),
            (8, 12, 9),
            (12, 16, 14),
            (16, 20, 19),
            (20, 32, 24),
        ] {
            out[at..at + (to - from)].copy_from_slice(&hex[from..to]);
        }
        out
    }
}

impl std::fmt::Display for MessageId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = self.text();
        f.write_str(std::str::from_utf8(&text).expect("hex digits and dashes are ASCII"))
    }
}

/// The immutable content of a message, shared by the record, the in-memory state and replies.
#[derive(Debug, Clone)]
pub struct Payload {
    pub body: String,
    pub attributes: Vec<MessageAttribute>,
    pub group_id: Option<String>,
    /// The effective deduplication id (explicit, or the SHA-256 of the body in hex).
    pub dedup_id: Option<String>,
    /// MD5OfMessageBody: computed at send (the reply carries it), else on first use. A
    /// replayed message gets it when it is first received, not during the replay: hashing
    /// every body on the log was 41% of a restart's CPU.
    md5_body: OnceLock<Md5Digest>,
    /// Derived from `attributes`.
    pub md5_attributes: Option<Md5Digest>,
}

/// Equal content; the digest is a function of the body, computed or not.
impl PartialEq for Payload {
    fn eq(&self, o: &Self) -> bool {
        self.body == o.body
            && self.attributes == o.attributes
            && self.group_id == o.group_id
            && self.dedup_id == o.dedup_id
            && self.md5_attributes == o.md5_attributes
    }
}

impl Eq for Payload {}

impl Payload {
    /// A payload whose body digest is computed on first use (replay).
    pub fn new(
        body: String,
        attributes: Vec<MessageAttribute>,
        group_id: Option<String>,
        dedup_id: Option<String>,
    ) -> Self {
        Payload {
            md5_attributes: md5_of_attributes(&attributes),
            md5_body: OnceLock::new(),
            body,
            attributes,
            group_id,
            dedup_id,
        }
    }

    /// As [`Payload::new`], with the body's digest already computed (`md5_of_body(body)`).
    pub fn with_md5_body(
        body: String,
        md5_body: Md5Digest,
        attributes: Vec<MessageAttribute>,
        group_id: Option<String>,
        dedup_id: Option<String>,
    ) -> Self {
        debug_assert_eq!(md5_body, md5_of_body(body.as_bytes()));
        let p = Self::new(body, attributes, group_id, dedup_id);
        let _ = p.md5_body.set(md5_body);
        p
    }

    /// MD5OfMessageBody.
    pub fn md5_body(&self) -> Md5Digest {
        *self
            .md5_body
            .get_or_init(|| md5_of_body(self.body.as_bytes()))
    }

    /// Computes the body digests the payloads do not have yet, side by side in vector lanes (a
    /// receive of replayed messages).
    pub fn fill_md5_bodies<'a>(payloads: impl IntoIterator<Item = &'a Payload>) {
        let missing: Vec<&Payload> = payloads
            .into_iter()
            .filter(|p| p.md5_body.get().is_none())
            .collect();
        if missing.len() < 2 {
            return;
        }
        let bodies: Vec<&[u8]> = missing.iter().map(|p| p.body.as_bytes()).collect();
        for (p, d) in missing.iter().zip(md5_of_bodies(&bodies)) {
            let _ = p.md5_body.set(d);
        }
    }

    /// Bytes the message counts against MaximumMessageSize.
    pub fn size_bytes(&self) -> usize {
        self.body.len()
            + self
                .attributes
                .iter()
                .map(|a| a.size_bytes())
                .sum::<usize>()
    }
}

/// Where a dead-lettered message came from; makes the DLQ side of a move idempotent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MoveOrigin {
    pub queue_id: u64,
    pub partition: u32,
    pub msg_id: u64,
    /// The original send time: retention in the DLQ counts from it, as SQS does.
    pub sent_ms: u64,
}

/// Where a started move goes; durable in `DlqMoveStarted`, so that after a restart
/// `pending_moves()` still knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MoveDestination {
    /// The dead-letter queue of this queue's redrive policy (a message past maxReceiveCount).
    RedriveTarget,
    /// Redrive: back to the queue the message was dead-lettered from (its [`MoveOrigin`]).
    DeadLetterSource,
    /// Redrive to an explicit queue.
    Queue(u64),
}

impl MoveDestination {
    /// A redrive (StartMessageMoveTask) rather than a dead-letter move: the arriving copy is a
    /// fresh message, not a dead letter.
    pub fn is_redrive(self) -> bool {
        self != MoveDestination::RedriveTarget
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub id: u64,
    pub message_id: MessageId,
    pub visible_at_ms: u64,
    pub payload: Arc<Payload>,
    /// Set when the message arrived by a move: the idempotency key of the move.
    pub origin: Option<MoveOrigin>,
    /// The move was a redrive out of a dead-letter queue: `origin` names the DLQ message and is
    /// only an idempotency key; the message starts afresh here (its retention counts from this
    /// record, and it has no dead-letter source). Needs `origin`.
    pub redriven: bool,
}

/// The non-message state of a partition at one point of its log: a base from which replay can
/// start without the records before it (see `Partition::compaction_floor`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// Ids below it were used: never reused, whatever was compacted away.
    pub next_id: u64,
    pub receive_seq: u64,
    pub retention_ms: u64,
    pub dedup_scope: DedupScope,
    pub last_purge_ms: Option<u64>,
    /// The lowest log offset of a `Sent` record of a message live here (this record's own
    /// offset when none is): replay from at or below it knows every message live here.
    pub live_floor: u64,
    /// Messages live here (a replay that knows them all checks its count against it).
    pub live_count: u64,
    /// Every group with messages here and its fairness key, sorted by name.
    pub groups: Vec<(String, u64)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordKind {
    Sent(Sent),
    /// A delivery: the new receive count is also the lease epoch. `at_ms` of the record is the
    /// lease start (and ApproximateFirstReceiveTimestamp when the count is 1).
    Received {
        id: u64,
        receive_count: u32,
        deadline_ms: u64,
        attempt_id: Option<String>,
        /// The first delivery of one ReceiveMessage call (starts a new attempt-id entry).
        batch_start: bool,
    },
    /// A new deadline for the current lease; `attempt_retry` marks a ReceiveRequestAttemptId
    /// retry (which keeps the attempt cache valid) as opposed to ChangeMessageVisibility.
    VisibilityChanged {
        id: u64,
        epoch: u32,
        deadline_ms: u64,
        attempt_retry: bool,
    },
    Deleted {
        id: u64,
    },
    /// Every message with an id below `before_id` is gone, except those being moved to the DLQ.
    Purged {
        before_id: u64,
    },
    /// The message leaves this partition for `destination`; it is never delivered from here
    /// again.
    DlqMoveStarted {
        id: u64,
        destination: MoveDestination,
    },
    DlqMoveDone {
        id: u64,
    },
    /// The settings replay depends on (retention expiry, dedup keys), at the point they changed.
    Configured {
        retention_s: u32,
        dedup_scope: DedupScope,
    },
    Checkpoint(Box<Checkpoint>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The engine's clock when the record was made (monotonic per partition).
    pub at_ms: u64,
    pub kind: RecordKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum DecodeError {
    #[error("record truncated")]
    Truncated,
    #[error("unknown record format version {0}")]
    UnknownVersion(u8),
    #[error("unknown record kind {0}")]
    UnknownKind(u8),
    #[error("invalid record: {0}")]
    Invalid(&'static str),
    #[error("trailing bytes after record")]
    TrailingBytes,
}

const KIND_SENT: u8 = 1;
const KIND_RECEIVED: u8 = 2;
const KIND_VISIBILITY: u8 = 3;
const KIND_DELETED: u8 = 4;
const KIND_PURGED: u8 = 5;
const KIND_MOVE_STARTED: u8 = 6;
const KIND_MOVE_DONE: u8 = 7;
const KIND_CONFIGURED: u8 = 8;
const KIND_CHECKPOINT: u8 = 9;

const SENT_HAS_GROUP: u8 = 1;
const SENT_HAS_DEDUP: u8 = 2;
const SENT_HAS_ORIGIN: u8 = 4;
const SENT_REDRIVEN: u8 = 8;
const SENT_HAS_MD5: u8 = 16;
const DEST_REDRIVE_TARGET: u8 = 0;
const DEST_DEAD_LETTER_SOURCE: u8 = 1;
const DEST_QUEUE: u8 = 2;
const CHECKPOINT_HAS_PURGE: u8 = 1;
/// Bytes of one checkpoint group entry besides its name (length prefix + fairness key).
const CHECKPOINT_GROUP_FIXED_BYTES: usize = 2 + 8;
const RECEIVED_HAS_ATTEMPT: u8 = 1;
const RECEIVED_BATCH_START: u8 = 2;
const TRANSPORT_STRING: u8 = 1;
const TRANSPORT_BINARY: u8 = 2;

impl Record {
    /// The message this record is about, for the kinds that name one already sent here.
    pub fn message(&self) -> Option<u64> {
        match &self.kind {
            RecordKind::Received { id, .. }
            | RecordKind::VisibilityChanged { id, .. }
            | RecordKind::Deleted { id }
            | RecordKind::DlqMoveStarted { id, .. }
            | RecordKind::DlqMoveDone { id } => Some(*id),
            _ => None,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len_hint());
        self.encode_into(&mut out);
        out
    }

    /// About the bytes [`encode_into`](Self::encode_into) writes (to size buffers up front).
    pub fn encoded_len_hint(&self) -> usize {
        match &self.kind {
            RecordKind::Sent(s) => 64 + s.payload.size_bytes() + 16 * s.payload.attributes.len(),
            RecordKind::Checkpoint(c) => {
                64 + c
                    .groups
                    .iter()
                    .map(|(g, _)| g.len() + CHECKPOINT_GROUP_FIXED_BYTES)
                    .sum::<usize>()
            }
            _ => 40,
        }
    }

    /// The lowest format version that can express this record.
    pub fn format_version(&self) -> u8 {
        let v2 = match &self.kind {
            RecordKind::Sent(s) if s.payload.md5_body.get().is_some() => {
                return RECORD_FORMAT_VERSION
            }
            RecordKind::Sent(s) => s.redriven,
            RecordKind::DlqMoveStarted { destination, .. } => destination.is_redrive(),
            RecordKind::Checkpoint(_) => true,
            _ => false,
        };
        if v2 {
            RECORD_FORMAT_V2
        } else {
            RECORD_FORMAT_V1
        }
    }

    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let version = self.format_version();
        out.push(version);
        let kind = match &self.kind {
            RecordKind::Sent(_) => KIND_SENT,
            RecordKind::Received { .. } => KIND_RECEIVED,
            RecordKind::VisibilityChanged { .. } => KIND_VISIBILITY,
            RecordKind::Deleted { .. } => KIND_DELETED,
            RecordKind::Purged { .. } => KIND_PURGED,
            RecordKind::DlqMoveStarted { .. } => KIND_MOVE_STARTED,
            RecordKind::DlqMoveDone { .. } => KIND_MOVE_DONE,
            RecordKind::Configured { .. } => KIND_CONFIGURED,
            RecordKind::Checkpoint(_) => KIND_CHECKPOINT,
        };
        out.push(kind);
        out.extend_from_slice(&self.at_ms.to_le_bytes());
        match &self.kind {
            RecordKind::Sent(s) => {
                out.extend_from_slice(&s.id.to_le_bytes());
                out.extend_from_slice(&s.message_id.0);
                out.extend_from_slice(&s.visible_at_ms.to_le_bytes());
                let p = &s.payload;
                let mut flags = 0;
                if p.group_id.is_some() {
                    flags |= SENT_HAS_GROUP;
                }
                if p.dedup_id.is_some() {
                    flags |= SENT_HAS_DEDUP;
                }
                if s.origin.is_some() {
                    flags |= SENT_HAS_ORIGIN;
                }
                if s.redriven {
                    flags |= SENT_REDRIVEN;
                }
                let md5 = p.md5_body.get();
                if md5.is_some() {
                    flags |= SENT_HAS_MD5;
                }
                out.push(flags);
                if let Some(g) = &p.group_id {
                    put_str16(out, g);
                }
                if let Some(d) = &p.dedup_id {
                    put_str16(out, d);
                }
                if let Some(o) = &s.origin {
                    out.extend_from_slice(&o.queue_id.to_le_bytes());
                    out.extend_from_slice(&o.partition.to_le_bytes());
                    out.extend_from_slice(&o.msg_id.to_le_bytes());
                    out.extend_from_slice(&o.sent_ms.to_le_bytes());
                }
                if let Some(d) = md5 {
                    out.extend_from_slice(&d.0);
                }
                put_bytes32(out, p.body.as_bytes());
                out.push(u8::try_from(p.attributes.len()).expect("at most 10 attributes"));
                for a in &p.attributes {
                    put_str16(out, &a.name);
                    put_str16(out, &a.data_type);
                    match &a.value {
                        AttributeValue::String(v) => {
                            out.push(TRANSPORT_STRING);
                            put_bytes32(out, v.as_bytes());
                        }
                        AttributeValue::Binary(v) => {
                            out.push(TRANSPORT_BINARY);
                            put_bytes32(out, v);
                        }
                    }
                }
            }
            RecordKind::Received {
                id,
                receive_count,
                deadline_ms,
                attempt_id,
                batch_start,
            } => {
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(&receive_count.to_le_bytes());
                out.extend_from_slice(&deadline_ms.to_le_bytes());
                let start = if *batch_start {
                    RECEIVED_BATCH_START
                } else {
                    0
                };
                match attempt_id {
                    Some(a) => {
                        out.push(RECEIVED_HAS_ATTEMPT | start);
                        put_str16(out, a);
                    }
                    None => out.push(start),
                }
            }
            RecordKind::VisibilityChanged {
                id,
                epoch,
                deadline_ms,
                attempt_retry,
            } => {
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(&epoch.to_le_bytes());
                out.extend_from_slice(&deadline_ms.to_le_bytes());
                out.push(u8::from(*attempt_retry));
            }
            RecordKind::Deleted { id } | RecordKind::DlqMoveDone { id } => {
                out.extend_from_slice(&id.to_le_bytes())
            }
            RecordKind::DlqMoveStarted { id, destination } => {
                out.extend_from_slice(&id.to_le_bytes());
                if version >= RECORD_FORMAT_V2 {
                    match destination {
                        MoveDestination::RedriveTarget => out.push(DEST_REDRIVE_TARGET),
                        MoveDestination::DeadLetterSource => out.push(DEST_DEAD_LETTER_SOURCE),
                        MoveDestination::Queue(q) => {
                            out.push(DEST_QUEUE);
                            out.extend_from_slice(&q.to_le_bytes());
                        }
                    }
                }
            }
            RecordKind::Purged { before_id } => out.extend_from_slice(&before_id.to_le_bytes()),
            RecordKind::Configured {
                retention_s,
                dedup_scope,
            } => {
                out.extend_from_slice(&retention_s.to_le_bytes());
                out.push(scope_byte(*dedup_scope));
            }
            RecordKind::Checkpoint(c) => {
                out.extend_from_slice(&c.next_id.to_le_bytes());
                out.extend_from_slice(&c.receive_seq.to_le_bytes());
                out.extend_from_slice(&c.retention_ms.to_le_bytes());
                out.push(scope_byte(c.dedup_scope));
                match c.last_purge_ms {
                    Some(t) => {
                        out.push(CHECKPOINT_HAS_PURGE);
                        out.extend_from_slice(&t.to_le_bytes());
                    }
                    None => out.push(0),
                }
                out.extend_from_slice(&c.live_floor.to_le_bytes());
                out.extend_from_slice(&c.live_count.to_le_bytes());
                let n = u32::try_from(c.groups.len()).expect("groups are bounded by messages");
                out.extend_from_slice(&n.to_le_bytes());
                for (name, last_served) in &c.groups {
                    put_str16(out, name);
                    out.extend_from_slice(&last_served.to_le_bytes());
                }
            }
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<Record, DecodeError> {
        Self::decode_with(bytes, true)
    }

    /// [`Record::decode`] for a replay: a `Sent` comes without its content (an empty body, no
    /// attributes), which the state never holds (ARCHITECTURE.md); the rest is the same, and
    /// the content's framing is still checked. Copying and checking every body made most of a
    /// replay's CPU. Such a record must not be delivered.
    pub fn decode_without_content(bytes: &[u8]) -> Result<Record, DecodeError> {
        Self::decode_with(bytes, false)
    }

    fn decode_with(bytes: &[u8], content: bool) -> Result<Record, DecodeError> {
        let mut c = Cursor { b: bytes };
        let version = c.u8()?;
        if !(RECORD_FORMAT_V1..=RECORD_FORMAT_VERSION).contains(&version) {
            return Err(DecodeError::UnknownVersion(version));
        }
        let v2 = version >= RECORD_FORMAT_V2;
        let v3 = version >= RECORD_FORMAT_VERSION;
        let kind = c.u8()?;
        let at_ms = c.u64()?;
        let kind = match kind {
            KIND_SENT => {
                let id = c.u64()?;
                let message_id = MessageId(c.array16()?);
                let visible_at_ms = c.u64()?;
                let flags = c.u8()?;
                let known = SENT_HAS_GROUP
                    | SENT_HAS_DEDUP
                    | SENT_HAS_ORIGIN
                    | if v2 { SENT_REDRIVEN } else { 0 }
                    | if v3 { SENT_HAS_MD5 } else { 0 };
                if flags & !known != 0 {
                    return Err(DecodeError::Invalid("unknown Sent flags"));
                }
                let redriven = flags & SENT_REDRIVEN != 0;
                if redriven && flags & SENT_HAS_ORIGIN == 0 {
                    return Err(DecodeError::Invalid("redriven Sent without an origin"));
                }
                let group_id = if flags & SENT_HAS_GROUP != 0 {
                    Some(c.str16()?)
                } else {
                    None
                };
                let dedup_id = if flags & SENT_HAS_DEDUP != 0 {
                    Some(c.str16()?)
                } else {
                    None
                };
                let origin = if flags & SENT_HAS_ORIGIN != 0 {
                    Some(MoveOrigin {
                        queue_id: c.u64()?,
                        partition: c.u32()?,
                        msg_id: c.u64()?,
                        sent_ms: c.u64()?,
                    })
                } else {
                    None
                };
                let md5_body = if flags & SENT_HAS_MD5 != 0 {
                    Some(Md5Digest(c.array16()?))
                } else {
                    None
                };
                let body = if content {
                    c.str32()?
                } else {
                    c.bytes32()?;
                    String::new()
                };
                let n = usize::from(c.u8()?);
                if n > MESSAGE_ATTRIBUTES_MAX {
                    return Err(DecodeError::Invalid("too many attributes"));
                }
                let mut attributes = Vec::with_capacity(if content { n } else { 0 });
                for _ in 0..n {
                    if !content {
                        c.bytes16()?;
                        c.bytes16()?;
                        match c.u8()? {
                            TRANSPORT_STRING | TRANSPORT_BINARY => c.bytes32()?,
                            _ => return Err(DecodeError::Invalid("unknown attribute transport")),
                        };
                        continue;
                    }
                    let name = c.str16()?;
                    let data_type = c.str16()?;
                    let value = match c.u8()? {
                        TRANSPORT_STRING => AttributeValue::String(c.str32()?),
                        TRANSPORT_BINARY => AttributeValue::Binary(c.bytes32()?.to_vec()),
                        _ => return Err(DecodeError::Invalid("unknown attribute transport")),
                    };
                    attributes.push(MessageAttribute {
                        name,
                        data_type,
                        value,
                    });
                }
                RecordKind::Sent(Sent {
                    id,
                    message_id,
                    visible_at_ms,
                    payload: Arc::new({
                        let p = Payload::new(body, attributes, group_id, dedup_id);
                        // As written: the batch checksum covers it (not re-hashed here, on the
                        // receive path; the model test compares it with the body's).
                        if let Some(d) = md5_body {
                            let _ = p.md5_body.set(d);
                        }
                        p
                    }),
                    origin,
                    redriven,
                })
            }
            KIND_RECEIVED => {
                let id = c.u64()?;
                let receive_count = c.u32()?;
                let deadline_ms = c.u64()?;
                let flags = c.u8()?;
                if flags & !(RECEIVED_HAS_ATTEMPT | RECEIVED_BATCH_START) != 0 {
                    return Err(DecodeError::Invalid("unknown Received flags"));
                }
                let attempt_id = if flags & RECEIVED_HAS_ATTEMPT != 0 {
                    Some(c.str16()?)
                } else {
                    None
                };
                RecordKind::Received {
                    id,
                    receive_count,
                    deadline_ms,
                    attempt_id,
                    batch_start: flags & RECEIVED_BATCH_START != 0,
                }
            }
            KIND_VISIBILITY => {
                let id = c.u64()?;
                let epoch = c.u32()?;
                let deadline_ms = c.u64()?;
                let attempt_retry = match c.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err(DecodeError::Invalid("unknown VisibilityChanged flags")),
                };
                RecordKind::VisibilityChanged {
                    id,
                    epoch,
                    deadline_ms,
                    attempt_retry,
                }
            }
            KIND_DELETED => RecordKind::Deleted { id: c.u64()? },
            KIND_PURGED => RecordKind::Purged {
                before_id: c.u64()?,
            },
            KIND_MOVE_STARTED => {
                let id = c.u64()?;
                let destination = if v2 {
                    match c.u8()? {
                        DEST_REDRIVE_TARGET => MoveDestination::RedriveTarget,
                        DEST_DEAD_LETTER_SOURCE => MoveDestination::DeadLetterSource,
                        DEST_QUEUE => MoveDestination::Queue(c.u64()?),
                        _ => return Err(DecodeError::Invalid("unknown move destination")),
                    }
                } else {
                    MoveDestination::RedriveTarget
                };
                RecordKind::DlqMoveStarted { id, destination }
            }
            KIND_MOVE_DONE => RecordKind::DlqMoveDone { id: c.u64()? },
            KIND_CONFIGURED => {
                let retention_s = c.u32()?;
                let dedup_scope = c.scope()?;
                RecordKind::Configured {
                    retention_s,
                    dedup_scope,
                }
            }
            KIND_CHECKPOINT if v2 => {
                let next_id = c.u64()?;
                let receive_seq = c.u64()?;
                let retention_ms = c.u64()?;
                let dedup_scope = c.scope()?;
                let last_purge_ms = match c.u8()? {
                    0 => None,
                    CHECKPOINT_HAS_PURGE => Some(c.u64()?),
                    _ => return Err(DecodeError::Invalid("unknown Checkpoint flags")),
                };
                let live_floor = c.u64()?;
                let live_count = c.u64()?;
                let n = usize::try_from(c.u32()?).map_err(|_| DecodeError::Truncated)?;
                // Each entry takes at least its fixed bytes: check before allocating.
                if n.saturating_mul(CHECKPOINT_GROUP_FIXED_BYTES) > c.b.len() {
                    return Err(DecodeError::Truncated);
                }
                let mut groups = Vec::with_capacity(n);
                for _ in 0..n {
                    let name = c.str16()?;
                    groups.push((name, c.u64()?));
                }
                RecordKind::Checkpoint(Box::new(Checkpoint {
                    next_id,
                    receive_seq,
                    retention_ms,
                    dedup_scope,
                    last_purge_ms,
                    live_floor,
                    live_count,
                    groups,
                }))
            }
            k => return Err(DecodeError::UnknownKind(k)),
        };
        if !c.b.is_empty() {
            return Err(DecodeError::TrailingBytes);
        }
        Ok(Record { at_ms, kind })
    }
}

fn scope_byte(s: DedupScope) -> u8 {
    match s {
        DedupScope::Queue => 0,
        DedupScope::MessageGroup => 1,
    }
}

fn put_str16(out: &mut Vec<u8>, s: &str) {
    // Tokens, names and data types are validated to ≤ 256 bytes at the edge.
    let len = u16::try_from(s.len()).expect("token below 64 KiB");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_bytes32(out: &mut Vec<u8>, b: &[u8]) {
    let len = u32::try_from(b.len()).expect("message part below 4 GiB");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(b);
}

struct Cursor<'a> {
    b: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.b.len() < n {
            return Err(DecodeError::Truncated);
        }
        let (head, tail) = self.b.split_at(n);
        self.b = tail;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        let mut a = [0; 2];
        a.copy_from_slice(self.take(2)?);
        Ok(u16::from_le_bytes(a))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        let mut a = [0; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        let mut a = [0; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn array16(&mut self) -> Result<[u8; 16], DecodeError> {
        let mut a = [0; 16];
        a.copy_from_slice(self.take(16)?);
        Ok(a)
    }
    fn str16(&mut self) -> Result<String, DecodeError> {
        utf8(self.bytes16()?)
    }
    fn bytes16(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = usize::from(self.u16()?);
        self.take(n)
    }
    fn bytes32(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = usize::try_from(self.u32()?).map_err(|_| DecodeError::Truncated)?;
        // `take` checks `n` against what is left before anything is allocated.
        self.take(n)
    }
    fn scope(&mut self) -> Result<DedupScope, DecodeError> {
        match self.u8()? {
            0 => Ok(DedupScope::Queue),
            1 => Ok(DedupScope::MessageGroup),
            _ => Err(DecodeError::Invalid("unknown dedup scope")),
        }
    }
    fn str32(&mut self) -> Result<String, DecodeError> {
        let b = self.bytes32()?;
        utf8(b)
    }
}

fn utf8(b: &[u8]) -> Result<String, DecodeError> {
    std::str::from_utf8(b)
        .map(str::to_owned)
        .map_err(|_| DecodeError::Invalid("string is not UTF-8"))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    fn token() -> impl Strategy<Value = String> {
        "[a-zA-Z0-9!#-]{1,20}"
    }

    fn attribute() -> impl Strategy<Value = MessageAttribute> {
        (
            "[a-z]{1,8}",
            prop_oneof![Just("String"), Just("Number.x"), Just("Binary")],
            any::<Vec<u8>>(),
            ".{1,8}",
        )
            .prop_map(|(name, ty, bin, s)| MessageAttribute {
                name,
                data_type: ty.to_string(),
                value: if ty == "Binary" {
                    AttributeValue::Binary(bin)
                } else {
                    AttributeValue::String(s)
                },
            })
    }

    pub(crate) fn any_record() -> impl Strategy<Value = Record> {
        let sent = (
            any::<u64>(),
            any::<[u8; 16]>(),
            any::<u64>(),
            ".{0,40}",
            proptest::collection::vec(attribute(), 0..=10),
            proptest::option::of(token()),
            proptest::option::of(token()),
            proptest::option::of((any::<u64>(), any::<u32>(), any::<u64>(), any::<u64>())),
            any::<bool>(),
        )
            .prop_map(|(id, mid, vis, body, attrs, g, d, o, redriven)| {
                RecordKind::Sent(Sent {
                    id,
                    message_id: MessageId(mid),
                    visible_at_ms: vis,
                    payload: Arc::new(Payload::new(body, attrs, g, d)),
                    origin: o.map(|(queue_id, partition, msg_id, sent_ms)| MoveOrigin {
                        queue_id,
                        partition,
                        msg_id,
                        sent_ms,
                    }),
                    redriven: redriven && o.is_some(),
                })
            });
        let destination = prop_oneof![
            Just(MoveDestination::RedriveTarget),
            Just(MoveDestination::DeadLetterSource),
            any::<u64>().prop_map(MoveDestination::Queue),
        ];
        let checkpoint = (
            any::<[u64; 6]>(),
            any::<bool>(),
            proptest::option::of(any::<u64>()),
            proptest::collection::vec((token(), any::<u64>()), 0..5),
        )
            .prop_map(|(n, g, last_purge_ms, groups)| {
                RecordKind::Checkpoint(Box::new(Checkpoint {
                    next_id: n[0],
                    receive_seq: n[1],
                    retention_ms: n[2],
                    dedup_scope: if g {
                        DedupScope::MessageGroup
                    } else {
                        DedupScope::Queue
                    },
                    last_purge_ms,
                    live_floor: n[4],
                    live_count: n[5],
                    groups,
                }))
            });
        let kind = prop_oneof![
            sent,
            (
                any::<u64>(),
                any::<u32>(),
                any::<u64>(),
                proptest::option::of(token()),
                any::<bool>(),
            )
                .prop_map(
                    |(id, receive_count, deadline_ms, attempt_id, batch_start)| {
                        RecordKind::Received {
                            id,
                            receive_count,
                            deadline_ms,
                            attempt_id,
                            batch_start,
                        }
                    }
                ),
            (any::<u64>(), any::<u32>(), any::<u64>(), any::<bool>()).prop_map(
                |(id, epoch, deadline_ms, attempt_retry)| RecordKind::VisibilityChanged {
                    id,
                    epoch,
                    deadline_ms,
                    attempt_retry
                }
            ),
            any::<u64>().prop_map(|id| RecordKind::Deleted { id }),
            any::<u64>().prop_map(|before_id| RecordKind::Purged { before_id }),
            (any::<u64>(), destination)
                .prop_map(|(id, destination)| RecordKind::DlqMoveStarted { id, destination }),
            checkpoint,
            any::<u64>().prop_map(|id| RecordKind::DlqMoveDone { id }),
            (any::<u32>(), any::<bool>()).prop_map(|(retention_s, g)| RecordKind::Configured {
                retention_s,
                dedup_scope: if g {
                    DedupScope::MessageGroup
                } else {
                    DedupScope::Queue
                }
            }),
        ];
        (any::<u64>(), kind).prop_map(|(at_ms, kind)| Record { at_ms, kind })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn round_trip(r in any_record()) {
            let bytes = r.encode();
            prop_assert_eq!(Record::decode(&bytes), Ok(r));
        }

        #[test]
        fn a_replay_decode_is_the_record_without_its_content(r in any_record()) {
            let bytes = r.encode();
            let mut want = r.clone();
            if let RecordKind::Sent(s) = &mut want.kind {
                let p = &s.payload;
                s.payload = Arc::new(Payload::new(
                    String::new(),
                    Vec::new(),
                    p.group_id.clone(),
                    p.dedup_id.clone(),
                ));
            }
            prop_assert_eq!(Record::decode_without_content(&bytes), Ok(want));
            for n in 0..bytes.len() {
                prop_assert!(Record::decode_without_content(&bytes[..n]).is_err());
            }
        }

        #[test]
        fn every_truncation_is_an_error(r in any_record()) {
            let bytes = r.encode();
            for n in 0..bytes.len() {
                prop_assert!(Record::decode(&bytes[..n]).is_err());
            }
            let mut longer = bytes.clone();
            longer.push(0);
            prop_assert_eq!(Record::decode(&longer), Err(DecodeError::TrailingBytes));
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Record::decode(&bytes);
            let _ = Record::decode_without_content(&bytes);
        }

        #[test]
        fn corrupted_records_never_panic(r in any_record(), i in any::<usize>(), x in 1..=255u8) {
            let mut bytes = r.encode();
            let i = i % bytes.len();
            bytes[i] ^= x;
            let _ = Record::decode(&bytes);
        }
    }

    /// A replayed message without a digest in its record (written before version 3) gets it on
    /// first use (not during the replay), alone or several at a time for a receive, and it is
    /// the body's MD5 either way.
    #[test]
    fn replayed_payloads_get_their_body_digest_on_first_use() {
        let payloads: Vec<Payload> = (0..6)
            .map(|i| {
                let sent = Record {
                    at_ms: 1,
                    kind: RecordKind::Sent(Sent {
                        id: i,
                        message_id: MessageId([0; 16]),
                        visible_at_ms: 1,
                        // Written before version 3: no digest in the record.
                        payload: Arc::new(Payload::new(
                            "x".repeat(100 * i as usize),
                            Vec::new(),
                            None,
                            None,
                        )),
                        origin: None,
                        redriven: false,
                    }),
                };
                match Record::decode(&sent.encode()).expect("decodes").kind {
                    RecordKind::Sent(s) => Arc::unwrap_or_clone(s.payload),
                    other => panic!("decoded {other:?}"),
                }
            })
            .collect();
        assert!(payloads.iter().all(|p| p.md5_body.get().is_none()));
        // One alone, then the rest together (one already has it).
        assert_eq!(
            payloads[2].md5_body(),
            md5_of_body(payloads[2].body.as_bytes())
        );
        Payload::fill_md5_bodies(&payloads);
        for p in &payloads {
            assert_eq!(p.md5_body.get(), Some(&md5_of_body(p.body.as_bytes())));
        }
        assert_eq!(
            payloads[0].md5_body().to_string(),
            "d41d8cd98f00b204e9800998ecf8427e"
        );
    }

    #[test]
    fn version_and_kind_are_checked() {
        let r = Record {
            at_ms: 5,
            kind: RecordKind::Deleted { id: 9 },
        };
        let mut b = r.encode();
        assert_eq!(b.len(), 1 + 1 + 8 + 8);
        b[0] = RECORD_FORMAT_VERSION + 1;
        assert_eq!(
            Record::decode(&b),
            Err(DecodeError::UnknownVersion(RECORD_FORMAT_VERSION + 1))
        );
        b[0] = 1;
        b[1] = 99;
        assert_eq!(Record::decode(&b), Err(DecodeError::UnknownKind(99)));
    }

    /// Records written by format version 1 (before redrive and checkpoints) still decode, and
    /// records that need none of the new fields are still written byte for byte as version 1.
    #[test]
    fn version_1_records_still_decode_and_are_still_written() {
        let mut moved = vec![RECORD_FORMAT_V1, KIND_MOVE_STARTED];
        moved.extend_from_slice(&7u64.to_le_bytes());
        moved.extend_from_slice(&3u64.to_le_bytes());
        let r = Record {
            at_ms: 7,
            kind: RecordKind::DlqMoveStarted {
                id: 3,
                destination: MoveDestination::RedriveTarget,
            },
        };
        assert_eq!(Record::decode(&moved), Ok(r.clone()));
        assert_eq!(r.encode(), moved);
        // A version-1 Sent with an origin is a dead letter, not a redrive.
        let mut sent = vec![RECORD_FORMAT_V1, KIND_SENT];
        sent.extend_from_slice(&1u64.to_le_bytes()); // at_ms
        sent.extend_from_slice(&2u64.to_le_bytes()); // id
        sent.extend_from_slice(&[9; 16]);
        sent.extend_from_slice(&1u64.to_le_bytes()); // visible_at_ms
        sent.push(SENT_HAS_ORIGIN);
        for v in [4u64, 5, 6, 7] {
            if v == 5 {
                sent.extend_from_slice(&5u32.to_le_bytes());
            } else {
                sent.extend_from_slice(&v.to_le_bytes());
            }
        }
        sent.extend_from_slice(&1u32.to_le_bytes());
        sent.push(b'x');
        sent.push(0);
        let d = Record::decode(&sent).expect("v1 Sent decodes");
        let RecordKind::Sent(s) = &d.kind else {
            panic!("not a Sent: {d:?}")
        };
        assert!(!s.redriven);
        assert_eq!(s.origin.map(|o| (o.queue_id, o.msg_id)), Some((4, 6)));
        assert_eq!(d.encode(), sent);
        // Version-2 fields under a version-1 byte are rejected.
        let mut bad = sent.clone();
        bad[1 + 1 + 8 + 8 + 16 + 8] |= SENT_REDRIVEN;
        assert!(Record::decode(&bad).is_err());
        bad[0] = RECORD_FORMAT_VERSION;
        assert!(Record::decode(&bad).is_ok());
        let mut cp = vec![RECORD_FORMAT_V1, KIND_CHECKPOINT];
        cp.extend_from_slice(&[0; 60]);
        assert_eq!(
            Record::decode(&cp),
            Err(DecodeError::UnknownKind(KIND_CHECKPOINT))
        );
    }

    /// A live Sent carries its body's digest (version 3), so reading it back for a receive
    /// needs no hashing; a Sent without one is written as before; the flag needs version 3.
    #[test]
    fn version_3_sent_carries_the_body_digest() {
        let sent = |p: Payload| Record {
            at_ms: 1,
            kind: RecordKind::Sent(Sent {
                id: 0,
                message_id: MessageId([1; 16]),
                visible_at_ms: 1,
                payload: Arc::new(p),
                origin: None,
                redriven: false,
            }),
        };
        let md5 = md5_of_body(b"hello");
        let live = sent(Payload::with_md5_body(
            "hello".into(),
            md5,
            Vec::new(),
            None,
            None,
        ));
        let bytes = live.encode();
        assert_eq!(bytes[0], RECORD_FORMAT_VERSION);
        let back = Record::decode(&bytes).expect("v3 Sent decodes");
        let RecordKind::Sent(s) = &back.kind else {
            panic!("not a Sent: {back:?}")
        };
        assert_eq!(s.payload.md5_body.get(), Some(&md5), "read, not computed");
        assert_eq!(back, live);
        assert_eq!(back.encode(), bytes);
        let old = sent(Payload::new("hello".into(), Vec::new(), None, None));
        assert_eq!(old.encode()[0], RECORD_FORMAT_V1);
        let mut bad = bytes.clone();
        bad[0] = RECORD_FORMAT_V2;
        assert_eq!(
            Record::decode(&bad),
            Err(DecodeError::Invalid("unknown Sent flags"))
        );
    }

    #[test]
    fn huge_length_prefix_does_not_allocate() {
        // A Sent record whose body claims 4 GiB must fail as truncated, not try to allocate.
        let mut b = vec![RECORD_FORMAT_VERSION, KIND_SENT];
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(&[0; 16]);
        b.extend_from_slice(&0u64.to_le_bytes());
        b.push(0);
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(Record::decode(&b), Err(DecodeError::Truncated));
    }

    #[test]
    fn message_ids_are_distinct() {
        let mut seen = std::collections::HashSet::new();
        for q in 0..3u64 {
            for p in 0..3u32 {
                for id in [
                    0u64,
                    1,
                    2,
                    u32::MAX as u64,
                    1 << 32,
                    (1 << 32) + 1,
                    MSG_ID_MAX - 1,
                ] {
                    assert!(seen.insert(MessageId::derive(q, p, id)), "{q} {p} {id}");
                }
            }
        }
        assert_eq!(
            MessageId::derive(1, 2, 3).to_string(),
            "00000000-0000-0001-0002-000000000003"
        );
        let every_digit: [u8; 16] = std::array::from_fn(|i| ((i as u8) * 0x11) ^ 0x0f);
        assert_eq!(
            MessageId(every_digit).to_string(),
            every_digit
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    let dash = if matches!(i, 4 | 6 | 8 | 10) { "-" } else { "" };
                    format!("{dash}{b:02x}")
                })
                .collect::<String>()
        );
    }
}
