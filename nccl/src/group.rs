//! `ncclGroupStart` / `ncclGroupEnd`: a group depth per thread; inside a group, communicator
//! inits, collective registrations (windows: [`Setup`]), collectives and sends/receives are
//! recorded, and the outermost `ncclGroupEnd` runs them: the inits first, each on a thread of
//! its own (so one thread can initialise the ranks of several devices, whose inits wait for
//! each other), then the registrations, likewise (as nccl-tests' `-R 2 -g N` registers a
//! window of every rank it drives in one group), then the calls, queued by the calling thread
//! communicator after communicator without waiting for any (a call waits for its peers on the
//! device, not on the host), and only then waited for (CPU backend): a group over many
//! communicators starts no thread. A
//! communicator's calls are recorded in call order in one [`Group`](mscclpp::collectives::Group)
//! of the library's collectives, which runs its collectives in order and then all its sends
//! and receives together (`p2p.rs`), all on one stream: the first call's, which first waits
//! for the other streams of the batch, which then wait for it (NCCL makes one operation of a
//! group whatever its streams).
//!
//! A call of the group that fails its checks returns its error at once and poisons the group:
//! `ncclGroupEnd` then runs nothing, fails the group's inits and returns that error, as NCCL
//! does. Every communicator's sends to and receives from itself are checked before anything
//! runs, so a group whose sends and receives cannot match there leaves every stream untouched.
//!
//! [`enqueue`] is the one path of every collective and send/receive: outside a group it goes
//! straight to the library (`Collectives::queue`, no group of one); inside one it is recorded.
//! The inits a group defers are [`Init`]s, which `init.rs` makes.
//!
//! State: the group of each thread is thread-local (a group belongs to the thread that
//! started it, as in NCCL); at its end the inits and registrations of several communicators run
//! on scoped threads that share only the communicators (`Arc<Comm>`), joined before
//! `ncclGroupEnd` returns.

use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::Arc;

use mscclpp::host::gpu::Stream;

use crate::abi::ncclResult_t;
use crate::comm::{CallStream, Checked, Comm, Handle};
use crate::error::{NcclError, Outcome};
use crate::p2p;

/// An init deferred to the end of the group: what makes the communicator (`init.rs`).
pub trait Init: Send + Sync {
    /// Makes it (a split without a color: [`NcclError::SplitWithoutColor`]).
    fn run(&self) -> Result<Comm, NcclError>;
}

/// A deferred init and the handle it finishes.
pub type Deferred = (Arc<Handle>, Box<dyn Init>);

/// A collective registration of one communicator (`ncclCommWindowRegister`,
/// `ncclCommWindowDeregister`): run now outside a group, at its end inside one
/// ([`now_or_at_end`]).
pub type Setup = Box<dyn Fn(&Comm) -> Result<(), NcclError> + Send + Sync>;

/// A call as a group records it: the library's call (and the NCCL function that made it), on
/// the caller's stream.
pub type Recorded = (Checked, u64);

#[derive(Default)]
struct Group {
    depth: usize,
    inits: Vec<Deferred>,
    setups: Vec<(Arc<Comm>, Setup)>,
    calls: Vec<(Arc<Comm>, Recorded)>,
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

/// Runs `setup` on `comm` now outside a group; inside one, records it for the group's end.
pub fn now_or_at_end(comm: Arc<Comm>, setup: Setup) -> Result<(), NcclError> {
    if !in_group() {
        return setup(&comm);
    }
    with(|g| g.setups.push((comm, setup)));
    Ok(())
}

/// Records an init for the end of the group.
pub fn defer_init(h: Arc<Handle>, job: Box<dyn Init>) {
    with(|g| g.inits.push((h, job)));
}

/// A collective or a send/receive: `make` checks the arguments and names the communicator,
/// the call and the caller's stream; the call runs now or at the end of the group; a failure
/// inside a group poisons it.
pub fn enqueue(make: impl FnOnce() -> Result<(Arc<Comm>, Recorded), NcclError>) -> Outcome {
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
fn submit(comm: Arc<Comm>, call: Recorded) -> Outcome {
    let call = with(|g| {
        if g.depth > 0 {
            g.calls.push((comm.clone(), call));
            None
        } else {
            Some(call)
        }
    });
    if let Some((call, stream)) = call {
        p2p::check_self_pairs(comm.rank, [&call.call])?;
        run_one(&comm, &call, stream)?;
    }
    Ok(ncclResult_t::ncclSuccess)
}

/// Queues one call outside a group straight on the library (with the thread's capture mode
/// relaxed on CUDA: [`Comm::relaxed_capture`]); then (CPU backend) waits for it.
fn run_one(comm: &Comm, c: &Checked, stream: u64) -> Result<(), NcclError> {
    let _relaxed = comm.relaxed_capture()?;
    let s = comm.stream(stream as *mut c_void)?;
    // SAFETY: NCCL's contract: the caller's buffers hold what the call reads and writes
    // (checked non-null where it moves data) until the work queued on its stream completes,
    // and every rank makes the same calls.
    unsafe { comm.coll.queue(&c.call, &s, None) }.map_err(NcclError::library(c.function))?;
    comm.complete_for(stream as *mut c_void)
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
            std::mem::take(&mut g.setups),
            std::mem::take(&mut g.calls),
            g.failed.take(),
        )))
    })?;
    let Some((inits, setups, calls, failed)) = taken else {
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
    run_setups(&setups)?;
    run_calls(calls)?;
    Ok(ncclResult_t::ncclSuccess)
}

