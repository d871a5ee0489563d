//! The checks. Each is a function of the [`Index`] and the [`Config`] that returns the
//! anomalies it is sure of — a correct system could not have produced them, whatever
//! indeterminate calls did and whenever inside its interval each call took effect — and what it
//! could not decide.
//!
//! Time reasoning: a call took effect at one moment between its start and its end (an `info`
//! or never-completed one: at any moment after its start, or never). Intervals are widened by the
//! margin wherever two clocks' readings meet (the broker's lease and dedup timers against the
//! clients' stamps).

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::anomaly::{Anomaly, FifoReason, OpRef};
use crate::history::{Call, Delivered, History, Op, Outcome, Reply};

/// The deduplication window of CONTRACT.md C4.
pub const DEDUP_WINDOW_US: u64 = 5 * 60 * 1_000_000;
/// The default clock and time-measurement margin.
pub const MARGIN_MS_DEFAULT: u64 = 100;
const US_PER_MS: u64 = 1_000;

/// What the checks assume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Subtracted from every "must have" deadline before it is held against a client's clock.
    pub margin_us: u64,
    pub dedup_window_us: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            margin_us: MARGIN_MS_DEFAULT * US_PER_MS,
            dedup_window_us: DEDUP_WINDOW_US,
        }
    }
}

/// What one check found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Checked {
    pub anomalies: Vec<Anomaly>,
    /// What the check could not judge, and why (e.g. no final drain).
    pub undecided: Vec<String>,
}

/// One message of one receive's result.
#[derive(Clone, Copy, Debug)]
pub struct Delivery<'h> {
    pub receive: &'h Op,
    pub position: usize,
    pub queue: &'h str,
    pub message: &'h Delivered,
}

impl Delivery<'_> {
    fn end_us(&self) -> u64 {
        // An ok receive has completed.
        self.receive.end_us.unwrap_or(u64::MAX)
    }

    fn visibility_us(&self) -> u64 {
        match &self.receive.call {
            Call::Receive {
                visibility_timeout_ms,
                ..
            } => visibility_timeout_ms.saturating_mul(US_PER_MS),
            _ => 0,
        }
    }
}

/// A message the history shows was stored: an ok send returned its id, or a receive delivered it.
#[derive(Clone, Debug)]
pub struct Stored<'h> {
    pub id: &'h str,
    pub queue: &'h str,
    pub group: Option<&'h str>,
    pub dedup_key: Option<String>,
    /// It was stored no earlier than this (the earliest start of a send that can have stored it)...
    pub stored_from_us: u64,
    /// ...and no later than this (the earliest ack of a send returning it, or of a receive
    /// delivering it).
    pub stored_until_us: u64,
    pub ok_sends: Vec<&'h Op>,
}

/// The history arranged for the checks.
pub struct Index<'h> {
    pub history: &'h History,
    pub deliveries: HashMap<&'h str, Vec<Delivery<'h>>>,
    pub stored: BTreeMap<&'h str, Stored<'h>>,
    /// Non-fail deletes by message id.
    pub deletes: HashMap<&'h str, Vec<&'h Op>>,
    /// Non-fail visibility changes by receipt.
    pub visibility_changes: HashMap<&'h str, Vec<&'h Op>>,
}

/// A send's deduplication key: the explicit id, else the body under content-based dedup;
/// prefixed with the group when the queue deduplicates per group.
fn send_key(call: &Call) -> Option<String> {
    let Call::Send {
        payload,
        group,
        dedup,
        content_dedup,
        dedup_per_group,
        ..
    } = call
    else {
        return None;
    };
    let key = match dedup {
        Some(d) => d,
        None if *content_dedup => payload,
        None => return None,
    };
    Some(match (dedup_per_group, group) {
        (true, Some(g)) => format!("{g}/{key}"),
        _ => key.clone(),
    })
}

