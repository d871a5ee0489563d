//! NATS JetStream (Debian's nats-server 2.9): a queue is a work-queue stream (retention
//! WorkQueue: a message is deleted once acked) with one durable pull consumer, `g0`, that every
//! connection pulls from (competing consumers); a topic is a limits-retention stream with one
//! durable pull consumer per group (fan-out; NATS has no partitions, so the stream is one log).
//! Publishes wait for the stream's PubAck; acks are explicit (`+ACK` to the message's reply
//! subject, fire-and-forget as in every NATS client). FIFO groups have no honest mapping (a
//! consumer cannot hold back one subject while another is in flight), so FIFO is unsupported.

use super::process::{find_binary, free_port, own_dir, probe_tcp, Server};
use super::Started;
use super::{group_name, PREFETCH_MESSAGES};
use crate::cpu::CpuMeter;
use crate::target::{AckToken, BoxFut, Conn, InMsg, OutMsg, Shape, Target, TargetError};
use async_nats::jetstream::{self, consumer::pull, stream};
use futures::{FutureExt, StreamExt};
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::rc::Rc;
use std::time::Duration;

/// nats-server starts in well under a second; this bounds a broken start.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Unacked messages a consumer may have out across all its pullers.
const MAX_ACK_PENDING: i64 = 100_000;

pub(super) fn start(work_dir: &Path) -> Result<Started, TargetError> {
    let bin = find_binary(&["nats-server"])?;
    let dir = own_dir(work_dir, "nats-jetstream")?;
    let port = free_port()?;
    let store = dir.join("store");
    let mut cmd = Command::new(bin);
    cmd.arg("-js")
        .args(["-a", "127.0.0.1", "-p", &port.to_string()])
        .arg("-sd")
        .arg(&store);
    let mut server = Server::spawn("nats-server", cmd, dir.join("server.log"), Some(dir))?;
    // A client listener that greets with INFO; JetStream is enabled before it opens.
    server.wait_ready(START_TIMEOUT, || probe_tcp(port, b"", b"INFO "))?;
    let target = NatsTarget {
        url: format!("nats://127.0.0.1:{port}"),
        cpu: CpuMeter::Groups(vec![server.group()]),
    };
    Ok((Box::new(server), Box::new(target)))
}

struct NatsTarget {
    url: String,
    cpu: CpuMeter,
}

/// Stream names may not contain `.`, `*`, `>` or whitespace; subjects are the same name.
fn stream_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn err(what: &str, e: impl std::fmt::Display) -> TargetError {
    TargetError(format!("nats {what}: {e}"))
}

async fn connect(url: &str) -> Result<(async_nats::Client, jetstream::Context), TargetError> {
    let client = async_nats::connect(url)
        .await
        .map_err(|e| err("connect", e))?;
    let js = jetstream::new(client.clone());
    Ok((client, js))
}

impl Target for NatsTarget {
    fn name(&self) -> String {
        "nats-jetstream".into()
    }

    fn cpu_meter(&self) -> Option<CpuMeter> {
        Some(self.cpu.clone())
    }

    fn fsync_policy(&self) -> String {
        "no fsync (acks before sync; NATS 2.9 cannot fsync every write)".into()
    }

    fn supports(&self, shape: &Shape) -> bool {
        !matches!(shape, Shape::Fifo { .. })
    }

    /// The adapter's pull stream fetches ahead: a receive reads what was already delivered.
    fn receive_is_a_request(&self) -> bool {
        false
    }

    fn setup<'a>(&'a self, name: &'a str, shape: &'a Shape) -> BoxFut<'a, ()> {
        Box::pin(async move {
            let (groups, retention) = match shape {
                Shape::Standard => (1, stream::RetentionPolicy::WorkQueue),
                Shape::Topic { groups, .. } => (*groups, stream::RetentionPolicy::Limits),
                Shape::Fifo { .. } => return Err(TargetError("nats: FIFO unsupported".into())),
            };
            let (_client, js) = connect(&self.url).await?;
            let sname = stream_name(name);
            let _ = js.delete_stream(&sname).await; // absent the first time
            let stream = js
                .create_stream(stream::Config {
                    name: sname.clone(),
                    subjects: vec![sname.clone()],
                    retention,
                    storage: stream::StorageType::File,
                    ..Default::default()
                })
                .await
                .map_err(|e| err("create stream", e))?;
            for group in 0..groups {
                stream
                    .create_consumer(pull::Config {
                        durable_name: Some(group_name(group)),
                        ack_policy: jetstream::consumer::AckPolicy::Explicit,
                        max_ack_pending: MAX_ACK_PENDING,
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| err("create consumer", e))?;
            }
            Ok(())
        })
    }

    fn teardown<'a>(&'a self, name: &'a str, _shape: &'a Shape) -> BoxFut<'a, ()> {
        Box::pin(async move {
            let (_client, js) = connect(&self.url).await?;
            js.delete_stream(stream_name(name))
                .await
                .map_err(|e| err("delete stream", e))?;
            Ok(())
        })
    }

    fn connect(&self) -> BoxFut<'_, Box<dyn Conn>> {
        Box::pin(async move {
            let (client, js) = connect(&self.url).await?;
            Ok(Box::new(NatsConn {
                client,
                js,
                pulls: futures::lock::Mutex::new(HashMap::new()),
            }) as Box<dyn Conn>)
        })
    }
}

