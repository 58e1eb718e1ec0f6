//! Collectives on a communicator: `all_reduce`, `all_gather`, `reduce_scatter`, `broadcast`,
//! `reduce`, `all_to_all`, `gather`, `scatter`, `all_to_allv`, `send` / `recv`, `send_recv`
//! and groups of any of them ([`Group`], NCCL's `ncclGroupStart` / `ncclGroupEnd`), every NCCL
//! data type and reduction, in place or out of place, any element count (zero included), on a
//! caller's stream. On a world of several nodes too: gather, scatter, all-to-all-v and groups of
//! sends and receives run there as lone sends and receives over the PortChannels
//! (`dispatch.rs`).
//!
//! [`Collectives::new`] on a world of one node connects every rank to every other (CUDA IPC /
//! shared memory), allocates a scratch buffer per rank that every peer maps (the LL16 region
//! and the descriptors; the other regions on first use, `scratch.rs`), builds one row of
//! MemoryChannels (one per peer) for each block the kernels may use (`setup.rs`), starts the
//! registration service (`registry.rs`) and sets up every algorithm. On a world of several
//! nodes it connects every rank to every other with PortChannels instead (the network between
//! nodes), and builds the collectives of the node's world that the hierarchical all-reduce
//! uses inside each node (`multinode.rs`). The built-in kernels' module is loaded once per
//! device and shared (a split's collectives reuse it). The kernels are in
//! `mscclpp_device::collectives`.
//!
//! Every call is a [`Call`] (the public calls build one each): queued with
//! [`Collectives::queue`], recorded with [`Group::add`], checked once (`Call::check`), planned
//! by one pure planner (`plan.rs`, which asks the one selection table, `select.rs`, and the
//! algorithms' units) and executed by the dispatcher (`dispatch.rs`). Three ways to call: the
//! raw `unsafe` calls on any device memory and any stream (a caller's, borrowed with
//! `Gpu::borrow_stream`); the same on buffers registered ahead
//! ([`Collectives::register_buffer`], windows, [`Collectives::mem_alloc`]; a world of one node
//! only), which send no bootstrap message; and the safe typed calls on [`DeviceVec`]s
//! (`typed.rs`).
//!
//! # Layers
//!
//! Lowest first; a module imports only modules of lower layers (`tests/import_layers.rs` checks
//! it, reading this table), so nothing points back up: set-up data never asks for the context
//! that owns it, an algorithm's teardown is its own (`CollectiveAlgorithm::tear_down`), the
//! units share kernels through `launch/` and never import a sibling, and the world of several
//! nodes composes the node's collectives through a trait (`multinode::NodeWorld`). This file
//! only declares the modules and re-exports the public names.
//!
//! | layer | modules | what |
//! |---|---|---|
//! | 0 | `algorithm`, `config`, `inflight`, `reduction` | the public names of the algorithms and collectives; [`CollectiveConfig`] from one table of settings; the one-sided calls' stream events a revoke waits for (with the issue order's marker); NCCL's operators and how kernels take them |
//! | 1 | `call`, `order`, `scratch`, `sharing` | the call descriptor [`Call`] and its checks; the issue order of a communicator's calls across streams; the scratch layout; several ranks on one GPU (the share of its multiprocessors each rank launches within) |
//! | 2 | `regions`, `registered` | the regions allocated on first use, traded with each peer once; the callers' buffers exchanged per call |
//! | 3 | `registry` | buffers registered ahead, exchanged once through the peers' registration services |
//! | 4 | `multinode`, `one_sided` | worlds of several nodes: transports, port channels, the node's world; one-sided calls on windows (their signals and service) |
//! | 5 | `context` | what the algorithms share: the lowered call, parameter blocks, health, the record of what ran |
//! | 6 | `setup`, `unit` | the checks and wiring of set-up, the built-in kernels' module; the algorithm trait, its plan's step |
//! | 7 | `launch` | the launches of the kernels several units share (LL16, staged, direct, port) |
//! | 8 | `algo::copy_engine`, `algo::direct`, `algo::hierarchical`, `algo::ll`, `algo::ll128`, `algo::ll_two_shot`, `algo::p2p`, `algo::port`, `algo::staged`, `algo::two_shot_put` | one unit per algorithm |
//! | 9 | `algo` | the registry of the units (`UNITS`) and what set-up asks all of them |
//! | 10 | `select` | the one selection table and the check of a forced algorithm |
//! | 11 | `plan` | the one pure planner, and the dispatcher's loop |
//! | 12 | `dispatch` | the dispatcher: checks, lowers, executes plans, ends groups, traces calls |
//! | 13 | `api` | [`Collectives`]: set-up, the public calls, registrations |
//! | 14 | `group`, `recovery`, `select_pin`, `typed` | [`Group`]; revoke, shrink and grow; the pinning test of the planner; [`DeviceVec`] and the safe typed calls |
//!
//! # Buffers the peers access
//!
//! On unregistered buffers the direct and copy-engine paths cost one bootstrap message per
//! peer per call (host side). On registered buffers (`registry.rs`) they cost none: the direct
//! kernel learns the peers' buffers from descriptors its peers write into its scratch, and the
//! copy engines, which need the peers' addresses on the host, are taken only where the outputs
//! are windows (all-gather, broadcast); a reduce keeps the per-call exchange, and the
//! point-to-point calls exchange no buffers at all (the p2p engine moves them through its
//! region, traded once per pair of ranks at their first meeting). They need every buffer to
//! be device memory this process allocated with an exportable allocator (`cuMemAlloc`, e.g.
//! PyTorch's caching allocator), 16-byte aligned and a multiple of 16 bytes long, on at most
//! [`MAX_DIRECT_RANKS`](mscclpp_shared::MAX_DIRECT_RANKS) ranks; otherwise every rank takes
//! another path (registered: every rank refuses the call, see `registry.rs`).
//!
//! # CUDA graphs
//!
//! Under capture (`Stream::is_capturing`, so a capture begun by a caller on a borrowed stream
//! counts) a call neither allocates nor waits on the host: the planner takes no algorithm that
//! would (`plan.rs`). So captured calls on unregistered buffers take LL, LL128 or staging;
//! register the buffers to capture direct calls, and run one eager call of each kind (or
//! [`Collectives::prepare`]) before capturing. A point-to-point call under capture between
//! two ranks that have not met yet (no eager send or receive between them, no `prepare`) is
//! refused. Every rank must capture the same calls.
//!
//! Every rank must call the same collectives in the same order (as with NCCL); sends and
//! receives pair up between two ranks, in order, whatever call made each (`group.rs`).
//!
//! NCCL's edge cases: a call of zero elements succeeds and touches nothing (a point-to-point
//! one still pairs with its peer's, as NCCL's do); on one rank every collective is a copy; in
//! place with NCCL's offsets works (all-gather `input = output + rank * count`,
//! reduce-scatter `output = input + rank * count`, gather and scatter at the root's own part);
//! a broadcast's non-roots may pass a null input, a reduce's and a gather's non-roots a null
//! output, a scatter's a null input.
//!
//! Measured on 2×H200: see BENCHMARKS.md. The algorithms, and when each is chosen: `algo/`
//! (one file each) and the selection table (`select.rs`).

