//! A cluster in one process: replicas on their own simulated disks (`SimFs`, power loss keeps
//! only what was synced), an in-memory network the test controls (cut links, held flushes),
//! and virtual time advanced in rounds. Everything runs on one glommio executor.
#![allow(dead_code)]

use sluice_cluster::{Create, ProposalTicket, Replica, ReplicaConfig, ReplicaError, ReplicaStats};
use sluice_raft::{Config, DiskId, Envelope, Membership, NodeId, RaftRole, Replica as Member};
use sluice_storage::batch::{self, Record};
use sluice_storage::fs::{CrashMode, SimFs};
use sluice_storage::{LogConfig, ReadBatch};
use std::collections::{BTreeSet, VecDeque};
use std::path::PathBuf;
use std::sync::Mutex;

/// Virtual time one round advances.
pub const ROUND_MS: u64 = 10;
pub const GROUP: u64 = 7;

/// glommio registers locked memory per executor: one test's executor at a time.
static EXECUTOR: Mutex<()> = Mutex::new(());

/// Runs a test body on one glommio executor.
pub fn on_glommio<Fut>(f: impl FnOnce() -> Fut + Send + 'static)
where
    Fut: std::future::Future<Output = ()> + 'static,
{
    let _one = EXECUTOR.lock().unwrap_or_else(|e| e.into_inner());
    sluice_storage::rt::run("cluster-test", f).expect("executor");
}

/// The seed of a random test: `SLUICE_SEED` if set, else fresh.
pub fn seed() -> u64 {
    match std::env::var("SLUICE_SEED") {
        Ok(s) => s.parse().expect("SLUICE_SEED must be a u64"),
        Err(_) => rand::random(),
    }
}

pub fn raft_config() -> Config {
    Config {
        heartbeat_interval_ms: 50,
        election_timeout_ms: 500,
        ..Config::default()
    }
}

pub fn log_config() -> LogConfig {
    LogConfig {
        segment_bytes_max: 64 * 1024,
        segment_age_ms_max: None,
        index_interval_bytes: 512,
        prealloc_chunk_bytes: 16 * 1024,
        prealloc_initial_bytes: 4 * 1024,
        write_buffer_bytes_max: 32 * 1024,
        batch_bytes_max: 16 * 1024,
        coalesce_batch_bytes_max: 2 * 1024,
        read_cache_bytes_max: 8 * 1024,
        index_cache_bytes_max: 1024,
        index_persist_entries: 4,
        retention_ms: None,
        retention_bytes: None,
        ..LogConfig::default()
    }
}

/// A producer's batch whose records say which proposal they belong to.
pub fn proposal(n: u64, records: usize) -> Vec<u8> {
    proposal_padded(n, records, 0)
}

/// [`proposal`] with `pad_bytes` more in each record's value.
pub fn proposal_padded(n: u64, records: usize, pad_bytes: usize) -> Vec<u8> {
    let rs: Vec<Record> = (0..records.max(1))
        .map(|i| {
            let mut v = format!("proposal-{n}-record-{i}-").into_bytes();
            v.extend((0..pad_bytes).map(|k| (n as usize + k) as u8));
            Record::new(n as i64, v)
        })
        .collect();
    batch::encode(&rs).expect("non-empty")
}

/// The proposal number a stored batch carries (None for control batches).
pub fn proposal_of(b: &ReadBatch) -> Option<u64> {
    if b.header.is_control() {
        return None;
    }
    let r = b.view().records().next()?.ok()?;
    let rest = r.value.strip_prefix(b"proposal-")?;
    let digits: Vec<u8> = rest
        .iter()
        .copied()
        .take_while(u8::is_ascii_digit)
        .collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

pub struct Node {
    pub id: NodeId,
    pub fs: SimFs,
    pub replica: Option<Replica<SimFs>>,
    pub inbox: VecDeque<Envelope>,
    /// The test holds this node's flushes back: its staged batches stay in memory.
    pub hold_flush: bool,
    pub disk: DiskId,
}

pub struct Cluster {
    pub now_ms: u64,
    pub nodes: Vec<Node>,
    /// Directed links that drop everything.
    pub cut: BTreeSet<(NodeId, NodeId)>,
    pub raft: Config,
    pub seed: u64,
    pub membership: Membership,
    /// Bytes added to each proposed record (bigger batches: segments roll).
    pub pad_bytes: usize,
    /// Counters of replicas that crashed (a live replica's are in its own).
    pub past_stats: ReplicaStats,
    /// Disks lost (replaced by new ones), as they were when lost.
    pub lost_disks: Vec<SimFs>,
}

pub fn dir() -> PathBuf {
    PathBuf::from("/data/partition-7")
}

impl Cluster {
    pub async fn new(n: usize, seed: u64) -> Cluster {
        Self::with_config(n, seed, raft_config()).await
    }

    pub async fn with_config(n: usize, seed: u64, raft: Config) -> Cluster {
        let members: Vec<Member> = (1..=n as u64)
            .map(|id| Member {
                node: id,
                disk: DiskId(u128::from(id) * 1_000 + 1),
            })
            .collect();
        let membership = Membership::voters(&members);
        let mut c = Cluster {
            now_ms: 0,
            nodes: members
                .iter()
                .map(|m| Node {
                    id: m.node,
                    fs: SimFs::new(),
                    replica: None,
                    inbox: VecDeque::new(),
                    hold_flush: false,
                    disk: m.disk,
                })
                .collect(),
            cut: BTreeSet::new(),
            raft,
            seed,
            membership,
            pad_bytes: 0,
            past_stats: ReplicaStats::default(),
            lost_disks: Vec::new(),
        };
        for id in 1..=n as u64 {
            c.start(id).await;
        }
        c
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[(id - 1) as usize]
    }
    pub fn node_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.nodes[(id - 1) as usize]
    }
    pub fn replica(&self, id: NodeId) -> &Replica<SimFs> {
        self.node(id).replica.as_ref().expect("replica up")
    }
    pub fn replica_mut(&mut self, id: NodeId) -> &mut Replica<SimFs> {
        self.node_mut(id).replica.as_mut().expect("replica up")
    }
    pub fn up(&self) -> Vec<NodeId> {
        self.nodes
            .iter()
            .filter(|n| n.replica.is_some())
            .map(|n| n.id)
            .collect()
    }

    /// Opens node `id`'s replica on its disk (created on the first start, restored after).
    pub async fn start(&mut self, id: NodeId) {
        let create = Create::Bootstrap(self.membership.clone());
        self.start_with(id, create).await;
    }

    /// Node `id` lost its disk: it comes back on a new, empty one with a new disk id.
    pub async fn start_on_new_disk(&mut self, id: NodeId, disk: DiskId) {
        let n = self.node_mut(id);
        n.replica = None;
        let lost = std::mem::take(&mut n.fs);
        n.disk = disk;
        self.lost_disks.push(lost);
        self.start_with(id, Create::Empty { disk }).await;
    }

    async fn start_with(&mut self, id: NodeId, create: Create) {
        let cfg = ReplicaConfig {
            node: id,
            group: GROUP,
            raft: self.raft.clone(),
            seed: self.seed ^ id.wrapping_mul(0x9E37_79B9),
        };
        let now = self.now_ms;
        let fs = self.node(id).fs.clone();
        let r = Replica::open(fs, dir(), log_config(), cfg, create, now)
            .await
            .expect("open replica");
        let n = self.node_mut(id);
        n.replica = Some(r);
        n.inbox.clear();
        n.hold_flush = false;
    }

    /// Power loss on node `id`: its process is gone, its disk keeps what was synced.
    pub fn crash(&mut self, id: NodeId, mode: CrashMode) {
        if let Some(r) = self.node(id).replica.as_ref() {
            let s = r.stats().clone();
            add_stats(&mut self.past_stats, &s);
        }
        let n = self.node_mut(id);
        n.replica = None;
        n.inbox.clear();
        n.fs = n.fs.crash(mode);
    }

    /// Cuts every link to and from `id`.
    pub fn isolate(&mut self, id: NodeId) {
        for n in 1..=self.nodes.len() as u64 {
            if n != id {
                self.cut.insert((id, n));
                self.cut.insert((n, id));
            }
        }
    }

    pub fn heal(&mut self) {
        self.cut.clear();
    }

    fn send(&mut self, out: Vec<Envelope>) {
        for m in out {
            let (from, to) = (m.from(), m.to());
            if self.cut.contains(&(from, to)) || to == 0 || to as usize > self.nodes.len() {
                continue;
            }
            let n = self.node_mut(to);
            if n.replica.is_some() {
                n.inbox.push_back(m);
            }
        }
    }

    /// One round of virtual time: every live node takes its messages, ticks, runs its
    /// `Ready` loop, sends, flushes (unless held) and runs it again.
    pub async fn round(&mut self) {
        self.now_ms += ROUND_MS;
        let now = self.now_ms;
        for i in 0..self.nodes.len() {
            let Some(r) = self.nodes[i].replica.take() else {
                continue;
            };
            let inbox: Vec<Envelope> = self.nodes[i].inbox.drain(..).collect();
            for m in inbox {
                // A stale or misaddressed message is refused by the core; never fatal.
                let _ = r.step(now, m);
            }
            r.tick(now);
            let mut out = Vec::new();
            r.handle_ready(&mut out).await.expect("ready");
            if !self.nodes[i].hold_flush {
                r.flush().await.expect("flush");
                r.handle_ready(&mut out).await.expect("ready");
            }
            self.nodes[i].replica = Some(r);
            self.send(out);
        }
    }

    /// Runs rounds until `done` holds (true) or `max_ms` of virtual time passed (false).
    pub async fn run_until(&mut self, max_ms: u64, done: impl Fn(&Cluster) -> bool) -> bool {
        let until = self.now_ms + max_ms;
        while self.now_ms < until {
            if done(self) {
                return true;
            }
            self.round().await;
        }
        done(self)
    }

    pub async fn rounds(&mut self, n: usize) {
        for _ in 0..n {
            self.round().await;
        }
    }

    /// The serving leader, if exactly one live replica serves.
    pub fn serving_leader(&self) -> Option<NodeId> {
        let serving: Vec<NodeId> = self
            .nodes
            .iter()
            .filter(|n| n.replica.as_ref().is_some_and(|r| r.is_serving()))
            .map(|n| n.id)
            .collect();
        (serving.len() == 1).then(|| serving[0])
    }

    /// Waits for a serving leader (within 30 s of virtual time).
    pub async fn elect(&mut self) -> NodeId {
        assert!(
            self.run_until(30_000, |c| c.serving_leader().is_some())
                .await,
            "no leader within 30 s"
        );
        self.serving_leader().expect("leader")
    }

    /// Proposes on `leader`.
    pub fn propose(&mut self, leader: NodeId, n: u64) -> Result<ProposalTicket, ReplicaError> {
        let b = proposal_padded(n, 1 + (n % 3) as usize, self.pad_bytes);
        self.replica_mut(leader).propose(b)
    }

    /// Runs until the ticket resolves (within `max_ms`).
    pub async fn resolve(
        &mut self,
        t: &mut ProposalTicket,
        max_ms: u64,
    ) -> Option<Result<sluice_storage::AppendInfo, ReplicaError>> {
        let until = self.now_ms + max_ms;
        while self.now_ms < until {
            if let Some(r) = t.try_take() {
                return Some(r);
            }
            self.round().await;
        }
        t.try_take()
    }

    /// Every batch of node `id`'s log below `end` (durable ones).
    pub async fn batches(&self, id: NodeId, end: u64) -> Vec<ReadBatch> {
        let log = self.replica(id).log();
        let mut out = Vec::new();
        let mut at = log.start_offset();
        let end = end.min(log.end_offset());
        while at < end {
            let bs = log.read(at, 1 << 20).await.expect("read");
            assert!(!bs.is_empty(), "no progress reading at {at}");
            for b in bs {
                if b.header.base_offset >= end {
                    break;
                }
                at = b.header.next_offset();
                out.push(b);
            }
        }
        out
    }

    /// Node `id`'s committed prefix, batch by batch.
    pub async fn committed(&self, id: NodeId) -> Vec<ReadBatch> {
        let end = self.replica(id).committed_end();
        self.batches(id, end).await
    }

    pub fn roles(&self) -> Vec<(NodeId, Option<(RaftRole, u64)>)> {
        self.nodes
            .iter()
            .map(|n| (n.id, n.replica.as_ref().map(|r| (r.role(), r.term()))))
            .collect()
    }
}

impl Cluster {
    /// Whether node `id`'s disk, if the power went now, would hold proposal `n` at `offset`
    /// (read from a copy of what its disk has synced: the node itself runs on).
    pub async fn durably_holds(&self, id: NodeId, offset: u64, n: u64) -> bool {
        holds(&self.node(id).fs, offset, n).await
    }

    /// How many disks hold proposal `n` at `offset` durably: the nodes' disks, and the disks
    /// lost since (a follower's flush report counts until the leader hears from its new disk,
    /// so an acknowledgement may rest on a disk lost a moment before).
    pub async fn durable_copies(&self, offset: u64, n: u64) -> usize {
        let mut copies = 0;
        for fs in self.nodes.iter().map(|n| &n.fs).chain(&self.lost_disks) {
            copies += usize::from(holds(fs, offset, n).await);
        }
        copies
    }
}

/// Whether `fs`, if the power went now, holds proposal `n` at `offset` (read from a copy of
/// what it has synced).
async fn holds(fs: &SimFs, offset: u64, n: u64) -> bool {
    let fs = fs.crash(CrashMode::DropUnsynced);
    let log = sluice_storage::Log::open(fs, dir(), log_config())
        .await
        .expect("open a copy");
    if log.end_offset() <= offset || log.start_offset() > offset {
        return false;
    }
    let bs = log.read(offset, 1).await.expect("read");
    bs.first()
        .is_some_and(|b| b.header.base_offset == offset && proposal_of(b) == Some(n))
}

impl Cluster {
    /// Counters of every replica that ran, crashed ones included.
    pub fn total_stats(&self) -> ReplicaStats {
        let mut t = self.past_stats.clone();
        for n in &self.nodes {
            if let Some(r) = &n.replica {
                add_stats(&mut t, &r.stats());
            }
        }
        t
    }
}

pub fn add_stats(t: &mut ReplicaStats, s: &ReplicaStats) {
    t.hard_state_writes += s.hard_state_writes;
    t.truncations += s.truncations;
    t.batches_staged += s.batches_staged;
    t.fetches_served += s.fetches_served;
    t.proposals_committed += s.proposals_committed;
    t.proposals_dropped += s.proposals_dropped;
    t.commit_floor_writes += s.commit_floor_writes;
}

/// Whether two stored batches are the same batch, byte for byte.
pub fn same_batch(a: &ReadBatch, b: &ReadBatch) -> bool {
    a.bytes == b.bytes
}
