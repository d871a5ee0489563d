//! QUIC echo: our glommio adapter against quinn's own tokio runtime, in the same run.
//!
//! Server on core 1 (a glommio executor with [`ShardEndpoint`], or a current-thread tokio
//! runtime pinned the same way: the transport floor), client on tokio pinned to core 0.
//! Measures a 64-byte ping-pong round trip (p50/p99/p99.9) and pipelined 1 KiB echo
//! throughput, and prints the ratios. No assertions: figures only.
//!
//! `cargo bench -p sluice-broker --bench quic_echo`; knobs: `SLUICE_BENCH_PINGS` (round trips,
//! default 20000), `SLUICE_BENCH_MSGS` (pipelined messages, default 100000).

// A test is the broker's outside world: it times the broker with its own clocks (deadlines,
// waits, latencies). broker/clippy.toml's clock seam governs the broker's code, not this.
#![allow(clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use sluice_broker::quic::{tls, EndpointOptions, ShardEndpoint, UdpStats};

const SERVER_CORE: usize = 1;
const CLIENT_CORE: usize = 0;
const PING_BYTES: usize = 64;
const PIPELINED_BYTES: usize = 1024;
const WARMUP_PINGS: usize = 1_000;
/// Every phase is bounded by this, whatever the counts.
const PHASE_TIMEOUT: Duration = Duration::from_secs(60);

fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pin(core: usize) {
    let ids = core_affinity::get_core_ids().unwrap_or_default();
    if let Some(id) = ids.into_iter().find(|c| c.id == core) {
        core_affinity::set_for_current(id);
    }
}

/// Streams bytes back as they arrive (the same handler for both servers).
async fn echo_stream(mut send: quinn::SendStream, mut recv: quinn::RecvStream) {
    while let Ok(Some(chunk)) = recv.read_chunk(64 * 1024, true).await {
        if send.write_all(&chunk.bytes).await.is_err() {
            return;
        }
    }
    let _ = send.finish();
}

struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    join: Box<dyn FnOnce() -> Option<UdpStats>>,
}

fn glommio_server(config: quinn::ServerConfig, spin: Option<Duration>) -> Server {
    let stop = Arc::new(AtomicBool::new(false));
    let stop_flag = stop.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let mut builder = sluice_storage::rt::executor_builder(
        "bench-glommio",
        glommio::Placement::Fixed(SERVER_CORE),
    );
    if let Some(spin) = spin {
        builder = builder.spin_before_park(spin);
    }
    let handle = builder
        .spawn(move || async move {
            let ep = std::rc::Rc::new(
                ShardEndpoint::bind(
                    "127.0.0.1:0".parse().expect("literal"),
                    config,
                    EndpointOptions::default(),
                )
                .expect("bind"),
            );
            tx.send(ep.local_addr().expect("addr")).expect("send addr");
            let acceptor = ep.clone();
            glommio::spawn_local(async move {
                while let Some(incoming) = acceptor.accept().await {
                    glommio::spawn_local(async move {
                        let Ok(conn) = incoming.accept().await else {
                            return;
                        };
                        while let Ok((send, recv)) = conn.accept_bi().await {
                            glommio::spawn_local(echo_stream(send, recv)).detach();
                        }
                    })
                    .detach();
                }
            })
            .detach();
            while !stop_flag.load(Ordering::Relaxed) {
                glommio::timer::sleep(Duration::from_millis(10)).await;
            }
            ep.shutdown(Duration::from_millis(100)).await;
            ep.udp_stats()
        })
        .expect("spawn glommio server");
    let addr = rx.recv().expect("server address");
    Server {
        addr,
        stop,
        join: Box::new(move || handle.join().ok()),
    }
}

fn tokio_server(config: quinn::ServerConfig) -> Server {
    let stop = Arc::new(AtomicBool::new(false));
    let stop_flag = stop.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        pin(SERVER_CORE);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        rt.block_on(async move {
            let ep = quinn::Endpoint::server(config, "127.0.0.1:0".parse().expect("literal"))
                .expect("bind");
            tx.send(ep.local_addr().expect("addr")).expect("send addr");
            let acceptor = ep.clone();
            tokio::spawn(async move {
                while let Some(incoming) = acceptor.accept().await {
                    tokio::spawn(async move {
                        let Ok(conn) = incoming.await else {
                            return;
                        };
                        while let Ok((send, recv)) = conn.accept_bi().await {
                            tokio::spawn(echo_stream(send, recv));
                        }
                    });
                }
            });
            while !stop_flag.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            ep.close(0u32.into(), b"done");
            let _ = tokio::time::timeout(Duration::from_millis(100), ep.wait_idle()).await;
        });
    });
    let addr = rx.recv().expect("server address");
    Server {
        addr,
        stop,
        join: Box::new(move || {
            let _ = handle.join();
            None
        }),
    }
}

#[derive(Clone, Copy)]
struct Figures {
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    msgs_per_s: f64,
}

