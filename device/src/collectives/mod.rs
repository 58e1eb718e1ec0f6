//! The collective kernels, over MemoryChannels to every peer (one row of channels per block).
//!
//! Every rank owns a scratch buffer that every peer maps; channel `(b, q)` of rank `r` points
//! at rank `q`'s scratch (`dst`) and at `r`'s own (`src`), with a semaphore paired with channel
//! `(b, r)` of rank `q`. Two regions of the scratch are used (offsets in `CollectiveParams`):
//!
//! - LL region: `2 × nranks` slots of `ll_slot_bytes`, double-buffered by the parity of the
//!   call's flag. [`ll_collective_kernel`] writes its input (or the part meant for that peer)
//!   as LL16 packets into slot `rank` of every peer and reduces or copies what arrives in its
//!   own slots; no barrier is needed (the flags carry the synchronisation). Every LL launch
//!   exchanges packets with every peer (or is a two-rank exchange; a broadcast's non-roots
//!   send one ack packet to every peer), so a peer is never more than one LL call ahead (it
//!   cannot finish call `k + 1` before this rank has written its packets of `k + 1`), and two
//!   halves suffice.
//! - Staging region: [`staged_collective_kernel`] copies input there, meets every peer at a
//!   block barrier (signal + wait on the block's channel to each peer), and reads the peers'
//!   staging directly. Block `b` only touches sub-slice `b` of every part, and sub-slice `b` of
//!   a peer is written by the peer's block `b` before the same barrier, so blocks need no
//!   grid-wide synchronisation. Every launch starts with a barrier so that nobody overwrites a
//!   staging buffer a peer may still be reading from the previous launch.

pub mod direct;

pub use direct::direct_collective_kernel;

use crate::arch;
use crate::copy::copy;
use crate::memory_channel::MemoryChannel;
use crate::packet::{self, Packet};
use crate::reduce::reduce_word;
use mscclpp_shared::{
    CollectiveMode, CollectiveParams, DataType, LL16Packet, MemoryChannelDeviceHandle, ReduceOp,
};

/// Rounds up to a multiple of 16.
#[inline(always)]
const fn up16(x: u64) -> u64 {
    (x + 15) & !15
}

/// `[start, end)` of sub-slice `b` of `nblocks` of a part of `len` bytes (16-byte granular).
#[inline(always)]
fn sub_slice(len: u64, b: u64, nblocks: u64) -> (u64, u64) {
    let sub = up16(len.div_ceil(nblocks));
    let start = (b * sub).min(len);
    (start, (start + sub).min(len))
}

#[inline(always)]
fn channel(p: &CollectiveParams, block: u32, peer: u32) -> MemoryChannelDeviceHandle {
    // SAFETY: the host built `max_blocks * nranks` handles and launches at most `max_blocks`
    // blocks; `peer < nranks`.
    unsafe {
        p.channels
            .as_ptr()
            .add((block * p.nranks + peer) as usize)
            .read()
    }
}

/// Block barrier with every peer (or only `only`): thread `q` signals and waits on the channel to
/// peer `q`. Returns false if a wait gave up (abort / timeout); every thread sees the same answer.
#[inline(always)]
fn barrier(p: &CollectiveParams, only: Option<u32>) -> bool {
    barrier_with(p, |t| only.is_none_or(|o| o == t))
}

/// [`barrier`] with the peers `meet` selects.
#[inline(always)]
fn barrier_with(p: &CollectiveParams, meet: impl Fn(u32) -> bool) -> bool {
    let t = arch::thread_idx_x();
    let b = arch::block_idx_x();
    let fail = arch::dynamic_shared_mem() as *mut u32;
    arch::sync_threads();
    if t < p.nranks && t != p.rank && meet(t) {
        let ch = channel(p, b, t);
        ch.signal();
        if ch.wait().is_err() {
            // SAFETY: the launcher gives at least 4 bytes of shared memory.
            unsafe { fail.write_volatile(1) };
        }
    }
    arch::sync_threads();
    // SAFETY: as above; written before the barrier.
    unsafe { fail.read_volatile() == 0 }
}

/// The start of a kernel that uses [`barrier`]: clears the block's barrier-failure word
/// (dynamic shared memory; read only after the barrier's first `sync_threads`) and decodes the
/// data type and operator, `None` for values this build does not know.
#[inline(always)]
fn begin(p: &CollectiveParams) -> Option<(DataType, ReduceOp)> {
    if arch::thread_idx_x() == 0 {
        // SAFETY: the launchers give at least 4 bytes of dynamic shared memory.
        unsafe { (arch::dynamic_shared_mem() as *mut u32).write_volatile(0) };
    }
    Some((DataType::from_u32(p.dtype)?, ReduceOp::from_u32(p.op)?))
}

