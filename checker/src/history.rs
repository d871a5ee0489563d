//! The history: what clients saw, as JSON lines (one [`Event`] a line; the schema is in the
//! crate's README), and the operations it pairs them into.
//!
//! Times are microseconds of one monotonic clock shared by every client of a run
//! (`CLOCK_MONOTONIC` on one host); only differences matter.

use std::collections::HashMap;
use std::io::BufRead;

use serde::{Deserialize, Serialize};

/// One line of a history file.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(tag = "event", rename_all = "snake_case", deny_unknown_fields)]
pub enum Event {
    /// A client is about to issue `call` (recorded before the first byte leaves).
    Invoke {
        op: u64,
        process: String,
        time_us: u64,
        call: Call,
    },
    /// The call `op` completed (recorded after the answer, or the give-up, arrived).
    Complete {
        op: u64,
        time_us: u64,
        outcome: Outcome,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result: Option<Reply>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// The faults are healed and the final drain begins: every queue is received until empty and
    /// every partition fetched to its end after this point.
    Drain { time_us: u64 },
}

/// How a call ended.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// It happened, with the result given.
    Ok,
    /// It definitely did not happen (the server said so before doing anything).
    Fail,
    /// Indeterminate (timeout, connection lost): it may or may not have happened, at any moment
    /// after its start — even after the client gave up.
    Info,
}

/// What a client asked for.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Call {
    /// A queue send. `payload` is the body, or a unique id the body carries: two sends with the
    /// same payload send the same body (a retry), different payloads different bodies.
    Send {
        queue: String,
        payload: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        group: Option<String>,
        /// The explicit deduplication id.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dedup: Option<String>,
        /// Content-based deduplication: without `dedup`, the body (the payload) is the key.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        content_dedup: bool,
        /// The queue deduplicates per message group (SQS's `DeduplicationScope=messageGroup`),
        /// not across the queue.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        dedup_per_group: bool,
    },
    /// A queue receive; `visibility_timeout_ms` is the timeout in force (the queue's default when
    /// the request names none).
    Receive {
        queue: String,
        visibility_timeout_ms: u64,
    },
    Delete {
        queue: String,
        message_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        receipt: Option<String>,
    },
    ChangeVisibility {
        queue: String,
        message_id: String,
        receipt: String,
        visibility_timeout_ms: u64,
    },
    Produce {
        topic: String,
        partition: u32,
        payload: String,
    },
    Fetch {
        topic: String,
        partition: u32,
        from_offset: u64,
    },
    CommitOffset {
        group: String,
        topic: String,
        partition: u32,
        offset: u64,
    },
    FetchCommitted {
        group: String,
        topic: String,
        partition: u32,
    },
}

/// An `ok` call's result. Its `type` is the call's.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Reply {
    Send {
        message_id: String,
    },
    Receive {
        messages: Vec<Delivered>,
    },
    Delete {},
    ChangeVisibility {},
    Produce {
        offset: u64,
    },
    Fetch {
        records: Vec<Record>,
    },
    CommitOffset {},
    /// `offset` is absent when the group has no committed offset for the partition.
    FetchCommitted {
        #[serde(default)]
        offset: Option<u64>,
    },
}

/// One message of a receive's result.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Delivered {
    pub message_id: String,
    pub payload: String,
    pub receipt: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receive_count: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// One record of a fetch's result.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Record {
    pub offset: u64,
    pub payload: String,
}

impl Call {
    /// The kind's name, as in the JSON (`send`, `receive`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Call::Send { .. } => "send",
            Call::Receive { .. } => "receive",
            Call::Delete { .. } => "delete",
            Call::ChangeVisibility { .. } => "change_visibility",
            Call::Produce { .. } => "produce",
            Call::Fetch { .. } => "fetch",
            Call::CommitOffset { .. } => "commit_offset",
            Call::FetchCommitted { .. } => "fetch_committed",
        }
    }

    /// Whether an `ok` completion must carry a result (the others' results are empty).
    fn needs_reply(&self) -> bool {
        matches!(
            self,
            Call::Send { .. }
                | Call::Receive { .. }
                | Call::Produce { .. }
                | Call::Fetch { .. }
                | Call::FetchCommitted { .. }
        )
    }
}

