//! End-to-end tests: the SDK against an in-process broker (two shards, real QUIC on loopback),
//! and raw quinn streams sending malformed frames to the broker's native front end.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use sluice_broker::config::BrokerConfig;
use sluice_broker::server::BrokerHandle;
use sluice_sdk::types::*;
use sluice_sdk::{Client, ClientOptions, Error, ErrorCode, ReceiveOptions, Trust};
use sluice_wire::{
    decode_response, encode_frame, encode_request, Checksum, Frame, FrameDecoder, FRAME_BYTES_MAX,
    FRAME_MAGIC,
};

/// Bounds every test's client operations.
const TEST_TIMEOUT: Duration = Duration::from_secs(60);

struct Broker {
    _handle: BrokerHandle,
    addr: SocketAddr,
    metrics: SocketAddr,
    cert: PathBuf,
    _dir: tempfile::TempDir,
}

/// One broker for the whole test binary: glommio locks 1 MiB of memory per executor and the
/// memlock limit here is 8 MiB, so tests share it (each uses its own queues).
fn broker() -> &'static Broker {
    static BROKER: OnceLock<Broker> = OnceLock::new();
    BROKER.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut c = BrokerConfig::ephemeral(dir.path().to_path_buf()).expect("config");
        c.shards = 2;
        c.default_partitions = 2;
        c.http_addr = "127.0.0.1:0".parse().expect("addr");
        c.quic_addr = "127.0.0.1:0".parse().expect("addr");
        c.metrics_addr = "127.0.0.1:0".parse().expect("addr");
        c.kafka_addr = None;
        let handle = sluice_broker::server::start(c).expect("start");
        handle.wait_ready().expect("ready");
        let addr = handle.quic_addr();
        let metrics = handle.config.metrics_addr;
        assert_ne!(addr.port(), 0, "the picked port is exposed");
        Broker {
            addr,
            metrics,
            cert: dir.path().join("quic-selfsigned-cert.pem"),
            _handle: handle,
            _dir: dir,
        }
    })
}

fn options() -> ClientOptions {
    ClientOptions::new(Trust::PemFile(broker().cert.clone()))
}

async fn client() -> Client {
    Client::connect(broker().addr, options())
        .await
        .expect("connect")
}

/// Runs an async test body on a fresh tokio runtime, bounded in time.
fn run<F: std::future::Future<Output = ()>>(f: F) {
    broker();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async {
            tokio::time::timeout(TEST_TIMEOUT, f)
                .await
                .expect("test finished in time")
        })
}

#[test]
fn send_receive_delete_cycle() {
    run(async {
        let c = client().await;
        let info = c.server_info().await.expect("info");
        assert_eq!(info.version, sluice_wire::PROTOCOL_VERSION);
        let q = c.create_queue("cycle").await.expect("create");
        assert_eq!(c.get_queue_url("cycle").await.expect("url"), q);
        assert!(c.list_queues("cyc").await.expect("list").contains(&q));
        let sent = c.send(&q, "hello").await.expect("send");
        assert_eq!(sent.md5_of_message_body, "5d41402abc4b2a76b9719d911017c592");
        let got = c
            .receive(&q, ReceiveOptions::long_poll(10, 5))
            .await
            .expect("receive");
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].body, "hello");
        assert_eq!(got[0].message_id, sent.message_id);
        c.delete(&q, &got[0].receipt_handle).await.expect("delete");
        let attrs = c
            .get_queue_attributes(&q, &["All"])
            .await
            .expect("attributes");
        assert_eq!(attrs["ApproximateNumberOfMessages"], "0");
        assert_eq!(attrs["ApproximateNumberOfMessagesNotVisible"], "0");
        let none = c
            .receive(&q, ReceiveOptions::long_poll(10, 0))
            .await
            .expect("receive");
        assert!(none.is_empty(), "a deleted message is not delivered again");
        // Visibility: a received message made visible again comes back.
        c.send(&q, "again").await.expect("send");
        let m = c
            .receive(&q, ReceiveOptions::long_poll(1, 5))
            .await
            .expect("receive");
        c.change_visibility(&q, &m[0].receipt_handle, 0)
            .await
            .expect("change visibility");
        let m2 = c
            .receive(&q, ReceiveOptions::long_poll(1, 5))
            .await
            .expect("receive");
        assert_eq!(m2[0].message_id, m[0].message_id);
        c.purge_queue(&q).await.expect("purge");
        c.delete_queue(&q).await.expect("delete queue");
    });
}

#[test]
fn fifo_order_within_a_group() {
    run(async {
        let c = client().await;
        let q = c
            .create_queue_with(
                "order.fifo",
                sluice_sdk::attributes([
                    ("FifoQueue", "true"),
                    ("ContentBasedDeduplication", "true"),
                ]),
                Default::default(),
            )
            .await
            .expect("create");
        for i in 0..20 {
            c.send_message(SendMessageRequest {
                queue_url: q.clone(),
                message_body: format!("m{i}"),
                message_group_id: Some("g".into()),
                ..Default::default()
            })
            .await
            .expect("send");
        }
        let mut got = Vec::new();
        while got.len() < 20 {
            let batch = c
                .receive(&q, ReceiveOptions::long_poll(10, 5))
                .await
                .expect("receive");
            assert!(!batch.is_empty(), "messages arrive");
            let handles: Vec<String> = batch.iter().map(|m| m.receipt_handle.clone()).collect();
            got.extend(batch.into_iter().map(|m| m.body));
            let r = c.delete_batch(&q, &handles).await.expect("delete batch");
            assert!(r.failed.is_empty(), "{:?}", r.failed);
        }
        let want: Vec<String> = (0..20).map(|i| format!("m{i}")).collect();
        assert_eq!(got, want);
    });
}

