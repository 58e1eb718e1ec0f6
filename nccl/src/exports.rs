//! Every C symbol of the library, in `nccl.h`'s order: each `nccl*` function and its `pnccl*`
//! profiling alias (NVIDIA exports both), plus `ncclAllToAll`, a second spelling of
//! `ncclAlltoAll` that some NCCL-API shims use. Each body is one call into the module of its
//! concern, run by [`api`] (panics caught, errors recorded for `ncclGetLastError`). The
//! functions NCCL has and this library does not implement are in `stubs.rs`.

#![allow(non_snake_case, non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void};

use crate::abi::{
    NCCL_VERSION_CODE, ncclCollConfig_t, ncclConfig_t, ncclResult_t, ncclSimInfo_t, ncclUniqueId,
};
use crate::args::read_versioned;
use crate::collectives as coll;
use crate::comm::{Checked, Comm, Handle};
use crate::error::{NcclError, Outcome, api, guarded, last_error};
use crate::group;
use crate::init;
use crate::one_sided;
use crate::p2p;
use crate::recovery;
use crate::registration as reg;

/// `ncclComm_t`.
pub type ncclComm_t = *mut c_void;
/// `cudaStream_t`.
pub type cudaStream_t = *mut c_void;
/// `ncclWindow_t`.
pub type ncclWindow_t = *mut c_void;

/// Defines `nccl…` with `body` and `pnccl…` calling it.
macro_rules! export {
    ($(#[$doc:meta])* fn $name:ident / $pname:ident ($($a:ident: $t:ty),* $(,)?) -> $ret:ty $body:block) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// NCCL's contract for this function: every pointer argument is null where NCCL allows
        /// it, else valid for what NCCL's documentation says the function reads or writes;
        /// buffers and streams stay valid until the work queued on them completes.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($a: $t),*) -> $ret $body

        #[doc = concat!("`", stringify!($pname), "`: the profiling alias of [`", stringify!($name), "`].")]
        ///
        /// # Safety
        /// As the function it aliases.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $pname($($a: $t),*) -> $ret {
            // SAFETY: the same contract, passed on.
            unsafe { $name($($a),*) }
        }
    };
}
pub(crate) use export;

/// Checks a per-call `ncclCollConfig_t` (null: none): its tuning hints are accepted and left to
/// the library's own choice; a forced NCCL algorithm selection is refused, and a launch
/// completion event is not served yet.
fn coll_config(config: *const ncclCollConfig_t) -> Result<(), NcclError> {
    // SAFETY: NCCL's contract: null or a struct of its declared size.
    let Some(cfg) = (unsafe { read_versioned(config, "ncclCollConfig_t") })? else {
        return Ok(());
    };
    if !cfg.algSelection.is_null() && cfg.forceAlgSelection != 0 {
        // SAFETY: NCCL's contract: a NUL-terminated string when not null.
        let sel = unsafe { std::ffi::CStr::from_ptr(cfg.algSelection) };
        if !sel.is_empty() {
            return Err(NcclError::ConfigRefused {
                what: "ncclCollConfig_t::algSelection",
                reason: "it names NCCL's algorithms; mscclpp-rs chooses among its own (MSCCLPP_* settings), so set forceAlgSelection = 0 or leave it unset",
            });
        }
    }
    if !cfg.launchCompletionEvent.is_null() {
        return Err(NcclError::NotYet {
            what: "ncclCollConfig_t::launchCompletionEvent",
            needs: "recording a caller's CUDA event",
        });
    }
    Ok(())
}

/// A collective or a send/receive: its checks by `make` (the library's call), then now or at
/// the group's end, on the caller's stream.
fn collective(
    comm: ncclComm_t,
    stream: cudaStream_t,
    make: impl FnOnce(&Comm) -> Result<Checked, NcclError>,
) -> Outcome {
    group::enqueue(|| {
        let c = coll::check(comm)?;
        let call = make(&c)?;
        Ok((c, (call, stream as u64)))
    })
}

/// `r`, its failure noted for the group it may end (`group::note_failure`).
fn noted(r: Outcome) -> Outcome {
    if let Err(e) = &r {
        group::note_failure(e);
    }
    r
}

fn done() -> Outcome {
    Ok(ncclResult_t::ncclSuccess)
}

export! {
    /// `ncclMemAlloc`: device memory of the current device from the library's exportable
    /// allocator (usable by the collectives' zero-copy paths).
    fn ncclMemAlloc / pncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> ncclResult_t {
        api("ncclMemAlloc", || reg::mem_alloc(ptr, size).and_then(|()| done()))
    }
}

