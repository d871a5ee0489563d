//! Smoke runs of each perf scenario against Sluice (seconds, not minutes): the suite itself
//! works, writes its JSON and Markdown, and moves messages. Figures are not checked (no timed
//! assertions); peers are not run here.

use std::path::{Path, PathBuf};
use std::process::Command;

fn perf(args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice-perf"))
        .args(args)
        .output()
        .expect("run sluice-perf");
    assert!(
        out.status.success(),
        "sluice-perf {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The one run of `kind` written to `dir`: its timestamped JSON, the same record as
/// `<kind>-latest.json`, and the Markdown report.
fn result(dir: &Path, kind: &str) -> serde_json::Value {
    let stamped = std::fs::read_dir(dir)
        .expect("results dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|name| {
            name.strip_prefix(&format!("{kind}-"))
                .and_then(|rest| rest.strip_suffix(".json"))
                .is_some_and(|t| t.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect::<Vec<_>>();
    assert_eq!(stamped.len(), 1, "one {kind} result in {}", dir.display());
    let read = |name: &str| std::fs::read(dir.join(name)).expect("read");
    let latest = read(&format!("{kind}-latest.json"));
    assert_eq!(
        read(&stamped[0]),
        latest,
        "{kind}-latest.json is the newest run"
    );
    let v: serde_json::Value = serde_json::from_slice(&latest).expect("json");
    assert!(
        dir.join(format!("{kind}-latest.md")).exists(),
        "{kind} report"
    );
    v
}

#[test]
fn every_scenario_runs_and_reports() {
    let tmp = tempfile::tempdir().expect("tmp");
    let work = tmp.path().join("work");
    let out = tmp.path().join("out");
    let (w, o) = (work.to_str().expect("utf8"), out.to_str().expect("utf8"));

    perf(&[
        "storage",
        "--dir",
        w,
        "--out",
        o,
        "--seconds",
        "0.3",
        "--warmup-seconds",
        "0.1",
        "--concurrency",
        "1,8",
        "--no-fio",
    ]);
    let s = result(&out, "storage");
    let runs = s["sluice"].as_array().expect("runs");
    assert_eq!(runs.len(), 2);
    assert!(runs.iter().all(|r| r["appends_per_s"].as_f64() > Some(0.0)));

    perf(&[
        "queue",
        "--dir",
        w,
        "--out",
        o,
        "--seconds",
        "0.5",
        "--limit",
        "2",
        "--no-fio",
    ]);
    let q = result(&out, "queue");
    let runs = q["sluice"].as_array().expect("runs");
    assert_eq!(runs.len(), 2);
    assert!(runs.iter().all(|r| r["cycles_per_s"].as_f64() > Some(0.0)));

    let hq_dir = work.join("hq");
    perf(&[
        "http-vs-quic",
        "--dir",
        hq_dir.to_str().expect("utf8"),
        "--out",
        o,
        "--seconds",
        "0.5",
        "--workers",
        "4",
    ]);
    let h = result(&out, "http-vs-quic");
    let runs = h["results"].as_array().expect("paths");
    assert_eq!(runs.len(), 2);
    assert!(runs
        .iter()
        .all(|r| r["messages_per_s"].as_f64() > Some(0.0)));

    // The restart: the run itself fails unless the restarted broker counts every message
    // (over several queues, so each shard opens several partitions at once).
    let rec_dir = work.join("recovery");
    perf(&[
        "recovery",
        "--dir",
        rec_dir.to_str().expect("utf8"),
        "--out",
        o,
        "--messages",
        "2000",
        "--queues",
        "12",
    ]);
    let r = result(&out, "recovery");
    assert_eq!(r["sluice"]["messages"].as_u64(), Some(2000));
    let received = r["sluice"]["received_before_restart"].as_u64();
    assert!(received > Some(0) && received <= Some(200), "{received:?}");
    assert!(r["sluice"]["log_bytes"].as_u64() > Some(2000 * 2048));
}

fn scenario(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios")
        .join(format!("{name}.toml"))
}

/// `sluice-perf run` on each smoke scenario (one per scenario type: closed loop on a standard
/// queue over QUIC and HTTP, open loop with bursts and the echo floor, FIFO groups, topic
/// fan-out) against in-process Sluice: every acknowledged send is received by every group (the
/// run itself fails otherwise), and the JSON record, Markdown report and both charts are written.
/// Seeds are fixed in the scenario files and printed in the failure output.
#[test]
fn scenario_files_run_against_sluice_and_report() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = tmp.path().join("out");
    let work = tmp.path().join("work");
    let (w, o) = (work.to_str().expect("utf8"), out.to_str().expect("utf8"));
    // The in-process broker runs one shard per core less the generator's; the topic smoke
    // runs on two shards whatever the machine, so partitions on another shard than the
    // connection's are crossed in every run.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let default_shards = cores.saturating_sub(1).max(1);
    for (name, runs, groups, shards) in [
        ("smoke-standard-closed", 2, vec![1, 1], None),
        ("smoke-open", 1, vec![1], None),
        ("smoke-fifo", 2, vec![1, 1], None),
        ("smoke-topic", 2, vec![1, 2], Some("2")),
        ("smoke-rtt", 2, vec![1, 1], None),
        ("smoke-stream-consume", 1, vec![1], None),
    ] {
        let path = scenario(name);
        let mut args = vec!["run", path.to_str().expect("utf8"), "--work", w, "--out", o];
        if let Some(n) = shards {
            args.extend(["--shards", n]);
        }
        perf(&args);
        let rec = result(&out, name);
        assert_eq!(rec["scenario"], name);
        let seed = &rec["seed"];
        let want_shards = shards.map_or(default_shards, |n| n.parse().expect("number"));
        assert_eq!(rec["sluice_shards"].as_u64(), Some(want_shards as u64));
        assert_eq!(rec["machine_cores"].as_u64(), Some(cores as u64));
        let got = rec["runs"].as_array().expect("runs");
        assert_eq!(
            got.len(),
            runs,
            "{name} (seed {seed}): one run per target and case"
        );
        for (r, g) in got.iter().zip(&groups) {
            let sent = r["sent"].as_u64().expect("sent");
            assert!(sent > 0, "{name} (seed {seed}): nothing sent");
            let gs = r["groups"].as_array().expect("groups");
            assert_eq!(gs.len(), *g, "{name} (seed {seed}): groups");
            for gr in gs {
                assert_eq!(gr["lost"], 0, "{name} (seed {seed}): lost messages: {gr}");
                assert_eq!(
                    gr["received"].as_u64(),
                    Some(sent),
                    "{name} (seed {seed}): sent = received per group: {gr}"
                );
            }
            assert!(r["fsync_policy"].as_str().is_some_and(|p| !p.is_empty()));
            // The in-process broker's CPU over the measured window, per message sent in it.
            assert!(
                r["server_cpu_s"].as_f64().is_some_and(|s| s > 0.0),
                "{name} (seed {seed}): server CPU measured: {}",
                r["server_cpu_s"]
            );
            // Per message only if the window saw sends (a bounded smoke may send all of its
            // messages during the warm-up).
            let in_window = r["send_msgs_per_s"].as_f64().expect("rate") > 0.0;
            for key in [
                "server_cpu_us_per_msg",
                "generator_cpu_us_per_msg",
                "machine_cpu_us_per_msg",
            ] {
                let per_msg = &r[key];
                assert!(
                    if in_window {
                        per_msg.as_f64().is_some_and(|u| u > 0.0 && u.is_finite())
                    } else {
                        per_msg.is_null()
                    },
                    "{name} (seed {seed}): {key} {per_msg}"
                );
            }
            // The machine's run time covers the server's and the generator's (the same ns
            // counters, summed over every task; threads that exit in the window are missed,
            // hence the slack), and is no more than every core for the window.
            let cpu = |k: &str| r[k].as_f64().expect(k);
            let (machine, both) = (
                cpu("machine_cpu_s"),
                cpu("server_cpu_s") + cpu("generator_cpu_s"),
            );
            let window = cpu("measured_s");
            assert!(
                machine + 0.05 >= 0.95 * both && machine <= cores as f64 * window * 1.05 + 0.05,
                "{name} (seed {seed}): machine {machine} s, server and generator {both} s, \
                 {cores} cores for {window} s"
            );
        }
        for chart in ["latency", "throughput"] {
            let svg = out.join(format!("{name}-latest-{chart}.svg"));
            let text = std::fs::read_to_string(&svg).expect("chart written");
            assert!(text.starts_with("<svg"), "{} is an SVG", svg.display());
        }
        let md = std::fs::read_to_string(out.join(format!("{name}-latest.md"))).expect("report");
        assert!(
            md.contains("### Ratios")
                && md.contains("fdatasync")
                && md.contains(
                    "| server µs/msg sent | server µs/msg received | generator µs/msg sent / received | machine µs/msg sent / received |"
                ),
            "{md}"
        );
    }
    let rtt = result(&out, "smoke-rtt");
    for r in rtt["runs"].as_array().expect("runs") {
        for call in ["send_call", "receive_call", "ack_call"] {
            assert!(
                r["latency"][call]["count"].as_u64().is_some_and(|n| n > 0),
                "the round-trip smoke times every {call}: {r}"
            );
        }
    }
    let md = std::fs::read_to_string(out.join("smoke-rtt-latest.md")).expect("report");
    assert!(
        md.contains("send round trip / quinn echo") && md.contains("| send p50 / p99 / p99.9 |"),
        "{md}"
    );
    let closed = result(&out, "smoke-standard-closed");
    for r in closed["runs"].as_array().expect("runs") {
        assert!(
            r["mode"]
                .as_str()
                .is_some_and(|m| m.contains("at most 200 messages sent and not yet received")),
            "the closed-loop smoke bounds its backlog: {r}"
        );
    }
    let open = result(&out, "smoke-open");
    assert_eq!(
        open["echo_floors"].as_array().map(Vec::len),
        Some(1),
        "the open-loop smoke measures the quinn echo floor"
    );
}

#[test]
fn a_bad_scenario_is_a_clear_error() {
    let tmp = tempfile::tempdir().expect("tmp");
    let bad = tmp.path().join("bad.toml");
    std::fs::write(&bad, "name = \"x\"\n[load]\nmode = \"sideways\"\n").expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_sluice-perf"))
        .args(["run", bad.to_str().expect("utf8"), "--out"])
        .arg(tmp.path().join("out"))
        .output()
        .expect("run sluice-perf");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.toml") && !err.contains("panicked"),
        "{err}"
    );
}

/// Against an external broker, the record has no shard count of ours (the broker's shards are
/// its own) and the report says the broker was external.
#[test]
fn an_external_broker_is_named_as_such() {
    let tmp = tempfile::tempdir().expect("tmp");
    let data = tmp.path().join("broker");
    let mut c = sluice_broker::config::BrokerConfig::ephemeral(data.clone()).expect("config");
    c.shards = 1;
    c.default_partitions = 1;
    c.http_addr = "127.0.0.1:0".parse().expect("literal");
    c.quic_addr = "127.0.0.1:0".parse().expect("literal");
    c.metrics_addr = "127.0.0.1:0".parse().expect("literal");
    c.kafka_addr = None;
    let broker = sluice_broker::server::start(c).expect("start broker");
    broker.wait_ready().expect("ready");
    let addr = broker.quic_addr().to_string();
    let cert = data.join("quic-selfsigned-cert.pem");
    let (out, work) = (tmp.path().join("out"), tmp.path().join("work"));
    let path = scenario("smoke-open");
    perf(&[
        "run",
        path.to_str().expect("utf8"),
        "--work",
        work.to_str().expect("utf8"),
        "--out",
        out.to_str().expect("utf8"),
        "--no-floors",
        "--sluice-quic",
        &addr,
        "--cert",
        cert.to_str().expect("utf8"),
    ]);
    let rec = result(&out, "smoke-open");
    assert!(rec["sluice_shards"].is_null(), "{}", rec["sluice_shards"]);
    let runs = rec["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0]["groups"][0]["lost"], 0);
    // This run cannot see an external broker's threads: no CPU figure rather than a wrong one.
    assert!(
        runs[0]["server_cpu_s"].is_null(),
        "{}",
        runs[0]["server_cpu_s"]
    );
    // The generator and the machine it runs on are still measured.
    for key in ["generator_cpu_s", "machine_cpu_s"] {
        assert!(
            runs[0][key].as_f64().is_some_and(|s| s > 0.0),
            "{key}: {}",
            runs[0][key]
        );
    }
    let md = std::fs::read_to_string(out.join("smoke-open-latest.md")).expect("report");
    assert!(md.contains("external broker"), "{md}");
}

/// The Kafka target (`--features kafka`: librdkafka against the in-process broker's Kafka
/// listener) beside QUIC in one run: every acknowledged produce is consumed by the group, the
/// server's CPU is measured for both, and the report gives their ratios.
#[cfg(feature = "kafka")]
#[test]
fn kafka_target_runs_beside_quic_and_reports_the_ratios() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = tmp.path().join("out");
    let work = tmp.path().join("work");
    let (w, o) = (work.to_str().expect("utf8"), out.to_str().expect("utf8"));
    let path = scenario("smoke-kafka");
    // Bounded: when a run misses its deadline, librdkafka's clients outlive the broker and
    // their teardown can block the process (journal, 2026-12-06): fail instead of hanging.
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice-perf"))
        .args(["run", path.to_str().expect("utf8"), "--work", w, "--out", o])
        .spawn()
        .expect("run sluice-perf");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("sluice-perf run smoke-kafka did not end within 180 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(status.success(), "sluice-perf run smoke-kafka: {status}");
    let rec = result(&out, "smoke-kafka");
    let runs = rec["runs"].as_array().expect("runs");
    let targets: Vec<&str> = runs.iter().filter_map(|r| r["target"].as_str()).collect();
    assert_eq!(targets, ["sluice-quic", "sluice-kafka"], "{rec}");
    for r in runs {
        let sent = r["sent"].as_u64().expect("sent");
        assert!(sent > 0, "nothing sent: {r}");
        let g = &r["groups"][0];
        assert_eq!(g["lost"], 0, "{g}");
        assert_eq!(g["received"].as_u64(), Some(sent), "{g}");
        assert!(
            r["server_cpu_s"].as_f64().is_some_and(|s| s > 0.0),
            "server CPU measured: {r}"
        );
    }
    let md = std::fs::read_to_string(out.join("smoke-kafka-latest.md")).expect("report");
    assert!(
        md.contains("sluice-quic / sluice-kafka server CPU per message")
            && md.contains("sluice-quic / sluice-kafka throughput"),
        "{md}"
    );
}
