//! `sluice-perf`: the perf suite. Each subcommand measures one thing beside its floor (and,
//! where the scenario has one, its peers) in the same run, and writes a JSON record and a
//! Markdown report under `perf/results/`.

/// The broker's allocator (see `sluiced`'s main): most scenarios run the broker in process.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod backlog;
mod capacity;
mod clock;
mod cpu;
mod echo;
mod fetch_probe;
mod fio;
mod http_vs_quic;
#[cfg(feature = "kafka")]
mod kafka;
mod loadgen;
mod peers;
mod queue_bench;
mod quic_floor;
mod recovery;
mod report;
mod run;
mod scenario;
mod sluice;
mod sqs_http;
mod storage_bench;
#[allow(dead_code)] // AckToken::Bytes and ::None are for the peer adapters
mod target;

use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "sluice-perf", about = "Sluice perf suite")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Storage engine: group-commit appends of fixed-size records at several concurrency
    /// levels, beside fio's O_DIRECT + fdatasync floor on the same disk.
    Storage {
        /// Directory on the disk under test.
        #[arg(long, default_value = "perf/work")]
        dir: PathBuf,
        /// Measured seconds per concurrency level (after warm-up).
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        #[arg(long, default_value_t = 1.0)]
        warmup_seconds: f64,
        #[arg(long, default_value_t = 2048)]
        record_bytes: usize,
        /// Records per append (one batch): 1 measures per-append cost, 256 (512 KiB batches
        /// of 2 KiB records, as a stream producer sends) the bandwidth the engine reaches.
        /// Each batch is encoded once up front, as a producer would send it; every append
        /// clones it (the copy out of the network buffer) and the log verifies and commits it.
        #[arg(long, default_value_t = 1)]
        records_per_append: usize,
        #[arg(long, value_delimiter = ',', default_value = "1,4,16,64,256")]
        concurrency: Vec<usize>,
        /// Skip the fio floor.
        #[arg(long)]
        no_fio: bool,
        /// Where to write results (JSON and Markdown).
        #[arg(long, default_value = "perf/results")]
        out: PathBuf,
    },
    /// Queue cycles (send → receive → delete) through the broker's shards in process: 1 and 2
    /// shards, standard and FIFO (1, 100, 10,000 groups), batch 1 and 10, 2 KiB bodies, beside
    /// the disk's fdatasync rate (fio) in the same run.
    Queue {
        #[arg(long, default_value = "perf/work")]
        dir: PathBuf,
        /// Measured seconds per scenario.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        #[arg(long, default_value_t = 32)]
        clients_per_shard: usize,
        /// Run only the first N scenarios of the matrix.
        #[arg(long)]
        limit: Option<usize>,
        #[arg(long)]
        no_fio: bool,
        #[arg(long, default_value = "perf/results")]
        out: PathBuf,
    },
    /// Restart time: fills a fresh in-process broker with a backlog of 2 KiB messages (one in
    /// ten received once), restarts it on the same directory and times the replay of its logs
    /// until every shard is ready.
    Recovery {
        #[arg(long, default_value = "perf/work/recovery")]
        dir: PathBuf,
        /// Messages in the backlog.
        #[arg(long, default_value_t = 500_000)]
        messages: u64,
        /// Shards (and partitions of each queue).
        #[arg(long, default_value_t = 2)]
        shards: usize,
        /// Queues the backlog is spread over.
        #[arg(long, default_value_t = 1)]
        queues: usize,
        #[arg(long, default_value = "perf/results")]
        out: PathBuf,
    },
    /// The log is the queue: fills one standard queue with a backlog of 2 KiB messages
    /// (default 20 GiB), reports memory full vs empty, restart times (clean stop, periodic
    /// snapshot as after kill -9, no snapshot) and the cold-backlog receive+delete rate beside
    /// the hot path, in one run.
    Backlog {
        #[arg(long, default_value = "perf/work/backlog")]
        dir: PathBuf,
        /// Backlog size in GiB of bodies.
        #[arg(long, default_value_t = 20.0)]
        gib: f64,
        #[arg(long, default_value_t = 2)]
        shards: usize,
        /// Seconds of cold drain, then as many of the hot path.
        #[arg(long, default_value_t = 20.0)]
        drain_seconds: f64,
        /// A FIFO queue with its messages spread over this many groups instead of a standard
        /// queue (results as `backlog-fifo`).
        #[arg(long)]
        fifo_groups: Option<u64>,
        #[arg(long, default_value = "perf/results")]
        out: PathBuf,
    },
    /// SendMessageBatch → ReceiveMessage → DeleteMessageBatch (10 × 2 KiB) through the SQS HTTP
    /// API and through the native QUIC protocol (SDK), against one in-process broker, same run.
    HttpVsQuic {
        #[arg(long, default_value = "perf/work/http-vs-quic")]
        dir: PathBuf,
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// Concurrent workers per path.
        #[arg(long, default_value_t = 32)]
        workers: usize,
        #[arg(long, default_value = "perf/results")]
        out: PathBuf,
    },
    /// The QUIC floor of a consume: a plain quinn server answers small requests with
    /// `--records` × `--record-bytes` from memory (a fetch's answer without the broker);
    /// records/s and the server thread's CPU per record.
    QuicFloor {
        #[arg(long, default_value = "perf/work/quic-floor")]
        dir: PathBuf,
        #[arg(long, default_value_t = 1000)]
        records: usize,
        #[arg(long, default_value_t = 2048)]
        record_bytes: usize,
        #[arg(long, default_value_t = 4)]
        connections: usize,
        /// Requests outstanding per connection.
        #[arg(long, default_value_t = 1)]
        in_flight: usize,
        #[arg(long, default_value_t = 1.0)]
        warmup_seconds: f64,
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        #[arg(long, default_value = "perf/results")]
        out: PathBuf,
    },
    /// Where one fetch's time goes: a broker in process holds one partition of `--records` ×
    /// `--record-bytes` (its tail cache), one client fetches all of it, one fetch at a time,
    /// for each `--windows` (the client's QUIC stream receive window, bytes); call and SDK
    /// decode times.
    FetchProbe {
        #[arg(long, default_value = "perf/work/fetch-probe")]
        dir: PathBuf,
        #[arg(long, default_value_t = 1000)]
        records: usize,
        #[arg(long, default_value_t = 2048)]
        record_bytes: usize,
        #[arg(long, default_value_t = 50)]
        fetches: usize,
        #[arg(long, value_delimiter = ',', default_value = "1250000,10813440")]
        windows: Vec<u32>,
        #[arg(long, default_value = "perf/results")]
        out: PathBuf,
    },
    /// Runs scenario files (perf/scenarios/*.toml): each case against each target in the same
    /// run, with the scenario's floors; writes JSON, a Markdown report and SVG charts.
    Run {
        /// Scenario files.
        #[arg(required = true)]
        scenarios: Vec<PathBuf>,
        /// Sluice targets to run (default: the scenario's): sluice-quic, sluice-http,
        /// sluice-kafka (topics through librdkafka; needs the `kafka` feature).
        #[arg(long, value_delimiter = ',')]
        targets: Option<Vec<String>>,
        /// Peers to start and run in the same run, one at a time: nats-jetstream, rabbitmq-quorum,
        /// redis-always, redis-everysec, or all.
        #[arg(long, value_delimiter = ',')]
        peers: Vec<String>,
        /// Measured seconds per case (overrides the scenario's duration_s).
        #[arg(long)]
        seconds: Option<f64>,
        /// Warm-up seconds per case (overrides the scenario's warmup_s).
        #[arg(long)]
        warmup_seconds: Option<f64>,
        /// Seed for sizes, keys and arrivals (overrides the scenario's).
        #[arg(long)]
        seed: Option<u64>,
        /// Skip the scenario's floors (fio, quinn echo).
        #[arg(long)]
        no_floors: bool,
        /// Shards (and partitions per queue) of the in-process broker [default: one per core
        /// less one, at least one: the load generator runs in this process and needs a core].
        #[arg(long)]
        shards: Option<usize>,
        /// An external broker's QUIC address instead of an in-process one (needs --cert).
        #[arg(long)]
        sluice_quic: Option<std::net::SocketAddr>,
        /// The external broker's certificate (PEM).
        #[arg(long)]
        cert: Option<PathBuf>,
        /// An external broker's SQS HTTP address.
        #[arg(long)]
        sluice_http: Option<std::net::SocketAddr>,
        /// An external broker's Kafka address.
        #[arg(long)]
        sluice_kafka: Option<std::net::SocketAddr>,
        #[arg(long, default_value = "perf/work/run")]
        work: PathBuf,
        #[arg(long, default_value = "perf/results")]
        out: PathBuf,
    },
    /// The capacity model: cores, nodes, disks, network and S3 for the seed load, from the
    /// newest measured figures in perf/results (or the ones given).
    Capacity {
        #[arg(long, default_value = "perf/results")]
        results: PathBuf,
        #[command(flatten)]
        load: capacity::Load,
    },
}

