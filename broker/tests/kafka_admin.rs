//! The Kafka listener's admin API and versions over real sockets, with requests crafted by the
//! `kafka-protocol` crate (the codec generated from Kafka's own schemas): every advertised
//! version of every served API answers a response that decodes at that version, a version
//! just outside the advertised range gets UNSUPPORTED_VERSION, the admin calls act (partitions
//! added, retention altered and kept across a restart, records deleted, groups listed,
//! described and deleted) and one account never sees or reaches another's topics and groups.
//! Also: a start-up on a busy Kafka port names the Kafka listener and the port, once.

// A test is the broker's outside world: it times the broker with its own clocks (deadlines,
// waits, latencies). broker/clippy.toml's clock seam governs the broker's code, not this.
#![allow(clippy::disallowed_methods)]

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use sluice_broker::config::BrokerConfig;
use sluice_broker::server::{self, BrokerHandle};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// glommio registers locked memory per executor: one broker at a time in this binary.
static ONE_BROKER: Mutex<()> = Mutex::new(());
/// Every socket read gives up after this: a hang is a failure, not a stall.
const READ_TIMEOUT: Duration = Duration::from_secs(20);
const UNSUPPORTED_VERSION: i16 = 35;
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const OFFSET_OUT_OF_RANGE: i16 = 1;
const INVALID_PARTITIONS: i16 = 37;
const GROUP_ID_NOT_FOUND: i16 = 69;
const UNKNOWN_TOPIC_ID: i16 = 100;
const INVALID_REQUEST: i16 = 42;

const KEY_A: (&str, &str, &str) = ("AKIDADMINA", "secret-a", "111111111111");
const KEY_B: (&str, &str, &str) = ("AKIDADMINB", "secret-b", "222222222222");

/// Every API the listener serves and the newest version it must advertise: the newest the
/// `kafka-protocol` crate's request schemas define (OffsetCommit, OffsetFetch and
/// InitProducerId: the crate's request schemas stop below its ApiKey range).
const EXPECTED: &[(ApiKey, i16)] = &[
    (ApiKey::Produce, 13),
    (ApiKey::Fetch, 18),
    (ApiKey::ListOffsets, 10),
    (ApiKey::Metadata, 13),
    (ApiKey::OffsetCommit, 9),
    (ApiKey::OffsetFetch, 9),
    (ApiKey::FindCoordinator, 6),
    (ApiKey::JoinGroup, 9),
    (ApiKey::Heartbeat, 4),
    (ApiKey::LeaveGroup, 5),
    (ApiKey::SyncGroup, 5),
    (ApiKey::DescribeGroups, 6),
    (ApiKey::ListGroups, 5),
    (ApiKey::SaslHandshake, 1),
    (ApiKey::ApiVersions, 4),
    (ApiKey::CreateTopics, 7),
    (ApiKey::DeleteTopics, 6),
    (ApiKey::DeleteRecords, 2),
    (ApiKey::InitProducerId, 5),
    (ApiKey::DescribeConfigs, 4),
    (ApiKey::AlterConfigs, 2),
    (ApiKey::DescribeLogDirs, 4),
    (ApiKey::SaslAuthenticate, 2),
    (ApiKey::CreatePartitions, 3),
    (ApiKey::DeleteGroups, 2),
    (ApiKey::IncrementalAlterConfigs, 1),
    (ApiKey::OffsetDelete, 0),
    (ApiKey::DescribeCluster, 2),
    (ApiKey::ShareGroupHeartbeat, 1),
    (ApiKey::ShareGroupDescribe, 1),
    (ApiKey::ShareFetch, 1),
    (ApiKey::ShareAcknowledge, 1),
    (ApiKey::AddPartitionsToTxn, 3),
    (ApiKey::AddOffsetsToTxn, 3),
    (ApiKey::EndTxn, 3),
    (ApiKey::TxnOffsetCommit, 3),
];

