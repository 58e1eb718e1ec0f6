//! The LL16 kernels and the two-shot all-reduce: every mode of the all-mode kernels, the
//! all-reduce and all-gather kernels' whole-word and byte paths (odd sizes, unaligned
//! buffers, parts a stride apart), the reduce to every root, one block and several (the
//! keeper block), calls back to back (the flag's two halves), and the refusals.

use super::call::{Call, back_to_back, buffers, run, run_in_place};
use super::world::{MARK, Region, World};
use crate::collectives::{
    ll_all_gather_kernel, ll_all_reduce_kernel, ll_collective_any_kernel, ll_collective_kernel,
    ll_reduce_kernel, ll_two_shot_all_reduce_any_kernel, ll_two_shot_all_reduce_kernel,
};
use mscclpp_shared::{
    CollectiveMode as M, CollectiveParams, DataType, DeviceErrorCode, DeviceReduceOp as Op,
};

/// 101 f32: not whole 8-byte words.
const ODD: u64 = 4 * 101;
/// 128 f32: whole words.
const WHOLE: u64 = 512;
/// (blocks, threads): one block, and two workers plus the keeper.
const SHAPES: [(u32, u32); 2] = [(1, 32), (3, 32)];

#[test]
fn the_all_mode_kernel_moves_every_part_to_its_place() {
    let w = World::ending_with(3, 3, Region::Ll16);
    let mut seed = 0;
    for (grid, block) in SHAPES {
        for bytes in [ODD, WHOLE, 12] {
            for mode in [M::ReduceScatter, M::AllToAll, M::AllGather] {
                seed += 1;
                for stride in [0, bytes.next_multiple_of(16) + 40] {
                    let c = Call::new(mode, bytes).stride(stride).seed(seed);
                    run(&w, ll_collective_kernel, c, grid, block);
                }
            }
            for root in 0..3 {
                seed += 1;
                let c = Call::new(M::Broadcast, bytes).root(root).seed(seed);
                run(&w, ll_collective_kernel, c, grid, block);
            }
        }
    }
}

#[test]
fn a_two_rank_exchange_swaps_the_inputs() {
    let w = World::ending_with(2, 3, Region::Ll16);
    for (k, (grid, block)) in SHAPES.into_iter().enumerate() {
        for bytes in [ODD, WHOLE] {
            let c = Call::new(M::Send, bytes).seed(k as u32 * 7 + bytes as u32);
            run(&w, ll_collective_kernel, c, grid, block);
        }
    }
}

#[test]
fn the_all_reduce_kernel_whole_words_bytes_and_unaligned() {
    for n in [2, 3, 4] {
        let w = World::ending_with(n, 3, Region::Ll16);
        for (grid, block) in SHAPES {
            for (k, (bytes, offset)) in [(ODD, 0), (WHOLE, 0), (WHOLE, 2), (8, 0)]
                .into_iter()
                .enumerate()
            {
                let c = Call::new(M::AllReduce, bytes)
                    .offset(offset)
                    .seed(k as u32 + n);
                run(&w, ll_all_reduce_kernel, c, grid, block);
            }
            run_in_place(
                &w,
                ll_all_reduce_kernel,
                Call::new(M::AllReduce, WHOLE).seed(50),
                grid,
                block,
            );
        }
    }
}

#[test]
fn the_all_gather_kernel_whole_words_bytes_strides_and_unaligned() {
    let w = World::ending_with(3, 3, Region::Ll16);
    let mut seed = 100;
    for (grid, block) in SHAPES {
        for (bytes, offset) in [(ODD, 0), (WHOLE, 0), (WHOLE, 4), (WHOLE, 1), (6, 0)] {
            for stride in [0, bytes + 8, bytes + 4] {
                seed += 1;
                let c = Call::new(M::AllGather, bytes)
                    .stride(stride)
                    .offset(offset)
                    .seed(seed);
                run(&w, ll_all_gather_kernel, c, grid, block);
            }
        }
    }
}

#[test]
fn the_reduce_kernel_reduces_into_every_root_only() {
    let w = World::ending_with(3, 3, Region::Ll16);
    for (grid, block) in SHAPES {
        for root in 0..3 {
            for (dtype, op, scalar) in [
                (DataType::F32, Op::Sum, 0),
                (DataType::I32, Op::Max, 0),
                (DataType::F32, Op::PreMulSum, 0.5f32.to_bits()),
            ] {
                let c = Call::new(M::Reduce, ODD)
                    .with(dtype, op)
                    .scalar(scalar)
                    .root(root);
                run(&w, ll_reduce_kernel, c.seed(root + grid), grid, block);
            }
        }
    }
}

