//! # `mscclpp_rs._native`
//!
//! The extension module of the Python package `mscclpp_rs` (`python/mscclpp_rs/`), built with
//! PyO3 into one abi3 wheel (CPython 3.9 and newer) by maturin. It is the package's private
//! layer: the public API is the Python package, which turns NumPy, PyTorch and CuPy arrays
//! (and anything with DLPack or `__cuda_array_interface__`) into the device addresses, counts
//! and element types these classes take, after checking them.
//!
//! | Python (`_native`) | Rust | file |
//! |---|---|---|
//! | `UniqueId` | `bootstrap::UniqueId` (+ the root's listener until rank 0 joins) | `ids.rs` |
//! | `Comm` | `communicator::Communicator` | `comm.rs` |
//! | `Collectives`, `Registration` | `collectives::Collectives`, `Registration` | `coll.rs` |
//! | `Op` | one call of `Collectives` or of a `Group` | `ops.rs` |
//! | `Buffer`, `Stream` | `gpu::DeviceBuffer`, `gpu::Stream` | `memory.rs` |
//! | `Connection`, `Memory`, `MemorySemaphore`, `MemoryChannel`, `PortChannelService` | `connection`, `registered_memory`, `semaphore`, `memory_channel`, `port_channel` | `channels.rs` |
//! | `layouts()`, `constants()`, `headers()` | `mscclpp_shared::layout`, `layout.h`, `device.cuh` | `layout.rs` |
//! | exceptions (`mscclpp_rs.errors`) | `mscclpp_host::Error` | `errors.rs` |
//!
//! Every call that can wait (bootstrap, set-up exchanges, a collective on the communicator's
//! own stream, a stream's `synchronize`) releases the GIL, so several ranks can be threads of
//! one Python process. Errors are typed Python exceptions carrying the library's text. PyO3
//! turns a Rust panic into a Python exception: nothing unwinds into the interpreter.

mod args;
mod channels;
mod coll;
mod comm;
mod errors;
mod ids;
mod layout;
mod memory;
mod ops;

use pyo3::prelude::*;

/// The module (`mscclpp_rs._native`).
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // Shows the library's log events as `MSCCLPP_LOG` asks (warnings by default). A
    // subscriber already installed in the process (another extension's) is kept, silently.
    if let Err(e @ mscclpp_log::Error::Filter { .. }) = mscclpp_log::init() {
        eprintln!("mscclpp_rs: {e}");
    }
    m.add_class::<ids::UniqueId>()?;
    m.add_class::<comm::Comm>()?;
    m.add_class::<coll::Collectives>()?;
    m.add_class::<coll::PyRegistration>()?;
    m.add_class::<ops::Op>()?;
    m.add_class::<memory::Buffer>()?;
    m.add_class::<memory::Stream>()?;
    m.add_class::<channels::Connection>()?;
    m.add_class::<channels::Memory>()?;
    m.add_class::<channels::MemorySemaphore>()?;
    m.add_class::<channels::MemoryChannel>()?;
    m.add_class::<channels::PortChannelService>()?;
    m.add_function(wrap_pyfunction!(layout::layouts, m)?)?;
    m.add_function(wrap_pyfunction!(layout::constants, m)?)?;
    m.add_function(wrap_pyfunction!(layout::headers, m)?)?;
    m.add_function(wrap_pyfunction!(device_count, m)?)?;
    m.add("VERSION", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

/// Devices `backend` offers (`None`: the selected backend, `MSCCLPP_BACKEND` or automatic).
#[pyfunction]
#[pyo3(signature = (backend=None))]
fn device_count(backend: Option<&str>) -> PyResult<usize> {
    use errors::IntoPy;
    use mscclpp::host::gpu::BackendKind;
    let kind = match backend {
        Some(b) => BackendKind::parse(b),
        None => BackendKind::select(),
    }
    .py()?;
    kind.device_count().py()
}
