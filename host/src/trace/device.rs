//! The device side of a trace: the block-event rings kernels write, and the clock pairs that
//! map their timestamps onto the host's clock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mscclpp_shared::trace::{EVENTS_PER_LAUNCH, event_slot};
use mscclpp_shared::{TraceClockParams, TraceDeviceHandle, TraceEvent, TraceEventKind};

use crate::backoff::Backoff;
use crate::error::{Result, TraceError};
use crate::gpu::{DeviceBuffer, Gpu, HostMapped, Kernel, LaunchConfig, Stream};
use crate::status::StatusBlock;

/// Fewest launch records a ring keeps.
const MIN_RECORDS: usize = 16;
/// Most launch records a ring keeps.
const MAX_RECORDS: usize = 1 << 12;

/// One block event read back from the rings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockEvent {
    /// The launch ([`Trace::launch`](super::Trace::launch) handed it out).
    pub launch: u32,
    /// The block.
    pub block: u32,
    /// What happened.
    pub kind: TraceEventKind,
    /// Device clock, ns.
    pub device_ns: u64,
}

/// The rings of one rank's traced kernels, in device memory (`mscclpp_shared::trace`).
pub(crate) struct DeviceRings {
    buf: DeviceBuffer,
    rings: u32,
    log2_records: u32,
}

impl DeviceRings {
    /// Rings for `rings` blocks, each with as many launch records (a power of two, 16 to
    /// 4096) as fit `budget` bytes in all; zeroed (launch 0: never written).
    pub fn new(gpu: &Gpu, rings: u32, budget: usize) -> Result<Self> {
        let rings = rings.max(1);
        let record = EVENTS_PER_LAUNCH * std::mem::size_of::<TraceEvent>();
        let fit = budget / (rings as usize * record);
        let records = if fit < 2 {
            MIN_RECORDS
        } else {
            (1usize << (usize::BITS - 1 - fit.leading_zeros())).clamp(MIN_RECORDS, MAX_RECORDS)
        };
        let bytes = rings as usize * records * record;
        let buf = gpu.alloc(bytes)?;
        buf.copy_from_host(0, &vec![0u8; bytes])?;
        Ok(Self {
            buf,
            rings,
            log2_records: records.trailing_zeros(),
        })
    }

    /// Launch records per ring.
    pub fn records(&self) -> u32 {
        1 << self.log2_records
    }

    /// Rings (blocks that can record).
    pub fn rings(&self) -> u32 {
        self.rings
    }

    /// The handle of launch `launch`.
    pub fn handle(&self, launch: u32) -> TraceDeviceHandle {
        TraceDeviceHandle {
            events: self.buf.ptr().cast(),
            launch,
            log2_records: self.log2_records,
            rings: self.rings,
            reserved: 0,
        }
    }

    /// Every event of the launches `first..=last` still in the rings (older ones were
    /// overwritten; slots a launch did not write, or that a later launch took, are skipped).
    pub fn read(&self, first: u32, last: u32) -> Result<Vec<BlockEvent>> {
        let mut bytes = vec![0u8; self.buf.len()];
        self.buf.copy_to_host(0, &mut bytes)?;
        let events: &[TraceEvent] = bytemuck::cast_slice(&bytes);
        let mut out = Vec::new();
        for launch in first..=last {
            if launch == 0 {
                continue;
            }
            for block in 0..self.rings {
                for kind in TraceEventKind::ALL {
                    let slot = event_slot(block, launch, kind, self.log2_records) as usize;
                    let Some(e) = events.get(slot) else {
                        continue;
                    };
                    if e.launch == launch && e.kind == kind as u16 && u32::from(e.block) == block {
                        out.push(BlockEvent {
                            launch,
                            block,
                            kind,
                            device_ns: e.time_ns,
                        });
                    }
                }
            }
        }
        Ok(out)
    }
}

/// A pairing of the host's trace clock with the device's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockPair {
    /// Host trace-clock ns: the midpoint of the round trip.
    pub host_ns: u64,
    /// The device's clock when it answered.
    pub device_ns: u64,
    /// Half the round trip: how far `host_ns` may be from the true host time of `device_ns`.
    pub error_ns: u64,
}

/// Rounds of one clock sample: the pair with the shortest round trip is kept.
const ROUNDS: u32 = 8;

/// `trace_clock_kernel` on a stream of its own, answering pings in host-mapped memory.
pub(crate) struct ClockSync {
    kernel: Kernel<TraceClockParams>,
    stream: Stream,
    words: HostMapped,
    status: StatusBlock,
    rank: usize,
}

impl ClockSync {
    /// A sampler for `gpu` running `kernel` (the built-in `trace_clock_kernel`).
    pub fn new(gpu: &Gpu, kernel: Kernel<TraceClockParams>, rank: usize) -> Result<Self> {
        Ok(Self {
            kernel,
            stream: gpu.stream()?,
            words: gpu.alloc_host_mapped((2 + ROUNDS as usize) * 8)?,
            status: StatusBlock::new(gpu, 0)?,
            rank,
        })
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        debug_assert!(i < 2 + ROUNDS as usize);
        // SAFETY: the mapping holds `2 + ROUNDS` aligned u64 that live as long as `self`; the
        // host touches them only through atomics, the kernel with its own atomics.
        unsafe { AtomicU64::from_ptr((self.words.host_ptr() as *mut u64).add(i)) }
    }

    /// Launches the kernel and pairs the clocks `ROUNDS` times, within `timeout`; returns the
    /// pair of the shortest round trip. A kernel that does not answer in time (the device is
    /// busy or gone) is aborted and the sample fails.
    pub fn sample(&self, timeout: Duration) -> Result<ClockPair> {
        let deadline = Instant::now() + timeout;
        self.status.reset();
        for i in 0..2 + ROUNDS as usize {
            self.word(i).store(0, Ordering::Relaxed);
        }
        let params = TraceClockParams {
            status: self.status.device_ptr(),
            words: self.words.device_ptr().cast(),
            rounds: ROUNDS,
            reserved: 0,
        };
        // SAFETY: `words` and `status` live as long as `self`, and `self` waits for the kernel
        // (or aborts it and waits) before returning.
        unsafe {
            self.stream
                .launch(&self.kernel, LaunchConfig::new(1, 1), params)?
        };
        let mut best: Option<ClockPair> = None;
        let mut failed = false;
        'rounds: for i in 0..ROUNDS as u64 {
            let t0 = super::now_ns();
            self.word(0).store(i + 1, Ordering::Release);
            let mut backoff = Backoff::new();
            while self.word(1).load(Ordering::Acquire) <= i {
                if Instant::now() >= deadline {
                    failed = true;
                    break 'rounds;
                }
                backoff.snooze();
            }
            let t1 = super::now_ns();
            let pair = ClockPair {
                host_ns: t0 + (t1 - t0) / 2,
                device_ns: self.word(2 + i as usize).load(Ordering::Relaxed),
                error_ns: (t1 - t0) / 2,
            };
            if best.is_none_or(|b| pair.error_ns < b.error_ns) {
                best = Some(pair);
            }
        }
        if failed {
            self.status.abort();
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let done = self
            .stream
            .synchronize_timeout(left.max(Duration::from_millis(100)))?;
        match best {
            Some(pair) if !failed && done => Ok(pair),
            _ => Err(TraceError::ClockSync {
                rank: self.rank,
                after: timeout,
            }
            .into()),
        }
    }
}
