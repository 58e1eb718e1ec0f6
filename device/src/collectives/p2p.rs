//! The point-to-point engine: [`p2p_kernel`] runs a batch of sends and receives to any peers
//! together, each pair of ranks in step through words of their own (no barrier with anyone
//! else, so ranks that take no part in a batch never launch anything for it).
//!
//! The protocol (who writes and reads which word of the scratch, with which ordering) is
//! written down once, with the layout, in `mscclpp_shared::p2p`. In short, per lane of a
//! message: the sender waits until its header half is free, writes the header (its byte count)
//! and then either the message as LL16 packets (small messages, lane 0) or its chunks, each
//! published by a release store of the lane's `ready` counter; the receiver reads the header
//! and follows the *sender's* count: it copies into its output only when that count equals
//! its own, and otherwise records [`DeviceErrorCode::CountMismatch`] and consumes the message
//! without writing anything, so that both ends stay in step.
//!
//! Blocks: the host gives each operation one block (a message of at most `ll_bytes`) or one
//! per lane; block `i` of an operation serves lanes `i, i + blocks, …`. The two ends of a
//! message may serve it with different numbers of blocks (each decides from its own count):
//! lanes are independent, so that changes nothing but speed.
//!
//! Every signal follows the block-wide contract of `crate::memory_channel`: every thread
//! writes, `bar.sync`, then thread 0 stores with release at system scope; and the mirror on the
//! reading side: thread 0 waits with acquire, then `bar.sync` (here the vote that also tells
//! the block whether the wait gave up), then every thread reads.

use crate::arch;
use crate::copy::copy;
use crate::packet;
use crate::trace;
use crate::wait::{record_error, spin_until};
use mscclpp_shared::p2p::state;
use mscclpp_shared::status::{count_mismatch_detail, error_detail};
use mscclpp_shared::{
    DeviceErrorCode, LL16Packet, P2P_MAX_LANES, P2P_MAX_OPS, P2P_RECV, P2P_SEND, P2pLayout, P2pOp,
    P2pParams, TraceEventKind, WaitSite,
};

crate::kernel! {
    /// The point-to-point engine (see the module docs): up to `P2P_MAX_OPS` sends and
    /// receives, at most one of each per peer, each served by the blocks the host assigned
    /// it. Needs no dynamic shared memory.
    fn p2p_kernel(p: P2pParams) {
        trace::event(&p.trace, TraceEventKind::Start);
        p2p(&p);
        trace::event(&p.trace, TraceEventKind::End);
    }
}

/// The kernel's body: the operation this block serves, lane by lane.
#[inline(always)]
fn p2p(p: &P2pParams) {
    let b = arch::block_idx_x();
    // A loop of constant trip count over constant indices (unrolled), so that the table stays
    // in parameter space: an index known only at run time made the compiler copy all of the
    // parameters to the stack (576 bytes, and 168 registers).
    let mut op = P2pOp::default();
    let mut found = false;
    for k in 0..P2P_MAX_OPS {
        let o = p.ops[k];
        let mine = (k as u32) < p.nops && b >= o.first_block && b - o.first_block < o.blocks;
        if mine && !found {
            op = o;
            found = true;
        }
    }
    if found {
        // No `Send` event: recording one here took the kernel from 88 to 90 registers on
        // sm_90 (`Recv`, `Start` and `End` cost none). `Recv`: every lane's last wait (for
        // the peer's data, or for a free header slot) completed.
        let ok = serve(p, &op, b - op.first_block);
        trace::event_if(&p.trace, TraceEventKind::Recv, ok);
    }
}

