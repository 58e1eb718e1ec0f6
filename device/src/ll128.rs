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
