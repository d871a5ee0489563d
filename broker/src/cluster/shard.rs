//! [`ClusterShard`]: what one shard of a cluster node runs for replication — its
//! [`ReplicaHost`] over the shard's peer transport, a replica (and a [`PartitionSupervisor`])
//! for every queue partition the shard owns, and, on shard 0, the metadata catalog's replica.
//!
//! The shard (`crate::shard`) stays as it is in single-node mode; in cluster mode it asks this
//! module for three things:
//!
//! - **Partitions**: [`ClusterShard::open_partition`] opens (or creates, bootstrapped with the
//!   configured members) the replica at the partition's usual directory, hosts it, and starts a
//!   supervisor that runs the partition's actor on whichever node leads it. Every node hosts a
//!   replica of every partition (three nodes, replication factor three): followers are hot
//!   standbys whose log is current; a new leader's engine replays the committed log.
//! - **The metadata catalog**: a replica of [`META_GROUP`] in `<data>/meta`. Changes are
//!   proposed on its leader ([`ClusterShard::propose_meta`]); every node applies committed
//!   records in log order from one applier task (the shard's [`MetaApply`]), so every node's
//!   catalog is the same function of the same log. A change is acknowledged once a majority
//!   has it on disk and this node has applied it.
//! - **Group ids**: a partition's Raft group is [`queue_group`] of its queue id and index, the
//!   same on every node, and it runs on the same shard index everywhere (placement depends on
//!   the queue id and the shard count only, so every node must run the same number of shards).
//!
//! Not yet here (issue 41): topics and the consumer-group log stay on local logs in a cluster;
//! a node leads what its replicas elect it to, with no leader balancing yet (issue 42).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::rc::Rc;

use sluice_cluster::{Create, Replica, ReplicaConfig};
use sluice_raft::{GroupId, Membership, Replica as RaftMember};
use sluice_storage::fs::DmaFs;
use sluice_storage::{BatchBuilder, LogConfig};

use super::node::ShardNode;
use super::replicated::{ReplicaHost, ReplicatedLog};
use super::supervisor::{PartitionSpec, PartitionSupervisor};
use crate::error::{ServiceError, ServiceResult};
use crate::metadata::MetaRecord;
use crate::partition_log::PartitionLog;
use crate::runtime::{Clock, Event, WallClock};

/// A shard's replica host in the daemon.
pub type Host = ReplicaHost<DmaFs, WallClock>;
/// A queue partition's supervisor in the daemon.
pub type Supervisor = PartitionSupervisor<DmaFs, WallClock>;

/// The metadata catalog's Raft group (no queue group can take it: see [`queue_group`]).
pub const META_GROUP: GroupId = u64::MAX;
/// Bits of a queue partition's group id that hold its partition index.
const PARTITION_BITS: u32 = 20;
/// How long a request waits for a replica to lead and serve before `NotLeader`, ms: long
/// enough to ride out the replay after an election, short enough for a client's retry.
pub const OPEN_WAIT_MS: u64 = 3_000;
/// A leader's heartbeat interval, ms.
pub const HEARTBEAT_INTERVAL_MS: u64 = 100;
/// A follower that hears no leader for this long (randomised up to twice it) starts an
/// election, ms: ten heartbeats, so a busy core or a lost packet does not depose a leader,
/// and a dead leader is replaced within 1-2 s plus the new leader's replay.
pub const ELECTION_TIMEOUT_MS: u64 = 1_000;
/// The applier re-reads the metadata log at least this often, ms (a missed notification).
const META_APPLY_RECHECK_MS: u64 = 100;

/// The Raft group of partition `partition` of queue `queue_id`: the queue id in the high bits,
/// the index in the low [`PARTITION_BITS`]. Queue ids stay far below 2^44, so no queue group
/// is [`META_GROUP`].
pub fn queue_group(queue_id: u64, partition: u32) -> GroupId {
    debug_assert!(partition < (1 << PARTITION_BITS));
    (queue_id << PARTITION_BITS) | u64::from(partition)
}

