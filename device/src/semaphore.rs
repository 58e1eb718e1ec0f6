//! Device side of the semaphores: `signal` adds to the peer's `inbound`; `wait` bumps the local
//! `expected` and spins (bounded, abortable) until `inbound` reaches it. Who writes and reads
//! each word with which ordering is written down in `mscclpp_shared::semaphore`.
//!
//! One GPU thread uses a given semaphore handle at a time (`expected` is a plain counter owned
//! by that thread); other threads order themselves around it with `sync_threads`: the block's
//! writes, then `sync_threads`, then one `signal`; one `wait`, then `sync_threads`, then the
//! block's reads (the reasoning is in `crate::memory_channel`, "Signalling a block's writes").

use crate::arch;
use crate::wait::spin_until;
use mscclpp_shared::{
    DeviceErrorCode, DevicePtr, DeviceStatus, Host2DeviceSemaphoreDeviceHandle,
    MemoryDevice2DeviceSemaphoreDeviceHandle, WaitSite,
};

/// Waits until `inbound >= ++expected` (acquire loads unless `relaxed`).
#[inline(always)]
fn wait_inbound(
    inbound: DevicePtr<u64>,
    expected: DevicePtr<u64>,
    status: DevicePtr<DeviceStatus>,
    relaxed: bool,
) -> Result<(), DeviceErrorCode> {
    // SAFETY: a semaphore handle built by the host points at live `inbound` and `expected`
    // words for the lifetime of its semaphore; `expected` is owned by the calling thread.
    unsafe {
        let e = expected.as_ptr().read_volatile() + 1;
        expected.as_ptr().write_volatile(e);
        let p = inbound.as_ptr();
        spin_until(status, WaitSite::Semaphore, inbound.addr(), || {
            let v = if relaxed {
                arch::ld_relaxed_sys_u64(p)
            } else {
                arch::ld_acquire_sys_u64(p)
            };
            v >= e
        })
    }
}

/// Consumes one token if one has arrived.
#[inline(always)]
fn poll_inbound(inbound: DevicePtr<u64>, expected: DevicePtr<u64>) -> bool {
    // SAFETY: as in `wait_inbound`.
    unsafe {
        let e = expected.as_ptr().read_volatile() + 1;
        if arch::ld_acquire_sys_u64(inbound.as_ptr()) >= e {
            expected.as_ptr().write_volatile(e);
            true
        } else {
            false
        }
    }
}

/// Device operations of a GPU↔GPU semaphore (`use mscclpp_device::prelude::*`).
pub trait MemoryDevice2DeviceSemaphore {
    /// Gives the peer one token; all earlier writes of this thread (to any memory, the peer's
    /// included) are visible to the peer before it sees the token (release, system scope). So
    /// are the writes that precede this call through a barrier: the writes of every thread of
    /// the block when a `sync_threads` (or a vote) separates them from this call (see
    /// "Signalling a block's writes" in `crate::memory_channel`).
    fn signal(&self);
    /// Gives the peer one token with no ordering (pair with a fence or use for pure counting).
    fn relaxed_signal(&self);
    /// Takes one token, waiting (bounded, abortable) until it arrives; acquire.
    fn wait(&self) -> Result<(), DeviceErrorCode>;
    /// As `wait`, without acquire ordering.
    fn relaxed_wait(&self) -> Result<(), DeviceErrorCode>;
    /// Takes one token if it has arrived.
    fn poll(&self) -> bool;
}

impl MemoryDevice2DeviceSemaphore for MemoryDevice2DeviceSemaphoreDeviceHandle {
    #[inline(always)]
    fn signal(&self) {
        // SAFETY: `remote_inbound` is the peer's live, mapped `inbound` (handle contract).
        unsafe { arch::red_add_release_sys_u64(self.remote_inbound.as_ptr(), 1) }
    }
    #[inline(always)]
    fn relaxed_signal(&self) {
        // SAFETY: as in `signal`.
        unsafe { arch::red_add_relaxed_sys_u64(self.remote_inbound.as_ptr(), 1) }
    }
    #[inline(always)]
    fn wait(&self) -> Result<(), DeviceErrorCode> {
        wait_inbound(self.inbound, self.expected, self.status, false)
    }
    #[inline(always)]
    fn relaxed_wait(&self) -> Result<(), DeviceErrorCode> {
        wait_inbound(self.inbound, self.expected, self.status, true)
    }
    #[inline(always)]
    fn poll(&self) -> bool {
        poll_inbound(self.inbound, self.expected)
    }
}

/// Device operations of a host→GPU semaphore (signalled by a proxy through a connection).
pub trait Host2DeviceSemaphore {
    /// Takes one token, waiting (bounded, abortable); acquire.
    fn wait(&self) -> Result<(), DeviceErrorCode>;
    /// As `wait`, without acquire ordering.
    fn relaxed_wait(&self) -> Result<(), DeviceErrorCode>;
    /// Takes one token if it has arrived.
    fn poll(&self) -> bool;
}

impl Host2DeviceSemaphore for Host2DeviceSemaphoreDeviceHandle {
    #[inline(always)]
    fn wait(&self) -> Result<(), DeviceErrorCode> {
        wait_inbound(self.inbound, self.expected, self.status, false)
    }
    #[inline(always)]
    fn relaxed_wait(&self) -> Result<(), DeviceErrorCode> {
        wait_inbound(self.inbound, self.expected, self.status, true)
    }
    #[inline(always)]
    fn poll(&self) -> bool {
        poll_inbound(self.inbound, self.expected)
    }
}
