//! Streams and events of the `cuda` backend. Made by [`super::Device`]; each keeps the device's
//! primary context alive and makes it current before its driver calls, so a stream may be used
//! from any thread (the driver orders work per stream, whichever thread queues it).

use std::ffi::{c_uint, c_void};
use std::sync::Arc;

use cudarc::driver::sys;

use super::module::Function;
use super::{Context, result};
use crate::error::{BackendError, DriverError, Error, Result};
use crate::gpu::LaunchConfig;

/// Dynamic shared memory a kernel may use without opting in (`cuFuncSetAttribute`).
const DEFAULT_MAX_DYNAMIC_SHARED: u32 = 48 * 1024;

/// A non-blocking stream (`cuStreamCreate(CU_STREAM_NON_BLOCKING)`), destroyed on drop (work
/// still queued completes first, per the driver); or a caller's stream borrowed by
/// [`super::Device::borrow_stream`], which is left alone on drop.
#[derive(Debug)]
pub struct Stream {
    ctx: Arc<Context>,
    raw: sys::CUstream,
    /// Whether `Drop` destroys `raw` (false for a borrowed stream).
    owned: bool,
}

// SAFETY: a `CUstream` is a driver handle usable from any thread (with its context current,
// which every method ensures); the driver serialises concurrent submissions.
unsafe impl Send for Stream {}
// SAFETY: as above; no method mutates `Stream`.
unsafe impl Sync for Stream {}

impl Stream {
    /// Takes ownership of `raw`, a live stream of `ctx`.
    pub(super) fn new(ctx: Arc<Context>, raw: sys::CUstream) -> Self {
        Self {
            ctx,
            raw,
            owned: true,
        }
    }

    /// Uses `raw`, a stream of `ctx` that someone else owns, without ever destroying it.
    pub(super) fn borrowed(ctx: Arc<Context>, raw: sys::CUstream) -> Self {
        Self {
            ctx,
            raw,
            owned: false,
        }
    }

    fn err(&self, op: &'static str, e: DriverError) -> Error {
        Error::Stream {
            op,
            ordinal: self.ctx.ordinal(),
            source: e.into(),
        }
    }

