//! SDK over QUIC against an in-process broker: send → receive → delete cycles per second, and
//! the round-trip latency of a send and of a receive at a low fixed rate. 2 KiB bodies; the
//! broker fsyncs before every ack (group commit), as in production.
//!
//! The same run measures the transport's floor: a plain quinn-on-tokio echo server in this
//! process, 2 KiB ping-pong on one stream at the same rate, from the same client runtime.
//!
//! Run: `cargo bench -p sluice-e2e --bench sdk_cycle [-- --seconds 5]`. Prints a Markdown
//! table; figures, not assertions. Compare also with `cargo bench -p sluice-broker --bench
//! queue_cycle` (the same cycle without the network).

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use sluice_broker::config::BrokerConfig;
use sluice_sdk::{Client, ClientOptions, ReceiveOptions, Trust};

const BODY_BYTES: usize = 2048;
/// Concurrent consumer/producer tasks of the throughput phase (one connection, pipelined).
const WORKERS: usize = 32;
/// Requests per second of the latency phase (low enough not to queue).
const LATENCY_RATE_PER_S: u64 = 500;

fn main() {
    let mut seconds = 5.0f64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--seconds" {
            seconds = args.next().and_then(|s| s.parse().ok()).unwrap_or(seconds);
        }
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let mut c = BrokerConfig::ephemeral(dir.path().to_path_buf()).expect("config");
    c.http_addr = "127.0.0.1:0".parse().expect("addr");
    c.kafka_addr = None;
    c.quic_addr = "127.0.0.1:0".parse().expect("addr");
    let shards = c.shards;
    let broker = sluice_broker::server::start(c).expect("start");
    broker.wait_ready().expect("ready");
    let addr = broker.quic_addr();
    let cert = dir.path().join("quic-selfsigned-cert.pem");
    let echo_dir = tempfile::tempdir().expect("temp dir");
    let echo_dir = echo_dir.path().to_path_buf();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let client = Client::connect(addr, ClientOptions::new(Trust::PemFile(cert)))
            .await
            .expect("connect");
        let q = client.create_queue("bench").await.expect("queue");
        let body = "x".repeat(BODY_BYTES);

        // Latency at a fixed low rate: one send, then one receive + delete, every tick.
        let mut send_us = Histogram::<u64>::new(3).expect("histogram");
        let mut recv_us = Histogram::<u64>::new(3).expect("histogram");
        let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / LATENCY_RATE_PER_S));
        let end = Instant::now() + Duration::from_secs_f64(seconds);
        while Instant::now() < end {
            tick.tick().await;
            let t = Instant::now();
            client.send(&q, &body).await.expect("send");
            send_us.record(t.elapsed().as_micros() as u64).expect("record");
            let t = Instant::now();
            let got = client
                .receive(&q, ReceiveOptions::long_poll(1, 1))
                .await
                .expect("receive");
            recv_us.record(t.elapsed().as_micros() as u64).expect("record");
            for m in got {
                client.delete(&q, &m.receipt_handle).await.expect("delete");
            }
        }

        // A round trip that touches no disk: a receive from an empty queue (no wait). This is
        // the protocol's own cost beside the echo floor.
        let empty = client.create_queue("bench-empty").await.expect("queue");
        let mut empty_us = Histogram::<u64>::new(3).expect("histogram");
        let end = Instant::now() + Duration::from_secs_f64(seconds);
        while Instant::now() < end {
            tick.tick().await;
            let t = Instant::now();
            let got = client
                .receive(&empty, ReceiveOptions::long_poll(1, 0))
                .await
                .expect("receive");
            empty_us.record(t.elapsed().as_micros() as u64).expect("record");
            assert!(got.is_empty());
        }

        // The floors: 2 KiB echo round trips over plain quinn at the same rate, and a 4 KiB
        // write + fdatasync on the broker's disk at the same rate.
        let echo_us = echo_floor(&echo_dir, seconds, &body).await;
        let sync_us = fdatasync_floor(&echo_dir, seconds);

        // Throughput: WORKERS tasks each looping send → receive → delete on one connection.
        let end = Instant::now() + Duration::from_secs_f64(seconds);
        let tasks: Vec<_> = (0..WORKERS)
            .map(|_| {
                let (client, q, body) = (client.clone(), q.clone(), body.clone());
                tokio::spawn(async move {
                    let mut cycles = 0u64;
                    while Instant::now() < end {
                        client.send(&q, &body).await.expect("send");
                        let got = client
                            .receive(&q, ReceiveOptions::long_poll(1, 1))
                            .await
                            .expect("receive");
                        for m in got {
                            client.delete(&q, &m.receipt_handle).await.expect("delete");
                            cycles += 1;
                        }
                    }
                    cycles
                })
            })
            .collect();
        let t = Instant::now();
        let mut cycles = 0;
        for task in tasks {
            cycles += task.await.expect("worker");
        }
        let rate = cycles as f64 / t.elapsed().as_secs_f64();

        println!(
            "SDK over QUIC (loopback, TLS), {BODY_BYTES} B bodies, fsync before every ack, {shards} shards\n"
        );
        println!("| measure | p50 µs | p99 µs | p99.9 µs | n |");
        println!("|---|---|---|---|---|");
        for (name, h) in [
            ("quinn echo floor (2 KiB)", &echo_us),
            ("disk floor: 4 KiB write + fdatasync", &sync_us),
            ("receive from an empty queue (no disk)", &empty_us),
            ("send round trip", &send_us),
            ("receive round trip", &recv_us),
        ] {
            println!(
                "| {name} @ {LATENCY_RATE_PER_S}/s | {} | {} | {} | {} |",
                h.value_at_quantile(0.5),
                h.value_at_quantile(0.99),
                h.value_at_quantile(0.999),
                h.len()
            );
        }
        let p50 = |h: &Histogram<u64>| h.value_at_quantile(0.5).max(1) as f64;
        println!(
            "\nempty receive p50 / echo p50 = {:.2} (the protocol without the disk)",
            p50(&empty_us) / p50(&echo_us)
        );
        println!(
            "send p50 / echo p50 = {:.2}; send p50 / (echo + fdatasync) p50 = {:.2} (a send \
             includes the fsync before its ack)",
            p50(&send_us) / p50(&echo_us),
            p50(&send_us) / (p50(&echo_us) + p50(&sync_us))
        );
        println!("\n| workers | send→receive→delete cycles/s |\n|---|---|\n| {WORKERS} | {rate:.0} |");
    });
    broker.shutdown();
}

