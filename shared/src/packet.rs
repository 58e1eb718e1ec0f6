//! LL ("low latency") packets: data and a flag written together in one store, so a reader that
//! sees the expected flag also sees the data without a separate signal.
//!
//! Writer: one 16-byte (LL16) or 8-byte (LL8) volatile store into the reader's packet buffer.
//! Reader: volatile loads until every flag equals the expected flag (the flag changes for every
//! use of the buffer, so stale packets never match).
//!
//! LL128 lines are written by a warp, not one thread: see [`ll128`].

/// 16-byte packet: two 4-byte payloads, each with its own flag, written by one 16-byte store.
#[repr(C, align(16))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct LL16Packet {
    /// First payload word.
    pub data1: u32,
    /// Flag for `data1`.
    pub flag1: u32,
    /// Second payload word.
    pub data2: u32,
    /// Flag for `data2`.
    pub flag2: u32,
}

/// 8-byte packet: one 4-byte payload and its flag, written by one 8-byte store.
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct LL8Packet {
    /// Payload.
    pub data: u32,
    /// Flag for `data`.
    pub flag: u32,
}

impl LL16Packet {
    /// Payload bytes per packet.
    pub const PAYLOAD_BYTES: usize = 8;
}

impl LL8Packet {
    /// Payload bytes per packet.
    pub const PAYLOAD_BYTES: usize = 4;
}

static_assertions::assert_eq_size!(LL16Packet, [u32; 4]);
static_assertions::const_assert_eq!(core::mem::align_of::<LL16Packet>(), 16);
static_assertions::assert_eq_size!(LL8Packet, u64);
static_assertions::const_assert_eq!(core::mem::align_of::<LL8Packet>(), 8);

/// LL128 lines: 128 bytes, 120 of data and an 8-byte flag, written by 8 lanes of a warp with
/// one 16-byte store apiece (on NVLink a warp's store of an aligned 128-byte line reaches the
/// peer whole, which is what NCCL's LL128 protocol rests on; the CPU backend orders the flag's
/// store after the data's instead, see `mscclpp_device::ll128`). A reader sees the line valid
/// when its flag (two u32 equal to the expected flag) matches.
///
/// A warp moves [`WARP_DATA_BYTES`](ll128::WARP_DATA_BYTES) per step, as
/// [`WARP_LINES`](ll128::WARP_LINES) lines. Lane `l` writes bytes `16 * (l % 8) ..` of line
/// `l / 8`; its part of the step's data is [`lane_data`](ll128::lane_data).
pub mod ll128 {
    /// Bytes of a line.
    pub const LINE_BYTES: usize = 128;
    /// Data bytes of a line (the last 8 are the flag).
    pub const LINE_DATA_BYTES: usize = 120;
    /// Lanes that write one line (16 bytes each); the last of them carries the flag.
    pub const LANES_PER_LINE: usize = 8;
    /// Lanes of a warp.
    pub const WARP_LANES: usize = 32;
    /// Lines a warp writes per step.
    pub const WARP_LINES: usize = WARP_LANES / LANES_PER_LINE;
    /// Data bytes a warp moves per step.
    pub const WARP_DATA_BYTES: usize = WARP_LINES * LINE_DATA_BYTES;
    /// Line bytes a warp writes per step.
    pub const WARP_LINE_BYTES: usize = WARP_LINES * LINE_BYTES;

    /// Whether `lane` writes the flag of its line (in its last 8 bytes).
    pub const fn is_flag_lane(lane: usize) -> bool {
        lane % LANES_PER_LINE == LANES_PER_LINE - 1
    }

    /// The part of a step's [`WARP_DATA_BYTES`] that `lane` carries: `(offset, length)`. The
    /// 28 data lanes take 16 contiguous bytes each (in lane order), the 4 flag lanes the last
    /// 32 bytes, 8 each (so every lane's data starts 8-byte aligned).
    pub const fn lane_data(lane: usize) -> (usize, usize) {
        let line = lane / LANES_PER_LINE;
        if is_flag_lane(lane) {
            ((WARP_LANES - WARP_LINES) * 16 + 8 * line, 8)
        } else {
            (16 * (lane - line), 16)
        }
    }

    /// Line bytes that carry `bytes` bytes of data (whole warp steps).
    pub const fn line_bytes_for(bytes: usize) -> usize {
        bytes.div_ceil(WARP_DATA_BYTES) * WARP_LINE_BYTES
    }

    const _: () = assert!(WARP_LINES * LANES_PER_LINE == WARP_LANES);
    const _: () = assert!(lane_data(6).0 + 16 == lane_data(8).0);
    const _: () = assert!(lane_data(31).0 + lane_data(31).1 == WARP_DATA_BYTES);
}

#[cfg(test)]
mod tests {
    use super::ll128::*;

    #[test]
    fn ll128_lanes_cover_a_step_once() {
        let mut seen = [0u8; WARP_DATA_BYTES];
        for lane in 0..WARP_LANES {
            let (off, len) = lane_data(lane);
            assert_eq!(len, if is_flag_lane(lane) { 8 } else { 16 }, "lane {lane}");
            assert_eq!(off % 8, 0, "lane {lane}");
            for b in &mut seen[off..off + len] {
                *b += 1;
            }
        }
        assert!(seen.iter().all(|&c| c == 1));
        assert_eq!(line_bytes_for(1), 512);
        assert_eq!(line_bytes_for(480), 512);
        assert_eq!(line_bytes_for(481), 1024);
    }
}
