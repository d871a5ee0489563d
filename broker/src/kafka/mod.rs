//! The Kafka protocol on Sluice's streams: Kafka clients (librdkafka, kcat, kafka-python, the
//! Java client) produce to topics, fetch, list offsets and consume in groups, over the same
//! stream service API the native front end uses (`crate::stream`).
//!
//! | file | purpose |
//! |---|---|
//! | `mod.rs` | the listener on every shard (SO_REUSEPORT), connections, framing, limits |
//! | `dispatch.rs` | request header, version checks, SASL gate, error answers for what cannot be served |
//! | `handlers.rs` | one function per API over the `Shard` stream service |
//! | `admin.rs` | the admin API (partitions, groups, records, configs, cluster, log dirs) and topic ids |
//! | `records.rs` | Kafka v2 record batches (CRC32C) to and from Sluice's batches |
//! | `compression.rs` | compressed batches: stored and served as produced, bounded decompression |
//! | `sasl.rs` | SaslHandshake/SaslAuthenticate: PLAIN and SCRAM-SHA-256/512, failed-login bound |
//! | `tls.rs` | TLS on the listener (`SSL`/`SASL_SSL`), client certificates → accounts |
//! | `quota.rs` | per-account request and byte rates, as on the other front ends |
//! | `share.rs` | share groups (KIP-932) on `queue:<name>` topics over the queue engine's leases |
//!
//! The codec is the `kafka-protocol` crate: its message types are generated from Kafka's own
//! JSON schemas for every version, so a version is a number passed to `decode`/`encode`, not
//! hand-written code. Sluice's log keeps its own batch format (xxh3, `wire/src/batch.rs`):
//! produced Kafka batches are verified (CRC32C) and re-encoded, fetched batches are encoded
//! as Kafka v2 batches with the log's offsets and timestamps. One node is advertised (node 0,
//! this listener), which leads every partition and coordinates every group; whichever shard
//! takes a connection forwards each request to the owning shard over the mesh.
//!
//! Like Kafka, a connection's requests are answered one at a time, in order.

mod admin;
pub(crate) mod compression;
mod dispatch;
mod handlers;
mod quota;
mod records;
mod sasl;
mod share;
pub mod tls;
mod txn;

use crate::shard::Shard;
use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

/// A request larger than this is answered with an error and the connection closed (Kafka's
/// `socket.request.max.bytes` is 100 MiB; Sluice's batches stop at a few MiB anyway).
pub const KAFKA_REQUEST_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Connections one shard serves at once; more are closed at accept.
pub const KAFKA_CONNECTIONS_PER_SHARD_MAX: usize = 4_096;
/// A connection idle (or stalled inside a request) this long is closed (Kafka's
/// `connections.max.idle.ms` is 10 minutes).
pub const KAFKA_IDLE_TIMEOUT_MS: u64 = 600_000;
/// The fewest bytes that say which request a frame is: api key, version, correlation id.
const FRAME_PREFIX_BYTES: usize = 8;
/// Kafka's node id of this broker in metadata and coordinator answers.
pub const NODE_ID: i32 = 0;

/// The per-shard front end: its accept loop and open connections, cancelled at shutdown.
pub struct KafkaFrontEnd {
    accept: glommio::task::JoinHandle<()>,
    connections: Rc<RefCell<HashMap<u64, glommio::task::JoinHandle<()>>>>,
}

/// What one connection knows about its client.
pub(crate) struct Conn {
    pub shard: Rc<Shard>,
    /// The account requests act in: set by SASL, else the default one (auth mode none).
    pub account: Option<String>,
    /// Where the SASL exchange is (`sasl::Step`).
    pub sasl: sasl::Step,
    /// The account of the client's verified TLS certificate, if mapped (a login must agree).
    pub cert_account: Option<String>,
    /// The client's address: failed logins are bounded per address (`sasl`).
    pub peer: Option<std::net::IpAddr>,
    /// A SaslHandshake v0 chose PLAIN: the next frame is the bare PLAIN message (no Kafka
    /// header), answered by an empty frame (Kafka's flow before KIP-152).
    pub sasl_raw_next: bool,
    /// The address clients are told to connect to (metadata, coordinator).
    pub advertised: (String, i32),
}

