//! The plan interpreter: `executor_kernel` runs one lowered MSCCL++ execution plan, one block
//! per plan threadblock (`mscclpp_shared::executor` has the layouts and what each op kind
//! does; the host's `mscclpp::executor` lowers and verifies the plan).
//!
//! A block copies its program (header and ops) from device memory into its dynamic shared
//! memory, learns the launch's flag, and runs its ops in order. Every thread takes part in
//! every op; after each op the block meets at a vote ([`arch::sync_threads_and`]) that is also
//! how a failed wait stops the whole block: a thread whose wait gave up (abort, spin limit)
//! votes false and every thread returns. Because the block meets after every op, an op sees
//! everything earlier ops of its block wrote, and a signal publishes every thread's earlier
//! writes (the contract of `crate::memory_channel`, "Signalling a block's writes").
//!
//! Ops map onto the device API, nothing twice: copies, puts and gets are [`crate::copy`] (what
//! `MemoryChannel::put` / `get` run), signals and waits are the channels' own
//! ([`MemoryChannel`], [`PortChannel`]), port puts are `PortChannel::put` /
//! `put_with_signal` / `put_with_signal_and_flush` on the channel's handle with the op's
//! memory ids, packets are [`crate::packet`]'s writers and readers, reductions
//! [`crate::reduce::Reducer`].
//!
//! The launch flag (LL packets carry it; with a double scratch buffer its parity picks the
//! half) comes from `ExecutorParams::flags`: every thread reads word 0 (the last completed
//! launch's count), the flag is that count plus one (mod 2^32 − 1, plus one: never 0), and
//! thread 0 of each block then adds 1 to word 1 after the block's barrier and an acq_rel
//! fence; the block whose add completes the count (the grid's size) resets it and, after an
//! acq_rel fence, stores the new count in word 0. So every block's read comes before that
//! store, the next launch (stream order) reads the new count, and a launch replayed from a
//! CUDA graph uses a fresh flag.

use crate::arch;
use crate::copy::copy;
use crate::memory_channel::MemoryChannel;
use crate::packet::{self, Packet};
use crate::port_channel::PortChannel;
use crate::reduce::{Reduce, Reducer};
use crate::semaphore::Host2DeviceSemaphore;
use crate::wait::{record_error, spin_until};
use mscclpp_shared::executor::{
    EXEC_BUF_INPUT, EXEC_BUF_MEMORY, EXEC_BUF_OUTPUT, EXEC_BUF_PORT, EXEC_BUF_SCRATCH,
    EXEC_CHANNEL_MEMORY, EXEC_CHANNEL_PORT, EXEC_MAX_BARRIERS, EXEC_MAX_CHANNELS, EXEC_MAX_OPS,
    EXEC_MAX_REMOTE_BUFFERS, EXEC_MAX_SEMAPHORES, EXEC_PACKET_LL8, ExecBlock, ExecBufRef, ExecOp,
    ExecOpKind, ExecutorParams,
};
use mscclpp_shared::status::error_detail;
use mscclpp_shared::{
    DataType, DeviceErrorCode, DeviceReduceOp, LL8Packet, LL16Packet, PortChannelDeviceHandle,
    WaitSite,
};

crate::kernel! {
    /// Runs block `blockIdx.x`'s program of a lowered execution plan (module docs). Launched
    /// with one block per plan threadblock and `size_of::<ExecBlock>()` bytes of dynamic
    /// shared memory.
    fn executor_kernel(p: ExecutorParams) {
        run(&p)
    }
}

/// What every op of a block needs.
struct Ctx<'a> {
    p: &'a ExecutorParams,
    blk: &'a ExecBlock,
    flag: u32,
    /// This launch's scratch half (bytes added to every scratch address).
    half: u64,
    tid: u32,
    nthreads: u32,
}

/// Records an invalid program (a bug of the host's lowering) and fails the op.
#[inline(always)]
fn invalid(c: &Ctx, what: u64) -> bool {
    record_error(
        c.p.status,
        DeviceErrorCode::InvalidArgument,
        error_detail(WaitSite::Unknown, what),
    );
    false
}

