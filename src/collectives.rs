//! Collectives on a communicator: `all_reduce` (sum, min, max over f32, f16, bf16, i32, u32),
//! `all_gather`, `reduce_scatter`, `broadcast`, `all_to_all`, `send` / `recv`, in place or
//! out of place, any element count, on a caller's stream.
//!
//! [`Collectives::new`] connects every rank to every other on its node (CUDA IPC / shared
//! memory), allocates a scratch buffer per rank that every peer maps, and builds one row of
//! MemoryChannels (one per peer) for each block the kernels may use. The kernels are in
//! `mscclpp_device::collectives`.
//!
//! Algorithms (chosen by size unless the caller forces one with [`Algorithm`]):
//! - `LlOneShot` (all-reduce up to `ll_max_bytes`): every rank writes its input as LL16 packets
//!   into every peer's scratch and reduces what arrives: one hop, no barrier.
//! - `Staged` (everything, any size): input is staged in the rank's scratch, ranks meet at a
//!   block barrier, and each rank reads its peers' staging over NVLink; all-reduce is a
//!   reduce-scatter followed by an all-gather. Large operations run in pieces of the staging
//!   size.
//! - `TwoShotPut` (all-reduce, any size): only writes cross the links — each rank puts part `q`
//!   of its input into rank `q`'s staging, reduces its own part locally, and puts the result
//!   into every peer's staging.
//!
//! Measured on 2×H200 (BENCHMARKS.md): LL is 1.2–1.7× faster than NCCL up to 512 KiB; the
//! staged paths reach about 220 GB/s bus bandwidth, below NCCL's 320–330 GB/s at ≥ 512 MiB.
//!
//! Every rank must call the same collectives in the same order (as with NCCL); `send` and
//! `recv` pair up between two ranks.

use std::sync::Arc;

use mscclpp_host::communicator::Communicator;
use mscclpp_host::connection::{Connection, EndpointConfig};
use mscclpp_host::gpu::{BackendKind, DeviceBuffer, Kernel, LaunchConfig, Module, Stream};
use mscclpp_host::memory_channel::MemoryChannel;
use mscclpp_host::registered_memory::RegisteredMemory;
use mscclpp_host::semaphore::MemoryDevice2DeviceSemaphore;
use mscclpp_host::transport::Transport;
use mscclpp_host::{Error, Result};
use mscclpp_shared::{
    CollectiveMode, CollectiveParams, DataType, DevicePtr, MemoryChannelDeviceHandle, ReduceOp,
};

use crate::kernels;

/// An algorithm a caller can force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    /// One-shot LL16 packets (all-reduce only; up to `ll_max_bytes`).
    LlOneShot,
    /// Through the staging buffers, reading the peers' staging (every collective).
    Staged,
    /// All-reduce where only writes cross the links: reduce-scatter by puts into the peers'
    /// staging, a local reduction, and an all-gather by puts.
    TwoShotPut,
}

impl Algorithm {
    /// Parses an algorithm name (`ll`, `staged`).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "ll" | "ll-one-shot" | "ll_one_shot" => Some(Self::LlOneShot),
            "staged" | "rs-ag" => Some(Self::Staged),
            "put" | "two-shot-put" => Some(Self::TwoShotPut),
            _ => None,
        }
    }
}

/// Sizes of the communicator-owned buffers and launch shapes.
#[derive(Clone, Copy, Debug)]
pub struct CollectiveConfig {
    /// Largest all-reduce the LL algorithm serves, bytes.
    pub ll_max_bytes: usize,
    /// Staging bytes per rank (an operation larger than fits runs in pieces).
    pub stage_bytes: usize,
    /// Blocks of the staged kernel (and channel rows).
    pub max_blocks: u32,
    /// Threads per block of the staged kernel (it uses 80 registers a thread on sm_90, so at
    /// most 768 fit a block).
    pub threads: u32,
    /// Blocks of the LL kernel.
    pub ll_blocks: u32,
    /// Threads per block of the LL kernel.
    pub ll_threads: u32,
}

impl CollectiveConfig {
    /// Defaults for a backend: GPU-sized on CUDA, small on the CPU backend (threads are OS
    /// threads there).
    pub fn for_backend(kind: BackendKind) -> Self {
        match kind {
            BackendKind::Cuda => Self {
                ll_max_bytes: 1 << 20,
                stage_bytes: 64 << 20,
                max_blocks: 64,
                threads: 512,
                ll_blocks: 32,
                ll_threads: 1024,
            },
            BackendKind::Cpu => Self {
                ll_max_bytes: 64 << 10,
                stage_bytes: 1 << 20,
                max_blocks: 2,
                threads: 16,
                ll_blocks: 2,
                ll_threads: 16,
            },
        }
    }
}

