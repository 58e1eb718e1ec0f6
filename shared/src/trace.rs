//! The trace layouts: where kernels write their block events, and the clock-sync words.
//!
//! Tracing is off unless the host hands a kernel a [`TraceDeviceHandle`] whose `events` is not
//! null; every kernel parameter struct that can be traced carries one (by value, last), and a
//! null `events` is the whole off path: the device checks it once per hook and does nothing
//! else.
//!
//! # The event rings (device memory)
//!
//! `events` points at `rings` rings, one per block index; ring `b` holds `1 << log2_records`
//! launch records of [`EVENTS_PER_LAUNCH`] [`TraceEvent`]s, one slot per
//! [`TraceEventKind`]. Launch `l` of block `b` writes kind `k` into slot
//! [`event_slot`]`(b, l, k, log2_records)`, so:
//!
//! | word | written by | read by | ordering |
//! |---|---|---|---|
//! | a slot's `time_ns` then its tag word (`launch`, `kind`, `block`) | thread 0 of block `b` of launch `l` only: no other thread writes the slot until launch `l + (1 << log2_records)` | the host, after the launch completed (a stream or device synchronisation), or at any time for a best-effort dump | two relaxed 8-byte stores, no atomics and no reads on the device |
//!
//! A record is reused by the launch `1 << log2_records` later (the oldest launch is dropped;
//! the host counts the launches it handed out, so it knows how many were dropped). A slot
//! whose `launch` is not the launch the host expects there (a hook the kernel did not reach, an
//! older launch's leftover) is ignored. Blocks at or above `rings` record nothing. Launch ids
//! start at 1 (0 marks a slot never written) and wrap after 2^32 launches.
//!
//! # The clock-sync words (host-mapped memory)
//!
//! `trace_clock_kernel` (one thread) lets the host pair its clock with the device's
//! (`%globaltimer`, or the CPU backend's monotonic clock), as NPKit's time-sync events do:
//! [`TraceClockParams::words`] holds `2 + rounds` u64:
//!
//! | word | written by | read by | ordering |
//! |---|---|---|---|
//! | `[0]` ping: rounds the host asked for | host | the kernel, spinning | host release store; device `ld.acquire.sys` |
//! | `[2 + i]` the device time of round `i` | the kernel | host, after `[1]` says so | device relaxed store before the release below |
//! | `[1]` pong: rounds answered | the kernel | host, spinning | device `st.release.sys`; host acquire load |

use crate::{DevicePtr, DeviceStatus};

/// What a block event marks (the slot it takes in its launch record).
#[repr(u16)]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum TraceEventKind {
    /// Thread 0 entered the kernel.
    Start = 0,
    /// Thread 0 starts moving data to a peer (its first put, packet or copy of the call).
    Send = 1,
    /// Thread 0's last wait for a peer's data completed (it has everything it will read).
    Recv = 2,
    /// Thread 0 left the kernel.
    End = 3,
}

impl TraceEventKind {
    /// Every kind, in slot order.
    pub const ALL: [TraceEventKind; EVENTS_PER_LAUNCH] =
        [Self::Start, Self::Send, Self::Recv, Self::End];

    /// From the raw value in a [`TraceEvent`].
    pub const fn from_u16(v: u16) -> Option<Self> {
        match v {
            0 => Some(Self::Start),
            1 => Some(Self::Send),
            2 => Some(Self::Recv),
            3 => Some(Self::End),
            _ => None,
        }
    }

    /// Its name in trace files (`start`, `send`, `recv`, `end`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Start => "start",
            Self::Send => "send",
            Self::Recv => "recv",
            Self::End => "end",
        }
    }
}

/// Slots of one launch record: one per [`TraceEventKind`].
pub const EVENTS_PER_LAUNCH: usize = 4;

/// One block event as the device writes it: 16 bytes, two little-endian u64 words (the time,
/// then the tag).
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct TraceEvent {
    /// Device time in ns: `%globaltimer` on a GPU, the host's monotonic clock on the CPU backend.
    pub time_ns: u64,
    /// The launch ([`TraceDeviceHandle::launch`]); 0: never written.
    pub launch: u32,
    /// [`TraceEventKind`].
    pub kind: u16,
    /// The block (`blockIdx.x`).
    pub block: u16,
}

