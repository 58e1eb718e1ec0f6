//! `direct`: no staging. The callers' buffers are registered on first use and exchanged on
//! every call (`registered.rs`), and one kernel reads and writes the peers' buffers themselves
//! (`mscclpp_device::collectives::direct`). Every collective (not the point-to-point calls)
//! from `direct_min_bytes`, on at most `MAX_DIRECT_RANKS` ranks; a call whose buffers some rank
//! cannot share is declined (the dispatch then stages it). The same kernel's `Barrier` mode
//! brackets the copy-engine transfers ([`barrier`]).

use mscclpp_host::Result;
use mscclpp_host::gpu::{LaunchConfig, Stream};
use mscclpp_shared::{
    CollectiveMode, DIRECT_SHARED_BYTES, DevicePtr, DirectCollectiveParams, MAX_DIRECT_RANKS,
    MemoryChannelDeviceHandle, RegisteredCall,
};

use super::{Algorithm, Collective, CollectiveAlgorithm, Queued};
use crate::collectives::CollectiveConfig;
use crate::collectives::context::{Args, CallRegs, Context, Peer, SetUp, Twin};
use crate::collectives::registered::{self, disjoint_or_at, whole_vectors};
use crate::kernels;

pub(crate) struct Direct {
    kernel: Twin<DirectCollectiveParams>,
}

impl CollectiveAlgorithm for Direct {
    const ALGORITHM: Algorithm = Algorithm::Direct;
    const NAME: &'static str = "direct";
    const ALIASES: &'static [&'static str] = &["zero-copy"];
    const SERVES: &'static [Collective] = &[
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::AllToAll,
        Collective::Reduce,
    ];
    const NOT_SERVED: &'static str = "a direct variant of this collective";
    const REGISTERED: bool = true;

    fn serves_ranks(ranks: usize) -> Result<(), &'static str> {
        at_most_direct_ranks(ranks)
    }

    fn channel_rows(cfg: &CollectiveConfig) -> u32 {
        cfg.direct_blocks
    }

    fn set_up(s: &SetUp<'_>) -> Result<Self> {
        Ok(Self { kernel: load(s)? })
    }

    fn queue(&self, cx: &Context, args: &Args, stream: &Stream) -> Result<Queued> {
        let (call, n, me) = (&args.call, cx.ranks(), cx.rank());
        let (input, output, b) = (args.input, args.output, call.bytes);
        if let Some(regs) = args.reg {
            return self.registered(cx, args, regs, stream);
        }
        if call.collective == Collective::SendRecv {
            return Err(cx.cannot(Self::NOT_SERVED));
        }
        let (mine, eligible) = symmetric(cx, args);
        let Some(t) = registered::share_all(cx, &mine, eligible)? else {
            return Ok(Queued::Declined);
        };
        let reduce = (call.dtype, call.op);
        let (mut d, work) = match call.collective {
            Collective::AllReduce => {
                let mut d = cx.direct_params(CollectiveMode::AllReduce, reduce, b);
                (d.inputs, d.outputs) = (t[0], t[1]);
                (d, b / n)
            }
            Collective::AllGather => {
                let mut d = cx.direct_params(CollectiveMode::AllGather, Context::MOVE, b);
                d.inputs[me] = input;
                d.outputs = t[0];
                (d, n * b)
            }
            Collective::ReduceScatter => {
                let mut d = cx.direct_params(CollectiveMode::ReduceScatter, reduce, b);
                d.inputs = t[0];
                d.outputs[me] = output;
                (d, b)
            }
            Collective::Reduce => {
                let mut d = cx.direct_params(CollectiveMode::Reduce, reduce, b);
                d.common.root = args.root();
                d.inputs = t[0];
                d.outputs[me] = output;
                (d, b)
            }
            Collective::Broadcast => {
                let mut d = cx.direct_params(CollectiveMode::Broadcast, Context::MOVE, b);
                d.common.root = args.root();
                d.inputs[me] = input;
                d.outputs = t[0];
                (d, b)
            }
            Collective::AllToAll => {
                let mut d = cx.direct_params(CollectiveMode::AllToAll, Context::MOVE, b);
                d.inputs[me] = input;
                d.outputs = t[0];
                (d, n * b)
            }
            Collective::SendRecv => return Err(cx.cannot(Self::NOT_SERVED)),
        };
        (d.common.input, d.common.output) = (input, output);
        launch(cx, &self.kernel, d, work, stream)?;
        Ok(Queued::Ran)
    }
}

