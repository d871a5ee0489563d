//! The client follows `NotLeader` answers: against small fake nodes (QUIC on loopback, port 0)
//! that answer each request as a test says, and count what they were asked.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_sdk::leader::LEADER_HOPS_MAX;
use sluice_sdk::types::*;
use sluice_sdk::{Client, ClientOptions, Error, ErrorCode, Trust};
use sluice_wire::{
    answer_hello, decode_request, encode_response, FrameDecoder, ServerInfo, FRAME_BYTES_MAX,
};

/// Bytes read from a stream at a time.
const READ_CHUNK_BYTES: usize = 64 * 1024;

type Behaviour = Arc<dyn Fn(&Request) -> Response + Send + Sync>;

/// A fake node: its address and how many requests (not `Hello`) it was sent.
struct FakeNode {
    addr: SocketAddr,
    asked: Arc<AtomicU32>,
    endpoint: quinn::Endpoint,
}

impl Drop for FakeNode {
    fn drop(&mut self) {
        self.endpoint.close(0u32.into(), b"test over");
    }
}

fn server_config() -> quinn::ServerConfig {
    let key = rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("certificate");
    let cert = key.cert.der().clone();
    let private = rustls::pki_types::PrivateKeyDer::Pkcs8(key.signing_key.serialize_der().into());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_no_client_auth()
        .with_single_cert(vec![cert], private)
        .expect("certificate and key");
    tls.alpn_protocols = vec![sluice_sdk::ALPN.to_vec()];
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls).expect("QUIC TLS");
    quinn::ServerConfig::with_crypto(Arc::new(crypto))
}

/// Starts a node on 127.0.0.1, port 0, answering every request with `behaviour`.
fn fake_node(behaviour: Behaviour) -> FakeNode {
    let listen: SocketAddr = "127.0.0.1:0".parse().expect("literal");
    let endpoint = quinn::Endpoint::server(server_config(), listen).expect("bind");
    let addr = endpoint.local_addr().expect("bound");
    let asked = Arc::new(AtomicU32::new(0));
    let (ep, count) = (endpoint.clone(), asked.clone());
    tokio::spawn(async move {
        while let Some(incoming) = ep.accept().await {
            let (behaviour, count) = (behaviour.clone(), count.clone());
            tokio::spawn(async move {
                let Ok(conn) = incoming.await else { return };
                while let Ok((send, recv)) = conn.accept_bi().await {
                    tokio::spawn(serve_stream(send, recv, behaviour.clone(), count.clone()));
                }
            });
        }
    });
    FakeNode {
        addr,
        asked,
        endpoint,
    }
}

async fn serve_stream(
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    behaviour: Behaviour,
    asked: Arc<AtomicU32>,
) {
    let info = ServerInfo::new("fake", "0");
    let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX);
    while let Ok(Some(chunk)) = recv.read_chunk(READ_CHUNK_BYTES, true).await {
        let mut input: &[u8] = &chunk.bytes;
        while let Ok(Some(frame)) = decoder.decode(&mut input) {
            let id = frame.request_id();
            let response = match decode_request(&frame) {
                Ok(Request::Hello(h)) => match answer_hello(&h, &info, "000000000000") {
                    Ok(ok) => Response::HelloOk(ok),
                    Err(e) => Response::Error(e),
                },
                Ok(request) => {
                    asked.fetch_add(1, Ordering::SeqCst);
                    behaviour(&request)
                }
                Err(e) => Response::Error(e.to_error_response()),
            };
            let bytes = encode_response(id, &response).expect("a small answer encodes");
            if send.write_all(&bytes).await.is_err() {
                return;
            }
        }
    }
}

fn not_leader(leader: Option<SocketAddr>, outcome_unknown: bool) -> Response {
    Response::NotLeader(NotLeaderResponse {
        message: "this node does not lead the partition".into(),
        leader_addr: leader.map(|a| a.to_string()),
        term: 3,
        outcome_unknown,
    })
}

fn sent() -> Response {
    Response::SendMessage(SendMessageResult {
        message_id: "m1".into(),
        ..Default::default()
    })
}

fn options() -> ClientOptions {
    let mut o = ClientOptions::new(Trust::DangerousSkipVerification);
    o.route_to_owner = false;
    o.retry_backoff = Duration::from_millis(20);
    o.connect_timeout = Duration::from_secs(5);
    o.request_timeout = Duration::from_secs(5);
    o
}

