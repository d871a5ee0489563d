//! Kafka transactions over real sockets, with requests crafted by the `kafka-protocol` crate:
//! a transactional producer's committed records are read under read_committed and its aborted
//! and open ones never are (read_uncommitted sees them all); the aborted-transactions index and
//! the last stable offset in Fetch answers; a new producer of the same transactional id fences
//! the old one (its batches and EndTxn refused with INVALID_PRODUCER_EPOCH, nothing changed);
//! an open transaction survives a restart and commits after it; a transaction past its
//! `transaction.timeout.ms` is aborted by the broker.
// A test is the broker's outside world: it times the broker with its own clocks (deadlines,
// waits). broker/clippy.toml's clock seam governs the broker's code, not this.
#![allow(clippy::disallowed_methods)]

use bytes::{Buf, Bytes, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use kafka_protocol::records::{
    Compression, Record as KRecord, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions,
    TimestampType,
};
use sluice_broker::config::BrokerConfig;
use sluice_broker::server::{self, BrokerHandle};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

/// Every socket read gives up after this: a hang is a failure, not a stall.
const READ_TIMEOUT: Duration = Duration::from_secs(20);
const INVALID_PRODUCER_EPOCH: i16 = 47;
const KEY: (&str, &str, &str) = ("AKIDTXN", "secret-txn", "111111111111");
const TOPIC: &str = "txn-topic";
/// Long enough never to expire in the test but for the one meant to.
const TXN_TIMEOUT_MS: i32 = 120_000;
const SHORT_TXN_TIMEOUT_MS: i32 = 300;
const READ_COMMITTED: i8 = 1;
const READ_UNCOMMITTED: i8 = 0;

fn start(dir: &Path) -> (BrokerHandle, SocketAddr) {
    let mut c = BrokerConfig::ephemeral(dir.to_path_buf()).expect("config");
    c.shards = 2;
    c.default_partitions = 1;
    c.kafka_addr = Some("127.0.0.1:0".parse().expect("addr"));
    c.auth = sluice_broker::auth::AuthConfig {
        mode: sluice_broker::auth::AuthMode::SigV4,
        keys: sluice_broker::auth::parse_keys(&format!("{}:{}:{}", KEY.0, KEY.1, KEY.2))
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
    fn login(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(READ_TIMEOUT))
            .expect("timeout");
        let mut c = Client {
            stream,
            correlation: 0,
        };
        let mut h = SaslHandshakeRequest::default();
        h.mechanism = s("PLAIN");
        let r: SaslHandshakeResponse = c.call(ApiKey::SaslHandshake, 1, &h);
        assert_eq!(r.error_code, 0);
        let mut a = SaslAuthenticateRequest::default();
        a.auth_bytes = Bytes::from(format!("\0{}\0{}", KEY.0, KEY.1));
        let r: SaslAuthenticateResponse = c.call(ApiKey::SaslAuthenticate, 2, &a);
        assert_eq!(r.error_code, 0, "{:?}", r.error_message);
        c
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
        header.client_id = Some(s("kafka-txn-test"));
        let mut buf = BytesMut::new();
        header
            .encode(&mut buf, api.request_header_version(version))
            .expect("header");
        req.encode(&mut buf, version).expect("request");
        let mut frame = Vec::with_capacity(buf.len() + 4);
        frame.extend_from_slice(&(buf.len() as i32).to_be_bytes());
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
        assert_eq!(answer.remaining(), 0);
        r
    }

    fn create_topic(&mut self, name: &str) {
        let mut t = create_topics_request::CreatableTopic::default();
        t.name = TopicName(s(name));
        t.num_partitions = 1;
        t.replication_factor = 1;
        let mut r = CreateTopicsRequest::default();
        r.topics = vec![t];
        let resp: CreateTopicsResponse = self.call(ApiKey::CreateTopics, 7, &r);
        assert_eq!(resp.topics[0].error_code, 0);
    }

    fn init(&mut self, txn_id: &str, timeout_ms: i32) -> Producer {
        let mut r = InitProducerIdRequest::default();
        r.transactional_id = Some(TransactionalId(s(txn_id)));
        r.transaction_timeout_ms = timeout_ms;
        r.producer_id = (-1).into();
        r.producer_epoch = -1;
        let resp: InitProducerIdResponse = self.call(ApiKey::InitProducerId, 4, &r);
        assert_eq!(resp.error_code, 0, "InitProducerId");
        Producer {
            txn_id: txn_id.to_string(),
            id: resp.producer_id.0,
            epoch: resp.producer_epoch,
            sequence: 0,
        }
    }

    fn add_partition(&mut self, p: &Producer) -> i16 {
        let mut t = add_partitions_to_txn_request::AddPartitionsToTxnTopic::default();
        t.name = TopicName(s(TOPIC));
        t.partitions = vec![0];
        let mut r = AddPartitionsToTxnRequest::default();
        r.v3_and_below_transactional_id = TransactionalId(s(&p.txn_id));
        r.v3_and_below_producer_id = p.id.into();
        r.v3_and_below_producer_epoch = p.epoch;
        r.v3_and_below_topics = vec![t];
        let resp: AddPartitionsToTxnResponse = self.call(ApiKey::AddPartitionsToTxn, 3, &r);
        resp.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code
    }

    /// Produces `values` in one transactional batch; returns the partition's error code.
    fn produce(&mut self, p: &mut Producer, values: &[&str]) -> i16 {
        let records: Vec<KRecord> = values
            .iter()
            .enumerate()
            .map(|(i, v)| KRecord {
                transactional: true,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 0,
                producer_id: p.id,
                producer_epoch: p.epoch,
                timestamp_type: TimestampType::Creation,
                offset: i as i64,
                sequence: p.sequence + i as i32,
                timestamp: 1_700_000_000_000,
                key: None,
                value: Some(Bytes::from(v.to_string())),
                headers: Default::default(),
            })
            .collect();
        let mut batch = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut batch,
            records.iter(),
            &RecordEncodeOptions {
                version: 2,
                compression: Compression::None,
            },
        )
        .expect("encode");
        let mut pd = produce_request::PartitionProduceData::default();
        pd.index = 0;
        pd.records = Some(batch.freeze());
        let mut td = produce_request::TopicProduceData::default();
        td.name = TopicName(s(TOPIC));
        td.partition_data = vec![pd];
        let mut r = ProduceRequest::default();
        r.transactional_id = Some(TransactionalId(s(&p.txn_id)));
        r.acks = -1;
        r.timeout_ms = 10_000;
        r.topic_data = vec![td];
        let resp: ProduceResponse = self.call(ApiKey::Produce, 9, &r);
        let code = resp.responses[0].partition_responses[0].error_code;
        if code == 0 {
            p.sequence += values.len() as i32;
        }
        code
    }

    fn end(&mut self, p: &Producer, commit: bool) -> i16 {
        let mut r = EndTxnRequest::default();
        r.transactional_id = TransactionalId(s(&p.txn_id));
        r.producer_id = p.id.into();
        r.producer_epoch = p.epoch;
        r.committed = commit;
        let resp: EndTxnResponse = self.call(ApiKey::EndTxn, 3, &r);
        resp.error_code
    }

    fn fetch(&mut self, isolation: i8) -> Fetched {
        let mut fp = fetch_request::FetchPartition::default();
        fp.partition = 0;
        fp.fetch_offset = 0;
        fp.partition_max_bytes = 1 << 20;
        fp.current_leader_epoch = -1;
        fp.log_start_offset = -1;
        let mut ft = fetch_request::FetchTopic::default();
        ft.topic = TopicName(s(TOPIC));
        ft.partitions = vec![fp];
        let mut r = FetchRequest::default();
        r.replica_id = (-1).into();
        r.max_wait_ms = 0;
        r.min_bytes = 0;
        r.max_bytes = 1 << 20;
        r.isolation_level = isolation;
        r.topics = vec![ft];
        let resp: FetchResponse = self.call(ApiKey::Fetch, 11, &r);
        let d = &resp.responses[0].partitions[0];
        assert_eq!(d.error_code, 0, "fetch");
        let mut values = Vec::new();
        let mut markers = Vec::new();
        if let Some(mut bytes) = d.records.clone() {
            for set in RecordBatchDecoder::decode_all(&mut bytes).expect("batches") {
                for r in set.records {
                    if r.control {
                        let key = r.key.expect("a control record has a key");
                        markers.push((r.producer_id, key[3] == 1));
                    } else {
                        let v = r.value.expect("value");
                        values.push(String::from_utf8(v.to_vec()).expect("utf-8"));
                    }
                }
            }
        }
        Fetched {
            values,
            markers,
            high_watermark: d.high_watermark,
            last_stable: d.last_stable_offset,
            aborted: d
                .aborted_transactions
                .iter()
                .flatten()
                .map(|a| (a.producer_id.0, a.first_offset))
                .collect(),
        }
    }
}