/// Runs the inits, each on a thread of its own when there are several; every handle is
/// finished; returns the first failure.
pub fn run_inits(inits: Vec<Deferred>) -> Result<(), NcclError> {
    let one = |(h, job): &Deferred| {
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

/// Queues one communicator's calls: recorded in call order in one group of the library's
/// collectives, which queues the collectives in order and then all the sends and receives
/// together (on CUDA with the thread's capture mode relaxed: [`Comm::relaxed_capture`]). The
/// caller then waits for them ([`Comm::complete_for`] with [`first_stream`]).
fn queue_batch(comm: &Comm, calls: &[Recorded]) -> Result<(), NcclError> {
    let _relaxed = comm.relaxed_capture()?;
    let mut streams: Vec<u64> = Vec::new();
    for &(_, s) in calls {
        if !streams.contains(&s) {
            streams.push(s);
        }
    }
    on_one_stream(comm, &streams, |s| {
        let mut g = comm.coll.group();
        for (c, _) in calls {
            // SAFETY: NCCL's contract, as in `run_one`, until the group's work completes.
            unsafe { g.add(&c.call, None) }.map_err(NcclError::library(c.function))?;
        }
        g.end(s)
            .map_err(NcclError::library("running the group's calls"))
    })
}

/// The stream a batch runs on: its first call's.
fn first_stream(calls: &[Recorded]) -> *mut c_void {
    calls.first().map_or(0, |&(_, s)| s) as *mut c_void
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

/// Runs the deferred registrations, each on a thread of its own when there are several (one
/// thread may drive every rank of a collective registration); returns the first failure.
fn run_setups(setups: &[(Arc<Comm>, Setup)]) -> Result<(), NcclError> {
    match setups {
        [] => Ok(()),
        [(c, f)] => f(c),
        _ => on_threads("register a window", setups, |(c, f)| f(c))
            .into_iter()
            .collect(),
    }
}

/// Runs every communicator's batch (`queue_batch`): all queued first, by this thread, then all
/// waited for, so that the batches of several communicators, whose kernels wait for each
/// other, run together without a thread each.
fn run_calls(calls: Vec<(Arc<Comm>, Recorded)>) -> Result<(), NcclError> {
    let mut batches: Vec<(Arc<Comm>, Vec<Recorded>)> = Vec::new();
    for (comm, call) in calls {
        match batches.iter_mut().find(|(c, _)| Arc::ptr_eq(c, &comm)) {
            Some((_, v)) => v.push(call),
            None => batches.push((comm, vec![call])),
        }
    }
    for (c, calls) in &batches {
        p2p::check_self_pairs(c.rank, calls.iter().map(|(checked, _)| &checked.call))?;
    }
    // Every batch is queued (and then waited for) even when one fails: a peer's kernels wait
    // for this rank's.
    let queued: Vec<Result<(), NcclError>> = batches
        .iter()
        .map(|(c, calls)| queue_batch(c, calls))
        .collect();
    let mut first = Ok(());
    for ((c, calls), q) in batches.iter().zip(queued) {
        let done = q.and_then(|()| c.complete_for(first_stream(calls)));
        if first.is_ok() {
            first = done;
        }
    }
    first
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
