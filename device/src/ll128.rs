//! LL128 lines on the device: a warp writes 128-byte lines (120 data bytes and an 8-byte flag)
//! into a peer's buffer, 8 lanes a line, and the peer's warp reads them until every line's flag
//! matches. The layout is `mscclpp_shared::packet::ll128`.
//!
//! Who writes and reads what: a line is written only by one warp of the sending rank (each lane
//! its 16 bytes, the last lane of the 8 with the flag) and read only by one warp of the
//! receiving rank (each lane its 16 bytes). The flag changes for every use of a line buffer
//! (the callers count uses), so stale lines never match.
//!
//! Ordering:
//! - On the GPU ([`arch::WARP_LINE_STORES_WHOLE`]) each lane writes its 16 bytes with one
//!   volatile store and reads them with one volatile load. The 8 stores of a line are one warp
//!   instruction to one aligned 128-byte line, which reaches memory (over NVLink too) as one
//!   write, so a reader whose flag lane sees the flag sees the whole line. This is a property
//!   of the hardware that NCCL's LL128 protocol relies on as well, not of the PTX memory model.
//! - On the host (emulated lanes store one by one) the data lanes store, the warp meets at a
//!   barrier, and the flag lane stores its data and then its flag with release; a reader's flag
//!   lane loads the flag with acquire, the warp votes, and only then do the lanes load their
//!   data (the vote is a barrier, which carries the acquire to every lane).
//!
//! Every lane of the warp must make the same calls in the same order (they meet in warp
//! barriers and votes).

use crate::arch;
use crate::wait::spin_until_warp;
use mscclpp_shared::packet::ll128;
use mscclpp_shared::{DeviceErrorCode, DevicePtr, DeviceStatus, WaitSite};

/// Lane `lane`'s 16 bytes of a line: `v` (a flag lane's last two words are replaced by `flag`).
///
/// # Safety
/// `p` is this lane's 16-byte part of a 128-byte aligned line (lane `l` at `16 * (l % 8)`),
/// valid for writes.
#[inline(always)]
pub unsafe fn store_line_part(p: *mut u32, v: [u32; 4], lane: usize, flag: u32) {
    let flag_lane = ll128::is_flag_lane(lane);
    let v = if flag_lane {
        [v[0], v[1], flag, flag]
    } else {
        v
    };
    if arch::WARP_LINE_STORES_WHOLE {
        // SAFETY: the caller's contract; 16-byte aligned.
        unsafe { arch::st_volatile_v4_u32(p, v) };
        return;
    }
    if !flag_lane {
        // SAFETY: as above.
        unsafe { arch::st_volatile_v4_u32(p, v) };
    }
    arch::sync_warp();
    if flag_lane {
        // SAFETY: as above; the flag word is the part's second 8 bytes.
        unsafe {
            arch::st_volatile_v2_u32(p, [v[0], v[1]]);
            arch::st_release_sys_u64(p.add(2) as *mut u64, flag_word(flag));
        }
    }
}

/// Waits (bounded, abortable, the whole warp together) until every line of the warp's step at
/// this lane's part `p` carries `flag`, and returns the lane's 16 bytes (a flag lane's data in
/// its first two words).
///
/// # Safety
/// As for [`store_line_part`], valid for reads; every lane of the warp calls it.
#[inline(always)]
pub unsafe fn read_line_part(
    p: *const u32,
    lane: usize,
    flag: u32,
    status: DevicePtr<DeviceStatus>,
) -> Result<[u32; 4], DeviceErrorCode> {
    let flag_lane = ll128::is_flag_lane(lane);
    let mut v = [0u32; 4];
    spin_until_warp(status, WaitSite::Packet, p as u64, || {
        let here = if arch::WARP_LINE_STORES_WHOLE {
            // SAFETY: the caller's contract.
            v = unsafe { arch::ld_volatile_v4_u32(p) };
            !flag_lane || (v[2] == flag && v[3] == flag)
        } else {
            // SAFETY: as above; the flag word is the part's second 8 bytes.
            !flag_lane
                || unsafe { arch::ld_acquire_sys_u64(p.add(2) as *const u64) } == flag_word(flag)
        };
        arch::vote_all_sync(here)
    })?;
    if !arch::WARP_LINE_STORES_WHOLE {
        // SAFETY: as above; after the vote every line's data is visible to every lane.
        v = unsafe { arch::ld_volatile_v4_u32(p) };
    }
    Ok(v)
}

/// The flag as the 8-byte word it is stored as (twice, little-endian).
#[inline(always)]
fn flag_word(flag: u32) -> u64 {
    flag as u64 | ((flag as u64) << 32)
}

#[cfg(test)]
mod tests {
    //! The line protocol on the host build (emulated lanes, `WARP_LINE_STORES_WHOLE` false): a
    //! reader warp that starts before the writer waits and then returns every lane's data; the
    //! bytes a line holds in memory (the layout the GPU's whole-line stores give); a stale flag
    //! waits until the abort. (The GPU's whole-line path runs in the GPU bundle's LL128 tests.)

    extern crate std;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::time::{Duration, Instant};
    use std::vec::Vec;

    use super::*;
    use crate::arch::host::grid::{GridDims, run_grid};

    /// One warp's step: 4 lines of 128 bytes, aligned as a line.
    #[repr(C, align(128))]
    struct Lines([u32; 4 * 32]);

    /// Lane `lane`'s 16 bytes (a hash: no two lanes alike).
    fn data(lane: usize, seed: u32) -> [u32; 4] {
        let h = |k: u32| (lane as u32 * 4 + k + 1).wrapping_mul(0x9e37_79b9) ^ seed;
        [h(0), h(1), h(2), h(3)]
    }

