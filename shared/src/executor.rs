//! The plan interpreter's layouts: what `executor_kernel` (`mscclpp_device::executor`) takes
//! ([`ExecutorParams`]) and the program of one of its blocks ([`ExecBlock`], a plan
//! threadblock lowered by the host's `mscclpp::executor` for one pair of message sizes).
//!
//! Block `b` of a launch copies `blocks[b]` (its header and its `n_ops` ops) into its dynamic
//! shared memory and runs the ops in order; every thread of the block takes part in every op
//! and the block meets at a barrier after each one, so an op sees everything the ops before it
//! in its block wrote. What each op kind does is documented on [`ExecOpKind`].
//!
//! | word | lives in | written by | read by | ordering |
//! |---|---|---|---|---|
//! | `blocks[b]` | device memory | the host, before the first launch of its (plan, buffers, sizes) | block `b`, into shared memory, at its start | stream order |
//! | `flags[0]` | device memory | the block that counts itself last in `flags[1]` (thread 0), at its start | every thread of every block, at its start | relaxed; the count's fenced add orders every block's read before the store |
//! | `flags[1]` | device memory | thread 0 of every block: `atom.add` after a block barrier and an acq_rel fence; the last resets it | the same | `atom.add` (gpu scope) |
//! | `barriers[i]` | device memory | thread 0 of each block of a `barrier` op: `atom.add`, fenced | the same, `ld.acquire` until its generation is complete | acq_rel fence + acquire load |
//! | `semaphores[3 s]` (released) | device memory | `sem_release`: `red.release.gpu.add` after a block barrier | `sem_acquire`: `ld.acquire.gpu` | release / acquire |
//! | `semaphores[3 s + 1]` (tickets taken) | device memory | `sem_acquire`: `atom.add` | the same | relaxed: it only hands out tickets |
//! | `semaphores[3 s + 2]` (initial value) | device memory | the host, before the first launch | `sem_acquire` | stream order |
//!
//! Every counter only grows (barrier tickets, semaphore releases and tickets, the flag), so
//! nothing is reset between launches and a launch replayed from a CUDA graph finds them where
//! the last one left them. The flag of a launch is `flags[0] + 1` (low 32 bits, never 0:
//! fresh memory holds 0); LL packets carry it, and with a double scratch buffer its parity
//! picks the half (odd: the first, as MSCCL++).

use crate::{DevicePtr, DeviceStatus, MemoryChannelDeviceHandle, PortChannelDeviceHandle};

/// Most ops a block runs (a `pipeline` and each op inside it count one each).
pub const EXEC_MAX_OPS: usize = 64;
/// Most channels of one kind (memory, port) a block names.
pub const EXEC_MAX_CHANNELS: usize = 16;
/// Most remote buffers of one access kind (memory, port) a block names.
pub const EXEC_MAX_REMOTE_BUFFERS: usize = 16;
/// Most buffer references on either side (sources, destinations) of one op.
pub const EXEC_MAX_OP_BUFFERS: usize = 10;
/// Most channel or semaphore ids one op names.
pub const EXEC_MAX_OP_IDS: usize = 16;
/// Barrier ids a plan may use (`0..EXEC_PLAN_BARRIERS`).
pub const EXEC_PLAN_BARRIERS: usize = 16;
/// Threadblock groups a rank's program may have (each meets at barrier counter
/// `EXEC_PLAN_BARRIERS + group` after every op it shares).
pub const EXEC_MAX_GROUPS: usize = 16;
/// Barrier counters of a launch: the plan's, then the groups'.
pub const EXEC_MAX_BARRIERS: usize = EXEC_PLAN_BARRIERS + EXEC_MAX_GROUPS;
/// Device semaphores a plan may declare per rank.
pub const EXEC_MAX_SEMAPHORES: usize = 16;

/// [`ExecBufRef::kind`]: this rank's input.
pub const EXEC_BUF_INPUT: u8 = 0;
/// [`ExecBufRef::kind`]: this rank's output.
pub const EXEC_BUF_OUTPUT: u8 = 1;
/// [`ExecBufRef::kind`]: this rank's scratch.
pub const EXEC_BUF_SCRATCH: u8 = 2;
/// [`ExecBufRef::kind`]: a peer's buffer reached through memory (`slot` indexes
/// [`ExecBlock::memory_buffers`]).
pub const EXEC_BUF_MEMORY: u8 = 3;
/// [`ExecBufRef::kind`]: a peer's buffer reached through the proxy (`slot` indexes
/// [`ExecBlock::port_buffer_ids`]).
pub const EXEC_BUF_PORT: u8 = 4;

/// [`ExecOp::channel_type`]: none.
pub const EXEC_CHANNEL_NONE: u8 = 0;
/// [`ExecOp::channel_type`]: memory channels (`ids` index [`ExecBlock::memory_channels`]).
pub const EXEC_CHANNEL_MEMORY: u8 = 1;
/// [`ExecOp::channel_type`]: port channels (`ids` index [`ExecBlock::port_channels`]).
pub const EXEC_CHANNEL_PORT: u8 = 2;

