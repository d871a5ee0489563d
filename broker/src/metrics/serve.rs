//! The metrics and health listener on shard 0: `GET /metrics` (Prometheus text), `/health`
//! (liveness: 200 while the process serves), `/ready` (readiness: 200 once every shard has
//! started its front ends, 503 before). hyper's HTTP/1.1 on glommio, as the SQS front end.

use crate::http::io::{FuturesIo, GlommioTimer};
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

/// Scrape connections served at once; more are closed at accept (scrapers are few).
pub const CONNECTIONS_MAX: usize = 64;
/// Time to receive a request head (and keep-alive idle time).
pub const HEADER_READ_TIMEOUT_MS: u64 = 10_000;

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
    let connections = Rc::new(Cell::new(0usize));
    loop {
        let stream = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "metrics endpoint: accept failed");
                glommio::timer::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if connections.get() >= CONNECTIONS_MAX {
            drop(stream);
            continue;
        }
        connections.set(connections.get() + 1);
        let (shard, readiness, connections) =
            (shard.clone(), readiness.clone(), connections.clone());
        glommio::spawn_local(async move {
            let service = hyper::service::service_fn(move |req| {
                let (shard, readiness) = (shard.clone(), readiness.clone());
                async move {
                    Ok::<_, std::convert::Infallible>(handle(&shard, &readiness, req).await)
                }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(GlommioTimer)
                .header_read_timeout(Duration::from_millis(HEADER_READ_TIMEOUT_MS))
                .keep_alive(true);
            if let Err(e) = builder
                .serve_connection(FuturesIo::new(stream), service)
                .await
            {
                tracing::debug!(error = %e, "metrics connection ended");
            }
            connections.set(connections.get() - 1);
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

async fn handle<B>(shard: &Shard, readiness: &Readiness, req: Request<B>) -> Response<Full<Bytes>> {
    const PLAIN: &str = "text/plain; charset=utf-8";
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, PLAIN, "GET only\n".into());
    }
    match req.uri().path() {
        "/health" => text(StatusCode::OK, PLAIN, "ok\n".into()),
        "/ready" => {
            if readiness.is_ready() {
                text(StatusCode::OK, PLAIN, "ready\n".into())
            } else {
                text(StatusCode::SERVICE_UNAVAILABLE, PLAIN, "starting\n".into())
            }
        }
        "/metrics" => {
            let snapshots = shard.metrics_snapshots().await;
            let queues = shard.metrics_queue_labels();
            let mut body = super::render(
                &snapshots,
                &queues,
                readiness.started.elapsed(),
                readiness.is_ready(),
            );
            // Group lag asks the coordinator and the partitions' owners; a slow shard must
            // not hang the scrape, so it is bounded like the snapshots.
            let timeout = Duration::from_millis(super::SHARD_SNAPSHOT_TIMEOUT_MS);
            let lags = Box::pin(shard.metrics_group_lags());
            let (lags, truncated) =
                match futures::future::select(lags, Box::pin(glommio::timer::sleep(timeout))).await
                {
                    futures::future::Either::Left((r, _)) => r,
                    futures::future::Either::Right(_) => (Vec::new(), true),
                };
            super::render_group_lag(&mut body, &lags, truncated);
            text(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                body,
            )
        }
        _ => text(
            StatusCode::NOT_FOUND,
            PLAIN,
            "not found: try /metrics, /health or /ready\n".into(),
        ),
    }
}