fn start(dir: &Path) -> (BrokerHandle, SocketAddr) {
    let mut c = BrokerConfig::ephemeral(dir.to_path_buf()).expect("config");
    c.shards = 2;
    c.default_partitions = 1;
    c.kafka_addr = Some("127.0.0.1:0".parse().expect("addr"));
    c.auth = sluice_broker::auth::AuthConfig {
        mode: sluice_broker::auth::AuthMode::SigV4,
        keys: sluice_broker::auth::parse_keys(
            &[KEY_A, KEY_B]
                .iter()
                .map(|(a, s, t)| format!("{a}:{s}:{t}"))
                .collect::<Vec<_>>()
                .join(","),
        )
        .expect("keys"),
    };
    let b = server::start(c).expect("start");
    b.wait_ready().expect("ready");
    let addr = b.kafka_addr().expect("a Kafka listener");
    (b, addr)
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

struct Client {
    stream: TcpStream,
    correlation: i32,
}

impl Client {
    fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(READ_TIMEOUT))
            .expect("timeout");
        Client {
            stream,
            correlation: 0,
        }
    }

    /// Connects and logs in with SASL/PLAIN as `key`.
    fn login(addr: SocketAddr, key: (&str, &str, &str)) -> Client {
        let mut c = Client::connect(addr);
        c.sasl(key, 1, 2);
        c
    }

    fn sasl(&mut self, key: (&str, &str, &str), handshake: i16, authenticate: i16) {
        let mut h = SaslHandshakeRequest::default();
        h.mechanism = s("PLAIN");
        let r: SaslHandshakeResponse = self.call(ApiKey::SaslHandshake, handshake, &h);
        assert_eq!(r.error_code, 0);
        let mut a = SaslAuthenticateRequest::default();
        a.auth_bytes = Bytes::from(format!("\0{}\0{}", key.0, key.1));
        let r: SaslAuthenticateResponse = self.call(ApiKey::SaslAuthenticate, authenticate, &a);
        assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    }

    /// Sends a request and returns the whole answer frame (size prefix removed).
    fn send_raw(&mut self, api: ApiKey, version: i16, body: &[u8]) -> Bytes {
        self.correlation += 1;
        let mut header = RequestHeader::default();
        header.request_api_key = api as i16;
        header.request_api_version = version;
        header.correlation_id = self.correlation;
        header.client_id = Some(s("kafka-admin-test"));
        let mut buf = BytesMut::new();
        // The header version of an advertised version, or v1 for one outside (a header the
        // broker reads its prefix from either way).
        let codec = api.valid_versions();
        let hv = if (codec.min..=codec.max).contains(&version) {
            api.request_header_version(version)
        } else {
            1
        };
        header.encode(&mut buf, hv).expect("header");
        buf.put_slice(body);
        let mut frame = Vec::with_capacity(buf.len() + 4);
        frame.extend_from_slice(&(buf.len() as i32).to_be_bytes());
        frame.extend_from_slice(&buf);
        self.stream.write_all(&frame).expect("write");
        let mut len = [0u8; 4];
        self.stream.read_exact(&mut len).expect("answer size");
        let mut answer = vec![0u8; i32::from_be_bytes(len) as usize];
        self.stream.read_exact(&mut answer).expect("answer");
        Bytes::from(answer)
    }

    fn call<Req: Encodable, Resp: Decodable>(
        &mut self,
        api: ApiKey,
        version: i16,
        req: &Req,
    ) -> Resp {
        let mut body = BytesMut::new();
        req.encode(&mut body, version)
            .unwrap_or_else(|e| panic!("{api:?} v{version} request: {e}"));
        let mut answer = self.send_raw(api, version, &body);
        let header = ResponseHeader::decode(&mut answer, api.response_header_version(version))
            .unwrap_or_else(|e| panic!("{api:?} v{version} response header: {e}"));
        assert_eq!(header.correlation_id, self.correlation);
        let r = Resp::decode(&mut answer, version)
            .unwrap_or_else(|e| panic!("{api:?} v{version} response: {e}"));
        assert_eq!(
            answer.remaining(),
            0,
            "{api:?} v{version}: bytes left after the response"
        );
        r
    }
}

