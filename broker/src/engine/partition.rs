//! One partition of a queue as a deterministic, sans-I/O state machine.
//!
//! # How the shard drives it
//!
//! ```text
//! let effects = partition.execute(now_ms, command)?;   // validates, decides, applies in memory
//! log.append(effects.records.iter().map(Record::encode)).await?;  // durable BEFORE the reply
//! reply(effects.reply);  forward(effects.moves);        // moves: DLQ transfers, see below
//! ...
//! park_until(partition.next_deadline_ms());  partition.tick(now_ms);
//! ```
//!
//! If the append fails, the shard throws the partition away and rebuilds it with
//! [`Partition::replay`] over the log: the in-memory change made by `execute` is then undone.
//!
//! # Layout (each layer uses only those above it in this list)
//!
//! * this file — the state: `Partition`'s fields, its entry types, limits, and pure reads of
//!   the state (`compaction_floor`, `dedup_hash`, `group_list`, counters, `dump`);
//! * `dedup` — the FIFO deduplication table (a self-contained structure: keys hashed to 96
//!   bits, entries in expiry order);
//! * `apply` — records → state, and the timer effects that need no record (`advance`): what a
//!   follower will run;
//! * `replay` — rebuilding from the log (and a compacted one) through `apply`;
//! * `decide` — validating commands and choosing their records (leader only), through `apply`;
//! * `timers` — `next_deadline_ms` and `tick` (a checkpoint after a quiet interval: `decide`).
//!
//! # Determinism
//!
//! Every change goes through one function, `apply(&Record)`, both live (right after a decision)
//! and on replay. Changes that need no record — a delay ending, a lease expiring, a message
//! passing its retention, a dedup or attempt-id entry ageing out — are pure functions of the
//! records and the clock, run by `advance(now)` from a timer heap; replay runs `advance(at_ms)`
//! before each record. Timer effects commute (each one re-checks the message's current state),
//! so live state and replayed state agree whatever the points at which time was advanced; the
//! randomized test in `model.rs` checks this byte for byte through [`Partition::dump`]. Fair
//! queueing is derived from records too (a per-group "last served" receive sequence number), so
//! it survives restarts.
//!
//! # Decisions (CONTRACT.md)
//!
//! * **Leases are durable.** A receive must record the new receive count anyway (C5,
//!   maxReceiveCount survives restarts), so the `Received` record also carries the lease
//!   deadline: leases, FIFO group locks and receipt handles survive restarts and failovers, at
//!   no extra append. The lease epoch *is* the receive count.
//! * **Stale handles (C6).** A handle names (message, epoch). ChangeMessageVisibility needs the
//!   current epoch and a live lease: an older handle gets `ReceiptHandleIsInvalid`, an expired
//!   lease `MessageNotInflight` — a stale handle can never change the current lease.
//!   DeleteMessage on a standard queue accepts any authentic handle of the message, as SQS does
//!   (deleting is what every holder wants, and an acknowledged delete then really deleted:
//!   C2). On a FIFO queue delete needs the current epoch and a live lease, else
//!   `ReceiptHandleIsInvalid`: after expiry the group may already be served to someone else. A
//!   delete of a message already gone succeeds (idempotent, as SQS); a delete of a message
//!   being dead-lettered fails, since it will be delivered again from the DLQ.
//! * **The 12-hour cap** counts from the receive that started the current lease (each receive
//!   restarts it); a ChangeMessageVisibility past it is `InvalidParameterValue`.
//! * **DLQ moves are two records and idempotent.** When a receive meets a message whose receive
//!   count has reached maxReceiveCount, it appends `DlqMoveStarted` instead of delivering it:
//!   from then on the message is never delivered from this partition, and it has left its FIFO
//!   group's order (the record precedes any later delivery of the same reply in the log, so the
//!   group's next message may go out at once). The shard forwards the [`MoveRequest`] to the DLQ partition, whose
//!   `AcceptMove` appends a `Sent` carrying the [`MoveOrigin`] and ignores an origin it has
//!   already accepted (kept for `MOVE_ORIGIN_WINDOW_MS`). Once that is durable the shard runs
//!   `CompleteMove` here, appending `DlqMoveDone`. After a crash, [`Partition::pending_moves`]
//!   lists the started moves to forward again. Whatever crashes when, the message ends in
//!   exactly one queue.
//! * **Content lives in the log only** (ARCHITECTURE.md). A message's entry holds what the
//!   decisions need (ids, times, receive count, lease, group, state) and the log offset of its
//!   `Sent` record; its body, attributes, group and dedup ids are read from that record where
//!   they are needed: by `apply` when the `Sent` is applied (group, dedup entry), and by the
//!   shard for what a receive hands out ([`Delivery::sent_offset`]) or a move forwards
//!   ([`MoveStart::sent_offset`]). Compaction keeps every live message's `Sent` (see
//!   `compaction_floor`), so the record is there as long as the entry is. A partition is
//!   bounded by its number of entries ([`Limits::message_entries_max`]), never by bytes.
//! * **Retention expiry is not recorded**: it is a function of the `Sent` timestamps, the
//!   retention in force (`Configured` and `Checkpoint` records) and the clock.
//! * **Redrive reuses the move protocol.** `StartMoves` marks visible messages `Moving` with a
//!   `DlqMoveStarted` that carries the destination (so `pending_moves` knows it after a
//!   restart). The copy arrives through `AcceptMove` as a *fresh* message: receive count 0,
//!   retention from its arrival, no dead-letter source (SQS does not show a redriven message
//!   as a dead letter of the DLQ); its MessageId and content are kept, and the origin (DLQ,
//!   partition, id) still makes the accept idempotent for `MOVE_ORIGIN_WINDOW_MS`.
//! * **Compaction.** Every record has a log offset. A `Checkpoint` record holds the state that
//!   is not per message (id and receive counters, settings, last purge, group fairness keys)
//!   plus the lowest `Sent` offset of the messages live at that point. `compaction_floor` is
//!   the latest checkpoint at or below every offset still needed; replay can start there. Until
//!   a checkpoint shows that every live message was replayed, records about ids sent before
//!   the start are skipped (their messages are all gone by then); after that, and for any id
//!   issued after the start, an unknown id is a `ReplayError`, and each checkpoint is checked
//!   against the replayed state.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::attributes::{
    validate_body, validate_message_attributes, validate_token, DedupScope, MessageAttribute,
    QueueAttributes, QueueKind, DELAY_S_MAX, VISIBILITY_TIMEOUT_S_MAX,
};
use super::error::EngineError;
use super::md5::{md5_of_bodies, md5_of_body, Md5Digest};
use super::receipt::Receipt;
use super::record::{
    Checkpoint, MessageId, MoveDestination, MoveOrigin, Payload, Record, RecordKind, Sent,
    MSG_ID_MAX, PARTITIONS_MAX,
};
pub use super::types::{
    BatchEntry, Command, Counters, Delivered, Delivery, Effects, MoveRequest, MoveStart,
    MovesStarted, ReceiveRequest, ReplayError, Reply, SendRequest, SentReply, StartMoves,
};

