//! Helpers shared by the SDK's test binaries.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

/// The broker's Prometheus text, read with a plain HTTP/1.1 GET (bounded: 10 s).
pub fn scrape_metrics(metrics: SocketAddr) -> String {
    let mut s = std::net::TcpStream::connect(metrics).expect("metrics");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("write");
    let mut body = String::new();
    s.read_to_string(&mut body).expect("read");
    body
}
