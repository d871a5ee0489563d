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

/// CPU seconds the whole machine has been busy so far, over all its cores: user, nice,
/// system, irq and softirq time from `/proc/stat` (not idle, not iowait, not steal). It counts
/// what the per-process figures cannot: softirq work on whatever thread an interrupt lands
/// on, other processes. `None` if `/proc/stat` cannot tell.
pub fn machine_busy_seconds() -> Option<f64> {
    let stat = fs::read_to_string("/proc/stat").ok()?;
    // SAFETY: `sysconf` only reads a configuration value; it has no memory-safety
    // preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    proc_stat_busy_ticks(&stat).map(|t| t as f64 / hz.max(1) as f64)
}

/// The busy ticks of `/proc/stat`'s first (all-CPU) line: user + nice + system + irq +
/// softirq.
fn proc_stat_busy_ticks(stat: &str) -> Option<u64> {
    let line = stat.lines().next()?;
    let mut f = line.split_whitespace();
    if f.next()? != "cpu" {
        return None;
    }
    let v: Vec<u64> = f.take(7).map(|x| x.parse().ok()).collect::<Option<_>>()?;
    if v.len() < 7 {
        return None;
    }
    // user nice system idle iowait irq softirq
    Some(v[0] + v[1] + v[2] + v[5] + v[6])
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
        let stat = "cpu  100 2 30 4000 50 6 7 8 0 0\ncpu0 50 1 15 2000 25 3 3 4 0 0\n";
        assert_eq!(proc_stat_busy_ticks(stat), Some(100 + 2 + 30 + 6 + 7));
        assert_eq!(proc_stat_busy_ticks("cpu0 1 2 3 4 5 6 7\n"), None);
        assert_eq!(proc_stat_busy_ticks("cpu  1 2 3\n"), None);
        assert_eq!(proc_stat_busy_ticks(""), None);
        let a = machine_busy_seconds().expect("/proc/stat");
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < std::time::Duration::from_millis(100) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let b = machine_busy_seconds().expect("/proc/stat");
        assert!(b >= a, "{a} then {b}");
        // This thread, counted as the generator (no broker threads named here), burned ~0.1 s.
        let g = generator_seconds(IN_PROCESS_BROKER_THREADS).expect("own threads");
        assert!(g >= 0.05, "{g}");
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
