//! RabbitMQ quorum queues (Debian's rabbitmq-server 3.10, one node). Every queue or topic
//! `name` is a durable fanout exchange `name`; consumer group `g` reads quorum queue
//! `name.g<g>` bound to it (a standard queue is `name.g0` alone with competing consumers; a
//! topic has one quorum queue per group, so every record is written once per group — RabbitMQ
//! streams would share one log, but their consumers don't ack per message). Publishes wait for
//! publisher confirms; consumers use basic.consume with a prefetch (basic.qos) and manual acks.
//! FIFO groups have no mapping (a quorum queue orders the whole queue, not per group).
//!
//! The node is started as a child process with everything under its own directory: node name,
//! Erlang cookie (HOME), mnesia and log dirs, config, an empty plugin list, and an epmd of its
//! own on a free loopback port, so it neither sees nor disturbs a system RabbitMQ.

use super::process::{find_binary, free_port, own_dir, probe_tcp, Server};
use super::Started;
use super::{group_name, PREFETCH_MESSAGES};
use crate::cpu::CpuMeter;
use crate::target::{AckToken, BoxFut, Conn, InMsg, OutMsg, Shape, Target, TargetError};
use futures::{FutureExt, StreamExt};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use std::collections::HashMap;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::rc::Rc;
use std::time::Duration;

/// A cold Erlang VM boots RabbitMQ in 5–15 s on this machine; a loaded one takes longer.
const START_TIMEOUT: Duration = Duration::from_secs(90);
const SERVER: &str = "/usr/lib/rabbitmq/bin/rabbitmq-server";
/// AMQP 0-9-1 protocol header; a ready broker answers with a connection.start method frame.
const AMQP_HEADER: &[u8] = b"AMQP\x00\x00\x09\x01";
/// Frame type 1 (method), channel 0, then the size and class 10 (connection), method 10 (start).
const CONNECTION_START: &[u8] = &[1, 0, 0];

pub(super) fn start(work_dir: &Path) -> Result<Started, TargetError> {
    let server_bin = find_binary(&[SERVER, "rabbitmq-server"])?;
    let epmd_bin = find_binary(&["epmd", "/usr/lib/erlang/bin/epmd"])?;
    let dir = own_dir(work_dir, "rabbitmq-quorum")?;
    let io = |e: std::io::Error| TargetError(format!("rabbitmq setup: {e}"));
    let (amqp_port, dist_port, epmd_port) = (free_port()?, free_port()?, free_port()?);
    if amqp_port == dist_port || dist_port == epmd_port || amqp_port == epmd_port {
        return Err(TargetError(
            "rabbitmq: could not find three free ports".into(),
        ));
    }
    let home = dir.join("home");
    fs::create_dir_all(&home).map_err(io)?;
    // The cookie only has to match between this node and nothing else: a fixed per-run value.
    let cookie = home.join(".erlang.cookie");
    fs::write(&cookie, format!("SLUICEPERF{}", std::process::id())).map_err(io)?;
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&cookie, fs::Permissions::from_mode(0o400)).map_err(io)?;
    }
    let conf = dir.join("rabbitmq.conf");
    fs::write(
        &conf,
        format!(
            "listeners.tcp.default = 127.0.0.1:{amqp_port}\n\
             loopback_users = none\n\
             log.console = false\n\
             log.file.level = warning\n"
        ),
    )
    .map_err(io)?;
    fs::write(dir.join("enabled_plugins"), "[].\n").map_err(io)?;
    fs::write(dir.join("rabbitmq-env.conf"), "").map_err(io)?;

    let env: Vec<(&str, String)> = vec![
        ("HOME", home.display().to_string()),
        ("ERL_EPMD_PORT", epmd_port.to_string()),
        ("ERL_EPMD_ADDRESS", "127.0.0.1".into()),
        (
            "RABBITMQ_NODENAME",
            format!("sluiceperf{amqp_port}@localhost"),
        ),
        ("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1".into()),
        ("RABBITMQ_NODE_PORT", amqp_port.to_string()),
        ("RABBITMQ_DIST_PORT", dist_port.to_string()),
        (
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS",
            "-kernel inet_dist_use_interface {127,0,0,1}".into(),
        ),
        (
            "RABBITMQ_MNESIA_BASE",
            dir.join("mnesia").display().to_string(),
        ),
        ("RABBITMQ_LOG_BASE", dir.join("log").display().to_string()),
        ("RABBITMQ_CONFIG_FILE", conf.display().to_string()),
        (
            "RABBITMQ_ADVANCED_CONFIG_FILE",
            dir.join("advanced.config").display().to_string(),
        ),
        (
            "RABBITMQ_ENABLED_PLUGINS_FILE",
            dir.join("enabled_plugins").display().to_string(),
        ),
        (
            "RABBITMQ_CONF_ENV_FILE",
            dir.join("rabbitmq-env.conf").display().to_string(),
        ),
        (
            "RABBITMQ_PLUGINS_EXPAND_DIR",
            dir.join("plugins-expand").display().to_string(),
        ),
        (
            "RABBITMQ_PID_FILE",
            dir.join("rabbitmq.pid").display().to_string(),
        ),
    ];

    // Our own epmd, in the foreground so that the guard stops it (the one rabbitmq-server
    // would start daemonizes and outlives it). Dropped after the node (field order below).
    let mut epmd_cmd = Command::new(epmd_bin);
    epmd_cmd
        .args(["-port", &epmd_port.to_string(), "-address", "127.0.0.1"])
        .env("ERL_EPMD_PORT", epmd_port.to_string());
    let mut epmd = Server::spawn("epmd", epmd_cmd, dir.join("epmd.log"), None)?;
    epmd.wait_ready(Duration::from_secs(10), || {
        probe_tcp(epmd_port, b"", b"") // accepting connections
    })?;

    let mut cmd = Command::new(server_bin);
    cmd.current_dir(&dir).envs(env);
    let mut node = Server::spawn("rabbitmq-server", cmd, dir.join("server.log"), Some(dir))?;
    let ready = node.wait_ready(START_TIMEOUT, || {
        probe_tcp(amqp_port, AMQP_HEADER, CONNECTION_START)
    });
    // The node's group (its shell, the Erlang VM and the VM's helpers) and epmd's.
    let cpu = CpuMeter::Groups(vec![node.group(), epmd.group()]);
    let guard = RabbitGuard {
        _node: node,
        _epmd: epmd,
    };
    ready?;
    let target = RabbitTarget {
        uri: format!("amqp://guest:guest@127.0.0.1:{amqp_port}/%2f"),
        cpu,
    };
    Ok((Box::new(guard), Box::new(target)))
}