/// Block-collective copy of `len` bytes.
#[inline(always)]
fn block_copy(dst: *mut u8, src: *const u8, len: u64) {
    if core::ptr::eq(dst as *const u8, src) || len == 0 {
        return;
    }
    // SAFETY: callers pass ranges inside live buffers (kernel contract).
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

/// Block-collective reduction: `acc[i] = op(acc[i], source(q)[i])` for every peer `q`, over
/// `len` bytes (16-byte aligned pointers; `len` is rounded up to whole 16-byte vectors, which
/// the host keeps inside every buffer).
#[inline(always)]
fn block_reduce_into(
    acc: *mut u8,
    p: &CollectiveParams,
    len: u64,
    dtype: DataType,
    op: ReduceOp,
    source: impl Fn(u32) -> *const u8,
) {
    let vecs = len.div_ceil(16);
    let mut i = arch::thread_idx_x() as u64;
    while i < vecs {
        // SAFETY: the caller's ranges (see above).
        unsafe {
            let a = acc.add((i * 16) as usize) as *mut u32;
            let mut v = arch::ld_v4_u32(a);
            for q in 0..p.nranks {
                if q == p.rank {
                    continue;
                }
                let w = arch::ld_v4_u32(source(q).add((i * 16) as usize) as *const u32);
                for k in 0..4 {
                    v[k] = reduce_word(v[k], w[k], dtype, op);
                }
            }
            arch::st_v4_u32(a, v);
        }
        i += arch::block_dim_x() as u64;
    }
}

/// Which LL collective a launch runs (from `CollectiveParams::mode`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum LlMode {
    /// Reduce everyone's `bytes` into every output.
    AllReduce,
    /// Everyone's `bytes` to part `rank` of every output (parts `stride` apart).
    AllGather,
    /// Reduce part `rank` (of `stride`-spaced parts) of everyone's input into my output.
    ReduceScatter,
    /// Part `q` of my input to part `rank` of rank `q`'s output.
    AllToAll,
    /// My `bytes` to `root`, and `root`'s to my output (a two-rank exchange).
    SendRecv,
    /// `root`'s `bytes` to every output. Every other rank sends every peer one empty packet
    /// (an ack, written first thing) and every rank waits for the acks it is sent, so that,
    /// as in the other modes, every rank hears from every peer in every LL call: that is
    /// what keeps a peer from running more than one call ahead of a slot's reader.
    Broadcast,
}

impl LlMode {
    fn from_mode(mode: u32) -> Option<Self> {
        Some(match mode {
            m if m == CollectiveMode::AllReduce as u32 => Self::AllReduce,
            m if m == CollectiveMode::AllGather as u32 => Self::AllGather,
            m if m == CollectiveMode::ReduceScatter as u32 => Self::ReduceScatter,
            m if m == CollectiveMode::AllToAll as u32 => Self::AllToAll,
            m if m == CollectiveMode::Send as u32 => Self::SendRecv,
            m if m == CollectiveMode::Broadcast as u32 => Self::Broadcast,
            _ => return None,
        })
    }

    /// Whether this launch exchanges packets with `q`.
    fn talks_to(self, p: &CollectiveParams, q: u32) -> bool {
        q != p.rank && (self != Self::SendRecv || q == p.root)
    }

    /// Where the packets for `q` come from (parts for all-to-all and reduce-scatter).
    fn source(self, p: &CollectiveParams, q: u32) -> *const u8 {
        let input = p.input.as_ptr() as *const u8;
        match self {
            // SAFETY: the host sized `input` as `nranks` parts `stride` apart.
            Self::ReduceScatter | Self::AllToAll => unsafe {
                input.add((q as u64 * p.stride) as usize)
            },
            _ => input,
        }
    }
}

