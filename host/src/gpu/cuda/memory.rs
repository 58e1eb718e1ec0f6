//! Memory owners of the `cuda` backend: device allocations, host-mapped allocations and mappings
//! of other processes' allocations. Made by [`super::Device`]; each keeps the device's primary
//! context alive and makes it current before its driver calls (so any thread may use or drop it).

use std::sync::Arc;

use cudarc::driver::sys;
use mscclpp_shared::IpcMemHandle;
use mscclpp_shared::ipc::IPC_KIND_CUDA;

use super::release::Held;
use super::{Context, result};
use crate::error::{DriverError, Error, Result};

/// Device memory from `cuMemAlloc_v2`, freed (`cuMemFree_v2`) on drop.
#[derive(Debug)]
pub struct DeviceAlloc {
    ctx: Arc<Context>,
    ptr: sys::CUdeviceptr,
    /// Bytes asked for.
    len: usize,
    /// Bytes allocated (`len`, or 1 for an empty request).
    size: usize,
}

impl DeviceAlloc {
    /// Takes ownership of `ptr`, a live `cuMemAlloc_v2` allocation of `size` bytes in `ctx`.
    pub(super) fn new(ctx: Arc<Context>, ptr: sys::CUdeviceptr, len: usize, size: usize) -> Self {
        Self {
            ctx,
            ptr,
            len,
            size,
        }
    }

    /// Device address of the first byte.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes (as asked for).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the allocation was asked for 0 bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Exports the allocation (`cuIpcGetMemHandle`) for another process to map with
    /// [`super::Device::open_ipc`]. `ordinal` is recorded as the owner's device.
    pub fn ipc_handle(&self, ordinal: usize) -> Result<IpcMemHandle> {
        let err = |e: DriverError| Error::IpcExport {
            ordinal,
            bytes: self.len,
            source: e.into(),
        };
        self.ctx.bind().map_err(err)?;
        // SAFETY: `self.ptr` is a live `cuMemAlloc_v2` allocation owned by `self`.
        let cuda = unsafe { result::cu_ipc_get_mem_handle(self.ptr) }.map_err(err)?;
        Ok(IpcMemHandle {
            kind: IPC_KIND_CUDA,
            device: u32::try_from(ordinal).unwrap_or(u32::MAX),
            owner_pid: std::process::id(),
            owner_fd: 0,
            token: 0,
            alloc_size: self.size as u64,
            offset: 0,
            size: self.len as u64,
            cuda,
        })
    }
}

impl Drop for DeviceAlloc {
    /// Frees the allocation, or holds the free back while ranks of this process share the
    /// device (`release.rs`); the owners above keep it alive until the work using it is
    /// synchronised.
    fn drop(&mut self) {
        let held = Held::Device {
            ptr: self.ptr,
            size: self.size,
        };
        self.ctx.sharing.release(&self.ctx, held);
    }
}

/// Pinned host memory mapped into the device's address space (`cuMemHostAlloc` with
/// `DEVICEMAP | PORTABLE`), freed (`cuMemFreeHost`) on drop. The host and the device address
/// name the same bytes.
#[derive(Debug)]
pub struct HostAlloc {
    ctx: Arc<Context>,
    host: *mut u8,
    dev: sys::CUdeviceptr,
    len: usize,
}

// SAFETY: the owner only stores the allocation's addresses and frees it once; reads and writes
// through `host_ptr()` are the caller's (unsafe) business, from whichever thread.
unsafe impl Send for HostAlloc {}
// SAFETY: as above; no method writes through `&self`.
unsafe impl Sync for HostAlloc {}

impl HostAlloc {
    /// Takes ownership of `host`, a live `cuMemHostAlloc` allocation in `ctx`; `dev` is its
    /// device address (0 until known).
    pub(super) fn new(ctx: Arc<Context>, host: *mut u8, dev: sys::CUdeviceptr, len: usize) -> Self {
        Self {
            ctx,
            host,
            dev,
            len,
        }
    }

    pub(super) fn set_device_ptr(&mut self, dev: sys::CUdeviceptr) {
        self.dev = dev;
    }

    /// Host address of the first byte.
    pub fn host_ptr(&self) -> *mut u8 {
        self.host
    }

    /// Device address of the first byte.
    pub fn device_ptr(&self) -> u64 {
        self.dev
    }

    /// Size in bytes (as asked for).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the allocation was asked for 0 bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for HostAlloc {
    /// Frees the allocation, or holds the free back as [`DeviceAlloc`]'s drop does.
    fn drop(&mut self) {
        let held = Held::Host(self.host as usize);
        self.ctx.sharing.release(&self.ctx, held);
    }
}

/// Another process's device allocation mapped into this one (`cuIpcOpenMemHandle_v2`), closed
/// (`cuIpcCloseMemHandle`) on drop.
#[derive(Debug)]
pub struct PeerAlloc {
    ctx: Arc<Context>,
    base: sys::CUdeviceptr,
}

impl PeerAlloc {
    /// Takes ownership of `base`, a live mapping opened in `ctx`.
    pub(super) fn new(ctx: Arc<Context>, base: sys::CUdeviceptr) -> Self {
        Self { ctx, base }
    }

    /// Device address (in this process) of the exported allocation's first byte.
    pub fn base(&self) -> u64 {
        self.base
    }
}

impl Drop for PeerAlloc {
    /// Closes the mapping, or holds the close back as [`DeviceAlloc`]'s drop does.
    fn drop(&mut self) {
        self.ctx.sharing.release(&self.ctx, Held::Peer(self.base));
    }
}
