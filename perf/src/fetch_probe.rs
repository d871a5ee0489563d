//! `sluice-perf fetch-probe` (issue 29): where one fetch's time goes. A broker in process (one
//! shard, fdatasync before every produce ack) holds one partition of `records` × `record_bytes`
//! (produced in ~512 KiB batches, so the fetch is served from the tail cache); one client then fetches all of it
//! from offset 0, `fetches` times one after another, for each stream receive window asked
//! (`ClientOptions::stream_receive_window`; quinn's default is 1,250,000 B). Per fetch: the
//! call (request out, answer in and decoded into its frame: broker + QUIC) and the SDK's
//! verification and copy of the records, timed apart.

use std::time::{Duration, Instant};

use serde::Serialize;
use sluice_sdk::types::{CreateTopicRequest, FetchRequest, Request, Response};
use sluice_sdk::{Client, ClientOptions, Trust};
use sluice_wire::batch::BatchBuilder;

#[derive(Debug, Clone, Serialize)]
pub struct ProbeRow {
    pub stream_receive_window: u32,
    pub fetches: usize,
    pub answer_bytes: usize,
    /// The call, ms: p50, p90, max.
    pub call_ms: [f64; 3],
    /// Verifying and copying the answer's records in the SDK, ms: p50, p90, max.
    pub decode_ms: [f64; 3],
    /// Answer bytes over the call's p50.
    pub mb_per_s_at_p50: f64,
}

fn quantiles(mut v: Vec<f64>) -> [f64; 3] {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    [at(0.5), at(0.9), at(1.0)]
}

pub async fn run(
    dir: &std::path::Path,
    records: usize,
    record_bytes: usize,
    fetches: usize,
    windows: &[u32],
) -> Result<Vec<ProbeRow>, String> {
    let broker = crate::sluice::InProcess::start(dir, 1, false)?;
    let addr = broker.endpoints.quic.ok_or("no QUIC address")?;
    let cert = broker.endpoints.cert.clone().ok_or("no certificate")?;
    let connect = |window: u32| {
        let cert = cert.clone();
        async move {
            let options = ClientOptions {
                stream_receive_window: window,
                ..ClientOptions::new(Trust::PemFile(cert))
            };
            Client::connect(addr, options)
                .await
                .map_err(|e| format!("connect: {e}"))
        }
    };
    let admin = connect(sluice_wire::FRAME_BYTES_MAX as u32).await?;
    admin
        .create_topic(CreateTopicRequest {
            name: "probe".into(),
            partitions: 1,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("create topic: {e}"))?;
    // Batches of up to ~512 KiB (a produce request frame is limited to ~1.2 MiB).
    let body = vec![b'p'; record_bytes];
    let per_batch = ((512 << 10) / record_bytes.max(1)).max(1);
    let mut left = records;
    while left > 0 {
        let n = left.min(per_batch);
        let mut b = BatchBuilder::default();
        for _ in 0..n {
            b.push_parts(0, None, &body, std::iter::empty());
        }
        let batch = b.finish().ok_or("empty batch")?;
        admin
            .produce_batch("probe", Some(0), batch)
            .await
            .map_err(|e| format!("produce: {e}"))?;
        left -= n;
    }
    let mut rows = Vec::new();
    for &window in windows {
        let client = connect(window).await?;
        let (mut calls, mut decodes, mut answer_bytes) = (Vec::new(), Vec::new(), 0);
        // One unmeasured fetch first (connection warm, congestion window opened).
        for i in 0..=fetches {
            let r = FetchRequest {
                topic: "probe".into(),
                partition: 0,
                offset: 0,
                max_bytes: (records * (record_bytes + 64)).min(8 << 20) as u32,
                max_records: records as u32,
                wait_ms: 0,
            };
            let t = Instant::now();
            let answer = client
                .call(Request::Fetch(r))
                .await
                .map_err(|e| format!("fetch: {e}"))?;
            let call = t.elapsed();
            let Response::Fetch(f) = answer else {
                return Err("not a fetch answer".into());
            };
            let t = Instant::now();
            let got = sluice_sdk::stream::decode_batches("probe", 0, &f.batches, 0)
                .map_err(|e| format!("decode: {e}"))?;
            let decode = t.elapsed();
            if got.len() != records {
                return Err(format!("fetched {} of {records} records", got.len()));
            }
            if i > 0 {
                answer_bytes = f.batches.len();
                calls.push(ms(call));
                decodes.push(ms(decode));
            }
        }
        let call_ms = quantiles(calls);
        rows.push(ProbeRow {
            stream_receive_window: window,
            fetches,
            answer_bytes,
            call_ms,
            decode_ms: quantiles(decodes),
            mb_per_s_at_p50: answer_bytes as f64 / 1e6 / (call_ms[0] / 1e3),
        });
        client.close().await;
    }
    admin.close().await;
    drop(broker);
    Ok(rows)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub fn render(rows: &[ProbeRow]) -> String {
    let mut s = String::from(
        "# Fetch probe\n\n\
         One client fetches one partition's tail (in the broker's cache) from offset 0, one \
         fetch at a time.\n\n\
         | stream receive window, B | fetches | answer, B | call p50 / p90 / max, ms | SDK decode p50 / p90 / max, ms | MB/s at the call's p50 |\n\
         |---|---|---|---|---|---|\n",
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {:.2} / {:.2} / {:.2} | {:.2} / {:.2} / {:.2} | {:.0} |\n",
            r.stream_receive_window,
            r.fetches,
            r.answer_bytes,
            r.call_ms[0],
            r.call_ms[1],
            r.call_ms[2],
            r.decode_ms[0],
            r.decode_ms[1],
            r.decode_ms[2],
            r.mb_per_s_at_p50,
        ));
    }
    s
}
