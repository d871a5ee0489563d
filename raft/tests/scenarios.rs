//! The classic cases, scripted on the simulator (written anew after reading etcd/raft's and
//! raft-rs's scenario tests: figure 8, a partitioned old leader, check-quorum, pre-vote against a
//! rejoining node, leadership transfer, membership changes across a leader crash) plus Sluice's
//! own: a replica that lost its disk. Invariants are checked after every step as in the campaign.

mod sim;

use bytes::Bytes;
use sim::{seed_from_env, sim_config, Faults, Sim};
use sluice_raft::{
    Body, ConfChange, Config, DiskId, Durability, Membership, Message, ProposeError, RaftGroup,
    RaftRole, Replica, Restore, Role, SnapshotMeta,
};

const ET: u64 = 300; // sim_config().election_timeout_ms

fn quiet(seed: u64, nodes: usize, voters: usize) -> Sim {
    Sim::new(seed, nodes, 1, voters, Faults::none())
}

/// Figure 8 of the Raft paper: a leader must not count replicas of an entry from an earlier term
/// as committing it; only an entry of its own term commits, and everything before with it.
#[test]
fn figure_8_old_term_entry_commits_only_through_own_term() {
    let disks = [DiskId(11), DiskId(22), DiskId(33)];
    let replicas: Vec<Replica> = (0..3)
        .map(|i| Replica {
            node: i as u64 + 1,
            disk: disks[i],
        })
        .collect();
    let restore = Restore {
        node: 1,
        hard_state: sluice_raft::HardState {
            term: 2,
            vote: None,
            disk: disks[0],
        },
        base: Some(SnapshotMeta {
            offset: 0,
            term: 0,
            membership: Membership::voters(&replicas),
        }),
        // The old leader of term 1 left a batch [0, 3) here and on one other replica only.
        log_end: 3,
        term_starts: vec![(1, 0)],
        configs: vec![],
    };
    let mut g = RaftGroup::new(0, sim_config(), restore, 0, 7).expect("restore");
    let msg = |term, body| Message {
        group: 0,
        from: 2,
        to: 1,
        term,
        body,
    };
    assert!(g.campaign_now());
    g.ready();
    g.step(
        1,
        msg(
            3,
            Body::VoteResp {
                pre: true,
                granted: true,
                disk: disks[1],
            },
        ),
    )
    .unwrap();
    assert_eq!(g.role(), RaftRole::Candidate);
    g.step(
        2,
        msg(
            3,
            Body::VoteResp {
                pre: false,
                granted: true,
                disk: disks[1],
            },
        ),
    )
    .unwrap();
    assert_eq!(g.role(), RaftRole::Leader);
    assert_eq!(g.log_end(), 4, "the leader appended its no-op");
    assert_eq!(
        g.propose(Bytes::from_static(b"x"), 1),
        Err(ProposeError::TermNotConfirmed)
    );
    let r = g.ready();
    g.on_flushed(r.log_epoch, 4);
    // Node 2 holds the term-1 batch flushed (a majority with us) but not yet our no-op.
    let ack = |appended, flushed| {
        msg(
            3,
            Body::AppendResp {
                disk: disks[1],
                appended,
                flushed,
                reject: None,
            },
        )
    };
    g.step(3, ack(3, 3)).unwrap();
    assert_eq!(
        g.commit(),
        0,
        "an old-term entry is not committed by counting"
    );
    assert!(!g.is_serving());
    g.step(4, ack(4, 3)).unwrap();
    assert_eq!(g.commit(), 0, "written is not flushed");
    g.step(5, ack(4, 4)).unwrap();
    assert_eq!(
        g.commit(),
        4,
        "the own-term no-op commits, and the old batch with it"
    );
    assert!(g.is_serving());
    // An answer from node 2 on another disk is not counted, whatever it claims.
    g.step(
        6,
        msg(
            3,
            Body::AppendResp {
                disk: DiskId(99),
                appended: 100,
                flushed: 100,
                reject: None,
            },
        ),
    )
    .unwrap();
    assert_eq!(g.commit(), 4);
}

