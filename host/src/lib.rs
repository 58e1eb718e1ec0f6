//! # mscclpp-host
//!
//! The host side of mscclpp-rs.
//!
//! | module | holds |
//! |---|---|
//! | [`auth`] | mutual challenge–response authentication over a per-world secret (HMAC-SHA-256), for every handshake that admits a peer |
//! | [`gpu`] | the device runtime: `cuda` and `cpu` backends behind one API |
//! | [`error`] | the crate's error type (a network transport's failures: one structured variant, `Error::Transport`, with a kind) |
//! | [`bootstrap`] | TCP bootstrap: `UniqueId`, rank/size from launcher env, tagged send/recv, all-gather, barrier, broadcast |
//! | [`health`] | a communicator's watched bootstrap, the monitor that notices a dead peer, and the bootstrap of a node group bound to its world |
//! | [`topology`] | `Topology`: the node layout (nodes, local indices, same-index columns) from the bootstrap's host grouping |
//! | [`communicator`] | `Communicator`: registers memories and trades the serializable halves (memories, endpoints, semaphore stubs) with peers |
//! | [`membership`] | shrink (a world of the survivors over their links), grow (old ranks and newcomers), the failure detector's dead ranks |
//! | [`registered_memory`] | `RegisteredMemory`, its wire form, and the rank's registry of memories |
//! | [`transport`] | `Transport`, `TransportFlags` |
//! | [`connection`] | `Connection` and its transports, built from a local and a remote endpoint |
//! | [`semaphore`] | host side of the three semaphores, built from a local and a remote stub |
//! | [`memory_channel`] | MemoryChannel device-handle builder |
//! | [`port_channel`] | `PortChannelService`: the proxy that serves PortChannels (builder, then running) |
//! | [`codec`] | bounds-checked wire encoding helpers |
//! | [`status`] | the abort flag and device error record (`DeviceStatus`) |
//! | [`fifo`] | the proxy FIFO's host side (single consumer) |
//! | [`proxy`] | `ProxyService`: the thread that serves a FIFO |
//! | [`trace`] | `Trace`: a rank's timeline of calls, kernel blocks, proxy work and set-up, written per rank |
//! | [`numa`] | NUMA node CPU lists and thread binding (sysfs, no libnuma) |
//! | [`backoff`] | `Backoff`: spin, yield, then sleep in polling loops |
//! | [`sync`] | poison-tolerant locks: the workspace's one helper (`lock`, `read`, `write`, `wait`, `wait_timeout`) |
//! | `backend`, `socket`, `random` (crate-private) | `BackendKind` (re-exported by `gpu`); deadline-bounded socket I/O; random bytes |
//!
//! # Layers
//!
//! Imports point down only (`host/tests/layering.rs` fails on anything else, cycles included):
//!
//! | layer | modules |
//! |---|---|
//! | 10 | `membership` |
//! | 9 | `communicator` |
//! | 8 | `memory_channel`, `port_channel` |
//! | 7 | `semaphore` |
//! | 6 | `connection`, `proxy` |
//! | 5 | `fifo`, `health`, `registered_memory`, `topology`, `trace` |
//! | 4 | `bootstrap`, `status` |
//! | 3 | `gpu`, `numa` |
//! | 2 | `error` |
//! | 1 | `auth`, `transport` |
//! | 0 | `backend`, `backoff`, `codec`, `random`, `socket`, `sync` |
//!
//! So the communicator sits on the connections, which sit on the registered memories, which sit
//! on the GPU layer; nothing below knows the communicator.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod auth;
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
pub mod membership;
pub mod memory_channel;
pub mod numa;
pub mod port_channel;
pub mod proxy;
mod random;
pub mod registered_memory;
pub mod semaphore;
mod socket;
pub mod status;
pub mod sync;
pub mod topology;
pub mod trace;
pub mod transport;

pub use error::{Error, Result};
