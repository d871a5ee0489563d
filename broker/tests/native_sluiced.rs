//! The real `sluiced` binary, driven through the SDK over QUIC on loopback: a message acknowledged
//! before a graceful stop (SIGTERM) is there after a restart, served with the same persisted
//! self-signed certificate.

// A test is the broker's outside world: it times the broker with its own clocks (deadlines,
// waits, latencies). broker/clippy.toml's clock seam governs the broker's code, not this.
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice_sdk::{Client, ClientOptions, ReceiveOptions, Trust};

const START_TIMEOUT: Duration = Duration::from_secs(30);
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

struct Sluiced(Child);

impl Sluiced {
    fn start(dir: &Path, quic_port: u16) -> Sluiced {
        Self::start_with(dir, quic_port, &[])
    }

    fn start_with(dir: &Path, quic_port: u16, extra: &[&str]) -> Sluiced {
        let child = Command::new(env!("CARGO_BIN_EXE_sluiced"))
            .args(extra)
            .arg("--data-dir")
            .arg(dir)
            .arg("--shards")
            .arg("2")
            .arg("--http-addr")
            .arg(format!("127.0.0.1:{}", free_tcp_port()))
            .arg("--quic-addr")
            .arg(format!("127.0.0.1:{quic_port}"))
            .arg("--metrics-addr")
            .arg(format!("127.0.0.1:{}", free_tcp_port()))
            .arg("--no-kafka")
            .env("SLUICE_AUTH", "none")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn sluiced");
        Sluiced(child)
    }

