//! Channels for your own kernels: connections, registered memories, semaphores, and the device
//! handles of MemoryChannels and PortChannels as `bytes` laid out as `layout.h` says
//! (`MemoryChannelDeviceHandle`, 56 bytes; `MemoryDevice2DeviceSemaphoreDeviceHandle`, 32;
//! `PortChannelDeviceHandle`, 96), for a CuPy `RawKernel`, a Triton kernel or any other kernel
//! that takes a pointer to them. `mscclpp_rs/handles.py` decodes them field by field.
//!
//! Set-up is pairwise, as in Rust: both ranks of a pair make the same calls (`Connection`,
//! `send_memory`/`recv_memory`, semaphores) in the same order with the same tags. Python's tags
//! (below 2^32) live apart from the collectives' own set-up tags.
//!
//! Lifetimes: a channel keeps what its handle points at alive (its semaphore's words, the
//! peer's mapped memory, the local buffers it names), so the handle's addresses stay valid while
//! the Python object lives; a kernel that uses a handle must finish before the channel goes.

use std::sync::{Arc, Mutex};

use mscclpp::host::Result;
use mscclpp::host::communicator::Communicator;
use mscclpp::host::connection::{Connection as HostConnection, EndpointConfig};
use mscclpp::host::memory_channel::MemoryChannel as HostMemoryChannel;
use mscclpp::host::port_channel::{PortChannelService as HostService, PortChannelServiceBuilder};
use mscclpp::host::registered_memory::RegisteredMemory;
use mscclpp::host::semaphore::MemoryDevice2DeviceSemaphore;
use mscclpp::shared::DevicePtr;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::args;
use crate::comm::{Comm, SETUP_TAG_BIT, check_tag};
use crate::errors::{IntoPy, invalid};
use crate::memory::Buffer;

/// The communicator's tag for Python's set-up tag `tag`.
fn setup_tag(tag: u64) -> PyResult<u64> {
    Ok(SETUP_TAG_BIT | check_tag(tag)?)
}

/// `value`'s bytes as a Python `bytes` object.
fn pod_bytes<'py, T: bytemuck::Pod>(py: Python<'py>, value: &T) -> Bound<'py, PyBytes> {
    PyBytes::new(py, bytemuck::bytes_of(value))
}

/// A connection to one peer (`Communicator::connect`; the peer makes the same call).
#[pyclass(frozen, module = "mscclpp_rs._native")]
pub struct Connection {
    conn: Arc<dyn HostConnection>,
    comm: Arc<Communicator>,
}

#[pymethods]
impl Connection {
    /// Connects to `peer` over `transport` (`None`: the same-node transport: `cuda_ipc` on
    /// CUDA, `shm` on the CPU backend; `ethernet`, `ofi`, `ib0` … for the network ones).
    #[new]
    #[pyo3(signature = (comm, peer, tag=0, transport=None))]
    fn new(
        py: Python<'_>,
        comm: &Comm,
        peer: usize,
        tag: u64,
        transport: Option<&str>,
    ) -> PyResult<Self> {
        let c = comm.inner().clone();
        let t = args::transport(transport, c.gpu().kind())?;
        let tag = setup_tag(tag)?;
        let conn = py
            .detach(|| c.connect(EndpointConfig::new(t), peer, tag))
            .py()?;
        Ok(Self { conn, comm: c })
    }

    /// The rank at the other end.
    #[getter]
    fn peer(&self) -> usize {
        self.conn.remote_rank()
    }

    /// The transport's name.
    #[getter]
    fn transport(&self) -> String {
        self.conn.transport().to_string()
    }
}

/// Memory registered with this rank's communicator, or a peer's received from it
/// (`recv_memory`), mapped here when it is on the same node.
#[pyclass(frozen, module = "mscclpp_rs._native")]
pub struct Memory {
    mem: RegisteredMemory,
    /// The local buffer a registration of this rank names, kept alive as long as the memory.
    _buffer: Option<Py<Buffer>>,
}

#[pymethods]
impl Memory {
    /// Registers `buffer` for `transport` (`None`: the same-node one) so that peers can map it
    /// (`send_memory`).
    #[staticmethod]
    #[pyo3(signature = (comm, buffer, transport=None))]
    fn register(comm: &Comm, buffer: Bound<'_, Buffer>, transport: Option<&str>) -> PyResult<Self> {
        let c = comm.inner();
        let t = args::transport(transport, c.gpu().kind())?;
        let mem = c.register_buffer(buffer.get().device_buffer(), t).py()?;
        Ok(Self {
            mem,
            _buffer: Some(buffer.unbind()),
        })
    }

