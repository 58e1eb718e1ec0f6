//! CPU-backend streams and events.
//!
//! A stream is a worker thread that runs its queue in order: copies with `memcpy`, kernel
//! launches on the grid emulator, event records and waits. Work is asynchronous as on a GPU:
//! `launch` returns at once, so a host thread can serve the kernel (a proxy popping its FIFO)
//! while it runs. The first failure of queued work is kept and returned by the next
//! `synchronize` (CUDA reports asynchronous errors the same way).
//!
//! # The queue
//!
//! The queue and the progress counters live together in `Shared::progress` (a mutex):
//! submitters push an [`Op`] and count it under the lock and wake the worker (`Shared::work`);
//! the worker pops under the lock, runs the op without it, then counts it completed and wakes
//! the waiters (`Shared::cv`). The queue is a `VecDeque` that keeps its capacity, and a kernel
//! launched through [`Stream::launch_kernel`] carries its parameters inline (up to
//! [`INLINE_PARAM_BYTES`]), so once a stream has held as many ops as it will, queuing work
//! allocates nothing (the drop-in's hot path counts on it: `nccl/tests/hot_path.rs`).
//!
//! These locks stand for the GPU driver's own queue: they are taken through
//! [`lock_uncounted`](crate::sync::lock_uncounted), so the per-thread lock count of
//! `crate::sync` counts the library's locks only, as on a GPU, where a launch takes none of
//! ours.
//!
//! # Handles (foreign streams)
//!
//! Every stream has a handle ([`Stream::raw`]): a non-zero `u64`, unique in the process, kept in
//! a process-wide table of live streams (`LIVE`: a mutex; written when a stream is made or
//! dropped, read by [`Stream::borrow`]). It is the CPU backend's `CUstream`: code that receives
//! a stream as an integer (the C ABI, a caller's stream) borrows it with [`Stream::borrow`],
//! which queues on the same worker without owning it. A borrowed stream holds the queue weakly:
//! once the owner is dropped, work queued through the borrowed one is refused with an error
//! (never lost silently, never run after the owner's drop). The handles `0`, `1` and `2` (CUDA's
//! default streams) name the device's default stream, owned by the device (`super::Device`).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use mscclpp_device::arch::host::grid::{self, GridDims};

use crate::error::{BackendError, Error, Result};
use crate::sync::{lock_uncounted, wait, wait_timeout};

/// Longest a stream's wait for a value ([`Stream::wait_value_u64`]) polls before it records a
/// failure and lets the stream go on (the one-sided calls' service releases its waits long
/// before: this only bounds a wait nobody releases).
pub const WAIT_VALUE_LIMIT: Duration = Duration::from_secs(600);

/// How long dropping a stream waits for its queue before leaving the worker to finish alone.
const DROP_WAIT: Duration = Duration::from_secs(10);

// Large on purpose: a launch carries its parameters inline (module docs, "The queue"), and
// the queue keeps its slots, so the size costs memory once, never an allocation per op.
#[allow(clippy::large_enum_variant)]
enum Op {
    Copy {
        dst: u64,
        src: u64,
        bytes: usize,
    },
    Launch {
        name: &'static str,
        dims: GridDims,
        body: Body,
    },
    WriteValue {
        dst: u64,
        value: u64,
    },
    WaitValue {
        addr: u64,
        value: u64,
        timeout: Duration,
    },
    Record(Arc<EventState>, u64),
    Wait(Arc<EventState>, u64),
}

/// Largest kernel parameters [`Stream::launch_kernel`] carries inline (larger ones are boxed).
pub const INLINE_PARAM_BYTES: usize = 512;

/// A kernel's body as the queue holds it (large on purpose, as [`Op`]).
#[allow(clippy::large_enum_variant)]
enum Body {
    /// Any closure ([`Stream::launch`]).
    Boxed(Box<dyn Fn() + Send + Sync>),
    /// A host kernel and its parameters, inline ([`Stream::launch_kernel`]).
    Inline(InlineKernel),
}

