//! Connection slots of one listener on one shard: a cap on connections where idle ones give way.
//!
//! A plain cap lets whoever holds the connections keep them: 64 idle sockets on the metrics
//! port made `/health` fail, and a few thousand idle sockets on the API port would lock every
//! client out for as long as the head timeout. Here, when every slot is taken, a new connection
//! takes the slot of the connection that has been idle longest (waiting for a request head —
//! which includes a slow-loris client dribbling one in); that connection is closed. A
//! connection in the middle of a request is never closed for another; only when every
//! connection is busy is the new one refused. Idle keep-alive connections are what HTTP
//! clients expect the server to close at any time (they retry on a fresh one).
//!
//! Cost: a scan over the slots when the cap is reached (the caps are thousands at most).

use futures::channel::oneshot;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;

/// The slots of one listener.
pub struct Slots {
    max: usize,
    next_id: Cell<u64>,
    /// Activity clock: bumped whenever a request ends, so "idle longest" is the smallest stamp.
    clock: Cell<u64>,
    live: RefCell<BTreeMap<u64, Rc<SlotState>>>,
    evicted_total: Cell<u64>,
}

struct SlotState {
    busy: Cell<bool>,
    last_active: Cell<u64>,
    close: RefCell<Option<oneshot::Sender<()>>>,
}

/// A connection's slot; freed when dropped.
pub struct Slot {
    slots: Rc<Slots>,
    id: u64,
    state: Rc<SlotState>,
}

/// Resolves when the connection must close to give its slot to a newer one.
pub type Evicted = oneshot::Receiver<()>;

/// Marks a slot busy while a request is served.
pub struct Busy {
    slots: Rc<Slots>,
    state: Rc<SlotState>,
}

impl Slots {
    pub fn new(max: usize) -> Rc<Slots> {
        Rc::new(Slots {
            max: max.max(1),
            next_id: Cell::new(0),
            clock: Cell::new(0),
            live: RefCell::new(BTreeMap::new()),
            evicted_total: Cell::new(0),
        })
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// Connections holding a slot (including ones told to close that have not yet).
    pub fn live(&self) -> usize {
        self.live.borrow().len()
    }

    /// Connections closed to make room since start.
    pub fn evicted_total(&self) -> u64 {
        self.evicted_total.get()
    }

    /// A slot for a new connection, closing the longest-idle one if all are taken; `None` if
    /// every connection is in the middle of a request.
    pub fn acquire(self: &Rc<Self>) -> Option<(Slot, Evicted)> {
        if self.live.borrow().len() >= self.max && !self.evict_one() {
            return None;
        }
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        let (tx, rx) = oneshot::channel();
        let state = Rc::new(SlotState {
            busy: Cell::new(false),
            last_active: Cell::new(self.tick()),
            close: RefCell::new(Some(tx)),
        });
        self.live.borrow_mut().insert(id, state.clone());
        Some((
            Slot {
                slots: self.clone(),
                id,
                state,
            },
            rx,
        ))
    }

    fn tick(&self) -> u64 {
        let t = self.clock.get() + 1;
        self.clock.set(t);
        t
    }

    /// Tells the longest-idle connection to close and frees its slot now (its task ends on
    /// its next poll). False if none is idle.
    fn evict_one(&self) -> bool {
        let victim = self
            .live
            .borrow()
            .iter()
            .filter(|(_, s)| !s.busy.get())
            .min_by_key(|(_, s)| s.last_active.get())
            .map(|(id, s)| (*id, s.clone()));
        let Some((id, state)) = victim else {
            return false;
        };
        self.live.borrow_mut().remove(&id);
        if let Some(tx) = state.close.borrow_mut().take() {
            let _ = tx.send(());
        }
        self.evicted_total.set(self.evicted_total.get() + 1);
        true
    }
}

impl Slot {
    /// Marks the connection busy until the guard drops (a request is being served).
    pub fn busy(&self) -> Busy {
        self.state.busy.set(true);
        Busy {
            slots: self.slots.clone(),
            state: self.state.clone(),
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.state.busy.set(false);
        self.state.last_active.set(self.slots.tick());
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // Gone already if it was evicted.
        self.slots.live.borrow_mut().remove(&self.id);
    }
}

/// First pause after a failed `accept` (EMFILE, ENFILE, ENOBUFS…): the listener waits instead
/// of spinning on an error that persists until something closes.
pub const ACCEPT_BACKOFF_MS_MIN: u64 = 10;
/// Longest pause between retries of a failing `accept`.
pub const ACCEPT_BACKOFF_MS_MAX: u64 = 1_000;
/// At most one log line about failing accepts per this interval (with the count since).
pub const ACCEPT_ERROR_LOG_INTERVAL_MS: u64 = 10_000;

/// Failing `accept`s of one listener: exponential back-off and a rate-limited log.
pub struct AcceptErrors {
    what: &'static str,
    backoff_ms: u64,
    last_logged: Option<std::time::Instant>,
    unlogged: u64,
}

impl AcceptErrors {
    pub fn new(what: &'static str) -> Self {
        AcceptErrors {
            what,
            backoff_ms: 0,
            last_logged: None,
            unlogged: 0,
        }
    }

