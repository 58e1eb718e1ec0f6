//! Collectives on a communicator: `all_reduce`, `all_gather`, `reduce_scatter`, `broadcast`,
//! `reduce`, `all_to_all`, `gather`, `scatter`, `all_to_allv`, `send` / `recv`, `send_recv`
//! and groups of any of them ([`Group`], NCCL's `ncclGroupStart` / `ncclGroupEnd`), every NCCL
//! data type and reduction, in place or out of place, any element count (zero included), on a
//! caller's stream. On a world of several nodes: every one but `reduce`, `gather`, `scatter`,
//! `all_to_allv` and groups, which are refused there (`Error::Unsupported`).
//!
//! [`Collectives::new`] on a world of one node connects every rank to every other (CUDA IPC /
//! shared memory), allocates a scratch buffer per rank that every peer maps, builds one row of
//! MemoryChannels (one per peer) for each block the kernels may use (`setup.rs`), and sets up
//! every algorithm. On a world of several nodes it connects every rank to every other with
//! PortChannels instead (the network between nodes), and builds the node communicator the
//! hierarchical all-reduce uses inside each node (`multinode.rs`). The kernels are in
//! `mscclpp_device::collectives`.
//!
//! Where things are:
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`Collectives`]: set-up, the public calls, and the dispatch (choose, queue, fall back) |
//! | `group.rs` | [`Group`] and the calls made of sends and receives (`gather`, `scatter`, `all_to_allv`) |
//! | `algo/` | one file per algorithm ([`Algorithm`]: `ll`, `ll128`, `ll_two_shot`, `staged`, `two_shot_put`, `direct`, `copy_engine`, `p2p`, `port`, `hierarchical`), each implementing one trait, registered by one line (`algo/mod.rs` says how to add one) |
//! | `select.rs` | the one selection table (collective, size, ranks, registered or not → algorithm) |
//! | `config.rs` | [`CollectiveConfig`], from one table of settings (defaults per backend, environment variables, limits) |
//! | `scratch.rs` | the scratch layout (LL16, LL128, staging regions; the copy-engine scratch) |
//! | `context.rs` | what the algorithms share: parameter blocks (the one place that sets a kernel's mode), health checks, the record of what ran |
//! | `registered.rs` | the callers' buffers registered on first use and exchanged on every call of the direct and copy-engine paths |
//! | `setup.rs` | the checks and the wiring of set-up |
//! | `multinode.rs` | worlds of several nodes: the transport to every peer, the port channels and their proxy, the node communicator |
//! | `node_bootstrap.rs` | the ranks of one node as a world of their own (the node communicator's bootstrap) |
//!
//! Algorithms (chosen by size unless the caller forces one with [`Algorithm`]; each file says
//! more, the selection table says when):
//! - `ll` (all-reduce up to `ll_max_bytes`; all-gather, reduce-scatter, all-to-all, broadcast
//!   and reduce up to `ll_part_max_bytes` per part): LL16 packets into every peer's scratch:
//!   one hop, no barrier.
//! - `ll128` (all-reduce from `ll128_min_bytes` to `ll128_max_bytes` on fewer than
//!   `ll_two_shot_min_ranks` ranks; all-gather and reduce-scatter parts from
//!   `ll128_part_min_bytes` to `ll128_max_bytes` on any number): the same with LL128 lines.
//! - `ll2` (all-reduce from `ll_two_shot_min_bytes` to `ll_max_bytes` on
//!   `ll_two_shot_min_ranks` ranks or more): an LL16 reduce-scatter and all-gather in one
//!   launch. Above `ll_max_bytes` those ranks go to the direct or copy-engine paths, not to
//!   LL128.
//! - `staged` (everything, any size): through the staging region, in pieces.
//! - `put` (all-reduce, any size): only writes cross the links.
//! - `direct` (every collective but the point-to-point ones, from `direct_min_bytes`): one
//!   kernel on the callers' registered buffers.
//! - `ce` (all-gather, broadcast, all-to-all from `ce_min_bytes`; all-reduce from
//!   `ce_all_reduce_min_bytes`): the copy engines on the registered buffers.
//! - `p2p` (every point-to-point call on a world of one node: `send`, `recv`, `send_recv`,
//!   `gather`, `scatter`, `all_to_allv`, a group's sends and receives): each pair of ranks in
//!   step on its own, LL16 packets up to `p2p_ll_bytes`, pipelined chunks beyond; a receive of
//!   another count than its send is refused (`Error::CountMismatch`) by the receiving kernel.
//! - `hier` (worlds of several nodes with as many ranks on each: all-reduce): reduce-scatter
//!   inside the node, all-reduce between same-index ranks over PortChannels, all-gather inside
//!   the node, pipelined in chunks.
//! - `port` (worlds of several nodes: everything else, `send` / `recv` / `send_recv`
//!   included): every collective through PortChannels to every rank.
//!
//! The direct and copy-engine paths cost one bootstrap message per peer per call (host side),
//! which a CUDA graph pays once, at capture. They need every buffer to be device memory this
//! process allocated with an exportable allocator (`cuMemAlloc`, e.g. PyTorch's caching
//! allocator), 16-byte aligned and a multiple of 16 bytes long, on at most
//! [`MAX_DIRECT_RANKS`](mscclpp_shared::MAX_DIRECT_RANKS) ranks; otherwise every rank takes
//! the staged path.
//!
//! Measured on 2×H200: see BENCHMARKS.md.
//!
//! Every rank must call the same collectives in the same order (as with NCCL); sends and
//! receives pair up between two ranks, in order, whatever call made each (`group.rs`).
//!
//! NCCL's edge cases: a call of zero elements succeeds and touches nothing (a point-to-point
//! one still pairs with its peer's, as NCCL's do); in place with NCCL's offsets works
//! (all-gather `input = output + rank * count`, reduce-scatter `output = input + rank *
//! count`, gather and scatter at the root's own part); a broadcast's non-roots may pass a null
//! input, a reduce's and a gather's non-roots a null output, a scatter's a null input.

