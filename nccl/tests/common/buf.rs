//! Buffers the tests hand to the C API: plain host memory (the CPU backend's device memory
//! is host memory) or memory from `ncclMemAlloc` (exportable: the zero-copy paths take it).

use std::ffi::c_void;

use super::{nccl, ok};

/// A buffer of bytes at a stable address.
pub struct Buf {
    ptr: *mut u8,
    len: usize,
    /// Memory of `ncclMemAlloc` (freed with `ncclMemFree`), else a leaked-until-drop box.
    from_nccl: bool,
}

// SAFETY: the buffer is plain memory owned by this value; the tests hand it to one rank.
unsafe impl Send for Buf {}

impl Buf {
    /// A buffer holding `bytes`, from `ncclMemAlloc` if `nccl_mem`.
    pub fn new(bytes: &[u8], nccl_mem: bool) -> Buf {
        let len = bytes.len();
        let ptr = if nccl_mem {
            let mut p: *mut c_void = std::ptr::null_mut();
            ok(
                unsafe { (nccl().mem_alloc)(&mut p, len.max(1)) },
                "ncclMemAlloc",
            );
            p.cast::<u8>()
        } else {
            Box::into_raw(vec![0u8; len.max(1)].into_boxed_slice()).cast::<u8>()
        };
        // SAFETY: `ptr` holds at least `len` bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr, len) };
        Buf {
            ptr,
            len,
            from_nccl: nccl_mem,
        }
    }

    /// The address of byte `offset`.
    pub fn at(&self, offset: usize) -> *mut c_void {
        assert!(offset <= self.len);
        // SAFETY: inside (or one past) the buffer.
        unsafe { self.ptr.add(offset) }.cast()
    }

    /// The first byte's address.
    pub fn ptr(&self) -> *mut c_void {
        self.at(0)
    }

    /// A copy of the bytes (call once the work on them is complete: on the CPU backend, when
    /// the call or the group returned).
    pub fn read(&self) -> Vec<u8> {
        // SAFETY: `len` bytes at `ptr` are ours.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }.to_vec()
    }

    /// Writes `bytes` at byte `offset` (call when no work on the buffer is pending).
    pub fn write(&self, offset: usize, bytes: &[u8]) {
        assert!(offset + bytes.len() <= self.len);
        // SAFETY: inside the buffer (checked); the caller's contract: no work is pending.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.add(offset), bytes.len()) };
    }

    /// Bytes `range`.
    pub fn read_range(&self, range: std::ops::Range<usize>) -> Vec<u8> {
        self.read()[range].to_vec()
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        if self.from_nccl {
            let r = unsafe { (nccl().mem_free)(self.ptr.cast()) };
            if r != 0 && !std::thread::panicking() {
                panic!("ncclMemFree: {r}");
            }
        } else {
            // SAFETY: made by `Box::into_raw` of a slice of `len.max(1)` bytes.
            drop(unsafe {
                Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                    self.ptr,
                    self.len.max(1),
                ))
            });
        }
    }
}
