//! `port`: every collective of a world of several nodes through PortChannels to every rank —
//! the network (libfabric, InfiniBand, Ethernet) to ranks on other nodes, the copy engines to
//! ranks on this one — piece by piece in one block (`port_collective_kernel`,
//! `mscclpp_device::collectives::port`), through the port region of the scratch. What every
//! collective of such a world takes but the hierarchical all-reduce (and its all-reduce where
//! the nodes run different numbers of ranks: every rank exchanges the whole buffer with every
//! other and reduces it in rank order, so every rank computes the same bits). Also the network
//! phase of the hierarchical all-reduce ([`exchange`]).

use mscclpp_host::Result;
use mscclpp_host::gpu::{Kernel, LaunchConfig, Stream};
use mscclpp_shared::{CollectiveMode, DataType, DevicePtr, PortCollectiveParams};

use super::{Algorithm, Collective, CollectiveAlgorithm, Queued};
use crate::collectives::context::{Args, Context, Peer, SetUp, copy_if_needed};
use crate::collectives::reduction::KernelOp;
use crate::collectives::scratch::Region;
use crate::kernels;

pub(crate) struct Port {
    kernel: Kernel<PortCollectiveParams>,
}

/// One launch of the port kernel, as [`exchange`] queues it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Exchange {
    pub mode: CollectiveMode,
    pub data: (DataType, KernelOp),
    pub input: DevicePtr<u8>,
    pub output: DevicePtr<u8>,
    /// Bytes per peer.
    pub bytes: usize,
    /// Distance between parts (all-gather, all-to-all, reduce-scatter).
    pub stride: usize,
    pub root: u32,
    pub send_mask: u64,
    pub recv_mask: u64,
}

/// Bit `q` for every rank `q` of `ranks` but `me`.
pub(crate) fn mask_of(ranks: impl IntoIterator<Item = usize>, me: usize) -> u64 {
    ranks
        .into_iter()
        .filter(|&q| q != me && q < 64)
        .fold(0, |m, q| m | 1 << q)
}

/// Queues one port-kernel launch on `stream` (nothing for zero bytes).
///
/// # Safety
/// `input` / `output` hold what `x.mode` reads and writes (`PortCollectiveParams`) until the
/// queued work completes; every rank in the masks queues the matching launch.
pub(crate) unsafe fn exchange(
    cx: &Context,
    kernel: &Kernel<PortCollectiveParams>,
    x: Exchange,
    stream: &Stream,
) -> Result<()> {
    let Some(m) = cx.multi.as_ref() else {
        return Err(cx.cannot("the port collective on a world of one node"));
    };
    if x.bytes == 0 || (x.send_mask == 0 && x.recv_mask == 0) {
        return Ok(());
    }
    cx.ensure_healthy()?;
    let mut common = cx.params(x.mode, x.data);
    common.input = x.input;
    common.output = x.output;
    common.bytes = x.bytes as u64;
    common.stride = x.stride as u64;
    common.root = x.root;
    let p = PortCollectiveParams {
        common,
        port_channels: m.table.ptr().cast(),
        counters: m.counters.ptr().cast(),
        send_mask: x.send_mask,
        recv_mask: x.recv_mask,
        port_offset: cx.layout.port_offset(),
        slot_bytes: cx.layout.port_slot_bytes(),
    };
    // SAFETY: the caller's contract for the buffers; the scratch, channel table and counters
    // live as long as the `Collectives`.
    unsafe { stream.launch(kernel, LaunchConfig::new(1, cx.cfg.port_threads), p) }
}

impl CollectiveAlgorithm for Port {
    const ALGORITHM: Algorithm = Algorithm::Port;
    const NAME: &'static str = "port";
    const ALIASES: &'static [&'static str] = &["proxy", "port-channel"];
    const SERVES: &'static [Collective] = &[
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::AllToAll,
    ];
    const NOT_SERVED: &'static str = "a port variant of this collective";
    const POINT_TO_POINT: bool = true;
    const SCRATCH: &'static [Region] = &[Region::Port];

    fn serves_nodes(nodes: usize, _uniform: bool) -> Result<(), &'static str> {
        if nodes > 1 {
            Ok(())
        } else {
            Err("a world of several nodes (its port channels are set up only there)")
        }
    }

    fn set_up(s: &SetUp<'_>) -> Result<Self> {
        Ok(Self {
            kernel: s.kernel(kernels::PORT_COLLECTIVE)?,
        })
    }

    fn queue(&self, cx: &Context, args: &Args, stream: &Stream) -> Result<Queued> {
        let (call, n, me) = (&args.call, cx.ranks(), cx.rank());
        let b = call.bytes;
        let all = mask_of(0..n, me);
        let x = Exchange {
            mode: CollectiveMode::AllReduce,
            data: Context::MOVE,
            input: args.input,
            output: args.output,
            bytes: b,
            stride: b,
            root: args.root(),
            send_mask: all,
            recv_mask: all,
        };
        let at = |p: DevicePtr<u8>, q: usize| p.byte_add_cast((q * b) as u64);
        let x = match (call.collective, args.peer) {
            (Collective::AllReduce, _) => Exchange {
                data: (call.dtype, call.op),
                ..x
            },
            (Collective::ReduceScatter, _) => Exchange {
                mode: CollectiveMode::ReduceScatter,
                data: (call.dtype, call.op),
                ..x
            },
            (Collective::AllGather, _) => {
                // SAFETY: the caller's contract (output holds n parts).
                unsafe { copy_if_needed(stream, at(args.output, me), args.input, b) }?;
                Exchange {
                    mode: CollectiveMode::AllGather,
                    ..x
                }
            }
            (Collective::AllToAll, _) => {
                // SAFETY: the caller's contract (both hold n parts).
                unsafe { copy_if_needed(stream, at(args.output, me), at(args.input, me), b) }?;
                Exchange {
                    mode: CollectiveMode::AllToAll,
                    ..x
                }
            }
            (Collective::Broadcast, Peer::Root(root)) if root == me => {
                // SAFETY: the caller's contract.
                unsafe { copy_if_needed(stream, args.output, args.input, b) }?;
                Exchange {
                    mode: CollectiveMode::Broadcast,
                    recv_mask: 0,
                    ..x
                }
            }
            (Collective::Broadcast, Peer::Root(root)) => Exchange {
                mode: CollectiveMode::Broadcast,
                send_mask: 0,
                recv_mask: mask_of([root], me),
                ..x
            },
            (Collective::SendRecv, Peer::Pair { next, prev }) => Exchange {
                mode: CollectiveMode::Send,
                send_mask: mask_of([next], me),
                recv_mask: mask_of([prev], me),
                ..x
            },
            (Collective::SendRecv, Peer::To(q)) => Exchange {
                mode: CollectiveMode::Send,
                send_mask: mask_of([q], me),
                recv_mask: 0,
                ..x
            },
            (Collective::SendRecv, Peer::From(q)) => Exchange {
                mode: CollectiveMode::Recv,
                send_mask: 0,
                recv_mask: mask_of([q], me),
                ..x
            },
            _ => return Err(cx.cannot("this call on the port collective")),
        };
        cx.record(Algorithm::Port);
        // SAFETY: the caller's contract for the buffers; every rank makes the same call, so the
        // ranks in the masks queue the matching launches.
        unsafe { exchange(cx, &self.kernel, x, stream) }?;
        Ok(Queued::Ran)
    }
}
