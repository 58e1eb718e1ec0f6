//! Errors: [`NcclError`] (one variant per way a call fails, with its context and the library's
//! error as `#[source]`), the NCCL code of each ([`NcclError::code`], and [`host_code`] for the
//! library's errors), the text `ncclGetLastError` returns, and [`api`], the wrapper every
//! exported function runs its body in: it catches panics (nothing unwinds into C; a panic is
//! `ncclInternalError`), records the error text and logs it.
//!
//! # The last error
//! Every failing call writes its text (the error and its sources, joined by `: `) twice:
//! into a buffer of the calling thread, and into the newest slot of a process-wide ring of
//! [`RING`] static buffers. `ncclGetLastError` returns the newest error of the process: the
//! calling thread's own buffer when its last error is that newest one, else the ring's newest
//! slot (so a watchdog thread sees the errors of the threads it watches, and a thread whose
//! own error is old sees a newer one of another thread, as NCCL's one buffer would show). The
//! pointer stays valid for the life of the thread (its own buffer) or of the process (a ring
//! slot); its text is replaced by this thread's next error, or, for a ring slot, [`RING`]
//! errors later.
//!
//! Shared words: the ring's slots are written under `RING_LOCK` (one writer at a time; it also
//! holds the count of errors so far, whose value after an error is that error's sequence
//! number) and published by a release store of `LATEST` (the newest slot plus one) and then of
//! `NEWEST` (the newest sequence number); readers (C callers) take them with acquire and read
//! the slot without a lock, as NCCL's callers read its static buffer. Each thread keeps the
//! sequence number of its own last error beside its buffer.

use mscclpp::host::error::PlanError;
use mscclpp::host::error::ProxyError;
use std::cell::RefCell;
use std::ffi::{c_char, c_int};
use std::panic::AssertUnwindSafe;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use mscclpp::host::Error as HostError;

use crate::abi::ncclResult_t;