struct Producer {
    txn_id: String,
    id: i64,
    epoch: i16,
    sequence: i32,
}

#[derive(Debug)]
struct Fetched {
    values: Vec<String>,
    /// (producer id, commit) of each marker.
    markers: Vec<(i64, bool)>,
    high_watermark: i64,
    last_stable: i64,
    aborted: Vec<(i64, i64)>,
}

fn committed(c: &mut Client) -> Vec<String> {
    c.fetch(READ_COMMITTED).values
}

#[test]
fn read_committed_sees_committed_records_only_across_fencing_timeouts_and_a_restart() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (b, addr) = start(tmp.path());
    let mut c = Client::login(addr);
    c.create_topic(TOPIC);

    // An open transaction: invisible under read_committed, the LSO held at its start.
    let mut p = c.init("tx-a", TXN_TIMEOUT_MS);
    assert_eq!(c.add_partition(&p), 0);
    assert_eq!(c.produce(&mut p, &["a1", "a2"]), 0);
    let f = c.fetch(READ_COMMITTED);
    assert!(
        f.values.is_empty(),
        "open records under read_committed: {f:?}"
    );
    assert_eq!(f.last_stable, 0, "{f:?}");
    assert!(f.high_watermark >= 2);
    let u = c.fetch(READ_UNCOMMITTED);
    assert_eq!(u.values, ["a1", "a2"], "read_uncommitted sees open records");

    // Aborted: never read committed; the index names it; the LSO moves to the end.
    assert_eq!(c.end(&p, false), 0);
    let f = c.fetch(READ_COMMITTED);
    assert!(
        f.values.is_empty(),
        "aborted records under read_committed: {f:?}"
    );
    assert_eq!(f.aborted, vec![(p.id, 0)], "{f:?}");
    assert_eq!(f.markers, vec![(p.id, false)]);
    assert_eq!(f.last_stable, f.high_watermark);

    // Committed: read.
    assert_eq!(c.add_partition(&p), 0);
    assert_eq!(c.produce(&mut p, &["c1"]), 0);
    assert_eq!(c.end(&p, true), 0);
    assert_eq!(committed(&mut c), ["c1"]);

    // A zombie: its transaction is open when a new producer of the id starts. The new one
    // aborts it in a later epoch; the zombie's batches and EndTxn are refused, nothing changes.
    let mut zombie = c.init("tx-z", TXN_TIMEOUT_MS);
    assert_eq!(c.add_partition(&zombie), 0);
    assert_eq!(c.produce(&mut zombie, &["z1"]), 0);
    let mut fresh = c.init("tx-z", TXN_TIMEOUT_MS);
    assert_eq!(fresh.id, zombie.id);
    assert!(fresh.epoch > zombie.epoch);
    let before = c.fetch(READ_UNCOMMITTED);
    assert_eq!(c.produce(&mut zombie, &["z2"]), INVALID_PRODUCER_EPOCH);
    assert_eq!(
        c.end(&zombie, true),
        INVALID_PRODUCER_EPOCH,
        "EndTxn, fenced"
    );
    assert_eq!(c.add_partition(&zombie), INVALID_PRODUCER_EPOCH);
    let after = c.fetch(READ_UNCOMMITTED);
    assert_eq!(
        (before.high_watermark, &before.values),
        (after.high_watermark, &after.values),
        "a fenced producer changed the partition"
    );
    assert_eq!(committed(&mut c), ["c1"]);
    assert_eq!(c.add_partition(&fresh), 0);
    assert_eq!(c.produce(&mut fresh, &["f1"]), 0);
    assert_eq!(c.end(&fresh, true), 0);
    assert_eq!(committed(&mut c), ["c1", "f1"]);

    // Open across a restart: still hidden after it, and committed after it.
    assert_eq!(c.add_partition(&fresh), 0);
    assert_eq!(c.produce(&mut fresh, &["r1"]), 0);
    let open_at = c.fetch(READ_COMMITTED).last_stable;
    drop(c);
    b.shutdown();
    let (b, addr) = start(tmp.path());
    let mut c = Client::login(addr);
    let f = c.fetch(READ_COMMITTED);
    assert_eq!(f.values, ["c1", "f1"], "after the restart: {f:?}");
    assert_eq!(
        f.last_stable, open_at,
        "the open transaction's LSO after a restart"
    );
    assert_eq!(f.aborted.len(), 2, "both aborted transactions: {f:?}");
    assert_eq!(c.end(&fresh, true), 0, "commit after the restart");
    assert_eq!(committed(&mut c), ["c1", "f1", "r1"]);

    // A hung producer: the broker aborts its transaction at its timeout and fences it.
    let mut hung = c.init("tx-hung", SHORT_TXN_TIMEOUT_MS);
    assert_eq!(c.add_partition(&hung), 0);
    assert_eq!(c.produce(&mut hung, &["h1"]), 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let f = c.fetch(READ_COMMITTED);
        if f.markers.contains(&(hung.id, false)) {
            assert_eq!(f.last_stable, f.high_watermark, "{f:?}");
            assert!(f.aborted.iter().any(|(pid, _)| *pid == hung.id), "{f:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the timed-out transaction was not aborted"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(c.end(&hung, true), INVALID_PRODUCER_EPOCH);
    assert_eq!(committed(&mut c), ["c1", "f1", "r1"]);
    drop(c);
    b.shutdown();
}
