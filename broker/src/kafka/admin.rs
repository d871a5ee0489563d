//! Kafka's admin API over the stream service's admin calls (`crate::stream::admin`):
//! CreatePartitions, ListGroups, DescribeGroups, DeleteGroups, OffsetDelete, DeleteRecords,
//! DescribeCluster, AlterConfigs, IncrementalAlterConfigs, DescribeLogDirs, and topic ids
//! (Kafka's UUIDs, derived from Sluice's topic ids).
//!
//! Every call acts in the connection's account: topics and groups are looked up, listed and
//! changed there only, so another account's names are neither shown nor reachable (an unknown
//! topic or group, as if it did not exist).

use super::dispatch::{code, decode, encode_response};
use super::handlers::{error_code, Reply};
use super::{Conn, NODE_ID};
use crate::stream::{StreamError, TopicConfig, TopicMeta, QUEUE_TOPIC_PREFIX};
use bytes::{Buf, Bytes};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, StrBytes};
use std::collections::BTreeSet;
use std::sync::Arc;

/// Kafka's error codes the admin calls answer beyond `dispatch::code`.
pub mod admin_code {
    pub const INVALID_REPLICA_ASSIGNMENT: i16 = 39;
    pub const GROUP_ID_NOT_FOUND: i16 = 69;
    pub const GROUP_SUBSCRIBED_TO_TOPIC: i16 = 86;
    pub const UNKNOWN_TOPIC_ID: i16 = 100;
}

/// Kafka's config resource types.
const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;
/// IncrementalAlterConfigs' operations.
const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;
/// "Not asked for": DescribeGroups' and DescribeCluster's authorized operations.
const AUTHORIZED_OPERATIONS_OMITTED: i32 = i32::MIN;
/// The cluster id Metadata and DescribeCluster answer.
pub const CLUSTER_ID: &str = "sluice";
/// The upper half of every topic id Sluice hands out (ASCII "sluice", never 0 or 1, which
/// Kafka reserves); the lower half is the topic catalog's id, unique for the broker's life.
const TOPIC_ID_HIGH: u64 = 0x0000_736c_7569_6365;
/// Kafka's group type: every group here is a classic one (join/sync, or Sluice's own).
const GROUP_TYPE_CLASSIC: &str = "classic";

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// The Kafka topic id of a topic.
pub fn topic_id(t: &TopicMeta) -> uuid::Uuid {
    uuid::Uuid::from_u64_pair(TOPIC_ID_HIGH, t.id)
}

/// The upper half of the topic id of a queue read as a stream (`queue:<name>`: ASCII
/// "qsluice"); the lower half is the queue's id.
const QUEUE_ID_HIGH: u64 = 0x0071_736c_7569_6365;

/// The Kafka topic id of a topic or `queue:<name>` of the account (nil if there is none).
pub fn topic_id_of(conn: &Conn, name: &str) -> uuid::Uuid {
    match name.strip_prefix(QUEUE_TOPIC_PREFIX) {
        Some(q) => conn
            .shard
            .queue(conn.account(), q)
            .map_or(uuid::Uuid::nil(), |q| {
                uuid::Uuid::from_u64_pair(QUEUE_ID_HIGH, q.id)
            }),
        None => conn.topic(name).map_or(uuid::Uuid::nil(), |t| topic_id(&t)),
    }
}

/// The name (a topic's, or `queue:<name>`) of the account's topic with this id.
pub fn name_of_topic_id(conn: &Conn, id: uuid::Uuid) -> Result<String, i16> {
    let (high, low) = id.as_u64_pair();
    if high == QUEUE_ID_HIGH {
        // Queues are few per account next to fetches; a scan keeps the queue catalog as is.
        return conn
            .shard
            .list_queues(conn.account(), "")
            .into_iter()
            .find(|q| q.id == low)
            .map(|q| format!("{QUEUE_TOPIC_PREFIX}{}", q.name))
            .ok_or(admin_code::UNKNOWN_TOPIC_ID);
    }
    topic_by_id(conn, id).map(|t| t.name.clone())
}

