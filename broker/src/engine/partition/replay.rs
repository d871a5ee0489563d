//! Replay: rebuilding the state from the log, from offset 0 or from a compacted start (its first
//! checkpoint). Built on `apply`.

use super::*;

impl Partition {
    /// Rebuilds state from one record of this partition's log (in log order), numbering records
    /// from 0 — for a log that was never compacted. Kept for callers without offsets; prefer
    /// [`Partition::replay_at`].
    pub fn replay(&mut self, record: &Record) -> Result<(), ReplayError> {
        self.replay_at(self.next_offset, record)
    }

    /// Rebuilds state from the record at log offset `offset`. Offsets must be consecutive from
    /// the first call on. A replay that starts above 0 (a compacted log) skips records up to its
    /// first checkpoint and starts from there; until a checkpoint shows that every live message
    /// is known, records about unknown messages sent before the start are skipped. Anything
    /// else that does not fit is a [`ReplayError`].
    pub fn replay_at(&mut self, offset: u64, record: &Record) -> Result<(), ReplayError> {
        let at_ms = record.at_ms;
        self.replay_reaches(offset, at_ms)?;
        self.advance(at_ms);
        if self.skipping && !matches!(record.kind, RecordKind::Checkpoint(_)) {
            self.next_offset = offset + 1;
            return Ok(());
        }
        self.apply_at(offset, record)
    }

    /// Steps over a control batch at `[offset, end)`: offsets the log holds that carry no engine
    /// record (a Raft no-op, which every new leader appends, or a membership entry: the
    /// partition's log is its Raft log). Replay and the live path alike move past them as past
    /// records, so the engine's offsets stay the log's. The offsets must follow on from the
    /// last record's, as a record's must.
    pub fn step_over_control(&mut self, offset: u64, end: u64) -> Result<(), ReplayError> {
        let at_ms = self.now_ms;
        if end <= offset {
            return Err(ReplayError {
                at_ms,
                reason: "a control batch without offsets",
            });
        }
        self.replay_reaches(offset, at_ms)?;
        self.next_offset = end;
        Ok(())
    }

    /// Replay reaches `offset`: the first one sets where it started (above 0, a compacted log:
    /// skip to its first checkpoint); every later one must follow on from the last.
    fn replay_reaches(&mut self, offset: u64, at_ms: u64) -> Result<(), ReplayError> {
        match self.replay_start {
            None => {
                self.replay_start = Some(offset);
                if offset > 0 {
                    self.skipping = true;
                    self.strict = false;
                }
                Ok(())
            }
            Some(_) if offset != self.next_offset => Err(ReplayError {
                at_ms,
                reason: "log offsets are not consecutive",
            }),
            Some(_) => Ok(()),
        }
    }

    /// Ends a replay: `end_offset` is one past the log's last record. Checks that the log held
    /// what the state needs (a compacted log must reach a checkpoint that knows every live
    /// message) and that no record was left out.
    pub fn finish_replay(&mut self, end_offset: u64) -> Result<(), ReplayError> {
        let bad = |reason| {
            Err(ReplayError {
                at_ms: self.now_ms,
                reason,
            })
        };
        match self.replay_start {
            None if end_offset > 0 => {
                return bad("the log is empty above offset 0: it was compacted away")
            }
            None => {}
            Some(_) if end_offset != self.next_offset => {
                return bad("the log ends elsewhere than its last replayed record")
            }
            Some(_) if self.skipping => return bad("a compacted log without a checkpoint"),
            Some(_) if !self.strict => {
                return bad("the log was compacted past records the state needs")
            }
            Some(_) => {}
        }
        self.next_offset = end_offset;
        Ok(())
    }
}
