//! `sluice-kafka`: Sluice's topics through its Kafka listener (`broker/src/kafka/`), driven by
//! librdkafka — the C client behind kcat, confluent-kafka (Python, Go, .NET) and most Kafka
//! tooling — through the `rdkafka` crate, linked to the system's librdkafka (Debian's
//! `librdkafka-dev`; built only with the `kafka` feature, `perf/README.md` says why).
//!
//! Configured as a Kafka application of this decade runs by default: an idempotent producer
//! with `acks=all` (Sluice answers after fdatasync), librdkafka's own batching (`linger.ms`),
//! no compression (Sluice refuses compressed batches); consumers in a consumer group
//! (`subscribe`, client-side assignment), reading from the earliest offset, committing their
//! offsets after every poll as the QUIC target's group members do. One producer per
//! connection (a librdkafka instance each), one consumer instance per group member.

use crate::cpu::CpuMeter;
use crate::sluice::FSYNC_POLICY;
use crate::target::{AckToken, BoxFut, Conn, InMsg, OutMsg, Shape, Target, TargetError};
use futures::{FutureExt, StreamExt};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Group members one connection may hold per (topic, group).
const MEMBERS_PER_CONN_MAX: usize = 64;
/// How long a send waits for room in librdkafka's queue before it fails.
const QUEUE_FULL_WAIT_MAX: Duration = Duration::from_secs(10);
/// Session of group members: short, so that members joining at the start of a run settle
/// within the warm-up (the QUIC target's members use 3 s).
const SESSION_TIMEOUT_MS: &str = "6000";
const HEARTBEAT_INTERVAL_MS: &str = "1000";
/// librdkafka's batching delay (its default since 1.5; set so that a newer default does not
/// change the comparison silently).
const LINGER_MS: &str = "5";

fn err(e: impl std::fmt::Display) -> TargetError {
    TargetError::new(e)
}

/// Sluice's Kafka listener at `bootstrap` (`host:port`).
pub struct SluiceKafka {
    bootstrap: String,
    /// The generator's name → the topic `setup` created.
    topics: Rc<RefCell<HashMap<String, String>>>,
    nonce: Cell<u32>,
    admin: AdminClient<DefaultClientContext>,
    cpu: Option<CpuMeter>,
}

impl SluiceKafka {
    pub fn new(bootstrap: String) -> Result<SluiceKafka, TargetError> {
        let admin = base_config(&bootstrap).create().map_err(err)?;
        Ok(SluiceKafka {
            bootstrap,
            topics: Rc::default(),
            nonce: Cell::new(0),
            admin,
            cpu: None,
        })
    }

    /// Reports the server's CPU from `cpu` (a broker this run can see).
    pub fn metered(mut self, cpu: Option<CpuMeter>) -> Self {
        self.cpu = cpu;
        self
    }
}

fn base_config(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4");
    c
}

fn topic_of(topics: &RefCell<HashMap<String, String>>, name: &str) -> Result<String, TargetError> {
    topics
        .borrow()
        .get(name)
        .cloned()
        .ok_or_else(|| err(format!("topic {name} was not set up")))
}

impl Target for SluiceKafka {
    fn name(&self) -> String {
        "sluice-kafka".into()
    }
    fn fsync_policy(&self) -> String {
        FSYNC_POLICY.into()
    }
    fn cpu_meter(&self) -> Option<CpuMeter> {
        self.cpu.clone()
    }
    fn supports(&self, shape: &Shape) -> bool {
        matches!(shape, Shape::Topic { .. })
    }
    /// librdkafka prefetches into its own queue: a receive reads what the client fetched ahead.
    fn receive_is_a_request(&self) -> bool {
        false
    }
    fn setup<'a>(&'a self, name: &'a str, shape: &'a Shape) -> BoxFut<'a, ()> {
        Box::pin(async move {
            let Shape::Topic { partitions, .. } = shape else {
                return Err(err("sluice-kafka runs topics only"));
            };
            self.nonce.set(self.nonce.get() + 1);
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() % 1_000_000_000);
            let real = format!("{name}-{t}-{}", self.nonce.get());
            let partitions = i32::try_from(*partitions).map_err(err)?;
            let topic = NewTopic::new(&real, partitions, TopicReplication::Fixed(1));
            let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
            for r in self
                .admin
                .create_topics([&topic], &opts)
                .await
                .map_err(err)?
            {
                r.map_err(|(t, e)| err(format!("create topic {t}: {e}")))?;
            }
            self.topics.borrow_mut().insert(name.into(), real);
            Ok(())
        })
    }
    fn teardown<'a>(&'a self, name: &'a str, _shape: &'a Shape) -> BoxFut<'a, ()> {
        Box::pin(async move {
            let real = topic_of(&self.topics, name)?;
            let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
            for r in self
                .admin
                .delete_topics(&[real.as_str()], &opts)
                .await
                .map_err(err)?
            {
                r.map_err(|(t, e)| err(format!("delete topic {t}: {e}")))?;
            }
            Ok(())
        })
    }
    fn connect(&self) -> BoxFut<'_, Box<dyn Conn>> {
        Box::pin(async move {
            let producer: FutureProducer = base_config(&self.bootstrap)
                .set("acks", "all")
                .set("enable.idempotence", "true")
                .set("compression.type", "none")
                .set("linger.ms", LINGER_MS)
                .create()
                .map_err(err)?;
            Ok(Box::new(KafkaConn {
                bootstrap: self.bootstrap.clone(),
                topics: self.topics.clone(),
                producer,
                members: RefCell::default(),
            }) as Box<dyn Conn>)
        })
    }
}

