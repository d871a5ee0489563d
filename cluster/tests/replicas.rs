//! Three replicas of one partition in one process: election, commit on a flushed majority,
//! catch-up from the leader's log, failover, power loss, restarts.

mod common;

use common::*;
use sluice_cluster::ReplicaError;
use sluice_raft::RaftRole;
use sluice_storage::fs::CrashMode;
use std::collections::BTreeMap;

#[test]
fn a_leader_is_elected_and_serves_after_its_noop() {
    on_glommio(|| async {
        let mut c = Cluster::new(3, 1).await;
        let leader = c.elect().await;
        let term = c.replica(leader).term();
        // One leader in its term; the others follow it.
        assert!(
            c.run_until(5_000, |c| {
                c.up().iter().all(|&id| {
                    let r = c.replica(id);
                    r.term() == term && r.leader() == Some(leader) && r.committed_end() >= 1
                })
            })
            .await,
            "followers did not adopt the leader: {:?}",
            c.roles()
        );
        for id in c.up() {
            let r = c.replica(id);
            assert_eq!(r.role() == RaftRole::Leader, id == leader);
            // The no-op: a one-record control batch of the leader's term at the end of the log.
            let bs = c.committed(id).await;
            let last = bs.last().expect("the no-op");
            assert!(last.header.is_control());
            assert_eq!((last.header.term, last.header.record_count), (term, 1));
            assert_eq!(proposal_of(last), None);
        }
        // A follower refuses proposals, naming the leader.
        let follower = c.up().into_iter().find(|&id| id != leader).expect("one");
        match c.propose(follower, 1) {
            Err(ReplicaError::NotLeader {
                leader_hint,
                term: t,
            }) => {
                assert_eq!((leader_hint, t), (Some(leader), term));
            }
            other => panic!("expected NotLeader, got {:?}", other.map(|t| t.offset)),
        }
        // The leader serves.
        let mut t = c.propose(leader, 1).expect("propose");
        let info = c
            .resolve(&mut t, 5_000)
            .await
            .expect("resolved")
            .expect("committed");
        assert_eq!(info.base_offset, t.offset);
    });
}

#[test]
fn a_proposal_resolves_only_once_a_majority_flushed() {
    on_glommio(|| async {
        let mut c = Cluster::new(3, 2).await;
        let leader = c.elect().await;
        c.rounds(20).await;
        let others: Vec<_> = c.up().into_iter().filter(|&id| id != leader).collect();
        let (held, cut) = (others[0], others[1]);
        // One follower writes but does not flush; the other's answers never arrive.
        c.node_mut(held).hold_flush = true;
        c.cut.insert((cut, leader));
        let before = c.replica(leader).committed_end();
        let mut t = c.propose(leader, 42).expect("propose");
        let end = t.offset + 1;
        c.rounds(200).await;
        assert!(
            t.try_take().is_none(),
            "resolved without a flushed majority"
        );
        assert_eq!(c.replica(leader).committed_end(), before);
        assert!(
            c.replica(leader).log().end_offset() >= end,
            "the leader flushed"
        );
        assert!(
            c.replica(held).has_unflushed(),
            "the held follower staged it"
        );
        // The held follower flushes: a majority (leader and it) has it durably.
        c.node_mut(held).hold_flush = false;
        let info = c
            .resolve(&mut t, 5_000)
            .await
            .expect("resolved")
            .expect("committed");
        assert_eq!(info.base_offset, t.offset);
        assert!(c.replica(held).log().end_offset() >= end);
        assert!(c.replica(leader).committed_end() >= end);
    });
}

