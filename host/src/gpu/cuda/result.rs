//! Thin, `Result`-returning wrappers over `cudarc::driver::sys`: one function per driver call,
//! named after it, turning the `CUresult` into a [`DriverError`] that carries the call's name and
//! the code's name (from `cuGetErrorName`). No ownership here; the RAII owners live one layer up.
//!
//! **Precondition of every function in this file**: libcuda is loaded and `cuInit` succeeded,
//! i.e. [`super::init`] returned `Ok` earlier in this process. `cudarc` loads each symbol on
//! first use and panics if the library is missing; the owners in the parent module can only be
//! built after `init`, so calling these functions through them never reaches that panic. The two
//! entry points newer than CUDA 12.0 that we use (`cuFuncGetParamInfo`, 12.4, and
//! `cuEventElapsedTime_v2`, 12.8) are looked up without panicking first ([`has_symbol`]).
//!
//! Functions that only take plain values and write to out-parameters they own are safe; those
//! that take a raw handle or address the driver will dereference are `unsafe`, with the contract
//! spelled out in `# Safety`.

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::mem::MaybeUninit;
use std::sync::OnceLock;

use cudarc::driver::sys;

use crate::error::DriverError;

/// `Result` of one driver call.
pub(crate) type DriverResult<T> = std::result::Result<T, DriverError>;

/// Turns the `CUresult` of `call` into a `Result`.
pub(crate) fn check(call: &'static str, code: sys::CUresult) -> DriverResult<()> {
    if code == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(DriverError {
            call,
            code: code as u32,
            name: error_name(code),
        })
    }
}

/// The `CUresult`'s name from `cuGetErrorName` (e.g. `CUDA_ERROR_INVALID_VALUE`); cudarc's enum
/// name if the driver does not know the code.
pub(crate) fn error_name(code: sys::CUresult) -> String {
    let mut s: *const c_char = std::ptr::null();
    // SAFETY: `s` is a valid out-pointer; the driver sets it to a static NUL-terminated string.
    let r = unsafe { sys::cuGetErrorName(code, &mut s) };
    if r == sys::CUresult::CUDA_SUCCESS && !s.is_null() {
        // SAFETY: on success `s` points to a static, NUL-terminated string owned by the driver.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    } else {
        format!("{code:?}")
    }
}

/// Whether the loaded libcuda exports `name` (checked without cudarc's panicking loader).
pub(crate) fn has_symbol(name: &str) -> bool {
    // SAFETY: per this file's precondition the library is present, so `culib` does not panic;
    // looking a symbol up runs no code of the library.
    unsafe { sys::culib().get::<*const c_void>(name).is_ok() }
}

// ---- initialisation and devices ----

/// `cuInit(0)`.
pub(crate) fn cu_init() -> DriverResult<()> {
    // SAFETY: no pointers; the library is present (caller checked `is_culib_present`).
    check("cuInit", unsafe { sys::cuInit(0) })
}

