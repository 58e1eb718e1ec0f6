//! The built-in kernels. Each is a thin entry point (see [`crate::kernel!`]) over
//! `#[inline(always)]` device functions; each takes one parameter struct from
//! `mscclpp_shared::kernel_params`.

use crate::arch;
use crate::fifo::FifoDevice;
use crate::memory_channel::MemoryChannel;
use crate::port_channel::PortChannel;
use crate::trace;
use mscclpp_shared::{
    BlockSumParams, BlockVoteParams, CopyParams, FifoPushParams, LL16Packet, PingPongParams,
    PortPingPongParams, ProxyTrigger, TraceEventKind, TriggerFields, TriggerType,
};

crate::kernel! {
    /// Copies `p.bytes` from `p.src` to `p.dst` with every thread of the grid.
    fn copy_kernel(p: CopyParams) {
        // SAFETY: the launcher passes buffers valid for `bytes` (kernel contract).
        unsafe {
            crate::copy::copy(
                p.dst.as_ptr(),
                p.src.as_ptr(),
                p.bytes,
                arch::global_thread_idx() as u64,
                arch::global_thread_count() as u64,
            )
        }
    }
}

crate::kernel! {
    /// Block `b` writes the sum of `input[b*n..(b+1)*n]` to `output[b]`, reducing through
    /// dynamic shared memory (`block_dim * 4` bytes) and `sync_threads`.
    fn block_sum_kernel(p: BlockSumParams) {
        let t = arch::thread_idx_x();
        let b = arch::block_idx_x();
        let bd = arch::block_dim_x();
        let n = p.n_per_block;
        let smem = arch::dynamic_shared_mem() as *mut u32;
        let mut acc = 0u32;
        let mut i = t;
        while i < n {
            // SAFETY: the launcher passes `grid_dim * n_per_block` inputs.
            acc = acc.wrapping_add(unsafe { p.input.as_ptr().add((b * n + i) as usize).read() });
            i += bd;
        }
        // SAFETY: the launcher gives `block_dim * 4` bytes of shared memory; each thread writes
        // its own slot, and barriers separate the writes from the reads below.
        unsafe { smem.add(t as usize).write_volatile(acc) };
        arch::sync_threads();
        let mut stride = bd.next_power_of_two() / 2;
        while stride > 0 {
            if t < stride && t + stride < bd {
                // SAFETY: both indices are `< block_dim`; see above.
                unsafe {
                    let other = smem.add((t + stride) as usize).read_volatile();
                    let mine = smem.add(t as usize).read_volatile();
                    smem.add(t as usize).write_volatile(mine.wrapping_add(other));
                }
            }
            arch::sync_threads();
            stride /= 2;
        }
        if t == 0 {
            // SAFETY: `output` holds `grid_dim` elements; slot 0 is final after the last barrier.
            unsafe { p.output.as_ptr().add(b as usize).write(smem.read_volatile()) };
        }
    }
}

crate::kernel! {
    /// Every thread votes `input[g] != 0` (`g` its global index) with the three block-wide
    /// votes and writes what each returned, and the block's dynamic shared-memory size, to
    /// `output[4g..4g + 4]` (see `BlockVoteParams`).
    fn block_vote_kernel(p: BlockVoteParams) {
        let g = arch::global_thread_idx() as usize;
        // SAFETY: the launcher passes `grid_dim * block_dim` inputs and four times as many
        // outputs; each thread reads and writes only its own.
        unsafe {
            let pred = p.input.as_ptr().add(g).read() != 0;
            let any = arch::sync_threads_or(pred);
            let all = arch::sync_threads_and(pred);
            let count = arch::sync_threads_count(pred);
            let out = p.output.as_ptr().add(4 * g);
            out.write(any as u32);
            out.add(1).write(all as u32);
            out.add(2).write(count);
            out.add(3).write(arch::dynamic_shared_mem_size());
        }
    }
}

crate::kernel! {
    /// Every thread pushes `p.per_thread` DATA triggers: `size` = global thread index,
    /// `src_offset` = the trigger's index. Stops at the first failed push (abort or timeout).
    fn fifo_push_kernel(p: FifoPushParams) {
        let tid = arch::global_thread_idx() as u64;
        for i in 0..p.per_thread as u64 {
            let trigger = ProxyTrigger::pack_unchecked(TriggerFields {
                size: tid,
                src_offset: i,
                dst_offset: 0,
                src_memory_id: 0,
                dst_memory_id: 0,
                kind: TriggerType::DATA,
                semaphore_id: 0,
            });
            if p.fifo.push(trigger).is_err() {
                return;
            }
        }
    }
}

