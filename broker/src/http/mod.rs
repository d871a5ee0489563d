//! The SQS-compatible HTTP API, on the broker's own cores.
//!
//! Every shard binds the HTTP address with `SO_REUSEPORT` (the kernel spreads connections over
//! the shards) and serves its connections on its glommio executor with hyper 1.x's HTTP/1.1
//! state machine; requests go to that shard's `Shard` service API, which forwards to the
//! partitions' owners over the mesh. No tokio, no thread hand-off.
//!
//! | module     | purpose                                                                      |
//! |------------|------------------------------------------------------------------------------|
//! | `io`       | futures-io (glommio `TcpStream`) → `hyper::rt::{Read, Write}`; glommio `Timer` for hyper |
//! | `protocol` | AWS JSON 1.0 and Query requests → one input model; output tree → JSON or XML; `SqsError` |
//! | `actions`  | the 23 actions of the SQS model against the service layer                    |
//! | `local`    | with auth off, only local clients: `Host` and `Origin` checks (DNS rebinding, CSRF) |
//! | `slots`    | connection caps where the longest-idle connection gives way; accept back-off  |
//!
//! A request: with auth off, the local guard (`local`); with SigV4 on, what can be checked of
//! the signature before the body (present, well formed, known key, date in range:
//! `AuthConfig::precheck`); limits checked (`Content-Length` before any byte of body is read,
//! then a counted read bounded in size and time, and — until the signature is checked — in
//! the shard's budget of unauthenticated body bytes) → SigV4 (`crate::auth`) → protocol detection (`X-Amz-Target` is JSON,
//! otherwise a Query form in the body and/or the URL) → action → rendering. Every failure is an
//! SQS error in the request's protocol; nothing is a 500 except an internal failure, and the
//! connection state machine is hyper's (keep-alive, pipelining, header limits, timeouts).

pub mod actions;
pub mod forward;
pub mod io;
pub mod local;
pub mod protocol;
pub mod slots;

use crate::auth::{AuthConfig, AuthMode, SignedRequest};
use crate::shard::Shard;
use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use protocol::{Params, SqsError};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::os::fd::{FromRawFd, IntoRawFd};
use std::rc::Rc;
use std::time::Duration;

/// Largest request body: SQS messages and batches are up to 1 MiB; base64 attributes, JSON
/// escaping and form encoding can nearly double that.
pub const REQUEST_BODY_BYTES_MAX: usize = 2 * 1024 * 1024;
/// Largest request head (request line + headers), hyper's read buffer bound.
pub const REQUEST_HEAD_BYTES_MAX: usize = 64 * 1024;
/// Connections one shard serves at once, at most: `server::start` lowers it to fit the file
/// descriptor limit (`crate::config_fds`). At the cap, the longest-idle connection is closed
/// for a new one (`slots`); if every connection is busy, the new one gets a 503.
pub const CONNECTIONS_PER_SHARD_MAX: usize = 4_096;
/// Bytes of request bodies one shard may hold before their signatures are checked (SigV4
/// mode): what unauthenticated clients can make the broker buffer, 16 MiB per shard. A
/// request reserves its declared length (the maximum for a chunked body) before its body is
/// read and gives it back once its signature is checked; the body is read into a buffer of
/// exactly that size. Requests without a plausible signature never reach it
/// (`AuthConfig::precheck`).
pub const UNAUTHENTICATED_BODY_BYTES_PER_SHARD_MAX: usize = 16 * 1024 * 1024;
/// A body at least this large, once freed, asks the shard to give memory back to the system
/// (mimalloc keeps freed pages for reuse: 1,000 refused 2 MiB uploads otherwise left ~40 MiB
/// resident for good).
pub const LARGE_BODY_BYTES_MIN: usize = 256 * 1024;
/// How often a shard that freed large bodies gives memory back, at most.
pub const MEMORY_RELEASE_INTERVAL_MS: u64 = 1_000;
/// How long a request waits for room in that budget before a retryable 503
/// (`ServiceUnavailable`): long enough to ride out a burst of large batches, short enough that
/// an attacker's uploads cannot queue legitimate ones for long.
pub const UNAUTHENTICATED_BODY_WAIT_MS_MAX: u64 = 2_000;
/// The listen backlog of each shard's socket.
pub const LISTEN_BACKLOG: i32 = 1_024;
/// Default time to receive a request's head, and the idle time allowed between requests of a
/// keep-alive connection (hyper restarts the head timer while it waits for the next request).
pub const HEADER_READ_TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// Default time to receive a request's body once its head has arrived.
pub const BODY_READ_TIMEOUT_MS_DEFAULT: u64 = 30_000;

