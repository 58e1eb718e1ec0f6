//! The copy-engine all-reduce, pipelined through PortChannels (MSCCL++'s proxy pattern):
//! every byte crosses the links by copy engine, the SMs only reduce locally, and the two
//! overlap piece by piece.
//!
//! Rank `r` of `n` owns chunk `r` of the buffer (`bytes / n`, rounded up to 16), cut into
//! pieces of `chunk` bytes. The grid is `R` reducer blocks and one sender block (the last).
//! After a block barrier with the peers (their inputs are ready, and nobody still reads the
//! scratch rings from an earlier call):
//!
//! - the sender block's thread 0 puts, for every piece `k` and every peer `q`, piece `k` of
//!   this rank's input's chunk `q` into slot `k % ring_slots` of `q`'s ring for this rank
//!   (channel `2q`, with a signal). Before reusing a slot it polls channel `2q + 1`'s inbound
//!   counter: `q` has sent the reduced piece `k - ring_slots`, so it is done reading the slot;
//! - the reducer blocks, piece by piece, wait until every peer's piece `k` has arrived (thread
//!   0 polls channel `2q`'s inbound counter), reduce their sub-slice of it with this rank's
//!   input into this rank's output (local memory only), and count the piece in
//!   `counters[k]`. The block that completes a piece resets its counter and puts the reduced
//!   piece into every peer's output (channel `2q + 1`, with a signal);
//! - the block that completes the last piece flushes every connection (the copy engines are
//!   done reading this rank's input and output, which the caller may reuse once the kernel
//!   ends), waits until every peer's reduced pieces have all arrived, and advances every
//!   semaphore's consumed count by the tokens of this call.
//!
//! Who reads and writes each word: the inbound counters are written by the peers' proxies
//! (after the copies they signal, on the same stream) and only polled here (acquire, system
//! scope), so several blocks may poll them; each semaphore's `expected` word is read at the
//! start by every block and written once, at the end, by the completing block (all blocks
//! have read it by then: they all counted the last piece). Chunk `r` of a peer's output is
//! written only by this rank's copy engines, after that peer's copy engines read the same
//! piece of its input, so in place is safe.

use super::direct::{Spread, reduce_spread};
use super::{barrier, begin, sub_slice, up16};
use crate::arch;
use crate::port_channel::PortChannel;
use crate::wait::spin_until;
use mscclpp_shared::{
    DeviceErrorCode, MAX_DIRECT_RANKS, MAX_PORT_CHUNKS, PortChannelDeviceHandle,
    PortCollectiveParams, WaitSite,
};

/// What every block derives from the parameters.
struct Plan {
    n: u32,
    me: u32,
    /// Chunk size (every rank's but maybe the last).
    size: u64,
    piece: u64,
}

impl Plan {
    /// Chunk `q`'s offset and length.
    fn chunk(&self, bytes: u64, q: u32) -> (u64, u64) {
        let at = q as u64 * self.size;
        (at, bytes.saturating_sub(at).min(self.size))
    }

    /// Pieces of a chunk of `len` bytes (at least one, possibly empty).
    fn pieces(&self, len: u64) -> u64 {
        len.div_ceil(self.piece).max(1)
    }

    /// Offset and length of piece `k` in a chunk of `len` bytes.
    fn piece(&self, len: u64, k: u64) -> (u64, u64) {
        let at = k * self.piece;
        (at, self.piece.min(len - at.min(len)))
    }

    fn peers(&self) -> impl Iterator<Item = u32> + use<> {
        let me = self.me;
        (0..self.n).filter(move |&q| q != me)
    }
}

/// Channel `i` of the table.
#[inline(always)]
fn port(pp: &PortCollectiveParams, i: u32) -> PortChannelDeviceHandle {
    // SAFETY: the host fills `ports` with two handles per rank (module docs).
    unsafe { pp.ports.as_ptr().add(i as usize).read() }
}

/// The semaphore tokens consumed before this call (its `expected` word).
#[inline(always)]
fn consumed(ch: &PortChannelDeviceHandle) -> u64 {
    // SAFETY: a semaphore handle points at its live `expected` word (device memory), written
    // only at the end of the previous call (a kernel boundary ago).
    unsafe { ch.semaphore.expected.as_ptr().read_volatile() }
}

