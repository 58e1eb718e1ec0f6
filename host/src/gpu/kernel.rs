//! What a caller needs to launch a kernel on either backend: its [`KernelSpec`], the loaded
//! [`Module`], the [`Kernel`] ready to launch and the [`LaunchConfig`].

use super::{Gpu, cuda};
use crate::error::{Error, Result};

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

pub(super) enum ModuleImpl {
    Cuda(cuda::Module),
    Cpu,
}

/// Loaded kernels (CUDA: a `CUmodule`; CPU: the kernels' host functions).
pub struct Module {
    pub(super) gpu: Gpu,
    pub(super) imp: ModuleImpl,
}

impl Module {
    /// Looks up `spec` in the module: its PTX entry point (checking the parameter size where
    /// the driver reports it) on CUDA, its host function on the CPU backend.
    pub fn kernel<P: bytemuck::Pod>(&self, spec: KernelSpec<P>) -> Result<Kernel<P>> {
        let imp = match &self.imp {
            ModuleImpl::Cuda(m) => {
                let f = m.function(spec.name)?;
                if let Some(expected) = f.param_bytes() {
                    let got = std::mem::size_of::<P>();
                    if expected != got {
                        return Err(Error::ParamSize {
                            name: spec.name.to_string(),
                            expected,
                            got,
                        });
                    }
                }
                KernelImpl::Cuda(f)
            }
            ModuleImpl::Cpu => match spec.host {
                Some(h) => KernelImpl::Cpu(h),
                None => {
                    return Err(Error::Unsupported {
                        what: "a kernel with no host function",
                        backend: self.gpu.kind(),
                    });
                }
            },
        };
        Ok(Kernel { spec, imp })
    }
}

pub(super) enum KernelImpl<P> {
    Cuda(cuda::Function),
    Cpu(unsafe fn(P)),
}

/// A kernel ready to launch with parameters `P`.
pub struct Kernel<P> {
    pub(super) spec: KernelSpec<P>,
    pub(super) imp: KernelImpl<P>,
}

impl<P> Kernel<P> {
    /// The entry point name.
    pub fn name(&self) -> &'static str {
        self.spec.name
    }
}
