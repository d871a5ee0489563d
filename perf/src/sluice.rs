//! Sluice as load-generator targets: `sluice-quic` (the native protocol through the SDK: queues
//! with SendMessageBatch / ReceiveMessage / DeleteMessageBatch, topics with Produce and group
//! consumers) and `sluice-http` (the SQS JSON API over HTTP/1.1 keep-alive). Both talk either to
//! a broker this process starts ([`InProcess`]) or to an external one.

use crate::cpu::CpuMeter;
use crate::sqs_http::HttpConn;
use crate::target::{AckToken, BoxFut, Conn, InMsg, OutMsg, Shape, Target, TargetError};
use serde_json::{json, Value};
use sluice_broker::config::BrokerConfig;
use sluice_broker::server::BrokerHandle;
use sluice_sdk::stream::partition_for_key;
use sluice_sdk::types::{CreateTopicRequest, SendMessageBatchRequestEntry};
use sluice_sdk::{
    Client, ClientOptions, GroupConsumer, GroupConsumerOptions, ReceiveOptions, Trust,
};
use sluice_wire::batch::BatchBuilder;
// SQS batch calls take at most 10 entries.
use sluice_wire::limits::BATCH_ENTRIES_MAX as SQS_BATCH_MAX;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

pub const FSYNC_POLICY: &str = "fdatasync before every ack (group commit)";
/// Session of topic group members: short, so that members joining at the start of a run learn
/// of the rebalance (on their heartbeat, every third of it) within the warm-up.
const GROUP_SESSION: Duration = Duration::from_secs(3);
/// The most a member's fetch asks for (the broker's own cap is 8 MiB).
const FETCH_BYTES_MAX: usize = 8 << 20;
/// Group members one connection may hold per (topic, group).
const MEMBERS_PER_CONN_MAX: usize = 64;

/// Where a Sluice broker listens.
#[derive(Debug, Clone)]
pub struct Endpoints {
    pub quic: Option<SocketAddr>,
    /// The broker's certificate (PEM), trusted by the QUIC client.
    pub cert: Option<PathBuf>,
    pub http: Option<SocketAddr>,
    /// The Kafka listener (`sluice-kafka`).
    pub kafka: Option<SocketAddr>,
}

/// A broker started in this process for one run, on loopback with free ports; removed on drop.
pub struct InProcess {
    broker: Option<BrokerHandle>,
    dir: PathBuf,
    pub endpoints: Endpoints,
}

