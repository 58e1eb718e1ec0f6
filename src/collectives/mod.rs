//! Collectives on a communicator: `all_reduce` and `reduce_scatter` (every [`Reduction`] of
//! NCCL, on every [`DataType`]: see `reduction.rs`), `all_gather`, `broadcast`, `all_to_all`,
//! `send` / `recv`, in place or out of place, any element count, on a caller's stream.
//!
//! [`Collectives::new`] connects every rank to every other on its node (CUDA IPC / shared
//! memory), allocates a scratch buffer per rank that every peer maps, and builds one row of
//! MemoryChannels (one per peer) for each block the kernels may use. The kernels are in
//! `mscclpp_device::collectives`.
//!
//! Algorithms (chosen by size unless the caller forces one with [`Algorithm`]):
//! - `LlOneShot` (all-reduce and a two-rank `send_recv` up to `ll_max_bytes`; all-gather,
//!   reduce-scatter, all-to-all and broadcast up to `ll_part_max_bytes` per part): every rank
//!   writes its input (or each peer's part of it; a broadcast's non-roots an ack) as LL16
//!   packets into every peer's scratch and reduces or copies what arrives: one hop, no
//!   barrier.
//! - `Ll128` (all-reduce from `ll128_min_bytes` to `ll128_max_bytes` on fewer than
//!   `ll_two_shot_min_ranks` ranks; all-gather and reduce-scatter parts from
//!   `ll128_part_min_bytes` to `ll128_max_bytes` on any number): the same one-shot shape with
//!   LL128 lines, 120 data bytes in every 128 (LL16: 8 in 16), written by a warp; the medium
//!   sizes, which the links' bandwidth bounds, go almost twice as fast.
//! - `LlTwoShot` (all-reduce from `ll_two_shot_min_bytes` to `ll_max_bytes` on
//!   `ll_two_shot_min_ranks` ranks or more): an LL16 reduce-scatter and all-gather in one
//!   launch. A one-shot kernel sends `n - 1` copies of the data (LL128: 1.07 bytes a byte,
//!   LL16: 2); this sends `2 (n - 1) / n` parts (4 (n - 1) / n bytes as packets) for one more
//!   hop, which is less from 4 ranks on. Above `ll_max_bytes` those ranks go to the direct or
//!   copy-engine paths, not to LL128.
//! - `Staged` (everything, any size): input is staged in the rank's scratch, ranks meet at a
//!   block barrier, and each rank reads its peers' staging over NVLink; all-reduce is a
//!   reduce-scatter followed by an all-gather. Large operations run in pieces of the staging
//!   size.
//! - `TwoShotPut` (all-reduce, any size): only writes cross the links — each rank puts part `q`
//!   of its input into rank `q`'s staging, reduces its own part locally, and puts the result
//!   into every peer's staging.
//! - `Direct` (every collective but send/recv, from `direct_min_bytes`): no staging; the
//!   callers' buffers are registered on first use (`direct.rs`) and one kernel reads and writes
//!   the peers' buffers themselves (`mscclpp_device::collectives::direct`).
//! - `CopyEngine` (all-gather, broadcast, all-to-all, send/recv, from `ce_min_bytes`; send/recv
//!   whenever direct): the registered buffers again, moved by the copy engines
//!   (`cuMemcpyAsync` into the peers' mapped buffers) between two block barriers. For
//!   all-reduce (from `ce_all_reduce_min_bytes`), a pipelined reduce-scatter and all-gather by
//!   copy engine through a scratch buffer of its own (`ce_all_reduce.rs`).
//!
//! The direct and copy-engine paths cost one bootstrap message per peer per call (host side),
//! which a CUDA graph pays once, at capture. They need every buffer to be device memory this
//! process allocated with an exportable allocator (`cuMemAlloc`, e.g. PyTorch's caching
//! allocator), 16-byte aligned and a multiple of 16 bytes long, on at most
//! [`MAX_DIRECT_RANKS`](mscclpp_shared::MAX_DIRECT_RANKS) ranks; otherwise every rank takes the staged path.
//!
//! Measured on 2×H200: see BENCHMARKS.md.
//!
//! Every rank must call the same collectives in the same order (as with NCCL); `send` and
//! `recv` pair up between two ranks.

