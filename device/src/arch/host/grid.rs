//! The grid emulator: runs a kernel compiled for the host on OS threads, one per GPU thread.
//!
//! Every block of the grid runs at once (kernels may wait on each other across blocks, as a
//! persistent GPU kernel can). Each thread sees its own `thread_idx`/`block_idx` through a
//! thread-local; `sync_threads` is a barrier over the threads of one block, and its votes
//! (`sync_threads_or`, `sync_threads_and`, `sync_threads_count`) combine one predicate per
//! thread on the way; each block owns a zeroed dynamic shared-memory region of the size given
//! at launch, and a kernel that asks for that region when the launch gave none traps with a
//! message naming the fix (on a GPU the access would fault).
//!
//! Warps are the block's threads in groups of [`WARP_SIZE`] (the last may be short): each has
//! a barrier of its own, which `sync_warp` waits at and the votes (`vote_all_sync`,
//! `vote_any_sync`) combine their lanes' predicates in. As on the GPU, every lane of the warp
//! must make the same warp calls in the same order.
//!
//! A thread that panics (a device `trap`) poisons its block's barriers so that its siblings stop
//! at their next `sync_threads` or warp call instead of waiting forever; `run_grid` then
//! reports the panic.
//! Waits on other memory (semaphores, FIFO) are bounded by `DeviceStatus` as on the GPU.

use std::boxed::Box;
use std::cell::Cell;
use std::string::{String, ToString};
use std::sync::{Condvar, Mutex};
use std::vec::Vec;

/// Launch geometry (1-D, as every kernel of the project uses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GridDims {
    /// Blocks in the grid.
    pub grid: u32,
    /// Threads per block.
    pub block: u32,
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
}

/// Why an emulated launch failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GridError {
    /// A zero dimension or more threads than the emulator will start.
    BadDims(GridDims),
    /// The OS refused a thread.
    Spawn(String),
    /// An emulated GPU thread panicked (trap, failed assertion); the message of the first one.
    Trap {
        /// Block of the first failing thread.
        block: u32,
        /// Thread index in its block.
        thread: u32,
        /// Its panic message.
        message: String,
    },
}

impl core::fmt::Display for GridError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::BadDims(d) => write!(
                f,
                "grid {}x{} (smem {}) is empty or larger than the emulator's {MAX_THREADS} threads",
                d.grid, d.block, d.shared_mem_bytes
            ),
            Self::Spawn(e) => write!(f, "could not start an emulated GPU thread: {e}"),
            Self::Trap {
                block,
                thread,
                message,
            } => write!(
                f,
                "emulated GPU thread {thread} of block {block} trapped: {message}"
            ),
        }
    }
}

impl std::error::Error for GridError {}

/// Most OS threads one emulated launch may start.
pub const MAX_THREADS: u32 = 4096;
/// Stack of each emulated GPU thread.
const THREAD_STACK: usize = 256 * 1024;

/// Lanes of an emulated warp.
pub const WARP_SIZE: u32 = 32;

/// A barrier over a block or a warp that a panicking thread can poison (std's `Barrier`
/// cannot be), and that combines one predicate per thread on the way (the warp votes).
struct BlockBarrier {
    state: Mutex<BarrierState>,
    cv: Condvar,
    count: u32,
}

struct BarrierState {
    arrived: u32,
    /// Arrivals of the current generation whose predicate was true.
    true_votes: u32,
    generation: u64,
    /// How many predicates of the last completed generation were true. A waiter reads it under
    /// the lock as soon as it wakes; the next generation cannot complete (and overwrite it)
    /// before that waiter arrives again.
    last_votes: u32,
    poisoned: bool,
}

impl BlockBarrier {
    fn new(count: u32) -> Self {
        Self {
            state: Mutex::new(BarrierState {
                arrived: 0,
                true_votes: 0,
                generation: 0,
                last_votes: 0,
                poisoned: false,
            }),
            cv: Condvar::new(),
            count,
        }
    }

    fn wait(&self) {
        self.wait_count(true);
    }

    /// Waits for every thread and returns `(all, any)` of their `pred`s.
    fn wait_vote(&self, pred: bool) -> (bool, bool) {
        let n = self.wait_count(pred);
        (n == self.count, n > 0)
    }

