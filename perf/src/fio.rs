//! The disk's own limit, measured by fio in the same run: sequential O_DIRECT writes with an
//! fdatasync after each, as a plain blocking loop (the floor any commit path is measured against).

use serde::Serialize;
use std::path::Path;
use std::process::Command;

#[derive(Debug, Clone, Serialize)]
pub struct FioResult {
    pub block_bytes: u64,
    pub bandwidth_mb_s: f64,
    pub ops_per_s: f64,
    /// fdatasync latency percentiles, microseconds.
    pub sync_p50_us: f64,
    pub sync_p99_us: f64,
    pub sync_p999_us: f64,
    /// write latency percentiles (before the sync), microseconds.
    pub write_p50_us: f64,
    pub write_p99_us: f64,
}

pub fn available() -> bool {
    Command::new("fio")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn pct(v: &serde_json::Value, key: &str) -> f64 {
    v.get("percentile")
        .and_then(|p| p.get(key))
        .and_then(serde_json::Value::as_f64)
        .unwrap_or(f64::NAN)
        / 1000.0
}

/// Runs fio: `block_bytes` writes with O_DIRECT and fdatasync after each, for `seconds`.
pub fn run(dir: &Path, block_bytes: u64, seconds: u64) -> Result<FioResult, String> {
    let file = dir.join("fio.floor");
    let out = Command::new("fio")
        .args([
            "--name=floor",
            &format!("--filename={}", file.display()),
            "--size=1G",
            &format!("--bs={block_bytes}"),
            "--rw=write",
            "--direct=1",
            "--fdatasync=1",
            "--ioengine=psync",
            &format!("--runtime={seconds}"),
            "--time_based",
            "--percentile_list=50:99:99.9",
            "--output-format=json",
        ])
        .output()
        .map_err(|e| format!("fio: {e}"))?;
    let _ = std::fs::remove_file(&file);
    if !out.status.success() {
        return Err(format!(
            "fio failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("fio json: {e}"))?;
    let job = &v["jobs"][0];
    let w = &job["write"];
    let s = &job["sync"]["lat_ns"];
    Ok(FioResult {
        block_bytes,
        bandwidth_mb_s: w["bw_bytes"].as_f64().unwrap_or(0.0) / 1e6,
        ops_per_s: w["iops"].as_f64().unwrap_or(0.0),
        sync_p50_us: pct(s, "50.000000"),
        sync_p99_us: pct(s, "99.000000"),
        sync_p999_us: pct(s, "99.900000"),
        write_p50_us: pct(&w["clat_ns"], "50.000000"),
        write_p99_us: pct(&w["clat_ns"], "99.000000"),
    })
}
