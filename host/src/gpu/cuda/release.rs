//! Releases that wait for the whole context, held back while several ranks of this process
//! share a device.
//!
//! `cuMemFree`, `cuMemFreeHost`, `cuModuleUnload` and `cuIpcCloseMemHandle` return only once
//! every kernel running in the context has ended (measured on an H200, driver 580: a free made
//! while another stream's kernel spins returns when that kernel does; `scripts/gpu-probe/`).
//! Ranks as threads on one GPU share its primary context, and a rank's kernel commonly spins
//! until a peer's next kernel runs: a peer whose thread frees a buffer first would wait for that
//! kernel, which waits for it. So while two or more ranks of this process are live on a device
//! ([`RankOnDevice`], held by every communicator), such releases are held in a list
//! ([`Sharing::release`]) instead, and carried out when at most one rank is left; a device
//! allocation of the same size is handed out again meanwhile ([`Sharing::reuse`]), so a
//! program that frees and allocates in a loop does not grow. Allocation, streams, events,
//! copies and memsets on non-blocking streams do not wait for other kernels and are made at
//! once.
//!
//! Shared state: one [`Sharing`] per device of this process (`SHARING`, written when a device
//! is first opened): `ranks` (atomic, written by [`RankOnDevice`] on creation and drop, read
//! by every release), `held` (mutex; pushed by releases, drained by the last rank's drop or
//! taken from by allocations).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys;

use super::{Context, result};
use crate::error::DriverError;

/// A release that waits for the whole context.
#[derive(Debug)]
pub(crate) enum Held {
    /// A `cuMemAlloc_v2` allocation of `size` bytes.
    Device {
        /// Its first byte.
        ptr: sys::CUdeviceptr,
        /// Bytes allocated.
        size: usize,
    },
    /// A `cuMemHostAlloc` allocation.
    Host(usize),
    /// A loaded module.
    Module(usize),
    /// A mapping of another process's allocation.
    Peer(sys::CUdeviceptr),
}

impl Held {
    /// Carries the release out, in the current context.
    fn run(self) -> std::result::Result<(), DriverError> {
        // SAFETY (every arm): the value was owned by the owner that handed it here, which
        // released nothing itself; it is released once, here.
        match self {
            Held::Device { ptr, .. } => unsafe { result::cu_mem_free(ptr) },
            Held::Host(p) => unsafe { result::cu_mem_free_host(p as *mut std::ffi::c_void) },
            Held::Module(m) => unsafe { result::cu_module_unload(m as sys::CUmodule) },
            Held::Peer(base) => unsafe { result::cu_ipc_close_mem_handle(base) },
        }
    }
}

/// Ranks of this process on one device, and the releases held back for them (module docs).
#[derive(Debug, Default)]
pub(crate) struct Sharing {
    ranks: AtomicUsize,
    held: Mutex<Vec<Held>>,
}

/// Every device's [`Sharing`] in this process, by `CUdevice`.
static SHARING: Mutex<Vec<(sys::CUdevice, Arc<Sharing>)>> = Mutex::new(Vec::new());

/// The [`Sharing`] of device `dev`.
pub(crate) fn of(dev: sys::CUdevice) -> Arc<Sharing> {
    let mut all = SHARING.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, s)) = all.iter().find(|(d, _)| *d == dev) {
        return s.clone();
    }
    let s = Arc::new(Sharing::default());
    all.push((dev, s.clone()));
    s
}

impl Sharing {
    /// Releases `h` in `ctx` now, or holds it while two or more ranks share the device.
    pub(crate) fn release(&self, ctx: &Context, h: Held) {
        {
            // Checked under the lock the last rank's drop drains under: a release seen as
            // held is always drained.
            let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            if self.ranks.load(Ordering::Acquire) >= 2 {
                held.push(h);
                return;
            }
        }
        carry_out(ctx, h);
    }

    /// A held device allocation of exactly `size` bytes, taken back for a new owner.
    pub(crate) fn reuse(&self, size: usize) -> Option<sys::CUdeviceptr> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let at = held
            .iter()
            .position(|h| matches!(h, Held::Device { size: s, .. } if *s == size))?;
        match held.swap_remove(at) {
            Held::Device { ptr, .. } => Some(ptr),
            other => {
                // Unreachable (the position matched a device allocation): keep it held.
                held.push(other);
                None
            }
        }
    }

    /// Releases held back now (for the tests).
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

fn carry_out(ctx: &Context, h: Held) {
    let what = format!("{h:?}");
    if let Err(e) = ctx.bind().and_then(|()| h.run()) {
        tracing::warn!(ordinal = ctx.ordinal(), release = %what, error = %e, "a CUDA release failed");
    }
}

/// One rank of this process on a device (every `Communicator` holds one): while two or more
/// live, releases that wait for the whole context are held back (module docs); when the
/// second-last goes, they are carried out.
#[derive(Debug)]
pub struct RankOnDevice {
    sharing: Arc<Sharing>,
    ctx: Arc<Context>,
}

impl RankOnDevice {
    pub(crate) fn enter(sharing: Arc<Sharing>, ctx: Arc<Context>) -> Self {
        sharing.ranks.fetch_add(1, Ordering::AcqRel);
        Self { sharing, ctx }
    }

    /// Ranks of this process on the device now.
    pub fn ranks(&self) -> usize {
        self.sharing.ranks.load(Ordering::Acquire)
    }
}

impl Drop for RankOnDevice {
    fn drop(&mut self) {
        let left = self.sharing.ranks.fetch_sub(1, Ordering::AcqRel) - 1;
        if left >= 2 {
            return;
        }
        let held =
            std::mem::take(&mut *self.sharing.held.lock().unwrap_or_else(|e| e.into_inner()));
        for h in held {
            carry_out(&self.ctx, h);
        }
    }
}
