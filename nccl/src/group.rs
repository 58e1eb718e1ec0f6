//! `ncclGroupStart` / `ncclGroupEnd`: a group depth per thread; inside a group, communicator
//! inits, collectives and sends/receives are recorded, and the outermost `ncclGroupEnd` runs
//! them: the inits first, each on a thread of its own (so one thread can initialise the ranks
//! of several devices, whose inits wait for each other), then each communicator's calls, on a
//! thread per communicator when there are several (their calls wait for each other too). A
//! communicator's calls are recorded in call order in one [`Group`](mscclpp::collectives::Group)
//! of the library's collectives, which runs its collectives in order and then all its sends
//! and receives together (`p2p.rs`), all on one stream: the first call's, which first waits
//! for the other streams of the batch, which then wait for it (NCCL makes one operation of a
//! group whatever its streams). A call outside an NCCL group is a library group of one call.
//!
//! A call of the group that fails its checks returns its error at once and poisons the group:
//! `ncclGroupEnd` then runs nothing, fails the group's inits and returns that error, as NCCL
//! does. Every communicator's sends to and receives from itself are checked before anything
//! runs, so a group whose sends and receives cannot match there leaves every stream untouched.
//!
//! Outside a group each call runs at once: [`enqueue`] is the one path for both.
//!
//! State: the group of each thread is thread-local (a group belongs to the thread that
//! started it, as in NCCL); at its end the batches run on scoped threads that share only the
//! communicators (`Arc<Comm>`), joined before `ncclGroupEnd` returns.

use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::Arc;

use mscclpp::host::gpu::Stream;

use crate::abi::ncclResult_t;
use crate::collectives::{self, Op};
use crate::comm::{CallStream, Comm, Handle};
use crate::error::{NcclError, Outcome};
use crate::init::InitJob;
use crate::p2p::{self, P2p};

/// A recorded call.
#[derive(Clone, Copy, Debug)]
pub enum Call {
    /// A collective on the caller's `stream`.
    Coll {
        /// What.
        op: Op,
        /// The caller's stream.
        stream: u64,
    },
    /// A send or a receive.
    P2p(P2p),
}

#[derive(Default)]
struct Group {
    depth: usize,
    inits: Vec<(Arc<Handle>, InitJob)>,
    calls: Vec<(Arc<Comm>, Call)>,
    /// The first failure of a call inside the group (code, text).
    failed: Option<(ncclResult_t, String)>,
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::default();
}

fn with<T>(f: impl FnOnce(&mut Group) -> T) -> T {
    GROUP.with(|g| f(&mut g.borrow_mut()))
}

/// Whether the calling thread is inside a group.
pub fn in_group() -> bool {
    with(|g| g.depth > 0)
}

/// `ncclGroupStart`.
pub fn start() -> Outcome {
    with(|g| g.depth += 1);
    Ok(ncclResult_t::ncclSuccess)
}

/// Records a failure of a call made inside a group (the first one wins).
pub fn note_failure(e: &NcclError) {
    with(|g| {
        if g.depth > 0 && g.failed.is_none() {
            g.failed = Some((e.code(), e.text()));
        }
    });
}

/// Records an init for the end of the group.
pub fn defer_init(h: Arc<Handle>, job: InitJob) {
    with(|g| g.inits.push((h, job)));
}

/// A collective or a send/receive: `make` checks the arguments and names the communicator
/// and the call, which runs now or at the end of the group; a failure inside a group
/// poisons it.
pub fn enqueue(make: impl FnOnce() -> Result<(Arc<Comm>, Call), NcclError>) -> Outcome {
    let r = make().and_then(|(comm, call)| submit(comm, call));
    if let Err(e) = &r {
        note_failure(e);
    }
    r
}

