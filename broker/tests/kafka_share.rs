//! Kafka share groups (KIP-932) on a queue, over real sockets: share members speak raw Kafka
//! frames (the `kafka-protocol` crate's codec) and SQS receivers speak the JSON protocol, on
//! one queue at once. What is promised: a record is held by one consumer at a time (a share
//! member or an SQS receiver), ACCEPT deletes, RELEASE makes it visible at once and counts as
//! a delivery, REJECT moves it to the DLQ, the receive count is one count across both
//! protocols, a record whose lock ended goes to someone else and the old holder's
//! acknowledgement is refused, and bad input (a record not acquired, a record another member
//! holds, a share request on a classic group) is a typed error that changes nothing.
//! Random choices take their seed from `SLUICE_SEED` (printed on failure).
// A test is the broker's outside world: it times the broker with its own clocks (deadlines,
// waits). broker/clippy.toml's clock seam governs the broker's code, not this.
#![allow(clippy::disallowed_methods)]

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use kafka_protocol::records::RecordBatchDecoder;
use rand::{Rng, SeedableRng};
use sluice_broker::config::BrokerConfig;
use sluice_broker::server::{self, BrokerHandle};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// glommio registers locked memory per executor: one broker at a time in this binary.
static ONE_BROKER: Mutex<()> = Mutex::new(());
/// Every socket read gives up after this: a hang is a failure, not a stall.
const READ_TIMEOUT: Duration = Duration::from_secs(30);
const INVALID_RECORD_STATE: i16 = 121;
const GROUP_ID_NOT_FOUND: i16 = 69;
const UNKNOWN_MEMBER_ID: i16 = 25;
const INVALID_SHARE_SESSION_EPOCH: i16 = 123;
const NON_EMPTY_GROUP: i16 = 68;
const ACCEPT: i8 = 1;
const RELEASE: i8 = 2;
const REJECT: i8 = 3;
/// How long a share fetch waits for records.
const FETCH_WAIT_MS: i32 = 200;
/// The queue's visibility timeout: longer than the test, so only explicit acts end a lock
/// (except where the group sets its own lock duration).
const VISIBILITY_TIMEOUT_S: u32 = 300;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

