//! # mscclpp
//!
//! GPU-driven communication in Rust, in the model of MSCCL++: GPU kernels move data between GPUs
//! with one-sided `put`/`signal`/`wait`/`flush`, and collectives are built from those.
//!
//! ## Layers
//!
//! | crate | role | MSCCL++ counterpart |
//! |---|---|---|
//! | [`shared`] (`mscclpp-shared`) | every host↔device / process↔process layout, mirrored in `layout.h` | `include/mscclpp/*_device.hpp` structs |
//! | [`device`] (`mscclpp-device`) | device API and kernels in `no_std` Rust (PTX and host builds) | `*_device.hpp` functions |
//! | [`host`] (`mscclpp-host`) | backends, bootstrap, communicator, transports, proxy | `src/*.cc` |
//! | `mscclpp` (this crate) | facade, collectives, kernel registry, embedded PTX | `mscclpp` Python/C++ front |
//! | `mscclpp-tools` (`tools/`, not a dependency) | `mscclpp-bench`, `mscclpp-run`, `mscclpp-info` | `mscclpp-test`, `mpirun` |
//! | `mscclpp-nccl` (`nccl/`, not a dependency) | the drop-in `libnccl.so.2`: NCCL's C API over [`collectives`] | the NCCL API shim (`apps/nccl`) |
//!
//! ## Modules
//!
//! Lowest first; a module imports only modules of lower layers (`tests/import_layers.rs` reads
//! this table):
//!
//! | layer | modules | what |
//! |---|---|---|
//! | 0 | `kernels`, `report`, `world` | the built-in kernels' registry (and [`DEVICE_PTX`]); an error and its causes at the end of `main`; ranks as threads of one process |
//! | 1 | `trace` | device trace rings attached to a module's kernels |
//! | 2 | `collectives` | the collectives (their own layers: [`collectives`]' docs) |
//!
//! The libraries emit `tracing` events and install no subscriber; programs without one of
//! their own call `mscclpp_log::init()` (crate `mscclpp-log`, `log/`), which shows them as
//! `MSCCLPP_LOG` asks.
//!
//! ## Names
//!
//! | MSCCL++ | mscclpp-rs |
//! |---|---|
//! | `ProxyTrigger` / `ChannelTrigger` | [`shared::ProxyTrigger`] |
//! | `FifoDeviceHandle` | [`shared::FifoDeviceHandle`] + [`device::fifo::FifoDevice`] |
//! | `PortChannelDeviceHandle` | [`shared::PortChannelDeviceHandle`] |
//! | `MemoryChannelDeviceHandle` | [`shared::MemoryChannelDeviceHandle`] |
//! | `LL16Packet` / `LL8Packet` | [`shared::LL16Packet`] / [`shared::LL8Packet`] |
//! | `cudaMalloc` + `cudaIpcGetMemHandle` | [`host::gpu::Gpu::alloc`] + [`host::gpu::DeviceBuffer::ipc_handle`] |
#![deny(unsafe_op_in_unsafe_fn)]

pub mod collectives;
pub mod kernels;
pub mod report;
pub mod trace;
pub mod world;

pub use mscclpp_device as device;
pub use mscclpp_host as host;
pub use mscclpp_host::kernel_spec;
pub use mscclpp_shared as shared;
pub use report::{ErrorChain, exit_code};

/// PTX of every built-in kernel (`mscclpp-device` compiled for nvptx64 by `build.rs`).
pub const DEVICE_PTX: &str = include_str!(env!("MSCCLPP_DEVICE_PTX_PATH"));

/// Embeds PTX that `mscclpp_build::PtxBuilder` (crate `mscclpp-build`) wrote to
/// `OUT_DIR/<name>.ptx` in the calling crate's `build.rs`: `include_ptx!("my_kernels")` is
/// `include_str!(concat!(env!("OUT_DIR"), "/my_kernels.ptx"))`, a `&'static str` for
/// [`host::gpu::Gpu::load_ptx`]. `<name>` is the kernel crate's library name (`-` becomes
/// `_`: package `my-kernels` gives `my_kernels`) unless the builder set another with
/// `output_name`.
///
/// ```ignore
/// // build.rs: mscclpp_build::PtxBuilder::new("../kernels").build()
/// const MY_KERNELS_PTX: &str = mscclpp::include_ptx!("my_kernels");
/// ```
#[macro_export]
macro_rules! include_ptx {
    ($name:literal) => {
        ::core::include_str!(::core::concat!(::core::env!("OUT_DIR"), "/", $name, ".ptx"))
    };
}
