//! The native protocol front end: Sluice frames (`sluice_wire`) over QUIC, served on every
//! shard's own endpoint (`crate::quic`, one SO_REUSEPORT socket per shard).
//!
//! | module     | purpose                                                                   |
//! |------------|---------------------------------------------------------------------------|
//! | `mod`      | endpoint per shard, connections, the handshake, streams, limits, shutdown |
//! | `handlers` | each request against the shard's service API, errors as wire codes        |
//!
//! # A connection
//!
//! 1. TLS 1.3 (ALPN `sluice/1`), then the client opens its first bidirectional stream and
//!    sends `Hello` (request id 0). The server answers `HelloOk` (the version and its limits)
//!    or an `Error` frame (`UnsupportedVersion` with its range, `ProtocolViolation` for any
//!    other first frame) and then closes the connection with that error code as the QUIC
//!    application close code. No `Hello` within [`HELLO_TIMEOUT_MS`]: closed the same way.
//! 2. After `HelloOk`, every bidirectional stream (the first one included) carries pipelined
//!    request frames. Each request runs in its own task; its response is written to the same
//!    stream when ready, so answers come back out of order (a long poll never holds back a
//!    send queued behind it on the stream) and the client matches them by request id.
//! 3. Malformed input: a frame whose boundaries are intact (unknown kind, a body that is not
//!    the archive its kind names, a response kind sent as a request, request id 0, a reused
//!    id) gets an `Error` frame for its request id and the stream goes on. A frame that
//!    loses the boundaries (bad magic, reserved flags, oversize, bad checksum, a stream that
//!    ends inside a frame) gets an `Error` frame (request id 0 when the header was not read),
//!    then the server stops reading that stream, answers what is in flight on it and finishes
//!    it. The connection and the other streams are unaffected.
//!
//! # Limits (CONTRACT.md C8)
//!
//! - a request frame: [`sluice_wire::REQUEST_FRAME_BYTES_MAX`] (the decoder judges the header
//!   before allocating);
//! - requests in flight per connection: [`IN_FLIGHT_REQUESTS_MAX`], beyond which a request is
//!   answered `TooManyInFlightRequests` (retryable) without running;
//! - bytes of requests in flight per connection: [`IN_FLIGHT_REQUEST_BYTES_MAX`], beyond which
//!   the streams stop reading until answers drain (QUIC flow control then holds the client);
//! - streams per connection: [`STREAMS_PER_CONNECTION_MAX`] (QUIC's own stream limit), with
//!   per-stream and per-connection receive windows;
//! - connections per shard: [`CONNECTIONS_PER_SHARD_MAX`], beyond which new ones are refused;
//! - idle connections close after `BrokerConfig::quic_idle_timeout_ms`.
//!
//! Before `HelloOk` a connection is unauthenticated, and costs only a small, stated bound
//! (CONTRACT.md C9): at most [`UNAUTHENTICATED_CONNECTIONS_PER_SHARD_MAX`] per shard (handshakes
//! in progress included; beyond, the oldest is closed for the new one, so that a flood cannot
//! keep a client with credentials out: it authenticates in milliseconds); at
//! most [`UNAUTHENTICATED_STREAMS_MAX`] stream and [`UNAUTHENTICATED_RECEIVE_WINDOW_BYTES`] of
//! data the client may send (QUIC flow control: quinn buffers no more for it); and
//! [`HELLO_TIMEOUT_MS`] from the first packet to `HelloOk`, or it is closed. Each therefore
//! holds at most its QUIC state, the receive window and one decoder of a `Hello`-sized frame:
//! with quinn's per-connection state of some tens of KiB, under ~50 MiB per shard in all.
//! `HelloOk` lifts the stream and window limits to the ones above.
//!
//! Graceful shutdown: every stream stops reading (a pipelined stream is idle most of its life,
//! so it must be ended, not awaited), answers what is in flight on it, finishes, and waits for
//! the peer to acknowledge; meanwhile the endpoint refuses new connections and streams and
//! gives all that up to [`SHUTDOWN_GRACE_MS`], then closes every connection
//! (`crate::quic::ShardEndpoint::shutdown`).

pub mod handlers;
pub mod streams;

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::future::Future;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures::channel::{mpsc, oneshot};
use futures::FutureExt;
use futures::StreamExt;
use quinn::VarInt;
use sluice_wire::handshake::IN_FLIGHT_REQUESTS_MAX_DEFAULT;
use sluice_wire::{
    answer_hello, decode_request, encode_response, ErrorCode, ErrorResponse, Frame, FrameDecoder,
    FrameKind, Request, Response, ServerInfo, FRAME_BYTES_MIN, REQUEST_FRAME_BYTES_MAX,
};

