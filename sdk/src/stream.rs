//! Streams: topics, a keyed batching producer and a group consumer.
//!
//! Records travel in the record-batch format of `sluice_wire::batch` (the bytes the log stores): the producer
//! encodes and checksums each batch once; the broker verifies and stores those bytes; fetch
//! returns the stored batches, which [`GroupConsumer`] verifies again before handing records out.

use bytes::Bytes;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use sluice_wire::batch::{self, BatchView, Record};
use sluice_wire::{self as wire, ErrorCode, Request, Response};

use crate::{unexpected, Client, Error, Result};

/// One consumed record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumedRecord {
    pub topic: String,
    pub partition: u32,
    pub offset: u64,
    pub timestamp_ms: i64,
    /// The key and value are views of the fetched frame (`Bytes`: no copy per record; a
    /// record kept alive keeps its fetch's buffer alive — copy it out with `to_vec` to keep a
    /// few records of a large fetch for long).
    pub key: Option<Bytes>,
    pub value: Bytes,
    /// Record headers (a queue read as a stream carries each message's `message-id`).
    pub headers: Vec<(Vec<u8>, Vec<u8>)>,
}

/// What one fetch returned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fetched {
    pub records: Vec<ConsumedRecord>,
    /// Where the next fetch of this partition starts: past the last record, or further when
    /// the broker skipped what is not a record (a queue's own state changes).
    pub next_offset: u64,
    /// The partition's end (next offset to be written) when the broker answered.
    pub end_offset: u64,
}

/// Where [`Client::list_offset`] looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seek {
    Earliest,
    Latest,
    Timestamp(i64),
}

/// The partition of a keyed record: `xxh3(key) % partitions`, as the broker computes it.
pub fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    (xxhash_rust::xxh3::xxh3_64(key) % u64::from(partitions.max(1))) as u32
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Verified records of concatenated batches at or after `from`.
pub fn decode_batches(
    topic: &str,
    partition: u32,
    bytes: &[u8],
    from: u64,
) -> Result<Vec<ConsumedRecord>> {
    decode_fetched(topic, partition, &Bytes::copy_from_slice(bytes), from)
        .map(|(records, _)| records)
}

/// Verified records of concatenated batches at or after `from`, and the offset after the last
/// batch (at least `from`). Control batches (markers the broker adds) give no records but move
/// that offset on.
fn decode_fetched(
    topic: &str,
    partition: u32,
    all: &Bytes,
    from: u64,
) -> Result<(Vec<ConsumedRecord>, u64)> {
    let mut out = Vec::new();
    let mut next = from;
    let mut bytes: &[u8] = all;
    while !bytes.is_empty() {
        let v =
            BatchView::parse(bytes).map_err(|e| Error::Protocol(format!("fetched batch: {e}")))?;
        bytes = &bytes[v.bytes.len()..];
        next = next.max(v.header.next_offset());
        if v.header.is_control() {
            continue;
        }
        // Room for the batch's records at once (a 1,000-record fetch grew the Vec ten times);
        // the header's count is a hint, bounded by the batch's bytes (a record takes several).
        let fresh = v
            .header
            .next_offset()
            .saturating_sub(from.max(v.header.base_offset));
        out.reserve(usize::try_from(fresh).unwrap_or(0).min(v.bytes.len() / 8));
        for r in v.records() {
            let r = r.map_err(|e| Error::Protocol(format!("fetched record: {e}")))?;
            if r.offset >= from {
                out.push(ConsumedRecord {
                    topic: topic.to_string(),
                    partition,
                    offset: r.offset,
                    timestamp_ms: r.timestamp_ms,
                    key: r.key.map(|k| all.slice_ref(k)),
                    value: all.slice_ref(r.value),
                    headers: r.headers().map(|(k, v)| (k.to_vec(), v.to_vec())).collect(),
                });
            }
        }
    }
    Ok((out, next))
}

impl Client {
    pub async fn create_topic(
        &self,
        r: wire::CreateTopicRequest,
    ) -> Result<wire::CreateTopicResult> {
        match self.call(Request::CreateTopic(r)).await? {
            Response::CreateTopic(r) => Ok(r),
            other => unexpected(other),
        }
    }

