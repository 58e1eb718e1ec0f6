//! Modules and kernel entry points of the `cuda` backend. A [`Module`] and every [`Function`]
//! taken from it share one `Arc` of the loaded `CUmodule`, so the module is unloaded only when
//! the last of them is dropped; both are `Send + Sync` and usable from any thread.

use std::ffi::{CString, c_int, c_void};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys;

use super::release::Held;
use super::{Context, result};
use crate::error::{BackendError, DriverError, Error, Result};
use crate::gpu::ptx::{PtxInfo, SmArch};

/// What ptxas (and so the driver's JIT) writes to its log for a `.target` above the GPU it
/// compiles for.
const TARGET_TOO_NEW_LOG: &str = "SM version specified by .target is higher";

/// Whether a failed load of PTX built for `target` on a device of architecture `device` failed
/// because the PTX is for a newer GPU. The driver answers such PTX with
/// `CUDA_ERROR_INVALID_PTX` and ptxas's "SM version specified by .target is higher than
/// default SM version assumed" in the JIT log (the same message `ptxas -arch=sm_80` gives for
/// `.target sm_90` offline); `CUDA_ERROR_NO_BINARY_FOR_GPU` is taken as the same failure when
/// the target is too new. [`Module::load_ptx`] refuses such PTX before the driver sees it;
/// this is the net under that check (a target it could not read).
pub(crate) fn is_target_too_new(
    error: &DriverError,
    log: &str,
    target: Option<SmArch>,
    device: SmArch,
) -> bool {
    let jit_failed = error.code == sys::CUresult::CUDA_ERROR_INVALID_PTX as u32
        || error.code == sys::CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU as u32;
    jit_failed && (log.contains(TARGET_TOO_NEW_LOG) || target.is_some_and(|t| !t.runs_on(device)))
}

/// The loaded `CUmodule`; unloaded on drop.
#[derive(Debug)]
struct Loaded {
    ctx: Arc<Context>,
    raw: sys::CUmodule,
}

// SAFETY: a `CUmodule` is a driver handle usable from any thread with its context current
// (every use binds it); `Loaded` only stores it.
unsafe impl Send for Loaded {}
// SAFETY: as above; nothing mutates `Loaded`.
unsafe impl Sync for Loaded {}

impl Drop for Loaded {
    /// Unloads the module (every `Function` of it held an `Arc` of `self`, so none is left),
    /// or holds the unload back while ranks of this process share the device (`release.rs`).
    fn drop(&mut self) {
        self.ctx
            .sharing
            .release(&self.ctx, Held::Module(self.raw as usize));
    }
}

/// Why empty PTX text is refused: the usual cause is a build with `MSCCLPP_SKIP_PTX=1`
/// (mscclpp's `build.rs`), which embeds an empty `DEVICE_PTX` for CPU-backend runs.
pub(crate) const EMPTY_PTX: &str = "the PTX text is empty: a build with MSCCLPP_SKIP_PTX=1 \
    embeds no device code (it serves the CPU backend only); rebuild without that variable";

/// A loaded module (PTX JIT-compiled by the driver, or a cubin/fatbin).
#[derive(Debug)]
pub struct Module {
    loaded: Arc<Loaded>,
}

impl Module {
    /// Loads PTX text for a device of architecture `device`; `what` names it in errors. Empty
    /// PTX (a `MSCCLPP_SKIP_PTX=1` build) is [`Error::ModuleLoad`] saying so. PTX
    /// whose `.target` is newer than the device is refused with [`Error::PtxTarget`] (the
    /// driver would only say that the JIT failed).
    pub(super) fn load_ptx(
        ctx: Arc<Context>,
        device: SmArch,
        ptx: &str,
        what: &str,
    ) -> Result<Self> {
        if ptx.trim().is_empty() {
            return Err(Error::ModuleLoad {
                what: what.to_string(),
                ordinal: ctx.ordinal(),
                source: BackendError::Invalid(EMPTY_PTX.to_string()),
            });
        }
        let target = PtxInfo::parse(ptx).target;
        let too_new = |target: Option<SmArch>| Error::PtxTarget {
            what: what.to_string(),
            ordinal: ctx.ordinal(),
            target: target.map_or_else(|| "a newer GPU".to_string(), |t| t.to_string()),
            device: device.to_string(),
        };
        if target.is_some_and(|t| !t.runs_on(device)) {
            return Err(too_new(target));
        }
        let text = CString::new(ptx).map_err(|e| Error::ModuleLoad {
            what: what.to_string(),
            ordinal: ctx.ordinal(),
            source: BackendError::Invalid(format!(
                "PTX text has a NUL byte at {}",
                e.nul_position()
            )),
        })?;
        // SAFETY: `text` is NUL-terminated PTX and outlives the call.
        match unsafe { Self::load(ctx.clone(), text.as_ptr().cast(), what) } {
            Err(Error::ModuleLoad {
                source: BackendError::Jit { source, log },
                ..
            }) if is_target_too_new(&source, &log, target, device) => Err(too_new(target)),
            Err(Error::ModuleLoad {
                source: BackendError::Driver(source),
                ..
            }) if is_target_too_new(&source, "", target, device) => Err(too_new(target)),
            other => other,
        }
    }

