//! The direct kernels, on buffers the host exchanged (every rank's buffers in the parameters)
//! and on registered buffers (each block learns its peers' from their descriptors): every
//! mode, parts a stride apart, the `_any` twin, the send / receive ring, the barrier, the local
//! reduction, every refusal of a bad descriptor, after which the ranks still meet, and the
//! decline of a launch with a gate, which lets the launch behind it run on every rank alike.

use std::vec;
use std::vec::Vec;

use super::call::{Buffers, Call, buffers};
use super::world::{MARK, World};
use crate::collectives::{
    direct_collective_any_kernel, direct_collective_kernel, staged_collective_kernel,
};
use mscclpp_shared::status::error_detail;
use mscclpp_shared::{
    BufferRef, CollectiveMode as M, DIRECT_SHARED_BYTES, DataType, DeviceErrorCode, DevicePtr,
    DeviceReduceOp as Op, DirectCollectiveParams, MAX_DIRECT_RANKS, REGISTRY_SLOTS, RegisteredCall,
    RegisteredRefusal, RegistrySlot, WaitSite,
};

/// 77 vectors: uneven over 3 ranks and 3 blocks.
const BYTES: u64 = 16 * 77;
/// The registration slots of rank `q`'s input (`IN_SLOT + q`) and output (`OUT_SLOT - q`):
/// every rank's differ, so a descriptor read from the wrong place names a slot the reader's
/// table does not hold for that peer. Their generation is `GEN`.
const IN_SLOT: u32 = 3;
const OUT_SLOT: u32 = 200;
const GEN: u32 = 7;

type Kernel = unsafe fn(DirectCollectiveParams);

/// Rank `r`'s parameters on buffers the host exchanged: every rank's input and output.
fn exchanged(w: &World, b: &Buffers) -> Vec<DirectCollectiveParams> {
    (0..w.n as usize)
        .map(|r| {
            let mut d = DirectCollectiveParams {
                common: b.params[r],
                ..Default::default()
            };
            for q in 0..w.n as usize {
                d.inputs[q] = b.params[q].input;
                d.outputs[q] = b.params[q].output;
            }
            d
        })
        .collect()
}

/// The registry every rank maps its peers' registrations into (one table serves every rank:
/// this process addresses every buffer the same way): each of rank `q`'s buffers registered
/// whole, from its start (a call's buffers begin `Call::offset` into them).
struct Registry(Vec<RegistrySlot>);

impl Registry {
    fn new(w: &World, b: &Buffers) -> Self {
        let mut t = vec![RegistrySlot::default(); MAX_DIRECT_RANKS * REGISTRY_SLOTS];
        for q in 0..w.n as usize {
            let slot = |buf: &super::world::Buf| RegistrySlot {
                base: buf.ptr(),
                len: buf.get().len() as u64,
                generation: GEN,
                ..Default::default()
            };
            t[q * REGISTRY_SLOTS + (IN_SLOT as usize + q)] = slot(&b.inputs[q]);
            t[q * REGISTRY_SLOTS + (OUT_SLOT as usize - q)] = slot(b.output(q as u32));
        }
        Self(t)
    }

    fn ptr(&self) -> DevicePtr<RegistrySlot> {
        DevicePtr::from_ptr(self.0.as_ptr() as *mut RegistrySlot)
    }
}

/// Rank `r`'s parameters on registered buffers: its own buffers only, its descriptor (buffers
/// `offset` bytes into their registrations), and what every buffer must hold (`need`).
fn registered(
    w: &World,
    b: &Buffers,
    reg: &Registry,
    need: [u64; 2],
    offset: u64,
) -> Vec<DirectCollectiveParams> {
    (0..w.n as usize)
        .map(|r| {
            let mut d = DirectCollectiveParams {
                common: b.params[r],
                registry: reg.ptr(),
                // The descriptors live where the staging region would (unused here).
                desc_offset: World::stage_offset(w.n),
                need,
                mine: RegisteredCall {
                    input: BufferRef {
                        slot: IN_SLOT + r as u32,
                        generation: GEN,
                        offset,
                    },
                    output: BufferRef {
                        slot: OUT_SLOT - r as u32,
                        generation: GEN,
                        offset,
                    },
                    call: 0x5eed_ca11,
                    ok: 1,
                    ..Default::default()
                },
                ..Default::default()
            };
            d.inputs[r] = b.params[r].input;
            d.outputs[r] = b.params[r].output;
            d
        })
        .collect()
}

