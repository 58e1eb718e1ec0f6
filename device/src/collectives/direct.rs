//! The direct collectives: one kernel that works on the callers' own buffers instead of staging
//! copies. The host registers every rank's input and output on first use and hands each rank
//! all of them, mapped into its address space ([`DirectCollectiveParams`]).
//!
//! Every mode but reduce-local is: a block barrier with the peers (their buffers are ready:
//! each peer's stream reached this call, so it is done with whatever it did to them before),
//! the block's share of the work, and a second barrier (every peer's writes into this rank's
//! output have landed, so the output is final when the kernel ends). Block `b` of every rank
//! handles sub-slice `b` of every part and meets only block `b` of its peers, so blocks never
//! wait for each other.
//!
//! Who writes what (rank `r`, `n` ranks, part = `bytes`, or a chunk of `bytes / n` for the
//! all-reduce):
//! - all-reduce: chunk `r` of every rank's output, reduced from chunk `r` of every rank's input
//!   (remote loads, then remote stores). Nobody else touches chunk `r` anywhere, so in place is
//!   safe; each element is read and written by the same thread.
//! - reduce-scatter: its own output only, from part `r` of every input (remote loads).
//! - reduce: the root's output only, from every input (the root's remote loads; the other
//!   ranks only meet).
//! - all-gather, all-to-all, broadcast: stores only: part `r` of every rank's output
//!   (all-to-all: part `r` of rank `q`'s output comes from part `q` of the input; broadcast:
//!   only the root stores).
//! - send (`send_recv`): its input into rank `root`'s output, between meetings with exactly
//!   the ranks whose `outputs` entry is set (the next and previous rank of the exchange).
//! - barrier: one meeting with the peers whose bit is set in `root`; the host brackets
//!   copy-engine transfers with it.
//! - reduce-local: no meeting and no remote access: `bytes` of every `inputs[q]` reduced into
//!   `outputs[rank]` (the host points the inputs at its own input and at the pieces the peers
//!   copied into its scratch, and orders everything by streams and barriers).
//!
//! The host uses this kernel only when `bytes` (and `stride`) are multiples of 16 and every
//! pointer is 16-byte aligned, so everything moves in whole 16-byte vectors.
//!
//! # Registered buffers (no host exchange)
//!
//! When `registry` is set the host knows only this rank's buffers; each block learns the
//! peers' itself (`publish`, `resolve`), so that no host message names them:
//!
//! 1. Before its first barrier, thread `q` of block `b` writes this rank's descriptor (`mine`:
//!    each buffer's registration slot, generation and offset, a digest of the call, and
//!    whether this rank's buffers suit the kernel) into peer `q`'s scratch, at
//!    `desc_offset + (b * nranks + rank) * 64`. The same thread then signals peer `q` in the
//!    barrier: its release publishes the descriptor.
//! 2. After the barrier (thread `q` acquired peer `q`'s signal), thread `q` reads peer `q`'s
//!    descriptor from this rank's scratch and resolves each buffer the mode needs from the
//!    peer in `registry[q][slot]` (relaxed system-scope loads: the host wrote the slot before
//!    it acknowledged the peer's registration, long before the peer could name it). It checks
//!    everything: `ok`, the call's digest, the slot's generation, that the buffer holds `need`
//!    bytes from its offset and is 16-byte aligned. The resolved pointers go to shared memory;
//!    a vote tells the block whether any check failed.
//! 3. A block where a check failed records `InvalidArgument` (detail: the peer and a
//!    [`RegisteredRefusal`]), moves nothing and still meets its peers at the closing barrier,
//!    so nobody waits for it. A descriptor that says `ok = 0` or names another call is refused
//!    by every rank (the bad rank checks its own `ok`, and sees every peer's digest differ
//!    from its own), so no rank moves data. A slot, generation or range that only the peers
//!    can check (their mapping of the bad rank's registrations) is refused by those peers
//!    only: the bad rank's own checks pass and it moves its share (for an all-reduce, its
//!    chunk of every output). The host reports the peers' error and the call's outputs are
//!    not to be used (`collectives::tests::direct` pins this down). A well-behaved host never
//!    names a registration its peers have not acknowledged, so this only guards against a
//!    faulty peer.
//!
//! 4. **Declining** (a launch with a gate, `decline`): a rank whose buffers are not known to
//!    every peer yet (its registrations not answered by all, or memory it cannot share) says
//!    `ok = 0`; then every block of every rank sees an `ok = 0` (its own, or that peer's
//!    descriptor), moves nothing, records no error and meets its peers at the closing barrier,
//!    and block 0 of every rank stores the gate to `ll_flags[2]` (0 when the call ran, or when a
//!    check other than `ok` failed: that is an error, as without a gate). The launch the host
//!    queued behind this one, with the same gate, runs only where the gate was stored
//!    (`CollectiveParams::gate`): on every rank alike, since every rank read the same `ok`
//!    words. Without a gate (a forced call), `ok = 0` is refused as in step 3.
//!
//! A descriptor area is rewritten only by the next call's block `b`, which starts after this
//! call's block `b` of the reader passed its closing barrier, after its reads.

