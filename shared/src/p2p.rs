//! The point-to-point engine's layouts: [`P2pParams`] (what `p2p_kernel` takes) and
//! [`P2pLayout`] (where its words and slots lie in every rank's scratch), shared by the host
//! (which sizes the scratch and fills the parameters) and the kernel (which addresses it).
//!
//! A message from rank `s` to rank `r` travels on `lanes` independent lanes. Each lane carries,
//! per message, one LL16 header packet (the sender's byte count, flag = the lane's message
//! sequence number), and then either nothing more (lane > 0 of a small message), the message as
//! LL16 packets (lane 0 of a small message: at most `ll_bytes`), or its share of the message's
//! chunks (large messages: chunk `k` of `chunk_bytes` on lane `k % lanes`). The receiver reads
//! the header first and follows what the *sender's* count says, so a receive posted with
//! another count still consumes the message (and reports [`DeviceErrorCode::CountMismatch`](crate::DeviceErrorCode::CountMismatch),
//! writing nothing): both ends stay in step whatever the counts.
//!
//! The region of rank `r`'s scratch at [`P2pParams::region_offset`] holds, in this order:
//!
//! | part | per peer `q`, per lane `l` | written by | read by | ordering |
//! |---|---|---|---|---|
//! | inbox from `q`: header | 2 LL16 packets (by the sequence's parity) | `q` (sender), 16-byte volatile store | `r`, volatile loads until both flags match | the packet's flags |
//! | inbox from `q`: `ready` | u64: chunks of this lane written so far | `q`, `st.release.sys` after its block's `bar.sync` | `r`, `ld.acquire.sys` by thread 0, then `bar.sync` | release / acquire |
//! | inbox from `q`: LL data | (lane 0 only) 2 halves of `ll_bytes / 8` LL16 packets | `q` | `r` | the packets' flags |
//! | inbox from `q`: chunks | 2 slots of `chunk_bytes` | `q`, plain stores | `r`, plain loads, after `ready` | ordered by `ready` / `chunk_done` |
//! | acks from `q`: `hdr_done` | u64: last message whose header (and LL data) `q` consumed | `q` (receiver of `r`'s sends), `st.release.sys` | `r` before reusing a header half, `ld.acquire.sys` | release / acquire |
//! | acks from `q`: `chunk_done` | u64: chunks of this lane `q` consumed | `q`, `st.release.sys` | `r` before reusing a chunk slot | release / acquire |
//! | state for `q` | 4 u64: `send_seq`, `recv_seq`, `send_chunks`, `recv_chunks` | `r`'s own kernel (thread 0 of the one block serving the lane, at its end) | `r`'s kernel (every thread of that block, at its start) | kernel boundaries (stream order) |
//!
//! Flow control: a sender writes message `m`'s header (and LL data) into half `m & 1` only once
//! `hdr_done >= m - 2`, and chunk number `c` (counted per lane over all messages, from 1) into
//! slot `c & 1` only once `chunk_done >= c - 2`; so a sender runs at most two messages (or two
//! chunks) ahead of its receiver and never overwrites what the receiver has not read. Flags and
//! counters only grow (sequence numbers start at 1 in zeroed memory), so a stale packet never
//! matches. All of this is device memory: nothing needs the host between calls, and a call
//! captured in a CUDA graph replays with fresh sequence numbers.
//!
//! Teardown: who may still write into a rank's region after its call returned (its stream
//! synchronized), and how dropping the region waits for it.
//!
//! - Into a *sender's* region: yes. A sender's kernel ends once it has written its last
//!   header, LL data or chunk and `ready` (it waits only for acknowledgements older than the
//!   last two messages or chunks), so the receiver's `chunk_done` stores for the last chunks
//!   and its `hdr_done` stores for the last messages may land after the sender's call
//!   returned — with ranks as threads, into freed memory if the sender had already freed its
//!   scratch. So before the host frees a region (dropping the `Collectives` that owns it, a
//!   split communicator's included), it reads its own words and waits, bounded, until for
//!   every peer `q` and lane `l`: `hdr_done(q, l) >= send_seq` and `chunk_done(q, l) >=
//!   send_chunks` of its state for `q` (a pair never used has all four at 0). If a receiver
//!   never posts its receive, or fails, or is slower than the wait, the wait expires, is
//!   logged, and the region is never freed (kept allocated for the rest of the process, so
//!   that a late store lands in live memory).
//! - Into a *receiver's* region: no. Everything a sender writes there for a message (the
//!   header, LL data, chunks, `ready`) the receiver's kernel waits for and reads before it
//!   ends (it follows the sender's count even when its own differs), so once the receiver's
//!   call completed, no store of its senders is still on the way. The exceptions break the
//!   protocol's contract: a send no receive matches, or a receive that gave up (the abort
//!   flag, a spin limit).