#[test]
fn long_poll_wakes_on_send() {
    run(async {
        let c = client().await;
        let q = c.create_queue("longpoll").await.expect("create");
        let receiver = {
            let (c, q) = (c.clone(), q.clone());
            tokio::spawn(async move {
                let t = Instant::now();
                let got = c.receive(&q, ReceiveOptions::long_poll(1, 20)).await;
                (got, t.elapsed())
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        // A send on the same connection is not held back by the long poll in flight.
        c.send(&q, "wake").await.expect("send");
        let (got, waited) = receiver.await.expect("task");
        let got = got.expect("receive");
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].body, "wake");
        assert!(waited < Duration::from_secs(10), "woke early: {waited:?}");
    });
}

#[test]
fn batch_entries_fail_one_by_one() {
    run(async {
        let c = client().await;
        let q = c.create_queue("batches").await.expect("create");
        let entry = |id: &str, delay: Option<u32>| SendMessageBatchRequestEntry {
            id: id.into(),
            message_body: format!("body {id}"),
            delay_seconds: delay,
            ..Default::default()
        };
        let r = c
            .send_batch(
                &q,
                vec![entry("a", None), entry("b", Some(901)), entry("c", None)],
            )
            .await
            .expect("batch");
        let ok: Vec<&str> = r.successful.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(ok, ["a", "c"]);
        assert_eq!(r.failed.len(), 1);
        assert_eq!(r.failed[0].id, "b");
        assert_eq!(r.failed[0].error_code(), ErrorCode::InvalidParameterValue);
        assert!(r.failed[0].sender_fault);
        // Request-level batch errors are errors of the whole call.
        let e = c
            .send_batch(&q, vec![entry("x", None), entry("x", None)])
            .await
            .expect_err("ids not distinct");
        assert_eq!(e.code(), Some(ErrorCode::BatchEntryIdsNotDistinct));
        let e = c.send_batch(&q, vec![]).await.expect_err("empty");
        assert_eq!(e.code(), Some(ErrorCode::EmptyBatchRequest));
        // Delete batch: one good handle, one forged.
        let got = c
            .receive(&q, ReceiveOptions::long_poll(1, 5))
            .await
            .expect("receive");
        let r = c
            .delete_batch(&q, &[got[0].receipt_handle.clone(), "forged".to_string()])
            .await
            .expect("delete batch");
        assert_eq!(r.successful.len(), 1);
        assert_eq!(r.failed.len(), 1);
        assert_eq!(r.failed[0].error_code(), ErrorCode::ReceiptHandleIsInvalid);
    });
}

/// Long-polls `q` until `n` messages came or 10 s passed.
async fn receive_up_to(c: &Client, q: &str, n: usize) -> Vec<Message> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.len() < n && Instant::now() < deadline {
        got.extend(
            c.receive(q, ReceiveOptions::long_poll(10, 1))
                .await
                .expect("receive"),
        );
    }
    got
}

/// ChangeMessageVisibilityBatch across both partitions of a queue: each partition changes its
/// entries in one command, every entry answers on its own (a forged handle, a timeout past
/// the limit, a repeated handle), and the changes take effect.
#[test]
fn change_visibility_batch_spans_partitions() {
    run(async {
        let c = client().await;
        let q = c.create_queue("visibility-batch").await.expect("create");
        for i in 0..8 {
            c.send(&q, &format!("m{i}")).await.expect("send");
        }
        let got = receive_up_to(&c, &q, 8).await;
        assert_eq!(got.len(), 8, "every message received once");
        // Hidden for an hour: a short poll finds nothing.
        let mut entries: Vec<(String, u32)> = got
            .iter()
            .map(|m| (m.receipt_handle.clone(), 3_600))
            .collect();
        entries.push(("forged".into(), 10));
        entries.push((got[0].receipt_handle.clone(), 43_201));
        let r = c
            .change_visibility_batch(&q, &entries)
            .await
            .expect("batch");
        let mut ok: Vec<&str> = r.successful.iter().map(|e| e.id.as_str()).collect();
        ok.sort_by_key(|id| id.parse::<usize>().expect("numeric ids"));
        assert_eq!(ok, ["0", "1", "2", "3", "4", "5", "6", "7"]);
        let failed: Vec<(&str, ErrorCode)> = r
            .failed
            .iter()
            .map(|f| (f.id.as_str(), f.error_code()))
            .collect();
        assert_eq!(
            failed,
            [
                ("8", ErrorCode::ReceiptHandleIsInvalid),
                ("9", ErrorCode::InvalidParameterValue)
            ]
        );
        let none = c
            .receive(&q, ReceiveOptions::long_poll(10, 0))
            .await
            .expect("receive");
        assert!(none.is_empty(), "still hidden: {none:?}");
        // Visible again at once (timeout 0). The first handle comes twice: its second entry
        // finds the message no longer in flight, as a second call would.
        let mut entries: Vec<(String, u32)> =
            got.iter().map(|m| (m.receipt_handle.clone(), 0)).collect();
        entries.push((got[0].receipt_handle.clone(), 0));
        let r = c
            .change_visibility_batch(&q, &entries[..9])
            .await
            .expect("batch");
        assert_eq!(r.successful.len(), 8, "{:?}", r.failed);
        let failed: Vec<(&str, ErrorCode)> = r
            .failed
            .iter()
            .map(|f| (f.id.as_str(), f.error_code()))
            .collect();
        assert_eq!(failed, [("8", ErrorCode::MessageNotInflight)]);
        let again = receive_up_to(&c, &q, 8).await;
        let mut bodies: Vec<String> = again.iter().map(|m| m.body.clone()).collect();
        bodies.sort();
        let want: Vec<String> = (0..8).map(|i| format!("m{i}")).collect();
        assert_eq!(bodies, want);
    });
}

