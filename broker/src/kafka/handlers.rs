//! One function per Kafka API, over the `Shard` stream service API. Topic names are resolved
//! in the connection's account, as the native front end does; `queue:<name>` names a queue
//! read as a stream (fetch and list offsets only).

use super::dispatch::{self, code, decode, encode_response};
use super::sasl::{authenticate as sasl_authenticate, handshake as sasl_handshake};
use super::{records, Conn, NODE_ID};
use crate::metadata::DEFAULT_TENANT;
use crate::runtime;
use crate::stream::kafka_group::JoinRequest;
use crate::stream::partition::Isolation;
use crate::stream::{
    FetchRequest as StreamFetch, KafkaGroupOp, KafkaGroupReply, OffsetSpec, StreamError,
    TopicConfig, TopicMeta, FETCH_BYTES_MAX, FETCH_WAIT_MS_MAX, QUEUE_TOPIC_PREFIX,
};
use bytes::Bytes;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use std::cell::Cell;
use std::sync::Arc;

pub enum Reply {
    Body(Vec<u8>),
    /// Nothing is sent (Produce with acks=0).
    None,
    /// Sent, then the connection closes (a failed authentication).
    Close(Vec<u8>),
}

/// Kafka's code for a stream service error.
pub fn error_code(e: &StreamError) -> i16 {
    match e {
        StreamError::UnknownTopic(_) | StreamError::UnknownPartition { .. } => {
            code::UNKNOWN_TOPIC_OR_PARTITION
        }
        StreamError::TopicExists(_) => code::TOPIC_ALREADY_EXISTS,
        StreamError::Invalid(_) => code::INVALID_REQUEST,
        StreamError::InvalidBatch(_) => code::CORRUPT_MESSAGE,
        StreamError::OffsetOutOfRange { .. } => code::OFFSET_OUT_OF_RANGE,
        StreamError::UnknownMember(_) => 25,
        StreamError::StaleGeneration { .. } | StreamError::NotAssigned(_) => 22,
        StreamError::LimitExceeded(_) => code::POLICY_VIOLATION,
        StreamError::Throttled(_) => code::THROTTLING_QUOTA_EXCEEDED,
        StreamError::OutOfOrderSequence(_) => code::OUT_OF_ORDER_SEQUENCE_NUMBER,
        StreamError::ProducerFenced(_) => code::INVALID_PRODUCER_EPOCH,
        // Retriable: the client tries again (starting, disk below its reserve, closing).
        StreamError::Unavailable(_) => code::LEADER_NOT_AVAILABLE,
        StreamError::Internal(_) => {
            tracing::error!(error = %e, "internal error answering a Kafka request");
            code::UNKNOWN_SERVER_ERROR
        }
    }
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn topic_name(v: &str) -> TopicName {
    TopicName(s(v))
}

impl Conn {
    pub(super) fn account(&self) -> &str {
        self.account.as_deref().unwrap_or(DEFAULT_TENANT)
    }

    pub(super) fn topic(&self, name: &str) -> Result<Arc<TopicMeta>, i16> {
        self.shard
            .topic(self.account(), name)
            .map_err(|e| error_code(&e))
    }

    /// A topic's partition count, or a queue's for `queue:<name>`.
    pub(super) fn partitions_of(&self, name: &str) -> Result<u32, i16> {
        match name.strip_prefix(QUEUE_TOPIC_PREFIX) {
            Some(q) => self
                .shard
                .queue(self.account(), q)
                .map(|q| q.partitions)
                .map_err(|_| code::UNKNOWN_TOPIC_OR_PARTITION),
            None => self.topic(name).map(|t| t.partitions()),
        }
    }
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
            let resp = $f(conn, version, req).await?;
            Reply::Body(
                encode_response(api, version, correlation_id, &resp)
                    .map_err(|_| code::UNKNOWN_SERVER_ERROR)?,
            )
        }};
    }
    Ok(match api {
        ApiKey::ApiVersions => Reply::Body(
            encode_response(
                api,
                version,
                correlation_id,
                &dispatch::api_versions(code::NONE),
            )
            .map_err(|_| code::UNKNOWN_SERVER_ERROR)?,
        ),
        ApiKey::Metadata => call!(MetadataRequest, metadata),
        ApiKey::Produce => {
            let req: ProduceRequest = decode(&mut body, version)?;
            let acks = req.acks;
            let resp = produce(conn, version, req).await?;
            if acks == 0 {
                Reply::None
            } else {
                Reply::Body(
                    encode_response(api, version, correlation_id, &resp)
                        .map_err(|_| code::UNKNOWN_SERVER_ERROR)?,
                )
            }
        }
        ApiKey::Fetch => call!(FetchRequest, fetch),
        ApiKey::ListOffsets => call!(ListOffsetsRequest, list_offsets),
        ApiKey::CreateTopics => call!(CreateTopicsRequest, create_topics),
        ApiKey::DeleteTopics => call!(DeleteTopicsRequest, delete_topics),
        ApiKey::DescribeConfigs => call!(DescribeConfigsRequest, describe_configs),
        ApiKey::FindCoordinator => call!(FindCoordinatorRequest, find_coordinator),
        ApiKey::JoinGroup => call!(JoinGroupRequest, join_group),
        ApiKey::SyncGroup => call!(SyncGroupRequest, sync_group),
        ApiKey::Heartbeat => call!(HeartbeatRequest, heartbeat),
        ApiKey::LeaveGroup => call!(LeaveGroupRequest, leave_group),
        ApiKey::OffsetCommit => call!(OffsetCommitRequest, offset_commit),
        ApiKey::OffsetFetch => call!(OffsetFetchRequest, offset_fetch),
        ApiKey::InitProducerId => call!(InitProducerIdRequest, init_producer_id),
        ApiKey::SaslHandshake => call!(SaslHandshakeRequest, sasl_handshake),
        ApiKey::AddPartitionsToTxn
        | ApiKey::AddOffsetsToTxn
        | ApiKey::TxnOffsetCommit
        | ApiKey::EndTxn => return super::txn::run(conn, api, version, correlation_id, body).await,
        ApiKey::SaslAuthenticate => {
            let req: SaslAuthenticateRequest = decode(&mut body, version)?;
            let resp = sasl_authenticate(conn, req).await;
            let bytes = encode_response(api, version, correlation_id, &resp)
                .map_err(|_| code::UNKNOWN_SERVER_ERROR)?;
            if resp.error_code == code::NONE {
                Reply::Body(bytes)
            } else {
                Reply::Close(bytes)
            }
        }
        // Share groups (`share.rs`).
        ApiKey::ShareGroupHeartbeat
        | ApiKey::ShareFetch
        | ApiKey::ShareAcknowledge
        | ApiKey::ShareGroupDescribe => {
            return super::share::run(conn, api, version, correlation_id, body).await
        }
        // The admin API (`admin.rs`).
        _ => return super::admin::run(conn, api, version, correlation_id, body).await,
    })
}

