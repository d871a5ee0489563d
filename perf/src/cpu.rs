//! The CPU a target's server uses while it is measured: read from the kernel's per-thread run
//! time (`/proc/<pid>/task/<tid>/schedstat`, nanoseconds on a CPU, user and system together),
//! sampled at the start and the end of a run's measured window. Divided by the messages sent in
//! that window, it is the server's CPU per message at that load: the figure to compare across
//! brokers on a machine the load generator shares, and the one the capacity model's cores come
//! from.
//!
//! What is counted: for the in-process Sluice, the threads of this process that serve it (its
//! shards, and the kernel's io_uring workers, which do only the broker's I/O here: the generator
//! does not use io_uring); for a peer, every process in its server's process group (the suite
//! starts each server as a group of its own). The kernel's work on behalf of a thread
//! (system calls, the loopback send path) counts to that thread. Not counted: softirq work the
//! kernel does on whatever thread the interrupt lands on, and threads that exit within the
//! window.
//!
//! The reads happen on the generator's thread, twice per run (the window's edges): a group
//! scans `/proc` (73 processes on the test machine: well under a millisecond), the in-process
//! broker reads its dozen threads' files.

use std::fs;
use std::path::Path;

/// Where a target's server CPU time is read.
#[derive(Clone, Debug)]
pub enum CpuMeter {
    /// Threads of this process whose names start with one of these prefixes.
    Threads(&'static [&'static str]),
    /// Every process in these process groups (by group id).
    Groups(Vec<u32>),
}

/// The in-process broker's threads: glommio names a shard's threads `shard-<id>-…`; the
/// kernel names an io_uring worker `iou-wrk-<tid>`.
pub const IN_PROCESS_BROKER_THREADS: &[&str] = &["shard-", "iou-wrk-"];

impl CpuMeter {
    /// CPU seconds used so far by what this meter counts; `None` if `/proc` cannot tell.
    pub fn seconds(&self) -> Option<f64> {
        let ns = match self {
            CpuMeter::Threads(prefixes) => threads_ns(Path::new("/proc/self"), |comm| {
                prefixes.iter().any(|p| comm.starts_with(p))
            })?,
            CpuMeter::Groups(groups) => {
                let mut sum = 0u64;
                let mut found = false;
                for entry in fs::read_dir("/proc").ok()?.flatten() {
                    let pid = entry.file_name();
                    let Some(pid) = pid
                        .to_str()
                        .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
                    else {
                        continue;
                    };
                    let dir = Path::new("/proc").join(pid);
                    let Some(pgrp) = fs::read_to_string(dir.join("stat"))
                        .ok()
                        .and_then(|s| stat_pgrp(&s))
                    else {
                        continue; // gone meanwhile
                    };
                    if groups.contains(&pgrp) {
                        if let Some(ns) = threads_ns(&dir, |_| true) {
                            sum += ns;
                            found = true;
                        }
                    }
                }
                if !found {
                    return None;
                }
                sum
            }
        };
        Some(ns as f64 / 1e9)
    }
}

/// The CPU counters a run reads at each edge of its measured window, in seconds: the
/// server's (where the run can see it), the load generator's, the whole machine's.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuSample {
    pub server: Option<f64>,
    pub generator: Option<f64>,
    pub machine: Option<f64>,
}

impl CpuSample {
    /// Reads every counter now; `server` only through a meter.
    pub fn take(server: Option<&CpuMeter>) -> Self {
        Self {
            server: server.and_then(CpuMeter::seconds),
            generator: generator_seconds(IN_PROCESS_BROKER_THREADS),
            machine: machine_busy_seconds(),
        }
    }

    /// What each counter grew by since `start` (`None` where either read failed).
    pub fn since(&self, start: &Self) -> Self {
        let d = |a: Option<f64>, b: Option<f64>| Some(a? - b?);
        Self {
            server: d(self.server, start.server),
            generator: d(self.generator, start.generator),
            machine: d(self.machine, start.machine),
        }
    }
}

/// CPU seconds used so far by this process's threads that a `Threads` meter of `broker`
/// prefixes does not count: the load generator's (all of this process when the server is
/// elsewhere: a peer, an external broker). `None` if `/proc` cannot tell.
pub fn generator_seconds(broker: &[&str]) -> Option<f64> {
    let ns = threads_ns(Path::new("/proc/self"), |comm| {
        !broker.iter().any(|p| comm.starts_with(p))
    })?;
    Some(ns as f64 / 1e9)
}

