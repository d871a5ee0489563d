//! The cluster's peer transport (`sluice_broker::cluster`): two transports on one glommio
//! executor over loopback, mutual TLS with a cluster CA, and the refusals.

// A test is the broker's outside world: it times the broker with its own clocks (deadlines,
// waits, latencies). broker/clippy.toml's clock seam governs the broker's code, not this.
#![allow(clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

mod cluster_common;

use bytes::Bytes;
use cluster_common::{run, Ca};
use glommio::channels::local_channel::LocalReceiver;
use glommio::timer::Timer;
use sluice_broker::cluster::{
    node_cert_name, PeerTransport, PeerTransportConfig, Received, TransportStats, PEER_ALPN,
};
use sluice_broker::quic::tls::{self, Identity};
use sluice_broker::quic::{EndpointOptions, ShardEndpoint};
use sluice_raft::codec;
use sluice_raft::{
    Body, Entry, EntryKind, Envelope, Heartbeat, HeartbeatGroup, HeartbeatResp, HeartbeatRespGroup,
    Message, NodeId,
};

/// How long a test waits for something that takes milliseconds on loopback.
const WAIT_MAX: Duration = Duration::from_secs(10);
/// Poll step while waiting.
const POLL_STEP: Duration = Duration::from_millis(5);

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().expect("loopback")
}

fn transport(ca: &Ca, node: NodeId) -> (PeerTransport, LocalReceiver<Received>) {
    let config = PeerTransportConfig::new(node, loopback(), ca.node(node), vec![ca.cert.clone()]);
    PeerTransport::bind(config).expect("bind peer transport")
}

fn heartbeat(from: NodeId, to: NodeId, sent_ms: u64) -> Envelope {
    Envelope::Heartbeat(Heartbeat {
        from,
        to,
        sent_ms,
        groups: vec![HeartbeatGroup {
            group: 7,
            term: 3,
            commit: 41,
        }],
    })
}

fn heartbeat_resp(from: NodeId, to: NodeId, sent_ms: u64) -> Envelope {
    Envelope::HeartbeatResp(HeartbeatResp {
        from,
        to,
        sent_ms,
        groups: vec![HeartbeatRespGroup {
            group: 7,
            term: 3,
            disk: sluice_raft::DiskId(9),
            appended: 41,
            flushed: 40,
        }],
    })
}

fn append(from: NodeId, to: NodeId, offset: u64, data_bytes: usize) -> Envelope {
    Envelope::Group(Message {
        group: 7,
        from,
        to,
        term: 3,
        body: Body::Append {
            prev_offset: offset,
            prev_term: 3,
            entries: vec![Entry {
                offset,
                count: 1,
                term: 3,
                kind: EntryKind::Data,
                data: Bytes::from(vec![0xA5; data_bytes]),
            }],
            commit: offset,
        },
    })
}

/// `fut`'s output, or `None` after `limit`.
async fn within<F: std::future::Future>(limit: Duration, fut: F) -> Option<F::Output> {
    let fut = std::pin::pin!(fut);
    let timer = std::pin::pin!(Timer::new(limit));
    match futures::future::select(fut, timer).await {
        futures::future::Either::Left((out, _)) => Some(out),
        futures::future::Either::Right(_) => None,
    }
}

/// Receives one envelope, or panics after [`WAIT_MAX`].
async fn recv(inbox: &LocalReceiver<Received>) -> Received {
    match within(WAIT_MAX, inbox.recv()).await {
        Some(Some(r)) => r,
        Some(None) => panic!("inbox closed"),
        None => panic!("nothing received within {WAIT_MAX:?}"),
    }
}

/// Waits until `check` holds for the transport's counters, or panics after [`WAIT_MAX`].
async fn wait_stats(t: &PeerTransport, what: &str, check: impl Fn(&TransportStats) -> bool) {
    let start = Instant::now();
    while !check(&t.stats()) {
        assert!(
            start.elapsed() < WAIT_MAX,
            "{what}: not reached within {WAIT_MAX:?}; stats {:?}",
            t.stats()
        );
        Timer::new(POLL_STEP).await;
    }
}

