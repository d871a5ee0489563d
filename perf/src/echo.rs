//! The transport's floor: request round trips on a plain quinn echo server (tokio, its own
//! thread, the broker's own TLS setup), driven open loop at the scenario's rate by the same
//! generator timer, latency from the intended send time — what one publish→receive could cost
//! if the broker did nothing but answer.

use crate::loadgen::Pcts;
use hdrhistogram::Histogram;
use sluice_broker::quic::tls;
use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Largest echoed request.
const ECHO_BYTES_MAX: usize = 1024 * 1024;
/// Round trips in flight before the driver waits (the wait shows as latency).
const IN_FLIGHT_MAX: usize = 4096;

/// Measures `seconds` (after `warmup`) of `bytes`-sized round trips at `rate_per_s`.
pub async fn floor(
    dir: &std::path::Path,
    rate_per_s: f64,
    bytes: usize,
    warmup: Duration,
    seconds: Duration,
) -> Result<Pcts, String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let (identity, _) = tls::load_or_create_self_signed(dir).map_err(|e| e.to_string())?;
    let server_config = tls::quinn_server_config(&identity, None).map_err(|e| e.to_string())?;
    let client_config =
        tls::client_config_trusting(&[identity.leaf().clone()], None).map_err(|e| e.to_string())?;
    let (addr_tx, addr_rx) = tokio::sync::oneshot::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("echo runtime");
        rt.block_on(async move {
            let ep = match quinn::Endpoint::server(server_config, ([127, 0, 0, 1], 0).into()) {
                Ok(ep) => ep,
                Err(e) => {
                    let _ = addr_tx.send(Err(e.to_string()));
                    return;
                }
            };
            let _ = addr_tx.send(ep.local_addr().map_err(|e| e.to_string()));
            let serve = async {
                while let Some(incoming) = ep.accept().await {
                    tokio::spawn(async move {
                        let Ok(conn) = incoming.await else { return };
                        while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                            tokio::spawn(async move {
                                if let Ok(buf) = recv.read_to_end(ECHO_BYTES_MAX).await {
                                    let _ = send.write_all(&buf).await;
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
    let addr = addr_rx
        .await
        .map_err(|_| "echo server died".to_string())??;
    let mut ep = quinn::Endpoint::client(([127, 0, 0, 1], 0).into()).map_err(|e| e.to_string())?;
    ep.set_default_client_config(client_config);
    let conn = ep
        .connect(addr, "localhost")
        .map_err(|e| e.to_string())?
        .await
        .map_err(|e| e.to_string())?;
    let hist = Rc::new(RefCell::new(
        Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("bounds"),
    ));
    let errors = Rc::new(RefCell::new(None::<String>));
    let body = Rc::new(vec![b'e'; bytes.min(ECHO_BYTES_MAX)]);
    let permits = std::sync::Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT_MAX));
    let start = Instant::now();
    let warm_end = start + warmup;
    let end = warm_end + seconds;
    let step = Duration::from_secs_f64(1.0 / rate_per_s.max(1e-3));
    let mut t = start;
    let clock = crate::clock::Clock::start();
    while t < end {
        clock.sleep_until(t).await;
        let permit = permits.clone().acquire_owned().await.expect("never closed");
        let (conn, hist, errors, body) = (conn.clone(), hist.clone(), errors.clone(), body.clone());
        let intended = t;
        tokio::task::spawn_local(async move {
            let r: Result<(), String> = async {
                let (mut s, mut r) = conn.open_bi().await.map_err(|e| e.to_string())?;
                s.write_all(&body).await.map_err(|e| e.to_string())?;
                s.finish().map_err(|e| e.to_string())?;
                let back = r
                    .read_to_end(ECHO_BYTES_MAX)
                    .await
                    .map_err(|e| e.to_string())?;
                if back.len() != body.len() {
                    return Err("short echo".into());
                }
                Ok(())
            }
            .await;
            match r {
                Ok(()) if intended >= warm_end => {
                    let us = intended.elapsed().as_micros() as u64;
                    hist.borrow_mut().saturating_record(us);
                }
                Ok(()) => {}
                Err(e) => {
                    errors.borrow_mut().get_or_insert(e);
                }
            }
            drop(permit);
        });
        t += step;
    }
    let _all = permits
        .acquire_many(IN_FLIGHT_MAX as u32)
        .await
        .expect("never closed");
    conn.close(0u32.into(), b"done");
    let _ = stop_tx.send(());
    let _ = server.join();
    if let Some(e) = errors.borrow().clone() {
        return Err(format!("echo: {e}"));
    }
    let h = hist.borrow();
    Ok(Pcts::of(&h))
}
