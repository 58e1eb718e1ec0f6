//! `direct`: no staging. One kernel reads and writes the peers' buffers themselves
//! (`mscclpp_device::collectives::direct`; its launches are in `launch/direct.rs`, which the
//! copy engines share), on buffers every peer learned once: registered by the caller, or by the
//! call itself (a hint, `registry.rs`); the kernel finds the peers' buffers in its registry
//! table and every rank decides alike, on the device, whether the call runs there. Every
//! collective (not the point-to-point calls) from `direct_min_bytes`, on at most
//! `MAX_DIRECT_RANKS` ranks; a call some rank cannot serve yet is handed on, on the device, to
//! the launch the dispatcher queues behind (`plan.rs`). A one-rank pre-multiplied sum on whole
//! vectors runs the kernel's local reduction ([`Planned::Alone`]).

use mscclpp_host::Result;
use mscclpp_host::gpu::Stream;
use mscclpp_shared::{BufferRef, CollectiveMode, DirectCollectiveParams, RegisteredCall};

use crate::collectives::algorithm::{Algorithm, Collective};
use crate::collectives::config::CollectiveConfig;
use crate::collectives::context::{Args, Context, Peer, SetUp, Twin};
use crate::collectives::launch::direct::{at_most_direct_ranks, launch, load, symmetric};
use crate::collectives::registry::Resolved;
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
    const AGREES: bool = true;

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
        if step.planned == Planned::Alone {
            return self.alone(cx, args, stream);
        }
        self.agreed(cx, args, step.forced, stream)
    }
}

impl Direct {
    /// What a forced call whose parts are not whole 16-byte vectors is refused as.
    const NOT_WHOLE: &'static str = "the direct kernel on parts that are not whole 16-byte \
        vectors";

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

    /// A call on the callers' buffers, as registered with the peers (`registry.rs`: by the
    /// caller, or by this call itself, a hint): no host exchange; the kernel learns the peers'
    /// buffers from their descriptors and every rank decides alike, on the device, whether the
    /// call runs there (`mscclpp_device::collectives::direct`). This rank says `ok = 0` when a
    /// buffer is in no registration every peer has yet, or does not suit the kernel
    /// (misaligned, overlapping the wrong way). Unless `forced`, the launch carries a gate and
    /// the call is handed on ([`Queued::Gated`]); forced (or under capture), the buffers'
    /// registrations are settled first (a host wait, once per allocation); forced, parts that
    /// are not whole vectors are refused at once (on every rank alike), and an `ok = 0` is
    /// refused on every rank by the kernel (the communicator's error).
    fn agreed(&self, cx: &Context, args: &Args, forced: bool, stream: &Stream) -> Result<Queued> {
        let (call, n, me) = (&args.call, cx.ranks(), cx.rank());
        let (input, output, b) = (args.input, args.output, call.bytes);
        let reduce = (call.dtype, call.op);
        let (mode, data, need, work) = match (call.collective, args.peer) {
            // Point-to-point calls run on the p2p engine.
            (Collective::SendRecv, _) | (_, Peer::Pair { .. } | Peer::To(_) | Peer::From(_)) => {
                return Err(cx.cannot(Self::NOT_SERVED));
            }
            (Collective::AllReduce, _) => (CollectiveMode::AllReduce, reduce, [b, b], b / n),
            (Collective::AllGather, _) => {
                (CollectiveMode::AllGather, Context::MOVE, [0, n * b], n * b)
            }
            (Collective::ReduceScatter, _) => {
                (CollectiveMode::ReduceScatter, reduce, [n * b, 0], b)
            }
            (Collective::Broadcast, _) => (CollectiveMode::Broadcast, Context::MOVE, [0, b], b),
            (Collective::AllToAll, _) => {
                (CollectiveMode::AllToAll, Context::MOVE, [0, n * b], n * b)
            }
            // The root reads every rank's input; its output is its own.
            (Collective::Reduce, _) => (CollectiveMode::Reduce, reduce, [b, 0], b),
        };
        if forced && !b.is_multiple_of(16) {
            // Decided alike on every rank (the call's size), before anything is queued.
            return Err(cx.cannot(Self::NOT_WHOLE));
        }
        let settle = (forced || stream.is_capturing()?).then(|| cx.comm.bootstrap().op_timeout());
        let drain = || -> Result<()> {
            if stream.synchronize_timeout(cx.comm.bootstrap().op_timeout())? {
                Ok(())
            } else {
                Err(cx.cannot("making room for a registration while queued work runs"))
            }
        };
        let find = |ptr, len| -> Option<BufferRef> {
            if len == 0 {
                return Some(BufferRef::default());
            }
            match cx.registry.resolve(&cx.buffers, ptr, len, settle, &drain) {
                Resolved::Ready(r) => Some(r),
                Resolved::Pending | Resolved::Unusable => None,
            }
        };
        let (i, o) = (find(input, need[0]), find(output, need[1]));
        let eligible = symmetric(cx, args).1;
        let ok = eligible && i.is_some() && o.is_some();
        let mut d = cx.direct_params(mode, data, b);
        (d.common.input, d.common.output) = (input, output);
        d.common.root = args.root();
        d.inputs[me] = input;
        d.outputs[me] = output;
        d.registry = cx.registry.table();
        d.desc_offset = cx.layout.desc_offset();
        d.need = [need[0] as u64, need[1] as u64];
        d.decline = if forced { 0 } else { cx.next_gate() };
        d.mine = RegisteredCall {
            input: i.unwrap_or_default(),
            output: o.unwrap_or_default(),
            call: digest(&[
                mode as u64,
                b as u64,
                d.common.root as u64,
                d.common.dtype as u64,
                d.common.op as u64,
                d.common.scalar,
                n as u64,
                d.need[0],
                d.need[1],
            ]),
            ok: ok as u32,
            ..Default::default()
        };
        launch(cx, &self.kernel, d, work, stream)?;
        Ok(match d.decline {
            0 => Queued::Ran,
            gate => Queued::Gated(gate),
        })
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
