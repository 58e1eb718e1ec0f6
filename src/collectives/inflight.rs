//! What a `Collectives` has queued outside the issue order and may not have seen end: one
//! event per stream its one-sided calls (`put_signal`, `signal`) queued work on, recorded
//! after its latest call there ([`InFlight::note`]), so that a revoke (`Collectives::revoke`)
//! can wait until every launch it made has ended ([`InFlight::drain`], with the issue order's
//! marker, `order.rs`, which follows every collective and group: they run in issue order, so
//! the marker after the last one ends after all of them) before anything may be freed,
//! whatever streams the callers used. The collectives take no lock here: their one lock per
//! call is the issue order's.
//!
//! Shared state: the list of (stream handle, event) pairs, behind a mutex (written by every
//! one-sided call's `note`, read by `drain`). An event is re-recorded on each call on its stream, so it
//! always marks that stream's latest call; the list keeps at most [`KEPT`] streams' events,
//! dropping those whose work has ended when it grows past that (a caller that makes a stream
//! per call does not grow it without bound). Work queued while a stream captures a CUDA graph
//! is not noted (an event recorded into a capture cannot be waited on from the host; a graph's
//! replays are its owner's).

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use mscclpp_host::Result;
use mscclpp_host::gpu::{Event, Stream};

/// Streams whose events are kept before ended ones are dropped.
const KEPT: usize = 64;

/// The events of the streams a `Collectives` queued on (module docs).
#[derive(Default)]
pub(crate) struct InFlight {
    streams: Mutex<Vec<(u64, Event)>>,
}

impl InFlight {
    /// The list, poison-tolerant (no code panics while holding it).
    fn locked(&self) -> MutexGuard<'_, Vec<(u64, Event)>> {
        mscclpp_host::sync::lock(&self.streams)
    }

    /// Marks the end of the work queued on `stream` so far.
    pub fn note(&self, stream: &Stream) -> Result<()> {
        if stream.is_capturing()? {
            return Ok(());
        }
        let raw = stream.raw();
        let mut streams = self.locked();
        if let Some((_, e)) = streams.iter().find(|(r, _)| *r == raw) {
            return stream.record(e);
        }
        if streams.len() >= KEPT {
            let mut kept = Vec::with_capacity(streams.len());
            for (r, e) in streams.drain(..) {
                if !e.query().unwrap_or(false) {
                    kept.push((r, e));
                }
            }
            *streams = kept;
        }
        let e = stream.gpu().event()?;
        stream.record(&e)?;
        streams.push((raw, e));
        Ok(())
    }

    /// Waits until the work noted on every stream has ended, or `timeout`; whether it has.
    pub fn drain(&self, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        let streams = self.locked();
        for (_, e) in streams.iter() {
            let left = deadline.saturating_duration_since(Instant::now());
            if !e.synchronize_timeout(left)? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}
