//! The metrics and health endpoint against a real broker: scrape `/metrics` over TCP, parse it
//! as Prometheus text, and check that the figures move with operations done through the SQS
//! HTTP API. Loopback only, ephemeral ports, short timeouts.

use sluice_broker::config::BrokerConfig;
use sluice_broker::server::{self, BrokerHandle};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

const IO_TIMEOUT: Duration = Duration::from_secs(10);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

fn start(dir: &std::path::Path) -> (BrokerHandle, SocketAddr, SocketAddr) {
    let mut c = BrokerConfig::embedded(dir.to_path_buf()).expect("config");
    c.shards = 2;
    c.default_partitions = 2;
    c.http_addr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    c.quic_enabled = false;
    c.metrics_addr = "127.0.0.1:0".parse().expect("addr");
    let b = server::start(c).expect("start");
    b.wait_ready().expect("ready");
    let (http, metrics) = (b.config.http_addr, b.config.metrics_addr);
    assert_ne!(metrics.port(), 0, "port 0 is resolved at start");
    let deadline = Instant::now() + IO_TIMEOUT;
    while TcpStream::connect(http).is_err() || TcpStream::connect(metrics).is_err() {
        assert!(Instant::now() < deadline, "listeners did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    (b, http, metrics)
}

/// One HTTP/1.1 exchange on a fresh connection (closed after the answer).
fn exchange(addr: SocketAddr, request: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
    s.write_all(request.as_bytes()).expect("write");
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).expect("read");
    let text = String::from_utf8(buf).expect("utf-8");
    let (head, body) = text.split_once("\r\n\r\n").expect("a head");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status");
    (status, body.to_string())
}

fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    exchange(
        addr,
        &format!("GET {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n"),
    )
}

fn sqs(addr: SocketAddr, action: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let body = body.to_string();
    let (status, text) = exchange(
        addr,
        &format!(
            "POST / HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\
             x-amz-target: AmazonSQS.{action}\r\ncontent-type: application/x-amz-json-1.0\r\n\
             content-length: {}\r\n\r\n{body}",
            body.len()
        ),
    );
    (status, serde_json::from_str(&text).expect("JSON answer"))
}

/// A parsed sample: metric name, labels, value.
type Sample = (String, BTreeMap<String, String>, f64);

/// A small parser of the Prometheus text format (0.0.4): `# TYPE` lines and samples with
/// quoted, escaped label values. Panics on anything malformed, which is the test.
fn parse(text: &str) -> (BTreeMap<String, String>, Vec<Sample>) {
    let mut types = BTreeMap::new();
    let mut samples = Vec::new();
    for line in text.lines() {
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "{line}"
            );
            assert!(
                types.insert(name.to_string(), kind.to_string()).is_none(),
                "duplicate TYPE {name}"
            );
            continue;
        }
        if line.starts_with('#') {
            assert!(line.starts_with("# HELP "), "{line}");
            continue;
        }
        let name_end = line.find(['{', ' ']).expect("a name");
        let name = &line[..name_end];
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name in {line}"
        );
        let mut labels = BTreeMap::new();
        let mut rest = &line[name_end..];
        if let Some(r) = rest.strip_prefix('{') {
            let b: Vec<char> = r.chars().collect();
            let mut i = 0;
            loop {
                match b[i] {
                    '}' => break,
                    ',' => i += 1,
                    _ => {
                        let mut key = String::new();
                        while b[i] != '=' {
                            key.push(b[i]);
                            i += 1;
                        }
                        assert_eq!(b[i + 1], '"', "{line}");
                        i += 2;
                        let mut value = String::new();
                        while b[i] != '"' {
                            if b[i] == '\\' {
                                i += 1;
                                value.push(if b[i] == 'n' { '\n' } else { b[i] });
                            } else {
                                value.push(b[i]);
                            }
                            i += 1;
                        }
                        i += 1;
                        labels.insert(key, value);
                    }
                }
            }
            let consumed: usize = b[..=i].iter().map(|c| c.len_utf8()).sum();
            rest = &r[consumed..];
        }
        let value: f64 = match rest.trim() {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value in {line}")),
        };
        assert!(
            ["_bucket", "_sum", "_count", ""]
                .iter()
                .any(|s| name.strip_suffix(s).is_some_and(|f| types.contains_key(f))),
            "sample without a TYPE: {line}"
        );
        samples.push((name.to_string(), labels, value));
    }
    (types, samples)
}

/// Sum of a metric's samples whose labels include `want`.
fn sum(samples: &[Sample], name: &str, want: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|(n, l, _)| {
            n == name
                && want
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, _, v)| v)
        .sum()
}

fn scrape(metrics: SocketAddr) -> Vec<Sample> {
    let (status, text) = get(metrics, "/metrics");
    assert_eq!(status, 200);
    parse(&text).1
}

