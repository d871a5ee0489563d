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
/// as an argument.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
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
        let l = std::pin::pin!(self.listen());
        let t = std::pin::pin!(sleep_until_ms(deadline_ms));
        matches!(
            futures::future::select(l, t).await,
            futures::future::Either::Left(_)
        )
    }
}
