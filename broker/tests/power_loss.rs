//! Power loss under load (issue 43): the real `sluiced` with its data dir on faultfs, clients
//! sending while the power goes. Every acknowledged send must come back.
//!
//! Each round: start sluiced (after the previous round's power loss), drain the queue (receive
//! and delete until empty) and check that every send acknowledged before the power loss came
//! back, then send from [`SENDERS`] concurrent clients, and after a seeded time cut the power
//! (a plain power off or a tear of the latest unsynced write at a seeded byte) while they are
//! still sending, then `kill -9` sluiced and power on. After the last round, one more start and
//! drain. Sends that failed or were cut off are indeterminate: they may or may not come back.
//!
//! ```sh
//! # CI: a few rounds (POWER_LOSS_ROUNDS, default 4), under a minute.
//! cargo test -p sluice-broker --test power_loss -- --nocapture
//! # The campaign: 100 rounds, 0 lost.
//! POWER_LOSS_ROUNDS=100 SLUICE_SEED=1 cargo test -p sluice-broker --test power_loss \
//!   acknowledged_sends_survive_power_loss_under_load -- --nocapture
//! # The harness's self-test: a broker that acknowledges before fsync loses sends within 20.
//! cargo test -p sluice-broker --test power_loss -- --ignored --nocapture
//! ```
//!
//! `SLUICE_SEED` picks the load times and tears (printed). Needs `/dev/fuse` and root (faultfs
//! mounts with mount(2), see faultfs/README.md); skips, saying why, where `/dev/fuse` is
//! missing.

// A test is the broker's outside world: it times the broker with its own clocks (deadlines,
// waits, latencies). broker/clippy.toml's clock seam governs the broker's code, not this.
#![allow(clippy::disallowed_methods)]

use sluice_faultfs::{Limits, Mounted};
use sluice_sdk::{Client, ClientOptions, ReceiveOptions, Trust};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const ROUNDS_DEFAULT: u64 = 4;
/// The self-test's bar (issue 43): a broker without fsync before ack loses a send within this.
const UNSAFE_ROUNDS_MAX: u64 = 20;
/// Concurrent senders, each with its own sends in flight one at a time.
const SENDERS: usize = 8;
/// Load runs this long at least before the power goes, plus a seeded part of
/// [`LOAD_SPREAD_MS`].
const LOAD_MS_MIN: u64 = 150;
const LOAD_SPREAD_MS: u64 = 600;
/// Generous: every round leaves thousands of sent and deleted messages in the queue's log,
/// which each start replays; after 99 rounds of a campaign (~520k sends) on a machine with a
/// load average of ~9, a start took over 30 s.
const READY_TIMEOUT_MS: u64 = 180_000;
const READY_POLL_MS: u64 = 50;
const REQUEST_TIMEOUT_MS: u64 = 3_000;
const CONNECT_TIMEOUT_MS: u64 = 5_000;
/// Receives in a row that find nothing before the drain stops.
const EMPTY_RECEIVES_TO_STOP: u32 = 2;
const DRAIN_WAIT_S: u32 = 1;
const RECEIVE_MAX: u32 = 10;
const QUEUE: &str = "power-loss";
/// The self-signed certificate sluiced writes into its data dir on first start.
const CERT_FILE: &str = "quic-selfsigned-cert.pem";

struct Broker {
    child: Child,
    quic: std::net::SocketAddr,
}