/// The LL collectives' body; returns false if a packet wait gave up.
#[inline(always)]
fn ll_collective(
    p: &CollectiveParams,
    mode: LlMode,
    flag: u32,
    dtype: DataType,
    op: ReduceOp,
) -> bool {
    let n = packet::packets_for::<LL16Packet>(p.bytes as usize) as u64;
    let half = (flag & 1) as u64 * p.nranks as u64 * p.ll_slot_bytes;
    let tid = arch::global_thread_idx() as u64;
    let nthreads = arch::global_thread_count() as u64;
    let output = p.output.as_ptr();
    let me = p.rank;
    // 1. My payload for every peer, as packets, into its slot `rank`. A thread handles the
    //    same packet index `i` in both steps, so in-place layouts read before they write.
    // Broadcast: the root sends its data, the others one ack packet each.
    let ack_only = mode == LlMode::Broadcast && me != p.root;
    let mut i = tid;
    while i < n {
        let off = i * 8;
        let len = (p.bytes - off) as usize;
        for q in 0..p.nranks {
            if !mode.talks_to(p, q) || (ack_only && i > 0) {
                continue;
            }
            let ch = channel(p, 0, q);
            // SAFETY: `off < bytes` inside the source part; slot `rank` of the peer's LL
            // region holds `ll_slot_bytes >= n * 16`.
            unsafe {
                let w = if ack_only {
                    [0; 2]
                } else {
                    packet::read_payload::<LL16Packet>(mode.source(p, q).add(off as usize), len)
                };
                let dst = ch
                    .dst
                    .as_ptr()
                    .add((half + me as u64 * p.ll_slot_bytes + i * 16) as usize)
                    as *mut LL16Packet;
                LL16Packet::store(dst, w, flag);
            }
        }
        i += nthreads;
    }
    // 2. What arrives in my slots, reduced into or copied to my output.
    let packet_from = |q: u32, i: u64| {
        // SAFETY: slot `q` of my LL region, written by peer `q`.
        unsafe {
            let src = p
                .scratch
                .as_ptr()
                .add((half + q as u64 * p.ll_slot_bytes + i * 16) as usize)
                as *const LL16Packet;
            packet::read_packet(src, flag, p.status)
        }
    };
    let mut i = tid;
    while i < n {
        let off = i * 8;
        let len = (p.bytes - off) as usize;
        // SAFETY (block): every pointer below is a part of `input` / `output` as the host
        // sized them for the mode, at `off < bytes`.
        unsafe {
            match mode {
                LlMode::AllReduce | LlMode::ReduceScatter => {
                    let mut acc = packet::read_payload::<LL16Packet>(
                        mode.source(p, me).add(off as usize),
                        len,
                    );
                    for q in 0..p.nranks {
                        if !mode.talks_to(p, q) {
                            continue;
                        }
                        let Ok(w) = packet_from(q, i) else {
                            return false;
                        };
                        acc = [
                            reduce_word(acc[0], w[0], dtype, op),
                            reduce_word(acc[1], w[1], dtype, op),
                        ];
                    }
                    packet::write_payload::<LL16Packet>(output.add(off as usize), acc, len);
                }
                LlMode::AllGather | LlMode::AllToAll => {
                    for q in 0..p.nranks {
                        let w = if q == me {
                            packet::read_payload::<LL16Packet>(
                                mode.source(p, me).add(off as usize),
                                len,
                            )
                        } else {
                            let Ok(w) = packet_from(q, i) else {
                                return false;
                            };
                            w
                        };
                        let dst = output.add((q as u64 * p.stride + off) as usize);
                        packet::write_payload::<LL16Packet>(dst, w, len);
                    }
                }
                LlMode::SendRecv => {
                    let Ok(w) = packet_from(p.root, i) else {
                        return false;
                    };
                    packet::write_payload::<LL16Packet>(output.add(off as usize), w, len);
                }
                LlMode::Broadcast => {
                    let w = if me == p.root {
                        packet::read_payload::<LL16Packet>(
                            mode.source(p, me).add(off as usize),
                            len,
                        )
                    } else {
                        let Ok(w) = packet_from(p.root, i) else {
                            return false;
                        };
                        w
                    };
                    packet::write_payload::<LL16Packet>(output.add(off as usize), w, len);
                    // The acks (packet 0 of every rank but the root and me).
                    for q in 0..p.nranks {
                        if i == 0 && q != me && q != p.root && packet_from(q, 0).is_err() {
                            return false;
                        }
                    }
                }
            }
        }
        i += nthreads;
    }
    true
}

