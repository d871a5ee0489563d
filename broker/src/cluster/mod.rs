//! The cluster's network: how broker nodes exchange Raft messages.
//!
//! | module      | purpose                                                                 |
//! |-------------|-------------------------------------------------------------------------|
//! | `transport` | [`PeerTransport`]: one shard's QUIC endpoint for peers, mutual TLS with  |
//! |             | a cluster CA, ALPN [`PEER_ALPN`], framed `Envelope`s on two streams     |
//! | `clock`     | [`LeaderClock`]: a leader's engine time, safe for inherited leases      |
//! | `supervisor`| [`PartitionSupervisor`]: a queue partition's actor on its leader only     |
//! | `replicated`| [`ReplicaHost`]: a shard's replicas, their driver tasks and the router   |
//! |             | from the transport; [`ReplicatedLog`]: a replica behind `PartitionLog`  |
//! | `identity`  | [`NodeIdentity`]: node id and disk id, made once in `<data>/node.id`    |
//! | `config`    | [`ClusterConfig`]: the `[cluster]` section checked against this node    |
//! | `node`      | [`ShardNode`]: one shard's transport to the same shard of every member  |
//! | `dev`       | a local cluster for development (`sluice dev cluster`), certificates    |
//! | `shard`     | [`ClusterShard`]: a running shard's replicas, supervisors and the       |
//! |             | replicated metadata catalog                                             |
//!
//! The peer endpoint is separate from the clients' (`crate::quic`): its own UDP port, its own
//! ALPN (`sluice-peer/1`, so a client cannot speak Raft and a peer cannot open the client
//! protocol), and client certificates are required on both sides and must chain to the
//! cluster CA. A node's id is in its certificate as the DNS name `sluice-node-<id>`
//! ([`node_cert_name`]): the dialer checks it as the server name, the acceptor reads it from
//! the client certificate; every received envelope must name that id as its `from`.
//!
//! # Connections and streams
//!
//! A node dials each peer it sends to, lazily on the first send, and keeps that one outgoing
//! connection (reconnecting after a loss with a doubling back-off, [`BACKOFF_MIN`] to
//! [`BACKOFF_MAX`]). It receives on the connections its peers dialed. So between two nodes
//! there is one connection per direction; each carries traffic one way.
//!
//! Each connection carries two unidirectional streams, opened by the dialer:
//!
//! | stream     | first byte | carries                                  | priority |
//! |------------|------------|------------------------------------------|----------|
//! | heartbeat  | `1`        | `Envelope::Heartbeat`, `HeartbeatResp`   | higher   |
//! | bulk       | `2`        | `Envelope::Group` (votes, appends, ...)  | lower    |
//!
//! After the kind byte, a stream is a sequence of frames:
//!
//! ```text
//! | length: u32 little-endian (bytes) | raft::codec bytes (length bytes) |
//! ```
//!
//! A frame longer than `CodecLimits::max_encoded_bytes()` is refused before it is read. A
//! refused frame (too long, undecodable, on the wrong stream, or naming another `from` than
//! the certificate) stops its stream with a [`FrameError`] code and bumps a counter; the
//! connection stays, and the dialer reopens its streams on a new connection after the
//! stopped write fails. Separate streams mean a long append never holds up a heartbeat
//! behind it (QUIC streams have no head-of-line blocking between them).
//!
//! # Limits
//!
//! | limit                                   | unit      | default                 |
//! |-----------------------------------------|-----------|-------------------------|
//! | `PeerTransportConfig::heartbeat_queue_max` | envelopes per peer | [`HEARTBEAT_QUEUE_MAX`] |
//! | `PeerTransportConfig::bulk_queue_max`   | envelopes per peer | [`BULK_QUEUE_MAX`]      |
//! | `PeerTransportConfig::inbox_max`        | envelopes | [`INBOX_MAX`]               |
//! | frame length                            | bytes     | `limits.max_encoded_bytes()` |
//! | [`BACKOFF_MIN`] / [`BACKOFF_MAX`]       | duration  | 50 ms / 2 s             |
//! | [`PEER_IDLE_TIMEOUT`]                   | duration  | 5 s                     |
//! | [`PEER_KEEP_ALIVE`]                     | duration  | 1 s                     |
//!
//! A full send queue drops the envelope (Raft retransmits) and counts it; so does a full
//! inbox on the receiving side.

mod clock;
mod replicated;
mod supervisor;

pub use supervisor::{LeaderActor, PartitionSpec, PartitionSupervisor, SupervisorStats};

pub use clock::{LeaderClock, MAX_CLOCK_SKEW_MS};

pub use replicated::{
    HostStats, ReplicaEnv, ReplicaHost, ReplicatedLog, ReplicatedTicket, REPLICA_INBOX_MAX,
    TICK_INTERVAL_MS,
};
pub mod config;
pub mod dev;
pub mod identity;
pub mod node;
pub mod shard;
mod transport;

pub use config::{ClusterConfig, ClusterConfigError, Member, MEMBERS_MAX};
pub use identity::{IdentityError, NodeIdentity};
pub use node::ShardNode;
pub use shard::ClusterShard;

pub use transport::{
    node_cert_name, node_id_from_cert, FrameError, PeerTransport, PeerTransportConfig, Received,
    SendError, StreamKind, TransportError, TransportStats, BACKOFF_MAX, BACKOFF_MIN,
    BULK_QUEUE_MAX, HEARTBEAT_QUEUE_MAX, INBOX_MAX, PEER_ALPN, PEER_IDLE_TIMEOUT, PEER_KEEP_ALIVE,
};
