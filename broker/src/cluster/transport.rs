//! [`PeerTransport`]: one shard's QUIC endpoint for the other nodes of the cluster (see the
//! module doc of `crate::cluster` for the connection and stream layout).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::{select, Either};
use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};
use glommio::timer::Timer;
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::VarInt;
use rustls::pki_types::CertificateDer;
use sluice_raft::codec::{self, CodecLimits};
use sluice_raft::{DecodeError, Envelope, NodeId};

use crate::quic::tls::{self, Identity, TlsError};
use crate::quic::{EndpointOptions, Incoming, ShardEndpoint};

/// ALPN of the node-to-node protocol, version 1 (clients speak `sluice/1`).
pub const PEER_ALPN: &[u8] = b"sluice-peer/1";
/// Prefix of the DNS name that carries a node's id in its certificate.
const NODE_NAME_PREFIX: &str = "sluice-node-";
/// Default bound of a peer's heartbeat queue, in envelopes.
pub const HEARTBEAT_QUEUE_MAX: usize = 64;
/// Default bound of a peer's bulk (group message) queue, in envelopes.
pub const BULK_QUEUE_MAX: usize = 1024;
/// Default bound of the received-envelope channel, in envelopes.
pub const INBOX_MAX: usize = 4096;
/// First wait before reconnecting to a peer after a failed connect or a lost connection.
pub const BACKOFF_MIN: Duration = Duration::from_millis(50);
/// Longest wait between reconnect attempts (the back-off doubles up to this).
pub const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// A peer connection without any packet for this long is closed (dead peer detection).
pub const PEER_IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// Keep-alive interval on peer connections, well under [`PEER_IDLE_TIMEOUT`].
pub const PEER_KEEP_ALIVE: Duration = Duration::from_secs(1);
/// Bytes of a frame's length prefix.
const FRAME_HEADER_BYTES: usize = 4;
/// Application close code for a connection whose certificate names no node id.
const CLOSE_NO_NODE_ID: u32 = 1;
/// Application close code when the transport shuts down.
const CLOSE_SHUTDOWN: u32 = 0;
/// Send priority of the heartbeat stream over the bulk stream (quinn: higher goes first).
const HEARTBEAT_PRIORITY: i32 = 1;

/// The DNS name a node's certificate carries (as a subject alternative name) for `node`.
pub fn node_cert_name(node: NodeId) -> String {
    format!("{NODE_NAME_PREFIX}{node}")
}

/// The node id a DER certificate names, if it names exactly one (via [`node_cert_name`]).
pub fn node_id_from_cert(der: &[u8]) -> Option<NodeId> {
    let mut found: Option<NodeId> = None;
    for name in tls::client_cert_names(der) {
        let Some(id) = name
            .strip_prefix(NODE_NAME_PREFIX)
            .and_then(|s| s.parse::<NodeId>().ok())
        else {
            continue;
        };
        match found {
            Some(f) if f != id => return None,
            _ => found = Some(id),
        }
    }
    found
}

/// The two streams of a peer connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamKind {
    Heartbeat,
    Bulk,
}

impl StreamKind {
    fn tag(self) -> u8 {
        match self {
            StreamKind::Heartbeat => 1,
            StreamKind::Bulk => 2,
        }
    }

    fn from_tag(tag: u8) -> Option<Self> {
        match tag {
            1 => Some(StreamKind::Heartbeat),
            2 => Some(StreamKind::Bulk),
            _ => None,
        }
    }

    /// The stream an envelope travels on.
    pub fn of(env: &Envelope) -> Self {
        match env {
            Envelope::Heartbeat(_) | Envelope::HeartbeatResp(_) => StreamKind::Heartbeat,
            Envelope::Group(_) => StreamKind::Bulk,
        }
    }
}

/// How to run a [`PeerTransport`].
#[derive(Clone, Debug)]
pub struct PeerTransportConfig {
    /// This node's id; its certificate must name it ([`node_cert_name`]).
    pub node_id: NodeId,
    /// Where the peer endpoint listens (`127.0.0.1:0` in tests).
    pub listen: SocketAddr,
    /// This node's certificate chain and key, signed by the cluster CA.
    pub identity: Identity,
    /// The cluster CA(s): peers' certificates must chain to one of them.
    pub cluster_ca: Vec<CertificateDer<'static>>,
    /// What the codec accepts; frames above `limits.max_encoded_bytes()` are refused.
    pub limits: CodecLimits,
    /// Bound of each peer's heartbeat queue, in envelopes.
    pub heartbeat_queue_max: usize,
    /// Bound of each peer's bulk queue, in envelopes.
    pub bulk_queue_max: usize,
    /// Bound of the received-envelope channel, in envelopes.
    pub inbox_max: usize,
}

