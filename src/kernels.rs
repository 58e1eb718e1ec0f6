//! The kernel registry: each built-in kernel's PTX entry point and host function, so callers
//! launch by kernel, not by backend (`Module::kernel(kernels::COPY)`).

use mscclpp_device::collectives as c;
use mscclpp_device::kernels as k;
use mscclpp_device::test_kernels as t;
use mscclpp_host::gpu::KernelSpec;
use mscclpp_shared::{
    BlockSumParams, BlockVoteParams, CollectiveParams, CopyParams, DirectCollectiveParams,
    ExecutorParams, FifoPushParams, P2pParams, PingPongParams, PortCollectiveParams,
    PortPingPongParams, TestKernelParams, TraceClockParams,
};

/// `copy_kernel`: grid-stride copy.
pub const COPY: KernelSpec<CopyParams> = KernelSpec::new("copy_kernel", k::copy_kernel);
/// `block_sum_kernel`: per-block sum through shared memory.
pub const BLOCK_SUM: KernelSpec<BlockSumParams> =
    KernelSpec::new("block_sum_kernel", k::block_sum_kernel);
/// `block_vote_kernel`: test of the block-wide votes and the dynamic shared-memory size.
pub const BLOCK_VOTE: KernelSpec<BlockVoteParams> =
    KernelSpec::new("block_vote_kernel", k::block_vote_kernel);
/// `fifo_push_kernel`: FIFO producer test/benchmark.
pub const FIFO_PUSH: KernelSpec<FifoPushParams> =
    KernelSpec::new("fifo_push_kernel", k::fifo_push_kernel);

/// `trace_clock_kernel`: answers a trace's clock pings (one thread).
pub const TRACE_CLOCK: KernelSpec<TraceClockParams> = KernelSpec::new(
    "trace_clock_kernel",
    mscclpp_device::trace::trace_clock_kernel,
);

/// `memory_ping_pong_kernel`: MemoryChannel put/signal/wait ping-pong.
pub const MEMORY_PING_PONG: KernelSpec<PingPongParams> =
    KernelSpec::new("memory_ping_pong_kernel", k::memory_ping_pong_kernel);
/// `packet_ping_pong_kernel`: LL16 packet ping-pong.
pub const PACKET_PING_PONG: KernelSpec<PingPongParams> =
    KernelSpec::new("packet_ping_pong_kernel", k::packet_ping_pong_kernel);
/// `port_ping_pong_kernel`: PortChannel ping-pong through the proxy.
pub const PORT_PING_PONG: KernelSpec<PortPingPongParams> =
    KernelSpec::new("port_ping_pong_kernel", k::port_ping_pong_kernel);

/// `ll_collective_kernel`: one-shot LL16 reduce-scatter, all-to-all, broadcast and two-rank
/// exchange (and all-reduce and all-gather, which `LL_ALL_REDUCE` / `LL_ALL_GATHER` serve
/// faster).
pub const LL_COLLECTIVE: KernelSpec<CollectiveParams> =
    KernelSpec::new("ll_collective_kernel", c::ll_collective_kernel);
/// `ll_all_reduce_kernel`: the LL all-reduce in a kernel of its own (fewer branches).
pub const LL_ALL_REDUCE: KernelSpec<CollectiveParams> =
    KernelSpec::new("ll_all_reduce_kernel", c::ll_all_reduce_kernel);
/// `ll_all_gather_kernel`: the LL all-gather in a kernel of its own.
pub const LL_ALL_GATHER: KernelSpec<CollectiveParams> =
    KernelSpec::new("ll_all_gather_kernel", c::ll_all_gather_kernel);
/// `ll_reduce_kernel`: the LL reduce to a root, every type and operator.
pub const LL_REDUCE: KernelSpec<CollectiveParams> =
    KernelSpec::new("ll_reduce_kernel", c::ll_reduce_kernel);
/// `ll128_all_reduce_kernel`: the all-reduce with LL128 lines (medium messages).
pub const LL128_ALL_REDUCE: KernelSpec<CollectiveParams> =
    KernelSpec::new("ll128_all_reduce_kernel", c::ll128_all_reduce_kernel);
/// `ll128_collective_kernel`: all-gather and reduce-scatter with LL128 lines.
pub const LL128_COLLECTIVE: KernelSpec<CollectiveParams> =
    KernelSpec::new("ll128_collective_kernel", c::ll128_collective_kernel);
/// `ll_two_shot_all_reduce_kernel`: the all-reduce as an LL16 reduce-scatter and all-gather in
/// one launch (medium messages on more than a few ranks).
pub const LL_TWO_SHOT_ALL_REDUCE: KernelSpec<CollectiveParams> = KernelSpec::new(
    "ll_two_shot_all_reduce_kernel",
    c::ll_two_shot_all_reduce_kernel,
);
/// `staged_collective_kernel`: every collective through the staging buffers.
pub const STAGED_COLLECTIVE: KernelSpec<CollectiveParams> =
    KernelSpec::new("staged_collective_kernel", c::staged_collective_kernel);
