//! The communicator's scratch: buffers every peer maps, cut into the regions the algorithms ask
//! for (`CollectiveAlgorithm::SCRATCH`). Only the set-up scratch (the LL16 region and the
//! descriptors; the port region in worlds of several nodes) is allocated when the collectives
//! are set up; every other region is a buffer of its own, allocated and exchanged with the
//! peers by the first call that needs it (`regions.rs`), so that a communicator pays only for
//! the algorithms it runs (a split's many small communicators, most of which never stage, and
//! a collective-only communicator, which never sends):
//!
//! | region | size | when | written by | read by |
//! |---|---|---|---|---|
//! | LL16 (the set-up scratch) | two halves (by the launch flag's parity) of `n - 1` slots of `ll_slot_bytes`, one per peer (`mscclpp_device::collectives::ll::slot_of`) | set-up | each peer its own slot (LL16 stores that carry their flag) | this rank's LL kernels, polling the flags |
//! | descriptors (in the set-up scratch, after LL16) | `max_blocks * n` descriptors of 64 bytes (at most `MAX_DIRECT_RANKS` ranks) | set-up | block `b` of peer `q`, its [`RegisteredCall`](mscclpp_shared::RegisteredCall) for a direct kernel on registered buffers | block `b` of this rank's direct kernel (`mscclpp_device::collectives::direct`) |
//! | point-to-point | `P2pLayout::bytes` (per peer: an inbox, its acknowledgements and this rank's counters) | first point-to-point call (traded with the peers of each batch as they are first met) | the peers' `p2p_kernel` (inboxes, acknowledgements) and this rank's (counters) | `mscclpp_shared::p2p` says who reads what |
//! | LL128 | two halves of `n` slots of `ll128_slot_bytes` | first LL128 call | peers, a warp's 128-byte lines whose last word is the flag | this rank's LL128 kernels |
//! | staging | `stage_bytes + 16 n` | first staged or `put` call | this rank's staged kernel (its input, in pieces) | the peers' staged kernels, after a block barrier |
//! | copy engine | `ce_scratch_bytes` | first copy-engine all-reduce | peers' copy engines | this rank's reductions |
//! | port (worlds of several nodes only; in the set-up scratch, after the descriptors) | `3 n + 1` slots of `port_slot_bytes`: `n` send slots, `2 n` receive slots (two per sender), one accumulator | set-up | this rank's port kernel (send slots, accumulator); the peers' proxies (receive slots) | this rank's port kernel |
//!
//! Every lazily allocated region starts at offset 0 of its buffer (the kernels' `ll128_offset`
//! and `stage_offset`, and the point-to-point engine's `region_offset`, are 0), and a kernel's
//! `scratch` and channel table are its region's
//! ([`Context::params_in`](super::context::Context::params_in)). A region no registered
//! algorithm asks for takes no space. A world of one node holds every region but the port
//! region; a world of several nodes holds only the port region (the others' algorithms load
//! and store the peers' memory, which needs one node), in its set-up scratch.
//!
//! Freeing: every region goes with the `Collectives`' context; before, the `Collectives`'
//! drop lets every algorithm tear down (the point-to-point engine waits, bounded, for the
//! acknowledgements the peers still owe this rank's last sends, which they store into its
//! point-to-point region: `algo::p2p::drain`; "Teardown" in `mscclpp_shared::p2p`).
//!
//! `memory_plan` (`algo/mod.rs`, which asks the algorithms what they use) says what each costs
//! for a configuration and a number of ranks (`mscclpp-info` prints it).

use mscclpp_shared::P2pLayout;
use mscclpp_shared::packet::ll128;

use super::config::CollectiveConfig;

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

impl Region {
    /// Its name, as tools print it.
    pub fn name(self) -> &'static str {
        match self {
            Region::Ll => "LL16 packets",
            Region::Ll128 => "LL128 lines",
            Region::Staging => "staging",
            Region::CopyEngine => "copy-engine all-reduce scratch",
            Region::P2p => "point-to-point",
            Region::Port => "port slots",
        }
    }
}

/// Where each region lies (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ScratchLayout {
    ranks: usize,
    desc_bytes: usize,
    ll_slot_bytes: u64,
    ll128_slot_bytes: u64,
    stage_bytes: usize,
    port_slot_bytes: u64,
    p2p: P2pLayout,
    p2p_bytes: usize,
    ce_bytes: usize,
}

