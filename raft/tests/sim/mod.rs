//! A deterministic simulator: N nodes × G groups in one thread, one seeded RNG, a virtual clock.
//!
//! Faults: message delay, drop, duplication and reordering; asymmetric partitions; a starved
//! heartbeat stream; per-node clock skew, drift and pauses; crashes that keep only flushed bytes
//! (optionally a torn tail with a flipped bit); disk loss. Invariants are checked after every
//! step; any failure panics with the seed, and `SLUICE_SEED=<seed>` replays it exactly.

#![allow(dead_code)]

pub mod check;
pub mod disk;
pub mod faults;
pub mod owner;

pub use faults::Faults;

use bytes::Bytes;
use disk::Disk;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sluice_raft::{
    codec, CodecLimits, ConfChange, Config, DiskId, Entry, EntryKind, Envelope, GroupId,
    Membership, MultiRaft, MultiReady, NodeId, Offset, RaftRole, Replica, Role, Snapshot,
    SnapshotMeta, Term,
};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use xxhash_rust::xxh3::xxh3_64;

/// Each node's registry ticks this often (global time).
pub const TICK_MS: u64 = 10;

pub fn sim_config() -> Config {
    Config {
        heartbeat_interval_ms: 50,
        election_timeout_ms: 300,
        max_append_bytes: 2048,
        // Above the append size, the in-flight window and the cache, as the real 8 MiB entry is
        // above the real 512 KiB append: large entries (see `payload`) travel alone and are read
        // back through the owner.
        max_entry_bytes: 12 * 1024,
        max_inflight_bytes: 8192,
        max_cache_bytes: 4096,
        max_uncommitted_bytes: 64 * 1024,
        learner_caught_up_offsets: 16,
        ..Config::default()
    }
}

#[derive(Default, Debug, Clone)]
pub struct Stats {
    pub steps: u64,
    pub delivered: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub proposals: u64,
    pub acked: u64,
    pub crashes: u64,
    pub torn: u64,
    pub flipped: u64,
    pub corrupt_detected: u64,
    pub disk_losses: u64,
    pub partitions: u64,
    pub starvations: u64,
    pub pauses: u64,
    pub compactions: u64,
    pub snapshots_installed: u64,
    pub transfers: u64,
    pub conf_changes: u64,
    pub leaders_elected: u64,
    pub committed_offsets: u64,
    /// Catch-up reads answered by the log owner.
    pub fetches: u64,
    /// Of those, reads whose first batch alone was over the read's `max_bytes`.
    pub oversized_reads: u64,
    /// Proposals of a batch over `max_append_bytes`.
    pub large_proposals: u64,
}

/// One committed entry in the canonical history of a group.
#[derive(Clone, Debug)]
pub struct HEntry {
    pub offset: Offset,
    pub end: Offset,
    pub term: Term,
    pub data_hash: u64,
    /// State-machine hash after applying this entry.
    pub chain: u64,
}

pub struct Node {
    pub id: NodeId,
    pub raft: Option<MultiRaft>,
    pub disks: BTreeMap<GroupId, Disk>,
    /// (applied offset, state hash) per group.
    pub applied: BTreeMap<GroupId, (Offset, u64)>,
    pub last_commit: BTreeMap<GroupId, Offset>,
    pub skew_ms: u64,
    pub drift_ppm: i64,
    pub paused_until: u64,
    pub restart_at: Option<u64>,
    pub next_tick: u64,
}

impl Node {
    pub fn local_ms(&self, now: u64) -> u64 {
        let drift = (now as i128 * self.drift_ppm as i128 / 1_000_000) as i64;
        (self.skew_ms as i64 + now as i64 + drift).max(0) as u64
    }
    pub fn up(&self) -> bool {
        self.raft.is_some()
    }
}

