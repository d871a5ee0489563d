//! Restart time: how long a broker takes to come back with a backlog on disk. The queue state
//! is a function of the log (ARCHITECTURE.md), so a restart replays every partition's log
//! before the shard serves; this measures that replay, in process (no network front end).
//!
//! A fresh broker is filled with `messages` 2 KiB messages (SendMessageBatch of 10, fsync
//! before every ack), a part of them received once (leases on disk, as a live queue has),
//! and shut down cleanly. Then it is started again on the same data directory and timed until
//! every shard is ready; the restarted broker must count the whole backlog, or the run fails.

use serde::Serialize;
use sluice_broker::engine::{BatchEntry, ReceiveRequest, SendRequest};
use sluice_broker::metadata::DEFAULT_TENANT as T;
use sluice_broker::server;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use crate::queue_bench::BODY_BYTES;

/// Concurrent senders per shard while filling.
const FILL_CLIENTS_PER_SHARD: usize = 16;
/// One message in this many is received once before the restart.
const RECEIVED_ONE_IN: u64 = 10;

#[derive(Debug, Clone, Serialize)]
pub struct RecoveryResult {
    pub shards: usize,
    /// Queues the messages are spread over (each with one partition per shard).
    pub queues: usize,
    pub messages: u64,
    pub received_before_restart: u64,
    pub body_bytes: usize,
    /// Bytes of the queues' partition directories (logs and their indexes) before the restart.
    pub log_bytes: u64,
    /// A fresh broker on an empty directory: start to ready (the fixed cost of a start).
    pub empty_start_s: f64,
    pub fill_s: f64,
    /// The same broker started again on the filled directory: start to ready.
    pub restart_s: f64,
    /// CPU time (user + system, all threads of this process) spent in that restart: near
    /// `restart_s × shards` when the replay is CPU-bound, well below when it waits for reads.
    pub restart_cpu_s: f64,
    /// `messages / (restart_s - empty_start_s)`: the replay rate, all shards together.
    pub replayed_messages_per_s: f64,
    pub replayed_mb_per_s: f64,
    pub fsync_policy: &'static str,
}

pub(crate) fn start(dir: &Path, shards: usize) -> (std::sync::Arc<server::BrokerHandle>, f64) {
    start_with(dir, crate::queue_bench::broker_config(dir, shards))
}

/// Starts an in-process broker with `config` (its data dir is `dir`); returns it and the
/// seconds from start to ready.
pub(crate) fn start_with(
    dir: &Path,
    config: sluice_broker::config::BrokerConfig,
) -> (std::sync::Arc<server::BrokerHandle>, f64) {
    debug_assert_eq!(config.data_dir, dir);
    let t = Instant::now();
    let b = server::start(config).expect("start");
    b.wait_ready().expect("ready");
    (std::sync::Arc::new(b), t.elapsed().as_secs_f64())
}

