//! A minimal SQS client over HTTP/1.1 keep-alive (AWS JSON 1.0, no request signing: the embedded
//! broker's default has auth off). Shared by the HTTP-vs-QUIC scenario and the `sluice-http`
//! target, so both speak to the broker exactly the same way.

use serde_json::Value;
use std::net::SocketAddr;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Largest answer body accepted (ten 1 MiB messages and their attributes fit).
const RESPONSE_BYTES_MAX: usize = 16 * 1024 * 1024;

pub struct HttpConn {
    stream: BufReader<TcpStream>,
    host: String,
}

impl HttpConn {
    pub async fn connect(addr: SocketAddr) -> Result<HttpConn, String> {
        let s = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        s.set_nodelay(true).map_err(|e| format!("nodelay: {e}"))?;
        Ok(HttpConn {
            stream: BufReader::new(s),
            host: addr.to_string(),
        })
    }

    /// One AWS JSON 1.0 call (`X-Amz-Target: AmazonSQS.<action>`) on the keep-alive
    /// connection. A non-200 answer is an error carrying the answer's body.
    pub async fn call(&mut self, action: &str, body: &Value) -> Result<Value, String> {
        let io = |e: std::io::Error| format!("{action}: {e}");
        let body = serde_json::to_vec(body).map_err(|e| e.to_string())?;
        let head = format!(
            "POST / HTTP/1.1\r\nHost: {}\r\nX-Amz-Target: AmazonSQS.{action}\r\n\
             Content-Type: application/x-amz-json-1.0\r\nContent-Length: {}\r\n\r\n",
            self.host,
            body.len()
        );
        let s = self.stream.get_mut();
        s.write_all(head.as_bytes()).await.map_err(io)?;
        s.write_all(&body).await.map_err(io)?;
        let mut status = String::new();
        if self.stream.read_line(&mut status).await.map_err(io)? == 0 {
            return Err(format!("{action}: connection closed"));
        }
        let mut len = 0usize;
        loop {
            let mut line = String::new();
            if self.stream.read_line(&mut line).await.map_err(io)? == 0 {
                return Err(format!("{action}: connection closed in headers"));
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v
                        .trim()
                        .parse()
                        .map_err(|_| format!("{action}: bad content-length {v:?}"))?;
                }
            }
        }
        if len > RESPONSE_BYTES_MAX {
            return Err(format!("{action}: answer of {len} bytes is over the limit"));
        }
        let mut buf = vec![0u8; len];
        self.stream.read_exact(&mut buf).await.map_err(io)?;
        if !status.contains(" 200 ") {
            return Err(format!(
                "{action}: {} {}",
                status.trim_end(),
                String::from_utf8_lossy(&buf)
            ));
        }
        serde_json::from_slice(&buf).map_err(|e| format!("{action}: answer is not JSON: {e}"))
    }
}
