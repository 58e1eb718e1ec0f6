//! 04 — CUDA C++ kernels on mscclpp-rs channels.
//!
//! The device API is not only Rust: `shared/include/mscclpp/device.cuh` offers the same
//! operations to CUDA C++ over the C twins of the handles (`shared/include/mscclpp/layout.h`),
//! with the same protocol, so a kernel compiled by nvcc drives our Rust proxy and exchanges data
//! with the peer GPU exactly as a Rust kernel does. `examples/cuda_c/port_and_memory.cu` holds
//! CUDA C++ twins of the built-in ping-pong kernels; this program builds the channels in Rust,
//! loads that file's PTX with `Gpu::load_module_file`, names its kernels with
//! `KernelSpec::ptx_only`, fills the very parameter structs the Rust kernels take, and runs:
//! a MemoryChannel ping-pong, a PortChannel ping-pong (without and with flushes) and LL16 / LL8
//! packet ping-pongs, checking the data after each.
//!
//! ```sh
//! nvcc -arch=sm_90 -ptx -I shared/include -o examples/cuda_c/port_and_memory.ptx \
//!      examples/cuda_c/port_and_memory.cu
//! MSCCLPP_BACKEND=cuda cargo run --release --example 04-cuda-c-kernel [PTX path]
//! ```
//!
//! The PTX path is the first argument, else `$MSCCLPP_CUDA_C_PTX`, else
//! `examples/cuda_c/port_and_memory.ptx`. PTX runs only on GPUs: on the CPU backend this
//! example says so and exits successfully, unless `MSCCLPP_BACKEND=cuda` asked for GPUs.

mod common;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use common::{Result, check_data, check_device_status, pattern, ranks_as_threads};
use mscclpp::device::packet::packets_for;
use mscclpp::host::communicator::Communicator;
use mscclpp::host::connection::EndpointConfig;
use mscclpp::host::gpu::{BackendKind, Event, KernelSpec, LaunchConfig, Stream};
use mscclpp::host::memory_channel::MemoryChannel;
use mscclpp::host::port_channel::PortChannelService;
use mscclpp::host::transport::Transport;
use mscclpp::shared::{
    DEFAULT_FIFO_SIZE, LL8Packet, LL16Packet, PingPongParams, PortPingPongParams,
};

/// The kernels of `examples/cuda_c/port_and_memory.cu` (PTX only: no host build exists).
const PORT_PING_PONG: KernelSpec<PortPingPongParams> =
    KernelSpec::ptx_only("cuda_c_port_ping_pong");
const MEMORY_PING_PONG: KernelSpec<PingPongParams> =
    KernelSpec::ptx_only("cuda_c_memory_ping_pong");
const LL16_PING_PONG: KernelSpec<PingPongParams> = KernelSpec::ptx_only("cuda_c_ll16_ping_pong");
const LL8_PING_PONG: KernelSpec<PingPongParams> = KernelSpec::ptx_only("cuda_c_ll8_ping_pong");

/// Where the PTX is looked for when neither the first argument nor [`PTX_ENV`] names a file.
const DEFAULT_PTX: &str = "examples/cuda_c/port_and_memory.ptx";
/// Environment variable naming the PTX (or cubin) file.
const PTX_ENV: &str = "MSCCLPP_CUDA_C_PTX";

/// Bytes per message (not a multiple of 16 or 8, so the copy and packet tails run too).
const BYTES: usize = 256 * 1024 + 12;
/// Round trips per kernel.
const ITERATIONS: u32 = 100;
/// Threads of the one block of the MemoryChannel kernels.
const THREADS: u32 = 512;

fn ptx_path() -> PathBuf {
    std::env::args_os()
        .nth(1)
        .or_else(|| std::env::var_os(PTX_ENV))
        .map_or_else(|| PathBuf::from(DEFAULT_PTX), PathBuf::from)
}

/// Launches `launch` between two events and returns the microseconds per round trip.
fn timed(
    stream: &Stream,
    start: &Event,
    end: &Event,
    launch: impl FnOnce() -> Result,
) -> Result<f64> {
    stream.record(start)?;
    launch()?;
    stream.record(end)?;
    stream.synchronize()?;
    Ok(f64::from(end.elapsed_ms(start)?) * 1e3 / f64::from(ITERATIONS))
}

