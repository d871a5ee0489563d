//! Micro-bench of the Raft core's CPU, with no disk and no network: three in-process nodes, the
//! log owner reduced to "written and flushed at once", messages delivered in order.
//!
//! ```text
//! cargo run -p sluice-raft --release --example bench
//! ```
//!
//! 1. CPU per proposed batch on the leader and on a follower (1 KiB batches, shared `Bytes`).
//! 2. CPU of 1,000 idle groups per node (leaders spread over the three nodes, then all on node 1)
//!    with coalesced heartbeats at the default 150 ms interval, as a fraction of one core.
//!
//! Only time spent inside the core's calls is counted (`Instant` around each call).

use bytes::Bytes;
use sluice_raft::{
    Config, DiskId, Entry, Envelope, GroupId, HardState, Membership, MultiRaft, NodeId, Replica,
    Restore, SnapshotMeta,
};
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

struct Cluster {
    nodes: Vec<MultiRaft>,
    logs: HashMap<(NodeId, GroupId), Vec<Entry>>,
    queue: VecDeque<Envelope>,
    cpu: Vec<Duration>,
    now_ms: u64,
}

fn disk(node: NodeId, g: GroupId) -> DiskId {
    DiskId(u128::from(node) << 64 | u128::from(g))
}

impl Cluster {
    fn new(groups: u64, cfg: Config) -> Self {
        let mut nodes: Vec<MultiRaft> = (1..=3).map(|n| MultiRaft::new(n, cfg.clone())).collect();
        for g in 0..groups {
            let replicas: Vec<Replica> = (1..=3)
                .map(|n| Replica {
                    node: n,
                    disk: disk(n, g),
                })
                .collect();
            for (i, mr) in nodes.iter_mut().enumerate() {
                let n = i as u64 + 1;
                let r = Restore {
                    node: n,
                    hard_state: HardState {
                        term: 0,
                        vote: None,
                        disk: disk(n, g),
                    },
                    base: Some(SnapshotMeta {
                        offset: 0,
                        term: 0,
                        membership: Membership::voters(&replicas),
                    }),
                    log_end: 0,
                    term_starts: vec![],
                    configs: vec![],
                };
                mr.add_group(g, r, 0, g * 7 + n).expect("add group");
            }
        }
        Cluster {
            nodes,
            logs: HashMap::new(),
            queue: VecDeque::new(),
            cpu: vec![Duration::ZERO; 3],
            now_ms: 0,
        }
    }

    /// Runs node `i`'s ready loop once: the owner writes and flushes at once. Returns whether
    /// there was any work.
    fn ready(&mut self, i: usize) -> bool {
        let node = i as u64 + 1;
        let t = Instant::now();
        let r = self.nodes[i].ready();
        self.cpu[i] += t.elapsed();
        let work = !r.groups.is_empty() || !r.messages.is_empty();
        for (g, rd) in r.groups {
            let log = self.logs.entry((node, g)).or_default();
            if let Some(to) = rd.truncate_to {
                log.retain(|e| e.offset < to);
            }
            log.extend(rd.entries.iter().cloned());
            let end = log.last().map_or(0, |e| e.end());
            let fetched: Vec<(NodeId, u64, Vec<Entry>)> = rd
                .fetches
                .iter()
                .map(|f| {
                    let from = log.partition_point(|e| e.end() <= f.from);
                    (
                        f.peer,
                        f.from,
                        log[from..].iter().take(64).cloned().collect(),
                    )
                })
                .collect();
            let t = Instant::now();
            let mr = &mut self.nodes[i];
            if !rd.entries.is_empty() {
                mr.on_appended(g, rd.log_epoch, end).expect("group");
                mr.on_flushed(g, rd.log_epoch, end).expect("group");
            }
            for (peer, from, entries) in fetched {
                mr.on_fetched(g, peer, from, entries).expect("group");
            }
            self.cpu[i] += t.elapsed();
        }
        self.queue.extend(r.messages);
        work
    }