/// `cuDeviceGetCount`.
pub(crate) fn cu_device_get_count() -> DriverResult<usize> {
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out-pointer.
    check("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut n) })?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// `cuDeviceGet`.
pub(crate) fn cu_device_get(ordinal: c_int) -> DriverResult<sys::CUdevice> {
    let mut dev: sys::CUdevice = 0;
    // SAFETY: `dev` is a valid out-pointer.
    check("cuDeviceGet", unsafe {
        sys::cuDeviceGet(&mut dev, ordinal)
    })?;
    Ok(dev)
}

/// `cuDeviceGetName`.
pub(crate) fn cu_device_get_name(dev: sys::CUdevice) -> DriverResult<String> {
    let mut buf = [0 as c_char; 256];
    // SAFETY: the driver writes at most `buf.len()` bytes, NUL-terminated, into `buf`.
    check("cuDeviceGetName", unsafe {
        sys::cuDeviceGetName(buf.as_mut_ptr(), buf.len() as c_int, dev)
    })?;
    Ok(c_buf_to_string(&buf))
}

/// `cuDeviceGetPCIBusId` (e.g. `0000:1B:00.0`).
pub(crate) fn cu_device_get_pci_bus_id(dev: sys::CUdevice) -> DriverResult<String> {
    let mut buf = [0 as c_char; 64];
    // SAFETY: the driver writes at most `buf.len()` bytes, NUL-terminated, into `buf`.
    check("cuDeviceGetPCIBusId", unsafe {
        sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as c_int, dev)
    })?;
    Ok(c_buf_to_string(&buf))
}

/// `cuDeviceGetAttribute`.
pub(crate) fn cu_device_get_attribute(
    dev: sys::CUdevice,
    attribute: sys::CUdevice_attribute,
) -> DriverResult<i32> {
    let mut v: c_int = 0;
    // SAFETY: `v` is a valid out-pointer; `dev` came from `cuDeviceGet`.
    check("cuDeviceGetAttribute", unsafe {
        sys::cuDeviceGetAttribute(&mut v, attribute, dev)
    })?;
    Ok(v)
}

fn c_buf_to_string(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// `cuDevicePrimaryCtxRetain`.
pub(crate) fn cu_device_primary_ctx_retain(dev: sys::CUdevice) -> DriverResult<sys::CUcontext> {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: `ctx` is a valid out-pointer.
    check("cuDevicePrimaryCtxRetain", unsafe {
        sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
    })?;
    Ok(ctx)
}

/// `cuDevicePrimaryCtxRelease_v2`.
///
/// # Safety
/// Balances exactly one successful [`cu_device_primary_ctx_retain`] of `dev`; nothing may use
/// the context through that reference afterwards.
pub(crate) unsafe fn cu_device_primary_ctx_release(dev: sys::CUdevice) -> DriverResult<()> {
    // SAFETY: forwarded contract.
    check("cuDevicePrimaryCtxRelease_v2", unsafe {
        sys::cuDevicePrimaryCtxRelease_v2(dev)
    })
}

/// `cuCtxSetCurrent`.
///
/// # Safety
/// `ctx` must be a live context (a retained primary context).
pub(crate) unsafe fn cu_ctx_set_current(ctx: sys::CUcontext) -> DriverResult<()> {
    // SAFETY: forwarded contract.
    check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) })
}

/// `cuCtxGetCurrent`: the calling thread's current context (null when it has none).
pub(crate) fn cu_ctx_get_current() -> DriverResult<sys::CUcontext> {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: `ctx` is a valid out-pointer.
    check("cuCtxGetCurrent", unsafe { sys::cuCtxGetCurrent(&mut ctx) })?;
    Ok(ctx)
}

/// `cuCtxGetDevice`: the device of the calling thread's current context (an error if there is
/// none).
pub(crate) fn cu_ctx_get_device() -> DriverResult<sys::CUdevice> {
    let mut dev: sys::CUdevice = 0;
    // SAFETY: `dev` is a valid out-pointer.
    check("cuCtxGetDevice", unsafe { sys::cuCtxGetDevice(&mut dev) })?;
    Ok(dev)
}

/// `cuThreadExchangeStreamCaptureMode`: sets the calling thread's stream-capture mode to
/// `mode` and returns the one it had.
pub(crate) fn cu_thread_exchange_stream_capture_mode(
    mode: sys::CUstreamCaptureMode,
) -> DriverResult<sys::CUstreamCaptureMode> {
    let mut m = mode;
    // SAFETY: `m` is a valid in/out pointer; the call only touches this thread's state.
    check("cuThreadExchangeStreamCaptureMode", unsafe {
        sys::cuThreadExchangeStreamCaptureMode(&mut m)
    })?;
    Ok(m)
}

/// `cuCtxSynchronize` (of the calling thread's current context).
pub(crate) fn cu_ctx_synchronize() -> DriverResult<()> {
    // SAFETY: no pointers; acts on the current context (an error if there is none).
    check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
}

/// `cuCtxEnablePeerAccess(peer, 0)` from the current context.
///
/// # Safety
/// `peer` must be a live context.
pub(crate) unsafe fn cu_ctx_enable_peer_access(peer: sys::CUcontext) -> DriverResult<()> {
    // SAFETY: forwarded contract.
    check("cuCtxEnablePeerAccess", unsafe {
        sys::cuCtxEnablePeerAccess(peer, 0)
    })
}

// ---- memory ----

/// `cuMemAlloc_v2` in the current context.
pub(crate) fn cu_mem_alloc(bytes: usize) -> DriverResult<sys::CUdeviceptr> {
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: `p` is a valid out-pointer.
    check("cuMemAlloc_v2", unsafe {
        sys::cuMemAlloc_v2(&mut p, bytes)
    })?;
    Ok(p)
}

