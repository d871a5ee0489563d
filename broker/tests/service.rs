//! The broker's service layer on real shards (2 executors, real DMA files): the message life
//! cycle across cores, long polling, FIFO, dead-letter moves, and restarts.

// A test is the broker's outside world: it times the broker with its own clocks (deadlines,
// waits, latencies). broker/clippy.toml's clock seam governs the broker's code, not this.
#![allow(clippy::disallowed_methods)]

use sluice_broker::config::BrokerConfig;
use sluice_broker::engine::attributes::MessageAttribute;
use sluice_broker::engine::{BatchEntry, ReceiveRequest, SendRequest};
use sluice_broker::error::ServiceError;
use sluice_broker::metadata::DEFAULT_TENANT as T;
use sluice_broker::server::{self, BrokerHandle};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// glommio registers locked memory per executor: one broker at a time in this binary.
static ONE_BROKER: Mutex<()> = Mutex::new(());

fn start(dir: &Path) -> BrokerHandle {
    let mut c = BrokerConfig::ephemeral(dir.to_path_buf()).expect("config");
    c.shards = 2;
    c.default_partitions = 2;
    let b = server::start(c).expect("start");
    b.wait_ready().expect("ready");
    b
}

/// A broker with a standard queue `name` (default attributes).
fn start_with_queue(dir: &Path, name: &'static str) -> BrokerHandle {
    let b = start(dir);
    b.run_on(0, move |s| async move {
        s.create_queue(T, name, BTreeMap::new(), BTreeMap::new())
            .await
            .expect("create");
    });
    b
}

fn send(body: &str) -> SendRequest {
    SendRequest {
        body: body.to_string(),
        attributes: Vec::<MessageAttribute>::new(),
        delay_s: None,
        group_id: None,
        dedup_id: None,
    }
}

fn recv(max: u32, vis: Option<u32>) -> ReceiveRequest {
    ReceiveRequest {
        max_messages: max,
        visibility_timeout_s: vis,
        attempt_id: None,
    }
}

fn attrs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn lifecycle_across_shards_and_restart() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    let b = start(tmp.path());
    // Create on shard 1, use from both shards.
    b.run_on(1, |s| async move {
        s.create_queue(
            T,
            "orders",
            attrs(&[("VisibilityTimeout", "30")]),
            BTreeMap::new(),
        )
        .await
        .expect("create");
    });
    for shard in 0..2 {
        b.run_on(shard, move |s| async move {
            let q = s.queue(T, "orders").expect("queue");
            for i in 0..10 {
                s.send(&q, send(&format!("m{shard}-{i}")))
                    .await
                    .expect("send");
            }
        });
    }
    let (handles, bodies) = b.run_on(0, |s| async move {
        let q = s.queue(T, "orders").expect("queue");
        let mut got = Vec::new();
        for _ in 0..10 {
            let r = s.receive(&q, recv(10, None), 0).await.expect("receive");
            got.extend(r);
            if got.len() >= 20 {
                break;
            }
        }
        let bodies: Vec<String> = got.iter().map(|d| d.payload.body.clone()).collect();
        let handles: Vec<String> = got.iter().map(|d| s.receipt_handle(&d.receipt)).collect();
        (handles, bodies)
    });
    assert_eq!(bodies.len(), 20, "every message received once: {bodies:?}");
    let mut sorted = bodies.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 20);
    // Delete half from shard 1 (handles name their partition; routing finds the owner).
    let keep: Vec<String> = handles[10..].to_vec();
    b.run_on(1, move |s| async move {
        let q = s.queue(T, "orders").expect("queue");
        for h in &handles[..10] {
            s.delete_message(&q, h).await.expect("delete");
        }
        // A forged handle and another queue's handle are rejected.
        assert!(matches!(
            s.delete_message(&q, "AAAA").await,
            Err(ServiceError::Engine(_))
        ));
        let c = s.queue_counters(&q).await.expect("counters");
        assert_eq!((c.visible, c.in_flight), (0, 10));
    });
    b.shutdown();

    // Restart: deleted stay deleted, leases and receive counts survive.
    let b = start(tmp.path());
    b.run_on(0, move |s| async move {
        let q = s.queue(T, "orders").expect("queue after restart");
        let c = s.queue_counters(&q).await.expect("counters");
        assert_eq!(
            (c.visible, c.in_flight),
            (0, 10),
            "leases survive a restart"
        );
        for h in &keep {
            s.change_visibility(&q, h, 0).await.expect("release");
        }
        let mut got = Vec::new();
        for _ in 0..10 {
            got.extend(s.receive(&q, recv(10, None), 0).await.expect("receive"));
            if got.len() >= 10 {
                break;
            }
        }
        assert_eq!(got.len(), 10);
        assert!(
            got.iter().all(|d| d.receive_count == 2),
            "receive counts survive"
        );
        // Replayed messages get their MD5OfMessageBody on receive (the log does not keep it).
        for d in &got {
            assert_eq!(
                d.payload.md5_body(),
                sluice_broker::engine::md5::md5_of_body(d.payload.body.as_bytes()),
                "{}",
                d.payload.body
            );
        }
    });
    b.shutdown();
}

