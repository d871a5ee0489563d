//! The broker's one seam to its async runtime (glommio today): spawning, time, sleeping and
//! events. Everything else in the broker calls these, so that moving to another thread-per-core
//! runtime (compio was measured as a close alternative) touches this file, the storage `DmaFs`,
//! the shard mesh and the QUIC adapter — not the logic.

use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::Duration;

/// Wall-clock milliseconds since the Unix epoch: the only clock the engine ever sees, passed in
/// as an argument. The one place the broker reads the system clock: `broker/clippy.toml`
/// disallows `SystemTime::now` everywhere else, so no code reads time around this seam (and a
/// skew set with [`set_clock_skew_ms`] moves every reader at once).
pub fn now_ms() -> u64 {
    #[allow(clippy::disallowed_methods)] // the seam itself
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    ms.saturating_add_signed(CLOCK_SKEW_MS.load(std::sync::atomic::Ordering::Relaxed))
}

/// Monotonic time, for durations the broker measures on itself: timeouts and deadlines of its
/// own waits, log pacing, latency metrics, and the deadlines quinn's and hyper's timers are given.
/// Never for what a client can observe (lease ends, deduplication windows, retention, message
/// timestamps): those take [`now_ms`], the wall clock a skew moves and a simulation replaces.
/// `broker/clippy.toml` disallows `Instant::now` everywhere else, so each use of monotonic time
/// goes through this name. A skew does not move it: skew models a node's drifting wall clock,
/// which does not change how long a timeout takes.
pub fn monotonic_now() -> std::time::Instant {
    #[allow(clippy::disallowed_methods)] // the seam itself
    std::time::Instant::now()
}

/// A test-only offset added to this process's wall clock (`sluiced --test-clock-skew-ms`): the
/// fault harness skews one node's clock through it, as a drifting NTP would, without touching
/// the machine's clock that the other nodes share.
static CLOCK_SKEW_MS: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

/// Sets the skew [`now_ms`] adds to the system clock, for the whole process (every shard).
/// Only the fault harness sets it; a broker in production runs with 0.
pub fn set_clock_skew_ms(skew_ms: i64) {
    CLOCK_SKEW_MS.store(skew_ms, std::sync::atomic::Ordering::Relaxed);
}

/// Where time comes from for code that waits on deadlines (the partition actor): the wall clock
/// in production ([`WallClock`]), virtual time in a simulation ([`SimClock`]), so a test can run
/// a partition's timers without waiting for them.
pub trait Clock: Clone + 'static {
    /// Milliseconds since the Unix epoch (or the simulation's origin).
    fn now_ms(&self) -> u64;
    /// Resolves once `now_ms() >= deadline_ms`.
    fn sleep_until_ms(&self, deadline_ms: u64) -> impl Future<Output = ()> + 'static;
}

/// The wall clock and glommio's timers: what a broker runs on.
#[derive(Debug, Clone, Copy, Default)]
pub struct WallClock;

impl Clock for WallClock {
    fn now_ms(&self) -> u64 {
        now_ms()
    }

    fn sleep_until_ms(&self, deadline_ms: u64) -> impl Future<Output = ()> + 'static {
        sleep_until_ms(deadline_ms)
    }
}

/// Virtual time: it moves only when [`SimClock::advance_to`] moves it, waking the sleepers
/// whose deadlines it passed. Clones share one time.
#[derive(Clone, Default)]
pub struct SimClock {
    inner: Rc<RefCell<SimClockInner>>,
}

#[derive(Default)]
struct SimClockInner {
    now_ms: u64,
    sleepers: Vec<(u64, Waker)>,
}

impl SimClock {
    pub fn new(now_ms: u64) -> SimClock {
        let c = SimClock::default();
        c.inner.borrow_mut().now_ms = now_ms;
        c
    }

    /// Moves time forward to `now_ms` (never back) and wakes every sleeper now due.
    pub fn advance_to(&self, now_ms: u64) {
        let due: Vec<Waker> = {
            let mut i = self.inner.borrow_mut();
            i.now_ms = i.now_ms.max(now_ms);
            let now = i.now_ms;
            let (due, later) = std::mem::take(&mut i.sleepers)
                .into_iter()
                .partition(|(d, _)| *d <= now);
            i.sleepers = later;
            due.into_iter().map(|(_, w)| w).collect()
        };
        for w in due {
            w.wake();
        }
    }

    /// The earliest deadline anyone sleeps until (a simulation jumps there).
    pub fn next_deadline_ms(&self) -> Option<u64> {
        self.inner.borrow().sleepers.iter().map(|(d, _)| *d).min()
    }
}

