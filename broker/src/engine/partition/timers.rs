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

    /// Pushes every lease this partition holds back by `by_ms` (a new leader inheriting leases
    /// another node's clock granted: see `cluster::clock`). Only ever later: a lease that ends
    /// later than its record says is safe (nobody else receives the message sooner); the
    /// holder's handle stays valid meanwhile. Not a record: each new leader extends the
    /// recorded deadlines again, so replicas replaying the log agree on what was recorded.
    /// Returns how many leases were extended.
    pub fn extend_leases(&mut self, by_ms: u64) -> usize {
        if by_ms == 0 {
            return 0;
        }
        let mut extended = 0;
        for (&id, m) in self.msgs.iter_mut() {
            if let State::InFlight {
                deadline_ms,
                lease_start_ms,
            } = m.state
            {
                let deadline_ms = deadline_ms.saturating_add(by_ms);
                m.state = State::InFlight {
                    deadline_ms,
                    lease_start_ms,
                };
                // The old timer no longer matches the deadline and is dropped when it fires.
                self.timers
                    .push(Reverse((deadline_ms, TIMER_LEASE, id, m.receive_count)));
                extended += 1;
            }
        }
        extended
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
