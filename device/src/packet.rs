//! LL packets on the device: write data and flag in one store; read until the flag matches.
//!
//! The layouts are `mscclpp_shared::packet`. A writer never needs a separate signal: a reader
//! that sees the expected flag in a packet (in each 8-byte half, for LL16) also sees its data.
//! The flag must differ for every use of a packet buffer (callers count uses: 1, 2, 3, …), so
//! stale packets never match; flag 0 is never valid because buffers start zeroed.

use crate::arch;
use crate::wait::spin_until;
use mscclpp_shared::{DeviceErrorCode, DevicePtr, DeviceStatus, LL8Packet, LL16Packet, WaitSite};

/// A packet format: how many payload bytes it carries and how it is written and read.
pub trait Packet: Copy {
    /// Payload bytes per packet.
    const PAYLOAD: usize;
    /// Writes `payload` (its first `PAYLOAD` bytes, as little-endian u32 words) with `flag`.
    ///
    /// # Safety
    /// `p` is a valid, aligned packet slot.
    unsafe fn store(p: *mut Self, payload: [u32; 2], flag: u32);
    /// Reads the packet; `Some(payload)` when every flag equals `flag`.
    ///
    /// # Safety
    /// `p` is a valid, aligned packet slot.
    unsafe fn load(p: *const Self, flag: u32) -> Option<[u32; 2]>;
}

impl Packet for LL16Packet {
    const PAYLOAD: usize = 8;
    #[inline(always)]
    unsafe fn store(p: *mut Self, payload: [u32; 2], flag: u32) {
        // SAFETY: the caller's contract; LL16 slots are 16-byte aligned.
        unsafe { arch::st_volatile_v4_u32(p as *mut u32, [payload[0], flag, payload[1], flag]) }
    }
    #[inline(always)]
    unsafe fn load(p: *const Self, flag: u32) -> Option<[u32; 2]> {
        // SAFETY: the caller's contract.
        let v = unsafe { arch::ld_volatile_v4_u32(p as *const u32) };
        (v[1] == flag && v[3] == flag).then_some([v[0], v[2]])
    }
}

impl Packet for LL8Packet {
    const PAYLOAD: usize = 4;
    #[inline(always)]
    unsafe fn store(p: *mut Self, payload: [u32; 2], flag: u32) {
        // SAFETY: the caller's contract; LL8 slots are 8-byte aligned.
        unsafe { arch::st_volatile_v2_u32(p as *mut u32, [payload[0], flag]) }
    }
    #[inline(always)]
    unsafe fn load(p: *const Self, flag: u32) -> Option<[u32; 2]> {
        // SAFETY: the caller's contract.
        let v = unsafe { arch::ld_volatile_v2_u32(p as *const u32) };
        (v[1] == flag).then_some([v[0], 0])
    }
}

/// Reads up to `PAYLOAD` bytes at `src` (fewer at the end of a buffer) as two u32 words.
///
/// # Safety
/// `src` is valid for `len` bytes.
#[inline(always)]
pub unsafe fn read_payload<P: Packet>(src: *const u8, len: usize) -> [u32; 2] {
    let mut w = [0u32; 2];
    if len >= P::PAYLOAD && (src as usize).is_multiple_of(4) {
        // SAFETY: `PAYLOAD` (4 or 8) bytes are readable and 4-byte aligned.
        unsafe {
            w[0] = (src as *const u32).read();
            if P::PAYLOAD == 8 {
                w[1] = (src as *const u32).add(1).read();
            }
        }
    } else {
        let mut bytes = [0u8; 8];
        let n = if len < P::PAYLOAD { len } else { P::PAYLOAD };
        let mut i = 0;
        while i < n {
            // SAFETY: `i < len`.
            bytes[i] = unsafe { src.add(i).read() };
            i += 1;
        }
        w = [
            u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
            u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]),
        ];
    }
    w
}

