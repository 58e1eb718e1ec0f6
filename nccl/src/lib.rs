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
//! A thin skin: no logic of its own beyond NCCL's argument mapping, groups and error codes.
//! Every collective and send/receive becomes the library's call descriptor
//! (`mscclpp::collectives::Call`), checked by the library (byte counts, buffers: the one
//! place that decides them) and queued straight on it (`Collectives::queue`) outside a group,
//! or recorded for `ncclGroupEnd` inside one. A new NCCL function is its export
//! (`exports.rs`), its check in the module of its concern, and its line in the ABI test.
//!
//! One module per concern, lowest layer first; a module imports only modules of lower layers
//! (`tests/import_layers.rs` of the root crate reads this table):
//!
//! | layer | modules | concern |
//! |---|---|---|
//! | 0 | `abi`, `backend`, `sync` | NCCL's C types and values (plain declarations); the process's backend, chosen once, and the guard that gives a caller back its CUDA context; the poison-tolerant lock |
//! | 1 | `log` | the `NCCL_DEBUG` / `MSCCLPP_LOG` subscriber and the banner |
//! | 2 | `error` | errors, their NCCL codes, `ncclGetLastError`, the panic guard |
//! | 3 | `args` | NCCL's types, operators, ranks, buffers and versioned structs as the library's (one function each) |
//! | 4 | `registry` | what a communicator keeps of registrations, windows and pre-multiplied sums |
//! | 5 | `comm` | the handle table, communicators, devices and streams; a call checked by the library |
//! | 6 | `cpu_streams`, `registration` | the CPU backend's streams for C callers; `ncclMemAlloc`, buffer and window registration, pre-multiplied sums |
//! | 7 | `collectives`, `p2p` | the collectives' checks; sends' and receives' checks and their pairing in a group |
//! | 8 | `group` | `ncclGroupStart` / `ncclGroupEnd`, and the one path of every call |
//! | 9 | `init`, `executor` | unique ids, inits, split, finalize, destroy, abort, async errors; MSCCL++ execution plans from C (`include/mscclpp_executor.h`: `mscclppExecutionPlanCreate`, `mscclppExecutorExecute`, …) over `mscclpp::executor` |
//! | 10 | `recovery`, `one_sided` | revoke, shrink, grow and its unique id; one-sided puts, signals and waits on windows |
//! | 11 | `exports` | every implemented C symbol, one call into its module each |
//! | 12 | `stubs` | the C symbols not implemented (list below) |
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
//! | `ncclGroupStart` / `ncclGroupEnd` | yes: nested, inits of several ranks in one thread, windows of several ranks registered in one thread, collectives of several communicators (queued by the calling thread, no thread per group), sends and receives of any shape NCCL allows, run together by the library's `Group` (`group.rs`, `p2p.rs`) |
//! | `ncclAllReduce`, `ncclAllGather`, `ncclReduceScatter`, `ncclBroadcast`, `ncclBcast`, `ncclReduce`, `ncclGather`, `ncclScatter`, `ncclAlltoAll` (+ `ncclAllToAll`), their `…Config` forms, `ncclSend`, `ncclRecv` | yes, through the library's `Collectives` and `Group` (`collectives.rs`, `p2p.rs`), for all 12 types (`ncclInt8` … `ncclFloat8e5m2`: `args::data_type`) and `ncclSum`, `ncclProd`, `ncclMin`, `ncclMax`, `ncclAvg` (`args::reduce_op`) and pre-multiplied sums (`registration::reduce_op`); any count (0 too), in place, root-only buffers null elsewhere |
//! | `ncclCommSplit` | yes: the library's `Communicator::split` (colors, keys, `NCCL_SPLIT_NOCOLOR`; inside a group at `ncclGroupEnd`) (`init.rs`) |
//! | `ncclCommRevoke`, `ncclCommShrink` (`NCCL_SHRINK_DEFAULT`, `NCCL_SHRINK_ABORT`), `ncclCommGetUniqueId`, `ncclCommGrow` | yes: the library's `Collectives::revoke`, `shrink`, `grow` (`recovery.rs`) |
//! | `ncclPutSignal`, `ncclSignal`, `ncclWaitSignal` | yes: the library's `Collectives::put_signal`, `signal`, `wait_signals` on the windows of `ncclCommWindowRegister`, in stream order, bounded and abortable (`one_sided.rs`) |
//! | `ncclMemAlloc` / `ncclMemFree`, `ncclCommRegister` / `Deregister`, `ncclCommWindowRegister` / `Deregister`, `ncclWinGetUserPtr`, `ncclRedOpCreatePreMulSum` / `ncclRedOpDestroy` | yes (`registration.rs`; registrations and windows are the library's `register_buffer` / `register_window`, exchanged with the peers once; a registration is a hint: memory the library cannot share gets a handle that does nothing; a pre-multiplied sum belongs to its communicator and its data type, a host scalar is copied at creation, a device one read by each call) |
//! | `ncclParamDumpAll` | logs the `MSCCLPP_*` settings that stand for NCCL's parameters |
//!
//! ## Exported but not implemented (`stubs.rs`)
//!
//! Each returns `ncclInvalidUsage` (those that return no code: an empty value) and sets the
//! last error to why:
//!
//! | symbols | why |
//! |---|---|
//! | `ncclCommQueryProperties`, `ncclDevCommCreate`, `ncclDevCommDestroy`, `ncclGetLsaMultimemDevicePointer`, `ncclGetMultimemDevicePointer`, `ncclGetLsaDevicePointer`, `ncclGetPeerDevicePointer`, `ncclGetMultimemDeviceLeInfo`, `ncclGetCftDeviceLeInfo`, `ncclGetPeerDeviceLeInfo`, `ncclTeamWorld`, `ncclTeamLsa`, `ncclTeamCft`, `ncclTeamCftMultimem`, `ncclTeamRail`, `ncclTeamRankToWorld`, `ncclTeamRankToLsa`, `ncclLsaBarrierCreateRequirement`, `ncclGinBarrierCreateRequirement`, `ncclCftBarrierCreateRequirement`, `ncclLLA2ACalcSlots`, `ncclLLA2ACreateRequirement`, `ncclGinOutboxCreateRequirement`, `ncclGinInboxA2ACreateRequirement` | NCCL's device-side API: mscclpp-rs kernels use its own channels |
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
//! no CUDA runtime: each call (each group) runs on the communicator's own stream and is
//! complete when it returns (`comm.rs`), unless its stream is one the library made for C
//! callers, which it is queued on asynchronously (`cpu_streams.rs`; three symbols that are not
//! NCCL's, CPU backend only: `ncclResult_t mscclppCpuStreamCreate(void** stream)`,
//! `mscclppCpuStreamSynchronize(void* stream)`, `mscclppCpuStreamDestroy(void* stream)`).
#![deny(unsafe_op_in_unsafe_fn)]

pub mod abi;
mod args;
mod backend;
mod collectives;
mod comm;
mod cpu_streams;
pub mod error;
mod executor;
mod exports;
mod group;
mod init;
mod log;
mod one_sided;
mod p2p;
mod recovery;
mod registration;
mod registry;
mod stubs;
mod sync;

pub use executor::*;
pub use exports::*;
pub use stubs::*;
