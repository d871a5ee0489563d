//! The storage benchmark: 2 KiB records appended with group commit by N concurrent appenders on
//! one glommio executor; throughput and append-to-durable latency. fsync policy: every append
//! is acknowledged only after the fdatasync that covers it (fsync before ack).

use hdrhistogram::Histogram;
use serde::Serialize;
use sluice_storage::fs::DmaFs;
use sluice_storage::{rt, Log, LogConfig};
use sluice_wire::batch::Record;
use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Serialize)]
pub struct StorageResult {
    pub concurrency: usize,
    pub record_bytes: usize,
    pub seconds: f64,
    pub appends_per_s: f64,
    pub mb_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub commits_per_s: f64,
    pub batches_per_commit: f64,
    pub fsync_policy: &'static str,
}

pub fn run(
    dir: PathBuf,
    concurrency: usize,
    record_bytes: usize,
    records_per_append: usize,
    seconds: f64,
    warmup: f64,
) -> Result<StorageResult, String> {
    rt::run("storage-bench", move || async move {
        let data = dir.join(format!("bench-c{concurrency}"));
        let _ = std::fs::remove_dir_all(&data);
        let fs = DmaFs::new(&dir).await.map_err(|e| e.to_string())?;
        let log = Rc::new(
            Log::open(fs, &data, LogConfig::default())
                .await
                .map_err(|e| e.to_string())?,
        );
        let hist = Rc::new(RefCell::new(
            Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds"),
        ));
        let start = Instant::now();
        let measure_from = start + Duration::from_secs_f64(warmup);
        let end = measure_from + Duration::from_secs_f64(seconds);
        let counted = Rc::new(RefCell::new((0u64, 0u64)));
        let stats_at = Rc::new(RefCell::new(None));
        let mut tasks = Vec::new();
        for t in 0..concurrency {
            let log = log.clone();
            let hist = hist.clone();
            let counted = counted.clone();
            let stats_at = stats_at.clone();
            tasks.push(glommio::spawn_local(async move {
                // The batch is encoded once, as a producer sends it; each append clones it
                // (standing in for the copy out of the network buffer), and the log verifies,
                // stages and commits it — what the broker does with a produced batch.
                let value = vec![(t % 251) as u8; record_bytes];
                let records: Vec<Record> = (0..records_per_append.max(1))
                    .map(|_| Record::new(0, value.clone()))
                    .collect();
                let batch = sluice_wire::batch::encode(&records).expect("not empty");
                loop {
                    let now = Instant::now();
                    if now >= end {
                        break;
                    }
                    let info = log.append(batch.clone()).await;
                    let done = Instant::now();
                    if info.is_err() {
                        break;
                    }
                    if now >= measure_from {
                        if stats_at.borrow().is_none() {
                            *stats_at.borrow_mut() = Some(log.stats());
                        }
                        let us = done.duration_since(now).as_micros() as u64;
                        let _ = hist.borrow_mut().record(us.max(1));
                        let mut c = counted.borrow_mut();
                        c.0 += 1;
                        c.1 += (record_bytes * records_per_append) as u64;
                    }
                }
            }));
        }
        for t in tasks {
            t.await;
        }
        let elapsed = seconds;
        let s1 = log.stats();
        let s0 = stats_at.borrow().clone().unwrap_or_default();
        let h = hist.borrow();
        let (n, bytes) = *counted.borrow();
        let commits = (s1.commits - s0.commits) as f64;
        let _ = std::fs::remove_dir_all(&data);
        Ok(StorageResult {
            concurrency,
            record_bytes,
            seconds: elapsed,
            appends_per_s: n as f64 / elapsed,
            mb_per_s: bytes as f64 / elapsed / 1e6,
            p50_us: h.value_at_quantile(0.50) as f64,
            p99_us: h.value_at_quantile(0.99) as f64,
            p999_us: h.value_at_quantile(0.999) as f64,
            max_us: h.max() as f64,
            commits_per_s: commits / elapsed,
            batches_per_commit: if commits > 0.0 {
                n as f64 / commits
            } else {
                0.0
            },
            fsync_policy: "fdatasync before every ack (group commit)",
        })
    })
    .map_err(|e| e.to_string())?
}