/// One rank; returns `(kernel, µs per round trip)` for each run.
fn rank_main(comm: Communicator, ptx: &Path) -> Result<Vec<(&'static str, f64)>> {
    let (rank, peer) = (comm.rank(), 1 - comm.rank());
    let gpu = comm.gpu().clone();
    let transport = Transport::local_for(gpu.kind());
    let conn = comm.connect(EndpointConfig::new(transport), peer, 0)?;
    let barrier = || comm.bootstrap().barrier();

    // outbox: what this rank sends. inbox / port_inbox: where the peer's MemoryChannel / proxy
    // writes. packets: where the peer's LL packets land (room for either packet size).
    let outbox = gpu.alloc(BYTES)?;
    let inbox = gpu.alloc(BYTES)?;
    let port_inbox = gpu.alloc(BYTES)?;
    let packet_bytes =
        (packets_for::<LL16Packet>(BYTES) * 16).max(packets_for::<LL8Packet>(BYTES) * 8);
    let packets = gpu.alloc(packet_bytes)?;
    outbox.copy_from_host(0, &pattern(BYTES, rank as u8))?;
    comm.send_memory(&comm.register_buffer(&inbox, transport)?, peer, 0)?;
    comm.send_memory(&comm.register_buffer(&packets, transport)?, peer, 1)?;
    comm.send_memory(&comm.register_buffer(&port_inbox, transport)?, peer, 2)?;

    // Two MemoryChannels: into the peer's inbox (put + signal), into its packet buffer (LL).
    let direct = MemoryChannel::new(
        comm.build_memory_semaphore(conn.as_ref(), 0)?,
        comm.recv_memory(peer, 0)?,
        outbox.ptr(),
        packets.ptr(),
    )?;
    let packet_channel = MemoryChannel::new(
        comm.build_memory_semaphore(conn.as_ref(), 1)?,
        comm.recv_memory(peer, 1)?,
        outbox.ptr(),
        packets.ptr(),
    )?;
    // One PortChannel through this rank's proxy: from our outbox into the peer's port_inbox.
    let mut service = PortChannelService::builder(comm.gpu(), comm.status(), DEFAULT_FIFO_SIZE)?;
    let semaphore = service.add_semaphore(comm.build_semaphore(conn.clone(), 2)?)?;
    let dst = service.add_memory(comm.recv_memory(peer, 2)?)?;
    let src = service.add_memory(comm.register_buffer(&outbox, transport)?)?;
    let port = service.port_channel(semaphore, dst, src)?;
    let service = service.start()?;

    // The CUDA C++ kernels, from nvcc's PTX.
    let module = gpu.load_module_file(ptx)?;
    let stream = gpu.stream()?;
    let (start, end) = (gpu.event()?, gpu.event()?);
    let memory_params = |channel: &MemoryChannel, flag_base: u32| -> Result<PingPongParams> {
        Ok(PingPongParams {
            status: comm.status().device_ptr(),
            channel: channel.device_handle()?,
            bytes: BYTES as u64,
            iterations: ITERATIONS,
            role: rank as u32,
            flag_base,
            reserved: 0,
        })
    };
    let mut times = Vec::new();
    let mut got = vec![0u8; BYTES];

    // 1. MemoryChannel: every thread stores into the peer's inbox, thread 0 signals.
    barrier()?;
    let kernel = module.kernel(MEMORY_PING_PONG)?;
    let params = memory_params(&direct, 0)?;
    let us = timed(&stream, &start, &end, || {
        // SAFETY: the channel's buffers are BYTES long and live until after the synchronize.
        unsafe { stream.launch(&kernel, LaunchConfig::new(1, THREADS), params) }?;
        Ok(())
    })?;
    check_device_status(&comm)?;
    inbox.copy_to_host(0, &mut got)?;
    check_data("memory ping-pong", &got, &pattern(BYTES, peer as u8))?;
    times.push(("cuda_c_memory_ping_pong", us));

    // 2. PortChannel: thread 0 pushes put-with-signal triggers; the proxy copies and signals.
    let kernel = module.kernel(PORT_PING_PONG)?;
    for (flush, name) in [
        (0, "cuda_c_port_ping_pong"),
        (1, "cuda_c_port_ping_pong (flush)"),
    ] {
        port_inbox.copy_from_host(0, &vec![0u8; BYTES])?;
        barrier()?;
        let params = PortPingPongParams {
            status: comm.status().device_ptr(),
            channel: port,
            bytes: BYTES as u64,
            iterations: ITERATIONS,
            role: rank as u32,
            flush,
            reserved: 0,
            trace: mscclpp::shared::TraceDeviceHandle::OFF,
        };
        let us = timed(&stream, &start, &end, || {
            // SAFETY: the memories are BYTES long and live until after the synchronize.
            unsafe { stream.launch(&kernel, LaunchConfig::new(1, 1), params) }?;
            Ok(())
        })?;
        check_device_status(&comm)?;
        if let Some(e) = service.error() {
            return Err(format!("proxy: {e}").into());
        }
        port_inbox.copy_to_host(0, &mut got)?;
        check_data(name, &got, &pattern(BYTES, peer as u8))?;
        times.push((name, us));
    }

    // 3. LL packets: rank 1 unpacks what rank 0 sends into its outbox and sends it back, so
    // both end with rank 0's bytes. Rank 1 clears its outbox first, so only the packets can
    // fill it. Flags continue across runs (flag_base), so stale packets never match.
    let runs = [
        (LL16_PING_PONG, "cuda_c_ll16_ping_pong", 0),
        (LL8_PING_PONG, "cuda_c_ll8_ping_pong", ITERATIONS),
    ];
    for (spec, name, flag_base) in runs {
        if rank == 1 {
            outbox.copy_from_host(0, &vec![0u8; BYTES])?;
        }
        barrier()?;
        let kernel = module.kernel(spec)?;
        let params = memory_params(&packet_channel, flag_base)?;
        let us = timed(&stream, &start, &end, || {
            // SAFETY: the buffers are BYTES long, the packet buffers hold BYTES of packets, and
            // all live until after the synchronize.
            unsafe { stream.launch(&kernel, LaunchConfig::new(1, THREADS), params) }?;
            Ok(())
        })?;
        check_device_status(&comm)?;
        outbox.copy_to_host(0, &mut got)?;
        check_data(name, &got, &pattern(BYTES, 0))?;
        times.push((name, us));
    }

    // Free nothing and stop no proxy before the peer is done with them.
    barrier()?;
    service.stop()?;
    Ok(times)
}