const JSON_CONTENT_TYPE: &str = "application/x-amz-json-1.0";
const XML_CONTENT_TYPE: &str = "text/xml";
const TARGET_PREFIX: &str = "AmazonSQS.";

/// The front end's settings: authentication from `BrokerConfig::auth` (see [`crate::auth`]), the read
/// timeouts from the environment (`SLUICE_HTTP_HEADER_TIMEOUT_MS`, `SLUICE_HTTP_BODY_TIMEOUT_MS`).
#[derive(Debug, Clone)]
pub struct HttpConfig {
    pub auth: AuthConfig,
    pub header_read_timeout: Duration,
    pub body_read_timeout: Duration,
    /// Host names accepted besides local ones while auth is off (`local`).
    pub allowed_hosts: Vec<String>,
}

impl HttpConfig {
    pub fn new(auth: AuthConfig) -> Result<Self, String> {
        let ms = |var: &str, default: u64| -> Result<Duration, String> {
            match std::env::var(var) {
                Ok(v) => v
                    .parse::<u64>()
                    .map(Duration::from_millis)
                    .map_err(|_| format!("{var}={v}: expected milliseconds")),
                Err(_) => Ok(Duration::from_millis(default)),
            }
        };
        Ok(HttpConfig {
            auth,
            header_read_timeout: ms(
                "SLUICE_HTTP_HEADER_TIMEOUT_MS",
                HEADER_READ_TIMEOUT_MS_DEFAULT,
            )?,
            body_read_timeout: ms("SLUICE_HTTP_BODY_TIMEOUT_MS", BODY_READ_TIMEOUT_MS_DEFAULT)?,
            allowed_hosts: Vec::new(),
        })
    }
}

/// In a cluster, the node to forward a failed request to: the leader of what it needed, or, for
/// a queue this node does not know, the metadata leader (this node's catalog may not have
/// applied a queue created a moment ago; the leader's has every committed change).
fn leader_to_ask(e: &SqsError) -> Option<u64> {
    e.leader.or_else(|| {
        (e.shape == "QueueDoesNotExist")
            .then(crate::cluster::shard::meta_leader_hint)
            .flatten()
    })
}

/// In a cluster, every SQS answer names the node that served it (the leader's id when the
/// request was forwarded): operators and tests see where a queue is led.
pub const SERVED_BY_HEADER: &str = "x-sluice-node";

