//! NCCL's C types, with NVIDIA's values and layouts (our `include/nccl.h` is their C twin; the
//! ABI test compiles a program against NVIDIA's own `nccl.h` and compares): plain declarations,
//! importing nothing of this crate (the mappings onto the library's types, which can fail, are
//! in `args.rs`).
//!
//! Values that come from the caller (`ncclDataType_t`, `ncclRedOp_t`, `ncclResult_t` handed to
//! `ncclGetErrorString`) are plain `c_int`s here, never Rust enums: any integer may arrive, and
//! an out-of-range one is an error, not undefined behaviour.

#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void};

/// The NCCL version whose API this library implements: every symbol of NVIDIA's
/// `libnccl.so.2` of this version is exported, and `ncclGetVersion` reports it.
pub const NCCL_MAJOR: c_int = 2;
/// See [`NCCL_MAJOR`].
pub const NCCL_MINOR: c_int = 32;
/// See [`NCCL_MAJOR`].
pub const NCCL_PATCH: c_int = 3;
/// `NCCL_VERSION(2, 32, 3)`: `major * 10000 + minor * 100 + patch` (the code of every version
/// after 2.8).
pub const NCCL_VERSION_CODE: c_int = NCCL_MAJOR * 10000 + NCCL_MINOR * 100 + NCCL_PATCH;

/// `NCCL_API_MAGIC`: the `magic` of every versioned NCCL struct (`ncclConfig_t`,
/// `ncclCollConfig_t`).
pub const NCCL_API_MAGIC: c_uint = 0xcafe_beef;
/// `NCCL_CONFIG_UNDEF_INT`: a config field the caller left to the library.
pub const NCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;
/// `NCCL_SPLIT_NOCOLOR`.
pub const NCCL_SPLIT_NOCOLOR: c_int = -1;
/// `NCCL_UNIQUE_ID_BYTES`.
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// `ncclResult_t`. Functions return it; an integer from the caller is a `c_int`.
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ncclResult_t {
    /// `ncclSuccess`.
    ncclSuccess = 0,
    /// `ncclUnhandledCudaError`: the GPU layer (CUDA driver, or the CPU backend's emulation).
    ncclUnhandledCudaError = 1,
    /// `ncclSystemError`: the operating system or the network (bootstrap sockets).
    ncclSystemError = 2,
    /// `ncclInternalError`: a bug of this library (a caught panic included).
    ncclInternalError = 3,
    /// `ncclInvalidArgument`: an argument is wrong (null, out of range, an unknown handle, a
    /// type or operator not served).
    ncclInvalidArgument = 4,
    /// `ncclInvalidUsage`: a call in the wrong state or order, or one this library does not
    /// implement (its last error says which).
    ncclInvalidUsage = 5,
    /// `ncclRemoteError`: a peer died or failed.
    ncclRemoteError = 6,
    /// `ncclInProgress`: a non-blocking operation has not finished yet.
    ncclInProgress = 7,
    /// `ncclTimeout`: a wait for peers ran out of time.
    ncclTimeout = 8,
}

/// `ncclNumResults`.
pub const ncclNumResults: c_int = 9;

impl ncclResult_t {
    /// NCCL's name of the code (`ncclInvalidUsage`).
    pub fn name(self) -> &'static str {
        match self {
            Self::ncclSuccess => "ncclSuccess",
            Self::ncclUnhandledCudaError => "ncclUnhandledCudaError",
            Self::ncclSystemError => "ncclSystemError",
            Self::ncclInternalError => "ncclInternalError",
            Self::ncclInvalidArgument => "ncclInvalidArgument",
            Self::ncclInvalidUsage => "ncclInvalidUsage",
            Self::ncclRemoteError => "ncclRemoteError",
            Self::ncclInProgress => "ncclInProgress",
            Self::ncclTimeout => "ncclTimeout",
        }
    }
}

