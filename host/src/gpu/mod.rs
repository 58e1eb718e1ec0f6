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
mod memory;
pub mod ptx;
mod stream;

use std::path::Path;
use std::sync::Arc;

pub use self::kernel::{Kernel, KernelSpec, LaunchConfig, Module};
use self::kernel::{KernelImpl, ModuleImpl};
pub use self::memory::{Allocation, DeviceBuffer, HostMapped, PeerBuffer, validate_ipc_handle};
use self::memory::{BufferImpl, HostImpl, PeerImpl};
pub use self::stream::{Event, Graph, LazyStream, Stream};
use self::stream::{EventImpl, StreamImpl};
pub use mscclpp_device::arch::host::grid::GridDims;
use mscclpp_shared::{DevicePtr, IpcMemHandle};

pub use crate::backend::BackendKind;
use crate::error::{Error, Result};

/// Environment variable that forces a backend (`cuda` or `cpu`).
pub const BACKEND_ENV: &str = "MSCCLPP_BACKEND";

/// Selecting, parsing and counting (the enum itself lives in the crate-private `backend`
/// module, below the error type that names it).
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
    /// Bytes of the live [`DeviceBuffer`]s allocated through this `Gpu` and its clones
    /// ([`Gpu::allocated_bytes`]); relaxed: a statistic.
    allocated: std::sync::atomic::AtomicUsize,
}

/// One device of one backend. Cheap to clone; everything allocated from it keeps it alive.
#[derive(Clone)]
pub struct Gpu {
    inner: Arc<GpuInner>,
}

