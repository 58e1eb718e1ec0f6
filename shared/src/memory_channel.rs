//! `MemoryChannelDeviceHandle`: GPU threads load/store the peer's memory directly (NVLink/P2P;
//! on the CPU backend, a shared mapping).
//!
//! | pointer          | lives in | written by | read by |
//! |------------------|----------|------------|---------|
//! | `dst`            | peer's registered memory, mapped here | this GPU's `put`/`write`/`put_packets` | the peer after a signal (or packet flags) |
//! | `src`            | local registered memory | local kernels | this GPU's `put`/`get` |
//! | `packet_buffer`  | local scratch, the target of the peer's `put_packets` | the peer | this GPU's `unpack_packets`/`read_packets` (flag-validated, volatile) |
//!
//! Data written through `dst` by many threads of a block is published by one signal after a
//! block barrier: all threads write, `sync_threads`, one thread signals; the peer waits with
//! one thread, `sync_threads`, then reads (the device crate's `memory_channel` module gives the
//! PTX memory-model reasoning).

use crate::{DevicePtr, MemoryDevice2DeviceSemaphoreDeviceHandle};

/// Device handle of a MemoryChannel.
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MemoryChannelDeviceHandle {
    /// Signal/wait with the peer.
    pub semaphore: MemoryDevice2DeviceSemaphoreDeviceHandle,
    /// The peer's memory, mapped here.
    pub dst: DevicePtr<u8>,
    /// Local memory.
    pub src: DevicePtr<u8>,
    /// Local packet buffer the peer writes LL packets into (may be null).
    pub packet_buffer: DevicePtr<u8>,
}

static_assertions::assert_eq_size!(MemoryChannelDeviceHandle, [u64; 7]);
static_assertions::const_assert_eq!(core::mem::align_of::<MemoryChannelDeviceHandle>(), 8);
