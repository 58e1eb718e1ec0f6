//! [`Comm`]: one rank's communicator (`mscclpp_host::communicator::Communicator`) — how it is
//! made (a unique id, a plain address and a secret, or the environment's launcher variables),
//! what it knows of the world (rank, size, device, node layout), the bootstrap's small
//! messages, splits, and the abort flag and error record every device wait watches.
//!
//! Everything that can wait (the bootstrap's set-up, its collectives, a split) runs with the
//! GIL released, so ranks that are threads of one Python process make progress together.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use mscclpp::host::auth::Passphrase;
use mscclpp::host::bootstrap::{
    Bootstrap, BootstrapConfig, RootListener, RootSpec, TcpBootstrap, parse_root,
};
use mscclpp::host::communicator::Communicator;
use mscclpp::host::gpu::{BackendKind, Gpu};
use mscclpp::host::{Error, Result};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::args::backend_name;
use crate::errors::{IntoPy, invalid};
use crate::ids::UniqueId;

/// The bootstrap tags of `send_bytes`/`recv_bytes`: `BYTES_TAG | tag`, apart from the
/// communicator's set-up ranges (`1 << 60` to `3 << 60`), a split's (`0xE << 60`), the node
/// communicator's (bit 63) and the collectives' own low tags.
const BYTES_TAG: u64 = 0x5 << 60;

/// Python's tags (`send_bytes`, `connect`, `send_memory`, semaphores) are below this.
pub const MAX_TAG: u64 = 1 << 32;

/// The bit Python's set-up tags carry inside the communicator's user tag space (below
/// `1 << 60`), so they never meet the collectives' set-up tags (small numbers).
pub const SETUP_TAG_BIT: u64 = 1 << 59;

/// One rank's communicator (module docs).
#[pyclass(frozen, module = "mscclpp_rs._native")]
pub struct Comm {
    comm: Arc<Communicator>,
}

impl Comm {
    /// The communicator.
    pub fn inner(&self) -> &Arc<Communicator> {
        &self.comm
    }

    /// Wraps a communicator.
    pub fn wrap(comm: Communicator) -> Self {
        Self {
            comm: Arc::new(comm),
        }
    }

    /// The error a rank should see now: a device wait that gave up (recorded in the status
    /// block), else the communicator's sticky asynchronous error (a dead peer, an abort).
    pub fn current_error(&self) -> Option<Error> {
        self.comm
            .status()
            .error()
            .or_else(|| self.comm.async_error())
    }
}

/// The backend a caller named, or the selected one (`MSCCLPP_BACKEND`, else CUDA when a GPU
/// is present, else the CPU backend).
fn backend(name: Option<&str>) -> Result<BackendKind> {
    match name {
        Some(n) => BackendKind::parse(n),
        None => BackendKind::select(),
    }
}

/// Joins the world `cfg` describes (rank 0 with the root's listener if it has it), opens the
/// device (`device`, else the rank's index on its node modulo the devices) and makes the
/// communicator.
fn join(
    cfg: BootstrapConfig,
    listener: Option<RootListener>,
    backend_name: Option<&str>,
    device: Option<usize>,
) -> Result<Communicator> {
    let kind = backend(backend_name)?;
    let bs = match listener {
        Some(l) => TcpBootstrap::init_with_root_listener(cfg, l)?,
        None => TcpBootstrap::init(cfg)?,
    };
    let ordinal = match device {
        Some(d) => d,
        None => bs.local_rank() % kind.device_count()?.max(1),
    };
    let gpu = Gpu::open(kind, ordinal)?;
    Communicator::new(Arc::new(bs), gpu)
}

/// Applies the optional deadline and host identity to `cfg`.
fn configure(
    mut cfg: BootstrapConfig,
    timeout_ms: Option<u64>,
    host_id: Option<String>,
) -> PyResult<BootstrapConfig> {
    if let Some(ms) = timeout_ms {
        if ms == 0 {
            return Err(invalid("timeout_ms must be positive"));
        }
        cfg = cfg.with_timeout(Duration::from_millis(ms));
    }
    if let Some(h) = host_id {
        cfg = cfg.with_host_id(h);
    }
    Ok(cfg)
}

