//! Queue cycle benchmark: send → receive → delete cycles per second through the broker's shards
//! (engine + storage + cross-core routing; no network front end), 2 KiB bodies, fsync before
//! every ack. Standard and FIFO (1, 100, 10,000 groups), batch 1 and 10, on 1 and 2 shards.
//!
//! Run: `cargo bench -p sluice-broker --bench queue_cycle [-- --seconds 5 --quick]`.
//! Prints a Markdown table; no assertions (figures, not tests).

use sluice_broker::config::BrokerConfig;
use sluice_broker::engine::{BatchEntry, ReceiveRequest, SendRequest};
use sluice_broker::metadata::DEFAULT_TENANT as T;
use sluice_broker::server;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug)]
struct Scenario {
    shards: usize,
    fifo_groups: Option<u32>,
    batch: u32,
    clients_per_shard: usize,
}

fn body(i: u64) -> String {
    let mut s = format!("{i:016}");
    s.push_str(&"x".repeat(2048 - 16));
    s
}

fn run(dir: &std::path::Path, sc: Scenario, seconds: f64) -> (f64, f64) {
    let _ = std::fs::remove_dir_all(dir);
    let mut c = BrokerConfig::embedded(dir.to_path_buf()).expect("config");
    c.shards = sc.shards;
    c.default_partitions = sc.shards as u32;
    c.cpus = (0..sc.shards).collect();
    let b = std::sync::Arc::new(server::start(c).expect("start"));
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
                                    s.delete_message_batch(&q, &handles)
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
    (
        total as f64 / elapsed,
        total as f64 * 2048.0 / elapsed / 1e6,
    )
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seconds = args
        .iter()
        .position(|a| a == "--seconds")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(5.0);
    let quick = args.iter().any(|a| a == "--quick");
    let dir = std::path::PathBuf::from("perf/work/queue-cycle");
    let mut scenarios = Vec::new();
    for shards in [1usize, 2] {
        for fifo in [None, Some(1u32), Some(100), Some(10_000)] {
            for batch in [1u32, 10] {
                scenarios.push(Scenario {
                    shards,
                    fifo_groups: fifo,
                    batch,
                    clients_per_shard: 32,
                });
            }
        }
    }
    if quick {
        scenarios.truncate(2);
    }
    println!("Queue cycles (send → receive → delete), 2 KiB bodies, fsync before every ack, in-process (no front end)\n");
    println!("| shards | queue | batch | clients/shard | msg/s | MB/s |");
    println!("|---|---|---|---|---|---|");
    for sc in scenarios {
        let (rate, mbs) = run(&dir, sc, seconds);
        let kind = match sc.fifo_groups {
            None => "standard".to_string(),
            Some(g) => format!("FIFO, {g} groups"),
        };
        println!(
            "| {} | {kind} | {} | {} | {rate:.0} | {mbs:.1} |",
            sc.shards, sc.batch, sc.clients_per_shard
        );
    }
}
