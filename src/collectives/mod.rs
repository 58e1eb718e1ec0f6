//! Collectives on a communicator: `all_reduce`, `all_gather`, `reduce_scatter`, `broadcast`,
//! `reduce`, `all_to_all`, `gather`, `scatter`, `all_to_allv`, `send` / `recv`, `send_recv`
//! and groups of any of them ([`Group`], NCCL's `ncclGroupStart` / `ncclGroupEnd`), every NCCL
//! data type and reduction, in place or out of place, any element count (zero included), on a
//! caller's stream. On a world of several nodes: every one but `reduce`, `gather`, `scatter`,
//! `all_to_allv` and groups, which are refused there (`Error::Unsupported`).
//!
//! [`Collectives::new`] on a world of one node connects every rank to every other (CUDA IPC /
//! shared memory), allocates a scratch buffer per rank that every peer maps (the LL16 region,
//! the descriptors and the point-to-point region; the others on first use, `scratch.rs`),
//! builds one row of MemoryChannels (one per peer) for each block the kernels may use
//! (`setup.rs`), starts the registration service (`registry.rs`) and sets up every algorithm.
//! On a world of several nodes it connects every rank to every other with PortChannels instead
//! (the network between nodes), and builds the node communicator the hierarchical all-reduce
//! uses inside each node (`multinode.rs`). The built-in kernels' module is loaded once per
//! device and shared (a split's collectives reuse it). The kernels are in
//! `mscclpp_device::collectives`.
//!
//! Three ways to call: the raw `unsafe` calls on any device memory and any stream (a caller's,
//! borrowed with `Gpu::borrow_stream`); the same on buffers registered ahead
//! ([`Collectives::register_buffer`], windows, [`Collectives::mem_alloc`]; a world of one node
//! only), which send no bootstrap message; and the safe typed calls on [`DeviceVec`]s
//! (`typed.rs`).
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
//! | `registered.rs` | the callers' buffers registered on first use and exchanged on every call of the direct and copy-engine paths (and the export and mapping caches the registry shares) |
//! | `registry.rs` | buffers registered ahead, exchanged once through the peers' registration services; what makes a call "registered" |
//! | `regions.rs` | the scratch regions allocated on first use and traded with each peer once |
//! | `typed.rs` | [`DeviceVec`], [`Element`] and the safe typed calls |
//! | `setup.rs` | the checks and the wiring of set-up; the shared module of the built-in kernels |
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
//! On unregistered buffers the direct and copy-engine paths cost one bootstrap message per
//! peer per call (host side). On registered buffers (`registry.rs`) they cost none: the direct
//! kernel learns the peers' buffers from descriptors its peers write into its scratch, and the
//! copy engines, which need the peers' addresses on the host, are taken only where the outputs
//! are windows (all-gather, broadcast); a reduce keeps the per-call exchange, and the
//! point-to-point calls exchange no buffers at all (the p2p engine moves them through its
//! region, traded once per pair of ranks at their first meeting). They need
//! every buffer to be device memory this process allocated with an exportable allocator
//! (`cuMemAlloc`, e.g. PyTorch's caching allocator), 16-byte aligned and a multiple of 16 bytes
//! long, on at most [`MAX_DIRECT_RANKS`](mscclpp_shared::MAX_DIRECT_RANKS) ranks; otherwise
//! every rank takes the staged path (registered: every rank refuses the call, see
//! `registry.rs`).
//!
//! Under CUDA-graph capture (`Stream::is_capturing`, so a capture begun by a caller on a
//! borrowed stream counts) a call neither allocates nor waits on the host: algorithms that
//! would exchange unregistered buffers with the peers, or need a scratch region not yet traded
//! with the call's peers, are not taken (the next row of the selection table is; a forced one
//! is refused). So captured calls on unregistered buffers take LL, LL128 or staging; register
//! the buffers to capture direct calls, and run one eager call of each kind (or
//! [`Collectives::prepare`]) before capturing. A point-to-point call under capture between
//! two ranks that have not met yet (no eager send or receive between them, no `prepare`) is
//! refused. Every rank must capture the same calls.
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
mod regions;
mod registered;
mod registry;
mod scratch;
mod select;
#[cfg(test)]
mod select_pin;
mod setup;
pub(crate) use setup::builtin_module;
pub mod typed;