#[test]
fn a_partitioned_follower_catches_up_from_the_leaders_log() {
    on_glommio(|| async {
        // A small leader cache: the catch-up is read from the leader's log (Ready::fetches).
        let raft = sluice_raft::Config {
            max_cache_bytes: 2 * 1024,
            ..raft_config()
        };
        let mut c = Cluster::with_config(3, 3, raft).await;
        let leader = c.elect().await;
        let lagger = c.up().into_iter().find(|&id| id != leader).expect("one");
        c.isolate(lagger);
        let mut tickets = Vec::new();
        for n in 0..60 {
            tickets.push(c.propose(leader, n).expect("propose"));
            c.rounds(2).await;
        }
        for t in &mut tickets {
            c.resolve(t, 5_000)
                .await
                .expect("resolved")
                .expect("committed");
        }
        let end = c.replica(leader).committed_end();
        assert!(c.replica(lagger).log().end_offset() < end);
        c.heal();
        assert!(
            c.run_until(20_000, |c| c.replica(lagger).committed_end() == end)
                .await,
            "the follower did not catch up: {} of {end}",
            c.replica(lagger).committed_end()
        );
        let a = c.batches(leader, end).await;
        let b = c.batches(lagger, end).await;
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            assert!(
                same_batch(x, y),
                "batch at {} differs",
                x.header.base_offset
            );
        }
    });
}

/// Acknowledged proposals by offset → proposal number.
type Acked = BTreeMap<u64, u64>;

async fn propose_and_ack(c: &mut Cluster, leader: u64, from: u64, n: u64, acked: &mut Acked) {
    let mut tickets = Vec::new();
    for k in from..from + n {
        tickets.push((k, c.propose(leader, k).expect("propose")));
        c.round().await;
    }
    for (k, t) in &mut tickets {
        let info = c
            .resolve(t, 5_000)
            .await
            .expect("resolved")
            .expect("committed");
        acked.insert(info.base_offset, *k);
    }
}

/// Every acknowledged proposal is on `id`'s committed prefix, at its offset, byte for byte the
/// same as on `reference`.
async fn check_acked(c: &Cluster, id: u64, acked: &Acked) {
    let bs = c.committed(id).await;
    let by_offset: BTreeMap<u64, _> = bs.iter().map(|b| (b.header.base_offset, b)).collect();
    for (&off, &k) in acked {
        let b = by_offset
            .get(&off)
            .unwrap_or_else(|| panic!("node {id}: acknowledged proposal {k} at {off} missing"));
        assert_eq!(proposal_of(b), Some(k), "node {id}: offset {off}");
    }
}

async fn check_same_prefix(c: &Cluster, a: u64, b: u64) {
    let end = c
        .replica(a)
        .committed_end()
        .min(c.replica(b).committed_end());
    let x = c.batches(a, end).await;
    let y = c.batches(b, end).await;
    assert_eq!(x.len(), y.len(), "nodes {a} and {b}");
    for (p, q) in x.iter().zip(&y) {
        assert!(
            same_batch(p, q),
            "nodes {a} and {b} differ at {}",
            p.header.base_offset
        );
    }
}

#[test]
fn killing_the_leader_elects_another_and_keeps_every_acknowledged_proposal() {
    on_glommio(|| async {
        let mut c = Cluster::new(3, 4).await;
        let mut acked = Acked::new();
        let first = c.elect().await;
        propose_and_ack(&mut c, first, 0, 20, &mut acked).await;
        let term = c.replica(first).term();
        c.crash(first, CrashMode::DropUnsynced);
        let second = c.elect().await;
        assert_ne!(second, first);
        assert!(c.replica(second).term() > term);
        let survivors = c.up();
        assert!(
            c.run_until(5_000, |c| {
                let e = c.replica(second).committed_end();
                c.up().iter().all(|&id| c.replica(id).committed_end() == e)
            })
            .await
        );
        for &id in &survivors {
            check_acked(&c, id, &acked).await;
        }
        check_same_prefix(&c, survivors[0], survivors[1]).await;
        // The new leader serves; the old one comes back and follows with everything.
        propose_and_ack(&mut c, second, 20, 10, &mut acked).await;
        c.start(first).await;
        let end = c.replica(second).committed_end();
        assert!(
            c.run_until(10_000, |c| c.replica(first).committed_end() >= end)
                .await
        );
        check_acked(&c, first, &acked).await;
        check_same_prefix(&c, first, second).await;
        assert_eq!(c.replica(first).leader(), Some(second));
    });
}

