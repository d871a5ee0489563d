//! A lingering topic producer: single records gathered per partition into batches, sent when
//! a batch is full or its first record has waited the linger time, each record's send
//! answered with its own partition and offset once the broker has the batch durably.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use sluice_wire::batch::{self, Record};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::stream::{now_ms, partition_for_key};
use crate::{Client, ErrorCode};

/// How a [`TopicPublisher`] batches.
#[derive(Clone, Debug)]
pub struct TopicPublisherOptions {
    /// Longest a record waits for companions before its partition's batch goes. Default 2 ms.
    pub linger: Duration,
    /// A partition's batch goes once it holds this many bytes. Default 256 KiB (at most
    /// [`crate::TopicProducer::BATCH_BYTES_DEFAULT`]).
    pub batch_bytes: usize,
    /// Batches in flight at once, over all partitions. Default 16.
    pub batches_in_flight: usize,
    /// Records waiting to be batched before `send` waits (back-pressure). Default 10,000.
    pub queue_capacity: usize,
}

impl Default for TopicPublisherOptions {
    fn default() -> Self {
        TopicPublisherOptions {
            linger: Duration::from_millis(2),
            batch_bytes: 256 * 1024,
            batches_in_flight: 16,
            queue_capacity: 10_000,
        }
    }
}

/// Where a published record landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Published {
    pub partition: u32,
    pub offset: u64,
}

struct Pending {
    record: Record,
    bytes: usize,
    reply: oneshot::Sender<Result<Published>>,
}

/// Publishes records to one topic in batches: keyed records go to `xxh3(key) % partitions`
/// (as the broker computes it), keyless ones round robin. Each [`TopicPublisher::send`]
/// returns once the record's batch is durable on the broker. Cheap to clone; dropping every
/// clone sends what is buffered.
///
/// ```no_run
/// # async fn demo(client: sluice_sdk::Client) -> sluice_sdk::Result<()> {
/// let publisher = client.topic_publisher("clicks", Default::default()).await?;
/// let sends: Vec<_> = (0..1000)
///     .map(|i| publisher.send(Some(format!("user-{}", i % 7).into_bytes()), b"click".to_vec()))
///     .collect();
/// for r in futures::future::join_all(sends).await {
///     let at = r?;
///     assert!(at.partition < publisher.partitions());
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct TopicPublisher {
    tx: mpsc::Sender<Pending>,
    partitions: u32,
    batch_bytes: usize,
}

impl TopicPublisher {
    pub(crate) fn start(
        client: Client,
        topic: String,
        partitions: u32,
        options: TopicPublisherOptions,
    ) -> Self {
        let (tx, rx) = mpsc::channel(options.queue_capacity.max(1));
        let batch_bytes = options
            .batch_bytes
            .clamp(1, crate::TopicProducer::BATCH_BYTES_DEFAULT);
        tokio::spawn(batcher(client, topic, partitions, options, rx));
        TopicPublisher {
            tx,
            partitions,
            batch_bytes,
        }
    }

    pub fn partitions(&self) -> u32 {
        self.partitions
    }

    /// Publishes one record; returns where it landed once it is durable. Records of one key
    /// land in the order their sends were *queued*: to fix that order while sending many at
    /// once, use [`TopicPublisher::enqueue`].
    pub async fn send(&self, key: Option<Vec<u8>>, value: Vec<u8>) -> Result<Published> {
        self.enqueue(key, value).await?.await
    }

    /// Queues one record and returns once it is queued (waiting only when the queue is full);
    /// the returned [`PublishAck`] resolves once the record is durable. Records queued one
    /// after another keep that order within their partition.
    pub async fn enqueue(&self, key: Option<Vec<u8>>, value: Vec<u8>) -> Result<PublishAck> {
        let bytes = value.len() + key.as_ref().map_or(0, Vec::len) + 32;
        if bytes > self.batch_bytes {
            return Err(Error::Service {
                code: ErrorCode::InvalidParameterValue,
                message: format!("a record is limited to {} bytes", self.batch_bytes),
            });
        }
        let (reply, answer) = oneshot::channel();
        let record = Record {
            timestamp_ms: now_ms(),
            key,
            value,
            headers: Vec::new(),
        };
        self.tx
            .send(Pending {
                record,
                bytes,
                reply,
            })
            .await
            .map_err(|_| Error::ConnectionLost("publisher stopped".into()))?;
        Ok(PublishAck(answer))
    }
}

/// Resolves to where a queued record landed, once its batch is durable.
pub struct PublishAck(oneshot::Receiver<Result<Published>>);