pub use algo::{Algorithm, Collective};
pub use config::{CollectiveConfig, Limit, Setting};
pub use group::Group;
pub use multinode::{ENV_NET_TRANSPORT, network_transports};
pub use reduction::{KernelOp, Reduction, Scalar, element_bits};
pub use registry::Registration;
pub use scratch::{MemoryPlan, memory_plan};
pub use typed::{Bf16, DeviceVec, Element, F8E4M3, F8E5M2, F16};

use std::sync::Arc;

use mscclpp_host::Result;
use mscclpp_host::communicator::Communicator;
use mscclpp_host::gpu::{Module, Stream};
use mscclpp_host::transport::Transport;
use mscclpp_shared::{DataType, DevicePtr, DeviceReduceOp};

use algo::p2p::P2p;
use algo::{Queue, Queued, UNITS};
use context::{Args, CallRegs, CallScope, Context, Peer, SetUp, copy_if_needed};
use mscclpp_host::trace::{Category, Span};
use scratch::ScratchLayout;
use select::{Call, Choice};

/// The collectives of one communicator.
pub struct Collectives {
    /// Every algorithm's state, indexed by [`Algorithm`] (dropped first: streams, events).
    units: Vec<Box<dyn Queue>>,
    cx: Context,
    /// The built-in kernels (shared by every `Collectives` on the device: `setup.rs`).
    _module: Arc<Module>,
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
        let module = setup::builtin_module(&g)?;
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
            cx: Context::new(comm, cfg, layout, wiring)?,
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
        let mut a = Args {
            call,
            input,
            output,
            peer,
            reg: None,
        };
        a.reg = self.registered_call(&a);
        a
    }

    /// Where the buffers the peers access lie in this rank's registrations, if every one does
    /// (`registry.rs`, "On a call").
    fn registered_call(&self, a: &Args) -> Option<CallRegs> {
        let (n, b) = (self.cx.ranks(), a.call.bytes);
        if b == 0 || !(2..=mscclpp_shared::MAX_DIRECT_RANKS).contains(&n) || self.cx.multi.is_some()
        {
            return None;
        }
        // Point-to-point calls run on the p2p engine through the scratch (no peer buffers to
        // learn); a reduce's non-roots may pass no output, so it keeps the per-call exchange.
        let (input, output) = match (a.call.collective, a.peer) {
            (_, Peer::To(_) | Peer::From(_) | Peer::Pair { .. }) => return None,
            (Collective::AllReduce, _) => (Some(b), Some(b)),
            (Collective::AllGather | Collective::AllToAll, _) => (None, Some(n * b)),
            (Collective::ReduceScatter, _) => (Some(n * b), None),
            (Collective::Broadcast, _) => (None, Some(b)),
            (Collective::Reduce | Collective::SendRecv, _) => return None,
        };
        let r = &self.cx.registry;
        let find = |p: DevicePtr<u8>, len: Option<usize>| match len {
            None => Some(None),
            Some(len) => r.lookup(p, len).map(Some),
        };
        let (i, o) = (find(a.input, input)?, find(a.output, output)?);
        Some(CallRegs {
            input: i.map(|x| x.0),
            output: o.map(|x| x.0),
            windows: i.is_none_or(|x| x.1) && o.is_none_or(|x| x.1),
        })
    }

    /// Registers `[ptr, ptr + bytes)` (device memory of this rank's device, inside one
    /// allocation from an exportable allocator, such as `cuMemAlloc` or PyTorch's caching
    /// allocator) with every peer once (NCCL's `ncclCommRegister`). Calls whose buffers lie in
    /// registrations then send no bootstrap message and wait for nothing on the host, eagerly
    /// or under CUDA-graph capture (`registry.rs`). Not collective: each rank registers its
    /// own buffers when it likes (a bounded wait for the peers' registration services, which
    /// answer whatever the peers' programs do). As with NCCL, every rank must pass registered
    /// buffers to a call, or none. [`Error::NotRegistrable`], [`Error::RegistryFull`],
    /// [`Error::RegistrationRefused`]; `Error::Unsupported` on a world of several nodes.
    ///
    /// [`Error::NotRegistrable`]: mscclpp_host::Error::NotRegistrable
    /// [`Error::RegistryFull`]: mscclpp_host::Error::RegistryFull
    /// [`Error::RegistrationRefused`]: mscclpp_host::Error::RegistrationRefused
    ///
    /// # Safety
    /// The range stays allocated until it is deregistered (NCCL's contract too): a call on
    /// memory allocated later at the same addresses would be taken for a call on this
    /// registration, and the peers would reach the old allocation.
    pub unsafe fn register_buffer(&self, ptr: DevicePtr<u8>, bytes: usize) -> Result<Registration> {
        let cx = &self.cx;
        cx.ensure_healthy()?;
        self.one_node()?;
        cx.registry
            .register(&cx.comm, &cx.buffers, ptr, bytes, None, None)
    }

    /// Takes back a registration of [`register_buffer`](Self::register_buffer) (NCCL's
    /// `ncclCommDeregister`): the peers forget it, and calls on the buffer take the per-call
    /// exchange again. No queued or captured work may still use it (as with NCCL): a kernel
    /// that names it afterwards refuses its launch. Not collective.
    pub fn deregister(&self, reg: Registration) -> Result<()> {
        let cx = &self.cx;
        cx.registry.deregister(&cx.comm, reg).map(drop)
    }

    /// Registers a window (NCCL's `ncclCommWindowRegister`): collective, every rank with a
    /// buffer of the same size, in the same order; the window gets the same slot on every rank
    /// (checked: [`Error::WindowMismatch`](mscclpp_host::Error::WindowMismatch) on every rank,
    /// and nothing stays registered). A window is a registration whose peers' addresses the
    /// host knows, for calls with the buffers at the same offset of the window on every rank
    /// (NCCL's symmetric buffers).
    ///
    /// # Safety
    /// As [`register_buffer`](Self::register_buffer): the range stays allocated until the
    /// window is deregistered.
    pub unsafe fn register_window(&self, ptr: DevicePtr<u8>, bytes: usize) -> Result<Registration> {
        let cx = &self.cx;
        cx.ensure_healthy()?;
        self.one_node()?;
        let slot = cx.registry.free_window_slot();
        // `free_window_slot` fails only when every window slot is taken.
        let full = || mscclpp_host::Error::RegistryFull {
            slots: mscclpp_shared::WINDOW_SLOTS,
            what: "windows",
        };
        let mine = match &slot {
            Ok(s) => cx
                .registry
                .register(&cx.comm, &cx.buffers, ptr, bytes, Some(*s), None),
            Err(_) => Err(full()),
        };
        let mut word = [0u8; 16];
        if let (Ok(s), Ok(_)) = (&slot, &mine) {
            word[0] = 1;
            word[4..8].copy_from_slice(&(*s as u32).to_le_bytes());
        }
        word[8..].copy_from_slice(&(bytes as u64).to_le_bytes());
        let all = cx.comm.all_gather(&word);
        let checked = all.and_then(|all| window_agreement(&word, &all));
        match (mine, checked) {
            (Ok(reg), Ok(())) => Ok(reg),
            (mine, checked) => {
                if let Ok(reg) = &mine {
                    let _ = cx.registry.deregister(&cx.comm, *reg);
                }
                // This rank's own failure first; else what the others said.
                mine.and(checked).and(Err(mscclpp_host::Error::Aborted {
                    reason: "window registration failed".into(),
                }))
            }
        }
    }

    /// Takes back a window (NCCL's `ncclCommWindowDeregister`): collective, in the same order
    /// on every rank; ends with a barrier.
    pub fn deregister_window(&self, reg: Registration) -> Result<()> {
        let cx = &self.cx;
        let r = cx.registry.deregister(&cx.comm, reg).map(drop);
        cx.comm.barrier()?;
        r
    }

    /// `bytes` of device memory from the library's allocator (NCCL's `ncclMemAlloc`), already
    /// registered with every peer ([`register_buffer`](Self::register_buffer)): calls on it
    /// send no bootstrap message. Freed by [`mem_free`](Self::mem_free) or with these
    /// collectives. Not collective.
    pub fn mem_alloc(&self, bytes: usize) -> Result<Registration> {
        let cx = &self.cx;
        cx.ensure_healthy()?;
        self.one_node()?;
        let buf = cx.comm.gpu().alloc(bytes)?;
        let ptr = buf.ptr();
        cx.registry
            .register(&cx.comm, &cx.buffers, ptr, bytes, None, Some(buf))
    }

    /// Deregisters and frees memory of [`mem_alloc`](Self::mem_alloc) (NCCL's `ncclMemFree`),
    /// given by its first byte. No queued work may still use it.
    pub fn mem_free(&self, ptr: DevicePtr<u8>) -> Result<()> {
        let cx = &self.cx;
        let reg = cx
            .registry
            .starting_at(ptr)
            .ok_or(mscclpp_host::Error::UnknownRegistration {
                slot: usize::MAX,
                generation: 0,
            })?;
        let buf = cx.registry.deregister(&cx.comm, reg)?;
        if buf.is_none() {
            return Err(mscclpp_host::Error::NotRegistrable {
                ptr: ptr.addr(),
                len: reg.len(),
                reason: "it was registered, not allocated by mem_alloc (deregistered now)".into(),
            });
        }
        Ok(())
    }

    /// Registration maps the peers' memory into this process: a world of one node only
    /// (across nodes the port channels move every call through the scratch, with no per-call
    /// exchange to save).
    fn one_node(&self) -> Result<()> {
        match self.cx.multi {
            None => Ok(()),
            Some(_) => Err(self
                .cx
                .cannot("registering buffers on a world of several nodes")),
        }
    }

    /// `(this rank's registrations, the peers' registrations mapped here)` of
    /// [`register_buffer`](Self::register_buffer), windows and [`mem_alloc`](Self::mem_alloc).
    pub fn registrations(&self) -> (usize, usize) {
        self.cx.registry.counts()
    }

    /// Queues one public call ([`dispatch`](Self::dispatch)), as one `call` span of the trace
    /// (op, bytes, type, operator, algorithm, stream, call id: [`call_span`](Self::call_span))
    /// whose id every launch it makes carries.
    ///
    /// # Safety
    /// The public call's contract for `args`.
    unsafe fn run(&self, args: Args, forced: Option<Algorithm>, stream: &Stream) -> Result<()> {
        let Some((mut span, _scope)) = self.call_span(op_name(&args), stream) else {
            // SAFETY: the caller's contract.
            return unsafe { self.dispatch(args, forced, stream) };
        };
        let call = &args.call;
        span.set("bytes", call.bytes);
        span.set("dtype", format!("{:?}", call.dtype));
        span.set("op", format!("{:?}", call.op.op));
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
        end_call(&mut span, &result, self.cx.last());
        result
    }

    /// The `call` span of one public call named `name` (call id, ranks, stream; the caller adds
    /// the rest, `bytes` first), with the scope that ties every launch queued while it lives to
    /// the call's id; `None` when tracing is off (one flag check, nothing recorded). Shared by
    /// [`run`](Self::run) and the calls made of sends and receives ([`Group::end`]); the span
    /// is recorded when dropped, after [`end_call`] adds the outcome.
    fn call_span(&self, name: &'static str, stream: &Stream) -> Option<(Span<'_>, CallScope)> {
        let trace = self.cx.comm.trace();
        if !trace.is_on() {
            return None;
        }
        let id = trace.next_call();
        let scope = CallScope::enter(id);
        let span = trace
            .span(Category::Call, name)
            .arg("call", id)
            .arg("ranks", self.cx.ranks())
            .arg(
                "stream",
                stream.cuda_raw().unwrap_or(stream as *const Stream as u64),
            );
        Some((span, scope))
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

    /// The direct kernel's unit.
    fn direct(&self) -> Result<&algo::direct::Direct> {
        self.units[Algorithm::Direct as usize]
            .as_any()
            .downcast_ref::<algo::direct::Direct>()
            .ok_or_else(|| self.cx.cannot("a direct kernel registered elsewhere"))
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
        // One rank: every collective is its input as its output (a copy when they differ),
        // whatever the size and whether or not a graph is being captured.
        if call.ranks == 1 && call.collective != Collective::SendRecv {
            if call.op.op != DeviceReduceOp::PreMulSum {
                // SAFETY: the caller's contract.
                return unsafe { copy_if_needed(stream, args.output, args.input, call.bytes) };
            }
            // One rank still multiplies its contribution (as NCCL does): by the direct
            // kernel's local reduction on whole 16-byte vectors, else through staging, which
            // serves any size and alignment.
            if let Queued::Ran = self.direct()?.alone(cx, &args, stream)? {
                return Ok(());
            }
            forced = Some(Algorithm::Staged);
        }
        let cannot = |w| cx.cannot(w);
        let capturing = stream.is_capturing()?;
        let usable = |a: Algorithm| self.usable(a, &args, capturing);
        let mut choice = select::choose(&cx.cfg, call, forced, true, &usable).map_err(cannot)?;
        loop {
            let Choice::Run(a) = choice;
            match self.units[a as usize].queue(cx, &args, stream)? {
                Queued::Ran => return Ok(()),
                Queued::Declined if forced.is_some() || !a.unit().registered => {
                    return Err(cx.cannot(select::DECLINED));
                }
                Queued::Declined => {
                    choice = select::choose(&cx.cfg, call, None, false, &usable).map_err(cannot)?;
                }
            }
        }
    }

    /// Whether `a` may take `args` now. On registered buffers (`args.reg`), of the algorithms
    /// on the callers' buffers the direct kernel (it learns the peers' buffers itself), and the
    /// copy engines where the host knows the peers' addresses (outputs in windows). Under CUDA-graph capture,
    /// nothing that allocates or waits on the host: no per-call exchange of unregistered
    /// buffers, no scratch region not allocated yet.
    fn usable(&self, a: Algorithm, args: &Args, capturing: bool) -> bool {
        let u = a.unit();
        if u.registered {
            return match args.reg {
                Some(_) => {
                    a == Algorithm::Direct
                        || a == Algorithm::CopyEngine
                            && algo::copy_engine::CopyEngine::takes_registered(args)
                }
                None => !capturing,
            };
        }
        // The point-to-point region is checked by the engine itself, with the batch's peers
        // (`algo::p2p::region`), which refuses a first meeting under capture by name.
        !capturing
            || u.scratch
                .iter()
                .filter(|&&r| r != scratch::Region::P2p)
                .all(|&r| self.cx.regions.is_ready(&self.cx, r, args.peers()))
    }

    /// Allocates every scratch region the collectives otherwise allocate on first use
    /// (`scratch.rs`: LL128 lines, staging, the point-to-point region), and exchanges them with
    /// every peer, so that calls captured in a CUDA graph afterwards can take every algorithm
    /// that needs no registered buffers, and send to and receive from any peer. Collective:
    /// every rank calls it, between the same calls. Each region is allocated once and traded
    /// with each peer once; a second call does nothing.
    pub fn prepare(&self) -> Result<()> {
        use scratch::Region;
        for r in [Region::Ll128, Region::Staging, Region::P2p] {
            if self.cx.layout.region_len(r) > 0 {
                self.cx.regions.get(&self.cx, r, regions::Peers::All)?;
            }
        }
        Ok(())
    }

    /// Bytes of device memory this `Collectives` holds now in scratch regions: the set-up
    /// scratch and every region allocated on first use so far (not the copy-engine
    /// all-reduce's scratch, nor the callers' buffers). [`memory_plan`] gives the sizes ahead.
    pub fn scratch_bytes(&self) -> usize {
        self.cx.layout.len() + self.cx.regions.allocated(&self.cx.layout)
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

/// Adds a call's outcome to its `call` span ([`Collectives::call_span`]): the algorithm that
/// queued it, or the error.
fn end_call(span: &mut Span<'_>, result: &Result<()>, algorithm: Option<Algorithm>) {
    match (result, algorithm) {
        (Ok(()), Some(a)) => span.set("algorithm", a.name()),
        (Ok(()), None) => {}
        (Err(e), _) => span.set("error", e.to_string()),
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

/// Checks every rank's window request (`register_window`: `ok u8 | 3 zero bytes | slot u32 |
/// bytes u64`) against this rank's `mine`.
fn window_agreement(mine: &[u8; 16], all: &[Vec<u8>]) -> Result<()> {
    let field = |b: &[u8], at: usize, len: usize| {
        let mut w = [0u8; 8];
        w[..len].copy_from_slice(&b[at..at + len]);
        u64::from_le_bytes(w)
    };
    for (rank, theirs) in all.iter().enumerate() {
        if theirs.len() != 16 {
            return Err(mscclpp_host::Error::WindowMismatch {
                rank,
                what: "request length",
                mine: 16,
                theirs: theirs.len() as u64,
            });
        }
        for (what, at, len) in [("success", 0, 1), ("slot", 4, 4), ("size", 8, 8)] {
            let (m, t) = (field(mine, at, len), field(theirs, at, len));
            if m != t {
                return Err(mscclpp_host::Error::WindowMismatch {
                    rank,
                    what,
                    mine: m,
                    theirs: t,
                });
            }
        }
    }
    Ok(())
}
