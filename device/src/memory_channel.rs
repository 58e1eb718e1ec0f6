//! Device side of a MemoryChannel: GPU threads move data by loading and storing the peer's
//! memory directly (NVLink / PCIe P2P; on the CPU backend, a shared mapping), and synchronise
//! through a GPU↔GPU semaphore or LL packets. The handle and its words are described in
//! `mscclpp_shared::memory_channel`.
//!
//! Collective operations (`put`, `get`, `put_packets`, `unpack_packets`) are called by every
//! thread of a group with its `tid` and the group's `nthreads`; `signal`/`wait` by one thread.

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
    /// See [`MemoryDevice2DeviceSemaphore::signal`].
    fn signal(&self);
    /// See [`MemoryDevice2DeviceSemaphore::relaxed_signal`].
    fn relaxed_signal(&self);
    /// See [`MemoryDevice2DeviceSemaphore::wait`].
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