fn stamp() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn write_results(out: &std::path::Path, kind: &str, json: serde_json::Value, report: &str) {
    let text = serde_json::to_string_pretty(&json).expect("json");
    let stamp = json["unix_time"].as_u64().unwrap_or_else(stamp);
    let jpath = report::write_json(out, kind, stamp, &text).expect("write json");
    let md = out.join(format!("{kind}-latest.md"));
    std::fs::write(&md, report).expect("write report");
    eprintln!("wrote {} and {}", jpath.display(), md.display());
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    format!("{} cores, {cpu}", run::machine_cores())
}

fn main() {
    let cli = Cli::parse();
    // As the broker does (`sluice_storage::rt::disable_transparent_huge_pages` says why): the
    // generator and an in-process broker both allocate and free megabyte buffers.
    if let Err(e) = sluice_storage::rt::disable_transparent_huge_pages() {
        eprintln!("sluice-perf: could not turn transparent huge pages off: {e}");
    }
    match cli.cmd {
        Cmd::Run {
            scenarios,
            targets,
            peers,
            seconds,
            warmup_seconds,
            seed,
            no_floors,
            shards,
            sluice_quic,
            cert,
            sluice_http,
            sluice_kafka,
            work,
            out,
        } => {
            let o = run::RunOptions {
                targets,
                peers,
                seconds,
                warmup_seconds,
                seed,
                no_floors,
                shards,
                work,
                out,
                sluice_quic,
                cert,
                sluice_http,
                sluice_kafka,
            };
            let mut failures = Vec::new();
            for sc in &scenarios {
                if let Err(e) = run::run_file(sc, &o) {
                    eprintln!("error: {e}");
                    failures.push(e);
                }
            }
            if !failures.is_empty() {
                std::process::exit(1);
            }
        }
        Cmd::Capacity { results, load } => match capacity::run(&results, &load) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(2);
            }
        },
        Cmd::Storage {
            dir,
            seconds,
            warmup_seconds,
            record_bytes,
            records_per_append,
            concurrency,
            no_fio,
            out,
        } => {
            std::fs::create_dir_all(&dir).expect("create bench dir");
            std::fs::create_dir_all(&out).expect("create results dir");
            let mut floors = Vec::new();
            if !no_fio {
                if fio::available() {
                    for bs in [4096u64, 512 * 1024] {
                        match fio::run(&dir, bs, seconds.ceil() as u64) {
                            Ok(r) => floors.push(r),
                            Err(e) => eprintln!("fio floor failed: {e}"),
                        }
                    }
                } else {
                    eprintln!("fio not found: run perf/scripts/install-deps.sh for the disk floor");
                }
            }
            let mut results = Vec::new();
            for c in concurrency {
                match storage_bench::run(
                    dir.clone(),
                    c,
                    record_bytes,
                    records_per_append.max(1),
                    seconds,
                    warmup_seconds,
                ) {
                    Ok(r) => {
                        eprintln!(
                            "c={:<4} {:>9.0} appends/s {:>7.1} MB/s  p50 {:>6.0} µs  p99 {:>6.0} µs  p99.9 {:>6.0} µs  {:.1} batches/commit",
                            r.concurrency, r.appends_per_s, r.mb_per_s, r.p50_us, r.p99_us, r.p999_us, r.batches_per_commit
                        );
                        results.push(r);
                    }
                    Err(e) => eprintln!("storage bench c={c} failed: {e}"),
                }
            }
            let report = render_storage(&floors, &results, record_bytes, records_per_append);
            println!("{report}");
            let json = serde_json::json!({
                "kind": "storage",
                "unix_time": stamp(),
                "machine": machine(),
                "record_bytes": record_bytes,
                "records_per_append": records_per_append.max(1),
                "fio_floors": floors,
                "sluice": results,
            });
            write_results(&out, "storage", json, &report);
        }
        Cmd::Queue {
            dir,
            seconds,
            clients_per_shard,
            limit,
            no_fio,
            out,
        } => {
            std::fs::create_dir_all(&dir).expect("create bench dir");
            std::fs::create_dir_all(&out).expect("create results dir");
            let floor = if !no_fio && fio::available() {
                fio::run(&dir, 4096, seconds.ceil() as u64)
                    .map_err(|e| eprintln!("fio floor failed: {e}"))
                    .ok()
            } else {
                None
            };
            let mut scenarios = queue_bench::matrix(clients_per_shard);
            if let Some(n) = limit {
                scenarios.truncate(n);
            }
            let mut results = Vec::new();
            for sc in scenarios {
                let r = queue_bench::run(&dir.join("queue-cycle"), sc, seconds);
                eprintln!(
                    "shards={} {:<18} batch={:<2} {:>9.0} cycles/s {:>7.1} MB/s",
                    r.shards, r.queue, r.batch, r.cycles_per_s, r.mb_per_s
                );
                results.push(r);
            }
            let report = render_queue(floor.as_ref(), &results);
            println!("{report}");
            let json = serde_json::json!({
                "kind": "queue",
                "unix_time": stamp(),
                "machine": machine(),
                "fio_floor_4k": floor,
                "sluice": results,
            });
            write_results(&out, "queue", json, &report);
        }
        Cmd::Recovery {
            dir,
            messages,
            shards,
            queues,
            out,
        } => {
            std::fs::create_dir_all(&out).expect("create results dir");
            let r = match recovery::run(&dir, shards, queues.max(1), messages) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("recovery: {e}");
                    std::process::exit(1);
                }
            };
            let report = render_recovery(&r);
            println!("{report}");
            let json = serde_json::json!({
                "kind": "recovery",
                "unix_time": stamp(),
                "machine": machine(),
                "sluice": r,
            });
            write_results(&out, "recovery", json, &report);
        }
        Cmd::Backlog {
            dir,
            gib,
            shards,
            drain_seconds,
            fifo_groups,
            out,
        } => {
            std::fs::create_dir_all(&out).expect("create results dir");
            let r = match backlog::run(&dir, shards.max(1), gib, drain_seconds, fifo_groups) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("backlog: {e}");
                    std::process::exit(1);
                }
            };
            let report = backlog::render(&r);
            println!("{report}");
            let kind = if fifo_groups.is_some() {
                "backlog-fifo"
            } else {
                "backlog"
            };
            let json = serde_json::json!({
                "kind": kind,
                "unix_time": stamp(),
                "machine": machine(),
                "sluice": r,
            });
            write_results(&out, kind, json, &report);
        }
        Cmd::QuicFloor {
            dir,
            records,
            record_bytes,
            connections,
            in_flight,
            warmup_seconds,
            seconds,
            out,
        } => {
            std::fs::create_dir_all(&out).expect("create results dir");
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let r = rt.block_on(quic_floor::run(
                &dir,
                records * record_bytes,
                record_bytes,
                connections,
                in_flight,
                std::time::Duration::from_secs_f64(warmup_seconds),
                std::time::Duration::from_secs_f64(seconds),
            ));
            let r = match r {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("quic-floor: {e}");
                    std::process::exit(1);
                }
            };
            let report = quic_floor::render(&r);
            println!("{report}");
            let json = serde_json::json!({
                "kind": "quic-floor",
                "unix_time": stamp(),
                "machine": machine(),
                "result": r,
            });
            write_results(&out, "quic-floor", json, &report);
        }
        Cmd::FetchProbe {
            dir,
            records,
            record_bytes,
            fetches,
            windows,
            out,
        } => {
            std::fs::create_dir_all(&out).expect("create results dir");
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let rows = match rt.block_on(fetch_probe::run(
                &dir,
                records,
                record_bytes,
                fetches.max(1),
                &windows,
            )) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("fetch-probe: {e}");
                    std::process::exit(1);
                }
            };
            let report = fetch_probe::render(&rows);
            println!("{report}");
            let json = serde_json::json!({
                "kind": "fetch-probe",
                "unix_time": stamp(),
                "machine": machine(),
                "rows": rows,
            });
            write_results(&out, "fetch-probe", json, &report);
        }
        Cmd::HttpVsQuic {
            dir,
            seconds,
            workers,
            out,
        } => {
            std::fs::create_dir_all(&out).expect("create results dir");
            let results = http_vs_quic::run(&dir, workers, seconds);
            let report = render_http_vs_quic(&results);
            println!("{report}");
            let json = serde_json::json!({
                "kind": "http-vs-quic",
                "unix_time": stamp(),
                "machine": machine(),
                "results": results,
            });
            write_results(&out, "http-vs-quic", json, &report);
        }
    }
}

