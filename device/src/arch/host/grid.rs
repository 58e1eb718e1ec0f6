//! The grid emulator: runs a kernel compiled for the host on OS threads, one per GPU thread.
//!
//! Every block of the grid runs at once (kernels may wait on each other across blocks, as a
//! persistent GPU kernel can). Each thread sees its own `thread_idx`/`block_idx` through a
//! thread-local; `sync_threads` is a barrier over the threads of one block; each block owns a
//! zeroed dynamic shared-memory region of the size given at launch.
//!
//! A thread that panics (a device `trap`) poisons its block's barrier so that its siblings stop
//! at their next `sync_threads` instead of waiting forever; `run_grid` then reports the panic.
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

/// A block barrier that a panicking thread can poison (std's `Barrier` cannot be).
struct BlockBarrier {
    state: Mutex<BarrierState>,
    cv: Condvar,
    count: u32,
}

struct BarrierState {
    arrived: u32,
    generation: u64,
    poisoned: bool,
}

impl BlockBarrier {
    fn new(count: u32) -> Self {
        Self {
            state: Mutex::new(BarrierState {
                arrived: 0,
                generation: 0,
                poisoned: false,
            }),
            cv: Condvar::new(),
            count,
        }
    }

    fn wait(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.poisoned {
            drop(s);
            panic!("a sibling thread of this block trapped");
        }
        s.arrived += 1;
        if s.arrived == self.count {
            s.arrived = 0;
            s.generation += 1;
            self.cv.notify_all();
            return;
        }
        let generation = s.generation;
        while s.generation == generation && !s.poisoned {
            s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        if s.generation == generation {
            drop(s);
            panic!("a sibling thread of this block trapped");
        }
    }

    fn poison(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.poisoned = true;
        self.cv.notify_all();
    }
}

struct BlockCtx {
    barrier: BlockBarrier,
    smem: Box<[u128]>,
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

/// Barrier over the threads of this block (no-op outside the emulator).
pub fn sync_threads() {
    let c = ctx();
    if !c.block.is_null() {
        // SAFETY: `block` points into `run_grid`'s `blocks`, alive until every thread joined.
        unsafe { &*c.block }.barrier.wait();
    }
}

/// This block's dynamic shared memory (null outside the emulator or when none was requested).
pub fn dynamic_shared_mem() -> *mut u8 {
    let c = ctx();
    if c.block.is_null() {
        return core::ptr::null_mut();
    }
    // SAFETY: as in `sync_threads`. Threads of a block share the region as GPU threads do;
    // concurrent access follows the kernel's own barrier discipline.
    let smem = unsafe { &(*c.block).smem };
    if smem.is_empty() {
        core::ptr::null_mut()
    } else {
        smem.as_ptr() as *mut u8
    }
}

/// Nanoseconds since an arbitrary fixed point (the first call).
pub fn monotonic_ns() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
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
    let blocks: Vec<BlockCtx> = (0..dims.grid)
        .map(|_| BlockCtx {
            barrier: BlockBarrier::new(dims.block),
            smem: std::vec![0u128; words].into_boxed_slice(),
        })
        .collect();
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
                            unsafe { &*block.0 }.barrier.poison();
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
                        blk.barrier.poison();
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