#[test]
fn the_any_kernel_reduces_every_operator_in_every_reducing_mode() {
    let w = World::ending_with(3, 3, Region::Ll16);
    let cases = [
        (DataType::I32, Op::Min, 0),
        (DataType::I32, Op::Prod, 0),
        (DataType::I32, Op::SumPostDiv, 2),
        (DataType::F32, Op::PreMulSum, 3.0f32.to_bits()),
        (DataType::F32, Op::Sum, 0),
    ];
    for (grid, block) in SHAPES {
        for (k, (dtype, op, scalar)) in cases.into_iter().enumerate() {
            for mode in [M::AllReduce, M::ReduceScatter] {
                let c = Call::new(mode, ODD)
                    .with(dtype, op)
                    .scalar(scalar)
                    .seed(k as u32);
                run(&w, ll_collective_any_kernel, c, grid, block);
            }
        }
        // It moves data too.
        run(
            &w,
            ll_collective_any_kernel,
            Call::new(M::AllToAll, ODD).seed(77),
            grid,
            block,
        );
    }
}

#[test]
fn main_kernels_refuse_what_another_kernel_serves() {
    let w = World::ending_with(2, 1, Region::Ll16);
    let refused = [
        // The all-mode kernel's all-reduce is the all-reduce kernel's.
        (Call::new(M::AllReduce, 64), true),
        // A reduction that is not a common sum is the twin's.
        (
            Call::new(M::ReduceScatter, 64).with(DataType::I32, Op::Max),
            true,
        ),
        // The reduce is `ll_reduce_kernel`'s alone: the all-mode kernel does nothing.
        (Call::new(M::Reduce, 64), false),
    ];
    for (c, recorded) in refused {
        let b = buffers(&w, &c, false);
        let st = w.try_launch(ll_collective_kernel, &b.params, 1, 32, 0);
        for (r, s) in st.iter().enumerate() {
            let want = if recorded {
                DeviceErrorCode::InvalidArgument as u32
            } else {
                0
            };
            assert_eq!(s.error_code, want, "{c:?} rank {r}");
            assert!(
                b.outputs[r].get().iter().all(|&x| x == MARK),
                "{c:?} rank {r}"
            );
        }
    }
    let c = Call::new(M::AllReduce, 64).with(DataType::I32, Op::Sum);
    let b = buffers(&w, &c, false);
    let st = w.try_launch(ll_all_reduce_kernel, &b.params, 1, 32, 0);
    assert!(
        st.iter()
            .all(|s| s.error_code == DeviceErrorCode::InvalidArgument as u32)
    );
    // Nothing was sent: the next call still meets its peers at the same flag.
    run(
        &w,
        ll_all_reduce_kernel,
        Call::new(M::AllReduce, 64).seed(3),
        1,
        32,
    );
}

/// The two-shot part of `bytes` on `n` ranks, as the host sizes it.
fn part(n: u32, bytes: u64) -> u64 {
    bytes.div_ceil(n as u64).next_multiple_of(8)
}

#[test]
fn the_two_shot_all_reduce_reduces_every_part_and_gathers_it() {
    for n in [2, 3, 4] {
        let w = World::ending_with(n, 3, Region::Ll16);
        for (grid, block) in SHAPES {
            for (k, bytes) in [4 * 301u64, 4 * 256, 100].into_iter().enumerate() {
                let stride = part(n, bytes);
                assert!((n as u64 - 1) * stride < bytes && 4 * stride <= super::world::LL_SLOT);
                let c = Call::new(M::AllReduce, bytes)
                    .stride(stride)
                    .seed(k as u32 + 10 * n);
                run(&w, ll_two_shot_all_reduce_kernel, c, grid, block);
                let any = c.with(DataType::I32, Op::Max).seed(k as u32 + 20 * n);
                run(&w, ll_two_shot_all_reduce_any_kernel, any, grid, block);
            }
            let c = Call::new(M::AllReduce, 4 * 256)
                .stride(part(n, 4 * 256))
                .seed(99);
            run_in_place(&w, ll_two_shot_all_reduce_kernel, c, grid, block);
        }
    }
}

#[test]
fn a_late_rank_is_never_overrun_by_calls_queued_back_to_back() {
    let w = World::ending_with(3, 3, Region::Ll16);
    // One packet (a single thread waits for the acks), and several.
    for (bytes, late, grid) in [(8, 2, 1), (8, 0, 3), (ODD, 2, 3)] {
        let reduce = Call::new(M::Reduce, bytes).root(0);
        back_to_back(&w, ll_reduce_kernel, reduce, late, grid, 32);
        let bcast = Call::new(M::Broadcast, bytes).root(0);
        back_to_back(&w, ll_collective_kernel, bcast, late, grid, 32);
        let ar = Call::new(M::AllReduce, bytes);
        back_to_back(&w, ll_all_reduce_kernel, ar, late, grid, 32);
        let a2a = Call::new(M::AllToAll, bytes);
        back_to_back(&w, ll_collective_kernel, a2a, late, grid, 32);
    }
}

