//! user-kernels-demo: launches kernels a user wrote in their own crate (`my-kernels`, built to
//! PTX by `build.rs`) on ranks that run as threads of this process:
//!
//! 1. a MemoryChannel ping-pong between 2 ranks;
//! 2. a sum-allreduce over LL16 packets (u32 and f32) on 2, 3, … up to 4 ranks (or the first
//!    argument, at most 8).
//!
//! Data is checked and timings printed. The same binary runs on GPUs (the PTX) and without one
//! (the CPU backend runs `my_kernels`' host build); `MSCCLPP_BACKEND=cuda|cpu` picks.

use std::error::Error;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mscclpp::device::packet::packets_for;
use mscclpp::host::bootstrap::{BootstrapConfig, TcpBootstrap, UniqueId};
use mscclpp::host::communicator::Communicator;
use mscclpp::host::connection::EndpointConfig;
use mscclpp::host::gpu::{BackendKind, Gpu, KernelSpec, LaunchConfig};
use mscclpp::host::memory_channel::MemoryChannel;
use mscclpp::host::transport::Transport;
use mscclpp::shared::{DevicePtr, LL16Packet, MemoryChannelDeviceHandle};
use my_kernels::{AllreduceArgs, MAX_RANKS, PingPongArgs};

type Result<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

/// `my-kernels` compiled for nvptx64 by build.rs.
const MY_KERNELS_PTX: &str = mscclpp::include_ptx!("my_kernels");

/// Each kernel: its PTX entry point (the function's name, which `kernel_spec!` takes from the
/// path) and its host build (CPU backend).
const PING_PONG: KernelSpec<PingPongArgs> = mscclpp::kernel_spec!(my_kernels::ping_pong);
const ALLREDUCE_U32: KernelSpec<AllreduceArgs> =
    mscclpp::kernel_spec!(my_kernels::allreduce_sum_u32);
const ALLREDUCE_F32: KernelSpec<AllreduceArgs> =
    mscclpp::kernel_spec!(my_kernels::allreduce_sum_f32);

/// Sizes and launch shapes: small on the CPU backend (one OS thread per GPU thread).
struct Plan {
    backend: BackendKind,
    devices: usize,
    ping_pong_words: usize,
    ping_pong_iters: u32,
    ping_pong_threads: u32,
    allreduce_count: usize,
    allreduce_iters: u32,
    allreduce_grid: LaunchConfig,
}

impl Plan {
    fn new(backend: BackendKind, devices: usize) -> Self {
        match backend {
            BackendKind::Cpu => Self {
                backend,
                devices,
                ping_pong_words: 4096,
                ping_pong_iters: 50,
                ping_pong_threads: 32,
                allreduce_count: 4099, // odd: the last packet is half full
                allreduce_iters: 10,
                allreduce_grid: LaunchConfig::new(1, 32),
            },
            BackendKind::Cuda => Self {
                backend,
                devices,
                ping_pong_words: 4096,
                ping_pong_iters: 1000,
                ping_pong_threads: 256,
                allreduce_count: (1 << 20) + 3,
                allreduce_iters: 100,
                allreduce_grid: LaunchConfig::new(32, 256),
            },
        }
    }
}

/// Prints the error and its causes (not the `Debug` form `fn main() -> Result` would) and
/// exits with a failure.
fn main() -> ExitCode {
    mscclpp::exit_code(run())
}

fn run() -> Result<()> {
    let max_ranks = match std::env::args().nth(1) {
        Some(a) => a
            .parse::<usize>()
            .ok()
            .filter(|n| (2..=MAX_RANKS).contains(n))
            .ok_or_else(|| format!("usage: user-kernels-demo [max ranks, 2..={MAX_RANKS}]"))?,
        None => 4,
    };
    let backend = BackendKind::select()?;
    let devices = backend.device_count()?;
    if devices == 0 {
        return Err(format!("the {backend:?} backend has no device").into());
    }
    let plan = Plan::new(backend, devices);
    println!(
        "user-kernels-demo: {backend:?} backend, {devices} device(s); my_kernels PTX: {} bytes, {} entry points",
        MY_KERNELS_PTX.len(),
        MY_KERNELS_PTX.matches(".entry ").count()
    );

    let times = ranks_as_threads(&plan, 2, |comm| ping_pong(&plan, comm))?;
    let t = max(&times);
    println!(
        "ping_pong          2 ranks  {:>8} B  {:>5} round trips  {:>9.2} us/round trip  data ok",
        plan.ping_pong_words * 4,
        plan.ping_pong_iters,
        micros(t) / plan.ping_pong_iters as f64
    );

    for n in 2..=max_ranks {
        allreduce_row::<u32>(&plan, n, "allreduce_sum_u32", ALLREDUCE_U32)?;
        allreduce_row::<f32>(&plan, n, "allreduce_sum_f32", ALLREDUCE_F32)?;
    }
    Ok(())
}