/// The account's topic with this Kafka topic id.
pub fn topic_by_id(conn: &Conn, id: uuid::Uuid) -> Result<Arc<TopicMeta>, i16> {
    let (high, low) = id.as_u64_pair();
    if high != TOPIC_ID_HIGH {
        return Err(admin_code::UNKNOWN_TOPIC_ID);
    }
    conn.shard
        .topic_by_id(conn.account(), low)
        .map_err(|e| match e {
            StreamError::UnknownTopic(_) => admin_code::UNKNOWN_TOPIC_ID,
            e => error_code(&e),
        })
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
        ApiKey::CreatePartitions => call!(CreatePartitionsRequest, create_partitions),
        ApiKey::ListGroups => call!(ListGroupsRequest, list_groups),
        ApiKey::DescribeGroups => call!(DescribeGroupsRequest, describe_groups),
        ApiKey::DeleteGroups => call!(DeleteGroupsRequest, delete_groups),
        ApiKey::OffsetDelete => call!(OffsetDeleteRequest, offset_delete),
        ApiKey::DeleteRecords => call!(DeleteRecordsRequest, delete_records),
        ApiKey::DescribeCluster => call!(DescribeClusterRequest, describe_cluster),
        ApiKey::AlterConfigs => call!(AlterConfigsRequest, alter_configs),
        ApiKey::IncrementalAlterConfigs => {
            call!(IncrementalAlterConfigsRequest, incremental_alter_configs)
        }
        ApiKey::DescribeLogDirs => call!(DescribeLogDirsRequest, describe_log_dirs),
        _ => return Err(code::UNSUPPORTED_VERSION),
    })
}

/// The account's topic (not a queue read as a stream: those are not administered here).
fn admin_topic(conn: &Conn, name: &str) -> Result<Arc<TopicMeta>, (i16, String)> {
    if name.starts_with(QUEUE_TOPIC_PREFIX) {
        return Err((
            code::INVALID_TOPIC_EXCEPTION,
            format!("{name} is a queue read as a stream; change the queue instead"),
        ));
    }
    conn.topic(name)
        .map_err(|c| (c, format!("no topic {name} in this account")))
}

fn stream_error(e: &StreamError) -> (i16, String) {
    (error_code(e), e.to_string())
}

// ------------------------------------------------------------------------ CreatePartitions

async fn create_partitions(
    conn: &mut Conn,
    _version: i16,
    req: CreatePartitionsRequest,
) -> Result<CreatePartitionsResponse, i16> {
    let mut resp = CreatePartitionsResponse::default();
    for t in req.topics {
        let name = t.name.0.to_string();
        let result: Result<(), (i16, String)> = async {
            let topic = admin_topic(conn, &name)?;
            let count = u32::try_from(t.count).unwrap_or(0);
            if count <= topic.partitions() {
                return Err((
                    code::INVALID_PARTITIONS,
                    format!(
                        "topic {name} has {} partitions; the count must be larger",
                        topic.partitions()
                    ),
                ));
            }
            if count > crate::stream::catalog::PARTITIONS_PER_TOPIC_MAX {
                return Err((
                    code::INVALID_PARTITIONS,
                    format!(
                        "at most {} partitions per topic",
                        crate::stream::catalog::PARTITIONS_PER_TOPIC_MAX
                    ),
                ));
            }
            // Null or empty: the broker places them.
            if let Some(assignments) = t.assignments.as_ref().filter(|a| !a.is_empty()) {
                // One node: every new partition's one replica is node 0.
                let fits = assignments.len() as u32 == count - topic.partitions()
                    && assignments
                        .iter()
                        .all(|a| a.broker_ids.iter().map(|b| b.0).eq([NODE_ID]));
                if !fits {
                    return Err((
                        admin_code::INVALID_REPLICA_ASSIGNMENT,
                        format!("one replica per new partition, on node {NODE_ID}"),
                    ));
                }
            }
            if req.validate_only {
                return Ok(());
            }
            let config = TopicConfig {
                partitions: count,
                ..topic.config.clone()
            };
            conn.shard
                .alter_topic(&topic, config)
                .await
                .map(|_| ())
                .map_err(|e| stream_error(&e))
        }
        .await;
        let mut r = create_partitions_response::CreatePartitionsTopicResult::default();
        r.name = TopicName(s(&name));
        if let Err((c, m)) = result {
            r.error_code = c;
            r.error_message = Some(s(&m));
        }
        resp.results.push(r);
    }
    Ok(resp)
}

// ------------------------------------------------------------------------------ groups

