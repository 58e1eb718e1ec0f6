//! Device side of a MemoryChannel: GPU threads move data by loading and storing the peer's
//! memory directly (NVLink / PCIe P2P; on the CPU backend, a shared mapping), and synchronise
//! through a GPU↔GPU semaphore or LL packets. The handle and its words are described in
//! `mscclpp_shared::memory_channel`.
//!
//! Collective operations (`put`, `get`, `put_packets`, `unpack_packets`) are called by every
//! thread of a group with its `tid` and the group's `nthreads`; `signal`/`wait` by one thread.
//!
//! # Signalling a block's writes
//!
//! `signal` is one thread's release: `red.release.sys.global.add.u64` on the peer's `inbound`.
//! It publishes that thread's earlier writes, and the writes of the whole block when the block
//! follows this contract:
//!
//! 1. every thread writes (`put`, `write`, plain stores to `dst`);
//! 2. the block meets at [`arch::sync_threads`](crate::arch::sync_threads) (`bar.sync`; a
//!    vote, `bar.red`, serves as well);
//! 3. one thread calls `signal`.
//!
//! On the peer, one thread `wait`s, then its block meets at `sync_threads` (or a vote) before
//! any thread reads what was written. Why the other threads' writes are covered, in the terms
//! of the PTX memory consistency model (PTX ISA, "Memory Consistency Model"):
//!
//! - A write `W` of thread `t` precedes `t`'s `bar.sync` in program order, and a `bar.sync` /
//!   `bar.red` *synchronizes with* the other threads' `bar.sync` / `bar.red` on the same
//!   barrier; so `W` precedes the signalling thread's barrier in *base causality order*, and so
//!   everything after it in that thread's program order, the release `R` included.
//! - The peer's `wait` polls `inbound` with `ld.acquire.sys`: an acquire pattern that reads
//!   the value `R` wrote, or a later one (a later `red` on `inbound` leaves `R` before the read
//!   in *observation order*, which runs through atomic read-modify-writes). `R` and the
//!   acquire are morally strong: both strong, both at system scope, which holds both threads,
//!   on the same location. So `R` synchronizes with the acquire.
//! - Base causality order is transitive (the model's "cumulativity"): `W` precedes the acquire,
//!   and through the peer's `bar.sync` every read its threads make after it. The causality
//!   axiom then forbids such a read to return a value older than `W`.
//!
//! Without step 2 nothing orders thread `t`'s `W` before `R`: the release covers only the
//! signalling thread's own program order (and what that thread has *observed*), so the peer
//! may see the token before `W`. `relaxed_signal` (`red.relaxed.sys`) publishes nothing by
//! itself; preceded by [`arch::fence_acq_rel_sys`](crate::arch::fence_acq_rel_sys) after the
//! barrier, the pair is a release pattern and the contract holds for it too. LL packets need
//! none of this: every 8-byte half carries its flag and is read as one access.
//!
//! One caveat the model leaves open: it states the chain for accesses to one address, and
//! calls two virtual addresses of one location *aliases* (ordered by an alias proxy fence).
//! Ranks that are threads of one process reach a peer buffer at the owner's own address
//! (unified addressing); ranks in separate processes map it at an address of their own. Like
//! other GPU-to-GPU libraries we issue no alias fence; the GPU test suite (processes included)
//! is what shows the release/acquire pair is enough there.

use crate::packet::{self, Packet};
use crate::semaphore::MemoryDevice2DeviceSemaphore;
use mscclpp_shared::{DeviceErrorCode, MemoryChannelDeviceHandle};

