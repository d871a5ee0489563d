//! What the checks find: typed anomalies that name the operations involved and their times.

use serde::Serialize;

use crate::history::Op;

/// An operation as an anomaly cites it.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
pub struct OpRef {
    pub op: u64,
    pub process: String,
    pub start_us: u64,
    /// `None`: never completed.
    pub end_us: Option<u64>,
}

impl From<&Op> for OpRef {
    fn from(o: &Op) -> Self {
        OpRef {
            op: o.id,
            process: o.process.clone(),
            start_us: o.start_us,
            end_us: o.end_us,
        }
    }
}

impl std::fmt::Display for OpRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.end_us {
            Some(end) => write!(
                f,
                "op {} by {} [{} us .. {} us]",
                self.op, self.process, self.start_us, end
            ),
            None => write!(
                f,
                "op {} by {} [{} us .. never completed]",
                self.op, self.process, self.start_us
            ),
        }
    }
}

/// Why a FIFO delivery is out of order.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FifoReason {
    /// The later message came before the earlier one in the same receive's list.
    ListedBeforeEarlier,
    /// The later message was delivered while the earlier one was certainly still undeleted (not
    /// yet delivered, or in flight): nothing could have deleted it yet.
    EarlierUndeleted,
}

/// One violation of the contract, with what is needed to find it in the history.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Anomaly {
    /// An acknowledged send whose message was never delivered, by the end of the final drain.
    LostWrite {
        queue: String,
        message_id: String,
        payload: String,
        send: OpRef,
    },
    /// Two receives held leases on the same message at once: whichever came first, the other
    /// completed before the first's start plus its visibility timeout, less the margin.
    DoubleLease {
        queue: String,
        message_id: String,
        first: OpRef,
        /// The first lease certainly lasted until here (start plus visibility timeout, or
        /// earlier if a change of visibility or a delete may have cut it).
        first_lease_until_us: u64,
        second: OpRef,
        margin_us: u64,
    },
    /// A receive that started after a delete of the message was acknowledged delivered it.
    DeletedRedelivered {
        queue: String,
        message_id: String,
        delete: OpRef,
        receive: OpRef,
        margin_us: u64,
    },
    /// A message group delivered out of its send order.
    FifoOrder {
        queue: String,
        group: String,
        earlier_message_id: String,
        later_message_id: String,
        receive: OpRef,
        reason: FifoReason,
    },
    /// Two messages stored for one deduplication key within the dedup window.
    DuplicateInWindow {
        queue: String,
        dedup_key: String,
        message_ids: [String; 2],
        /// Both were stored between these times (a span shorter than the window less the margin).
        stored_from_us: u64,
        stored_until_us: u64,
        window_us: u64,
        margin_us: u64,
    },
    /// One stream offset seen holding two different records.
    OffsetConflict {
        topic: String,
        partition: u32,
        offset: u64,
        payloads: [String; 2],
        /// The operations that showed each (a produce's ack or a fetch).
        seen_by: [OpRef; 2],
    },
    /// An acknowledged produce whose record the final fetches did not return at its offset.
    LostProduce {
        topic: String,
        partition: u32,
        offset: u64,
        payload: String,
        produce: OpRef,
    },
    /// A read of committed offsets lower than an earlier acknowledged commit or read.
    CommittedOffsetBack {
        group: String,
        topic: String,
        partition: u32,
        earlier: OpRef,
        earlier_offset: u64,
        read: OpRef,
        /// `None`: the read found no committed offset at all.
        read_offset: Option<u64>,
        margin_us: u64,
    },
    /// A payload nobody sent (or only a send that certainly failed) was delivered or fetched:
    /// corrupted, invented, or a refused call that happened after all.
    UnsentPayload {
        /// `queue <name>` or `<topic>/<partition> offset <n>`.
        place: String,
        /// The delivered message's id, for a queue.
        message_id: Option<String>,
        payload: String,
        seen_by: OpRef,
    },
}

/// The kinds of [`Anomaly`], for counting and tests.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum AnomalyKind {
    LostWrite,
    DoubleLease,
    DeletedRedelivered,
    FifoOrder,
    DuplicateInWindow,
    OffsetConflict,
    LostProduce,
    CommittedOffsetBack,
    UnsentPayload,
}

impl AnomalyKind {
    pub const ALL: [AnomalyKind; 9] = [
        AnomalyKind::LostWrite,
        AnomalyKind::DoubleLease,
        AnomalyKind::DeletedRedelivered,
        AnomalyKind::FifoOrder,
        AnomalyKind::DuplicateInWindow,
        AnomalyKind::OffsetConflict,
        AnomalyKind::LostProduce,
        AnomalyKind::CommittedOffsetBack,
        AnomalyKind::UnsentPayload,
    ];

