//! The port kernel's launch (`port_collective_kernel`, `mscclpp_device::collectives::port`):
//! one exchange over PortChannels with the ranks in its masks, for the port collective and
//! the hierarchical all-reduce's network phase.

use mscclpp_host::Result;
use mscclpp_host::gpu::{Kernel, LaunchConfig, Stream};
use mscclpp_shared::{CollectiveMode, DataType, DevicePtr, PortCollectiveParams};

use crate::collectives::context::Context;
use crate::collectives::reduction::KernelOp;

/// One launch of the port kernel, as [`exchange`] queues it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Exchange {
    /// The kernel's mode.
    pub mode: CollectiveMode,
    /// Element type and operator.
    pub data: (DataType, KernelOp),
    /// What this rank sends from.
    pub input: DevicePtr<u8>,
    /// What it receives into.
    pub output: DevicePtr<u8>,
    /// Bytes per peer.
    pub bytes: usize,
    /// Distance between parts (all-gather, all-to-all, reduce-scatter).
    pub stride: usize,
    /// The kernels' `root` word.
    pub root: u32,
    /// Ranks this rank sends to (bit per rank).
    pub send_mask: u64,
    /// Ranks it receives from.
    pub recv_mask: u64,
}

/// Bit `q` for every rank `q` of `ranks` but `me`.
pub(crate) fn mask_of(ranks: impl IntoIterator<Item = usize>, me: usize) -> u64 {
    ranks
        .into_iter()
        .filter(|&q| q != me && q < 64)
        .fold(0, |m, q| m | 1 << q)
}

/// Queues one port-kernel launch on `stream` (nothing for zero bytes).
///
/// # Safety
/// `input` / `output` hold what `x.mode` reads and writes (`PortCollectiveParams`) until the
/// queued work completes; every rank in the masks queues the matching launch.
pub(crate) unsafe fn exchange(
    cx: &Context,
    kernel: &Kernel<PortCollectiveParams>,
    x: Exchange,
    stream: &Stream,
) -> Result<()> {
    let Some(m) = cx.multi.as_ref() else {
        return Err(cx.cannot("the port collective on a world of one node"));
    };
    if x.bytes == 0 || (x.send_mask == 0 && x.recv_mask == 0) {
        return Ok(());
    }
    cx.ensure_healthy()?;
    let mut common = cx.params(x.mode, x.data);
    common.input = x.input;
    common.output = x.output;
    common.bytes = x.bytes as u64;
    common.stride = x.stride as u64;
    common.root = x.root;
    let p = PortCollectiveParams {
        common,
        port_channels: m.table.ptr().cast(),
        counters: m.counters.ptr().cast(),
        send_mask: x.send_mask,
        recv_mask: x.recv_mask,
        port_offset: cx.layout.port_offset(),
        slot_bytes: cx.layout.port_slot_bytes(),
    };
    // SAFETY: the caller's contract for the buffers; the scratch, channel table and counters
    // live as long as the `Collectives`.
    unsafe { stream.launch(kernel, LaunchConfig::new(1, cx.cfg.port_threads), p) }
}
