//! Running storage on glommio: executor set-up that respects this machine's limits.

use std::io;

/// I/O memory glommio registers per executor (it registers it in 3 rings; 1 MiB fits the
/// 8 MiB memlock limit of these machines with room for several executors).
pub const IO_MEMORY_BYTES: usize = 1024 * 1024;

/// A builder for one executor, with memlock raised and I/O memory sized to fit.
pub fn executor_builder(
    name: &str,
    placement: glommio::Placement,
) -> glommio::LocalExecutorBuilder {
    if let Err(e) = crate::fs::raise_memlock_limit() {
        tracing::warn!(error = %e, "could not raise RLIMIT_MEMLOCK");
    }
    glommio::LocalExecutorBuilder::new(placement)
        .name(name)
        .io_memory(IO_MEMORY_BYTES)
}

/// Turns transparent huge pages off for the whole process (`prctl(PR_SET_THP_DISABLE)`, which
/// the kernel checks at every fault, so it also covers memory mapped before the call).
///
/// Why: mimalloc (v3) asks for huge pages on its arenas, and it gives freed memory back to the
/// OS after a delay. Under a load that allocates and frees megabyte buffers (2 MiB produce
/// batches, fetch answers, frames), every reuse then faulted in a fresh 2 MiB page and the
/// kernel zeroed it on the faulting thread. Measured on `stream-iggy` (82,200 records/s of
/// 2 KiB in batches of 1,000, in process): `clear_page_erms` under huge-page faults took 92% of
/// the generator thread for the first ~2.5 s of every other run, while the shards sat idle (the
/// "start stall"), and ~29% of it later; system CPU of a 6 s run was ~8.2 s. With huge pages
/// off (`MIMALLOC_ALLOW_THP=0` first, then this call): no stall in 3 of 3 runs each, 5.0-5.6 s
/// and 6.0-6.2 s of system CPU. Latency-minded servers commonly turn THP off for the same reason (the zeroing of a
/// huge page is a fault of ~0.5 ms on whichever thread touches it first).
///
/// Process-wide, so it is for binaries to call (`sluiced`, `sluice serve`, `sluice-perf`), not
/// libraries.
pub fn disable_transparent_huge_pages() -> io::Result<()> {
    // SAFETY: PR_SET_THP_DISABLE takes only integer arguments and reads or writes no memory of
    // ours; the flag it sets is a property of the process's address space.
    let r = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Runs `f` to completion on a fresh, unpinned executor on a new thread (tests and tools).
pub fn run<T, G, Fut>(name: &str, f: G) -> io::Result<T>
where
    G: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T> + 'static,
    T: Send + 'static,
{
    executor_builder(name, glommio::Placement::Unbound)
        .spawn(f)
        .map_err(|e| io::Error::other(e.to_string()))?
        .join()
        .map_err(|e| io::Error::other(e.to_string()))
}

#[cfg(test)]
mod tests {
    /// glommio is patched (vendor/README.md): an executor about to park fences instead of
    /// issuing a process-wide membarrier, and a remote sender fences before it looks at the
    /// sleeper's flag. If either side's ordering were wrong, a message sent while its receiver
    /// parks would not wake it and this ping-pong (every hop a park and a wake-up) would stall.
    #[test]
    fn executors_that_park_between_messages_never_miss_a_wake_up() {
        use glommio::channels::shared_channel;
        const ROUND_TRIPS: u32 = 20_000;
        let (ping_tx, ping_rx) = shared_channel::new_bounded::<u32>(1);
        let (pong_tx, pong_rx) = shared_channel::new_bounded::<u32>(1);
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let a = super::executor_builder("ping", glommio::Placement::Unbound)
            .spawn(move || async move {
                let (tx, rx) = (ping_tx.connect().await, pong_rx.connect().await);
                for i in 0..ROUND_TRIPS {
                    tx.send(i).await.expect("peer alive");
                    assert_eq!(rx.recv().await, Some(i));
                }
            })
            .expect("spawn ping executor");
        let b = super::executor_builder("pong", glommio::Placement::Unbound)
            .spawn(move || async move {
                let (rx, tx) = (ping_rx.connect().await, pong_tx.connect().await);
                while let Some(i) = rx.recv().await {
                    tx.send(i).await.expect("peer alive");
                }
            })
            .expect("spawn pong executor");
        std::thread::spawn(move || {
            let _ = done_tx.send(a.join().is_ok() && b.join().is_ok());
        });
        let finished = done_rx.recv_timeout(std::time::Duration::from_secs(120));
        assert_eq!(
            finished,
            Ok(true),
            "{ROUND_TRIPS} cross-executor round trips did not finish: a wake-up was lost"
        );
    }

    /// glommio is patched (vendor/README.md): an executor whose preemption timer fired before
    /// it ran anything took that for "nothing to run" and parked — and a park installs no
    /// preemption timer, so with runnable tasks and no I/O in flight it slept for good. A
    /// 20 µs preemption timer often fires in that window; two tasks that only yield (no I/O,
    /// no timers) must still finish. Unpatched: hung in 3 runs of 3.
    #[test]
    fn an_executor_preempted_before_running_does_not_park_with_runnable_tasks() {
        const TURNS: u32 = 200_000;
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let ex = super::executor_builder("preempted", glommio::Placement::Unbound)
            .preempt_timer(std::time::Duration::from_micros(20))
            .spin_before_park(std::time::Duration::from_micros(10))
            .spawn(move || async move {
                let yielders: Vec<_> = (0..2)
                    .map(|_| {
                        glommio::spawn_local(async {
                            for _ in 0..TURNS {
                                // Always yields: the task queue never drains.
                                let mut yielded = false;
                                std::future::poll_fn(|cx| {
                                    if yielded {
                                        std::task::Poll::Ready(())
                                    } else {
                                        yielded = true;
                                        cx.waker().wake_by_ref();
                                        std::task::Poll::Pending
                                    }
                                })
                                .await;
                            }
                        })
                    })
                    .collect();
                for y in yielders {
                    y.await;
                }
            })
            .expect("spawn executor");
        std::thread::spawn(move || {
            let _ = done_tx.send(ex.join().is_ok());
        });
        let finished = done_rx.recv_timeout(std::time::Duration::from_secs(60));
        assert_eq!(
            finished,
            Ok(true),
            "two yielding tasks did not finish: the executor parked with runnable tasks"
        );
    }

    #[test]
    fn transparent_huge_pages_can_be_turned_off_for_the_process() {
        super::disable_transparent_huge_pages().expect("prctl(PR_SET_THP_DISABLE)");
        // SAFETY: PR_GET_THP_DISABLE takes no pointer and returns the flag.
        let flag = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
        assert_eq!(flag, 1);
    }

    /// vendor/glommio.patch, `ReadResult::into_owned`: a lone read's buffer is handed over
    /// without a copy, and can be read and dropped on another thread; a result whose buffer
    /// another handle shares (a clone) is given back unchanged and stays readable, and is
    /// handed over once it is alone; a read into glommio's registered I/O memory (a small one)
    /// is given back (that memory must return to its pool).
    #[test]
    fn a_lone_reads_buffer_is_handed_over_and_a_shared_one_is_not() {
        const BIG: usize = 2 * super::IO_MEMORY_BYTES + 5000;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        let pattern = |i: usize| (i % 251) as u8;
        let data: Vec<u8> = (0..BIG + 8192).map(pattern).collect();
        std::fs::write(&path, &data).expect("write");
        let (a, b) = super::run("owned-read", move || async move {
            let f = glommio::io::OpenOptions::new()
                .read(true)
                .dma_open(&path)
                .await
                .expect("open");
            // Not block-aligned: the handed-over bytes start inside the read's buffer.
            let lone = f.read_at(100, BIG).await.expect("read");
            let a = lone.into_owned().expect("a lone read is handed over");
            let shared = f.read_at(0, BIG).await.expect("read");
            let clone = shared.clone();
            let back = shared
                .into_owned()
                .expect_err("a buffer another handle shares is not handed over");
            assert_eq!(back[..], clone[..]);
            drop(clone);
            let b = back.into_owned().expect("handed over once alone");
            let small = f.read_at(4096, 4096).await.expect("read");
            let small = small
                .into_owned()
                .expect_err("registered I/O memory is not handed over");
            assert!(small
                .iter()
                .enumerate()
                .all(|(i, &x)| x == pattern(i + 4096)));
            f.close().await.expect("close");
            (a, b)
        })
        .expect("runs");
        std::thread::spawn(move || {
            assert_eq!((a.len(), b.len()), (BIG, BIG));
            assert!(a.iter().enumerate().all(|(i, &x)| x == pattern(i + 100)));
            assert!(b.iter().enumerate().all(|(i, &x)| x == pattern(i)));
        })
        .join()
        .expect("read and dropped on another thread");
    }
}
