//! [`Collectives`]: the collectives of one communicator (`mscclpp::collectives::Collectives`),
//! their calls ([`Op`]s alone or as a group), registered buffers and windows.
//!
//! Where a call runs: on a stream the caller names by its integer handle (a `CUstream`, PyTorch's
//! or CuPy's current stream, or a `Stream` of this package), where it is queued and the call
//! returns at once (on CUDA with the thread's stream-capture mode relaxed during the call, so
//! that a stream PyTorch captures in global mode takes it); or, with no stream, on the
//! communicator's own stream, and then the call waits for the work and raises a device wait's
//! error (a receive of the wrong count, a timeout). Every wait releases the GIL.

use std::collections::HashMap;

use mscclpp::collectives::{CollectiveConfig, Collectives as HostCollectives, Registration};
use mscclpp::host::Result;
use mscclpp::host::gpu::cuda::RelaxedCapture;
use mscclpp::host::gpu::{BackendKind, Stream};
use mscclpp::shared::DevicePtr;
use pyo3::prelude::*;

use crate::comm::Comm;
use crate::errors::{IntoPy, invalid};
use crate::ops::Op;

/// The collectives of one communicator (module docs).
#[pyclass(frozen, module = "mscclpp_rs._native")]
pub struct Collectives {
    c: HostCollectives,
    /// The communicator's own stream, for calls that name none.
    own: Stream,
    /// Its communicator, to report errors the way `Comm.check` does.
    comm: Py<Comm>,
}

/// A registered buffer or window.
#[pyclass(frozen, module = "mscclpp_rs._native", name = "Registration")]
pub struct PyRegistration {
    reg: Registration,
}

#[pymethods]
impl PyRegistration {
    /// The registered range's first byte.
    #[getter]
    fn ptr(&self) -> u64 {
        self.reg.ptr().addr()
    }

    /// Its length in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.reg.len()
    }

    /// Whether it is a window (registered collectively).
    #[getter]
    fn is_window(&self) -> bool {
        self.reg.is_window()
    }

    fn __repr__(&self) -> String {
        format!(
            "Registration({} bytes at {:#x}{})",
            self.reg.len(),
            self.reg.ptr().addr(),
            if self.reg.is_window() { ", window" } else { "" }
        )
    }
}

impl Collectives {
    /// Runs `queue` on the stream named by `stream` (returns at once), or on the own stream
    /// and waits, then reports a device wait's error. The GIL is released throughout.
    fn on_stream(
        &self,
        py: Python<'_>,
        stream: Option<u64>,
        queue: impl FnOnce(&Stream) -> Result<()> + Send,
    ) -> PyResult<()> {
        let comm = self.comm.get();
        py.detach(|| match stream {
            Some(raw) => {
                let gpu = self.c.communicator().gpu();
                // A stream PyTorch captures in CUDA's global mode (`torch.cuda.graph`) forbids
                // the driver calls a call may make on the host (exporting, mapping): relaxed
                // for this thread during the call, as the drop-in NCCL library does.
                let _relaxed = match gpu.kind() {
                    BackendKind::Cuda => Some(RelaxedCapture::new()?),
                    BackendKind::Cpu => None,
                };
                // SAFETY: `raw` names a live stream of this device: the package passes the
                // handle of a framework's current stream or of one of its `Stream`s, held by
                // the caller for the call (the CPU backend checks its handles itself).
                let s = unsafe { gpu.borrow_stream(raw) }?;
                queue(&s)
            }
            None => {
                queue(&self.own)?;
                self.own.synchronize()?;
                match comm.current_error() {
                    Some(e) => Err(e),
                    None => Ok(()),
                }
            }
        })
        .py()
    }
}

#[pymethods]
impl Collectives {
    /// Sets up the collectives of `comm` (every rank calls it). `settings` overrides the
    /// configuration as the `MSCCLPP_*` variables of `CollectiveConfig::with_env` would
    /// (`{"MSCCLPP_DIRECT_MIN_BYTES": 4096}`), after the environment's; every rank must end
    /// with the same configuration.
    #[new]
    #[pyo3(signature = (comm, settings=None))]
    fn new(
        py: Python<'_>,
        comm: Bound<'_, Comm>,
        settings: Option<HashMap<String, u64>>,
    ) -> PyResult<Self> {
        let c = comm.get().inner().clone();
        let mut cfg = CollectiveConfig::for_backend(c.gpu().kind()).with_env();
        if let Some(s) = &settings {
            let names: Vec<&str> = CollectiveConfig::TABLE
                .iter()
                .filter_map(|r| r.env)
                .collect();
            if let Some(unknown) = s.keys().find(|k| !names.contains(&k.as_str())) {
                return Err(invalid(format!(
                    "{unknown:?} is not a collectives setting (one of {})",
                    names.join(", ")
                )));
            }
            cfg = cfg.with_vars(|name| s.get(name).map(u64::to_string));
        }
        let (coll, own) = py
            .detach(|| -> Result<_> {
                let own = c.gpu().stream()?;
                Ok((HostCollectives::with_config(c, cfg)?, own))
            })
            .py()?;
        Ok(Self {
            c: coll,
            own,
            comm: comm.unbind(),
        })
    }