/// Why an NCCL call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NcclError {
    /// A pointer argument that must not be null is null.
    #[error("{what} is null")]
    Null {
        /// The argument.
        what: &'static str,
    },
    /// No backend can be chosen (`MSCCLPP_BACKEND` names none).
    #[error("choosing the backend: {reason}")]
    Backend {
        /// Why.
        reason: String,
    },
    /// A communicator handle that is not a live communicator of this library.
    #[error("{ptr:#x} is not a live communicator (never made by this library, or destroyed)")]
    UnknownComm {
        /// The handle.
        ptr: usize,
    },
    /// A communicator whose initialisation has not finished: used inside the group that
    /// initialises it, or a non-blocking one still in progress.
    #[error("the communicator is still being initialised{}", if *.in_group { " (in the group that initialises it; use it after ncclGroupEnd)" } else { "" })]
    CommPending {
        /// Whether the init waits for the end of the caller's group.
        in_group: bool,
    },
    /// A communicator whose initialisation failed (`ncclCommGetAsyncError` says why; destroy
    /// it).
    #[error("the communicator's initialisation failed: {reason}")]
    CommFailed {
        /// The code the initialisation returned.
        code: ncclResult_t,
        /// Its text.
        reason: String,
    },
    /// A communicator used after `ncclCommFinalize`.
    #[error("the communicator was finalized (only ncclCommDestroy may follow)")]
    Finalized,
    /// An integer argument out of its range.
    #[error("{what} is {value}, {expected}")]
    OutOfRange {
        /// The argument.
        what: &'static str,
        /// Its value.
        value: i64,
        /// The range, in words.
        expected: String,
    },
    /// A value that is no NCCL data type.
    #[error("data type {value} is not an ncclDataType_t (0 to 11)")]
    BadType {
        /// The value.
        value: c_int,
    },
    /// A value that is no NCCL operator.
    #[error("operator {value} is not an ncclRedOp_t")]
    BadOp {
        /// The value.
        value: c_int,
    },
    /// A pre-multiplied sum used with another data type than the one it was made for (NCCL
    /// refuses it too: the scalar is one element of that type).
    #[error(
        "operator {op} was made by ncclRedOpCreatePreMulSum for data type {made_for}, not {called_with}"
    )]
    OpTypeMismatch {
        /// The operator.
        op: c_int,
        /// The NCCL type it was made for.
        made_for: &'static str,
        /// The NCCL type of the call.
        called_with: &'static str,
    },
    /// An operator `ncclRedOpCreatePreMulSum` did not make for this communicator (or that was
    /// destroyed).
    #[error("operator {value} is not a live operator of this communicator")]
    UnknownOp {
        /// The value.
        value: c_int,
    },
    /// `count` elements of the type do not fit in a `size_t` of bytes.
    #[error("{count} elements of {elem_bytes} bytes{} overflow the address space", if *.parts > 1 { format!(" times {} ranks", .parts) } else { String::new() })]
    CountOverflow {
        /// The count.
        count: usize,
        /// Bytes per element.
        elem_bytes: usize,
        /// How many such parts the call moves.
        parts: usize,
    },
    /// A versioned struct (`ncclConfig_t`, `ncclCollConfig_t`) that is not one.
    #[error("the {what} is not initialised: {reason}")]
    BadConfig {
        /// Which struct.
        what: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A config field this library cannot honour.
    #[error("{what}: {reason}")]
    ConfigRefused {
        /// The field.
        what: &'static str,
        /// Why.
        reason: &'static str,
    },
    /// A unique id this library did not make.
    #[error("the ncclUniqueId was not made by ncclGetUniqueId of this library")]
    ForeignUniqueId {
        /// What the bootstrap said.
        #[source]
        source: Box<HostError>,
    },
    /// `ncclGroupEnd` without a matching `ncclGroupStart`.
    #[error("ncclGroupEnd without ncclGroupStart")]
    GroupUnbalanced,
    /// An earlier call of the group failed, so the group ran nothing.
    #[error("an earlier call of this group failed, so the group ran nothing: {first}")]
    GroupFailed {
        /// The code of that call.
        code: ncclResult_t,
        /// Its text.
        first: String,
    },
    /// Sends and receives that cannot match (to the rank itself without the matching other
    /// half, or of different sizes).
    #[error("unmatched send and receive: {why}")]
    P2pUnmatched {
        /// What does not match.
        why: String,
    },
    /// A split in which this rank passed `NCCL_SPLIT_NOCOLOR`: it took part and gets no
    /// communicator (not a failure: `ncclCommSplit` returns `ncclSuccess` and a null handle).
    #[error("this rank split without a color (NCCL_SPLIT_NOCOLOR): no communicator")]
    SplitWithoutColor,
    /// A buffer that is not memory `ncclMemAlloc` handed out.
    #[error("{ptr:#x} was not allocated by ncclMemAlloc (or was freed)")]
    UnknownBuffer {
        /// The pointer.
        ptr: usize,
    },
    /// A registration, window or stream handle that is not live (on this communicator).
    #[error("{what} {ptr:#x} is not live here")]
    UnknownHandle {
        /// Registration or window.
        what: &'static str,
        /// The handle.
        ptr: usize,
    },
    /// A buffer to register that is not device memory of the communicator's device.
    #[error("[{ptr:#x}, +{size}) is not inside one allocation of device {device}")]
    NotDeviceMemory {
        /// Start.
        ptr: usize,
        /// Length.
        size: usize,
        /// The communicator's device.
        device: usize,
        /// What the GPU layer said.
        #[source]
        source: Option<Box<HostError>>,
    },
    /// A call out of the order or state NCCL's contract sets (a grow id made twice, or passed
    /// by a rank that did not make it).
    #[error("{what}")]
    Usage {
        /// What was wrong.
        what: &'static str,
    },
    /// Part of NCCL's API this library does not implement (and may never).
    #[error("{what} is not implemented by mscclpp-rs: {why}")]
    NotImplemented {
        /// The function or feature.
        what: &'static str,
        /// Why, and what to use instead.
        why: &'static str,
    },
    /// Part of NCCL's API this library will implement once the API beneath exists.
    #[error("{what} is not served yet by mscclpp-rs ({needs})")]
    NotYet {
        /// The function or feature.
        what: &'static str,
        /// What it waits for.
        needs: &'static str,
    },
    /// The library failed (`operation` names what the call was doing).
    #[error("{operation} failed")]
    Library {
        /// What was being done.
        operation: &'static str,
        /// The library's error (boxed: the library's error type is large).
        #[source]
        source: Box<HostError>,
    },
    /// A thread of the library panicked (a bug; reported instead of unwinding).
    #[error("a thread to {what} panicked")]
    Panicked {
        /// What the thread was for.
        what: &'static str,
    },
    /// A thread of the library could not be started.
    #[error("starting a thread to {what} failed")]
    Thread {
        /// What the thread was for.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl NcclError {
    /// The NCCL code the call returns.
    pub fn code(&self) -> ncclResult_t {
        use ncclResult_t::*;
        match self {
            Self::Null { .. }
            | Self::UnknownComm { .. }
            | Self::OutOfRange { .. }
            | Self::BadType { .. }
            | Self::BadOp { .. }
            | Self::OpTypeMismatch { .. }
            | Self::UnknownOp { .. }
            | Self::CountOverflow { .. }
            | Self::BadConfig { .. }
            | Self::ForeignUniqueId { .. }
            | Self::UnknownBuffer { .. }
            | Self::UnknownHandle { .. }
            | Self::NotDeviceMemory { .. } => ncclInvalidArgument,
            Self::CommPending { .. }
            | Self::Backend { .. }
            | Self::Finalized
            | Self::ConfigRefused { .. }
            | Self::GroupUnbalanced
            | Self::P2pUnmatched { .. }
            | Self::NotImplemented { .. }
            | Self::NotYet { .. }
            | Self::SplitWithoutColor
            | Self::Usage { .. } => ncclInvalidUsage,
            Self::CommFailed { code, .. } | Self::GroupFailed { code, .. } => *code,
            Self::Library { source, .. } => host_code(source),
            Self::Thread { .. } => ncclSystemError,
            Self::Panicked { .. } => ncclInternalError,
        }
    }

    /// The library's refusal of a call's arguments, in NCCL's words: a null buffer names
    /// NCCL's argument (`sendbuff`, `recvbuff`), a byte count that overflows is
    /// [`NcclError::CountOverflow`]; anything else is a library error of `function`.
    pub fn of_call(function: &'static str) -> impl FnOnce(HostError) -> Self {
        move |e| match e {
            HostError::NullBuffer { what } => Self::Null {
                what: if what == "input" {
                    "sendbuff"
                } else {
                    "recvbuff"
                },
            },
            HostError::CountOverflow {
                count,
                elem_bytes,
                parts,
            } => Self::CountOverflow {
                count,
                elem_bytes,
                parts,
            },
            e => Self::library(function)(e),
        }
    }

    /// A library error met while doing `operation`.
    pub fn library(operation: &'static str) -> impl FnOnce(HostError) -> Self {
        move |source| Self::Library {
            operation,
            source: Box::new(source),
        }
    }

    /// The text: this error and its sources, joined by `: `.
    pub fn text(&self) -> String {
        let mut s = self.to_string();
        let mut cur: Option<&dyn std::error::Error> = std::error::Error::source(self);
        while let Some(e) = cur {
            s.push_str(": ");
            s.push_str(&e.to_string());
            cur = e.source();
        }
        s
    }
}

/// The NCCL code of a library error: a dead or failed peer is `ncclRemoteError` (a network
/// transport's peer that closed its end too), a wait that ran out of time `ncclTimeout` (a
/// network transport's too), the GPU layer `ncclUnhandledCudaError`, the network (a failed OS
/// or library call of a transport, a peer that cannot be reached) and the OS
/// `ncclSystemError`, a wrong argument or state `ncclInvalidArgument` /
/// `ncclInvalidUsage`, anything else `ncclInternalError`.
pub fn host_code(e: &HostError) -> ncclResult_t {
    use mscclpp::host::error::TransportErrorKind;
    use mscclpp::shared::DeviceErrorCode;
    use ncclResult_t::*;
    match e {
        HostError::Remote { .. }
        | HostError::BootstrapPeerClosed { .. }
        | HostError::Transport {
            kind: TransportErrorKind::PeerClosed,
            ..
        }
        | HostError::BootstrapPeerGone { .. }
        | HostError::SemaphorePeer { .. }
        | HostError::Proxy(ProxyError::ProxyFailed { .. }) => ncclRemoteError,
        HostError::BootstrapTimeout { .. }
        | HostError::BootstrapMissingRanks { .. }
        | HostError::SemaphoreTimeout { .. }
        | HostError::FlushTimeout { .. }
        | HostError::Transport {
            kind: TransportErrorKind::Timeout,
            ..
        } => ncclTimeout,
        HostError::Device { code, .. } => match code {
            DeviceErrorCode::Timeout => ncclTimeout,
            DeviceErrorCode::Aborted => ncclRemoteError,
            _ => ncclInternalError,
        },
        HostError::NoLibcuda
        | HostError::CudaInit(_)
        | HostError::DeviceOpen { .. }
        | HostError::Alloc { .. }
        | HostError::HostAlloc { .. }
        | HostError::IpcExport { .. }
        | HostError::IpcOpen { .. }
        | HostError::PeerAccess { .. }
        | HostError::Stream { .. }
        | HostError::Copy { .. }
        | HostError::ModuleLoad { .. }
        | HostError::MissingKernel { .. }
        | HostError::ParamSize { .. }
        | HostError::Launch { .. }
        | HostError::CurrentDevice { .. } => ncclUnhandledCudaError,
        HostError::BootstrapConfig(_)
        | HostError::BootstrapInterface { .. }
        | HostError::BootstrapListen { .. }
        | HostError::BootstrapConnect { .. }
        | HostError::BootstrapBadMagic { .. }
        | HostError::BootstrapVersion { .. }
        | HostError::BootstrapMalformed { .. }
        | HostError::BootstrapRejected { .. }
        | HostError::BootstrapIo { .. }
        | HostError::BootstrapSpawn { .. }
        | HostError::Proxy(ProxyError::HealthMonitorStart { .. })
        | HostError::Proxy(ProxyError::ProxyStart { .. })
        | HostError::Transport {
            kind: TransportErrorKind::Call | TransportErrorKind::Connect,
            ..
        } => ncclSystemError,
        HostError::NoSuchDevice { .. }
        | HostError::NoSuchRank { .. }
        | HostError::StreamDevice { .. }
        | HostError::BootstrapUniqueId { .. }
        | HostError::UnknownAddress { .. }
        | HostError::NullBuffer { .. }
        | HostError::CountOverflow { .. }
        | HostError::OutOfRange { .. } => ncclInvalidArgument,
        HostError::Unsupported { .. }
        | HostError::PeerIsSelf { .. }
        | HostError::CrossNode { .. }
        | HostError::DuplicateGpu { .. }
        | HostError::GpuShareTooSmall { .. }
        | HostError::ConfigMismatch { .. }
        | HostError::Aborted { .. }
        | HostError::CountMismatch { .. }
        | HostError::SelfMismatch { .. }
        | HostError::Revoked { .. }
        | HostError::MembershipMismatch { .. }
        | HostError::Plan(PlanError::Malformed { .. })
        | HostError::Plan(PlanError::Unsupported { .. })
        | HostError::Plan(PlanError::Refused { .. })
        | HostError::Plan(PlanError::Call { .. }) => ncclInvalidUsage,
        _ => ncclInternalError,
    }
}

/// What a call that did not fail returns: done, or (non-blocking) still in progress.
pub type Outcome = Result<ncclResult_t, NcclError>;

/// Runs an exported function's `body`: logging set up on first use, a panic caught and
/// turned into `ncclInternalError`, an error's text recorded for `ncclGetLastError` and
/// logged as a warning. `name` is the NCCL function.
pub fn api(name: &'static str, body: impl FnOnce() -> Outcome) -> ncclResult_t {
    let guarded = || {
        crate::log::ensure_init();
        let _caller = crate::backend::KeepCaller::new();
        body()
    };
    match std::panic::catch_unwind(AssertUnwindSafe(guarded)) {
        Ok(Ok(code)) => code,
        Ok(Err(e)) => {
            let code = e.code();
            fail(name, code, &e.text());
            code
        }
        Err(panic) => {
            let code = ncclResult_t::ncclInternalError;
            fail(
                name,
                code,
                &format!("internal error (a panic: {})", panic_text(&*panic)),
            );
            code
        }
    }
}

/// [`api`] for the few functions that return something else than an `ncclResult_t`: `body`'s
/// value, or `fallback` after a panic (recorded as an internal error).
pub fn guarded<T>(name: &'static str, fallback: T, body: impl FnOnce() -> T) -> T {
    let guarded = || {
        crate::log::ensure_init();
        let _caller = crate::backend::KeepCaller::new();
        body()
    };
    match std::panic::catch_unwind(AssertUnwindSafe(guarded)) {
        Ok(v) => v,
        Err(panic) => {
            let text = format!("internal error (a panic: {})", panic_text(&*panic));
            fail(name, ncclResult_t::ncclInternalError, &text);
            fallback
        }
    }
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_string())
}