impl<'h> Index<'h> {
    pub fn new(history: &'h History) -> Index<'h> {
        let mut deliveries: HashMap<&str, Vec<Delivery>> = HashMap::new();
        let mut deletes: HashMap<&str, Vec<&Op>> = HashMap::new();
        let mut visibility_changes: HashMap<&str, Vec<&Op>> = HashMap::new();
        let mut ok_sends: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
        // Indeterminate sends by (queue, payload) and by (queue, dedup key).
        let mut info_by_payload: HashMap<(&str, &str), Vec<&Op>> = HashMap::new();
        let mut info_by_key: HashMap<(&str, String), Vec<&Op>> = HashMap::new();
        for o in &history.ops {
            match (&o.call, o.outcome, &o.reply) {
                (Call::Send { .. }, Outcome::Ok, Some(Reply::Send { message_id })) => {
                    ok_sends.entry(message_id).or_default().push(o);
                }
                (Call::Send { queue, payload, .. }, Outcome::Info, _) => {
                    info_by_payload.entry((queue, payload)).or_default().push(o);
                    if let Some(k) = send_key(&o.call) {
                        info_by_key.entry((queue, k)).or_default().push(o);
                    }
                }
                (Call::Receive { queue, .. }, Outcome::Ok, Some(Reply::Receive { messages })) => {
                    for (position, m) in messages.iter().enumerate() {
                        deliveries.entry(&m.message_id).or_default().push(Delivery {
                            receive: o,
                            position,
                            queue,
                            message: m,
                        });
                    }
                }
                (Call::Delete { message_id, .. }, Outcome::Ok | Outcome::Info, _) => {
                    deletes.entry(message_id).or_default().push(o);
                }
                (Call::ChangeVisibility { receipt, .. }, Outcome::Ok | Outcome::Info, _) => {
                    visibility_changes.entry(receipt).or_default().push(o);
                }
                _ => {}
            }
        }
        for list in deliveries.values_mut() {
            list.sort_by_key(|d| (d.receive.start_us, d.receive.id, d.position));
        }
        for list in deletes.values_mut().chain(visibility_changes.values_mut()) {
            list.sort_by_key(|o| (o.start_us, o.id));
        }

        let mut stored = BTreeMap::new();
        let ids: HashSet<&str> = ok_sends
            .keys()
            .copied()
            .chain(deliveries.keys().copied())
            .collect();
        for id in ids {
            let sends = ok_sends.get(id).cloned().unwrap_or_default();
            let first_delivery = deliveries.get(id).and_then(|d| d.first());
            let Some(queue) = sends
                .first()
                .and_then(|s| match &s.call {
                    Call::Send { queue, .. } => Some(queue.as_str()),
                    _ => None,
                })
                .or(first_delivery.map(|d| d.queue))
            else {
                continue;
            };
            // The stored body is its storing send's: a delivery names it exactly.
            let payload = first_delivery.map(|d| d.message.payload.as_str());
            let mut candidates: Vec<&Op> = sends.clone();
            match payload {
                Some(p) => {
                    candidates.extend(info_by_payload.get(&(queue, p)).into_iter().flatten())
                }
                None => {
                    if let Some(k) = sends.first().and_then(|s| send_key(&s.call)) {
                        candidates.extend(info_by_key.get(&(queue, k)).into_iter().flatten());
                    }
                }
            }
            let stored_from_us = candidates.iter().map(|o| o.start_us).min().unwrap_or(0);
            let stored_until_us = sends
                .iter()
                .filter_map(|o| o.end_us)
                .chain(deliveries.get(id).into_iter().flatten().map(|d| d.end_us()))
                .min()
                .unwrap_or(u64::MAX);
            let first_call = candidates.first().map(|o| &o.call);
            let group = first_call
                .and_then(|c| match c {
                    Call::Send { group, .. } => group.as_deref(),
                    _ => None,
                })
                .or(first_delivery.and_then(|d| d.message.group.as_deref()));
            let dedup_key = first_call.and_then(send_key);
            stored.insert(
                id,
                Stored {
                    id,
                    queue,
                    group,
                    dedup_key,
                    stored_from_us,
                    stored_until_us,
                    ok_sends: sends,
                },
            );
        }
        Index {
            history,
            deliveries,
            stored,
            deletes,
            visibility_changes,
        }
    }

    fn delivered_on(&self, id: &str, queue: &str) -> bool {
        self.deliveries
            .get(id)
            .is_some_and(|ds| ds.iter().any(|d| d.queue == queue))
    }

    fn delivered_elsewhere(&self, id: &str, queue: &str) -> bool {
        self.deliveries
            .get(id)
            .is_some_and(|ds| ds.iter().any(|d| d.queue != queue))
    }

    fn after_drain(&self, o: &Op) -> bool {
        self.history.drain_us.is_some_and(|t| o.start_us >= t)
    }
}

/// Check 1: an acknowledged send whose message no receive ever delivered, by the end of the final
/// drain (a delivery from another queue — a dead-letter queue — counts).
pub fn lost_writes(ix: &Index, _cfg: &Config) -> Checked {
    let mut out = Checked::default();
    let queues_sent: BTreeMap<&str, usize> = ix
        .stored
        .values()
        .filter(|s| !s.ok_sends.is_empty())
        .fold(BTreeMap::new(), |mut m, s| {
            *m.entry(s.queue).or_insert(0) += 1;
            m
        });
    if queues_sent.is_empty() {
        return out;
    }
    if ix.history.drain_us.is_none() {
        out.undecided.push(format!(
            "lost writes: no drain marker, so {} acknowledged sends cannot be judged",
            queues_sent.values().sum::<usize>()
        ));
        return out;
    }
    // A queue is drained once a receive after the marker came back empty: the drain went on
    // until nothing was left.
    let drained: HashSet<&str> = ix
        .history
        .ops
        .iter()
        .filter(|o| o.outcome == Outcome::Ok && ix.after_drain(o))
        .filter_map(|o| match (&o.call, &o.reply) {
            (Call::Receive { queue, .. }, Some(Reply::Receive { messages }))
                if messages.is_empty() =>
            {
                Some(queue.as_str())
            }
            _ => None,
        })
        .collect();
    for (queue, n) in &queues_sent {
        if !drained.contains(queue) {
            out.undecided.push(format!(
                "lost writes: no ok receive of queue {queue} after the drain marker came back \
                 empty (the drain did not finish it), so its {n} acknowledged sends cannot be judged"
            ));
        }
    }
    for s in ix.stored.values() {
        let Some(send) = s.ok_sends.first() else {
            continue;
        };
        if ix.deliveries.contains_key(s.id) || !drained.contains(s.queue) {
            continue;
        }
        let payload = match &send.call {
            Call::Send { payload, .. } => payload.clone(),
            _ => String::new(),
        };
        out.anomalies.push(Anomaly::LostWrite {
            queue: s.queue.to_string(),
            message_id: s.id.to_string(),
            payload,
            send: OpRef::from(*send),
        });
    }
    out
}

/// The moment until which a delivery's lease certainly lasted, as far as a call that took effect
/// before `before_us` can tell: the receive's start plus the visibility timeout, unless a
/// visibility change on its receipt or a delete of the message that started before `before_us`
/// may have cut it (or an acknowledged change certainly moved it). Releases that started later
/// cannot have ended the lease before that call.
fn lease_until_us(ix: &Index, d: &Delivery, before_us: u64) -> u64 {
    let start = d.receive.start_us;
    let mut until = start.saturating_add(d.visibility_us());
    for cv in ix
        .visibility_changes
        .get(d.message.receipt.as_str())
        .into_iter()
        .flatten()
    {
        let Call::ChangeVisibility {
            visibility_timeout_ms,
            ..
        } = &cv.call
        else {
            continue;
        };
        if cv.start_us >= until || cv.start_us >= before_us {
            continue;
        }
        // Applied at some moment p >= its start: the lease ends at p + timeout >= start + timeout.
        let new_until = cv
            .start_us
            .saturating_add(visibility_timeout_ms.saturating_mul(US_PER_MS));
        let certainly_applied_in_lease = cv.outcome == Outcome::Ok && cv.effect_until_us() <= until;
        until = if certainly_applied_in_lease {
            new_until
        } else {
            until.min(new_until)
        };
    }
    for del in ix
        .deletes
        .get(d.message.message_id.as_str())
        .into_iter()
        .flatten()
    {
        if del.effect_until_us() > start && del.start_us < before_us {
            until = until.min(del.start_us.max(start));
        }
    }
    until
}

/// Check 2: a message leased to two receivers at once. For two receives that delivered it, in
/// whichever order they took effect, the second completed before the first's lease (its start plus
/// the visibility timeout, less the margin) was over.
pub fn double_leases(ix: &Index, cfg: &Config) -> Checked {
    let mut out = Checked::default();
    let mut ids: Vec<&&str> = ix.deliveries.keys().collect();
    ids.sort();
    for id in ids {
        let ds = &ix.deliveries[*id];
        for i in 0..ds.len() {
            for j in i + 1..ds.len() {
                let (a, b) = (&ds[i], &ds[j]);
                // The same receipt is the same lease: a FIFO receive retried with its request
                // attempt id returns the same messages and receipts.
                if a.receive.id == b.receive.id
                    || a.queue != b.queue
                    || a.message.receipt == b.message.receipt
                {
                    continue;
                }
                let a_until = lease_until_us(ix, a, b.end_us());
                let b_until = lease_until_us(ix, b, a.end_us());
                let b_inside_a = b.end_us() < a_until.saturating_sub(cfg.margin_us);
                let a_inside_b = a.end_us() < b_until.saturating_sub(cfg.margin_us);
                if b_inside_a && a_inside_b {
                    out.anomalies.push(Anomaly::DoubleLease {
                        queue: a.queue.to_string(),
                        message_id: id.to_string(),
                        first: OpRef::from(a.receive),
                        first_lease_until_us: a_until,
                        second: OpRef::from(b.receive),
                        margin_us: cfg.margin_us,
                    });
                }
            }
        }
    }
    out
}

/// Check 3: a deleted message delivered again — by a receive that started after an acknowledged
/// delete of it completed (plus the margin).
pub fn deleted_redelivered(ix: &Index, cfg: &Config) -> Checked {
    let mut out = Checked::default();
    let mut ids: Vec<&&str> = ix.deletes.keys().collect();
    ids.sort();
    for id in ids {
        for del in ix.deletes[*id].iter().filter(|o| o.outcome == Outcome::Ok) {
            let Call::Delete { queue, .. } = &del.call else {
                continue;
            };
            let acked = del.effect_until_us();
            for d in ix.deliveries.get(*id).into_iter().flatten() {
                if d.queue == queue && d.receive.start_us > acked.saturating_add(cfg.margin_us) {
                    out.anomalies.push(Anomaly::DeletedRedelivered {
                        queue: queue.clone(),
                        message_id: id.to_string(),
                        delete: OpRef::from(*del),
                        receive: OpRef::from(d.receive),
                        margin_us: cfg.margin_us,
                    });
                }
            }
            // One acknowledged delete is enough to judge every later delivery.
            break;
        }
    }
    out
}

/// Check 4: FIFO order within a group (CONTRACT.md C3). Message `a` precedes `b` in the group
/// when `a` was certainly stored before `b` was (an ack of `a` before any send that can have
/// stored `b` started). A delivery of `b` is out of order if the same receive lists an earlier
/// `a` after it, or if some earlier `a` (one that is delivered at some point, from this queue
/// only) was certainly undeleted when the receive completed: no delete of it had started, and
/// the receive does not list it before `b`.
pub fn fifo_order(ix: &Index, _cfg: &Config) -> Checked {
    let mut out = Checked::default();
    let mut groups: BTreeMap<(&str, &str), Vec<&Stored>> = BTreeMap::new();
    for s in ix.stored.values() {
        if let Some(g) = s.group {
            groups.entry((s.queue, g)).or_default().push(s);
        }
    }
    for ((queue, group), mut msgs) in groups {
        msgs.sort_by_key(|s| (s.stored_until_us, s.id));
        // Until when each message certainly stayed undeleted; 0 when it cannot count as a
        // predecessor (never delivered: a lost write; or moved to another queue).
        let undeleted_until: Vec<u64> = msgs
            .iter()
            .map(|s| {
                if !ix.delivered_on(s.id, queue) || ix.delivered_elsewhere(s.id, queue) {
                    0
                } else {
                    ix.deletes
                        .get(s.id)
                        .and_then(|ds| ds.iter().map(|o| o.start_us).min())
                        .unwrap_or(u64::MAX)
                }
            })
            .collect();
        let mut prefix_max = vec![0u64; msgs.len() + 1];
        for (i, u) in undeleted_until.iter().enumerate() {
            prefix_max[i + 1] = prefix_max[i].max(*u);
        }
        let rank: HashMap<&str, usize> = msgs.iter().enumerate().map(|(i, s)| (s.id, i)).collect();
        for b in &msgs {
            let preds = msgs.partition_point(|a| a.stored_until_us < b.stored_from_us);
            if preds == 0 {
                continue;
            }
            for d in ix
                .deliveries
                .get(b.id)
                .into_iter()
                .flatten()
                .filter(|d| d.queue == queue)
            {
                let Some(Reply::Receive { messages }) = &d.receive.reply else {
                    continue;
                };
                let earlier_listed_later = messages[d.position + 1..]
                    .iter()
                    .find(|m| rank.get(m.message_id.as_str()).is_some_and(|&r| r < preds));
                let found = if let Some(m) = earlier_listed_later {
                    Some((m.message_id.clone(), FifoReason::ListedBeforeEarlier))
                } else if prefix_max[preds] >= d.end_us() {
                    let listed_before: HashSet<&str> = messages[..d.position]
                        .iter()
                        .map(|m| m.message_id.as_str())
                        .collect();
                    (0..preds)
                        .rev()
                        .find(|&k| {
                            undeleted_until[k] >= d.end_us() && !listed_before.contains(msgs[k].id)
                        })
                        .map(|k| (msgs[k].id.to_string(), FifoReason::EarlierUndeleted))
                } else {
                    None
                };
                if let Some((earlier, reason)) = found {
                    out.anomalies.push(Anomaly::FifoOrder {
                        queue: queue.to_string(),
                        group: group.to_string(),
                        earlier_message_id: earlier,
                        later_message_id: b.id.to_string(),
                        receive: OpRef::from(d.receive),
                        reason,
                    });
                }
            }
        }
    }
    out
}

/// Check 5: two messages stored for one deduplication key (explicit id, or the body under
/// content-based deduplication) within the window: both were stored inside a span shorter than
/// the window less the margin.
pub fn duplicates_in_window(ix: &Index, cfg: &Config) -> Checked {
    let mut out = Checked::default();
    let mut keys: BTreeMap<(&str, &str), Vec<&Stored>> = BTreeMap::new();
    for s in ix.stored.values() {
        if let Some(k) = &s.dedup_key {
            keys.entry((s.queue, k.as_str())).or_default().push(s);
        }
    }
    for ((queue, key), mut msgs) in keys {
        msgs.sort_by_key(|s| (s.stored_from_us, s.id));
        for i in 0..msgs.len() {
            for j in i + 1..msgs.len() {
                let (a, b) = (msgs[i], msgs[j]);
                let from = a.stored_from_us.min(b.stored_from_us);
                let until = a.stored_until_us.max(b.stored_until_us);
                let span = until.saturating_sub(from);
                if span.saturating_add(cfg.margin_us) < cfg.dedup_window_us {
                    out.anomalies.push(Anomaly::DuplicateInWindow {
                        queue: queue.to_string(),
                        dedup_key: key.to_string(),
                        message_ids: [a.id.to_string(), b.id.to_string()],
                        stored_from_us: from,
                        stored_until_us: until,
                        window_us: cfg.dedup_window_us,
                        margin_us: cfg.margin_us,
                    });
                }
            }
        }
    }
    out
}

type PartitionKey<'h> = (&'h str, u32);