crate::kernel! {
    /// One-shot collectives with LL16 packets (small messages; `mode`: all-reduce, all-gather,
    /// reduce-scatter, all-to-all, broadcast, or `Send` for a two-rank exchange with `root`):
    /// every thread
    /// of the grid sends its share of packets to every peer, then reduces or copies the packets
    /// that arrive. The flag comes from `ll_flags` on the device (see
    /// `CollectiveParams::ll_flags`); the last block to finish advances it, so the same launch
    /// replayed from a CUDA graph stays correct. Every rank of the communicator takes part in
    /// every LL launch (the flags count launches).
    fn ll_collective_kernel(p: CollectiveParams) {
        let (Some(dtype), Some(op), Some(mode)) = (
            DataType::from_u32(p.dtype),
            ReduceOp::from_u32(p.op),
            LlMode::from_mode(p.mode),
        ) else {
            return;
        };
        let flags = p.ll_flags.as_ptr();
        // SAFETY: `ll_flags` points at two live u64 words; `[0]` was last written by the
        // previous launch, which completed before this one started (stream order).
        let flag = unsafe { arch::ld_relaxed_sys_u64(flags) } as u32 + 1;
        let ok = ll_collective(&p, mode, flag, dtype, op);
        arch::sync_threads();
        if arch::thread_idx_x() == 0 && ok && arch::grid_dim_x() == 1 {
            // A single block is the last one: no count needed (the next launch reads the word
            // after the kernel boundary).
            // SAFETY: as below.
            unsafe { arch::st_relaxed_sys_u64(flags, flag as u64) };
        } else if arch::thread_idx_x() == 0 && ok {
            // Only this GPU's blocks (and its next launch, after the kernel boundary) read the
            // flag words, so a GPU-scope fence orders this block's packet reads before them.
            arch::fence_acq_rel_gpu();
            // SAFETY: as above.
            unsafe {
                let done = arch::atom_add_relaxed_gpu_u64(flags.add(1), 1);
                if done + 1 == arch::grid_dim_x() as u64 {
                    arch::st_relaxed_sys_u64(flags.add(1), 0);
                    arch::st_relaxed_sys_u64(flags, flag as u64);
                }
            }
        }
    }
}

