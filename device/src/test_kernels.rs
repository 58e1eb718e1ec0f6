//! Test kernels: small kernels that drive device code paths only the GPU takes — the packed
//! `add.rn.f16x2` / `add.rn.bf16x2` sums of [`reduce_word`], LL128's whole-line stores
//! ([`arch::WARP_LINE_STORES_WHOLE`]) — from a single GPU, so that tests can check them
//! against host references (`tests/runtime.rs`). The CPU backend runs them too, through the
//! host twins of the same paths, which checks the tests' own logic in CI. The library does
//! not use them.
//!
//! Memory: every pointer in the parameters is device memory the host allocated for the launch;
//! only the kernel writes `out` (and, for LL128, block 0 writes the line buffer `b`, which block
//! 1 reads with the LL128 flag protocol of [`crate::ll128`]).

use crate::arch;
use crate::ll128::{read_line_part, store_line_part};
use crate::reduce::reduce_word;
use crate::wait::record_error;
use mscclpp_shared::packet::ll128;
use mscclpp_shared::{DataType, DeviceErrorCode, ReduceOp, TestKernelParams};

crate::kernel! {
    /// `out[i] = reduce_word(a[i], b[i], dtype, op)` for every 32-bit word `i < count`,
    /// grid-stride. An unknown `dtype` or `op` records `InvalidArgument` and returns.
    fn reduce_words_test_kernel(p: TestKernelParams) {
        let (Some(dtype), Some(op)) = (DataType::from_u32(p.dtype), ReduceOp::from_u32(p.op))
        else {
            record_error(p.status, DeviceErrorCode::InvalidArgument, p.dtype as u64);
            return;
        };
        let (a, b, out) = (
            p.a.as_ptr() as *const u32,
            p.b.as_ptr() as *const u32,
            p.out.as_ptr() as *mut u32,
        );
        let mut i = arch::global_thread_idx() as u64;
        while i < p.count {
            // SAFETY: the launcher passes `count` words at `a`, `b` and `out`.
            unsafe {
                let r = reduce_word(a.add(i as usize).read(), b.add(i as usize).read(), dtype, op);
                out.add(i as usize).write(r);
            }
            i += arch::global_thread_count() as u64;
        }
    }
}

crate::kernel! {
    /// Block 0's warps send the `count` bytes at `a` as LL128 lines with flag `flag` into the
    /// line buffer `b` (`ll128::line_bytes_for(count)` bytes, 128-byte aligned); block 1's warps
    /// wait for the lines (bounded, abortable) and write their data to `out`. Warp `w` of a
    /// block carries steps `w`, `w + warps`, …, so the two blocks' warps pair up step by step.
    /// Launch with two blocks of whole warps.
    fn ll128_blocks_test_kernel(p: TestKernelParams) {
        let lanes = ll128::WARP_LANES as u32;
        let lane = (arch::thread_idx_x() % lanes) as usize;
        let warp = (arch::thread_idx_x() / lanes) as u64;
        let warps = (arch::block_dim_x() / lanes) as u64;
        let steps = p.count.div_ceil(ll128::WARP_DATA_BYTES as u64);
        let (off, width) = ll128::lane_data(lane);
        let sender = arch::block_idx_x() == 0;
        let mut step = warp;
        // Every lane of a warp runs the same steps (the loop depends on the warp only), as the
        // line calls need.
        while step < steps {
            let at = step * ll128::WARP_LINE_BYTES as u64 + 16 * lane as u64;
            // SAFETY: the line buffer holds every step's lines; 16-byte aligned lane parts.
            let part = unsafe { p.b.as_ptr().add(at as usize) } as *mut u32;
            let start = step * ll128::WARP_DATA_BYTES as u64 + off as u64;
            let len = (width as u64).min(p.count.saturating_sub(start)) as usize;
            if sender {
                let mut v = [0u32; 4];
                for i in 0..len {
                    // SAFETY: `start + i < count`, inside `a`.
                    let byte = unsafe { p.a.as_ptr().add(start as usize + i).read() };
                    v[i / 4] |= (byte as u32) << (8 * (i % 4));
                }
                // SAFETY: this lane's part of the step's lines, as above.
                unsafe { store_line_part(part, v, lane, p.flag) };
            } else {
                // SAFETY: as above; every lane of the warp calls it.
                let Ok(v) = (unsafe { read_line_part(part, lane, p.flag, p.status) }) else {
                    return;
                };
                for i in 0..len {
                    // SAFETY: `start + i < count`, inside `out`.
                    unsafe {
                        p.out
                            .as_ptr()
                            .add(start as usize + i)
                            .write((v[i / 4] >> (8 * (i % 4))) as u8)
                    };
                }
            }
            step += warps;
        }
    }
}
