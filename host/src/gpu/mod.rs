//! One host API for GPU memory, IPC, host-mapped memory, streams, events and kernel launch, over
//! two backends:
//!
//! | | `cuda` ([`cuda`]) | `cpu` ([`cpu`]) |
//! |---|---|---|
//! | device memory | `cuMemAlloc_v2` (exportable over IPC) | a `memfd` per allocation, mapped shared |
//! | host-mapped memory | `cuMemHostAlloc(DEVICEMAP \| PORTABLE)` | plain host memory |
//! | IPC | `cuIpcGetMemHandle` / `cuIpcOpenMemHandle` | `/proc/<pid>/fd/<fd>` of the owner's memfd |
//! | streams | CUDA streams | a worker thread per stream running its queue in order |
//! | kernels | PTX entry points | the same Rust functions on the grid emulator |
//! | graphs ([`Stream::capture`]) | stream capture, `cuGraphLaunch` | not supported |
//!
//! Everything above this module (transports, proxy, channels, collectives) is written once
//! against these types. Device addresses are [`DevicePtr`]s: on the CPU backend they are host
//! addresses valid in the process that mapped them.

pub mod cpu;
pub mod cuda;
mod kernel;
pub mod ptx;

use std::path::Path;
use std::sync::Arc;

pub use kernel::{KernelSpec, LaunchConfig};
pub use mscclpp_device::arch::host::grid::GridDims;
use mscclpp_shared::{DevicePtr, IpcMemHandle};

use crate::error::{Error, Result};

/// Which implementation runs "device" work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// NVIDIA GPUs through the CUDA driver API (libcuda loaded at run time).
    Cuda,
    /// Shared-memory "device" memory and kernels on OS threads.
    Cpu,
}

/// Environment variable that forces a backend (`cuda` or `cpu`).
pub const BACKEND_ENV: &str = "MSCCLPP_BACKEND";

impl BackendKind {
    /// `MSCCLPP_BACKEND` if set; else CUDA when libcuda loads and reports a device; else CPU,
    /// with a one-line notice on standard error (printed once per process).
    pub fn select() -> Result<Self> {
        match std::env::var(BACKEND_ENV) {
            Ok(v) => Self::parse(&v),
            Err(_) => {
                if cuda::device_count().is_ok_and(|n| n > 0) {
                    Ok(Self::Cuda)
                } else {
                    static NOTICE: std::sync::Once = std::sync::Once::new();
                    NOTICE.call_once(|| {
                        eprintln!(
                            "mscclpp: no CUDA device found; using the CPU backend (set {BACKEND_ENV}=cuda to require GPUs)"
                        )
                    });
                    Ok(Self::Cpu)
                }
            }
        }
    }

    /// Parses `cuda` or `cpu` (case-insensitive).
    pub fn parse(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cuda" | "gpu" => Ok(Self::Cuda),
            "cpu" => Ok(Self::Cpu),
            _ => Err(Error::UnknownBackend(s.to_string())),
        }
    }

    /// Devices this backend offers.
    pub fn device_count(self) -> Result<usize> {
        match self {
            Self::Cuda => cuda::device_count(),
            Self::Cpu => Ok(cpu::device_count()),
        }
    }
}

enum DeviceImpl {
    Cuda(cuda::Device),
    Cpu(cpu::Device),
}

struct GpuInner {
    kind: BackendKind,
    ordinal: usize,
    imp: DeviceImpl,
}

/// One device of one backend. Cheap to clone; everything allocated from it keeps it alive.
#[derive(Clone)]
pub struct Gpu {
    inner: Arc<GpuInner>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gpu({:?} {})", self.inner.kind, self.inner.ordinal)
    }
}

impl Gpu {
    /// Opens device `ordinal` of `kind`.
    pub fn open(kind: BackendKind, ordinal: usize) -> Result<Self> {
        let imp = match kind {
            BackendKind::Cuda => DeviceImpl::Cuda(cuda::Device::open(ordinal)?),
            BackendKind::Cpu => DeviceImpl::Cpu(cpu::Device::open(ordinal)?),
        };
        Ok(Self {
            inner: Arc::new(GpuInner { kind, ordinal, imp }),
        })
    }