#[test]
fn long_poll_wakes_on_a_send_from_another_shard() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    let b = std::sync::Arc::new(start(tmp.path()));
    b.run_on(0, |s| async move {
        s.create_queue(T, "lp", BTreeMap::new(), BTreeMap::new())
            .await
            .expect("create");
    });
    let b2 = b.clone();
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        b2.run_on(1, |s| async move {
            let q = s.queue(T, "lp").expect("q");
            s.send(&q, send("wake")).await.expect("send");
        });
    });
    let start_t = Instant::now();
    let got = b.run_on(0, |s| async move {
        let q = s.queue(T, "lp").expect("q");
        s.receive(&q, recv(1, None), 5).await.expect("receive")
    });
    let waited = start_t.elapsed();
    sender.join().expect("sender");
    assert_eq!(got.len(), 1);
    assert!(
        waited >= Duration::from_millis(250),
        "returned before the send: {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(3),
        "did not wake on the send: {waited:?}"
    );
    // An empty long poll waits its full time and returns nothing.
    let t = Instant::now();
    let got = b.run_on(1, |s| async move {
        let q = s.queue(T, "lp").expect("q");
        s.receive(&q, recv(1, None), 1).await.expect("receive")
    });
    assert!(got.is_empty());
    assert!(t.elapsed() >= Duration::from_millis(900));
    std::sync::Arc::into_inner(b)
        .expect("sole owner")
        .shutdown();
}

/// A long poll parked on the partition a send lands in leases the message before the send's
/// group commit starts, so one durable write covers both (publish→receive costs one commit,
/// not two in a row). Counted in the partition's log statistics.
#[test]
fn a_parked_long_poll_takes_its_message_in_the_senders_commit() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    let b = start_with_queue(tmp.path(), "joined");
    let (got, commits) = b.run_on(0, |s| async move {
        let q = s.queue(T, "joined").expect("q");
        let commits = |snaps: Vec<sluice_broker::metrics::ShardSnapshot>| -> u64 {
            snaps
                .iter()
                .flat_map(|sn| &sn.partitions)
                .filter(|p| p.queue_id == q.id)
                .map(|p| p.log.commits)
                .sum()
        };
        let before = commits(s.metrics_snapshots().await);
        let (s2, q2) = (s.clone(), q.clone());
        let parked = glommio::spawn_local(async move { s2.receive(&q2, recv(1, None), 5).await });
        glommio::timer::sleep(Duration::from_millis(200)).await;
        // Sent on shard 0: to its own partition, where the receive of shard 0 is parked.
        s.send(&q, send("joined")).await.expect("send");
        let got = parked.await.expect("receive");
        (got, commits(s.metrics_snapshots().await) - before)
    });
    assert_eq!(got.len(), 1, "the parked receive got the message");
    assert_eq!(got[0].payload.body, "joined");
    assert_eq!(commits, 1, "send and lease in one group commit");
    b.shutdown();
}

/// A long poll that stops waiting (its request cancelled) leaves nothing parked that could
/// lease for it: the message it would have taken goes to the next receive.
#[test]
fn a_cancelled_long_poll_leases_nothing() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    let b = start_with_queue(tmp.path(), "cancelled");
    b.run_on(1, |s| async move {
        let q = s.queue(T, "cancelled").expect("q");
        let poll = std::pin::pin!(s.receive(&q, recv(1, Some(600)), 20));
        let t = std::pin::pin!(glommio::timer::sleep(Duration::from_millis(200)));
        match futures::future::select(poll, t).await {
            futures::future::Either::Left((r, _)) => panic!("nothing was sent: {r:?}"),
            futures::future::Either::Right(_) => {} // the receive is dropped here
        }
    });
    // Shard 0's partition still holds the cancelled receive's parked request (until its
    // recheck): the sends to it must not be leased by that.
    let got = b.run_on(0, |s| async move {
        let q = s.queue(T, "cancelled").expect("q");
        for i in 0..4 {
            s.send(&q, send(&format!("m{i}"))).await.expect("send");
        }
        glommio::timer::sleep(Duration::from_millis(100)).await;
        let mut got = Vec::new();
        for _ in 0..4 {
            got.extend(s.receive(&q, recv(10, None), 0).await.expect("receive"));
        }
        got
    });
    let mut bodies: Vec<String> = got.iter().map(|d| d.payload.body.clone()).collect();
    bodies.sort();
    assert_eq!(
        bodies,
        ["m0", "m1", "m2", "m3"],
        "nothing leased for the gone receive"
    );
    b.shutdown();
}

#[test]
fn a_fifo_long_poll_wakes_when_a_delete_frees_its_group() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    let b = std::sync::Arc::new(start(tmp.path()));
    let handle = b.run_on(0, |s| async move {
        s.create_queue(
            T,
            "g.fifo",
            attrs(&[("FifoQueue", "true"), ("ContentBasedDeduplication", "true")]),
            BTreeMap::new(),
        )
        .await
        .expect("create");
        let q = s.queue(T, "g.fifo").expect("q");
        for body in ["first", "second"] {
            let r = SendRequest {
                group_id: Some("g".into()),
                ..send(body)
            };
            s.send(&q, r).await.expect("send");
        }
        let got = s.receive(&q, recv(1, Some(60)), 0).await.expect("receive");
        // The group's second message waits behind the first, in flight.
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].payload.body, "first");
        s.receipt_handle(&got[0].receipt)
    });
    let b2 = b.clone();
    let deleter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        b2.run_on(1, |s| async move {
            let q = s.queue(T, "g.fifo").expect("q");
            s.delete_message(&q, &handle).await.expect("delete");
        });
        Instant::now()
    });
    let got = b.run_on(0, |s| async move {
        let q = s.queue(T, "g.fifo").expect("q");
        s.receive(&q, recv(10, None), 10).await.expect("receive")
    });
    let returned = Instant::now();
    let deleted = deleter.join().expect("deleter");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].payload.body, "second");
    // Woken by the delete itself, not by the long poll's once-a-second re-check.
    let after = returned.saturating_duration_since(deleted);
    assert!(
        after < Duration::from_millis(600),
        "the long poll returned {after:?} after the delete"
    );
    std::sync::Arc::into_inner(b)
        .expect("sole owner")
        .shutdown();
}

