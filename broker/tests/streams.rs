//! Streams on real shards (2 executors, real DMA files): topics, produce and fetch across
//! cores, long polling, seeks by time, retention, consumer groups and restarts.

// A test is the broker's outside world: it times the broker with its own clocks (deadlines,
// waits, latencies). broker/clippy.toml's clock seam governs the broker's code, not this.
#![allow(clippy::disallowed_methods)]

use sluice_broker::config::BrokerConfig;
use sluice_broker::metadata::DEFAULT_TENANT as T;
use sluice_broker::server::{self, BrokerHandle};
use sluice_broker::shard::Shard;
use sluice_broker::stream::{readahead, FetchRequest, OffsetSpec, StreamError, TopicConfig};
use sluice_storage::Record;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// glommio registers locked memory per executor: one broker at a time in this binary.
static ONE_BROKER: Mutex<()> = Mutex::new(());

fn start(dir: &Path) -> BrokerHandle {
    let mut c = BrokerConfig::ephemeral(dir.to_path_buf()).expect("config");
    c.shards = 2;
    c.default_partitions = 2;
    c.quic_enabled = false;
    c.http_addr = "127.0.0.1:0".parse().expect("addr");
    c.metrics_addr = "127.0.0.1:0".parse().expect("addr");
    c.kafka_addr = None;
    let b = server::start(c).expect("start");
    b.wait_ready().expect("ready");
    b
}

fn topic_config(partitions: u32) -> TopicConfig {
    TopicConfig {
        partitions,
        ..TopicConfig::default()
    }
}

fn keyed(key: &str, value: &str, ts: i64) -> Record {
    Record {
        timestamp_ms: ts,
        key: Some(key.as_bytes().to_vec()),
        value: value.as_bytes().to_vec(),
        headers: Vec::new(),
    }
}

/// Reads a partition from `from` to its current end.
async fn read_all(s: &Shard, topic: &str, p: u32, from: u64) -> Vec<(u64, Record)> {
    let t = s.topic(T, topic).expect("topic");
    let mut at = from;
    let mut out = Vec::new();
    loop {
        let f = s
            .fetch(
                &t,
                p,
                FetchRequest {
                    offset: at,
                    max_bytes: 64 * 1024,
                    max_records: 1000,
                    wait_ms: 0,
                },
            )
            .await
            .expect("fetch");
        let recs = f.records(at).expect("records");
        if recs.is_empty() {
            return out;
        }
        for r in recs {
            assert_eq!(r.offset, at, "offsets are contiguous");
            at += 1;
            out.push((r.offset, r.record));
        }
    }
}

#[test]
fn per_partition_order_under_concurrent_producers() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    let b = start(tmp.path());
    b.run_on(1, |s| async move {
        s.create_topic(T, "orders", topic_config(4))
            .await
            .expect("create");
    });
    const PRODUCERS_PER_SHARD: usize = 4;
    const RECORDS: usize = 60;
    std::thread::scope(|scope| {
        for shard in 0..2 {
            let b = &b;
            scope.spawn(move || {
                b.run_on(shard, move |s| async move {
                    let t = s.topic(T, "orders").expect("topic");
                    let producers = (0..PRODUCERS_PER_SHARD).map(|k| {
                        let (s, t) = (s.clone(), t.clone());
                        async move {
                            let key = format!("producer-{shard}-{k}");
                            for i in 0..RECORDS {
                                // Batches of 1–3 records, each awaited (acked) before the next.
                                let recs: Vec<Record> = (0..=(i % 3))
                                    .map(|j| keyed(&key, &format!("{i}.{j}"), i as i64))
                                    .collect();
                                let p = s.produce_records(&t, recs).await.expect("produce");
                                assert_eq!(p.len(), 1, "one key, one partition");
                                assert_eq!(
                                    p[0].partition,
                                    Shard::partition_for_key(&t, key.as_bytes())
                                );
                            }
                        }
                    });
                    futures::future::join_all(producers).await;
                });
            });
        }
    });
    let seen = b.run_on(0, |s| async move {
        let mut by_key: HashMap<String, Vec<String>> = HashMap::new();
        for p in 0..4 {
            for (_, r) in read_all(&s, "orders", p, 0).await {
                let key = String::from_utf8(r.key.expect("keyed")).expect("utf8");
                let t = s.topic(T, "orders").expect("topic");
                assert_eq!(Shard::partition_for_key(&t, key.as_bytes()), p);
                by_key
                    .entry(key)
                    .or_default()
                    .push(String::from_utf8(r.value).expect("utf8"));
            }
        }
        by_key
    });
    assert_eq!(seen.len(), 2 * PRODUCERS_PER_SHARD);
    let expected: Vec<String> = (0..RECORDS)
        .flat_map(|i| (0..=(i % 3)).map(move |j| format!("{i}.{j}")))
        .collect();
    for (key, values) in &seen {
        assert_eq!(values, &expected, "{key}: every record once, in send order");
    }
    b.shutdown();
}

