//! 02 — MemoryChannel: GPU threads store straight into the peer GPU's memory.
//!
//! Two ranks each map the other's receive buffer (CUDA IPC on GPUs; a shared memory mapping on
//! the CPU backend) and pair it with a GPU↔GPU semaphore: that is a `MemoryChannel`. The
//! built-in `memory_ping_pong_kernel` then bounces a message back and forth: rank 0's block
//! copies its buffer into rank 1's with 16-byte stores and signals; rank 1 waits for the signal
//! and answers the same way. No host thread is involved once the kernels run.
//!
//! Set-up, per rank: connect to the peer, register the receive buffer and send it over, receive
//! the peer's (already mapped here), build the semaphore, build the channel, launch.
//!
//! ```sh
//! cargo run --release --example 02-memory-channel-ping-pong   # CPU backend without a GPU
//! ```

mod common;

use common::{Result, check_data, check_device_status, pattern, ranks_as_threads};
use mscclpp::host::communicator::Communicator;
use mscclpp::host::connection::EndpointConfig;
use mscclpp::host::gpu::{BackendKind, LaunchConfig};
use mscclpp::host::memory_channel::MemoryChannel;
use mscclpp::host::transport::Transport;
use mscclpp::kernels;
use mscclpp::shared::{DevicePtr, PingPongParams};

/// Bytes per message.
const BYTES: usize = 64 * 1024;

/// Round trips and threads per block: the CPU backend runs one OS thread per GPU thread.
fn iterations_and_threads(backend: BackendKind) -> (u32, u32) {
    match backend {
        BackendKind::Cuda => (1000, 512),
        BackendKind::Cpu => (20, 32),
    }
}

/// One rank; returns the time of one round trip in microseconds.
fn rank_main(comm: Communicator) -> Result<f64> {
    let (rank, peer) = (comm.rank(), 1 - comm.rank());
    let gpu = comm.gpu().clone();
    let (iterations, threads) = iterations_and_threads(gpu.kind());
    let transport = Transport::local_for(gpu.kind());
    let conn = comm.connect(EndpointConfig::new(transport), peer, 0)?;

    // The peer writes into `inbox`; our kernel reads `outbox` and writes into the peer's inbox.
    let inbox = gpu.alloc(BYTES)?;
    let outbox = gpu.alloc(BYTES)?;
    outbox.copy_from_host(0, &pattern(BYTES, rank as u8))?;
    comm.send_memory(&comm.register_buffer(&inbox, transport)?, peer, 0)?;
    let peer_inbox = comm.recv_memory(peer, 0)?;

    let semaphore = comm.build_memory_semaphore(conn.as_ref(), 0)?;
    // No LL packets in this example: no packet buffer.
    let channel = MemoryChannel::new(semaphore, peer_inbox, outbox.ptr(), DevicePtr::NULL)?;

    let module = gpu.load_ptx(mscclpp::DEVICE_PTX)?;
    let kernel = module.kernel(kernels::MEMORY_PING_PONG)?;
    let stream = gpu.stream()?;
    let params = PingPongParams {
        status: comm.status().device_ptr(),
        channel: channel.device_handle()?,
        bytes: BYTES as u64,
        iterations,
        role: rank as u32,
        flag_base: 0,
        reserved: 0,
    };
    let (start, end) = (gpu.event()?, gpu.event()?);
    stream.record(&start)?;
    // SAFETY: both buffers are BYTES long and outlive the launch (we synchronize below).
    unsafe { stream.launch(&kernel, LaunchConfig::new(1, threads), params)? };
    stream.record(&end)?;
    stream.synchronize()?;
    check_device_status(&comm)?;

    let mut got = vec![0u8; BYTES];
    inbox.copy_to_host(0, &mut got)?;
    check_data(
        &format!("rank {rank}'s inbox"),
        &got,
        &pattern(BYTES, peer as u8),
    )?;
    let round_trip_us = f64::from(end.elapsed_ms(&start)?) * 1e3 / f64::from(iterations);
    // Keep every buffer alive until the peer is done writing into it.
    comm.bootstrap().barrier()?;
    Ok(round_trip_us)
}

/// Prints an error with its causes and exits with a failure (`mscclpp::exit_code`).
fn main() -> std::process::ExitCode {
    mscclpp::exit_code(run())
}

fn run() -> Result {
    let backend = BackendKind::select()?;
    let (iterations, threads) = iterations_and_threads(backend);
    println!(
        "{backend:?} backend: 2 ranks, {iterations} round trips of {BYTES} bytes, 1 block of {threads} threads"
    );
    let times = ranks_as_threads(2, backend, rank_main)?;
    for (rank, us) in times.iter().enumerate() {
        println!("rank {rank}: data checked; {us:.2} µs per round trip");
    }
    Ok(())
}
