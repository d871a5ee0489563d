//! One QUIC connection to the broker: the handshake, a small pool of streams, request ids and
//! the matching of answers to callers.
//!
//! Each stream has a writer task (frames from a bounded channel, written in order) and a reader
//! task (frames decoded as they arrive, handed to the waiting caller by request id). Request ids
//! are unique per connection; answers may come back in any order.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use sluice_wire::{
    decode_response, encode_request, FrameDecoder, Hello, HelloOk, Request, Response,
    FRAME_BYTES_MAX, FRAME_BYTES_MIN,
};
use tokio::sync::{mpsc, oneshot};

use crate::error::{Error, Result};

/// Frames queued for one stream's writer before callers wait (back-pressure).
const WRITE_QUEUE_FRAMES_MAX: usize = 256;
/// Bytes read from a stream at a time.
const READ_CHUNK_BYTES: usize = 64 * 1024;

type Waiter = oneshot::Sender<Result<Reply>>;

/// An answer as the stream's reader decoded it: a fetch's batches stay in the frame's buffer
/// (`wire::decode_fetch_result`: a consumer's megabytes are not copied out by rkyv).
pub(crate) enum Reply {
    Response(Response),
    Fetch(sluice_wire::FetchedBatches),
}

impl Reply {
    pub(crate) fn into_response(self) -> Response {
        match self {
            Reply::Response(r) => r,
            Reply::Fetch(f) => Response::Fetch(f.into()),
        }
    }
}

#[derive(Default)]
struct Waiters {
    /// Set once the stream's reader has stopped: nobody will answer new requests.
    closed: Option<String>,
    map: HashMap<u64, Waiter>,
}

struct Stream {
    writer: mpsc::Sender<Bytes>,
    waiters: Arc<Mutex<Waiters>>,
}

pub(crate) struct Connection {
    connection: quinn::Connection,
    streams: Vec<Stream>,
    next_stream: AtomicUsize,
    next_id: AtomicU64,
    broken: AtomicBool,
    /// The broker's limit on requests in flight per connection: callers beyond it wait here
    /// instead of being refused with `TooManyInFlightRequests`.
    permits: tokio::sync::Semaphore,
    pub(crate) hello: HelloOk,
}

fn lock(w: &Mutex<Waiters>) -> std::sync::MutexGuard<'_, Waiters> {
    w.lock().unwrap_or_else(|e| e.into_inner())
}

impl Connection {
    /// Connects, says `Hello`, and opens `streams` streams (the handshake's stream is the first).
    pub(crate) async fn open(
        endpoint: &quinn::Endpoint,
        config: quinn::ClientConfig,
        addr: SocketAddr,
        server_name: &str,
        hello: Hello,
        streams: usize,
    ) -> Result<Connection> {
        let connection = endpoint
            .connect_with(config, addr, server_name)
            .map_err(|e| Error::Connect(e.to_string()))?
            .await
            .map_err(|e| Error::Connect(e.to_string()))?;
        let (mut send, mut recv) = connection
            .open_bi()
            .await
            .map_err(|e| Error::Connect(e.to_string()))?;
        let frame = encode_request(0, &Request::Hello(hello))
            .map_err(|e| Error::InvalidRequest(e.to_string()))?;
        send.write_chunk(frame)
            .await
            .map_err(|e| Error::Connect(e.to_string()))?;
        let mut decoder = FrameDecoder::new(FRAME_BYTES_MIN).reserve_declared();
        let (first, leftover) = loop {
            let chunk = recv
                .read_chunk(READ_CHUNK_BYTES, true)
                .await
                .map_err(|e| Error::Connect(format!("handshake: {e}")))?
                .ok_or_else(|| Error::Connect("handshake: the broker closed the stream".into()))?;
            let mut input: &[u8] = &chunk.bytes;
            if let Some(frame) = decoder
                .decode(&mut input)
                .map_err(|e| Error::Connect(format!("handshake: {e}")))?
            {
                break (frame, input.to_vec());
            }
        };
        let hello_ok = match decode_response(&first) {
            Ok(Response::HelloOk(ok)) => ok,
            Ok(Response::Error(e)) => return Err(Error::from_response(e)),
            Ok(other) => {
                return Err(Error::Protocol(format!(
                    "expected HelloOk, got {:?}",
                    other.kind()
                )))
            }
            Err(e) => return Err(Error::Protocol(format!("handshake answer: {e}"))),
        };
        let frame_bytes_max = (hello_ok.response_frame_bytes_max as usize).min(FRAME_BYTES_MAX);
        decoder.set_frame_bytes_max(frame_bytes_max);
        let mut pool = vec![spawn_stream(send, recv, decoder, leftover)];
        for _ in 1..streams.max(1) {
            let (send, recv) = connection
                .open_bi()
                .await
                .map_err(|e| Error::Connect(e.to_string()))?;
            pool.push(spawn_stream(
                send,
                recv,
                FrameDecoder::new(frame_bytes_max).reserve_declared(),
                Vec::new(),
            ));
        }
        Ok(Connection {
            connection,
            streams: pool,
            next_stream: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            broken: AtomicBool::new(false),
            permits: tokio::sync::Semaphore::new(hello_ok.in_flight_requests_max.max(1) as usize),
            hello: hello_ok,
        })
    }

