//! What a caller needs to launch a kernel on either backend: its [`KernelSpec`], the loaded
//! [`Module`], the [`Kernel`] ready to launch and the [`LaunchConfig`].

use super::{Gpu, cuda};
use crate::error::{Error, Result};

/// A kernel: its PTX entry point and, for the CPU backend, the same function compiled for the
/// host. Declared once per kernel (see `mscclpp::kernels`); `P` is its parameter struct.
///
/// [`kernel_spec!`](crate::kernel_spec) builds one from the kernel's path, so the entry point's
/// name cannot be misspelt; with [`KernelSpec::new`] a wrong name is caught when the module is
/// asked for it (`Module::kernel`: `Error::MissingKernel`, on either backend).
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
    /// The PTX's entry points and their parameter bytes (the kernels themselves are the
    /// specs' host functions); `None` for empty PTX (a `MSCCLPP_SKIP_PTX=1` build), which
    /// names none, so nothing is checked.
    Cpu {
        entries: Option<std::collections::HashMap<String, Option<usize>>>,
    },
}

/// Loaded kernels (CUDA: a `CUmodule`; CPU: the PTX's entry points, run from the kernels' host
/// functions).
pub struct Module {
    pub(super) gpu: Gpu,
    pub(super) imp: ModuleImpl,
}

impl Module {
    /// Looks up `spec` in the module: its PTX entry point, checking that the parameter struct
    /// `P` has the size the entry point takes. On CUDA the driver finds the entry point and
    /// reports its parameters (from CUDA 12.4); on the CPU backend the loaded PTX text says
    /// both, and the spec's host function runs. Either way a name the PTX lacks is
    /// [`Error::MissingKernel`] and a wrong size [`Error::ParamSize`], so a misspelt name fails
    /// without a GPU too.
    pub fn kernel<P: bytemuck::Pod>(&self, spec: KernelSpec<P>) -> Result<Kernel<P>> {
        let size_check = |expected: Option<usize>| match expected {
            Some(expected) if expected != std::mem::size_of::<P>() => Err(Error::ParamSize {
                name: spec.name.to_string(),
                expected,
                got: std::mem::size_of::<P>(),
            }),
            _ => Ok(()),
        };
        let imp = match &self.imp {
            ModuleImpl::Cuda(m) => {
                let f = m.function(spec.name)?;
                size_check(f.param_bytes())?;
                KernelImpl::Cuda(f)
            }
            ModuleImpl::Cpu { entries } => {
                if let Some(entries) = entries {
                    let Some(&bytes) = entries.get(spec.name) else {
                        return Err(Error::MissingKernel {
                            name: spec.name.to_string(),
                        });
                    };
                    size_check(bytes)?;
                }
                match spec.host {
                    Some(h) => KernelImpl::Cpu(h),
                    None => {
                        return Err(Error::Unsupported {
                            what: "a kernel with no host function",
                            backend: self.gpu.kind(),
                        });
                    }
                }
            }
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

    /// The most threads a block of this kernel may have: on CUDA what its registers allow
    /// (`CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK`, 1024 at most); on the CPU backend `None`
    /// (no limit of its own).
    pub fn max_threads_per_block(&self) -> Result<Option<u32>> {
        match &self.imp {
            KernelImpl::Cuda(f) => {
                f.max_threads_per_block()
                    .map(Some)
                    .map_err(|source| Error::KernelAttribute {
                        name: self.spec.name.to_string(),
                        source,
                    })
            }
            KernelImpl::Cpu(_) => Ok(None),
        }
    }
}

/// The [`KernelSpec`] of a kernel declared with `mscclpp_device::kernel!`, from the path of its
/// function: `kernel_spec!(my_kernels::ping_pong)` is
/// `KernelSpec::new("ping_pong", my_kernels::ping_pong)`. The PTX entry point is the
/// function's own name, so the two cannot disagree. Name the function as it is declared (a
/// path ending in its name, not a `use … as` alias). Usable in a `const`.
///
/// ```
/// use mscclpp_host::gpu::KernelSpec;
///
/// mod my_kernels {
///     /// Stands for a kernel's host build (`kernel!` makes it `pub unsafe fn`).
///     pub unsafe fn ping_pong(_p: u64) {}
/// }
///
/// const PING_PONG: KernelSpec<u64> = mscclpp_host::kernel_spec!(my_kernels::ping_pong);
/// assert_eq!(PING_PONG.name, "ping_pong");
/// assert!(PING_PONG.host.is_some());
/// ```
#[macro_export]
macro_rules! kernel_spec {
    ($($path:ident)::+) => {
        $crate::gpu::KernelSpec::new($crate::__kernel_spec_name!($($path)::+), $($path)::+)
    };
}

/// The last segment of a path, as a string (for [`kernel_spec!`]).
#[doc(hidden)]
#[macro_export]
macro_rules! __kernel_spec_name {
    ($last:ident) => {
        ::core::stringify!($last)
    };
    ($first:ident :: $($rest:ident)::+) => {
        $crate::__kernel_spec_name!($($rest)::+)
    };
}

#[cfg(test)]
mod tests {
    use super::KernelSpec;

    mod kernels {
        pub mod deeper {
            pub unsafe fn all_reduce(_p: u32) {}
        }
        pub unsafe fn copy(_p: [u8; 4]) {}
    }

    #[test]
    fn kernel_spec_names_the_function() {
        const COPY: KernelSpec<[u8; 4]> = crate::kernel_spec!(self::kernels::copy);
        let deep: KernelSpec<u32> = crate::kernel_spec!(kernels::deeper::all_reduce);
        assert_eq!((COPY.name, deep.name), ("copy", "all_reduce"));
        use kernels::copy;
        assert_eq!(crate::kernel_spec!(copy).name, "copy");
        assert!(
            COPY.host
                .is_some_and(|h| std::ptr::fn_addr_eq(h, kernels::copy as unsafe fn([u8; 4])))
        );
    }
}