    /// Queues a copy of `bytes` from `src` to `dst` (`cuMemcpyAsync`; with unified addressing any
    /// mix of local, peer-mapped, IPC-mapped and host-mapped addresses).
    ///
    /// # Safety
    /// `dst` and `src` are valid device addresses for `bytes` until the copy completes, and do
    /// not overlap.
    pub unsafe fn copy_dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        let err = |e: DriverError| Error::Copy {
            direction: "dtod",
            bytes,
            ordinal: self.ctx.ordinal(),
            source: e.into(),
        };
        self.ctx.bind().map_err(err)?;
        // SAFETY: forwarded contract; `self.raw` is live.
        unsafe { result::cu_memcpy_async(dst, src, bytes, self.raw) }.map_err(err)
    }

    /// Queues a launch of `f` (`cuLaunchKernel`) with the parameter bytes `params`.
    ///
    /// `params` is the kernel's parameter block: normally one `#[repr(C)]` struct passed by
    /// value, i.e. one kernel parameter at offset 0. Where the driver reports the entry point's
    /// parameter layout (`cuFuncGetParamInfo`, CUDA 12.4+), each kernel parameter is taken from
    /// `params` at its reported offset, so a struct that the compiler split into several
    /// scalar parameters still launches correctly (the offsets of naturally aligned parameters
    /// equal the `#[repr(C)]` field offsets); a block whose length differs from the reported
    /// total is refused. Above 48 KiB of dynamic shared memory the kernel is first opted in
    /// (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`).
    ///
    /// # Safety
    /// `params` must be what `f` expects, and every address in it must be valid for what the
    /// kernel does with it until the launch completes.
    pub unsafe fn launch(
        &self,
        f: &Function,
        cfg: LaunchConfig,
        params: &[u8],
    ) -> std::result::Result<(), BackendError> {
        self.ctx.bind()?;
        let base = params.as_ptr().cast::<c_void>().cast_mut();
        let mut ptrs: Vec<*mut c_void> = match f.param_layout() {
            Some(layout) => {
                let total = layout.last().map_or(0, |&(off, size)| off + size);
                if total != params.len() {
                    return Err(BackendError::Invalid(format!(
                        "kernel {:?} takes {total} bytes of parameters, the launch passes {}",
                        f.name(),
                        params.len()
                    )));
                }
                // `off < total == params.len()`, so each pointer stays inside `params`.
                layout
                    .iter()
                    .map(|&(off, _)| base.wrapping_byte_add(off))
                    .collect()
            }
            None => vec![base],
        };
        if cfg.shared_mem_bytes > DEFAULT_MAX_DYNAMIC_SHARED {
            f.allow_dynamic_shared(cfg.shared_mem_bytes)?;
        }
        // SAFETY: `f` and `self.raw` are live in the current context (`f` keeps its module
        // alive); `ptrs` holds one pointer per kernel parameter into `params`, which outlives
        // the call (the driver copies the values during it); the caller vouches for the
        // addresses the parameters hold.
        unsafe {
            result::cu_launch_kernel(
                f.raw(),
                cfg.grid as c_uint,
                cfg.block as c_uint,
                cfg.shared_mem_bytes as c_uint,
                self.raw,
                &mut ptrs,
            )
        }?;
        Ok(())
    }

    /// Records `event` after the work queued so far (both must belong to the same device).
    pub fn record(&self, event: &Event) -> Result<()> {
        let err = |e| self.err("record event", e);
        self.ctx.bind().map_err(err)?;
        // SAFETY: both handles are live (owned by `self` and `event`).
        unsafe { result::cu_event_record(event.raw, self.raw) }.map_err(err)
    }

    /// Makes later work on this stream wait for `event` (which may belong to another device).
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        let err = |e| self.err("wait for event", e);
        self.ctx.bind().map_err(err)?;
        // SAFETY: both handles are live (owned by `self` and `event`).
        unsafe { result::cu_stream_wait_event(self.raw, event.raw) }.map_err(err)
    }

    /// Waits until all queued work is done; reports the first failure of queued work (a
    /// faulting kernel surfaces here as, e.g., `CUDA_ERROR_ILLEGAL_ADDRESS`).
    pub fn synchronize(&self) -> Result<()> {
        let err = |e| self.err("synchronize stream", e);
        self.ctx.bind().map_err(err)?;
        // SAFETY: `self.raw` is live.
        unsafe { result::cu_stream_synchronize(self.raw) }.map_err(err)
    }

    /// Queues a store of `value` to the u64 at `dst` after the work queued before it is
    /// complete and visible (`cuStreamWriteValue64`; where the driver refuses the address, an
    /// 8-byte host-to-device copy, which the stream orders the same way).
    ///
    /// # Safety
    /// `dst` is a device-accessible, 8-byte aligned address valid until the write runs.
    pub unsafe fn write_value_u64(&self, dst: u64, value: u64) -> Result<()> {
        let err = |e: DriverError| Error::Copy {
            direction: "write value",
            bytes: 8,
            ordinal: self.ctx.ordinal(),
            source: e.into(),
        };
        self.ctx.bind().map_err(err)?;
        // SAFETY: forwarded contract; `self.raw` is live.
        match unsafe { result::cu_stream_write_value64(self.raw, dst, value) } {
            Ok(()) => Ok(()),
            // SAFETY: as above.
            Err(_) => unsafe { result::cu_memcpy_htod_async(dst, &value.to_le_bytes(), self.raw) }
                .map_err(err),
        }
    }

    /// Queues a wait until the u64 at `addr` is at least `value` (`cuStreamWaitValue64`,
    /// `CU_STREAM_WAIT_VALUE_GEQ`).
    ///
    /// # Safety
    /// `addr` is a device-accessible (device or host-mapped), 8-byte aligned address valid
    /// until the wait ends.
    pub unsafe fn wait_value_u64(&self, addr: u64, value: u64) -> Result<()> {
        let err = |e: DriverError| self.err("wait value", e);
        self.ctx.bind().map_err(err)?;
        // SAFETY: forwarded contract; `self.raw` is live.
        unsafe { result::cu_stream_wait_value64_geq(self.raw, addr, value) }.map_err(err)
    }

    /// Whether all queued work is done (`cuStreamQuery`); reports a failed kernel.
    pub fn query(&self) -> Result<bool> {
        let err = |e| self.err("query stream", e);
        self.ctx.bind().map_err(err)?;
        // SAFETY: `self.raw` is live.
        unsafe { result::cu_stream_query(self.raw) }.map_err(err)
    }

    /// Starts capturing the work queued on this stream into a graph
    /// (`cuStreamBeginCapture_v2`, `CU_STREAM_CAPTURE_MODE_RELAXED`: other threads, e.g. other
    /// ranks of the process, may keep allocating and copying while this one captures). Until
    /// [`Stream::end_capture`], queued work is recorded, not run.
    pub fn begin_capture(&self) -> Result<()> {
        let err = |e| self.err("begin graph capture", e);
        self.ctx.bind().map_err(err)?;
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: `self.raw` is live; a second begin is refused by the driver.
        unsafe { result::cu_stream_begin_capture(self.raw, mode) }.map_err(err)
    }

    /// Whether the stream is capturing work into a graph (begun here or by its owner, e.g.
    /// PyTorch's `torch.cuda.graph`, when borrowed).
    pub fn is_capturing(&self) -> Result<bool> {
        let err = |e| self.err("query graph capture", e);
        self.ctx.bind().map_err(err)?;
        // SAFETY: `self.raw` is live (owned, or borrowed under the borrower's contract).
        unsafe { result::cu_stream_is_capturing(self.raw) }.map_err(err)
    }

    /// Ends the capture begun by [`Stream::begin_capture`] and instantiates the graph. The stream
    /// stops capturing even when this fails.
    pub fn end_capture(&self) -> Result<Graph> {
        let err = |op, e| self.err(op, e);
        self.ctx.bind().map_err(|e| err("end graph capture", e))?;
        // SAFETY: `self.raw` is live (a stream that is not capturing gets an error).
        let graph = unsafe { result::cu_stream_end_capture(self.raw) }
            .map_err(|e| err("end graph capture", e))?;
        // SAFETY: `graph` was just made by the driver.
        match unsafe { result::cu_graph_instantiate(graph) } {
            Ok(exec) => Ok(Graph {
                ctx: self.ctx.clone(),
                graph,
                exec,
            }),
            Err(e) => {
                // SAFETY: `graph` is ours and not used again.
                if let Err(d) = unsafe { result::cu_graph_destroy(graph) } {
                    tracing::warn!(ordinal = self.ctx.ordinal(), error = %d, "destroying a CUDA graph failed");
                }
                Err(err("instantiate graph", e))
            }
        }
    }

    /// Whether this is a caller's stream used without owning it.
    pub fn is_borrowed(&self) -> bool {
        !self.owned
    }

    /// The `CUstream` as an integer, for interop (NCCL, graphs). Valid while `self` lives.
    pub fn raw(&self) -> u64 {
        self.raw as u64
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let r = self.ctx.bind().and_then(|()| {
            // SAFETY: `self.raw` is owned by `self` and destroyed only here.
            unsafe { result::cu_stream_destroy(self.raw) }
        });
        if let Err(e) = r {
            tracing::warn!(ordinal = self.ctx.ordinal(), error = %e, "destroying a CUDA stream failed");
        }
    }
}

