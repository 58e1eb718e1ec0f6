//! Device side of the proxy FIFO: [`FifoDevice::push`] and friends on a `FifoDeviceHandle`.
//!
//! The protocol, and who reads and writes each word with which ordering, is written down once in
//! `mscclpp_shared::fifo`; this file implements the producer half of it.

use crate::arch;
use crate::wait::spin_until;
use mscclpp_shared::trigger::commit_parity;
use mscclpp_shared::{DeviceErrorCode, FifoDeviceHandle, ProxyTrigger, WaitSite};

/// Producer operations on a FIFO handle (`use mscclpp_device::prelude::*`).
pub trait FifoDevice {
    /// Pushes `trigger` (its commit bit is overwritten) and returns its position. Waits,
    /// bounded and abortable, while the FIFO is full.
    fn push(&self, trigger: ProxyTrigger) -> Result<u64, DeviceErrorCode>;
    /// Whether the proxy has popped the trigger at `pos`.
    fn poll(&self, pos: u64) -> bool;
    /// Waits until the proxy has popped the trigger at `pos`.
    fn sync(&self, pos: u64) -> Result<(), DeviceErrorCode>;
    /// Waits until the proxy has completed the SYNC trigger pushed at `pos` (and so all work of
    /// that trigger's connection pushed before it).
    fn wait_flushed(&self, pos: u64) -> Result<(), DeviceErrorCode>;
}

impl FifoDevice for FifoDeviceHandle {
    #[inline(always)]
    fn push(&self, trigger: ProxyTrigger) -> Result<u64, DeviceErrorCode> {
        let n = self.size as u64;
        // SAFETY: a FIFO handle built by the host points at live `head`, `tail_cache` (device)
        // and `tail`, `triggers[size]` (host-mapped) for as long as its proxy runs.
        unsafe {
            let pos = arch::atom_add_relaxed_gpu_u64(self.head.as_ptr(), 1);
            if pos >= n + arch::ld_relaxed_sys_u64(self.tail_cache.as_ptr()) {
                let tail = self.tail.as_ptr();
                spin_until(self.status, WaitSite::FifoPush, self.tail.addr(), || {
                    let t = arch::ld_acquire_sys_u64(tail);
                    if pos < n + t {
                        arch::st_relaxed_sys_u64(self.tail_cache.as_ptr(), t);
                        true
                    } else {
                        false
                    }
                })?;
            }
            let t = trigger.with_commit_bit(commit_parity(pos, self.log2_size));
            let slot = self.triggers.as_ptr().add((pos & (n - 1)) as usize) as *mut u64;
            arch::st_release_sys_v2_u64(slot, t.fst, t.snd);
            Ok(pos)
        }
    }

    #[inline(always)]
    fn poll(&self, pos: u64) -> bool {
        // SAFETY: as in `push`.
        unsafe { arch::ld_acquire_sys_u64(self.tail.as_ptr()) > pos }
    }

    #[inline(always)]
    fn sync(&self, pos: u64) -> Result<(), DeviceErrorCode> {
        spin_until(self.status, WaitSite::FifoSync, self.tail.addr(), || {
            self.poll(pos)
        })
    }

    #[inline(always)]
    fn wait_flushed(&self, pos: u64) -> Result<(), DeviceErrorCode> {
        let done = self.flush_done_pos.as_ptr();
        spin_until(
            self.status,
            WaitSite::FifoSync,
            self.flush_done_pos.addr(),
            || {
                // SAFETY: as in `push`.
                unsafe { arch::ld_acquire_sys_u64(done) > pos }
            },
        )
    }
}
