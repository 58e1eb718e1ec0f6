//! A world of `n` ranks in one process: their scratch buffers, channels, semaphores and LL
//! flags, the buffers of one call, the launch of one kernel on every rank, and the host
//! reference of the reductions the tests use.

use core::cell::UnsafeCell;
use std::boxed::Box;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};
use std::vec;
use std::vec::Vec;

use crate::arch::host::grid::{GridDims, run_grid};
use mscclpp_shared::{
    CollectiveParams, DataType, DevicePtr, DeviceReduceOp, DeviceStatus, MemoryChannelDeviceHandle,
    MemoryDevice2DeviceSemaphoreDeviceHandle,
};

/// Bytes of one LL16 slot (one peer's packets in one half): 2 KiB of data.
pub const LL_SLOT: u64 = 4 << 10;
/// Bytes of one LL128 slot: 32 lines.
pub const LL128_SLOT: u64 = 32 * 128;
/// Bytes of the staging region.
pub const STAGE: u64 = 64 << 10;
/// What every output byte holds before a launch.
pub const MARK: u8 = 0xA5;
/// How long a launch may take before the watchdog aborts every rank's waits.
const WATCHDOG: Duration = Duration::from_secs(20);

/// A host allocation of `len` usable bytes at the end of its own mapping, right before a
/// page nobody may touch (its start aligned down to 16 bytes, or 128 for a scratch buffer; the
/// few bytes of slack that leaves after an unaligned length hold [`MARK`]s), and after another
/// (a buffer whose length is a whole number of pages starts right after it): a kernel that
/// reads or writes even one vector past a buffer (or before one of whole pages) faults (the
/// test dies with SIGSEGV: a failure) instead of reading whatever lies there, as a GPU faults
/// on unmapped memory.
pub struct Buf {
    map: *mut u8,
    map_len: usize,
    start: *mut u8,
    len: usize,
}

const PAGE: usize = 4096;

impl Buf {
    /// `len` bytes of `fill`, 16-byte aligned.
    pub fn new(len: usize, fill: u8) -> Self {
        Self::aligned(len, fill, 16)
    }

    /// [`Buf::new`] with its start aligned to `align` (a power of two up to a page).
    pub fn aligned(len: usize, fill: u8, align: usize) -> Self {
        // The body's start is page-aligned, so aligning the buffer's start down never leaves it.
        let body = len.next_multiple_of(PAGE).max(PAGE);
        // A no-access page, the body, a no-access page.
        let map_len = PAGE + body + PAGE;
        // SAFETY: an anonymous private mapping: no file, no other owner.
        let map = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED, "mmap of {map_len} bytes");
        let map = map as *mut u8;
        // SAFETY: the first and the last page are inside the mapping just made.
        let guard =
            |at: usize| unsafe { libc::mprotect(map.add(at) as *mut _, PAGE, libc::PROT_NONE) };
        assert_eq!((guard(0), guard(PAGE + body)), (0, 0), "mprotect");
        let body_end = map as usize + PAGE + body;
        let start_addr = (body_end - len) & !(align - 1);
        let start = start_addr as *mut u8;
        // SAFETY: `[start, body_end)` is inside the mapping's readable part.
        unsafe {
            core::ptr::write_bytes(start, fill, len);
            core::ptr::write_bytes(start.add(len), MARK, body_end - start_addr - len);
        }
        Self {
            map,
            map_len,
            start,
            len,
        }
    }

    /// A buffer holding `data`.
    pub fn from(data: &[u8]) -> Self {
        let b = Self::new(data.len(), MARK);
        // SAFETY: `len` bytes from `start` are the buffer's; no kernel runs on it yet.
        unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), b.start, data.len()) };
        b
    }

    pub fn ptr(&self) -> DevicePtr<u8> {
        DevicePtr::from_ptr(self.start)
    }

    /// Every byte from the start to the no-access page (the slack included).
    pub fn all(&self) -> &[u8] {
        let end = self.map as usize + self.map_len - PAGE;
        // SAFETY: readable bytes of the mapping, read between launches.
        unsafe { core::slice::from_raw_parts(self.start, end - self.start as usize) }
    }

    /// The usable bytes.
    pub fn get(&self) -> &[u8] {
        &self.all()[..self.len]
    }

    /// Panics unless every byte after the usable ones still holds [`MARK`] (`what` names the
    /// buffer).
    pub fn check_slack(&self, what: &str) {
        let g = &self.all()[self.len..];
        assert!(
            g.iter().all(|&b| b == MARK),
            "{what}: written past its {} bytes",
            self.len
        );
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `aligned`, unmapped once.
        unsafe { libc::munmap(self.map as *mut _, self.map_len) };
    }
}

