//! A table of every shared struct's size, alignment and field offsets.
//!
//! `tests/c_header.rs` generates a C program from this table that prints the same facts as the
//! C compiler sees them through `include/mscclpp/layout.h`, and compares. A field renamed,
//! moved or resized on one side only makes that test fail (a missing C field fails to compile,
//! a different offset or size fails the comparison).

/// One struct as Rust lays it out.
#[derive(Clone, Copy, Debug)]
pub struct StructLayout {
    /// The C (and Rust) type name.
    pub name: &'static str,
    /// `size_of`.
    pub size: usize,
    /// `align_of`.
    pub align: usize,
    /// `(field, offset_of)` for every field.
    pub fields: &'static [(&'static str, usize)],
}

macro_rules! layouts {
    ($($ty:ident { $($field:ident),* $(,)? })*) => {
        /// Every shared struct, in header order.
        pub const LAYOUTS: &[StructLayout] = &[$(
            StructLayout {
                name: stringify!($ty),
                size: core::mem::size_of::<crate::$ty>(),
                align: core::mem::align_of::<crate::$ty>(),
                fields: &[$((stringify!($field), core::mem::offset_of!(crate::$ty, $field))),*],
            },
        )*];
    };
}

layouts! {
    ProxyTrigger { fst, snd }
    DeviceStatus { abort, error_code, error_detail, spin_limit, reserved }
    FifoDeviceHandle { triggers, tail, head, tail_cache, flush_done_pos, status, size, log2_size }
    MemoryDevice2DeviceSemaphoreDeviceHandle { inbound, remote_inbound, expected, status }
    Host2DeviceSemaphoreDeviceHandle { inbound, expected, status }
    Host2HostSemaphoreHandle { inbound, expected }
    PortChannelDeviceHandle { semaphore_id, dst, src, reserved, semaphore, fifo }
    MemoryChannelDeviceHandle { semaphore, dst, src, packet_buffer }
    LL16Packet { data1, flag1, data2, flag2 }
    LL8Packet { data, flag }
    TraceEvent { time_ns, launch, kind, block }
    TraceDeviceHandle { events, launch, log2_records, rings, reserved }
    TraceClockParams { status, words, rounds, reserved }
    CopyParams { status, dst, src, bytes }
    BlockSumParams { status, input, output, n_per_block, reserved }
    BlockVoteParams { status, input, output }
    FifoPushParams { status, fifo, per_thread, reserved }
    PingPongParams { status, channel, bytes, iterations, role, flag_base, reserved }
    PortPingPongParams { status, channel, bytes, iterations, role, flush, reserved, trace }
    CollectiveParams { status, channels, input, output, scratch, bytes, ll_flags, ll_slot_bytes, stage_offset, stride, gate, dtype, op, mode, rank, nranks, root, max_blocks, ll128_offset, ll128_slot_bytes, scalar, scalar_ptr, trace }
    DirectCollectiveParams { common, inputs, outputs, registry, desc_offset, need, meet, decline, mine }
    RegistrySlot { base, len, generation, reserved, reserved2 }
    BufferRef { slot, generation, offset }
    RegisteredCall { input, output, call, ok, reserved, reserved2 }
    PortCollectiveParams { common, port_channels, counters, send_mask, recv_mask, port_offset, slot_bytes }
    P2pOp { buf, bytes, peer, kind, first_block, blocks }
    P2pParams { status, channels, scratch, region_offset, ll_bytes, chunk_bytes, rank, nranks, lanes, nops, ops, trace }
    ExecBufRef { offset, kind, slot, packet, reserved }
    ExecOp { kind, channel_type, n_src, n_dst, n_ids, reduce_op, reserved, ids, size, count, aux, src, dst }
    ExecBlock { n_ops, reserved, reserved2, memory_channels, port_channels, memory_buffers, port_buffer_offsets, port_buffer_ids, memory_buffer_kinds, port_buffer_kinds, ops }
    ExecutorParams { status, blocks, buffers, local_memory_ids, dtype, local_offsets, scratch_half, flags, barriers, semaphores, packet, reserved }
    IpcMemHandle { kind, device, owner_pid, owner_fd, token, alloc_size, offset, size, cuda }
    TestKernelParams { status, a, b, out, count, dtype, op, flag, reserved }
}

