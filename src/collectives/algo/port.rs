//! `port`: every collective of a world of several nodes through PortChannels to every rank —
//! the network (libfabric, InfiniBand, Ethernet) to ranks on other nodes, the copy engines to
//! ranks on this one — piece by piece in one block (`port_collective_kernel`,
//! `mscclpp_device::collectives::port`), through the port region of the scratch. What every
//! collective of such a world takes but the hierarchical all-reduce (and its all-reduce where
//! the nodes run different numbers of ranks: every rank exchanges the whole buffer with every
//! other and reduces it in rank order, so every rank computes the same bits). Its launch
//! (`launch/port.rs`) is also the network phase of the hierarchical all-reduce.

use mscclpp_host::Result;
use mscclpp_host::gpu::{Kernel, Stream};
use mscclpp_shared::{CollectiveMode, DevicePtr, PortCollectiveParams};

use crate::collectives::algorithm::{Algorithm, Collective};
use crate::collectives::context::{Args, Context, Peer, SetUp, copy_if_needed};
use crate::collectives::launch::port::{Exchange, exchange, mask_of};
use crate::collectives::scratch::Region;
use crate::collectives::unit::{CollectiveAlgorithm, Queued, Step};
use crate::kernels;

pub(crate) struct Port {
    kernel: Kernel<PortCollectiveParams>,
}

impl CollectiveAlgorithm for Port {
    const ALGORITHM: Algorithm = Algorithm::Port;
    const NAME: &'static str = "port";
    const ALIASES: &'static [&'static str] = &["proxy", "port-channel"];
    const SERVES: &'static [Collective] = &[
        Collective::AllReduce,
        Collective::Reduce,
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

    fn queue(&self, cx: &Context, args: &Args, _: &Step, stream: &Stream) -> Result<Queued> {
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
            (Collective::Reduce, Peer::Root(root)) => Exchange {
                mode: CollectiveMode::Reduce,
                data: (call.dtype, call.op),
                send_mask: if root == me { 0 } else { mask_of([root], me) },
                recv_mask: if root == me { all } else { 0 },
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