    pub async fn delete_topic(&self, name: &str) -> Result<()> {
        let r = wire::DeleteTopicRequest { name: name.into() };
        match self.call(Request::DeleteTopic(r)).await? {
            Response::DeleteTopic(_) => Ok(()),
            other => unexpected(other),
        }
    }

    pub async fn describe_topic(&self, name: &str) -> Result<wire::DescribeTopicResult> {
        let r = wire::DescribeTopicRequest { name: name.into() };
        match self.call(Request::DescribeTopic(r)).await? {
            Response::DescribeTopic(r) => Ok(r),
            other => unexpected(other),
        }
    }

    /// Appends one encoded batch (see `sluice_wire::batch::encode`); answered after fsync.
    pub async fn produce_batch(
        &self,
        topic: &str,
        partition: Option<u32>,
        batch: Vec<u8>,
    ) -> Result<wire::ProduceResult> {
        let r = wire::ProduceRequest {
            topic: topic.into(),
            partition,
            batch,
        };
        let via = match partition {
            Some(p) => self.owner_of(topic, p).await,
            None => self.clone(),
        };
        match via.call(Request::Produce(r)).await {
            Ok(Response::Produce(r)) => Ok(r),
            Ok(other) => unexpected(other),
            Err(e) => {
                if e.code() == Some(ErrorCode::UnknownTopic) {
                    // A topic deleted and made anew has new placements.
                    self.forget_routes().await;
                }
                Err(e)
            }
        }
    }

    /// Records of `partition` from `offset` (bounded by `max_bytes`/`max_records`), waiting up
    /// to `wait` for data when there is none. Also returns the partition's end offset.
    /// `topic` may name a queue as `queue:<name>`: its messages, read-only (see
    /// [`Client::fetch_records`] for where to continue).
    pub async fn fetch(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max_bytes: u32,
        max_records: u32,
        wait: Duration,
    ) -> Result<(Vec<ConsumedRecord>, u64)> {
        let f = self
            .fetch_records(topic, partition, offset, max_bytes, max_records, wait)
            .await?;
        Ok((f.records, f.end_offset))
    }