/// The trigger bit constants the C header must define with the same values.
pub const TRIGGER_CONSTANTS: &[(&str, u64)] = {
    use crate::trigger::*;
    &[
        ("MSCCLPP_TRIGGER_SIZE_BITS", SIZE_BITS as u64),
        ("MSCCLPP_TRIGGER_OFFSET_BITS", OFFSET_BITS as u64),
        ("MSCCLPP_TRIGGER_MEMORY_ID_BITS", MEMORY_ID_BITS as u64),
        ("MSCCLPP_TRIGGER_TYPE_BITS", TYPE_BITS as u64),
        (
            "MSCCLPP_TRIGGER_SEMAPHORE_ID_BITS",
            SEMAPHORE_ID_BITS as u64,
        ),
        ("MSCCLPP_TRIGGER_SRC_OFFSET_SHIFT", SRC_OFFSET_SHIFT as u64),
        (
            "MSCCLPP_TRIGGER_SRC_MEMORY_ID_SHIFT",
            SRC_MEMORY_ID_SHIFT as u64,
        ),
        (
            "MSCCLPP_TRIGGER_DST_MEMORY_ID_SHIFT",
            DST_MEMORY_ID_SHIFT as u64,
        ),
        ("MSCCLPP_TRIGGER_TYPE_SHIFT", TYPE_SHIFT as u64),
        (
            "MSCCLPP_TRIGGER_SEMAPHORE_ID_SHIFT",
            SEMAPHORE_ID_SHIFT as u64,
        ),
        ("MSCCLPP_TRIGGER_COMMIT_SHIFT", COMMIT_SHIFT as u64),
        ("MSCCLPP_TRIGGER_DATA", TRIGGER_DATA as u64),
        ("MSCCLPP_TRIGGER_FLAG", TRIGGER_FLAG as u64),
        ("MSCCLPP_TRIGGER_SYNC", TRIGGER_SYNC as u64),
        (
            "MSCCLPP_DEVICE_ERROR_ABORTED",
            crate::DeviceErrorCode::Aborted as u64,
        ),
        (
            "MSCCLPP_DEVICE_ERROR_TIMEOUT",
            crate::DeviceErrorCode::Timeout as u64,
        ),
        (
            "MSCCLPP_DEVICE_ERROR_INVALID_ARGUMENT",
            crate::DeviceErrorCode::InvalidArgument as u64,
        ),
        ("MSCCLPP_DTYPE_F32", crate::DataType::F32 as u64),
        ("MSCCLPP_DTYPE_F16", crate::DataType::F16 as u64),
        ("MSCCLPP_DTYPE_BF16", crate::DataType::BF16 as u64),
        ("MSCCLPP_DTYPE_I32", crate::DataType::I32 as u64),
        ("MSCCLPP_DTYPE_U32", crate::DataType::U32 as u64),
        ("MSCCLPP_DTYPE_I8", crate::DataType::I8 as u64),
        ("MSCCLPP_DTYPE_U8", crate::DataType::U8 as u64),
        ("MSCCLPP_DTYPE_I64", crate::DataType::I64 as u64),
        ("MSCCLPP_DTYPE_U64", crate::DataType::U64 as u64),
        ("MSCCLPP_DTYPE_F64", crate::DataType::F64 as u64),
        ("MSCCLPP_DTYPE_F8E4M3", crate::DataType::F8E4M3 as u64),
        ("MSCCLPP_DTYPE_F8E5M2", crate::DataType::F8E5M2 as u64),
        ("MSCCLPP_OP_SUM", crate::DeviceReduceOp::Sum as u64),
        ("MSCCLPP_OP_MIN", crate::DeviceReduceOp::Min as u64),
        ("MSCCLPP_OP_MAX", crate::DeviceReduceOp::Max as u64),
        ("MSCCLPP_OP_PROD", crate::DeviceReduceOp::Prod as u64),
        (
            "MSCCLPP_OP_PRE_MUL_SUM",
            crate::DeviceReduceOp::PreMulSum as u64,
        ),
        (
            "MSCCLPP_OP_SUM_POST_DIV",
            crate::DeviceReduceOp::SumPostDiv as u64,
        ),
        (
            "MSCCLPP_MODE_ALL_REDUCE",
            crate::CollectiveMode::AllReduce as u64,
        ),
        (
            "MSCCLPP_MODE_ALL_GATHER",
            crate::CollectiveMode::AllGather as u64,
        ),
        (
            "MSCCLPP_MODE_REDUCE_SCATTER",
            crate::CollectiveMode::ReduceScatter as u64,
        ),
        (
            "MSCCLPP_MODE_BROADCAST",
            crate::CollectiveMode::Broadcast as u64,
        ),
        (
            "MSCCLPP_MODE_ALL_TO_ALL",
            crate::CollectiveMode::AllToAll as u64,
        ),
        ("MSCCLPP_MODE_SEND", crate::CollectiveMode::Send as u64),
        ("MSCCLPP_MODE_RECV", crate::CollectiveMode::Recv as u64),
        (
            "MSCCLPP_MODE_ALL_REDUCE_PUT",
            crate::CollectiveMode::AllReducePut as u64,
        ),
        (
            "MSCCLPP_MODE_BARRIER",
            crate::CollectiveMode::Barrier as u64,
        ),
        (
            "MSCCLPP_MODE_REDUCE_LOCAL",
            crate::CollectiveMode::ReduceLocal as u64,
        ),
        ("MSCCLPP_MODE_REDUCE", crate::CollectiveMode::Reduce as u64),
        ("MSCCLPP_MAX_DIRECT_RANKS", crate::MAX_DIRECT_RANKS as u64),
        ("MSCCLPP_REGISTRY_SLOTS", crate::REGISTRY_SLOTS as u64),
        ("MSCCLPP_WINDOW_SLOTS", crate::WINDOW_SLOTS as u64),
        ("MSCCLPP_MAX_PORT_RANKS", crate::MAX_PORT_RANKS as u64),
        (
            "MSCCLPP_TRACE_EVENTS_PER_LAUNCH",
            crate::trace::EVENTS_PER_LAUNCH as u64,
        ),
        (
            "MSCCLPP_TRACE_EVENT_START",
            crate::TraceEventKind::Start as u64,
        ),
        (
            "MSCCLPP_TRACE_EVENT_SEND",
            crate::TraceEventKind::Send as u64,
        ),
        (
            "MSCCLPP_TRACE_EVENT_RECV",
            crate::TraceEventKind::Recv as u64,
        ),
        ("MSCCLPP_TRACE_EVENT_END", crate::TraceEventKind::End as u64),
        (
            "MSCCLPP_DEVICE_ERROR_COUNT_MISMATCH",
            crate::DeviceErrorCode::CountMismatch as u64,
        ),
        (
            "MSCCLPP_COUNT_MISMATCH_BYTES_BITS",
            crate::status::COUNT_MISMATCH_BYTES_BITS as u64,
        ),
        ("MSCCLPP_P2P_MAX_OPS", crate::P2P_MAX_OPS as u64),
        ("MSCCLPP_P2P_MAX_LANES", crate::P2P_MAX_LANES as u64),
        ("MSCCLPP_P2P_SEND", crate::P2P_SEND as u64),
        ("MSCCLPP_P2P_RECV", crate::P2P_RECV as u64),
        ("MSCCLPP_EXEC_MAX_OPS", crate::executor::EXEC_MAX_OPS as u64),
        (
            "MSCCLPP_EXEC_MAX_CHANNELS",
            crate::executor::EXEC_MAX_CHANNELS as u64,
        ),
        (
            "MSCCLPP_EXEC_MAX_REMOTE_BUFFERS",
            crate::executor::EXEC_MAX_REMOTE_BUFFERS as u64,
        ),
        (
            "MSCCLPP_EXEC_MAX_OP_BUFFERS",
            crate::executor::EXEC_MAX_OP_BUFFERS as u64,
        ),
        (
            "MSCCLPP_EXEC_MAX_OP_IDS",
            crate::executor::EXEC_MAX_OP_IDS as u64,
        ),
        (
            "MSCCLPP_EXEC_PLAN_BARRIERS",
            crate::executor::EXEC_PLAN_BARRIERS as u64,
        ),
        (
            "MSCCLPP_EXEC_MAX_GROUPS",
            crate::executor::EXEC_MAX_GROUPS as u64,
        ),
        (
            "MSCCLPP_EXEC_MAX_BARRIERS",
            crate::executor::EXEC_MAX_BARRIERS as u64,
        ),
        (
            "MSCCLPP_EXEC_MAX_SEMAPHORES",
            crate::executor::EXEC_MAX_SEMAPHORES as u64,
        ),
        (
            "MSCCLPP_EXEC_BUF_INPUT",
            crate::executor::EXEC_BUF_INPUT as u64,
        ),
        (
            "MSCCLPP_EXEC_BUF_OUTPUT",
            crate::executor::EXEC_BUF_OUTPUT as u64,
        ),
        (
            "MSCCLPP_EXEC_BUF_SCRATCH",
            crate::executor::EXEC_BUF_SCRATCH as u64,
        ),
        (
            "MSCCLPP_EXEC_BUF_MEMORY",
            crate::executor::EXEC_BUF_MEMORY as u64,
        ),
        (
            "MSCCLPP_EXEC_BUF_PORT",
            crate::executor::EXEC_BUF_PORT as u64,
        ),
        (
            "MSCCLPP_EXEC_CHANNEL_NONE",
            crate::executor::EXEC_CHANNEL_NONE as u64,
        ),
        (
            "MSCCLPP_EXEC_CHANNEL_MEMORY",
            crate::executor::EXEC_CHANNEL_MEMORY as u64,
        ),
        (
            "MSCCLPP_EXEC_CHANNEL_PORT",
            crate::executor::EXEC_CHANNEL_PORT as u64,
        ),
        (
            "MSCCLPP_EXEC_PACKET_LL16",
            crate::executor::EXEC_PACKET_LL16 as u64,
        ),
        (
            "MSCCLPP_EXEC_PACKET_LL8",
            crate::executor::EXEC_PACKET_LL8 as u64,
        ),
    ]
};
