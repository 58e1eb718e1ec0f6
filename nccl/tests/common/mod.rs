//! What the tests of the C API share: the library loaded with `dlopen` and its symbols as
//! typed function pointers ([`Nccl`]), each scenario in a child process of its own
//! ([`isolated`]), ranks as threads ([`ranks`]), and test data ([`data`]).
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

use std::ffi::{CStr, c_int, c_void};
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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

/// The environment variable that names the scenario a child process runs.
const CHILD: &str = "MSCCLPP_NCCL_TEST_CHILD";

/// Whether this process is the child running `test`.
pub fn is_child(test: &str) -> bool {
    std::env::var(CHILD).as_deref() == Ok(test)
}

/// Runs `body` in a fresh child process of this test binary (so each scenario has the
/// library's process-wide state to itself, and a hung scenario is killed after `limit`): the
/// test named `test` calls `isolated(test, …)`, which in the parent spawns the child and
/// checks that it succeeded, and in the child runs `body`.
pub fn isolated(test: &str, limit: Duration, env: &[(&str, &str)], body: impl FnOnce()) {
    if is_child(test) {
        body();
        return;
    }
    let out = spawn_test(test, env, &[]).wait_for(limit);
    assert!(
        out.success,
        "{test} failed in its child process:\n{}",
        out.text
    );
    eprintln!("{}", out.text);
}

/// A child process of this test binary running one test.
pub struct Child {
    child: std::process::Child,
    started: Instant,
    name: String,
}

/// What a child left.
pub struct Finished {
    /// Exit status 0.
    pub success: bool,
    /// Standard output and error.
    pub text: String,
    /// Standard output alone.
    pub stdout: String,
}

/// Spawns this test binary running `test` as a child (`CHILD` set to it; the CPU backend,
/// loopback, no `NCCL_DEBUG` / `MSCCLPP_LOG` of the caller's), with `env`.
pub fn spawn_test(test: &str, env: &[(&str, &str)], extra: &[(&str, String)]) -> Child {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut cmd = Command::new(exe);
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, test)
        .env_remove("NCCL_DEBUG")
        .env_remove("MSCCLPP_LOG")
        .env("MSCCLPP_BACKEND", "cpu")
        .env("MSCCLPP_SOCKET_IFNAME", "lo")
        .env("MSCCLPP_NCCL_LIB", ffi::lib_path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    for (k, v) in extra {
        cmd.env(k, v);
    }
    Child {
        child: cmd.spawn().expect("spawning a child test process"),
        started: Instant::now(),
        name: test.to_string(),
    }
}

impl Child {
    /// The child's id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Reads standard output up to the first line holding `prefix` (at most `limit`); returns
    /// what follows it on that line.
    pub fn read_line_with(&mut self, prefix: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        let out = self.child.stdout.as_mut().expect("piped stdout");
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        loop {
            assert!(
                Instant::now() < deadline,
                "{}: no line {prefix:?} within {limit:?}",
                self.name
            );
            match out.read(&mut byte) {
                Ok(0) => panic!(
                    "{}: ended before printing {prefix:?}: {}",
                    self.name,
                    String::from_utf8_lossy(&line)
                ),
                Ok(_) if byte[0] == b'\n' => {
                    // The test harness may have printed on the same line before it.
                    let l = String::from_utf8_lossy(&line).to_string();
                    if let Some(at) = l.find(prefix) {
                        return l[at + prefix.len()..].trim().to_string();
                    }
                    line.clear();
                }
                Ok(_) => line.push(byte[0]),
                Err(e) => panic!("{}: reading its output: {e}", self.name),
            }
        }
    }

    /// Kills the child (SIGKILL).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
    }

    /// Waits at most `limit` (from the spawn) for the child to end, killing it after; returns
    /// its status and output.
    pub fn wait_for(mut self, limit: Duration) -> Finished {
        let mut timed_out = false;
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if self.started.elapsed() > limit => {
                    let _ = self.child.kill();
                    timed_out = true;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => panic!("{}: waiting: {e}", self.name),
            }
        }
        let out = self.child.wait_with_output().expect("the child's output");
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let mut text = format!(
            "--- {} ({:?}{}) stdout:\n{stdout}--- stderr:\n{}",
            self.name,
            out.status,
            if timed_out {
                ", killed after the time limit"
            } else {
                ""
            },
            String::from_utf8_lossy(&out.stderr)
        );
        if text.len() > 60_000 {
            text = format!("{}\n…\n{}", &text[..20_000], &text[text.len() - 30_000..]);
        }
        Finished {
            success: out.status.success() && !timed_out,
            text,
            stdout,
        }
    }
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