    /// Loads a cubin or fatbin image; `what` names it in errors.
    pub(super) fn load_image(ctx: Arc<Context>, image: &[u8], what: &str) -> Result<Self> {
        if image.is_empty() {
            return Err(Error::ModuleLoad {
                what: what.to_string(),
                ordinal: ctx.ordinal(),
                source: BackendError::Invalid("empty module image".to_string()),
            });
        }
        // SAFETY: `image` outlives the call. The driver reads the image's length from its own
        // (ELF / fatbin) header: a truncated file is the one thing it cannot check, which is
        // why `Device::load_module_file` reads whole files only.
        unsafe { Self::load(ctx, image.as_ptr().cast(), what) }
    }

    /// # Safety
    /// `image` is a complete PTX (NUL-terminated), cubin or fatbin image readable during the call.
    unsafe fn load(ctx: Arc<Context>, image: *const c_void, what: &str) -> Result<Self> {
        let err = |source: BackendError| Error::ModuleLoad {
            what: what.to_string(),
            ordinal: ctx.ordinal(),
            source,
        };
        ctx.bind().map_err(|e| err(e.into()))?;
        // SAFETY: forwarded contract.
        let loaded = match unsafe { result::cu_module_load_data_ex(image) } {
            Ok(raw) => Loaded {
                ctx: ctx.clone(),
                raw,
            },
            Err((e, log)) if log.is_empty() => return Err(err(e.into())),
            Err((source, log)) => return Err(err(BackendError::Jit { source, log })),
        };
        // SAFETY: `loaded.raw` was just loaded and is owned by `loaded` (unloaded on error).
        unsafe { load_every_function(loaded.raw) }.map_err(|e| err(e.into()))?;
        Ok(Self {
            loaded: Arc::new(loaded),
        })
    }

    /// The entry point `name`: [`Error::MissingKernel`] if the module has none.
    pub fn function(&self, name: &str) -> Result<Function> {
        let ctx = &self.loaded.ctx;
        let missing = || Error::MissingKernel {
            name: name.to_string(),
        };
        let err = |e: DriverError| Error::ModuleLoad {
            what: format!("entry point {name:?}"),
            ordinal: ctx.ordinal(),
            source: e.into(),
        };
        let cname = CString::new(name).map_err(|_| missing())?;
        ctx.bind().map_err(err)?;
        // SAFETY: the module is live (we hold an `Arc` of it).
        match unsafe { result::cu_module_get_function(self.loaded.raw, &cname) } {
            Ok(raw) => {
                // Loaded with the module already (`load_every_function`); where the driver
                // could not enumerate them (before CUDA 12.4), this entry point now, which is
                // as early as the driver allows there.
                if result::has_symbol("cuFuncLoad") {
                    // SAFETY: `raw` was just returned for our live module.
                    unsafe { result::cu_func_load(raw) }.map_err(err)?;
                }
                Ok(Function {
                    loaded: self.loaded.clone(),
                    raw,
                    name: name.to_string(),
                    layout: OnceLock::new(),
                    max_dynamic_shared: AtomicU32::new(0),
                })
            }
            Err(e) if e.code == sys::CUresult::CUDA_ERROR_NOT_FOUND as u32 => Err(missing()),
            Err(e) => Err(err(e)),
        }
    }
}