// `ncclDataType_t` values.
/// `ncclInt8` (= `ncclChar`).
pub const ncclInt8: c_int = 0;
/// `ncclUint8`.
pub const ncclUint8: c_int = 1;
/// `ncclInt32` (= `ncclInt`).
pub const ncclInt32: c_int = 2;
/// `ncclUint32`.
pub const ncclUint32: c_int = 3;
/// `ncclInt64`.
pub const ncclInt64: c_int = 4;
/// `ncclUint64`.
pub const ncclUint64: c_int = 5;
/// `ncclFloat16` (= `ncclHalf`).
pub const ncclFloat16: c_int = 6;
/// `ncclFloat32` (= `ncclFloat`).
pub const ncclFloat32: c_int = 7;
/// `ncclFloat64` (= `ncclDouble`).
pub const ncclFloat64: c_int = 8;
/// `ncclBfloat16`.
pub const ncclBfloat16: c_int = 9;
/// `ncclFloat8e4m3`.
pub const ncclFloat8e4m3: c_int = 10;
/// `ncclFloat8e5m2`.
pub const ncclFloat8e5m2: c_int = 11;
/// `ncclNumTypes`.
pub const ncclNumTypes: c_int = 12;

/// Every NCCL data type: (value, NCCL name, bytes per element).
pub const DATA_TYPES: [(c_int, &str, usize); 12] = [
    (ncclInt8, "ncclInt8", 1),
    (ncclUint8, "ncclUint8", 1),
    (ncclInt32, "ncclInt32", 4),
    (ncclUint32, "ncclUint32", 4),
    (ncclInt64, "ncclInt64", 8),
    (ncclUint64, "ncclUint64", 8),
    (ncclFloat16, "ncclFloat16", 2),
    (ncclFloat32, "ncclFloat32", 4),
    (ncclFloat64, "ncclFloat64", 8),
    (ncclBfloat16, "ncclBfloat16", 2),
    (ncclFloat8e4m3, "ncclFloat8e4m3", 1),
    (ncclFloat8e5m2, "ncclFloat8e5m2", 1),
];

/// The NCCL name and element size of `t`, or `None` if `t` is not an NCCL data type.
pub fn type_info(t: c_int) -> Option<(&'static str, usize)> {
    DATA_TYPES
        .iter()
        .find(|(v, _, _)| *v == t)
        .map(|&(_, name, size)| (name, size))
}

// `ncclRedOp_t` values.
/// `ncclSum`.
pub const ncclSum: c_int = 0;
/// `ncclProd`.
pub const ncclProd: c_int = 1;
/// `ncclMax`.
pub const ncclMax: c_int = 2;
/// `ncclMin`.
pub const ncclMin: c_int = 3;
/// `ncclAvg`.
pub const ncclAvg: c_int = 4;
/// `ncclNumOps`: the first value of an operator made by `ncclRedOpCreatePreMulSum`.
pub const ncclNumOps: c_int = 5;
/// `ncclMaxRedOp`: the largest operator value (`ncclRedOp_t` is 4 bytes).
pub const ncclMaxRedOp: c_int = 0x7fff_ffff;

/// Every built-in NCCL operator: (value, NCCL name).
pub const BUILTIN_OPS: [(c_int, &str); 5] = [
    (ncclSum, "ncclSum"),
    (ncclProd, "ncclProd"),
    (ncclMax, "ncclMax"),
    (ncclMin, "ncclMin"),
    (ncclAvg, "ncclAvg"),
];

/// `ncclScalarDevice`: the pre-multiplied sum's scalar is read on the device, while the
/// collective runs.
pub const ncclScalarDevice: c_int = 0;
/// `ncclScalarHostImmediate`: the scalar is read from host memory before
/// `ncclRedOpCreatePreMulSum` returns.
pub const ncclScalarHostImmediate: c_int = 1;

