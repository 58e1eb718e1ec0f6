//! Communicators behind `ncclComm_t`: the handle table, each handle's state (being
//! initialised, ready, failed), the [`Comm`] a ready one holds, the device a call uses, and
//! the stream a call queues on.
//!
//! A `ncclComm_t` is a value that names one [`Handle`] in the table ([`HANDLES`]), which keeps
//! it alive until `ncclCommDestroy` / `ncclCommAbort`; an incoming handle is only ever looked
//! up in the table, never dereferenced, so a null, foreign or destroyed one is
//! `ncclInvalidArgument`. The values are never reused (a counter, [`HANDLE_BASE`] upward in
//! steps of 16, outside the addresses a process maps), so a destroyed communicator's handle can
//! never name a communicator made later, as a reused heap address would.
//! A handle exists from the init call on (NCCL hands it out at once, also inside a group and
//! for non-blocking inits); its [`State`] turns from `Pending` into `Ready` or `Failed` when
//! the init finishes (at `ncclGroupEnd`, or on the non-blocking init's thread), under the
//! handle's lock; `ncclCommDestroy` / `ncclCommAbort` of a pending handle mark it abandoned
//! and cancel its bootstrap's set-up (`Handle::cancel`: a wait for ranks that never come ends
//! at once, and the init fails), and whoever finishes the init then drops the communicator.
//!
//! # Shared state
//! `HANDLES` (the table) and each handle's state are behind mutexes. A call looks its
//! handle up without either (the hot path takes no lock of its own: `tests/hot_path.rs`):
//! each thread remembers the last few handles it found in the table ([`RECENT`], weak
//! references, thread-local), and a remembered one is used while it is not removed
//! (`Handle::removed`: stored with release by [`Handle::remove`] before the handle leaves the
//! table, loaded with acquire by the lookup); a ready handle's communicator is also in
//! `Handle::ready` (set once, when the init finishes, before the state turns `Ready`), read
//! without the state's lock. `Handle::abandoned` is
//! written (release) by `release` and read (acquire) by `finish`, both under the handle's
//! state lock, so an init that finishes after a destroy always sees it. `Comm::finalized` is
//! swapped (acq-rel) by `ncclCommFinalize` / `ncclCommDestroy` and read (acquire) by every
//! call. `Comm::sticky` (the first asynchronous error) is behind a mutex. The calling threads
//! of one communicator may differ (a watchdog polls while another thread queues work); the
//! library's `Collectives` serialises what it must.
//!
//! # Devices and streams
//! On the CUDA backend a communicator uses the calling thread's current device (as
//! `cudaGetDevice` reports it; device 0 when the thread has no current context), through that
//! device's primary context, as PyTorch and the CUDA runtime do, so pointers and streams are
//! shared with the caller; each call queues on the caller's stream ([`Comm::stream`]), checked
//! to belong to that context. The CPU backend has no CUDA runtime, hence no current device and
//! no caller's streams: `ncclCommInitRank` uses device 0 (`ncclCommInitAll` its device list),
//! and every call runs on the communicator's own stream and is complete when it returns (a
//! group: at `ncclGroupEnd`), unless its stream is one the library made for C callers
//! (`cpu_streams.rs`): then it is queued there and returns at once, as on a GPU.
//!
//! As NCCL does, the calls of one communicator run in the order they were issued, whatever
//! streams they are queued on: the library's `Collectives` makes a call on another stream than
//! the last one's wait (on the device) for the marker recorded after it
//! (`mscclpp::collectives`, `order.rs`); a group's calls are put on one stream (`group.rs`).
//! Every exported function gives the calling thread back the CUDA context it had current
//! (`backend.rs`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use mscclpp::collectives::{Call, Collectives};
use mscclpp::host::bootstrap::Cancel;
use mscclpp::host::gpu::{BackendKind, Gpu, Stream, cuda};

use crate::abi::ncclResult_t;
use crate::error::NcclError;
use crate::registry::{PreMulSums, Registrations};
use crate::sync::lock;

/// The backend every communicator of the process uses (`MSCCLPP_BACKEND`, else CUDA when a
/// device exists, else CPU; chosen once: `backend.rs`).
pub fn backend() -> Result<BackendKind, NcclError> {
    crate::backend::kind().map_err(|e| NcclError::Backend {
        reason: e.to_string(),
    })
}

