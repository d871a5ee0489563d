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
//! # Decisions (DESIGN.md §4)
//!
//! * **Leases are durable.** A receive must record the new receive count anyway (§4.5,
//!   maxReceiveCount survives restarts), so the `Received` record also carries the lease
//!   deadline: leases, FIFO group locks and receipt handles survive restarts and failovers, at
//!   no extra append. The lease epoch *is* the receive count.
//! * **Stale handles (§4.6).** A handle names (message, epoch). ChangeMessageVisibility needs the
//!   current epoch and a live lease: an older handle gets `ReceiptHandleIsInvalid`, an expired
//!   lease `MessageNotInflight` — a stale handle can never change the current lease.
//!   DeleteMessage on a standard queue accepts any authentic handle of the message, as SQS does
//!   (deleting is what every holder wants, and an acknowledged delete then really deleted:
//!   §4.2). On a FIFO queue delete needs the current epoch and a live lease, else
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
//! * **Content lives in the log only** (DESIGN.md §3). A message's entry holds what the
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
/// At most 10 messages per ReceiveMessage.
pub const RECEIVE_MESSAGES_MAX: u32 = 10;
/// SQS's in-flight limit (standard: OverLimit; FIFO: empty receives). Applied per partition.
pub const INFLIGHT_MAX: u32 = 120_000;
/// SendMessageBatch limits.
pub const BATCH_ENTRIES_MAX: usize = 10;
pub const BATCH_ENTRY_ID_LEN_MAX: usize = 80;
pub const BATCH_PAYLOAD_BYTES_MAX: usize = 1_048_576;
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

/// Memory bounds of one partition (DESIGN.md §4.8). Hitting one gives `OverLimit`, except the
/// attempt-id cache, which forgets its oldest entry (a retry then gets fresh messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub inflight_max: u32,
    /// Message entries (decision state, never bodies: see [`MESSAGE_ENTRY_BYTES`]) this
    /// partition keeps in memory, one per message not yet deleted. Bodies live in the log only,
    /// so a backlog's bytes are bounded by the disk, not by this.
    pub message_entries_max: u32,
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
            // ~0.5 GiB of entries at MESSAGE_ENTRY_BYTES each.
            message_entries_max: MESSAGE_ENTRY_BYTES_BUDGET / MESSAGE_ENTRY_BYTES,
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
/// `Sent` record at `sent_offset`, never here (DESIGN.md §3).
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
}

#[derive(Debug)]
struct Group {
    name: Arc<str>,
    /// FIFO: every message of the group except those being dead-lettered; standard: its
    /// Available messages. Ordered by id, that is by send order.
    members: BTreeSet<u64>,
    msg_count: u32,
    inflight: u32,
    moving: u32,
    /// `receive_seq` of the group's latest delivery: the fairness key.
    last_served: u64,
    ready_key: Option<(u64, u64)>,
}

