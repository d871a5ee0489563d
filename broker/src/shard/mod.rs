//! A shard: one core's share of the broker. It owns the partitions placed on it (and, on shard
//! 0, the metadata log), serves requests for them, and forwards everything else to the owning
//! shard over the cross-core mesh (glommio channels; no shared mutable state between cores).
//!
//! Which shard owns a partition and which partition a request goes to is `placement.rs`. The
//! service methods at the bottom are what the front ends call, on whichever shard accepted the
//! connection.

pub mod move_task;
pub mod partition;
pub mod placement;
pub mod render;
#[cfg(test)]
mod sim_tests;
pub mod slot;

use crate::config::BrokerConfig;
use crate::engine::attributes::{validate_queue_name, QueueKind};
use crate::engine::partition::validate_batch as validate_batch_entries;
use crate::engine::{
    BatchEntry, Command, Counters, Delivered, EngineError, MoveRequest, PartitionConfig, Receipt,
    ReceiptCodec, ReceiveRequest, Reply, SendRequest, SentReply,
};
use crate::error::{ServiceError, ServiceResult};
use crate::metadata::{Catalog, MetaRecord, QueueMeta};
use crate::partition_log::{LocalLog, PartitionLog};
use crate::runtime;
use futures::channel::oneshot;
use glommio::channels::channel_mesh::{Receivers, Senders};
use partition::PartitionActor;
use slot::Slot;
use sluice_storage::fs::DmaFs;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::{Rc, Weak};
use std::sync::Arc;

/// Capacity of each cross-core channel (messages); senders wait beyond it (back-pressure).
pub const MESH_CHANNEL_CAPACITY: usize = 1024;
/// A long poll re-checks at least this often, in case a wake-up was missed on another core.
const LONG_POLL_RECHECK_MS: u64 = 1000;
/// Partitions a shard opens (replays) at the same time at start: enough to overlap one's reads
/// with another's decoding, few enough to bound the read buffers held at once.
const PARTITION_OPENS_AT_ONCE: usize = 8;

/// What one shard asks of another.
#[derive(Debug)]
pub enum ShardRequest {
    Partition {
        queue_id: u64,
        partition: u32,
        op: PartitionOp,
    },
    /// To shard 0: change the metadata.
    Meta(MetaOp),
    /// From shard 0: apply durable metadata records (and open or close partitions).
    ApplyMeta(Vec<MetaRecord>),
    /// To shard 0: start, list or cancel message move tasks.
    MoveTask(move_task::MoveTaskOp),
    /// A metrics scrape: this shard's counters and partitions.
    Metrics,
    /// The bytes this shard's queue and topic logs hold, per account (stored-bytes quota).
    StoredBytes,
    /// Topics, topic partitions and consumer groups (`crate::stream`).
    Stream(crate::stream::StreamOp),
}

#[derive(Debug)]
pub enum PartitionOp {
    Execute(Command),
    WaitReady { deadline_ms: u64 },
    Counters,
}

#[derive(Debug)]
pub enum MetaOp {
    Create {
        tenant: String,
        name: String,
        attributes: BTreeMap<String, String>,
        tags: BTreeMap<String, String>,
    },
    SetAttributes {
        id: u64,
        changes: BTreeMap<String, String>,
    },
    SetTags {
        id: u64,
        tags: BTreeMap<String, String>,
    },
    Delete {
        id: u64,
    },
}

#[derive(Debug)]
pub enum ShardResponse {
    Reply(ServiceResult<Reply>),
    Ready(ServiceResult<bool>),
    Counters(ServiceResult<Counters>),
    Meta(ServiceResult<u64>),
    Applied(ServiceResult<()>),
    MoveTask(ServiceResult<move_task::MoveTaskReply>),
    Metrics(Box<crate::metrics::ShardSnapshot>),
    StoredBytes(HashMap<String, u64>),
    Stream(crate::stream::StreamResult<crate::stream::StreamReply>),
}

#[derive(Debug)]
pub enum Envelope {
    Request {
        from: usize,
        id: u64,
        req: ShardRequest,
    },
    Response {
        id: u64,
        resp: ShardResponse,
    },
}

pub struct Shard {
    pub id: usize,
    pub shards: usize,
    pub config: Arc<BrokerConfig>,
    fs: DmaFs,
    catalog: RefCell<Catalog>,
    partitions: RefCell<HashMap<(u64, u32), Slot>>,
    /// In a cluster: this shard's replicas, supervisors and (shard 0) the metadata replica.
    cluster: Option<Rc<crate::cluster::ClusterShard>>,
    senders: Option<Senders<Envelope>>,
    pending: RefCell<HashMap<u64, oneshot::Sender<ShardResponse>>>,
    next_request: Cell<u64>,
    meta_log: RefCell<Option<Rc<LocalLog<DmaFs>>>>,
    /// Every account's stored bytes, as gathered from all shards (stored-bytes quota).
    stored: RefCell<crate::auth::quota::StoredBytes>,
    /// This shard's share of every account's request and byte rates.
    rates: RefCell<crate::auth::quota::RateLimiter>,
    /// Free space on the data disk: sends stop under the reserve.
    pub disk: crate::disk::DiskGuard,
    meta_lock: futures::lock::Mutex<()>,
    receipts: ReceiptCodec,
    ready: Cell<bool>,
    placement: placement::Placement,
    /// Shard 0 only: message move tasks.
    move_tasks: RefCell<move_task::MoveTasks>,
    /// Topics and consumer groups (`crate::stream`).
    pub(crate) streams: crate::stream::ShardStreams,
    this: Weak<Shard>,
}

/// At start: removes the directories of queues the catalog says were deleted (a crash between
/// the durable delete and the removal, or a directory an older version left). Only ids below
/// the catalog's next id are touched: ids are never reused, so no live or future queue's
/// directory can match. Each is renamed aside at once and its space reclaimed in the background
/// (`reclaim`), as a deletion while running does; one renamed aside by an earlier start that
/// stopped before it was gone is handed over again.
fn remove_deleted_queue_dirs(queues_dir: &std::path::Path, catalog: &Catalog) {
    use sluice_storage::fs::reclaim::{deleted_path, reclaim_in_background, DELETED_SUFFIX};
    let Ok(entries) = std::fs::read_dir(queues_dir) else {
        return; // no queue was ever created
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        if name.ends_with(DELETED_SUFFIX) {
            reclaim_in_background(entry.path(), false);
            continue;
        }
        let Ok(id) = name.parse::<u64>() else {
            continue;
        };
        if id < catalog.next_id() && catalog.get(id).is_none() {
            let trash = deleted_path(&entry.path());
            match std::fs::rename(entry.path(), &trash) {
                Ok(()) => {
                    reclaim_in_background(trash, false);
                    tracing::info!(queue = id, "removing a deleted queue's leftover directory")
                }
                Err(e) => {
                    tracing::warn!(error = %e, queue = id, "removing a deleted queue's directory")
                }
            }
        }
    }
}

