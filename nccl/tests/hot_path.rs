//! The hot path of an eager small call (issue 30 item 11): after warm-up, a small all-reduce,
//! all-gather, reduce-scatter, all-to-all or broadcast through the C ABI allocates nothing on
//! the heap and takes at most one lock on the calling thread, at world sizes 1 and 2 (ranks
//! as threads), on the CPU backend.
//!
//! The library is linked as a Rust library (not `dlopen`ed): its allocations then go through
//! this binary's global allocator, which counts those of a thread while the thread has
//! counting on. Locks are counted by the workspace's one lock helper
//! ([`mscclpp::host::sync::locks_taken`]), per thread.
//!
//! What is measured: the calling thread, from entering the NCCL function to its return, on a
//! stream of `mscclppCpuStreamCreate` (the call returns once queued, as on a GPU; the stream
//! is synchronized outside the window), and on the communicator's own stream (null stream:
//! the call returns once its work is done). The emulated GPU threads the CPU backend starts
//! per kernel are the device's, not the host path's, and are not counted.
//!
//! `HOT_PATH_TRACE=1` prints a backtrace for every counted allocation (to find them).
//!
//! Its own binary (`harness = false`): the counting allocator and the environment (CPU
//! backend, loopback) are the process's.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::process::ExitCode;

use mscclpp::host::sync::locks_taken;
use mscclpp_nccl as nccl;
use mscclpp_nccl::abi::ncclUniqueId;

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

