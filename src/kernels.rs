//! The kernel registry: each built-in kernel's PTX entry point and host function, so callers
//! launch by kernel, not by backend (`Module::kernel(kernels::COPY)`).

use mscclpp_device::kernels as k;
use mscclpp_host::gpu::KernelSpec;
use mscclpp_shared::{BlockSumParams, CopyParams, FifoPushParams};

/// `copy_kernel`: grid-stride copy.
pub const COPY: KernelSpec<CopyParams> = KernelSpec::new("copy_kernel", k::copy_kernel);
/// `block_sum_kernel`: per-block sum through shared memory.
pub const BLOCK_SUM: KernelSpec<BlockSumParams> =
    KernelSpec::new("block_sum_kernel", k::block_sum_kernel);
/// `fifo_push_kernel`: FIFO producer test/benchmark.
pub const FIFO_PUSH: KernelSpec<FifoPushParams> =
    KernelSpec::new("fifo_push_kernel", k::fifo_push_kernel);

/// Every built-in kernel's entry point name (checked against the PTX by a test).
pub const ALL_NAMES: &[&str] = &[COPY.name, BLOCK_SUM.name, FIFO_PUSH.name];
