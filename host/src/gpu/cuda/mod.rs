//! The `cuda` backend: NVIDIA GPUs through the CUDA driver API, with libcuda loaded at run time.
//!
//! Three layers, as in cudarc (STYLE item 3):
//!
//! 1. `cudarc::driver::sys`: the raw `extern "C"` entry points, resolved from libcuda on first
//!    use (feature `dynamic-loading`, so building needs no CUDA toolkit).
//! 2. `result`: one thin function per driver call, returning `Result<_, DriverError>` with the
//!    call's name and the code's name. All `unsafe` of this backend lives there and in the few
//!    owner methods that hand raw handles to it.
//! 3. The RAII owners below. Their `Drop`s never panic: a failing release is logged with
//!    `tracing::warn!` and otherwise ignored.
//!
//! We use none of cudarc's safe layer (`CudaContext`, `CudaStream`, `CudaSlice`, …): it has no
//! IPC, peer or mapped-host calls, and its stream-ordered pool allocations cannot be exported
//! over IPC. Consequently cudarc's automatic event tracking (the "turn it off" item of DESIGN
//! section 2) never runs here: no cudarc event is ever created, so there is nothing to disable.
//!
//! # Initialisation
//! [`device_count`] (and so [`Device::open`]) first checks that libcuda can be loaded
//! ([`Error::NoLibcuda`] if not; cudarc would panic on the first call otherwise), then calls
//! `cuInit(0)` once per process ([`Error::CudaInit`] if it fails). The outcome is remembered.
//!
//! # Owners, what they own, and threads
//! Every owner keeps an `Arc` of the device's retained primary context, so the context outlives
//! everything made in it. The CUDA driver API is thread-safe and its handles are not tied to a
//! thread, but the *current context* is per thread: every method below that calls the driver
//! first makes its device's primary context current on the calling thread (`cuCtxSetCurrent`),
//! so any owner may be used, and dropped, from any thread. All owners are `Send + Sync`.
//!
//! | owner | owns | released by |
//! |---|---|---|
//! | [`Device`] | one reference of the device's primary context (`cuDevicePrimaryCtxRetain`) | `cuDevicePrimaryCtxRelease_v2` when the last owner of the device is gone |
//! | [`DeviceAlloc`] | a `cuMemAlloc_v2` allocation (exportable over IPC) | `cuMemFree_v2`* |
//! | [`HostAlloc`] | a `cuMemHostAlloc(DEVICEMAP \| PORTABLE)` allocation | `cuMemFreeHost`* |
//! | [`PeerAlloc`] | a mapping of another process's allocation (`cuIpcOpenMemHandle_v2`) | `cuIpcCloseMemHandle`* |
//! | [`Stream`] | a non-blocking stream (a caller's stream from [`Device::borrow_stream`]: nothing) | `cuStreamDestroy_v2` (queued work still completes); a borrowed one is left alone |
//! | [`Event`] | an event with timing enabled | `cuEventDestroy_v2` |
//! | [`Graph`] | a captured graph and its executable instance | `cuGraphExecDestroy` + `cuGraphDestroy` |
//! | [`Module`] | a loaded module, shared with its [`Function`]s | `cuModuleUnload`* when the module and all its functions are gone |
//! | [`RankOnDevice`] | one count of the ranks of this process on the device | the count; the last but one carries out the releases held back |
//!
//! \* These wait for every kernel of the context: while two or more ranks of this process share
//! the device they are held back until one is left (`release.rs`).
//!
//! Freeing memory, closing a mapping or unloading a module while queued work still uses it is
//! the caller's bug (the layers above keep the owners alive until their work is synchronised).
//!
//! # Ordering of the synchronous copies
//! [`Device::copy_htod_sync`], [`Device::copy_dtoh_sync`] and the zeroing in [`Device::alloc`]
//! run on the legacy default stream, which our streams (created `CU_STREAM_NON_BLOCKING`) do not
//! wait for. So each of them waits for its own completion before returning: after one returns,
//! work queued on any stream sees its effect. They do *not* wait for work queued earlier on
//! other streams: synchronise those first.