// ------------------------------------------------------------------------------ metadata

async fn metadata(
    conn: &mut Conn,
    version: i16,
    req: MetadataRequest,
) -> Result<MetadataResponse, i16> {
    let names: Vec<String> = match req.topics {
        Some(t) if version >= 10 && t.iter().all(|t| t.name.is_none()) => t
            .into_iter()
            // v10+ may ask by id; an id unknown here keeps its place as "" (answered unknown).
            // Before the arm by name, which dropped nameless entries: a share consumer's
            // lookup of its assigned topic ids came back empty.
            .map(|t| super::admin::name_of_topic_id(conn, t.topic_id).unwrap_or_default())
            .collect(),
        Some(t) if !(t.is_empty() && version == 0) => t
            .into_iter()
            .filter_map(|t| t.name.map(|n| n.0.to_string()))
            .collect(),
        _ => {
            let mut all: Vec<String> = conn
                .shard
                .list_topics(conn.account())
                .iter()
                .map(|t| t.name.clone())
                .collect();
            all.sort();
            all
        }
    };
    let mut r = MetadataResponse::default();
    let mut b = metadata_response::MetadataResponseBroker::default();
    b.node_id = NODE_ID.into();
    b.host = s(&conn.advertised.0);
    b.port = conn.advertised.1;
    r.brokers = vec![b];
    r.cluster_id = Some(s(super::admin::CLUSTER_ID));
    r.controller_id = NODE_ID.into();
    for name in names {
        let mut t = metadata_response::MetadataResponseTopic::default();
        t.name = Some(topic_name(&name));
        t.topic_id = super::admin::topic_id_of(conn, &name);
        match conn.partitions_of(&name) {
            Ok(n) => {
                t.partitions = (0..n as i32)
                    .map(|p| {
                        let mut mp = metadata_response::MetadataResponsePartition::default();
                        mp.partition_index = p;
                        mp.leader_id = NODE_ID.into();
                        mp.leader_epoch = 0;
                        mp.replica_nodes = vec![NODE_ID.into()];
                        mp.isr_nodes = vec![NODE_ID.into()];
                        mp
                    })
                    .collect();
            }
            Err(c) => t.error_code = c,
        }
        r.topics.push(t);
    }
    Ok(r)
}

// ------------------------------------------------------------------------------- produce

async fn produce(
    conn: &mut Conn,
    version: i16,
    req: ProduceRequest,
) -> Result<ProduceResponse, i16> {
    if !(-1..=1).contains(&req.acks) {
        return Err(code::INVALID_REQUIRED_ACKS);
    }
    let shard = conn.shard.clone();
    let now = runtime::now_ms() as i64;
    let mut resp = ProduceResponse::default();
    for topic in req.topic_data {
        // v13 names a topic by its id, earlier versions by its name.
        let meta = if version >= 13 {
            super::admin::topic_by_id(conn, topic.topic_id)
        } else {
            conn.topic(topic.name.0.as_str())
        };
        let name = meta
            .as_ref()
            .map_or_else(|_| topic.name.0.to_string(), |t| t.name.clone());
        let parts = topic.partition_data.into_iter().map(|pd| {
            let shard = shard.clone();
            let meta = meta.clone();
            async move {
                let mut out = produce_response::PartitionProduceResponse::default();
                out.index = pd.index;
                out.log_append_time_ms = -1;
                out.base_offset = -1;
                let result: Result<(i64, i64), i16> = async {
                    let t = meta?;
                    let p = u32::try_from(pd.index)
                        .ok()
                        .filter(|p| *p < t.partitions())
                        .ok_or(code::UNKNOWN_TOPIC_OR_PARTITION)?;
                    let bytes = pd.records.ok_or(code::INVALID_RECORD)?;
                    let transactional = super::txn::transactional(&bytes)?;
                    let (batch, producer) = records::from_kafka(&bytes, now)?;
                    let produced = match (transactional, producer) {
                        (true, Some(producer)) => {
                            shard.produce_transactional(&t, p, batch, producer).await
                        }
                        // A transactional batch names its producer.
                        (true, None) => return Err(code::INVALID_RECORD),
                        (false, producer) => shard.produce_as(&t, Some(p), batch, producer).await,
                    }
                    .map_err(|e| error_code(&e))?;
                    Ok((produced.base_offset as i64, 0))
                }
                .await;
                match result {
                    Ok((base, start)) => {
                        out.base_offset = base;
                        out.log_start_offset = start;
                    }
                    Err(c) => out.error_code = c,
                }
                out
            }
        });
        let mut tr = produce_response::TopicProduceResponse::default();
        tr.name = topic_name(&name);
        tr.topic_id = topic.topic_id;
        tr.partition_responses = futures::future::join_all(parts).await;
        resp.responses.push(tr);
    }
    Ok(resp)
}

