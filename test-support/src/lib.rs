//! The one test harness of mscclpp-rs, shared by the tests of the root crate, `nccl/`,
//! `tools/`, `host/` and `shared/`, and the one element codec the tests and the tools' data
//! checks use.
//!
//! | module | what it holds |
//! |---|---|
//! | [`backend`] | the backend under test (`MSCCLPP_BACKEND`, as users get it), devices, and GPU counting with the several-ranks-per-GPU mode (`MSCCLPP_RANKS_PER_GPU`): [`enough_gpus`] prints `NOT RUN` and why |
//! | [`threads`] | ranks as threads of the test process, over loopback bootstraps (optionally wrapped, e.g. by [`Counting`]) |
//! | [`process`] | the test binary re-run as a child process running one test: spawned with its environment, its output read line by line with a time limit, waited for with a bound (killed by its pid when it overruns) |
//! | [`world`] | ranks as child processes: rank 0 announces the world's id, the others join; in a child, its place, bootstrap and communicator |
//! | [`counting`] | a bootstrap that counts the messages a rank's program sends |
//! | [`codec`] | the elements of every NCCL data type to and from bytes, from the formats' definitions (nothing of the library's conversions) |
//! | [`data`] | test data that cannot collude: hashes of (rank, part, index), the marker outputs start as |
//! | [`source`] | where a test finds the repository's files at run time (the GPU bundle runs from a copy) |
//!
//! Every wait here is bounded: a child process that overruns its bound is killed and reported,
//! a line that does not come within its limit fails the test. Tests talk over loopback only.
//! This crate depends on the host crate only (not on the root crate), so the host crate's own
//! tests can use it.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod backend;
pub mod codec;
pub mod counting;
pub mod data;
pub mod process;
pub mod source;
pub mod threads;
pub mod world;

pub use backend::{backend, device_count, enough_gpus, gpu, gpus_suffice, module, ranks_per_gpu};
pub use counting::{Counting, Sends};
pub use data::{MARKER, from_hex, hash, mix, pattern, to_hex};
pub use process::{Child, ChildEnd, TestProcess, die_with_parent, in_isolated, isolated};
pub use source::package_dir;
pub use threads::{
    counted_ranks_as_threads, ranks_as_threads, ranks_as_threads_on, ranks_as_threads_over,
    try_ranks_as_threads,
};
pub use world::{
    Place, Processes, announce, child_bootstrap, child_bootstrap_with, child_communicator,
    child_counted_communicator, child_place, ranks_as_processes,
};