/// `direct_collective_kernel`: every collective on the callers' registered buffers.
pub const DIRECT_COLLECTIVE: KernelSpec<DirectCollectiveParams> =
    KernelSpec::new("direct_collective_kernel", c::direct_collective_kernel);

/// `port_collective_kernel`: every collective through PortChannels (the proxies: the network
/// between nodes), one piece at a time, for every type and operator.
pub const PORT_COLLECTIVE: KernelSpec<PortCollectiveParams> =
    KernelSpec::new("port_collective_kernel", c::port_collective_kernel);
/// `executor_kernel`: the interpreter of MSCCL++ execution plans (one block per plan
/// threadblock, `mscclpp::executor`).
pub const EXECUTOR: KernelSpec<ExecutorParams> =
    KernelSpec::new("executor_kernel", mscclpp_device::executor::executor_kernel);
/// `p2p_kernel`: the point-to-point engine (a batch of sends and receives to any peers).
pub const P2P: KernelSpec<P2pParams> = KernelSpec::new("p2p_kernel", c::p2p_kernel);

// The `_any` twins of the reducing kernels: every type and operator but the sums and pre-multiplied sums
// of f16, bf16 and f32, which the kernels above reduce without paying for the others in registers.

/// `ll_collective_any_kernel`: `ll_collective_kernel` (all-reduce included) for every type
/// and operator.
pub const LL_COLLECTIVE_ANY: KernelSpec<CollectiveParams> =
    KernelSpec::new("ll_collective_any_kernel", c::ll_collective_any_kernel);
/// `ll128_collective_any_kernel`: the LL128 all-reduce and reduce-scatter for every type and
/// operator.
pub const LL128_COLLECTIVE_ANY: KernelSpec<CollectiveParams> = KernelSpec::new(
    "ll128_collective_any_kernel",
    c::ll128_collective_any_kernel,
);
/// `ll_two_shot_all_reduce_any_kernel`: the two-shot LL all-reduce for every type and operator.
pub const LL_TWO_SHOT_ALL_REDUCE_ANY: KernelSpec<CollectiveParams> = KernelSpec::new(
    "ll_two_shot_all_reduce_any_kernel",
    c::ll_two_shot_all_reduce_any_kernel,
);
/// `staged_collective_any_kernel`: the staged collectives for every type and operator.
pub const STAGED_COLLECTIVE_ANY: KernelSpec<CollectiveParams> = KernelSpec::new(
    "staged_collective_any_kernel",
    c::staged_collective_any_kernel,
);
/// `direct_collective_any_kernel`: the direct collectives for every type and operator.
pub const DIRECT_COLLECTIVE_ANY: KernelSpec<DirectCollectiveParams> = KernelSpec::new(
    "direct_collective_any_kernel",
    c::direct_collective_any_kernel,
);

/// `reduce_words_test_kernel`: `reduce_word` over arrays (tests of the GPU's packed f16x2 and
/// bf16x2 sums against a host reference).
pub const TEST_REDUCE_WORDS: KernelSpec<TestKernelParams> =
    KernelSpec::new("reduce_words_test_kernel", t::reduce_words_test_kernel);
/// `ll128_blocks_test_kernel`: LL128 lines from block 0 to block 1 of one launch (tests of the
/// GPU's whole-line stores on one GPU).
pub const TEST_LL128_BLOCKS: KernelSpec<TestKernelParams> =
    KernelSpec::new("ll128_blocks_test_kernel", t::ll128_blocks_test_kernel);

/// Every built-in kernel's entry point name (checked against the PTX by a test).
pub const ALL_NAMES: &[&str] = &[
    COPY.name,
    BLOCK_SUM.name,
    BLOCK_VOTE.name,
    FIFO_PUSH.name,
    TRACE_CLOCK.name,
    MEMORY_PING_PONG.name,
    PACKET_PING_PONG.name,
    PORT_PING_PONG.name,
    LL_COLLECTIVE.name,
    LL_ALL_REDUCE.name,
    LL_ALL_GATHER.name,
    LL_REDUCE.name,
    LL128_ALL_REDUCE.name,
    LL128_COLLECTIVE.name,
    LL_TWO_SHOT_ALL_REDUCE.name,
    STAGED_COLLECTIVE.name,
    DIRECT_COLLECTIVE.name,
    PORT_COLLECTIVE.name,
    P2P.name,
    EXECUTOR.name,
    LL_COLLECTIVE_ANY.name,
    LL128_COLLECTIVE_ANY.name,
    LL_TWO_SHOT_ALL_REDUCE_ANY.name,
    STAGED_COLLECTIVE_ANY.name,
    DIRECT_COLLECTIVE_ANY.name,
    TEST_REDUCE_WORDS.name,
    TEST_LL128_BLOCKS.name,
];