/// `ncclUniqueId`: 128 bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclUniqueId {
    /// The bytes (our id in the first [`UNIQUE_ID_BYTES`](mscclpp::host::bootstrap::UNIQUE_ID_BYTES), zeros after).
    pub internal: [c_char; NCCL_UNIQUE_ID_BYTES],
}

/// `ncclConfig_t` as of NCCL 2.31–2.32 (`ncclConfig_v23100`, 120 bytes). Older callers pass a
/// shorter struct, whose `size` says how much of it they have: read with `args::read_versioned`,
/// never dereferenced whole.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclConfig_t {
    /// `sizeof` the caller's struct.
    pub size: usize,
    /// [`NCCL_API_MAGIC`].
    pub magic: c_uint,
    /// The caller's `NCCL_VERSION_CODE`.
    pub version: c_uint,
    /// 1: calls block; 0: non-blocking (`ncclInProgress` protocol).
    pub blocking: c_int,
    /// Thread-block cluster size (a hint; ignored).
    pub cgaClusterSize: c_int,
    /// Least CTAs per collective (a hint; ignored).
    pub minCTAs: c_int,
    /// Most CTAs per collective (a hint; ignored).
    pub maxCTAs: c_int,
    /// Network plugin name (ignored: there is no plugin).
    pub netName: *const c_char,
    /// Whether a split shares the parent's resources (ignored).
    pub splitShare: c_int,
    /// Network traffic class (ignored).
    pub trafficClass: c_int,
    /// The communicator's name (shown in the log).
    pub commName: *const c_char,
    /// CollNet (ignored).
    pub collnetEnable: c_int,
    /// CTA policy (ignored).
    pub CTAPolicy: c_int,
    /// Whether a shrink shares resources (ignored).
    pub shrinkShare: c_int,
    /// NVLS CTAs (ignored).
    pub nvlsCTAs: c_int,
    /// Channels per network peer (ignored).
    pub nChannelsPerNetPeer: c_int,
    /// NVLink-centric scheduling (ignored).
    pub nvlinkCentricSched: c_int,
    /// Graph usage mode (ignored).
    pub graphUsageMode: c_int,
    /// RMA contexts (ignored).
    pub numRmaCtx: c_int,
    /// Most point-to-point peers (ignored).
    pub maxP2pPeers: c_int,
    /// Graph stream ordering (ignored).
    pub graphStreamOrdering: c_int,
    /// Implicit launch order (ignored).
    pub launchOrderImplicit: c_int,
    /// RMA signals (ignored).
    pub numRmaSig: c_int,
    /// Eager RMA set-up (ignored).
    pub rmaEagerInit: c_int,
    /// Host CFT mode (ignored).
    pub hostCftMode: c_int,
    /// Host NVLS mode (ignored).
    pub nvlsHostMode: c_int,
}

impl Default for ncclConfig_t {
    /// `NCCL_CONFIG_INITIALIZER`.
    fn default() -> Self {
        let u = NCCL_CONFIG_UNDEF_INT;
        Self {
            size: size_of::<Self>(),
            magic: NCCL_API_MAGIC,
            version: NCCL_VERSION_CODE as c_uint,
            blocking: u,
            cgaClusterSize: u,
            minCTAs: u,
            maxCTAs: u,
            netName: std::ptr::null(),
            splitShare: u,
            trafficClass: u,
            commName: std::ptr::null(),
            collnetEnable: u,
            CTAPolicy: u,
            shrinkShare: u,
            nvlsCTAs: u,
            nChannelsPerNetPeer: u,
            nvlinkCentricSched: u,
            graphUsageMode: u,
            numRmaCtx: u,
            maxP2pPeers: u,
            graphStreamOrdering: u,
            launchOrderImplicit: u,
            numRmaSig: u,
            rmaEagerInit: u,
            hostCftMode: u,
            nvlsHostMode: u,
        }
    }
}