/// Check 6: a stream offset holding two different records — two fetches disagreeing about it,
/// or a produce's acknowledged offset holding another payload. Also the acknowledged produce
/// that the final fetches (those started after the drain marker) did not return at its offset.
pub fn stream_offsets(ix: &Index, _cfg: &Config) -> Checked {
    let mut out = Checked::default();
    let mut seen: BTreeMap<(PartitionKey, u64), (&str, &Op)> = BTreeMap::new();
    let mut conflicted: HashSet<(PartitionKey, u64)> = HashSet::new();
    let mut drain_seen: HashMap<(PartitionKey, u64), &str> = HashMap::new();
    // The drain's fetches: (from, the highest offset returned; none if it returned nothing).
    let mut drain_spans: HashMap<PartitionKey, Vec<(u64, Option<u64>)>> = HashMap::new();
    let mut produced: Vec<(PartitionKey, u64, &str, &Op)> = Vec::new();
    for o in ix.history.ops.iter().filter(|o| o.outcome == Outcome::Ok) {
        let mut shown: Vec<(PartitionKey, u64, &str)> = Vec::new();
        match (&o.call, &o.reply) {
            (
                Call::Produce {
                    topic,
                    partition,
                    payload,
                },
                Some(Reply::Produce { offset }),
            ) => {
                let p = (topic.as_str(), *partition);
                produced.push((p, *offset, payload, o));
                shown.push((p, *offset, payload));
            }
            (
                Call::Fetch {
                    topic,
                    partition,
                    from_offset,
                },
                Some(Reply::Fetch { records }),
            ) => {
                let p = (topic.as_str(), *partition);
                let drain = ix.after_drain(o);
                if drain {
                    let last = records.iter().map(|r| r.offset).max();
                    drain_spans.entry(p).or_default().push((*from_offset, last));
                }
                for r in records {
                    shown.push((p, r.offset, &r.payload));
                    if drain {
                        drain_seen.insert((p, r.offset), &r.payload);
                    }
                }
            }
            _ => {}
        }
        for (p, offset, payload) in shown {
            match seen.get(&(p, offset)) {
                None => {
                    seen.insert((p, offset), (payload, o));
                }
                Some((first, by)) if *first != payload && conflicted.insert((p, offset)) => {
                    out.anomalies.push(Anomaly::OffsetConflict {
                        topic: p.0.to_string(),
                        partition: p.1,
                        offset,
                        payloads: [first.to_string(), payload.to_string()],
                        seen_by: [OpRef::from(*by), OpRef::from(o)],
                    });
                }
                Some(_) => {}
            }
        }
    }
    if produced.is_empty() {
        return out;
    }
    if ix.history.drain_us.is_none() {
        out.undecided.push(format!(
            "lost produces: no drain marker, so {} acknowledged produces cannot be judged",
            produced.len()
        ));
        return out;
    }
    let mut unjudged: BTreeMap<PartitionKey, usize> = BTreeMap::new();
    for (p, offset, payload, o) in produced {
        // Judged once a drain fetch from at or below the offset returned it or a later one, or
        // nothing at all (the log ends before it).
        let covered = drain_spans.get(&p).is_some_and(|spans| {
            spans
                .iter()
                .any(|&(from, last)| from <= offset && last.is_none_or(|l| l >= offset))
        });
        if !covered {
            *unjudged.entry(p).or_insert(0) += 1;
            continue;
        }
        if drain_seen.get(&(p, offset)) != Some(&payload) {
            out.anomalies.push(Anomaly::LostProduce {
                topic: p.0.to_string(),
                partition: p.1,
                offset,
                payload: payload.to_string(),
                produce: OpRef::from(o),
            });
        }
    }
    for ((topic, partition), n) in unjudged {
        out.undecided.push(format!(
            "lost produces: no ok fetch of {topic}/{partition} after the drain marker reached the \
             offsets of {n} acknowledged produces (from at or below one, returning it, a later one \
             or nothing), so they cannot be judged"
        ));
    }
    out
}

