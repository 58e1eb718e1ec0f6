//! # mscclpp-device
//!
//! The device side of mscclpp-rs: the API GPU kernels use (FIFO, semaphores, channels, packets,
//! thread indices, barriers) and every built-in kernel, in `no_std` Rust.
//!
//! This crate compiles twice:
//! - for `nvptx64-nvidia-cuda`, by the top-level `build.rs` (through `mscclpp-build`), into the
//!   PTX embedded in the host library as `mscclpp::DEVICE_PTX`;
//! - for the host, where the CPU backend's grid emulator ([`arch::host::grid`]) runs the same
//!   functions on OS threads.
//!
//! | module | holds |
//! |---|---|
//! | [`arch`] | every `asm!` (nvptx) and its host twin; thread indices, barriers, shared memory |
//! | [`wait`] | the bounded, abortable spin every wait goes through |
//! | [`fifo`] | FIFO push / poll / sync |
//! | [`semaphore`] | semaphore signal / wait / poll |
//! | [`port_channel`] | PortChannel: put / signal / flush through the host proxy |
//! | [`memory_channel`] | MemoryChannel: direct put / get / packets / signal / wait |
//! | [`packet`] | LL8 / LL16 packet write and read |
//! | [`ll128`] | LL128 lines: a warp's write and read of 128-byte lines |
//! | [`copy`] | collective copies |
//! | [`kernels`] | the built-in kernels |
//! | [`executor`] | the interpreter of MSCCL++ execution plans (`executor_kernel`) |
//! | [`trace`] | block events of traced kernels; the clock-sync kernel |
//! | [`test_kernels`] | kernels that single-GPU tests run GPU-only paths through |
//!
//! Kernels are declared with [`kernel!`]; a crate that declares kernels must enable the PTX ABI
//! for the nvptx build: `#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]`.
//!
//! ## Writing your own kernels
//!
//! A kernel crate of your own (`#![no_std]`, depending on this crate and `mscclpp-shared`) uses
//! the same API as the built-in kernels; `mscclpp-build` compiles it to PTX from your host
//! crate's `build.rs`, and the CPU backend runs its host build. `examples/user-kernels` and the
//! README section "Write your own kernel in Rust" walk through one. What CUDA C spells, here:
//!
//! | CUDA C | mscclpp-device |
//! |---|---|
//! | `__global__ void k(Params p)` | [`kernel!`]` { fn k(p: Params) { … } }`: one `#[repr(C)]` `Pod` struct by value |
//! | `threadIdx.x`, `blockIdx.x`, `blockDim.x`, `gridDim.x` | [`arch::thread_idx_x`], [`arch::block_idx_x`], [`arch::block_dim_x`], [`arch::grid_dim_x`] (1-D grids only) |
//! | `blockIdx.x * blockDim.x + threadIdx.x`, and the grid's size | [`arch::global_thread_idx`], [`arch::global_thread_count`] |
//! | `__syncthreads()` | [`arch::sync_threads`]: every thread of the block must reach it |
//! | `__syncthreads_or/_and/_count(pred)` | [`arch::sync_threads_or`], [`arch::sync_threads_and`], [`arch::sync_threads_count`] (a barrier that also combines one predicate per thread) |
//! | `extern __shared__ char smem[]` | [`arch::dynamic_shared_mem`]: this block's region, `LaunchConfig::with_shared_mem` bytes at launch, 16-byte aligned; [`arch::dynamic_shared_mem_size`] says how many (the CPU backend traps when a kernel asks for a region its launch did not give) |
//! | `MemoryChannelDeviceHandle::put/signal/wait/putPackets/unpackPackets` | [`prelude::MemoryChannel`] on [`shared::MemoryChannelDeviceHandle`] |
//! | `PortChannelDeviceHandle::put/signal/flush/wait` | [`prelude::PortChannel`] on [`shared::PortChannelDeviceHandle`] |
//! | `LL16Packet` / `LL8Packet` read with a flag | [`packet::read_packet`], [`packet::packets_for`], [`shared::LL16Packet`] |
//! | atomics with explicit scope and order | the functions of [`arch`] (never `core::sync::atomic` read-modify-writes) |
//!
//! A `signal` publishes the writes of the whole block when the block meets at `sync_threads`
//! first and one thread signals; the waiting side mirrors it (one thread waits, the block
//! meets, then reads). [`memory_channel`] gives the memory-model reasoning.
//!
//! Every wait (semaphore, packet, FIFO) is bounded and abortable: it returns
//! `Err(DeviceErrorCode)` after recording why in the `DeviceStatus` the handle carries, and the
//! kernel should return; [`wait::record_error`] records an error of your own. Device code must
//! not panic (the panic handler traps the whole kernel): keep indices checked up front.
#![no_std]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(abi_ptx, asm_experimental_arch, stdarch_nvptx)
)]

