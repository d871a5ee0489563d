//! Handing freed memory back to the OS at the moments the broker frees a lot of it at once.
//!
//! `sluiced` (and the perf suite, which runs the broker in process) allocate with mimalloc.
//! mimalloc keeps memory it got back committed for a short delay and purges it lazily, when the
//! threads that use it allocate again. A shard that frees a snapshot's buffer (tens to hundreds
//! of MiB for a large FIFO state) and then goes quiet would keep that memory resident until it
//! works again: an idle broker holding a large backlog looked twice its size. So the shard asks
//! for the purge right after such a free ([`release_freed_memory`]); nothing on a request's
//! path calls it.

/// Returns the memory mimalloc holds freed to the OS now. Costs a walk of the calling thread's
/// heap and the purge of free arena memory: call it after freeing a large buffer, not per
/// request. Without mimalloc as the global allocator (the library's tests) it collects
/// mimalloc's own empty state and does nothing else.
pub fn release_freed_memory() {
    // SAFETY: `mi_collect` takes a flag and has no preconditions: it may be called from any
    // thread at any time, and it only frees memory mimalloc itself holds unused (mimalloc.h).
    unsafe { libmimalloc_sys::mi_collect(true) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::{GlobalAlloc, Layout};

    fn rss_kib() -> u64 {
        std::fs::read_to_string("/proc/self/status")
            .expect("status")
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .expect("VmRSS")
    }

    #[test]
    fn a_large_free_leaves_the_resident_set_once_released() {
        let mi = mimalloc::MiMalloc;
        let layout = Layout::from_size_align(256 << 20, 4096).expect("layout");
        // SAFETY: the layout has a non-zero size; the pointer is checked for null, written
        // within its size only, and freed once with the same layout.
        unsafe {
            let p = mi.alloc(layout);
            assert!(!p.is_null());
            for i in (0..layout.size()).step_by(4096) {
                *p.add(i) = 1;
            }
            let touched = rss_kib();
            mi.dealloc(p, layout);
            release_freed_memory();
            let released = rss_kib();
            assert!(
                released + 128 * 1024 < touched,
                "RSS {touched} KiB with the buffer, {released} KiB after it was freed and released"
            );
        }
    }
}