mod ce_all_reduce;
mod config;
mod direct;
mod launch;
mod reduction;

pub use config::{Algorithm, CollectiveConfig};
pub use reduction::{KernelOp, Reduction, Scalar, element_bits};

use std::sync::Arc;

use mscclpp_host::communicator::Communicator;
use mscclpp_host::connection::{Connection, EndpointConfig};
use mscclpp_host::gpu::{DeviceBuffer, Kernel, Module, Stream};
use mscclpp_host::memory_channel::MemoryChannel;
use mscclpp_host::registered_memory::RegisteredMemory;
use mscclpp_host::semaphore::MemoryDevice2DeviceSemaphore;
use mscclpp_host::transport::Transport;
use mscclpp_host::{Error, Result};
use mscclpp_shared::{
    CollectiveMode, CollectiveParams, DataType, DevicePtr, DeviceReduceOp, DirectCollectiveParams,
    MemoryChannelDeviceHandle, ReduceOp, packet::ll128,
};

use crate::kernels;
use launch::copy_if_needed;

/// The collectives of one communicator.
pub struct Collectives {
    comm: Arc<Communicator>,
    cfg: CollectiveConfig,
    _module: Module,
    ll: Kernel<CollectiveParams>,
    ll_all_reduce: Kernel<CollectiveParams>,
    ll_all_gather: Kernel<CollectiveParams>,
    ll128_all_reduce: Kernel<CollectiveParams>,
    ll128_collective: Kernel<CollectiveParams>,
    ll_two_shot_all_reduce: Kernel<CollectiveParams>,
    staged: Kernel<CollectiveParams>,
    direct: Kernel<DirectCollectiveParams>,
    /// The `_any` twins: every reduction but the common sums (`DeviceReduceOp::is_common_sum`).
    any: AnyKernels,
    buffers: direct::DirectBuffers,
    /// Second stream of the copy-engine paths (a rank's copy into its own buffer), and its
    /// fork and join events.
    side: Stream,
    fork: mscclpp_host::gpu::Event,
    join: mscclpp_host::gpu::Event,
    /// The copy-engine all-reduce's streams, events and scratch.
    ce: ce_all_reduce::Pipeline,
    scratch: DeviceBuffer,
    channel_table: DeviceBuffer,
    _channels: Vec<MemoryChannel>,
    _peers: Vec<RegisteredMemory>,
    _connections: Vec<Arc<dyn Connection>>,
    ll_slot_bytes: u64,
    ll128_offset: u64,
    ll128_slot_bytes: u64,
    stage_offset: u64,
    ll_flags: DeviceBuffer,
    /// The algorithm of the last queued call ([`Algorithm`] as `u8` + 1; 0 before any).
    last: std::sync::atomic::AtomicU8,
}

/// The `_any` twins of the reducing kernels (`mscclpp_device::collectives`).
struct AnyKernels {
    ll: Kernel<CollectiveParams>,
    ll128: Kernel<CollectiveParams>,
    ll_two_shot: Kernel<CollectiveParams>,
    staged: Kernel<CollectiveParams>,
    direct: Kernel<DirectCollectiveParams>,
}

const SCRATCH_TAG: u64 = 0x5c_0000;
const SEMAPHORE_TAG: u64 = 0x5e_0000;

fn up16(x: usize) -> usize {
    (x + 15) & !15
}

