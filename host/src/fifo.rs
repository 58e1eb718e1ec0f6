//! Host side of the proxy FIFO: it owns the memory and is the single consumer.
//!
//! Memory (see `mscclpp_shared::fifo` for who reads and writes each word, and how):
//! - `triggers[N]`: host-pinned, device-mapped; GPU producers write, the proxy reads;
//! - `tail` and `flush_done_pos`: host-pinned, device-mapped, each on its own cache line; the
//!   proxy writes (release), producers read (acquire);
//! - `head` and `tail_cache`: device memory, producers only.
//!
//! The proxy reads slot `tail % N`: an acquire load of `snd`; the slot is ready when its commit
//! bit equals the parity of `tail`'s lap; then `fst` is read. The GPU writes a slot with one
//! aligned 16-byte store, which reaches host memory as one transaction, and the CPU backend
//! writes `fst` before publishing `snd` with release, so a ready `snd` always comes with its
//! `fst`. Slots are never cleared: the parity tells a stale slot from a fresh one.

use crate::error::ProxyError;
use std::sync::atomic::{AtomicU64, Ordering};

use mscclpp_shared::trigger::commit_parity;
use mscclpp_shared::{DevicePtr, DeviceStatus, FifoDeviceHandle, ProxyTrigger};

use crate::error::{Error, Result};
use crate::gpu::{DeviceBuffer, Gpu, HostMapped};

const CACHE_LINE: usize = 64;
const TAIL_OFF: usize = 0;
const FLUSH_OFF: usize = CACHE_LINE;
const HEAD_OFF: usize = 0;
const TAIL_CACHE_OFF: usize = CACHE_LINE;

/// A proxy FIFO of `N` (a power of two) trigger slots.
pub struct Fifo {
    triggers: HostMapped,
    words: HostMapped,
    device_words: DeviceBuffer,
    size: u32,
    log2_size: u32,
    /// Consumer position (mirrors the shared `tail`; only the consumer writes either).
    tail: u64,
}

impl Fifo {
    /// A FIFO of `size` slots for `gpu`; `size` must be a power of two.
    pub fn new(gpu: &Gpu, size: u32) -> Result<Self> {
        if !size.is_power_of_two() {
            return Err(Error::Proxy(ProxyError::FifoSize { size }));
        }
        let triggers =
            gpu.alloc_host_mapped(size as usize * std::mem::size_of::<ProxyTrigger>())?;
        let words = gpu.alloc_host_mapped(2 * CACHE_LINE)?;
        let device_words = gpu.alloc(2 * CACHE_LINE)?;
        Ok(Self {
            triggers,
            words,
            device_words,
            size,
            log2_size: size.trailing_zeros(),
            tail: 0,
        })
    }

    /// Number of slots.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// The device handle; waits on it report through `status`.
    pub fn device_handle(&self, status: DevicePtr<DeviceStatus>) -> FifoDeviceHandle {
        FifoDeviceHandle {
            triggers: self.triggers.device_ptr().cast(),
            tail: self.words.device_ptr().byte_add_cast(TAIL_OFF as u64),
            head: self.device_words.ptr().byte_add_cast(HEAD_OFF as u64),
            tail_cache: self.device_words.ptr().byte_add_cast(TAIL_CACHE_OFF as u64),
            flush_done_pos: self.words.device_ptr().byte_add_cast(FLUSH_OFF as u64),
            status,
            size: self.size,
            log2_size: self.log2_size,
        }
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        // SAFETY: `off` is one of the two aligned u64 words inside our live host mapping; every
        // host access to them is atomic.
        unsafe { AtomicU64::from_ptr(self.words.host_ptr().add(off).cast()) }
    }

    /// The next trigger and its position, if one has been published.
    pub fn poll(&self) -> Option<(ProxyTrigger, u64)> {
        let slot = (self.tail & (self.size as u64 - 1)) as usize;
        // SAFETY: `slot < size`; the slot's two words are aligned u64s in our live mapping,
        // read atomically while producers may write them.
        let (fst, snd) = unsafe {
            let p = self.triggers.host_ptr().cast::<u64>().add(2 * slot);
            let snd = AtomicU64::from_ptr(p.add(1)).load(Ordering::Acquire);
            if snd >> 63 != commit_parity(self.tail, self.log2_size) {
                return None;
            }
            (AtomicU64::from_ptr(p).load(Ordering::Relaxed), snd)
        };
        Some((ProxyTrigger { fst, snd }, self.tail))
    }

    /// Consumes the trigger at the current position (after `poll` returned it).
    pub fn pop(&mut self) {
        self.tail += 1;
        self.word(TAIL_OFF).store(self.tail, Ordering::Release);
    }

    /// Consumer position: the number of triggers popped so far.
    pub fn tail(&self) -> u64 {
        self.tail
    }