/// What every buffer of `c` must hold on `n` ranks.
fn need(c: &Call, n: u32) -> [u64; 2] {
    let stride = if c.stride == 0 { c.bytes } else { c.stride };
    let parts = (n as u64 - 1) * stride + c.bytes;
    match c.mode {
        M::AllGather => [c.bytes, parts],
        M::ReduceScatter => [parts, c.bytes],
        M::AllToAll => [parts, parts],
        _ => [c.bytes, c.bytes],
    }
}

fn launch(w: &World, k: Kernel, d: &[DirectCollectiveParams], grid: u32) {
    w.launch(k, d, grid, 32, DIRECT_SHARED_BYTES);
}

/// Runs `c` with `k` on every rank, exchanged and registered, and checks every output; the
/// modes whose output holds the input (all-reduce, broadcast, reduce) in place too.
fn run(w: &World, k: Kernel, c: Call, grid: u32) {
    let all: Vec<u32> = (0..w.n).collect();
    let in_place = matches!(c.mode, M::AllReduce | M::Broadcast | M::Reduce);
    for (i, place) in [false, true].into_iter().enumerate() {
        if place && !in_place {
            continue;
        }
        let c = c.seed(c.seed + 1000 * i as u32);
        let b = buffers(w, &c, place);
        launch(w, k, &exchanged(w, &b), grid);
        b.check(w, &c, &all);
        let c = c.seed(c.seed + 500);
        let b = buffers(w, &c, place);
        let reg = Registry::new(w, &b);
        launch(
            w,
            k,
            &registered(w, &b, &reg, need(&c, w.n), c.offset),
            grid,
        );
        b.check(w, &c, &all);
    }
}

#[test]
fn every_mode_on_exchanged_and_registered_buffers() {
    let w = World::new(3, 3);
    let mut seed = 0;
    for grid in [1, 3] {
        for mode in [M::AllReduce, M::AllGather, M::ReduceScatter, M::AllToAll] {
            for stride in [0, BYTES + 32] {
                if mode == M::AllReduce && stride != 0 {
                    continue;
                }
                seed += 1;
                run(
                    &w,
                    direct_collective_kernel,
                    Call::new(mode, BYTES).stride(stride).seed(seed),
                    grid,
                );
            }
        }
        for root in 0..3 {
            seed += 1;
            let c = Call::new(M::Broadcast, BYTES).root(root).seed(seed);
            run(&w, direct_collective_kernel, c, grid);
            run(
                &w,
                direct_collective_kernel,
                Call {
                    mode: M::Reduce,
                    ..c
                },
                grid,
            );
        }
        run(
            &w,
            direct_collective_kernel,
            Call::new(M::AllReduce, 16).seed(seed),
            grid,
        );
    }
    // Buffers 32 bytes into their allocations (and registrations).
    for mode in [M::AllReduce, M::AllGather, M::AllToAll] {
        let c = Call::new(mode, BYTES).offset(32).seed(60 + mode as u32);
        run(&w, direct_collective_kernel, c, 3);
    }
}

#[test]
fn the_any_twin_reduces_every_operator_on_two_and_four_ranks() {
    for n in [2, 4] {
        let w = World::new(n, 2);
        for (k, (dtype, op, scalar)) in [
            (DataType::I32, Op::Min, 0),
            (DataType::I32, Op::Prod, 0),
            (DataType::I32, Op::SumPostDiv, 5),
            (DataType::F32, Op::PreMulSum, 1.5f32.to_bits()),
        ]
        .into_iter()
        .enumerate()
        {
            for mode in [M::AllReduce, M::ReduceScatter, M::Reduce] {
                let c = Call::new(mode, BYTES)
                    .with(dtype, op)
                    .scalar(scalar)
                    .root(n - 1);
                run(&w, direct_collective_any_kernel, c.seed(k as u32), 2);
            }
        }
    }
}

#[test]
fn the_main_kernel_refuses_a_reduction_its_twin_serves() {
    let w = World::new(2, 1);
    let c = Call::new(M::AllReduce, 64).with(DataType::I32, Op::Max);
    let b = buffers(&w, &c, false);
    let st = w.try_launch(
        direct_collective_kernel,
        &exchanged(&w, &b),
        1,
        32,
        DIRECT_SHARED_BYTES,
    );
    for (r, s) in st.iter().enumerate() {
        assert_eq!(
            s.error_code,
            DeviceErrorCode::InvalidArgument as u32,
            "rank {r}"
        );
        assert!(b.outputs[r].get().iter().all(|&x| x == MARK), "rank {r}");
    }
}