/// The metadata group's leader as this node last saw it (0: unknown), for every shard's front
/// ends: a follower's catalog may lag the leader's by a commit, so a queue it does not know yet
/// is asked of the leader ([`meta_leader_hint`]). One process is one node.
static META_LEADER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The metadata leader this node last saw (possibly itself); `None` while none is known.
pub fn meta_leader_hint() -> Option<u64> {
    match META_LEADER.load(std::sync::atomic::Ordering::Relaxed) {
        0 => None,
        l => Some(l),
    }
}

thread_local! {
    /// This shard's host, for metrics scrapes (`replication_snapshot`).
    static HOST: RefCell<Option<std::rc::Weak<Host>>> = const { RefCell::new(None) };
}

/// One shard's replication in a metrics scrape (`sluice_raft_*`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplicationSnapshot {
    /// Replicas hosted, led by this node, and led and serving.
    pub replicas: u64,
    pub leading: u64,
    pub serving: u64,
    /// On this node's leaders: the most any follower's durable log is behind the leader's, in
    /// offsets (replication lag).
    pub lag_offsets_max: u64,
    /// Offsets held here but not known committed, summed over replicas.
    pub uncommitted_offsets: u64,
    pub proposals_committed: u64,
    pub proposals_dropped: u64,
    pub truncations: u64,
    pub host: super::HostStats,
}

/// This shard's replication as a scrape sees it; `None` outside cluster mode.
pub fn replication_snapshot() -> Option<ReplicationSnapshot> {
    let host = HOST.with(|h| h.borrow().as_ref().and_then(std::rc::Weak::upgrade))?;
    let mut snap = ReplicationSnapshot {
        host: host.stats(),
        ..Default::default()
    };
    for r in host.replicas() {
        snap.replicas += 1;
        let end = r.raft_log_end();
        snap.uncommitted_offsets += end.saturating_sub(r.committed_end());
        let st = r.stats();
        snap.proposals_committed += st.proposals_committed;
        snap.proposals_dropped += st.proposals_dropped;
        snap.truncations += st.truncations;
        if r.leader() == Some(r.node()) {
            snap.leading += 1;
            if r.is_serving() {
                snap.serving += 1;
            }
            for (_, flushed) in r.follower_flushed() {
                snap.lag_offsets_max = snap.lag_offsets_max.max(end.saturating_sub(flushed));
            }
        }
    }
    Some(snap)
}

/// Applies committed metadata records on this node (the shard's broadcast to every shard).
pub type MetaApply =
    Rc<dyn Fn(Vec<MetaRecord>) -> Pin<Box<dyn Future<Output = ServiceResult<()>>>>>;

/// One shard's replication (see the module doc).
pub struct ClusterShard {
    pub host: Rc<Host>,
    node: Rc<ShardNode>,
    fs: DmaFs,
    membership: Membership,
    raft: sluice_raft::Config,
    /// Shard 0: the metadata replica's state.
    meta: RefCell<Option<Rc<MetaState>>>,
}

struct MetaState {
    dir: PathBuf,
    /// The leader's handle over the metadata log, while this node leads it.
    log: RefCell<Option<Rc<ReplicatedLog<DmaFs>>>>,
    /// Records below this offset are applied on this node.
    applied: Cell<u64>,
    /// Notified after each applied round.
    applied_event: Event,
}

impl ClusterShard {
    /// Starts the shard's replica host over its node's transport (taking the inbox).
    pub fn start(node: Rc<ShardNode>, fs: DmaFs) -> ServiceResult<Rc<Self>> {
        let inbox = node
            .take_inbox()
            .ok_or(ServiceError::Internal("peer inbox already taken".into()))?;
        let host = Host::start(node.transport.clone(), inbox, WallClock, OPEN_WAIT_MS);
        HOST.with(|h| *h.borrow_mut() = Some(Rc::downgrade(&host)));
        let members: Vec<RaftMember> = node
            .cluster()
            .members
            .iter()
            .map(|m| RaftMember {
                node: m.id,
                disk: m.disk,
            })
            .collect();
        Ok(Rc::new(ClusterShard {
            host,
            membership: Membership::voters(&members),
            raft: sluice_raft::Config {
                heartbeat_interval_ms: HEARTBEAT_INTERVAL_MS,
                election_timeout_ms: ELECTION_TIMEOUT_MS,
                ..sluice_raft::Config::default()
            },
            node,
            fs,
            meta: RefCell::new(None),
        }))
    }