struct InFlight {
    at: u64,
    seq: u64,
    env: Envelope,
}
impl PartialEq for InFlight {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for InFlight {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

pub struct Sim {
    pub seed: u64,
    pub rng: SmallRng,
    pub now: u64,
    pub cfg: Config,
    pub faults: Faults,
    pub nodes: Vec<Node>,
    pub groups: Vec<GroupId>,
    net: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    /// Directed links that drop everything / only heartbeats, until the given time.
    pub blocked: BTreeMap<(NodeId, NodeId), u64>,
    pub starved: BTreeMap<(NodeId, NodeId), u64>,
    pub history: BTreeMap<GroupId, Vec<HEntry>>,
    leaders: BTreeMap<(GroupId, Term), NodeId>,
    /// Proposals acknowledged to clients: (group, offset, term).
    pub acked: Vec<(GroupId, Offset, Term)>,
    pub stats: Stats,
    /// Time of the last disk loss: losses are spaced so a lost replica can rejoin first.
    last_disk_loss: Option<u64>,
    next_payload: u64,
    /// Each group's membership as of its last committed config entry.
    pub committed_members: BTreeMap<GroupId, Membership>,
    /// Check at each acknowledgement that a majority flushed it (off only for the relaxed mode).
    pub check_flushed_on_ack: bool,
}

pub fn seed_from_env() -> u64 {
    match std::env::var("SLUICE_SEED") {
        Ok(s) => s.parse().expect("SLUICE_SEED must be a u64"),
        Err(_) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock after 1970");
            t.as_nanos() as u64 ^ u64::from(std::process::id())
        }
    }
}

pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn hash_entry(chain: u64, e: &Entry) -> u64 {
    let mut b = Vec::with_capacity(32 + e.data.len());
    b.extend_from_slice(&chain.to_le_bytes());
    b.extend_from_slice(&e.offset.to_le_bytes());
    b.extend_from_slice(&e.term.to_le_bytes());
    b.extend_from_slice(&e.data);
    xxh3_64(&b)
}

impl Sim {
    /// `nodes` nodes; `groups` groups, each with `voters` voters chosen round-robin (the other
    /// nodes hold an empty replica, addable as learners).
    pub fn new(seed: u64, nodes: usize, groups: usize, voters: usize, faults: Faults) -> Self {
        Self::with_config(seed, nodes, groups, voters, faults, sim_config())
    }

    pub fn with_config(
        seed: u64,
        nodes: usize,
        groups: usize,
        voters: usize,
        faults: Faults,
        cfg: Config,
    ) -> Self {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut ns: Vec<Node> = (1..=nodes as u64)
            .map(|id| Node {
                id,
                raft: None,
                disks: BTreeMap::new(),
                applied: BTreeMap::new(),
                last_commit: BTreeMap::new(),
                skew_ms: if faults.max_skew_ms > 0 {
                    rng.gen_range(0..faults.max_skew_ms)
                } else {
                    0
                },
                drift_ppm: if faults.max_drift_ppm > 0 {
                    rng.gen_range(-faults.max_drift_ppm..=faults.max_drift_ppm)
                } else {
                    0
                },
                paused_until: 0,
                restart_at: None,
                next_tick: 0,
            })
            .collect();
        let gids: Vec<GroupId> = (0..groups as u64).collect();
        for &g in &gids {
            let members: Vec<usize> = (0..voters).map(|i| (g as usize + i) % nodes).collect();
            for n in ns.iter_mut() {
                n.disks.insert(g, Disk::new(DiskId(rng.gen())));
            }
            let replicas: Vec<Replica> = members
                .iter()
                .map(|&i| Replica {
                    node: ns[i].id,
                    disk: ns[i].disks[&g].id,
                })
                .collect();
            let meta = SnapshotMeta {
                offset: 0,
                term: 0,
                membership: Membership::voters(&replicas),
            };
            for &i in &members {
                ns[i].disks.get_mut(&g).expect("created").base = Some((meta.clone(), 0));
            }
        }
        let mut sim = Sim {
            seed,
            rng,
            now: 0,
            cfg,
            faults,
            nodes: ns,
            groups: gids.clone(),
            net: BinaryHeap::new(),
            seq: 0,
            blocked: BTreeMap::new(),
            starved: BTreeMap::new(),
            history: gids.iter().map(|&g| (g, Vec::new())).collect(),
            leaders: BTreeMap::new(),
            acked: Vec::new(),
            stats: Stats::default(),
            last_disk_loss: None,
            next_payload: 0,
            committed_members: BTreeMap::new(),
            check_flushed_on_ack: true,
        };
        for &g in &gids {
            let m = sim
                .nodes
                .iter()
                .find_map(|n| n.disks[&g].base.as_ref().map(|(m, _)| m.membership.clone()));
            sim.committed_members
                .insert(g, m.expect("bootstrap membership"));
        }
        for i in 0..nodes {
            sim.start_node(i);
        }
        sim
    }

    pub fn fail(&self, msg: impl std::fmt::Display) -> ! {
        panic!(
            "simulation failed: seed {} step {} t={}ms: {}\nreplay: SLUICE_SEED={} (same test)",
            self.seed, self.stats.steps, self.now, msg, self.seed
        );
    }

    pub fn idx(&self, node: NodeId) -> usize {
        (node - 1) as usize
    }