    /// Lane `lane`'s part of `lines` (lane `l` at `16 * l`: line `l / 8`, part `l % 8`).
    fn part(base: usize, lane: usize) -> *mut u32 {
        (base + 16 * lane) as *mut u32
    }

    /// Runs `kernel` on `block` emulated threads while a watchdog aborts `status` after 10 s
    /// (a reader that never sees its flag then returns `Aborted` instead of spinning on).
    fn run_watched(block: u32, status: *mut DeviceStatus, kernel: &(dyn Fn() + Sync)) {
        let done = AtomicBool::new(false);
        let abort = status as usize;
        std::thread::scope(|s| {
            s.spawn(|| {
                let start = Instant::now();
                while !done.load(Ordering::Acquire) {
                    if start.elapsed() > Duration::from_secs(10) {
                        // SAFETY: the status outlives the scope; the device side reads the
                        // word atomically.
                        unsafe { AtomicU32::from_ptr(abort as *mut u32) }
                            .store(1, Ordering::Release);
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            });
            let dims = GridDims {
                grid: 1,
                block,
                shared_mem_bytes: 0,
            };
            run_grid(dims, kernel).expect("grid");
            done.store(true, Ordering::Release);
        });
    }

    #[test]
    fn a_reader_that_starts_first_waits_for_every_line_then_reads_each_lanes_data() {
        let mut lines = Lines([0; 128]);
        let base = lines.0.as_mut_ptr() as usize;
        let mut status = DeviceStatus::default();
        let st_raw = &mut status as *mut DeviceStatus;
        let st = DevicePtr::from_ptr(st_raw);
        let got: Vec<[AtomicU32; 4]> = (0..32).map(|_| Default::default()).collect();
        let errors = AtomicU32::new(0);
        run_watched(64, st_raw, &|| {
            let t = arch::thread_idx_x() as usize;
            let lane = t % 32;
            if t < 32 {
                // The writer warp, late: the reader must wait for it.
                std::thread::sleep(Duration::from_millis(30));
                // SAFETY: the lane's 16-byte part of a live, aligned line.
                unsafe { store_line_part(part(base, lane), data(lane, 7), lane, 5) };
            } else {
                // SAFETY: as above.
                match unsafe { read_line_part(part(base, lane), lane, 5, st) } {
                    Ok(v) => {
                        for (slot, w) in got[lane].iter().zip(v) {
                            slot.store(w, Ordering::Relaxed);
                        }
                    }
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
        assert_eq!(errors.load(Ordering::Relaxed), 0, "{status:?}");
        for (lane, g) in got.iter().enumerate() {
            let g: Vec<u32> = g.iter().map(|w| w.load(Ordering::Relaxed)).collect();
            let want = data(lane, 7);
            let n = if ll128::is_flag_lane(lane) { 2 } else { 4 };
            assert_eq!(g[..n], want[..n], "lane {lane}");
        }
    }

    #[test]
    fn a_line_in_memory_holds_seven_parts_of_data_and_the_flag_twice() {
        let mut lines = Lines([0; 128]);
        let base = lines.0.as_mut_ptr() as usize;
        let mut status = DeviceStatus::default();
        run_watched(32, &mut status, &|| {
            let lane = arch::thread_idx_x() as usize;
            // SAFETY: the lane's 16-byte part of a live, aligned line.
            unsafe { store_line_part(part(base, lane), data(lane, 3), lane, 0x0bad_f00d) };
        });
        for lane in 0..32 {
            let d = data(lane, 3);
            let want = if ll128::is_flag_lane(lane) {
                [d[0], d[1], 0x0bad_f00d, 0x0bad_f00d]
            } else {
                d
            };
            assert_eq!(lines.0[4 * lane..4 * lane + 4], want, "lane {lane}");
        }
    }

    #[test]
    fn a_stale_flag_waits_until_the_abort() {
        let mut lines = Lines([0; 128]);
        let base = lines.0.as_mut_ptr() as usize;
        let mut status = DeviceStatus::default();
        let st_raw = &mut status as *mut DeviceStatus;
        let st = DevicePtr::from_ptr(st_raw);
        let results: Vec<AtomicU32> = (0..32).map(|_| AtomicU32::new(0)).collect();
        run_watched(32, st_raw, &|| {
            let lane = arch::thread_idx_x() as usize;
            // SAFETY: the lane's 16-byte part of a live, aligned line.
            unsafe { store_line_part(part(base, lane), data(lane, 1), lane, 8) };
            arch::sync_warp();
            if lane == 0 {
                // SAFETY: `st` points at the live status; the device side reads it atomically.
                unsafe { AtomicU32::from_ptr(st.as_ptr() as *mut u32) }.store(1, Ordering::Release);
            }
            arch::sync_warp();
            // The lines carry flag 8, not 9: the warp waits until the abort.
            // SAFETY: as above.
            let r = unsafe { read_line_part(part(base, lane), lane, 9, st) };
            let code = match r {
                Ok(_) => 1,
                Err(DeviceErrorCode::Aborted) => 2,
                Err(_) => 3,
            };
            results[lane].store(code, Ordering::Relaxed);
        });
        for (lane, r) in results.iter().enumerate() {
            assert_eq!(r.load(Ordering::Relaxed), 2, "lane {lane}: aborted");
        }
        assert_eq!(status.error_code, DeviceErrorCode::Aborted as u32);
    }
}
