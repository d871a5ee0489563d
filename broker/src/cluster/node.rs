//! One shard's part of a cluster node: its [`PeerTransport`] to the same shard index of every
//! other member, started before the shard (so that `Shard::start` can find it) and stopped
//! after it.
//!
//! Where it lives: in a thread-local of the shard's executor thread ([`local`]), not in
//! `Shard`; a shard is one thread, so "this thread's node" is "this shard's". In single-node
//! mode (`BrokerConfig::cluster` is `None`) nothing is started and [`local`] is `None`.
//!
//! Shard `i` binds `cluster.peer_addr` port + `i` ([`super::config::shard_addr`]), adds every
//! other member at its `peer_addr` port + `i`, and dials them at once (rather than on the first
//! send): the connections are up before Raft needs them, and `/metrics` shows them
//! (`sluice_peer_*`, rendered by [`render`]).

use super::config::{shard_addr, ClusterConfig};
use super::{PeerTransport, PeerTransportConfig, Received, TransportError, TransportStats};
use crate::config::BrokerConfig;
use glommio::channels::local_channel::LocalReceiver;
use sluice_raft::NodeId;
use std::cell::RefCell;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

thread_local! {
    static LOCAL: RefCell<Option<Rc<ShardNode>>> = const { RefCell::new(None) };
}

/// This node as one shard sees it: the cluster configuration and the shard's transport.
pub struct ShardNode {
    /// The shard (core index) this runs on.
    pub shard: usize,
    /// The broker's configuration; `config.cluster` is `Some`.
    pub config: Arc<BrokerConfig>,
    /// This shard's endpoint to shard `shard` of every other member (all added as peers).
    pub transport: Rc<PeerTransport>,
    /// Envelopes received from peers, until the replication driver takes the channel.
    inbox: RefCell<Option<LocalReceiver<Received>>>,
}

impl ShardNode {
    /// Who this node is and who the others are.
    pub fn cluster(&self) -> &ClusterConfig {
        self.config
            .cluster
            .as_ref()
            .expect("a ShardNode runs only in cluster mode")
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.cluster().identity.node
    }

    /// The received-envelope channel; `None` once taken (there is one reader). Until it is
    /// taken nothing reads it, and envelopes past its bound are dropped and counted.
    pub fn take_inbox(&self) -> Option<LocalReceiver<Received>> {
        self.inbox.borrow_mut().take()
    }
}

/// This shard's node, in cluster mode, on a shard's executor thread.
pub fn local() -> Option<Rc<ShardNode>> {
    LOCAL.with(|l| l.borrow().clone())
}

/// Binds shard `shard`'s transport, adds and dials every other member, and makes it this
/// thread's [`local`] node. Nothing (and `Ok(None)`) in single-node mode.
pub fn start(
    shard: usize,
    config: &Arc<BrokerConfig>,
) -> Result<Option<Rc<ShardNode>>, TransportError> {
    let Some(cluster) = &config.cluster else {
        return Ok(None);
    };
    let listen = shard_addr(cluster.peer_addr, shard).ok_or_else(|| {
        std::io::Error::other(format!(
            "peer port of shard {shard} past 65535 ({})",
            cluster.peer_addr
        ))
    })?;
    let transport_config = PeerTransportConfig::new(
        cluster.identity.node,
        listen,
        cluster.tls.clone(),
        cluster.ca.clone(),
    );
    let (transport, inbox) = PeerTransport::bind(transport_config)?;
    for m in cluster.peers() {
        let Some(addr) = m.peer_addr_of_shard(shard) else {
            tracing::warn!(
                peer = m.id,
                shard,
                "peer port past 65535; this shard cannot reach that member"
            );
            continue;
        };
        transport.add_peer(m.id, addr);
        // The peer was just added and the transport is open: this cannot fail.
        let _ = transport.dial(m.id);
    }
    tracing::info!(
        shard,
        node = cluster.identity.node,
        zone = %cluster.zone,
        peer_addr = ?transport.local_addr().ok(),
        peers = cluster.members.len() - 1,
        "peer transport listening"
    );
    let node = Rc::new(ShardNode {
        shard,
        config: config.clone(),
        transport: Rc::new(transport),
        inbox: RefCell::new(Some(inbox)),
    });
    LOCAL.with(|l| *l.borrow_mut() = Some(node.clone()));
    Ok(Some(node))
}

/// Closes this shard's transport (connections, endpoint) and forgets the local node.
pub async fn stop() {
    let node = LOCAL.with(|l| l.borrow_mut().take());
    if let Some(node) = node {
        node.transport.close().await;
    }
}

