//! The simulator campaign: random faults against 4 nodes × 3 groups, invariants after every
//! step, liveness after healing. `sim_ci` runs in CI (seconds); `campaign` is the long run:
//!
//! ```text
//! SLUICE_SIM_SEEDS=1000 SLUICE_SIM_STEPS=100000 cargo test -p sluice-raft --release \
//!     --test campaign -- --ignored --exact campaign --nocapture
//! ```
//!
//! Seeds are `SLUICE_SEED` (or a random base, printed) plus 0..SLUICE_SIM_SEEDS; a failure
//! prints the seed that replays it: `SLUICE_SEED=<seed> SLUICE_SIM_SEEDS=1 cargo test ...`.

mod sim;

use sim::{add_stats, env_u64, seed_from_env, Faults, Sim, Stats};

fn run_seed(seed: u64, steps: u64) -> Stats {
    let mut s = Sim::new(seed, 4, 3, 3, Faults::chaos());
    for k in 0..steps {
        s.step();
        if k % 2000 == 1999 {
            s.check_log_matching();
        }
    }
    s.check_log_matching();
    s.check_durability();
    s.settle_and_check_liveness(30_000);
    s.stats.clone()
}

fn campaign_with(default_seeds: u64, default_steps: u64) {
    let base = seed_from_env();
    let seeds = env_u64("SLUICE_SIM_SEEDS", default_seeds);
    let steps = env_u64("SLUICE_SIM_STEPS", default_steps);
    eprintln!("campaign: base seed {base}, {seeds} seeds x {steps} steps");
    let mut total = Stats::default();
    let t = std::time::Instant::now();
    for k in 0..seeds {
        let seed = base.wrapping_add(k);
        let st = run_seed(seed, steps);
        add_stats(&mut total, &st);
    }
    eprintln!(
        "campaign: {seeds} seeds in {:.1} s; totals {total:?}",
        t.elapsed().as_secs_f64()
    );
    assert!(total.acked > 0, "the campaign acknowledged nothing");
    assert!(
        total.large_proposals > 0 && total.oversized_reads > 0,
        "the campaign proposed no batch over max_append_bytes, or never read one back"
    );
}

#[test]
fn sim_ci() {
    campaign_with(50, 20_000);
}

#[test]
#[ignore]
fn campaign() {
    campaign_with(1000, 100_000);
}

/// The long run with five replicas per group (two may be down at once: figure-8 territory).
/// `SLUICE_SIM_SEEDS=200 SLUICE_SIM_STEPS=100000 cargo test -p sluice-raft --release --test
/// campaign -- --ignored campaign_five --nocapture`
#[test]
#[ignore]
fn campaign_five() {
    let base = seed_from_env();
    let seeds = env_u64("SLUICE_SIM_SEEDS", 200);
    let steps = env_u64("SLUICE_SIM_STEPS", 100_000);
    eprintln!("campaign_five: base seed {base}, {seeds} seeds x {steps} steps");
    let mut total = Stats::default();
    for k in 0..seeds {
        let mut s = Sim::new(base.wrapping_add(k), 5, 2, 5, Faults::chaos());
        for i in 0..steps {
            s.step();
            if i % 2000 == 1999 {
                s.check_log_matching();
            }
        }
        s.check_durability();
        s.settle_and_check_liveness(30_000);
        add_stats(&mut total, &s.stats);
    }
    eprintln!("campaign_five: totals {total:?}");
}