/// A host kernel `unsafe fn(P)` and its parameters, without an allocation: `run` is the
/// kernel's trampoline, which reads `P` back from `params` and calls `host` with it.
struct InlineKernel {
    run: unsafe fn(usize, &[u64; INLINE_PARAM_BYTES / 8]),
    host: usize,
    params: [u64; INLINE_PARAM_BYTES / 8],
}

/// [`InlineKernel::run`] for parameters `P`.
///
/// # Safety
/// `host` is an `unsafe fn(P)` cast to `usize` and `params` holds a `P` in its first bytes
/// ([`InlineKernel`]'s construction); calling it is the launch's contract.
unsafe fn run_inline<P: bytemuck::Pod>(host: usize, params: &[u64; INLINE_PARAM_BYTES / 8]) {
    let p: P = bytemuck::pod_read_unaligned(&bytemuck::bytes_of(params)[..size_of::<P>()]);
    // SAFETY: `host` was made from an `unsafe fn(P)` (the caller's contract); function
    // pointers and `usize` have the same size.
    let f = unsafe { std::mem::transmute::<usize, unsafe fn(P)>(host) };
    // SAFETY: the launch's contract, passed on.
    unsafe { f(p) }
}

impl Body {
    fn run(&self, dims: GridDims) -> std::result::Result<(), grid::GridError> {
        match self {
            Self::Boxed(b) => grid::run_grid(dims, &**b),
            Self::Inline(k) => {
                // SAFETY: made by `launch_kernel` from a kernel and its parameters, under
                // its caller's contract.
                let body = || unsafe { (k.run)(k.host, &k.params) };
                grid::run_grid(dims, &body)
            }
        }
    }
}

/// The queue and its progress (module docs, "The queue").
#[derive(Default)]
struct Progress {
    queue: VecDeque<Op>,
    /// The owner dropped the stream: the worker ends once the queue is empty.
    closed: bool,
    submitted: u64,
    completed: u64,
    error: Option<BackendError>,
}

struct Shared {
    progress: Mutex<Progress>,
    /// Progress was made (waiters of `synchronize`, `query`, drop).
    cv: Condvar,
    /// Work was queued or the stream closed (the worker).
    work: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Progress> {
        lock_uncounted(&self.progress)
    }
}

/// What the owner holds and every borrower holds weakly: once the owner drops it, work
/// queued through a borrower is refused.
struct Core {
    id: u64,
}

/// The live streams of this process by handle (module docs).
static LIVE: Mutex<Option<HashMap<u64, Live>>> = Mutex::new(None);

/// A live stream in [`LIVE`]: its device ordinal, its queue and its progress.
type Live = (usize, Weak<Core>, Weak<Shared>);

/// The next stream handle (never 0, 1 or 2: those name default streams). Relaxed: only
/// uniqueness matters.
static NEXT_ID: AtomicU64 = AtomicU64::new(0x5354_0000_0000_0010);

/// The owner's or a borrower's hold on the queue.
enum Hold {
    /// The owner (the worker ends once it is dropped and the queue is empty).
    Owned(Option<Arc<Core>>),
    /// A borrower (module docs).
    Borrowed(Weak<Core>),
}

/// An in-order queue run by one worker thread.
pub struct Stream {
    ordinal: usize,
    id: u64,
    hold: Hold,
    shared: Arc<Shared>,
    worker: Option<std::thread::JoinHandle<()>>,
}

impl Stream {
    /// The live stream with handle `raw`, used without owning it (module docs): queued work
    /// runs on the owner's worker, in order with the owner's. `None` when no live stream has
    /// that handle; `Some(Err(ordinal))` when it belongs to device `ordinal`, not `ordinal`.
    pub(super) fn borrow(raw: u64, ordinal: usize) -> Option<std::result::Result<Self, usize>> {
        let live = lock_uncounted(&LIVE);
        let (owner, core, shared) = live.as_ref()?.get(&raw)?;
        if *owner != ordinal {
            return Some(Err(*owner));
        }
        let shared = shared.upgrade()?;
        Some(Ok(Self {
            ordinal,
            id: raw,
            hold: Hold::Borrowed(core.clone()),
            shared,
            worker: None,
        }))
    }

    /// This stream's handle (module docs).
    pub fn raw(&self) -> u64 {
        self.id
    }

