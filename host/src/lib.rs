//! # mscclpp-host
//!
//! The host side of mscclpp-rs.
//!
//! | module | holds |
//! |---|---|
//! | [`gpu`] | the device runtime: `cuda` and `cpu` backends behind one API |
//! | [`error`] | the crate's error type |
//! | [`bootstrap`] | TCP bootstrap: `UniqueId`, rank/size from launcher env, tagged send/recv, all-gather, barrier, broadcast |
//! | [`status`] | the abort flag and device error record (`DeviceStatus`) |
//! | [`fifo`] | the proxy FIFO's host side (single consumer) |
//! | [`proxy`] | `ProxyService`: the thread that serves a FIFO |
//! | [`numa`] | NUMA node CPU lists and thread binding (sysfs, no libnuma) |
#![deny(unsafe_op_in_unsafe_fn)]

pub mod bootstrap;
pub mod error;
pub mod fifo;
pub mod gpu;
pub mod numa;
pub mod proxy;
pub mod status;

pub use error::{Error, Result};
