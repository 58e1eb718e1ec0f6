//! The copy-engine all-reduce: a reduce-scatter and an all-gather moved by the copy engines,
//! cut into pieces so that the copies of one piece overlap the reduction of the previous one.
//!
//! Rank `r` of `n` owns chunk `r` of the buffer (`up16(bytes / n)` bytes; the last ones may be
//! shorter or empty), cut into `pieces` pieces. Three streams take part:
//!
//! - **scatter** (a side stream): piece `k` of chunk `q` of this rank's input into slot
//!   `k % SLOTS` of this rank's area in rank `q`'s CE scratch (`cuMemcpyAsync` into the
//!   peer's mapping), for every peer `q`; then a barrier on channel row [`ROW_SCATTER`]: every
//!   peer's piece `k` has landed here (each peer signals after its own copies, in stream
//!   order). Before it reuses a slot (piece `k >= SLOTS`), it waits for the caller's stream to
//!   have passed the slot-free barrier of piece `k - SLOTS`.
//! - **the caller's stream**: after the scatter barrier of piece `k`, the direct kernel's
//!   `ReduceLocal` reduces this rank's own piece with the peers' copies in its scratch into its
//!   output; then, if a later piece reuses the slots, a barrier on row [`ROW_REDUCE`]: every
//!   peer has finished reading its slots of piece `k`.
//! - **gather** (a second side stream): after the reduction of piece `k`, the reduced piece
//!   into every peer's output; after the last piece, a barrier on row [`ROW_GATHER`]: every
//!   peer's pieces have landed in this rank's output. The caller's stream joins it, so the
//!   output is final when the queued call completes.
//!
//! Each barrier is a block meeting (signal + wait) on its own row of the communicator's
//! channels, so the three streams' meetings never consume each other's signals; every rank
//! queues the same meetings in the same order.
//!
//! Who touches what: chunk `r` of a peer's buffer is written only by rank `r` (gather), after
//! that peer's scatter of the same piece has read it (the scatter barrier comes first), so in
//! place is safe. A rank's CE scratch is written only by the peers' scatters and read only by
//! its own reductions; the next call's scatter starts only after the previous call's gather
//! barrier, which every peer passes only after its last reduction.

use std::sync::Mutex;

use mscclpp_host::Result;
use mscclpp_host::gpu::{DeviceBuffer, Event, Gpu, LazyStream, Stream};
use mscclpp_shared::{CollectiveMode, DataType, DevicePtr, DirectCollectiveParams};

use crate::collectives::algorithm::Algorithm;
use crate::collectives::context::{Context, Twin, copy_if_needed};
use crate::collectives::launch::direct;
use crate::collectives::reduction::KernelOp;
use crate::collectives::registered::Table;
use crate::collectives::scratch::up16;
use crate::collectives::unit::Planned;

/// Slots per peer in the CE scratch (a piece is copied while the previous one is reduced).
pub const SLOTS: usize = 2;
/// Channel row of the scatter stream's barriers.
pub const ROW_SCATTER: u32 = 0;
/// Channel row of the caller's stream's (slot-free) barriers.
pub const ROW_REDUCE: u32 = 1;
/// Channel row of the gather stream's barrier.
pub const ROW_GATHER: u32 = 2;
/// Channel rows the pipeline needs (`max_blocks` is at least this).
pub const ROWS: u32 = 3;

/// The streams, events and scratch of one `Collectives`' copy-engine all-reduce.
pub struct Pipeline {
    /// Made at the first call, as the gather stream (`LazyStream`).
    scatter: LazyStream,
    gather: LazyStream,
    fork: Event,
    data_ready: Event,
    reduced: Event,
    slot_free: [Event; SLOTS],
    gathered: Event,
    /// Allocated by the first call (`ce_scratch_bytes`), kept for the `Collectives`' life (a
    /// captured graph keeps using it; the peers map it through the direct-buffer exchange).
    scratch: Mutex<Option<DeviceBuffer>>,
}

impl Pipeline {
    pub fn new(g: &Gpu) -> Result<Self> {
        Ok(Self {
            scatter: LazyStream::new(g),
            gather: LazyStream::new(g),
            fork: g.event()?,
            data_ready: g.event()?,
            reduced: g.event()?,
            slot_free: [g.event()?, g.event()?],
            gathered: g.event()?,
            scratch: Mutex::new(None),
        })
    }

    /// The scratch (`bytes` long), allocated on first use; `None` if the allocation fails
    /// (then this rank tells its peers it cannot go direct, and every rank stages).
    pub fn scratch(&self, g: &Gpu, bytes: usize) -> Option<(DevicePtr<u8>, usize)> {
        let mut s = mscclpp_host::sync::lock(&self.scratch);
        if s.is_none() {
            match g.alloc(bytes) {
                Ok(b) => *s = Some(b),
                Err(e) => {
                    tracing::warn!(error = %e, bytes, "no copy-engine all-reduce scratch");
                    return None;
                }
            }
        }
        s.as_ref().map(|b| (b.ptr(), b.len()))
    }
}

/// How a call of `bytes` on `n` ranks is cut: `(chunk, piece, pieces, slot)` bytes / counts.
/// `slot` is the size of one scratch slot (every piece fits one).
pub fn plan(
    bytes: usize,
    n: usize,
    scratch: usize,
    min_pieces: usize,
) -> (usize, usize, usize, usize) {
    let chunk = up16(bytes.div_ceil(n));
    let slot = (scratch / ((n - 1).max(1) * SLOTS)) & !15;
    let pieces = chunk.div_ceil(slot.max(16)).max(min_pieces).max(1);
    let piece = up16(chunk.div_ceil(pieces));
    (chunk, piece, pieces, slot)
}