/// One direction of a MemoryChannel ping-pong round: all threads put, one signals.
#[inline(always)]
fn memory_send(p: &PingPongParams) {
    let t = arch::thread_idx_x();
    // SAFETY: the host built the channel over buffers of at least `bytes` bytes.
    unsafe { p.channel.put(0, 0, p.bytes, t, arch::block_dim_x()) };
    arch::sync_threads();
    if t == 0 {
        p.channel.signal();
    }
}

/// Thread 0 waits for the peer; the block follows (the vote orders the wait before every
/// thread's later accesses). Returns false if the wait gave up.
#[inline(always)]
fn memory_recv(p: &PingPongParams) -> bool {
    let ok = arch::thread_idx_x() != 0 || p.channel.wait().is_ok();
    arch::sync_threads_and(ok)
}

crate::kernel! {
    /// MemoryChannel ping-pong (one block, no shared memory): role 0 puts and signals, role 1
    /// waits and answers, `iterations` times. Stops early if a wait gives up.
    fn memory_ping_pong_kernel(p: PingPongParams) {
        for _ in 0..p.iterations {
            if p.role == 0 {
                memory_send(&p);
                if !memory_recv(&p) {
                    return;
                }
            } else {
                if !memory_recv(&p) {
                    return;
                }
                memory_send(&p);
            }
        }
    }
}

crate::kernel! {
    /// LL16-packet ping-pong (one block): role 0 writes `bytes` of its buffer as packets into
    /// the peer's packet buffer; the peer unpacks them into its buffer and answers the same way.
    fn packet_ping_pong_kernel(p: PingPongParams) {
        let t = arch::thread_idx_x();
        let n = arch::block_dim_x();
        for i in 0..p.iterations {
            let flag = p.flag_base + i + 1;
            if p.role == 0 {
                // SAFETY: the host built the channel over buffers of at least `bytes` bytes
                // and packet buffers of at least `packets_for(bytes)` LL16 packets.
                unsafe { p.channel.put_packets::<LL16Packet>(0, 0, p.bytes, t, n, flag) };
                // SAFETY: as above.
                if unsafe { p.channel.unpack_packets::<LL16Packet>(0, 0, p.bytes, t, n, flag) }
                    .is_err()
                {
                    return;
                }
            } else {
                // SAFETY: as above.
                if unsafe { p.channel.unpack_packets::<LL16Packet>(0, 0, p.bytes, t, n, flag) }
                    .is_err()
                {
                    return;
                }
                arch::sync_threads();
                // SAFETY: as above.
                unsafe { p.channel.put_packets::<LL16Packet>(0, 0, p.bytes, t, n, flag) };
            }
            arch::sync_threads();
        }
    }
}

crate::kernel! {
    /// PortChannel ping-pong (one thread): each side `put_with_signal`s `bytes` through its
    /// proxy (optionally flushing) and waits for the peer's signal. Traced (`p.trace`): `Send`
    /// before the first round, `Recv` after the last one.
    fn port_ping_pong_kernel(p: PortPingPongParams) {
        if arch::global_thread_idx() != 0 {
            return;
        }
        trace::event(&p.trace, TraceEventKind::Start);
        port_ping_pong(&p);
    }
}

/// The body of `port_ping_pong_kernel`.
#[inline(always)]
fn port_ping_pong(p: &PortPingPongParams) {
    let ch = &p.channel;
    let send = || -> Result<(), mscclpp_shared::DeviceErrorCode> {
        if p.flush != 0 {
            ch.put_with_signal_and_flush(0, 0, p.bytes)
        } else {
            ch.put_with_signal(0, 0, p.bytes).map(|_| ())
        }
    };
    trace::event(&p.trace, TraceEventKind::Send);
    for _ in 0..p.iterations {
        let ok = if p.role == 0 {
            send().and_then(|_| ch.wait())
        } else {
            ch.wait().and_then(|_| send())
        };
        if ok.is_err() {
            return;
        }
    }
    trace::event(&p.trace, TraceEventKind::Recv);
    let _ = ch.flush();
    trace::event(&p.trace, TraceEventKind::End);
}
