//! `quinn::Runtime` for one glommio executor: spawn on its default task queue, glommio timers,
//! and the UDP socket of [`super::udp`].

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

use glommio::timer::Timer;

use super::guard::ThreadBound;
use super::udp::{GlommioUdpSocket, UdpOptions};

/// The quinn runtime of one shard. Every endpoint and connection created with it must be
/// driven on the executor thread that created the runtime.
#[derive(Debug)]
pub struct GlommioRuntime {
    owner: ThreadId,
    udp: UdpOptions,
}

impl GlommioRuntime {
    /// A runtime for the current glommio executor thread.
    ///
    /// Panics if called outside a glommio executor.
    pub fn new(udp: UdpOptions) -> Self {
        // Fails fast (glommio panics) off an executor, instead of at the first spawn.
        let _ = glommio::executor().id();
        Self {
            owner: thread::current().id(),
            udp,
        }
    }

    /// Wraps `sock` for quinn, keeping the concrete type so the shard can read its counters.
    pub fn wrap_socket(&self, sock: std::net::UdpSocket) -> io::Result<Arc<GlommioUdpSocket>> {
        self.check_thread("wrap_udp_socket");
        Ok(Arc::new(GlommioUdpSocket::new(sock, self.udp.clone())?))
    }

    fn check_thread(&self, what: &str) {
        if thread::current().id() != self.owner {
            panic!(
                "sluice quic: {what} called on thread {:?} ({:?}), but this shard's QUIC \
                 runtime belongs to executor thread {:?}",
                thread::current().id(),
                thread::current().name(),
                self.owner
            );
        }
    }
}

impl quinn::Runtime for GlommioRuntime {
    fn new_timer(&self, deadline: Instant) -> Pin<Box<dyn quinn::AsyncTimer>> {
        self.check_thread("new_timer");
        Box::pin(GlommioTimer {
            timer: ThreadBound::new(
                "quinn timer",
                Timer::new(deadline.saturating_duration_since(crate::runtime::monotonic_now())),
            ),
        })
    }

    fn spawn(&self, future: Pin<Box<dyn Future<Output = ()> + Send>>) {
        self.check_thread("spawn");
        // The default queue (handle 0): a separate Latency::Matters queue for QUIC gained
        // nothing when measured, and one queue keeps QUIC and shard work in FIFO order.
        glommio::spawn_local_into(future, glommio::TaskQueueHandle::default())
            .expect("the default task queue always exists")
            .detach();
    }

    fn wrap_udp_socket(
        &self,
        sock: std::net::UdpSocket,
    ) -> io::Result<Arc<dyn quinn::AsyncUdpSocket>> {
        Ok(self.wrap_socket(sock)?)
    }
}

/// A glommio timer behind the thread guard.
struct GlommioTimer {
    timer: ThreadBound<Timer>,
}

impl std::fmt::Debug for GlommioTimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GlommioTimer").finish_non_exhaustive()
    }
}

impl quinn::AsyncTimer for GlommioTimer {
    fn reset(mut self: Pin<&mut Self>, deadline: Instant) {
        let dur = deadline.saturating_duration_since(crate::runtime::monotonic_now());
        self.timer.get_mut().reset(dur);
    }

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // glommio's Timer is Unpin (an Rc inside), so it can be polled through `&mut`.
        Pin::new(self.timer.get_mut()).poll(cx).map(|_| ())
    }
}

/// How long to wait before retrying a send after a real `EAGAIN` from the kernel.
pub const SEND_BACKOFF_DEFAULT: Duration = Duration::from_micros(50);