impl PeerTransportConfig {
    /// A config with the default limits.
    pub fn new(
        node_id: NodeId,
        listen: SocketAddr,
        identity: Identity,
        cluster_ca: Vec<CertificateDer<'static>>,
    ) -> Self {
        Self {
            node_id,
            listen,
            identity,
            cluster_ca,
            limits: CodecLimits::default(),
            heartbeat_queue_max: HEARTBEAT_QUEUE_MAX,
            bulk_queue_max: BULK_QUEUE_MAX,
            inbox_max: INBOX_MAX,
        }
    }
}

/// An envelope received from an authenticated peer.
#[derive(Debug)]
pub struct Received {
    /// The node id of the peer's certificate (equal to `envelope.from()`).
    pub from: NodeId,
    pub envelope: Envelope,
}

/// Setting up the transport failed.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("peer TLS: {0}")]
    Tls(#[from] TlsError),
    #[error("binding the peer endpoint: {0}")]
    Bind(#[from] std::io::Error),
}

/// Why [`PeerTransport::send`] did not queue an envelope.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SendError {
    #[error("no address known for node {0}")]
    UnknownPeer(NodeId),
    #[error("envelope of {bytes} bytes exceeds the frame limit of {max_bytes} bytes")]
    TooLarge { bytes: usize, max_bytes: usize },
    #[error("the {kind:?} queue to node {peer} is full; envelope dropped")]
    QueueFull { peer: NodeId, kind: StreamKind },
    #[error("the transport is closed")]
    Closed,
}

/// Why a received stream was stopped. Each variant has its own counter and stop code.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("unknown stream kind {0}")]
    UnknownStreamKind(u8),
    #[error("frame of {bytes} bytes exceeds the limit of {max_bytes} bytes")]
    TooLarge { bytes: usize, max_bytes: usize },
    #[error("stream ended inside a frame")]
    Truncated,
    #[error("reading the stream: {0}")]
    Read(#[from] quinn::ReadError),
    #[error("undecodable frame: {0}")]
    Decode(#[from] DecodeError),
    #[error("frame from node {claimed} on a connection authenticated as node {cert}")]
    FromMismatch { cert: NodeId, claimed: NodeId },
    #[error("{kind:?} envelope on the other stream")]
    WrongStream { kind: StreamKind },
}

impl FrameError {
    /// The QUIC stop code sent to the writer.
    pub fn code(&self) -> u32 {
        match self {
            FrameError::UnknownStreamKind(_) => 1,
            FrameError::TooLarge { .. } => 2,
            FrameError::Truncated => 3,
            FrameError::Read(_) => 4,
            FrameError::Decode(_) => 5,
            FrameError::FromMismatch { .. } => 6,
            FrameError::WrongStream { .. } => 7,
        }
    }
}

/// Counters of one transport (a snapshot).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransportStats {
    /// Frames written to peers.
    pub frames_sent: u64,
    /// Envelopes received, checked and delivered.
    pub frames_received: u64,
    /// Envelopes dropped because a peer's send queue was full.
    pub dropped_queue_full: u64,
    /// Envelopes dropped because the inbox was full.
    pub dropped_inbox_full: u64,
    /// Frames lost in a write when their connection failed.
    pub lost_in_write: u64,
    /// Outgoing connections established.
    pub connects: u64,
    /// Outgoing connection attempts that failed.
    pub connects_failed: u64,
    /// Established outgoing connections that were lost.
    pub connections_lost: u64,
    /// Incoming handshakes that failed (wrong CA, wrong ALPN, ...).
    pub handshakes_failed: u64,
    /// Incoming connections whose certificate names no node id.
    pub refused_identity: u64,
    /// Received streams stopped: unknown kind byte.
    pub refused_stream_kind: u64,
    /// Received frames refused: longer than the limit.
    pub refused_too_large: u64,
    /// Received frames refused: undecodable.
    pub refused_decode: u64,
    /// Received frames refused: `from` differs from the certificate's node id.
    pub refused_from_mismatch: u64,
    /// Received frames refused: on the other stream than their kind's.
    pub refused_wrong_stream: u64,
    /// Received streams that ended inside a frame or failed to read.
    pub streams_broken: u64,
}