fn render_http_vs_quic(results: &[http_vs_quic::PathResult]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "## SQS HTTP vs native QUIC: batch send → receive → delete\n"
    );
    let _ = writeln!(
        s,
        "Machine: {}. Batches of 10 × 2 KiB; one in-process broker; every ack after the \
         fdatasync covering it (group commit). Clients on a one-thread tokio runtime in the same \
         process.\n",
        machine()
    );
    if let [http, quic] = results {
        let _ = writeln!(
            s,
            "HTTP / QUIC throughput: **{:.0}%** (target >= 50%)\n",
            100.0 * http.messages_per_s / quic.messages_per_s
        );
    }
    let _ = writeln!(s, "| path | workers | messages/s | MB/s |");
    let _ = writeln!(s, "|---|---|---|---|");
    for r in results {
        let _ = writeln!(
            s,
            "| {} | {} | {:.0} | {:.1} |",
            r.path, r.workers, r.messages_per_s, r.mb_per_s
        );
    }
    s
}

fn render_recovery(r: &recovery::RecoveryResult) -> String {
    format!(
        "## Restart with a backlog, in process\n\n\
         Machine: {}. {} shards; {} messages of {} B in {} queue(s) ({} received once, their \
         leases on disk), {:.1} MB of queue logs. Filled in {:.1} s ({}).\n\n\
         | start to ready, empty directory | start to ready, with the backlog | CPU of that restart | replayed messages/s | replayed MB/s of bodies |\n\
         |---|---|---|---|---|\n\
         | {:.3} s | **{:.3} s** | {:.2} s | {:.0} | {:.1} |\n",
        machine(),
        r.shards,
        r.messages,
        r.body_bytes,
        r.queues,
        r.received_before_restart,
        r.log_bytes as f64 / 1e6,
        r.fill_s,
        r.fsync_policy,
        r.empty_start_s,
        r.restart_s,
        r.restart_cpu_s,
        r.replayed_messages_per_s,
        r.replayed_mb_per_s,
    )
}