/// Records `text` as the last error of `name` (code `code`) and logs it.
pub fn fail(name: &'static str, code: ncclResult_t, text: &str) {
    let line = format!("{name}: {text}");
    tracing::warn!("{line} ({})", code.name());
    set_last_error(&line);
}

/// Bytes of each last-error buffer (the text is cut to fit, NUL included).
pub const LAST_ERROR_BYTES: usize = 1024;
/// Slots of the process-wide ring.
pub const RING: usize = 16;

struct Ring {
    slots: [std::cell::UnsafeCell<[u8; LAST_ERROR_BYTES]>; RING],
}

// SAFETY: slots are written only under `RING_LOCK`; readers only read (see module docs).
unsafe impl Sync for Ring {}

static RING_SLOTS: Ring = Ring {
    slots: [const { std::cell::UnsafeCell::new([0; LAST_ERROR_BYTES]) }; RING],
};
static RING_LOCK: Mutex<usize> = Mutex::new(0);
/// The newest slot plus one (0: no error yet).
static LATEST: AtomicUsize = AtomicUsize::new(0);
/// The sequence number of the newest error (its count so far; 0: none yet).
static NEWEST: AtomicUsize = AtomicUsize::new(0);

/// A thread's last error: its sequence number and its text.
type Mine = (usize, Box<[u8; LAST_ERROR_BYTES]>);

