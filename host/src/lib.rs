//! # mscclpp-host
//!
//! The host side of mscclpp-rs.
//!
//! | module | holds |
//! |---|---|
//! | [`gpu`] | the device runtime: `cuda` and `cpu` backends behind one API |
//! | [`error`] | the crate's error type |
//! | [`bootstrap`] | TCP bootstrap: `UniqueId`, rank/size from launcher env, tagged send/recv, all-gather, barrier, broadcast |
//! | [`communicator`] | `Communicator`: register / send / receive memory, connect |
//! | [`registered_memory`] | `RegisteredMemory` and its wire form |
//! | [`transport`] | `Transport`, `TransportFlags` |
//! | [`connection`] | `Connection` and its transports |
//! | [`semaphore`] | host side of the three semaphores |
//! | [`memory_channel`] | MemoryChannel device-handle builder |
//! | [`port_channel`] | `PortChannelService`: the proxy that serves PortChannels |
//! | [`codec`] | bounds-checked wire encoding helpers |
//! | [`status`] | the abort flag and device error record (`DeviceStatus`) |
//! | [`fifo`] | the proxy FIFO's host side (single consumer) |
//! | [`proxy`] | `ProxyService`: the thread that serves a FIFO |
//! | [`numa`] | NUMA node CPU lists and thread binding (sysfs, no libnuma) |
#![deny(unsafe_op_in_unsafe_fn)]

mod backend;
pub mod backoff;
pub mod bootstrap;
pub mod codec;
pub mod communicator;
pub mod connection;
pub mod error;
pub mod fifo;
pub mod gpu;
pub mod health;
pub mod memory_channel;
pub mod numa;
pub mod port_channel;
pub mod proxy;
mod random;
pub mod registered_memory;
pub mod semaphore;
mod socket;
pub mod status;
mod sync;
pub mod transport;

pub use error::{Error, Result};