use crate::auth::{AuthMode, Caller, TokenRefused};
use crate::config::BrokerConfig;
use crate::metadata::DEFAULT_TENANT;
use crate::quic::{tls, EndpointOptions, ShardEndpoint, StreamTracker};
use crate::shard::Shard;
use handlers::Ctx;

/// Connections one shard serves at once; beyond, new ones are refused (CONNECTION_REFUSED).
pub const CONNECTIONS_PER_SHARD_MAX: usize = 4_096;
/// Requests in flight per connection (advertised in `HelloOk`).
pub const IN_FLIGHT_REQUESTS_MAX: u32 = IN_FLIGHT_REQUESTS_MAX_DEFAULT;
/// Bytes of requests and unwritten answers in flight per connection before its streams stop
/// reading.
pub const IN_FLIGHT_REQUEST_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Concurrent bidirectional streams a client may open on one connection.
pub const STREAMS_PER_CONNECTION_MAX: u32 = 64;
/// Receive window of one stream: two full request frames.
pub const STREAM_RECEIVE_WINDOW_BYTES: u32 = 2 * REQUEST_FRAME_BYTES_MAX as u32;
/// Receive window of one connection (all its streams).
pub const CONNECTION_RECEIVE_WINDOW_BYTES: u32 = 16 * 1024 * 1024;
/// Time a new connection has, from its first packet, to complete the TLS handshake, open its
/// first stream and be authenticated by `Hello`; then it is closed.
pub const HELLO_TIMEOUT_MS: u64 = 10_000;
/// Connections per shard not yet authenticated (in the handshake or before `HelloOk`); beyond,
/// the oldest gives way to the new one: what an attacker without credentials can hold.
pub const UNAUTHENTICATED_CONNECTIONS_PER_SHARD_MAX: usize = 256;
/// Bidirectional streams a client may open before `HelloOk`: the one that carries `Hello`.
pub const UNAUTHENTICATED_STREAMS_MAX: u32 = 1;
/// Bytes a client may send before `HelloOk` (the connection's receive window until then): a
/// `Hello` of the largest size the decoder takes, and as much pipelined behind it.
pub const UNAUTHENTICATED_RECEIVE_WINDOW_BYTES: u32 = 2 * FRAME_BYTES_MIN as u32;
/// How long shutdown lets in-flight streams finish (long polls are cut after this).
pub const SHUTDOWN_GRACE_MS: u64 = 2_000;
/// After its last response, how long a stream waits for the peer to acknowledge it.
pub const STREAM_FINISH_WAIT_MS: u64 = 10_000;
/// Bytes read from a stream at a time.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// How often a stream paused by the byte budget re-checks it.
const BUDGET_POLL_MS: u64 = 1;

/// QUIC application error code for "stream aborted: the frames on it could not be delimited".
pub const STREAM_STOP_CODE_MALFORMED: u32 = ErrorCode::MalformedFrame as u32;

/// Picks a free UDP port for `addr` (port 0) and holds it, with SO_REUSEPORT so the shards can
/// join, until the broker is ready (`BrokerHandle::wait_ready` drops it). A port something else
/// already holds fails the start: another broker's SO_REUSEPORT socket would otherwise share its
/// datagrams with ours, breaking both brokers' connections at random.
/// The address is claimed for the broker's lifetime as well (`crate::ports::lock`).
pub fn reserve_port(
    addr: SocketAddr,
) -> std::io::Result<(
    std::net::UdpSocket,
    SocketAddr,
    Option<crate::ports::PortLock>,
)> {
    let context = |e: std::io::Error| std::io::Error::new(e.kind(), format!("QUIC on {addr}: {e}"));
    crate::ports::reserve(addr, crate::ports::Transport::Udp, |addr| {
        let socket = socket2::Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::DGRAM,
            Some(socket2::Protocol::UDP),
        )?;
        socket.set_reuse_port(true)?;
        socket.bind(&addr.into())?;
        let socket: std::net::UdpSocket = socket.into();
        let bound = socket.local_addr()?;
        Ok((socket, bound))
    })
    .map_err(context)
}

/// Makes the TLS identity exist before the shards start, so that they all load the same one
/// (two shards generating a self-signed certificate at once would race).
pub fn prepare(config: &BrokerConfig) -> std::io::Result<()> {
    tls::server_identity(&config.quic_tls)
        .map(|_| ())
        .map_err(|e| std::io::Error::other(format!("QUIC TLS: {e}")))
}

/// `host:port` of the queue URLs the native API hands out: the HTTP API's address, so a URL
/// works with both APIs; a wildcard bind address is written as `localhost`.
fn url_host(http_addr: SocketAddr) -> String {
    if http_addr.ip().is_unspecified() {
        format!("localhost:{}", http_addr.port())
    } else {
        http_addr.to_string()
    }
}