/// Copies block `b`'s header and ops into shared memory (every thread a share of 16-byte
/// words).
#[inline(always)]
fn load_program(p: &ExecutorParams, b: u32, tid: u32, nthreads: u32) -> *const ExecBlock {
    let smem = arch::dynamic_shared_mem();
    // SAFETY: the host passes one `ExecBlock` per block of the launch in device memory.
    let src = unsafe { p.blocks.as_ptr().add(b as usize) } as *const u8;
    // SAFETY: `n_ops` is the first word of the program just located.
    let n_ops = unsafe { (src as *const u32).read_volatile() } as usize;
    let n_ops = if n_ops > EXEC_MAX_OPS {
        EXEC_MAX_OPS
    } else {
        n_ops
    };
    let bytes = ExecBlock::HEADER_BYTES + n_ops * core::mem::size_of::<ExecOp>();
    let mut i = tid as usize * 16;
    while i < bytes {
        // SAFETY: `i + 16 <= bytes <= size_of::<ExecBlock>()`, which the launch gives in
        // shared memory; both sides are 16-byte aligned (`ExecBlock` is, the header and ops
        // are multiples of 16).
        unsafe {
            let v = arch::ld_v4_u32(src.add(i) as *const u32);
            arch::st_v4_u32(smem.add(i) as *mut u32, v);
        }
        i += nthreads as usize * 16;
    }
    smem as *const ExecBlock
}

/// The launch's flag (module docs); thread 0 counts the block in after the block's barrier.
#[inline(always)]
fn begin(p: &ExecutorParams) -> u32 {
    let flags = p.flags.as_ptr();
    // SAFETY: `flags` points at two live u64 words; word 0 was last written by the previous
    // launch, which completed before this one started (stream order).
    let count = unsafe { arch::ld_relaxed_sys_u64(flags) };
    arch::sync_threads();
    if arch::thread_idx_x() == 0 {
        arch::fence_acq_rel_gpu();
        // SAFETY: as above (word 1 is the count of blocks).
        let before = unsafe { arch::atom_add_relaxed_gpu_u64(flags.add(1), 1) };
        if before + 1 == arch::grid_dim_x() as u64 {
            arch::fence_acq_rel_gpu();
            // SAFETY: as above; every block of the launch has counted itself, after its reads.
            unsafe {
                arch::st_relaxed_sys_u64(flags.add(1), 0);
                arch::st_relaxed_sys_u64(flags, count + 1);
            }
        }
    }
    ((count % u32::MAX as u64) + 1) as u32
}

#[inline(always)]
fn run(p: &ExecutorParams) {
    let (b, tid, nthreads) = (
        arch::block_idx_x(),
        arch::thread_idx_x(),
        arch::block_dim_x(),
    );
    let prog = load_program(p, b, tid, nthreads);
    let flag = begin(p);
    let half = if p.scratch_half != 0 && flag.is_multiple_of(2) {
        p.scratch_half
    } else {
        0
    };
    // SAFETY: `load_program` wrote the header and `n_ops` ops, and `begin`'s barrier ordered
    // every thread's share before these reads; nothing writes the shared program after.
    let blk = unsafe { &*prog };
    let c = Ctx {
        p,
        blk,
        flag,
        half,
        tid,
        nthreads,
    };
    let n = (blk.n_ops as usize).min(EXEC_MAX_OPS);
    let mut i = 0;
    while i < n {
        let op = &blk.ops[i];
        if op.kind == ExecOpKind::Pipeline as u8 {
            let inner = (op.aux as usize).min(n - i - 1);
            for it in 0..op.count {
                for j in 1..=inner {
                    let shift = Some((it * op.size, op.size));
                    if !arch::sync_threads_and(exec(&c, &blk.ops[i + j], shift)) {
                        return;
                    }
                }
            }
            i += 1 + inner;
        } else {
            if !arch::sync_threads_and(exec(&c, op, None)) {
                return;
            }
            i += 1;
        }
    }
}

/// `(offset into every reference, bytes)` of `op` in a pipeline iteration `shift` (`(offset,
/// unit)`), or all of it outside a pipeline; nothing past a reference's end.
#[inline(always)]
fn span(op: &ExecOp, shift: Option<(u64, u64)>) -> (u64, u64) {
    match shift {
        None => (0, op.size),
        Some((off, unit)) => {
            let rest = op.size.saturating_sub(off);
            (off, if rest < unit { rest } else { unit })
        }
    }
}