/// Device operations of a MemoryChannel (`use mscclpp_device::prelude::*`).
pub trait MemoryChannel {
    /// Collective copy of `bytes` from local `src + src_off` to the peer's `dst + dst_off`
    /// (16-byte vectors when both ends are 16-byte aligned).
    ///
    /// # Safety
    /// Both ranges lie inside the channel's buffers.
    unsafe fn put(&self, dst_off: u64, src_off: u64, bytes: u64, tid: u32, nthreads: u32);
    /// Collective copy of `bytes` from the peer's `dst + dst_off` to local `src + src_off`.
    ///
    /// # Safety
    /// Both ranges lie inside the channel's buffers.
    unsafe fn get(&self, dst_off: u64, src_off: u64, bytes: u64, tid: u32, nthreads: u32);
    /// Reads element `index` of type `T` of the peer's buffer.
    ///
    /// # Safety
    /// The element lies inside the peer's buffer and is aligned.
    unsafe fn read<T: Copy>(&self, index: u64) -> T;
    /// Writes element `index` of type `T` of the peer's buffer.
    ///
    /// # Safety
    /// The element lies inside the peer's buffer and is aligned.
    unsafe fn write<T: Copy>(&self, index: u64, value: T);
    /// Collective: `bytes` of local `src + src_off` become packets of type `P` with `flag` at
    /// the peer's `dst + dst_off` (the peer's packet buffer).
    ///
    /// # Safety
    /// The source range and `packets_for::<P>(bytes)` packets at the destination are in range.
    unsafe fn put_packets<P: Packet>(
        &self,
        dst_off: u64,
        src_off: u64,
        bytes: u64,
        tid: u32,
        nthreads: u32,
        flag: u32,
    );
    /// Collective: waits for packets of type `P` with `flag` at local `packet_buffer + pkt_off`
    /// and writes their `bytes` of payload to local `src + local_off`.
    ///
    /// # Safety
    /// Both ranges are in range.
    unsafe fn unpack_packets<P: Packet>(
        &self,
        local_off: u64,
        pkt_off: u64,
        bytes: u64,
        tid: u32,
        nthreads: u32,
        flag: u32,
    ) -> Result<(), DeviceErrorCode>;
    /// See [`MemoryDevice2DeviceSemaphore::signal`]. To publish the writes of every thread of
    /// the block, call it from one thread after a `sync_threads` (module docs, "Signalling a
    /// block's writes").
    fn signal(&self);
    /// See [`MemoryDevice2DeviceSemaphore::relaxed_signal`].
    fn relaxed_signal(&self);
    /// See [`MemoryDevice2DeviceSemaphore::wait`]. Other threads of the block read the
    /// peer's data only after a `sync_threads` (or a vote) that follows this call.
    fn wait(&self) -> Result<(), DeviceErrorCode>;
    /// See [`MemoryDevice2DeviceSemaphore::relaxed_wait`].
    fn relaxed_wait(&self) -> Result<(), DeviceErrorCode>;
    /// See [`MemoryDevice2DeviceSemaphore::poll`].
    fn poll(&self) -> bool;
}

impl MemoryChannel for MemoryChannelDeviceHandle {
    #[inline(always)]
    unsafe fn put(&self, dst_off: u64, src_off: u64, bytes: u64, tid: u32, nthreads: u32) {
        // SAFETY: the caller's contract.
        unsafe {
            crate::copy::copy(
                self.dst.as_ptr().add(dst_off as usize),
                self.src.as_ptr().add(src_off as usize),
                bytes,
                tid as u64,
                nthreads as u64,
            )
        }
    }
    #[inline(always)]
    unsafe fn get(&self, dst_off: u64, src_off: u64, bytes: u64, tid: u32, nthreads: u32) {
        // SAFETY: the caller's contract.
        unsafe {
            crate::copy::copy(
                self.src.as_ptr().add(src_off as usize),
                self.dst.as_ptr().add(dst_off as usize),
                bytes,
                tid as u64,
                nthreads as u64,
            )
        }
    }
    #[inline(always)]
    unsafe fn read<T: Copy>(&self, index: u64) -> T {
        // SAFETY: the caller's contract.
        unsafe {
            (self.dst.as_ptr() as *const T)
                .add(index as usize)
                .read_volatile()
        }
    }
    #[inline(always)]
    unsafe fn write<T: Copy>(&self, index: u64, value: T) {
        // SAFETY: the caller's contract.
        unsafe {
            (self.dst.as_ptr() as *mut T)
                .add(index as usize)
                .write_volatile(value)
        }
    }
    #[inline(always)]
    unsafe fn put_packets<P: Packet>(
        &self,
        dst_off: u64,
        src_off: u64,
        bytes: u64,
        tid: u32,
        nthreads: u32,
        flag: u32,
    ) {
        // SAFETY: the caller's contract.
        unsafe {
            packet::put_packets::<P>(
                self.dst.as_ptr().add(dst_off as usize) as *mut P,
                self.src.as_ptr().add(src_off as usize),
                bytes as usize,
                tid as usize,
                nthreads as usize,
                flag,
            )
        }
    }
    #[inline(always)]
    unsafe fn unpack_packets<P: Packet>(
        &self,
        local_off: u64,
        pkt_off: u64,
        bytes: u64,
        tid: u32,
        nthreads: u32,
        flag: u32,
    ) -> Result<(), DeviceErrorCode> {
        // SAFETY: the caller's contract.
        unsafe {
            packet::unpack_packets::<P>(
                self.src.as_ptr().add(local_off as usize),
                self.packet_buffer.as_ptr().add(pkt_off as usize) as *const P,
                bytes as usize,
                tid as usize,
                nthreads as usize,
                flag,
                self.semaphore.status,
            )
        }
    }
    #[inline(always)]
    fn signal(&self) {
        self.semaphore.signal()
    }
    #[inline(always)]
    fn relaxed_signal(&self) {
        self.semaphore.relaxed_signal()
    }
    #[inline(always)]
    fn wait(&self) -> Result<(), DeviceErrorCode> {
        self.semaphore.wait()
    }
    #[inline(always)]
    fn relaxed_wait(&self) -> Result<(), DeviceErrorCode> {
        self.semaphore.relaxed_wait()
    }
    #[inline(always)]
    fn poll(&self) -> bool {
        self.semaphore.poll()
    }
}
