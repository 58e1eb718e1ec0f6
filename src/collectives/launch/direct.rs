//! The direct kernel's launches (`mscclpp_device::collectives::direct`), for the direct
//! algorithm and the copy engines: its shape, its launch, its one-block barrier (`Barrier`
//! mode, which brackets the copy-engine transfers), and what a symmetric call shares with
//! the peers ([`symmetric`]).

use mscclpp_host::Result;
use mscclpp_host::gpu::{LaunchConfig, Stream};
use mscclpp_shared::{
    CollectiveMode, DIRECT_SHARED_BYTES, DevicePtr, DirectCollectiveParams, MAX_DIRECT_RANKS,
    MemoryChannelDeviceHandle,
};

use crate::collectives::algorithm::{Algorithm, Collective};
use crate::collectives::config::CollectiveConfig;
use crate::collectives::context::{Args, Context, SetUp, Twin};
use crate::collectives::registered::{disjoint_or_at, whole_vectors};
use crate::kernels;

/// Refuses more than `MAX_DIRECT_RANKS` ranks (the kernels' parameter blocks hold that many
/// buffers).
pub(crate) fn at_most_direct_ranks(ranks: usize) -> Result<(), &'static str> {
    if ranks <= MAX_DIRECT_RANKS {
        Ok(())
    } else {
        Err("the direct path on more than MAX_DIRECT_RANKS ranks")
    }
}

/// The direct kernel and its twin for every reduction but the inline ones (sums and
/// pre-multiplied sums of f16, bf16, f32).
pub(crate) fn load(s: &SetUp<'_>) -> Result<Twin<DirectCollectiveParams>> {
    Twin::load(
        s,
        kernels::DIRECT_COLLECTIVE,
        kernels::DIRECT_COLLECTIVE_ANY,
    )
}

/// The buffers a symmetric collective on registered buffers shares with every rank (what the
/// peers write into or read from), and whether this rank's buffers suit the path: disjoint,
/// or in place exactly where the kernels serve it (every element read and written by one
/// thread, or only ever by its owner), and parts of whole 16-byte vectors.
pub(crate) fn symmetric(cx: &Context, args: &Args) -> (Vec<(DevicePtr<u8>, usize)>, bool) {
    let (n, me) = (cx.ranks(), cx.rank());
    let (input, output, b) = (args.input, args.output, args.call.bytes);
    let both = whole_vectors(&[input, output], b);
    match args.call.collective {
        Collective::AllReduce => (
            vec![(input, b), (output, b)],
            disjoint_or_at(input, b, output, b, Some(0)) && both,
        ),
        Collective::AllGather => (
            vec![(output, n * b)],
            disjoint_or_at(input, b, output, n * b, Some(me * b)) && both,
        ),
        Collective::ReduceScatter => (
            vec![(input, n * b)],
            disjoint_or_at(output, b, input, n * b, Some(me * b)) && both,
        ),
        // Every rank shares its input; the root's output is its own.
        Collective::Reduce => {
            let root = args.root() as usize;
            let output = me != root
                || disjoint_or_at(output, b, input, b, Some(0)) && whole_vectors(&[output], b);
            (vec![(input, b)], output && whole_vectors(&[input], b))
        }
        Collective::Broadcast => {
            let root = args.root() as usize;
            let source = me != root
                || disjoint_or_at(input, b, output, b, Some(0)) && whole_vectors(&[input], b);
            (vec![(output, b)], source && whole_vectors(&[output], b))
        }
        Collective::AllToAll => (
            vec![(output, n * b)],
            disjoint_or_at(input, n * b, output, n * b, None) && both,
        ),
        // Not symmetric: the point-to-point calls exchange with their peers only.
        Collective::SendRecv => (Vec::new(), false),
    }
}

/// Queues the direct kernel for `d` over `work` bytes (what one rank moves).
pub(crate) fn launch(
    cx: &Context,
    kernel: &Twin<DirectCollectiveParams>,
    d: DirectCollectiveParams,
    work: usize,
    stream: &Stream,
) -> Result<()> {
    cx.ensure_healthy()?;
    let shape = shape(&cx.cfg, work);
    cx.record(Algorithm::Direct);
    let kernel = kernel.for_params(&d.common);
    // SAFETY: the buffers were registered and sized by the caller's contract; the channel
    // table lives as long as the `Collectives`.
    unsafe { stream.launch(kernel, shape, d) }
}

/// The direct kernel's launch over `work` bytes (what one rank moves): a block per
/// `direct_block_bytes`, at most `direct_blocks` (and `max_blocks`).
pub(crate) fn shape(cfg: &CollectiveConfig, work: usize) -> LaunchConfig {
    let most = cfg.direct_blocks.min(cfg.max_blocks) as usize;
    let blocks = work.div_ceil(cfg.direct_block_bytes).clamp(1, most) as u32;
    LaunchConfig::new(blocks, cfg.direct_threads).with_shared_mem(DIRECT_SHARED_BYTES)
}

/// Queues one block meeting the ranks in `peers` on channel row `row` (`< max_blocks`; the
/// meetings queued on concurrent streams use different rows, which do not share semaphores).
pub(crate) fn barrier(
    cx: &Context,
    kernel: &Twin<DirectCollectiveParams>,
    stream: &Stream,
    peers: &[usize],
    row: u32,
) -> Result<()> {
    cx.ensure_healthy()?;
    let mut d = cx.direct_params(CollectiveMode::Barrier, Context::MOVE, 0);
    let handle = std::mem::size_of::<MemoryChannelDeviceHandle>() as u64;
    let row = row.min(cx.cfg.max_blocks - 1);
    d.common.channels = d
        .common
        .channels
        .byte_add_cast(row as u64 * cx.ranks() as u64 * handle);
    d.common.max_blocks -= row;
    d.common.root = peers.iter().fold(0u32, |m, &q| m | (1 << q));
    let cfg = LaunchConfig::new(1, 32).with_shared_mem(16);
    // SAFETY: touches only the channel table's semaphores, which live as long as the
    // `Collectives`.
    unsafe { stream.launch(&kernel.main, cfg, d) }
}