impl TraceEvent {
    /// The tag word (`launch | kind << 32 | block << 48`): what the device stores second.
    pub const fn tag(launch: u32, kind: TraceEventKind, block: u32) -> u64 {
        launch as u64 | (kind as u64) << 32 | ((block & 0xffff) as u64) << 48
    }
}

static_assertions::assert_eq_size!(TraceEvent, [u64; 2]);
static_assertions::const_assert_eq!(core::mem::align_of::<TraceEvent>(), 8);

/// Where a traced kernel writes its block events (module docs). All zero ([`OFF`](Self::OFF)):
/// tracing off.
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct TraceDeviceHandle {
    /// The rings (`rings << log2_records` records of [`EVENTS_PER_LAUNCH`] events); null: off.
    pub events: DevicePtr<TraceEvent>,
    /// This launch's id (from 1, wrapping).
    pub launch: u32,
    /// Launch records per ring, log2.
    pub log2_records: u32,
    /// Rings: blocks at or above record nothing.
    pub rings: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

impl TraceDeviceHandle {
    /// Tracing off.
    pub const OFF: Self = Self {
        events: DevicePtr::NULL,
        launch: 0,
        log2_records: 0,
        rings: 0,
        reserved: 0,
    };

    /// Whether this launch is traced.
    pub const fn is_on(&self) -> bool {
        !self.events.is_null()
    }
}

static_assertions::assert_eq_size!(TraceDeviceHandle, [u64; 3]);
static_assertions::const_assert_eq!(core::mem::align_of::<TraceDeviceHandle>(), 8);

/// The index in `events` of kind `kind` of launch `launch` of block `block` (module docs).
#[inline(always)]
pub const fn event_slot(block: u32, launch: u32, kind: TraceEventKind, log2_records: u32) -> u64 {
    let record = (launch as u64) & ((1u64 << log2_records) - 1);
    (((block as u64) << log2_records) + record) * EVENTS_PER_LAUNCH as u64 + kind as u64
}

/// `trace_clock_kernel`: one thread answers `rounds` pings of the host with its clock (module
/// docs: the words).
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct TraceClockParams {
    /// Abort flag and error record (the host aborts a sync it gave up on).
    pub status: DevicePtr<DeviceStatus>,
    /// `2 + rounds` u64 in host-mapped memory.
    pub words: DevicePtr<u64>,
    /// Pings to answer.
    pub rounds: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

static_assertions::assert_eq_size!(TraceClockParams, [u64; 3]);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_of_different_blocks_launches_and_kinds_never_meet() {
        let log2 = 3;
        let mut seen = [false; 4 * (1 << 3) * EVENTS_PER_LAUNCH];
        for block in 0..4 {
            for launch in 1..=(1 << log2) {
                for kind in TraceEventKind::ALL {
                    let s = event_slot(block, launch, kind, log2) as usize;
                    assert!(!seen[s], "slot {s} taken twice");
                    seen[s] = true;
                }
            }
        }
        assert!(seen.iter().all(|&s| s));
        // A launch `1 << log2` later reuses the record.
        assert_eq!(
            event_slot(2, 5, TraceEventKind::End, log2),
            event_slot(2, 5 + 8, TraceEventKind::End, log2)
        );
    }

    #[test]
    fn the_tag_word_is_the_struct_s_second_word() {
        let e = TraceEvent {
            time_ns: 7,
            launch: 0xdead_beef,
            kind: TraceEventKind::Recv as u16,
            block: 513,
        };
        let words: [u64; 2] = bytemuck::cast(e);
        assert_eq!(
            words,
            [7, TraceEvent::tag(0xdead_beef, TraceEventKind::Recv, 513)]
        );
        for k in TraceEventKind::ALL {
            assert_eq!(TraceEventKind::from_u16(k as u16), Some(k));
        }
        assert_eq!(TraceEventKind::from_u16(4), None);
    }
}