// --------------------------------------------------------------------------------- fetch

/// Starts the stand-in name of a topic id this account does not have (no topic name has it).
const UNKNOWN_ID_MARK: &str = "\u{0}id:";

/// One partition's fetch: the data or an error, and the partition's offsets.
async fn fetch_partition(
    conn: &Conn,
    topic: &str,
    partition: i32,
    offset: i64,
    max_bytes: usize,
    wait_ms: u64,
    isolation: Isolation,
) -> fetch_response::PartitionData {
    let mut out = fetch_response::PartitionData::default();
    out.partition_index = partition;
    out.high_watermark = -1;
    out.last_stable_offset = -1;
    out.log_start_offset = -1;
    out.preferred_read_replica = (-1).into();
    out.aborted_transactions = Some(Vec::new());
    let Ok(p) = u32::try_from(partition) else {
        out.error_code = code::UNKNOWN_TOPIC_OR_PARTITION;
        return out;
    };
    let Ok(offset) = u64::try_from(offset) else {
        out.error_code = code::OFFSET_OUT_OF_RANGE;
        return out;
    };
    let req = StreamFetch {
        offset,
        max_bytes: max_bytes.max(1),
        max_records: u32::MAX,
        wait_ms,
    };
    let result = match topic.strip_prefix(QUEUE_TOPIC_PREFIX) {
        Some(q) => match conn.shard.queue(conn.account(), q) {
            Err(_) => Err(code::UNKNOWN_TOPIC_OR_PARTITION),
            Ok(q) => match conn.shard.fetch_queue_stream(&q, p, req).await {
                Ok(f) => records::queue_to_kafka(&f, offset)
                    .map(|b| (b, f.start_offset, f.end_offset))
                    .map_err(|e| error_code(&e)),
                Err(e) => Err(error_code(&e)),
            },
        },
        None => match conn.topic(topic) {
            Err(c) => Err(c),
            Ok(t) => match conn.shard.fetch_isolated(&t, p, req, isolation).await {
                Ok(f) => {
                    out.last_stable_offset = f.last_stable_offset as i64;
                    if isolation == Isolation::Committed {
                        out.aborted_transactions = Some(
                            f.aborted
                                .iter()
                                .map(|(pid, first)| {
                                    let mut a = fetch_response::AbortedTransaction::default();
                                    a.producer_id = (*pid).into();
                                    a.first_offset = *first as i64;
                                    a
                                })
                                .collect(),
                        );
                    }
                    records::to_kafka(&f.batches, offset)
                        .map(|b| (b, f.start_offset, f.end_offset))
                        .map_err(|e| error_code(&e))
                }
                Err(StreamError::OffsetOutOfRange { start, end, .. }) => {
                    out.log_start_offset = start as i64;
                    out.high_watermark = end as i64;
                    out.last_stable_offset = end as i64;
                    Err(code::OFFSET_OUT_OF_RANGE)
                }
                Err(e) => Err(error_code(&e)),
            },
        },
    };
    match result {
        Ok((bytes, start, end)) => {
            out.log_start_offset = start as i64;
            out.high_watermark = end as i64;
            if out.last_stable_offset < 0 {
                // A queue read as a stream: no transactions there.
                out.last_stable_offset = end as i64;
            }
            out.records = Some(bytes);
        }
        Err(c) => out.error_code = c,
    }
    out
}

/// Every wanted partition once, without waiting, within the response's byte budget.
async fn fetch_pass(
    conn: &Conn,
    wanted: &[(String, i32, i64, usize)],
    budget: usize,
    isolation: Isolation,
) -> Vec<(String, fetch_response::PartitionData)> {
    let mut left = budget;
    let mut out = Vec::with_capacity(wanted.len());
    for (topic, p, offset, max) in wanted {
        // At least one batch comes back even past the budget (as in Kafka), so a large
        // record is never stuck.
        let max = (*max).min(left).max(1);
        let d = fetch_partition(conn, topic, *p, *offset, max, 0, isolation).await;
        left = left.saturating_sub(d.records.as_ref().map_or(0, |r| r.len()));
        out.push((topic.clone(), d));
    }
    out
}