type Pull = Rc<futures::lock::Mutex<pull::Stream>>;

struct NatsConn {
    client: async_nats::Client,
    js: jetstream::Context,
    /// One pull subscription per (stream, group), opened on first receive and shared by every
    /// receive on this connection.
    pulls: futures::lock::Mutex<HashMap<(String, u32), Pull>>,
}

impl NatsConn {
    async fn pull(&self, name: &str, group: u32) -> Result<Pull, TargetError> {
        let mut pulls = self.pulls.lock().await;
        if let Some(p) = pulls.get(&(name.to_string(), group)) {
            return Ok(p.clone());
        }
        let consumer: jetstream::consumer::PullConsumer = self
            .js
            .get_consumer_from_stream(group_name(group), stream_name(name))
            .await
            .map_err(|e| err("get consumer", e))?;
        let messages = consumer
            .stream()
            .max_messages_per_batch(usize::from(PREFETCH_MESSAGES))
            .messages()
            .await
            .map_err(|e| err("pull", e))?;
        let p = Rc::new(futures::lock::Mutex::new(messages));
        pulls.insert((name.to_string(), group), p.clone());
        Ok(p)
    }
}

impl NatsConn {
    async fn forget(&self, name: &str, group: u32) {
        self.pulls.lock().await.remove(&(name.to_string(), group));
    }
}

fn in_msg(m: jetstream::Message) -> Result<InMsg, TargetError> {
    let reply = m
        .message
        .reply
        .as_ref()
        .ok_or_else(|| TargetError("nats: message without reply subject".into()))?;
    Ok(InMsg {
        ack: AckToken::Text(reply.to_string()),
        body: m.message.payload.clone(),
    })
}

impl Conn for NatsConn {
    fn send<'a>(&'a self, name: &'a str, msgs: &'a [OutMsg]) -> BoxFut<'a, ()> {
        Box::pin(async move {
            let subject = stream_name(name);
            // Pipelined: every publish goes out before the first PubAck is awaited.
            let mut acks = Vec::with_capacity(msgs.len());
            for m in msgs {
                let ack = self
                    .js
                    .publish(subject.clone(), m.body.clone().into())
                    .await
                    .map_err(|e| err("publish", e))?;
                acks.push(std::future::IntoFuture::into_future(ack));
            }
            for r in futures::future::join_all(acks).await {
                r.map_err(|e| err("puback", e))?;
            }
            Ok(())
        })
    }

    fn receive<'a>(
        &'a self,
        name: &'a str,
        group: u32,
        max: usize,
        wait: Duration,
    ) -> BoxFut<'a, Vec<InMsg>> {
        Box::pin(async move {
            let pull = self.pull(name, group).await?;
            let mut pull = pull.lock().await;
            let mut out = Vec::new();
            let first = match tokio::time::timeout(wait, pull.next()).await {
                Err(_) => return Ok(out),
                Ok(first) => first,
            };
            let mut next = Some(first);
            while let Some(item) = next.take() {
                match item {
                    Some(Ok(m)) => out.push(in_msg(m)?),
                    Some(Err(e)) => {
                        // A consumer deleted by a teardown (or a stream that ended) cannot
                        // deliver again: forget it, so a later setup of the same name works on
                        // this connection. Other errors (a missed heartbeat) are transient.
                        use async_nats::jetstream::consumer::pull::MessagesErrorKind as Kind;
                        if matches!(e.kind(), Kind::ConsumerDeleted | Kind::NoResponders) {
                            self.forget(name, group).await;
                        }
                        if out.is_empty() {
                            return Err(err("pull", e));
                        }
                        break;
                    }
                    None => {
                        self.forget(name, group).await;
                        if out.is_empty() {
                            return Err(TargetError("nats: pull subscription ended".into()));
                        }
                        break;
                    }
                }
                if out.len() < max {
                    // Then whatever has already arrived, without waiting.
                    next = pull.next().now_or_never();
                }
            }
            Ok(out)
        })
    }

    fn ack<'a>(&'a self, _name: &'a str, _group: u32, acks: Vec<AckToken>) -> BoxFut<'a, ()> {
        Box::pin(async move {
            for a in acks {
                let AckToken::Text(reply) = a else {
                    return Err(TargetError("nats: foreign ack token".into()));
                };
                self.client
                    .publish(reply, "+ACK".into())
                    .await
                    .map_err(|e| err("ack", e))?;
            }
            self.client.flush().await.map_err(|e| err("flush", e))?;
            Ok(())
        })
    }
}