#[test]
fn power_loss_of_a_minority_loses_nothing_acknowledged() {
    on_glommio(|| async {
        let mut c = Cluster::new(3, 5).await;
        let mut acked = Acked::new();
        let leader = c.elect().await;
        propose_and_ack(&mut c, leader, 0, 10, &mut acked).await;
        let victim = c.up().into_iter().find(|&id| id != leader).expect("one");
        // The victim writes without flushing, then loses power: its unsynced tail is gone.
        c.node_mut(victim).hold_flush = true;
        propose_and_ack(&mut c, leader, 10, 10, &mut acked).await;
        assert!(c.replica(victim).has_unflushed());
        let durable_end = c.replica(victim).log().end_offset();
        c.crash(victim, CrashMode::Random { seed: 5 });
        c.node_mut(victim).hold_flush = false;
        c.start(victim).await;
        assert!(c.replica(victim).log().end_offset() <= durable_end.max(1));
        let end = c.replica(leader).committed_end();
        assert!(
            c.run_until(10_000, |c| c.replica(victim).committed_end() >= end)
                .await
        );
        for id in c.up() {
            check_acked(&c, id, &acked).await;
        }
        check_same_prefix(&c, leader, victim).await;
        // The leader itself loses power (a minority again): nothing acknowledged is lost.
        c.crash(leader, CrashMode::Random { seed: 6 });
        let next = c.elect().await;
        propose_and_ack(&mut c, next, 20, 5, &mut acked).await;
        c.start(leader).await;
        let end = c.replica(next).committed_end();
        assert!(
            c.run_until(10_000, |c| c
                .up()
                .iter()
                .all(|&id| c.replica(id).committed_end() >= end))
                .await
        );
        for id in c.up() {
            check_acked(&c, id, &acked).await;
        }
    });
}

#[test]
fn a_restarted_replica_restores_term_vote_and_disk_from_its_state_file_and_log() {
    on_glommio(|| async {
        let mut c = Cluster::new(3, 6).await;
        let mut acked = Acked::new();
        let leader = c.elect().await;
        propose_and_ack(&mut c, leader, 0, 5, &mut acked).await;
        c.rounds(20).await;
        let before: Vec<_> = c
            .up()
            .iter()
            .map(|&id| {
                let r = c.replica(id);
                (
                    id,
                    r.hard_state(),
                    r.log().end_offset(),
                    r.log().last_term(),
                )
            })
            .collect();
        let term = c.replica(leader).term();
        assert!(term >= 1);
        // Every node loses power at once; what they acknowledged was synced.
        for id in c.up() {
            c.crash(id, CrashMode::DropUnsynced);
        }
        for &(id, _, _, _) in &before {
            c.start(id).await;
        }
        for &(id, hs, end, last_term) in &before {
            let r = c.replica(id);
            assert_eq!(
                r.hard_state(),
                hs,
                "node {id}: term, vote and disk restored"
            );
            assert_eq!(r.disk(), c.node(id).disk);
            assert_eq!(
                r.log().end_offset(),
                end,
                "node {id}: everything was flushed"
            );
            assert_eq!(
                r.log().last_term(),
                last_term,
                "node {id}: last term from the log"
            );
            assert_eq!(r.role(), RaftRole::Follower);
        }
        // They elect a leader of a higher term, which serves the same committed history.
        let next = c.elect().await;
        assert!(c.replica(next).term() > term);
        propose_and_ack(&mut c, next, 5, 5, &mut acked).await;
        let end = c.replica(next).committed_end();
        assert!(
            c.run_until(5_000, |c| c
                .up()
                .iter()
                .all(|&id| c.replica(id).committed_end() >= end))
                .await
        );
        for id in c.up() {
            check_acked(&c, id, &acked).await;
        }
    });
}

