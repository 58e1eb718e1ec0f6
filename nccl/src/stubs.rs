//! The symbols of NVIDIA's `libnccl.so.2` (2.32.3) that this library exports without
//! implementing them, so that the dynamic linker never resolves one of them in another NCCL
//! (with `LD_PRELOAD`, that one would be handed our communicators). Each returns
//! `ncclInvalidUsage` and sets the last error to why; the few that cannot return a code
//! (`ncclTeam*`, `ncclLLA2ACalcSlots`, `ncclResetDebugInit*`) return an empty value and set
//! the last error too. The crate docs list them with the reasons.

#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_void};

use crate::abi::{ncclResult_t, ncclTeam_t};
use crate::error::{NcclError, api, fail, guarded};
use crate::exports::{export, ncclComm_t, ncclWindow_t};

/// Why NCCL's device-side API is not there.
pub const DEVICE_API: &str = "NCCL's device-side API (device communicators, symmetric-memory pointers, teams, GIN) is not implemented; mscclpp-rs kernels use its own channels (mscclpp::device)";
/// Why suspend and resume are not there.
pub const SUSPEND: &str =
    "communicators do not release and re-acquire their memory; destroy it and make a new one";
/// Why memory statistics are not there.
pub const MEM_STATS: &str = "per-communicator memory statistics are not kept";
/// Why encryption is not there.
pub const ENCRYPTION: &str =
    "the bootstrap's TCP sockets are not encrypted (keep them on a trusted network)";
/// Why the parameter API is not there.
pub const PARAMS: &str = "NCCL's parameters do not exist here; mscclpp-rs reads MSCCLPP_* environment variables (CollectiveConfig; ncclParamDumpAll logs them)";

/// Defines a stub (and its `pnccl` alias) that refuses with `why`.
macro_rules! stub {
    ($name:ident / $pname:ident ($($a:ident: $t:ty),* $(,)?), $why:expr) => {
        export! {
            #[doc = concat!("`", stringify!($name), "`: not implemented (`ncclInvalidUsage`).")]
            fn $name / $pname ($($a: $t),*) -> ncclResult_t {
                $(let _ = $a;)*
                api(stringify!($name), || {
                    Err(NcclError::NotImplemented { what: stringify!($name), why: $why })
                })
            }
        }
    };
}

stub!(ncclCommSuspend / pncclCommSuspend(comm: ncclComm_t, flags: c_int), SUSPEND);
stub!(ncclCommResume / pncclCommResume(comm: ncclComm_t), SUSPEND);
stub!(
    ncclCommMemStats / pncclCommMemStats(comm: ncclComm_t, stat: c_int, value: *mut u64),
    MEM_STATS
);
stub!(ncclSetEncryption / pncclSetEncryption(config: *const c_void), ENCRYPTION);
stub!(ncclParamBind / pncclParamBind(out: *mut *mut c_void, key: *const c_char), PARAMS);
stub!(ncclParamGetI8 / pncclParamGetI8(h: *mut c_void, out: *mut i8), PARAMS);
stub!(ncclParamGetI16 / pncclParamGetI16(h: *mut c_void, out: *mut i16), PARAMS);
stub!(ncclParamGetI32 / pncclParamGetI32(h: *mut c_void, out: *mut i32), PARAMS);
stub!(ncclParamGetI64 / pncclParamGetI64(h: *mut c_void, out: *mut i64), PARAMS);
stub!(ncclParamGetU8 / pncclParamGetU8(h: *mut c_void, out: *mut u8), PARAMS);
stub!(ncclParamGetU16 / pncclParamGetU16(h: *mut c_void, out: *mut u16), PARAMS);
stub!(ncclParamGetU32 / pncclParamGetU32(h: *mut c_void, out: *mut u32), PARAMS);
stub!(ncclParamGetU64 / pncclParamGetU64(h: *mut c_void, out: *mut u64), PARAMS);
stub!(ncclParamGetStr / pncclParamGetStr(h: *mut c_void, out: *mut *const c_char), PARAMS);
stub!(
    ncclParamGet / pncclParamGet(h: *mut c_void, out: *mut c_void, maxLen: c_int, len: *mut c_int),
    PARAMS
);
stub!(
    ncclParamGetParameter / pncclParamGetParameter(
        key: *const c_char,
        value: *mut *const c_char,
        valueLen: *mut c_int,
    ),
    PARAMS
);
stub!(
    ncclParamGetAllParameterKeys / pncclParamGetAllParameterKeys(
        table: *mut *mut *const c_char,
        tableLen: *mut c_int,
    ),
    PARAMS
);