/// Serves the SQS API on this shard until the executor stops. Spawned once per shard.
pub async fn serve(shard: Rc<Shard>) {
    let configured = HttpConfig::new(shard.config.auth.clone()).map(|mut c| {
        let ms = std::time::Duration::from_millis;
        if let Some(t) = shard.config.http_header_timeout_ms {
            c.header_read_timeout = ms(t);
        }
        if let Some(t) = shard.config.http_body_timeout_ms {
            c.body_read_timeout = ms(t);
        }
        c.allowed_hosts = shard.config.http_allowed_hosts.clone();
        c
    });
    let config = match configured {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "SQS HTTP API not started: bad configuration");
            return;
        }
    };
    if shard.id == 0 && config.auth.mode == AuthMode::None {
        tracing::warn!(
            "SQS HTTP API and native protocol: AUTHENTICATION IS OFF (auth mode none): any \
             request is accepted without checking its signature or credentials. Set \
             [auth] mode = \"sigv4\" and access_keys in the config file (or SLUICE_AUTH=sigv4 \
             and SLUICE_ACCESS_KEYS) for anything but local development."
        );
    }
    let addr = shard.config.http_addr;
    let listener = match bind(addr) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(shard = shard.id, %addr, error = %e, "SQS HTTP API: bind failed");
            return;
        }
    };
    tracing::info!(shard = shard.id, %addr, "SQS HTTP API listening");
    let connections_max = shard
        .config
        .http_connections_per_shard_max
        .unwrap_or(CONNECTIONS_PER_SHARD_MAX);
    let state = Rc::new(ShardHttp {
        shard,
        config,
        slots: slots::Slots::new(connections_max),
        body_budget: Rc::new(glommio::sync::Semaphore::new(
            UNAUTHENTICATED_BODY_BYTES_PER_SHARD_MAX as u64,
        )),
        next_request: Cell::new(0),
        large_bodies_freed: Cell::new(false),
    });
    let mut accept_errors = slots::AcceptErrors::new("SQS HTTP API");
    loop {
        let stream = match listener.accept().await {
            Ok(s) => {
                accept_errors.succeeded();
                s
            }
            Err(e) => {
                // EMFILE and friends persist until something closes: back off, log rarely.
                glommio::timer::sleep(accept_errors.failed(&e)).await;
                continue;
            }
        };
        let state = state.clone();
        glommio::spawn_local(async move { state.connection(stream).await }).detach();
    }
}

/// Binds `addr` (port 0: a free port) with SO_REUSEPORT, without listening, and holds it
/// until every shard listens on it (`BrokerHandle::wait_ready` drops it): the port is resolved
/// before the configuration is shared, nothing else bound at start-up can take it meanwhile
/// (the metrics listener's port 0 once did: the shards' binds failed and HTTP requests reached
/// the metrics server), and a port held by another program fails the start instead of leaving
/// the broker running without its HTTP API.
/// The port is also claimed for the broker's lifetime (`crate::ports::lock`), before any
/// SO_REUSEPORT socket is bound: the probe cannot see a starting broker whose shards do not
/// listen yet.
pub fn reserve_port(
    addr: std::net::SocketAddr,
) -> std::io::Result<(
    socket2::Socket,
    std::net::SocketAddr,
    Option<crate::ports::PortLock>,
)> {
    reserve_tcp_port(addr, "SQS HTTP API")
}

/// [`reserve_port`] for any TCP listener: its errors name `listener` and the address once
/// (the Kafka listener shares the HTTP API's socket setup, not its name).
pub fn reserve_tcp_port(
    addr: std::net::SocketAddr,
    listener: &str,
) -> std::io::Result<(
    socket2::Socket,
    std::net::SocketAddr,
    Option<crate::ports::PortLock>,
)> {
    let context =
        |e: std::io::Error| std::io::Error::new(e.kind(), format!("{listener} on {addr}: {e}"));
    crate::ports::reserve(addr, crate::ports::Transport::Tcp, |addr| {
        let socket = reuseport_socket(addr)?;
        let bound = socket
            .local_addr()?
            .as_socket()
            .ok_or_else(|| std::io::Error::other("not an IP address"))?;
        Ok((socket, bound))
    })
    .map_err(context)
}

/// A TCP socket bound to `addr` with SO_REUSEPORT (and SO_REUSEADDR), not listening.
fn reuseport_socket(addr: std::net::SocketAddr) -> std::io::Result<socket2::Socket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_port(true)?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    Ok(socket)
}

/// Binds `addr` with SO_REUSEPORT so that every shard can listen on it (the Kafka listener
/// too).
pub(crate) fn bind(addr: std::net::SocketAddr) -> std::io::Result<glommio::net::TcpListener> {
    let socket = reuseport_socket(addr)?;
    // Accepted connections inherit it.
    socket.set_nodelay(true)?;
    socket.listen(LISTEN_BACKLOG)?;
    // SAFETY: the descriptor is a bound, listening TCP socket that we own; `into_raw_fd` gives
    // up our ownership so glommio's listener is its only owner.
    Ok(unsafe { glommio::net::TcpListener::from_raw_fd(socket.into_raw_fd()) })
}

