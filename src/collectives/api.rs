//! [`Collectives`]: set-up, the public calls and the registrations. Every public call is one
//! line that builds its [`Call`] and queues it ([`Collectives::queue`]); the dispatcher
//! (`dispatch.rs`) checks, lowers, plans and queues it.

use std::sync::Arc;

use mscclpp_host::Result;
use mscclpp_host::communicator::Communicator;
use mscclpp_host::gpu::{Module, Stream};
use mscclpp_host::trace::Category;
use mscclpp_host::transport::Transport;
use mscclpp_shared::{DataType, DevicePtr};

use super::algo::{self, UNITS};
use super::algorithm::Algorithm;
use super::call::Call;
use super::config::CollectiveConfig;
use super::context::{Context, SetUp};
use super::dispatch::Engine;
use super::multinode::NodeWorld;
use super::one_sided::{OneSided, Signal, SignalWait, Window};
use super::reduction::Reduction;
use super::registry::Registration;
use super::scratch::ScratchLayout;
use super::setup;

/// The collectives of one communicator.
pub struct Collectives {
    /// Every algorithm and their context (dropped first).
    engine: Engine,
    /// The built-in kernels (shared by every `Collectives` on the device: `setup.rs`).
    _module: Arc<Module>,
    /// The configuration as it was asked for, before set-up fitted it to this world (a shrunk
    /// or grown world is set up from it again: [`requested_config`](Self::requested_config)).
    requested: CollectiveConfig,
}

impl Collectives {
    /// Sets up collectives with the backend's default configuration. Every rank calls it.
    pub fn new(comm: Arc<Communicator>) -> Result<Self> {
        let cfg = CollectiveConfig::for_backend(comm.gpu().kind()).with_env();
        Self::with_config(comm, cfg)
    }