#[cfg(not(target_arch = "nvptx64"))]
extern crate std;

pub mod arch;
pub mod collectives;
pub mod copy;
pub mod executor;
pub mod fifo;
pub mod kernels;
pub mod ll128;
pub mod memory_channel;
pub mod packet;
pub mod port_channel;
pub mod reduce;
pub mod semaphore;
pub mod test_kernels;
pub mod trace;
pub mod wait;

pub use mscclpp_shared as shared;

/// The traits that give handles their device methods.
pub mod prelude {
    pub use crate::fifo::FifoDevice;
    pub use crate::memory_channel::MemoryChannel;
    pub use crate::packet::Packet;
    pub use crate::port_channel::PortChannel;
    pub use crate::semaphore::{Host2DeviceSemaphore, MemoryDevice2DeviceSemaphore};
}

/// Declares a kernel: one parameter struct by value.
///
/// On nvptx it becomes an `extern "ptx-kernel"` entry point with an unmangled name (the PTX
/// entry is the function's name); on the host, a plain `unsafe fn` that the grid emulator calls
/// on every emulated thread. Keep the body thin: call `#[inline(always)]` functions.
///
/// The host launches it by name with `Module::kernel(KernelSpec::new("name", path::to::name))`
/// and `Stream::launch(&kernel, LaunchConfig, params)`: the name finds the PTX entry point on
/// CUDA, the function runs on the CPU backend.
///
/// ```
/// use mscclpp_device::arch;
/// use mscclpp_shared::DevicePtr;
///
/// /// The kernel's parameters, shared by host and device: `#[repr(C)]`, and in a real crate
/// /// also `#[derive(bytemuck::Pod, bytemuck::Zeroable)]` (what `Stream::launch` takes).
/// #[repr(C)]
/// #[derive(Clone, Copy)]
/// pub struct ScaleParams {
///     pub data: DevicePtr<u32>,
///     pub len: u64,
/// }
///
/// mscclpp_device::kernel! {
///     /// Doubles every element, grid-stride.
///     fn scale(p: ScaleParams) {
///         let mut i = arch::global_thread_idx() as u64;
///         while i < p.len {
///             // SAFETY: the launcher passes `len` elements at `data`.
///             unsafe { *p.data.as_ptr().add(i as usize) *= 2 };
///             i += arch::global_thread_count() as u64;
///         }
///     }
/// }
///
/// // Outside a launch the thread indices are 0 and the grid is one thread.
/// let mut v = [1u32, 2, 3];
/// let p = ScaleParams { data: DevicePtr::from_ptr(v.as_mut_ptr()), len: 3 };
/// // SAFETY: `data` points at `len` live elements.
/// unsafe { scale(p) };
/// assert_eq!(v, [2, 4, 6]);
/// ```
///
/// # Safety
/// The generated function is `unsafe`: the caller (the launcher) guarantees that every address
/// in the parameter struct is valid for what the kernel does with it.
#[macro_export]
macro_rules! kernel {
    ($(#[$meta:meta])* fn $name:ident($param:ident : $ty:ty) $body:block) => {
        $(#[$meta])*
        ///
        /// # Safety
        /// Every address in the parameter struct must be valid for this kernel's accesses.
        #[cfg(target_arch = "nvptx64")]
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name($param: $ty) $body

        $(#[$meta])*
        ///
        /// # Safety
        /// Every address in the parameter struct must be valid for this kernel's accesses.
        #[cfg(not(target_arch = "nvptx64"))]
        pub unsafe fn $name($param: $ty) $body
    };
}

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    arch::trap()
}