mod apply;
mod decide;
mod dedup;
mod replay;
mod snapshot;
mod timers;

pub use decide::validate_batch;
use dedup::{DedupEntry, DedupTable, DEDUP_TABLE_MAX};
pub use snapshot::{SnapshotError, SNAPSHOT_VERSION};

/// FIFO deduplication interval.
pub const DEDUP_WINDOW_MS: u64 = 5 * 60 * 1000;
/// How long a ReceiveRequestAttemptId can be retried.
pub const ATTEMPT_WINDOW_MS: u64 = 5 * 60 * 1000;
/// How long a DLQ partition remembers an accepted move origin (idempotent re-drives).
pub const MOVE_ORIGIN_WINDOW_MS: u64 = 60 * 60 * 1000;
/// SQS allows one PurgeQueue per 60 s.
pub const PURGE_INTERVAL_MS: u64 = 60 * 1000;
/// A lease can last at most 12 h from the receive that started it.
pub const LEASE_MS_MAX: u64 = VISIBILITY_TIMEOUT_S_MAX as u64 * 1000;
pub use sluice_wire::limits::RECEIVE_MESSAGES_MAX;
/// SQS's in-flight limit (standard: OverLimit; FIFO: empty receives). Applied per partition.
pub const INFLIGHT_MAX: u32 = 120_000;
pub use sluice_wire::limits::{BATCH_ENTRIES_MAX, BATCH_ENTRY_ID_LEN_MAX, BATCH_PAYLOAD_BYTES_MAX};
/// Moves one StartMoves command may start (SQS's MaxNumberOfMessagesPerSecond is at most 500;
/// the shard's redrive task asks for one second's worth at a time).
pub const MOVES_PER_COMMAND_MAX: u32 = 500;
/// Messages one StartMoves command looks at, moved or not: bounds its work when most messages
/// are in flight or blocked; the reply's cursor lets the next command go on from there.
pub const MOVE_SCAN_PER_COMMAND_MAX: u32 = 10_000;
/// A partition with records since its last checkpoint writes one at least this often (so that
/// a quiet partition's log can be compacted too).
pub const CHECKPOINT_INTERVAL_MS: u64 = 60 * 1000;
/// A checkpoint lists every live group (name ≤ 128 bytes + 10 bytes): this many keep it under
/// ~280 KiB, well inside one storage batch. A partition with more live groups writes no
/// checkpoint until it has fewer, so its compaction floor holds still (safe, not compact).
pub const CHECKPOINT_GROUPS_MAX: usize = 2_048;
/// Checkpoint offsets remembered above the floor; past it, older ones are thinned out (the
/// floor may then stop at an earlier checkpoint than it could: safe, less compact).
pub const CHECKPOINTS_KEPT_MAX: usize = 1_024;