    /// Opens device `ordinal` of the selected backend ([`BackendKind::select`]).
    pub fn open_default(ordinal: usize) -> Result<Self> {
        Self::open(BackendKind::select()?, ordinal)
    }

    /// The backend.
    pub fn kind(&self) -> BackendKind {
        self.inner.kind
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.inner.ordinal
    }

    /// A human-readable device name.
    pub fn name(&self) -> String {
        match &self.inner.imp {
            DeviceImpl::Cuda(d) => d.name(),
            DeviceImpl::Cpu(d) => d.name(),
        }
    }

    /// The physical device's PCI bus id (CUDA); `None` on the CPU backend, whose devices are
    /// all the same memory.
    pub fn pci_bus_id(&self) -> Option<String> {
        match &self.inner.imp {
            DeviceImpl::Cuda(d) => Some(d.pci_bus_id()),
            DeviceImpl::Cpu(_) => None,
        }
    }

    /// Allocates `bytes` of zeroed device memory that can be exported over IPC.
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer> {
        let imp = match &self.inner.imp {
            DeviceImpl::Cuda(d) => BufferImpl::Cuda(d.alloc(bytes)?),
            DeviceImpl::Cpu(d) => BufferImpl::Cpu(d.alloc(bytes)?),
        };
        Ok(DeviceBuffer {
            gpu: self.clone(),
            imp,
        })
    }

    /// Allocates `bytes` of zeroed host memory that this device can access (FIFO, flags).
    pub fn alloc_host_mapped(&self, bytes: usize) -> Result<HostMapped> {
        let imp = match &self.inner.imp {
            DeviceImpl::Cuda(d) => HostImpl::Cuda(d.alloc_host_mapped(bytes)?),
            DeviceImpl::Cpu(d) => HostImpl::Cpu(d.alloc_host_mapped(bytes)?),
        };
        Ok(HostMapped {
            _gpu: self.clone(),
            imp,
        })
    }

    /// Maps a buffer another process (or device) exported. Validates the handle first.
    pub fn open_ipc(&self, handle: &IpcMemHandle) -> Result<PeerBuffer> {
        validate_ipc_handle(handle, self.kind())?;
        let imp = match &self.inner.imp {
            DeviceImpl::Cuda(d) => PeerImpl::Cuda(d.open_ipc(handle)?),
            DeviceImpl::Cpu(d) => PeerImpl::Cpu(d.open_ipc(handle)?),
        };
        Ok(PeerBuffer {
            _gpu: self.clone(),
            imp,
            offset: handle.offset as usize,
            size: handle.size as usize,
        })
    }

    /// The allocation of this device, made by this process (by us or by anyone else: PyTorch,
    /// cudarc, …), that `ptr` lies in. Collectives use it to register a caller's buffer.
    pub fn allocation_of(&self, ptr: DevicePtr<u8>) -> Result<Allocation> {
        let (base, size, id) = match &self.inner.imp {
            DeviceImpl::Cuda(d) => d.allocation_of(ptr.addr())?,
            DeviceImpl::Cpu(d) => d.allocation_of(ptr.addr())?,
        };
        Ok(Allocation {
            base: DevicePtr::from_addr(base),
            size,
            id,
        })
    }

    /// Exports a whole allocation (from [`Gpu::allocation_of`]) for [`Gpu::open_ipc`] in
    /// another process. Fails for memory that cannot be shared (CUDA: not from `cuMemAlloc`).
    pub fn export_allocation(&self, a: &Allocation) -> Result<IpcMemHandle> {
        match &self.inner.imp {
            DeviceImpl::Cuda(d) => d.export_allocation(a.base.addr(), a.size),
            DeviceImpl::Cpu(d) => d.export_allocation(a.base.addr()),
        }
    }

