//! `IbConnection`: the `Ib` transport — RDMA over InfiniBand or RoCE through libibverbs, which
//! is opened with `dlopen("libibverbs.so.1")` at run time (feature `ib`; no build-time
//! rdma-core, no bindgen).
//!
//! **Status: this code has not run on RDMA hardware.** It builds, its wire format, device
//! selection, queue-pair state logic and error mapping are unit-tested, and connecting without
//! libibverbs (or without a device) is tested to fail with an
//! [`Error::Transport`](crate::Error::Transport) of kind `Unavailable`. The verbs
//! struct layouts are declared from rdma-core's `verbs.h` and checked at compile time
//! (`sys.rs`), but no work request has been posted to a real HCA. Treat the data path as a
//! reviewed draft until it has run on one.
//!
//! # Layers
//!
//! | file | holds |
//! |---|---|
//! | `sys.rs` | the raw structs (prefixes where libibverbs allocates), constants, the function table (loaded by the network transports' shared `dlopen` loader); `ibv_post_send`/`ibv_poll_cq` are inline in `verbs.h`, so they are called through `context->ops` as the inline functions do |
//! | `verbs.rs` | one `Result` function per verb (an [`Error::Transport`](crate::Error::Transport) of kind `Call` names the verb and device) and RAII owners whose `Drop` logs, never panics |
//! | `mod.rs` | these docs, the environment variables |
//! | `wire.rs` | the [`QpInfo`] an endpoint carries (queue pair, path, memory table) |
//! | `setup.rs` | device selection, QP state transitions, [`Prepared`] (the half made before the endpoints cross) |
//! | `connection.rs` | [`IbConnection`]: the data path |
//!
//! # Set-up (inside `Communicator::connect`, built by `connection::setup`)
//!
//! 1. *Prepare* (before the endpoints cross): pick the device and port ([`select_device`]:
//!    `MSCCLPP_IB_DEVICE=name[:port][,name[:port]…]`, entry `i` for `Ib(i)`, a single entry for
//!    all; else the `i`-th device libibverbs lists, port 1), check the port is active, read the
//!    GID at `MSCCLPP_IB_GID_INDEX` (default 0), allocate a PD, a CQ, an RC QP (moved to INIT),
//!    register every memory this communicator registered for `Ib(i)` so far, and put a
//!    [`QpInfo`] (QP number, PSN, LID, GID, MTU, and the memory table: id, address, size, rkey)
//!    into the endpoint's `extra`.
//! 2. *Establish*: decode and check the peer's [`QpInfo`], move the QP to RTR (path to the
//!    peer) and RTS; then a bootstrap round trip, so neither side writes before the other's QP
//!    can receive.
//!
//! # Data path
//!
//! - `write`: one signaled `IBV_WR_RDMA_WRITE` per ≤ 1 GiB piece, from the local region of
//!   `src` (its lkey) to the peer's region of `dst` (its rkey from the peer's table). Both ranges
//!   are checked against the registered sizes first (the sender's checks the network transports
//!   share, then the peer's table); the HCA enforces the regions again.
//! - `update_and_sync`: `src.swap(new)` gives the old value; one signaled
//!   `IBV_WR_ATOMIC_FETCH_AND_ADD` of `new - old` (wrapping) on the peer's word, as MSCCL++ does.
//!   On an RC QP it executes after the earlier writes of the QP. It assumes the peer's word only
//!   changes through this connection.
//! - `flush(timeout)`: polls the CQ until every posted request has completed, or the timeout
//!   passes ([`Error::FlushTimeout`](crate::Error::FlushTimeout)). A completion with an error status puts the connection in a
//!   sticky [`Error::Transport`](crate::Error::Transport) of kind `Completion`.
//! - The send queue holds 1024 requests (`verbs::MAX_SEND_WR`); a post that finds it full
//!   polls first (bounded by the connection's timeout).
//!
//! # Limits (read before use)
//!
//! - Only memories registered for `Ib(i)` *before* `connect` are known to the connection (their
//!   keys travel in the endpoint, at most [`MAX_MRS`] of them); a later one is refused with an
//!   [`Error::Transport`](crate::Error::Transport) of kind `Memory`. MSCCL++ carries keys inside
//!   the serialized `RegisteredMemory`; doing that here needs a new `RegisteredMemory` wire
//!   version.
//! - Each connection opens its own device context, PD and registrations.
//! - GPU memory needs GPUDirect RDMA (`nvidia-peermem`) for `ibv_reg_mr` to accept it; the CPU
//!   backend's memory is host memory and needs nothing.
//! - Registrations live as long as the connection: a region keeps its pages pinned even if the
//!   `RegisteredMemory` is dropped, so a peer can still write there until the connection drops.

mod connection;
mod setup;
pub(crate) mod sys;
#[cfg(test)]
mod tests;
pub(crate) mod verbs;
mod wire;

pub use self::connection::IbConnection;
pub use self::setup::{Prepared, QpState, gid_index, select_device};
pub use self::wire::{
    MAX_MRS, MR_ENTRY_LEN, MrEntry, QP_INFO_HEADER, QP_INFO_MAGIC, QP_INFO_VERSION, QpInfo,
};

/// Environment variable choosing devices (and ports).
pub const ENV_DEVICE: &str = "MSCCLPP_IB_DEVICE";
/// Environment variable choosing the GID index (RoCE).
pub const ENV_GID_INDEX: &str = "MSCCLPP_IB_GID_INDEX";
