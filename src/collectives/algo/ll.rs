//! `ll`: one-shot LL16. Every rank writes its input (or each peer's part of it; a broadcast's
//! non-roots, and a reduce's root, an acknowledgement) as LL16 packets into every peer's slot
//! of the LL region and reduces or copies what arrives: one hop, no barrier. Serves every
//! collective up to `ll_max_bytes` per part. Kernels `mscclpp_device::collectives::ll`
//! (all-reduce, all-gather and reduce have kernels of their own, with fewer branches).

use mscclpp_host::Result;
use mscclpp_host::gpu::{Kernel, Stream};
use mscclpp_shared::{CollectiveMode, CollectiveParams};

use crate::collectives::algorithm::{Algorithm, Collective};
use crate::collectives::config::CollectiveConfig;
use crate::collectives::context::{Args, Context, SetUp, pick};
use crate::collectives::launch::ll::{TOO_LARGE, launch};
use crate::collectives::scratch::Region;
use crate::collectives::unit::{CollectiveAlgorithm, Queued, Step};
use crate::kernels;

pub(crate) struct Ll {
    all_reduce: Kernel<CollectiveParams>,
    all_gather: Kernel<CollectiveParams>,
    others: Kernel<CollectiveParams>,
    /// The twin of all three for every reduction but the inline ones (sums and pre-multiplied
    /// sums of f16, bf16, f32).
    any: Kernel<CollectiveParams>,
    /// The reduce to a root, every type and operator.
    reduce: Kernel<CollectiveParams>,
}

impl CollectiveAlgorithm for Ll {
    const ALGORITHM: Algorithm = Algorithm::LlOneShot;
    const NAME: &'static str = "ll";
    const ALIASES: &'static [&'static str] = &["ll-one-shot", "ll_one_shot"];
    const SERVES: &'static [Collective] = &[
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::AllToAll,
        Collective::Reduce,
    ];
    const NOT_SERVED: &'static str = "an LL variant of this collective";
    const SCRATCH: &'static [Region] = &[Region::Ll];
    const TOO_LARGE: &'static str = TOO_LARGE;

    fn max_bytes(cfg: &CollectiveConfig) -> Option<usize> {
        Some(cfg.ll_max_bytes)
    }

    fn set_up(s: &SetUp<'_>) -> Result<Self> {
        Ok(Self {
            all_reduce: s.kernel(kernels::LL_ALL_REDUCE)?,
            all_gather: s.kernel(kernels::LL_ALL_GATHER)?,
            others: s.kernel(kernels::LL_COLLECTIVE)?,
            any: s.kernel(kernels::LL_COLLECTIVE_ANY)?,
            reduce: s.kernel(kernels::LL_REDUCE)?,
        })
    }

    fn queue(&self, cx: &Context, args: &Args, _: &Step, stream: &Stream) -> Result<Queued> {
        let call = &args.call;
        let (dtype, bytes) = (call.dtype, call.bytes as u64);
        let (mode, op, stride, kernel) = match call.collective {
            Collective::AllReduce => (CollectiveMode::AllReduce, call.op, bytes, &self.all_reduce),
            Collective::AllGather => (
                CollectiveMode::AllGather,
                Context::MOVE.1,
                bytes,
                &self.all_gather,
            ),
            Collective::ReduceScatter => {
                (CollectiveMode::ReduceScatter, call.op, bytes, &self.others)
            }
            Collective::AllToAll => (
                CollectiveMode::AllToAll,
                Context::MOVE.1,
                bytes,
                &self.others,
            ),
            Collective::Broadcast => (CollectiveMode::Broadcast, Context::MOVE.1, 0, &self.others),
            Collective::Reduce => (CollectiveMode::Reduce, call.op, 0, &self.reduce),
            Collective::SendRecv => return Err(cx.cannot(Self::NOT_SERVED)),
        };
        let mut p = cx.params(mode, (dtype, op));
        (p.input, p.output, p.bytes, p.stride) = (args.input, args.output, bytes, stride);
        p.root = args.root();
        // The reduce's kernel serves every type and operator itself.
        let kernel = if call.collective == Collective::Reduce {
            kernel
        } else {
            pick(kernel, &self.any, &p)
        };
        launch(cx, kernel, p, stream)?;
        Ok(Queued::Ran)
    }
}
