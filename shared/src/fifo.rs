//! `FifoDeviceHandle`: the device's view of one proxy FIFO (single consumer, many producers).
//!
//! | word              | lives in              | written by | read by | ordering |
//! |-------------------|-----------------------|------------|---------|----------|
//! | `triggers[N]`     | host-pinned, mapped   | GPU producers | proxy thread | device: one 16-byte `st.release.sys` per slot; host: acquire load of `snd`, then `fst` |
//! | `tail`            | host-pinned, mapped   | proxy (pop: release store of `tail + 1`) | producers waiting for a slot | device: `ld.acquire.sys` |
//! | `head`            | device memory         | producers: `atom.add.relaxed.gpu` | producers | relaxed: it only hands out positions |
//! | `tail_cache`      | device memory         | producers (after reading `tail`) | producers | relaxed; it is a hint, `tail` is the truth |
//! | `flush_done_pos`  | host-pinned, mapped (one per FIFO: the proxy serves triggers in order, so one monotonic position covers every connection) | proxy: release store of `pos + 1` after a SYNC at `pos` | device `flush`/`sync` | device: `ld.acquire.sys` |
//!
//! Push: `pos = atom.add(head, 1)`; while `pos >= N + tail_cache`, reload `tail` (acquire) into
//! `tail_cache`; write the trigger with commit bit `((pos >> log2 N) & 1) ^ 1` in one 16-byte
//! release store. The proxy sees slot `tail % N` ready when its commit bit equals the parity of
//! `tail`'s lap, so a zeroed buffer reads as empty, a torn 16-byte store cannot happen (it is
//! one vector store), and slots never need clearing.
//!
//! Concurrent pushers must not outnumber N: a pusher that took position `p >= N + tail` waits
//! for the consumer, and the consumer only moves once the pusher at `tail` has published.

use crate::{DevicePtr, DeviceStatus, ProxyTrigger};

/// Default number of FIFO slots.
pub const DEFAULT_FIFO_SIZE: u32 = 512;

/// Device handle of one FIFO.
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct FifoDeviceHandle {
    /// `N` trigger slots (host-pinned, device-mapped).
    pub triggers: DevicePtr<ProxyTrigger>,
    /// Consumer position (host-pinned, device-mapped).
    pub tail: DevicePtr<u64>,
    /// Producer position counter (device memory).
    pub head: DevicePtr<u64>,
    /// Producers' last seen `tail` (device memory).
    pub tail_cache: DevicePtr<u64>,
    /// Completed flush position: the proxy stores `pos + 1` after the SYNC pushed at `pos`
    /// (host-pinned, device-mapped).
    pub flush_done_pos: DevicePtr<u64>,
    /// Abort flag and error record for waits on this FIFO.
    pub status: DevicePtr<DeviceStatus>,
    /// `N`, a power of two.
    pub size: u32,
    /// `log2(N)`.
    pub log2_size: u32,
}

static_assertions::assert_eq_size!(FifoDeviceHandle, [u64; 7]);
static_assertions::const_assert_eq!(core::mem::align_of::<FifoDeviceHandle>(), 8);
