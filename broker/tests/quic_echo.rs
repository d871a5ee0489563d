//! System tests of the QUIC transport: an echo server on a glommio executor (our adapter)
//! against a stock quinn-on-tokio client, over loopback.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use sluice_broker::quic::{self, tls, EndpointOptions, ShardEndpoint, ShutdownReport, UdpStats};

/// Every client operation of a test is bounded by this.
const OP_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest message the echo handler accepts (a 1 MiB message and slack).
const MESSAGE_BYTES_MAX: usize = 2 * 1024 * 1024;

/// How long a stopping server lets in-flight streams finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// glommio registers 1 MiB of locked memory per executor and memlock is 8 MiB here: tests of
/// this binary run in parallel threads, so at most one test at a time holds executors.
static EXECUTORS: Mutex<()> = Mutex::new(());

fn executor_lock() -> MutexGuard<'static, ()> {
    EXECUTORS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What the server saw, returned when it stops.
#[derive(Debug)]
struct ServerReport {
    stats: UdpStats,
    shutdown: ShutdownReport,
    connections: u64,
    handshake_failures: u64,
    streams_echoed: u64,
    streams_failed: u64,
}

#[derive(Default)]
struct ServerCounters {
    connections: AtomicU64,
    handshake_failures: AtomicU64,
    streams_echoed: AtomicU64,
    streams_failed: AtomicU64,
}

/// An echo server on its own glommio executor thread.
struct EchoServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// Set by the server just before it starts draining.
    draining: Arc<AtomicBool>,
    counters: Arc<ServerCounters>,
    join: Option<glommio::ExecutorJoinHandle<std::io::Result<ServerReport>>>,
}

impl EchoServer {
    fn start(bind: SocketAddr, config: quinn::ServerConfig) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let stop_flag = stop.clone();
        let draining = Arc::new(AtomicBool::new(false));
        let draining_flag = draining.clone();
        let counters = Arc::new(ServerCounters::default());
        let server_counters = counters.clone();
        let join = sluice_storage::rt::executor_builder("quic-echo", glommio::Placement::Unbound)
            .spawn(move || async move {
                let ep = match ShardEndpoint::bind(bind, config, EndpointOptions::default()) {
                    Ok(ep) => ep,
                    Err(e) => {
                        let _ = addr_tx.send(Err(e.to_string()));
                        return Err(e);
                    }
                };
                addr_tx
                    .send(Ok(ep.local_addr()?))
                    .expect("the test waits for the address");
                serve(ep, stop_flag, draining_flag, server_counters).await
            })
            .expect("spawn the server executor");
        let addr = addr_rx
            .recv()
            .expect("server reports its address")
            .expect("server binds");
        Self {
            addr,
            stop,
            draining,
            counters,
            join: Some(join),
        }
    }

    /// Asks the server to shut down gracefully and returns what it saw.
    fn stop(mut self) -> ServerReport {
        self.stop.store(true, Ordering::SeqCst);
        self.join
            .take()
            .expect("joined once")
            .join()
            .expect("server thread")
            .expect("server ran")
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        if let Some(join) = self.join.take() {
            self.stop.store(true, Ordering::SeqCst);
            let _ = join.join();
        }
    }
}