impl InProcess {
    /// Starts the embedded default with `shards` shards (each queue with a partition per
    /// shard, fdatasync before every ack) in `dir` (emptied first), with its Kafka listener on
    /// a free port if `kafka`.
    pub fn start(dir: &Path, shards: usize, kafka: bool) -> Result<InProcess, String> {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut c = BrokerConfig::ephemeral(dir.to_path_buf()).map_err(|e| e.to_string())?;
        c.shards = shards.max(1);
        c.default_partitions = c.shards as u32;
        c.http_addr = "127.0.0.1:0".parse().expect("literal");
        c.quic_addr = "127.0.0.1:0".parse().expect("literal");
        c.metrics_addr = "127.0.0.1:0".parse().expect("literal");
        c.kafka_addr = kafka.then(|| "127.0.0.1:0".parse().expect("literal"));
        let broker = sluice_broker::server::start(c).map_err(|e| format!("start broker: {e}"))?;
        broker.wait_ready()?;
        let endpoints = Endpoints {
            quic: Some(broker.quic_addr()),
            cert: Some(dir.join("quic-selfsigned-cert.pem")),
            http: Some(broker.http_addr()),
            kafka: broker.kafka_addr(),
        };
        Ok(InProcess {
            broker: Some(broker),
            dir: dir.to_path_buf(),
            endpoints,
        })
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if let Some(b) = self.broker.take() {
            b.shutdown();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn err(e: impl std::fmt::Display) -> TargetError {
    TargetError::new(e)
}

/// A queue or topic name that no earlier run used (a deleted name may not be reusable at once).
fn fresh(name: &str, nonce: &Cell<u32>) -> String {
    nonce.set(nonce.get() + 1);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() % 1_000_000_000);
    format!("{name}-{t}-{}", nonce.get())
}

fn utf8(body: &[u8]) -> Result<String, TargetError> {
    String::from_utf8(body.to_vec()).map_err(|_| err("SQS bodies are text: body is not UTF-8"))
}

/// The receipt handles among a receive's ack tokens (queues; topics ack by member).
fn receipt_handles(acks: Vec<AckToken>) -> Vec<String> {
    acks.into_iter()
        .filter_map(|a| match a {
            AckToken::Text(h) => Some(h),
            _ => None,
        })
        .collect()
}

fn wait_seconds(wait: Duration) -> u32 {
    (wait.as_millis().div_ceil(1000)).min(20) as u32
}

// ------------------------------------------------------------------------------ QUIC (SDK)

/// Names of what `setup` created: the generator's name → queue URL or topic name.
#[derive(Default)]
struct Names {
    urls: RefCell<HashMap<String, String>>,
    topics: RefCell<HashMap<String, (String, u32)>>,
    nonce: Cell<u32>,
}

impl Names {
    fn url(&self, name: &str) -> Result<String, TargetError> {
        self.urls
            .borrow()
            .get(name)
            .cloned()
            .ok_or_else(|| err(format!("queue {name} was not set up")))
    }
    fn topic(&self, name: &str) -> Result<(String, u32), TargetError> {
        self.topics
            .borrow()
            .get(name)
            .cloned()
            .ok_or_else(|| err(format!("topic {name} was not set up")))
    }
}

pub struct SluiceQuic {
    addr: SocketAddr,
    cert: PathBuf,
    names: Rc<Names>,
    admin: RefCell<Option<Client>>,
    cpu: Option<CpuMeter>,
}

impl SluiceQuic {
    pub fn new(addr: SocketAddr, cert: PathBuf) -> SluiceQuic {
        SluiceQuic {
            addr,
            cert,
            names: Rc::default(),
            admin: RefCell::new(None),
            cpu: None,
        }
    }

    /// Reports the server's CPU from `cpu` (a broker this run can see).
    pub fn metered(mut self, cpu: Option<CpuMeter>) -> Self {
        self.cpu = cpu;
        self
    }

    async fn client(&self) -> Result<Client, TargetError> {
        Client::connect(
            self.addr,
            ClientOptions::new(Trust::PemFile(self.cert.clone())),
        )
        .await
        .map_err(err)
    }

    async fn admin(&self) -> Result<Client, TargetError> {
        if let Some(c) = self.admin.borrow().as_ref() {
            return Ok(c.clone());
        }
        let c = self.client().await?;
        *self.admin.borrow_mut() = Some(c.clone());
        Ok(c)
    }
}

impl Target for SluiceQuic {
    fn name(&self) -> String {
        "sluice-quic".into()
    }
    fn fsync_policy(&self) -> String {
        FSYNC_POLICY.into()
    }
    fn cpu_meter(&self) -> Option<CpuMeter> {
        self.cpu.clone()
    }
    fn supports(&self, _shape: &Shape) -> bool {
        true
    }
    fn setup<'a>(&'a self, name: &'a str, shape: &'a Shape) -> BoxFut<'a, ()> {
        Box::pin(async move {
            let admin = self.admin().await?;
            let real = fresh(name, &self.names.nonce);
            match shape {
                Shape::Standard => {
                    let url = admin.create_queue(&real).await.map_err(err)?;
                    self.names.urls.borrow_mut().insert(name.into(), url);
                }
                Shape::Fifo { .. } => {
                    let attrs = sluice_sdk::attributes([
                        ("FifoQueue", "true"),
                        ("ContentBasedDeduplication", "true"),
                    ]);
                    let url = admin
                        .create_queue_with(&format!("{real}.fifo"), attrs, BTreeMap::new())
                        .await
                        .map_err(err)?;
                    self.names.urls.borrow_mut().insert(name.into(), url);
                }
                Shape::Topic { partitions, .. } => {
                    let r = admin
                        .create_topic(CreateTopicRequest {
                            name: real.clone(),
                            partitions: *partitions,
                            ..Default::default()
                        })
                        .await
                        .map_err(err)?;
                    self.names
                        .topics
                        .borrow_mut()
                        .insert(name.into(), (real, r.partitions));
                }
            }
            Ok(())
        })
    }
    fn teardown<'a>(&'a self, name: &'a str, shape: &'a Shape) -> BoxFut<'a, ()> {
        Box::pin(async move {
            let admin = self.admin().await?;
            match shape {
                Shape::Topic { .. } => {
                    let (t, _) = self.names.topic(name)?;
                    admin.delete_topic(&t).await.map_err(err)
                }
                _ => {
                    let url = self.names.url(name)?;
                    admin.delete_queue(&url).await.map_err(err)
                }
            }
        })
    }
    fn connect(&self) -> BoxFut<'_, Box<dyn Conn>> {
        Box::pin(async move {
            let client = self.client().await?;
            Ok(Box::new(QuicConn {
                client,
                names: self.names.clone(),
                members: RefCell::default(),
            }) as Box<dyn Conn>)
        })
    }
}

