//! NCCL's one-sided host calls: `ncclPutSignal`, `ncclSignal`, `ncclWaitSignal`, each the
//! library's (`Collectives::put_signal`, `signal`, `wait_signals`: a service thread of the
//! communicator makes the transfers in the order of the caller's stream, over the
//! connections the collectives hold to every peer; waits are ended by an abort, a revoke or
//! `MSCCLPP_ONE_SIDED_TIMEOUT_MS`).
//!
//! - **Windows**: every `ncclCommWindowRegister` also registers its range for these calls
//!   (`Collectives::register_one_sided`, collective as the window is: one more exchange with
//!   every peer; the first also sets up every rank's table of signals, `ranks × 4 contexts ×
//!   8 indices` u64 words of device memory, and the service thread). `peerWin` is this rank's
//!   handle of the window (the same window on every rank); `peerWinOffset` is in bytes;
//!   `localbuff` lies inside one of this rank's windows, as NCCL requires.
//! - **Signals**: `sigIdx` below 8, `ctx` below 4; `flags` must be 0. `ncclWaitSignal` waits,
//!   per descriptor, for `opCnt` more signals of `peer` than this rank's earlier waits on
//!   that signal counted.
//! - **Order**: the calls are made at once, inside a group as well (they are not collectives);
//!   on the CPU backend they wait for their work, as every call does there.

use std::ffi::{c_int, c_void};

use mscclpp::collectives::{SIGNAL_CONTEXTS, SIGNALS, Signal, SignalWait, Window};
use mscclpp::host::gpu::Stream;
use mscclpp::shared::DevicePtr;

use crate::abi::{self, ncclResult_t, ncclWaitSignalDesc_t};
use crate::args::rank_arg;
use crate::collectives as coll;
use crate::comm::Comm;
use crate::error::{NcclError, Outcome};
use crate::registration;

/// A signal from the C arguments (`sigIdx`, `ctx`, `flags`): index and context in range,
/// `flags` 0 (module docs).
fn signal((sig_idx, ctx, flags): (c_int, c_int, u32)) -> Result<Signal, NcclError> {
    if flags != 0 {
        return Err(NcclError::OutOfRange {
            what: "flags",
            value: flags.into(),
            expected: "0 (reserved)".into(),
        });
    }
    let field = |what, v: c_int, below: usize| {
        usize::try_from(v)
            .ok()
            .filter(|&v| v < below)
            .ok_or(NcclError::OutOfRange {
                what,
                value: v.into(),
                expected: format!("0 to {}", below - 1),
            })
    };
    Ok(Signal {
        index: field("sigIdx", sig_idx, SIGNALS)?,
        ctx: field("ctx", ctx, SIGNAL_CONTEXTS)?,
    })
}

/// Runs `call` on `c`'s stream for the caller's `stream`, then waits for it where the
/// backend needs (`Comm::complete`).
fn on_stream(
    c: &Comm,
    stream: *mut c_void,
    what: &'static str,
    call: impl FnOnce(&Stream) -> mscclpp::host::Result<()>,
) -> Outcome {
    let _capture = c.relaxed_capture()?;
    let s = c.stream(stream)?;
    call(&s).map_err(NcclError::library(what))?;
    c.complete()?;
    Ok(ncclResult_t::ncclSuccess)
}

/// The library's window of `win`, a window of `ncclCommWindowRegister` on `c`.
fn window(c: &Comm, win: *mut c_void) -> Result<Window, NcclError> {
    let r = registration::window(c, win)?;
    r.one_sided.ok_or(NcclError::UnknownHandle {
        what: "window",
        ptr: win as usize,
    })
}

/// `ncclPutSignal` (module docs); `sig` is (`sigIdx`, `ctx`, `flags`).
#[allow(clippy::too_many_arguments)]
pub fn put_signal(
    localbuff: *const c_void,
    count: usize,
    datatype: c_int,
    peer: c_int,
    peer_win: *mut c_void,
    peer_win_offset: usize,
    sig: (c_int, c_int, u32),
    comm: *mut c_void,
    stream: *mut c_void,
) -> Outcome {
    let sig = signal(sig)?;
    let (_, size) = abi::type_info(datatype).ok_or(NcclError::BadType { value: datatype })?;
    let bytes = count.checked_mul(size).ok_or(NcclError::OutOfRange {
        what: "count",
        value: i64::try_from(count).unwrap_or(i64::MAX),
        expected: "a byte count that fits in size_t".into(),
    })?;
    if localbuff.is_null() && bytes > 0 {
        return Err(NcclError::Null { what: "localbuff" });
    }
    let c = coll::check(comm)?;
    let w = window(&c, peer_win)?;
    let peer = rank_arg("peer", peer, c.nranks)?;
    on_stream(&c, stream, "ncclPutSignal", |s| {
        // SAFETY: NCCL's contract: `localbuff` holds `bytes` until the work queued on the
        // stream completes.
        unsafe {
            c.coll.put_signal(
                DevicePtr::from_addr(localbuff as u64),
                bytes,
                peer,
                w,
                peer_win_offset as u64,
                sig,
                s,
            )
        }
    })
}

/// `ncclSignal` (module docs).
pub fn signal_only(
    peer: c_int,
    sig: (c_int, c_int, u32),
    comm: *mut c_void,
    stream: *mut c_void,
) -> Outcome {
    let sig = signal(sig)?;
    let c = coll::check(comm)?;
    let peer = rank_arg("peer", peer, c.nranks)?;
    on_stream(&c, stream, "ncclSignal", |s| c.coll.signal(peer, sig, s))
}

/// `ncclWaitSignal` (module docs).
pub fn wait_signal(
    n_desc: c_int,
    descs: *const ncclWaitSignalDesc_t,
    comm: *mut c_void,
    stream: *mut c_void,
) -> Outcome {
    let n = usize::try_from(n_desc).map_err(|_| NcclError::OutOfRange {
        what: "nDesc",
        value: n_desc.into(),
        expected: "0 or more".into(),
    })?;
    if descs.is_null() && n > 0 {
        return Err(NcclError::Null {
            what: "signalDescs",
        });
    }
    let c = coll::check(comm)?;
    let raw: &[ncclWaitSignalDesc_t] = match n {
        0 => &[],
        // SAFETY: checked non-null; NCCL's contract: `nDesc` descriptors, read during the call.
        _ => unsafe { std::slice::from_raw_parts(descs, n) },
    };
    let waits = raw
        .iter()
        .map(|d| {
            Ok(SignalWait {
                peer: rank_arg("peer", d.peer, c.nranks)?,
                signal: signal((d.sigIdx, d.ctx, 0))?,
                count: u64::try_from(d.opCnt).map_err(|_| NcclError::OutOfRange {
                    what: "opCnt",
                    value: d.opCnt.into(),
                    expected: "0 or more".into(),
                })?,
            })
        })
        .collect::<Result<Vec<_>, NcclError>>()?;
    on_stream(&c, stream, "ncclWaitSignal", |s| {
        c.coll.wait_signals(&waits, s)
    })
}
