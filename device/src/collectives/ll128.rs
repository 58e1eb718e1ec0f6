//! The LL128 collectives: every rank writes its input (all-reduce, all-gather) or the part of
//! it meant for each peer (reduce-scatter) as LL128 lines (`crate::ll128`) into a slot of every
//! peer's LL128 region, and reduces the lines that arrive in its own slots with its input (or
//! its own part of it), or copies them to the peers' parts of its output (all-gather). One hop
//! and no barrier, like the LL16 kernels, but 120 of every 128 bytes on the links are data
//! (LL16: 8 of 16), which is what medium messages (tens of KiB to a few MiB) are bound by.
//!
//! Who writes and reads what: the LL128 region (`ll128_offset` in every scratch buffer) is two
//! halves of `nranks` slots of `ll128_slot_bytes`, the half chosen by the flag's parity as in
//! the LL16 region. Slot `r` of rank `q`'s half is written only by rank `r` (warp `w` writes
//! the lines of the steps `w`, `w + nwarps`, …) and read only by rank `q` (the same steps by
//! its warp `w`). The flag comes from `ll_flags`, shared with the LL16 kernels: every LL launch
//! of either kind exchanges data with every peer, so a peer is never more than one LL call
//! ahead and two halves suffice (see the parent module). The two kinds never share a region,
//! so a stale line is never read as a packet or the other way round.
//!
//! Launch: a multiple of 32 threads a block; every lane of a warp runs the same steps.

use super::channel;
use super::ll::{LlLaunch, ll_kernel};
use crate::arch;
use crate::ll128::{read_line_part, store_line_part};
use crate::reduce::{CommonSum, Reduce};
use crate::trace;
use mscclpp_shared::packet::ll128;
use mscclpp_shared::{CollectiveMode, CollectiveParams, TraceEventKind};

/// What an LL128 launch computes (the all-reduce has a kernel of its own; the others come from
/// `CollectiveParams::mode`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ll128Mode {
    /// Everyone's `bytes` reduced into every output.
    AllReduce,
    /// Everyone's `bytes` to part `rank` of every output (parts `stride` apart).
    AllGather,
    /// Part `rank` (of `stride`-spaced parts) of everyone's input reduced into my output.
    ReduceScatter,
}

/// `len` (at most `width`, 8 or 16) bytes at `src` as little-endian u32 words, zero beyond.
///
/// # Safety
/// `src` is valid for `len` bytes.
#[inline(always)]
unsafe fn read_part(src: *const u8, len: usize, width: usize) -> [u32; 4] {
    let mut w = [0u32; 4];
    if len == width && src.addr().is_multiple_of(width) {
        if width == 16 {
            // SAFETY: 16 readable, 16-byte aligned bytes.
            return unsafe { arch::ld_v4_u32(src as *const u32) };
        }
        // SAFETY: 8 readable, 8-byte aligned bytes.
        let d = unsafe { (src as *const u64).read() };
        return [d as u32, (d >> 32) as u32, 0, 0];
    }
    let mut i = 0;
    while i < len {
        // SAFETY: `i < len`.
        w[i / 4] |= (unsafe { src.add(i).read() } as u32) << (8 * (i % 4));
        i += 1;
    }
    w
}

/// Writes the first `len` (at most `width`) bytes of `w` to `dst`.
///
/// # Safety
/// `dst` is valid for `len` bytes.
#[inline(always)]
unsafe fn write_part(dst: *mut u8, w: [u32; 4], len: usize, width: usize) {
    if len == width && dst.addr().is_multiple_of(width) {
        if width == 16 {
            // SAFETY: 16 writable, 16-byte aligned bytes.
            unsafe { arch::st_v4_u32(dst as *mut u32, w) };
        } else {
            // SAFETY: 8 writable, 8-byte aligned bytes.
            unsafe { (dst as *mut u64).write(w[0] as u64 | ((w[1] as u64) << 32)) };
        }
        return;
    }
    let mut i = 0;
    while i < len {
        // SAFETY: `i < len`.
        unsafe { dst.add(i).write((w[i / 4] >> (8 * (i % 4))) as u8) };
        i += 1;
    }
}

