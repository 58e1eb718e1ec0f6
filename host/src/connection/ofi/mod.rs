//! `OfiConnection`: the `Ofi` transport — libfabric (OpenFabrics Interfaces), the fabric engine
//! that clusters already run: the same code path drives InfiniBand and RoCE (`verbs;ofi_rxm`),
//! AWS EFA (`efa`), HPE Slingshot (`cxi`) and plain TCP (`tcp;ofi_rxm`), which is what CI tests
//! it over (on loopback). libfabric is opened with `dlopen("libfabric.so.1")` at run time (or
//! the file `MSCCLPP_OFI_LIBRARY` names; the network transports' shared loader): no build-time
//! dependency, and a missing library is [`Error::Transport`](crate::Error::Transport) of kind
//! `Unavailable`.
//!
//! # Layers (as cudarc's `sys` / `result` / `safe`)
//!
//! | file | holds |
//! |---|---|
//! | `sys.rs` | the structs and ops tables declared by hand from `rdma/fabric.h` (sizes asserted), the six exported functions, loaded by `dlopen`; every other `fi_*` call is an inline wrapper in the headers and goes through the provider's ops table, as the wrapper does |
//! | `result.rs` | one `Result` function per call (an [`Error::Transport`](crate::Error::Transport) of kind `Call` names the call, the provider and libfabric's text) |
//! | `safe.rs` | the provider choice ([`providers`], what `mscclpp-info` lists) and RAII owners whose `Drop` closes and never panics |
//! | `wire.rs` | the [`EndpointInfo`] an endpoint carries, the [`Frame`] header (the receiver's destination check is `connection::network`'s, shared with Ethernet) |
//! | `setup.rs` | `Prepared`: the half made before the endpoints cross |
//! | `connection.rs` | [`OfiConnection`]: the data path, the progress thread, teardown |
//!
//! # Provider
//!
//! An RDM endpoint with tagged messages and RMA writes (`FI_TAGGED | FI_RMA`), threading
//! `FI_THREAD_DOMAIN` (each connection serializes its calls under one lock), contexts for
//! providers in `FI_CONTEXT`/`FI_CONTEXT2` mode, and every memory-registration mode a provider
//! may ask for (`FI_MR_LOCAL`, `VIRT_ADDR`, `ALLOCATED`, `PROV_KEY`, `ENDPOINT`, `HMEM`).
//! `MSCCLPP_OFI_PROVIDER` (`tcp`, `verbs`, `efa`, `cxi`, …) picks one; otherwise the first
//! libfabric lists, leaving out `shm` (one node only) and the `sockets`, `udp` and `rxd` test
//! providers, and taking a fabric of the loopback interface only when there is no other.
//! libfabric's own variables apply (`FI_PROVIDER`, `FI_TCP_IFACE=lo`, …). Every rank
//! must end up with the same provider and fabric (checked at set-up).
//!
//! # Set-up (inside `Communicator::connect`, built by `connection::setup`)
//!
//! 1. *Prepare* (before the endpoints cross, `Prepared::new`): choose the provider (with
//!    `FI_HMEM` on the CUDA backend; without it if no provider has it), open fabric, domain,
//!    completion queue (tagged format), address vector (table) and endpoint; allocate the
//!    buffers in host memory the device can reach (registered when the provider wants local
//!    registrations): [`SLOTS`] data receive slots of `HEADER_LEN + CHUNK` bytes, [`CTRL_RX`]
//!    control receive slots, [`TX_BUFS`] data and [`CTRL_TX`] control send slots; post every
//!    receive; and, where writes may go direct (below), register with the provider every memory
//!    this rank registered for `Ofi` so far (up to [`MAX_MRS`]; host memory, or device memory
//!    with `FI_HMEM`). The [`EndpointInfo`] in the endpoint's `extra` says: provider, fabric,
//!    the endpoint's address, flags, the receive slots and their size, and the memory table (id,
//!    size, RMA address, provider key `fi_mr_key`).
//! 2. *Establish* (`OfiConnection::establish`): decode and check the peer's info (same
//!    provider and fabric), insert its address, start the progress thread.
//!
//! # Data path
//!
//! Two ways for a `write`, one order for everything:
//!
//! - **Direct**: when the destination is in the peer's memory table and the source in this
//!   side's, one `fi_write` per piece (at most the provider's largest message) straight into the
//!   peer's registration (GPU memory directly with `FI_HMEM`; the CPU backend's memory is host
//!   memory). Only when both sides' providers order a send after earlier writes
//!   (`FI_ORDER_SAW`): that order is what makes a later `UPDATE` or `FLUSH` frame (below)
//!   arrive after the data. `MSCCLPP_OFI_STAGED=1` turns direct writes off.
//! - **Staged**: otherwise (device memory without `FI_HMEM`, memories registered after the
//!   connection was made, providers without that order), `WRITE` frames: the sender copies the
//!   source into a send slot (a device copy into host memory) and sends it as a tagged message;
//!   the peer's progress thread checks the destination against its registry and copies the
//!   payload into its memory (a device copy out of host memory). GPU memory is thus staged
//!   through pinned host memory on both ends.
//!
//! Data frames (`WRITE`, `UPDATE`, `FLUSH`, `BYE`, tag [`TAG_DATA`]) carry a sequence number;
//! the receiver applies them strictly in sequence order (holding early ones in their slots), so
//! nothing depends on the provider delivering messages in order. After applying a frame (its
//! device copy synchronized) it reposts the slot and sends a cumulative `CREDIT {applied}`
//! control frame (tag [`TAG_CTRL`]). A sender keeps at most `slots - 1` data frames unapplied
//! (one slot is kept for `BYE`), so every data frame finds a posted receive.
//!
//! - `update_and_sync` (the signal): an `UPDATE {id, offset, value}` frame, applied as an 8-byte
//!   store ordered after the data on the receiver's stream (`Stream::write_value_u64`).
//! - `flush(timeout)`: a `FLUSH` frame, then waits until the peer has applied it (every earlier
//!   frame, and, by the send-after-write order, every earlier direct write is in place) and every
//!   direct write completed here.
//!
//! # Wire format (little-endian)
//!
//! [`EndpointInfo`]: `magic "MSOF" | version u16 | provider (u8 length + bytes) | fabric (u8 +
//! bytes) | address (u16 + bytes, 1..=256) | flags u8 (1 direct, 2 virtual addresses) | chunk
//! u32 | slots u16 (≥ 2) | count u16 (≤ MAX_MRS) | count × (id u32, size u64, address u64, key
//! u64)`.
//!
//! Frame header (40 bytes; `WRITE` and `ERROR` carry a payload after it):
//!
//! | op | code | tag | id (at 4) | word at 8 | word at 16 | word at 24 | word at 32 | payload |
//! |---|---|---|---|---|---|---|---|---|
//! | `WRITE` | 1 | data | destination `local_id` | sequence | offset | len (1..=chunk) | destination's network key | `len` bytes |
//! | `UPDATE` | 2 | data | destination `local_id` | sequence | offset (8-aligned) | value | destination's network key | — |
//! | `FLUSH` | 3 | data | 0 | sequence | 0 | 0 | 0 | — |
//! | `BYE` | 4 | data | 0 | sequence | 0 | 0 | 0 | — |
//! | `CREDIT` | 0x81 | control | 0 | frames applied | 0 | 0 | 0 | — |
//! | `ERROR` | 0x82 | control | 0 | 0 | 0 | len (≤ [`MAX_REASON`]) | 0 | UTF-8 reason |
//!
//! The network key is the destination's `RegisteredMemory::key` (random per registration,
//! sent only inside that memory's serialized form): the receiver refuses a frame whose key
//! does not match, so a peer writes in messages only into memories that were sent to it.
//! Direct RMA writes carry the provider's key (`fi_mr_key`) instead, which the provider checks.
//!
//! Who writes and reads what:
//! - The **sender** (a caller of `write` / `update_and_sync` / `flush`, usually the proxy
//!   thread) reserves a send slot and a sequence number under the state lock, stages, and posts
//!   under the port lock.
//! - The **progress thread** (`ofi{rank}-p{peer}`) is the only reader of the completion queue:
//!   it returns send slots and RMA contexts to their free lists, records arrived data frames,
//!   applies them in order, reposts receives, sends credits and takes the peer's credits
//!   (waking senders through a condition variable). libfabric's tcp provider progresses only
//!   when its queue is read (manual progress): this thread is that progress. Idle, it parks
//!   (20 µs at a time, 1 ms after 20 ms without completions); every post unparks it.
//!
//! # What the receiver checks (nothing read is trusted)
//!
//! A message's length against its header; the header (known op, reserved bytes zero, unused
//! words zero, `WRITE` length at most the chunk, `ERROR` at most [`MAX_REASON`]); a data frame's
//! sequence number inside the receive window; a credit at most what was sent; a destination in
//! the registry, registered for `Ofi`, its network key, the range inside it, an `UPDATE` word
//! 8-byte aligned (checked under the registry's read lock, held during the copy). A frame that fails is not
//! applied: the receiver sends `ERROR {reason}`, the connection fails (sticky,
//! [`Error::Transport`](crate::Error::Transport) of kind `Protocol`) and the communicator is
//! aborted. The peer's
//! memory table is checked at set-up (sizes, no wrap, distinct ids), and a direct write is
//! bounded by it; the provider enforces the registration again.
//!
//! # Failure model
//!
//! Every wait (a send slot, the peer's receive slots, a flush, staging on the device) is bounded
//! by the `EndpointConfig`'s `flush_timeout` (a flush by its argument) and ends at once when the
//! connection failed or the communicator was aborted. A failed operation on the completion queue
//! (the peer died, the link broke) is sticky and aborts the communicator, releasing every
//! device wait of this rank; during teardown it is only a closed connection. `Drop` sends `BYE`
//! and, for at most [`LINGER`], keeps applying the peer's frames until the peer applied ours and
//! said its own `BYE`; then it stops the progress thread and closes every object. It never
//! panics.
//!
//! # Limits (read before use)
//!
//! - **Never run on RDMA hardware**: CI runs every path here over the `tcp;ofi_rxm` provider
//!   (direct writes and staged frames); `verbs`, `efa` and `cxi` take the same calls but have not
//!   been tried, nor has `FI_HMEM` registration of GPU memory.
//! - Direct writes reach only the memories registered for `Ofi` before the connection was made
//!   (their keys travel in the endpoint); later ones go in frames. Per-memory keys in the
//!   registered memory's own wire form would lift this.
//! - A registration lives as long as the connection: a peer can still write into a memory whose
//!   `RegisteredMemory` was dropped, until the connection drops.
//! - Each connection opens its own fabric, domain, endpoint and progress thread.
//! - On GPUs, the provider's writes into device memory (`FI_HMEM`) are ordered before the
//!   `UPDATE` store only as far as the provider and the PCIe ordering rules make them; no
//!   GPUDirect flush (a read-back) is done yet.