/// `cuMemFree_v2`.
///
/// # Safety
/// `ptr` came from [`cu_mem_alloc`], is freed once, and no queued or future work uses it.
pub(crate) unsafe fn cu_mem_free(ptr: sys::CUdeviceptr) -> DriverResult<()> {
    // SAFETY: forwarded contract.
    check("cuMemFree_v2", unsafe { sys::cuMemFree_v2(ptr) })
}

/// `cuMemGetAddressRange_v2`: the allocation (base, size) that `ptr` lies in, in the current
/// context. Any address may be asked about; one that is not device memory is an error.
pub(crate) fn cu_mem_get_address_range(ptr: sys::CUdeviceptr) -> DriverResult<(u64, usize)> {
    let (mut base, mut size): (sys::CUdeviceptr, usize) = (0, 0);
    // SAFETY: both out-pointers are valid; the driver only reads its own tables for `ptr`.
    check("cuMemGetAddressRange_v2", unsafe {
        sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr)
    })?;
    Ok((base, size))
}

/// `cuPointerGetAttribute` of a 64-bit attribute (`CU_POINTER_ATTRIBUTE_BUFFER_ID`) or a
/// 32-bit one (`CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`, zero-extended).
pub(crate) fn cu_pointer_attribute(
    ptr: sys::CUdeviceptr,
    attribute: sys::CUpointer_attribute,
) -> DriverResult<u64> {
    // Eight zeroed bytes: a 32-bit attribute fills the low half (little-endian).
    let mut v: u64 = 0;
    // SAFETY: `v` is 8 writable bytes, enough for either attribute width.
    check("cuPointerGetAttribute", unsafe {
        sys::cuPointerGetAttribute((&mut v as *mut u64).cast(), attribute, ptr)
    })?;
    Ok(v)
}

/// `cuMemsetD8_v2` (on the legacy default stream; asynchronous to the host).
///
/// # Safety
/// `[ptr, ptr + bytes)` must be device memory this process may write.
pub(crate) unsafe fn cu_memset_d8(
    ptr: sys::CUdeviceptr,
    value: u8,
    bytes: usize,
) -> DriverResult<()> {
    // SAFETY: forwarded contract.
    check("cuMemsetD8_v2", unsafe {
        sys::cuMemsetD8_v2(ptr, value, bytes)
    })
}

/// `cuMemHostAlloc`.
pub(crate) fn cu_mem_host_alloc(bytes: usize, flags: c_uint) -> DriverResult<*mut c_void> {
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: `p` is a valid out-pointer.
    check("cuMemHostAlloc", unsafe {
        sys::cuMemHostAlloc(&mut p, bytes, flags)
    })?;
    Ok(p)
}

/// `cuMemFreeHost`.
///
/// # Safety
/// `p` came from [`cu_mem_host_alloc`], is freed once, and nothing (host or device) uses it
/// afterwards.
pub(crate) unsafe fn cu_mem_free_host(p: *mut c_void) -> DriverResult<()> {
    // SAFETY: forwarded contract.
    check("cuMemFreeHost", unsafe { sys::cuMemFreeHost(p) })
}

/// `cuMemHostGetDevicePointer_v2`.
///
/// # Safety
/// `p` must be a live allocation of [`cu_mem_host_alloc`] made with `CU_MEMHOSTALLOC_DEVICEMAP`.
pub(crate) unsafe fn cu_mem_host_get_device_pointer(
    p: *mut c_void,
) -> DriverResult<sys::CUdeviceptr> {
    let mut d: sys::CUdeviceptr = 0;
    // SAFETY: forwarded contract; `d` is a valid out-pointer.
    check("cuMemHostGetDevicePointer_v2", unsafe {
        sys::cuMemHostGetDevicePointer_v2(&mut d, p, 0)
    })?;
    Ok(d)
}

/// `cuMemcpyHtoD_v2` (synchronous to the host for the source; legacy default stream).
///
/// # Safety
/// `[dst, dst + src.len())` must be device memory this process may write.
pub(crate) unsafe fn cu_memcpy_htod(dst: sys::CUdeviceptr, src: &[u8]) -> DriverResult<()> {
    // SAFETY: forwarded contract; `src` is readable for its length.
    check("cuMemcpyHtoD_v2", unsafe {
        sys::cuMemcpyHtoD_v2(dst, src.as_ptr().cast(), src.len())
    })
}