fn render_queue(floor: Option<&fio::FioResult>, results: &[queue_bench::QueueResult]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "## Queue cycles: send → receive → delete, in process\n");
    let _ = writeln!(
        s,
        "Machine: {}. 2 KiB bodies; every send, receive and delete is acknowledged after the \
         fdatasync that covers it (group commit), so one cycle is three durable commits.\n",
        machine()
    );
    if let Some(f) = floor {
        let _ = writeln!(
            s,
            "Disk floor in the same run (fio, 4 KiB O_DIRECT write + fdatasync each, one job): \
             **{:.0} fdatasyncs/s** (sync p50 {:.0} µs, p99 {:.0} µs). Without group commit a \
             partition could do at most a third of that in cycles/s.\n",
            f.ops_per_s, f.sync_p50_us, f.sync_p99_us
        );
    }
    let _ = writeln!(
        s,
        "| shards | queue | batch | clients/shard | cycles/s | MB/s |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    for r in results {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.0} | {:.1} |",
            r.shards, r.queue, r.batch, r.clients_per_shard, r.cycles_per_s, r.mb_per_s
        );
    }
    s
}

fn render_storage(
    floors: &[fio::FioResult],
    results: &[storage_bench::StorageResult],
    record_bytes: usize,
    records_per_append: usize,
) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "## Storage: group-commit appends vs the disk floor\n");
    let _ = writeln!(s, "Machine: {}. Records of {record_bytes} B, {} record(s) per append, fdatasync before every ack.\n", machine(), records_per_append.max(1));
    let bw_floor = floors.iter().map(|f| f.bandwidth_mb_s).fold(0.0, f64::max);
    let lat_floor = floors.iter().find(|f| f.block_bytes == 4096);
    if !results.is_empty() {
        let best = results.iter().map(|r| r.mb_per_s).fold(0.0, f64::max);
        let low = &results[0];
        let _ = writeln!(s, "Ratios first:\n");
        if bw_floor > 0.0 {
            let _ = writeln!(s, "- peak ingest / fio bandwidth floor: **{:.0}%** ({best:.1} of {bw_floor:.1} MB/s; target >= 80%)", 100.0 * best / bw_floor);
        }
        if let Some(f) = lat_floor {
            let _ = writeln!(s, "- p99 append at concurrency {} / fio 4 KiB fdatasync p99: **{:.2}x** ({:.0} vs {:.0} µs; target <= 1.5x)", low.concurrency, low.p99_us / f.sync_p99_us, low.p99_us, f.sync_p99_us);
        }
        let _ = writeln!(s);
    }
    let _ = writeln!(s, "| floor (fio, psync, O_DIRECT, fdatasync each write) | MB/s | ops/s | write p50 µs | sync p50 µs | sync p99 µs | sync p99.9 µs |");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    for f in floors {
        let _ = writeln!(
            s,
            "| bs {} KiB | {:.1} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
            f.block_bytes / 1024,
            f.bandwidth_mb_s,
            f.ops_per_s,
            f.write_p50_us,
            f.sync_p50_us,
            f.sync_p99_us,
            f.sync_p999_us
        );
    }
    let _ = writeln!(s, "\n| Sluice concurrency | appends/s | MB/s | p50 µs | p99 µs | p99.9 µs | max µs | commits/s | appends/commit |");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|");
    for r in results {
        let _ = writeln!(
            s,
            "| {} | {:.0} | {:.1} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.1} |",
            r.concurrency,
            r.appends_per_s,
            r.mb_per_s,
            r.p50_us,
            r.p99_us,
            r.p999_us,
            r.max_us,
            r.commits_per_s,
            r.batches_per_commit
        );
    }
    s
}
