//! The log is the queue: one standard queue (or, with `fifo_groups`, one FIFO queue whose
//! messages are spread over that many groups) filled with a large backlog of 2 KiB messages,
//! the broker's memory full vs empty, restarts with that backlog (a clean stop, and a restart
//! from the periodic snapshot only, as after kill -9), and the receive+delete rate from the cold
//! backlog beside the hot path (send → receive → delete of fresh messages) in the same run.
//!
//! In process, like `recovery`: the memory figure is the whole process's (broker and load
//! generator), so it overstates the broker's.

use serde::Serialize;
use sluice_broker::engine::{BatchEntry, ReceiveRequest, SendRequest};
use sluice_broker::metadata::DEFAULT_TENANT as T;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::queue_bench::BODY_BYTES;
use crate::recovery::{dir_bytes, process_cpu_s, start_with, stop};

const CLIENTS_PER_SHARD: usize = 16;

/// The queue under test and the hot-path one.
#[derive(Debug, Clone, Copy)]
struct Shape {
    fifo_groups: Option<u64>,
}

impl Shape {
    fn backlog(self) -> &'static str {
        if self.fifo_groups.is_some() {
            "backlog.fifo"
        } else {
            "backlog"
        }
    }

    fn hot(self) -> &'static str {
        if self.fifo_groups.is_some() {
            "hot.fifo"
        } else {
            "hot"
        }
    }

    /// Message `i`'s send: FIFO ones go to group `i % groups` with their own dedup id.
    fn request(self, i: u64, hot: bool) -> SendRequest {
        let (group_id, dedup_id) = match self.fifo_groups {
            None => (None, None),
            Some(groups) => {
                let g = if hot { i / 10 } else { i % groups };
                let d = if hot {
                    format!("h{i}")
                } else {
                    format!("d{i}")
                };
                (Some(format!("group-{g}")), Some(d))
            }
        };
        SendRequest {
            body: crate::queue_bench::body(i),
            attributes: Vec::new(),
            delay_s: None,
            group_id,
            dedup_id,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct BacklogResult {
    pub shards: usize,
    /// FIFO queue with this many groups (`None`: a standard queue).
    pub fifo_groups: Option<u64>,
    /// The dedup table's bound per partition (FIFO: sized to hold every dedup id of the fill,
    /// which all stay in the 5-minute window when the fill is faster than that).
    pub dedup_entries_max: u32,
    pub messages: u64,
    pub body_bytes: usize,
    pub log_bytes: u64,
    pub fill_s: f64,
    pub sent_per_s: f64,
    /// Resident memory of the whole process (broker + generator), MiB.
    pub rss_empty_mib: f64,
    /// Three seconds after the fill: the backlog's cost, with no snapshot being written.
    pub rss_full_mib: f64,
    /// The peak during the fill (a snapshot's encoded bytes are held while it is written).
    pub rss_fill_peak_mib: f64,
    pub rss_after_restart_mib: f64,
    /// The peak during the clean restart (the snapshot's bytes and the state built from them).
    pub rss_restart_peak_mib: f64,
    pub empty_start_s: f64,
    /// Start to ready after a clean stop (snapshot at the log's end).
    pub restart_clean_s: f64,
    /// Start to ready from the last periodic snapshot (what kill -9 leaves).
    pub restart_periodic_snapshot_s: f64,
    /// Start to ready with no snapshot at all (the log replayed from its first checkpoint).
    pub restart_no_snapshot_s: f64,
    /// Receive (10) + DeleteMessageBatch from the cold backlog.
    pub cold_drained: u64,
    pub cold_drain_per_s: f64,
    pub cold_drain_cpu_us_per_msg: f64,
    /// Send (10) → receive (10) → delete (10) cycles of fresh messages on an empty queue.
    pub hot_per_s: f64,
    pub hot_cpu_us_per_msg: f64,
    pub fsync_policy: &'static str,
}

fn rss_mib() -> f64 {
    status_mib("VmRSS:")
}

/// The process's peak resident memory since it started (or since `reset_peak_rss`), MiB.
fn peak_rss_mib() -> f64 {
    status_mib("VmHWM:")
}

fn reset_peak_rss() {
    // "5" resets the peak resident set size (proc(5), /proc/pid/clear_refs).
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn status_mib(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn snapshots(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(qs) = std::fs::read_dir(dir.join("queues")) else {
        return out;
    };
    for q in qs.flatten() {
        for p in std::fs::read_dir(q.path()).into_iter().flatten().flatten() {
            let f = p.path().join("engine.snapshot");
            if f.exists() {
                out.push(f);
            }
        }
    }
    out
}

fn counted(b: &sluice_broker::server::BrokerHandle, name: &'static str) -> u64 {
    b.run_on(0, move |s| async move {
        let q = s.queue(T, name).expect("queue");
        let c = s.queue_counters(&q).await.expect("counters");
        c.visible + c.in_flight + c.delayed
    })
}

/// Sends `messages` (batches of 10) into the backlog queue, all shards' clients together.
fn fill(
    b: &std::sync::Arc<sluice_broker::server::BrokerHandle>,
    shards: usize,
    messages: u64,
    shape: Shape,
) {
    let per_shard = messages.div_ceil(shards as u64);
    let threads: Vec<_> = (0..shards)
        .map(|shard| {
            let b = b.clone();
            let first = shard as u64 * per_shard;
            let last = (first + per_shard).min(messages);
            std::thread::spawn(move || {
                b.run_on(shard, move |s| async move {
                    let q = Rc::new(s.queue(T, shape.backlog()).expect("queue"));
                    let next = Rc::new(Cell::new(first));
                    let mut tasks = Vec::new();
                    for _ in 0..CLIENTS_PER_SHARD {
                        let (s, q, next) = (s.clone(), q.clone(), next.clone());
                        tasks.push(glommio::spawn_local(async move {
                            loop {
                                let from = next.get();
                                if from >= last {
                                    return;
                                }
                                let to = (from + 10).min(last);
                                next.set(to);
                                let entries: Vec<BatchEntry> = (from..to)
                                    .map(|i| BatchEntry {
                                        id: format!("e{}", i - from),
                                        request: shape.request(i, false),
                                    })
                                    .collect();
                                for r in s.send_batch(&q, entries).await.expect("send batch") {
                                    if let Err(e) = r.1 {
                                        panic!("send never fails for backlog size: {e}");
                                    }
                                }
                            }
                        }));
                    }
                    for t in tasks {
                        t.await;
                    }
                })
            })
        })
        .collect();
    for t in threads {
        t.join().expect("fill thread");
    }
}

/// Receives and deletes (batches of 10) from `name` for `seconds` on every shard; with `send`,
/// each client first sends the 10 it then takes (the hot path). Returns messages deleted.
fn cycle(
    b: &std::sync::Arc<sluice_broker::server::BrokerHandle>,
    shards: usize,
    name: &'static str,
    seconds: f64,
    send: bool,
    shape: Shape,
) -> u64 {
    let threads: Vec<_> = (0..shards)
        .map(|shard| {
            let b = b.clone();
            std::thread::spawn(move || {
                b.run_on(shard, move |s| async move {
                    let q = Rc::new(s.queue(T, name).expect("queue"));
                    let done = Rc::new(Cell::new(0u64));
                    let end = Instant::now() + Duration::from_secs_f64(seconds);
                    let mut tasks = Vec::new();
                    for c in 0..CLIENTS_PER_SHARD {
                        let (s, q, done) = (s.clone(), q.clone(), done.clone());
                        tasks.push(glommio::spawn_local(async move {
                            let mut i = (shard * CLIENTS_PER_SHARD + c) as u64 * 1_000_000_000;
                            while Instant::now() < end {
                                if send {
                                    let entries: Vec<BatchEntry> = (0..10)
                                        .map(|k| BatchEntry {
                                            id: format!("e{k}"),
                                            request: shape.request(i + k, true),
                                        })
                                        .collect();
                                    i += 10;
                                    s.send_batch(&q, entries).await.expect("send");
                                }
                                let got = s
                                    .receive(
                                        &q,
                                        ReceiveRequest {
                                            max_messages: 10,
                                            visibility_timeout_s: Some(600),
                                            attempt_id: None,
                                        },
                                        0,
                                    )
                                    .await
                                    .expect("receive");
                                if got.is_empty() && !send {
                                    return;
                                }
                                let handles =
                                    got.iter().map(|d| s.receipt_handle(&d.receipt)).collect();
                                for r in s.delete_message_batch(&q, handles).await {
                                    r.expect("delete");
                                }
                                done.set(done.get() + got.len() as u64);
                            }
                        }));
                    }
                    for t in tasks {
                        t.await;
                    }
                    done.get()
                })
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().expect("thread")).sum()
}

pub fn run(
    dir: &Path,
    shards: usize,
    gib: f64,
    drain_seconds: f64,
    fifo_groups: Option<u64>,
) -> Result<BacklogResult, String> {
    let _ = std::fs::remove_dir_all(dir);
    let shape = Shape { fifo_groups };
    let messages = (gib * (1u64 << 30) as f64 / BODY_BYTES as f64) as u64;
    let mut config = crate::queue_bench::broker_config(dir, shards);
    if fifo_groups.is_some() {
        // Every dedup id of a fill faster than 5 minutes is still in its window at the end.
        // Groups hash to partitions unevenly: a tenth more than an even share.
        let per_partition = messages.div_ceil(shards as u64) * 11 / 10 + 10_000;
        config.limits.dedup_entries_max = config
            .limits
            .dedup_entries_max
            .max(u32::try_from(per_partition).unwrap_or(u32::MAX));
    }
    let dedup_entries_max = config.limits.dedup_entries_max;
    let start = |dir: &Path| start_with(dir, config.clone());
    let (b, empty_start_s) = start(dir);
    b.run_on(0, move |s| async move {
        for name in [shape.backlog(), shape.hot()] {
            let mut attrs = BTreeMap::new();
            if shape.fifo_groups.is_some() {
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
        }
    });
    let queue = shape.backlog();
    let rss_empty_mib = rss_mib();
    let t = Instant::now();
    fill(&b, shards, messages, shape);
    let fill_s = t.elapsed().as_secs_f64();
    let rss_fill_peak_mib = peak_rss_mib();
    // What the backlog itself costs: after the snapshot the fill's end started is written (its
    // encoded bytes are held until then, a transient the peak above includes).
    std::thread::sleep(Duration::from_secs(3));
    let rss_full_mib = rss_mib();
    if counted(&b, queue) != messages {
        return Err("the broker does not count every message sent".into());
    }
    // The periodic snapshots, as kill -9 would leave them (the clean stop writes newer ones).
    let periodic: Vec<(std::path::PathBuf, Vec<u8>)> = snapshots(dir)
        .into_iter()
        .filter_map(|p| std::fs::read(&p).ok().map(|b| (p, b)))
        .collect();
    stop(b);
    let log_bytes = dir_bytes(&dir.join("queues"));
    reset_peak_rss();
    let (b, restart_clean_s) = start(dir);
    let rss_after_restart_mib = rss_mib();
    let rss_restart_peak_mib = peak_rss_mib();
    let after = counted(&b, queue);
    stop(b);
    if after != messages {
        return Err(format!(
            "{after} messages after the restart; {messages} were sent"
        ));
    }
    for p in snapshots(dir) {
        let _ = std::fs::remove_file(p);
    }
    let (b, restart_no_snapshot_s) = start(dir);
    stop(b);
    for p in snapshots(dir) {
        let _ = std::fs::remove_file(p);
    }
    for (p, bytes) in &periodic {
        std::fs::write(p, bytes).map_err(|e| e.to_string())?;
    }
    let (b, restart_periodic_snapshot_s) = start(dir);
    let cpu = process_cpu_s();
    let t = Instant::now();
    let cold_drained = cycle(&b, shards, queue, drain_seconds, false, shape);
    let cold_s = t.elapsed().as_secs_f64();
    let cold_cpu = process_cpu_s() - cpu;
    let cpu = process_cpu_s();
    let t = Instant::now();
    let hot = cycle(&b, shards, shape.hot(), drain_seconds, true, shape);
    let hot_s = t.elapsed().as_secs_f64();
    let hot_cpu = process_cpu_s() - cpu;
    stop(b);
    let _ = std::fs::remove_dir_all(dir);
    Ok(BacklogResult {
        shards,
        fifo_groups,
        dedup_entries_max,
        messages,
        body_bytes: BODY_BYTES,
        log_bytes,
        fill_s,
        sent_per_s: messages as f64 / fill_s,
        rss_empty_mib,
        rss_full_mib,
        rss_fill_peak_mib,
        rss_after_restart_mib,
        rss_restart_peak_mib,
        empty_start_s,
        restart_clean_s,
        restart_periodic_snapshot_s,
        restart_no_snapshot_s,
        cold_drained,
        cold_drain_per_s: cold_drained as f64 / cold_s,
        cold_drain_cpu_us_per_msg: cold_cpu * 1e6 / cold_drained.max(1) as f64,
        hot_per_s: hot as f64 / hot_s,
        hot_cpu_us_per_msg: hot_cpu * 1e6 / hot.max(1) as f64,
        fsync_policy: "fdatasync before every ack (sends, receives' leases, deletes)",
    })
}

pub fn render(r: &BacklogResult) -> String {
    let queue = match r.fifo_groups {
        None => "one standard queue".to_string(),
        Some(g) => format!(
            "one FIFO queue over {g} groups (dedup table bound {} per partition, to hold the \
             fill's dedup ids)",
            r.dedup_entries_max
        ),
    };
    format!(
        "## A backlog in the log, in process\n\n\
         {} shards; {queue} filled with {} messages of {} B ({:.2} GiB of queue \
         logs) in {:.1} s ({:.0} msg/s sent); {}.\n\n\
         | | value |\n|---|---|\n\
         | RSS, empty → full → after restart (whole process, MiB) | {:.0} → {:.0} → {:.0} |\n\
         | peak RSS during the fill / the clean restart (MiB) | {:.0} / {:.0} |\n\
         | start to ready: empty dir / clean stop / periodic snapshot (kill -9) / no snapshot (s) | {:.2} / {:.2} / {:.2} / {:.2} |\n\
         | receive+delete from the cold backlog (msg/s, CPU µs/msg) | {:.0} ({:.1}) |\n\
         | hot path send→receive→delete (msg/s, CPU µs/msg) | {:.0} ({:.1}) |\n\
         | cold ÷ hot | {:.2} |\n",
        r.shards,
        r.messages,
        r.body_bytes,
        r.log_bytes as f64 / (1u64 << 30) as f64,
        r.fill_s,
        r.sent_per_s,
        r.fsync_policy,
        r.rss_empty_mib,
        r.rss_full_mib,
        r.rss_after_restart_mib,
        r.rss_fill_peak_mib,
        r.rss_restart_peak_mib,
        r.empty_start_s,
        r.restart_clean_s,
        r.restart_periodic_snapshot_s,
        r.restart_no_snapshot_s,
        r.cold_drain_per_s,
        r.cold_drain_cpu_us_per_msg,
        r.hot_per_s,
        r.hot_cpu_us_per_msg,
        r.cold_drain_per_s / r.hot_per_s.max(1e-9),
    )
}