/// Figure 8 end to end: five replicas, chaos with up to two down at once; the simulator's
/// invariants (no committed entry lost or changed) must hold across many leader changes.
#[test]
fn figure_8_five_replicas_under_chaos() {
    let base = seed_from_env();
    for k in 0..3 {
        let mut s = Sim::new(base.wrapping_add(k), 5, 2, 5, Faults::chaos());
        s.run(10_000);
        s.check_log_matching();
        s.check_durability();
        s.settle_and_check_liveness(30_000);
        assert!(s.stats.leaders_elected > 2, "{}", s.summary());
    }
}

/// A leader cut off from the others stops serving within an election timeout or two
/// (check-quorum), what it accepted alone is never committed and is overwritten on rejoin.
#[test]
fn partitioned_old_leader() {
    let mut s = quiet(seed_from_env(), 3, 3);
    let l1 = s.await_leader(0, 5_000);
    for _ in 0..5 {
        s.propose_on(l1, 0);
    }
    s.run_ms(200);
    let t1 = s.group(l1, 0).unwrap().term();
    s.isolate(l1, u64::MAX);
    let stale = s.propose_on(l1, 0);
    s.run_ms(3 * ET);
    assert_ne!(
        s.group(l1, 0).unwrap().role(),
        RaftRole::Leader,
        "check-quorum"
    );
    let l2 = s.await_leader(0, 5_000);
    assert_ne!(l1, l2);
    assert!(s.group(l2, 0).unwrap().term() > t1);
    let fresh = s.propose_on(l2, 0);
    s.run_ms(300);
    assert!(s.committed(0, &fresh));
    s.heal();
    s.run_ms(1_000);
    assert!(!s.committed(0, &stale));
    let old = s.group(l1, 0).unwrap();
    assert_ne!(
        old.term_at(stale.offset),
        Some(stale.term),
        "stale entry overwritten"
    );
    assert_eq!(old.commit(), s.group(l2, 0).unwrap().commit());
    s.check_log_matching();
    s.check_durability();
}

/// A leader that can send but hears nothing back steps down (check-quorum), and the others,
/// who stop hearing from it, elect a new leader.
#[test]
fn check_quorum_steps_down_a_deaf_leader() {
    let mut s = quiet(seed_from_env(), 3, 3);
    let l1 = s.await_leader(0, 5_000);
    for b in 1..=3 {
        if b != l1 {
            s.blocked.insert((b, l1), u64::MAX);
        }
    }
    s.run_ms(2 * ET + 50);
    assert_ne!(s.group(l1, 0).unwrap().role(), RaftRole::Leader);
    let l2 = s.await_leader(0, 5_000);
    assert_ne!(l1, l2);
}

/// A follower partitioned away for many election timeouts never bumps its term (pre-vote), so
/// when it returns the leader is not disrupted.
#[test]
fn prevote_stops_a_rejoining_node_from_disrupting() {
    let mut s = quiet(seed_from_env(), 3, 3);
    let l = s.await_leader(0, 5_000);
    let term = s.group(l, 0).unwrap().term();
    let f = (1..=3).find(|&n| n != l).unwrap();
    s.isolate(f, u64::MAX);
    s.run_ms(10 * ET);
    assert_eq!(
        s.group(f, 0).unwrap().term(),
        term,
        "pre-vote kept the term"
    );
    s.heal();
    s.run_ms(5 * ET);
    assert_eq!(s.leader_id(0), Some(l));
    assert_eq!(s.group(l, 0).unwrap().term(), term);
    let p = s.propose_on(l, 0);
    s.run_ms(200);
    assert!(s.committed(0, &p));
}

