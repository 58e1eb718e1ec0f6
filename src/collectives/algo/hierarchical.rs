//! `hier`: the hierarchical all-reduce of a world of several nodes with the same number `L` of
//! ranks on each — NVLink inside the node, the network between nodes, and both at once.
//!
//! # Large calls: a pipeline of chunks
//!
//! The buffer is cut into chunks of about `hier_chunk_bytes` (whole multiples of `L` parts of
//! 16 bytes); for each chunk `c`, on local index `l`:
//!
//! 1. **reduce-scatter inside the node** (the node's world, `multinode::NodeWorld`: LL, LL128,
//!    direct, … as its own planner picks) of the chunk, part `l` landing in place in the
//!    output;
//! 2. **all-reduce of part `l` across nodes** between the ranks of local index `l` (this rank's
//!    column), by the port kernel over PortChannels (`launch/port.rs`), on a stream of its own;
//! 3. **all-gather inside the node** of the chunk's parts, in place.
//!
//! Step 2 of chunk `c` waits (an event) for step 1 of `c`; step 3 of `c` waits for step 2 of
//! `c`; the node's steps run in the order 1(0), …, 1(D-1), 3(0), 1(D), 3(1), … with
//! `D = hier_pipeline_depth`, so the network phase of chunk `c` overlaps the node phases of the
//! chunks around it. The caller's stream ends after the last all-gather, which waited for the
//! last network phase; the network stream starts after everything queued on the caller's
//! stream before the call.
//!
//! # Small calls: the latency path
//!
//! Up to `hier_small_max_bytes` (and the tail of a call that is not a whole number of
//! `L × 16`-byte units): one all-reduce inside the node (LL packets: one hop), then one port
//! exchange of the whole buffer with the column (one hop across the network). With `L = 1` the
//! exchange is the whole algorithm.
//!
//! # Operators across the two levels
//!
//! Every contribution is pre-multiplied once and every result divided once
//! (`mscclpp_device::reduce`): a pre-multiplied sum (and a floating average) multiplies at the
//! first level that reduces the callers' inputs — inside the node when `L > 1`, else across
//! nodes — and the other level sums; an integer average sums inside the node and divides by the
//! world's size across nodes. Sum, product, min and max are the same at both levels. Every rank
//! of a column reduces in the same (rank) order, so the ranks that share an element compute
//! the same bits, and the all-gather spreads them.

use mscclpp_host::Result;
use mscclpp_host::gpu::{Kernel, LazyStream, Stream};
use mscclpp_shared::{CollectiveMode, DevicePtr, DeviceReduceOp, PortCollectiveParams};

use crate::collectives::algorithm::{Algorithm, Collective};
use crate::collectives::call::Call;
use crate::collectives::context::{Args, Context, SetUp};
use crate::collectives::launch::port::{Exchange, exchange, mask_of};
use crate::collectives::multinode::NodeWorld;
use crate::collectives::reduction::{KernelOp, Reduction, Scalar};
use crate::collectives::scratch::Region;
use crate::collectives::unit::{CollectiveAlgorithm, Queued, Step};
use crate::kernels;

pub(crate) struct Hierarchical {
    kernel: Kernel<PortCollectiveParams>,
    /// The network phase's stream.
    net: LazyStream,
}

/// The operator of the node level and of the network level for `op` on `l` ranks per node
/// (module docs).
pub(crate) fn split(op: KernelOp, l: usize) -> (KernelOp, KernelOp) {
    let sum = KernelOp::plain(DeviceReduceOp::Sum);
    match op.op {
        DeviceReduceOp::PreMulSum if l > 1 => (op, sum),
        DeviceReduceOp::SumPostDiv if l > 1 => (sum, op),
        _ => (op, op),
    }
}