/// Sends one default-built request of `api` at `version` (made valid where a default is not)
/// and decodes the answer at the same version; returns its top-level error code where the
/// response has one.
fn exercise(c: &mut Client, addr: SocketAddr, api: ApiKey, v: i16) -> i16 {
    macro_rules! go {
        ($req:expr, $resp:ty) => {{
            let r: $resp = c.call(api, v, &$req);
            r
        }};
    }
    match api {
        ApiKey::Produce => {
            let mut r = ProduceRequest::default();
            r.acks = 1;
            go!(r, ProduceResponse);
            0
        }
        ApiKey::Fetch => {
            let mut r = FetchRequest::default();
            if v <= 14 {
                // v15+: the replica is in `replica_state`, a consumer's default.
                r.replica_id = (-1).into();
            }
            r.max_bytes = 1 << 20;
            go!(r, FetchResponse).error_code
        }
        ApiKey::ListOffsets => {
            let mut r = ListOffsetsRequest::default();
            r.replica_id = (-1).into();
            go!(r, ListOffsetsResponse);
            0
        }
        ApiKey::Metadata => {
            let mut r = MetadataRequest::default();
            if v == 0 {
                // v0 has no null list: empty is "every topic".
                r.topics = Some(Vec::new());
            }
            go!(r, MetadataResponse);
            0
        }
        ApiKey::OffsetCommit => {
            let mut r = OffsetCommitRequest::default();
            r.group_id = GroupId(s("g"));
            r.generation_id_or_member_epoch = -1;
            go!(r, OffsetCommitResponse);
            0
        }
        ApiKey::OffsetFetch => {
            let mut r = OffsetFetchRequest::default();
            if v >= 8 {
                let mut g = offset_fetch_request::OffsetFetchRequestGroup::default();
                g.group_id = GroupId(s("g"));
                r.groups = vec![g];
            } else {
                r.group_id = GroupId(s("g"));
            }
            if v < 2 {
                // v1 has no null list (v2+: null is every partition).
                r.topics = Some(Vec::new());
            }
            let resp = go!(r, OffsetFetchResponse);
            if v >= 8 {
                assert_eq!(resp.groups.len(), 1, "v{v}: one group asked, one answered");
                resp.groups[0].error_code
            } else {
                resp.error_code
            }
        }
        ApiKey::FindCoordinator => {
            let mut r = FindCoordinatorRequest::default();
            if v >= 4 {
                r.coordinator_keys = vec![s("g")];
            } else {
                r.key = s("g");
            }
            let resp = go!(r, FindCoordinatorResponse);
            if v >= 4 {
                assert_eq!(resp.coordinators.len(), 1, "v{v}: one key, one coordinator");
                assert_eq!(resp.coordinators[0].port, addr.port() as i32);
                resp.coordinators[0].error_code
            } else {
                assert_eq!(resp.port, addr.port() as i32);
                resp.error_code
            }
        }
        ApiKey::JoinGroup => {
            // A session timeout of 0 is refused at once (nothing parks).
            let mut r = JoinGroupRequest::default();
            r.group_id = GroupId(s("g"));
            r.protocol_type = s("consumer");
            go!(r, JoinGroupResponse);
            0
        }
        ApiKey::Heartbeat => {
            go!(HeartbeatRequest::default(), HeartbeatResponse);
            0
        }
        ApiKey::LeaveGroup => {
            go!(LeaveGroupRequest::default(), LeaveGroupResponse);
            0
        }
        ApiKey::SyncGroup => {
            go!(SyncGroupRequest::default(), SyncGroupResponse);
            0
        }
        ApiKey::DescribeGroups => {
            let mut r = DescribeGroupsRequest::default();
            r.groups = vec![GroupId(s("none"))];
            let resp = go!(r, DescribeGroupsResponse);
            assert_eq!(resp.groups[0].group_state.as_str(), "Dead");
            0
        }
        ApiKey::ListGroups => go!(ListGroupsRequest::default(), ListGroupsResponse).error_code,
        ApiKey::SaslHandshake => {
            // A fresh connection: a handshake on a logged-in one would start a new login.
            let mut fresh = Client::connect(addr);
            let mut r = SaslHandshakeRequest::default();
            r.mechanism = s("PLAIN");
            let resp: SaslHandshakeResponse = fresh.call(api, v, &r);
            resp.error_code
        }
        ApiKey::SaslAuthenticate => {
            let mut fresh = Client::connect(addr);
            fresh.sasl(KEY_A, 1, v);
            0
        }
        ApiKey::ApiVersions => go!(ApiVersionsRequest::default(), ApiVersionsResponse).error_code,
        ApiKey::CreateTopics => {
            go!(CreateTopicsRequest::default(), CreateTopicsResponse);
            0
        }
        ApiKey::DeleteTopics => {
            go!(DeleteTopicsRequest::default(), DeleteTopicsResponse);
            0
        }
        ApiKey::DeleteRecords => {
            go!(DeleteRecordsRequest::default(), DeleteRecordsResponse);
            0
        }
        ApiKey::InitProducerId => {
            let mut r = InitProducerIdRequest::default();
            if v >= 3 {
                r.producer_id = (-1).into();
                r.producer_epoch = -1;
            }
            go!(r, InitProducerIdResponse).error_code
        }
        ApiKey::DescribeConfigs => {
            go!(DescribeConfigsRequest::default(), DescribeConfigsResponse);
            0
        }
        ApiKey::AlterConfigs => {
            go!(AlterConfigsRequest::default(), AlterConfigsResponse);
            0
        }
        ApiKey::DescribeLogDirs => {
            let resp = go!(DescribeLogDirsRequest::default(), DescribeLogDirsResponse);
            assert_eq!(resp.results.len(), 1, "one log dir");
            resp.error_code
        }
        ApiKey::CreatePartitions => {
            go!(CreatePartitionsRequest::default(), CreatePartitionsResponse);
            0
        }
        ApiKey::DeleteGroups => {
            let mut r = DeleteGroupsRequest::default();
            r.groups_names = vec![GroupId(s("none"))];
            let resp = go!(r, DeleteGroupsResponse);
            assert_eq!(resp.results[0].error_code, GROUP_ID_NOT_FOUND);
            0
        }
        ApiKey::IncrementalAlterConfigs => {
            go!(
                IncrementalAlterConfigsRequest::default(),
                IncrementalAlterConfigsResponse
            );
            0
        }
        ApiKey::OffsetDelete => {
            let mut r = OffsetDeleteRequest::default();
            r.group_id = GroupId(s("none"));
            let resp = go!(r, OffsetDeleteResponse);
            assert_eq!(resp.error_code, GROUP_ID_NOT_FOUND);
            0
        }
        ApiKey::DescribeCluster => {
            let resp = go!(DescribeClusterRequest::default(), DescribeClusterResponse);
            assert_eq!(resp.brokers.len(), 1);
            assert_eq!(resp.brokers[0].port, addr.port() as i32);
            resp.error_code
        }
        // Share groups (tests/kafka_share.rs acts on them): a request naming no group or
        // member is refused at the top level, in a response that decodes.
        ApiKey::ShareGroupHeartbeat => {
            let resp = go!(
                ShareGroupHeartbeatRequest::default(),
                ShareGroupHeartbeatResponse
            );
            assert_eq!(resp.error_code, INVALID_REQUEST);
            0
        }
        ApiKey::ShareGroupDescribe => {
            go!(
                ShareGroupDescribeRequest::default(),
                ShareGroupDescribeResponse
            );
            0
        }
        ApiKey::ShareFetch => {
            let resp = go!(ShareFetchRequest::default(), ShareFetchResponse);
            assert_eq!(resp.error_code, INVALID_REQUEST);
            0
        }
        ApiKey::ShareAcknowledge => {
            let resp = go!(ShareAcknowledgeRequest::default(), ShareAcknowledgeResponse);
            assert_eq!(resp.error_code, INVALID_REQUEST);
            0
        }
        // Transactions: an id with no producer answers INVALID_PRODUCER_ID_MAPPING (49).
        ApiKey::AddPartitionsToTxn => {
            let mut r = AddPartitionsToTxnRequest::default();
            r.v3_and_below_transactional_id = TransactionalId(s("none"));
            go!(r, AddPartitionsToTxnResponse);
            0
        }
        ApiKey::AddOffsetsToTxn => {
            let mut r = AddOffsetsToTxnRequest::default();
            r.transactional_id = TransactionalId(s("none"));
            r.group_id = GroupId(s("g"));
            let resp = go!(r, AddOffsetsToTxnResponse);
            assert_eq!(resp.error_code, 49);
            0
        }
        ApiKey::EndTxn => {
            let mut r = EndTxnRequest::default();
            r.transactional_id = TransactionalId(s("none"));
            let resp = go!(r, EndTxnResponse);
            assert_eq!(resp.error_code, 49);
            0
        }
        ApiKey::TxnOffsetCommit => {
            let mut r = TxnOffsetCommitRequest::default();
            r.transactional_id = TransactionalId(s("none"));
            r.group_id = GroupId(s("g"));
            go!(r, TxnOffsetCommitResponse);
            0
        }
        other => panic!("no request built for {other:?}"),
    }
}

