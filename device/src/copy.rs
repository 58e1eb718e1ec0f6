//! Collective memory copies: every thread of a group moves a strided share of the bytes.

use crate::arch;

/// Grid-stride byte copy; 16-byte vectors when both ends are 16-byte aligned.
///
/// # Safety
/// `src` and `dst` must be valid for `bytes` and must not overlap.
#[inline(always)]
pub unsafe fn copy(dst: *mut u8, src: *const u8, bytes: u64, tid: u64, nthreads: u64) {
    let mut done = 0u64;
    if (dst as usize | src as usize).is_multiple_of(16) {
        let vecs = bytes / 16;
        let mut i = tid;
        while i < vecs {
            // SAFETY: `i < bytes / 16` and both ends are 16-byte aligned (checked above).
            unsafe {
                let v = arch::ld_v4_u32(src.add((i * 16) as usize) as *const u32);
                arch::st_v4_u32(dst.add((i * 16) as usize) as *mut u32, v);
            }
            i += nthreads;
        }
        done = vecs * 16;
    }
    let mut i = done + tid;
    while i < bytes {
        // SAFETY: `i < bytes`.
        unsafe { dst.add(i as usize).write(src.add(i as usize).read()) };
        i += nthreads;
    }
}