#[test]
fn a_replica_back_on_a_new_disk_never_votes_and_rejoins_as_a_learner() {
    on_glommio(|| async {
        let mut c = Cluster::new(3, 7).await;
        let mut acked = Acked::new();
        let leader = c.elect().await;
        propose_and_ack(&mut c, leader, 0, 10, &mut acked).await;
        let others: Vec<_> = c.up().into_iter().filter(|&id| id != leader).collect();
        let (wiped, other) = (others[0], others[1]);
        let old_disk = c.node(wiped).disk;
        let new_disk = sluice_raft::DiskId(0xD15C);
        // The wiped node comes back empty while the leader is cut off: the other follower may
        // campaign, but the wiped node's vote (from a disk the membership does not list) must
        // not count, and the wiped node, knowing no membership, must not campaign.
        c.crash(wiped, CrashMode::DropUnsynced);
        c.isolate(leader);
        c.start_on_new_disk(wiped, new_disk).await;
        let other_end = c.replica(other).log().end_offset();
        c.rounds(600).await;
        assert_eq!(
            c.serving_leader().filter(|&l| l != leader),
            None,
            "a leader was elected with a lost disk's vote: {:?}",
            c.roles()
        );
        assert_ne!(c.replica(wiped).role(), RaftRole::Leader);
        assert_eq!(
            c.replica(wiped).term(),
            0,
            "the empty replica never campaigned"
        );
        assert!(
            c.replica(other).log().end_offset() >= other_end,
            "nothing truncated"
        );
        // Healed: a leader makes the new disk a learner, catches it up, promotes it.
        c.heal();
        let voter_on_new_disk = |c: &Cluster| {
            c.serving_leader().is_some_and(|l| {
                c.replica(l).membership().is_voter(wiped, new_disk)
                    && c.replica(wiped).committed_end() == c.replica(l).committed_end()
            })
        };
        assert!(
            c.run_until(30_000, voter_on_new_disk).await,
            "the new disk was not promoted: {:?}",
            c.roles()
        );
        let l = c.serving_leader().expect("leader");
        assert!(!c.replica(l).membership().is_voter(wiped, old_disk));
        propose_and_ack(&mut c, l, 10, 5, &mut acked).await;
        let end = c.replica(l).committed_end();
        assert!(
            c.run_until(5_000, |c| c
                .up()
                .iter()
                .all(|&id| c.replica(id).committed_end() >= end))
                .await
        );
        for id in c.up() {
            check_acked(&c, id, &acked).await;
        }
        // Restarted, the rejoined replica restores its disk id and the membership entries
        // from its state file and log.
        let membership = c.replica(wiped).membership();
        c.crash(wiped, CrashMode::DropUnsynced);
        c.start(wiped).await;
        assert_eq!(c.replica(wiped).disk(), new_disk);
        assert_eq!(c.replica(wiped).membership(), membership);
        assert!(membership.is_voter(wiped, new_disk));
    });
}

#[test]
fn a_replicated_entry_that_fails_its_checksum_is_refused_before_the_core_takes_it() {
    use sluice_raft::{Body, Entry, EntryKind, Envelope, Message};
    use sluice_storage::batch::BatchError;
    on_glommio(|| async {
        let mut c = Cluster::new(3, 8).await;
        let leader = c.elect().await;
        c.rounds(20).await;
        let f = c.up().into_iter().find(|&id| id != leader).expect("one");
        let (end, term) = (c.replica(f).log().end_offset(), c.replica(leader).term());
        let mut data = proposal(99, 1);
        let last = data.len() - 1;
        data[last] ^= 1;
        let m = Message {
            group: GROUP,
            from: leader,
            to: f,
            term,
            body: Body::Append {
                prev_offset: end,
                prev_term: c.replica(f).log().last_term(),
                entries: vec![Entry {
                    offset: end,
                    count: 1,
                    term,
                    kind: EntryKind::Data,
                    data: data.into(),
                }],
                commit: 0,
            },
        };
        let now = c.now_ms;
        match c.replica_mut(f).step(now, Envelope::Group(m)) {
            Err(ReplicaError::BadEntry(BatchError::ChecksumMismatch { .. })) => {}
            other => panic!("expected a checksum mismatch, got {other:?}"),
        }
        let mut out = Vec::new();
        c.replica_mut(f)
            .handle_ready(&mut out)
            .await
            .expect("ready");
        assert!(!c.replica(f).has_unflushed());
        assert_eq!(c.replica(f).log().end_offset(), end, "nothing stored");
        // Nothing changed: the follower goes on following.
        let mut acked = Acked::new();
        propose_and_ack(&mut c, leader, 0, 3, &mut acked).await;
        let e = c.replica(leader).committed_end();
        assert!(
            c.run_until(5_000, |c| c.replica(f).committed_end() >= e)
                .await
        );
        check_acked(&c, f, &acked).await;
    });
}