/// The device a call made now uses: the calling thread's current CUDA device (device 0 when
/// it has none), or device 0 on the CPU backend.
pub fn current_device(kind: BackendKind) -> Result<usize, NcclError> {
    match kind {
        BackendKind::Cuda => Ok(cuda::current_device()
            .map_err(NcclError::library("reading the current CUDA device"))?
            .unwrap_or(0)),
        _ => Ok(0),
    }
}

/// Device `ordinal` of `kind`, opened once per process and kept (on CUDA it holds a
/// reference of the device's primary context).
pub fn gpu(kind: BackendKind, ordinal: usize) -> Result<Gpu, NcclError> {
    static GPUS: Mutex<Vec<(BackendKind, usize, Gpu)>> = Mutex::new(Vec::new());
    let mut gpus = lock(&GPUS);
    if let Some((_, _, g)) = gpus.iter().find(|(k, o, _)| *k == kind && *o == ordinal) {
        return Ok(g.clone());
    }
    let g = Gpu::open(kind, ordinal).map_err(NcclError::library("opening the device"))?;
    gpus.push((kind, ordinal, g.clone()));
    Ok(g)
}

/// What a handle's communicator is now.
pub enum State {
    /// Being initialised: at the end of the group that made it (`in_group`), or on a
    /// non-blocking init's thread.
    Pending {
        /// Whether it waits for `ncclGroupEnd`.
        in_group: bool,
    },
    /// Ready to use.
    Ready(Arc<Comm>),
    /// Its initialisation failed (code and text).
    Failed(ncclResult_t, String),
}

/// What a `ncclComm_t` points to (module docs).
pub struct Handle {
    /// This rank (a split's: its rank in the parent until the split has run).
    pub rank: usize,
    /// Ranks of the communicator (0 for a split that has not run yet: not known).
    pub nranks: usize,
    /// The device ordinal.
    pub device: usize,
    state: Mutex<State>,
    /// The communicator once ready (module docs: read without the state's lock).
    ready: OnceLock<Arc<Comm>>,
    /// Out of the table (module docs).
    removed: AtomicBool,
    /// Set by `ncclCommAbort` / `ncclCommDestroy` while the init was still pending: whoever
    /// finishes the init drops the communicator at once.
    pub abandoned: AtomicBool,
    /// Cancels the init's bootstrap set-up (`release` of a pending handle), so that its wait
    /// for ranks that never come ends at once.
    pub cancel: Cancel,
}

/// Every live handle, by its `ncclComm_t` value.
static HANDLES: Mutex<Option<HashMap<usize, Arc<Handle>>>> = Mutex::new(None);

/// How many handles a thread remembers ([`RECENT`]).
const REMEMBERED: usize = 4;

thread_local! {
    /// The handles this thread found in the table last, newest first (module docs).
    static RECENT: RefCell<[(usize, Weak<Handle>); REMEMBERED]> =
        const { RefCell::new([const { (0, Weak::new()) }; REMEMBERED]) };
}

/// The live handle `ptr` names if this thread remembers it.
fn remembered(ptr: usize) -> Option<Arc<Handle>> {
    RECENT
        .try_with(|r| {
            let r = r.borrow();
            let (_, w) = r.iter().find(|(p, _)| *p == ptr)?;
            w.upgrade().filter(|h| !h.removed.load(Ordering::Acquire))
        })
        .ok()
        .flatten()
}

/// Remembers `h` as the handle `ptr` names, newest first.
fn remember(ptr: usize, h: &Arc<Handle>) {
    let _ = RECENT.try_with(|r| {
        let mut r = r.borrow_mut();
        r.rotate_right(1);
        r[0] = (ptr, Arc::downgrade(h));
    });
}

/// The first `ncclComm_t` value: non-canonical on x86-64 and above every user-space address of
/// AArch64's 48-bit layout, so it is no address a process maps (module docs).
pub const HANDLE_BASE: usize = 0x6d73_6363_0000_0000;

/// How many handles were made (the next value is `HANDLE_BASE + 16 * (count + 1)`).
static MADE: AtomicUsize = AtomicUsize::new(0);