impl Ctx<'_> {
    /// This rank's buffer `kind` (`EXEC_BUF_INPUT` …), the scratch at this launch's half.
    #[inline(always)]
    fn local(&self, kind: u8) -> *mut u8 {
        match kind {
            EXEC_BUF_INPUT => self.p.buffers[0].as_ptr(),
            EXEC_BUF_OUTPUT => self.p.buffers[1].as_ptr(),
            // SAFETY: `half` is 0 or the size of the first half of the scratch allocation.
            _ => unsafe { self.p.buffers[2].as_ptr().add(self.half as usize) },
        }
    }

    /// Where reference `r` points, `shift` bytes in (not for port references).
    #[inline(always)]
    fn addr(&self, r: &ExecBufRef, shift: u64) -> *mut u8 {
        let base = if r.kind == EXEC_BUF_MEMORY {
            let s = r.slot as usize % EXEC_MAX_REMOTE_BUFFERS;
            let half = if self.blk.memory_buffer_kinds[s] == EXEC_BUF_SCRATCH {
                self.half
            } else {
                0
            };
            // SAFETY: the host maps every peer buffer a block names, whole.
            unsafe { self.blk.memory_buffers[s].as_ptr().add(half as usize) }
        } else {
            self.local(r.kind)
        };
        // SAFETY: the host checked that every reference lies inside its buffer.
        unsafe { base.add((r.offset + shift) as usize) }
    }

    /// The proxy's memory id and offset of reference `r`, `shift` bytes in.
    #[inline(always)]
    fn port_loc(&self, r: &ExecBufRef, shift: u64) -> (u32, u64) {
        if r.kind == EXEC_BUF_PORT {
            let s = r.slot as usize % EXEC_MAX_REMOTE_BUFFERS;
            let half = if self.blk.port_buffer_kinds[s] == EXEC_BUF_SCRATCH {
                self.half
            } else {
                0
            };
            (
                self.blk.port_buffer_ids[s],
                self.blk.port_buffer_offsets[s] + half + r.offset + shift,
            )
        } else {
            let k = (r.kind as usize).min(2);
            let half = if r.kind == EXEC_BUF_SCRATCH {
                self.half
            } else {
                0
            };
            (
                self.p.local_memory_ids[k],
                self.p.local_offsets[k] + half + r.offset + shift,
            )
        }
    }

    fn status(&self) -> mscclpp_shared::DevicePtr<mscclpp_shared::DeviceStatus> {
        self.p.status
    }
}

/// Runs one op (every thread of the block), and, for a share of a threadblock group's op,
/// the group's barrier after it; false when a wait gave up.
#[inline(always)]
fn exec(c: &Ctx, op: &ExecOp, shift: Option<(u64, u64)>) -> bool {
    let Some(kind) = ExecOpKind::from_u8(op.kind) else {
        return invalid(c, op.kind as u64);
    };
    let ok = exec_kind(c, op, kind, shift);
    let group_share = op.count != 0
        && !matches!(
            kind,
            ExecOpKind::Nop
                | ExecOpKind::Barrier
                | ExecOpKind::Pipeline
                | ExecOpKind::Signal
                | ExecOpKind::Wait
                | ExecOpKind::RelaxedSignal
                | ExecOpKind::RelaxedWait
                | ExecOpKind::Flush
                | ExecOpKind::SemAcquire
                | ExecOpKind::SemRelease
        );
    if !group_share {
        return ok;
    }
    // Every thread's share of the data before thread 0 meets the group.
    arch::sync_threads_and(ok) && barrier(c, op)
}

/// Runs one op of kind `kind` (every thread of the block); false when a wait gave up.
#[inline(always)]
fn exec_kind(c: &Ctx, op: &ExecOp, kind: ExecOpKind, shift: Option<(u64, u64)>) -> bool {
    let (sh, bytes) = span(op, shift);
    let (n_src, n_dst) = (
        (op.n_src as usize).min(op.src.len()),
        (op.n_dst as usize).min(op.dst.len()),
    );
    let port = op.channel_type == EXEC_CHANNEL_PORT;
    match kind {
        ExecOpKind::Nop | ExecOpKind::Pipeline => true,
        ExecOpKind::Signal
        | ExecOpKind::Wait
        | ExecOpKind::RelaxedSignal
        | ExecOpKind::RelaxedWait
        | ExecOpKind::Flush => channels(c, op, kind),
        ExecOpKind::Barrier => barrier(c, op),
        ExecOpKind::SemRelease | ExecOpKind::SemAcquire => semaphores(c, op, kind),
        ExecOpKind::Put | ExecOpKind::PutWithSignal | ExecOpKind::PutWithSignalAndFlush if port => {
            port_puts(c, op, kind, sh, bytes, false)
        }
        ExecOpKind::Put | ExecOpKind::Get | ExecOpKind::Copy => {
            for k in 0..n_src.min(n_dst) {
                // SAFETY: the host checked both references against their buffers; distinct
                // buffers or disjoint ranges (the verifier refuses overlapping pairs).
                unsafe {
                    copy(
                        c.addr(&op.dst[k], sh),
                        c.addr(&op.src[k], sh),
                        bytes,
                        c.tid as u64,
                        c.nthreads as u64,
                    )
                }
            }
            true
        }
        ExecOpKind::Reduce => reduce(c, op, sh, bytes, n_src, n_dst),
        ExecOpKind::PutWithSignal | ExecOpKind::PutWithSignalAndFlush => invalid(c, op.kind as u64),
        ExecOpKind::PutPackets
        | ExecOpKind::ReadPutPackets
        | ExecOpKind::CopyPackets
        | ExecOpKind::UnpackPackets
        | ExecOpKind::ReducePackets => {
            if c.p.packet == EXEC_PACKET_LL8 {
                packets::<LL8Packet>(c, op, kind)
            } else {
                packets::<LL16Packet>(c, op, kind)
            }
        }
    }
}