use super::{barrier, barrier_with, begin, channel, mode_reduces, sub_slice, up16};
use crate::arch;
use crate::reduce::{CommonSum, Reduce};
use crate::trace;
use mscclpp_shared::status::error_detail;
use mscclpp_shared::{
    BufferRef, CollectiveMode, DeviceErrorCode, DirectCollectiveParams, MAX_DIRECT_RANKS,
    REGISTERED_CALL_BYTES, REGISTRY_SLOTS, RegisteredCall, RegisteredRefusal, TraceEventKind,
    WaitSite,
};

/// 16-byte vectors a thread keeps in flight per step (loads are issued before their uses).
const UNROLL: usize = 4;

/// What a block moves: vectors `[0, nv)` from `src(q) + i * 16` of the ranks `q` it reads, to
/// `dst(q) + i * 16` of the ranks it writes.
struct Spread<S, D> {
    nv: u64,
    src: S,
    dst: D,
}

/// Loads vector `j` from `src`, or zeros past `nv`.
///
/// # Safety
/// `src + j * 16` is readable when `j < nv`.
#[inline(always)]
unsafe fn load(src: *const u8, j: u64, nv: u64) -> [u32; 4] {
    if j < nv {
        // SAFETY: forwarded contract.
        unsafe { arch::ld_v4_u32(src.add((j * 16) as usize) as *const u32) }
    } else {
        [0; 4]
    }
}

/// Reduces vectors over `readers` ranks (`src(q)` for `q` in `readers`, `first` first; each
/// pre-multiplied, the result post-divided: [`Reduce`]) and stores the result to `dst(q)` for
/// `q` in `writers`. Block-collective.
///
/// # Safety
/// Every `src(q)` / `dst(q)` holds `nv * 16` bytes (kernel contract).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn reduce_spread<S, D>(
    s: &Spread<S, D>,
    first: u32,
    readers: impl Fn(u32) -> bool,
    writers: impl Fn(u32) -> bool,
    nranks: u32,
    r: impl Reduce,
) where
    S: Fn(u32) -> *const u8,
    D: Fn(u32) -> *mut u8,
{
    let bd = arch::block_dim_x() as u64;
    let mut i = arch::thread_idx_x() as u64;
    while i < s.nv {
        let mut acc = [[0u32; 4]; UNROLL];
        let base = (s.src)(first);
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: forwarded contract.
            *a = r.pre_v4(unsafe { load(base, i + k as u64 * bd, s.nv) });
        }
        for q in 0..nranks {
            if q == first || !readers(q) {
                continue;
            }
            let src = (s.src)(q);
            let mut w = [[0u32; 4]; UNROLL];
            for (k, v) in w.iter_mut().enumerate() {
                // SAFETY: forwarded contract.
                *v = unsafe { load(src, i + k as u64 * bd, s.nv) };
            }
            for k in 0..UNROLL {
                acc[k] = r.fold_v4(acc[k], w[k]);
            }
        }
        for a in acc.iter_mut() {
            *a = r.post_v4(*a);
        }
        for q in 0..nranks {
            if !writers(q) {
                continue;
            }
            let dst = (s.dst)(q);
            for (k, a) in acc.iter().enumerate() {
                let j = i + k as u64 * bd;
                if j < s.nv {
                    // SAFETY: forwarded contract.
                    unsafe { arch::st_v4_u32(dst.add((j * 16) as usize) as *mut u32, *a) };
                }
            }
        }
        i += bd * UNROLL as u64;
    }
}