#[allow(clippy::disallowed_methods)] // a random seed for the test, not the broker's time
fn seed() -> u64 {
    std::env::var("SLUICE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        })
}

struct Broker {
    _handle: BrokerHandle,
    kafka: SocketAddr,
    http: u16,
}

fn start(dir: &Path) -> Broker {
    let mut c = BrokerConfig::ephemeral(dir.to_path_buf()).expect("config");
    c.shards = 2;
    // Two partitions per queue: share members fetch both, SQS receivers pick either.
    c.default_partitions = 2;
    let b = server::start(c).expect("start");
    b.wait_ready().expect("ready");
    let kafka = b.kafka_addr().expect("a Kafka listener");
    let http = b.http_addr().port();
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", http)).is_err() || TcpStream::connect(kafka).is_err() {
        assert!(Instant::now() < deadline, "listeners did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    Broker {
        _handle: b,
        kafka,
        http,
    }
}

// ------------------------------------------------------------------------------ SQS (JSON)

fn sqs(port: u16, action: &str, body: &serde_json::Value) -> serde_json::Value {
    let body = body.to_string();
    let req = format!(
        "POST / HTTP/1.1\r\nHost: localhost\r\nX-Amz-Target: AmazonSQS.{action}\r\n\
         Content-Type: application/x-amz-json-1.0\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut st = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    st.set_read_timeout(Some(READ_TIMEOUT)).expect("timeout");
    st.write_all(req.as_bytes()).expect("write");
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 4096];
        let n = st.read(&mut chunk).expect("read");
        assert!(n > 0, "closed before a response");
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    while buf.len() < head_end + len {
        let mut chunk = [0u8; 65536];
        let n = st.read(&mut chunk).expect("read body");
        assert!(n > 0, "closed mid-body");
        buf.extend_from_slice(&chunk[..n]);
    }
    assert!(
        head.starts_with("HTTP/1.1 200"),
        "{action}: {head}{}",
        String::from_utf8_lossy(&buf[head_end..])
    );
    if len == 0 {
        return serde_json::Value::Null;
    }
    serde_json::from_slice(&buf[head_end..head_end + len]).expect("JSON")
}

fn queue_url(port: u16, name: &str, attributes: serde_json::Value) -> String {
    let r = sqs(
        port,
        "CreateQueue",
        &serde_json::json!({"QueueName": name, "Attributes": attributes}),
    );
    r["QueueUrl"].as_str().expect("url").to_string()
}

/// An SQS receive: (body, receipt handle, receive count).
fn sqs_receive(port: u16, url: &str, max: u32) -> Vec<(String, String, u32)> {
    let r = sqs(
        port,
        "ReceiveMessage",
        &serde_json::json!({"QueueUrl": url, "MaxNumberOfMessages": max,
            "AttributeNames": ["ApproximateReceiveCount"]}),
    );
    r["Messages"]
        .as_array()
        .map(|l| {
            l.iter()
                .map(|m| {
                    (
                        m["Body"].as_str().expect("body").to_string(),
                        m["ReceiptHandle"].as_str().expect("handle").to_string(),
                        m["Attributes"]["ApproximateReceiveCount"]
                            .as_str()
                            .and_then(|c| c.parse().ok())
                            .expect("count"),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn sqs_count(port: u16, url: &str) -> (u64, u64) {
    let r = sqs(
        port,
        "GetQueueAttributes",
        &serde_json::json!({"QueueUrl": url, "AttributeNames": ["All"]}),
    );
    let n = |k: &str| {
        r["Attributes"][k]
            .as_str()
            .and_then(|v| v.parse().ok())
            .expect("count")
    };
    (
        n("ApproximateNumberOfMessages"),
        n("ApproximateNumberOfMessagesNotVisible"),
    )
}

// ------------------------------------------------------------------------------ Kafka frames

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

    fn call<Req: Encodable, Resp: Decodable>(
        &mut self,
        api: ApiKey,
        version: i16,
        req: &Req,
    ) -> Resp {
        self.correlation += 1;
        let mut header = RequestHeader::default();
        header.request_api_key = api as i16;
        header.request_api_version = version;
        header.correlation_id = self.correlation;
        header.client_id = Some(s("kafka-share-test"));
        let mut buf = BytesMut::new();
        header
            .encode(&mut buf, api.request_header_version(version))
            .expect("header");
        req.encode(&mut buf, version).expect("request");
        let mut frame = Vec::with_capacity(buf.len() + 4);
        frame.put_i32(buf.len() as i32);
        frame.extend_from_slice(&buf);
        self.stream.write_all(&frame).expect("write");
        let mut len = [0u8; 4];
        self.stream.read_exact(&mut len).expect("answer size");
        let mut answer = vec![0u8; i32::from_be_bytes(len) as usize];
        self.stream.read_exact(&mut answer).expect("answer");
        let mut answer = Bytes::from(answer);
        let h = ResponseHeader::decode(&mut answer, api.response_header_version(version))
            .expect("response header");
        assert_eq!(h.correlation_id, self.correlation);
        let r = Resp::decode(&mut answer, version).expect("response");
        assert_eq!(answer.remaining(), 0, "{api:?}: bytes left");
        r
    }
}

/// One share group member: its connection, id, epochs and the records it holds.
struct Member {
    c: Client,
    group: String,
    id: String,
    epoch: i32,
    session_epoch: i32,
    topic_id: Uuid,
    partitions: Vec<i32>,
}

type Uuid = uuid::Uuid;

/// A record a share fetch handed out: (partition, offset, body, delivery count).
type Got = (i32, i64, String, i16);

impl Member {
    fn join(addr: SocketAddr, group: &str, id: &str, topic: &str) -> Member {
        let mut c = Client::connect(addr);
        let mut h = ShareGroupHeartbeatRequest::default();
        h.group_id = GroupId(s(group));
        h.member_id = s(id);
        h.member_epoch = 0;
        h.subscribed_topic_names = Some(vec![TopicName(s(topic))]);
        let r: ShareGroupHeartbeatResponse = c.call(ApiKey::ShareGroupHeartbeat, 1, &h);
        assert_eq!(r.error_code, 0, "join: {:?}", r.error_message);
        assert!(r.member_epoch > 0);
        let a = r.assignment.expect("an assignment");
        assert_eq!(a.topic_partitions.len(), 1, "the queue is assigned");
        Member {
            c,
            group: group.into(),
            id: id.into(),
            epoch: r.member_epoch,
            session_epoch: 0,
            topic_id: a.topic_partitions[0].topic_id,
            partitions: a.topic_partitions[0].partitions.clone(),
        }
    }

    fn heartbeat(&mut self) -> i16 {
        let mut h = ShareGroupHeartbeatRequest::default();
        h.group_id = GroupId(s(&self.group));
        h.member_id = s(&self.id);
        h.member_epoch = self.epoch;
        let r: ShareGroupHeartbeatResponse = self.c.call(ApiKey::ShareGroupHeartbeat, 1, &h);
        if r.error_code == 0 {
            self.epoch = r.member_epoch;
        }
        r.error_code
    }

    /// A share fetch carrying `acks` ((partition, offset, type)); returns the top-level error,
    /// each partition's acknowledge error and the records acquired.
    fn fetch(&mut self, acks: &[(i32, i64, i8)]) -> (i16, BTreeMap<i32, i16>, Vec<Got>) {
        let mut req = ShareFetchRequest::default();
        req.group_id = Some(GroupId(s(&self.group)));
        req.member_id = Some(s(&self.id));
        req.share_session_epoch = self.session_epoch;
        req.max_wait_ms = FETCH_WAIT_MS;
        req.max_bytes = 1 << 20;
        req.max_records = 7;
        req.batch_size = 7;
        let mut t = share_fetch_request::FetchTopic::default();
        t.topic_id = self.topic_id;
        for &p in &self.partitions {
            let mut fp = share_fetch_request::FetchPartition::default();
            fp.partition_index = p;
            for &(_, o, ty) in acks.iter().filter(|a| a.0 == p) {
                let mut b = share_fetch_request::AcknowledgementBatch::default();
                b.first_offset = o;
                b.last_offset = o;
                b.acknowledge_types = vec![ty];
                fp.acknowledgement_batches.push(b);
            }
            t.partitions.push(fp);
        }
        req.topics = vec![t];
        let r: ShareFetchResponse = self.c.call(ApiKey::ShareFetch, 1, &req);
        if r.error_code == 0 {
            self.session_epoch = if self.session_epoch == i32::MAX {
                1
            } else {
                self.session_epoch + 1
            };
        }
        let mut ack_errors = BTreeMap::new();
        let mut got = Vec::new();
        for t in r.responses {
            assert_eq!(t.topic_id, self.topic_id);
            for p in t.partitions {
                assert_eq!(
                    p.error_code, 0,
                    "partition {}: {:?}",
                    p.partition_index, p.error_message
                );
                ack_errors.insert(p.partition_index, p.acknowledge_error_code);
                let mut counts = BTreeMap::new();
                for a in &p.acquired_records {
                    for o in a.first_offset..=a.last_offset {
                        counts.insert(o, a.delivery_count);
                    }
                }
                if let Some(mut b) = p.records {
                    while b.has_remaining() {
                        let set = RecordBatchDecoder::decode(&mut b).expect("batch");
                        for rec in set.records {
                            let body = String::from_utf8(rec.value.expect("value").to_vec())
                                .expect("utf8");
                            let count = *counts.get(&rec.offset).expect("acquired");
                            got.push((p.partition_index, rec.offset, body, count));
                        }
                    }
                }
                assert_eq!(
                    counts.len(),
                    got.iter().filter(|g| g.0 == p.partition_index).count()
                );
            }
        }
        (r.error_code, ack_errors, got)
    }

    /// A ShareAcknowledge; returns the top-level error and each partition's.
    fn acknowledge(&mut self, acks: &[(i32, i64, i8)]) -> (i16, BTreeMap<i32, i16>) {
        let mut req = ShareAcknowledgeRequest::default();
        req.group_id = Some(GroupId(s(&self.group)));
        req.member_id = Some(s(&self.id));
        req.share_session_epoch = self.session_epoch;
        let mut t = share_acknowledge_request::AcknowledgeTopic::default();
        t.topic_id = self.topic_id;
        let parts: BTreeSet<i32> = acks.iter().map(|a| a.0).collect();
        for p in parts {
            let mut ap = share_acknowledge_request::AcknowledgePartition::default();
            ap.partition_index = p;
            for &(_, o, ty) in acks.iter().filter(|a| a.0 == p) {
                let mut b = share_acknowledge_request::AcknowledgementBatch::default();
                b.first_offset = o;
                b.last_offset = o;
                b.acknowledge_types = vec![ty];
                ap.acknowledgement_batches.push(b);
            }
            t.partitions.push(ap);
        }
        req.topics = vec![t];
        let r: ShareAcknowledgeResponse = self.c.call(ApiKey::ShareAcknowledge, 1, &req);
        if r.error_code == 0 {
            self.session_epoch += 1;
        }
        let errors = r
            .responses
            .into_iter()
            .flat_map(|t| t.partitions)
            .map(|p| (p.partition_index, p.error_code))
            .collect();
        (r.error_code, errors)
    }
}

fn configure_group(c: &mut Client, group: &str, configs: &[(&str, &str)]) -> i16 {
    let mut req = IncrementalAlterConfigsRequest::default();
    let mut res = incremental_alter_configs_request::AlterConfigsResource::default();
    res.resource_type = 32;
    res.resource_name = s(group);
    for (k, v) in configs {
        let mut c = incremental_alter_configs_request::AlterableConfig::default();
        c.name = s(k);
        c.config_operation = 0;
        c.value = Some(s(v));
        res.configs.push(c);
    }
    req.resources = vec![res];
    let r: IncrementalAlterConfigsResponse = c.call(ApiKey::IncrementalAlterConfigs, 1, &req);
    r.responses[0].error_code
}

fn send_all(port: u16, url: &str, bodies: &[String]) {
    for b in bodies {
        sqs(
            port,
            "SendMessage",
            &serde_json::json!({"QueueUrl": url, "MessageBody": b}),
        );
    }
}

fn dlq_bodies(port: u16, url: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    loop {
        let got = sqs_receive(port, url, 10);
        if got.is_empty() {
            return out;
        }
        out.extend(got.into_iter().map(|g| g.0));
    }
}

/// A share group of three and an SQS receiver drain one queue. Each member accepts most of
/// what it gets and releases or rejects some (chosen from the seed); the SQS receiver
/// deletes some and hands others back (visibility 0). At every moment no body is held by two
/// consumers; every message ends processed exactly once (accepted or deleted) or in the DLQ
/// (rejected); released ones come back with a higher count, across both protocols.
#[test]
fn a_share_group_and_sqs_receivers_drain_one_queue() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let seed = seed();
    let result = std::panic::catch_unwind(|| drain(seed));
    if let Err(e) = result {
        eprintln!("failed with SLUICE_SEED={seed}");
        std::panic::resume_unwind(e);
    }
}

fn drain(seed: u64) {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let tmp = tempfile::tempdir().expect("tmp");
    let b = start(tmp.path());
    let dlq = queue_url(b.http, "drain-dlq", serde_json::json!({}));
    let arn = sqs(
        b.http,
        "GetQueueAttributes",
        &serde_json::json!({"QueueUrl": dlq, "AttributeNames": ["QueueArn"]}),
    )["Attributes"]["QueueArn"]
        .as_str()
        .expect("arn")
        .to_string();
    let url = queue_url(
        b.http,
        "drain",
        serde_json::json!({
            "VisibilityTimeout": VISIBILITY_TIMEOUT_S.to_string(),
            "RedrivePolicy": serde_json::json!({"deadLetterTargetArn": arn, "maxReceiveCount": 10}).to_string(),
        }),
    );
    const MESSAGES: usize = 60;
    let bodies: Vec<String> = (0..MESSAGES).map(|i| format!("m{i:03}")).collect();
    send_all(b.http, &url, &bodies);
    let mut members: Vec<Member> = ["a", "b", "c"]
        .iter()
        .map(|id| Member::join(b.kafka, "drainers", &format!("member-{id}"), "queue:drain"))
        .collect();
    assert!(members.iter().all(|m| m.partitions == vec![0, 1]));

    // Who holds what right now: body -> holder; and what happened to each body.
    let mut held: BTreeMap<String, String> = BTreeMap::new();
    let mut processed: BTreeMap<String, usize> = BTreeMap::new();
    let mut rejected: BTreeSet<String> = BTreeSet::new();
    let mut released: BTreeMap<String, u32> = BTreeMap::new();
    let mut last_count: BTreeMap<String, u32> = BTreeMap::new();
    // Acks each member owes at its next fetch.
    let mut pending: Vec<Vec<(i32, i64, i8, String)>> = vec![Vec::new(); 3];
    let mut sqs_held: Vec<(String, String)> = Vec::new();
    let mut idle_rounds = 0;
    for _round in 0..200 {
        let mut any = false;
        for (i, m) in members.iter_mut().enumerate() {
            let acks: Vec<(i32, i64, i8)> = pending[i].iter().map(|a| (a.0, a.1, a.2)).collect();
            let (err, ack_errors, got) = m.fetch(&acks);
            assert_eq!(err, 0);
            assert!(
                ack_errors.values().all(|&e| e == 0),
                "acks refused: {ack_errors:?}"
            );
            for (_, _, ty, body) in pending[i].drain(..) {
                assert_eq!(held.remove(&body).as_deref(), Some(m.id.as_str()));
                match ty {
                    ACCEPT => *processed.entry(body).or_default() += 1,
                    RELEASE => *released.entry(body).or_default() += 1,
                    _ => {
                        rejected.insert(body);
                    }
                }
            }
            for (p, o, body, count) in got {
                any = true;
                if let Some(h) = held.insert(body.clone(), m.id.clone()) {
                    panic!("{body} handed to {} while {h} holds it", m.id);
                }
                let before = last_count.insert(body.clone(), count as u32).unwrap_or(0);
                assert!(
                    count as u32 > before,
                    "{body}: count {count} after {before}"
                );
                let ty = match rng.gen_range(0..10) {
                    0 if count < 3 => RELEASE,
                    1 => REJECT,
                    _ => ACCEPT,
                };
                pending[i].push((p, o, ty, body));
            }
        }
        // The SQS receiver: takes a few, deletes or returns those it held.
        for (body, handle) in sqs_held.drain(..) {
            assert_eq!(held.remove(&body).as_deref(), Some("sqs"));
            if rng.gen_bool(0.8) {
                sqs(
                    b.http,
                    "DeleteMessage",
                    &serde_json::json!({"QueueUrl": url, "ReceiptHandle": handle}),
                );
                *processed.entry(body).or_default() += 1;
            } else {
                sqs(
                    b.http,
                    "ChangeMessageVisibility",
                    &serde_json::json!({"QueueUrl": url, "ReceiptHandle": handle, "VisibilityTimeout": 0}),
                );
                *released.entry(body).or_default() += 1;
            }
        }
        for (body, handle, count) in sqs_receive(b.http, &url, 3) {
            any = true;
            if let Some(h) = held.insert(body.clone(), "sqs".into()) {
                panic!("{body} received by SQS while {h} holds it");
            }
            let before = last_count.insert(body.clone(), count).unwrap_or(0);
            assert!(count > before, "{body}: SQS count {count} after {before}");
            sqs_held.push((body, handle));
        }
        if !any && pending.iter().all(Vec::is_empty) && sqs_held.is_empty() {
            idle_rounds += 1;
            if idle_rounds >= 2 {
                break;
            }
        } else {
            idle_rounds = 0;
        }
    }
    assert!(held.is_empty(), "still held: {held:?}");
    assert_eq!(sqs_count(b.http, &url), (0, 0), "the queue is drained");
    for body in &bodies {
        let done = processed.get(body).copied().unwrap_or(0) + usize::from(rejected.contains(body));
        assert_eq!(
            done,
            1,
            "{body}: processed {processed:?} rejected {}",
            rejected.contains(body)
        );
    }
    // Released ones came back with a higher count (checked as they came); the counts are one
    // count across both protocols: a body's last count is its deliveries, whoever took it.
    for (body, times) in &released {
        assert!(
            last_count[body] > *times,
            "{body}: released {times} times, count {}",
            last_count[body]
        );
    }
    assert!(
        !released.is_empty() || !rejected.is_empty(),
        "seed {seed} exercised nothing"
    );
    assert_eq!(
        dlq_bodies(b.http, &dlq),
        rejected,
        "rejected ones are in the DLQ"
    );
}

/// Bad input, each a typed error that changes nothing: acknowledging a record never acquired,
/// one another member holds, a share request on a classic group, a stale session epoch. Also
/// the lock: a record whose group lock ended goes to another member and the first one's
/// acknowledgement is refused; a record past the group's delivery limit is not handed out
/// again (it goes to the DLQ); a queue without a redrive policy drops a rejected record.
#[test]
fn bad_acknowledgements_and_group_types_are_refused_and_change_nothing() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    let b = start(tmp.path());
    let dlq = queue_url(b.http, "bad-dlq", serde_json::json!({}));
    let arn = sqs(
        b.http,
        "GetQueueAttributes",
        &serde_json::json!({"QueueUrl": dlq, "AttributeNames": ["QueueArn"]}),
    )["Attributes"]["QueueArn"]
        .as_str()
        .expect("arn")
        .to_string();
    let url = queue_url(
        b.http,
        "bad",
        serde_json::json!({
            "VisibilityTimeout": VISIBILITY_TIMEOUT_S.to_string(),
            "RedrivePolicy": serde_json::json!({"deadLetterTargetArn": arn, "maxReceiveCount": 10}).to_string(),
        }),
    );
    send_all(b.http, &url, &["x1".to_string()]);
    let mut a = Member::join(b.kafka, "g", "member-a", "queue:bad");
    let mut other = Member::join(b.kafka, "g", "member-b", "queue:bad");
    // A share consumer learns its assigned topics' names by id (Metadata v10+).
    let mut md = MetadataRequest::default();
    let mut mt = metadata_request::MetadataRequestTopic::default();
    mt.topic_id = a.topic_id;
    mt.name = None;
    md.topics = Some(vec![mt]);
    let r: MetadataResponse = a.c.call(ApiKey::Metadata, 13, &md);
    assert_eq!(r.topics.len(), 1);
    assert_eq!(
        r.topics[0].name.as_ref().map(|n| n.0.as_str()),
        Some("queue:bad")
    );
    assert_eq!(r.topics[0].partitions.len(), 2);
    assert_eq!(a.heartbeat(), 0);
    let (err, _, got) = a.fetch(&[]);
    assert_eq!(err, 0);
    assert_eq!(got.len(), 1);
    let (p, o, _, _) = got[0].clone();
    let (_, _, none) = other.fetch(&[]);
    assert!(none.is_empty(), "held by a");
    // Another member acknowledging a's record, and a record nobody acquired.
    let (err, errors) = other.acknowledge(&[(p, o, ACCEPT)]);
    assert_eq!(err, 0, "the session is fine");
    assert_eq!(errors[&p], INVALID_RECORD_STATE, "another member's record");
    let (_, errors) = a.acknowledge(&[(p, o + 1_000, ACCEPT)]);
    assert_eq!(errors[&p], INVALID_RECORD_STATE, "a record never acquired");
    // Mixed with a valid one in the same partition: all refused, nothing changed.
    let (_, errors) = a.acknowledge(&[(p, o, ACCEPT), (p, o + 1_000, ACCEPT)]);
    assert_eq!(errors[&p], INVALID_RECORD_STATE);
    assert_eq!(
        sqs_count(b.http, &url),
        (0, 1),
        "still one message, still a's"
    );
    // A stale session epoch.
    a.session_epoch += 5;
    let (err, _, _) = a.fetch(&[]);
    assert_eq!(err, INVALID_SHARE_SESSION_EPOCH);
    a.session_epoch -= 5;
    // Now a's own acknowledgement goes through.
    let (_, errors) = a.acknowledge(&[(p, o, ACCEPT)]);
    assert_eq!(errors[&p], 0);
    assert_eq!(sqs_count(b.http, &url), (0, 0), "accepted: deleted");

    // A share request on a classic group (one with committed offsets) is refused.
    let mut c = Client::connect(b.kafka);
    let mut ct = CreateTopicsRequest::default();
    let mut topic = create_topics_request::CreatableTopic::default();
    topic.name = TopicName(s("plain"));
    topic.num_partitions = 1;
    topic.replication_factor = 1;
    ct.topics = vec![topic];
    let _: CreateTopicsResponse = c.call(ApiKey::CreateTopics, 7, &ct);
    let mut commit = OffsetCommitRequest::default();
    commit.group_id = GroupId(s("classic"));
    commit.generation_id_or_member_epoch = -1;
    let mut t = offset_commit_request::OffsetCommitRequestTopic::default();
    t.name = TopicName(s("plain"));
    let mut pc = offset_commit_request::OffsetCommitRequestPartition::default();
    pc.partition_index = 0;
    pc.committed_offset = 0;
    t.partitions = vec![pc];
    commit.topics = vec![t];
    let r: OffsetCommitResponse = c.call(ApiKey::OffsetCommit, 9, &commit);
    assert_eq!(r.topics[0].partitions[0].error_code, 0);
    let mut h = ShareGroupHeartbeatRequest::default();
    h.group_id = GroupId(s("classic"));
    h.member_id = s("intruder");
    h.subscribed_topic_names = Some(vec![TopicName(s("queue:bad"))]);
    let r: ShareGroupHeartbeatResponse = c.call(ApiKey::ShareGroupHeartbeat, 1, &h);
    assert_eq!(r.error_code, GROUP_ID_NOT_FOUND, "{:?}", r.error_message);
    let mut f = ShareFetchRequest::default();
    f.group_id = Some(GroupId(s("classic")));
    f.member_id = Some(s("intruder"));
    let r: ShareFetchResponse = c.call(ApiKey::ShareFetch, 1, &f);
    assert_eq!(r.error_code, GROUP_ID_NOT_FOUND, "{:?}", r.error_message);
    // ... and the classic group is as it was: described, not turned into a share group.
    let mut d = DescribeGroupsRequest::default();
    d.groups = vec![GroupId(s("classic"))];
    let r: DescribeGroupsResponse = c.call(ApiKey::DescribeGroups, 5, &d);
    assert_eq!(r.groups[0].error_code, 0);
    let mut sd = ShareGroupDescribeRequest::default();
    sd.group_ids = vec![GroupId(s("classic")), GroupId(s("g"))];
    let r: ShareGroupDescribeResponse = c.call(ApiKey::ShareGroupDescribe, 1, &sd);
    assert_eq!(r.groups[0].error_code, GROUP_ID_NOT_FOUND);
    assert_eq!(r.groups[1].error_code, 0);
    assert_eq!(r.groups[1].members.len(), 2);
    // A fetch by a member that never joined.
    let mut f = ShareFetchRequest::default();
    f.group_id = Some(GroupId(s("g")));
    f.member_id = Some(s("stranger"));
    let r: ShareFetchResponse = c.call(ApiKey::ShareFetch, 1, &f);
    assert_eq!(r.error_code, UNKNOWN_MEMBER_ID);

    // The group's lock: 1 s. a takes the record and sits on it; after the lock, b gets it
    // (delivery 2) and a's acknowledgement is refused, b's goes through.
    assert_eq!(
        configure_group(&mut c, "g", &[("share.record.lock.duration.ms", "1000")]),
        0
    );
    assert_ne!(
        configure_group(&mut c, "g", &[("share.record.lock.duration.ms", "5")]),
        0
    );
    send_all(b.http, &url, &["x2".to_string()]);
    let (_, _, got) = a.fetch(&[]);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].3, 1);
    let (_, _, none) = other.fetch(&[]);
    assert!(none.is_empty(), "held by a");
    std::thread::sleep(Duration::from_millis(2_100));
    let (_, _, again) = other.fetch(&[]);
    assert_eq!(again.len(), 1, "the lock ended: b gets it");
    assert_eq!((again[0].1, again[0].3), (got[0].1, 2));
    let (_, errors) = a.acknowledge(&[(got[0].0, got[0].1, ACCEPT)]);
    assert_eq!(errors[&got[0].0], INVALID_RECORD_STATE, "a's lock ended");
    assert_eq!(sqs_count(b.http, &url), (0, 1), "b still holds it");
    // The delivery limit: 2. b releases it (delivery 2 of 2): not handed out again, in the DLQ.
    assert_eq!(
        configure_group(&mut c, "g", &[("share.delivery.count.limit", "2")]),
        0
    );
    let (_, errors) = other.acknowledge(&[(again[0].0, again[0].1, RELEASE)]);
    assert_eq!(errors[&again[0].0], 0);
    let (_, _, none) = a.fetch(&[]);
    assert!(none.is_empty(), "past the delivery limit: {none:?}");
    assert_eq!(sqs_count(b.http, &url), (0, 0));
    assert_eq!(dlq_bodies(b.http, &dlq), BTreeSet::from(["x2".to_string()]));

    // Without a redrive policy a rejected record is dropped (Kafka: archived).
    let plain = queue_url(b.http, "nodlq", serde_json::json!({}));
    send_all(b.http, &plain, &["y".to_string()]);
    let mut m = Member::join(b.kafka, "g2", "member-m", "queue:nodlq");
    let (_, _, got) = m.fetch(&[]);
    assert_eq!(got.len(), 1);
    let (_, errors) = m.acknowledge(&[(got[0].0, got[0].1, REJECT)]);
    assert_eq!(errors[&got[0].0], 0);
    assert_eq!(sqs_count(b.http, &plain), (0, 0));

    // Share groups are listed with their type; a group with members is not deleted.
    let mut lg = ListGroupsRequest::default();
    lg.types_filter = vec![s("share")];
    let r: ListGroupsResponse = c.call(ApiKey::ListGroups, 5, &lg);
    let names: BTreeSet<String> = r.groups.iter().map(|g| g.group_id.0.to_string()).collect();
    assert_eq!(names, BTreeSet::from(["g".to_string(), "g2".to_string()]));
    assert!(r.groups.iter().all(|g| g.group_type.as_str() == "share"));
    let mut dg = DeleteGroupsRequest::default();
    dg.groups_names = vec![GroupId(s("g2"))];
    let r: DeleteGroupsResponse = c.call(ApiKey::DeleteGroups, 2, &dg);
    assert_eq!(r.results[0].error_code, NON_EMPTY_GROUP);
    // A member that leaves gives back what it held at once: SQS receives it right away.
    send_all(b.http, &plain, &["y2".to_string()]);
    let (_, _, got) = m.fetch(&[]);
    assert_eq!(got.len(), 1);
    assert!(sqs_receive(b.http, &plain, 1).is_empty(), "held by m");
    m.epoch = -1;
    assert_eq!(m.heartbeat(), 0);
    let back = sqs_receive(b.http, &plain, 1);
    assert_eq!(back.len(), 1, "released when m left");
    assert_eq!((back[0].0.as_str(), back[0].2), ("y2", 2));
    let r: DeleteGroupsResponse = c.call(ApiKey::DeleteGroups, 2, &dg);
    assert_eq!(r.results[0].error_code, 0, "empty: deleted");
}