/// Signal, wait and flush: thread `k` serves channel `ids[k]`.
#[inline(never)]
fn channels(c: &Ctx, op: &ExecOp, kind: ExecOpKind) -> bool {
    let mut ok = true;
    let mut k = c.tid as usize;
    while k < (op.n_ids as usize).min(op.ids.len()) {
        let id = op.ids[k] as usize % EXEC_MAX_CHANNELS;
        if op.channel_type == EXEC_CHANNEL_MEMORY {
            let ch = &c.blk.memory_channels[id];
            ok &= match kind {
                ExecOpKind::Signal => {
                    ch.signal();
                    true
                }
                ExecOpKind::RelaxedSignal => {
                    ch.relaxed_signal();
                    true
                }
                ExecOpKind::Wait => ch.wait().is_ok(),
                ExecOpKind::RelaxedWait => ch.relaxed_wait().is_ok(),
                _ => invalid(c, op.kind as u64),
            };
        } else if op.channel_type == EXEC_CHANNEL_PORT {
            let ch = &c.blk.port_channels[id];
            ok &= match kind {
                ExecOpKind::Signal | ExecOpKind::RelaxedSignal => ch.signal().is_ok(),
                ExecOpKind::Wait => ch.wait().is_ok(),
                ExecOpKind::RelaxedWait => ch.semaphore.relaxed_wait().is_ok(),
                _ => ch.flush().is_ok(),
            };
        } else {
            return invalid(c, op.channel_type as u64);
        }
        k += c.nthreads as usize;
    }
    ok
}

/// `count` blocks meet at barrier `aux`: thread 0 takes a ticket, its generation is complete
/// when the counter reaches the generation's end (counters only grow, across launches too).
#[inline(never)]
fn barrier(c: &Ctx, op: &ExecOp) -> bool {
    if c.tid != 0 {
        return true;
    }
    let n = if op.count == 0 { 1 } else { op.count };
    let ctr = {
        let id = (op.aux as usize) % EXEC_MAX_BARRIERS;
        // SAFETY: `barriers` holds `EXEC_MAX_BARRIERS` live u64 words.
        unsafe { c.p.barriers.as_ptr().add(id) }
    };
    // Release: the block's writes (ordered before this by the op barrier) before the ticket.
    arch::fence_acq_rel_sys();
    // SAFETY: as above.
    let t = unsafe { arch::atom_add_relaxed_gpu_u64(ctr, 1) };
    let end = (t / n + 1) * n;
    let r = spin_until(c.status(), WaitSite::GridBarrier, ctr as u64, || {
        // SAFETY: as above.
        unsafe { arch::ld_acquire_gpu_u64(ctr) >= end }
    });
    arch::fence_acq_rel_sys();
    r.is_ok()
}

/// Device semaphores: thread `k` releases or acquires semaphore `ids[k]` (three words each:
/// releases, tickets, initial value).
#[inline(never)]
fn semaphores(c: &Ctx, op: &ExecOp, kind: ExecOpKind) -> bool {
    let mut ok = true;
    let mut k = c.tid as usize;
    while k < (op.n_ids as usize).min(op.ids.len()) {
        let s = op.ids[k] as usize % EXEC_MAX_SEMAPHORES;
        // SAFETY: `semaphores` holds `3 * EXEC_MAX_SEMAPHORES` live u64 words.
        let w = unsafe { c.p.semaphores.as_ptr().add(3 * s) };
        if kind == ExecOpKind::SemRelease {
            // SAFETY: as above.
            unsafe { arch::red_add_release_gpu_u64(w, 1) };
        } else {
            // SAFETY: as above.
            let (t, init) = unsafe {
                (
                    arch::atom_add_relaxed_gpu_u64(w.add(1), 1),
                    arch::ld_relaxed_sys_u64(w.add(2)),
                )
            };
            ok &= spin_until(c.status(), WaitSite::Semaphore, w as u64, || {
                // SAFETY: as above.
                init + unsafe { arch::ld_acquire_gpu_u64(w) } > t
            })
            .is_ok();
        }
        k += c.nthreads as usize;
    }
    ok
}

