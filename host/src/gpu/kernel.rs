//! What a caller needs to launch a kernel on either backend.

/// A kernel: its PTX entry point and, for the CPU backend, the same function compiled for the
/// host. Declared once per kernel (see `mscclpp::kernels`); `P` is its parameter struct.
pub struct KernelSpec<P> {
    /// PTX entry point (the function's unmangled name).
    pub name: &'static str,
    /// The host build of the kernel, run by the grid emulator; `None` for PTX-only kernels.
    pub host: Option<unsafe fn(P)>,
}

impl<P> Clone for KernelSpec<P> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<P> Copy for KernelSpec<P> {}

impl<P> KernelSpec<P> {
    /// A kernel available on both backends.
    pub const fn new(name: &'static str, host: unsafe fn(P)) -> Self {
        Self {
            name,
            host: Some(host),
        }
    }

    /// A kernel that exists only as PTX (a user module loaded from a file).
    pub const fn ptx_only(name: &'static str) -> Self {
        Self { name, host: None }
    }
}

/// Grid, block and dynamic shared memory of a launch (1-D).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks.
    pub grid: u32,
    /// Threads per block.
    pub block: u32,
    /// Dynamic shared memory per block, bytes.
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// `grid` blocks of `block` threads, no shared memory.
    pub const fn new(grid: u32, block: u32) -> Self {
        Self {
            grid,
            block,
            shared_mem_bytes: 0,
        }
    }

    /// With `bytes` of dynamic shared memory per block.
    pub const fn with_shared_mem(self, bytes: u32) -> Self {
        Self {
            shared_mem_bytes: bytes,
            ..self
        }
    }
}