export! {
    /// `ncclMemFree`.
    fn ncclMemFree / pncclMemFree(ptr: *mut c_void) -> ncclResult_t {
        api("ncclMemFree", || reg::mem_free(ptr).and_then(|()| done()))
    }
}

export! {
    /// `ncclGetVersion`: the NCCL API level implemented ([`NCCL_VERSION_CODE`]).
    fn ncclGetVersion / pncclGetVersion(version: *mut c_int) -> ncclResult_t {
        api("ncclGetVersion", || {
            if version.is_null() {
                return Err(NcclError::Null { what: "version" });
            }
            // SAFETY: checked non-null; NCCL's contract: a writable int.
            unsafe { version.write(NCCL_VERSION_CODE) };
            done()
        })
    }
}

export! {
    /// `ncclGetUniqueId`.
    fn ncclGetUniqueId / pncclGetUniqueId(uniqueId: *mut ncclUniqueId) -> ncclResult_t {
        api("ncclGetUniqueId", || init::get_unique_id(uniqueId))
    }
}

export! {
    /// `ncclCommInitRankConfig`.
    fn ncclCommInitRankConfig / pncclCommInitRankConfig(
        comm: *mut ncclComm_t,
        nranks: c_int,
        commId: ncclUniqueId,
        rank: c_int,
        config: *mut ncclConfig_t,
    ) -> ncclResult_t {
        api("ncclCommInitRankConfig", || {
            noted(init::init_rank(comm, nranks, &commId, rank, config))
        })
    }
}

export! {
    /// `ncclCommInitRank`.
    fn ncclCommInitRank / pncclCommInitRank(
        comm: *mut ncclComm_t,
        nranks: c_int,
        commId: ncclUniqueId,
        rank: c_int,
    ) -> ncclResult_t {
        api("ncclCommInitRank", || {
            noted(init::init_rank(comm, nranks, &commId, rank, std::ptr::null()))
        })
    }
}

export! {
    /// `ncclCommInitAll`.
    fn ncclCommInitAll / pncclCommInitAll(comm: *mut ncclComm_t, ndev: c_int, devlist: *const c_int) -> ncclResult_t {
        api("ncclCommInitAll", || init::init_all(comm, ndev, devlist))
    }
}

export! {
    /// `ncclCommFinalize`.
    fn ncclCommFinalize / pncclCommFinalize(comm: ncclComm_t) -> ncclResult_t {
        api("ncclCommFinalize", || init::finalize(comm))
    }
}

export! {
    /// `ncclCommDestroy`.
    fn ncclCommDestroy / pncclCommDestroy(comm: ncclComm_t) -> ncclResult_t {
        api("ncclCommDestroy", || init::destroy(comm))
    }
}

export! {
    /// `ncclCommAbort`.
    fn ncclCommAbort / pncclCommAbort(comm: ncclComm_t) -> ncclResult_t {
        api("ncclCommAbort", || init::abort(comm))
    }
}

export! {
    /// `ncclCommSplit`.
    fn ncclCommSplit / pncclCommSplit(
        comm: ncclComm_t,
        color: c_int,
        key: c_int,
        newcomm: *mut ncclComm_t,
        config: *mut ncclConfig_t,
    ) -> ncclResult_t {
        api("ncclCommSplit", || {
            noted(init::split(comm, color, key, newcomm, config))
        })
    }
}

export! {
    /// `ncclPutSignal` (module docs).
    fn ncclPutSignal / pncclPutSignal(
        localbuff: *const c_void,
        count: usize,
        datatype: c_int,
        peer: c_int,
        peerWin: ncclWindow_t,
        peerWinOffset: usize,
        sigIdx: c_int,
        ctx: c_int,
        flags: u32,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        api("ncclPutSignal", || {
            let signal = (sigIdx, ctx, flags);
            one_sided::put_signal(localbuff, count, datatype, peer, peerWin, peerWinOffset, signal, comm, stream)
        })
    }
}

export! {
    /// `ncclSignal` (module docs).
    fn ncclSignal / pncclSignal(
        peer: c_int,
        sigIdx: c_int,
        ctx: c_int,
        flags: u32,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        api("ncclSignal", || one_sided::signal_only(peer, (sigIdx, ctx, flags), comm, stream))
    }
}

