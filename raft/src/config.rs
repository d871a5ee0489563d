//! `Config`: every limit named with its unit, with the reason for its default.

/// When an entry counts toward commit on a replica.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Durability {
    /// Default: an entry counts only once flushed (fsync'd) on that replica, the leader included.
    /// An acknowledged write survives the power loss of any minority.
    Flushed,
    /// Opt-in relaxed mode (Redpanda's "write caching"): an entry counts once written (in the page
    /// cache) on a majority; the owner flushes on an interval. A simultaneous power loss of a
    /// majority within that interval LOSES ACKNOWLEDGED WRITES. Only for data that tolerates it.
    RelaxedWritten { flush_interval_ms: u64 },
}

#[derive(Clone, Debug)]
pub struct Config {
    /// Interval of the coalesced per-peer heartbeat (Redpanda: 150 ms).
    pub heartbeat_interval_ms: u64,
    /// Base election timeout; each follower waits a random time in [t, 2t) (Redpanda: 1500 ms).
    /// Also the check-quorum window and the pre-vote leader lease.
    pub election_timeout_ms: u64,
    /// Soft limit on one append message (bytes of entries): entries are packed into one append
    /// up to it, and it bounds one catch-up read (Redpanda 512 KiB). An entry larger than it is
    /// not refused: it travels alone, in an append of its own (see `max_entry_bytes`).
    pub max_append_bytes: usize,
    /// Hard limit on one entry (one record batch): `propose` refuses a larger batch and the wire
    /// codec refuses to decode one. 8 MiB: twice Sluice's largest batch (a queue partition's
    /// 4 MiB batch; one SQS message is at most 1 MiB), so a full batch with its framing always
    /// fits; no more than `max_cache_bytes`, so the leader can always hold its newest entry to
    /// send; half of `max_uncommitted_bytes`, so one entry never fills the back-pressure window
    /// alone; and far below the codec's 32-bit length field (4 GiB).
    pub max_entry_bytes: usize,
    /// Bytes sent to one follower and not yet acknowledged (pipelining window).
    pub max_inflight_bytes: usize,
    /// Bytes of recent entries the core keeps to send without asking the log owner to read.
    pub max_cache_bytes: usize,
    /// Bytes proposed on the leader and not yet committed: beyond it `propose` pushes back.
    pub max_uncommitted_bytes: usize,
    /// A learner within this many offsets of the leader's log end counts as caught up (promotion
    /// of a voter that lags makes every commit wait for it).
    pub learner_caught_up_offsets: u64,
    pub durability: Durability,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            heartbeat_interval_ms: 150,
            election_timeout_ms: 1500,
            max_append_bytes: 512 * 1024,
            max_entry_bytes: 8 * 1024 * 1024,
            max_inflight_bytes: 4 * 1024 * 1024,
            max_cache_bytes: 8 * 1024 * 1024,
            max_uncommitted_bytes: 16 * 1024 * 1024,
            learner_caught_up_offsets: 1024,
            durability: Durability::Flushed,
        }
    }
}
