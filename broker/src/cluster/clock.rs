//! Time across a failover: the clock a partition's engine runs on while its replica leads,
//! and the margin on leases it inherits.
//!
//! Records carry their leader's time, and leases, FIFO group locks, delays and dedup windows
//! are deadlines on that time. A new leader inherits deadlines stamped by another node's
//! clock, which may run ahead of or behind its own by up to [`MAX_CLOCK_SKEW_MS`]:
//!
//! - **inherited leases end later:** after replaying the log, a new leader pushes every lease
//!   it holds back by [`MAX_CLOCK_SKEW_MS`] (`Partition::extend_leases`, through
//!   `PartitionLog::inherited_lease_margin_ms`). A lease granted until D by a clock at most that
//!   far ahead of this one is exposed here no sooner than D on the clock that granted it —
//!   so no message is leased to a second consumer inside its window, and no FIFO group lock
//!   breaks early. (A lease the new leader grants itself ends on its own clock.)
//! - **time never goes back:** [`LeaderClock`] reads `max(own clock, highest record time in the
//!   log, last reading)`, so a leader whose clock is behind the records' starts at their time.
//!
//! A cluster whose clocks drift further apart than the bound breaks the lease promise
//! (CONTRACT.md); keep NTP (or chrony) on every node. Dedup and attempt-id windows granted by
//! a clock ahead of this one may end up to the bound early.

use std::cell::Cell;
use std::future::Future;
use std::rc::Rc;

use crate::runtime::Clock;

/// The largest difference between two nodes' clocks the cluster's lease promise allows, ms.
/// NTP keeps hosts of one region within a few milliseconds; the bound leaves two orders of
/// magnitude for a bad day.
pub const MAX_CLOCK_SKEW_MS: u64 = 500;

/// A leader's engine clock over `inner`: never before the log's time, never back (see the
/// module doc). Clones share the floor.
#[derive(Clone)]
pub struct LeaderClock<C: Clock> {
    inner: C,
    floor_ms: Rc<Cell<u64>>,
}

impl<C: Clock> LeaderClock<C> {
    /// `inner`, never before `floor_ms` (the highest record time in the log the leader
    /// inherits: `ReplicaHost::last_record_ms`).
    pub fn new(inner: C, floor_ms: u64) -> Self {
        LeaderClock {
            inner,
            floor_ms: Rc::new(Cell::new(floor_ms)),
        }
    }

    /// Raises the floor (a record time seen later); never lowers it.
    pub fn raise_floor(&self, ms: u64) {
        self.floor_ms.set(self.floor_ms.get().max(ms));
    }
}

impl<C: Clock> Clock for LeaderClock<C> {
    fn now_ms(&self) -> u64 {
        let now = self.inner.now_ms().max(self.floor_ms.get());
        self.floor_ms.set(now);
        now
    }

    /// Wakes once `now_ms()` reaches `deadline_ms` (at once if the floor is past it; else when
    /// the inner clock reads it).
    fn sleep_until_ms(&self, deadline_ms: u64) -> impl Future<Output = ()> + 'static {
        let this = self.clone();
        let inner = self.inner.clone();
        async move {
            if this.now_ms() < deadline_ms {
                inner.sleep_until_ms(deadline_ms).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::SimClock;

    #[test]
    fn starts_at_the_logs_time_and_never_goes_back() {
        let wall = SimClock::new(10_000);
        let c = LeaderClock::new(wall.clone(), 0);
        assert_eq!(c.now_ms(), 10_000, "its own clock when the log is older");
        // The log's records are from a clock ahead of ours: time starts there.
        let ahead = LeaderClock::new(wall.clone(), 12_000);
        assert_eq!(ahead.now_ms(), 12_000);
        wall.advance_to(11_000);
        assert_eq!(
            ahead.now_ms(),
            12_000,
            "held at the floor until the clock passes it"
        );
        wall.advance_to(12_100);
        assert_eq!(ahead.now_ms(), 12_100);
        // Never back: a floor raised, then a floor below it.
        ahead.raise_floor(20_000);
        assert_eq!(ahead.now_ms(), 20_000);
        ahead.raise_floor(15_000);
        assert_eq!(ahead.now_ms(), 20_000);
    }
}