/// `HOT_PATH_TRACE` is set (read once in `main`: reading it allocates).
static TRACE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn note_alloc() {
    let on = COUNTING.try_with(Cell::get).unwrap_or(false);
    if !on {
        return;
    }
    let _ = ALLOCS.try_with(|a| a.set(a.get() + 1));
    if TRACE.load(std::sync::atomic::Ordering::Relaxed) {
        // The trace itself allocates: counting is off meanwhile.
        let _ = COUNTING.try_with(|c| c.set(false));
        eprintln!(
            "allocation:\n{}",
            std::backtrace::Backtrace::force_capture()
        );
        let _ = COUNTING.try_with(|c| c.set(true));
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments; counting touches
// only thread-locals of `Cell`s (no allocation).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_alloc();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_alloc();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_alloc();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations and locks of the calling thread while `f` runs.
fn counted<T>(f: impl FnOnce() -> T) -> (T, u64, u64) {
    let (a0, l0) = (ALLOCS.with(Cell::get), locks_taken());
    COUNTING.with(|c| c.set(true));
    let out = f();
    COUNTING.with(|c| c.set(false));
    (out, ALLOCS.with(Cell::get) - a0, locks_taken() - l0)
}

const F32: c_int = 7;
const SUM: c_int = 0;
/// Elements per rank of each call (1 KiB of f32: LL's range).
const COUNT: usize = 256;
const WARM_UP: usize = 3;
const CALLS: usize = 20;
/// Most locks one call may take on the calling thread.
const MOST_LOCKS: u64 = 1;

#[derive(Clone, Copy)]
struct Ptr(*mut c_void);
// SAFETY: an opaque handle or a buffer owned by one rank's thread.
unsafe impl Send for Ptr {}
// SAFETY: as above.
unsafe impl Sync for Ptr {}

fn ok(r: nccl::abi::ncclResult_t, what: &str) -> Result<(), String> {
    if r == nccl::abi::ncclResult_t::ncclSuccess {
        Ok(())
    } else {
        Err(format!("{what}: {r:?}"))
    }
}

type Op = fn(*mut c_void, *mut c_void, Ptr, *mut c_void) -> nccl::abi::ncclResult_t;

/// The collectives measured: name, call (send, recv, comm, stream).
fn ops() -> [(&'static str, Op); 5] {
    [
        ("ncclAllReduce", |s, r, c, st| unsafe {
            nccl::ncclAllReduce(s, r, COUNT, F32, SUM, c.0, st)
        }),
        ("ncclAllGather", |s, r, c, st| unsafe {
            nccl::ncclAllGather(s, r, COUNT, F32, c.0, st)
        }),
        ("ncclReduceScatter", |s, r, c, st| unsafe {
            nccl::ncclReduceScatter(s, r, COUNT, F32, SUM, c.0, st)
        }),
        ("ncclAlltoAll", |s, r, c, st| unsafe {
            nccl::ncclAlltoAll(s, r, COUNT, F32, c.0, st)
        }),
        ("ncclBroadcast", |s, r, c, st| unsafe {
            nccl::ncclBroadcast(s, r, COUNT, F32, 0, c.0, st)
        }),
    ]
}

/// One rank: every op, on a caller's CPU stream and on the own stream; returns lines of
/// (world, rank, op, stream, allocations per call, locks per call) and failures.
fn rank(world: usize, r: usize, id: ncclUniqueId) -> Result<Vec<String>, String> {
    let mut comm: *mut c_void = std::ptr::null_mut();
    ok(
        unsafe { nccl::ncclCommInitRank(&mut comm, world as c_int, id, r as c_int) },
        "ncclCommInitRank",
    )?;
    let comm = Ptr(comm);
    let mut stream: *mut c_void = std::ptr::null_mut();
    ok(
        unsafe { nccl::mscclppCpuStreamCreate(&mut stream) },
        "mscclppCpuStreamCreate",
    )?;
    // Buffers big enough for every op: world * COUNT elements each way.
    let mut send = vec![1.0f32; world * COUNT];
    let mut recv = vec![0.0f32; world * COUNT];
    let (s, d) = (
        send.as_mut_ptr().cast::<c_void>(),
        recv.as_mut_ptr().cast::<c_void>(),
    );
    let mut lines = Vec::new();
    let mut failures = Vec::new();
    for (name, op) in ops() {
        for (label, st) in [
            ("caller-stream", stream),
            ("own-stream", std::ptr::null_mut()),
        ] {
            for _ in 0..WARM_UP {
                ok(op(s, d, comm, st), name)?;
                ok(unsafe { nccl::mscclppCpuStreamSynchronize(stream) }, "sync")?;
            }
            let (mut allocs, mut locks) = (0, 0);
            for _ in 0..CALLS {
                let (res, a, l) = counted(|| op(s, d, comm, st));
                ok(res, name)?;
                ok(unsafe { nccl::mscclppCpuStreamSynchronize(stream) }, "sync")?;
                allocs += a;
                locks = locks.max(l);
            }
            lines.push(format!(
                "world {world} rank {r} {name:18} {label:13}: {allocs} allocations in {CALLS} calls, at most {locks} lock(s) per call"
            ));
            if allocs != 0 {
                failures.push(format!(
                    "world {world} rank {r} {name} ({label}): {allocs} allocations in {CALLS} calls"
                ));
            }
            if locks > MOST_LOCKS {
                failures.push(format!(
                    "world {world} rank {r} {name} ({label}): {locks} locks in one call (at most {MOST_LOCKS})"
                ));
            }
        }
    }
    ok(
        unsafe { nccl::mscclppCpuStreamDestroy(stream) },
        "mscclppCpuStreamDestroy",
    )?;
    ok(unsafe { nccl::ncclCommDestroy(comm.0) }, "ncclCommDestroy")?;
    for l in &lines {
        println!("{l}");
    }
    if failures.is_empty() {
        Ok(lines)
    } else {
        Err(failures.join("\n"))
    }
}

fn world(n: usize) -> Result<(), String> {
    let mut id = ncclUniqueId {
        internal: [0; nccl::abi::NCCL_UNIQUE_ID_BYTES],
    };
    ok(unsafe { nccl::ncclGetUniqueId(&mut id) }, "ncclGetUniqueId")?;
    let results: Vec<Result<Vec<String>, String>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..n).map(|r| sc.spawn(move || rank(n, r, id))).collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or(Err("a rank thread panicked".into())))
            .collect()
    });
    let errs: Vec<String> = results.into_iter().filter_map(Result::err).collect();
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs.join("\n"))
    }
}

fn main() -> ExitCode {
    // SAFETY: set before any other thread of this process exists.
    unsafe {
        std::env::set_var("MSCCLPP_BACKEND", "cpu");
        std::env::set_var("MSCCLPP_SOCKET_IFNAME", "lo");
    }
    TRACE.store(
        std::env::var_os("HOT_PATH_TRACE").is_some(),
        std::sync::atomic::Ordering::Relaxed,
    );
    let mut failed = false;
    for n in [1, 2] {
        if let Err(e) = world(n) {
            eprintln!("FAILED at world size {n}:\n{e}");
            failed = true;
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        println!("hot path: no allocation, at most {MOST_LOCKS} lock per call");
        ExitCode::SUCCESS
    }
}
