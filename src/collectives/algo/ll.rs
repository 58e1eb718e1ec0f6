//! `ll`: one-shot LL16. Every rank writes its input (or each peer's part of it; a broadcast's
//! non-roots, and a reduce's root, an acknowledgement) as LL16 packets into every peer's slot
//! of the LL region and reduces or copies what arrives: one hop, no barrier. Serves every
//! collective up to `ll_max_bytes` per part. Kernels `mscclpp_device::collectives::ll`
//! (all-reduce, all-gather and reduce have kernels of their own, with fewer branches).

use mscclpp_host::Result;
use mscclpp_host::gpu::{Kernel, LaunchConfig, Stream};
use mscclpp_shared::{CollectiveMode, CollectiveParams};

use super::{Algorithm, Collective, CollectiveAlgorithm, Queued};
use crate::collectives::CollectiveConfig;
use crate::collectives::context::{Args, Context, SetUp, pick};
use crate::collectives::scratch::{Region, ScratchLayout};
use crate::collectives::select::Call;
use crate::kernels;

pub(crate) struct Ll {
    all_reduce: Kernel<CollectiveParams>,
    all_gather: Kernel<CollectiveParams>,
    others: Kernel<CollectiveParams>,
    /// The twin of all three for every reduction but the common sums.
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

    fn plan(
        cfg: &CollectiveConfig,
        _: &ScratchLayout,
        call: &Call,
    ) -> Result<Algorithm, &'static str> {
        if call.bytes > cfg.ll_max_bytes {
            Err(TOO_LARGE)
        } else {
            Ok(Algorithm::LlOneShot)
        }
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

    fn queue(&self, cx: &Context, args: &Args, stream: &Stream) -> Result<Queued> {
        let call = &args.call;
        Self::plan(&cx.cfg, &cx.layout, call).map_err(|w| cx.cannot(w))?;
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

/// What an LL call above `ll_max_bytes` per part is refused as.
pub(super) const TOO_LARGE: &str = "an LL call above ll_max_bytes per part";

/// Queues `kernel` (an LL16 kernel) for `p`, whose `bytes` per part fit an LL slot.
pub(super) fn launch(
    cx: &Context,
    kernel: &Kernel<CollectiveParams>,
    p: CollectiveParams,
    stream: &Stream,
) -> Result<()> {
    cx.ensure_healthy()?;
    cx.record(Algorithm::LlOneShot);
    let shape = shape(&cx.cfg, p.bytes.div_ceil(8));
    // SAFETY: the caller's contract (buffers sized for the mode), and our scratch, whose LL
    // slots hold `ll_max_bytes` per part (the callers' plans check it).
    unsafe { stream.launch(kernel, shape, p) }
}

/// The launch shape of an LL kernel whose threads handle `packets` packet indices (each
/// for every peer): up to `ll_single_block_packets`, one block, one thread a packet (a
/// single block stores the next flag without the grid's block count: 0.3 µs less at 4 KiB
/// on 2×H200); beyond, blocks of `ll_threads` and the keeper block.
pub(crate) fn shape(cfg: &CollectiveConfig, packets: u64) -> LaunchConfig {
    let packets = packets.min(u32::MAX as u64) as u32;
    let (blocks, threads) = if packets <= cfg.ll_single_block_packets {
        (1, packets.next_multiple_of(32).clamp(32, 1024))
    } else {
        let t = cfg.ll_threads;
        (packets.div_ceil(t).clamp(1, cfg.ll_blocks), t)
    };
    LaunchConfig::new(with_keeper(blocks), threads)
}

/// An LL launch's grid for `blocks` working blocks: one more, the keeper that advances the
/// launch's flag, when there are several (`mscclpp_device::collectives::ll::ll_begin`).
pub(super) fn with_keeper(blocks: u32) -> u32 {
    if blocks > 1 { blocks + 1 } else { blocks }
}
