//! Streams through the SDK against an in-process broker over real QUIC on loopback: a keyed
//! batching producer, two group consumers sharing a topic with commit after processing, a
//! second group (fan-out), manual commit and seek, and typed errors.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_broker::config::BrokerConfig;
use sluice_sdk::stream::partition_for_key;
use sluice_sdk::types::*;
use sluice_sdk::{
    Client, ClientOptions, ErrorCode, GroupConsumer, GroupConsumerOptions, ReceiveOptions, Seek,
    Trust,
};

const TEST_TIMEOUT: Duration = Duration::from_secs(60);

/// (partition, offset, value) of every record a group processed.
type Seen = Arc<Mutex<Vec<(u32, u64, Vec<u8>)>>>;

fn options() -> GroupConsumerOptions {
    GroupConsumerOptions {
        session_timeout: Duration::from_millis(1500),
        max_records: 50,
        max_bytes: 64 * 1024,
        poll_wait: Duration::from_millis(20),
        ..GroupConsumerOptions::default()
    }
}

/// An in-process broker with two shards for one test (`partitions`: of a new queue; default
/// one per shard), and a bounded way to run a client against it.
struct TestBroker {
    handle: sluice_broker::server::BrokerHandle,
    dir: tempfile::TempDir,
    _one_at_a_time: std::sync::MutexGuard<'static, ()>,
}

/// One broker at a time in this test binary: glommio locks 1 MiB of memory per executor and
/// the memlock limit here is 8 MiB, so five two-shard brokers at once cannot all start.
static BROKERS: Mutex<()> = Mutex::new(());

fn one_broker_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    BROKERS.lock().unwrap_or_else(|e| e.into_inner())
}

impl TestBroker {
    fn start(partitions: Option<u32>) -> TestBroker {
        let one_at_a_time = one_broker_at_a_time();
        let dir = tempfile::tempdir().expect("temp dir");
        let mut c = BrokerConfig::ephemeral(dir.path().to_path_buf()).expect("config");
        c.shards = 2;
        c.default_partitions = partitions.unwrap_or(2);
        c.http_addr = "127.0.0.1:0".parse().expect("addr");
        c.quic_addr = "127.0.0.1:0".parse().expect("addr");
        c.metrics_addr = "127.0.0.1:0".parse().expect("addr");
        c.kafka_addr = None;
        let handle = sluice_broker::server::start(c).expect("start");
        handle.wait_ready().expect("ready");
        TestBroker {
            handle,
            dir,
            _one_at_a_time: one_at_a_time,
        }
    }

    /// Runs `body` with a connected client on a two-thread runtime, within [`TEST_TIMEOUT`].
    fn run<T, Fut: std::future::Future<Output = T>>(&self, body: impl FnOnce(Client) -> Fut) -> T {
        let addr = self.handle.quic_addr();
        let trust = Trust::PemFile(self.dir.path().join("quic-selfsigned-cert.pem"));
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(async move {
                tokio::time::timeout(TEST_TIMEOUT, async move {
                    let client = Client::connect(addr, ClientOptions::new(trust))
                        .await
                        .expect("connect");
                    body(client).await
                })
                .await
                .expect("test finished in time")
            })
    }

    fn shutdown(self) {
        self.handle.shutdown();
    }
}

