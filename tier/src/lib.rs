//! Tiered storage for Sluice: sealed segments move to S3-compatible object storage and are read
//! back through a bounded, checksum-verified cache.
//!
//! | module     | what                                                                        |
//! |------------|-----------------------------------------------------------------------------|
//! | `embedded` | an in-process S3 server (s3s) with a durable, locked file-system backend    |
//! | `remote`   | the segment store: uploads, verified range reads, deletes, reconciliation   |
//! | `frame`    | the object layout: blocks, a checksum table, a checksummed footer (sans-I/O)  |
//! | `cache`    | a byte-bounded LRU of verified blocks (sans-I/O)                            |
//! | `key`      | object keys derived from (topic/queue, partition, base offset, term)        |
//!
//! See README.md for the guarantees and the limits.

pub mod embedded;

pub use embedded::{start_embedded, start_embedded_with, EmbeddedConfig, EmbeddedHandle};
pub mod cache;
pub mod frame;
pub mod key;
pub mod remote;

pub use key::{LogKind, Part, SegmentId};
pub use remote::{RemoteConfig, RemoteHandle, RemoteStore, TierError, UploadedSegment};
