//! A seeded random run of three replicas: proposals, power losses (synced data kept, the rest
//! dropped or torn), restarts, a lost disk, partitions and held flushes. Checked: no two
//! acknowledgements name the same offset; after healing, a leader serves, every replica holds
//! the same committed prefix byte for byte, and every acknowledged proposal is in it, at the
//! offset it was acknowledged at, in the same order everywhere.
//!
//! `SLUICE_SEED=<seed>` replays a run; `SLUICE_RANDOM_RUNS` sets how many seeds one test runs.

mod common;

use common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sluice_cluster::{ProposalTicket, ReplicaError, ReplicaStats};
use sluice_raft::DiskId;
use sluice_storage::fs::CrashMode;
use std::collections::BTreeMap;

/// Events per run.
const STEPS: usize = 300;

fn runs() -> u64 {
    std::env::var("SLUICE_RANDOM_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40)
}

#[test]
fn acknowledged_proposals_survive_crashes_partitions_and_a_lost_disk() {
    let first = seed();
    let total = std::sync::Arc::new(std::sync::Mutex::new(ReplicaStats::default()));
    let runs = runs();
    for k in 0..runs {
        let s = first.wrapping_add(k);
        let t = total.clone();
        let r = std::panic::catch_unwind(|| {
            on_glommio(move || async move {
                let stats = run(s).await;
                add_stats(&mut t.lock().expect("stats"), &stats);
            })
        });
        if let Err(e) = r {
            eprintln!("\n*** random run failed with seed {s}: rerun with SLUICE_SEED={s} SLUICE_RANDOM_RUNS=1 ***\n");
            std::panic::resume_unwind(e);
        }
    }
    let t = total.lock().expect("stats").clone();
    eprintln!("{runs} runs from seed {first}: {t:?}");
    // The paths the runs are meant to take were taken (over enough runs to be sure).
    if runs >= 20 {
        assert!(t.truncations > 0, "no run truncated a follower's suffix");
        assert!(
            t.fetches_served > 0,
            "no run read the log for a lagging follower"
        );
        assert!(
            t.proposals_dropped > 0,
            "no run lost leadership with proposals open"
        );
        assert!(t.commit_floor_writes > 0, "no run wrote a commit floor");
    }
}

async fn run(seed: u64) -> ReplicaStats {
    let mut rng = SmallRng::seed_from_u64(seed);
    // A small leader cache, so catch-up reads the log; batches of up to ~4.5 KiB, so segments
    // (64 KiB) roll.
    let raft = sluice_raft::Config {
        max_cache_bytes: 8 * 1024,
        ..raft_config()
    };
    let mut c = Cluster::with_config(3, seed, raft).await;
    c.pad_bytes = rng.gen_range(0..1500);
    // offset → proposal number, for every acknowledgement ever given.
    let mut acked: BTreeMap<u64, u64> = BTreeMap::new();
    let mut open: Vec<(u64, ProposalTicket)> = Vec::new();
    let mut next = 0u64;
    let mut disks = 0u128;
    let mut lost_disk = false;
    // The highest committed end any replica reported: no more than the true commit, and a
    // replica's floor on disk never exceeds what it reported.
    let mut commit_seen = 0u64;
    // Each node's floor on disk when it went down.
    let mut floor_at_crash: BTreeMap<u64, u64> = BTreeMap::new();
    // What restarted replicas reported committed at once: checked against the final history.
    let mut claims: Vec<(u64, Vec<sluice_storage::ReadBatch>)> = Vec::new();
    let trace = std::env::var("SLUICE_TRACE").is_ok();
    for step in 0..STEPS {
        if trace {
            let st: Vec<_> = (1..=3u64)
                .map(|id| {
                    c.node(id).replica.as_ref().map(|r| {
                        (
                            id,
                            r.role(),
                            r.term(),
                            r.log().end_offset(),
                            r.committed_end(),
                            c.node(id).hold_flush,
                        )
                    })
                })
                .collect();
            eprintln!("step {step} t={} cut={:?} {st:?}", c.now_ms, c.cut);
        }
        let down: Vec<u64> = (1..=3).filter(|&id| c.node(id).replica.is_none()).collect();
        let up = c.up();
        match rng.gen_range(0..100) {
            0..=49 => {
                if let Some(l) = c.serving_leader() {
                    for _ in 0..rng.gen_range(1..4) {
                        match c.propose(l, next) {
                            Ok(t) => open.push((next, t)),
                            Err(ReplicaError::Propose(_) | ReplicaError::NotLeader { .. }) => {}
                            Err(e) => panic!("propose: {e}"),
                        }
                        next += 1;
                    }
                }
            }
            50..=56 if !up.is_empty() => {
                let id = up[rng.gen_range(0..up.len())];
                let mode = if rng.gen_bool(0.5) {
                    CrashMode::DropUnsynced
                } else {
                    CrashMode::Random { seed: rng.gen() }
                };
                if trace {
                    eprintln!("  crash {id} {mode:?}");
                }
                floor_at_crash.insert(id, c.replica(id).stored_commit_floor());
                c.crash(id, mode);
            }
            57..=66 if !down.is_empty() => {
                let id = down[rng.gen_range(0..down.len())];
                c.start(id).await;
                let r = c.replica(id);
                let (end, log_end) = (r.committed_end(), r.log().end_offset());
                let floor = floor_at_crash.get(&id).copied().unwrap_or(0);
                assert!(
                    end >= floor.min(log_end),
                    "seed {seed}: node {id} restarted at {end}, below its floor {floor} (log end {log_end})"
                );
                assert!(
                    end <= commit_seen,
                    "seed {seed}: node {id} restarted claiming {end} committed; the commit is {commit_seen}"
                );
                claims.push((id, c.committed(id).await));
                if trace {
                    let r = c.replica(id);
                    eprintln!(
                        "  start {id}: end {} last term {} hs {:?}",
                        r.log().end_offset(),
                        r.log().last_term(),
                        r.hard_state()
                    );
                }
            }
            // One disk lost per run, while the other two are up: the node comes back empty,
            // on a new disk id; the leader makes it a learner and promotes it once caught up.
            67..=68 if !lost_disk && down.len() == 1 => {
                lost_disk = true;
                disks += 1;
                c.start_on_new_disk(down[0], DiskId(0xD15C_0000 + disks))
                    .await;
            }
            69..=74 => {
                let id = rng.gen_range(1..=3);
                c.isolate(id);
            }
            75..=79 => {
                let (a, b) = (rng.gen_range(1..=3), rng.gen_range(1..=3));
                if a != b {
                    c.cut.insert((a, b));
                }
            }
            80..=86 => c.heal(),
            87..=92 => {
                let id = rng.gen_range(1..=3);
                let n = c.node_mut(id);
                n.hold_flush = !n.hold_flush;
            }
            _ => {}
        }
        c.rounds(rng.gen_range(1..12)).await;
        for id in c.up() {
            commit_seen = commit_seen.max(c.replica(id).committed_end());
        }
        if step % 25 == 0 {
            check_prefixes_agree(&c, seed).await;
        }
        let before = acked.clone();
        collect(&mut open, &mut acked);
        // Acknowledged means flushed on a majority: what the disks have synced holds it on at
        // least two (a disk lost after its flush report still counts: see durable_copies).
        for (&off, &n) in acked.iter().filter(|(o, _)| !before.contains_key(o)) {
            let copies = c.durable_copies(off, n).await;
            assert!(
                copies >= 2,
                "seed {seed}: proposal {n} at {off} acknowledged, durable on {copies} disks"
            );
        }
        if trace && acked.len() != before.len() {
            let new: Vec<_> = acked
                .iter()
                .filter(|(o, _)| !before.contains_key(o))
                .collect();
            eprintln!("  acked now {new:?}");
        }
    }
    // Heal everything; every node comes back; a leader must serve and everyone catch up.
    c.heal();
    for id in 1..=3 {
        if c.node(id).replica.is_none() {
            c.start(id).await;
        }
        c.node_mut(id).hold_flush = false;
    }
    // Caught up: nothing staged anywhere (a leader may acknowledge on its followers' flushes
    // before its own), and every replica's readable committed prefix ends at the leader's log.
    let caught_up = |c: &Cluster| {
        c.serving_leader().is_some_and(|l| {
            let end = c.replica(l).log().end_offset();
            c.up().iter().all(|&id| {
                let r = c.replica(id);
                !r.has_unflushed() && r.committed_end() == end
            })
        })
    };
    let ok = c.run_until(60_000, caught_up).await;
    assert!(
        ok,
        "seed {seed}: no leader with everyone caught up: {:?}",
        c.roles()
    );
    collect(&mut open, &mut acked);
    let leader = c.serving_leader().expect("leader");
    let reference = c.committed(leader).await;
    if trace {
        for id in 1..=3u64 {
            let r = c.replica(id);
            eprintln!(
                "node {id}: {:?} term {} end {} committed {} unflushed {} hold {} t={}",
                r.role(),
                r.term(),
                r.log().end_offset(),
                r.committed_end(),
                r.has_unflushed(),
                c.node(id).hold_flush,
                c.now_ms
            );
            let bs = c.batches(id, u64::MAX).await;
            let tail: Vec<_> = bs
                .iter()
                .filter(|b| b.header.base_offset >= 185)
                .map(|b| {
                    (
                        b.header.base_offset,
                        b.header.record_count,
                        b.header.term,
                        proposal_of(b),
                    )
                })
                .collect();
            eprintln!("  {tail:?}");
        }
    }
    for id in 1..=3 {
        let bs = c.committed(id).await;
        assert_eq!(bs.len(), reference.len(), "seed {seed}: node {id}");
        for (a, b) in bs.iter().zip(&reference) {
            assert!(
                same_batch(a, b),
                "seed {seed}: node {id} differs at offset {}",
                a.header.base_offset
            );
        }
        let held: BTreeMap<u64, Option<u64>> = bs
            .iter()
            .map(|b| (b.header.base_offset, proposal_of(b)))
            .collect();
        for (&off, &n) in &acked {
            assert_eq!(
                held.get(&off).copied().flatten(),
                Some(n),
                "seed {seed}: node {id}: acknowledged proposal {n} at {off}"
            );
        }
    }
    // Nothing a restarted replica reported committed was later cut or rewritten.
    for (id, claim) in &claims {
        assert!(
            claim.len() <= reference.len(),
            "seed {seed}: node {id}'s claim"
        );
        for (a, b) in claim.iter().zip(&reference) {
            assert!(
                same_batch(a, b),
                "seed {seed}: node {id} reported {} committed at restart; it was not",
                a.header.base_offset
            );
        }
    }
    let configs = reference
        .iter()
        .filter(|b| sluice_cluster::entry::batch_membership(b).is_some())
        .count();
    eprintln!(
        "seed {seed}: {next} proposals, {} acknowledged, {} batches committed, {configs} membership changes, lost disk {lost_disk}, {} segments of {} bytes, term {}",
        acked.len(),
        reference.len(),
        c.replica(leader).log().segments().len(),
        c.replica(leader).log().size_bytes(),
        c.replica(leader).term()
    );
    c.total_stats()
}

/// The committed prefixes of the live replicas agree, byte for byte, as far as both reach.
async fn check_prefixes_agree(c: &Cluster, seed: u64) {
    let up = c.up();
    for (i, &a) in up.iter().enumerate() {
        for &b in &up[i + 1..] {
            let end = c
                .replica(a)
                .committed_end()
                .min(c.replica(b).committed_end());
            let (x, y) = (c.batches(a, end).await, c.batches(b, end).await);
            assert_eq!(
                x.len(),
                y.len(),
                "seed {seed}: nodes {a} and {b} below {end}"
            );
            for (p, q) in x.iter().zip(&y) {
                assert!(
                    same_batch(p, q),
                    "seed {seed}: nodes {a} and {b} differ at {}",
                    p.header.base_offset
                );
            }
        }
    }
}

/// Moves resolved tickets into `acked`; two acknowledgements at one offset is a safety bug.
fn collect(open: &mut Vec<(u64, ProposalTicket)>, acked: &mut BTreeMap<u64, u64>) {
    open.retain_mut(|(n, t)| match t.try_take() {
        None => true,
        Some(Ok(info)) => {
            if let Some(prev) = acked.insert(info.base_offset, *n) {
                panic!(
                    "offset {} acknowledged for proposals {prev} and {n}",
                    info.base_offset
                );
            }
            false
        }
        Some(Err(
            ReplicaError::LeadershipLost { .. }
            | ReplicaError::Closed
            | ReplicaError::NotLeader { .. },
        )) => false,
        Some(Err(e)) => panic!("proposal {n}: {e}"),
    });
}