/// An event with timing enabled (`cuEventCreate(CU_EVENT_DEFAULT)`), destroyed on drop.
#[derive(Debug)]
pub struct Event {
    ctx: Arc<Context>,
    raw: sys::CUevent,
}

// SAFETY: a `CUevent` is a driver handle usable from any thread (its context is made current
// by every method); the driver synchronises access.
unsafe impl Send for Event {}
// SAFETY: as above; no method mutates `Event`.
unsafe impl Sync for Event {}

impl Event {
    /// Takes ownership of `raw`, a live event of `ctx`.
    pub(super) fn new(ctx: Arc<Context>, raw: sys::CUevent) -> Self {
        Self { ctx, raw }
    }

    fn err(&self, op: &'static str, e: DriverError) -> Error {
        Error::Stream {
            op,
            ordinal: self.ctx.ordinal(),
            source: e.into(),
        }
    }

    /// Waits until the work before the last record of this event is done.
    pub fn synchronize(&self) -> Result<()> {
        let err = |e| self.err("synchronize event", e);
        self.ctx.bind().map_err(err)?;
        // SAFETY: `self.raw` is live.
        unsafe { result::cu_event_synchronize(self.raw) }.map_err(err)
    }

    /// Whether the work before the last record of this event is done (`cuEventQuery`).
    pub fn query(&self) -> Result<bool> {
        let err = |e| self.err("query event", e);
        self.ctx.bind().map_err(err)?;
        // SAFETY: `self.raw` is live.
        unsafe { result::cu_event_query(self.raw) }.map_err(err)
    }

