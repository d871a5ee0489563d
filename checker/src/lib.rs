//! The history checker (issue 43): judges what clients of Sluice saw — queue sends, receives,
//! deletes and visibility changes, stream produces, fetches and group offsets, each with its
//! start, end and outcome, indeterminate ones included — against the contract (CONTRACT.md C1–C4
//! and the stream promises), Knossos/Jepsen style: an anomaly is reported only if no correct
//! system could have produced the history.
//!
//! [`History::from_jsonl`] reads a history (schema in README.md), [`check`] runs every check and
//! returns a [`Report`]; the checks are also callable one by one ([`check`] module functions on
//! an [`Index`]). [`Recorder`] writes histories from Rust clients. [`sim`] generates valid histories from a tiny correct queue and stream, with an
//! optional planted fault, for the checker's own tests.

pub mod anomaly;
pub mod check;
pub mod history;
pub mod recorder;
pub mod report;
pub mod sim;

pub use anomaly::{Anomaly, AnomalyKind, FifoReason, OpRef};
pub use check::{Checked, Config, Index, DEDUP_WINDOW_US, MARGIN_MS_DEFAULT};
pub use history::{Call, Delivered, Event, History, HistoryError, Op, Outcome, Record, Reply};
pub use recorder::{RecordError, Recorder};
pub use report::{check, Report, Verdict};