#[test]
fn errors_are_typed() {
    run(async {
        let c = client().await;
        let e = c.get_queue_url("no-such-queue").await.expect_err("missing");
        assert_eq!(e.code(), Some(ErrorCode::QueueDoesNotExist));
        assert_eq!(
            e.sqs_code(),
            Some("AWS.SimpleQueueService.NonExistentQueue")
        );
        assert!(!e.is_retryable());
        let missing = format!("{}-gone", c.create_queue("errs").await.expect("create"));
        let e = c.send(&missing, "x").await.expect_err("missing queue");
        assert_eq!(e.code(), Some(ErrorCode::QueueDoesNotExist));
        let q = c.get_queue_url("errs").await.expect("url");
        let e = c.delete(&q, "not-a-handle").await.expect_err("bad handle");
        assert_eq!(e.code(), Some(ErrorCode::ReceiptHandleIsInvalid));
        let e = c.send("not a url", "x").await.expect_err("bad url");
        assert_eq!(e.code(), Some(ErrorCode::InvalidAddress));
        let e = c
            .receive(&q, ReceiveOptions::long_poll(11, 0))
            .await
            .expect_err("too many");
        assert_eq!(e.code(), Some(ErrorCode::InvalidParameterValue));
        let e = c
            .call(Request::StartMessageMoveTask(Default::default()))
            .await
            .expect_err("no source");
        assert_eq!(e.code(), Some(ErrorCode::MissingParameter));
    });
}

#[test]
fn many_requests_pipelined_on_one_connection() {
    const N: usize = 400;
    run(async {
        let c = client().await;
        let q = c.create_queue("pipelined").await.expect("create");
        let sends: Vec<_> = (0..N)
            .map(|i| {
                let (c, q) = (c.clone(), q.clone());
                tokio::spawn(async move { c.send(&q, &format!("p{i}")).await })
            })
            .collect();
        let mut ids = std::collections::HashSet::new();
        for s in sends {
            ids.insert(s.await.expect("task").expect("send").message_id);
        }
        assert_eq!(ids.len(), N, "every send answered with its own message id");
        let mut seen = std::collections::HashSet::new();
        while seen.len() < N {
            let got = c
                .receive(&q, ReceiveOptions::long_poll(10, 5))
                .await
                .expect("receive");
            assert!(!got.is_empty());
            let handles: Vec<String> = got.iter().map(|m| m.receipt_handle.clone()).collect();
            seen.extend(got.into_iter().map(|m| m.body));
            c.delete_batch(&q, &handles).await.expect("delete");
        }
    });
}

#[test]
fn reconnects_after_close_and_skip_verification_connects() {
    run(async {
        let c = client().await;
        let q = c.create_queue("reconnect").await.expect("create");
        c.close().await;
        c.send(&q, "after close").await.expect("reconnected");
        let insecure = Client::connect(
            broker().addr,
            ClientOptions::new(Trust::DangerousSkipVerification),
        )
        .await
        .expect("connect without verification");
        let got = insecure
            .receive(&q, ReceiveOptions::long_poll(1, 5))
            .await
            .expect("receive");
        assert_eq!(got[0].body, "after close");
        // A client that trusts nothing the broker presents fails to connect.
        let other = rustls_cert_from_a_fresh_broker_dir();
        let e = Client::connect(broker().addr, ClientOptions::new(Trust::PemFile(other)))
            .await
            .err()
            .expect("untrusted certificate");
        assert!(matches!(e, Error::Connect(_)), "{e:?}");
    });
}

/// A self-signed certificate that is not the broker's.
fn rustls_cert_from_a_fresh_broker_dir() -> PathBuf {
    let dir = tempfile::tempdir().expect("dir").keep();
    sluice_broker::quic::tls::load_or_create_self_signed(&dir).expect("cert");
    dir.join("quic-selfsigned-cert.pem")
}

// ---- Raw frames -------------------------------------------------------------------------