#[test]
fn heartbeats_and_appends_flow_both_ways_tagged_with_the_certificate_node() {
    run(|| async {
        let ca = Ca::new("test");
        let (a, a_inbox) = transport(&ca, 1);
        let (b, b_inbox) = transport(&ca, 2);
        a.add_peer(2, b.local_addr().expect("b addr"));
        b.add_peer(1, a.local_addr().expect("a addr"));

        // A 256 KiB append queued before a heartbeat: both arrive, each on its stream.
        let big = append(1, 2, 100, 256 * 1024);
        a.send(&big).expect("queue append");
        a.send(&heartbeat(1, 2, 5)).expect("queue heartbeat");
        let mut got = [recv(&b_inbox).await, recv(&b_inbox).await];
        got.sort_by_key(|r| matches!(r.envelope, Envelope::Group(_)));
        assert_eq!(got[0].from, 1);
        assert_eq!(got[0].envelope, heartbeat(1, 2, 5));
        assert_eq!(got[1].from, 1);
        assert_eq!(got[1].envelope, big);

        // The other way, on b's own connection.
        b.send(&heartbeat_resp(2, 1, 5))
            .expect("queue heartbeat resp");
        b.send(&append(2, 1, 7, 10)).expect("queue append");
        let mut got = [recv(&a_inbox).await, recv(&a_inbox).await];
        got.sort_by_key(|r| matches!(r.envelope, Envelope::Group(_)));
        assert_eq!(got[0].from, 2);
        assert_eq!(got[0].envelope, heartbeat_resp(2, 1, 5));
        assert_eq!(got[1].envelope, append(2, 1, 7, 10));

        // Order holds within a stream.
        for i in 0..50 {
            a.send(&append(1, 2, 1000 + i, 64)).expect("queue append");
        }
        for i in 0..50 {
            assert_eq!(recv(&b_inbox).await.envelope, append(1, 2, 1000 + i, 64));
        }
        let (sa, sb) = (a.stats(), b.stats());
        assert_eq!(sa.connects, 1, "one connection a->b: {sa:?}");
        assert_eq!(sb.connects, 1, "one connection b->a: {sb:?}");
        assert_eq!(sa.frames_sent, 52);
        assert_eq!(sb.frames_received, 52);
        assert_eq!(sa.frames_received, 2);
        a.close().await;
        b.close().await;
    });
}

#[test]
fn a_full_queue_drops_and_counts_and_an_unknown_peer_is_refused() {
    run(|| async {
        let ca = Ca::new("test");
        let mut config = PeerTransportConfig::new(1, loopback(), ca.node(1), vec![ca.cert.clone()]);
        config.heartbeat_queue_max = 2;
        let (a, _a_inbox) = PeerTransport::bind(config).expect("bind");
        // A peer address nobody listens on: nothing leaves the queue for a while.
        let dead = ShardEndpoint::bind_client(loopback(), EndpointOptions::default())
            .expect("bind")
            .local_addr()
            .expect("addr");
        a.add_peer(2, dead);
        let mut dropped = 0;
        for i in 0..10 {
            if a.send(&heartbeat(1, 2, i)).is_err() {
                dropped += 1;
            }
        }
        // At most two queued and one taken by the pump, which waits for the connection.
        assert!(dropped >= 7, "dropped {dropped}");
        assert_eq!(a.stats().dropped_queue_full, dropped);
        assert_eq!(
            a.send(&heartbeat(1, 3, 0)),
            Err(sluice_broker::cluster::SendError::UnknownPeer(3))
        );
        a.close().await;
    });
}

/// A raw client endpoint speaking the peer ALPN with `identity`.
fn raw_client(identity: &Identity, ca: &Ca, alpn: &[u8]) -> (ShardEndpoint, quinn::ClientConfig) {
    let mut tls = tls::rustls_client_config(std::slice::from_ref(&ca.cert), Some(identity))
        .expect("client tls");
    tls.alpn_protocols = vec![alpn.to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).expect("quic tls");
    let config = quinn::ClientConfig::new(std::sync::Arc::new(quic));
    let endpoint =
        ShardEndpoint::bind_client(loopback(), EndpointOptions::default()).expect("bind");
    (endpoint, config)
}

/// Opens a uni stream to `b` and writes `bytes`; returns the connection.
async fn write_raw(
    endpoint: &ShardEndpoint,
    config: quinn::ClientConfig,
    to: SocketAddr,
    to_node: NodeId,
    bytes: &[u8],
) -> quinn::Connection {
    let conn = endpoint
        .connect(config, to, &node_cert_name(to_node))
        .expect("connect")
        .await
        .expect("handshake");
    let mut s = conn.open_uni().await.expect("open");
    s.write_all(bytes).await.expect("write");
    let _ = s.finish();
    conn
}

fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![kind];
    v.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    v.extend_from_slice(payload);
    v
}

