//! SendMessageBatch → ReceiveMessage → DeleteMessageBatch (10 messages of 2 KiB each) through
//! the SQS HTTP API and through the native QUIC protocol, against one in-process broker, in the
//! same run. Both clients run the same number of concurrent workers on a one-thread tokio
//! runtime: HTTP workers each keep one HTTP/1.1 keep-alive connection (AWS JSON 1.0, auth off as
//! in the embedded default); QUIC workers share one SDK connection (pipelined streams).

use crate::sqs_http::HttpConn;
use serde::Serialize;
use serde_json::{json, Value};
use sluice_broker::config::BrokerConfig;
use sluice_sdk::types::SendMessageBatchRequestEntry;
use sluice_sdk::{Client, ClientOptions, ReceiveOptions, Trust};
use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

const BODY_BYTES: usize = 2048;
const BATCH: usize = 10;

#[derive(Debug, Clone, Serialize)]
pub struct PathResult {
    pub path: &'static str,
    pub workers: usize,
    pub seconds: f64,
    /// Messages sent, received and deleted per second.
    pub messages_per_s: f64,
    pub mb_per_s: f64,
    pub fsync_policy: &'static str,
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Runs both paths, HTTP first, each for `seconds` after a short warm-up.
pub fn run(dir: &std::path::Path, workers: usize, seconds: f64) -> Vec<PathResult> {
    let _ = std::fs::remove_dir_all(dir);
    let mut c = BrokerConfig::ephemeral(dir.to_path_buf()).expect("config");
    let http_port = free_port();
    c.http_addr = format!("127.0.0.1:{http_port}").parse().expect("addr");
    c.quic_addr = "127.0.0.1:0".parse().expect("addr");
    c.metrics_addr = "127.0.0.1:0".parse().expect("addr");
    c.kafka_addr = None;
    let broker = sluice_broker::server::start(c).expect("start broker");
    broker.wait_ready().expect("ready");
    let quic = broker.quic_addr();
    let cert = dir.join("quic-selfsigned-cert.pem");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let local = tokio::task::LocalSet::new();
    let results = local.block_on(&rt, async move {
        let http = http_path(http_port, workers, seconds).await;
        let quic = quic_path(quic, cert, workers, seconds).await;
        vec![http, quic]
    });
    broker.shutdown();
    let _ = std::fs::remove_dir_all(dir);
    results
}

fn result(path: &'static str, workers: usize, moved: u64, elapsed: f64) -> PathResult {
    PathResult {
        path,
        workers,
        seconds: elapsed,
        messages_per_s: moved as f64 / elapsed,
        mb_per_s: moved as f64 * BODY_BYTES as f64 / elapsed / 1e6,
        fsync_policy: "fdatasync before every ack (group commit)",
    }
}

// ------------------------------------------------------------------------------------ HTTP

async fn connect_http(port: u16) -> HttpConn {
    HttpConn::connect(([127, 0, 0, 1], port).into())
        .await
        .expect("connect http")
}

async fn http_path(port: u16, workers: usize, seconds: f64) -> PathResult {
    let mut admin = connect_http(port).await;
    let url = admin
        .call("CreateQueue", &json!({"QueueName": "bench-http"}))
        .await
        .expect("create queue")["QueueUrl"]
        .as_str()
        .expect("url")
        .to_string();
    let body = "x".repeat(BODY_BYTES);
    let moved = Rc::new(Cell::new(0u64));
    let warm_until = Instant::now() + Duration::from_secs(1);
    let end = warm_until + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let (url, body, moved) = (url.clone(), body.clone(), moved.clone());
        tasks.push(tokio::task::spawn_local(async move {
            let mut c = connect_http(port).await;
            while Instant::now() < end {
                let entries: Vec<Value> = (0..BATCH)
                    .map(|i| json!({"Id": format!("e{i}"), "MessageBody": body}))
                    .collect();
                c.call(
                    "SendMessageBatch",
                    &json!({"QueueUrl": url, "Entries": entries}),
                )
                .await
                .expect("send batch");
                let got = c
                    .call(
                        "ReceiveMessage",
                        &json!({"QueueUrl": url, "MaxNumberOfMessages": BATCH, "WaitTimeSeconds": 1}),
                    )
                    .await
                    .expect("receive");
                let handles: Vec<Value> = got["Messages"]
                    .as_array()
                    .map(|m| {
                        m.iter()
                            .enumerate()
                            .map(|(i, m)| {
                                json!({"Id": format!("d{i}"), "ReceiptHandle": m["ReceiptHandle"]})
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                if handles.is_empty() {
                    continue;
                }
                let n = handles.len() as u64;
                c.call(
                    "DeleteMessageBatch",
                    &json!({"QueueUrl": url, "Entries": handles}),
                )
                .await
                .expect("delete batch");
                if Instant::now() >= warm_until {
                    moved.set(moved.get() + n);
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("http worker");
    }
    result("HTTP (SQS JSON 1.0)", workers, moved.get(), seconds)
}

// ------------------------------------------------------------------------------------ QUIC

async fn quic_path(
    addr: std::net::SocketAddr,
    cert: std::path::PathBuf,
    workers: usize,
    seconds: f64,
) -> PathResult {
    let client = Client::connect(addr, ClientOptions::new(Trust::PemFile(cert)))
        .await
        .expect("connect quic");
    let url = client.create_queue("bench-quic").await.expect("queue");
    let body = "x".repeat(BODY_BYTES);
    let moved = Rc::new(Cell::new(0u64));
    let warm_until = Instant::now() + Duration::from_secs(1);
    let end = warm_until + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let (client, url, body, moved) = (client.clone(), url.clone(), body.clone(), moved.clone());
        tasks.push(tokio::task::spawn_local(async move {
            while Instant::now() < end {
                let entries = (0..BATCH)
                    .map(|i| SendMessageBatchRequestEntry {
                        id: format!("e{i}"),
                        message_body: body.clone(),
                        ..Default::default()
                    })
                    .collect();
                client.send_batch(&url, entries).await.expect("send batch");
                let got = client
                    .receive(&url, ReceiveOptions::long_poll(BATCH as u32, 1))
                    .await
                    .expect("receive");
                if got.is_empty() {
                    continue;
                }
                let handles: Vec<String> = got.into_iter().map(|m| m.receipt_handle).collect();
                let n = handles.len() as u64;
                client
                    .delete_batch(&url, &handles)
                    .await
                    .expect("delete batch");
                if Instant::now() >= warm_until {
                    moved.set(moved.get() + n);
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("quic worker");
    }
    result("native QUIC (SDK)", workers, moved.get(), seconds)
}
