//! The report: operation counts, anomalies by kind with examples, what could not be decided, the
//! margin used — as text for people and JSON for programs.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;

use serde::Serialize;

use crate::anomaly::{Anomaly, AnomalyKind};
use crate::check::{self, Checked, Config, Index};
use crate::history::{Call, History, Outcome};

/// Examples per anomaly kind in the text report (the JSON has them all).
const TEXT_EXAMPLES_MAX: usize = 5;

/// The judgement.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// No anomaly, and every check could decide.
    Pass,
    /// At least one anomaly.
    Fail,
    /// No anomaly, but some check could not decide (see `undecided`): not a pass.
    Undecided,
}

#[derive(Serialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OutcomeCounts {
    pub ok: u64,
    pub fail: u64,
    pub info: u64,
}

/// Indeterminate calls: never an anomaly either way, but counted.
#[derive(Serialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Indeterminate {
    pub sends: u64,
    /// Of those, how many are known to have happened (their payload was delivered).
    pub sends_seen_delivered: u64,
    pub produces: u64,
    /// Calls that never completed at all (counted as `info` above).
    pub never_completed: u64,
}

#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub verdict: Verdict,
    pub margin_us: u64,
    pub dedup_window_us: u64,
    pub drain_us: Option<u64>,
    /// By call kind (`send`, `receive`, ...).
    pub operations: BTreeMap<String, OutcomeCounts>,
    pub indeterminate: Indeterminate,
    pub anomaly_counts: BTreeMap<AnomalyKind, usize>,
    pub anomalies: Vec<Anomaly>,
    pub undecided: Vec<String>,
}

/// Runs every check.
pub fn check(history: &History, cfg: &Config) -> Report {
    let ix = Index::new(history);
    let checks: [fn(&Index, &Config) -> Checked; 8] = [
        check::lost_writes,
        check::double_leases,
        check::deleted_redelivered,
        check::fifo_order,
        check::duplicates_in_window,
        check::stream_offsets,
        check::committed_offsets,
        check::unsent_payloads,
    ];
    let mut all = Checked::default();
    for c in checks {
        let found = c(&ix, cfg);
        all.anomalies.extend(found.anomalies);
        all.undecided.extend(found.undecided);
    }
    let mut operations: BTreeMap<String, OutcomeCounts> = BTreeMap::new();
    let mut ind = Indeterminate::default();
    let delivered: HashSet<(&str, &str)> = ix
        .deliveries
        .values()
        .flatten()
        .map(|d| (d.queue, d.message.payload.as_str()))
        .collect();
    for o in &history.ops {
        let c = operations.entry(o.call.kind().to_string()).or_default();
        match o.outcome {
            Outcome::Ok => c.ok += 1,
            Outcome::Fail => c.fail += 1,
            Outcome::Info => c.info += 1,
        }
        if o.end_us.is_none() {
            ind.never_completed += 1;
        }
        if o.outcome == Outcome::Info {
            match &o.call {
                Call::Send { queue, payload, .. } => {
                    ind.sends += 1;
                    if delivered.contains(&(queue.as_str(), payload.as_str())) {
                        ind.sends_seen_delivered += 1;
                    }
                }
                Call::Produce { .. } => ind.produces += 1,
                _ => {}
            }
        }
    }
    let mut anomaly_counts = BTreeMap::new();
    for a in &all.anomalies {
        *anomaly_counts.entry(a.kind()).or_insert(0) += 1;
    }
    let verdict = if !all.anomalies.is_empty() {
        Verdict::Fail
    } else if !all.undecided.is_empty() {
        Verdict::Undecided
    } else {
        Verdict::Pass
    };
    Report {
        verdict,
        margin_us: cfg.margin_us,
        dedup_window_us: cfg.dedup_window_us,
        drain_us: history.drain_us,
        operations,
        indeterminate: ind,
        anomaly_counts,
        anomalies: all.anomalies,
        undecided: all.undecided,
    }
}

impl Report {
    pub fn kinds(&self) -> Vec<AnomalyKind> {
        self.anomaly_counts.keys().copied().collect()
    }

    pub fn to_json(&self) -> String {
        // Plain data with string keys: serializing cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let verdict = match self.verdict {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::Undecided => "UNDECIDED (not a pass)",
        };
        let _ = writeln!(s, "verdict: {verdict}");
        let _ = writeln!(
            s,
            "margin: {} us ({} ms); dedup window: {} s",
            self.margin_us,
            self.margin_us / 1_000,
            self.dedup_window_us / 1_000_000
        );
        match self.drain_us {
            Some(t) => {
                let _ = writeln!(s, "final drain from {t} us");
            }
            None => {
                let _ = writeln!(s, "no final drain marker");
            }
        }
        let _ = writeln!(s, "operations:        ok    fail    info");
        for (kind, c) in &self.operations {
            let _ = writeln!(s, "  {kind:<16}{:>6}  {:>6}  {:>6}", c.ok, c.fail, c.info);
        }
        let i = &self.indeterminate;
        let _ = writeln!(
            s,
            "indeterminate: {} sends ({} seen delivered), {} produces; {} calls never completed",
            i.sends, i.sends_seen_delivered, i.produces, i.never_completed
        );
        if self.anomalies.is_empty() {
            let _ = writeln!(s, "anomalies: none");
        } else {
            let _ = writeln!(s, "anomalies: {}", self.anomalies.len());
            for kind in AnomalyKind::ALL {
                let Some(n) = self.anomaly_counts.get(&kind) else {
                    continue;
                };
                let _ = writeln!(s, "  {} ({n}):", kind.name());
                for a in self
                    .anomalies
                    .iter()
                    .filter(|a| a.kind() == kind)
                    .take(TEXT_EXAMPLES_MAX)
                {
                    let _ = writeln!(s, "    - {}", a.describe());
                }
                if *n > TEXT_EXAMPLES_MAX {
                    let _ = writeln!(s, "    ... {} more (see --json)", n - TEXT_EXAMPLES_MAX);
                }
            }
        }
        for u in &self.undecided {
            let _ = writeln!(s, "undecided: {u}");
        }
        s
    }
}
