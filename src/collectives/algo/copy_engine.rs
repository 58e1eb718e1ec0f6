//! `ce`: the callers' registered buffers again (`registered.rs`), moved by the copy engines
//! (`cuMemcpyAsync` into the peers' mapped buffers) between two block barriers (the direct
//! kernel's `Barrier` mode). All-gather, broadcast and all-to-all from `ce_min_bytes`;
//! all-reduce from `ce_all_reduce_min_bytes`, as a pipelined reduce-scatter and all-gather by
//! copy engine
//! through a scratch buffer of its own (`copy_engine/all_reduce.rs`). At most
//! `MAX_DIRECT_RANKS` ranks; a call whose buffers some rank cannot share is declined (the
//! dispatcher then plans it again without the callers' buffers).

mod all_reduce;

use mscclpp_host::Result;
use mscclpp_host::gpu::{Event, LazyStream, Stream};
use mscclpp_shared::{DevicePtr, DirectCollectiveParams};

use crate::collectives::algorithm::{Algorithm, Collective};
use crate::collectives::config::CollectiveConfig;
use crate::collectives::context::{
    Args, CallRegs, Context, Lowered, Peer, SetUp, Twin, copy_if_needed,
};
use crate::collectives::launch::direct::{self, at_most_direct_ranks, symmetric};
use crate::collectives::registered;
use crate::collectives::scratch::{Region, ScratchLayout};
use crate::collectives::unit::{CollectiveAlgorithm, Planned, Queued, Step};

pub(crate) struct CopyEngine {
    /// The direct kernel: barriers, and the all-reduce's local reductions.
    direct: Twin<DirectCollectiveParams>,
    /// Second stream (a rank's copy into its own buffer), and its fork and join events.
    side: LazyStream,
    fork: Event,
    join: Event,
    /// The all-reduce's streams, events and scratch.
    pipeline: all_reduce::Pipeline,
}

/// A copy the engines make: (target rank, destination, source, bytes).
type Copy = (usize, DevicePtr<u8>, DevicePtr<u8>, usize);

impl CollectiveAlgorithm for CopyEngine {
    const ALGORITHM: Algorithm = Algorithm::CopyEngine;
    const NAME: &'static str = "ce";
    const ALIASES: &'static [&'static str] = &["copy-engine"];
    const SERVES: &'static [Collective] = &[
        Collective::AllReduce,
        Collective::AllGather,
        Collective::Broadcast,
        Collective::AllToAll,
    ];
    const NOT_SERVED: &'static str = "a copy-engine reduction (use `direct` or `staged`)";
    const REGISTERED: bool = true;
    const SCRATCH: &'static [Region] = &[Region::CopyEngine];

    fn serves_ranks(ranks: usize) -> Result<(), &'static str> {
        at_most_direct_ranks(ranks)
    }

    fn channel_rows(cfg: &CollectiveConfig) -> u32 {
        cfg.direct_blocks.max(all_reduce::ROWS)
    }

    fn takes_registered(args: &Args) -> bool {
        Self::takes_windows(args)
    }

    /// An all-reduce is cut into pieces that fit the scratch's slots (refused when one does
    /// not: a scratch too small for the ranks).
    fn plan(
        cfg: &CollectiveConfig,
        layout: &ScratchLayout,
        call: &Lowered,
    ) -> Result<Step, &'static str> {
        if call.collective != Collective::AllReduce {
            return Ok(Step::itself(Self::ALGORITHM));
        }
        let (chunk, piece, pieces, slot) =
            all_reduce::plan(call.bytes, call.ranks, layout.ce_bytes(), cfg.ce_min_pieces);
        if piece > slot {
            return Err("a copy-engine all-reduce with this little scratch");
        }
        Ok(Step {
            algorithm: Self::ALGORITHM,
            planned: Planned::Pieces {
                chunk,
                piece,
                pieces,
                slot,
            },
            forced: false,
        })
    }

    fn set_up(s: &SetUp<'_>) -> Result<Self> {
        Ok(Self {
            direct: direct::load(s)?,
            side: LazyStream::new(s.gpu),
            fork: s.gpu.event()?,
            join: s.gpu.event()?,
            pipeline: all_reduce::Pipeline::new(s.gpu)?,
        })
    }

    fn queue(&self, cx: &Context, args: &Args, step: &Step, stream: &Stream) -> Result<Queued> {
        let (n, me) = (cx.ranks(), cx.rank());
        let (input, b) = (args.input, args.call.bytes);
        if let Some(regs) = args.reg {
            return self.windows(cx, args, regs, stream);
        }
        let (mut mine, mut eligible) = symmetric(cx, args);
        if args.call.collective == Collective::AllReduce {
            // Every rank shares its CE scratch too (or, without one, goes staged).
            match self.pipeline.scratch(cx.comm.gpu(), cx.layout.ce_bytes()) {
                Some(s) => mine.push(s),
                None => eligible = false,
            }
        }
        let Some(t) = registered::share_all(&cx.comm, &cx.buffers, &mine, eligible)? else {
            return Ok(Queued::Declined);
        };
        let at = |q: usize| (q * b) as u64;
        let copies: Vec<Copy> = match (args.call.collective, step.planned) {
            (_, Planned::Refused(w)) => return Err(cx.cannot(w)),
            (Collective::AllReduce, Planned::Pieces { .. }) => {
                let data = (args.call.dtype, args.call.op);
                let cut = &step.planned;
                all_reduce::run(cx, &self.direct, &self.pipeline, stream, &t, cut, (b, data))?;
                return Ok(Queued::Ran);
            }
            (Collective::AllReduce, _) => {
                return Err(cx.cannot("a copy-engine all-reduce without its pieces"));
            }
            (Collective::AllGather, _) => (0..n)
                .map(|q| (q, t[0][q].byte_add_cast(at(me)), input, b))
                .collect(),
            (Collective::Broadcast, _) if me == args.root() as usize => {
                (0..n).map(|q| (q, t[0][q], input, b)).collect()
            }
            (Collective::Broadcast, _) => Vec::new(),
            (Collective::AllToAll, _) => (0..n)
                .map(|q| {
                    (
                        q,
                        t[0][q].byte_add_cast(at(me)),
                        input.byte_add_cast(at(q)),
                        b,
                    )
                })
                .collect(),
            (Collective::ReduceScatter | Collective::Reduce | Collective::SendRecv, _) => {
                return Err(cx.cannot(Self::NOT_SERVED));
            }
        };
        self.copies(cx, stream, &cx.others(), &copies)
    }
}

