//! The executor's C API (`include/mscclpp_executor.h`) through the library's C symbols
//! (`dlopen`), by two ranks as threads of one process on the CPU backend: a plan of the
//! repository run in place and checked element by element, twice (the second call reuses the
//! set-up), and every refusal with its code and text: a malformed plan file, an unknown or
//! destroyed handle, a bad packet type or data type, a call out of place of an in-place plan,
//! a call inside a group.

mod common;

use std::ffi::{CString, c_int, c_void};
use std::sync::Barrier;
use std::time::Duration;

use common::buf::Buf;
use common::ffi::symbol;
use common::*;

const LIMIT: Duration = Duration::from_secs(300);

type PlanCreate = unsafe extern "C" fn(*mut *mut c_void, *const std::ffi::c_char) -> c_int;
type Destroy = unsafe extern "C" fn(*mut c_void) -> c_int;
type ExecutorCreate = unsafe extern "C" fn(*mut *mut c_void, *mut c_void) -> c_int;
type Execute = unsafe extern "C" fn(
    *mut c_void,
    *mut c_void,
    *const c_void,
    usize,
    *mut c_void,
    usize,
    c_int,
    c_int,
    *mut c_void,
) -> c_int;

/// The executor's symbols.
struct Api {
    plan_create: PlanCreate,
    plan_destroy: Destroy,
    executor_create: ExecutorCreate,
    executor_destroy: Destroy,
    execute: Execute,
}

fn api() -> Api {
    let h = nccl().handle as *mut c_void;
    // SAFETY: each symbol is the function of its prototype in mscclpp_executor.h.
    unsafe {
        Api {
            plan_create: std::mem::transmute::<*mut c_void, PlanCreate>(symbol(
                h,
                "mscclppExecutionPlanCreate",
            )),
            plan_destroy: std::mem::transmute::<*mut c_void, Destroy>(symbol(
                h,
                "mscclppExecutionPlanDestroy",
            )),
            executor_create: std::mem::transmute::<*mut c_void, ExecutorCreate>(symbol(
                h,
                "mscclppExecutorCreate",
            )),
            executor_destroy: std::mem::transmute::<*mut c_void, Destroy>(symbol(
                h,
                "mscclppExecutorDestroy",
            )),
            execute: std::mem::transmute::<*mut c_void, Execute>(symbol(
                h,
                "mscclppExecutorExecute",
            )),
        }
    }
}

const LL16: c_int = 0;

/// Element `i` of rank `r`'s f32 input in call `k`: a small integer (sums stay exact).
fn value(r: usize, k: usize, i: usize) -> f32 {
    (((i * 7 + r * 13 + k * 5) % 23) as f32) - 11.0
}

