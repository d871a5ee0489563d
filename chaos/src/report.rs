//! The campaign's report: rounds, faults by kind, operations by outcome, anomalies by kind,
//! throughput and p99 latency during faults (and outside them), and each fault's recovery time.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use sluice_checker::Outcome;

use crate::load::{Drained, Sample};
use crate::schedule::{FaultKind, Planned};
use crate::Options;

/// A fault's window ends at the first acknowledged send after it healed, or this long after
/// the heal when none came.
const RECOVERY_WINDOW_MAX_US: u64 = 10_000_000;
const US_PER_MS: f64 = 1000.0;
const US_PER_S: f64 = 1_000_000.0;

/// One injected fault.
#[derive(Serialize, Clone, Debug)]
pub struct FaultRecord {
    #[serde(flatten)]
    pub planned: Planned,
    /// History time (µs) when the fault began.
    pub injected_us: u64,
    /// When it was healed: the restart began (kill, power, skew) or SIGCONT was sent (pause).
    pub healed_us: u64,
    /// From the heal to the first acknowledged send that started after it (`None`: none).
    pub recovery_ms: Option<f64>,
    pub note: String,
}

impl FaultRecord {
    pub fn new(planned: Planned, injected_us: u64, healed_us: u64, note: String) -> FaultRecord {
        FaultRecord {
            planned,
            injected_us,
            healed_us,
            recovery_ms: None,
            note,
        }
    }
}

#[derive(Serialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub ok: u64,
    pub fail: u64,
    pub info: u64,
}

impl Counts {
    fn add(&mut self, o: Outcome) {
        match o {
            Outcome::Ok => self.ok += 1,
            Outcome::Fail => self.fail += 1,
            Outcome::Info => self.info += 1,
        }
    }
}

/// Load inside or outside the fault windows.
#[derive(Serialize, Clone, Copy, Debug, Default)]
pub struct Window {
    pub seconds: f64,
    pub calls: Counts,
    /// Acknowledged calls per second.
    pub throughput_ok_per_s: f64,
    /// Of the acknowledged calls that started in the window.
    pub latency_p99_ms: Option<f64>,
}

#[derive(Serialize, Clone, Debug)]
pub struct CampaignReport {
    pub seed: u64,
    pub nodes: usize,
    pub faults_allowed: Vec<FaultKind>,
    pub skew_ms_max: i64,
    pub rounds: usize,
    pub faults_by_kind: BTreeMap<FaultKind, u64>,
    pub faults: Vec<FaultRecord>,
    /// Load and drain calls by kind and outcome (`info`: indeterminate).
    pub operations: BTreeMap<String, Counts>,
    pub operations_total: Counts,
    pub during_faults: Window,
    pub outside_faults: Window,
    pub drain: Drained,
    pub verdict: sluice_checker::Verdict,
    pub anomalies_by_kind: BTreeMap<String, usize>,
    pub undecided: Vec<String>,
    pub margin_ms: u64,
}

/// The checker's name of an anomaly kind (`lost_write`, ...).
fn kind_name(k: &sluice_checker::AnomalyKind) -> String {
    match serde_json::to_value(k) {
        Ok(serde_json::Value::String(s)) => s,
        _ => format!("{k:?}"),
    }
}

fn p99_ms(mut latencies_us: Vec<u64>) -> Option<f64> {
    if latencies_us.is_empty() {
        return None;
    }
    latencies_us.sort_unstable();
    let i = (latencies_us.len() * 99).div_ceil(100).saturating_sub(1);
    latencies_us.get(i).map(|&l| l as f64 / US_PER_MS)
}

fn window(samples: &[&Sample], seconds: f64) -> Window {
    let mut calls = Counts::default();
    let mut latencies = Vec::new();
    for s in samples {
        calls.add(s.outcome);
        if s.outcome == Outcome::Ok {
            latencies.push(s.end_us.saturating_sub(s.start_us));
        }
    }
    Window {
        seconds,
        calls,
        throughput_ok_per_s: if seconds > 0.0 {
            calls.ok as f64 / seconds
        } else {
            0.0
        },
        latency_p99_ms: p99_ms(latencies),
    }
}