    /// Lets this device access `peer`'s memory directly (GPUs of one process). A no-op on the
    /// CPU backend and when already enabled.
    pub fn enable_peer_access(&self, peer: &Gpu) -> Result<()> {
        match (&self.inner.imp, &peer.inner.imp) {
            (DeviceImpl::Cuda(d), DeviceImpl::Cuda(p)) => d.enable_peer_access(p),
            (DeviceImpl::Cpu(_), DeviceImpl::Cpu(_)) => Ok(()),
            _ => Err(Error::Unsupported {
                what: "peer access between devices of different backends",
                backend: self.kind(),
            }),
        }
    }

    /// Creates a stream.
    pub fn stream(&self) -> Result<Stream> {
        let imp = match &self.inner.imp {
            DeviceImpl::Cuda(d) => StreamImpl::Cuda(d.create_stream()?),
            DeviceImpl::Cpu(d) => StreamImpl::Cpu(d.create_stream()?),
        };
        Ok(Stream {
            gpu: self.clone(),
            imp,
        })
    }

    /// Creates an event (for timing and cross-stream ordering).
    pub fn event(&self) -> Result<Event> {
        let imp = match &self.inner.imp {
            DeviceImpl::Cuda(d) => EventImpl::Cuda(d.create_event()?),
            DeviceImpl::Cpu(d) => EventImpl::Cpu(d.create_event()),
        };
        Ok(Event {
            _gpu: self.clone(),
            imp,
        })
    }

    /// Loads PTX text (e.g. `mscclpp::DEVICE_PTX`). On the CUDA backend the driver compiles it
    /// for the device ([`Error::PtxTarget`] if it was built for a newer GPU). On the CPU backend
    /// kernels run from their host functions ([`KernelSpec::host`]), and the text only names
    /// the entry points and their parameter sizes, which [`Module::kernel`] checks as the
    /// driver does.
    pub fn load_ptx(&self, ptx: &str) -> Result<Module> {
        let imp = match &self.inner.imp {
            DeviceImpl::Cuda(d) => ModuleImpl::Cuda(d.load_ptx(ptx)?),
            DeviceImpl::Cpu(_) => ModuleImpl::Cpu {
                entries: ptx::PtxInfo::parse(ptx).entries,
            },
        };
        Ok(Module {
            gpu: self.clone(),
            imp,
        })
    }

    /// Loads a PTX (`.ptx`) or cubin (any other extension) file. CUDA backend only.
    pub fn load_module_file(&self, path: &Path) -> Result<Module> {
        let imp = match &self.inner.imp {
            DeviceImpl::Cuda(d) => ModuleImpl::Cuda(d.load_module_file(path)?),
            DeviceImpl::Cpu(_) => {
                return Err(Error::Unsupported {
                    what: "loading a PTX/cubin file",
                    backend: BackendKind::Cpu,
                });
            }
        };
        Ok(Module {
            gpu: self.clone(),
            imp,
        })
    }

    /// Waits for all work on the device.
    pub fn synchronize(&self) -> Result<()> {
        match &self.inner.imp {
            DeviceImpl::Cuda(d) => d.synchronize(),
            DeviceImpl::Cpu(d) => d.synchronize(),
        }
    }

    /// The NUMA node the device is attached to, if the system says (sysfs).
    pub fn numa_node(&self) -> Option<u32> {
        match &self.inner.imp {
            DeviceImpl::Cuda(d) => d.numa_node(),
            DeviceImpl::Cpu(_) => None,
        }
    }

    /// Makes this device current on the calling thread (CUDA: the primary context). Host
    /// threads that call driver APIs on raw pointers (e.g. a proxy) do this once.
    pub fn bind_to_thread(&self) -> Result<()> {
        match &self.inner.imp {
            DeviceImpl::Cuda(d) => d.bind_to_thread(),
            DeviceImpl::Cpu(_) => Ok(()),
        }
    }
}

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

enum BufferImpl {
    Cuda(cuda::DeviceAlloc),
    Cpu(cpu::ShmAlloc),
}