    /// Milliseconds from `start` to `self`; both recorded and complete (else the driver says
    /// `CUDA_ERROR_NOT_READY` / `CUDA_ERROR_INVALID_HANDLE`).
    pub fn elapsed_ms(&self, start: &Event) -> Result<f32> {
        let err = |e| self.err("event elapsed time", e);
        self.ctx.bind().map_err(err)?;
        // SAFETY: both events are live (owned by `start` and `self`).
        unsafe { result::cu_event_elapsed_time(start.raw, self.raw) }.map_err(err)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let r = self.ctx.bind().and_then(|()| {
            // SAFETY: `self.raw` is owned by `self` and destroyed only here.
            unsafe { result::cu_event_destroy(self.raw) }
        });
        if let Err(e) = r {
            tracing::warn!(ordinal = self.ctx.ordinal(), error = %e, "destroying a CUDA event failed");
        }
    }
}

/// A captured and instantiated graph (`CUgraph` + `CUgraphExec`), made by
/// [`Stream::end_capture`]; both are destroyed on drop. It keeps the addresses and kernel
/// parameters it was captured with: the buffers it uses must outlive its launches.
#[derive(Debug)]
pub struct Graph {
    ctx: Arc<Context>,
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

// SAFETY: graph handles are driver handles usable from any thread (the context is made current
// by every method); the driver synchronises access.
unsafe impl Send for Graph {}
// SAFETY: as above; no method mutates `Graph`.
unsafe impl Sync for Graph {}

impl Graph {
    /// Queues one run of the whole graph on `stream` (`cuGraphLaunch`).
    ///
    /// # Safety
    /// Every address the captured work uses is still valid, and stays so until the run completes.
    pub unsafe fn launch(&self, stream: &Stream) -> Result<()> {
        let err = |e| stream.err("launch graph", e);
        self.ctx.bind().map_err(err)?;
        // SAFETY: both handles are live; the caller vouches for the captured addresses.
        unsafe { result::cu_graph_launch(self.exec, stream.raw) }.map_err(err)
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        let r = self.ctx.bind().and_then(|()| {
            // SAFETY: both handles are owned by `self` and destroyed only here; an instance
            // still running is released by the driver when it completes.
            let exec = unsafe { result::cu_graph_exec_destroy(self.exec) };
            // SAFETY: as above.
            let graph = unsafe { result::cu_graph_destroy(self.graph) };
            exec.and(graph)
        });
        if let Err(e) = r {
            tracing::warn!(ordinal = self.ctx.ordinal(), error = %e, "destroying a CUDA graph failed");
        }
    }
}