/// Engine memory per message entry, measured: bytes held per waiting message of a standard
/// queue, 364 whatever its body size (100 B or 2 KiB; it was 631 and 2,579 with bodies in the
/// entry) — `cargo bench -p sluice-broker --bench engine`, "engine memory per waiting message":
/// the entry, its place in the id map, its group's member set and its retention timer.
pub const MESSAGE_ENTRY_BYTES: u32 = 364;
/// The memory one partition's message entries may take by default (`message_entries_max`:
/// 1,474,920 entries).
const MESSAGE_ENTRY_BYTES_BUDGET: u32 = 512 << 20;
/// Entries a standard queue keeps for never-received plain messages before new ones wait in the
/// log only (the tail, see [`Tail`]): ~24 MiB of entries.
pub const RESIDENT_ENTRIES_TARGET: u32 = 65_536;

/// Memory per message waiting in a group's list ([`WaitList`]), measured: three varint deltas
/// (id, log offset, time; ~7 bytes with 100,000 groups interleaved) plus the lists' spare
/// capacity — `cargo bench -p sluice-broker --bench engine`, "engine memory per waiting FIFO
/// message" (5.0 with 20 messages a group; lists grow by a quarter, so at most a quarter more
/// is spare). Budgeted high: the bound is a worst case, not an average.
pub const WAITING_MESSAGE_BYTES: u32 = 13;
/// The memory one partition's wait lists may take by default (`waiting_messages_max`).
const WAITING_BYTES_BUDGET: u32 = 512 << 20;

/// Memory bounds of one partition (CONTRACT.md C8). Hitting one gives `OverLimit`, except the
/// attempt-id cache, which forgets its oldest entry (a retry then gets fresh messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub inflight_max: u32,
    /// A standard queue's plain messages (no group, no delay, not dead letters) get an entry at
    /// once while the partition holds fewer entries than this; past it they wait in the log
    /// only, as the tail ([`Tail`]), and are loaded when receives need them.
    pub resident_entries_target: u32,
    /// Message entries (decision state, never bodies: see [`MESSAGE_ENTRY_BYTES`]) this
    /// partition keeps in memory, one per message not yet deleted. Bodies live in the log only,
    /// so a backlog's bytes are bounded by the disk, not by this.
    pub message_entries_max: u32,
    /// Messages of groups (FIFO or fair queues) that joined a wait list ([`WaitList`]) and
    /// live: a few bytes each ([`WAITING_MESSAGE_BYTES`]), never bodies.
    pub waiting_messages_max: u32,
    pub dedup_entries_max: u32,
    pub attempt_ids_max: u32,
    pub move_origins_max: u32,
    /// Bounds the work of one receive that meets a run of messages due for the DLQ.
    pub dlq_moves_per_receive_max: u32,
    /// A checkpoint is written after this many records (amortizes its size, which grows with
    /// the live groups).
    pub checkpoint_interval_records: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            inflight_max: INFLIGHT_MAX,
            resident_entries_target: RESIDENT_ENTRIES_TARGET,
            // ~0.5 GiB of entries at MESSAGE_ENTRY_BYTES each.
            message_entries_max: MESSAGE_ENTRY_BYTES_BUDGET / MESSAGE_ENTRY_BYTES,
            // ~0.5 GiB of wait lists at WAITING_MESSAGE_BYTES each: 41M messages.
            waiting_messages_max: WAITING_BYTES_BUDGET / WAITING_MESSAGE_BYTES,
            // 5 min at 1,600 msg/s; ~150 B each.
            dedup_entries_max: 500_000,
            attempt_ids_max: 10_000,
            move_origins_max: 100_000,
            dlq_moves_per_receive_max: 100,
            checkpoint_interval_records: 10_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionConfig {
    pub queue_id: u64,
    pub partition: u32,
    pub attributes: QueueAttributes,
    pub limits: Limits,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Delayed,
    Available,
    InFlight {
        deadline_ms: u64,
        lease_start_ms: u64,
    },
    Moving,
}