    /// This node's id.
    pub fn node_id(&self) -> u64 {
        self.node.node_id()
    }

    /// Opens (or creates) `group`'s replica in `dir` and hosts it. A directory with no Raft
    /// state starts bootstrapped with the configured members; a directory holding a local
    /// (single-node) log is refused: it was never replicated.
    pub async fn host_replica(
        &self,
        dir: PathBuf,
        group: GroupId,
        log_config: LogConfig,
    ) -> ServiceResult<()> {
        if self.host.replica(group).is_some() {
            return Ok(());
        }
        let replica = Replica::open(
            self.fs.clone(),
            dir.clone(),
            log_config,
            ReplicaConfig {
                node: self.node_id(),
                group,
                raft: self.raft.clone(),
                seed: self.node_id().wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ group,
            },
            Create::Bootstrap(self.membership.clone()),
            WallClock.now_ms(),
        )
        .await
        .map_err(|e| {
            ServiceError::Internal(format!("opening the replica at {}: {e}", dir.display()))
        })?;
        self.host.host(replica);
        Ok(())
    }

    /// Hosts partition `spec.group`'s replica and starts its supervisor.
    pub async fn open_partition(&self, spec: PartitionSpec) -> ServiceResult<Rc<Supervisor>> {
        self.host_replica(spec.dir.clone(), spec.group, spec.log_config.clone())
            .await?;
        Ok(Supervisor::start(self.host.clone(), WallClock, spec))
    }

    /// Stops hosting `group` (its queue was deleted): the driver stops; the caller removes
    /// the directory.
    pub fn drop_partition(&self, group: GroupId) {
        self.host.unhost(group);
    }

    // ---- The metadata catalog (shard 0) -------------------------------------------------

