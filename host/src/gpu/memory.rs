//! The memory types of the device runtime: device buffers, host-mapped memory, peers' buffers
//! mapped here, and the checks on a received IPC handle.

use mscclpp_shared::{DevicePtr, IpcMemHandle};

use super::{BackendKind, Gpu, cpu, cuda};
use crate::error::{Error, Result};

/// One allocation of device memory as the backend knows it ([`Gpu::allocation_of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// Its first byte.
    pub base: DevicePtr<u8>,
    /// Its size in bytes.
    pub size: usize,
    /// Names the allocation for the life of the process (CUDA's buffer id, the CPU backend's
    /// random token): an address freed and reused by a new allocation gets a new id.
    pub id: u64,
}

/// Checks a received IPC handle before any backend touches it.
pub fn validate_ipc_handle(h: &IpcMemHandle, backend: BackendKind) -> Result<()> {
    use mscclpp_shared::ipc::{IPC_KIND_CPU, IPC_KIND_CUDA};
    let bad = |reason: String| Err(Error::IpcInvalid { reason });
    let want = match backend {
        BackendKind::Cuda => IPC_KIND_CUDA,
        BackendKind::Cpu => IPC_KIND_CPU,
    };
    if h.kind != want {
        return bad(format!(
            "kind {} does not belong to the {backend:?} backend",
            h.kind
        ));
    }
    match h.offset.checked_add(h.size) {
        Some(end) if end <= h.alloc_size && h.size > 0 => Ok(()),
        _ => bad(format!(
            "range {}+{} is outside its {}-byte allocation (or empty)",
            h.offset, h.size, h.alloc_size
        )),
    }
}

pub(super) enum BufferImpl {
    Cuda(cuda::DeviceAlloc),
    Cpu(cpu::ShmAlloc),
}

/// Device memory owned by this process; freed on drop.
pub struct DeviceBuffer {
    pub(super) gpu: Gpu,
    pub(super) imp: BufferImpl,
}

impl DeviceBuffer {
    /// Device address of the first byte.
    pub fn ptr(&self) -> DevicePtr<u8> {
        DevicePtr::from_addr(match &self.imp {
            BufferImpl::Cuda(a) => a.ptr(),
            BufferImpl::Cpu(a) => a.ptr(),
        })
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        match &self.imp {
            BufferImpl::Cuda(a) => a.len(),
            BufferImpl::Cpu(a) => a.len(),
        }
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device it lives on.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// A handle another process can open with [`Gpu::open_ipc`].
    pub fn ipc_handle(&self) -> Result<IpcMemHandle> {
        match &self.imp {
            BufferImpl::Cuda(a) => a.ipc_handle(self.gpu.ordinal()),
            BufferImpl::Cpu(a) => a.ipc_handle(self.gpu.ordinal()),
        }
    }

    /// Copies `src` into the buffer at `offset` and waits for the copy.
    pub fn copy_from_host(&self, offset: usize, src: &[u8]) -> Result<()> {
        check_range(offset, src.len(), self.len())?;
        let dst = self.ptr().byte_add_cast::<u8>(offset as u64);
        match &self.imp {
            BufferImpl::Cuda(_) => self.gpu.cuda_device()?.copy_htod_sync(dst.addr(), src),
            BufferImpl::Cpu(_) => {
                // SAFETY: the range was checked against this live mapping.
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_ptr(), src.len()) };
                Ok(())
            }
        }
    }

    /// Copies from the buffer at `offset` into `dst` and waits for the copy.
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        check_range(offset, dst.len(), self.len())?;
        let src = self.ptr().byte_add_cast::<u8>(offset as u64);
        match &self.imp {
            BufferImpl::Cuda(_) => self.gpu.cuda_device()?.copy_dtoh_sync(dst, src.addr()),
            BufferImpl::Cpu(_) => {
                // SAFETY: the range was checked against this live mapping.
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr(), dst.len()) };
                Ok(())
            }
        }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // The memory itself is freed by the backend's owner (`imp`), dropped right after.
        self.gpu
            .inner
            .allocated
            .fetch_sub(self.len(), std::sync::atomic::Ordering::Relaxed);
    }
}

fn check_range(offset: usize, len: usize, size: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::OutOfRange { offset, len, size }),
    }
}

pub(super) enum HostImpl {
    Cuda(cuda::HostAlloc),
    Cpu(cpu::HostAlloc),
}

/// Host memory the device can access; freed on drop.
pub struct HostMapped {
    pub(super) _gpu: Gpu,
    pub(super) imp: HostImpl,
}

impl HostMapped {
    /// Host address.
    pub fn host_ptr(&self) -> *mut u8 {
        match &self.imp {
            HostImpl::Cuda(a) => a.host_ptr(),
            HostImpl::Cpu(a) => a.host_ptr(),
        }
    }

    /// Device address of the same memory.
    pub fn device_ptr(&self) -> DevicePtr<u8> {
        DevicePtr::from_addr(match &self.imp {
            HostImpl::Cuda(a) => a.device_ptr(),
            HostImpl::Cpu(a) => a.host_ptr() as u64,
        })
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        match &self.imp {
            HostImpl::Cuda(a) => a.len(),
            HostImpl::Cpu(a) => a.len(),
        }
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

pub(super) enum PeerImpl {
    Cuda(cuda::PeerAlloc),
    Cpu(cpu::PeerMap),
}

/// Another process's (or device's) buffer, mapped here; unmapped on drop.
pub struct PeerBuffer {
    pub(super) _gpu: Gpu,
    pub(super) imp: PeerImpl,
    pub(super) offset: usize,
    pub(super) size: usize,
}

impl PeerBuffer {
    /// Device address (in this process) of the exported buffer's first byte.
    pub fn ptr(&self) -> DevicePtr<u8> {
        let base = match &self.imp {
            PeerImpl::Cuda(a) => a.base(),
            PeerImpl::Cpu(a) => a.base(),
        };
        DevicePtr::from_addr(base + self.offset as u64)
    }

    /// Size in bytes of the exported buffer.
    pub fn len(&self) -> usize {
        self.size
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }
}
