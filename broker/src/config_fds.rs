//! File descriptors: the broker raises its soft `RLIMIT_NOFILE` to the hard limit at start, then
//! sizes the HTTP connection caps to what that leaves.
//!
//! An inherited soft limit (256 in some shells) with the default cap of 4,096 connections per
//! shard let idle sockets take every descriptor: a CreateQueue then failed half-way (500, the
//! queue created but not answered) and `accept` logged EMFILE a thousand times in 5 s. Now:
//!
//! - the soft limit is raised to the hard one ([`raise_nofile_limit`]; raising the hard limit
//!   needs privileges the broker should not have, and is refused even as root: see
//!   ARCHITECTURE.md (runtime facts));
//! - descriptors are set aside for what the broker opens besides connections — listeners,
//!   io_uring rings and eventfds per executor, the metadata log, metrics connections
//!   ([`FDS_RESERVED_FIXED`], [`FDS_RESERVED_PER_SHARD`]) and segment files, 2 per queue
//!   partition (`.log` and its index), counted on disk at start;
//! - of what remains, [`CONNECTIONS_SHARE_PERCENT`] goes to HTTP connections, split over the
//!   shards and capped by `http::CONNECTIONS_PER_SHARD_MAX`; the rest is headroom for queues
//!   created later. The plan is logged at start.
//!
//! The QUIC front end uses one UDP socket per endpoint, not one per connection.

use std::path::Path;

/// Descriptors the broker holds whatever its size: stdio, listeners (HTTP, metrics, QUIC),
/// the metadata log, the receipt key and certificate while read, and the metrics front end's
/// connections (`metrics::serve::CONNECTIONS_MAX`, 64).
pub const FDS_RESERVED_FIXED: u64 = 128;
/// Per shard: its io_uring rings (3), eventfds, the mesh, its QUIC endpoint and listeners.
pub const FDS_RESERVED_PER_SHARD: u64 = 32;
/// Descriptors of one queue partition's log: the open segment and its index.
pub const FDS_PER_PARTITION: u64 = 2;
/// Share of the descriptors left after the reserve that HTTP connections may take; the rest
/// stays free for queue partitions created while the broker runs.
pub const CONNECTIONS_SHARE_PERCENT: u64 = 50;
/// Fewest HTTP connections per shard whatever the limit says (a broker with almost no
/// descriptors still answers a few clients; past that, new connections get 503).
pub const CONNECTIONS_PER_SHARD_MIN: usize = 16;

/// The soft and hard `RLIMIT_NOFILE` before and after [`raise_nofile_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NofileLimit {
    pub soft_before: u64,
    pub soft: u64,
    pub hard: u64,
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (the most an unprivileged process may).
pub fn raise_nofile_limit() -> std::io::Result<NofileLimit> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` into the valid, exclusively borrowed `lim`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let soft_before = lim.rlim_cur;
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads one valid `rlimit`; a soft limit up to the hard limit is
        // always permitted, and the process-wide change is the intent (before any thread of
        // the broker starts, see `daemon::run`).
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        lim.rlim_cur = lim.rlim_max;
    }
    Ok(NofileLimit {
        soft_before,
        soft: lim.rlim_cur,
        hard: lim.rlim_max,
    })
}

/// The soft `RLIMIT_NOFILE` in force.
pub fn nofile_soft_limit() -> std::io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` into the valid, exclusively borrowed `lim`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(lim.rlim_cur)
}

/// The largest descriptor table [`presize_fd_table`] makes (512 KiB of pointers).
pub const FD_TABLE_PRESIZE_MAX: u64 = 65_536;

/// Grows this process's descriptor table now, before the shards run, to hold
/// `min(fds, soft limit, FD_TABLE_PRESIZE_MAX)` descriptors. The kernel grows the table by
/// doubling when a new descriptor does not fit, and in a process with several threads each
/// growth waits for an RCU grace period (`expand_files` → `synchronize_rcu`) in the thread that
/// opens the descriptor: an HTTP shard accepting its 257th, 513th... connection slept there for
/// milliseconds, right when a burst of connections (clients reconnecting after a stall) needed
/// it (seen with `perf record -e sched:sched_switch -g`). The table never shrinks, so one
/// growth at start is the last.
pub fn presize_fd_table(fds: u64) -> std::io::Result<()> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let fds = fds.min(nofile_soft_limit()?).min(FD_TABLE_PRESIZE_MAX);
    if fds < 2 {
        return Ok(());
    }
    let null = std::fs::File::open("/dev/null")?;
    let at = libc::c_int::try_from(fds - 1).unwrap_or(libc::c_int::MAX);
    // SAFETY: F_DUPFD_CLOEXEC duplicates the open descriptor `null` onto the lowest free number
    // at or above `at`; it reads and writes no memory of ours.
    let fd = unsafe { libc::fcntl(null.as_raw_fd(), libc::F_DUPFD_CLOEXEC, at) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created by fcntl above and nothing else owns it; dropping the
    // OwnedFd closes it (the table keeps its size).
    drop(unsafe { OwnedFd::from_raw_fd(fd) });
    Ok(())
}