/// CPU seconds every task on the machine has run so far, over all its cores: the sum of
/// `schedstat` over every thread of every process, kernel threads included (io_uring and
/// block workers, `ksoftirqd`). It counts what the per-process figures cannot: kernel workers,
/// other processes. Not counted: interrupt time the kernel keeps apart from tasks, and tasks
/// that exit between the two reads. `/proc/stat`'s tick counts were the first source tried:
/// on this VM they undercount a partly idle machine (below the server's and the generator's
/// own ns counts at 5,000 msg/s), so the figure reads the same ns counters as the others.
/// `None` if `/proc` cannot tell.
pub fn machine_busy_seconds() -> Option<f64> {
    let mut ns = 0u64;
    let mut found = false;
    for entry in fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        if !name
            .to_str()
            .is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        if let Some(n) = threads_ns(&entry.path(), |_| true) {
            ns += n;
            found = true;
        }
    }
    found.then_some(ns as f64 / 1e9)
}

/// Run time in ns of the threads of process `proc_dir` whose name `keep` accepts; `None` if
/// the task list cannot be read or no thread was accepted.
fn threads_ns(proc_dir: &Path, keep: impl Fn(&str) -> bool) -> Option<u64> {
    let mut sum = 0u64;
    let mut found = false;
    for task in fs::read_dir(proc_dir.join("task")).ok()?.flatten() {
        let dir = task.path();
        let Ok(comm) = fs::read_to_string(dir.join("comm")) else {
            continue; // exited meanwhile
        };
        if !keep(comm.trim_end()) {
            continue;
        }
        if let Some(ns) = fs::read_to_string(dir.join("schedstat"))
            .ok()
            .and_then(|s| schedstat_ns(&s))
        {
            sum += ns;
            found = true;
        }
    }
    found.then_some(sum)
}

/// The first field of a `schedstat` line: time spent on a CPU, in ns.
fn schedstat_ns(line: &str) -> Option<u64> {
    line.split_whitespace().next()?.parse().ok()
}

/// The process group of a `/proc/<pid>/stat` line: the third field after the command, which
/// is in parentheses and may itself hold spaces and parentheses.
fn stat_pgrp(line: &str) -> Option<u32> {
    let after = &line[line.rfind(')')? + 1..];
    after.split_whitespace().nth(2)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_machine_busy_time() {
        let a = machine_busy_seconds().expect("/proc");
        let g0 = generator_seconds(IN_PROCESS_BROKER_THREADS).expect("own threads");
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < std::time::Duration::from_millis(100) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let g = generator_seconds(IN_PROCESS_BROKER_THREADS).expect("own threads") - g0;
        let b = machine_busy_seconds().expect("/proc") - a;
        // This thread (the generator here: no broker threads are named) burned ~0.1 s, and the
        // machine at least that.
        assert!(g >= 0.05, "{g}");
        assert!(b >= g * 0.9, "machine {b} s, this thread {g} s");
    }

    #[test]
    fn parses_what_the_kernel_writes() {
        assert_eq!(schedstat_ns("1319369 0 1\n"), Some(1_319_369));
        assert_eq!(schedstat_ns(""), None);
        let stat = "27969 (a (b) c) S 1 27969 27969 0 -1 4194560 1234";
        assert_eq!(stat_pgrp(stat), Some(27969));
        assert_eq!(stat_pgrp("12 (x) R 1"), None);
        assert_eq!(stat_pgrp("garbage"), None);
    }

    #[test]
    fn a_busy_thread_and_a_process_group_are_measured() {
        // A thread of this process that burns CPU, found by its name.
        let busy = std::thread::Builder::new()
            .name("shard-test-cpu".into())
            .spawn(|| {
                let t = std::time::Instant::now();
                let mut x = 0u64;
                while t.elapsed() < std::time::Duration::from_millis(200) {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                }
                // Stay alive until measured.
                std::thread::sleep(std::time::Duration::from_millis(300));
                x
            })
            .expect("spawn");
        std::thread::sleep(std::time::Duration::from_millis(250));
        let used = CpuMeter::Threads(&["shard-test-cpu"])
            .seconds()
            .expect("the thread is there");
        assert!(used > 0.05, "{used} s");
        assert_eq!(CpuMeter::Threads(&["no-such-thread-"]).seconds(), None);
        // This process's own group holds the thread too (measured while it lives: an exited
        // thread's time is no longer listed).
        let own = fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| stat_pgrp(&s))
            .expect("own group");
        let group = CpuMeter::Groups(vec![own]).seconds().expect("own group");
        assert!(group >= used, "{group} < {used}");
        busy.join().expect("join");
    }
}