#[test]
fn a_damaged_or_missing_hard_state_file_is_refused_not_guessed() {
    use sluice_cluster::{Create, Replica, ReplicaConfig, HARD_STATE_FILE};
    use sluice_storage::fs::Fs;
    on_glommio(|| async {
        let mut c = Cluster::new(3, 9).await;
        let leader = c.elect().await;
        let mut acked = Acked::new();
        propose_and_ack(&mut c, leader, 0, 3, &mut acked).await;
        let f = c.up().into_iter().find(|&id| id != leader).expect("one");
        c.crash(f, CrashMode::DropUnsynced);
        let fs = c.node(f).fs.clone();
        let path = dir().join(HARD_STATE_FILE);
        let open = |fs| {
            let cfg = ReplicaConfig {
                node: f,
                group: GROUP,
                raft: raft_config(),
                seed: 1,
            };
            let create = Create::Bootstrap(c.membership.clone());
            Replica::open(fs, dir(), log_config(), cfg, create, 0)
        };
        let good = fs.read_file(&path).expect("a state file");
        let mut bad = good.clone();
        bad[6] ^= 0x10;
        fs.write_file_durably(&path, bad);
        match open(fs.clone()).await {
            Err(ReplicaError::BadHardState { .. }) => {}
            other => panic!("expected a damaged state refused, got {:?}", other.err()),
        }
        // Gone while the log holds data: the vote and the disk id are lost; never recreated.
        fs.remove(&path).await.expect("remove");
        match open(fs.clone()).await {
            Err(ReplicaError::MissingHardState(_)) => {}
            other => panic!("expected a missing state refused, got {:?}", other.err()),
        }
        fs.write_file_durably(&path, good);
        assert!(open(fs).await.is_ok());
    });
}

#[test]
fn a_restarted_replica_reports_its_commit_floor_and_never_an_uncommitted_suffix() {
    use sluice_cluster::replica::COMMIT_FLOOR_INTERVAL_MS;
    on_glommio(|| async {
        let mut c = Cluster::new(3, 11).await;
        let mut acked = Acked::new();
        let leader = c.elect().await;
        propose_and_ack(&mut c, leader, 0, 6, &mut acked).await;
        // Long enough for every replica to write its floor once the commit has reached it.
        c.rounds((2 * COMMIT_FLOOR_INTERVAL_MS / ROUND_MS) as usize)
            .await;
        // More commits right after: the floors on disk lag the true commit now.
        propose_and_ack(&mut c, leader, 6, 3, &mut acked).await;
        let followers: Vec<u64> = c.up().into_iter().filter(|&id| id != leader).collect();
        // The leader, cut off, takes two proposals it can never commit (flushed on its own
        // disk only): an uncommitted suffix that the next leader will cut.
        c.isolate(leader);
        let mut open = Vec::new();
        for k in 9..11 {
            open.push(c.propose(leader, k).expect("propose"));
        }
        c.rounds(3).await;
        let true_commit = c.replica(leader).committed_end();
        assert!(c.replica(leader).log().end_offset() > true_commit);
        let floors: Vec<(u64, u64)> = c
            .up()
            .iter()
            .map(|&id| (id, c.replica(id).stored_commit_floor()))
            .collect();
        for &(id, f) in &floors {
            assert!(f > 0, "node {id}: a floor was written");
            assert!(f < true_commit, "node {id}: the floor lags");
        }
        for id in c.up() {
            c.crash(id, CrashMode::DropUnsynced);
        }
        c.heal();
        for &(id, floor) in &floors {
            c.start(id).await;
            let r = c.replica(id);
            // Before any message: the floor, not 0, and not the log's end.
            let end = r.committed_end();
            assert!(end >= floor, "node {id}: {end} below its floor {floor}");
            assert!(
                end <= true_commit,
                "node {id}: {end} above the commit {true_commit}"
            );
        }
        // The old leader's suffix is never reported committed: the followers elect one of
        // theirs, which cuts it.
        c.crash(leader, CrashMode::DropUnsynced);
        let next = c.elect().await;
        assert!(followers.contains(&next));
        c.start(leader).await;
        assert!(c.replica(leader).committed_end() <= true_commit);
        propose_and_ack(&mut c, next, 11, 2, &mut acked).await;
        let end = c.replica(next).committed_end();
        assert!(
            c.run_until(5_000, |c| c
                .up()
                .iter()
                .all(|&id| c.replica(id).committed_end() >= end))
                .await
        );
        for id in c.up() {
            check_acked(&c, id, &acked).await;
            check_same_prefix(&c, id, next).await;
        }
    });
}