/// Copies vectors `[0, nv)` from `src(first)` to `dst(q)` for `q` in `writers` (a multicast
/// copy: one load, several stores). Block-collective.
///
/// # Safety
/// As [`reduce_spread`].
#[inline(always)]
unsafe fn copy_spread<S, D>(s: &Spread<S, D>, first: u32, writers: impl Fn(u32) -> bool, n: u32)
where
    S: Fn(u32) -> *const u8,
    D: Fn(u32) -> *mut u8,
{
    // SAFETY: forwarded contract; no rank other than `first` is read, and a copy's reducer
    // changes nothing.
    unsafe { reduce_spread(s, first, |_| false, writers, n, CommonSum::COPY) }
}

crate::kernel! {
    /// Every collective on the callers' registered buffers (see the module docs), reducing the
    /// sums and pre-multiplied sums (f16, bf16, f32; other reductions: [`direct_collective_any_kernel`]). Needs
    /// `DIRECT_SHARED_BYTES` of dynamic shared memory (every rank's buffers; the barrier mode
    /// none) and at most `common.max_blocks` blocks.
    fn direct_collective_kernel(d: DirectCollectiveParams) {
        trace::event(&d.common.trace, TraceEventKind::Start);
        direct::<false>(d);
    }
}

crate::kernel! {
    /// [`direct_collective_kernel`] for every type and operator.
    fn direct_collective_any_kernel(d: DirectCollectiveParams) {
        trace::event(&d.common.trace, TraceEventKind::Start);
        direct::<true>(d);
    }
}