/// One shard's HTTP front end.
struct ShardHttp {
    shard: Rc<Shard>,
    config: HttpConfig,
    slots: Rc<slots::Slots>,
    /// [`UNAUTHENTICATED_BODY_BYTES_PER_SHARD_MAX`], in bytes.
    body_budget: Rc<glommio::sync::Semaphore>,
    next_request: Cell<u64>,
    /// A large body was freed and [`release_memory`] is scheduled.
    large_bodies_freed: Cell<bool>,
}

/// What gives freed memory back to the system, set by the program that chose the allocator
/// (`sluiced`: mimalloc's `mi_collect`); unset (brokers embedded in tests), nothing is done.
static MEMORY_RELEASE: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// Sets what [`release_memory`] calls (once; later calls are ignored).
pub fn set_memory_release(release: fn()) {
    let _ = MEMORY_RELEASE.set(release);
}

/// Gives this shard's freed memory back to the system [`MEMORY_RELEASE_INTERVAL_MS`] after
/// the first large body freed since the last time, so that a burst of large requests (refused
/// uploads above all) leaves no resident memory behind; an idle shard is never woken for it.
async fn release_memory(http: Rc<ShardHttp>) {
    glommio::timer::sleep(Duration::from_millis(MEMORY_RELEASE_INTERVAL_MS)).await;
    http.large_bodies_freed.set(false);
    if let Some(release) = MEMORY_RELEASE.get() {
        release();
    }
}

impl ShardHttp {
    async fn connection(self: Rc<Self>, stream: glommio::net::TcpStream) {
        use futures::AsyncWriteExt;
        let Some((slot, evicted)) = self.slots.acquire() else {
            let mut stream = stream;
            let _ = stream
                .write_all(
                    b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                )
                .await;
            let _ = stream.close().await;
            return;
        };
        let slot = Rc::new(slot);
        let _ = stream.set_nodelay(true);
        let me = self.clone();
        let in_service = slot.clone();
        let service = hyper::service::service_fn(move |req| {
            let me = me.clone();
            // Busy from the moment a head has arrived until the response is produced: such
            // a connection is never closed to make room for another.
            let busy = in_service.busy();
            async move {
                let r = me.handle(req).await;
                drop(busy);
                Ok::<_, std::convert::Infallible>(r)
            }
        });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(io::GlommioTimer)
            .header_read_timeout(self.config.header_read_timeout)
            .keep_alive(true)
            .max_buf_size(REQUEST_HEAD_BYTES_MAX);
        let conn = builder.serve_connection(io::FuturesIo::new(stream), service);
        match futures::future::select(Box::pin(conn), evicted).await {
            futures::future::Either::Left((Err(e), _)) => {
                tracing::debug!(error = %e, "SQS HTTP connection ended");
            }
            futures::future::Either::Left((Ok(()), _)) => {}
            // Idle longest when the cap was reached: dropping the connection closes it.
            futures::future::Either::Right(_) => {}
        }
        drop(slot);
    }

    fn note_freed(self: &Rc<Self>, bytes: usize) {
        if bytes >= LARGE_BODY_BYTES_MIN && !self.large_bodies_freed.replace(true) {
            glommio::spawn_local(release_memory(self.clone())).detach();
        }
    }