    /// Marks the SYNC trigger at `pos` complete: device `flush`es waiting for it return.
    pub fn complete_flush(&self, pos: u64) {
        self.word(FLUSH_OFF).fetch_max(pos + 1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::BackendKind;
    use crate::status::StatusBlock;
    use mscclpp_device::fifo::FifoDevice;
    use mscclpp_shared::{DeviceErrorCode, TriggerFields, TriggerType};

    fn cpu() -> Gpu {
        Gpu::open(BackendKind::Cpu, 0).unwrap()
    }

    fn trig(producer: u64, seq: u64) -> ProxyTrigger {
        ProxyTrigger::new(TriggerFields {
            size: producer,
            src_offset: seq,
            kind: TriggerType::DATA,
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn sizes_must_be_powers_of_two() {
        let g = cpu();
        assert!(matches!(
            Fifo::new(&g, 100),
            Err(Error::Proxy(ProxyError::FifoSize { size: 100 }))
        ));
        assert!(matches!(
            Fifo::new(&g, 0),
            Err(Error::Proxy(ProxyError::FifoSize { size: 0 }))
        ));
        assert!(Fifo::new(&g, 4).is_ok());
        for size in [1, 2, 64] {
            assert_eq!(Fifo::new(&g, size).unwrap().size(), size);
        }
    }

    /// Producers on host threads run the device `push` (the CPU backend's build of it) against
    /// a tiny FIFO and a slow consumer: every trigger arrives once, in each producer's order,
    /// through many wrap-arounds.
    #[test]
    fn many_producers_slow_consumer_wraps_in_order() {
        let g = cpu();
        let status = StatusBlock::new(&g, 0).unwrap();
        let mut fifo = Fifo::new(&g, 8).unwrap();
        let h = fifo.device_handle(status.device_ptr());
        const PRODUCERS: u64 = 6;
        const EACH: u64 = 300;
        std::thread::scope(|s| {
            for p in 0..PRODUCERS {
                s.spawn(move || {
                    for i in 0..EACH {
                        h.push(trig(p, i)).unwrap();
                    }
                });
            }
            let mut next = [0u64; PRODUCERS as usize];
            let mut got = 0;
            while got < PRODUCERS * EACH {
                match fifo.poll() {
                    Some((t, pos)) => {
                        assert_eq!(pos, got);
                        let p = t.size() as usize;
                        assert_eq!(t.src_offset(), next[p], "producer {p} out of order");
                        assert_eq!(t.kind(), TriggerType::DATA);
                        next[p] += 1;
                        got += 1;
                        if got % 7 == 0 {
                            std::thread::sleep(std::time::Duration::from_micros(200));
                        }
                        fifo.pop();
                    }
                    None => std::thread::yield_now(),
                }
            }
            assert!(next.iter().all(|&n| n == EACH));
        });
        assert_eq!(fifo.tail(), PRODUCERS * EACH);
        assert!(
            fifo.poll().is_none(),
            "a stale slot looked fresh after the last lap"
        );
    }

    #[test]
    fn flush_completes_by_position() {
        let g = cpu();
        let status = StatusBlock::new(&g, 0).unwrap();
        let mut fifo = Fifo::new(&g, 4).unwrap();
        let h = fifo.device_handle(status.device_ptr());
        let p0 = h.push(trig(0, 0)).unwrap();
        let p1 = h.push(ProxyTrigger::flush(3).unwrap()).unwrap();
        assert_eq!((p0, p1), (0, 1));
        assert!(!h.poll(0));
        for _ in 0..2 {
            let (t, pos) = fifo.poll().unwrap();
            fifo.pop();
            if t.kind().contains(TriggerType::SYNC) {
                fifo.complete_flush(pos);
            }
        }
        assert!(h.poll(1));
        h.sync(1).unwrap();
        h.wait_flushed(1).unwrap();
        h.wait_flushed(0).unwrap();
    }

    #[test]
    fn a_full_fifo_push_is_released_by_abort_or_times_out() {
        let g = cpu();
        let status = StatusBlock::new(&g, 0).unwrap();
        let fifo = Fifo::new(&g, 2).unwrap();
        let h = fifo.device_handle(status.device_ptr());
        h.push(trig(0, 0)).unwrap();
        h.push(trig(0, 1)).unwrap();
        // Nobody consumes: the third push waits until the host aborts.
        std::thread::scope(|s| {
            let t = s.spawn(|| h.push(trig(0, 2)));
            std::thread::sleep(std::time::Duration::from_millis(50));
            status.abort();
            assert_eq!(t.join().unwrap(), Err(DeviceErrorCode::Aborted));
        });
        let e = status.error().expect("the abort was recorded");
        assert!(
            matches!(
                e,
                Error::Device {
                    code: DeviceErrorCode::Aborted,
                    site: mscclpp_shared::WaitSite::FifoPush,
                    ..
                }
            ),
            "{e}"
        );
        // With a spin limit and no abort, the wait ends by itself.
        let status2 = StatusBlock::new(&g, 200).unwrap();
        let fifo2 = Fifo::new(&g, 1).unwrap();
        let h2 = fifo2.device_handle(status2.device_ptr());
        h2.push(trig(0, 0)).unwrap();
        assert_eq!(h2.push(trig(0, 1)), Err(DeviceErrorCode::Timeout));
        assert!(matches!(
            status2.error(),
            Some(Error::Device {
                code: DeviceErrorCode::Timeout,
                ..
            })
        ));
    }
}