/// What a world's scratch buffers end with ([`World::ending_with`]).
#[derive(Clone, Copy)]
pub enum Region {
    /// The LL16 region (nothing after it).
    Ll16,
    /// Only the LL128 region, at offset 0 (for the LL128 kernels alone).
    Ll128,
    /// The staging region: every region.
    Stage,
}

/// One rank's memory.
struct Rank {
    scratch: Buf,
    status: Box<UnsafeCell<DeviceStatus>>,
    ll_flags: Box<UnsafeCell<[u64; 4]>>,
    /// `blocks * n` inbound words (one per channel: peers signal them).
    inbound: Vec<UnsafeCell<u64>>,
    /// `blocks * n` expected counters (one per channel: this rank's waits).
    expected: Vec<UnsafeCell<u64>>,
    channels: Vec<MemoryChannelDeviceHandle>,
}

/// `n` ranks, each with `blocks` rows of channels to every rank.
pub struct World {
    pub n: u32,
    pub blocks: u32,
    ranks: Vec<Rank>,
    /// Where the LL128 region starts in every scratch buffer.
    ll128_at: u64,
}

impl World {
    /// A world whose scratch buffers hold every region (LL16, LL128, staging).
    pub fn new(n: u32, blocks: u32) -> Self {
        Self::ending_with(n, blocks, Region::Stage)
    }

    /// A world whose scratch buffers end with region `last` (the regions are laid out in
    /// the order LL16, LL128, staging): a kernel that writes or reads past the end of that
    /// region, as a slot index that runs past its half would, faults on the no-access page
    /// that follows every buffer. `Region::Ll128` holds that region alone, of whole pages,
    /// so a kernel that strays before it faults too.
    pub fn ending_with(n: u32, blocks: u32, last: Region) -> Self {
        let scratch_len = match last {
            Region::Ll16 => Self::ll128_offset(n),
            // The LL128 region alone, from offset 0: whole pages between two no-access pages.
            Region::Ll128 => 2 * n as u64 * LL128_SLOT,
            Region::Stage => Self::stage_offset(n) + STAGE,
        } as usize;
        let cells = (blocks * n) as usize;
        let mut ranks: Vec<Rank> = (0..n)
            .map(|_| Rank {
                // LL128 lines are 128-byte aligned.
                scratch: Buf::aligned(scratch_len, 0, 128),
                status: Box::default(),
                ll_flags: Box::new(UnsafeCell::new([0; 4])),
                inbound: (0..cells).map(|_| UnsafeCell::new(0)).collect(),
                expected: (0..cells).map(|_| UnsafeCell::new(0)).collect(),
                channels: Vec::new(),
            })
            .collect();
        let inbound: Vec<*mut u64> = ranks
            .iter()
            .map(|r| r.inbound.as_ptr() as *mut u64)
            .collect();
        let scratch: Vec<DevicePtr<u8>> = ranks.iter().map(|r| r.scratch.ptr()).collect();
        for (r, rank) in ranks.iter_mut().enumerate() {
            let status = DevicePtr::from_ptr(rank.status.get());
            let expected = rank.expected.as_ptr() as *mut u64;
            rank.channels = (0..cells)
                .map(|cell| {
                    let (b, q) = (cell / n as usize, cell % n as usize);
                    // SAFETY: `cell` and `b * n + r` are below `blocks * n`, the words'
                    // length; the vectors are never resized.
                    let (inb, remote, exp) = unsafe {
                        (
                            inbound[r].add(cell),
                            inbound[q].add(b * n as usize + r),
                            expected.add(cell),
                        )
                    };
                    MemoryChannelDeviceHandle {
                        semaphore: MemoryDevice2DeviceSemaphoreDeviceHandle {
                            inbound: DevicePtr::from_ptr(inb),
                            remote_inbound: DevicePtr::from_ptr(remote),
                            expected: DevicePtr::from_ptr(exp),
                            status,
                        },
                        dst: scratch[q],
                        src: scratch[r],
                        packet_buffer: scratch[r],
                    }
                })
                .collect();
        }
        let ll128_at = match last {
            Region::Ll128 => 0,
            _ => Self::ll128_offset(n),
        };
        Self {
            n,
            blocks,
            ranks,
            ll128_at,
        }
    }

    /// Where the LL128 region starts (after the LL16 region's two halves of `n - 1` slots).
    pub fn ll128_offset(n: u32) -> u64 {
        2 * (n as u64 - 1) * LL_SLOT
    }

    /// Where the staging region starts.
    pub fn stage_offset(n: u32) -> u64 {
        Self::ll128_offset(n) + 2 * n as u64 * LL128_SLOT
    }

    /// Rank `r`'s whole scratch buffer (read between launches: what the kernels left there).
    pub fn scratch(&self, r: u32) -> &[u8] {
        self.ranks[r as usize].scratch.get()
    }