mod algo;
mod config;
mod context;
mod group;
mod multinode;
mod node_bootstrap;
mod reduction;
mod registered;
mod scratch;
mod select;
#[cfg(test)]
mod select_pin;
mod setup;

pub use algo::{Algorithm, Collective};
pub use config::{CollectiveConfig, Limit, Setting};
pub use group::Group;
pub use multinode::{ENV_NET_TRANSPORT, network_transports};
pub use reduction::{KernelOp, Reduction, Scalar, element_bits};

use std::sync::Arc;

use mscclpp_host::Result;
use mscclpp_host::communicator::Communicator;
use mscclpp_host::gpu::{Module, Stream};
use mscclpp_host::transport::Transport;
use mscclpp_shared::{DataType, DevicePtr, DeviceReduceOp};

use algo::p2p::P2p;
use algo::{Queue, Queued, UNITS};
use context::{Args, CallScope, Context, Peer, SetUp, copy_if_needed};
use mscclpp_host::trace::Category;
use scratch::ScratchLayout;
use select::{Call, Choice};

/// The collectives of one communicator.
pub struct Collectives {
    /// Every algorithm's state, indexed by [`Algorithm`] (dropped first: streams, events).
    units: Vec<Box<dyn Queue>>,
    cx: Context,
    _module: Module,
}

/// Rows of channels for `cfg`: its `max_blocks`, raised to what every algorithm launches with.
pub(crate) fn channel_rows(cfg: &CollectiveConfig) -> u32 {
    UNITS
        .iter()
        .map(|u| (u.channel_rows)(cfg))
        .fold(cfg.max_blocks, u32::max)
}

/// What a world of several nodes refuses of the point-to-point engine (`Error::Unsupported`):
/// gather, scatter, all-to-all-v and a group's sends and receives (`send`, `recv` and
/// `send_recv` alone run through PortChannels there).
pub(crate) const P2P_ACROSS_NODES: &str = "gather, scatter, all_to_allv and a group's sends and \
    receives on a world of several nodes (they need one node; send, recv and send_recv alone \
    run across nodes)";

impl Collectives {
    /// Sets up collectives with the backend's default configuration. Every rank calls it.
    pub fn new(comm: Arc<Communicator>) -> Result<Self> {
        let cfg = CollectiveConfig::for_backend(comm.gpu().kind()).with_env();
        Self::with_config(comm, cfg)
    }

