//! Kafka share groups (KIP-932) on Sluice's queues: ShareGroupHeartbeat, ShareFetch,
//! ShareAcknowledge and ShareGroupDescribe over `queue:<name>` topics, mapped onto the queue
//! engine's leases, so that a Kafka share consumer and an SQS consumer drain one queue:
//!
//! - acquiring a record is an SQS receive: one lease, one receive count shared with SQS
//!   receivers (the record's delivery count), never held by two consumers at once;
//! - the lock is the lease: the queue's visibility timeout, or the group's
//!   `share.record.lock.duration.ms` (rounded up to whole seconds, the engine's unit);
//! - ACCEPT deletes the message; RELEASE makes it visible at once (the delivery it had counts);
//!   REJECT moves it to the queue's dead-letter queue when it has a redrive policy, else
//!   deletes it (Kafka's "archived": never delivered again);
//! - a record past the lower of the queue's `maxReceiveCount` and the group's
//!   `share.delivery.count.limit` is not delivered again: the engine moves it to the DLQ at
//!   `maxReceiveCount`, and a record received past the group's limit is rejected (as above)
//!   instead of being handed out.
//!
//! The Kafka offset of a record is its message id within the queue partition (increasing in
//! send order). Which member holds which record lives on shard 0 (`stream::share`); an
//! acknowledgement of a record the member does not hold — never acquired, acquired by another
//! member, or acquired again after its lock ended — is refused with INVALID_RECORD_STATE for
//! its partition and changes nothing there. Before ACCEPT or REJECT acts, the lease is checked
//! still to be the member's (a visibility change on the receipt succeeds only on the current
//! lease): an SQS consumer that received the message after the lock ended keeps it.
//!
//! Share groups on plain topics (record locks over a topic partition's offsets) are not built:
//! such topics are left out of assignments and a share fetch of one is refused.

