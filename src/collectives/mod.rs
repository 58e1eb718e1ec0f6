//! Collectives on a communicator: `all_reduce` (sum, min, max over f32, f16, bf16, i32, u32),
//! `all_gather`, `reduce_scatter`, `broadcast`, `all_to_all`, `send` / `recv` and
//! `send_recv`, in place or out of place, any element count, on a caller's stream.
//!
//! [`Collectives::new`] connects every rank to every other on its node (CUDA IPC / shared
//! memory), allocates a scratch buffer per rank that every peer maps, builds one row of
//! MemoryChannels (one per peer) for each block the kernels may use (`setup.rs`), and sets up
//! every algorithm. The kernels are in `mscclpp_device::collectives`.
//!
//! Where things are:
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`Collectives`]: set-up, the public calls, and the dispatch (choose, queue, fall back) |
//! | `algo/` | one file per algorithm ([`Algorithm`]: `ll`, `ll128`, `ll_two_shot`, `staged`, `two_shot_put`, `direct`, `copy_engine`), each implementing one trait, registered by one line (`algo/mod.rs` says how to add one) |
//! | `select.rs` | the one selection table (collective, size, ranks, registered or not → algorithm) |
//! | `config.rs` | [`CollectiveConfig`], from one table of settings (defaults per backend, environment variables, limits) |
//! | `scratch.rs` | the scratch layout (LL16, LL128, staging regions; the copy-engine scratch) |
//! | `context.rs` | what the algorithms share: parameter blocks (the one place that sets a kernel's mode), health checks, the record of what ran |
//! | `registered.rs` | the callers' buffers registered on first use and exchanged on every call of the direct and copy-engine paths |
//! | `setup.rs` | the checks and the wiring of set-up |
//!
//! Algorithms (chosen by size unless the caller forces one with [`Algorithm`]; each file says
//! more, the selection table says when):
//! - `ll` (all-reduce and a two-rank `send_recv` up to `ll_max_bytes`; all-gather,
//!   reduce-scatter, all-to-all and broadcast up to `ll_part_max_bytes` per part): LL16
//!   packets into every peer's scratch: one hop, no barrier.
//! - `ll128` (all-reduce from `ll128_min_bytes` to `ll128_max_bytes` on fewer than
//!   `ll_two_shot_min_ranks` ranks; all-gather and reduce-scatter parts from
//!   `ll128_part_min_bytes` to `ll128_max_bytes` on any number): the same with LL128 lines.
//! - `ll2` (all-reduce from `ll_two_shot_min_bytes` to `ll_max_bytes` on
//!   `ll_two_shot_min_ranks` ranks or more): an LL16 reduce-scatter and all-gather in one
//!   launch. Above `ll_max_bytes` those ranks go to the direct or copy-engine paths, not to
//!   LL128.
//! - `staged` (everything, any size): through the staging region, in pieces.
//! - `put` (all-reduce, any size): only writes cross the links.
//! - `direct` (every collective but send/recv, from `direct_min_bytes`; `send_recv` below
//!   `ce_min_bytes`): one kernel on the callers' registered buffers.
//! - `ce` (all-gather, broadcast, all-to-all, `send_recv` from `ce_min_bytes`; `send` / `recv`
//!   from `direct_min_bytes`; all-reduce from `ce_all_reduce_min_bytes`): the copy engines on
//!   the registered buffers.
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
//! Every rank must call the same collectives in the same order (as with NCCL); `send` and
//! `recv` pair up between two ranks.

mod algo;
mod config;
mod context;
mod reduction;
mod regions;
mod registered;
mod scratch;
mod select;
#[cfg(test)]
mod select_pin;
mod setup;

pub use algo::{Algorithm, Collective};
pub use config::{CollectiveConfig, Limit, Setting};
pub use reduction::{KernelOp, Reduction, Scalar, element_bits};
pub use scratch::{MemoryPlan, memory_plan};

use std::sync::Arc;

use mscclpp_host::Result;
use mscclpp_host::communicator::Communicator;
use mscclpp_host::gpu::{Module, Stream};
use mscclpp_shared::{DataType, DevicePtr, DeviceReduceOp};

use algo::{Queue, Queued, UNITS};
use context::{Args, Context, Peer, SetUp, copy_if_needed};
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

impl Collectives {
    /// Sets up collectives with the backend's default configuration. Every rank calls it.
    pub fn new(comm: Arc<Communicator>) -> Result<Self> {
        let cfg = CollectiveConfig::for_backend(comm.gpu().kind()).with_env();
        Self::with_config(comm, cfg)
    }