    /// Sets up collectives with `cfg`, which must be identical on every rank: a rank whose
    /// settings differ from another's gets `Error::ConfigMismatch` (and so does the other).
    pub fn with_config(comm: Arc<Communicator>, mut cfg: CollectiveConfig) -> Result<Self> {
        let trace = comm.trace().clone();
        let _span = trace.span(Category::Setup, "collectives");
        cfg.max_blocks = channel_rows(&cfg);
        setup::check_one_gpu_per_rank(&comm)?;
        setup::check_same_config(&comm, &cfg)?;
        let g = comm.gpu().clone();
        let module = g.load_ptx(crate::DEVICE_PTX)?;
        let s = SetUp {
            module: &module,
            gpu: &g,
        };
        let units = UNITS
            .iter()
            .map(|u| (u.set_up)(&s))
            .collect::<Result<Vec<_>>>()?;
        let (layout, wiring) = if comm.topology().nodes() > 1 {
            let layout = ScratchLayout::for_nodes(&cfg, comm.size());
            (layout, setup::wire_nodes(&comm, &cfg, &layout)?)
        } else {
            let layout = ScratchLayout::for_registered(&cfg, comm.size());
            (layout, setup::wire(&comm, &cfg, &layout)?)
        };
        if trace.is_on() {
            crate::trace::attach_with(&comm, &module, cfg.max_blocks);
        }
        Ok(Self {
            units,
            cx: Context::new(comm, cfg, layout, wiring),
            _module: module,
        })
    }

    /// The communicator.
    pub fn communicator(&self) -> &Arc<Communicator> {
        &self.cx.comm
    }

    /// The algorithm the last call on this rank actually ran (after any fallback from the
    /// direct paths to staging), or `None` before the first call.
    pub fn last_algorithm(&self) -> Option<Algorithm> {
        self.cx.last()
    }

    /// How many caller allocations the direct paths registered on this rank, and how many
    /// of the peers' allocations they mapped here (both only grow; see
    /// `collectives/registered.rs`).
    pub fn registered_buffers(&self) -> (usize, usize) {
        self.cx.buffers.counts()
    }

    /// The configuration in use.
    pub fn config(&self) -> CollectiveConfig {
        self.cx.cfg
    }

    /// The transport this rank's collectives use to reach every rank (`None` for this rank
    /// itself), on a world of several nodes; `None` on a world of one node (every peer is
    /// reached through the same-node transport's MemoryChannels).
    pub fn transports(&self) -> Option<Vec<Option<Transport>>> {
        self.cx.multi.as_ref().map(|m| m.transports.clone())
    }

    /// Payload bytes this rank's collectives sent to other nodes over `transport` so far (0 on
    /// a world of one node): how a test or tool sees that traffic crossed a transport.
    pub fn network_bytes_sent(&self, transport: Transport) -> u64 {
        self.cx
            .multi
            .as_ref()
            .map_or(0, |m| m.bytes_sent(transport))
    }