async fn list_groups(
    conn: &mut Conn,
    _version: i16,
    req: ListGroupsRequest,
) -> Result<ListGroupsResponse, i16> {
    let mut resp = ListGroupsResponse::default();
    let groups = match conn.shard.admin_groups(conn.account()).await {
        Ok(g) => g,
        Err(e) => {
            resp.error_code = coordinator_code(&e);
            return Ok(resp);
        }
    };
    let wanted = |filter: &[StrBytes], v: &str| {
        filter.is_empty() || filter.iter().any(|f| f.as_str().eq_ignore_ascii_case(v))
    };
    for g in groups {
        if !wanted(&req.states_filter, g.state) || !wanted(&req.types_filter, GROUP_TYPE_CLASSIC) {
            continue;
        }
        let mut l = list_groups_response::ListedGroup::default();
        l.group_id = GroupId(s(&g.name));
        l.protocol_type = s(&g.protocol_type);
        l.group_state = s(g.state);
        l.group_type = s(GROUP_TYPE_CLASSIC);
        resp.groups.push(l);
    }
    // Share groups (`share.rs`), of type "share".
    for (name, state) in super::share::listed(conn).await {
        if !wanted(&req.states_filter, state) || !wanted(&req.types_filter, "share") {
            continue;
        }
        let mut l = list_groups_response::ListedGroup::default();
        l.group_id = GroupId(s(&name));
        l.protocol_type = s("share");
        l.group_state = s(state);
        l.group_type = s("share");
        resp.groups.push(l);
    }
    Ok(resp)
}

/// A group call's error as Kafka's code: a starting broker is a coordinator not available.
fn coordinator_code(e: &StreamError) -> i16 {
    match e {
        StreamError::Invalid(_) => code::INVALID_REQUEST,
        e => match error_code(e) {
            code::LEADER_NOT_AVAILABLE => code::COORDINATOR_NOT_AVAILABLE,
            c => c,
        },
    }
}

async fn describe_groups(
    conn: &mut Conn,
    version: i16,
    req: DescribeGroupsRequest,
) -> Result<DescribeGroupsResponse, i16> {
    let mut resp = DescribeGroupsResponse::default();
    for name in req.groups {
        let mut d = describe_groups_response::DescribedGroup::default();
        d.group_id = name.clone();
        d.authorized_operations = AUTHORIZED_OPERATIONS_OMITTED;
        d.group_state = s("Dead");
        match conn
            .shard
            .admin_describe_group(conn.account(), name.0.as_str())
            .await
        {
            Ok(Some(g)) => {
                d.group_state = s(g.state);
                d.protocol_type = s(&g.protocol_type);
                d.protocol_data = s(&g.protocol);
                d.members = g
                    .members
                    .into_iter()
                    .map(|(id, metadata, assignment)| {
                        let mut m = describe_groups_response::DescribedGroupMember::default();
                        m.member_id = s(&id);
                        m.member_metadata = metadata;
                        m.member_assignment = assignment;
                        m
                    })
                    .collect();
            }
            // Kafka 4 answers a group it does not know with GROUP_ID_NOT_FOUND from v6 on,
            // and a Dead group without an error before.
            Ok(None) if version >= 6 => {
                d.error_code = admin_code::GROUP_ID_NOT_FOUND;
                d.error_message = Some(s("no such group in this account"));
            }
            Ok(None) => {}
            Err(e) => d.error_code = coordinator_code(&e),
        }
        resp.groups.push(d);
    }
    Ok(resp)
}

async fn delete_groups(
    conn: &mut Conn,
    _version: i16,
    req: DeleteGroupsRequest,
) -> Result<DeleteGroupsResponse, i16> {
    let mut resp = DeleteGroupsResponse::default();
    for name in req.groups_names {
        let mut r = delete_groups_response::DeletableGroupResult::default();
        r.error_code = match conn
            .shard
            .admin_delete_group(conn.account(), name.0.as_str())
            .await
        {
            Ok(Ok(())) => code::NONE,
            // Not a classic group: perhaps a share group (`share.rs`).
            Ok(Err(c)) if c == admin_code::GROUP_ID_NOT_FOUND => {
                super::share::delete(conn, name.0.as_str()).await
            }
            Ok(Err(c)) => c,
            Err(e) => coordinator_code(&e),
        };
        r.group_id = name;
        resp.results.push(r);
    }
    Ok(resp)
}