    /// Waits for every thread and returns on how many of them `pred` was true.
    fn wait_count(&self, pred: bool) -> u32 {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.poisoned {
            drop(s);
            panic!("a sibling thread of this block trapped");
        }
        s.arrived += 1;
        s.true_votes += pred as u32;
        if s.arrived == self.count {
            s.last_votes = s.true_votes;
            s.arrived = 0;
            s.true_votes = 0;
            s.generation += 1;
            self.cv.notify_all();
            return s.last_votes;
        }
        let generation = s.generation;
        while s.generation == generation && !s.poisoned {
            s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        if s.generation == generation {
            drop(s);
            panic!("a sibling thread of this block trapped");
        }
        s.last_votes
    }

    fn poison(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.poisoned = true;
        self.cv.notify_all();
    }
}

struct BlockCtx {
    barrier: BlockBarrier,
    /// One barrier per warp.
    warps: Box<[BlockBarrier]>,
    /// Dynamic shared memory, `smem_bytes` rounded up to whole 16-byte words.
    smem: Box<[u128]>,
    /// Dynamic shared memory the launch asked for.
    smem_bytes: u32,
}

impl BlockCtx {
    fn new(dims: GridDims, smem_words: usize) -> Self {
        let warps = dims.block.div_ceil(WARP_SIZE);
        Self {
            barrier: BlockBarrier::new(dims.block),
            warps: (0..warps)
                .map(|w| BlockBarrier::new((dims.block - w * WARP_SIZE).min(WARP_SIZE)))
                .collect(),
            smem: std::vec![0u128; smem_words].into_boxed_slice(),
            smem_bytes: dims.shared_mem_bytes,
        }
    }