/// Device memory owned by this process; freed on drop.
pub struct DeviceBuffer {
    gpu: Gpu,
    imp: BufferImpl,
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

impl Gpu {
    fn cuda_device(&self) -> Result<&cuda::Device> {
        match &self.inner.imp {
            DeviceImpl::Cuda(d) => Ok(d),
            DeviceImpl::Cpu(_) => Err(Error::Unsupported {
                what: "a CUDA driver call",
                backend: BackendKind::Cpu,
            }),
        }
    }
}

fn check_range(offset: usize, len: usize, size: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::OutOfRange { offset, len, size }),
    }
}

enum HostImpl {
    Cuda(cuda::HostAlloc),
    Cpu(cpu::HostAlloc),
}

/// Host memory the device can access; freed on drop.
pub struct HostMapped {
    _gpu: Gpu,
    imp: HostImpl,
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

enum PeerImpl {
    Cuda(cuda::PeerAlloc),
    Cpu(cpu::PeerMap),
}

/// Another process's (or device's) buffer, mapped here; unmapped on drop.
pub struct PeerBuffer {
    _gpu: Gpu,
    imp: PeerImpl,
    offset: usize,
    size: usize,
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

enum StreamImpl {
    Cuda(cuda::Stream),
    Cpu(cpu::Stream),
}

/// An in-order queue of device work.
pub struct Stream {
    gpu: Gpu,
    imp: StreamImpl,
}

impl Stream {
    /// The device.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Queues a device-to-device copy (local or peer-mapped addresses).
    ///
    /// # Safety
    /// `dst` and `src` must be valid device addresses for `bytes` until the copy completes, and
    /// must not overlap.
    pub unsafe fn copy_dtod(
        &self,
        dst: DevicePtr<u8>,
        src: DevicePtr<u8>,
        bytes: usize,
    ) -> Result<()> {
        match &self.imp {
            // SAFETY: forwarded contract.
            StreamImpl::Cuda(s) => unsafe { s.copy_dtod(dst.addr(), src.addr(), bytes) },
            // SAFETY: forwarded contract.
            StreamImpl::Cpu(s) => unsafe { s.copy_dtod(dst.addr(), src.addr(), bytes) },
        }
    }

    /// Queues a store of `value` to the u64 at `dst` that happens after the work queued
    /// before it is complete and visible (the flag half of a connection's `update_and_sync`).
    ///
    /// # Safety
    /// `dst` is a live, 8-byte aligned device address (local or peer-mapped) until it runs.
    pub unsafe fn write_value_u64(&self, dst: DevicePtr<u64>, value: u64) -> Result<()> {
        match &self.imp {
            // SAFETY: forwarded contract.
            StreamImpl::Cuda(s) => unsafe { s.write_value_u64(dst.addr(), value) },
            // SAFETY: forwarded contract.
            StreamImpl::Cpu(s) => unsafe { s.write_value_u64(dst.addr(), value) },
        }
    }

    /// Whether all queued work is done; reports a failure of queued work.
    pub fn query(&self) -> Result<bool> {
        match &self.imp {
            StreamImpl::Cuda(s) => s.query(),
            StreamImpl::Cpu(s) => s.query(),
        }
    }

    /// Waits until all queued work is done or `timeout` passes (polling, so the wait is
    /// bounded even if the device never finishes).
    pub fn synchronize_timeout(&self, timeout: std::time::Duration) -> Result<bool> {
        let deadline = std::time::Instant::now() + timeout;
        let mut backoff = crate::proxy::Backoff::default();
        loop {
            if self.query()? {
                return Ok(true);
            }
            if std::time::Instant::now() >= deadline {
                return Ok(false);
            }
            backoff.snooze();
        }
    }