    /// Whether this stream was borrowed (dropping it leaves the queue alone).
    pub fn is_borrowed(&self) -> bool {
        matches!(self.hold, Hold::Borrowed(_))
    }

    pub(super) fn new(ordinal: usize) -> Result<Self> {
        let shared = Arc::new(Shared {
            progress: Mutex::new(Progress::default()),
            cv: Condvar::new(),
            work: Condvar::new(),
        });
        let s = shared.clone();
        let worker = std::thread::Builder::new()
            .name(format!("cpu-stream-{ordinal}"))
            .spawn(move || run_queue(&s))
            .map_err(|e| Error::Stream {
                op: "create stream",
                ordinal,
                source: BackendError::Os {
                    call: "thread spawn",
                    source: e,
                },
            })?;
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let core = Arc::new(Core { id });
        lock_uncounted(&LIVE)
            .get_or_insert_with(HashMap::new)
            .insert(
                id,
                (ordinal, Arc::downgrade(&core), Arc::downgrade(&shared)),
            );
        Ok(Self {
            ordinal,
            id,
            hold: Hold::Owned(Some(core)),
            shared,
            worker: Some(worker),
        })
    }

    fn submit(&self, op: Op) -> std::result::Result<(), BackendError> {
        let core = match &self.hold {
            Hold::Owned(core) => core.clone(),
            Hold::Borrowed(core) => core.upgrade(),
        };
        let core = core.ok_or_else(|| {
            BackendError::Invalid(format!(
                "stream {:#x} is gone (its owner was dropped)",
                self.id
            ))
        })?;
        let mut p = self.shared.lock();
        if p.closed {
            return Err(BackendError::Invalid(format!(
                "the worker of stream {:#x} has stopped",
                core.id
            )));
        }
        p.queue.push_back(op);
        p.submitted += 1;
        drop(p);
        self.shared.work.notify_one();
        Ok(())
    }