    /// Sends this memory to `peer` under `tag` (the peer takes it with `recv`).
    #[pyo3(signature = (comm, peer, tag=0))]
    fn send(&self, py: Python<'_>, comm: &Comm, peer: usize, tag: u64) -> PyResult<()> {
        let tag = setup_tag(tag)?;
        py.detach(|| comm.inner().send_memory(&self.mem, peer, tag))
            .py()
    }

    /// The memory `peer` sent under `tag`, mapped here when it is on this node.
    #[staticmethod]
    #[pyo3(signature = (comm, peer, tag=0))]
    fn recv(py: Python<'_>, comm: &Comm, peer: usize, tag: u64) -> PyResult<Self> {
        let tag = setup_tag(tag)?;
        let c = comm.inner();
        let mem = py.detach(|| c.recv_memory(peer, tag)).py()?;
        Ok(Self { mem, _buffer: None })
    }

    /// The rank that owns it.
    #[getter]
    fn rank(&self) -> usize {
        self.mem.rank()
    }

    /// Its size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.mem.size()
    }

    /// Its address in this process (`None` when it is not mapped here: another node).
    #[getter]
    fn ptr(&self) -> Option<u64> {
        self.mem.ptr().map(|p| p.addr())
    }
}

/// A GPU↔GPU semaphore over a same-node connection (the peer makes the same call).
#[pyclass(frozen, module = "mscclpp_rs._native")]
pub struct MemorySemaphore {
    sem: MemoryDevice2DeviceSemaphore,
    _conn: Py<Connection>,
}

fn memory_semaphore(
    py: Python<'_>,
    conn: &Connection,
    tag: u64,
) -> PyResult<MemoryDevice2DeviceSemaphore> {
    let tag = setup_tag(tag)?;
    py.detach(|| conn.comm.build_memory_semaphore(conn.conn.as_ref(), tag))
        .py()
}

#[pymethods]
impl MemorySemaphore {
    /// Builds the semaphore over `conn` under `tag`.
    #[new]
    #[pyo3(signature = (conn, tag=0))]
    fn new(py: Python<'_>, conn: Bound<'_, Connection>, tag: u64) -> PyResult<Self> {
        let sem = memory_semaphore(py, conn.get(), tag)?;
        Ok(Self {
            sem,
            _conn: conn.unbind(),
        })
    }

    /// `MemoryDevice2DeviceSemaphoreDeviceHandle` (32 bytes).
    fn handle<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        Ok(pod_bytes(py, &self.sem.device_handle().py()?))
    }
}

/// One end of a MemoryChannel: a semaphore with the peer, the peer's memory (`dst`, where puts
/// land), a local buffer (`src`) and an optional local packet buffer.
#[pyclass(frozen, module = "mscclpp_rs._native")]
pub struct MemoryChannel {
    ch: HostMemoryChannel,
    _keep: Vec<Py<PyAny>>,
}

#[pymethods]
impl MemoryChannel {
    /// Builds the channel's semaphore over `conn` under `tag` (the peer builds its end with the
    /// same tag), writing into `dst` (a peer's `Memory`, mapped here) from `src`.
    #[new]
    #[pyo3(signature = (conn, dst, src, packet_buffer=None, tag=0))]
    fn new(
        py: Python<'_>,
        conn: Bound<'_, Connection>,
        dst: Bound<'_, Memory>,
        src: Bound<'_, Buffer>,
        packet_buffer: Option<Bound<'_, Buffer>>,
        tag: u64,
    ) -> PyResult<Self> {
        let sem = memory_semaphore(py, conn.get(), tag)?;
        let packets = packet_buffer
            .as_ref()
            .map_or(DevicePtr::NULL, |b| b.get().device_buffer().ptr());
        let ch = HostMemoryChannel::new(
            sem,
            dst.get().mem.clone(),
            src.get().device_buffer().ptr(),
            packets,
        )
        .py()?;
        let mut keep = vec![conn.into_any().unbind(), dst.into_any().unbind()];
        keep.push(src.into_any().unbind());
        if let Some(p) = packet_buffer {
            keep.push(p.into_any().unbind());
        }
        Ok(Self { ch, _keep: keep })
    }

    /// `MemoryChannelDeviceHandle` (56 bytes).
    fn handle<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        Ok(pod_bytes(py, &self.ch.device_handle().py()?))
    }
}

const _: () = assert!(mscclpp::shared::DEFAULT_FIFO_SIZE == 512);