/// The direct kernels' body (`ANY`: which kind, see `with_reducer!`).
#[inline(always)]
fn direct<const ANY: bool>(d: DirectCollectiveParams) {
    let p = &d.common;
    let Some(r) = begin::<ANY>(p, mode_reduces(p.mode)) else {
        return;
    };
    if p.nranks as usize > MAX_DIRECT_RANKS || p.rank >= p.nranks {
        return; // the tables hold MAX_DIRECT_RANKS entries; the host never launches this
    }
    let (b, nb) = (arch::block_idx_x() as u64, arch::grid_dim_x() as u64);
    let (n, me) = (p.nranks, p.rank);
    if p.mode == CollectiveMode::Barrier as u32 {
        // One meeting: the host queues one before and one after its copies.
        trace::event(&p.trace, TraceEventKind::Send);
        trace::event_if(
            &p.trace,
            TraceEventKind::Recv,
            barrier_with(p, |q| q < 32 && p.root & (1 << q) != 0),
        );
        trace::event(&p.trace, TraceEventKind::End);
        return;
    }
    // Every rank's buffers, in this block's shared memory (from word 2: inputs, then outputs):
    // copied from the parameters, or, on registered buffers, resolved from the peers'
    // descriptors after the first barrier (module docs). The closures below read them there.
    let registered = !d.registry.is_null();
    let sh = arch::dynamic_shared_mem() as *mut u64;
    if !registered {
        fill(&d, sh);
    }
    // SAFETY (both): the launch gives `DIRECT_SHARED_BYTES` of shared memory (host), holding
    // `2 * MAX_DIRECT_RANKS` pointers from word 2; `q < nranks <= MAX_DIRECT_RANKS`; written
    // before a `sync_threads` that precedes every read.
    let input = |q: u32| unsafe { sh.add(2 + q as usize).read() as *const u8 };
    let output = |q: u32| unsafe { sh.add(2 + MAX_DIRECT_RANKS + q as usize).read() as *mut u8 };
    // `len` bytes at offset `off` of every rank's input, to the same bytes of the outputs
    // (the pointers are only formed here; `reduce_spread` reads and writes them).
    let same_offset = |off: u64, len: u64| Spread {
        nv: len / 16,
        src: move |q| input(q).wrapping_add(off as usize),
        dst: move |q| output(q).wrapping_add(off as usize),
    };
    let all = |_| true;
    if p.mode == CollectiveMode::Send as u32 {
        // send_recv: meet the ranks with an output entry (next and prev), write my input
        // into `root`'s output, and meet them again.
        let meet = |q: u32| {
            q < n
                && if registered {
                    q < 32 && d.meet & (1 << q) != 0
                } else {
                    !d.outputs[q as usize].is_null()
                }
        };
        trace::event(&p.trace, TraceEventKind::Send);
        if registered {
            publish(&d, meet);
            if !barrier_with(p, meet) {
                return;
            }
            if !resolve(&d, sh, meet) {
                barrier_with(p, meet);
                return;
            }
        } else if !barrier_with(p, meet) {
            return;
        }
        let (s, e) = sub_slice(p.bytes, b, nb);
        // SAFETY: `root`'s output holds `bytes` (it shared it), my input too.
        unsafe { copy_spread(&same_offset(s, e - s), me, |q| q == p.root, n) };
        trace::event_if(&p.trace, TraceEventKind::Recv, barrier_with(p, meet));
        trace::event(&p.trace, TraceEventKind::End);
        return;
    }
    if p.mode == CollectiveMode::ReduceLocal as u32 {
        // A piece of the pipelined copy-engine all-reduce: every source is local (the
        // host's stream order and barriers made them ready), so no meeting; only the
        // pointers' copy to shared memory to wait for.
        arch::sync_threads();
        let (s, e) = sub_slice(p.bytes, b, nb);
        let sp = same_offset(s, e - s);
        // SAFETY: the host passes `nranks` sources and `outputs[rank]`, each holding
        // `bytes`.
        with_reducer!(
            ANY,
            r,
            |r| unsafe { reduce_spread(&sp, me, all, |q| q == me, n, r) },
            ()
        );
        trace::event(&p.trace, TraceEventKind::End);
        return;
    }
    trace::event(&p.trace, TraceEventKind::Send);
    if registered {
        publish(&d, |_| true);
        if !barrier(p, None) {
            return;
        }
        if !resolve(&d, sh, |_| true) {
            barrier(p, None);
            return;
        }
    } else if !barrier(p, None) {
        return;
    }
    // SAFETY (whole body): the host sized every rank's buffers for the mode (module docs)
    // and mapped them here; every offset below stays inside a part of `bytes` or `stride`.
    unsafe {
        if p.mode == CollectiveMode::AllReduce as u32 {
            let chunk = up16(p.bytes.div_ceil(n as u64));
            let at = me as u64 * chunk;
            let (s, e) = sub_slice(p.bytes.saturating_sub(at).min(chunk), b, nb);
            let sp = same_offset(at + s, e - s);
            with_reducer!(ANY, r, |r| reduce_spread(&sp, me, all, all, n, r), ());
        } else if p.mode == CollectiveMode::ReduceScatter as u32 {
            let (s, e) = sub_slice(p.bytes, b, nb);
            let from = (me as u64 * p.stride + s) as usize;
            let sp = Spread {
                nv: (e - s) / 16,
                src: |q| input(q).add(from),
                dst: |q| output(q).add(s as usize),
            };
            with_reducer!(
                ANY,
                r,
                |r| reduce_spread(&sp, me, all, |q| q == me, n, r),
                ()
            );
        } else if p.mode == CollectiveMode::AllGather as u32 {
            let (s, e) = sub_slice(p.bytes, b, nb);
            let sp = Spread {
                nv: (e - s) / 16,
                src: |q| input(q).add(s as usize),
                dst: |q| output(q).add((me as u64 * p.stride + s) as usize),
            };
            copy_spread(&sp, me, all, n);
        } else if p.mode == CollectiveMode::Reduce as u32 {
            if me == p.root {
                let (s, e) = sub_slice(p.bytes, b, nb);
                let sp = same_offset(s, e - s);
                with_reducer!(
                    ANY,
                    r,
                    |r| reduce_spread(&sp, me, all, |q| q == me, n, r),
                    ()
                );
            }
        } else if p.mode == CollectiveMode::Broadcast as u32 {
            if me == p.root {
                let (s, e) = sub_slice(p.bytes, b, nb);
                copy_spread(&same_offset(s, e - s), me, all, n);
            }
        } else if p.mode == CollectiveMode::AllToAll as u32 {
            let (s, e) = sub_slice(p.bytes, b, nb);
            for q in 0..n {
                let sp = Spread {
                    nv: (e - s) / 16,
                    src: |_| input(me).add((q as u64 * p.stride + s) as usize),
                    dst: |q| output(q).add((me as u64 * p.stride + s) as usize),
                };
                copy_spread(&sp, me, |w| w == q, n);
            }
        }
    }
    trace::event_if(&p.trace, TraceEventKind::Recv, barrier(p, None));
    trace::event(&p.trace, TraceEventKind::End);
}