type Member = Rc<tokio::sync::Mutex<GroupConsumer>>;

struct QuicConn {
    client: Client,
    names: Rc<Names>,
    /// Topic group members of this connection, per (topic name, group): a receive takes a free
    /// one (or joins a new one), so concurrent consumers on one connection are distinct members.
    members: RefCell<HashMap<(String, u32), Vec<Member>>>,
}

impl QuicConn {
    async fn send_queue(&self, url: &str, msgs: &[OutMsg]) -> Result<(), TargetError> {
        let sends = msgs.chunks(SQS_BATCH_MAX).map(|chunk| async move {
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    Ok(SendMessageBatchRequestEntry {
                        id: i.to_string(),
                        message_body: utf8(&m.body)?,
                        message_group_id: m.group.clone(),
                        ..Default::default()
                    })
                })
                .collect::<Result<Vec<_>, TargetError>>()?;
            let r = self.client.send_batch(url, entries).await.map_err(err)?;
            match r.failed.first() {
                None => Ok(()),
                Some(f) => Err(err(format!(
                    "{} of {} entries failed: code {} {}",
                    r.failed.len(),
                    chunk.len(),
                    f.code,
                    f.message.clone().unwrap_or_default()
                ))),
            }
        });
        futures::future::try_join_all(sends).await.map(|_| ())
    }

    async fn send_topic(
        &self,
        topic: &str,
        partitions: u32,
        msgs: &[OutMsg],
    ) -> Result<(), TargetError> {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        // Records go straight from the messages into each partition's batch (no owned copy).
        let mut by_partition: BTreeMap<u32, BatchBuilder> = BTreeMap::new();
        for (i, m) in msgs.iter().enumerate() {
            let p = match &m.group {
                Some(k) => partition_for_key(k.as_bytes(), partitions),
                None => i as u32 % partitions.max(1),
            };
            by_partition.entry(p).or_default().push_parts(
                now_ms,
                m.group.as_ref().map(|k| k.as_bytes()),
                &m.body,
                std::iter::empty(),
            );
        }
        let sends = by_partition.into_iter().map(|(p, b)| async move {
            let bytes = b.finish().ok_or_else(|| err("empty batch"))?;
            self.client
                .produce_batch(topic, Some(p), bytes)
                .await
                .map_err(err)
                .map(|_| ())
        });
        futures::future::try_join_all(sends).await.map(|_| ())
    }

    async fn receive_topic(
        &self,
        name: &str,
        group: u32,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<InMsg>, TargetError> {
        let (topic, _) = self.names.topic(name)?;
        let key = (name.to_string(), group);
        let free = self.members.borrow().get(&key).and_then(|v| {
            v.iter()
                .enumerate()
                .find(|(_, m)| m.try_lock().is_ok())
                .map(|(i, m)| (i, m.clone()))
        });
        let (idx, member) = match free {
            Some(f) => f,
            None => {
                if self.members.borrow().get(&key).map_or(0, Vec::len) >= MEMBERS_PER_CONN_MAX {
                    return Err(err("too many concurrent receives on one connection"));
                }
                let options = GroupConsumerOptions {
                    session_timeout: GROUP_SESSION,
                    max_records: max.max(1) as u32,
                    // Room for `max` records of up to 4 KiB (the SDK's default, 1 MiB, held a
                    // poll of 2 KiB records to ~500 whatever `receive_max` said).
                    max_bytes: (max.max(1) * 4096).clamp(1 << 20, FETCH_BYTES_MAX) as u32,
                    poll_wait: wait,
                    // The SDK's defaults: the next fetch of each partition in flight while
                    // the generator counts the last one; commits in the background.
                    ..GroupConsumerOptions::default()
                };
                let gc = GroupConsumer::join(
                    &self.client,
                    &format!("{topic}-g{group}"),
                    &[topic.as_str()],
                    options,
                )
                .await
                .map_err(err)?;
                let m = Rc::new(tokio::sync::Mutex::new(gc));
                let mut all = self.members.borrow_mut();
                let v = all.entry(key).or_default();
                v.push(m.clone());
                (v.len() - 1, m)
            }
        };
        let mut gc = member.lock().await;
        let recs = gc.poll().await.map_err(err)?;
        Ok(recs
            .into_iter()
            .map(|r| InMsg {
                body: r.value,
                ack: AckToken::Number(idx as u64),
            })
            .collect())
    }

    async fn ack_topic(
        &self,
        name: &str,
        group: u32,
        acks: Vec<AckToken>,
    ) -> Result<(), TargetError> {
        let Some(AckToken::Number(idx)) =
            acks.into_iter().find(|a| matches!(a, AckToken::Number(_)))
        else {
            return Ok(());
        };
        let member = self
            .members
            .borrow()
            .get(&(name.to_string(), group))
            .and_then(|v| v.get(idx as usize).cloned())
            .ok_or_else(|| err("ack for an unknown group member"))?;
        let mut gc = member.lock().await;
        // In the background, at most every `commit_interval` (a rebalance commits the
        // positions of what it moves at once, so nothing handed out is read twice).
        match gc.commit_if_due().await {
            Ok(()) => Ok(()),
            // A rebalance since the last heartbeat: the records will be read again by the new
            // owner (at-least-once; the generator counts them as duplicates).
            Err(e) if e.is_rebalance() => gc.heartbeat().await.map_err(err),
            Err(e) => Err(err(e)),
        }
    }
}