    /// How many waits rank `r`'s channel to rank `q` of block row `b` has completed (its
    /// semaphore's `expected` counter; every barrier a block passes with `q` adds one).
    pub fn waits(&self, r: u32, b: u32, q: u32) -> u64 {
        let cell = &self.ranks[r as usize].expected[(b * self.n + q) as usize];
        // SAFETY: read between launches (no kernel writes it now).
        unsafe { *cell.get() }
    }

    /// Rank `r`'s status.
    pub fn status(&self, r: u32) -> DeviceStatus {
        // SAFETY: read between launches (no kernel writes it now).
        unsafe { *self.ranks[r as usize].status.get() }
    }

    /// Rank `r`'s parameters of a call of `bytes` in `mode` (no buffers yet).
    pub fn params(&self, r: u32, mode: u32, bytes: u64) -> CollectiveParams {
        let rank = &self.ranks[r as usize];
        CollectiveParams {
            status: DevicePtr::from_ptr(rank.status.get()),
            channels: DevicePtr::from_ptr(rank.channels.as_ptr() as *mut MemoryChannelDeviceHandle),
            scratch: rank.scratch.ptr(),
            bytes,
            ll_flags: DevicePtr::from_ptr(rank.ll_flags.get() as *mut u64),
            ll_slot_bytes: LL_SLOT,
            stage_offset: Self::stage_offset(self.n),
            stride: bytes,
            mode,
            rank: r,
            nranks: self.n,
            max_blocks: self.blocks,
            ll128_offset: self.ll128_at,
            ll128_slot_bytes: LL128_SLOT,
            ..Default::default()
        }
    }

    /// Rank `r`'s gate word (`ll_flags[2]`), read between launches.
    pub fn gate_word(&self, r: u32) -> u64 {
        // SAFETY: no launch runs (the callers read it between launches).
        unsafe { (*self.ranks[r as usize].ll_flags.get())[2] }
    }

    /// Launches `kernel` with `params[r]` on every rank at once (`grid` blocks of `block`
    /// threads, `shared` bytes of dynamic shared memory), waits for every grid, and panics
    /// if a grid trapped or a rank recorded an error (the watchdog's abort included).
    pub fn launch<P: Copy + Send + Sync>(
        &self,
        kernel: unsafe fn(P),
        params: &[P],
        grid: u32,
        block: u32,
        shared: u32,
    ) {
        for s in self.try_launch(kernel, params, grid, block, shared) {
            assert_eq!(s.error_code, 0, "a rank recorded an error: {s:?}");
        }
    }

    /// [`World::launch`] that returns every rank's status instead of checking it.
    pub fn try_launch<P: Copy + Send + Sync>(
        &self,
        kernel: unsafe fn(P),
        params: &[P],
        grid: u32,
        block: u32,
        shared: u32,
    ) -> Vec<DeviceStatus> {
        let streams: Vec<(Duration, Vec<P>)> =
            params.iter().map(|p| (Duration::ZERO, vec![*p])).collect();
        self.try_launch_streams(kernel, &streams, grid, block, shared)
    }

    /// Every rank's launches in order, as on its own stream: rank `i`'s thread waits
    /// `streams[i].0`, then launches `kernel` with each of `streams[i].1` in turn, never waiting
    /// for the other ranks between its launches (so a rank may run ahead of a late one as far
    /// as the kernels let it). Returns every rank's status after the last launch.
    pub fn try_launch_streams<P: Copy + Send + Sync>(
        &self,
        kernel: unsafe fn(P),
        streams: &[(Duration, Vec<P>)],
        grid: u32,
        block: u32,
        shared: u32,
    ) -> Vec<DeviceStatus> {
        assert!(
            grid <= self.blocks,
            "{grid} blocks, {} rows of channels",
            self.blocks
        );
        // Each launch starts with no error recorded (a recorded error is sticky).
        for r in &self.ranks {
            let s = r.status.get();
            // SAFETY: no kernel runs now; the host owns the status between launches.
            unsafe {
                (*s).error_code = 0;
                (*s).error_detail = 0
            };
        }
        let dims = GridDims {
            grid,
            block,
            shared_mem_bytes: shared,
        };
        let running = AtomicU32::new(streams.len() as u32);
        let late = streams.iter().map(|s| s.0).max().unwrap_or_default();
        let aborts: Vec<usize> = self.ranks.iter().map(|r| r.status.get() as usize).collect();
        let fired = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                let start = Instant::now();
                while running.load(Ordering::Acquire) > 0 {
                    if start.elapsed() > WATCHDOG + late {
                        fired.store(true, Ordering::Relaxed);
                        for &a in &aborts {
                            // SAFETY: the statuses outlive the scope; the kernels read the
                            // abort word atomically.
                            unsafe { AtomicU32::from_ptr(a as *mut u32) }
                                .store(1, Ordering::Release);
                        }
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            });
            for (delay, calls) in streams {
                let running = &running;
                s.spawn(move || {
                    std::thread::sleep(*delay);
                    let mut result = Ok(());
                    for &p in calls {
                        // SAFETY: every pointer in `p` is into this world's or the test's
                        // live buffers, sized for the call (each test's contract).
                        result = run_grid(dims, &|| unsafe { kernel(p) });
                        if result.is_err() {
                            break;
                        }
                    }
                    running.fetch_sub(1, Ordering::Release);
                    result.expect("grid");
                });
            }
        });
        let statuses: Vec<DeviceStatus> = (0..self.n).map(|r| self.status(r)).collect();
        assert!(
            !fired.load(Ordering::Relaxed),
            "the watchdog aborted the launch: {statuses:?}"
        );
        statuses
    }
}

