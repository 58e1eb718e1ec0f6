//! Parameter structs of the built-in kernels: each kernel takes exactly one of these by value.
//!
//! Every struct starts with `status`, the communicator's [`DeviceStatus`] (abort flag and error
//! record), so the host launches every kernel the same way and every wait inside can be stopped.

use crate::{DevicePtr, DeviceStatus, FifoDeviceHandle, TraceDeviceHandle};

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

/// `block_vote_kernel`: a test of the block-wide votes (`sync_threads_or` / `_and` /
/// `_count`) and of the dynamic shared-memory size a kernel sees. Thread `t` of block `b`
/// (global index `g = b * block_dim + t`) votes `input[g] != 0` and writes what it got to
/// `output[4g .. 4g + 4]`: (or, and, count, `dynamic_shared_mem_size`).
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockVoteParams {
    /// Abort flag and error record (unused: the kernel never waits).
    pub status: DevicePtr<DeviceStatus>,
    /// `grid_dim * block_dim` predicates (non-zero: true).
    pub input: DevicePtr<u32>,
    /// `4 * grid_dim * block_dim` results.
    pub output: DevicePtr<u32>,
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

/// The test kernels of `mscclpp_device::test_kernels` (single-GPU tests of paths only the
/// GPU takes): `reduce_words_test_kernel` writes `out[i] = reduce_word(a[i], b[i], dtype, op)`
/// for `count` 32-bit words; `ll128_blocks_test_kernel` sends `count` bytes from `a` as LL128
/// lines with flag `flag` through the line buffer `b` from block 0 to block 1, which writes
/// them to `out`.
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct TestKernelParams {
    /// Abort flag and error record.
    pub status: DevicePtr<DeviceStatus>,
    /// First input.
    pub a: DevicePtr<u8>,
    /// Second input (reduce) or the line buffer (LL128).
    pub b: DevicePtr<u8>,
    /// Output.
    pub out: DevicePtr<u8>,
    /// Words (reduce) or bytes (LL128).
    pub count: u64,
    /// [`DataType`] (reduce).
    pub dtype: u32,
    /// [`ReduceOp`] (reduce).
    pub op: u32,
    /// The lines' flag (LL128; never 0, what fresh memory holds).
    pub flag: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

static_assertions::assert_eq_size!(TestKernelParams, [u64; 7]);
static_assertions::assert_eq_size!(CopyParams, [u64; 4]);
static_assertions::assert_eq_size!(BlockSumParams, [u64; 4]);
static_assertions::assert_eq_size!(BlockVoteParams, [u64; 3]);
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
    /// Where the block's trace events go ([`TraceDeviceHandle::OFF`]: not traced).
    pub trace: TraceDeviceHandle,
}

static_assertions::assert_eq_size!(PingPongParams, [u64; 11]);
static_assertions::assert_eq_size!(PortPingPongParams, [u64; 19]);

/// Element types of the collectives: every type NCCL's collectives take (`ncclDataType_t`,
/// numbered differently: the first five values are this crate's original ones). Multi-byte
/// elements are little-endian; `F16` is IEEE binary16, `BF16` bfloat16, `F8E4M3` and `F8E5M2`
/// the two OCP 8-bit floats of NVIDIA's `__nv_fp8_e4m3` (no infinities, NaN `0x7f`/`0xff`,
/// largest finite 448) and `__nv_fp8_e5m2` (IEEE-like, largest finite 57344).
#[repr(u32)]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum DataType {
    /// `f32`.
    F32 = 0,
    /// IEEE half.
    F16 = 1,
    /// bfloat16.
    BF16 = 2,
    /// `i32`.
    I32 = 3,
    /// `u32`.
    U32 = 4,
    /// `i8`.
    I8 = 5,
    /// `u8`.
    U8 = 6,
    /// `i64`.
    I64 = 7,
    /// `u64`.
    U64 = 8,
    /// `f64`.
    F64 = 9,
    /// 8-bit float, 4 exponent and 3 mantissa bits (NVIDIA `__nv_fp8_e4m3`).
    F8E4M3 = 10,
    /// 8-bit float, 5 exponent and 2 mantissa bits (NVIDIA `__nv_fp8_e5m2`).
    F8E5M2 = 11,
}