/// Every rank's buffers from the parameters into shared memory (a launch whose buffers the
/// host exchanged): thread `q < nranks` copies rank `q`'s. A `sync_threads` must follow before
/// any thread reads them.
#[inline(always)]
fn fill(d: &DirectCollectiveParams, sh: *mut u64) {
    let t = arch::thread_idx_x();
    if t < d.common.nranks {
        // SAFETY: as for the reads (`direct`); `t < nranks <= MAX_DIRECT_RANKS`.
        unsafe {
            sh.add(2 + t as usize).write(d.inputs[t as usize].addr());
            sh.add(2 + MAX_DIRECT_RANKS + t as usize)
                .write(d.outputs[t as usize].addr());
        }
    }
}

/// Step 1 of a launch on registered buffers (module docs): thread `q` writes this rank's
/// descriptor into the descriptor area of every peer `q` that `meet` selects (block `b`, slot
/// `rank`), before the barrier in which the same thread signals `q`.
#[inline(always)]
fn publish(d: &DirectCollectiveParams, meet: impl Fn(u32) -> bool) {
    let p = &d.common;
    let (t, b) = (arch::thread_idx_x(), arch::block_idx_x());
    if t < p.nranks && t != p.rank && meet(t) {
        let at = d.desc_offset + ((b * p.nranks + p.rank) as u64) * REGISTERED_CALL_BYTES as u64;
        let dst = channel(p, b, t).dst.as_ptr();
        // SAFETY: peer `t`'s scratch (mapped here) holds `max_blocks * nranks` descriptors from
        // `desc_offset`; `b < max_blocks`. Only this thread writes this one (module docs).
        unsafe { (dst.add(at as usize) as *mut RegisteredCall).write_volatile(d.mine) };
    }
}

