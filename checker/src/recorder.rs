//! Writing a history from Rust clients: [`Recorder`] numbers the operations and writes one JSON
//! line per event, from any number of threads. Times come from the caller, from the one
//! monotonic clock the run's clients share (the recorder reads no clock).

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::history::{Call, Event, Outcome, Reply};

/// Records events to a writer (a file, a buffer).
pub struct Recorder<W: Write> {
    out: Mutex<W>,
    next_op: AtomicU64,
}

/// Why an event could not be recorded.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("writing the history: {0}")]
    Io(#[from] std::io::Error),
    #[error("encoding an event: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("the history writer's lock was poisoned by a panic")]
    Poisoned,
}

impl<W: Write> Recorder<W> {
    /// Operation ids start at `first_op`: give each recording process of a run its own range
    /// (e.g. `pid << 32`) so that their files concatenate.
    pub fn new(out: W, first_op: u64) -> Recorder<W> {
        Recorder {
            out: Mutex::new(out),
            next_op: AtomicU64::new(first_op),
        }
    }

    fn write(&self, event: &Event) -> Result<(), RecordError> {
        let mut line = serde_json::to_vec(event)?;
        line.push(b'\n');
        let mut out = self.out.lock().map_err(|_| RecordError::Poisoned)?;
        out.write_all(&line)?;
        Ok(())
    }

    /// Records a call about to be issued; returns its operation id for [`Recorder::complete`].
    pub fn invoke(&self, process: &str, call: Call, time_us: u64) -> Result<u64, RecordError> {
        let op = self.next_op.fetch_add(1, Ordering::Relaxed);
        self.write(&Event::Invoke {
            op,
            process: process.to_string(),
            time_us,
            call,
        })?;
        Ok(op)
    }

    /// Records how the call `op` ended (`result` for an `ok` one).
    pub fn complete(
        &self,
        op: u64,
        time_us: u64,
        outcome: Outcome,
        result: Option<Reply>,
        error: Option<String>,
    ) -> Result<(), RecordError> {
        self.write(&Event::Complete {
            op,
            time_us,
            outcome,
            result,
            error,
        })
    }

    /// Marks the start of the final drain.
    pub fn drain(&self, time_us: u64) -> Result<(), RecordError> {
        self.write(&Event::Drain { time_us })
    }

    /// Flushes and returns the writer.
    pub fn into_inner(self) -> Result<W, RecordError> {
        let mut out = self.out.into_inner().map_err(|_| RecordError::Poisoned)?;
        out.flush()?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{check, Config, History, Verdict};

    #[test]
    fn recorded_calls_from_threads_make_a_history_that_checks() {
        let rec = Recorder::new(Vec::new(), 1 << 32);
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let rec = &rec;
                s.spawn(move || {
                    let process = format!("t{t}");
                    let call = Call::Send {
                        queue: "q".into(),
                        payload: format!("p{t}"),
                        group: None,
                        dedup: None,
                        content_dedup: false,
                        dedup_per_group: false,
                    };
                    let op = rec.invoke(&process, call, 10 + t).expect("invoke");
                    let reply = Reply::Send {
                        message_id: format!("m{t}"),
                    };
                    rec.complete(op, 20 + t, Outcome::Ok, Some(reply), None)
                        .expect("complete");
                });
            }
        });
        rec.drain(100).expect("drain");
        let receive = Call::Receive {
            queue: "q".into(),
            visibility_timeout_ms: 30_000,
        };
        let op = rec.invoke("drain", receive, 110).expect("invoke");
        let messages = (0..3)
            .map(|t| crate::Delivered {
                message_id: format!("m{t}"),
                payload: format!("p{t}"),
                receipt: format!("r{t}"),
                receive_count: Some(1),
                group: None,
            })
            .collect();
        let reply = Reply::Receive { messages };
        rec.complete(op, 120, Outcome::Ok, Some(reply), None)
            .expect("complete");
        let empty = Call::Receive {
            queue: "q".into(),
            visibility_timeout_ms: 30_000,
        };
        let op = rec.invoke("drain", empty, 130).expect("invoke");
        let reply = Reply::Receive { messages: vec![] };
        rec.complete(op, 140, Outcome::Ok, Some(reply), None)
            .expect("complete");
        let text = rec.into_inner().expect("flush");
        let history = History::from_jsonl(text.as_slice()).expect("parses");
        assert_eq!(history.ops.len(), 6);
        // m3 was acknowledged and never delivered.
        let report = check(&history, &Config::default());
        assert_eq!(report.verdict, Verdict::Fail, "{}", report.to_text());
        assert_eq!(report.kinds(), vec![crate::AnomalyKind::LostWrite]);
        assert!(report.to_text().contains("m3"));
    }
}