    /// Like [`Client::fetch`], with the offset to fetch next. A queue read as a stream
    /// (`queue:<name>`) has its messages at sparse offsets: continue at `next_offset`, not at
    /// the last record's offset + 1, or the broker re-reads the queue's state changes.
    ///
    /// ```no_run
    /// # async fn demo(client: sluice_sdk::Client) -> Result<(), sluice_sdk::Error> {
    /// use std::time::Duration;
    /// // Audit a queue's messages without taking leases or changing receive counts.
    /// let mut at = client.list_offset("queue:orders", 0, sluice_sdk::Seek::Earliest).await?;
    /// loop {
    ///     let f = client
    ///         .fetch_records("queue:orders", 0, at, 1 << 20, 500, Duration::from_secs(1))
    ///         .await?;
    ///     for r in &f.records {
    ///         println!("{} {}", r.offset, String::from_utf8_lossy(&r.value));
    ///     }
    ///     if f.records.is_empty() && f.next_offset >= f.end_offset {
    ///         break;
    ///     }
    ///     at = f.next_offset;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn fetch_records(
        &self,
        topic: &str,
        partition: u32,
        offset: u64,
        max_bytes: u32,
        max_records: u32,
        wait: Duration,
    ) -> Result<Fetched> {
        let r = wire::FetchRequest {
            topic: topic.into(),
            partition,
            offset,
            max_bytes,
            max_records,
            wait_ms: wait.as_millis().min(u128::from(u32::MAX)) as u32,
        };
        let via = self.owner_of(topic, partition).await;
        match via.call_reply(Request::Fetch(r)).await {
            Ok(crate::connection::Reply::Fetch(f)) => {
                let (records, next_offset) = decode_fetched(topic, partition, &f.batches, offset)?;
                Ok(Fetched {
                    records,
                    next_offset,
                    end_offset: f.end_offset,
                })
            }
            Ok(other) => unexpected(other.into_response()),
            Err(e) => {
                if matches!(
                    e.code(),
                    Some(ErrorCode::UnknownTopic | ErrorCode::QueueDoesNotExist)
                ) {
                    self.forget_routes().await;
                }
                Err(e)
            }
        }
    }

    pub async fn list_offset(&self, topic: &str, partition: u32, seek: Seek) -> Result<u64> {
        let (spec, timestamp_ms) = match seek {
            Seek::Earliest => (0, 0),
            Seek::Latest => (1, 0),
            Seek::Timestamp(t) => (2, t),
        };
        let r = wire::ListOffsetsRequest {
            topic: topic.into(),
            partition,
            spec,
            timestamp_ms,
        };
        match self.call(Request::ListOffsets(r)).await? {
            Response::ListOffsets(r) => Ok(r.offset),
            other => unexpected(other),
        }
    }

    pub async fn fetch_committed(&self, group: &str) -> Result<BTreeMap<(String, u32), u64>> {
        let r = wire::FetchCommittedRequest {
            group: group.into(),
        };
        match self.call(Request::FetchCommitted(r)).await? {
            Response::FetchCommitted(r) => Ok(r
                .offsets
                .into_iter()
                .map(|o| ((o.topic, o.partition), o.offset))
                .collect()),
            other => unexpected(other),
        }
    }

    /// Per partition the group committed on: (topic, partition, lag = latest - committed).
    pub async fn group_lag(&self, group: &str) -> Result<Vec<wire::PartitionLagEntry>> {
        let r = wire::GroupLagRequest {
            group: group.into(),
        };
        match self.call(Request::GroupLag(r)).await? {
            Response::GroupLag(r) => Ok(r.partitions),
            other => unexpected(other),
        }
    }

    /// The account's topics, in name order (for operators).
    pub async fn list_topics(&self) -> Result<Vec<wire::DescribeTopicResult>> {
        match self
            .call(Request::ListTopics(wire::ListTopicsRequest {}))
            .await?
        {
            Response::ListTopics(r) => Ok(r.topics),
            other => unexpected(other),
        }
    }

    /// The account's consumer groups, in name order (for operators).
    pub async fn list_groups(&self) -> Result<Vec<String>> {
        match self
            .call(Request::ListGroups(wire::ListGroupsRequest {}))
            .await?
        {
            Response::ListGroups(r) => Ok(r.groups),
            other => unexpected(other),
        }
    }

    /// A group's generation and members with their partitions; `found: false` when the group
    /// has neither members nor commits.
    pub async fn describe_group(&self, group: &str) -> Result<wire::DescribeGroupResult> {
        let r = wire::DescribeGroupRequest {
            group: group.into(),
        };
        match self.call(Request::DescribeGroup(r)).await? {
            Response::DescribeGroup(r) => Ok(r),
            other => unexpected(other),
        }
    }

    /// A keyed, batching producer for `topic`.
    /// A lingering, batching publisher for `topic` (see [`crate::TopicPublisher`]).
    pub async fn topic_publisher(
        &self,
        topic: &str,
        options: crate::TopicPublisherOptions,
    ) -> Result<crate::TopicPublisher> {
        let d = self.describe_topic(topic).await?;
        Ok(crate::TopicPublisher::start(
            self.clone(),
            topic.to_string(),
            d.partitions,
            options,
        ))
    }

    pub async fn topic_producer(&self, topic: &str) -> Result<TopicProducer> {
        let d = self.describe_topic(topic).await?;
        Ok(TopicProducer {
            client: self.clone(),
            topic: topic.to_string(),
            partitions: d.partitions,
            pending: BTreeMap::new(),
            pending_bytes: 0,
            next_keyless: 0,
            batch_bytes_max: TopicProducer::BATCH_BYTES_DEFAULT,
        })
    }
}

/// Buffers records per partition (keyed: `xxh3(key) % partitions`; keyless: round robin) and
/// sends each partition's records as one batch when the buffer fills or on [`flush`]. Within a
/// partition, records keep the order they were pushed in. Nothing is sent until the buffer
/// fills or you flush: for a producer that sends on its own after a linger time, with an
/// answer per record, use [`crate::TopicPublisher`].
///
/// [`flush`]: TopicProducer::flush
pub struct TopicProducer {
    client: Client,
    topic: String,
    partitions: u32,
    pending: BTreeMap<u32, Vec<Record>>,
    pending_bytes: usize,
    next_keyless: u32,
    batch_bytes_max: usize,
}