fn allreduce_row<T: Element>(
    plan: &Plan,
    n: usize,
    name: &str,
    spec: KernelSpec<AllreduceArgs>,
) -> Result<()> {
    let times = ranks_as_threads(plan, n, |comm| allreduce::<T>(plan, comm, spec))?;
    let t = max(&times);
    println!(
        "{name:<18} {n} ranks  {:>8} B  {:>5} calls        {:>9.2} us/call        data ok",
        plan.allreduce_count * 4,
        plan.allreduce_iters,
        micros(t) / plan.allreduce_iters as f64
    );
    Ok(())
}

/// One rank of the ping-pong; returns the time of the timed launch.
fn ping_pong(plan: &Plan, comm: Communicator) -> Result<Duration> {
    let (rank, peer) = (comm.rank(), 1 - comm.rank());
    let gpu = comm.gpu().clone();
    let transport = Transport::local_for(gpu.kind());
    let conn = comm.connect(EndpointConfig::new(transport), peer, 0)?;

    // One buffer per rank; the channel puts from ours into the peer's.
    let words = plan.ping_pong_words;
    let buf = gpu.alloc(words * 4)?;
    let initial: Vec<u32> = (0..words as u32).map(|i| i.wrapping_mul(7) + 1).collect();
    if rank == 0 {
        buf.copy_from_host(0, bytemuck::cast_slice(&initial))?;
    }
    comm.send_memory(&comm.register_buffer(&buf, transport)?, peer, 0)?;
    let channel = MemoryChannel::new(
        comm.build_memory_semaphore(conn.as_ref(), 0)?,
        comm.recv_memory(peer, 0)?,
        buf.ptr(),
        DevicePtr::NULL, // no packets
    )?;

    let module = gpu.load_ptx(MY_KERNELS_PTX)?;
    let kernel = module.kernel(PING_PONG)?;
    let stream = gpu.stream()?;
    let cfg = LaunchConfig::new(1, plan.ping_pong_threads);
    let args = |iterations| -> Result<PingPongArgs> {
        Ok(PingPongArgs {
            status: comm.status().device_ptr(),
            channel: channel.device_handle()?,
            words: words as u64,
            iterations,
            rank: rank as u32,
        })
    };

    // A one-round warm-up, then the timed launch.
    let mut elapsed = Duration::ZERO;
    for iterations in [1, plan.ping_pong_iters] {
        comm.bootstrap().barrier()?;
        let start = Instant::now();
        // SAFETY: both buffers are live and `words` u32 long until the stream is synchronised
        // (and the peer's until the barrier below); one block.
        unsafe { stream.launch(&kernel, cfg, args(iterations)?) }?;
        stream.synchronize()?;
        elapsed = start.elapsed();
        if let Some(e) = comm.status().error() {
            return Err(format!("rank {rank}: ping_pong: {e}").into());
        }
    }

    let mut got = vec![0u32; words];
    buf.copy_to_host(0, bytemuck::cast_slice_mut(&mut got))?;
    let rounds = 1 + plan.ping_pong_iters;
    if let Some(j) = (0..words).find(|&j| got[j] != initial[j].wrapping_add(rounds)) {
        return Err(format!(
            "rank {rank}: ping_pong: word {j} is {}, expected {}",
            got[j],
            initial[j].wrapping_add(rounds)
        )
        .into());
    }
    comm.bootstrap().barrier()?; // the peer is done with our buffer before we free it
    Ok(elapsed)
}

/// An element type of the allreduce, with the demo's input values and the host's own sum (the
/// reference the kernel's result is checked against).
trait Element: bytemuck::Pod + PartialEq + std::fmt::Debug {
    /// Rank `r`'s element `j` (values whose sums are exact).
    fn value(r: usize, j: usize) -> Self;
    /// `self + other`, computed on the host.
    fn plus(self, other: Self) -> Self;
}

impl Element for u32 {
    fn value(r: usize, j: usize) -> Self {
        (j as u32)
            .wrapping_mul(2_654_435_761)
            .wrapping_add(r as u32 * 7919)
    }
    fn plus(self, other: Self) -> Self {
        self.wrapping_add(other)
    }
}

impl Element for f32 {
    fn value(r: usize, j: usize) -> Self {
        (j % 1024) as f32 * 0.5 + r as f32
    }
    fn plus(self, other: Self) -> Self {
        self + other
    }
}

