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

#[cfg(test)]
mod tests {
    //! Packets on the host build, in host memory: layouts, payload tails at every length and
    //! alignment, several "threads" sharing the work, stale flags, and the abort.

    extern crate std;
    use std::vec;
    use std::vec::Vec;

    use super::*;

    /// Bytes that differ everywhere (no period a misplaced word could hide in).
    fn data(n: usize, seed: u32) -> Vec<u8> {
        (0..n as u32)
            .map(|i| {
                (i.wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(40_503)).rotate_left(i % 29)
                    as u8
            })
            .collect()
    }

    #[test]
    fn packets_are_laid_out_as_the_shared_structs_say() {
        let mut p16 = LL16Packet::default();
        let mut p8 = LL8Packet::default();
        // SAFETY: both are live, aligned packets.
        unsafe {
            LL16Packet::store(&mut p16, [0x1111_1111, 0x2222_2222], 7);
            LL8Packet::store(&mut p8, [0x3333_3333, 0x4444_4444], 9);
        }
        assert_eq!(
            (p16.data1, p16.flag1, p16.data2, p16.flag2),
            (0x1111_1111, 7, 0x2222_2222, 7)
        );
        assert_eq!((p8.data, p8.flag), (0x3333_3333, 9));
        // SAFETY: as above.
        unsafe {
            assert_eq!(LL16Packet::load(&p16, 7), Some([0x1111_1111, 0x2222_2222]));
            assert_eq!(LL16Packet::load(&p16, 8), None);
            assert_eq!(LL8Packet::load(&p8, 9), Some([0x3333_3333, 0]));
            assert_eq!(LL8Packet::load(&p8, 7), None);
        }
        // Half a packet fresh, half stale (a torn write as the reader may see it): not ready.
        for (f1, f2) in [(7, 6), (6, 7)] {
            let half = LL16Packet {
                data1: 1,
                flag1: f1,
                data2: 2,
                flag2: f2,
            };
            // SAFETY: as above.
            assert_eq!(unsafe { LL16Packet::load(&half, 7) }, None, "{f1} {f2}");
        }
    }

    #[test]
    fn payloads_round_trip_at_every_length_and_alignment() {
        let src = data(24, 1);
        for len in 0..=9 {
            for at in 0..4 {
                let mut back = vec![0xa5u8; 16];
                // SAFETY: `src` holds `at + len` bytes and `back` 16.
                unsafe {
                    let w16 = read_payload::<LL16Packet>(src.as_ptr().add(at), len);
                    write_payload::<LL16Packet>(back.as_mut_ptr().add(at), w16, len);
                }
                let n = len.min(8);
                let mut want = vec![0xa5u8; 16];
                want[at..at + n].copy_from_slice(&src[at..at + n]);
                assert_eq!(back, want, "LL16 len {len} at {at}");
                // The words carry the bytes little-endian, zero past the end.
                // SAFETY: as above.
                let w = unsafe { read_payload::<LL16Packet>(src.as_ptr().add(at), len) };
                let mut le = [0u8; 8];
                le[..n].copy_from_slice(&src[at..at + n]);
                assert_eq!(
                    w,
                    [
                        u32::from_le_bytes([le[0], le[1], le[2], le[3]]),
                        u32::from_le_bytes([le[4], le[5], le[6], le[7]])
                    ],
                    "LL16 words, len {len} at {at}"
                );
                let mut back = vec![0xa5u8; 16];
                // SAFETY: as above.
                unsafe {
                    let w8 = read_payload::<LL8Packet>(src.as_ptr().add(at), len);
                    assert_eq!(w8[1], 0, "LL8 carries one word");
                    write_payload::<LL8Packet>(back.as_mut_ptr().add(at), w8, len);
                }
                let n = len.min(4);
                let mut want = vec![0xa5u8; 16];
                want[at..at + n].copy_from_slice(&src[at..at + n]);
                assert_eq!(back, want, "LL8 len {len} at {at}");
            }
        }
    }