/// The pipelined copy-engine all-reduce (module docs) of `bytes` on registered buffers, cut as
/// its plan says (`cut`: [`Planned::Pieces`], from [`plan`]): `t[0]` every rank's input,
/// `t[1]` its output, `t[2]` its CE scratch, as addressed here. `kernel` is the direct kernel
/// (barriers and local reductions).
pub fn run(
    cx: &Context,
    kernel: &Twin<DirectCollectiveParams>,
    ce: &Pipeline,
    stream: &Stream,
    t: &Table,
    cut: &Planned,
    (bytes, data): (usize, (DataType, KernelOp)),
) -> Result<()> {
    let (n, me) = (cx.ranks(), cx.rank());
    let peers = cx.others();
    let Planned::Pieces {
        chunk,
        piece,
        pieces,
        slot,
    } = *cut
    else {
        return Err(cx.cannot("a copy-engine all-reduce without its pieces"));
    };
    // Piece `k` of chunk `c`: (offset in the buffer, length).
    let span = |c: usize, k: usize| {
        let len = bytes.saturating_sub(c * chunk).min(chunk);
        let s = (k * piece).min(len);
        (c * chunk + s, ((k + 1) * piece).min(len) - s)
    };
    // Where rank `from`'s piece `k` lands in rank `to`'s scratch.
    let slot_at = |to: usize, from: usize, k: usize| {
        let i = if from < to { from } else { from - 1 };
        ((i * SLOTS + k % SLOTS) * slot) as u64
    };
    let (input, output) = (t[0][me], t[1][me]);
    cx.ensure_healthy()?;
    // Ranks sharing a GPU run the pipeline on the call's stream alone (`Context::shared_gpu`):
    // a side stream's wait for `reduced` could hold the work queue a peer's scatter sits in
    // (seen on an H200: two ranks' barriers spinning, two never started).
    let (scatter, gather) = if cx.shared_gpu {
        (stream, stream)
    } else {
        (ce.scatter.get()?, ce.gather.get()?)
    };
    stream.record(&ce.fork)?;
    scatter.wait_event(&ce.fork)?;
    gather.wait_event(&ce.fork)?;
    for k in 0..pieces {
        if k >= SLOTS {
            scatter.wait_event(&ce.slot_free[k % SLOTS])?;
        }
        for &q in &peers {
            let (at, len) = span(q, k);
            let dst = t[2][q].byte_add_cast(slot_at(q, me, k));
            // SAFETY: piece `k` of chunk `q` of this rank's input (its registered
            // `bytes`) into a slot of rank `q`'s scratch, which holds `slot >= len`.
            unsafe { copy_if_needed(scatter, dst, input.byte_add_cast(at as u64), len)? };
        }
        direct::barrier(cx, kernel, scatter, &peers, ROW_SCATTER)?;
        scatter.record(&ce.data_ready)?;

        stream.wait_event(&ce.data_ready)?;
        let (at, len) = span(me, k);
        if len > 0 {
            let mut d = cx.direct_params(CollectiveMode::ReduceLocal, data, len);
            for q in 0..n {
                d.inputs[q] = if q == me {
                    input.byte_add_cast(at as u64)
                } else {
                    t[2][me].byte_add_cast(slot_at(me, q, k))
                };
            }
            d.outputs[me] = output.byte_add_cast(at as u64);
            (d.common.input, d.common.output) = (d.inputs[me], d.outputs[me]);
            direct::launch(cx, kernel, d, len, stream)?;
        }
        stream.record(&ce.reduced)?;
        if k + SLOTS < pieces {
            direct::barrier(cx, kernel, stream, &peers, ROW_REDUCE)?;
            stream.record(&ce.slot_free[k % SLOTS])?;
        }

        gather.wait_event(&ce.reduced)?;
        let src = output.byte_add_cast(at as u64);
        for &q in &peers {
            // SAFETY: the reduced piece into the same place of rank `q`'s registered
            // output (its `bytes`); only this rank writes chunk `me` there.
            unsafe { copy_if_needed(gather, t[1][q].byte_add_cast(at as u64), src, len)? };
        }
    }
    direct::barrier(cx, kernel, gather, &peers, ROW_GATHER)?;
    gather.record(&ce.gathered)?;
    stream.wait_event(&ce.gathered)?;
    cx.record(Algorithm::CopyEngine);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{SLOTS, plan};

    #[test]
    fn every_piece_fits_a_slot_and_the_pieces_cover_the_chunk() {
        for (bytes, n, scratch, min) in [
            (1 << 30, 2, 256 << 20, 2),
            (64 << 20, 2, 256 << 20, 2),
            (4160, 8, 8 << 10, 2),
            (98_368, 2, 8 << 10, 1),
            (16, 3, 1 << 10, 2),
        ] {
            let (chunk, piece, pieces, slot) = plan(bytes, n, scratch, min);
            assert!(piece <= slot, "{bytes} {n}: piece {piece} > slot {slot}");
            assert!(
                piece * pieces >= chunk,
                "{bytes} {n}: pieces short of the chunk"
            );
            assert!(pieces >= min);
            assert!((n - 1) * SLOTS * slot <= scratch);
            assert_eq!(piece % 16, 0);
        }
        // 1 GiB on two ranks with 256 MiB of scratch: four pieces of 128 MiB.
        assert_eq!(
            plan(1 << 30, 2, 256 << 20, 2),
            (512 << 20, 128 << 20, 4, 128 << 20)
        );
    }
}