impl Shard {
    /// Starts the shard on the current executor: joins the mesh and, on shard 0, loads the
    /// metadata and bootstraps every shard with it.
    pub async fn start(
        id: usize,
        config: Arc<BrokerConfig>,
        mesh: Option<(Senders<Envelope>, Receivers<Envelope>)>,
    ) -> ServiceResult<Rc<Shard>> {
        let fs = DmaFs::new(&config.data_dir)
            .await
            .map_err(|e| ServiceError::Internal(format!("data dir: {e}")))?;
        let receipts = ReceiptCodec::new(&config.receipt_secret)?;
        let cluster = match crate::cluster::node::local() {
            Some(node) => Some(crate::cluster::ClusterShard::start(node, fs.clone())?),
            None => None,
        };
        let (senders, receivers) = match mesh {
            Some((s, r)) => (Some(s), Some(r)),
            None => (None, None),
        };
        let shard = Rc::new_cyclic(|this| Shard {
            id,
            shards: config.shards,
            config: config.clone(),
            fs,
            catalog: RefCell::new(Catalog::new(config.quotas.queues_per_account)),
            disk: crate::disk::DiskGuard::new(config.data_dir.clone(), config.disk_free_bytes_min),
            stored: RefCell::new(crate::auth::quota::StoredBytes::new(&config.quotas)),
            rates: RefCell::new(crate::auth::quota::RateLimiter::new(
                &config.quotas,
                config.shards,
            )),
            partitions: RefCell::new(HashMap::new()),
            cluster,
            senders,
            pending: RefCell::new(HashMap::new()),
            next_request: Cell::new(1),
            meta_log: RefCell::new(None),
            meta_lock: futures::lock::Mutex::new(()),
            receipts,
            ready: Cell::new(false),
            placement: placement::Placement::new(id, config.shards),
            move_tasks: RefCell::new(move_task::MoveTasks::default()),
            streams: Default::default(),
            this: this.clone(),
        });
        if let Some(mut r) = receivers {
            for (peer, stream) in r.streams() {
                let s = shard.clone();
                runtime::spawn(async move {
                    while let Some(env) = stream.recv().await {
                        s.on_envelope(peer, env);
                    }
                });
            }
        }
        if id == 0 && shard.cluster.is_some() {
            shard.start_replicated_meta().await?;
        } else if id == 0 {
            let meta_dir = config.data_dir.join("meta");
            let log = LocalLog::open(&shard.fs, meta_dir, crate::config::meta_log_config()).await?;
            let mut records = Vec::new();
            let mut at = log.start_offset();
            while at < log.end_offset() {
                for b in log.read(at, 1 << 20).await? {
                    for r in b.view().data_records() {
                        let r = r.map_err(|e| ServiceError::Internal(e.to_string()))?;
                        records.push(MetaRecord::decode(r.value).map_err(ServiceError::Internal)?);
                    }
                    at = b.header.next_offset();
                }
            }
            *shard.meta_log.borrow_mut() = Some(Rc::new(log));
            shard.streams_start().await?;
            tracing::info!(records = records.len(), "metadata loaded");
            shard.broadcast_meta(records).await?;
            // Under the metadata lock, so that no queue is created meanwhile.
            let _serial = shard.meta_lock.lock().await;
            remove_deleted_queue_dirs(&config.data_dir.join("queues"), &shard.catalog.borrow());
        }
        Ok(shard)
    }

    pub fn is_ready(&self) -> bool {
        self.ready.get()
    }

    pub(crate) fn weak(&self) -> Weak<Shard> {
        self.this.clone()
    }

    /// In a cluster, shard 0: hosts the metadata replica, applies what this node knows
    /// committed, and from then on every record as it commits (`cluster::shard`).
    async fn start_replicated_meta(self: &Rc<Self>) -> ServiceResult<()> {
        let cluster = self.cluster.clone().expect("cluster mode");
        let weak = self.this.clone();
        let apply: crate::cluster::shard::MetaApply = Rc::new(move |records| {
            let weak = weak.clone();
            Box::pin(async move {
                match weak.upgrade() {
                    Some(s) => s.broadcast_meta(records).await,
                    None => Err(ServiceError::Unavailable("shard stopped")),
                }
            })
        });
        self.streams_start().await?;
        cluster
            .start_meta(
                self.config.data_dir.join("meta"),
                crate::config::meta_log_config(),
                apply,
            )
            .await?;
        // Every shard is ready once what this node knows committed is applied (an empty
        // catalog applies no record: the empty broadcast says so).
        self.broadcast_meta(Vec::new()).await?;
        let _serial = self.meta_lock.lock().await;
        remove_deleted_queue_dirs(&self.config.data_dir.join("queues"), &self.catalog.borrow());
        Ok(())
    }

    /// A queue partition this shard owns (for reading its log as a stream).
    pub(crate) fn queue_partition(&self, queue_id: u64, p: u32) -> Option<Rc<PartitionActor>> {
        self.partitions.borrow().get(&(queue_id, p))?.local()
    }

    pub(crate) fn fs(&self) -> &DmaFs {
        &self.fs
    }

