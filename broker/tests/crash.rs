//! Crash test of the broker: a child process runs the broker (2 shards, real files) with
//! producers and consumers on every shard, printing each acknowledgement as it is given; it is
//! killed with SIGKILL at a random moment. The parent restarts the broker on the same data and
//! checks CONTRACT.md C1–C5 against what the clients were told:
//! 1. every acknowledged send is there (or was deleted by an acknowledged delete);
//! 2. an acknowledged delete is never delivered again;
//! 3. FIFO: per group, delivery in send order, nothing while an earlier message is in flight;
//! 4. dedup: re-sending an acknowledged dedup id returns the original MessageId;
//! 5. receive counts survive (and so do maxReceiveCount and the DLQ, tested in `service.rs`).
//!
//! Seeded (`SLUICE_SEED`); the seed is printed on failure.

// A test is the broker's outside world: it times the broker with its own clocks (deadlines,
// waits, latencies). broker/clippy.toml's clock seam governs the broker's code, not this.
#![allow(clippy::disallowed_methods)]

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sluice_broker::config::BrokerConfig;
use sluice_broker::engine::{ReceiveRequest, SendRequest};
use sluice_broker::metadata::DEFAULT_TENANT as T;
use sluice_broker::server::{self, BrokerHandle};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const GROUPS: u64 = 4;
/// Short leases so that messages in flight at the crash come back quickly after restart.
const VISIBILITY_S: u32 = 2;
/// Consumer tasks in the child (4 per shard), each with at most one delete outstanding.
const CONSUMERS: usize = 8;
/// Sends per producer task and round (8 producers).
const SENDS_PER_PRODUCER: u64 = 400;

fn config(dir: &Path) -> BrokerConfig {
    let mut c = BrokerConfig::ephemeral(dir.to_path_buf()).expect("config");
    c.shards = 2;
    c.default_partitions = 2;
    c
}

fn out(line: String) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{line}");
    let _ = o.flush();
}