    pub fn name(self) -> &'static str {
        match self {
            AnomalyKind::LostWrite => "lost_write",
            AnomalyKind::DoubleLease => "double_lease",
            AnomalyKind::DeletedRedelivered => "deleted_redelivered",
            AnomalyKind::FifoOrder => "fifo_order",
            AnomalyKind::DuplicateInWindow => "duplicate_in_window",
            AnomalyKind::OffsetConflict => "offset_conflict",
            AnomalyKind::LostProduce => "lost_produce",
            AnomalyKind::CommittedOffsetBack => "committed_offset_back",
            AnomalyKind::UnsentPayload => "unsent_payload",
        }
    }
}

impl Anomaly {
    pub fn kind(&self) -> AnomalyKind {
        match self {
            Anomaly::LostWrite { .. } => AnomalyKind::LostWrite,
            Anomaly::DoubleLease { .. } => AnomalyKind::DoubleLease,
            Anomaly::DeletedRedelivered { .. } => AnomalyKind::DeletedRedelivered,
            Anomaly::FifoOrder { .. } => AnomalyKind::FifoOrder,
            Anomaly::DuplicateInWindow { .. } => AnomalyKind::DuplicateInWindow,
            Anomaly::OffsetConflict { .. } => AnomalyKind::OffsetConflict,
            Anomaly::LostProduce { .. } => AnomalyKind::LostProduce,
            Anomaly::CommittedOffsetBack { .. } => AnomalyKind::CommittedOffsetBack,
            Anomaly::UnsentPayload { .. } => AnomalyKind::UnsentPayload,
        }
    }

    /// One line for the human report.
    pub fn describe(&self) -> String {
        match self {
            Anomaly::LostWrite {
                queue,
                message_id,
                payload,
                send,
            } => format!(
                "queue {queue}: message {message_id} (payload {payload}) acknowledged by {send}, never delivered"
            ),
            Anomaly::DoubleLease {
                queue,
                message_id,
                first,
                first_lease_until_us,
                second,
                margin_us,
            } => format!(
                "queue {queue}: message {message_id} leased by {first} until at least {first_lease_until_us} us, \
                 and delivered again by {second} (margin {margin_us} us)"
            ),
            Anomaly::DeletedRedelivered {
                queue,
                message_id,
                delete,
                receive,
                margin_us,
            } => format!(
                "queue {queue}: message {message_id} deleted by {delete}, delivered again by {receive} \
                 (started more than {margin_us} us after the delete's ack)"
            ),
            Anomaly::FifoOrder {
                queue,
                group,
                earlier_message_id,
                later_message_id,
                receive,
                reason,
            } => {
                let why = match reason {
                    FifoReason::ListedBeforeEarlier => "listed before",
                    FifoReason::EarlierUndeleted => "delivered while still undeleted:",
                };
                format!(
                    "queue {queue} group {group}: {receive} delivered {later_message_id} {why} \
                     {earlier_message_id}, sent before it"
                )
            }
            Anomaly::DuplicateInWindow {
                queue,
                dedup_key,
                message_ids,
                stored_from_us,
                stored_until_us,
                window_us,
                margin_us,
            } => format!(
                "queue {queue}: dedup key {dedup_key} stored twice ({} and {}), both between {stored_from_us} us \
                 and {stored_until_us} us (window {window_us} us, margin {margin_us} us)",
                message_ids[0], message_ids[1]
            ),
            Anomaly::OffsetConflict {
                topic,
                partition,
                offset,
                payloads,
                seen_by,
            } => format!(
                "{topic}/{partition} offset {offset}: {} by {} but {} by {}",
                payloads[0], seen_by[0], payloads[1], seen_by[1]
            ),
            Anomaly::LostProduce {
                topic,
                partition,
                offset,
                payload,
                produce,
            } => format!(
                "{topic}/{partition}: {payload} acknowledged at offset {offset} by {produce}, \
                 not returned there by the final fetches"
            ),
            Anomaly::CommittedOffsetBack {
                group,
                topic,
                partition,
                earlier,
                earlier_offset,
                read,
                read_offset,
                margin_us,
            } => {
                let got = read_offset.map_or_else(|| "none".to_string(), |o| o.to_string());
                format!(
                    "group {group} {topic}/{partition}: {read} read committed offset {got}, \
                     below {earlier_offset} acknowledged by {earlier} (margin {margin_us} us)"
                )
            }
            Anomaly::UnsentPayload {
                place,
                message_id,
                payload,
                seen_by,
            } => {
                let id = message_id
                    .as_ref()
                    .map_or_else(String::new, |m| format!(" as message {m}"));
                format!(
                    "{place}: {seen_by} got payload {payload}{id}, which no send or produce \
                     that may have happened carried"
                )
            }
        }
    }
}
