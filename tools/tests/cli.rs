//! The real `sluice` binary against a real broker (in-process, on loopback ephemeral ports):
//! every command, JSON output parsed and checked, exit codes; `log verify` on a real data dir
//! and on one with a flipped byte.

use serde_json::Value;
use sluice_broker::config::BrokerConfig;
use sluice_broker::server::{self, BrokerHandle};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Bound on every CLI call (it has its own timeouts; this catches a hang).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

struct Broker {
    handle: Option<BrokerHandle>,
    dir: PathBuf,
}

impl Broker {
    fn start(dir: &Path) -> Broker {
        let mut c = BrokerConfig::ephemeral(dir.to_path_buf()).expect("config");
        c.shards = 2;
        c.default_partitions = 2;
        c.http_addr = "127.0.0.1:0".parse().expect("addr");
        c.quic_addr = "127.0.0.1:0".parse().expect("addr");
        c.metrics_addr = "127.0.0.1:0".parse().expect("addr");
        c.kafka_addr = None;
        let b = server::start(c).expect("start");
        b.wait_ready().expect("ready");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(b.config.http_addr).is_err() {
            assert!(Instant::now() < deadline, "HTTP API did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
        Broker {
            handle: Some(b),
            dir: dir.to_path_buf(),
        }
    }

    /// The connection flags for this broker.
    fn flags(&self) -> Vec<String> {
        let c = &self.handle.as_ref().expect("running").config;
        vec![
            "--endpoint".into(),
            c.quic_addr.to_string(),
            "--ca-cert".into(),
            self.dir
                .join("quic-selfsigned-cert.pem")
                .display()
                .to_string(),
            "--timeout-ms".into(),
            "5000".into(),
        ]
    }

    fn run(&self, args: &[&str]) -> Output {
        let mut all: Vec<String> = self.flags();
        all.extend(args.iter().map(|s| s.to_string()));
        sluice(&all, None)
    }

    /// Runs with `--output json`, expects success, parses stdout.
    fn json(&self, args: &[&str]) -> Value {
        let mut all = vec!["--output", "json"];
        all.extend_from_slice(args);
        let out = self.run(&all);
        ok_json(&out, args)
    }

    /// The broker's `/metrics` text.
    fn metrics(&self) -> String {
        use std::io::Read;
        let addr = self.handle.as_ref().expect("running").config.metrics_addr;
        let mut s = std::net::TcpStream::connect(addr).expect("connect metrics");
        s.set_read_timeout(Some(CALL_TIMEOUT)).expect("timeout");
        s.write_all(b"GET /metrics HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
            .expect("write");
        let mut text = String::new();
        s.read_to_string(&mut text).expect("read");
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        text
    }

    fn stop(&mut self) {
        if let Some(h) = self.handle.take() {
            h.shutdown();
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs the binary with a bounded wait; `stdin` is written and closed if given.
fn sluice<S: AsRef<std::ffi::OsStr>>(args: &[S], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .env_remove("SLUICE_OUTPUT")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sluice");
    {
        let mut i = child.stdin.take().expect("stdin");
        if let Some(text) = stdin {
            i.write_all(text.as_bytes()).expect("write stdin");
        }
    }
    // Output is drained while the child runs (a big output would otherwise fill the pipe).
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(CALL_TIMEOUT) {
        Ok(out) => out.expect("output"),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!(
                "sluice {:?} did not finish",
                args.iter()
                    .map(|a| a.as_ref().to_owned())
                    .collect::<Vec<_>>()
            );
        }
    }
}

fn ok_json(out: &Output, what: &[&str]) -> Value {
    assert_eq!(
        out.status.code(),
        Some(0),
        "sluice {what:?}: stderr {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "sluice {what:?}: not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// The JSON error document on stderr of a failed `--output json` call.
fn err_json(out: &Output) -> Value {
    serde_json::from_slice(&out.stderr).unwrap_or_else(|e| {
        panic!(
            "stderr not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn describe(b: &Broker, q: &str) -> Value {
    b.json(&["queue", "describe", q])
}

#[test]
fn queue_admin_commands() {
    let dir = tempfile::tempdir().expect("tmp");
    let b = Broker::start(dir.path());

    let created = b.json(&[
        "queue",
        "create",
        "orders",
        "--attr",
        "VisibilityTimeout=40",
        "--tag",
        "team=payments",
    ]);
    assert_eq!(created["name"], "orders");
    let url = created["url"].as_str().expect("url").to_string();
    assert!(url.ends_with("/orders"), "{url}");
    let fifo = b.json(&["queue", "create", "jobs", "--fifo"]);
    assert_eq!(fifo["name"], "jobs.fifo");

    let list = b.json(&["queue", "list"]);
    let names: Vec<&str> = list
        .as_array()
        .expect("array")
        .iter()
        .map(|q| q["name"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["jobs.fifo", "orders"]);
    assert_eq!(
        b.json(&["queue", "list", "--prefix", "ord"])
            .as_array()
            .expect("array")
            .len(),
        1
    );

    let d = describe(&b, "orders");
    assert_eq!(d["QueueUrl"], url.as_str());
    assert_eq!(d["VisibilityTimeout"], "40");
    assert_eq!(d["Tags"]["team"], "payments");
    assert_eq!(d["ApproximateNumberOfMessages"], "0");
    assert!(d["QueueArn"].as_str().expect("arn").ends_with(":orders"));
    assert_eq!(
        describe(&b, &url)["QueueUrl"],
        url.as_str(),
        "a URL works too"
    );
    assert_eq!(describe(&b, "jobs.fifo")["FifoQueue"], "true");

    let u = b.json(&[
        "queue",
        "update",
        "orders",
        "--attr",
        "VisibilityTimeout=45",
    ]);
    assert_eq!(u["updated"]["VisibilityTimeout"], "45");
    assert_eq!(describe(&b, "orders")["VisibilityTimeout"], "45");

    b.json(&["send", "orders", "a", "b"]);
    assert_eq!(describe(&b, "orders")["ApproximateNumberOfMessages"], "2");
    assert_eq!(b.json(&["queue", "purge", "orders"])["result"], "purged");
    assert_eq!(describe(&b, "orders")["ApproximateNumberOfMessages"], "0");

    assert_eq!(b.json(&["queue", "delete", "orders"])["result"], "deleted");
    let gone = b.run(&["--output", "json", "queue", "describe", "orders"]);
    assert_eq!(gone.status.code(), Some(1), "a server-side error exits 1");
    let e = err_json(&gone);
    assert_eq!(e["error"]["kind"], "server");
    assert_eq!(e["error"]["exit_code"], 1);
    assert!(e["error"]["message"]
        .as_str()
        .expect("message")
        .contains("QueueDoesNotExist"));

    // Table output for people: a header row and the queue.
    let table = b.run(&["queue", "list"]);
    assert_eq!(table.status.code(), Some(0));
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.starts_with("NAME"), "{text}");
    assert!(text.contains("jobs.fifo"), "{text}");
}

#[test]
fn data_plane_send_receive_delete() {
    let dir = tempfile::tempdir().expect("tmp");
    let b = Broker::start(dir.path());
    b.json(&["queue", "create", "work"]);

    let sent = b.json(&[
        "send",
        "work",
        "one",
        "two",
        "--attr",
        "color=red",
        "--attr",
        "n:Number=3",
    ]);
    assert_eq!(sent.as_array().expect("array").len(), 2);
    assert!(sent[0]["message_id"]
        .as_str()
        .is_some_and(|s| !s.is_empty()));
    assert_eq!(sent[0]["md5_of_body"], "f97c5d29941bfb1b2fdab0874906ab82"); // md5("one")

    let file = dir.path().join("body.txt");
    std::fs::write(&file, "from a file").expect("write");
    b.json(&["send", "work", "--file", file.to_str().expect("utf-8")]);

    let mut args = b.flags();
    args.extend(["--output", "json", "send", "work", "--lines"].map(String::from));
    let piped = sluice(&args, Some("line 1\nline 2\n\n"));
    assert_eq!(
        ok_json(&piped, &["send --lines"])
            .as_array()
            .expect("array")
            .len(),
        2
    );
    let mut args = b.flags();
    args.extend(["--output", "json", "send", "work"].map(String::from));
    ok_json(&sluice(&args, Some("whole stdin\n")), &["send stdin"]);

    // Many lines go in batches; an entry the broker refuses fails alone (exit 1, in place).
    b.json(&["queue", "create", "batched"]);
    let mut args = b.flags();
    args.extend(["--output", "json", "send", "batched", "--lines"].map(String::from));
    let lines: String = (0..23).map(|i| format!("b{i}\n")).collect::<String>() + "bad \u{1} body\n";
    let partial = sluice(&args, Some(&lines));
    assert_eq!(
        partial.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&partial.stderr)
    );
    let results: Value = serde_json::from_slice(&partial.stdout).expect("JSON results");
    let results = results.as_array().expect("array");
    assert_eq!(results.len(), 24);
    assert!(results[..23].iter().all(|r| r["message_id"].is_string()));
    assert!(
        results[23]["error"]
            .as_str()
            .expect("error")
            .contains("InvalidMessageContents"),
        "{results:?}"
    );
    assert_eq!(describe(&b, "batched")["ApproximateNumberOfMessages"], "23");

    let got = b.json(&[
        "receive",
        "work",
        "--max",
        "10",
        "--visibility",
        "60",
        "--wait",
        "1",
    ]);
    let mut got: Vec<Value> = got.as_array().expect("array").clone();
    // One receive may come from one partition only: collect the rest.
    for _ in 0..10 {
        if got.len() >= 6 {
            break;
        }
        let more = b.json(&[
            "receive",
            "work",
            "--max",
            "10",
            "--visibility",
            "60",
            "--wait",
            "1",
        ]);
        got.extend(more.as_array().expect("array").iter().cloned());
    }
    let mut bodies: Vec<&str> = got
        .iter()
        .map(|m| m["body"].as_str().expect("body"))
        .collect();
    bodies.sort();
    assert_eq!(
        bodies,
        [
            "from a file",
            "line 1",
            "line 2",
            "one",
            "two",
            "whole stdin"
        ]
    );
    let one = got.iter().find(|m| m["body"] == "one").expect("one");
    assert_eq!(one["attributes"]["color"], "red");
    assert_eq!(one["attributes"]["n"], "3");
    assert_eq!(one["receive_count"], "1");
    let d = describe(&b, "work");
    assert_eq!(d["ApproximateNumberOfMessagesNotVisible"], "6");

    let handles: Vec<&str> = got
        .iter()
        .take(5)
        .map(|m| m["receipt_handle"].as_str().expect("handle"))
        .collect();
    let mut args = vec!["delete", "work"];
    args.extend(&handles);
    let deleted = b.json(&args);
    assert_eq!(deleted.as_array().expect("array").len(), 5);
    assert_eq!(
        describe(&b, "work")["ApproximateNumberOfMessagesNotVisible"],
        "1"
    );

    let bad = b.run(&["delete", "work", "not-a-receipt-handle"]);
    assert_eq!(bad.status.code(), Some(1));

    // receive --delete consumes.
    b.json(&["send", "work", "consume me"]);
    let mut consumed = Vec::new();
    for _ in 0..10 {
        let r = b.json(&["receive", "work", "--delete", "--wait", "1"]);
        consumed.extend(r.as_array().expect("array").iter().cloned());
        if !consumed.is_empty() {
            break;
        }
    }
    assert_eq!(consumed[0]["body"], "consume me");
    assert_eq!(consumed[0]["deleted"], true);
    let d = describe(&b, "work");
    assert_eq!(d["ApproximateNumberOfMessages"], "0");

    // The broker's metrics saw the CLI's native-protocol traffic.
    let text = b.metrics();
    let value = |prefix: &str, must: &[&str]| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(prefix) && must.iter().all(|m| l.contains(m)))
            .map(|l| {
                l.rsplit(' ')
                    .next()
                    .expect("value")
                    .parse::<f64>()
                    .expect("number")
            })
            .sum()
    };
    let work = ["queue=\"work\""];
    assert_eq!(value("sluice_queue_messages_sent_total{", &work), 7.0);
    assert_eq!(value("sluice_queue_messages_deleted_total{", &work), 6.0);
    assert!(value("sluice_queue_messages_received_total{", &work) >= 7.0);
    let native = |action: &str| {
        value(
            "sluice_requests_total{",
            &["frontend=\"native\"", &format!("action=\"{action}\"")],
        )
    };
    // Two bodies, two lines, then 24 lines in 3 batches: exactly once each.
    assert_eq!(native("SendMessageBatch"), 5.0);
    assert!(native("SendMessage") >= 3.0);
    assert!(native("DeleteMessage") >= 6.0);
    assert!(
        value(
            "sluice_request_errors_total{",
            &["code=\"ReceiptHandleIsInvalid\""]
        ) >= 1.0
    );
}

#[test]
fn dlq_sources_peek_and_redrive() {
    let dir = tempfile::tempdir().expect("tmp");
    let b = Broker::start(dir.path());
    let dlq = b.json(&["queue", "create", "dead"]);
    let dlq_arn = describe(&b, "dead")["QueueArn"]
        .as_str()
        .expect("arn")
        .to_string();
    let policy = format!(
        "RedrivePolicy={{\"deadLetterTargetArn\":\"{dlq_arn}\",\"maxReceiveCount\":\"1\"}}"
    );
    b.json(&["queue", "create", "live", "--attr", &policy]);

    let sources = b.json(&["dlq", "sources", "dead"]);
    assert_eq!(sources[0]["name"], "live");
    assert_eq!(sources.as_array().expect("array").len(), 1);

    b.json(&["send", "live", "poison"]);
    // Received once with visibility 0, then again: over maxReceiveCount, it moves to the DLQ.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        b.json(&["receive", "live", "--visibility", "0", "--max", "10"]);
        if describe(&b, "dead")["ApproximateNumberOfMessages"] == "1" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the message did not reach the DLQ"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let peeked = b.json(&["dlq", "peek", "dead"]);
    assert_eq!(peeked[0]["body"], "poison");
    // Peek leaves the message visible.
    assert_eq!(describe(&b, "dead")["ApproximateNumberOfMessages"], "1");

    let started = b.json(&["dlq", "redrive", "start", "dead"]);
    assert!(started["task_handle"]
        .as_str()
        .is_some_and(|h| !h.is_empty()));
    assert_eq!(started["source_arn"], dlq_arn.as_str());
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let tasks = b.json(&["dlq", "redrive", "list", "dead"]);
        if tasks[0]["status"] == "COMPLETED" {
            assert_eq!(tasks[0]["moved"], 1);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "redrive did not complete: {tasks}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(describe(&b, "live")["ApproximateNumberOfMessages"], "1");
    assert_eq!(describe(&b, "dead")["ApproximateNumberOfMessages"], "0");

    // Again, to a named destination, waiting for the end.
    b.json(&["queue", "create", "elsewhere"]);
    b.json(&["send", "live", "poison 2"]);
    let deadline = Instant::now() + Duration::from_secs(15);
    // The first message came back to `live` by the redrive: both go to the DLQ again.
    while describe(&b, "dead")["ApproximateNumberOfMessages"] != "2" {
        b.json(&["receive", "live", "--visibility", "0", "--max", "10"]);
        assert!(
            Instant::now() < deadline,
            "the message did not reach the DLQ"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let done = b.json(&[
        "dlq",
        "redrive",
        "start",
        "dead",
        "--to",
        "elsewhere",
        "--wait",
    ]);
    assert_eq!(done["status"], "COMPLETED", "{done}");
    assert_eq!(done["moved"], 2);
    assert!(done["destination_arn"]
        .as_str()
        .expect("arn")
        .ends_with(":elsewhere"));
    assert_eq!(
        describe(&b, "elsewhere")["ApproximateNumberOfMessages"],
        "2"
    );

    let cancel = b.run(&[
        "--output",
        "json",
        "dlq",
        "redrive",
        "cancel",
        "no-such-task",
    ]);
    assert_eq!(
        cancel.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&cancel.stderr)
    );
    assert_eq!(err_json(&cancel)["error"]["kind"], "server");
    let _ = dlq;
}

#[test]
fn usage_and_connection_errors_have_their_exit_codes() {
    // Usage: clap's errors exit 2.
    assert_eq!(
        sluice(&["queue", "frobnicate"], None).status.code(),
        Some(2)
    );
    assert_eq!(sluice(&["send"], None).status.code(), Some(2));
    // Usage: nothing to trust.
    let out = sluice(
        &[
            "--output",
            "json",
            "--ca-cert",
            "/nonexistent/cert.pem",
            "queue",
            "list",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(err_json(&out)["error"]["kind"], "usage");

    // Connection: nothing listens (a QUIC handshake to a closed UDP port times out).
    let port = free_port();
    let out = sluice(
        &[
            "--output",
            "json",
            "--insecure",
            "--endpoint",
            &format!("127.0.0.1:{port}"),
            "--timeout-ms",
            "500",
            "queue",
            "list",
        ],
        None,
    );
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(err_json(&out)["error"]["kind"], "connection");

    // Help explains the commands and the exit codes; completions are generated.
    let help = sluice(&["--help"], None);
    let text = String::from_utf8_lossy(&help.stdout);
    for word in [
        "queue",
        "dlq",
        "send",
        "receive",
        "delete",
        "log",
        "topic",
        "group",
        "tail",
        "serve",
        "Exit codes",
        "connection",
    ] {
        assert!(text.contains(word), "help lacks {word}: {text}");
    }
    let peek_help = sluice(&["dlq", "peek", "--help"], None);
    assert!(String::from_utf8_lossy(&peek_help.stdout).contains("visibility timeout 0"));
    let bash = sluice(&["completions", "bash"], None);
    assert_eq!(bash.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&bash.stdout).contains("_sluice"));
}

/// The first segment file with data of some queue partition under `data`.
fn a_queue_segment(data: &Path) -> PathBuf {
    let mut found = Vec::new();
    for q in std::fs::read_dir(data.join("queues")).expect("queues dir") {
        for p in std::fs::read_dir(q.expect("entry").path()).expect("queue dir") {
            let seg = p.expect("entry").path().join("00000000000000000000.log");
            if seg.exists() {
                found.push(seg);
            }
        }
    }
    found.sort();
    found
        .into_iter()
        .find(|s| {
            std::fs::read(s).expect("read")[..8] == [0u8; 8]
                && std::fs::read(s).expect("read")[12..16] == *b"SLB1"
        })
        .expect("a segment with a batch")
}

#[test]
fn log_dump_and_verify_offline() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut b = Broker::start(dir.path());
    b.json(&["queue", "create", "logged"]);
    for i in 0..5 {
        b.json(&["send", "logged", &format!("message {i}")]);
    }
    b.stop();
    let data = dir.path().to_str().expect("utf-8").to_string();

    let v = ok_json(
        &sluice(&["--output", "json", "log", "verify", &data], None),
        &["verify"],
    );
    let segs = v.as_array().expect("array");
    assert!(segs.len() >= 3, "meta + 2 partitions: {v}");
    assert!(segs.iter().all(|s| s["status"] == "ok"), "{v}");
    let batches: u64 = segs[1..]
        .iter()
        .map(|s| s["batches"].as_u64().expect("n"))
        .sum();
    assert!(batches >= 5, "{v}");

    let seg = a_queue_segment(dir.path());
    let seg_s = seg.to_str().expect("utf-8");
    let dump = ok_json(
        &sluice(
            &[
                "--output",
                "json",
                "log",
                "dump",
                seg_s,
                "--records",
                "--values",
            ],
            None,
        ),
        &["dump"],
    );
    let first = &dump[0]["batch_list"][0];
    assert_eq!(first["position"], 0);
    assert_eq!(first["base_offset"], 0);
    assert!(
        first["size_bytes"].as_u64().expect("size") > sluice_wire::batch::BATCH_HEADER_BYTES as u64
    );
    assert!(first["first_timestamp_ms"].as_i64().expect("ts") > 0);
    assert!(first["record_list"][0]["value_bytes"].as_u64().expect("n") > 0);
    let total = dump[0]["batches"].as_u64().expect("n");
    let some = ok_json(
        &sluice(
            &[
                "--output",
                "json",
                "log",
                "dump",
                seg_s,
                "--from-offset",
                "1",
                "--max-batches",
                "1",
            ],
            None,
        ),
        &["dump range"],
    );
    let listed = some[0]["batch_list"].as_array().expect("array");
    let later = dump[0]["batch_list"]
        .as_array()
        .expect("array")
        .iter()
        .filter(|b| b["last_offset"].as_u64().expect("offset") >= 1)
        .count();
    assert_eq!(listed.len(), later.min(1), "{some}");
    assert_eq!(some[0]["batches"], total, "every batch is still walked");
    if let Some(b) = listed.first() {
        assert!(b["last_offset"].as_u64().expect("offset") >= 1);
    }
    let text = sluice(&["log", "dump", seg_s], None);
    assert!(String::from_utf8_lossy(&text.stdout).contains("batch position=0 offsets=0..="));

    // Flip one byte inside the first batch's checksummed bytes (its first record).
    let mut bytes = std::fs::read(&seg).expect("read");
    bytes[sluice_wire::batch::BATCH_HEADER_BYTES + 6] ^= 0x40;
    std::fs::write(&seg, &bytes).expect("write");
    let bad = sluice(&["--output", "json", "log", "verify", &data], None);
    assert_eq!(bad.status.code(), Some(4), "corruption exits 4");
    let v: Value = serde_json::from_slice(&bad.stdout).expect("JSON");
    let corrupt: Vec<&Value> = v
        .as_array()
        .expect("array")
        .iter()
        .filter(|s| s["status"] == "CORRUPT")
        .collect();
    assert_eq!(corrupt.len(), 1, "{v}");
    assert_eq!(corrupt[0]["segment"], seg_s);
    assert!(
        corrupt[0]["problems"]
            .as_str()
            .expect("text")
            .contains("checksum"),
        "{v}"
    );
    assert_eq!(sluice(&["log", "dump", seg_s], None).status.code(), Some(4));

    let missing = sluice(&["log", "verify", "/nonexistent/dir"], None);
    assert_eq!(missing.status.code(), Some(2));
}

/// JSON lines of `sluice --output json tail …`.
fn tail_json(b: &Broker, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["--output", "json", "tail"];
    all.extend_from_slice(args);
    let out = b.run(&all);
    assert_eq!(
        out.status.code(),
        Some(0),
        "tail {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

#[test]
fn topic_group_and_tail_commands() {
    use sluice_sdk::{Client, ClientOptions, GroupConsumer, GroupConsumerOptions, Trust};
    let tmp = tempfile::tempdir().expect("tmp");
    let b = Broker::start(tmp.path());

    // topic create / list / describe
    let t = b.json(&[
        "topic",
        "create",
        "events",
        "--partitions",
        "2",
        "--retention-ms",
        "3600000",
    ]);
    assert_eq!(t["name"], "events");
    assert_eq!(t["partitions"], 2);
    let out = b.run(&[
        "--output",
        "json",
        "topic",
        "create",
        "bad",
        "--partitions",
        "0",
    ]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "invalid partitions: broker error"
    );
    assert_eq!(err_json(&out)["error"]["kind"], "server");
    let list = b.json(&["topic", "list"]);
    assert_eq!(list.as_array().expect("array").len(), 1);
    assert_eq!(list[0]["name"], "events");
    assert_eq!(list[0]["retention_ms"], 3_600_000);

    // Records and a group through the SDK (the CLI only reads them).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let c = &b.handle.as_ref().expect("running").config;
    let (addr, cert) = (c.quic_addr, tmp.path().join("quic-selfsigned-cert.pem"));
    let client = rt
        .block_on(Client::connect(
            addr,
            ClientOptions::new(Trust::PemFile(cert)),
        ))
        .expect("connect");
    let produce = |values: &[&str]| {
        rt.block_on(async {
            let mut p = client.topic_producer("events").await.expect("producer");
            for v in values {
                p.send(Some(v.as_bytes()), v.as_bytes())
                    .await
                    .expect("send");
            }
            p.flush().await.expect("flush");
        })
    };
    produce(&["a", "b", "c", "d", "e"]);

    let d = b.json(&["topic", "describe", "events"]);
    assert_eq!(d["partitions"], 2);
    let offsets = d["offsets"].as_array().expect("offsets");
    assert_eq!(offsets.len(), 2);
    let records: u64 = offsets.iter().map(|o| o["records"].as_u64().unwrap()).sum();
    assert_eq!(records, 5);
    assert_eq!(offsets[0]["earliest"], 0);

    // tail: everything, bounded, from the end, from an offset, from a time, table form.
    let all = tail_json(&b, &["events"]);
    let mut values: Vec<&str> = all.iter().map(|r| r["value"].as_str().unwrap()).collect();
    values.sort_unstable();
    assert_eq!(values, ["a", "b", "c", "d", "e"]);
    assert!(all
        .iter()
        .all(|r| r["key"] == r["value"] && r["time"].is_string()));
    assert_eq!(tail_json(&b, &["events", "--max", "2"]).len(), 2);
    assert!(tail_json(&b, &["events", "--from", "latest"]).is_empty());
    let p0 = offsets[0]["latest"].as_u64().unwrap();
    let from1 = tail_json(&b, &["events", "--partition", "0", "--from-offset", "1"]);
    assert_eq!(from1.len() as u64, p0.saturating_sub(1));
    assert!(from1.iter().all(|r| r["partition"] == 0));
    assert!(tail_json(&b, &["events", "--from-time", "2999-01-01T00:00:00Z"]).is_empty());
    assert_eq!(tail_json(&b, &["events", "--from-time", "0"]).len(), 5);
    assert_eq!(
        tail_json(&b, &["events", "--follow", "--max", "3"]).len(),
        3
    );
    let table = b.run(&["tail", "events"]);
    assert_eq!(table.status.code(), Some(0));
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.starts_with("PARTITION\tOFFSET"), "{text}");
    assert_eq!(text.lines().count(), 6, "{text}");
    // A queue read as a stream: every message sent, whatever receives happened since.
    b.json(&["queue", "create", "audit"]);
    b.json(&["send", "audit", "q1", "q2", "q3"]);
    b.json(&["receive", "audit", "--max", "2"]);
    let q = tail_json(&b, &["queue:audit"]);
    let mut bodies: Vec<&str> = q.iter().map(|r| r["value"].as_str().unwrap()).collect();
    bodies.sort_unstable();
    assert_eq!(bodies, ["q1", "q2", "q3"]);
    // tail errors: unknown topic (broker), bad time and partition (usage).
    let out = b.run(&["--output", "json", "tail", "nope"]);
    assert_eq!(out.status.code(), Some(1));
    let out = b.run(&["tail", "events", "--from-time", "yesterday"]);
    assert_eq!(out.status.code(), Some(2));
    let out = b.run(&["tail", "events", "--partition", "9"]);
    assert_eq!(out.status.code(), Some(2));

    // group list / describe with a member that read everything and committed.
    let options = GroupConsumerOptions {
        session_timeout: Duration::from_secs(120),
        max_records: 100,
        max_bytes: 1 << 20,
        poll_wait: Duration::from_millis(50),
        ..GroupConsumerOptions::default()
    };
    let mut member = rt
        .block_on(GroupConsumer::join(
            &client,
            "readers",
            &["events"],
            options,
        ))
        .expect("join");
    let deadline = Instant::now() + CALL_TIMEOUT;
    let mut got = 0;
    while got < 5 {
        assert!(
            Instant::now() < deadline,
            "the member did not read 5 records"
        );
        got += rt.block_on(member.poll()).expect("poll").len();
    }
    rt.block_on(member.commit()).expect("commit");
    let groups = b.json(&["group", "list"]);
    assert_eq!(groups[0]["group"], "readers");
    assert_eq!(groups[0]["members"], 1);
    assert_eq!(groups[0]["lag"], 0);
    let g = b.json(&["group", "describe", "readers"]);
    assert_eq!(g["members"][0]["member_id"], member.member_id());
    let parts = g["partitions"].as_array().expect("partitions");
    assert_eq!(parts.len(), 2);
    for p in parts {
        assert_eq!(p["member"], member.member_id());
        assert_eq!(p["lag"], 0);
        assert_eq!(p["committed"], p["latest"]);
    }
    // Three more records: the group lags by three until it commits again.
    produce(&["f", "g", "h"]);
    let g = b.json(&["group", "describe", "readers"]);
    let lag: u64 = g["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["lag"].as_u64().unwrap())
        .sum();
    assert_eq!(lag, 3);
    let table = b.run(&["group", "describe", "readers"]);
    assert!(String::from_utf8_lossy(&table.stdout).contains("PARTITIONS:"));
    let out = b.run(&["--output", "json", "group", "describe", "nobody"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(err_json(&out)["error"]["kind"], "server");
    rt.block_on(member.close()).expect("leave");

    // topic delete: gone from the list; describing it is a broker error.
    let del = b.json(&["topic", "delete", "events"]);
    assert_eq!(del["result"], "deleted");
    assert_eq!(b.json(&["topic", "list"]), serde_json::json!([]));
    let out = b.run(&["--output", "json", "topic", "describe", "events"]);
    assert_eq!(out.status.code(), Some(1));
    rt.block_on(client.close());
}

/// `sluice serve`: the broker in the CLI's process, configured by file and flags; it prints its
/// effective configuration, serves, and stops cleanly on SIGTERM.
/// A broker that requires authentication: no credentials, or wrong ones, is AccessDenied
/// (exit 1, the code in the JSON error); the right key from the environment works.
#[test]
fn credentials_reach_a_broker_that_requires_them() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut c = BrokerConfig::ephemeral(tmp.path().to_path_buf()).expect("config");
    c.shards = 1;
    c.default_partitions = 1;
    c.http_addr = "127.0.0.1:0".parse().expect("addr");
    c.quic_addr = "127.0.0.1:0".parse().expect("addr");
    c.metrics_addr = "127.0.0.1:0".parse().expect("addr");
    c.kafka_addr = None;
    c.auth = sluice_broker::auth::AuthConfig {
        mode: sluice_broker::auth::AuthMode::SigV4,
        keys: sluice_broker::auth::parse_keys("AKIDCLI:cli-secret:123456789012").expect("keys"),
    };
    let handle = server::start(c).expect("start");
    handle.wait_ready().expect("ready");
    let b = Broker {
        handle: Some(handle),
        dir: tmp.path().to_path_buf(),
    };
    let out = b.run(&["--output", "json", "queue", "list"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("AccessDenied"),
        "{out:?}"
    );
    let out = b.run(&[
        "--output",
        "json",
        "--access-key-id",
        "AKIDCLI",
        "--secret-access-key",
        "wrong",
        "queue",
        "list",
    ]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    // The secret from the environment; the queue lands in the key's account.
    let mut all = b.flags();
    all.extend(["--output", "json", "queue", "create", "audited"].map(String::from));
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(&all)
        .env_remove("SLUICE_OUTPUT")
        .env("SLUICE_ACCESS_KEY_ID", "AKIDCLI")
        .env("SLUICE_SECRET_ACCESS_KEY", "cli-secret")
        .stdin(Stdio::null())
        .output()
        .expect("run sluice");
    let v = ok_json(&out, &["queue", "create"]);
    assert!(v.to_string().contains("123456789012"), "{v}");
}

#[test]
fn serve_runs_a_broker_from_a_config_file() {
    use std::io::{BufRead, BufReader};
    let tmp = tempfile::tempdir().expect("tmp");
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../sluice.toml");
    // The shipped example, printed with a flag over it.
    let out = sluice(
        &[
            "serve",
            "--config",
            example,
            "--shards",
            "1",
            "--print-config",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(0));
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(printed.contains("shards = 1"), "{printed}");
    assert!(printed.contains("[quic]"), "{printed}");
    // Bad configuration: exit 2, the key named.
    let bad = tmp.path().join("bad.toml");
    std::fs::write(&bad, "[metrics]\nadress = \"x\"\n").expect("write");
    let out = sluice(&["serve", "--config", bad.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("adress"));

    let file = tmp.path().join("sluice.toml");
    std::fs::write(
        &file,
        format!(
            "data_dir = {:?}\nshards = 1\n[http]\naddr = \"127.0.0.1:{}\"\n[quic]\naddr = \"127.0.0.1:0\"\n[metrics]\naddr = \"127.0.0.1:0\"\n[kafka]\naddr = \"127.0.0.1:0\"\n",
            tmp.path().join("data").display().to_string(),
            free_port()
        ),
    )
    .expect("write");
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--config", file.to_str().unwrap()])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sluice serve");
    // A failing assertion below must not leave the broker running.
    struct KillOnDrop(std::process::Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            if matches!(self.0.try_wait(), Ok(None)) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
    }
    let err = child.stderr.take().expect("stderr");
    let mut child = KillOnDrop(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // The `ready` line names the QUIC port it picked.
    let deadline = Instant::now() + CALL_TIMEOUT;
    let quic = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(line) = rx.recv_timeout(left) else {
            let _ = child.0.kill();
            panic!("sluice serve did not get ready");
        };
        // (not the per-shard "shard ready" lines)
        if line.contains("ready") && line.contains("quic=") {
            let addr = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix("quic="))
                .expect("quic= in the ready line");
            break addr.to_string();
        }
    };
    let out = sluice(
        &[
            "--output",
            "json",
            "--endpoint",
            &quic,
            "--ca-cert",
            tmp.path()
                .join("data/quic-selfsigned-cert.pem")
                .to_str()
                .unwrap(),
            "queue",
            "create",
            "served",
        ],
        None,
    );
    let v = ok_json(&out, &["queue", "create"]);
    assert_eq!(v["name"], "served");
    let pid = child.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill")
        .success());
    let deadline = Instant::now() + CALL_TIMEOUT;
    let status = loop {
        if let Some(s) = child.0.try_wait().expect("wait") {
            break s;
        }
        assert!(Instant::now() < deadline, "sluice serve did not stop");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
}

#[test]
fn topic_produce_writes_what_tail_reads() {
    let tmp = tempfile::tempdir().expect("tmp");
    let b = Broker::start(tmp.path());
    b.json(&["topic", "create", "clicks", "--partitions", "2"]);
    let r = b.json(&["topic", "produce", "clicks", "x", "y", "--key", "k"]);
    assert_eq!(r["records"], 2);
    let parts = r["partitions"].as_array().expect("partitions");
    assert_eq!(parts.len(), 1, "one key, one partition: {r}");
    assert_eq!(parts[0]["first_offset"], 0);
    assert_eq!(parts[0]["last_offset"], 1);
    // Lines of stdin, `key:value` split as kcat -K: does; a line without it has no key.
    let mut args = b.flags();
    args.extend(
        [
            "--output",
            "json",
            "topic",
            "produce",
            "clicks",
            "--key-separator",
            ":",
        ]
        .map(String::from),
    );
    let out = sluice(&args, Some("u1:a\nu2:b\n\nplain\n"));
    assert_eq!(ok_json(&out, &["topic produce stdin"])["records"], 3);
    let r = b.json(&["topic", "produce", "clicks", "--partition", "1", "p"]);
    assert_eq!(r["partitions"][0]["partition"], 1);
    let all = tail_json(&b, &["clicks"]);
    let mut pairs: Vec<(String, String)> = all
        .iter()
        .map(|r| {
            (
                r["key"].as_str().unwrap_or("-").to_string(),
                r["value"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    pairs.sort();
    let want: Vec<(String, String)> = [
        ("-", "p"),
        ("-", "plain"),
        ("k", "x"),
        ("k", "y"),
        ("u1", "a"),
        ("u2", "b"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(pairs, want);
    let out = b.run(&["--output", "json", "topic", "produce", "nope", "v"]);
    assert_eq!(out.status.code(), Some(1), "unknown topic: broker error");
}

#[test]
fn cluster_init_node_and_certs_make_an_identity_and_a_certificate() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data").display().to_string();
    let init = [
        "--output",
        "json",
        "cluster",
        "init-node",
        "--data-dir",
        &data,
    ];
    let first = ok_json(&sluice(&init, None), &init);
    assert_eq!(first["created"], true, "{first}");
    let id = first["node_id"].as_u64().expect("node id");
    assert!(id > 0);
    assert_eq!(first["disk"].as_str().expect("disk").len(), 32, "{first}");
    // Again: the same identity, not a new one.
    let second = ok_json(&sluice(&init, None), &init);
    assert_eq!(second["created"], false);
    assert_eq!(
        (&second["node_id"], &second["disk"]),
        (&first["node_id"], &first["disk"])
    );

    let ca = tmp.path().join("ca").display().to_string();
    let out = tmp.path().join("node").display().to_string();
    let id_arg = id.to_string();
    let certs = [
        "--output",
        "json",
        "cluster",
        "certs",
        "--ca-dir",
        &ca,
        "--node-id",
        &id_arg,
        "--out",
        &out,
    ];
    let made = ok_json(&sluice(&certs, None), &certs);
    assert_eq!(made["ca_created"], true, "{made}");
    let cert = std::fs::read(made["cert"].as_str().expect("cert path")).expect("cert file");
    assert!(String::from_utf8_lossy(&cert).contains("BEGIN CERTIFICATE"));
    assert!(Path::new(made["key"].as_str().expect("key path")).exists());
    let again = ok_json(&sluice(&certs, None), &certs);
    assert_eq!(again["ca_created"], false, "the CA is made once");

    let zero = [
        "cluster",
        "certs",
        "--ca-dir",
        &ca,
        "--node-id",
        "0",
        "--out",
        &out,
    ];
    assert_eq!(sluice(&zero, None).status.code(), Some(2));
    // A data dir that holds data without an identity is refused, and left without one.
    let old = tmp.path().join("old");
    std::fs::create_dir_all(old.join("queues")).expect("data");
    let old_s = old.display().to_string();
    let refused = sluice(&["cluster", "init-node", "--data-dir", &old_s], None);
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("no node.id"));
    assert!(!old.join("node.id").exists());
}

/// `sluice scram-credential` prints config entries the broker loads, holding no password.
#[test]
fn scram_credential_prints_entries_the_broker_loads() {
    use sluice_broker::auth::scram::Mechanism;
    let out = sluice(
        &[
            "scram-credential",
            "--user",
            "alice",
            "--account",
            "111111111111",
        ],
        Some("correct horse\n"),
    );
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    assert!(
        !text.contains("correct horse"),
        "the password is not printed"
    );
    let settings = sluice_broker::config_file::Settings::parse(&text, "stdout")
        .expect("parses")
        .resolve()
        .expect("valid");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = settings;
    settings.data_dir = Some(dir.path().to_path_buf());
    let config = settings.broker_config().expect("config");
    for m in Mechanism::ALL {
        let c = config.kafka_scram.get("alice", m).expect("both mechanisms");
        assert_eq!(c.account, "111111111111");
    }
    let empty = sluice(&["scram-credential", "--user", "alice"], Some("\n"));
    assert_eq!(
        empty.status.code(),
        Some(2),
        "an empty password is a usage error"
    );
}

/// `sluice cluster status` reads each node's `/metrics`: a node that answers shows its id,
/// zone and replication figures; one that does not is a row with `up: false` and exit code 1.
#[test]
fn cluster_status_reads_every_nodes_metrics_and_names_the_silent_ones() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let body = "sluice_cluster_node_info{node=\"42\",zone=\"z2\"} 1\n\
                sluice_peer_connections{shard=\"0\"} 2\n\
                sluice_raft_replicas{shard=\"0\"} 3\n\
                sluice_raft_replicas{shard=\"1\"} 2\n\
                sluice_raft_leaders{shard=\"0\"} 2\n\
                sluice_raft_serving{shard=\"0\"} 2\n\
                sluice_raft_replication_lag_offsets{shard=\"0\"} 7\n\
                sluice_raft_replication_lag_offsets{shard=\"1\"} 3\n\
                sluice_raft_leader_changes_total{shard=\"0\"} 4\n\
                sluice_raft_commit_seconds_sum{shard=\"0\"} 0.5\n\
                sluice_raft_commit_seconds_count{shard=\"0\"} 250\n";
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        // The whole request first (the client writes it in pieces; answering and closing
        // with some unread would reset the connection).
        let mut req = Vec::new();
        let mut buf = [0u8; 1024];
        while !req.windows(4).any(|w| w == b"\r\n\r\n") {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => req.extend_from_slice(&buf[..n]),
            }
        }
        let _ = write!(
            s,
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
    });
    // A port nothing listens on.
    let silent = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr");
    let list = format!("{addr},{silent}");
    let args = ["--output", "json", "cluster", "status", "--metrics", &list];
    let out = sluice(&args, None);
    server.join().expect("server");
    assert_eq!(out.status.code(), Some(1), "a node down: exit code 1");
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let up = &rows[0];
    assert_eq!(up["node"], "42", "{rows}");
    assert_eq!(up["zone"], "z2");
    assert_eq!(up["replicas"], 5);
    assert_eq!(up["leaders"], 2);
    assert_eq!(up["lag_offsets_max"], 7);
    assert_eq!(up["leader_changes"], 4);
    assert_eq!(up["commits"], 250);
    assert_eq!(up["commit_ms_mean"], 2.0);
    assert_eq!(rows[1]["up"], false, "{rows}");
    assert_eq!(rows[1]["metrics"], silent.to_string());
}