    /// Hosts the metadata replica at `dir` and starts applying its committed records with
    /// `apply`, from the log's start (the catalog is rebuilt from the log at every start).
    /// Returns once what this node knows committed is applied.
    pub async fn start_meta(
        self: &Rc<Self>,
        dir: PathBuf,
        log_config: LogConfig,
        apply: MetaApply,
    ) -> ServiceResult<()> {
        self.host_replica(dir.clone(), META_GROUP, log_config)
            .await?;
        let replica = self
            .host
            .replica(META_GROUP)
            .ok_or(ServiceError::Internal("metadata replica not hosted".into()))?;
        let state = Rc::new(MetaState {
            dir,
            log: RefCell::new(None),
            applied: Cell::new(replica.log().start_offset()),
            applied_event: Event::default(),
        });
        *self.meta.borrow_mut() = Some(state.clone());
        // What this node knows committed (its stored commit floor) is applied before it
        // answers anything: the catalog it serves from is at least its own last one.
        self.apply_committed(&state, &apply).await?;
        let me = Rc::downgrade(self);
        crate::runtime::spawn(async move {
            loop {
                let Some(cs) = me.upgrade() else { return };
                let Some(progressed) = cs.host.progressed(META_GROUP) else {
                    return;
                };
                let listen = progressed.listen();
                let leader = cs.host.replica(META_GROUP).and_then(|r| r.leader());
                META_LEADER.store(leader.unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
                if let Err(e) = cs.apply_committed(&state, &apply).await {
                    tracing::warn!(error = %e, "applying committed metadata; retrying");
                }
                drop(cs);
                let until = WallClock.now_ms() + META_APPLY_RECHECK_MS;
                let l = std::pin::pin!(listen);
                let t = std::pin::pin!(WallClock.sleep_until_ms(until));
                futures::future::select(l, t).await;
            }
        });
        Ok(())
    }

    /// Applies the committed metadata records this node has not applied yet.
    async fn apply_committed(&self, state: &MetaState, apply: &MetaApply) -> ServiceResult<()> {
        let Some(replica) = self.host.replica(META_GROUP) else {
            return Ok(());
        };
        loop {
            let end = replica.committed_end().min(replica.log().end_offset());
            let at = state.applied.get();
            if at >= end {
                return Ok(());
            }
            let mut records = Vec::new();
            let mut next = at;
            for b in replica.log().read(at, 1 << 20).await? {
                if b.header.base_offset >= end {
                    break;
                }
                for r in b.view().data_records() {
                    let r = r.map_err(|e| ServiceError::Internal(e.to_string()))?;
                    records.push(MetaRecord::decode(r.value).map_err(ServiceError::Internal)?);
                }
                next = b.header.next_offset();
            }
            if next == at {
                return Ok(());
            }
            if !records.is_empty() {
                apply(records).await?;
            }
            state.applied.set(next);
            state.applied_event.notify();
        }
    }

    fn meta_state(&self) -> ServiceResult<Rc<MetaState>> {
        self.meta
            .borrow()
            .clone()
            .ok_or(ServiceError::Unavailable("metadata not loaded"))
    }

    /// On the metadata leader: a handle over the metadata log, once every committed record is
    /// applied here (so the catalog a change is decided on is current). `NotLeader` elsewhere.
    pub async fn meta_leader(&self) -> ServiceResult<Rc<ReplicatedLog<DmaFs>>> {
        let state = self.meta_state()?;
        // A handle fails to stage once its term is over; `propose_meta` drops it then.
        let current = state.log.borrow().clone();
        let log = match current {
            Some(l) => l,
            None => {
                let env = self.host.env();
                let l = Rc::new(
                    <ReplicatedLog<DmaFs> as PartitionLog>::open(
                        &env,
                        state.dir.clone(),
                        crate::config::meta_log_config(),
                    )
                    .await?,
                );
                *state.log.borrow_mut() = Some(l.clone());
                l
            }
        };
        self.wait_applied(&state, log.end_offset()).await?;
        Ok(log)
    }

    async fn wait_applied(&self, state: &MetaState, end: u64) -> ServiceResult<()> {
        let deadline = WallClock.now_ms() + OPEN_WAIT_MS;
        while state.applied.get() < end {
            if WallClock.now_ms() >= deadline {
                return Err(ServiceError::Unavailable(
                    "metadata not applied yet on this node",
                ));
            }
            let l = std::pin::pin!(state.applied_event.listen());
            let t = std::pin::pin!(
                WallClock.sleep_until_ms(WallClock.now_ms() + META_APPLY_RECHECK_MS)
            );
            futures::future::select(l, t).await;
        }
        Ok(())
    }

    /// On the metadata leader (under the shard's metadata lock): commits `record` and returns
    /// once this node has applied it. `NotLeader` when leadership moved; with
    /// `outcome_unknown` when it moved after the record was proposed.
    pub async fn propose_meta(&self, record: &MetaRecord, now_ms: u64) -> ServiceResult<()> {
        let state = self.meta_state()?;
        let log = self.meta_leader().await?;
        let mut b = BatchBuilder::new();
        b.push_parts(now_ms as i64, None, &record.encode(), std::iter::empty());
        let batch = b
            .finish()
            .ok_or(ServiceError::Internal("empty metadata batch".into()))?;
        let staged = log.stage(batch).map_err(|e| {
            *state.log.borrow_mut() = None;
            ServiceError::from(e)
        })?;
        let info = match log.committed(staged.ticket).await {
            Ok(i) => i,
            Err(e) => {
                *state.log.borrow_mut() = None;
                return Err(e.into());
            }
        };
        self.wait_applied(&state, info.last_offset + 1).await
    }
}