/// One rank of this process on a device ([`Gpu::enter_rank`]).
#[derive(Debug)]
pub struct RankOnDevice(#[allow(dead_code)] Option<cuda::RankOnDevice>);

impl RankOnDevice {
    /// Ranks of this process on the device now (1 on the CPU backend, which holds nothing
    /// back).
    pub fn ranks(&self) -> usize {
        self.0.as_ref().map_or(1, |r| r.ranks())
    }
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
            inner: Arc::new(GpuInner {
                kind,
                ordinal,
                imp,
                allocated: std::sync::atomic::AtomicUsize::new(0),
            }),
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

    /// Counts one rank of this process on this device until the returned guard is dropped
    /// (every `Communicator` holds one). While two or more ranks of this process share a CUDA
    /// device, releases that would wait for every kernel of its context (frees, module
    /// unloads) are held back until one is left — a peer's kernel may be waiting for this
    /// rank's next launch (`cuda/release.rs`). Nothing on the CPU backend.
    pub fn enter_rank(&self) -> RankOnDevice {
        RankOnDevice(match &self.inner.imp {
            DeviceImpl::Cuda(d) => Some(d.enter_rank()),
            DeviceImpl::Cpu(_) => None,
        })
    }

    /// The physical device's streaming multiprocessors (CUDA), which the blocks of every kernel
    /// running on it share; `None` on the CPU backend, whose grid emulator runs every block of
    /// every launch on threads of its own.
    pub fn multiprocessors(&self) -> Option<u32> {
        match &self.inner.imp {
            DeviceImpl::Cuda(d) => Some(d.multiprocessors()),
            DeviceImpl::Cpu(_) => None,
        }
    }

    /// Allocates `bytes` of zeroed device memory that can be exported over IPC.
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer> {
        let imp = match &self.inner.imp {
            DeviceImpl::Cuda(d) => BufferImpl::Cuda(d.alloc(bytes)?),
            DeviceImpl::Cpu(d) => BufferImpl::Cpu(d.alloc(bytes)?),
        };
        self.inner
            .allocated
            .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
        Ok(DeviceBuffer {
            gpu: self.clone(),
            imp,
        })
    }

    /// Bytes of device memory allocated with [`alloc`](Self::alloc) through this `Gpu` (and
    /// its clones, not other `Gpu`s of the same device) and not yet freed: what a
    /// communicator and its collectives hold, for tools and tests (`mscclpp-info`).
    pub fn allocated_bytes(&self) -> usize {
        self.inner
            .allocated
            .load(std::sync::atomic::Ordering::Relaxed)
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

    /// Uses a caller's CUDA stream `raw` (`CUstream` / `cudaStream_t` as an integer; `0`, `1`
    /// and `2` are the default streams) without owning it: dropping the [`Stream`] leaves it
    /// alone. [`Error::StreamDevice`] when it belongs to another context than this device's
    /// primary context; [`Error::Unsupported`] on the CPU backend, whose streams are its own.
    ///
    /// # Safety
    /// `raw` is a default-stream handle or a live stream, and stays live as long as the
    /// returned [`Stream`].
    pub unsafe fn borrow_cuda_stream(&self, raw: u64) -> Result<Stream> {
        let imp = match &self.inner.imp {
            // SAFETY: forwarded contract.
            DeviceImpl::Cuda(d) => StreamImpl::Cuda(unsafe { d.borrow_stream(raw) }?),
            DeviceImpl::Cpu(_) => {
                return Err(Error::Unsupported {
                    what: "borrowing a CUDA stream",
                    backend: BackendKind::Cpu,
                });
            }
        };
        Ok(Stream {
            gpu: self.clone(),
            imp,
        })
    }

    /// Creates an event (for timing and cross-stream ordering).
    pub fn event(&self) -> Result<Event> {
        self.event_timing(true)
    }

    /// A new event for ordering only: it cannot time (CUDA's `CU_EVENT_DISABLE_TIMING`, which
    /// makes recording and waiting on it cheaper).
    pub fn marker(&self) -> Result<Event> {
        self.event_timing(false)
    }

    fn event_timing(&self, timing: bool) -> Result<Event> {
        let imp = match &self.inner.imp {
            DeviceImpl::Cuda(d) if timing => EventImpl::Cuda(d.create_event()?),
            DeviceImpl::Cuda(d) => EventImpl::Cuda(d.create_marker()?),
            DeviceImpl::Cpu(d) => EventImpl::Cpu(d.create_event()),
        };
        Ok(Event {
            _gpu: self.clone(),
            imp,
        })
    }

    /// Uses a caller's stream, given as the integer its backend names it by, without owning
    /// it: dropping the returned [`Stream`] leaves it alone, and work queued on it runs in
    /// order with the caller's. One call for both backends ("foreign streams"):
    ///
    /// - CUDA: a `CUstream` / `cudaStream_t` (PyTorch's `torch.cuda.current_stream().cuda_stream`,
    ///   cudarc's `CudaStream::cu_stream()`, the C ABI's argument; `0`, `1` and `2` are the
    ///   default streams): [`borrow_cuda_stream`](Self::borrow_cuda_stream).
    /// - CPU backend: the handle of one of its streams ([`Stream::raw`]; `0`, `1` and `2` are
    ///   the device's default stream). A handle no live stream has is
    ///   [`Error::UnknownStream`]; once its owner is dropped, queuing on the borrowed stream
    ///   fails instead of running.
    ///
    /// [`Error::StreamDevice`] when the stream belongs to another device.
    ///
    /// # Safety
    /// On CUDA, `raw` is a default-stream handle or a live stream of this device's primary
    /// context, and stays live as long as the returned [`Stream`] (the CPU backend checks its
    /// handles itself).
    pub unsafe fn borrow_stream(&self, raw: u64) -> Result<Stream> {
        let imp = match &self.inner.imp {
            // SAFETY: forwarded contract.
            DeviceImpl::Cuda(d) => StreamImpl::Cuda(unsafe { d.borrow_stream(raw) }?),
            DeviceImpl::Cpu(d) => StreamImpl::Cpu(d.borrow_stream(raw)?),
        };
        Ok(Stream {
            gpu: self.clone(),
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
            // Empty PTX: a `MSCCLPP_SKIP_PTX=1` build (CPU-backend mutation runs), which has no
            // entry points to check names against.
            DeviceImpl::Cpu(_) => ModuleImpl::Cpu {
                entries: (!ptx.trim().is_empty()).then(|| ptx::PtxInfo::parse(ptx).entries),
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