/// One shard's peer transport in a metrics scrape.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerSnapshot {
    pub stats: TransportStats,
    /// Where the shard listens for peers.
    pub listen: Option<SocketAddr>,
    /// Every other member and whether this shard's outgoing connection to it is up.
    pub peers: Vec<(NodeId, bool)>,
    /// The shard's replicas (once the shard runs them).
    pub replication: Option<super::shard::ReplicationSnapshot>,
    /// This node's id and zone.
    pub node: NodeId,
    pub zone: String,
}

/// This thread's transport as a scrape sees it; `None` outside cluster mode.
pub fn local_snapshot() -> Option<PeerSnapshot> {
    let node = local()?;
    let connected = node.transport.connected();
    Some(PeerSnapshot {
        stats: node.transport.stats(),
        listen: node.transport.local_addr().ok(),
        peers: node
            .cluster()
            .peers()
            .map(|m| (m.id, connected.contains(&m.id)))
            .collect(),
        replication: super::shard::replication_snapshot(),
        node: node.node_id(),
        zone: node.cluster().zone.clone(),
    })
}

/// Reads one counter of a transport's stats.
type StatOf = fn(&TransportStats) -> u64;

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Renders the `sluice_peer_*` series of every shard's snapshot (`(shard, snapshot)`); nothing
/// when no shard runs a transport (single-node mode).
pub fn render(out: &mut String, shards: &[(usize, &PeerSnapshot)]) {
    if shards.is_empty() {
        return;
    }
    if let Some((_, s)) = shards.first() {
        header(
            out,
            "sluice_cluster_node_info",
            "gauge",
            "This node's id and zone (always 1).",
        );
        let zone = s.zone.replace('\\', "\\\\").replace('"', "\\\"");
        let _ = writeln!(
            out,
            "sluice_cluster_node_info{{node=\"{}\",zone=\"{zone}\"}} 1",
            s.node
        );
    }
    render_replication(out, shards);
    header(
        out,
        "sluice_peer_connected",
        "gauge",
        "1 while the shard's outgoing connection to the peer node is established.",
    );
    for (shard, s) in shards {
        for (peer, up) in &s.peers {
            let _ = writeln!(
                out,
                "sluice_peer_connected{{shard=\"{shard}\",peer=\"{peer}\"}} {}",
                u8::from(*up)
            );
        }
    }
    header(
        out,
        "sluice_peer_connections",
        "gauge",
        "Established outgoing peer connections of the shard.",
    );
    for (shard, s) in shards {
        let up = s.peers.iter().filter(|(_, up)| *up).count();
        let _ = writeln!(out, "sluice_peer_connections{{shard=\"{shard}\"}} {up}");
    }
    let counters: [(&str, &str, StatOf); 5] = [
        (
            "sluice_peer_frames_sent_total",
            "Frames written to peers.",
            |s| s.frames_sent,
        ),
        (
            "sluice_peer_frames_received_total",
            "Envelopes received from peers, checked and delivered.",
            |s| s.frames_received,
        ),
        (
            "sluice_peer_connects_total",
            "Outgoing peer connections established.",
            |s| s.connects,
        ),
        (
            "sluice_peer_connects_failed_total",
            "Outgoing peer connection attempts that failed.",
            |s| s.connects_failed,
        ),
        (
            "sluice_peer_connections_lost_total",
            "Established outgoing peer connections that were lost.",
            |s| s.connections_lost,
        ),
    ];
    for (name, help, get) in counters {
        header(out, name, "counter", help);
        for (shard, s) in shards {
            let _ = writeln!(out, "{name}{{shard=\"{shard}\"}} {}", get(&s.stats));
        }
    }
    header(
        out,
        "sluice_peer_dropped_total",
        "counter",
        "Envelopes dropped: send queue full, inbox full, or lost in a failed write (Raft \
         retransmits).",
    );
    for (shard, s) in shards {
        for (reason, n) in [
            ("queue_full", s.stats.dropped_queue_full),
            ("inbox_full", s.stats.dropped_inbox_full),
            ("lost_in_write", s.stats.lost_in_write),
        ] {
            let _ = writeln!(
                out,
                "sluice_peer_dropped_total{{shard=\"{shard}\",reason=\"{reason}\"}} {n}"
            );
        }
    }
    header(
        out,
        "sluice_peer_refused_total",
        "counter",
        "Incoming peer handshakes, connections, streams or frames refused, by reason.",
    );
    for (shard, s) in shards {
        let st = &s.stats;
        for (reason, n) in [
            ("handshake", st.handshakes_failed),
            ("identity", st.refused_identity),
            ("stream_kind", st.refused_stream_kind),
            ("too_large", st.refused_too_large),
            ("decode", st.refused_decode),
            ("from_mismatch", st.refused_from_mismatch),
            ("wrong_stream", st.refused_wrong_stream),
            ("broken_stream", st.streams_broken),
        ] {
            let _ = writeln!(
                out,
                "sluice_peer_refused_total{{shard=\"{shard}\",reason=\"{reason}\"}} {n}"
            );
        }
    }
}