impl DataType {
    /// Every type, in discriminant order.
    pub const ALL: [DataType; 12] = [
        Self::F32,
        Self::F16,
        Self::BF16,
        Self::I32,
        Self::U32,
        Self::I8,
        Self::U8,
        Self::I64,
        Self::U64,
        Self::F64,
        Self::F8E4M3,
        Self::F8E5M2,
    ];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            Self::I8 | Self::U8 | Self::F8E4M3 | Self::F8E5M2 => 1,
            Self::F16 | Self::BF16 => 2,
            Self::F32 | Self::I32 | Self::U32 => 4,
            Self::I64 | Self::U64 | Self::F64 => 8,
        }
    }

    /// Whether the type is a floating-point one.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            Self::F32 | Self::F16 | Self::BF16 | Self::F64 | Self::F8E4M3 | Self::F8E5M2
        )
    }

    /// Whether the type is a signed integer.
    pub const fn is_signed_int(self) -> bool {
        matches!(self, Self::I8 | Self::I32 | Self::I64)
    }

    /// From the raw value in a parameter struct.
    pub const fn from_u32(v: u32) -> Option<Self> {
        if (v as usize) < Self::ALL.len() {
            Some(Self::ALL[v as usize])
        } else {
            None
        }
    }
}

/// The reduction operators of the first collectives API (sum, min, max). Every operator,
/// product, average and pre-multiplied sums included, is a `mscclpp::collectives::Reduction`,
/// which these convert into; kernels take a [`DeviceReduceOp`].
#[repr(u32)]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum ReduceOp {
    /// Sum.
    Sum = 0,
    /// Minimum.
    Min = 1,
    /// Maximum.
    Max = 2,
}

impl ReduceOp {
    /// From the raw value in a parameter struct.
    pub const fn from_u32(v: u32) -> Option<Self> {
        match v {
            0 => Some(Self::Sum),
            1 => Some(Self::Min),
            2 => Some(Self::Max),
            _ => None,
        }
    }
}

/// What a collective kernel computes element by element (`CollectiveParams::op`), like NCCL's
/// `ncclDevRedOp_t`: the host lowers every user-level reduction to one of these (average:
/// [`PreMulSum`](Self::PreMulSum) by `1/n` for floats, [`SumPostDiv`](Self::SumPostDiv) by `n`
/// for integers, as NCCL does). `Sum`, `Min` and `Max` have [`ReduceOp`]'s values.
#[repr(u32)]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum DeviceReduceOp {
    /// Sum.
    Sum = 0,
    /// Minimum (floats: a NaN operand yields the other one).
    Min = 1,
    /// Maximum (floats: a NaN operand yields the other one).
    Max = 2,
    /// Product.
    Prod = 3,
    /// Sum of every contribution multiplied by the scalar (`CollectiveParams::scalar` or
    /// `scalar_ptr`), each multiplied exactly once, in the element type.
    PreMulSum = 4,
    /// Sum, then divided by the scalar (`CollectiveParams::scalar`) exactly once, truncating
    /// toward zero: integer types only.
    SumPostDiv = 5,
}

impl DeviceReduceOp {
    /// From the raw value in a parameter struct.
    pub const fn from_u32(v: u32) -> Option<Self> {
        match v {
            0 => Some(Self::Sum),
            1 => Some(Self::Min),
            2 => Some(Self::Max),
            3 => Some(Self::Prod),
            4 => Some(Self::PreMulSum),
            5 => Some(Self::SumPostDiv),
            _ => None,
        }
    }

    /// Whether a kernel serves this operator on `dtype` (every pair but a post-division of a
    /// floating-point type).
    pub const fn serves(self, dtype: DataType) -> bool {
        !matches!(self, Self::SumPostDiv) || !dtype.is_float()
    }

