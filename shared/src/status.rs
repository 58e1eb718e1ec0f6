//! `DeviceStatus`: how the host stops GPU waiters and how kernels say why they stopped.
//!
//! One `DeviceStatus` per communicator (and one per proxy FIFO), in host-pinned, device-mapped
//! memory, so both sides read it at any time without a copy:
//!
//! | word           | written by | read by | ordering |
//! |----------------|------------|---------|----------|
//! | `abort`        | host (user abort, health monitor, proxy error) | every device spin loop, every few thousand iterations | host: release store; device: `ld.relaxed.sys` (it only needs to be seen eventually) |
//! | `error_code`   | device: first failing wait, by compare-and-swap from 0 | host after a kernel (or at any time) | device: `atom.cas.relaxed.sys`, then `fence.sc.sys`; host: acquire load |
//! | `error_detail` | the device thread that won the `error_code` CAS | host, after reading a non-zero code | plain store before the fence above |
//! | `spin_limit`   | host, before any kernel that uses the status is launched | device spin loops | plain (written once, before launch) |
//!
//! A spin loop that sees `abort != 0` records [`DeviceErrorCode::Aborted`]; one that spins more
//! than `spin_limit` iterations (0 = no limit, abort only) records [`DeviceErrorCode::Timeout`].
//! Either way it returns at once, and the host turns the code into a typed error.

/// Why a device wait gave up; stored in `DeviceStatus::error_code`.
#[repr(u32)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DeviceErrorCode {
    /// No error.
    None = 0,
    /// The host set the abort flag.
    Aborted = 1,
    /// A spin exceeded `spin_limit` iterations.
    Timeout = 2,
    /// A device API call got an argument it cannot serve (detail says which).
    InvalidArgument = 3,
    /// A point-to-point receive got a message of another byte count than it was posted with
    /// (detail: [`count_mismatch_detail`]); it consumed the message and wrote nothing.
    CountMismatch = 4,
}

impl DeviceErrorCode {
    /// From the raw word; unknown values are reported as `None` (the host treats them as an error
    /// of their own, see the host's status reader).
    pub const fn from_u32(v: u32) -> Option<Self> {
        match v {
            0 => Some(Self::None),
            1 => Some(Self::Aborted),
            2 => Some(Self::Timeout),
            3 => Some(Self::InvalidArgument),
            4 => Some(Self::CountMismatch),
            _ => None,
        }
    }
}

/// What a wait was waiting on when it gave up; stored in the top byte of `error_detail`, the
/// low 56 bits hold the address of the word it watched.
#[repr(u8)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum WaitSite {
    /// Nothing recorded.
    Unknown = 0,
    /// FIFO push waiting for a free slot (`tail`).
    FifoPush = 1,
    /// FIFO sync/flush waiting for the proxy.
    FifoSync = 2,
    /// Semaphore wait (`inbound`).
    Semaphore = 3,
    /// LL packet flag wait.
    Packet = 4,
    /// Grid-wide barrier.
    GridBarrier = 5,
}

/// Packs a wait site and an address into `error_detail`.
pub const fn error_detail(site: WaitSite, addr: u64) -> u64 {
    ((site as u64) << 56) | (addr & ((1 << 56) - 1))
}

/// Bits of [`count_mismatch_detail`] that hold the byte count (above them: the peer).
pub const COUNT_MISMATCH_BYTES_BITS: u32 = 44;

/// `error_detail` of [`DeviceErrorCode::CountMismatch`]: the sending peer in bits 44..56 (the
/// top byte, the wait site, stays 0) and the byte count it sent in bits 0..44 (saturated).
pub const fn count_mismatch_detail(peer: u32, sent_bytes: u64) -> u64 {
    let max = (1u64 << COUNT_MISMATCH_BYTES_BITS) - 1;
    let bytes = if sent_bytes > max { max } else { sent_bytes };
    ((peer as u64 & 0xfff) << COUNT_MISMATCH_BYTES_BITS) | bytes
}

/// The (peer, sent bytes) of a [`count_mismatch_detail`].
pub const fn count_mismatch_parts(detail: u64) -> (u32, u64) {
    (
        ((detail >> COUNT_MISMATCH_BYTES_BITS) & 0xfff) as u32,
        detail & ((1u64 << COUNT_MISMATCH_BYTES_BITS) - 1),
    )
}

/// Abort flag and first-error record shared by the host and all kernels of a communicator.
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct DeviceStatus {
    /// Non-zero: every device wait stops. Host writes, device reads.
    pub abort: u32,
    /// First [`DeviceErrorCode`] recorded by any device thread (0 = none).
    pub error_code: u32,
    /// [`error_detail`] of that first error.
    pub error_detail: u64,
    /// Spin iterations a device wait may take before it records `Timeout` (0 = unbounded, abort
    /// only).
    pub spin_limit: u64,
    /// Reserved, zero.
    pub reserved: u64,
}

static_assertions::assert_eq_size!(DeviceStatus, [u64; 4]);
static_assertions::const_assert_eq!(core::mem::align_of::<DeviceStatus>(), 8);