    fn poison(&self) {
        self.barrier.poison();
        for w in self.warps.iter() {
            w.poison();
        }
    }
}

#[derive(Clone, Copy)]
struct ThreadCtx {
    thread_idx: u32,
    block_idx: u32,
    block_dim: u32,
    grid_dim: u32,
    block: *const BlockCtx,
}

impl ThreadCtx {
    const HOST: Self = Self {
        thread_idx: 0,
        block_idx: 0,
        block_dim: 1,
        grid_dim: 1,
        block: core::ptr::null(),
    };
}

std::thread_local! {
    static CTX: Cell<ThreadCtx> = const { Cell::new(ThreadCtx::HOST) };
}

fn ctx() -> ThreadCtx {
    CTX.with(|c| c.get())
}

/// Index of this thread in its block (0 outside the emulator).
pub fn thread_idx_x() -> u32 {
    ctx().thread_idx
}
/// Index of this block (0 outside the emulator).
pub fn block_idx_x() -> u32 {
    ctx().block_idx
}
/// Threads per block (1 outside the emulator).
pub fn block_dim_x() -> u32 {
    ctx().block_dim
}
/// Blocks in the grid (1 outside the emulator).
pub fn grid_dim_x() -> u32 {
    ctx().grid_dim
}

/// This thread's block (`None` outside the emulator).
fn block<'a>() -> Option<&'a BlockCtx> {
    let c = ctx();
    // SAFETY: `block` points into `run_grid`'s `blocks`, alive until every thread joined (the
    // thread resets its context to `HOST` before it ends).
    (!c.block.is_null()).then(|| unsafe { &*c.block })
}

/// Barrier over the threads of this block (no-op outside the emulator).
pub fn sync_threads() {
    if let Some(b) = block() {
        b.barrier.wait();
    }
}

/// [`sync_threads`] that also tells every thread whether `pred` holds on some thread of the
/// block (`pred` itself outside the emulator). Every thread of the block must call it.
pub fn sync_threads_or(pred: bool) -> bool {
    block().map_or(pred, |b| b.barrier.wait_vote(pred).1)
}

/// [`sync_threads`] that also tells every thread whether `pred` holds on every thread of the
/// block (`pred` itself outside the emulator). Every thread of the block must call it.
pub fn sync_threads_and(pred: bool) -> bool {
    block().map_or(pred, |b| b.barrier.wait_vote(pred).0)
}

/// [`sync_threads`] that also tells every thread on how many threads of the block `pred`
/// holds (`pred as u32` outside the emulator). Every thread of the block must call it.
pub fn sync_threads_count(pred: bool) -> u32 {
    block().map_or(pred as u32, |b| b.barrier.wait_count(pred))
}

/// This thread's warp barrier (`None` outside the emulator).
fn warp_barrier<'a>() -> Option<&'a BlockBarrier> {
    block()?.warps.get((thread_idx_x() / WARP_SIZE) as usize)
}

/// `bar.warp.sync` over this thread's warp (no-op outside the emulator).
pub fn sync_warp() {
    if let Some(w) = warp_barrier() {
        w.wait();
    }
}

/// Whether `pred` holds on every lane of this thread's warp (`pred` itself outside the
/// emulator). Every lane must call it.
pub fn vote_all_sync(pred: bool) -> bool {
    warp_barrier().map_or(pred, |w| w.wait_vote(pred).0)
}

/// Whether `pred` holds on some lane of this thread's warp (`pred` itself outside the
/// emulator). Every lane must call it.
pub fn vote_any_sync(pred: bool) -> bool {
    warp_barrier().map_or(pred, |w| w.wait_vote(pred).1)
}

/// The trap message of a kernel that asks for dynamic shared memory its launch did not give.
pub const NO_SHARED_MEM: &str = "the kernel uses dynamic shared memory (arch::dynamic_shared_mem) \
     but the launch gave none: launch with LaunchConfig::with_shared_mem(bytes)";

/// This block's dynamic shared memory, [`dynamic_shared_mem_size`] bytes (null outside the
/// emulator). Traps (an emulated GPU fault, reported by the launch) when the launch gave
/// none: on a GPU any access through the pointer would then be out of bounds.
pub fn dynamic_shared_mem() -> *mut u8 {
    let Some(b) = block() else {
        return core::ptr::null_mut();
    };
    // Threads of a block share the region as GPU threads do; concurrent access follows the
    // kernel's own barrier discipline.
    if b.smem_bytes == 0 {
        panic!("{NO_SHARED_MEM}");
    }
    b.smem.as_ptr() as *mut u8
}

/// Bytes of dynamic shared memory this launch gave each block (0 outside the emulator).
pub fn dynamic_shared_mem_size() -> u32 {
    block().map_or(0, |b| b.smem_bytes)
}

/// The machine's `CLOCK_MONOTONIC` in nanoseconds: one clock for every process of the machine
/// (the CPU backend's `%globaltimer`, and the host's trace clock, so that traced kernel events
/// of the CPU backend need no alignment).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` writes the `timespec` we own; CLOCK_MONOTONIC always exists on
    // Linux, so it cannot fail (a zero time would only make events line up at the start).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

struct SendPtr(*const BlockCtx);
// SAFETY: the pointee is `Sync` data (a Mutex/Condvar barrier and shared memory the kernel
// accesses under its own barrier discipline) that outlives every thread of the scope.
unsafe impl Send for SendPtr {}

/// Runs `kernel` once per emulated GPU thread of `dims` and waits for all of them.
pub fn run_grid(dims: GridDims, kernel: &(dyn Fn() + Sync)) -> Result<(), GridError> {
    let total = dims.grid as u64 * dims.block as u64;
    if dims.grid == 0 || dims.block == 0 || total > MAX_THREADS as u64 {
        return Err(GridError::BadDims(dims));
    }
    let words = (dims.shared_mem_bytes as usize).div_ceil(16);
    let blocks: Vec<BlockCtx> = (0..dims.grid).map(|_| BlockCtx::new(dims, words)).collect();
    let first_trap: Mutex<Option<GridError>> = Mutex::new(None);
    let spawn_error: Mutex<Option<GridError>> = Mutex::new(None);
    std::thread::scope(|scope| {
        'spawn: for b in 0..dims.grid {
            for t in 0..dims.block {
                let block = SendPtr(&blocks[b as usize] as *const BlockCtx);
                let first_trap = &first_trap;
                let spawned = std::thread::Builder::new()
                    .name(std::format!("gpu-b{b}-t{t}"))
                    .stack_size(THREAD_STACK)
                    .spawn_scoped(scope, move || {
                        let block = block;
                        let me = ThreadCtx {
                            thread_idx: t,
                            block_idx: b,
                            block_dim: dims.block,
                            grid_dim: dims.grid,
                            block: block.0,
                        };
                        CTX.with(|c| c.set(me));
                        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(kernel));
                        CTX.with(|c| c.set(ThreadCtx::HOST));
                        if let Err(payload) = result {
                            // SAFETY: as in `sync_threads`.
                            unsafe { &*block.0 }.poison();
                            let message = payload
                                .downcast_ref::<&str>()
                                .map(|s| s.to_string())
                                .or_else(|| payload.downcast_ref::<String>().cloned())
                                .unwrap_or_else(|| "non-string panic".to_string());
                            let mut slot = first_trap.lock().unwrap_or_else(|e| e.into_inner());
                            // A sibling stopped by the poisoned barrier is not the first cause.
                            let secondary = message.contains("sibling thread");
                            if slot.is_none() || (!secondary && is_secondary(slot.as_ref())) {
                                *slot = Some(GridError::Trap {
                                    block: b,
                                    thread: t,
                                    message,
                                });
                            }
                        }
                    });
                if let Err(e) = spawned {
                    *spawn_error.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some(GridError::Spawn(e.to_string()));
                    // Release the threads already started that would wait for the missing ones.
                    for blk in &blocks {
                        blk.poison();
                    }
                    break 'spawn;
                }
            }
        }
    });
    if let Some(e) = spawn_error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e);
    }
    match first_trap.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn is_secondary(e: Option<&GridError>) -> bool {
    matches!(e, Some(GridError::Trap { message, .. }) if message.contains("sibling thread"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// Votes combine exactly the lanes of one warp (the last warp of a block short), and many
    /// votes in a row never mix generations.
    #[test]
    fn warp_votes_combine_their_own_lanes() {
        let dims = GridDims {
            grid: 2,
            block: 40,
            shared_mem_bytes: 0,
        };
        let wrong = AtomicU32::new(0);
        run_grid(dims, &|| {
            let t = thread_idx_x();
            for round in 0..50u32 {
                // Lane 3 of warp 0 is false in odd rounds only; warp 1 (8 lanes) all true
                // in even rounds, only its lane 0 in odd ones.
                let pred = if t < WARP_SIZE {
                    !(t == 3 && round % 2 == 1)
                } else {
                    round % 2 == 0 || t == WARP_SIZE
                };
                let all = vote_all_sync(pred);
                let any = vote_any_sync(!pred);
                let want_all = round % 2 == 0;
                if all != want_all || any == want_all {
                    wrong.fetch_add(1, Ordering::Relaxed);
                }
                sync_warp();
            }
        })
        .unwrap();
        assert_eq!(wrong.load(Ordering::Relaxed), 0);
    }

    /// Block votes combine every thread of one block (not of the grid, not of a warp), give
    /// every thread the same answer, and never mix rounds.
    #[test]
    fn block_votes_combine_their_own_block() {
        let dims = GridDims {
            grid: 3,
            block: 70, // two full warps and a short one
            shared_mem_bytes: 0,
        };
        let wrong = AtomicU32::new(0);
        run_grid(dims, &|| {
            let (t, b) = (thread_idx_x(), block_idx_x());
            for round in 0..40u32 {
                // Block b: in round r, threads t with (t + r + b) % 7 == 0 hold the predicate,
                // none in rounds divisible by 5, all in rounds with r % 5 == 1.
                let pred = match round % 5 {
                    0 => false,
                    1 => true,
                    _ => (t + round + b) % 7 == 0,
                };
                let want_count = match round % 5 {
                    0 => 0,
                    1 => dims.block,
                    _ => (0..dims.block).filter(|u| (u + round + b) % 7 == 0).count() as u32,
                };
                let count = sync_threads_count(pred);
                let any = sync_threads_or(pred);
                let all = sync_threads_and(pred);
                if count != want_count
                    || any != (want_count > 0)
                    || all != (want_count == dims.block)
                {
                    wrong.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
        .unwrap();
        assert_eq!(wrong.load(Ordering::Relaxed), 0);
    }

    /// Outside a launch the votes answer for the one calling thread.
    #[test]
    fn block_votes_outside_the_emulator() {
        assert!(sync_threads_or(true) && !sync_threads_or(false));
        assert!(sync_threads_and(true) && !sync_threads_and(false));
        assert_eq!(
            (sync_threads_count(true), sync_threads_count(false)),
            (1, 0)
        );
        assert_eq!(dynamic_shared_mem_size(), 0);
        assert!(dynamic_shared_mem().is_null());
    }

    /// A kernel sees the dynamic shared memory size its launch gave; asking for the region when
    /// the launch gave none is a trap that names the fix, not a null pointer.
    #[test]
    fn dynamic_shared_memory_size_and_missing_region() {
        let seen = AtomicU32::new(u32::MAX);
        let dims = GridDims {
            grid: 2,
            block: 4,
            shared_mem_bytes: 20,
        };
        run_grid(dims, &|| {
            let p = dynamic_shared_mem();
            assert_eq!(p as usize % 16, 0);
            seen.store(dynamic_shared_mem_size(), Ordering::Relaxed);
        })
        .unwrap();
        assert_eq!(seen.load(Ordering::Relaxed), 20);

        let none = GridDims {
            shared_mem_bytes: 0,
            ..dims
        };
        let r = run_grid(none, &|| {
            seen.store(dynamic_shared_mem_size(), Ordering::Relaxed);
            sync_threads();
            // SAFETY: never reached: the call traps first.
            unsafe { (dynamic_shared_mem() as *mut u32).write_volatile(1) };
        });
        assert_eq!(seen.load(Ordering::Relaxed), 0);
        match r {
            Err(GridError::Trap { message, .. }) => assert_eq!(message, NO_SHARED_MEM),
            other => panic!("expected a trap, got {other:?}"),
        }
    }

    /// A lane that traps releases its warp siblings waiting in a vote.
    #[test]
    fn a_trap_releases_the_warp() {
        let dims = GridDims {
            grid: 1,
            block: 32,
            shared_mem_bytes: 0,
        };
        let r = run_grid(dims, &|| {
            if thread_idx_x() == 5 {
                panic!("lane 5 traps");
            }
            vote_all_sync(true);
        });
        assert!(
            matches!(&r, Err(GridError::Trap { thread: 5, .. })),
            "{r:?}"
        );
    }
}
