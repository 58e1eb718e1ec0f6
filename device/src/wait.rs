//! Bounded, abortable spinning: the one loop every device wait goes through.
//!
//! A wait polls its condition, with `arch::spin_step` between polls (on the GPU nothing for
//! the first 64 polls, then about 100 ns of `nanosleep`; on the host yields, then sleeps);
//! every [`ABORT_CHECK_INTERVAL`] iterations it reads the
//! `DeviceStatus::abort` word (host-mapped, relaxed system-scope load), and after
//! `DeviceStatus::spin_limit` iterations (0 = no limit) it gives up; on the host build (the CPU
//! backend) it also gives up, as a timeout, once `MSCCLPP_SPIN_TIMEOUT_MS` has passed
//! ([`arch::host::SPIN_TIMEOUT_ENV`]; the GPU has no time bound). Either way it records the
//! first error of the status word (`error_code` by compare-and-swap from 0, then
//! `error_detail`, then a system fence) and returns the code, so kernels can return early and
//! the host can turn the code into a typed error. See `mscclpp_shared::status`.

use crate::arch;
use mscclpp_shared::status::error_detail;
use mscclpp_shared::{DeviceErrorCode, DevicePtr, DeviceStatus, WaitSite};

/// Iterations between two reads of the abort flag (and of the host build's time bound): 1024
/// on the GPU, where the flag is host-mapped memory across PCIe; 64 on the host build (the CPU
/// backend), where the read is a cache hit and every poll past the first 64 sleeps, so that
/// 1024 polls were a second or more on a loaded machine for each wait an abort must end (a
/// pipelined copy-engine all-reduce queues dozens, one after another).
pub const ABORT_CHECK_INTERVAL: u64 = if cfg!(target_arch = "nvptx64") {
    1024
} else {
    64
};
/// Spin limit used when a handle carries no status (a bug in the caller, but never a hang).
pub const FALLBACK_SPIN_LIMIT: u64 = 1 << 32;

/// Records `code` as the first error of `status` (if none was recorded yet).
#[inline(never)]
pub fn record_error(status: DevicePtr<DeviceStatus>, code: DeviceErrorCode, detail: u64) {
    if status.is_null() {
        return;
    }
    let s = status.as_ptr();
    // SAFETY: a non-null status handed to device code points at a live, host-mapped
    // `DeviceStatus` for the whole launch (contract of every handle that carries one).
    unsafe {
        let code_ptr = core::ptr::addr_of_mut!((*s).error_code);
        if arch::atom_cas_relaxed_sys_u32(code_ptr, 0, code as u32) == 0 {
            arch::st_relaxed_sys_u64(core::ptr::addr_of_mut!((*s).error_detail), detail);
            arch::fence_sc_sys();
        }
    }
}

/// Whether the host asked every wait to stop.
#[inline(always)]
pub fn aborted(status: DevicePtr<DeviceStatus>) -> bool {
    if status.is_null() {
        return false;
    }
    // SAFETY: as in `record_error`.
    unsafe { arch::ld_relaxed_sys_u32(core::ptr::addr_of!((*status.as_ptr()).abort)) != 0 }
}

/// Spins until `ready()` returns true. On abort or spin-limit expiry records the error in
/// `status` (naming `site` and the watched address `addr`) and returns it.
#[inline(always)]
pub fn spin_until(
    status: DevicePtr<DeviceStatus>,
    site: WaitSite,
    addr: u64,
    ready: impl FnMut() -> bool,
) -> Result<(), DeviceErrorCode> {
    spin(status, site, addr, ready, |aborted| aborted)
}

/// [`spin_until`] for a whole warp: `ready()` must return the same value on every lane (a
/// warp vote), and the lanes also agree on when to give up (a vote on the abort flag), so they
/// leave together. Every lane of the warp must call it.
#[inline(always)]
pub fn spin_until_warp(
    status: DevicePtr<DeviceStatus>,
    site: WaitSite,
    addr: u64,
    ready: impl FnMut() -> bool,
) -> Result<(), DeviceErrorCode> {
    spin(status, site, addr, ready, arch::vote_any_sync)
}

/// The loop of [`spin_until`] and [`spin_until_warp`]; `agree` turns this thread's view of the
/// abort flag into the decision its group takes (the spin limit is the same on every thread).
#[inline(always)]
fn spin(
    status: DevicePtr<DeviceStatus>,
    site: WaitSite,
    addr: u64,
    mut ready: impl FnMut() -> bool,
    agree: impl Fn(bool) -> bool,
) -> Result<(), DeviceErrorCode> {
    if ready() {
        return Ok(());
    }
    // The status lives in host memory: a read of it crosses PCIe. Fast waits (the common case)
    // never touch it; the limit is fetched together with the first abort check.
    let mut limit = u64::MAX;
    let mut iteration: u64 = 0;
    // The host build's time bound (`MSCCLPP_SPIN_TIMEOUT_MS`); on nvptx a unit whose `passed`
    // is constant false, so the GPU's loop is the same as without it.
    let deadline = arch::spin_deadline();
    loop {
        arch::spin_step(iteration);
        if ready() {
            return Ok(());
        }
        iteration += 1;
        if iteration.is_multiple_of(ABORT_CHECK_INTERVAL) {
            let abort = aborted(status);
            let late = deadline.passed();
            // One vote for both reasons, so the lanes of a warp leave together.
            if agree(abort || late) {
                let code = if late && !abort {
                    DeviceErrorCode::Timeout
                } else {
                    DeviceErrorCode::Aborted
                };
                record_error(status, code, error_detail(site, addr));
                return Err(code);
            }
            if iteration == ABORT_CHECK_INTERVAL {
                limit = if status.is_null() {
                    FALLBACK_SPIN_LIMIT
                } else {
                    // SAFETY: as in `record_error`; `spin_limit` is written before launch.
                    let l = unsafe {
                        arch::ld_relaxed_sys_u64(core::ptr::addr_of!((*status.as_ptr()).spin_limit))
                    };
                    if l == 0 { u64::MAX } else { l }
                };
            }
        }
        if iteration >= limit {
            record_error(status, DeviceErrorCode::Timeout, error_detail(site, addr));
            return Err(DeviceErrorCode::Timeout);
        }
    }
}