#[test]
fn fetch_long_poll_wakes_on_append_from_another_core() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    let b = start(tmp.path());
    b.run_on(0, |s| async move {
        s.create_topic(T, "ticks", topic_config(1))
            .await
            .expect("create");
    });
    // A poll with nothing to read waits its time out and answers empty.
    let waited = b.run_on(0, |s| async move {
        let t = s.topic(T, "ticks").expect("topic");
        let started = Instant::now();
        let f = s
            .fetch(
                &t,
                0,
                FetchRequest {
                    offset: 0,
                    max_bytes: 1 << 20,
                    max_records: 10,
                    wait_ms: 200,
                },
            )
            .await
            .expect("fetch");
        assert!(f.batches.is_empty());
        started.elapsed()
    });
    assert!(waited >= Duration::from_millis(150), "waited {waited:?}");
    // Whichever shard owns the partition, poll from shard 1 and produce on shard 0.
    std::thread::scope(|scope| {
        let b = &b;
        let poller = scope.spawn(move || {
            b.run_on(1, |s| async move {
                let t = s.topic(T, "ticks").expect("topic");
                let started = Instant::now();
                let f = s
                    .fetch(
                        &t,
                        0,
                        FetchRequest {
                            offset: 0,
                            max_bytes: 1 << 20,
                            max_records: 10,
                            wait_ms: 10_000,
                        },
                    )
                    .await
                    .expect("fetch");
                (started.elapsed(), f.records(0).expect("records"))
            })
        });
        std::thread::sleep(Duration::from_millis(300));
        b.run_on(0, |s| async move {
            let t = s.topic(T, "ticks").expect("topic");
            s.produce_records(&t, vec![keyed("k", "hello", 1)])
                .await
                .expect("produce");
        });
        let (elapsed, recs) = poller.join().expect("poller");
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].record.value, b"hello");
        assert!(
            elapsed < Duration::from_secs(5),
            "woken by the append, not the deadline: {elapsed:?}"
        );
    });
    // Bad input gets typed errors.
    b.run_on(0, |s| async move {
        let t = s.topic(T, "ticks").expect("topic");
        let req = FetchRequest {
            offset: 99,
            max_bytes: 1024,
            max_records: 1,
            wait_ms: 0,
        };
        assert!(matches!(
            s.fetch(&t, 0, req).await,
            Err(StreamError::OffsetOutOfRange { .. })
        ));
        assert!(matches!(
            s.fetch(&t, 5, req).await,
            Err(StreamError::UnknownPartition { .. })
        ));
        assert!(matches!(
            s.produce(&t, None, b"not a batch".to_vec()).await,
            Err(StreamError::InvalidBatch(_))
        ));
        let mut bad = sluice_storage::batch::encode(&[Record::new(1, "x")]).expect("batch");
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert!(matches!(
            s.produce(&t, Some(0), bad).await,
            Err(StreamError::InvalidBatch(_))
        ));
        assert!(matches!(
            s.topic(T, "nope"),
            Err(StreamError::UnknownTopic(_))
        ));
        assert!(s
            .create_topic(T, "bad/name", topic_config(1))
            .await
            .is_err());
        assert!(matches!(
            s.create_topic(T, "ticks", topic_config(3)).await,
            Err(StreamError::TopicExists(_))
        ));
    });
    b.shutdown();
}

fn small_segments(partitions: u32) -> TopicConfig {
    TopicConfig {
        partitions,
        segment_bytes: Some(16 * 1024),
        ..TopicConfig::default()
    }
}