impl Drop for Broker {
    fn drop(&mut self) {
        // SIGKILL: the machine dies, nothing is shut down cleanly.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_broker(data: &Path, log: &Path, unsafe_no_fsync: bool) -> Broker {
    let out = std::fs::File::create(log).expect("broker log");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluiced"));
    cmd.arg("--data-dir")
        .arg(data)
        .args(["--shards", "1", "--no-kafka"])
        .args(["--http-addr", "127.0.0.1:0", "--quic-addr", "127.0.0.1:0"])
        .args(["--metrics-addr", "127.0.0.1:0"])
        .env("SLUICE_AUTH", "none")
        .env("RUST_LOG", "info")
        .stdout(out.try_clone().expect("log fd"))
        .stderr(out);
    if unsafe_no_fsync {
        cmd.arg("--test-unsafe-no-fsync-before-ack");
    }
    let mut child = cmd.spawn().expect("spawn sluiced");
    let deadline = Instant::now() + Duration::from_millis(READY_TIMEOUT_MS);
    while Instant::now() < deadline {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| l.contains("daemon: ready")) {
            let quic = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix("quic="))
                .and_then(|a| a.parse().ok())
                .unwrap_or_else(|| panic!("the ready line names the QUIC address: {line}"));
            return Broker { child, quic };
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("sluiced exited ({status}) before ready:\n{text}");
        }
        std::thread::sleep(Duration::from_millis(READY_POLL_MS));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!(
        "sluiced not ready in {READY_TIMEOUT_MS} ms:\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

async fn connect(broker: &Broker, data: &Path) -> Client {
    let options = ClientOptions {
        connect_timeout: Duration::from_millis(CONNECT_TIMEOUT_MS),
        request_timeout: Duration::from_millis(REQUEST_TIMEOUT_MS),
        // A retry after the power is gone would only wait; a send that fails is indeterminate.
        retries: 0,
        ..ClientOptions::new(Trust::PemFile(data.join(CERT_FILE)))
    };
    Client::connect(broker.quic, options)
        .await
        .expect("connect to sluiced")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// splitmix64: a round's load time and fault from the seed.
fn mix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|s| {
        s.parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, not {s:?}"))
    })
}

/// Counts of one campaign.
#[derive(Debug, Default)]
struct Tally {
    rounds: u64,
    acknowledged: usize,
    indeterminate: usize,
    lost: usize,
    /// Deleted (acknowledged) in an earlier round and delivered again: printed, not asserted
    /// here (this test checks the sends' promise).
    delivered_again: usize,
    /// The first round that lost an acknowledged send.
    first_loss_round: Option<u64>,
}

/// Receives and deletes everything in the queue; returns the bodies.
async fn drain(c: &Client, q: &str) -> BTreeSet<String> {
    let mut got = BTreeSet::new();
    let mut empty = 0;
    while empty < EMPTY_RECEIVES_TO_STOP {
        let msgs = c
            .receive(q, ReceiveOptions::long_poll(RECEIVE_MAX, DRAIN_WAIT_S))
            .await
            .expect("receive while draining");
        if msgs.is_empty() {
            empty += 1;
            continue;
        }
        let handles: Vec<String> = msgs.iter().map(|m| m.receipt_handle.clone()).collect();
        c.delete_batch(q, &handles)
            .await
            .expect("delete while draining");
        got.extend(msgs.into_iter().map(|m| m.body));
    }
    got
}

/// Sends unique bodies from [`SENDERS`] clients until `stop`; returns the acknowledged ones
/// and the count of indeterminate ones (failed or timed out).
async fn load(c: &Client, q: &str, round: u64, stop: &AtomicBool) -> (Vec<String>, usize) {
    let acked = Mutex::new(Vec::new());
    let indeterminate = Mutex::new(0usize);
    let senders = (0..SENDERS).map(|s| {
        let (acked, indeterminate) = (&acked, &indeterminate);
        async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let body = format!("r{round}-s{s}-{i}");
                i += 1;
                match c.send(q, &body).await {
                    Ok(_) => acked.lock().expect("lock").push(body),
                    Err(_) => {
                        *indeterminate.lock().expect("lock") += 1;
                        // The broker is gone (power lost, killed): nothing more to send.
                        break;
                    }
                }
            }
        }
    });
    futures::future::join_all(senders).await;
    let n = *indeterminate.lock().expect("lock");
    (acked.into_inner().expect("lock"), n)
}