async fn fetch(conn: &mut Conn, version: i16, req: FetchRequest) -> Result<FetchResponse, i16> {
    // v13+ names topics by id: each is resolved to its name here (an id this account does
    // not have gets a name no topic can have, answered UNKNOWN_TOPIC_ID below).
    let names: Vec<(String, uuid::Uuid)> = req
        .topics
        .iter()
        .map(|t| {
            if version >= 13 {
                match super::admin::name_of_topic_id(conn, t.topic_id) {
                    Ok(name) => (name, t.topic_id),
                    Err(_) => (format!("{UNKNOWN_ID_MARK}{}", t.topic_id), t.topic_id),
                }
            } else {
                (t.topic.0.to_string(), uuid::Uuid::nil())
            }
        })
        .collect();
    let budget = usize::try_from(req.max_bytes)
        .unwrap_or(FETCH_BYTES_MAX)
        .clamp(1, FETCH_BYTES_MAX);
    let wait_ms = u64::try_from(req.max_wait_ms)
        .unwrap_or(0)
        .min(FETCH_WAIT_MS_MAX);
    let min_bytes = usize::try_from(req.min_bytes).unwrap_or(0);
    let wanted: Vec<(String, i32, i64, usize)> = req
        .topics
        .iter()
        .zip(&names)
        .flat_map(|(t, (name, _))| {
            t.partitions.iter().map(move |p| {
                (
                    name.clone(),
                    p.partition,
                    p.fetch_offset,
                    usize::try_from(p.partition_max_bytes).unwrap_or(0),
                )
            })
        })
        .collect();
    let conn = &*conn;
    // Kafka's isolation level: 1 is read_committed.
    let isolation = if req.isolation_level == 1 {
        Isolation::Committed
    } else {
        Isolation::Uncommitted
    };
    let mut got = fetch_pass(conn, &wanted, budget, isolation).await;
    let bytes = |g: &[(String, fetch_response::PartitionData)]| -> usize {
        g.iter()
            .map(|(_, d)| d.records.as_ref().map_or(0, |r| r.len()))
            .sum()
    };
    let errors = got.iter().any(|(_, d)| d.error_code != code::NONE);
    if wait_ms > 0 && !errors && bytes(&got) < min_bytes.max(1) && !wanted.is_empty() {
        // Long poll: park on every partition at once; the first one with data (or the
        // deadline) ends the wait, then every partition is read again without waiting.
        let waits: Vec<_> = wanted
            .iter()
            .map(|(topic, p, offset, _)| {
                Box::pin(fetch_partition(
                    conn, topic, *p, *offset, 1, wait_ms, isolation,
                ))
            })
            .collect();
        let _ = futures::future::select_all(waits).await;
        got = fetch_pass(conn, &wanted, budget, isolation).await;
    }
    let mut resp = FetchResponse::default();
    for (topic, mut d) in got {
        if topic.starts_with(UNKNOWN_ID_MARK) {
            d.error_code = super::admin::admin_code::UNKNOWN_TOPIC_ID;
        }
        match resp.responses.last_mut() {
            Some(t) if t.topic.0.as_str() == topic => t.partitions.push(d),
            _ => {
                let mut t = fetch_response::FetchableTopicResponse::default();
                t.topic = topic_name(&topic);
                t.topic_id = names
                    .iter()
                    .find(|(n, _)| *n == topic)
                    .map_or(uuid::Uuid::nil(), |(_, id)| *id);
                t.partitions.push(d);
                resp.responses.push(t);
            }
        }
    }
    Ok(resp)
}

// --------------------------------------------------------------------------- list offsets

async fn list_offsets(
    conn: &mut Conn,
    _version: i16,
    req: ListOffsetsRequest,
) -> Result<ListOffsetsResponse, i16> {
    let mut resp = ListOffsetsResponse::default();
    for t in req.topics {
        let name = t.name.0.to_string();
        let mut tr = list_offsets_response::ListOffsetsTopicResponse::default();
        tr.name = topic_name(&name);
        for p in t.partitions {
            let mut pr = list_offsets_response::ListOffsetsPartitionResponse::default();
            pr.partition_index = p.partition_index;
            pr.timestamp = -1;
            pr.offset = -1;
            let committed = req.isolation_level == 1;
            match list_offset(conn, &name, p.partition_index, p.timestamp, committed).await {
                Ok((offset, ts)) => {
                    pr.offset = offset;
                    pr.timestamp = ts;
                }
                Err(c) => pr.error_code = c,
            }
            tr.partitions.push(pr);
        }
        resp.topics.push(tr);
    }
    Ok(resp)
}

/// Kafka's special timestamps: -2 (and -4) earliest, -1 latest; any other is a time. A time
/// after the last record answers offset -1 (as Kafka does); otherwise the record's own
/// timestamp.
async fn list_offset(
    conn: &Conn,
    name: &str,
    partition: i32,
    ts: i64,
    read_committed: bool,
) -> Result<(i64, i64), i16> {
    let p = u32::try_from(partition).map_err(|_| code::UNKNOWN_TOPIC_OR_PARTITION)?;
    let spec = match ts {
        // -4: the earliest offset on local disk (v8+), the earliest of all (no tiered storage).
        -2 | -4 => OffsetSpec::Earliest,
        -1 => OffsetSpec::Latest,
        t if t >= 0 => OffsetSpec::Timestamp(t),
        _ => return Err(code::UNSUPPORTED_VERSION),
    };
    let err = |e: StreamError| error_code(&e);
    let (offset, end) = match name.strip_prefix(QUEUE_TOPIC_PREFIX) {
        Some(q) => {
            let q = conn
                .shard
                .queue(conn.account(), q)
                .map_err(|_| code::UNKNOWN_TOPIC_OR_PARTITION)?;
            let o = conn
                .shard
                .list_queue_offset(&q, p, spec)
                .await
                .map_err(err)?;
            let end = conn
                .shard
                .list_queue_offset(&q, p, OffsetSpec::Latest)
                .await
                .map_err(err)?;
            (o, end)
        }
        None => {
            let t = conn.topic(name)?;
            let o = if read_committed && spec == OffsetSpec::Latest {
                // read_committed: the latest offset is the last stable one.
                conn.shard.last_stable_offset(&t, p).await.map_err(err)?
            } else {
                conn.shard.list_offset(&t, p, spec).await.map_err(err)?
            };
            let end = conn
                .shard
                .list_offset(&t, p, OffsetSpec::Latest)
                .await
                .map_err(err)?;
            if let (OffsetSpec::Timestamp(_), true) = (spec, o < end) {
                // The found record's own time, as Kafka answers.
                let f = conn
                    .shard
                    .fetch(
                        &t,
                        p,
                        StreamFetch {
                            offset: o,
                            max_bytes: 1,
                            max_records: 1,
                            wait_ms: 0,
                        },
                    )
                    .await
                    .map_err(err)?;
                let recs = f.records(o).map_err(err)?;
                let ts = recs.first().map_or(-1, |r| r.record.timestamp_ms);
                return Ok((o as i64, ts));
            }
            (o, end)
        }
    };
    match spec {
        OffsetSpec::Timestamp(_) if offset >= end => Ok((-1, -1)),
        _ => Ok((offset as i64, -1)),
    }
}