#[test]
fn metrics_move_with_operations_and_health_answers() {
    let dir = tempfile::tempdir().expect("tmp");
    let (broker, http, metrics) = start(dir.path());

    assert_eq!(get(metrics, "/health"), (200, "ok\n".to_string()));
    assert_eq!(get(metrics, "/ready"), (200, "ready\n".to_string()));
    assert_eq!(get(metrics, "/nope").0, 404);

    let (status, created) = sqs(http, "CreateQueue", serde_json::json!({"QueueName": "m-q"}));
    assert_eq!(status, 200, "{created}");
    let url = created["QueueUrl"].as_str().expect("url").to_string();
    let q = [("tenant", "000000000000"), ("queue", "m-q")];

    let before = scrape(metrics);
    assert_eq!(
        sum(&before, "sluice_queue_messages_sent_total", &q[1..]),
        0.0
    );
    assert_eq!(sum(&before, "sluice_shards", &[]), 2.0);
    assert_eq!(sum(&before, "sluice_ready", &[]), 1.0);

    for i in 0..3 {
        let (s, r) = sqs(
            http,
            "SendMessage",
            serde_json::json!({"QueueUrl": url, "MessageBody": format!("m{i}")}),
        );
        assert_eq!(s, 200, "{r}");
    }
    let (s, got) = sqs(
        http,
        "ReceiveMessage",
        serde_json::json!({"QueueUrl": url, "MaxNumberOfMessages": 2, "VisibilityTimeout": 60}),
    );
    assert_eq!(s, 200, "{got}");
    let messages = got["Messages"].as_array().expect("messages").clone();
    assert!(!messages.is_empty());
    let (s, r) = sqs(
        http,
        "DeleteMessage",
        serde_json::json!({"QueueUrl": url, "ReceiptHandle": messages[0]["ReceiptHandle"]}),
    );
    assert_eq!(s, 200, "{r}");
    let (s, _) = sqs(
        http,
        "GetQueueUrl",
        serde_json::json!({"QueueName": "no-such-queue"}),
    );
    assert_eq!(s, 400);

    let after = scrape(metrics);
    let received = messages.len() as f64;
    let qf = |name: &str| sum(&after, name, &q[1..]);
    assert_eq!(qf("sluice_queue_messages_sent_total"), 3.0);
    assert_eq!(qf("sluice_queue_messages_received_total"), received);
    assert_eq!(qf("sluice_queue_messages_deleted_total"), 1.0);
    assert_eq!(qf("sluice_queue_messages_visible"), 3.0 - received);
    assert_eq!(qf("sluice_queue_messages_in_flight"), received - 1.0);
    assert_eq!(qf("sluice_queue_messages_delayed"), 0.0);
    assert_eq!(
        sum(&after, "sluice_queue_messages_sent_total", &q),
        3.0,
        "tenant label"
    );

    let sends = [("frontend", "http"), ("action", "SendMessage")];
    assert_eq!(sum(&after, "sluice_requests_total", &sends), 3.0);
    assert_eq!(
        sum(&after, "sluice_request_duration_seconds_count", &sends),
        3.0
    );
    assert_eq!(
        sum(
            &after,
            "sluice_request_duration_seconds_bucket",
            &[sends[0], sends[1], ("le", "+Inf")]
        ),
        3.0
    );
    assert!(sum(&after, "sluice_request_duration_seconds_sum", &sends) > 0.0);
    assert_eq!(
        sum(
            &after,
            "sluice_request_errors_total",
            &[("frontend", "http"), ("code", "QueueDoesNotExist")]
        ),
        1.0
    );
    // Durable operations went through group commits on the partitions' logs.
    let commits = sum(&after, "sluice_log_commits_total", &[]);
    assert!(commits >= 5.0, "commits {commits}");
    assert!(sum(&after, "sluice_log_fsyncs_total", &[]) >= commits);
    assert_eq!(sum(&after, "sluice_partitions", &[]), 2.0);
    assert!(sum(&after, "sluice_log_segments", &[]) >= 2.0);
    assert!(sum(&after, "sluice_log_size_bytes", &[]) > 0.0);
    assert!(sum(&after, "sluice_uptime_seconds", &[]) > 0.0);
    // Every durable command waited for a commit; the executors did work.
    assert!(sum(&after, "sluice_log_durable_wait_seconds_count", &[]) >= 5.0);
    assert_eq!(
        sum(&after, "sluice_log_durable_wait_seconds_count", &[]),
        sum(
            &after,
            "sluice_log_durable_wait_seconds_bucket",
            &[("le", "+Inf")]
        )
    );
    assert!(sum(&after, "sluice_shard_busy_seconds_total", &[]) > 0.0);
    assert!(
        sum(&after, "sluice_shard_busy_seconds_total", &[])
            >= sum(&before, "sluice_shard_busy_seconds_total", &[])
    );
    broker.shutdown();
}

#[test]
fn prometheus_parser_reads_escaped_labels() {
    let text = "# TYPE a counter\na{x=\"q\\\"u\\\\o\\nte\",y=\"2\"} 7\n# TYPE b gauge\nb 1.5\n";
    let (types, samples) = parse(text);
    assert_eq!(types.len(), 2);
    assert_eq!(samples[0].1["x"], "q\"u\\o\nte");
    assert_eq!(samples[0].1["y"], "2");
    assert_eq!(samples[0].2, 7.0);
    assert_eq!(samples[1].2, 1.5);
}
