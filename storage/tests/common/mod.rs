//! Shared helpers for the storage tests.
#![allow(dead_code)]

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sluice_storage::batch::{self, Record};
use sluice_storage::LogConfig;
use std::future::Future;

/// The seed of a random test: `SLUICE_SEED` if set, else fresh. Printed on failure by
/// [`with_seed`].
pub fn seed() -> u64 {
    match std::env::var("SLUICE_SEED") {
        Ok(s) => s.parse().expect("SLUICE_SEED must be a u64"),
        Err(_) => rand::random(),
    }
}

/// Runs `f(seed)`; on panic, prints the seed to replay it and re-raises.
pub fn with_seed(name: &str, f: impl FnOnce(u64) + std::panic::UnwindSafe) {
    let s = seed();
    if let Err(e) = std::panic::catch_unwind(move || f(s)) {
        eprintln!("\n*** {name} failed with seed {s}: rerun with SLUICE_SEED={s} ***\n");
        std::panic::resume_unwind(e);
    }
}

pub fn rng(seed: u64) -> SmallRng {
    SmallRng::seed_from_u64(seed)
}

/// Small segments and buffers so that tests roll, evict and recover often.
pub fn small_config() -> LogConfig {
    LogConfig {
        segment_bytes_max: 64 * 1024,
        segment_age_ms_max: None,
        index_interval_bytes: 512,
        prealloc_chunk_bytes: 16 * 1024,
        // Segments start one block zeroed and grow (zero-ahead) as data comes.
        prealloc_initial_bytes: 4 * 1024,
        write_buffer_bytes_max: 32 * 1024,
        batch_bytes_max: 16 * 1024,
        // Batches of the tests are up to ~5 KiB: both sides of this happen in one commit.
        coalesce_batch_bytes_max: 2 * 1024,
        read_cache_bytes_max: 8 * 1024,
        index_cache_bytes_max: 1024,
        index_persist_entries: 4,
        retention_ms: None,
        retention_bytes: None,
        unsafe_no_fsync_before_ack: false,
    }
}

/// A record whose value encodes who wrote it, so a reader can check it byte for byte.
pub fn record(rng: &mut SmallRng, ts: i64, tag: u64, size_max: usize) -> Record {
    let len = rng.gen_range(0..size_max);
    let mut value = tag.to_le_bytes().to_vec();
    value.extend((0..len).map(|i| (tag as usize + i) as u8));
    Record {
        timestamp_ms: ts,
        key: if rng.gen_bool(0.3) {
            Some(format!("k{tag}").into_bytes())
        } else {
            None
        },
        value,
        headers: if rng.gen_bool(0.2) {
            vec![(b"h".to_vec(), tag.to_be_bytes().to_vec())]
        } else {
            vec![]
        },
    }
}

pub fn encode(records: &[Record]) -> Vec<u8> {
    batch::encode(records).expect("non-empty")
}

/// Drives a single-threaded future to completion (for the in-memory file system).
pub fn block_on<T>(f: impl Future<Output = T>) -> T {
    futures::executor::block_on(f)
}

/// A deterministic single-threaded scheduler that polls one task at a time, round-robin, so a
/// test can stop the world between any two I/O operations (each simulated I/O yields once).
#[derive(Default)]
pub struct Stepper {
    tasks: Vec<Option<std::pin::Pin<Box<dyn Future<Output = ()>>>>>,
    next: usize,
}

impl Stepper {
    pub fn spawn(&mut self, f: impl Future<Output = ()> + 'static) {
        self.tasks.push(Some(Box::pin(f)));
    }

    /// Polls the next unfinished task once; false when all are done.
    pub fn step(&mut self) -> bool {
        let n = self.tasks.len();
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        for k in 0..n {
            let i = (self.next + k) % n;
            if let Some(t) = self.tasks[i].as_mut() {
                if t.as_mut().poll(&mut cx).is_ready() {
                    self.tasks[i] = None;
                }
                self.next = i + 1;
                return true;
            }
        }
        false
    }
}

/// Gives way `n` times (each a step of a [`Stepper`]): an appender's pause between appends, so
/// that appenders arrive at different moments (some while a commit is in flight).
pub async fn pause(n: u32) {
    for _ in 0..n {
        sluice_storage::fs::yield_now().await;
    }
}
