//! # my-kernels
//!
//! Communication kernels written by a *user* of mscclpp-rs, outside the library: a MemoryChannel
//! ping-pong and a small LL-packet allreduce. The crate compiles twice:
//!
//! - for `nvptx64-nvidia-cuda`, only by `mscclpp_build::PtxBuilder` in the host program's
//!   `build.rs` (which embeds the PTX with `mscclpp::include_ptx!("my_kernels")`);
//! - for the host, as an ordinary dependency of the host program: the CPU backend runs these
//!   very functions on its grid emulator, and the host fills in the parameter structs below.
//!
//! The parameter structs are this crate's own layouts (not `mscclpp-shared`'s): `#[repr(C)]`,
//! `Pod`, defined once here, so the host and the kernel agree on every byte by construction.
//! Each kernel takes exactly one of them by value.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]

use mscclpp_device::arch;
use mscclpp_device::packet::{packets_for, read_packet};
use mscclpp_device::prelude::*;
use mscclpp_device::wait::record_error;
use mscclpp_shared::{
    DeviceErrorCode, DevicePtr, DeviceStatus, LL16Packet, MemoryChannelDeviceHandle,
};

/// Most ranks [`AllreduceArgs`] has channels for.
pub const MAX_RANKS: usize = 8;

/// Parameters of [`ping_pong`]. Launch one block (no shared memory).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct PingPongArgs {
    /// The communicator's abort flag and error record (every wait gives up through it).
    pub status: DevicePtr<DeviceStatus>,
    /// The channel to the other rank: `src` is this rank's buffer, `dst` the peer's.
    pub channel: MemoryChannelDeviceHandle,
    /// Length of each buffer in u32 words.
    pub words: u64,
    /// Round trips.
    pub iterations: u32,
    /// 0 serves, 1 answers.
    pub rank: u32,
}

/// Parameters of [`allreduce_sum_u32`] and [`allreduce_sum_f32`]. Any grid.
///
/// Rank `r`'s packet buffer holds two halves (picked by `flag & 1`, so that a rank one call
/// ahead never overwrites packets a slower peer is still reading) of `nranks` slots of
/// `packets_for::<LL16Packet>(4 * count)` packets; slot `s` receives rank `s`'s data.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct AllreduceArgs {
    /// The communicator's abort flag and error record.
    pub status: DevicePtr<DeviceStatus>,
    /// `channels[p]` reaches rank `p`: `src` is this rank's input, `dst` rank `p`'s packet
    /// buffer, `packet_buffer` this rank's packet buffer. `channels[rank]` is unused.
    pub channels: [MemoryChannelDeviceHandle; MAX_RANKS],
    /// `count` local 4-byte elements.
    pub input: DevicePtr<u32>,
    /// `count` elements of the result (may not alias `input`).
    pub output: DevicePtr<u32>,
    /// Elements.
    pub count: u64,
    /// This rank.
    pub rank: u32,
    /// Ranks, 2 to [`MAX_RANKS`].
    pub nranks: u32,
    /// Packet flag, new for every call on the same buffers (1, 2, 3, …; never 0).
    pub flag: u32,
    /// Zero.
    pub reserved: u32,
}

// The layouts are fixed: the host and the PTX see the same bytes (no padding, `Pod` checks it).
const _: () = assert!(core::mem::size_of::<PingPongArgs>() == 80);
const _: () = assert!(core::mem::size_of::<AllreduceArgs>() == 496);

/// Thread 0 waits for the peer's signal; the block learns whether it came. The vote is a
/// `sync_threads` too, so no thread touches the data before the wait has seen the signal.
/// Returns false when the wait gave up (abort or timeout, recorded in the status).
#[inline(always)]
fn block_wait(ch: &MemoryChannelDeviceHandle) -> bool {
    let ok = arch::thread_idx_x() != 0 || ch.wait().is_ok();
    arch::sync_threads_and(ok)
}

/// Every thread of the block copies its share of the buffer to the peer; then, after a
/// `sync_threads`, thread 0 signals: the barrier puts every thread's writes before the signal,
/// so the peer sees all of them once it sees the signal (the block-wide contract of `signal`).
#[inline(always)]
fn block_send(p: &PingPongArgs) {
    // SAFETY: the host built the channel over two buffers of `words` u32 each.
    unsafe {
        p.channel
            .put(0, 0, p.words * 4, arch::thread_idx_x(), arch::block_dim_x())
    };
    arch::sync_threads();
    if arch::thread_idx_x() == 0 {
        p.channel.signal();
    }
}

/// Adds 1 to every word of the local buffer (the block shares the work).
#[inline(always)]
fn block_add_one(p: &PingPongArgs) {
    let buf = p.channel.src.as_ptr() as *mut u32;
    let mut i = arch::thread_idx_x() as u64;
    while i < p.words {
        // SAFETY: `i < words`, the buffer's length; each word belongs to one thread.
        unsafe {
            let w = buf.add(i as usize);
            w.write(w.read().wrapping_add(1));
        }
        i += arch::block_dim_x() as u64;
    }
    arch::sync_threads();
}

