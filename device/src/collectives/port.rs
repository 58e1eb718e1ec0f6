//! The port collective: every piece of a collective through PortChannels — the host proxies,
//! which drive the network between nodes (libfabric, InfiniBand, Ethernet) and the copy engines
//! inside one — in one block. It is how ranks on different nodes exchange data, for every
//! collective of a world that spans nodes, and the network phase of the hierarchical
//! all-reduce (`PortCollectiveParams` says what every field means).
//!
//! # One piece
//!
//! The data for each peer (`bytes` per peer, a piece at a time of at most `slot_bytes`):
//!
//! 1. every thread copies this rank's data for each peer `q` it sends to into send slot `q` of
//!    its own scratch (a reducing mode also copies its own contribution into the accumulator
//!    slot); the block meets at `sync_threads` (the proxy reads the slots after thread 0's
//!    triggers, which the barrier orders after every thread's copies: `crate::port_channel`);
//! 2. thread 0, for each peer `q` it sends to: from the third piece to `q` on, waits for `q`'s
//!    acknowledgement of the piece two before (that receive slot is free again), then
//!    `put_with_signal` from send slot `q` into receive slot `(rank, sent(q) mod 2)` of `q`'s
//!    scratch; then flushes each of those channels (the send slots may be rewritten), then
//!    waits for the data signal of every peer it receives from; the block meets (a vote: a wait
//!    that gave up ends the kernel on every thread);
//! 3. every thread moves what arrived: copies receive slot `(q, received(q) mod 2)` to the
//!    output, or reduces the accumulator with every received slot (in rank order, this rank's
//!    contribution at its own place, so every rank of a group computes the same bits) and
//!    copies the result out; the block meets;
//! 4. thread 0 acknowledges every received piece (a signal on the acknowledgement channel) and
//!    counts it.
//!
//! The piece counters (`PortCollectiveParams::counters`) persist across launches, so the two
//! ranks of a pair always agree on the receive slot, and two slots per sender suffice: a sender
//! writes piece `k + 2` into the slot of piece `k` only after the receiver acknowledged `k`.
//!
//! # Modes (`CollectiveParams::mode`)
//!
//! | mode | sends to `q` | received from `q` goes to |
//! |---|---|---|
//! | `AllReduce` | `input` | reduced with `input` into `output` |
//! | `Reduce` | `input` (to the root) | reduced with `input` into the root's `output` (the others write no output) |
//! | `ReduceScatter` | part `q` of `input` (`stride` apart) | reduced with part `rank` of `input` into `output` |
//! | `AllGather` | `input` | part `q` of `output` |
//! | `AllToAll` | part `q` of `input` | part `q` of `output` |
//! | `Broadcast`, `Send`, `Recv` | `input` | `output` |
//!
//! The masks say who sends to and receives from whom; the host copies a rank's own part
//! (all-gather, all-to-all, a broadcast's root) itself. Any alignment and length: copies fall
//! back to bytes, and reductions run in the 16-byte-aligned slots, whose padding is never
//! copied out.

use crate::arch;
use crate::copy::copy;
use crate::port_channel::PortChannel;
use crate::reduce::{Reduce, Reducer};
use crate::trace;
use mscclpp_shared::{
    CollectiveMode, PortChannelDeviceHandle, PortCollectiveParams, TraceEventKind,
};

/// Block-collective copy of `len` bytes (no-op for an empty range or the same place).
#[inline(always)]
fn block_copy(dst: *mut u8, src: *const u8, len: u64) {
    if len == 0 || core::ptr::eq(dst as *const u8, src) {
        return;
    }
    // SAFETY: callers pass ranges inside live buffers that do not overlap (kernel contract).
    unsafe {
        copy(
            dst,
            src,
            len,
            arch::thread_idx_x() as u64,
            arch::block_dim_x() as u64,
        )
    }
}

#[inline(always)]
fn has(mask: u64, q: u32) -> bool {
    q < 64 && mask >> q & 1 == 1
}

/// Handle `k` (`2q` data, `2q + 1` acknowledgement) of the channel table.
#[inline(always)]
fn handle(p: &PortCollectiveParams, k: u32) -> PortChannelDeviceHandle {
    // SAFETY: the host built `2 * nranks` handles; callers pass `k < 2 * nranks`.
    unsafe { p.port_channels.as_ptr().add(k as usize).read() }
}