#[test]
fn fifo_order_dedup_and_dead_letter_moves() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    let b = start(tmp.path());
    b.run_on(0, |s| async move {
        let dlq = s
            .create_queue(
                T,
                "dead.fifo",
                attrs(&[("FifoQueue", "true")]),
                BTreeMap::new(),
            )
            .await
            .expect("dlq");
        let policy = format!(
            r#"{{"deadLetterTargetArn":"{}","maxReceiveCount":"2"}}"#,
            dlq.arn(&s.config.region)
        );
        s.create_queue(
            T,
            "jobs.fifo",
            attrs(&[
                ("FifoQueue", "true"),
                ("RedrivePolicy", &policy),
                ("ContentBasedDeduplication", "true"),
            ]),
            BTreeMap::new(),
        )
        .await
        .expect("create");
        let q = s.queue(T, "jobs.fifo").expect("q");
        // Two groups, five messages each, in one batch and singly.
        let entries: Vec<BatchEntry> = (0..5)
            .map(|i| BatchEntry {
                id: format!("e{i}"),
                request: SendRequest {
                    group_id: Some("a".into()),
                    ..send(&format!("a{i}"))
                },
            })
            .collect();
        let r = s.send_batch(&q, entries).await.expect("batch");
        assert!(r.iter().all(|(_, res)| res.is_ok()));
        for i in 0..5 {
            s.send(
                &q,
                SendRequest {
                    group_id: Some("b".into()),
                    ..send(&format!("b{i}"))
                },
            )
            .await
            .expect("send");
        }
        // Content-based dedup: the same body in the window returns the original id.
        let first = s
            .send(
                &q,
                SendRequest {
                    group_id: Some("b".into()),
                    ..send("b0")
                },
            )
            .await
            .expect("dup");
        assert!(first.duplicate);
        // Order per group; a group with a message in flight gives nothing more.
        let got = s.receive(&q, recv(10, Some(30)), 0).await.expect("receive");
        let a: Vec<&str> = got
            .iter()
            .filter(|d| d.payload.group_id.as_deref() == Some("a"))
            .map(|d| d.payload.body.as_str())
            .collect();
        let bb: Vec<&str> = got
            .iter()
            .filter(|d| d.payload.group_id.as_deref() == Some("b"))
            .map(|d| d.payload.body.as_str())
            .collect();
        assert_eq!(a, ["a0", "a1", "a2", "a3", "a4"][..a.len()].to_vec());
        assert_eq!(bb, ["b0", "b1", "b2", "b3", "b4"][..bb.len()].to_vec());
        assert!(s
            .receive(&q, recv(10, Some(30)), 0)
            .await
            .expect("receive")
            .is_empty());
        // Release everything twice; the third receive moves group heads to the DLQ.
        for round in 0..2 {
            let list = if round == 0 {
                got.clone()
            } else {
                s.receive(&q, recv(10, Some(30)), 0).await.expect("r")
            };
            for d in &list {
                s.change_visibility(&q, &s.receipt_handle(&d.receipt), 0)
                    .await
                    .expect("release");
            }
        }
        let third = s.receive(&q, recv(10, Some(30)), 0).await.expect("third");
        assert!(third.iter().all(|d| d.receive_count <= 2));
        // The moved messages arrive in the DLQ, remembering their source.
        let mut moved = Vec::new();
        for _ in 0..50 {
            moved.extend(
                s.receive(&dlq, recv(10, Some(30)), 1)
                    .await
                    .expect("dlq receive"),
            );
            if !moved.is_empty() {
                break;
            }
        }
        assert!(!moved.is_empty(), "nothing reached the dead-letter queue");
        assert!(moved.iter().all(|d| d.dead_letter_source.is_some()));
        let sources = s.dead_letter_sources(&dlq);
        assert_eq!(sources.len(), 1);
        assert_eq!(sources[0].name, "jobs.fifo");
    });
    b.shutdown();
}

#[test]
fn queue_admin_errors() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    let b = start(tmp.path());
    b.run_on(1, |s| async move {
        assert!(matches!(
            s.queue(T, "nope"),
            Err(ServiceError::NonExistentQueue)
        ));
        assert!(s
            .create_queue(T, "bad name!", BTreeMap::new(), BTreeMap::new())
            .await
            .is_err());
        assert!(s
            .create_queue(
                T,
                "q",
                attrs(&[("VisibilityTimeout", "99999")]),
                BTreeMap::new()
            )
            .await
            .is_err());
        let q = s
            .create_queue(T, "q", BTreeMap::new(), BTreeMap::new())
            .await
            .expect("create");
        // Idempotent with the same attributes; an error with different ones.
        s.create_queue(T, "q", BTreeMap::new(), BTreeMap::new())
            .await
            .expect("again");
        assert!(matches!(
            s.create_queue(T, "q", attrs(&[("DelaySeconds", "5")]), BTreeMap::new())
                .await,
            Err(ServiceError::QueueNameExists)
        ));
        // Another tenant sees nothing of it.
        assert!(s.queue("111111111111", "q").is_err());
        assert!(s.list_queues("111111111111", "").is_empty());
        s.set_queue_attributes(&q, attrs(&[("DelaySeconds", "7")]))
            .await
            .expect("set");
        assert_eq!(s.queue(T, "q").expect("q").parsed.delay_s, 7);
        s.delete_queue(&q).await.expect("delete");
        assert!(matches!(
            s.queue(T, "q"),
            Err(ServiceError::NonExistentQueue)
        ));
        assert!(matches!(
            s.create_queue(T, "q", BTreeMap::new(), BTreeMap::new())
                .await,
            Err(ServiceError::QueueDeletedRecently)
        ));
    });
    b.shutdown();
}