impl TopicProducer {
    /// A batch stays well inside a request frame.
    pub const BATCH_BYTES_DEFAULT: usize = 512 * 1024;

    pub fn partitions(&self) -> u32 {
        self.partitions
    }

    /// Buffers one record; sends what is buffered first if it would exceed the batch size.
    pub async fn send(&mut self, key: Option<&[u8]>, value: &[u8]) -> Result<()> {
        let len = value.len() + key.map_or(0, <[u8]>::len) + 32;
        if len > self.batch_bytes_max {
            return Err(Error::Service {
                code: ErrorCode::InvalidParameterValue,
                message: format!("a record is limited to {} bytes", self.batch_bytes_max),
            });
        }
        if self.pending_bytes + len > self.batch_bytes_max {
            self.flush().await?;
        }
        let p = match key {
            Some(k) => partition_for_key(k, self.partitions),
            None => {
                self.next_keyless = (self.next_keyless + 1) % self.partitions.max(1);
                self.next_keyless
            }
        };
        self.pending.entry(p).or_default().push(Record {
            timestamp_ms: now_ms(),
            key: key.map(<[u8]>::to_vec),
            value: value.to_vec(),
            headers: Vec::new(),
        });
        self.pending_bytes += len;
        Ok(())
    }

    /// Sends every buffered record (one batch per partition, concurrently) and waits for the
    /// broker's acknowledgements (after fsync). Returns (partition, base offset, last offset).
    pub async fn flush(&mut self) -> Result<Vec<(u32, u64, u64)>> {
        let pending = std::mem::take(&mut self.pending);
        self.pending_bytes = 0;
        let sends = pending.into_iter().map(|(p, recs)| {
            let client = self.client.clone();
            let topic = self.topic.clone();
            async move {
                let bytes = batch::encode(&recs).expect("a buffered partition has records");
                let r = client.produce_batch(&topic, Some(p), bytes).await?;
                Ok((r.partition, r.base_offset, r.last_offset))
            }
        });
        futures::future::join_all(sends).await.into_iter().collect()
    }
}

/// Options of a [`GroupConsumer`].
#[derive(Debug, Clone)]
pub struct GroupConsumerOptions {
    pub session_timeout: Duration,
    /// Per partition and fetch.
    pub max_records: u32,
    /// Per partition and fetch. With `prefetch`, a member holds at most two fetches' worth
    /// per partition: the records the last poll handed out and the next fetch in flight.
    pub max_bytes: u32,
    /// How long a poll waits when nothing is there.
    pub poll_wait: Duration,
    /// Keep each assigned partition's next fetch in flight while the application handles
    /// what the last poll returned (one fetch per partition; its records are handed out by a
    /// later poll, or dropped if the partition is revoked or sought first). Default true.
    pub prefetch: bool,
    /// [`GroupConsumer::run`] and [`GroupConsumer::commit_if_due`] commit the positions
    /// reached at most this often, in the background; a partition handed to another member,
    /// the end of `run` and [`GroupConsumer::close`] commit at once. Default 200 ms.
    pub commit_interval: Duration,
}

impl Default for GroupConsumerOptions {
    fn default() -> Self {
        GroupConsumerOptions {
            session_timeout: Duration::from_secs(10),
            max_records: 500,
            max_bytes: 1024 * 1024,
            poll_wait: Duration::from_millis(100),
            prefetch: true,
            commit_interval: Duration::from_millis(200),
        }
    }
}

/// A member heartbeats at least this often (and at least three times a session), so that a
/// rebalance hands partitions over within a fraction of a second: the broker gives a partition
/// to its new member only once the old one, told on its heartbeat, committed and released it.
pub const HEARTBEAT_INTERVAL_MAX: Duration = Duration::from_millis(250);

/// A poll waits this much longer than `poll_wait` for a fetch's answer before it returns
/// empty-handed (the fetch goes on; a later poll hands out its records).
const POLL_ANSWER_SLACK: Duration = Duration::from_millis(100);

type PartitionKey = (String, u32);

/// A fetch in flight for one partition, from the partition's position.
struct FetchInFlight {
    id: u64,
    task: tokio::task::JoinHandle<()>,
}

