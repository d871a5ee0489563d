//! A scenario run's record and report: one JSON file per run, a Markdown report with ratios
//! first (Sluice against each peer and floor), absolute figures second, and two SVG charts
//! beside it — publish→receive latency percentile curves and throughput bars.

use crate::fio::FioResult;
use crate::loadgen::{Pcts, RunResult};
use plotters::prelude::*;
use serde::Serialize;
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// A target that did not run a case, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Missing {
    pub case: String,
    pub target: String,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct EchoFloor {
    pub case: String,
    pub rate_per_s: f64,
    pub bytes: usize,
    pub round_trip: Pcts,
}

/// The `quic-fetch` floor of one case: a plain quinn server answering fetches of the case's
/// size from memory, measured right after the case's runs.
#[derive(Debug, Clone, Serialize)]
pub struct FetchFloor {
    pub case: String,
    pub floor: crate::quic_floor::QuicFloor,
}

/// Everything one `sluice-perf run` of one scenario measured.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioRecord {
    pub kind: &'static str,
    pub scenario: String,
    pub description: String,
    pub durability: String,
    pub unix_time: u64,
    pub machine: String,
    /// Broker shards of the in-process Sluice targets (`None`: every Sluice target was an
    /// external broker, whose shards are its own).
    pub sluice_shards: Option<usize>,
    /// Cores of the machine (broker, load generator and peers share them).
    pub machine_cores: usize,
    pub seed: u64,
    pub fio_floors: Vec<FioResult>,
    pub echo_floors: Vec<EchoFloor>,
    #[serde(default)]
    pub fetch_floors: Vec<FetchFloor>,
    pub runs: Vec<RunResult>,
    pub skipped: Vec<Missing>,
    pub failed: Vec<Missing>,
}

/// Each consuming run's server CPU per received record and rate against the `quic-fetch` floor.
fn fetch_floor_ratios(s: &mut String, runs: &[&RunResult], floor: &crate::quic_floor::QuicFloor) {
    for r in runs {
        if let (Some(b), Some(f)) = (r.server_cpu_us_per_received, floor.server_cpu_us_per_record) {
            let _ = writeln!(
                s,
                "- {} server CPU per consumed record / quic-fetch floor's: **{}** ({:.2} vs {:.2} µs); consumed {:.0}/s (all groups) against the floor's {:.0} records/s",
                r.target,
                ratio(b, f),
                b,
                f,
                r.received_window as f64 / r.measured_s.max(1e-9),
                floor.records_per_s
            );
        }
    }
}

fn ms(us: u64) -> String {
    let v = us as f64 / 1000.0;
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 && a.is_finite() && a / b < 0.1 {
        format!("{:.3}×", a / b)
    } else if b > 0.0 && a.is_finite() {
        format!("{:.2}×", a / b)
    } else {
        "n/a".into()
    }
}

fn is_open(r: &RunResult) -> bool {
    r.offered_rate_per_s.is_some()
}

fn is_round_trip(r: &RunResult) -> bool {
    r.mode.starts_with("round trips")
}

