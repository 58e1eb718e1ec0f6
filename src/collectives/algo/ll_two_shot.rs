//! `ll2`: the all-reduce as an LL16 reduce-scatter and all-gather in one launch. Rank `r`
//! owns part `r` (`stride` bytes of whole packets); every rank sends each peer that peer's
//! part as packets, the owner reduces what arrives and sends the reduced part back as packets
//! into the second half of every peer's slot. A one-shot kernel sends `n - 1` copies of the
//! data (LL128: 1.07 bytes a byte, LL16: 2); this sends `2 (n - 1) / n` parts (4 (n - 1) / n
//! bytes as packets) for one more hop, which is less from 4 ranks on. Kernel
//! `mscclpp_device::collectives::ll_two_shot`.
//!
//! A call too small for every rank to own a non-empty part (fewer than about `8 n (n - 1)`
//! bytes), or whose two parts of packets do not fit an LL slot (two ranks near
//! `ll_max_bytes`), runs the one-shot LL all-reduce instead, which serves every size up to
//! `ll_max_bytes`; every rank decides alike from the same sizes.

use mscclpp_host::Result;
use mscclpp_host::gpu::{Kernel, Stream};
use mscclpp_shared::{CollectiveMode, CollectiveParams};

use super::{Algorithm, Collective, CollectiveAlgorithm, Queued, ll};
use crate::collectives::CollectiveConfig;
use crate::collectives::context::{Args, Context, SetUp, pick};
use crate::collectives::scratch::{Region, ScratchLayout};
use crate::collectives::select::Call;
use crate::kernels;

pub(crate) struct LlTwoShot {
    kernel: Kernel<CollectiveParams>,
    /// The one-shot LL all-reduce, for calls too small to split.
    one_shot: Kernel<CollectiveParams>,
    /// The twins of both for every reduction but the common sums.
    any: Kernel<CollectiveParams>,
    one_shot_any: Kernel<CollectiveParams>,
}

impl CollectiveAlgorithm for LlTwoShot {
    const ALGORITHM: Algorithm = Algorithm::LlTwoShot;
    const NAME: &'static str = "ll2";
    const ALIASES: &'static [&'static str] = &["ll-two-shot"];
    const SERVES: &'static [Collective] = &[Collective::AllReduce];
    const NOT_SERVED: &'static str = "an all-reduce algorithm for this collective";
    const SCRATCH: &'static [Region] = &[Region::Ll];

    fn plan(
        cfg: &CollectiveConfig,
        layout: &ScratchLayout,
        call: &Call,
    ) -> Result<Algorithm, &'static str> {
        if call.bytes > cfg.ll_max_bytes {
            return Err(ll::TOO_LARGE);
        }
        Ok(
            match part(call.ranks, call.bytes as u64, layout.ll_slot_bytes()) {
                Some(_) => Algorithm::LlTwoShot,
                None => Algorithm::LlOneShot,
            },
        )
    }

    fn set_up(s: &SetUp<'_>) -> Result<Self> {
        Ok(Self {
            kernel: s.kernel(kernels::LL_TWO_SHOT_ALL_REDUCE)?,
            one_shot: s.kernel(kernels::LL_ALL_REDUCE)?,
            any: s.kernel(kernels::LL_TWO_SHOT_ALL_REDUCE_ANY)?,
            one_shot_any: s.kernel(kernels::LL_COLLECTIVE_ANY)?,
        })
    }

    fn queue(&self, cx: &Context, args: &Args, stream: &Stream) -> Result<Queued> {
        let call = &args.call;
        Self::plan(&cx.cfg, &cx.layout, call).map_err(|w| cx.cannot(w))?;
        let mut p = cx.params(CollectiveMode::AllReduce, (call.dtype, call.op));
        (p.input, p.output, p.bytes) = (args.input, args.output, call.bytes as u64);
        // What `plan` said: one-shot unless the call splits into parts.
        let Some(part) = part(call.ranks, p.bytes, cx.layout.ll_slot_bytes()) else {
            ll::launch(cx, pick(&self.one_shot, &self.one_shot_any, &p), p, stream)?;
            return Ok(Queued::Ran);
        };
        cx.ensure_healthy()?;
        cx.record(Algorithm::LlTwoShot);
        p.stride = part;
        let shape = ll::shape(&cx.cfg, part / 8);
        // SAFETY: the caller's contract (buffers of `bytes`), and our scratch, whose LL slots
        // hold `ll_slot_bytes >= 4 * part`: two parts of packets.
        unsafe { stream.launch(pick(&self.kernel, &self.any, &p), shape, p) }?;
        Ok(Queued::Ran)
    }
}

/// Each rank's part (bytes, whole packets) of `bytes` on `n` ranks, or `None` when the call
/// is too small for every rank to own a non-empty part or two parts of packets do not fit an
/// LL slot of `ll_slot_bytes` (module docs).
fn part(n: usize, bytes: u64, ll_slot_bytes: u64) -> Option<u64> {
    let n = n as u64;
    let part = bytes.div_ceil(n).next_multiple_of(8);
    if (n - 1) * part >= bytes || 4 * part > ll_slot_bytes {
        None
    } else {
        Some(part)
    }
}