/// `ncclGroupSimulateEnd`: closes the group level as `ncclGroupEnd` would, but runs nothing
/// (the outermost level fails the group's inits and drops its calls); simulation itself is
/// not implemented, which the caller is told.
pub fn simulate_end() -> Outcome {
    let taken = with(|g| {
        if g.depth == 0 {
            return Err(NcclError::GroupUnbalanced);
        }
        g.depth -= 1;
        if g.depth > 0 {
            return Ok(Vec::new());
        }
        g.calls.clear();
        g.failed = None;
        Ok(std::mem::take(&mut g.inits))
    })?;
    let e = NcclError::NotImplemented {
        what: "ncclGroupSimulateEnd",
        why: "there is no performance model; the group was closed and nothing ran",
    };
    for (h, _) in taken {
        h.finish(Err(NcclError::GroupFailed {
            code: e.code(),
            first: e.text(),
        }));
    }
    Err(e)
}

/// Runs `call` on `comm` now, or records it for the end of the group.
fn submit(comm: Arc<Comm>, call: Call) -> Outcome {
    let recorded = with(|g| {
        if g.depth > 0 {
            g.calls.push((comm.clone(), call));
            true
        } else {
            false
        }
    });
    if !recorded {
        check_p2p(&comm, &[call])?;
        run_batch(&comm, &[call])?;
    }
    Ok(ncclResult_t::ncclSuccess)
}

/// `ncclGroupEnd`.
pub fn end() -> Outcome {
    let taken = with(|g| {
        if g.depth == 0 {
            return Err(NcclError::GroupUnbalanced);
        }
        g.depth -= 1;
        if g.depth > 0 {
            return Ok(None);
        }
        Ok(Some((
            std::mem::take(&mut g.inits),
            std::mem::take(&mut g.calls),
            g.failed.take(),
        )))
    })?;
    let Some((inits, calls, failed)) = taken else {
        return Ok(ncclResult_t::ncclSuccess);
    };
    if let Some((code, first)) = failed {
        for (h, _) in &inits {
            h.finish(Err(NcclError::GroupFailed {
                code,
                first: first.clone(),
            }));
        }
        return Err(NcclError::GroupFailed { code, first });
    }
    run_inits(inits)?;
    run_calls(calls)?;
    Ok(ncclResult_t::ncclSuccess)
}

/// Runs the inits, each on a thread of its own when there are several; every handle is
/// finished; returns the first failure.
pub fn run_inits(inits: Vec<(Arc<Handle>, InitJob)>) -> Result<(), NcclError> {
    let one = |(h, job): &(Arc<Handle>, InitJob)| {
        let r = job.run();
        // A split without a color succeeds with no communicator (its handle is not in the
        // table: nobody sees it).
        let out = match &r {
            Err(NcclError::SplitWithoutColor) | Ok(_) => None,
            Err(e) => Some((e.code(), e.text())),
        };
        h.finish(r);
        out.map_or(Ok(()), |(code, first)| {
            Err(NcclError::GroupFailed { code, first })
        })
    };
    if let [only] = inits.as_slice() {
        return one(only);
    }
    let results = on_threads("initialise a communicator", &inits, one);
    for ((h, _), r) in inits.iter().zip(&results) {
        if let Err(e) = r {
            // A thread that never ran (or panicked) left its handle pending.
            h.finish_if_pending(e);
        }
    }
    results.into_iter().collect()
}

/// Checks that `comm`'s sends and receives among `calls` can run ([`p2p::check_self_pairs`]).
fn check_p2p(comm: &Comm, calls: &[Call]) -> Result<(), NcclError> {
    let ops: Vec<P2p> = calls
        .iter()
        .filter_map(|c| match c {
            Call::P2p(p) => Some(*p),
            Call::Coll { .. } => None,
        })
        .collect();
    p2p::check_self_pairs(comm.rank, &ops)
}

