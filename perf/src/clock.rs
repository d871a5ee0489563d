//! A precise wake-up clock for open-loop schedules.
//!
//! tokio's timer wheel has millisecond resolution: a `sleep_until` wakes up to ~1 ms after its
//! instant, and an open-loop generator measures that lateness as latency of the system under
//! test (p50 ~0.7 ms, p99 ~1.5 ms at 5,000 sends/s on this machine). This clock keeps its
//! deadlines on one thread of its own, which waits on a channel with a timeout (a futex wait
//! backed by a high-resolution timer, ~50 µs of slack) and fires each deadline through a oneshot
//! channel, waking the caller's runtime at once.
//!
//! The thread ends when the last [`Clock`] handle is dropped and no deadline is pending.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Instant;
use tokio::sync::oneshot;

struct Deadline {
    at: Instant,
    seq: u64,
    fire: oneshot::Sender<()>,
}

impl PartialEq for Deadline {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Deadline {}

impl PartialOrd for Deadline {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Deadline {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// A handle to the clock thread; cheap to clone.
#[derive(Clone)]
pub struct Clock {
    tx: mpsc::Sender<(Instant, oneshot::Sender<()>)>,
}

impl Clock {
    /// Starts the clock thread.
    pub fn start() -> Clock {
        let (tx, rx) = mpsc::channel::<(Instant, oneshot::Sender<()>)>();
        std::thread::Builder::new()
            .name("loadgen-clock".into())
            .spawn(move || run(rx))
            .expect("spawn the clock thread");
        Clock { tx }
    }

    /// Resolves at `t` (within the timer's slack), or at once if `t` has passed.
    pub async fn sleep_until(&self, t: Instant) {
        if t <= Instant::now() {
            return;
        }
        let (fire, fired) = oneshot::channel();
        if self.tx.send((t, fire)).is_err() {
            // The thread is gone (it never is while a handle lives): fall back to tokio's timer.
            tokio::time::sleep_until(t.into()).await;
            return;
        }
        let _ = fired.await;
    }
}

fn run(rx: mpsc::Receiver<(Instant, oneshot::Sender<()>)>) {
    let mut heap: BinaryHeap<Reverse<Deadline>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut open = true;
    loop {
        let now = Instant::now();
        while heap.peek().is_some_and(|d| d.0.at <= now) {
            if let Some(Reverse(d)) = heap.pop() {
                let _ = d.fire.send(());
            }
        }
        let next = heap.peek().map(|d| d.0.at);
        let got = match (next, open) {
            (None, false) => return,
            (Some(at), false) => {
                std::thread::sleep(at.saturating_duration_since(now));
                continue;
            }
            (None, true) => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            (Some(at), true) => rx.recv_timeout(at.saturating_duration_since(now)),
        };
        match got {
            Ok((at, fire)) => {
                seq += 1;
                heap.push(Reverse(Deadline { at, seq, fire }));
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => open = false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn deadlines_fire_in_order_and_not_early() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let clock = Clock::start();
            let start = Instant::now();
            let offsets = [3u64, 1, 2, 5, 4];
            let waits = offsets.iter().map(|ms| {
                let clock = clock.clone();
                let at = start + Duration::from_millis(*ms);
                async move {
                    clock.sleep_until(at).await;
                    let woke = Instant::now();
                    assert!(woke >= at, "woke {:?} early", at - woke);
                    woke
                }
            });
            let woke = futures::future::join_all(waits).await;
            // Each wakes no earlier than its instant; the latest instant wakes last or together.
            let last = woke.iter().max().expect("five");
            assert!(*last >= start + Duration::from_millis(5));
            // A past instant resolves at once.
            clock.sleep_until(start).await;
        });
    }
}