/// Serves lanes `sub, sub + blocks, …` of `op`; false when it did not (a wait gave up, or
/// parameters the host never sends).
#[inline(always)]
fn serve(p: &P2pParams, op: &P2pOp, sub: u32) -> bool {
    let sane = op.peer < p.nranks
        && op.peer != p.rank
        && (1..=P2P_MAX_LANES).contains(&p.lanes)
        && (op.kind == P2P_SEND || op.kind == P2P_RECV)
        && p.chunk_bytes > 0
        && p.chunk_bytes.is_multiple_of(16);
    if !sane {
        // The host never launches this; say so instead of touching memory.
        if arch::thread_idx_x() == 0 {
            let what = (op.peer as u64) << 8 | op.kind as u64;
            record_error(
                p.status,
                DeviceErrorCode::InvalidArgument,
                error_detail(WaitSite::Unknown, what),
            );
        }
        return false;
    }
    let mut lane = sub;
    while lane < p.lanes {
        let ok = if op.kind == P2P_SEND {
            send_lane(p, op, lane as u64)
        } else {
            recv_lane(p, op, lane as u64)
        };
        if !ok {
            return false;
        }
        lane += op.blocks;
    }
    true
}

/// This rank's point-to-point region, and peer `q`'s (mapped here through the channel table).
#[inline(always)]
fn regions(p: &P2pParams, q: u32) -> (*mut u8, *mut u8) {
    // SAFETY: row 0 of the channel table holds `nranks` handles (`q < nranks`, checked in
    // `serve`); both scratch buffers hold the region at `region_offset`.
    unsafe {
        let ch = p.channels.as_ptr().add(q as usize).read();
        (
            p.scratch.as_ptr().add(p.region_offset as usize),
            ch.dst.as_ptr().add(p.region_offset as usize),
        )
    }
}

/// The u64 word at `off` of a region.
#[inline(always)]
fn word(region: *mut u8, off: u64) -> *mut u64 {
    region.wrapping_add(off as usize) as *mut u64
}

/// Thread 0 waits until the counter at `w` reaches `target` (acquire, system scope); the block
/// learns whether it did. The vote is a `bar.sync`, so every thread's later accesses follow the
/// wait. A `target` of 0 needs no wait.
#[inline(always)]
fn block_wait_for(p: &P2pParams, w: *const u64, target: u64) -> bool {
    let mut failed = false;
    if arch::thread_idx_x() == 0 && target > 0 {
        failed = spin_until(p.status, WaitSite::Semaphore, w as u64, || {
            // SAFETY: a counter of a live point-to-point region (module docs).
            (unsafe { arch::ld_acquire_sys_u64(w) }) >= target
        })
        .is_err();
    }
    !arch::sync_threads_or(failed)
}

/// The block copies `len` bytes (a chunk). Out of line, with plain arguments: inlined in both
/// directions of the kernel, the copy loops took the kernel from 96 to 128 registers.
///
/// # Safety
/// As [`copy`].
#[inline(never)]
unsafe fn copy_chunk(dst: *mut u8, src: *const u8, len: u64) {
    let (t, nt) = (arch::thread_idx_x() as u64, arch::block_dim_x() as u64);
    // SAFETY: the caller's contract.
    unsafe { copy(dst, src, len, t, nt) }
}

/// The block writes `bytes` at `src` as LL16 packets with `flag` to `dst` (out of line, as
/// [`copy_chunk`]).
///
/// # Safety
/// As [`packet::put_packets`].
#[inline(never)]
unsafe fn put_ll(dst: *mut LL16Packet, src: *const u8, bytes: u64, flag: u32) {
    let (t, nt) = (arch::thread_idx_x() as usize, arch::block_dim_x() as usize);
    // SAFETY: the caller's contract.
    unsafe { packet::put_packets(dst, src, bytes as usize, t, nt, flag) }
}

/// The block waits for the LL16 packets of `bytes` at `src` to carry `flag` and writes their
/// payload to `dst` (out of line, as [`copy_chunk`]); false when a wait gave up (on any
/// thread: the vote is also the block's barrier).
///
/// # Safety
/// As [`packet::unpack_packets`].
#[inline(never)]
unsafe fn take_ll(
    dst: *mut u8,
    src: *const LL16Packet,
    bytes: u64,
    flag: u32,
    status: mscclpp_shared::DevicePtr<mscclpp_shared::DeviceStatus>,
) -> bool {
    let (t, nt) = (arch::thread_idx_x() as usize, arch::block_dim_x() as usize);
    // SAFETY: the caller's contract.
    let r = unsafe { packet::unpack_packets(dst, src, bytes as usize, t, nt, flag, status) };
    !arch::sync_threads_or(r.is_err())
}

