//! `sluice-perf run`: each case of each scenario file against each target (Sluice over QUIC,
//! Sluice over HTTP, the peers asked for) in the same run, with the scenario's floors, then the
//! JSON record, the Markdown report and the charts.

use crate::cpu::CpuMeter;
use crate::loadgen::{self, Mode};
use crate::report::{self, EchoFloor, FetchFloor, Missing, ScenarioRecord};
use crate::scenario::{self, Case, Scenario};
use crate::sluice::{Endpoints, InProcess, SluiceHttp, SluiceQuic};
use crate::target::{Target, TargetError};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Starts a peer broker by name in a work directory; returns a guard that stops it on drop, and
/// the peer's target. Provided by the peer adapters (`perf/src/peers/`).
pub type PeerStarter =
    fn(&str, &Path) -> Result<(Box<dyn std::any::Any>, Box<dyn Target>), TargetError>;

/// The peer adapters' starter (`perf/src/peers/`). An `Option` so that a build without peer
/// adapters reports `--peers` runs as failed instead of not compiling.
pub fn peer_starter() -> Option<PeerStarter> {
    Some(crate::peers::start)
}

/// Echo rate used when a closed-loop scenario asks for the transport floor.
const ECHO_RATE_CLOSED_PER_S: f64 = 1000.0;
/// fio's share of a run: at most this long per block size.
const FIO_SECONDS_MAX: f64 = 5.0;

pub struct RunOptions {
    pub targets: Option<Vec<String>>,
    pub peers: Vec<String>,
    pub seconds: Option<f64>,
    pub warmup_seconds: Option<f64>,
    pub seed: Option<u64>,
    pub no_floors: bool,
    /// Shards of the in-process broker (None: [`in_process_shards`]).
    pub shards: Option<usize>,
    pub work: PathBuf,
    pub out: PathBuf,
    pub sluice_quic: Option<SocketAddr>,
    pub cert: Option<PathBuf>,
    pub sluice_http: Option<SocketAddr>,
    pub sluice_kafka: Option<SocketAddr>,
}

/// Shards of the in-process broker unless `--shards` says otherwise: one per core, less the one
/// core the load generator (a tokio thread in this process) needs — at least one. The broker
/// alone gets one shard per core (`sluiced`'s default); sharing the machine with the generator,
/// a shard per core makes the shards and the generator take turns on the same cores. Measured
/// on a 2-core machine (perf README, "2026-12-05, late night"): one shard against two moved
/// publish→receive p99 at 5k msg/s from 4.8–6.1 ms to 2.7–3.2 ms, throughput from 30–32k to
/// 33–37k msg/s, and let the 82k records/s stream keep its rate.
pub fn in_process_shards() -> usize {
    machine_cores().saturating_sub(1).max(1)
}

/// Whether Sluice target `t` is measured on an external broker (`--sluice-quic` /
/// `--sluice-http`) rather than one this run starts.
fn is_external(t: &str, o: &RunOptions) -> bool {
    match t {
        "sluice-quic" => o.sluice_quic.is_some(),
        "sluice-kafka" => o.sluice_kafka.is_some(),
        _ => o.sluice_http.is_some(),
    }
}

