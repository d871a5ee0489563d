//! The fault schedule: drawn from the seed alone (not from timing), so a seed replays it.

use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// Quiet load before each fault.
pub const QUIET_MS_MIN: u64 = 800;
pub const QUIET_MS_MAX: u64 = 2_000;
/// How long a SIGSTOP lasts: from shorter to longer than the clients' request timeout.
pub const PAUSE_MS_MIN: u64 = 300;
pub const PAUSE_MS_MAX: u64 = 3_000;

/// The kinds of fault, as `--faults` names them.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// kill -9, restart.
    Kill,
    /// SIGSTOP for a while, SIGCONT.
    Pause,
    /// Power loss through faultfs (plain or torn), kill -9, power on, restart.
    Power,
    /// kill -9, restart with the clock skewed.
    Skew,
}

impl FaultKind {
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill",
            FaultKind::Pause => "pause",
            FaultKind::Power => "power",
            FaultKind::Skew => "skew",
        }
    }

    pub fn parse(s: &str) -> Option<FaultKind> {
        [
            FaultKind::Kill,
            FaultKind::Pause,
            FaultKind::Power,
            FaultKind::Skew,
        ]
        .into_iter()
        .find(|k| k.name() == s)
    }
}

/// One round's fault, with its parameters.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    pub round: u64,
    /// Which node (always 0 until the cluster exists).
    pub node: usize,
    pub kind: FaultKind,
    /// Load before the fault.
    pub quiet_ms: u64,
    /// Pause: how long stopped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pause_ms: Option<u64>,
    /// Power: the tear's seed (`None`: a plain power off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tear_seed: Option<u64>,
    /// Power: whether torn.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub torn: bool,
    /// Skew: the restarted node's clock offset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skew_ms: Option<i64>,
}

/// Draws round after round from the seed.
pub struct Schedule {
    rng: SmallRng,
    kinds: Vec<FaultKind>,
    nodes: usize,
    skew_ms_max: i64,
    round: u64,
    /// The first rounds take every kind once, in a seeded order, so that even a short campaign
    /// covers each fault asked for.
    first: Vec<FaultKind>,
}

impl Schedule {
    /// `kinds` must not be empty; `skew_ms_max` ≥ 1.
    pub fn new(seed: u64, kinds: &[FaultKind], nodes: usize, skew_ms_max: i64) -> Schedule {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut first = kinds.to_vec();
        first.shuffle(&mut rng);
        Schedule {
            rng,
            first,
            kinds: kinds.to_vec(),
            nodes: nodes.max(1),
            skew_ms_max: skew_ms_max.max(1),
            round: 0,
        }
    }
}

impl Iterator for Schedule {
    type Item = Planned;

    fn next(&mut self) -> Option<Planned> {
        let drawn = *self
            .kinds
            .get(self.rng.gen_range(0..self.kinds.len().max(1)))?;
        let kind = self.first.pop().unwrap_or(drawn);
        // Every parameter is drawn every round, whatever the kind, so that the draws of later
        // rounds do not depend on this one's kind.
        let node = self.rng.gen_range(0..self.nodes);
        let quiet_ms = self.rng.gen_range(QUIET_MS_MIN..QUIET_MS_MAX);
        let pause_ms = self.rng.gen_range(PAUSE_MS_MIN..PAUSE_MS_MAX);
        let tear_seed: u64 = self.rng.gen();
        let torn = self.rng.gen_bool(0.5);
        let mut skew_ms = self.rng.gen_range(-self.skew_ms_max..=self.skew_ms_max);
        if skew_ms == 0 {
            skew_ms = self.skew_ms_max;
        }
        let planned = Planned {
            round: self.round,
            node,
            kind,
            quiet_ms,
            pause_ms: (kind == FaultKind::Pause).then_some(pause_ms),
            tear_seed: (kind == FaultKind::Power && torn).then_some(tear_seed),
            torn: kind == FaultKind::Power && torn,
            skew_ms: (kind == FaultKind::Skew).then_some(skew_ms),
        };
        self.round += 1;
        Some(planned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_its_schedule_and_another_differs() {
        let kinds = [
            FaultKind::Kill,
            FaultKind::Pause,
            FaultKind::Power,
            FaultKind::Skew,
        ];
        let a: Vec<Planned> = Schedule::new(7, &kinds, 1, 40).take(20).collect();
        let b: Vec<Planned> = Schedule::new(7, &kinds, 1, 40).take(20).collect();
        let c: Vec<Planned> = Schedule::new(8, &kinds, 1, 40).take(20).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        for p in &a {
            if let Some(s) = p.skew_ms {
                assert!(s != 0 && s.abs() <= 40, "{p:?}");
            }
            assert!((QUIET_MS_MIN..QUIET_MS_MAX).contains(&p.quiet_ms));
        }
        // The first rounds cover every kind.
        let mut first: Vec<FaultKind> = a.iter().take(kinds.len()).map(|p| p.kind).collect();
        first.sort();
        assert_eq!(first, kinds.to_vec());
        // Only the kinds asked for.
        let only: Vec<Planned> = Schedule::new(7, &[FaultKind::Pause], 1, 40)
            .take(10)
            .collect();
        assert!(only.iter().all(|p| p.kind == FaultKind::Pause));
    }
}