impl CopyEngine {
    /// Whether the copy engines take a call on registered buffers: outputs in windows (the
    /// host knows the peers' windows, and NCCL's symmetric rule puts the peers' buffers at this
    /// rank's offset), for the collectives that copy into the peers' outputs only: all-gather
    /// and broadcast (not the all-reduce, whose scratch is traded per call, nor
    /// the all-to-all, which refuses in place; those take the direct kernel).
    fn takes_windows(args: &Args) -> bool {
        let Some(regs) = args.reg else {
            return false;
        };
        regs.windows
            && regs.output.is_some()
            && match args.peer {
                Peer::None | Peer::Root(_) => matches!(
                    args.call.collective,
                    Collective::AllGather | Collective::Broadcast
                ),
                // Point-to-point calls run on the p2p engine.
                Peer::Pair { .. } | Peer::To(_) | Peer::From(_) => false,
            }
    }

    /// A call whose outputs are windows ([`takes_windows`](Self::takes_windows)): the
    /// peers' outputs at this rank's offset in their windows, checked to hold what is copied;
    /// no message. (A peer whose buffer is at another offset of its window gets the data at
    /// this one's: NCCL's symmetric rule; nothing lands outside its window.)
    fn windows(
        &self,
        cx: &Context,
        args: &Args,
        regs: CallRegs,
        stream: &Stream,
    ) -> Result<Queued> {
        let (n, me) = (cx.ranks(), cx.rank());
        let (input, b) = (args.input, args.call.bytes);
        let Some(out) = regs.output.filter(|_| Self::takes_windows(args)) else {
            return Err(cx.cannot("the copy engines on these registered buffers"));
        };
        let need = match args.call.collective {
            Collective::AllGather => n * b,
            _ => b,
        };
        let peer_output = |q: usize| -> Result<DevicePtr<u8>> {
            if q == me {
                return Ok(args.output);
            }
            match cx.registry.peer_window(q, out.slot) {
                Some((base, len)) if out.offset as usize + need <= len => {
                    Ok(base.byte_add_cast(out.offset))
                }
                _ => Err(mscclpp_host::Error::MalformedMemory {
                    rank: q,
                    reason: format!(
                        "its window in slot {} does not hold {need} bytes at offset {}",
                        out.slot, out.offset
                    ),
                }),
            }
        };
        let at = |q: usize| (q * b) as u64;
        let copies: Vec<Copy> = match args.call.collective {
            Collective::AllGather => (0..n)
                .map(|q| Ok((q, peer_output(q)?.byte_add_cast(at(me)), input, b)))
                .collect::<Result<_>>()?,
            Collective::Broadcast if me == args.root() as usize => (0..n)
                .map(|q| Ok((q, peer_output(q)?, input, b)))
                .collect::<Result<_>>()?,
            _ => Vec::new(),
        };
        self.copies(cx, stream, &cx.others(), &copies)
    }

    /// Queues `copies` on the copy engines between two barriers with `peers`. The copy into
    /// this rank's own buffer runs on the side stream, beside the barrier and the copies over
    /// NVLink (another copy engine), and is joined before the closing barrier.
    fn copies(
        &self,
        cx: &Context,
        stream: &Stream,
        peers: &[usize],
        copies: &[Copy],
    ) -> Result<Queued> {
        let me = cx.rank();
        let local: Vec<_> = copies
            .iter()
            .filter(|&&(q, dst, src, _)| q == me && dst != src)
            .collect();
        if !local.is_empty() {
            // One stream when ranks share a GPU (`Context::shared_gpu`).
            let side = if cx.shared_gpu {
                stream
            } else {
                self.side.get()?
            };
            stream.record(&self.fork)?;
            side.wait_event(&self.fork)?;
            for &&(_, dst, src, len) in &local {
                // SAFETY: ranges of this rank's buffers of the sizes the caller's contract
                // gives; no peer touches them (they are this rank's own part).
                unsafe { copy_if_needed(side, dst, src, len)? };
            }
            side.record(&self.join)?;
        }
        direct::barrier(cx, &self.direct, stream, peers, 0)?;
        for &(q, dst, src, len) in copies {
            if q != me {
                // SAFETY: ranges of registered buffers of the sizes the caller's contract gives.
                unsafe { copy_if_needed(stream, dst, src, len)? };
            }
        }
        if !local.is_empty() {
            stream.wait_event(&self.join)?;
        }
        cx.record(Algorithm::CopyEngine);
        direct::barrier(cx, &self.direct, stream, peers, 0)?;
        Ok(Queued::Ran)
    }
}