impl Reply {
    pub fn kind(&self) -> &'static str {
        match self {
            Reply::Send { .. } => "send",
            Reply::Receive { .. } => "receive",
            Reply::Delete { .. } => "delete",
            Reply::ChangeVisibility { .. } => "change_visibility",
            Reply::Produce { .. } => "produce",
            Reply::Fetch { .. } => "fetch",
            Reply::CommitOffset { .. } => "commit_offset",
            Reply::FetchCommitted { .. } => "fetch_committed",
        }
    }
}

/// An invoke paired with its completion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    pub id: u64,
    pub process: String,
    pub start_us: u64,
    /// `None`: never completed (the client died): indeterminate, and may take effect at any
    /// later time.
    pub end_us: Option<u64>,
    pub outcome: Outcome,
    pub call: Call,
    /// Present exactly when `outcome` is `Ok` (empty kinds get their empty reply).
    pub reply: Option<Reply>,
    pub error: Option<String>,
}

impl Op {
    /// The latest moment the call can have taken effect: its end, or never for an
    /// indeterminate one (a lost request may still be retransmitted and applied).
    pub fn effect_until_us(&self) -> u64 {
        match (self.outcome, self.end_us) {
            (Outcome::Ok | Outcome::Fail, Some(end)) => end,
            _ => u64::MAX,
        }
    }
}

/// A whole history: its operations in invoke order and the drain marker.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    pub ops: Vec<Op>,
    pub drain_us: Option<u64>,
}

/// Why a history file cannot be judged.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("reading the history: {0}")]
    Io(#[from] std::io::Error),
    #[error("line {line}: not a history event: {source}")]
    Parse {
        line: usize,
        source: serde_json::Error,
    },
    #[error("line {line}: operation {op} invoked twice")]
    DuplicateInvoke { line: usize, op: u64 },
    #[error("line {line}: operation {op} completed but never invoked (an invoke must come first)")]
    CompleteWithoutInvoke { line: usize, op: u64 },
    #[error("line {line}: operation {op} completed twice")]
    DuplicateComplete { line: usize, op: u64 },
    #[error("line {line}: operation {op} ends at {end_us} us, before its start at {start_us} us")]
    EndBeforeStart {
        line: usize,
        op: u64,
        start_us: u64,
        end_us: u64,
    },
    #[error("line {line}: operation {op} is a {call} but its result is a {reply}")]
    ReplyMismatch {
        line: usize,
        op: u64,
        call: &'static str,
        reply: String,
    },
    #[error("line {line}: operation {op} ({call}) is ok but has no result")]
    MissingReply {
        line: usize,
        op: u64,
        call: &'static str,
    },
    #[error("line {line}: a second drain marker (the first at {first_us} us)")]
    DuplicateDrain { line: usize, first_us: u64 },
}

