//! The QUIC floor of a consume (issue 29): a plain quinn server (tokio, its own thread, the
//! broker's TLS and MTU bound) answers each small request with `response_bytes` it holds in
//! memory, as a fetch of 1,000 × 2 KiB records answers with the stored batches; clients keep
//! `in_flight` requests outstanding per connection. The server thread's CPU per 2 KiB of
//! response is what QUIC alone costs a consumed record (encryption, packets, acks), the floor
//! beside which the broker's server CPU per consumed record is read.

use serde::Serialize;
use sluice_broker::quic::tls;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes a request carries (the size of a fetch request, about).
const REQUEST_BYTES: usize = 64;

#[derive(Debug, Clone, Serialize)]
pub struct QuicFloor {
    pub response_bytes: usize,
    pub record_bytes: usize,
    pub connections: usize,
    pub in_flight: usize,
    pub measured_s: f64,
    pub responses: u64,
    /// `response_bytes / record_bytes` records per response, per second.
    pub records_per_s: f64,
    pub mb_per_s: f64,
    /// The server thread's CPU in the window, seconds.
    pub server_cpu_s: Option<f64>,
    pub server_cpu_us_per_record: Option<f64>,
    /// The client thread's CPU in the window (the measuring thread: receive and decrypt).
    pub client_cpu_us_per_record: Option<f64>,
}

/// A thread's CPU time so far (ns), from its `schedstat`.
fn thread_ns(tid: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// This thread's id, as `/proc/self/task/<tid>` names it.
fn my_tid() -> Option<String> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    link.file_name().map(|n| n.to_string_lossy().to_string())
}

fn transport() -> quinn::TransportConfig {
    let mut t = quinn::TransportConfig::default();
    let mut mtu = quinn::MtuDiscoveryConfig::default();
    mtu.upper_bound(sluice_wire::handshake::QUIC_UDP_PAYLOAD_UPPER_BOUND);
    t.mtu_discovery_config(Some(mtu));
    t
}