type Member = Rc<tokio::sync::Mutex<StreamConsumer>>;

struct KafkaConn {
    bootstrap: String,
    topics: Rc<RefCell<HashMap<String, String>>>,
    producer: FutureProducer,
    /// Group members of this connection, per (topic name, group): a receive takes a free one
    /// (or starts a new one), so concurrent consumers on one connection are distinct members.
    members: RefCell<HashMap<(String, u32), Vec<Member>>>,
}

impl KafkaConn {
    fn member(
        &self,
        name: &str,
        topic: &str,
        group: u32,
        wait: Duration,
    ) -> Result<(usize, Member), TargetError> {
        let key = (name.to_string(), group);
        let free = self.members.borrow().get(&key).and_then(|v| {
            v.iter()
                .enumerate()
                .find(|(_, m)| m.try_lock().is_ok())
                .map(|(i, m)| (i, m.clone()))
        });
        if let Some(f) = free {
            return Ok(f);
        }
        if self.members.borrow().get(&key).map_or(0, Vec::len) >= MEMBERS_PER_CONN_MAX {
            return Err(err("too many concurrent receives on one connection"));
        }
        let wait_ms = wait.as_millis().clamp(1, 500).to_string();
        let consumer: StreamConsumer = base_config(&self.bootstrap)
            .set("group.id", format!("{topic}-g{group}"))
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", SESSION_TIMEOUT_MS)
            .set("heartbeat.interval.ms", HEARTBEAT_INTERVAL_MS)
            // The broker's long poll: as long as the generator's receive waits.
            .set("fetch.wait.max.ms", wait_ms)
            .create()
            .map_err(err)?;
        consumer.subscribe(&[topic]).map_err(err)?;
        let m = Rc::new(tokio::sync::Mutex::new(consumer));
        let mut all = self.members.borrow_mut();
        let v = all.entry(key).or_default();
        v.push(m.clone());
        Ok((v.len() - 1, m))
    }
}

impl Conn for KafkaConn {
    fn send<'a>(&'a self, name: &'a str, msgs: &'a [OutMsg]) -> BoxFut<'a, ()> {
        Box::pin(async move {
            let topic = topic_of(&self.topics, name)?;
            let mut deliveries = Vec::with_capacity(msgs.len());
            for m in msgs {
                let mut record = FutureRecord::to(&topic).payload(m.body.as_slice());
                if let Some(k) = &m.group {
                    record = record.key(k.as_str());
                }
                let give_up = Instant::now() + QUEUE_FULL_WAIT_MAX;
                loop {
                    match self.producer.send_result(record) {
                        Ok(d) => {
                            deliveries.push(d);
                            break;
                        }
                        Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r))
                            if Instant::now() < give_up =>
                        {
                            record = r;
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                        Err((e, _)) => return Err(err(format!("produce: {e}"))),
                    }
                }
            }
            for d in futures::future::join_all(deliveries).await {
                match d {
                    Ok(Ok(_)) => {}
                    Ok(Err((e, _))) => return Err(err(format!("delivery: {e}"))),
                    Err(_) => return Err(err("delivery: the producer went away")),
                }
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
            let topic = topic_of(&self.topics, name)?;
            let (idx, member) = self.member(name, &topic, group, wait)?;
            let consumer = member.lock().await;
            let mut stream = consumer.stream();
            let mut out = Vec::new();
            let Ok(first) = tokio::time::timeout(wait, stream.next()).await else {
                return Ok(out);
            };
            let mut next = first;
            loop {
                match next {
                    Some(Ok(m)) => out.push(InMsg {
                        body: bytes::Bytes::copy_from_slice(m.payload().unwrap_or_default()),
                        ack: AckToken::Number(idx as u64),
                    }),
                    Some(Err(e)) => return Err(err(format!("consume: {e}"))),
                    None => break,
                }
                if out.len() >= max {
                    break;
                }
                // Whatever else librdkafka holds already, without waiting.
                match stream.next().now_or_never() {
                    Some(n) => next = n,
                    None => break,
                }
            }
            Ok(out)
        })
    }
    fn ack<'a>(&'a self, name: &'a str, group: u32, acks: Vec<AckToken>) -> BoxFut<'a, ()> {
        Box::pin(async move {
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
            let consumer = member.lock().await;
            // The offsets librdkafka stored as it handed the messages over; asynchronous, as
            // Kafka applications commit (the answer comes back on librdkafka's own thread).
            match consumer.commit_consumer_state(CommitMode::Async) {
                Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => Ok(()),
                Err(e) => Err(err(format!("commit: {e}"))),
            }
        })
    }
}