/// A message's decision state. Its content (body, attributes, group and dedup ids) is in its
/// `Sent` record at `sent_offset`, never here (ARCHITECTURE.md).
#[derive(Debug)]
struct Msg {
    message_id: MessageId,
    sent_ms: u64,
    /// When it entered this partition (its `Sent` record's time; a dead letter's `sent_ms` is
    /// its original send time instead). Ids grow with it: see `oldest_arrival_ms`.
    arrived_ms: u64,
    visible_at_ms: u64,
    receive_count: u32,
    first_receive_ms: Option<u64>,
    state: State,
    group: u32,
    /// Log offset of its `Sent` record: the log must keep it while the message lives.
    sent_offset: u64,
    /// ChangeMessageVisibility touched the current lease: attempt-id retries no longer apply.
    touched: bool,
    /// Where it was dead-lettered from (`None` for a message sent here or redriven here).
    origin: Option<MoveOrigin>,
    /// Where it goes, once `Moving`.
    move_to: MoveDestination,
    /// Not a plain message (FIFO, a group, a delay, a dead letter or redriven): it always has
    /// an entry, and such entries are what [`Limits::message_entries_max`] bounds.
    pinned: bool,
}

/// The never-received plain messages of a standard queue that have no entry: they wait in the
/// log only, and cost a few bytes per distinct arrival millisecond, not per message. A plain
/// message is one of a standard queue with no group, no delay and no origin (`Partition::plain`);
/// it joins the tail when it is sent while the tail exists or the partition holds
/// [`Limits::resident_entries_target`] entries. Every plain `Sent` at or above `load_offset`
/// belongs to the tail, in id order; a load (`Partition::load`) turns the first ones into
/// entries, in order, when a receive needs them. Once the loads reach the log's end, the tail
/// is gone and sends get entries again.
///
/// Whether a message is loaded is not state anyone can observe: counters, groups, the
/// checkpoint's live count and the order of deliveries are the same as if every message had an
/// entry (the model test loads at random points and checks that).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Tail {
    /// Where the next load reads from.
    load_offset: u64,
    /// The id of the first tail message not yet loaded: ids below it have entries or are gone.
    first_id: u64,
    /// Tail messages alive (not loaded, not expired).
    count: u64,
    /// Tail messages that passed their retention before being loaded: the next `skip` tail
    /// messages a load meets are dropped.
    skip: u64,
    /// Arrival times of the live tail messages in id order, run-length encoded: (sent_ms, n).
    /// Arrival times never decrease along ids, so expiry takes them from the front.
    times: VecDeque<(u64, u64)>,
}

/// One waiting message of a group (see [`WaitList`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Waiting {
    id: u64,
    /// Log offset of its `Sent` record.
    offset: u64,
    /// Its `Sent` record's time: when it was sent, arrived and became visible.
    at_ms: u64,
}

/// The messages of a group (FIFO, or a fair queue's) that wait in the log only, in id order:
/// never-received messages with nothing else to decide about them (no delay, no origin, a
/// derived MessageId), of which memory keeps only (id, log offset, time) as varint deltas from
/// the one before — about 7 bytes each, 9 with spare capacity ([`WAITING_MESSAGE_BYTES`] budgets 13).
/// A waiting message gets its entry when a record names it (its receive, or a move), by the
/// same rule live and on replay; until then it counts as visible, may be its group's head, and
/// expires with its retention.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct WaitList {
    /// Deltas of the elements after `front`, from `pos` on (three varints each).
    bytes: Vec<u8>,
    pos: usize,
    len: u64,
    /// Valid while `len > 0`.
    front: Option<Waiting>,
    /// The last element pushed (what the next delta is taken from).
    back: Option<Waiting>,
}

impl WaitList {
    fn push(&mut self, w: Waiting) {
        match self.back {
            None => {
                self.front = Some(w);
                self.bytes.clear();
                self.pos = 0;
            }
            Some(b) => {
                debug_assert!(w.id > b.id && w.offset > b.offset && w.at_ms >= b.at_ms);
                // Grow by a quarter, not double: the lists of a large FIFO backlog are most of
                // its memory after the dedup table, and doubling leaves a third of it spare.
                if self.bytes.capacity() - self.bytes.len() < 3 * 10 {
                    self.bytes.reserve_exact(self.bytes.len() / 4 + 32);
                }
                put_varint(&mut self.bytes, w.id - b.id);
                put_varint(&mut self.bytes, w.offset - b.offset);
                put_varint(&mut self.bytes, w.at_ms - b.at_ms);
            }
        }
        self.back = Some(w);
        self.len += 1;
    }

    fn pop(&mut self) -> Option<Waiting> {
        let f = self.front?;
        self.len -= 1;
        if self.len == 0 {
            *self = WaitList::default();
        } else {
            let (next, used) = decode_next(&self.bytes[self.pos..], f)
                .expect("a wait list decodes what it encoded");
            self.pos += used;
            self.front = Some(next);
            if self.pos >= 4096 && self.pos * 2 >= self.bytes.len() {
                self.bytes.drain(..self.pos);
                self.pos = 0;
            }
        }
        Some(f)
    }