/// Log files of a queue's partitions (by name), for the compaction test.
/// A broker config with small segments (128 KiB) and frequent checkpoints, so that a test's few
/// hundred messages span several segments and compaction has something to do; one partition
/// per queue.
fn small_segments(dir: &Path, shards: usize) -> BrokerConfig {
    let mut c = BrokerConfig::ephemeral(dir.to_path_buf()).expect("config");
    c.shards = shards;
    c.default_partitions = 1;
    c.log.segment_bytes_max = 128 * 1024;
    c.log.prealloc_chunk_bytes = 64 * 1024;
    c.log.batch_bytes_max = 64 * 1024;
    c.log.write_buffer_bytes_max = 64 * 1024;
    c.limits.checkpoint_interval_records = 50;
    c
}

fn log_files(dir: &Path, queue_id: u64) -> Vec<String> {
    let qdir = dir.join("queues").join(format!("{queue_id:016}"));
    let mut out = Vec::new();
    for p in std::fs::read_dir(qdir).expect("queue dir").flatten() {
        for f in std::fs::read_dir(p.path())
            .expect("partition dir")
            .flatten()
        {
            let name = f.file_name().to_string_lossy().to_string();
            if name.ends_with(".log") {
                out.push(format!("{}/{name}", p.file_name().to_string_lossy()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn deleted_messages_give_their_space_back_and_a_live_one_pins_it() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    let start_small = |dir: &Path| {
        let c = small_segments(dir, 2);
        let b = server::start(c).expect("start");
        b.wait_ready().expect("ready");
        b
    };
    let body = "x".repeat(1024);
    let b = start_small(tmp.path());
    // A message that stays (it pins the log), then 600 KiB that are sent and deleted.
    let qid = b.run_on(0, move |s| async move {
        s.create_queue(T, "compact", BTreeMap::new(), BTreeMap::new())
            .await
            .expect("create");
        let q = s.queue(T, "compact").expect("queue");
        s.send(&q, send("keeper")).await.expect("send");
        let keeper = s
            .receive(&q, recv(1, Some(3600)), 0)
            .await
            .expect("receive");
        assert_eq!(keeper.len(), 1);
        for round in 0..60 {
            for i in 0..10 {
                s.send(&q, send(&format!("{round}-{i}-{body}")))
                    .await
                    .expect("send");
            }
            let got = s.receive(&q, recv(10, None), 0).await.expect("receive");
            for d in got {
                let h = s.receipt_handle(&d.receipt);
                s.delete_message(&q, &h).await.expect("delete");
            }
        }
        (q.id, s.receipt_handle(&keeper[0].receipt))
    });
    let (qid, keeper) = qid;
    let pinned = log_files(tmp.path(), qid);
    assert!(
        pinned.len() >= 4,
        "the test writes several segments: {pinned:?}"
    );
    assert!(
        pinned
            .iter()
            .any(|f| f.ends_with("00000000000000000000.log")),
        "a live message pins its segment: {pinned:?}"
    );
    // Delete the keeper: after a compaction interval, the old segments go.
    b.run_on(1, move |s| async move {
        let q = s.queue(T, "compact").expect("queue");
        s.delete_message(&q, &keeper).await.expect("delete keeper");
        // Enough records for a checkpoint that shows the keeper gone.
        for _ in 0..60 {
            s.send(&q, send("survivor")).await.expect("send");
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            glommio::timer::sleep(Duration::from_millis(1100)).await;
            // Any command on the partition (here a send of a later survivor) lets it compact.
            s.send(&q, send("survivor")).await.expect("send");
            if log_files(&s.config.data_dir, q.id).len() <= 2 {
                return;
            }
        }
        panic!("no compaction: {:?}", log_files(&s.config.data_dir, q.id));
    });
    b.shutdown();
    // The compacted log replays: the survivors are there, nothing deleted comes back.
    let b = start_small(tmp.path());
    b.run_on(0, |s| async move {
        let q = s.queue(T, "compact").expect("queue after restart");
        let c = s.queue_counters(&q).await.expect("counters");
        assert!(c.visible >= 1 && c.in_flight == 0, "{c:?}");
        assert!(c.visible >= 60, "{c:?}");
        let got = s.receive(&q, recv(10, None), 0).await.expect("receive");
        assert!(!got.is_empty());
        assert!(got.iter().all(|d| d.payload.body == "survivor"));
    });
    b.shutdown();
}

/// Bodies live in the log only: a receive reads them back from the messages' `Sent` records —
/// after the log below them was compacted away, and after a restart. Plain messages past a few
/// entries wait in the log only and are loaded by receives, so the backlog (64 messages) is
/// bounded neither by entries (16 configured, for pinned messages only) nor by its bytes.
#[test]
fn bodies_are_read_from_the_log_after_compaction_and_restart() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    const ENTRIES_MAX: u32 = 16;
    let start_small = |dir: &Path| {
        let mut c = small_segments(dir, 2);
        c.limits.message_entries_max = ENTRIES_MAX;
        // Past 8 entries, plain messages wait in the log only (the engine's tail) and are
        // loaded by receives.
        c.limits.resident_entries_target = 8;
        let b = server::start(c).expect("start");
        b.wait_ready().expect("ready");
        b
    };
    // Distinct bodies, 30 KiB each: 48 of them are 1.4 MiB of backlog, ~20 segments' worth of
    // churn around them.
    let body = |i: u32| {
        format!(
            "keeper {i} {}",
            char::from(b'a' + (i % 26) as u8)
                .to_string()
                .repeat(30 * 1024)
        )
    };
    let b = start_small(tmp.path());
    b.run_on(0, move |s| async move {
        s.create_queue(T, "backlog", BTreeMap::new(), BTreeMap::new())
            .await
            .expect("create");
        let q = s.queue(T, "backlog").expect("queue");
        let filler = "f".repeat(1024);
        let churn = |rounds: u32| {
            let (s, q, filler) = (s.clone(), q.clone(), filler.clone());
            async move {
                for _ in 0..rounds {
                    for _ in 0..10 {
                        s.send(&q, send(&filler)).await.expect("send");
                    }
                    let got = s.receive(&q, recv(10, None), 0).await.expect("receive");
                    for d in got {
                        assert_eq!(d.payload.body, filler);
                        let h = s.receipt_handle(&d.receipt);
                        s.delete_message(&q, &h).await.expect("delete");
                    }
                }
            }
        };
        churn(30).await;
        // 16 messages held in flight, then 48 keepers: more than the partition's 64 entries
        // would hold, but plain messages need none (they wait in the log).
        let mut held = Vec::new();
        for _ in 0..16 {
            s.send(&q, send("held")).await.expect("send");
        }
        while held.len() < 16 {
            let got = s
                .receive(&q, recv(10, Some(3600)), 0)
                .await
                .expect("receive");
            held.extend(got.iter().map(|d| s.receipt_handle(&d.receipt)));
        }
        for i in 0..48 {
            s.send(&q, send(&body(i))).await.expect("send keeper");
        }
        for h in held {
            s.delete_message(&q, &h).await.expect("delete");
        }
    });
    // The log below the keepers goes (any command lets the partition compact: a send here).
    b.run_on(1, move |s| async move {
        let q = s.queue(T, "backlog").expect("queue");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            glommio::timer::sleep(Duration::from_millis(1100)).await;
            s.send(&q, send("tick")).await.expect("send");
            let files = log_files(&s.config.data_dir, q.id);
            if !files
                .iter()
                .any(|f| f.ends_with("00000000000000000000.log"))
            {
                return;
            }
            assert!(Instant::now() < deadline, "no compaction: {files:?}");
        }
    });
    // After compaction: every keeper's body, read back from the log, in a 4 s lease.
    let check = move |s: std::rc::Rc<sluice_broker::shard::Shard>, count: u32| async move {
        let q = s.queue(T, "backlog").expect("queue");
        let mut seen = Vec::new();
        while seen.len() < 48 {
            let got = s.receive(&q, recv(10, Some(4)), 0).await.expect("receive");
            assert!(!got.is_empty(), "keepers missing: have {}", seen.len());
            for d in got {
                if d.payload.body == "tick" {
                    continue; // sent after the keepers
                }
                let i: u32 = d.payload.body["keeper ".len()..]
                    .split(' ')
                    .next()
                    .and_then(|n| n.parse().ok())
                    .expect("a keeper");
                assert_eq!(d.payload.body, body(i));
                assert_eq!(d.receive_count, count);
                seen.push(i);
            }
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..48).collect::<Vec<_>>());
    };
    b.run_on(0, move |s| check(s, 1));
    b.shutdown();
    // After a restart (once the 4 s leases have expired): the same bodies again.
    std::thread::sleep(Duration::from_millis(4100));
    let b = start_small(tmp.path());
    b.run_on(1, move |s| check(s, 2));
    b.shutdown();
}

/// The engine's snapshot files (one per partition that wrote one) under the data dir.
fn snapshot_files(dir: &Path, queue_id: u64) -> Vec<std::path::PathBuf> {
    let qdir = dir.join("queues").join(format!("{queue_id:016}"));
    let mut out = Vec::new();
    for p in std::fs::read_dir(qdir).expect("queue dir").flatten() {
        let f = p.path().join("engine.snapshot");
        if f.exists() {
            out.push(f);
        }
    }
    out
}

/// A clean stop leaves a snapshot per partition (a backlog waiting in the log costs it a few
/// bytes); a restart starts from it. A damaged snapshot (bytes flipped on disk) is refused and
/// the restart replays the log instead: nothing is lost either way.
#[test]
fn restarts_start_from_snapshots_and_a_damaged_one_falls_back_to_the_log() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    const SENT: usize = 600;
    let start_small = |dir: &Path| {
        let mut c = BrokerConfig::ephemeral(dir.to_path_buf()).expect("config");
        c.shards = 2;
        c.default_partitions = 2;
        c.limits.resident_entries_target = 32;
        let b = server::start(c).expect("start");
        b.wait_ready().expect("ready");
        b
    };
    let b = start_small(tmp.path());
    let queue_id = b.run_on(0, move |s| async move {
        s.create_queue(T, "snap", BTreeMap::new(), BTreeMap::new())
            .await
            .expect("create");
        let q = s.queue(T, "snap").expect("queue");
        for i in 0..SENT {
            s.send(&q, send(&format!("m{i}"))).await.expect("send");
        }
        q.id
    });
    b.shutdown();
    let snaps = snapshot_files(tmp.path(), queue_id);
    // Every partition that holds records (sends from one shard may all go to its own).
    assert!(!snaps.is_empty(), "no snapshot written at a clean stop");
    for f in &snaps {
        // 600 messages, of which at most 32 per partition have entries: a few KiB at most.
        let len = std::fs::metadata(f).expect("snapshot").len();
        assert!(len < 16 * 1024, "{} is {len} bytes", f.display());
    }
    // Receives `n` messages in a one-hour lease; returns their bodies.
    let take = move |s: std::rc::Rc<sluice_broker::shard::Shard>, n: usize| async move {
        let q = s.queue(T, "snap").expect("queue");
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while got.len() < n {
            assert!(
                Instant::now() < deadline,
                "only {} of {n} received",
                got.len()
            );
            for d in s
                .receive(&q, recv(10, Some(3600)), 0)
                .await
                .expect("receive")
            {
                got.push(d.payload.body.clone());
            }
        }
        let c = s.queue_counters(&q).await.expect("counters");
        (got, c.visible, c.in_flight)
    };
    let b = start_small(tmp.path());
    let (first, visible, in_flight) = b.run_on(1, move |s| take(s, 200));
    assert_eq!((visible, in_flight), (SENT as u64 - 200, 200));
    b.shutdown();
    for f in snapshot_files(tmp.path(), queue_id) {
        let mut bytes = std::fs::read(&f).expect("read");
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x5a;
        std::fs::write(&f, bytes).expect("damage");
    }
    let b = start_small(tmp.path());
    let (rest, visible, in_flight) = b.run_on(0, move |s| take(s, SENT - 200));
    assert_eq!((visible, in_flight), (0, SENT as u64));
    b.shutdown();
    let mut all: Vec<String> = first.into_iter().chain(rest).collect();
    all.sort();
    all.dedup();
    let mut want: Vec<String> = (0..SENT).map(|i| format!("m{i}")).collect();
    want.sort();
    assert_eq!(all, want, "every message once");
}

/// A backlog that nobody receives expires after its retention and gives its space back:
/// messages waiting in the log only (the engine's tail) are read past in the background once
/// they expire, so compaction can delete their segments. Takes a minute (the shortest
/// MessageRetentionPeriod SQS allows). A message is sent to the queue every 5 s meanwhile
/// (never received): checkpoints and snapshots follow a partition's records, so an entirely
/// idle partition compacts an expired log only at its next activity (ARCHITECTURE.md).
#[test]
fn an_expired_backlog_gives_its_space_back_without_receives() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    let mut c = small_segments(tmp.path(), 1);
    c.limits.resident_entries_target = 8;
    let b = server::start(c).expect("start");
    b.wait_ready().expect("ready");
    b.run_on(0, move |s| async move {
        s.create_queue(
            T,
            "expiring",
            attrs(&[("MessageRetentionPeriod", "60")]),
            BTreeMap::new(),
        )
        .await
        .expect("create");
        let q = s.queue(T, "expiring").expect("queue");
        let body = "x".repeat(2048);
        for _ in 0..300 {
            s.send(&q, send(&body)).await.expect("send");
        }
        let before = log_files(&s.config.data_dir, q.id);
        assert!(before.len() >= 4, "{before:?}");
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut ticks = 0u32;
        loop {
            glommio::timer::sleep(Duration::from_millis(1000)).await;
            // Activity on the queue itself, without receiving: a send now and then.
            ticks += 1;
            if ticks.is_multiple_of(5) {
                s.send(&q, send("tick")).await.expect("send");
            }
            let c = s.queue_counters(&q).await.expect("counters");
            let files = log_files(&s.config.data_dir, q.id);
            if c.visible <= u64::from(ticks / 5) && files.len() <= 2 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "expired backlog kept: {c:?}, {files:?}"
            );
        }
    });
    b.shutdown();
}