    /// Queues `op` (see the module docs for `stream`).
    #[pyo3(signature = (op, stream=None))]
    fn run(&self, py: Python<'_>, op: &Op, stream: Option<u64>) -> PyResult<()> {
        // SAFETY: the package's contract for `Op`s (module `ops`).
        self.on_stream(py, stream, |s| unsafe { op.queue(&self.c, s) })
    }

    /// Records `ops` into one group and queues it (NCCL's `ncclGroupStart` … `ncclGroupEnd`):
    /// its collectives in order, then every send and receive together.
    #[pyo3(signature = (ops, stream=None))]
    fn run_group(
        &self,
        py: Python<'_>,
        ops: Vec<PyRef<'_, Op>>,
        stream: Option<u64>,
    ) -> PyResult<()> {
        let ops: Vec<Op> = ops.iter().map(|o| (**o).clone()).collect();
        self.on_stream(py, stream, |s| {
            let mut g = self.c.group();
            for op in &ops {
                // SAFETY: the package's contract for `Op`s (module `ops`).
                unsafe { op.record(&mut g) }?;
            }
            g.end(s)
        })
    }

    /// Sends `count` elements of `input` to `next` and receives as many from `prev` into
    /// `output`, both at once.
    #[pyo3(signature = (input, next, output, prev, count, dtype, stream=None))]
    #[allow(clippy::too_many_arguments)]
    fn send_recv(
        &self,
        py: Python<'_>,
        input: u64,
        next: usize,
        output: u64,
        prev: usize,
        count: usize,
        dtype: u32,
        stream: Option<u64>,
    ) -> PyResult<()> {
        let dt = crate::args::dtype(dtype)?;
        let (i, o) = (DevicePtr::from_addr(input), DevicePtr::from_addr(output));
        // SAFETY: the package's contract for buffers (module `ops`).
        self.on_stream(py, stream, |s| unsafe {
            self.c.send_recv(i, next, o, prev, count, dt, s)
        })
    }

    /// Waits for the work queued on the own stream, then raises a device wait's error.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        self.on_stream(py, None, |_| Ok(()))
    }

    /// Registers `nbytes` at `ptr` with every peer (NCCL's `ncclCommRegister`; not collective).
    fn register_buffer(&self, py: Python<'_>, ptr: u64, nbytes: usize) -> PyResult<PyRegistration> {
        // SAFETY: the package keeps the registered array alive until it deregisters it.
        let reg = py
            .detach(|| unsafe { self.c.register_buffer(DevicePtr::from_addr(ptr), nbytes) })
            .py()?;
        Ok(PyRegistration { reg })
    }

    /// Takes back a registration of `register_buffer` (not collective).
    fn deregister(&self, py: Python<'_>, reg: &PyRegistration) -> PyResult<()> {
        py.detach(|| self.c.deregister(reg.reg)).py()
    }

    /// Registers a window (NCCL's `ncclCommWindowRegister`): collective, every rank with a
    /// buffer of the same size, in the same order.
    fn register_window(&self, py: Python<'_>, ptr: u64, nbytes: usize) -> PyResult<PyRegistration> {
        // SAFETY: as `register_buffer`.
        let reg = py
            .detach(|| unsafe { self.c.register_window(DevicePtr::from_addr(ptr), nbytes) })
            .py()?;
        Ok(PyRegistration { reg })
    }

    /// Takes back a window (collective, in the same order on every rank).
    fn deregister_window(&self, py: Python<'_>, reg: &PyRegistration) -> PyResult<()> {
        py.detach(|| self.c.deregister_window(reg.reg)).py()
    }

    /// `(this rank's registrations, the peers' registrations mapped here)`.
    fn registrations(&self) -> (usize, usize) {
        self.c.registrations()
    }

    /// Allocates and trades every scratch region the collectives otherwise set up on first
    /// use (collective), so calls captured in a CUDA graph afterwards may take any algorithm.
    fn prepare(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.c.prepare()).py()
    }

    /// The algorithm the last call on this rank ran, by name (`None` before the first).
    fn last_algorithm(&self) -> Option<&'static str> {
        self.c.last_algorithm().map(|a| a.name())
    }

    /// Bytes of device memory held in scratch regions now.
    fn scratch_bytes(&self) -> usize {
        self.c.scratch_bytes()
    }

    /// The configuration in use, setting by setting.
    fn config(&self) -> HashMap<&'static str, u64> {
        self.c.config().settings().into_iter().collect()
    }
}