/// `cuMemcpyDtoH_v2` (returns when the copy is done; legacy default stream).
///
/// # Safety
/// `[src, src + dst.len())` must be device memory this process may read.
pub(crate) unsafe fn cu_memcpy_dtoh(dst: &mut [u8], src: sys::CUdeviceptr) -> DriverResult<()> {
    // SAFETY: forwarded contract; `dst` is writable for its length.
    check("cuMemcpyDtoH_v2", unsafe {
        sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src, dst.len())
    })
}

/// `cuMemcpyAsync` (unified addressing: any two device, peer-mapped or host-mapped addresses).
///
/// # Safety
/// `stream` is live; `dst`/`src` are valid for `bytes` until the copy completes and do not
/// overlap.
pub(crate) unsafe fn cu_memcpy_async(
    dst: sys::CUdeviceptr,
    src: sys::CUdeviceptr,
    bytes: usize,
    stream: sys::CUstream,
) -> DriverResult<()> {
    // SAFETY: forwarded contract.
    check("cuMemcpyAsync", unsafe {
        sys::cuMemcpyAsync(dst, src, bytes, stream)
    })
}

/// `cuStreamWriteValue64_v2` (default flags: earlier work of the stream is visible first).
///
/// # Safety
/// `addr` is a device-accessible, 8-byte aligned address valid until the write runs.
pub(crate) unsafe fn cu_stream_write_value64(
    stream: sys::CUstream,
    addr: sys::CUdeviceptr,
    value: u64,
) -> DriverResult<()> {
    // SAFETY: forwarded contract.
    check("cuStreamWriteValue64_v2", unsafe {
        sys::cuStreamWriteValue64_v2(stream, addr, value, 0)
    })
}

/// `cuStreamWaitValue64_v2` with `CU_STREAM_WAIT_VALUE_GEQ`: later work on `stream` waits
/// until the u64 at `addr` is at least `value`.
///
/// # Safety
/// `addr` is a device-accessible, 8-byte aligned address valid until the wait ends.
pub(crate) unsafe fn cu_stream_wait_value64_geq(
    stream: sys::CUstream,
    addr: sys::CUdeviceptr,
    value: u64,
) -> DriverResult<()> {
    let geq = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
    // SAFETY: forwarded contract.
    check("cuStreamWaitValue64_v2", unsafe {
        sys::cuStreamWaitValue64_v2(stream, addr, value, geq)
    })
}

/// `cuMemcpyHtoDAsync_v2` from pageable memory (staged by the driver before it returns).
///
/// # Safety
/// `dst` is valid for `src.len()` bytes until the copy runs.
pub(crate) unsafe fn cu_memcpy_htod_async(
    dst: sys::CUdeviceptr,
    src: &[u8],
    stream: sys::CUstream,
) -> DriverResult<()> {
    // SAFETY: forwarded contract; `src` is readable for its length during the call, and the
    // driver copies pageable sources to staging memory before returning.
    check("cuMemcpyHtoDAsync_v2", unsafe {
        sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr().cast(), src.len(), stream)
    })
}

/// `cuStreamQuery`: `Ok(true)` when all work is done, `Ok(false)` while some is pending.
///
/// # Safety
/// `stream` is live.
pub(crate) unsafe fn cu_stream_query(stream: sys::CUstream) -> DriverResult<bool> {
    // SAFETY: forwarded contract.
    match unsafe { sys::cuStreamQuery(stream) } {
        sys::CUresult::CUDA_SUCCESS => Ok(true),
        sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        code => check("cuStreamQuery", code).map(|_| false),
    }
}

/// `cuFuncLoad` (CUDA 12.4+): loads a function's code now instead of at its first launch.
///
/// # Safety
/// `f` is a live function handle.
pub(crate) unsafe fn cu_func_load(f: sys::CUfunction) -> DriverResult<()> {
    // SAFETY: forwarded contract.
    check("cuFuncLoad", unsafe { sys::cuFuncLoad(f) })
}

/// `cuModuleGetLoadingMode` (CUDA 11.7+): whether modules load their functions lazily (at
/// first use, the default from CUDA 12.2; `CUDA_MODULE_LOADING=EAGER` turns it off).
pub(crate) fn cu_module_loading_is_lazy() -> DriverResult<bool> {
    let mut mode = sys::CUmoduleLoadingMode::CU_MODULE_EAGER_LOADING;
    // SAFETY: `mode` is a valid out-pointer for the call.
    check("cuModuleGetLoadingMode", unsafe {
        sys::cuModuleGetLoadingMode(&mut mode)
    })?;
    Ok(mode == sys::CUmoduleLoadingMode::CU_MODULE_LAZY_LOADING)
}

