//! The native QUIC port attacked as an outsider without credentials would (CONTRACT.md C9:
//! nothing unauthenticated costs the broker more than a small, stated bound): hundreds of
//! connections complete the TLS handshake, never authenticate, open every stream they may and
//! push as many bytes as flow control lets them. The real `sluiced`, one shard, SigV4 keys.
//! Checked: the connections held at once stay within the per-shard cap, each gets one stream
//! and a small window before `Hello`, the broker's resident memory stays within a stated
//! bound, every attacker is closed by the authentication deadline, and a client with
//! credentials connects and works in the middle of the flood.
//!
//! `SLUICE_TEST_SLUICED=/path/to/sluiced` runs it against another build (an older one, to see
//! it fail). Every wait is bounded; only loopback is used.

// A test is the broker's outside world: it times the broker with its own clocks (deadlines,
// waits, latencies). broker/clippy.toml's clock seam governs the broker's code, not this.
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice_broker::native::{
    HELLO_TIMEOUT_MS, UNAUTHENTICATED_CONNECTIONS_PER_SHARD_MAX,
    UNAUTHENTICATED_RECEIVE_WINDOW_BYTES,
};
use sluice_sdk::{Client, ClientOptions, Credentials, ReceiveOptions, Trust};

const AKID: &str = "AKIDQUIC";
const SECRET: &str = "quic-attack-secret";
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections the attacker opens: more than the broker lets wait unauthenticated.
const ATTACKERS: usize = 400;
/// Streams each attacker tries to open, and bytes it tries to push on each (before the fix,
/// 16 MiB per connection were buffered: 400 connections would hold ~1.6 GB).
const STREAMS_TRIED: usize = 4;
const BYTES_PER_STREAM: usize = 1 << 20;
/// How long the attacker waits for each stream or write that flow control holds back.
const ATTACK_STEP_TIMEOUT: Duration = Duration::from_millis(1_500);
/// Growth of the broker's resident memory the flood may cause: the stated bound (cap ×
/// (window + QUIC state of some tens of KiB)) ≈ 50 MiB, with room for allocator slack.
const RSS_GROWTH_KIB_MAX: u64 = 128 * 1024;

fn sluiced_path() -> PathBuf {
    std::env::var_os("SLUICE_TEST_SLUICED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_sluiced")))
}

fn free_port(udp: bool) -> u16 {
    if udp {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        s.local_addr().expect("addr").port()
    } else {
        let s = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        s.local_addr().expect("addr").port()
    }
}

struct Sluiced(Child);

impl Drop for Sluiced {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Sluiced {
    fn start(dir: &Path, quic_port: u16) -> Sluiced {
        let child = Command::new(sluiced_path())
            .env_clear()
            .arg("--data-dir")
            .arg(dir)
            .args(["--shards", "1"])
            .arg("--http-addr")
            .arg(format!("127.0.0.1:{}", free_port(false)))
            .arg("--quic-addr")
            .arg(format!("127.0.0.1:{quic_port}"))
            .arg("--metrics-addr")
            .arg(format!("127.0.0.1:{}", free_port(false)))
            .args(["--kafka-addr", "127.0.0.1:0"])
            .args(["--auth", "sigv4", "--access-keys"])
            .arg(format!("{AKID}:{SECRET}:111111111111"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn sluiced");
        Sluiced(child)
    }

    /// Resident memory, KiB (`VmRSS`), or its peak (`VmHWM`).
    fn status_kib(&self, field: &str) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.0.id())).expect("status");
        status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("{field} in /proc/<pid>/status"))
    }
}

async fn connect_with_credentials(port: u16, cert: &Path) -> sluice_sdk::Result<Client> {
    let options = ClientOptions {
        connect_timeout: Duration::from_secs(5),
        retries: 0,
        credentials: Some(Credentials::new(AKID, SECRET)),
        ..ClientOptions::new(Trust::PemFile(cert.to_path_buf()))
    };
    Client::connect(format!("127.0.0.1:{port}").parse().expect("addr"), options).await
}

