//! Queue cycles: send → receive → delete per second through the broker's shards, in process
//! (engine + storage + cross-core routing; no network front end — the SDK and HTTP scenarios
//! measure those), 2 KiB bodies, fsync before every ack. The engine's own CPU cost per message
//! is `cargo bench -p sluice-broker --bench engine`.

use serde::Serialize;
use sluice_broker::config::BrokerConfig;
use sluice_broker::engine::{BatchEntry, ReceiveRequest, SendRequest};
use sluice_broker::metadata::DEFAULT_TENANT as T;
use sluice_broker::server;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

pub const BODY_BYTES: usize = 2048;

#[derive(Clone, Copy, Debug)]
pub struct Scenario {
    pub shards: usize,
    /// `None`: a standard queue; `Some(g)`: FIFO with `g` message groups.
    pub fifo_groups: Option<u32>,
    /// Messages per send, receive and delete call (1: single calls; 10: batch calls).
    pub batch: u32,
    /// Concurrent clients per shard, each running send → receive → delete in a loop.
    pub clients_per_shard: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct QueueResult {
    pub shards: usize,
    pub queue: String,
    pub batch: u32,
    pub clients_per_shard: usize,
    pub body_bytes: usize,
    pub seconds: f64,
    pub cycles_per_s: f64,
    pub mb_per_s: f64,
    pub fsync_policy: &'static str,
}

/// The scenario matrix of the queue engine issue: 1 and 2 shards; standard and FIFO with 1, 100
/// and 10,000 groups; batch 1 and 10.
pub fn matrix(clients_per_shard: usize) -> Vec<Scenario> {
    let mut v = Vec::new();
    for shards in [1usize, 2] {
        for fifo_groups in [None, Some(1u32), Some(100), Some(10_000)] {
            for batch in [1u32, 10] {
                v.push(Scenario {
                    shards,
                    fifo_groups,
                    batch,
                    clients_per_shard,
                });
            }
        }
    }
    v
}

pub(crate) fn body(i: u64) -> String {
    // 2 KiB: a 16-digit sequence number, then filler.
    let mut s = format!("{i:016}");
    s.push_str(&"x".repeat(BODY_BYTES - 16));
    s
}

/// The embedded default with `shards` shards pinned to the first cores, one partition per
/// shard for new queues, front ends off the well-known ports.
pub(crate) fn broker_config(dir: &std::path::Path, shards: usize) -> BrokerConfig {
    let mut c = BrokerConfig::ephemeral(dir.to_path_buf()).expect("config");
    c.shards = shards;
    c.default_partitions = shards as u32;
    c.cpus = (0..shards).collect();
    // In process: no front end is used, so none takes a well-known port (another broker on
    // this machine may hold it).
    c.quic_enabled = false;
    c.http_addr = "127.0.0.1:0".parse().expect("addr");
    c.metrics_addr = "127.0.0.1:0".parse().expect("addr");
    c
}

/// Runs one scenario on a fresh broker in `dir` (removed afterwards).
pub fn run(dir: &std::path::Path, sc: Scenario, seconds: f64) -> QueueResult {
    let _ = std::fs::remove_dir_all(dir);
    let b = std::sync::Arc::new(server::start(broker_config(dir, sc.shards)).expect("start"));
    b.wait_ready().expect("ready");
    let name = if sc.fifo_groups.is_some() {
        "bench.fifo"
    } else {
        "bench"
    };
    b.run_on(0, move |s| async move {
        let mut attrs = BTreeMap::new();
        if sc.fifo_groups.is_some() {
            // Per-group dedup ids are given explicitly below; high-throughput FIFO settings.
            attrs.insert("FifoQueue".to_string(), "true".to_string());
            attrs.insert("DeduplicationScope".to_string(), "messageGroup".to_string());
            attrs.insert(
                "FifoThroughputLimit".to_string(),
                "perMessageGroupId".to_string(),
            );
        }
        s.create_queue(T, name, attrs, BTreeMap::new())
            .await
            .expect("create");
    });
    let start = Instant::now();
    let threads: Vec<_> = (0..sc.shards)
        .map(|shard| {
            let b = b.clone();
            std::thread::spawn(move || {
                b.run_on(shard, move |s| async move {
                    let q = s.queue(T, name).expect("queue");
                    let deleted = Rc::new(Cell::new(0u64));
                    let seq = Rc::new(Cell::new((shard as u64) << 40));
                    let end = Instant::now() + Duration::from_secs_f64(seconds);
                    let mut tasks = Vec::new();
                    for _ in 0..sc.clients_per_shard {
                        let (s, q, deleted, seq) =
                            (s.clone(), q.clone(), deleted.clone(), seq.clone());
                        tasks.push(glommio::spawn_local(async move {
                            while Instant::now() < end {
                                let entries: Vec<BatchEntry> = (0..sc.batch)
                                    .map(|k| {
                                        let i = seq.get();
                                        seq.set(i + 1);
                                        let group = sc
                                            .fifo_groups
                                            .map(|g| format!("g{}", i % u64::from(g)));
                                        BatchEntry {
                                            id: format!("e{k}"),
                                            request: SendRequest {
                                                body: body(i),
                                                attributes: Vec::new(),
                                                delay_s: None,
                                                dedup_id: group.as_ref().map(|_| format!("d{i}")),
                                                group_id: group,
                                            },
                                        }
                                    })
                                    .collect();
                                if sc.batch == 1 {
                                    let e = entries.into_iter().next().expect("one");
                                    s.send(&q, e.request).await.expect("send");
                                } else {
                                    s.send_batch(&q, entries).await.expect("send batch");
                                }
                                let got = s
                                    .receive(
                                        &q,
                                        ReceiveRequest {
                                            max_messages: sc.batch.max(1),
                                            visibility_timeout_s: Some(60),
                                            attempt_id: None,
                                        },
                                        0,
                                    )
                                    .await
                                    .expect("receive");
                                let handles: Vec<String> =
                                    got.iter().map(|d| s.receipt_handle(&d.receipt)).collect();
                                let ok = if handles.len() == 1 {
                                    usize::from(s.delete_message(&q, &handles[0]).await.is_ok())
                                } else {
                                    s.delete_message_batch(&q, handles)
                                        .await
                                        .iter()
                                        .filter(|r| r.is_ok())
                                        .count()
                                };
                                deleted.set(deleted.get() + ok as u64);
                            }
                        }));
                    }
                    for t in tasks {
                        t.await;
                    }
                    deleted.get()
                })
            })
        })
        .collect();
    let total: u64 = threads
        .into_iter()
        .map(|t| t.join().expect("load thread"))
        .sum();
    let elapsed = start.elapsed().as_secs_f64();
    std::sync::Arc::into_inner(b)
        .expect("sole owner")
        .shutdown();
    let _ = std::fs::remove_dir_all(dir);
    QueueResult {
        shards: sc.shards,
        queue: match sc.fifo_groups {
            None => "standard".to_string(),
            Some(g) => format!("FIFO, {g} groups"),
        },
        batch: sc.batch,
        clients_per_shard: sc.clients_per_shard,
        body_bytes: BODY_BYTES,
        seconds: elapsed,
        cycles_per_s: total as f64 / elapsed,
        mb_per_s: total as f64 * BODY_BYTES as f64 / elapsed / 1e6,
        fsync_policy: "fdatasync before every ack of send, receive and delete (group commit)",
    }
}