async fn raw_connection() -> quinn::Connection {
    let certs = sluice_broker::quic::tls::load_certs(&broker().cert).expect("cert");
    let config =
        sluice_broker::quic::tls::client_config_trusting(&certs, None).expect("client config");
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().expect("addr")).expect("endpoint");
    ep.set_default_client_config(config);
    ep.connect(broker().addr, "localhost")
        .expect("connect")
        .await
        .expect("handshake")
}

fn hello(min: u16, max: u16) -> Vec<u8> {
    encode_request(
        0,
        &Request::Hello(Hello {
            versions: VersionRange { min, max },
            client_name: "raw".into(),
            client_version: "0".into(),
            auth_token: None,
        }),
    )
    .expect("encodes")
    .to_vec()
}

/// Reads frames from `recv` until `n` arrived or the stream ended.
async fn read_frames(recv: &mut quinn::RecvStream, n: usize) -> Vec<Frame> {
    let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX);
    let mut frames = Vec::new();
    while frames.len() < n {
        match recv.read_chunk(64 * 1024, true).await {
            Ok(Some(chunk)) => {
                let mut input: &[u8] = &chunk.bytes;
                while let Some(f) = decoder.decode(&mut input).expect("server frames decode") {
                    frames.push(f);
                }
            }
            _ => break,
        }
    }
    frames
}

fn error_of(frame: &Frame) -> (u64, ErrorCode) {
    match decode_response(frame).expect("a response") {
        Response::Error(e) => (frame.request_id(), e.error_code()),
        other => panic!("expected an error frame, got {:?}", other.kind()),
    }
}

#[test]
fn version_mismatch_is_refused_with_a_typed_error() {
    run(async {
        let conn = raw_connection().await;
        let (mut send, mut recv) = conn.open_bi().await.expect("stream");
        send.write_all(&hello(7, 9)).await.expect("write");
        let frames = read_frames(&mut recv, 1).await;
        let Response::Error(e) = decode_response(&frames[0]).expect("response") else {
            panic!("expected an error");
        };
        assert_eq!(e.error_code(), ErrorCode::UnsupportedVersion);
        assert_eq!(
            e.supported_versions,
            Some(sluice_wire::supported_versions())
        );
        let closed = conn.closed().await;
        assert!(
            matches!(&closed, quinn::ConnectionError::ApplicationClosed(c)
                if c.error_code == quinn::VarInt::from_u32(u32::from(ErrorCode::UnsupportedVersion.as_u16()))),
            "{closed:?}"
        );
        // A first frame other than Hello: ProtocolViolation, connection closed.
        let conn = raw_connection().await;
        let (mut send, mut recv) = conn.open_bi().await.expect("stream");
        let list = encode_request(1, &Request::ListQueues(Default::default())).expect("encodes");
        send.write_all(&list).await.expect("write");
        let frames = read_frames(&mut recv, 1).await;
        assert_eq!(error_of(&frames[0]).1, ErrorCode::ProtocolViolation);
        conn.closed().await;
    });
}

#[test]
fn malformed_frames_get_typed_errors_and_the_broker_stays_healthy() {
    run(async {
        let conn = raw_connection().await;
        let (mut send, mut recv) = conn.open_bi().await.expect("stream");
        send.write_all(&hello(1, 1)).await.expect("write");
        let frames = read_frames(&mut recv, 1).await;
        assert!(matches!(
            decode_response(&frames[0]),
            Ok(Response::HelloOk(_))
        ));

        // Frames whose boundaries are intact: one error each, the stream goes on.
        let mut stream = Vec::new();
        stream.extend(encode_frame(0x0377, 11, &[], Checksum::None).expect("unknown kind"));
        stream.extend(
            encode_frame(
                sluice_wire::FrameKind::SendMessage.as_u16(),
                12,
                &[1, 2, 3],
                Checksum::None,
            )
            .expect("garbage body"),
        );
        stream.extend(
            sluice_wire::encode_response(13, &Response::DeleteQueue(Default::default()))
                .expect("a response sent as a request"),
        );
        stream.extend(encode_request(0, &Request::ListQueues(Default::default())).expect("id 0"));
        stream.extend(hello(1, 1).iter().enumerate().map(|(i, b)| {
            // The same Hello with request id 14: a second Hello.
            if i == 8 {
                14
            } else {
                *b
            }
        }));
        stream.extend(encode_request(15, &Request::ListQueues(Default::default())).expect("ok"));
        send.write_all(&stream).await.expect("write");
        let mut answers: Vec<(u64, Option<ErrorCode>)> = read_frames(&mut recv, 6)
            .await
            .iter()
            .map(|f| match decode_response(f).expect("response") {
                Response::Error(e) => (f.request_id(), Some(e.error_code())),
                _ => (f.request_id(), None),
            })
            .collect();
        answers.sort();
        assert_eq!(
            answers,
            [
                (0, Some(ErrorCode::ProtocolViolation)),
                (11, Some(ErrorCode::UnknownFrameKind)),
                (12, Some(ErrorCode::MalformedFrame)),
                (13, Some(ErrorCode::UnknownFrameKind)),
                (14, Some(ErrorCode::ProtocolViolation)),
                (15, None),
            ]
        );

        // Frames that lose the boundaries: an error, then the stream ends; others go on.
        let (mut send2, mut recv2) = conn.open_bi().await.expect("stream");
        send2
            .write_all(b"GET / HTTP/1.1\r\n\r\n")
            .await
            .expect("write");
        let frames = read_frames(&mut recv2, 2).await;
        assert_eq!(frames.len(), 1, "one error, then the stream is finished");
        assert_eq!(error_of(&frames[0]), (0, ErrorCode::ProtocolViolation));

        let (mut send3, mut recv3) = conn.open_bi().await.expect("stream");
        let mut huge = vec![FRAME_MAGIC, 0, 0x01, 0x02];
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        huge.extend_from_slice(&21u64.to_le_bytes());
        send3.write_all(&huge).await.expect("write");
        let frames = read_frames(&mut recv3, 2).await;
        assert_eq!(frames.len(), 1);
        assert_eq!(error_of(&frames[0]), (21, ErrorCode::FrameTooLarge));

        let (mut send4, mut recv4) = conn.open_bi().await.expect("stream");
        let ok = encode_request(31, &Request::ListQueues(Default::default())).expect("ok");
        send4.write_all(&ok[..ok.len() - 1]).await.expect("write");
        send4.finish().expect("finish");
        let frames = read_frames(&mut recv4, 2).await;
        assert_eq!(frames.len(), 1);
        assert_eq!(error_of(&frames[0]).1, ErrorCode::MalformedFrame);

        // The first stream still serves.
        let again = encode_request(16, &Request::ListQueues(Default::default())).expect("ok");
        send.write_all(&again).await.expect("write");
        let frames = read_frames(&mut recv, 1).await;
        assert!(matches!(
            decode_response(&frames[0]),
            Ok(Response::ListQueues(_))
        ));
        // And the broker serves everyone else.
        let c = client().await;
        c.create_queue("healthy")
            .await
            .expect("broker still serves");
    });
}