/// A finished fetch, as its task reports it.
struct FetchDone {
    key: PartitionKey,
    id: u64,
    from: u64,
    result: Result<Fetched>,
}

/// A member of a consumer group. [`poll`] heartbeats when due (learning of rebalances: a
/// partition it lost has its position committed at once, which hands it over; a partition it
/// gained starts from the group's committed offset), then hands out what its partitions'
/// fetches returned. With [`GroupConsumerOptions::prefetch`] each partition's next fetch is
/// in flight while the application handles the last poll's records. [`commit`] commits the
/// positions reached (manual); [`commit_if_due`] does it in the background at most every
/// `commit_interval`; [`run`] polls, hands each record to a handler and commits (when due,
/// and at its end) after the handler returned (at-least-once). [`seek`] moves a position.
///
/// A position is what the member handed out: a partition's prefetched records are not part
/// of it until a poll returns them, and are dropped if the partition is revoked or sought.
///
/// [`poll`]: GroupConsumer::poll
/// [`commit`]: GroupConsumer::commit
/// [`commit_if_due`]: GroupConsumer::commit_if_due
/// [`run`]: GroupConsumer::run
/// [`seek`]: GroupConsumer::seek
pub struct GroupConsumer {
    client: Client,
    group: String,
    topics: Vec<String>,
    options: GroupConsumerOptions,
    member_id: String,
    generation: u64,
    assignment: Vec<PartitionKey>,
    /// Per partition: the offset after what polls handed out (what a commit commits, and
    /// where the partition's fetch in flight starts).
    positions: HashMap<PartitionKey, u64>,
    last_heartbeat: Instant,
    /// At most one fetch per partition.
    fetches: HashMap<PartitionKey, FetchInFlight>,
    next_fetch_id: u64,
    fetched_tx: tokio::sync::mpsc::UnboundedSender<FetchDone>,
    fetched_rx: tokio::sync::mpsc::UnboundedReceiver<FetchDone>,
    /// A commit sent in the background (`commit_if_due`), not answered yet.
    committing: Option<tokio::task::JoinHandle<Result<()>>>,
    last_commit: Instant,
    /// The positions last sent in a commit (a commit with nothing new is not sent).
    committed: HashMap<PartitionKey, u64>,
}

impl GroupConsumer {
    pub async fn join(
        client: &Client,
        group: &str,
        topics: &[&str],
        options: GroupConsumerOptions,
    ) -> Result<GroupConsumer> {
        let (fetched_tx, fetched_rx) = tokio::sync::mpsc::unbounded_channel();
        let mut c = GroupConsumer {
            client: client.clone(),
            group: group.to_string(),
            topics: topics.iter().map(|t| t.to_string()).collect(),
            options,
            member_id: String::new(),
            generation: 0,
            assignment: Vec::new(),
            positions: HashMap::new(),
            last_heartbeat: Instant::now(),
            fetches: HashMap::new(),
            next_fetch_id: 0,
            fetched_tx,
            fetched_rx,
            committing: None,
            last_commit: Instant::now(),
            committed: HashMap::new(),
        };
        c.rejoin().await?;
        Ok(c)
    }

    async fn rejoin(&mut self) -> Result<()> {
        let r = wire::JoinGroupRequest {
            group: self.group.clone(),
            member_id: (!self.member_id.is_empty()).then(|| self.member_id.clone()),
            topics: self.topics.clone(),
            session_timeout_ms: self.options.session_timeout.as_millis() as u64,
        };
        match self.client.call(Request::JoinGroup(r)).await? {
            Response::JoinGroup(j) => {
                self.member_id = j.member_id;
                self.last_heartbeat = Instant::now();
                self.set_assignment(j.generation, j.assignment).await;
                Ok(())
            }
            other => unexpected(other),
        }
    }