fn server_config(config: &BrokerConfig) -> Result<quinn::ServerConfig, String> {
    let mut server = tls::server_config(&config.quic_tls).map_err(|e| e.to_string())?;
    let mut transport = quinn::TransportConfig::default();
    let idle = quinn::IdleTimeout::try_from(Duration::from_millis(config.quic_idle_timeout_ms))
        .map_err(|e| format!("quic_idle_timeout_ms: {e}"))?;
    transport
        .max_idle_timeout(Some(idle))
        // Until `HelloOk` (`serve_connection` raises both once the client is authenticated).
        .max_concurrent_bidi_streams(VarInt::from_u32(UNAUTHENTICATED_STREAMS_MAX))
        .receive_window(VarInt::from_u32(UNAUTHENTICATED_RECEIVE_WINDOW_BYTES))
        .max_concurrent_uni_streams(VarInt::from_u32(0))
        .stream_receive_window(VarInt::from_u32(STREAM_RECEIVE_WINDOW_BYTES))
        .mtu_discovery_config(Some(mtu_discovery()));
    server.transport_config(Arc::new(transport));
    Ok(server)
}

/// Path-MTU discovery up to [`sluice_wire::handshake::QUIC_UDP_PAYLOAD_UPPER_BOUND`].
fn mtu_discovery() -> quinn::MtuDiscoveryConfig {
    let mut mtu = quinn::MtuDiscoveryConfig::default();
    mtu.upper_bound(sluice_wire::handshake::QUIC_UDP_PAYLOAD_UPPER_BOUND);
    mtu
}

/// One shard's native front end.
pub struct NativeFrontEnd {
    /// The shared endpoint (`quic_addr`, SO_REUSEPORT over the shards).
    endpoint: Rc<ShardEndpoint>,
    /// This shard's own endpoint (`quic_shard_addrs[shard]`), if configured.
    direct: Option<Rc<ShardEndpoint>>,
    /// Fired (dropped) at shutdown: every stream stops reading.
    drain: RefCell<Option<oneshot::Sender<()>>>,
}

/// Resolves once shutdown has begun.
type DrainSignal = futures::future::Shared<oneshot::Receiver<()>>;

impl NativeFrontEnd {
    /// Binds the shard's endpoints (synchronously, so the ports are served once the shard
    /// reports ready) and spawns their accept loops. `None` when disabled or when binding the
    /// shared endpoint failed (logged); a per-shard endpoint that fails to bind is logged and
    /// left out (clients then send everything through the shared one).
    pub fn start(shard: Rc<Shard>) -> Option<NativeFrontEnd> {
        let config = shard.config.clone();
        if !config.quic_enabled {
            return None;
        }
        let addr = config.quic_addr;
        let server = match server_config(&config) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(shard = shard.id, error = %e, "native QUIC API not started: TLS");
                return None;
            }
        };
        let endpoint = match ShardEndpoint::bind(addr, server.clone(), EndpointOptions::default()) {
            Ok(ep) => Rc::new(ep),
            Err(e) => {
                tracing::error!(shard = shard.id, %addr, error = %e, "native QUIC API: bind failed");
                return None;
            }
        };
        let direct =
            config.quic_shard_addrs.get(shard.id).and_then(|a| {
                match ShardEndpoint::bind(*a, server, EndpointOptions::default()) {
                    Ok(ep) => Some(Rc::new(ep)),
                    Err(e) => {
                        tracing::error!(shard = shard.id, addr = %a, error = %e,
                        "native QUIC API: the shard's own endpoint did not bind");
                        None
                    }
                }
            });
        tracing::info!(
            shard = shard.id,
            %addr,
            direct = ?config.quic_shard_addrs.get(shard.id),
            "native QUIC API listening"
        );
        let (drain_tx, drain_rx) = oneshot::channel();
        let state = Rc::new(ShardState {
            drain: drain_rx.shared(),
            ctx_host: url_host(config.http_addr),
            info: ServerInfo {
                in_flight_requests_max: IN_FLIGHT_REQUESTS_MAX,
                ..ServerInfo::new("sluiced", env!("CARGO_PKG_VERSION"))
            },
            shard,
            connections: Cell::new(0),
            unauthenticated: RefCell::new(std::collections::VecDeque::new()),
            unauthenticated_next: Cell::new(0),
        });
        for ep in std::iter::once(&endpoint).chain(direct.as_ref()) {
            glommio::spawn_local(accept_loop(ep.clone(), state.clone())).detach();
        }
        Some(NativeFrontEnd {
            endpoint,
            direct,
            drain: RefCell::new(Some(drain_tx)),
        })
    }

    /// The bound address of the shared endpoint.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.endpoint.local_addr()
    }

    /// Stops accepting, lets in-flight streams finish (up to [`SHUTDOWN_GRACE_MS`]), closes.
    pub async fn shutdown(&self) {
        drop(self.drain.borrow_mut().take());
        let grace = Duration::from_millis(SHUTDOWN_GRACE_MS);
        let (report, direct) = futures::future::join(self.endpoint.shutdown(grace), async {
            match &self.direct {
                Some(d) => Some(d.shutdown(grace).await),
                None => None,
            }
        })
        .await;
        tracing::info!(?report, ?direct, "native QUIC API stopped");
    }
}

