//! [`ShardEndpoint`]: one shard's quinn endpoint on its glommio executor.

use std::cell::Cell;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use glommio::timer::Timer;
use quinn::VarInt;

use super::runtime::GlommioRuntime;
use super::udp::{GlommioUdpSocket, UdpOptions, UdpStats};

/// Application close code sent to peers when the broker shuts down (QUIC's "no error").
pub const CLOSE_CODE_SHUTDOWN: u32 = 0;
/// After closing, how long at most to wait for peers to acknowledge the close.
pub const CLOSE_WAIT_MAX: Duration = Duration::from_millis(500);
/// How often shutdown re-checks the in-flight stream count while draining.
const DRAIN_POLL_INTERVAL: Duration = Duration::from_millis(1);

/// How to bind a shard's endpoint.
#[derive(Clone, Debug)]
pub struct EndpointOptions {
    /// Set `SO_REUSEPORT` so every shard can bind the same address (see the module doc).
    pub reuse_port: bool,
    pub udp: UdpOptions,
    pub endpoint_config: quinn::EndpointConfig,
}

impl Default for EndpointOptions {
    fn default() -> Self {
        Self {
            reuse_port: true,
            udp: UdpOptions::default(),
            endpoint_config: quinn::EndpointConfig::default(),
        }
    }
}

/// What a graceful shutdown found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Streams still in flight when the grace period ended (0: all finished).
    pub streams_cut: usize,
    /// Connections open when the endpoint was closed.
    pub connections_closed: usize,
    /// Whether every peer acknowledged the close within [`CLOSE_WAIT_MAX`].
    pub idle: bool,
}

#[derive(Default)]
struct Shared {
    draining: Cell<bool>,
    streams_in_flight: Cell<usize>,
}

/// One shard's QUIC endpoint. `!Send`: it lives and dies on the executor that bound it.
pub struct ShardEndpoint {
    endpoint: quinn::Endpoint,
    socket: Arc<GlommioUdpSocket>,
    shared: Rc<Shared>,
}

impl ShardEndpoint {
    /// Binds a server endpoint on the current glommio executor.
    pub fn bind(
        addr: SocketAddr,
        server_config: quinn::ServerConfig,
        options: EndpointOptions,
    ) -> io::Result<Self> {
        Self::bind_inner(addr, Some(server_config), options)
    }

    /// Binds a client-only endpoint (outgoing connections, e.g. replication) on the current
    /// glommio executor.
    pub fn bind_client(addr: SocketAddr, options: EndpointOptions) -> io::Result<Self> {
        Self::bind_inner(addr, None, options)
    }

