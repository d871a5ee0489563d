//! Running storage on glommio: executor set-up that respects this machine's limits.

use std::io;

/// I/O memory glommio registers per executor (it registers it in 3 rings; 1 MiB fits the
/// 8 MiB memlock limit of these machines with room for several executors).
pub const IO_MEMORY_BYTES: usize = 1024 * 1024;

/// A builder for one executor, with memlock raised and I/O memory sized to fit.
pub fn executor_builder(
    name: &str,
    placement: glommio::Placement,
) -> glommio::LocalExecutorBuilder {
    if let Err(e) = crate::fs::raise_memlock_limit() {
        tracing::warn!(error = %e, "could not raise RLIMIT_MEMLOCK");
    }
    glommio::LocalExecutorBuilder::new(placement)
        .name(name)
        .io_memory(IO_MEMORY_BYTES)
}

/// Runs `f` to completion on a fresh, unpinned executor on a new thread (tests and tools).
pub fn run<T, G, Fut>(name: &str, f: G) -> io::Result<T>
where
    G: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T> + 'static,
    T: Send + 'static,
{
    executor_builder(name, glommio::Placement::Unbound)
        .spawn(f)
        .map_err(|e| io::Error::other(e.to_string()))?
        .join()
        .map_err(|e| io::Error::other(e.to_string()))
}