impl Handle {
    /// A new pending handle, entered in the table; returns it and its `ncclComm_t` value.
    pub fn create(
        rank: usize,
        nranks: usize,
        device: usize,
        in_group: bool,
    ) -> (Arc<Handle>, *mut c_void) {
        let h = Arc::new(Handle {
            rank,
            nranks,
            device,
            state: Mutex::new(State::Pending { in_group }),
            ready: OnceLock::new(),
            removed: AtomicBool::new(false),
            abandoned: AtomicBool::new(false),
            cancel: Cancel::new(),
        });
        let ptr = HANDLE_BASE.wrapping_add(16 * (MADE.fetch_add(1, Ordering::Relaxed) + 1));
        lock(&HANDLES)
            .get_or_insert_with(HashMap::new)
            .insert(ptr, h.clone());
        (h, ptr as *mut c_void)
    }

    /// The live handle `comm` names.
    pub fn find(comm: *const c_void) -> Result<Arc<Handle>, NcclError> {
        let ptr = comm as usize;
        if let Some(h) = remembered(ptr) {
            return Ok(h);
        }
        let h = lock(&HANDLES)
            .as_ref()
            .and_then(|m| m.get(&ptr).cloned())
            .ok_or(NcclError::UnknownComm { ptr })?;
        remember(ptr, &h);
        Ok(h)
    }

    /// Takes `comm` out of the table (it is no longer a valid handle).
    pub fn remove(comm: *const c_void) -> Result<Arc<Handle>, NcclError> {
        let ptr = comm as usize;
        let mut table = lock(&HANDLES);
        let h = table
            .as_ref()
            .and_then(|m| m.get(&ptr).cloned())
            .ok_or(NcclError::UnknownComm { ptr })?;
        // Before it leaves the table: no thread finds it remembered afterwards.
        h.removed.store(true, Ordering::Release);
        if let Some(m) = table.as_mut() {
            m.remove(&ptr);
        }
        Ok(h)
    }

    /// The ready communicator `comm` names.
    pub fn ready(comm: *const c_void) -> Result<Arc<Comm>, NcclError> {
        Handle::find(comm)?.comm()
    }

    /// The communicator, if ready.
    pub fn comm(&self) -> Result<Arc<Comm>, NcclError> {
        if let Some(c) = self.ready.get() {
            return Ok(c.clone());
        }
        match &*lock(&self.state) {
            State::Ready(c) => Ok(c.clone()),
            State::Pending { in_group } => Err(NcclError::CommPending {
                in_group: *in_group,
            }),
            State::Failed(code, reason) => Err(NcclError::CommFailed {
                code: *code,
                reason: reason.clone(),
            }),
        }
    }

    /// Runs `f` on the current state.
    pub fn with_state<T>(&self, f: impl FnOnce(&State) -> T) -> T {
        f(&lock(&self.state))
    }

    /// Ends the initialisation with `result`. If the handle was abandoned meanwhile, the
    /// communicator is dropped at once.
    pub fn finish(&self, result: Result<Comm, NcclError>) {
        let mut s = lock(&self.state);
        *s = match result {
            Ok(c) if self.abandoned.load(Ordering::Acquire) => {
                c.communicator_abort();
                drop(c);
                State::Failed(
                    ncclResult_t::ncclInvalidUsage,
                    "destroyed or aborted during its initialisation".into(),
                )
            }
            Ok(c) => {
                let c = Arc::new(c);
                let _ = self.ready.set(c.clone());
                State::Ready(c)
            }
            Err(e) => State::Failed(e.code(), e.text()),
        };
    }

    /// For `ncclCommDestroy` / `ncclCommAbort` (the handle is already out of the table): the
    /// communicator if ready; a pending init is marked abandoned (whoever finishes it drops
    /// the communicator at once) and its bootstrap's set-up cancelled (its wait for the other
    /// ranks ends at once: the init fails).
    pub fn release(&self) -> Option<Arc<Comm>> {
        let s = lock(&self.state);
        match &*s {
            State::Ready(c) => Some(c.clone()),
            State::Pending { .. } => {
                self.abandoned.store(true, Ordering::Release);
                self.cancel.cancel();
                None
            }
            State::Failed(..) => None,
        }
    }

    /// Fails the initialisation with `e` unless it already finished.
    pub fn finish_if_pending(&self, e: &NcclError) {
        let mut s = lock(&self.state);
        if matches!(*s, State::Pending { .. }) {
            *s = State::Failed(e.code(), e.text());
        }
    }
}

