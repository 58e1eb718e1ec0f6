//! The collective kernels on the grid emulator, every rank of a small world in this process.
//!
//! What the root crate's `tests/collectives.rs` checks through the whole stack (bootstrap,
//! transports, the host's choice of kernel), these tests check on the kernels alone: each
//! test builds the memory a communicator would (a scratch buffer per rank, a row of
//! MemoryChannels per block, their semaphores, the LL flag words) with plain host
//! allocations, launches one kernel on every rank at once (one emulated grid per rank, each
//! on its own host thread) and compares every output byte with a host reference. They
//! rebuild only this crate, so a mutation run (`scripts/mutants.sh`) tests each mutant of
//! the collectives in seconds instead of the minutes a root-crate build takes.
//!
//! The data are hashes of (rank, part, byte): no rank's part equals another's, so an
//! exchange that goes to the wrong place, or nowhere, shows. Every output starts as a marker
//! byte, so a kernel that writes too little or in the wrong place shows, and every buffer ends
//! right before a no-access page, so one that reads or writes past a buffer faults, as on a
//! GPU. Every launch is watched: a kernel that loses a signal spins until the watchdog aborts
//! it (20 s: generous, so that a loaded machine never fails a sound kernel), and the test
//! fails with the status it recorded. Ranks may also queue several launches each, as on their
//! own streams, one of them late ([`world::World::try_launch_streams`]): no rank may overrun a
//! late one.
//!
//! Who writes what here: the host (this thread) writes every buffer before the launches and
//! reads them after every grid has joined; during the launches only the kernels touch them.

extern crate std;

mod call;
mod direct;
mod ll;
mod ll128;
mod p2p;
mod peek;
mod port;
mod staged;
mod world;