/// The topics a group's live members read: from each Kafka consumer's subscription, or
/// `None` when that cannot be told (Sluice's own members, another protocol): then every
/// topic counts as read.
fn subscribed_topics(g: &crate::stream::coordinator::GroupSummary) -> Option<BTreeSet<String>> {
    if g.members.is_empty() {
        return Some(BTreeSet::new());
    }
    if g.protocol_type != "consumer" {
        return None;
    }
    let mut topics = BTreeSet::new();
    for (_, metadata, _) in &g.members {
        let mut b = metadata.clone();
        if b.remaining() < 2 {
            return None;
        }
        let v = b.get_i16();
        let sub = ConsumerProtocolSubscription::decode(&mut b, v.clamp(0, 3)).ok()?;
        topics.extend(sub.topics.iter().map(|t| t.to_string()));
    }
    Some(topics)
}

async fn offset_delete(
    conn: &mut Conn,
    _version: i16,
    req: OffsetDeleteRequest,
) -> Result<OffsetDeleteResponse, i16> {
    let mut resp = OffsetDeleteResponse::default();
    let group = req.group_id.0.to_string();
    let g = match conn
        .shard
        .admin_describe_group(conn.account(), &group)
        .await
    {
        Ok(Some(g)) => g,
        Ok(None) => {
            resp.error_code = admin_code::GROUP_ID_NOT_FOUND;
            return Ok(resp);
        }
        Err(e) => {
            resp.error_code = coordinator_code(&e);
            return Ok(resp);
        }
    };
    let subscribed = subscribed_topics(&g);
    let mut delete = Vec::new();
    let mut answers: Vec<(String, Vec<(i32, i16)>)> = Vec::new();
    for t in &req.topics {
        let name = t.name.0.to_string();
        let partitions = conn.partitions_of(&name);
        let read = subscribed.as_ref().is_none_or(|s| s.contains(&name));
        let mut codes = Vec::new();
        for p in &t.partitions {
            let c = match (&partitions, u32::try_from(p.partition_index)) {
                (Err(c), _) => *c,
                (Ok(n), Ok(i)) if i < *n => {
                    if read {
                        admin_code::GROUP_SUBSCRIBED_TO_TOPIC
                    } else {
                        delete.push((name.clone(), i));
                        code::NONE
                    }
                }
                _ => code::UNKNOWN_TOPIC_OR_PARTITION,
            };
            codes.push((p.partition_index, c));
        }
        answers.push((name, codes));
    }
    if !delete.is_empty() {
        match conn
            .shard
            .admin_delete_offsets(conn.account(), &group, delete)
            .await
        {
            Ok(Ok(())) => {}
            Ok(Err(c)) => resp.error_code = c,
            Err(e) => resp.error_code = coordinator_code(&e),
        }
    }
    for (name, codes) in answers {
        let mut tr = offset_delete_response::OffsetDeleteResponseTopic::default();
        tr.name = TopicName(s(&name));
        for (i, c) in codes {
            let mut pr = offset_delete_response::OffsetDeleteResponsePartition::default();
            pr.partition_index = i;
            pr.error_code = c;
            tr.partitions.push(pr);
        }
        resp.topics.push(tr);
    }
    Ok(resp)
}

// ---------------------------------------------------------------------------- records

async fn delete_records(
    conn: &mut Conn,
    _version: i16,
    req: DeleteRecordsRequest,
) -> Result<DeleteRecordsResponse, i16> {
    let mut resp = DeleteRecordsResponse::default();
    for t in req.topics {
        let name = t.name.0.to_string();
        let topic = admin_topic(conn, &name).map_err(|(c, _)| c);
        let mut tr = delete_records_response::DeleteRecordsTopicResult::default();
        tr.name = TopicName(s(&name));
        for p in t.partitions {
            let mut pr = delete_records_response::DeleteRecordsPartitionResult::default();
            pr.partition_index = p.partition_index;
            pr.low_watermark = -1;
            let result: Result<u64, i16> = async {
                let topic = topic.clone()?;
                let partition = u32::try_from(p.partition_index)
                    .ok()
                    .filter(|i| *i < topic.partitions())
                    .ok_or(code::UNKNOWN_TOPIC_OR_PARTITION)?;
                // -1: up to the high watermark (Kafka's "delete everything").
                let offset = match p.offset {
                    -1 => None,
                    o => Some(u64::try_from(o).map_err(|_| code::OFFSET_OUT_OF_RANGE)?),
                };
                conn.shard
                    .delete_records(&topic, partition, offset)
                    .await
                    .map_err(|e| error_code(&e))
            }
            .await;
            match result {
                Ok(low) => pr.low_watermark = low as i64,
                Err(c) => pr.error_code = c,
            }
            tr.partitions.push(pr);
        }
        resp.topics.push(tr);
    }
    Ok(resp)
}