mod algo;
mod algorithm;
mod api;
mod call;
mod config;
mod context;
mod dispatch;
mod group;
mod inflight;
mod launch;
mod multinode;
mod one_sided;
mod order;
mod plan;
mod recovery;
mod reduction;
mod regions;
mod registered;
mod registry;
mod scratch;
mod select;
#[cfg(test)]
mod select_pin;
mod setup;
mod sharing;
pub(crate) use setup::builtin_module;
pub mod typed;
mod unit;

pub use algo::memory_plan;
pub use algorithm::{Algorithm, Collective};
pub use api::Collectives;
pub use call::Call;
pub use config::{CollectiveConfig, Limit, Setting};
pub use group::Group;
pub use multinode::{ENV_NET_TRANSPORT, network_transports};
pub use one_sided::{
    DEFAULT_TIMEOUT as ONE_SIDED_TIMEOUT, RING as ONE_SIDED_RING, SIGNAL_CONTEXTS, SIGNALS, Signal,
    SignalWait, Window,
};
pub use recovery::REVOKE_DRAIN;
pub use reduction::{KernelOp, Reduction, Scalar, element_bits};
pub use registry::Registration;
pub use scratch::MemoryPlan;
pub use sharing::{ENV_RANKS_PER_GPU, WANTED_CONNECTIONS, ranks_per_gpu_in_env};
pub use typed::{Bf16, DeviceVec, Element, F8E4M3, F8E5M2, F16};