use super::dispatch::{code, decode, encode_response};
use super::handlers::{error_code, Reply};
use super::records;
use super::{Conn, NODE_ID};
use crate::engine::attributes::QueueKind;
use crate::engine::{Command, Delivered, ReceiveRequest, Reply as EngineReply, SendRequest};
use crate::metadata::QueueMeta;
use crate::stream::share::{
    share_code, Acquired, ShareConfig, ShareOp, ShareRefusal, ShareReply,
    SHARE_HEARTBEAT_INTERVAL_MS,
};
use crate::stream::{StreamError, QUEUE_TOPIC_PREFIX};
use bytes::Bytes;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use sluice_storage::Record;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Records one share fetch hands out at most when the client asks for no bound (Kafka's
/// `max.poll.records` default).
const SHARE_FETCH_RECORDS_DEFAULT: u32 = 500;
/// ... and at most, whatever it asks.
const SHARE_FETCH_RECORDS_MAX: u32 = 2_000;
/// The engine leases at most this many messages per receive (SQS's bound).
const RECEIVE_MESSAGES_MAX: u32 = 10;
/// An empty share fetch looks again this often until its wait ends.
const SHARE_FETCH_POLL_MS: u64 = 50;
/// The longest a share fetch waits for records.
const SHARE_FETCH_WAIT_MS_MAX: u64 = 30_000;
/// Offsets one acknowledgement batch may span (a bound on the work one request makes).
const ACK_BATCH_OFFSETS_MAX: i64 = 10_000;
/// The engine's lease unit.
const MS_PER_S: u64 = 1_000;

/// Kafka's acknowledgement types (KIP-932).
const ACK_GAP: i8 = 0;
const ACK_ACCEPT: i8 = 1;
const ACK_RELEASE: i8 = 2;
const ACK_REJECT: i8 = 3;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

pub async fn run(
    conn: &mut Conn,
    api: ApiKey,
    version: i16,
    correlation_id: i32,
    mut body: Bytes,
) -> Result<Reply, i16> {
    macro_rules! call {
        ($req:ty, $f:ident) => {{
            let req: $req = decode(&mut body, version)?;
            let resp = $f(conn, req).await?;
            Reply::Body(
                encode_response(api, version, correlation_id, &resp)
                    .map_err(|_| code::UNKNOWN_SERVER_ERROR)?,
            )
        }};
    }
    Ok(match api {
        ApiKey::ShareGroupHeartbeat => call!(ShareGroupHeartbeatRequest, heartbeat),
        ApiKey::ShareFetch => call!(ShareFetchRequest, share_fetch),
        ApiKey::ShareAcknowledge => call!(ShareAcknowledgeRequest, share_acknowledge),
        ApiKey::ShareGroupDescribe => call!(ShareGroupDescribeRequest, describe),
        _ => return Err(code::UNSUPPORTED_VERSION),
    })
}

/// A share coordinator answer, or the refusal to put in the response.
async fn ask(conn: &Conn, op: ShareOp) -> Result<ShareReply, ShareRefusal> {
    match conn.share_request(op).await {
        Ok(r) => r,
        Err(e) => {
            let c = match error_code(&e) {
                code::LEADER_NOT_AVAILABLE => code::COORDINATOR_NOT_AVAILABLE,
                c => c,
            };
            Err((c, e.to_string()))
        }
    }
}

impl Conn {
    async fn share_request(
        &self,
        op: ShareOp,
    ) -> crate::stream::StreamResult<Result<ShareReply, ShareRefusal>> {
        self.shard.share_request(self.account(), op).await
    }

    /// The account's queue behind `queue:<name>` (plain topics have no share groups here).
    fn share_queue(&self, topic: &str) -> Result<Arc<QueueMeta>, ShareRefusal> {
        let Some(name) = topic.strip_prefix(QUEUE_TOPIC_PREFIX) else {
            return Err((
                code::INVALID_REQUEST,
                "share groups are served on queue:<name> topics only".into(),
            ));
        };
        self.shard
            .queue(self.account(), name)
            .map_err(|_| (code::UNKNOWN_TOPIC_OR_PARTITION, format!("no queue {name}")))
    }

    /// A queue by the id a record names, if it still exists under that id.
    fn queue_by_id(&self, name: &str, id: u64) -> Option<Arc<QueueMeta>> {
        self.shard
            .queue(self.account(), name)
            .ok()
            .filter(|q| q.id == id)
    }
}

// ------------------------------------------------------------------------------ heartbeat

async fn heartbeat(
    conn: &mut Conn,
    req: ShareGroupHeartbeatRequest,
) -> Result<ShareGroupHeartbeatResponse, i16> {
    let mut resp = ShareGroupHeartbeatResponse::default();
    let member = req.member_id.to_string();
    let op = ShareOp::Heartbeat {
        group: req.group_id.0.to_string(),
        member: member.clone(),
        epoch: req.member_epoch,
        topics: req
            .subscribed_topic_names
            .map(|t| t.into_iter().map(|n| n.0.to_string()).collect()),
    };
    match ask(conn, op).await {
        Err((c, m)) => {
            resp.error_code = c;
            resp.error_message = Some(s(&m));
        }
        Ok(ShareReply::Member {
            epoch,
            topics,
            released,
        }) => {
            release(conn, released).await;
            resp.member_id = Some(s(&member));
            resp.member_epoch = epoch;
            resp.heartbeat_interval_ms = SHARE_HEARTBEAT_INTERVAL_MS;
            if epoch > 0 {
                resp.assignment = Some(assignment(conn, &topics));
            }
        }
        Ok(other) => return Err(unexpected(&other)),
    }
    Ok(resp)
}

/// Every member of a share group gets every partition of its subscribed queues (Kafka's
/// share assignor spreads partitions too; the queue engine already spreads the records).
fn assignment(conn: &Conn, topics: &[String]) -> share_group_heartbeat_response::Assignment {
    let mut a = share_group_heartbeat_response::Assignment::default();
    for t in topics {
        let Ok(q) = conn.share_queue(t) else {
            continue;
        };
        let mut tp = share_group_heartbeat_response::TopicPartitions::default();
        tp.topic_id = super::admin::topic_id_of(conn, t);
        tp.partitions = (0..q.partitions as i32).collect();
        a.topic_partitions.push(tp);
    }
    a
}

fn unexpected(r: &ShareReply) -> i16 {
    tracing::error!(reply = ?r, "unexpected share coordinator reply");
    code::UNKNOWN_SERVER_ERROR
}

// ------------------------------------------------------------------------------ acknowledge

/// One partition's acknowledgements: its topic (id, name) and (offset, type) pairs.
struct PartitionAcks {
    topic_id: uuid::Uuid,
    topic: String,
    partition: i32,
    batches: Vec<(i64, i64, Vec<i8>)>,
}

/// A partition's acknowledgements that passed the shape checks: its place in the answer, its
/// queue and (offset, type) pairs.
type ReadyAcks = (usize, Arc<QueueMeta>, Vec<(u64, i8)>);

/// What one partition's acknowledgements came to: Kafka's code and message.
type AckOutcome = (i16, Option<String>);

/// Expands acknowledgement batches to (offset, type), checking their shape.
fn expand(batches: &[(i64, i64, Vec<i8>)]) -> Result<Vec<(u64, i8)>, ShareRefusal> {
    let bad = |m: &str| Err((code::INVALID_REQUEST, m.to_string()));
    let mut out = Vec::new();
    for (first, last, types) in batches {
        if *first < 0 || last < first || last - first >= ACK_BATCH_OFFSETS_MAX {
            return bad("an acknowledgement batch's offsets are out of order or too many");
        }
        let n = (last - first + 1) as usize;
        if types.len() != 1 && types.len() != n {
            return bad("acknowledge types: one, or one per offset");
        }
        for i in 0..n {
            let t = if types.len() == 1 { types[0] } else { types[i] };
            if !(ACK_GAP..=ACK_REJECT).contains(&t) {
                return bad("unknown acknowledge type");
            }
            if t != ACK_GAP {
                out.push((*first as u64 + i as u64, t));
            }
        }
    }
    Ok(out)
}

/// Applies acknowledgements: per partition, all of its records must be the member's (else
/// INVALID_RECORD_STATE and nothing there changes), then each is accepted, released or
/// rejected on the queue engine.
async fn acknowledge(
    conn: &Conn,
    group: &str,
    member: &str,
    acks: Vec<PartitionAcks>,
) -> Vec<(uuid::Uuid, i32, AckOutcome)> {
    let mut out = Vec::new();
    // Partitions that passed the shape checks: (index in out, queue, typed offsets).
    let mut ready: Vec<ReadyAcks> = Vec::new();
    for a in acks {
        let i = out.len();
        let checked = conn.share_queue(&a.topic).and_then(|q| {
            if a.partition < 0 || a.partition as u32 >= q.partitions {
                return Err((code::UNKNOWN_TOPIC_OR_PARTITION, "no such partition".into()));
            }
            Ok((q, expand(&a.batches)?))
        });
        match checked {
            Ok((q, typed)) => {
                out.push((a.topic_id, a.partition, (code::NONE, None)));
                ready.push((i, q, typed));
            }
            Err((c, m)) => out.push((a.topic_id, a.partition, (c, Some(m)))),
        }
    }
    if ready.is_empty() {
        return out;
    }
    let lists = ready
        .iter()
        .map(|(i, q, typed)| {
            let p = out[*i].1 as u32;
            typed.iter().map(|(o, _)| (q.id, p, *o)).collect()
        })
        .collect();
    let (taken, config) = match ask(
        conn,
        ShareOp::Take {
            group: group.to_string(),
            member: member.to_string(),
            lists,
        },
    )
    .await
    {
        Ok(ShareReply::Taken(t, config)) => (t, config),
        Ok(other) => (
            vec![Err((unexpected(&other), String::new())); ready.len()],
            ShareConfig::default(),
        ),
        Err(e) => (vec![Err(e); ready.len()], ShareConfig::default()),
    };
    for ((i, q, typed), got) in ready.into_iter().zip(taken) {
        let records = match got {
            Ok(r) => r,
            Err((c, m)) => {
                out[i].2 = (c, Some(m));
                continue;
            }
        };
        let kind: BTreeMap<u64, i8> = typed.into_iter().collect();
        let (mut accept, mut release_now, mut reject) = (Vec::new(), Vec::new(), Vec::new());
        for a in records {
            match kind.get(&a.receipt.msg_id).copied() {
                Some(ACK_ACCEPT) => accept.push(a),
                // At the group's limit a released record is not delivered again (Kafka
                // archives it): it goes where a rejected one goes.
                Some(ACK_RELEASE) if a.receipt.epoch >= config.delivery_count_limit => {
                    reject.push(a)
                }
                Some(ACK_RELEASE) => release_now.push(a),
                _ => reject.push(a),
            }
        }
        let mut failed: Option<ShareRefusal> = None;
        let mut note = |r: Result<(), ShareRefusal>| {
            if let Err(e) = r {
                failed.get_or_insert(e);
            }
        };
        note(release_records(conn, &q, release_now).await);
        let lock_s = lock_s(config, &q);
        note(accept_records(conn, &q, accept, lock_s).await);
        note(reject_records(conn, &q, reject, lock_s).await);
        if let Some((c, m)) = failed {
            out[i].2 = (c, Some(m));
        }
    }
    out
}

/// The lock in the engine's unit: the group's duration rounded up, else the queue's
/// visibility timeout.
fn lock_s(config: ShareConfig, q: &QueueMeta) -> u32 {
    config
        .lock_duration_ms
        .map_or(q.parsed.visibility_timeout_s, |ms| {
            u32::try_from(ms.div_ceil(MS_PER_S)).unwrap_or(u32::MAX)
        })
}

fn handle_of(conn: &Conn, a: &Acquired) -> String {
    conn.shard.receipt_handle(&a.receipt)
}

/// Kafka's answer for an engine refusal on a record this member held: its lock ended (the
/// lease is gone or another consumer's), or the queue could not act.
fn record_refusal(e: crate::error::ServiceError) -> ShareRefusal {
    match e {
        crate::error::ServiceError::Engine(e) => (
            share_code::INVALID_RECORD_STATE,
            format!("the record's lock has ended: {e}"),
        ),
        e => {
            let e = StreamError::from(e);
            (error_code(&e), e.to_string())
        }
    }
}

fn first_error(results: Vec<crate::error::ServiceResult<()>>) -> Result<(), ShareRefusal> {
    results
        .into_iter()
        .find_map(Result::err)
        .map_or(Ok(()), |e| Err(record_refusal(e)))
}

/// RELEASE: visible again at once (the engine refuses a lease that is no longer this one).
async fn release_records(
    conn: &Conn,
    q: &QueueMeta,
    records: Vec<Acquired>,
) -> Result<(), ShareRefusal> {
    if records.is_empty() {
        return Ok(());
    }
    let mut result = Ok(());
    for chunk in records.chunks(RECEIVE_MESSAGES_MAX as usize) {
        let entries = chunk.iter().map(|a| (handle_of(conn, a), 0)).collect();
        let r = first_error(conn.shard.change_visibility_batch(q, entries).await);
        if result.is_ok() {
            result = r;
        }
    }
    result
}

/// Records whose lease is still this member's: the lease is renewed for `lock_s` (which
/// succeeds only on the current lease), so nothing else can receive them while they are
/// deleted or moved. The others are refused.
async fn still_held(
    conn: &Conn,
    q: &QueueMeta,
    records: Vec<Acquired>,
    lock_s: u32,
) -> (Vec<Acquired>, Result<(), ShareRefusal>) {
    let mut held = Vec::new();
    let mut result = Ok(());
    for chunk in records.chunks(RECEIVE_MESSAGES_MAX as usize) {
        let entries = chunk
            .iter()
            .map(|a| (handle_of(conn, a), lock_s.max(1)))
            .collect();
        let results = conn.shard.change_visibility_batch(q, entries).await;
        for (a, r) in chunk.iter().zip(results) {
            match r {
                Ok(()) => held.push(a.clone()),
                Err(e) if result.is_ok() => result = Err(record_refusal(e)),
                Err(_) => {}
            }
        }
    }
    (held, result)
}

async fn delete_records(
    conn: &Conn,
    q: &QueueMeta,
    records: &[Acquired],
) -> Result<(), ShareRefusal> {
    let mut result = Ok(());
    for chunk in records.chunks(RECEIVE_MESSAGES_MAX as usize) {
        let handles = chunk.iter().map(|a| handle_of(conn, a)).collect();
        let r = first_error(conn.shard.delete_message_batch(q, handles).await);
        if result.is_ok() {
            result = r;
        }
    }
    result
}

/// ACCEPT: deleted, once the lease is checked to be this member's.
async fn accept_records(
    conn: &Conn,
    q: &QueueMeta,
    records: Vec<Acquired>,
    lock_s: u32,
) -> Result<(), ShareRefusal> {
    if records.is_empty() {
        return Ok(());
    }
    let (held, checked) = still_held(conn, q, records, lock_s).await;
    let deleted = delete_records(conn, q, &held).await;
    checked.and(deleted)
}

/// REJECT (and a record past the group's delivery limit): copied to the queue's dead-letter
/// queue when it has a redrive policy, then deleted; without one, deleted (Kafka's
/// "archived"). The copy is sent before the delete: a crash between the two leaves the
/// message in both (at least once, as the engine's own moves are), never in neither.
async fn reject_records(
    conn: &Conn,
    q: &QueueMeta,
    records: Vec<Acquired>,
    lock_s: u32,
) -> Result<(), ShareRefusal> {
    if records.is_empty() {
        return Ok(());
    }
    let (held, checked) = still_held(conn, q, records, lock_s).await;
    let dlq = q
        .parsed
        .redrive_policy
        .as_ref()
        .and_then(|p| conn.shard.queue_by_arn(&p.dead_letter_target_arn));
    let mut moved = Vec::new();
    let mut result = checked;
    match dlq {
        None => moved = held,
        Some(dlq) => {
            for a in held {
                let fifo = dlq.kind == QueueKind::Fifo;
                let req = SendRequest {
                    body: a.payload.body.clone(),
                    attributes: a.payload.attributes.clone(),
                    delay_s: None,
                    group_id: if fifo {
                        a.payload.group_id.clone()
                    } else {
                        None
                    },
                    dedup_id: if fifo {
                        a.payload.dedup_id.clone()
                    } else {
                        None
                    },
                };
                match conn.shard.send(&dlq, req).await {
                    Ok(_) => moved.push(a),
                    // Not moved: the message stays leased and comes back at its lock's end.
                    Err(e) if result.is_ok() => result = Err(record_refusal(e)),
                    Err(_) => {}
                }
            }
        }
    }
    let deleted = delete_records(conn, q, &moved).await;
    result.and(deleted)
}

/// Releases records a member no longer holds (it left, rejoined or closed its session).
async fn release(conn: &Conn, records: Vec<Acquired>) {
    let mut by_queue: BTreeMap<(String, u64), Vec<Acquired>> = BTreeMap::new();
    for a in records {
        by_queue
            .entry((a.queue.clone(), a.queue_id))
            .or_default()
            .push(a);
    }
    for ((name, id), list) in by_queue {
        if let Some(q) = conn.queue_by_id(&name, id) {
            // A lease already ended is no loss: the message is visible anyway.
            let _ = release_records(conn, &q, list).await;
        }
    }
}

// ------------------------------------------------------------------------------ fetch

/// A share fetch's answers per topic id and partition.
type FetchAnswers = BTreeMap<uuid::Uuid, BTreeMap<i32, share_fetch_response::PartitionData>>;

/// The answer of one partition, made on first use.
fn entry(
    by_topic: &mut FetchAnswers,
    id: uuid::Uuid,
    p: i32,
) -> &mut share_fetch_response::PartitionData {
    by_topic.entry(id).or_default().entry(p).or_insert_with(|| {
        let mut d = share_fetch_response::PartitionData::default();
        d.partition_index = p;
        d.current_leader.leader_id = NODE_ID;
        d
    })
}

fn ack_batches_fetch(b: &[share_fetch_request::AcknowledgementBatch]) -> Vec<(i64, i64, Vec<i8>)> {
    b.iter()
        .map(|b| (b.first_offset, b.last_offset, b.acknowledge_types.clone()))
        .collect()
}

async fn share_fetch(conn: &mut Conn, req: ShareFetchRequest) -> Result<ShareFetchResponse, i16> {
    let mut resp = ShareFetchResponse::default();
    let (Some(group), Some(member)) = (req.group_id.as_ref(), req.member_id.as_ref()) else {
        resp.error_code = code::INVALID_REQUEST;
        resp.error_message = Some(s("a share fetch names its group and member"));
        return Ok(resp);
    };
    let (group, member) = (group.0.to_string(), member.to_string());
    // The request's partitions (added to the session) and their acknowledgements.
    let mut add = Vec::new();
    let mut acks: Vec<PartitionAcks> = Vec::new();
    let mut unknown: Vec<(uuid::Uuid, i32)> = Vec::new();
    for t in &req.topics {
        let name = super::admin::name_of_topic_id(conn, t.topic_id);
        for p in &t.partitions {
            match &name {
                Ok(n) => {
                    add.push((n.clone(), p.partition_index as u32));
                    if !p.acknowledgement_batches.is_empty() {
                        acks.push(PartitionAcks {
                            topic_id: t.topic_id,
                            topic: n.clone(),
                            partition: p.partition_index,
                            batches: ack_batches_fetch(&p.acknowledgement_batches),
                        });
                    }
                }
                Err(_) => unknown.push((t.topic_id, p.partition_index)),
            }
        }
    }
    let forget = req
        .forgotten_topics_data
        .iter()
        .filter_map(|t| {
            let n = super::admin::name_of_topic_id(conn, t.topic_id).ok()?;
            Some(t.partitions.iter().map(move |p| (n.clone(), *p as u32)))
        })
        .flatten()
        .collect();
    let mut by_topic: FetchAnswers = BTreeMap::new();
    for (id, p) in unknown {
        entry(&mut by_topic, id, p).error_code = super::admin::admin_code::UNKNOWN_TOPIC_ID;
    }
    let closing = req.share_session_epoch == -1;
    if closing {
        // The last acknowledgements come before the close releases what is left.
        for (id, p, (c, m)) in acknowledge(conn, &group, &member, acks).await {
            let d = entry(&mut by_topic, id, p);
            d.acknowledge_error_code = c;
            d.acknowledge_error_message = m.map(|m| s(&m));
        }
        acks = Vec::new();
    }
    let session = ask(
        conn,
        ShareOp::Session {
            group: group.clone(),
            member: member.clone(),
            epoch: req.share_session_epoch,
            add,
            forget,
            may_open: true,
        },
    )
    .await;
    let (partitions, config) = match session {
        Err((c, m)) => {
            resp.error_code = c;
            resp.error_message = Some(s(&m));
            resp.responses = responses(by_topic);
            return Ok(resp);
        }
        Ok(ShareReply::Session {
            partitions,
            config,
            released,
        }) => {
            release(conn, released).await;
            (partitions, config)
        }
        Ok(other) => return Err(unexpected(&other)),
    };
    for (id, p, (c, m)) in acknowledge(conn, &group, &member, acks).await {
        let d = entry(&mut by_topic, id, p);
        d.acknowledge_error_code = c;
        d.acknowledge_error_message = m.map(|m| s(&m));
    }
    if closing {
        resp.responses = responses(by_topic);
        return Ok(resp);
    }
    // The session's queues: (topic id, queue, partition).
    let mut sources = Vec::new();
    for (name, p) in &partitions {
        let id = super::admin::topic_id_of(conn, name);
        match conn.share_queue(name) {
            Ok(q) if *p < q.partitions => sources.push((id, q, *p)),
            Ok(_) => {
                entry(&mut by_topic, id, *p as i32).error_code = code::UNKNOWN_TOPIC_OR_PARTITION
            }
            Err((c, m)) => {
                let d = entry(&mut by_topic, id, *p as i32);
                d.error_code = c;
                d.error_message = Some(s(&m));
            }
        }
    }
    let max_records = match u32::try_from(req.max_records) {
        Ok(0) | Err(_) => SHARE_FETCH_RECORDS_DEFAULT,
        Ok(n) => n.min(SHARE_FETCH_RECORDS_MAX),
    };
    let wait_ms = u64::try_from(req.max_wait_ms)
        .unwrap_or(0)
        .min(SHARE_FETCH_WAIT_MS_MAX);
    let deadline = crate::runtime::now_ms() + wait_ms;
    let mut got: Vec<(uuid::Uuid, Arc<QueueMeta>, Vec<Delivered>)> = Vec::new();
    let mut count = 0u32;
    let mut lock_ms_told: Option<u64> = None;
    loop {
        for (id, q, p) in &sources {
            let lock = lock_s(config, q);
            lock_ms_told.get_or_insert(u64::from(lock) * MS_PER_S);
            let mut mine = Vec::new();
            while count < max_records {
                let want = (max_records - count).min(RECEIVE_MESSAGES_MAX);
                let r = ReceiveRequest {
                    max_messages: want,
                    visibility_timeout_s: Some(lock),
                    attempt_id: None,
                };
                let list = match receive_partition(conn, q, *p, r).await {
                    Ok(l) => l,
                    Err(e) => {
                        let e = StreamError::from(e);
                        entry(&mut by_topic, *id, *p as i32).error_code = error_code(&e);
                        break;
                    }
                };
                if list.is_empty() {
                    break;
                }
                let n = list.len() as u32;
                let (keep, over): (Vec<_>, Vec<_>) = list
                    .into_iter()
                    .partition(|d| d.receive_count <= config.delivery_count_limit);
                if !over.is_empty() {
                    // Past the group's delivery limit: never handed out again.
                    let over = acquired_list(q, &over, 0);
                    let _ = reject_records(conn, q, over, lock).await;
                }
                count += keep.len() as u32;
                mine.extend(keep);
                if n < want {
                    break;
                }
            }
            if !mine.is_empty() {
                got.push((*id, q.clone(), mine));
            }
        }
        if count > 0 || crate::runtime::now_ms() >= deadline || sources.is_empty() {
            break;
        }
        crate::runtime::sleep(std::time::Duration::from_millis(SHARE_FETCH_POLL_MS)).await;
    }
    if !got.is_empty() {
        let now = crate::runtime::now_ms();
        let records: Vec<Acquired> = got
            .iter()
            .flat_map(|(_, q, list)| {
                let until = now + u64::from(lock_s(config, q)) * MS_PER_S;
                acquired_list(q, list, until)
            })
            .collect();
        let registered = ask(
            conn,
            ShareOp::Acquire {
                group: group.clone(),
                member: member.clone(),
                records: records.clone(),
            },
        )
        .await;
        if let Err((c, m)) = registered {
            // The member left meanwhile: nobody may acknowledge these; give them back.
            release(conn, records).await;
            resp.error_code = c;
            resp.error_message = Some(s(&m));
            return Ok(resp);
        }
    }
    for (id, q, list) in got {
        let mut by_partition: BTreeMap<u32, Vec<&Delivered>> = BTreeMap::new();
        for d in &list {
            by_partition.entry(d.receipt.partition).or_default().push(d);
        }
        for (p, ds) in by_partition {
            let msgs: Vec<(u64, Record)> =
                ds.iter().map(|d| (d.receipt.msg_id, record(d))).collect();
            let d = entry(&mut by_topic, id, p as i32);
            match records::messages_to_kafka(&msgs) {
                Ok(b) => d.records = Some(b),
                Err(e) => {
                    // Unreachable in practice (encoding one record); the locks run out.
                    tracing::error!(error = %e, queue = %q.name, "encoding acquired records");
                    d.error_code = code::UNKNOWN_SERVER_ERROR;
                    continue;
                }
            }
            for x in ds {
                let mut a = share_fetch_response::AcquiredRecords::default();
                a.first_offset = x.receipt.msg_id as i64;
                a.last_offset = x.receipt.msg_id as i64;
                a.delivery_count = i16::try_from(x.receive_count).unwrap_or(i16::MAX);
                d.acquired_records.push(a);
            }
        }
    }
    resp.acquisition_lock_timeout_ms = lock_ms_told
        .or(config.lock_duration_ms)
        .map_or(0, |ms| i32::try_from(ms).unwrap_or(i32::MAX));
    resp.responses = responses(by_topic);
    Ok(resp)
}

/// One receive on one partition of a queue (a share fetch asks its session's partitions, not
/// whichever the SQS receive order would pick).
async fn receive_partition(
    conn: &Conn,
    q: &QueueMeta,
    p: u32,
    req: ReceiveRequest,
) -> crate::error::ServiceResult<Vec<Delivered>> {
    if !conn.shard.is_ready() {
        return Err(crate::error::ServiceError::Unavailable(
            "broker is starting",
        ));
    }
    match conn.shard.execute_on(q, p, Command::Receive(req)).await? {
        EngineReply::Received(list) => Ok(list),
        other => Err(crate::error::ServiceError::Internal(format!(
            "unexpected {other:?}"
        ))),
    }
}

fn acquired_list(q: &QueueMeta, list: &[Delivered], lock_until_ms: u64) -> Vec<Acquired> {
    list.iter()
        .map(|d| Acquired {
            queue: q.name.clone(),
            queue_id: q.id,
            partition: d.receipt.partition,
            receipt: d.receipt,
            payload: d.payload.clone(),
            lock_until_ms,
        })
        .collect()
}

/// A queue message as a Kafka record: key = message group id, value = body, timestamp = the
/// send's, a `message-id` header (as `queue:<name>` fetches show it).
fn record(d: &Delivered) -> Record {
    Record {
        timestamp_ms: d.sent_ms as i64,
        key: d.payload.group_id.as_ref().map(|g| g.as_bytes().to_vec()),
        value: d.payload.body.as_bytes().to_vec(),
        headers: vec![(
            b"message-id".to_vec(),
            d.message_id.to_string().into_bytes(),
        )],
    }
}

fn responses(by_topic: FetchAnswers) -> Vec<share_fetch_response::ShareFetchableTopicResponse> {
    by_topic
        .into_iter()
        .map(|(id, ps)| {
            let mut t = share_fetch_response::ShareFetchableTopicResponse::default();
            t.topic_id = id;
            t.partitions = ps.into_values().collect();
            t
        })
        .collect()
}

// ------------------------------------------------------------------------------ acknowledge API

async fn share_acknowledge(
    conn: &mut Conn,
    req: ShareAcknowledgeRequest,
) -> Result<ShareAcknowledgeResponse, i16> {
    let mut resp = ShareAcknowledgeResponse::default();
    let (Some(group), Some(member)) = (req.group_id.as_ref(), req.member_id.as_ref()) else {
        resp.error_code = code::INVALID_REQUEST;
        resp.error_message = Some(s("an acknowledgement names its group and member"));
        return Ok(resp);
    };
    let (group, member) = (group.0.to_string(), member.to_string());
    let mut acks = Vec::new();
    let mut unknown = Vec::new();
    for t in &req.topics {
        let name = super::admin::name_of_topic_id(conn, t.topic_id);
        for p in &t.partitions {
            match &name {
                Ok(n) => acks.push(PartitionAcks {
                    topic_id: t.topic_id,
                    topic: n.clone(),
                    partition: p.partition_index,
                    batches: p
                        .acknowledgement_batches
                        .iter()
                        .map(|b| (b.first_offset, b.last_offset, b.acknowledge_types.clone()))
                        .collect(),
                }),
                Err(c) => unknown.push((t.topic_id, p.partition_index, *c)),
            }
        }
    }
    let mut by_topic: BTreeMap<uuid::Uuid, Vec<share_acknowledge_response::PartitionData>> =
        BTreeMap::new();
    let mut push = |id: uuid::Uuid, p: i32, c: i16, m: Option<String>| {
        let mut d = share_acknowledge_response::PartitionData::default();
        d.partition_index = p;
        d.error_code = c;
        d.error_message = m.map(|m| s(&m));
        d.current_leader.leader_id = NODE_ID;
        by_topic.entry(id).or_default().push(d);
    };
    for (id, p, c) in unknown {
        push(id, p, c, None);
    }
    let closing = req.share_session_epoch == -1;
    if closing {
        // The last acknowledgements come before the close releases what is left.
        for (id, p, (c, m)) in acknowledge(conn, &group, &member, std::mem::take(&mut acks)).await {
            push(id, p, c, m);
        }
    }
    let session = ask(
        conn,
        ShareOp::Session {
            group: group.clone(),
            member: member.clone(),
            epoch: req.share_session_epoch,
            add: Vec::new(),
            forget: Vec::new(),
            may_open: false,
        },
    )
    .await;
    match session {
        Err((c, m)) => {
            // Nothing acknowledged (unless closing: those came first, as Kafka's do).
            resp.error_code = c;
            resp.error_message = Some(s(&m));
            if !closing {
                return Ok(resp);
            }
        }
        Ok(ShareReply::Session { released, .. }) => release(conn, released).await,
        Ok(other) => return Err(unexpected(&other)),
    }
    for (id, p, (c, m)) in acknowledge(conn, &group, &member, acks).await {
        push(id, p, c, m);
    }
    resp.responses = by_topic
        .into_iter()
        .map(|(id, ps)| {
            let mut t = share_acknowledge_response::ShareAcknowledgeTopicResponse::default();
            t.topic_id = id;
            t.partitions = ps;
            t
        })
        .collect();
    Ok(resp)
}

// ------------------------------------------------------------------------------ configs

/// Kafka's GROUP config resource type.
pub const RESOURCE_GROUP: i8 = 32;
const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;

/// IncrementalAlterConfigs on a GROUP: a share group's `share.record.lock.duration.ms` and
/// `share.delivery.count.limit` (set, or deleted back to the default). Other names are
/// refused, and nothing of a resource changes unless all of its entries are valid.
pub async fn configure(
    conn: &Conn,
    res: &incremental_alter_configs_request::AlterConfigsResource,
    validate_only: bool,
) -> Result<(), ShareRefusal> {
    use crate::stream::share::{CONFIG_DELIVERY_COUNT_LIMIT, CONFIG_LOCK_DURATION_MS};
    let mut lock_duration_ms = None;
    let mut delivery_count_limit = None;
    for c in &res.configs {
        let value = match c.config_operation {
            OP_SET => {
                let v = c.value.as_ref().map(|v| v.as_str()).unwrap_or_default();
                Some(v.parse::<u64>().map_err(|_| {
                    (
                        code::INVALID_CONFIG,
                        format!("{}: not a number: {v:?}", c.name.as_str()),
                    )
                })?)
            }
            OP_DELETE => None,
            _ => {
                return Err((
                    code::INVALID_CONFIG,
                    format!("{}: only SET and DELETE apply", c.name.as_str()),
                ))
            }
        };
        match c.name.as_str() {
            CONFIG_LOCK_DURATION_MS => lock_duration_ms = Some(value),
            CONFIG_DELIVERY_COUNT_LIMIT => {
                delivery_count_limit = Some(value.map(|v| u32::try_from(v).unwrap_or(u32::MAX)))
            }
            other => {
                return Err((
                    code::INVALID_CONFIG,
                    format!("{other}: not a share group config served here"),
                ))
            }
        }
    }
    match ask(
        conn,
        ShareOp::Configure {
            group: res.resource_name.to_string(),
            lock_duration_ms,
            delivery_count_limit,
            validate_only,
        },
    )
    .await
    {
        Ok(_) => Ok(()),
        Err((share_code::INVALID_REQUEST, m)) => Err((code::INVALID_CONFIG, m)),
        Err(e) => Err(e),
    }
}

// ------------------------------------------------------------------------------ describe

/// DeleteGroups of a share group: only an empty one (NON_EMPTY_GROUP otherwise); Kafka's code.
pub async fn delete(conn: &Conn, group: &str) -> i16 {
    match ask(
        conn,
        ShareOp::Delete {
            group: group.to_string(),
        },
    )
    .await
    {
        Ok(_) => code::NONE,
        Err((c, _)) => c,
    }
}

/// The account's share groups and their states, for ListGroups (none if the coordinator
/// cannot answer: the classic groups' answer already says why).
pub async fn listed(conn: &Conn) -> Vec<(String, &'static str)> {
    match ask(conn, ShareOp::List).await {
        Ok(ShareReply::Listed(l)) => l,
        _ => Vec::new(),
    }
}

async fn describe(
    conn: &mut Conn,
    req: ShareGroupDescribeRequest,
) -> Result<ShareGroupDescribeResponse, i16> {
    let mut resp = ShareGroupDescribeResponse::default();
    let names: Vec<String> = req.group_ids.iter().map(|g| g.0.to_string()).collect();
    let described = ask(
        conn,
        ShareOp::Describe {
            groups: names.clone(),
        },
    )
    .await;
    let infos = match described {
        Ok(ShareReply::Described(d)) => d,
        Ok(other) => return Err(unexpected(&other)),
        Err((c, m)) => {
            for n in names {
                let mut g = share_group_describe_response::DescribedGroup::default();
                g.group_id = GroupId(s(&n));
                g.error_code = c;
                g.error_message = Some(s(&m));
                resp.groups.push(g);
            }
            return Ok(resp);
        }
    };
    for (n, info) in names.into_iter().zip(infos) {
        let mut g = share_group_describe_response::DescribedGroup::default();
        g.group_id = GroupId(s(&n));
        match info {
            None => {
                g.error_code = share_code::GROUP_ID_NOT_FOUND;
                g.error_message = Some(s("no such share group"));
                g.group_state = s("Dead");
            }
            Some(info) => {
                g.group_state = s(info.state);
                g.group_epoch = info.epoch;
                g.assignment_epoch = info.epoch;
                g.assignor_name = s("simple");
                for (id, epoch, topics) in info.members {
                    let mut m = share_group_describe_response::Member::default();
                    m.member_id = s(&id);
                    m.member_epoch = epoch;
                    m.subscribed_topic_names = topics.iter().map(|t| TopicName(s(t))).collect();
                    for t in &topics {
                        let Ok(q) = conn.share_queue(t) else {
                            continue;
                        };
                        let mut tp = share_group_describe_response::TopicPartitions::default();
                        tp.topic_id = super::admin::topic_id_of(conn, t);
                        tp.topic_name = TopicName(s(t));
                        tp.partitions = (0..q.partitions as i32).collect();
                        m.assignment.topic_partitions.push(tp);
                    }
                    g.members.push(m);
                }
            }
        }
        resp.groups.push(g);
    }
    Ok(resp)
}