#[test]
fn seek_by_timestamp_across_segment_boundaries() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    let b = start(tmp.path());
    b.run_on(0, |s| async move {
        let t = s
            .create_topic(T, "clock", small_segments(1))
            .await
            .expect("create");
        let body = "x".repeat(1000);
        for i in 0..200i64 {
            let r = Record::new(10_000 + i * 10, body.clone());
            s.produce_records(&t, vec![r]).await.expect("produce");
        }
        let segments = (0..2)
            .find_map(|_| s.topic_segment_count(&t, 0))
            .unwrap_or(0);
        let _ = segments; // the partition may live on the other shard; checked below by offsets
        for i in [0i64, 1, 15, 16, 17, 99, 150, 199] {
            let at = s
                .list_offset(&t, 0, OffsetSpec::Timestamp(10_000 + i * 10))
                .await
                .expect("seek");
            assert_eq!(at, i as u64, "exact timestamp {i}");
            let between = s
                .list_offset(&t, 0, OffsetSpec::Timestamp(10_000 + i * 10 - 5))
                .await
                .expect("seek");
            assert_eq!(between, i as u64, "between {} and {i}", i - 1);
            // Reading from there gives the record with that timestamp.
            let f = s
                .fetch(
                    &t,
                    0,
                    FetchRequest {
                        offset: at,
                        max_bytes: 1,
                        max_records: 1,
                        wait_ms: 0,
                    },
                )
                .await
                .expect("fetch");
            assert_eq!(
                f.records(at).expect("records")[0].record.timestamp_ms,
                10_000 + i * 10
            );
        }
        assert_eq!(
            s.list_offset(&t, 0, OffsetSpec::Timestamp(1 << 40))
                .await
                .expect("seek"),
            200,
            "past the newest record: the end"
        );
        assert_eq!(
            s.list_offset(&t, 0, OffsetSpec::Earliest)
                .await
                .expect("earliest"),
            0
        );
        assert_eq!(
            s.list_offset(&t, 0, OffsetSpec::Latest)
                .await
                .expect("latest"),
            200
        );
    });
    // 200 KB of records in 16 KiB segments: many segment boundaries were crossed.
    let segments: usize = (0..2)
        .map(|shard| {
            b.run_on(shard, |s| async move {
                let t = s.topic(T, "clock").expect("topic");
                s.topic_segment_count(&t, 0).unwrap_or(0)
            })
        })
        .sum();
    assert!(segments >= 8, "segments: {segments}");
    b.shutdown();
}

#[test]
fn retention_removes_old_segments_while_a_consumer_reads() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    let b = start(tmp.path());
    b.run_on(0, |s| async move {
        let mut c = small_segments(1);
        c.retention_bytes = Some(64 * 1024);
        s.create_topic(T, "logs", c).await.expect("create");
    });
    let done = Arc::new(AtomicBool::new(false));
    std::thread::scope(|scope| {
        let (b, done2) = (&b, done.clone());
        let reader = scope.spawn(move || {
            b.run_on(1, move |s| async move {
                let t = s.topic(T, "logs").expect("topic");
                let (mut at, mut read, mut resets) = (0u64, 0u64, 0u32);
                let deadline = Instant::now() + Duration::from_secs(30);
                while Instant::now() < deadline {
                    let req = FetchRequest {
                        offset: at,
                        max_bytes: 8 * 1024,
                        max_records: 20,
                        wait_ms: 100,
                    };
                    match s.fetch(&t, 0, req).await {
                        Ok(f) => {
                            let recs = f.records(at).expect("verified records");
                            if recs.is_empty() && done2.load(Ordering::SeqCst) {
                                return (read, resets, at);
                            }
                            for r in recs {
                                assert_eq!(r.offset, at, "no gap within what is kept");
                                at += 1;
                                read += 1;
                            }
                            // A slow consumer: retention overtakes it.
                            sluice_broker::runtime::sleep(Duration::from_millis(5)).await;
                        }
                        Err(StreamError::OffsetOutOfRange { start, .. }) => {
                            assert!(start > at, "only retention moves the start");
                            at = start;
                            resets += 1;
                        }
                        Err(e) => panic!("fetch: {e}"),
                    }
                }
                panic!("reader did not finish");
            })
        });
        b.run_on(0, |s| async move {
            let t = s.topic(T, "logs").expect("topic");
            let body = "r".repeat(1000);
            for i in 0..600i64 {
                s.produce_records(&t, vec![Record::new(i, body.clone())])
                    .await
                    .expect("produce");
            }
        });
        // Let retention run at least once more after the last append.
        std::thread::sleep(Duration::from_millis(1200));
        done.store(true, Ordering::SeqCst);
        let (read, resets, at) = reader.join().expect("reader");
        assert_eq!(at, 600, "the reader reached the end");
        assert!(read > 0);
        eprintln!("reader read {read} records, reset {resets} times");
    });
    b.run_on(0, |s| async move {
        let t = s.topic(T, "logs").expect("topic");
        let start = s
            .list_offset(&t, 0, OffsetSpec::Earliest)
            .await
            .expect("earliest");
        assert!(start > 0, "old segments were deleted");
        // Whatever retention left is still whole and readable.
        let kept = read_all(&s, "logs", 0, start).await;
        assert_eq!(kept.len() as u64, 600 - start);
        let req = FetchRequest {
            offset: 0,
            max_bytes: 1024,
            max_records: 1,
            wait_ms: 0,
        };
        assert!(matches!(
            s.fetch(&t, 0, req).await,
            Err(StreamError::OffsetOutOfRange { .. })
        ));
        // ~600 KB written, 64 KiB kept (plus the active segment and one being judged).
        assert!(600 - start < 200, "kept {} records", 600 - start);
    });
    b.shutdown();
}

