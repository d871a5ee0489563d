//! `sluice-e2e`: the SDK against an in-process broker. Everything is in `tests/` (the SDK's
//! end-to-end tests, the cross-account isolation tests) and `benches/sdk_cycle.rs`; this crate
//! exists so that `sluice-sdk` itself needs no broker, not even to test.