/// A ready communicator: the library's collectives of one rank, and what the C API keeps
/// for it.
pub struct Comm {
    /// This rank.
    pub rank: usize,
    /// Ranks.
    pub nranks: usize,
    /// Device ordinal.
    pub device: usize,
    /// The collectives (and through them the communicator).
    pub coll: Collectives,
    /// The stream every call runs on (CPU backend), else `None`.
    own_stream: Option<Stream>,
    /// The name from `ncclConfig_t::commName`, for the log.
    pub name: String,
    finalized: AtomicBool,
    /// The first asynchronous error seen (sticky): code and text.
    sticky: Mutex<Option<(ncclResult_t, String)>>,
    /// Operators made by `ncclRedOpCreatePreMulSum`.
    pub premul: Mutex<PreMulSums>,
    /// Buffers of `ncclCommRegister` and windows of `ncclCommWindowRegister`.
    pub registrations: Mutex<Registrations>,
}

/// A call the library checked ([`Comm::check`]), and the NCCL function that made it (what its
/// later errors are named after).
#[derive(Clone, Debug)]
pub struct Checked {
    /// The library's call.
    pub call: Call,
    /// `ncclAllReduce`, `ncclSend`, ….
    pub function: &'static str,
}

/// A stream a call queues on: the caller's (CUDA) or the communicator's own (CPU).
pub enum CallStream<'a> {
    /// Borrowed from the caller for this call.
    Caller(Stream),
    /// The communicator's.
    Own(&'a Stream),
}

impl std::ops::Deref for CallStream<'_> {
    type Target = Stream;
    fn deref(&self) -> &Stream {
        match self {
            Self::Caller(s) => s,
            Self::Own(s) => s,
        }
    }
}

impl Comm {
    /// A communicator over `coll`.
    pub fn new(coll: Collectives, name: String) -> Result<Self, NcclError> {
        let c = coll.communicator();
        let (rank, nranks, gpu) = (c.rank(), c.size(), c.gpu().clone());
        let own_stream = match gpu.kind() {
            BackendKind::Cuda => None,
            _ => Some(
                gpu.stream()
                    .map_err(NcclError::library("creating the communicator's stream"))?,
            ),
        };
        Ok(Self {
            rank,
            nranks,
            device: gpu.ordinal(),
            coll,
            own_stream,
            name,
            finalized: AtomicBool::new(false),
            sticky: Mutex::new(None),
            premul: Mutex::new(PreMulSums::default()),
            registrations: Mutex::new(Registrations::default()),
        })
    }

    /// `call`, made by the NCCL function `function`, once the library checked it
    /// (`Collectives::check`: ranks, byte counts, buffers, operator), with NCCL's names in its
    /// errors ([`NcclError::of_call`]).
    pub fn check(&self, function: &'static str, call: Call) -> Result<Checked, NcclError> {
        self.coll
            .check(&call)
            .map_err(NcclError::of_call(function))?;
        Ok(Checked { call, function })
    }

    /// The device.
    pub fn gpu(&self) -> &Gpu {
        self.coll.communicator().gpu()
    }

