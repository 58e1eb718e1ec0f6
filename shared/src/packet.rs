//! LL ("low latency") packets: data and a flag written together in one store, so a reader that
//! sees the expected flag also sees the data without a separate signal.
//!
//! Writer: one 16-byte (LL16) or 8-byte (LL8) volatile store into the reader's packet buffer.
//! Reader: volatile loads until every flag equals the expected flag (the flag changes for every
//! use of the buffer, so stale packets never match).

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