/// Polls `ch`'s inbound counter until it reaches `target` (bounded, abortable).
#[inline(always)]
fn poll_until(ch: &PortChannelDeviceHandle, target: u64) -> Result<(), DeviceErrorCode> {
    let s = &ch.semaphore;
    let inbound = s.inbound.as_ptr();
    spin_until(s.status, WaitSite::Semaphore, s.inbound.addr(), || {
        // SAFETY: the live inbound word of the semaphore, written by the peer's proxy.
        unsafe { arch::ld_acquire_sys_u64(inbound) >= target }
    })
}

/// The sender block's loop (thread 0): every piece of this rank's input for every peer into
/// its ring, a slot reused only once the peer sent back the piece that used it.
#[inline(always)]
fn send(pp: &PortCollectiveParams, plan: &Plan) -> Result<(), DeviceErrorCode> {
    let bytes = pp.direct.common.bytes;
    let slots = pp.ring_slots as u64;
    let most = (0..plan.n)
        .map(|q| plan.pieces(plan.chunk(bytes, q).1))
        .max()
        .unwrap_or(1);
    for k in 0..most {
        for q in plan.peers() {
            let (at, len) = plan.chunk(bytes, q);
            if k >= plan.pieces(len) {
                continue;
            }
            let back = port(pp, 2 * q + 1);
            if k >= slots {
                poll_until(&back, consumed(&back) + k - slots + 1)?;
            }
            let (c0, clen) = plan.piece(len, k);
            let mut ch = port(pp, 2 * q);
            ch.src = pp.input_memory;
            let slot = pp.ring_offset + (plan.me as u64 * slots + k % slots) * plan.piece;
            if clen == 0 {
                ch.signal()?; // an empty chunk: its offsets may lie past the buffer
            } else {
                ch.put_with_signal(slot, pp.input_offset + at + c0, clen)?;
            }
        }
    }
    Ok(())
}

/// Counts this block's completion of piece `k`; true for the block that completes it (which
/// resets the counter). Called by thread 0 after the block's stores were fenced.
///
/// # Safety
/// `counters` holds [`MAX_PORT_CHUNKS`] words and `k` is below that.
#[inline(always)]
unsafe fn complete(counters: *mut u64, k: u64, blocks: u64) -> bool {
    // SAFETY: forwarded contract.
    unsafe {
        let c = counters.add(k as usize);
        let last = arch::atom_add_relaxed_gpu_u64(c, 1) + 1 == blocks;
        if last {
            // Every other block's stores of the piece happen before its count.
            arch::fence_acq_rel_gpu();
            c.write_volatile(0);
        }
        last
    }
}

/// The completing block's closing steps (module docs).
#[inline(always)]
fn close(pp: &PortCollectiveParams, plan: &Plan, pieces: u64) -> Result<(), DeviceErrorCode> {
    let bytes = pp.direct.common.bytes;
    for q in plan.peers() {
        // The reduced pieces' copies read this rank's output. (The ring pieces' copies, which
        // read its input, are complete once `q` sent back all its reduced pieces, below: `q`
        // reduces a piece only after its copy signalled.)
        port(pp, 2 * q + 1).flush()?;
    }
    for q in plan.peers() {
        let back = port(pp, 2 * q + 1);
        let theirs = plan.pieces(plan.chunk(bytes, q).1);
        poll_until(&back, consumed(&back) + theirs)?;
    }
    for q in plan.peers() {
        let (there, back) = (port(pp, 2 * q), port(pp, 2 * q + 1));
        let theirs = plan.pieces(plan.chunk(bytes, q).1);
        // SAFETY: the live `expected` words; every block read them before counting the last
        // piece, which this block completed.
        unsafe {
            let e = there.semaphore.expected.as_ptr();
            e.write_volatile(e.read_volatile() + pieces);
            let e = back.semaphore.expected.as_ptr();
            e.write_volatile(e.read_volatile() + theirs);
        }
    }
    Ok(())
}