/// ApiVersions advertises every API up to the newest version the codec knows; each of those
/// versions answers a response that decodes at that version (and is not UNSUPPORTED_VERSION);
/// one version past either end is UNSUPPORTED_VERSION, and the connection goes on.
#[test]
fn every_advertised_version_of_every_api_answers_and_decodes() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    let (b, addr) = start(tmp.path());
    let mut c = Client::login(addr, KEY_A);
    let versions: ApiVersionsResponse =
        c.call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default());
    assert_eq!(versions.error_code, 0);
    assert_eq!(
        versions.api_keys.len(),
        EXPECTED.len(),
        "{:?}",
        versions.api_keys
    );
    let mut exercised = 0;
    for (api, max) in EXPECTED {
        let advertised = versions
            .api_keys
            .iter()
            .find(|k| k.api_key == *api as i16)
            .unwrap_or_else(|| panic!("{api:?} is not advertised"));
        assert_eq!(advertised.max_version, *max, "{api:?}'s newest version");
        for v in advertised.min_version..=advertised.max_version {
            let code = exercise(&mut c, addr, *api, v);
            assert_ne!(code, UNSUPPORTED_VERSION, "{api:?} v{v} is advertised");
            exercised += 1;
        }
        for v in [advertised.min_version - 1, advertised.max_version + 1] {
            if v < 0 {
                continue;
            }
            let mut answer = c.send_raw(*api, v, &[]);
            assert_eq!(answer.get_i32(), c.correlation);
            if *api == ApiKey::ApiVersions {
                // KIP-511: the versions at v0, with the error.
                let r = ApiVersionsResponse::decode(&mut answer, 0).expect("v0 answer");
                assert_eq!(r.error_code, UNSUPPORTED_VERSION);
            } else {
                assert_eq!(answer.get_i16(), UNSUPPORTED_VERSION, "{api:?} v{v}");
            }
        }
    }
    println!("{exercised} API versions exercised");
    assert!(exercised > 150, "only {exercised} versions exercised");
    drop(c);
    b.shutdown();
}