mscclpp_device::kernel! {
    /// Two-rank ping-pong over a MemoryChannel (one block): rank 0 puts its buffer into rank 1's
    /// and signals; rank 1 waits, adds 1 to every word and puts the result back. After `n`
    /// round trips both buffers hold rank 0's initial words plus `n`. Stops early when a wait
    /// gives up.
    fn ping_pong(p: PingPongArgs) {
        for _ in 0..p.iterations {
            if p.rank == 0 {
                block_send(&p);
                if !block_wait(&p.channel) {
                    return;
                }
            } else {
                if !block_wait(&p.channel) {
                    return;
                }
                block_add_one(&p);
                block_send(&p);
            }
        }
    }
}

/// A 4-byte element the allreduce can sum.
pub trait SumElement: Copy {
    /// From the packet's payload word.
    fn from_bits(bits: u32) -> Self;
    /// To a payload word.
    fn to_bits(self) -> u32;
    /// The sum (wrapping for integers).
    fn sum(self, other: Self) -> Self;
}

impl SumElement for u32 {
    #[inline(always)]
    fn from_bits(bits: u32) -> Self {
        bits
    }
    #[inline(always)]
    fn to_bits(self) -> u32 {
        self
    }
    #[inline(always)]
    fn sum(self, other: Self) -> Self {
        self.wrapping_add(other)
    }
}

impl SumElement for f32 {
    #[inline(always)]
    fn from_bits(bits: u32) -> Self {
        f32::from_bits(bits)
    }
    #[inline(always)]
    fn to_bits(self) -> u32 {
        f32::to_bits(self)
    }
    #[inline(always)]
    fn sum(self, other: Self) -> Self {
        self + other
    }
}

/// The allreduce: (1) every thread turns its share of the input into LL16 packets in every
/// peer's packet buffer, slot `rank`; (2) for each packet index it owns, it sums the ranks'
/// values in rank order (its own from `input`, each peer's from the packet that peer wrote,
/// waiting for the flag) and writes `output`. Summing in rank order gives every rank the same
/// bits, floats included. No signal and no barrier: the packet flags are the synchronisation.
#[inline(always)]
fn allreduce_sum<T: SumElement>(p: &AllreduceArgs) {
    let (me, n) = (p.rank as usize, p.nranks as usize);
    if !(2..=MAX_RANKS).contains(&n) || me >= n || p.flag == 0 {
        if arch::global_thread_idx() == 0 {
            record_error(p.status, DeviceErrorCode::InvalidArgument, p.nranks as u64);
        }
        return;
    }
    let (tid, nthreads) = (arch::global_thread_idx(), arch::global_thread_count());
    let bytes = p.count * 4;
    let npkts = packets_for::<LL16Packet>(bytes as usize);
    let slot = (npkts * core::mem::size_of::<LL16Packet>()) as u64;
    let half = (p.flag & 1) as u64 * slot * n as u64;

    for peer in (0..n).filter(|&r| r != me) {
        // SAFETY: the host built channel `peer` over this rank's `count`-element input and
        // `peer`'s packet buffer of two halves of `nranks` slots; slot `me` of half `half`
        // is in range.
        unsafe {
            p.channels[peer].put_packets::<LL16Packet>(
                half + me as u64 * slot,
                0,
                bytes,
                tid,
                nthreads,
                p.flag,
            )
        };
    }

    let input = p.input.as_ptr() as *const u32;
    let output = p.output.as_ptr();
    let mut i = tid as usize;
    while i < npkts {
        let first = 2 * i as u64;
        let both = first + 1 < p.count;
        let mut acc = [T::from_bits(0); 2];
        for r in 0..n {
            let w = if r == me {
                // SAFETY: element `first` (and `first + 1` when `both`) is `< count`.
                unsafe {
                    let a = input.add(first as usize).read();
                    [
                        a,
                        if both {
                            input.add(first as usize + 1).read()
                        } else {
                            0
                        },
                    ]
                }
            } else {
                let ch = &p.channels[r];
                // SAFETY: packet `i` of slot `r` in this half lies in this rank's packet buffer.
                let pkt = unsafe {
                    (ch.packet_buffer
                        .as_ptr()
                        .add((half + r as u64 * slot) as usize)
                        as *const LL16Packet)
                        .add(i)
                };
                // SAFETY: as above; LL16 slots are 16-byte aligned (the buffer is).
                match unsafe { read_packet(pkt, p.flag, p.status) } {
                    Ok(w) => w,
                    Err(_) => return, // recorded in the status; the host reports it
                }
            };
            let (a, b) = (T::from_bits(w[0]), T::from_bits(w[1]));
            acc = if r == 0 {
                [a, b]
            } else {
                [acc[0].sum(a), acc[1].sum(b)]
            };
        }
        // SAFETY: as for the input; `output` holds `count` elements.
        unsafe {
            output.add(first as usize).write(acc[0].to_bits());
            if both {
                output.add(first as usize + 1).write(acc[1].to_bits());
            }
        }
        i += nthreads as usize;
    }
}

mscclpp_device::kernel! {
    /// Sum-allreduce of `count` u32 (wrapping) over LL16 packets; see [`AllreduceArgs`].
    fn allreduce_sum_u32(p: AllreduceArgs) {
        allreduce_sum::<u32>(&p)
    }
}

mscclpp_device::kernel! {
    /// Sum-allreduce of `count` f32 over LL16 packets; see [`AllreduceArgs`].
    fn allreduce_sum_f32(p: AllreduceArgs) {
        allreduce_sum::<f32>(&p)
    }
}