/// Counter `k` (`2q` sent to `q`, `2q + 1` received from `q`).
#[inline(always)]
fn counter(p: &PortCollectiveParams, k: u32) -> *mut u64 {
    // SAFETY: the host allocated `2 * nranks` counters; callers pass `k < 2 * nranks`.
    unsafe { p.counters.as_ptr().add(k as usize) }
}

crate::kernel! {
    /// Every collective through PortChannels, one piece at a time, in one block, for every
    /// type and operator (see the module docs). The proxies bound its speed, not the
    /// reductions, so one kernel serves every reduction.
    fn port_collective_kernel(p: PortCollectiveParams) {
        trace::event(&p.common.trace, TraceEventKind::Start);
        port(p)
    }
}

#[inline(always)]
fn port(p: PortCollectiveParams) {
    let c = &p.common;
    let mode = c.mode;
    let reduces = mode == CollectiveMode::AllReduce as u32
        || mode == CollectiveMode::ReduceScatter as u32
        || mode == CollectiveMode::Reduce as u32;
    // A reduce's result goes to its root's output only (the others' may be null).
    let keeps = mode != CollectiveMode::Reduce as u32 || c.rank == c.root;
    let reducer = if reduces {
        match Reducer::from_params(c) {
            Some(r) => Some(r),
            None => return,
        }
    } else {
        None
    };
    let (n, me, t) = (c.nranks, c.rank, arch::thread_idx_x());
    let slot = p.slot_bytes;
    if slot == 0 || n as usize > mscclpp_shared::MAX_PORT_RANKS {
        return;
    }
    // SAFETY (every pointer below): the host sized the port region to `3 n + 1` slots at
    // `port_offset` of this rank's scratch, and `input` / `output` for the mode.
    let region = unsafe { c.scratch.as_ptr().add(p.port_offset as usize) };
    let send_slot = |q: u32| unsafe { region.add((q as u64 * slot) as usize) };
    let recv_slot = |q: u32, parity: u64| unsafe {
        region.add(((n as u64 + 2 * q as u64 + parity) * slot) as usize)
    };
    let acc = unsafe { region.add((3 * n as u64 * slot) as usize) };
    let stride_of = |q: u32| -> u64 {
        if mode == CollectiveMode::AllToAll as u32
            || mode == CollectiveMode::ReduceScatter as u32
            || mode == CollectiveMode::AllGather as u32
        {
            q as u64 * c.stride
        } else {
            0
        }
    };
    // What this rank sends to `q`, and where what `q` sends lands.
    let src_of = |q: u32| -> *const u8 {
        let at = if mode == CollectiveMode::AllGather as u32 {
            0
        } else {
            stride_of(q)
        };
        unsafe { c.input.as_ptr().add(at as usize) as *const u8 }
    };
    let dst_of = |q: u32| -> *mut u8 {
        let at = if mode == CollectiveMode::AllGather as u32
            || mode == CollectiveMode::AllToAll as u32
        {
            stride_of(q)
        } else {
            0
        };
        unsafe { c.output.as_ptr().add(at as usize) }
    };
    let own = unsafe { c.input.as_ptr().add(stride_of(me) as usize) as *const u8 };
    let pieces = c.bytes.div_ceil(slot);
    trace::event(&c.trace, TraceEventKind::Send);
    for k in 0..pieces {
        let off = k * slot;
        let len = (c.bytes - off).min(slot);
        // 1. Stage.
        for q in 0..n {
            if q != me && has(p.send_mask, q) {
                // SAFETY: inside the caller's input (mode's layout) and send slot `q`.
                block_copy(send_slot(q), unsafe { src_of(q).add(off as usize) }, len);
            }
        }
        if reduces {
            // SAFETY: inside the caller's input and the accumulator slot.
            block_copy(acc, unsafe { own.add(off as usize) }, len);
        }
        arch::sync_threads();
        // 2. Puts and signals, flushes, waits.
        let mut failed = false;
        if t == 0 {
            failed = exchange(&p, len, &send_slot, &recv_slot);
        }
        if arch::sync_threads_or(failed) {
            return;
        }
        // 3. Move what arrived.
        if let Some(r) = reducer {
            reduce(&p, acc, len, r, |q| {
                // SAFETY: counter `2q + 1` is only written by thread 0 after the next barrier.
                let parity = unsafe { counter(&p, 2 * q + 1).read() } & 1;
                recv_slot(q, parity) as *const u8
            });
            arch::sync_threads();
            if keeps {
                // SAFETY: inside the caller's output.
                block_copy(unsafe { dst_of(me).add(off as usize) }, acc, len);
            }
        } else {
            for q in 0..n {
                if q != me && has(p.recv_mask, q) {
                    // SAFETY: as above.
                    let parity = unsafe { counter(&p, 2 * q + 1).read() } & 1;
                    // SAFETY: inside the caller's output (mode's layout).
                    block_copy(
                        unsafe { dst_of(q).add(off as usize) },
                        recv_slot(q, parity),
                        len,
                    );
                }
            }
        }
        arch::sync_threads();
        // 4. Acknowledge.
        if t == 0 {
            for q in 0..n {
                if q != me && has(p.recv_mask, q) {
                    let _ = handle(&p, 2 * q + 1).signal();
                    let at = counter(&p, 2 * q + 1);
                    // SAFETY: thread 0 owns the counters (PortCollectiveParams docs).
                    unsafe { at.write(at.read() + 1) };
                }
            }
        }
    }
    // Every piece's waits completed (a wait that gave up returned above).
    trace::event(&c.trace, TraceEventKind::Recv);
    trace::event(&c.trace, TraceEventKind::End);
}