fn create_topic(c: &mut Client, name: &str, partitions: i32) {
    let mut t = create_topics_request::CreatableTopic::default();
    t.name = TopicName(s(name));
    t.num_partitions = partitions;
    t.replication_factor = 1;
    let mut r = CreateTopicsRequest::default();
    r.topics = vec![t];
    let resp: CreateTopicsResponse = c.call(ApiKey::CreateTopics, 7, &r);
    assert_eq!(
        resp.topics[0].error_code, 0,
        "{:?}",
        resp.topics[0].error_message
    );
}

fn metadata(c: &mut Client, version: i16) -> MetadataResponse {
    let mut r = MetadataRequest::default();
    // Null: every topic of the account.
    r.topics = None;
    c.call(ApiKey::Metadata, version, &r)
}

fn create_partitions(c: &mut Client, name: &str, count: i32) -> i16 {
    let mut t = create_partitions_request::CreatePartitionsTopic::default();
    t.name = TopicName(s(name));
    t.count = count;
    let mut r = CreatePartitionsRequest::default();
    r.topics = vec![t];
    let resp: CreatePartitionsResponse = c.call(ApiKey::CreatePartitions, 3, &r);
    if resp.results[0].error_code != 0 {
        println!("CreatePartitions: {:?}", resp.results[0].error_message);
    }
    resp.results[0].error_code
}