/// StreamRetentionPeriod keeps deleted messages for readers of the queue as a stream:
/// compaction leaves the young segments alone while it is set, and frees them once it is 0.
#[test]
fn stream_retention_keeps_deleted_messages_for_stream_readers() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    let c = small_segments(tmp.path(), 2);
    let b = server::start(c).expect("start");
    b.wait_ready().expect("ready");
    let body = "x".repeat(1024);
    b.run_on(0, move |s| async move {
        let mut attrs = BTreeMap::new();
        attrs.insert("StreamRetentionPeriod".to_string(), "3600".to_string());
        assert_eq!(
            err(s
                .create_queue(
                    T,
                    "bad",
                    {
                        let mut a = BTreeMap::new();
                        a.insert("StreamRetentionPeriod".to_string(), "1209601".to_string());
                        a
                    },
                    BTreeMap::new()
                )
                .await),
            "InvalidAttributeValue"
        );
        s.create_queue(T, "audited", attrs, BTreeMap::new())
            .await
            .expect("create");
        let q = s.queue(T, "audited").expect("queue");
        assert_eq!(
            q.static_attributes("us-east-1")
                .get("StreamRetentionPeriod")
                .map(String::as_str),
            Some("3600")
        );
        for round in 0..60 {
            for i in 0..10 {
                s.send(&q, send(&format!("{round}-{i}-{body}")))
                    .await
                    .expect("send");
            }
            let got = s.receive(&q, recv(10, None), 0).await.expect("receive");
            for d in got {
                let h = s.receipt_handle(&d.receipt);
                s.delete_message(&q, &h).await.expect("delete");
            }
        }
        let written = log_files(&s.config.data_dir, q.id);
        assert!(written.len() >= 4, "several segments: {written:?}");
        // Past several compaction intervals, with the partition busy: nothing goes.
        for _ in 0..3 {
            glommio::timer::sleep(Duration::from_millis(1100)).await;
            s.send(&q, send("later")).await.expect("send");
        }
        assert_eq!(log_files(&s.config.data_dir, q.id).len(), written.len());
        // A stream reader still finds the first deleted message at offset 0's segment.
        let f = s
            .fetch_queue_stream(
                &q,
                0,
                sluice_broker::stream::FetchRequest {
                    offset: 0,
                    max_bytes: 1 << 20,
                    max_records: 1,
                    wait_ms: 0,
                },
            )
            .await
            .expect("fetch");
        assert_eq!(f.start_offset, 0);
        assert!(f.records[0].record.value.starts_with(b"0-0-"));
        // Off again: compaction frees the deleted messages' segments.
        let mut off = BTreeMap::new();
        off.insert("StreamRetentionPeriod".to_string(), "0".to_string());
        s.set_queue_attributes(&q, off).await.expect("set");
        let q = s.queue(T, "audited").expect("queue");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            glommio::timer::sleep(Duration::from_millis(1100)).await;
            s.send(&q, send("later")).await.expect("send");
            if log_files(&s.config.data_dir, q.id).len() <= 2 {
                return;
            }
        }
        panic!("no compaction: {:?}", log_files(&s.config.data_dir, q.id));
    });
    b.shutdown();
}