#[test]
fn in_flight_requests_are_bounded_per_connection() {
    const EXTRA: u64 = 8;
    run(async {
        let c = client().await;
        let q = c.create_queue("bounded").await.expect("create");
        let limit = u64::from(c.server_info().await.expect("info").in_flight_requests_max);
        let conn = raw_connection().await;
        let (mut send, mut recv) = conn.open_bi().await.expect("stream");
        send.write_all(&hello(1, 1)).await.expect("write");
        read_frames(&mut recv, 1).await;
        // `limit + EXTRA` long polls on an empty queue, all written at once.
        let mut stream = Vec::new();
        for id in 1..=limit + EXTRA {
            let poll = Request::ReceiveMessage(ReceiveMessageRequest {
                queue_url: q.clone(),
                wait_time_seconds: Some(2),
                ..Default::default()
            });
            stream.extend(encode_request(id, &poll).expect("encodes"));
        }
        send.write_all(&stream).await.expect("write");
        let frames = read_frames(&mut recv, (limit + EXTRA) as usize).await;
        assert_eq!(frames.len() as u64, limit + EXTRA, "every request answered");
        let rejected = frames
            .iter()
            .filter(|f| {
                matches!(decode_response(f), Ok(Response::Error(e))
                    if e.error_code() == ErrorCode::TooManyInFlightRequests)
            })
            .count() as u64;
        assert!(
            (1..=EXTRA).contains(&rejected),
            "{rejected} answered TooManyInFlightRequests"
        );
    });
}

#[test]
fn clients_that_vanish_or_never_read_do_not_hurt_others() {
    run(async {
        let c = client().await;
        let q = c.create_queue("vanish").await.expect("create");
        // A client that leaves with a long poll in flight.
        let conn = raw_connection().await;
        let (mut send, mut recv) = conn.open_bi().await.expect("stream");
        send.write_all(&hello(1, 1)).await.expect("write");
        read_frames(&mut recv, 1).await;
        let poll = Request::ReceiveMessage(ReceiveMessageRequest {
            queue_url: q.clone(),
            wait_time_seconds: Some(2),
            ..Default::default()
        });
        send.write_all(&encode_request(1, &poll).expect("encodes"))
            .await
            .expect("write");
        tokio::time::sleep(Duration::from_millis(100)).await;
        conn.close(0u32.into(), b"gone");
        // A client that writes requests and never reads an answer.
        let greedy = raw_connection().await;
        let (mut gsend, mut grecv) = greedy.open_bi().await.expect("stream");
        gsend.write_all(&hello(1, 1)).await.expect("write");
        read_frames(&mut grecv, 1).await;
        let mut flood = Vec::new();
        for id in 1..=2000u64 {
            flood.extend(
                encode_request(id, &Request::ListQueues(Default::default())).expect("encodes"),
            );
        }
        let writer = tokio::spawn(async move {
            let _ = gsend.write_all(&flood).await;
            gsend
        });
        // Everyone else is served meanwhile; the message the vanished poll did not take is
        // delivered to the next consumer.
        c.send(&q, "still here").await.expect("send");
        let got = c
            .receive(&q, ReceiveOptions::long_poll(1, 10))
            .await
            .expect("receive");
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].body, "still here");
        writer.abort();
        greedy.close(0u32.into(), b"done");
    });
}