fn retention_ms(c: &mut Client, name: &str) -> String {
    let mut res = describe_configs_request::DescribeConfigsResource::default();
    res.resource_type = 2;
    res.resource_name = s(name);
    // Null: every config of the topic.
    res.configuration_keys = None;
    let mut r = DescribeConfigsRequest::default();
    r.resources = vec![res];
    let resp: DescribeConfigsResponse = c.call(ApiKey::DescribeConfigs, 4, &r);
    let found = resp.results[0]
        .configs
        .iter()
        .find(|e| e.name.as_str() == "retention.ms")
        .and_then(|e| e.value.as_ref().map(|v| v.to_string()));
    found.unwrap_or_default()
}

fn list_groups(c: &mut Client) -> Vec<(String, String)> {
    let resp: ListGroupsResponse = c.call(ApiKey::ListGroups, 5, &ListGroupsRequest::default());
    assert_eq!(resp.error_code, 0);
    resp.groups
        .iter()
        .map(|g| (g.group_id.0.to_string(), g.group_state.to_string()))
        .collect()
}

fn log_dir_topics(c: &mut Client) -> Vec<String> {
    let mut r = DescribeLogDirsRequest::default();
    // Null: every topic of the account.
    r.topics = None;
    let resp: DescribeLogDirsResponse = c.call(ApiKey::DescribeLogDirs, 4, &r);
    resp.results[0]
        .topics
        .iter()
        .map(|t| t.name.0.to_string())
        .collect()
}