// ---------------------------------------------------------------------------- cluster

async fn describe_cluster(
    conn: &mut Conn,
    _version: i16,
    req: DescribeClusterRequest,
) -> Result<DescribeClusterResponse, i16> {
    let mut r = DescribeClusterResponse::default();
    // One node: it is every endpoint type asked for (brokers, 1, or controllers, 2).
    r.endpoint_type = req.endpoint_type;
    r.cluster_id = s(CLUSTER_ID);
    r.controller_id = NODE_ID.into();
    r.cluster_authorized_operations = AUTHORIZED_OPERATIONS_OMITTED;
    let mut b = describe_cluster_response::DescribeClusterBroker::default();
    b.broker_id = NODE_ID.into();
    b.host = s(&conn.advertised.0);
    b.port = conn.advertised.1;
    r.brokers = vec![b];
    Ok(r)
}

async fn describe_log_dirs(
    conn: &mut Conn,
    _version: i16,
    req: DescribeLogDirsRequest,
) -> Result<DescribeLogDirsResponse, i16> {
    let mut resp = DescribeLogDirsResponse::default();
    let data_dir = conn.shard.config.data_dir.clone();
    let mut dir = describe_log_dirs_response::DescribeLogDirsResult::default();
    dir.log_dir = s(&data_dir.display().to_string());
    // Kafka's "unknown" when the file system cannot be asked.
    (dir.total_bytes, dir.usable_bytes) = match rustix::fs::statvfs(&data_dir) {
        Ok(v) => (
            i64::try_from(v.f_blocks.saturating_mul(v.f_frsize)).unwrap_or(i64::MAX),
            i64::try_from(v.f_bavail.saturating_mul(v.f_frsize)).unwrap_or(i64::MAX),
        ),
        Err(_) => (-1, -1),
    };
    let wanted: Vec<(Arc<TopicMeta>, Vec<u32>)> = match req.topics {
        // Null: every topic of the account.
        None => {
            let mut all = conn.shard.list_topics(conn.account());
            all.sort_by(|a, b| a.name.cmp(&b.name));
            all.into_iter()
                .map(|t| {
                    let n = t.partitions();
                    (t, (0..n).collect())
                })
                .collect()
        }
        Some(ts) => ts
            .into_iter()
            .filter_map(|t| {
                // A topic this account does not have is left out, as Kafka leaves out
                // partitions it does not host.
                let topic = conn.topic(t.topic.0.as_str()).ok()?;
                let ps = t
                    .partitions
                    .iter()
                    .filter_map(|p| u32::try_from(*p).ok())
                    .filter(|p| *p < topic.partitions())
                    .collect();
                Some((topic, ps))
            })
            .collect(),
    };
    for (topic, partitions) in wanted {
        let mut tr = describe_log_dirs_response::DescribeLogDirsTopic::default();
        tr.name = TopicName(s(&topic.name));
        for p in partitions {
            let Ok((bytes, _)) = conn.shard.partition_size(&topic, p).await else {
                continue;
            };
            let mut pr = describe_log_dirs_response::DescribeLogDirsPartition::default();
            pr.partition_index = p as i32;
            pr.partition_size = i64::try_from(bytes).unwrap_or(i64::MAX);
            tr.partitions.push(pr);
        }
        dir.topics.push(tr);
    }
    resp.results.push(dir);
    Ok(resp)
}

// ---------------------------------------------------------------------------- configs

/// The retention a config entry sets: a number of ms or bytes, -1 for none (Kafka's
/// "unlimited"), or `None` for a key Sluice does not keep.
fn retention_value(name: &str, value: Option<&str>) -> Result<Option<u64>, (i16, String)> {
    let value = value.unwrap_or("-1");
    let n: i64 = value.trim().parse().map_err(|_| {
        (
            code::INVALID_CONFIG,
            format!("{name}: not a number: {value}"),
        )
    })?;
    match n {
        -1 => Ok(None),
        n if n > 0 => Ok(Some(n as u64)),
        _ => Err((
            code::INVALID_CONFIG,
            format!("{name}: -1 (unlimited) or a positive number"),
        )),
    }
}

