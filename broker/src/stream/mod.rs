//! Streams: Kafka-style topics (partitioned append-only logs), produce, fetch with long
//! polling, offsets by time, and consumer groups with durable committed offsets.
//!
//! | file | purpose |
//! |---|---|
//! | `catalog.rs` | topic definitions (sans-I/O), applied from the metadata log on every shard |
//! | `partition.rs` | one topic partition on its owning shard: log, append wake-ups, retention |
//! | `group.rs` | consumer groups as a sans-I/O state machine: members, generations, assignment, commits |
//! | `queue_view.rs` | a queue partition's messages read as a stream, without touching leases |
//! | `readahead.rs` | a lagging consumer's next window read from disk while its last answer is sent |
//! | `coordinator.rs` | the group coordinator on shard 0: the groups log and session expiry |
//! | `kafka_group.rs` | Kafka's group membership (client-side assignment) as a sans-I/O state machine on shard 0 |
//! | `admin.rs` | the admin calls: partitions and retention changed, records deleted, groups listed and deleted |
//! | `mod.rs` | errors, mesh messages, and the service API on [`Shard`] the front ends call |
//!
//! Placement follows queues: partition `p` of topic `t` lives on shard `(t + p) % shards`.
//! Topic metadata goes through shard 0's metadata log (`TopicCreated`/`TopicDeleted`); consumer
//! groups live on shard 0. A producer's batch is stored in the bytes it arrived in (the log
//! verifies its checksum and structure, and sets its base offset), and fetch returns whole
//! batches in their on-disk bytes.

pub mod admin;
pub mod catalog;
pub mod coordinator;
pub mod group;
pub mod kafka_group;
pub mod partition;
pub mod queue_view;
pub mod readahead;
pub mod share;
pub mod txn;
pub mod txn_index;

pub use catalog::{TopicCatalog, TopicConfig, TopicMeta};
pub use group::{Assignment, GroupDescription, TopicPartition};
pub use partition::ProducerBatch;

use crate::error::ServiceError;
use crate::metadata::{MetaRecord, META_FORMAT_VERSION};
use crate::runtime;
use crate::shard::{Shard, ShardRequest, ShardResponse};
use bytes::Bytes;
use sluice_storage::{AppendInfo, BatchView, Record, StorageError};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::Arc;

/// A group member subscribes to a queue (read as a stream, `Shard::fetch_queue_stream`) by
/// naming `queue:<queue name>` among its topics; commits name the same.
pub const QUEUE_TOPIC_PREFIX: &str = "queue:";

