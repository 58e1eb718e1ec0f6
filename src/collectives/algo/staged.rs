//! `staged`: every collective through the staging region, any size. The input is staged in the
//! rank's scratch, ranks meet at a block barrier, and each rank reads its peers' staging over
//! NVLink; all-reduce is a reduce-scatter followed by an all-gather. Large operations run in
//! pieces of the staging size. What every collective falls back to when nothing faster serves
//! it (point-to-point calls run on `p2p`). Kernel
//! `mscclpp_device::collectives::staged_collective_kernel`.

use mscclpp_host::Result;
use mscclpp_host::gpu::Stream;
use mscclpp_shared::{CollectiveMode, CollectiveParams};

use crate::collectives::algorithm::{Algorithm, Collective};
use crate::collectives::config::CollectiveConfig;
use crate::collectives::context::{Args, Context, SetUp, Twin};
use crate::collectives::launch::staged::{Piece, all_reduce, load, parts};
use crate::collectives::scratch::Region;
use crate::collectives::unit::{CollectiveAlgorithm, Queued, Step};

pub(crate) struct Staged {
    kernel: Twin<CollectiveParams>,
}

impl CollectiveAlgorithm for Staged {
    const ALGORITHM: Algorithm = Algorithm::Staged;
    const NAME: &'static str = "staged";
    const ALIASES: &'static [&'static str] = &["rs-ag"];
    const SERVES: &'static [Collective] = &[
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::AllToAll,
        Collective::Reduce,
    ];
    const NOT_SERVED: &'static str = "a staged variant of this collective";
    const SCRATCH: &'static [Region] = &[Region::Staging];

    fn channel_rows(cfg: &CollectiveConfig) -> u32 {
        cfg.staged_blocks
    }

    fn set_up(s: &SetUp<'_>) -> Result<Self> {
        Ok(Self { kernel: load(s)? })
    }

    fn queue(&self, cx: &Context, args: &Args, _: &Step, stream: &Stream) -> Result<Queued> {
        let (call, n) = (&args.call, cx.ranks());
        let (stage, per_rank) = (cx.cfg.stage_bytes, (cx.cfg.stage_bytes / n) & !15);
        let (input, output) = (args.input, args.output);
        let reduce = (call.dtype, call.op);
        let (mode, data, input, output, max_piece) = match call.collective {
            Collective::AllReduce => {
                let mode = CollectiveMode::AllReduce;
                all_reduce(cx, &self.kernel, mode, Algorithm::Staged, args, stream)?;
                return Ok(Queued::Ran);
            }
            // The input piece is offset within the input, the output piece within each part.
            Collective::AllGather => (
                CollectiveMode::AllGather,
                Context::MOVE,
                input,
                output,
                stage,
            ),
            Collective::ReduceScatter => (
                CollectiveMode::ReduceScatter,
                reduce,
                input,
                output,
                per_rank,
            ),
            Collective::Broadcast => (
                CollectiveMode::Broadcast,
                Context::MOVE,
                input,
                output,
                stage,
            ),
            Collective::AllToAll => (
                CollectiveMode::AllToAll,
                Context::MOVE,
                input,
                output,
                per_rank,
            ),
            // The root reads every rank's piece at the same offset of its staging.
            Collective::Reduce => (CollectiveMode::Reduce, reduce, input, output, stage),
            Collective::SendRecv => return Err(cx.cannot(Self::NOT_SERVED)),
        };
        let piece = Piece {
            mode,
            data,
            root: args.root(),
            peers: args.peers(),
        };
        parts(
            cx,
            &self.kernel,
            piece,
            (input, output),
            call.bytes,
            max_piece,
            stream,
        )?;
        Ok(Queued::Ran)
    }
}