async fn serve(
    ep: ShardEndpoint,
    stop: Arc<AtomicBool>,
    draining: Arc<AtomicBool>,
    counters: Arc<ServerCounters>,
) -> std::io::Result<ServerReport> {
    let ep = std::rc::Rc::new(ep);
    // The accept loop runs in its own task; the stop flag is polled from here (a test-only
    // cross-thread signal, checked every few ms).
    let accept_ep = ep.clone();
    let accept_counters = counters.clone();
    let acceptor = glommio::spawn_local(async move {
        while let Some(incoming) = accept_ep.accept().await {
            let tracker = accept_ep.tracker();
            let counters = accept_counters.clone();
            glommio::spawn_local(async move {
                match incoming.accept().await {
                    Ok(conn) => {
                        counters.connections.fetch_add(1, Ordering::Relaxed);
                        serve_connection(conn, tracker, counters).await;
                    }
                    Err(_) => {
                        counters.handshake_failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
            .detach();
        }
    })
    .detach();
    while !stop.load(Ordering::SeqCst) {
        glommio::timer::sleep(Duration::from_millis(5)).await;
    }
    // No await between the flag and shutdown's first step: when a client sees the flag,
    // everything it sends afterwards meets a draining endpoint.
    draining.store(true, Ordering::SeqCst);
    let shutdown = ep.shutdown(SHUTDOWN_GRACE).await;
    drop(acceptor);
    Ok(ServerReport {
        stats: ep.udp_stats(),
        shutdown,
        connections: counters.connections.load(Ordering::Relaxed),
        handshake_failures: counters.handshake_failures.load(Ordering::Relaxed),
        streams_echoed: counters.streams_echoed.load(Ordering::Relaxed),
        streams_failed: counters.streams_failed.load(Ordering::Relaxed),
    })
}

async fn serve_connection(
    conn: quinn::Connection,
    tracker: quic::StreamTracker,
    counters: Arc<ServerCounters>,
) {
    while let Ok((send, recv)) = conn.accept_bi().await {
        let Some(guard) = tracker.start() else {
            // Draining: refuse the stream, keep the connection for the in-flight ones.
            let mut send = send;
            let _ = send.reset(quinn::VarInt::from_u32(1));
            continue;
        };
        let counters = counters.clone();
        glommio::spawn_local(async move {
            let ok = echo_stream(send, recv).await.is_ok();
            let counter = if ok {
                &counters.streams_echoed
            } else {
                &counters.streams_failed
            };
            counter.fetch_add(1, Ordering::Relaxed);
            drop(guard);
        })
        .detach();
    }
}

/// Streams bytes back as they arrive, up to [`MESSAGE_BYTES_MAX`] per stream.
async fn echo_stream(
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut total = 0usize;
    while let Some(chunk) = recv.read_chunk(64 * 1024, true).await? {
        total += chunk.bytes.len();
        if total > MESSAGE_BYTES_MAX {
            recv.stop(quinn::VarInt::from_u32(2))?;
            return Err("message too large".into());
        }
        send.write_all(&chunk.bytes).await?;
    }
    send.finish()?;
    // `finish` only queues the FIN: the stream is done when the peer has everything, and
    // only then may its StreamGuard go (a shutdown would otherwise cut the tail).
    send.stopped().await?;
    Ok(())
}

fn localhost() -> SocketAddr {
    "127.0.0.1:0".parse().expect("literal address")
}

/// A server config with a fresh self-signed certificate, and that certificate.
fn self_signed_server() -> (
    quinn::ServerConfig,
    CertificateDer<'static>,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().expect("temp dir");
    let (identity, _) = tls::load_or_create_self_signed(dir.path()).expect("self-signed");
    let config = tls::quinn_server_config(&identity, None).expect("server config");
    (config, identity.leaf().clone(), dir)
}

fn tokio_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn client_endpoint(config: quinn::ClientConfig) -> quinn::Endpoint {
    let mut ep = quinn::Endpoint::client(localhost()).expect("client endpoint");
    ep.set_default_client_config(config);
    ep
}

async fn connect(ep: &quinn::Endpoint, addr: SocketAddr) -> Result<quinn::Connection, String> {
    let connecting = ep.connect(addr, "localhost").map_err(|e| e.to_string())?;
    tokio::time::timeout(OP_TIMEOUT, connecting)
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| e.to_string())
}

/// One request/response on a new bidirectional stream.
async fn echo(conn: &quinn::Connection, message: &[u8]) -> Result<Vec<u8>, String> {
    let work = async {
        let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
        // Write and read concurrently: a 1 MiB message exceeds the flow-control windows, so
        // the echo must be drained while we are still writing.
        let writer = async {
            send.write_all(message).await.map_err(|e| e.to_string())?;
            send.finish().map_err(|e| e.to_string())
        };
        let reader = async {
            recv.read_to_end(MESSAGE_BYTES_MAX)
                .await
                .map_err(|e| e.to_string())
        };
        let (w, r) = tokio::join!(writer, reader);
        w?;
        r
    };
    tokio::time::timeout(OP_TIMEOUT, work)
        .await
        .map_err(|_| "echo timed out".to_string())?
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn many_connections_many_streams_small_and_large_messages() {
    let _lock = executor_lock();
    let (config, cert, _dir) = self_signed_server();
    let server = EchoServer::start(localhost(), config);
    let client_config = tls::client_config_trusting(&[cert], None).expect("client config");
    const CONNECTIONS: usize = 8;
    const STREAMS_PER_CONNECTION: usize = 32;
    const LARGE_BYTES: usize = 1024 * 1024;
    tokio_runtime().block_on(async {
        let ep = client_endpoint(client_config);
        let mut tasks = Vec::new();
        for c in 0..CONNECTIONS {
            let conn = connect(&ep, server.addr).await.expect("connect");
            tasks.push(tokio::spawn(async move {
                let mut streams = Vec::new();
                for s in 0..STREAMS_PER_CONNECTION {
                    let conn = conn.clone();
                    streams.push(async move {
                        // One large message per connection, the rest small and varied.
                        let len = if s == 0 {
                            LARGE_BYTES
                        } else {
                            1 + (s * 97) % 4096
                        };
                        let message = pattern(len, (c * 7 + s) as u8);
                        let back = echo(&conn, &message).await?;
                        if back != message {
                            return Err(format!("stream {c}/{s}: echo differs"));
                        }
                        Ok::<_, String>(())
                    });
                }
                let results = futures::future::join_all(streams).await;
                conn.close(0u32.into(), b"done");
                results.into_iter().collect::<Result<Vec<()>, String>>()
            }));
        }
        for task in tasks {
            task.await.expect("client task").expect("echoes");
        }
        ep.wait_idle().await;
    });
    let report = server.stop();
    assert_eq!(report.connections, CONNECTIONS as u64);
    assert_eq!(
        report.streams_echoed,
        (CONNECTIONS * STREAMS_PER_CONNECTION) as u64
    );
    assert_eq!(report.streams_failed, 0);
    assert!(report.stats.sends > 0 && report.stats.recv_batches > 0);
}

/// The adapter trap (ARCHITECTURE.md, runtime facts): quinn asks "writable?" before every
/// datagram; answering "retry later" without a real EAGAIN delayed every datagram. After a load
/// run the socket must have backed off at most once per EAGAIN the kernel really returned.
#[test]
fn adapter_trap_backoffs_never_exceed_real_eagains() {
    let _lock = executor_lock();
    let (config, cert, _dir) = self_signed_server();
    let server = EchoServer::start(localhost(), config);
    let client_config = tls::client_config_trusting(&[cert], None).expect("client config");
    const CONNECTIONS: usize = 4;
    const MESSAGES_PER_CONNECTION: usize = 2_000;
    tokio_runtime().block_on(async {
        let ep = client_endpoint(client_config);
        let mut tasks = Vec::new();
        for _ in 0..CONNECTIONS {
            let conn = connect(&ep, server.addr).await.expect("connect");
            tasks.push(tokio::spawn(async move {
                // Pipelined: one stream, many 1 KiB writes, echo read concurrently.
                let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
                let message = pattern(1024, 3);
                let total = message.len() * MESSAGES_PER_CONNECTION;
                let writer = async {
                    for _ in 0..MESSAGES_PER_CONNECTION {
                        send.write_all(&message).await.map_err(|e| e.to_string())?;
                    }
                    send.finish().map_err(|e| e.to_string())
                };
                let reader = async { recv.read_to_end(total + 1).await.map_err(|e| e.to_string()) };
                let (w, r) =
                    tokio::time::timeout(OP_TIMEOUT, async { tokio::join!(writer, reader) })
                        .await
                        .map_err(|_| "load timed out".to_string())?;
                w?;
                let back = r?;
                conn.close(0u32.into(), b"done");
                if back.len() != total {
                    return Err(format!("echoed {} of {total} bytes", back.len()));
                }
                Ok::<_, String>(())
            }));
        }
        for task in tasks {
            task.await.expect("client task").expect("load");
        }
        ep.wait_idle().await;
    });
    let report = server.stop();
    let stats = report.stats;
    eprintln!("udp stats after load: {stats:?}");
    assert!(stats.sends >= 100, "the load sent datagrams: {stats:?}");
    assert!(
        stats.backoffs <= stats.eagains,
        "backed off without a real EAGAIN: {stats:?}"
    );
}

/// How the quitting client goes away in [`disconnect_mid_stream`].
#[derive(Clone, Copy, PartialEq)]
enum Quit {
    /// CONNECTION_CLOSE sent and acknowledged.
    Close,
    /// The client's process-side state vanishes: nothing more is sent, the server must notice
    /// by idle timeout.
    Vanish,
}

/// Server idle timeout in the vanish case, so that the test takes about this long.
const VANISH_IDLE_TIMEOUT: Duration = Duration::from_millis(800);

fn disconnect_mid_stream(quit: Quit) {
    let _lock = executor_lock();
    let (mut config, cert, _dir) = self_signed_server();
    if quit == Quit::Vanish {
        let mut transport = quinn::TransportConfig::default();
        transport.max_idle_timeout(Some(VANISH_IDLE_TIMEOUT.try_into().expect("small timeout")));
        config.transport_config(Arc::new(transport));
    }
    let server = EchoServer::start(localhost(), config);
    let counters = server.counters.clone();
    let client_config = tls::client_config_trusting(&[cert], None).expect("client config");
    let addr = server.addr;
    let quitter_config = client_config.clone();
    // The quitter runs on a runtime of its own, so that Vanish can drop all of it at once.
    let quitter = std::thread::spawn(move || {
        let rt = tokio_runtime();
        rt.block_on(async {
            let ep = client_endpoint(quitter_config);
            let conn = connect(&ep, addr).await.expect("connect");
            let (mut send, mut recv) = conn.open_bi().await.expect("open");
            let half = pattern(512 * 1024, 9);
            send.write_all(&half).await.expect("first half");
            // Make sure the server is mid-stream: some echo has come back.
            let mut first = [0u8; 1024];
            recv.read_exact(&mut first).await.expect("some echo");
            assert_eq!(&first[..], &half[..1024]);
            if quit == Quit::Close {
                conn.close(7u32.into(), b"gone mid-stream");
                ep.wait_idle().await;
            }
        });
        // Vanish: dropping the runtime drops every quinn task and the socket unannounced.
        drop(rt);
    });
    quitter.join().expect("quitter");
    tokio_runtime().block_on(async {
        let ep = client_endpoint(client_config);
        let steady = connect(&ep, addr).await.expect("connect");
        for i in 0..50u32 {
            let message = pattern(100 + i as usize, i as u8);
            assert_eq!(echo(&steady, &message).await.expect("echo"), message);
        }
        let large = pattern(1024 * 1024, 1);
        assert_eq!(echo(&steady, &large).await.expect("large echo"), large);
        // The abandoned stream ends on the server (at once, or at its idle timeout).
        tokio::time::timeout(OP_TIMEOUT, async {
            while counters.streams_failed.load(Ordering::Relaxed) == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the server gives up the abandoned stream");
        steady.close(0u32.into(), b"done");
        ep.wait_idle().await;
    });
    let report = server.stop();
    assert_eq!(report.connections, 2);
    assert_eq!(report.streams_failed, 1, "only the abandoned stream failed");
    assert_eq!(report.streams_echoed, 51);
    assert_eq!(report.shutdown.streams_cut, 0);
}

#[test]
fn client_closing_mid_stream_does_not_disturb_others() {
    disconnect_mid_stream(Quit::Close);
}

#[test]
fn client_vanishing_mid_stream_is_reaped_by_idle_timeout_and_others_are_served() {
    disconnect_mid_stream(Quit::Vanish);
}

/// A CA and a client certificate it signed.
struct ClientPki {
    ca: CertificateDer<'static>,
    client: tls::Identity,
}

fn client_pki(name: &str) -> ClientPki {
    let ca_key = rcgen::KeyPair::generate().expect("CA key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("{name} test CA"));
    let ca_cert = ca_params.self_signed(&ca_key).expect("CA cert");
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let client_key = rcgen::KeyPair::generate().expect("client key");
    let client_cert = rcgen::CertificateParams::new(vec![format!("{name}-client")])
        .expect("client params")
        .signed_by(&client_key, &issuer)
        .expect("client cert");
    ClientPki {
        ca: ca_cert.der().clone(),
        client: tls::Identity {
            cert_chain: vec![client_cert.der().clone()],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(client_key.serialize_der())),
        },
    }
}

fn mtls_server() -> (
    EchoServer,
    CertificateDer<'static>,
    ClientPki,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().expect("temp dir");
    let pki = client_pki("trusted");
    let ca_path = dir.path().join("client-ca.pem");
    let ca_pem = format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        base64_lines(&pki.ca)
    );
    std::fs::write(&ca_path, ca_pem).expect("write CA bundle");
    let options = tls::ServerTlsOptions {
        identity: tls::ServerIdentity::SelfSigned {
            data_dir: dir.path().to_owned(),
        },
        client_ca_path: Some(ca_path),
        client_cert_accounts: Default::default(),
    };
    let config = tls::server_config(&options).expect("mTLS server config");
    let (identity, provenance) =
        tls::load_or_create_self_signed(dir.path()).expect("server identity");
    assert_eq!(provenance, tls::Provenance::Reused);
    let server = EchoServer::start(localhost(), config);
    (server, identity.leaf().clone(), pki, dir)
}

fn base64_lines(der: &[u8]) -> String {
    use base64::Engine;
    let text = base64::engine::general_purpose::STANDARD.encode(der);
    text.as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).expect("base64 is ASCII"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn mtls_accepts_a_client_certificate_signed_by_the_configured_ca() {
    let _lock = executor_lock();
    let (server, server_cert, pki, _dir) = mtls_server();
    let config =
        tls::client_config_trusting(&[server_cert], Some(&pki.client)).expect("client config");
    tokio_runtime().block_on(async {
        let ep = client_endpoint(config);
        let conn = connect(&ep, server.addr).await.expect("mTLS connect");
        assert_eq!(
            echo(&conn, b"hello mtls").await.expect("echo"),
            b"hello mtls"
        );
        conn.close(0u32.into(), b"done");
        ep.wait_idle().await;
    });
    let report = server.stop();
    assert_eq!((report.connections, report.handshake_failures), (1, 0));
}

#[test]
fn mtls_rejects_clients_without_a_certificate_or_with_a_foreign_one() {
    let _lock = executor_lock();
    let (server, server_cert, _pki, _dir) = mtls_server();
    let stranger = client_pki("stranger");
    let no_cert =
        tls::client_config_trusting(std::slice::from_ref(&server_cert), None).expect("config");
    let foreign =
        tls::client_config_trusting(&[server_cert], Some(&stranger.client)).expect("config");
    tokio_runtime().block_on(async {
        for config in [no_cert, foreign] {
            let ep = client_endpoint(config);
            // In TLS 1.3 the client may finish its side before the server checks the client
            // certificate, so the rejection shows either at connect or at first use.
            let outcome = match connect(&ep, server.addr).await {
                Err(e) => Err(e),
                Ok(conn) => echo(&conn, b"let me in").await.map(|_| ()),
            };
            let err = outcome.expect_err("the server must reject this client");
            assert!(
                !err.contains("timed out"),
                "rejected with a clear error, not a timeout: {err}"
            );
            ep.wait_idle().await;
        }
    });
    let report = server.stop();
    assert_eq!((report.connections, report.handshake_failures), (0, 2));
}

#[test]
fn graceful_shutdown_finishes_in_flight_streams_and_refuses_new_work() {
    let _lock = executor_lock();
    let (config, cert, _dir) = self_signed_server();
    let server = EchoServer::start(localhost(), config);
    let client_config = tls::client_config_trusting(&[cert], None).expect("client config");
    let addr = server.addr;
    let draining = server.draining.clone();
    tokio_runtime().block_on(async {
        let ep = client_endpoint(client_config.clone());
        let conn = connect(&ep, addr).await.expect("connect");
        assert_eq!(echo(&conn, b"before").await.expect("echo"), b"before");

        // A stream in flight when shutdown begins: half written.
        let (mut send, mut recv) = conn.open_bi().await.expect("open");
        let message = pattern(256 * 1024, 5);
        send.write_all(&message[..128 * 1024])
            .await
            .expect("first half");
        let mut first = [0u8; 1024];
        recv.read_exact(&mut first).await.expect("echo started");

        let stopper = std::thread::spawn(move || server.stop());
        while !draining.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }

        // New work is refused: a new connection, and a new stream on the old one.
        let other = client_endpoint(client_config);
        let refused = connect(&other, addr).await;
        assert!(refused.is_err(), "new connection refused while draining");
        assert!(
            !refused.expect_err("checked").contains("timed out"),
            "refused promptly"
        );
        assert!(
            echo(&conn, b"new stream").await.is_err(),
            "new stream refused"
        );

        // The in-flight stream completes.
        let rest = async {
            send.write_all(&message[128 * 1024..])
                .await
                .map_err(|e| e.to_string())?;
            send.finish().map_err(|e| e.to_string())
        };
        let tail = async {
            recv.read_to_end(MESSAGE_BYTES_MAX)
                .await
                .map_err(|e| format!("{e:?}"))
        };
        let (w, r) = tokio::join!(rest, tail);
        w.expect("write the rest");
        let mut back = first.to_vec();
        back.extend(r.expect("read the rest"));
        assert_eq!(back, message, "in-flight stream finished intact");

        // Then the server closes the connection with the shutdown code.
        let closed = tokio::time::timeout(OP_TIMEOUT, conn.closed())
            .await
            .expect("closed");
        match closed {
            quinn::ConnectionError::ApplicationClosed(close) => {
                assert_eq!(close.error_code, quic::CLOSE_CODE_SHUTDOWN.into());
            }
            other => panic!("expected the shutdown close, got {other}"),
        }
        let report = tokio::task::spawn_blocking(move || stopper.join().expect("server"))
            .await
            .expect("join");
        assert_eq!(report.shutdown.streams_cut, 0);
        assert_eq!(report.streams_echoed, 2);
        assert_eq!(report.streams_failed, 0);
    });
}

#[test]
fn shards_share_one_port_with_reuseport() {
    let _lock = executor_lock();
    let (config, cert, _dir) = self_signed_server();
    let first = EchoServer::start(localhost(), config.clone());
    let second = EchoServer::start(first.addr, config);
    assert_eq!(first.addr, second.addr, "both shards bound the same port");
    let client_config = tls::client_config_trusting(&[cert], None).expect("client config");
    const CLIENTS: usize = 16;
    tokio_runtime().block_on(async {
        // One client endpoint (one source port) per connection, so the kernel's 4-tuple hash
        // has something to spread.
        for i in 0..CLIENTS {
            let ep = client_endpoint(client_config.clone());
            let conn = connect(&ep, first.addr).await.expect("connect");
            let message = pattern(200, i as u8);
            assert_eq!(echo(&conn, &message).await.expect("echo"), message);
            conn.close(0u32.into(), b"done");
            ep.wait_idle().await;
        }
    });
    let a = first.stop();
    let b = second.stop();
    assert_eq!(a.connections + b.connections, CLIENTS as u64);
    // With 16 flows and 2 sockets, all on one side has probability 2^-15.
    assert!(
        a.connections > 0 && b.connections > 0,
        "flows spread over both shards: {} / {}",
        a.connections,
        b.connections
    );
}