    /// Delivers messages until every node is quiet.
    fn settle(&mut self) {
        loop {
            let mut work = false;
            for i in 0..3 {
                work |= self.ready(i);
            }
            if !work && self.queue.is_empty() {
                return;
            }
            while let Some(m) = self.queue.pop_front() {
                let i = (m.to() - 1) as usize;
                let t = Instant::now();
                self.nodes[i].step(self.now_ms, m).expect("step");
                self.cpu[i] += t.elapsed();
            }
        }
    }

    fn tick(&mut self, now_ms: u64) {
        self.now_ms = now_ms;
        for i in 0..3 {
            let t = Instant::now();
            self.nodes[i].tick(now_ms);
            self.cpu[i] += t.elapsed();
        }
        self.settle();
    }

    /// Elects node `(g % 3) + 1` (or node 1 if `one_leader`) in every group.
    fn elect(&mut self, groups: u64, one_leader: bool) {
        for g in 0..groups {
            let i = if one_leader { 0 } else { (g % 3) as usize };
            assert!(self.nodes[i].group_mut(g).expect("group").campaign_now());
        }
        self.settle();
        for g in 0..groups {
            let i = if one_leader { 0 } else { (g % 3) as usize };
            assert!(
                self.nodes[i].group(g).expect("group").is_serving(),
                "group {g} elected"
            );
        }
    }
}

fn per_batch() {
    let cfg = Config::default();
    let mut c = Cluster::new(1, cfg);
    c.elect(1, true);
    let payload = Bytes::from(vec![7u8; 1024]);
    let batches = 200_000u64;
    let per_round = 8;
    c.cpu = vec![Duration::ZERO; 3];
    let wall = Instant::now();
    for _ in 0..batches / per_round {
        for _ in 0..per_round {
            let t = Instant::now();
            c.nodes[0].propose(0, payload.clone(), 10).expect("propose");
            c.cpu[0] += t.elapsed();
        }
        c.settle();
    }
    let wall = wall.elapsed();
    let commit = c.nodes[0].group(0).expect("g").commit();
    assert_eq!(commit, 1 + batches * 10, "everything committed");
    println!(
        "per batch (1 KiB, 10 records, {per_round} proposals per round, 3 replicas): leader {:.0} ns, follower {:.0} ns (wall {:.0} ns incl. the harness)",
        c.cpu[0].as_nanos() as f64 / batches as f64,
        c.cpu[1].as_nanos() as f64 / batches as f64,
        wall.as_nanos() as f64 / batches as f64
    );
}

fn idle(groups: u64, tick_ms: u64, one_leader: bool) {
    let cfg = Config::default();
    let hb = cfg.heartbeat_interval_ms;
    let mut c = Cluster::new(groups, cfg);
    c.elect(groups, one_leader);
    // Warm up past the first heartbeat rounds.
    let mut now = 0;
    for _ in 0..20 {
        now += tick_ms;
        c.tick(now);
    }
    c.cpu = vec![Duration::ZERO; 3];
    let sim_s = 60;
    let start = now;
    while now < start + sim_s * 1000 {
        now += tick_ms;
        c.tick(now);
    }
    for i in 0..3 {
        let leaders = c.nodes[i]
            .groups()
            .filter(|g| g.role() == sluice_raft::RaftRole::Leader)
            .count();
        println!(
            "idle: {groups} groups on node {} ({leaders} led), tick {tick_ms} ms, heartbeat {hb} ms: {:.4}% of a core ({:.1} µs per simulated second)",
            i + 1,
            c.cpu[i].as_secs_f64() / sim_s as f64 * 100.0,
            c.cpu[i].as_secs_f64() * 1e6 / sim_s as f64
        );
    }
}

fn main() {
    per_batch();
    idle(1_000, 10, false);
    idle(1_000, 50, false);
    idle(1_000, 10, true);
}