// ---------------------------------------------------------------- consumer groups

type Seen = Arc<Mutex<Vec<(String, u32, u64, Vec<u8>)>>>;

/// A group member as an application would write it over the service API: heartbeat, read its
/// partitions from the committed offsets, process (record in `seen`), commit. Returns after
/// `stop` or, if `die_after` is set, silently (no leave, no more heartbeats) after processing
/// that many records.
async fn member(
    s: Rc<Shard>,
    group: &'static str,
    topics: Vec<String>,
    seen: Seen,
    stop: Arc<AtomicBool>,
    die_after: Option<usize>,
) -> usize {
    let mut a = s
        .join_group(T, group, None, &topics, 600)
        .await
        .expect("join");
    let mut positions: BTreeMap<(String, u32), u64> = BTreeMap::new();
    let mut processed = 0usize;
    while !stop.load(Ordering::SeqCst) {
        match s.heartbeat_group(T, group, &a.member_id).await {
            Ok(h) => {
                if h.generation != a.generation {
                    positions.clear();
                }
                a = h;
            }
            Err(StreamError::UnknownMember(_)) => {
                a = s
                    .join_group(T, group, None, &topics, 600)
                    .await
                    .expect("rejoin");
                positions.clear();
                continue;
            }
            Err(e) => panic!("heartbeat: {e}"),
        }
        if a.partitions.is_empty() {
            sluice_broker::runtime::sleep(Duration::from_millis(20)).await;
            continue;
        }
        let committed = s.committed_offsets(T, group).await.expect("committed");
        'parts: for (topic, p) in a.partitions.clone() {
            let t = s.topic(T, &topic).expect("topic");
            let pos = match positions.get(&(topic.clone(), p)) {
                Some(o) => *o,
                None => match committed.get(&(topic.clone(), p)) {
                    Some(o) => *o,
                    None => s
                        .list_offset(&t, p, OffsetSpec::Earliest)
                        .await
                        .expect("earliest"),
                },
            };
            let f = s
                .fetch(
                    &t,
                    p,
                    FetchRequest {
                        offset: pos,
                        max_bytes: 16 * 1024,
                        max_records: 7,
                        wait_ms: 20,
                    },
                )
                .await
                .expect("fetch");
            let recs = f.records(pos).expect("records");
            let Some(last) = recs.last().map(|r| r.offset) else {
                continue;
            };
            for r in &recs {
                seen.lock().expect("seen").push((
                    topic.clone(),
                    p,
                    r.offset,
                    r.record.value.clone(),
                ));
                processed += 1;
                if die_after.is_some_and(|n| processed >= n) {
                    return processed; // killed mid-batch: no commit, no leave
                }
            }
            match s
                .commit_offsets(
                    T,
                    group,
                    &a.member_id,
                    a.generation,
                    &[(topic.clone(), p, last + 1)],
                )
                .await
            {
                Ok(()) => {
                    positions.insert((topic, p), last + 1);
                }
                Err(StreamError::StaleGeneration { .. } | StreamError::NotAssigned(_)) => {
                    positions.clear();
                    break 'parts; // rebalanced: learn the new assignment first
                }
                Err(StreamError::UnknownMember(_)) => break 'parts,
                Err(e) => panic!("commit: {e}"),
            }
        }
    }
    let _ = s.leave_group(T, group, &a.member_id).await;
    processed
}