thread_local! {
    static MINE: RefCell<Option<Mine>> = const { RefCell::new(None) };
}

fn copy_c(dst: &mut [u8; LAST_ERROR_BYTES], text: &str) {
    let mut n = text.len().min(LAST_ERROR_BYTES - 1);
    while !text.is_char_boundary(n) {
        n -= 1;
    }
    dst[..n].copy_from_slice(&text.as_bytes()[..n]);
    dst[n] = 0;
}

/// Records `text` as the calling thread's and the process's last error.
pub fn set_last_error(text: &str) {
    // A panic here would be inside `api`'s handler: nothing below can panic but the lock,
    // whose poison is ignored.
    let mut next = mscclpp::host::sync::lock(&RING_LOCK);
    let slot = *next % RING;
    // SAFETY: writers hold `RING_LOCK`; the slot is a static array.
    copy_c(unsafe { &mut *RING_SLOTS.slots[slot].get() }, text);
    *next = next.wrapping_add(1);
    let seq = *next;
    LATEST.store(slot + 1, Ordering::Release);
    NEWEST.store(seq, Ordering::Release);
    drop(next);
    let _ = MINE.try_with(|m| {
        let mut m = m.borrow_mut();
        let (s, buf) = m.get_or_insert_with(|| (0, Box::new([0; LAST_ERROR_BYTES])));
        *s = seq;
        copy_c(buf, text);
    });
}