    /// Whether this is one of the common sums (f16, bf16, f32). With the pre-multiplied sums of
    /// the same types ([`is_inline`](Self::is_inline)) they are what the main collective
    /// kernels reduce; every other pair reduces on their `_any` twins
    /// (`mscclpp_device::collectives`), so that the main kernels' registers pay for no type
    /// dispatch.
    pub const fn is_common_sum(self, dtype: DataType) -> bool {
        matches!(self, Self::Sum) && matches!(dtype, DataType::F16 | DataType::BF16 | DataType::F32)
    }

    /// Whether the main collective kernels reduce this pair inline: the common sums and the
    /// pre-multiplied sums (NCCL's `ncclRedOpCreatePreMulSum`, and the floating averages the
    /// host lowers to them) of f16, bf16 and f32. Every other pair reduces on the `_any`
    /// twins.
    pub const fn is_inline(self, dtype: DataType) -> bool {
        matches!(self, Self::Sum | Self::PreMulSum)
            && matches!(dtype, DataType::F16 | DataType::BF16 | DataType::F32)
    }
}

impl From<ReduceOp> for DeviceReduceOp {
    fn from(op: ReduceOp) -> Self {
        match op {
            ReduceOp::Sum => Self::Sum,
            ReduceOp::Min => Self::Min,
            ReduceOp::Max => Self::Max,
        }
    }
}

/// What `staged_collective_kernel` does (see `mscclpp_device::collectives`).
#[repr(u32)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum CollectiveMode {
    /// Reduce `bytes` over all ranks into every rank's output.
    AllReduce = 0,
    /// Concatenate every rank's `bytes` into every rank's output.
    AllGather = 1,
    /// Reduce `nranks * bytes`; rank r keeps part r (`bytes`).
    ReduceScatter = 2,
    /// `root`'s `bytes` to every rank.
    Broadcast = 3,
    /// Part p (`bytes`) of rank r's input lands as part r of rank p's output.
    AllToAll = 4,
    /// Send `bytes` to `root` (the peer). The LL kernel: a two-rank exchange with `root`; the
    /// direct kernel: `send_recv`, input into `root`'s output.
    Send = 5,
    /// Receive `bytes` from `root` (the peer).
    Recv = 6,
    /// All-reduce where only writes cross the links (reduce-scatter by puts into the peers'
    /// staging, local reduction, all-gather by puts).
    AllReducePut = 7,
    /// Meet the peers whose bit is set in `root` (direct kernel only; the host brackets
    /// copy-engine transfers with it).
    Barrier = 8,
    /// Reduce `bytes` from every `inputs[q]` (`q < nranks`, all addressed here, `inputs[rank]`
    /// first) into `outputs[rank]`, with no barrier (direct kernel; a piece of the pipelined
    /// copy-engine all-reduce, whose inputs are the copies peers made into this rank's
    /// scratch). 9 was `ReduceChunk`, retired with the unpipelined copy-engine all-reduce, and
    /// is not reused.
    ReduceLocal = 10,
    /// Reduce `bytes` over all ranks into `root`'s output (the other ranks' outputs are not
    /// touched and may be null).
    Reduce = 11,
}