#[test]
fn graceful_shutdown_ends_idle_streams_and_clients_get_typed_errors() {
    // Its own broker (one shard), since this one is stopped.
    let dir = tempfile::tempdir().expect("temp dir");
    let mut c = BrokerConfig::ephemeral(dir.path().to_path_buf()).expect("config");
    c.shards = 1;
    c.default_partitions = 1;
    c.http_addr = "127.0.0.1:0".parse().expect("addr");
    c.quic_addr = "127.0.0.1:0".parse().expect("addr");
    c.metrics_addr = "127.0.0.1:0".parse().expect("addr");
    c.kafka_addr = None;
    let handle = sluice_broker::server::start(c).expect("start");
    handle.wait_ready().expect("ready");
    let addr = handle.quic_addr();
    let cert = dir.path().join("quic-selfsigned-cert.pem");
    run(async move {
        let options = ClientOptions {
            connect_timeout: Duration::from_secs(1),
            retries: 1,
            ..ClientOptions::new(Trust::PemFile(cert))
        };
        let client = Client::connect(addr, options).await.expect("connect");
        let q = client.create_queue("stopping").await.expect("create");
        client.send(&q, "before").await.expect("send");
        // Idle pipelined streams must not hold the shutdown for its whole grace period.
        let t = Instant::now();
        tokio::task::spawn_blocking(move || handle.shutdown())
            .await
            .expect("shutdown");
        let took = t.elapsed();
        assert!(took < Duration::from_millis(1500), "shutdown took {took:?}");
        let e = client.send(&q, "after").await.expect_err("broker is gone");
        assert!(
            matches!(
                e,
                Error::Connect(_) | Error::ConnectionLost(_) | Error::Timeout(_)
            ),
            "{e:?}"
        );
    });
}

#[test]
fn batching_producer_and_consumer_helper() {
    const N: usize = 95;
    run(async {
        let c = client().await;
        let q = c.create_queue("helpers").await.expect("create");
        let producer = c.producer(&q, sluice_sdk::ProducerOptions::default());
        let sends = (0..N).map(|i| producer.send(format!("h{i}")));
        let results = futures::future::join_all(sends).await;
        let mut ids = std::collections::HashSet::new();
        for r in results {
            ids.insert(r.expect("sent").message_id);
        }
        assert_eq!(ids.len(), N);
        // One bad entry fails alone.
        let bad = producer
            .send_message(sluice_sdk::OutgoingMessage {
                body: "late".into(),
                delay_seconds: Some(901),
                ..Default::default()
            })
            .await
            .expect_err("delay out of range");
        assert_eq!(bad.code(), Some(ErrorCode::InvalidParameterValue));

        let seen = std::sync::Mutex::new(Vec::new());
        let failed_once = std::sync::atomic::AtomicBool::new(false);
        c.consume(
            &q,
            sluice_sdk::ConsumeOptions {
                wait_time_seconds: 1,
                visibility_timeout_seconds: 2,
                stop_after_empty_receives: Some(2),
                ..Default::default()
            },
            |m| {
                let seen = &seen;
                let failed_once = &failed_once;
                async move {
                    // The first handler failure leaves its message for redelivery.
                    if !failed_once.swap(true, std::sync::atomic::Ordering::SeqCst) {
                        return Err("try again");
                    }
                    if m.body == "h0" {
                        // Longer than the lease: the heartbeat keeps it.
                        tokio::time::sleep(Duration::from_millis(2500)).await;
                    }
                    seen.lock().expect("lock").push(m.body);
                    Ok(())
                }
            },
        )
        .await
        .expect("consume");
        let mut seen = seen.into_inner().expect("lock");
        seen.sort();
        let mut want: Vec<String> = (0..N).map(|i| format!("h{i}")).collect();
        want.sort();
        assert_eq!(
            seen, want,
            "every message handled exactly once after one failure"
        );
    });
}