#[derive(Debug)]
struct DedupEntry {
    message_id: MessageId,
    seq: u64,
    expires_ms: u64,
    /// Log offset of the `Sent` record that made it (kept while the entry lives: §4.4).
    offset: u64,
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
    dedup: HashMap<String, DedupEntry>,
    dedup_order: VecDeque<(u64, String)>,
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
            dedup: HashMap::new(),
            dedup_order: VecDeque::new(),
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
        self.msgs.first_key_value().map(|(_, m)| m.arrived_ms)
    }

    /// When the next timer is due (delay end, lease expiry, retention, dedup/attempt/origin
    /// expiry). May be early (superseded timers are dropped lazily): a wake-up then finds
    /// nothing to do.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        let timer = self.timers.peek().map(|Reverse(t)| t.0);
        let dedup = self.dedup_order.front().map(|e| e.0);
        let attempt = self
            .attempt_order
            .values()
            .next()
            .and_then(|k| self.attempts.get(k))
            .map(|e| e.at_ms + ATTEMPT_WINDOW_MS);
        let origin = self.origin_order.front().map(|e| e.0);
        let checkpoint = self.checkpoint_due_ms();
        [timer, dedup, attempt, origin, checkpoint]
            .into_iter()
            .flatten()
            .min()
    }

    /// Whether a receive now could return something (the shard's long-poll check).
    pub fn has_deliverable(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Runs timers up to `now_ms`. Timer-driven changes need no records today, so the records
    /// are always empty; the signature leaves room for recorded expiry.
    pub fn tick(&mut self, now_ms: u64) -> Effects {
        let now = self.advance(now_ms);
        let mut fx = Effects::reply(Reply::None);
        fx.first_offset = self.next_offset;
        if self.checkpoint_due_ms().is_some_and(|due| due <= now) {
            self.push_checkpoint(now, &mut fx.records);
        }
        fx
    }

    /// When `tick` will write a checkpoint: records were written since the last one, it can be
    /// written (not too many groups), and the interval has passed.
    fn checkpoint_due_ms(&self) -> Option<u64> {
        if self.records_since_checkpoint == 0 || !self.checkpoint_fits() {
            return None;
        }
        Some(
            self.last_checkpoint
                .map_or(self.now_ms, |c| c.at_ms + CHECKPOINT_INTERVAL_MS),
        )
    }

    fn checkpoint_fits(&self) -> bool {
        self.group_by_name.len() <= CHECKPOINT_GROUPS_MAX
    }

    /// Appends a checkpoint of the state as it is now (after the records before it).
    fn push_checkpoint(&mut self, now: u64, records: &mut Vec<Record>) {
        let offset = self.next_offset;
        let rec = Record {
            at_ms: now,
            kind: RecordKind::Checkpoint(Box::new(Checkpoint {
                next_id: self.next_id,
                receive_seq: self.receive_seq,
                retention_ms: self.retention_ms,
                dedup_scope: self.dedup_scope,
                last_purge_ms: self.last_purge_ms,
                live_floor: self.msgs.values().next().map_or(offset, |m| m.sent_offset),
                live_count: self.msgs.len() as u64,
                groups: self.group_list(),
            })),
        };
        self.apply_live(&rec);
        records.push(rec);
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
    /// entry (§4.4) and move-origin entry still in its window, and the first `Received` of every
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
        if let Some(m) = self.msgs.values().next() {
            need = need.min(m.sent_offset);
        }
        if let Some(e) = self
            .dedup_order
            .front()
            .and_then(|(_, k)| self.dedup.get(k))
        {
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

    /// DLQ moves started and not completed (after recovery: forward them again).
    pub fn pending_moves(&self) -> Vec<MoveStart> {
        self.moving
            .iter()
            .filter_map(|id| self.msgs.get(id).map(|m| self.move_request(*id, m)))
            .collect()
    }

    fn move_request(&self, id: u64, m: &Msg) -> MoveStart {
        MoveStart {
            origin: MoveOrigin {
                queue_id: self.cfg.queue_id,
                partition: self.cfg.partition,
                msg_id: id,
                sent_ms: m.sent_ms,
            },
            message_id: m.message_id,
            sent_offset: m.sent_offset,
            destination: m.move_to,
            dead_letter_source: m.origin,
        }
    }

    /// Rebuilds state from one record of this partition's log (in log order), numbering records
    /// from 0 — for a log that was never compacted. Kept for callers without offsets; prefer
    /// [`Partition::replay_at`].
    pub fn replay(&mut self, record: &Record) -> Result<(), ReplayError> {
        self.replay_at(self.next_offset, record)
    }

    /// Rebuilds state from the record at log offset `offset`. Offsets must be consecutive from
    /// the first call on. A replay that starts above 0 (a compacted log) skips records up to its
    /// first checkpoint and starts from there; until a checkpoint shows that every live message
    /// is known, records about unknown messages sent before the start are skipped. Anything
    /// else that does not fit is a [`ReplayError`].
    pub fn replay_at(&mut self, offset: u64, record: &Record) -> Result<(), ReplayError> {
        let at_ms = record.at_ms;
        match self.replay_start {
            None => {
                self.replay_start = Some(offset);
                if offset > 0 {
                    self.skipping = true;
                    self.strict = false;
                }
            }
            Some(_) if offset != self.next_offset => {
                return Err(ReplayError {
                    at_ms,
                    reason: "log offsets are not consecutive",
                })
            }
            Some(_) => {}
        }
        self.advance(at_ms);
        if self.skipping && !matches!(record.kind, RecordKind::Checkpoint(_)) {
            self.next_offset = offset + 1;
            return Ok(());
        }
        self.apply_at(offset, record)
    }

    /// Ends a replay: `end_offset` is one past the log's last record. Checks that the log held
    /// what the state needs (a compacted log must reach a checkpoint that knows every live
    /// message) and that no record was left out.
    pub fn finish_replay(&mut self, end_offset: u64) -> Result<(), ReplayError> {
        let bad = |reason| {
            Err(ReplayError {
                at_ms: self.now_ms,
                reason,
            })
        };
        match self.replay_start {
            None if end_offset > 0 => {
                return bad("the log is empty above offset 0: it was compacted away")
            }
            None => {}
            Some(_) if end_offset != self.next_offset => {
                return bad("the log ends elsewhere than its last replayed record")
            }
            Some(_) if self.skipping => return bad("a compacted log without a checkpoint"),
            Some(_) if !self.strict => {
                return bad("the log was compacted past records the state needs")
            }
            Some(_) => {}
        }
        self.next_offset = end_offset;
        Ok(())
    }

    /// Validates and decides `cmd` at `now_ms`, applies it in memory, and returns the records to
    /// make durable before the reply. On `Err` nothing was changed (timers aside).
    pub fn execute(&mut self, now_ms: u64, cmd: Command) -> Result<Effects, EngineError> {
        let first_offset = self.next_offset;
        let mut fx = self.decide(now_ms, cmd)?;
        fx.first_offset = first_offset;
        let interval = u64::from(self.cfg.limits.checkpoint_interval_records.max(1));
        if !fx.records.is_empty()
            && (self.last_checkpoint.is_none() || self.records_since_checkpoint >= interval)
            && self.checkpoint_fits()
        {
            let now = self.now_ms;
            self.push_checkpoint(now, &mut fx.records);
        }
        debug_assert_eq!(first_offset + fx.records.len() as u64, self.next_offset);
        Ok(fx)
    }

    /// A batch command: 1 to [`BATCH_ENTRIES_MAX`] entries, each decided on its own and in
    /// order by `one` (which pushes its records), one result per entry in `reply`.
    fn batch<T>(
        &mut self,
        entries: Vec<T>,
        mut one: impl FnMut(&mut Self, T, &mut Vec<Record>) -> Result<(), EngineError>,
        reply: fn(Vec<Result<(), EngineError>>) -> Reply<Delivery>,
    ) -> Result<Effects, EngineError> {
        check_batch_len(entries.len())?;
        let mut records = Vec::with_capacity(entries.len());
        let results = entries
            .into_iter()
            .map(|e| one(self, e, &mut records))
            .collect();
        Ok(Effects::of(records, reply(results)))
    }

    fn decide(&mut self, now_ms: u64, cmd: Command) -> Result<Effects, EngineError> {
        let now = self.advance(now_ms);
        match cmd {
            Command::Send(req) => {
                let mut records = Vec::with_capacity(1);
                let md5_body = md5_of_body(req.body.as_bytes());
                let reply = self.send(now, req, md5_body, &mut records)?;
                Ok(Effects {
                    first_offset: 0,
                    records,
                    reply: Reply::Sent(reply),
                    moves: Vec::new(),
                })
            }
            Command::SendBatch(entries) => self.send_batch(now, entries),
            Command::Receive(req) => self.receive(now, req),
            Command::Delete { receipt } => {
                let mut records = Vec::with_capacity(1);
                self.delete(now, receipt, &mut records)?;
                Ok(Effects::of(records, Reply::Deleted))
            }
            Command::DeleteBatch(receipts) => self.batch(
                receipts,
                |p, r, records| p.delete(now, r, records),
                Reply::DeletedBatch,
            ),
            Command::ChangeVisibility { receipt, timeout_s } => {
                let mut records = Vec::with_capacity(1);
                self.change_visibility(now, receipt, timeout_s, &mut records)?;
                Ok(Effects::of(records, Reply::VisibilityChanged))
            }
            // Each entry as its own command would see it: a lease an earlier entry ended
            // (timeout 0) has expired by the next one.
            Command::ChangeVisibilityBatch(entries) => self.batch(
                entries,
                |p, (r, t), records| {
                    p.advance(now);
                    p.change_visibility(now, r, t, records)
                },
                Reply::VisibilityChangedBatch,
            ),
            Command::Purge => {
                if self
                    .last_purge_ms
                    .is_some_and(|t| now < t + PURGE_INTERVAL_MS)
                {
                    return Err(EngineError::PurgeQueueInProgress);
                }
                let rec = Record {
                    at_ms: now,
                    kind: RecordKind::Purged {
                        before_id: self.next_id,
                    },
                };
                self.apply_live(&rec);
                Ok(Effects {
                    first_offset: 0,
                    records: vec![rec],
                    reply: Reply::Purged,
                    moves: Vec::new(),
                })
            }
            Command::SetAttributes(attrs) => {
                if attrs.kind != self.cfg.attributes.kind {
                    return Err(EngineError::attr(
                        "FifoQueue",
                        "cannot change the queue kind",
                    ));
                }
                let mut records = Vec::new();
                if attrs.retention_ms() != self.retention_ms
                    || attrs.dedup_scope != self.dedup_scope
                {
                    let rec = Record {
                        at_ms: now,
                        kind: RecordKind::Configured {
                            retention_s: attrs.retention_s,
                            dedup_scope: attrs.dedup_scope,
                        },
                    };
                    self.apply_live(&rec);
                    records.push(rec);
                }
                self.cfg.attributes = *attrs;
                Ok(Effects {
                    first_offset: 0,
                    records,
                    reply: Reply::AttributesSet,
                    moves: Vec::new(),
                })
            }
            Command::AcceptMove(req) => self.accept_move(now, req),
            Command::StartMoves(req) => self.start_moves(now, req),
            Command::CompleteMove { msg_id } => {
                let mut records = Vec::new();
                if matches!(self.msgs.get(&msg_id), Some(m) if m.state == State::Moving) {
                    let rec = Record {
                        at_ms: now,
                        kind: RecordKind::DlqMoveDone { id: msg_id },
                    };
                    self.apply_live(&rec);
                    records.push(rec);
                }
                Ok(Effects {
                    first_offset: 0,
                    records,
                    reply: Reply::MoveCompleted,
                    moves: Vec::new(),
                })
            }
        }
    }

    fn apply_live(&mut self, rec: &Record) {
        if let Err(e) = self.apply_at(self.next_offset, rec) {
            // A live decision produced a record its own state rejects: a bug, never input.
            panic!("engine produced a record it cannot apply: {e} ({rec:?})");
        }
    }

    // ----- commands -----

    fn validate_send(&self, req: &SendRequest) -> Result<(), EngineError> {
        validate_body(&req.body)?;
        let attrs_bytes = validate_message_attributes(&req.attributes)?;
        let size = req.body.len() + attrs_bytes;
        let size_max = self.cfg.attributes.message_size_bytes_max as usize;
        if size > size_max {
            return Err(EngineError::param(
                "MessageBody",
                format!("message must be shorter than {size_max} bytes"),
            ));
        }
        if let Some(d) = req.delay_s {
            if d > DELAY_S_MAX {
                return Err(EngineError::param("DelaySeconds", "must be 0 to 900"));
            }
        }
        if let Some(g) = &req.group_id {
            validate_token("MessageGroupId", g)?;
        }
        if let Some(d) = &req.dedup_id {
            validate_token("MessageDeduplicationId", d)?;
        }
        if self.fifo() {
            if req.group_id.is_none() {
                return Err(EngineError::param(
                    "MessageGroupId",
                    "is required for FIFO queues",
                ));
            }
            if req.delay_s.is_some_and(|d| d > 0) {
                return Err(EngineError::param(
                    "DelaySeconds",
                    "per-message delay is not valid for FIFO queues",
                ));
            }
            if req.dedup_id.is_none() && !self.cfg.attributes.content_based_dedup {
                return Err(EngineError::param(
                    "MessageDeduplicationId",
                    "the queue should either have ContentBasedDeduplication enabled or \
                     MessageDeduplicationId provided explicitly",
                ));
            }
        } else if req.dedup_id.is_some() {
            return Err(EngineError::param(
                "MessageDeduplicationId",
                "is only valid for FIFO queues",
            ));
        }
        Ok(())
    }

    fn dedup_key(&self, group: Option<&str>, dedup_id: &str) -> String {
        match self.dedup_scope {
            DedupScope::Queue => dedup_id.to_string(),
            // Tokens are printable ASCII, so NUL cannot occur in either part.
            DedupScope::MessageGroup => format!("{}\0{dedup_id}", group.unwrap_or("")),
        }
    }

    /// `md5_body` is the body's digest, computed by the caller (a batch hashes its bodies
    /// together, up to sixteen at a time with AVX2, twelve without).
    fn send(
        &mut self,
        now: u64,
        req: SendRequest,
        md5_body: Md5Digest,
        records: &mut Vec<Record>,
    ) -> Result<SentReply, EngineError> {
        self.validate_send(&req)?;
        let fifo = self.fifo();
        let dedup_id = match (&req.dedup_id, fifo) {
            (Some(d), true) => Some(d.clone()),
            (None, true) => Some(hex(&Sha256::digest(req.body.as_bytes()))),
            _ => None,
        };
        let visible_at_ms = if fifo {
            now + self.cfg.attributes.delay_ms()
        } else {
            now + req
                .delay_s
                .map_or(self.cfg.attributes.delay_ms(), |d| u64::from(d) * 1000)
        };
        let payload =
            Payload::with_md5_body(req.body, md5_body, req.attributes, req.group_id, dedup_id);
        if let Some(d) = &payload.dedup_id {
            let key = self.dedup_key(payload.group_id.as_deref(), d);
            if let Some(e) = self.dedup.get(&key) {
                return Ok(SentReply {
                    message_id: e.message_id,
                    sequence_number: Some(e.seq),
                    md5_body: payload.md5_body(),
                    md5_attributes: payload.md5_attributes,
                    duplicate: true,
                });
            }
            if self.dedup.len() >= self.cfg.limits.dedup_entries_max as usize {
                return Err(EngineError::OverLimit("deduplication table is full"));
            }
        }
        self.check_capacity()?;
        let id = self.next_id;
        let reply = SentReply {
            message_id: MessageId::derive(self.cfg.queue_id, self.cfg.partition, id),
            sequence_number: fifo.then_some(id),
            md5_body: payload.md5_body(),
            md5_attributes: payload.md5_attributes,
            duplicate: false,
        };
        let rec = Record {
            at_ms: now,
            kind: RecordKind::Sent(Sent {
                id,
                message_id: reply.message_id,
                visible_at_ms,
                payload: Arc::new(payload),
                origin: None,
                redriven: false,
            }),
        };
        self.apply_live(&rec);
        records.push(rec);
        Ok(reply)
    }

    /// Room for one more message entry. A message's size never counts here: its bytes are in
    /// the log, bounded by the disk (a full disk is the log's clear, retryable error).
    fn check_capacity(&self) -> Result<(), EngineError> {
        if self.msgs.len() >= self.cfg.limits.message_entries_max as usize {
            return Err(EngineError::OverLimit(
                "partition holds its maximum of messages",
            ));
        }
        if self.next_id >= MSG_ID_MAX {
            return Err(EngineError::OverLimit("partition message ids exhausted"));
        }
        Ok(())
    }

    fn send_batch(&mut self, now: u64, entries: Vec<BatchEntry>) -> Result<Effects, EngineError> {
        validate_batch(&entries)?;
        let mut records = Vec::with_capacity(entries.len());
        let mut results = Vec::with_capacity(entries.len());
        let bodies: Vec<&[u8]> = entries.iter().map(|e| e.request.body.as_bytes()).collect();
        let digests = md5_of_bodies(&bodies);
        for (e, md5_body) in entries.into_iter().zip(digests) {
            let r = self.send(now, e.request, md5_body, &mut records);
            results.push((e.id, r));
        }
        Ok(Effects {
            first_offset: 0,
            records,
            reply: Reply::SentBatch(results),
            moves: Vec::new(),
        })
    }

    fn delivered(&self, id: u64, m: &Msg) -> Delivery {
        Delivery {
            receipt: Receipt {
                queue_id: self.cfg.queue_id,
                partition: self.cfg.partition,
                msg_id: id,
                epoch: m.receive_count,
            },
            message_id: m.message_id,
            sent_offset: m.sent_offset,
            sent_ms: m.sent_ms,
            receive_count: m.receive_count,
            first_receive_ms: m.first_receive_ms.unwrap_or(0),
            sequence_number: self.fifo().then_some(id),
            dead_letter_source: m.origin,
        }
    }

    fn receive(&mut self, now: u64, req: ReceiveRequest) -> Result<Effects, EngineError> {
        if req.max_messages == 0 || req.max_messages > RECEIVE_MESSAGES_MAX {
            return Err(EngineError::param("MaxNumberOfMessages", "must be 1 to 10"));
        }
        if req
            .visibility_timeout_s
            .is_some_and(|v| v > VISIBILITY_TIMEOUT_S_MAX)
        {
            return Err(EngineError::param(
                "VisibilityTimeout",
                "must be 0 to 43200",
            ));
        }
        if let Some(a) = &req.attempt_id {
            validate_token("ReceiveRequestAttemptId", a)?;
        }
        let fifo = self.fifo();
        let vt_ms = req
            .visibility_timeout_s
            .map_or(self.cfg.attributes.visibility_timeout_ms(), |v| {
                u64::from(v) * 1000
            });
        let attempt = if fifo { req.attempt_id } else { None };
        if let Some(a) = &attempt {
            if let Some(effects) = self.retry_attempt(now, a, vt_ms) {
                return Ok(effects);
            }
        }
        let inflight_max = u64::from(self.cfg.limits.inflight_max);
        if self.counters.in_flight >= inflight_max {
            if fifo {
                return Ok(Effects::reply(Reply::Received(Vec::new())));
            }
            return Err(EngineError::OverLimit("too many messages in flight"));
        }
        let max_rc = self
            .cfg
            .attributes
            .redrive_policy
            .as_ref()
            .map(|p| p.max_receive_count);
        let max = req.max_messages as usize;
        let mut fx = Effects::reply(Reply::None);
        let mut out = Vec::with_capacity(max);
        let mut moves = 0u32;
        'outer: while out.len() < max && self.counters.in_flight < inflight_max {
            let Some(&(_, head, _)) = self.ready.first() else {
                break;
            };
            let mut id = head;
            loop {
                let m = self.msgs.get(&id).expect("ready heads are present");
                let at_limit = max_rc.is_some_and(|rc| m.receive_count >= rc);
                if at_limit {
                    if id != head {
                        // FIFO: a later message of the group is due for the DLQ; it moves when
                        // it is the head of an idle group, so order holds.
                        break;
                    }
                    if moves >= self.cfg.limits.dlq_moves_per_receive_max {
                        break 'outer;
                    }
                    moves += 1;
                    let rec = Record {
                        at_ms: now,
                        kind: RecordKind::DlqMoveStarted {
                            id,
                            destination: MoveDestination::RedriveTarget,
                        },
                    };
                    self.apply_live(&rec);
                    let m = self.msgs.get(&id).expect("moving message is present");
                    fx.moves.push(self.move_request(id, m));
                    fx.records.push(rec);
                    continue 'outer;
                }
                let rec = Record {
                    at_ms: now,
                    kind: RecordKind::Received {
                        id,
                        receive_count: m.receive_count + 1,
                        deadline_ms: now + vt_ms,
                        attempt_id: attempt.clone(),
                        batch_start: out.is_empty(),
                    },
                };
                self.apply_live(&rec);
                fx.records.push(rec);
                let m = self.msgs.get(&id).expect("received message is present");
                out.push(self.delivered(id, m));
                if !fifo || out.len() >= max || self.counters.in_flight >= inflight_max {
                    continue 'outer;
                }
                // FIFO: keep taking this group's next messages in order while they are visible.
                let group = self.groups[m.group as usize]
                    .as_ref()
                    .expect("message's group exists");
                match group.members.range(id + 1..).next() {
                    Some(&next)
                        if self.msgs.get(&next).map(|n| n.state) == Some(State::Available) =>
                    {
                        id = next;
                        let n = self.msgs.get(&next).expect("member is present");
                        if max_rc.is_some_and(|rc| n.receive_count >= rc) {
                            continue 'outer;
                        }
                    }
                    _ => continue 'outer,
                }
            }
        }
        fx.reply = Reply::Received(out);
        Ok(fx)
    }

    /// A FIFO ReceiveRequestAttemptId retry: the same messages and handles if none of them was
    /// deleted, re-received or had its visibility changed, with the visibility timeout reset.
    fn retry_attempt(&mut self, now: u64, attempt: &str, vt_ms: u64) -> Option<Effects> {
        let entry = self.attempts.get(attempt)?;
        let valid = entry.items.iter().all(|&(id, epoch)| {
            self.msgs.get(&id).is_some_and(|m| {
                m.receive_count == epoch && !m.touched && matches!(m.state, State::InFlight { .. })
            })
        });
        if !valid {
            return None;
        }
        let items = entry.items.clone();
        let mut fx = Effects::reply(Reply::None);
        let mut out = Vec::with_capacity(items.len());
        for (id, epoch) in items {
            let m = self.msgs.get(&id).expect("validated above");
            let State::InFlight { lease_start_ms, .. } = m.state else {
                unreachable!("validated above")
            };
            let rec = Record {
                at_ms: now,
                kind: RecordKind::VisibilityChanged {
                    id,
                    epoch,
                    deadline_ms: (now + vt_ms).min(lease_start_ms + LEASE_MS_MAX),
                    attempt_retry: true,
                },
            };
            self.apply_live(&rec);
            fx.records.push(rec);
            let m = self.msgs.get(&id).expect("validated above");
            out.push(self.delivered(id, m));
        }
        fx.reply = Reply::Received(out);
        Some(fx)
    }

    fn check_receipt(&self, r: &Receipt) -> Result<(), EngineError> {
        if r.queue_id != self.cfg.queue_id || r.partition != self.cfg.partition {
            return Err(EngineError::ReceiptHandleIsInvalid(
                "issued for another partition",
            ));
        }
        if r.msg_id >= self.next_id || r.epoch == 0 {
            return Err(EngineError::ReceiptHandleIsInvalid("no such message"));
        }
        Ok(())
    }

    /// Deletes the message `r` leases, its `Deleted` record pushed onto `records`.
    fn delete(
        &mut self,
        now: u64,
        r: Receipt,
        records: &mut Vec<Record>,
    ) -> Result<(), EngineError> {
        self.check_receipt(&r)?;
        let Some(m) = self.msgs.get(&r.msg_id) else {
            // Already deleted, expired or purged: SQS treats a repeated delete as success.
            return Ok(());
        };
        if m.state == State::Moving {
            return Err(EngineError::ReceiptHandleIsInvalid(
                "the message is being moved to another queue",
            ));
        }
        if r.epoch > m.receive_count {
            return Err(EngineError::ReceiptHandleIsInvalid("no such lease"));
        }
        if self.fifo() && (r.epoch != m.receive_count || !matches!(m.state, State::InFlight { .. }))
        {
            return Err(EngineError::ReceiptHandleIsInvalid(
                "the lease of this receipt handle has expired",
            ));
        }
        let rec = Record {
            at_ms: now,
            kind: RecordKind::Deleted { id: r.msg_id },
        };
        self.apply_live(&rec);
        records.push(rec);
        Ok(())
    }

    fn change_visibility(
        &mut self,
        now: u64,
        r: Receipt,
        timeout_s: u32,
        records: &mut Vec<Record>,
    ) -> Result<(), EngineError> {
        if timeout_s > VISIBILITY_TIMEOUT_S_MAX {
            return Err(EngineError::param(
                "VisibilityTimeout",
                "must be 0 to 43200",
            ));
        }
        self.check_receipt(&r)?;
        let Some(m) = self.msgs.get(&r.msg_id) else {
            return Err(EngineError::ReceiptHandleIsInvalid(
                "the message no longer exists",
            ));
        };
        if r.epoch != m.receive_count {
            return Err(EngineError::ReceiptHandleIsInvalid(
                "a newer receive holds the message",
            ));
        }
        let State::InFlight { lease_start_ms, .. } = m.state else {
            return Err(EngineError::MessageNotInflight);
        };
        let deadline_ms = now + u64::from(timeout_s) * 1000;
        if deadline_ms > lease_start_ms + LEASE_MS_MAX {
            return Err(EngineError::param(
                "VisibilityTimeout",
                "exceeds 12 hours from the receive",
            ));
        }
        let rec = Record {
            at_ms: now,
            kind: RecordKind::VisibilityChanged {
                id: r.msg_id,
                epoch: r.epoch,
                deadline_ms,
                attempt_retry: false,
            },
        };
        self.apply_live(&rec);
        records.push(rec);
        Ok(())
    }

    /// One redrive step: see [`StartMoves`]. Looks at messages in id order (that is send order)
    /// from `from_id`; a message moves if it is visible (not delayed, in flight or already
    /// moving), on a FIFO queue is the head of its group with nothing of the group in flight
    /// (so a group leaves in order), and has a destination.
    fn start_moves(&mut self, now: u64, req: StartMoves) -> Result<Effects, EngineError> {
        if req.max_messages == 0 || req.max_messages > MOVES_PER_COMMAND_MAX {
            return Err(EngineError::param(
                "MaxNumberOfMessagesPerSecond",
                format!("must be 1 to {MOVES_PER_COMMAND_MAX}"),
            ));
        }
        match req.destination {
            MoveDestination::RedriveTarget => {
                return Err(EngineError::param(
                    "DestinationArn",
                    "a redrive goes to the dead-letter source or to a named queue",
                ))
            }
            MoveDestination::Queue(q) if q == self.cfg.queue_id => {
                return Err(EngineError::param(
                    "DestinationArn",
                    "the destination must differ from the source queue",
                ))
            }
            _ => {}
        }
        let fifo = self.fifo();
        let mut fx = Effects::reply(Reply::None);
        let mut out = MovesStarted {
            started: 0,
            skipped_no_destination: 0,
            next_from_id: None,
        };
        let mut cursor = req.from_id;
        let mut scanned = 0u32;
        while let Some((&id, m)) = self.msgs.range(cursor..).next() {
            if out.started >= req.max_messages || scanned >= MOVE_SCAN_PER_COMMAND_MAX {
                out.next_from_id = Some(id);
                break;
            }
            scanned += 1;
            cursor = id + 1;
            if m.state != State::Available {
                continue;
            }
            if fifo {
                let grp = self.groups[m.group as usize]
                    .as_ref()
                    .expect("message's group exists");
                if grp.inflight > 0 || grp.members.first() != Some(&id) {
                    continue;
                }
            }
            if req.destination == MoveDestination::DeadLetterSource && m.origin.is_none() {
                out.skipped_no_destination += 1;
                continue;
            }
            let rec = Record {
                at_ms: now,
                kind: RecordKind::DlqMoveStarted {
                    id,
                    destination: req.destination,
                },
            };
            self.apply_live(&rec);
            let m = self.msgs.get(&id).expect("moving message is present");
            fx.moves.push(self.move_request(id, m));
            fx.records.push(rec);
            out.started += 1;
        }
        fx.reply = Reply::MovesStarted(out);
        Ok(fx)
    }

    /// Destination side of a move. A dead-letter move keeps the message's history that SQS
    /// keeps (original send time for retention, the dead-letter source); a redrive makes a
    /// fresh message (receive count 0, retention from now, no dead-letter source), keeping its
    /// MessageId and content. Either way the origin is remembered for idempotency.
    fn accept_move(&mut self, now: u64, req: MoveRequest) -> Result<Effects, EngineError> {
        let o = req.origin;
        if self
            .origins
            .contains_key(&(o.queue_id, o.partition, o.msg_id))
        {
            return Ok(Effects::reply(Reply::MoveAccepted));
        }
        if self.fifo() && req.payload.group_id.is_none() {
            return Err(EngineError::param(
                "MessageGroupId",
                "a FIFO dead-letter queue needs messages with a group",
            ));
        }
        if self.origins.len() >= self.cfg.limits.move_origins_max as usize {
            return Err(EngineError::OverLimit("too many recent dead-letter moves"));
        }
        self.check_capacity()?;
        let rec = Record {
            at_ms: now,
            kind: RecordKind::Sent(Sent {
                id: self.next_id,
                message_id: req.message_id,
                visible_at_ms: now,
                payload: req.payload,
                origin: Some(o),
                redriven: req.destination.is_redrive(),
            }),
        };
        self.apply_live(&rec);
        Ok(Effects {
            first_offset: 0,
            records: vec![rec],
            reply: Reply::MoveAccepted,
            moves: Vec::new(),
        })
    }

    // ----- time -----

    /// Runs every timer due at or before `now_ms` and returns the engine's clock, which never
    /// goes back (a clock step backwards is treated as no time passing).
    fn advance(&mut self, now_ms: u64) -> u64 {
        let now = now_ms.max(self.now_ms);
        self.now_ms = now;
        while let Some(&Reverse((due, kind, id, epoch))) = self.timers.peek() {
            if due > now {
                break;
            }
            self.timers.pop();
            let Some(m) = self.msgs.get(&id) else {
                continue;
            };
            match kind {
                TIMER_LEASE => {
                    if matches!(m.state, State::InFlight { deadline_ms, .. } if deadline_ms == due)
                        && m.receive_count == epoch
                    {
                        self.transition(id, State::Available);
                    }
                }
                TIMER_DELAY => {
                    if m.state == State::Delayed && m.visible_at_ms == due {
                        self.transition(id, State::Available);
                    }
                }
                _ => {
                    if m.state != State::Moving {
                        let expires = m.sent_ms.saturating_add(self.retention_ms);
                        if expires <= now {
                            self.remove(id);
                        } else if expires != due {
                            // Retention grew since this timer was set.
                            self.timers.push(Reverse((expires, TIMER_RETENTION, id, 0)));
                        }
                    }
                }
            }
        }
        while let Some((expires, _)) = self.dedup_order.front() {
            if *expires > now {
                break;
            }
            let (expires, key) = self.dedup_order.pop_front().expect("front exists");
            if self
                .dedup
                .get(&key)
                .is_some_and(|e| e.expires_ms == expires)
            {
                self.dedup.remove(&key);
            }
        }
        while let Some((&seq, key)) = self.attempt_order.first_key_value() {
            let at = self.attempts.get(key).map_or(0, |e| e.at_ms);
            if at + ATTEMPT_WINDOW_MS > now {
                break;
            }
            let key = key.clone();
            self.attempt_order.remove(&seq);
            self.attempts.remove(&key);
        }
        while let Some((expires, _, _)) = self.origin_order.front() {
            if *expires > now {
                break;
            }
            let (_, key, _) = self.origin_order.pop_front().expect("front exists");
            self.origins.remove(&key);
        }
        // Superseded timers are dropped lazily; rebuild when they outnumber live ones so the
        // heap stays O(messages).
        if self.timers.len() > 3 * self.msgs.len() + 64 {
            self.rebuild_timers();
        }
        now
    }

    fn rebuild_timers(&mut self) {
        let mut v = Vec::with_capacity(2 * self.msgs.len());
        for (&id, m) in &self.msgs {
            v.push(Reverse((
                m.sent_ms.saturating_add(self.retention_ms),
                TIMER_RETENTION,
                id,
                0,
            )));
            match m.state {
                State::Delayed => v.push(Reverse((m.visible_at_ms, TIMER_DELAY, id, 0))),
                State::InFlight { deadline_ms, .. } => {
                    v.push(Reverse((deadline_ms, TIMER_LEASE, id, m.receive_count)))
                }
                _ => {}
            }
        }
        self.timers = BinaryHeap::from(v);
    }

    // ----- the one state-change function -----

    /// Applies the record at log `offset`, and counts it.
    fn apply_at(&mut self, offset: u64, rec: &Record) -> Result<(), ReplayError> {
        self.apply(rec, offset)?;
        self.next_offset = offset + 1;
        if matches!(rec.kind, RecordKind::Checkpoint(_)) {
            self.records_since_checkpoint = 0;
        } else {
            self.records_since_checkpoint += 1;
        }
        Ok(())
    }

    /// A record about message `id`, which is not here: skipped if its `Sent` may have been
    /// compacted away, else the log is inconsistent.
    fn unknown(&self, id: u64, at_ms: u64, reason: &'static str) -> Result<(), ReplayError> {
        if !self.strict && id < self.ignore_below_id {
            Ok(())
        } else {
            Err(ReplayError { at_ms, reason })
        }
    }

    fn note_attempt(
        &mut self,
        attempt: &str,
        batch_start: bool,
        item: (u64, u32),
        at: u64,
        offset: u64,
    ) {
        let seq = self.receive_seq;
        if batch_start {
            if let Some(old) = self.attempts.remove(attempt) {
                self.attempt_order.remove(&old.first_seq);
            }
            self.attempts.insert(
                attempt.to_string(),
                AttemptEntry {
                    at_ms: at,
                    first_seq: seq,
                    items: vec![item],
                    offset,
                },
            );
            self.attempt_order.insert(seq, attempt.to_string());
            while self.attempts.len() > self.cfg.limits.attempt_ids_max as usize {
                let Some((_, k)) = self.attempt_order.pop_first() else {
                    break;
                };
                self.attempts.remove(&k);
            }
        } else if let Some(e) = self.attempts.get_mut(attempt) {
            e.items.push(item);
        }
    }

    fn set_retention(&mut self, retention_ms: u64) {
        let shorter = retention_ms < self.retention_ms;
        self.retention_ms = retention_ms;
        if shorter {
            // Existing retention timers would fire late; add earlier ones (the old ones then
            // find the message gone).
            for (&id, m) in &self.msgs {
                self.timers.push(Reverse((
                    m.sent_ms.saturating_add(retention_ms),
                    TIMER_RETENTION,
                    id,
                    0,
                )));
            }
        }
    }

    fn apply_checkpoint(
        &mut self,
        cp: &Checkpoint,
        at: u64,
        offset: u64,
    ) -> Result<(), ReplayError> {
        let bad = |reason| Err(ReplayError { at_ms: at, reason });
        if self.skipping {
            // The start of a compacted log: the state so far is empty; start from here.
            self.skipping = false;
            self.replay_start = Some(offset);
            self.ignore_below_id = cp.next_id;
        } else if self.strict {
            // Pair assertion: what the writer saw is what replay rebuilt.
            if (cp.next_id, cp.receive_seq, cp.last_purge_ms)
                != (self.next_id, self.receive_seq, self.last_purge_ms)
            {
                return bad("checkpoint disagrees with the replayed counters");
            }
        } else if cp.next_id < self.next_id {
            return bad("checkpoint behind the message ids");
        }
        self.next_id = cp.next_id;
        self.receive_seq = cp.receive_seq;
        self.last_purge_ms = cp.last_purge_ms;
        self.dedup_scope = cp.dedup_scope;
        self.set_retention(cp.retention_ms);
        if !self.strict {
            for (name, last_served) in &cp.groups {
                if let Some(&g) = self.group_by_name.get(name.as_str()) {
                    self.group_mut(g).last_served = *last_served;
                    self.refresh_ready(g);
                }
            }
            // Every message live here was sent at or above `live_floor`: if replay saw that
            // far back, it knows them all from now on.
            if cp.live_floor >= self.replay_start.unwrap_or(0) {
                self.strict = true;
            }
        }
        if self.strict {
            if cp.live_count != self.msgs.len() as u64 {
                return bad("checkpoint disagrees with the replayed messages");
            }
            if cp.groups != self.group_list() {
                return bad("checkpoint disagrees with the replayed groups");
            }
        }
        self.last_checkpoint = Some(LastCheckpoint {
            offset,
            live_floor: cp.live_floor,
            at_ms: at,
        });
        self.checkpoints.push_back(offset);
        if self.strict {
            let floor = self.compaction_floor();
            while self.checkpoints.len() > 1 && self.checkpoints[1] <= floor {
                self.checkpoints.pop_front();
            }
            if self.checkpoints.len() > CHECKPOINTS_KEPT_MAX {
                // Thin out the oldest above the floor: the floor stays valid, only coarser.
                self.checkpoints.remove(1);
            }
        }
        Ok(())
    }

    fn apply(&mut self, rec: &Record, offset: u64) -> Result<(), ReplayError> {
        let at = rec.at_ms;
        let bad = |reason| Err(ReplayError { at_ms: at, reason });
        match &rec.kind {
            RecordKind::Sent(s) => {
                if s.id < self.next_id || s.id >= MSG_ID_MAX {
                    return bad("message ids must increase");
                }
                if self.fifo() && s.payload.group_id.is_none() {
                    return bad("FIFO message without a group");
                }
                self.next_id = s.id + 1;
                let gname = s.payload.group_id.as_deref().unwrap_or("");
                let g = self.group_for(gname);
                if s.redriven && s.origin.is_none() {
                    return bad("redriven message without an origin");
                }
                // A dead letter keeps its original send time (retention counts from it, as in
                // SQS); a redriven message starts afresh.
                let sent_ms = match s.origin {
                    Some(o) if !s.redriven => o.sent_ms,
                    _ => at,
                };
                let state = if s.visible_at_ms > at {
                    State::Delayed
                } else {
                    State::Available
                };
                self.msgs.insert(
                    s.id,
                    Msg {
                        message_id: s.message_id,
                        sent_ms,
                        arrived_ms: at,
                        visible_at_ms: s.visible_at_ms,
                        receive_count: 0,
                        first_receive_ms: None,
                        state,
                        group: g,
                        sent_offset: offset,
                        touched: false,
                        origin: if s.redriven { None } else { s.origin },
                        move_to: MoveDestination::RedriveTarget,
                    },
                );
                let fifo = self.fifo();
                let grp = self.group_mut(g);
                grp.msg_count += 1;
                if fifo || state == State::Available {
                    grp.members.insert(s.id);
                }
                self.count(state, 1);
                self.timers.push(Reverse((
                    sent_ms.saturating_add(self.retention_ms),
                    TIMER_RETENTION,
                    s.id,
                    0,
                )));
                if state == State::Delayed {
                    self.timers
                        .push(Reverse((s.visible_at_ms, TIMER_DELAY, s.id, 0)));
                }
                match (&s.origin, &s.payload.dedup_id) {
                    (Some(o), _) => {
                        let key = (o.queue_id, o.partition, o.msg_id);
                        let expires = at + MOVE_ORIGIN_WINDOW_MS;
                        self.origins.insert(key, expires);
                        self.origin_order.push_back((expires, key, offset));
                    }
                    (None, Some(d)) if fifo => {
                        let key = self.dedup_key(s.payload.group_id.as_deref(), d);
                        if !self.dedup.contains_key(&key) {
                            let expires_ms = at + DEDUP_WINDOW_MS;
                            self.dedup.insert(
                                key.clone(),
                                DedupEntry {
                                    message_id: s.message_id,
                                    seq: s.id,
                                    expires_ms,
                                    offset,
                                },
                            );
                            self.dedup_order.push_back((expires_ms, key));
                        }
                    }
                    _ => {}
                }
                self.refresh_ready(g);
            }
            RecordKind::Received {
                id,
                receive_count,
                deadline_ms,
                attempt_id,
                batch_start,
            } => {
                let Some(m) = self.msgs.get_mut(id) else {
                    self.unknown(*id, at, "receive of an unknown message")?;
                    // Sent before a compacted start: the counters and the attempt cache
                    // still count it (the fairness key comes from the next checkpoint).
                    self.receive_seq += 1;
                    if let Some(a) = attempt_id {
                        self.note_attempt(a, *batch_start, (*id, *receive_count), at, offset);
                    }
                    return Ok(());
                };
                if m.state != State::Available || *receive_count != m.receive_count + 1 {
                    return bad("receive of a message that is not available");
                }
                m.receive_count = *receive_count;
                if m.first_receive_ms.is_none() {
                    m.first_receive_ms = Some(at);
                }
                m.touched = false;
                let g = m.group;
                self.receive_seq += 1;
                let seq = self.receive_seq;
                self.group_mut(g).last_served = seq;
                self.transition(
                    *id,
                    State::InFlight {
                        deadline_ms: *deadline_ms,
                        lease_start_ms: at,
                    },
                );
                self.timers
                    .push(Reverse((*deadline_ms, TIMER_LEASE, *id, *receive_count)));
                if let Some(a) = attempt_id {
                    self.note_attempt(a, *batch_start, (*id, *receive_count), at, offset);
                }
            }
            RecordKind::VisibilityChanged {
                id,
                epoch,
                deadline_ms,
                attempt_retry,
            } => {
                let Some(m) = self.msgs.get_mut(id) else {
                    return self.unknown(*id, at, "visibility change of an unknown message");
                };
                let State::InFlight { lease_start_ms, .. } = m.state else {
                    return bad("visibility change of a message not in flight");
                };
                if m.receive_count != *epoch {
                    return bad("visibility change of a stale lease");
                }
                m.state = State::InFlight {
                    deadline_ms: *deadline_ms,
                    lease_start_ms,
                };
                if !attempt_retry {
                    m.touched = true;
                }
                self.timers
                    .push(Reverse((*deadline_ms, TIMER_LEASE, *id, *epoch)));
            }
            RecordKind::Deleted { id } => {
                if !self.msgs.contains_key(id) {
                    return self.unknown(*id, at, "delete of an unknown message");
                }
                self.remove(*id);
            }
            RecordKind::Purged { before_id } => {
                let ids: Vec<u64> = self
                    .msgs
                    .range(..*before_id)
                    .filter(|(_, m)| m.state != State::Moving)
                    .map(|(id, _)| *id)
                    .collect();
                for id in ids {
                    self.remove(id);
                }
                self.last_purge_ms = Some(at);
            }
            RecordKind::DlqMoveStarted { id, destination } => {
                let Some(m) = self.msgs.get_mut(id) else {
                    return self.unknown(*id, at, "move of an unknown message");
                };
                if m.state != State::Available {
                    return bad("move of a message that is not available");
                }
                if *destination == MoveDestination::DeadLetterSource && m.origin.is_none() {
                    return bad("redrive to the dead-letter source of a message without one");
                }
                m.move_to = *destination;
                self.transition(*id, State::Moving);
            }
            RecordKind::DlqMoveDone { id } => {
                let Some(m) = self.msgs.get(id) else {
                    return self.unknown(*id, at, "move completion of an unknown message");
                };
                if m.state != State::Moving {
                    return bad("move completion of a message not being moved");
                }
                self.remove(*id);
            }
            RecordKind::Checkpoint(cp) => self.apply_checkpoint(cp, at, offset)?,
            RecordKind::Configured {
                retention_s,
                dedup_scope,
            } => {
                self.set_retention(u64::from(*retention_s) * 1000);
                self.dedup_scope = *dedup_scope;
            }
        }
        Ok(())
    }

    // ----- state helpers -----

    fn count(&mut self, s: State, delta: i64) {
        let c = match s {
            State::Delayed => &mut self.counters.delayed,
            State::Available => &mut self.counters.visible,
            State::InFlight { .. } => &mut self.counters.in_flight,
            State::Moving => &mut self.counters.moving,
        };
        *c = c.checked_add_signed(delta).expect("counter stays in range");
    }

    fn group_for(&mut self, name: &str) -> u32 {
        if let Some(&g) = self.group_by_name.get(name) {
            return g;
        }
        let name: Arc<str> = Arc::from(name);
        let group = Group {
            name: name.clone(),
            members: BTreeSet::new(),
            msg_count: 0,
            inflight: 0,
            moving: 0,
            last_served: 0,
            ready_key: None,
        };
        let g = match self.free_groups.pop() {
            Some(g) => {
                self.groups[g as usize] = Some(group);
                g
            }
            None => {
                self.groups.push(Some(group));
                u32::try_from(self.groups.len() - 1).expect("groups are bounded by messages")
            }
        };
        self.group_by_name.insert(name, g);
        g
    }

    fn group_mut(&mut self, g: u32) -> &mut Group {
        self.groups[g as usize]
            .as_mut()
            .expect("group of a live message exists")
    }

    /// Moves a present message to `new`, keeping counters, group membership and readiness.
    fn transition(&mut self, id: u64, new: State) {
        let fifo = self.fifo();
        let m = self
            .msgs
            .get_mut(&id)
            .expect("transition of a present message");
        let old = m.state;
        m.state = new;
        let g = m.group;
        self.count(old, -1);
        self.count(new, 1);
        let grp = self.group_mut(g);
        if !fifo {
            if old == State::Available {
                grp.members.remove(&id);
            }
            if new == State::Available {
                grp.members.insert(id);
            }
        } else if new == State::Moving {
            // Once `DlqMoveStarted` is durable the message has left the group's order (it is
            // never delivered from here again), so the group's next message may go out.
            grp.members.remove(&id);
        }
        match old {
            State::InFlight { .. } => grp.inflight -= 1,
            State::Moving => grp.moving -= 1,
            _ => {}
        }
        match new {
            State::InFlight { .. } => grp.inflight += 1,
            State::Moving => grp.moving += 1,
            _ => {}
        }
        if new == State::Moving {
            self.moving.insert(id);
        }
        self.refresh_ready(g);
    }

    fn remove(&mut self, id: u64) {
        let Some(m) = self.msgs.remove(&id) else {
            return;
        };
        self.count(m.state, -1);
        if m.state == State::Moving {
            self.moving.remove(&id);
        }
        let grp = self.group_mut(m.group);
        grp.members.remove(&id);
        grp.msg_count -= 1;
        match m.state {
            State::InFlight { .. } => grp.inflight -= 1,
            State::Moving => grp.moving -= 1,
            _ => {}
        }
        let empty = grp.msg_count == 0;
        self.refresh_ready(m.group);
        if empty {
            let grp = self.groups[m.group as usize]
                .take()
                .expect("group of a live message exists");
            debug_assert!(grp.ready_key.is_none() && grp.members.is_empty());
            self.group_by_name.remove(&grp.name);
            self.free_groups.push(m.group);
        }
    }

    /// Puts the group in `ready` under its current key, or takes it out.
    fn refresh_ready(&mut self, g: u32) {
        let fifo = self.fifo();
        let grp = self.groups[g as usize]
            .as_ref()
            .expect("group of a live message exists");
        let head = grp.members.first().copied();
        let want = match head {
            Some(h) if !fifo => Some((grp.last_served, h)),
            Some(h)
                if grp.inflight == 0
                    && self.msgs.get(&h).map(|m| m.state) == Some(State::Available) =>
            {
                Some((grp.last_served, h))
            }
            _ => None,
        };
        if want == grp.ready_key {
            return;
        }
        if let Some((ls, h)) = grp.ready_key {
            self.ready.remove(&(ls, h, g));
        }
        if let Some((ls, h)) = want {
            self.ready.insert((ls, h, g));
        }
        self.group_mut(g).ready_key = want;
    }

    /// A canonical, order-independent picture of the whole state (for tests and inspection):
    /// equal dumps mean equal behaviour from here on.
    pub fn dump(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "now={} next_id={} receive_seq={} last_purge={:?} retention_ms={} scope={:?} \
             counters={:?} moving={:?} next_offset={} strict={} floor={} \
             since_checkpoint={} last_checkpoint={:?}",
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
        );
        for (id, m) in &self.msgs {
            let g = self.groups[m.group as usize]
                .as_ref()
                .map_or("?", |g| &g.name);
            let _ = writeln!(
                s,
                "msg {id} @{} {} group={g:?} sent={} arrived={} vis={} rc={} first={:?} {:?} \
                 touched={} origin={:?} to={:?}",
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
                m.move_to
            );
        }
        let mut groups: Vec<&Group> = self.groups.iter().flatten().collect();
        groups.sort_by(|a, b| a.name.cmp(&b.name));
        for g in groups {
            let _ = writeln!(
                s,
                "group {:?} members={:?} n={} inflight={} moving={} last_served={} ready={:?}",
                g.name, g.members, g.msg_count, g.inflight, g.moving, g.last_served, g.ready_key
            );
        }
        let mut dedup: Vec<_> = self.dedup.iter().collect();
        dedup.sort_by(|a, b| a.0.cmp(b.0));
        for (k, e) in dedup {
            let _ = writeln!(
                s,
                "dedup {k:?} {} {} {} @{}",
                e.message_id, e.seq, e.expires_ms, e.offset
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

/// A batch request holds 1 to [`BATCH_ENTRIES_MAX`] entries.
fn check_batch_len(n: usize) -> Result<(), EngineError> {
    match n {
        0 => Err(EngineError::EmptyBatchRequest),
        n if n > BATCH_ENTRIES_MAX => Err(EngineError::TooManyEntriesInBatchRequest),
        _ => Ok(()),
    }
}

/// SendMessageBatch's request-level rules: 1–10 entries, ids of 1–80 alphanumerics, `-`, `_`,
/// distinct, and at most 1 MiB of messages in total. Entry-level problems are per-entry results.
pub fn validate_batch(entries: &[BatchEntry]) -> Result<(), EngineError> {
    check_batch_len(entries.len())?;
    let mut total = 0usize;
    for (i, e) in entries.iter().enumerate() {
        if e.id.is_empty()
            || e.id.len() > BATCH_ENTRY_ID_LEN_MAX
            || !e
                .id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(EngineError::InvalidBatchEntryId(e.id.clone()));
        }
        if entries[..i].iter().any(|p| p.id == e.id) {
            return Err(EngineError::BatchEntryIdsNotDistinct(e.id.clone()));
        }
        total += e.request.body.len()
            + e.request
                .attributes
                .iter()
                .map(MessageAttribute::size_bytes)
                .sum::<usize>();
    }
    if total > BATCH_PAYLOAD_BYTES_MAX {
        return Err(EngineError::BatchRequestTooLong { size_bytes: total });
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    s
}
