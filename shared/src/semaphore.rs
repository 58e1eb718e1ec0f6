//! Semaphore device handles: monotonic `u64` tokens, never reset.
//!
//! A signal adds 1 to the receiver's `inbound`; a wait increments the waiter's own `expected`
//! and spins until `inbound >= expected`. Tokens only grow, so no reset race exists.
//!
//! | word              | lives in | written by | read by | ordering |
//! |-------------------|----------|------------|---------|----------|
//! | `inbound`         | D2D: receiver's device memory; H2D: device memory; H2H: host memory | the peer (D2D: `red.add.release.sys` through the peer mapping; H2D/H2H: the sender's connection `update_and_sync`) | the owner's `wait`/`poll` | `ld.acquire.sys` |
//! | `remote_inbound`  | peer's device memory, mapped here (D2D only) | this side's `signal` | the peer | `red.release.sys` (`signal`) or `red.relaxed.sys` (`relaxed_signal`) |
//! | `expected`        | owner's device (or host) memory | the owner only | the owner only | plain |

use crate::{DevicePtr, DeviceStatus};

/// Semaphore between two GPUs that map each other's memory (MemoryChannel).
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MemoryDevice2DeviceSemaphoreDeviceHandle {
    /// Local token counter the peer adds to.
    pub inbound: DevicePtr<u64>,
    /// The peer's `inbound`, mapped into this GPU's address space.
    pub remote_inbound: DevicePtr<u64>,
    /// Tokens this side has consumed (local device memory).
    pub expected: DevicePtr<u64>,
    /// Abort flag and error record for this side's waits.
    pub status: DevicePtr<DeviceStatus>,
}

/// Semaphore signalled by a host proxy (through a connection) and waited on by a GPU (PortChannel).
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Host2DeviceSemaphoreDeviceHandle {
    /// Local token counter the peer's proxy writes.
    pub inbound: DevicePtr<u64>,
    /// Tokens this GPU has consumed (device memory).
    pub expected: DevicePtr<u64>,
    /// Abort flag and error record for this side's waits.
    pub status: DevicePtr<DeviceStatus>,
}

/// Semaphore between two host threads/processes; every word is host memory.
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Host2HostSemaphoreHandle {
    /// Local token counter the peer writes.
    pub inbound: DevicePtr<u64>,
    /// Tokens this side has consumed.
    pub expected: DevicePtr<u64>,
}

static_assertions::assert_eq_size!(MemoryDevice2DeviceSemaphoreDeviceHandle, [u64; 4]);
static_assertions::assert_eq_size!(Host2DeviceSemaphoreDeviceHandle, [u64; 3]);
static_assertions::assert_eq_size!(Host2HostSemaphoreHandle, [u64; 2]);
static_assertions::const_assert_eq!(
    core::mem::align_of::<MemoryDevice2DeviceSemaphoreDeviceHandle>(),
    8
);
static_assertions::const_assert_eq!(core::mem::align_of::<Host2DeviceSemaphoreDeviceHandle>(), 8);
static_assertions::const_assert_eq!(core::mem::align_of::<Host2HostSemaphoreHandle>(), 8);