fn run() -> Result {
    let backend = BackendKind::select()?;
    if backend != BackendKind::Cuda {
        println!(
            "04-cuda-c-kernel: CUDA C++ kernels need a GPU (the CUDA backend); the {backend:?} \
             backend cannot run PTX, so there is nothing to do here. Run it on a GPU machine \
             (MSCCLPP_BACKEND=cuda to insist)."
        );
        return Ok(());
    }
    let devices = backend.device_count().map_err(|e| {
        format!("MSCCLPP_BACKEND=cuda asked for GPUs, but the CUDA backend is not usable here: {e}")
    })?;
    if devices == 0 {
        return Err("MSCCLPP_BACKEND=cuda asked for GPUs, but the CUDA driver reports none".into());
    }
    let ptx = ptx_path();
    if !ptx.is_file() {
        return Err(format!(
            "no PTX at {}; compile the CUDA C++ kernels first:\n  nvcc -arch=sm_90 -ptx -I shared/include -o {DEFAULT_PTX} examples/cuda_c/port_and_memory.cu\n(or give the PTX/cubin path as the first argument or in {PTX_ENV})",
            ptx.display()
        )
        .into());
    }
    println!(
        "CUDA backend, {devices} GPU(s): 2 ranks, {ITERATIONS} round trips of {BYTES} bytes, kernels from {}",
        ptx.display()
    );
    let times = ranks_as_threads(2, backend, |comm| rank_main(comm, &ptx))?;
    for (rank, runs) in times.iter().enumerate() {
        for (name, us) in runs {
            println!("rank {rank}: {name:<32} data checked; {us:8.2} µs per round trip");
        }
    }
    Ok(())
}

/// Prints an error with its causes and exits with a failure (`mscclpp::exit_code`).
fn main() -> ExitCode {
    mscclpp::exit_code(run())
}
