//! Redis Streams (Debian's redis-server 7.0), AOF on, RDB snapshots off, run twice:
//! `appendfsync always` and `appendfsync everysec`. A queue or topic is one stream key (Redis
//! Streams have no partitions). Sends are XADDs pipelined per batch; consumer group `g<n>` reads
//! with XREADGROUP ... BLOCK (a standard queue is group `g0` with competing consumers; a topic
//! has one group per consumer group, fan-out). Acks are XACK, plus XDEL for queues, so an acked
//! queue message is deleted as in SQS; topic entries stay (retention), in memory, for the run.
//! XREADGROUP BLOCK holds its connection, so each concurrent receive uses a connection of its own
//! from a small per-Conn pool; sends and acks share one multiplexed connection.

use super::group_name;
use super::process::{find_binary, free_port, own_dir, probe_tcp, Server};
use super::Started;
use crate::cpu::CpuMeter;
use crate::target::{AckToken, BoxFut, Conn, InMsg, OutMsg, Shape, Target, TargetError};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Value};
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// redis-server starts in milliseconds; this bounds a broken start.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// A reply not back within this is an error (longer than any BLOCK a scenario asks for).
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);
/// The field each entry's body is stored under.
const BODY_FIELD: &str = "b";

#[derive(Debug, Clone, Copy)]
pub(super) enum AppendFsync {
    Always,
    EverySec,
}

impl AppendFsync {
    fn arg(self) -> &'static str {
        match self {
            AppendFsync::Always => "always",
            AppendFsync::EverySec => "everysec",
        }
    }
}

pub(super) fn start(work_dir: &Path, fsync: AppendFsync) -> Result<Started, TargetError> {
    let bin = find_binary(&["redis-server"])?;
    let peer = format!("redis-{}", fsync.arg());
    let dir = own_dir(work_dir, &peer)?;
    let port = free_port()?;
    let mut cmd = Command::new(bin);
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .arg("--dir")
        .arg(&dir)
        .args(["--appendonly", "yes", "--appendfsync", fsync.arg()])
        .args(["--save", "", "--daemonize", "no", "--protected-mode", "yes"]);
    let mut server = Server::spawn("redis-server", cmd, dir.join("server.log"), Some(dir))?;
    server.wait_ready(START_TIMEOUT, || probe_tcp(port, b"PING\r\n", b"+PONG"))?;
    let client =
        redis::Client::open(format!("redis://127.0.0.1:{port}/")).map_err(|e| err("client", e))?;
    let target = RedisTarget {
        name: peer,
        fsync,
        client,
        delete_on_ack: Arc::new(Mutex::new(HashMap::new())),
        cpu: CpuMeter::Groups(vec![server.group()]),
    };
    Ok((Box::new(server), Box::new(target)))
}

fn err(what: &str, e: impl std::fmt::Display) -> TargetError {
    TargetError(format!("redis {what}: {e}"))
}

struct RedisTarget {
    name: String,
    fsync: AppendFsync,
    client: redis::Client,
    /// Per key: whether an ack also deletes the entry (queues yes, topics no). Set by `setup`.
    delete_on_ack: Arc<Mutex<HashMap<String, bool>>>,
    cpu: CpuMeter,
}

async fn connection(client: &redis::Client) -> Result<MultiplexedConnection, TargetError> {
    let config = AsyncConnectionConfig::new().set_response_timeout(Some(RESPONSE_TIMEOUT));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| err("connect", e))
}

impl Target for RedisTarget {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn cpu_meter(&self) -> Option<CpuMeter> {
        Some(self.cpu.clone())
    }

    fn fsync_policy(&self) -> String {
        match self.fsync {
            AppendFsync::Always => "fdatasync of the AOF before every reply (appendfsync always; \
                                    one fdatasync per event-loop pass covers its commands)"
                .into(),
            AppendFsync::EverySec => "no fsync before ack (appendfsync everysec: the AOF is \
                                      written before the reply and fdatasynced once per second)"
                .into(),
        }
    }

    fn supports(&self, shape: &Shape) -> bool {
        !matches!(shape, Shape::Fifo { .. })
    }

    fn setup<'a>(&'a self, name: &'a str, shape: &'a Shape) -> BoxFut<'a, ()> {
        Box::pin(async move {
            let (groups, delete) = match shape {
                Shape::Standard => (1, true),
                Shape::Topic { groups, .. } => (*groups, false),
                Shape::Fifo { .. } => return Err(TargetError("redis: FIFO unsupported".into())),
            };
            let mut c = connection(&self.client).await?;
            let mut pipe = redis::pipe();
            pipe.cmd("DEL").arg(name).ignore();
            for group in 0..groups {
                pipe.cmd("XGROUP")
                    .arg("CREATE")
                    .arg(name)
                    .arg(group_name(group))
                    .arg("0")
                    .arg("MKSTREAM")
                    .ignore();
            }
            pipe.query_async::<()>(&mut c)
                .await
                .map_err(|e| err("setup", e))?;
            self.delete_on_ack
                .lock()
                .expect("delete_on_ack lock poisoned")
                .insert(name.to_string(), delete);
            Ok(())
        })
    }

    fn teardown<'a>(&'a self, name: &'a str, _shape: &'a Shape) -> BoxFut<'a, ()> {
        Box::pin(async move {
            let mut c = connection(&self.client).await?;
            redis::cmd("DEL")
                .arg(name)
                .query_async::<()>(&mut c)
                .await
                .map_err(|e| err("teardown", e))?;
            Ok(())
        })
    }

    fn connect(&self) -> BoxFut<'_, Box<dyn Conn>> {
        Box::pin(async move {
            static CONNS: AtomicU64 = AtomicU64::new(0);
            let cmd = connection(&self.client).await?;
            Ok(Box::new(RedisConn {
                id: CONNS.fetch_add(1, Ordering::Relaxed),
                client: self.client.clone(),
                cmd,
                readers: RefCell::new(Vec::new()),
                readers_made: RefCell::new(0),
                delete_on_ack: self.delete_on_ack.clone(),
            }) as Box<dyn Conn>)
        })
    }
}