/// Cores this process may run on.
pub fn machine_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Runs one scenario file; returns the files written.
pub fn run_file(path: &Path, o: &RunOptions) -> Result<Vec<PathBuf>, String> {
    let mut sc = scenario::load(path)?;
    apply_overrides(&mut sc, o);
    let seed = o.seed.or(sc.seed).unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    eprintln!("scenario {} (seed {seed})", sc.name);
    for c in &mut sc.cases {
        c.load.seed = seed;
    }
    let targets = o.targets.clone().unwrap_or_else(|| sc.targets.clone());
    for t in &targets {
        if !SLUICE_TARGETS.contains(&t.as_str()) {
            return Err(format!(
                "target {t:?}: Sluice targets are {}; peers go in --peers",
                SLUICE_TARGETS.join(", ")
            ));
        }
    }
    std::fs::create_dir_all(&o.work).map_err(|e| format!("{}: {e}", o.work.display()))?;
    let starter = peer_starter();
    let mut peer_names = Vec::new();
    for p in &o.peers {
        if p == "all" {
            peer_names.extend(crate::peers::NAMES.iter().map(|n| n.to_string()));
        } else if crate::peers::NAMES.contains(&p.as_str()) {
            peer_names.push(p.clone());
        } else {
            return Err(format!(
                "peer {p:?}: known peers are {} (or all)",
                crate::peers::NAMES.join(", ")
            ));
        }
    }
    let fio_floors = if sc.floors.iter().any(|f| f == "fio") && !o.no_floors {
        fio_floors(&o.work, &sc)
    } else {
        Vec::new()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    let local = tokio::task::LocalSet::new();
    let shards = o.shards.unwrap_or_else(in_process_shards);
    let mut rec = ScenarioRecord {
        kind: "scenario",
        scenario: sc.name.clone(),
        description: sc.description.clone(),
        durability: sc.durability.clone(),
        unix_time: crate::stamp(),
        machine: crate::machine(),
        // No shard count of ours when every Sluice target is an external broker.
        sluice_shards: (!targets.iter().all(|t| is_external(t, o))).then_some(shards),
        machine_cores: machine_cores(),
        seed,
        fio_floors,
        echo_floors: Vec::new(),
        fetch_floors: Vec::new(),
        runs: Vec::new(),
        skipped: Vec::new(),
        failed: Vec::new(),
    };
    local.block_on(&rt, async {
        for case in &sc.cases {
            for t in &targets {
                let ext = Endpoints {
                    quic: o.sluice_quic,
                    cert: o.cert.clone(),
                    http: o.sluice_http,
                    kafka: o.sluice_kafka,
                };
                // A fresh broker per case and target, so no run inherits another's logs.
                let broker = if is_external(t, o) {
                    None
                } else {
                    match InProcess::start(&o.work.join("sluice"), shards, t == "sluice-kafka") {
                        Ok(b) => Some(b),
                        Err(e) => {
                            rec.failed.push(miss(case, t, e));
                            continue;
                        }
                    }
                };
                let ep = broker.as_ref().map_or(ext, |b| b.endpoints.clone());
                // The in-process broker's CPU is read from its threads; an external one's is
                // not seen from here.
                let meter = broker
                    .as_ref()
                    .map(|_| CpuMeter::Threads(crate::cpu::IN_PROCESS_BROKER_THREADS));
                let target: Box<dyn Target> = match t.as_str() {
                    "sluice-quic" => {
                        let (Some(addr), Some(cert)) = (ep.quic, ep.cert.clone()) else {
                            rec.failed
                                .push(miss(case, t, "--sluice-quic needs --cert".into()));
                            continue;
                        };
                        Box::new(SluiceQuic::new(addr, cert).metered(meter))
                    }
                    "sluice-kafka" => match kafka_target(ep.kafka, meter) {
                        Ok(k) => k,
                        Err(e) => {
                            rec.failed.push(miss(case, t, e));
                            continue;
                        }
                    },
                    _ => Box::new(
                        SluiceHttp::new(ep.http.expect("set for in-process brokers"))
                            .metered(meter),
                    ),
                };
                one(&*target, case, &mut rec).await;
                drop(target);
                drop(broker);
            }
            if sc.floors.iter().any(|f| f == "quic-fetch") && !o.no_floors {
                let record = case.load.size.mean();
                let records = case.load.receive_max.max(1);
                let connections = case.load.connections.max(1);
                eprintln!(
                    "  {}: quic-fetch floor, {records} × {record} B answers on {connections} connection(s)",
                    case.name
                );
                match crate::quic_floor::run(
                    &o.work.join("quic-fetch"),
                    records * record,
                    record,
                    connections,
                    1,
                    case.load.warmup,
                    case.load.duration,
                )
                .await
                {
                    Ok(floor) => rec.fetch_floors.push(FetchFloor {
                        case: case.name.clone(),
                        floor,
                    }),
                    Err(e) => rec.failed.push(miss(case, "quic-fetch", e)),
                }
            }
            if sc.floors.iter().any(|f| f == "quinn-echo") && !o.no_floors {
                let rate = match case.load.mode {
                    Mode::Open { rate_per_s } | Mode::RoundTrip { rate_per_s } => rate_per_s,
                    Mode::Closed { .. } => ECHO_RATE_CLOSED_PER_S,
                };
                let bytes = case.load.size.mean();
                eprintln!("  {}: quinn echo floor at {rate:.0}/s", case.name);
                match crate::echo::floor(
                    &o.work.join("echo"),
                    rate,
                    bytes,
                    case.load.warmup,
                    case.load.duration,
                )
                .await
                {
                    Ok(p) => rec.echo_floors.push(EchoFloor {
                        case: case.name.clone(),
                        rate_per_s: rate,
                        bytes,
                        round_trip: p,
                    }),
                    Err(e) => rec.failed.push(miss(case, "quinn-echo", e)),
                }
            }
        }
    });
    // Peers one at a time, each started for its runs and stopped after them (so that no idle
    // peer shares the cores with another's measurement). A starter may block or run its own
    // runtime, so it runs outside ours.
    for p in &peer_names {
        let Some(start) = starter else {
            rec.failed.push(Missing {
                case: "*".into(),
                target: p.clone(),
                reason: "peer adapters are not wired into this build".into(),
            });
            continue;
        };
        eprintln!("  starting peer {p}");
        // Absolute: a peer's server runs with its own working directory and HOME under it.
        let work = std::fs::canonicalize(&o.work).unwrap_or_else(|_| o.work.clone());
        let (guard, target) = match start(p, &work) {
            Ok(started) => started,
            Err(e) => {
                rec.skipped.push(Missing {
                    case: "*".into(),
                    target: p.clone(),
                    reason: format!("could not start: {e}"),
                });
                continue;
            }
        };
        local.block_on(&rt, async {
            for case in &sc.cases {
                one(&*target, case, &mut rec).await;
            }
        });
        drop(target);
        drop(guard);
    }
    let files = report::write(&rec, &o.out)?;
    println!(
        "{}",
        report::markdown(&rec, &[])
            .split("### Checks")
            .next()
            .unwrap_or("")
    );
    for f in &files {
        eprintln!("wrote {}", f.display());
    }
    let lost: u64 = rec.runs.iter().map(|r| r.lost()).sum();
    if lost > 0 || !rec.failed.is_empty() {
        return Err(format!(
            "scenario {}: {lost} acknowledged messages not received, {} target runs failed (seed {seed}; see {})",
            sc.name,
            rec.failed.len(),
            files.get(1).map_or(String::new(), |p| p.display().to_string())
        ));
    }
    Ok(files)
}

/// The Sluice targets a scenario may name.
const SLUICE_TARGETS: &[&str] = &["sluice-quic", "sluice-http", "sluice-kafka"];

/// Sluice's Kafka listener at `addr` through librdkafka (`src/kafka.rs`).
#[cfg(feature = "kafka")]
fn kafka_target(
    addr: Option<SocketAddr>,
    meter: Option<CpuMeter>,
) -> Result<Box<dyn Target>, String> {
    let addr = addr.ok_or("no Kafka listener (--sluice-kafka ADDR for an external broker)")?;
    let k = crate::kafka::SluiceKafka::new(addr.to_string()).map_err(|e| e.to_string())?;
    Ok(Box::new(k.metered(meter)))
}

#[cfg(not(feature = "kafka"))]
fn kafka_target(
    _addr: Option<SocketAddr>,
    _meter: Option<CpuMeter>,
) -> Result<Box<dyn Target>, String> {
    Err("this sluice-perf was built without the `kafka` feature \
         (cargo run --release -p sluice-perf --features kafka)"
        .into())
}

fn miss(case: &Case, target: &str, reason: String) -> Missing {
    Missing {
        case: case.name.clone(),
        target: target.to_string(),
        reason,
    }
}

fn apply_overrides(sc: &mut Scenario, o: &RunOptions) {
    for c in &mut sc.cases {
        if let Some(s) = o.seconds {
            c.load.duration = Duration::from_secs_f64(s.clamp(0.01, 3600.0));
        }
        if let Some(w) = o.warmup_seconds {
            c.load.warmup = Duration::from_secs_f64(w.clamp(0.0, 3600.0));
        }
    }
}

fn fio_floors(work: &Path, sc: &Scenario) -> Vec<crate::fio::FioResult> {
    if !crate::fio::available() {
        eprintln!("fio not found: run perf/scripts/install-deps.sh for the disk floor");
        return Vec::new();
    }
    let secs = sc
        .cases
        .first()
        .map_or(1.0, |c| c.load.duration.as_secs_f64())
        .clamp(1.0, FIO_SECONDS_MAX)
        .ceil() as u64;
    let mut out = Vec::new();
    for bs in [4096u64, 512 * 1024] {
        eprintln!("  fio floor, {} KiB blocks, {secs} s", bs / 1024);
        match crate::fio::run(work, bs, secs) {
            Ok(r) => out.push(r),
            Err(e) => eprintln!("fio floor failed: {e}"),
        }
    }
    out
}

/// One case against one target: set up, run, tear down; the outcome goes into `rec`.
async fn one(target: &dyn Target, case: &Case, rec: &mut ScenarioRecord) {
    let name = target.name();
    if !target.supports(&case.load.shape) {
        rec.skipped.push(miss(
            case,
            &name,
            format!("no {}", loadgen::describe_shape(&case.load.shape)),
        ));
        return;
    }
    if matches!(case.load.mode, Mode::RoundTrip { .. }) && !target.receive_is_a_request() {
        rec.skipped.push(miss(
            case,
            &name,
            "round trips: its client's receive reads messages the server pushed ahead \
             (prefetch), not a request and its answer"
                .into(),
        ));
        return;
    }
    eprintln!("  {} against {name}", case.name);
    let qname = case.name.replace('_', "-");
    if let Err(e) = target.setup(&qname, &case.load.shape).await {
        rec.failed.push(miss(case, &name, format!("setup: {e}")));
        return;
    }
    match loadgen::run(target, &qname, &case.load).await {
        Ok(r) => {
            let e = &r.latency.end_to_end;
            eprintln!(
                "    sent {:.0} msg/s ({:.1} MB/s), through {:.0} msg/s, out {:.1} MB/s; publish→receive p50 {} p99 {} µs; lost {} dup {}",
                r.send_msgs_per_s,
                r.send_mb_per_s,
                r.through_msgs_per_s(),
                r.egress_mb_per_s(),
                e.p50_us,
                e.p99_us,
                r.lost(),
                r.duplicates()
            );
            rec.runs.push(r);
        }
        Err(e) => rec.failed.push(miss(case, &name, e)),
    }
    if let Err(e) = target.teardown(&qname, &case.load.shape).await {
        eprintln!("    teardown of {qname} on {name} failed: {e}");
    }
}