/// HTTP connections each shard may serve with `soft_limit` descriptors, `shards` shards and
/// `partitions` queue partitions on disk.
pub fn connections_per_shard(soft_limit: u64, shards: usize, partitions: u64) -> usize {
    let shards = shards.max(1) as u64;
    // Saturating throughout: the soft limit may be RLIM_INFINITY (u64::MAX).
    let reserved = FDS_RESERVED_FIXED
        .saturating_add(FDS_RESERVED_PER_SHARD.saturating_mul(shards))
        .saturating_add(FDS_PER_PARTITION.saturating_mul(partitions));
    let for_connections = soft_limit.saturating_sub(reserved) / 100 * CONNECTIONS_SHARE_PERCENT;
    let per_shard = usize::try_from(for_connections / shards).unwrap_or(usize::MAX);
    per_shard.clamp(
        CONNECTIONS_PER_SHARD_MIN,
        crate::http::CONNECTIONS_PER_SHARD_MAX,
    )
}

/// Queue partitions on disk (`<data>/queues/<queue>/<partition>/`): each holds descriptors.
pub fn partitions_on_disk(data_dir: &Path) -> u64 {
    let Ok(queues) = std::fs::read_dir(data_dir.join("queues")) else {
        return 0;
    };
    queues
        .flatten()
        .filter_map(|q| std::fs::read_dir(q.path()).ok())
        .map(|parts| parts.flatten().filter(|p| p.path().is_dir()).count() as u64)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_fit_the_descriptors() {
        // The default cap where descriptors are plenty.
        assert_eq!(
            connections_per_shard(1 << 20, 2, 0),
            crate::http::CONNECTIONS_PER_SHARD_MAX
        );
        // 4,096: (4096 - 128 - 64) in whole hundreds, half of it, over 2 shards.
        assert_eq!(connections_per_shard(4096, 2, 0), 975);
        // Partitions on disk take theirs first.
        assert_eq!(connections_per_shard(4096, 2, 1000), 475);
        // Starved: the floor, never zero.
        assert_eq!(connections_per_shard(256, 2, 0), CONNECTIONS_PER_SHARD_MIN);
        assert_eq!(
            connections_per_shard(0, 0, u64::MAX),
            CONNECTIONS_PER_SHARD_MIN
        );
        // Whatever the inputs, the caps and the reserve fit the limit when it is not tiny.
        for soft in [1024u64, 4096, 20_000, 65_536] {
            for shards in [1usize, 2, 8] {
                let c = connections_per_shard(soft, shards, 100) as u64 * shards as u64;
                assert!(c + FDS_RESERVED_FIXED + 200 <= soft, "{soft} {shards}: {c}");
            }
        }
    }

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() {
        let lim = raise_nofile_limit().expect("getrlimit/setrlimit");
        assert_eq!(lim.soft, lim.hard);
        assert!(lim.soft >= lim.soft_before);
        assert_eq!(nofile_soft_limit().expect("getrlimit"), lim.soft);
    }

    #[test]
    fn the_descriptor_table_is_grown_once_at_start() {
        let size = || {
            std::fs::read_to_string("/proc/self/status")
                .expect("status")
                .lines()
                .find_map(|l| l.strip_prefix("FDSize:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .expect("FDSize")
        };
        let want = 4096.min(nofile_soft_limit().expect("limit"));
        presize_fd_table(want).expect("presize");
        assert!(size() >= want, "FDSize {} < {want}", size());
        // Nothing is left open: the next descriptor is a low one.
        let f = std::fs::File::open("/dev/null").expect("open");
        assert!((std::os::fd::AsRawFd::as_raw_fd(&f) as u64) < want - 1);
    }
}
