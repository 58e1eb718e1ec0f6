//! CPU-backend streams and events.
//!
//! A stream is a worker thread that runs its queue in order: copies with `memcpy`, kernel
//! launches on the grid emulator, event records and waits. Work is asynchronous as on a GPU:
//! `launch` returns at once, so a host thread can serve the kernel (a proxy popping its FIFO)
//! while it runs. The first failure of queued work is kept and returned by the next
//! `synchronize` (CUDA reports asynchronous errors the same way).
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

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use mscclpp_device::arch::host::grid::{self, GridDims};

use crate::error::{BackendError, Error, Result};
use crate::sync::{lock, wait, wait_timeout};

/// Longest a stream's wait for a value ([`Stream::wait_value_u64`]) polls before it records a
/// failure and lets the stream go on (the one-sided calls' service releases its waits long
/// before: this only bounds a wait nobody releases).
pub const WAIT_VALUE_LIMIT: Duration = Duration::from_secs(600);

/// How long dropping a stream waits for its queue before leaving the worker to finish alone.
const DROP_WAIT: Duration = Duration::from_secs(10);

enum Op {
    Copy {
        dst: u64,
        src: u64,
        bytes: usize,
    },
    Launch {
        name: &'static str,
        dims: GridDims,
        body: Box<dyn Fn() + Send + Sync>,
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

#[derive(Default)]
struct Progress {
    submitted: u64,
    completed: u64,
    error: Option<BackendError>,
}

struct Shared {
    progress: Mutex<Progress>,
    cv: Condvar,
}

/// What the owner and every borrower of a stream share: the queue's sending end.
struct Core {
    id: u64,
    tx: mpsc::Sender<Op>,
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
        let live = lock(&LIVE);
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
        let (tx, rx) = mpsc::channel::<Op>();
        let shared = Arc::new(Shared {
            progress: Mutex::new(Progress::default()),
            cv: Condvar::new(),
        });
        let s = shared.clone();
        let worker = std::thread::Builder::new()
            .name(format!("cpu-stream-{ordinal}"))
            .spawn(move || run_queue(rx, s))
            .map_err(|e| Error::Stream {
                op: "create stream",
                ordinal,
                source: BackendError::Os {
                    call: "thread spawn",
                    source: e,
                },
            })?;
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let core = Arc::new(Core { id, tx });
        lock(&LIVE).get_or_insert_with(HashMap::new).insert(
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
        // Counted before it is sent, so that `synchronize` never sees it completed early; a
        // send that fails is uncounted again.
        lock(&self.shared.progress).submitted += 1;
        core.tx.send(op).map_err(|_| {
            lock(&self.shared.progress).submitted -= 1;
            self.shared.cv.notify_all();
            BackendError::Invalid(format!("the worker of stream {:#x} has stopped", core.id))
        })
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
        let mut p = lock(&self.shared.progress);
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
        self.submit(Op::Launch { name, dims, body })
    }

    /// Records `event` after the queued work.
    pub fn record(&self, event: &Event) -> Result<()> {
        let generation = {
            let mut s = lock(&event.state.inner);
            s.recorded += 1;
            s.recorded
        };
        self.submit(Op::Record(event.state.clone(), generation))
            .map_err(|source| self.err("record event", source))
    }

    /// Later work waits until `event`'s latest record has completed.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        let generation = lock(&event.state.inner).recorded;
        self.submit(Op::Wait(event.state.clone(), generation))
            .map_err(|source| self.err("wait event", source))
    }

    /// Waits for the queue; returns (and clears) the first failure of queued work.
    pub fn synchronize(&self) -> Result<()> {
        let mut p = lock(&self.shared.progress);
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
        let p = lock(&self.shared.progress);
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
        let mut p = lock(&shared.progress);
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
        if let Some(live) = lock(&LIVE).as_mut() {
            live.remove(&self.id);
        }
        // Dropping the owner's core closes the channel (borrowers hold it weakly), which ends
        // the worker once its queue is empty.
        *core = None;
        let deadline = Instant::now() + DROP_WAIT;
        let mut p = lock(&self.shared.progress);
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

fn run_queue(rx: mpsc::Receiver<Op>, shared: Arc<Shared>) {
    while let Ok(op) = rx.recv() {
        let result: std::result::Result<(), BackendError> = match op {
            Op::Copy { dst, src, bytes } => {
                // SAFETY: the submitter's contract (`copy_dtod`).
                unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
                Ok(())
            }
            Op::Launch { name, dims, body } => grid::run_grid(dims, &*body).map_err(|e| {
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
                let mut s = lock(&state.inner);
                s.completed = s.completed.max(generation);
                s.time = Some(Instant::now());
                state.cv.notify_all();
                Ok(())
            }
            Op::Wait(state, generation) => {
                let mut s = lock(&state.inner);
                while s.completed < generation {
                    s = wait(&state.cv, s);
                }
                Ok(())
            }
        };
        let mut p = lock(&shared.progress);
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
        let mut s = lock(&self.state.inner);
        let target = s.recorded;
        while s.completed < target {
            s = wait(&self.state.cv, s);
        }
        Ok(())
    }

    /// Whether the latest record has been reached.
    pub fn query(&self) -> Result<bool> {
        let s = lock(&self.state.inner);
        Ok(s.completed >= s.recorded)
    }

    /// Milliseconds from `start` to `self`.
    pub fn elapsed_ms(&self, start: &Event) -> Result<f32> {
        let end = lock(&self.state.inner).time;
        let begin = lock(&start.state.inner).time;
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