mod connection;
mod result;
mod safe;
mod setup;
pub(crate) mod sys;
mod wire;

use std::time::Duration;

pub use self::connection::OfiConnection;
pub(crate) use self::connection::Setup;
pub use self::safe::{ProviderInfo, providers};
pub(crate) use self::setup::Prepared;
pub use self::wire::{
    EndpointInfo, FLAG_DIRECT, FLAG_VIRT_ADDR, Frame, INFO_MAGIC, INFO_VERSION, MR_ENTRY_LEN,
    MrEntry, TAG_CTRL, TAG_DATA,
};

/// Environment variable naming the libfabric shared object (default `libfabric.so.1`).
pub const ENV_LIBRARY: &str = "MSCCLPP_OFI_LIBRARY";
/// Environment variable choosing the provider (`tcp`, `verbs`, `efa`, `cxi`, …).
pub const ENV_PROVIDER: &str = "MSCCLPP_OFI_PROVIDER";
/// Environment variable: `1` sends every write in frames (no direct RMA).
pub const ENV_STAGED: &str = "MSCCLPP_OFI_STAGED";

/// Bytes of a frame header.
pub const HEADER_LEN: usize = 40;
/// Largest `WRITE` payload: the size of a data receive slot past its header.
pub const CHUNK: usize = 512 << 10;
/// Data receive slots posted per connection.
pub const SLOTS: usize = 8;
/// Control receive slots posted per connection.
pub const CTRL_RX: usize = 16;
/// Data send slots per connection.
pub const TX_BUFS: usize = 4;
/// Control send slots per connection.
pub const CTRL_TX: usize = 8;
/// Direct writes in flight per connection.
pub const RMA_OPS: usize = 64;
/// Largest `ERROR` reason.
pub const MAX_REASON: usize = 256;
/// Bytes of a control slot.
pub const CTRL_LEN: usize = HEADER_LEN + MAX_REASON;
/// Longest provider or fabric name carried.
pub const MAX_NAME: usize = 64;
/// Longest endpoint address carried.
pub const MAX_ADDR: usize = 256;
/// Most memories an endpoint offers for direct writes (the rest go in frames).
pub const MAX_MRS: usize = 24;
/// Longest `Drop` waits for the peer's `BYE`.
pub const LINGER: Duration = Duration::from_secs(1);

/// Whether libfabric can be loaded and offers a provider this transport can use (what the
/// automatic transport choice asks): the provider, its fabric and domain; else why not.
pub fn usable() -> crate::Result<String> {
    let provider = std::env::var(ENV_PROVIDER)
        .ok()
        .filter(|p| !p.trim().is_empty());
    safe::select(&safe::Want {
        provider,
        hmem: false,
    })
    .map(|i| {
        format!(
            "{} (fabric {}, domain {})",
            i.provider(),
            i.fabric_name(),
            i.domain_name()
        )
    })
}