    /// Takes a new assignment. Partitions it keeps keep their positions and fetches in flight
    /// (nobody else read them meanwhile: the broker gives a partition to one member at a
    /// time); a partition it lost has its fetch cancelled (prefetched records are dropped) and
    /// its position committed, which releases it to its new member (an empty commit releases
    /// them too); gained ones start from the committed offset.
    async fn set_assignment(&mut self, generation: u64, a: Vec<wire::TopicPartitionEntry>) {
        let new: Vec<PartitionKey> = a.into_iter().map(|e| (e.topic, e.partition)).collect();
        let lost: Vec<PartitionKey> = self
            .assignment
            .iter()
            .filter(|k| !new.contains(k))
            .cloned()
            .collect();
        self.generation = generation;
        self.assignment = new;
        if lost.is_empty() {
            return;
        }
        for k in &lost {
            self.cancel_fetch(k);
            self.committed.remove(k);
        }
        // A background commit lands first (it cannot overwrite the one below).
        let _ = self.finish_background_commit().await;
        let offsets: Vec<wire::OffsetEntry> = lost
            .iter()
            .filter_map(|k| {
                self.positions.remove(k).map(|o| wire::OffsetEntry {
                    topic: k.0.clone(),
                    partition: k.1,
                    offset: o,
                })
            })
            .collect();
        let r = wire::CommitOffsetsRequest {
            group: self.group.clone(),
            member_id: self.member_id.clone(),
            generation,
            offsets,
        };
        // Best effort: if it fails, the broker releases them on the next heartbeat and the
        // new member starts from the last commit (records after it are read again).
        if let Err(e) = self.client.call(Request::CommitOffsets(r)).await {
            tracing::debug!(error = %e, group = %self.group, "committing revoked partitions");
        }
    }