    fn request_id(&self) -> String {
        let n = self.next_request.get();
        self.next_request.set(n.wrapping_add(1));
        let t = crate::runtime::now_ms();
        format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            (t >> 16) as u32,
            (t & 0xffff) as u16,
            self.shard.id & 0xfff,
            (n >> 48) & 0xfff,
            n & 0xffff_ffff_ffff
        )
    }

    /// Answers one request and counts it for metrics (action, error shape, latency).
    async fn handle(self: &Rc<Self>, req: Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
        let started = crate::runtime::monotonic_now();
        let outcome = Outcome {
            action: Cell::new("unknown"),
            error: Cell::new(None),
        };
        let mut response = self.handle_inner(req, &outcome).await;
        // In a cluster: which node answered (a forwarded answer keeps the leader's).
        if let Some(node) = crate::cluster::node::local() {
            if let Ok(v) = HeaderValue::from_str(&node.node_id().to_string()) {
                response.headers_mut().entry(SERVED_BY_HEADER).or_insert(v);
            }
        }
        crate::metrics::record_request(
            crate::metrics::Action::Sqs(outcome.action.get()),
            started.elapsed(),
            outcome.error.get().map(crate::metrics::ErrorKey::Sqs),
        );
        response
    }

    async fn handle_inner(
        self: &Rc<Self>,
        req: Request<hyper::body::Incoming>,
        outcome: &Outcome,
    ) -> Response<Full<Bytes>> {
        let request_id = self.request_id();
        let (parts, body) = req.into_parts();
        // The protocol of the answer: JSON if the client named a JSON target.
        let target = parts
            .headers
            .get("x-amz-target")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let json = target.is_some();
        let action_hint = target
            .as_deref()
            .and_then(|t| t.strip_prefix(TARGET_PREFIX))
            .unwrap_or("");
        outcome.action.set(static_action(action_hint));
        let fail = |e: SqsError, close: bool| {
            outcome.error.set(Some(e.shape));
            let mut r = error_response(json, &e, &request_id);
            if close {
                r.headers_mut()
                    .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
            }
            r
        };
        if parts.method != Method::POST && parts.method != Method::GET {
            return fail(
                SqsError::new(
                    "InvalidAction",
                    400,
                    format!(
                        "The HTTP method {} is not valid for this endpoint.",
                        parts.method
                    ),
                ),
                false,
            );
        }
        // With auth off, only local clients (DNS rebinding, cross-site form posts), before a
        // byte of the body is read.
        if self.config.auth.mode == AuthMode::None {
            if let Err(e) = local::check(&parts.headers, &self.config.allowed_hosts) {
                return fail(e.into(), true);
            }
        }
        let raw_path = parts.uri.path();
        let raw_query = parts.uri.query().unwrap_or("");
        let now_s = (crate::runtime::now_ms() / 1000) as i64;
        // SigV4: what can be checked without the body, before a byte of it is read. Refused
        // here, the body is never read (the connection closes).
        if let Err(e) = self.config.auth.precheck(&SignedRequest {
            method: parts.method.as_str(),
            raw_path,
            raw_query,
            headers: &parts.headers,
            body: &[],
            now_s,
        }) {
            return fail(SqsError::new(e.code, e.status, e.message), true);
        }
        // The size limit, before a byte of the body is buffered.
        let declared = parts
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > REQUEST_BODY_BYTES_MAX as u64) {
            return fail(too_large(action_hint), true);
        }
        // Room in the shard's budget of unauthenticated body bytes, held until the signature
        // has been checked (SigV4 only: with auth off there is nothing to wait for).
        let reserve = declared.map_or(REQUEST_BODY_BYTES_MAX, |n| n as usize);
        let permit = if self.config.auth.mode == AuthMode::SigV4 && reserve > 0 {
            let wait =
                glommio::timer::sleep(Duration::from_millis(UNAUTHENTICATED_BODY_WAIT_MS_MAX));
            let acquire = self.body_budget.acquire_static_permit(reserve as u64);
            match futures::future::select(Box::pin(acquire), Box::pin(wait)).await {
                futures::future::Either::Left((Ok(p), _)) => Some(p),
                _ => {
                    return fail(
                        SqsError::new(
                            "ServiceUnavailable",
                            503,
                            "Too many request bodies are being received before their \
                             signatures are checked; retry shortly.",
                        ),
                        true,
                    )
                }
            }
        } else {
            None
        };
        let read = read_body(body, reserve);
        let timeout = glommio::timer::sleep(self.config.body_read_timeout);
        let body = match futures::future::select(Box::pin(read), Box::pin(timeout)).await {
            futures::future::Either::Left((Ok(b), _)) => b,
            futures::future::Either::Left((Err(BodyError::TooLarge), _)) => {
                return fail(too_large(action_hint), true);
            }
            futures::future::Either::Left((Err(BodyError::Read), _)) => {
                return fail(
                    SqsError::new(
                        "MalformedRequest",
                        400,
                        "The request body could not be read.",
                    ),
                    true,
                );
            }
            futures::future::Either::Right(_) => {
                return fail(
                    SqsError::new(
                        "RequestTimeout",
                        400,
                        "The request body did not arrive in time.",
                    ),
                    true,
                )
            }
        };
        let caller = match self.config.auth.authenticate(&SignedRequest {
            method: parts.method.as_str(),
            raw_path,
            raw_query,
            headers: &parts.headers,
            body: &body,
            now_s,
        }) {
            Ok(c) => c,
            Err(e) => {
                // Give the memory back before the answer goes out.
                self.note_freed(body.len());
                drop(body);
                drop(permit);
                return fail(SqsError::new(e.code, e.status, e.message), true);
            }
        };
        // Authenticated: the body no longer counts against the unauthenticated budget.
        drop(permit);
        if let Err(e) = self.shard.admit(&caller.account, body.len() as u64) {
            return fail(e.into(), false);
        }
        let host = parts
            .headers
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .filter(|h| valid_host(h))
            .map_or_else(|| self.shard.config.http_addr.to_string(), str::to_string);
        let path_queue = (raw_path.len() > 1).then_some(raw_path);
        let decoded = if json {
            decode_json(target.as_deref().unwrap_or(""), &body)
        } else {
            decode_query(raw_query, &parts.headers, &body)
        };
        let (action, params) = match decoded {
            Ok(d) => d,
            Err(e) => return fail(e, false),
        };
        outcome.action.set(static_action(&action));
        let ctx = actions::Ctx {
            shard: &self.shard,
            caller: &caller,
            host: &host,
            path_queue,
        };
        self.note_freed(body.len());
        // In a cluster the body is kept (a reference, not a copy) in case the request must go
        // to the leader; a request forwarded to this node is never forwarded again.
        let forwardable = crate::cluster::node::local()
            .filter(|_| !parts.headers.contains_key(forward::FORWARDED_HEADER))
            .map(|node| (node, body.clone()));
        drop(body);
        let result = actions::dispatch(&ctx, &action, params).await;
        let result = match (result, forwardable) {
            (Err(mut e), Some((node, body)))
                if leader_to_ask(&e).is_some_and(|l| l != node.node_id()) =>
            {
                let leader = leader_to_ask(&e).unwrap_or_default();
                e.leader = None;
                let addr = node
                    .cluster()
                    .members
                    .iter()
                    .find(|m| m.id == leader)
                    .map(|m| m.http_addr);
                match addr {
                    Some(addr) => {
                        match forward::forward(addr, node.node_id(), &parts, body).await {
                            Ok(r) => return r,
                            Err(fe) => {
                                tracing::debug!(error = %fe, leader, "forwarding to the leader");
                                Err(e)
                            }
                        }
                    }
                    None => Err(e),
                }
            }
            // A queue this node does not know while no metadata leader is known (a node just
            // restarted): not an answer to give as final; the client retries.
            (Err(e), Some(_))
                if e.shape == "QueueDoesNotExist"
                    && crate::cluster::shard::meta_leader_hint().is_none() =>
            {
                Err(SqsError::new(
                    "ServiceUnavailable",
                    503,
                    "This node's catalog may be behind and no metadata leader is known yet; retry.",
                ))
            }
            (r, _) => r,
        };
        match result {
            Ok(out) => {
                let mut buf = Vec::with_capacity(256);
                if json {
                    protocol::render_json(out.as_ref(), &mut buf);
                } else {
                    protocol::render_xml(&action, out.as_ref(), &request_id, &mut buf);
                }
                response(StatusCode::OK, json, buf, &request_id)
            }
            Err(e) => fail(e, false),
        }
    }
}

