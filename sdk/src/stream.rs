//! Streams: topics, a keyed batching producer and a group consumer.
//!
//! Records travel in the record-batch format of `sluice_wire::batch` (the bytes the log stores): the producer
//! encodes and checksums each batch once; the broker verifies and stores those bytes; fetch
//! returns the stored batches, which [`GroupConsumer`] verifies again before handing records out.

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
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
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
    decode_fetched(topic, partition, bytes, from).map(|(records, _)| records)
}

/// Verified records of concatenated batches at or after `from`, and the offset after the last
/// batch (at least `from`). Control batches (markers the broker adds) give no records but move
/// that offset on.
fn decode_fetched(
    topic: &str,
    partition: u32,
    mut bytes: &[u8],
    from: u64,
) -> Result<(Vec<ConsumedRecord>, u64)> {
    let mut out = Vec::new();
    let mut next = from;
    while !bytes.is_empty() {
        let v =
            BatchView::parse(bytes).map_err(|e| Error::Protocol(format!("fetched batch: {e}")))?;
        bytes = &bytes[v.bytes.len()..];
        next = next.max(v.header.next_offset());
        if v.header.is_control() {
            continue;
        }
        for r in v.records() {
            let r = r.map_err(|e| Error::Protocol(format!("fetched record: {e}")))?;
            if r.offset >= from {
                out.push(ConsumedRecord {
                    topic: topic.to_string(),
                    partition,
                    offset: r.offset,
                    timestamp_ms: r.timestamp_ms,
                    key: r.key.map(<[u8]>::to_vec),
                    value: r.value.to_vec(),
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
        match via.call(Request::Fetch(r)).await {
            Ok(Response::Fetch(f)) => {
                let (records, next_offset) = decode_fetched(topic, partition, &f.batches, offset)?;
                Ok(Fetched {
                    records,
                    next_offset,
                    end_offset: f.end_offset,
                })
            }
            Ok(other) => unexpected(other),
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
    /// Per partition and poll.
    pub max_records: u32,
    pub max_bytes: u32,
    /// How long a poll waits on one partition when nothing is there.
    pub poll_wait: Duration,
}

impl Default for GroupConsumerOptions {
    fn default() -> Self {
        GroupConsumerOptions {
            session_timeout: Duration::from_secs(10),
            max_records: 500,
            max_bytes: 1024 * 1024,
            poll_wait: Duration::from_millis(100),
        }
    }
}

/// A member heartbeats at least this often (and at least three times a session), so that a
/// rebalance hands partitions over within a fraction of a second: the broker gives a partition
/// to its new member only once the old one, told on its heartbeat, committed and released it.
pub const HEARTBEAT_INTERVAL_MAX: Duration = Duration::from_millis(250);

/// A member of a consumer group. [`poll`] heartbeats when due (learning of rebalances: a
/// partition it lost has its position committed at once, which hands it over; a partition it
/// gained starts from the group's committed offset), then fetches from its partitions. [`commit`] commits the positions reached (manual); [`run`] polls, hands each
/// record to a handler and commits after the handler succeeded (at-least-once). [`seek`] moves
/// a position.
///
/// [`poll`]: GroupConsumer::poll
/// [`commit`]: GroupConsumer::commit
/// [`run`]: GroupConsumer::run
/// [`seek`]: GroupConsumer::seek
pub struct GroupConsumer {
    client: Client,
    group: String,
    topics: Vec<String>,
    options: GroupConsumerOptions,
    member_id: String,
    generation: u64,
    assignment: Vec<(String, u32)>,
    positions: HashMap<(String, u32), u64>,
    last_heartbeat: Instant,
}

impl GroupConsumer {
    pub async fn join(
        client: &Client,
        group: &str,
        topics: &[&str],
        options: GroupConsumerOptions,
    ) -> Result<GroupConsumer> {
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

    /// Takes a new assignment. Partitions it keeps keep their positions (nobody else read
    /// them meanwhile: the broker gives a partition to one member at a time); the positions
    /// of partitions it lost are committed first, which releases them to their new member
    /// (an empty commit releases them too); gained ones start from the committed offset.
    async fn set_assignment(&mut self, generation: u64, a: Vec<wire::TopicPartitionEntry>) {
        let new: Vec<(String, u32)> = a.into_iter().map(|e| (e.topic, e.partition)).collect();
        let lost: Vec<(String, u32)> = self
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
                self.rejoin().await
            }
            Err(e) => Err(e),
        }
    }

    /// Moves the position of an assigned partition (the next poll reads from `offset`).
    pub fn seek(&mut self, topic: &str, partition: u32, offset: u64) {
        self.positions
            .insert((topic.to_string(), partition), offset);
    }

    /// Heartbeats if a third of the session passed, then fetches from every assigned partition.
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
        let mut out = Vec::new();
        for (topic, p) in self.assignment.clone() {
            let key = (topic.clone(), p);
            let pos = match self.positions.get(&key).or(committed.get(&key)) {
                Some(o) => *o,
                None => self.client.list_offset(&topic, p, Seek::Earliest).await?,
            };
            let wait = if out.is_empty() {
                self.options.poll_wait
            } else {
                Duration::ZERO
            };
            let fetched = self
                .client
                .fetch_records(
                    &topic,
                    p,
                    pos,
                    self.options.max_bytes,
                    self.options.max_records,
                    wait,
                )
                .await;
            let f = match fetched {
                Ok(f) => f,
                Err(e) if e.code() == Some(ErrorCode::OffsetOutOfRange) => {
                    // Retention removed what we had not read: go on from the earliest kept.
                    let start = self.client.list_offset(&topic, p, Seek::Earliest).await?;
                    self.positions.insert(key, start);
                    continue;
                }
                Err(e) => return Err(e),
            };
            self.positions.insert(key, f.next_offset.max(pos));
            out.extend(f.records);
        }
        Ok(out)
    }

    /// Commits the positions reached on the assigned partitions. A rebalance since the last
    /// heartbeat makes it fail (`StaleGeneration` / `PartitionNotAssigned`): heartbeat and go on.
    pub async fn commit(&mut self) -> Result<()> {
        let offsets: Vec<wire::OffsetEntry> = self
            .assignment
            .iter()
            .filter_map(|k| {
                self.positions.get(k).map(|o| wire::OffsetEntry {
                    topic: k.0.clone(),
                    partition: k.1,
                    offset: *o,
                })
            })
            .collect();
        if offsets.is_empty() {
            return Ok(());
        }
        let r = wire::CommitOffsetsRequest {
            group: self.group.clone(),
            member_id: self.member_id.clone(),
            generation: self.generation,
            offsets,
        };
        match self.client.call(Request::CommitOffsets(r)).await? {
            Response::CommitOffsets(_) => Ok(()),
            other => unexpected(other),
        }
    }

    /// Polls until `until` returns true; each polled record goes to `handler`, and the
    /// positions are committed after the handler returned for all of them (at-least-once: a
    /// crash before the commit redelivers). A rebalance only costs a failed commit.
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
            if !recs.is_empty() {
                match self.commit().await {
                    Ok(()) => {}
                    Err(e)
                        if matches!(
                            e.code(),
                            Some(ErrorCode::StaleGeneration)
                                | Some(ErrorCode::PartitionNotAssigned)
                                | Some(ErrorCode::UnknownMember)
                        ) =>
                    {
                        self.heartbeat().await?;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// Leaves the group (its partitions go to the other members at once).
    pub async fn close(self) -> Result<()> {
        let r = wire::LeaveGroupRequest {
            group: self.group,
            member_id: self.member_id,
        };
        match self.client.call(Request::LeaveGroup(r)).await? {
            Response::LeaveGroup(_) => Ok(()),
            other => unexpected(other),
        }
    }
}