/// Every function of `module` (`cuModuleGetFunctionCount` + `cuModuleEnumerateFunctions`,
/// CUDA 12.4+).
///
/// # Safety
/// `module` is live.
pub(crate) unsafe fn cu_module_functions(
    module: sys::CUmodule,
) -> DriverResult<Vec<sys::CUfunction>> {
    let mut count: std::ffi::c_uint = 0;
    // SAFETY: forwarded contract; `count` is a valid out-pointer.
    check("cuModuleGetFunctionCount", unsafe {
        sys::cuModuleGetFunctionCount(&mut count, module)
    })?;
    let mut functions = vec![std::ptr::null_mut(); count as usize];
    // SAFETY: forwarded contract; `functions` holds `count` writable handles.
    check("cuModuleEnumerateFunctions", unsafe {
        sys::cuModuleEnumerateFunctions(functions.as_mut_ptr(), count, module)
    })?;
    Ok(functions)
}

// ---- IPC ----

/// `cuIpcGetMemHandle`.
///
/// # Safety
/// `ptr` must be a live allocation of [`cu_mem_alloc`].
pub(crate) unsafe fn cu_ipc_get_mem_handle(ptr: sys::CUdeviceptr) -> DriverResult<[u8; 64]> {
    let mut h = MaybeUninit::<sys::CUipcMemHandle>::zeroed();
    // SAFETY: forwarded contract; `h` is a valid out-pointer.
    check("cuIpcGetMemHandle", unsafe {
        sys::cuIpcGetMemHandle(h.as_mut_ptr(), ptr)
    })?;
    // SAFETY: zero-initialised and then written by the driver; a byte array is valid for any bits.
    let h = unsafe { h.assume_init() };
    Ok(h.reserved.map(|c| c as u8))
}

/// `cuIpcOpenMemHandle_v2` with `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`, in the current context.
///
/// The driver checks the handle: garbage gives an error, not a mapping.
pub(crate) fn cu_ipc_open_mem_handle(handle: &[u8; 64]) -> DriverResult<sys::CUdeviceptr> {
    let h = sys::CUipcMemHandle {
        reserved: handle.map(|b| b as c_char),
    };
    let mut p: sys::CUdeviceptr = 0;
    let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as c_uint;
    // SAFETY: `p` is a valid out-pointer; the handle is passed by value.
    check("cuIpcOpenMemHandle_v2", unsafe {
        sys::cuIpcOpenMemHandle_v2(&mut p, h, flags)
    })?;
    Ok(p)
}

/// `cuIpcCloseMemHandle`.
///
/// # Safety
/// `ptr` came from [`cu_ipc_open_mem_handle`], is closed once, and no queued or future work
/// uses the mapping.
pub(crate) unsafe fn cu_ipc_close_mem_handle(ptr: sys::CUdeviceptr) -> DriverResult<()> {
    // SAFETY: forwarded contract.
    check("cuIpcCloseMemHandle", unsafe {
        sys::cuIpcCloseMemHandle(ptr)
    })
}

// ---- streams and events ----

/// `cuStreamCreate` in the current context.
pub(crate) fn cu_stream_create(flags: c_uint) -> DriverResult<sys::CUstream> {
    let mut s: sys::CUstream = std::ptr::null_mut();
    // SAFETY: `s` is a valid out-pointer.
    check("cuStreamCreate", unsafe {
        sys::cuStreamCreate(&mut s, flags)
    })?;
    Ok(s)
}

/// `cuStreamGetCtx`: the context a stream belongs to.
///
/// # Safety
/// `s` is a live stream (not one of the default-stream handles, which name the current
/// context's).
pub(crate) unsafe fn cu_stream_get_ctx(s: sys::CUstream) -> DriverResult<sys::CUcontext> {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: forwarded contract; `ctx` is a valid out-pointer.
    check("cuStreamGetCtx", unsafe {
        sys::cuStreamGetCtx(s, &mut ctx)
    })?;
    Ok(ctx)
}