    /// Queues a copy.
    ///
    /// # Safety
    /// Both ranges valid and disjoint until the copy runs.
    pub unsafe fn copy_dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.submit(Op::Copy { dst, src, bytes })
            .map_err(|source| Error::Copy {
                direction: "dtod",
                bytes,
                ordinal: self.ordinal,
                source,
            })
    }

    /// Queues a release store of `value` to the u64 at `dst`, after the work queued before.
    ///
    /// # Safety
    /// `dst` is a live, 8-byte aligned address until the store runs.
    pub unsafe fn write_value_u64(&self, dst: u64, value: u64) -> Result<()> {
        self.submit(Op::WriteValue { dst, value })
            .map_err(|source| Error::Copy {
                direction: "write value",
                bytes: 8,
                ordinal: self.ordinal,
                source,
            })
    }

    /// Queues a wait: later work starts once the u64 at `addr` is at least `value` (an
    /// acquire load, polled with back-off), or after `timeout`, when the stream records an
    /// error and goes on.
    ///
    /// # Safety
    /// `addr` is a live, 8-byte aligned address until the wait ends.
    pub unsafe fn wait_value_u64(&self, addr: u64, value: u64, timeout: Duration) -> Result<()> {
        self.submit(Op::WaitValue {
            addr,
            value,
            timeout,
        })
        .map_err(|source| self.err("wait value", source))
    }

    /// Whether all queued work is done; reports (and clears) a failure of queued work.
    pub fn query(&self) -> Result<bool> {
        let mut p = self.shared.lock();
        if let Some(source) = p.error.take() {
            return Err(self.err("query stream", source));
        }
        Ok(p.completed == p.submitted)
    }

    /// Queues a kernel: `body` runs once per emulated thread of `dims`.
    pub fn launch(
        &self,
        name: &'static str,
        dims: GridDims,
        body: Box<dyn Fn() + Send + Sync>,
    ) -> std::result::Result<(), BackendError> {
        if dims.grid == 0
            || dims.block == 0
            || dims.grid as u64 * dims.block as u64 > grid::MAX_THREADS as u64
        {
            return Err(grid::GridError::BadDims(dims).into());
        }
        self.submit(Op::Launch {
            name,
            dims,
            body: Body::Boxed(body),
        })
    }

    /// Queues the host kernel `host` with `params` ([`launch`](Self::launch) of `host(params)`
    /// per emulated thread), the parameters inline when they fit in [`INLINE_PARAM_BYTES`]
    /// (no allocation), else boxed.
    ///
    /// # Safety
    /// Calling `host(params)` from every emulated thread is sound until the kernel ends (the
    /// launch's contract).
    pub unsafe fn launch_kernel<P: bytemuck::Pod + Send + Sync>(
        &self,
        name: &'static str,
        dims: GridDims,
        host: unsafe fn(P),
        params: P,
    ) -> std::result::Result<(), BackendError> {
        if size_of::<P>() > INLINE_PARAM_BYTES {
            // SAFETY: the caller's contract.
            let body = move || unsafe { host(params) };
            return self.launch(name, dims, Box::new(body));
        }
        if dims.grid == 0
            || dims.block == 0
            || dims.grid as u64 * dims.block as u64 > grid::MAX_THREADS as u64
        {
            return Err(grid::GridError::BadDims(dims).into());
        }
        let mut k = InlineKernel {
            run: run_inline::<P>,
            host: host as usize,
            params: [0; INLINE_PARAM_BYTES / 8],
        };
        bytemuck::bytes_of_mut(&mut k.params)[..size_of::<P>()]
            .copy_from_slice(bytemuck::bytes_of(&params));
        self.submit(Op::Launch {
            name,
            dims,
            body: Body::Inline(k),
        })
    }

    /// Records `event` after the queued work.
    pub fn record(&self, event: &Event) -> Result<()> {
        let generation = {
            let mut s = lock_uncounted(&event.state.inner);
            s.recorded += 1;
            s.recorded
        };
        self.submit(Op::Record(event.state.clone(), generation))
            .map_err(|source| self.err("record event", source))
    }

    /// Later work waits until `event`'s latest record has completed.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        let generation = lock_uncounted(&event.state.inner).recorded;
        self.submit(Op::Wait(event.state.clone(), generation))
            .map_err(|source| self.err("wait event", source))
    }

    /// Waits for the queue; returns (and clears) the first failure of queued work.
    pub fn synchronize(&self) -> Result<()> {
        let mut p = self.shared.lock();
        while p.completed < p.submitted {
            p = wait(&self.shared.cv, p);
        }
        match p.error.take() {
            Some(source) => Err(self.err("synchronize", source)),
            None => Ok(()),
        }
    }

    fn err(&self, op: &'static str, source: BackendError) -> Error {
        Error::Stream {
            op,
            ordinal: self.ordinal,
            source,
        }
    }

    /// Whether all queued work is done.
    pub fn is_idle(&self) -> bool {
        let p = self.shared.lock();
        p.completed == p.submitted
    }

    /// A weak handle the device uses to wait for this stream.
    pub(super) fn watcher(&self) -> StreamWatcher {
        StreamWatcher(Arc::downgrade(&self.shared))
    }
}

/// Lets the device wait for a stream without keeping it alive.
pub(super) struct StreamWatcher(std::sync::Weak<Shared>);