crate::kernel! {
    /// The pipelined copy-engine all-reduce (module docs). Needs 16 bytes of dynamic shared
    /// memory and at least two blocks, at most `direct.common.max_blocks`.
    fn port_all_reduce_kernel(pp: PortCollectiveParams) {
        let d = &pp.direct;
        let p = &d.common;
        let Some((dtype, op)) = begin(p) else {
            return;
        };
        let (n, me) = (p.nranks, p.rank);
        let (b, nb) = (arch::block_idx_x() as u64, arch::grid_dim_x() as u64);
        let bad = n as usize > MAX_DIRECT_RANKS
            || me >= n
            || pp.chunk == 0
            || !pp.chunk.is_multiple_of(16)
            || pp.ring_slots == 0
            || nb < 2;
        if bad {
            return; // the host never launches this
        }
        let plan = Plan { n, me, size: up16(p.bytes.div_ceil(n as u64)), piece: pp.chunk };
        let (at, mine) = plan.chunk(p.bytes, me);
        let pieces = plan.pieces(mine);
        if (0..n).any(|q| plan.pieces(plan.chunk(p.bytes, q).1) > MAX_PORT_CHUNKS as u64) {
            return; // the host never launches this
        }
        if !barrier(p, None) {
            return;
        }
        let reducers = nb - 1;
        if b == reducers {
            if arch::thread_idx_x() == 0 {
                let _ = send(&pp, &plan); // a failure is recorded in the status block
            }
            return;
        }
        // The tokens each inbound counter held before this call, read before any piece
        // counts (so before the completing block advances them).
        let mut before = [0u64; MAX_DIRECT_RANKS];
        for q in plan.peers() {
            before[q as usize] = consumed(&port(&pp, 2 * q));
        }
        let input = p.input.as_ptr() as *const u8;
        let out = p.output.as_ptr();
        let fail = arch::dynamic_shared_mem() as *mut u32;
        for k in 0..pieces {
            if arch::thread_idx_x() == 0 {
                for q in plan.peers() {
                    if poll_until(&port(&pp, 2 * q), before[q as usize] + k + 1).is_err() {
                        // SAFETY: the launch gives 16 bytes of dynamic shared memory.
                        unsafe { fail.write_volatile(1) };
                        break;
                    }
                }
            }
            arch::sync_threads();
            // SAFETY: as above; written before the barrier.
            if unsafe { fail.read_volatile() } != 0 {
                return;
            }
            let (c0, len) = plan.piece(mine, k);
            let (s, e) = sub_slice(len, b, reducers);
            let slot = pp.ring_offset + (k % pp.ring_slots as u64) * plan.piece + s;
            let scratch = p.scratch.as_ptr() as *const u8;
            let off = (at + c0 + s) as usize;
            let sp = Spread {
                nv: (e - s) / 16,
                // SAFETY: this rank's input and output hold `bytes`; ring slot `k % slots` of
                // sender `q` holds `chunk` bytes (host contract).
                src: |q: u32| unsafe {
                    if q == me {
                        input.add(off)
                    } else {
                        let ring = (q as u64 * pp.ring_slots as u64) * plan.piece;
                        scratch.add((ring + slot) as usize)
                    }
                },
                dst: |_| unsafe { out.add(off) },
            };
            // SAFETY: as above.
            unsafe { reduce_spread(&sp, me, |_| true, |q| q == me, n, dtype, op) };
            arch::fence_acq_rel_gpu();
            arch::sync_threads();
            // SAFETY: `counters` holds MAX_PORT_CHUNKS words (host contract); k < pieces.
            if arch::thread_idx_x() == 0 && unsafe { complete(pp.counters.as_ptr(), k, reducers) } {
                // The copy engines read what every block stored.
                arch::fence_sc_sys();
                let mut ok = true;
                for q in plan.peers() {
                    let mut ch = port(&pp, 2 * q + 1);
                    (ch.src, ch.dst) = (pp.output_memory, pp.dst_memories[q as usize]);
                    let dst = pp.dst_offsets[q as usize] + at + c0;
                    let src = pp.output_offset + at + c0;
                    ok = ok
                        && if len == 0 {
                            ch.signal().is_ok()
                        } else {
                            ch.put_with_signal(dst, src, len).is_ok()
                        };
                }
                if ok && k + 1 == pieces {
                    let _ = close(&pp, &plan, pieces); // a failure is in the status block
                }
            }
        }
    }
}