/// Refuses a configuration that differs from any other rank's (`Error::ConfigMismatch` naming
/// the first setting that differs and the rank), by one all-gather of every setting. A peer's
/// answer of the wrong length counts as a mismatch.
fn check_same_config(comm: &Communicator, cfg: &CollectiveConfig) -> Result<()> {
    let settings = cfg.settings();
    let mine: Vec<u8> = settings.iter().flat_map(|(_, v)| v.to_le_bytes()).collect();
    for (rank, theirs) in comm.all_gather(&mine)?.iter().enumerate() {
        if theirs.len() != mine.len() {
            return Err(Error::ConfigMismatch {
                what: "the size of the collectives' settings (bytes)",
                mine: mine.len() as u64,
                rank,
                theirs: theirs.len() as u64,
            });
        }
        for (&(what, v), b) in settings.iter().zip(theirs.chunks_exact(8)) {
            let t = u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
            if t != v {
                return Err(Error::ConfigMismatch {
                    what,
                    mine: v,
                    rank,
                    theirs: t,
                });
            }
        }
    }
    Ok(())
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
        cfg.max_blocks = (cfg.max_blocks.max(cfg.staged_blocks))
            .max(cfg.direct_blocks)
            .max(ce_all_reduce::ROWS);
        let (rank, n) = (comm.rank(), comm.size());
        let g = comm.gpu().clone();
        let t = Transport::local_for(g.kind());
        for q in 0..n {
            if !comm.same_node(q) {
                return Err(Error::Connect {
                    remote_rank: q,
                    transport: t,
                    reason: "collectives across nodes are not implemented yet".into(),
                });
            }
        }
        // One GPU per rank (CUDA), checked on every rank alike.
        let mine = match g.pci_bus_id() {
            Some(id) => format!("{:?}/{id}", comm.bootstrap().node_of(rank)),
            None => String::new(),
        };
        let all = comm.all_gather(mine.as_bytes())?;
        for (second, b) in all.iter().enumerate() {
            let first = all[..second].iter().position(|a| a == b);
            if let (Some(first), false) = (first, b.is_empty()) {
                return Err(Error::DuplicateGpu {
                    first,
                    second,
                    device: String::from_utf8_lossy(b)
                        .rsplit('/')
                        .next()
                        .unwrap_or_default()
                        .to_string(),
                });
            }
        }
        check_same_config(&comm, &cfg)?;
        let module = g.load_ptx(crate::DEVICE_PTX)?;
        let ll = module.kernel(kernels::LL_COLLECTIVE)?;
        let ll_all_reduce = module.kernel(kernels::LL_ALL_REDUCE)?;
        let ll_all_gather = module.kernel(kernels::LL_ALL_GATHER)?;
        let ll128_all_reduce = module.kernel(kernels::LL128_ALL_REDUCE)?;
        let ll128_collective = module.kernel(kernels::LL128_COLLECTIVE)?;
        let ll_two_shot_all_reduce = module.kernel(kernels::LL_TWO_SHOT_ALL_REDUCE)?;
        let staged = module.kernel(kernels::STAGED_COLLECTIVE)?;
        let direct = module.kernel(kernels::DIRECT_COLLECTIVE)?;
        let any = AnyKernels {
            ll: module.kernel(kernels::LL_COLLECTIVE_ANY)?,
            ll128: module.kernel(kernels::LL128_COLLECTIVE_ANY)?,
            ll_two_shot: module.kernel(kernels::LL_TWO_SHOT_ALL_REDUCE_ANY)?,
            staged: module.kernel(kernels::STAGED_COLLECTIVE_ANY)?,
            direct: module.kernel(kernels::DIRECT_COLLECTIVE_ANY)?,
        };
        // Scratch: the LL16 region, the LL128 region (each two halves of `n` slots), staging.
        let ll_slot_bytes = (up16(cfg.ll_max_bytes).div_ceil(8) * 16) as u64;
        let ll128_offset = 2 * n as u64 * ll_slot_bytes;
        let ll128_slot_bytes = ll128::line_bytes_for(cfg.ll128_max_bytes) as u64;
        let stage_offset = ll128_offset + 2 * n as u64 * ll128_slot_bytes;
        let scratch = g.alloc(stage_offset as usize + cfg.stage_bytes + 16 * n)?;
        let reg = comm.register_buffer(&scratch, t)?;
        let mut connections: Vec<Option<Arc<dyn Connection>>> = vec![None; n];
        for (q, slot) in connections.iter_mut().enumerate() {
            if q != rank {
                *slot = Some(comm.connect(EndpointConfig::new(t), q, SCRATCH_TAG)?);
                comm.send_memory(&reg, q, SCRATCH_TAG)?;
            }
        }
        let mut peers: Vec<Option<RegisteredMemory>> = vec![None; n];
        for (q, slot) in peers.iter_mut().enumerate() {
            if q != rank {
                *slot = Some(comm.recv_memory(q, SCRATCH_TAG)?);
            }
        }
        let mut channels = Vec::new();
        let mut table = vec![MemoryChannelDeviceHandle::default(); cfg.max_blocks as usize * n];
        for b in 0..cfg.max_blocks as usize {
            for q in 0..n {
                let (Some(conn), Some(peer)) = (&connections[q], &peers[q]) else {
                    continue;
                };
                let sem = MemoryDevice2DeviceSemaphore::new(
                    &comm,
                    conn.as_ref(),
                    SEMAPHORE_TAG + b as u64,
                )?;
                let ch = MemoryChannel::new(sem, peer.clone(), scratch.ptr(), scratch.ptr())?;
                table[b * n + q] = ch.device_handle()?;
                channels.push(ch);
            }
        }
        let channel_table = g.alloc(std::mem::size_of_val(table.as_slice()))?;
        let ll_flags = g.alloc(16)?;
        channel_table.copy_from_host(0, bytemuck::cast_slice(&table))?;
        comm.bootstrap().barrier()?;
        Ok(Self {
            comm,
            cfg,
            _module: module,
            ll,
            ll_all_reduce,
            ll_all_gather,
            ll128_all_reduce,
            ll128_collective,
            ll_two_shot_all_reduce,
            staged,
            direct,
            any,
            buffers: direct::DirectBuffers::default(),
            side: g.stream()?,
            fork: g.event()?,
            join: g.event()?,
            ce: ce_all_reduce::Pipeline::new(&g)?,
            scratch,
            channel_table,
            _channels: channels,
            _peers: peers.into_iter().flatten().collect(),
            _connections: connections.into_iter().flatten().collect(),
            ll_slot_bytes,
            ll128_offset,
            ll128_slot_bytes,
            stage_offset,
            ll_flags,
            last: std::sync::atomic::AtomicU8::new(0),
        })
    }

    /// The communicator.
    pub fn communicator(&self) -> &Arc<Communicator> {
        &self.comm
    }

    /// The algorithm the last call on this rank actually ran (after any fallback from the
    /// direct paths to staging), or `None` before the first call.
    pub fn last_algorithm(&self) -> Option<Algorithm> {
        let v = self.last.load(std::sync::atomic::Ordering::Relaxed) as usize;
        v.checked_sub(1)
            .and_then(|i| Algorithm::ALL.get(i).copied())
    }

    /// How many caller allocations the direct paths registered on this rank, and how many
    /// of the peers' allocations they mapped here (both only grow; see `collectives/direct.rs`).
    pub fn registered_buffers(&self) -> (usize, usize) {
        self.buffers.counts()
    }

    /// The configuration in use.
    pub fn config(&self) -> CollectiveConfig {
        self.cfg
    }

    /// All-reduce of `count` elements of `dtype` from `input` into `output` (they may be the
    /// same buffer), by `op`: a [`Reduction`] (sum, product, min, max, average, pre-multiplied
    /// sum) or a [`ReduceOp`].
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
        let red = op.into();
        let kop = red.lower(dtype, self.comm.size(), self.comm.gpu().ordinal())?;
        let bytes = count * dtype.size();
        if bytes == 0 {
            return Ok(());
        }
        let forced = algo.is_some();
        let n = self.comm.size();
        let mut algo = algo.unwrap_or_else(|| self.all_reduce_choice(bytes));
        if n == 1 {
            if kop.op != DeviceReduceOp::PreMulSum {
                // SAFETY: the caller's contract.
                return unsafe { copy_if_needed(stream, output, input, bytes) };
            }
            // One rank still multiplies its contribution (as NCCL does): through staging,
            // which serves any size.
            algo = Algorithm::Staged;
        }
        match algo {
            Algorithm::LlOneShot => {
                let mode = CollectiveMode::AllReduce;
                self.launch_ll(
                    stream,
                    self.part_params(mode, (input, output), bytes, dtype, kop),
                )
            }
            Algorithm::Ll128 => {
                let mut p = self.params(CollectiveMode::AllReduce, dtype, kop);
                (p.input, p.output, p.bytes) = (input, output, bytes as u64);
                self.launch_ll128(stream, p)
            }
            Algorithm::LlTwoShot => {
                let mut p = self.params(CollectiveMode::AllReduce, dtype, kop);
                (p.input, p.output, p.bytes) = (input, output, bytes as u64);
                self.launch_ll_two_shot(stream, p)
            }
            Algorithm::Direct | Algorithm::CopyEngine => {
                let mut mine = vec![(input, bytes), (output, bytes)];
                let mut eligible = direct::disjoint_or_at(input, bytes, output, bytes, Some(0))
                    && direct::whole_vectors(&[input, output], bytes);
                if algo == Algorithm::CopyEngine {
                    // Every rank shares its CE scratch too (or, without one, goes staged).
                    match self.ce.scratch(self.comm.gpu(), self.cfg.ce_scratch_bytes) {
                        Some(s) => mine.push(s),
                        None => eligible = false,
                    }
                }
                let done = self.try_direct(algo, forced, eligible, &mine, |t, a| {
                    if a == Algorithm::CopyEngine {
                        return self.ce_all_reduce(stream, t, bytes, (dtype, kop));
                    }
                    let mut d = self.direct_params(CollectiveMode::AllReduce, bytes);
                    kop.apply(&mut d.common, dtype);
                    (d.common.input, d.common.output) = (input, output);
                    (d.inputs, d.outputs) = (t[0], t[1]);
                    self.launch_direct(stream, d, bytes / n)
                })?;
                if done {
                    return Ok(());
                }
                // SAFETY: the caller's contract.
                unsafe {
                    let staged = Some(Algorithm::Staged);
                    self.all_reduce(input, output, count, dtype, red, stream, staged)
                }
            }
            Algorithm::Staged | Algorithm::TwoShotPut => {
                // Pieces whose per-rank chunks (rounded to 16 bytes) fit the staging region
                // (twice: the put variant keeps an all-gather half).
                let (mode, halves) = match algo {
                    Algorithm::TwoShotPut => (CollectiveMode::AllReducePut, 2),
                    _ => (CollectiveMode::AllReduce, 1),
                };
                let piece = ((self.cfg.stage_bytes / (halves * n)) & !15) * n;
                let mut off = 0;
                while off < bytes {
                    let len = piece.min(bytes - off);
                    let mut p = self.params(mode, dtype, kop);
                    p.input = input.byte_add_cast(off as u64);
                    p.output = output.byte_add_cast(off as u64);
                    p.bytes = len as u64;
                    self.launch_staged(stream, p)?;
                    off += len;
                }
                Ok(())
            }
        }
    }

    /// The all-reduce's algorithm for `bytes` when the caller forces none (module docs): on
    /// fewer than `ll_two_shot_min_ranks` ranks LL128 in its range, else LL16 one-shot up to
    /// `ll_max_bytes`; on more, the two-shot LL from `ll_two_shot_min_bytes` to `ll_max_bytes`
    /// (the one-shot kernels would send `n - 1` copies), LL16 one-shot below; beyond the LL
    /// sizes the copy engines, the direct kernel or staging, by size.
    fn all_reduce_choice(&self, bytes: usize) -> Algorithm {
        let cfg = &self.cfg;
        let many = self.comm.size() >= cfg.ll_two_shot_min_ranks;
        if !many && (cfg.ll128_min_bytes..=cfg.ll128_max_bytes).contains(&bytes) {
            Algorithm::Ll128
        } else if bytes <= cfg.ll_max_bytes {
            if many && bytes >= cfg.ll_two_shot_min_bytes {
                Algorithm::LlTwoShot
            } else {
                Algorithm::LlOneShot
            }
        } else if bytes >= cfg.ce_all_reduce_min_bytes {
            Algorithm::CopyEngine
        } else if bytes >= cfg.direct_min_bytes {
            Algorithm::Direct
        } else {
            Algorithm::Staged
        }
    }

    /// All-gather: every rank's `count` elements land at `output[rank * count ..]` on every
    /// rank. `algo` forces `Staged`, `Direct` or `CopyEngine`.
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
        let bytes = count * dtype.size();
        let (n, me) = (self.comm.size(), self.comm.rank());
        if bytes == 0 {
            return Ok(());
        }
        if self.ll128_part(bytes, algo) {
            let (mode, op) = (CollectiveMode::AllGather, ReduceOp::Sum);
            return self.launch_ll128(
                stream,
                self.part_params(mode, (input, output), bytes, dtype, op),
            );
        }
        let a = self.part_algorithm(bytes, true, true, algo)?;
        if a == Algorithm::LlOneShot {
            let (mode, op) = (CollectiveMode::AllGather, ReduceOp::Sum);
            return self.launch_ll(
                stream,
                self.part_params(mode, (input, output), bytes, dtype, op),
            );
        }
        let eligible = direct::disjoint_or_at(input, bytes, output, n * bytes, Some(me * bytes))
            && direct::whole_vectors(&[input, output], bytes);
        let done = self.try_direct(
            a,
            algo.is_some(),
            eligible,
            &[(output, n * bytes)],
            |t, a| {
                if a == Algorithm::CopyEngine {
                    let copies: Vec<_> = (0..n)
                        .map(|q| (q, t[0][q].byte_add_cast((me * bytes) as u64), input, bytes))
                        .collect();
                    return self.copy_engine(stream, &self.others(), &copies);
                }
                let mut d = self.direct_params(CollectiveMode::AllGather, bytes);
                (d.common.input, d.common.output) = (input, output);
                d.inputs[me] = input;
                d.outputs = t[0];
                self.launch_direct(stream, d, n * bytes)
            },
        )?;
        if done {
            return Ok(());
        }
        // The input piece is offset within the input, the output piece within each part.
        self.parts(
            CollectiveMode::AllGather,
            input,
            output,
            bytes,
            self.cfg.stage_bytes,
            |_| {},
            stream,
        )
    }

    /// Reduce-scatter: `input` holds `nranks * count` elements; rank r receives the reduction
    /// by `op` (a [`Reduction`] or a [`ReduceOp`]) of every rank's part r (`count` elements) in
    /// `output`. `algo` forces `LlOneShot`, `Ll128`, `Staged` or `Direct`.
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
        let op = op
            .into()
            .lower(dtype, self.comm.size(), self.comm.gpu().ordinal())?;
        let bytes = count * dtype.size();
        let (n, me) = (self.comm.size(), self.comm.rank());
        if bytes == 0 {
            return Ok(());
        }
        if self.ll128_part(bytes, algo) {
            let mode = CollectiveMode::ReduceScatter;
            return self.launch_ll128(
                stream,
                self.part_params(mode, (input, output), bytes, dtype, op),
            );
        }
        // LL up to a whole slot: the direct reduce-scatter loads its parts over NVLink, which
        // is slower than packets up to 1 MiB parts (0.8× NCCL at 1 MiB parts on 2×H200).
        let ll_fits = algo.is_none() && bytes <= self.cfg.ll_max_bytes && n > 1;
        let a = if ll_fits {
            Algorithm::LlOneShot
        } else {
            self.part_algorithm(bytes, true, false, algo)?
        };
        if a == Algorithm::LlOneShot {
            let mode = CollectiveMode::ReduceScatter;
            return self.launch_ll(
                stream,
                self.part_params(mode, (input, output), bytes, dtype, op),
            );
        }
        let eligible = direct::disjoint_or_at(output, bytes, input, n * bytes, Some(me * bytes))
            && direct::whole_vectors(&[input, output], bytes);
        let done = self.try_direct(
            a,
            algo.is_some(),
            eligible,
            &[(input, n * bytes)],
            |t, _| {
                let mut d = self.direct_params(CollectiveMode::ReduceScatter, bytes);
                op.apply(&mut d.common, dtype);
                (d.common.input, d.common.output) = (input, output);
                d.inputs = t[0];
                d.outputs[me] = output;
                self.launch_direct(stream, d, bytes)
            },
        )?;
        if done {
            return Ok(());
        }
        let max_piece = (self.cfg.stage_bytes / n) & !15;
        self.parts(
            CollectiveMode::ReduceScatter,
            input,
            output,
            bytes,
            max_piece,
            |p| op.apply(p, dtype),
            stream,
        )
    }

    /// Broadcast of `root`'s `count` elements into every rank's `output`. `algo` forces
    /// `Staged`, `Direct` or `CopyEngine`.
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
        let bytes = count * dtype.size();
        let me = self.comm.rank();
        if bytes == 0 {
            return Ok(());
        }
        let a = self.part_algorithm(bytes, true, true, algo)?;
        if a == Algorithm::LlOneShot {
            let mut p = self.params(CollectiveMode::Broadcast, dtype, ReduceOp::Sum);
            (p.input, p.output, p.root) = (input, output, root as u32);
            p.bytes = bytes as u64;
            return self.launch_ll(stream, p);
        }
        let eligible = (me != root
            || direct::disjoint_or_at(input, bytes, output, bytes, Some(0))
                && direct::whole_vectors(&[input], bytes))
            && direct::whole_vectors(&[output], bytes);
        let done = self.try_direct(a, algo.is_some(), eligible, &[(output, bytes)], |t, a| {
            if a == Algorithm::CopyEngine {
                let copies: Vec<_> = if me == root {
                    (0..self.comm.size())
                        .map(|q| (q, t[0][q], input, bytes))
                        .collect()
                } else {
                    Vec::new()
                };
                return self.copy_engine(stream, &self.others(), &copies);
            }
            let mut d = self.direct_params(CollectiveMode::Broadcast, bytes);
            (d.common.input, d.common.output) = (input, output);
            d.common.root = root as u32;
            d.inputs[me] = input;
            d.outputs = t[0];
            self.launch_direct(stream, d, bytes)
        })?;
        if done {
            return Ok(());
        }
        self.parts(
            CollectiveMode::Broadcast,
            input,
            output,
            bytes,
            self.cfg.stage_bytes,
            |p| p.root = root as u32,
            stream,
        )
    }

    /// All-to-all: part p (`count` elements) of every rank's `input` lands as part r of rank
    /// p's `output`. `algo` forces `Staged`, `Direct` or `CopyEngine` (the last two need
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
        let bytes = count * dtype.size();
        let (n, me) = (self.comm.size(), self.comm.rank());
        if bytes == 0 {
            return Ok(());
        }
        let a = self.part_algorithm(bytes, true, true, algo)?;
        if a == Algorithm::LlOneShot {
            let (mode, op) = (CollectiveMode::AllToAll, ReduceOp::Sum);
            return self.launch_ll(
                stream,
                self.part_params(mode, (input, output), bytes, dtype, op),
            );
        }
        let eligible = direct::disjoint_or_at(input, n * bytes, output, n * bytes, None)
            && direct::whole_vectors(&[input, output], bytes);
        let done = self.try_direct(
            a,
            algo.is_some(),
            eligible,
            &[(output, n * bytes)],
            |t, a| {
                if a == Algorithm::CopyEngine {
                    let copies: Vec<_> = (0..n)
                        .map(|q| {
                            let dst = t[0][q].byte_add_cast((me * bytes) as u64);
                            (q, dst, input.byte_add_cast((q * bytes) as u64), bytes)
                        })
                        .collect();
                    return self.copy_engine(stream, &self.others(), &copies);
                }
                let mut d = self.direct_params(CollectiveMode::AllToAll, bytes);
                (d.common.input, d.common.output) = (input, output);
                d.inputs[me] = input;
                d.outputs = t[0];
                self.launch_direct(stream, d, n * bytes)
            },
        )?;
        if done {
            return Ok(());
        }
        let max_piece = (self.cfg.stage_bytes / n) & !15;
        self.parts(
            CollectiveMode::AllToAll,
            input,
            output,
            bytes,
            max_piece,
            |_| {},
            stream,
        )
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
        let bytes = count * dtype.size();
        if bytes == 0 {
            return Ok(());
        }
        if self.p2p_direct(bytes) {
            let got = self.buffers.exchange(&self.comm, &[peer], &[], true)?;
            if let Some(&(dst, len)) = got.as_ref().and_then(|g| g[0].first()) {
                direct::need_len(&self.comm, peer, len, bytes, "recv's output")?;
                return self.copy_engine(stream, &[peer], &[(peer, dst, input, bytes)]);
            }
        }
        self.parts(
            CollectiveMode::Send,
            input,
            DevicePtr::NULL,
            bytes,
            self.cfg.stage_bytes,
            |p| p.root = peer as u32,
            stream,
        )
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
        let bytes = count * dtype.size();
        if bytes == 0 {
            return Ok(());
        }
        if self.p2p_direct(bytes)
            && self
                .buffers
                .exchange(&self.comm, &[peer], &[(output, bytes)], true)?
                .is_some()
        {
            return self.copy_engine(stream, &[peer], &[]);
        }
        self.parts(
            CollectiveMode::Recv,
            DevicePtr::NULL,
            output,
            bytes,
            self.cfg.stage_bytes,
            |p| p.root = peer as u32,
            stream,
        )
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
        let bytes = count * dtype.size();
        if bytes == 0 {
            return Ok(());
        }
        // Two ranks: one LL exchange for small messages (every rank of the communicator takes
        // part, as LL launches must).
        if self.comm.size() == 2 && bytes <= self.cfg.ll_max_bytes {
            let mut p = self.params(CollectiveMode::Send, dtype, ReduceOp::Sum);
            (p.input, p.output, p.root) = (input, output, next as u32);
            p.bytes = bytes as u64;
            return self.launch_ll(stream, p);
        }
        if self.p2p_direct(bytes) {
            let mut peers = vec![next];
            if prev != next {
                peers.push(prev);
            }
            // Below `ce_min_bytes` the direct kernel moves the data (one launch), which needs
            // whole vectors on both sides; every rank decides the same way from the flags.
            let sm = bytes < self.cfg.ce_min_bytes;
            let eligible = direct::disjoint_or_at(input, bytes, output, bytes, None)
                && (!sm || direct::whole_vectors(&[input, output], bytes));
            let got = self
                .buffers
                .exchange(&self.comm, &peers, &[(output, bytes)], eligible)?;
            if let Some(got) = got {
                let Some(&(dst, len)) = got[0].first() else {
                    self.comm.abort();
                    return Err(Error::MalformedMemory {
                        rank: next,
                        reason: "send_recv without its output".into(),
                    });
                };
                direct::need_len(&self.comm, next, len, bytes, "send_recv's output")?;
                if !sm {
                    return self.copy_engine(stream, &peers, &[(next, dst, input, bytes)]);
                }
                let mut d = self.direct_params(CollectiveMode::Send, bytes);
                (d.common.input, d.common.output) = (input, output);
                d.common.root = next as u32;
                d.inputs[self.comm.rank()] = input;
                // The kernel meets exactly the ranks with an output entry.
                for (&q, theirs) in peers.iter().zip(&got) {
                    d.outputs[q] = theirs.first().map_or(DevicePtr::NULL, |&(p, _)| p);
                }
                return self.launch_direct(stream, d, bytes);
            }
        }
        // SAFETY: the caller's contract.
        unsafe {
            if self.comm.rank().is_multiple_of(2) {
                self.send(input, count, dtype, next, stream)?;
                self.recv(output, count, dtype, prev, stream)
            } else {
                self.recv(output, count, dtype, prev, stream)?;
                self.send(input, count, dtype, next, stream)
            }
        }
    }
}