/// The send / receive ring: rank `r` sends to `r + 1` and receives from `r - 1`.
fn ring(w: &World, b: &Buffers, reg: Option<&Registry>) -> Vec<DirectCollectiveParams> {
    let n = w.n;
    let mut ds = match reg {
        None => exchanged(w, b),
        Some(reg) => registered(w, b, reg, [BYTES, BYTES], 0),
    };
    for (r, d) in ds.iter_mut().enumerate() {
        let r = r as u32;
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        d.common.mode = M::Send as u32;
        d.common.root = next;
        if reg.is_some() {
            d.meet = 1 << next | 1 << prev;
        } else {
            for q in 0..n {
                if q != next && q != prev {
                    d.outputs[q as usize] = DevicePtr::from_addr(0);
                }
            }
        }
    }
    ds
}

#[test]
fn a_send_receive_ring_moves_each_input_to_the_next_rank() {
    for n in [2, 3, 4, 8] {
        let w = World::new(n, 2);
        for (k, registered_buffers) in [false, true].into_iter().enumerate() {
            let c = Call::new(M::AllReduce, BYTES).seed(k as u32 + 10 * n);
            let b = buffers(&w, &c, false);
            let reg = Registry::new(&w, &b);
            let ds = ring(&w, &b, registered_buffers.then_some(&reg));
            let waits = |r: u32, q: u32| (0..2).map(|blk| w.waits(r, blk, q)).sum::<u64>();
            let before: Vec<u64> = (0..n * n).map(|x| waits(x / n, x % n)).collect();
            launch(&w, direct_collective_kernel, &ds, 2);
            // Each rank met its two neighbours twice per block and nobody else.
            for (x, was) in before.iter().enumerate() {
                let (r, q) = (x as u32 / n, x as u32 % n);
                let met = q != r && (q == (r + 1) % n || r == (q + 1) % n);
                let want = was + if met { 4 } else { 0 };
                assert_eq!(waits(r, q), want, "{n} ranks: rank {r}'s waits for {q}");
            }
            for r in 0..n {
                let prev = ((r + n - 1) % n) as usize;
                let want = &b.inputs[prev].get()[..BYTES as usize];
                let got = b.outputs[r as usize].get();
                assert_eq!(
                    &got[..BYTES as usize],
                    want,
                    "{n} ranks, rank {r} (registered {registered_buffers})"
                );
                assert!(got[BYTES as usize..].iter().all(|&x| x == MARK));
                b.outputs[r as usize].check_slack("ring");
            }
        }
    }
}

#[test]
fn a_barrier_meets_only_the_peers_named_and_a_local_reduction_meets_none() {
    let w = World::new(3, 2);
    let c = Call::new(M::AllReduce, BYTES);
    let b = buffers(&w, &c, false);
    let mut ds = exchanged(&w, &b);
    // Ranks 0 and 2 meet twice; rank 1 does not launch.
    for d in ds.iter_mut() {
        d.common.mode = M::Barrier as u32;
    }
    ds[0].common.root = 1 << 2;
    ds[2].common.root = 1 << 0;
    let pair = [ds[0], ds[2]];
    let before: Vec<u64> = (0..2)
        .flat_map(|b| (0..3).map(move |q| (b, q)))
        .map(|(b, q)| w.waits(0, b, q))
        .collect();
    launch(&w, direct_collective_kernel, &pair, 2);
    launch(&w, direct_collective_kernel, &pair, 2);
    // Every block of rank 0 waited twice for rank 2 and never for rank 1.
    for b in 0..2 {
        assert_eq!(
            w.waits(0, b, 2),
            before[(b * 3 + 2) as usize] + 2,
            "block {b}"
        );
        assert_eq!(w.waits(0, b, 1), before[(b * 3 + 1) as usize], "block {b}");
        assert_eq!(w.waits(2, b, 1), 0, "block {b}");
    }
    // The barrier moved nothing; the semaphores are in step for a whole call of all three.
    for r in 0..3 {
        assert!(b.outputs[r].get().iter().all(|&x| x == MARK));
    }
    run(
        &w,
        direct_collective_kernel,
        Call::new(M::AllReduce, BYTES).seed(4),
        2,
    );

    // A local reduction: rank 1 alone reduces every rank's input into its output.
    for (k, (dtype, op, kernel)) in [
        (DataType::F32, Op::Sum, direct_collective_kernel as Kernel),
        (DataType::I32, Op::Max, direct_collective_any_kernel),
    ]
    .into_iter()
    .enumerate()
    {
        let c = Call::new(M::AllReduce, BYTES)
            .with(dtype, op)
            .seed(50 + k as u32);
        let b = buffers(&w, &c, false);
        let mut d = exchanged(&w, &b)[1];
        d.common.mode = M::ReduceLocal as u32;
        w.launch(kernel, &[d], 2, 32, DIRECT_SHARED_BYTES);
        let parts: Vec<&[u8]> = (0..3)
            .map(|q| &b.inputs[q].get()[..BYTES as usize])
            .collect();
        let want = super::world::reduce(dtype, op, 0, &parts);
        assert_eq!(
            &b.outputs[1].get()[..BYTES as usize],
            &want[..],
            "{dtype:?} {op:?}"
        );
        for r in [0, 2] {
            assert!(b.outputs[r].get().iter().all(|&x| x == MARK));
        }
    }
}

