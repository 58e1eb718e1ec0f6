//! The issue order of one communicator's calls, whatever streams they are queued on (NCCL's:
//! it serializes a communicator's work). Two calls of one `Collectives` must never run at the
//! same time, because they share its LL flags and slots, its scratch regions, its descriptor
//! area and the semaphores of its channels; on one stream the stream orders them, on two
//! nothing would.
//!
//! So every eager call (a public call, or a group's end) runs through [`IssueOrder::run`]:
//! under its lock, a call on another stream than the last call's first makes its stream wait
//! for the marker recorded after the last call (`Stream::wait_event`: a device-side wait, the
//! host does not wait), then queues its work, then records the marker on its own stream.
//! Calls from several host threads are queued one at a time, in the order they take the lock,
//! which is the order they run in.
//!
//! Under CUDA-graph capture the marker is neither waited for nor recorded: a captured call runs
//! when its graph is launched, in the order the launching streams give (a capture may not wait
//! for work outside it).
//!
//! The marker also tells when the communicator's queued work is done ([`IssueOrder::drain`]):
//! what destroying, finalizing, aborting or revoking it waits for, instead of the whole
//! device.
//!
//! Shared state: [`State`] behind one mutex (the last stream and the marker), taken once per
//! call and held while it is queued: the one lock an eager collective takes (the drop-in's
//! hot path, `nccl/tests/hot_path.rs`), counted by `mscclpp_host::sync`.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use mscclpp_host::Result;
use mscclpp_host::gpu::{Event, Gpu, Stream};

/// What the last eager call left.
struct State {
    /// The stream of the last eager call (its handle), if any.
    last: Option<u64>,
    /// Recorded on `last` after the last eager call's work.
    marker: Event,
}

/// The issue order of one communicator's calls (module docs).
pub(crate) struct IssueOrder {
    state: Mutex<State>,
}

impl IssueOrder {
    /// No call yet, on `gpu`.
    pub fn new(gpu: &Gpu) -> Result<Self> {
        Ok(Self {
            state: Mutex::new(State {
                last: None,
                marker: gpu.marker()?,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        mscclpp_host::sync::lock(&self.state)
    }

    /// Runs `queue`, which queues one call on `stream` (`capturing`: whether the stream is
    /// being captured), after the calls queued before it (module docs).
    pub fn run<T>(
        &self,
        stream: &Stream,
        capturing: bool,
        queue: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let mut st = self.lock();
        if capturing {
            return queue();
        }
        let id = stream.raw();
        if st.last.is_some_and(|last| last != id) {
            stream.wait_event(&st.marker)?;
        }
        let out = queue();
        // Recorded whatever `queue` returned: it may have queued part of the call.
        stream.record(&st.marker)?;
        st.last = Some(id);
        out
    }

    /// Waits until the work of every eager call queued so far is done, at most `timeout`;
    /// whether it is.
    pub fn drain(&self, timeout: Duration) -> Result<bool> {
        let st = self.lock();
        if st.last.is_none() {
            return Ok(true);
        }
        st.marker.synchronize_timeout(timeout)
    }
}