/// With lazy loading (the driver's default since CUDA 12.2), a function's code is loaded at
/// its first launch or `cuFuncLoad`, and that load waits for kernels already running in the
/// context: a kernel spinning until a peer's kernel runs — every collective, and the users'
/// channel kernels — keeps the peer's kernel from ever loading when both ranks share a
/// context (ranks as threads on one GPU). So a module loads every function before
/// [`Module`] is returned, before any launch can depend on it, whatever the loading mode
/// (`CUDA_MODULE_LOADING`). Drivers before CUDA 12.4 cannot enumerate a module's functions
/// (nor `cuFuncLoad` them): there each function loads when [`Module::function`] takes it.
///
/// # Safety
/// `module` is live.
unsafe fn load_every_function(module: sys::CUmodule) -> std::result::Result<(), DriverError> {
    if !result::has_symbol("cuFuncLoad") || !result::has_symbol("cuModuleEnumerateFunctions") {
        return Ok(());
    }
    if !result::cu_module_loading_is_lazy()? {
        return Ok(());
    }
    // SAFETY: forwarded contract.
    for f in unsafe { result::cu_module_functions(module) }? {
        // SAFETY: `f` was just enumerated from the live `module`.
        unsafe { result::cu_func_load(f) }?;
    }
    Ok(())
}

/// A kernel entry point of a [`Module`] (keeps the module loaded).
#[derive(Debug)]
pub struct Function {
    loaded: Arc<Loaded>,
    raw: sys::CUfunction,
    name: String,
    /// (offset, size) of each parameter, once asked; `None` if the driver cannot say.
    layout: OnceLock<Option<Vec<(usize, usize)>>>,
    /// Largest dynamic shared memory opted in so far (0: only the default 48 KiB).
    max_dynamic_shared: AtomicU32,
}

// SAFETY: a `CUfunction` is a driver handle usable from any thread with its context current
// (every use binds it); the only mutable state is atomic or a `OnceLock`.
unsafe impl Send for Function {}
// SAFETY: as above.
unsafe impl Sync for Function {}

/// More parameters than any real kernel has: stops the `cuFuncGetParamInfo` walk.
const MAX_PARAMS: usize = 4096;

impl Function {
    /// The entry point's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(super) fn raw(&self) -> sys::CUfunction {
        self.raw
    }

    /// Total bytes of the entry point's parameters (last offset + last size), from
    /// `cuFuncGetParamInfo`; `None` where the loaded driver lacks it (before CUDA 12.4) or it
    /// fails.
    pub fn param_bytes(&self) -> Option<usize> {
        self.param_layout()
            .map(|l| l.last().map_or(0, |&(off, size)| off + size))
    }

    /// (offset, size) of every parameter, asked once.
    pub(super) fn param_layout(&self) -> Option<&[(usize, usize)]> {
        self.layout.get_or_init(|| self.query_layout()).as_deref()
    }

    fn query_layout(&self) -> Option<Vec<(usize, usize)>> {
        if !result::has_symbol("cuFuncGetParamInfo") {
            return None;
        }
        let warn = |e: &DriverError| {
            tracing::warn!(kernel = %self.name, error = %e, "cannot read the kernel's parameter layout");
        };
        if let Err(e) = self.loaded.ctx.bind() {
            warn(&e);
            return None;
        }
        let mut layout = Vec::new();
        for index in 0..MAX_PARAMS {
            // SAFETY: `self.raw` is live (we hold the module) and the symbol exists (checked).
            match unsafe { result::cu_func_get_param_info(self.raw, index) } {
                Ok(p) => layout.push(p),
                Err(e) if e.code == sys::CUresult::CUDA_ERROR_INVALID_VALUE as u32 => {
                    return Some(layout);
                }
                Err(e) => {
                    warn(&e);
                    return None;
                }
            }
        }
        None
    }

    /// Opts the kernel in to `bytes` of dynamic shared memory (once per new maximum).
    pub(super) fn allow_dynamic_shared(&self, bytes: u32) -> std::result::Result<(), BackendError> {
        if bytes <= self.max_dynamic_shared.load(Ordering::Relaxed) {
            return Ok(());
        }
        let value = c_int::try_from(bytes)
            .map_err(|_| BackendError::Invalid(format!("{bytes} bytes of shared memory")))?;
        // SAFETY: `self.raw` is live; the caller made its context current.
        unsafe {
            result::cu_func_set_attribute(
                self.raw,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                value,
            )
        }?;
        self.max_dynamic_shared.fetch_max(bytes, Ordering::Relaxed);
        Ok(())
    }
}
