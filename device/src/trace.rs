//! Block events of traced kernels, and the kernel that pairs the host's clock with the device's.
//!
//! A traced kernel's parameter struct carries a [`TraceDeviceHandle`] (null `events`: off; the
//! layout and the ring protocol are in `mscclpp_shared::trace`). Thread 0 of each block records
//! up to four events per launch, each into a slot of its own (no atomics, no reads of device
//! memory: the slot comes from the block, the launch id and the kind):
//!
//! | event | where a kernel records it |
//! |---|---|
//! | `Start` / `End` | around the kernel's body ([`block`]), early returns included |
//! | `Send` | where the block starts its data phase: after an LL kernel read its flag, after a barrier kernel's first barrier, before a PortChannel kernel's first put; not in `p2p_kernel` (it cost registers there) |
//! | `Recv` | where the block's last wait for a peer's data completed, and only if it did: after a barrier kernel's last barrier (or its last reads of peer data), after a PortChannel kernel's last wait, after every lane of a `p2p_kernel` block; not in the LL kernels nor the staged ones, whose last wait is their last step before `End` (recording it there cost up to 2 registers) |
//!
//! **Off costs one test per hook.** Every hook first tests `events` (a kernel parameter, read
//! from the constant bank: no register) and returns; only then does thread 0 read its index and
//! the clock. The hooks sit outside the kernels' loops, so the off path is four uniform,
//! predictable branches per block, and `scripts/check-ptx.sh --table` shows the kernels'
//! registers and stack are what they were without tracing.
//!
//! Your own kernels trace the same way: put a [`TraceDeviceHandle`] in their parameter struct
//! (the host gets one per launch from its trace, `Trace::launch` in `mscclpp-host`) and call
//! [`block`] and [`event`].

use crate::arch;
use crate::wait::spin_until;
use mscclpp_shared::trace::{TraceClockParams, event_slot};
use mscclpp_shared::{TraceDeviceHandle, TraceEvent, TraceEventKind, WaitSite};

/// Records `kind` for this block when `t` is on (thread 0 records; every other thread and an
/// untraced launch do nothing but the tests). Any thread may call it.
#[inline(always)]
pub fn event(t: &TraceDeviceHandle, kind: TraceEventKind) {
    event_if(t, kind, true)
}

/// [`event`] when `happened` (e.g. `Recv` when the last wait succeeded); `happened` is looked
/// at only when `t` is on, so that an untraced launch still tests nothing but `t`.
#[inline(always)]
pub fn event_if(t: &TraceDeviceHandle, kind: TraceEventKind, happened: bool) {
    // Every value goes through an opaque step (see `arch::opaque_u64`), so that the compiler
    // keeps this test and the address computation here, inside the hook, instead of hoisting
    // them (live registers) or duplicating the code around them.
    let events = arch::opaque_u64(t.events.addr());
    if events == 0 || !happened {
        return;
    }
    if arch::thread_idx_x_here() != 0 {
        return;
    }
    let block = arch::block_idx_x_here();
    if block >= arch::opaque_u32(t.rings) {
        return;
    }
    let launch = arch::opaque_u32(t.launch);
    let slot = event_slot(block, launch, kind, arch::opaque_u32(t.log2_records));
    let time = arch::globaltimer_ns();
    // SAFETY: the host allocated `rings << log2_records` records of `EVENTS_PER_LAUNCH` events
    // at `events` (16-byte slots, 8-byte aligned) and `block < rings`, so the slot is inside;
    // only this thread writes it during this launch (the slot is this block's, this launch's).
    unsafe {
        let at = (events as *mut TraceEvent).add(slot as usize) as *mut u64;
        arch::st_relaxed_sys_u64(at, time);
        arch::st_relaxed_sys_u64(at.add(1), TraceEvent::tag(launch, kind, block));
    }
}

/// Runs `body` between this block's `Start` and `End` events (every thread calls it; thread 0
/// records). `End` is recorded however `body` returns.
#[inline(always)]
pub fn block<R>(t: &TraceDeviceHandle, body: impl FnOnce() -> R) -> R {
    event(t, TraceEventKind::Start);
    let r = body();
    event(t, TraceEventKind::End);
    r
}

crate::kernel! {
    /// Answers the host's clock pings (launch one thread; `mscclpp_shared::trace` has the
    /// words): for each round `i`, waits until the host's ping count passes `i`, then stores
    /// its clock (`%globaltimer`; the CPU backend's `CLOCK_MONOTONIC`) as word `2 + i` and
    /// releases the answer count `i + 1`. The host pairs each answer with the midpoint of its
    /// own clock around the round trip. A wait that gives up (the host aborted the status)
    /// ends the kernel.
    fn trace_clock_kernel(p: TraceClockParams) {
        if arch::global_thread_idx() != 0 {
            return;
        }
        let words = p.words.as_ptr();
        for i in 0..p.rounds as u64 {
            let asked = spin_until(p.status, WaitSite::Unknown, words as u64, || {
                // SAFETY: `words` holds `2 + rounds` u64 in host-mapped memory (kernel contract).
                (unsafe { arch::ld_acquire_sys_u64(words) }) > i
            });
            if asked.is_err() {
                return;
            }
            let now = arch::globaltimer_ns();
            // SAFETY: as above; `2 + i < 2 + rounds`.
            unsafe {
                arch::st_relaxed_sys_u64(words.add(2 + i as usize), now);
                arch::st_release_sys_u64(words.add(1), i + 1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mscclpp_shared::DevicePtr;
    use mscclpp_shared::trace::EVENTS_PER_LAUNCH;

    #[test]
    fn a_traced_launch_fills_its_slots_in_order() {
        let mut ring = [TraceEvent::default(); 2 * 4 * EVENTS_PER_LAUNCH];
        let t = TraceDeviceHandle {
            events: DevicePtr::from_ptr(ring.as_mut_ptr()),
            launch: 6,
            log2_records: 2,
            rings: 2,
            reserved: 0,
        };
        // Outside a launch this is block 0, thread 0.
        let before = arch::globaltimer_ns();
        block(&t, || event(&t, TraceEventKind::Recv));
        let after = arch::globaltimer_ns();
        let written: std::vec::Vec<(usize, TraceEvent)> = ring
            .iter()
            .copied()
            .enumerate()
            .filter(|(_, e)| e.launch != 0)
            .collect();
        let kinds = [
            TraceEventKind::Start,
            TraceEventKind::Recv,
            TraceEventKind::End,
        ];
        assert_eq!(written.len(), kinds.len(), "{written:?}");
        let mut last = before;
        for kind in kinds {
            let s = event_slot(0, 6, kind, 2) as usize;
            let e = ring[s];
            assert_eq!((e.launch, e.kind, e.block), (6, kind as u16, 0), "slot {s}");
            assert!(
                last <= e.time_ns && e.time_ns <= after,
                "{kind:?} out of order"
            );
            last = e.time_ns;
        }
    }
}
