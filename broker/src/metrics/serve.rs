//! The metrics and health listener on shard 0: `GET /metrics` (Prometheus text), `/health`
//! (liveness: 200 while the process serves), `/ready` (readiness: 200 once every shard has
//! started its front ends, 503 before), and the web console under `/console/` (`crate::console`:
//! its own login, sessions and CSRF checks). hyper's HTTP/1.1 on glommio, as the SQS front end.
//!
//! The endpoint is unauthenticated (as Prometheus endpoints are): keep it on loopback or a
//! private network (the default is 127.0.0.1:9400). Per-queue and per-group series name
//! accounts, queues, groups and topics; `metrics.queue_labels = false` leaves them out.
//!
//! Health checks must answer whoever floods the port: connections are capped
//! ([`CONNECTIONS_MAX`]) with the longest-idle one closed for a new one (`http::slots`), idle
//! connections time out ([`HEADER_READ_TIMEOUT_MS`]), and `/metrics` renders — the only costly
//! request — run [`SCRAPES_CONCURRENT_MAX`] at a time (more get 503); `/health` and `/ready`
//! never wait for them.

use crate::http::io::{FuturesIo, GlommioTimer};
use crate::http::slots::{AcceptErrors, Slots};
use crate::shard::Shard;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use std::cell::Cell;
use std::os::fd::{FromRawFd, IntoRawFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Connections served at once (scrapers and health checkers are few); at the cap the
/// longest-idle one is closed for a new one.
pub const CONNECTIONS_MAX: usize = 64;
/// Time to receive a request head (and keep-alive idle time): scrapers come back every 10–60 s
/// and reconnect cheaply, so an idle connection does not hold a slot for long.
pub const HEADER_READ_TIMEOUT_MS: u64 = 5_000;
/// `/metrics` renders at once (each asks every shard); more get 503 at once.
pub const SCRAPES_CONCURRENT_MAX: usize = 4;

/// What the listener needs besides the shard: start time and how many shards are up.
#[derive(Clone)]
pub struct Readiness {
    pub started: Instant,
    pub shards_ready: Arc<AtomicUsize>,
    pub shards: usize,
}

impl Readiness {
    pub fn is_ready(&self) -> bool {
        self.shards_ready.load(Ordering::Acquire) >= self.shards
    }
}

/// Binds the metrics address ahead of the shards (so port 0 is resolved before the config is
/// shared). A bind failure is not fatal: the broker runs without metrics and says so.
pub fn bind(addr: std::net::SocketAddr) -> Option<std::net::TcpListener> {
    match std::net::TcpListener::bind(addr) {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::warn!(%addr, error = %e, "metrics and health endpoint not started: bind failed");
            None
        }
    }
}