    /// SIGTERM, then wait for a clean exit.
    fn stop(mut self) {
        let pid = self.0.id() as libc::pid_t;
        // SAFETY: kill(2) on the pid of a child we spawned and have not reaped yet.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            if let Some(status) = self.0.try_wait().expect("wait") {
                assert!(status.success(), "sluiced exited with {status}");
                return;
            }
            assert!(Instant::now() < deadline, "sluiced did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Sluiced {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn connect(port: u16, cert: &Path) -> Client {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        let options = ClientOptions {
            connect_timeout: Duration::from_secs(1),
            retries: 0,
            ..ClientOptions::new(Trust::PemFile(cert.to_path_buf()))
        };
        if cert.exists() {
            match Client::connect(format!("127.0.0.1:{port}").parse().expect("addr"), options).await
            {
                Ok(c) => return c,
                Err(e) => assert!(Instant::now() < deadline, "cannot connect: {e}"),
            }
        }
        assert!(Instant::now() < deadline, "no certificate appeared");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What a restart test needs: a data directory, a QUIC port kept across restarts, where the
/// broker writes its certificate, and a runtime for the client.
fn restart_case() -> (tempfile::TempDir, u16, PathBuf, tokio::runtime::Runtime) {
    let dir = tempfile::tempdir().expect("temp dir");
    let cert = dir.path().join("quic-selfsigned-cert.pem");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    (dir, free_udp_port(), cert, rt)
}

#[test]
fn acknowledged_messages_and_the_certificate_survive_a_restart() {
    let (dir, port, cert, rt) = restart_case();

    let broker = Sluiced::start(dir.path(), port);
    let pinned = rt.block_on(async {
        let c = connect(port, &cert).await;
        let q = c.create_queue("durable").await.expect("create");
        c.send(&q, "kept").await.expect("send");
        c.send(&q, "deleted").await.expect("send");
        let got = c
            .receive(&q, ReceiveOptions::long_poll(10, 2))
            .await
            .expect("receive");
        let deleted = got.iter().find(|m| m.body == "deleted").expect("received");
        c.delete(&q, &deleted.receipt_handle).await.expect("delete");
        c.close().await;
        std::fs::read(&cert).expect("certificate")
    });
    broker.stop();

    let broker = Sluiced::start(dir.path(), port);
    rt.block_on(async {
        // Trust the bytes pinned before the restart: the broker must present the same cert.
        let pinned_file = dir.path().join("pinned.pem");
        std::fs::write(&pinned_file, &pinned).expect("write");
        let c = connect(port, &pinned_file).await;
        let q = c.get_queue_url("durable").await.expect("queue survived");
        // The received-but-undeleted message is still there (visible or still leased); the
        // deleted one is gone.
        let attrs = c
            .get_queue_attributes(
                &q,
                &[
                    "ApproximateNumberOfMessages",
                    "ApproximateNumberOfMessagesNotVisible",
                ],
            )
            .await
            .expect("attributes");
        let visible: u64 = attrs["ApproximateNumberOfMessages"]
            .parse()
            .expect("number");
        let in_flight: u64 = attrs["ApproximateNumberOfMessagesNotVisible"]
            .parse()
            .expect("number");
        assert_eq!(
            visible + in_flight,
            1,
            "only the undeleted message is left: {attrs:?}"
        );
        c.close().await;
    });
    broker.stop();
}

/// A client keeps working across a restart that moved the broker cores' own endpoints (their
/// ports are picked at start): calls that went to its home core fall back to the shared
/// address, which the broker binds again, and nothing acknowledged is lost.
#[test]
fn a_client_outlives_a_restart_that_moves_the_cores_endpoints() {
    let (dir, port, cert, rt) = restart_case();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");

    let broker = Sluiced::start(dir.path(), port);
    let (client, q) = rt.block_on(async {
        connect(port, &cert).await.close().await; // up, and its certificate written
        let c = Client::connect(addr, ClientOptions::new(Trust::PemFile(cert.clone())))
            .await
            .expect("connect");
        let q = c.create_queue("moved").await.expect("create");
        c.send(&q, "before").await.expect("send");
        (c, q)
    });
    broker.stop();

    let broker = Sluiced::start(dir.path(), port);
    rt.block_on(async {
        connect(port, &cert).await.close().await;
        client
            .send(&q, "after")
            .await
            .expect("a send after the restart");
        let mut bodies = std::collections::BTreeSet::new();
        for _ in 0..20 {
            let got = client
                .receive(&q, ReceiveOptions::long_poll(10, 1))
                .await
                .expect("receive");
            for m in got {
                client.delete(&q, &m.receipt_handle).await.expect("delete");
                bodies.insert(m.body);
            }
            if bodies.len() == 2 {
                break;
            }
        }
        assert_eq!(
            bodies,
            ["after", "before"].map(String::from).into_iter().collect(),
            "both messages, from before and after the restart"
        );
        client.close().await;
    });
    broker.stop();
}

/// The fault harness skews one node's clock through the broker's clock seam
/// (`--test-clock-skew-ms`): every reader of time in the process moves with it, the engine's
/// send timestamps included. Were any path to read the system clock around the seam, a skewed
/// node would mix two clocks (broker/clippy.toml forbids it at build time; this shows the seam
/// itself moves).
#[test]
fn a_test_clock_skew_moves_the_brokers_clock() {
    const SKEW_MS: i64 = 3_600_000;
    let (dir, port, cert, rt) = restart_case();
    let broker = Sluiced::start_with(
        dir.path(),
        port,
        &["--test-clock-skew-ms", &SKEW_MS.to_string()],
    );
    rt.block_on(async {
        let c = connect(port, &cert).await;
        let q = c.create_queue("skewed").await.expect("create");
        #[allow(clippy::disallowed_methods)] // the test's own clock, to compare with the broker's
        let before_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis() as i64;
        c.send(&q, "when").await.expect("send");
        let got = c
            .receive(
                &q,
                ReceiveOptions {
                    system_attribute_names: vec!["SentTimestamp".into()],
                    ..ReceiveOptions::long_poll(1, 5)
                },
            )
            .await
            .expect("receive");
        let sent_ms: i64 = got[0].attributes["SentTimestamp"].parse().expect("ms");
        let ahead_ms = sent_ms - before_ms;
        assert!(
            (SKEW_MS - 60_000..=SKEW_MS + 60_000).contains(&ahead_ms),
            "SentTimestamp is {ahead_ms} ms ahead of the test's clock, not ~{SKEW_MS}"
        );
        c.close().await;
    });
    broker.stop();
}
