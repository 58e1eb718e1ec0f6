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
        // Four independent loads in flight before the stores (remote reads are latency-bound).
        while i + 3 * nthreads < vecs {
            // SAFETY: `i + 3 * nthreads < bytes / 16`; both ends are 16-byte aligned.
            unsafe {
                let at = |k: u64| ((i + k * nthreads) * 16) as usize;
                let v0 = arch::ld_v4_u32(src.add(at(0)) as *const u32);
                let v1 = arch::ld_v4_u32(src.add(at(1)) as *const u32);
                let v2 = arch::ld_v4_u32(src.add(at(2)) as *const u32);
                let v3 = arch::ld_v4_u32(src.add(at(3)) as *const u32);
                arch::st_v4_u32(dst.add(at(0)) as *mut u32, v0);
                arch::st_v4_u32(dst.add(at(1)) as *mut u32, v1);
                arch::st_v4_u32(dst.add(at(2)) as *mut u32, v2);
                arch::st_v4_u32(dst.add(at(3)) as *mut u32, v3);
            }
            i += 4 * nthreads;
        }
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