/// A node-level operator as the node's world takes it (never a post-division: `split` keeps
/// those for the network level).
fn as_reduction(op: KernelOp) -> Reduction {
    match op.op {
        DeviceReduceOp::Sum | DeviceReduceOp::SumPostDiv => Reduction::Sum,
        DeviceReduceOp::Prod => Reduction::Prod,
        DeviceReduceOp::Min => Reduction::Min,
        DeviceReduceOp::Max => Reduction::Max,
        DeviceReduceOp::PreMulSum if op.scalar_ptr.is_null() => {
            Reduction::PreMulSum(Scalar::Host(op.scalar))
        }
        DeviceReduceOp::PreMulSum => Reduction::PreMulSum(Scalar::Device(op.scalar_ptr)),
    }
}

/// One chunk of the pipeline: its first element and elements.
#[derive(Clone, Copy)]
struct Chunk {
    start: usize,
    len: usize,
}

impl CollectiveAlgorithm for Hierarchical {
    const ALGORITHM: Algorithm = Algorithm::Hierarchical;
    const NAME: &'static str = "hier";
    const ALIASES: &'static [&'static str] = &["hierarchical", "2d"];
    const SERVES: &'static [Collective] = &[Collective::AllReduce];
    const NOT_SERVED: &'static str = "a hierarchical variant of this collective (all-reduce only)";
    const SCRATCH: &'static [Region] = &[Region::Port];

    fn serves_nodes(nodes: usize, uniform: bool) -> Result<(), &'static str> {
        if nodes > 1 && uniform {
            Ok(())
        } else {
            Err("a world of several nodes with the same number of ranks on each")
        }
    }

    fn set_up(s: &SetUp<'_>) -> Result<Self> {
        Ok(Self {
            kernel: s.kernel(kernels::PORT_COLLECTIVE)?,
            net: LazyStream::new(s.gpu),
        })
    }

    fn queue(&self, cx: &Context, args: &Args, _: &Step, stream: &Stream) -> Result<Queued> {
        let Some(m) = cx.multi.as_ref() else {
            return Err(cx.cannot("the hierarchical all-reduce on a world of one node"));
        };
        let Some(l_count) = m.uniform else {
            return Err(cx.cannot("the hierarchical all-reduce on nodes of different sizes"));
        };
        let call = &args.call;
        let es = call.dtype.size();
        let count = call.bytes / es;
        let (node_op, net_op) = split(call.op, l_count);
        let column = mask_of(m.topology.column(), cx.rank());
        let node = m.node.as_deref();
        cx.record(Algorithm::Hierarchical);
        let ptr = |p: DevicePtr<u8>, elems: usize| p.byte_add_cast((elems * es) as u64);
        // The latency path (module docs) over `[from, from + n)` elements.
        let small = |from: usize, n: usize| -> Result<()> {
            let (input, output) = (ptr(args.input, from), ptr(args.output, from));
            let src = match node {
                Some(node) => {
                    let c = Call::AllReduce {
                        input,
                        output,
                        count: n,
                        dtype: call.dtype,
                        op: as_reduction(node_op),
                    };
                    // SAFETY: the caller's contract (both hold `count` elements).
                    unsafe { node.queue(&c, stream) }?;
                    output
                }
                None => input,
            };
            let x = Exchange {
                mode: CollectiveMode::AllReduce,
                data: (call.dtype, net_op),
                input: src,
                output,
                bytes: n * es,
                stride: 0,
                root: 0,
                send_mask: column,
                recv_mask: column,
            };
            // SAFETY: as above; every rank of the column queues the same exchange.
            unsafe { exchange(cx, &self.kernel, x, stream) }
        };
        let unit = l_count * (16 / es).max(1);
        let body = count / unit * unit;
        let Some(node) = node.filter(|_| call.bytes > cx.cfg.hier_small_max_bytes && body > 0)
        else {
            small(0, count)?;
            return Ok(Queued::Ran);
        };
        let per_chunk = (cx.cfg.hier_chunk_bytes / es / unit * unit).max(unit);
        let chunks: Vec<Chunk> = (0..body.div_ceil(per_chunk))
            .map(|c| Chunk {
                start: c * per_chunk,
                len: per_chunk.min(body - c * per_chunk),
            })
            .collect();
        let l = m.topology.local_index();
        let shard = |c: Chunk| ptr(args.output, c.start + l * (c.len / l_count));
        let gpu = cx.comm.gpu();
        let depth = cx.cfg.hier_pipeline_depth.max(1);
        let start = gpu.event()?;
        stream.record(&start)?;
        let net = self.net.get()?;
        net.wait_event(&start)?;
        let mut done = Vec::with_capacity(chunks.len());
        let gather = |c: Chunk, node: &dyn NodeWorld| -> Result<()> {
            let g = Call::AllGather {
                input: shard(c),
                output: ptr(args.output, c.start),
                count: c.len / l_count,
                dtype: call.dtype,
            };
            // SAFETY: in place inside the caller's output (the chunk's parts).
            unsafe { node.queue(&g, stream) }
        };
        for (i, &c) in chunks.iter().enumerate() {
            let part = c.len / l_count;
            let rs = Call::ReduceScatter {
                input: ptr(args.input, c.start),
                output: shard(c),
                count: part,
                dtype: call.dtype,
                op: as_reduction(node_op),
            };
            // SAFETY: the chunk lies inside both buffers; part `l` lands in place in the output.
            unsafe { node.queue(&rs, stream) }?;
            let reduced = gpu.event()?;
            stream.record(&reduced)?;
            net.wait_event(&reduced)?;
            let x = Exchange {
                mode: CollectiveMode::AllReduce,
                data: (call.dtype, net_op),
                input: shard(c),
                output: shard(c),
                bytes: part * es,
                stride: 0,
                root: 0,
                send_mask: column,
                recv_mask: column,
            };
            // SAFETY: in place on this rank's part of the chunk; every rank of the column
            // queues the same exchange.
            unsafe { exchange(cx, &self.kernel, x, net) }?;
            let crossed = gpu.event()?;
            net.record(&crossed)?;
            done.push(crossed);
            if i + 1 >= depth {
                let j = i + 1 - depth;
                stream.wait_event(&done[j])?;
                gather(chunks[j], node)?;
            }
        }
        for j in (chunks.len() + 1).saturating_sub(depth)..chunks.len() {
            stream.wait_event(&done[j])?;
            gather(chunks[j], node)?;
        }
        if body < count {
            small(body, count - body)?;
        }
        Ok(Queued::Ran)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mscclpp_shared::DataType;

    #[test]
    fn operators_apply_once_across_both_levels() {
        let sum = KernelOp::plain(DeviceReduceOp::Sum);
        let avg_f = Reduction::Avg.lower(DataType::F32, 8, 0).unwrap();
        let avg_i = Reduction::Avg.lower(DataType::I32, 8, 0).unwrap();
        let pre = Reduction::PreMulSum(Scalar::Host(0x4000_0000))
            .lower(DataType::F32, 8, 0)
            .unwrap();
        // Several ranks per node: multiply inside the node, divide across nodes.
        assert_eq!(split(avg_f, 4), (avg_f, sum));
        assert_eq!(split(pre, 4), (pre, sum));
        assert_eq!(split(avg_i, 4), (sum, avg_i));
        assert_eq!(avg_i.scalar, 8, "divided by the world's size");
        // One rank per node: the network level does both.
        assert_eq!(split(avg_f, 1).1, avg_f);
        assert_eq!(split(avg_i, 1).1, avg_i);
        for op in [
            DeviceReduceOp::Sum,
            DeviceReduceOp::Prod,
            DeviceReduceOp::Min,
            DeviceReduceOp::Max,
        ] {
            let k = KernelOp::plain(op);
            assert_eq!(split(k, 4), (k, k));
        }
        assert_eq!(
            as_reduction(pre),
            Reduction::PreMulSum(Scalar::Host(0x4000_0000))
        );
        let dev = KernelOp {
            scalar_ptr: DevicePtr::from_addr(0x1000),
            ..pre
        };
        assert_eq!(
            as_reduction(dev),
            Reduction::PreMulSum(Scalar::Device(DevicePtr::from_addr(0x1000)))
        );
        assert_eq!(as_reduction(sum), Reduction::Sum);
    }
}