#[pymethods]
impl Comm {
    /// Joins the world of `uid` as `rank` of `size` (every rank calls it; rank 0 of the
    /// process that created `uid` serves the root from the listener `uid` holds).
    #[staticmethod]
    #[pyo3(signature = (uid, rank, size, device=None, backend=None, timeout_ms=None, host_id=None))]
    #[allow(clippy::too_many_arguments)]
    fn init(
        py: Python<'_>,
        uid: &UniqueId,
        rank: usize,
        size: usize,
        device: Option<usize>,
        backend: Option<&str>,
        timeout_ms: Option<u64>,
        host_id: Option<String>,
    ) -> PyResult<Self> {
        let cfg = configure(
            BootstrapConfig::new(rank, size, uid.id()),
            timeout_ms,
            host_id,
        )?;
        let listener = if rank == 0 { uid.take_listener() } else { None };
        let comm = py.detach(|| join(cfg, listener, backend, device)).py()?;
        Ok(Self::wrap(comm))
    }

    /// Joins the world whose root is the plain address `addr` (`ip:port`, `host:port` or
    /// `ifname:ip:port`; rank 0 listens there), authenticated by `secret`, the world's
    /// passphrase as `MSCCLPP_SECRET` holds it (16 characters or more, the same on every rank;
    /// 32 random bytes as hex are what to use; the key is derived from it once per process).
    /// `None`: not authenticated, and the library says so on standard error.
    #[staticmethod]
    #[pyo3(signature = (addr, rank, size, secret=None, device=None, backend=None, timeout_ms=None, host_id=None))]
    #[allow(clippy::too_many_arguments)]
    fn init_addr(
        py: Python<'_>,
        addr: &str,
        rank: usize,
        size: usize,
        secret: Option<&str>,
        device: Option<usize>,
        backend: Option<&str>,
        timeout_ms: Option<u64>,
        host_id: Option<String>,
    ) -> PyResult<Self> {
        let (ifname, root) = parse_root(addr).py()?;
        let mut cfg = BootstrapConfig::new(rank, size, RootSpec::Addr(root));
        if let Some(i) = ifname {
            cfg = cfg.with_ifname(i);
        }
        if let Some(s) = secret {
            let passphrase = Passphrase::new(s).ok_or_else(|| {
                invalid(format!(
                    "the secret is shorter than {} characters",
                    mscclpp::host::auth::MIN_PASSPHRASE_LEN
                ))
            })?;
            cfg = cfg.with_passphrase(passphrase);
        }
        let cfg = configure(cfg, timeout_ms, host_id)?;
        let comm = py.detach(|| join(cfg, None, backend, device)).py()?;
        Ok(Self::wrap(comm))
    }

    /// Joins the world the environment describes, as the Rust side reads it
    /// (`BootstrapConfig::from_env`): rank and size from `MSCCLPP_RANK`/`MSCCLPP_WORLD_SIZE`,
    /// torchrun's `RANK`/`WORLD_SIZE`, Open MPI's or Slurm's variables; the root from
    /// `MSCCLPP_UNIQUE_ID`, `MSCCLPP_BOOTSTRAP` or torchrun's `MASTER_ADDR`/`MASTER_PORT`.
    #[staticmethod]
    #[pyo3(signature = (device=None, backend=None, env=None))]
    fn from_env(
        py: Python<'_>,
        device: Option<usize>,
        backend: Option<&str>,
        env: Option<HashMap<String, String>>,
    ) -> PyResult<Self> {
        let cfg = match env {
            Some(vars) => BootstrapConfig::from_vars(&vars),
            None => BootstrapConfig::from_env(),
        }
        .py()?;
        let comm = py.detach(|| join(cfg, None, backend, device)).py()?;
        Ok(Self::wrap(comm))
    }

    /// This rank.
    #[getter]
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// Number of ranks.
    #[getter]
    fn size(&self) -> usize {
        self.comm.size()
    }

