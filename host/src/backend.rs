//! [`BackendKind`]: which implementation runs "device" work. Only the enum lives here, below
//! the error type that names it; selecting a backend, parsing its name and counting its devices
//! are in `gpu`, which re-exports it as `gpu::BackendKind`.

/// Which implementation runs "device" work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// NVIDIA GPUs through the CUDA driver API (libcuda loaded at run time).
    Cuda,
    /// Shared-memory "device" memory and kernels on OS threads.
    Cpu,
}