impl History {
    /// Reads JSON lines; blank lines are skipped.
    pub fn from_jsonl(reader: impl BufRead) -> Result<History, HistoryError> {
        let mut events = Vec::new();
        for (i, line) in reader.lines().enumerate() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            let event = serde_json::from_str(&line).map_err(|source| HistoryError::Parse {
                line: i + 1,
                source,
            })?;
            events.push((i + 1, event));
        }
        Self::from_numbered_events(events)
    }

    /// Pairs events (in file order) into operations.
    pub fn from_events(events: impl IntoIterator<Item = Event>) -> Result<History, HistoryError> {
        Self::from_numbered_events(events.into_iter().enumerate().map(|(i, e)| (i + 1, e)))
    }

    fn from_numbered_events(
        events: impl IntoIterator<Item = (usize, Event)>,
    ) -> Result<History, HistoryError> {
        let mut history = History::default();
        let mut slot: HashMap<u64, usize> = HashMap::new();
        let mut completed = Vec::new();
        for (line, event) in events {
            match event {
                Event::Invoke {
                    op,
                    process,
                    time_us,
                    call,
                } => {
                    if slot.insert(op, history.ops.len()).is_some() {
                        return Err(HistoryError::DuplicateInvoke { line, op });
                    }
                    history.ops.push(Op {
                        id: op,
                        process,
                        start_us: time_us,
                        end_us: None,
                        outcome: Outcome::Info,
                        call,
                        reply: None,
                        error: None,
                    });
                    completed.push(false);
                }
                Event::Complete {
                    op,
                    time_us,
                    outcome,
                    result,
                    error,
                } => {
                    let &i = slot
                        .get(&op)
                        .ok_or(HistoryError::CompleteWithoutInvoke { line, op })?;
                    if completed[i] {
                        return Err(HistoryError::DuplicateComplete { line, op });
                    }
                    completed[i] = true;
                    let o = &mut history.ops[i];
                    if time_us < o.start_us {
                        return Err(HistoryError::EndBeforeStart {
                            line,
                            op,
                            start_us: o.start_us,
                            end_us: time_us,
                        });
                    }
                    o.end_us = Some(time_us);
                    o.outcome = outcome;
                    o.error = error;
                    if outcome == Outcome::Ok {
                        o.reply = Some(Self::ok_reply(line, o, result)?);
                    }
                }
                Event::Drain { time_us } => {
                    if let Some(first_us) = history.drain_us {
                        return Err(HistoryError::DuplicateDrain { line, first_us });
                    }
                    history.drain_us = Some(time_us);
                }
            }
        }
        Ok(history)
    }

    fn ok_reply(line: usize, o: &Op, result: Option<Reply>) -> Result<Reply, HistoryError> {
        let call = o.call.kind();
        match result {
            Some(r) if r.kind() == call => Ok(r),
            Some(r) => Err(HistoryError::ReplyMismatch {
                line,
                op: o.id,
                call,
                reply: r.kind().to_string(),
            }),
            None if o.call.needs_reply() => Err(HistoryError::MissingReply {
                line,
                op: o.id,
                call,
            }),
            None => Ok(match o.call {
                Call::Delete { .. } => Reply::Delete {},
                Call::ChangeVisibility { .. } => Reply::ChangeVisibility {},
                _ => Reply::CommitOffset {},
            }),
        }
    }

    /// The events that describe this history (invokes, then completions and the drain marker
    /// in time order), for writing it back out.
    pub fn to_events(&self) -> Vec<Event> {
        let mut timed: Vec<(u64, u8, Event)> = Vec::new();
        for o in &self.ops {
            timed.push((
                o.start_us,
                0,
                Event::Invoke {
                    op: o.id,
                    process: o.process.clone(),
                    time_us: o.start_us,
                    call: o.call.clone(),
                },
            ));
            if let Some(end) = o.end_us {
                timed.push((
                    end,
                    1,
                    Event::Complete {
                        op: o.id,
                        time_us: end,
                        outcome: o.outcome,
                        result: o.reply.clone(),
                        error: o.error.clone(),
                    },
                ));
            }
        }
        if let Some(t) = self.drain_us {
            timed.push((t, 1, Event::Drain { time_us: t }));
        }
        // Stable: an invoke stays before its own completion even at the same microsecond.
        timed.sort_by_key(|(t, rank, _)| (*t, *rank));
        timed.into_iter().map(|(_, _, e)| e).collect()
    }

    /// The history as JSON lines.
    pub fn to_jsonl(&self) -> String {
        let mut out = String::new();
        for e in self.to_events() {
            // Serializing these plain enums cannot fail (string keys, no maps).
            out.push_str(&serde_json::to_string(&e).unwrap_or_default());
            out.push('\n');
        }
        out
    }
}
