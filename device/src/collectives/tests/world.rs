//! A world of `n` ranks in one process: their scratch buffers, channels, semaphores and LL
//! flags, the buffers of one call, the launch of one kernel on every rank, and the host
//! reference of the reductions the tests use.

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
/// Bytes after every buffer that no kernel may write.
pub const GUARD: usize = 64;
/// What every output byte holds before a launch.
pub const MARK: u8 = 0xA5;
/// How long a launch may take before the watchdog aborts every rank's waits.
const WATCHDOG: Duration = Duration::from_secs(5);

/// A 128-byte aligned line (LL128 lines are; the others need 16).
#[repr(C, align(128))]
#[derive(Clone, Copy)]
struct Line([u8; 128]);

/// A host allocation aligned to 128 bytes, `len` usable bytes plus [`GUARD`].
pub struct Buf {
    lines: Vec<Line>,
    len: usize,
}

impl Buf {
    /// `len` bytes (and the guard) of `fill`.
    pub fn new(len: usize, fill: u8) -> Self {
        Self {
            lines: vec![Line([fill; 128]); (len + GUARD).div_ceil(128)],
            len,
        }
    }

    /// `data`, then the guard of [`MARK`]s.
    pub fn from(data: &[u8]) -> Self {
        let mut b = Self::new(data.len(), MARK);
        b.bytes_mut()[..data.len()].copy_from_slice(data);
        b
    }

    pub fn ptr(&self) -> DevicePtr<u8> {
        DevicePtr::from_ptr(self.lines.as_ptr() as *mut u8)
    }

    /// Every byte, the guard included.
    pub fn all(&self) -> &[u8] {
        // SAFETY: the lines are `lines.len() * 128` initialised bytes.
        unsafe {
            core::slice::from_raw_parts(self.lines.as_ptr() as *const u8, self.lines.len() * 128)
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        let n = self.lines.len() * 128;
        // SAFETY: as in `all`.
        unsafe { core::slice::from_raw_parts_mut(self.lines.as_mut_ptr() as *mut u8, n) }
    }

    /// The usable bytes.
    pub fn get(&self) -> &[u8] {
        &self.all()[..self.len]
    }

    /// Panics unless the guard still holds [`MARK`]s (`what` names the buffer).
    pub fn check_guard(&self, what: &str) {
        let g = &self.all()[self.len..self.len + GUARD];
        assert!(
            g.iter().all(|&b| b == MARK),
            "{what}: written past its {} bytes",
            self.len
        );
    }
}

/// One rank's memory.
struct Rank {
    scratch: Buf,
    status: Box<DeviceStatus>,
    ll_flags: Box<[u64; 2]>,
    /// `blocks * n` inbound words (one per channel: peers signal them).
    inbound: Vec<u64>,
    /// `blocks * n` expected counters (one per channel: this rank's waits).
    expected: Vec<u64>,
    channels: Vec<MemoryChannelDeviceHandle>,
}

/// `n` ranks, each with `blocks` rows of channels to every rank.
pub struct World {
    pub n: u32,
    pub blocks: u32,
    ranks: Vec<Rank>,
}

impl World {
    pub fn new(n: u32, blocks: u32) -> Self {
        let scratch_len = (Self::ll128_offset(n) + 2 * n as u64 * LL128_SLOT + STAGE) as usize;
        let cells = (blocks * n) as usize;
        let mut ranks: Vec<Rank> = (0..n)
            .map(|_| Rank {
                scratch: Buf::new(scratch_len, 0),
                status: Box::default(),
                ll_flags: Box::new([0; 2]),
                inbound: vec![0; cells],
                expected: vec![0; cells],
                channels: Vec::new(),
            })
            .collect();
        let inbound: Vec<*mut u64> = ranks.iter_mut().map(|r| r.inbound.as_mut_ptr()).collect();
        let scratch: Vec<DevicePtr<u8>> = ranks.iter().map(|r| r.scratch.ptr()).collect();
        for (r, rank) in ranks.iter_mut().enumerate() {
            let status = DevicePtr::from_ptr(&mut *rank.status as *mut DeviceStatus);
            let expected = rank.expected.as_mut_ptr();
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
        Self { n, blocks, ranks }
    }

    /// Where the LL128 region starts (after the LL16 region's two halves of `n - 1` slots).
    pub fn ll128_offset(n: u32) -> u64 {
        2 * (n as u64 - 1) * LL_SLOT
    }

    /// Where the staging region starts.
    pub fn stage_offset(n: u32) -> u64 {
        Self::ll128_offset(n) + 2 * n as u64 * LL128_SLOT
    }

    /// Rank `r`'s status.
    pub fn status(&self, r: u32) -> DeviceStatus {
        *self.ranks[r as usize].status
    }

    /// Rank `r`'s parameters of a call of `bytes` in `mode` (no buffers yet).
    pub fn params(&self, r: u32, mode: u32, bytes: u64) -> CollectiveParams {
        let rank = &self.ranks[r as usize];
        CollectiveParams {
            status: DevicePtr::from_ptr(&*rank.status as *const DeviceStatus as *mut DeviceStatus),
            channels: DevicePtr::from_ptr(rank.channels.as_ptr() as *mut MemoryChannelDeviceHandle),
            scratch: rank.scratch.ptr(),
            bytes,
            ll_flags: DevicePtr::from_ptr(rank.ll_flags.as_ptr() as *mut u64),
            ll_slot_bytes: LL_SLOT,
            stage_offset: Self::stage_offset(self.n),
            stride: bytes,
            mode,
            rank: r,
            nranks: self.n,
            max_blocks: self.blocks,
            ll128_offset: Self::ll128_offset(self.n),
            ll128_slot_bytes: LL128_SLOT,
            ..Default::default()
        }
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
        assert!(
            grid <= self.blocks,
            "{grid} blocks, {} rows of channels",
            self.blocks
        );
        // Each launch starts with no error recorded (a recorded error is sticky).
        for r in &self.ranks {
            let s = &*r.status as *const DeviceStatus as *mut DeviceStatus;
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
        let running = AtomicU32::new(params.len() as u32);
        let aborts: Vec<usize> = self
            .ranks
            .iter()
            .map(|r| &*r.status as *const DeviceStatus as usize)
            .collect();
        let fired = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                let start = Instant::now();
                while running.load(Ordering::Acquire) > 0 {
                    if start.elapsed() > WATCHDOG {
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
            for p in params {
                let p = *p;
                let running = &running;
                s.spawn(move || {
                    // SAFETY: every pointer in `p` is into this world's or the test's live
                    // buffers, sized for the call (each test's contract).
                    let r = run_grid(dims, &|| unsafe { kernel(p) });
                    running.fetch_sub(1, Ordering::Release);
                    r.expect("grid");
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