    fn bind_inner(
        addr: SocketAddr,
        server_config: Option<quinn::ServerConfig>,
        options: EndpointOptions,
    ) -> io::Result<Self> {
        let socket = socket2::Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::DGRAM,
            Some(socket2::Protocol::UDP),
        )?;
        if options.reuse_port {
            socket.set_reuse_port(true)?;
        }
        socket.bind(&addr.into())?;
        let runtime = Arc::new(GlommioRuntime::new(options.udp.clone()));
        let udp = runtime.wrap_socket(socket.into())?;
        let endpoint = quinn::Endpoint::new_with_abstract_socket(
            options.endpoint_config,
            server_config,
            udp.clone(),
            runtime,
        )?;
        Ok(Self {
            endpoint,
            socket: udp,
            shared: Rc::new(Shared::default()),
        })
    }

    /// The bound address (with the real port when bound to port 0).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.endpoint.local_addr()
    }

    /// The next incoming connection attempt; `None` once shutdown has begun or the endpoint
    /// is closed. Complete the handshake with [`Incoming::accept`] in a task of its own, so a
    /// slow handshake does not hold up the accept loop.
    pub async fn accept(&self) -> Option<Incoming> {
        if self.shared.draining.get() {
            return None;
        }
        let incoming = self.endpoint.accept().await?;
        if self.shared.draining.get() {
            incoming.refuse();
            return None;
        }
        Some(Incoming { inner: incoming })
    }

    /// Opens a connection to a server.
    pub fn connect(
        &self,
        config: quinn::ClientConfig,
        addr: SocketAddr,
        server_name: &str,
    ) -> Result<quinn::Connecting, quinn::ConnectError> {
        self.endpoint.connect_with(config, addr, server_name)
    }

    /// Counts in-flight streams for graceful shutdown; cheap to clone into handler tasks.
    pub fn tracker(&self) -> StreamTracker {
        StreamTracker {
            shared: self.shared.clone(),
        }
    }

    /// Counters of the UDP socket (sends, real `EAGAIN`s, back-offs, receive batches).
    pub fn udp_stats(&self) -> UdpStats {
        self.socket.stats()
    }

    /// quinn's own statistics and knobs, for what this type does not wrap.
    pub fn quinn(&self) -> &quinn::Endpoint {
        &self.endpoint
    }

    /// Graceful shutdown: refuse new connections and new streams ([`StreamTracker::start`]
    /// returns `None` from now on), wait up to `grace` for in-flight streams (those holding a [`StreamGuard`]) to
    /// finish, then close every connection and wait at most [`CLOSE_WAIT_MAX`] for the peers
    /// to acknowledge.
    pub async fn shutdown(&self, grace: Duration) -> ShutdownReport {
        self.shared.draining.set(true);
        // Refuse (with CONNECTION_REFUSED, so clients fail fast instead of timing out) what
        // arrives while draining; the task ends when `close` below makes accept return None.
        let refuser = self.endpoint.clone();
        glommio::spawn_local(async move {
            while let Some(incoming) = refuser.accept().await {
                incoming.refuse();
            }
        })
        .detach();
        let deadline = crate::runtime::monotonic_now() + grace;
        // A bounded poll: shutdown happens once, and a 1 ms step costs nothing next to it.
        while self.shared.streams_in_flight.get() > 0 && crate::runtime::monotonic_now() < deadline
        {
            Timer::new(
                DRAIN_POLL_INTERVAL
                    .min(deadline.saturating_duration_since(crate::runtime::monotonic_now())),
            )
            .await;
        }
        let streams_cut = self.shared.streams_in_flight.get();
        let connections_closed = self.endpoint.open_connections();
        self.endpoint
            .close(VarInt::from_u32(CLOSE_CODE_SHUTDOWN), b"shutdown");
        let idle = {
            let wait = std::pin::pin!(self.endpoint.wait_idle());
            let timeout = std::pin::pin!(Timer::new(CLOSE_WAIT_MAX));
            matches!(
                futures::future::select(wait, timeout).await,
                futures::future::Either::Left(_)
            )
        };
        ShutdownReport {
            streams_cut,
            connections_closed,
            idle,
        }
    }
}

/// A connection attempt accepted by [`ShardEndpoint::accept`].
pub struct Incoming {
    inner: quinn::Incoming,
}

impl Incoming {
    /// The client's address.
    pub fn remote_address(&self) -> SocketAddr {
        self.inner.remote_address()
    }

    /// Refuses the connection (the client sees CONNECTION_REFUSED).
    pub fn refuse(self) {
        self.inner.refuse();
    }

    /// Completes the handshake (TLS, and client-certificate checks under mutual TLS).
    pub async fn accept(self) -> Result<quinn::Connection, quinn::ConnectionError> {
        self.inner.await
    }
}

/// Counts streams in flight on one shard's endpoint.
#[derive(Clone)]
pub struct StreamTracker {
    shared: Rc<Shared>,
}

impl StreamTracker {
    /// Marks a stream in flight until the guard drops; `None` if shutdown has begun (the
    /// handler should then reset the stream instead of starting work).
    pub fn start(&self) -> Option<StreamGuard> {
        if self.shared.draining.get() {
            return None;
        }
        self.shared
            .streams_in_flight
            .set(self.shared.streams_in_flight.get() + 1);
        Some(StreamGuard {
            shared: self.shared.clone(),
        })
    }

    /// Streams in flight now.
    pub fn in_flight(&self) -> usize {
        self.shared.streams_in_flight.get()
    }

    /// Whether shutdown has begun.
    pub fn is_draining(&self) -> bool {
        self.shared.draining.get()
    }
}

/// A stream in flight; dropping it tells shutdown the stream is done. Drop it only once the
/// peer has the response: after `SendStream::finish`, await `SendStream::stopped` (it resolves
/// when the peer has acknowledged all data), or a shutdown may close the connection while the
/// tail of the response is still unacknowledged.
pub struct StreamGuard {
    shared: Rc<Shared>,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let n = self.shared.streams_in_flight.get();
        debug_assert!(n > 0, "stream guard count underflow");
        self.shared.streams_in_flight.set(n.saturating_sub(1));
    }
}