#[derive(Default)]
struct Counters(RefCell<TransportStats>);

impl Counters {
    fn bump(&self, f: impl FnOnce(&mut TransportStats) -> &mut u64) {
        let mut s = self.0.borrow_mut();
        *f(&mut s) += 1;
    }

    fn frame_error(&self, e: &FrameError) {
        self.bump(|s| match e {
            FrameError::UnknownStreamKind(_) => &mut s.refused_stream_kind,
            FrameError::TooLarge { .. } => &mut s.refused_too_large,
            FrameError::Truncated | FrameError::Read(_) => &mut s.streams_broken,
            FrameError::Decode(_) => &mut s.refused_decode,
            FrameError::FromMismatch { .. } => &mut s.refused_from_mismatch,
            FrameError::WrongStream { .. } => &mut s.refused_wrong_stream,
        });
    }
}

/// The sending side of one peer: its address and two bounded queues of encoded frames.
struct Peer {
    addr: SocketAddr,
    heartbeat: LocalSender<Bytes>,
    bulk: LocalSender<Bytes>,
    /// The queues' receivers until the peer's task takes them on the first send.
    idle: Option<(LocalReceiver<Bytes>, LocalReceiver<Bytes>)>,
}

struct Inner {
    node_id: NodeId,
    endpoint: ShardEndpoint,
    client_config: quinn::ClientConfig,
    limits: CodecLimits,
    heartbeat_queue_max: usize,
    bulk_queue_max: usize,
    peers: RefCell<HashMap<NodeId, Peer>>,
    inbox: LocalSender<Received>,
    counters: Counters,
    closed: Cell<bool>,
    /// Peers with an established outgoing connection now.
    connected: RefCell<BTreeSet<NodeId>>,
}

/// One shard's transport to the other nodes. `!Send`: it lives on the executor that bound it.
pub struct PeerTransport {
    inner: Rc<Inner>,
}

fn transport_config() -> quinn::TransportConfig {
    let mut t = quinn::TransportConfig::default();
    let idle_ms = u32::try_from(PEER_IDLE_TIMEOUT.as_millis()).unwrap_or(u32::MAX);
    t.max_idle_timeout(Some(VarInt::from_u32(idle_ms).into()));
    t.keep_alive_interval(Some(PEER_KEEP_ALIVE));
    t
}

fn peer_server_config(
    identity: &Identity,
    ca: &[CertificateDer<'static>],
) -> Result<quinn::ServerConfig, TlsError> {
    let mut tls = tls::rustls_server_config(identity, Some(ca))?;
    tls.alpn_protocols = vec![PEER_ALPN.to_vec()];
    let quic = QuicServerConfig::try_from(tls).map_err(|e| TlsError::Quic(e.to_string()))?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(quic));
    config.transport_config(Arc::new(transport_config()));
    Ok(config)
}