pub async fn run(
    dir: &std::path::Path,
    response_bytes: usize,
    record_bytes: usize,
    connections: usize,
    in_flight: usize,
    warmup: Duration,
    seconds: Duration,
) -> Result<QuicFloor, String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let (identity, _) = tls::load_or_create_self_signed(dir).map_err(|e| e.to_string())?;
    let mut server_config = tls::quinn_server_config(&identity, None).map_err(|e| e.to_string())?;
    server_config.transport_config(Arc::new(transport()));
    let mut client_config =
        tls::client_config_trusting(&[identity.leaf().clone()], None).map_err(|e| e.to_string())?;
    client_config.transport_config(Arc::new(transport()));
    let (addr_tx, addr_rx) = tokio::sync::oneshot::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let body = bytes::Bytes::from(vec![b'r'; response_bytes]);
    let server = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("floor runtime");
        rt.block_on(async move {
            let ep = match quinn::Endpoint::server(server_config, ([127, 0, 0, 1], 0).into()) {
                Ok(ep) => ep,
                Err(e) => {
                    let _ = addr_tx.send(Err(e.to_string()));
                    return;
                }
            };
            let addr = ep.local_addr().map_err(|e| e.to_string());
            let _ = addr_tx.send(addr.map(|a| (a, my_tid())));
            let serve = async {
                while let Some(incoming) = ep.accept().await {
                    let body = body.clone();
                    tokio::spawn(async move {
                        let Ok(conn) = incoming.await else { return };
                        while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                            let body = body.clone();
                            tokio::spawn(async move {
                                if recv.read_to_end(REQUEST_BYTES).await.is_ok() {
                                    // The answer's bytes as they are held (no copy).
                                    let _ = send.write_chunk(body).await;
                                    let _ = send.finish();
                                }
                            });
                        }
                    });
                }
            };
            tokio::select! {
                _ = serve => {}
                _ = stop_rx => {}
            }
            ep.close(0u32.into(), b"done");
        });
    });
    let (addr, server_tid) = addr_rx
        .await
        .map_err(|_| "floor server died".to_string())??;
    let mut ep = quinn::Endpoint::client(([127, 0, 0, 1], 0).into()).map_err(|e| e.to_string())?;
    ep.set_default_client_config(client_config);
    let mut conns = Vec::new();
    for _ in 0..connections.max(1) {
        conns.push(
            ep.connect(addr, "localhost")
                .map_err(|e| e.to_string())?
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    let start = Instant::now();
    let warm_end = start + warmup;
    let end = warm_end + seconds;
    let counted = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut lanes = Vec::new();
    for c in &conns {
        for _ in 0..in_flight.max(1) {
            let (c, counted) = (c.clone(), counted.clone());
            lanes.push(async move {
                let request = [b'q'; REQUEST_BYTES];
                while Instant::now() < end {
                    let (mut s, mut r) = c.open_bi().await.map_err(|e| e.to_string())?;
                    s.write_all(&request).await.map_err(|e| e.to_string())?;
                    s.finish().map_err(|e| e.to_string())?;
                    let back = r
                        .read_to_end(response_bytes + 1)
                        .await
                        .map_err(|e| e.to_string())?;
                    if back.len() != response_bytes {
                        return Err("short answer".to_string());
                    }
                    let now = Instant::now();
                    if now >= warm_end && now < end {
                        counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
                Ok::<(), String>(())
            });
        }
    }
    let client_tid = my_tid();
    let cpu = async {
        tokio::time::sleep_until(warm_end.into()).await;
        let s0 = server_tid.as_deref().and_then(thread_ns);
        let c0 = client_tid.as_deref().and_then(thread_ns);
        tokio::time::sleep_until(end.into()).await;
        let s1 = server_tid.as_deref().and_then(thread_ns);
        let c1 = client_tid.as_deref().and_then(thread_ns);
        let d = |a: Option<u64>, b: Option<u64>| Some((b? - a?) as f64 / 1e9);
        (d(s0, s1), d(c0, c1))
    };
    let (results, (server_cpu_s, client_cpu_s)) =
        futures::future::join(futures::future::join_all(lanes), cpu).await;
    for c in &conns {
        c.close(0u32.into(), b"done");
    }
    let _ = stop_tx.send(());
    let _ = server.join();
    if let Some(Err(e)) = results.into_iter().find(|r| r.is_err()) {
        return Err(format!("quic floor: {e}"));
    }
    let responses = counted.load(std::sync::atomic::Ordering::Relaxed);
    let secs = seconds.as_secs_f64();
    let records = responses as f64 * (response_bytes as f64 / record_bytes.max(1) as f64);
    let per_record = |cpu: Option<f64>| cpu.filter(|_| records > 0.0).map(|s| s * 1e6 / records);
    Ok(QuicFloor {
        response_bytes,
        record_bytes,
        connections,
        in_flight,
        measured_s: secs,
        responses,
        records_per_s: records / secs,
        mb_per_s: responses as f64 * response_bytes as f64 / secs / 1e6,
        server_cpu_s,
        server_cpu_us_per_record: per_record(server_cpu_s),
        client_cpu_us_per_record: per_record(client_cpu_s),
    })
}

pub fn render(r: &QuicFloor) -> String {
    let us = |u: Option<f64>| u.map_or("–".into(), |u| format!("{u:.2}"));
    format!(
        "# QUIC floor of a consume\n\n\
         A plain quinn server (tokio, one thread, the broker's TLS and MTU bound of {} B) answers \
         each {REQUEST_BYTES}-byte request with {} bytes from memory ({} records of {} B); {} \
         connection(s) × {} request(s) in flight, {:.1} s measured.\n\n\
         | responses | records/s | MB/s | server thread CPU, cores | server µs/record | client µs/record |\n\
         |---|---|---|---|---|---|\n\
         | {} | {:.0} | {:.0} | {} | {} | {} |\n",
        sluice_wire::handshake::QUIC_UDP_PAYLOAD_UPPER_BOUND,
        r.response_bytes,
        r.response_bytes / r.record_bytes.max(1),
        r.record_bytes,
        r.connections,
        r.in_flight,
        r.measured_s,
        r.responses,
        r.records_per_s,
        r.mb_per_s,
        r.server_cpu_s
            .map_or("–".into(), |c| format!("{:.2}", c / r.measured_s)),
        us(r.server_cpu_us_per_record),
        us(r.client_cpu_us_per_record),
    )
}