impl Conn for QuicConn {
    fn send<'a>(&'a self, name: &'a str, msgs: &'a [OutMsg]) -> BoxFut<'a, ()> {
        Box::pin(async move {
            if let Ok((topic, partitions)) = self.names.topic(name) {
                return self.send_topic(&topic, partitions, msgs).await;
            }
            let url = self.names.url(name)?;
            self.send_queue(&url, msgs).await
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
            if self.names.topic(name).is_ok() {
                return self.receive_topic(name, group, max, wait).await;
            }
            let url = self.names.url(name)?;
            let got = self
                .client
                .receive(
                    &url,
                    ReceiveOptions::long_poll(
                        max.clamp(1, SQS_BATCH_MAX) as u32,
                        wait_seconds(wait),
                    ),
                )
                .await
                .map_err(err)?;
            Ok(got
                .into_iter()
                .map(|m| InMsg {
                    body: m.body.into_bytes().into(),
                    ack: AckToken::Text(m.receipt_handle),
                })
                .collect())
        })
    }
    fn ack<'a>(&'a self, name: &'a str, group: u32, acks: Vec<AckToken>) -> BoxFut<'a, ()> {
        Box::pin(async move {
            if self.names.topic(name).is_ok() {
                return self.ack_topic(name, group, acks).await;
            }
            let url = self.names.url(name)?;
            let handles = receipt_handles(acks);
            let deletes = handles.chunks(SQS_BATCH_MAX).map(|chunk| {
                let url = &url;
                async move {
                    let r = self.client.delete_batch(url, chunk).await.map_err(err)?;
                    match r.failed.first() {
                        None => Ok(()),
                        Some(f) => Err(err(format!(
                            "{} deletes failed: code {} {}",
                            r.failed.len(),
                            f.code,
                            f.message.clone().unwrap_or_default()
                        ))),
                    }
                }
            });
            futures::future::try_join_all(deletes).await.map(|_| ())
        })
    }
}