mod memory;
mod module;
mod release;
mod result;
mod stream;
#[cfg(test)]
mod tests;

use std::ffi::c_int;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys;
use mscclpp_shared::IpcMemHandle;

pub use memory::{DeviceAlloc, HostAlloc, PeerAlloc};
pub use module::{Function, Module};
pub use release::RankOnDevice;
pub use stream::{Event, Graph, Stream};

use super::BackendKind;
use super::ptx::SmArch;
use crate::error::{BackendError, DriverError, Error, Result};

/// Why initialisation failed (kept for the whole process).
#[derive(Debug, Clone)]
enum InitFailure {
    NoLibcuda,
    Init(DriverError),
}

/// Loads libcuda and runs `cuInit(0)`, once per process; later calls return the first outcome.
fn init() -> Result<()> {
    static INIT: OnceLock<std::result::Result<(), InitFailure>> = OnceLock::new();
    let outcome = INIT.get_or_init(|| {
        // SAFETY: only tries to `dlopen` the candidate library names; calls nothing in them.
        if !unsafe { sys::is_culib_present() } {
            return Err(InitFailure::NoLibcuda);
        }
        result::cu_init().map_err(InitFailure::Init)
    });
    match outcome {
        Ok(()) => Ok(()),
        Err(InitFailure::NoLibcuda) => Err(Error::NoLibcuda),
        Err(InitFailure::Init(e)) => Err(Error::CudaInit(e.clone())),
    }
}

/// Number of CUDA devices. [`Error::NoLibcuda`] when libcuda cannot be loaded (never a panic),
/// [`Error::CudaInit`] when `cuInit` or `cuDeviceGetCount` fails.
pub fn device_count() -> Result<usize> {
    init()?;
    result::cu_device_get_count().map_err(Error::CudaInit)
}

/// The ordinal of the calling thread's current CUDA device (the device of its current context,
/// as `cudaGetDevice` reports it), or `None` when the thread has no current context (the CUDA
/// runtime then means device 0). [`Error::NoLibcuda`] / [`Error::CudaInit`] as
/// [`device_count`]; [`Error::CurrentDevice`] when the driver cannot say.
pub fn current_device() -> Result<Option<usize>> {
    let count = device_count()?;
    let err = |source| Error::CurrentDevice { source };
    if result::cu_ctx_get_current().map_err(err)?.is_null() {
        return Ok(None);
    }
    let dev = result::cu_ctx_get_device().map_err(err)?;
    for ordinal in 0..count {
        // `ordinal < count <= c_int::MAX`, so the cast is lossless.
        if result::cu_device_get(ordinal as c_int).map_err(err)? == dev {
            return Ok(Some(ordinal));
        }
    }
    Ok(None)
}

/// While alive, the calling thread's stream-capture mode is relaxed
/// (`cuThreadExchangeStreamCaptureMode(CU_STREAM_CAPTURE_MODE_RELAXED)`): a call made while
/// another stream of the process captures in the default, global mode (PyTorch's
/// `torch.cuda.graph`) may then make driver calls that global mode forbids (allocating,
/// exporting or mapping memory), as PyTorch's own allocator does during a capture. Work
/// queued on the capturing stream is still captured. Dropping it restores the previous mode.
/// Tied to its thread (not `Send`).
#[derive(Debug)]
pub struct RelaxedCapture {
    previous: sys::CUstreamCaptureMode,
    _thread: std::marker::PhantomData<*const ()>,
}