#[test]
fn producer_and_group_consumers_over_quic() {
    let _one = one_broker_at_a_time();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut c = BrokerConfig::ephemeral(dir.path().to_path_buf()).expect("config");
    c.shards = 2;
    c.http_addr = "127.0.0.1:0".parse().expect("addr");
    c.quic_addr = "127.0.0.1:0".parse().expect("addr");
    c.metrics_addr = "127.0.0.1:0".parse().expect("addr");
    c.kafka_addr = None;
    let handle = sluice_broker::server::start(c).expect("start");
    handle.wait_ready().expect("ready");
    let addr = handle.quic_addr();
    let cert = dir.path().join("quic-selfsigned-cert.pem");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        tokio::time::timeout(TEST_TIMEOUT, async move {
            let client = Client::connect(addr, ClientOptions::new(Trust::PemFile(cert)))
                .await
                .expect("connect");
            let t = client
                .create_topic(CreateTopicRequest {
                    name: "events".into(),
                    partitions: 3,
                    ..Default::default()
                })
                .await
                .expect("create");
            assert_eq!(t.partitions, 3);
            // Typed errors.
            let e = client.describe_topic("nope").await.expect_err("no topic");
            assert_eq!(e.code(), Some(ErrorCode::UnknownTopic));
            let e = client
                .produce_batch("events", Some(0), b"garbage".to_vec())
                .await
                .expect_err("bad batch");
            assert_eq!(e.code(), Some(ErrorCode::InvalidBatch));
            let e = client
                .fetch("events", 0, 999, 1024, 10, Duration::ZERO)
                .await
                .expect_err("past the end");
            assert_eq!(e.code(), Some(ErrorCode::OffsetOutOfRange));

            // Two members of group "a" share the partitions; commit after processing.
            const N: usize = 300;
            let seen_a: Seen = Arc::default();
            let stop = Arc::new(AtomicBool::new(false));
            let mut members = Vec::new();
            for _ in 0..2 {
                let (client, seen, stop) = (client.clone(), seen_a.clone(), stop.clone());
                members.push(tokio::spawn(async move {
                    let mut m = GroupConsumer::join(&client, "a", &["events"], options())
                        .await
                        .expect("join");
                    m.run(
                        |r| {
                            seen.lock().expect("seen").push((
                                r.partition,
                                r.offset,
                                r.value.to_vec(),
                            ))
                        },
                        || stop.load(Ordering::SeqCst),
                    )
                    .await
                    .expect("run");
                    m.close().await.expect("leave");
                }));
            }
            // Let both join (and the rebalance settle) before producing.
            tokio::time::sleep(Duration::from_millis(800)).await;

            let mut p = client.topic_producer("events").await.expect("producer");
            for i in 0..N {
                let key = format!("user-{}", i % 7);
                p.send(Some(key.as_bytes()), format!("{key}:{i}").as_bytes())
                    .await
                    .expect("send");
                if i % 50 == 49 {
                    p.flush().await.expect("flush");
                }
            }
            p.flush().await.expect("flush");

            // Each key's records are in one partition, in send order.
            for k in 0..7 {
                let key = format!("user-{k}");
                let part = partition_for_key(key.as_bytes(), 3);
                let (recs, _) = client
                    .fetch("events", part, 0, 1 << 20, 10_000, Duration::ZERO)
                    .await
                    .expect("fetch");
                let mine: Vec<usize> = recs
                    .iter()
                    .filter(|r| r.key.as_deref() == Some(key.as_bytes()))
                    .map(|r| {
                        let v = String::from_utf8(r.value.to_vec()).expect("utf8");
                        v.rsplit(':').next().expect("n").parse().expect("n")
                    })
                    .collect();
                let expected: Vec<usize> = (0..N).filter(|i| i % 7 == k).collect();
                assert_eq!(mine, expected, "{key} in order");
            }

            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            loop {
                let distinct: BTreeSet<(u32, u64)> = seen_a
                    .lock()
                    .expect("seen")
                    .iter()
                    .map(|(p, o, _)| (*p, *o))
                    .collect();
                if distinct.len() >= N {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "group a read {}",
                    distinct.len()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            stop.store(true, Ordering::SeqCst);
            for m in members {
                m.await.expect("member");
            }
            // Per partition, the group saw the offsets in order.
            let mut by_p: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
            for (p, o, _) in seen_a.lock().expect("seen").iter() {
                by_p.entry(*p).or_default().push(*o);
            }
            for offsets in by_p.values() {
                let mut sorted = offsets.clone();
                sorted.dedup();
                assert!(
                    sorted.windows(2).all(|w| w[0] < w[1]),
                    "in order: {offsets:?}"
                );
            }
            let committed = client.fetch_committed("a").await.expect("committed");
            let total: u64 = committed.values().sum();
            assert_eq!(total, N as u64, "everything committed: {committed:?}");
            let lag = client.group_lag("a").await.expect("lag");
            assert_eq!(lag.len(), 3);
            assert!(lag.iter().all(|l| l.lag == 0), "{lag:?}");
            let mut p2 = client.topic_producer("events").await.expect("producer");
            for i in 0..5 {
                p2.send(None, format!("extra {i}").as_bytes())
                    .await
                    .expect("send");
            }
            p2.flush().await.expect("flush");
            let lag = client.group_lag("a").await.expect("lag");
            assert_eq!(lag.iter().map(|l| l.lag).sum::<u64>(), 5, "{lag:?}");

            // Group "b" (fan-out): a single member with manual commit and seek.
            let mut b = GroupConsumer::join(&client, "b", &["events"], options())
                .await
                .expect("join b");
            assert_eq!(b.assignment().len(), 3);
            let mut got = 0;
            while got < N + 5 {
                got += b.poll().await.expect("poll").len();
            }
            assert_eq!(got, N + 5, "group b sees every record once too");
            b.commit().await.expect("commit");
            // Seek back by timestamp on partition 0 and read it again.
            let first = client
                .list_offset("events", 0, Seek::Timestamp(0))
                .await
                .expect("seek");
            assert_eq!(first, 0);
            b.seek("events", 0, first);
            let again = b.poll().await.expect("poll");
            assert!(again.iter().any(|r| r.partition == 0 && r.offset == 0));
            b.close().await.expect("leave");
            client.delete_topic("events").await.expect("delete");
            let e = client.describe_topic("events").await.expect_err("deleted");
            assert_eq!(e.code(), Some(ErrorCode::UnknownTopic));
        })
        .await
        .expect("test finished in time");
    });
    handle.shutdown();
}

