//! A deterministic simulator: N nodes × G groups in one thread, one seeded RNG, a virtual clock.
//!
//! Faults: message delay, drop, duplication and reordering; asymmetric partitions; a starved
//! heartbeat stream; per-node clock skew, drift and pauses; crashes that keep only flushed bytes
//! (optionally a torn tail with a flipped bit); disk loss. Invariants are checked after every
//! step; any failure panics with the seed, and `SLUICE_SEED=<seed>` replays it exactly.

#![allow(dead_code)]

pub mod disk;

use bytes::Bytes;
use disk::Disk;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sluice_raft::{
    ConfChange, Config, DiskId, Entry, EntryKind, Envelope, GroupId, Membership, MultiRaft,
    MultiReady, NodeId, Offset, RaftRole, Replica, Role, Snapshot, SnapshotMeta, Term,
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
        max_inflight_bytes: 8192,
        max_cache_bytes: 4096,
        max_uncommitted_bytes: 64 * 1024,
        learner_caught_up_offsets: 16,
        ..Config::default()
    }
}

/// Probabilities per step, and bounds. `Faults::none()` for scenario tests that script faults.
#[derive(Clone, Debug)]
pub struct Faults {
    pub drop: f64,
    pub duplicate: f64,
    pub delay_ms: (u64, u64),
    /// Chance a message is delayed by up to `spike_ms` (reorders across many others).
    pub spike: f64,
    pub spike_ms: u64,
    pub propose: f64,
    pub flush: f64,
    pub crash: f64,
    pub torn_on_crash: f64,
    pub flip_on_torn: f64,
    pub disk_loss: f64,
    pub partition: f64,
    pub starve: f64,
    pub pause: f64,
    pub compact: f64,
    pub transfer: f64,
    pub conf_change: f64,
    pub max_drift_ppm: i64,
    pub max_skew_ms: u64,
}

impl Faults {
    pub fn none() -> Self {
        Faults {
            drop: 0.0,
            duplicate: 0.0,
            delay_ms: (1, 5),
            spike: 0.0,
            spike_ms: 0,
            propose: 0.0,
            flush: 0.5,
            crash: 0.0,
            torn_on_crash: 0.0,
            flip_on_torn: 0.0,
            disk_loss: 0.0,
            partition: 0.0,
            starve: 0.0,
            pause: 0.0,
            compact: 0.0,
            transfer: 0.0,
            conf_change: 0.0,
            max_drift_ppm: 0,
            max_skew_ms: 0,
        }
    }