impl Clock for SimClock {
    fn now_ms(&self) -> u64 {
        self.inner.borrow().now_ms
    }

    fn sleep_until_ms(&self, deadline_ms: u64) -> impl Future<Output = ()> + 'static {
        let inner = self.inner.clone();
        std::future::poll_fn(move |cx| {
            let mut i = inner.borrow_mut();
            if i.now_ms >= deadline_ms {
                Poll::Ready(())
            } else {
                i.sleepers.push((deadline_ms, cx.waker().clone()));
                Poll::Pending
            }
        })
    }
}

/// Runs `f` concurrently on this shard; it is not cancelled when the handle is dropped.
pub fn spawn<T: 'static>(f: impl Future<Output = T> + 'static) {
    glommio::spawn_local(f).detach();
}

pub async fn sleep(d: Duration) {
    glommio::timer::sleep(d).await;
}

/// Sleeps until wall-clock `deadline_ms` (returns at once if it has passed).
pub async fn sleep_until_ms(deadline_ms: u64) {
    let now = now_ms();
    if deadline_ms > now {
        sleep(Duration::from_millis(deadline_ms - now)).await;
    }
}

/// A broadcast event on one shard: waiters park until the next `notify`. Cheap, unbounded in
/// waiters only as far as callers bound them.
#[derive(Clone, Default)]
pub struct Event {
    inner: Rc<RefCell<EventInner>>,
}

#[derive(Default)]
struct EventInner {
    generation: u64,
    wakers: Vec<Waker>,
}

impl Event {
    pub fn notify(&self) {
        let wakers = {
            let mut i = self.inner.borrow_mut();
            i.generation += 1;
            std::mem::take(&mut i.wakers)
        };
        for w in wakers {
            w.wake();
        }
    }

    /// A future that resolves at the next `notify` after this call.
    pub fn listen(&self) -> impl Future<Output = ()> + 'static {
        let inner = self.inner.clone();
        let seen = inner.borrow().generation;
        std::future::poll_fn(move |cx| {
            let mut i = inner.borrow_mut();
            if i.generation != seen {
                Poll::Ready(())
            } else {
                i.wakers.push(cx.waker().clone());
                Poll::Pending
            }
        })
    }

    /// Waits for a notify or until `deadline_ms`; true if notified.
    pub async fn listen_until(&self, deadline_ms: u64) -> bool {
        self.listen_until_on(&WallClock, deadline_ms).await
    }

    /// [`Event::listen_until`] with the deadline on `clock`.
    pub async fn listen_until_on(&self, clock: &impl Clock, deadline_ms: u64) -> bool {
        let l = std::pin::pin!(self.listen());
        let t = std::pin::pin!(clock.sleep_until_ms(deadline_ms));
        matches!(
            futures::future::select(l, t).await,
            futures::future::Either::Left(_)
        )
    }
}

/// Shares of each request class's task queue (see [`spawn_request`]).
pub const REQUEST_CLASS_SHARES: usize = 1000;

/// Request work a shard keeps apart, so that one kind saturating the core cannot starve the
/// other: each class runs in its own glommio task queue with equal shares
/// ([`REQUEST_CLASS_SHARES`]), and glommio's scheduler gives every queue with runnable tasks
/// CPU in proportion to its shares. Everything else (QUIC, the mesh, timers) stays in the
/// default queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestClass {
    /// Appends to topic partitions (produce): verify, stage, wait for the commit.
    Produce,
    /// Reads of topic partitions (fetch): read, frame.
    Fetch,
}

thread_local! {
    static REQUEST_QUEUES: std::cell::OnceCell<[glommio::TaskQueueHandle; 2]> =
        const { std::cell::OnceCell::new() };
}

/// Spawns a request's work (detached) in its class's task queue on this executor; `None`: the
/// default queue.
pub fn spawn_request(class: Option<RequestClass>, f: impl Future<Output = ()> + 'static) {
    let Some(class) = class else {
        glommio::spawn_local(f).detach();
        return;
    };
    let queue = REQUEST_QUEUES.with(|q| {
        let qs = q.get_or_init(|| {
            let make = |name: &str| {
                glommio::executor().create_task_queue(
                    glommio::Shares::Static(REQUEST_CLASS_SHARES),
                    glommio::Latency::NotImportant,
                    name,
                )
            };
            [make("produce"), make("fetch")]
        });
        match class {
            RequestClass::Produce => qs[0],
            RequestClass::Fetch => qs[1],
        }
    });
    match glommio::spawn_local_into(f, queue) {
        Ok(t) => {
            t.detach();
        }
        Err(e) => unreachable!("a task queue this thread created is gone: {e}"),
    }
}
