//! The backend every communicator of the process uses, chosen once (`MSCCLPP_BACKEND`, else
//! CUDA when a device exists, else CPU: `BackendKind::select`) and kept, so that a call reads
//! no environment variable, and, on CUDA, the guard that gives the caller back its current
//! context after every exported function ([`KeepCaller`]).
//!
//! Shared state: the choice (a `OnceLock`, set by the first caller).

use std::sync::OnceLock;

use mscclpp::host::Error;
use mscclpp::host::gpu::{BackendKind, cuda};

/// The process's backend, or why none can be chosen (kept too: an unknown `MSCCLPP_BACKEND`
/// stays unknown).
pub fn kind() -> Result<BackendKind, &'static Error> {
    static KIND: OnceLock<Result<BackendKind, Error>> = OnceLock::new();
    KIND.get_or_init(BackendKind::select).as_ref().copied()
}

/// While alive, on the CUDA backend, the calling thread's current context as the caller left
/// it, made current again when dropped (NCCL gives a caller back its context); nothing on the
/// CPU backend.
pub struct KeepCaller {
    _held: Option<cuda::KeepContext>,
}

impl KeepCaller {
    /// Remembers the caller's context (none if it cannot be read: nothing to give back).
    pub fn new() -> Self {
        Self {
            _held: match kind() {
                Ok(BackendKind::Cuda) => cuda::KeepContext::new().ok(),
                _ => None,
            },
        }
    }
}