/// Parameters of the collective kernels (`ll_collective_kernel`, `staged_collective_kernel`).
///
/// `channels` points at `max_blocks * nranks` MemoryChannel handles in device memory: row `b`
/// (one per block) holds one channel per peer rank (the entry of `rank` itself is unused). Each
/// channel's `dst` is the peer's scratch buffer (mapped here), `src` this rank's scratch.
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct CollectiveParams {
    /// Abort flag and error record.
    pub status: DevicePtr<DeviceStatus>,
    /// `max_blocks * nranks` channel handles.
    pub channels: DevicePtr<crate::MemoryChannelDeviceHandle>,
    /// Input (may equal `output`).
    pub input: DevicePtr<u8>,
    /// Output.
    pub output: DevicePtr<u8>,
    /// This rank's scratch buffer.
    pub scratch: DevicePtr<u8>,
    /// Bytes of the operation (per rank or per part, see [`CollectiveMode`]).
    pub bytes: u64,
    /// Four device words: `[0]` and `[1]` the LL kernels': `[0]` the flag of the last
    /// completed call, `[1]` the count of blocks of the current call that have read it. Every
    /// thread reads `[0] + 1` as its flag; once every working block has counted itself, the
    /// launch's last block (the keeper; a single block: its thread 0 at its end) stores it back
    /// and resets the count, so the flag advances on the device and CUDA-graph replays of a
    /// captured call use fresh flags. `[2]` the gate word (see `gate`), `[3]` unused.
    pub ll_flags: DevicePtr<u64>,
    /// Bytes of one rank's LL slot (one half of the double buffer holds `nranks - 1` slots, one
    /// per peer).
    pub ll_slot_bytes: u64,
    /// Offset of the staging region in every scratch buffer.
    pub stage_offset: u64,
    /// Distance between rank parts in `input` (reduce-scatter, all-to-all) or `output`
    /// (all-gather, all-to-all), bytes; a launch may cover a piece (`bytes`) of each part.
    pub stride: u64,
    /// 0, or the gate of a launch queued behind a direct launch that decides on the device
    /// whether its call runs there ([`DirectCollectiveParams::decline`]): the launch then does
    /// nothing unless `ll_flags[2]` holds this gate (the direct launch declined the call on
    /// every rank and wrote it there; launches of one stream run in order, so a plain load
    /// after the kernel boundary sees it).
    pub gate: u32,
    /// [`DataType`].
    pub dtype: u32,
    /// [`DeviceReduceOp`].
    pub op: u32,
    /// [`CollectiveMode`] (staged kernel).
    pub mode: u32,
    /// This rank.
    pub rank: u32,
    /// Number of ranks.
    pub nranks: u32,
    /// Root (broadcast) or peer (send / recv).
    pub root: u32,
    /// Rows of `channels` (blocks may not exceed it).
    pub max_blocks: u32,
    /// Offset of the LL128 region in every scratch buffer (LL128 kernels): like the LL16
    /// region, two halves of `nranks` slots of `ll128_slot_bytes`, chosen by the flag's parity.
    pub ll128_offset: u64,
    /// Bytes of one rank's LL128 slot (LL128 kernels).
    pub ll128_slot_bytes: u64,
    /// The operator's scalar: for [`DeviceReduceOp::PreMulSum`] the bits of one element of
    /// `dtype` (little-endian, zero above), used when `scalar_ptr` is null; for
    /// [`DeviceReduceOp::SumPostDiv`] the divisor. Zero otherwise.
    pub scalar: u64,
    /// [`DeviceReduceOp::PreMulSum`] only: where the scalar is (one element of `dtype` in this
    /// rank's device memory, read by the kernel when it starts: NCCL's `ncclScalarDevice`),
    /// or null for `scalar`.
    pub scalar_ptr: DevicePtr<u8>,
    /// Where the blocks' trace events go ([`TraceDeviceHandle::OFF`]: not traced; the host
    /// fills it in `Context::params`, the one place every collective launch's parameters come
    /// from).
    pub trace: TraceDeviceHandle,
}

static_assertions::assert_eq_size!(CollectiveParams, [u64; 21]);

/// Most ranks a direct collective serves (one node's NVLink domain).
pub const MAX_DIRECT_RANKS: usize = 8;

/// Dynamic shared memory the direct kernel is launched with: on registered buffers it keeps
/// every rank's resolved input and output there (from word 2).
pub const DIRECT_SHARED_BYTES: u32 = 16 + 16 * MAX_DIRECT_RANKS as u32;

