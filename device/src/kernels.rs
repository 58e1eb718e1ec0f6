//! The built-in kernels. Each is a thin entry point (see [`crate::kernel!`]) over
//! `#[inline(always)]` device functions; each takes one parameter struct from
//! `mscclpp_shared::kernel_params`.

use crate::arch;
use crate::fifo::FifoDevice;
use mscclpp_shared::{
    BlockSumParams, CopyParams, FifoPushParams, ProxyTrigger, TriggerFields, TriggerType,
};

/// Grid-stride byte copy; 16-byte vectors when both ends are 16-byte aligned.
///
/// # Safety
/// `src` and `dst` must be valid for `bytes` and must not overlap.
#[inline(always)]
pub unsafe fn copy(dst: *mut u8, src: *const u8, bytes: u64, tid: u64, nthreads: u64) {
    let mut done = 0u64;
    if (dst as usize | src as usize) % 16 == 0 {
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

crate::kernel! {
    /// Copies `p.bytes` from `p.src` to `p.dst` with every thread of the grid.
    fn copy_kernel(p: CopyParams) {
        // SAFETY: the launcher passes buffers valid for `bytes` (kernel contract).
        unsafe {
            copy(
                p.dst.as_ptr(),
                p.src.as_ptr(),
                p.bytes,
                arch::global_thread_idx() as u64,
                arch::global_thread_count() as u64,
            )
        }
    }
}

crate::kernel! {
    /// Block `b` writes the sum of `input[b*n..(b+1)*n]` to `output[b]`, reducing through
    /// dynamic shared memory (`block_dim * 4` bytes) and `sync_threads`.
    fn block_sum_kernel(p: BlockSumParams) {
        let t = arch::thread_idx_x();
        let b = arch::block_idx_x();
        let bd = arch::block_dim_x();
        let n = p.n_per_block;
        let smem = arch::dynamic_shared_mem() as *mut u32;
        let mut acc = 0u32;
        let mut i = t;
        while i < n {
            // SAFETY: the launcher passes `grid_dim * n_per_block` inputs.
            acc = acc.wrapping_add(unsafe { p.input.as_ptr().add((b * n + i) as usize).read() });
            i += bd;
        }
        // SAFETY: the launcher gives `block_dim * 4` bytes of shared memory; each thread writes
        // its own slot, and barriers separate the writes from the reads below.
        unsafe { smem.add(t as usize).write_volatile(acc) };
        arch::sync_threads();
        let mut stride = bd.next_power_of_two() / 2;
        while stride > 0 {
            if t < stride && t + stride < bd {
                // SAFETY: both indices are `< block_dim`; see above.
                unsafe {
                    let other = smem.add((t + stride) as usize).read_volatile();
                    let mine = smem.add(t as usize).read_volatile();
                    smem.add(t as usize).write_volatile(mine.wrapping_add(other));
                }
            }
            arch::sync_threads();
            stride /= 2;
        }
        if t == 0 {
            // SAFETY: `output` holds `grid_dim` elements; slot 0 is final after the last barrier.
            unsafe { p.output.as_ptr().add(b as usize).write(smem.read_volatile()) };
        }
    }
}

crate::kernel! {
    /// Every thread pushes `p.per_thread` DATA triggers: `size` = global thread index,
    /// `src_offset` = the trigger's index. Stops at the first failed push (abort or timeout).
    fn fifo_push_kernel(p: FifoPushParams) {
        let tid = arch::global_thread_idx() as u64;
        for i in 0..p.per_thread as u64 {
            let trigger = ProxyTrigger::pack_unchecked(TriggerFields {
                size: tid,
                src_offset: i,
                dst_offset: 0,
                src_memory_id: 0,
                dst_memory_id: 0,
                kind: TriggerType::DATA,
                semaphore_id: 0,
            });
            if p.fifo.push(trigger).is_err() {
                return;
            }
        }
    }
}
