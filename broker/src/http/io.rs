//! hyper on glommio: glommio's `TcpStream` speaks futures-io; hyper 1.x wants its own
//! `hyper::rt::{Read, Write}` and a `Timer` for its header-read timeout. Both adapters are thin:
//! no buffering of their own (hyper buffers; a read passes through one scratch buffer per
//! thread), no task spawning (an HTTP/1.1 connection needs none).

use futures::io::{AsyncRead, AsyncWrite};
use std::cell::RefCell;
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

/// The most one read takes from the socket. A request of this size or less (a
/// SendMessageBatch of ten 2 KiB bodies is ~28 KiB) arrives in one read; a larger one in
/// several.
const READ_CHUNK_BYTES: usize = 64 * 1024;

thread_local! {
    /// Each thread's read scratch, zeroed once. hyper hands a read its buffer's spare capacity
    /// uninitialised, and futures-io reads only into initialised bytes: reading here and copying
    /// the bytes read costs what was read, where zeroing hyper's spare capacity first cost all
    /// of it (8–400 KiB) on every poll, including the ones that found nothing to read (2.4% of
    /// a shard in the HTTP throughput scenario). One per thread, not per connection: a read is
    /// synchronous, so a shard's connections take turns.
    static READ_SCRATCH: RefCell<Box<[u8]>> =
        RefCell::new(vec![0; READ_CHUNK_BYTES].into_boxed_slice());
}

impl<S: AsyncRead + Unpin> hyper::rt::Read for FuturesIo<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        let want = buf.remaining().min(READ_CHUNK_BYTES);
        READ_SCRATCH.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            match Pin::new(&mut self.inner).poll_read(cx, &mut scratch[..want]) {
                Poll::Ready(Ok(n)) => {
                    // A reader that claims more than it was given is a bug; `get` keeps it an
                    // error instead of a panic.
                    let Some(read) = scratch[..want].get(..n) else {
                        return Poll::Ready(Err(std::io::Error::other(
                            "read returned more bytes than its buffer holds",
                        )));
                    };
                    buf.put_slice(read);
                    Poll::Ready(Ok(()))
                }
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            }
        })
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
            deadline.saturating_duration_since(crate::runtime::monotonic_now()),
        ))
    }

    fn reset(&self, sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>, new_deadline: Instant) {
        match sleep.as_mut().downcast_mut_pin::<GlommioSleep>() {
            Some(s) => {
                s.reset(new_deadline.saturating_duration_since(crate::runtime::monotonic_now()))
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use futures::task::noop_waker_ref;
    use hyper::rt::Read;
    use std::mem::MaybeUninit;

    /// A reader that answers `Pending` every other poll, then at most `chunk` bytes.
    struct Trickle {
        data: Vec<u8>,
        at: usize,
        chunk: usize,
        ready: bool,
    }

    impl AsyncRead for Trickle {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut [u8],
        ) -> Poll<std::io::Result<usize>> {
            self.ready = !self.ready;
            if !self.ready {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            let n = buf.len().min(self.chunk).min(self.data.len() - self.at);
            buf[..n].copy_from_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            Poll::Ready(Ok(n))
        }
    }

    #[test]
    fn reads_every_byte_in_order_through_uninitialised_buffers() {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        for chunk in [1, 1000, READ_CHUNK_BYTES - 1, READ_CHUNK_BYTES, 1 << 20] {
            let mut io = FuturesIo::new(Trickle {
                data: data.clone(),
                at: 0,
                chunk,
                ready: false,
            });
            let mut cx = Context::from_waker(noop_waker_ref());
            let mut got = Vec::new();
            let mut reads = 0;
            loop {
                // hyper's spare capacity: uninitialised, of an odd size.
                let mut raw = vec![MaybeUninit::<u8>::uninit(); 100_003];
                let mut rb = hyper::rt::ReadBuf::uninit(&mut raw);
                match Pin::new(&mut io).poll_read(&mut cx, rb.unfilled()) {
                    Poll::Pending => continue,
                    Poll::Ready(r) => r.expect("read"),
                }
                let n = rb.filled().len();
                assert!(n <= READ_CHUNK_BYTES, "one read takes at most a chunk: {n}");
                if n == 0 {
                    break;
                }
                got.extend_from_slice(rb.filled());
                reads += 1;
            }
            assert_eq!(got, data, "chunk {chunk}");
            assert!(reads >= data.len().div_ceil(READ_CHUNK_BYTES));
        }
    }
}
