//! The metrics and health endpoint against a real broker: scrape `/metrics` over TCP, parse it
//! as Prometheus text, and check that the figures move with operations done through the SQS
//! HTTP API. Loopback only, ephemeral ports, short timeouts.

// A test is the broker's outside world: it times the broker with its own clocks (deadlines,
// waits, latencies). broker/clippy.toml's clock seam governs the broker's code, not this.
#![allow(clippy::disallowed_methods)]

use sluice_broker::config::BrokerConfig;
use sluice_broker::server::{self, BrokerHandle};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

const IO_TIMEOUT: Duration = Duration::from_secs(10);

fn start(dir: &std::path::Path) -> (BrokerHandle, SocketAddr, SocketAddr) {
    start_with(dir, |_| {})
}

/// [`start`], with the configuration changed by `tweak` first.
fn start_with(
    dir: &std::path::Path,
    tweak: impl FnOnce(&mut BrokerConfig),
) -> (BrokerHandle, SocketAddr, SocketAddr) {
    let mut c = BrokerConfig::ephemeral(dir.to_path_buf()).expect("config");
    c.shards = 2;
    c.default_partitions = 2;
    c.http_addr = "127.0.0.1:0".parse().expect("addr");
    c.quic_enabled = false;
    c.metrics_addr = "127.0.0.1:0".parse().expect("addr");
    c.kafka_addr = None;
    tweak(&mut c);
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
    // Some of them may have started beside another; never more than all of them.
    assert!(after
        .iter()
        .any(|(n, _, _)| n == "sluice_log_commits_overlapped_total"));
    assert!(sum(&after, "sluice_log_commits_overlapped_total", &[]) <= commits);
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
    for name in [
        "sluice_stream_readahead_reads_total",
        "sluice_stream_readahead_hits_total",
        "sluice_stream_readahead_bytes",
    ] {
        assert!(
            after.iter().filter(|(n, _, _)| n == name).count() >= 1,
            "{name} is exported per shard"
        );
    }
    assert!(
        sum(&after, "sluice_shard_busy_seconds_total", &[])
            >= sum(&before, "sluice_shard_busy_seconds_total", &[])
    );
    // Each group commit's fdatasync was timed inside storage: one observation per commit.
    assert_eq!(
        sum(&after, "sluice_log_fsync_duration_seconds_count", &[]),
        commits
    );
    assert_eq!(
        sum(
            &after,
            "sluice_log_fsync_duration_seconds_bucket",
            &[("le", "+Inf")]
        ),
        commits
    );
    assert!(sum(&after, "sluice_log_fsync_duration_seconds_sum", &[]) > 0.0);

    // The oldest message's age: 0 while a queue is empty, growing while messages wait, back
    // to 0 once every message is deleted.
    let age = "sluice_queue_oldest_message_age_seconds";
    assert_eq!(sum(&before, age, &q), 0.0, "empty queue");
    let deadline = Instant::now() + IO_TIMEOUT;
    let first = loop {
        let a = sum(&scrape(metrics), age, &q);
        if a > 0.0 {
            break a;
        }
        assert!(Instant::now() < deadline, "oldest message age stayed 0");
        std::thread::sleep(Duration::from_millis(20));
    };
    let deadline = Instant::now() + IO_TIMEOUT;
    while sum(&scrape(metrics), age, &q) <= first {
        assert!(Instant::now() < deadline, "oldest message age did not grow");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Delete everything: the in-flight ones by handle, then receive and delete the rest.
    for m in &messages[1..] {
        let (s, r) = sqs(
            http,
            "DeleteMessage",
            serde_json::json!({"QueueUrl": url, "ReceiptHandle": m["ReceiptHandle"]}),
        );
        assert_eq!(s, 200, "{r}");
    }
    let deadline = Instant::now() + IO_TIMEOUT;
    while sum(&scrape(metrics), "sluice_queue_messages_visible", &q) > 0.0 {
        assert!(Instant::now() < deadline, "could not drain the queue");
        let (_, got) = sqs(
            http,
            "ReceiveMessage",
            serde_json::json!({"QueueUrl": url, "MaxNumberOfMessages": 10}),
        );
        for m in got["Messages"].as_array().into_iter().flatten() {
            let (s, r) = sqs(
                http,
                "DeleteMessage",
                serde_json::json!({"QueueUrl": url, "ReceiptHandle": m["ReceiptHandle"]}),
            );
            assert_eq!(s, 200, "{r}");
        }
    }
    assert_eq!(sum(&scrape(metrics), age, &q), 0.0, "drained queue");
    broker.shutdown();
}

/// Consumer-group lag in `/metrics`: it goes up with produced records and down with commits,
/// per (group, topic) and per partition.
#[test]
fn group_lag_moves_with_produce_and_commit() {
    use sluice_broker::stream::TopicConfig;
    use sluice_storage::Record;
    const T: &str = "000000000000";
    let dir = tempfile::tempdir().expect("tmp");
    let (broker, _http, metrics) = start(dir.path());
    let produce = |n: usize| {
        broker.run_on(1, move |s| async move {
            let t = s.topic(T, "clicks").expect("topic");
            let recs = (0..n)
                .map(|i| Record::new(i as i64, format!("v{i}").into_bytes()))
                .collect();
            s.produce_records(&t, recs).await.expect("produce");
        })
    };
    let (member, generation) = broker.run_on(1, |s| async move {
        s.create_topic(
            T,
            "clicks",
            TopicConfig {
                partitions: 2,
                ..TopicConfig::default()
            },
        )
        .await
        .expect("create");
        let a = s
            .join_group(T, "billing", None, &["clicks".to_string()], 60_000)
            .await
            .expect("join");
        (a.member_id, a.generation)
    });
    let commit = |offsets: Vec<(String, u32, u64)>| {
        let (member, offsets) = (member.clone(), offsets);
        broker.run_on(0, move |s| async move {
            s.commit_offsets(T, "billing", &member, generation, &offsets)
                .await
                .expect("commit");
        })
    };
    let latest = |p: u32| {
        broker.run_on(0, move |s| async move {
            let t = s.topic(T, "clicks").expect("topic");
            s.list_offset(&t, p, sluice_broker::stream::OffsetSpec::Latest)
                .await
                .expect("latest")
        })
    };
    let g = [("tenant", T), ("group", "billing"), ("topic", "clicks")];
    // Committed at 0 on both partitions, nothing produced: lag 0.
    commit(vec![("clicks".into(), 0, 0), ("clicks".into(), 1, 0)]);
    let s = scrape(metrics);
    assert_eq!(sum(&s, "sluice_group_lag", &g), 0.0);
    assert_eq!(sum(&s, "sluice_group_lag_truncated", &[]), 0.0);

    produce(6);
    let s = scrape(metrics);
    assert_eq!(sum(&s, "sluice_group_lag", &g), 6.0);
    assert_eq!(sum(&s, "sluice_group_partition_lag", &g), 6.0);
    let (l0, l1) = (latest(0), latest(1));
    assert_eq!(l0 + l1, 6);
    assert_eq!(
        sum(
            &s,
            "sluice_group_partition_lag",
            &[g[0], g[1], g[2], ("partition", "0")]
        ),
        l0 as f64
    );

    // Commit partition 0 to its end: only partition 1's records still lag.
    commit(vec![("clicks".into(), 0, l0)]);
    let s = scrape(metrics);
    assert_eq!(sum(&s, "sluice_group_lag", &g), l1 as f64);
    commit(vec![("clicks".into(), 1, l1)]);
    assert_eq!(sum(&scrape(metrics), "sluice_group_lag", &g), 0.0);
    broker.shutdown();
}

/// Without per-queue labels (a broker of 10,000 queues), the broker-wide figures a dashboard
/// and its alerts need are still there, one series each: messages sent, received, deleted,
/// dead-lettered, the oldest message's age; and the publish→receive latency counts each
/// message's first delivery only, with the time it waited.
#[test]
fn broker_wide_figures_and_send_to_receive_latency_without_queue_labels() {
    const WAIT_MS: u64 = 60;
    let dir = tempfile::tempdir().expect("tmp");
    let (broker, http, metrics) = start_with(dir.path(), |c| c.metrics_queue_labels = false);
    let (status, created) = sqs(http, "CreateQueue", serde_json::json!({"QueueName": "w-q"}));
    assert_eq!(status, 200, "{created}");
    let url = created["QueueUrl"].as_str().expect("url").to_string();
    for i in 0..2 {
        let (s, r) = sqs(
            http,
            "SendMessage",
            serde_json::json!({"QueueUrl": url, "MessageBody": format!("m{i}")}),
        );
        assert_eq!(s, 200, "{r}");
    }
    std::thread::sleep(Duration::from_millis(WAIT_MS));
    let s = scrape(metrics);
    assert!(sum(&s, "sluice_oldest_message_age_seconds", &[]) >= WAIT_MS as f64 / 1e3);
    // Received with a visibility timeout of 0: each comes back at once, and its later
    // deliveries are not first deliveries.
    let mut seen = std::collections::BTreeSet::new();
    let mut deliveries = 0;
    let deadline = Instant::now() + IO_TIMEOUT;
    while seen.len() < 2 || deliveries < 4 {
        assert!(Instant::now() < deadline, "could not receive every message");
        let (_, got) = sqs(
            http,
            "ReceiveMessage",
            serde_json::json!({"QueueUrl": url, "MaxNumberOfMessages": 10, "VisibilityTimeout": 0}),
        );
        for m in got["Messages"].as_array().into_iter().flatten() {
            seen.insert(m["MessageId"].as_str().expect("id").to_string());
            deliveries += 1;
        }
    }
    let s = scrape(metrics);
    assert!(
        !s.iter().any(|(n, _, _)| n.starts_with("sluice_queue_")),
        "per-queue series are left out"
    );
    assert_eq!(sum(&s, "sluice_messages_sent_total", &[]), 2.0);
    assert_eq!(
        sum(&s, "sluice_messages_received_total", &[]),
        f64::from(deliveries)
    );
    assert_eq!(sum(&s, "sluice_messages_deleted_total", &[]), 0.0);
    assert_eq!(sum(&s, "sluice_messages_dead_lettered_total", &[]), 0.0);
    let latency = "sluice_message_send_to_receive_seconds";
    assert_eq!(
        sum(&s, &format!("{latency}_count"), &[]),
        2.0,
        "first deliveries only"
    );
    assert_eq!(
        sum(&s, &format!("{latency}_bucket"), &[("le", "+Inf")]),
        2.0
    );
    assert_eq!(
        sum(&s, &format!("{latency}_bucket"), &[("le", "0.001")]),
        0.0,
        "both waited {WAIT_MS} ms"
    );
    assert!(sum(&s, &format!("{latency}_sum"), &[]) >= 2.0 * WAIT_MS as f64 / 1e3);
    // Quota figures are exported (zero) even before any refusal, so that alerts see them.
    for q in ["requests_per_s", "bytes_per_s", "stored_bytes"] {
        assert!(s.iter().any(|(n, l, v)| n == "sluice_quota_throttled_total"
            && l.get("quota").map(String::as_str) == Some(q)
            && *v == 0.0));
    }
    broker.shutdown();
}

/// Quota refusals are counted per account and quota, and in total; without per-queue labels
/// only in total (the per-account series name accounts).
#[test]
fn quota_refusals_are_counted_per_account() {
    for labels in [true, false] {
        let dir = tempfile::tempdir().expect("tmp");
        let (broker, http, metrics) = start_with(dir.path(), |c| {
            c.metrics_queue_labels = labels;
            c.quotas.requests_per_s = Some(1);
        });
        let mut throttled = 0;
        for _ in 0..12 {
            let (s, r) = sqs(http, "ListQueues", serde_json::json!({}));
            if s != 200 {
                assert_eq!(s, 403, "{r}");
                assert!(r.to_string().contains("RequestThrottled"), "{r}");
                throttled += 1;
            }
        }
        assert!(
            throttled > 0,
            "a rate of 1/s must refuse some of 12 requests at once"
        );
        let s = scrape(metrics);
        let q = ("quota", "requests_per_s");
        assert_eq!(
            sum(&s, "sluice_quota_throttled_total", &[q]),
            f64::from(throttled)
        );
        assert_eq!(
            sum(
                &s,
                "sluice_quota_throttled_total",
                &[("quota", "bytes_per_s")]
            ),
            0.0
        );
        let per_account = sum(
            &s,
            "sluice_account_quota_throttled_total",
            &[("tenant", "000000000000"), q],
        );
        let want = if labels { f64::from(throttled) } else { 0.0 };
        assert_eq!(per_account, want, "labels {labels}");
        if !labels {
            assert!(!s
                .iter()
                .any(|(n, _, _)| n == "sluice_account_quota_throttled_total"));
        }
        broker.shutdown();
    }
}

/// Kafka requests are counted like the other front ends' (produce and fetch throughput).
#[test]
fn kafka_requests_are_counted() {
    let dir = tempfile::tempdir().expect("tmp");
    let (broker, _http, metrics) = start_with(dir.path(), |c| {
        c.kafka_addr = Some("127.0.0.1:0".parse().expect("addr"));
    });
    let kafka = broker.kafka_addr().expect("kafka listener");
    let mut s = TcpStream::connect(kafka).expect("connect");
    s.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
    // ApiVersions v0: api key 18, version 0, correlation id 7, null client id.
    let mut body = Vec::new();
    body.extend_from_slice(&18i16.to_be_bytes());
    body.extend_from_slice(&0i16.to_be_bytes());
    body.extend_from_slice(&7i32.to_be_bytes());
    body.extend_from_slice(&(-1i16).to_be_bytes());
    let mut frame = (body.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    s.write_all(&frame).expect("write");
    let mut len = [0u8; 4];
    s.read_exact(&mut len).expect("answer length");
    let mut answer = vec![0u8; i32::from_be_bytes(len) as usize];
    s.read_exact(&mut answer).expect("answer");
    assert_eq!(&answer[..4], &7i32.to_be_bytes(), "correlation id");
    let got = scrape(metrics);
    let api = [("frontend", "kafka"), ("action", "ApiVersions")];
    assert_eq!(sum(&got, "sluice_requests_total", &api), 1.0);
    assert_eq!(
        sum(&got, "sluice_request_duration_seconds_count", &api),
        1.0
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