/// A replica whose disk is lost comes back with a new disk id: it never votes with its empty
/// log, the leader demotes it to a learner on the new disk, and promotes it once caught up.
#[test]
fn lost_disk_replica_rejoins_as_learner() {
    let mut s = quiet(seed_from_env(), 3, 3);
    let l = s.await_leader(0, 5_000);
    for _ in 0..20 {
        s.propose_on(l, 0);
    }
    s.run_ms(300);
    let f = (1..=3).find(|&n| n != l).unwrap();
    let fi = s.idx(f);
    s.crash(fi, false, false, true);
    s.restart(fi);
    let g = s.group(f, 0).unwrap();
    let new_disk = g.disk();
    assert!(!g.is_voter());
    assert!(
        g.membership().members.is_empty(),
        "an empty disk knows no membership"
    );
    s.run_ms(3_000);
    let m = s.group(l, 0).unwrap().membership().clone();
    assert_eq!(
        m.get(f),
        Some((
            Replica {
                node: f,
                disk: new_disk
            },
            Role::Voter
        )),
        "rejoined and promoted on its new disk"
    );
    assert_eq!(
        s.group(f, 0).unwrap().log_end(),
        s.group(l, 0).unwrap().log_end()
    );
    s.check_durability();
}

/// Kafka's "last replica standing": the committed data lives on the leader and one follower;
/// that follower loses its disk and the leader crashes. The stale third replica must not be
/// elected with the amnesiac's vote; once the old leader returns, nothing committed is lost.
#[test]
fn amnesiac_replica_cannot_elect_a_stale_leader() {
    let mut s = quiet(seed_from_env(), 3, 3);
    let l = s.await_leader(0, 5_000);
    let others: Vec<u64> = (1..=3).filter(|&n| n != l).collect();
    let (a, b) = (others[0], others[1]);
    s.isolate(b, u64::MAX);
    let mut committed = Vec::new();
    for _ in 0..10 {
        committed.push(s.propose_on(l, 0));
    }
    s.run_ms(300);
    assert!(committed.iter().all(|p| s.committed(0, p)));
    let (ai, li) = (s.idx(a), s.idx(l));
    s.crash(ai, false, false, true);
    s.crash(li, false, false, false);
    s.heal();
    s.restart(ai);
    s.run_ms(10 * ET);
    assert_eq!(
        s.leader_id(0),
        None,
        "no leader from a stale log and an empty disk"
    );
    assert_eq!(
        s.group(a, 0).unwrap().hard_state().vote,
        None,
        "the amnesiac never voted"
    );
    s.restart(li);
    let nl = s.await_leader(0, 5_000);
    assert_eq!(nl, l, "only the replica holding the committed data can win");
    s.run_ms(3_000);
    assert!(committed.iter().all(|p| s.committed(0, p)));
    assert_eq!(
        s.group(l, 0)
            .unwrap()
            .membership()
            .get(a)
            .map(|(r, role)| (r.disk, role)),
        Some((s.group(a, 0).unwrap().disk(), Role::Voter))
    );
    s.check_durability();
}

/// Leadership transfer while proposals keep coming: proposals are refused while it runs, the
/// target takes over well within an election timeout, and nothing acknowledged is lost.
#[test]
fn leadership_transfer_under_load() {
    let mut s = quiet(seed_from_env(), 3, 3);
    let l = s.await_leader(0, 5_000);
    let target = (1..=3).find(|&n| n != l).unwrap();
    for _ in 0..50 {
        s.propose_on(l, 0);
        s.run_ms(2);
    }
    let start = s.now;
    s.group_mut(l, 0)
        .unwrap()
        .transfer_leadership(target)
        .unwrap();
    let li = s.idx(l);
    s.drive(li);
    assert_eq!(
        s.group_mut(l, 0)
            .unwrap()
            .propose(Bytes::from_static(b"x"), 1),
        Err(ProposeError::TransferInProgress)
    );
    let ok = s.run_until(ET, |s| s.leader_id(0) == Some(target));
    assert!(ok, "transfer did not complete within an election timeout");
    let took_ms = s.now - start;
    assert!(took_ms < ET, "transfer took {took_ms} ms");
    for _ in 0..20 {
        s.propose_on(target, 0);
        s.run_ms(2);
    }
    s.run_ms(300);
    s.check_durability();
    // Proposals still uncommitted on the old leader when it hands over are reported dropped
    // (outcome unknown, the client retries) even though the new leader commits them.
    assert!(s.stats.acked >= 60, "{}", s.summary());
}

