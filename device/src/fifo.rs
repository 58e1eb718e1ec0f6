//! Device side of the proxy FIFO: [`FifoDevice::push`] and friends on a `FifoDeviceHandle`.
//!
//! The protocol, and who reads and writes each word with which ordering, is written down once in
//! `mscclpp_shared::fifo`; this file implements the producer half of it.

use crate::arch;
use crate::wait::spin_until;
use mscclpp_shared::trigger::commit_parity;
use mscclpp_shared::{DeviceErrorCode, FifoDeviceHandle, ProxyTrigger, WaitSite};

/// Producer operations on a FIFO handle (`use mscclpp_device::prelude::*`).
pub trait FifoDevice {
    /// Pushes `trigger` (its commit bit is overwritten) and returns its position. Waits,
    /// bounded and abortable, while the FIFO is full.
    fn push(&self, trigger: ProxyTrigger) -> Result<u64, DeviceErrorCode>;
    /// Whether the proxy has popped the trigger at `pos`.
    fn poll(&self, pos: u64) -> bool;
    /// Waits until the proxy has popped the trigger at `pos`.
    fn sync(&self, pos: u64) -> Result<(), DeviceErrorCode>;
    /// Waits until the proxy has completed the SYNC trigger pushed at `pos` (and so all work of
    /// that trigger's connection pushed before it).
    fn wait_flushed(&self, pos: u64) -> Result<(), DeviceErrorCode>;
}

impl FifoDevice for FifoDeviceHandle {
    #[inline(always)]
    fn push(&self, trigger: ProxyTrigger) -> Result<u64, DeviceErrorCode> {
        let n = self.size as u64;
        // SAFETY: a FIFO handle built by the host points at live `head`, `tail_cache` (device)
        // and `tail`, `triggers[size]` (host-mapped) for as long as its proxy runs.
        unsafe {
            let pos = arch::atom_add_relaxed_gpu_u64(self.head.as_ptr(), 1);
            if pos >= n + arch::ld_relaxed_sys_u64(self.tail_cache.as_ptr()) {
                let tail = self.tail.as_ptr();
                spin_until(self.status, WaitSite::FifoPush, self.tail.addr(), || {
                    let t = arch::ld_acquire_sys_u64(tail);
                    if pos < n + t {
                        arch::st_relaxed_sys_u64(self.tail_cache.as_ptr(), t);
                        true
                    } else {
                        false
                    }
                })?;
            }
            let t = trigger.with_commit_bit(commit_parity(pos, self.log2_size));
            let slot = self.triggers.as_ptr().add((pos & (n - 1)) as usize) as *mut u64;
            arch::st_release_sys_v2_u64(slot, t.fst, t.snd);
            Ok(pos)
        }
    }

    #[inline(always)]
    fn poll(&self, pos: u64) -> bool {
        // SAFETY: as in `push`.
        unsafe { arch::ld_acquire_sys_u64(self.tail.as_ptr()) > pos }
    }

    #[inline(always)]
    fn sync(&self, pos: u64) -> Result<(), DeviceErrorCode> {
        spin_until(self.status, WaitSite::FifoSync, self.tail.addr(), || {
            self.poll(pos)
        })
    }

    #[inline(always)]
    fn wait_flushed(&self, pos: u64) -> Result<(), DeviceErrorCode> {
        let done = self.flush_done_pos.as_ptr();
        spin_until(
            self.status,
            WaitSite::FifoSync,
            self.flush_done_pos.addr(),
            || {
                // SAFETY: as in `push`.
                unsafe { arch::ld_acquire_sys_u64(done) > pos }
            },
        )
    }
}

#[cfg(test)]
mod tests {
    //! The producer half on the host build, against host memory standing in for the FIFO's
    //! words (the consumer's `tail` and `flush_done_pos` are written by the test).

    extern crate std;
    use std::boxed::Box;
    use std::vec::Vec;

    use super::*;
    use core::sync::atomic::{AtomicU64, Ordering};
    use mscclpp_shared::{DevicePtr, DeviceStatus, TriggerFields, TriggerType};

    /// A FIFO of `n` slots in host memory (leaked: a few hundred bytes per test).
    struct HostFifo {
        handle: FifoDeviceHandle,
        triggers: &'static mut [ProxyTrigger],
        words: &'static [AtomicU64; 4], // head, tail_cache, tail, flush_done_pos
        status: &'static mut DeviceStatus,
    }