/// Thread 0's part of one piece of `len` bytes: puts with signals to every peer it sends to
/// (after the acknowledgement that frees the receive slot), flushes, waits for every peer it
/// receives from. Returns whether a wait gave up (abort or spin limit: recorded in the status).
#[inline(always)]
fn exchange(
    p: &PortCollectiveParams,
    len: u64,
    send_slot: &impl Fn(u32) -> *mut u8,
    recv_slot: &impl Fn(u32, u64) -> *mut u8,
) -> bool {
    let (n, me) = (p.common.nranks, p.common.rank);
    let base = p.common.scratch.as_ptr() as u64;
    for q in 0..n {
        if q == me || !has(p.send_mask, q) {
            continue;
        }
        let sent = counter(p, 2 * q);
        // SAFETY: thread 0 owns the counters.
        let k = unsafe { sent.read() };
        if k >= 2 && handle(p, 2 * q + 1).wait().is_err() {
            return true;
        }
        // Offsets in the scratch: ours (source) and the peer's (destination) share a layout,
        // so this rank's receive slot address relative to its base is the peer's offset too.
        let dst = recv_slot(me, k & 1) as u64 - base;
        let src = send_slot(q) as u64 - base;
        if handle(p, 2 * q).put_with_signal(dst, src, len).is_err() {
            return true;
        }
        // SAFETY: thread 0 owns the counters.
        unsafe { sent.write(k + 1) };
    }
    for q in 0..n {
        if q != me && has(p.send_mask, q) && handle(p, 2 * q).flush().is_err() {
            return true;
        }
    }
    for q in 0..n {
        if q != me && has(p.recv_mask, q) && handle(p, 2 * q).wait().is_err() {
            return true;
        }
    }
    false
}

/// Block-collective: `acc = post(pre(x_0) ⊕ pre(x_1) ⊕ …)` over the ranks in rank order, where
/// `x_me` is `acc` itself and `x_q` the slot `from(q)` of each peer this rank receives from,
/// on the 16-byte vectors covering `len` bytes (the slots are whole vectors).
#[inline(always)]
fn reduce(
    p: &PortCollectiveParams,
    acc: *mut u8,
    len: u64,
    r: Reducer,
    from: impl Fn(u32) -> *const u8,
) {
    let (n, me) = (p.common.nranks, p.common.rank);
    let vecs = len.div_ceil(16);
    let mut i = arch::thread_idx_x() as u64;
    while i < vecs {
        // SAFETY: vector `i` lies inside the accumulator and every receive slot (slots are
        // `slot_bytes`, a multiple of 16, and `len <= slot_bytes`).
        unsafe {
            let at = (i * 16) as usize;
            let mut v: Option<[u32; 4]> = None;
            for q in 0..n {
                let x = if q == me {
                    arch::ld_v4_u32(acc.add(at) as *const u32)
                } else if has(p.recv_mask, q) {
                    arch::ld_v4_u32(from(q).add(at) as *const u32)
                } else {
                    continue;
                };
                v = Some(match v {
                    None => r.pre_v4(x),
                    Some(a) => r.fold_v4(a, x),
                });
            }
            if let Some(v) = v {
                arch::st_v4_u32(acc.add(at) as *mut u32, r.post_v4(v));
            }
        }
        i += arch::block_dim_x() as u64;
    }
}
