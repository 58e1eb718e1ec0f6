//! How each algorithm is queued: kernel parameter blocks and launches (LL, staged, direct), the
//! exchange of registered buffers before a direct call, copy-engine transfers between barriers,
//! and the choice of path for a per-part collective. The public operations in `mod.rs` call
//! these; every rank makes the same calls in the same order, so the choices agree.

use mscclpp_host::gpu::Kernel;
use mscclpp_host::gpu::{BackendKind, LaunchConfig, Stream};
use mscclpp_host::transport::Transport;
use mscclpp_host::{Error, Result};
use mscclpp_shared::{
    CollectiveMode, CollectiveParams, DataType, DevicePtr, DeviceReduceOp, DirectCollectiveParams,
    MAX_DIRECT_RANKS, MemoryChannelDeviceHandle, ReduceOp, packet::ll128,
};

use super::{Algorithm, Collectives, KernelOp, direct};

/// Whether a launch with `p` reduces something other than a common sum (f16, bf16, f32),
/// which only the `_any` twin of a reducing kernel serves.
fn needs_any(p: &CollectiveParams) -> bool {
    let reduces = [
        CollectiveMode::AllReduce,
        CollectiveMode::AllReducePut,
        CollectiveMode::ReduceScatter,
        CollectiveMode::ReduceLocal,
    ]
    .iter()
    .any(|&m| m as u32 == p.mode);
    let common = match (DataType::from_u32(p.dtype), DeviceReduceOp::from_u32(p.op)) {
        (Some(d), Some(o)) => o.is_common_sum(d),
        _ => false,
    };
    reduces && !common
}

impl Collectives {
    pub(super) fn record(&self, a: Algorithm) {
        self.last
            .store(a as u8 + 1, std::sync::atomic::Ordering::Relaxed);
    }