    fn iter(&self) -> impl Iterator<Item = Waiting> + '_ {
        let mut cur = self.front;
        let mut rest = &self.bytes[self.pos..];
        std::iter::from_fn(move || {
            let c = cur?;
            cur = decode_next(rest, c).map(|(n, used)| {
                rest = &rest[used..];
                n
            });
            Some(c)
        })
    }

    /// The encoded deltas after the front (what a snapshot stores).
    fn deltas(&self) -> &[u8] {
        &self.bytes[self.pos..]
    }

    /// Rebuilds a list from a snapshot's parts, checking that the deltas decode to `len`
    /// elements ending at `back`. `None` if they do not.
    fn from_parts(front: Waiting, back: Waiting, len: u64, deltas: &[u8]) -> Option<WaitList> {
        let mut cur = front;
        let mut rest = deltas;
        let mut n = 1u64;
        while !rest.is_empty() {
            let (next, used) = decode_next(rest, cur)?;
            if next.id <= cur.id || next.offset <= cur.offset {
                return None;
            }
            rest = &rest[used..];
            cur = next;
            n += 1;
        }
        (n == len && cur == back).then(|| WaitList {
            bytes: deltas.to_vec(),
            pos: 0,
            len,
            front: Some(front),
            back: Some(back),
        })
    }

    /// Heap bytes held (for the engine's memory accounting and the bench).
    fn heap_bytes(&self) -> usize {
        self.bytes.capacity()
    }
}

fn put_varint(w: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        w.push((v as u8) | 0x80);
        v >>= 7;
    }
    w.push(v as u8);
}

fn get_varint(b: &[u8]) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for (i, &byte) in b.iter().enumerate().take(10) {
        let part = u64::from(byte & 0x7f);
        if i == 9 && part > 1 {
            return None;
        }
        v |= part << (7 * i);
        if byte & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}

/// The element after `prev` from the start of `b`, and the bytes it took.
fn decode_next(b: &[u8], prev: Waiting) -> Option<(Waiting, usize)> {
    let (di, a) = get_varint(b)?;
    let (doff, c) = get_varint(&b[a..])?;
    let (dms, d) = get_varint(&b[a + c..])?;
    Some((
        Waiting {
            id: prev.id.checked_add(di)?,
            offset: prev.offset.checked_add(doff)?,
            at_ms: prev.at_ms.checked_add(dms)?,
        },
        a + c + d,
    ))
}

#[derive(Debug)]
struct Group {
    name: Arc<str>,
    /// FIFO: every message of the group with an entry except those being dead-lettered;
    /// standard: its Available messages with an entry. Ordered by id, that is by send order.
    members: BTreeSet<u64>,
    /// Its messages that wait in the log only (after every FIFO member, in id order).
    waiting: WaitList,
    msg_count: u32,
    inflight: u32,
    moving: u32,
    /// `receive_seq` of the group's latest delivery: the fairness key.
    last_served: u64,
    ready_key: Option<(u64, u64)>,
}

impl Group {
    /// Its next message in id order: the lowest member with an entry or waiting.
    fn head(&self) -> Option<u64> {
        let member = self.members.first().copied();
        let waiting = self.waiting.front.map(|w| w.id);
        member.into_iter().chain(waiting).min()
    }
}

#[derive(Debug)]
struct AttemptEntry {
    at_ms: u64,
    first_seq: u64,
    items: Vec<(u64, u32)>,
    /// Log offset of the `Received` record that started it.
    offset: u64,
}

/// The latest checkpoint applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LastCheckpoint {
    offset: u64,
    live_floor: u64,
    at_ms: u64,
}

type OriginKey = (u64, u32, u64);

const TIMER_LEASE: u8 = 0;
const TIMER_DELAY: u8 = 1;
const TIMER_RETENTION: u8 = 2;
/// (due_ms, kind, msg id, epoch); entries are checked against the message when they fire, so
/// superseded ones are dropped lazily.
type Timer = (u64, u8, u64, u32);