/// Reads one figure of a shard's replication snapshot.
type ReplicationOf = fn(&super::shard::ReplicationSnapshot) -> u64;

/// The `sluice_raft_*` series: replicas, leaders, lag, elections, commits and their latency.
fn render_replication(out: &mut String, shards: &[(usize, &PeerSnapshot)]) {
    let series: [(&str, &str, &str, ReplicationOf); 10] = [
        (
            "sluice_raft_replicas",
            "gauge",
            "Raft replicas the shard hosts (queue partitions; on shard 0 the catalog too).",
            |r| r.replicas,
        ),
        (
            "sluice_raft_leaders",
            "gauge",
            "Replicas of the shard this node leads.",
            |r| r.leading,
        ),
        (
            "sluice_raft_serving",
            "gauge",
            "Replicas this node leads and serves (an entry of its term committed).",
            |r| r.serving,
        ),
        (
            "sluice_raft_replication_lag_offsets",
            "gauge",
            "On this node's leaders: the most any follower's durable log is behind, in offsets.",
            |r| r.lag_offsets_max,
        ),
        (
            "sluice_raft_uncommitted_offsets",
            "gauge",
            "Offsets held by the shard's replicas but not known committed.",
            |r| r.uncommitted_offsets,
        ),
        (
            "sluice_raft_leader_changes_total",
            "counter",
            "Leader changes the shard's replicas saw (elections).",
            |r| r.host.leader_changes,
        ),
        (
            "sluice_raft_proposals_dropped_total",
            "counter",
            "Proposals resolved with leadership lost (outcome unknown to the client).",
            |r| r.proposals_dropped,
        ),
        (
            "sluice_raft_truncations_total",
            "counter",
            "Log suffixes cut because a leader's log disagreed.",
            |r| r.truncations,
        ),
        (
            "sluice_raft_envelopes_refused_total",
            "counter",
            "Raft messages a replica refused (malformed, damaged, stale).",
            |r| r.host.refused,
        ),
        (
            "sluice_raft_envelopes_dropped_total",
            "counter",
            "Raft messages dropped: a full inbox or send queue, or no replica of the group here.",
            |r| r.host.inbox_full + r.host.send_failed + r.host.unroutable,
        ),
    ];
    for (name, kind, help, get) in series {
        header(out, name, kind, help);
        for (shard, s) in shards {
            if let Some(r) = &s.replication {
                let _ = writeln!(out, "{name}{{shard=\"{shard}\"}} {}", get(r));
            }
        }
    }
    header(
        out,
        "sluice_raft_commit_seconds",
        "summary",
        "Batches this node's leaders committed (a majority has them on disk, and this node), \
         and their time from proposal to commit.",
    );
    for (shard, s) in shards {
        if let Some(r) = &s.replication {
            let _ = writeln!(
                out,
                "sluice_raft_commit_seconds_sum{{shard=\"{shard}\"}} {}",
                r.host.commit_us_sum as f64 / 1e6
            );
            let _ = writeln!(
                out,
                "sluice_raft_commit_seconds_count{{shard=\"{shard}\"}} {}",
                r.host.commits
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_node_renders_no_peer_series() {
        let mut out = String::new();
        render(&mut out, &[]);
        assert!(out.is_empty());
    }

    #[test]
    fn peer_series_name_shard_and_peer() {
        let s = PeerSnapshot {
            stats: TransportStats {
                frames_sent: 5,
                dropped_inbox_full: 2,
                ..TransportStats::default()
            },
            listen: None,
            peers: vec![(11, true), (12, false)],
            replication: None,
            node: 10,
            zone: "z1".into(),
        };
        let mut out = String::new();
        render(&mut out, &[(1, &s)]);
        for line in [
            "sluice_peer_connected{shard=\"1\",peer=\"11\"} 1",
            "sluice_peer_connected{shard=\"1\",peer=\"12\"} 0",
            "sluice_peer_connections{shard=\"1\"} 1",
            "sluice_peer_frames_sent_total{shard=\"1\"} 5",
            "sluice_peer_dropped_total{shard=\"1\",reason=\"inbox_full\"} 2",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing in\n{out}");
        }
    }
}
