//! The sans-I/O queue engine: one partition of a queue as a deterministic state machine over its
//! log (ARCHITECTURE.md). Plain Rust — no runtime, no clock, no sockets: time is an argument.
//!
//! | module        | purpose                                                                |
//! |---------------|------------------------------------------------------------------------|
//! | `attributes`  | queue kinds and names, queue attributes (SQS ranges), message attributes, body rule |
//! | `error`       | `EngineError`, one variant per SQS error code                          |
//! | `md5`         | MD5OfMessageBody / MD5OfMessageAttributes, byte-exact                  |
//! | `md5_lanes`   | MD5 of up to 16 bodies at once (AVX2 or SSE2 lanes), for batches       |
//! | `receipt`     | unforgeable receipt handles (HMAC-SHA256, URL-safe base64)             |
//! | `record`      | the partition's log records and their versioned binary encoding        |
//! | `types`       | requests, replies and effects: what the shard gives and gets back      |
//! | `partition`   | the state machine: leases, FIFO groups, dedup, fair queues, DLQ moves; its state, with `apply`, `replay`, `decide` and `timers` beneath |
//! | `model`       | (tests) a simple reference model and the seeded randomized comparison  |
//! | `scenarios`   | (tests) one test per queue rule                                        |
//!
//! The shard's view: build a [`Partition`] per partition from a [`PartitionConfig`], rebuild it
//! with [`Partition::replay`] over the log, then for each request call
//! [`Partition::execute`]`(now_ms, Command)`, append `effects.records` (each
//! [`Record::encode`]d) and make them durable before sending `effects.reply`, and forward
//! `effects.moves` to the DLQ's partition (`Command::AcceptMove`, then `Command::CompleteMove`
//! back here). The engine holds no message content (ARCHITECTURE.md: the log holds the
//! messages): a receive's [`Delivery`]s and a [`MoveStart`] name the log offset of each
//! message's `Sent` record, and the shard reads the content from there
//! ([`Delivery::with_payload`], [`MoveStart::with_payload`]). Park until [`Partition::next_deadline_ms`] and call [`Partition::tick`]. Receipt
//! handles are encoded and verified at the edge with [`ReceiptCodec`]; the engine takes the
//! decoded [`Receipt`]. Errors map to SQS codes through [`EngineError::sqs_code`].
//!
//! Offsets and compaction (CONTRACT.md C8): rebuild with
//! [`Partition::replay_at`]`(offset, &record)` over what is left of the log, then
//! [`Partition::finish_replay`]`(log.end_offset())`. After staging
//! a batch, check `ticket.info.base_offset == effects.first_offset` (a mismatch is handled like
//! a failed commit: rebuild). Every so often delete the sealed segments that lie wholly below
//! [`Partition::compaction_floor`]. The engine writes the `Checkpoint` records that let the
//! floor move by itself (in `execute` every `checkpoint_interval_records`, in `tick` after
//! [`CHECKPOINT_INTERVAL_MS`](partition::CHECKPOINT_INTERVAL_MS)).
//!
//! Redrive (StartMessageMoveTask): run [`Command::StartMoves`] on each partition of the DLQ
//! with `from_id` 0, then the reply's `next_from_id`, until it is `None`, at most
//! `max_messages` per second; forward each returned move to
//! [`MoveRequest::destination_queue`] (`AcceptMove`), then `CompleteMove` back on the DLQ.
//!
//! Bench: `cargo bench -p sluice-broker --bench engine` prints engine CPU per message.

pub mod attributes;
pub mod error;
pub mod md5;
mod md5_lanes;
pub mod partition;
pub mod receipt;
pub mod record;
pub mod types;

#[cfg(test)]
pub(crate) mod model;
#[cfg(test)]
mod scenarios;

pub use error::{EngineError, SqsCode};
pub use partition::{
    BatchEntry, Command, Counters, Delivered, Delivery, Effects, Limits, MoveRequest, MoveStart,
    MovesStarted, Partition, PartitionConfig, ReceiveRequest, ReplayError, Reply, SendRequest,
    SentReply, StartMoves, MESSAGE_ENTRY_BYTES,
};
pub use receipt::{Receipt, ReceiptCodec};
pub use record::{MessageId, MoveDestination, MoveOrigin, Payload, Record, RecordKind};
