//! MSCCL++ execution plans from C (`include/mscclpp_executor.h`): `mscclpp::executor` over an
//! `ncclComm_t` of this library.
//!
//! ```c
//! mscclppExecutionPlan_t plan;  mscclppExecutor_t exec;
//! mscclppExecutionPlanCreate(&plan, "allreduce.json");        // parsed and verified
//! mscclppExecutorCreate(&exec, comm);                          // every rank
//! mscclppExecutorExecute(exec, plan, sendbuff, bytes, recvbuff, bytes, ncclFloat16,
//!                        MSCCLPP_PACKET_LL16, stream);         // queued on the stream
//! mscclppExecutorDestroy(exec);  mscclppExecutionPlanDestroy(plan);
//! ```
//!
//! Handles are opaque numbers from a table of live objects, never addresses: a stale,
//! destroyed or forged handle is `ncclInvalidArgument`, not a dereference. A plan may be
//! used by any executor; an executor keeps its communicator alive until it is destroyed.
//! Calls inside an `ncclGroupStart` / `ncclGroupEnd` are refused (`ncclInvalidUsage`): the
//! first call with new buffers sets them up with the peers at once. On the CPU backend a call
//! is complete when it returns, as every call of this library there.

#![allow(non_camel_case_types)]

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use mscclpp::executor::{ExecutionPlan, Executor, PacketType, Races};
use mscclpp::shared::DevicePtr;

use crate::abi::ncclResult_t;
use crate::args::data_type;
use crate::comm::Comm;
use crate::error::{NcclError, api};
use crate::group;
use crate::sync::lock;

/// `mscclppExecutionPlan_t`.
pub type mscclppExecutionPlan_t = *mut c_void;
/// `mscclppExecutor_t`.
pub type mscclppExecutor_t = *mut c_void;

/// `MSCCLPP_PACKET_LL16`.
pub const MSCCLPP_PACKET_LL16: c_int = 0;
/// `MSCCLPP_PACKET_LL8`.
pub const MSCCLPP_PACKET_LL8: c_int = 1;

/// A live executor and the communicator it runs on.
struct ExecutorEntry {
    comm: Arc<Comm>,
    executor: Executor,
}

/// The live plans and executors, by handle (a counter: handles are never reused).
static NEXT: AtomicUsize = AtomicUsize::new(1);
#[allow(clippy::type_complexity)]
static PLANS: Mutex<Option<HashMap<usize, Arc<ExecutionPlan>>>> = Mutex::new(None);
#[allow(clippy::type_complexity)]
static EXECUTORS: Mutex<Option<HashMap<usize, Arc<ExecutorEntry>>>> = Mutex::new(None);

fn new_handle() -> usize {
    // Multiples of 16, so a handle never looks like a small integer passed by mistake.
    NEXT.fetch_add(1, Ordering::Relaxed) << 4
}

/// The entry of handle `h` in `table` (`what` names the kind of handle in the error).
fn lookup<T>(
    table: &Mutex<Option<HashMap<usize, Arc<T>>>>,
    h: usize,
    what: &'static str,
) -> Result<Arc<T>, NcclError> {
    lock(table)
        .as_ref()
        .and_then(|m| m.get(&h).cloned())
        .ok_or(NcclError::UnknownHandle { what, ptr: h })
}

fn plan_of(h: mscclppExecutionPlan_t) -> Result<Arc<ExecutionPlan>, NcclError> {
    lookup(&PLANS, h as usize, "execution plan")
}

fn executor_of(h: mscclppExecutor_t) -> Result<Arc<ExecutorEntry>, NcclError> {
    lookup(&EXECUTORS, h as usize, "executor")
}

/// Refuses a call inside an NCCL group.
fn not_in_group(what: &'static str) -> Result<(), NcclError> {
    if group::in_group() {
        return Err(NcclError::ConfigRefused {
            what,
            reason: "not inside ncclGroupStart / ncclGroupEnd (it sets up with the peers at once)",
        });
    }
    Ok(())
}

/// `mscclppExecutionPlanCreate`: reads, parses and verifies the plan in the file `path`.
///
/// # Safety
/// `plan` is valid for one write; `path` is a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppExecutionPlanCreate(
    plan: *mut mscclppExecutionPlan_t,
    path: *const c_char,
) -> ncclResult_t {
    api("mscclppExecutionPlanCreate", || {
        if plan.is_null() {
            return Err(NcclError::Null { what: "plan" });
        }
        if path.is_null() {
            return Err(NcclError::Null { what: "path" });
        }
        // SAFETY: the caller's contract: a NUL-terminated string.
        let path = unsafe { CStr::from_ptr(path) }
            .to_string_lossy()
            .into_owned();
        let p = ExecutionPlan::load_with(&path, Races::Refuse)
            .map_err(NcclError::library("loading an execution plan"))?;
        let h = new_handle();
        lock(&PLANS)
            .get_or_insert_with(HashMap::new)
            .insert(h, Arc::new(p));
        // SAFETY: checked non-null; the caller's contract.
        unsafe { plan.write(h as mscclppExecutionPlan_t) };
        Ok(ncclResult_t::ncclSuccess)
    })
}