/// Stops the node first (SIGTERM to its group: rabbitmq-server's shell forwards it to the VM,
/// which shuts down cleanly), then its epmd: fields drop in declaration order.
struct RabbitGuard {
    _node: Server,
    _epmd: Server,
}

fn err(what: &str, e: impl std::fmt::Display) -> TargetError {
    TargetError(format!("rabbitmq {what}: {e}"))
}

fn queue_name(name: &str, group: u32) -> String {
    format!("{name}.{}", group_name(group))
}

struct RabbitTarget {
    uri: String,
    cpu: CpuMeter,
}

async fn connect(uri: &str) -> Result<Connection, TargetError> {
    Connection::connect(uri, ConnectionProperties::default())
        .await
        .map_err(|e| err("connect", e))
}

impl Target for RabbitTarget {
    fn name(&self) -> String {
        "rabbitmq-quorum".into()
    }

    fn cpu_meter(&self) -> Option<CpuMeter> {
        Some(self.cpu.clone())
    }

    fn fsync_policy(&self) -> String {
        "fdatasync before every confirm (quorum queue: Ra's WAL is written and fdatasynced per \
         batch before the entry commits and the publisher confirm is sent; one node)"
            .into()
    }

    fn supports(&self, shape: &Shape) -> bool {
        !matches!(shape, Shape::Fifo { .. })
    }

    /// The adapter's consumer holds messages the server pushed ahead (prefetch).
    fn receive_is_a_request(&self) -> bool {
        false
    }

    fn setup<'a>(&'a self, name: &'a str, shape: &'a Shape) -> BoxFut<'a, ()> {
        Box::pin(async move {
            let groups = match shape {
                Shape::Standard => 1,
                Shape::Topic { groups, .. } => *groups,
                Shape::Fifo { .. } => return Err(TargetError("rabbitmq: FIFO unsupported".into())),
            };
            let conn = connect(&self.uri).await?;
            let ch = conn.create_channel().await.map_err(|e| err("channel", e))?;
            delete(&ch, name, groups).await?;
            ch.exchange_declare(
                name.into(),
                ExchangeKind::Fanout,
                ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| err("exchange.declare", e))?;
            let mut quorum = FieldTable::default();
            quorum.insert(
                "x-queue-type".into(),
                AMQPValue::LongString("quorum".into()),
            );
            for group in 0..groups {
                let q = queue_name(name, group);
                ch.queue_declare(
                    q.as_str().into(),
                    QueueDeclareOptions {
                        durable: true,
                        ..Default::default()
                    },
                    quorum.clone(),
                )
                .await
                .map_err(|e| err("queue.declare", e))?;
                ch.queue_bind(
                    q.as_str().into(),
                    name.into(),
                    "".into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(|e| err("queue.bind", e))?;
            }
            let _ = conn.close(200, "setup done".into()).await;
            Ok(())
        })
    }

    fn teardown<'a>(&'a self, name: &'a str, shape: &'a Shape) -> BoxFut<'a, ()> {
        Box::pin(async move {
            let groups = match shape {
                Shape::Topic { groups, .. } => *groups,
                _ => 1,
            };
            let conn = connect(&self.uri).await?;
            let ch = conn.create_channel().await.map_err(|e| err("channel", e))?;
            delete(&ch, name, groups).await?;
            let _ = conn.close(200, "teardown done".into()).await;
            Ok(())
        })
    }

    fn connect(&self) -> BoxFut<'_, Box<dyn Conn>> {
        Box::pin(async move {
            let conn = connect(&self.uri).await?;
            let publish = conn.create_channel().await.map_err(|e| err("channel", e))?;
            publish
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(|e| err("confirm.select", e))?;
            Ok(Box::new(RabbitConn {
                conn,
                publish,
                consumers: futures::lock::Mutex::new(HashMap::new()),
            }) as Box<dyn Conn>)
        })
    }
}

