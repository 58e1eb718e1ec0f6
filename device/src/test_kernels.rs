//! Test kernels: small kernels that drive device code paths only the GPU takes — the packed
//! `add.rn.f16x2` / `add.rn.bf16x2` sums of [`CommonSum`], LL128's whole-line stores
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
use crate::reduce::{CommonSum, Reduce, Reducer};
use crate::wait::record_error;
use mscclpp_shared::packet::ll128;
use mscclpp_shared::{DataType, DeviceErrorCode, DeviceReduceOp, TestKernelParams};

crate::kernel! {
    /// `out[i] = a[i] op b[i]` for every 32-bit word `i < count` (each one 32-bit lane or
    /// several narrower ones), grid-stride over 8-byte units: the common sums (f16, bf16, f32)
    /// through [`CommonSum`] (the main collective kernels' packed adds), every other pair
    /// through [`Reducer`]. An unknown `dtype` or `op` records `InvalidArgument` and returns.
    fn reduce_words_test_kernel(p: TestKernelParams) {
        let known = (DataType::from_u32(p.dtype), DeviceReduceOp::from_u32(p.op));
        let (Some(dtype), Some(op)) = known else {
            record_error(p.status, DeviceErrorCode::InvalidArgument, p.dtype as u64);
            return;
        };
        let Some(any) = Reducer::new(dtype, op, 0) else {
            record_error(p.status, DeviceErrorCode::InvalidArgument, p.op as u64);
            return;
        };
        let common = op.is_common_sum(dtype);
        let (a, b, out) = (
            p.a.as_ptr() as *const u32,
            p.b.as_ptr() as *const u32,
            p.out.as_ptr() as *mut u32,
        );
        let units = p.count.div_ceil(2);
        let mut u = arch::global_thread_idx() as u64;
        while u < units {
            let (i, two) = (2 * u, 2 * u + 1 < p.count);
            // SAFETY: the launcher passes `count` words at `a`, `b` and `out`; the second
            // word of a unit is touched only when `2u + 1 < count`.
            unsafe {
                let load = |x: *const u32| {
                    let hi = if two { x.add(i as usize + 1).read() } else { 0 };
                    [x.add(i as usize).read(), hi]
                };
                let (x, y) = (load(a), load(b));
                let r = if common {
                    CommonSum(dtype).fold(x, y)
                } else {
                    any.fold(x, y)
                };
                out.add(i as usize).write(r[0]);
                if two {
                    out.add(i as usize + 1).write(r[1]);
                }
            }
            u += arch::global_thread_count() as u64;
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