use crate::{DevicePtr, DeviceStatus, MemoryChannelDeviceHandle, TraceDeviceHandle};

/// Most operations one launch of `p2p_kernel` carries: a send and a receive for each of 8
/// peers (a group with more peers runs in several launches, see the host's schedule).
pub const P2P_MAX_OPS: usize = 16;

/// Most lanes a message travels on.
pub const P2P_MAX_LANES: u32 = 8;

/// [`P2pOp::kind`]: a send.
pub const P2P_SEND: u32 = 0;
/// [`P2pOp::kind`]: a receive.
pub const P2P_RECV: u32 = 1;

/// One send or receive of a `p2p_kernel` launch.
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct P2pOp {
    /// The input (send) or output (receive): `bytes` long; may be null when `bytes` is 0.
    pub buf: DevicePtr<u8>,
    /// This side's byte count (a receive compares it with the sender's).
    pub bytes: u64,
    /// The peer rank (never this rank: the host copies to itself).
    pub peer: u32,
    /// [`P2P_SEND`] or [`P2P_RECV`].
    pub kind: u32,
    /// The first block serving it.
    pub first_block: u32,
    /// How many blocks serve it (block `first_block + i` serves lanes `i, i + blocks, …`).
    pub blocks: u32,
}

static_assertions::assert_eq_size!(P2pOp, [u64; 4]);

/// Parameters of `p2p_kernel`: up to [`P2P_MAX_OPS`] sends and receives, each with its peer,
/// run together (at most one send and one receive per peer in a launch).
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct P2pParams {
    /// Abort flag and error record.
    pub status: DevicePtr<DeviceStatus>,
    /// The collectives' channel table: row 0's `dst` of peer `q` is `q`'s scratch, mapped here.
    pub channels: DevicePtr<MemoryChannelDeviceHandle>,
    /// This rank's scratch.
    pub scratch: DevicePtr<u8>,
    /// Offset of the point-to-point region in every rank's scratch ([`P2pLayout`]).
    pub region_offset: u64,
    /// Largest message sent as LL16 packets (a multiple of 8).
    pub ll_bytes: u64,
    /// Bytes of a chunk of a larger message (a multiple of 16).
    pub chunk_bytes: u64,
    /// This rank.
    pub rank: u32,
    /// Ranks of the communicator.
    pub nranks: u32,
    /// Lanes per message (1 to [`P2P_MAX_LANES`]).
    pub lanes: u32,
    /// Entries of `ops` in use.
    pub nops: u32,
    /// The launch's operations.
    pub ops: [P2pOp; P2P_MAX_OPS],
    /// Where the blocks' trace events go ([`TraceDeviceHandle::OFF`]: not traced).
    pub trace: TraceDeviceHandle,
}

static_assertions::assert_eq_size!(P2pParams, [u64; 8 + 4 * P2P_MAX_OPS + 3]);

impl Default for P2pParams {
    fn default() -> Self {
        bytemuck::Zeroable::zeroed()
    }
}

impl P2pParams {
    /// The layout of the region these parameters address.
    pub const fn layout(&self) -> P2pLayout {
        P2pLayout {
            nranks: self.nranks as u64,
            lanes: self.lanes as u64,
            ll_bytes: self.ll_bytes,
            chunk_bytes: self.chunk_bytes,
        }
    }
}

/// Where the point-to-point region's parts lie (module docs), as offsets from the region's
/// start in any rank's scratch.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct P2pLayout {
    /// Ranks.
    pub nranks: u64,
    /// Lanes per message.
    pub lanes: u64,
    /// Largest LL message (a multiple of 8).
    pub ll_bytes: u64,
    /// Bytes of a chunk (a multiple of 16).
    pub chunk_bytes: u64,
}

/// Rounds up to a multiple of 16.
const fn up16(x: u64) -> u64 {
    (x + 15) & !15
}

impl P2pLayout {
    /// Bytes of one half of the LL data area (one LL16 packet per 8 bytes).
    pub const fn ll_half_bytes(&self) -> u64 {
        self.ll_bytes.div_ceil(8) * 16
    }

    /// Bytes of one inbox (what one peer writes here).
    pub const fn inbox_bytes(&self) -> u64 {
        self.lanes * 32
            + up16(self.lanes * 8)
            + 2 * self.ll_half_bytes()
            + 2 * self.lanes * self.chunk_bytes
    }