/// A queue read as a stream over the wire (`queue:<name>`): every message in send order with
/// its message id, continuing past the queue's own state changes, read by a group too, and
/// the queue's consumers unaffected (no lease taken, nothing deleted).
#[test]
fn a_queue_is_read_as_a_stream_without_disturbing_its_consumers() {
    const N: usize = 40;
    let broker = TestBroker::start(Some(1));
    broker.run(|client| async move {
        let q = client.create_queue("orders").await.expect("create");
        let mut ids = Vec::new();
        for i in 0..N {
            let sent = client.send(&q, &format!("m{i}")).await.expect("send");
            ids.push(sent.message_id);
            if i % 4 == 3 {
                // Queue consumers at work: receives and deletes are log records too.
                let got = client
                    .receive(&q, sluice_sdk::ReceiveOptions::long_poll(2, 0))
                    .await
                    .expect("receive");
                for m in got {
                    client.delete(&q, &m.receipt_handle).await.expect("delete");
                }
            }
        }
        let visible_before = client
            .get_queue_attributes(&q, &["ApproximateNumberOfMessages"])
            .await
            .expect("attributes");

        // Offsets: the earliest is 0, the latest past every record.
        let topic = "queue:orders";
        let earliest = client
            .list_offset(topic, 0, Seek::Earliest)
            .await
            .expect("earliest");
        let latest = client
            .list_offset(topic, 0, Seek::Latest)
            .await
            .expect("latest");
        assert_eq!(earliest, 0);
        assert!(latest >= N as u64, "{latest}");

        // Page through with small pages: all N in send order, ids in the headers.
        let mut at = earliest;
        let mut bodies = Vec::new();
        let mut seen_ids = Vec::new();
        loop {
            let f = client
                .fetch_records(topic, 0, at, 1 << 20, 7, Duration::from_millis(50))
                .await
                .expect("fetch");
            assert!(f.next_offset >= at, "moves forward");
            for r in &f.records {
                bodies.push(String::from_utf8(r.value.to_vec()).expect("utf-8"));
                let id = r
                    .headers
                    .iter()
                    .find(|(k, _)| k.as_slice() == b"message-id")
                    .map(|(_, v)| String::from_utf8(v.clone()).expect("utf-8"))
                    .expect("message-id header");
                seen_ids.push(id);
            }
            if f.records.is_empty() {
                assert_eq!(f.next_offset, f.end_offset, "an empty page ends at the end");
                break;
            }
            at = f.next_offset;
        }
        let want: Vec<String> = (0..N).map(|i| format!("m{i}")).collect();
        assert_eq!(bodies, want);
        assert_eq!(seen_ids, ids);

        // A consumer group over the queue sees every message once, commits, lag 0.
        let mut g = GroupConsumer::join(&client, "audit", &[topic], options())
            .await
            .expect("join");
        let mut got = Vec::new();
        for _ in 0..200 {
            got.extend(g.poll().await.expect("poll"));
            if got.len() >= N {
                break;
            }
        }
        assert_eq!(got.len(), N);
        g.commit().await.expect("commit");
        let lag = client.group_lag("audit").await.expect("lag");
        assert!(lag.iter().all(|l| l.lag == 0), "{lag:?}");
        g.close().await.expect("close");

        // The queue's consumers see the same queue as before: reading took no lease.
        let visible_after = client
            .get_queue_attributes(&q, &["ApproximateNumberOfMessages"])
            .await
            .expect("attributes");
        assert_eq!(visible_before, visible_after);

        // An unknown queue is a typed error.
        let e = client
            .fetch_records("queue:nope", 0, 0, 1024, 1, Duration::ZERO)
            .await
            .expect_err("unknown queue");
        assert_eq!(e.code(), Some(ErrorCode::QueueDoesNotExist), "{e:?}");
    });
    broker.shutdown();
}