// ------------------------------------------------------------------------- topic admin

/// Kafka topic configs Sluice keeps; others are accepted and ignored when they hold Kafka's
/// defaults' meaning for Sluice (cleanup.policy=delete), refused otherwise.
fn topic_config(
    partitions: u32,
    configs: &[create_topics_request::CreatableTopicConfig],
) -> Result<TopicConfig, (i16, String)> {
    let mut c = TopicConfig {
        partitions,
        retention_ms: None,
        retention_bytes: None,
        segment_bytes: None,
    };
    for kv in configs {
        let value = kv.value.as_ref().map(|v| v.as_str()).unwrap_or("");
        let num = || -> Result<Option<u64>, (i16, String)> {
            let n: i64 = value.parse().map_err(|_| {
                (
                    code::INVALID_CONFIG,
                    format!("{}: not a number", kv.name.as_str()),
                )
            })?;
            Ok(u64::try_from(n).ok())
        };
        match kv.name.as_str() {
            "retention.ms" => c.retention_ms = num()?,
            "retention.bytes" => c.retention_bytes = num()?,
            "segment.bytes" => c.segment_bytes = num()?,
            "cleanup.policy" if value == "delete" => {}
            other => {
                return Err((
                    code::INVALID_CONFIG,
                    format!("config {other} is not supported by Sluice"),
                ))
            }
        }
    }
    Ok(c)
}

async fn create_topics(
    conn: &mut Conn,
    _version: i16,
    req: CreateTopicsRequest,
) -> Result<CreateTopicsResponse, i16> {
    let mut resp = CreateTopicsResponse::default();
    for t in req.topics {
        let name = t.name.0.to_string();
        let mut r = create_topics_response::CreatableTopicResult::default();
        r.name = topic_name(&name);
        r.num_partitions = -1;
        r.replication_factor = -1;
        let result: Result<u32, (i16, String)> = async {
            if name.starts_with(QUEUE_TOPIC_PREFIX) {
                return Err((code::INVALID_TOPIC_EXCEPTION, "queue: names a queue".into()));
            }
            if !matches!(t.replication_factor, -1 | 1) {
                return Err((
                    code::INVALID_REPLICATION_FACTOR,
                    "a Sluice broker is one node: replication factor 1".into(),
                ));
            }
            let partitions = match t.num_partitions {
                -1 => conn.shard.config.default_partitions,
                n => u32::try_from(n)
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or((code::INVALID_PARTITIONS, "partitions must be > 0".into()))?,
            };
            let config = topic_config(partitions, &t.configs)?;
            if conn.shard.topic(conn.account(), &name).is_ok() {
                return Err((code::TOPIC_ALREADY_EXISTS, format!("topic {name} exists")));
            }
            if req.validate_only {
                return Ok(partitions);
            }
            conn.shard
                .create_topic(conn.account(), &name, config)
                .await
                .map(|t| t.partitions())
                .map_err(|e| (error_code(&e), e.to_string()))
        }
        .await;
        match result {
            Ok(n) => {
                r.num_partitions = n as i32;
                r.replication_factor = 1;
            }
            Err((c, m)) => {
                r.error_code = c;
                r.error_message = Some(s(&m));
            }
        }
        resp.topics.push(r);
    }
    Ok(resp)
}

async fn delete_topics(
    conn: &mut Conn,
    version: i16,
    req: DeleteTopicsRequest,
) -> Result<DeleteTopicsResponse, i16> {
    let mut resp = DeleteTopicsResponse::default();
    // v6 names each topic by name or by id; earlier versions by name.
    let wanted: Vec<(Option<String>, uuid::Uuid)> = if version >= 6 {
        req.topics
            .into_iter()
            .map(|t| (t.name.map(|n| n.0.to_string()), t.topic_id))
            .collect()
    } else {
        req.topic_names
            .into_iter()
            .map(|n| (Some(n.0.to_string()), uuid::Uuid::nil()))
            .collect()
    };
    for (name, id) in wanted {
        let mut r = delete_topics_response::DeletableTopicResult::default();
        let topic = match &name {
            Some(n) => conn.topic(n),
            None => super::admin::topic_by_id(conn, id),
        };
        r.topic_id = topic.as_ref().map_or(id, |t| super::admin::topic_id(t));
        r.name = topic
            .as_ref()
            .ok()
            .map(|t| t.name.clone())
            .or(name)
            .map(|n| topic_name(&n));
        let result = match topic {
            Ok(t) => conn
                .shard
                .delete_topic(&t)
                .await
                .map_err(|e| error_code(&e)),
            Err(c) => Err(c),
        };
        if let Err(c) = result {
            r.error_code = c;
        }
        resp.responses.push(r);
    }
    Ok(resp)
}

