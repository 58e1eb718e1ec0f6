//! The two-shot LL all-reduce: a reduce-scatter and an all-gather, both by LL16 packets, in
//! one launch. Each rank owns one part of the data (`stride` bytes, a whole number of packets;
//! the last part is shorter): it sends part `q` of its input to rank `q`, reduces what arrives
//! for its own part, and sends the reduced part to every peer. Per byte of input a rank sends
//! `2 (n - 1) / n` bytes of data (twice that as packets), against `n - 1` for the one-shot
//! kernels, for one more hop of latency: it is for medium messages on more than a few ranks.
//!
//! Who writes and reads what: the LL region of the one-shot kernels (same halves, same flags,
//! see `ll.rs`), each slot split in two. Slot `r` of rank `q`'s region holds, from its start,
//! the packets of part `q` of rank `r`'s input (step 1, written only by rank `r`), and from
//! packet `stride / 8` on, rank `r`'s reduced part `r` (step 2, written only by rank `r`); both
//! are read only by rank `q`. The host sizes `stride` so that both fit a slot.
//!
//! Every working thread handles the same packet index `i` of every part in all three steps, so
//! that a packet it waits for was sent by the thread of the same index on the peer (as in the
//! one-shot kernels): no thread ever waits for a block that may not be resident yet. The host
//! launches it only when every part is non-empty, so that every rank hears from every peer in
//! every call (what keeps a peer from running more than one LL call ahead of a slot's reader).

use super::ll::{LlLaunch, ll_half, ll_kernel, ll_receive, ll_send, reduce_arrivals};
use crate::packet;
use crate::reduce::Reduce;
use crate::trace;
use mscclpp_shared::{CollectiveParams, LL16Packet, TraceEventKind};

/// The two-shot all-reduce's body; returns false if a packet wait gave up.
#[inline(always)]
fn ll_two_shot(p: &CollectiveParams, l: LlLaunch, r: impl Reduce) -> bool {
    let (flag, me, n) = (l.flag, p.rank, p.nranks);
    let half = ll_half(p, flag);
    let part = p.stride;
    // Step 2's packets follow step 1's in every slot.
    let second = part / 8;
    let len_of = |q: u32| p.bytes.saturating_sub(q as u64 * part).min(part);
    let input = p.input.as_ptr() as *const u8;
    let output = p.output.as_ptr();
    let mine = len_of(me);
    let mut i = l.tid;
    while i < second {
        let off = i * 8;
        // 1. Packet `i` of part `q` of my input to rank `q`.
        for q in 0..n {
            let len = len_of(q);
            if q == me || off >= len {
                continue;
            }
            // SAFETY: `off < len`: inside part `q` of `input` (`bytes` long).
            let w = unsafe {
                let at = input.add((q as u64 * part + off) as usize);
                packet::read_payload::<LL16Packet>(at, (len - off) as usize)
            };
            ll_send(p, flag, half, q, i, w);
        }
        // 2. Packet `i` of my part: reduced, written, and sent to every peer.
        if off < mine {
            let at = (me as u64 * part + off) as usize;
            let left = (mine - off) as usize;
            // SAFETY: `off < mine`: inside my part of `input` and `output`.
            let own = unsafe { packet::read_payload::<LL16Packet>(input.add(at), left) };
            let Ok(acc) = reduce_arrivals(p, flag, half, i, own, r) else {
                return false;
            };
            // SAFETY: as above.
            unsafe { packet::write_payload::<LL16Packet>(output.add(at), acc, left) };
            for q in 0..n {
                if q != me {
                    ll_send(p, flag, half, q, second + i, acc);
                }
            }
        }
        // 3. Packet `i` of every peer's reduced part into my output.
        for q in 0..n {
            let len = len_of(q);
            if q == me || off >= len {
                continue;
            }
            let Ok(w) = ll_receive(p, flag, half, q, second + i) else {
                return false;
            };
            // SAFETY: `off < len`: inside part `q` of `output`.
            unsafe {
                let at = output.add((q as u64 * part + off) as usize);
                packet::write_payload::<LL16Packet>(at, w, (len - off) as usize);
            }
        }
        i += l.nthreads;
    }
    true
}

crate::kernel! {
    /// The two-shot LL all-reduce of the sums and pre-multiplied sums (f16, bf16, f32; other reductions:
    /// [`ll_two_shot_all_reduce_any_kernel`]; `mode` is ignored; `stride` is the part each
    /// rank reduces, a multiple of 8 bytes, with every part non-empty and two parts of packets
    /// fitting a slot): see the module docs. The flag and the keeper block as in the one-shot
    /// [`ll_collective_kernel`](super::ll_collective_kernel); loops without type dispatch, as
    /// in [`ll_all_reduce_kernel`](super::ll_all_reduce_kernel).
    fn ll_two_shot_all_reduce_kernel(p: CollectiveParams) {
        trace::event(&p.trace, TraceEventKind::Start);
        two_shot_entry::<false>(p);
    }
}

crate::kernel! {
    /// [`ll_two_shot_all_reduce_kernel`] for every type and operator.
    fn ll_two_shot_all_reduce_any_kernel(p: CollectiveParams) {
        trace::event(&p.trace, TraceEventKind::Start);
        two_shot_entry::<true>(p);
    }
}

/// The two-shot kernels' body (`ANY`: which kind, see `with_reducer!`).
#[inline(always)]
fn two_shot_entry<const ANY: bool>(p: CollectiveParams) {
    // What the host guarantees, checked so that a bad launch reads and writes nothing:
    // whole packets per part, every part non-empty.
    let parts_ok = p.stride > 0
        && p.stride.is_multiple_of(8)
        && p.nranks > 0
        && p.rank < p.nranks
        && (p.nranks as u64 - 1) * p.stride < p.bytes
        && p.bytes <= p.nranks as u64 * p.stride;
    if !parts_ok {
        return;
    }
    ll_kernel::<ANY>(&p, true, |l, r| {
        with_reducer!(ANY, r, |r| ll_two_shot(&p, l, r), false)
    });
}
