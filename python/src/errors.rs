//! The library's errors as Python exceptions.
//!
//! The exception classes live in Python (`mscclpp_rs/errors.py`), where they can also derive
//! from Python's own (`TimeoutError`, `ValueError`, `ConnectionError`); this module only picks
//! the class for an error and builds the instance with the error's text (the error and its
//! causes on one line, as [`mscclpp::ErrorChain`] writes them) and the name of the Rust variant
//! (`Error::CountMismatch` is `"CountMismatch"`). The table is [`class_of`]; an error it does
//! not name raises the base class, `MscclppError`.

use mscclpp::ErrorChain;
use mscclpp::host::Error;
use mscclpp::host::error::ProxyError;
use mscclpp::host::error::TransportErrorKind;
use mscclpp::shared::DeviceErrorCode;
use pyo3::prelude::*;

/// The Python module that defines the classes.
const ERRORS_MODULE: &str = "mscclpp_rs.errors";

/// The Python exception class (a name in `mscclpp_rs.errors`) of a library error.
pub fn class_of(e: &Error) -> &'static str {
    match e {
        Error::BootstrapTimeout { .. }
        | Error::BootstrapMissingRanks { .. }
        | Error::SetupTimeout { .. }
        | Error::SemaphoreTimeout { .. }
        | Error::FlushTimeout { .. }
        | Error::Transport {
            kind: TransportErrorKind::Timeout,
            ..
        } => "CommTimeoutError",
        Error::Device { code, .. } => match code {
            DeviceErrorCode::Timeout => "CommTimeoutError",
            DeviceErrorCode::Aborted => "AbortedError",
            _ => "DeviceError",
        },
        Error::Remote { .. }
        | Error::BootstrapPeerClosed { .. }
        | Error::BootstrapPeerGone { .. }
        | Error::Transport {
            kind: TransportErrorKind::PeerClosed,
            ..
        }
        | Error::SemaphorePeer { .. }
        | Error::Proxy(ProxyError::ProxyFailed { .. }) => "RemoteError",
        Error::Aborted { .. } => "AbortedError",
        Error::CountMismatch { .. } => "CountMismatchError",
        Error::UnknownBackend(_)
        | Error::NoSuchDevice { .. }
        | Error::NoSuchRank { .. }
        | Error::PeerIsSelf { .. }
        | Error::OutOfRange { .. }
        | Error::LengthMismatch { .. }
        | Error::PerRankLength { .. }
        | Error::UnknownAddress { .. }
        | Error::UnknownStream { .. }
        | Error::StreamDevice { .. }
        | Error::BootstrapConfig(_)
        | Error::BootstrapUniqueId { .. }
        | Error::NotRegistrable { .. }
        | Error::RegisterEmpty { .. }
        | Error::RegisterNoTransport { .. }
        | Error::UnknownRegistration { .. }
        | Error::Proxy(ProxyError::UnknownChannelId { .. })
        | Error::UnknownNetTransport { .. }
        | Error::Proxy(ProxyError::FifoSize { .. })
        | Error::CountOverflow { .. }
        | Error::NullBuffer { .. } => "InvalidArgumentError",
        Error::Unsupported { .. }
        | Error::CrossNode { .. }
        | Error::NoCommonTransport { .. }
        | Error::TransportUnavailable { .. }
        | Error::Transport {
            kind: TransportErrorKind::Unavailable,
            ..
        }
        | Error::NoLibcuda => "UnsupportedError",
        Error::ConfigMismatch { .. }
        | Error::DuplicateGpu { .. }
        | Error::GpuShareTooSmall { .. }
        | Error::WindowMismatch { .. }
        | Error::RegistryFull { .. }
        | Error::RegistrationRefused { .. }
        | Error::SelfMismatch { .. }
        | Error::Proxy(ProxyError::ProxyTableFull { .. })
        | Error::MemoryNotMapped { .. }
        | Error::TransportMismatch { .. }
        | Error::UnevenNodes { .. } => "InvalidUsageError",
        Error::BootstrapInterface { .. }
        | Error::BootstrapListen { .. }
        | Error::BootstrapConnect { .. }
        | Error::BootstrapBadMagic { .. }
        | Error::BootstrapVersion { .. }
        | Error::BootstrapMalformed { .. }
        | Error::BootstrapRejected { .. }
        | Error::BootstrapIo { .. }
        | Error::BootstrapInvalidPeer { .. }
        | Error::BootstrapMessageTooLarge { .. }
        | Error::BootstrapSpawn { .. }
        | Error::BootstrapAuth { .. }
        | Error::BootstrapQueueFull { .. }
        | Error::BootstrapRankTaken { .. } => "BootstrapError",
        Error::CudaInit(_)
        | Error::DeviceOpen { .. }
        | Error::Alloc { .. }
        | Error::HostAlloc { .. }
        | Error::IpcExport { .. }
        | Error::IpcInvalid { .. }
        | Error::IpcOpen { .. }
        | Error::PeerAccess { .. }
        | Error::Stream { .. }
        | Error::CurrentDevice { .. }
        | Error::CaptureMode { .. }
        | Error::Copy { .. }
        | Error::ModuleLoad { .. }
        | Error::PtxTarget { .. }
        | Error::MissingKernel { .. }
        | Error::ParamSize { .. }
        | Error::Launch { .. } => "DeviceError",
        _ => "MscclppError",
    }
}

/// The Rust variant's name: the identifier its `Debug` form starts with.
pub fn variant_of(e: &Error) -> String {
    let debug = format!("{e:?}");
    debug
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// `e` as an instance of its Python class (`class_of`), carrying its text and variant. If the
/// errors module cannot be imported (a broken installation), a `RuntimeError` with the same
/// text, so the error is never lost.
pub fn to_py(e: Error) -> PyErr {
    let text = ErrorChain(&e).to_string();
    let (class, variant) = (class_of(&e), variant_of(&e));
    Python::attach(|py| raise(py, class, &text, &variant))
}

/// An exception of class `class` of `mscclpp_rs.errors` with `text` and `variant` (also for
/// errors this crate finds itself, with an empty variant).
pub fn raise(py: Python<'_>, class: &str, text: &str, variant: &str) -> PyErr {
    let built = py
        .import(ERRORS_MODULE)
        .and_then(|m| m.getattr(class))
        .and_then(|c| c.call1((text, variant)));
    match built {
        Ok(instance) => PyErr::from_value(instance),
        Err(import_failed) => pyo3::exceptions::PyRuntimeError::new_err(format!(
            "{text} (and {ERRORS_MODULE}.{class} is unavailable: {import_failed})"
        )),
    }
}

/// An `InvalidArgumentError` this crate found (no Rust variant).
pub fn invalid(text: impl AsRef<str>) -> PyErr {
    Python::attach(|py| raise(py, "InvalidArgumentError", text.as_ref(), ""))
}

/// `Result<T, Error>` → `PyResult<T>`.
pub trait IntoPy<T> {
    /// Maps the library's error to its Python exception.
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for Result<T, Error> {
    fn py(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}