async fn describe_configs(
    conn: &mut Conn,
    _version: i16,
    req: DescribeConfigsRequest,
) -> Result<DescribeConfigsResponse, i16> {
    const TOPIC: i8 = 2;
    const BROKER: i8 = 4;
    let entry = |name: &str, value: String, default: bool| {
        let mut e = describe_configs_response::DescribeConfigsResourceResult::default();
        e.name = s(name);
        e.value = Some(s(&value));
        e.read_only = true;
        // 5: DEFAULT_CONFIG, 1: DYNAMIC_TOPIC_CONFIG.
        e.config_source = if default { 5 } else { 1 };
        e
    };
    let mut resp = DescribeConfigsResponse::default();
    for res in req.resources {
        let mut r = describe_configs_response::DescribeConfigsResult::default();
        r.resource_type = res.resource_type;
        r.resource_name = res.resource_name.clone();
        let mut configs = Vec::new();
        match res.resource_type {
            TOPIC => match conn.topic(res.resource_name.as_str()) {
                Ok(t) => {
                    let opt = |v: Option<u64>| v.map_or("-1".to_string(), |v| v.to_string());
                    configs.push(entry(
                        "retention.ms",
                        opt(t.config.retention_ms),
                        t.config.retention_ms.is_none(),
                    ));
                    configs.push(entry(
                        "retention.bytes",
                        opt(t.config.retention_bytes),
                        t.config.retention_bytes.is_none(),
                    ));
                    configs.push(entry(
                        "segment.bytes",
                        t.config
                            .segment_bytes
                            .unwrap_or(conn.shard.config.log.segment_bytes_max)
                            .to_string(),
                        t.config.segment_bytes.is_none(),
                    ));
                    configs.push(entry("cleanup.policy", "delete".into(), true));
                    configs.push(entry("compression.type", "producer".into(), true));
                    configs.push(entry(
                        "max.message.bytes",
                        conn.shard.config.log.batch_bytes_max.to_string(),
                        true,
                    ));
                }
                Err(c) => r.error_code = c,
            },
            BROKER => {
                configs.push(entry(
                    "num.partitions",
                    conn.shard.config.default_partitions.to_string(),
                    true,
                ));
                configs.push(entry("auto.create.topics.enable", "false".into(), true));
                configs.push(entry("default.replication.factor", "1".into(), true));
            }
            _ => {
                r.error_code = code::INVALID_REQUEST;
                r.error_message = Some(s("only topic and broker resources"));
            }
        }
        if let Some(keys) = &res.configuration_keys {
            configs.retain(|c| keys.iter().any(|k| k.as_str() == c.name.as_str()));
        }
        r.configs = configs;
        resp.results.push(r);
    }
    Ok(resp)
}

// ------------------------------------------------------------------------------ groups

async fn find_coordinator(
    conn: &mut Conn,
    version: i16,
    req: FindCoordinatorRequest,
) -> Result<FindCoordinatorResponse, i16> {
    let mut r = FindCoordinatorResponse::default();
    if version >= 4 {
        // v4+: a batch of keys, one coordinator each (this node for every group).
        for key in req.coordinator_keys {
            let mut c = find_coordinator_response::Coordinator::default();
            c.key = key;
            // 0: a group, 1: a transactional id (this node coordinates both).
            if req.key_type == 0 || req.key_type == 1 {
                c.node_id = NODE_ID.into();
                c.host = s(&conn.advertised.0);
                c.port = conn.advertised.1;
            } else {
                c.error_code = code::COORDINATOR_NOT_AVAILABLE;
                c.node_id = (-1).into();
                c.port = -1;
            }
            r.coordinators.push(c);
        }
        return Ok(r);
    }
    if req.key_type != 0 && req.key_type != 1 {
        r.error_code = code::COORDINATOR_NOT_AVAILABLE;
        r.node_id = (-1).into();
        r.port = -1;
        return Ok(r);
    }
    r.node_id = NODE_ID.into();
    r.host = s(&conn.advertised.0);
    r.port = conn.advertised.1;
    Ok(r)
}

async fn group_call(conn: &Conn, op: KafkaGroupOp) -> Result<KafkaGroupReply, i16> {
    conn.shard
        .kafka_group(conn.account(), op)
        .await
        .map_err(|e| match e {
            StreamError::Invalid(_) => code::INVALID_REQUEST,
            e => match error_code(&e) {
                code::LEADER_NOT_AVAILABLE => code::COORDINATOR_NOT_AVAILABLE,
                c => c,
            },
        })
}

