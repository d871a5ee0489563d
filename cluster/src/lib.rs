//! Sluice's cluster: the replicated partition log today; the transport between nodes and the
//! cluster's membership later (issue 41). Depends on storage, raft and wire, never on the
//! broker: the broker's `PartitionLog` seam will be implemented over [`Replica`].
//!
//! | module    | purpose                                                                         |
//! |-----------|---------------------------------------------------------------------------------|
//! | `replica` | [`Replica`]: one partition's Raft group driven over its storage log (the `Ready` loop) |
//! | `entry`   | Raft entries as record batches; no-ops and membership changes as control batches |
//! | `state`   | the hard-state file: term, vote, disk id, base, membership entries; atomic replace |
//! | `error`   | [`ReplicaError`]                                                               |
//!
//! The partition's segment log IS the Raft log: one Raft entry is one record batch, the Raft
//! offset is the partition offset, the batch header carries the term. See README.md.

#![forbid(unsafe_code)]

pub mod entry;
pub mod error;
pub mod replica;
pub mod state;

pub use error::ReplicaError;
pub use replica::{Create, ProposalTicket, Replica, ReplicaConfig, ReplicaStats};
pub use state::{PersistedState, HARD_STATE_FILE};