    /// Sets up collectives with `cfg`, which must be identical on every rank: a rank whose
    /// settings differ from another's gets `Error::ConfigMismatch` (and so does the other).
    pub fn with_config(comm: Arc<Communicator>, mut cfg: CollectiveConfig) -> Result<Self> {
        let requested = cfg;
        let trace = comm.trace().clone();
        let _span = trace.span(Category::Setup, "collectives");
        cfg.max_blocks = algo::channel_rows(&cfg);
        setup::check_same_config(&comm, &cfg)?;
        let sharing = super::sharing::check(&comm, &cfg)?;
        let cfg = sharing.cap(cfg);
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
            // The node's world: a world of one node, with the same settings.
            let node = |c: Arc<Communicator>| -> Result<Box<dyn NodeWorld>> {
                Ok(Box::new(Self::with_config(c, cfg)?))
            };
            (layout, setup::wire_nodes(&comm, &layout, &node)?)
        } else {
            let layout = algo::one_node_layout(&cfg, comm.size());
            (layout, setup::wire(&comm, &cfg, &layout)?)
        };
        if trace.is_on() {
            crate::trace::attach_with(&comm, &module, cfg.max_blocks);
        }
        Ok(Self {
            engine: Engine::new(
                units,
                Context::new(comm, cfg, layout, wiring, sharing.most_on_one_gpu > 1)?,
            )?,
            _module: module,
            requested,
        })
    }

    /// The dispatcher (for `Group`).
    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    fn cx(&self) -> &Context {
        &self.engine.cx
    }

    /// The communicator.
    pub fn communicator(&self) -> &Arc<Communicator> {
        &self.cx().comm
    }

    /// The algorithm the last call on this rank ran (after a fallback decided on the host),
    /// or `None` before the first call. A call that the direct kernel decides on the device
    /// with its peers is reported as `Direct`
    /// ([`last_call_declined`](Self::last_call_declined) tells, afterwards, whether it ran
    /// there).
    pub fn last_algorithm(&self) -> Option<Algorithm> {
        self.cx().last()
    }

    /// How many caller allocations the direct paths registered on this rank, and how many
    /// of the peers' allocations they mapped here (both only grow; see
    /// `collectives/registered.rs`).
    pub fn registered_buffers(&self) -> (usize, usize) {
        self.cx().buffers.counts()
    }

    /// Whether the last call that the direct kernel decided on the device (a call on buffers
    /// not registered with every peer yet, see [`hints`](Self::hints)) was handed on to the
    /// algorithm queued behind it instead of running direct. Wait for the call's work first
    /// (it reads the device's verdict); `false` before any such call. For tests and tools:
    /// [`last_algorithm`](Self::last_algorithm) reports such a call as `Direct`.
    pub fn last_call_declined(&self) -> Result<bool> {
        self.cx().last_declined()
    }

    /// `(allocations, of which every peer has them)`: the allocations this rank registered
    /// with its peers by itself, for direct calls on buffers the caller did not register (see
    /// `collectives/registry.rs`, "Hints"). A call on a buffer in one every peer has sends no
    /// bootstrap message.
    pub fn hints(&self) -> (usize, usize) {
        self.cx().registry.hints()
    }

    /// Waits until the work of every call queued so far (not under capture) has completed, at
    /// most `timeout`; whether it has. Only this communicator's work: the calls are queued in
    /// issue order across streams (`collectives/order.rs`), and the marker after the last one
    /// is what this waits for.
    pub fn drain(&self, timeout: std::time::Duration) -> Result<bool> {
        self.engine.order.drain(timeout)
    }

    /// The configuration in use: the one asked for, fitted to this world at set-up (launch
    /// shapes within a GPU's share when ranks share it, `sharing.rs`).
    pub fn config(&self) -> CollectiveConfig {
        self.cx().cfg
    }

    /// The configuration as it was passed to [`with_config`](Self::with_config) (or made by
    /// [`new`](Self::new)), before set-up fitted it to this world: what a shrunk or grown
    /// world is set up from, and what a newcomer to a grown world passes.
    pub fn requested_config(&self) -> CollectiveConfig {
        self.requested
    }

    /// The transport this rank's collectives use to reach every rank (`None` for this rank
    /// itself), on a world of several nodes; `None` on a world of one node (every peer is
    /// reached through the same-node transport's MemoryChannels).
    pub fn transports(&self) -> Option<Vec<Option<Transport>>> {
        self.cx().multi.as_ref().map(|m| m.transports.clone())
    }

    /// Payload bytes this rank's collectives sent to other nodes over `transport` so far (0 on
    /// a world of one node): how a test or tool sees that traffic crossed a transport.
    pub fn network_bytes_sent(&self, transport: Transport) -> u64 {
        self.cx()
            .multi
            .as_ref()
            .map_or(0, |m| m.bytes_sent(transport))
    }

    /// Queues `call` on `stream` (the one path of every call: the public calls below are each
    /// a line that builds one). `algo` forces one of the algorithms that serve it
    /// ([`Algorithm::serves`]; none can be forced on the calls made of sends and receives).
    /// Checked first ([`Call::check`]: `Error::NoSuchRank`, `Error::PeerIsSelf`,
    /// `Error::PerRankLength`, `Error::CountOverflow`, `Error::NullBuffer`), then planned and
    /// queued (`Error::Unsupported` with what cannot be done).
    ///
    /// # Safety
    /// Every buffer of `call` holds what the call reads and writes on this rank (module docs
    /// of `Call`'s variants) until the work queued on `stream` completes, as does a
    /// [`Scalar::Device`](super::Scalar::Device); every rank makes the same call (sends and
    /// receives pair up with their peers').
    pub unsafe fn queue(
        &self,
        call: &Call,
        stream: &Stream,
        algo: Option<Algorithm>,
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { self.engine.queue(call, algo, stream) }
    }

    /// Checks `call` as [`queue`](Self::queue) would (its ranks, byte counts, buffers and
    /// operator), queuing nothing. A send or receive naming this rank itself passes (a
    /// group's may; `queue` refuses it alone).
    pub fn check(&self, call: &Call) -> Result<()> {
        self.engine.check(call)
    }

    /// All-reduce of `count` elements of `dtype` from `input` into `output` (they may be the
    /// same buffer), by `op`: a [`Reduction`] (sum, product, min, max, average, pre-multiplied
    /// sum) or a [`ReduceOp`](mscclpp_shared::ReduceOp).
    ///
    /// # Safety
    /// `input` and `output` are device buffers of at least `count` elements, valid until the
    /// work queued on `stream` completes (as is a [`Scalar::Device`](super::Scalar::Device));
    /// every rank makes the same call.
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
        let op = op.into();
        let call = Call::AllReduce {
            input,
            output,
            count,
            dtype,
            op,
        };
        // SAFETY: the caller's contract.
        unsafe { self.queue(&call, stream, algo) }
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
        let call = Call::AllGather {
            input,
            output,
            count,
            dtype,
        };
        // SAFETY: the caller's contract.
        unsafe { self.queue(&call, stream, algo) }
    }

    /// Reduce-scatter: `input` holds `nranks * count` elements; rank r receives the reduction
    /// by `op` (a [`Reduction`] or a [`ReduceOp`](mscclpp_shared::ReduceOp)) of every rank's
    /// part r (`count` elements) in `output`. `algo` forces one of the algorithms that serve
    /// it.
    ///
    /// # Safety
    /// As [`Collectives::all_gather`], with `input` of `nranks * count` and `output` of `count`
    /// (and a [`Scalar::Device`](super::Scalar::Device) valid until the queued work completes).
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
        let op = op.into();
        let call = Call::ReduceScatter {
            input,
            output,
            count,
            dtype,
            op,
        };
        // SAFETY: the caller's contract.
        unsafe { self.queue(&call, stream, algo) }
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
        let call = Call::Broadcast {
            input,
            output,
            count,
            dtype,
            root,
        };
        // SAFETY: the caller's contract.
        unsafe { self.queue(&call, stream, algo) }
    }

    /// Reduce to `root` (NCCL's `ncclReduce`): `count` elements of every rank's `input`
    /// reduced by `op` (a [`Reduction`] or a [`ReduceOp`](mscclpp_shared::ReduceOp)) into the
    /// root's `output` (which may be its `input`). Other ranks' `output` is not touched and
    /// may be null. `algo` forces one of the algorithms that serve it (`ll`, `staged`,
    /// `direct`).
    ///
    /// # Safety
    /// `input` holds `count` elements, the root's `output` too; valid until the queued work
    /// completes (as is a [`Scalar::Device`](super::Scalar::Device)); every rank makes the
    /// same call.
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
        let op = op.into();
        let call = Call::Reduce {
            input,
            output,
            count,
            dtype,
            op,
            root,
        };
        // SAFETY: the caller's contract.
        unsafe { self.queue(&call, stream, algo) }
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
        let call = Call::AllToAll {
            input,
            output,
            count,
            dtype,
        };
        // SAFETY: the caller's contract.
        unsafe { self.queue(&call, stream, algo) }
    }

    /// Gather to `root` (NCCL's `ncclGather`): every rank's `count` elements of `input` land
    /// at `output[rank * count ..]` on the root. Other ranks' `output` is not touched and may
    /// be null; in place on the root when `input` is `output + root * count`.
    ///
    /// # Safety
    /// `input` holds `count` elements, the root's `output` `nranks * count`; both valid until
    /// the queued work completes; every rank makes the same call.
    pub unsafe fn gather(
        &self,
        input: DevicePtr<u8>,
        output: DevicePtr<u8>,
        count: usize,
        dtype: DataType,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        let call = Call::Gather {
            input,
            output,
            count,
            dtype,
            root,
        };
        // SAFETY: the caller's contract.
        unsafe { self.queue(&call, stream, None) }
    }

    /// Scatter from `root` (NCCL's `ncclScatter`): part `r` (`count` elements at
    /// `input[r * count ..]`) of the root's input lands in rank `r`'s `output`. Other ranks'
    /// `input` is not read and may be null; in place on the root when `output` is
    /// `input + root * count`.
    ///
    /// # Safety
    /// The root's `input` holds `nranks * count` elements, every `output` `count`; valid until
    /// the queued work completes; every rank makes the same call.
    pub unsafe fn scatter(
        &self,
        input: DevicePtr<u8>,
        output: DevicePtr<u8>,
        count: usize,
        dtype: DataType,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        let call = Call::Scatter {
            input,
            output,
            count,
            dtype,
            root,
        };
        // SAFETY: the caller's contract.
        unsafe { self.queue(&call, stream, None) }
    }

    /// All-to-all with a count and a displacement per peer (PyTorch's `all_to_all_single`
    /// with splits, MPI's `Alltoallv`): `send_counts[q]` elements at
    /// `input[send_displs[q] ..]` go to rank `q`, which receives them at
    /// `output[recv_displs[r] ..]` (`recv_counts[r]` elements, equal to what `r` sends it,
    /// else the receiving rank gets `Error::CountMismatch`). Counts and displacements are in
    /// elements, one per rank; zero counts are allowed.
    ///
    /// # Safety
    /// Every range named by the counts and displacements lies inside `input` / `output`, the
    /// receive ranges do not overlap each other or the send ranges, and all stay valid until
    /// the queued work completes.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_to_allv(
        &self,
        input: DevicePtr<u8>,
        send_counts: &[usize],
        send_displs: &[usize],
        output: DevicePtr<u8>,
        recv_counts: &[usize],
        recv_displs: &[usize],
        dtype: DataType,
        stream: &Stream,
    ) -> Result<()> {
        let call = Call::AllToAllv {
            input,
            output,
            send_counts: send_counts.to_vec(),
            send_displs: send_displs.to_vec(),
            recv_counts: recv_counts.to_vec(),
            recv_displs: recv_displs.to_vec(),
            dtype,
        };
        // SAFETY: the caller's contract.
        unsafe { self.queue(&call, stream, None) }
    }

    /// Sends `count` elements to `peer`, which receives them with [`Collectives::recv`] (or a
    /// receive of a [`Group`](super::Group) or `send_recv`: sends and receives pair up in order
    /// whatever call made each). A receive posted with another count gets
    /// `Error::CountMismatch`.
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
        let call = Call::Send {
            input,
            count,
            dtype,
            peer,
        };
        // SAFETY: the caller's contract.
        unsafe { self.queue(&call, stream, None) }
    }

    /// Receives `count` elements from `peer` (which sends them with [`Collectives::send`], a
    /// [`Group`](super::Group) or `send_recv`). A message of another count is refused: nothing
    /// is written, and this rank's next call (and `status().error()`) returns
    /// `Error::CountMismatch`.
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
        let call = Call::Recv {
            output,
            count,
            dtype,
            peer,
        };
        // SAFETY: the caller's contract.
        unsafe { self.queue(&call, stream, None) }
    }

    /// Sends `count` elements of `input` to `next` and receives as many from `prev` into
    /// `output`, both at once (as a grouped `ncclSend` + `ncclRecv`): any pattern of pairs
    /// works (a ring, pairs of equal parity, `next == prev`).
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
        let call = Call::SendRecv {
            input,
            next,
            output,
            prev,
            count,
            dtype,
        };
        // SAFETY: the caller's contract.
        unsafe { self.queue(&call, stream, None) }
    }

    /// Registers `[ptr, ptr + bytes)` (device memory of this rank's device, inside one
    /// allocation from an exportable allocator, such as `cuMemAlloc` or PyTorch's caching
    /// allocator) with every peer once (NCCL's `ncclCommRegister`). Calls whose buffers lie in
    /// registrations then send no bootstrap message and wait for nothing on the host, eagerly
    /// or under CUDA-graph capture (`registry.rs`). Not collective: each rank registers its
    /// own buffers when it likes (a bounded wait for the peers' registration services, which
    /// answer whatever the peers' programs do). As with NCCL, every rank must pass registered
    /// buffers to a call, or none. Memory no peer can map (not from an exportable allocator,
    /// host memory) and a full table are declined, not refused: the registration does nothing
    /// and calls on the buffer run as on unregistered memory (NCCL's registration is a hint
    /// too). [`Error::RegistrationRefused`]; `Error::Unsupported` on a world of several nodes.
    ///
    /// [`Error::RegistrationRefused`]: mscclpp_host::Error::RegistrationRefused
    ///
    /// # Safety
    /// The range stays allocated until it is deregistered (NCCL's contract too): a call on
    /// memory allocated later at the same addresses would be taken for a call on this
    /// registration, and the peers would reach the old allocation.
    pub unsafe fn register_buffer(&self, ptr: DevicePtr<u8>, bytes: usize) -> Result<Registration> {
        let cx = self.cx();
        cx.ensure_healthy()?;
        self.one_node()?;
        cx.registry.register(&cx.buffers, ptr, bytes, None, None)
    }

    /// Takes back a registration of [`register_buffer`](Self::register_buffer) (NCCL's
    /// `ncclCommDeregister`): the peers forget it, and calls on the buffer take the per-call
    /// exchange again. No queued or captured work may still use it (as with NCCL): a kernel
    /// that names it afterwards refuses its launch. Not collective.
    pub fn deregister(&self, reg: Registration) -> Result<()> {
        let cx = self.cx();
        cx.registry.deregister(reg).map(drop)
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
        let cx = self.cx();
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
                .register(&cx.buffers, ptr, bytes, Some(*s), None),
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
                    let _ = cx.registry.deregister(*reg);
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
        let cx = self.cx();
        let r = cx.registry.deregister(reg).map(drop);
        cx.comm.barrier()?;
        r
    }

    /// Registers a window for the one-sided calls ([`put_signal`](Self::put_signal),
    /// [`signal`](Self::signal), [`wait_signals`](Self::wait_signals)): collective, every rank
    /// with a buffer of its own (any size), in the same order; the window gets the same number
    /// on every rank. On a world of one node or several (the peers of another node reach it
    /// over the network transport). The first one also sets up every rank's signals
    /// (`one_sided.rs`).
    ///
    /// # Safety
    /// The range is device memory of this rank's device and stays allocated until these
    /// collectives are dropped (its registrations are kept until then).
    pub unsafe fn register_one_sided(&self, ptr: DevicePtr<u8>, bytes: usize) -> Result<Window> {
        let cx = self.cx();
        cx.refuse_revoked("register_one_sided")?;
        cx.ensure_healthy()?;
        let rma = match cx.one_sided.get() {
            Some(r) => r,
            None => {
                let (conns, transports) = cx.connections();
                let made = OneSided::new(cx.comm.clone(), conns, transports)?;
                cx.one_sided.get_or_init(|| made)
            }
        };
        rma.register(ptr, bytes)
    }

    /// Takes back a window of [`register_one_sided`](Self::register_one_sided): collective,
    /// in the same order on every rank, ends with a barrier; calls naming it are refused.
    pub fn deregister_one_sided(&self, window: Window) -> Result<()> {
        self.one_sided()?.deregister(window)
    }

    /// Queues on `stream` (after its earlier work): `bytes` from `src`, which lies inside one
    /// of this rank's windows, into `peer`'s part of `window` at `offset`, then one more
    /// `signal` on `peer` (NCCL's `ncclPutSignal`). Later work of `stream` runs once the data
    /// and the signal have reached the peer (so it may reuse `src`). A failure of the transfer
    /// aborts the communicator (module docs of `one_sided.rs`).
    ///
    /// # Safety
    /// `src` holds `bytes` until the work queued on `stream` completes.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn put_signal(
        &self,
        src: DevicePtr<u8>,
        bytes: usize,
        peer: usize,
        window: Window,
        offset: u64,
        signal: Signal,
        stream: &Stream,
    ) -> Result<()> {
        let rma = self.one_sided()?;
        // SAFETY: the caller's contract.
        let queued =
            unsafe { rma.put_signal(src, bytes, peer, Some((window, offset)), signal, stream) };
        queued.and(self.cx().inflight.note(stream))
    }

    /// Queues on `stream` one more `signal` on `peer`, after the earlier work of `stream` and
    /// the earlier one-sided calls to `peer` (NCCL's `ncclSignal`).
    pub fn signal(&self, peer: usize, signal: Signal, stream: &Stream) -> Result<()> {
        let rma = self.one_sided()?;
        // SAFETY: no data moves (no window).
        let queued = unsafe { rma.put_signal(DevicePtr::NULL, 0, peer, None, signal, stream) };
        queued.and(self.cx().inflight.note(stream))
    }

    /// Queues on `stream` a wait until, for every entry, `count` more of its signals from its
    /// peer have come than the earlier waits of this rank counted (NCCL's `ncclWaitSignal`).
    /// Bounded: the communicator's abort, or the one-sided timeout, ends it (the call is lost
    /// and the error is sticky).
    pub fn wait_signals(&self, waits: &[SignalWait], stream: &Stream) -> Result<()> {
        let queued = self.one_sided()?.wait(waits, stream);
        queued.and(self.cx().inflight.note(stream))
    }

    /// Sets how long a one-sided wait or transfer may take before it is given up
    /// ([`ONE_SIDED_TIMEOUT`](super::ONE_SIDED_TIMEOUT) by default, or
    /// `MSCCLPP_ONE_SIDED_TIMEOUT_MS`).
    pub fn set_one_sided_timeout(&self, timeout: std::time::Duration) -> Result<()> {
        self.one_sided()?.set_timeout(timeout);
        Ok(())
    }

    /// The one-sided calls' state, once a window was registered for them; refused after a
    /// revoke.
    fn one_sided(&self) -> Result<&OneSided> {
        let cx = self.cx();
        cx.refuse_revoked("a one-sided call")?;
        cx.one_sided.get().ok_or_else(|| {
            cx.cannot(
                "a one-sided call before any window was registered for them (register_one_sided)",
            )
        })
    }

    /// `bytes` of device memory from the library's allocator (NCCL's `ncclMemAlloc`), already
    /// registered with every peer ([`register_buffer`](Self::register_buffer)): calls on it
    /// send no bootstrap message. Freed by [`mem_free`](Self::mem_free) or with these
    /// collectives. Not collective.
    pub fn mem_alloc(&self, bytes: usize) -> Result<Registration> {
        let cx = self.cx();
        cx.ensure_healthy()?;
        self.one_node()?;
        let buf = cx.comm.gpu().alloc(bytes)?;
        let ptr = buf.ptr();
        cx.registry
            .register(&cx.buffers, ptr, bytes, None, Some(buf))
    }

    /// Deregisters and frees memory of [`mem_alloc`](Self::mem_alloc) (NCCL's `ncclMemFree`),
    /// given by its first byte. No queued work may still use it.
    pub fn mem_free(&self, ptr: DevicePtr<u8>) -> Result<()> {
        let cx = self.cx();
        let reg = cx
            .registry
            .starting_at(ptr)
            .ok_or(mscclpp_host::Error::UnknownRegistration {
                slot: usize::MAX,
                generation: 0,
            })?;
        let buf = cx.registry.deregister(reg)?;
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
        match self.cx().multi {
            None => Ok(()),
            Some(_) => Err(self
                .cx()
                .cannot("registering buffers on a world of several nodes")),
        }
    }

    /// `(this rank's registrations, the peers' registrations mapped here)`: this rank's of
    /// [`register_buffer`](Self::register_buffer), windows and [`mem_alloc`](Self::mem_alloc);
    /// the peers' of those and their [`hints`](Self::hints).
    pub fn registrations(&self) -> (usize, usize) {
        self.cx().registry.counts()
    }

    /// Whether every peer has answered every registration of this rank, hints included
    /// (registering a buffer returns before the peers have it; calls on it until then are
    /// handed on by the direct kernel, as on unregistered buffers).
    pub fn registrations_settled(&self) -> bool {
        self.cx().registry.settled()
    }

    /// Allocates every scratch region the collectives otherwise allocate on first use
    /// (`scratch.rs`: LL128 lines, staging, the point-to-point region), and exchanges them with
    /// every peer, so that calls captured in a CUDA graph afterwards can take every algorithm
    /// that needs no registered buffers, and send to and receive from any peer. Collective:
    /// every rank calls it, between the same calls. Each region is allocated once and traded
    /// with each peer once; a second call does nothing.
    pub fn prepare(&self) -> Result<()> {
        self.cx().regions.prepare()
    }

    /// Bytes of device memory this `Collectives` holds now in scratch regions: the set-up
    /// scratch and every region allocated on first use so far (not the copy-engine
    /// all-reduce's scratch, nor the callers' buffers). [`memory_plan`](super::memory_plan)
    /// gives the sizes ahead.
    pub fn scratch_bytes(&self) -> usize {
        let cx = self.cx();
        cx.layout.len() + cx.regions.allocated(&cx.layout)
    }
}

