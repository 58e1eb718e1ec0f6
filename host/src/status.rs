//! Host side of `DeviceStatus`: the abort flag every GPU waiter watches and the first error a
//! device wait recorded. One [`StatusBlock`] per communicator (and per proxy), in host-mapped
//! memory; the protocol is written down in `mscclpp_shared::status`.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use mscclpp_shared::{DeviceErrorCode, DevicePtr, DeviceStatus, WaitSite};

use crate::error::{Error, Result};
use crate::gpu::{Gpu, HostMapped};

/// Default spin limit of device waits: about 2^34 polls, minutes on a GPU; the abort flag is the
/// fast way out, this is the last resort when nobody aborts.
pub const DEFAULT_SPIN_LIMIT: u64 = 1 << 34;

/// A `DeviceStatus` in host-mapped memory.
pub struct StatusBlock {
    mem: HostMapped,
}

impl StatusBlock {
    /// Allocates a zeroed status for `gpu` with the given spin limit (0 = abort only).
    pub fn new(gpu: &Gpu, spin_limit: u64) -> Result<Self> {
        let mem = gpu.alloc_host_mapped(std::mem::size_of::<DeviceStatus>())?;
        let s = Self { mem };
        s.set_spin_limit(spin_limit);
        Ok(s)
    }

    fn status(&self) -> *mut DeviceStatus {
        self.mem.host_ptr().cast()
    }

    fn abort_word(&self) -> &AtomicU32 {
        // SAFETY: `abort` is an aligned u32 inside our live host mapping; all host accesses to
        // it go through atomics.
        unsafe { AtomicU32::from_ptr(std::ptr::addr_of_mut!((*self.status()).abort)) }
    }

    /// The address device code receives.
    pub fn device_ptr(&self) -> DevicePtr<DeviceStatus> {
        self.mem.device_ptr().cast()
    }

    /// Sets how many polls a device wait may spin before recording a timeout.
    pub fn set_spin_limit(&self, limit: u64) {
        // SAFETY: as in `abort_word`; written before kernels that read it are launched.
        unsafe { AtomicU64::from_ptr(std::ptr::addr_of_mut!((*self.status()).spin_limit)) }
            .store(limit, Ordering::Release);
    }

    /// Releases every device wait that watches this status.
    pub fn abort(&self) {
        self.abort_word().store(1, Ordering::Release);
    }

    /// Whether abort was requested.
    pub fn is_aborted(&self) -> bool {
        self.abort_word().load(Ordering::Acquire) != 0
    }

    /// Clears the abort flag and the recorded error (between independent runs).
    pub fn reset(&self) {
        // SAFETY: as in `abort_word`. Only call while no kernel uses this status.
        unsafe {
            AtomicU32::from_ptr(std::ptr::addr_of_mut!((*self.status()).error_code))
                .store(0, Ordering::Relaxed);
            AtomicU64::from_ptr(std::ptr::addr_of_mut!((*self.status()).error_detail))
                .store(0, Ordering::Relaxed);
        }
        self.abort_word().store(0, Ordering::Release);
    }

    /// The first error a device wait recorded, as a typed error.
    pub fn error(&self) -> Option<Error> {
        // SAFETY: as in `abort_word`; the device publishes `error_detail` before a system fence
        // that follows its `error_code` CAS, so a non-zero code read here comes with its detail
        // once the kernel has finished (and at worst with a stale detail while it runs).
        let (code, detail) = unsafe {
            (
                AtomicU32::from_ptr(std::ptr::addr_of_mut!((*self.status()).error_code))
                    .load(Ordering::Acquire),
                AtomicU64::from_ptr(std::ptr::addr_of_mut!((*self.status()).error_detail))
                    .load(Ordering::Acquire),
            )
        };
        if code == 0 {
            return None;
        }
        if code == DeviceErrorCode::CountMismatch as u32 {
            let (peer, sent_bytes) = mscclpp_shared::status::count_mismatch_parts(detail);
            return Some(Error::CountMismatch {
                peer: peer as usize,
                sent_bytes,
            });
        }
        let site = match (detail >> 56) as u8 {
            1 => WaitSite::FifoPush,
            2 => WaitSite::FifoSync,
            3 => WaitSite::Semaphore,
            4 => WaitSite::Packet,
            5 => WaitSite::GridBarrier,
            _ => WaitSite::Unknown,
        };
        Some(Error::Device {
            code: DeviceErrorCode::from_u32(code).unwrap_or(DeviceErrorCode::InvalidArgument),
            site,
            addr: detail & ((1 << 56) - 1),
        })
    }
}