export! {
    /// `ncclWaitSignal` (module docs).
    fn ncclWaitSignal / pncclWaitSignal(
        nDesc: c_int,
        signalDescs: *mut crate::abi::ncclWaitSignalDesc_t,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        api("ncclWaitSignal", || one_sided::wait_signal(nDesc, signalDescs, comm, stream))
    }
}

export! {
    /// `ncclCommRevoke`.
    fn ncclCommRevoke / pncclCommRevoke(comm: ncclComm_t, revokeFlags: c_int) -> ncclResult_t {
        api("ncclCommRevoke", || recovery::revoke(comm, revokeFlags))
    }
}

export! {
    /// `ncclCommShrink`.
    fn ncclCommShrink / pncclCommShrink(
        comm: ncclComm_t,
        excludeRanksList: *mut c_int,
        excludeRanksCount: c_int,
        newcomm: *mut ncclComm_t,
        config: *mut ncclConfig_t,
        shrinkFlags: c_int,
    ) -> ncclResult_t {
        api("ncclCommShrink", || {
            noted(recovery::shrink(
                comm,
                excludeRanksList,
                excludeRanksCount,
                newcomm,
                config,
                shrinkFlags,
            ))
        })
    }
}

export! {
    /// `ncclCommGetUniqueId`.
    fn ncclCommGetUniqueId / pncclCommGetUniqueId(
        comm: ncclComm_t,
        uniqueId: *mut ncclUniqueId,
    ) -> ncclResult_t {
        api("ncclCommGetUniqueId", || recovery::get_unique_id(comm, uniqueId))
    }
}

export! {
    /// `ncclCommGrow`.
    fn ncclCommGrow / pncclCommGrow(
        comm: ncclComm_t,
        nRanks: c_int,
        uniqueId: *const ncclUniqueId,
        rank: c_int,
        newcomm: *mut ncclComm_t,
        config: *mut ncclConfig_t,
    ) -> ncclResult_t {
        api("ncclCommGrow", || {
            noted(recovery::grow(comm, nRanks, uniqueId, rank, newcomm, config))
        })
    }
}

export! {
    /// `ncclCommInitRankScalable`.
    fn ncclCommInitRankScalable / pncclCommInitRankScalable(
        newcomm: *mut ncclComm_t,
        nranks: c_int,
        myrank: c_int,
        nId: c_int,
        commIds: *mut ncclUniqueId,
        config: *mut ncclConfig_t,
    ) -> ncclResult_t {
        api("ncclCommInitRankScalable", || {
            noted(init::init_rank_scalable(newcomm, nranks, myrank, nId, commIds, config))
        })
    }
}

/// The text of each code.
fn error_string(code: c_int) -> &'static std::ffi::CStr {
    match code {
        0 => c"no error",
        1 => c"unhandled CUDA error (the GPU layer failed; ncclGetLastError says where)",
        2 => c"unhandled system error (the OS or the network failed; ncclGetLastError says where)",
        3 => c"internal error of mscclpp-rs (please report it with ncclGetLastError's text)",
        4 => c"invalid argument (ncclGetLastError says which)",
        5 => c"invalid usage (a call in the wrong state, or not implemented; ncclGetLastError says which)",
        6 => c"remote error (a peer exited or failed)",
        7 => c"operation in progress",
        8 => c"timeout (peers did not answer in time)",
        _ => c"unknown result code",
    }
}

export! {
    /// `ncclGetErrorString`.
    fn ncclGetErrorString / pncclGetErrorString(result: c_int) -> *const c_char {
        guarded("ncclGetErrorString", c"unknown result code".as_ptr(), || {
            error_string(result).as_ptr()
        })
    }
}

export! {
    /// `ncclGetLastError`: the calling thread's last error, else the process's (`comm` is not
    /// used, as in NCCL).
    fn ncclGetLastError / pncclGetLastError(comm: ncclComm_t) -> *const c_char {
        let _ = comm;
        guarded("ncclGetLastError", c"".as_ptr(), last_error)
    }
}

export! {
    /// `ncclCommGetAsyncError`.
    fn ncclCommGetAsyncError / pncclCommGetAsyncError(comm: ncclComm_t, asyncError: *mut c_int) -> ncclResult_t {
        api("ncclCommGetAsyncError", || init::get_async_error(comm, asyncError))
    }
}

export! {
    /// `ncclCommCount`.
    fn ncclCommCount / pncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t {
        api("ncclCommCount", || init::tell(comm, count, |f| f.nranks))
    }
}

export! {
    /// `ncclCommCuDevice`: the CUDA device ordinal (on the CPU backend, its device).
    fn ncclCommCuDevice / pncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> ncclResult_t {
        api("ncclCommCuDevice", || init::tell(comm, device, |f| f.device))
    }
}