    pub fn chaos() -> Self {
        Faults {
            drop: 0.03,
            duplicate: 0.03,
            delay_ms: (1, 20),
            spike: 0.01,
            spike_ms: 400,
            propose: 0.25,
            flush: 0.3,
            crash: 0.002,
            torn_on_crash: 0.5,
            flip_on_torn: 0.5,
            disk_loss: 0.0005,
            partition: 0.002,
            starve: 0.001,
            pause: 0.001,
            compact: 0.003,
            transfer: 0.001,
            conf_change: 0.001,
            max_drift_ppm: 20_000,
            max_skew_ms: 5_000,
        }
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

    fn handle_ready(&mut self, i: usize, r: MultiReady) {
        let id = self.nodes[i].id;
        for (g, mut rd) in r.groups {
            if let Some(hs) = rd.hard_state {
                let d = self.nodes[i].disks.get_mut(&g).expect("disk");
                if hs.disk != d.id {
                    self.fail("core persisted a hard state naming another disk");
                }
                d.hard = Some(hs);
            }
            if let Some(s) = rd.snapshot.take() {
                self.install_snapshot(i, g, s);
            }
            if let Some(t) = rd.truncate_to {
                // Truncating an entry that is in the committed history is a safety violation.
                let h = &self.history[&g];
                let d = &self.nodes[i].disks[&g];
                if let Some(e) = d.entry_at(t) {
                    let k = h.partition_point(|x| x.end <= e.offset);
                    if h.get(k)
                        .is_some_and(|x| x.offset == e.offset && x.term == e.term)
                    {
                        self.dump(g);
                        self.fail(format!(
                            "node {id} group {g}: truncating committed entry at {} term {}",
                            e.offset, e.term
                        ));
                    }
                }
                self.nodes[i].disks.get_mut(&g).expect("disk").truncate(t);
            }
            let d = self.nodes[i].disks.get_mut(&g).expect("disk");
            for e in &rd.entries {
                if e.offset != d.end() {
                    let end = d.end();
                    self.fail(format!(
                        "node {id} group {g}: append at {} but disk ends at {end}",
                        e.offset
                    ));
                }
                d.write(e);
            }
            d.epoch = rd.log_epoch;
            let (epoch, end) = (d.epoch, d.end());
            let raft = self.nodes[i].raft.as_mut().expect("up");
            if !rd.entries.is_empty() {
                raft.on_appended(g, epoch, end).expect("group exists");
            }
            for f in rd.fetches.drain(..) {
                let entries = self.nodes[i].disks[&g].read(f.from, f.max_bytes);
                let raft = self.nodes[i].raft.as_mut().expect("up");
                raft.on_fetched(g, f.peer, f.from, entries)
                    .expect("group exists");
            }
            for peer in rd.snapshot_requests.drain(..) {
                let (meta, hash) = self.nodes[i].disks[&g]
                    .base
                    .clone()
                    .expect("a leader with a log start has a snapshot");
                let raft = self.nodes[i].raft.as_mut().expect("up");
                let want = raft.group(g).expect("group").snapshot_meta();
                if want != meta {
                    self.fail(format!(
                        "snapshot meta mismatch: core {want:?} disk {meta:?}"
                    ));
                }
                let s = Snapshot {
                    meta,
                    data: Bytes::copy_from_slice(&hash.to_le_bytes()),
                };
                raft.on_snapshot_built(g, peer, s).expect("group exists");
            }
            if let Some(c) = rd.commit {
                self.apply(i, g, c);
            }
            for p in &rd.committed {
                self.on_acked(g, p.offset, p.term, p.end);
            }
        }
        for m in r.messages {
            self.send(m);
        }
    }

    fn install_snapshot(&mut self, i: usize, g: GroupId, s: Snapshot) {
        let hash = u64::from_le_bytes(s.data[..8].try_into().expect("8-byte snapshot"));
        let off = s.meta.offset;
        let h = &self.history[&g];
        let at = h.partition_point(|e| e.end <= off);
        let expect = if off == 0 {
            0
        } else if at > 0 && h[at - 1].end == off {
            h[at - 1].chain
        } else {
            self.fail(format!("snapshot at {off} not at a committed boundary"));
        };
        if hash != expect {
            self.fail(format!("snapshot at {off} has the wrong state"));
        }
        self.nodes[i]
            .disks
            .get_mut(&g)
            .expect("disk")
            .install(s.meta, hash);
        self.nodes[i].applied.insert(g, (off, hash));
        self.stats.snapshots_installed += 1;
    }

    /// Applies committed entries on node `i`, checking them against (or extending) the history.
    fn apply(&mut self, i: usize, g: GroupId, commit: Offset) {
        let (mut at, mut chain) = self.nodes[i].applied[&g];
        while at < commit {
            let Some(e) = self.nodes[i].disks[&g].entry_at(at).cloned() else {
                self.fail(format!(
                    "node {} group {g}: commit {commit} but no entry at {at} on disk",
                    i + 1
                ));
            };
            if e.offset != at {
                self.fail("applied offset not at a batch boundary");
            }
            chain = hash_entry(chain, &e);
            let data_hash = xxh3_64(&e.data);
            let h = self.history.get_mut(&g).expect("group");
            let k = h.partition_point(|x| x.end <= at);
            if k < h.len() {
                let x = &h[k];
                if x.offset != e.offset
                    || x.term != e.term
                    || x.data_hash != data_hash
                    || x.chain != chain
                {
                    let x = x.clone();
                    self.fail(format!(
                        "node {} group {g}: committed entry at {at} differs: history {x:?}, node term {} end {}",
                        i + 1,
                        e.term,
                        e.end()
                    ));
                }
            } else {
                if e.kind == EntryKind::Config {
                    let m = Membership::decode(&e.data).expect("valid config");
                    self.committed_members.insert(g, m);
                }
                if std::env::var("SIM_TRACE").is_ok_and(|v| v == format!("{g}:{at}")) {
                    let gr = self.nodes[i].raft.as_ref().unwrap().group(g).unwrap();
                    eprintln!(
                        "TRACE t={} node {} {:?} term {} commit {} members {:?}",
                        self.now,
                        i + 1,
                        gr.role(),
                        gr.term(),
                        gr.commit(),
                        gr.membership().members
                    );
                    for (p, pr) in gr.progress() {
                        eprintln!("  progress {p}: {pr:?}");
                    }
                    for n in &self.nodes {
                        let d = &n.disks[&g];
                        eprintln!(
                            "  node {} end {} flushed_end {} entry {:?}",
                            n.id,
                            d.end(),
                            d.flushed_end(),
                            d.entry_at(at).map(|e| (e.offset, e.term))
                        );
                    }
                }
                let h = self.history.get_mut(&g).expect("group");
                h.push(HEntry {
                    offset: e.offset,
                    end: e.end(),
                    term: e.term,
                    data_hash,
                    chain,
                });
                self.stats.committed_offsets = e.end();
            }
            at = e.end();
        }
        self.nodes[i].applied.insert(g, (at, chain));
    }

    /// A client is told its proposal committed: it must be in the history, and flushed on a
    /// majority of the voters.
    fn on_acked(&mut self, g: GroupId, offset: Offset, term: Term, end: Offset) {
        self.stats.acked += 1;
        let h = &self.history[&g];
        let k = h.partition_point(|x| x.end <= offset);
        if !h
            .get(k)
            .is_some_and(|x| x.offset == offset && x.term == term)
        {
            self.fail(format!(
                "acked proposal at {offset} term {term} not committed"
            ));
        }
        let x = h[k].clone();
        let ms = self.candidate_memberships(g);
        if self.check_flushed_on_ack && !ms.iter().any(|m| self.holders_ok(g, m, &x)) {
            self.dump(g);
            self.fail(format!(
                "acked proposal at {offset} term {term} (end {end}) not flushed on a majority of voters"
            ));
        }
        self.acked.push((g, offset, term));
    }

    // ---- Invariants -------------------------------------------------------------------------

    pub fn check_invariants(&mut self) {
        for i in 0..self.nodes.len() {
            let Some(raft) = self.nodes[i].raft.as_ref() else {
                continue;
            };
            let id = self.nodes[i].id;
            let mut failures = Vec::new();
            let mut new_leaders = Vec::new();
            for g in raft.groups() {
                if g.role() == RaftRole::Leader {
                    match self.leaders.get(&(g.id(), g.term())) {
                        Some(&l) if l != id => failures.push(format!(
                            "two leaders in group {} term {}: {l} and {id}",
                            g.id(),
                            g.term()
                        )),
                        Some(_) => {}
                        None => new_leaders.push((g.id(), g.term())),
                    }
                }
                let last = self.nodes[i].last_commit[&g.id()];
                if g.commit() < last {
                    failures.push(format!(
                        "node {id} group {}: commit went back {last} -> {}",
                        g.id(),
                        g.commit()
                    ));
                }
                if g.commit() > g.log_end() {
                    failures.push(format!("node {id} group {}: commit past log end", g.id()));
                }
            }
            if let Some(f) = failures.first() {
                self.fail(f);
            }
            for k in new_leaders {
                self.stats.leaders_elected += 1;
                self.leaders.insert(k, id);
            }
            let commits: Vec<(GroupId, Offset)> = self.nodes[i]
                .raft
                .as_ref()
                .expect("up")
                .groups()
                .map(|g| (g.id(), g.commit()))
                .collect();
            for (g, c) in commits {
                self.nodes[i].last_commit.insert(g, c);
            }
        }
    }

    /// Log matching: any two disks holding an entry with the same offset and term hold the same
    /// entries below it. Costs O(log length) per pair; run it every so often and at the end.
    pub fn check_log_matching(&self) {
        for &g in &self.groups {
            let maps: Vec<BTreeMap<Offset, (Term, Offset, u64)>> = self
                .nodes
                .iter()
                .map(|n| {
                    n.disks[&g]
                        .entries()
                        .map(|e| (e.offset, (e.term, e.end(), xxh3_64(&e.data))))
                        .collect()
                })
                .collect();
            for a in 0..maps.len() {
                for b in a + 1..maps.len() {
                    let mut matched_below: Option<Offset> = None;
                    for (o, x) in maps[a].iter().rev() {
                        if maps[b].get(o).is_some_and(|y| y.0 == x.0) {
                            matched_below = Some(*o);
                            break;
                        }
                    }
                    let Some(top) = matched_below else { continue };
                    for (o, x) in maps[a].range(..=top) {
                        if let Some(y) = maps[b].get(o) {
                            if x != y {
                                self.fail(format!(
                                    "log matching broken in group {g}: nodes {} and {} agree at {top} but differ at {o}",
                                    a + 1,
                                    b + 1
                                ));
                            }
                        }
                    }
                }
            }
        }
    }

    /// Every committed entry is still held by a majority of its group's voters (flushed, or
    /// under a snapshot), and every acknowledged proposal is in the history.
    pub fn check_durability(&self) {
        for &g in &self.groups {
            // An entry commits under the leader's active membership, which may be one appended
            // after the last committed one (single-server changes take effect when appended, and
            // any majority of the old and the new membership intersect). Either must hold it.
            let ms = self.candidate_memberships(g);
            for x in &self.history[&g] {
                let ok = ms.iter().any(|m| self.holders_ok(g, m, x));
                if !ok {
                    for m in &ms {
                        eprintln!("membership {:?}", m.members);
                    }
                    for n in &self.nodes {
                        let d = &n.disks[&g];
                        eprintln!(
                            "node {} disk {:?} start {} end {} flushed_end {} entry {:?}",
                            n.id,
                            d.id,
                            d.start(),
                            d.end(),
                            d.flushed_end(),
                            d.entry_at(x.offset).map(|e| (e.offset, e.term, e.end()))
                        );
                    }
                    eprintln!("history entry {x:?}");
                    self.dump(g);
                    self.fail(format!(
                        "group {g}: committed entry at {} not held by a majority",
                        x.offset
                    ));
                }
            }
        }
        for &(g, o, t) in &self.acked {
            let h = &self.history[&g];
            let k = h.partition_point(|x| x.end <= o);
            if !h.get(k).is_some_and(|x| x.offset == o && x.term == t) {
                self.fail(format!("acked entry at {o} term {t} lost from history"));
            }
        }
    }

    /// Memberships a leader may have counted a commit with: the last committed one, and the last
    /// two on every replica's disk (up or down). A change takes effect when appended, so a
    /// commit decided just before a leader appended a change was counted with the one before.
    fn candidate_memberships(&self, g: GroupId) -> Vec<Membership> {
        let mut ms = vec![self.committed_members[&g].clone()];
        for n in &self.nodes {
            let d = &n.disks[&g];
            let configs: Vec<Membership> = d
                .base
                .as_ref()
                .map(|(m, _)| m.membership.clone())
                .into_iter()
                .chain(
                    d.entries()
                        .filter(|e| e.kind == EntryKind::Config)
                        .map(|e| Membership::decode(&e.data).expect("valid config")),
                )
                .collect();
            ms.extend(configs.into_iter().rev().take(2));
        }
        ms
    }

    /// Whether a majority of `m`'s voters hold `x` flushed. A voter whose disk was lost is a
    /// failed replica: Raft tolerates a minority of them, so the entry must be on a majority
    /// minus the lost ones (and on at least one).
    fn holders_ok(&self, g: GroupId, m: &Membership, x: &HEntry) -> bool {
        let voters: Vec<Replica> = m
            .members
            .iter()
            .filter(|(_, r)| *r == Role::Voter)
            .map(|(r, _)| *r)
            .collect();
        let lost = voters
            .iter()
            .filter(|r| self.nodes[self.idx(r.node)].disks[&g].id != r.disk)
            .count();
        let need = (voters.len() / 2 + 1).saturating_sub(lost).max(1);
        let holders = voters
            .iter()
            .filter(|r| {
                let d = &self.nodes[self.idx(r.node)].disks[&g];
                d.id == r.disk && d.holds_flushed(x.offset, x.term, x.end)
            })
            .count();
        holders >= need
    }

    /// The membership in the committed history (from the most advanced live replica).
    fn known_membership(&self, g: GroupId) -> Option<Membership> {
        let committed = self.history[&g].last().map_or(0, |x| x.end);
        self.nodes
            .iter()
            .filter_map(|n| n.raft.as_ref()?.group(g))
            .filter(|gr| gr.log_end() >= committed)
            .max_by_key(|gr| (gr.commit(), gr.term()))
            .map(|gr| gr.membership().clone())
    }

    // ---- Faults and client actions ----------------------------------------------------------

    fn random_actions(&mut self) {
        let f = self.faults.clone();
        if self.rng.gen_bool(f.propose) {
            self.propose_random();
        }
        if self.rng.gen_bool(f.flush) {
            let i = self.rng.gen_range(0..self.nodes.len());
            self.flush_node(i);
        }
        if f.crash > 0.0 && self.rng.gen_bool(f.crash) {
            let i = self.rng.gen_range(0..self.nodes.len());
            let lose = f.disk_loss > 0.0 && self.rng.gen_bool((f.disk_loss / f.crash).min(1.0));
            self.crash_random(i, lose);
        }
        if f.partition > 0.0 && self.rng.gen_bool(f.partition) {
            self.partition_random();
        }
        if f.starve > 0.0 && self.rng.gen_bool(f.starve) {
            let (a, b) = self.random_pair();
            let until = self.now + self.rng.gen_range(200..3000);
            self.starved.insert((a, b), until);
            self.stats.starvations += 1;
        }
        if f.pause > 0.0 && self.rng.gen_bool(f.pause) {
            let i = self.rng.gen_range(0..self.nodes.len());
            self.nodes[i].paused_until = self.now + self.rng.gen_range(50..2000);
            self.stats.pauses += 1;
        }
        if f.compact > 0.0 && self.rng.gen_bool(f.compact) {
            let i = self.rng.gen_range(0..self.nodes.len());
            let g = self.groups[self.rng.gen_range(0..self.groups.len())];
            self.compact(i, g);
        }
        if f.transfer > 0.0 && self.rng.gen_bool(f.transfer) {
            self.transfer_random();
        }
        if f.conf_change > 0.0 && self.rng.gen_bool(f.conf_change) {
            self.conf_change_random();
        }
    }

    fn random_pair(&mut self) -> (NodeId, NodeId) {
        let n = self.nodes.len() as u64;
        let a = self.rng.gen_range(1..=n);
        let mut b = self.rng.gen_range(1..=n);
        while b == a {
            b = self.rng.gen_range(1..=n);
        }
        (a, b)
    }

    /// The serving leader of `g`, if any node thinks it is one.
    pub fn leader_of(&self, g: GroupId) -> Option<usize> {
        self.nodes.iter().position(|n| {
            n.raft
                .as_ref()
                .and_then(|r| r.group(g))
                .is_some_and(|gr| gr.is_serving())
        })
    }

    pub fn payload(&mut self) -> (Bytes, u32) {
        self.next_payload += 1;
        let len = self.rng.gen_range(8..600);
        let mut v = vec![0u8; len];
        v[..8].copy_from_slice(&self.next_payload.to_le_bytes());
        (Bytes::from(v), self.rng.gen_range(1..=5))
    }

    pub fn propose_random(&mut self) {
        let g = self.groups[self.rng.gen_range(0..self.groups.len())];
        self.propose_to(g);
    }

    /// Proposes one batch to `g`'s serving leader; returns whether one took it.
    pub fn propose_to(&mut self, g: GroupId) -> bool {
        let Some(i) = self.leader_of(g) else {
            return false;
        };
        if self.nodes[i].paused_until > self.now {
            return false;
        }
        let (data, count) = self.payload();
        let raft = self.nodes[i].raft.as_mut().expect("up");
        if raft.propose(g, data, count).is_ok() {
            self.stats.proposals += 1;
            self.drive(i);
            true
        } else {
            false
        }
    }

    pub fn flush_node(&mut self, i: usize) {
        let n = &mut self.nodes[i];
        let Some(raft) = n.raft.as_mut() else {
            return;
        };
        for (&g, d) in n.disks.iter_mut() {
            if d.is_dirty() {
                d.flush();
                raft.on_flushed(g, d.epoch, d.flushed_end()).expect("group");
            }
        }
        self.drive(i);
    }

    pub fn flush_all(&mut self) {
        for i in 0..self.nodes.len() {
            self.flush_node(i);
        }
    }

    /// Crashes node `i` unless that would take down more than one node at once.
    fn crash_random(&mut self, i: usize, lose_disk: bool) {
        // A minority may be down at once (one of four, two of five).
        let down = self.nodes.iter().filter(|n| !n.up()).count();
        if down >= (self.nodes.len() - 1) / 2 || !self.nodes[i].up() {
            return;
        }
        let lose = lose_disk && self.disk_loss_allowed();
        let torn = self.rng.gen_bool(self.faults.torn_on_crash);
        let flip = torn && self.rng.gen_bool(self.faults.flip_on_torn);
        self.crash(i, torn, flip, lose);
        let restart = self.now + self.rng.gen_range(50..2000);
        self.nodes[i].restart_at = Some(restart);
    }

    /// A disk may be lost only when every group's committed membership lists every member on
    /// its current disk as a voter or learner (no earlier loss still rejoining) and enough time
    /// has passed: more simultaneous losses than Raft tolerates lose data by definition.
    fn disk_loss_allowed(&self) -> bool {
        if self.last_disk_loss.is_some_and(|t| self.now < t + 30_000) {
            return false;
        }
        // Every view (committed, and each live replica's latest) must list every member as a
        // voter on its current disk: an uncommitted rejoin can still be undone.
        self.groups.iter().all(|&g| {
            let healthy = |m: &Membership| {
                m.members.iter().all(|(r, role)| {
                    *role == Role::Voter && self.nodes[self.idx(r.node)].disks[&g].id == r.disk
                })
            };
            healthy(&self.committed_members[&g])
                && self
                    .nodes
                    .iter()
                    .filter_map(|n| n.raft.as_ref()?.group(g))
                    .all(|gr| healthy(gr.membership()))
        })
    }

    pub fn crash(&mut self, i: usize, torn: bool, flip: bool, lose_disk: bool) {
        self.stats.crashes += 1;
        self.nodes[i].raft = None;
        if lose_disk {
            self.stats.disk_losses += 1;
            self.last_disk_loss = Some(self.now);
            for d in self.nodes[i].disks.values_mut() {
                *d = Disk::new(DiskId(self.rng.gen()));
            }
            return;
        }
        for d in self.nodes[i].disks.values_mut() {
            let r = d.crash(&mut self.rng, torn, flip);
            self.stats.torn += u64::from(r.torn);
            self.stats.flipped += u64::from(r.flipped);
            self.stats.corrupt_detected += u64::from(r.corrupt_detected);
        }
    }

    pub fn restart(&mut self, i: usize) {
        if !self.nodes[i].up() {
            self.start_node(i);
            self.drive(i);
        }
    }

    fn partition_random(&mut self) {
        self.stats.partitions += 1;
        let until = self.now + self.rng.gen_range(100..3000);
        match self.rng.gen_range(0..3) {
            // Isolate one node both ways.
            0 => {
                let a = self.rng.gen_range(1..=self.nodes.len() as u64);
                for b in 1..=self.nodes.len() as u64 {
                    if a != b {
                        self.blocked.insert((a, b), until);
                        self.blocked.insert((b, a), until);
                    }
                }
            }
            // One direction of one link.
            1 => {
                let (a, b) = self.random_pair();
                self.blocked.insert((a, b), until);
            }
            // Everything out of one node, nothing in (it hears but is not heard).
            _ => {
                let a = self.rng.gen_range(1..=self.nodes.len() as u64);
                for b in 1..=self.nodes.len() as u64 {
                    if a != b {
                        self.blocked.insert((a, b), until);
                    }
                }
            }
        }
    }

    pub fn isolate(&mut self, node: NodeId, until: u64) {
        for b in 1..=self.nodes.len() as u64 {
            if b != node {
                self.blocked.insert((node, b), until);
                self.blocked.insert((b, node), until);
            }
        }
    }

    pub fn heal(&mut self) {
        self.blocked.clear();
        self.starved.clear();
    }

    /// Node `i` compacts group `g` below some applied, flushed offset.
    pub fn compact(&mut self, i: usize, g: GroupId) {
        if !self.nodes[i].up() {
            return;
        }
        let applied = self.nodes[i].applied[&g].0;
        let d = &self.nodes[i].disks[&g];
        let limit = applied.min(d.flushed_end());
        let ends: Vec<Offset> = d
            .entries()
            .map(|e| e.end())
            .filter(|&e| e <= limit)
            .collect();
        if ends.is_empty() {
            return;
        }
        let to = ends[self.rng.gen_range(0..ends.len())];
        let h = &self.history[&g];
        let k = h.partition_point(|x| x.end < to);
        let Some(x) = h.get(k).filter(|x| x.end == to) else {
            self.fail(format!("compaction point {to} not committed"));
        };
        let hash = x.chain;
        let raft = self.nodes[i].raft.as_mut().expect("up");
        let gr = raft.group_mut(g).expect("group");
        if gr.compact(to) {
            let meta = gr.snapshot_meta();
            self.nodes[i]
                .disks
                .get_mut(&g)
                .expect("disk")
                .compact(meta, hash);
            self.stats.compactions += 1;
        }
    }

    fn transfer_random(&mut self) {
        let g = self.groups[self.rng.gen_range(0..self.groups.len())];
        let Some(i) = self.leader_of(g) else { return };
        let me = self.nodes[i].id;
        let raft = self.nodes[i].raft.as_mut().expect("up");
        let voters: Vec<NodeId> = raft
            .group(g)
            .expect("g")
            .membership()
            .voter_ids()
            .filter(|&v| v != me)
            .collect();
        if voters.is_empty() {
            return;
        }
        let t = voters[self.rng.gen_range(0..voters.len())];
        if raft.group_mut(g).expect("g").transfer_leadership(t).is_ok() {
            self.stats.transfers += 1;
        }
        self.drive(i);
    }

    /// Adds a non-member as an auto-promoting learner, or removes a voter when there are more
    /// than three.
    fn conf_change_random(&mut self) {
        let g = self.groups[self.rng.gen_range(0..self.groups.len())];
        let Some(i) = self.leader_of(g) else { return };
        let m = self.nodes[i]
            .raft
            .as_ref()
            .expect("up")
            .group(g)
            .expect("g")
            .membership()
            .clone();
        let outsiders: Vec<NodeId> = self
            .nodes
            .iter()
            .map(|n| n.id)
            .filter(|id| m.get(*id).is_none())
            .collect();
        // Keep at least three voters: a two-voter group tolerates no failure, and the campaign
        // also loses disks.
        let change = if m.voter_count() > 3 {
            let voters: Vec<NodeId> = m.voter_ids().collect();
            ConfChange::Remove(voters[self.rng.gen_range(0..voters.len())])
        } else if let Some(&n) = outsiders.first() {
            let disk = self.nodes[self.idx(n)].disks[&g].id;
            ConfChange::AddLearner {
                replica: Replica { node: n, disk },
                auto_promote: true,
            }
        } else {
            return;
        };
        let raft = self.nodes[i].raft.as_mut().expect("up");
        if raft.group_mut(g).expect("g").propose_change(change).is_ok() {
            self.stats.conf_changes += 1;
        }
        self.drive(i);
    }

    // ---- End of run -------------------------------------------------------------------------

    /// Heals every fault, restarts every node, and requires every group to elect a serving
    /// leader and commit a fresh proposal on all its members within `max_ms`.
    pub fn settle_and_check_liveness(&mut self, max_ms: u64) {
        self.heal();
        self.faults = Faults {
            flush: 0.5,
            ..Faults::none()
        };
        for n in &mut self.nodes {
            n.paused_until = 0;
        }
        for i in 0..self.nodes.len() {
            self.restart(i);
        }
        let groups = self.groups.clone();
        for g in groups {
            let ok = self.run_until(max_ms, |s| s.leader_of(g).is_some());
            if !ok {
                self.dump(g);
                self.fail(format!(
                    "liveness: group {g} has no serving leader after healing"
                ));
            }
            // A proposal can be lost with its leader (never acknowledged): re-propose until one
            // is acknowledged.
            let acked_before = self.acked.iter().filter(|a| a.0 == g).count();
            let deadline = self.now + max_ms;
            let mut next_try = self.now;
            loop {
                if self.acked.iter().filter(|a| a.0 == g).count() > acked_before {
                    break;
                }
                if self.now >= deadline {
                    self.dump(g);
                    self.fail(format!("liveness: group {g} did not commit after healing"));
                }
                if self.now >= next_try {
                    self.propose_to(g);
                    next_try = self.now + 500;
                }
                self.step();
            }
        }
        self.check_log_matching();
        self.check_durability();
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
        let (data, count) = self.payload();
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

    pub fn dump(&self, g: GroupId) {
        for n in &self.nodes {
            match n.raft.as_ref().and_then(|r| r.group(g)) {
                Some(gr) => eprintln!(
                    "node {} g{g}: {:?} term {} leader {:?} commit {} log [{}, {}) last_term {} voter {} members {:?} disk {:?} paused_until {}",
                    n.id,
                    gr.role(),
                    gr.term(),
                    gr.leader(),
                    gr.commit(),
                    gr.log_start(),
                    gr.log_end(),
                    gr.last_term(),
                    gr.is_voter(),
                    gr.membership().members,
                    n.disks[&g].id,
                    n.paused_until
                ),
                None => eprintln!("node {} down", n.id),
            }
        }
    }

    pub fn summary(&self) -> String {
        format!("seed {} {:?}", self.seed, self.stats)
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
}

pub fn entry_kind_name(k: EntryKind) -> &'static str {
    match k {
        EntryKind::Data => "data",
        EntryKind::Noop => "noop",
        EntryKind::Config => "config",
    }
}