/// One rank of the allreduce; returns the time of the timed calls.
fn allreduce<T: Element>(
    plan: &Plan,
    comm: Communicator,
    spec: KernelSpec<AllreduceArgs>,
) -> Result<Duration> {
    let (rank, n) = (comm.rank(), comm.size());
    let gpu = comm.gpu().clone();
    let transport = Transport::local_for(gpu.kind());
    let count = plan.allreduce_count;
    let bytes = count * 4;

    // Input, output, and the packet buffer peers write into: 2 halves x n slots.
    let slot = packets_for::<LL16Packet>(bytes) * std::mem::size_of::<LL16Packet>();
    let input = gpu.alloc(bytes)?;
    let output = gpu.alloc(bytes)?;
    let packets = gpu.alloc(2 * n * slot)?;
    let mine: Vec<T> = (0..count).map(|j| T::value(rank, j)).collect();
    input.copy_from_host(0, bytemuck::cast_slice(&mine))?;
    let packets_reg = comm.register_buffer(&packets, transport)?;

    // A channel to every peer: it writes packets into that peer's packet buffer.
    let mut handles = [MemoryChannelDeviceHandle::default(); MAX_RANKS];
    let mut channels = Vec::new();
    for peer in (0..n).filter(|&p| p != rank) {
        let conn = comm.connect(EndpointConfig::new(transport), peer, 0)?;
        comm.send_memory(&packets_reg, peer, 0)?;
        let channel = MemoryChannel::new(
            comm.build_memory_semaphore(conn.as_ref(), 0)?,
            comm.recv_memory(peer, 0)?,
            input.ptr(),
            packets.ptr(),
        )?;
        handles[peer] = channel.device_handle()?;
        channels.push((conn, channel));
    }

    let module = gpu.load_ptx(MY_KERNELS_PTX)?;
    let kernel = module.kernel(spec)?;
    let stream = gpu.stream()?;
    let args = |flag| AllreduceArgs {
        status: comm.status().device_ptr(),
        channels: handles,
        input: input.ptr().cast(),
        output: output.ptr().cast(),
        count: count as u64,
        rank: rank as u32,
        nranks: n as u32,
        flag,
        reserved: 0,
    };
    let expected: Vec<T> = (0..count)
        .map(|j| (1..n).fold(T::value(0, j), |acc, r| acc.plus(T::value(r, j))))
        .collect();
    let check = |what: &str| -> Result<()> {
        if let Some(e) = comm.status().error() {
            return Err(format!("rank {rank}: {}: {e}", kernel.name()).into());
        }
        let mut got = vec![T::zeroed(); count];
        output.copy_to_host(0, bytemuck::cast_slice_mut(&mut got))?;
        match (0..count).find(|&j| got[j] != expected[j]) {
            None => Ok(()),
            Some(j) => Err(format!(
                "rank {rank}: {} ({what}): element {j} is {:?}, expected {:?}",
                kernel.name(),
                got[j],
                expected[j]
            )
            .into()),
        }
    };

    // One checked call, then `allreduce_iters` back-to-back calls (fresh flags), checked again.
    comm.bootstrap().barrier()?;
    // SAFETY: input/output hold `count` elements, every packet buffer 2 x n slots, and all
    // stay live until the stream is synchronised and every rank has passed the last barrier.
    unsafe { stream.launch(&kernel, plan.allreduce_grid, args(1)) }?;
    stream.synchronize()?;
    check("first call")?;
    output.copy_from_host(0, &vec![0u8; bytes])?;
    comm.bootstrap().barrier()?;
    let start = Instant::now();
    for k in 0..plan.allreduce_iters {
        // SAFETY: as above.
        unsafe { stream.launch(&kernel, plan.allreduce_grid, args(2 + k)) }?;
    }
    stream.synchronize()?;
    let elapsed = start.elapsed();
    check("timed calls")?;
    comm.bootstrap().barrier()?; // every peer is done writing our packet buffer
    drop(channels);
    Ok(elapsed)
}

/// Runs `n` ranks as threads of this process (rank `r` on device `r % devices`) and returns
/// their results in rank order, or the first rank's error.
fn ranks_as_threads<T: Send>(
    plan: &Plan,
    n: usize,
    body: impl Fn(Communicator) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    let loopback: SocketAddr = "127.0.0.1:0".parse()?;
    let (id, listener) = UniqueId::bind(loopback)?;
    let mut listener = Some(listener); // rank 0 serves the bootstrap with it
    let body = &body;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let root = if r == 0 { listener.take() } else { None };
                s.spawn(move || -> Result<T> {
                    let cfg = BootstrapConfig::new(r, n, id).with_timeout(Duration::from_secs(60));
                    let bootstrap = match root {
                        Some(l) => TcpBootstrap::init_with_root_listener(cfg, l)?,
                        None => TcpBootstrap::init(cfg)?,
                    };
                    let gpu = Gpu::open(plan.backend, r % plan.devices)?;
                    body(Communicator::new(Arc::new(bootstrap), gpu)?)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().map_err(|_| "a rank thread panicked")?)
            .collect()
    })
}

fn max(times: &[Duration]) -> Duration {
    times.iter().copied().max().unwrap_or_default()
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