    /// The stream a call with the caller's `stream` queues on (module docs).
    pub fn stream(&self, stream: *mut c_void) -> Result<CallStream<'_>, NcclError> {
        if let Some(s) = &self.own_stream {
            return Ok(match self.cpu_stream(stream) {
                Some(theirs) => CallStream::Caller(theirs),
                None => CallStream::Own(s),
            });
        }
        // SAFETY: NCCL's contract: the caller's stream is live until the work queued on it
        // completes, which outlasts this call; the borrowed stream lives only for the call.
        let s = unsafe { self.gpu().borrow_cuda_stream(stream as u64) }
            .map_err(NcclError::library("using the caller's stream"))?;
        Ok(CallStream::Caller(s))
    }

    /// On CUDA, relaxes the calling thread's stream-capture mode while the returned guard
    /// lives: a call queued on a stream that PyTorch captures in CUDA's default (global) mode
    /// may then register, export and map buffers as it does outside a capture (what it
    /// queues on the stream is captured all the same). `None` on the CPU backend.
    pub fn relaxed_capture(&self) -> Result<Option<cuda::RelaxedCapture>, NcclError> {
        match self.gpu().kind() {
            BackendKind::Cuda => cuda::RelaxedCapture::new()
                .map(Some)
                .map_err(NcclError::library("relaxing the thread's capture mode")),
            _ => Ok(None),
        }
    }

    /// On the CPU backend, a stream `mscclppCpuStreamCreate` made (`cpu_streams.rs`), if
    /// `stream` names one of this device.
    fn cpu_stream(&self, stream: *mut c_void) -> Option<Stream> {
        let raw = stream as u64;
        // 0, 1 and 2 name the default stream, which a C caller cannot synchronize.
        if raw <= 2 {
            return None;
        }
        // SAFETY: borrowed for one call; the CPU backend refuses work on a stream whose owner
        // is gone instead of using freed memory.
        unsafe { self.gpu().borrow_stream(raw) }.ok()
    }

    /// On the CPU backend, waits for the calls queued with the caller's `stream` when they ran
    /// on the communicator's own stream (not on a stream of `mscclppCpuStreamCreate`, which
    /// its caller synchronizes); then reports a device wait that gave up. On CUDA, nothing
    /// (the caller's streams order the work).
    pub fn complete_for(&self, stream: *mut c_void) -> Result<(), NcclError> {
        if self.cpu_stream(stream).is_some() {
            return Ok(());
        }
        self.complete()
    }

    /// On the CPU backend, waits for the calls queued on the own stream; then reports a
    /// device wait that gave up. On CUDA, nothing (the caller's streams order the work).
    pub fn complete(&self) -> Result<(), NcclError> {
        let Some(s) = &self.own_stream else {
            return Ok(());
        };
        s.synchronize()
            .map_err(NcclError::library("running the queued work"))?;
        match self.coll.communicator().status().error() {
            Some(e) => Err(NcclError::library("a device wait")(e)),
            None => Ok(()),
        }
    }

    /// Refuses calls after `ncclCommFinalize`.
    pub fn check_usable(&self) -> Result<(), NcclError> {
        if self.finalized.load(Ordering::Acquire) {
            Err(NcclError::Finalized)
        } else {
            Ok(())
        }
    }

    /// Marks the communicator finalized; whether it already was.
    pub fn set_finalized(&self) -> bool {
        self.finalized.swap(true, Ordering::AcqRel)
    }

    /// Waits until the work queued with this communicator is done, and only its: the marker
    /// after its last call (the library queues a communicator's calls in issue order across
    /// streams: `Collectives::drain`), polled, so the wait ends with the bootstrap's deadline
    /// at the latest, and at once after an abort (the aborted kernels return). Work captured in
    /// a graph is the graph's: not waited for. The thread's capture mode is relaxed for the
    /// wait (no refusal while another thread captures).
    pub fn flush(&self) -> Result<(), NcclError> {
        let _relaxed = self.relaxed_capture()?;
        let timeout = self.coll.communicator().bootstrap().op_timeout();
        let done = self
            .coll
            .drain(timeout)
            .map_err(NcclError::library("waiting for the communicator's work"))?;
        if !done {
            return Err(NcclError::Library {
                operation: "waiting for the communicator's work",
                source: Box::new(mscclpp::host::Error::Aborted {
                    reason: format!("its queued work was still running after {timeout:?}"),
                }),
            });
        }
        Ok(())
    }

    /// The sticky asynchronous error: the first one seen (a dead peer, an abort, a device
    /// wait that gave up), kept once seen.
    pub fn async_error(&self) -> Option<(ncclResult_t, String)> {
        let mut sticky = lock(&self.sticky);
        if sticky.is_none() {
            let c = self.coll.communicator();
            if let Some(e) = c.failure() {
                let e = NcclError::library("the communicator")(e);
                *sticky = Some((e.code(), e.text()));
            }
        }
        sticky.clone()
    }

    /// Sets the abort flag: every device wait of the communicator returns, its later calls
    /// fail.
    pub fn communicator_abort(&self) {
        self.coll.communicator().abort();
    }
}

/// Drops `comm` (the last reference of a destroyed or aborted communicator) on a thread of
/// its own, after its work is done ([`Comm::flush`], which an aborted communicator's kernels
/// reach at once): the caller returns at once, and no kernel still queued uses freed memory.
pub fn retire(comm: Arc<Comm>) {
    let keep = comm.clone();
    let spawned = std::thread::Builder::new()
        .name("nccl-retire".into())
        .spawn(move || {
            if let Err(e) = comm.flush() {
                tracing::warn!("releasing communicator {}: {}", comm.name, e.text());
            }
            drop(comm);
        });
    match spawned {
        Ok(_) => drop(keep),
        Err(e) => {
            // Leaking is safe, a use after free is not: this reference is never dropped.
            tracing::warn!(
                "could not start a thread to release a communicator ({e}); it is leaked"
            );
            std::mem::forget(keep);
        }
    }
}
