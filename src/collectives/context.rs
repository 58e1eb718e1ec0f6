//! What every algorithm works with: the call lowered for the planner and the kernels
//! ([`Args`], [`Lowered`]), what set-up hands each algorithm ([`SetUp`]), and the
//! communicator-wide state its `queue` uses ([`Context`]): the scratch, the channel table, the
//! LL flags, the registered-buffer caches, the regions allocated on first use, and the one
//! place that writes a kernel's mode, element type and operator ([`Context::params`]), and
//! its trace handle (a launch of the call this thread queues, [`CallScope`]).
//!
//! A `Context` is built once at set-up and owns everything below it; nothing it owns asks
//! for the context back (the regions and the registries hold the communicator and the layout
//! themselves). Its only state that changes after set-up: the record of the last algorithm
//! (a relaxed atomic, written by the units' launches, read by `Collectives::last_algorithm`),
//! the revoked flag (set once by `Collectives::revoke` with release, read by every call with
//! acquire), the one-sided calls' stream events of `inflight.rs`, and the interior state of the regions and
//! registries (their module docs).
//!
//! Device words here: `ll_flags` (four u64 in device memory: the first two written and read
//! only by the LL kernels, `CollectiveParams::ll_flags` says how; the third the gate word, written
//! by a direct launch that decides whether its call runs there, read by the launches queued
//! behind it, `CollectiveParams::gate`), the channel table (written once by the
//! host before the set-up's closing barrier, read by every kernel; each region allocated on
//! first use has a copy pointing at the peers' buffers of that region, written once before
//! the first kernel that uses it), and the scratch (module docs of `scratch.rs`).

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use mscclpp_host::communicator::Communicator;
use mscclpp_host::connection::Connection;
use mscclpp_host::gpu::{DeviceBuffer, Gpu, Kernel, KernelSpec, Module, Stream};
use mscclpp_host::memory_channel::MemoryChannel;
use mscclpp_host::registered_memory::RegisteredMemory;
use mscclpp_host::transport::Transport;
use mscclpp_host::{Error, Result};
use mscclpp_shared::{
    BufferRef, CollectiveMode, CollectiveParams, DataType, DevicePtr, DeviceReduceOp,
    DirectCollectiveParams, MemoryChannelDeviceHandle, P2pParams,
};

use super::algorithm::{Algorithm, Collective};
use super::config::CollectiveConfig;
use super::inflight::InFlight;
use super::multinode::MultiNode;
use super::one_sided::OneSided;
use super::reduction::KernelOp;
use super::regions::{LazyRegions, Peers};
use super::registered::RegisteredBuffers;
use super::registry::Registry;
use super::scratch::{Region, ScratchLayout};

/// The transport to every rank (`None` for this rank).
pub(crate) type PeerTransports = Vec<Option<Transport>>;

/// Who a call's data goes to or comes from, besides every rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Peer {
    /// Every rank alike (all-reduce, all-gather, reduce-scatter, all-to-all).
    None,
    /// The root of a broadcast or a reduce.
    Root(usize),
    /// `send_recv`: sends to `next`, receives from `prev`.
    Pair { next: usize, prev: usize },
    /// `send` to this rank.
    To(usize),
    /// `recv` from this rank.
    From(usize),
}

/// One call as the planner sees it: the collective, its size in bytes, the world, the element
/// type and the operator as the kernels take it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Lowered {
    /// The collective (`SendRecv` for `send_recv`, `send` and `recv`; gather, scatter and
    /// all-to-all-v are batches of sends and receives, which are not planned).
    pub collective: Collective,
    /// `send` or `recv` alone (with `SendRecv`), not a `send_recv`.
    pub one_way: bool,
    /// Bytes: the whole message of all-reduce, broadcast, reduce and the point-to-point calls,
    /// one part of the others.
    pub bytes: usize,
    /// Ranks of the communicator.
    pub ranks: usize,
    /// Nodes the ranks run on.
    pub nodes: usize,
    /// Whether every node runs the same number of ranks.
    pub uniform: bool,
    /// Element type.
    pub dtype: DataType,
    /// Operator, lowered for the kernels (`Sum` where the collective does not reduce).
    pub op: KernelOp,
}