/// `[offset, len)` of chunk `k` of a message of `bytes`.
#[inline(always)]
fn chunk_range(p: &P2pParams, k: u64, bytes: u64) -> (u64, u64) {
    let off = k * p.chunk_bytes;
    (off, (bytes - off).min(p.chunk_bytes))
}

/// Sends lane `l` of `op` (module docs). False when a wait gave up.
#[inline(always)]
fn send_lane(p: &P2pParams, op: &P2pOp, l: u64) -> bool {
    let lay: P2pLayout = p.layout();
    let (q, me) = (op.peer as u64, p.rank as u64);
    let t = arch::thread_idx_x();
    let (mine, theirs) = regions(p, op.peer);
    let seq_w = word(mine, lay.state(q, l, state::SEND_SEQ));
    let chunks_w = word(mine, lay.state(q, l, state::SEND_CHUNKS));
    // SAFETY: this rank's state words; only this block touches them in this launch, and the
    // previous launch that wrote them has completed (stream order).
    let (seq, mut sent) = unsafe { (seq_w.read() + 1, chunks_w.read()) };
    let half = seq & 1;
    // The header half (and lane 0's LL half) is free once message seq - 2 was consumed.
    if !block_wait_for(p, word(mine, lay.hdr_done(q, l)), seq.saturating_sub(2)) {
        return false;
    }
    if t == 0 {
        let w = [op.bytes as u32, (op.bytes >> 32) as u32];
        // SAFETY: header `half` of lane `l` of my inbox at `q` (mapped here).
        unsafe {
            let h = theirs.wrapping_add(lay.header(me, l, half) as usize) as *mut LL16Packet;
            <LL16Packet as packet::Packet>::store(h, w, seq as u32);
        }
    }
    if op.bytes <= p.ll_bytes {
        if l == 0 && op.bytes > 0 {
            // SAFETY: LL half `half` of my inbox at `q` holds `ll_bytes / 8` packets; the
            // input holds `bytes` (the caller's contract).
            unsafe {
                let dst = theirs.wrapping_add(lay.ll_data(me, half) as usize) as *mut LL16Packet;
                put_ll(dst, op.buf.as_ptr(), op.bytes, seq as u32);
            }
        }
    } else {
        let nchunks = op.bytes.div_ceil(p.chunk_bytes);
        let mut k = l;
        while k < nchunks {
            let c = sent + 1;
            if !block_wait_for(p, word(mine, lay.chunk_done(q, l)), c.saturating_sub(2)) {
                return false;
            }
            let (off, len) = chunk_range(p, k, op.bytes);
            // SAFETY: chunk slot `c & 1` of lane `l` of my inbox at `q` holds `chunk_bytes`
            // (>= len); the input holds `bytes`.
            unsafe {
                let dst = theirs.wrapping_add(lay.chunk(me, l, c & 1) as usize);
                copy_chunk(dst, op.buf.as_ptr().add(off as usize), len);
            }
            arch::sync_threads();
            if t == 0 {
                // SAFETY: the `ready` counter of lane `l` of my inbox at `q`.
                unsafe { arch::st_release_sys_u64(word(theirs, lay.ready(me, l)), c) };
            }
            sent = c;
            k += p.lanes as u64;
        }
    }
    if t == 0 {
        // SAFETY: as above; every thread read them before the first vote above.
        unsafe {
            seq_w.write(seq);
            chunks_w.write(sent);
        }
    }
    true
}