    /// Whether this connection can take no more requests (closed, or a stream failed).
    pub(crate) fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Relaxed) || self.connection.close_reason().is_some()
    }

    pub(crate) fn close(&self) {
        self.connection.close(0u32.into(), b"client closed");
    }

    /// Sends one request and waits for its answer (at most `timeout`).
    pub(crate) async fn call(&self, request: &Request, timeout: Duration) -> Result<Reply> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame =
            encode_request(id, request).map_err(|e| Error::InvalidRequest(e.to_string()))?;
        let i = self.next_stream.fetch_add(1, Ordering::Relaxed) % self.streams.len();
        let stream = &self.streams[i];
        let (tx, rx) = oneshot::channel();
        {
            let mut w = lock(&stream.waiters);
            if let Some(why) = &w.closed {
                self.broken.store(true, Ordering::Relaxed);
                return Err(Error::ConnectionLost(why.clone()));
            }
            w.map.insert(id, tx);
        }
        // Removes the waiter however this call ends (answer, timeout, caller dropped).
        struct Forget<'a>(&'a Mutex<Waiters>, u64);
        impl Drop for Forget<'_> {
            fn drop(&mut self) {
                lock(self.0).map.remove(&self.1);
            }
        }
        let _forget = Forget(&stream.waiters, id);
        let answer = tokio::time::timeout(timeout, async {
            let _permit = self
                .permits
                .acquire()
                .await
                .map_err(|_| Error::ConnectionLost("connection closed".into()))?;
            if stream.writer.send(frame).await.is_err() {
                self.broken.store(true, Ordering::Relaxed);
                return Err(Error::ConnectionLost("stream writer stopped".into()));
            }
            rx.await
                .unwrap_or_else(|_| Err(Error::ConnectionLost("stream closed".into())))
        })
        .await;
        match answer {
            Ok(Err(e @ Error::ConnectionLost(_))) => {
                self.broken.store(true, Ordering::Relaxed);
                Err(e)
            }
            Ok(r) => r,
            Err(_) => Err(Error::Timeout(timeout)),
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.close();
    }
}

fn spawn_stream(
    mut send: quinn::SendStream,
    recv: quinn::RecvStream,
    decoder: FrameDecoder,
    leftover: Vec<u8>,
) -> Stream {
    let (writer, mut frames) = mpsc::channel::<Bytes>(WRITE_QUEUE_FRAMES_MAX);
    let waiters = Arc::new(Mutex::new(Waiters::default()));
    tokio::spawn(async move {
        // Frames go to quinn as they are (`write_chunk` takes the buffer; `write_all` would
        // copy it into one of its own first).
        while let Some(frame) = frames.recv().await {
            if send.write_chunk(frame).await.is_err() {
                return;
            }
        }
        let _ = send.finish();
    });
    tokio::spawn(read_loop(recv, decoder, leftover, waiters.clone()));
    Stream { writer, waiters }
}

async fn read_loop(
    mut recv: quinn::RecvStream,
    mut decoder: FrameDecoder,
    leftover: Vec<u8>,
    waiters: Arc<Mutex<Waiters>>,
) {
    let mut why = deliver(&mut decoder, &leftover, &waiters);
    while why.is_none() {
        why = match recv.read_chunk(READ_CHUNK_BYTES, true).await {
            Ok(Some(chunk)) => deliver(&mut decoder, &chunk.bytes, &waiters),
            Ok(None) => Some("the broker finished the stream".to_string()),
            Err(e) => Some(e.to_string()),
        };
    }
    let why = why.unwrap_or_default();
    let mut w = lock(&waiters);
    w.closed = Some(why.clone());
    for (_, waiter) in w.map.drain() {
        let _ = waiter.send(Err(Error::ConnectionLost(why.clone())));
    }
}

/// Hands every complete frame in `bytes` to its waiter; `Some(reason)` once the stream is
/// unusable.
fn deliver(decoder: &mut FrameDecoder, bytes: &[u8], waiters: &Mutex<Waiters>) -> Option<String> {
    let mut input = bytes;
    loop {
        let frame = match decoder.decode(&mut input) {
            Ok(Some(frame)) => frame,
            Ok(None) => return None,
            Err(e) if !e.is_fatal() => {
                let id = e.request_id();
                if let Some(w) = lock(waiters).map.remove(&id) {
                    let _ = w.send(Err(Error::Protocol(e.to_string())));
                }
                continue;
            }
            Err(e) => return Some(format!("undecodable answer: {e}")),
        };
        let id = frame.request_id();
        if frame.kind() == Some(sluice_wire::frame::FrameKind::FetchResult) {
            let answer = sluice_wire::decode_fetch_result(frame)
                .map(Reply::Fetch)
                .map_err(|e| Error::Protocol(e.to_string()));
            if let Some(w) = lock(waiters).map.remove(&id) {
                let _ = w.send(answer);
            }
            continue;
        }
        let answer = match decode_response(&frame) {
            // Request id 0: about the stream or connection, not one request.
            Ok(Response::Error(e)) if id == 0 => {
                return Some(format!("the broker failed the stream: {}", e.message))
            }
            Ok(Response::Error(e)) => Err(Error::from_response(e)),
            Ok(Response::NotLeader(n)) => Err(Error::from_not_leader(n)),
            Ok(r) => Ok(Reply::Response(r)),
            Err(e) => Err(Error::Protocol(e.to_string())),
        };
        if let Some(w) = lock(waiters).map.remove(&id) {
            let _ = w.send(answer);
        }
    }
}
