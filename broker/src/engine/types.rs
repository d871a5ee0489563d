//! The engine's requests, replies and effects: what the shard hands a [`Partition`] and what it
//! gets back (see `partition.rs` for how they are decided and applied). Plain data, no logic
//! beyond joining a decision with the content the shard read from the log.
//!
//! [`Partition`]: super::Partition

use std::sync::Arc;

use thiserror::Error;

use super::attributes::{MessageAttribute, QueueAttributes};
use super::error::EngineError;
use super::md5::Md5Digest;
use super::receipt::Receipt;
use super::record::{MessageId, MoveDestination, MoveOrigin, Payload, Record};

/// A SendMessage as the engine needs it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SendRequest {
    pub body: String,
    pub attributes: Vec<MessageAttribute>,
    pub delay_s: Option<u32>,
    pub group_id: Option<String>,
    pub dedup_id: Option<String>,
}

/// One entry of a SendMessageBatch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchEntry {
    pub id: String,
    pub request: SendRequest,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiveRequest {
    /// 1..=10.
    pub max_messages: u32,
    pub visibility_timeout_s: Option<u32>,
    /// FIFO only (ignored on standard queues, as SQS does).
    pub attempt_id: Option<String>,
}

/// A move the engine started ([`Effects::moves`], [`Partition::pending_moves`]): everything but
/// the message's content, which lives in its `Sent` record at `sent_offset` in this partition's
/// log. The shard reads it from there and forwards [`MoveStart::with_payload`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoveStart {
    pub origin: MoveOrigin,
    pub message_id: MessageId,
    /// Log offset of the message's `Sent` record (kept by compaction while the move is pending).
    pub sent_offset: u64,
    pub destination: MoveDestination,
    pub dead_letter_source: Option<MoveOrigin>,
}

impl MoveStart {
    /// The request to forward, with the content read from the `Sent` record at `sent_offset`.
    pub fn with_payload(self, payload: Arc<Payload>) -> MoveRequest {
        MoveRequest {
            origin: self.origin,
            message_id: self.message_id,
            payload,
            destination: self.destination,
            dead_letter_source: self.dead_letter_source,
        }
    }
}

/// A message leaving a partition: to its DLQ (past maxReceiveCount) or, by redrive, out of a
/// DLQ. The shard hands it to the destination's partition (`AcceptMove`), then completes it
/// here (`CompleteMove { msg_id: origin.msg_id }` on `origin.queue_id`/`origin.partition`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoveRequest {
    /// This partition and the message's id in it: the destination's idempotency key.
    pub origin: MoveOrigin,
    pub message_id: MessageId,
    pub payload: Arc<Payload>,
    pub destination: MoveDestination,
    /// Where the message was dead-lettered from, if it was (for `DeadLetterSource`: the queue
    /// to route to; `partition` is a hint, the destination may have been repartitioned).
    pub dead_letter_source: Option<MoveOrigin>,
}

impl MoveRequest {
    /// The queue this move goes to, when the request names it; `None` for `RedriveTarget`,
    /// which the shard resolves from the source queue's redrive policy.
    pub fn destination_queue(&self) -> Option<u64> {
        match self.destination {
            MoveDestination::RedriveTarget => None,
            MoveDestination::DeadLetterSource => self.dead_letter_source.map(|o| o.queue_id),
            MoveDestination::Queue(q) => Some(q),
        }
    }
}

/// StartMessageMoveTask, one step: start moving up to `max_messages` visible messages of this
/// partition, looking at messages from id `from_id` on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartMoves {
    /// 1..=[`MOVES_PER_COMMAND_MAX`].
    pub max_messages: u32,
    /// `DeadLetterSource` or `Queue(_)`; `RedriveTarget` is refused (it is the receive path's).
    pub destination: MoveDestination,
    /// 0 on the first step of a task, then the previous reply's `next_from_id`.
    pub from_id: u64,
}

/// What one StartMoves step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MovesStarted {
    /// Moves started (their `MoveRequest`s are in `Effects::moves`).
    pub started: u32,
    /// Visible messages left in place: `DeadLetterSource` asked for and the message has none
    /// (it was sent to this queue directly). FIFO: its group stays behind it, uncounted.
    pub skipped_no_destination: u32,
    /// `Some(id)`: more messages to look at; pass it as the next step's `from_id`. `None`: the
    /// scan reached the end of the partition.
    pub next_from_id: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Send(SendRequest),
    SendBatch(Vec<BatchEntry>),
    Receive(ReceiveRequest),
    Delete {
        receipt: Receipt,
    },
    /// DeleteMessageBatch's entries for this partition: one decision, one log batch; each
    /// entry succeeds or fails on its own, in order (a receipt repeated in the batch deletes
    /// once and succeeds twice, as a repeated DeleteMessage does).
    DeleteBatch(Vec<Receipt>),
    ChangeVisibility {
        receipt: Receipt,
        timeout_s: u32,
    },
    /// ChangeMessageVisibilityBatch's entries for this partition (receipt, timeout in
    /// seconds): one decision, one log batch; each entry succeeds or fails on its own, applied
    /// in order as that many ChangeMessageVisibility calls at the same instant would be.
    ChangeVisibilityBatch(Vec<(Receipt, u32)>),
    Purge,
    SetAttributes(Box<QueueAttributes>),
    /// DLQ side of a move (idempotent by origin).
    AcceptMove(MoveRequest),
    /// Source side: the DLQ has the message durably.
    CompleteMove {
        msg_id: u64,
    },
    /// Redrive (StartMessageMoveTask) step on a dead-letter queue's partition.
    StartMoves(StartMoves),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentReply {
    pub message_id: MessageId,
    /// FIFO only: strictly increasing within the partition (hence within each group).
    pub sequence_number: Option<u64>,
    pub md5_body: Md5Digest,
    pub md5_attributes: Option<Md5Digest>,
    /// A FIFO duplicate within the dedup window: nothing was stored.
    pub duplicate: bool,
}

