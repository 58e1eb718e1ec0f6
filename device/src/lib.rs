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
//! | [`copy`] | collective copies |
//! | [`kernels`] | the built-in kernels |
//!
//! Kernels are declared with [`kernel!`]; a crate that declares kernels must enable the PTX ABI
//! for the nvptx build: `#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]`.
#![no_std]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(abi_ptx, asm_experimental_arch, stdarch_nvptx)
)]

#[cfg(not(target_arch = "nvptx64"))]
extern crate std;

pub mod arch;
pub mod copy;
pub mod fifo;
pub mod kernels;
pub mod memory_channel;
pub mod packet;
pub mod port_channel;
pub mod semaphore;
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