/// One call, as the planner plans it and the algorithms queue it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Args {
    /// What the planner sees.
    pub call: Lowered,
    /// Input (null for `recv`).
    pub input: DevicePtr<u8>,
    /// Output (null for `send`).
    pub output: DevicePtr<u8>,
    /// Root or peers.
    pub peer: Peer,
    /// This rank's registrations of the buffers the peers access, when the call is on
    /// registered buffers (`registry.rs`: then no host message names them).
    pub reg: Option<CallRegs>,
}

/// Where a registered call's buffers lie in this rank's registrations (`registry.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CallRegs {
    /// The input, when the peers read it.
    pub input: Option<BufferRef>,
    /// The output, when the peers write it.
    pub output: Option<BufferRef>,
    /// Whether every one of them lies in a window.
    pub windows: bool,
}

impl Args {
    /// The peers a call's kernel meets: its one peer for a `send` or a `recv`, the next and
    /// previous ranks of a `send_recv` (other than this rank), every other rank otherwise.
    pub fn peers(&self) -> Peers {
        match self.peer {
            Peer::To(q) | Peer::From(q) => Peers::One(q),
            Peer::Pair { next, prev } if next == prev => Peers::Some(vec![next]),
            Peer::Pair { next, prev } => Peers::Some(vec![next, prev]),
            Peer::None | Peer::Root(_) => Peers::All,
        }
    }

    /// The kernels' `root` word: the broadcast's root, the peer of `send` / `recv`, the next
    /// rank of `send_recv`; 0 otherwise.
    pub fn root(&self) -> u32 {
        match self.peer {
            Peer::None => 0,
            Peer::Root(r) | Peer::To(r) | Peer::From(r) | Peer::Pair { next: r, .. } => r as u32,
        }
    }
}

/// What an algorithm's `set_up` gets.
pub(crate) struct SetUp<'a> {
    /// The built-in kernels' module.
    pub module: &'a Module,
    /// This rank's GPU.
    pub gpu: &'a Gpu,
}

impl SetUp<'_> {
    /// Loads a kernel of the module.
    pub fn kernel<P: bytemuck::Pod>(&self, spec: KernelSpec<P>) -> Result<Kernel<P>> {
        self.module.kernel(spec)
    }
}

/// The communicator-wide state of one `Collectives` (module docs).
pub(crate) struct Context {
    /// What a world of several nodes adds (port channels, the node's collectives); dropped
    /// first, so that its proxy stops before the scratch goes.
    pub multi: Option<MultiNode>,
    pub comm: Arc<Communicator>,
    pub cfg: CollectiveConfig,
    /// Whether ranks of this world share a GPU (`sharing.rs`): then an algorithm queues a
    /// call's work on the call's stream only (no side streams whose waits for events could
    /// hold a work queue that a peer's kernel sits behind).
    pub shared_gpu: bool,
    pub layout: ScratchLayout,
    /// The callers' buffers registered for the direct and copy-engine paths (the per-call
    /// exchange's caches, which the registry shares).
    pub buffers: Arc<RegisteredBuffers>,
    /// Buffers registered ahead, and the peers' (`registry.rs`).
    pub registry: Registry,
    scratch: DeviceBuffer,
    channel_table: DeviceBuffer,
    /// The scratch regions allocated on first use (`regions.rs`; the registration service
    /// receives the peers' regions into them).
    pub regions: Arc<LazyRegions>,
    ll_flags: DeviceBuffer,
    /// The algorithm of the last queued call ([`Algorithm`] as `u8` + 1; 0 before any).
    last: AtomicU8,
    /// Set once by `Collectives::revoke` (release), read by every call (acquire): a revoked
    /// `Collectives` takes no more calls.
    revoked: AtomicBool,
    /// The streams this `Collectives`'s one-sided calls queued on, each with an event after
    /// its latest call (`inflight.rs`): what a revoke waits for, with the issue order's marker.
    pub inflight: InFlight,
    /// The one-sided calls' windows, signals and service, set up by the first window
    /// registered for them (`one_sided.rs`).
    pub one_sided: OnceLock<OneSided>,
    /// The last gate handed out ([`Context::next_gate`]).
    gates: AtomicU32,
    _channels: Vec<MemoryChannel>,
    _peers: Vec<RegisteredMemory>,
    _connections: Vec<Arc<dyn Connection>>,
}