    /// Bytes of one peer's acknowledgements.
    pub const fn acks_bytes(&self) -> u64 {
        self.lanes * 16
    }

    /// Bytes of one peer's local state.
    pub const fn state_bytes(&self) -> u64 {
        self.lanes * 32
    }

    /// Bytes of the whole region.
    pub const fn bytes(&self) -> u64 {
        self.nranks * (self.inbox_bytes() + self.acks_bytes() + self.state_bytes())
    }

    /// The inbox written by rank `from`.
    pub const fn inbox(&self, from: u64) -> u64 {
        from * self.inbox_bytes()
    }

    /// Header packet of lane `lane`, half `half`, in the inbox written by `from`.
    pub const fn header(&self, from: u64, lane: u64, half: u64) -> u64 {
        self.inbox(from) + (lane * 2 + half) * 16
    }

    /// The `ready` counter of lane `lane` in the inbox written by `from`.
    pub const fn ready(&self, from: u64, lane: u64) -> u64 {
        self.inbox(from) + self.lanes * 32 + lane * 8
    }

    /// LL data half `half` in the inbox written by `from`.
    pub const fn ll_data(&self, from: u64, half: u64) -> u64 {
        self.inbox(from) + self.lanes * 32 + up16(self.lanes * 8) + half * self.ll_half_bytes()
    }

    /// Chunk slot `slot` of lane `lane` in the inbox written by `from`.
    pub const fn chunk(&self, from: u64, lane: u64, slot: u64) -> u64 {
        self.inbox(from)
            + self.lanes * 32
            + up16(self.lanes * 8)
            + 2 * self.ll_half_bytes()
            + (lane * 2 + slot) * self.chunk_bytes
    }

    /// The `hdr_done` word of lane `lane` written by `from` (a receiver of this rank's sends).
    pub const fn hdr_done(&self, from: u64, lane: u64) -> u64 {
        self.nranks * self.inbox_bytes() + from * self.acks_bytes() + lane * 16
    }

    /// The `chunk_done` word of lane `lane` written by `from`.
    pub const fn chunk_done(&self, from: u64, lane: u64) -> u64 {
        self.hdr_done(from, lane) + 8
    }

    /// This rank's state word `word` (0 `send_seq`, 1 `recv_seq`, 2 `send_chunks`, 3
    /// `recv_chunks`) of lane `lane` for peer `peer`.
    pub const fn state(&self, peer: u64, lane: u64, word: u64) -> u64 {
        self.nranks * (self.inbox_bytes() + self.acks_bytes())
            + peer * self.state_bytes()
            + lane * 32
            + word * 8
    }
}

/// The state words of [`P2pLayout::state`].
pub mod state {
    /// Messages sent on the lane.
    pub const SEND_SEQ: u64 = 0;
    /// Messages received on the lane.
    pub const RECV_SEQ: u64 = 1;
    /// Chunks sent on the lane.
    pub const SEND_CHUNKS: u64 = 2;
    /// Chunks received on the lane.
    pub const RECV_CHUNKS: u64 = 3;
}

#[cfg(test)]
mod tests {
    use super::P2pLayout;

    /// The parts of the region do not overlap, and every one is aligned for what it holds.
    #[test]
    fn parts_are_disjoint_and_aligned() {
        let l = P2pLayout {
            nranks: 3,
            lanes: 3,
            ll_bytes: 40,
            chunk_bytes: 48,
        };
        let mut parts: [(u64, u64); 128] = [(0, 0); 128];
        let mut k = 0;
        let mut add = |at: u64, len: u64, align: u64| {
            assert!(at.is_multiple_of(align), "{at} not aligned to {align}");
            parts[k] = (at, len);
            k += 1;
        };
        for q in 0..3 {
            for lane in 0..3 {
                for half in 0..2 {
                    add(l.header(q, lane, half), 16, 16);
                    add(l.chunk(q, lane, half), l.chunk_bytes, 16);
                }
                add(l.ready(q, lane), 8, 8);
                add(l.hdr_done(q, lane), 8, 8);
                add(l.chunk_done(q, lane), 8, 8);
                add(l.state(q, lane, 0), 32, 8);
            }
            add(l.ll_data(q, 0), l.ll_half_bytes(), 16);
            add(l.ll_data(q, 1), l.ll_half_bytes(), 16);
        }
        let parts = &mut parts[..k];
        parts.sort_unstable();
        for w in parts.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "{:?} overlaps {:?}", w[0], w[1]);
        }
        let (last, len) = parts[k - 1];
        assert!(last + len <= l.bytes());
    }
}