/// Deletes the exchange and the group queues (absent ones are no error in AMQP 0-9-1).
async fn delete(ch: &Channel, name: &str, groups: u32) -> Result<(), TargetError> {
    for group in 0..groups {
        ch.queue_delete(
            queue_name(name, group).as_str().into(),
            QueueDeleteOptions::default(),
        )
        .await
        .map_err(|e| err("queue.delete", e))?;
    }
    ch.exchange_delete(name.into(), ExchangeDeleteOptions::default())
        .await
        .map_err(|e| err("exchange.delete", e))?;
    Ok(())
}

/// One consumer (its own channel, so delivery tags are per consumer) per (queue, group).
struct Consuming {
    channel: Channel,
    consumer: futures::lock::Mutex<lapin::Consumer>,
}

struct RabbitConn {
    conn: Connection,
    /// In confirm mode; shared by every send on this connection.
    publish: Channel,
    consumers: futures::lock::Mutex<HashMap<(String, u32), Rc<Consuming>>>,
}

impl RabbitConn {
    async fn consuming(&self, name: &str, group: u32) -> Result<Rc<Consuming>, TargetError> {
        let mut consumers = self.consumers.lock().await;
        if let Some(c) = consumers.get(&(name.to_string(), group)) {
            return Ok(c.clone());
        }
        let channel = self
            .conn
            .create_channel()
            .await
            .map_err(|e| err("channel", e))?;
        channel
            .basic_qos(PREFETCH_MESSAGES, BasicQosOptions::default())
            .await
            .map_err(|e| err("basic.qos", e))?;
        let consumer = channel
            .basic_consume(
                queue_name(name, group).as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| err("basic.consume", e))?;
        let c = Rc::new(Consuming {
            channel,
            consumer: futures::lock::Mutex::new(consumer),
        });
        consumers.insert((name.to_string(), group), c.clone());
        Ok(c)
    }
}

impl RabbitConn {
    async fn forget(&self, name: &str, group: u32) {
        self.consumers
            .lock()
            .await
            .remove(&(name.to_string(), group));
    }
}

fn in_msg(d: lapin::message::Delivery) -> InMsg {
    InMsg {
        ack: AckToken::Number(d.delivery_tag),
        body: d.data.into(),
    }
}

impl Conn for RabbitConn {
    fn send<'a>(&'a self, name: &'a str, msgs: &'a [OutMsg]) -> BoxFut<'a, ()> {
        Box::pin(async move {
            // Pipelined: every publish goes out before the first confirm is awaited.
            let mut confirms = Vec::with_capacity(msgs.len());
            for m in msgs {
                let confirm = self
                    .publish
                    .basic_publish(
                        name.into(),
                        "".into(),
                        BasicPublishOptions::default(),
                        &m.body,
                        BasicProperties::default().with_delivery_mode(2),
                    )
                    .await
                    .map_err(|e| err("basic.publish", e))?;
                confirms.push(confirm);
            }
            for c in futures::future::join_all(confirms).await {
                let c = c.map_err(|e| err("confirm", e))?;
                if !c.is_ack() {
                    return Err(TargetError("rabbitmq: publish nacked".into()));
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
            let consuming = self.consuming(name, group).await?;
            let mut consumer = consuming.consumer.lock().await;
            let mut out = Vec::new();
            let first = match tokio::time::timeout(wait, consumer.next()).await {
                Err(_) => return Ok(out),
                Ok(first) => first,
            };
            let mut next = Some(first);
            while let Some(item) = next.take() {
                match item {
                    Some(Ok(d)) => out.push(in_msg(d)),
                    // Cancelled (the queue was deleted by a teardown) or its channel failed:
                    // forget this consumer so a later setup of the same name works on this
                    // connection; what was received but not acked is requeued by the broker.
                    Some(Err(e)) => {
                        self.forget(name, group).await;
                        return Err(err("delivery", e));
                    }
                    None => {
                        self.forget(name, group).await;
                        return Err(TargetError("rabbitmq: consumer cancelled".into()));
                    }
                }
                if out.len() < max {
                    next = consumer.next().now_or_never();
                }
            }
            Ok(out)
        })
    }

    fn ack<'a>(&'a self, name: &'a str, group: u32, acks: Vec<AckToken>) -> BoxFut<'a, ()> {
        Box::pin(async move {
            let consuming = self.consuming(name, group).await?;
            let mut sent = Vec::with_capacity(acks.len());
            for a in acks {
                let AckToken::Number(tag) = a else {
                    return Err(TargetError("rabbitmq: foreign ack token".into()));
                };
                sent.push(consuming.channel.basic_ack(tag, BasicAckOptions::default()));
            }
            for r in futures::future::join_all(sent).await {
                r.map_err(|e| err("basic.ack", e))?;
            }
            Ok(())
        })
    }
}