    /// `put_packets` then `unpack_packets` of `bytes` bytes, the work split over `threads`
    /// callers (run one after another), from and to buffers `at` bytes into their allocation.
    fn round_trip<P: Packet + Default>(bytes: usize, threads: usize, at: usize, flag: u32) {
        let src = data(bytes + at, flag);
        let mut pkts: Vec<P> = vec![P::default(); packets_for::<P>(bytes) + 1];
        for tid in 0..threads {
            // SAFETY: `src` holds `at + bytes`, `pkts` the packets for `bytes`.
            unsafe {
                put_packets(
                    pkts.as_mut_ptr(),
                    src.as_ptr().add(at),
                    bytes,
                    tid,
                    threads,
                    flag,
                )
            };
        }
        // Every packet carries its bytes of the data and zeros past the end (a read past the
        // end of the source would put other bytes there, or fault on a GPU).
        let mut carried = vec![0u8; packets_for::<P>(bytes) * P::PAYLOAD];
        carried[..bytes].copy_from_slice(&src[at..at + bytes]);
        for (i, chunk) in carried.chunks(P::PAYLOAD).enumerate() {
            let mut le = [0u8; 8];
            le[..P::PAYLOAD].copy_from_slice(chunk);
            let want = [
                u32::from_le_bytes([le[0], le[1], le[2], le[3]]),
                u32::from_le_bytes([le[4], le[5], le[6], le[7]]),
            ];
            // SAFETY: a live, aligned packet.
            let got = unsafe { P::load(&pkts[i], flag) };
            assert_eq!(got, Some(want), "packet {i} of {bytes} B at +{at}");
        }
        let mut out = vec![0xa5u8; bytes + at + 8];
        for tid in 0..threads {
            // SAFETY: as above; `out` holds `at + bytes` and more.
            let r = unsafe {
                unpack_packets(
                    out.as_mut_ptr().add(at),
                    pkts.as_ptr(),
                    bytes,
                    tid,
                    threads,
                    flag,
                    DevicePtr::NULL,
                )
            };
            assert_eq!(r, Ok(()));
        }
        let mut want = vec![0xa5u8; bytes + at + 8];
        want[at..at + bytes].copy_from_slice(&src[at..at + bytes]);
        assert_eq!(out, want, "{} B by {threads} threads at +{at}", bytes);
        // The packet past the last one is untouched.
        // SAFETY: a live, aligned packet.
        assert!(unsafe { P::load(&pkts[packets_for::<P>(bytes)], flag) }.is_none());
    }

    #[test]
    fn put_and_unpack_round_trip() {
        assert_eq!(packets_for::<LL16Packet>(17), 3);
        assert_eq!(packets_for::<LL8Packet>(17), 5);
        assert_eq!(packets_for::<LL16Packet>(16), 2);
        for bytes in [1, 4, 7, 8, 9, 31, 64, 101] {
            for threads in [1, 3] {
                for at in [0, 1, 4] {
                    round_trip::<LL16Packet>(bytes, threads, at, 5);
                    round_trip::<LL8Packet>(bytes, threads, at, 6);
                }
            }
        }
    }

    #[test]
    fn a_stale_flag_waits_until_the_abort() {
        let mut status = DeviceStatus {
            abort: 1,
            ..DeviceStatus::default()
        };
        let st = DevicePtr::from_ptr(&mut status as *mut DeviceStatus);
        let mut p = LL16Packet::default();
        // SAFETY: a live, aligned packet.
        unsafe { LL16Packet::store(&mut p, [1, 2], 3) };
        // SAFETY: as above.
        assert_eq!(unsafe { read_packet(&p, 3, st) }, Ok([1, 2]));
        // SAFETY: as above.
        assert_eq!(
            unsafe { read_packet(&p, 4, st) },
            Err(DeviceErrorCode::Aborted)
        );
        assert_eq!(status.error_code, DeviceErrorCode::Aborted as u32);
        let mut out = [0u8; 8];
        // SAFETY: as above; `out` holds 8 bytes.
        let r = unsafe { unpack_packets(out.as_mut_ptr(), &p, 8, 0, 1, 4, st) };
        assert_eq!(r, Err(DeviceErrorCode::Aborted));
        assert_eq!(out, [0; 8], "nothing written from a stale packet");
    }
}