/// `ncclCollConfig_t` (NCCL 2.32, `ncclCollConfig_v23200`, 72 bytes): the per-call config of
/// the `nccl*Config` collectives. Read with `args::read_versioned`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclCollConfig_t {
    /// `sizeof` the caller's struct.
    pub size: usize,
    /// [`NCCL_API_MAGIC`].
    pub magic: c_uint,
    /// The caller's `NCCL_VERSION_CODE`.
    pub version: c_uint,
    /// Vendor extensions (a list this library has none of).
    pub ext: *mut c_void,
    /// Least CTAs (a hint; ignored).
    pub minCTAs: c_int,
    /// Most CTAs (a hint; ignored).
    pub maxCTAs: c_int,
    /// NVLS CTAs (a hint; ignored).
    pub nvlsCTAs: c_int,
    /// Cluster size (a hint; ignored).
    pub cgaClusterSize: c_int,
    /// NCCL algorithm names to choose from (refused when set and forced: mscclpp-rs chooses
    /// among its own algorithms).
    pub algSelection: *const c_char,
    /// Whether an unsatisfiable `algSelection` is an error (default 1).
    pub forceAlgSelection: c_int,
    /// CTA policy (a hint; ignored).
    pub CTAPolicy: c_int,
    /// Profiler tag (no profiler plugins; ignored).
    pub userProfilerTag: u64,
    /// An event to record when the collective's kernels are launched (not served yet).
    pub launchCompletionEvent: *mut c_void,
}

impl Default for ncclCollConfig_t {
    /// `NCCL_COLLCONFIG_INITIALIZER`.
    fn default() -> Self {
        let u = NCCL_CONFIG_UNDEF_INT;
        Self {
            size: size_of::<Self>(),
            magic: NCCL_API_MAGIC,
            version: NCCL_VERSION_CODE as c_uint,
            ext: std::ptr::null_mut(),
            minCTAs: u,
            maxCTAs: u,
            nvlsCTAs: u,
            cgaClusterSize: u,
            algSelection: std::ptr::null(),
            forceAlgSelection: 1,
            CTAPolicy: u,
            userProfilerTag: 0,
            launchCompletionEvent: std::ptr::null_mut(),
        }
    }
}

/// `ncclSimInfo_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclSimInfo_t {
    /// `sizeof` the caller's struct.
    pub size: usize,
    /// `0x74685283`.
    pub magic: c_uint,
    /// The caller's `NCCL_VERSION_CODE`.
    pub version: c_uint,
    /// Estimated time of the group.
    pub estimatedTime: f32,
}

/// `ncclTeam_t` (device API; returned by value from the `ncclTeam*` host functions).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ncclTeam_t {
    /// Ranks in the team.
    pub nRanks: c_int,
    /// This rank in the team.
    pub rank: c_int,
    /// Stride between the team's world ranks.
    pub stride: c_int,
}

/// `ncclWaitSignalDesc_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ncclWaitSignalDesc_t {
    /// Signal operations to wait for.
    pub opCnt: c_int,
    /// From which peer.
    pub peer: c_int,
    /// Signal index.
    pub sigIdx: c_int,
    /// Context.
    pub ctx: c_int,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_nvidias() {
        assert_eq!(size_of::<ncclUniqueId>(), 128);
        assert_eq!(size_of::<ncclConfig_t>(), 120);
        assert_eq!(std::mem::offset_of!(ncclConfig_t, blocking), 16);
        assert_eq!(std::mem::offset_of!(ncclConfig_t, netName), 32);
        assert_eq!(std::mem::offset_of!(ncclConfig_t, commName), 48);
        assert_eq!(std::mem::offset_of!(ncclConfig_t, nvlsHostMode), 112);
        assert_eq!(size_of::<ncclCollConfig_t>(), 72);
        assert_eq!(size_of::<ncclSimInfo_t>(), 24);
        assert_eq!(size_of::<ncclTeam_t>(), 12);
        assert_eq!(size_of::<ncclResult_t>(), 4);
        assert_eq!(NCCL_VERSION_CODE, 23203);
    }
}