async fn join_group(
    conn: &mut Conn,
    _version: i16,
    req: JoinGroupRequest,
) -> Result<JoinGroupResponse, i16> {
    let mut r = JoinGroupResponse::default();
    r.generation_id = -1;
    r.member_id = req.member_id.clone();
    let op = KafkaGroupOp::Join {
        group: req.group_id.0.to_string(),
        request: JoinRequest {
            member_id: req.member_id.to_string(),
            protocol_type: req.protocol_type.to_string(),
            protocols: req
                .protocols
                .into_iter()
                .map(|p| (p.name.to_string(), p.metadata))
                .collect(),
            session_timeout_ms: u64::try_from(req.session_timeout_ms).unwrap_or(0),
            rebalance_timeout_ms: u64::try_from(req.rebalance_timeout_ms).unwrap_or(0),
        },
    };
    match group_call(conn, op).await {
        Ok(KafkaGroupReply::Joined(Ok(j))) => {
            r.generation_id = j.generation;
            r.protocol_type = Some(s(&j.protocol_type));
            r.protocol_name = Some(s(&j.protocol));
            r.leader = s(&j.leader);
            r.member_id = s(&j.member_id);
            r.members = j
                .members
                .into_iter()
                .map(|(id, meta)| {
                    let mut m = join_group_response::JoinGroupResponseMember::default();
                    m.member_id = s(&id);
                    m.metadata = meta;
                    m
                })
                .collect();
        }
        Ok(KafkaGroupReply::Joined(Err(c))) | Err(c) => r.error_code = c,
        Ok(_) => r.error_code = code::UNKNOWN_SERVER_ERROR,
    }
    Ok(r)
}

async fn sync_group(
    conn: &mut Conn,
    _version: i16,
    req: SyncGroupRequest,
) -> Result<SyncGroupResponse, i16> {
    let mut r = SyncGroupResponse::default();
    let op = KafkaGroupOp::Sync {
        group: req.group_id.0.to_string(),
        member: req.member_id.to_string(),
        generation: req.generation_id,
        assignments: req
            .assignments
            .into_iter()
            .map(|a| (a.member_id.to_string(), a.assignment))
            .collect(),
    };
    match group_call(conn, op).await {
        Ok(KafkaGroupReply::Synced(Ok((protocol, assignment)))) => {
            r.protocol_type = req.protocol_type;
            r.protocol_name = Some(s(&protocol));
            r.assignment = assignment;
        }
        Ok(KafkaGroupReply::Synced(Err(c))) | Err(c) => r.error_code = c,
        Ok(_) => r.error_code = code::UNKNOWN_SERVER_ERROR,
    }
    Ok(r)
}

fn done_code(r: Result<KafkaGroupReply, i16>) -> i16 {
    match r {
        Ok(KafkaGroupReply::Done(Ok(()))) => code::NONE,
        Ok(KafkaGroupReply::Done(Err(c))) | Err(c) => c,
        Ok(_) => code::UNKNOWN_SERVER_ERROR,
    }
}

async fn heartbeat(
    conn: &mut Conn,
    _version: i16,
    req: HeartbeatRequest,
) -> Result<HeartbeatResponse, i16> {
    let op = KafkaGroupOp::Heartbeat {
        group: req.group_id.0.to_string(),
        member: req.member_id.to_string(),
        generation: req.generation_id,
    };
    let mut r = HeartbeatResponse::default();
    r.error_code = done_code(group_call(conn, op).await);
    Ok(r)
}

async fn leave_group(
    conn: &mut Conn,
    version: i16,
    req: LeaveGroupRequest,
) -> Result<LeaveGroupResponse, i16> {
    let group = req.group_id.0.to_string();
    let mut r = LeaveGroupResponse::default();
    if version < 3 {
        let op = KafkaGroupOp::Leave {
            group,
            member: req.member_id.to_string(),
        };
        r.error_code = done_code(group_call(conn, op).await);
        return Ok(r);
    }
    for m in req.members {
        let op = KafkaGroupOp::Leave {
            group: group.clone(),
            member: m.member_id.to_string(),
        };
        let mut mr = leave_group_response::MemberResponse::default();
        mr.member_id = m.member_id;
        mr.group_instance_id = m.group_instance_id;
        mr.error_code = done_code(group_call(conn, op).await);
        r.members.push(mr);
    }
    Ok(r)
}

async fn offset_commit(
    conn: &mut Conn,
    _version: i16,
    req: OffsetCommitRequest,
) -> Result<OffsetCommitResponse, i16> {
    let mut resp = OffsetCommitResponse::default();
    let mut offsets = Vec::new();
    // Per topic and partition: a code found before the commit, or `None` (the commit's own).
    type Early = Vec<(i32, Option<i16>)>;
    let mut early: Vec<(String, Early)> = Vec::new();
    for t in &req.topics {
        let name = t.name.0.to_string();
        let partitions = conn.partitions_of(&name);
        let mut codes = Vec::new();
        for p in &t.partitions {
            let c = match (
                &partitions,
                u32::try_from(p.partition_index),
                u64::try_from(p.committed_offset),
            ) {
                (Err(c), _, _) => Some(*c),
                (Ok(n), Ok(i), Ok(o)) if i < *n => {
                    offsets.push(((name.clone(), i), o));
                    None
                }
                (Ok(_), Ok(_), Err(_)) => Some(code::INVALID_COMMIT_OFFSET_SIZE),
                _ => Some(code::UNKNOWN_TOPIC_OR_PARTITION),
            };
            codes.push((p.partition_index, c));
        }
        early.push((name, codes));
    }
    let commit_code = if offsets.is_empty() {
        code::NONE
    } else {
        let op = KafkaGroupOp::Commit {
            group: req.group_id.0.to_string(),
            member: req.member_id.to_string(),
            generation: req.generation_id_or_member_epoch,
            offsets,
        };
        done_code(group_call(conn, op).await)
    };
    for (name, codes) in early {
        let mut tr = offset_commit_response::OffsetCommitResponseTopic::default();
        tr.name = topic_name(&name);
        for (i, c) in codes {
            let mut pr = offset_commit_response::OffsetCommitResponsePartition::default();
            pr.partition_index = i;
            pr.error_code = c.unwrap_or(commit_code);
            tr.partitions.push(pr);
        }
        resp.topics.push(tr);
    }
    Ok(resp)
}