impl Direct {
    /// A one-rank reducing call whose operator still changes the data (a pre-multiplied
    /// sum): `output = op(input)` by the kernel's local reduction over one
    /// source (`ReduceLocal`), which meets no peer and needs no registration, scratch or
    /// host wait, so it runs under capture too. Declined unless both buffers are whole 16-byte
    /// vectors (the kernel's unit) of at least `alone_direct_min_bytes` (below, staging is
    /// faster); the dispatch then stages the call.
    pub fn alone(&self, cx: &Context, args: &Args, stream: &Stream) -> Result<Queued> {
        let (call, b) = (&args.call, args.call.bytes);
        if cx.ranks() != 1
            || b < cx.cfg.alone_direct_min_bytes
            || !whole_vectors(&[args.input, args.output], b)
        {
            return Ok(Queued::Declined);
        }
        let mut d = cx.direct_params(CollectiveMode::ReduceLocal, (call.dtype, call.op), b);
        (d.inputs[0], d.outputs[0]) = (args.input, args.output);
        (d.common.input, d.common.output) = (args.input, args.output);
        launch(cx, &self.kernel, d, b, stream)?;
        Ok(Queued::Ran)
    }

    /// A call on registered buffers (`registry.rs`): no exchange; the kernel learns the peers'
    /// buffers from their descriptors (`mscclpp_device::collectives::direct`). Never declines:
    /// a rank whose buffers do not suit the kernel says so in its descriptor, and every rank's
    /// kernel refuses the launch.
    fn registered(
        &self,
        cx: &Context,
        args: &Args,
        regs: CallRegs,
        stream: &Stream,
    ) -> Result<Queued> {
        let (call, n, me) = (&args.call, cx.ranks(), cx.rank());
        let (input, output, b) = (args.input, args.output, call.bytes);
        let reduce = (call.dtype, call.op);
        let (mode, data, need, work, meet) = match (call.collective, args.peer) {
            // Point-to-point calls run on the p2p engine, a reduce on exchanged buffers
            // (`Collectives::registered_call` gives them no registrations).
            (Collective::SendRecv | Collective::Reduce, _) | (_, Peer::Pair { .. }) => {
                return Err(cx.cannot(Self::NOT_SERVED));
            }
            (Collective::AllReduce, _) => (CollectiveMode::AllReduce, reduce, [b, b], b / n, 0),
            (Collective::AllGather, _) => (
                CollectiveMode::AllGather,
                Context::MOVE,
                [0, n * b],
                n * b,
                0,
            ),
            (Collective::ReduceScatter, _) => {
                (CollectiveMode::ReduceScatter, reduce, [n * b, 0], b, 0)
            }
            (Collective::Broadcast, _) => (CollectiveMode::Broadcast, Context::MOVE, [0, b], b, 0),
            (Collective::AllToAll, _) => (
                CollectiveMode::AllToAll,
                Context::MOVE,
                [0, n * b],
                n * b,
                0,
            ),
        };
        let eligible = symmetric(cx, args).1;
        let mut d = cx.direct_params(mode, data, b);
        (d.common.input, d.common.output) = (input, output);
        d.common.root = args.root();
        d.inputs[me] = input;
        d.outputs[me] = output;
        d.registry = cx.registry.table();
        d.desc_offset = cx.layout.desc_offset();
        d.need = [need[0] as u64, need[1] as u64];
        d.meet = meet;
        // The send's root is each rank's own next rank: not part of the digest.
        let root = if mode == CollectiveMode::Send {
            u32::MAX
        } else {
            d.common.root
        };
        d.mine = RegisteredCall {
            input: regs.input.unwrap_or_default(),
            output: regs.output.unwrap_or_default(),
            call: digest(&[
                mode as u64,
                b as u64,
                root as u64,
                d.common.dtype as u64,
                d.common.op as u64,
                d.common.scalar,
                n as u64,
                d.need[0],
                d.need[1],
            ]),
            ok: eligible as u32,
            ..Default::default()
        };
        launch(cx, &self.kernel, d, work, stream)?;
        Ok(Queued::Ran)
    }
}

/// Refuses more than `MAX_DIRECT_RANKS` ranks (the kernels' parameter blocks hold that many
/// buffers).
pub(super) fn at_most_direct_ranks(ranks: usize) -> Result<(), &'static str> {
    if ranks <= MAX_DIRECT_RANKS {
        Ok(())
    } else {
        Err("the direct path on more than MAX_DIRECT_RANKS ranks")
    }
}

/// The direct kernel and its twin for every reduction but the common sums.
pub(super) fn load(s: &SetUp<'_>) -> Result<Twin<DirectCollectiveParams>> {
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
pub(super) fn symmetric(cx: &Context, args: &Args) -> (Vec<(DevicePtr<u8>, usize)>, bool) {
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
pub(super) fn launch(
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

/// FNV-1a over `words`: the digest of a registered call every rank compares with its peers'.
fn digest(words: &[u64]) -> u64 {
    words
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
        })
}

/// Queues one block meeting the ranks in `peers` on channel row `row` (`< max_blocks`; the
/// meetings queued on concurrent streams use different rows, which do not share semaphores).
pub(super) fn barrier(
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