/// The LL128 body for `mode`; false if a line wait gave up. Callers pass a constant `mode`,
/// and a constant reducer for the inline reductions, so that their loops carry no dispatch.
#[inline(always)]
fn ll128_collective(p: &CollectiveParams, l: LlLaunch, mode: Ll128Mode, r: impl Reduce) -> bool {
    let flag = l.flag;
    let lane = (arch::thread_idx_x() % ll128::WARP_LANES as u32) as usize;
    let warp = l.tid / ll128::WARP_LANES as u64;
    let nwarps = l.nthreads / ll128::WARP_LANES as u64;
    let steps = p.bytes.div_ceil(ll128::WARP_DATA_BYTES as u64);
    let (off, width) = ll128::lane_data(lane);
    // This lane's 16 bytes of step `step`'s lines in slot `slot` of this call's half, from the
    // start of a scratch buffer.
    let half_slots = (flag & 1) as u64 * p.nranks as u64;
    let at = |slot: u32, step: u64| {
        p.ll128_offset
            + (half_slots + slot as u64) * p.ll128_slot_bytes
            + step * ll128::WARP_LINE_BYTES as u64
            + (lane * 16) as u64
    };
    let (input, output) = (p.input.as_ptr() as *const u8, p.output.as_ptr());
    // Where the bytes for rank `q` start: part `q` of the input for a reduce-scatter.
    let source = |q: u32| match mode {
        // SAFETY: the host sized `input` as `nranks` parts `stride` apart.
        Ll128Mode::ReduceScatter => unsafe { input.add((q as u64 * p.stride) as usize) },
        Ll128Mode::AllReduce | Ll128Mode::AllGather => input,
    };
    // The bytes of step `g` this lane carries: offset and length (0 past the end).
    let piece = |g: u64| {
        let start = g * ll128::WARP_DATA_BYTES as u64 + off as u64;
        (
            start as usize,
            p.bytes.saturating_sub(start).min(width as u64) as usize,
        )
    };
    // 1. My input (or its part for each peer), step by step, into slot `rank` of every peer.
    //    A lane reads the same bytes here as it writes in step 2, so in-place calls read before
    //    they write.
    let mut g = warp;
    while g < steps {
        let (start, len) = piece(g);
        let whole = if mode == Ll128Mode::ReduceScatter {
            [0; 4]
        } else {
            // SAFETY: `start + len <= bytes`, inside `input`.
            unsafe { read_part(input.add(start), len, width) }
        };
        for q in 0..p.nranks {
            if q != p.rank {
                let v = if mode == Ll128Mode::ReduceScatter {
                    // SAFETY: `start + len <= bytes`, inside part `q` of `input`.
                    unsafe { read_part(source(q).add(start), len, width) }
                } else {
                    whole
                };
                let dst = channel(p, 0, q).dst.as_ptr();
                // SAFETY: slot `rank` of peer `q`'s LL128 region (mapped here) holds
                // `ll128_slot_bytes >= steps * WARP_LINE_BYTES`; the part is 16-byte aligned.
                unsafe {
                    store_line_part(dst.add(at(p.rank, g) as usize) as *mut u32, v, lane, flag)
                };
            }
        }
        g += nwarps;
    }
    // 2. What arrives, reduced with my input (or my part of it) into my output, or copied to
    //    the sender's part of it.
    let units = width / 8;
    let mut g = warp;
    while g < steps {
        let (start, len) = piece(g);
        // SAFETY: as above (part `rank` of `input` for a reduce-scatter).
        let mut acc = unsafe { read_part(source(p.rank).add(start), len, width) };
        if mode != Ll128Mode::AllGather {
            acc = r.pre_v4(acc);
        }
        if mode == Ll128Mode::AllGather {
            // SAFETY: part `rank` of `output` holds `bytes` at `stride * rank`.
            unsafe {
                let mine = output.add((p.rank as u64 * p.stride) as usize + start);
                write_part(mine, acc, len, width);
            }
        }
        for q in 0..p.nranks {
            if q == p.rank {
                continue;
            }
            // SAFETY: slot `q` of my LL128 region, written by peer `q`.
            let src = unsafe { p.scratch.as_ptr().add(at(q, g) as usize) } as *const u32;
            // SAFETY: as above.
            let Ok(w) = (unsafe { read_line_part(src, lane, flag, p.status) }) else {
                return false;
            };
            if mode == Ll128Mode::AllGather {
                // SAFETY: part `q` of `output` holds `bytes` at `stride * q`.
                unsafe {
                    let theirs = output.add((q as u64 * p.stride) as usize + start);
                    write_part(theirs, w, len, width);
                }
                continue;
            }
            // (Both units of the vector, so that `acc` stays in registers; a flag lane's part
            // is one unit, and its second is never written.)
            let folded = r.fold_v4(acc, w);
            acc = if units == 2 {
                folded
            } else {
                [folded[0], folded[1], acc[2], acc[3]]
            };
        }
        if mode != Ll128Mode::AllGather {
            // SAFETY: `start + len <= bytes`, inside `output`.
            unsafe { write_part(output.add(start), r.post_v4(acc), len, width) };
        }
        g += nwarps;
    }
    true
}

