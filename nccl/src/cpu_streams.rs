//! Streams of the CPU backend for C callers: a program without a GPU (CI, the tests of the C
//! API) has no CUDA runtime to make streams with, so the library makes them
//! (`mscclppCpuStreamCreate`, `…Synchronize`, `…Destroy`; not NCCL symbols, declared in no
//! header: their prototypes are in the crate docs). A call given such a stream is queued on it
//! and returns at once, as on a GPU; a call given any other stream (null included) runs on the
//! communicator's own and is complete when it returns (`comm.rs`).
//!
//! The streams live in a table of this process ([`STREAMS`], a mutex), by handle, until
//! destroyed; they are streams of CPU device 0 (the device `ncclCommInitRank` uses there).

use std::ffi::c_void;
use std::sync::Mutex;

use mscclpp::host::gpu::{BackendKind, Stream};

use crate::comm::{backend, gpu};
use crate::error::NcclError;
use crate::sync::lock;

/// The streams made for C callers, by handle.
static STREAMS: Mutex<Vec<Stream>> = Mutex::new(Vec::new());

/// The CPU device's backend, or why there is none.
fn cpu() -> Result<(), NcclError> {
    match backend()? {
        BackendKind::Cpu => Ok(()),
        _ => Err(NcclError::NotImplemented {
            what: "mscclppCpuStream*",
            why: "the CUDA backend runs on the caller's CUDA streams",
        }),
    }
}

/// `mscclppCpuStreamCreate`: a new stream, its handle written to `stream`.
pub fn create(stream: *mut *mut c_void) -> Result<(), NcclError> {
    if stream.is_null() {
        return Err(NcclError::Null { what: "stream" });
    }
    cpu()?;
    let s = gpu(BackendKind::Cpu, 0)?
        .stream()
        .map_err(NcclError::library("creating a stream"))?;
    let raw = s.raw();
    lock(&STREAMS).push(s);
    // SAFETY: checked non-null; the caller's contract: a writable `void*`.
    unsafe { stream.write(raw as *mut c_void) };
    Ok(())
}

/// `mscclppCpuStreamSynchronize`: waits for the work queued on `stream`; reports its first
/// failure.
pub fn synchronize(stream: *mut c_void) -> Result<(), NcclError> {
    let s = with(stream, |s| {
        // SAFETY: a live stream of this table, borrowed for the wait (the table's lock is not
        // held while waiting, so other streams' callers are not held up).
        unsafe { s.gpu().borrow_stream(s.raw()) }
    })?
    .map_err(NcclError::library("using the stream"))?;
    s.synchronize()
        .map_err(NcclError::library("the stream's queued work"))
}

/// `mscclppCpuStreamDestroy`: waits for its work, then forgets it.
pub fn destroy(stream: *mut c_void) -> Result<(), NcclError> {
    synchronize(stream)?;
    let mut streams = lock(&STREAMS);
    streams.retain(|s| s.raw() != stream as u64);
    Ok(())
}

fn with<T>(stream: *mut c_void, f: impl FnOnce(&Stream) -> T) -> Result<T, NcclError> {
    let streams = lock(&STREAMS);
    streams
        .iter()
        .find(|s| s.raw() == stream as u64)
        .map(f)
        .ok_or(NcclError::UnknownHandle {
            what: "stream",
            ptr: stream as usize,
        })
}
