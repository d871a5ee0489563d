//! hyper on glommio: glommio's `TcpStream` speaks futures-io; hyper 1.x wants its own
//! `hyper::rt::{Read, Write}` and a `Timer` for its header-read timeout. Both adapters are thin:
//! no buffering of their own (hyper buffers), no task spawning (an HTTP/1.1 connection needs
//! none).

use futures::io::{AsyncRead, AsyncWrite};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// A futures-io stream seen as a hyper transport.
pub struct FuturesIo<S> {
    inner: S,
}

impl<S> FuturesIo<S> {
    pub fn new(inner: S) -> Self {
        FuturesIo { inner }
    }
}

impl<S: AsyncRead + Unpin> hyper::rt::Read for FuturesIo<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        // SAFETY: the cursor's spare capacity may be uninitialised; we zero it before handing
        // it to `poll_read` as `&mut [u8]`, and we never read from it ourselves. Zeroing costs
        // a memset of hyper's read buffer (8 KiB–64 KiB), negligible beside the syscall.
        let spare = unsafe { buf.as_mut() };
        for b in spare.iter_mut() {
            b.write(0);
        }
        // SAFETY: every byte of `spare` was initialised just above; MaybeUninit<u8> has the
        // layout of u8.
        let slice: &mut [u8] =
            unsafe { &mut *(spare as *mut [std::mem::MaybeUninit<u8>] as *mut [u8]) };
        match Pin::new(&mut self.inner).poll_read(cx, slice) {
            Poll::Ready(Ok(n)) => {
                // SAFETY: `poll_read` initialised (wrote) the first `n` bytes; n <= len.
                unsafe { buf.advance(n) };
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncWrite + Unpin> hyper::rt::Write for FuturesIo<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_close(cx)
    }
}

/// hyper's timer on glommio's: used for the header-read (and keep-alive idle) timeout.
#[derive(Clone, Copy, Debug, Default)]
pub struct GlommioTimer;

impl hyper::rt::Timer for GlommioTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(GlommioSleep::new(duration))
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(GlommioSleep::new(
            deadline.saturating_duration_since(Instant::now()),
        ))
    }

    fn reset(&self, sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>, new_deadline: Instant) {
        match sleep.as_mut().downcast_mut_pin::<GlommioSleep>() {
            Some(s) => s.reset(new_deadline.saturating_duration_since(Instant::now())),
            None => *sleep = self.sleep_until(new_deadline),
        }
    }
}

/// A glommio timer that hyper may hold as `Send + Sync`. It never leaves its thread: hyper's
/// HTTP/1.1 connection (which owns it) is a `!Send` future spawned with `spawn_local` on the
/// shard's executor. The owner thread is checked on every use and on drop.
pub struct GlommioSleep {
    timer: glommio::timer::Timer,
    owner: std::thread::ThreadId,
}

// SAFETY: `GlommioSleep` is only created, polled, reset and dropped on the executor thread that
// created it (asserted by `check_thread`, which aborts otherwise, since unwinding from a drop on
// a foreign thread could touch the `Rc` inside glommio's timer). The Send/Sync bounds exist only
// because hyper's `Sleep` trait requires them for multi-threaded runtimes.
unsafe impl Send for GlommioSleep {}
// SAFETY: as above; no `&GlommioSleep` method touches the timer.
unsafe impl Sync for GlommioSleep {}

impl GlommioSleep {
    fn new(d: Duration) -> Self {
        GlommioSleep {
            timer: glommio::timer::Timer::new(d),
            owner: std::thread::current().id(),
        }
    }

    fn check_thread(&self) {
        if std::thread::current().id() != self.owner {
            eprintln!("sluice http: a glommio timer was used off its executor thread");
            std::process::abort();
        }
    }

    fn reset(self: Pin<&mut Self>, d: Duration) {
        self.check_thread();
        // GlommioSleep is Unpin (the timer is a handle), so this is a plain &mut.
        self.get_mut().timer.reset(d);
    }
}

impl hyper::rt::Sleep for GlommioSleep {}

impl Future for GlommioSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.check_thread();
        Pin::new(&mut self.timer).poll(cx).map(|_| ())
    }
}

impl Drop for GlommioSleep {
    fn drop(&mut self) {
        self.check_thread();
    }
}