/// The child: a broker under load that tells the world every acknowledgement it gets.
#[test]
#[ignore = "run by broker_survives_kill_9 as a child process"]
fn crash_child() {
    let Ok(dir) = std::env::var("SLUICE_CRASH_DIR") else {
        return;
    };
    let round: u64 = std::env::var("SLUICE_CRASH_ROUND")
        .expect("round")
        .parse()
        .expect("round");
    let b = std::sync::Arc::new(server::start(config(Path::new(&dir))).expect("start"));
    b.wait_ready().expect("ready");
    b.run_on(0, |s| async move {
        for name in ["std", "jobs.fifo"] {
            let mut attrs = BTreeMap::new();
            if name.ends_with(".fifo") {
                attrs.insert("FifoQueue".to_string(), "true".to_string());
            }
            s.create_queue(T, name, attrs, BTreeMap::new())
                .await
                .expect("create");
        }
    });
    let threads: Vec<_> = (0..2usize)
        .map(|shard| {
            let b = b.clone();
            std::thread::spawn(move || {
                b.run_on(shard, move |s| async move {
                    let mut tasks = Vec::new();
                    for t in 0..4u64 {
                        let sp = s.clone();
                        // Producers.
                        tasks.push(glommio::spawn_local(async move {
                            let s = sp;
                            // Bounded, so that the parent's drain stays short.
                            for n in 0..SENDS_PER_PRODUCER {
                                let fifo = n % 2 == 0;
                                let name = if fifo { "jobs.fifo" } else { "std" };
                                let body = format!("r{round}-s{shard}-t{t}-n{n}");
                                let group = fifo.then(|| format!("g{}", n % GROUPS));
                                let q = s.queue(T, name).expect("q");
                                let req = SendRequest {
                                    body: body.clone(),
                                    attributes: Vec::new(),
                                    delay_s: None,
                                    dedup_id: group.as_ref().map(|_| body.clone()),
                                    group_id: group.clone(),
                                };
                                if let Ok(r) = s.send(&q, req).await {
                                    out(format!(
                                        "SENT {name} {body} {} {}",
                                        r.message_id,
                                        group.unwrap_or_default()
                                    ));
                                }
                            }
                        }));
                        // Consumers: delete most, release some, abandon a few.
                        let s = s.clone();
                        tasks.push(glommio::spawn_local(async move {
                            let mut rng =
                                SmallRng::seed_from_u64(round * 100 + shard as u64 * 10 + t);
                            loop {
                                for name in ["std", "jobs.fifo"] {
                                    let q = s.queue(T, name).expect("q");
                                    let req = ReceiveRequest {
                                        max_messages: 5,
                                        visibility_timeout_s: Some(VISIBILITY_S),
                                        attempt_id: None,
                                    };
                                    let Ok(got) = s.receive(&q, req, 0).await else {
                                        continue;
                                    };
                                    for d in got {
                                        out(format!(
                                            "RECV {name} {} {}",
                                            d.payload.body, d.receive_count
                                        ));
                                        let h = s.receipt_handle(&d.receipt);
                                        let roll = rng.gen_range(0..10);
                                        if roll <= 6 {
                                            if s.delete_message(&q, &h).await.is_ok() {
                                                out(format!("DEL {name} {}", d.payload.body));
                                            }
                                        } else if roll <= 8 {
                                            let _ = s.change_visibility(&q, &h, 0).await;
                                        }
                                    }
                                }
                                glommio::timer::sleep(Duration::from_millis(1)).await;
                            }
                        }));
                    }
                    for t in tasks {
                        t.await;
                    }
                })
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
}

#[derive(Default)]
struct Told {
    /// body → (queue, message id, group)
    sent: HashMap<String, (String, String, String)>,
    deleted: HashSet<String>,
    /// body → highest receive count a consumer was told
    received: HashMap<String, u32>,
}

fn parse(lines: &[String], told: &mut Told) {
    for l in lines {
        let p: Vec<&str> = l.split(' ').collect();
        match p.as_slice() {
            ["SENT", q, body, id, group] => {
                told.sent.insert(
                    body.to_string(),
                    (q.to_string(), id.to_string(), group.to_string()),
                );
            }
            ["SENT", q, body, id] => {
                told.sent.insert(
                    body.to_string(),
                    (q.to_string(), id.to_string(), String::new()),
                );
            }
            ["DEL", _, body] => {
                told.deleted.insert(body.to_string());
            }
            ["RECV", _, body, rc] => {
                let rc: u32 = rc.parse().expect("count");
                let e = told.received.entry(body.to_string()).or_default();
                *e = (*e).max(rc);
            }
            _ => {}
        }
    }
}

/// Restarts the broker and checks everything the clients were told; drains the queues.
fn verify(dir: &Path, told: &Told) {
    let b: BrokerHandle = server::start(config(dir)).expect("restart");
    b.wait_ready().expect("ready after crash");
    let sent: Vec<(String, (String, String, String))> = told
        .sent
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let deleted = told.deleted.clone();
    let received = told.received.clone();
    b.run_on(0, move |s| async move {
        let mut drained: HashMap<String, u32> = HashMap::new();
        let mut last_seq_per_group: HashMap<String, u64> = HashMap::new();
        // Leases given before the crash end at most VISIBILITY_S after it.
        let deadline = Instant::now() + Duration::from_secs(u64::from(VISIBILITY_S) + 1);
        let mut empty_after_deadline = 0;
        while empty_after_deadline < 2 {
            let mut got_any = false;
            for name in ["std", "jobs.fifo"] {
                let q = s.queue(T, name).expect("queue survives");
                let req = ReceiveRequest {
                    max_messages: 10,
                    visibility_timeout_s: Some(60),
                    attempt_id: None,
                };
                let wait_s = u32::from(Instant::now() > deadline);
                let got = s.receive(&q, req, wait_s).await.expect("receive");
                let mut handles = Vec::new();
                for d in got {
                    got_any = true;
                    let body = d.payload.body.clone();
                    // 2. Deleted messages never come back.
                    assert!(
                        !deleted.contains(&body),
                        "deleted message {body} delivered again"
                    );
                    // 5. Receive counts survive the restart.
                    let told_rc = received.get(&body).copied().unwrap_or(0);
                    assert!(
                        d.receive_count > told_rc,
                        "{body}: receive count {} after restart, clients were told {told_rc}",
                        d.receive_count
                    );
                    // 3. FIFO order per group (one consumer, deleting as it goes).
                    if let (Some(g), Some(seq)) = (&d.payload.group_id, d.sequence_number) {
                        if let Some(last) = last_seq_per_group.insert(g.clone(), seq) {
                            assert!(seq > last, "group {g}: sequence {seq} after {last}");
                        }
                    }
                    drained.insert(body, d.receive_count);
                    handles.push(s.receipt_handle(&d.receipt));
                }
                for r in s.delete_message_batch(&q, handles).await {
                    r.expect("delete");
                }
            }
            if !got_any {
                if Instant::now() > deadline {
                    empty_after_deadline += 1;
                } else {
                    glommio::timer::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        // 1. Every acknowledged send is there, unless it was deleted. A delete that took effect
        // but whose acknowledgement the crash swallowed is allowed, and only for a message a
        // consumer had received; each consumer has at most one delete outstanding.
        let mut unacked_deletes = Vec::new();
        for (body, (name, _, _)) in &sent {
            if deleted.contains(body) || drained.contains_key(body) {
                continue;
            }
            if received.contains_key(body) {
                unacked_deletes.push(body.clone());
                continue;
            }
            let q = s.queue(T, name).expect("q");
            let c = s.queue_counters(&q).await.expect("counters");
            panic!("acknowledged message {body}, never received, lost (queue {name} now: {c:?})");
        }
        assert!(
            unacked_deletes.len() <= CONSUMERS,
            "{} received messages gone without an acknowledged delete, more than the {CONSUMERS} \
             deletes that can be outstanding: {unacked_deletes:?}",
            unacked_deletes.len()
        );
        // 4. Dedup across the restart: the same dedup id returns the original MessageId.
        let q = s.queue(T, "jobs.fifo").expect("q");
        for (body, (_, id, group)) in sent
            .iter()
            .filter(|(_, (q, _, _))| q == "jobs.fifo")
            .take(20)
        {
            let r = s
                .send(
                    &q,
                    SendRequest {
                        body: body.clone(),
                        attributes: Vec::new(),
                        delay_s: None,
                        dedup_id: Some(body.clone()),
                        group_id: Some(group.clone()),
                    },
                )
                .await
                .expect("resend");
            assert!(r.duplicate, "{body}: dedup forgotten after restart");
            assert_eq!(
                &r.message_id.to_string(),
                id,
                "{body}: dedup returned another MessageId"
            );
        }
        drained.len()
    });
    b.shutdown();
}

#[test]
fn broker_survives_kill_9() {
    let seed: u64 = std::env::var("SLUICE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let result = std::panic::catch_unwind(|| {
        let mut rng = SmallRng::seed_from_u64(seed);
        let tmp = tempfile::tempdir().expect("tmp");
        let mut total_sent = 0;
        for round in 0..3u64 {
            let mut child = Command::new(std::env::current_exe().expect("exe"))
                .args([
                    "--exact",
                    "crash_child",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("SLUICE_CRASH_DIR", tmp.path())
                .env("SLUICE_CRASH_ROUND", round.to_string())
                .env("RUST_LOG", "off")
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn child");
            let stdout = child.stdout.take().expect("stdout");
            let reader = std::thread::spawn(move || {
                BufReader::new(stdout)
                    .lines()
                    .map_while(Result::ok)
                    .collect::<Vec<_>>()
            });
            std::thread::sleep(Duration::from_millis(rng.gen_range(800..2500)));
            child.kill().expect("SIGKILL");
            child.wait().expect("wait");
            let lines = reader.join().expect("reader");
            let mut told = Told::default();
            parse(&lines, &mut told);
            total_sent += told.sent.len();
            verify(tmp.path(), &told);
        }
        assert!(
            total_sent > 100,
            "only {total_sent} sends acknowledged in all rounds"
        );
    });
    if let Err(e) = result {
        eprintln!("\n*** broker_survives_kill_9 failed with seed {seed}: rerun with SLUICE_SEED={seed} ***\n");
        std::panic::resume_unwind(e);
    }
}