/// Every 16 bytes: the fold of every source, stored to every destination.
#[inline(never)]
fn reduce(c: &Ctx, op: &ExecOp, sh: u64, bytes: u64, n_src: usize, n_dst: usize) -> bool {
    let Some(r) = reducer(c, op) else {
        return false;
    };
    let vecs = bytes / 16;
    let mut v = c.tid as u64;
    while v < vecs {
        let at = sh + v * 16;
        let load = |k: usize| {
            // SAFETY: the host checked every reference against its buffer; offsets and sizes
            // are multiples of 16 (the plan's alignment), so are the buffers' starts.
            unsafe { arch::ld_v4_u32(c.addr(&op.src[k], at) as *const u32) }
        };
        let mut acc = r.pre_v4(load(0));
        for k in 1..n_src {
            acc = r.fold_v4(acc, load(k));
        }
        let acc = r.post_v4(acc);
        for k in 0..n_dst {
            // SAFETY: as above.
            unsafe { arch::st_v4_u32(c.addr(&op.dst[k], at) as *mut u32, acc) };
        }
        v += c.nthreads as u64;
    }
    true
}

/// The reducer of `op` for the launch's type, or `None` (recorded) for values no host sends.
#[inline(always)]
fn reducer(c: &Ctx, op: &ExecOp) -> Option<Reducer> {
    let dtype = DataType::from_u32(c.p.dtype);
    let rop = DeviceReduceOp::from_u32(op.reduce_op as u32).filter(|o| {
        matches!(
            o,
            DeviceReduceOp::Sum | DeviceReduceOp::Min | DeviceReduceOp::Max
        )
    });
    match (dtype, rop) {
        (Some(d), Some(o)) => Some(Reducer::plain(d, o)),
        _ => {
            invalid(c, c.p.dtype as u64);
            None
        }
    }
}

/// Port puts: (for `ReadPutPackets`, once the packets are all there) thread `k` pushes the
/// pair `k`'s put, with a signal (and a flush) as the kind says, on channel `ids[k]`.
#[inline(never)]
fn port_puts(c: &Ctx, op: &ExecOp, kind: ExecOpKind, sh: u64, bytes: u64, one_src: bool) -> bool {
    let mut ok = true;
    let n = (op.n_dst as usize).min((op.n_ids as usize).min(op.ids.len()));
    let mut k = c.tid as usize;
    while k < n {
        let ch = c.blk.port_channels[op.ids[k] as usize % EXEC_MAX_CHANNELS];
        let (dst, dst_off) = c.port_loc(&op.dst[k], sh);
        let (src, src_off) = c.port_loc(&op.src[if one_src { 0 } else { k }], sh);
        let h = PortChannelDeviceHandle { dst, src, ..ch };
        ok &= match kind {
            ExecOpKind::PutWithSignal => h.put_with_signal(dst_off, src_off, bytes).is_ok(),
            ExecOpKind::PutWithSignalAndFlush => {
                h.put_with_signal_and_flush(dst_off, src_off, bytes).is_ok()
            }
            _ => h.put(dst_off, src_off, bytes).is_ok(),
        };
        k += c.nthreads as usize;
    }
    ok
}

/// The 8-byte data unit `u` of the packets at `pk`, waiting for them (LL16: one packet; LL8:
/// two).
///
/// # Safety
/// The packets of unit `u` lie inside the buffer at `pk`.
#[inline(always)]
unsafe fn read_unit<P: Packet>(c: &Ctx, pk: *const P, u: u64) -> Result<[u32; 2], DeviceErrorCode> {
    let per = (8 / P::PAYLOAD) as u64;
    // SAFETY: the caller's contract.
    unsafe {
        let first = packet::read_packet(pk.add((u * per) as usize), c.flag, c.status())?;
        if per == 1 {
            return Ok(first);
        }
        let second = packet::read_packet(pk.add((u * per + 1) as usize), c.flag, c.status())?;
        Ok([first[0], second[0]])
    }
}