// ------------------------------------------------------------------------------ SQS HTTP

pub struct SluiceHttp {
    addr: SocketAddr,
    names: Rc<Names>,
    cpu: Option<CpuMeter>,
}

impl SluiceHttp {
    pub fn new(addr: SocketAddr) -> SluiceHttp {
        SluiceHttp {
            addr,
            names: Rc::default(),
            cpu: None,
        }
    }

    /// Reports the server's CPU from `cpu` (a broker this run can see).
    pub fn metered(mut self, cpu: Option<CpuMeter>) -> Self {
        self.cpu = cpu;
        self
    }
}

impl Target for SluiceHttp {
    fn name(&self) -> String {
        "sluice-http".into()
    }
    fn fsync_policy(&self) -> String {
        FSYNC_POLICY.into()
    }
    fn cpu_meter(&self) -> Option<CpuMeter> {
        self.cpu.clone()
    }
    fn supports(&self, shape: &Shape) -> bool {
        !matches!(shape, Shape::Topic { .. })
    }
    fn setup<'a>(&'a self, name: &'a str, shape: &'a Shape) -> BoxFut<'a, ()> {
        Box::pin(async move {
            let mut c = HttpConn::connect(self.addr).await.map_err(err)?;
            let real = fresh(name, &self.names.nonce);
            let req = match shape {
                Shape::Standard => json!({"QueueName": real}),
                Shape::Fifo { .. } => json!({
                    "QueueName": format!("{real}.fifo"),
                    "Attributes": {"FifoQueue": "true", "ContentBasedDeduplication": "true"},
                }),
                Shape::Topic { .. } => return Err(err("sluice-http has no topics")),
            };
            let v = c.call("CreateQueue", &req).await.map_err(err)?;
            let url = v["QueueUrl"]
                .as_str()
                .ok_or_else(|| err("CreateQueue: no QueueUrl"))?;
            self.names.urls.borrow_mut().insert(name.into(), url.into());
            Ok(())
        })
    }
    fn teardown<'a>(&'a self, name: &'a str, _shape: &'a Shape) -> BoxFut<'a, ()> {
        Box::pin(async move {
            let url = self.names.url(name)?;
            let mut c = HttpConn::connect(self.addr).await.map_err(err)?;
            c.call("DeleteQueue", &json!({"QueueUrl": url}))
                .await
                .map_err(err)
                .map(|_| ())
        })
    }
    fn connect(&self) -> BoxFut<'_, Box<dyn Conn>> {
        Box::pin(async move {
            // One connection up front proves the address; more open as calls overlap.
            let first = HttpConn::connect(self.addr).await.map_err(err)?;
            Ok(Box::new(HttpTargetConn {
                addr: self.addr,
                names: self.names.clone(),
                pool: RefCell::new(vec![first]),
            }) as Box<dyn Conn>)
        })
    }
}

/// A client's connection pool (as the AWS SDKs keep): HTTP/1.1 carries one call at a time per
/// TCP connection, so overlapping calls take another connection (opened on demand, kept after).
struct HttpTargetConn {
    addr: SocketAddr,
    names: Rc<Names>,
    pool: RefCell<Vec<HttpConn>>,
}

