//! 05 — Collectives two ways: on a stream and buffers someone else owns, and typed.
//!
//! `Collectives` (built on the communicator of examples 02–04) runs NCCL's collectives. Its
//! calls come in two forms:
//!
//! 1. **Raw**, for memory and streams of another library: a stream given as the integer its
//!    backend names it by (on CUDA a `CUstream`: PyTorch's
//!    `torch.cuda.current_stream().cuda_stream`, cudarc's `CudaStream::cu_stream()`, the C
//!    ABI's `cudaStream_t`; on the CPU backend one of its own stream handles) is borrowed with
//!    `Gpu::borrow_stream`, used without being owned, and left alone when dropped; buffers are
//!    device addresses from any allocator (here a stand-in: our own allocation, passed as a
//!    bare address). These calls are `unsafe`: the caller vouches for the addresses.
//! 2. **Typed**, for Rust programs: `DeviceVec<T>` owns its memory, its element type gives the
//!    collective's data type (`f32` → `DataType::F32`, through a sealed trait), lengths are
//!    checked before anything is queued, and a vector waits for its queued uses before it is
//!    freed or read: no `unsafe` at all.
//!
//! The same code runs on the CPU backend (no GPU) and on GPUs.
//!
//! ```sh
//! cargo run --example 05-collectives-foreign-and-typed
//! ```

mod common;

use std::sync::Arc;

use common::{Result, check_device_status, ranks_as_threads};
use mscclpp::collectives::{Collectives, DeviceVec, Reduction};
use mscclpp::host::communicator::Communicator;
use mscclpp::host::gpu::BackendKind;
use mscclpp::shared::{DataType, ReduceOp};

const RANKS: usize = 2;
const COUNT: usize = 1 << 12;

fn rank_main(comm: Communicator) -> Result<()> {
    let rank = comm.rank();
    let c = Collectives::new(Arc::new(comm))?;
    let gpu = c.communicator().gpu().clone();

    // --- 1. Raw: another library's stream and buffer. -----------------------------------
    // "Theirs": a stream and a buffer owned elsewhere; all we get is two integers.
    let their_stream = gpu.stream()?;
    let their_buffer = gpu.alloc(COUNT * 4)?;
    let (stream_handle, buffer_addr) = (their_stream.raw(), their_buffer.ptr().addr());
    let mine: Vec<f32> = (0..COUNT).map(|i| (rank * COUNT + i) as f32).collect();
    their_buffer.copy_from_host(0, bytemuck::cast_slice(&mine))?;

    // SAFETY: the handle names a live stream of this device, which outlives `stream`.
    let stream = unsafe { gpu.borrow_stream(stream_handle) }?;
    let buf = mscclpp::shared::DevicePtr::<u8>::from_addr(buffer_addr);
    // SAFETY: `buf` holds COUNT f32 and stays allocated until the stream is synchronised.
    unsafe { c.all_reduce(buf, buf, COUNT, DataType::F32, ReduceOp::Sum, &stream, None) }?;
    stream.synchronize()?;
    drop(stream); // leaves their stream alone: it still runs work
    their_stream.synchronize()?;
    check_device_status(c.communicator())?;
    let mut got = vec![0f32; COUNT];
    their_buffer.copy_to_host(0, bytemuck::cast_slice_mut(&mut got))?;
    let want = |i: usize| (0..RANKS).map(|r| (r * COUNT + i) as f32).sum::<f32>();
    if got.iter().enumerate().any(|(i, g)| *g != want(i)) {
        return Err(format!("rank {rank}: raw all-reduce on a borrowed stream: wrong data").into());
    }

    // --- 2. Typed: DeviceVec<f32>, no unsafe. ------------------------------------------------
    let stream = gpu.stream()?;
    let input = DeviceVec::from_host(&gpu, &mine)?;
    let mut sum = DeviceVec::<f32>::zeroed(&gpu, COUNT)?;
    c.all_reduce_vec(&input, &mut sum, Reduction::Sum, &stream)?;
    let mut gathered = DeviceVec::<f32>::zeroed(&gpu, RANKS * COUNT)?;
    c.all_gather_vec(&input, &mut gathered, &stream)?;
    // A wrong length is an error before anything is queued.
    let mut short = DeviceVec::<f32>::zeroed(&gpu, COUNT)?;
    let refused = c.all_gather_vec(&input, &mut short, &stream);
    if !matches!(refused, Err(mscclpp::host::Error::LengthMismatch { .. })) {
        return Err(format!("rank {rank}: a short output was not refused: {refused:?}").into());
    }
    // Reading a vector waits for the work queued on it.
    let sum = sum.to_host()?;
    let gathered = gathered.to_host()?;
    if sum.iter().enumerate().any(|(i, g)| *g != want(i)) {
        return Err(format!("rank {rank}: typed all-reduce: wrong data").into());
    }
    if gathered.iter().enumerate().any(|(i, g)| *g != i as f32) {
        return Err(format!("rank {rank}: typed all-gather: wrong data").into());
    }
    println!(
        "rank {rank}: raw all-reduce on a borrowed stream, typed all-reduce and all-gather of \
         {COUNT} f32: data ok"
    );
    c.communicator().barrier()?;
    Ok(())
}

fn main() -> std::process::ExitCode {
    mscclpp::exit_code(run())
}

fn run() -> Result {
    let backend = BackendKind::select()?;
    ranks_as_threads(RANKS, backend, rank_main)?;
    Ok(())
}