/// A learner's promotion is appended and the leader crashes before it commits: whichever way
/// the new leader resolves it, the membership converges, the learner ends up a voter, and no
/// invariant breaks. Then the leader removes itself and steps down.
#[test]
fn membership_change_during_leader_crash() {
    let mut s = quiet(seed_from_env(), 4, 3);
    let l = s.await_leader(0, 5_000);
    for _ in 0..10 {
        s.propose_on(l, 0);
    }
    let disk4 = s.nodes[3].disks[&0].id;
    assert_eq!(
        s.group_mut(l, 0)
            .unwrap()
            .propose_change(ConfChange::Promote(4)),
        Err(sluice_raft::ChangeError::UnknownNode(4))
    );
    s.group_mut(l, 0)
        .unwrap()
        .propose_change(ConfChange::AddLearner {
            replica: Replica {
                node: 4,
                disk: disk4,
            },
            auto_promote: true,
        })
        .unwrap();
    let li = s.idx(l);
    s.drive(li);
    // Crash the leader as soon as it appends the promotion.
    let ok = s.run_until(2_000, |s| {
        s.group(l, 0)
            .is_some_and(|g| matches!(g.membership().get(4), Some((_, Role::Voter))))
    });
    assert!(ok, "learner was not promoted");
    s.crash(li, false, false, false);
    let l2 = s.await_leader(0, 5_000);
    s.run_ms(1_000);
    let m = s.group(l2, 0).unwrap().membership().clone();
    assert_eq!(m.get(4).map(|(_, r)| r), Some(Role::Voter));
    assert_eq!(m.voter_count(), 4);
    s.restart(li);
    s.run_ms(1_000);
    // One change at a time.
    let g = s.group_mut(l2, 0).unwrap();
    g.propose_change(ConfChange::Remove(l2)).unwrap();
    assert!(matches!(
        g.propose_change(ConfChange::Demote(4)),
        Err(sluice_raft::ChangeError::ChangePending(_))
    ));
    let i2 = s.idx(l2);
    s.drive(i2);
    let stepped_down = s.run_until(2_000, |s| {
        s.group(l2, 0).is_some_and(|g| g.role() != RaftRole::Leader)
    });
    assert!(
        stepped_down,
        "a removed leader steps down once its removal commits"
    );
    let l3 = s.await_leader(0, 5_000);
    assert_ne!(l3, l2);
    assert!(s.group(l3, 0).unwrap().membership().get(l2).is_none());
    s.check_durability();
    s.check_log_matching();
}

/// Snapshots: a replica that is down while the others compact past what it holds catches up
/// from a snapshot (the simulator checks the installed state against the history).
#[test]
fn snapshot_for_a_follower_behind_the_log_start() {
    let mut s = quiet(seed_from_env(), 3, 3);
    let l = s.await_leader(0, 5_000);
    let f = (1..=3).find(|&n| n != l).unwrap();
    let fi = s.idx(f);
    s.crash(fi, false, false, false);
    for _ in 0..30 {
        s.propose_on(l, 0);
        s.run_ms(5);
    }
    s.run_ms(200);
    for i in 0..3 {
        for _ in 0..5 {
            s.compact(i, 0);
        }
    }
    let start = s.group(l, 0).unwrap().log_start();
    assert!(start > 0);
    s.restart(fi);
    s.run_ms(2_000);
    assert!(s.stats.snapshots_installed >= 1, "{}", s.summary());
    assert_eq!(
        s.group(f, 0).unwrap().commit(),
        s.group(l, 0).unwrap().commit()
    );
    s.check_log_matching();
}