    pub fn member_id(&self) -> &str {
        &self.member_id
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn assignment(&self) -> &[(String, u32)] {
        &self.assignment
    }

    /// Heartbeats now (rejoining if the broker forgot this member).
    pub async fn heartbeat(&mut self) -> Result<()> {
        let r = wire::HeartbeatRequest {
            group: self.group.clone(),
            member_id: self.member_id.clone(),
        };
        match self.client.call(Request::Heartbeat(r)).await {
            Ok(Response::Heartbeat(h)) => {
                self.last_heartbeat = Instant::now();
                self.set_assignment(h.generation, h.assignment).await;
                Ok(())
            }
            Ok(other) => unexpected(other),
            Err(e) if e.code() == Some(ErrorCode::UnknownMember) => {
                // Expired: others may have read our partitions since; start over from the
                // group's commits.
                self.member_id.clear();
                self.generation = 0;
                self.assignment.clear();
                self.positions.clear();
                self.committed.clear();
                self.cancel_all_fetches();
                if let Some(c) = self.committing.take() {
                    c.abort();
                }
                self.rejoin().await
            }
            Err(e) => Err(e),
        }
    }

    /// Moves the position of an assigned partition (the next poll reads from `offset`; what
    /// was prefetched for it is dropped).
    pub fn seek(&mut self, topic: &str, partition: u32, offset: u64) {
        let key = (topic.to_string(), partition);
        self.cancel_fetch(&key);
        self.positions.insert(key, offset);
    }

    fn cancel_fetch(&mut self, key: &PartitionKey) {
        if let Some(f) = self.fetches.remove(key) {
            f.task.abort();
        }
    }

    fn cancel_all_fetches(&mut self) {
        for (_, f) in self.fetches.drain() {
            f.task.abort();
        }
    }

    /// Starts the fetch of `key` from its position (replacing one in flight).
    fn start_fetch(&mut self, key: PartitionKey, from: u64) {
        self.next_fetch_id += 1;
        let id = self.next_fetch_id;
        let client = self.client.clone();
        let tx = self.fetched_tx.clone();
        let (max_bytes, max_records, wait) = (
            self.options.max_bytes,
            self.options.max_records,
            self.options.poll_wait,
        );
        let k = key.clone();
        let task = tokio::spawn(async move {
            let result = client
                .fetch_records(&k.0, k.1, from, max_bytes, max_records, wait)
                .await;
            let _ = tx.send(FetchDone {
                key: k,
                id,
                from,
                result,
            });
        });
        if let Some(old) = self.fetches.insert(key, FetchInFlight { id, task }) {
            old.task.abort();
        }
    }

    /// Takes a finished fetch: `Ok(false)` if it is stale (its partition was revoked or
    /// sought since, or the fetch replaced); else its records go to `out`, the position moves
    /// past them and (prefetch) the partition's next fetch starts.
    async fn take_fetched(&mut self, d: FetchDone, out: &mut Vec<ConsumedRecord>) -> Result<bool> {
        if self.fetches.get(&d.key).map(|f| f.id) != Some(d.id) {
            return Ok(false);
        }
        self.fetches.remove(&d.key);
        match d.result {
            Ok(f) => {
                let next = f.next_offset.max(d.from);
                self.positions.insert(d.key.clone(), next);
                if self.options.prefetch {
                    self.start_fetch(d.key, next);
                }
                out.extend(f.records);
            }
            Err(e) if e.code() == Some(ErrorCode::OffsetOutOfRange) => {
                // Retention removed what we had not read: go on from the earliest kept.
                let start = self
                    .client
                    .list_offset(&d.key.0, d.key.1, Seek::Earliest)
                    .await?;
                self.positions.insert(d.key, start);
            }
            Err(e) => return Err(e),
        }
        Ok(true)
    }

    /// Heartbeats when due (at least every third of the session), then returns the records
    /// of the assigned partitions' fetches that have answered, waiting up to about
    /// `poll_wait` for one with records.
    pub async fn poll(&mut self) -> Result<Vec<ConsumedRecord>> {
        if self.last_heartbeat.elapsed()
            >= (self.options.session_timeout / 3).min(HEARTBEAT_INTERVAL_MAX)
        {
            self.heartbeat().await?;
        }
        if self.assignment.is_empty() {
            tokio::time::sleep(self.options.poll_wait).await;
            return Ok(Vec::new());
        }
        let committed = if self
            .assignment
            .iter()
            .any(|k| !self.positions.contains_key(k))
        {
            self.client.fetch_committed(&self.group).await?
        } else {
            BTreeMap::new()
        };
        for key in self.assignment.clone() {
            if self.fetches.contains_key(&key) {
                continue;
            }
            let pos = match self.positions.get(&key).or(committed.get(&key)) {
                Some(o) => *o,
                None => {
                    self.client
                        .list_offset(&key.0, key.1, Seek::Earliest)
                        .await?
                }
            };
            self.positions.insert(key.clone(), pos);
            self.start_fetch(key, pos);
        }
        let deadline = tokio::time::Instant::now() + self.options.poll_wait + POLL_ANSWER_SLACK;
        let mut out = Vec::new();
        let mut answered: Vec<PartitionKey> = Vec::new();
        loop {
            let done = if out.is_empty() {
                match tokio::time::timeout_at(deadline, self.fetched_rx.recv()).await {
                    Ok(Some(d)) => d,
                    // The sender lives in `self`: never closed; a timeout returns empty.
                    Ok(None) | Err(_) => break,
                }
            } else {
                // Records in hand: add whatever else has answered, without waiting.
                match self.fetched_rx.try_recv() {
                    Ok(d) => d,
                    Err(_) => break,
                }
            };
            let key = done.key.clone();
            if self.take_fetched(done, &mut out).await? && !answered.contains(&key) {
                answered.push(key);
            }
            if out.is_empty() && self.assignment.iter().all(|k| answered.contains(k)) {
                // Every partition answered, with nothing: an empty poll.
                break;
            }
        }
        Ok(out)
    }

    fn offsets_to_commit(&self, only_new: bool) -> Vec<wire::OffsetEntry> {
        self.assignment
            .iter()
            .filter_map(|k| {
                let o = *self.positions.get(k)?;
                if only_new && self.committed.get(k) == Some(&o) {
                    return None;
                }
                Some(wire::OffsetEntry {
                    topic: k.0.clone(),
                    partition: k.1,
                    offset: o,
                })
            })
            .collect()
    }

    fn commit_request(&self, offsets: Vec<wire::OffsetEntry>) -> wire::CommitOffsetsRequest {
        wire::CommitOffsetsRequest {
            group: self.group.clone(),
            member_id: self.member_id.clone(),
            generation: self.generation,
            offsets,
        }
    }

    fn note_committed(&mut self, offsets: &[wire::OffsetEntry]) {
        for o in offsets {
            self.committed
                .insert((o.topic.clone(), o.partition), o.offset);
        }
        self.last_commit = Instant::now();
    }

    /// Waits for the background commit, if any, and returns its result.
    async fn finish_background_commit(&mut self) -> Result<()> {
        let Some(task) = self.committing.take() else {
            return Ok(());
        };
        let r = match task.await {
            Ok(r) => r,
            Err(e) => Err(Error::ConnectionLost(format!("commit task: {e}"))),
        };
        if r.is_err() {
            // Not known to be stored: the next commit sends every position again.
            self.committed.clear();
        }
        r
    }

    /// Commits the positions reached on the assigned partitions. A rebalance since the last
    /// heartbeat makes it fail (`StaleGeneration` / `PartitionNotAssigned`): heartbeat and go on.
    pub async fn commit(&mut self) -> Result<()> {
        // An earlier background commit lands first; its outcome is superseded by this one.
        let _ = self.finish_background_commit().await;
        let offsets = self.offsets_to_commit(false);
        if offsets.is_empty() {
            return Ok(());
        }
        let r = self.commit_request(offsets.clone());
        match self.client.call(Request::CommitOffsets(r)).await? {
            Response::CommitOffsets(_) => {
                self.note_committed(&offsets);
                Ok(())
            }
            other => unexpected(other),
        }
    }

    /// Sends a commit of the positions reached in the background if `commit_interval` passed
    /// since the last one, none is in flight and a position moved. Returns the error of an
    /// earlier background commit that failed (after a rebalance: `StaleGeneration`,
    /// `PartitionNotAssigned` or `UnknownMember`; heartbeat and go on).
    pub async fn commit_if_due(&mut self) -> Result<()> {
        if let Some(task) = &self.committing {
            if !task.is_finished() {
                return Ok(());
            }
            self.finish_background_commit().await?;
        }
        if self.last_commit.elapsed() < self.options.commit_interval {
            return Ok(());
        }
        let offsets = self.offsets_to_commit(true);
        if offsets.is_empty() {
            return Ok(());
        }
        let r = self.commit_request(offsets.clone());
        self.note_committed(&offsets);
        let client = self.client.clone();
        self.committing = Some(tokio::spawn(async move {
            match client.call(Request::CommitOffsets(r)).await? {
                Response::CommitOffsets(_) => Ok(()),
                other => unexpected(other),
            }
        }));
        Ok(())
    }

    /// Polls until `until` returns true; each polled record goes to `handler`, and the
    /// positions are committed after the handler returned for them: in the background at
    /// most every `commit_interval`, and at once when `run` ends (at-least-once: a crash
    /// before a commit redelivers). A rebalance only costs a failed commit.
    pub async fn run<H, U>(&mut self, mut handler: H, mut until: U) -> Result<()>
    where
        H: FnMut(&ConsumedRecord),
        U: FnMut() -> bool,
    {
        while !until() {
            let recs = self.poll().await?;
            for r in &recs {
                handler(r);
            }
            let committed = self.commit_if_due().await;
            self.after_commit(committed).await?;
        }
        let committed = self.commit().await;
        self.after_commit(committed).await
    }

    /// A commit refused because of a rebalance is followed by a heartbeat (which learns of
    /// it); other errors are returned.
    async fn after_commit(&mut self, r: Result<()>) -> Result<()> {
        match r {
            Ok(()) => Ok(()),
            Err(e) if e.is_rebalance() => self.heartbeat().await,
            Err(e) => Err(e),
        }
    }

    /// Commits the positions reached (best effort: a refused commit is logged) and leaves the
    /// group (its partitions go to the other members at once, from those positions).
    pub async fn close(mut self) -> Result<()> {
        self.cancel_all_fetches();
        if let Err(e) = self.commit().await {
            tracing::debug!(error = %e, group = %self.group, "committing before leaving");
        }
        let r = wire::LeaveGroupRequest {
            group: std::mem::take(&mut self.group),
            member_id: std::mem::take(&mut self.member_id),
        };
        match self.client.call(Request::LeaveGroup(r)).await? {
            Response::LeaveGroup(_) => Ok(()),
            other => unexpected(other),
        }
    }
}

impl Drop for GroupConsumer {
    fn drop(&mut self) {
        // Prefetches stop with the member (a background commit is left to land).
        self.cancel_all_fetches();
    }
}