/// 4 KiB `write` + `fdatasync` of a preallocated file in `dir` (the broker's disk), at
/// [`LATENCY_RATE_PER_S`] for `seconds`: what one durable acknowledgement costs at least.
fn fdatasync_floor(dir: &std::path::Path, seconds: f64) -> Histogram<u64> {
    use std::io::{Seek, SeekFrom, Write};
    let mut h = Histogram::<u64>::new(3).expect("histogram");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(dir.join("fdatasync-floor"))
        .expect("open");
    let block = [7u8; 4096];
    for _ in 0..256 {
        f.write_all(&block).expect("prefill");
    }
    f.sync_all().expect("sync");
    let period = Duration::from_micros(1_000_000 / LATENCY_RATE_PER_S);
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut i = 0u64;
    while Instant::now() < end {
        let t = Instant::now();
        f.seek(SeekFrom::Start((i % 256) * 4096)).expect("seek");
        f.write_all(&block).expect("write");
        f.sync_data().expect("fdatasync");
        h.record(t.elapsed().as_micros() as u64).expect("record");
        i += 1;
        std::thread::sleep(period.saturating_sub(t.elapsed()));
    }
    h
}

/// Round trips of `body` over a plain quinn echo server (its own tokio thread), at
/// [`LATENCY_RATE_PER_S`] for `seconds`.
async fn echo_floor(dir: &std::path::Path, seconds: f64, body: &str) -> Histogram<u64> {
    use sluice_broker::quic::tls;
    let (identity, _) = tls::load_or_create_self_signed(dir).expect("identity");
    let server_config = tls::quinn_server_config(&identity, None).expect("server config");
    let client_config =
        tls::client_config_trusting(&[identity.leaf().clone()], None).expect("client");
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let ep = quinn::Endpoint::server(server_config, "127.0.0.1:0".parse().expect("addr"))
                .expect("echo endpoint");
            addr_tx
                .send(ep.local_addr().expect("addr"))
                .expect("send addr");
            while let Some(incoming) = ep.accept().await {
                tokio::spawn(async move {
                    let Ok(conn) = incoming.await else { return };
                    while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                        tokio::spawn(async move {
                            let mut buf = vec![0u8; BODY_BYTES];
                            while recv.read_exact(&mut buf).await.is_ok() {
                                if send.write_all(&buf).await.is_err() {
                                    return;
                                }
                            }
                        });
                    }
                });
            }
        });
    });
    let addr = addr_rx.recv().expect("echo address");
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().expect("addr")).expect("client");
    ep.set_default_client_config(client_config);
    let conn = ep
        .connect(addr, "localhost")
        .expect("connect")
        .await
        .expect("handshake");
    let (mut send, mut recv) = conn.open_bi().await.expect("stream");
    let mut h = Histogram::<u64>::new(3).expect("histogram");
    let mut buf = vec![0u8; BODY_BYTES];
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / LATENCY_RATE_PER_S));
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    while Instant::now() < end {
        tick.tick().await;
        let t = Instant::now();
        send.write_all(body.as_bytes()).await.expect("write");
        recv.read_exact(&mut buf).await.expect("read");
        h.record(t.elapsed().as_micros() as u64).expect("record");
    }
    conn.close(0u32.into(), b"done");
    h
}