    fn fifo(n: u32, aborted: bool) -> HostFifo {
        let triggers: &'static mut [ProxyTrigger] =
            Box::leak(std::vec![ProxyTrigger { fst: 0, snd: 0 }; n as usize].into_boxed_slice());
        let words: &'static [AtomicU64; 4] = Box::leak(Box::new([
            AtomicU64::new(0),
            AtomicU64::new(0),
            AtomicU64::new(0),
            AtomicU64::new(0),
        ]));
        let status: &'static mut DeviceStatus = Box::leak(Box::new(DeviceStatus {
            abort: aborted as u32,
            ..DeviceStatus::default()
        }));
        let w = |i: usize| DevicePtr::from_ptr(words[i].as_ptr());
        let handle = FifoDeviceHandle {
            triggers: DevicePtr::from_ptr(triggers.as_mut_ptr()),
            head: w(0),
            tail_cache: w(1),
            tail: w(2),
            flush_done_pos: w(3),
            status: DevicePtr::from_ptr(status as *mut DeviceStatus),
            size: n,
            log2_size: n.trailing_zeros(),
        };
        HostFifo {
            handle,
            triggers,
            words,
            status,
        }
    }

    fn trigger(i: u64) -> ProxyTrigger {
        ProxyTrigger::pack_unchecked(TriggerFields {
            size: 100 + i,
            src_offset: 7 * i,
            dst_offset: 3 + i,
            src_memory_id: (i % 5) as u32,
            dst_memory_id: (i % 7) as u32,
            kind: TriggerType::DATA,
            semaphore_id: (i % 11) as u32,
        })
    }

    #[test]
    fn push_fills_slots_in_order_with_the_lap_parity() {
        let f = fifo(4, false);
        for lap in 0..3u64 {
            for i in 0..4u64 {
                let pos = lap * 4 + i;
                assert_eq!(f.handle.push(trigger(pos)), Ok(pos));
            }
            let want: Vec<ProxyTrigger> = (0..4)
                .map(|i| trigger(lap * 4 + i).with_commit_bit(commit_parity(lap * 4 + i, 2)))
                .collect();
            assert_eq!(f.triggers, &want[..], "lap {lap}");
            assert_eq!(want[0].commit_bit(), (lap & 1) ^ 1);
            // The consumer pops the whole lap.
            f.words[2].store((lap + 1) * 4, Ordering::Release);
        }
        assert_eq!(f.words[0].load(Ordering::Relaxed), 12, "head");
        assert_eq!(
            f.words[1].load(Ordering::Relaxed),
            8,
            "tail cache refreshed"
        );
    }

    #[test]
    fn a_full_fifo_waits_for_the_consumer() {
        let f = fifo(2, false);
        assert_eq!(f.handle.push(trigger(0)), Ok(0));
        assert_eq!(f.handle.push(trigger(1)), Ok(1));
        let popped = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(std::time::Duration::from_millis(50));
                popped.store(true, Ordering::SeqCst);
                f.words[2].store(1, Ordering::Release); // slot 0 is free
            });
            assert_eq!(f.handle.push(trigger(2)), Ok(2));
            assert!(popped.load(Ordering::SeqCst), "pushed into a full FIFO");
        });
        assert_eq!(f.triggers[0], trigger(2).with_commit_bit(0));
        assert_eq!(
            f.triggers[1],
            trigger(1).with_commit_bit(1),
            "slot 1 not yet popped"
        );
        assert_eq!(f.words[1].load(Ordering::Relaxed), 1, "tail cache");
    }

    #[test]
    fn a_full_fifo_gives_up_on_abort() {
        let f = fifo(2, true);
        // Not full: no wait, so no abort check.
        assert_eq!(f.handle.push(trigger(0)), Ok(0));
        assert_eq!(f.handle.push(trigger(1)), Ok(1));
        assert_eq!(f.handle.push(trigger(2)), Err(DeviceErrorCode::Aborted));
        assert_eq!(f.status.error_code, DeviceErrorCode::Aborted as u32);
        assert_eq!(
            f.status.error_detail,
            mscclpp_shared::status::error_detail(WaitSite::FifoPush, f.handle.tail.addr())
        );
        assert_eq!(f.triggers[0], trigger(0).with_commit_bit(1), "slot 0 kept");
    }

    #[test]
    fn poll_sync_and_flush_follow_the_consumer() {
        let f = fifo(4, true);
        f.words[2].store(3, Ordering::Release); // three popped
        f.words[3].store(5, Ordering::Release); // SYNC triggers before 5 complete
        assert!(f.handle.poll(0) && f.handle.poll(2));
        assert!(!f.handle.poll(3) && !f.handle.poll(4));
        assert_eq!(f.handle.sync(2), Ok(()));
        assert_eq!(f.handle.wait_flushed(4), Ok(()));
        // Not yet: the abort (set from the start) ends the waits.
        assert_eq!(f.handle.sync(3), Err(DeviceErrorCode::Aborted));
        assert_eq!(f.handle.wait_flushed(5), Err(DeviceErrorCode::Aborted));
        assert_eq!(
            f.status.error_detail,
            mscclpp_shared::status::error_detail(WaitSite::FifoSync, f.handle.tail.addr()),
            "the first error is kept"
        );
    }
}