/// `mscclppExecutionPlanDestroy`.
///
/// # Safety
/// None beyond passing a handle (any value is checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppExecutionPlanDestroy(plan: mscclppExecutionPlan_t) -> ncclResult_t {
    api("mscclppExecutionPlanDestroy", || {
        lock(&PLANS)
            .as_mut()
            .and_then(|m| m.remove(&(plan as usize)))
            .map(|_| ncclResult_t::ncclSuccess)
            .ok_or(NcclError::UnknownHandle {
                what: "execution plan",
                ptr: plan as usize,
            })
    })
}

/// `mscclppExecutorCreate`: an executor on the ready communicator `comm`.
///
/// # Safety
/// `executor` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppExecutorCreate(
    executor: *mut mscclppExecutor_t,
    comm: *mut c_void,
) -> ncclResult_t {
    api("mscclppExecutorCreate", || {
        if executor.is_null() {
            return Err(NcclError::Null { what: "executor" });
        }
        let c = crate::collectives::check(comm)?;
        let e = Executor::new(c.coll.communicator().clone())
            .map_err(NcclError::library("creating an executor"))?;
        let h = new_handle();
        lock(&EXECUTORS).get_or_insert_with(HashMap::new).insert(
            h,
            Arc::new(ExecutorEntry {
                comm: c,
                executor: e,
            }),
        );
        // SAFETY: checked non-null; the caller's contract.
        unsafe { executor.write(h as mscclppExecutor_t) };
        Ok(ncclResult_t::ncclSuccess)
    })
}

/// `mscclppExecutorDestroy`: waits for the work queued with its communicator (as
/// `ncclCommFinalize` would), then releases the executor's resources.
///
/// # Safety
/// None beyond passing a handle (any value is checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mscclppExecutorDestroy(executor: mscclppExecutor_t) -> ncclResult_t {
    api("mscclppExecutorDestroy", || {
        let e = lock(&EXECUTORS)
            .as_mut()
            .and_then(|m| m.remove(&(executor as usize)))
            .ok_or(NcclError::UnknownHandle {
                what: "executor",
                ptr: executor as usize,
            })?;
        e.comm.flush()?;
        drop(e);
        Ok(ncclResult_t::ncclSuccess)
    })
}

/// `mscclppExecutorExecute`: queues one launch of `plan` on `stream`: `send_bytes` at
/// `sendbuff` and `recv_bytes` at `recvbuff` (equal for an in-place all-reduce, the output at
/// NCCL's in-place offset otherwise), elements of `datatype`, LL packets of `packet_type`
/// (`MSCCLPP_PACKET_LL16` or `MSCCLPP_PACKET_LL8`). Every rank makes the same calls in the
/// same order; the first with new buffers or sizes sets them up with the peers.
///
/// # Safety
/// The buffers are device memory of the communicator's device, valid for their sizes until
/// the work completes, and registered with the peers for the executor's lifetime after the
/// first call that uses them (keep them allocated, or destroy the executor first).
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn mscclppExecutorExecute(
    executor: mscclppExecutor_t,
    plan: mscclppExecutionPlan_t,
    sendbuff: *const c_void,
    send_bytes: usize,
    recvbuff: *mut c_void,
    recv_bytes: usize,
    datatype: c_int,
    packet_type: c_int,
    stream: *mut c_void,
) -> ncclResult_t {
    api("mscclppExecutorExecute", || {
        not_in_group("mscclppExecutorExecute")?;
        let e = executor_of(executor)?;
        let p = plan_of(plan)?;
        e.comm.check_usable()?;
        let dt = data_type(datatype)?;
        let packet = match packet_type {
            MSCCLPP_PACKET_LL16 => PacketType::LL16,
            MSCCLPP_PACKET_LL8 => PacketType::LL8,
            v => {
                return Err(NcclError::OutOfRange {
                    what: "packet_type",
                    value: v as i64,
                    expected: "MSCCLPP_PACKET_LL16 (0) or MSCCLPP_PACKET_LL8 (1)".into(),
                });
            }
        };
        let s = e.comm.stream(stream)?;
        let _relaxed = e.comm.relaxed_capture()?;
        // SAFETY: the caller's contract (function docs).
        unsafe {
            e.executor.execute(
                e.comm.rank,
                DevicePtr::from_addr(sendbuff as u64),
                send_bytes as u64,
                DevicePtr::from_addr(recvbuff as u64),
                recv_bytes as u64,
                dt,
                &p,
                &s,
                packet,
            )
        }
        .map_err(NcclError::library("running an execution plan"))?;
        drop(s);
        e.comm.complete()?;
        Ok(ncclResult_t::ncclSuccess)
    })
}