/// Check 7: a committed group offset going back — a read of committed offsets lower than an
/// acknowledged commit or an ok read that completed (by more than the margin) before the read
/// started, unless a commit of the lower value may have taken effect after that witness.
pub fn committed_offsets(ix: &Index, cfg: &Config) -> Checked {
    let mut out = Checked::default();
    type Key<'h> = (&'h str, &'h str, u32);
    let mut witnesses: BTreeMap<Key, Vec<(u64, &Op)>> = BTreeMap::new();
    let mut reads: BTreeMap<Key, Vec<(Option<u64>, &Op)>> = BTreeMap::new();
    let mut commits: HashMap<(Key, u64), Vec<&Op>> = HashMap::new();
    for o in &ix.history.ops {
        match (&o.call, o.outcome, &o.reply) {
            (
                Call::CommitOffset {
                    group,
                    topic,
                    partition,
                    offset,
                },
                Outcome::Ok | Outcome::Info,
                _,
            ) => {
                let k = (group.as_str(), topic.as_str(), *partition);
                commits.entry((k, *offset)).or_default().push(o);
                if o.outcome == Outcome::Ok {
                    witnesses.entry(k).or_default().push((*offset, o));
                }
            }
            (
                Call::FetchCommitted {
                    group,
                    topic,
                    partition,
                },
                Outcome::Ok,
                Some(Reply::FetchCommitted { offset }),
            ) => {
                let k = (group.as_str(), topic.as_str(), *partition);
                reads.entry(k).or_default().push((*offset, o));
                if let Some(v) = offset {
                    witnesses.entry(k).or_default().push((*v, o));
                }
            }
            _ => {}
        }
    }
    for (k, rs) in reads {
        let ws = witnesses.get(&k).map(Vec::as_slice).unwrap_or_default();
        for (x, r) in rs {
            let r_end = r.effect_until_us();
            let excused = |w: &Op| {
                x.is_some_and(|x| {
                    commits
                        .get(&(k, x))
                        .into_iter()
                        .flatten()
                        .any(|c| c.start_us < r_end && c.effect_until_us() > w.start_us)
                })
            };
            let worst = ws
                .iter()
                .filter(|(v, w)| {
                    x.is_none_or(|x| *v > x)
                        && w.effect_until_us().saturating_add(cfg.margin_us) < r.start_us
                        && !excused(w)
                })
                .max_by_key(|(v, w)| (*v, w.start_us));
            if let Some((v, w)) = worst {
                out.anomalies.push(Anomaly::CommittedOffsetBack {
                    group: k.0.to_string(),
                    topic: k.1.to_string(),
                    partition: k.2,
                    earlier: OpRef::from(*w),
                    earlier_offset: *v,
                    read: OpRef::from(r),
                    read_offset: x,
                    margin_us: cfg.margin_us,
                });
            }
        }
    }
    out
}