/// The partition state machine. See the module documentation.
pub struct Partition {
    cfg: PartitionConfig,
    now_ms: u64,
    next_id: u64,
    receive_seq: u64,
    msgs: BTreeMap<u64, Msg>,
    group_by_name: HashMap<Arc<str>, u32>,
    groups: Vec<Option<Group>>,
    free_groups: Vec<u32>,
    /// Groups that can deliver now, by (last_served, head id, group): the first is served next.
    ready: BTreeSet<(u64, u64, u32)>,
    timers: BinaryHeap<Reverse<Timer>>,
    counters: Counters,
    moving: BTreeSet<u64>,
    /// FIFO deduplication entries, oldest first, by key hash (see [`dedup`]).
    dedup: DedupTable,
    attempts: HashMap<String, AttemptEntry>,
    attempt_order: BTreeMap<u64, String>,
    origins: HashMap<OriginKey, u64>,
    /// (expires, key, log offset of the `Sent` that made it).
    origin_order: VecDeque<(u64, OriginKey, u64)>,
    last_purge_ms: Option<u64>,
    retention_ms: u64,
    dedup_scope: DedupScope,
    // ----- log offsets and compaction (see `compaction_floor`) -----
    /// Where the next record applied lands in the log.
    next_offset: u64,
    /// Where replay started (0 for a partition built live); after a compacted start, the
    /// offset of the checkpoint it really started from.
    replay_start: Option<u64>,
    /// Replay began above offset 0 and has not met a checkpoint: records are skipped.
    skipping: bool,
    /// Every message live is known (its `Sent` was replayed). False only while a replay from
    /// a compacted log has not yet reached a checkpoint that proves it.
    strict: bool,
    /// Ids below it may belong to messages whose `Sent` was compacted away: before `strict`,
    /// records about such unknown ids are skipped; any other unknown id is an error.
    ignore_below_id: u64,
    checkpoints: VecDeque<u64>,
    last_checkpoint: Option<LastCheckpoint>,
    records_since_checkpoint: u64,
    // ----- the log holds what memory does not (see `Tail`) -----
    tail: Option<Tail>,
    /// Entries of pinned messages (`Msg::pinned`).
    pinned: u64,
    /// Messages in the groups' wait lists, all groups together.
    waiting: u64,
    /// Groups with waiting messages, by the id of their first one: the first group here holds
    /// the oldest waiting message and the lowest offset (ids, offsets and times grow together).
    wait_fronts: BTreeSet<(u64, u32)>,
    /// Live messages that joined a wait list, waiting or since given an entry (what
    /// [`Limits::waiting_messages_max`] bounds; whether one has an entry is not observable).
    grouped: u64,
}

impl Partition {
    pub fn new(cfg: PartitionConfig) -> Result<Self, EngineError> {
        if cfg.partition >= PARTITIONS_MAX {
            return Err(EngineError::param("Partition", "partition index too large"));
        }
        Ok(Partition {
            retention_ms: cfg.attributes.retention_ms(),
            dedup_scope: cfg.attributes.dedup_scope,
            cfg,
            now_ms: 0,
            next_id: 0,
            receive_seq: 0,
            msgs: BTreeMap::new(),
            group_by_name: HashMap::new(),
            groups: Vec::new(),
            free_groups: Vec::new(),
            ready: BTreeSet::new(),
            timers: BinaryHeap::new(),
            counters: Counters::default(),
            moving: BTreeSet::new(),
            dedup: DedupTable::new(),
            attempts: HashMap::new(),
            attempt_order: BTreeMap::new(),
            origins: HashMap::new(),
            origin_order: VecDeque::new(),
            last_purge_ms: None,
            next_offset: 0,
            replay_start: None,
            skipping: false,
            strict: true,
            ignore_below_id: 0,
            checkpoints: VecDeque::new(),
            last_checkpoint: None,
            records_since_checkpoint: 0,
            tail: None,
            pinned: 0,
            waiting: 0,
            wait_fronts: BTreeSet::new(),
            grouped: 0,
        })
    }

    pub fn config(&self) -> &PartitionConfig {
        &self.cfg
    }

    fn fifo(&self) -> bool {
        self.cfg.attributes.kind == QueueKind::Fifo
    }

    /// Counters as of the last `execute`/`tick`.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// When the oldest message not yet deleted (visible, delayed, in flight or being moved)
    /// entered this partition; `None` when it holds none. ApproximateAgeOfOldestMessage is
    /// `now - this`; for a dead-letter queue that is the time since the message arrived there,
    /// as in SQS. O(log n): ids are given in log order and record times never go backwards
    /// (`advance` keeps the latest), so the lowest live id arrived first.
    pub fn oldest_arrival_ms(&self) -> Option<u64> {
        let entry = self.msgs.first_key_value().map(|(_, m)| m.arrived_ms);
        let tail = self
            .tail
            .as_ref()
            .and_then(|t| t.times.front())
            .map(|t| t.0);
        let waiting = self.wait_fronts.first().and_then(|&(_, g)| {
            self.groups[g as usize]
                .as_ref()
                .and_then(|grp| grp.waiting.front)
                .map(|w| w.at_ms)
        });
        entry.into_iter().chain(tail).chain(waiting).min()
    }

    /// Whether a receive now could return something (the shard's long-poll check).
    pub fn has_deliverable(&self) -> bool {
        // A group with waiting messages always has an entry for its next one (`fill_group`),
        // so `ready` covers them.
        !self.ready.is_empty() || self.tail.as_ref().is_some_and(|t| t.count > 0)
    }