export! {
    /// `ncclCommUserRank`.
    fn ncclCommUserRank / pncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t {
        api("ncclCommUserRank", || init::tell(comm, rank, |f| f.rank))
    }
}

export! {
    /// `ncclCommRegister`.
    fn ncclCommRegister / pncclCommRegister(
        comm: ncclComm_t,
        buff: *mut c_void,
        size: usize,
        handle: *mut *mut c_void,
    ) -> ncclResult_t {
        api("ncclCommRegister", || {
            reg::register(&*Handle::ready(comm)?, buff, size, handle).and_then(|()| done())
        })
    }
}

export! {
    /// `ncclCommDeregister`.
    fn ncclCommDeregister / pncclCommDeregister(comm: ncclComm_t, handle: *mut c_void) -> ncclResult_t {
        api("ncclCommDeregister", || {
            reg::deregister(&*Handle::ready(comm)?, handle).and_then(|()| done())
        })
    }
}

export! {
    /// `ncclCommWindowRegister`.
    fn ncclCommWindowRegister / pncclCommWindowRegister(
        comm: ncclComm_t,
        buff: *mut c_void,
        size: usize,
        win: *mut ncclWindow_t,
        winFlags: c_int,
    ) -> ncclResult_t {
        api("ncclCommWindowRegister", || {
            let c = Handle::ready(comm)?;
            let (h, job) = reg::window_register(&c, buff, size, win, winFlags)?;
            group::now_or_at_end(c, job)?;
            // SAFETY: checked non-null by `window_register`; NCCL's contract: a writable
            // `ncclWindow_t`.
            unsafe { win.write(h as *mut c_void) };
            done()
        })
    }
}

export! {
    /// `ncclCommWindowDeregister`.
    fn ncclCommWindowDeregister / pncclCommWindowDeregister(comm: ncclComm_t, win: ncclWindow_t) -> ncclResult_t {
        api("ncclCommWindowDeregister", || {
            group::now_or_at_end(Handle::ready(comm)?, reg::window_deregister(win))
                .and_then(|()| done())
        })
    }
}

export! {
    /// `ncclWinGetUserPtr`.
    fn ncclWinGetUserPtr / pncclWinGetUserPtr(comm: ncclComm_t, win: ncclWindow_t, outUserPtr: *mut *mut c_void) -> ncclResult_t {
        api("ncclWinGetUserPtr", || {
            if outUserPtr.is_null() {
                return Err(NcclError::Null { what: "outUserPtr" });
            }
            let p = reg::window_user_ptr(&*Handle::ready(comm)?, win)?;
            // SAFETY: checked non-null; NCCL's contract: a writable `void*`.
            unsafe { outUserPtr.write(p as *mut c_void) };
            done()
        })
    }
}

export! {
    /// `ncclRedOpCreatePreMulSum`: an operator of this communicator, for the reducing
    /// collectives of `datatype` (a host scalar is copied now, a device one read by each call).
    fn ncclRedOpCreatePreMulSum / pncclRedOpCreatePreMulSum(
        op: *mut c_int,
        scalar: *mut c_void,
        datatype: c_int,
        residence: c_int,
        comm: ncclComm_t,
    ) -> ncclResult_t {
        api("ncclRedOpCreatePreMulSum", || {
            if op.is_null() {
                return Err(NcclError::Null { what: "op" });
            }
            let v = reg::create_pre_mul_sum(&*Handle::ready(comm)?, scalar, datatype, residence)?;
            // SAFETY: checked non-null; NCCL's contract: a writable `ncclRedOp_t`.
            unsafe { op.write(v) };
            done()
        })
    }
}

export! {
    /// `ncclRedOpDestroy`.
    fn ncclRedOpDestroy / pncclRedOpDestroy(op: c_int, comm: ncclComm_t) -> ncclResult_t {
        api("ncclRedOpDestroy", || reg::destroy_op(&*Handle::ready(comm)?, op).and_then(|()| done()))
    }
}

export! {
    /// `ncclReduce`.
    fn ncclReduce / pncclReduce(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        op: c_int,
        root: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        api("ncclReduce", || {
            collective(comm, stream, |c| coll::reduce(c, sendbuff, recvbuff, count, datatype, op, root))
        })
    }
}