/// `cuStreamDestroy_v2`.
///
/// # Safety
/// `s` is a live stream, destroyed once, not used afterwards.
pub(crate) unsafe fn cu_stream_destroy(s: sys::CUstream) -> DriverResult<()> {
    // SAFETY: forwarded contract.
    check("cuStreamDestroy_v2", unsafe { sys::cuStreamDestroy_v2(s) })
}

/// `cuStreamSynchronize` (null = the legacy default stream).
///
/// # Safety
/// `s` is a live stream or null.
pub(crate) unsafe fn cu_stream_synchronize(s: sys::CUstream) -> DriverResult<()> {
    // SAFETY: forwarded contract.
    check("cuStreamSynchronize", unsafe {
        sys::cuStreamSynchronize(s)
    })
}

/// `cuStreamWaitEvent(s, e, 0)`.
///
/// # Safety
/// `s` and `e` are live.
pub(crate) unsafe fn cu_stream_wait_event(s: sys::CUstream, e: sys::CUevent) -> DriverResult<()> {
    // SAFETY: forwarded contract.
    check("cuStreamWaitEvent", unsafe {
        sys::cuStreamWaitEvent(s, e, 0)
    })
}

/// `cuEventCreate` in the current context.
pub(crate) fn cu_event_create(flags: c_uint) -> DriverResult<sys::CUevent> {
    let mut e: sys::CUevent = std::ptr::null_mut();
    // SAFETY: `e` is a valid out-pointer.
    check("cuEventCreate", unsafe {
        sys::cuEventCreate(&mut e, flags)
    })?;
    Ok(e)
}

/// `cuEventQuery`: whether the work before the event's last record is done
/// (`CUDA_ERROR_NOT_READY`: not yet).
///
/// # Safety
/// `e` is a live event.
pub(crate) unsafe fn cu_event_query(e: sys::CUevent) -> DriverResult<bool> {
    // SAFETY: forwarded contract.
    match unsafe { sys::cuEventQuery(e) } {
        sys::CUresult::CUDA_SUCCESS => Ok(true),
        sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        other => check("cuEventQuery", other).map(|()| false),
    }
}

/// `cuEventDestroy_v2`.
///
/// # Safety
/// `e` is a live event, destroyed once, not used afterwards.
pub(crate) unsafe fn cu_event_destroy(e: sys::CUevent) -> DriverResult<()> {
    // SAFETY: forwarded contract.
    check("cuEventDestroy_v2", unsafe { sys::cuEventDestroy_v2(e) })
}

/// `cuEventRecord`.
///
/// # Safety
/// `e` and `s` are live and belong to the same context.
pub(crate) unsafe fn cu_event_record(e: sys::CUevent, s: sys::CUstream) -> DriverResult<()> {
    // SAFETY: forwarded contract.
    check("cuEventRecord", unsafe { sys::cuEventRecord(e, s) })
}

/// `cuEventSynchronize`.
///
/// # Safety
/// `e` is live.
pub(crate) unsafe fn cu_event_synchronize(e: sys::CUevent) -> DriverResult<()> {
    // SAFETY: forwarded contract.
    check("cuEventSynchronize", unsafe { sys::cuEventSynchronize(e) })
}

type ElapsedFn = unsafe extern "C" fn(*mut f32, sys::CUevent, sys::CUevent) -> sys::CUresult;

