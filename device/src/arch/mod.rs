//! The only home of `asm!` in the project, and its host twin.
//!
//! `nvptx` (compiled for `nvptx64-nvidia-cuda`) and `host` (every other target, used by the CPU
//! backend) export the same functions with the same signatures and the same memory-model
//! meaning; the rest of the device crate calls them through this module and never cares which
//! is in use. Names spell operation, ordering, scope and width: `ld_acquire_sys_u64`,
//! `st_release_sys_v2_u64`, `red_add_release_sys_u64`, `atom_add_relaxed_gpu_u64`.
//!
//! Never use `core::sync::atomic` read-modify-writes in device code: on nvptx with rustc 1.95
//! (LLVM 22) `fetch_add`/`swap` lose their ordering and scope. Use these functions.

#[cfg(target_arch = "nvptx64")]
mod nvptx;
#[cfg(target_arch = "nvptx64")]
pub use nvptx::*;

#[cfg(not(target_arch = "nvptx64"))]
pub mod host;
#[cfg(not(target_arch = "nvptx64"))]
pub use host::*;

/// Index of this thread in the whole 1-D grid.
#[inline(always)]
pub fn global_thread_idx() -> u32 {
    block_idx_x() * block_dim_x() + thread_idx_x()
}

/// Threads in the whole 1-D grid.
#[inline(always)]
pub fn global_thread_count() -> u32 {
    grid_dim_x() * block_dim_x()
}
