//! `sluice-perf capacity`: what the seed document's load needs — cores, nodes, disks (bandwidth,
//! fdatasync rate, capacity), network and S3 — from the per-core figures measured on this
//! machine (the newest `perf/results/*.json`), or from figures given on the command line. Prints
//! the arithmetic as Markdown, step by step, and names the first bottleneck.

use serde_json::Value;
use std::fmt::Write;
use std::path::Path;

/// The load and the cluster's shape (defaults: the seed document).
#[derive(Debug, Clone, clap::Args)]
pub struct Load {
    #[arg(long, default_value_t = 2e9)]
    pub messages_per_day: f64,
    #[arg(long, default_value_t = 2048.0)]
    pub message_bytes: f64,
    #[arg(long, default_value_t = 3.5)]
    pub peak_to_average: f64,
    /// Consumer groups (or subscriber queues) reading every message.
    #[arg(long, default_value_t = 2.0)]
    pub fanout: f64,
    #[arg(long, default_value_t = 7.0)]
    pub retention_days: f64,
    #[arg(long, default_value_t = 3.0)]
    pub replicas: f64,
    /// Retention kept on local disks; older sealed segments live in S3 only.
    #[arg(long, default_value_t = 24.0)]
    pub local_hours: f64,
    #[arg(long, default_value_t = 16.0)]
    pub cores_per_node: f64,
    #[arg(long, default_value_t = 4.0)]
    pub disks_per_node: f64,
    #[arg(long, default_value_t = 3.84)]
    pub disk_tb: f64,
    #[arg(long, default_value_t = 25.0)]
    pub nic_gbit_s: f64,
    /// Share of each resource planned for the peak (the rest is headroom for failover of one AZ,
    /// compaction, rebalancing).
    #[arg(long, default_value_t = 0.6)]
    pub utilization: f64,
    /// Measured figures to use instead of perf/results (per core / per disk).
    #[arg(long)]
    pub queue_cycles_per_core: Option<f64>,
    #[arg(long)]
    pub topic_in_mb_per_core: Option<f64>,
    #[arg(long)]
    pub topic_out_mb_per_core: Option<f64>,
    #[arg(long)]
    pub disk_mb_s: Option<f64>,
    #[arg(long)]
    pub disk_fsyncs_per_s: Option<f64>,
}

/// Per-core and per-disk figures, with where each came from.
#[derive(Debug, Clone)]
pub struct Measured {
    pub queue_cycles_per_core: (f64, String),
    pub topic_in_mb_per_core: (f64, String),
    pub topic_out_mb_per_core: (f64, String),
    pub disk_mb_s: (f64, String),
    pub disk_fsyncs_per_s: (f64, String),
}

fn records(results: &Path) -> Vec<(String, Value)> {
    let mut v: Vec<(String, Value)> = std::fs::read_dir(results)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| {
            let text = std::fs::read_to_string(e.path()).ok()?;
            let j: Value = serde_json::from_str(&text).ok()?;
            Some((e.file_name().to_string_lossy().to_string(), j))
        })
        .collect();
    v.sort_by_key(|(_, j)| std::cmp::Reverse(j["unix_time"].as_u64().unwrap_or(0)));
    v
}