    /// Message entries, waiting messages and dedup entries held (what a snapshot's size grows
    /// with).
    pub fn entries(&self) -> usize {
        self.msgs.len() + self.waiting as usize + self.dedup.len()
    }

    /// Messages waiting in their groups' lists, without an entry.
    pub fn waiting(&self) -> u64 {
        self.waiting
    }

    /// Heap bytes of the groups' wait lists (for the bench's accounting).
    pub fn waiting_bytes(&self) -> usize {
        self.groups
            .iter()
            .flatten()
            .map(|g| g.waiting.heap_bytes())
            .sum()
    }

    /// Messages alive: those with an entry, those waiting in the tail and in groups' lists.
    fn live_count(&self) -> u64 {
        self.msgs.len() as u64 + self.tail.as_ref().map_or(0, |t| t.count) + self.waiting
    }

    /// The lowest log offset holding the `Sent` of a live message.
    fn live_floor(&self) -> Option<u64> {
        let entry = self.msgs.values().next().map(|m| m.sent_offset);
        let tail = self.tail.as_ref().map(|t| t.load_offset);
        let waiting = self.wait_fronts.first().and_then(|&(_, g)| {
            self.groups[g as usize]
                .as_ref()
                .and_then(|grp| grp.waiting.front)
                .map(|w| w.offset)
        });
        entry.into_iter().chain(tail).chain(waiting).min()
    }

    /// A message that may wait in its group's list ([`WaitList`]): a FIFO or grouped message,
    /// visible when sent, sent here (no origin) with the MessageId this partition derives.
    /// Decided by its `Sent` record alone, like [`Partition::plain`].
    fn waits(&self, s: &Sent, at_ms: u64) -> bool {
        (self.fifo() || s.payload.group_id.is_some())
            && s.origin.is_none()
            && s.visible_at_ms == at_ms
            && s.message_id == MessageId::derive(self.cfg.queue_id, self.cfg.partition, s.id)
    }

    /// A plain message: one that may wait in the tail (see [`Tail`]). Decided by its `Sent`
    /// record alone, so every replica and every replay decides alike.
    fn plain(&self, s: &Sent, at_ms: u64) -> bool {
        !self.fifo()
            && s.payload.group_id.is_none()
            && s.origin.is_none()
            && s.visible_at_ms <= at_ms
    }

    fn checkpoint_fits(&self) -> bool {
        self.group_by_name.len() <= CHECKPOINT_GROUPS_MAX
    }

