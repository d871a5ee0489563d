//! The broker's service layer on real shards (2 executors, real DMA files): the message life
//! cycle across cores, long polling, FIFO, dead-letter moves, and restarts.

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
    let mut c = BrokerConfig::embedded(dir.to_path_buf()).expect("config");
    c.shards = 2;
    c.default_partitions = 2;
    let b = server::start(c).expect("start");
    b.wait_ready().expect("ready");
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

#[test]
fn fifo_order_dedup_and_dead_letter_moves() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    let b = start(tmp.path());
    b.run_on(0, |s| async move {
        let dlq = s
            .create_queue(T, "dead.fifo", BTreeMap::new(), BTreeMap::new())
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