/// Writes the first `len` (`<= PAYLOAD`) bytes of `w` to `dst`.
///
/// # Safety
/// `dst` is valid for `len` bytes.
#[inline(always)]
pub unsafe fn write_payload<P: Packet>(dst: *mut u8, w: [u32; 2], len: usize) {
    if len >= P::PAYLOAD && (dst as usize).is_multiple_of(4) {
        // SAFETY: `PAYLOAD` bytes are writable and 4-byte aligned.
        unsafe {
            (dst as *mut u32).write(w[0]);
            if P::PAYLOAD == 8 {
                (dst as *mut u32).add(1).write(w[1]);
            }
        }
    } else {
        let a = w[0].to_le_bytes();
        let b = w[1].to_le_bytes();
        let bytes = [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]];
        let n = if len < P::PAYLOAD { len } else { P::PAYLOAD };
        let mut i = 0;
        while i < n {
            // SAFETY: `i < len`.
            unsafe { dst.add(i).write(bytes[i]) };
            i += 1;
        }
    }
}

/// Number of packets that carry `bytes` bytes.
#[inline(always)]
pub const fn packets_for<P: Packet>(bytes: usize) -> usize {
    bytes.div_ceil(P::PAYLOAD)
}

/// Collective: threads `tid` of `nthreads` turn `bytes` bytes at `src` into packets at `dst`
/// (the reader's packet buffer) carrying `flag`.
///
/// # Safety
/// `src` valid for `bytes`; `dst` valid and aligned for `packets_for::<P>(bytes)` packets.
#[inline(always)]
pub unsafe fn put_packets<P: Packet>(
    dst: *mut P,
    src: *const u8,
    bytes: usize,
    tid: usize,
    nthreads: usize,
    flag: u32,
) {
    let n = packets_for::<P>(bytes);
    let mut i = tid;
    while i < n {
        let off = i * P::PAYLOAD;
        // SAFETY: `off < bytes`; packet `i` is inside `dst` (caller's contract).
        unsafe {
            let w = read_payload::<P>(src.add(off), bytes - off);
            P::store(dst.add(i), w, flag);
        }
        i += nthreads;
    }
}

/// Collective: threads wait for the packets at `src` (local packet buffer) to carry `flag` and
/// write their payload, `bytes` bytes in all, to `dst`. Each wait is bounded and abortable.
///
/// # Safety
/// `src` valid for `packets_for::<P>(bytes)` packets; `dst` valid for `bytes`.
#[inline(always)]
pub unsafe fn unpack_packets<P: Packet>(
    dst: *mut u8,
    src: *const P,
    bytes: usize,
    tid: usize,
    nthreads: usize,
    flag: u32,
    status: DevicePtr<DeviceStatus>,
) -> Result<(), DeviceErrorCode> {
    let n = packets_for::<P>(bytes);
    let mut i = tid;
    while i < n {
        // SAFETY: packet `i` is inside `src` (caller's contract).
        let w = unsafe { read_packet(src.add(i), flag, status) }?;
        let off = i * P::PAYLOAD;
        // SAFETY: `off < bytes`.
        unsafe { write_payload::<P>(dst.add(off), w, bytes - off) };
        i += nthreads;
    }
    Ok(())
}

/// Waits (bounded, abortable) for one packet to carry `flag` and returns its payload.
///
/// # Safety
/// `p` valid and aligned.
#[inline(always)]
pub unsafe fn read_packet<P: Packet>(
    p: *const P,
    flag: u32,
    status: DevicePtr<DeviceStatus>,
) -> Result<[u32; 2], DeviceErrorCode> {
    let mut out = [0u32; 2];
    spin_until(status, WaitSite::Packet, p as u64, || {
        // SAFETY: the caller's contract.
        match unsafe { P::load(p, flag) } {
            Some(w) => {
                out = w;
                true
            }
            None => false,
        }
    })?;
    Ok(out)
}