/// One group's committed offsets for the wanted partitions (all it has when `None`), by
/// topic: (partition, offset or -1). `Err` is the group's error code.
async fn group_offsets(
    conn: &Conn,
    group: &str,
    wanted: Option<Vec<(String, Vec<i32>)>>,
) -> Result<Vec<(String, Vec<(i32, i64)>)>, i16> {
    let committed = conn
        .shard
        .committed_offsets(conn.account(), group)
        .await
        .map_err(|e| match error_code(&e) {
            code::LEADER_NOT_AVAILABLE => code::COORDINATOR_NOT_AVAILABLE,
            c => c,
        })?;
    let wanted: Vec<(String, Vec<i32>)> = match wanted {
        Some(w) => w,
        None => {
            let mut by: Vec<(String, Vec<i32>)> = Vec::new();
            for (t, p) in committed.keys() {
                match by.last_mut() {
                    Some((name, ps)) if name == t => ps.push(*p as i32),
                    _ => by.push((t.clone(), vec![*p as i32])),
                }
            }
            by
        }
    };
    Ok(wanted
        .into_iter()
        .map(|(name, parts)| {
            let offsets = parts
                .into_iter()
                .map(|p| {
                    let o = u32::try_from(p)
                        .ok()
                        .and_then(|p| committed.get(&(name.clone(), p)))
                        .map_or(-1, |o| *o as i64);
                    (p, o)
                })
                .collect();
            (name, offsets)
        })
        .collect())
}

async fn offset_fetch(
    conn: &mut Conn,
    version: i16,
    req: OffsetFetchRequest,
) -> Result<OffsetFetchResponse, i16> {
    let mut resp = OffsetFetchResponse::default();
    if version >= 8 {
        // v8+: several groups in one request, each answered on its own.
        for g in req.groups {
            let wanted = g.topics.map(|ts| {
                ts.into_iter()
                    .map(|t| (t.name.0.to_string(), t.partition_indexes))
                    .collect()
            });
            let mut gr = offset_fetch_response::OffsetFetchResponseGroup::default();
            match group_offsets(conn, g.group_id.0.as_str(), wanted).await {
                Ok(topics) => {
                    for (name, offsets) in topics {
                        let mut tr = offset_fetch_response::OffsetFetchResponseTopics::default();
                        tr.name = topic_name(&name);
                        for (p, o) in offsets {
                            let mut pr =
                                offset_fetch_response::OffsetFetchResponsePartitions::default();
                            pr.partition_index = p;
                            pr.committed_leader_epoch = -1;
                            pr.metadata = Some(s(""));
                            pr.committed_offset = o;
                            tr.partitions.push(pr);
                        }
                        gr.topics.push(tr);
                    }
                }
                Err(c) => gr.error_code = c,
            }
            gr.group_id = g.group_id;
            resp.groups.push(gr);
        }
        return Ok(resp);
    }
    let wanted = req.topics.map(|ts| {
        ts.into_iter()
            .map(|t| (t.name.0.to_string(), t.partition_indexes))
            .collect()
    });
    match group_offsets(conn, req.group_id.0.as_str(), wanted).await {
        Ok(topics) => {
            for (name, offsets) in topics {
                let mut tr = offset_fetch_response::OffsetFetchResponseTopic::default();
                tr.name = topic_name(&name);
                for (p, o) in offsets {
                    let mut pr = offset_fetch_response::OffsetFetchResponsePartition::default();
                    pr.partition_index = p;
                    pr.committed_leader_epoch = -1;
                    pr.metadata = Some(s(""));
                    pr.committed_offset = o;
                    tr.partitions.push(pr);
                }
                resp.topics.push(tr);
            }
        }
        Err(c) => resp.error_code = c,
    }
    Ok(resp)
}

// ------------------------------------------------------------------- producers and SASL

thread_local! {
    static LAST_PRODUCER_ID: Cell<i64> = const { Cell::new(0) };
}

/// Producer ids: the clock in ms, the shard and a counter, so ids differ across shards and
/// restarts without a durable counter (2^16 per ms per shard; i64 lasts far beyond 2500).
fn next_producer_id(shard: usize) -> i64 {
    let candidate = ((runtime::now_ms() as i64) << 16) | ((shard as i64 & 0xFF) << 8);
    LAST_PRODUCER_ID.with(|last| {
        let id = candidate.max(last.get() + 1);
        last.set(id);
        id
    })
}

async fn init_producer_id(
    conn: &mut Conn,
    _version: i16,
    req: InitProducerIdRequest,
) -> Result<InitProducerIdResponse, i16> {
    if let Some(txn_id) = &req.transactional_id {
        return Ok(super::txn::init_producer_id(conn, txn_id.0.as_str(), &req).await);
    }
    let mut r = InitProducerIdResponse::default();
    if i64::from(req.producer_id) >= 0 && req.producer_epoch >= 0 {
        // A producer bumping its epoch after an error (KIP-360): same id, next epoch.
        r.producer_id = req.producer_id;
        r.producer_epoch = req.producer_epoch.wrapping_add(1).max(0);
    } else {
        r.producer_id = next_producer_id(conn.shard.id).into();
        r.producer_epoch = 0;
    }
    Ok(r)
}