/// The SQS code of a refused request.
fn err<T: std::fmt::Debug>(r: Result<T, ServiceError>) -> &'static str {
    r.expect_err("refused").info().code
}

/// Dead-letters `n` messages of `src` (maxReceiveCount 1): receive, release, receive again.
async fn dead_letter_all(s: &sluice_broker::shard::Shard, src: &str, dlq: &str, n: u64) {
    let q = s.queue(T, src).expect("src");
    let d = s.queue(T, dlq).expect("dlq");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        for m in s.receive(&q, recv(10, Some(0)), 0).await.expect("receive") {
            let h = s.receipt_handle(&m.receipt);
            let _ = s.change_visibility(&q, &h, 0).await;
        }
        let c = s.queue_counters(&d).await.expect("counters");
        if c.visible == n {
            return;
        }
        assert!(Instant::now() < deadline, "dead-lettering stalled: {c:?}");
        glommio::timer::sleep(Duration::from_millis(10)).await;
    }
}

#[test]
fn message_move_tasks_redrive_at_a_bounded_rate_and_cancel() {
    use sluice_broker::shard::move_task::MoveTaskStatus;
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    let b = start(tmp.path());
    b.run_on(1, |s| async move {
        let dlq = s
            .create_queue(T, "dead", BTreeMap::new(), BTreeMap::new())
            .await
            .expect("dlq");
        let dlq_arn = dlq.arn(&s.config.region);
        let policy = format!(r#"{{"deadLetterTargetArn":"{dlq_arn}","maxReceiveCount":"1"}}"#);
        let src = s
            .create_queue(
                T,
                "work",
                attrs(&[("RedrivePolicy", &policy)]),
                BTreeMap::new(),
            )
            .await
            .expect("src");
        let other = s
            .create_queue(T, "other", BTreeMap::new(), BTreeMap::new())
            .await
            .expect("other");
        for i in 0..40 {
            s.send(&src, send(&format!("m{i}"))).await.expect("send");
        }
        dead_letter_all(&s, "work", "dead", 40).await;

        // Refusals: not a DLQ, bad rate, unknown queue, unknown or forged handle.
        let src_arn = src.arn(&s.config.region);
        assert_eq!(
            err(s.start_move_task(T, &src_arn, None, None).await),
            "InvalidParameterValue"
        );
        assert_eq!(
            err(s.start_move_task(T, &dlq_arn, None, Some(501)).await),
            "InvalidParameterValue"
        );
        assert_eq!(
            err(s
                .start_move_task(T, "arn:aws:sqs:us-east-1:000000000000:nope", None, None)
                .await),
            "ResourceNotFoundException"
        );
        assert_eq!(
            err(s
                .start_move_task("111111111111", &dlq_arn, None, None)
                .await),
            "ResourceNotFoundException",
            "another tenant's queue is not visible"
        );
        assert_eq!(
            err(s.cancel_move_task(T, "bm90IGEgaGFuZGxl").await),
            "ResourceNotFoundException"
        );

        // A slow task (10/s) is running: a second one is refused; cancel stops it early.
        let began = Instant::now();
        let handle = s
            .start_move_task(T, &dlq_arn, None, Some(10))
            .await
            .expect("start");
        assert_eq!(
            err(s.start_move_task(T, &dlq_arn, None, None).await),
            "AWS.SimpleQueueService.UnsupportedOperation"
        );
        let listed = s.list_move_tasks(T, &dlq_arn, 10).await.expect("list");
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].status, MoveTaskStatus::Running);
        assert_eq!(listed[0].task_handle.as_deref(), Some(handle.as_str()));
        assert_eq!(listed[0].messages_to_move, 40);
        glommio::timer::sleep(Duration::from_millis(1200)).await;
        s.cancel_move_task(T, &handle).await.expect("cancel");
        assert_eq!(
            err(s.cancel_move_task(T, &handle).await),
            "AWS.SimpleQueueService.UnsupportedOperation",
            "only a running task can be cancelled"
        );
        let cancelled = loop {
            let l = s.list_move_tasks(T, &dlq_arn, 1).await.expect("list");
            if l[0].status == MoveTaskStatus::Cancelled {
                break l[0].clone();
            }
            glommio::timer::sleep(Duration::from_millis(20)).await;
        };
        assert!(cancelled.task_handle.is_none());
        let moved = cancelled.messages_moved;
        let elapsed = began.elapsed().as_secs_f64();
        assert!((1..40).contains(&moved), "moved {moved}");
        assert!(
            (moved as f64) <= 10.0 * elapsed + 10.0,
            "rate bound: {moved} moves in {elapsed:.2}s at 10/s"
        );

        // Unlimited redrive back to the source: everything arrives, with a fresh count.
        s.start_move_task(T, &dlq_arn, None, None)
            .await
            .expect("start again");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let l = s.list_move_tasks(T, &dlq_arn, 10).await.expect("list");
            assert_eq!(l.len(), 2, "newest first, both kept");
            let (cs, cd) = (
                s.queue_counters(&src).await.expect("c"),
                s.queue_counters(&dlq).await.expect("c"),
            );
            if l[0].status == MoveTaskStatus::Completed && cs.visible == 40 && cd.visible == 0 {
                assert_eq!(cd.in_flight + cd.moving, 0);
                break;
            }
            assert!(
                Instant::now() < deadline,
                "redrive stalled: {l:?} {cs:?} {cd:?}"
            );
            glommio::timer::sleep(Duration::from_millis(20)).await;
        }
        let back = s
            .receive(&src, recv(10, Some(30)), 0)
            .await
            .expect("receive");
        assert!(!back.is_empty());
        assert!(back
            .iter()
            .all(|d| d.receive_count == 1 && d.dead_letter_source.is_none()));
        for d in &back {
            let h = s.receipt_handle(&d.receipt);
            s.change_visibility(&src, &h, 0).await.expect("release");
        }

        // To an explicit destination.
        dead_letter_all(&s, "work", "dead", 40).await;
        let other_arn = other.arn(&s.config.region);
        s.start_move_task(T, &dlq_arn, Some(&other_arn), Some(500))
            .await
            .expect("start to other");
        let deadline = Instant::now() + Duration::from_secs(20);
        while s.queue_counters(&other).await.expect("c").visible < 40 {
            assert!(
                Instant::now() < deadline,
                "redrive to a named queue stalled"
            );
            glommio::timer::sleep(Duration::from_millis(20)).await;
        }
        let l = s.list_move_tasks(T, &dlq_arn, 1).await.expect("list");
        assert_eq!(l[0].destination_arn.as_deref(), Some(other_arn.as_str()));
    });
    b.shutdown();
}