/// [`ExecutorParams::packet`]: LL16 packets (8 payload bytes in 16).
pub const EXEC_PACKET_LL16: u32 = 0;
/// [`ExecutorParams::packet`]: LL8 packets (4 payload bytes in 8).
pub const EXEC_PACKET_LL8: u32 = 1;

/// What an op does ([`ExecOpKind`]). "Every pair" is `src[k]` with `dst[k]`; a packet
/// reference ([`ExecBufRef::packet`]) addresses LL packets carrying the data (twice its bytes,
/// at twice its offset); `size` is the data bytes every reference covers (a pipeline's ops:
/// one unit of it per iteration). An op that moves data with `count != 0` is a share of a
/// threadblock group's op: after it, the group's `count` blocks meet at barrier counter `aux`
/// (as a `Barrier` op does).
#[repr(u8)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ExecOpKind {
    /// Nothing (the barrier after every op is what a plan's `nop` asks for).
    Nop = 0,
    /// `count` blocks of this launch meet at barrier `aux` (thread 0 of each).
    Barrier = 1,
    /// Every pair: copy `src` to `dst` (memory channel: every thread; port channel: thread `k`
    /// pushes a put on channel `ids[k]`).
    Put = 2,
    /// As [`Put`](Self::Put) over port channels, each with a signal.
    PutWithSignal = 3,
    /// As [`PutWithSignal`](Self::PutWithSignal), then waits for the proxy to complete it.
    PutWithSignalAndFlush = 4,
    /// Every pair: copy (memory), the same code as `Put`; `src` is a peer's buffer.
    Get = 5,
    /// Every pair: copy, both local.
    Copy = 6,
    /// Thread `k` signals channel `ids[k]`.
    Signal = 7,
    /// Thread `k` waits on channel `ids[k]`.
    Wait = 8,
    /// As `Signal`, with relaxed order (it publishes nothing).
    RelaxedSignal = 9,
    /// As `Wait`, with relaxed order.
    RelaxedWait = 10,
    /// Thread `k` flushes port channel `ids[k]`.
    Flush = 11,
    /// Every 16 bytes: the fold of every `src` (local or a peer's) by `reduce_op`, stored to
    /// every `dst`.
    Reduce = 12,
    /// Every pair: `src` becomes LL packets at `dst` (memory: written by every thread; port:
    /// `src` already holds packets, thread `k` pushes a put of them on channel `ids[k]`).
    PutPackets = 13,
    /// Waits for the packets at `src[0]` and writes them to every `dst` (memory) or, once all
    /// are there, pushes puts of them (port).
    ReadPutPackets = 14,
    /// `src[0]` becomes packets at `dst[0]`, both local.
    CopyPackets = 15,
    /// Waits for the packets at `src[0]` and writes their payload to `dst[0]`.
    UnpackPackets = 16,
    /// Every 8 bytes: `src[0]`'s data folded with the payload of every packet source
    /// `src[1..]`, stored to every `dst` as data or as packets (local or a peer's).
    ReducePackets = 17,
    /// Runs the `aux` ops after it `count` times, iteration `i` on bytes `i * size ..` of
    /// every reference of theirs.
    Pipeline = 18,
    /// Thread `k` takes one token of semaphore `ids[k]` (waits until there is one).
    SemAcquire = 19,
    /// Thread `k` gives one token to semaphore `ids[k]`.
    SemRelease = 20,
}

impl ExecOpKind {
    /// Every kind, in discriminant order.
    pub const ALL: [ExecOpKind; 21] = [
        Self::Nop,
        Self::Barrier,
        Self::Put,
        Self::PutWithSignal,
        Self::PutWithSignalAndFlush,
        Self::Get,
        Self::Copy,
        Self::Signal,
        Self::Wait,
        Self::RelaxedSignal,
        Self::RelaxedWait,
        Self::Flush,
        Self::Reduce,
        Self::PutPackets,
        Self::ReadPutPackets,
        Self::CopyPackets,
        Self::UnpackPackets,
        Self::ReducePackets,
        Self::Pipeline,
        Self::SemAcquire,
        Self::SemRelease,
    ];

    /// From the raw byte of an [`ExecOp`].
    pub const fn from_u8(v: u8) -> Option<Self> {
        if (v as usize) < Self::ALL.len() {
            Some(Self::ALL[v as usize])
        } else {
            None
        }
    }
}

/// One buffer reference of an op: which buffer, where in it.
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ExecBufRef {
    /// Bytes from the start of the buffer (the scratch half not included; packet references:
    /// where the packets start).
    pub offset: u64,
    /// `EXEC_BUF_*`.
    pub kind: u8,
    /// [`EXEC_BUF_MEMORY`] / [`EXEC_BUF_PORT`]: the block's remote buffer slot.
    pub slot: u8,
    /// 1: the reference holds LL packets (always in a scratch buffer).
    pub packet: u8,
    /// Zero.
    pub reserved: [u8; 5],
}