    /// Live groups and their fairness keys, sorted by name (deterministic bytes).
    fn group_list(&self) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = self
            .groups
            .iter()
            .flatten()
            .map(|g| (g.name.to_string(), g.last_served))
            .collect();
        v.sort_unstable();
        v
    }

    /// The lowest log offset replay needs to rebuild exactly this state: the shard may delete
    /// every log segment that lies wholly below it, then rebuild with [`Partition::replay_at`]
    /// over what is left and [`Partition::finish_replay`].
    ///
    /// It is the latest checkpoint at or below every offset still needed: the `Sent` of every
    /// message live at the latest checkpoint (hence of every message live now), of every dedup
    /// entry (C4) and move-origin entry still in its window, and the first `Received` of every
    /// live ReceiveRequestAttemptId entry. A replay that starts at that checkpoint gets the
    /// counters, settings and fairness keys from it, skips records about messages sent before
    /// it (all gone by the latest checkpoint), and from the latest checkpoint on knows every
    /// message. Never decreases. 0 (nothing to delete) until the first checkpoint.
    pub fn compaction_floor(&self) -> u64 {
        let start = self.replay_start.unwrap_or(0);
        let Some(last) = self.last_checkpoint else {
            return start;
        };
        if !self.strict {
            return start;
        }
        let mut need = last.live_floor;
        if let Some(o) = self.live_floor() {
            need = need.min(o);
        }
        if let Some(e) = self.dedup.front() {
            need = need.min(e.offset);
        }
        if let Some(e) = self
            .attempt_order
            .values()
            .next()
            .and_then(|k| self.attempts.get(k))
        {
            need = need.min(e.offset);
        }
        if let Some(&(_, _, offset)) = self.origin_order.front() {
            need = need.min(offset);
        }
        self.checkpoints
            .iter()
            .rev()
            .find(|&&c| c <= need)
            .copied()
            .unwrap_or(start)
    }

    /// Where the next record will land in the log.
    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }

    /// The deduplication table's key: 96 bits of xxh3-128 ([`dedup::key_hash`]) of the dedup
    /// id (scope queue) or of `group NUL id` (scope message group; tokens are printable ASCII,
    /// so NUL cannot occur in either part). Stable across processes and versions: snapshots
    /// hold it. Why 96 bits of a non-cryptographic hash are enough: see [`dedup`].
    fn dedup_hash(&self, group: Option<&str>, dedup_id: &str) -> u128 {
        use dedup::key_hash;
        match self.dedup_scope {
            DedupScope::Queue => key_hash(dedup_id.as_bytes()),
            DedupScope::MessageGroup => {
                let (g, d) = (group.unwrap_or("").as_bytes(), dedup_id.as_bytes());
                let mut buf = [0u8; 320];
                let n = g.len() + 1 + d.len();
                if n > buf.len() {
                    // Longer than tokens may be (a record from elsewhere): same bytes, on the heap.
                    return key_hash([g, &[0], d].concat().as_slice());
                }
                buf[..g.len()].copy_from_slice(g);
                buf[g.len() + 1..n].copy_from_slice(d);
                key_hash(&buf[..n])
            }
        }
    }

    /// The MessageId a dedup entry answers with.
    fn dedup_message_id(&self, e: &DedupEntry) -> MessageId {
        e.message_id
            .unwrap_or_else(|| MessageId::derive(self.cfg.queue_id, self.cfg.partition, e.seq))
    }

    /// A canonical, order-independent picture of the whole state (for tests and inspection):
    /// equal dumps mean equal behaviour from here on. A message waiting in its group's list
    /// shows as the entry it will get: whether it has one yet is not behaviour.
    pub fn dump(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "now={} next_id={} receive_seq={} last_purge={:?} retention_ms={} scope={:?} \
             counters={:?} moving={:?} next_offset={} strict={} floor={} \
             since_checkpoint={} last_checkpoint={:?} pinned={} tail={:?}",
            self.now_ms,
            self.next_id,
            self.receive_seq,
            self.last_purge_ms,
            self.retention_ms,
            self.dedup_scope,
            self.counters,
            self.moving,
            self.next_offset,
            self.strict,
            self.compaction_floor(),
            self.records_since_checkpoint,
            self.last_checkpoint,
            self.pinned,
            self.tail,
        );
        let mut lines: BTreeMap<u64, String> = BTreeMap::new();
        for (id, m) in &self.msgs {
            let g = self.groups[m.group as usize]
                .as_ref()
                .map_or("?", |g| &g.name);
            lines.insert(
                *id,
                format!(
                    "msg {id} @{} {} group={g:?} sent={} arrived={} vis={} rc={} first={:?} \
                     {:?} touched={} origin={:?} to={:?} pinned={}",
                    m.sent_offset,
                    m.message_id,
                    m.sent_ms,
                    m.arrived_ms,
                    m.visible_at_ms,
                    m.receive_count,
                    m.first_receive_ms,
                    m.state,
                    m.touched,
                    m.origin,
                    m.move_to,
                    m.pinned
                ),
            );
        }
        for g in self.groups.iter().flatten() {
            for w in g.waiting.iter() {
                let m = self.waiting_entry(w, 0);
                lines.insert(
                    w.id,
                    format!(
                        "msg {} @{} {} group={:?} sent={} arrived={} vis={} rc=0 first=None \
                         {:?} touched=false origin=None to={:?} pinned=false",
                        w.id,
                        w.offset,
                        m.message_id,
                        g.name,
                        w.at_ms,
                        w.at_ms,
                        w.at_ms,
                        m.state,
                        m.move_to,
                    ),
                );
            }
        }
        for line in lines.values() {
            let _ = writeln!(s, "{line}");
        }
        let mut groups: Vec<&Group> = self.groups.iter().flatten().collect();
        groups.sort_by(|a, b| a.name.cmp(&b.name));
        for g in groups {
            let members: BTreeSet<u64> = g
                .members
                .iter()
                .copied()
                .chain(g.waiting.iter().map(|w| w.id))
                .collect();
            let _ = writeln!(
                s,
                "group {:?} members={members:?} n={} inflight={} moving={} last_served={}",
                g.name, g.msg_count, g.inflight, g.moving, g.last_served
            );
        }
        for e in self.dedup.iter() {
            let _ = writeln!(
                s,
                "dedup {:032x} {} {} {} @{}",
                e.hash,
                self.dedup_message_id(&e),
                e.seq,
                e.expires_ms,
                e.offset
            );
        }
        for (seq, k) in &self.attempt_order {
            let e = &self.attempts[k];
            let _ = writeln!(
                s,
                "attempt {seq} {k:?} at={} @{} {:?}",
                e.at_ms, e.offset, e.items
            );
        }
        let mut origins: Vec<_> = self.origins.iter().collect();
        origins.sort();
        for (k, e) in origins {
            let _ = writeln!(s, "origin {k:?} {e}");
        }
        for (e, k, o) in &self.origin_order {
            let _ = writeln!(s, "origin order {e} {k:?} @{o}");
        }
        s
    }
}