/// Waits for `f`; on a time-out, raises `stop` first so that the members end and the failure
/// is reported instead of hanging the scope.
fn wait_until(what: &str, stop: &AtomicBool, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f() {
        if Instant::now() >= deadline {
            stop.store(true, Ordering::SeqCst);
            panic!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn produce_numbered(b: &BrokerHandle, topic: &'static str, n: usize) {
    b.run_on(0, move |s| async move {
        let t = s.topic(T, topic).expect("topic");
        for i in 0..n {
            s.produce_records(
                &t,
                vec![keyed(&format!("k{}", i % 13), &i.to_string(), i as i64)],
            )
            .await
            .expect("produce");
        }
    });
}

#[test]
fn two_groups_each_see_every_record_once_in_order() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    let b = start(tmp.path());
    b.run_on(0, |s| async move {
        s.create_topic(T, "feed", topic_config(4))
            .await
            .expect("create");
    });
    const N: usize = 300;
    let stop = Arc::new(AtomicBool::new(false));
    let groups: [&'static str; 2] = ["billing", "audit"];
    let seen: Vec<Seen> = groups.iter().map(|_| Seen::default()).collect();
    std::thread::scope(|scope| {
        for (gi, g) in groups.iter().enumerate() {
            for shard in 0..2 {
                let (b, seen, stop) = (&b, seen[gi].clone(), stop.clone());
                let g = *g;
                scope.spawn(move || {
                    b.run_on(shard, move |s| {
                        member(s, g, vec!["feed".into()], seen, stop, None)
                    })
                });
            }
        }
        // Both members of each group joined and the assignment settled before producing,
        // so no rebalance happens while records flow (absent failures: each seen once).
        wait_until("stable groups", &stop, || {
            groups.iter().all(|g| {
                let g = *g;
                b.run_on(0, move |s| async move {
                    s.describe_group(T, g)
                        .await
                        .expect("describe")
                        .is_some_and(|d| d.members.len() == 2)
                })
            })
        });
        std::thread::sleep(Duration::from_millis(300));
        produce_numbered(&b, "feed", N);
        wait_until("both groups read everything", &stop, || {
            seen.iter().all(|s| s.lock().expect("seen").len() >= N)
        });
        std::thread::sleep(Duration::from_millis(200));
        stop.store(true, Ordering::SeqCst);
    });
    for (gi, s) in seen.iter().enumerate() {
        let seen = s.lock().expect("seen");
        assert_eq!(
            seen.len(),
            N,
            "group {}: every record exactly once",
            groups[gi]
        );
        let mut by_p: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        for (_, p, o, _) in seen.iter() {
            by_p.entry(*p).or_default().push(*o);
        }
        for (p, offsets) in by_p {
            let expected: Vec<u64> = (0..offsets.len() as u64).collect();
            assert_eq!(
                offsets, expected,
                "group {} partition {p} in order",
                groups[gi]
            );
        }
    }
    // Lag is zero for both groups once they committed everything.
    for g in groups {
        let lag = b.run_on(
            1,
            move |s| async move { s.group_lag(T, g).await.expect("lag") },
        );
        assert_eq!(lag.len(), 4);
        assert!(lag.iter().all(|l| l.lag == 0), "{g}: {lag:?}");
    }
    b.shutdown();
}

#[test]
fn a_member_that_stops_heartbeating_loses_its_partitions_and_no_committed_record_is_skipped() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    let b = start(tmp.path());
    b.run_on(0, |s| async move {
        s.create_topic(T, "jobs", topic_config(4))
            .await
            .expect("create");
    });
    const N: usize = 400;
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Seen::default();
    std::thread::scope(|scope| {
        // Records keep coming while the members work, so the doomed one surely reaches its
        // 60th record whatever the join order was.
        let b1 = &b;
        let producer = scope.spawn(move || {
            b1.run_on(1, |s| async move {
                let t = s.topic(T, "jobs").expect("topic");
                for i in 0..N {
                    s.produce_records(
                        &t,
                        vec![keyed(&format!("k{}", i % 13), &i.to_string(), i as i64)],
                    )
                    .await
                    .expect("produce");
                    sluice_broker::runtime::sleep(Duration::from_millis(2)).await;
                }
            })
        });
        let (b2, seen2, stop2) = (&b, seen.clone(), stop.clone());
        let doomed = scope.spawn(move || {
            b2.run_on(0, move |s| {
                member(s, "workers", vec!["jobs".into()], seen2, stop2, Some(60))
            })
        });
        let (b3, seen3, stop3) = (&b, seen.clone(), stop.clone());
        let survivor = scope.spawn(move || {
            b3.run_on(1, move |s| {
                member(s, "workers", vec!["jobs".into()], seen3, stop3, None)
            })
        });
        producer.join().expect("producer");
        assert_eq!(doomed.join().expect("doomed"), 60);
        // The dead member's session (600 ms) expires; the survivor gets every partition and
        // reads on from the last committed offsets.
        wait_until("the survivor reads everything", &stop, || {
            let seen = seen.lock().expect("seen");
            let distinct: std::collections::BTreeSet<(u32, u64)> =
                seen.iter().map(|(_, p, o, _)| (*p, *o)).collect();
            distinct.len() >= N
        });
        stop.store(true, Ordering::SeqCst);
        assert!(survivor.join().expect("survivor") > 0);
    });
    let seen = seen.lock().expect("seen");
    // Every offset of every partition was processed at least once: nothing skipped.
    let ends = b.run_on(0, |s| async move {
        let t = s.topic(T, "jobs").expect("topic");
        let mut ends = Vec::new();
        for p in 0..4 {
            ends.push(
                s.list_offset(&t, p, OffsetSpec::Latest)
                    .await
                    .expect("latest"),
            );
        }
        ends
    });
    assert_eq!(ends.iter().sum::<u64>(), N as u64);
    for (p, end) in ends.iter().enumerate() {
        for o in 0..*end {
            assert!(
                seen.iter()
                    .any(|(_, sp, so, _)| *sp == p as u32 && *so == o),
                "partition {p} offset {o} was skipped"
            );
        }
    }
    let dupes = seen.len() - N;
    eprintln!("{dupes} records processed twice (after the dead member's last commit)");
    assert!(
        dupes <= 60,
        "duplicates only from the dead member's uncommitted work"
    );
    b.shutdown();
}

#[test]
fn restart_keeps_topics_data_and_group_commits() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    let generation = {
        let b = start(tmp.path());
        let g = b.run_on(1, |s| async move {
            let mut c = topic_config(3);
            c.retention_ms = Some(3_600_000);
            let t = s.create_topic(T, "keep", c).await.expect("create");
            s.create_topic(T, "gone", topic_config(1))
                .await
                .expect("create");
            let gone = s.topic(T, "gone").expect("gone");
            s.delete_topic(&gone).await.expect("delete");
            for i in 0..30 {
                s.produce_records(&t, vec![keyed(&format!("k{i}"), &i.to_string(), i)])
                    .await
                    .expect("produce");
            }
            let a = s
                .join_group(T, "g", None, &["keep".to_string()], 10_000)
                .await
                .expect("join");
            let offsets: Vec<(String, u32, u64)> = (0..3)
                .map(|p| ("keep".to_string(), p, 2 + u64::from(p)))
                .collect();
            s.commit_offsets(T, "g", &a.member_id, a.generation, &offsets)
                .await
                .expect("commit");
            a.generation
        });
        b.shutdown();
        g
    };
    let b = start(tmp.path());
    b.run_on(0, move |s| async move {
        let t = s.topic(T, "keep").expect("topic survives");
        assert_eq!(t.config.partitions, 3);
        assert_eq!(t.config.retention_ms, Some(3_600_000));
        assert!(matches!(
            s.topic(T, "gone"),
            Err(StreamError::UnknownTopic(_))
        ));
        let mut values = Vec::new();
        for p in 0..3 {
            for (_, r) in read_all(&s, "keep", p, 0).await {
                values.push(
                    String::from_utf8(r.value)
                        .expect("utf8")
                        .parse::<u32>()
                        .expect("n"),
                );
            }
        }
        values.sort_unstable();
        assert_eq!(values, (0..30).collect::<Vec<_>>());
        let committed = s.committed_offsets(T, "g").await.expect("committed");
        for p in 0..3 {
            assert_eq!(
                committed.get(&("keep".to_string(), p)),
                Some(&(2 + u64::from(p)))
            );
        }
        // The old member is gone; a new one gets a higher generation and can commit.
        let a = s
            .join_group(T, "g", None, &["keep".to_string()], 10_000)
            .await
            .expect("join");
        assert!(a.generation > generation);
        // A commit is accepted from the member that owns the partition, whatever generation
        // it names (the hand-over rule in `stream::group`); a member the group does not know
        // cannot commit, with the old generation or any other.
        assert!(matches!(
            s.commit_offsets(T, "g", "gone", generation, &[("keep".into(), 0, 9)])
                .await,
            Err(StreamError::UnknownMember(_))
        ));
        s.commit_offsets(T, "g", &a.member_id, a.generation, &[("keep".into(), 0, 9)])
            .await
            .expect("commit");
        let lag = s.group_lag(T, "g").await.expect("lag");
        let l0 = lag.iter().find(|l| l.partition == 0).expect("p0");
        assert_eq!(l0.lag, l0.latest - 9);
    });
    b.shutdown();
}

// ---------------------------------------------------------------- the unified model

#[test]
fn a_queue_read_as_a_stream_sees_every_message_and_leaves_leases_alone() {
    use sluice_broker::engine::{ReceiveRequest, SendRequest};
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    let b = start(tmp.path());
    b.run_on(1, |s| async move {
        let q = s
            .create_queue(T, "work", BTreeMap::new(), BTreeMap::new())
            .await
            .expect("queue");
        for i in 0..10 {
            s.send(
                &q,
                SendRequest {
                    body: format!("m{i}"),
                    attributes: Vec::new(),
                    delay_s: None,
                    group_id: None,
                    dedup_id: None,
                },
            )
            .await
            .expect("send");
        }
        let leased = s
            .receive(
                &q,
                ReceiveRequest {
                    max_messages: 3,
                    visibility_timeout_s: Some(60),
                    attempt_id: None,
                },
                0,
            )
            .await
            .expect("receive");
        assert_eq!(leased.len(), 3);
        let before = s.queue_counters(&q).await.expect("counters");
        let mut bodies = Vec::new();
        let mut next = vec![0u64; q.partitions as usize];
        for p in 0..q.partitions {
            let f = s
                .fetch_queue_stream(
                    &q,
                    p,
                    FetchRequest {
                        offset: 0,
                        max_bytes: 1 << 20,
                        max_records: 100,
                        wait_ms: 0,
                    },
                )
                .await
                .expect("stream read");
            let offsets: Vec<u64> = f.records.iter().map(|r| r.offset).collect();
            assert!(offsets.windows(2).all(|w| w[0] < w[1]), "in log order");
            bodies.extend(
                f.records
                    .into_iter()
                    .map(|r| String::from_utf8(r.record.value).expect("utf8")),
            );
            next[p as usize] = f.next_offset;
        }
        bodies.sort();
        let mut expected: Vec<String> = (0..10).map(|i| format!("m{i}")).collect();
        expected.sort();
        assert_eq!(bodies, expected, "every message, leased or not");
        let after = s.queue_counters(&q).await.expect("counters");
        assert_eq!(
            (before.visible, before.in_flight),
            (after.visible, after.in_flight),
            "reading the log touched no lease"
        );
        assert_eq!((after.visible, after.in_flight), (7, 3));
        // A long-polling stream read at the end wakes on the next send.
        let (s2, q2) = (s.clone(), q.clone());
        sluice_broker::runtime::spawn(async move {
            sluice_broker::runtime::sleep(Duration::from_millis(200)).await;
            s2.send(
                &q2,
                SendRequest {
                    body: "late".into(),
                    attributes: Vec::new(),
                    delay_s: None,
                    group_id: None,
                    dedup_id: None,
                },
            )
            .await
            .expect("send");
        });
        let started = Instant::now();
        let waits = (0..q.partitions).map(|p| {
            let (s, q) = (s.clone(), q.clone());
            let at = next[p as usize];
            Box::pin(async move {
                s.fetch_queue_stream(
                    &q,
                    p,
                    FetchRequest {
                        offset: at,
                        max_bytes: 1 << 20,
                        max_records: 10,
                        wait_ms: 5_000,
                    },
                )
                .await
                .expect("long poll")
            })
        });
        let (got, _, _) = futures::future::select_all(waits).await;
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "woken by the send"
        );
        assert_eq!(got.records.len(), 1);
        assert_eq!(got.records[0].record.value, b"late");
    });
    // A consumer group reads the queue as a stream (`queue:<name>`), commits, and has no lag.
    b.run_on(0, |s| async move {
        let q = s.queue(T, "work").expect("queue");
        let topic = "queue:work".to_string();
        let a = s
            .join_group(T, "audit", None, std::slice::from_ref(&topic), 10_000)
            .await
            .expect("join a queue");
        assert_eq!(a.partitions.len(), q.partitions as usize);
        let mut bodies = Vec::new();
        for (_, p) in &a.partitions {
            let f = s
                .fetch_queue_stream(
                    &q,
                    *p,
                    FetchRequest {
                        offset: 0,
                        max_bytes: 1 << 20,
                        max_records: 100,
                        wait_ms: 0,
                    },
                )
                .await
                .expect("read");
            bodies.extend(f.records.iter().map(|r| r.record.value.clone()));
            s.commit_offsets(
                T,
                "audit",
                &a.member_id,
                a.generation,
                &[(topic.clone(), *p, f.next_offset)],
            )
            .await
            .expect("commit");
        }
        assert_eq!(bodies.len(), 11, "every message of the queue, once");
        let lag = s.group_lag(T, "audit").await.expect("lag");
        assert_eq!(lag.len(), q.partitions as usize);
        assert!(lag.iter().all(|l| l.lag == 0), "{lag:?}");
        assert!(matches!(
            s.join_group(T, "audit", None, &["queue:nope".to_string()], 10_000)
                .await,
            Err(StreamError::UnknownTopic(_))
        ));
    });
    b.shutdown();
}