/// A registered call where `spoil` changes rank `bad`'s parameters: every rank refuses it with
/// `why` (the bad rank names a peer, every other rank names `bad`), no output changes, and the
/// next good call works (everyone still met). `peers_only`: a check only the peers make (a
/// slot, generation or range of the bad rank's descriptor): the peers refuse and the bad rank,
/// whose own checks pass, moves its share (module docs of `direct.rs`), so only the bad rank's
/// chunk of every output may change — what the host sees is the peers' error.
fn refused(spoil: impl Fn(&mut DirectCollectiveParams), why: RegisteredRefusal, peers_only: bool) {
    let w = World::new(3, 2);
    let bad = 1usize;
    let c = Call::new(M::AllReduce, BYTES);
    let b = buffers(&w, &c, false);
    let reg = Registry::new(&w, &b);
    let mut ds = registered(&w, &b, &reg, need(&c, 3), 0);
    spoil(&mut ds[bad]);
    let st = w.try_launch(direct_collective_kernel, &ds, 2, 32, DIRECT_SHARED_BYTES);
    for (r, s) in st.iter().enumerate() {
        if peers_only && r == bad {
            assert_eq!(s.error_code, 0, "{why:?}: the bad rank's own checks pass");
            continue;
        }
        assert_eq!(
            s.error_code,
            DeviceErrorCode::InvalidArgument as u32,
            "{why:?}: rank {r}: {s:?}"
        );
        let peer = (s.error_detail >> 8) & 0xff;
        let low = s.error_detail & 0xff;
        assert_eq!(low, why as u64, "{why:?}: rank {r}: {s:?}");
        if r != bad {
            assert_eq!(peer, bad as u64, "{why:?}: rank {r} names the bad rank");
        }
        assert_eq!(
            s.error_detail >> 56,
            error_detail(WaitSite::Unknown, 0) >> 56
        );
    }
    for r in 0..3 {
        let out = b.outputs[r].get();
        let (s, e) = if peers_only {
            // Only the bad rank's chunk may have been written (by the bad rank).
            let chunk = (BYTES / 3).next_multiple_of(16) as usize;
            (bad * chunk, ((bad + 1) * chunk).min(BYTES as usize))
        } else {
            (0, 0)
        };
        let outside = out[..s].iter().chain(&out[e..]);
        assert!(
            outside.into_iter().all(|&x| x == MARK),
            "{why:?}: rank {r}'s output changed"
        );
    }
    run(
        &w,
        direct_collective_kernel,
        Call::new(M::AllReduce, BYTES).seed(9),
        2,
    );
}