/// Why a body could not be read.
enum BodyError {
    /// Over [`REQUEST_BODY_BYTES_MAX`] (a chunked body, or one longer than declared).
    TooLarge,
    /// The connection failed or the framing was bad.
    Read,
}

/// Reads a body, never past [`REQUEST_BODY_BYTES_MAX`]. A body that arrives as one frame (the
/// usual case: a declared length that came in one read) is that frame's bytes, not a copy;
/// otherwise the frames go into one buffer of `expected` bytes (its declared length; the
/// maximum for a chunked body), grown as they arrive: what was reserved for a body is what it
/// holds, not a list of chunks and then a copy.
async fn read_body(mut body: hyper::body::Incoming, expected: usize) -> Result<Bytes, BodyError> {
    use http_body_util::BodyExt;
    let mut first: Option<Bytes> = None;
    let mut buf: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| BodyError::Read)?;
        if let Ok(data) = frame.into_data() {
            let have = first.as_ref().map_or(0, Bytes::len) + buf.len();
            if have + data.len() > REQUEST_BODY_BYTES_MAX {
                return Err(BodyError::TooLarge);
            }
            if buf.is_empty() && first.is_none() {
                first = Some(data);
                continue;
            }
            if let Some(f) = first.take() {
                buf.reserve_exact(expected.clamp(have + data.len(), REQUEST_BODY_BYTES_MAX));
                buf.extend_from_slice(&f);
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(match first {
        Some(f) => f,
        None => Bytes::from(buf),
    })
}

/// What a request was, for metrics: filled in as it is decoded and answered.
struct Outcome {
    action: Cell<&'static str>,
    error: Cell<Option<&'static str>>,
}

/// The action's name from the model's closed list (a bounded metric label), or "unknown".
fn static_action(action: &str) -> &'static str {
    actions::ACTIONS
        .iter()
        .copied()
        .find(|a| *a == action)
        .unwrap_or("unknown")
}

