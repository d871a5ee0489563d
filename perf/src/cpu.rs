//! The CPU a run uses while it is measured: read from the kernel's per-thread run time
//! (`/proc/<pid>/task/<tid>/schedstat`, nanoseconds on a CPU, user and system together),
//! sampled at the start and the end of a run's measured window, for three sets of threads: the
//! server's, the load generator's and the whole machine's. Divided by the messages sent in
//! that window, the server's is its CPU per message at that load: the figure to compare across
//! brokers on a machine the load generator shares, and the one the capacity model's cores come
//! from. The machine's is what the cores must cover per message, generator included.
//!
//! What is counted: for the in-process Sluice, the threads of this process that serve it (its
//! shards, and the kernel's io_uring workers, which do only the broker's I/O here: the generator
//! does not use io_uring); for a peer, every process in its server's process group (the suite
//! starts each server as a group of its own); for the generator, this process's other threads;
//! for the machine, every thread of every process, kernel threads included. The kernel's work
//! on behalf of a thread (system calls, the loopback send path) counts to that thread.
//!
//! A window's figure is the sum, over the threads alive at its end, of what each ran since the
//! start (all of it for a thread born in the window). A thread that exits within the window is
//! missed, rather than subtracted: the machine's other processes come and go (a test suite's
//! do), and a difference of two sums would lose an exiting process's whole lifetime.
//!
//! The reads happen twice per run (the window's edges), each a scan of `/proc` (~170 threads
//! on the test machine: milliseconds), off the generator's thread (`CpuSample::take_off_thread`)
//! so that the scan does not delay the sends due at the window's start.

use std::collections::HashMap;
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

/// Run time so far (ns) of each thread a read counted, by thread id.
pub type Tasks = HashMap<u32, u64>;

/// CPU seconds the threads alive in `end` ran since `start`: a thread's whole run time if it
/// is new, none if its counter went back (its id was reused).
pub fn ran_between(start: &Tasks, end: &Tasks) -> f64 {
    let ns: u64 = end
        .iter()
        .map(|(tid, ns)| ns.saturating_sub(start.get(tid).copied().unwrap_or(0)))
        .sum();
    ns as f64 / 1e9
}

impl CpuMeter {
    /// The run time so far of each thread this meter counts; `None` if `/proc` cannot tell or
    /// nothing is counted.
    pub fn tasks(&self) -> Option<Tasks> {
        let mut tasks = Tasks::new();
        match self {
            CpuMeter::Threads(prefixes) => threads(
                Path::new("/proc/self"),
                &mut tasks,
                Some(&|comm: &str| prefixes.iter().any(|p| comm.starts_with(p))),
            )?,
            CpuMeter::Groups(groups) => {
                for dir in processes()? {
                    let Some(pgrp) = fs::read_to_string(dir.join("stat"))
                        .ok()
                        .and_then(|s| stat_pgrp(&s))
                    else {
                        continue; // gone meanwhile
                    };
                    if groups.contains(&pgrp) {
                        threads(&dir, &mut tasks, None);
                    }
                }
            }
        }
        (!tasks.is_empty()).then_some(tasks)
    }

    /// CPU seconds used so far by what this meter counts (threads alive now).
    #[cfg(test)]
    pub fn seconds(&self) -> Option<f64> {
        self.tasks().map(|t| ran_between(&Tasks::new(), &t))
    }
}

/// The CPU counters a run reads at each edge of its measured window: the server's (where the
/// run can see it), the load generator's, the whole machine's.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CpuSample {
    pub server: Option<Tasks>,
    pub generator: Option<Tasks>,
    pub machine: Option<Tasks>,
}

/// CPU seconds each set of threads ran in a window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuSeconds {
    pub server: Option<f64>,
    pub generator: Option<f64>,
    pub machine: Option<f64>,
}

impl CpuSample {
    /// Reads every counter now; `server` only through a meter.
    pub fn take(server: Option<&CpuMeter>) -> Self {
        Self {
            server: server.and_then(CpuMeter::tasks),
            generator: generator_tasks(IN_PROCESS_BROKER_THREADS),
            machine: machine_tasks(),
        }
    }