/// The collectives of one communicator.
pub struct Collectives {
    comm: Arc<Communicator>,
    cfg: CollectiveConfig,
    _module: Module,
    ll: Kernel<CollectiveParams>,
    staged: Kernel<CollectiveParams>,
    scratch: DeviceBuffer,
    channel_table: DeviceBuffer,
    _channels: Vec<MemoryChannel>,
    _peers: Vec<RegisteredMemory>,
    _connections: Vec<Arc<dyn Connection>>,
    ll_slot_bytes: u64,
    stage_offset: u64,
    ll_flags: DeviceBuffer,
}

const SCRATCH_TAG: u64 = 0x5c_0000;
const SEMAPHORE_TAG: u64 = 0x5e_0000;

fn up16(x: usize) -> usize {
    (x + 15) & !15
}

impl Collectives {
    /// Sets up collectives with the backend's default configuration. Every rank calls it.
    pub fn new(comm: Arc<Communicator>) -> Result<Self> {
        let cfg = CollectiveConfig::for_backend(comm.gpu().kind());
        Self::with_config(comm, cfg)
    }

    /// Sets up collectives with `cfg` (identical on every rank).
    pub fn with_config(comm: Arc<Communicator>, cfg: CollectiveConfig) -> Result<Self> {
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
        let module = g.load_ptx(crate::DEVICE_PTX)?;
        let ll = module.kernel(kernels::LL_ALL_REDUCE)?;
        let staged = module.kernel(kernels::STAGED_COLLECTIVE)?;
        let ll_slot_bytes = (up16(cfg.ll_max_bytes).div_ceil(8) * 16) as u64;
        let stage_offset = 2 * n as u64 * ll_slot_bytes;
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
            staged,
            scratch,
            channel_table,
            _channels: channels,
            _peers: peers.into_iter().flatten().collect(),
            _connections: connections.into_iter().flatten().collect(),
            ll_slot_bytes,
            stage_offset,
            ll_flags,
        })
    }

    /// The communicator.
    pub fn communicator(&self) -> &Arc<Communicator> {
        &self.comm
    }

    /// The configuration in use.
    pub fn config(&self) -> CollectiveConfig {
        self.cfg
    }

    fn params(&self, mode: CollectiveMode, dtype: DataType, op: ReduceOp) -> CollectiveParams {
        CollectiveParams {
            status: self.comm.status().device_ptr(),
            channels: self.channel_table.ptr().cast(),
            input: DevicePtr::NULL,
            output: DevicePtr::NULL,
            scratch: self.scratch.ptr(),
            bytes: 0,
            ll_flags: self.ll_flags.ptr().cast(),
            ll_slot_bytes: self.ll_slot_bytes,
            stage_offset: self.stage_offset,
            stride: 0,
            reserved: 0,
            dtype: dtype as u32,
            op: op as u32,
            mode: mode as u32,
            rank: self.comm.rank() as u32,
            nranks: self.comm.size() as u32,
            root: 0,
            max_blocks: self.cfg.max_blocks,
        }
    }

    fn staged_config(&self, bytes: u64) -> LaunchConfig {
        let per_block: u64 = if self.comm.gpu().kind() == BackendKind::Cuda {
            64 << 10
        } else {
            1 << 20
        };
        let blocks = bytes
            .div_ceil(per_block)
            .clamp(1, self.cfg.max_blocks as u64) as u32;
        LaunchConfig::new(blocks, self.cfg.threads).with_shared_mem(16)
    }

    /// Refuses to queue work on a communicator that already failed: a device wait gave up
    /// (its recorded error), a peer died or `abort()` was called. A launch would only wait
    /// until the abort flag releases it.
    fn ensure_healthy(&self) -> Result<()> {
        match self
            .comm
            .status()
            .error()
            .or_else(|| self.comm.async_error())
        {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn launch_staged(&self, stream: &Stream, p: CollectiveParams) -> Result<()> {
        self.ensure_healthy()?;
        let cfg = self.staged_config(p.bytes);
        // SAFETY: the callers' contracts (input/output ranges) and our scratch and channel
        // table, which live as long as `self`.
        unsafe { stream.launch(&self.staged, cfg, p) }
    }

    /// All-reduce of `count` elements of `dtype` from `input` into `output` (they may be the
    /// same buffer).
    ///
    /// # Safety
    /// `input` and `output` are device buffers of at least `count` elements, valid until the
    /// work queued on `stream` completes; every rank makes the same call.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_reduce(
        &self,
        input: DevicePtr<u8>,
        output: DevicePtr<u8>,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: &Stream,
        algo: Option<Algorithm>,
    ) -> Result<()> {
        let bytes = count * dtype.size();
        if bytes == 0 {
            return Ok(());
        }
        let algo = algo.unwrap_or(if bytes <= self.cfg.ll_max_bytes {
            Algorithm::LlOneShot
        } else {
            Algorithm::Staged
        });
        let n = self.comm.size();
        if n == 1 {
            // SAFETY: the caller's contract.
            return unsafe { copy_if_needed(stream, output, input, bytes) };
        }
        match algo {
            Algorithm::LlOneShot => {
                if bytes > self.cfg.ll_max_bytes {
                    return Err(Error::Unsupported {
                        what: "the LL all-reduce above ll_max_bytes",
                        backend: self.comm.gpu().kind(),
                    });
                }
                self.ensure_healthy()?;
                let mut p = self.params(CollectiveMode::AllReduce, dtype, op);
                p.input = input;
                p.output = output;
                p.bytes = bytes as u64;
                let threads = self.cfg.ll_threads;
                let packets = bytes.div_ceil(8) as u32;
                let blocks = packets.div_ceil(threads).clamp(1, self.cfg.ll_blocks);
                // SAFETY: the caller's contract, and our scratch.
                unsafe { stream.launch(&self.ll, LaunchConfig::new(blocks, threads), p) }
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
                    let mut p = self.params(mode, dtype, op);
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

    /// Runs a per-part mode in pieces of at most `max_piece` bytes per part.
    #[allow(clippy::too_many_arguments)]
    fn parts(
        &self,
        mode: CollectiveMode,
        input: DevicePtr<u8>,
        output: DevicePtr<u8>,
        part_bytes: usize,
        max_piece: usize,
        fill: impl Fn(&mut CollectiveParams),
        stream: &Stream,
    ) -> Result<()> {
        let max_piece = max_piece.max(16) & !15;
        let mut off = 0;
        while off < part_bytes {
            let len = max_piece.min(part_bytes - off);
            let mut p = self.params(mode, DataType::U32, ReduceOp::Sum);
            p.input = input.byte_add_cast(off as u64);
            p.output = output.byte_add_cast(off as u64);
            p.bytes = len as u64;
            p.stride = part_bytes as u64;
            fill(&mut p);
            self.launch_staged(stream, p)?;
            off += len;
        }
        Ok(())
    }

    /// All-gather: every rank's `count` elements land at `output[rank * count ..]` on every
    /// rank.
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
    ) -> Result<()> {
        let bytes = count * dtype.size();
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
    /// of every rank's part r (`count` elements) in `output`.
    ///
    /// # Safety
    /// As [`Collectives::all_gather`], with `input` of `nranks * count` and `output` of `count`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce_scatter(
        &self,
        input: DevicePtr<u8>,
        output: DevicePtr<u8>,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        let bytes = count * dtype.size();
        let n = self.comm.size();
        let max_piece = (self.cfg.stage_bytes / n) & !15;
        self.parts(
            CollectiveMode::ReduceScatter,
            input,
            output,
            bytes,
            max_piece,
            |p| {
                p.dtype = dtype as u32;
                p.op = op as u32;
            },
            stream,
        )
    }

    /// Broadcast of `root`'s `count` elements into every rank's `output`.
    ///
    /// # Safety
    /// `input` (read on the root) and `output` hold `count` elements; as above.
    pub unsafe fn broadcast(
        &self,
        input: DevicePtr<u8>,
        output: DevicePtr<u8>,
        count: usize,
        dtype: DataType,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.check_rank(root)?;
        let bytes = count * dtype.size();
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
    /// p's `output`.
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
    ) -> Result<()> {
        let bytes = count * dtype.size();
        let max_piece = (self.cfg.stage_bytes / self.comm.size()) & !15;
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

    fn check_rank(&self, r: usize) -> Result<()> {
        if r < self.comm.size() {
            Ok(())
        } else {
            Err(Error::Connect {
                remote_rank: r,
                transport: Transport::local_for(self.comm.gpu().kind()),
                reason: format!("no such rank (world size {})", self.comm.size()),
            })
        }
    }

    fn check_peer(&self, r: usize) -> Result<()> {
        self.check_rank(r)?;
        if r == self.comm.rank() {
            return Err(Error::Connect {
                remote_rank: r,
                transport: Transport::local_for(self.comm.gpu().kind()),
                reason: "send/recv to oneself".into(),
            });
        }
        Ok(())
    }
}

/// Queues `dst <- src` unless they are the same buffer.
///
/// # Safety
/// Both hold `bytes` until the copy completes.
unsafe fn copy_if_needed(
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
