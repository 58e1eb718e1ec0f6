//! Streams (in-order queues of device work), captured graphs and events.

use mscclpp_shared::DevicePtr;

use super::{BackendKind, Gpu, GridDims, Kernel, KernelImpl, LaunchConfig, cpu, cuda};
use crate::error::{Error, Result};

/// Polls `done` (backing off between polls) until it says so or `timeout` passes; whether it
/// did.
fn poll_until(
    timeout: std::time::Duration,
    mut done: impl FnMut() -> Result<bool>,
) -> Result<bool> {
    let deadline = std::time::Instant::now() + timeout;
    let mut backoff = crate::backoff::Backoff::new();
    loop {
        if done()? {
            return Ok(true);
        }
        if std::time::Instant::now() >= deadline {
            return Ok(false);
        }
        backoff.snooze();
    }
}

pub(super) enum StreamImpl {
    Cuda(cuda::Stream),
    Cpu(cpu::Stream),
}

/// An in-order queue of device work.
pub struct Stream {
    pub(super) gpu: Gpu,
    pub(super) imp: StreamImpl,
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

    /// Queues a wait: later work on this stream starts once the u64 at `addr` is at least
    /// `value`. The CPU backend gives up after `timeout` (the stream then reports an error);
    /// CUDA's wait has no timeout: whoever writes the word must also end the wait when it
    /// gives up (the collectives' regions do: `LazyRegions::release`).
    ///
    /// # Safety
    /// `addr` is a live, 8-byte aligned address the device can read (device or host-mapped
    /// memory) until the wait ends.
    pub unsafe fn wait_value_u64(
        &self,
        addr: DevicePtr<u64>,
        value: u64,
        timeout: std::time::Duration,
    ) -> Result<()> {
        match &self.imp {
            // SAFETY: forwarded contract.
            StreamImpl::Cuda(s) => unsafe { s.wait_value_u64(addr.addr(), value) },
            // SAFETY: forwarded contract.
            StreamImpl::Cpu(s) => unsafe { s.wait_value_u64(addr.addr(), value, timeout) },
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
        poll_until(timeout, || self.query())
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
                unsafe { s.launch_kernel(kernel.spec.name, dims, host, params) }.map_err(launch_err)
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

    /// Whether work queued now is captured into a CUDA graph instead of run (CUDA:
    /// `cuStreamIsCapturing`, so a capture begun by the stream's owner counts, e.g. PyTorch's
    /// on a borrowed stream; the CPU backend never captures). Collectives ask it to choose
    /// paths that neither allocate nor wait on the host (`mscclpp::collectives`).
    pub fn is_capturing(&self) -> Result<bool> {
        match &self.imp {
            StreamImpl::Cuda(s) => s.is_capturing(),
            StreamImpl::Cpu(_) => Ok(false),
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

    /// The integer this stream is named by on its backend: the `CUstream` on CUDA, the
    /// stream's handle on the CPU backend. [`Gpu::borrow_stream`] turns it back into a
    /// [`Stream`] (in this process; valid while this stream lives).
    pub fn raw(&self) -> u64 {
        match &self.imp {
            StreamImpl::Cuda(s) => s.raw(),
            StreamImpl::Cpu(s) => s.raw(),
        }
    }

    /// Whether this is a caller's stream used without owning it ([`Gpu::borrow_stream`]).
    pub fn is_borrowed(&self) -> bool {
        match &self.imp {
            StreamImpl::Cuda(s) => s.is_borrowed(),
            StreamImpl::Cpu(s) => s.is_borrowed(),
        }
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
    pub(super) _gpu: Gpu,
    pub(super) imp: cuda::Graph,
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

pub(super) enum EventImpl {
    Cuda(cuda::Event),
    Cpu(cpu::Event),
}

/// A marker in a stream.
pub struct Event {
    pub(super) _gpu: Gpu,
    pub(super) imp: EventImpl,
}

impl Event {
    /// Waits until the work before the marker is done.
    pub fn synchronize(&self) -> Result<()> {
        match &self.imp {
            EventImpl::Cuda(e) => e.synchronize(),
            EventImpl::Cpu(e) => e.synchronize(),
        }
    }

    /// Whether the work before the marker is done (an event never recorded: done).
    pub fn query(&self) -> Result<bool> {
        match &self.imp {
            EventImpl::Cuda(e) => e.query(),
            EventImpl::Cpu(e) => e.query(),
        }
    }

    /// Waits until the work before the marker is done, at most `timeout` (polling, so the wait
    /// is bounded even if the device never finishes); whether it is.
    pub fn synchronize_timeout(&self, timeout: std::time::Duration) -> Result<bool> {
        poll_until(timeout, || self.query())
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

/// A stream made at its first use ([`LazyStream::get`]), for work that most programs never
/// queue (a connection's proxy copies, the copy engines' side streams, the registration
/// service's table writes). Streams with work queued share the driver's work queues
/// (`CUDA_DEVICE_MAX_CONNECTIONS`, at most 32): ranks as threads on one GPU each making a dozen
/// streams at set-up would put busy streams of two ranks on one queue, where a kernel of one
/// can wait behind the other's and never start.
pub struct LazyStream {
    gpu: Gpu,
    stream: std::sync::OnceLock<Stream>,
}

impl std::fmt::Debug for LazyStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LazyStream({:?}, made: {})", self.gpu, self.is_made())
    }
}

impl LazyStream {
    /// No stream yet; [`get`](Self::get) makes it on `gpu`.
    pub fn new(gpu: &Gpu) -> Self {
        Self {
            gpu: gpu.clone(),
            stream: std::sync::OnceLock::new(),
        }
    }

    /// The stream, made on the first call.
    pub fn get(&self) -> Result<&Stream> {
        if let Some(s) = self.stream.get() {
            return Ok(s);
        }
        let made = self.gpu.stream()?;
        // Two first uses at once: one stream is kept, the other dropped.
        Ok(self.stream.get_or_init(|| made))
    }

    /// Whether it has been made.
    pub fn is_made(&self) -> bool {
        self.stream.get().is_some()
    }
}
