//! The staged kernels: every mode, in and out of place, one to three blocks, the `_any` twin's
//! reductions, the main kernel's refusal, a send / receive between two of three ranks.

use std::vec::Vec;

use super::call::{Call, EVERY_REDUCTION, buffers, run, run_in_place};
use super::world::{MARK, World};
use crate::collectives::{staged_collective_any_kernel, staged_collective_kernel};
use mscclpp_shared::status::error_detail;
use mscclpp_shared::{
    CollectiveMode as M, DataType, DeviceErrorCode, DeviceReduceOp as Op, WaitSite,
};

/// 1001 f32: not a multiple of 16 bytes, uneven over 3 ranks and 3 blocks.
const ODD: u64 = 4 * 1001;

#[test]
fn every_mode_moves_every_ranks_data_to_where_it_belongs() {
    let w = World::new(3, 3);
    for mode in [
        M::AllReduce,
        M::AllReducePut,
        M::AllGather,
        M::ReduceScatter,
        M::AllToAll,
    ] {
        for (grid, block) in [(3, 32), (1, 64)] {
            run(
                &w,
                staged_collective_kernel,
                Call::new(mode, ODD),
                grid,
                block,
            );
        }
    }
    for root in 0..3 {
        let c = Call::new(M::Broadcast, ODD).root(root).seed(root + 2);
        run(&w, staged_collective_kernel, c, 3, 32);
        run(
            &w,
            staged_collective_kernel,
            Call {
                mode: M::Reduce,
                ..c
            },
            2,
            32,
        );
    }
}

#[test]
fn parts_a_stride_apart_and_sizes_smaller_than_the_blocks_share() {
    let w = World::new(3, 3);
    for bytes in [4, 16, 40, 4 * 37] {
        for mode in [M::AllGather, M::ReduceScatter, M::AllToAll] {
            let c = Call::new(mode, bytes)
                .stride(bytes.next_multiple_of(16) + 48)
                .seed(bytes as u32);
            run(&w, staged_collective_kernel, c, 3, 32);
        }
        run(
            &w,
            staged_collective_kernel,
            Call::new(M::AllReduce, bytes),
            3,
            32,
        );
        run(
            &w,
            staged_collective_kernel,
            Call::new(M::AllReducePut, bytes),
            3,
            32,
        );
    }
}

#[test]
fn in_place_calls_back_to_back_on_two_and_four_ranks() {
    for n in [2, 4] {
        let w = World::new(n, 2);
        for k in 0..3 {
            let c = Call::new(M::AllReduce, ODD + 16 * k).seed(k as u32 + 9);
            run_in_place(&w, staged_collective_kernel, c, 2, 32);
            run_in_place(
                &w,
                staged_collective_kernel,
                Call {
                    mode: M::AllReducePut,
                    ..c
                },
                2,
                32,
            );
            run_in_place(
                &w,
                staged_collective_kernel,
                Call {
                    mode: M::Broadcast,
                    root: n - 1,
                    ..c
                },
                2,
                32,
            );
        }
    }
}

#[test]
fn the_any_twin_reduces_every_operator() {
    let w = World::new(3, 2);
    let cases = EVERY_REDUCTION;
    for (dtype, op, scalar) in cases {
        for mode in [M::AllReduce, M::AllReducePut, M::ReduceScatter, M::Reduce] {
            let c = Call::new(mode, ODD).with(dtype, op).scalar(scalar).root(1);
            run(&w, staged_collective_any_kernel, c, 2, 32);
        }
    }
}

#[test]
fn the_main_kernel_refuses_what_its_twin_serves_and_touches_nothing() {
    let w = World::new(2, 1);
    for mode in [M::AllReduce, M::ReduceScatter, M::Reduce] {
        let c = Call::new(mode, 64).with(DataType::I32, Op::Min);
        let b = buffers(&w, &c, false);
        let st = w.try_launch(staged_collective_kernel, &b.params, 1, 32, 0);
        for (r, s) in st.iter().enumerate() {
            assert_eq!(
                s.error_code,
                DeviceErrorCode::InvalidArgument as u32,
                "{mode:?} rank {r}"
            );
            // The detail names the type and operator refused.
            let what = (DataType::I32 as u64) << 8 | Op::Min as u64;
            assert_eq!(
                s.error_detail,
                error_detail(WaitSite::Unknown, what),
                "{mode:?}"
            );
            assert!(
                b.outputs[r].get().iter().all(|&x| x == MARK),
                "{mode:?} rank {r}"
            );
        }
    }
    // A copy of i32 is the main kernel's: served.
    run(
        &World::new(2, 1),
        staged_collective_kernel,
        Call::new(M::AllGather, 64).with(DataType::I32, Op::Min),
        1,
        32,
    );
}

#[test]
fn a_send_and_its_receive_meet_only_each_other() {
    let w = World::new(3, 2);
    for (k, (from, to)) in [(0u32, 2u32), (2, 0), (1, 2)].into_iter().enumerate() {
        let c = Call::new(M::Send, ODD).seed(k as u32 + 30);
        let b = buffers(&w, &c, false);
        let mut send = b.params[from as usize];
        send.mode = M::Send as u32;
        send.root = to;
        let mut recv = b.params[to as usize];
        recv.mode = M::Recv as u32;
        recv.root = from;
        w.launch(staged_collective_kernel, &[send, recv], 2, 32, 0);
        let want: Vec<u8> = b.inputs[from as usize].get()[..ODD as usize].to_vec();
        assert_eq!(
            &b.outputs[to as usize].get()[..ODD as usize],
            &want[..],
            "{from} -> {to}"
        );
        for r in 0..3 {
            b.outputs[r].check_slack("send / receive");
            if r != to as usize {
                assert!(
                    b.outputs[r].get().iter().all(|&x| x == MARK),
                    "{from} -> {to}: rank {r}"
                );
            }
        }
    }
}
