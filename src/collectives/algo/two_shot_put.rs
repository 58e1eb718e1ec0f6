//! `put`: the all-reduce where only writes cross the links. Each rank puts part `q` of its input
//! into rank `q`'s staging, reduces its own part locally, and puts the result into every
//! peer's staging (which therefore keeps an all-gather half). Any size, in pieces of half the
//! staging region. Kernel `mscclpp_device::collectives::staged_collective_kernel`, mode
//! `AllReducePut`.

use mscclpp_host::Result;
use mscclpp_host::gpu::Stream;
use mscclpp_shared::{CollectiveMode, CollectiveParams};

use crate::collectives::algorithm::{Algorithm, Collective};
use crate::collectives::config::CollectiveConfig;
use crate::collectives::context::{Args, Context, SetUp, Twin};
use crate::collectives::launch::staged;
use crate::collectives::scratch::Region;
use crate::collectives::unit::{CollectiveAlgorithm, Queued, Step};

pub(crate) struct TwoShotPut {
    kernel: Twin<CollectiveParams>,
}

impl CollectiveAlgorithm for TwoShotPut {
    const ALGORITHM: Algorithm = Algorithm::TwoShotPut;
    const NAME: &'static str = "put";
    const ALIASES: &'static [&'static str] = &["two-shot-put"];
    const SERVES: &'static [Collective] = &[Collective::AllReduce];
    const NOT_SERVED: &'static str = "an all-reduce algorithm for this collective";
    const SCRATCH: &'static [Region] = &[Region::Staging];

    fn channel_rows(cfg: &CollectiveConfig) -> u32 {
        cfg.staged_blocks
    }

    fn set_up(s: &SetUp<'_>) -> Result<Self> {
        Ok(Self {
            kernel: staged::load(s)?,
        })
    }

    fn queue(&self, cx: &Context, args: &Args, _: &Step, stream: &Stream) -> Result<Queued> {
        if args.call.collective != Collective::AllReduce {
            return Err(cx.cannot(Self::NOT_SERVED));
        }
        let mode = CollectiveMode::AllReducePut;
        staged::all_reduce(cx, &self.kernel, mode, Self::ALGORITHM, args, stream)?;
        Ok(Queued::Ran)
    }
}