impl RelaxedCapture {
    /// Relaxes the calling thread's capture mode. [`Error::NoLibcuda`] / [`Error::CudaInit`]
    /// as [`device_count`]; [`Error::CaptureMode`] if the driver refuses.
    pub fn new() -> Result<Self> {
        init()?;
        let relaxed = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        let previous = result::cu_thread_exchange_stream_capture_mode(relaxed)
            .map_err(|source| Error::CaptureMode { source })?;
        Ok(Self {
            previous,
            _thread: std::marker::PhantomData,
        })
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        if let Err(e) = result::cu_thread_exchange_stream_capture_mode(self.previous) {
            tracing::warn!(error = %e, "restoring the thread's stream-capture mode failed");
        }
    }
}

/// While alive, remembers the calling thread's current context; dropping it makes that
/// context current again (`cuCtxSetCurrent`, null included), as NCCL leaves a caller's
/// context: the library binds its devices' primary contexts on whatever thread calls it. Tied
/// to its thread (not `Send`).
#[derive(Debug)]
pub struct KeepContext {
    previous: sys::CUcontext,
    _thread: std::marker::PhantomData<*const ()>,
}

impl KeepContext {
    /// Remembers the calling thread's current context. [`Error::NoLibcuda`] /
    /// [`Error::CudaInit`] as [`device_count`]; [`Error::CurrentDevice`] if the driver
    /// refuses.
    pub fn new() -> Result<Self> {
        init()?;
        let previous =
            result::cu_ctx_get_current().map_err(|source| Error::CurrentDevice { source })?;
        Ok(Self {
            previous,
            _thread: std::marker::PhantomData,
        })
    }
}

impl Drop for KeepContext {
    fn drop(&mut self) {
        // SAFETY: the caller's context, current when this guard was made; the caller keeps it
        // alive across its call into the library (destroying a context made current on a
        // thread while a call runs on that thread is the caller's error, as with NCCL).
        if let Err(e) = unsafe { result::cu_ctx_set_current(self.previous) } {
            tracing::warn!(error = %e, "restoring the thread's current CUDA context failed");
        }
    }
}

/// A retained primary context of one device. Shared (`Arc`) by the [`Device`] and everything
/// made from it; released when the last of them goes.
#[derive(Debug)]
pub(crate) struct Context {
    ordinal: usize,
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    /// The ranks of this process on the device, and the releases held back for them
    /// (`release.rs`).
    pub(crate) sharing: Arc<release::Sharing>,
}

// SAFETY: a `CUcontext` is a driver handle that may be made current on, and used from, any
// thread; the driver synchronises its own state. `Context` only stores it.
unsafe impl Send for Context {}
// SAFETY: as above; no method mutates `Context`.
unsafe impl Sync for Context {}

impl Context {
    /// Makes this primary context current on the calling thread.
    pub(crate) fn bind(&self) -> std::result::Result<(), DriverError> {
        // SAFETY: `self.ctx` is retained for as long as `self` lives.
        unsafe { result::cu_ctx_set_current(self.ctx) }
    }

    /// The device ordinal.
    pub(crate) fn ordinal(&self) -> usize {
        self.ordinal
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `Device::open`; every owner that used this context
        // held an `Arc` of it, so none is left.
        if let Err(e) = unsafe { result::cu_device_primary_ctx_release(self.dev) } {
            tracing::warn!(ordinal = self.ordinal, error = %e, "releasing a CUDA primary context failed");
        }
    }
}

/// One CUDA device, through its primary context (the context the CUDA runtime, NCCL and
/// PyTorch use too, so pointers are shared with them).
#[derive(Debug)]
pub struct Device {
    ctx: Arc<Context>,
    name: String,
    pci_bus_id: String,
    /// The device's architecture (compute capability), which PTX must not exceed.
    arch: SmArch,
    /// Streaming multiprocessors (`CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`).
    multiprocessors: u32,
}

/// Smallest allocation made: a request for 0 bytes allocates this much (the driver rejects 0),
/// so an empty buffer still has a real, unique address. `len()` reports what was asked for.
const MIN_ALLOC: usize = 1;