/// Relaxed durability is an opt-in: with nothing ever flushed, the default commits nothing,
/// and `RelaxedWritten` commits on written (page-cache) copies.
#[test]
fn relaxed_durability_only_when_asked() {
    let no_flush = Faults {
        flush: 0.0,
        ..Faults::none()
    };
    let mut strict = Sim::new(seed_from_env(), 3, 1, 3, no_flush.clone());
    strict.run_ms(3_000);
    assert_eq!(
        strict.leader_id(0),
        None,
        "no term confirmed without a flush"
    );
    assert!(strict.history[&0].is_empty());

    let cfg = Config {
        durability: Durability::RelaxedWritten {
            flush_interval_ms: 100,
        },
        ..sim_config()
    };
    let mut relaxed = Sim::with_config(seed_from_env(), 3, 1, 3, no_flush, cfg);
    relaxed.check_flushed_on_ack = false;
    let l = relaxed.await_leader(0, 5_000);
    let p = relaxed.propose_on(l, 0);
    relaxed.run_ms(100);
    assert!(relaxed.committed(0, &p));
}

const MIB: usize = 1024 * 1024;

/// The production limits (512 KiB appends, 8 MiB entries, 4 MiB window, 8 MiB cache) with the
/// simulator's short timers.
fn production_limits() -> Config {
    Config {
        heartbeat_interval_ms: 50,
        election_timeout_ms: ET,
        ..Config::default()
    }
}

/// A 1 MiB SQS message and a 4 MiB partition batch, both above the 512 KiB append size, commit
/// on every replica — including one that was down meanwhile and catches up after the leader's
/// cache dropped what it misses: the log owner's reads (bounded by `max_append_bytes`) return
/// the one oversized batch, which goes alone in its own append.
#[test]
fn large_entries_commit_on_every_replica_including_catch_up() {
    let mut s = Sim::with_config(
        seed_from_env(),
        3,
        1,
        3,
        Faults::none(),
        production_limits(),
    );
    let l = s.await_leader(0, 5_000);
    let mut proposals = Vec::new();
    for len in [MIB, 4 * MIB] {
        let (data, count) = s.payload_of(len);
        proposals.push(s.propose_data_on(l, 0, data, count));
    }
    s.run_ms(300);
    let end = proposals.last().unwrap().end;
    assert!(proposals.iter().all(|p| s.committed(0, p)));
    for n in 1..=3 {
        assert!(s.group(n, 0).unwrap().commit() >= end, "node {n} behind");
    }

    let f = (1..=3).find(|&n| n != l).unwrap();
    let fi = s.idx(f);
    s.crash(fi, false, false, false);
    // 10 MiB: more than the leader's 8 MiB cache holds for the replica that is down.
    for len in [MIB, 4 * MIB, 4 * MIB, MIB, 100] {
        let (data, count) = s.payload_of(len);
        proposals.push(s.propose_data_on(l, 0, data, count));
        s.run_ms(50);
    }
    s.run_ms(300);
    assert!(
        proposals.iter().all(|p| s.committed(0, p)),
        "{}",
        s.summary()
    );
    let oversized_before = s.stats.oversized_reads;
    s.restart(fi);
    s.run_ms(2_000);
    let end = proposals.last().unwrap().end;
    assert!(s.group(f, 0).unwrap().commit() >= end, "{}", s.summary());
    assert!(
        s.nodes[fi].applied[&0].0 >= end,
        "the lagging replica applied every large batch"
    );
    assert!(
        s.stats.oversized_reads >= oversized_before + 2,
        "catch-up read the 1 MiB and the first 4 MiB batch alone from the log: {}",
        s.summary()
    );
    s.check_log_matching();
    s.check_durability();
}