impl KafkaFrontEnd {
    /// Binds this shard's listener and starts accepting; `None` when disabled or the bind
    /// failed (logged).
    pub fn start(shard: Rc<Shard>) -> Option<KafkaFrontEnd> {
        let addr = shard.config.kafka_addr?;
        let listener = match crate::http::bind(addr) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(shard = shard.id, %addr, error = %e, "Kafka listener: bind failed");
                return None;
            }
        };
        let tls = match tls::KafkaTls::for_shard(&shard.config) {
            Ok(t) => t.map(Rc::new),
            Err(e) => {
                tracing::error!(shard = shard.id, error = %e, "Kafka listener not started: TLS");
                return None;
            }
        };
        tracing::info!(shard = shard.id, %addr, tls = tls.is_some(), "Kafka protocol listening");
        let connections: Rc<RefCell<HashMap<u64, glommio::task::JoinHandle<()>>>> = Rc::default();
        let conns = connections.clone();
        let accept = glommio::spawn_local(async move {
            let next = Cell::new(0u64);
            let mut accept_errors = crate::http::slots::AcceptErrors::new("Kafka listener");
            loop {
                let stream = match listener.accept().await {
                    Ok(s) => {
                        accept_errors.succeeded();
                        s
                    }
                    Err(e) => {
                        glommio::timer::sleep(accept_errors.failed(&e)).await;
                        continue;
                    }
                };
                if conns.borrow().len() >= KAFKA_CONNECTIONS_PER_SHARD_MAX {
                    drop(stream);
                    continue;
                }
                let id = next.get();
                next.set(id + 1);
                let shard = shard.clone();
                let done = conns.clone();
                let tls = tls.clone();
                let task = glommio::spawn_local(async move {
                    if let Err(e) = serve_connection(shard, stream, tls).await {
                        tracing::debug!(error = %e, "Kafka connection closed");
                    }
                    done.borrow_mut().remove(&id);
                })
                .detach();
                conns.borrow_mut().insert(id, task);
            }
        })
        .detach();
        Some(KafkaFrontEnd {
            accept,
            connections,
        })
    }

    /// Stops accepting and cancels every connection (their sockets close).
    pub async fn shutdown(self) {
        self.accept.cancel();
        let conns: Vec<_> = self
            .connections
            .borrow_mut()
            .drain()
            .map(|(_, t)| t)
            .collect();
        for c in conns {
            c.cancel();
        }
    }
}

/// The host and port clients are told to use: the configured advertised host, else the
/// listener's IP (loopback when it listens on every address).
fn advertised(shard: &Shard) -> (String, i32) {
    let addr = shard
        .config
        .kafka_addr
        .expect("a Kafka connection implies a Kafka address");
    let host = match &shard.config.kafka_advertised_host {
        Some(h) => h.clone(),
        None if addr.ip().is_unspecified() => "127.0.0.1".to_string(),
        None => addr.ip().to_string(),
    };
    (host, i32::from(addr.port()))
}

async fn serve_connection(
    shard: Rc<Shard>,
    stream: glommio::net::TcpStream,
    tls: Option<Rc<tls::KafkaTls>>,
) -> std::io::Result<()> {
    stream.set_read_timeout(Some(std::time::Duration::from_millis(
        KAFKA_IDLE_TIMEOUT_MS,
    )))?;
    let mut conn = Conn {
        advertised: advertised(&shard),
        shard,
        account: None,
        sasl: sasl::Step::Idle,
        sasl_raw_next: false,
        cert_account: None,
        peer: stream.peer_addr().ok().map(|a| a.ip()),
    };
    match tls {
        None => serve_frames(conn, stream).await,
        Some(tls) => {
            let (stream, cert_account) = tls.accept(stream).await?;
            conn.account.clone_from(&cert_account);
            conn.cert_account = cert_account;
            serve_frames(conn, stream).await
        }
    }
}

/// The connection's frames, one request answered at a time, over TCP or TLS.
async fn serve_frames<S: AsyncRead + AsyncWrite + Unpin>(
    mut conn: Conn,
    mut stream: S,
) -> std::io::Result<()> {
    let mut len = [0u8; 4];
    loop {
        match stream.read_exact(&mut len).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let size = i32::from_be_bytes(len);
        let Ok(size) = usize::try_from(size) else {
            return Err(std::io::Error::other("negative frame size"));
        };
        if conn.sasl_raw_next && size <= dispatch::SASL_PLAIN_BYTES_MAX {
            let mut token = vec![0u8; size];
            stream.read_exact(&mut token).await?;
            if !dispatch::sasl_raw(&mut conn, &token) {
                return Ok(());
            }
            write_frame(&mut stream, &[]).await?;
            continue;
        }
        if size < FRAME_PREFIX_BYTES {
            // Not even a correlation id to answer with: nothing a client could match.
            return Err(std::io::Error::other("frame shorter than a request header"));
        }
        if size > KAFKA_REQUEST_BYTES_MAX {
            // Answer from the prefix, then close: the rest is not read (Kafka closes too).
            let mut prefix = [0u8; FRAME_PREFIX_BYTES];
            stream.read_exact(&mut prefix).await?;
            let answer = dispatch::too_large(&prefix);
            write_frame(&mut stream, &answer).await?;
            return Ok(());
        }
        let mut frame = vec![0u8; size];
        stream.read_exact(&mut frame).await?;
        let outcome = dispatch::handle(&mut conn, bytes::Bytes::from(frame)).await;
        if let Some(answer) = outcome.answer {
            write_frame(&mut stream, &answer).await?;
        }
        if outcome.close {
            return Ok(());
        }
    }
}

/// Writes an answer: a whole frame, its size included (`dispatch::encode_response`).
async fn write_frame<S: AsyncWrite + Unpin>(stream: &mut S, frame: &[u8]) -> std::io::Result<()> {
    stream.write_all(frame).await?;
    stream.flush().await
}
