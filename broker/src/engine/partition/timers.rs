//! Timers: when the partition next needs a `tick`, and what a tick decides (a checkpoint after a
//! quiet interval). Built on `decide` (the checkpoint) and `apply` (`advance`).

use super::*;

impl Partition {
    /// When the next timer is due (delay end, lease expiry, retention, dedup/attempt/origin
    /// expiry). May be early (superseded timers are dropped lazily): a wake-up then finds
    /// nothing to do.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        let timer = self.timers.peek().map(|Reverse(t)| t.0);
        let dedup = self.dedup.front_expires_ms();
        let attempt = self
            .attempt_order
            .values()
            .next()
            .and_then(|k| self.attempts.get(k))
            .map(|e| e.at_ms + ATTEMPT_WINDOW_MS);
        let origin = self.origin_order.front().map(|e| e.0);
        let checkpoint = self.checkpoint_due_ms();
        let tail = self.tail_deadline_ms();
        let waiting = self.waiting_deadline_ms();
        [timer, dedup, attempt, origin, checkpoint, tail, waiting]
            .into_iter()
            .flatten()
            .min()
    }

    /// Runs timers up to `now_ms`. Timer-driven changes need no records today, so the records
    /// are always empty; the signature leaves room for recorded expiry.
    pub fn tick(&mut self, now_ms: u64) -> Effects {
        let now = self.advance(now_ms);
        let mut fx = Effects::reply(Reply::None);
        fx.first_offset = self.next_offset;
        if self.checkpoint_due_ms().is_some_and(|due| due <= now) {
            self.push_checkpoint(now, &mut fx.records);
        }
        fx
    }

    /// When `tick` will write a checkpoint: records were written since the last one, or the
    /// live messages' floor moved past the last one's (messages expired on a quiet partition:
    /// a new checkpoint lets compaction take their space back); it can be written (not too
    /// many groups); and the interval has passed.
    pub(super) fn checkpoint_due_ms(&self) -> Option<u64> {
        if !self.checkpoint_fits() {
            return None;
        }
        let floor_moved = self.last_checkpoint.is_some_and(|c| {
            self.live_floor()
                .map_or(c.live_floor < c.offset, |f| f > c.live_floor)
        });
        if self.records_since_checkpoint == 0 && !floor_moved {
            return None;
        }
        Some(
            self.last_checkpoint
                .map_or(self.now_ms, |c| c.at_ms + CHECKPOINT_INTERVAL_MS),
        )
    }
}