#[test]
fn dead_letters_are_redriven_by_a_move_task() {
    const N: usize = 5;
    run(async {
        let c = client().await;
        let dlq = c.create_queue("redrive-dlq").await.expect("dlq");
        let attrs = c
            .get_queue_attributes(&dlq, &["QueueArn"])
            .await
            .expect("arn");
        let dlq_arn = attrs["QueueArn"].clone();
        let policy = format!(r#"{{"deadLetterTargetArn":"{dlq_arn}","maxReceiveCount":"1"}}"#);
        let src = c
            .create_queue_with(
                "redrive-src",
                sluice_sdk::attributes([("RedrivePolicy", policy.as_str())]),
                Default::default(),
            )
            .await
            .expect("src");
        for i in 0..N {
            c.send(&src, &format!("d{i}")).await.expect("send");
        }
        // maxReceiveCount 1: receive and release each message until all sit in the DLQ.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let opts = ReceiveOptions {
                visibility_timeout: Some(0),
                ..ReceiveOptions::long_poll(10, 0)
            };
            c.receive(&src, opts).await.expect("receive");
            let a = c
                .get_queue_attributes(&dlq, &["ApproximateNumberOfMessages"])
                .await
                .expect("attributes");
            if a["ApproximateNumberOfMessages"] == N.to_string() {
                break;
            }
            assert!(Instant::now() < deadline, "dead-lettering stalled: {a:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let sources = c
            .call(Request::ListDeadLetterSourceQueues(
                ListDeadLetterSourceQueuesRequest {
                    queue_url: dlq.clone(),
                    ..Default::default()
                },
            ))
            .await
            .expect("sources");
        let Response::ListDeadLetterSourceQueues(sources) = sources else {
            panic!("unexpected answer");
        };
        assert_eq!(sources.queue_urls, [src.as_str()]);

        let started = c
            .call(Request::StartMessageMoveTask(StartMessageMoveTaskRequest {
                source_arn: dlq_arn.clone(),
                destination_arn: None,
                max_number_of_messages_per_second: Some(100),
            }))
            .await
            .expect("start");
        let Response::StartMessageMoveTask(started) = started else {
            panic!("unexpected answer");
        };
        assert!(!started.task_handle.is_empty());
        let mut back = Vec::new();
        while back.len() < N {
            let got = c
                .receive(&src, ReceiveOptions::long_poll(10, 5))
                .await
                .expect("receive");
            assert!(!got.is_empty(), "redriven messages arrive");
            for m in got {
                c.delete(&src, &m.receipt_handle).await.expect("delete");
                back.push(m.body);
            }
        }
        back.sort();
        let want: Vec<String> = (0..N).map(|i| format!("d{i}")).collect();
        assert_eq!(back, want);
        let listed = c
            .call(Request::ListMessageMoveTasks(ListMessageMoveTasksRequest {
                source_arn: dlq_arn,
                max_results: Some(10),
            }))
            .await
            .expect("list");
        let Response::ListMessageMoveTasks(listed) = listed else {
            panic!("unexpected answer");
        };
        assert!(!listed.results.is_empty());
        let e = c
            .call(Request::CancelMessageMoveTask(
                CancelMessageMoveTaskRequest {
                    task_handle: "not-a-handle".into(),
                },
            ))
            .await
            .expect_err("unknown handle");
        assert!(e.code().is_some(), "{e:?}");
    });
}

#[test]
fn native_requests_and_errors_are_counted_in_metrics() {
    run(async {
        let c = client().await;
        let q = c.create_queue("counted").await.expect("create");
        c.send(&q, "x").await.expect("send");
        c.get_queue_url("not-there").await.expect_err("missing");
    });
    let body = common::scrape_metrics(broker().metrics);
    assert!(
        body.lines().any(|l| l.starts_with("sluice_requests_total")
            && l.contains("frontend=\"native\"")
            && l.contains("action=\"SendMessage\"")),
        "{body}"
    );
    assert!(
        body.lines()
            .any(|l| l.starts_with("sluice_request_errors_total")
                && l.contains("frontend=\"native\"")
                && l.contains("code=\"QueueDoesNotExist\"")),
        "{body}"
    );
}

/// A broker of its own for a test that needs another configuration: one shard (the memlock
/// budget), loopback ports picked at start, `tweak` applied last.
fn one_shard_broker(data: &std::path::Path, tweak: impl FnOnce(&mut BrokerConfig)) -> BrokerHandle {
    let mut c = BrokerConfig::ephemeral(data.to_path_buf()).expect("config");
    c.shards = 1;
    c.default_partitions = 1;
    c.http_addr = "127.0.0.1:0".parse().expect("addr");
    c.quic_addr = "127.0.0.1:0".parse().expect("addr");
    c.metrics_addr = "127.0.0.1:0".parse().expect("addr");
    c.kafka_addr = None;
    tweak(&mut c);
    let handle = sluice_broker::server::start(c).expect("start");
    handle.wait_ready().expect("ready");
    handle
}

#[test]
fn mutual_tls_requires_a_client_certificate_from_the_configured_ca() {
    let dir = tempfile::tempdir().expect("temp dir");
    // A CA and a client certificate it signed, as PEM files.
    let ca_key = rcgen::KeyPair::generate().expect("CA key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).expect("CA cert");
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let client_key = rcgen::KeyPair::generate().expect("client key");
    let client_cert = rcgen::CertificateParams::new(vec!["sdk-client".to_string()])
        .expect("client params")
        .signed_by(&client_key, &issuer)
        .expect("client cert");
    let ca_path = dir.path().join("clients-ca.pem");
    let cert_path = dir.path().join("client.pem");
    let key_path = dir.path().join("client-key.pem");
    std::fs::write(&ca_path, ca_cert.pem()).expect("write");
    std::fs::write(&cert_path, client_cert.pem()).expect("write");
    std::fs::write(&key_path, client_key.serialize_pem()).expect("write");

    let data = dir.path().join("data");
    let handle = one_shard_broker(&data, |c| c.quic_tls.client_ca_path = Some(ca_path));
    let addr = handle.quic_addr();
    let trust = Trust::PemFile(data.join("quic-selfsigned-cert.pem"));
    run(async move {
        let options = ClientOptions {
            identity: Some(sluice_sdk::ClientIdentity {
                cert_path,
                key_path,
            }),
            ..ClientOptions::new(trust.clone())
        };
        let c = Client::connect(addr, options).await.expect("mTLS connect");
        c.create_queue("mtls").await.expect("served");
        let anonymous = ClientOptions {
            connect_timeout: Duration::from_secs(2),
            retries: 0,
            ..ClientOptions::new(trust)
        };
        let e = Client::connect(addr, anonymous)
            .await
            .err()
            .expect("no client certificate");
        assert!(matches!(e, Error::Connect(_)), "{e:?}");
    });
    handle.shutdown();
}

#[test]
fn access_keys_authenticate_native_clients_and_select_their_account() {
    use sluice_broker::auth::{parse_keys, AuthConfig, AuthMode};
    let dir = tempfile::tempdir().expect("temp dir");
    let handle = one_shard_broker(dir.path(), |c| {
        c.auth = AuthConfig {
            mode: AuthMode::SigV4,
            keys: parse_keys(
                "AKIDALPHA:alpha-secret:111111111111,AKIDBETA:beta-secret:222222222222",
            )
            .expect("keys"),
        }
    });
    let addr = handle.quic_addr();
    let trust = Trust::PemFile(dir.path().join("quic-selfsigned-cert.pem"));
    run(async move {
        let with = |creds: Option<sluice_sdk::Credentials>| ClientOptions {
            credentials: creds,
            retries: 0,
            ..ClientOptions::new(trust.clone())
        };
        // No credentials, an unknown key, a wrong secret: AccessDenied, never retried.
        for creds in [
            None,
            Some(sluice_sdk::Credentials::new("AKIDNOBODY", "x")),
            Some(sluice_sdk::Credentials::new("AKIDALPHA", "beta-secret")),
        ] {
            let e = Client::connect(addr, with(creds.clone()))
                .await
                .err()
                .unwrap_or_else(|| panic!("{creds:?} must be refused"));
            assert_eq!(e.code(), Some(ErrorCode::AccessDenied), "{e:?}");
            assert!(!e.is_retryable());
        }
        // Each key works in its own account: same queue name, different queues.
        let alpha = Client::connect(
            addr,
            with(Some(sluice_sdk::Credentials::new(
                "AKIDALPHA",
                "alpha-secret",
            ))),
        )
        .await
        .expect("alpha connects");
        let beta = Client::connect(
            addr,
            with(Some(sluice_sdk::Credentials::new(
                "AKIDBETA",
                "beta-secret",
            ))),
        )
        .await
        .expect("beta connects");
        let qa = alpha.create_queue("jobs").await.expect("create");
        let qb = beta.create_queue("jobs").await.expect("create");
        assert!(qa.contains("111111111111"), "{qa}");
        assert!(qb.contains("222222222222"), "{qb}");
        alpha.send(&qa, "for alpha").await.expect("send");
        let got = beta
            .receive(&qb, ReceiveOptions::long_poll(10, 0))
            .await
            .expect("receive");
        assert!(got.is_empty(), "beta's queue is its own");
        // The secret never shows in Debug output (options get logged).
        let shown = format!(
            "{:?}",
            with(Some(sluice_sdk::Credentials::new(
                "AKIDALPHA",
                "alpha-secret"
            )))
        );
        assert!(!shown.contains("alpha-secret"), "{shown}");
    });
    handle.shutdown();
}

#[test]
fn many_concurrent_clients() {
    const CLIENTS: usize = 16;
    const EACH: usize = 25;
    run(async {
        let setup = client().await;
        let q = setup.create_queue("crowd").await.expect("create");
        let producers: Vec<_> = (0..CLIENTS)
            .map(|i| {
                let q = q.clone();
                tokio::spawn(async move {
                    let c = client().await;
                    for j in 0..EACH {
                        c.send(&q, &format!("c{i}-{j}")).await.expect("send");
                    }
                })
            })
            .collect();
        let consumers: Vec<_> = (0..CLIENTS / 2)
            .map(|_| {
                let q = q.clone();
                tokio::spawn(async move {
                    let c = client().await;
                    let mut got = Vec::new();
                    loop {
                        let batch = c
                            .receive(&q, ReceiveOptions::long_poll(10, 2))
                            .await
                            .expect("receive");
                        if batch.is_empty() {
                            return got;
                        }
                        let handles: Vec<String> =
                            batch.iter().map(|m| m.receipt_handle.clone()).collect();
                        let r = c.delete_batch(&q, &handles).await.expect("delete");
                        assert!(r.failed.is_empty(), "{:?}", r.failed);
                        got.extend(batch.into_iter().map(|m| m.body));
                    }
                })
            })
            .collect();
        for p in producers {
            p.await.expect("producer");
        }
        let mut all = Vec::new();
        for c in consumers {
            all.extend(c.await.expect("consumer"));
        }
        // Stragglers a consumer gave up on just before they arrived.
        loop {
            let batch = setup
                .receive(&q, ReceiveOptions::long_poll(10, 1))
                .await
                .expect("receive");
            if batch.is_empty() {
                break;
            }
            for m in batch {
                setup.delete(&q, &m.receipt_handle).await.expect("delete");
                all.push(m.body);
            }
        }
        all.sort();
        let before = all.len();
        all.dedup();
        assert_eq!(before, all.len(), "no message delivered twice");
        assert_eq!(all.len(), CLIENTS * EACH, "every message delivered");
    });
}