/// Host header values we are willing to echo into queue URLs.
fn valid_host(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= 255
        && h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'))
}

/// The error for a body over [`REQUEST_BODY_BYTES_MAX`]: what SQS says of an oversized batch or
/// message; for any other action (or a Query request, whose action is in the unread body) the
/// request as a whole is too large.
fn too_large(action: &str) -> SqsError {
    match action {
        "SendMessageBatch" => crate::engine::EngineError::BatchRequestTooLong {
            size_bytes: REQUEST_BODY_BYTES_MAX,
        }
        .into(),
        "SendMessage" => SqsError::invalid(
            "MessageBody",
            format!("the request body is larger than {REQUEST_BODY_BYTES_MAX} bytes"),
        ),
        _ => SqsError::new(
            "RequestEntityTooLarge",
            413,
            format!("The request body is larger than {REQUEST_BODY_BYTES_MAX} bytes."),
        ),
    }
}

/// `application/x-www-form-urlencoded` pairs, strictly: a name or value whose percent-decoded
/// bytes are not UTF-8 is refused (as the JSON protocol refuses such a string), never replaced
/// by U+FFFD.
fn form_pairs(src: &[u8]) -> impl Iterator<Item = Result<(String, String), SqsError>> + '_ {
    fn decode(part: &[u8]) -> Result<String, SqsError> {
        let plus_as_space: Vec<u8> = part
            .iter()
            .map(|&b| if b == b'+' { b' ' } else { b })
            .collect();
        let bytes: Vec<u8> = percent_encoding::percent_decode(&plus_as_space).collect();
        String::from_utf8(bytes).map_err(|_| {
            SqsError::new(
                "MalformedQueryString",
                400,
                format!(
                    "The parameter {:?} is not valid UTF-8 once percent-decoded.",
                    String::from_utf8_lossy(part)
                ),
            )
        })
    }
    src.split(|&b| b == b'&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = match pair.iter().position(|&b| b == b'=') {
                Some(i) => (&pair[..i], &pair[i + 1..]),
                None => (pair, &pair[..0]),
            };
            Ok((decode(k)?, decode(v)?))
        })
}

