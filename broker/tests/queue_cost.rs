//! What an empty queue costs on disk (CONTRACT.md C8: nothing grows without bound; issue 24:
//! an empty queue costs kilobytes, not megabytes). 10,000 CreateQueue calls through the service
//! API on real shards and real DMA files, measured as the blocks the file system holds for the
//! data directory (`st_blocks`, what `du` counts), stopped as soon as they pass the bound.

// A test is the broker's outside world: it times the broker with its own clocks (deadlines,
// waits, latencies). broker/clippy.toml's clock seam governs the broker's code, not this.
#![allow(clippy::disallowed_methods)]

use sluice_broker::config::BrokerConfig;
use sluice_broker::metadata::DEFAULT_TENANT as T;
use sluice_broker::server;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

const QUEUES: usize = 10_000;
/// Disk the 10,000 empty queues may take (issue 24: under 1 GiB).
const DISK_BYTES_MAX: u64 = 1 << 30;
/// CreateQueue calls in flight at once (their metadata records share group commits).
const CONCURRENT: usize = 250;
/// Bound on the whole run: a hang or a slow path is a failure, not a stuck CI job.
const DEADLINE: Duration = Duration::from_secs(600);

/// Bytes the file system allocates for everything under `path` (`du`'s sum of `st_blocks`).
fn du_bytes(path: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![path.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue; // removed meanwhile (temporary files)
        };
        total += m.blocks() * 512;
        if m.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                stack.extend(rd.flatten().map(|e| e.path()));
            }
        }
    }
    total
}

#[test]
fn ten_thousand_empty_queues_cost_under_a_gibibyte_of_disk() {
    let tmp = tempfile::tempdir().expect("tmp");
    let data = tmp.path().join("data");
    let mut c = BrokerConfig::ephemeral(data.clone()).expect("config");
    // One partition per queue: 10,000 partitions hold 10,000 open segment files, within the
    // descriptor limit of a test process (20,000 here); a queue of n partitions costs n times
    // the per-partition figure printed below.
    c.shards = 2;
    c.default_partitions = 1;
    c.http_addr = "127.0.0.1:0".parse().expect("addr");
    c.quic_addr = "127.0.0.1:0".parse().expect("addr");
    c.metrics_addr = "127.0.0.1:0".parse().expect("addr");
    let b = server::start(c).expect("start");
    b.wait_ready().expect("ready");
    let before = du_bytes(&data);
    let started = Instant::now();
    let mut created = 0;
    let mut used = 0;
    while created < QUEUES {
        let from = created;
        let n = CONCURRENT.min(QUEUES - created);
        b.run_on(created / CONCURRENT % 2, move |s| async move {
            let creates = (from..from + n).map(|i| {
                let s = s.clone();
                async move {
                    s.create_queue(T, &format!("q{i:05}"), BTreeMap::new(), BTreeMap::new())
                        .await
                        .unwrap_or_else(|e| panic!("CreateQueue q{i:05}: {e}"));
                }
            });
            futures::future::join_all(creates).await;
        });
        created += n;
        used = du_bytes(&data).saturating_sub(before);
        // Stop at the bound: the old cost (4 MiB per partition) would fill the disk.
        assert!(
            used < DISK_BYTES_MAX,
            "{created} empty queues took {used} bytes of disk ({} per queue)",
            used / created as u64
        );
        assert!(
            started.elapsed() < DEADLINE,
            "{created} CreateQueue calls took {:?}",
            started.elapsed()
        );
    }
    let took = started.elapsed();
    println!(
        "{QUEUES} empty queues (1 partition each): {used} bytes of disk, {} bytes per queue; \
         created in {took:?}",
        used / QUEUES as u64
    );
    b.shutdown();
}