/// One op of a block program (see [`ExecOpKind`] for each kind's fields).
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ExecOp {
    /// [`ExecOpKind`].
    pub kind: u8,
    /// `EXEC_CHANNEL_*`.
    pub channel_type: u8,
    /// Entries of `src` in use.
    pub n_src: u8,
    /// Entries of `dst` in use.
    pub n_dst: u8,
    /// Entries of `ids` in use.
    pub n_ids: u8,
    /// `DeviceReduceOp` of a reducing op (sum, min or max).
    pub reduce_op: u8,
    /// Zero.
    pub reserved: u16,
    /// Channel indexes of the block (signal, wait, flush, port puts) or semaphore ids.
    pub ids: [u8; EXEC_MAX_OP_IDS],
    /// Data bytes every reference covers; a pipeline: bytes of one iteration.
    pub size: u64,
    /// Barrier (and a threadblock group's share): blocks that meet; pipeline: iterations.
    pub count: u64,
    /// Barrier (and a group's share): its counter; pipeline: how many ops after it it repeats.
    pub aux: u64,
    /// Sources.
    pub src: [ExecBufRef; EXEC_MAX_OP_BUFFERS],
    /// Destinations.
    pub dst: [ExecBufRef; EXEC_MAX_OP_BUFFERS],
}

impl Default for ExecOp {
    fn default() -> Self {
        bytemuck::Zeroable::zeroed()
    }
}

/// The program of one block: its channels, the peers' buffers it reaches, its ops.
#[repr(C, align(16))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ExecBlock {
    /// Entries of `ops` in use (the kernel copies the header and these into shared memory).
    pub n_ops: u32,
    /// Zero.
    pub reserved: u32,
    /// Zero.
    pub reserved2: u64,
    /// The block's memory channels (only their semaphores are used: signal and wait).
    pub memory_channels: [MemoryChannelDeviceHandle; EXEC_MAX_CHANNELS],
    /// The block's port channels (`src` / `dst` memory ids are set per put).
    pub port_channels: [PortChannelDeviceHandle; EXEC_MAX_CHANNELS],
    /// The peers' buffers reached through memory: where each starts, mapped here.
    pub memory_buffers: [DevicePtr<u8>; EXEC_MAX_REMOTE_BUFFERS],
    /// The peers' buffers reached through the proxy: the buffer's offset in its registered
    /// memory.
    pub port_buffer_offsets: [u64; EXEC_MAX_REMOTE_BUFFERS],
    /// The proxy's memory id of each of those registered memories.
    pub port_buffer_ids: [u32; EXEC_MAX_REMOTE_BUFFERS],
    /// `EXEC_BUF_INPUT` / `_OUTPUT` / `_SCRATCH` of each memory-reached buffer (a scratch
    /// buffer gets the launch's half added).
    pub memory_buffer_kinds: [u8; EXEC_MAX_REMOTE_BUFFERS],
    /// The same for each proxy-reached buffer.
    pub port_buffer_kinds: [u8; EXEC_MAX_REMOTE_BUFFERS],
    /// The ops.
    pub ops: [ExecOp; EXEC_MAX_OPS],
}

impl Default for ExecBlock {
    fn default() -> Self {
        bytemuck::Zeroable::zeroed()
    }
}

impl ExecBlock {
    /// Bytes of the header (everything before `ops`).
    pub const HEADER_BYTES: usize = core::mem::offset_of!(ExecBlock, ops);
}

/// Parameters of `executor_kernel`: one launch of a lowered plan, one block per threadblock of
/// the rank's program.
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ExecutorParams {
    /// Abort flag and error record.
    pub status: DevicePtr<DeviceStatus>,
    /// One program per block.
    pub blocks: DevicePtr<ExecBlock>,
    /// This rank's input, output and scratch.
    pub buffers: [DevicePtr<u8>; 3],
    /// The proxy's memory ids of the registered memories holding them (port channels).
    pub local_memory_ids: [u32; 3],
    /// `DataType` of the elements (reductions).
    pub dtype: u32,
    /// Where each of the three starts in its registered memory.
    pub local_offsets: [u64; 3],
    /// 0: one scratch buffer; else the bytes of each half of a double one.
    pub scratch_half: u64,
    /// The launch flag words (module docs).
    pub flags: DevicePtr<u64>,
    /// [`EXEC_MAX_BARRIERS`] barrier counters.
    pub barriers: DevicePtr<u64>,
    /// [`EXEC_MAX_SEMAPHORES`] semaphores of three words each (module docs).
    pub semaphores: DevicePtr<u64>,
    /// [`EXEC_PACKET_LL16`] or [`EXEC_PACKET_LL8`].
    pub packet: u32,
    /// Zero.
    pub reserved: u32,
}

static_assertions::assert_eq_size!(ExecBufRef, [u64; 2]);
static_assertions::assert_eq_size!(ExecOp, [u64; 46]);
static_assertions::const_assert_eq!(core::mem::size_of::<ExecBlock>(), 26352);
static_assertions::const_assert_eq!(core::mem::align_of::<ExecBlock>(), 16);
static_assertions::const_assert_eq!(ExecBlock::HEADER_BYTES % 16, 0);
static_assertions::assert_eq_size!(ExecutorParams, [u64; 15]);
