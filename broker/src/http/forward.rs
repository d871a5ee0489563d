//! Forwarding an SQS request to the node that leads what it needs (cluster mode).
//!
//! AWS SDKs cannot pick a node: whichever node a request reaches answers it. When the request
//! failed here with `NotLeader` and nothing was done (the error says so), the request is sent
//! once, as received — method, path, query, headers (the SigV4 signature covers the `Host`
//! header, which is kept), body — to the leader's SQS listener, and its answer is relayed. A
//! forwarded request carries [`FORWARDED_HEADER`]; a node never forwards such a request again
//! (leadership moving mid-flight gives the client a retryable 503 instead of a loop).
//!
//! One TCP connection per forwarded request: forwarding happens for clients that reach a
//! follower; a pool of connections per peer is the next step where that is the common case.

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body_util::{BodyExt, Full};
use std::net::SocketAddr;
use std::time::Duration;

use super::io::FuturesIo;

/// Marks a request one node forwarded to another.
pub const FORWARDED_HEADER: &str = "x-sluice-forwarded-by";
/// A forwarded request's whole exchange must end within this: the longest long poll (20 s)
/// plus the body-read and commit time it may take on the leader.
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(45);
/// The most of an answer taken back (a ReceiveMessage of ten 1 MiB messages, encoded).
const RESPONSE_BYTES_MAX: usize = 32 * 1024 * 1024;

/// Why a forward failed (the client then gets the original retryable error).
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("connecting to the leader at {0}: {1}")]
    Connect(SocketAddr, std::io::Error),
    #[error("talking to the leader: {0}")]
    Http(#[from] hyper::Error),
    #[error("the leader did not answer within {0:?}")]
    Timeout(Duration),
    #[error("reading the leader's answer (at most {RESPONSE_BYTES_MAX} bytes): {0}")]
    Body(String),
    #[error("building the forwarded request: {0}")]
    Request(#[from] http::Error),
}

/// Sends the request (`parts`, `body`) to `addr` marked as forwarded by node `from`, and
/// returns the answer.
pub async fn forward(
    addr: SocketAddr,
    from: u64,
    parts: &http::request::Parts,
    body: Bytes,
) -> Result<Response<Full<Bytes>>, ForwardError> {
    let exchange = exchange(addr, from, parts, body);
    let timeout = glommio::timer::sleep(FORWARD_TIMEOUT);
    match futures::future::select(Box::pin(exchange), Box::pin(timeout)).await {
        futures::future::Either::Left((r, _)) => r,
        futures::future::Either::Right(_) => Err(ForwardError::Timeout(FORWARD_TIMEOUT)),
    }
}

async fn exchange(
    addr: SocketAddr,
    from: u64,
    parts: &http::request::Parts,
    body: Bytes,
) -> Result<Response<Full<Bytes>>, ForwardError> {
    let stream = glommio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| ForwardError::Connect(addr, e.into()))?;
    let _ = stream.set_nodelay(true);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(FuturesIo::new(stream)).await?;
    let driver = glommio::spawn_local(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "forwarded request's connection");
        }
    });
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let mut req = Request::builder()
        .method(parts.method.clone())
        .uri(path)
        .body(Full::new(body))?;
    *req.headers_mut() = parts.headers.clone();
    req.headers_mut().insert(
        FORWARDED_HEADER,
        HeaderValue::from_str(&from.to_string()).expect("digits"),
    );
    let resp = sender.send_request(req).await?;
    let (rparts, rbody) = resp.into_parts();
    let limited = http_body_util::Limited::new(rbody, RESPONSE_BYTES_MAX);
    let bytes = limited
        .collect()
        .await
        .map_err(|e| ForwardError::Body(e.to_string()))?
        .to_bytes();
    drop(sender);
    driver.detach();
    Ok(Response::from_parts(rparts, Full::new(bytes)))
}