struct ShardState {
    drain: DrainSignal,
    shard: Rc<Shard>,
    info: ServerInfo,
    ctx_host: String,
    connections: Cell<usize>,
    /// Connections in the handshake or before `HelloOk`, oldest first, each with the sender
    /// that evicts it (dropping it ends the connection's wait).
    unauthenticated: RefCell<std::collections::VecDeque<(u64, oneshot::Sender<()>)>>,
    unauthenticated_next: Cell<u64>,
}

/// A connection counted as unauthenticated until dropped (at `HelloOk`, or when it ends).
struct UnauthenticatedSlot {
    state: Rc<ShardState>,
    id: u64,
    /// Resolves when the connection is evicted for a newer one.
    evicted: futures::future::Shared<oneshot::Receiver<()>>,
}

impl UnauthenticatedSlot {
    /// Takes a slot, evicting the oldest unauthenticated connection if all are taken.
    fn take(state: &Rc<ShardState>) -> UnauthenticatedSlot {
        let mut q = state.unauthenticated.borrow_mut();
        if q.len() >= UNAUTHENTICATED_CONNECTIONS_PER_SHARD_MAX {
            // Dropping the sender wakes the oldest one's task, which closes it.
            drop(q.pop_front());
            tracing::debug!(
                shard = state.shard.id,
                limit = UNAUTHENTICATED_CONNECTIONS_PER_SHARD_MAX,
                "native QUIC API: unauthenticated connection limit reached, closing the oldest"
            );
        }
        let id = state.unauthenticated_next.get();
        state.unauthenticated_next.set(id + 1);
        let (tx, rx) = oneshot::channel();
        q.push_back((id, tx));
        UnauthenticatedSlot {
            state: state.clone(),
            id,
            evicted: rx.shared(),
        }
    }

    /// Runs `f` unless the connection is evicted first (`None`).
    async fn unless_evicted<F: Future>(&self, f: F) -> Option<F::Output> {
        let f = std::pin::pin!(f);
        match futures::future::select(f, self.evicted.clone()).await {
            futures::future::Either::Left((v, _)) => Some(v),
            futures::future::Either::Right(_) => None,
        }
    }
}

impl Drop for UnauthenticatedSlot {
    fn drop(&mut self) {
        let mut q = self.state.unauthenticated.borrow_mut();
        if let Some(at) = q.iter().position(|(id, _)| *id == self.id) {
            q.remove(at);
        }
    }
}

/// Counts a connection until dropped.
struct ConnectionSlot(Rc<ShardState>);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let n = self.0.connections.get();
        debug_assert!(n > 0, "connection count underflow");
        self.0.connections.set(n.saturating_sub(1));
    }
}

async fn accept_loop(endpoint: Rc<ShardEndpoint>, state: Rc<ShardState>) {
    while let Some(incoming) = endpoint.accept().await {
        if state.connections.get() >= CONNECTIONS_PER_SHARD_MAX {
            tracing::warn!(
                shard = state.shard.id,
                limit = CONNECTIONS_PER_SHARD_MAX,
                "native QUIC API: connection limit reached, refusing"
            );
            incoming.refuse();
            continue;
        }
        state.connections.set(state.connections.get() + 1);
        let slot = ConnectionSlot(state.clone());
        let unauthenticated = UnauthenticatedSlot::take(&state);
        let tracker = endpoint.tracker();
        glommio::spawn_local(async move {
            let remote = incoming.remote_address();
            let started = crate::runtime::monotonic_now();
            // The deadline runs from the first packet: a handshake left unfinished is dropped
            // (quinn closes a connection whose handles are all gone).
            let handshake = unauthenticated.unless_evicted(incoming.accept());
            match within(HELLO_TIMEOUT_MS, handshake).await.flatten() {
                Some(Ok(conn)) => {
                    let left_ms =
                        HELLO_TIMEOUT_MS.saturating_sub(started.elapsed().as_millis() as u64);
                    serve_connection(slot, unauthenticated, conn, tracker, left_ms).await
                }
                Some(Err(e)) => {
                    tracing::debug!(%remote, error = %e, "native QUIC handshake failed")
                }
                None => tracing::debug!(%remote, "native QUIC handshake timed out or evicted"),
            }
        })
        .detach();
    }
}

