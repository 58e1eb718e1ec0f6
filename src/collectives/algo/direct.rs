//! `direct`: no staging. The callers' buffers are registered on first use and exchanged on
//! every call (`registered.rs`), or registered ahead (`registry.rs`), and one kernel reads and
//! writes the peers' buffers themselves (`mscclpp_device::collectives::direct`; its launches
//! are in `launch/direct.rs`, which the copy engines share). Every collective (not the
//! point-to-point calls) from `direct_min_bytes`, on at most `MAX_DIRECT_RANKS` ranks; a call
//! whose buffers some rank cannot share is declined (the dispatcher then plans it again
//! without the callers' buffers). A one-rank pre-multiplied sum on whole vectors runs the
//! kernel's local reduction ([`Planned::Alone`]).

use mscclpp_host::Result;
use mscclpp_host::gpu::Stream;
use mscclpp_shared::{CollectiveMode, DirectCollectiveParams, RegisteredCall};

use crate::collectives::algorithm::{Algorithm, Collective};
use crate::collectives::config::CollectiveConfig;
use crate::collectives::context::{Args, CallRegs, Context, Peer, SetUp, Twin};
use crate::collectives::launch::direct::{at_most_direct_ranks, launch, load, symmetric};
use crate::collectives::registered;
use crate::collectives::unit::{CollectiveAlgorithm, Planned, Queued, Step};

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

    /// Every call on buffers registered ahead: the kernel learns the peers' buffers itself.
    fn takes_registered(_: &Args) -> bool {
        true
    }

    fn set_up(s: &SetUp<'_>) -> Result<Self> {
        Ok(Self { kernel: load(s)? })
    }

    fn queue(&self, cx: &Context, args: &Args, step: &Step, stream: &Stream) -> Result<Queued> {
        let (call, n, me) = (&args.call, cx.ranks(), cx.rank());
        let (input, output, b) = (args.input, args.output, call.bytes);
        if step.planned == Planned::Alone {
            return self.alone(cx, args, stream);
        }
        if let Some(regs) = args.reg {
            return self.registered(cx, args, regs, stream);
        }
        if call.collective == Collective::SendRecv {
            return Err(cx.cannot(Self::NOT_SERVED));
        }
        let (mine, eligible) = symmetric(cx, args);
        let Some(t) = registered::share_all(&cx.comm, &cx.buffers, &mine, eligible)? else {
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
    /// sum): `output = op(input)` by the kernel's local reduction over one source
    /// (`ReduceLocal`), which meets no peer and needs no registration, scratch or host wait,
    /// so it runs under capture too. Planned only where both buffers are whole 16-byte vectors
    /// (the kernel's unit) of at least `alone_direct_min_bytes` (below, staging is faster:
    /// `plan.rs`).
    fn alone(&self, cx: &Context, args: &Args, stream: &Stream) -> Result<Queued> {
        let (call, b) = (&args.call, args.call.bytes);
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
            // (`Engine::registered_call` gives them no registrations).
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

/// FNV-1a over `words`: the digest of a registered call every rank compares with its peers'.
fn digest(words: &[u64]) -> u64 {
    words
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
        })
}