/// A `Hello` without credentials, padded to near the largest first frame the server reads.
fn hello_frame() -> Vec<u8> {
    use sluice_wire::messages::{Hello, VersionRange};
    let hello = Hello {
        versions: VersionRange { min: 1, max: 1 },
        client_name: "x".repeat(sluice_wire::FRAME_BYTES_MIN - 1024),
        client_version: "0".into(),
        auth_token: None,
    };
    sluice_wire::encode_request(0, &sluice_wire::Request::Hello(hello))
        .expect("a Hello encodes")
        .to_vec()
}

/// What one attacker achieved.
#[derive(Debug, Default, Clone, Copy)]
struct Attack {
    handshake_done: bool,
    streams_opened: usize,
    bytes_written: usize,
}

/// One attacker: handshake, then every stream and byte it can get, never a `Hello`; then it
/// holds the connection and reports when the server closed it.
async fn attack(
    endpoint: quinn::Endpoint,
    addr: std::net::SocketAddr,
) -> (Attack, Option<quinn::Connection>) {
    let mut a = Attack::default();
    let Ok(connecting) = endpoint.connect(addr, "localhost") else {
        return (a, None);
    };
    let Ok(Ok(conn)) = tokio::time::timeout(Duration::from_secs(10), connecting).await else {
        return (a, None);
    };
    a.handshake_done = true;
    let junk = vec![0x5au8; BYTES_PER_STREAM];
    let mut held = Vec::new();
    for i in 0..STREAMS_TRIED {
        let Ok(Ok((mut send, recv))) =
            tokio::time::timeout(ATTACK_STEP_TIMEOUT, conn.open_bi()).await
        else {
            break;
        };
        a.streams_opened += 1;
        if i == 0 {
            // The first stream: a Hello as large as the server takes, but its last byte, so the
            // server buffers it and waits for the rest.
            let hello = hello_frame();
            let partial = &hello[..hello.len() - 1];
            if tokio::time::timeout(ATTACK_STEP_TIMEOUT, send.write_all(partial))
                .await
                .is_ok_and(|r| r.is_ok())
            {
                a.bytes_written += partial.len();
            }
        } else {
            // The others: as many bytes as flow control takes within the step.
            let mut at = 0;
            let _ = tokio::time::timeout(ATTACK_STEP_TIMEOUT, async {
                while at < junk.len() {
                    match send.write(&junk[at..]).await {
                        Ok(n) => at += n,
                        Err(_) => break,
                    }
                }
            })
            .await;
            a.bytes_written += at;
        }
        held.push((send, recv));
    }
    // The streams stay open (not finished, not reset) while the connection lives.
    std::mem::forget(held);
    (a, Some(conn))
}

