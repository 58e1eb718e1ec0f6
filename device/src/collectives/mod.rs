//! The collective kernels, over MemoryChannels to every peer (one row of channels per block).
//!
//! Every rank owns a scratch buffer that every peer maps; channel `(b, q)` of rank `r` points
//! at rank `q`'s scratch (`dst`) and at `r`'s own (`src`), with a semaphore paired with channel
//! `(b, r)` of rank `q`. Two regions of the scratch are used (offsets in `CollectiveParams`):
//!
//! - LL region: `2 × (nranks - 1)` slots of `ll_slot_bytes` (one per peer: `ll::slot_of`),
//!   double-buffered by the parity of the call's flag. [`ll_collective_kernel`] writes its input (or the part meant for that peer)
//!   as LL16 packets into its slot of every peer's region and reduces or copies what arrives
//!   in its own region; no barrier is needed (the flags carry the synchronisation). Every LL launch
//!   exchanges packets with every peer (or is a two-rank exchange; a broadcast's non-roots
//!   send one ack packet to every peer), so a peer is never more than one LL call ahead (it
//!   cannot finish call `k + 1` before this rank has written its packets of `k + 1`), and two
//!   halves suffice.
//! - LL128 region: the same shape with slots of `ll128_slot_bytes`, for
//!   [`ll128_all_reduce_kernel`] (128-byte lines of 120 data bytes written by a warp; see
//!   `ll128.rs`).
//! - Staging region: [`staged_collective_kernel`] copies input there, meets every peer at a
//!   block barrier (signal + wait on the block's channel to each peer), and reads the peers'
//!   staging directly. Block `b` only touches sub-slice `b` of every part, and sub-slice `b` of
//!   a peer is written by the peer's block `b` before the same barrier, so blocks need no
//!   grid-wide synchronisation. Every launch starts with a barrier so that nobody overwrites a
//!   staging buffer a peer may still be reading from the previous launch.
//!
//! Main kernels and `_any` twins: every reducing kernel exists twice. The main one reduces the
//! sums and pre-multiplied sums (so the floating averages too) of f16, bf16 and f32 only
//! (`DeviceReduceOp::is_inline`), with loops of constant type, and moves data of any type; its `_any` twin (`ll_collective_any_kernel`,
//! `ll128_collective_any_kernel`, `ll_two_shot_all_reduce_any_kernel`,
//! `staged_collective_any_kernel`, `direct_collective_any_kernel`) reduces every type and
//! operator of `crate::reduce`. So the main kernels' registers (what their occupancy and the
//! hot sums' speed depend on) pay nothing for the other types: ptxas gives them no more than
//! before the other types existed. The host launches the twin for every other reduction; a
//! main kernel launched for one records `InvalidArgument` and does nothing.

/// The collective kernels' one dispatch on (type, operator): evaluates `$body` with `$r` bound
/// to the reducer `$reducer` as a kernel of kind `$any` serves it. A main kernel (`$any`
/// false) reduces the inline pairs only (`DeviceReduceOp::is_inline`: sums and pre-multiplied
/// sums of f16, bf16, f32), each type with a constant [`InlineSum`](crate::reduce::InlineSum)
/// (whose one flag says whether it multiplies), so that its loops carry no type dispatch and
/// its registers pay for no other type, and evaluates `$other` for any other pair
/// (its frame refused those already, see [`reducer_for`]); an `_any` kernel (`$any` true)
/// reduces every pair with the [`Reducer`] as it came (the common sums inline, the rest
/// through one out-of-line call per unit, see `crate::reduce`).
macro_rules! with_reducer {
    ($any:expr, $reducer:expr, |$r:ident| $body:expr, $other:expr) => {{
        use ::mscclpp_shared::{DataType, DeviceReduceOp};
        use $crate::reduce::{InlineSum, Reducer};
        let reducer: Reducer = $reducer;
        if $any {
            let $r = reducer;
            $body
        } else {
            match (reducer.dtype, reducer.op) {
                (DataType::F16, DeviceReduceOp::Sum | DeviceReduceOp::PreMulSum) => {
                    let $r = InlineSum::of(DataType::F16, &reducer);
                    $body
                }
                (DataType::BF16, DeviceReduceOp::Sum | DeviceReduceOp::PreMulSum) => {
                    let $r = InlineSum::of(DataType::BF16, &reducer);
                    $body
                }
                (DataType::F32, DeviceReduceOp::Sum | DeviceReduceOp::PreMulSum) => {
                    let $r = InlineSum::of(DataType::F32, &reducer);
                    $body
                }
                _ => $other,
            }
        }
    }};
}