/// Receives lane `l` of `op` (module docs). False when a wait gave up.
#[inline(always)]
fn recv_lane(p: &P2pParams, op: &P2pOp, l: u64) -> bool {
    let lay: P2pLayout = p.layout();
    let (q, me) = (op.peer as u64, p.rank as u64);
    let t = arch::thread_idx_x();
    let (mine, theirs) = regions(p, op.peer);
    let seq_w = word(mine, lay.state(q, l, state::RECV_SEQ));
    let chunks_w = word(mine, lay.state(q, l, state::RECV_CHUNKS));
    // SAFETY: as in `send_lane`.
    let (seq, mut got) = unsafe { (seq_w.read() + 1, chunks_w.read()) };
    let half = seq & 1;
    // Thread 0 waits for the header; then every thread reads it (the packet validates itself
    // by its flags, so a thread that saw no flag yet would wait on, not read stale data).
    // Waiting on one thread keeps the other threads of the block off the memory system (and,
    // on the CPU backend, off the two cores the emulated threads share).
    let h = mine.wrapping_add(lay.header(q, l, half) as usize) as *const LL16Packet;
    let mut late = false;
    if t == 0 {
        // SAFETY: header `half` of lane `l` of the inbox `q` writes here.
        late = unsafe { packet::read_packet(h, seq as u32, p.status) }.is_err();
    }
    if arch::sync_threads_or(late) {
        return false;
    }
    // SAFETY: as above.
    let header = unsafe { packet::read_packet(h, seq as u32, p.status) };
    if arch::sync_threads_or(header.is_err()) {
        return false;
    }
    let sent = match header {
        Ok(w) => w[0] as u64 | (w[1] as u64) << 32,
        Err(_) => return false,
    };
    let matches = sent == op.bytes;
    if !matches && l == 0 && t == 0 {
        record_error(
            p.status,
            DeviceErrorCode::CountMismatch,
            count_mismatch_detail(op.peer, sent),
        );
    }
    if sent <= p.ll_bytes {
        if l == 0 && matches && sent > 0 {
            // SAFETY: LL half `half` of the inbox from `q` holds the packets of `sent` bytes;
            // the output holds `bytes` = `sent` (the caller's contract).
            let ok = unsafe {
                let src = mine.wrapping_add(lay.ll_data(q, half) as usize) as *const LL16Packet;
                take_ll(op.buf.as_ptr(), src, sent, seq as u32, p.status)
            };
            if !ok {
                return false;
            }
        }
        // (A message of another count is not read: acknowledging its header frees its half.)
    } else {
        let nchunks = sent.div_ceil(p.chunk_bytes);
        let mut k = l;
        while k < nchunks {
            let c = got + 1;
            if !block_wait_for(p, word(mine, lay.ready(q, l)), c) {
                return false;
            }
            if matches {
                let (off, len) = chunk_range(p, k, sent);
                // SAFETY: chunk slot `c & 1` of lane `l` of the inbox from `q`, published by
                // `ready >= c`; the output holds `bytes` = `sent`.
                unsafe {
                    let src = mine.wrapping_add(lay.chunk(q, l, c & 1) as usize);
                    copy_chunk(op.buf.as_ptr().add(off as usize), src, len);
                }
            }
            arch::sync_threads();
            if t == 0 {
                // SAFETY: the `chunk_done` word of lane `l` that `q` keeps for my receives.
                unsafe { arch::st_release_sys_u64(word(theirs, lay.chunk_done(me, l)), c) };
            }
            got = c;
            k += p.lanes as u64;
        }
    }
    // Every thread's reads of the header and the LL data precede the votes and barriers
    // above, so the acknowledgement comes after them.
    if t == 0 {
        // SAFETY: the `hdr_done` word of lane `l` that `q` keeps for my receives, and my state
        // words (as in `send_lane`).
        unsafe {
            arch::st_release_sys_u64(word(theirs, lay.hdr_done(me, l)), seq);
            seq_w.write(seq);
            chunks_w.write(got);
        }
    }
    true
}