#[test]
fn unauthenticated_quic_connections_cost_a_bounded_amount_and_are_closed() {
    let dir = tempfile::tempdir().expect("tmp");
    let data = dir.path().join("data");
    let port = free_port(true);
    let b = Sluiced::start(&data, port);
    let cert = data.join(sluice_broker::quic::tls::SELF_SIGNED_CERT_FILE);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let b = &b;
    rt.block_on(async move {
        // Up, and serving a client with credentials.
        let deadline = Instant::now() + START_TIMEOUT;
        let client = loop {
            if cert.exists() {
                if let Ok(c) = connect_with_credentials(port, &cert).await {
                    break c;
                }
            }
            assert!(Instant::now() < deadline, "sluiced did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let queue = client.create_queue("before").await.expect("create");
        client.send(&queue, "before the flood").await.expect("send");
        let rss_before = b.status_kib("VmRSS");

        // The flood: the attacker trusts the certificate (it is public) but has no key.
        let certs = sluice_broker::quic::tls::load_certs(&cert).expect("certificate");
        let client_config =
            sluice_broker::quic::tls::client_config_trusting(&certs, None).expect("client config");
        let mut endpoint =
            quinn::Endpoint::client("127.0.0.1:0".parse().expect("addr")).expect("endpoint");
        endpoint.set_default_client_config(client_config);
        let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
        let started = Instant::now();
        let attacks: Vec<_> = (0..ATTACKERS)
            .map(|_| tokio::spawn(attack(endpoint.clone(), addr)))
            .collect();

        // In the middle of it, a client with credentials gets in and works.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let during = connect_with_credentials(port, &cert)
            .await
            .expect("a client with credentials connects during the flood");
        let q = during.create_queue("during").await.expect("create during");
        during
            .send(&q, "during the flood")
            .await
            .expect("send during");
        let got = during
            .receive(&q, ReceiveOptions::long_poll(1, 1))
            .await
            .expect("receive during");
        assert_eq!(got.len(), 1, "received during the flood");

        let mut results = Vec::new();
        for t in attacks {
            results.push(t.await.expect("attacker task"));
        }
        let rss_peak = b.status_kib("VmHWM");
        let rss_flood = b.status_kib("VmRSS");
        let done: Vec<Attack> = results.iter().map(|(a, _)| *a).collect();
        let handshakes = done.iter().filter(|a| a.handshake_done).count();
        let max_streams = done.iter().map(|a| a.streams_opened).max().unwrap_or(0);
        let max_bytes = done.iter().map(|a| a.bytes_written).max().unwrap_or(0);
        let total_bytes: usize = done.iter().map(|a| a.bytes_written).sum();
        let open_now = results
            .iter()
            .filter_map(|(_, c)| c.as_ref())
            .filter(|c| c.close_reason().is_none())
            .count();
        println!(
            "{ATTACKERS} attackers: {handshakes} handshakes, {open_now} still open, at most \
             {max_streams} streams and {max_bytes} bytes each ({total_bytes} in all); RSS \
             {rss_before} KiB before, {rss_flood} KiB after, peak {rss_peak} KiB"
        );
        assert!(
            open_now <= UNAUTHENTICATED_CONNECTIONS_PER_SHARD_MAX,
            "{open_now} unauthenticated connections held at once (cap \
             {UNAUTHENTICATED_CONNECTIONS_PER_SHARD_MAX})"
        );
        assert!(
            max_streams <= 1,
            "an unauthenticated connection opened {max_streams} streams"
        );
        assert!(
            handshakes >= UNAUTHENTICATED_CONNECTIONS_PER_SHARD_MAX / 2,
            "the attack itself failed: {handshakes} handshakes"
        );
        assert!(
            max_bytes <= UNAUTHENTICATED_RECEIVE_WINDOW_BYTES as usize,
            "an unauthenticated connection sent {max_bytes} bytes (window \
             {UNAUTHENTICATED_RECEIVE_WINDOW_BYTES})"
        );
        assert!(
            rss_peak.saturating_sub(rss_before) < RSS_GROWTH_KIB_MAX,
            "the flood took RSS from {rss_before} KiB to a peak of {rss_peak} KiB"
        );

        // The deadline: every attacker is closed by the server within it (plus slack).
        let closed_by = started + Duration::from_millis(HELLO_TIMEOUT_MS + 5_000);
        for (_, c) in &results {
            if let Some(c) = c {
                let left = closed_by.saturating_duration_since(Instant::now());
                assert!(
                    tokio::time::timeout(left, c.closed()).await.is_ok(),
                    "an unauthenticated connection outlived the {HELLO_TIMEOUT_MS} ms deadline"
                );
            }
        }

        // And the broker still serves.
        let after = connect_with_credentials(port, &cert)
            .await
            .expect("connect after the flood");
        after
            .send(&queue, "after the flood")
            .await
            .expect("send after");
        endpoint.close(0u32.into(), b"done");
    });
    let _ = b;
}