    /// Sets up collectives with `cfg`, which must be identical on every rank: a rank whose
    /// settings differ from another's gets `Error::ConfigMismatch` (and so does the other).
    pub fn with_config(comm: Arc<Communicator>, mut cfg: CollectiveConfig) -> Result<Self> {
        cfg.max_blocks = channel_rows(&cfg);
        setup::check_one_node(&comm)?;
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
        let layout = ScratchLayout::for_registered(&cfg, comm.size());
        let wiring = setup::wire(&comm, &cfg, &layout)?;
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
    /// of the algorithms that serve it.
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

    /// Sends `count` elements to `peer` (which calls [`Collectives::recv`]).
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

    /// Receives `count` elements from `peer` (which calls [`Collectives::send`]).
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
    /// `output`, both at once (as a grouped `ncclSend` + `ncclRecv`): on registered buffers
    /// both directions move together; when staging, even ranks send first.
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
        Call {
            collective,
            one_way: false,
            bytes: count * dtype.size(),
            ranks: self.cx.ranks(),
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

    /// The dispatch (what `select::decide` models): an all-reduce on one rank copies; else
    /// the forced algorithm or the selection table's choice queues the call; an algorithm on
    /// registered buffers that declines it (some rank's buffers cannot be shared) leaves it to
    /// the table's first algorithm that needs none, unless it was forced (then the call is
    /// refused, on every rank alike); a `send_recv` that splits runs as a `send` and a `recv`.
    ///
    /// # Safety
    /// The public call's contract for `args`.
    unsafe fn run(&self, args: Args, forced: Option<Algorithm>, stream: &Stream) -> Result<()> {
        let (cx, call) = (&self.cx, &args.call);
        if call.bytes == 0 {
            return Ok(());
        }
        let mut forced = forced;
        if call.collective == Collective::AllReduce && call.ranks == 1 {
            if call.op.op != DeviceReduceOp::PreMulSum {
                // SAFETY: the caller's contract.
                return unsafe { copy_if_needed(stream, args.output, args.input, call.bytes) };
            }
            // One rank still multiplies its contribution (as NCCL does): through staging,
            // which serves any size.
            forced = Some(Algorithm::Staged);
        }
        let cannot = |w| cx.cannot(w);
        let capturing = stream.is_capturing()?;
        let usable = |a: Algorithm| !capturing || self.usable_in_capture(a);
        let mut choice = select::choose(&cx.cfg, call, forced, true, &usable).map_err(cannot)?;
        loop {
            let a = match choice {
                Choice::Run(a) => a,
                // SAFETY: the caller's contract.
                Choice::Split => return unsafe { self.split(args, stream) },
            };
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

    /// Whether `a` can run under CUDA-graph capture: it neither exchanges the callers' buffers
    /// with the peers (a host wait) nor needs a scratch region not allocated yet.
    fn usable_in_capture(&self, a: Algorithm) -> bool {
        let u = a.unit();
        !u.registered
            && u.scratch
                .iter()
                .all(|&r| self.cx.regions.is_ready(r, &self.cx.layout))
    }

    /// Allocates every scratch region the collectives otherwise allocate on first use
    /// (`scratch.rs`: LL128 lines, staging), and exchanges them with the peers, so that calls
    /// captured in a CUDA graph afterwards can take every algorithm that needs no registered
    /// buffers. Collective: every rank calls it, between the same calls. Each region is
    /// allocated once; a second call does nothing.
    pub fn prepare(&self) -> Result<()> {
        for r in [scratch::Region::Ll128, scratch::Region::Staging] {
            if self.cx.layout.region_len(r) > 0 {
                self.cx.regions.get(&self.cx, r)?;
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

    /// A `send_recv` as a `send` to `next` and a `recv` from `prev`, even ranks sending first.
    ///
    /// # Safety
    /// `send_recv`'s contract for `args`.
    unsafe fn split(&self, args: Args, stream: &Stream) -> Result<()> {
        let Peer::Pair { next, prev } = args.peer else {
            return Err(self.cx.cannot("a split of anything but send_recv"));
        };
        let call = Call {
            one_way: true,
            ..args.call
        };
        let send = self.args(call, args.input, DevicePtr::NULL, Peer::To(next));
        let recv = self.args(call, DevicePtr::NULL, args.output, Peer::From(prev));
        // SAFETY: the caller's contract, split in two.
        unsafe {
            if self.cx.rank().is_multiple_of(2) {
                self.run(send, None, stream)?;
                self.run(recv, None, stream)
            } else {
                self.run(recv, None, stream)?;
                self.run(send, None, stream)
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