impl StreamWatcher {
    /// Waits until the stream's queued work is done; false once the stream is gone.
    pub(super) fn wait_idle(&self) -> bool {
        let Some(shared) = self.0.upgrade() else {
            return false;
        };
        let mut p = shared.lock();
        while p.completed < p.submitted {
            p = wait(&shared.cv, p);
        }
        true
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let Hold::Owned(core) = &mut self.hold else {
            return; // a borrower leaves the queue to its owner
        };
        if let Some(live) = lock_uncounted(&LIVE).as_mut() {
            live.remove(&self.id);
        }
        // Dropping the owner's core refuses borrowers' work from now on; closing the queue
        // ends the worker once it is empty.
        *core = None;
        self.shared.lock().closed = true;
        self.shared.work.notify_all();
        let deadline = Instant::now() + DROP_WAIT;
        let mut p = self.shared.lock();
        while p.completed < p.submitted {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!("CPU stream dropped with work still running; not waiting for it");
                return;
            }
            p = wait_timeout(&self.shared.cv, p, left);
        }
        drop(p);
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

/// The next op of the queue, waiting for one; `None` once the stream is closed and empty.
fn next_op(shared: &Shared) -> Option<Op> {
    let mut p = shared.lock();
    loop {
        if let Some(op) = p.queue.pop_front() {
            return Some(op);
        }
        if p.closed {
            return None;
        }
        p = wait(&shared.work, p);
    }
}

fn run_queue(shared: &Shared) {
    while let Some(op) = next_op(shared) {
        let result: std::result::Result<(), BackendError> = match op {
            Op::Copy { dst, src, bytes } => {
                // SAFETY: the submitter's contract (`copy_dtod`).
                unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
                Ok(())
            }
            Op::Launch { name, dims, body } => body.run(dims).map_err(|e| {
                tracing::error!("kernel {name} failed on the CPU backend: {e}");
                BackendError::Kernel { name, source: e }
            }),
            Op::WriteValue { dst, value } => {
                // SAFETY: the submitter's contract (`write_value_u64`): an aligned live u64.
                unsafe { std::sync::atomic::AtomicU64::from_ptr(dst as *mut u64) }
                    .store(value, std::sync::atomic::Ordering::Release);
                Ok(())
            }
            Op::WaitValue {
                addr,
                value,
                timeout,
            } => {
                // SAFETY: the submitter's contract (`wait_value_u64`): an aligned live u64.
                let word = unsafe { std::sync::atomic::AtomicU64::from_ptr(addr as *mut u64) };
                let deadline = Instant::now() + timeout;
                let mut backoff = crate::backoff::Backoff::new();
                loop {
                    if word.load(std::sync::atomic::Ordering::Acquire) >= value {
                        break Ok(());
                    }
                    if Instant::now() >= deadline {
                        break Err(BackendError::Invalid(format!(
                            "a wait for {value} at {addr:#x} did not end within {timeout:?}"
                        )));
                    }
                    backoff.snooze();
                }
            }
            Op::Record(state, generation) => {
                let mut s = lock_uncounted(&state.inner);
                s.completed = s.completed.max(generation);
                s.time = Some(Instant::now());
                state.cv.notify_all();
                Ok(())
            }
            Op::Wait(state, generation) => {
                let mut s = lock_uncounted(&state.inner);
                while s.completed < generation {
                    s = wait(&state.cv, s);
                }
                Ok(())
            }
        };
        let mut p = shared.lock();
        p.completed += 1;
        if let Err(e) = result
            && p.error.is_none()
        {
            p.error = Some(e);
        }
        shared.cv.notify_all();
    }
}

#[derive(Default)]
struct EventInner {
    recorded: u64,
    completed: u64,
    time: Option<Instant>,
}

struct EventState {
    inner: Mutex<EventInner>,
    cv: Condvar,
}

/// A marker in a CPU stream.
pub struct Event {
    state: Arc<EventState>,
}

impl Event {
    pub(super) fn new() -> Self {
        Self {
            state: Arc::new(EventState {
                inner: Mutex::new(EventInner::default()),
                cv: Condvar::new(),
            }),
        }
    }

    /// Waits until the latest record has been reached.
    pub fn synchronize(&self) -> Result<()> {
        let mut s = lock_uncounted(&self.state.inner);
        let target = s.recorded;
        while s.completed < target {
            s = wait(&self.state.cv, s);
        }
        Ok(())
    }

    /// Whether the latest record has been reached.
    pub fn query(&self) -> Result<bool> {
        let s = lock_uncounted(&self.state.inner);
        Ok(s.completed >= s.recorded)
    }

    /// Milliseconds from `start` to `self`.
    pub fn elapsed_ms(&self, start: &Event) -> Result<f32> {
        let end = lock_uncounted(&self.state.inner).time;
        let begin = lock_uncounted(&start.state.inner).time;
        match (begin, end) {
            (Some(b), Some(e)) => Ok(e.saturating_duration_since(b).as_secs_f32() * 1e3),
            _ => Err(Error::Stream {
                op: "elapsed time",
                ordinal: 0,
                source: BackendError::Invalid("an event has not completed".into()),
            }),
        }
    }
}
