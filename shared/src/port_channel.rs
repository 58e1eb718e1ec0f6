//! `PortChannelDeviceHandle`: one GPU thread drives a proxy-backed (copy engine / network) channel.
//!
//! All words it points at are described in `fifo` and `semaphore`. The ids are proxy-local:
//! `semaphore_id` selects the connection and the semaphore the proxy signals for a FLAG trigger;
//! `dst`/`src` select registered memories for DATA triggers.
//!
//! The proxy reads the source memory when it serves a DATA trigger: a block's threads write
//! it, meet at a block barrier, and only then does one thread push the trigger (`put`,
//! `put_with_signal`); on the receiving GPU one thread waits, then the block meets before
//! reading (the device crate's `port_channel` module says why).

use crate::{FifoDeviceHandle, Host2DeviceSemaphoreDeviceHandle};

/// Device handle of a PortChannel.
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct PortChannelDeviceHandle {
    /// Proxy-local semaphore (and connection) id, `< 1024`.
    pub semaphore_id: u32,
    /// Proxy-local id of the destination (remote) memory, `< 512`.
    pub dst: u32,
    /// Proxy-local id of the source (local) memory, `< 512`.
    pub src: u32,
    /// Reserved, zero.
    pub reserved: u32,
    /// The semaphore the peer's proxy signals and this GPU waits on.
    pub semaphore: Host2DeviceSemaphoreDeviceHandle,
    /// The FIFO to the local proxy.
    pub fifo: FifoDeviceHandle,
}

static_assertions::assert_eq_size!(PortChannelDeviceHandle, [u64; 12]);
static_assertions::const_assert_eq!(core::mem::align_of::<PortChannelDeviceHandle>(), 8);