/// The proxy of PortChannels: configured (memories, semaphores, channel handles), then started;
/// GPU threads push triggers into its FIFO and the proxy thread moves the data and signals.
enum ServiceState {
    Building(Box<PortChannelServiceBuilder>),
    Running(HostService),
    Stopped,
}

/// A port-channel service of one communicator (see `ServiceState`).
#[pyclass(frozen, module = "mscclpp_rs._native")]
pub struct PortChannelService {
    state: Mutex<ServiceState>,
    comm: Arc<Communicator>,
    /// Connections and memories the proxy's tables use, kept alive with it.
    keep: Mutex<Vec<Py<PyAny>>>,
}

impl PortChannelService {
    fn building<T>(
        &self,
        f: impl FnOnce(&mut PortChannelServiceBuilder) -> Result<T>,
    ) -> PyResult<T> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match &mut *state {
            ServiceState::Building(b) => f(b).py(),
            _ => Err(invalid(
                "the service is started (or stopped): add memories and semaphores, and make the channels' handles, before start()",
            )),
        }
    }

    fn keep(&self, obj: Py<PyAny>) {
        self.keep
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(obj);
    }
}

#[pymethods]
impl PortChannelService {
    /// A service with a FIFO of `fifo_size` slots (a power of two; the library's default,
    /// written out so that Python sees the number).
    #[new]
    #[pyo3(signature = (comm, fifo_size=512))]
    fn new(comm: &Comm, fifo_size: u32) -> PyResult<Self> {
        let c = comm.inner().clone();
        let b = HostService::builder(c.gpu(), c.status(), fifo_size).py()?;
        Ok(Self {
            state: Mutex::new(ServiceState::Building(Box::new(b))),
            comm: c,
            keep: Mutex::new(Vec::new()),
        })
    }

    /// Builds a semaphore over `conn` under `tag` that the peer's proxy signals and a GPU of
    /// this rank waits on (the peer makes the same call); returns its id.
    #[pyo3(signature = (conn, tag=0))]
    fn add_semaphore(
        &self,
        py: Python<'_>,
        conn: Bound<'_, Connection>,
        tag: u64,
    ) -> PyResult<u32> {
        let tag = setup_tag(tag)?;
        let c = conn.get().conn.clone();
        let sem = py.detach(|| self.comm.build_semaphore(c, tag)).py()?;
        let id = self.building(|b| b.add_semaphore(sem))?;
        self.keep(conn.into_any().unbind());
        Ok(id)
    }

    /// Adds a memory (this rank's, or a peer's from `Memory.recv`) channels may name; returns
    /// its id.
    fn add_memory(&self, mem: Bound<'_, Memory>) -> PyResult<u32> {
        let m = mem.get().mem.clone();
        let id = self.building(|b| b.add_memory(m))?;
        self.keep(mem.into_any().unbind());
        Ok(id)
    }

    /// `PortChannelDeviceHandle` (96 bytes) of a channel: semaphore `semaphore`, writing into
    /// memory `dst` from memory `src` (ids from `add_semaphore` / `add_memory`).
    fn port_channel<'py>(
        &self,
        py: Python<'py>,
        semaphore: u32,
        dst: u32,
        src: u32,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let h = self.building(|b| b.port_channel(semaphore, dst, src))?;
        Ok(pod_bytes(py, &h))
    }

    /// Starts the proxy thread.
    fn start(&self) -> PyResult<()> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match std::mem::replace(&mut *state, ServiceState::Stopped) {
            ServiceState::Building(b) => {
                *state = ServiceState::Running(b.start().py()?);
                Ok(())
            }
            other => {
                *state = other;
                Err(invalid("the service was started already"))
            }
        }
    }

    /// The proxy's sticky error, if it failed.
    fn error(&self) -> Option<String> {
        match &*self.state.lock().unwrap_or_else(|p| p.into_inner()) {
            ServiceState::Running(s) => s.error(),
            _ => None,
        }
    }

    /// Stops the proxy (releasing device waits on its FIFO) and raises its error, if any.
    /// Stopping a service that is not running does nothing.
    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        let taken = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            std::mem::replace(&mut *state, ServiceState::Stopped)
        };
        match taken {
            ServiceState::Running(s) => py.detach(|| s.stop()).py(),
            _ => Ok(()),
        }
    }

    /// Whether the proxy runs.
    #[getter]
    fn running(&self) -> bool {
        matches!(
            &*self.state.lock().unwrap_or_else(|p| p.into_inner()),
            ServiceState::Running(_)
        )
    }
}
