//! The Sluice broker: shards, the queue engine, front ends.
//!
//! `engine` is the sans-I/O queue state machine (no runtime, no clock, no sockets);
//! everything that touches glommio lives beside it, at the edge.

pub mod auth;
pub mod cluster;
pub mod config;
pub mod config_fds;
pub mod config_file;
pub mod config_perms;
pub mod console;
pub mod daemon;
pub mod disk;
pub mod engine;
pub mod error;
pub mod http;
pub mod kafka;
pub mod memory;
pub mod metadata;
pub mod metrics;
pub mod native;
pub mod partition_log;
pub mod ports;
pub mod quic;
pub mod runtime;
pub mod server;
pub mod shard;
pub mod stream;

#[cfg(test)]
mod fuzz_tests;