/// One message a receive leased, as the engine decided it: everything but its content, which
/// the shard reads from the message's `Sent` record at `sent_offset` (durable before the
/// receive's own records, so readable once they are) and joins with [`Delivery::with_payload`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub receipt: Receipt,
    pub message_id: MessageId,
    /// Log offset of the message's `Sent` record (kept by compaction while the message lives).
    pub sent_offset: u64,
    pub sent_ms: u64,
    pub receive_count: u32,
    pub first_receive_ms: u64,
    pub sequence_number: Option<u64>,
    pub dead_letter_source: Option<MoveOrigin>,
}

impl Delivery {
    pub fn with_payload(self, payload: Arc<Payload>) -> Delivered {
        Delivered {
            receipt: self.receipt,
            message_id: self.message_id,
            payload,
            sent_ms: self.sent_ms,
            receive_count: self.receive_count,
            first_receive_ms: self.first_receive_ms,
            sequence_number: self.sequence_number,
            dead_letter_source: self.dead_letter_source,
        }
    }
}

/// One delivered message, content included: what the front ends render.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivered {
    pub receipt: Receipt,
    pub message_id: MessageId,
    pub payload: Arc<Payload>,
    pub sent_ms: u64,
    pub receive_count: u32,
    pub first_receive_ms: u64,
    pub sequence_number: Option<u64>,
    pub dead_letter_source: Option<MoveOrigin>,
}

/// A command's reply. The engine's carries [`Delivery`]s (no content); the shard's, what the
/// front ends get, [`Delivered`]s with their content read from the log
/// ([`Reply::map_received`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply<M = Delivered> {
    Sent(SentReply),
    SentBatch(Vec<(String, Result<SentReply, EngineError>)>),
    Received(Vec<M>),
    Deleted,
    /// One result per receipt of a [`Command::DeleteBatch`], in its order.
    DeletedBatch(Vec<Result<(), EngineError>>),
    VisibilityChanged,
    /// One result per entry of a [`Command::ChangeVisibilityBatch`], in its order.
    VisibilityChangedBatch(Vec<Result<(), EngineError>>),
    Purged,
    AttributesSet,
    MoveAccepted,
    MoveCompleted,
    MovesStarted(MovesStarted),
    /// `tick`: nothing to tell a client.
    None,
}

impl<M> Reply<M> {
    /// The same reply with its received messages replaced by `f(messages)`.
    pub fn map_received<N, E>(
        self,
        f: impl FnOnce(Vec<M>) -> Result<Vec<N>, E>,
    ) -> Result<Reply<N>, E> {
        Ok(match self {
            Reply::Received(v) => Reply::Received(f(v)?),
            Reply::Sent(s) => Reply::Sent(s),
            Reply::SentBatch(v) => Reply::SentBatch(v),
            Reply::Deleted => Reply::Deleted,
            Reply::DeletedBatch(v) => Reply::DeletedBatch(v),
            Reply::VisibilityChanged => Reply::VisibilityChanged,
            Reply::VisibilityChangedBatch(v) => Reply::VisibilityChangedBatch(v),
            Reply::Purged => Reply::Purged,
            Reply::AttributesSet => Reply::AttributesSet,
            Reply::MoveAccepted => Reply::MoveAccepted,
            Reply::MoveCompleted => Reply::MoveCompleted,
            Reply::MovesStarted(m) => Reply::MovesStarted(m),
            Reply::None => Reply::None,
        })
    }
}

/// What a command produced: `records` must be durable before `reply` is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effects {
    /// The log offset `records[0]` must land at (then consecutive, one storage record each).
    /// The shard checks it against where the batch was staged and, on a mismatch, treats the
    /// partition as broken (rebuild by replay): the engine's offsets feed `compaction_floor`.
    pub first_offset: u64,
    pub records: Vec<Record>,
    pub reply: Reply<Delivery>,
    /// DLQ moves to forward (their `DlqMoveStarted` is among `records`), once the shard has
    /// read their content from the log.
    pub moves: Vec<MoveStart>,
}

impl Effects {
    /// Effects without moves (`first_offset` is set by `execute`).
    pub(super) fn of(records: Vec<Record>, reply: Reply<Delivery>) -> Effects {
        Effects {
            first_offset: 0,
            records,
            reply,
            moves: Vec::new(),
        }
    }

    pub(super) fn reply(reply: Reply<Delivery>) -> Self {
        Effects::of(Vec::new(), reply)
    }
}

/// Approximate counters (ApproximateNumberOfMessages*), exact as of the last `advance`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub visible: u64,
    pub in_flight: u64,
    pub delayed: u64,
    /// Being moved to the DLQ (counted as not visible).
    pub moving: u64,
}

/// A record that does not fit the state it is replayed onto: the log is not this partition's.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("record does not apply at {at_ms}: {reason}")]
pub struct ReplayError {
    pub at_ms: u64,
    pub reason: &'static str,
}