impl ScratchLayout {
    /// The layout for `ranks` ranks with `cfg` and `rows` rows of channels (descriptors: one
    /// per row and rank), holding the regions `needed` says some algorithm uses.
    pub fn new(
        cfg: &CollectiveConfig,
        ranks: usize,
        rows: u32,
        needed: impl Fn(Region) -> bool,
    ) -> Self {
        let ll_slot_bytes = if needed(Region::Ll) {
            (up16(cfg.ll_max_bytes).div_ceil(8) * 16) as u64
        } else {
            0
        };
        let ll128_slot_bytes = if needed(Region::Ll128) {
            ll128::line_bytes_for(cfg.ll128_max_bytes) as u64
        } else {
            0
        };
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
        // The direct kernel's descriptors: a world of one node (no port region) of at most
        // MAX_DIRECT_RANKS ranks.
        let desc_bytes = if !needed(Region::Port) && ranks <= mscclpp_shared::MAX_DIRECT_RANKS {
            rows as usize * ranks * mscclpp_shared::REGISTERED_CALL_BYTES
        } else {
            0
        };
        let p2p = P2pLayout {
            nranks: ranks as u64,
            // A configuration built by hand may hold anything: the kernel serves 1 to
            // P2P_MAX_LANES lanes (every rank clamps alike).
            lanes: cfg.p2p_lanes.clamp(1, mscclpp_shared::P2P_MAX_LANES) as u64,
            ll_bytes: (cfg.p2p_ll_bytes & !7) as u64,
            chunk_bytes: (up16(cfg.p2p_chunk_bytes.max(16))) as u64,
        };
        let p2p_bytes = if needed(Region::P2p) {
            p2p.bytes() as usize
        } else {
            0
        };
        let port_slot_bytes = if needed(Region::Port) {
            (cfg.port_slot_bytes.max(16) & !15) as u64
        } else {
            0
        };
        Self {
            ranks,
            desc_bytes,
            ll_slot_bytes,
            ll128_slot_bytes,
            stage_bytes,
            p2p,
            p2p_bytes,
            port_slot_bytes,
            ce_bytes,
        }
    }

    /// The layout of a world of several nodes: the port region only.
    pub fn for_nodes(cfg: &CollectiveConfig, ranks: usize) -> Self {
        Self::new(cfg, ranks, 0, |r| r == Region::Port)
    }

    /// Offset of the port region in the set-up scratch (after the descriptors).
    pub fn port_offset(&self) -> u64 {
        up16(self.desc_offset() as usize + self.desc_bytes) as u64
    }

    /// Bytes of one slot of the port region (0 without it).
    pub fn port_slot_bytes(&self) -> u64 {
        self.port_slot_bytes
    }

    /// Bytes of one rank's LL16 slot (the region starts at 0).
    pub fn ll_slot_bytes(&self) -> u64 {
        self.ll_slot_bytes
    }

    /// Bytes of one rank's LL128 slot.
    pub fn ll128_slot_bytes(&self) -> u64 {
        self.ll128_slot_bytes
    }

    /// Bytes of the scratch allocated at set-up (the LL16 region, the descriptors and the port
    /// region; at least 16).
    pub fn len(&self) -> usize {
        (self.port_offset() as usize + self.region_len(Region::Port)).max(16)
    }

    /// Offset of the descriptor area in the set-up scratch (after the LL16 region).
    pub fn desc_offset(&self) -> u64 {
        up16(self.region_len(Region::Ll)) as u64
    }

    /// The point-to-point region's layout.
    pub fn p2p(&self) -> P2pLayout {
        self.p2p
    }

    /// Bytes of `r`'s buffer (for the regions of the set-up scratch: of the region).
    pub fn region_len(&self, r: Region) -> usize {
        let n = self.ranks as u64;
        match r {
            Region::Ll => (2 * n.saturating_sub(1) * self.ll_slot_bytes) as usize,
            Region::Ll128 => (2 * n * self.ll128_slot_bytes) as usize,
            Region::Staging => self.stage_bytes,
            Region::CopyEngine => self.ce_bytes,
            Region::P2p => self.p2p_bytes,
            Region::Port => ((3 * n + 1) * self.port_slot_bytes) as usize,
        }
    }

    /// Bytes of the copy-engine all-reduce's own scratch.
    pub fn ce_bytes(&self) -> usize {
        self.ce_bytes
    }
}

/// What one rank's collectives allocate in device memory, by when (`memory_plan`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    /// At set-up (`Collectives::new`): the LL16 region, the descriptors, the channel table, the
    /// LL flags and the table of the peers' registrations (the semaphores and the status block
    /// are a few words more).
    pub at_creation: usize,
    /// On the first call of an algorithm that needs it: each lazily allocated region, named,
    /// with the algorithms that need it.
    pub on_first_use: Vec<(&'static str, &'static str, usize)>,
}

impl ScratchLayout {
    /// What collectives with this layout and `rows` rows of channels allocate on each rank
    /// (`memory_plan`, which asks the algorithms for the layout and the rows).
    pub(crate) fn memory_plan(&self, rows: usize) -> MemoryPlan {
        let (layout, ranks) = (self, self.ranks);
        let handle = std::mem::size_of::<mscclpp_shared::MemoryChannelDeviceHandle>();
        let table = rows * ranks * handle;
        let regions = [
            (Region::Ll128, "ll128"),
            (Region::Staging, "staged, put"),
            (Region::CopyEngine, "ce (all-reduce)"),
            (
                Region::P2p,
                "point-to-point (send, recv, gather, scatter, all_to_allv, group)",
            ),
        ];
        MemoryPlan {
            at_creation: layout.len()
                + table
                + 16
                + ranks * mscclpp_shared::REGISTRY_SLOTS * mscclpp_shared::registry::SLOT_BYTES,
            on_first_use: regions
                .iter()
                .map(|&(r, who)| {
                    // Every region but the copy engine's comes with a channel table of its own.
                    let extra = if r == Region::CopyEngine { 0 } else { table };
                    (r.name(), who, layout.region_len(r) + extra)
                })
                .filter(|&(_, _, b)| b > 0)
                .collect(),
        }
    }
}

/// Rounds up to a multiple of 16.
pub(crate) fn up16(x: usize) -> usize {
    (x + 15) & !15
}