/// The lingering publisher: concurrent single sends are batched per partition, each answered
/// with its own offset; a lone record still goes after the linger time; order per key holds.
#[test]
fn topic_publisher_batches_with_linger_and_answers_each_record() {
    const N: usize = 300;
    let broker = TestBroker::start(None);
    broker.run(|client| async move {
        client
            .create_topic(CreateTopicRequest {
                name: "clicks".into(),
                partitions: 3,
                ..Default::default()
            })
            .await
            .expect("create");
        let publisher = client
            .topic_publisher(
                "clicks",
                sluice_sdk::TopicPublisherOptions {
                    linger: Duration::from_millis(20),
                    ..Default::default()
                },
            )
            .await
            .expect("publisher");
        // A lone record goes after its linger, without a flush.
        let lone = publisher
            .send(Some(b"k0".to_vec()), b"lone".to_vec())
            .await
            .expect("lone record");
        assert_eq!(lone.partition, partition_for_key(b"k0", 3));
        // Many at once: queued in order, each answered with a distinct (partition, offset).
        let mut acks = Vec::new();
        for i in 0..N {
            let key = format!("k{}", i % 5).into_bytes();
            acks.push(
                publisher
                    .enqueue(Some(key), format!("v{i}").into_bytes())
                    .await
                    .expect("queued"),
            );
        }
        let landed: Vec<_> = futures::future::join_all(acks)
            .await
            .into_iter()
            .map(|r| r.expect("published"))
            .collect();
        let distinct: BTreeSet<_> = landed.iter().map(|p| (p.partition, p.offset)).collect();
        assert_eq!(distinct.len(), N);
        // Read back: every record where its answer said, and per key in send order.
        let mut by_offset = BTreeMap::new();
        for p in 0..3 {
            let (recs, _) = client
                .fetch("clicks", p, 0, 4 << 20, 10_000, Duration::ZERO)
                .await
                .expect("fetch");
            for r in recs {
                by_offset.insert((p, r.offset), r.value);
            }
        }
        for (i, at) in landed.iter().enumerate() {
            assert_eq!(
                by_offset.get(&(at.partition, at.offset)).map(|v| &v[..]),
                Some(format!("v{i}").as_bytes()),
                "record {i}"
            );
        }
        for k in 0..5 {
            let offsets: Vec<u64> = landed
                .iter()
                .enumerate()
                .filter(|(i, _)| i % 5 == k)
                .map(|(_, p)| p.offset)
                .collect();
            assert!(offsets.windows(2).all(|w| w[0] < w[1]), "key k{k} in order");
        }
        // Too large a record is refused before it is queued.
        let e = publisher
            .send(None, vec![0; 1 << 20])
            .await
            .expect_err("too large");
        assert_eq!(e.code(), Some(ErrorCode::InvalidParameterValue));
    });
    broker.shutdown();
}

