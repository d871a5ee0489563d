//! Smoke runs of each perf scenario against Sluice (seconds, not minutes): the suite itself
//! works, writes its JSON and Markdown, and moves messages. Figures are not checked (no timed
//! assertions); peers are not run here.

use std::path::Path;
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

/// The one JSON result of `kind` written to `dir`.
fn result(dir: &Path, kind: &str) -> serde_json::Value {
    let mut found = std::fs::read_dir(dir)
        .expect("results dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string();
            name.starts_with(&format!("{kind}-")) && name.ends_with(".json")
        })
        .collect::<Vec<_>>();
    assert_eq!(found.len(), 1, "one {kind} result in {}", dir.display());
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(found.remove(0)).expect("read")).expect("json");
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
}