#[test]
fn malformed_oversize_and_misattributed_frames_are_refused_and_the_connection_goes_on() {
    run(|| async {
        let ca = Ca::new("test");
        let (b, b_inbox) = transport(&ca, 2);
        let b_addr = b.local_addr().expect("addr");
        let id3 = ca.node(3);
        let (endpoint, config) = raw_client(&id3, &ca, PEER_ALPN);

        // Garbage that is no envelope.
        let conn = write_raw(&endpoint, config.clone(), b_addr, 2, &frame(2, &[0xFF; 17])).await;
        wait_stats(&b, "decode refusal", |s| s.refused_decode == 1).await;

        // A frame naming node 1 as its sender on node 3's connection.
        let forged = codec::encode(&append(1, 2, 5, 8));
        let mut s = conn.open_uni().await.expect("open");
        s.write_all(&frame(2, &forged)).await.expect("write");
        wait_stats(&b, "from mismatch", |s| s.refused_from_mismatch == 1).await;

        // A length above the limit, refused before reading it.
        let mut s = conn.open_uni().await.expect("open");
        s.write_all(&[2]).await.expect("write");
        s.write_all(&u32::MAX.to_le_bytes()).await.expect("write");
        wait_stats(&b, "oversize", |s| s.refused_too_large == 1).await;

        // A heartbeat on the bulk stream, and an unknown stream kind.
        let mut s = conn.open_uni().await.expect("open");
        s.write_all(&frame(2, &codec::encode(&heartbeat(3, 2, 1))))
            .await
            .expect("write");
        wait_stats(&b, "wrong stream", |s| s.refused_wrong_stream == 1).await;
        let mut s = conn.open_uni().await.expect("open");
        s.write_all(&frame(9, &codec::encode(&heartbeat(3, 2, 1))))
            .await
            .expect("write");
        wait_stats(&b, "unknown kind", |s| s.refused_stream_kind == 1).await;

        // The same connection still delivers a well-formed frame from its own node.
        let mut s = conn.open_uni().await.expect("open");
        s.write_all(&frame(1, &codec::encode(&heartbeat(3, 2, 9))))
            .await
            .expect("write");
        let got = recv(&b_inbox).await;
        assert_eq!(got.from, 3);
        assert_eq!(got.envelope, heartbeat(3, 2, 9));
        assert_eq!(b.stats().frames_received, 1);
        b.close().await;
    });
}

/// Waits until a client's handshake fails or its connection closes; the transport must
/// count a failed handshake and deliver nothing.
async fn assert_refused(
    endpoint: &ShardEndpoint,
    config: quinn::ClientConfig,
    b: &PeerTransport,
    to: SocketAddr,
) {
    if let Ok(conn) = endpoint
        .connect(config, to, &node_cert_name(2))
        .expect("connect")
        .await
    {
        // TLS 1.3: the client may finish before the server rejects its certificate.
        assert!(
            within(WAIT_MAX, conn.closed()).await.is_some(),
            "connection stayed open"
        );
    }
    wait_stats(b, "handshake refused", |s| s.handshakes_failed == 1).await;
    assert_eq!(b.stats().frames_received, 0);
}

#[test]
fn a_certificate_from_another_ca_is_refused() {
    run(|| async {
        let ca = Ca::new("test");
        let other = Ca::new("other");
        let (b, _b_inbox) = transport(&ca, 2);
        let b_addr = b.local_addr().expect("addr");
        // Node 3's certificate from another CA; it trusts b's CA so only b can refuse.
        let (endpoint, config) = raw_client(&other.node(3), &ca, PEER_ALPN);
        assert_refused(&endpoint, config, &b, b_addr).await;
        b.close().await;
    });
}

#[test]
fn the_client_alpn_cannot_open_the_peer_endpoint() {
    run(|| async {
        let ca = Ca::new("test");
        let (b, _b_inbox) = transport(&ca, 2);
        let b_addr = b.local_addr().expect("addr");
        let (endpoint, config) = raw_client(&ca.node(3), &ca, tls::ALPN);
        assert_refused(&endpoint, config, &b, b_addr).await;
        b.close().await;
    });
}

#[test]
fn a_peer_reconnects_after_the_other_side_restarts() {
    run(|| async {
        let ca = Ca::new("test");
        let (a, _a_inbox) = transport(&ca, 1);
        let (b, b_inbox) = transport(&ca, 2);
        let b_addr = b.local_addr().expect("addr");
        a.add_peer(2, b_addr);
        a.send(&heartbeat(1, 2, 1)).expect("queue");
        assert_eq!(recv(&b_inbox).await.envelope, heartbeat(1, 2, 1));
        b.close().await;
        drop(b);
        drop(b_inbox);
        // b comes back on the same port with a fresh endpoint.
        // Its old socket goes once the old endpoint's tasks have run: retry the bind.
        let start = Instant::now();
        let (b2, b2_inbox) = loop {
            let config = PeerTransportConfig::new(2, b_addr, ca.node(2), vec![ca.cert.clone()]);
            match PeerTransport::bind(config) {
                Ok(bound) => break bound,
                Err(e) => assert!(start.elapsed() < WAIT_MAX, "rebind: {e}"),
            }
            Timer::new(POLL_STEP).await;
        };
        wait_stats(&a, "loss noticed", |s| s.connections_lost >= 1).await;
        // Heartbeats are retried by Raft; here the test repeats until one lands.
        let start = Instant::now();
        loop {
            let _ = a.send(&heartbeat(1, 2, 2));
            if let Some(Some(r)) = within(Duration::from_millis(100), b2_inbox.recv()).await {
                assert_eq!(r.envelope, heartbeat(1, 2, 2));
                break;
            }
            assert!(start.elapsed() < WAIT_MAX, "no reconnect: {:?}", a.stats());
        }
        assert!(a.stats().connects >= 2);
        a.close().await;
        b2.close().await;
    });
}
