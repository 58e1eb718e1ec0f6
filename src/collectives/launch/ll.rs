//! The LL16 kernels' launch: the shape for a number of packets and the keeper block
//! (`mscclpp_device::collectives::ll`), for the one-shot and the two-shot LL algorithms.

use mscclpp_host::Result;
use mscclpp_host::gpu::{Kernel, LaunchConfig, Stream};
use mscclpp_shared::CollectiveParams;

use crate::collectives::algorithm::Algorithm;
use crate::collectives::config::CollectiveConfig;
use crate::collectives::context::Context;

/// What an LL call above `ll_max_bytes` per part is refused as.
pub(crate) const TOO_LARGE: &str = "an LL call above ll_max_bytes per part";

/// Queues `kernel` (an LL16 kernel) for `p`, whose `bytes` per part fit an LL slot (the
/// planner refuses larger calls), recording the one-shot LL algorithm.
pub(crate) fn launch(
    cx: &Context,
    kernel: &Kernel<CollectiveParams>,
    p: CollectiveParams,
    stream: &Stream,
) -> Result<()> {
    cx.ensure_healthy()?;
    cx.record(Algorithm::LlOneShot);
    let shape = shape(&cx.cfg, p.bytes.div_ceil(8));
    // SAFETY: the caller's contract (buffers sized for the mode), and our scratch, whose LL
    // slots hold `ll_max_bytes` per part (the planner checks it).
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
pub(crate) fn with_keeper(blocks: u32) -> u32 {
    if blocks > 1 { blocks + 1 } else { blocks }
}