/// Per-connection state shared by its streams.
struct Connection {
    drain: DrainSignal,
    /// The QUIC connection: a request still running when it closes is cancelled.
    quic: quinn::Connection,
    ctx: Ctx,
    tracker: StreamTracker,
    requests_in_flight: Cell<u32>,
    request_bytes_in_flight: Cell<usize>,
    ids_in_flight: RefCell<HashSet<u64>>,
}

/// Runs `f` for at most `ms` milliseconds.
async fn within<F: Future>(ms: u64, f: F) -> Option<F::Output> {
    let f = std::pin::pin!(f);
    let t = std::pin::pin!(glommio::timer::Timer::new(Duration::from_millis(ms)));
    match futures::future::select(f, t).await {
        futures::future::Either::Left((v, _)) => Some(v),
        futures::future::Either::Right(_) => None,
    }
}

fn error_frame(request_id: u64, e: ErrorResponse) -> bytes::Bytes {
    encode_response(request_id, &Response::Error(e)).expect("an error frame is small")
}

/// Closes the connection with `code` as the application error code, after flushing `frame` on
/// `send` (bounded).
async fn refuse_connection(
    conn: &quinn::Connection,
    mut send: quinn::SendStream,
    frame: bytes::Bytes,
    code: ErrorCode,
    reason: &str,
) {
    let _ = within(STREAM_FINISH_WAIT_MS, async {
        if send.write_chunk(frame).await.is_ok() && send.finish().is_ok() {
            let _ = send.stopped().await;
        }
    })
    .await;
    conn.close(
        VarInt::from_u32(u32::from(code.as_u16())),
        reason.as_bytes(),
    );
}

/// The account of a connection's verified client certificate, if one of its names is mapped.
fn certificate_account(
    conn: &quinn::Connection,
    accounts: &std::collections::BTreeMap<String, String>,
) -> Option<String> {
    if accounts.is_empty() {
        return None;
    }
    let identity = conn.peer_identity()?;
    let chain = identity.downcast_ref::<Vec<rustls::pki_types::CertificateDer<'static>>>()?;
    let leaf = chain.first()?;
    crate::quic::tls::client_cert_names(leaf)
        .into_iter()
        .find_map(|name| accounts.get(&name).cloned())
}