    pub(super) fn params(
        &self,
        mode: CollectiveMode,
        dtype: DataType,
        op: impl Into<KernelOp>,
    ) -> CollectiveParams {
        let op = op.into();
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
            ll128_offset: self.ll128_offset,
            ll128_slot_bytes: self.ll128_slot_bytes,
            stride: 0,
            reserved: 0,
            dtype: dtype as u32,
            op: op.op as u32,
            scalar: op.scalar,
            scalar_ptr: op.scalar_ptr,
            mode: mode as u32,
            rank: self.comm.rank() as u32,
            nranks: self.comm.size() as u32,
            root: 0,
            max_blocks: self.cfg.max_blocks,
        }
    }

    pub(super) fn staged_config(&self, bytes: u64) -> LaunchConfig {
        let per_block: u64 = if self.comm.gpu().kind() == BackendKind::Cuda {
            64 << 10
        } else {
            1 << 20
        };
        let blocks = bytes
            .div_ceil(per_block)
            .clamp(1, self.cfg.staged_blocks.min(self.cfg.max_blocks) as u64)
            as u32;
        LaunchConfig::new(blocks, self.cfg.threads).with_shared_mem(16)
    }

    /// Refuses to queue work on a communicator that already failed: a device wait gave up
    /// (its recorded error), a peer died or `abort()` was called. A launch would only wait
    /// until the abort flag releases it.
    pub(super) fn ensure_healthy(&self) -> Result<()> {
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

    /// `main`, or `any` when `p` reduces something the main kernels do not serve.
    fn pick<'k, P>(
        &self,
        main: &'k Kernel<P>,
        any: &'k Kernel<P>,
        p: &CollectiveParams,
    ) -> &'k Kernel<P> {
        if needs_any(p) { any } else { main }
    }

    pub(super) fn launch_staged(&self, stream: &Stream, p: CollectiveParams) -> Result<()> {
        self.ensure_healthy()?;
        self.record(if p.mode == CollectiveMode::AllReducePut as u32 {
            Algorithm::TwoShotPut
        } else {
            Algorithm::Staged
        });
        let cfg = self.staged_config(p.bytes);
        let kernel = self.pick(&self.staged, &self.any.staged, &p);
        // SAFETY: the callers' contracts (input/output ranges) and our scratch and channel
        // table, which live as long as `self`.
        unsafe { stream.launch(kernel, cfg, p) }
    }

    /// Queues the LL kernel for `p` (its mode, buffers and `bytes` per part filled in).
    pub(super) fn launch_ll(&self, stream: &Stream, p: CollectiveParams) -> Result<()> {
        if p.bytes as usize > self.cfg.ll_max_bytes {
            return Err(self.cannot("an LL call above ll_max_bytes per part"));
        }
        self.ensure_healthy()?;
        self.record(Algorithm::LlOneShot);
        let kernel = match p.mode {
            _ if needs_any(&p) => &self.any.ll,
            m if m == CollectiveMode::AllReduce as u32 => &self.ll_all_reduce,
            m if m == CollectiveMode::AllGather as u32 => &self.ll_all_gather,
            _ => &self.ll,
        };
        let shape = self.ll_shape(p.bytes.div_ceil(8));
        // SAFETY: the caller's contract (buffers sized for the mode), and our scratch.
        unsafe { stream.launch(kernel, shape, p) }
    }

    /// The launch shape of an LL kernel whose threads handle `packets` packet indices (each
    /// for every peer): up to `ll_single_block_packets`, one block, one thread a packet (a
    /// single block stores the next flag without the grid's block count: 0.3 µs less at 4 KiB
    /// on 2×H200); beyond, blocks of `ll_threads` and the keeper block.
    fn ll_shape(&self, packets: u64) -> LaunchConfig {
        let packets = packets.min(u32::MAX as u64) as u32;
        let (blocks, threads) = if packets <= self.cfg.ll_single_block_packets {
            (1, packets.next_multiple_of(32).clamp(32, 1024))
        } else {
            let t = self.cfg.ll_threads;
            (packets.div_ceil(t).clamp(1, self.cfg.ll_blocks), t)
        };
        LaunchConfig::new(with_keeper(blocks), threads)
    }

    /// Queues the two-shot LL all-reduce for `p` (buffers and `bytes` filled in): one part of
    /// whole packets per rank (`stride`). A call too small for every rank to own a non-empty
    /// part (fewer than about `8 n (n - 1)` bytes), or whose two parts of packets do not fit an
    /// LL slot (two ranks near `ll_max_bytes`), runs the one-shot kernel instead, which serves
    /// every size up to `ll_max_bytes`; every rank decides alike from the same sizes.
    pub(super) fn launch_ll_two_shot(
        &self,
        stream: &Stream,
        mut p: CollectiveParams,
    ) -> Result<()> {
        if p.bytes as usize > self.cfg.ll_max_bytes {
            return Err(self.cannot("an LL call above ll_max_bytes per part"));
        }
        let n = p.nranks as u64;
        let part = p.bytes.div_ceil(n).next_multiple_of(8);
        if (n - 1) * part >= p.bytes || 4 * part > self.ll_slot_bytes {
            return self.launch_ll(stream, p);
        }
        self.ensure_healthy()?;
        self.record(Algorithm::LlTwoShot);
        p.stride = part;
        let shape = self.ll_shape(part / 8);
        let kernel = self.pick(&self.ll_two_shot_all_reduce, &self.any.ll_two_shot, &p);
        // SAFETY: the caller's contract (buffers of `bytes`), and our scratch, whose LL slots
        // hold `ll_slot_bytes >= 4 * part`: two parts of packets.
        unsafe { stream.launch(kernel, shape, p) }
    }

    /// Queues the LL128 kernel for `p` (its mode, buffers, `bytes` per part and `stride`
    /// filled in: the all-reduce's kernel, or the all-gather and reduce-scatter one). One warp
    /// per 480-byte step: blocks of `ll128_threads`, halved (down to one warp) until there are at
    /// least `ll128_blocks` of them, at most `ll128_max_blocks` (the warps loop beyond).
    pub(super) fn launch_ll128(&self, stream: &Stream, p: CollectiveParams) -> Result<()> {
        if p.bytes as usize > self.cfg.ll128_max_bytes {
            return Err(self.cannot("an LL128 call above ll128_max_bytes"));
        }
        self.ensure_healthy()?;
        let steps = p.bytes.div_ceil(ll128::WARP_DATA_BYTES as u64);
        let warp = ll128::WARP_LANES as u32;
        let mut threads = (self.cfg.ll128_threads / warp).max(1) * warp;
        while threads > warp
            && steps.div_ceil((threads / warp) as u64) < self.cfg.ll128_blocks as u64
        {
            threads /= 2;
        }
        threads = (threads / warp).max(1) * warp;
        let blocks = steps
            .div_ceil((threads / warp) as u64)
            .clamp(1, self.cfg.ll128_max_blocks.max(1) as u64) as u32;
        let blocks = with_keeper(blocks);
        self.record(Algorithm::Ll128);
        let kernel = if needs_any(&p) {
            &self.any.ll128
        } else if p.mode == CollectiveMode::AllReduce as u32 {
            &self.ll128_all_reduce
        } else {
            &self.ll128_collective
        };
        // SAFETY: the caller's contract (buffers sized for the mode), and our scratch, whose
        // LL128 region holds `ll128_slot_bytes` per slot for up to `ll128_max_bytes`.
        unsafe { stream.launch(kernel, LaunchConfig::new(blocks, threads), p) }
    }

    /// Whether a per-part collective (all-gather, reduce-scatter) of `part` bytes takes LL128:
    /// forced, or by size (`ll128_part_min_bytes` to `ll128_max_bytes`) when nothing is forced.
    pub(super) fn ll128_part(&self, part: usize, algo: Option<Algorithm>) -> bool {
        match algo {
            Some(a) => a == Algorithm::Ll128,
            None => {
                self.comm.size() > 1
                    && (self.cfg.ll128_part_min_bytes..=self.cfg.ll128_max_bytes).contains(&part)
            }
        }
    }

    /// The parameters of a per-part call (LL and LL128): `part` bytes a part, the parts `part`
    /// apart.
    pub(super) fn part_params(
        &self,
        mode: CollectiveMode,
        (input, output): (DevicePtr<u8>, DevicePtr<u8>),
        part: usize,
        dtype: DataType,
        op: impl Into<KernelOp>,
    ) -> CollectiveParams {
        let mut p = self.params(mode, dtype, op);
        (p.input, p.output) = (input, output);
        p.bytes = part as u64;
        p.stride = part as u64;
        p
    }

    /// The ranks other than this one.
    pub(super) fn others(&self) -> Vec<usize> {
        (0..self.comm.size())
            .filter(|&q| q != self.comm.rank())
            .collect()
    }

    /// Registers and exchanges the buffers of a symmetric direct call: every rank shares
    /// `mine` with every other, with the same lengths (checked: another length is an error).
    /// Returns, per shared buffer, every rank's copy as addressed here (indexed by rank), or
    /// `None` when some rank cannot go direct (then all stage).
    pub(super) fn exchange_all(
        &self,
        mine: &[(DevicePtr<u8>, usize)],
    ) -> Result<Option<Vec<[DevicePtr<u8>; MAX_DIRECT_RANKS]>>> {
        if self.comm.size() > MAX_DIRECT_RANKS {
            return Ok(None);
        }
        let peers = self.others();
        let Some(got) = self.buffers.exchange(&self.comm, &peers, mine, true)? else {
            return Ok(None);
        };
        let mut table = vec![[DevicePtr::NULL; MAX_DIRECT_RANKS]; mine.len()];
        for (k, &(p, _)) in mine.iter().enumerate() {
            table[k][self.comm.rank()] = p;
        }
        for (&q, theirs) in peers.iter().zip(&got) {
            if theirs.len() != mine.len() {
                self.comm.abort();
                return Err(Error::MalformedMemory {
                    rank: q,
                    reason: format!("{} buffers for a call sharing {}", theirs.len(), mine.len()),
                });
            }
            for (k, (&(p, len), &(_, need))) in theirs.iter().zip(mine).enumerate() {
                direct::same_len(&self.comm, q, len, need, "a direct collective's buffer")?;
                table[k][q] = p;
            }
        }
        Ok(Some(table))
    }

    pub(super) fn direct_params(
        &self,
        mode: CollectiveMode,
        bytes: usize,
    ) -> DirectCollectiveParams {
        let mut common = self.params(mode, DataType::U32, ReduceOp::Sum);
        common.bytes = bytes as u64;
        common.stride = bytes as u64;
        DirectCollectiveParams {
            common,
            ..Default::default()
        }
    }

    /// Queues the direct kernel over `work` bytes (what one rank moves).
    pub(super) fn launch_direct(
        &self,
        stream: &Stream,
        d: DirectCollectiveParams,
        work: usize,
    ) -> Result<()> {
        self.ensure_healthy()?;
        let most = self.cfg.direct_blocks.min(self.cfg.max_blocks) as usize;
        let blocks = work.div_ceil(self.cfg.direct_block_bytes).clamp(1, most) as u32;
        let cfg = LaunchConfig::new(blocks, self.cfg.direct_threads).with_shared_mem(16);
        self.record(Algorithm::Direct);
        let kernel = self.pick(&self.direct, &self.any.direct, &d.common);
        // SAFETY: the buffers were registered and sized by the caller's contract; the channel
        // table lives as long as `self`.
        unsafe { stream.launch(kernel, cfg, d) }
    }

    /// Queues one block meeting the ranks in `peers` (copy-engine brackets).
    pub(super) fn launch_barrier(&self, stream: &Stream, peers: &[usize]) -> Result<()> {
        self.launch_barrier_row(stream, peers, 0)
    }

    /// [`launch_barrier`](Self::launch_barrier) on channel row `row` (`< max_blocks`), for
    /// meetings queued on concurrent streams, which must not share a row's semaphores.
    pub(super) fn launch_barrier_row(
        &self,
        stream: &Stream,
        peers: &[usize],
        row: u32,
    ) -> Result<()> {
        self.ensure_healthy()?;
        let mut d = self.direct_params(CollectiveMode::Barrier, 0);
        let handle = std::mem::size_of::<MemoryChannelDeviceHandle>() as u64;
        let row = row.min(self.cfg.max_blocks - 1);
        d.common.channels = d
            .common
            .channels
            .byte_add_cast(row as u64 * self.comm.size() as u64 * handle);
        d.common.max_blocks -= row;
        d.common.root = peers.iter().fold(0u32, |m, &q| m | (1 << q));
        let cfg = LaunchConfig::new(1, 32).with_shared_mem(16);
        // SAFETY: touches only the channel table's semaphores, which live as long as `self`.
        unsafe { stream.launch(&self.direct, cfg, d) }
    }

    /// Queues `copies` (target rank, destination, source, bytes) on the copy engines between
    /// two barriers with `peers`. The copy into this rank's own buffer runs on the side stream,
    /// beside the barrier and the copies over NVLink (another copy engine), and is joined
    /// before the closing barrier.
    pub(super) fn copy_engine(
        &self,
        stream: &Stream,
        peers: &[usize],
        copies: &[(usize, DevicePtr<u8>, DevicePtr<u8>, usize)],
    ) -> Result<()> {
        let me = self.comm.rank();
        let local: Vec<_> = copies
            .iter()
            .filter(|&&(q, dst, src, _)| q == me && dst != src)
            .collect();
        if !local.is_empty() {
            stream.record(&self.fork)?;
            self.side.wait_event(&self.fork)?;
            for &&(_, dst, src, len) in &local {
                // SAFETY: ranges of this rank's buffers of the sizes the caller's contract
                // gives; no peer touches them (they are this rank's own part).
                unsafe { copy_if_needed(&self.side, dst, src, len)? };
            }
            self.side.record(&self.join)?;
        }
        self.launch_barrier(stream, peers)?;
        for &(q, dst, src, len) in copies {
            if q != me {
                // SAFETY: ranges of registered buffers of the sizes the caller's contract gives.
                unsafe { copy_if_needed(stream, dst, src, len)? };
            }
        }
        if !local.is_empty() {
            stream.wait_event(&self.join)?;
        }
        self.record(Algorithm::CopyEngine);
        self.launch_barrier(stream, peers)
    }

    /// The unsupported-path error of a forced algorithm.
    pub(super) fn cannot(&self, what: &'static str) -> Error {
        Error::Unsupported {
            what,
            backend: self.comm.gpu().kind(),
        }
    }

    /// Runs a per-part mode in pieces of at most `max_piece` bytes per part.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn parts(
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

    /// The path of a per-part collective of `part` bytes: the forced one, or by size (LL
    /// where `ll` allows, the copy engines where `ce` allows, then the direct kernel, then
    /// staging).
    pub(super) fn part_algorithm(
        &self,
        part: usize,
        ll: bool,
        ce: bool,
        algo: Option<Algorithm>,
    ) -> Result<Algorithm> {
        match algo {
            Some(Algorithm::TwoShotPut | Algorithm::Ll128 | Algorithm::LlTwoShot) => {
                Err(self.cannot("an all-reduce algorithm for this collective"))
            }
            Some(Algorithm::LlOneShot) if !ll => {
                Err(self.cannot("an LL variant of this collective"))
            }
            None if ll && part <= self.cfg.ll_part_max_bytes => Ok(Algorithm::LlOneShot),
            Some(Algorithm::CopyEngine) if !ce => {
                Err(self.cannot("a copy-engine reduction (use `direct` or `staged`)"))
            }
            Some(a) => Ok(a),
            None if ce && part >= self.cfg.ce_min_bytes => Ok(Algorithm::CopyEngine),
            None if part >= self.cfg.direct_min_bytes => Ok(Algorithm::Direct),
            None => Ok(Algorithm::Staged),
        }
    }

    /// Runs a per-part collective on the registered buffers (`shared` is what every rank
    /// shares; `queue` gets the buffers table and the chosen algorithm). `Ok(false)`: some
    /// rank cannot go direct and nothing was forced, so the caller stages.
    pub(super) fn try_direct(
        &self,
        algo: Algorithm,
        forced: bool,
        eligible: bool,
        shared: &[(DevicePtr<u8>, usize)],
        queue: impl FnOnce(&[[DevicePtr<u8>; MAX_DIRECT_RANKS]], Algorithm) -> Result<()>,
    ) -> Result<bool> {
        if algo == Algorithm::Staged {
            return Ok(false);
        }
        if self.comm.size() > MAX_DIRECT_RANKS {
            // Decided alike on every rank, with no exchange: an eligible rank must not skip
            // the exchange that an ineligible one would wait in.
            return if forced {
                Err(self.cannot("the direct path on more than MAX_DIRECT_RANKS ranks"))
            } else {
                Ok(false)
            };
        }
        let table = if eligible {
            self.exchange_all(shared)?
        } else {
            // Still exchange, so that every rank learns that this one stages.
            self.buffers
                .exchange(&self.comm, &self.others(), shared, false)?;
            None
        };
        match table {
            Some(t) => queue(&t, algo).map(|()| true),
            None if forced => Err(self.cannot("the direct path on these buffers")),
            None => Ok(false),
        }
    }

    /// Whether a point-to-point transfer of `bytes` tries the copy engines on registered
    /// buffers (the same answer on both sides).
    pub(super) fn p2p_direct(&self, bytes: usize) -> bool {
        bytes >= self.cfg.direct_min_bytes && self.comm.size() <= MAX_DIRECT_RANKS
    }

    pub(super) fn check_rank(&self, r: usize) -> Result<()> {
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

    pub(super) fn check_peer(&self, r: usize) -> Result<()> {
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

/// An LL launch's grid for `blocks` working blocks: one more, the keeper that advances the
/// launch's flag, when there are several (`mscclpp_device::collectives::ll::ll_begin`).
fn with_keeper(blocks: u32) -> u32 {
    if blocks > 1 { blocks + 1 } else { blocks }
}

/// Queues `dst <- src` unless they are the same buffer.
///
/// # Safety
/// Both hold `bytes` until the copy completes.
pub(super) unsafe fn copy_if_needed(
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