struct RedisConn {
    id: u64,
    client: redis::Client,
    /// Sends and acks (pipelined, never blocking).
    cmd: MultiplexedConnection,
    /// Idle connections for blocking reads, each with its consumer name.
    readers: RefCell<Vec<(MultiplexedConnection, String)>>,
    readers_made: RefCell<u64>,
    delete_on_ack: Arc<Mutex<HashMap<String, bool>>>,
}

impl RedisConn {
    async fn reader(&self) -> Result<(MultiplexedConnection, String), TargetError> {
        if let Some(r) = self.readers.borrow_mut().pop() {
            return Ok(r);
        }
        let n = {
            let mut made = self.readers_made.borrow_mut();
            *made += 1;
            *made
        };
        let c = connection(&self.client).await?;
        Ok((c, format!("c{}-{n}", self.id)))
    }
}

fn bytes(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.clone().into_bytes()),
        _ => None,
    }
}

/// The pairs of an array or map reply, as a list of (key, value).
fn pairs(v: Value) -> Vec<(Value, Value)> {
    match v {
        Value::Map(m) => m,
        Value::Array(a) => {
            let mut out = Vec::with_capacity(a.len() / 2);
            let mut it = a.into_iter();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                out.push((k, v));
            }
            out
        }
        _ => Vec::new(),
    }
}

/// XREADGROUP's reply: nil on timeout, else streams → entries → [id, [field, value, ...]].
fn parse_entries(reply: Value) -> Result<Vec<InMsg>, TargetError> {
    let mut out = Vec::new();
    let streams = match reply {
        Value::Nil => return Ok(out),
        Value::Map(m) => m,
        Value::Array(a) => a
            .into_iter()
            .filter_map(|s| match s {
                Value::Array(mut kv) if kv.len() == 2 => {
                    let v = kv.pop().expect("len 2");
                    let k = kv.pop().expect("len 2");
                    Some((k, v))
                }
                _ => None,
            })
            .collect(),
        other => return Err(TargetError(format!("redis: XREADGROUP reply {other:?}"))),
    };
    for (_key, entries) in streams {
        let Value::Array(entries) = entries else {
            continue;
        };
        for entry in entries {
            let Value::Array(mut parts) = entry else {
                continue;
            };
            if parts.len() < 2 {
                continue;
            }
            let fields = parts.swap_remove(1);
            let id =
                bytes(&parts[0]).ok_or_else(|| TargetError("redis: entry without id".into()))?;
            let id = String::from_utf8(id).map_err(|e| err("entry id", e))?;
            let body = pairs(fields)
                .into_iter()
                .find(|(k, _)| bytes(k).as_deref() == Some(BODY_FIELD.as_bytes()))
                .and_then(|(_, v)| bytes(&v))
                .unwrap_or_default();
            out.push(InMsg {
                body: body.into(),
                ack: AckToken::Text(id),
            });
        }
    }
    Ok(out)
}

impl Conn for RedisConn {
    fn send<'a>(&'a self, name: &'a str, msgs: &'a [OutMsg]) -> BoxFut<'a, ()> {
        Box::pin(async move {
            let mut pipe = redis::pipe();
            for m in msgs {
                pipe.cmd("XADD")
                    .arg(name)
                    .arg("*")
                    .arg(BODY_FIELD)
                    .arg(&m.body[..])
                    .ignore();
            }
            let mut c = self.cmd.clone();
            pipe.query_async::<()>(&mut c)
                .await
                .map_err(|e| err("XADD", e))?;
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
            let (mut c, consumer) = self.reader().await?;
            let mut cmd = redis::cmd("XREADGROUP");
            cmd.arg("GROUP")
                .arg(group_name(group))
                .arg(&consumer)
                .arg("COUNT")
                .arg(max.max(1));
            if !wait.is_zero() {
                // BLOCK 0 would wait for ever: round a short wait up to 1 ms.
                cmd.arg("BLOCK").arg(wait.as_millis().max(1) as u64);
            }
            cmd.arg("STREAMS").arg(name).arg(">");
            let reply: Value = cmd
                .query_async(&mut c)
                .await
                .map_err(|e| err("XREADGROUP", e))?;
            // Only a connection whose reply came back is reused (a cancelled BLOCK is dropped).
            self.readers.borrow_mut().push((c, consumer));
            parse_entries(reply)
        })
    }

    fn ack<'a>(&'a self, name: &'a str, group: u32, acks: Vec<AckToken>) -> BoxFut<'a, ()> {
        Box::pin(async move {
            let mut ids = Vec::with_capacity(acks.len());
            for a in acks {
                let AckToken::Text(id) = a else {
                    return Err(TargetError("redis: foreign ack token".into()));
                };
                ids.push(id);
            }
            if ids.is_empty() {
                return Ok(());
            }
            let delete = self
                .delete_on_ack
                .lock()
                .expect("delete_on_ack lock poisoned")
                .get(name)
                .copied()
                .unwrap_or(false);
            let mut pipe = redis::pipe();
            pipe.cmd("XACK")
                .arg(name)
                .arg(group_name(group))
                .arg(&ids)
                .ignore();
            if delete {
                pipe.cmd("XDEL").arg(name).arg(&ids).ignore();
            }
            let mut c = self.cmd.clone();
            pipe.query_async::<()>(&mut c)
                .await
                .map_err(|e| err("XACK", e))?;
            Ok(())
        })
    }
}