async fn serve_connection(
    slot: ConnectionSlot,
    unauthenticated: UnauthenticatedSlot,
    conn: quinn::Connection,
    tracker: StreamTracker,
    hello_within_ms: u64,
) {
    let state = slot.0.clone();
    // 1. The handshake on the first stream.
    let first = within(
        hello_within_ms,
        unauthenticated.unless_evicted(async {
            let (send, mut recv) = conn.accept_bi().await.ok()?;
            let mut decoder = FrameDecoder::new(FRAME_BYTES_MIN);
            loop {
                let chunk = recv.read_chunk(READ_CHUNK_BYTES, true).await.ok()??;
                let mut input: &[u8] = &chunk.bytes;
                match decoder.decode(&mut input) {
                    Ok(Some(frame)) => {
                        let rest = bytes::Bytes::copy_from_slice(input);
                        return Some((send, recv, decoder, Ok(frame), rest));
                    }
                    Ok(None) => continue,
                    Err(e) => return Some((send, recv, decoder, Err(e), bytes::Bytes::new())),
                }
            }
        }),
    )
    .await
    .flatten()
    .flatten();
    let Some((send, recv, mut decoder, first, rest)) = first else {
        conn.close(
            VarInt::from_u32(u32::from(ErrorCode::ProtocolViolation.as_u16())),
            b"no Hello",
        );
        return;
    };
    let hello = match first {
        Ok(frame) => match (frame.kind(), decode_request(&frame)) {
            (Some(FrameKind::Hello), Ok(Request::Hello(h))) if frame.request_id() == 0 => Ok(h),
            (Some(FrameKind::Hello), Ok(_)) => Err(ErrorResponse::new(
                ErrorCode::ProtocolViolation,
                "Hello must carry request id 0",
            )),
            (_, Err(e)) => Err(e.to_error_response()),
            _ => Err(ErrorResponse::new(
                ErrorCode::ProtocolViolation,
                "the first frame of a connection must be Hello",
            )),
        },
        Err(e) => Err(e.to_error_response()),
    };
    // A verified client certificate named in `client_cert_accounts` is an identity of its own.
    let cert_account =
        certificate_account(&conn, &state.shard.config.quic_tls.client_cert_accounts);
    let ok = match hello.and_then(|h| {
        // The version first (a client that cannot speak ours learns that before anything),
        // then who it is.
        answer_hello(&h, &state.info, DEFAULT_TENANT)?;
        if let Some(account) = &cert_account {
            // A token besides the certificate must name the same account.
            let agrees = h.auth_token.as_deref().is_none_or(|t| {
                state.shard.config.auth.authenticate_token(Some(t)).as_ref() == Ok(account)
            });
            if !agrees {
                return Err(ErrorResponse::new(
                    ErrorCode::AccessDenied,
                    "the client certificate and the credentials name different accounts",
                ));
            }
            return answer_hello(&h, &state.info, account);
        }
        let account = state
            .shard
            .config
            .auth
            .authenticate_token(h.auth_token.as_deref())
            .map_err(|why| {
                ErrorResponse::new(
                    ErrorCode::AccessDenied,
                    match why {
                        TokenRefused::Missing => {
                            "this broker requires authentication: connect with credentials \
                             (an access key id and its secret)"
                        }
                        TokenRefused::Invalid => "the credentials were not accepted",
                    },
                )
            })?;
        answer_hello(&h, &state.info, &account)
    }) {
        Ok(ok) => ok,
        Err(e) => {
            let code = e.error_code();
            tracing::debug!(remote = %conn.remote_address(), ?code, message = %e.message, "native handshake refused");
            refuse_connection(&conn, send, error_frame(0, e), code, "handshake refused").await;
            return;
        }
    };
    let account = ok.account_id.clone();
    // Authenticated: the connection gets the streams and the window of one (the client learns
    // of them by MAX_STREAMS and MAX_DATA frames).
    conn.set_max_concurrent_bi_streams(VarInt::from_u32(STREAMS_PER_CONNECTION_MAX));
    conn.set_receive_window(VarInt::from_u32(CONNECTION_RECEIVE_WINDOW_BYTES));
    drop(unauthenticated);
    let protocol_version = ok.version;
    let hello_ok = encode_response(0, &Response::HelloOk(ok)).expect("HelloOk is small");
    decoder.set_frame_bytes_max(REQUEST_FRAME_BYTES_MAX);
    let connection = Rc::new(Connection {
        drain: state.drain.clone(),
        quic: conn.clone(),
        ctx: Ctx {
            shard: state.shard.clone(),
            caller: Caller {
                account,
                // Accounts are kept apart when keys are checked, and for a connection whose
                // certificate names its account.
                verified: state.shard.config.auth.mode == AuthMode::SigV4 || cert_account.is_some(),
            },
            url_host: state.ctx_host.clone(),
            protocol_version,
        },
        tracker,
        requests_in_flight: Cell::new(0),
        request_bytes_in_flight: Cell::new(0),
        ids_in_flight: RefCell::new(HashSet::new()),
    });
    // 2. Streams: the first one goes on with what followed Hello.
    glommio::spawn_local(serve_stream(
        connection.clone(),
        send,
        recv,
        decoder,
        Some(hello_ok),
        rest,
    ))
    .detach();
    while let Ok((send, recv)) = conn.accept_bi().await {
        glommio::spawn_local(serve_stream(
            connection.clone(),
            send,
            recv,
            FrameDecoder::new(REQUEST_FRAME_BYTES_MAX),
            None,
            bytes::Bytes::new(),
        ))
        .detach();
    }
    drop(slot);
}

/// A frame for a stream's writer, with the budget share of the request it answers.
type Outgoing = (OutFrame, Option<InFlight>);

/// A frame to write: in one buffer, or as pieces written one after the other (a topic fetch:
/// its header, the batches as the log holds them, its tail; `wire::encode_fetch_response`).
enum OutFrame {
    One(bytes::Bytes),
    Pieces(Vec<bytes::Bytes>),
}

impl OutFrame {
    fn len(&self) -> usize {
        match self {
            OutFrame::One(b) => b.len(),
            OutFrame::Pieces(p) => p.iter().map(bytes::Bytes::len).sum(),
        }
    }

    /// Hands the frame's buffers to quinn as they are (`write_all` would copy them into one
    /// of quinn's first).
    async fn write(self, send: &mut quinn::SendStream) -> Result<(), quinn::WriteError> {
        match self {
            OutFrame::One(b) => send.write_chunk(b).await,
            OutFrame::Pieces(mut p) => send.write_all_chunks(&mut p).await,
        }
    }
}