/// Runs one communicator's calls: recorded in call order in one group of the library's
/// collectives, which queues the collectives in order and then all the sends and receives
/// together (on CUDA with the thread's capture mode relaxed: [`Comm::relaxed_capture`]); then
/// (CPU backend) waits for them.
fn run_batch(comm: &Comm, calls: &[Call]) -> Result<(), NcclError> {
    let _relaxed = comm.relaxed_capture()?;
    let mut streams: Vec<u64> = Vec::new();
    for call in calls {
        let s = match call {
            Call::Coll { stream, .. } => *stream,
            Call::P2p(p) => p.stream,
        };
        if !streams.contains(&s) {
            streams.push(s);
        }
    }
    on_one_stream(comm, &streams, |s| {
        let mut g = comm.coll.group();
        for call in calls {
            match call {
                Call::Coll { op, .. } => collectives::record(&mut g, op)?,
                Call::P2p(p) => p2p::record(&mut g, p)?,
            }
        }
        g.end(s)
            .map_err(NcclError::library("running the group's calls"))
    })?;
    comm.complete()
}

/// Runs `queue` on the first of `streams` (the callers' streams of one communicator's batch,
/// in call order) after the work queued so far on the others, and makes the others' later
/// work wait for it: one operation, as NCCL makes a group whatever its streams (events; with
/// one stream, or on the CPU backend, nothing but the call).
fn on_one_stream(
    comm: &Comm,
    streams: &[u64],
    queue: impl FnOnce(&Stream) -> Result<(), NcclError>,
) -> Result<(), NcclError> {
    let first = comm.stream(streams.first().copied().unwrap_or(0) as *mut c_void)?;
    if streams.len() < 2 || matches!(first, CallStream::Own(_)) {
        return queue(&first);
    }
    let others: Vec<CallStream<'_>> = streams[1..]
        .iter()
        .map(|&s| comm.stream(s as *mut c_void))
        .collect::<Result<_, _>>()?;
    let event = || {
        comm.gpu()
            .event()
            .map_err(NcclError::library("joining the group's streams"))
    };
    for o in &others {
        let e = event()?;
        o.record(&e)
            .and_then(|()| first.wait_event(&e))
            .map_err(NcclError::library("joining the group's streams"))?;
    }
    queue(&first)?;
    let done = event()?;
    first
        .record(&done)
        .map_err(NcclError::library("joining the group's streams"))?;
    for o in &others {
        o.wait_event(&done)
            .map_err(NcclError::library("joining the group's streams"))?;
    }
    Ok(())
}

fn run_calls(calls: Vec<(Arc<Comm>, Call)>) -> Result<(), NcclError> {
    let mut batches: Vec<(Arc<Comm>, Vec<Call>)> = Vec::new();
    for (comm, call) in calls {
        match batches.iter_mut().find(|(c, _)| Arc::ptr_eq(c, &comm)) {
            Some((_, v)) => v.push(call),
            None => batches.push((comm, vec![call])),
        }
    }
    for (c, calls) in &batches {
        check_p2p(c, calls)?;
    }
    match batches.as_slice() {
        [] => Ok(()),
        [(c, calls)] => run_batch(c, calls),
        _ => on_threads("run a communicator's calls", &batches, |(c, calls)| {
            run_batch(c, calls)
        })
        .into_iter()
        .collect(),
    }
}

/// Runs `f` on every item, each on a scoped thread of its own; the results in order (a panic
/// of `f` is [`NcclError::Panicked`]).
fn on_threads<T: Sync>(
    what: &'static str,
    items: &[T],
    f: impl Fn(&T) -> Result<(), NcclError> + Sync,
) -> Vec<Result<(), NcclError>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = items
            .iter()
            .map(|item| {
                let f = &f;
                std::thread::Builder::new()
                    .name("nccl-group".into())
                    .spawn_scoped(s, move || {
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(item)))
                            .unwrap_or(Err(NcclError::Panicked { what }))
                    })
                    .map_err(|source| NcclError::Thread { what, source })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h.join().unwrap_or(Err(NcclError::Panicked { what })),
                Err(e) => Err(e),
            })
            .collect()
    })
}