/// `cuEventElapsedTime_v2` where the driver has it (12.8+), else the original
/// `cuEventElapsedTime` (which cudarc's CUDA 13 bindings do not declare, so it is looked up here).
///
/// # Safety
/// `start` and `end` are live events.
pub(crate) unsafe fn cu_event_elapsed_time(
    start: sys::CUevent,
    end: sys::CUevent,
) -> DriverResult<f32> {
    static F: OnceLock<Option<(&'static str, ElapsedFn)>> = OnceLock::new();
    let f = F.get_or_init(|| {
        for name in ["cuEventElapsedTime_v2", "cuEventElapsedTime"] {
            // SAFETY: the library is loaded (file precondition); both symbols have the C
            // signature `CUresult (float*, CUevent, CUevent)`.
            if let Ok(s) = unsafe { sys::culib().get::<ElapsedFn>(name) } {
                return Some((name, *s));
            }
        }
        None
    });
    let Some((name, f)) = *f else {
        return Err(DriverError {
            call: "cuEventElapsedTime",
            code: sys::CUresult::CUDA_ERROR_NOT_FOUND as u32,
            name: "symbol not exported by libcuda".to_string(),
        });
    };
    let mut ms = 0f32;
    // SAFETY: forwarded contract; `ms` is a valid out-pointer; `f` lives as long as the library,
    // which cudarc keeps loaded for the whole process.
    check(name, unsafe { f(&mut ms, start, end) })?;
    Ok(ms)
}

// ---- graphs ----

/// `cuStreamBeginCapture_v2`.
///
/// # Safety
/// `s` is a live stream of the current context that is not already capturing.
pub(crate) unsafe fn cu_stream_begin_capture(
    s: sys::CUstream,
    mode: sys::CUstreamCaptureMode,
) -> DriverResult<()> {
    // SAFETY: forwarded contract.
    check("cuStreamBeginCapture_v2", unsafe {
        sys::cuStreamBeginCapture_v2(s, mode)
    })
}

/// `cuStreamIsCapturing`: whether `s` is capturing (active; an invalidated capture counts too:
/// its work is refused either way).
///
/// # Safety
/// `s` is a live stream (or a default-stream handle) of the current context.
pub(crate) unsafe fn cu_stream_is_capturing(s: sys::CUstream) -> DriverResult<bool> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: forwarded contract; `status` is a valid out-pointer.
    check("cuStreamIsCapturing", unsafe {
        sys::cuStreamIsCapturing(s, &mut status)
    })?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// `cuStreamEndCapture`: the captured graph. On failure (e.g. the capture was invalidated by a
/// call the capture mode forbids) the driver returns no graph and the stream is no longer
/// capturing.
///
/// # Safety
/// `s` is a live stream that is capturing.
pub(crate) unsafe fn cu_stream_end_capture(s: sys::CUstream) -> DriverResult<sys::CUgraph> {
    let mut g: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: forwarded contract; `g` is a valid out-pointer.
    check("cuStreamEndCapture", unsafe {
        sys::cuStreamEndCapture(s, &mut g)
    })?;
    Ok(g)
}

/// `cuGraphInstantiateWithFlags(.., 0)` in the current context.
///
/// # Safety
/// `g` is a live graph.
pub(crate) unsafe fn cu_graph_instantiate(g: sys::CUgraph) -> DriverResult<sys::CUgraphExec> {
    let mut e: sys::CUgraphExec = std::ptr::null_mut();
    // SAFETY: forwarded contract; `e` is a valid out-pointer.
    check("cuGraphInstantiateWithFlags", unsafe {
        sys::cuGraphInstantiateWithFlags(&mut e, g, 0)
    })?;
    Ok(e)
}

/// `cuGraphLaunch`.
///
/// # Safety
/// `e` and `s` are live and of the current context; every address the graph's nodes use is
/// valid until the launch completes.
pub(crate) unsafe fn cu_graph_launch(e: sys::CUgraphExec, s: sys::CUstream) -> DriverResult<()> {
    // SAFETY: forwarded contract.
    check("cuGraphLaunch", unsafe { sys::cuGraphLaunch(e, s) })
}

/// `cuGraphExecDestroy`.
///
/// # Safety
/// `e` is a live executable graph, destroyed once, not launched afterwards.
pub(crate) unsafe fn cu_graph_exec_destroy(e: sys::CUgraphExec) -> DriverResult<()> {
    // SAFETY: forwarded contract.
    check("cuGraphExecDestroy", unsafe { sys::cuGraphExecDestroy(e) })
}

/// `cuGraphDestroy`.
///
/// # Safety
/// `g` is a live graph, destroyed once, not used afterwards.
pub(crate) unsafe fn cu_graph_destroy(g: sys::CUgraph) -> DriverResult<()> {
    // SAFETY: forwarded contract.
    check("cuGraphDestroy", unsafe { sys::cuGraphDestroy(g) })
}

// ---- modules and launches ----

/// `cuModuleLoadDataEx` with an error-log buffer. Returns the module, or the error together
/// with the JIT's error log (empty if it wrote none).
///
/// # Safety
/// `image` points to a complete PTX text (NUL-terminated), cubin or fatbin image, readable for
/// the duration of the call.
pub(crate) unsafe fn cu_module_load_data_ex(
    image: *const c_void,
) -> std::result::Result<sys::CUmodule, (DriverError, String)> {
    const LOG: usize = 16 * 1024;
    let mut log = vec![0u8; LOG];
    let mut options = [
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
    ];
    // The size option's value is passed in the pointer-sized slot itself (driver convention).
    let mut values: [*mut c_void; 2] = [log.as_mut_ptr().cast(), LOG as *mut c_void];
    let mut m: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: forwarded contract for `image`; `options`/`values` have 2 entries each; the
    // driver writes at most `LOG` bytes (NUL-terminated) into `log`, which outlives the call.
    let r = unsafe {
        sys::cuModuleLoadDataEx(
            &mut m,
            image,
            options.len() as c_uint,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
        )
    };
    match check("cuModuleLoadDataEx", r) {
        Ok(()) => Ok(m),
        Err(e) => {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            Err((e, String::from_utf8_lossy(&log[..end]).trim().to_string()))
        }
    }
}

/// `cuModuleUnload`.
///
/// # Safety
/// `m` is a live module, unloaded once; no function of it is used (or running) afterwards.
pub(crate) unsafe fn cu_module_unload(m: sys::CUmodule) -> DriverResult<()> {
    // SAFETY: forwarded contract.
    check("cuModuleUnload", unsafe { sys::cuModuleUnload(m) })
}

/// `cuModuleGetFunction`.
///
/// # Safety
/// `m` is a live module.
pub(crate) unsafe fn cu_module_get_function(
    m: sys::CUmodule,
    name: &CString,
) -> DriverResult<sys::CUfunction> {
    let mut f: sys::CUfunction = std::ptr::null_mut();
    // SAFETY: forwarded contract; `name` is NUL-terminated; `f` is a valid out-pointer.
    check("cuModuleGetFunction", unsafe {
        sys::cuModuleGetFunction(&mut f, m, name.as_ptr())
    })?;
    Ok(f)
}

/// `cuFuncGetParamInfo`: (offset, size) of parameter `index`. The caller checks availability
/// first ([`has_symbol`]); `CUDA_ERROR_INVALID_VALUE` means `index` is past the last parameter.
///
/// # Safety
/// `f` is a live function and the loaded libcuda exports `cuFuncGetParamInfo`.
pub(crate) unsafe fn cu_func_get_param_info(
    f: sys::CUfunction,
    index: usize,
) -> DriverResult<(usize, usize)> {
    let (mut off, mut size) = (0usize, 0usize);
    // SAFETY: forwarded contract; both out-pointers are valid.
    check("cuFuncGetParamInfo", unsafe {
        sys::cuFuncGetParamInfo(f, index, &mut off, &mut size)
    })?;
    Ok((off, size))
}

/// `cuFuncSetAttribute`.
///
/// # Safety
/// `f` is a live function.
pub(crate) unsafe fn cu_func_set_attribute(
    f: sys::CUfunction,
    attr: sys::CUfunction_attribute,
    value: c_int,
) -> DriverResult<()> {
    // SAFETY: forwarded contract.
    check("cuFuncSetAttribute", unsafe {
        sys::cuFuncSetAttribute(f, attr, value)
    })
}

/// `cuFuncGetAttribute`.
///
/// # Safety
/// `f` is a live function.
pub(crate) unsafe fn cu_func_get_attribute(
    f: sys::CUfunction,
    attr: sys::CUfunction_attribute,
) -> DriverResult<c_int> {
    let mut v: c_int = 0;
    // SAFETY: forwarded contract; the out-pointer is valid.
    check("cuFuncGetAttribute", unsafe {
        sys::cuFuncGetAttribute(&mut v, attr, f)
    })?;
    Ok(v)
}

/// `cuLaunchKernel` of a 1-D grid.
///
/// # Safety
/// `f` and `stream` are live and of the current context; `params` holds one pointer per kernel
/// parameter, each to that parameter's bytes (read during the call); every address the kernel
/// uses stays valid until the launch completes.
pub(crate) unsafe fn cu_launch_kernel(
    f: sys::CUfunction,
    grid: c_uint,
    block: c_uint,
    shared_mem_bytes: c_uint,
    stream: sys::CUstream,
    params: &mut [*mut c_void],
) -> DriverResult<()> {
    // SAFETY: forwarded contract.
    check("cuLaunchKernel", unsafe {
        sys::cuLaunchKernel(
            f,
            grid,
            1,
            1,
            block,
            1,
            1,
            shared_mem_bytes,
            stream,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    })
}