/// Releases a request's share of the connection's budget once its answer is written (or the
/// answer is dropped).
struct InFlight {
    connection: Rc<Connection>,
    /// The request, for a request being served; `None` for an error frame (bytes only).
    id: Option<u64>,
    bytes: usize,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let c = &self.connection;
        c.request_bytes_in_flight
            .set(c.request_bytes_in_flight.get().saturating_sub(self.bytes));
        if let Some(id) = self.id {
            c.requests_in_flight
                .set(c.requests_in_flight.get().saturating_sub(1));
            c.ids_in_flight.borrow_mut().remove(&id);
        }
    }
}

/// Queues an `Error` frame; its bytes count against the connection's budget until written, so
/// a peer sending garbage it never reads the answers to is throttled like any other.
fn queue_error(
    connection: &Rc<Connection>,
    tx: &mpsc::UnboundedSender<Outgoing>,
    request_id: u64,
    e: ErrorResponse,
) {
    let frame = error_frame(request_id, e);
    connection
        .request_bytes_in_flight
        .set(connection.request_bytes_in_flight.get() + frame.len());
    let budget = InFlight {
        connection: connection.clone(),
        id: None,
        bytes: frame.len(),
    };
    let _ = tx.unbounded_send((OutFrame::One(frame), Some(budget)));
}

async fn serve_stream(
    connection: Rc<Connection>,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    mut decoder: FrameDecoder,
    first_frame: Option<bytes::Bytes>,
    pending: bytes::Bytes,
) {
    let Some(guard) = connection.tracker.start() else {
        // Shutting down: refuse new streams.
        let _ = send.reset(VarInt::from_u32(crate::quic::CLOSE_CODE_SHUTDOWN));
        return;
    };
    let (tx, mut rx) = mpsc::unbounded::<Outgoing>();
    if let Some(f) = first_frame {
        let _ = tx.unbounded_send((OutFrame::One(f), None));
    }
    // The writer: responses in the order they are ready; ends once every sender is gone. A
    // response keeps its request's share of the connection's budget until it is written, so
    // a client that does not read its answers stops being read from (it cannot make the
    // broker queue answers without bound).
    let writer = glommio::spawn_local(async move {
        while let Some((frame, in_flight)) = rx.next().await {
            if frame.write(&mut send).await.is_err() {
                // The peer stopped the stream or the connection is gone: drop the rest.
                return;
            }
            drop(in_flight);
        }
        if send.finish().is_ok() {
            let _ = within(STREAM_FINISH_WAIT_MS, send.stopped()).await;
        }
    });
    let mut stream_ok = feed(&connection, &mut decoder, &pending, &tx);
    while stream_ok {
        // Back-pressure: stop reading while the connection holds too many request bytes.
        while connection.request_bytes_in_flight.get() > IN_FLIGHT_REQUEST_BYTES_MAX {
            glommio::timer::sleep(Duration::from_millis(BUDGET_POLL_MS)).await;
        }
        let read = {
            let read = std::pin::pin!(recv.read_chunk(READ_CHUNK_BYTES, true));
            match futures::future::select(read, connection.drain.clone()).await {
                futures::future::Either::Left((read, _)) => Some(read),
                // Shutting down: read no more; answer what is in flight, then finish.
                futures::future::Either::Right(_) => None,
            }
        };
        let Some(read) = read else {
            let _ = recv.stop(VarInt::from_u32(crate::quic::CLOSE_CODE_SHUTDOWN));
            break;
        };
        match read {
            Ok(Some(chunk)) => stream_ok = feed(&connection, &mut decoder, &chunk.bytes, &tx),
            Ok(None) => {
                if let Err(e) = decoder.finish() {
                    queue_error(&connection, &tx, e.request_id(), e.to_error_response());
                }
                break;
            }
            // Reset by the peer, or the connection is gone.
            Err(_) => break,
        }
    }
    if !stream_ok {
        let _ = recv.stop(VarInt::from_u32(STREAM_STOP_CODE_MALFORMED));
    }
    drop(tx);
    writer.await;
    // The stream counts for graceful shutdown until the peer has acknowledged every answer.
    drop(guard);
}

/// Decodes what `bytes` completes and dispatches each frame. `false` once the stream lost its
/// frame boundaries (the error has been queued for the peer).
fn feed(
    connection: &Rc<Connection>,
    decoder: &mut FrameDecoder,
    bytes: &[u8],
    tx: &mpsc::UnboundedSender<Outgoing>,
) -> bool {
    let mut input = bytes;
    loop {
        match decoder.decode(&mut input) {
            Ok(Some(frame)) => dispatch(connection, frame, tx),
            Ok(None) => return true,
            Err(e) => {
                queue_error(connection, tx, e.request_id(), e.to_error_response());
                if e.is_fatal() {
                    return false;
                }
            }
        }
    }
}

