//! 03 — PortChannel: a GPU thread asks a host proxy to move the data.
//!
//! A `MemoryChannel` (example 02) needs the peer's memory mapped into this GPU. A `PortChannel`
//! does not: one GPU thread pushes 16-byte requests ("triggers": put these bytes there, signal,
//! flush) into a FIFO in host memory, and a proxy thread of the `PortChannelService` carries them
//! out with the connection's copy engine (or, between nodes, the network), then signals the
//! peer's semaphore. The GPU never stops to wait for the copy unless it asks to (`flush`).
//!
//! Set-up, per rank: connect; give the service a semaphore over that connection and the two
//! memories the channel names (the peer's inbox as destination, our outbox as source); ask it
//! for the channel's device handle; start the proxy; launch the built-in `port_ping_pong_kernel`.
//!
//! ```sh
//! cargo run --release --example 03-port-channel-put   # CPU backend without a GPU
//! ```

mod common;

use std::time::Instant;

use common::{Result, check_data, check_device_status, pattern, ranks_as_threads};
use mscclpp::host::communicator::Communicator;
use mscclpp::host::connection::EndpointConfig;
use mscclpp::host::gpu::{BackendKind, LaunchConfig};
use mscclpp::host::port_channel::PortChannelService;
use mscclpp::host::transport::Transport;
use mscclpp::kernels;
use mscclpp::shared::{DEFAULT_FIFO_SIZE, PortPingPongParams};

/// Bytes per put and round trips.
fn message(backend: BackendKind) -> (usize, u32) {
    match backend {
        BackendKind::Cuda => (16 << 20, 50),
        BackendKind::Cpu => (1 << 20, 10),
    }
}

/// One rank; returns the seconds its kernel took.
fn rank_main(comm: Communicator) -> Result<f64> {
    let (rank, peer) = (comm.rank(), 1 - comm.rank());
    let gpu = comm.gpu().clone();
    let (bytes, iterations) = message(gpu.kind());
    let transport = Transport::local_for(gpu.kind());
    let conn = comm.connect(EndpointConfig::new(transport), peer, 0)?;

    let inbox = gpu.alloc(bytes)?;
    let outbox = gpu.alloc(bytes)?;
    outbox.copy_from_host(0, &pattern(bytes, 100 + rank as u8))?;
    comm.send_memory(&comm.register_buffer(&inbox, transport)?, peer, 0)?;

    // Ids are indices into the service's tables; a trigger names them, and the proxy checks
    // every id, offset and size against what was added here before copying anything.
    let mut service = PortChannelService::builder(comm.gpu(), comm.status(), DEFAULT_FIFO_SIZE)?;
    let semaphore = service.add_semaphore(comm.build_semaphore(conn, 0)?)?;
    let dst = service.add_memory(comm.recv_memory(peer, 0)?)?;
    let src = service.add_memory(comm.register_buffer(&outbox, transport)?)?;
    let channel = service.port_channel(semaphore, dst, src)?;
    let service = service.start()?;

    let module = gpu.load_ptx(mscclpp::DEVICE_PTX)?;
    let kernel = module.kernel(kernels::PORT_PING_PONG)?;
    let stream = gpu.stream()?;
    let params = PortPingPongParams {
        status: comm.status().device_ptr(),
        channel,
        bytes: bytes as u64,
        iterations,
        role: rank as u32,
        flush: 0,
        reserved: 0,
        trace: mscclpp::shared::TraceDeviceHandle::OFF,
    };
    // Both ranks start together, so the wall time measures the exchange, not the set-up skew.
    comm.bootstrap().barrier()?;
    let started = Instant::now();
    // SAFETY: both memories are `bytes` long and outlive the launch (we synchronize below).
    unsafe { stream.launch(&kernel, LaunchConfig::new(1, 1), params)? };
    stream.synchronize()?;
    let seconds = started.elapsed().as_secs_f64();
    check_device_status(&comm)?;
    if let Some(e) = service.error() {
        return Err(format!("proxy: {e}").into());
    }

    let mut got = vec![0u8; bytes];
    inbox.copy_to_host(0, &mut got)?;
    check_data(
        &format!("rank {rank}'s inbox"),
        &got,
        &pattern(bytes, 100 + peer as u8),
    )?;
    // Stop our proxy and free our memories only once the peer's kernel (which waits for our
    // proxy's signals) and the peer's proxy (which writes into our inbox) are done.
    comm.bootstrap().barrier()?;
    service.stop()?;
    Ok(seconds)
}

/// Prints an error with its causes and exits with a failure (`mscclpp::exit_code`).
fn main() -> std::process::ExitCode {
    mscclpp::exit_code(run())
}

fn run() -> Result {
    let backend = BackendKind::select()?;
    let (bytes, iterations) = message(backend);
    println!(
        "{backend:?} backend: 2 ranks, {iterations} round trips of {} KiB through the proxy",
        bytes >> 10
    );
    let seconds = ranks_as_threads(2, backend, rank_main)?;
    for (rank, s) in seconds.iter().enumerate() {
        // Each rank sent `iterations` messages of `bytes` while receiving as many.
        let gbps = (bytes as f64 * f64::from(iterations)) / s / 1e9;
        println!(
            "rank {rank}: data checked; {:.2} ms, {gbps:.2} GB/s sent per direction ({:.1} µs per round trip)",
            s * 1e3,
            s * 1e6 / f64::from(iterations)
        );
    }
    Ok(())
}
