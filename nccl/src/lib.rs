//! # mscclpp-nccl: a drop-in `libnccl.so.2`
//!
//! NCCL's C API over mscclpp-rs's collectives, native (no NVIDIA NCCL underneath), built as
//! `libmscclpp_nccl.so` with the SONAME `libnccl.so.2` (`scripts/build-nccl.sh` installs it as
//! `target/nccl/lib/libnccl.so.2`), with its own `include/nccl.h`, ABI-identical to NVIDIA's
//! 2.32.3 header: the same enum values, `ncclUniqueId` of 128 bytes by value, `ncclConfig_t`
//! read by its `size` field. Every symbol NVIDIA's `libnccl.so.2` 2.32.3 exports (`nccl*` and
//! their `pnccl*` aliases, 193) is exported, plus `ncclAllToAll` / `pncclAllToAll`, a second
//! spelling of NVIDIA's `ncclAlltoAll`. README's "Use from PyTorch and other NCCL programs"
//! says how to load it.
//!
//! No logic of its own beyond argument checks, groups and mapping:
//!
//! | module | concern |
//! |---|---|
//! | `abi` | NCCL's types and values; the type and built-in operator mappings (`data_type`, `reduce_op`: one function each) |
//! | `exports` | every implemented C symbol, one call into its module each |
//! | `stubs` | the C symbols not implemented (list below) |
//! | `init` | unique ids, inits, split, finalize, destroy, abort, async errors |
//! | `comm` | the handle table, communicators, devices and streams |
//! | `group` | `ncclGroupStart` / `ncclGroupEnd` |
//! | `collectives` | the collectives' checks and their calls into `mscclpp::collectives` |
//! | `p2p` | sends and receives: their checks, and their records in the library's `Group` |
//! | `registration` | `ncclMemAlloc`, buffer and window registration, pre-multiplied sums |
//! | `error` | errors, their NCCL codes, `ncclGetLastError`, the panic guard |
//! | `log` | the `NCCL_DEBUG` / `MSCCLPP_LOG` subscriber and the banner |
//! | `executor` | MSCCL++ execution plans from C (`include/mscclpp_executor.h`: `mscclppExecutionPlanCreate`, `mscclppExecutorExecute`, …), over `mscclpp::executor` |
//!
//! Nothing unwinds into the caller: every exported function catches panics and returns
//! `ncclInternalError` (the library is loaded into PyTorch; `panic = "abort"` is not an
//! option). Every failing call sets the text `ncclGetLastError` returns.
//!
//! ## What is served
//!
//! | NCCL | here |
//! |---|---|
//! | `ncclGetVersion` | 23203 (2.32.3, the API level of the header and the exported symbols) |
//! | `ncclGetUniqueId`, `ncclCommInitRank`, `…Config` (blocking, and non-blocking with `ncclInProgress`), `…Scalable` (its first id), `ncclCommInitAll` | yes (`init.rs`: the process that makes the id initialises rank 0) |
//! | `ncclCommFinalize`, `ncclCommDestroy`, `ncclCommAbort`, `ncclCommGetAsyncError`, `ncclCommCount`, `ncclCommCuDevice`, `ncclCommUserRank`, `ncclGetErrorString`, `ncclGetLastError` | yes |
//! | `ncclGroupStart` / `ncclGroupEnd` | yes: nested, inits of several ranks in one thread, collectives of several communicators, sends and receives of any shape NCCL allows, run together by the library's `Group` (`group.rs`, `p2p.rs`) |
//! | `ncclAllReduce`, `ncclAllGather`, `ncclReduceScatter`, `ncclBroadcast`, `ncclBcast`, `ncclReduce`, `ncclGather`, `ncclScatter`, `ncclAlltoAll` (+ `ncclAllToAll`), their `…Config` forms, `ncclSend`, `ncclRecv` | yes, through the library's `Collectives` and `Group` (`collectives.rs`, `p2p.rs`), for all 12 types (`ncclInt8` … `ncclFloat8e5m2`: `abi::data_type`) and `ncclSum`, `ncclProd`, `ncclMin`, `ncclMax`, `ncclAvg` (`abi::reduce_op`) and pre-multiplied sums (`registration::reduce_op`); any count (0 too), in place, root-only buffers null elsewhere |
//! | `ncclCommSplit` | yes: the library's `Communicator::split` (colors, keys, `NCCL_SPLIT_NOCOLOR`; inside a group at `ncclGroupEnd`) (`init.rs`) |
//! | `ncclMemAlloc` / `ncclMemFree`, `ncclCommRegister` / `Deregister`, `ncclCommWindowRegister` / `Deregister`, `ncclWinGetUserPtr`, `ncclRedOpCreatePreMulSum` / `ncclRedOpDestroy` | yes (`registration.rs`; registrations and windows are the library's `register_buffer` / `register_window`, exchanged with the peers once; a pre-multiplied sum belongs to its communicator and its data type, a host scalar is copied at creation, a device one read by each call) |
//! | `ncclParamDumpAll` | logs the `MSCCLPP_*` settings that stand for NCCL's parameters |
//!
//! ## Exported but not implemented (`stubs.rs`)
//!
//! Each returns `ncclInvalidUsage` (those that return no code: an empty value) and sets the
//! last error to why:
//!
//! | symbols | why |
//! |---|---|
//! | `ncclCommQueryProperties`, `ncclDevCommCreate`, `ncclDevCommDestroy`, `ncclGetLsaMultimemDevicePointer`, `ncclGetMultimemDevicePointer`, `ncclGetLsaDevicePointer`, `ncclGetPeerDevicePointer`, `ncclGetMultimemDeviceLeInfo`, `ncclGetCftDeviceLeInfo`, `ncclGetPeerDeviceLeInfo`, `ncclTeamWorld`, `ncclTeamLsa`, `ncclTeamCft`, `ncclTeamCftMultimem`, `ncclTeamRail`, `ncclTeamRankToWorld`, `ncclTeamRankToLsa`, `ncclLsaBarrierCreateRequirement`, `ncclGinBarrierCreateRequirement`, `ncclCftBarrierCreateRequirement`, `ncclLLA2ACalcSlots`, `ncclLLA2ACreateRequirement`, `ncclGinOutboxCreateRequirement`, `ncclGinInboxA2ACreateRequirement`, `ncclPutSignal`, `ncclSignal`, `ncclWaitSignal` | NCCL's device-side API and one-sided operations: mscclpp-rs kernels use its own channels |
//! | `ncclCommGrow`, `ncclCommGetUniqueId`, `ncclCommShrink`, `ncclCommRevoke` | communicators do not change size or get revoked: make a new one |
//! | `ncclCommSuspend`, `ncclCommResume` | memory is not released and re-acquired |
//! | `ncclCommMemStats` | no per-communicator memory statistics |
//! | `ncclSetEncryption` | the bootstrap's sockets are not encrypted |
//! | `ncclParamBind`, `ncclParamGet`, `ncclParamGetI8` … `ncclParamGetU64`, `ncclParamGetStr`, `ncclParamGetParameter`, `ncclParamGetAllParameterKeys` | NCCL's parameters do not exist; `MSCCLPP_*` variables do |
//! | `ncclGroupSimulateEnd` | no performance model (the group is closed, nothing runs) |
//! | `ncclResetDebugInit`, `ncclResetDebugInitInternal` | logging is set up once per process |
//!
//! (every one with its `pnccl` alias but `ncclResetDebugInitInternal`, which NVIDIA exports
//! alone.)
//!
//! ## Backends
//! On the CUDA backend a communicator uses the calling thread's current device through its
//! primary context (as PyTorch does) and queues on the caller's stream, so calls are
//! asynchronous and can be captured in CUDA graphs. On the CPU backend (no GPU; CI) there is
//! no CUDA runtime: the stream argument is not used and each call (each group) is complete
//! when it returns (`comm.rs`).
#![deny(unsafe_op_in_unsafe_fn)]

pub mod abi;
mod collectives;
mod comm;
pub mod error;
mod executor;
mod exports;
mod group;
mod init;
mod log;
mod p2p;
mod registration;
mod stubs;

pub use executor::*;
pub use exports::*;
pub use stubs::*;