crate::kernel! {
    /// Every collective through the staging region (see the module docs and `CollectiveMode`).
    /// Needs 16 bytes of dynamic shared memory.
    fn staged_collective_kernel(p: CollectiveParams) {
        let Some((dtype, op)) = begin(&p) else {
            return;
        };
        let b = arch::block_idx_x();
        let nb = arch::grid_dim_x() as u64;
        let n = p.nranks as u64;
        let me = p.rank as u64;
        let stage = unsafe { p.scratch.as_ptr().add(p.stage_offset as usize) };
        let peer_stage = |q: u32| -> *mut u8 {
            if q == p.rank {
                stage
            } else {
                // SAFETY: the peer's scratch is mapped here through the channel.
                unsafe { channel(&p, b, q).dst.as_ptr().add(p.stage_offset as usize) }
            }
        };
        let input = p.input.as_ptr();
        let output = p.output.as_ptr();
        let bytes = p.bytes;
        let mode = p.mode;
        let only = if mode == CollectiveMode::Send as u32 || mode == CollectiveMode::Recv as u32 {
            Some(p.root)
        } else {
            None
        };
        if !barrier(&p, only) {
            return;
        }
        // SAFETY (whole body): every range below lies inside `input` / `output` (as sized by
        // the host for the mode), or inside a staging region of `n * up16(part)` bytes.
        unsafe {
            if mode == CollectiveMode::AllReduce as u32 {
                let chunk = up16(bytes.div_ceil(n));
                for c in 0..n {
                    let c_len = bytes.saturating_sub(c * chunk).min(chunk);
                    let (s, e) = sub_slice(c_len, b as u64, nb);
                    block_copy(stage.add((c * chunk + s) as usize), input.add((c * chunk + s) as usize), e - s);
                }
                if !barrier(&p, None) {
                    return;
                }
                let c_len = bytes.saturating_sub(me * chunk).min(chunk);
                let (s, e) = sub_slice(c_len, b as u64, nb);
                block_reduce_into(stage.add((me * chunk + s) as usize), &p, e - s, dtype, op, |q| {
                    peer_stage(q).add((me * chunk + s) as usize)
                });
                if !barrier(&p, None) {
                    return;
                }
                for c in 0..n {
                    let c_len = bytes.saturating_sub(c * chunk).min(chunk);
                    let (s, e) = sub_slice(c_len, b as u64, nb);
                    let from = peer_stage(c as u32).add((c * chunk + s) as usize);
                    block_copy(output.add((c * chunk + s) as usize), from, e - s);
                }
            } else if mode == CollectiveMode::AllReducePut as u32 {
                // Writes only cross the links: slot q of rank r's first half receives rank q's
                // part r; the reduced part r goes to slot r of every rank's second half.
                let chunk = up16(bytes.div_ceil(n));
                let rs = |r: u32, slot: u64| peer_stage(r).add((slot * chunk) as usize);
                let ag = |r: u32, slot: u64| peer_stage(r).add(((n + slot) * chunk) as usize);
                for c in 0..p.nranks {
                    let c_len = bytes.saturating_sub(c as u64 * chunk).min(chunk);
                    let (s, e) = sub_slice(c_len, b as u64, nb);
                    let from = input.add((c as u64 * chunk + s) as usize);
                    block_copy(rs(c, me).add(s as usize), from, e - s);
                }
                if !barrier(&p, None) {
                    return;
                }
                let c_len = bytes.saturating_sub(me * chunk).min(chunk);
                let (s, e) = sub_slice(c_len, b as u64, nb);
                let mine = rs(p.rank, me).add(s as usize);
                block_reduce_into(mine, &p, e - s, dtype, op, |q| rs(p.rank, q as u64).add(s as usize));
                arch::sync_threads();
                block_copy(output.add((me * chunk + s) as usize), mine, e - s);
                for q in 0..p.nranks {
                    if q != p.rank {
                        block_copy(ag(q, me).add(s as usize), mine, e - s);
                    }
                }
                if !barrier(&p, None) {
                    return;
                }
                for q in 0..p.nranks {
                    if q == p.rank {
                        continue;
                    }
                    let c_len = bytes.saturating_sub(q as u64 * chunk).min(chunk);
                    let (s, e) = sub_slice(c_len, b as u64, nb);
                    block_copy(output.add((q as u64 * chunk + s) as usize), ag(p.rank, q as u64).add(s as usize), e - s);
                }
            } else if mode == CollectiveMode::AllGather as u32 {
                let (s, e) = sub_slice(bytes, b as u64, nb);
                block_copy(stage.add(s as usize), input.add(s as usize), e - s);
                if !barrier(&p, None) {
                    return;
                }
                for q in 0..p.nranks {
                    let src = if q == p.rank { input } else { peer_stage(q) };
                    block_copy(output.add((q as u64 * p.stride + s) as usize), src.add(s as usize), e - s);
                }
            } else if mode == CollectiveMode::ReduceScatter as u32 {
                let part = up16(bytes);
                let (s, e) = sub_slice(bytes, b as u64, nb);
                for c in 0..n {
                    block_copy(stage.add((c * part + s) as usize), input.add((c * p.stride + s) as usize), e - s);
                }
                if !barrier(&p, None) {
                    return;
                }
                block_reduce_into(stage.add((me * part + s) as usize), &p, e - s, dtype, op, |q| {
                    peer_stage(q).add((me * part + s) as usize)
                });
                arch::sync_threads();
                block_copy(output.add(s as usize), stage.add((me * part + s) as usize), e - s);
            } else if mode == CollectiveMode::Broadcast as u32 {
                let (s, e) = sub_slice(bytes, b as u64, nb);
                if p.rank == p.root {
                    block_copy(stage.add(s as usize), input.add(s as usize), e - s);
                }
                if !barrier(&p, None) {
                    return;
                }
                let src = if p.rank == p.root { input } else { peer_stage(p.root) };
                block_copy(output.add(s as usize), src.add(s as usize), e - s);
            } else if mode == CollectiveMode::AllToAll as u32 {
                let part = up16(bytes);
                let (s, e) = sub_slice(bytes, b as u64, nb);
                for c in 0..n {
                    block_copy(stage.add((c * part + s) as usize), input.add((c * p.stride + s) as usize), e - s);
                }
                if !barrier(&p, None) {
                    return;
                }
                for q in 0..p.nranks {
                    let src = peer_stage(q).add((me * part + s) as usize);
                    block_copy(output.add((q as u64 * p.stride + s) as usize), src, e - s);
                }
            } else if mode == CollectiveMode::Send as u32 {
                let (s, e) = sub_slice(bytes, b as u64, nb);
                block_copy(stage.add(s as usize), input.add(s as usize), e - s);
                if !barrier(&p, only) {
                    return;
                }
                // The receiver reads; it tells us when our staging may be reused.
                barrier(&p, only);
            } else if mode == CollectiveMode::Recv as u32 {
                let (s, e) = sub_slice(bytes, b as u64, nb);
                if !barrier(&p, only) {
                    return;
                }
                block_copy(output.add(s as usize), peer_stage(p.root).add(s as usize), e - s);
                barrier(&p, only);
            }
        }
    }
}