/// Taken by a rank while it makes a local refusal and reads its text (the last error is the
/// newest of the process, and the two ranks are threads of one process).
static LOCAL_REFUSALS: std::sync::Mutex<()> = std::sync::Mutex::new(());
#[test]
fn a_plan_runs_through_the_c_api_and_bad_calls_are_refused() {
    isolated(
        "a_plan_runs_through_the_c_api_and_bad_calls_are_refused",
        LIMIT,
        &[],
        || {
            let dir = std::env::temp_dir().join(format!("mscclpp-exec-c-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let doc = mscclpp::executor::plans::allreduce_read(
                2,
                mscclpp::executor::plan::ReduceKind::Sum,
            );
            let good = dir.join("allreduce_read.json");
            std::fs::write(&good, doc.to_json().to_string()).unwrap();
            let bad = dir.join("bad.json");
            std::fs::write(&bad, r#"{"name": "x", "gpus": 3}"#).unwrap();
            let a = api();
            let cpath = |p: &std::path::Path| CString::new(p.to_str().unwrap()).unwrap();

            // Plans: a malformed one is refused with its field; a good one loads.
            let mut plan = std::ptr::null_mut();
            fails(
                unsafe { (a.plan_create)(&mut plan, cpath(&bad).as_ptr()) },
                INVALID_USAGE,
                &["protocol", "missing"],
                "a malformed plan",
            );
            ok(
                unsafe { (a.plan_create)(&mut plan, cpath(&good).as_ptr()) },
                "mscclppExecutionPlanCreate",
            );
            let forged_h = 0x1234usize;
            let barrier = Barrier::new(2);
            let plan_h = plan as usize;

            ranks(2, |r, c| {
                let plan = plan_h as *mut c_void;
                let forged = forged_h as *mut c_void;
                let mut exec = std::ptr::null_mut();
                ok(
                    unsafe { (a.executor_create)(&mut exec, c.0) },
                    "mscclppExecutorCreate",
                );
                let elems = 512usize;
                let bytes = elems * 4;
                for k in 0..2 {
                    let data: Vec<u8> = (0..elems)
                        .flat_map(|i| value(r, k, i).to_le_bytes())
                        .collect();
                    let buf = Buf::new(&data, true);
                    ok(
                        unsafe {
                            (a.execute)(
                                exec,
                                plan,
                                buf.ptr(),
                                bytes,
                                buf.ptr(),
                                bytes,
                                FLOAT32,
                                LL16,
                                STREAM,
                            )
                        },
                        "mscclppExecutorExecute",
                    );
                    let got = buf.read();
                    for i in 0..elems {
                        let g = f32::from_le_bytes(got[4 * i..4 * i + 4].try_into().unwrap());
                        let want = value(0, k, i) + value(1, k, i);
                        assert_eq!(g, want, "rank {r}, call {k}, element {i}");
                    }
                    // Every rank done with the peer's buffer before it is freed.
                    barrier.wait();
                }
                let buf = Buf::new(&vec![0u8; bytes], true);
                let other = Buf::new(&vec![0u8; bytes], true);
                let x = |exec, plan, dt, packet, out: *mut c_void| unsafe {
                    (a.execute)(exec, plan, buf.ptr(), bytes, out, bytes, dt, packet, STREAM)
                };
                // The refusals below are local and read `ncclGetLastError`, the newest error of
                // the process: one rank at a time, so the other's refusal is not the newest.
                let one_at_a_time = LOCAL_REFUSALS.lock().unwrap_or_else(|e| e.into_inner());
                fails(
                    x(forged, plan, FLOAT32, LL16, buf.ptr()),
                    INVALID_ARGUMENT,
                    &["executor", "not live"],
                    "a forged executor",
                );
                fails(
                    x(exec, forged, FLOAT32, LL16, buf.ptr()),
                    INVALID_ARGUMENT,
                    &["execution plan", "not live"],
                    "a forged plan",
                );
                fails(
                    x(exec, plan, FLOAT32, 7, buf.ptr()),
                    INVALID_ARGUMENT,
                    &["packet_type"],
                    "a bad packet type",
                );
                fails(
                    x(exec, plan, 99, LL16, buf.ptr()),
                    INVALID_ARGUMENT,
                    &["data type"],
                    "a bad data type",
                );
                drop(one_at_a_time);
                // Both ranks make the same wrong call: both refuse it (they agree first).
                fails(
                    x(exec, plan, FLOAT32, LL16, other.ptr()),
                    INVALID_USAGE,
                    &["runs in place"],
                    "an in-place plan called out of place",
                );
                ok(unsafe { (nccl().group_start)() }, "ncclGroupStart");
                fails(
                    x(exec, plan, FLOAT32, LL16, buf.ptr()),
                    INVALID_USAGE,
                    &["ncclGroupStart"],
                    "inside a group",
                );
                ok(unsafe { (nccl().group_end)() }, "ncclGroupEnd");
                barrier.wait();
                ok(
                    unsafe { (a.executor_destroy)(exec) },
                    "mscclppExecutorDestroy",
                );
                fails(
                    unsafe { (a.executor_destroy)(exec) },
                    INVALID_ARGUMENT,
                    &["not live"],
                    "a destroyed executor",
                );
            });
            ok(
                unsafe { (a.plan_destroy)(plan) },
                "mscclppExecutionPlanDestroy",
            );
            fails(
                unsafe { (a.plan_destroy)(plan) },
                INVALID_ARGUMENT,
                &["not live"],
                "a destroyed plan",
            );
            let _ = std::fs::remove_dir_all(&dir);
        },
    );
}