fn send(queue: &str, dedup: Option<&str>) -> Request {
    Request::SendMessage(SendMessageRequest {
        queue_url: queue.into(),
        message_body: "hello".into(),
        message_deduplication_id: dedup.map(str::to_string),
        message_group_id: dedup.map(|_| "g".to_string()),
        ..Default::default()
    })
}

const QUEUE: &str = "http://127.0.0.1:9324/000000000000/orders";
const FIFO_QUEUE: &str = "http://127.0.0.1:9324/000000000000/orders.fifo";

/// A node that does not lead names the leader: the call goes there and succeeds, and the
/// next call for the queue goes straight to the leader.
#[tokio::test]
async fn a_hint_is_followed_and_the_leader_remembered() {
    let leader = fake_node(Arc::new(|_| sent()));
    let hint = leader.addr;
    let follower = fake_node(Arc::new(move |_| not_leader(Some(hint), false)));
    let client = Client::connect_cluster(&[follower.addr, leader.addr], options())
        .await
        .expect("connect");
    for _ in 0..3 {
        let answer = client
            .call(send(QUEUE, None))
            .await
            .expect("sent via the leader");
        assert!(matches!(answer, Response::SendMessage(_)));
    }
    assert_eq!(
        follower.asked.load(Ordering::SeqCst),
        1,
        "asked once, then remembered"
    );
    assert_eq!(leader.asked.load(Ordering::SeqCst), 3);
    client.close().await;
}

/// Two nodes naming each other (a stale hint in an election) do not bounce a call forever.
#[tokio::test]
async fn hops_are_bounded() {
    let a_hint = Arc::new(std::sync::Mutex::new(None::<SocketAddr>));
    let hint = a_hint.clone();
    let a = fake_node(Arc::new(move |_| {
        not_leader(*hint.lock().expect("lock"), false)
    }));
    let a_addr = a.addr;
    let b = fake_node(Arc::new(move |_| not_leader(Some(a_addr), false)));
    *a_hint.lock().expect("lock") = Some(b.addr);
    let client = Client::connect(a.addr, options()).await.expect("connect");
    let e = client
        .call(send(QUEUE, None))
        .await
        .expect_err("no node leads");
    assert!(matches!(e, Error::NotLeader { .. }), "{e:?}");
    assert_eq!(e.code(), Some(ErrorCode::NotLeader));
    let asked = a.asked.load(Ordering::SeqCst) + b.asked.load(Ordering::SeqCst);
    assert_eq!(asked, 1 + LEADER_HOPS_MAX);
    client.close().await;
}

/// No node knows a leader (an election): the client backs off between its nodes, then gives
/// the caller a retryable error.
#[tokio::test]
async fn no_known_leader_is_a_retryable_error_after_back_off() {
    let a = fake_node(Arc::new(|_| not_leader(None, false)));
    let b = fake_node(Arc::new(|_| not_leader(None, false)));
    let client = Client::connect_cluster(&[a.addr, b.addr], options())
        .await
        .expect("connect");
    let start = Instant::now();
    let e = client.call(send(QUEUE, None)).await.expect_err("no leader");
    let waited = start.elapsed();
    assert!(
        matches!(
            e,
            Error::NotLeader {
                leader_addr: None,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.is_retryable());
    // 20 + 40 + 80 ms of back-off before the three hops.
    let backoff_min = Duration::from_millis(20 + 40 + 80);
    assert!(waited >= backoff_min, "waited {waited:?}");
    assert_eq!(a.asked.load(Ordering::SeqCst), 2, "asked in turn");
    assert_eq!(b.asked.load(Ordering::SeqCst), 2);
    client.close().await;
}

/// The node lost the lead while the send ran: a send without a deduplication id may already
/// be stored, so it is surfaced, not resent; a FIFO send with one is resent to the leader.
#[tokio::test]
async fn an_unknown_outcome_is_resent_only_when_deduplicated() {
    let leader = fake_node(Arc::new(|_| sent()));
    let hint = leader.addr;
    let follower = fake_node(Arc::new(move |_| not_leader(Some(hint), true)));
    let client = Client::connect(follower.addr, options())
        .await
        .expect("connect");
    let e = client.call(send(QUEUE, None)).await.expect_err("surfaced");
    assert!(
        matches!(
            e,
            Error::NotLeader {
                outcome_unknown: true,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(!e.is_retryable());
    assert_eq!(leader.asked.load(Ordering::SeqCst), 0, "not resent");
    client
        .call(send(FIFO_QUEUE, Some("dedup-1")))
        .await
        .expect("a deduplicated send is resent to the leader");
    assert_eq!(leader.asked.load(Ordering::SeqCst), 1);
    client.close().await;
}