/// CPU seconds this process has used (user + system, every thread).
pub(crate) fn process_cpu_s() -> f64 {
    // SAFETY: `getrusage` only writes the struct it is given, which is zeroed and ours.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is always valid.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return f64::NAN;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

pub(crate) fn stop(b: std::sync::Arc<server::BrokerHandle>) {
    std::sync::Arc::into_inner(b)
        .expect("sole owner")
        .shutdown();
}

pub(crate) fn dir_bytes(p: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(p) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

fn queue_name(i: usize) -> String {
    format!("recovery-{i}")
}

/// The visible + in-flight + delayed messages of the queues, as the broker counts them.
fn counted(b: &server::BrokerHandle, queues: usize) -> u64 {
    b.run_on(0, move |s| async move {
        let mut n = 0;
        for i in 0..queues {
            let q = s.queue(T, &queue_name(i)).expect("queue after restart");
            let c = s.queue_counters(&q).await.expect("counters");
            n += c.visible + c.in_flight + c.delayed;
        }
        n
    })
}

/// Fills a fresh broker in `dir` (removed first and afterwards), restarts it and times the
/// restart.
pub fn run(
    dir: &Path,
    shards: usize,
    queues: usize,
    messages: u64,
) -> Result<RecoveryResult, String> {
    let _ = std::fs::remove_dir_all(dir);
    let (b, empty_start_s) = start(dir, shards);
    b.run_on(0, move |s| async move {
        for i in 0..queues {
            s.create_queue(T, &queue_name(i), BTreeMap::new(), BTreeMap::new())
                .await
                .expect("create");
        }
    });
    let fill = Instant::now();
    let per_shard = messages.div_ceil(shards as u64);
    let threads: Vec<_> = (0..shards)
        .map(|shard| {
            let b = b.clone();
            let first = shard as u64 * per_shard;
            let last = (first + per_shard).min(messages);
            std::thread::spawn(move || {
                b.run_on(shard, move |s| async move {
                    let qs: Vec<_> = (0..queues)
                        .map(|i| s.queue(T, &queue_name(i)).expect("queue"))
                        .collect();
                    let qs = std::rc::Rc::new(qs);
                    let next = std::rc::Rc::new(std::cell::Cell::new(first));
                    let mut tasks = Vec::new();
                    for _ in 0..FILL_CLIENTS_PER_SHARD {
                        let (s, qs, next) = (s.clone(), qs.clone(), next.clone());
                        tasks.push(glommio::spawn_local(async move {
                            let mut received = 0u64;
                            loop {
                                let from = next.get();
                                if from >= last {
                                    return received;
                                }
                                let to = (from + 10).min(last);
                                next.set(to);
                                let q = &qs[(from / 10) as usize % qs.len()];
                                let entries: Vec<BatchEntry> = (from..to)
                                    .map(|i| BatchEntry {
                                        id: format!("e{}", i - from),
                                        request: SendRequest {
                                            body: crate::queue_bench::body(i),
                                            attributes: Vec::new(),
                                            delay_s: None,
                                            group_id: None,
                                            dedup_id: None,
                                        },
                                    })
                                    .collect();
                                s.send_batch(q, entries).await.expect("send batch");
                                if from % (10 * RECEIVED_ONE_IN) == 0 {
                                    // Leases that outlive the restart (12 h timeout).
                                    let got = s
                                        .receive(
                                            q,
                                            ReceiveRequest {
                                                max_messages: 10,
                                                visibility_timeout_s: Some(43_200),
                                                attempt_id: None,
                                            },
                                            0,
                                        )
                                        .await
                                        .expect("receive");
                                    received += got.len() as u64;
                                }
                            }
                        }));
                    }
                    let mut received = 0;
                    for t in tasks {
                        received += t.await;
                    }
                    received
                })
            })
        })
        .collect();
    let received_before_restart: u64 = threads
        .into_iter()
        .map(|t| t.join().expect("fill thread"))
        .sum();
    let fill_s = fill.elapsed().as_secs_f64();
    let before = counted(&b, queues);
    stop(b);
    let log_bytes = dir_bytes(&dir.join("queues"));
    let cpu = process_cpu_s();
    let (b, restart_s) = start(dir, shards);
    let restart_cpu_s = process_cpu_s() - cpu;
    let after = counted(&b, queues);
    stop(b);
    let _ = std::fs::remove_dir_all(dir);
    if before != messages || after != messages {
        return Err(format!(
            "the broker counted {before} messages before the restart and {after} after; \
             {messages} were sent"
        ));
    }
    let replay_s = (restart_s - empty_start_s).max(1e-6);
    Ok(RecoveryResult {
        shards,
        queues,
        messages,
        received_before_restart,
        body_bytes: BODY_BYTES,
        log_bytes,
        empty_start_s,
        fill_s,
        restart_s,
        restart_cpu_s,
        replayed_messages_per_s: messages as f64 / replay_s,
        replayed_mb_per_s: messages as f64 * BODY_BYTES as f64 / replay_s / 1e6,
        fsync_policy: "fdatasync before every ack while filling; the restart only reads",
    })
}