impl NodeWorld for Collectives {
    unsafe fn queue(&self, call: &Call, stream: &Stream) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { Collectives::queue(self, call, stream, None) }
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

#[cfg(test)]
mod tests {
    /// The point-to-point region (3 ranks, CPU backend): a communicator that only runs
    /// collectives holds none; the first send between ranks 0 and 1 allocates it on both (the
    /// sender's call, and the receiver's call or its registration service, whichever comes
    /// first) and trades it through the services, once; rank 2, met by nobody, holds none;
    /// `prepare` allocates every region and trades it with every peer, once each.
    #[test]
    fn the_point_to_point_region_is_traded_at_the_first_meeting_by_the_services() {
        use super::Collectives;
        use crate::collectives::scratch::Region;
        use mscclpp_host::gpu::BackendKind;
        use mscclpp_shared::DataType;
        use mscclpp_shared::ReduceOp;
        use std::sync::Arc;

        for r in crate::world::run_local_ranks(BackendKind::Cpu, 3, |comm| {
            let c = Collectives::new(Arc::new(comm))?;
            let (me, cx) = (c.communicator().rank(), c.cx());
            let st = c.communicator().gpu().stream()?;
            let buf = c.communicator().gpu().alloc(4096)?;
            // SAFETY: `buf` holds 16 words until the synchronize (LL16: no region of its own).
            unsafe {
                c.all_reduce(
                    buf.ptr(),
                    buf.ptr(),
                    16,
                    DataType::U32,
                    ReduceOp::Sum,
                    &st,
                    None,
                )
            }?;
            st.synchronize()?;
            let set_up = c.scratch_bytes();
            assert_eq!(
                set_up,
                cx.layout.len(),
                "collectives allocate no p2p region"
            );
            // Before any rank's first send: a region sent by a peer makes this rank's service
            // allocate its own.
            c.communicator().barrier()?;
            let p2p = cx.layout.region_len(Region::P2p);
            assert!(p2p > 0);
            // Ranks 0 and 1 meet; rank 2 does not.
            if me < 2 {
                let peer = 1 - me;
                // SAFETY: `buf` holds 16 words until the synchronize.
                unsafe {
                    if me == 0 {
                        c.send(buf.ptr(), 16, DataType::U32, peer, &st)
                    } else {
                        c.recv(buf.ptr(), 16, DataType::U32, peer, &st)
                    }
                }?;
                st.synchronize()?;
                assert_eq!(c.scratch_bytes(), set_up + p2p, "the region, once");
            }
            c.communicator().barrier()?;
            if me == 2 {
                assert_eq!(c.scratch_bytes(), set_up, "rank 2 met nobody");
            }
            c.communicator().barrier()?;
            c.prepare()?;
            let lazy = [Region::Ll128, Region::Staging, Region::P2p];
            let every: usize = lazy.iter().map(|&r| cx.layout.region_len(r)).sum();
            assert_eq!(c.scratch_bytes(), set_up + every, "every region, once each");
            c.communicator().barrier()
        }) {
            r.unwrap_or_else(|e| panic!("{}", crate::ErrorChain(&e)));
        }
    }
}