/// Runs power-loss rounds; stops early at the first loss if `stop_at_first_loss`.
fn campaign(seed: u64, rounds: u64, unsafe_no_fsync: bool, stop_at_first_loss: bool) -> Tally {
    let dir = tempfile::tempdir().expect("temp dir");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mount point");
    let fs = Mounted::mount(&dir.path().join("backing"), &mnt, Limits::default()).expect("mount");
    // The data dir itself is the operator's: created and made durable before the broker starts.
    let data = mnt.join("data");
    std::fs::create_dir(&data).expect("data dir");
    std::fs::File::open(&mnt)
        .and_then(|d| d.sync_all())
        .expect("fsync mount root");

    let mut tally = Tally::default();
    let mut pending: BTreeSet<String> = BTreeSet::new();
    let mut deleted: BTreeSet<String> = BTreeSet::new();
    for round in 0..=rounds {
        let log = dir.path().join(format!("sluiced-{round}.log"));
        let broker = start_broker(&data, &log, unsafe_no_fsync);
        let rt = runtime();
        let (client, q) = rt.block_on(async {
            let c = connect(&broker, &data).await;
            // A queue lost with the power would be created again here and found empty: the
            // check below counts its messages lost.
            let q = c.create_queue(QUEUE).await.expect("create queue");
            (c, q)
        });
        let got = rt.block_on(drain(&client, &q));
        if round > 0 {
            let lost: Vec<&String> = pending.difference(&got).collect();
            let again = got.intersection(&deleted).count();
            eprintln!(
                "round {}: acknowledged {}, received {}, lost {}, delivered again {again}{}",
                round - 1,
                pending.len(),
                got.len(),
                lost.len(),
                if lost.is_empty() {
                    String::new()
                } else {
                    format!(
                        " (e.g. {:?}; broker logs in {})",
                        &lost[..lost.len().min(5)],
                        dir.path().display()
                    )
                }
            );
            tally.lost += lost.len();
            tally.delivered_again += again;
            if !lost.is_empty() && tally.first_loss_round.is_none() {
                tally.first_loss_round = Some(round - 1);
            }
            tally.rounds = round;
        }
        pending.clear();
        deleted.extend(got);
        if round == rounds || (stop_at_first_loss && tally.first_loss_round.is_some()) {
            drop(broker);
            break;
        }

        // Load, and the power goes while it runs.
        let fault = mix(seed ^ round);
        let load_ms = LOAD_MS_MIN + fault % LOAD_SPREAD_MS;
        let stop = Arc::new(AtomicBool::new(false));
        let sender = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let out = rt.block_on(load(&client, &q, round, &stop));
                drop(client);
                out
            })
        };
        std::thread::sleep(Duration::from_millis(load_ms));
        let report = if (fault >> 32).is_multiple_of(2) {
            fs.power_off()
        } else {
            fs.power_off_torn(fault)
        }
        .expect("power off");
        // The machine is dead: the broker with it, the clients see their calls fail.
        drop(broker);
        stop.store(true, Ordering::Relaxed);
        let (acked, indeterminate) = sender.join().expect("load thread");
        fs.power_on();
        eprintln!(
            "round {round}: {load_ms} ms of load, acknowledged {}, indeterminate {indeterminate}, \
             {report:?}",
            acked.len()
        );
        tally.acknowledged += acked.len();
        tally.indeterminate += indeterminate;
        pending.extend(acked);
    }
    fs.unmount();
    tally
}

#[allow(clippy::disallowed_methods)] // a random seed for the test, not the broker's time
fn seed() -> u64 {
    env_u64("SLUICE_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    })
}

/// Issue 43's bar (with `POWER_LOSS_ROUNDS=100`): power-loss rounds under load, 0 acknowledged
/// sends lost. Failed before the storage log fsynced the directories it creates: the first
/// power loss took the queue's directory and every acknowledged send.
#[test]
fn acknowledged_sends_survive_power_loss_under_load() {
    if !sluice_faultfs::fuse_available() {
        eprintln!("skipped: /dev/fuse is missing, faultfs cannot mount here");
        return;
    }
    let seed = seed();
    let rounds = env_u64("POWER_LOSS_ROUNDS").unwrap_or(ROUNDS_DEFAULT);
    eprintln!("SLUICE_SEED={seed} POWER_LOSS_ROUNDS={rounds}");
    let started = Instant::now();
    let tally = campaign(seed, rounds, false, false);
    eprintln!(
        "SLUICE_SEED={seed}: {tally:?} in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        tally.acknowledged > 0,
        "no send was acknowledged: the harness tested nothing"
    );
    assert_eq!(
        tally.lost, 0,
        "acknowledged sends lost over {rounds} power-loss rounds (SLUICE_SEED={seed})"
    );
}

/// The harness's self-test: with fsync before ack turned off (`sluiced
/// --test-unsafe-no-fsync-before-ack`), an acknowledged send is lost within
/// [`UNSAFE_ROUNDS_MAX`] rounds — else the harness is not testing power loss.
#[test]
#[ignore = "long (up to 20 rounds); run with --ignored"]
fn a_broker_that_acknowledges_before_fsync_is_caught() {
    if !sluice_faultfs::fuse_available() {
        eprintln!("skipped: /dev/fuse is missing, faultfs cannot mount here");
        return;
    }
    let seed = seed();
    eprintln!("SLUICE_SEED={seed}");
    let tally = campaign(seed, UNSAFE_ROUNDS_MAX, true, true);
    eprintln!("SLUICE_SEED={seed}: {tally:?}");
    assert!(
        tally.lost > 0,
        "no acknowledged send lost in {UNSAFE_ROUNDS_MAX} rounds without fsync before ack: the \
         harness does not test power loss (SLUICE_SEED={seed})"
    );
}