/// One change to a topic's configuration (`None` value: back to the default).
fn apply_config(
    config: &mut TopicConfig,
    name: &str,
    value: Option<&str>,
) -> Result<(), (i16, String)> {
    match name {
        "retention.ms" => config.retention_ms = retention_value(name, value)?,
        "retention.bytes" => config.retention_bytes = retention_value(name, value)?,
        // Sluice's only policy: accepted when it says so.
        "cleanup.policy" if matches!(value, None | Some("delete")) => {}
        "compression.type" if matches!(value, None | Some("producer")) => {}
        other => {
            return Err((
                code::INVALID_CONFIG,
                format!(
                    "config {other} cannot be changed in Sluice (retention.ms and \
                     retention.bytes can)"
                ),
            ))
        }
    }
    Ok(())
}

/// Stores a topic's changed configuration (durable in the metadata log before it answers).
async fn alter_topic_config(
    conn: &Conn,
    name: &str,
    changes: Vec<(String, Option<String>)>,
    from_defaults: bool,
    validate_only: bool,
) -> Result<(), (i16, String)> {
    let topic = admin_topic(conn, name)?;
    let mut config = topic.config.clone();
    if from_defaults {
        // AlterConfigs replaces every dynamic config: what it does not name is the default.
        config.retention_ms = None;
        config.retention_bytes = None;
    }
    for (k, v) in &changes {
        apply_config(&mut config, k, v.as_deref())?;
    }
    if validate_only {
        return Ok(());
    }
    conn.shard
        .alter_topic(&topic, config)
        .await
        .map(|_| ())
        .map_err(|e| stream_error(&e))
}

/// A resource that is not a topic of the account.
fn not_a_topic(resource_type: i8) -> (i16, String) {
    if resource_type == RESOURCE_BROKER {
        (
            code::INVALID_CONFIG,
            "broker configs are set in Sluice's config file, not over Kafka".into(),
        )
    } else {
        (
            code::INVALID_REQUEST,
            "only topic configs can be changed".into(),
        )
    }
}

async fn alter_configs(
    conn: &mut Conn,
    _version: i16,
    req: AlterConfigsRequest,
) -> Result<AlterConfigsResponse, i16> {
    let mut resp = AlterConfigsResponse::default();
    for res in req.resources {
        let result = if res.resource_type == RESOURCE_TOPIC {
            let changes = res
                .configs
                .iter()
                .map(|c| (c.name.to_string(), c.value.as_ref().map(|v| v.to_string())))
                .collect();
            alter_topic_config(
                conn,
                res.resource_name.as_str(),
                changes,
                true,
                req.validate_only,
            )
            .await
        } else {
            Err(not_a_topic(res.resource_type))
        };
        let mut r = alter_configs_response::AlterConfigsResourceResponse::default();
        r.resource_type = res.resource_type;
        r.resource_name = res.resource_name;
        if let Err((c, m)) = result {
            r.error_code = c;
            r.error_message = Some(s(&m));
        }
        resp.responses.push(r);
    }
    Ok(resp)
}

async fn incremental_alter_configs(
    conn: &mut Conn,
    _version: i16,
    req: IncrementalAlterConfigsRequest,
) -> Result<IncrementalAlterConfigsResponse, i16> {
    let mut resp = IncrementalAlterConfigsResponse::default();
    for res in req.resources {
        let result = if res.resource_type == RESOURCE_TOPIC {
            let changes: Result<Vec<_>, (i16, String)> = res
                .configs
                .iter()
                .map(|c| match c.config_operation {
                    OP_SET => Ok((c.name.to_string(), c.value.as_ref().map(|v| v.to_string()))),
                    OP_DELETE => Ok((c.name.to_string(), None)),
                    // APPEND and SUBTRACT are for list configs; Sluice keeps none.
                    _ => Err((
                        code::INVALID_CONFIG,
                        format!("{}: only SET and DELETE apply", c.name.as_str()),
                    )),
                })
                .collect();
            match changes {
                Ok(changes) => {
                    alter_topic_config(
                        conn,
                        res.resource_name.as_str(),
                        changes,
                        false,
                        req.validate_only,
                    )
                    .await
                }
                Err(e) => Err(e),
            }
        } else if res.resource_type == super::share::RESOURCE_GROUP {
            super::share::configure(conn, &res, req.validate_only).await
        } else {
            Err(not_a_topic(res.resource_type))
        };
        let mut r = incremental_alter_configs_response::AlterConfigsResourceResponse::default();
        r.resource_type = res.resource_type;
        r.resource_name = res.resource_name;
        if let Err((c, m)) = result {
            r.error_code = c;
            r.error_message = Some(s(&m));
        }
        resp.responses.push(r);
    }
    Ok(resp)
}