fn dispatch(connection: &Rc<Connection>, frame: Frame, tx: &mpsc::UnboundedSender<Outgoing>) {
    let id = frame.request_id();
    let reject = |code: ErrorCode, message: String| {
        queue_error(connection, tx, id, ErrorResponse::new(code, message));
    };
    if id == 0 {
        return reject(
            ErrorCode::ProtocolViolation,
            "request id 0 is reserved for connection-level frames".into(),
        );
    }
    let request = match decode_request(&frame) {
        Ok(Request::Hello(_)) => {
            return reject(
                ErrorCode::ProtocolViolation,
                "Hello is allowed only as the first frame of a connection".into(),
            )
        }
        Ok(r) => r,
        Err(e) => {
            queue_error(connection, tx, id, e.to_error_response());
            return;
        }
    };
    if connection.requests_in_flight.get() >= IN_FLIGHT_REQUESTS_MAX {
        return reject(
            ErrorCode::TooManyInFlightRequests,
            format!("more than {IN_FLIGHT_REQUESTS_MAX} requests in flight on this connection"),
        );
    }
    if !connection.ids_in_flight.borrow_mut().insert(id) {
        return reject(
            ErrorCode::ProtocolViolation,
            format!("request id {id} is already in flight on this connection"),
        );
    }
    let bytes = frame.body.len();
    connection
        .requests_in_flight
        .set(connection.requests_in_flight.get() + 1);
    connection
        .request_bytes_in_flight
        .set(connection.request_bytes_in_flight.get() + bytes);
    drop(frame);
    let in_flight = InFlight {
        connection: connection.clone(),
        id: Some(id),
        bytes,
    };
    let tx = tx.clone();
    let class = match &request {
        Request::Produce(_) => Some(crate::runtime::RequestClass::Produce),
        Request::Fetch(_) => Some(crate::runtime::RequestClass::Fetch),
        _ => None,
    };
    crate::runtime::spawn_request(class, async move {
        // A request whose client is gone is cancelled: above all a long poll, which would
        // otherwise lease a message for a receiver that cannot get it (the message would stay
        // invisible for its visibility timeout).
        let connection = in_flight.connection.clone();
        let started = crate::runtime::monotonic_now();
        let kind = request.kind();
        // `Ok`: a frame already built (a topic fetch, from the batches as the log holds
        // them); `Err`: a response to encode.
        let answer = {
            let ctx = &connection.ctx;
            let work = std::pin::pin!(async move {
                match request {
                    Request::Fetch(r)
                        if !r.topic.starts_with(crate::stream::QUEUE_TOPIC_PREFIX) =>
                    {
                        handlers::handle_fetch(ctx, r, bytes as u64, id).await
                    }
                    request => Err(handlers::handle(ctx, request, bytes as u64).await),
                }
            });
            let closed = std::pin::pin!(connection.quic.closed());
            match futures::future::select(work, closed).await {
                futures::future::Either::Left((answer, _)) => answer,
                futures::future::Either::Right(_) => return,
            }
        };
        let error = match &answer {
            Err(Response::Error(e)) => Some(crate::metrics::ErrorKey::Native(e.code)),
            Err(Response::NotLeader(_)) => Some(crate::metrics::ErrorKey::Native(
                ErrorCode::NotLeader.as_u16(),
            )),
            _ => None,
        };
        crate::metrics::record_request(
            crate::metrics::Action::Native(kind),
            started.elapsed(),
            error,
        );
        let frame = match answer
            .map(OutFrame::Pieces)
            .or_else(|response| encode_response(id, &response).map(OutFrame::One))
        {
            Ok(f) => f,
            Err(e) => {
                tracing::error!(error = %e, "native: response does not encode");
                OutFrame::One(error_frame(
                    id,
                    ErrorResponse::new(e.error_code(), e.to_string()),
                ))
            }
        };
        // The answer's bytes count too until the writer has handed them to QUIC.
        let c = &in_flight.connection;
        c.request_bytes_in_flight
            .set(c.request_bytes_in_flight.get() + frame.len());
        let mut in_flight = in_flight;
        in_flight.bytes += frame.len();
        let _ = tx.unbounded_send((frame, Some(in_flight)));
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn queue_urls_name_a_reachable_host() {
        let at = |a: &str| super::url_host(a.parse().expect("addr"));
        assert_eq!(at("0.0.0.0:9324"), "localhost:9324");
        assert_eq!(at("[::]:9324"), "localhost:9324");
        assert_eq!(at("10.1.2.3:9324"), "10.1.2.3:9324");
    }
}
