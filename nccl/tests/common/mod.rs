//! What the tests of the C API share: the library loaded with `dlopen` and its symbols as
//! typed function pointers ([`Nccl`]), each scenario in a child process of its own
//! ([`isolated`]) or a world of them ([`spawn_world`]), both over the workspace's test harness
//! (`mscclpp-test-support`), ranks as threads ([`ranks`]), and test data ([`data`]).
//!
//! Every scenario runs on the CPU backend (`MSCCLPP_BACKEND=cpu`, set for the child), where a
//! device pointer is a host address the test reads and writes directly; the GPU runs of the C
//! API are the scripts under `nccl/tests/python/`. Networking is loopback only
//! (`MSCCLPP_SOCKET_IFNAME=lo`).

#![allow(dead_code)]

pub mod buf;
pub mod data;
pub mod ffi;
pub mod suite;

use std::ffi::{CStr, OsString, c_int, c_void};
use std::time::Duration;

pub use mscclpp_test_support::{self as harness, Child, TestProcess};

pub use ffi::{UniqueId, nccl};

/// `ncclSuccess` … `ncclTimeout`.
pub const SUCCESS: c_int = 0;
pub const INTERNAL: c_int = 3;
pub const INVALID_ARGUMENT: c_int = 4;
pub const INVALID_USAGE: c_int = 5;
pub const REMOTE: c_int = 6;
pub const IN_PROGRESS: c_int = 7;

/// `ncclDataType_t` / `ncclRedOp_t` values.
pub const INT8: c_int = 0;
pub const INT32: c_int = 2;
pub const UINT32: c_int = 3;
pub const INT64: c_int = 4;
pub const FLOAT16: c_int = 6;
pub const FLOAT32: c_int = 7;
pub const FLOAT64: c_int = 8;
pub const BFLOAT16: c_int = 9;
pub const SUM: c_int = 0;
pub const PROD: c_int = 1;
pub const MAX: c_int = 2;
pub const MIN: c_int = 3;
pub const AVG: c_int = 4;

/// Whether this process is the child running `test` ([`spawn_test`], [`isolated`]).
pub fn is_child(test: &str) -> bool {
    harness::in_isolated(test)
}

/// The caller's variables no child of these tests gets.
const REMOVED: [&str; 2] = ["NCCL_DEBUG", "MSCCLPP_LOG"];

/// What every child of these tests gets: the CPU backend, loopback, the library under test.
fn child_env() -> [(&'static str, OsString); 3] {
    [
        ("MSCCLPP_BACKEND", "cpu".into()),
        ("MSCCLPP_SOCKET_IFNAME", "lo".into()),
        ("MSCCLPP_NCCL_LIB", ffi::lib_path().into()),
    ]
}

fn configure(mut p: TestProcess) -> TestProcess {
    for k in REMOVED {
        p = p.env_remove(k);
    }
    p.envs(child_env())
}

/// Runs `body` in a fresh child process of this test binary (so each scenario has the
/// library's process-wide state to itself, and a hung scenario is killed after `limit`): the
/// test named `test` calls `isolated(test, …)`, which in the parent spawns the child (with
/// `env`) and checks that it succeeded, and in the child runs `body`.
pub fn isolated(test: &str, limit: Duration, env: &[(&str, &str)], body: impl FnOnce()) {
    harness::isolated(
        test,
        limit,
        |p| configure(p).envs(env.iter().copied()),
        body,
    )
}

/// Spawns this test binary running `test` as a child ([`is_child`] holds in it), with `env`.
pub fn spawn_test(test: &str, env: &[(&str, &str)]) -> Child {
    configure(TestProcess::isolated(test))
        .envs(env.iter().copied())
        .spawn()
}

/// Starts `n` ranks of `test` as child processes ([`harness::Processes`]): in each,
/// `harness::child_place()` gives its rank, and rank 0 announces the NCCL unique id.
pub fn spawn_world(test: &str, n: usize) -> Vec<Child> {
    let mut w = harness::Processes::new(test, n);
    for k in REMOVED {
        w = w.env_remove(k);
    }
    for (k, v) in child_env() {
        w = w.env(k, v);
    }
    w.spawn()
}

/// The library's last error text.
pub fn last_error() -> String {
    let p = unsafe { (nccl().get_last_error)(std::ptr::null_mut()) };
    assert!(!p.is_null(), "ncclGetLastError returned null");
    // SAFETY: the library returns a NUL-terminated string.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Asserts `ncclSuccess`, else panics with the code and the last error.
#[track_caller]
pub fn ok(r: c_int, what: &str) {
    assert_eq!(r, SUCCESS, "{what}: code {r}: {}", last_error());
}

/// Asserts `code`, and that the last error mentions every one of `words`.
#[track_caller]
pub fn fails(r: c_int, code: c_int, words: &[&str], what: &str) {
    let text = last_error();
    assert_eq!(r, code, "{what}: expected code {code}, got {r} ({text})");
    for w in words {
        assert!(
            text.contains(w),
            "{what}: the last error {text:?} does not say {w:?}"
        );
    }
}

/// A new unique id (this process serves its root).
pub fn unique_id() -> UniqueId {
    let mut id = UniqueId([0; 128]);
    ok(
        unsafe { (nccl().get_unique_id)(&mut id) },
        "ncclGetUniqueId",
    );
    id
}

/// Initialises rank `rank` of `n` of `id` (blocking).
pub fn init_rank(id: UniqueId, n: usize, rank: usize) -> *mut c_void {
    let mut c: *mut c_void = std::ptr::null_mut();
    let r = unsafe { (nccl().comm_init_rank)(&mut c, n as c_int, id, rank as c_int) };
    ok(r, &format!("ncclCommInitRank rank {rank} of {n}"));
    assert!(!c.is_null());
    c
}

/// A communicator handle that crosses threads.
#[derive(Clone, Copy, Debug)]
pub struct Comm(pub *mut c_void);
// SAFETY: a handle is an opaque value; the library serialises what it needs.
unsafe impl Send for Comm {}
// SAFETY: as above.
unsafe impl Sync for Comm {}

/// Runs `body(rank, comm)` on `n` ranks as threads of this process (one id, each thread
/// initialises its rank), then destroys every communicator; returns the bodies' results in
/// rank order.
pub fn ranks<T: Send>(n: usize, body: impl Fn(usize, Comm) -> T + Sync) -> Vec<T> {
    let id = unique_id();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let body = &body;
                s.spawn(move || {
                    let c = Comm(init_rank(id, n, r));
                    let out = body(r, c);
                    ok(unsafe { (nccl().comm_destroy)(c.0) }, "ncclCommDestroy");
                    out
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("a rank thread panicked"))
            .collect()
    })
}

/// The CPU backend's stream argument (not used there).
pub const STREAM: *mut c_void = std::ptr::null_mut();
