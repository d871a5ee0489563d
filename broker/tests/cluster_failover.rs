//! Queues on a three-node cluster of real `sluiced` processes (`sluice dev cluster`'s
//! library), served by every node and through kill -9s of their leaders, judged by the
//! history checker (`sluice-checker`) from the client's side.
//!
//! Each round sends to a standard and a FIFO queue through every live node (a follower
//! forwards to the leader; an answer's `x-sluice-node` names who served it), receives some
//! messages and holds their leases, kills one queue's leader with SIGKILL (the two queues in
//! turn), sends again through the survivors until the new leader acknowledges, receives and
//! deletes while the held leases still run, creates a queue (a metadata change), restarts the
//! killed node and deletes the held messages with their old receipts. At the end every queue is
//! drained. Every call attempt is one operation in the history; a 5xx or a lost connection is
//! indeterminate. The checker finds acknowledged sends never delivered, a message leased twice
//! inside its window, a deleted message delivered again, FIFO order broken, a duplicate inside
//! the dedup window; every created queue must be known on every node.
//!
//! Rounds: `SLUICE_CLUSTER_KILLS` (default [`KILLS_DEFAULT`]; the campaign runs 25+).
// The test times the cluster from outside (retry deadlines, failover times, history times).
#![allow(clippy::disallowed_methods)]

use serde_json::{json, Value};
use sluice_broker::cluster::dev::{self, DevCluster, DevNode};
use sluice_checker::{Call, Delivered, Event, Outcome, Reply};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

const SHARDS: usize = 2;
const KILLS_DEFAULT: usize = 4;
/// Messages sent per queue per batch of sends.
const SENDS_PER_STEP: usize = 6;
/// FIFO message groups.
const GROUPS: usize = 3;
/// How long one logical call may keep retrying retryable answers (an election is ~1.5–3 s).
const RETRY_FOR: Duration = Duration::from_secs(30);
const HTTP_TIMEOUT: Duration = Duration::from_secs(40);
/// The leases held across a kill, s: longer than a failover, so receives after it fall inside.
const HELD_VISIBILITY_S: u64 = 8;
/// The leases of receives that delete at once, s.
const SHORT_VISIBILITY_S: u64 = 2;

fn sluiced() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_sluiced"))
}

struct Answer {
    status: u16,
    node: Option<u64>,
    body: Value,
}

/// One SQS JSON call to `addr`.
fn call(addr: SocketAddr, action: &str, input: &Value) -> std::io::Result<Answer> {
    let body = input.to_string();
    let mut s = std::net::TcpStream::connect_timeout(&addr, HTTP_TIMEOUT)?;
    s.set_read_timeout(Some(HTTP_TIMEOUT))?;
    s.set_write_timeout(Some(HTTP_TIMEOUT))?;
    write!(
        s,
        "POST / HTTP/1.1\r\nhost: {addr}\r\nx-amz-target: AmazonSQS.{action}\r\n\
         content-type: application/x-amz-json-1.0\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no end of headers"))?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other("no status"))?;
    let node = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("x-sluice-node")
            .then(|| v.trim().parse().ok())?
    });
    let body = serde_json::from_str(body).unwrap_or(Value::Null);
    Ok(Answer { status, node, body })
}

