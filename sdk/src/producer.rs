//! A batching producer: single sends gathered into SendMessageBatch requests.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sluice_wire::messages::{MessageAttributeMap, SendMessageBatchRequestEntry, SendMessageResult};
use sluice_wire::MESSAGE_BYTES_MAX;
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::error::{Error, Result};
use crate::Client;

/// SQS's limit on entries per batch ([`sluice_wire::limits::BATCH_ENTRIES_MAX`]).
pub use sluice_wire::limits::BATCH_ENTRIES_MAX as PRODUCER_BATCH_ENTRIES_MAX;

/// How a [`Producer`] batches.
#[derive(Clone, Debug)]
pub struct ProducerOptions {
    /// Longest a message waits for companions before its batch goes. Default 2 ms.
    pub linger: Duration,
    /// Entries per batch, 1–10. Default 10.
    pub batch_entries: usize,
    /// Batches in flight at once. Default 16. A FIFO queue (URL ending `.fifo`) always has
    /// one: two batches in flight could be applied out of order, and a message group's order
    /// is the promise of a FIFO queue.
    pub batches_in_flight: usize,
    /// Messages waiting to be batched before `send` waits (back-pressure). Default 10,000.
    pub queue_capacity: usize,
}

impl Default for ProducerOptions {
    fn default() -> Self {
        ProducerOptions {
            linger: Duration::from_millis(2),
            batch_entries: PRODUCER_BATCH_ENTRIES_MAX,
            batches_in_flight: 16,
            queue_capacity: 10_000,
        }
    }
}

/// One message for [`Producer::send_message`].
#[derive(Clone, Debug, Default)]
pub struct OutgoingMessage {
    pub body: String,
    pub delay_seconds: Option<u32>,
    pub attributes: MessageAttributeMap,
    pub group_id: Option<String>,
    pub deduplication_id: Option<String>,
}

struct Pending {
    message: OutgoingMessage,
    reply: oneshot::Sender<Result<SendMessageResult>>,
}

/// Sends messages to one queue in batches: each [`Producer::send`] waits at most
/// [`ProducerOptions::linger`] for others to share its request, and returns that message's
/// own result once the broker has the batch durably. Cheap to clone; dropping every clone
/// flushes what is queued.
///
/// ```no_run
/// # async fn demo(client: sluice_sdk::Client, queue_url: String) -> sluice_sdk::Result<()> {
/// let producer = client.producer(&queue_url, Default::default());
/// let sends: Vec<_> = (0..100).map(|i| producer.send(format!("event {i}"))).collect();
/// for r in futures::future::join_all(sends).await {
///     r?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Producer {
    tx: mpsc::Sender<Pending>,
}

impl Producer {
    pub(crate) fn start(client: Client, queue_url: String, options: ProducerOptions) -> Self {
        let (tx, rx) = mpsc::channel(options.queue_capacity.max(1));
        tokio::spawn(batcher(client, queue_url, options, rx));
        Producer { tx }
    }

    /// Sends a message with just a body.
    pub async fn send(&self, body: impl Into<String>) -> Result<SendMessageResult> {
        self.send_message(OutgoingMessage {
            body: body.into(),
            ..Default::default()
        })
        .await
    }

    /// Sends a message; its own failure (an invalid attribute, say) fails only this call.
    pub async fn send_message(&self, message: OutgoingMessage) -> Result<SendMessageResult> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Pending { message, reply })
            .await
            .map_err(|_| Error::ConnectionLost("producer stopped".into()))?;
        answer
            .await
            .unwrap_or_else(|_| Err(Error::ConnectionLost("producer stopped".into())))
    }
}

fn size_bytes(m: &OutgoingMessage) -> usize {
    m.body.len()
        + m.attributes
            .iter()
            .map(|(k, v)| {
                k.len()
                    + v.data_type.len()
                    + match &v.value {
                        sluice_wire::AttributeValue::String(s) => s.len(),
                        sluice_wire::AttributeValue::Binary(b) => b.len(),
                    }
            })
            .sum::<usize>()
}

async fn batcher(
    client: Client,
    queue_url: String,
    options: ProducerOptions,
    mut rx: mpsc::Receiver<Pending>,
) {
    let entries_max = options.batch_entries.clamp(1, PRODUCER_BATCH_ENTRIES_MAX);
    let in_flight = if queue_url.ends_with(".fifo") {
        1
    } else {
        options.batches_in_flight.max(1)
    };
    let permits = Arc::new(Semaphore::new(in_flight));
    let mut carry: Option<Pending> = None;
    loop {
        let first = match carry.take() {
            Some(p) => p,
            None => match rx.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        let mut bytes = size_bytes(&first.message);
        let mut batch = vec![first];
        let deadline = tokio::time::Instant::now() + options.linger;
        while batch.len() < entries_max {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(p)) => {
                    let b = size_bytes(&p.message);
                    // SQS's 1 MiB is for the whole batch: start the next one instead.
                    if bytes + b > MESSAGE_BYTES_MAX {
                        carry = Some(p);
                        break;
                    }
                    bytes += b;
                    batch.push(p);
                }
                Ok(None) | Err(_) => break,
            }
        }
        let permit = permits
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let (client, queue_url) = (client.clone(), queue_url.clone());
        tokio::spawn(async move {
            send_batch(&client, &queue_url, batch).await;
            drop(permit);
        });
    }
}

async fn send_batch(client: &Client, queue_url: &str, batch: Vec<Pending>) {
    let mut replies = HashMap::with_capacity(batch.len());
    let entries = batch
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            replies.insert(i.to_string(), p.reply);
            let m = p.message;
            SendMessageBatchRequestEntry {
                id: i.to_string(),
                message_body: m.body,
                delay_seconds: m.delay_seconds,
                message_attributes: m.attributes,
                message_system_attributes: Default::default(),
                message_deduplication_id: m.deduplication_id,
                message_group_id: m.group_id,
            }
        })
        .collect();
    match client.send_batch(queue_url, entries).await {
        Ok(result) => {
            for ok in result.successful {
                if let Some(reply) = replies.remove(&ok.id) {
                    let _ = reply.send(Ok(SendMessageResult {
                        message_id: ok.message_id,
                        md5_of_message_body: ok.md5_of_message_body,
                        md5_of_message_attributes: ok.md5_of_message_attributes,
                        md5_of_message_system_attributes: ok.md5_of_message_system_attributes,
                        sequence_number: ok.sequence_number,
                    }));
                }
            }
            for failed in result.failed {
                if let Some(reply) = replies.remove(&failed.id) {
                    let _ = reply.send(Err(Error::Service {
                        code: failed.error_code(),
                        message: failed.message.unwrap_or_default(),
                    }));
                }
            }
            for (_, reply) in replies {
                let _ = reply.send(Err(Error::Protocol("batch entry not answered".into())));
            }
        }
        Err(e) => {
            for (_, reply) in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}
