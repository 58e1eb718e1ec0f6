//! [`UniqueId`]: the root's address, the session magic and the world's secret, as one Python
//! object. The rank-0 process makes it with [`UniqueId::create`], which also binds the root's
//! listener and keeps it inside the object until rank 0 joins (so no other process can take
//! the port in between); the other ranks get its 72 bytes (`to_bytes`, or `hex`) by any means
//! (a `torch.distributed` broadcast, a file, an environment variable) and rebuild it with
//! [`UniqueId::from_bytes`].

use std::net::SocketAddr;
use std::sync::Mutex;

use mscclpp::host::bootstrap::{RootListener, UNIQUE_ID_BYTES, UniqueId as HostId, local_ip};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::{IntoPy, invalid};

/// A world's unique id (module docs).
#[pyclass(frozen, module = "mscclpp_rs._native")]
pub struct UniqueId {
    id: HostId,
    /// The root's listener, until rank 0 of this process takes it.
    listener: Mutex<Option<RootListener>>,
}

impl UniqueId {
    /// The id.
    pub fn id(&self) -> HostId {
        self.id
    }

    /// The root's listener, if this object holds it (once).
    pub fn take_listener(&self) -> Option<RootListener> {
        self.listener
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
    }
}

#[pymethods]
impl UniqueId {
    /// A fresh id whose root listens at `addr` (`ip:port`, port 0 for any free one; default:
    /// the address of this host that `MSCCLPP_SOCKET_IFNAME` names or that routes outward,
    /// any port). Random magic and secret.
    #[staticmethod]
    #[pyo3(signature = (addr=None))]
    fn create(py: Python<'_>, addr: Option<&str>) -> PyResult<Self> {
        let addr: SocketAddr = match addr {
            Some(a) => a
                .parse()
                .map_err(|e| invalid(format!("{a:?} is not ip:port: {e}")))?,
            None => {
                let ifname = std::env::var(mscclpp::host::bootstrap::env::SOCKET_IFNAME).ok();
                SocketAddr::new(local_ip(ifname.as_deref()).py()?, 0)
            }
        };
        let (id, listener) = py.detach(|| HostId::bind(addr)).py()?;
        Ok(Self {
            id,
            listener: Mutex::new(Some(listener)),
        })
    }

    /// The id encoded in `data` (the 72 bytes of `to_bytes`).
    #[staticmethod]
    fn from_bytes(data: &[u8]) -> PyResult<Self> {
        Ok(Self {
            id: HostId::from_bytes(data).py()?,
            listener: Mutex::new(None),
        })
    }

    /// The id written as hex (`hex()`, `MSCCLPP_UNIQUE_ID`).
    #[staticmethod]
    fn from_hex(text: &str) -> PyResult<Self> {
        Ok(Self {
            id: HostId::from_hex(text).py()?,
            listener: Mutex::new(None),
        })
    }

    /// Its 72 bytes (they hold the world's secret: hand them only to the world's ranks).
    fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.id.to_bytes())
    }

    /// Its 144 hex characters (what `MSCCLPP_UNIQUE_ID` holds).
    fn hex(&self) -> String {
        self.id.to_hex()
    }

    /// The root's address, `ip:port`.
    #[getter]
    fn root(&self) -> String {
        self.id.root().to_string()
    }

    /// Whether the secret is a real one (random, or from a passphrase), not derived from the
    /// root's address.
    #[getter]
    fn authenticated(&self) -> bool {
        self.id.is_authenticated()
    }

    /// Whether this object still holds the root's listener (rank 0 of this process has not
    /// joined with it yet).
    #[getter]
    fn holds_listener(&self) -> bool {
        self.listener
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .is_some()
    }

    /// Bytes in an encoded id.
    #[classattr]
    const BYTES: usize = UNIQUE_ID_BYTES;

    fn __repr__(&self) -> String {
        format!("UniqueId(root {})", self.id.root())
    }
}