export! {
    /// `ncclBcast`: an in-place broadcast.
    fn ncclBcast / pncclBcast(
        buff: *mut c_void,
        count: usize,
        datatype: c_int,
        root: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        api("ncclBcast", || {
            collective(comm, stream, |c| coll::broadcast(c, buff, buff, count, datatype, root))
        })
    }
}

export! {
    /// `ncclBroadcast`.
    fn ncclBroadcast / pncclBroadcast(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        root: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        api("ncclBroadcast", || {
            collective(comm, stream, |c| coll::broadcast(c, sendbuff, recvbuff, count, datatype, root))
        })
    }
}

export! {
    /// `ncclAllReduce`.
    fn ncclAllReduce / pncclAllReduce(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        op: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        api("ncclAllReduce", || {
            collective(comm, stream, |c| coll::all_reduce(c, sendbuff, recvbuff, count, datatype, op))
        })
    }
}

export! {
    /// `ncclReduceScatter`.
    fn ncclReduceScatter / pncclReduceScatter(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        recvcount: usize,
        datatype: c_int,
        op: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        api("ncclReduceScatter", || {
            collective(comm, stream, |c| coll::reduce_scatter(c, sendbuff, recvbuff, recvcount, datatype, op))
        })
    }
}

export! {
    /// `ncclAllGather`.
    fn ncclAllGather / pncclAllGather(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        sendcount: usize,
        datatype: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        api("ncclAllGather", || {
            collective(comm, stream, |c| coll::all_gather(c, sendbuff, recvbuff, sendcount, datatype))
        })
    }
}

export! {
    /// `ncclAlltoAll` (NVIDIA's spelling).
    fn ncclAlltoAll / pncclAlltoAll(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        api("ncclAlltoAll", || {
            collective(comm, stream, |c| coll::all_to_all(c, sendbuff, recvbuff, count, datatype))
        })
    }
}

export! {
    /// `ncclAllToAll`: the same as [`ncclAlltoAll`] (a spelling some shims use; NVIDIA
    /// exports only `ncclAlltoAll`).
    fn ncclAllToAll / pncclAllToAll(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        // SAFETY: the same contract, passed on.
        unsafe { ncclAlltoAll(sendbuff, recvbuff, count, datatype, comm, stream) }
    }
}

export! {
    /// `ncclGather`.
    fn ncclGather / pncclGather(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        root: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        api("ncclGather", || {
            collective(comm, stream, |c| coll::gather(c, sendbuff, recvbuff, count, datatype, root))
        })
    }
}

export! {
    /// `ncclScatter`.
    fn ncclScatter / pncclScatter(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        root: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        api("ncclScatter", || {
            collective(comm, stream, |c| coll::scatter(c, sendbuff, recvbuff, count, datatype, root))
        })
    }
}

export! {
    /// `ncclAllReduceConfig`.
    fn ncclAllReduceConfig / pncclAllReduceConfig(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        op: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
        config: *const ncclCollConfig_t,
    ) -> ncclResult_t {
        api("ncclAllReduceConfig", || {
            collective(comm, stream, |c| {
                coll_config(config)?;
                coll::all_reduce(c, sendbuff, recvbuff, count, datatype, op)
            })
        })
    }
}

export! {
    /// `ncclBroadcastConfig`.
    fn ncclBroadcastConfig / pncclBroadcastConfig(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        root: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
        config: *const ncclCollConfig_t,
    ) -> ncclResult_t {
        api("ncclBroadcastConfig", || {
            collective(comm, stream, |c| {
                coll_config(config)?;
                coll::broadcast(c, sendbuff, recvbuff, count, datatype, root)
            })
        })
    }
}

export! {
    /// `ncclReduceConfig`.
    fn ncclReduceConfig / pncclReduceConfig(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        op: c_int,
        root: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
        config: *const ncclCollConfig_t,
    ) -> ncclResult_t {
        api("ncclReduceConfig", || {
            collective(comm, stream, |c| {
                coll_config(config)?;
                coll::reduce(c, sendbuff, recvbuff, count, datatype, op, root)
            })
        })
    }
}

export! {
    /// `ncclAllGatherConfig`.
    fn ncclAllGatherConfig / pncclAllGatherConfig(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        sendcount: usize,
        datatype: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
        config: *const ncclCollConfig_t,
    ) -> ncclResult_t {
        api("ncclAllGatherConfig", || {
            collective(comm, stream, |c| {
                coll_config(config)?;
                coll::all_gather(c, sendbuff, recvbuff, sendcount, datatype)
            })
        })
    }
}