/// The admin calls do what they say, durably, in the caller's account only.
#[test]
fn admin_calls_act_in_the_callers_account_and_survive_a_restart() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    let (b, addr) = start(tmp.path());
    let mut a = Client::login(addr, KEY_A);
    let mut other = Client::login(addr, KEY_B);
    create_topic(&mut a, "orders", 1);
    // CreatePartitions: more is taken, the same or fewer is INVALID_PARTITIONS, and another
    // account cannot reach the topic.
    assert_eq!(create_partitions(&mut a, "orders", 3), 0);
    assert_eq!(create_partitions(&mut a, "orders", 3), INVALID_PARTITIONS);
    assert_eq!(create_partitions(&mut a, "orders", 2), INVALID_PARTITIONS);
    assert_eq!(
        create_partitions(&mut other, "orders", 5),
        UNKNOWN_TOPIC_OR_PARTITION
    );
    let m = metadata(&mut a, 12);
    assert_eq!(m.topics.len(), 1);
    assert_eq!(m.topics[0].partitions.len(), 3);
    let topic_id = m.topics[0].topic_id;
    assert!(!topic_id.is_nil(), "Metadata v10+ carries a topic id");
    // IncrementalAlterConfigs: retention is stored; another account's call is refused.
    let alter = |c: &mut Client, value: &str| -> i16 {
        let mut cfg = incremental_alter_configs_request::AlterableConfig::default();
        cfg.name = s("retention.ms");
        cfg.config_operation = 0;
        cfg.value = Some(s(value));
        let mut res = incremental_alter_configs_request::AlterConfigsResource::default();
        res.resource_type = 2;
        res.resource_name = s("orders");
        res.configs = vec![cfg];
        let mut r = IncrementalAlterConfigsRequest::default();
        r.resources = vec![res];
        let resp: IncrementalAlterConfigsResponse = c.call(ApiKey::IncrementalAlterConfigs, 1, &r);
        resp.responses[0].error_code
    };
    assert_eq!(alter(&mut a, "86400000"), 0);
    assert_eq!(alter(&mut other, "1000"), UNKNOWN_TOPIC_OR_PARTITION);
    assert_eq!(retention_ms(&mut a, "orders"), "86400000");
    // DeleteRecords: nothing past the end; up to the end is the end.
    let delete_records = |c: &mut Client, offset: i64| -> (i16, i64) {
        let mut p = delete_records_request::DeleteRecordsPartition::default();
        p.partition_index = 0;
        p.offset = offset;
        let mut t = delete_records_request::DeleteRecordsTopic::default();
        t.name = TopicName(s("orders"));
        t.partitions = vec![p];
        let mut r = DeleteRecordsRequest::default();
        r.topics = vec![t];
        let resp: DeleteRecordsResponse = c.call(ApiKey::DeleteRecords, 2, &r);
        let p = &resp.topics[0].partitions[0];
        (p.error_code, p.low_watermark)
    };
    assert_eq!(delete_records(&mut a, 5).0, OFFSET_OUT_OF_RANGE);
    assert_eq!(delete_records(&mut a, -1), (0, 0));
    assert_eq!(delete_records(&mut other, -1).0, UNKNOWN_TOPIC_OR_PARTITION);
    // Fetch v13+ by topic id: the owner reads; another account's id is unknown to it.
    let fetch_by_id = |c: &mut Client| -> i16 {
        let mut p = fetch_request::FetchPartition::default();
        p.partition = 0;
        p.partition_max_bytes = 1 << 20;
        let mut t = fetch_request::FetchTopic::default();
        t.topic_id = topic_id;
        t.partitions = vec![p];
        let mut r = FetchRequest::default();
        r.max_bytes = 1 << 20;
        r.topics = vec![t];
        let resp: FetchResponse = c.call(ApiKey::Fetch, 18, &r);
        assert_eq!(resp.responses[0].topic_id, topic_id);
        resp.responses[0].partitions[0].error_code
    };
    assert_eq!(fetch_by_id(&mut a), 0);
    assert_eq!(fetch_by_id(&mut other), UNKNOWN_TOPIC_ID);
    // A group with committed offsets only (a simple commit): listed and described as Empty
    // to its account, invisible to the other.
    let mut commit = OffsetCommitRequest::default();
    commit.group_id = GroupId(s("billing"));
    commit.generation_id_or_member_epoch = -1;
    let mut t = offset_commit_request::OffsetCommitRequestTopic::default();
    t.name = TopicName(s("orders"));
    for p in 0..3 {
        let mut pc = offset_commit_request::OffsetCommitRequestPartition::default();
        pc.partition_index = p;
        pc.committed_offset = 0;
        t.partitions.push(pc);
    }
    commit.topics = vec![t];
    let resp: OffsetCommitResponse = a.call(ApiKey::OffsetCommit, 9, &commit);
    assert!(resp.topics[0].partitions.iter().all(|p| p.error_code == 0));
    assert_eq!(
        list_groups(&mut a),
        vec![("billing".to_string(), "Empty".to_string())]
    );
    assert!(
        list_groups(&mut other).is_empty(),
        "another account's group is listed"
    );
    let mut d = DescribeGroupsRequest::default();
    d.groups = vec![GroupId(s("billing"))];
    let mine: DescribeGroupsResponse = a.call(ApiKey::DescribeGroups, 6, &d);
    assert_eq!(mine.groups[0].error_code, 0);
    assert_eq!(mine.groups[0].group_state.as_str(), "Empty");
    let theirs: DescribeGroupsResponse = other.call(ApiKey::DescribeGroups, 6, &d);
    assert_eq!(theirs.groups[0].error_code, GROUP_ID_NOT_FOUND);
    // Log dirs and metadata: the other account sees none of the first's topics.
    assert_eq!(log_dir_topics(&mut a), vec!["orders".to_string()]);
    assert!(log_dir_topics(&mut other).is_empty());
    assert!(metadata(&mut other, 13).topics.is_empty());
    // OffsetDelete of one partition, then DeleteGroups.
    let mut od = OffsetDeleteRequest::default();
    od.group_id = GroupId(s("billing"));
    let mut t = offset_delete_request::OffsetDeleteRequestTopic::default();
    t.name = TopicName(s("orders"));
    let mut p = offset_delete_request::OffsetDeleteRequestPartition::default();
    p.partition_index = 0;
    t.partitions = vec![p];
    od.topics = vec![t];
    let theirs: OffsetDeleteResponse = other.call(ApiKey::OffsetDelete, 0, &od);
    assert_eq!(theirs.error_code, GROUP_ID_NOT_FOUND);
    let mine: OffsetDeleteResponse = a.call(ApiKey::OffsetDelete, 0, &od);
    assert_eq!(mine.error_code, 0);
    assert_eq!(mine.topics[0].partitions[0].error_code, 0);
    let mut of = OffsetFetchRequest::default();
    let mut g = offset_fetch_request::OffsetFetchRequestGroup::default();
    g.group_id = GroupId(s("billing"));
    // Null: every partition the group committed on.
    g.topics = None;
    of.groups = vec![g];
    let fetched: OffsetFetchResponse = a.call(ApiKey::OffsetFetch, 9, &of);
    let offsets: Vec<(i32, i64)> = fetched.groups[0].topics[0]
        .partitions
        .iter()
        .map(|p| (p.partition_index, p.committed_offset))
        .collect();
    assert_eq!(
        offsets,
        vec![(1, 0), (2, 0)],
        "partition 0's offset was deleted"
    );
    drop((a, other));
    // A restart keeps the partitions, the retention and the deleted offset.
    b.shutdown();
    let (b, addr) = start(tmp.path());
    let mut a = Client::login(addr, KEY_A);
    assert_eq!(metadata(&mut a, 13).topics[0].partitions.len(), 3);
    assert_eq!(retention_ms(&mut a, "orders"), "86400000");
    let fetched: OffsetFetchResponse = a.call(ApiKey::OffsetFetch, 9, &of);
    assert_eq!(fetched.groups[0].topics[0].partitions.len(), 2);
    let mut del = DeleteGroupsRequest::default();
    del.groups_names = vec![GroupId(s("billing"))];
    let resp: DeleteGroupsResponse = a.call(ApiKey::DeleteGroups, 2, &del);
    assert_eq!(resp.results[0].error_code, 0);
    assert!(
        list_groups(&mut a).is_empty(),
        "a deleted group is still listed"
    );
    drop(a);
    b.shutdown();
}