/// Writes the 8-byte data unit `u` as packets at `pk`.
///
/// # Safety
/// The packets of unit `u` lie inside the buffer at `pk`.
#[inline(always)]
unsafe fn store_unit<P: Packet>(c: &Ctx, pk: *mut P, u: u64, w: [u32; 2]) {
    let per = (8 / P::PAYLOAD) as u64;
    // SAFETY: the caller's contract.
    unsafe {
        if per == 1 {
            P::store(pk.add(u as usize), w, c.flag);
        } else {
            P::store(pk.add((2 * u) as usize), [w[0], 0], c.flag);
            P::store(pk.add((2 * u + 1) as usize), [w[1], 0], c.flag);
        }
    }
}

/// The packet ops, for packets of type `P`.
#[inline(never)]
fn packets<P: Packet>(c: &Ctx, op: &ExecOp, kind: ExecOpKind) -> bool {
    let bytes = op.size;
    let (n_src, n_dst) = (
        (op.n_src as usize).min(op.src.len()),
        (op.n_dst as usize).min(op.dst.len()),
    );
    let port = op.channel_type == EXEC_CHANNEL_PORT;
    let (tid, nt) = (c.tid as usize, c.nthreads as usize);
    match kind {
        ExecOpKind::PutPackets if port => port_puts(c, op, ExecOpKind::Put, 0, 2 * bytes, false),
        ExecOpKind::PutPackets | ExecOpKind::CopyPackets => {
            for k in 0..n_src.min(n_dst) {
                // SAFETY: the host checked both references (the packets: twice the bytes).
                unsafe {
                    packet::put_packets::<P>(
                        c.addr(&op.dst[k], 0) as *mut P,
                        c.addr(&op.src[k], 0),
                        bytes as usize,
                        tid,
                        nt,
                        c.flag,
                    )
                }
            }
            true
        }
        ExecOpKind::UnpackPackets => {
            // SAFETY: as above.
            unsafe {
                packet::unpack_packets::<P>(
                    c.addr(&op.dst[0], 0),
                    c.addr(&op.src[0], 0) as *const P,
                    bytes as usize,
                    tid,
                    nt,
                    c.flag,
                    c.status(),
                )
            }
            .is_ok()
        }
        ExecOpKind::ReadPutPackets => {
            let src = c.addr(&op.src[0], 0) as *const P;
            let n = packet::packets_for::<P>(bytes as usize);
            let mut ok = true;
            let mut i = tid;
            while i < n && ok {
                // SAFETY: packet `i` of the source and of every destination is in range.
                match unsafe { packet::read_packet(src.add(i), c.flag, c.status()) } {
                    Ok(w) if !port => {
                        for k in 0..n_dst {
                            // SAFETY: as above.
                            unsafe {
                                P::store((c.addr(&op.dst[k], 0) as *mut P).add(i), w, c.flag)
                            };
                        }
                    }
                    Ok(_) => {}
                    Err(_) => ok = false,
                }
                i += nt;
            }
            if !port {
                return ok;
            }
            // Every packet is here (all threads agree, or none pushes): the proxy copies them.
            arch::sync_threads_and(ok) && port_puts(c, op, ExecOpKind::Put, 0, 2 * bytes, true)
        }
        ExecOpKind::ReducePackets => {
            let Some(r) = reducer(c, op) else {
                return false;
            };
            let units = bytes / 8;
            let mut u = tid as u64;
            while u < units {
                // SAFETY: the host checked every reference: the data at 8-byte granularity,
                // the packets of each unit.
                let mut acc = r.pre(unsafe {
                    (c.addr(&op.src[0], 0).add((u * 8) as usize) as *const [u32; 2]).read()
                });
                for k in 1..n_src {
                    // SAFETY: as above.
                    match unsafe { read_unit::<P>(c, c.addr(&op.src[k], 0) as *const P, u) } {
                        Ok(w) => acc = r.fold(acc, w),
                        Err(_) => return false,
                    }
                }
                let acc = r.post(acc);
                for k in 0..n_dst {
                    let d = c.addr(&op.dst[k], 0);
                    // SAFETY: as above.
                    unsafe {
                        if op.dst[k].packet != 0 {
                            store_unit::<P>(c, d as *mut P, u, acc);
                        } else {
                            (d.add((u * 8) as usize) as *mut [u32; 2]).write(acc);
                        }
                    }
                }
                u += nt as u64;
            }
            true
        }
        _ => invalid(c, op.kind as u64),
    }
}