    /// An accept failed: logs it (at most once per interval) and says how long to wait.
    pub fn failed(&mut self, e: &dyn std::fmt::Display) -> std::time::Duration {
        self.backoff_ms = (self.backoff_ms * 2).clamp(ACCEPT_BACKOFF_MS_MIN, ACCEPT_BACKOFF_MS_MAX);
        self.unlogged += 1;
        let due = self.last_logged.is_none_or(|t| {
            t.elapsed() >= std::time::Duration::from_millis(ACCEPT_ERROR_LOG_INTERVAL_MS)
        });
        if due {
            tracing::warn!(
                listener = self.what,
                error = %e,
                failures = self.unlogged,
                retry_ms = self.backoff_ms,
                "accept failed (logged at most every {ACCEPT_ERROR_LOG_INTERVAL_MS} ms; \
                 EMFILE: raise the file descriptor limit or lower the connection caps)"
            );
            self.last_logged = Some(crate::runtime::monotonic_now());
            self.unlogged = 0;
        }
        std::time::Duration::from_millis(self.backoff_ms)
    }

    /// An accept succeeded: the next failure starts the back-off afresh.
    pub fn succeeded(&mut self) {
        self.backoff_ms = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failing_accepts_back_off_and_log_rarely() {
        let mut errs = AcceptErrors::new("test");
        let e = std::io::Error::from_raw_os_error(libc::EMFILE);
        let waits: Vec<u64> = (0..10)
            .map(|_| errs.failed(&e).as_millis() as u64)
            .collect();
        assert_eq!(waits[..4], [10, 20, 40, 80]);
        assert_eq!(*waits.last().unwrap(), ACCEPT_BACKOFF_MS_MAX);
        assert!(errs.unlogged == 9, "one line for ten failures");
        errs.succeeded();
        assert_eq!(errs.failed(&e).as_millis(), 10);
    }

    #[test]
    fn the_longest_idle_connection_gives_way_and_busy_ones_never_do() {
        let slots = Slots::new(3);
        let (a, mut a_closed) = slots.acquire().expect("a");
        let (b, mut b_closed) = slots.acquire().expect("b");
        let (c, mut c_closed) = slots.acquire().expect("c");
        // a served a request after b and c connected: b is now the longest idle.
        drop(a.busy());
        let _c_busy = c.busy();
        let (d, _) = slots.acquire().expect("d takes b's slot");
        assert_eq!(b_closed.try_recv(), Ok(Some(())));
        assert_eq!(a_closed.try_recv(), Ok(None));
        assert_eq!(slots.live(), 3);
        drop(b); // its task ends: nothing more to free
        assert_eq!(slots.live(), 3);
        // a is idle, d is idle and newer: a goes.
        let (e, _) = slots.acquire().expect("e takes a's slot");
        assert_eq!(a_closed.try_recv(), Ok(Some(())));
        let _d_busy = d.busy();
        let _e_busy = e.busy();
        // Everyone busy: refused, nobody closed.
        assert!(slots.acquire().is_none());
        assert_eq!(c_closed.try_recv(), Ok(None));
        assert_eq!(slots.evicted_total(), 2);
    }
}