/// The most bytes one fetch returns (at least one batch is always returned if there is one).
pub const FETCH_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Recently committed bytes a topic partition keeps in memory for consumers at the tail
/// (the log's default is 8 MiB): at 75 MB/s into a partition, 8 MiB is ~0.1 s of lag, and a
/// consumer that fell that far behind read the disk, got slower and fell further behind.
pub const TOPIC_READ_CACHE_BYTES: usize = 32 * 1024 * 1024;
/// The longest a fetch may wait for data.
pub const FETCH_WAIT_MS_MAX: u64 = 30_000;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    #[error("unknown topic {0}")]
    UnknownTopic(String),
    #[error("topic {0} exists with a different configuration")]
    TopicExists(String),
    #[error("partition {partition} does not exist (the topic has {partitions})")]
    UnknownPartition { partition: u32, partitions: u32 },
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
    /// The offset is not in the log: below its start (retention removed it) or past its end.
    #[error("offset {offset} out of range [{start}, {end}]")]
    OffsetOutOfRange { offset: u64, start: u64, end: u64 },
    /// Not a member of the group (expired, left, or never joined): join again.
    #[error("unknown group member {0}")]
    UnknownMember(String),
    #[error("stale generation {given} (current {current}): the group rebalanced")]
    StaleGeneration { given: u64, current: u64 },
    #[error("partition {0} is not assigned to this member")]
    NotAssigned(String),
    #[error("limit exceeded: {0}")]
    LimitExceeded(&'static str),
    #[error("throttled: {0}")]
    Throttled(&'static str),
    /// An idempotent producer's batch does not follow its previous one.
    #[error("out of order sequence: {0}")]
    OutOfOrderSequence(String),
    /// An idempotent producer with an older epoch than one already seen.
    #[error("producer fenced: {0}")]
    ProducerFenced(String),
    #[error("unavailable: {0}")]
    Unavailable(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl StreamError {
    /// Whether a client should retry the same request.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            StreamError::Throttled(_) | StreamError::Unavailable(_) | StreamError::Internal(_)
        )
    }
}

pub type StreamResult<T> = Result<T, StreamError>;

impl From<StorageError> for StreamError {
    fn from(e: StorageError) -> Self {
        match e {
            StorageError::OffsetOutOfRange { offset, start, end } => {
                StreamError::OffsetOutOfRange { offset, start, end }
            }
            StorageError::InvalidBatch(b) => StreamError::InvalidBatch(b.to_string()),
            StorageError::NoSpace { .. } => StreamError::Unavailable("disk full".into()),
            other => StreamError::Internal(format!("storage: {other}")),
        }
    }
}

impl From<ServiceError> for StreamError {
    fn from(e: ServiceError) -> Self {
        match e {
            ServiceError::Unavailable(s) => StreamError::Unavailable(s.into()),
            ServiceError::Throttled(s) => StreamError::Throttled(s),
            ServiceError::StoredBytesQuota { .. } => StreamError::Throttled(
                "this account's stored-bytes quota is used up; retry with back-off",
            ),
            e @ ServiceError::DiskFull { .. } => StreamError::Unavailable(e.to_string()),
            other => StreamError::Internal(other.to_string()),
        }
    }
}

/// Where a fetch or a seek starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetSpec {
    Earliest,
    Latest,
    /// The first offset whose record timestamp is >= this (the end if none is).
    Timestamp(i64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchRequest {
    pub offset: u64,
    pub max_bytes: usize,
    pub max_records: u32,
    /// Wait up to this long for data when there is none at `offset`.
    pub wait_ms: u64,
}

/// Whole batches in their stored bytes; the first may start before the requested offset.
#[derive(Debug, Clone, Default)]
pub struct FetchReply {
    pub batches: Vec<Bytes>,
    /// The partition's first and next offsets when the fetch was answered.
    pub start_offset: u64,
    pub end_offset: u64,
    /// Kafka's last stable offset (`txn_index`): the first offset of the oldest open
    /// transaction, else `end_offset`.
    pub last_stable_offset: u64,
    /// Read committed: the aborted transactions in the answer's range, (producer id, first
    /// offset), as Kafka's Fetch reports them (their batches are already left out).
    pub aborted: Vec<(i64, u64)>,
}

/// One fetched record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedRecord {
    pub offset: u64,
    pub record: Record,
}

impl FetchReply {
    /// The records at or after `from`, verified again (the bytes crossed a core); a
    /// Kafka-compressed batch is decompressed (bounded, `kafka::compression`).
    pub fn records(&self, from: u64) -> StreamResult<Vec<FetchedRecord>> {
        let mut out = Vec::new();
        for b in &self.batches {
            let b = &crate::kafka::compression::sluice_records(b)
                .map_err(|e| StreamError::Internal(e.to_string()))?;
            let v = BatchView::parse(b).map_err(|e| StreamError::Internal(e.to_string()))?;
            for r in v.data_records() {
                let r = r.map_err(|e| StreamError::Internal(e.to_string()))?;
                if r.offset >= from {
                    out.push(FetchedRecord {
                        offset: r.offset,
                        record: r.to_owned_record(),
                    });
                }
            }
        }
        Ok(out)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Produced {
    pub partition: u32,
    pub base_offset: u64,
    pub last_offset: u64,
}

/// A group's position on one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionLag {
    pub topic: String,
    pub partition: u32,
    pub committed: u64,
    pub latest: u64,
    /// `latest - committed`: records produced and not yet committed (some may already be
    /// gone to retention).
    pub lag: u64,
}

/// What one shard asks another about streams.
#[derive(Debug)]
pub enum StreamOp {
    CreateTopic {
        tenant: String,
        name: String,
        config: TopicConfig,
    },
    DeleteTopic {
        id: u64,
    },
    Produce {
        topic_id: u64,
        partition: u32,
        batch: Vec<u8>,
        /// Set for an idempotent producer's batch (`TopicPartition::produce_idempotent`).
        producer: Option<ProducerBatch>,
    },
    Fetch {
        topic_id: u64,
        partition: u32,
        offset: u64,
        max_bytes: usize,
        max_records: u32,
        deadline_ms: u64,
    },
    ListOffset {
        topic_id: u64,
        partition: u32,
        spec: OffsetSpec,
    },
    Join {
        group: String,
        member_id: Option<String>,
        topics: Vec<String>,
        session_timeout_ms: u64,
    },
    Heartbeat {
        group: String,
        member_id: String,
    },
    Leave {
        group: String,
        member_id: String,
    },
    Commit {
        group: String,
        member_id: String,
        generation: u64,
        offsets: Vec<(TopicPartition, u64)>,
    },
    Committed {
        group: String,
    },
    Describe {
        group: String,
    },
    /// Where a queue partition's stream starts, ends, or reaches a time (`queue_view`).
    ListQueueOffset {
        queue_id: u64,
        partition: u32,
        spec: OffsetSpec,
    },
    /// Every group's qualified name (all tenants; the caller filters).
    ListGroups,
    /// Kafka's group membership (`kafka_group`), on shard 0.
    KafkaGroup(KafkaGroupOp),
    /// The admin calls (`admin.rs`).
    Admin(admin::AdminOp),
    /// Kafka share groups (`share`), on shard 0.
    Share(share::ShareOp),
    /// Read a queue partition's messages as a stream (`queue_view`).
    FetchQueue {
        queue_id: u64,
        partition: u32,
        offset: u64,
        max_bytes: usize,
        max_records: u32,
        deadline_ms: u64,
    },
    /// Kafka transactions (`txn.rs`).
    Txn(txn::TxnOp),
}

/// Kafka group requests, by qualified group name (`tenant/group`).
#[derive(Debug)]
pub enum KafkaGroupOp {
    Join {
        group: String,
        request: kafka_group::JoinRequest,
    },
    Sync {
        group: String,
        member: String,
        generation: i32,
        assignments: Vec<(String, Bytes)>,
    },
    Heartbeat {
        group: String,
        member: String,
        generation: i32,
    },
    Leave {
        group: String,
        member: String,
    },
    Commit {
        group: String,
        member: String,
        generation: i32,
        offsets: Vec<(TopicPartition, u64)>,
    },
}

/// What a Kafka group request got: Kafka's error code on refusal.
#[derive(Debug)]
pub enum KafkaGroupReply {
    Joined(Result<kafka_group::JoinResult, i16>),
    Synced(Result<(String, Bytes), i16>),
    Done(Result<(), i16>),
}

#[derive(Debug)]
pub enum StreamReply {
    TopicId(u64),
    Produced(AppendInfo),
    Fetched(FetchReply),
    Offset(u64),
    Assignment(Assignment),
    Done,
    Committed(BTreeMap<TopicPartition, u64>),
    Described(Option<GroupDescription>),
    Groups(Vec<String>),
    QueueFetched(queue_view::QueueFetch),
    KafkaGroup(KafkaGroupReply),
    Admin(admin::AdminReply),
    Share(Result<share::ShareReply, share::ShareRefusal>),
    Txn(txn::TxnReply),
}

/// A shard's stream state.
#[derive(Default)]
pub struct ShardStreams {
    catalog: RefCell<TopicCatalog>,
    partitions: RefCell<HashMap<(u64, u32), Rc<partition::TopicPartition>>>,
    /// Shard 0 only.
    coordinator: RefCell<Option<Rc<coordinator::Coordinator>>>,
    /// Shard 0 only: Kafka share groups.
    share: RefCell<share::ShareGroups>,
    /// Shard 0 only: Kafka's transaction coordinator.
    txn: RefCell<Option<Rc<txn::TxnCoordinator>>>,
    round_robin: Cell<u64>,
}

impl ShardStreams {
    /// Adds the bytes this shard's topic partition logs hold to their accounts' sums.
    pub(crate) fn add_stored_bytes(&self, by_account: &mut HashMap<String, u64>) {
        let catalog = self.catalog.borrow();
        for ((topic_id, _), tp) in self.partitions.borrow().iter() {
            if let Some(t) = catalog.get(*topic_id) {
                *by_account.entry(t.tenant.clone()).or_default() += tp.size_bytes();
            }
        }
    }
}

/// Group names and topic names inside the coordinator carry their tenant: `tenant/name`.
fn qualify(tenant: &str, name: &str) -> String {
    format!("{tenant}/{name}")
}

fn unqualify(s: &str) -> String {
    s.split_once('/').map_or(s, |(_, n)| n).to_string()
}

fn unexpected<T>(r: ShardResponse) -> StreamResult<T> {
    Err(StreamError::Internal(format!("unexpected response {r:?}")))
}

impl Shard {
    fn topic_partitions_of(&self) -> Rc<coordinator::PartitionsOf> {
        let weak = self.weak();
        Rc::new(move |qualified: &str| {
            let s = weak.upgrade()?;
            let (tenant, name) = qualified.split_once('/')?;
            // `queue:<name>`: a queue's partitions, read as streams (`queue_view`).
            if let Some(queue) = name.strip_prefix(QUEUE_TOPIC_PREFIX) {
                return s.queue(tenant, queue).ok().map(|q| q.partitions);
            }
            let t = s.streams.catalog.borrow().lookup(tenant, name).ok()?;
            Some(t.partitions())
        })
    }

    /// On shard 0 at start: opens the group coordinator (its log replayed).
    pub(crate) async fn streams_start(&self) -> Result<(), ServiceError> {
        if self.id != 0 {
            return Ok(());
        }
        let c = coordinator::Coordinator::open(
            self.fs().clone(),
            self.config.data_dir.join("groups"),
            self.topic_partitions_of(),
        )
        .await
        .map_err(|e| ServiceError::Internal(format!("groups: {e}")))?;
        *self.streams.coordinator.borrow_mut() = Some(c);
        self.txn_start()
            .await
            .map_err(|e| ServiceError::Internal(format!("transactions: {e}")))?;
        Ok(())
    }

    fn topic_log_config(&self, t: &TopicMeta) -> sluice_storage::LogConfig {
        let mut c = self.config.log.clone();
        c.read_cache_bytes_max = c.read_cache_bytes_max.max(TOPIC_READ_CACHE_BYTES);
        c.retention_ms = t.config.retention_ms;
        c.retention_bytes = t.config.retention_bytes;
        if let Some(s) = t.config.segment_bytes {
            c.segment_bytes_max = s;
            c.batch_bytes_max = c.batch_bytes_max.min(s as usize);
            c.prealloc_chunk_bytes = c.prealloc_chunk_bytes.min(s);
        }
        c
    }

    fn topic_partition_dir(&self, topic_id: u64, p: u32) -> std::path::PathBuf {
        self.config
            .data_dir
            .join("topics")
            .join(format!("{topic_id:016}"))
            .join(format!("p{p:05}"))
    }

    /// Applies metadata records to this shard's topic catalog and opens or closes its topic
    /// partitions.
    pub(crate) async fn streams_apply_meta(
        &self,
        records: &[MetaRecord],
    ) -> Result<(), ServiceError> {
        for r in records {
            self.streams.catalog.borrow_mut().apply(r);
        }
        let topics: Vec<Arc<TopicMeta>> = self.streams.catalog.borrow().all().cloned().collect();
        // Retention may have changed (AlterConfigs): open partitions take the catalog's.
        for t in &topics {
            let limits = partition::RetentionLimits {
                retention_ms: t.config.retention_ms,
                retention_bytes: t.config.retention_bytes,
            };
            for p in 0..t.partitions() {
                if let Some(tp) = self.streams.partitions.borrow().get(&(t.id, p)) {
                    tp.set_retention(limits);
                }
            }
        }
        for t in &topics {
            for p in 0..t.partitions() {
                if self.owner(t.id, p) != self.id
                    || self.streams.partitions.borrow().contains_key(&(t.id, p))
                {
                    continue;
                }
                let tp = partition::TopicPartition::open(
                    self.fs().clone(),
                    self.topic_partition_dir(t.id, p),
                    t.id,
                    p,
                    self.topic_log_config(t),
                )
                .await
                .map_err(|e| {
                    ServiceError::Internal(format!("topic {} partition {p}: {e}", t.name))
                })?;
                self.streams.partitions.borrow_mut().insert((t.id, p), tp);
            }
        }
        let gone: Vec<(u64, u32)> = self
            .streams
            .partitions
            .borrow()
            .keys()
            .filter(|(id, _)| self.streams.catalog.borrow().get(*id).is_none())
            .copied()
            .collect();
        for key in gone {
            let tp = self.streams.partitions.borrow_mut().remove(&key);
            if let Some(tp) = tp {
                let _ = tp.close().await;
                if let Err(e) = std::fs::remove_dir_all(&tp.dir) {
                    tracing::warn!(error = %e, dir = %tp.dir.display(), "removing a deleted topic's partition");
                }
            }
        }
        Ok(())
    }

    pub(crate) async fn streams_shutdown(&self) {
        let parts: Vec<_> = self
            .streams
            .partitions
            .borrow_mut()
            .drain()
            .map(|(_, p)| p)
            .collect();
        for p in parts {
            let _ = p.close().await;
        }
        self.txn_shutdown().await;
        let c = self.streams.coordinator.borrow_mut().take();
        if let Some(c) = c {
            c.close().await;
        }
    }

    fn local_partition(
        &self,
        topic_id: u64,
        p: u32,
    ) -> StreamResult<Rc<partition::TopicPartition>> {
        self.streams
            .partitions
            .borrow()
            .get(&(topic_id, p))
            .cloned()
            .ok_or_else(|| {
                if self.is_ready() {
                    StreamError::UnknownTopic(format!("topic id {topic_id}"))
                } else {
                    StreamError::Unavailable("shard is starting".into())
                }
            })
    }

    fn coordinator(&self) -> StreamResult<Rc<coordinator::Coordinator>> {
        self.streams
            .coordinator
            .borrow()
            .clone()
            .ok_or(StreamError::Unavailable("no group coordinator here".into()))
    }

    /// Serves a stream request on this shard (the mesh's `ShardRequest::Stream`).
    pub(crate) async fn stream_handle(&self, op: StreamOp) -> StreamResult<StreamReply> {
        match op {
            StreamOp::CreateTopic {
                tenant,
                name,
                config,
            } => {
                let _serial = self.meta_serial().await;
                let planned = self.streams.catalog.borrow().plan_create(
                    &tenant,
                    &name,
                    config,
                    runtime::now_ms(),
                )?;
                let Some(record) = planned else {
                    let id = self.streams.catalog.borrow().lookup(&tenant, &name)?.id;
                    return Ok(StreamReply::TopicId(id));
                };
                let MetaRecord::TopicCreated { id, .. } = &record else {
                    unreachable!("plan_create makes TopicCreated records")
                };
                let id = *id;
                self.persist_meta(record).await?;
                Ok(StreamReply::TopicId(id))
            }
            StreamOp::DeleteTopic { id } => {
                let _serial = self.meta_serial().await;
                if self.streams.catalog.borrow().get(id).is_none() {
                    return Err(StreamError::UnknownTopic(format!("topic id {id}")));
                }
                self.persist_meta(MetaRecord::TopicDeleted {
                    v: META_FORMAT_VERSION,
                    id,
                    at_ms: runtime::now_ms(),
                })
                .await?;
                Ok(StreamReply::TopicId(id))
            }
            StreamOp::Produce {
                topic_id,
                partition,
                batch,
                producer,
            } => {
                let tp = self.local_partition(topic_id, partition)?;
                Ok(StreamReply::Produced(match producer {
                    Some(p) => tp.produce_idempotent(batch, p).await?,
                    None => tp.produce(batch).await?,
                }))
            }
            StreamOp::Fetch {
                topic_id,
                partition,
                offset,
                max_bytes,
                max_records,
                deadline_ms,
            } => Ok(StreamReply::Fetched(
                self.local_partition(topic_id, partition)?
                    .fetch(offset, max_bytes, max_records, deadline_ms)
                    .await?,
            )),
            StreamOp::ListOffset {
                topic_id,
                partition,
                spec,
            } => {
                let tp = self.local_partition(topic_id, partition)?;
                Ok(StreamReply::Offset(match spec {
                    OffsetSpec::Earliest => tp.offsets().0,
                    OffsetSpec::Latest => tp.offsets().1,
                    OffsetSpec::Timestamp(ts) => tp.offset_for_timestamp(ts).await?,
                }))
            }
            StreamOp::Join {
                group,
                member_id,
                topics,
                session_timeout_ms,
            } => Ok(StreamReply::Assignment(
                self.coordinator()?
                    .join(
                        &group,
                        member_id.as_deref(),
                        topics,
                        session_timeout_ms,
                        &*self.topic_partitions_of(),
                    )
                    .await?,
            )),
            StreamOp::Heartbeat { group, member_id } => Ok(StreamReply::Assignment(
                self.coordinator()?.heartbeat(&group, &member_id)?,
            )),
            StreamOp::Leave { group, member_id } => {
                self.coordinator()?
                    .leave(&group, &member_id, &*self.topic_partitions_of())?;
                Ok(StreamReply::Done)
            }
            StreamOp::Commit {
                group,
                member_id,
                generation,
                offsets,
            } => {
                self.coordinator()?
                    .commit(&group, &member_id, generation, &offsets)
                    .await?;
                Ok(StreamReply::Done)
            }
            StreamOp::Committed { group } => Ok(StreamReply::Committed(
                self.coordinator()?.committed(&group),
            )),
            StreamOp::FetchQueue {
                queue_id,
                partition,
                offset,
                max_bytes,
                max_records,
                deadline_ms,
            } => {
                let actor = self.queue_partition(queue_id, partition).ok_or_else(|| {
                    StreamError::Unavailable("queue partition not open here".into())
                })?;
                Ok(StreamReply::QueueFetched(
                    queue_view::fetch(&actor, offset, max_bytes, max_records, deadline_ms).await?,
                ))
            }
            StreamOp::ListQueueOffset {
                queue_id,
                partition,
                spec,
            } => {
                let actor = self.queue_partition(queue_id, partition).ok_or_else(|| {
                    StreamError::Unavailable("queue partition not open here".into())
                })?;
                Ok(StreamReply::Offset(
                    queue_view::list_offset(&actor, spec).await?,
                ))
            }
            StreamOp::Describe { group } => {
                Ok(StreamReply::Described(self.coordinator()?.describe(&group)))
            }
            StreamOp::ListGroups => Ok(StreamReply::Groups(self.coordinator()?.list())),
            StreamOp::Admin(op) => Ok(StreamReply::Admin(self.admin_handle(op).await?)),
            StreamOp::Share(op) => Ok(StreamReply::Share(self.share_handle(op)?)),
            StreamOp::Txn(op) => self.txn_handle(op).await,
            StreamOp::KafkaGroup(op) => {
                let c = self.coordinator()?;
                Ok(StreamReply::KafkaGroup(match op {
                    KafkaGroupOp::Join { group, request } => {
                        KafkaGroupReply::Joined(c.kafka_join(&group, request).await)
                    }
                    KafkaGroupOp::Sync {
                        group,
                        member,
                        generation,
                        assignments,
                    } => KafkaGroupReply::Synced(
                        c.kafka_sync(&group, &member, generation, assignments).await,
                    ),
                    KafkaGroupOp::Heartbeat {
                        group,
                        member,
                        generation,
                    } => KafkaGroupReply::Done(c.kafka_heartbeat(&group, &member, generation)),
                    KafkaGroupOp::Leave { group, member } => {
                        KafkaGroupReply::Done(c.kafka_leave(&group, &member))
                    }
                    KafkaGroupOp::Commit {
                        group,
                        member,
                        generation,
                        offsets,
                    } => KafkaGroupReply::Done(
                        c.kafka_commit(&group, &member, generation, &offsets)
                            .await?,
                    ),
                }))
            }
        }
    }

    async fn stream_request(&self, to: usize, op: StreamOp) -> StreamResult<StreamReply> {
        match self.request(to, ShardRequest::Stream(op)).await {
            ShardResponse::Stream(r) => r,
            ShardResponse::Reply(Err(e)) => Err(e.into()),
            other => unexpected(other),
        }
    }

    // ------------------------------------------------------------------ the stream service API

    fn check_stream_ready(&self) -> StreamResult<()> {
        if self.is_ready() {
            Ok(())
        } else {
            Err(StreamError::Unavailable("broker is starting".into()))
        }
    }

    pub fn topic(&self, tenant: &str, name: &str) -> StreamResult<Arc<TopicMeta>> {
        self.check_stream_ready()?;
        self.streams.catalog.borrow().lookup(tenant, name)
    }

    pub fn list_topics(&self, tenant: &str) -> Vec<Arc<TopicMeta>> {
        self.streams.catalog.borrow().list(tenant)
    }

    /// Creates a topic (idempotent for an identical configuration).
    pub async fn create_topic(
        &self,
        tenant: &str,
        name: &str,
        config: TopicConfig,
    ) -> StreamResult<Arc<TopicMeta>> {
        self.check_stream_ready()?;
        let op = StreamOp::CreateTopic {
            tenant: tenant.to_string(),
            name: name.to_string(),
            config,
        };
        match self.stream_request(0, op).await? {
            StreamReply::TopicId(id) => self
                .streams
                .catalog
                .borrow()
                .get(id)
                .ok_or(StreamError::Internal("created topic missing".into())),
            other => Err(StreamError::Internal(format!("unexpected {other:?}"))),
        }
    }

    /// Deletes a topic and its data.
    pub async fn delete_topic(&self, t: &TopicMeta) -> StreamResult<()> {
        self.check_stream_ready()?;
        self.stream_request(0, StreamOp::DeleteTopic { id: t.id })
            .await
            .map(|_| ())
    }

    /// The partition of a keyed record: `xxh3(key) % partitions`.
    pub fn partition_for_key(t: &TopicMeta, key: &[u8]) -> u32 {
        (xxhash_rust::xxh3::xxh3_64(key) % u64::from(t.partitions())) as u32
    }

    fn check_partition(t: &TopicMeta, p: u32) -> StreamResult<()> {
        if p < t.partitions() {
            Ok(())
        } else {
            Err(StreamError::UnknownPartition {
                partition: p,
                partitions: t.partitions(),
            })
        }
    }

    /// Appends one producer batch (the storage batch format, as the producer encoded it) to a
    /// partition: the one given, else the first record's key's, else round robin. Resolves
    /// after the batch's fdatasync (fsync before ack).
    pub async fn produce(
        &self,
        t: &TopicMeta,
        partition: Option<u32>,
        batch: Vec<u8>,
    ) -> StreamResult<Produced> {
        // A Kafka-compressed batch is checked (CRC, bounded decompression, records) only by
        // the Kafka front end, which calls `produce_as`: no other producer may store one.
        if sluice_storage::BatchHeader::parse(&batch).is_ok_and(|h| h.kafka_codec() != 0) {
            return Err(StreamError::InvalidBatch(
                "Kafka-compressed batches are taken from the Kafka protocol only".into(),
            ));
        }
        self.produce_as(t, partition, batch, None).await
    }

    /// [`Shard::produce`], for an idempotent producer when `producer` is set: a retried batch
    /// is stored once (`partition::TopicPartition::produce_idempotent`).
    pub async fn produce_as(
        &self,
        t: &TopicMeta,
        partition: Option<u32>,
        batch: Vec<u8>,
        producer: Option<ProducerBatch>,
    ) -> StreamResult<Produced> {
        self.check_stream_ready()?;
        self.disk.check(runtime::now_ms())?;
        self.check_stored_bytes(&t.tenant).await?;
        let p = match partition {
            Some(p) => {
                Self::check_partition(t, p)?;
                p
            }
            None => {
                let v = BatchView::parse(&batch)
                    .map_err(|e| StreamError::InvalidBatch(e.to_string()))?;
                let first = v
                    .records()
                    .next()
                    .ok_or(StreamError::InvalidBatch("empty batch".into()))?
                    .map_err(|e| StreamError::InvalidBatch(e.to_string()))?;
                match first.key {
                    Some(k) => Self::partition_for_key(t, k),
                    None => {
                        let n = self.streams.round_robin.get();
                        self.streams.round_robin.set(n.wrapping_add(1));
                        (n % u64::from(t.partitions())) as u32
                    }
                }
            }
        };
        let op = StreamOp::Produce {
            topic_id: t.id,
            partition: p,
            batch,
            producer,
        };
        match self.stream_request(self.owner(t.id, p), op).await? {
            StreamReply::Produced(i) => Ok(Produced {
                partition: p,
                base_offset: i.base_offset,
                last_offset: i.last_offset,
            }),
            other => Err(StreamError::Internal(format!("unexpected {other:?}"))),
        }
    }

    /// Groups records by partition (key hash; keyless ones go together to one partition) and
    /// appends one batch per partition, concurrently; results in partition order.
    pub async fn produce_records(
        &self,
        t: &TopicMeta,
        records: Vec<Record>,
    ) -> StreamResult<Vec<Produced>> {
        self.check_stream_ready()?;
        if records.is_empty() {
            return Err(StreamError::Invalid("no records".into()));
        }
        let keyless = {
            let n = self.streams.round_robin.get();
            self.streams.round_robin.set(n.wrapping_add(1));
            (n % u64::from(t.partitions())) as u32
        };
        let mut by_p: BTreeMap<u32, Vec<Record>> = BTreeMap::new();
        for r in records {
            let p = r
                .key
                .as_deref()
                .map_or(keyless, |k| Self::partition_for_key(t, k));
            by_p.entry(p).or_default().push(r);
        }
        let futs = by_p.into_iter().map(|(p, recs)| async move {
            let bytes =
                sluice_storage::batch::encode(&recs).expect("a partition's batch has records");
            self.produce(t, Some(p), bytes).await
        });
        futures::future::join_all(futs).await.into_iter().collect()
    }

    /// Reads from `partition` at `req.offset`: whole batches up to the limits, waiting up to
    /// `req.wait_ms` for data if there is none yet.
    pub async fn fetch(
        &self,
        t: &TopicMeta,
        partition: u32,
        req: FetchRequest,
    ) -> StreamResult<FetchReply> {
        self.check_stream_ready()?;
        Self::check_partition(t, partition)?;
        let op = StreamOp::Fetch {
            topic_id: t.id,
            partition,
            offset: req.offset,
            max_bytes: req.max_bytes.clamp(1, FETCH_BYTES_MAX),
            max_records: req.max_records.max(1),
            deadline_ms: runtime::now_ms() + req.wait_ms.min(FETCH_WAIT_MS_MAX),
        };
        match self.stream_request(self.owner(t.id, partition), op).await? {
            StreamReply::Fetched(f) => Ok(f),
            other => Err(StreamError::Internal(format!("unexpected {other:?}"))),
        }
    }

    /// The earliest, the latest (next) offset, or the first offset at or after a timestamp.
    pub async fn list_offset(
        &self,
        t: &TopicMeta,
        partition: u32,
        spec: OffsetSpec,
    ) -> StreamResult<u64> {
        self.check_stream_ready()?;
        Self::check_partition(t, partition)?;
        let op = StreamOp::ListOffset {
            topic_id: t.id,
            partition,
            spec,
        };
        match self.stream_request(self.owner(t.id, partition), op).await? {
            StreamReply::Offset(o) => Ok(o),
            other => Err(StreamError::Internal(format!("unexpected {other:?}"))),
        }
    }

    fn group_key(tenant: &str, group: &str) -> StreamResult<String> {
        if group.is_empty() || group.len() > group::GROUP_NAME_BYTES_MAX - tenant.len() - 1 {
            return Err(StreamError::Invalid("group name length".into()));
        }
        Ok(qualify(tenant, group))
    }

    fn unqualify_assignment(mut a: Assignment) -> Assignment {
        for (t, _) in &mut a.partitions {
            *t = unqualify(t);
        }
        a
    }

    async fn group_request(&self, op: StreamOp) -> StreamResult<StreamReply> {
        self.check_stream_ready()?;
        self.stream_request(0, op).await
    }

    /// Joins a consumer group (a new member if `member_id` is `None` or no longer known).
    pub async fn join_group(
        &self,
        tenant: &str,
        group: &str,
        member_id: Option<&str>,
        topics: &[String],
        session_timeout_ms: u64,
    ) -> StreamResult<Assignment> {
        let op = StreamOp::Join {
            group: Self::group_key(tenant, group)?,
            member_id: member_id.map(str::to_string),
            topics: topics.iter().map(|t| qualify(tenant, t)).collect(),
            session_timeout_ms,
        };
        match self.group_request(op).await? {
            StreamReply::Assignment(a) => Ok(Self::unqualify_assignment(a)),
            other => Err(StreamError::Internal(format!("unexpected {other:?}"))),
        }
    }

    /// Keeps a member alive; returns the current generation and its partitions in it.
    pub async fn heartbeat_group(
        &self,
        tenant: &str,
        group: &str,
        member_id: &str,
    ) -> StreamResult<Assignment> {
        let op = StreamOp::Heartbeat {
            group: Self::group_key(tenant, group)?,
            member_id: member_id.to_string(),
        };
        match self.group_request(op).await? {
            StreamReply::Assignment(a) => Ok(Self::unqualify_assignment(a)),
            other => Err(StreamError::Internal(format!("unexpected {other:?}"))),
        }
    }

    pub async fn leave_group(
        &self,
        tenant: &str,
        group: &str,
        member_id: &str,
    ) -> StreamResult<()> {
        let op = StreamOp::Leave {
            group: Self::group_key(tenant, group)?,
            member_id: member_id.to_string(),
        };
        self.group_request(op).await.map(|_| ())
    }

    /// Commits offsets (each the next offset to read) for partitions assigned to the member
    /// in `generation`; durable before it returns.
    pub async fn commit_offsets(
        &self,
        tenant: &str,
        group: &str,
        member_id: &str,
        generation: u64,
        offsets: &[(String, u32, u64)],
    ) -> StreamResult<()> {
        let op = StreamOp::Commit {
            group: Self::group_key(tenant, group)?,
            member_id: member_id.to_string(),
            generation,
            offsets: offsets
                .iter()
                .map(|(t, p, o)| ((qualify(tenant, t), *p), *o))
                .collect(),
        };
        self.group_request(op).await.map(|_| ())
    }

    /// The group's committed offsets, by (topic, partition).
    pub async fn committed_offsets(
        &self,
        tenant: &str,
        group: &str,
    ) -> StreamResult<BTreeMap<(String, u32), u64>> {
        let op = StreamOp::Committed {
            group: Self::group_key(tenant, group)?,
        };
        match self.group_request(op).await? {
            StreamReply::Committed(m) => Ok(m
                .into_iter()
                .map(|((t, p), o)| ((unqualify(&t), p), o))
                .collect()),
            other => Err(StreamError::Internal(format!("unexpected {other:?}"))),
        }
    }

    /// The group's generation and members with their partitions (`None`: no such group).
    pub async fn describe_group(
        &self,
        tenant: &str,
        group: &str,
    ) -> StreamResult<Option<GroupDescription>> {
        let op = StreamOp::Describe {
            group: Self::group_key(tenant, group)?,
        };
        match self.group_request(op).await? {
            StreamReply::Described(d) => Ok(d.map(|mut d| {
                for (_, parts) in &mut d.members {
                    for (t, _) in parts.iter_mut() {
                        *t = unqualify(t);
                    }
                }
                d
            })),
            other => Err(StreamError::Internal(format!("unexpected {other:?}"))),
        }
    }

    /// A Kafka group request (group names unqualified; topics in commits too), on shard 0.
    pub async fn kafka_group(
        &self,
        tenant: &str,
        op: KafkaGroupOp,
    ) -> StreamResult<KafkaGroupReply> {
        let q = |g: &str| Self::group_key(tenant, g);
        let op = match op {
            KafkaGroupOp::Join { group, request } => KafkaGroupOp::Join {
                group: q(&group)?,
                request,
            },
            KafkaGroupOp::Sync {
                group,
                member,
                generation,
                assignments,
            } => KafkaGroupOp::Sync {
                group: q(&group)?,
                member,
                generation,
                assignments,
            },
            KafkaGroupOp::Heartbeat {
                group,
                member,
                generation,
            } => KafkaGroupOp::Heartbeat {
                group: q(&group)?,
                member,
                generation,
            },
            KafkaGroupOp::Leave { group, member } => KafkaGroupOp::Leave {
                group: q(&group)?,
                member,
            },
            KafkaGroupOp::Commit {
                group,
                member,
                generation,
                offsets,
            } => KafkaGroupOp::Commit {
                group: q(&group)?,
                member,
                generation,
                offsets: offsets
                    .into_iter()
                    .map(|((t, p), o)| ((qualify(tenant, &t), p), o))
                    .collect(),
            },
        };
        match self.group_request(StreamOp::KafkaGroup(op)).await? {
            StreamReply::KafkaGroup(r) => Ok(r),
            other => Err(StreamError::Internal(format!("unexpected {other:?}"))),
        }
    }

    /// Every group of every tenant as (tenant, group), in order.
    pub async fn list_all_groups(&self) -> StreamResult<Vec<(String, String)>> {
        match self.group_request(StreamOp::ListGroups).await? {
            StreamReply::Groups(names) => Ok(names
                .into_iter()
                .filter_map(|q| {
                    q.split_once('/')
                        .map(|(t, g)| (t.to_string(), g.to_string()))
                })
                .collect()),
            other => Err(StreamError::Internal(format!("unexpected {other:?}"))),
        }
    }

    /// Every group's lag per partition for `/metrics` (at most
    /// [`GROUP_LAG_SERIES_MAX`](crate::metrics::GROUP_LAG_SERIES_MAX) pairs); `true` if cut
    /// short. A group whose lag cannot be read now is left out of this scrape.
    pub async fn metrics_group_lags(&self) -> (Vec<crate::metrics::GroupLagFigure>, bool) {
        let max = crate::metrics::GROUP_LAG_SERIES_MAX;
        let Ok(groups) = self.list_all_groups().await else {
            return (Vec::new(), true);
        };
        let mut out = Vec::new();
        for (tenant, group) in groups {
            let Ok(lags) = self.group_lag(&tenant, &group).await else {
                continue;
            };
            for l in lags {
                if out.len() >= max {
                    return (out, true);
                }
                out.push(crate::metrics::GroupLagFigure {
                    tenant: tenant.clone(),
                    group: group.clone(),
                    topic: l.topic,
                    partition: l.partition,
                    lag: l.lag,
                });
            }
        }
        (out, false)
    }

    /// The tenant's consumer groups (names), in order.
    pub async fn list_groups(&self, tenant: &str) -> StreamResult<Vec<String>> {
        Ok(self
            .list_all_groups()
            .await?
            .into_iter()
            .filter(|(t, _)| t == tenant)
            .map(|(_, g)| g)
            .collect())
    }

    /// Per partition the group has committed on: latest offset minus committed.
    pub async fn group_lag(&self, tenant: &str, group: &str) -> StreamResult<Vec<PartitionLag>> {
        let committed = self.committed_offsets(tenant, group).await?;
        let mut out = Vec::with_capacity(committed.len());
        for ((topic, partition), c) in committed {
            let latest = if let Some(queue) = topic.strip_prefix(QUEUE_TOPIC_PREFIX) {
                let Ok(q) = self.queue(tenant, queue) else {
                    continue; // deleted since
                };
                if partition >= q.partitions {
                    continue;
                }
                let req = FetchRequest {
                    offset: 0,
                    max_bytes: 1,
                    max_records: 1,
                    wait_ms: 0,
                };
                match self.fetch_queue_stream(&q, partition, req).await {
                    Ok(f) => f.end_offset,
                    Err(StreamError::OffsetOutOfRange { end, .. }) => end,
                    Err(e) => return Err(e),
                }
            } else {
                let Ok(t) = self.topic(tenant, &topic) else {
                    continue; // deleted since
                };
                if partition >= t.partitions() {
                    continue;
                }
                self.list_offset(&t, partition, OffsetSpec::Latest).await?
            };
            out.push(PartitionLag {
                topic,
                partition,
                committed: c,
                latest,
                lag: latest.saturating_sub(c),
            });
        }
        Ok(out)
    }

    /// Reads a queue partition's messages as a stream from `req.offset` (read-only: no lease,
    /// receive count or visibility changes). Continue at the reply's `next_offset`.
    pub async fn fetch_queue_stream(
        &self,
        q: &crate::metadata::QueueMeta,
        partition: u32,
        req: FetchRequest,
    ) -> StreamResult<queue_view::QueueFetch> {
        self.check_stream_ready()?;
        if partition >= q.partitions {
            return Err(StreamError::UnknownPartition {
                partition,
                partitions: q.partitions,
            });
        }
        let op = StreamOp::FetchQueue {
            queue_id: q.id,
            partition,
            offset: req.offset,
            max_bytes: req.max_bytes.clamp(1, FETCH_BYTES_MAX),
            max_records: req.max_records.max(1),
            deadline_ms: runtime::now_ms() + req.wait_ms.min(FETCH_WAIT_MS_MAX),
        };
        match self.stream_request(self.owner(q.id, partition), op).await? {
            StreamReply::QueueFetched(f) => Ok(f),
            other => Err(StreamError::Internal(format!("unexpected {other:?}"))),
        }
    }

    /// The earliest, the latest (next) offset of a queue partition read as a stream, or the
    /// first offset at or after a timestamp.
    pub async fn list_queue_offset(
        &self,
        q: &crate::metadata::QueueMeta,
        partition: u32,
        spec: OffsetSpec,
    ) -> StreamResult<u64> {
        self.check_stream_ready()?;
        if partition >= q.partitions {
            return Err(StreamError::UnknownPartition {
                partition,
                partitions: q.partitions,
            });
        }
        let op = StreamOp::ListQueueOffset {
            queue_id: q.id,
            partition,
            spec,
        };
        match self.stream_request(self.owner(q.id, partition), op).await? {
            StreamReply::Offset(o) => Ok(o),
            other => Err(StreamError::Internal(format!("unexpected {other:?}"))),
        }
    }

    #[doc(hidden)]
    /// Segments of a local topic partition (tests of retention).
    pub fn topic_segment_count(&self, t: &TopicMeta, partition: u32) -> Option<usize> {
        self.streams
            .partitions
            .borrow()
            .get(&(t.id, partition))
            .map(|p| p.segment_count())
    }
}