/// Byte `i` of part `part` of rank `rank`'s data of seed `seed`: a hash, so that no two
/// (rank, part, byte) look alike and no short period repeats.
pub fn byte(seed: u32, rank: u32, part: u32, i: usize) -> u8 {
    let mut h = seed
        .wrapping_mul(0x9e37_79b9)
        .wrapping_add(rank.wrapping_mul(0x85eb_ca6b))
        .wrapping_add(part.wrapping_mul(0xc2b2_ae35))
        .wrapping_add(i as u32);
    h ^= h >> 15;
    h = h.wrapping_mul(0x2c1b_3c6d);
    h ^= h >> 12;
    h as u8
}

/// `parts` parts of `len` bytes each (`stride` apart; the gap holds [`MARK`]s) of rank
/// `rank`'s data, as elements of `dtype` whose values keep every reduction exact: f32 whole
/// numbers in [-64, 63], i32 in [-8, 7] (so that products of up to 8 ranks do not overflow).
pub fn data(
    dtype: DataType,
    seed: u32,
    rank: u32,
    parts: u32,
    len: usize,
    stride: usize,
) -> Vec<u8> {
    let mut v = vec![MARK; stride * (parts as usize - 1) + len];
    for p in 0..parts {
        let at = p as usize * stride;
        for e in 0..len / 4 {
            let h = u32::from_le_bytes([0, 1, 2, 3].map(|k| byte(seed, rank, p, 4 * e + k)));
            let w = match dtype {
                DataType::F32 => ((h % 128) as f32 - 64.0).to_bits(),
                _ => ((h % 16) as i32 - 8) as u32,
            };
            v[at + 4 * e..at + 4 * e + 4].copy_from_slice(&w.to_le_bytes());
        }
        for k in (len / 4) * 4..len {
            v[at + k] = byte(seed, rank, p, k);
        }
    }
    v
}

/// The host reference: `a ⊕ b` of two little-endian words of `dtype` (f32 or i32) under `op`
/// (`scalar`: the pre-multiplied sum's factor, the post-division's divisor; applied by
/// [`finish`]).
pub fn fold(dtype: DataType, op: DeviceReduceOp, a: u32, b: u32) -> u32 {
    match dtype {
        DataType::F32 => {
            let (x, y) = (f32::from_bits(a), f32::from_bits(b));
            match op {
                DeviceReduceOp::Min => x.min(y),
                DeviceReduceOp::Max => x.max(y),
                DeviceReduceOp::Prod => x * y,
                _ => x + y,
            }
            .to_bits()
        }
        _ => {
            let (x, y) = (a as i32, b as i32);
            (match op {
                DeviceReduceOp::Min => x.min(y),
                DeviceReduceOp::Max => x.max(y),
                DeviceReduceOp::Prod => x.wrapping_mul(y),
                _ => x.wrapping_add(y),
            }) as u32
        }
    }
}

/// The reference reduction of every rank's `parts[r]` (whole 4-byte elements; a trailing
/// partial element is not a reduction's), with the scalar applied as the kernels do.
pub fn reduce(dtype: DataType, op: DeviceReduceOp, scalar: u32, parts: &[&[u8]]) -> Vec<u8> {
    let word = |p: &[u8], e: usize| u32::from_le_bytes(p[4 * e..4 * e + 4].try_into().unwrap());
    let len = parts[0].len();
    let mut out = vec![0u8; len];
    for e in 0..len / 4 {
        let pre = |w: u32| match (dtype, op) {
            (DataType::F32, DeviceReduceOp::PreMulSum) => {
                (f32::from_bits(w) * f32::from_bits(scalar)).to_bits()
            }
            _ => w,
        };
        let mut acc = pre(word(parts[0], e));
        for p in &parts[1..] {
            acc = fold(dtype, op, acc, pre(word(p, e)));
        }
        if op == DeviceReduceOp::SumPostDiv {
            acc = ((acc as i32) / scalar as i32) as u32;
        }
        out[4 * e..4 * e + 4].copy_from_slice(&acc.to_le_bytes());
    }
    out
}