    fn start_node(&mut self, i: usize) {
        let local = self.nodes[i].local_ms(self.now);
        let id = self.nodes[i].id;
        let mut raft = MultiRaft::new(id, self.cfg.clone());
        let seed = self.rng.gen();
        let node = &mut self.nodes[i];
        for (&g, disk) in node.disks.iter_mut() {
            let r = disk.restore(id);
            let base = disk.base.as_ref().map_or((0, 0), |(m, h)| (m.offset, *h));
            node.applied.insert(g, base);
            node.last_commit.insert(g, base.0);
            if let Err(e) = raft.add_group(g, r, local, seed) {
                panic!(
                    "seed {}: restore of node {id} group {g} failed: {e}",
                    self.seed
                );
            }
        }
        node.raft = Some(raft);
        node.restart_at = None;
        node.next_tick = self.now;
    }

    // ---- Driving ----------------------------------------------------------------------------

    /// One step: deliver the next due message, or move time forward and tick; then maybe inject
    /// a fault or a client action; then check every invariant.
    pub fn step(&mut self) {
        self.stats.steps += 1;
        let due = self.net.peek().is_some_and(|Reverse(m)| m.at <= self.now);
        if due {
            let Reverse(m) = self.net.pop().expect("peeked");
            self.deliver(m.env);
        } else {
            let next_msg = self.net.peek().map_or(u64::MAX, |Reverse(m)| m.at);
            let next = (self.now + self.rng.gen_range(1..=5)).min(next_msg.max(self.now + 1));
            self.now = next;
            self.tick_nodes();
        }
        self.random_actions();
        self.check_invariants();
    }

    pub fn run(&mut self, steps: u64) {
        for _ in 0..steps {
            self.step();
        }
    }

    /// Runs until `pred` holds or `max_ms` of simulated time passed; returns whether it held.
    pub fn run_until(&mut self, max_ms: u64, mut pred: impl FnMut(&Sim) -> bool) -> bool {
        let deadline = self.now + max_ms;
        while self.now < deadline {
            if pred(self) {
                return true;
            }
            self.step();
        }
        pred(self)
    }

    fn tick_nodes(&mut self) {
        for i in 0..self.nodes.len() {
            if let Some(t) = self.nodes[i].restart_at {
                if self.now >= t {
                    self.start_node(i);
                }
            }
            let n = &mut self.nodes[i];
            if n.raft.is_none() || n.paused_until > self.now || n.next_tick > self.now {
                continue;
            }
            n.next_tick = self.now + TICK_MS;
            let local = n.local_ms(self.now);
            n.raft.as_mut().expect("up").tick(local);
            self.drive(i);
        }
    }

    fn deliver(&mut self, env: Envelope) {
        let i = self.idx(env.to());
        let n = &self.nodes[i];
        if n.raft.is_none() {
            self.stats.dropped += 1;
            return;
        }
        if n.paused_until > self.now {
            // A paused process reads its socket when it wakes.
            let at = n.paused_until + self.rng.gen_range(0..3);
            self.enqueue(at, env);
            return;
        }
        self.stats.delivered += 1;
        let local = n.local_ms(self.now);
        let r = self.nodes[i]
            .raft
            .as_mut()
            .expect("up")
            .step(local, env.clone());
        if let Err(e) = r {
            self.fail(format!("step error on node {}: {e} for {env:?}", i + 1));
        }
        self.drive(i);
    }

    fn enqueue(&mut self, at: u64, env: Envelope) {
        self.seq += 1;
        self.net.push(Reverse(InFlight {
            at,
            seq: self.seq,
            env,
        }));
    }

    fn send(&mut self, env: Envelope) {
        // Every message crosses the wire codec, as between real nodes: what the core sends must
        // decode, within the limits its own config implies, to exactly what it sent.
        let wire = codec::encode(&env);
        let limits = CodecLimits::from_config(&self.cfg);
        match codec::decode_bytes(wire, &limits) {
            Ok(back) if back == env => {}
            Ok(back) => self.fail(format!("codec changed {env:?} into {back:?}")),
            Err(e) => self.fail(format!("codec refused {env:?}: {e}")),
        }
        let (from, to) = (env.from(), env.to());
        if self.blocked.get(&(from, to)).is_some_and(|&t| t > self.now) {
            self.stats.dropped += 1;
            return;
        }
        let is_hb = matches!(env, Envelope::Heartbeat(_) | Envelope::HeartbeatResp(_));
        if is_hb && self.starved.get(&(from, to)).is_some_and(|&t| t > self.now) {
            self.stats.dropped += 1;
            return;
        }
        if self.rng.gen_bool(self.faults.drop) {
            self.stats.dropped += 1;
            return;
        }
        let copies = if self.rng.gen_bool(self.faults.duplicate) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let (lo, hi) = self.faults.delay_ms;
            let mut d = self.rng.gen_range(lo..=hi);
            if self.faults.spike > 0.0 && self.rng.gen_bool(self.faults.spike) {
                d += self.rng.gen_range(0..=self.faults.spike_ms);
            }
            self.enqueue(self.now + d, env.clone());
        }
    }