/// Calls (unrecorded) until a 200 on the live nodes in turn from `first`, retrying connection
/// failures and 5xx answers as SDKs do; panics on a client error or after [`RETRY_FOR`].
fn call_retrying(nodes: &[&DevNode], first: usize, action: &str, input: &Value) -> Answer {
    let deadline = Instant::now() + RETRY_FOR;
    let mut i = first;
    loop {
        let n = nodes[i % nodes.len()];
        match call(n.http_addr, action, input) {
            Ok(a) if a.status == 200 => return a,
            Ok(a) if a.status < 500 => {
                panic!("{action} on node{}: {} {}", n.index, a.status, a.body)
            }
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "{action}: no success within {RETRY_FOR:?}\n{}",
            log_tails(nodes)
        );
        i += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
}

struct Queue {
    name: String,
    url: String,
    fifo: bool,
}

/// A message a receive returned: (message id, receipt handle).
type Held = (String, String);

/// The client: its calls, recorded as a history.
struct Client {
    events: Vec<Event>,
    next_op: u64,
    t0: Instant,
    next_payload: usize,
    /// The node that acknowledged the last send to each queue (its leader then).
    leaders: Vec<Option<u64>>,
}

impl Client {
    fn time_us(&self) -> u64 {
        self.t0.elapsed().as_micros() as u64
    }

    /// One recorded attempt of `action` on `node`.
    fn attempt(
        &mut self,
        node: &DevNode,
        action: &str,
        input: &Value,
        what: Call,
        reply: impl FnOnce(&Value) -> Reply,
    ) -> Option<Answer> {
        let op = self.next_op;
        self.next_op += 1;
        self.events.push(Event::Invoke {
            op,
            process: "client".into(),
            time_us: self.time_us(),
            call: what,
        });
        let answer = call(node.http_addr, action, input);
        let time_us = self.time_us();
        let (outcome, result, error) = match &answer {
            Ok(a) if a.status == 200 => (Outcome::Ok, Some(reply(&a.body)), None),
            Ok(a) if a.status < 500 => (Outcome::Fail, None, Some(a.body.to_string())),
            // A 503 may be "the leader died after proposing": it may still happen.
            Ok(a) => (Outcome::Info, None, Some(a.body.to_string())),
            Err(e) => (Outcome::Info, None, Some(e.to_string())),
        };
        self.events.push(Event::Complete {
            op,
            time_us,
            outcome,
            result,
            error,
        });
        answer.ok().filter(|a| a.status == 200)
    }

    /// Sends `SENDS_PER_STEP` messages to queue `qi`, each retried through the live nodes
    /// until acknowledged (a retry sends the same body and, on FIFO, the same dedup id).
    fn send(&mut self, queues: &[Queue], qi: usize, live: &[&DevNode]) {
        let q = &queues[qi];
        for k in 0..SENDS_PER_STEP {
            let payload = format!("m{:05}", self.next_payload);
            self.next_payload += 1;
            let group = q.fifo.then(|| format!("g{}", k % GROUPS));
            let mut input = json!({"QueueUrl": q.url, "MessageBody": payload});
            if let Some(g) = &group {
                input["MessageGroupId"] = json!(g);
                input["MessageDeduplicationId"] = json!(payload);
            }
            let deadline = Instant::now() + RETRY_FOR;
            let mut i = k;
            loop {
                let what = Call::Send {
                    queue: q.name.clone(),
                    payload: payload.clone(),
                    group: group.clone(),
                    dedup: q.fifo.then(|| payload.clone()),
                    content_dedup: false,
                    dedup_per_group: false,
                };
                let node = live[i % live.len()];
                let got = self.attempt(node, "SendMessage", &input, what, |b| Reply::Send {
                    message_id: b["MessageId"].as_str().unwrap_or_default().to_string(),
                });
                if let Some(a) = got {
                    self.leaders[qi] = a.node;
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "send to {}: no ack within {RETRY_FOR:?}\n{}",
                    q.name,
                    log_tails(live)
                );
                i += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// One receive of up to ten from queue `q` through `node`; `None` if it failed.
    fn receive(&mut self, q: &Queue, node: &DevNode, visibility_s: u64) -> Option<Vec<Held>> {
        let input = json!({"QueueUrl": q.url, "MaxNumberOfMessages": 10,
            "VisibilityTimeout": visibility_s, "WaitTimeSeconds": 1,
            "MessageSystemAttributeNames": ["MessageGroupId"]});
        let what = Call::Receive {
            queue: q.name.clone(),
            visibility_timeout_ms: visibility_s * 1000,
        };
        let got = self.attempt(node, "ReceiveMessage", &input, what, |b| Reply::Receive {
            messages: messages(b)
                .iter()
                .map(|m| Delivered {
                    message_id: m["MessageId"].as_str().unwrap_or_default().to_string(),
                    payload: m["Body"].as_str().unwrap_or_default().to_string(),
                    receipt: m["ReceiptHandle"].as_str().unwrap_or_default().to_string(),
                    receive_count: None,
                    group: m["Attributes"]["MessageGroupId"]
                        .as_str()
                        .map(str::to_string),
                })
                .collect(),
        });
        got.map(|a| {
            messages(&a.body)
                .iter()
                .map(|m| {
                    (
                        m["MessageId"].as_str().unwrap_or_default().to_string(),
                        m["ReceiptHandle"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect()
        })
    }

    fn delete(&mut self, q: &Queue, node: &DevNode, (id, receipt): Held) {
        let input = json!({"QueueUrl": q.url, "ReceiptHandle": receipt});
        let what = Call::Delete {
            queue: q.name.clone(),
            message_id: id,
            receipt: Some(receipt),
        };
        self.attempt(node, "DeleteMessage", &input, what, |_| Reply::Delete {});
    }
}

/// The end of every node's log, for a failure's message.
fn log_tails(nodes: &[&DevNode]) -> String {
    let mut out = String::new();
    for n in nodes {
        let text = std::fs::read_to_string(&n.log_path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        out.push_str(&format!("--- node{} ({})\n", n.index, n.log_path.display()));
        out.push_str(&lines[lines.len().saturating_sub(40)..].join("\n"));
        out.push('\n');
    }
    out
}

fn messages(body: &Value) -> Vec<Value> {
    body["Messages"].as_array().cloned().unwrap_or_default()
}

fn kills() -> usize {
    std::env::var("SLUICE_CLUSTER_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(KILLS_DEFAULT)
}

/// A rolling restart: each node in turn stopped with SIGTERM and started again, while a client
/// sends and receives through the nodes that run. It sees nothing but retryable answers (a 503
/// or a refused connection) and the checker finds nothing.
#[test]
fn a_rolling_restart_under_load_shows_clients_only_retryable_errors() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let nodes = dev::prepare(tmp.path(), 3, SHARDS).expect("prepare");
    let mut cluster =
        DevCluster::start(nodes.clone(), sluiced(), dev::READY_TIMEOUT).expect("start");
    let all: Vec<&DevNode> = nodes.iter().collect();
    let created = call_retrying(&all, 0, "CreateQueue", &json!({"QueueName": "rolling"}));
    let queues = vec![Queue {
        name: "rolling".into(),
        url: created.body["QueueUrl"]
            .as_str()
            .expect("QueueUrl")
            .to_string(),
        fifo: false,
    }];
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let stop = stop.clone();
        let nodes = nodes.clone();
        std::thread::spawn(move || {
            let all: Vec<&DevNode> = nodes.iter().collect();
            let mut client = Client {
                events: Vec::new(),
                next_op: 1,
                t0: Instant::now(),
                next_payload: 0,
                leaders: vec![None],
            };
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                client.send(&queues, 0, &all);
                let node = all[i % all.len()];
                for h in client
                    .receive(&queues[0], node, SHORT_VISIBILITY_S)
                    .unwrap_or_default()
                {
                    client.delete(&queues[0], node, h);
                }
                i += 1;
            }
            client.events.push(Event::Drain {
                time_us: client.time_us(),
            });
            std::thread::sleep(Duration::from_secs(SHORT_VISIBILITY_S + 1));
            let mut empty = 0;
            let mut i = 0;
            while empty < 3 && i < 200 {
                let node = all[i % all.len()];
                let got = client.receive(&queues[0], node, SHORT_VISIBILITY_S);
                empty = match &got {
                    Some(g) if g.is_empty() => empty + 1,
                    Some(_) => 0,
                    None => empty,
                };
                for h in got.unwrap_or_default() {
                    client.delete(&queues[0], node, h);
                }
                i += 1;
            }
            client.events
        })
    };
    for n in &nodes {
        std::thread::sleep(Duration::from_secs(2));
        let status = cluster.terminate(n.index).expect("running");
        assert!(status.success(), "node{} stopped with {status}", n.index);
        cluster
            .restart(n.index, sluiced(), dev::READY_TIMEOUT)
            .unwrap_or_else(|e| panic!("restarting node{}: {e}", n.index));
    }
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let events = load.join().expect("load thread");
    let refused: Vec<&Event> = events
        .iter()
        .filter(|e| {
            matches!(
                e,
                Event::Complete {
                    outcome: Outcome::Fail,
                    ..
                }
            )
        })
        .collect();
    assert!(
        refused.is_empty(),
        "clients saw non-retryable errors during a rolling restart: {refused:?}"
    );
    let history = sluice_checker::History::from_events(events).expect("history");
    let report = sluice_checker::check(&history, &sluice_checker::Config::default());
    eprintln!("rolling restart: operations {:?}", report.operations);
    if report.verdict != sluice_checker::Verdict::Pass {
        let kept = tmp.keep();
        panic!(
            "{}\nthe cluster's dir is kept at {}\n{}",
            report.to_text(),
            kept.display(),
            log_tails(&all)
        );
    }
    for status in cluster.stop() {
        assert!(status.expect("stopped by us").success());
    }
}

#[test]
fn queues_are_served_by_every_node_through_kills_of_their_leaders() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // Kept when the test fails (the nodes' logs and data): see the message.
    let nodes = dev::prepare(tmp.path(), 3, SHARDS).expect("prepare");
    let mut cluster =
        DevCluster::start(nodes.clone(), sluiced(), dev::READY_TIMEOUT).expect("start");
    let all: Vec<&DevNode> = nodes.iter().collect();
    let mut queues = Vec::new();
    for (name, fifo) in [("orders", false), ("orders.fifo", true)] {
        let mut input = json!({"QueueName": name});
        if fifo {
            input["Attributes"] = json!({"FifoQueue": "true"});
        }
        let created = call_retrying(&all, queues.len(), "CreateQueue", &input);
        let url = created.body["QueueUrl"]
            .as_str()
            .expect("QueueUrl")
            .to_string();
        queues.push(Queue {
            name: name.to_string(),
            url,
            fifo,
        });
    }
    let mut client = Client {
        events: Vec::new(),
        next_op: 1,
        t0: Instant::now(),
        next_payload: 0,
        leaders: vec![None; queues.len()],
    };
    let mut created = Vec::new();
    let mut failovers = Vec::new();
    for round in 0..kills() {
        for qi in 0..queues.len() {
            client.send(&queues, qi, &all);
        }
        // Leases held across the kill.
        let mut held: Vec<(usize, Held)> = Vec::new();
        for (qi, q) in queues.iter().enumerate() {
            let node = all[round % all.len()];
            for h in client
                .receive(q, node, HELD_VISIBILITY_S)
                .unwrap_or_default()
            {
                held.push((qi, h));
            }
        }
        let target = round % queues.len();
        let leader = client.leaders[target].expect("answers name their node");
        let victim = nodes
            .iter()
            .find(|n| n.identity.node == leader)
            .expect("leader is a member")
            .index;
        cluster.kill(victim);
        let killed_at = Instant::now();
        let live: Vec<&DevNode> = nodes.iter().filter(|n| n.index != victim).collect();
        client.send(&queues, target, &live);
        failovers.push(killed_at.elapsed());
        client.send(&queues, 1 - target, &live);
        // Inside the held leases: receive and delete what is visible.
        for (i, q) in queues.iter().enumerate() {
            let node = live[(round + i) % live.len()];
            for h in client
                .receive(q, node, SHORT_VISIBILITY_S)
                .unwrap_or_default()
            {
                client.delete(q, node, h);
            }
        }
        let name = format!("q{round}");
        call_retrying(&live, round, "CreateQueue", &json!({"QueueName": name}));
        created.push(name);
        cluster
            .restart(victim, sluiced(), dev::READY_TIMEOUT)
            .unwrap_or_else(|e| panic!("restarting node{victim}: {e}"));
        // The held messages, deleted with receipts a leader before the kill signed.
        for (qi, h) in held {
            let node = all[(round + qi) % all.len()];
            client.delete(&queues[qi], node, h);
        }
        eprintln!(
            "round {round}: killed node{victim} (leader of {}); first send acknowledged {:?} \
             after the kill",
            queues[target].name,
            failovers.last().expect("one")
        );
    }
    // The final drain, after every lease has run out.
    client.events.push(Event::Drain {
        time_us: client.time_us(),
    });
    std::thread::sleep(Duration::from_secs(HELD_VISIBILITY_S + 1));
    for q in &queues {
        let mut empty = 0;
        let mut i = 0;
        while empty < 3 {
            let node = all[i % all.len()];
            let got = client.receive(q, node, SHORT_VISIBILITY_S);
            empty = match &got {
                Some(g) if g.is_empty() => empty + 1,
                Some(_) => 0,
                None => empty,
            };
            for h in got.unwrap_or_default() {
                client.delete(q, node, h);
            }
            i += 1;
            assert!(
                i < 200,
                "drain of {} did not end\n{}",
                q.name,
                log_tails(&all)
            );
        }
    }
    // Every node's catalog has every queue (a node restarted last may still be applying).
    for n in &nodes {
        for q in &created {
            let deadline = Instant::now() + RETRY_FOR;
            loop {
                let a = call(n.http_addr, "GetQueueUrl", &json!({"QueueName": q})).expect("call");
                if a.status == 200 {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{q} on node{}: {} {}",
                    n.index,
                    a.status,
                    a.body
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
    let history = sluice_checker::History::from_events(client.events).expect("history");
    let report = sluice_checker::check(&history, &sluice_checker::Config::default());
    eprintln!(
        "operations {:?}; failover (kill to first ack): {failovers:?}",
        report.operations
    );
    if report.verdict != sluice_checker::Verdict::Pass {
        let kept = tmp.keep();
        panic!(
            "{}\nthe cluster's dir (logs, data) is kept at {}\n{}",
            report.to_text(),
            kept.display(),
            log_tails(&all)
        );
    }
    // The replication series: some node leads, commits were counted, leaders changed.
    let sum = |name: &str| -> f64 {
        nodes
            .iter()
            .filter_map(|n| dev::http_get(n.metrics_addr, "/metrics").ok())
            .flat_map(|(_, body)| {
                body.lines()
                    .filter(|l| l.starts_with(&format!("{name}{{")))
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .collect::<Vec<_>>()
            })
            .sum()
    };
    assert!(
        sum("sluice_raft_leaders") >= 3.0,
        "metadata and two queues led"
    );
    assert!(sum("sluice_raft_commit_seconds_count") > 0.0);
    assert!(sum("sluice_raft_leader_changes_total") > 0.0);
    for status in cluster.stop() {
        assert!(status.expect("stopped by us").success());
    }
}