// NCCL's device API (`nccl_device/host.h`).
stub!(ncclCommQueryProperties / pncclCommQueryProperties(comm: ncclComm_t, props: *mut c_void), DEVICE_API);
stub!(
    ncclDevCommCreate / pncclDevCommCreate(comm: ncclComm_t, reqs: *const c_void, outDevComm: *mut c_void),
    DEVICE_API
);
stub!(ncclDevCommDestroy / pncclDevCommDestroy(comm: ncclComm_t, devComm: *const c_void), DEVICE_API);
stub!(
    ncclGetLsaMultimemDevicePointer / pncclGetLsaMultimemDevicePointer(
        window: ncclWindow_t,
        offset: usize,
        outPtr: *mut *mut c_void,
    ),
    DEVICE_API
);
stub!(
    ncclGetMultimemDevicePointer / pncclGetMultimemDevicePointer(
        window: ncclWindow_t,
        offset: usize,
        multimem: *mut c_void,
        outPtr: *mut *mut c_void,
    ),
    DEVICE_API
);
stub!(
    ncclGetLsaDevicePointer / pncclGetLsaDevicePointer(
        window: ncclWindow_t,
        offset: usize,
        lsaRank: c_int,
        outPtr: *mut *mut c_void,
    ),
    DEVICE_API
);
stub!(
    ncclGetPeerDevicePointer / pncclGetPeerDevicePointer(
        window: ncclWindow_t,
        offset: usize,
        peer: c_int,
        outPtr: *mut *mut c_void,
    ),
    DEVICE_API
);
stub!(
    ncclGetMultimemDeviceLeInfo / pncclGetMultimemDeviceLeInfo(
        window: ncclWindow_t,
        offset: usize,
        leId: *mut u32,
        leOffset: *mut usize,
    ),
    DEVICE_API
);
stub!(
    ncclGetCftDeviceLeInfo / pncclGetCftDeviceLeInfo(
        window: ncclWindow_t,
        offset: usize,
        peerCft: c_int,
        cftTeam: ncclTeam_t,
        leId: *mut u32,
        leOffset: *mut usize,
    ),
    DEVICE_API
);
stub!(
    ncclGetPeerDeviceLeInfo / pncclGetPeerDeviceLeInfo(
        window: ncclWindow_t,
        offset: usize,
        peerWorld: c_int,
        leId: *mut u32,
        leOffset: *mut usize,
    ),
    DEVICE_API
);
stub!(
    ncclLsaBarrierCreateRequirement / pncclLsaBarrierCreateRequirement(
        team: ncclTeam_t,
        nBarriers: c_int,
        outHandle: *mut c_void,
        outReq: *mut c_void,
    ),
    DEVICE_API
);
stub!(
    ncclGinBarrierCreateRequirement / pncclGinBarrierCreateRequirement(
        comm: ncclComm_t,
        team: ncclTeam_t,
        nBarriers: c_int,
        outHandle: *mut c_void,
        outReq: *mut c_void,
    ),
    DEVICE_API
);
stub!(
    ncclCftBarrierCreateRequirement / pncclCftBarrierCreateRequirement(
        team: ncclTeam_t,
        nBarriers: c_int,
        outHandle: *mut c_void,
        outReq: *mut c_void,
    ),
    DEVICE_API
);
stub!(
    ncclLLA2ACreateRequirement / pncclLLA2ACreateRequirement(
        nBlocks: c_int,
        nSlots: c_int,
        outHandle: *mut c_void,
        outReq: *mut c_void,
    ),
    DEVICE_API
);
stub!(
    ncclGinOutboxCreateRequirement / pncclGinOutboxCreateRequirement(
        nBlocks: c_int,
        sizeLog2: c_int,
        outHandle: *mut c_void,
        outReq: *mut c_void,
    ),
    DEVICE_API
);
stub!(
    ncclGinInboxA2ACreateRequirement / pncclGinInboxA2ACreateRequirement(
        peers: ncclTeam_t,
        nBlocks: c_int,
        sizeLog2: c_int,
        outHandle: *mut c_void,
        outReq: *mut c_void,
    ),
    DEVICE_API
);