/// The parts of a [`Context`] that set-up builds.
pub(crate) struct Wiring {
    pub multi: Option<MultiNode>,
    pub scratch: DeviceBuffer,
    pub channel_table: DeviceBuffer,
    pub handles: Vec<MemoryChannelDeviceHandle>,
    pub ll_flags: DeviceBuffer,
    pub channels: Vec<MemoryChannel>,
    pub peers: Vec<RegisteredMemory>,
    pub connections: Vec<Arc<dyn Connection>>,
}

impl Context {
    /// `shared_gpu`: whether ranks of this world share a GPU (`sharing.rs`).
    pub fn new(
        comm: Arc<Communicator>,
        cfg: CollectiveConfig,
        layout: ScratchLayout,
        w: Wiring,
        shared_gpu: bool,
    ) -> Result<Self> {
        let buffers = Arc::new(RegisteredBuffers::default());
        let regions = Arc::new(LazyRegions::new(
            comm.clone(),
            layout,
            w.handles,
            super::registry::send_region,
            shared_gpu,
        )?);
        let registry = Registry::new(&comm, &buffers, &regions)?;
        Ok(Self {
            regions,
            shared_gpu,
            multi: w.multi,
            comm,
            cfg,
            layout,
            buffers,
            registry,
            scratch: w.scratch,
            channel_table: w.channel_table,
            ll_flags: w.ll_flags,
            last: AtomicU8::new(0),
            revoked: AtomicBool::new(false),
            inflight: InFlight::default(),
            one_sided: OnceLock::new(),
            gates: AtomicU32::new(0),
            _channels: w.channels,
            _peers: w.peers,
            _connections: w.connections,
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// Ranks of the communicator.
    pub fn ranks(&self) -> usize {
        self.comm.size()
    }

    /// The connection to every rank and its transport (`None` for this rank): the same-node
    /// transport's on a world of one node, the port channels' on a world of several.
    pub fn connections(&self) -> (Vec<Option<Arc<dyn Connection>>>, PeerTransports) {
        let n = self.ranks();
        let (all, transports) = match &self.multi {
            Some(m) => (&m.connections, m.transports.clone()),
            None => {
                let local = Transport::local_for(self.comm.gpu().kind());
                let t = (0..n).map(|q| (q != self.rank()).then_some(local));
                (&self._connections, t.collect())
            }
        };
        let conns = (0..n)
            .map(|q| all.iter().find(|c| c.remote_rank() == q).cloned())
            .collect();
        (conns, transports)
    }

    /// The ranks other than this one.
    pub fn others(&self) -> Vec<usize> {
        (0..self.ranks()).filter(|&q| q != self.rank()).collect()
    }

    /// A collective kernel's parameters for `mode`, reducing `dtype` by `op`: the only place
    /// that writes `mode`, `dtype`, `op` and the operator's scalar (calls that only move data
    /// pass [`Context::MOVE`]'s type and operator, which their kernels ignore). Buffers,
    /// `bytes`, `stride` and `root` are the caller's to fill in.
    pub fn params(
        &self,
        mode: CollectiveMode,
        (dtype, op): (DataType, KernelOp),
    ) -> CollectiveParams {
        CollectiveParams {
            status: self.comm.status().device_ptr(),
            channels: self.channel_table.ptr().cast(),
            input: DevicePtr::NULL,
            output: DevicePtr::NULL,
            scratch: self.scratch.ptr(),
            bytes: 0,
            ll_flags: self.ll_flags.ptr().cast(),
            ll_slot_bytes: self.layout.ll_slot_bytes(),
            // Every region starts its own buffer (`scratch.rs`; `params_in`).
            stage_offset: 0,
            ll128_offset: 0,
            ll128_slot_bytes: self.layout.ll128_slot_bytes(),
            stride: 0,
            gate: GATE.with(|g| g.get()),
            dtype: dtype as u32,
            op: op.op as u32,
            scalar: op.scalar,
            scalar_ptr: op.scalar_ptr,
            mode: mode as u32,
            rank: self.rank() as u32,
            nranks: self.ranks() as u32,
            root: 0,
            max_blocks: self.cfg.max_blocks,
            trace: self.comm.trace().launch(current_call()),
        }
    }

    /// [`params`](Self::params) for a kernel that works in region `r` with `peers`, to be
    /// launched on `stream`: its `scratch` and channel table are the region's (allocated, and
    /// sent to each peer, by the first call that needs it; the launch waits on `stream` until
    /// the peers' are traded: `regions.rs`).
    pub fn params_in(
        &self,
        r: Region,
        peers: Peers,
        mode: CollectiveMode,
        data: (DataType, KernelOp),
        stream: &Stream,
    ) -> Result<CollectiveParams> {
        let mut p = self.params(mode, data);
        if let Some((scratch, table)) = self.regions.get(r, peers, stream)? {
            p.scratch = scratch;
            p.channels = table.cast();
        }
        Ok(p)
    }

    /// The point-to-point engine's parameters with no operation yet (`nops` 0), in its region
    /// (this rank's buffer `scratch` and the region's channel `table`: `regions.rs`).
    pub fn p2p_params(&self, scratch: DevicePtr<u8>, table: DevicePtr<u8>) -> P2pParams {
        let lay = self.layout.p2p();
        P2pParams {
            status: self.comm.status().device_ptr(),
            channels: table.cast(),
            scratch,
            region_offset: 0,
            ll_bytes: lay.ll_bytes,
            chunk_bytes: lay.chunk_bytes,
            rank: self.rank() as u32,
            nranks: self.ranks() as u32,
            lanes: lay.lanes as u32,
            ..P2pParams::default()
        }
    }

    /// The type and operator of a call that moves data without reducing it.
    pub const MOVE: (DataType, KernelOp) = (DataType::U32, KernelOp::plain(DeviceReduceOp::Sum));

    /// [`params`](Self::params) for the direct kernel, over `bytes` (and parts `bytes` apart);
    /// no buffers yet.
    pub fn direct_params(
        &self,
        mode: CollectiveMode,
        data: (DataType, KernelOp),
        bytes: usize,
    ) -> DirectCollectiveParams {
        let mut common = self.params(mode, data);
        common.bytes = bytes as u64;
        common.stride = bytes as u64;
        DirectCollectiveParams {
            common,
            ..Default::default()
        }
    }

    /// A new gate for a launch that decides on the device whether the call runs there
    /// (`plan.rs`): never 0, and different from the gates of the calls queued recently (it
    /// wraps after 2^32 - 1 calls).
    pub fn next_gate(&self) -> u32 {
        loop {
            let g = self.gates.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
            if g != 0 {
                return g;
            }
        }
    }

    /// Records `a` as what the last call ran (not for a launch queued behind a direct launch
    /// that decides on the device: the call is recorded as the direct kernel's).
    pub fn record(&self, a: Algorithm) {
        if GATE.with(|g| g.get()) == 0 {
            self.last.store(a as u8 + 1, Ordering::Relaxed);
        }
    }

    /// Whether the last call that the direct kernel decided on the device was handed on (to
    /// the launch behind it, `plan.rs`): read from the gate word once its work completed (the
    /// caller waits for it first); `false` before any.
    pub fn last_declined(&self) -> Result<bool> {
        let mut word = [0u8; 8];
        self.ll_flags.copy_to_host(16, &mut word)?;
        let gate = self.gates.load(Ordering::Relaxed);
        Ok(gate != 0 && u64::from_le_bytes(word) == gate as u64)
    }

    /// What the last call ran.
    pub fn last(&self) -> Option<Algorithm> {
        let v = self.last.load(Ordering::Relaxed) as usize;
        v.checked_sub(1)
            .and_then(|i| Algorithm::ALL.get(i).copied())
    }

    /// Refuses to queue work on a communicator that already failed: a device wait gave up
    /// (its recorded error), a peer died or `abort()` was called. A launch would only wait
    /// until the abort flag releases it.
    pub fn ensure_healthy(&self) -> Result<()> {
        match self.comm.failure() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Marks these collectives revoked: every later call is refused ([`refuse_revoked`]).
    ///
    /// [`refuse_revoked`]: Self::refuse_revoked
    pub fn revoke(&self) {
        self.revoked.store(true, Ordering::Release);
    }

    /// `Error::Revoked` naming `what` once [`revoke`](Self::revoke) was called.
    pub fn refuse_revoked(&self, what: &'static str) -> Result<()> {
        if self.revoked.load(Ordering::Acquire) {
            return Err(Error::Revoked {
                rank: self.rank(),
                what,
            });
        }
        Ok(())
    }

    /// The error of an algorithm that cannot serve a call (`what` it cannot do).
    pub fn cannot(&self, what: &'static str) -> Error {
        Error::Unsupported {
            what,
            backend: self.comm.gpu().kind(),
        }
    }
}

thread_local! {
    /// The trace id of the collective call this thread is queuing (0: none), which every
    /// launch's trace handle is tied to ([`Context::params`]).
    static CALL: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// The gate the launches this thread queues run under (0: none; `plan.rs`), which
    /// [`Context::params`] writes into every launch's parameters.
    static GATE: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Marks the launches this thread queues as gated by `gate` until dropped (then restores what
/// was there).
pub(crate) struct GateScope(u32);

impl GateScope {
    pub fn enter(gate: u32) -> Self {
        Self(GATE.with(|g| g.replace(gate)))
    }
}

impl Drop for GateScope {
    fn drop(&mut self) {
        GATE.with(|g| g.set(self.0));
    }
}

/// The call this thread is queuing ([`CallScope`]).
pub(crate) fn current_call() -> u64 {
    CALL.with(|c| c.get())
}

/// Marks this thread as queuing call `id` until dropped (then restores what was there).
pub(crate) struct CallScope(u64);

impl CallScope {
    pub fn enter(id: u64) -> Self {
        Self(CALL.with(|c| c.replace(id)))
    }
}

impl Drop for CallScope {
    fn drop(&mut self) {
        CALL.with(|c| c.set(self.0));
    }
}

/// Whether a launch with `p` reduces something other than a sum or pre-multiplied sum of f16,
/// bf16 or f32 (`DeviceReduceOp::is_inline`), which only the `_any` twin of a reducing kernel
/// serves (`mscclpp_device::collectives`).
pub(crate) fn needs_any(p: &CollectiveParams) -> bool {
    let reduces = [
        CollectiveMode::AllReduce,
        CollectiveMode::AllReducePut,
        CollectiveMode::ReduceScatter,
        CollectiveMode::ReduceLocal,
        CollectiveMode::Reduce,
    ]
    .iter()
    .any(|&m| m as u32 == p.mode);
    let common = match (DataType::from_u32(p.dtype), DeviceReduceOp::from_u32(p.op)) {
        (Some(d), Some(o)) => o.is_inline(d),
        _ => false,
    };
    reduces && !common
}

/// `main`, or its `_any` twin when `p` reduces something the main kernels do not serve.
pub(crate) fn pick<'k, P>(
    main: &'k Kernel<P>,
    any: &'k Kernel<P>,
    p: &CollectiveParams,
) -> &'k Kernel<P> {
    if needs_any(p) { any } else { main }
}

/// A reducing kernel and its `_any` twin, which serves every type and operator (the main one
/// reduces only the sums and pre-multiplied sums of f16, bf16 and f32, with fewer
/// registers).
pub(crate) struct Twin<P> {
    /// The main kernel.
    pub main: Kernel<P>,
    /// Its twin.
    pub any: Kernel<P>,
}

impl<P: bytemuck::Pod> Twin<P> {
    /// Loads both.
    pub fn load(s: &SetUp<'_>, main: KernelSpec<P>, any: KernelSpec<P>) -> Result<Self> {
        Ok(Self {
            main: s.kernel(main)?,
            any: s.kernel(any)?,
        })
    }

    /// The one that serves a launch with `p` ([`pick`]).
    pub fn for_params(&self, p: &CollectiveParams) -> &Kernel<P> {
        pick(&self.main, &self.any, p)
    }
}

/// Queues `dst <- src` unless they are the same buffer.
///
/// # Safety
/// Both hold `bytes` until the copy completes.
pub(crate) unsafe fn copy_if_needed(
    stream: &Stream,
    dst: DevicePtr<u8>,
    src: DevicePtr<u8>,
    bytes: usize,
) -> Result<()> {
    if dst == src {
        return Ok(());
    }
    // SAFETY: the caller's contract.
    unsafe { stream.copy_dtod(dst, src, bytes) }
}