fn run_client(addr: SocketAddr, client: quinn::ClientConfig, pings: usize, msgs: usize) -> Figures {
    std::thread::spawn(move || {
        pin(CLIENT_CORE);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        rt.block_on(async move {
            let mut ep =
                quinn::Endpoint::client("127.0.0.1:0".parse().expect("literal")).expect("client");
            ep.set_default_client_config(client);
            let conn = ep
                .connect(addr, "localhost")
                .expect("connect")
                .await
                .expect("handshake");

            // Ping-pong on one stream: write 64 bytes, wait for the 64 echoed bytes.
            let (mut send, mut recv) = conn.open_bi().await.expect("open");
            let ping = [0x5au8; PING_BYTES];
            let mut pong = [0u8; PING_BYTES];
            let mut hist = Histogram::<u64>::new(3).expect("histogram");
            let pingpong = async {
                for i in 0..WARMUP_PINGS + pings {
                    let start = Instant::now();
                    send.write_all(&ping).await.expect("ping");
                    recv.read_exact(&mut pong).await.expect("pong");
                    if i >= WARMUP_PINGS {
                        let ns = start.elapsed().as_nanos() as u64;
                        hist.record(ns.max(1)).expect("record");
                    }
                }
            };
            tokio::time::timeout(PHASE_TIMEOUT, pingpong)
                .await
                .expect("ping-pong phase finished in time");
            let _ = send.finish();

            // Pipelined: one stream, `msgs` writes of 1 KiB, echo drained concurrently.
            let (mut send, mut recv) = conn.open_bi().await.expect("open");
            let message = [0xa5u8; PIPELINED_BYTES];
            let total = msgs * PIPELINED_BYTES;
            let start = Instant::now();
            let writer = async {
                for _ in 0..msgs {
                    send.write_all(&message).await.expect("write");
                }
                send.finish().expect("finish");
            };
            let reader = async {
                let mut got = 0usize;
                while got < total {
                    match recv.read_chunk(64 * 1024, true).await.expect("read") {
                        Some(chunk) => got += chunk.bytes.len(),
                        None => break,
                    }
                }
                got
            };
            let (_, got) =
                tokio::time::timeout(PHASE_TIMEOUT, async { tokio::join!(writer, reader) })
                    .await
                    .expect("pipelined phase finished in time");
            let elapsed = start.elapsed();
            assert_eq!(got, total, "echoed everything");
            conn.close(0u32.into(), b"done");
            ep.wait_idle().await;
            Figures {
                p50_us: hist.value_at_quantile(0.5) as f64 / 1e3,
                p99_us: hist.value_at_quantile(0.99) as f64 / 1e3,
                p999_us: hist.value_at_quantile(0.999) as f64 / 1e3,
                msgs_per_s: msgs as f64 / elapsed.as_secs_f64(),
            }
        })
    })
    .join()
    .expect("client thread")
}

fn main() {
    // `cargo bench` passes `--bench`; a libtest-style `--list` (e.g. from `cargo test
    // --benches`) must print nothing and exit.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let pings = env_count("SLUICE_BENCH_PINGS", 20_000);
    let msgs = env_count("SLUICE_BENCH_MSGS", 100_000);
    let dir = tempfile::tempdir().expect("temp dir");
    let (identity, _) = tls::load_or_create_self_signed(dir.path()).expect("identity");
    let server_config = tls::quinn_server_config(&identity, None).expect("server config");
    let client_config = tls::client_config_trusting(&identity.cert_chain, None).expect("client");

    println!(
        "quic echo: server on core {SERVER_CORE}, tokio client on core {CLIENT_CORE}; \
         {pings} x {PING_BYTES} B ping-pong, {msgs} x {PIPELINED_BYTES} B pipelined"
    );
    println!(
        "{:<28} {:>9} {:>9} {:>9} {:>12}",
        "server", "p50 µs", "p99 µs", "p99.9 µs", "msg/s"
    );
    let mut results = Vec::new();
    let variants: [(&str, u8); 3] = [
        ("tokio quinn (floor)", 0),
        ("glommio adapter", 1),
        ("glommio adapter, spin 50µs", 2),
    ];
    for (name, kind) in variants {
        let server = match kind {
            0 => tokio_server(server_config.clone()),
            1 => glommio_server(server_config.clone(), None),
            _ => glommio_server(server_config.clone(), Some(Duration::from_micros(50))),
        };
        let figures = run_client(server.addr, client_config.clone(), pings, msgs);
        server.stop.store(true, Ordering::Relaxed);
        let stats = (server.join)();
        println!(
            "{name:<28} {:>9.1} {:>9.1} {:>9.1} {:>12.0}",
            figures.p50_us, figures.p99_us, figures.p999_us, figures.msgs_per_s
        );
        if let Some(stats) = stats {
            println!(
                "{:<28} sends {} eagains {} backoffs {} recv batches {} buffers {} waits {}",
                "",
                stats.sends,
                stats.eagains,
                stats.backoffs,
                stats.recv_batches,
                stats.recv_buffers,
                stats.recv_waits
            );
        }
        results.push((name, figures));
    }
    let floor = results[0].1;
    for (name, f) in &results[1..] {
        println!(
            "{name} vs floor: p50 x{:.2}, p99 x{:.2}, p99.9 x{:.2}, throughput x{:.2}",
            f.p50_us / floor.p50_us,
            f.p99_us / floor.p99_us,
            f.p999_us / floor.p999_us,
            f.msgs_per_s / floor.msgs_per_s
        );
    }
}
