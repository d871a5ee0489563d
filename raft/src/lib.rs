//! Sluice's Raft core: one group per partition, sans-I/O (no I/O, no clock, no randomness of its
//! own), shaped like etcd/raft-rs `RawNode` around record batches and flushed/written offsets.
//! The partition log is the Raft log: the core keeps only its bounds, term starts and a bounded
//! cache; the log owner writes, flushes, reads and snapshots, and reports back. See README.md.
//!
//! | module | purpose |
//! |---|---|
//! | `types` | ids (node, group, disk), `Entry` (one record batch), `Membership`, `HardState`, `Restore` |
//! | `config` | `Config`: limits with units; `Durability` (flushed by default, relaxed only opt-in) |
//! | `error` | typed errors: propose, membership change, step, decode |
//! | `message` | per-group messages and the coalesced per-node `Heartbeat` |
//! | `codec` | the versioned wire format of an `Envelope`: bounded, zero-copy, never panics |
//! | `log_view` | what the core knows of the log: bounds, term starts, recent-entry cache |
//! | `progress` | the leader's view of one follower: matched/flushed, flow control |
//! | `group` | `RaftGroup`: state, `Ready`, owner callbacks, `step`, `tick` |
//! | `election` | pre-vote, votes, check-quorum lease, leadership transfer |
//! | `replication` | appends, consistency check, commit on flushed quorum, catch-up reads, snapshots, heartbeats |
//! | `membership` | single-server changes, learners, disk-identity rejoin |
//! | `multi` | `MultiRaft`: ~1,000 groups per core, one tick, coalesced heartbeats |
//! | `rng` | the seeded SplitMix64 used for election jitter |

#![forbid(unsafe_code)]

pub mod codec;
mod config;
mod election;
mod error;
mod group;
mod log_view;
mod membership;
mod message;
mod multi;
mod progress;
mod replication;
mod rng;
mod types;

pub use codec::{CodecLimits, CODEC_VERSION, SNAPSHOT_BYTES_MAX};
pub use config::{Config, Durability};
pub use error::{ChangeError, DecodeError, ProposeError, StepError};
pub use group::{Fetch, Proposal, RaftGroup, RaftRole, Ready};
pub use membership::ConfChange;
pub use message::{
    Body, Envelope, Heartbeat, HeartbeatGroup, HeartbeatResp, HeartbeatRespGroup, Message,
    APPEND_ENTRIES_MAX, HEARTBEAT_GROUPS_MAX,
};
pub use multi::{MultiRaft, MultiReady};
pub use progress::{Progress, ProgressState};
pub use rng::SplitMix64;
pub use types::{
    DiskId, Entry, EntryKind, GroupId, HardState, Membership, NodeId, Offset, Replica, Restore,
    Role, Snapshot, SnapshotMeta, Term, MEMBERS_MAX,
};

#[cfg(test)]
mod tests;
