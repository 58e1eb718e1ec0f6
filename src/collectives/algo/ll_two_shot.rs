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
//! `ll_max_bytes`), is planned as the one-shot LL all-reduce instead (`ll`), which serves
//! every size up to `ll_max_bytes`; every rank decides alike from the same sizes.

use mscclpp_host::Result;
use mscclpp_host::gpu::{Kernel, Stream};
use mscclpp_shared::{CollectiveMode, CollectiveParams};

use crate::collectives::algorithm::{Algorithm, Collective};
use crate::collectives::config::CollectiveConfig;
use crate::collectives::context::{Args, Context, Lowered, SetUp, pick};
use crate::collectives::launch::ll;
use crate::collectives::scratch::{Region, ScratchLayout};
use crate::collectives::unit::{CollectiveAlgorithm, Planned, Queued, Step};
use crate::kernels;

pub(crate) struct LlTwoShot {
    kernel: Kernel<CollectiveParams>,
    /// Its twin for every reduction but the inline ones (sums and pre-multiplied sums of f16,
    /// bf16, f32).
    any: Kernel<CollectiveParams>,
}

impl CollectiveAlgorithm for LlTwoShot {
    const ALGORITHM: Algorithm = Algorithm::LlTwoShot;
    const NAME: &'static str = "ll2";
    const ALIASES: &'static [&'static str] = &["ll-two-shot"];
    const SERVES: &'static [Collective] = &[Collective::AllReduce];
    const NOT_SERVED: &'static str = "an all-reduce algorithm for this collective";
    const SCRATCH: &'static [Region] = &[Region::Ll];
    const TOO_LARGE: &'static str = ll::TOO_LARGE;

    fn max_bytes(cfg: &CollectiveConfig) -> Option<usize> {
        Some(cfg.ll_max_bytes)
    }

    fn plan(
        _: &CollectiveConfig,
        layout: &ScratchLayout,
        call: &Lowered,
    ) -> Result<Step, &'static str> {
        Ok(
            match part(call.ranks, call.bytes as u64, layout.ll_slot_bytes()) {
                Some(part) => Step {
                    algorithm: Algorithm::LlTwoShot,
                    planned: Planned::Parts(part),
                    forced: false,
                },
                None => Step::itself(Algorithm::LlOneShot),
            },
        )
    }

    fn set_up(s: &SetUp<'_>) -> Result<Self> {
        Ok(Self {
            kernel: s.kernel(kernels::LL_TWO_SHOT_ALL_REDUCE)?,
            any: s.kernel(kernels::LL_TWO_SHOT_ALL_REDUCE_ANY)?,
        })
    }

    fn queue(&self, cx: &Context, args: &Args, step: &Step, stream: &Stream) -> Result<Queued> {
        let call = &args.call;
        let Planned::Parts(part) = step.planned else {
            return Err(cx.cannot("the two-shot LL all-reduce without its parts"));
        };
        let mut p = cx.params(CollectiveMode::AllReduce, (call.dtype, call.op));
        (p.input, p.output, p.bytes) = (args.input, args.output, call.bytes as u64);
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
