//! Host side of a MemoryChannel: pairs a GPU↔GPU semaphore with the peer's mapped buffer, a
//! local buffer and (optionally) a local packet buffer, and builds the device handle
//! (`mscclpp_shared::MemoryChannelDeviceHandle`; device operations in
//! `mscclpp_device::memory_channel`).

use mscclpp_shared::{DevicePtr, MemoryChannelDeviceHandle};

use crate::error::Result;
use crate::registered_memory::RegisteredMemory;
use crate::semaphore::MemoryDevice2DeviceSemaphore;

/// One end of a MemoryChannel.
pub struct MemoryChannel {
    semaphore: MemoryDevice2DeviceSemaphore,
    dst: RegisteredMemory,
    src: DevicePtr<u8>,
    packet_buffer: DevicePtr<u8>,
}

impl MemoryChannel {
    /// A channel that writes into `dst` (the peer's memory, which must be mapped here: same
    /// node), reads from local `src`, and receives packets in local `packet_buffer` (null if
    /// packets are not used).
    pub fn new(
        semaphore: MemoryDevice2DeviceSemaphore,
        dst: RegisteredMemory,
        src: DevicePtr<u8>,
        packet_buffer: DevicePtr<u8>,
    ) -> Result<Self> {
        dst.range(0, dst.size() as u64)?;
        Ok(Self {
            semaphore,
            dst,
            src,
            packet_buffer,
        })
    }

    /// The peer's memory this channel writes.
    pub fn dst(&self) -> &RegisteredMemory {
        &self.dst
    }

    /// The device handle.
    pub fn device_handle(&self) -> Result<MemoryChannelDeviceHandle> {
        Ok(MemoryChannelDeviceHandle {
            semaphore: self.semaphore.device_handle()?,
            dst: self.dst.range(0, self.dst.size() as u64)?,
            src: self.src,
            packet_buffer: self.packet_buffer,
        })
    }
}