/// A deleted queue leaves no directory behind: its partitions' and its own go in the
/// background (`reclaim`: after a grace of a second), and one left by a crash between the
/// durable delete and the removal goes at the next start.
#[test]
fn deleted_queues_leave_no_directories() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    let queues = tmp.path().join("queues");
    let b = start(tmp.path());
    let (kept, gone) = b.run_on(0, |s| async move {
        let kept = s
            .create_queue(T, "kept", BTreeMap::new(), BTreeMap::new())
            .await
            .expect("create");
        let gone = s
            .create_queue(T, "gone", BTreeMap::new(), BTreeMap::new())
            .await
            .expect("create");
        s.send(&gone, send("x")).await.expect("send");
        s.delete_queue(&gone).await.expect("delete");
        (kept.id, gone.id)
    });
    let dir = |id: u64| queues.join(format!("{id:016}"));
    assert!(dir(kept).is_dir(), "a live queue keeps its directory");
    let deadline = Instant::now() + Duration::from_secs(30);
    while dir(gone).exists() {
        assert!(
            Instant::now() < deadline,
            "a deleted queue's directory is removed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    b.shutdown();
    // What a crash after the delete record but before the removal leaves.
    std::fs::create_dir_all(dir(gone).join("p00000")).expect("mkdir");
    std::fs::write(dir(gone).join("p00000").join("junk"), b"x").expect("write");
    let b = start(tmp.path());
    assert!(
        !dir(gone).exists(),
        "the leftover directory is removed at start"
    );
    assert!(dir(kept).is_dir(), "and nothing else");
    // Renamed aside at start, its space is then reclaimed in the background.
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read_dir(&queues)
        .expect("queues")
        .flatten()
        .any(|e| e.file_name().to_string_lossy().ends_with(".deleted"))
    {
        assert!(Instant::now() < deadline, "a renamed leftover is reclaimed");
        std::thread::sleep(Duration::from_millis(20));
    }
    b.run_on(0, |s| async move {
        let q = s.queue(T, "kept").expect("still there");
        s.send(&q, send("y")).await.expect("send");
    });
    b.shutdown();
}