impl HttpTargetConn {
    async fn call(&self, action: &str, body: &Value) -> Result<Value, TargetError> {
        let pooled = self.pool.borrow_mut().pop();
        let mut c = match pooled {
            Some(c) => c,
            None => HttpConn::connect(self.addr).await.map_err(err)?,
        };
        let r = c.call(action, body).await.map_err(err)?;
        // Only a connection whose call completed goes back (a failed one may be mid-answer).
        self.pool.borrow_mut().push(c);
        Ok(r)
    }
}

fn failed(v: &Value, action: &str) -> Result<(), TargetError> {
    match v["Failed"].as_array() {
        Some(f) if !f.is_empty() => Err(err(format!(
            "{action}: {} entries failed: {}",
            f.len(),
            f[0]
        ))),
        _ => Ok(()),
    }
}

impl Conn for HttpTargetConn {
    fn send<'a>(&'a self, name: &'a str, msgs: &'a [OutMsg]) -> BoxFut<'a, ()> {
        Box::pin(async move {
            let url = self.names.url(name)?;
            let sends = msgs.chunks(SQS_BATCH_MAX).map(|chunk| {
                let url = &url;
                async move {
                    let entries = chunk
                        .iter()
                        .enumerate()
                        .map(|(i, m)| {
                            let mut e = json!({"Id": i.to_string(), "MessageBody": utf8(&m.body)?});
                            if let Some(g) = &m.group {
                                e["MessageGroupId"] = json!(g);
                            }
                            Ok(e)
                        })
                        .collect::<Result<Vec<_>, TargetError>>()?;
                    let v = self
                        .call(
                            "SendMessageBatch",
                            &json!({"QueueUrl": url, "Entries": entries}),
                        )
                        .await?;
                    failed(&v, "SendMessageBatch")
                }
            });
            futures::future::try_join_all(sends).await.map(|_| ())
        })
    }
    fn receive<'a>(
        &'a self,
        name: &'a str,
        _group: u32,
        max: usize,
        wait: Duration,
    ) -> BoxFut<'a, Vec<InMsg>> {
        Box::pin(async move {
            let url = self.names.url(name)?;
            let v = self
                .call(
                    "ReceiveMessage",
                    &json!({
                        "QueueUrl": url,
                        "MaxNumberOfMessages": max.clamp(1, SQS_BATCH_MAX),
                        "WaitTimeSeconds": wait_seconds(wait),
                    }),
                )
                .await?;
            let mut out = Vec::new();
            for m in v["Messages"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
                let (Some(body), Some(handle)) = (m["Body"].as_str(), m["ReceiptHandle"].as_str())
                else {
                    return Err(err(
                        "ReceiveMessage: a message without Body or ReceiptHandle",
                    ));
                };
                out.push(InMsg {
                    body: bytes::Bytes::copy_from_slice(body.as_bytes()),
                    ack: AckToken::Text(handle.to_string()),
                });
            }
            Ok(out)
        })
    }
    fn ack<'a>(&'a self, name: &'a str, _group: u32, acks: Vec<AckToken>) -> BoxFut<'a, ()> {
        Box::pin(async move {
            let url = self.names.url(name)?;
            let handles = receipt_handles(acks);
            let deletes = handles.chunks(SQS_BATCH_MAX).map(|chunk| {
                let url = &url;
                async move {
                    let entries: Vec<Value> = chunk
                        .iter()
                        .enumerate()
                        .map(|(i, h)| json!({"Id": i.to_string(), "ReceiptHandle": h}))
                        .collect();
                    let v = self
                        .call(
                            "DeleteMessageBatch",
                            &json!({"QueueUrl": url, "Entries": entries}),
                        )
                        .await?;
                    failed(&v, "DeleteMessageBatch")
                }
            });
            futures::future::try_join_all(deletes).await.map(|_| ())
        })
    }
}
