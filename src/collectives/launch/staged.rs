//! The staged kernel's launches (`mscclpp_device::collectives::staged_collective_kernel`), in
//! pieces that fit the staging region: a per-part collective ([`parts`]) and the all-reduce in
//! its two modes ([`all_reduce`]: `AllReduce` for `staged`, `AllReducePut` for `put`).

use mscclpp_host::Result;
use mscclpp_host::gpu::{BackendKind, LaunchConfig, Stream};
use mscclpp_shared::{CollectiveMode, CollectiveParams, DataType, DevicePtr};

use crate::collectives::algorithm::Algorithm;
use crate::collectives::config::CollectiveConfig;
use crate::collectives::context::{Args, Context, SetUp, Twin};
use crate::collectives::reduction::KernelOp;
use crate::collectives::regions::Peers;
use crate::collectives::scratch::Region;
use crate::kernels;

/// The staged kernel and its twin for every reduction but the inline ones (sums and
/// pre-multiplied sums of f16, bf16, f32).
pub(crate) fn load(s: &SetUp<'_>) -> Result<Twin<CollectiveParams>> {
    Twin::load(
        s,
        kernels::STAGED_COLLECTIVE,
        kernels::STAGED_COLLECTIVE_ANY,
    )
}

/// What every piece of a per-part call shares.
pub(crate) struct Piece {
    /// The kernel's mode.
    pub mode: CollectiveMode,
    /// Element type and operator.
    pub data: (DataType, KernelOp),
    /// The kernels' `root` word.
    pub root: u32,
    /// The peers the kernel meets.
    pub peers: Peers,
}

/// Runs a per-part mode in pieces of at most `max_piece` bytes per part.
pub(crate) fn parts(
    cx: &Context,
    kernel: &Twin<CollectiveParams>,
    piece: Piece,
    (input, output): (DevicePtr<u8>, DevicePtr<u8>),
    part_bytes: usize,
    max_piece: usize,
    stream: &Stream,
) -> Result<()> {
    let max_piece = max_piece.max(16) & !15;
    let mut off = 0;
    while off < part_bytes {
        let len = max_piece.min(part_bytes - off);
        let mut p = cx.params_in(
            Region::Staging,
            piece.peers.clone(),
            piece.mode,
            piece.data,
            stream,
        )?;
        p.input = input.byte_add_cast(off as u64);
        p.output = output.byte_add_cast(off as u64);
        p.bytes = len as u64;
        p.stride = part_bytes as u64;
        p.root = piece.root;
        launch(cx, kernel, p, Algorithm::Staged, stream)?;
        off += len;
    }
    Ok(())
}

/// The staged kernel's all-reduce in `mode` (`AllReduce`, or `AllReducePut`, which keeps an
/// all-gather half of the staging: `algorithm` says which), in pieces whose per-rank chunks
/// (rounded to 16 bytes) fit the staging region.
pub(crate) fn all_reduce(
    cx: &Context,
    kernel: &Twin<CollectiveParams>,
    mode: CollectiveMode,
    algorithm: Algorithm,
    args: &Args,
    stream: &Stream,
) -> Result<()> {
    let (n, bytes) = (cx.ranks(), args.call.bytes);
    let halves = if algorithm == Algorithm::TwoShotPut {
        2
    } else {
        1
    };
    let piece = ((cx.cfg.stage_bytes / (halves * n)) & !15) * n;
    if piece == 0 {
        return Err(cx.cannot("a staged all-reduce with under 16 staging bytes per rank"));
    }
    let mut off = 0;
    while off < bytes {
        let len = piece.min(bytes - off);
        let mut p = cx.params_in(
            Region::Staging,
            args.peers(),
            mode,
            (args.call.dtype, args.call.op),
            stream,
        )?;
        p.input = args.input.byte_add_cast(off as u64);
        p.output = args.output.byte_add_cast(off as u64);
        p.bytes = len as u64;
        launch(cx, kernel, p, algorithm, stream)?;
        off += len;
    }
    Ok(())
}

/// Queues the staged kernel for one piece, recording `algorithm`.
fn launch(
    cx: &Context,
    kernel: &Twin<CollectiveParams>,
    p: CollectiveParams,
    algorithm: Algorithm,
    stream: &Stream,
) -> Result<()> {
    cx.ensure_healthy()?;
    cx.record(algorithm);
    let shape = shape(&cx.cfg, cx.comm.gpu().kind(), p.bytes);
    let kernel = kernel.for_params(&p);
    // SAFETY: the callers' contracts (input/output ranges) and our scratch and channel
    // table, which live as long as the `Collectives`.
    unsafe { stream.launch(kernel, shape, p) }
}

/// The staged kernel's launch for a piece of `bytes`: a block per 64 KiB (CUDA) or 1 MiB (CPU
/// backend), at most `staged_blocks` (and `max_blocks`).
pub(crate) fn shape(cfg: &CollectiveConfig, backend: BackendKind, bytes: u64) -> LaunchConfig {
    let per_block: u64 = if backend == BackendKind::Cuda {
        64 << 10
    } else {
        1 << 20
    };
    let blocks = bytes
        .div_ceil(per_block)
        .clamp(1, cfg.staged_blocks.min(cfg.max_blocks) as u64) as u32;
    LaunchConfig::new(blocks, cfg.threads).with_shared_mem(16)
}