    /// Queues a launch of `kernel` with `params`.
    ///
    /// # Safety
    /// Every address in `params` must be valid for what the kernel does with it until the
    /// launch completes.
    pub unsafe fn launch<P: bytemuck::Pod + Send + Sync>(
        &self,
        kernel: &Kernel<P>,
        cfg: LaunchConfig,
        params: P,
    ) -> Result<()> {
        let launch_err = |source| Error::Launch {
            name: kernel.spec.name.to_string(),
            grid: cfg.grid,
            block: cfg.block,
            shared_mem: cfg.shared_mem_bytes,
            ordinal: self.gpu.ordinal(),
            source,
        };
        match (&self.imp, &kernel.imp) {
            (StreamImpl::Cuda(s), KernelImpl::Cuda(f)) => {
                // SAFETY: forwarded contract; `f` was checked to take `size_of::<P>()` bytes.
                unsafe { s.launch(f, cfg, bytemuck::bytes_of(&params)) }.map_err(launch_err)
            }
            (StreamImpl::Cpu(s), KernelImpl::Cpu(host)) => {
                let host = *host;
                let dims = GridDims {
                    grid: cfg.grid,
                    block: cfg.block,
                    shared_mem_bytes: cfg.shared_mem_bytes,
                };
                // SAFETY: forwarded contract: the kernel's addresses stay valid until it ends.
                let body = move || unsafe { host(params) };
                s.launch(kernel.spec.name, dims, Box::new(body))
                    .map_err(launch_err)
            }
            _ => Err(Error::Unsupported {
                what: "launching a kernel of another backend's module",
                backend: self.gpu.kind(),
            }),
        }
    }

    /// Records `event` after the work queued so far.
    pub fn record(&self, event: &Event) -> Result<()> {
        match (&self.imp, &event.imp) {
            (StreamImpl::Cuda(s), EventImpl::Cuda(e)) => s.record(e),
            (StreamImpl::Cpu(s), EventImpl::Cpu(e)) => s.record(e),
            _ => Err(Error::Unsupported {
                what: "an event of another backend",
                backend: self.gpu.kind(),
            }),
        }
    }

    /// Makes later work on this stream wait for `event`.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        match (&self.imp, &event.imp) {
            (StreamImpl::Cuda(s), EventImpl::Cuda(e)) => s.wait_event(e),
            (StreamImpl::Cpu(s), EventImpl::Cpu(e)) => s.wait_event(e),
            _ => Err(Error::Unsupported {
                what: "an event of another backend",
                backend: self.gpu.kind(),
            }),
        }
    }

    /// Waits until all queued work is done; reports the first failure of queued work.
    pub fn synchronize(&self) -> Result<()> {
        match &self.imp {
            StreamImpl::Cuda(s) => s.synchronize(),
            StreamImpl::Cpu(s) => s.synchronize(),
        }
    }

    /// Captures the work that `queue` puts on this stream into a [`Graph`] instead of running
    /// it (CUDA stream capture, relaxed mode), so that it can be replayed with one launch. The
    /// capture ends, and the stream runs work normally again, whether `queue` succeeds or not.
    /// CUDA backend only: the CPU backend answers [`Error::Unsupported`].
    ///
    /// Everything queued on this stream while `queue` runs is captured; synchronising the
    /// stream (or anything else that waits for it) inside `queue` fails the capture.
    pub fn capture<E: From<Error>>(
        &self,
        queue: impl FnOnce() -> std::result::Result<(), E>,
    ) -> std::result::Result<Graph, E> {
        let StreamImpl::Cuda(s) = &self.imp else {
            return Err(Error::Unsupported {
                what: "CUDA graph capture",
                backend: self.gpu.kind(),
            }
            .into());
        };
        s.begin_capture()?;
        let queued = queue();
        let ended = s.end_capture();
        queued?;
        Ok(Graph {
            _gpu: self.gpu.clone(),
            imp: ended?,
        })
    }

    /// The raw `CUstream` (CUDA backend), for interop with other libraries (NCCL, graphs).
    pub fn cuda_raw(&self) -> Option<u64> {
        match &self.imp {
            StreamImpl::Cuda(s) => Some(s.raw()),
            StreamImpl::Cpu(_) => None,
        }
    }
}

/// Captured stream work ([`Stream::capture`]), replayed with [`Graph::launch`] (CUDA only).
pub struct Graph {
    _gpu: Gpu,
    imp: cuda::Graph,
}