/// Check 8: a delivered or fetched payload that no call that may have happened sent: not an
/// `ok` or `info` send (on any queue: dead-letter moves keep the body), nor such a produce to
/// the same partition. Catches corrupted and invented messages, and refused (`fail`) calls that
/// took effect after all.
pub fn unsent_payloads(ix: &Index, _cfg: &Config) -> Checked {
    let mut out = Checked::default();
    let mut sent: HashSet<&str> = HashSet::new();
    let mut produced: HashSet<(&str, u32, &str)> = HashSet::new();
    for o in ix.history.ops.iter().filter(|o| o.outcome != Outcome::Fail) {
        match &o.call {
            Call::Send { payload, .. } => {
                sent.insert(payload);
            }
            Call::Produce {
                topic,
                partition,
                payload,
            } => {
                produced.insert((topic, *partition, payload));
            }
            _ => {}
        }
    }
    let mut reported: HashSet<(String, &str)> = HashSet::new();
    for o in ix.history.ops.iter().filter(|o| o.outcome == Outcome::Ok) {
        match (&o.call, &o.reply) {
            (Call::Receive { queue, .. }, Some(Reply::Receive { messages })) => {
                for m in messages {
                    if !sent.contains(m.payload.as_str())
                        && reported.insert((m.message_id.clone(), &m.payload))
                    {
                        out.anomalies.push(Anomaly::UnsentPayload {
                            place: format!("queue {queue}"),
                            message_id: Some(m.message_id.clone()),
                            payload: m.payload.clone(),
                            seen_by: OpRef::from(o),
                        });
                    }
                }
            }
            (
                Call::Fetch {
                    topic, partition, ..
                },
                Some(Reply::Fetch { records }),
            ) => {
                for r in records {
                    let place = format!("{topic}/{partition} offset {}", r.offset);
                    if !produced.contains(&(topic.as_str(), *partition, r.payload.as_str()))
                        && reported.insert((place.clone(), &r.payload))
                    {
                        out.anomalies.push(Anomaly::UnsentPayload {
                            place,
                            message_id: None,
                            payload: r.payload.clone(),
                            seen_by: OpRef::from(o),
                        });
                    }
                }
            }
            _ => {}
        }
    }
    out
}