impl std::future::Future for PublishAck {
    type Output = Result<Published>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0)
            .poll(cx)
            .map(|r| r.unwrap_or_else(|_| Err(Error::ConnectionLost("publisher stopped".into()))))
    }
}

/// One partition's batch being gathered.
struct Gathering {
    records: Vec<Pending>,
    bytes: usize,
    /// When the first record's linger ends.
    due: Instant,
}

async fn batcher(
    client: Client,
    topic: String,
    partitions: u32,
    options: TopicPublisherOptions,
    mut rx: mpsc::Receiver<Pending>,
) {
    let batch_bytes = options
        .batch_bytes
        .clamp(1, crate::TopicProducer::BATCH_BYTES_DEFAULT);
    let permits = Arc::new(Semaphore::new(options.batches_in_flight.max(1)));
    let mut open: BTreeMap<u32, Gathering> = BTreeMap::new();
    // One sender per partition, so a partition's batches are appended in the order they were
    // gathered (two in flight at once could overtake each other on different streams).
    let mut senders: BTreeMap<u32, mpsc::Sender<Vec<Pending>>> = BTreeMap::new();
    let mut next_keyless = 0u32;
    let partitions = partitions.max(1);
    let mut dispatch = |partition: u32, records: Vec<Pending>| {
        let tx = senders.entry(partition).or_insert_with(|| {
            let (tx, rx) = mpsc::channel(PARTITION_BATCHES_QUEUED);
            tokio::spawn(partition_sender(
                client.clone(),
                topic.clone(),
                partition,
                permits.clone(),
                rx,
            ));
            tx
        });
        let tx = tx.clone();
        async move {
            if let Err(mpsc::error::SendError(records)) = tx.send(records).await {
                for p in records {
                    let _ = p
                        .reply
                        .send(Err(Error::ConnectionLost("publisher stopped".into())));
                }
            }
        }
    };
    loop {
        let next_due = open.values().map(|g| g.due).min();
        let arrived = match next_due {
            // `None` when a linger ended first.
            Some(due) => tokio::time::timeout_at(due, rx.recv()).await.ok(),
            None => Some(rx.recv().await),
        };
        let closed = matches!(arrived, Some(None));
        if let Some(Some(p)) = arrived {
            let partition = match &p.record.key {
                Some(k) => partition_for_key(k, partitions),
                None => {
                    next_keyless = (next_keyless + 1) % partitions;
                    next_keyless
                }
            };
            // A record that would overflow its partition's batch sends that batch first.
            if open
                .get(&partition)
                .is_some_and(|g| g.bytes + p.bytes > batch_bytes)
            {
                let g = open.remove(&partition).expect("checked");
                dispatch(partition, g.records).await;
            }
            let g = open.entry(partition).or_insert_with(|| Gathering {
                records: Vec::new(),
                bytes: 0,
                due: Instant::now() + options.linger,
            });
            g.bytes += p.bytes;
            g.records.push(p);
        }
        let now = Instant::now();
        let ready: Vec<u32> = open
            .iter()
            .filter(|(_, g)| closed || g.due <= now || g.bytes >= batch_bytes)
            .map(|(p, _)| *p)
            .collect();
        for partition in ready {
            let g = open.remove(&partition).expect("listed");
            dispatch(partition, g.records).await;
        }
        if closed {
            // Every publisher is gone: the partition senders finish what they hold and stop.
            return;
        }
    }
}

/// Batches of one partition waiting for their turn (beyond this, gathering waits).
const PARTITION_BATCHES_QUEUED: usize = 4;

/// Sends one partition's batches one after another (each also holding one of the
/// publisher's `permits`), answering each record.
async fn partition_sender(
    client: Client,
    topic: String,
    partition: u32,
    permits: Arc<Semaphore>,
    mut rx: mpsc::Receiver<Vec<Pending>>,
) {
    while let Some(records) = rx.recv().await {
        let _permit = permits
            .acquire()
            .await
            .expect("the semaphore is never closed");
        let (recs, replies): (Vec<Record>, Vec<_>) =
            records.into_iter().map(|p| (p.record, p.reply)).unzip();
        let bytes = batch::encode(&recs).expect("a gathered batch has records");
        match client.produce_batch(&topic, Some(partition), bytes).await {
            Ok(r) => {
                for (i, reply) in replies.into_iter().enumerate() {
                    let _ = reply.send(Ok(Published {
                        partition: r.partition,
                        offset: r.base_offset + i as u64,
                    }));
                }
            }
            Err(e) => {
                for reply in replies {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }
}