export! {
    /// `ncclReduceScatterConfig`.
    fn ncclReduceScatterConfig / pncclReduceScatterConfig(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        recvcount: usize,
        datatype: c_int,
        op: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
        config: *const ncclCollConfig_t,
    ) -> ncclResult_t {
        api("ncclReduceScatterConfig", || {
            collective(comm, stream, |c| {
                coll_config(config)?;
                coll::reduce_scatter(c, sendbuff, recvbuff, recvcount, datatype, op)
            })
        })
    }
}

export! {
    /// `ncclAlltoAllConfig`.
    fn ncclAlltoAllConfig / pncclAlltoAllConfig(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
        config: *const ncclCollConfig_t,
    ) -> ncclResult_t {
        api("ncclAlltoAllConfig", || {
            collective(comm, stream, |c| {
                coll_config(config)?;
                coll::all_to_all(c, sendbuff, recvbuff, count, datatype)
            })
        })
    }
}

export! {
    /// `ncclGatherConfig`.
    fn ncclGatherConfig / pncclGatherConfig(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        root: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
        config: *const ncclCollConfig_t,
    ) -> ncclResult_t {
        api("ncclGatherConfig", || {
            collective(comm, stream, |c| {
                coll_config(config)?;
                coll::gather(c, sendbuff, recvbuff, count, datatype, root)
            })
        })
    }
}

export! {
    /// `ncclScatterConfig`.
    fn ncclScatterConfig / pncclScatterConfig(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        root: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
        config: *const ncclCollConfig_t,
    ) -> ncclResult_t {
        api("ncclScatterConfig", || {
            collective(comm, stream, |c| {
                coll_config(config)?;
                coll::scatter(c, sendbuff, recvbuff, count, datatype, root)
            })
        })
    }
}

export! {
    /// `ncclSend`.
    fn ncclSend / pncclSend(
        sendbuff: *const c_void,
        count: usize,
        datatype: c_int,
        peer: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        api("ncclSend", || collective(comm, stream, |c| p2p::send(c, sendbuff, count, datatype, peer)))
    }
}

export! {
    /// `ncclRecv`.
    fn ncclRecv / pncclRecv(
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        peer: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> ncclResult_t {
        api("ncclRecv", || collective(comm, stream, |c| p2p::recv(c, recvbuff, count, datatype, peer)))
    }
}

export! {
    /// `ncclGroupStart`.
    fn ncclGroupStart / pncclGroupStart() -> ncclResult_t {
        api("ncclGroupStart", group::start)
    }
}

export! {
    /// `ncclGroupEnd`.
    fn ncclGroupEnd / pncclGroupEnd() -> ncclResult_t {
        api("ncclGroupEnd", group::end)
    }
}

export! {
    /// `ncclGroupSimulateEnd`: closes the group without running it; simulation is not
    /// implemented (`ncclInvalidUsage`).
    fn ncclGroupSimulateEnd / pncclGroupSimulateEnd(simInfo: *mut ncclSimInfo_t) -> ncclResult_t {
        let _ = simInfo;
        api("ncclGroupSimulateEnd", group::simulate_end)
    }
}

/// `mscclppCpuStreamCreate(void** stream)`: not an NCCL symbol. On the CPU backend, a stream
/// for C callers (`cpu_streams.rs`): calls given it are queued and return at once.
///
/// # Safety
/// `stream` is null or a writable `void*`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppCpuStreamCreate(stream: *mut *mut c_void) -> ncclResult_t {
    api("mscclppCpuStreamCreate", || {
        crate::cpu_streams::create(stream).and_then(|()| done())
    })
}

/// `mscclppCpuStreamSynchronize(void* stream)`: not an NCCL symbol. Waits for the work queued
/// on a stream of `mscclppCpuStreamCreate`; returns its first failure.
///
/// # Safety
/// None beyond the C ABI's: `stream` is only looked up.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppCpuStreamSynchronize(stream: *mut c_void) -> ncclResult_t {
    api("mscclppCpuStreamSynchronize", || {
        crate::cpu_streams::synchronize(stream).and_then(|()| done())
    })
}

/// `mscclppCpuStreamDestroy(void* stream)`: not an NCCL symbol. Waits for a stream of
/// `mscclppCpuStreamCreate`, then destroys it.
///
/// # Safety
/// None beyond the C ABI's: `stream` is only looked up.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppCpuStreamDestroy(stream: *mut c_void) -> ncclResult_t {
    api("mscclppCpuStreamDestroy", || {
        crate::cpu_streams::destroy(stream).and_then(|()| done())
    })
}