    /// All-reduce of `count` elements of `dtype` from `input` into `output` (they may be the
    /// same buffer), by `op`: a [`Reduction`] (sum, product, min, max, average, pre-multiplied
    /// sum) or a [`ReduceOp`](mscclpp_shared::ReduceOp).
    ///
    /// # Safety
    /// `input` and `output` are device buffers of at least `count` elements, valid until the
    /// work queued on `stream` completes (as is a [`Scalar::Device`]); every rank makes the
    /// same call.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_reduce(
        &self,
        input: DevicePtr<u8>,
        output: DevicePtr<u8>,
        count: usize,
        dtype: DataType,
        op: impl Into<Reduction>,
        stream: &Stream,
        algo: Option<Algorithm>,
    ) -> Result<()> {
        let op = self.lower(op.into(), dtype)?;
        let call = self.call(Collective::AllReduce, count, dtype, op);
        // SAFETY: the caller's contract.
        unsafe { self.run(self.args(call, input, output, Peer::None), algo, stream) }
    }

    /// All-gather: every rank's `count` elements land at `output[rank * count ..]` on every
    /// rank. `algo` forces one of the algorithms that serve it ([`Algorithm::serves`]).
    ///
    /// # Safety
    /// `input` holds `count` elements, `output` `nranks * count`; valid until the queued work
    /// completes; every rank makes the same call.
    pub unsafe fn all_gather(
        &self,
        input: DevicePtr<u8>,
        output: DevicePtr<u8>,
        count: usize,
        dtype: DataType,
        stream: &Stream,
        algo: Option<Algorithm>,
    ) -> Result<()> {
        let call = self.call(Collective::AllGather, count, dtype, Context::MOVE.1);
        // SAFETY: the caller's contract.
        unsafe { self.run(self.args(call, input, output, Peer::None), algo, stream) }
    }

    /// Reduce-scatter: `input` holds `nranks * count` elements; rank r receives the reduction
    /// by `op` (a [`Reduction`] or a [`ReduceOp`](mscclpp_shared::ReduceOp)) of every rank's part r (`count` elements)
    /// in `output`. `algo` forces one of the algorithms that serve it.
    ///
    /// # Safety
    /// As [`Collectives::all_gather`], with `input` of `nranks * count` and `output` of `count`
    /// (and a [`Scalar::Device`] valid until the queued work completes).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce_scatter(
        &self,
        input: DevicePtr<u8>,
        output: DevicePtr<u8>,
        count: usize,
        dtype: DataType,
        op: impl Into<Reduction>,
        stream: &Stream,
        algo: Option<Algorithm>,
    ) -> Result<()> {
        let op = self.lower(op.into(), dtype)?;
        let call = self.call(Collective::ReduceScatter, count, dtype, op);
        // SAFETY: the caller's contract.
        unsafe { self.run(self.args(call, input, output, Peer::None), algo, stream) }
    }

    /// Broadcast of `root`'s `count` elements into every rank's `output`. `algo` forces one
    /// of the algorithms that serve it. Other ranks' `input` is not read and may be null.
    ///
    /// # Safety
    /// `input` (read on the root) and `output` hold `count` elements; as above.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn broadcast(
        &self,
        input: DevicePtr<u8>,
        output: DevicePtr<u8>,
        count: usize,
        dtype: DataType,
        root: usize,
        stream: &Stream,
        algo: Option<Algorithm>,
    ) -> Result<()> {
        self.check_rank(root)?;
        let call = self.call(Collective::Broadcast, count, dtype, Context::MOVE.1);
        // SAFETY: the caller's contract.
        unsafe {
            self.run(
                self.args(call, input, output, Peer::Root(root)),
                algo,
                stream,
            )
        }
    }

    /// Reduce to `root` (NCCL's `ncclReduce`): `count` elements of every rank's `input`
    /// reduced by `op` (a [`Reduction`] or a [`ReduceOp`](mscclpp_shared::ReduceOp)) into the
    /// root's `output` (which may be its `input`). Other ranks' `output` is not touched and
    /// may be null. `algo` forces one of the algorithms that serve it (`ll`, `staged`,
    /// `direct`).
    ///
    /// # Safety
    /// `input` holds `count` elements, the root's `output` too; valid until the queued work
    /// completes (as is a [`Scalar::Device`]); every rank makes the same call.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce(
        &self,
        input: DevicePtr<u8>,
        output: DevicePtr<u8>,
        count: usize,
        dtype: DataType,
        op: impl Into<Reduction>,
        root: usize,
        stream: &Stream,
        algo: Option<Algorithm>,
    ) -> Result<()> {
        self.check_rank(root)?;
        let op = self.lower(op.into(), dtype)?;
        let call = self.call(Collective::Reduce, count, dtype, op);
        // SAFETY: the caller's contract.
        unsafe {
            self.run(
                self.args(call, input, output, Peer::Root(root)),
                algo,
                stream,
            )
        }
    }

    /// All-to-all: part p (`count` elements) of every rank's `input` lands as part r of rank
    /// p's `output`. `algo` forces one of the algorithms that serve it (`direct` and `ce` need
    /// disjoint `input` and `output`; in place, every rank stages).
    ///
    /// # Safety
    /// `input` and `output` hold `nranks * count` elements; as above.
    pub unsafe fn all_to_all(
        &self,
        input: DevicePtr<u8>,
        output: DevicePtr<u8>,
        count: usize,
        dtype: DataType,
        stream: &Stream,
        algo: Option<Algorithm>,
    ) -> Result<()> {
        let call = self.call(Collective::AllToAll, count, dtype, Context::MOVE.1);
        // SAFETY: the caller's contract.
        unsafe { self.run(self.args(call, input, output, Peer::None), algo, stream) }
    }

    /// Sends `count` elements to `peer`, which receives them with [`Collectives::recv`] (or a
    /// receive of a [`Group`] or `send_recv`: sends and receives pair up in order whatever
    /// call made each). A receive posted with another count gets `Error::CountMismatch`.
    ///
    /// # Safety
    /// `input` holds `count` elements until the queued work completes.
    pub unsafe fn send(
        &self,
        input: DevicePtr<u8>,
        count: usize,
        dtype: DataType,
        peer: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.check_peer(peer)?;
        let call = self.one_way(count, dtype);
        let args = self.args(call, input, DevicePtr::NULL, Peer::To(peer));
        // SAFETY: the caller's contract.
        unsafe { self.run(args, None, stream) }
    }

    /// Receives `count` elements from `peer` (which sends them with [`Collectives::send`], a
    /// [`Group`] or `send_recv`). A message of another count is refused: nothing is written,
    /// and this rank's next call (and `status().error()`) returns `Error::CountMismatch`.
    ///
    /// # Safety
    /// `output` holds `count` elements until the queued work completes.
    pub unsafe fn recv(
        &self,
        output: DevicePtr<u8>,
        count: usize,
        dtype: DataType,
        peer: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.check_peer(peer)?;
        let call = self.one_way(count, dtype);
        let args = self.args(call, DevicePtr::NULL, output, Peer::From(peer));
        // SAFETY: the caller's contract.
        unsafe { self.run(args, None, stream) }
    }

    /// Sends `count` elements of `input` to `next` and receives as many from `prev` into
    /// `output`, both at once (a [`Group`] of a send and a receive, as a grouped `ncclSend` +
    /// `ncclRecv`): any pattern of pairs works (a ring, pairs of equal parity, `next ==
    /// prev`).
    ///
    /// # Safety
    /// `input` and `output` hold `count` elements, do not overlap, and stay valid until the
    /// queued work completes; `next` calls this with this rank as its `prev`, and `prev` with
    /// this rank as its `next`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn send_recv(
        &self,
        input: DevicePtr<u8>,
        next: usize,
        output: DevicePtr<u8>,
        prev: usize,
        count: usize,
        dtype: DataType,
        stream: &Stream,
    ) -> Result<()> {
        self.check_peer(next)?;
        self.check_peer(prev)?;
        let call = self.call(Collective::SendRecv, count, dtype, Context::MOVE.1);
        let args = self.args(call, input, output, Peer::Pair { next, prev });
        // SAFETY: the caller's contract.
        unsafe { self.run(args, None, stream) }
    }

    /// `op` on `dtype` as the kernels take it ([`Reduction::lower`]).
    fn lower(&self, op: Reduction, dtype: DataType) -> Result<KernelOp> {
        op.lower(dtype, self.cx.ranks(), self.cx.comm.gpu().ordinal())
    }

    fn call(&self, collective: Collective, count: usize, dtype: DataType, op: KernelOp) -> Call {
        let topology = self.cx.comm.topology();
        Call {
            collective,
            one_way: false,
            bytes: count * dtype.size(),
            ranks: self.cx.ranks(),
            nodes: topology.nodes(),
            uniform: topology.uniform().is_ok(),
            dtype,
            op,
        }
    }

    fn one_way(&self, count: usize, dtype: DataType) -> Call {
        Call {
            one_way: true,
            ..self.call(Collective::SendRecv, count, dtype, Context::MOVE.1)
        }
    }

    fn args(&self, call: Call, input: DevicePtr<u8>, output: DevicePtr<u8>, peer: Peer) -> Args {
        Args {
            call,
            input,
            output,
            peer,
        }
    }

    /// Queues one public call ([`dispatch`](Self::dispatch)), as one `call` span of the trace
    /// (op, bytes, type, operator, algorithm, stream, call id) whose id every launch it makes
    /// carries.
    ///
    /// # Safety
    /// The public call's contract for `args`.
    unsafe fn run(&self, args: Args, forced: Option<Algorithm>, stream: &Stream) -> Result<()> {
        let trace = self.cx.comm.trace();
        if !trace.is_on() {
            // SAFETY: the caller's contract.
            return unsafe { self.dispatch(args, forced, stream) };
        }
        let id = trace.next_call();
        let _scope = CallScope::enter(id);
        let call = &args.call;
        let mut span = trace
            .span(Category::Call, op_name(&args))
            .arg("call", id)
            .arg("bytes", call.bytes)
            .arg("dtype", format!("{:?}", call.dtype))
            .arg("op", format!("{:?}", call.op.op))
            .arg("ranks", call.ranks)
            .arg(
                "stream",
                stream.cuda_raw().unwrap_or(stream as *const Stream as u64),
            );
        match args.peer {
            Peer::Root(r) => span.set("root", r),
            Peer::To(r) | Peer::From(r) => span.set("peer", r),
            Peer::Pair { next, prev } => {
                span.set("next", next);
                span.set("prev", prev);
            }
            Peer::None => {}
        }
        // SAFETY: the caller's contract.
        let result = unsafe { self.dispatch(args, forced, stream) };
        match (&result, self.cx.last()) {
            (Ok(()), Some(a)) => span.set("algorithm", a.name()),
            (Ok(()), None) => {}
            (Err(e), _) => span.set("error", e.to_string()),
        }
        result
    }

    /// The point-to-point engine (a world of one node only: it needs MemoryChannels to every
    /// peer).
    fn p2p(&self) -> Result<&P2p> {
        if self.cx.multi.is_some() {
            return Err(self.cx.cannot(P2P_ACROSS_NODES));
        }
        self.units[Algorithm::P2p as usize]
            .as_any()
            .downcast_ref::<P2p>()
            .ok_or_else(|| {
                self.cx
                    .cannot("a point-to-point engine registered elsewhere")
            })
    }

    /// The dispatch (what `select::decide` models): a call of zero elements queues nothing
    /// (but a point-to-point one, which pairs with its peer's); an all-reduce or a reduce on
    /// one rank copies; else
    /// the forced algorithm or the selection table's choice queues the call; an algorithm on
    /// registered buffers that declines it (some rank's buffers cannot be shared) leaves it to
    /// the table's first algorithm that needs none, unless it was forced (then the call is
    /// refused, on every rank alike).
    ///
    /// # Safety
    /// The public call's contract for `args`.
    unsafe fn dispatch(
        &self,
        args: Args,
        forced: Option<Algorithm>,
        stream: &Stream,
    ) -> Result<()> {
        let (cx, call) = (&self.cx, &args.call);
        if call.bytes == 0 && call.collective != Collective::SendRecv {
            return Ok(());
        }
        let mut forced = forced;
        let rooted = matches!(call.collective, Collective::AllReduce | Collective::Reduce);
        if rooted && call.ranks == 1 {
            if call.op.op != DeviceReduceOp::PreMulSum {
                // SAFETY: the caller's contract.
                return unsafe { copy_if_needed(stream, args.output, args.input, call.bytes) };
            }
            // One rank still multiplies its contribution (as NCCL does): through staging,
            // which serves any size.
            forced = Some(Algorithm::Staged);
        }
        let cannot = |w| cx.cannot(w);
        let mut choice = select::choose(&cx.cfg, call, forced, true).map_err(cannot)?;
        loop {
            let Choice::Run(a) = choice;
            match self.units[a as usize].queue(cx, &args, stream)? {
                Queued::Ran => return Ok(()),
                Queued::Declined if forced.is_some() || !a.unit().registered => {
                    return Err(cx.cannot(select::DECLINED));
                }
                Queued::Declined => {
                    choice = select::choose(&cx.cfg, call, None, false).map_err(cannot)?;
                }
            }
        }
    }

    fn check_rank(&self, r: usize) -> Result<()> {
        if r < self.cx.ranks() {
            Ok(())
        } else {
            Err(mscclpp_host::Error::NoSuchRank {
                rank: r,
                size: self.cx.ranks(),
            })
        }
    }

    fn check_peer(&self, r: usize) -> Result<()> {
        self.check_rank(r)?;
        if r == self.cx.rank() {
            return Err(mscclpp_host::Error::PeerIsSelf { rank: r });
        }
        Ok(())
    }
}

/// A call's name in the trace: the public function's.
fn op_name(args: &Args) -> &'static str {
    match (args.call.collective, args.peer) {
        (Collective::AllReduce, _) => "all_reduce",
        (Collective::AllGather, _) => "all_gather",
        (Collective::ReduceScatter, _) => "reduce_scatter",
        (Collective::Broadcast, _) => "broadcast",
        (Collective::AllToAll, _) => "all_to_all",
        (Collective::Reduce, _) => "reduce",
        (Collective::SendRecv, Peer::To(_)) => "send",
        (Collective::SendRecv, Peer::From(_)) => "recv",
        (Collective::SendRecv, _) => "send_recv",
    }
}