    /// Serialises metadata changes (shard 0).
    pub(crate) async fn meta_serial(&self) -> futures::lock::MutexGuard<'_, ()> {
        self.meta_lock.lock().await
    }

    /// On shard 0, under [`Shard::meta_serial`]: makes a record durable, then applies it on
    /// every shard.
    pub(crate) async fn persist_meta(&self, record: MetaRecord) -> ServiceResult<()> {
        self.commit_meta(record, runtime::now_ms()).await
    }

    /// Makes `record` (stamped `now_ms`) durable and applied on every shard: in a cluster,
    /// committed by a majority and applied by this node's applier; else appended to the local
    /// metadata log and broadcast.
    async fn commit_meta(&self, record: MetaRecord, now_ms: u64) -> ServiceResult<()> {
        if let Some(c) = &self.cluster {
            c.propose_meta(&record, now_ms).await?;
            record.log_durable();
            return Ok(());
        }
        let log = self
            .meta_log
            .borrow()
            .clone()
            .ok_or(ServiceError::Unavailable("metadata not loaded"))?;
        let mut b = sluice_storage::BatchBuilder::new();
        b.push_parts(now_ms as i64, None, &record.encode(), std::iter::empty());
        log.append(b.finish().expect("one record")).await?;
        record.log_durable();
        self.broadcast_meta(vec![record]).await
    }

    /// The shard owning partition `partition` of queue or topic `id` (`placement.rs`).
    pub(crate) fn owner(&self, queue_id: u64, partition: u32) -> usize {
        self.placement.owner(queue_id, partition)
    }

    fn on_envelope(self: &Rc<Self>, peer: usize, env: Envelope) {
        match env {
            Envelope::Request { from, id, req } => {
                let s = self.clone();
                runtime::spawn(async move {
                    let resp = s.clone().handle(req).await;
                    let senders = s.senders.as_ref().expect("a request came over the mesh");
                    // The peer is gone only at shutdown; then nobody waits for this.
                    let _ = senders.send_to(from, Envelope::Response { id, resp }).await;
                });
            }
            Envelope::Response { id, resp } => {
                if let Some(tx) = self.pending.borrow_mut().remove(&id) {
                    let _ = tx.send(resp);
                } else {
                    tracing::debug!(peer, id, "response for a request nobody waits for");
                }
            }
        }
    }

    /// Sends a request to shard `to` (or runs it here) and waits for the response.
    pub(crate) async fn request(&self, to: usize, req: ShardRequest) -> ShardResponse {
        if to == self.id {
            let me = self.this.upgrade().expect("shard alive while serving");
            return Box::pin(me.handle(req)).await;
        }
        let id = self.next_request.get();
        self.next_request.set(id + 1);
        let (tx, rx) = oneshot::channel();
        self.pending.borrow_mut().insert(id, tx);
        let senders = self.senders.as_ref().expect("several shards have a mesh");
        if senders
            .send_to(
                to,
                Envelope::Request {
                    from: self.id,
                    id,
                    req,
                },
            )
            .await
            .is_err()
        {
            self.pending.borrow_mut().remove(&id);
            return ShardResponse::Reply(Err(ServiceError::Unavailable("shard unreachable")));
        }
        rx.await
            .unwrap_or(ShardResponse::Reply(Err(ServiceError::Unavailable(
                "shard dropped the request",
            ))))
    }

    async fn handle(self: Rc<Self>, req: ShardRequest) -> ShardResponse {
        match req {
            ShardRequest::Partition {
                queue_id,
                partition,
                op,
            } => {
                let actor = self
                    .partitions
                    .borrow()
                    .get(&(queue_id, partition))
                    .cloned();
                let Some(actor) = actor else {
                    let e = if self.ready.get() {
                        ServiceError::NonExistentQueue
                    } else {
                        ServiceError::Unavailable("shard is starting")
                    };
                    return match op {
                        PartitionOp::Execute(_) => ShardResponse::Reply(Err(e)),
                        PartitionOp::WaitReady { .. } => ShardResponse::Ready(Err(e)),
                        PartitionOp::Counters => ShardResponse::Counters(Err(e)),
                    };
                };
                match op {
                    PartitionOp::Execute(cmd) => ShardResponse::Reply(actor.execute(cmd).await),
                    PartitionOp::WaitReady { deadline_ms } => {
                        ShardResponse::Ready(actor.wait_ready(deadline_ms).await)
                    }
                    PartitionOp::Counters => ShardResponse::Counters(actor.counters()),
                }
            }
            ShardRequest::Meta(op) => ShardResponse::Meta(self.meta_change(op).await),
            ShardRequest::ApplyMeta(records) => {
                ShardResponse::Applied(self.apply_meta(records).await)
            }
            ShardRequest::MoveTask(op) => ShardResponse::MoveTask(self.move_task_op(op).await),
            ShardRequest::Stream(op) => ShardResponse::Stream(self.stream_handle(op).await),
            ShardRequest::Metrics => {
                let parts = self
                    .partitions
                    .borrow()
                    .values()
                    .filter_map(Slot::metrics)
                    .collect();
                ShardResponse::Metrics(Box::new(crate::metrics::local_snapshot(
                    self.id,
                    parts,
                    self.config.metrics_queue_labels,
                )))
            }
            ShardRequest::StoredBytes => ShardResponse::StoredBytes(self.local_stored_bytes()),
        }
    }

    // ------------------------------------------------------------------ metadata

    /// On shard 0: decides, makes durable and broadcasts one metadata change.
    async fn meta_change(&self, op: MetaOp) -> ServiceResult<u64> {
        let _serial = self.meta_lock.lock().await;
        if let Some(c) = &self.cluster {
            // Only the metadata leader decides, on a catalog with every committed change.
            c.meta_leader().await?;
        }
        let now = runtime::now_ms();
        let record = {
            let c = self.catalog.borrow();
            match op {
                MetaOp::Create {
                    tenant,
                    name,
                    attributes,
                    tags,
                } => {
                    let policy = attributes.get("RedrivePolicy").cloned();
                    match c.plan_create(
                        &tenant,
                        &name,
                        attributes,
                        tags,
                        self.config.default_partitions,
                        now,
                    )? {
                        Some(r) => {
                            // A new queue allocates segments: not on a full disk (asking for
                            // an existing one, decided above, still answers).
                            self.disk.check(now)?;
                            if let Some(p) = &policy {
                                let kind = validate_queue_name(&name)?;
                                c.check_redrive_target(
                                    &tenant,
                                    &name,
                                    kind,
                                    p,
                                    &self.config.region,
                                )?;
                            }
                            r
                        }
                        None => return Ok(c.lookup(&tenant, &name)?.id),
                    }
                }
                MetaOp::SetAttributes { id, changes } => {
                    let q = c.get(id).ok_or(ServiceError::NonExistentQueue)?;
                    if let Some(p) = changes.get("RedrivePolicy") {
                        c.check_redrive_target(&q.tenant, &q.name, q.kind, p, &self.config.region)?;
                    }
                    c.plan_set_attributes(&q, &changes, now)?
                }
                MetaOp::SetTags { id, tags } => {
                    c.get(id).ok_or(ServiceError::NonExistentQueue)?;
                    crate::metadata::validate_tags(&tags)?;
                    MetaRecord::TagsSet {
                        v: crate::metadata::META_FORMAT_VERSION,
                        id,
                        tags,
                        at_ms: now,
                    }
                }
                MetaOp::Delete { id } => {
                    c.get(id).ok_or(ServiceError::NonExistentQueue)?;
                    MetaRecord::QueueDeleted {
                        v: crate::metadata::META_FORMAT_VERSION,
                        id,
                        at_ms: now,
                    }
                }
            }
        };
        let id = match &record {
            MetaRecord::QueueCreated { id, .. }
            | MetaRecord::AttributesSet { id, .. }
            | MetaRecord::TagsSet { id, .. }
            | MetaRecord::QueueDeleted { id, .. }
            | MetaRecord::TopicCreated { id, .. }
            | MetaRecord::TopicDeleted { id, .. }
            | MetaRecord::TopicAltered { id, .. } => *id,
        };
        self.commit_meta(record, now).await?;
        Ok(id)
    }

    /// Applies `records` on every shard, all shards at once: at start each one replays the
    /// logs of the partitions it owns, and one after the other a restart took the sum of the
    /// shards' replays instead of the longest one.
    async fn broadcast_meta(&self, records: Vec<MetaRecord>) -> ServiceResult<()> {
        let replies = futures::future::join_all(
            (0..self.shards).map(|s| self.request(s, ShardRequest::ApplyMeta(records.clone()))),
        )
        .await;
        let mut first_err = None;
        for r in replies {
            if let ShardResponse::Applied(Err(e)) = r {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    fn partition_config(&self, q: &QueueMeta, p: u32) -> PartitionConfig {
        PartitionConfig {
            queue_id: q.id,
            partition: p,
            attributes: q.parsed.clone(),
            limits: self.config.limits.clone(),
        }
    }

    fn partition_dir(&self, queue_id: u64, p: u32) -> std::path::PathBuf {
        self.config
            .data_dir
            .join("queues")
            .join(format!("{queue_id:016}"))
            .join(format!("p{p:05}"))
    }

    /// Applies committed metadata records: first to this shard's catalog, a pure state
    /// transition that every replica of the catalog makes alike ([`Self::apply_catalog`]); then
    /// this shard's partitions and streams are brought in line with the catalog
    /// ([`Self::reconcile_partitions`]), the node's own effects of the change.
    async fn apply_meta(&self, records: Vec<MetaRecord>) -> ServiceResult<()> {
        self.apply_catalog(&records)?;
        self.reconcile_partitions(&records).await?;
        self.streams_apply_meta(&records).await?;
        self.ready.set(true);
        Ok(())
    }

    /// The pure half of applying metadata records: the catalog changes and nothing else (no
    /// partition opened, no log written), so a follower replaying the catalog's log reaches the
    /// leader's catalog from the records alone.
    fn apply_catalog(&self, records: &[MetaRecord]) -> ServiceResult<()> {
        let mut catalog = self.catalog.borrow_mut();
        for r in records {
            catalog.apply(r).map_err(ServiceError::Internal)?;
        }
        Ok(())
    }

    /// The effects of applied metadata records on this shard: partitions it owns open (queues
    /// created), close and leave the disk (queues deleted), and take new attributes (a
    /// `Configured` record in the partition's own log: its leader's decision, replicated with
    /// that log, never a side effect of replaying the catalog).
    async fn reconcile_partitions(&self, records: &[MetaRecord]) -> ServiceResult<()> {
        let queues: Vec<Arc<QueueMeta>> = self.catalog.borrow().all().cloned().collect();
        let mut to_open = Vec::new();
        for q in &queues {
            for p in 0..q.partitions {
                if self.owner(q.id, p) != self.id {
                    continue;
                }
                let existing = self.partitions.borrow().get(&(q.id, p)).cloned();
                match existing {
                    None => to_open.push((q.clone(), p)),
                    Some(slot) => {
                        let cfg = self.partition_config(q, p);
                        if records.iter().any(
                            |r| matches!(r, MetaRecord::AttributesSet { id, .. } if *id == q.id),
                        ) {
                            slot.configure(cfg).await?;
                        }
                    }
                }
            }
        }
        self.open_partitions(to_open).await?;
        // Partitions of deleted queues: close and remove.
        let gone: Vec<(u64, u32)> = self
            .partitions
            .borrow()
            .keys()
            .filter(|(qid, _)| self.catalog.borrow().get(*qid).is_none())
            .copied()
            .collect();
        for key in gone {
            let actor = self.partitions.borrow_mut().remove(&key);
            if let Some(a) = actor {
                let _ = a.close().await;
                if let Some(c) = &self.cluster {
                    c.drop_partition(crate::cluster::shard::queue_group(key.0, key.1));
                }
                // Off this thread, its space freed a step at a time (`reclaim`: removing a
                // large log at once held the shard for tens of ms), under a name of its own
                // first, so that the removal can only ever reach what was this partition's. The
                // queue's own directory goes with its last partition (other shards may still
                // hold theirs: then it is not empty yet, and one of them removes it). A crash
                // before it is done leaves the directory to the next start.
                let trash = sluice_storage::fs::reclaim::deleted_path(a.dir());
                match std::fs::rename(a.dir(), &trash) {
                    Ok(()) => sluice_storage::fs::reclaim::reclaim_in_background(trash, true),
                    Err(e) => {
                        tracing::warn!(error = %e, dir = %a.dir().display(), "removing a deleted queue's partition")
                    }
                }
            }
        }
        Ok(())
    }

    /// Opens partitions (replaying their logs), several at a time: one partition's replay
    /// waits for its reads part of the time, and a broker with many queues opens many small
    /// logs at start. The ones that opened are kept even if another failed; the first error is
    /// returned.
    async fn open_partitions(&self, to_open: Vec<(Arc<QueueMeta>, u32)>) -> ServiceResult<()> {
        use futures::StreamExt;
        let opens = to_open.into_iter().map(|(q, p)| {
            let weak = self.this.clone();
            let sink: partition::MoveSink = Rc::new(move |mv| {
                if let Some(s) = weak.upgrade() {
                    runtime::spawn(async move { s.forward_move(mv).await });
                }
            });
            let dir = self.partition_dir(q.id, p);
            let config = self.partition_config(&q, p);
            let cluster = self.cluster.clone();
            let fs = self.fs.clone();
            let log_config = self.config.log.clone();
            let key = (q.id, p);
            let open = async move {
                match cluster {
                    Some(c) => c
                        .open_partition(crate::cluster::PartitionSpec {
                            group: crate::cluster::shard::queue_group(q.id, p),
                            dir,
                            config,
                            log_config,
                            moves: sink,
                        })
                        .await
                        .map(Slot::Replicated),
                    None => PartitionActor::open(fs, dir, config, log_config, sink)
                        .await
                        .map(Slot::Local),
                }
            };
            async move { (key, open.await) }
        });
        let mut opened = futures::stream::iter(opens).buffer_unordered(PARTITION_OPENS_AT_ONCE);
        let mut first_err = None;
        while let Some((key, result)) = opened.next().await {
            match result {
                Ok(actor) => {
                    self.partitions.borrow_mut().insert(key, actor);
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Forwards a message that exceeded maxReceiveCount to its dead-letter queue, then completes
    /// the move at the source. Idempotent at the DLQ (by origin), so retries are safe.
    async fn forward_move(self: Rc<Self>, mv: MoveRequest) {
        let mut backoff_ms = 100;
        loop {
            let result = self.try_forward_move(&mv).await;
            match result {
                Ok(()) => return,
                Err(None) => return, // the source queue is gone, and its messages with it
                Err(Some(e)) => {
                    tracing::warn!(error = %e, queue = mv.origin.queue_id, "dead-letter move failed; retrying");
                    runtime::sleep(std::time::Duration::from_millis(backoff_ms)).await;
                    backoff_ms = (backoff_ms * 2).min(30_000);
                }
            }
        }
    }

    async fn try_forward_move(&self, mv: &MoveRequest) -> Result<(), Option<ServiceError>> {
        let (src, dest) = {
            let c = self.catalog.borrow();
            let src = c.get(mv.origin.queue_id).ok_or(None)?;
            let dest = match mv.destination_queue() {
                // A dead-letter move: the source's redrive policy names the DLQ. If the policy
                // or the DLQ is gone, retry (with back-off) until the operator restores it.
                None => {
                    if src.parsed.redrive_policy.is_none() {
                        return Err(Some(ServiceError::Internal(
                            "redrive policy removed".into(),
                        )));
                    }
                    c.dead_letter_target(&src, &self.config.region)
                        .ok_or(Some(ServiceError::NonExistentQueue))?
                }
                // A redrive: a destination deleted since the task started gets nothing; the
                // message goes back into its own queue (the DLQ) as a fresh message, so that
                // it is never stranded half-moved.
                Some(id) => match c.get(id) {
                    Some(d) => d,
                    None => {
                        tracing::warn!(
                            queue = src.id,
                            destination = id,
                            "redrive destination is gone; the message stays in its queue"
                        );
                        src.clone()
                    }
                },
            };
            (src, dest)
        };
        let p = match (&mv.payload.group_id, dest.kind) {
            (Some(g), QueueKind::Fifo) => placement::group_partition(g, dest.partitions),
            _ => (mv.origin.msg_id % u64::from(dest.partitions)) as u32,
        };
        self.execute_on(&dest, p, Command::AcceptMove(mv.clone()))
            .await
            .map_err(Some)?;
        self.execute_on(
            &src,
            mv.origin.partition,
            Command::CompleteMove {
                msg_id: mv.origin.msg_id,
            },
        )
        .await
        .map_err(Some)?;
        Ok(())
    }

    pub(crate) async fn execute_on(
        &self,
        q: &QueueMeta,
        p: u32,
        cmd: Command,
    ) -> ServiceResult<Reply> {
        match self
            .request(
                self.owner(q.id, p),
                ShardRequest::Partition {
                    queue_id: q.id,
                    partition: p,
                    op: PartitionOp::Execute(cmd),
                },
            )
            .await
        {
            ShardResponse::Reply(r) => r,
            other => Err(ServiceError::Internal(format!(
                "unexpected response {other:?}"
            ))),
        }
    }

    /// Closes every partition and the metadata log (what is staged is committed first).
    pub async fn shutdown(&self) {
        let actors: Vec<_> = self
            .partitions
            .borrow_mut()
            .drain()
            .map(|(_, a)| a)
            .collect();
        for a in actors {
            if let Err(e) = a.close().await {
                tracing::warn!(error = %e, "closing a partition");
            }
        }
        self.streams_shutdown().await;
        if let Some(c) = &self.cluster {
            // Drivers stop (a replica's log is durable as far as it acknowledged anything).
            c.host.close().await;
        }
        let meta = self.meta_log.borrow_mut().take();
        if let Some(m) = meta {
            let _ = m.close().await;
        }
    }

    // ------------------------------------------------------------------ the service API

    fn check_ready(&self) -> ServiceResult<()> {
        if self.ready.get() {
            Ok(())
        } else {
            Err(ServiceError::Unavailable("broker is starting"))
        }
    }

    /// Admits one request of `bytes` for `account` under its rate quotas (both front ends
    /// call this once per request, after authentication), or `RequestThrottled`.
    pub fn admit(&self, account: &str, bytes: u64) -> ServiceResult<()> {
        let admitted = self
            .rates
            .borrow_mut()
            .admit(account, bytes, runtime::now_ms());
        if let Err(ServiceError::Throttled(why)) = &admitted {
            let quota = if *why == crate::auth::quota::BYTES_THROTTLED {
                crate::metrics::QuotaKind::Bytes
            } else {
                crate::metrics::QuotaKind::Requests
            };
            crate::metrics::record_quota_throttled(account, quota);
        }
        admitted
    }

    /// The bytes the logs of this shard's queue and topic partitions hold, per account.
    fn local_stored_bytes(&self) -> HashMap<String, u64> {
        let mut by_account: HashMap<String, u64> = HashMap::new();
        let catalog = self.catalog.borrow();
        for ((queue_id, _), actor) in self.partitions.borrow().iter() {
            if let Some(q) = catalog.get(*queue_id) {
                *by_account.entry(q.tenant.clone()).or_default() += actor.size_bytes();
            }
        }
        self.streams.add_stored_bytes(&mut by_account);
        by_account
    }

    /// `Ok` while `account` stores less than its stored-bytes quota (CONTRACT.md C8), else
    /// `RequestThrottled`. Every call site adds data. With a quota, the view is gathered from
    /// every shard at most every [`crate::auth::quota::STORED_BYTES_CHECK_INTERVAL_MS`]; the
    /// send that finds it stale waits for one round trip over the mesh, the others meanwhile
    /// use the view they have.
    pub async fn check_stored_bytes(&self, account: &str) -> ServiceResult<()> {
        let now = runtime::now_ms();
        if self.stored.borrow_mut().start_gathering(now) {
            let timeout =
                std::time::Duration::from_millis(crate::metrics::SHARD_SNAPSHOT_TIMEOUT_MS);
            let asks = (0..self.shards).map(|s| async move {
                let ask = Box::pin(self.request(s, ShardRequest::StoredBytes));
                match futures::future::select(ask, Box::pin(glommio::timer::sleep(timeout))).await {
                    futures::future::Either::Left((ShardResponse::StoredBytes(m), _)) => Some(m),
                    _ => None,
                }
            });
            let answers = futures::future::join_all(asks).await;
            if answers.iter().all(Option::is_some) {
                let mut sum: HashMap<String, u64> = HashMap::new();
                for (account, bytes) in answers.into_iter().flatten().flatten() {
                    *sum.entry(account).or_default() += bytes;
                }
                self.stored.borrow_mut().gathered(sum, now);
            } else {
                // A shard that does not answer (stopping, overloaded): keep the last view.
                self.stored.borrow_mut().gather_failed();
            }
        }
        let checked = self.stored.borrow().check(account);
        if checked.is_err() {
            crate::metrics::record_quota_throttled(account, crate::metrics::QuotaKind::StoredBytes);
        }
        checked
    }

    pub fn queue(&self, tenant: &str, name: &str) -> ServiceResult<Arc<QueueMeta>> {
        self.check_ready()?;
        self.catalog.borrow().lookup(tenant, name)
    }

    pub fn queue_by_arn(&self, arn: &str) -> Option<Arc<QueueMeta>> {
        self.catalog.borrow().lookup_arn(arn)
    }

    pub fn list_queues(&self, tenant: &str, prefix: &str) -> Vec<Arc<QueueMeta>> {
        self.catalog.borrow().list(tenant, prefix)
    }

    /// A metrics scrape: every shard's snapshot, asked at once; a shard that does not answer
    /// within [`crate::metrics::SHARD_SNAPSHOT_TIMEOUT_MS`] is left out (`sluice_shards` shows it).
    pub async fn metrics_snapshots(&self) -> Vec<crate::metrics::ShardSnapshot> {
        let timeout = std::time::Duration::from_millis(crate::metrics::SHARD_SNAPSHOT_TIMEOUT_MS);
        let asks = (0..self.shards).map(|s| async move {
            let ask = Box::pin(self.request(s, ShardRequest::Metrics));
            match futures::future::select(ask, Box::pin(glommio::timer::sleep(timeout))).await {
                futures::future::Either::Left((ShardResponse::Metrics(snap), _)) => Some(*snap),
                _ => None,
            }
        });
        futures::future::join_all(asks)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// Every queue's metric labels (all tenants).
    pub fn metrics_queue_labels(&self) -> Vec<crate::metrics::QueueLabel> {
        let c = self.catalog.borrow();
        c.all()
            .map(|q| crate::metrics::QueueLabel {
                id: q.id,
                tenant: q.tenant.clone(),
                name: q.name.clone(),
            })
            .collect()
    }

    /// Queues whose RedrivePolicy names `dlq` as their dead-letter queue.
    pub fn dead_letter_sources(&self, dlq: &QueueMeta) -> Vec<Arc<QueueMeta>> {
        let arn = dlq.arn(&self.config.region);
        self.catalog
            .borrow()
            .all()
            .filter(|q| {
                q.tenant == dlq.tenant
                    && q.parsed
                        .redrive_policy
                        .as_ref()
                        .is_some_and(|p| p.dead_letter_target_arn == arn)
            })
            .cloned()
            .collect()
    }

    async fn meta(&self, op: MetaOp) -> ServiceResult<u64> {
        self.check_ready()?;
        match self.request(0, ShardRequest::Meta(op)).await {
            ShardResponse::Meta(r) => r,
            ShardResponse::Reply(Err(e)) => Err(e),
            other => Err(ServiceError::Internal(format!(
                "unexpected response {other:?}"
            ))),
        }
    }

    pub async fn create_queue(
        &self,
        tenant: &str,
        name: &str,
        attributes: BTreeMap<String, String>,
        tags: BTreeMap<String, String>,
    ) -> ServiceResult<Arc<QueueMeta>> {
        let id = self
            .meta(MetaOp::Create {
                tenant: tenant.to_string(),
                name: name.to_string(),
                attributes,
                tags,
            })
            .await?;
        self.catalog
            .borrow()
            .get(id)
            .ok_or(ServiceError::Internal("created queue missing".into()))
    }

    pub async fn delete_queue(&self, q: &QueueMeta) -> ServiceResult<()> {
        self.meta(MetaOp::Delete { id: q.id }).await.map(|_| ())
    }

    pub async fn set_queue_attributes(
        &self,
        q: &QueueMeta,
        changes: BTreeMap<String, String>,
    ) -> ServiceResult<()> {
        self.meta(MetaOp::SetAttributes { id: q.id, changes })
            .await
            .map(|_| ())
    }

    pub async fn set_tags(
        &self,
        q: &QueueMeta,
        tags: BTreeMap<String, String>,
    ) -> ServiceResult<()> {
        self.meta(MetaOp::SetTags { id: q.id, tags })
            .await
            .map(|_| ())
    }

    /// The approximate counters of the whole queue (summed over its partitions).
    pub async fn queue_counters(&self, q: &QueueMeta) -> ServiceResult<Counters> {
        let mut total = Counters::default();
        for p in 0..q.partitions {
            let r = self
                .request(
                    self.owner(q.id, p),
                    ShardRequest::Partition {
                        queue_id: q.id,
                        partition: p,
                        op: PartitionOp::Counters,
                    },
                )
                .await;
            match r {
                ShardResponse::Counters(Ok(c)) => {
                    total.visible += c.visible;
                    total.in_flight += c.in_flight;
                    total.delayed += c.delayed;
                    total.moving += c.moving;
                }
                ShardResponse::Counters(Err(e)) => return Err(e),
                other => return Err(ServiceError::Internal(format!("unexpected {other:?}"))),
            }
        }
        Ok(total)
    }

    fn partition_order(&self, q: &QueueMeta) -> Vec<u32> {
        self.placement.partition_order(q)
    }

    fn send_partition(&self, q: &QueueMeta, group: Option<&str>) -> u32 {
        self.placement.send_partition(q, group)
    }

    pub async fn send(&self, q: &QueueMeta, req: SendRequest) -> ServiceResult<SentReply> {
        self.check_ready()?;
        self.disk.check(runtime::now_ms())?;
        self.check_stored_bytes(&q.tenant).await?;
        let p = self.send_partition(q, req.group_id.as_deref());
        match self.execute_on(q, p, Command::Send(req)).await? {
            Reply::Sent(s) => Ok(s),
            other => Err(ServiceError::Internal(format!(
                "unexpected reply {other:?}"
            ))),
        }
    }

    /// SendMessageBatch: validated as a whole, then each FIFO group's entries go to its
    /// partition (standard entries to one partition); results in the entries' order.
    pub async fn send_batch(
        &self,
        q: &QueueMeta,
        entries: Vec<BatchEntry>,
    ) -> ServiceResult<Vec<(String, Result<SentReply, ServiceError>)>> {
        self.check_ready()?;
        validate_batch_entries(&entries)?;
        self.disk.check(runtime::now_ms())?;
        self.check_stored_bytes(&q.tenant).await?;
        let mut by_partition: BTreeMap<u32, Vec<(usize, BatchEntry)>> = BTreeMap::new();
        let standard_p = self.send_partition(q, None);
        for (i, e) in entries.into_iter().enumerate() {
            let p = match q.kind {
                QueueKind::Fifo => self.send_partition(q, e.request.group_id.as_deref()),
                QueueKind::Standard => standard_p,
            };
            by_partition.entry(p).or_default().push((i, e));
        }
        let mut results: Vec<Option<(String, Result<SentReply, ServiceError>)>> = Vec::new();
        let futs = by_partition.into_iter().map(|(p, list)| async move {
            let idx: Vec<usize> = list.iter().map(|(i, _)| *i).collect();
            let ids: Vec<String> = list.iter().map(|(_, e)| e.id.clone()).collect();
            let cmd = Command::SendBatch(list.into_iter().map(|(_, e)| e).collect());
            (idx, ids, self.execute_on(q, p, cmd).await)
        });
        for (idx, ids, r) in futures::future::join_all(futs).await {
            match r {
                Ok(Reply::SentBatch(list)) => {
                    for (i, (id, res)) in idx.into_iter().zip(list) {
                        put(&mut results, i, (id, res.map_err(ServiceError::from)));
                    }
                }
                Ok(other) => return Err(ServiceError::Internal(format!("unexpected {other:?}"))),
                Err(e) => {
                    for (i, id) in idx.into_iter().zip(ids) {
                        put(&mut results, i, (id, Err(e.clone())));
                    }
                }
            }
        }
        Ok(results.into_iter().flatten().collect())
    }

    /// ReceiveMessage with long polling: a pass over the partitions; if nothing came and
    /// `wait_s` > 0, park on every partition until one may have a message (send, lease expiry,
    /// delay end, release) or the wait ends, and pass again.
    pub async fn receive(
        &self,
        q: &QueueMeta,
        req: ReceiveRequest,
        wait_s: u32,
    ) -> ServiceResult<Vec<Delivered>> {
        self.check_ready()?;
        let deadline = runtime::now_ms() + u64::from(wait_s) * 1000;
        let mut woken_by = None;
        loop {
            let got = self.receive_pass(q, &req, woken_by).await?;
            if !got.is_empty() || runtime::now_ms() >= deadline {
                // Messages replayed from the log have no body digest yet: hash them together.
                crate::engine::Payload::fill_md5_bodies(got.iter().map(|d| &*d.payload));
                return Ok(got);
            }
            let wake_by = deadline.min(runtime::now_ms() + LONG_POLL_RECHECK_MS);
            let waits = (0..q.partitions).map(|p| {
                Box::pin(self.request(
                    self.owner(q.id, p),
                    ShardRequest::Partition {
                        queue_id: q.id,
                        partition: p,
                        op: PartitionOp::WaitReady {
                            deadline_ms: wake_by,
                        },
                    },
                ))
            });
            // The first partition that may have a message ends the wait; the next pass asks it
            // first (no empty look at this shard's partitions before the hop).
            let (first, index, _) = futures::future::select_all(waits).await;
            match first {
                ShardResponse::Ready(Err(e)) => return Err(e),
                ShardResponse::Ready(Ok(true)) => woken_by = Some(index as u32),
                _ => woken_by = None,
            }
        }
    }

    /// One receive over the partitions, `first` (the one whose wake-up this is) before the
    /// rest.
    async fn receive_pass(
        &self,
        q: &QueueMeta,
        req: &ReceiveRequest,
        first: Option<u32>,
    ) -> ServiceResult<Vec<Delivered>> {
        let mut out: Vec<Delivered> = Vec::new();
        let mut order = self.partition_order(q);
        if let Some(i) = first.and_then(|f| order.iter().position(|&p| p == f)) {
            order[..=i].rotate_right(1);
        }
        for p in order {
            let want = req.max_messages.saturating_sub(out.len() as u32);
            if want == 0 {
                break;
            }
            // With messages in hand, don't make the consumer wait for another core's partition
            // (a hop, and that partition's commit if it leases more): return what this core
            // had. SQS answers with fewer than the maximum too; the next receive asks again.
            if !out.is_empty() && self.owner(q.id, p) != self.id {
                break;
            }
            let r = ReceiveRequest {
                max_messages: want,
                ..req.clone()
            };
            match self.execute_on(q, p, Command::Receive(r)).await {
                Ok(Reply::Received(list)) => out.extend(list),
                Ok(other) => return Err(ServiceError::Internal(format!("unexpected {other:?}"))),
                Err(e) if out.is_empty() => return Err(e),
                Err(_) => break, // keep what was received (already leased)
            }
        }
        Ok(out)
    }

    pub fn receipt_handle(&self, r: &Receipt) -> String {
        self.receipts.encode(r)
    }

    pub fn decode_receipt(&self, q: &QueueMeta, handle: &str) -> ServiceResult<Receipt> {
        let r = self.receipts.decode(handle, q.id).map_err(|_| {
            EngineError::ReceiptHandleIsInvalid("not a valid receipt handle for this queue")
        })?;
        if r.partition >= q.partitions {
            return Err(EngineError::ReceiptHandleIsInvalid("unknown partition").into());
        }
        Ok(r)
    }

    pub async fn delete_message(&self, q: &QueueMeta, handle: &str) -> ServiceResult<()> {
        self.check_ready()?;
        let receipt = self.decode_receipt(q, handle)?;
        self.execute_on(q, receipt.partition, Command::Delete { receipt })
            .await
            .map(|_| ())
    }

    /// DeleteMessageBatch: one `DeleteBatch` per partition (see [`Self::batch_by_partition`]).
    pub async fn delete_message_batch(
        &self,
        q: &QueueMeta,
        handles: Vec<String>,
    ) -> Vec<ServiceResult<()>> {
        let entries = handles.into_iter().map(|h| (h, ())).collect();
        self.batch_by_partition(
            q,
            entries,
            |e| Command::DeleteBatch(e.into_iter().map(|(r, ())| r).collect()),
            |reply| match reply {
                Reply::DeletedBatch(list) => Ok(list),
                other => Err(other),
            },
        )
        .await
    }

    /// ChangeMessageVisibilityBatch: one `ChangeVisibilityBatch` per partition (see
    /// [`Self::batch_by_partition`]).
    pub async fn change_visibility_batch(
        &self,
        q: &QueueMeta,
        entries: Vec<(String, u32)>,
    ) -> Vec<ServiceResult<()>> {
        self.batch_by_partition(
            q,
            entries,
            Command::ChangeVisibilityBatch,
            |reply| match reply {
                Reply::VisibilityChangedBatch(list) => Ok(list),
                other => Err(other),
            },
        )
        .await
    }

    /// A batch of receipt-handle entries: the handles are grouped by the partition they name,
    /// each partition runs its group as one command (`command`: one decision, one log batch,
    /// one durable wait) and `results` reads the per-entry results back from its reply; the
    /// partitions run concurrently. A handle that does not decode fails alone. Results in the
    /// entries' order.
    async fn batch_by_partition<T>(
        &self,
        q: &QueueMeta,
        entries: Vec<(String, T)>,
        command: fn(Vec<(Receipt, T)>) -> Command,
        results: fn(Reply) -> Result<EntryResults, Reply>,
    ) -> Vec<ServiceResult<()>> {
        if let Err(e) = self.check_ready() {
            return entries.iter().map(|_| Err(e.clone())).collect();
        }
        let mut out: Vec<Option<ServiceResult<()>>> = vec![None; entries.len()];
        // Per partition: the entries' places in the batch, and the entries.
        type Group<T> = (Vec<usize>, Vec<(Receipt, T)>);
        let mut by_partition: BTreeMap<u32, Group<T>> = BTreeMap::new();
        for (i, (h, arg)) in entries.into_iter().enumerate() {
            match self.decode_receipt(q, &h) {
                Ok(r) => {
                    let (idx, group) = by_partition.entry(r.partition).or_default();
                    idx.push(i);
                    group.push((r, arg));
                }
                Err(e) => out[i] = Some(Err(e)),
            }
        }
        let futs = by_partition
            .into_iter()
            .map(|(p, (idx, group))| async move {
                let n = group.len();
                let per_entry: Vec<ServiceResult<()>> =
                    match self.execute_on(q, p, command(group)).await.map(results) {
                        Ok(Ok(list)) if list.len() == n => list
                            .into_iter()
                            .map(|r| r.map_err(ServiceError::from))
                            .collect(),
                        Ok(Ok(list)) => {
                            let e = ServiceError::Internal(format!(
                                "{} results for {n} entries",
                                list.len()
                            ));
                            vec![Err(e); n]
                        }
                        Ok(Err(other)) => {
                            let e = ServiceError::Internal(format!("unexpected {other:?}"));
                            vec![Err(e); n]
                        }
                        Err(e) => vec![Err(e); n],
                    };
                (idx, per_entry)
            });
        for (idx, per_entry) in futures::future::join_all(futs).await {
            for (i, r) in idx.into_iter().zip(per_entry) {
                out[i] = Some(r);
            }
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(ServiceError::Internal("no result".into()))))
            .collect()
    }

    pub async fn change_visibility(
        &self,
        q: &QueueMeta,
        handle: &str,
        timeout_s: u32,
    ) -> ServiceResult<()> {
        self.check_ready()?;
        let receipt = self.decode_receipt(q, handle)?;
        self.execute_on(
            q,
            receipt.partition,
            Command::ChangeVisibility { receipt, timeout_s },
        )
        .await
        .map(|_| ())
    }

    pub async fn purge(&self, q: &QueueMeta) -> ServiceResult<()> {
        self.check_ready()?;
        for p in 0..q.partitions {
            self.execute_on(q, p, Command::Purge).await?;
        }
        Ok(())
    }
}

/// A batch command's per-entry results, in its entries' order.
type EntryResults = Vec<Result<(), EngineError>>;

/// The front ends' half of a batch of receipt-handle entries: `parsed` holds each entry's id
/// and what parsed of it; those that parsed go to `run` (one `Shard` batch call) and each of
/// its results returns to its entry's place, while an entry that did not parse keeps its
/// error. Results in the entries' order.
pub async fn run_parsed_entries<T, E, F, Fut>(
    parsed: Vec<(String, Result<T, E>)>,
    run: F,
) -> Vec<(String, Result<(), E>)>
where
    E: From<ServiceError>,
    F: FnOnce(Vec<T>) -> Fut,
    Fut: std::future::Future<Output = Vec<ServiceResult<()>>>,
{
    let mut good = Vec::with_capacity(parsed.len());
    let slots: Vec<(String, Option<E>)> = parsed
        .into_iter()
        .map(|(id, e)| match e {
            Ok(t) => {
                good.push(t);
                (id, None)
            }
            Err(e) => (id, Some(e)),
        })
        .collect();
    let mut done = run(good).await.into_iter();
    slots
        .into_iter()
        .map(|(id, failed)| {
            let r = match failed {
                Some(e) => Err(e),
                None => match done.next() {
                    Some(r) => r.map_err(E::from),
                    None => Err(E::from(ServiceError::Internal("no result".into()))),
                },
            };
            (id, r)
        })
        .collect()
}

fn put<T>(v: &mut Vec<Option<T>>, i: usize, x: T) {
    if v.len() <= i {
        v.resize_with(i + 1, || None);
    }
    v[i] = Some(x);
}