/// The calls of a round-trip case: (name, latency).
fn round_trip_calls(r: &RunResult) -> [(&'static str, &Pcts); 3] {
    [
        ("send", &r.latency.send_call),
        ("receive", &r.latency.receive_call),
        ("delete", &r.latency.ack_call),
    ]
}

/// Each target's send, receive and delete round trips against the transport floor (a quinn
/// echo of the same size at the same rate) and against transport plus disk (the echo's p50
/// plus fio's 4 KiB write and fdatasync p50: what a call that is durable before its answer
/// cannot go below).
fn round_trip_ratios(
    s: &mut String,
    runs: &[&RunResult],
    echo: &EchoFloor,
    fio4k: Option<&FioResult>,
) {
    let f = &echo.round_trip;
    let durable_floor_us = fio4k.map(|d| f.p50_us as f64 + d.write_p50_us + d.sync_p50_us);
    for r in runs {
        for (call, p) in round_trip_calls(r) {
            let _ = write!(
                s,
                "- {} {call} round trip / quinn echo: p50 **{}**, p99 **{}**, p99.9 **{}** ({} / {} / {} vs {} / {} / {} ms)",
                r.target,
                ratio(p.p50_us as f64, f.p50_us as f64),
                ratio(p.p99_us as f64, f.p99_us as f64),
                ratio(p.p999_us as f64, f.p999_us as f64),
                ms(p.p50_us),
                ms(p.p99_us),
                ms(p.p999_us),
                ms(f.p50_us),
                ms(f.p99_us),
                ms(f.p999_us),
            );
            match durable_floor_us {
                Some(d) => {
                    let _ = writeln!(
                        s,
                        "; p50 / (echo p50 + fio 4 KiB write and fdatasync p50): **{}** ({} vs {} ms)",
                        ratio(p.p50_us as f64, d),
                        ms(p.p50_us),
                        ms(d as u64)
                    );
                }
                None => {
                    let _ = writeln!(s);
                }
            }
        }
    }
}

/// The Markdown report. `charts` are the file names of the SVGs written beside it.
pub fn markdown(rec: &ScenarioRecord, charts: &[String]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "## Scenario `{}`\n", rec.scenario);
    if !rec.description.is_empty() {
        let _ = writeln!(s, "{}\n", rec.description);
    }
    let sluice = match rec.sluice_shards {
        Some(n) => format!(
            "Sluice in process with {n} shard(s) on {} cores",
            rec.machine_cores
        ),
        None => format!(
            "Sluice as an external broker (its shards its own) on this machine's {} cores",
            rec.machine_cores
        ),
    };
    let _ = writeln!(
        s,
        "Machine: {}. {sluice}; the load generator (one tokio thread) and the peers share the \
         same cores. Seed {}. Durability asked: {}.\n",
        rec.machine, rec.seed, rec.durability
    );
    let _ = writeln!(s, "### Ratios (same run)\n");
    let mut cases: Vec<&str> = Vec::new();
    for r in &rec.runs {
        if !cases.contains(&r.case.as_str()) {
            cases.push(&r.case);
        }
    }
    let fio_bw = rec
        .fio_floors
        .iter()
        .map(|f| f.bandwidth_mb_s)
        .fold(0.0, f64::max);
    let fio4k = rec.fio_floors.iter().find(|f| f.block_bytes == 4096);
    for case in &cases {
        let runs: Vec<&RunResult> = rec.runs.iter().filter(|r| r.case == *case).collect();
        let Some(base) = runs
            .iter()
            .find(|r| r.target == "sluice-quic")
            .or(runs.first())
        else {
            continue;
        };
        let _ = writeln!(s, "**{case}** ({}, {}):\n", base.shape, base.mode);
        for r in runs.iter().filter(|r| r.target != base.target) {
            if is_open(base) {
                let _ = writeln!(
                    s,
                    "- {} / {} publish→receive p99: **{}** ({} vs {} ms; {} / {})",
                    base.target,
                    r.target,
                    ratio(
                        base.latency.end_to_end.p99_us as f64,
                        r.latency.end_to_end.p99_us as f64
                    ),
                    ms(base.latency.end_to_end.p99_us),
                    ms(r.latency.end_to_end.p99_us),
                    base.fsync_policy,
                    r.fsync_policy
                );
                // At an offered rate, a target that falls behind shows here too.
                let _ = writeln!(
                    s,
                    "- {} / {} throughput at the offered {:.0} msg/s (sent, received and acknowledged): **{}** ({:.0} vs {:.0} msg/s)",
                    base.target,
                    r.target,
                    base.offered_rate_per_s.unwrap_or_default(),
                    ratio(base.through_msgs_per_s(), r.through_msgs_per_s()),
                    base.through_msgs_per_s(),
                    r.through_msgs_per_s()
                );
            } else {
                let _ = writeln!(
                    s,
                    "- {} / {} throughput (sent, received and acknowledged): **{}** ({:.0} vs {:.0} msg/s; {} / {})",
                    base.target,
                    r.target,
                    ratio(base.through_msgs_per_s(), r.through_msgs_per_s()),
                    base.through_msgs_per_s(),
                    r.through_msgs_per_s(),
                    base.fsync_policy,
                    r.fsync_policy
                );
            }
            if let (Some(b), Some(o)) = (base.server_cpu_us_per_msg, r.server_cpu_us_per_msg) {
                let _ = writeln!(
                    s,
                    "- {} / {} server CPU per message: **{}** ({:.1} vs {:.1} µs, at {:.0} vs {:.0} msg/s)",
                    base.target,
                    r.target,
                    ratio(b, o),
                    b,
                    o,
                    base.send_msgs_per_s,
                    r.send_msgs_per_s
                );
            }
            if let (Some(b), Some(o)) = (base.machine_cpu_us_per_msg, r.machine_cpu_us_per_msg) {
                let _ = writeln!(
                    s,
                    "- {} / {} machine CPU per message (server, generator and kernel): **{}** ({:.1} vs {:.1} µs)",
                    base.target,
                    r.target,
                    ratio(b, o),
                    b,
                    o
                );
            }
        }
        if let Some(e) = rec.echo_floors.iter().find(|e| e.case == *case) {
            let (b, f) = (&base.latency.end_to_end, &e.round_trip);
            let _ = writeln!(
                s,
                "- {} publish→receive / quinn echo round trip ({} B at {:.0}/s): p50 **{}**, p99 **{}** ({} / {} ms, {} / {} ms)",
                base.target,
                e.bytes,
                e.rate_per_s,
                ratio(b.p50_us as f64, f.p50_us as f64),
                ratio(b.p99_us as f64, f.p99_us as f64),
                ms(b.p50_us),
                ms(f.p50_us),
                ms(b.p99_us),
                ms(f.p99_us)
            );
        }
        if let Some(f) = rec.fetch_floors.iter().find(|f| f.case == *case) {
            fetch_floor_ratios(&mut s, &runs, &f.floor);
        }
        if is_round_trip(base) {
            if let Some(e) = rec.echo_floors.iter().find(|e| e.case == *case) {
                round_trip_ratios(&mut s, &runs, e, fio4k);
            }
        }
        if fio_bw > 0.0 && !is_round_trip(base) {
            let _ = writeln!(
                s,
                "- {} ingest / fio bandwidth floor: **{:.0}%** ({:.1} of {:.1} MB/s)",
                base.target,
                100.0 * base.send_mb_per_s / fio_bw,
                base.send_mb_per_s,
                fio_bw
            );
        }
        if let Some(f) = fio4k {
            let _ = writeln!(
                s,
                "- {} send-call p99 / fio 4 KiB fdatasync p99: **{}** ({} vs {} ms)",
                base.target,
                ratio(base.latency.send_call.p99_us as f64, f.sync_p99_us),
                ms(base.latency.send_call.p99_us),
                ms(f.sync_p99_us as u64)
            );
        }
        let _ = writeln!(s);
    }
    // A sweep of consumer groups: egress should scale with groups while ingest holds.
    let sweep: Vec<&RunResult> = rec
        .runs
        .iter()
        .filter(|r| {
            r.target == "sluice-quic" && !r.groups.is_empty() && r.shape.starts_with("topic")
        })
        .collect();
    if sweep.len() > 1 {
        let one = sweep[0];
        let _ = writeln!(
            s,
            "**Fan-out** (sluice-quic, against {} group(s)):\n",
            one.groups.len()
        );
        for r in &sweep[1..] {
            let _ = writeln!(
                s,
                "- {} groups: ingest {} ({:.1} vs {:.1} MB/s), egress {} ({:.1} vs {:.1} MB/s; ideal {}×)",
                r.groups.len(),
                ratio(r.send_mb_per_s, one.send_mb_per_s),
                r.send_mb_per_s,
                one.send_mb_per_s,
                ratio(r.egress_mb_per_s(), one.egress_mb_per_s()),
                r.egress_mb_per_s(),
                one.egress_mb_per_s(),
                r.groups.len() / one.groups.len().max(1)
            );
        }
        let _ = writeln!(s);
    }
    let _ = writeln!(s, "### Figures\n");
    let _ = writeln!(
        s,
        "Latencies in ms. publish→receive is from the intended send time (open loop: the schedule's; \
         closed loop: the call's start) to the consumer holding the message. *through* = the \
         lowest of the send rate and each group's acknowledged-receive rate.\n"
    );
    let _ = writeln!(
        s,
        "| case | target | fsync policy | offered msg/s | sent msg/s | in MB/s | through msg/s | out MB/s (all groups) | p50 | p99 | p99.9 | max | send-call p99 | gen lag p99 | sent | lost | dup |"
    );
    let _ = writeln!(
        s,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for r in &rec.runs {
        let e = &r.latency.end_to_end;
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.0} | {:.1} | {:.0} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.case,
            r.target,
            r.fsync_policy,
            r.offered_rate_per_s.map_or("max".into(), |x| format!("{x:.0}")),
            r.send_msgs_per_s,
            r.send_mb_per_s,
            r.through_msgs_per_s(),
            r.egress_mb_per_s(),
            ms(e.p50_us),
            ms(e.p99_us),
            ms(e.p999_us),
            ms(e.max_us),
            ms(r.latency.send_call.p99_us),
            ms(r.latency.send_lag.p99_us),
            r.sent,
            r.lost(),
            r.duplicates()
        );
    }
    let _ = writeln!(s);
    if rec
        .runs
        .iter()
        .any(|r| r.server_cpu_s.is_some() || r.machine_cpu_s.is_some())
    {
        let _ = writeln!(
            s,
            "CPU in the measured window, per message sent in it: the server's where the run \
             could see it (the in-process broker's threads; a peer's process group; not an \
             external broker), the load generator's (this process but the broker), the whole \
             machine's ({} cores: every task's run time, kernel workers and other processes too). The \
             last column is the most this machine could send at the machine's cost per message \
             with every core busy — the ceiling a closed loop's peak runs into when the \
             generator shares the machine:\n",
            rec.machine_cores
        );
        let _ = writeln!(
            s,
            "| case | target | phase | sent msg/s | received msg/s (all groups) | server, cores | server µs/msg sent | server µs/msg received | generator µs/msg sent / received | machine µs/msg sent / received | all cores at this cost, msg/s |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|");
        let us = |u: Option<f64>| u.map_or("–".into(), |u| format!("{u:.1}"));
        let both = |a: Option<f64>, b: Option<f64>| {
            let mut cell = us(a);
            cell.push_str(" / ");
            cell.push_str(&us(b));
            cell
        };
        for r in &rec.runs {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} |",
                r.case,
                r.target,
                r.phase,
                r.send_msgs_per_s,
                r.received_window as f64 / r.measured_s.max(1e-9),
                r.server_cpu_s.map_or("–".into(), |c| format!(
                    "{:.2}",
                    c / r.measured_s.max(1e-9)
                )),
                us(r.server_cpu_us_per_msg),
                us(r.server_cpu_us_per_received),
                both(r.generator_cpu_us_per_msg, r.generator_cpu_us_per_received),
                both(r.machine_cpu_us_per_msg, r.machine_cpu_us_per_received),
                r.machine_cpu_us_per_msg
                    .filter(|u| *u > 0.0)
                    .map_or("–".into(), |u| format!(
                        "{:.0}",
                        rec.machine_cores as f64 * 1e6 / u
                    )),
            );
        }
        let _ = writeln!(s);
    }
    if rec.runs.iter().any(is_round_trip) {
        let _ = writeln!(
            s,
            "Round trips (ms; each call alone on its connection; receives that found nothing are counted, not timed):\n"
        );
        let _ = writeln!(
            s,
            "| case | target | fsync policy | send p50 / p99 / p99.9 | receive p50 / p99 / p99.9 | delete p50 / p99 / p99.9 | calls each | empty receives |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
        for r in rec.runs.iter().filter(|r| is_round_trip(r)) {
            let cell =
                |p: &Pcts| format!("{} / {} / {}", ms(p.p50_us), ms(p.p99_us), ms(p.p999_us));
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                r.case,
                r.target,
                r.fsync_policy,
                cell(&r.latency.send_call),
                cell(&r.latency.receive_call),
                cell(&r.latency.ack_call),
                r.latency.send_call.count,
                r.receives_empty
            );
        }
        let _ = writeln!(s);
    }
    if let Some(r) = rec.runs.first() {
        let _ = writeln!(
            s,
            "Load: {}; {} producers, {} consumers per group, {} connections, batch {}; bodies {} (measured mean {:.0} B); warm-up {:.1} s, measured {:.1} s.\n",
            r.profile, r.producers, r.consumers_per_group, r.connections, r.batch, r.size, r.mean_body_bytes, r.warmup_s, r.measured_s
        );
    }
    if !rec.fio_floors.is_empty() {
        let _ = writeln!(
            s,
            "Disk floor (fio, O_DIRECT + fdatasync after each write, same run):\n"
        );
        let _ = writeln!(
            s,
            "| block | MB/s | fdatasyncs/s | sync p50 µs | sync p99 µs |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|");
        for f in &rec.fio_floors {
            let _ = writeln!(
                s,
                "| {} KiB | {:.1} | {:.0} | {:.0} | {:.0} |",
                f.block_bytes / 1024,
                f.bandwidth_mb_s,
                f.ops_per_s,
                f.sync_p50_us,
                f.sync_p99_us
            );
        }
        let _ = writeln!(s);
    }
    for f in &rec.fetch_floors {
        let q = &f.floor;
        let _ = writeln!(
            s,
            "Fetch floor ({}: a plain quinn server, one thread, the broker's TLS and MTU bound; {} request(s) in flight on each of {} connection(s), each answered with {} B held in memory, {} B a record; measured {:.1} s right after the case): {:.0} records/s, server {} µs/record, client {} µs/record.\n",
            f.case,
            q.in_flight,
            q.connections,
            q.response_bytes,
            q.record_bytes,
            q.measured_s,
            q.records_per_s,
            q.server_cpu_us_per_record
                .map_or("–".into(), |u| format!("{u:.2}")),
            q.client_cpu_us_per_record
                .map_or("–".into(), |u| format!("{u:.2}"))
        );
    }
    for e in &rec.echo_floors {
        let f = &e.round_trip;
        let _ = writeln!(
            s,
            "Transport floor ({}: plain quinn echo, {} B at {:.0}/s, open loop, same timer): p50 {} / p99 {} / p99.9 {} ms over {} round trips.\n",
            e.case,
            e.bytes,
            e.rate_per_s,
            ms(f.p50_us),
            ms(f.p99_us),
            ms(f.p999_us),
            f.count
        );
    }
    let _ = writeln!(s, "### Checks\n");
    for r in &rec.runs {
        let verdict = if r.lost() == 0 && r.sent > 0 {
            "every acknowledged send received by every group".to_string()
        } else if r.sent == 0 {
            "NOTHING SENT".to_string()
        } else {
            format!("**{} acknowledged sends not received**", r.lost())
        };
        let _ = writeln!(
            s,
            "- {} / {}: {} sent; {verdict}; {} duplicates; errors: {} send, {} receive, {} ack{}",
            r.case,
            r.target,
            r.sent,
            r.duplicates(),
            r.send_errors,
            r.receive_errors,
            r.ack_errors,
            r.first_error
                .as_ref()
                .map_or(String::new(), |e| format!(" (first: {e})"))
        );
    }
    for m in &rec.skipped {
        let _ = writeln!(s, "- {} / {}: skipped ({})", m.case, m.target, m.reason);
    }
    for m in &rec.failed {
        let _ = writeln!(s, "- {} / {}: **failed**: {}", m.case, m.target, m.reason);
    }
    let _ = writeln!(s);
    for c in charts {
        let _ = writeln!(s, "![{c}]({c})\n");
    }
    s
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