/// With a gate (`decline`), one rank's `ok = 0` declines the call on every rank: no error,
/// nothing written, every rank's gate word set; the staged launch behind it with that gate then
/// runs (and moves the data); a call every rank says `ok` to runs direct, clears the gate word,
/// and the launch behind it does nothing.
#[test]
fn with_a_gate_one_rank_not_ok_declines_everywhere_and_the_launch_behind_runs() {
    const GATE: u32 = 41;
    let w = World::new(3, 2);
    let all: Vec<u32> = (0..3).collect();
    for bad in [None, Some(0usize), Some(2)] {
        let c = Call::new(M::AllReduce, BYTES).seed(60 + bad.map_or(9, |b| b as u32));
        let b = buffers(&w, &c, false);
        let reg = Registry::new(&w, &b);
        let mut ds = registered(&w, &b, &reg, need(&c, 3), 0);
        for d in ds.iter_mut() {
            d.decline = GATE;
        }
        if let Some(r) = bad {
            ds[r].mine.ok = 0;
        }
        launch(&w, direct_collective_kernel, &ds, 2);
        let want = if bad.is_some() { GATE as u64 } else { 0 };
        for r in 0..3 {
            assert_eq!(w.gate_word(r), want, "{bad:?}: rank {r}'s gate word");
            if bad.is_some() {
                let out = b.outputs[r as usize].get();
                assert!(out.iter().all(|&x| x == MARK), "{bad:?}: rank {r} wrote");
            }
        }
        // The staged launch behind it, with the same gate: runs only after a decline.
        launch_staged(&w, &b.params, GATE);
        b.check(&w, &c, &all);
        if bad.is_none() {
            // Had it run again, the outputs would still be right: run it on fresh outputs
            // instead, which must stay untouched.
            let c2 = c.seed(c.seed + 100);
            let b2 = buffers(&w, &c2, false);
            launch_staged(&w, &b2.params, GATE);
            for r in 0..3 {
                let out = b2.outputs[r].get();
                assert!(out.iter().all(|&x| x == MARK), "gated out: rank {r} wrote");
            }
        }
    }
}

/// The staged kernel on `params`, each with `gate`.
fn launch_staged(w: &World, params: &[mscclpp_shared::CollectiveParams], gate: u32) {
    let p: Vec<_> = params
        .iter()
        .map(|p| mscclpp_shared::CollectiveParams { gate, ..*p })
        .collect();
    w.launch(staged_collective_kernel, &p, 2, 32, 0);
}

#[test]
fn registered_calls_refuse_every_bad_descriptor_and_still_meet() {
    // The bad rank says it cannot take part: it refuses too (NotOk names itself).
    refused(|d| d.mine.ok = 0, RegisteredRefusal::NotOk, false);
    refused(|d| d.mine.call ^= 1, RegisteredRefusal::OtherCall, false);
    // A slot the peers have not mapped, a stale generation, a generation of 0.
    refused(
        |d| d.mine.input.slot += 1,
        RegisteredRefusal::UnknownSlot,
        true,
    );
    // One past the table, where row `bad + 1`'s slots would begin: rank 2's input is there.
    refused(
        |d| d.mine.input.slot = (REGISTRY_SLOTS + IN_SLOT as usize + 2) as u32,
        RegisteredRefusal::UnknownSlot,
        true,
    );
    refused(
        |d| d.mine.output.generation = GEN + 1,
        RegisteredRefusal::UnknownSlot,
        true,
    );
    refused(
        |d| d.mine.input.generation = 0,
        RegisteredRefusal::UnknownSlot,
        true,
    );
    refused(
        |d| d.mine.output.slot = REGISTRY_SLOTS as u32,
        RegisteredRefusal::UnknownSlot,
        true,
    );
    // Too short from its offset, an offset past the end, misaligned.
    refused(
        |d| d.mine.input.offset = 128,
        RegisteredRefusal::Range,
        true,
    );
    refused(
        |d| d.mine.output.offset = 1 << 20,
        RegisteredRefusal::Range,
        true,
    );
    refused(|d| d.mine.output.offset = 8, RegisteredRefusal::Range, true);
}

#[test]
fn eight_ranks_are_served_and_a_launch_the_tables_cannot_hold_does_nothing() {
    let w = World::new(8, 1);
    run(
        &w,
        direct_collective_kernel,
        Call::new(M::AllReduce, BYTES),
        1,
    );
    // Nine ranks (the tables hold eight), or a rank outside the world: nothing moves and
    // nothing is awaited (the host never launches these).
    let w = World::new(9, 1);
    let c = Call::new(M::AllGather, 64);
    let b = buffers(&w, &c, false);
    let ds: Vec<DirectCollectiveParams> = (0..9)
        .map(|r| DirectCollectiveParams {
            common: b.params[r],
            ..Default::default()
        })
        .collect();
    launch(&w, direct_collective_kernel, &ds, 1);
    for r in 0..9 {
        assert!(
            b.outputs[r].get().iter().all(|&x| x == MARK),
            "rank {r} of 9"
        );
    }
    let w = World::new(2, 1);
    let b = buffers(&w, &c, false);
    let mut ds = exchanged(&w, &b);
    ds[1].common.rank = 2;
    launch(&w, direct_collective_kernel, &ds[1..], 1);
    for r in 0..2 {
        assert!(b.outputs[r].get().iter().all(|&x| x == MARK), "rank {r}");
    }
    assert_eq!(w.waits(1, 0, 0), 0);
}
