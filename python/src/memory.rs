//! Device memory the library allocates ([`Buffer`]) and streams it owns ([`Stream`]).
//!
//! A `Buffer` is a `DeviceBuffer` of the communicator's device: on the CPU backend a `memfd`
//! mapped shared into this process (what peers in other processes map to reach it, and what
//! the zero-copy collective paths and registration need), on CUDA `cuMemAlloc` memory. The
//! Python class `DeviceArray` (`mscclpp_rs/arrays.py`) gives it a shape and an element type,
//! and on the CPU backend a NumPy view of the same bytes (the mapping is ordinary memory of
//! this process). Host copies go through `bytes` objects, so no host address crosses from
//! Python: `copy_from(offset, data)` and `copy_to(offset, len)`.

use std::sync::Arc;

use mscclpp::host::communicator::Communicator;
use mscclpp::host::gpu::{DeviceBuffer, Stream as HostStream};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::args::backend_name;
use crate::comm::Comm;
use crate::errors::{IntoPy, invalid};

/// Device memory of a communicator's device; freed when the last Python reference goes.
#[pyclass(frozen, module = "mscclpp_rs._native")]
pub struct Buffer {
    buf: DeviceBuffer,
    /// Keeps the device (and, on CUDA, its context) in use while the memory lives.
    _comm: Arc<Communicator>,
}

impl Buffer {
    /// The owned allocation.
    pub fn device_buffer(&self) -> &DeviceBuffer {
        &self.buf
    }
}

#[pymethods]
impl Buffer {
    /// `nbytes` zeroed bytes (at least one is allocated) on `comm`'s device.
    #[new]
    fn new(py: Python<'_>, comm: &Comm, nbytes: usize) -> PyResult<Self> {
        let c = comm.inner().clone();
        let buf = py.detach(|| c.gpu().alloc(nbytes.max(1))).py()?;
        Ok(Self { buf, _comm: c })
    }

    /// The device address of the first byte.
    #[getter]
    fn ptr(&self) -> u64 {
        self.buf.ptr().addr()
    }

    /// Its size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.buf.len()
    }

    /// `"cpu"` or `"cuda"`.
    #[getter]
    fn backend(&self) -> &'static str {
        backend_name(self.buf.gpu().kind())
    }

    /// The device ordinal.
    #[getter]
    fn device(&self) -> usize {
        self.buf.gpu().ordinal()
    }

    /// Copies `data` into the buffer at byte `offset` (waits for the copy).
    fn copy_from(&self, py: Python<'_>, offset: usize, data: &Bound<'_, PyBytes>) -> PyResult<()> {
        let bytes = data.as_bytes();
        py.detach(|| self.buf.copy_from_host(offset, bytes)).py()
    }

    /// `nbytes` bytes of the buffer from byte `offset`, as a new `bytes` object.
    fn copy_to<'py>(
        &self,
        py: Python<'py>,
        offset: usize,
        nbytes: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        if offset
            .checked_add(nbytes)
            .is_none_or(|end| end > self.buf.len())
        {
            return Err(invalid(format!(
                "bytes {offset}..{offset}+{nbytes} are outside the {}-byte buffer",
                self.buf.len()
            )));
        }
        let mut out = vec![0u8; nbytes];
        py.detach(|| self.buf.copy_to_host(offset, &mut out)).py()?;
        Ok(PyBytes::new(py, &out))
    }

    fn __repr__(&self) -> String {
        format!(
            "Buffer({} bytes on {} device {}, at {:#x})",
            self.buf.len(),
            backend_name(self.buf.gpu().kind()),
            self.buf.gpu().ordinal(),
            self.buf.ptr().addr()
        )
    }
}

/// A stream the library owns on a communicator's device. Its `handle` is what the calls take
/// as `stream`: work queued there runs in order and the call returns at once;
/// [`synchronize`](Stream::synchronize) waits for it.
#[pyclass(frozen, module = "mscclpp_rs._native")]
pub struct Stream {
    stream: HostStream,
    _comm: Arc<Communicator>,
}

#[pymethods]
impl Stream {
    /// A new stream on `comm`'s device.
    #[new]
    fn new(py: Python<'_>, comm: &Comm) -> PyResult<Self> {
        let c = comm.inner().clone();
        let stream = py.detach(|| c.gpu().stream()).py()?;
        Ok(Self { stream, _comm: c })
    }

    /// The integer naming the stream on its backend (a `CUstream` on CUDA).
    #[getter]
    fn handle(&self) -> u64 {
        self.stream.raw()
    }

    /// Waits until the work queued so far is done (the GIL is released meanwhile).
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.stream.synchronize()).py()
    }

    fn __repr__(&self) -> String {
        format!(
            "Stream({:#x} on {} device {})",
            self.stream.raw(),
            backend_name(self.stream.gpu().kind()),
            self.stream.gpu().ordinal()
        )
    }
}