/// Serves `/metrics`, `/health` and `/ready` on shard 0 until the executor stops.
pub async fn serve(shard: Rc<Shard>, listener: std::net::TcpListener, readiness: Readiness) {
    let addr = listener.local_addr().ok();
    // SAFETY: the descriptor is a bound, listening TCP socket that we own; `into_raw_fd` gives
    // up our ownership so glommio's listener is its only owner.
    let listener = unsafe { glommio::net::TcpListener::from_raw_fd(listener.into_raw_fd()) };
    tracing::info!(addr = ?addr, "metrics and health endpoint listening");
    let slots = Slots::new(CONNECTIONS_MAX);
    let scrapes = Rc::new(Cell::new(0usize));
    let console = Rc::new(crate::console::Console::default());
    let mut accept_errors = AcceptErrors::new("metrics");
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
        // Every connection busy (scrapes in progress on all 64): refuse this one.
        let Some((slot, evicted)) = slots.acquire() else {
            drop(stream);
            continue;
        };
        let (shard, readiness, scrapes) = (shard.clone(), readiness.clone(), scrapes.clone());
        let console = console.clone();
        let peer = stream.peer_addr().ok().map(|a| a.ip());
        glommio::spawn_local(async move {
            let slot = Rc::new(slot);
            let in_service = slot.clone();
            let service = hyper::service::service_fn(move |req| {
                let (shard, readiness, scrapes, console) = (
                    shard.clone(),
                    readiness.clone(),
                    scrapes.clone(),
                    console.clone(),
                );
                let busy = in_service.busy();
                async move {
                    let path = req.uri().path();
                    let r = if path == "/console" || path.starts_with("/console/") {
                        console_request(&console, &shard, &readiness, peer, req).await
                    } else {
                        handle(&shard, &readiness, &scrapes, req).await
                    };
                    drop(busy);
                    Ok::<_, std::convert::Infallible>(r)
                }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(GlommioTimer)
                .header_read_timeout(Duration::from_millis(HEADER_READ_TIMEOUT_MS))
                .keep_alive(true);
            let conn = builder.serve_connection(FuturesIo::new(stream), service);
            if let futures::future::Either::Left((Err(e), _)) =
                futures::future::select(Box::pin(conn), evicted).await
            {
                tracing::debug!(error = %e, "metrics connection ended");
            }
            drop(slot);
        })
        .detach();
    }
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    r
}

/// The time a console request's body may take to arrive.
pub const CONSOLE_BODY_READ_TIMEOUT_MS: u64 = 10_000;

/// Reads a console request's body (bounded in size and time) and hands it to `console`.
async fn console_request(
    console: &crate::console::Console,
    shard: &Rc<Shard>,
    readiness: &Readiness,
    peer: Option<std::net::IpAddr>,
    req: Request<hyper::body::Incoming>,
) -> Response<Full<Bytes>> {
    use http_body_util::BodyExt;
    const PLAIN: &str = "text/plain; charset=utf-8";
    let (parts, body) = req.into_parts();
    let limited = http_body_util::Limited::new(body, crate::console::API_BODY_BYTES_MAX);
    let read = Box::pin(limited.collect());
    let timeout = Box::pin(glommio::timer::sleep(Duration::from_millis(
        CONSOLE_BODY_READ_TIMEOUT_MS,
    )));
    let body = match futures::future::select(read, timeout).await {
        futures::future::Either::Left((Ok(b), _)) => b.to_bytes(),
        futures::future::Either::Left((Err(_), _)) => {
            return text(
                StatusCode::PAYLOAD_TOO_LARGE,
                PLAIN,
                "request body too large or unreadable\n".into(),
            )
        }
        futures::future::Either::Right(_) => {
            return text(
                StatusCode::REQUEST_TIMEOUT,
                PLAIN,
                "request body did not arrive in time\n".into(),
            )
        }
    };
    crate::console::handle(
        console,
        shard,
        crate::console::RequestInfo {
            method: &parts.method,
            path: parts.uri.path(),
            query: parts.uri.query().unwrap_or(""),
            headers: &parts.headers,
            body,
            peer,
            ready: readiness.is_ready(),
            uptime_s: readiness.started.elapsed().as_secs_f64(),
        },
    )
    .await
}

/// Counts a `/metrics` render while it runs.
struct Scrape(Rc<Cell<usize>>);

impl Drop for Scrape {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

async fn handle<B>(
    shard: &Shard,
    readiness: &Readiness,
    scrapes: &Rc<Cell<usize>>,
    req: Request<B>,
) -> Response<Full<Bytes>> {
    const PLAIN: &str = "text/plain; charset=utf-8";
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, PLAIN, "GET only\n".into());
    }
    match req.uri().path() {
        "/health" => text(StatusCode::OK, PLAIN, "ok\n".into()),
        "/ready" => {
            if readiness.is_ready() && shard.disk.is_full(crate::runtime::now_ms()) {
                // Not ready for writes: a load balancer should send producers elsewhere (the
                // broker still serves receives and deletes, for consumers to drain).
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    PLAIN,
                    "disk full: sends are refused until space is freed; receives and deletes \
                     go on\n"
                        .into(),
                )
            } else if readiness.is_ready() {
                text(StatusCode::OK, PLAIN, "ready\n".into())
            } else {
                text(StatusCode::SERVICE_UNAVAILABLE, PLAIN, "starting\n".into())
            }
        }
        "/metrics" => {
            if scrapes.get() >= SCRAPES_CONCURRENT_MAX {
                return text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    PLAIN,
                    "too many scrapes at once; retry\n".into(),
                );
            }
            scrapes.set(scrapes.get() + 1);
            let _scrape = Scrape(scrapes.clone());
            let labels = shard.config.metrics_queue_labels;
            let snapshots = shard.metrics_snapshots().await;
            let queues = if labels {
                shard.metrics_queue_labels()
            } else {
                Vec::new()
            };
            let mut body = super::render(
                &snapshots,
                &queues,
                readiness.started.elapsed(),
                readiness.is_ready(),
            );
            let now = crate::runtime::now_ms();
            super::render_disk(
                &mut body,
                shard.disk.free_bytes(now),
                shard.disk.free_bytes_min(),
            );
            // Group lag asks the coordinator and the partitions' owners; a slow shard must
            // not hang the scrape, so it is bounded like the snapshots.
            if labels {
                let timeout = Duration::from_millis(super::SHARD_SNAPSHOT_TIMEOUT_MS);
                let lags = Box::pin(shard.metrics_group_lags());
                let sleep = Box::pin(glommio::timer::sleep(timeout));
                let (lags, truncated) = match futures::future::select(lags, sleep).await {
                    futures::future::Either::Left((r, _)) => r,
                    futures::future::Either::Right(_) => (Vec::new(), true),
                };
                super::render_group_lag(&mut body, &lags, truncated);
            }
            text(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                body,
            )
        }
        _ => text(
            StatusCode::NOT_FOUND,
            PLAIN,
            "not found: try /metrics, /health, /ready or /console/\n".into(),
        ),
    }
}
