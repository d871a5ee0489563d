//! QUIC inside glommio executors: the transport of the broker's native front end.
//!
//! | module     | purpose                                                                 |
//! |------------|-------------------------------------------------------------------------|
//! | `endpoint` | [`ShardEndpoint`]: bind, accept, connect, graceful shutdown, counters   |
//! | `runtime`  | [`GlommioRuntime`]: quinn's `Runtime` on one glommio executor           |
//! | `udp`      | the socket: batched `recvmmsg` + glommio peek wake-ups; send back-off   |
//! | `guard`    | [`ThreadBound`]: `Send + Sync` by checking the owner thread             |
//! | `tls`      | self-signed / configured certificates, mutual TLS, ALPN `sluice/1`      |
//!
//! # One endpoint per shard, one port for all shards
//!
//! Every shard (one glommio executor pinned to one core) binds its own UDP socket to the
//! *same* address with `SO_REUSEPORT` and runs its own quinn endpoint on it; nothing about
//! QUIC is shared between cores. The kernel picks the socket for each incoming datagram by a
//! hash of its 4-tuple (source and destination address and port), so all datagrams of one
//! client socket land on the same shard for as long as the client's address does not change:
//! that shard did the handshake, holds the connection state, and serves all its streams.
//!
//! Trade-offs of letting the kernel spread flows:
//!
//! - **Migration and NAT rebinding.** A client whose address or port changes (NAT rebinding,
//!   Wi-Fi to cellular) hashes to a possibly different socket; that shard's endpoint does not
//!   know the connection id, so the connection stalls until it times out and the SDK
//!   reconnects. Clients of a broker sit mostly in data centres with stable addresses; the
//!   fix, when needed, is an eBPF `SO_ATTACH_REUSEPORT_EBPF` program that routes by a shard
//!   id encoded in the server's connection ids (quinn's `ConnectionIdGenerator`).
//! - **Uneven spreading.** The hash balances *flows*, not load: a few heavy clients can land
//!   on one core. The broker's shards exchange work over glommio channels anyway (a
//!   connection may address partitions owned by other shards), so the skew costs a hop, not
//!   correctness. Clients that need more throughput open more connections.
//! - **Membership changes.** Adding or closing a socket of the group re-hashes flows, so
//!   in-flight connections of *other* shards may move: shards bind at start-up and keep their
//!   sockets until shutdown.
//! - **Stateless packets.** A datagram for an unknown connection id (after a move above, or
//!   a late packet after a shard closed) may trigger a stateless reset from the wrong shard;
//!   the peer then sees the connection reset, which is the intended outcome anyway.
//!
//! # Threads
//!
//! quinn assumes a multi-threaded runtime and wants `Send + Sync` everywhere. Here the
//! endpoint, every connection driver, timer and socket of a shard live on its executor
//! thread; the `!Send` glommio pieces sit in [`ThreadBound`], which panics on use and aborts
//! on drop from another thread. Handles such as `quinn::Connection` are `Send` in their type,
//! but must not be moved off the shard either: hand data to other shards, not handles.

mod endpoint;
pub mod guard;
mod runtime;
pub mod tls;
mod udp;

pub use endpoint::{
    EndpointOptions, Incoming, ShardEndpoint, ShutdownReport, StreamGuard, StreamTracker,
    CLOSE_CODE_SHUTDOWN, CLOSE_WAIT_MAX,
};
pub use guard::ThreadBound;
pub use runtime::{GlommioRuntime, SEND_BACKOFF_DEFAULT};
pub use udp::{GlommioUdpSocket, UdpOptions, UdpStats};