/// Records that `name` (which cannot return a code) is not implemented.
fn refuse(name: &'static str, why: &'static str) {
    let e = NcclError::NotImplemented { what: name, why };
    fail(name, e.code(), &e.text());
}

/// Defines a team function (returns an empty team and sets the last error).
macro_rules! team {
    ($name:ident / $pname:ident ($($a:ident: $t:ty),* $(,)?)) => {
        export! {
            #[doc = concat!("`", stringify!($name), "`: not implemented; an empty team (the last error says why).")]
            fn $name / $pname ($($a: $t),*) -> ncclTeam_t {
                $(let _ = $a;)*
                guarded(stringify!($name), ncclTeam_t::default(), || {
                    refuse(stringify!($name), DEVICE_API);
                    ncclTeam_t::default()
                })
            }
        }
    };
}

team!(ncclTeamWorld / pncclTeamWorld(comm: ncclComm_t));
team!(ncclTeamLsa / pncclTeamLsa(comm: ncclComm_t));
team!(ncclTeamCft / pncclTeamCft(comm: ncclComm_t, mode: c_int));
team!(ncclTeamCftMultimem / pncclTeamCftMultimem(comm: ncclComm_t));
team!(ncclTeamRail / pncclTeamRail(comm: ncclComm_t));

/// Defines an int-returning device-API function (returns -1 and sets the last error).
macro_rules! minus_one {
    ($name:ident / $pname:ident ($($a:ident: $t:ty),* $(,)?)) => {
        export! {
            #[doc = concat!("`", stringify!($name), "`: not implemented; -1 (the last error says why).")]
            fn $name / $pname ($($a: $t),*) -> c_int {
                $(let _ = $a;)*
                guarded(stringify!($name), -1, || {
                    refuse(stringify!($name), DEVICE_API);
                    -1
                })
            }
        }
    };
}

minus_one!(ncclTeamRankToWorld / pncclTeamRankToWorld(comm: ncclComm_t, team: ncclTeam_t, rank: c_int));
minus_one!(ncclTeamRankToLsa / pncclTeamRankToLsa(comm: ncclComm_t, team: ncclTeam_t, rank: c_int));
minus_one!(ncclLLA2ACalcSlots / pncclLLA2ACalcSlots(maxElts: c_int, maxEltSize: c_int));

/// Why logging is not reset.
const LOGGING: &str =
    "logging is set up once per process, from MSCCLPP_LOG or NCCL_DEBUG at the first call";

export! {
    /// `ncclResetDebugInit`: not implemented (the last error says why).
    fn ncclResetDebugInit / pncclResetDebugInit() -> () {
        guarded("ncclResetDebugInit", (), || refuse("ncclResetDebugInit", LOGGING))
    }
}

/// `ncclResetDebugInitInternal` (exported by NVIDIA without a declaration or a `pnccl`
/// alias): not implemented (the last error says why).
///
/// # Safety
/// None needed: it takes nothing.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclResetDebugInitInternal() {
    guarded("ncclResetDebugInitInternal", (), || {
        refuse("ncclResetDebugInitInternal", LOGGING)
    })
}

export! {
    /// `ncclParamDumpAll`: logs (at info level) the settings mscclpp-rs reads instead of NCCL's
    /// parameters: the collectives' `CollectiveConfig`, with the environment applied.
    fn ncclParamDumpAll / pncclParamDumpAll() -> () {
        guarded("ncclParamDumpAll", (), || {
            let kind = match crate::comm::backend() {
                Ok(k) => k,
                Err(e) => return fail("ncclParamDumpAll", e.code(), &e.text()),
            };
            let cfg = mscclpp::collectives::CollectiveConfig::for_backend(kind).with_env();
            for (name, value) in cfg.settings() {
                tracing::info!("{kind:?} collectives: {name} = {value}");
            }
        })
    }
}