    /// `"cpu"` or `"cuda"`.
    #[getter]
    fn backend(&self) -> &'static str {
        backend_name(self.comm.gpu().kind())
    }

    /// The device ordinal.
    #[getter]
    fn device(&self) -> usize {
        self.comm.gpu().ordinal()
    }

    /// The device's name.
    #[getter]
    fn device_name(&self) -> String {
        self.comm.gpu().name()
    }

    /// `(node of every rank, local index of every rank)`: the node layout every rank shares
    /// (ranks grouped by host identity; `MSCCLPP_HOSTID` or `host_id` overrides it).
    fn layout(&self) -> (Vec<usize>, Vec<usize>) {
        let t = self.comm.topology();
        (0..t.size())
            .map(|r| {
                (
                    t.node_of(r).unwrap_or_default(),
                    t.local_index_of(r).unwrap_or_default(),
                )
            })
            .unzip()
    }

    /// Waits until every rank calls it (the bootstrap's barrier).
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.comm.barrier()).py()
    }

    /// Every rank's `data` (all of the same length), in rank order.
    fn all_gather_bytes<'py>(
        &self,
        py: Python<'py>,
        data: &[u8],
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let all = py.detach(|| self.comm.all_gather(data)).py()?;
        Ok(all.iter().map(|b| PyBytes::new(py, b)).collect())
    }

    /// Rank `root`'s `data` on every rank (the others pass any bytes, which are ignored).
    fn broadcast_bytes<'py>(
        &self,
        py: Python<'py>,
        root: usize,
        data: &[u8],
    ) -> PyResult<Bound<'py, PyBytes>> {
        if root >= self.comm.size() {
            return Err(Error::NoSuchRank {
                rank: root,
                size: self.comm.size(),
            })
            .py();
        }
        let mut buf = data.to_vec();
        py.detach(|| self.comm.broadcast(root, &mut buf)).py()?;
        Ok(PyBytes::new(py, &buf))
    }

    /// Sends `data` to `peer` under `tag` (below 2^32); the peer takes it with `recv_bytes`.
    /// Messages of one (sender, tag) arrive in order.
    fn send_bytes(&self, py: Python<'_>, peer: usize, tag: u64, data: &[u8]) -> PyResult<()> {
        let tag = BYTES_TAG | check_tag(tag)?;
        py.detach(|| self.comm.bootstrap().send(peer, tag, data))
            .py()
    }

    /// The next message `peer` sent under `tag` (waits up to the bootstrap's deadline).
    fn recv_bytes<'py>(
        &self,
        py: Python<'py>,
        peer: usize,
        tag: u64,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let tag = BYTES_TAG | check_tag(tag)?;
        let got = py.detach(|| self.comm.bootstrap().recv(peer, tag)).py()?;
        Ok(PyBytes::new(py, &got))
    }

    /// Splits the world (NCCL's `ncclCommSplit`; every rank calls it): ranks with the same
    /// `color` form a new communicator, ranked by `key`; `color=None` takes part and gets
    /// `None`.
    #[pyo3(signature = (color, key))]
    fn split(&self, py: Python<'_>, color: Option<u32>, key: i64) -> PyResult<Option<Self>> {
        let sub = py.detach(|| self.comm.split(color, key)).py()?;
        Ok(sub.map(Self::wrap))
    }

    /// Releases every device wait of this communicator and makes its later calls fail.
    fn abort(&self) {
        self.comm.abort();
    }

    /// Raises the error a rank should see now (a device wait that gave up, a dead peer, an
    /// abort); returns nothing when there is none.
    fn check(&self) -> PyResult<()> {
        match self.current_error() {
            Some(e) => Err(e).py(),
            None => Ok(()),
        }
    }

    /// Clears the abort flag and the device error record (after a count mismatch, say, to go
    /// on): only while no kernel of this communicator runs.
    fn reset_status(&self) {
        self.comm.status().reset();
    }

    /// The device address of the `DeviceStatus` (abort flag and error record) every handle of
    /// this communicator carries.
    #[getter]
    fn status_ptr(&self) -> u64 {
        self.comm.status().device_ptr().addr()
    }

    fn __repr__(&self) -> String {
        format!(
            "Comm(rank {} of {}, {} device {})",
            self.comm.rank(),
            self.comm.size(),
            backend_name(self.comm.gpu().kind()),
            self.comm.gpu().ordinal()
        )
    }
}

/// `tag` if it is one of Python's (below [`MAX_TAG`]).
pub fn check_tag(tag: u64) -> PyResult<u64> {
    if tag < MAX_TAG {
        Ok(tag)
    } else {
        Err(invalid(format!("tag {tag} is not below 2^32")))
    }
}