impl Device {
    /// Opens device `ordinal` and retains its primary context.
    pub fn open(ordinal: usize) -> Result<Self> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(Error::NoSuchDevice {
                backend: BackendKind::Cuda,
                ordinal,
                count,
            });
        }
        let open_err = |source| Error::DeviceOpen { ordinal, source };
        // `ordinal < count <= c_int::MAX`, so the cast is lossless.
        let dev = result::cu_device_get(ordinal as c_int).map_err(open_err)?;
        let ctx = result::cu_device_primary_ctx_retain(dev).map_err(open_err)?;
        let ctx = Arc::new(Context {
            ordinal,
            dev,
            ctx,
            sharing: release::of(dev),
        });
        let name = result::cu_device_get_name(dev).map_err(open_err)?;
        let pci_bus_id = result::cu_device_get_pci_bus_id(dev).map_err(open_err)?;
        let cc = |attribute| {
            result::cu_device_get_attribute(dev, attribute)
                .map_err(open_err)
                .map(|v| u32::try_from(v).unwrap_or(0))
        };
        let arch = SmArch::of_device(
            cc(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            cc(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let multiprocessors =
            cc(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        Ok(Self {
            ctx,
            name,
            pci_bus_id,
            arch,
            multiprocessors,
        })
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal
    }

    /// Counts one rank of this process on the device until dropped (`release.rs`).
    pub fn enter_rank(&self) -> RankOnDevice {
        RankOnDevice::enter(self.ctx.sharing.clone(), self.ctx.clone())
    }

    /// The device's name, e.g. `NVIDIA H200`.
    pub fn name(&self) -> String {
        self.name.clone()
    }

    /// The device's architecture from its compute capability, e.g. `sm_90` for an H200.
    pub fn arch(&self) -> SmArch {
        self.arch
    }

    /// Its streaming multiprocessors (132 on an H200).
    pub fn multiprocessors(&self) -> u32 {
        self.multiprocessors
    }

    /// The device's PCI bus id, e.g. `0000:18:00.0` (names the physical GPU whatever
    /// `CUDA_VISIBLE_DEVICES` says).
    pub fn pci_bus_id(&self) -> String {
        self.pci_bus_id.clone()
    }

    /// The allocation of this device that `addr` lies in, as `(base, size, buffer id)`; the
    /// buffer id (`CU_POINTER_ATTRIBUTE_BUFFER_ID`) is unique for the life of the process, so a
    /// freed address reused by a new allocation gets a new id.
    pub fn allocation_of(&self, addr: u64) -> Result<(u64, usize, u64)> {
        let ordinal = self.ordinal();
        let err = |e: DriverError| Error::UnknownAddress {
            ordinal,
            addr,
            source: e.into(),
        };
        self.ctx.bind().map_err(err)?;
        let owner = result::cu_pointer_attribute(
            addr,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        )
        .map_err(err)?;
        if owner != ordinal as u64 {
            return Err(Error::UnknownAddress {
                ordinal,
                addr,
                source: BackendError::Invalid(format!("it is memory of device {owner}")),
            });
        }
        let (base, size) = result::cu_mem_get_address_range(addr).map_err(err)?;
        let id = result::cu_pointer_attribute(
            addr,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID,
        )
        .map_err(err)?;
        Ok((base, size, id))
    }

    /// Exports the allocation starting at `base` (`size` bytes, as [`Device::allocation_of`]
    /// reported) over IPC. Memory that is not from `cuMemAlloc` (a pool, `cuMemCreate`) cannot
    /// be exported: the driver says so and this returns the error.
    pub fn export_allocation(&self, base: u64, size: usize) -> Result<IpcMemHandle> {
        let ordinal = self.ordinal();
        let err = |e: DriverError| Error::IpcExport {
            ordinal,
            bytes: size,
            source: e.into(),
        };
        self.ctx.bind().map_err(err)?;
        // SAFETY: `base` is the start of a live allocation of this context as the driver just
        // reported; an allocation of another kind makes the call fail, it is not undefined.
        let cuda = unsafe { result::cu_ipc_get_mem_handle(base) }.map_err(err)?;
        Ok(IpcMemHandle {
            kind: mscclpp_shared::ipc::IPC_KIND_CUDA,
            device: u32::try_from(ordinal).unwrap_or(u32::MAX),
            owner_pid: std::process::id(),
            owner_fd: 0,
            token: 0,
            alloc_size: size as u64,
            offset: 0,
            size: size as u64,
            cuda,
        })
    }

    /// Allocates `bytes` of device memory with `cuMemAlloc_v2` (never a pool allocation, so it
    /// can be exported over IPC), zeroed. `0` bytes allocates 1 byte (see `MIN_ALLOC`) and
    /// reports a length of 0.
    pub fn alloc(&self, bytes: usize) -> Result<DeviceAlloc> {
        let ordinal = self.ordinal();
        let err = |e: DriverError| Error::Alloc {
            ordinal,
            bytes,
            source: e.into(),
        };
        self.ctx.bind().map_err(err)?;
        let size = bytes.max(MIN_ALLOC);
        let ptr = match self.ctx.sharing.reuse(size) {
            Some(ptr) => ptr,
            None => result::cu_mem_alloc(size).map_err(err)?,
        };
        // Owned from here on: an error below frees it.
        let alloc = DeviceAlloc::new(self.ctx.clone(), ptr, bytes, size);
        // SAFETY: `[ptr, ptr + size)` is the allocation just made. The memset runs on the legacy
        // default stream, which non-blocking streams do not wait for: wait for it here.
        unsafe {
            result::cu_memset_d8(ptr, 0, size).map_err(err)?;
            result::cu_stream_synchronize(std::ptr::null_mut()).map_err(err)?;
        }
        Ok(alloc)
    }

    /// Allocates `bytes` of pinned host memory mapped into every context
    /// (`CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE`), zeroed. `0` bytes as in
    /// [`Device::alloc`].
    pub fn alloc_host_mapped(&self, bytes: usize) -> Result<HostAlloc> {
        let ordinal = self.ordinal();
        let err = |e: DriverError| Error::HostAlloc {
            ordinal,
            bytes,
            source: e.into(),
        };
        self.ctx.bind().map_err(err)?;
        let size = bytes.max(MIN_ALLOC);
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        let host = result::cu_mem_host_alloc(size, flags).map_err(err)?;
        // SAFETY: `host` is a fresh, writable allocation of `size` bytes that nothing else uses.
        unsafe { std::ptr::write_bytes(host.cast::<u8>(), 0, size) };
        // Owned from here on (device address filled in below): an error frees it.
        let mut alloc = HostAlloc::new(self.ctx.clone(), host.cast(), 0, bytes);
        // SAFETY: `host` is a live DEVICEMAP allocation.
        let dev = unsafe { result::cu_mem_host_get_device_pointer(host) }.map_err(err)?;
        alloc.set_device_ptr(dev);
        Ok(alloc)
    }

    /// Maps the whole allocation behind `handle` (made by another process; the caller validated
    /// it) with `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`. [`PeerAlloc::base`] is the allocation's
    /// first byte: the caller adds `handle.offset`.
    ///
    /// The driver refuses a handle exported by this same process.
    pub fn open_ipc(&self, handle: &IpcMemHandle) -> Result<PeerAlloc> {
        let err = |e: DriverError| Error::IpcOpen {
            ordinal: self.ordinal(),
            owner_device: handle.device,
            owner_pid: handle.owner_pid,
            source: e.into(),
        };
        self.ctx.bind().map_err(err)?;
        let base = result::cu_ipc_open_mem_handle(&handle.cuda).map_err(err)?;
        Ok(PeerAlloc::new(self.ctx.clone(), base))
    }

    /// Lets kernels and copies of this device access `peer`'s memory
    /// (`cuCtxEnablePeerAccess`). Already enabled, or `peer` is this device: `Ok`.
    pub fn enable_peer_access(&self, peer: &Device) -> Result<()> {
        if self.ctx.dev == peer.ctx.dev {
            return Ok(());
        }
        let err = |source| Error::PeerAccess {
            ordinal: self.ordinal(),
            peer: peer.ordinal(),
            source,
        };
        self.ctx.bind().map_err(err)?;
        // SAFETY: `peer.ctx.ctx` is retained while `peer` lives.
        match unsafe { result::cu_ctx_enable_peer_access(peer.ctx.ctx) } {
            Ok(()) => Ok(()),
            Err(e) if e.code == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED as u32 => {
                Ok(())
            }
            Err(e) => Err(err(e)),
        }
    }

    /// Creates a stream (`CU_STREAM_NON_BLOCKING`: it does not wait for the legacy default
    /// stream).
    pub fn create_stream(&self) -> Result<Stream> {
        let err = |e: DriverError| self.stream_err("create stream", e);
        self.ctx.bind().map_err(err)?;
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        let raw = result::cu_stream_create(flags).map_err(err)?;
        Ok(Stream::new(self.ctx.clone(), raw))
    }

    /// A caller's stream `raw` (a `CUstream` / `cudaStream_t` as an integer) used without
    /// being owned: work queued on it runs in the caller's order, and dropping the returned
    /// [`Stream`] leaves the stream alone. `0`, `1` (`CU_STREAM_LEGACY`) and `2`
    /// (`CU_STREAM_PER_THREAD`) name the default streams of this device's primary context (made
    /// current before every call); any other stream must belong to that context
    /// (`cuStreamGetCtx`), else [`Error::StreamDevice`].
    ///
    /// # Safety
    /// `raw` is one of the default-stream handles or a live stream, and stays live as long as
    /// the returned [`Stream`].
    pub unsafe fn borrow_stream(&self, raw: u64) -> Result<Stream> {
        let err = |e: DriverError| self.stream_err("read a caller's stream's context", e);
        self.ctx.bind().map_err(err)?;
        let handle = raw as usize as sys::CUstream;
        if raw > 2 {
            // SAFETY: the caller vouches that `raw` is a live stream.
            let ctx = unsafe { result::cu_stream_get_ctx(handle) }.map_err(err)?;
            if ctx != self.ctx.ctx {
                return Err(Error::StreamDevice {
                    stream: raw,
                    ordinal: self.ordinal(),
                });
            }
        }
        Ok(Stream::borrowed(self.ctx.clone(), handle))
    }

    /// Creates an event with timing enabled (`CU_EVENT_DEFAULT`).
    pub fn create_event(&self) -> Result<Event> {
        self.event_with(sys::CUevent_flags::CU_EVENT_DEFAULT as u32)
    }

    /// A new event without timing (`CU_EVENT_DISABLE_TIMING`: cheaper to record and wait on),
    /// for ordering only.
    pub fn create_marker(&self) -> Result<Event> {
        self.event_with(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
    }

    fn event_with(&self, flags: u32) -> Result<Event> {
        let err = |e: DriverError| self.stream_err("create event", e);
        self.ctx.bind().map_err(err)?;
        let raw = result::cu_event_create(flags).map_err(err)?;
        Ok(Event::new(self.ctx.clone(), raw))
    }

    /// Loads (JIT-compiles) PTX text. PTX built for a newer architecture than the device's
    /// is [`Error::PtxTarget`]; other failures carry the JIT's error log.
    pub fn load_ptx(&self, ptx: &str) -> Result<Module> {
        Module::load_ptx(self.ctx.clone(), self.arch, ptx, "PTX text")
    }

    /// Loads a module file: `*.ptx` as PTX text, anything else as a cubin or fatbin image.
    pub fn load_module_file(&self, path: &Path) -> Result<Module> {
        let bytes = std::fs::read(path).map_err(|source| Error::ReadFile {
            path: path.to_path_buf(),
            source,
        })?;
        let what = path.display().to_string();
        if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("ptx"))
        {
            match String::from_utf8(bytes) {
                Ok(text) => Module::load_ptx(self.ctx.clone(), self.arch, &text, &what),
                Err(_) => Err(Error::ModuleLoad {
                    what,
                    ordinal: self.ordinal(),
                    source: BackendError::Invalid("a .ptx file that is not UTF-8 text".to_string()),
                }),
            }
        } else {
            Module::load_image(self.ctx.clone(), &bytes, &what)
        }
    }

    /// Waits for all work of this device's primary context (`cuCtxSynchronize`).
    pub fn synchronize(&self) -> Result<()> {
        let err = |e: DriverError| self.stream_err("synchronize device", e);
        self.ctx.bind().map_err(err)?;
        result::cu_ctx_synchronize().map_err(err)
    }

    /// The NUMA node of the device's PCI function, from
    /// `/sys/bus/pci/devices/<bus id>/numa_node`; `None` if unknown (`-1`) or unreadable.
    pub fn numa_node(&self) -> Option<u32> {
        // sysfs names functions `dddd:bb:dd.f` in lower case; the driver may print the domain
        // with more digits or in upper case.
        let id = self.pci_bus_id.to_ascii_lowercase();
        let (domain, rest) = id.split_once(':')?;
        let domain = u32::from_str_radix(domain, 16).ok()?;
        let path = format!("/sys/bus/pci/devices/{domain:04x}:{rest}/numa_node");
        let text = std::fs::read_to_string(path).ok()?;
        let node: i64 = text.trim().parse().ok()?;
        u32::try_from(node).ok()
    }

    /// Makes this device's primary context current on the calling thread.
    pub fn bind_to_thread(&self) -> Result<()> {
        self.ctx.bind().map_err(|source| Error::DeviceOpen {
            ordinal: self.ordinal(),
            source,
        })
    }

    /// Copies `src` to device address `dst` and waits until the data is in device memory.
    ///
    /// The caller passes a `dst` range inside a live device allocation (the layer above checks
    /// it); a wrong address is reported by the driver or lands in device memory, never in this
    /// process's host memory.
    pub fn copy_htod_sync(&self, dst: u64, src: &[u8]) -> Result<()> {
        let err = |e: DriverError| self.copy_err("htod", src.len(), e);
        self.ctx.bind().map_err(err)?;
        // SAFETY: see the doc above: `dst` is a checked device range. A copy from pageable
        // memory may return before its DMA is done, and non-blocking streams do not wait for
        // the legacy default stream: wait for it here.
        unsafe {
            result::cu_memcpy_htod(dst, src).map_err(err)?;
            result::cu_stream_synchronize(std::ptr::null_mut()).map_err(err)
        }
    }

    /// Copies `dst.len()` bytes from device address `src` into `dst`; returns when done. Work
    /// queued on (non-blocking) streams is not waited for: synchronise them first.
    pub fn copy_dtoh_sync(&self, dst: &mut [u8], src: u64) -> Result<()> {
        let bytes = dst.len();
        let err = |e: DriverError| self.copy_err("dtoh", bytes, e);
        self.ctx.bind().map_err(err)?;
        // SAFETY: `src` is a checked device range (as in `copy_htod_sync`); the driver writes
        // only `dst.len()` bytes into `dst`.
        unsafe { result::cu_memcpy_dtoh(dst, src) }.map_err(err)
    }

    fn stream_err(&self, op: &'static str, e: DriverError) -> Error {
        Error::Stream {
            op,
            ordinal: self.ordinal(),
            source: e.into(),
        }
    }

    fn copy_err(&self, direction: &'static str, bytes: usize, e: DriverError) -> Error {
        Error::Copy {
            direction,
            bytes,
            ordinal: self.ordinal(),
            source: e.into(),
        }
    }
}
