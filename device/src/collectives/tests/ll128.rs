//! The LL128 kernels: all-reduce, all-gather and reduce-scatter on one warp and on several
//! warps of several blocks (steps spread over the warps, the keeper block), sizes of a part
//! line up to a full slot, unaligned buffers (the 8- and 16-byte paths), the `_any` twin.

use super::call::{Call, back_to_back, run, run_in_place};
use super::world::{LL128_SLOT, Region, World};
use crate::collectives::{
    ll128_all_reduce_kernel, ll128_collective_any_kernel, ll128_collective_kernel,
};
use mscclpp_shared::{CollectiveMode as M, DataType, DeviceReduceOp as Op};

/// (blocks, threads): one warp; two blocks of two warps and the keeper.
const SHAPES: [(u32, u32); 2] = [(1, 32), (3, 64)];

/// Data bytes a slot holds: 120 of every 128.
const FULL: u64 = LL128_SLOT / 128 * 120;

#[test]
fn the_all_reduce_kernel_from_one_line_to_a_full_slot() {
    for n in [2, 3] {
        let w = World::ending_with(n, 3, Region::Ll128);
        for (grid, block) in SHAPES {
            for (k, (bytes, offset)) in [(4 * 301, 0), (FULL, 0), (12, 0), (4 * 301, 4), (480, 8)]
                .into_iter()
                .enumerate()
            {
                let c = Call::new(M::AllReduce, bytes)
                    .offset(offset)
                    .seed(k as u32 + 5 * n);
                run(&w, ll128_all_reduce_kernel, c, grid, block);
            }
            run_in_place(
                &w,
                ll128_all_reduce_kernel,
                Call::new(M::AllReduce, 1000),
                grid,
                block,
            );
        }
    }
}

#[test]
fn the_collective_kernel_gathers_and_scatters_every_part() {
    let w = World::ending_with(3, 3, Region::Ll128);
    let mut seed = 40;
    for (grid, block) in SHAPES {
        for (bytes, offset) in [(4 * 301, 0), (FULL, 0), (20, 0), (4 * 301, 4), (4 * 301, 1)] {
            for mode in [M::AllGather, M::ReduceScatter] {
                if mode == M::ReduceScatter && offset % 4 != 0 {
                    continue;
                }
                for stride in [0, bytes.next_multiple_of(16) + 24] {
                    seed += 1;
                    let c = Call::new(mode, bytes)
                        .stride(stride)
                        .offset(offset)
                        .seed(seed);
                    run(&w, ll128_collective_kernel, c, grid, block);
                }
            }
        }
    }
}

#[test]
fn the_any_kernel_reduces_every_operator() {
    let w = World::ending_with(3, 3, Region::Ll128);
    let cases = [
        (DataType::I32, Op::Max, 0),
        (DataType::I32, Op::SumPostDiv, 3),
        (DataType::F32, Op::PreMulSum, 0.25f32.to_bits()),
    ];
    for (grid, block) in SHAPES {
        for (k, (dtype, op, scalar)) in cases.into_iter().enumerate() {
            for mode in [M::AllReduce, M::ReduceScatter] {
                let c = Call::new(mode, 4 * 301)
                    .with(dtype, op)
                    .scalar(scalar)
                    .seed(k as u32);
                run(&w, ll128_collective_any_kernel, c, grid, block);
            }
        }
    }
}

#[test]
fn a_late_rank_is_never_overrun_by_calls_queued_back_to_back() {
    let w = World::ending_with(3, 3, Region::Ll128);
    for (late, grid) in [(2, 1), (0, 3)] {
        let ar = Call::new(M::AllReduce, 4 * 301);
        back_to_back(&w, ll128_all_reduce_kernel, ar, late, grid, 64);
        let ag = Call::new(M::AllGather, 4 * 301);
        back_to_back(&w, ll128_collective_kernel, ag, late, grid, 64);
    }
}