#[test]
fn a_follower_whose_committed_batch_is_damaged_does_not_vote_and_is_repaired_from_the_leader() {
    use sluice_cluster::replica::COMMIT_FLOOR_INTERVAL_MS;
    use sluice_storage::log::segment_file_name;
    on_glommio(|| async {
        let mut c = Cluster::new(3, 12).await;
        let mut acked = Acked::new();
        let leader = c.elect().await;
        propose_and_ack(&mut c, leader, 0, 8, &mut acked).await;
        c.rounds((2 * COMMIT_FLOOR_INTERVAL_MS / ROUND_MS) as usize)
            .await;
        let others: Vec<u64> = c.up().into_iter().filter(|&id| id != leader).collect();
        let (f, g) = (others[0], others[1]);
        let floor = c.replica(f).stored_commit_floor();
        let old_disk = c.replica(f).disk();
        let old_end = c.replica(f).log().end_offset();
        assert!(floor > 4, "a floor covering committed batches");
        // A committed batch below the floor, well inside: its position in the segment.
        let victim = c
            .batches(f, floor)
            .await
            .into_iter()
            .nth(3)
            .expect("a fourth batch");
        let at = victim.header.base_offset;
        let position = c
            .batches(f, at)
            .await
            .iter()
            .map(|b| b.bytes.len())
            .sum::<usize>();
        c.crash(f, CrashMode::DropUnsynced);
        let fs = c.node(f).fs.clone();
        let seg = dir().join(segment_file_name(0, "log"));
        let mut bytes = fs.read_file(&seg).expect("segment");
        // A record byte (past the header), flipped.
        bytes[position + victim.bytes.len() - 3] ^= 0x04;
        fs.write_file_durably(&seg, bytes);
        // The others are held so that f's vote would decide: the leader is down, g needs f.
        c.crash(leader, CrashMode::DropUnsynced);
        c.start(f).await;
        let r = c.replica(f);
        assert_eq!(r.log().end_offset(), at, "cut at the damaged batch");
        assert_ne!(r.disk(), old_disk, "back on a new disk id");
        assert!(r.committed_end() <= at);
        let hs = c.replica(f).hard_state();
        let elected = c.run_until(5_000, |c| c.serving_leader().is_some()).await;
        assert!(!elected, "f's vote decided an election before its repair");
        // Not even a vote of a higher term given (g's pre-votes are refused as well).
        assert_eq!(c.replica(f).hard_state(), hs, "f voted");
        assert_ne!(c.replica(g).role(), RaftRole::Leader);
        assert_ne!(c.replica(f).role(), RaftRole::Leader);
        // The leader is back: it demotes f to a learner on its new disk, catches it up, and
        // promotes it.
        c.start(leader).await;
        let next = c.elect().await;
        propose_and_ack(&mut c, next, 8, 2, &mut acked).await;
        let new_disk = c.replica(f).disk();
        let repaired = c
            .run_until(10_000, |c| {
                let (l, r) = (c.replica(next), c.replica(f));
                r.log().end_offset() == l.log().end_offset()
                    && r.committed_end() == l.committed_end()
                    && !r.has_unflushed()
                    && l.membership().is_voter(f, new_disk)
            })
            .await;
        assert!(repaired, "f caught up and was promoted on its new disk");
        assert!(c.replica(f).log().end_offset() > old_end);
        let (x, y) = (
            c.batches(f, u64::MAX).await,
            c.batches(next, u64::MAX).await,
        );
        assert_eq!(x.len(), y.len());
        for (p, q) in x.iter().zip(&y) {
            assert!(same_batch(p, q), "differs at {}", p.header.base_offset);
        }
        check_acked(&c, f, &acked).await;
    });
}