#[test]
fn a_two_shot_launch_whose_parts_do_not_fit_does_nothing() {
    let w = World::ending_with(3, 3, Region::Ll16);
    let bytes = 4 * 301;
    let good = part(3, bytes);
    // The edges that are served: the last part exactly as long as the others.
    let exact = Call::new(M::AllReduce, 3 * good).stride(good).seed(7);
    run(&w, ll_two_shot_all_reduce_kernel, exact, 3, 32);
    // What the host never launches: no part, parts of partial packets, a last part that is
    // empty or that the stride cannot hold, no ranks, a rank outside the world.
    type Spoil = fn(&mut CollectiveParams);
    let bad: [(&str, Spoil); 7] = [
        ("stride 0", |p| p.stride = 0),
        ("stride of partial packets", |p| p.stride -= 4),
        ("an empty last part", |p| p.bytes = 2 * p.stride),
        ("parts past the data", |p| {
            p.stride = p.bytes.div_ceil(2) + 8
        }),
        ("parts short of the data", |p| p.stride -= 8),
        ("no ranks", |p| p.nranks = 0),
        ("a rank outside the world", |p| p.rank = p.nranks),
    ];
    for (what, spoil) in bad {
        let c = Call::new(M::AllReduce, bytes).stride(good);
        let mut b = buffers(&w, &c, false);
        for p in b.params.iter_mut() {
            spoil(p);
        }
        let st = w.try_launch(ll_two_shot_all_reduce_kernel, &b.params, 3, 32, 0);
        for (r, s) in st.iter().enumerate() {
            assert_eq!(s.error_code, 0, "{what}: rank {r}");
            assert!(
                b.outputs[r].get().iter().all(|&x| x == MARK),
                "{what}: rank {r}"
            );
        }
        // Nothing was sent and no flag moved: the next call meets every peer.
        run(
            &w,
            ll_two_shot_all_reduce_kernel,
            c.seed(what.len() as u32),
            3,
            32,
        );
    }
}

/// The pre-multiplied sums (and so the floating averages, which the host lowers to them) of
/// f16, bf16 and f32 reduce inline in the main LL kernels, as the sums do: the main kernel
/// records nothing (it is not refused for the `_any` twin), its f32 results match the host
/// reference, and for all three types its output is the twin's bit for bit (the twin's
/// results are checked against the host reference above; the drop-in's tests check every
/// type against an independent one through the C ABI). On 2 and 4 ranks, at sizes of whole
/// words, odd ones and one unit.
#[test]
fn main_kernels_reduce_premulsums_inline() {
    type K = unsafe fn(CollectiveParams);
    let kernels: [(&str, K, K, M); 3] = [
        (
            "all-reduce",
            ll_all_reduce_kernel,
            ll_collective_any_kernel,
            M::AllReduce,
        ),
        (
            "reduce-scatter",
            ll_collective_kernel,
            ll_collective_any_kernel,
            M::ReduceScatter,
        ),
        (
            "two-shot",
            ll_two_shot_all_reduce_kernel,
            ll_two_shot_all_reduce_any_kernel,
            M::AllReduce,
        ),
    ];
    // 2.5 and -0.75 as one element of each type (f32 bits, f16 0x4100 / 0xba00, bf16
    // 0x4020 / 0xbf40).
    let scalars = [
        (DataType::F32, 2.5f32.to_bits()),
        (DataType::F32, (-0.75f32).to_bits()),
        (DataType::F16, 0x4100),
        (DataType::F16, 0xba00),
        (DataType::BF16, 0x4020),
        (DataType::BF16, 0xbf40),
    ];
    let mut seed = 500;
    for n in [2, 4] {
        let w = World::ending_with(n, 3, Region::Ll16);
        let all: std::vec::Vec<u32> = (0..n).collect();
        for (name, main, any, mode) in kernels {
            for (dtype, scalar) in scalars {
                for bytes in [WHOLE, 4 * 301, 8] {
                    seed += 1;
                    let mut c = Call::new(mode, bytes)
                        .with(dtype, Op::PreMulSum)
                        .scalar(scalar)
                        .seed(seed);
                    if name == "two-shot" {
                        // Only the shapes the host gives it: every part non-empty.
                        let stride = part(n, bytes);
                        if (n as u64 - 1) * stride >= bytes {
                            continue;
                        }
                        c = c.stride(stride);
                    }
                    let inline = buffers(&w, &c, false);
                    w.launch(main, &inline.params, 3, 32, 0);
                    let twin = buffers(&w, &c, false);
                    w.launch(any, &twin.params, 3, 32, 0);
                    for r in 0..n as usize {
                        assert!(
                            inline.outputs[r].get() == twin.outputs[r].get(),
                            "{name} {c:?}: rank {r} of {n} differs from the twin's"
                        );
                    }
                    if dtype == DataType::F32 {
                        inline.check(&w, &c, &all);
                    }
                }
            }
        }
    }
}
