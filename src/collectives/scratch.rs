//! The layout of the communicator's scratch: one buffer per rank, which every peer maps, cut
//! into the regions the algorithms ask for (`CollectiveAlgorithm::SCRATCH`), in this order:
//!
//! | region | size | written by | read by |
//! |---|---|---|---|
//! | LL16 | two halves (by the launch flag's parity) of `n` slots of `ll_slot_bytes` | peer `q` writes its packets into slot `q` (LL16 stores that carry their flag) | this rank's LL kernels, polling the flags |
//! | LL128 | two halves of `n` slots of `ll128_slot_bytes` | peers, a warp's 128-byte lines whose last word is the flag | this rank's LL128 kernels |
//! | staging | `stage_bytes + 16 n` | this rank's staged kernel (its input, in pieces) | the peers' staged kernels, after a block barrier |
//! | port (worlds of several nodes only) | `3 n + 1` slots of `port_slot_bytes`: `n` send slots, `2 n` receive slots (two per sender), one accumulator | this rank's port kernel (send slots, accumulator); the peers' proxies (receive slot `(q, parity)` by rank `q`'s) | this rank's proxy (send slots), its port kernel (receive slots, accumulator) |
//! | point-to-point | `P2pLayout::bytes` (per peer: an inbox, its acknowledgements and this rank's counters) | the peers' `p2p_kernel` (inboxes, acknowledgements) and this rank's (counters) | `mscclpp_shared::p2p` says who reads what |
//!
//! The copy-engine all-reduce's scratch is a buffer of its own (`ce_scratch_bytes`, allocated
//! on its first call and exchanged like a caller's buffer, so that a communicator that never
//! runs it never allocates it); this type carries its size too, so that every algorithm finds
//! its scratch here. A region no registered algorithm asks for takes no space. A world of one
//! node holds every region but the port region; a world of several nodes holds only the port
//! region (the others' algorithms load and store the peers' memory, which needs one node).

use mscclpp_shared::P2pLayout;
use mscclpp_shared::packet::ll128;

use super::CollectiveConfig;

/// A region of the scratch an algorithm uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Region {
    /// LL16 packets.
    Ll,
    /// LL128 lines.
    Ll128,
    /// Staging.
    Staging,
    /// The copy-engine all-reduce's own buffer.
    CopyEngine,
    /// The port region (worlds of several nodes).
    Port,
    /// The point-to-point engine's inboxes, acknowledgements and counters.
    P2p,
}

/// Where each region lies (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ScratchLayout {
    ll_slot_bytes: u64,
    ll128_offset: u64,
    ll128_slot_bytes: u64,
    stage_offset: u64,
    stage_bytes: usize,
    port_offset: u64,
    port_slot_bytes: u64,
    p2p_offset: u64,
    p2p: P2pLayout,
    len: usize,
    ce_bytes: usize,
}

impl ScratchLayout {
    /// The layout for `ranks` ranks with `cfg`, holding the regions `needed` says some
    /// algorithm uses.
    pub fn new(cfg: &CollectiveConfig, ranks: usize, needed: impl Fn(Region) -> bool) -> Self {
        let n = ranks as u64;
        let ll_slot_bytes = if needed(Region::Ll) {
            (up16(cfg.ll_max_bytes).div_ceil(8) * 16) as u64
        } else {
            0
        };
        let ll128_offset = 2 * n * ll_slot_bytes;
        let ll128_slot_bytes = if needed(Region::Ll128) {
            ll128::line_bytes_for(cfg.ll128_max_bytes) as u64
        } else {
            0
        };
        let stage_offset = ll128_offset + 2 * n * ll128_slot_bytes;
        let stage_bytes = if needed(Region::Staging) {
            cfg.stage_bytes + 16 * ranks
        } else {
            0
        };
        let ce_bytes = if needed(Region::CopyEngine) {
            cfg.ce_scratch_bytes
        } else {
            0
        };
        let p2p_offset = stage_offset + up16(stage_bytes) as u64;
        let p2p = P2pLayout {
            nranks: n,
            // A configuration built by hand may hold anything: the kernel serves 1 to
            // P2P_MAX_LANES lanes (every rank clamps alike).
            lanes: cfg.p2p_lanes.clamp(1, mscclpp_shared::P2P_MAX_LANES) as u64,
            ll_bytes: (cfg.p2p_ll_bytes & !7) as u64,
            chunk_bytes: (up16(cfg.p2p_chunk_bytes.max(16))) as u64,
        };
        let p2p_bytes = if needed(Region::P2p) { p2p.bytes() } else { 0 };
        let port_offset = p2p_offset + up16(p2p_bytes as usize) as u64;
        let port_slot_bytes = if needed(Region::Port) {
            (cfg.port_slot_bytes.max(16) & !15) as u64
        } else {
            0
        };
        Self {
            ll_slot_bytes,
            ll128_offset,
            ll128_slot_bytes,
            stage_offset,
            stage_bytes,
            p2p_offset,
            p2p,
            port_offset,
            port_slot_bytes,
            len: (port_offset + (3 * n + 1) * port_slot_bytes) as usize,
            ce_bytes,
        }
    }

    /// The layout of a world of one node: every region the registered algorithms ask for but
    /// the port region.
    pub fn for_registered(cfg: &CollectiveConfig, ranks: usize) -> Self {
        Self::new(cfg, ranks, |r| {
            r != Region::Port && super::algo::UNITS.iter().any(|u| u.scratch.contains(&r))
        })
    }

    /// The layout of a world of several nodes: the port region only.
    pub fn for_nodes(cfg: &CollectiveConfig, ranks: usize) -> Self {
        Self::new(cfg, ranks, |r| r == Region::Port)
    }

    /// Offset of the port region.
    pub fn port_offset(&self) -> u64 {
        self.port_offset
    }

    /// Bytes of one slot of the port region (0 without it).
    pub fn port_slot_bytes(&self) -> u64 {
        self.port_slot_bytes
    }

    /// Bytes of one rank's LL16 slot (the region starts at 0).
    pub fn ll_slot_bytes(&self) -> u64 {
        self.ll_slot_bytes
    }

    /// Offset of the LL128 region.
    pub fn ll128_offset(&self) -> u64 {
        self.ll128_offset
    }

    /// Bytes of one rank's LL128 slot.
    pub fn ll128_slot_bytes(&self) -> u64 {
        self.ll128_slot_bytes
    }

    /// Offset of the staging region.
    pub fn stage_offset(&self) -> u64 {
        self.stage_offset
    }

    /// Offset of the point-to-point region.
    pub fn p2p_offset(&self) -> u64 {
        self.p2p_offset
    }

    /// The point-to-point region's layout.
    pub fn p2p(&self) -> P2pLayout {
        self.p2p
    }

    /// Bytes of the scratch buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Bytes of the copy-engine all-reduce's own scratch.
    pub fn ce_bytes(&self) -> usize {
        self.ce_bytes
    }
}

/// Rounds up to a multiple of 16.
pub(crate) fn up16(x: usize) -> usize {
    (x + 15) & !15
}