/// A start-up on a Kafka port another program holds fails, and says which listener and port,
/// once (it used to blame the SQS HTTP API).
#[test]
fn a_busy_kafka_port_names_the_kafka_listener_and_port_once() {
    let tmp = tempfile::tempdir().expect("tmp");
    let other = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let taken = other.local_addr().expect("addr");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sluiced"))
        .arg("--data-dir")
        .arg(tmp.path().join("d"))
        .args(["--shards", "1"])
        .args(["--http-addr", "127.0.0.1:0"])
        .args(["--quic-addr", "127.0.0.1:0"])
        .args(["--metrics-addr", "127.0.0.1:0"])
        .arg("--kafka-addr")
        .arg(taken.to_string())
        .env("SLUICE_AUTH", "none")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn sluiced");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("sluiced started on a Kafka port another program holds");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut out = String::new();
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut out)
        .expect("read");
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut out)
        .expect("read");
    assert!(!status.success(), "{out}");
    // The error, as sluiced prints it last on stderr (the log has it too).
    let failed = out
        .lines()
        .find(|l| l.starts_with("sluiced: start failed:"))
        .unwrap_or_else(|| panic!("no start failure printed: {out}"));
    let named = format!("Kafka listener (--kafka-addr) on {taken}");
    assert_eq!(failed.matches(&named).count(), 1, "{failed}");
    assert_eq!(
        failed.matches(" on ").count(),
        1,
        "more than one listener named: {failed}"
    );
    assert!(!out.contains("SQS HTTP API"), "{out}");
    drop(other);
}