    /// Runs node `i`'s ready loop until it has nothing more to do.
    pub fn drive(&mut self, i: usize) {
        for _ in 0..64 {
            let Some(raft) = self.nodes[i].raft.as_mut() else {
                return;
            };
            let r = raft.ready();
            if r.groups.is_empty() && r.messages.is_empty() {
                return;
            }
            self.handle_ready(i, r);
        }
        self.fail(format!("node {} ready loop did not settle", i + 1));
    }

    pub fn group(&self, node: NodeId, g: GroupId) -> Option<&sluice_raft::RaftGroup> {
        self.nodes[self.idx(node)].raft.as_ref()?.group(g)
    }

    pub fn group_mut(&mut self, node: NodeId, g: GroupId) -> Option<&mut sluice_raft::RaftGroup> {
        let i = self.idx(node);
        self.nodes[i].raft.as_mut()?.group_mut(g)
    }

    /// The serving leader's node id.
    pub fn leader_id(&self, g: GroupId) -> Option<NodeId> {
        self.leader_of(g).map(|i| self.nodes[i].id)
    }

    /// Runs `ms` of simulated time.
    pub fn run_ms(&mut self, ms: u64) {
        let until = self.now + ms;
        while self.now < until {
            self.step();
        }
    }

    /// Waits for a serving leader of `g`; fails the test after `max_ms`.
    pub fn await_leader(&mut self, g: GroupId, max_ms: u64) -> NodeId {
        if !self.run_until(max_ms, |s| s.leader_of(g).is_some()) {
            self.dump(g);
            self.fail(format!("no serving leader of group {g} within {max_ms} ms"));
        }
        self.leader_id(g).expect("checked")
    }

    /// Proposes on `node` (which must serve `g`); returns the proposal.
    pub fn propose_on(&mut self, node: NodeId, g: GroupId) -> sluice_raft::Proposal {
        let (data, count) = self.small_payload();
        self.propose_data_on(node, g, data, count)
    }

    /// Proposes this batch on `node` (which must serve `g`); returns the proposal.
    pub fn propose_data_on(
        &mut self,
        node: NodeId,
        g: GroupId,
        data: Bytes,
        count: u32,
    ) -> sluice_raft::Proposal {
        if data.len() > self.cfg.max_append_bytes {
            self.stats.large_proposals += 1;
        }
        let i = self.idx(node);
        let p = self.nodes[i]
            .raft
            .as_mut()
            .expect("up")
            .propose(g, data, count)
            .unwrap_or_else(|e| panic!("seed {}: propose on {node}: {e}", self.seed));
        self.stats.proposals += 1;
        self.drive(i);
        p
    }

    /// Whether the history holds this proposal (committed).
    pub fn committed(&self, g: GroupId, p: &sluice_raft::Proposal) -> bool {
        let h = &self.history[&g];
        let k = h.partition_point(|x| x.end <= p.offset);
        h.get(k)
            .is_some_and(|x| x.offset == p.offset && x.term == p.term)
    }

    /// Campaigns on `node` at once (pre-vote first).
    pub fn campaign(&mut self, node: NodeId, g: GroupId) -> bool {
        let ok = self.group_mut(node, g).is_some_and(|gr| gr.campaign_now());
        let i = self.idx(node);
        self.drive(i);
        ok
    }
}

/// Stats of one campaign, summed over seeds.
pub fn add_stats(a: &mut Stats, b: &Stats) {
    a.steps += b.steps;
    a.delivered += b.delivered;
    a.dropped += b.dropped;
    a.duplicated += b.duplicated;
    a.proposals += b.proposals;
    a.acked += b.acked;
    a.crashes += b.crashes;
    a.torn += b.torn;
    a.flipped += b.flipped;
    a.corrupt_detected += b.corrupt_detected;
    a.disk_losses += b.disk_losses;
    a.partitions += b.partitions;
    a.starvations += b.starvations;
    a.pauses += b.pauses;
    a.compactions += b.compactions;
    a.snapshots_installed += b.snapshots_installed;
    a.transfers += b.transfers;
    a.conf_changes += b.conf_changes;
    a.leaders_elected += b.leaders_elected;
    a.committed_offsets += b.committed_offsets;
    a.fetches += b.fetches;
    a.oversized_reads += b.oversized_reads;
    a.large_proposals += b.large_proposals;
}

pub fn entry_kind_name(k: EntryKind) -> &'static str {
    match k {
        EntryKind::Data => "data",
        EntryKind::Noop => "noop",
        EntryKind::Config => "config",
    }
}
