//! Parameter structs of the built-in kernels: each kernel takes exactly one of these by value.
//!
//! Every struct starts with `status`, the communicator's [`DeviceStatus`] (abort flag and error
//! record), so the host launches every kernel the same way and every wait inside can be stopped.

use crate::{DevicePtr, DeviceStatus, FifoDeviceHandle};

/// `copy_kernel`: grid-stride copy of `bytes` bytes (16-byte vectors where both ends allow).
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct CopyParams {
    /// Abort flag and error record.
    pub status: DevicePtr<DeviceStatus>,
    /// Destination (local or peer-mapped).
    pub dst: DevicePtr<u8>,
    /// Source.
    pub src: DevicePtr<u8>,
    /// Bytes to copy.
    pub bytes: u64,
}

/// `block_sum_kernel`: block `b` sums `input[b*n .. (b+1)*n]` through shared memory and
/// `sync_threads`, writing `output[b]` (a test of per-block shared memory and barriers).
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockSumParams {
    /// Abort flag and error record.
    pub status: DevicePtr<DeviceStatus>,
    /// `grid_dim * n_per_block` inputs.
    pub input: DevicePtr<u32>,
    /// `grid_dim` outputs.
    pub output: DevicePtr<u32>,
    /// Elements per block.
    pub n_per_block: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

/// `fifo_push_kernel`: every thread pushes `per_thread` triggers (test and benchmark of the
/// FIFO). Trigger `i` of thread `t` carries `size = t`, `src_offset = i`, type DATA.
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct FifoPushParams {
    /// Abort flag and error record.
    pub status: DevicePtr<DeviceStatus>,
    /// The FIFO to push to.
    pub fifo: FifoDeviceHandle,
    /// Triggers each thread pushes.
    pub per_thread: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

static_assertions::assert_eq_size!(CopyParams, [u64; 4]);
static_assertions::assert_eq_size!(BlockSumParams, [u64; 4]);
static_assertions::assert_eq_size!(FifoPushParams, [u64; 9]);

/// `memory_ping_pong_kernel` and `packet_ping_pong_kernel`: two ranks bounce `bytes` bytes
/// back and forth `iterations` times over a MemoryChannel (one block). Rank role 0 starts.
/// The packet variant sends LL16 packets into the peer's packet buffer (flag = round + 1 +
/// `flag_base`); the plain variant puts into the peer's buffer and signals.
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct PingPongParams {
    /// Abort flag and error record.
    pub status: DevicePtr<DeviceStatus>,
    /// The channel to the peer.
    pub channel: crate::MemoryChannelDeviceHandle,
    /// Bytes per message.
    pub bytes: u64,
    /// Round trips.
    pub iterations: u32,
    /// 0: send first; 1: answer.
    pub role: u32,
    /// Added to every packet flag (so repeated runs over one buffer use fresh flags).
    pub flag_base: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

/// `port_ping_pong_kernel`: as [`PingPongParams`], over a PortChannel (one thread): each side
/// puts `bytes` with a signal through its proxy and waits for the peer's signal.
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct PortPingPongParams {
    /// Abort flag and error record.
    pub status: DevicePtr<DeviceStatus>,
    /// The channel to the peer.
    pub channel: crate::PortChannelDeviceHandle,
    /// Bytes per message.
    pub bytes: u64,
    /// Round trips.
    pub iterations: u32,
    /// 0: send first; 1: answer.
    pub role: u32,
    /// Non-zero: flush after every put (exercises SYNC triggers).
    pub flush: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

static_assertions::assert_eq_size!(PingPongParams, [u64; 11]);
static_assertions::assert_eq_size!(PortPingPongParams, [u64; 16]);