crate::kernel! {
    /// The LL128 all-reduce of the sums and pre-multiplied sums (f16, bf16, f32; other reductions:
    /// [`ll128_collective_any_kernel`]; `mode` is ignored; launch with a multiple of 32
    /// threads a block): every warp sends its steps of 480 bytes as 4 lines to every peer, then
    /// reduces the peers' lines of the same steps into the output, with no type dispatch in
    /// its loops. The flag comes from `ll_flags`, advanced as by the LL16 kernels.
    fn ll128_all_reduce_kernel(p: CollectiveParams) {
        let ar = Ll128Mode::AllReduce;
        trace::event(&p.trace, TraceEventKind::Start);
        ll_kernel::<false>(&p, true, |l, r| {
            with_reducer!(false, r, |r| ll128_collective(&p, l, ar, r), false)
        });
    }
}

crate::kernel! {
    /// The LL128 all-gather and the reduce-scatter of the sums and pre-multiplied sums (`mode`; parts `stride`
    /// apart, `bytes` each; launch as [`ll128_all_reduce_kernel`]), in a kernel of their own so
    /// that the all-reduce carries no mode branches.
    fn ll128_collective_kernel(p: CollectiveParams) {
        let mode = match p.mode {
            m if m == CollectiveMode::AllGather as u32 => Ll128Mode::AllGather,
            m if m == CollectiveMode::ReduceScatter as u32 => Ll128Mode::ReduceScatter,
            _ => return,
        };
        let reduces = mode == Ll128Mode::ReduceScatter;
        trace::event(&p.trace, TraceEventKind::Start);
        ll_kernel::<false>(&p, reduces, |l, r| {
            if reduces {
                let rs = Ll128Mode::ReduceScatter;
                with_reducer!(false, r, |r| ll128_collective(&p, l, rs, r), false)
            } else {
                // Copies only: no type or operator.
                ll128_collective(&p, l, Ll128Mode::AllGather, CommonSum::COPY)
            }
        });
    }
}

crate::kernel! {
    /// The LL128 all-reduce and reduce-scatter (`mode`) of every type and operator (the
    /// reductions not inline in the main kernels: see `with_reducer!`); launch as
    /// [`ll128_all_reduce_kernel`].
    fn ll128_collective_any_kernel(p: CollectiveParams) {
        let mode = match p.mode {
            m if m == CollectiveMode::AllReduce as u32 => Ll128Mode::AllReduce,
            m if m == CollectiveMode::ReduceScatter as u32 => Ll128Mode::ReduceScatter,
            _ => return,
        };
        trace::event(&p.trace, TraceEventKind::Start);
        ll_kernel::<true>(&p, true, |l, r| ll128_collective(&p, l, mode, r));
    }
}
