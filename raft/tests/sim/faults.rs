//! Fault injection and client actions: what may happen at each step, with what probability.

use super::*;

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

impl Sim {
    // ---- Faults and client actions ----------------------------------------------------------

    pub(super) fn random_actions(&mut self) {
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

    /// A batch: mostly small, sometimes (1 in 64) above `max_append_bytes`, up to
    /// `max_entry_bytes`, so large entries go through appends, the window, the cache and
    /// catch-up reads under every fault.
    pub fn payload(&mut self) -> (Bytes, u32) {
        let len = if self.rng.gen_ratio(1, 64) {
            let lo = self.cfg.max_append_bytes.max(8) + 1;
            self.rng.gen_range(lo..=self.cfg.max_entry_bytes.max(lo))
        } else {
            self.rng.gen_range(8..600)
        };
        self.payload_of(len)
    }

    /// A small batch (scripted scenarios propose many in a row within the back-pressure limit).
    pub fn small_payload(&mut self) -> (Bytes, u32) {
        let len = self.rng.gen_range(8..600);
        self.payload_of(len)
    }

    /// A batch of `len` bytes (at least 8) starting with a unique number.
    pub fn payload_of(&mut self, len: usize) -> (Bytes, u32) {
        self.next_payload += 1;
        let mut v = vec![0u8; len.max(8)];
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
        let large = data.len() > self.cfg.max_append_bytes;
        let raft = self.nodes[i].raft.as_mut().expect("up");
        if raft.propose(g, data, count).is_ok() {
            self.stats.proposals += 1;
            self.stats.large_proposals += u64::from(large);
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
}
