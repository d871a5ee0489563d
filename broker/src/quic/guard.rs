//! A value pinned to the thread that created it, made `Send + Sync` by checking the thread.
//!
//! quinn requires its runtime, timers and sockets to be `Send + Sync`, because with tokio an
//! endpoint may be driven from any worker thread. Sluice never does that: each shard's endpoint
//! is created, driven and dropped on its own glommio executor thread, whose timers and I/O
//! sources are `Rc`-based and `!Send`. `ThreadBound` states that contract in the type and
//! checks it at run time: touching the value from another thread panics, and dropping it on
//! another thread aborts the process (a drop cannot be refused, and running the value's `Drop`
//! there would be a data race on its non-atomic reference counts).

use std::mem::ManuallyDrop;
use std::thread::{self, ThreadId};

/// A value that may only be used and dropped on the thread that created it.
pub struct ThreadBound<T> {
    owner: ThreadId,
    /// Which piece of the adapter this is, for the panic message.
    what: &'static str,
    value: ManuallyDrop<T>,
}

impl<T> ThreadBound<T> {
    /// Binds `value` to the current thread.
    pub fn new(what: &'static str, value: T) -> Self {
        Self {
            owner: thread::current().id(),
            what,
            value: ManuallyDrop::new(value),
        }
    }

    /// Whether the current thread owns the value.
    pub fn is_owner(&self) -> bool {
        thread::current().id() == self.owner
    }

    /// The value; panics on any thread but the owner.
    pub fn get(&self) -> &T {
        self.check("used");
        &self.value
    }

    /// The value, mutably; panics on any thread but the owner.
    pub fn get_mut(&mut self) -> &mut T {
        self.check("used");
        &mut self.value
    }

    fn check(&self, verb: &str) {
        if !self.is_owner() {
            panic!(
                "sluice quic: {} {verb} on thread {:?} ({:?}) but it belongs to the glommio \
                 executor thread {:?}; a shard's QUIC endpoint and everything it creates must \
                 stay on that shard's executor",
                self.what,
                thread::current().id(),
                thread::current().name(),
                self.owner
            );
        }
    }
}

impl<T> Drop for ThreadBound<T> {
    fn drop(&mut self) {
        if !self.is_owner() {
            // Panicking here could itself run during an unwind (a double panic aborts without
            // this message), and leaking would hide the bug: say what happened, then abort.
            eprintln!(
                "sluice quic: {} dropped on thread {:?} ({:?}) but it belongs to the glommio \
                 executor thread {:?}; aborting (a shard's QUIC endpoint must be dropped on \
                 its executor)",
                self.what,
                thread::current().id(),
                thread::current().name(),
                self.owner
            );
            std::process::abort();
        }
        // SAFETY: `value` is dropped exactly once, here, and never touched again; we are on
        // the owner thread, so `T`'s own drop runs where `T` lives.
        unsafe { ManuallyDrop::drop(&mut self.value) }
    }
}

// SAFETY: a `ThreadBound<T>` may be moved to another thread, but its `T` is only ever reached
// through `get`/`get_mut`/`drop`, which check that the current thread is the owner (panicking
// or aborting otherwise). So `T` is never accessed, shared or dropped off its thread, which is
// exactly what `!Send` forbids; moving the bytes of the wrapper itself touches nothing in `T`.
unsafe impl<T> Send for ThreadBound<T> {}

// SAFETY: `&ThreadBound<T>` on another thread can only call `is_owner` (which reads the
// immutable `owner`) or `get`, which panics before handing out `&T`. No two threads can ever
// hold a `&T` at the same time.
unsafe impl<T> Sync for ThreadBound<T> {}

impl<T> std::fmt::Debug for ThreadBound<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadBound")
            .field("what", &self.what)
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    #[test]
    fn owner_thread_uses_and_drops_the_value() {
        let counter = Rc::new(());
        let mut bound = ThreadBound::new("test value", counter.clone());
        assert!(bound.is_owner());
        assert_eq!(Rc::strong_count(bound.get()), 2);
        let _ = bound.get_mut();
        drop(bound);
        assert_eq!(Rc::strong_count(&counter), 1, "the inner value was dropped");
    }

    #[test]
    fn use_on_another_thread_panics_with_a_clear_message() {
        let bound = std::sync::Arc::new(ThreadBound::new("test value", Rc::new(5)));
        let remote = bound.clone();
        let err = thread::spawn(move || {
            let _ = remote.get();
        })
        .join()
        .expect_err("use on a foreign thread must panic");
        let message = err
            .downcast_ref::<String>()
            .expect("panic message is a String");
        assert!(message.contains("test value used on thread"), "{message}");
        // The foreign thread panicked before touching the Rc; the last owner drops it here.
        assert_eq!(**bound.get(), 5);
    }

    /// Run in a child process: a drop on a foreign thread must abort the whole process.
    #[test]
    fn drop_on_another_thread_aborts() {
        const CHILD: &str = "SLUICE_QUIC_GUARD_CHILD";
        if std::env::var_os(CHILD).is_some() {
            let bound = ThreadBound::new("test value", Rc::new(1));
            let _ = thread::spawn(move || drop(bound)).join();
            // Unreachable if the guard works; exit cleanly so the parent sees the failure.
            std::process::exit(0);
        }
        let exe = std::env::current_exe().expect("test binary path");
        let out = std::process::Command::new(exe)
            .args([
                "--exact",
                "quic::guard::tests::drop_on_another_thread_aborts",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .output()
            .expect("run the child test process");
        let stderr = String::from_utf8_lossy(&out.stderr);
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGABRT),
            "child must abort; status {:?}, stderr: {stderr}",
            out.status
        );
        assert!(
            stderr.contains("test value dropped on thread"),
            "stderr: {stderr}"
        );
    }
}
