//! Seeded random histories from the simulated correct service: clean ones must pass, and one
//! planted fault of a random kind must be caught by its check. `SLUICE_SEED` fixes the seed.

use sluice_checker::sim::{generate, Rng, SimConfig};
use sluice_checker::{check, AnomalyKind, Config, History, Verdict};

const ROUNDS_DEFAULT: u64 = 24;

/// `SLUICE_ROUNDS` runs more (a soak); the default keeps `cargo test` quick.
fn rounds() -> u64 {
    std::env::var("SLUICE_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(ROUNDS_DEFAULT)
}

fn base_seed() -> u64 {
    match std::env::var("SLUICE_SEED") {
        Ok(s) => s.parse().expect("SLUICE_SEED must be a number"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
    }
}

#[test]
fn valid_histories_pass() {
    let base = base_seed();
    let mut indeterminate_sends = 0;
    for round in 0..rounds() {
        let seed = base.wrapping_add(round);
        let g = generate(seed, None, SimConfig::default());
        let report = check(&g.history, &Config::default());
        assert_eq!(
            report.verdict,
            Verdict::Pass,
            "SLUICE_SEED={seed}: a valid history did not pass:\n{}",
            report.to_text()
        );
        indeterminate_sends += report.indeterminate.sends;
    }
    // The generator does exercise indeterminate calls.
    assert!(indeterminate_sends > 0, "SLUICE_SEED={base}");
}

#[test]
fn one_planted_fault_is_caught_by_its_check() {
    let base = base_seed();
    for round in 0..rounds() {
        let seed = base.wrapping_add(round);
        let mut rng = Rng::new(seed ^ 0x5eed);
        let kind = AnomalyKind::ALL[rng.below(AnomalyKind::ALL.len() as u64) as usize];
        let g = generate(seed, Some(kind), SimConfig::default());
        assert!(
            g.planted,
            "SLUICE_SEED={seed}: {kind:?} found no moment to plant"
        );
        let report = check(&g.history, &Config::default());
        assert!(
            report.kinds().contains(&kind),
            "SLUICE_SEED={seed}: planted {kind:?}, found {:?}:\n{}",
            report.kinds(),
            report.to_text()
        );
    }
}

#[test]
fn every_kind_is_planted_and_caught() {
    let seed = base_seed();
    for kind in AnomalyKind::ALL {
        let g = generate(seed, Some(kind), SimConfig::default());
        assert!(
            g.planted,
            "SLUICE_SEED={seed}: {kind:?} found no moment to plant"
        );
        let report = check(&g.history, &Config::default());
        assert!(
            report.kinds().contains(&kind),
            "SLUICE_SEED={seed}: planted {kind:?}, found {:?}:\n{}",
            report.kinds(),
            report.to_text()
        );
    }
}

#[test]
fn histories_survive_the_jsonl_round_trip() {
    let seed = base_seed();
    let g = generate(seed, None, SimConfig::default());
    let text = g.history.to_jsonl();
    let back = History::from_jsonl(text.as_bytes()).expect("own output parses");
    let mut ops = g.history.ops.clone();
    ops.sort_by_key(|o| o.id);
    let mut back_ops = back.ops.clone();
    back_ops.sort_by_key(|o| o.id);
    assert_eq!(ops, back_ops, "SLUICE_SEED={seed}");
    assert_eq!(back.drain_us, g.history.drain_us);
}

/// A long history is judged in reasonable time (the checks are near-linear apart from pairs of
/// deliveries of one message and one dedup key). `SLUICE_BIG_STEPS` makes it longer.
#[test]
fn a_long_history_is_judged_quickly() {
    let seed = base_seed();
    let steps = std::env::var("SLUICE_BIG_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    let cfg = SimConfig {
        steps,
        ..SimConfig::default()
    };
    let g = generate(seed, None, cfg);
    let started = std::time::Instant::now();
    let report = check(&g.history, &Config::default());
    let took = started.elapsed();
    println!("{} operations judged in {took:?}", g.history.ops.len());
    assert_eq!(
        report.verdict,
        Verdict::Pass,
        "SLUICE_SEED={seed}:\n{}",
        report.to_text()
    );
}