    /// `take` on tokio's blocking pool, so that the `/proc` scan does not hold up the
    /// generator's thread; `None` if that thread failed.
    pub async fn take_off_thread(server: Option<CpuMeter>) -> Option<Self> {
        tokio::task::spawn_blocking(move || Self::take(server.as_ref()))
            .await
            .ok()
    }

    /// What each set ran between `start` and this sample (`None` where either read failed).
    pub fn since(&self, start: &Self) -> CpuSeconds {
        let d = |a: &Option<Tasks>, b: &Option<Tasks>| Some(ran_between(b.as_ref()?, a.as_ref()?));
        CpuSeconds {
            server: d(&self.server, &start.server),
            generator: d(&self.generator, &start.generator),
            machine: d(&self.machine, &start.machine),
        }
    }
}

/// This process's threads that a `Threads` meter of `broker` prefixes does not count: the load
/// generator's (all of this process when the server is elsewhere: a peer, an external broker).
pub fn generator_tasks(broker: &[&str]) -> Option<Tasks> {
    let mut tasks = Tasks::new();
    threads(
        Path::new("/proc/self"),
        &mut tasks,
        Some(&|comm: &str| !broker.iter().any(|p| comm.starts_with(p))),
    )?;
    Some(tasks)
}

/// Every thread of every process on the machine, kernel threads included (io_uring and block
/// workers, `ksoftirqd`): what the per-process figures cannot see. Not counted: interrupt time
/// the kernel keeps apart from tasks. `/proc/stat`'s tick counts were the first source tried:
/// on this VM they undercount a partly idle machine (below the server's and the generator's
/// own ns counts at 5,000 msg/s), so the figure reads the same ns counters as the others.
pub fn machine_tasks() -> Option<Tasks> {
    let mut tasks = Tasks::new();
    for dir in processes()? {
        threads(&dir, &mut tasks, None);
    }
    (!tasks.is_empty()).then_some(tasks)
}

/// `/proc/<pid>` of every process now.
fn processes() -> Option<Vec<std::path::PathBuf>> {
    Some(
        fs::read_dir("/proc")
            .ok()?
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit()))
            })
            .map(|e| e.path())
            .collect(),
    )
}

/// Adds the run time (ns) of the threads of process `proc_dir` whose name `keep` accepts
/// (every thread without one: no name is read then); `None` if its task list cannot be read.
fn threads(proc_dir: &Path, tasks: &mut Tasks, keep: Option<&dyn Fn(&str) -> bool>) -> Option<()> {
    for task in fs::read_dir(proc_dir.join("task")).ok()?.flatten() {
        let Some(tid) = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<u32>().ok())
        else {
            continue;
        };
        let dir = task.path();
        if let Some(keep) = keep {
            let Ok(comm) = fs::read_to_string(dir.join("comm")) else {
                continue; // exited meanwhile
            };
            if !keep(comm.trim_end()) {
                continue;
            }
        }
        if let Some(ns) = fs::read_to_string(dir.join("schedstat"))
            .ok()
            .and_then(|s| schedstat_ns(&s))
        {
            tasks.insert(tid, ns);
        }
    }
    Some(())
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
        // Burn CPU on this thread (the generator here: no broker threads are named) until the
        // generator's figure shows 50 ms of it, however busy the machine is otherwise.
        let a = CpuSample::take(None);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut x = 0u64;
        let d = loop {
            let t = std::time::Instant::now();
            while t.elapsed() < std::time::Duration::from_millis(10) {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
            let d = CpuSample::take(None).since(&a);
            if d.generator.expect("own threads") >= 0.05 {
                break d;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "50 ms of CPU in 20 s: {d:?}"
            );
        };
        assert_eq!(d.server, None, "no meter, no server figure");
        // The machine ran at least what this thread ran.
        let (g, m) = (d.generator.expect("own threads"), d.machine.expect("/proc"));
        assert!(m >= g * 0.9, "machine {m} s, generator {g} s");
    }

    #[test]
    fn a_thread_that_exits_is_missed_not_subtracted() {
        let start: Tasks = [(1, 5_000), (2, 9_000_000_000), (3, 100)].into();
        // 2 exited (with 9 s on its counter); 3 ran 50 ns more; 4 is new; 1's id was reused.
        let end: Tasks = [(1, 10), (3, 150), (4, 2_000)].into();
        assert_eq!(ran_between(&start, &end), (50 + 2_000) as f64 / 1e9);
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