fn peer_client_config(
    identity: &Identity,
    ca: &[CertificateDer<'static>],
) -> Result<quinn::ClientConfig, TlsError> {
    let mut tls = tls::rustls_client_config(ca, Some(identity))?;
    tls.alpn_protocols = vec![PEER_ALPN.to_vec()];
    let quic = QuicClientConfig::try_from(tls).map_err(|e| TlsError::Quic(e.to_string()))?;
    let mut config = quinn::ClientConfig::new(Arc::new(quic));
    config.transport_config(Arc::new(transport_config()));
    Ok(config)
}

impl PeerTransport {
    /// Binds the peer endpoint on the current glommio executor and starts accepting. Received
    /// envelopes arrive on the returned channel (bounded by `inbox_max`).
    pub fn bind(
        config: PeerTransportConfig,
    ) -> Result<(Self, LocalReceiver<Received>), TransportError> {
        let server = peer_server_config(&config.identity, &config.cluster_ca)?;
        let client_config = peer_client_config(&config.identity, &config.cluster_ca)?;
        let options = EndpointOptions {
            // One peer endpoint per node address: no sharing with other sockets.
            reuse_port: false,
            ..EndpointOptions::default()
        };
        let endpoint = ShardEndpoint::bind(config.listen, server, options)?;
        let (inbox, inbox_rx) = local_channel::new_bounded(config.inbox_max);
        let inner = Rc::new(Inner {
            node_id: config.node_id,
            endpoint,
            client_config,
            limits: config.limits,
            heartbeat_queue_max: config.heartbeat_queue_max,
            bulk_queue_max: config.bulk_queue_max,
            peers: RefCell::new(HashMap::new()),
            inbox,
            counters: Counters::default(),
            closed: Cell::new(false),
            connected: RefCell::new(BTreeSet::new()),
        });
        glommio::spawn_local(accept_loop(inner.clone())).detach();
        Ok((Self { inner }, inbox_rx))
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.inner.node_id
    }

    /// The bound address of the peer endpoint.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.endpoint.local_addr()
    }

    /// Where to reach `node`. Takes effect for a peer not yet sent to; an address change of a
    /// connected peer is not supported yet.
    pub fn add_peer(&self, node: NodeId, addr: SocketAddr) {
        let mut peers = self.inner.peers.borrow_mut();
        peers.entry(node).or_insert_with(|| {
            let (heartbeat, hb_rx) = local_channel::new_bounded(self.inner.heartbeat_queue_max);
            let (bulk, bulk_rx) = local_channel::new_bounded(self.inner.bulk_queue_max);
            Peer {
                addr,
                heartbeat,
                bulk,
                idle: Some((hb_rx, bulk_rx)),
            }
        });
    }

    /// Queues `env` for `env.to()`, connecting lazily. Never waits: a full queue drops the
    /// envelope (counted; Raft retransmits).
    pub fn send(&self, env: &Envelope) -> Result<(), SendError> {
        if self.inner.closed.get() {
            return Err(SendError::Closed);
        }
        let peer_id = env.to();
        let max_bytes = self.inner.limits.max_encoded_bytes();
        let bytes = encode_checked(env, max_bytes)?;
        let kind = StreamKind::of(env);
        let mut peers = self.inner.peers.borrow_mut();
        let peer = peers
            .get_mut(&peer_id)
            .ok_or(SendError::UnknownPeer(peer_id))?;
        self.start_peer(peer_id, peer);
        let queue = match kind {
            StreamKind::Heartbeat => &peer.heartbeat,
            StreamKind::Bulk => &peer.bulk,
        };
        queue.try_send(bytes).map_err(|_| {
            self.inner.counters.bump(|s| &mut s.dropped_queue_full);
            SendError::QueueFull {
                peer: peer_id,
                kind,
            }
        })
    }

    /// Connects to `node` now rather than on the first send (and keeps reconnecting), so that
    /// the connection is up before Raft needs it and its state shows in the metrics.
    pub fn dial(&self, node: NodeId) -> Result<(), SendError> {
        if self.inner.closed.get() {
            return Err(SendError::Closed);
        }
        let mut peers = self.inner.peers.borrow_mut();
        let peer = peers.get_mut(&node).ok_or(SendError::UnknownPeer(node))?;
        self.start_peer(node, peer);
        Ok(())
    }

    /// Starts `peer`'s connection task unless it runs.
    fn start_peer(&self, node: NodeId, peer: &mut Peer) {
        if let Some((hb_rx, bulk_rx)) = peer.idle.take() {
            glommio::spawn_local(run_peer(
                self.inner.clone(),
                node,
                peer.addr,
                hb_rx,
                bulk_rx,
            ))
            .detach();
        }
    }

    /// The peers this transport has an established outgoing connection to, ascending.
    pub fn connected(&self) -> Vec<NodeId> {
        self.inner.connected.borrow().iter().copied().collect()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> TransportStats {
        *self.inner.counters.0.borrow()
    }

    /// Closes every connection and the endpoint; peer tasks end.
    pub async fn close(&self) {
        self.inner.closed.set(true);
        self.inner.connected.borrow_mut().clear();
        // Dropping the queues' senders ends the peer tasks' pumps.
        self.inner.peers.borrow_mut().clear();
        self.inner.endpoint.shutdown(Duration::ZERO).await;
    }
}

/// Encodes `env`, refusing an encoding longer than `max_bytes` (the receiver would refuse it).
fn encode_checked(env: &Envelope, max_bytes: usize) -> Result<Bytes, SendError> {
    let bytes = codec::encode(env);
    if bytes.len() > max_bytes || u32::try_from(bytes.len()).is_err() {
        return Err(SendError::TooLarge {
            bytes: bytes.len(),
            max_bytes,
        });
    }
    Ok(bytes)
}

/// Why an outgoing connection ended.
#[derive(Debug, thiserror::Error)]
enum LinkError {
    #[error("connect: {0}")]
    Connect(#[from] quinn::ConnectError),
    #[error("connection: {0}")]
    Connection(#[from] quinn::ConnectionError),
    #[error("write: {0}")]
    Write(#[from] quinn::WriteError),
}

/// The sender of one peer: connect, open both streams, pump both queues; on a loss, wait and
/// reconnect. Ends when the transport closes.
async fn run_peer(
    inner: Rc<Inner>,
    peer: NodeId,
    addr: SocketAddr,
    hb_rx: LocalReceiver<Bytes>,
    bulk_rx: LocalReceiver<Bytes>,
) {
    let mut backoff = BACKOFF_MIN;
    while !inner.closed.get() {
        match connect(&inner, peer, addr).await {
            Ok(conn) => {
                inner.counters.bump(|s| &mut s.connects);
                backoff = BACKOFF_MIN;
                inner.connected.borrow_mut().insert(peer);
                let result = serve_link(&inner, &conn, &hb_rx, &bulk_rx).await;
                inner.connected.borrow_mut().remove(&peer);
                if inner.closed.get() {
                    break;
                }
                inner.counters.bump(|s| &mut s.connections_lost);
                tracing::debug!(peer, error = ?result.err(), "peer connection lost");
                conn.close(VarInt::from_u32(CLOSE_SHUTDOWN), b"reconnecting");
            }
            Err(e) => {
                inner.counters.bump(|s| &mut s.connects_failed);
                tracing::debug!(peer, error = %e, "connecting to peer failed");
            }
        }
        if inner.closed.get() {
            break;
        }
        Timer::new(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

async fn connect(
    inner: &Inner,
    peer: NodeId,
    addr: SocketAddr,
) -> Result<quinn::Connection, LinkError> {
    let connecting =
        inner
            .endpoint
            .connect(inner.client_config.clone(), addr, &node_cert_name(peer))?;
    Ok(connecting.await?)
}

/// Runs one connection until it fails or the queues close.
async fn serve_link(
    inner: &Inner,
    conn: &quinn::Connection,
    hb_rx: &LocalReceiver<Bytes>,
    bulk_rx: &LocalReceiver<Bytes>,
) -> Result<(), LinkError> {
    let hb = open_stream(conn, StreamKind::Heartbeat).await?;
    let bulk = open_stream(conn, StreamKind::Bulk).await?;
    let hb_pump = std::pin::pin!(pump(inner, hb, hb_rx));
    let bulk_pump = std::pin::pin!(pump(inner, bulk, bulk_rx));
    let closed = std::pin::pin!(conn.closed());
    match select(select(hb_pump, bulk_pump), closed).await {
        Either::Left((Either::Left((r, _)) | Either::Right((r, _)), _)) => r,
        Either::Right((e, _)) => Err(e.into()),
    }
}

async fn open_stream(
    conn: &quinn::Connection,
    kind: StreamKind,
) -> Result<quinn::SendStream, LinkError> {
    let mut stream = conn.open_uni().await?;
    if kind == StreamKind::Heartbeat {
        // Only fails on a stream already closed; the write below reports that.
        let _ = stream.set_priority(HEARTBEAT_PRIORITY);
    }
    stream.write_all(&[kind.tag()]).await?;
    Ok(stream)
}

async fn pump(
    inner: &Inner,
    mut stream: quinn::SendStream,
    rx: &LocalReceiver<Bytes>,
) -> Result<(), LinkError> {
    while let Some(frame) = rx.recv().await {
        // `send` refused frames whose length does not fit a u32.
        let len = u32::try_from(frame.len()).unwrap_or(u32::MAX);
        let written = async {
            stream.write_all(&len.to_le_bytes()).await?;
            stream.write_all(&frame).await
        }
        .await;
        if let Err(e) = written {
            inner.counters.bump(|s| &mut s.lost_in_write);
            return Err(e.into());
        }
        inner.counters.bump(|s| &mut s.frames_sent);
    }
    let _ = stream.finish();
    Ok(())
}

async fn accept_loop(inner: Rc<Inner>) {
    while let Some(incoming) = inner.endpoint.accept().await {
        glommio::spawn_local(serve_incoming(inner.clone(), incoming)).detach();
    }
}

/// Completes a peer's handshake, authenticates its node id and reads its streams.
async fn serve_incoming(inner: Rc<Inner>, incoming: Incoming) {
    let conn = match incoming.accept().await {
        Ok(conn) => conn,
        Err(e) => {
            inner.counters.bump(|s| &mut s.handshakes_failed);
            tracing::debug!(error = %e, "peer handshake failed");
            return;
        }
    };
    let peer = conn
        .peer_identity()
        .and_then(|id| id.downcast::<Vec<CertificateDer<'static>>>().ok())
        .and_then(|chain| chain.first().and_then(|leaf| node_id_from_cert(leaf)));
    let Some(peer) = peer else {
        inner.counters.bump(|s| &mut s.refused_identity);
        conn.close(
            VarInt::from_u32(CLOSE_NO_NODE_ID),
            b"certificate names no node",
        );
        return;
    };
    while let Ok(stream) = conn.accept_uni().await {
        glommio::spawn_local(serve_stream(inner.clone(), peer, stream)).detach();
    }
}

async fn serve_stream(inner: Rc<Inner>, peer: NodeId, mut stream: quinn::RecvStream) {
    if let Err(e) = read_frames(&inner, peer, &mut stream).await {
        inner.counters.frame_error(&e);
        tracing::warn!(peer, error = %e, "peer stream refused");
        // Fails only if the stream is already finished or reset: nothing left to stop.
        let _ = stream.stop(VarInt::from_u32(e.code()));
    }
}

/// Reads `buf.len()` bytes; `Ok(false)` if the stream ended cleanly before the first byte.
async fn read_exact_or_end(
    stream: &mut quinn::RecvStream,
    buf: &mut [u8],
) -> Result<bool, FrameError> {
    match stream.read_exact(buf).await {
        Ok(()) => Ok(true),
        Err(quinn::ReadExactError::FinishedEarly(0)) => Ok(false),
        Err(quinn::ReadExactError::FinishedEarly(_)) => Err(FrameError::Truncated),
        Err(quinn::ReadExactError::ReadError(e)) => Err(FrameError::Read(e)),
    }
}

async fn read_frames(
    inner: &Inner,
    peer: NodeId,
    stream: &mut quinn::RecvStream,
) -> Result<(), FrameError> {
    let mut tag = [0u8; 1];
    if !read_exact_or_end(stream, &mut tag).await? {
        return Ok(());
    }
    let kind = StreamKind::from_tag(tag[0]).ok_or(FrameError::UnknownStreamKind(tag[0]))?;
    let max_bytes = inner.limits.max_encoded_bytes();
    loop {
        let mut header = [0u8; FRAME_HEADER_BYTES];
        if !read_exact_or_end(stream, &mut header).await? {
            return Ok(());
        }
        let bytes = usize::try_from(u32::from_le_bytes(header)).unwrap_or(usize::MAX);
        if bytes > max_bytes {
            return Err(FrameError::TooLarge { bytes, max_bytes });
        }
        let mut payload = vec![0u8; bytes];
        if !read_exact_or_end(stream, &mut payload).await? && bytes > 0 {
            return Err(FrameError::Truncated);
        }
        let envelope = codec::decode_bytes(Bytes::from(payload), &inner.limits)?;
        if envelope.from() != peer {
            return Err(FrameError::FromMismatch {
                cert: peer,
                claimed: envelope.from(),
            });
        }
        let env_kind = StreamKind::of(&envelope);
        if env_kind != kind {
            return Err(FrameError::WrongStream { kind: env_kind });
        }
        match inner.inbox.try_send(Received {
            from: peer,
            envelope,
        }) {
            Ok(()) => inner.counters.bump(|s| &mut s.frames_received),
            Err(_) => inner.counters.bump(|s| &mut s.dropped_inbox_full),
        }
    }
}
