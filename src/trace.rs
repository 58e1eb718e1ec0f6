//! Tracing a rank: see [`mscclpp_host::trace`] for what is recorded and the per-rank file, and
//! `mscclpp-trace` (crate `mscclpp-tools`) for merging the files into one Chrome / Perfetto
//! timeline.
//!
//! `MSCCLPP_TRACE=dir` traces every communicator of a program (`Communicator::traced` turns
//! one on from code). [`Collectives`](crate::collectives::Collectives) attaches the device
//! side by itself; a program that launches kernels of its own calls [`attach`] once, then
//! gives each launch `comm.trace().launch(call)` as its `TraceDeviceHandle` (see
//! `mscclpp_device::trace` for the hooks a kernel calls).

pub use mscclpp_host::trace::*;

use mscclpp_host::communicator::Communicator;
use mscclpp_host::gpu::Module;

use crate::kernels;

/// Attaches the device side of `comm`'s trace, when it is on: block-event rings for blocks
/// `0..blocks` and the clock-sync kernel of the built-in PTX (a first clock pair is taken
/// now, the next ones at every dump). A failure is logged and leaves that part out: tracing
/// never stops the program.
pub fn attach(comm: &Communicator, blocks: u32) {
    if !comm.trace().is_on() {
        return;
    }
    match comm.gpu().load_ptx(crate::DEVICE_PTX) {
        Ok(module) => attach_with(comm, &module, blocks),
        Err(e) => tracing::warn!("trace: rank {}: {e}", comm.rank()),
    }
}

/// [`attach`] with the built-in module already loaded.
pub(crate) fn attach_with(comm: &Communicator, module: &Module, blocks: u32) {
    let trace = comm.trace();
    if let Err(e) = trace.attach_device(comm.gpu(), blocks) {
        tracing::warn!("trace: rank {}: no block events: {e}", comm.rank());
    }
    let clock = module
        .kernel(kernels::TRACE_CLOCK)
        .and_then(|k| trace.attach_clock(comm.gpu(), k));
    if let Err(e) = clock {
        tracing::warn!("trace: rank {}: no clock pair: {e}", comm.rank());
    }
}