impl Graph {
    /// Queues one replay of the captured work on `stream` (a stream of the same device).
    ///
    /// # Safety
    /// Every address the captured work uses (kernel parameters, copies) is still valid and stays
    /// so until the replay completes.
    pub unsafe fn launch(&self, stream: &Stream) -> Result<()> {
        match &stream.imp {
            // SAFETY: forwarded contract.
            StreamImpl::Cuda(s) => unsafe { self.imp.launch(s) },
            StreamImpl::Cpu(_) => Err(Error::Unsupported {
                what: "launching a CUDA graph",
                backend: BackendKind::Cpu,
            }),
        }
    }
}

enum EventImpl {
    Cuda(cuda::Event),
    Cpu(cpu::Event),
}

/// A marker in a stream.
pub struct Event {
    _gpu: Gpu,
    imp: EventImpl,
}

impl Event {
    /// Waits until the work before the marker is done.
    pub fn synchronize(&self) -> Result<()> {
        match &self.imp {
            EventImpl::Cuda(e) => e.synchronize(),
            EventImpl::Cpu(e) => e.synchronize(),
        }
    }

    /// Milliseconds between `start` and `self` (both recorded and complete).
    pub fn elapsed_ms(&self, start: &Event) -> Result<f32> {
        match (&self.imp, &start.imp) {
            (EventImpl::Cuda(e), EventImpl::Cuda(s)) => e.elapsed_ms(s),
            (EventImpl::Cpu(e), EventImpl::Cpu(s)) => e.elapsed_ms(s),
            _ => Err(Error::Unsupported {
                what: "timing events of two backends",
                backend: BackendKind::Cpu,
            }),
        }
    }
}

enum ModuleImpl {
    Cuda(cuda::Module),
    /// The PTX's entry points and their parameter bytes (the kernels themselves are the
    /// specs' host functions).
    Cpu {
        entries: std::collections::HashMap<String, Option<usize>>,
    },
}

/// Loaded kernels (CUDA: a `CUmodule`; CPU: the PTX's entry points, run from the kernels' host
/// functions).
pub struct Module {
    gpu: Gpu,
    imp: ModuleImpl,
}

impl Module {
    /// Looks up `spec` in the module: its PTX entry point, checking that the parameter struct
    /// `P` has the size the entry point takes. On CUDA the driver finds the entry point and
    /// reports its parameters (from CUDA 12.4); on the CPU backend the loaded PTX text says
    /// both, and the spec's host function runs. Either way a name the PTX lacks is
    /// [`Error::MissingKernel`] and a wrong size [`Error::ParamSize`], so a misspelt name fails
    /// without a GPU too.
    pub fn kernel<P: bytemuck::Pod>(&self, spec: KernelSpec<P>) -> Result<Kernel<P>> {
        let size_check = |expected: Option<usize>| match expected {
            Some(expected) if expected != std::mem::size_of::<P>() => Err(Error::ParamSize {
                name: spec.name.to_string(),
                expected,
                got: std::mem::size_of::<P>(),
            }),
            _ => Ok(()),
        };
        let imp = match &self.imp {
            ModuleImpl::Cuda(m) => {
                let f = m.function(spec.name)?;
                size_check(f.param_bytes())?;
                KernelImpl::Cuda(f)
            }
            ModuleImpl::Cpu { entries } => {
                let Some(&bytes) = entries.get(spec.name) else {
                    return Err(Error::MissingKernel {
                        name: spec.name.to_string(),
                    });
                };
                size_check(bytes)?;
                match spec.host {
                    Some(h) => KernelImpl::Cpu(h),
                    None => {
                        return Err(Error::Unsupported {
                            what: "a kernel with no host function",
                            backend: self.gpu.kind(),
                        });
                    }
                }
            }
        };
        Ok(Kernel { spec, imp })
    }
}

enum KernelImpl<P> {
    Cuda(cuda::Function),
    Cpu(unsafe fn(P)),
}

/// A kernel ready to launch with parameters `P`.
pub struct Kernel<P> {
    spec: KernelSpec<P>,
    imp: KernelImpl<P>,
}

impl<P> Kernel<P> {
    /// The entry point name.
    pub fn name(&self) -> &'static str {
        self.spec.name
    }
}