/// Routing to the owning core: the broker gives each core its own endpoint and says which
/// core owns each partition; the SDK sends produce and fetch there, so every request is
/// counted on the owner's shard (none is forwarded), and with routing off they land wherever
/// the shared endpoint put the connection.
#[test]
fn produce_and_fetch_go_to_the_core_that_owns_the_partition() {
    let broker = TestBroker::start(None);
    let metrics = broker.handle.config.metrics_addr;
    assert_eq!(
        broker.handle.config.quic_shard_addrs.len(),
        2,
        "one endpoint per core"
    );
    let counted = |action: &str| requests_per_shard(metrics, action);
    let (routing, fifo_sends) = broker.run(|client| async move {
        client
            .create_topic(CreateTopicRequest {
                name: "routed".into(),
                partitions: 4,
                ..Default::default()
            })
            .await
            .expect("create");
        let routing = match client
            .call(Request::GetRouting(GetRoutingRequest {
                topic: "routed".into(),
            }))
            .await
            .expect("routing")
        {
            Response::GetRouting(r) => r,
            other => panic!("unexpected {other:?}"),
        };
        assert_eq!(routing.shard_addrs.len(), 2);
        assert_eq!(routing.partition_shards.len(), 4);
        // 5 produces and 3 fetches per partition, all routed.
        for p in 0..4 {
            for i in 0..5 {
                let batch = sluice_wire::batch::encode(&[sluice_wire::batch::Record::new(
                    i,
                    format!("p{p}-{i}").into_bytes(),
                )])
                .expect("batch");
                client
                    .produce_batch("routed", Some(p), batch)
                    .await
                    .expect("produce");
            }
            for _ in 0..3 {
                let (recs, _) = client
                    .fetch("routed", p, 0, 1 << 20, 100, Duration::ZERO)
                    .await
                    .expect("fetch");
                assert_eq!(recs.len(), 5);
            }
        }
        // FIFO sends go to the core owning their message group's partition.
        let attributes: AttributeMap =
            [("FifoQueue", "true"), ("ContentBasedDeduplication", "true")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        let q = client
            .create_queue_with("orders.fifo", attributes, Default::default())
            .await
            .expect("fifo queue");
        let fifo = match client
            .call(Request::GetRouting(GetRoutingRequest {
                topic: "queue:orders.fifo".into(),
            }))
            .await
            .expect("routing")
        {
            Response::GetRouting(r) => r,
            other => panic!("unexpected {other:?}"),
        };
        let mut sends_per_shard = vec![0u64; 2];
        for i in 0..12 {
            let group = format!("g{}", i % 6);
            let p = partition_for_key(group.as_bytes(), fifo.partition_shards.len() as u32);
            sends_per_shard[fifo.partition_shards[p as usize] as usize] += 1;
            client
                .send_message(SendMessageRequest {
                    queue_url: q.clone(),
                    message_body: format!("m{i}"),
                    message_group_id: Some(group),
                    ..Default::default()
                })
                .await
                .expect("fifo send");
        }
        client.close().await;
        (routing, sends_per_shard)
    });
    let owned = |shard: u32| {
        routing
            .partition_shards
            .iter()
            .filter(|s| **s == shard)
            .count() as u64
    };
    assert_eq!(counted("Produce"), vec![5 * owned(0), 5 * owned(1)]);
    assert_eq!(counted("Fetch"), vec![3 * owned(0), 3 * owned(1)]);
    assert_eq!(counted("SendMessage"), fifo_sends);
    broker.shutdown();
}

/// Native requests of `action` counted per shard (of two), from the broker's /metrics.
fn requests_per_shard(metrics: std::net::SocketAddr, action: &str) -> Vec<u64> {
    let body = common::scrape_metrics(metrics);
    (0..2)
        .map(|shard| {
            body.lines()
                .find(|l| {
                    l.starts_with("sluice_requests_total{")
                        && l.contains(&format!("shard=\"{shard}\""))
                        && l.contains("frontend=\"native\"")
                        && l.contains(&format!("action=\"{action}\""))
                })
                .and_then(|l| l.rsplit(' ').next())
                .map_or(0, |v| v.parse().expect("a count"))
        })
        .collect()
}

/// Standard-queue work spreads over the cores by client: each client has a home core, handed
/// out round-robin, and sends, receives and deletes there — not wherever the kernel's hash
/// of its connection to the shared endpoint put it (4 connections land on one core of two
/// one time in 8). Four clients, two per core: their sends are counted two clients' worth on
/// each shard, and each client's receives and deletes on its own home core.
#[test]
fn clients_spread_standard_queue_work_over_the_cores() {
    let broker = TestBroker::start(None);
    let metrics = broker.handle.config.metrics_addr;
    let addr = broker.handle.quic_addr();
    let cert = broker.dir.path().join("quic-selfsigned-cert.pem");
    broker.run(|admin| async move {
        let q = admin.create_queue("spread").await.expect("create");
        let before = |action| requests_per_shard(metrics, action);
        let (sends0, receives0) = (before("SendMessageBatch"), before("ReceiveMessage"));
        let mut clients = Vec::new();
        for c in 0..4 {
            let client = Client::connect(addr, ClientOptions::new(Trust::PemFile(cert.clone())))
                .await
                .expect("connect");
            for b in 0..3 {
                let entries = (0..10)
                    .map(|i| SendMessageBatchRequestEntry {
                        id: i.to_string(),
                        message_body: format!("c{c}-b{b}-m{i}"),
                        ..Default::default()
                    })
                    .collect();
                let r = client.send_batch(&q, entries).await.expect("send");
                assert!(r.failed.is_empty(), "{r:?}");
            }
            clients.push(client);
        }
        let sends = requests_per_shard(metrics, "SendMessageBatch");
        assert_eq!(
            [sends[0] - sends0[0], sends[1] - sends0[1]],
            [6, 6],
            "12 batches from 4 clients, 2 clients per core"
        );
        // Each client drains, deleting what it took: a client's receives all count on one
        // shard, and the clients' on both.
        let mut seen = BTreeSet::new();
        let mut shards_used = BTreeSet::new();
        for client in &clients {
            let r0 = requests_per_shard(metrics, "ReceiveMessage");
            let mut got = 0;
            while got < 30 {
                let msgs = client
                    .receive(&q, ReceiveOptions::long_poll(10, 1))
                    .await
                    .expect("receive");
                if msgs.is_empty() {
                    break; // another core's partition holds the rest: a later client's
                }
                got += msgs.len();
                let handles: Vec<String> = msgs.iter().map(|m| m.receipt_handle.clone()).collect();
                for m in msgs {
                    assert!(seen.insert(m.body), "received once");
                }
                let d = client.delete_batch(&q, &handles).await.expect("delete");
                assert!(d.failed.is_empty(), "{d:?}");
            }
            let r1 = requests_per_shard(metrics, "ReceiveMessage");
            let on: Vec<usize> = (0..2).filter(|&s| r1[s] > r0[s]).collect();
            assert_eq!(
                on.len(),
                1,
                "one client's receives on one core: {r0:?} -> {r1:?}"
            );
            shards_used.insert(on[0]);
        }
        assert_eq!(seen.len(), 120, "every message received once");
        assert_eq!(shards_used.len(), 2, "the clients' receives on both cores");
        let receives = requests_per_shard(metrics, "ReceiveMessage");
        assert!(receives[0] > receives0[0] && receives[1] > receives0[1]);
        for c in clients {
            c.close().await;
        }
        admin.close().await;
    });
    broker.shutdown();
}

/// The operators' frames: list topics, list groups, describe a group (members and their
/// partitions), against an in-process broker over QUIC.
#[test]
fn operators_list_topics_and_groups_and_describe_a_group() {
    let broker = TestBroker::start(None);
    broker.run(|client| async move {
        assert!(client.list_topics().await.expect("list").is_empty());
        assert!(client.list_groups().await.expect("list").is_empty());
        for (name, partitions) in [("zeta", 1), ("alpha", 3)] {
            client
                .create_topic(CreateTopicRequest {
                    name: name.into(),
                    partitions,
                    retention_ms: Some(3_600_000),
                    ..Default::default()
                })
                .await
                .expect("create");
        }
        let topics = client.list_topics().await.expect("list");
        let names: Vec<(&str, u32)> = topics
            .iter()
            .map(|t| (t.name.as_str(), t.partitions))
            .collect();
        assert_eq!(names, [("alpha", 3), ("zeta", 1)]);
        assert_eq!(topics[0].retention_ms, Some(3_600_000));

        let member = GroupConsumer::join(&client, "readers", &["alpha"], options())
            .await
            .expect("join");
        assert_eq!(client.list_groups().await.expect("list"), ["readers"]);
        let d = client.describe_group("readers").await.expect("describe");
        assert!(d.found);
        assert_eq!(d.generation, member.generation());
        assert_eq!(d.members.len(), 1);
        assert_eq!(d.members[0].member_id, member.member_id());
        let mut parts: Vec<u32> = d.members[0]
            .assignment
            .iter()
            .map(|p| {
                assert_eq!(p.topic, "alpha");
                p.partition
            })
            .collect();
        parts.sort_unstable();
        assert_eq!(parts, [0, 1, 2]);
        assert!(
            !client
                .describe_group("nobody")
                .await
                .expect("describe")
                .found
        );
        member.close().await.expect("leave");
    });
    broker.shutdown();
}

/// Issue 29: a group joins without redelivery. Four members join at once while records flow,
/// a fifth joins later and one of the first leaves cleanly, each committing after every poll:
/// every record is processed exactly once by the group (members that join together get one
/// assignment; a rebalance hands a partition over at its owner's commit). Before the
/// hand-over, the first member read every partition until its next heartbeat and the others
/// re-read them from the last commit: hundreds of duplicates.
#[test]
fn members_joining_while_records_flow_see_each_record_once() {
    let broker = TestBroker::start(None);
    broker.run(|client| async move {
        const PARTITIONS: u32 = 4;
        const ROUNDS: usize = 40;
        const PER_ROUND: usize = 100;
        client
            .create_topic(CreateTopicRequest {
                name: "flow".into(),
                partitions: PARTITIONS,
                ..Default::default()
            })
            .await
            .expect("create");
        let options = GroupConsumerOptions {
            session_timeout: Duration::from_secs(3),
            max_records: 50,
            max_bytes: 64 * 1024,
            poll_wait: Duration::from_millis(20),
            ..GroupConsumerOptions::default()
        };
        let seen: Seen = Arc::default();
        let spawn_member = |stop: Arc<AtomicBool>| {
            let (client, seen, options) = (client.clone(), seen.clone(), options.clone());
            tokio::spawn(async move {
                let mut m = GroupConsumer::join(&client, "g", &["flow"], options)
                    .await
                    .expect("join");
                m.run(
                    |r| {
                        seen.lock()
                            .expect("seen")
                            .push((r.partition, r.offset, r.value.to_vec()))
                    },
                    || stop.load(Ordering::SeqCst),
                )
                .await
                .expect("run");
                m.close().await.expect("leave");
            })
        };
        let producer = {
            let client = client.clone();
            tokio::spawn(async move {
                let mut p = client.topic_producer("flow").await.expect("producer");
                for round in 0..ROUNDS {
                    for i in 0..PER_ROUND {
                        let n = round * PER_ROUND + i;
                        let key = format!("k{}", n % 64);
                        p.send(Some(key.as_bytes()), n.to_string().as_bytes())
                            .await
                            .expect("send");
                    }
                    p.flush().await.expect("flush");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        };
        // Four members at once, while the producer runs.
        let stops: Vec<Arc<AtomicBool>> = (0..5).map(|_| Arc::default()).collect();
        let mut members: Vec<_> = stops[..4].iter().map(|s| spawn_member(s.clone())).collect();
        // A fifth joins later; then one of the first four leaves (cleanly: after its commit).
        tokio::time::sleep(Duration::from_millis(700)).await;
        members.push(spawn_member(stops[4].clone()));
        tokio::time::sleep(Duration::from_millis(700)).await;
        stops[0].store(true, Ordering::SeqCst);
        producer.await.expect("producer");
        let total = ROUNDS * PER_ROUND;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let distinct: BTreeSet<(u32, u64)> = seen
                .lock()
                .expect("seen")
                .iter()
                .map(|(p, o, _)| (*p, *o))
                .collect();
            if distinct.len() >= total {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the group read {} of {total}",
                distinct.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for s in &stops {
            s.store(true, Ordering::SeqCst);
        }
        for m in members {
            m.await.expect("member");
        }
        let seen = seen.lock().expect("seen");
        let mut values: Vec<usize> = seen
            .iter()
            .map(|(_, _, v)| {
                std::str::from_utf8(v)
                    .expect("utf8")
                    .parse()
                    .expect("number")
            })
            .collect();
        values.sort_unstable();
        let delivered = values.len();
        values.dedup();
        assert_eq!(values.len(), total, "every record processed");
        assert_eq!(
            delivered - values.len(),
            0,
            "records processed twice by the group ({delivered} deliveries of {total})"
        );
    });
    broker.shutdown();
}

/// Issue 29, the consumer pipeline: a member's next fetch of each partition is in flight while
/// the application handles the last poll (prefetch), commits go in the background, and what
/// was handed out is what counts. A seek drops the partition's prefetched records (the next
/// poll starts where it was sought, not where the prefetch was); `close` commits the positions
/// handed out, so a member that never called `commit` still hands over without redelivery.
#[test]
fn prefetched_records_are_dropped_on_seek_and_close_commits_what_was_handed_out() {
    let broker = TestBroker::start(Some(1));
    broker.run(|client| async move {
        const N: usize = 200;
        client
            .create_topic(CreateTopicRequest {
                name: "pipe".into(),
                partitions: 1,
                ..Default::default()
            })
            .await
            .expect("create");
        let mut p = client.topic_producer("pipe").await.expect("producer");
        // Batches of 50 (a fetch returns whole batches).
        for i in 0..N {
            p.send(None, i.to_string().as_bytes()).await.expect("send");
            if i % 50 == 49 {
                p.flush().await.expect("flush");
            }
        }
        let options = GroupConsumerOptions {
            session_timeout: Duration::from_secs(10),
            max_records: 50,
            max_bytes: 64 * 1024,
            poll_wait: Duration::from_millis(20),
            commit_interval: Duration::from_secs(3600),
            ..GroupConsumerOptions::default()
        };
        let mut m = GroupConsumer::join(&client, "pipe-g", &["pipe"], options.clone())
            .await
            .expect("join");
        // First poll: offsets 0..50; the fetch of 50..100 is now in flight (prefetch).
        let first = m.poll().await.expect("poll");
        assert_eq!(first.first().map(|r| r.offset), Some(0));
        assert_eq!(first.len(), 50);
        // Let the prefetch answer, then seek back: its records must not be handed out.
        tokio::time::sleep(Duration::from_millis(200)).await;
        m.seek("pipe", 0, 10);
        let again = m.poll().await.expect("poll");
        assert_eq!(
            again.first().map(|r| r.offset),
            Some(10),
            "the poll after a seek starts at the sought offset, not at the prefetch"
        );
        let mut last = again.last().map(|r| r.offset).expect("records");
        while last + 1 < N as u64 {
            let recs = m.poll().await.expect("poll");
            if let Some(r) = recs.first() {
                assert_eq!(r.offset, last + 1, "in order, no gap, no repeat");
            }
            if let Some(r) = recs.last() {
                last = r.offset;
            }
        }
        // No commit was asked for (and the interval is an hour): close commits the end.
        m.close().await.expect("close");
        let committed = client.fetch_committed("pipe-g").await.expect("committed");
        assert_eq!(
            committed.get(&("pipe".to_string(), 0)),
            Some(&(N as u64)),
            "close commits what was handed out: {committed:?}"
        );
        // The next member starts there: nothing is read twice.
        let mut next = GroupConsumer::join(&client, "pipe-g", &["pipe"], options)
            .await
            .expect("join");
        assert!(next.poll().await.expect("poll").is_empty());
        next.close().await.expect("close");
    });
    broker.shutdown();
}

/// Issue 29: a partition revoked while its prefetch waits at the broker (a long poll) has that
/// fetch dropped: records written to it after the hand-over reach its new owner, never the old
/// member, even though the old member's fetch would have answered with them.
#[test]
fn a_revoked_partitions_prefetch_is_dropped() {
    let broker = TestBroker::start(Some(1));
    broker.run(|client| async move {
        client
            .create_topic(CreateTopicRequest {
                name: "moving".into(),
                partitions: 2,
                ..Default::default()
            })
            .await
            .expect("create");
        let options = GroupConsumerOptions {
            session_timeout: Duration::from_secs(10),
            max_records: 50,
            max_bytes: 64 * 1024,
            // Long polls: the prefetch of each partition waits at the broker for records.
            poll_wait: Duration::from_secs(2),
            ..GroupConsumerOptions::default()
        };
        let mut a = GroupConsumer::join(&client, "movers", &["moving"], options.clone())
            .await
            .expect("join a");
        assert_eq!(a.assignment().len(), 2);
        // Empty partitions: this poll's fetches stay in flight as long polls.
        assert!(a.poll().await.expect("poll").is_empty());
        let b = GroupConsumer::join(&client, "movers", &["moving"], options)
            .await
            .expect("join b");
        // `a` learns that it lost one partition (and releases it by committing).
        let before: Vec<(String, u32)> = a.assignment().to_vec();
        a.heartbeat().await.expect("heartbeat");
        let lost: Vec<u32> = before
            .iter()
            .filter(|k| !a.assignment().contains(k))
            .map(|k| k.1)
            .collect();
        assert_eq!(
            lost.len(),
            1,
            "a gives one partition to b: {:?}",
            a.assignment()
        );
        let lost = lost[0];
        // Records for the lost partition: `a`'s old long poll on it would answer with them.
        let key = (0..)
            .map(|i| format!("k{i}"))
            .find(|k| partition_for_key(k.as_bytes(), 2) == lost)
            .expect("a key");
        let mut p = client.topic_producer("moving").await.expect("producer");
        for i in 0..10 {
            p.send(Some(key.as_bytes()), format!("r{i}").as_bytes())
                .await
                .expect("send");
        }
        p.flush().await.expect("flush");
        tokio::time::sleep(Duration::from_millis(300)).await;
        for _ in 0..3 {
            let got = a.poll().await.expect("poll");
            assert!(
                got.iter().all(|r| r.partition != lost),
                "a handed out records of partition {lost}, revoked before they were written"
            );
        }
        a.close().await.expect("close a");
        b.close().await.expect("close b");
    });
    broker.shutdown();
}