/// Steps 2 to 4 of a launch on registered buffers (module docs): every thread `q < nranks`
/// resolves rank `q`'s buffers into shared memory (`sh`, from word 2: inputs, then outputs),
/// checking everything; returns whether the whole block may go on (a vote). A block that may
/// not has recorded why, or declined the call (with a gate), and block 0 stored the verdict.
#[inline(always)]
fn resolve(d: &DirectCollectiveParams, sh: *mut u64, meet: impl Fn(u32) -> bool) -> bool {
    let p = &d.common;
    let (t, b) = (arch::thread_idx_x(), arch::block_idx_x());
    let mut bad = None;
    if t < p.nranks {
        let (inp, out) = if t == p.rank {
            if d.mine.ok != 1 {
                bad = Some(RegisteredRefusal::NotOk);
            }
            (d.inputs[t as usize].addr(), d.outputs[t as usize].addr())
        } else if meet(t) {
            let at = d.desc_offset + ((b * p.nranks + t) as u64) * REGISTERED_CALL_BYTES as u64;
            // SAFETY: this rank's scratch holds the descriptor area (host); peer `t` wrote this
            // descriptor before the signal this thread acquired in the barrier.
            let theirs = unsafe {
                (p.scratch.as_ptr().add(at as usize) as *const RegisteredCall).read_volatile()
            };
            match peer_buffers(d, t, &theirs) {
                Ok(x) => x,
                Err(why) => {
                    bad = Some(why);
                    (0, 0)
                }
            }
        } else {
            (0, 0)
        };
        // SAFETY: the launch's shared memory holds `2 + 2 * MAX_DIRECT_RANKS` words (host).
        unsafe {
            sh.add(2 + t as usize).write(inp);
            sh.add(2 + MAX_DIRECT_RANKS + t as usize).write(out);
        }
    }
    // With a gate, `ok = 0` (this rank's or a peer's) declines the call: no error.
    let declines = d.decline != 0 && bad == Some(RegisteredRefusal::NotOk);
    if let Some(why) = bad.filter(|_| !declines) {
        let what = (t as u64) << 8 | why as u64;
        crate::wait::record_error(
            p.status,
            DeviceErrorCode::InvalidArgument,
            error_detail(WaitSite::Unknown, what),
        );
    }
    let failed = arch::sync_threads_or(bad.is_some() && !declines);
    let declined = arch::sync_threads_or(declines);
    if d.decline != 0 && b == 0 && t == 0 {
        // The verdict for the launch queued behind (module docs, step 4): every rank's block 0
        // reads the same `ok` words, so every rank stores the same.
        let verdict = if declined && !failed {
            d.decline as u64
        } else {
            0
        };
        // SAFETY: `ll_flags` holds four words (host); only this thread writes word 2 during
        // this launch, and the launch behind it reads it after this kernel ends.
        unsafe { arch::st_relaxed_sys_u64(p.ll_flags.as_ptr().add(2), verdict) };
    }
    !(failed || declined)
}

/// Rank `q`'s input and output (0 where the mode needs none) as addressed here, from its
/// descriptor `theirs`, every word checked (module docs, step 2).
#[inline(always)]
fn peer_buffers(
    d: &DirectCollectiveParams,
    q: u32,
    theirs: &RegisteredCall,
) -> Result<(u64, u64), RegisteredRefusal> {
    if theirs.ok != 1 {
        return Err(RegisteredRefusal::NotOk);
    }
    if theirs.call != d.mine.call {
        return Err(RegisteredRefusal::OtherCall);
    }
    let one = |r: &BufferRef, need: u64| -> Result<u64, RegisteredRefusal> {
        if need == 0 {
            return Ok(0);
        }
        if r.slot as usize >= REGISTRY_SLOTS || r.generation == 0 {
            return Err(RegisteredRefusal::UnknownSlot);
        }
        let at = q as usize * REGISTRY_SLOTS + r.slot as usize;
        let slot = d.registry.as_ptr().wrapping_add(at) as *const u64;
        // SAFETY: the table holds `MAX_DIRECT_RANKS * REGISTRY_SLOTS` slots of four words;
        // `q < nranks <= MAX_DIRECT_RANKS` and `r.slot < REGISTRY_SLOTS` (checked).
        let (base, len, generation) = unsafe {
            (
                arch::ld_relaxed_sys_u64(slot),
                arch::ld_relaxed_sys_u64(slot.add(1)),
                arch::ld_relaxed_sys_u64(slot.add(2)) as u32,
            )
        };
        if base == 0 || generation != r.generation {
            return Err(RegisteredRefusal::UnknownSlot);
        }
        if r.offset > len || len - r.offset < need {
            return Err(RegisteredRefusal::Range);
        }
        let addr = base + r.offset;
        if !addr.is_multiple_of(16) {
            return Err(RegisteredRefusal::Range);
        }
        Ok(addr)
    };
    Ok((
        one(&theirs.input, d.need[0])?,
        one(&theirs.output, d.need[1])?,
    ))
}