/// Parameters of `direct_collective_kernel`, which works on the callers' own buffers: every
/// rank's input and output, mapped here, instead of staging copies. Entry `rank` of `inputs` /
/// `outputs` is this rank's own buffer; entries past `nranks` are null. `common.channels`
/// supplies the block barriers.
///
/// Two ways to learn the peers' buffers:
/// - exchanged by the host on every call (`registry` null): `inputs` / `outputs` hold every
///   rank's buffers; `common.scratch` is unused.
/// - registered ahead (`registry` set): the host knows only its own; each block hands its
///   peers `mine` through their scratch (at `desc_offset`) before its first barrier and
///   resolves theirs in `registry` after it (`crate::registry`), checking that each holds
///   `need` bytes; entries `q != rank` of `inputs` / `outputs` are ignored.
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct DirectCollectiveParams {
    /// Everything but the buffers (`common.input` / `common.output` equal entry `rank`).
    pub common: CollectiveParams,
    /// Rank q's input as this process addresses it.
    pub inputs: [DevicePtr<u8>; MAX_DIRECT_RANKS],
    /// Rank q's output as this process addresses it.
    pub outputs: [DevicePtr<u8>; MAX_DIRECT_RANKS],
    /// The peers' registrations mapped here (`[MAX_DIRECT_RANKS][REGISTRY_SLOTS]`), or null
    /// when the host exchanged the buffers.
    pub registry: DevicePtr<crate::RegistrySlot>,
    /// Offset of the descriptor area in every rank's scratch (`max_blocks * nranks`
    /// descriptors of `REGISTERED_CALL_BYTES`).
    pub desc_offset: u64,
    /// Bytes every rank's input and output must hold from its offset (0: not used).
    pub need: [u64; 2],
    /// `Send` mode on registered buffers: bit `q` set for each rank met (the exchange's next
    /// and previous rank).
    pub meet: u32,
    /// Registered buffers only: 0, or the gate of the launch queued behind this one. With a
    /// gate, a rank that says `ok = 0` (or a peer's that does) is not an error: every block
    /// declines the call alike, meets its peers at the closing barrier and moves nothing, and
    /// block 0 stores the gate to `common.ll_flags[2]` (0 when the call ran), which lets the
    /// launch behind it run (`CollectiveParams::gate`).
    pub decline: u32,
    /// This rank's descriptor (registered buffers only).
    pub mine: crate::RegisteredCall,
}

static_assertions::assert_eq_size!(DirectCollectiveParams, [u64; 50]);

/// Parameters of `port_collective_kernel`, which moves every piece of a collective through
/// PortChannels (the host proxies: the network between nodes, the copy engines inside one), in
/// one block: see `mscclpp_device::collectives::port`.
///
/// `port_channels` points at `2 * nranks` handles in device memory: entry `2q` is the data
/// channel to rank `q`, entry `2q + 1` its acknowledgement channel (both over the same
/// connection, each with its own semaphore); the entries of `rank` itself are unused. Every
/// handle's `src` is this rank's scratch and `dst` rank `q`'s. `counters` points at `2 * nranks`
/// u64 in device memory, written and read only by the kernel's thread 0 (other threads read
/// them after a block barrier): entry `2q` counts the pieces this rank ever sent to `q`, entry
/// `2q + 1` those it ever received from `q`; their parity picks the receive slot, so both
/// ranks of a pair agree on it across launches.
#[repr(C, align(8))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct PortCollectiveParams {
    /// Status, buffers, `bytes` (per peer), `stride`, type, operator, `mode`, rank, ranks,
    /// root; `scratch` is the base of this rank's scratch (`channels` and the LL fields are
    /// unused).
    pub common: CollectiveParams,
    /// `2 * nranks` PortChannel handles (data, acknowledgement).
    pub port_channels: DevicePtr<crate::PortChannelDeviceHandle>,
    /// `2 * nranks` piece counters (sent, received).
    pub counters: DevicePtr<u64>,
    /// Bit `q`: this rank sends to rank `q`.
    pub send_mask: u64,
    /// Bit `q`: this rank receives from rank `q`.
    pub recv_mask: u64,
    /// Offset of the port region in every rank's scratch: `nranks` send slots, then
    /// `2 * nranks` receive slots (two per sender, by piece parity), then one accumulator slot.
    pub port_offset: u64,
    /// Bytes of one slot (a multiple of 16): the largest piece.
    pub slot_bytes: u64,
}

static_assertions::assert_eq_size!(PortCollectiveParams, [u64; 27]);

/// Most ranks a port collective serves (bits of its masks).
pub const MAX_PORT_RANKS: usize = 64;