/// x of a percentile on the 1/(1-p) log axis (100% is drawn at the axis end).
fn px(p: f64, x_max: f64) -> f64 {
    if p >= 100.0 {
        x_max
    } else {
        (1.0 / (1.0 - p / 100.0)).min(x_max)
    }
}

fn chart_err(e: impl std::fmt::Display) -> String {
    format!("chart: {e}")
}

/// A labelled percentile curve; `true` for a floor.
type Line = (String, Vec<(f64, u64)>, bool);

/// Publish→receive percentile curves (one line per run, the echo floors grey), log-log.
pub fn latency_chart(rec: &ScenarioRecord, path: &Path) -> Result<(), String> {
    let mut lines: Vec<Line> = rec
        .runs
        .iter()
        .filter(|r| !r.latency.end_to_end.curve.is_empty())
        .map(|r| {
            (
                format!("{} {}", r.case, r.target),
                r.latency.end_to_end.curve.clone(),
                false,
            )
        })
        .collect();
    for e in &rec.echo_floors {
        if !e.round_trip.curve.is_empty() {
            lines.push((
                format!("{} quinn echo floor", e.case),
                e.round_trip.curve.clone(),
                true,
            ));
        }
    }
    let x_max = 1e5;
    let (lo, hi) = lines
        .iter()
        .flat_map(|(_, c, _)| c.iter().map(|p| p.1.max(1) as f64 / 1000.0))
        .fold((f64::MAX, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (lo, hi) = if lines.is_empty() {
        (0.01, 1.0)
    } else {
        (lo / 1.5, hi * 1.5)
    };
    let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(chart_err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{}: publish→receive latency by percentile", rec.scenario),
            ("sans-serif", 20),
        )
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d((1.0f64..x_max).log_scale(), (lo..hi).log_scale())
        .map_err(chart_err)?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("latency (ms)")
        .x_label_formatter(&|x| {
            let p = 100.0 * (1.0 - 1.0 / x);
            let decimals = (x.log10().round() as usize).saturating_sub(2);
            if p < 1.0 {
                "0%".into()
            } else {
                format!("{p:.decimals$}%")
            }
        })
        .y_label_formatter(&|y| format!("{y}"))
        .draw()
        .map_err(chart_err)?;
    let mut color = 0;
    for (label, curve, floor) in &lines {
        let style = if *floor {
            ShapeStyle::from(&RGBColor(128, 128, 128)).stroke_width(2)
        } else {
            color += 1;
            ShapeStyle::from(&COLORS[(color - 1) % COLORS.len()]).stroke_width(2)
        };
        let pts: Vec<(f64, f64)> = curve
            .iter()
            .map(|(p, v)| (px(*p, x_max), (*v).max(1) as f64 / 1000.0))
            .collect();
        chart
            .draw_series(LineSeries::new(pts, style))
            .map_err(chart_err)?
            .label(label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(chart_err)?;
    root.present().map_err(chart_err)
}

/// Ingest and egress MB/s per run, side by side.
pub fn throughput_chart(rec: &ScenarioRecord, path: &Path) -> Result<(), String> {
    let runs = &rec.runs;
    let n = runs.len().max(1);
    let top = runs
        .iter()
        .map(|r| r.send_mb_per_s.max(r.egress_mb_per_s()))
        .fold(0.0f64, f64::max)
        .max(0.001)
        * 1.25;
    let width = (240 * n as u32).clamp(640, 2400);
    let root = SVGBackend::new(path, (width, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(chart_err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "{}: MB/s in (acked sends) and out (all groups)",
                rec.scenario
            ),
            ("sans-serif", 18),
        )
        .margin(16)
        .x_label_area_size(24)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..n as f64, 0f64..top)
        .map_err(chart_err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc("MB/s")
        .draw()
        .map_err(chart_err)?;
    let (cin, cout) = (COLORS[0], COLORS[1]);
    chart
        .draw_series(runs.iter().enumerate().map(|(i, r)| {
            let x = i as f64;
            Rectangle::new([(x + 0.1, 0.0), (x + 0.48, r.send_mb_per_s)], cin.filled())
        }))
        .map_err(chart_err)?
        .label("in MB/s")
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], cin.filled()));
    chart
        .draw_series(runs.iter().enumerate().map(|(i, r)| {
            let x = i as f64;
            Rectangle::new(
                [(x + 0.52, 0.0), (x + 0.9, r.egress_mb_per_s())],
                cout.filled(),
            )
        }))
        .map_err(chart_err)?
        .label("out MB/s")
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], cout.filled()));
    let text = ("sans-serif", 13).into_font().color(&BLACK);
    chart
        .draw_series(runs.iter().enumerate().flat_map(|(i, r)| {
            let x = i as f64;
            [
                Text::new(
                    format!("{} {}", r.case, r.target),
                    (x + 0.08, top * 0.97),
                    text.clone(),
                ),
                Text::new(
                    format!("{:.0} msg/s through", r.through_msgs_per_s()),
                    (x + 0.08, top * 0.92),
                    text.clone(),
                ),
                Text::new(
                    format!("{:.1}", r.send_mb_per_s),
                    (x + 0.12, r.send_mb_per_s + top * 0.04),
                    text.clone(),
                ),
                Text::new(
                    format!("{:.1}", r.egress_mb_per_s()),
                    (x + 0.54, r.egress_mb_per_s() + top * 0.04),
                    text.clone(),
                ),
            ]
        }))
        .map_err(chart_err)?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::MiddleRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(chart_err)?;
    root.present().map_err(chart_err)
}