/// An AWS JSON 1.0 request: `X-Amz-Target: AmazonSQS.<Action>` and a JSON object body. A
/// target that names no SQS action is `UnknownOperationException`, as AWS answers it.
pub(crate) fn decode_json(target: &str, body: &[u8]) -> Result<(String, Params), SqsError> {
    let action = target
        .strip_prefix(TARGET_PREFIX)
        .filter(|a| actions::ACTIONS.contains(a))
        .ok_or_else(|| {
            SqsError::new(
                "UnknownOperationException",
                400,
                format!(
                    "The X-Amz-Target {target:?} names no operation of this service: \
                     expected AmazonSQS.<Action>"
                ),
            )
        })?;
    let map = if body.iter().all(u8::is_ascii_whitespace) {
        serde_json::Map::new()
    } else {
        match serde_json::from_slice::<serde_json::Value>(body) {
            Ok(serde_json::Value::Object(m)) => m,
            Ok(_) => {
                return Err(SqsError::new(
                    "SerializationException",
                    400,
                    "The request body must be a JSON object.",
                ))
            }
            Err(e) => {
                return Err(SqsError::new(
                    "SerializationException",
                    400,
                    format!("The request body is not valid JSON: {e}"),
                ))
            }
        }
    };
    Ok((action.to_string(), Params::from_json(map)))
}

pub(crate) fn decode_query(
    raw_query: &str,
    headers: &http::HeaderMap,
    body: &[u8],
) -> Result<(String, Params), SqsError> {
    let form_body = !body.is_empty()
        && headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_none_or(|ct| ct.starts_with("application/x-www-form-urlencoded"));
    if !body.is_empty() && !form_body {
        return Err(SqsError::new(
            "InvalidAction",
            400,
            "Send AWS JSON 1.0 (X-Amz-Target) or a form-encoded Query request.",
        ));
    }
    if std::str::from_utf8(body).is_err() {
        return Err(SqsError::new(
            "MalformedQueryString",
            400,
            "The request body is not UTF-8.",
        ));
    }
    let mut params = BTreeMap::new();
    let sources: [&[u8]; 2] = [raw_query.as_bytes(), if form_body { body } else { b"" }];
    for src in sources {
        for pair in form_pairs(src) {
            let (k, v) = pair?;
            if k.starts_with("X-Amz-") || k == "Version" {
                continue;
            }
            if params.len() >= protocol::QUERY_PARAMS_MAX {
                return Err(SqsError::invalid("Request", "too many parameters"));
            }
            params.insert(k, v);
        }
    }
    let action = params.remove("Action").ok_or_else(|| {
        SqsError::new(
            "MissingAction",
            400,
            "The request must contain the parameter Action.",
        )
    })?;
    if !actions::ACTIONS.contains(&action.as_str()) {
        return Err(SqsError::new(
            "InvalidAction",
            400,
            format!("The action {action} is not valid for this endpoint."),
        ));
    }
    let map = protocol::query_to_json(&action, params)?;
    Ok((action, Params::from_query(map)))
}

fn response(
    status: StatusCode,
    json: bool,
    body: Vec<u8>,
    request_id: &str,
) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(if json {
            JSON_CONTENT_TYPE
        } else {
            XML_CONTENT_TYPE
        }),
    );
    if let Ok(v) = HeaderValue::from_str(request_id) {
        h.insert("x-amzn-requestid", v);
    }
    r
}

fn error_response(json: bool, e: &SqsError, request_id: &str) -> Response<Full<Bytes>> {
    let mut buf = Vec::with_capacity(256);
    if json {
        protocol::render_json_error(e, &mut buf);
    } else {
        protocol::render_xml_error(e, request_id, &mut buf);
    }
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST);
    let mut r = response(status, json, buf, request_id);
    let fault = if e.sender_fault { "Sender" } else { "Receiver" };
    if let Ok(v) = HeaderValue::from_str(&format!("{};{fault}", e.code)) {
        r.headers_mut().insert("x-amzn-query-error", v);
    }
    r
}
