//! # mscclpp
//!
//! GPU-driven communication in Rust, in the model of MSCCL++.
#![deny(unsafe_op_in_unsafe_fn)]

pub use mscclpp_device as device;
pub use mscclpp_host as host;
pub use mscclpp_shared as shared;

/// PTX of every built-in kernel (`mscclpp-device` compiled for nvptx64 by `build.rs`).
pub const DEVICE_PTX: &str = include_str!(env!("MSCCLPP_DEVICE_PTX_PATH"));