pub mod direct;
pub mod ll;
pub mod ll128;
pub mod ll_two_shot;
pub mod p2p;
pub mod port;

#[cfg(test)]
mod tests;

pub use direct::{direct_collective_any_kernel, direct_collective_kernel};
pub use ll::{
    ll_all_gather_kernel, ll_all_reduce_kernel, ll_collective_any_kernel, ll_collective_kernel,
    ll_reduce_kernel,
};
pub use ll_two_shot::{ll_two_shot_all_reduce_any_kernel, ll_two_shot_all_reduce_kernel};
pub use ll128::{ll128_all_reduce_kernel, ll128_collective_any_kernel, ll128_collective_kernel};
pub use p2p::p2p_kernel;
pub use port::port_collective_kernel;

use crate::arch;
use crate::copy::copy;
use crate::memory_channel::MemoryChannel;
use crate::reduce::{Reduce, Reducer};
use crate::trace;
use mscclpp_shared::status::error_detail;
use mscclpp_shared::{
    CollectiveMode, CollectiveParams, DataType, DeviceErrorCode, DeviceReduceOp,
    MemoryChannelDeviceHandle, TraceEventKind, WaitSite,
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

/// [`barrier`] with the peers `meet` selects. The first `sync_threads` puts every thread's
/// earlier writes before the signals (the block-wide signal contract, see
/// `crate::memory_channel`); the closing vote puts the waits before every thread's later
/// accesses and tells the block whether one of them gave up.
#[inline(always)]
fn barrier_with(p: &CollectiveParams, meet: impl Fn(u32) -> bool) -> bool {
    let t = arch::thread_idx_x();
    let b = arch::block_idx_x();
    arch::sync_threads();
    let mut failed = false;
    if t < p.nranks && t != p.rank && meet(t) {
        let ch = channel(p, b, t);
        ch.signal();
        failed = ch.wait().is_err();
    }
    !arch::sync_threads_or(failed)
}

/// The reducer a kernel of kind `ANY` uses for `p`, or `None` when it does nothing: a launch
/// gated out ([`gated_out`]); else an `_any` kernel decodes every type and operator
/// ([`Reducer::from_params`]); a main kernel only the inline pairs when the launch `reduces`
/// (another pair is recorded as `InvalidArgument`: the host launches those on the `_any` twin)
/// and nothing else (a copy). `None` also for a type or operator this build does not know.
#[inline(always)]
fn reducer_for<const ANY: bool>(p: &CollectiveParams, reduces: bool) -> Option<Reducer> {
    reducer_serving::<ANY>(p, reduces, true)
}

/// [`reducer_for`] where a main kernel also refuses the launch unless `serves` (a mode it
/// leaves to another kernel), through the same one refusal.
#[inline(always)]
fn reducer_serving<const ANY: bool>(
    p: &CollectiveParams,
    reduces: bool,
    serves: bool,
) -> Option<Reducer> {
    if gated_out(p) {
        return None;
    }
    if ANY {
        return Reducer::from_params(p);
    }
    let (dtype, op) = (
        DataType::from_u32(p.dtype)?,
        DeviceReduceOp::from_u32(p.op)?,
    );
    if serves && (!reduces || op.is_inline(dtype)) {
        if op == DeviceReduceOp::PreMulSum {
            // Its scalar, by value or read from device memory.
            Reducer::from_params(p)
        } else {
            Some(Reducer::plain(dtype, op))
        }
    } else {
        refuse(p);
        None
    }
}

/// Whether `p` is the launch behind a direct launch that ran its call after all: it has a gate
/// (`CollectiveParams::gate`) that `ll_flags[2]` does not hold. Every rank's direct launch
/// stored the same verdict there (`direct.rs`), so every rank's launch behind it runs or
/// returns alike, before it touches any flag or peer.
#[inline(always)]
fn gated_out(p: &CollectiveParams) -> bool {
    // SAFETY: `ll_flags` holds four words (host); the direct launch's store happened before
    // this launch began (same stream).
    p.gate != 0 && unsafe { arch::ld_relaxed_sys_u64(p.ll_flags.as_ptr().add(2)) } != p.gate as u64
}

/// Records that a main kernel was launched for something only another kernel serves (a
/// reduction its `_any` twin serves; the all-mode LL kernel's all-reduce).
#[inline(always)]
fn refuse(p: &CollectiveParams) {
    let what = (p.dtype as u64) << 8 | p.op as u64;
    crate::wait::record_error(
        p.status,
        DeviceErrorCode::InvalidArgument,
        error_detail(WaitSite::Unknown, what),
    );
}

/// The start of a kernel that uses [`barrier`]: decodes the call's [`Reducer`]
/// ([`reducer_for`]).
#[inline(always)]
fn begin<const ANY: bool>(p: &CollectiveParams, reduces: bool) -> Option<Reducer> {
    reducer_for::<ANY>(p, reduces)
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

/// Block-collective reduction: `acc[i] = post(pre(acc[i]) ⊕ pre(source(q)[i]) ⊕ …)` over every
/// peer `q` (`acc` holds this rank's own contribution), over `len` bytes (16-byte aligned
/// pointers; `len` is rounded up to whole 16-byte vectors, which the host keeps inside every
/// buffer).
#[inline(always)]
fn block_reduce_into(
    acc: *mut u8,
    p: &CollectiveParams,
    len: u64,
    r: impl Reduce,
    source: impl Fn(u32) -> *const u8,
) {
    let vecs = len.div_ceil(16);
    let mut i = arch::thread_idx_x() as u64;
    while i < vecs {
        // SAFETY: the caller's ranges (see above).
        unsafe {
            let a = acc.add((i * 16) as usize) as *mut u32;
            let mut v = r.pre_v4(arch::ld_v4_u32(a));
            for q in 0..p.nranks {
                if q == p.rank {
                    continue;
                }
                let w = arch::ld_v4_u32(source(q).add((i * 16) as usize) as *const u32);
                v = r.fold_v4(v, w);
            }
            arch::st_v4_u32(a, r.post_v4(v));
        }
        i += arch::block_dim_x() as u64;
    }
}

/// Whether `mode` reduces (the staged and direct kernels).
#[inline(always)]
fn mode_reduces(mode: u32) -> bool {
    mode == CollectiveMode::AllReduce as u32
        || mode == CollectiveMode::AllReducePut as u32
        || mode == CollectiveMode::ReduceScatter as u32
        || mode == CollectiveMode::ReduceLocal as u32
        || mode == CollectiveMode::Reduce as u32
}

crate::kernel! {
    /// Every collective through the staging region (see the module docs and `CollectiveMode`),
    /// reducing the sums and pre-multiplied sums (f16, bf16, f32; other reductions:
    /// [`staged_collective_any_kernel`]). Needs no dynamic shared memory.
    fn staged_collective_kernel(p: CollectiveParams) {
        trace::event(&p.trace, TraceEventKind::Start);
        staged::<false>(p);
    }
}

crate::kernel! {
    /// [`staged_collective_kernel`] for every type and operator.
    fn staged_collective_any_kernel(p: CollectiveParams) {
        trace::event(&p.trace, TraceEventKind::Start);
        staged::<true>(p);
    }
}

/// The staged kernels' body (`ANY`: which kind, see [`with_reducer`]).
#[inline(always)]
fn staged<const ANY: bool>(p: CollectiveParams) {
    let Some(r) = begin::<ANY>(&p, mode_reduces(p.mode)) else {
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
    trace::event(&p.trace, TraceEventKind::Send);
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
                block_copy(
                    stage.add((c * chunk + s) as usize),
                    input.add((c * chunk + s) as usize),
                    e - s,
                );
            }
            if !barrier(&p, None) {
                return;
            }
            let c_len = bytes.saturating_sub(me * chunk).min(chunk);
            let (s, e) = sub_slice(c_len, b as u64, nb);
            let acc = stage.add((me * chunk + s) as usize);
            let from = |q: u32| peer_stage(q).add((me * chunk + s) as usize) as *const u8;
            with_reducer!(ANY, r, |r| block_reduce_into(acc, &p, e - s, r, from), ());
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
            let from = |q: u32| rs(p.rank, q as u64).add(s as usize) as *const u8;
            with_reducer!(ANY, r, |r| block_reduce_into(mine, &p, e - s, r, from), ());
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
                block_copy(
                    output.add((q as u64 * chunk + s) as usize),
                    ag(p.rank, q as u64).add(s as usize),
                    e - s,
                );
            }
        } else if mode == CollectiveMode::AllGather as u32 {
            let (s, e) = sub_slice(bytes, b as u64, nb);
            block_copy(stage.add(s as usize), input.add(s as usize), e - s);
            if !barrier(&p, None) {
                return;
            }
            for q in 0..p.nranks {
                let src = if q == p.rank { input } else { peer_stage(q) };
                block_copy(
                    output.add((q as u64 * p.stride + s) as usize),
                    src.add(s as usize),
                    e - s,
                );
            }
        } else if mode == CollectiveMode::ReduceScatter as u32 {
            let part = up16(bytes);
            let (s, e) = sub_slice(bytes, b as u64, nb);
            for c in 0..n {
                block_copy(
                    stage.add((c * part + s) as usize),
                    input.add((c * p.stride + s) as usize),
                    e - s,
                );
            }
            if !barrier(&p, None) {
                return;
            }
            let acc = stage.add((me * part + s) as usize);
            let from = |q: u32| peer_stage(q).add((me * part + s) as usize) as *const u8;
            with_reducer!(ANY, r, |r| block_reduce_into(acc, &p, e - s, r, from), ());
            arch::sync_threads();
            block_copy(
                output.add(s as usize),
                stage.add((me * part + s) as usize),
                e - s,
            );
        } else if mode == CollectiveMode::Reduce as u32 {
            // Every rank stages its piece; the root reduces every rank's staging into its
            // own, then into its output (the next launch's opening barrier keeps the peers'
            // staging until the root has read it).
            let (s, e) = sub_slice(bytes, b as u64, nb);
            block_copy(stage.add(s as usize), input.add(s as usize), e - s);
            if !barrier(&p, None) {
                return;
            }
            if p.rank == p.root {
                let acc = stage.add(s as usize);
                let from = |q: u32| peer_stage(q).add(s as usize) as *const u8;
                with_reducer!(ANY, r, |r| block_reduce_into(acc, &p, e - s, r, from), ());
                arch::sync_threads();
                block_copy(output.add(s as usize), acc, e - s);
            }
        } else if mode == CollectiveMode::Broadcast as u32 {
            let (s, e) = sub_slice(bytes, b as u64, nb);
            if p.rank == p.root {
                block_copy(stage.add(s as usize), input.add(s as usize), e - s);
            }
            if !barrier(&p, None) {
                return;
            }
            let src = if p.rank == p.root {
                input
            } else {
                peer_stage(p.root)
            };
            block_copy(output.add(s as usize), src.add(s as usize), e - s);
        } else if mode == CollectiveMode::AllToAll as u32 {
            let part = up16(bytes);
            let (s, e) = sub_slice(bytes, b as u64, nb);
            for c in 0..n {
                block_copy(
                    stage.add((c * part + s) as usize),
                    input.add((c * p.stride + s) as usize),
                    e - s,
                );
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
            block_copy(
                output.add(s as usize),
                peer_stage(p.root).add(s as usize),
                e - s,
            );
            barrier(&p, only);
        }
    }
    // Every data wait that gave up returned above (the closing meetings of send and recv only
    // free the staging). `End` is recorded here, on the way out of a launch that ran, not
    // around the whole body: code after the early returns above (a join of them all) cost
    // this kernel 8 registers on sm_90 even when it does nothing (see `crate::trace`). No
    // `Recv`: it would be recorded here too, at `End`'s time, and it cost the `_any` kernel 2
    // registers (a complete block's last wait is the one just before `End`).
    trace::event(&p.trace, TraceEventKind::End);
}