/// A consumer behind the tail reads ahead: after a restart (nothing cached, every read from
/// disk), fetches that come back full start the read of the next window, the next fetch takes
/// it, and what it gets is exactly what was written, in order.
#[test]
fn a_consumer_behind_the_tail_is_served_from_reads_ahead_with_every_record_intact() {
    let _one = ONE_BROKER.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().expect("tmp");
    const BATCHES: usize = 40;
    const PER_BATCH: usize = 4;
    let value = |i: usize| format!("{i:08}-{}", "x".repeat(8 * 1024));
    {
        let b = start(tmp.path());
        b.run_on(0, move |s| async move {
            let t = s
                .create_topic(T, "behind", topic_config(1))
                .await
                .expect("create");
            for n in 0..BATCHES {
                let batch = (0..PER_BATCH)
                    .map(|k| {
                        let i = n * PER_BATCH + k;
                        keyed("k", &value(i), i as i64)
                    })
                    .collect();
                s.produce_records(&t, batch).await.expect("produce");
            }
        });
        b.shutdown();
    }
    let b = start(tmp.path());
    let hits = |b: &BrokerHandle| -> u64 {
        (0..2)
            .map(|shard| b.run_on(shard, |_| async { readahead::shard_stats().hits }))
            .sum()
    };
    let before = hits(&b);
    // `read_all` asks for 64 KiB a fetch: two batches of ~33 KiB, a full answer every time.
    let got = b.run_on(0, |s| async move { read_all(&s, "behind", 0, 0).await });
    assert_eq!(got.len(), BATCHES * PER_BATCH);
    for (i, (offset, r)) in got.iter().enumerate() {
        assert_eq!(*offset, i as u64);
        assert_eq!(r.value, value(i).into_bytes(), "record {i}");
    }
    let served = hits(&b) - before;
    assert!(
        served as usize >= BATCHES / 2 - 2,
        "{served} of {} fetches were served from reads ahead",
        BATCHES / 2
    );
}
