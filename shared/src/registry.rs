//! Registered buffers: the layouts of the table of the peers' registrations a rank maps, and of
//! the descriptor each rank hands its peers at the start of a direct kernel on registered
//! buffers (so that no host message names a call's buffers).
//!
//! Who writes and reads what (`mscclpp::collectives` documents the whole protocol):
//!
//! | word | lives in | written by | read by |
//! |---|---|---|---|
//! | [`RegistrySlot`] `[q][s]` | device memory of rank `r` (`DirectCollectiveParams::registry`) | rank `r`'s host (a stream write on its registration service's stream, completed before it acknowledges rank `q`'s registration `s`) | rank `r`'s direct kernels, with relaxed system-scope loads, after a peer's descriptor named `(s, generation)` |
//! | [`RegisteredCall`] of rank `q`, block `b` | rank `r`'s scratch, at `desc_offset + (b * nranks + q) * 64` | block `b` of rank `q`'s direct kernel (the thread that then signals rank `r`: its plain stores are released by that signal) | block `b` of rank `r`'s direct kernel, after acquiring that signal |

use crate::DevicePtr;

/// Registrations one rank can hold at once (its slot numbers are below this).
pub const REGISTRY_SLOTS: usize = 256;

/// Slots at the top of the range reserved for windows (collective registrations: every rank
/// gives a window the same slot).
pub const WINDOW_SLOTS: usize = 64;

/// First window slot.
pub const FIRST_WINDOW_SLOT: usize = REGISTRY_SLOTS - WINDOW_SLOTS;

/// One of a peer's registrations as mapped here: `[base, base + len)` is the peer's registered
/// range in this process's address space; `generation` is the registration's generation (never 0 for
/// a live one), so that a descriptor naming a slot since reused is refused.
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct RegistrySlot {
    /// The range's first byte, here (null: no registration in this slot).
    pub base: DevicePtr<u8>,
    /// Its length in bytes.
    pub len: u64,
    /// The registration's generation (0: none).
    pub generation: u32,
    /// Zero.
    pub reserved: u32,
    /// Zero.
    pub reserved2: u64,
}

static_assertions::assert_eq_size!(RegistrySlot, [u64; 4]);

/// Bytes of one [`RegistrySlot`].
pub const SLOT_BYTES: usize = core::mem::size_of::<RegistrySlot>();

/// One buffer of a call on registered buffers: where it lies in its owner's registration.
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BufferRef {
    /// The owner's registration slot.
    pub slot: u32,
    /// The registration's generation (0: no buffer).
    pub generation: u32,
    /// Offset of the buffer in the registration.
    pub offset: u64,
}

static_assertions::assert_eq_size!(BufferRef, [u64; 2]);

/// What a rank tells each peer at the start of a direct kernel on registered buffers: its
/// buffers, the call it makes, and whether it can take part.
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct RegisteredCall {
    /// The input.
    pub input: BufferRef,
    /// The output.
    pub output: BufferRef,
    /// A digest of the call (collective, bytes, stride, root, type, operator, ranks): a peer
    /// whose digest differs makes another call, and every rank refuses the launch.
    pub call: u64,
    /// 1 when this rank's buffers suit the kernel (aligned, laid out as the mode needs); 0
    /// makes every rank refuse the launch.
    pub ok: u32,
    /// Zero.
    pub reserved: u32,
    /// Zero.
    pub reserved2: [u64; 2],
}

static_assertions::assert_eq_size!(RegisteredCall, [u64; 8]);

/// Bytes of one [`RegisteredCall`] in the descriptor area.
pub const REGISTERED_CALL_BYTES: usize = core::mem::size_of::<RegisteredCall>();

/// Why a direct kernel on registered buffers refused a launch (the low byte of the error
/// detail it records with `InvalidArgument`; the peer's rank is the next byte).
#[repr(u32)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum RegisteredRefusal {
    /// A rank said it cannot take part (`ok = 0`: misaligned or badly overlapping buffers).
    NotOk = 1,
    /// A rank makes another call (its digest differs).
    OtherCall = 2,
    /// A descriptor names a slot or generation this rank has not mapped.
    UnknownSlot = 3,
    /// A buffer is shorter than the call needs, or misaligned.
    Range = 4,
}

impl RegisteredRefusal {
    /// From the detail's low byte.
    pub fn from_u32(v: u32) -> Option<Self> {
        [Self::NotOk, Self::OtherCall, Self::UnknownSlot, Self::Range]
            .into_iter()
            .find(|r| *r as u32 == v)
    }
}
