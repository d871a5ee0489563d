// Unless explicitly stated otherwise all files in this repository are licensed
// under the MIT/Apache-2.0 License, at your convenience
//
// This product includes software developed at Datadog (https://www.datadoghq.com/). Copyright 2020 Datadog, Inc.
//
// Buffers that are friendly to be used with O_DIRECT files.
// For the time being they are really only properly aligned,
// but in the near future they can be coming from memory-areas
// that are pre-registered for I/O uring.

use std::ptr;

use crate::sys::uring::UringBuffer;
use alloc::alloc::Layout;

#[derive(Debug)]
pub(crate) struct SysAlloc {
    data: ptr::NonNull<u8>,
    layout: Layout,
}

impl SysAlloc {
    fn new(size: usize) -> Option<Self> {
        if size == 0 {
            None
        } else {
            let layout = Layout::from_size_align(size, 4096).unwrap();
            let data = unsafe { alloc::alloc::alloc(layout) };
            let data = ptr::NonNull::new(data)?;
            Some(SysAlloc { data, layout })
        }
    }

    fn as_ptr(&self) -> *const u8 {
        self.data.as_ptr()
    }

    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.data.as_ptr()
    }
}

impl Drop for SysAlloc {
    fn drop(&mut self) {
        unsafe {
            alloc::alloc::dealloc(self.data.as_ptr(), self.layout);
        }
    }
}

#[derive(Debug)]
pub(crate) enum BufferStorage {
    Sys(SysAlloc),
    Uring(UringBuffer),
    EventFd(*mut u8),
}

impl BufferStorage {
    fn as_ptr(&self) -> *const u8 {
        match self {
            BufferStorage::Sys(x) => x.as_ptr(),
            BufferStorage::Uring(x) => x.as_ptr(),
            BufferStorage::EventFd(x) => *x as *const u8,
        }
    }

    fn as_mut_ptr(&mut self) -> *mut u8 {
        match self {
            BufferStorage::Sys(x) => x.as_mut_ptr(),
            BufferStorage::Uring(x) => x.as_mut_ptr(),
            BufferStorage::EventFd(x) => *x,
        }
    }
}

#[derive(Debug)]
/// A buffer suitable for Direct I/O over io_uring
///
/// Direct I/O has strict requirements about alignment. On top of that, io_uring
/// places additional restrictions on memory placement if we are to use advanced
/// features like registered buffers.
///
/// The `DmaBuffer` is a buffer that adheres to those properties making it
/// suitable for io_uring's Direct I/O.
pub struct DmaBuffer {
    storage: BufferStorage,
    // Invariant: trim + size are at most one byte past the original allocation.
    trim: usize,
    size: usize,
}

impl DmaBuffer {
    pub(crate) fn new(size: usize) -> Option<DmaBuffer> {
        Some(DmaBuffer {
            storage: BufferStorage::Sys(SysAlloc::new(size)?),
            size,
            trim: 0,
        })
    }

    pub(crate) fn with_storage(size: usize, storage: BufferStorage) -> DmaBuffer {
        DmaBuffer {
            storage,
            size,
            trim: 0,
        }
    }

    pub(crate) fn uring_buffer_id(&self) -> Option<u32> {
        match &self.storage {
            BufferStorage::Uring(x) => x.uring_buffer_id(),
            _ => None,
        }
    }

    /// Reduce the length of this buffer to be `newsize`. This value must be <= the current
    /// [`len`](#method.len) and is a destructive operation (length cannot be increased).
    /// NOTE: When using this with DmaFile, you have to make sure that `newsize` is properly
    /// aligned or the write will fail due to O_DIRECT requirements.
    pub fn trim_to_size(&mut self, newsize: usize) {
        assert!(newsize <= self.size);
        self.size = newsize;
    }

    /// Returns a representation of the current addressable contents of this
    /// `DmaBuffer` as a byte slice
    pub fn as_bytes(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.size) }
    }

    /// Returns a representation of the current addressable contents of this
    /// `DmaBuffer` as a mutable byte slice
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr(), self.size) }
    }

    /// Returns the current number of bytes present in the addressable contents
    /// of this `DmaBuffer`
    pub fn len(&self) -> usize {
        self.size
    }

    /// Indicates whether this buffer is empty. An empty buffer can be,
    /// for instance, the result of a read past the end of a file.
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// Returns a representation of the current addressable contents of this
    /// `DmaBuffer` as mutable pointer
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        unsafe { self.storage.as_mut_ptr().add(self.trim) }
    }

    /// Returns a representation of the current addressable contents of this
    /// `DmaBuffer` as pointer
    pub fn as_ptr(&self) -> *const u8 {
        unsafe { self.storage.as_ptr().add(self.trim) }
    }
}

// Sluice patch: a completed read's buffer handed over to the caller without a copy.
impl DmaBuffer {
    /// Where `[ptr, ptr + len)` starts in this buffer's allocation, if the buffer is a plain
    /// allocation (not a registered io_uring buffer, not an eventfd's) and holds that range.
    pub(crate) fn owned_start(&self, ptr: *const u8, len: usize) -> Option<usize> {
        let BufferStorage::Sys(alloc) = &self.storage else {
            return None;
        };
        let start = (ptr as usize).checked_sub(alloc.as_ptr() as usize)?;
        (start.checked_add(len)? <= alloc.layout.size()).then_some(start)
    }

    /// The `len` bytes at `start` of the allocation as an [`OwnedReadBuffer`]; `start` and
    /// `len` come from [`DmaBuffer::owned_start`] (anything else gives the buffer back).
    pub(crate) fn into_owned(self, start: usize, len: usize) -> Result<OwnedReadBuffer, DmaBuffer> {
        match self.storage {
            BufferStorage::Sys(alloc)
                if start
                    .checked_add(len)
                    .is_some_and(|end| end <= alloc.layout.size()) =>
            {
                Ok(OwnedReadBuffer { alloc, start, len })
            }
            storage => Err(DmaBuffer {
                storage,
                trim: self.trim,
                size: self.size,
            }),
        }
    }
}

/// Sluice patch: the bytes of a completed read, moved out of glommio without a copy
/// ([`ReadResult::into_owned`](crate::io::ReadResult::into_owned)). The memory is a plain
/// allocation of the global allocator that no reactor, source or kernel operation refers to
/// any more, so it may be sent to and dropped on any thread.
#[derive(Debug)]
pub struct OwnedReadBuffer {
    alloc: SysAlloc,
    start: usize,
    len: usize,
}

// SAFETY (Sluice patch): `alloc` comes from the global allocator and `SysAlloc::drop` frees
// it with the same layout, which any thread may do. An `OwnedReadBuffer` is the allocation's
// only owner: it is built only from a read that has completed (the kernel is done with the
// memory) and whose source gave the buffer up while no other handle to the source existed
// (`ScheduledSource::take_sole_read_buffer`), so nothing else can reach the memory.
unsafe impl Send for OwnedReadBuffer {}

impl OwnedReadBuffer {
    /// The read's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: `start + len` lies within the allocation (checked where it is built), and
        // the read wrote those bytes before it completed.
        unsafe { std::slice::from_raw_parts(self.alloc.as_ptr().add(self.start), self.len) }
    }
}

impl AsRef<[u8]> for OwnedReadBuffer {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl std::ops::Deref for OwnedReadBuffer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl AsRef<[u8]> for DmaBuffer {
    #[inline(always)]
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl AsMut<[u8]> for DmaBuffer {
    #[inline(always)]
    fn as_mut(&mut self) -> &mut [u8] {
        self.as_bytes_mut()
    }
}