/// Writes a run's JSON record twice: `<kind>-<unix time>.json`, this run's own (git ignores
/// these: `perf/results/.gitignore`), and `<kind>-latest.json`, the newest, which is the one kept
/// in git beside `<kind>-latest.md`. Returns the timestamped path.
pub fn write_json(out: &Path, kind: &str, unix_time: u64, text: &str) -> Result<PathBuf, String> {
    let stamped = out.join(format!("{kind}-{unix_time}.json"));
    let latest = out.join(format!("{kind}-latest.json"));
    for path in [&stamped, &latest] {
        std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(stamped)
}

/// Writes `<scenario>-<unix time>.json`, `<scenario>-latest.json`, `<scenario>-latest.md` and
/// the two SVGs into `out`.
pub fn write(rec: &ScenarioRecord, out: &Path) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let base = format!("{}-latest", rec.scenario);
    let lat = format!("{base}-latency.svg");
    let thr = format!("{base}-throughput.svg");
    latency_chart(rec, &out.join(&lat))?;
    throughput_chart(rec, &out.join(&thr))?;
    let md = markdown(rec, &[lat.clone(), thr.clone()]);
    let text = serde_json::to_string_pretty(rec).map_err(|e| e.to_string())?;
    let json = write_json(out, &rec.scenario, rec.unix_time, &text)?;
    let mdp = out.join(format!("{base}.md"));
    std::fs::write(&mdp, md).map_err(|e| format!("{}: {e}", mdp.display()))?;
    Ok(vec![json, mdp, out.join(lat), out.join(thr)])
}