/// `ncclGetLastError`'s text: the newest error of the process (the calling thread's own
/// buffer if it is that one, else the ring's newest slot), else "" (module docs).
pub fn last_error() -> *const c_char {
    let newest = NEWEST.load(Ordering::Acquire);
    let mine = MINE
        .try_with(|m| {
            m.borrow()
                .as_ref()
                .filter(|(seq, _)| *seq == newest)
                .map(|(_, b)| b.as_ptr().cast::<c_char>())
        })
        .ok()
        .flatten();
    if let Some(p) = mine {
        return p;
    }
    match LATEST.load(Ordering::Acquire) {
        0 => c"".as_ptr(),
        i => RING_SLOTS.slots[i - 1].get().cast::<c_char>().cast_const(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn read(p: *const c_char) -> String {
        // SAFETY: `last_error` returns a NUL-terminated static or thread-local buffer.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// Taken by the tests that record errors: the newest error is process-wide, and the tests
    /// of one binary run in parallel.
    static SERIAL: Mutex<()> = Mutex::new(());

    #[test]
    fn last_error_is_the_newest_of_the_process() {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        std::thread::spawn(|| {
            set_last_error("first thread's error");
            assert_eq!(read(last_error()), "first thread's error");
        })
        .join()
        .unwrap();
        // A thread without errors of its own sees the newest of the process.
        std::thread::spawn(|| assert_eq!(read(last_error()), "first thread's error"))
            .join()
            .unwrap();
        let long = "é".repeat(LAST_ERROR_BYTES);
        std::thread::spawn(move || {
            set_last_error(&long);
            let got = read(last_error());
            assert!(got.len() < LAST_ERROR_BYTES && got.chars().all(|c| c == 'é'));
        })
        .join()
        .unwrap();
        // A thread whose own error is older than another thread's sees the newer one; its
        // own again once it fails again.
        let (told, go) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
        let (told_tx, told_rx) = told;
        let (go_tx, go_rx) = go;
        let old = std::thread::spawn(move || {
            set_last_error("an old error");
            assert_eq!(read(last_error()), "an old error");
            told_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            assert_eq!(read(last_error()), "a newer error of another thread");
            set_last_error("its own again");
            assert_eq!(read(last_error()), "its own again");
        });
        told_rx.recv().unwrap();
        std::thread::spawn(|| set_last_error("a newer error of another thread"))
            .join()
            .unwrap();
        go_tx.send(()).unwrap();
        old.join().unwrap();
    }

    #[test]
    fn panics_become_internal_errors() {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        std::thread::spawn(|| {
            let code = api("ncclTest", || panic!("boom"));
            assert_eq!(code, ncclResult_t::ncclInternalError);
            assert!(read(last_error()).contains("ncclTest: internal error (a panic: boom)"));
            let v = guarded("ncclTest2", 7, || -> i32 { panic!("bang") });
            assert_eq!(v, 7);
            assert!(read(last_error()).contains("bang"));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn errors_carry_their_sources_and_codes() {
        let e = NcclError::Library {
            operation: "ncclAllReduce",
            source: Box::new(HostError::Remote {
                rank: 3,
                reason: "gone".into(),
            }),
        };
        assert_eq!(e.code(), ncclResult_t::ncclRemoteError);
        assert!(
            e.text().starts_with("ncclAllReduce failed: "),
            "{}",
            e.text()
        );
        assert!(e.text().contains("gone"), "{}", e.text());
    }
}