impl CampaignReport {
    pub fn build(
        seed: u64,
        opts: &Options,
        kinds: &[FaultKind],
        mut faults: Vec<FaultRecord>,
        samples: &[Sample],
        drain: Drained,
        checked: &sluice_checker::Report,
    ) -> CampaignReport {
        // Recovery: the first acknowledged send that started after the heal.
        let mut windows: Vec<(u64, u64)> = Vec::new();
        for f in faults.iter_mut() {
            let first = samples
                .iter()
                .filter(|s| s.kind == "send" && s.outcome == Outcome::Ok)
                .filter(|s| s.start_us >= f.healed_us)
                .map(|s| s.end_us)
                .min();
            f.recovery_ms = first.map(|end| end.saturating_sub(f.healed_us) as f64 / US_PER_MS);
            let end = first
                .unwrap_or(f.healed_us + RECOVERY_WINDOW_MAX_US)
                .min(f.healed_us + RECOVERY_WINDOW_MAX_US);
            windows.push((f.injected_us, end));
        }
        let drain_us = checked.drain_us.unwrap_or(u64::MAX);
        let load: Vec<&Sample> = samples.iter().filter(|s| s.start_us < drain_us).collect();
        let in_fault = |s: &Sample| {
            windows
                .iter()
                .any(|&(a, b)| s.start_us >= a && s.start_us < b)
        };
        let during: Vec<&Sample> = load.iter().copied().filter(|s| in_fault(s)).collect();
        let outside: Vec<&Sample> = load.iter().copied().filter(|s| !in_fault(s)).collect();
        let fault_s: f64 = windows
            .iter()
            .map(|&(a, b)| b.saturating_sub(a) as f64 / US_PER_S)
            .sum();
        let load_s = match (
            load.iter().map(|s| s.start_us).min(),
            load.iter().map(|s| s.end_us).max(),
        ) {
            (Some(a), Some(b)) => b.saturating_sub(a) as f64 / US_PER_S,
            _ => 0.0,
        };
        let mut operations: BTreeMap<String, Counts> = BTreeMap::new();
        let mut total = Counts::default();
        for s in samples {
            operations
                .entry(s.kind.to_string())
                .or_default()
                .add(s.outcome);
            total.add(s.outcome);
        }
        let mut faults_by_kind = BTreeMap::new();
        for f in &faults {
            *faults_by_kind.entry(f.planned.kind).or_insert(0) += 1;
        }
        CampaignReport {
            seed,
            nodes: opts.nodes,
            faults_allowed: kinds.to_vec(),
            skew_ms_max: opts.skew_ms_max,
            rounds: faults.len(),
            faults_by_kind,
            faults,
            operations,
            operations_total: total,
            during_faults: window(&during, fault_s),
            outside_faults: window(&outside, (load_s - fault_s).max(0.0)),
            drain,
            verdict: checked.verdict,
            anomalies_by_kind: checked
                .anomaly_counts
                .iter()
                .map(|(k, n)| (kind_name(k), *n))
                .collect(),
            undecided: checked.undecided.clone(),
            margin_ms: opts.margin_ms,
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    pub fn to_text(&self) -> String {
        let mut t = String::new();
        let _ = writeln!(
            t,
            "sluice-chaos: seed {} (replay: --seed {}), {} node(s), {} round(s), verdict {:?}",
            self.seed, self.seed, self.nodes, self.rounds, self.verdict
        );
        let kinds: Vec<String> = self
            .faults_by_kind
            .iter()
            .map(|(k, n)| format!("{} {n}", k.name()))
            .collect();
        let _ = writeln!(t, "faults: {}", kinds.join(", "));
        let c = self.operations_total;
        let _ = writeln!(
            t,
            "calls: {} acknowledged, {} failed, {} indeterminate",
            c.ok, c.fail, c.info
        );
        for (kind, c) in &self.operations {
            let _ = writeln!(t, "  {kind}: ok {} fail {} info {}", c.ok, c.fail, c.info);
        }
        for (name, w) in [
            ("during faults", &self.during_faults),
            ("outside faults", &self.outside_faults),
        ] {
            let _ = writeln!(
                t,
                "{name}: {:.1} s, {:.1} acknowledged/s, p99 {}, {} indeterminate",
                w.seconds,
                w.throughput_ok_per_s,
                w.latency_p99_ms
                    .map(|l| format!("{l:.1} ms"))
                    .unwrap_or_else(|| "-".into()),
                w.calls.info
            );
        }
        let _ = writeln!(t, "faults (recovery: heal to the first acknowledged send):");
        for f in &self.faults {
            let _ = writeln!(
                t,
                "  round {} node {} {}: recovery {} — {}",
                f.planned.round,
                f.planned.node,
                f.planned.kind.name(),
                f.recovery_ms
                    .map(|r| format!("{r:.0} ms"))
                    .unwrap_or_else(|| "none".into()),
                f.note
            );
        }
        let _ = writeln!(
            t,
            "drain: received {:?}, finished {:?}{}",
            self.drain.received,
            self.drain.finished,
            self.drain
                .planted_lost
                .as_ref()
                .map(|m| format!(", PLANTED lost write: {m}"))
                .unwrap_or_default()
        );
        if self.anomalies_by_kind.is_empty() {
            let _ = writeln!(t, "anomalies: none (margin {} ms)", self.margin_ms);
        } else {
            let _ = writeln!(t, "anomalies (margin {} ms):", self.margin_ms);
            for (k, n) in &self.anomalies_by_kind {
                let _ = writeln!(t, "  {k}: {n}");
            }
        }
        for u in &self.undecided {
            let _ = writeln!(t, "undecided: {u}");
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p99_is_the_99th_percentile() {
        assert_eq!(p99_ms(vec![]), None);
        assert_eq!(p99_ms(vec![5_000]), Some(5.0));
        let l: Vec<u64> = (1..=100).map(|i| i * 1000).collect();
        assert_eq!(p99_ms(l), Some(99.0));
    }
}