fn sluice_run<'a>(j: &'a Value, case_prefix: &str) -> Vec<&'a Value> {
    j["runs"]
        .as_array()
        .map(|runs| {
            runs.iter()
                .filter(|r| {
                    r["target"] == "sluice-quic"
                        && r["case"]
                            .as_str()
                            .is_some_and(|c| c.starts_with(case_prefix))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn through(r: &Value) -> f64 {
    let send = r["send_msgs_per_s"].as_f64().unwrap_or(0.0);
    r["groups"]
        .as_array()
        .map(|g| {
            g.iter()
                .filter_map(|g| g["ack_msgs_per_s"].as_f64())
                .fold(send, f64::min)
        })
        .unwrap_or(0.0)
}

/// Queue cycles (send + receive + delete of one message) per core from a throughput run: from
/// the broker's own CPU per message where the run measured it (the in-process broker's threads,
/// at the closed loop's peak), else the machine's throughput divided by its `cores` (the load
/// generator's share included: pessimistic).
fn queue_cycles_per_core(r: &Value, file: &str, cores: f64) -> (f64, String) {
    match r["server_cpu_us_per_msg"].as_f64() {
        Some(us) if us > 0.0 => (
            1e6 / us,
            format!("{file} (the broker's own CPU: {us:.1} µs per message)"),
        ),
        _ => (
            through(r) / cores,
            format!("{file} (the machine's throughput / its {cores} cores, generator included)"),
        ),
    }
}

/// The topic scenarios whose figures size the stream path.
const TOPIC_SCENARIOS: [&str; 2] = ["fanout", "stream-fanout"];

/// Reads the newest measured figures in `results`; command-line figures win.
pub fn measured(results: &Path, l: &Load) -> Result<Measured, String> {
    let recs = records(results);
    // The cores the figure took: the whole machine (broker, its kernel work and the load
    // generator), not the broker's shards — fewer shards than cores leave the generator a
    // core, which a per-shard figure would not count. Records from before `machine_cores`
    // ran one shard per core.
    let cores = |j: &Value| {
        j["machine_cores"]
            .as_f64()
            .or_else(|| j["sluice_shards"].as_f64())
            .unwrap_or(1.0)
            .max(1.0)
    };
    let mut queue = l
        .queue_cycles_per_core
        .map(|v| (v, "command line".to_string()));
    let mut tin = l
        .topic_in_mb_per_core
        .map(|v| (v, "command line".to_string()));
    let mut tout = l
        .topic_out_mb_per_core
        .map(|v| (v, "command line".to_string()));
    let mut bw = l.disk_mb_s.map(|v| (v, "command line".to_string()));
    let mut topic_seen: Vec<String> = Vec::new();
    let mut fs = l.disk_fsyncs_per_s.map(|v| (v, "command line".to_string()));
    for (file, j) in &recs {
        if j["kind"] == "scenario" && j["scenario"] == "throughput-2k-batch10" && queue.is_none() {
            if let Some(r) = sluice_run(j, "throughput-2k-batch10").first() {
                queue = Some(queue_cycles_per_core(r, file, cores(j)));
            }
        }
        // Topic figures: the newest run of each topic scenario (fan-out at a fixed rate, the
        // stream at 1.5x Iggy's), the better of them; figures given on the command line win.
        let topic_scenario = j["scenario"]
            .as_str()
            .filter(|n| TOPIC_SCENARIOS.contains(n));
        if let (true, Some(name)) = (j["kind"] == "scenario", topic_scenario) {
            if !topic_seen.contains(&name.to_string()) {
                topic_seen.push(name.to_string());
                let runs = sluice_run(j, name);
                let best_in = runs
                    .iter()
                    .filter_map(|r| r["send_mb_per_s"].as_f64())
                    .fold(0.0, f64::max);
                let best_out = runs
                    .iter()
                    .map(|r| {
                        r["groups"]
                            .as_array()
                            .map(|g| {
                                g.iter()
                                    .filter_map(|g| g["receive_mb_per_s"].as_f64())
                                    .sum()
                            })
                            .unwrap_or(0.0)
                    })
                    .fold(0.0, f64::max);
                // An open-loop run offers a fixed rate: what it moved is a lower bound of what
                // a core can do, and the model sized from it is pessimistic.
                let how = if runs.iter().any(|r| r["offered_rate_per_s"].is_number()) {
                    format!("{file} (open loop at a fixed rate: a lower bound)")
                } else {
                    file.clone()
                };
                let better = |given: bool, cur: &Option<(f64, String)>, v: f64| {
                    !given && v > 0.0 && cur.as_ref().is_none_or(|(c, _)| v > *c)
                };
                let (v_in, v_out) = (best_in / cores(j), best_out / cores(j));
                if better(l.topic_in_mb_per_core.is_some(), &tin, v_in) {
                    tin = Some((v_in, how.clone()));
                }
                if better(l.topic_out_mb_per_core.is_some(), &tout, v_out) {
                    tout = Some((v_out, how));
                }
            }
        }
        if let Some(floors) = j["fio_floors"].as_array() {
            for f in floors {
                if f["block_bytes"] == 524288 && bw.is_none() {
                    bw = f["bandwidth_mb_s"].as_f64().map(|v| (v, file.clone()));
                }
                if f["block_bytes"] == 4096 && fs.is_none() {
                    fs = f["ops_per_s"].as_f64().map(|v| (v, file.clone()));
                }
            }
        }
    }
    let need = |v: Option<(f64, String)>, what: &str, flag: &str| {
        v.filter(|(x, _)| *x > 0.0).ok_or(format!(
            "no measured {what} in {}: run its scenario or pass --{flag}",
            results.display()
        ))
    };
    Ok(Measured {
        queue_cycles_per_core: need(queue, "queue throughput", "queue-cycles-per-core")?,
        topic_in_mb_per_core: need(tin, "topic ingest", "topic-in-mb-per-core")?,
        topic_out_mb_per_core: need(tout, "topic egress", "topic-out-mb-per-core")?,
        disk_mb_s: need(bw, "disk bandwidth (fio 512 KiB)", "disk-mb-s")?,
        disk_fsyncs_per_s: need(fs, "disk fdatasync rate (fio 4 KiB)", "disk-fsyncs-per-s")?,
    })
}

/// The model, as Markdown with every step's arithmetic.
pub fn model(l: &Load, m: &Measured) -> String {
    let mut s = String::new();
    let avg = l.messages_per_day / 86_400.0;
    let peak = avg * l.peak_to_average;
    let mb = |msgs: f64| msgs * l.message_bytes / 1e6;
    let peak_in = mb(peak);
    let _ = writeln!(s, "### Load\n");
    let _ = writeln!(
        s,
        "- average: {:.3e} msg/day / 86,400 s = **{avg:.0} msg/s**; peak × {} = **{peak:.0} msg/s**",
        l.messages_per_day, l.peak_to_average
    );
    let _ = writeln!(
        s,
        "- peak ingest: {peak:.0} × {} B = **{peak_in:.1} MB/s**; egress at {}× fan-out = **{:.1} MB/s**; replication to {} followers = **{:.1} MB/s**",
        l.message_bytes,
        l.fanout,
        peak_in * l.fanout,
        l.replicas - 1.0,
        peak_in * (l.replicas - 1.0)
    );
    let _ = writeln!(s, "\n### Measured here (per core / per disk)\n");
    let src = |x: &(f64, String)| x.1.clone();
    let _ = writeln!(s, "| figure | value | from |\n|---|---|---|");
    let _ = writeln!(
        s,
        "| queue send+receive+delete cycles/s per core (2 KiB, batch 10) | {:.0} | {} |",
        m.queue_cycles_per_core.0,
        src(&m.queue_cycles_per_core)
    );
    let _ = writeln!(
        s,
        "| topic ingest MB/s per core (2 KiB records) | {:.1} | {} |",
        m.topic_in_mb_per_core.0,
        src(&m.topic_in_mb_per_core)
    );
    let _ = writeln!(
        s,
        "| topic egress MB/s per core (all groups) | {:.1} | {} |",
        m.topic_out_mb_per_core.0,
        src(&m.topic_out_mb_per_core)
    );
    let _ = writeln!(
        s,
        "| disk bandwidth MB/s (fio 512 KiB + fdatasync) | {:.1} | {} |",
        m.disk_mb_s.0,
        src(&m.disk_mb_s)
    );
    let _ = writeln!(
        s,
        "| disk fdatasyncs/s (fio 4 KiB) | {:.0} | {} |",
        m.disk_fsyncs_per_s.0,
        src(&m.disk_fsyncs_per_s)
    );
    let _ = writeln!(
        s,
        "\nThe queue figure is a core of the broker's own CPU, at the closed loop's peak, where \
         the run measured it (its source says); the topic figures, and the queue figure from \
         older runs, are the whole machine's throughput divided by its cores, with the load \
         generator on the same cores: pessimistic for a dedicated broker.\n"
    );

    // CPU, two ways of serving the fan-out.
    let q_cycles = peak * l.fanout;
    let q_leader = q_cycles / m.queue_cycles_per_core.0;
    let repl_cores = |mbps: f64| mbps * (l.replicas - 1.0) / m.topic_in_mb_per_core.0;
    let q_repl = repl_cores(peak_in * l.fanout);
    let q_cores = (q_leader + q_repl) / l.utilization;
    let t_in = peak_in / m.topic_in_mb_per_core.0;
    let t_out = peak_in * l.fanout / m.topic_out_mb_per_core.0;
    let t_repl = repl_cores(peak_in);
    let t_cores = (t_in + t_out + t_repl) / l.utilization;
    let _ = writeln!(s, "### CPU\n");
    let _ = writeln!(
        s,
        "- queue path (SQS-style fan-out: one queue per subscriber, each message cycled {}×): {q_cycles:.0} cycles/s / {:.0} per core = {q_leader:.1} leader cores; followers append {:.1} MB/s × {} / {:.1} MB/s per core = {q_repl:.1} cores; / {} utilization = **{q_cores:.1} cores**",
        l.fanout, m.queue_cycles_per_core.0, peak_in * l.fanout, l.replicas - 1.0, m.topic_in_mb_per_core.0, l.utilization
    );
    let _ = writeln!(
        s,
        "- stream path (one topic, {} groups): ingest {peak_in:.1} / {:.1} = {t_in:.1} cores; egress {:.1} / {:.1} = {t_out:.1} cores; followers {:.1} × {} / {:.1} = {t_repl:.1} cores; / {} = **{t_cores:.1} cores**",
        l.fanout, m.topic_in_mb_per_core.0, peak_in * l.fanout, m.topic_out_mb_per_core.0, peak_in, l.replicas - 1.0, m.topic_in_mb_per_core.0, l.utilization
    );
    let _ = writeln!(
        s,
        "- (follower cost per byte is taken as the leader's ingest cost per byte: replication is not built yet, so this is an assumption to re-measure)\n"
    );

    // Disks: every replica writes every byte it keeps.
    let write_q = peak_in * l.fanout * l.replicas;
    let write_t = peak_in * l.replicas;
    let disk_bw = m.disk_mb_s.0 * l.utilization;
    let disks_bw_q = write_q / disk_bw;
    let disks_bw_t = write_t / disk_bw;
    let local_tb =
        avg * l.message_bytes * 3600.0 * l.local_hours.min(l.retention_days * 24.0) * l.replicas
            / 1e12;
    let disks_cap = local_tb / (l.disk_tb * l.utilization);
    let s3_tb = avg * l.message_bytes * 86_400.0 * l.retention_days / 1e12;
    let _ = writeln!(s, "### Disks and S3\n");
    let _ = writeln!(
        s,
        "- write bandwidth at peak: queue path {peak_in:.1} × {} × {} replicas = {write_q:.1} MB/s; stream path {peak_in:.1} × {} = {write_t:.1} MB/s; one disk gives {:.1} × {} = {disk_bw:.1} MB/s → **{disks_bw_q:.1}** (queue) / **{disks_bw_t:.1}** (stream) disks",
        l.fanout, l.replicas, l.replicas, m.disk_mb_s.0, l.utilization
    );
    let per_disk_msgs = peak * l.replicas / (disks_bw_t.ceil().max(1.0));
    let _ = writeln!(
        s,
        "- fdatasync rate: a disk syncs {:.0} times/s; group commit needs {per_disk_msgs:.0} msg/s per disk (stream path, {:.0} disks) / {:.0} = **{:.1} messages per fdatasync** — the storage bench gathers far more per commit at 16+ appenders, so fsync rate is not the limit while batches form",
        m.disk_fsyncs_per_s.0,
        disks_bw_t.ceil().max(1.0),
        m.disk_fsyncs_per_s.0,
        per_disk_msgs / m.disk_fsyncs_per_s.0
    );
    let _ = writeln!(
        s,
        "- local capacity: {avg:.0} msg/s × {} B × {} h × {} replicas = **{local_tb:.1} TB** → {disks_cap:.1} disks of {} TB at {} fill",
        l.message_bytes, l.local_hours, l.replicas, l.disk_tb, l.utilization
    );
    let _ = writeln!(
        s,
        "- S3 (sealed segments, one copy — S3 keeps its own redundancy): {avg:.0} × {} B × 86,400 × {} days = **{s3_tb:.1} TB** stored; PUT rate with 64 MiB segments: {:.1}/s\n",
        l.message_bytes,
        l.retention_days,
        avg * l.message_bytes / (64.0 * 1024.0 * 1024.0) * l.replicas.min(1.0)
    );

    // Network per node: ingest + replication out + egress (+ replication in at followers).
    let net_q = peak_in * l.fanout * (1.0 + 2.0 * (l.replicas - 1.0)) + peak_in * l.fanout;
    let net_t = peak_in * (1.0 + 2.0 * (l.replicas - 1.0)) + peak_in * l.fanout;
    let nic = l.nic_gbit_s * 1000.0 / 8.0 * l.utilization;

    // Nodes: each resource's demand in nodes; the largest sets the count (a multiple of 3 AZs).
    let az = 3.0;
    let round = |n: f64| ((n / az).ceil() * az).max(az);
    let mut rows = Vec::new();
    for (path, cores, disks_bw, net) in [
        ("queue", q_cores, disks_bw_q, net_q),
        ("stream", t_cores, disks_bw_t, net_t),
    ] {
        let by = [
            ("CPU", cores / l.cores_per_node),
            ("disk bandwidth", disks_bw / l.disks_per_node),
            ("disk capacity", disks_cap / l.disks_per_node),
            ("network", net / nic),
        ];
        let (first, need) = by
            .iter()
            .cloned()
            .fold(("", 0.0f64), |a, b| if b.1 > a.1 { b } else { a });
        rows.push((path, cores, disks_bw, net, by, first, need, round(need)));
    }
    let _ = writeln!(
        s,
        "### Nodes ({} cores, {} × {} TB disks, {} Gbit/s each; one per AZ at least)\n",
        l.cores_per_node, l.disks_per_node, l.disk_tb, l.nic_gbit_s
    );
    let _ = writeln!(s, "| path | cores | disks (bandwidth) | disks (capacity) | network MB/s | nodes by CPU | by disk bw | by capacity | by network | nodes | first bottleneck |");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|");
    for (path, cores, dbw, net, by, first, _need, nodes) in &rows {
        let _ = writeln!(
            s,
            "| {path} | {cores:.1} | {dbw:.1} | {disks_cap:.1} | {net:.0} | {:.2} | {:.2} | {:.2} | {:.2} | **{nodes:.0}** | **{first}** |",
            by[0].1, by[1].1, by[2].1, by[3].1
        );
    }
    let _ = writeln!(
        s,
        "\nNodes = the largest demand, rounded up to a multiple of 3 (one per AZ); below 3 the \
         cluster is sized by availability, not load, and the first bottleneck is the resource that \
         would run out first as the load grows."
    );
    s
}

pub fn run(results: &Path, l: &Load) -> Result<String, String> {
    let m = measured(results, l)?;
    Ok(model(l, &m))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(server_cpu_us_per_msg: Option<f64>) -> Value {
        json!({
            "target": "sluice-quic",
            "case": "throughput-2k-batch10",
            "send_msgs_per_s": 40000.0,
            "groups": [{"ack_msgs_per_s": 38000.0}],
            "server_cpu_us_per_msg": server_cpu_us_per_msg,
        })
    }

    #[test]
    fn queue_cycles_come_from_the_brokers_cpu_where_measured() {
        let (v, from) = queue_cycles_per_core(&run(Some(25.0)), "a.json", 2.0);
        assert_eq!(v, 40_000.0);
        assert!(from.contains("25.0 µs per message"), "{from}");
        // Older records: the machine's throughput (the slowest group's) over its cores.
        let (v, from) = queue_cycles_per_core(&run(None), "b.json", 2.0);
        assert_eq!(v, 19_000.0);
        assert!(from.contains("generator included"), "{from}");
    }
}
