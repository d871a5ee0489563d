//! A queue on a three-node cluster of real `sluiced` processes (`sluice dev cluster`'s
//! library), served by every node and through kill -9s of its leader.
//!
//! Each round sends through every live node (a follower forwards to the leader; the answer's
//! `x-sluice-node` names who served it), receives and deletes some messages, creates a queue
//! (a metadata change), then kills the queue's leader with SIGKILL, sends again through the
//! survivors until the new leader acknowledges, and restarts the killed node. At the end every
//! node is drained. Judged from the client's side: every acknowledged send is delivered,
//! no successfully deleted message is delivered again, every created queue exists on every
//! node.
//!
//! Rounds: `SLUICE_CLUSTER_KILLS` (default [`KILLS_DEFAULT`]; the campaign runs 25+).

use serde_json::{json, Value};
use sluice_broker::cluster::dev::{self, DevCluster, DevNode};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

const SHARDS: usize = 2;
const KILLS_DEFAULT: usize = 4;
/// Messages sent per batch of sends.
const SENDS_PER_STEP: usize = 10;
/// How long one call may keep retrying retryable answers (an election is ~1.5–3 s).
const RETRY_FOR: Duration = Duration::from_secs(30);
const HTTP_TIMEOUT: Duration = Duration::from_secs(40);

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

/// Calls until a 200 (retrying connection failures and 5xx answers, as SDKs do) on the live
/// nodes in turn starting at `first`; panics on a client error or after [`RETRY_FOR`].
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
            "{action}: no success within {RETRY_FOR:?}"
        );
        i += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
}

struct Run {
    url: String,
    /// Acknowledged sends: body → the node that acknowledged it.
    acked: BTreeMap<String, u64>,
    /// Bodies delivered at least once.
    delivered: BTreeSet<String>,
    /// Message ids whose delete was acknowledged (by id: a send retried after an unknown
    /// outcome may store the same body twice, as two messages).
    deleted: BTreeSet<String>,
    next: usize,
    leader: Option<u64>,
}

impl Run {
    fn send(&mut self, live: &[&DevNode]) {
        for k in 0..SENDS_PER_STEP {
            let body = format!("m{:05}", self.next);
            self.next += 1;
            let a = call_retrying(
                live,
                k,
                "SendMessage",
                &json!({"QueueUrl": self.url, "MessageBody": body}),
            );
            self.leader = a.node;
            self.acked.insert(body, a.node.unwrap_or(0));
        }
    }

    /// One receive (up to 10) through `node`, deleting every `delete_every`-th message.
    fn receive(&mut self, live: &[&DevNode], first: usize, delete_every: usize) -> usize {
        let a = call_retrying(
            live,
            first,
            "ReceiveMessage",
            &json!({"QueueUrl": self.url, "MaxNumberOfMessages": 10,
                    "VisibilityTimeout": 2, "WaitTimeSeconds": 1}),
        );
        let msgs = a.body["Messages"].as_array().cloned().unwrap_or_default();
        for (i, m) in msgs.iter().enumerate() {
            let body = m["Body"].as_str().expect("body").to_string();
            let id = m["MessageId"].as_str().expect("id").to_string();
            assert!(
                !self.deleted.contains(&id),
                "{id} ({body}) was deleted (acknowledged) and came back"
            );
            assert!(self.acked.contains_key(&body), "{body} was never sent");
            self.delivered.insert(body.clone());
            if i % delete_every == 0 {
                let handle = m["ReceiptHandle"].as_str().expect("handle");
                // A delete answered 200 is durable; one that failed (leader died) may be
                // retried by the client, and the message may come back meanwhile.
                if let Ok(a) = call(
                    live[first % live.len()].http_addr,
                    "DeleteMessage",
                    &json!({"QueueUrl": self.url, "ReceiptHandle": handle}),
                ) {
                    if a.status == 200 {
                        self.deleted.insert(id);
                    }
                }
            }
        }
        msgs.len()
    }
}

fn kills() -> usize {
    std::env::var("SLUICE_CLUSTER_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(KILLS_DEFAULT)
}

#[test]
fn a_queue_is_served_by_every_node_through_kills_of_its_leader() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let nodes = dev::prepare(tmp.path(), 3, SHARDS).expect("prepare");
    let mut cluster =
        DevCluster::start(nodes.clone(), sluiced(), dev::READY_TIMEOUT).expect("start");
    let all: Vec<&DevNode> = nodes.iter().collect();
    let created = call_retrying(&all, 0, "CreateQueue", &json!({"QueueName": "orders"}));
    let url = created.body["QueueUrl"]
        .as_str()
        .expect("QueueUrl")
        .to_string();
    let mut run = Run {
        url,
        acked: BTreeMap::new(),
        delivered: BTreeSet::new(),
        deleted: BTreeSet::new(),
        next: 0,
        leader: None,
    };
    let mut queues = vec!["orders".to_string()];
    let mut failovers = Vec::new();
    for round in 0..kills() {
        run.send(&all);
        run.receive(&all, round + 1, 2);
        let leader = run.leader.expect("answers name their node");
        let victim = nodes
            .iter()
            .find(|n| n.identity.node == leader)
            .expect("leader is a member")
            .index;
        cluster.kill(victim);
        let killed_at = Instant::now();
        let live: Vec<&DevNode> = nodes.iter().filter(|n| n.index != victim).collect();
        run.send(&live);
        failovers.push(killed_at.elapsed());
        let name = format!("q{round}");
        call_retrying(&live, round, "CreateQueue", &json!({"QueueName": name}));
        queues.push(name);
        run.receive(&live, round, 3);
        cluster
            .restart(victim, sluiced(), dev::READY_TIMEOUT)
            .unwrap_or_else(|e| panic!("restarting node{victim}: {e}"));
        eprintln!(
            "round {round}: killed node{victim} (leader {leader}); first send acknowledged \
             {:?} after the kill",
            failovers.last().expect("one")
        );
    }
    // Drain through every node until three empty receives in a row (each waits 1 s).
    let mut empty = 0;
    let mut i = 0;
    while empty < 3 {
        let got = run.receive(&all, i, 1);
        empty = if got == 0 { empty + 1 } else { 0 };
        i += 1;
        assert!(i < 2_000, "drain did not end");
    }
    let lost: Vec<&String> = run
        .acked
        .keys()
        .filter(|b| !run.delivered.contains(*b))
        .collect();
    assert!(
        lost.is_empty(),
        "acknowledged sends never delivered: {lost:?}"
    );
    // Every node's catalog has every queue (a node restarted last may still be applying).
    for n in &nodes {
        for q in &queues {
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
    eprintln!(
        "{} sends acknowledged, {} delivered, {} deleted; failover (kill to first ack): {:?}",
        run.acked.len(),
        run.delivered.len(),
        run.deleted.len(),
        failovers
    );
    for status in cluster.stop() {
        assert!(status.expect("stopped by us").success());
    }
}
