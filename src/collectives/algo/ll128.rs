//! `ll128`: the one-shot shape of `ll` with LL128 lines, 120 data bytes in every 128 (LL16: 8
//! in 16), written by a warp; the medium sizes, which the links' bandwidth bounds, go almost
//! twice as fast. All-reduce, all-gather and reduce-scatter, up to `ll128_max_bytes` (per
//! part), through the LL128 region. Kernels `mscclpp_device::collectives::ll128`.

use mscclpp_host::Result;
use mscclpp_host::gpu::{Kernel, LaunchConfig, Stream};
use mscclpp_shared::{CollectiveMode, CollectiveParams, packet::ll128};

use crate::collectives::algorithm::{Algorithm, Collective};
use crate::collectives::config::CollectiveConfig;
use crate::collectives::context::{Args, Context, SetUp, pick};
use crate::collectives::launch::ll::with_keeper;
use crate::collectives::scratch::Region;
use crate::collectives::unit::{CollectiveAlgorithm, Queued, Step};
use crate::kernels;

pub(crate) struct Ll128 {
    all_reduce: Kernel<CollectiveParams>,
    /// All-gather and reduce-scatter.
    parts: Kernel<CollectiveParams>,
    /// The twin of both for every reduction but the inline ones (sums and pre-multiplied sums
    /// of f16, bf16, f32).
    any: Kernel<CollectiveParams>,
}

impl CollectiveAlgorithm for Ll128 {
    const ALGORITHM: Algorithm = Algorithm::Ll128;
    const NAME: &'static str = "ll128";
    const ALIASES: &'static [&'static str] = &["ll-128"];
    const SERVES: &'static [Collective] = &[
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
    ];
    const NOT_SERVED: &'static str = "an all-reduce algorithm for this collective";
    const SCRATCH: &'static [Region] = &[Region::Ll128];
    const TOO_LARGE: &'static str = "an LL128 call above ll128_max_bytes";

    fn max_bytes(cfg: &CollectiveConfig) -> Option<usize> {
        Some(cfg.ll128_max_bytes)
    }

    fn set_up(s: &SetUp<'_>) -> Result<Self> {
        Ok(Self {
            all_reduce: s.kernel(kernels::LL128_ALL_REDUCE)?,
            parts: s.kernel(kernels::LL128_COLLECTIVE)?,
            any: s.kernel(kernels::LL128_COLLECTIVE_ANY)?,
        })
    }

    fn queue(&self, cx: &Context, args: &Args, _: &Step, stream: &Stream) -> Result<Queued> {
        let call = &args.call;
        let bytes = call.bytes as u64;
        // The all-reduce has no parts (stride 0); the others' parts are `bytes` apart.
        let (mode, op, stride, kernel) = match call.collective {
            Collective::AllReduce => (CollectiveMode::AllReduce, call.op, 0, &self.all_reduce),
            Collective::AllGather => (
                CollectiveMode::AllGather,
                Context::MOVE.1,
                bytes,
                &self.parts,
            ),
            Collective::ReduceScatter => {
                (CollectiveMode::ReduceScatter, call.op, bytes, &self.parts)
            }
            _ => return Err(cx.cannot(Self::NOT_SERVED)),
        };
        let mut p = cx.params_in(Region::Ll128, args.peers(), mode, (call.dtype, op), stream)?;
        (p.input, p.output, p.bytes, p.stride) = (args.input, args.output, bytes, stride);
        cx.ensure_healthy()?;
        let shape = shape(&cx.cfg, bytes);
        cx.record(Algorithm::Ll128);
        // SAFETY: the caller's contract (buffers sized for the mode), and our scratch, whose
        // LL128 region holds `ll128_slot_bytes` per slot for up to `ll128_max_bytes`.
        unsafe { stream.launch(pick(kernel, &self.any, &p), shape, p) }?;
        Ok(Queued::Ran)
    }
}

/// The LL128 kernels' launch for `bytes` per part: one warp per 480-byte step, blocks of
/// `ll128_threads`, halved (down to one warp) until there are at least `ll128_blocks` of
/// them, at most `ll128_max_blocks` (the warps loop beyond), and the keeper block.
pub(crate) fn shape(cfg: &CollectiveConfig, bytes: u64) -> LaunchConfig {
    let steps = bytes.div_ceil(ll128::WARP_DATA_BYTES as u64);
    let warp = ll128::WARP_LANES as u32;
    let mut threads = (cfg.ll128_threads / warp).max(1) * warp;
    while threads > warp && steps.div_ceil((threads / warp) as u64) < cfg.ll128_blocks as u64 {
        threads /= 2;
    }
    threads = (threads / warp).max(1) * warp;
    let blocks = steps
        .div_ceil((threads / warp) as u64)
        .clamp(1, cfg.ll128_max_blocks.max(1) as u64) as u32;
    LaunchConfig::new(with_keeper(blocks), threads)
}
