//! The primitive benchmarks (two ranks): MemoryChannel signal and LL16 packet round trips, FIFO
//! push-to-pop, PortChannel and MemoryChannel puts, and copy-engine copies into peer memory.
//!
//! ```text
//! signal      MemoryChannel signal+wait round trip (µs)
//! packet      LL16 packet round trip of SIZE bytes (µs)
//! fifo        FIFO push->pop per trigger (µs), 1 GPU thread, host consumer
//! port-put    PortChannel put_with_signal ping-pong: one-way GB/s per SIZE; -t ofi|ethernet
//!             over libfabric or TCP instead of the same-node transport (the network
//!             transports' bandwidth and latency, on loopback between two ranks of one host)
//! memory-put  MemoryChannel put (SM copy into peer memory): GB/s per SIZE
//! copy-engine cuMemcpyAsync into peer memory (the copy-engine line): GB/s per SIZE
//! ```

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use mscclpp::host::bootstrap::Bootstrap;
use mscclpp::host::communicator::Communicator;
use mscclpp::host::connection::{Connection, EndpointConfig};
use mscclpp::host::fifo::Fifo;
use mscclpp::host::gpu::{BackendKind, DeviceBuffer, Event, Gpu, LaunchConfig, Module, Stream};
use mscclpp::host::memory_channel::MemoryChannel;
use mscclpp::host::port_channel::PortChannelService;
use mscclpp::host::registered_memory::RegisteredMemory;
use mscclpp::host::status::StatusBlock;
use mscclpp::host::transport::Transport;
use mscclpp::kernels;
use mscclpp::shared::{CopyParams, FifoPushParams, PingPongParams, PortPingPongParams};

use super::BoxError;
use super::args::{PortTransport, PrimArgs as Args, Primitive};

/// Timed runs per size; the first is a warm-up, the median of the others is the row.
const REPS: usize = 5;

/// One size: time and bandwidth.
pub struct Row {
    /// Bytes.
    pub size: usize,
    /// µs (per round trip, push or copy, as the op defines).
    pub us: f64,
    /// GB/s.
    pub gbps: f64,
}

/// One line of `--json` (the field names are the format).
#[derive(serde::Serialize)]
struct JsonRow<'a> {
    op: &'a str,
    size: usize,
    time_us: f64,
    gbps: f64,
}

/// The table.
pub fn table(rows: &[Row]) -> String {
    let mut table = String::new();
    let _ = writeln!(table, "{:>12} {:>12} {:>10}", "size(B)", "time(us)", "GB/s");
    for r in rows {
        let _ = writeln!(table, "{:>12} {:>12.2} {:>10.2}", r.size, r.us, r.gbps);
    }
    table
}

/// The JSON lines for `--json` (times and rates to 3 decimals).
pub fn json_lines(a: &Args, rows: &[Row]) -> Result<String, serde_json::Error> {
    let three = |x: f64| (x * 1e3).round() / 1e3;
    let mut json = String::new();
    for r in rows {
        json.push_str(&serde_json::to_string(&JsonRow {
            op: a.op.name(),
            size: r.size,
            time_us: three(r.us),
            gbps: three(r.gbps),
        })?);
        json.push('\n');
    }
    Ok(json)
}

fn sizes(a: &Args) -> Vec<usize> {
    super::sweep(a.min, a.max, a.factor)
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs.get(xs.len() / 2).copied().unwrap_or(f64::NAN)
}

/// What every primitive uses: the two ranks' buffers and the connection between them.
struct Pair<'a> {
    comm: &'a Communicator,
    gpu: Gpu,
    rank: usize,
    module: Module,
    stream: Stream,
    e0: Event,
    e1: Event,
    conn: Arc<dyn Connection>,
    /// Where the peer's puts land (`max` bytes; registered with the peer, kept alive here).
    _recv: DeviceBuffer,
    /// What this rank puts (`max` bytes).
    src: DeviceBuffer,
    /// `src`, registered (before the connection) for the transport.
    src_reg: RegisteredMemory,
    /// `recv` and `pkts`, registered: a network transport's receiver writes only into
    /// memories whose registration is alive.
    _regs: [RegisteredMemory; 2],
    /// This rank's LL16 packet buffer.
    pkts: DeviceBuffer,
    /// The peer's `recv`.
    peer_recv: RegisteredMemory,
    /// The peer's `pkts`.
    peer_pkts: RegisteredMemory,
    bs: Arc<dyn Bootstrap>,
}

impl<'a> Pair<'a> {
    /// Connects the two ranks and trades their buffers (`max` bytes each).
    fn new(comm: &'a Communicator, max: usize, over: PortTransport) -> Result<Self, BoxError> {
        let (rank, peer) = (comm.rank(), 1 - comm.rank());
        let gpu = comm.gpu().clone();
        let transport = match over {
            PortTransport::Local => Transport::local_for(gpu.kind()),
            PortTransport::Ofi => Transport::Ofi,
            PortTransport::Ethernet => Transport::Ethernet,
        };
        let module = gpu.load_ptx(mscclpp::DEVICE_PTX)?;
        let (stream, e0, e1) = (gpu.stream()?, gpu.event()?, gpu.event()?);
        // Registered before the connection: libfabric then writes them directly (RMA).
        let recv = gpu.alloc(max)?;
        let src = gpu.alloc(max)?;
        let pkts = gpu.alloc(max.div_ceil(8) * 16)?;
        let recv_reg = comm.register_buffer(&recv, transport)?;
        let pkts_reg = comm.register_buffer(&pkts, transport)?;
        let src_reg = comm.register_buffer(&src, transport)?;
        let conn = comm.connect(EndpointConfig::new(transport), peer, 0)?;
        comm.send_memory(&recv_reg, peer, 0)?;
        comm.send_memory(&pkts_reg, peer, 1)?;
        let peer_recv = comm.recv_memory(peer, 0)?;
        let peer_pkts = comm.recv_memory(peer, 1)?;
        Ok(Self {
            comm,
            bs: comm.bootstrap().clone(),
            gpu,
            rank,
            module,
            stream,
            e0,
            e1,
            conn,
            _recv: recv,
            src,
            src_reg,
            _regs: [recv_reg, pkts_reg],
            pkts,
            peer_recv,
            peer_pkts,
        })
    }

    /// Seconds that the work `f` queues takes on the stream, both ranks starting together.
    fn time(&self, f: &dyn Fn() -> Result<(), BoxError>) -> Result<f64, BoxError> {
        self.bs.barrier()?;
        self.stream.record(&self.e0)?;
        f()?;
        self.stream.record(&self.e1)?;
        self.e1.synchronize()?;
        Ok(self.e1.elapsed_ms(&self.e0)? as f64 * 1e-3)
    }

    /// Median seconds per iteration over [`REPS`] timed runs of `run(iterations)` (which
    /// returns the run's seconds); the first run, of `-w` iterations, is not counted.
    fn per_iteration(
        &self,
        a: &Args,
        mut run: impl FnMut(u32) -> Result<f64, BoxError>,
    ) -> Result<f64, BoxError> {
        let mut samples = Vec::new();
        for rep in 0..REPS {
            let iters = if rep == 0 { a.warmup.max(1) } else { a.iters };
            let s = run(iters)?;
            if rep > 0 {
                samples.push(s / iters as f64);
            }
        }
        Ok(median(samples))
    }

    /// `signal` (one row) and `packet` (one per size): MemoryChannel round trips.
    fn ping_pong(&self, a: &Args) -> Result<Vec<Row>, BoxError> {
        let packet = a.op == Primitive::Packet;
        let ch = MemoryChannel::new(
            self.comm.build_memory_semaphore(self.conn.as_ref(), 0)?,
            if packet {
                self.peer_pkts.clone()
            } else {
                self.peer_recv.clone()
            },
            self.src.ptr(),
            self.pkts.ptr(),
        )?;
        let spec = if packet {
            kernels::PACKET_PING_PONG
        } else {
            kernels::MEMORY_PING_PONG
        };
        let k = self.module.kernel(spec)?;
        let cfg = LaunchConfig::new(1, if packet { 256 } else { 32 }).with_shared_mem(4);
        let mut flag_base = 0u32;
        let mut rows = Vec::new();
        for size in if packet { sizes(a) } else { vec![0] } {
            let rt = self.per_iteration(a, |iters| {
                let p = PingPongParams {
                    status: self.comm.status().device_ptr(),
                    channel: ch.device_handle()?,
                    bytes: size as u64,
                    iterations: iters,
                    role: self.rank as u32,
                    flag_base,
                    reserved: 0,
                };
                flag_base += iters;
                // SAFETY: the channel's buffers are live and at least `size` bytes long.
                self.time(&|| Ok(unsafe { self.stream.launch(&k, cfg, p) }?))
            })?;
            if let Some(e) = self.comm.status().error() {
                return Err(e.into());
            }
            rows.push(Row {
                size,
                us: rt * 1e6,
                gbps: 2.0 * size as f64 / rt / 1e9,
            });
        }
        Ok(rows)
    }

    /// `fifo`: one GPU thread pushes, a host thread pops (no proxy work): push -> pop per
    /// trigger.
    fn fifo(&self, a: &Args) -> Result<Vec<Row>, BoxError> {
        let status = StatusBlock::new(&self.gpu, 0)?;
        let mut fifo = Fifo::new(&self.gpu, 512)?;
        let h = fifo.device_handle(status.device_ptr());
        let k = self.module.kernel(kernels::FIFO_PUSH)?;
        let n = a.iters.max(1) * 100;
        let stop = AtomicBool::new(false);
        let total = n as u64;
        let (popped, secs) = std::thread::scope(|s| -> Result<(u64, f64), BoxError> {
            let consumer = s.spawn(|| {
                let mut got = 0u64;
                while got < total && !stop.load(Ordering::Relaxed) {
                    if fifo.poll().is_some() {
                        fifo.pop();
                        got += 1;
                    }
                }
                (got, Instant::now())
            });
            let p = FifoPushParams {
                status: status.device_ptr(),
                fifo: h,
                per_thread: n,
                reserved: 0,
            };
            self.bs.barrier()?;
            let t0 = Instant::now();
            // SAFETY: the FIFO is live and served by the consumer thread.
            let launched = unsafe { self.stream.launch(&k, LaunchConfig::new(1, 1), p) };
            let synced = launched.and_then(|_| self.stream.synchronize());
            if synced.is_err() {
                stop.store(true, Ordering::Relaxed);
            }
            let (got, t1) = consumer.join().map_err(|_| "consumer panicked")?;
            synced?;
            Ok((got, (t1 - t0).as_secs_f64()))
        })?;
        if popped != total {
            return Err(format!("pushed {n}, popped {popped}").into());
        }
        Ok(vec![Row {
            size: 16,
            us: secs / n as f64 * 1e6,
            gbps: 16.0 * n as f64 / secs / 1e9,
        }])
    }

    /// `port-put`: PortChannel `put_with_signal` ping-pong through the proxy.
    fn port_put(&self, a: &Args) -> Result<Vec<Row>, BoxError> {
        let mut svc = PortChannelService::builder(self.comm.gpu(), self.comm.status(), 512)?;
        svc.trace(self.comm.trace());
        let sem = svc.add_semaphore(self.comm.build_semaphore(self.conn.clone(), 1)?)?;
        let dst = svc.add_memory(self.peer_recv.clone())?;
        let s_id = svc.add_memory(self.src_reg.clone())?;
        let ch = svc.port_channel(sem, dst, s_id)?;
        let svc = svc.start()?;
        let k = self.module.kernel(kernels::PORT_PING_PONG)?;
        let mut rows = Vec::new();
        for size in sizes(a) {
            let rt = self.per_iteration(a, |iters| {
                let p = PortPingPongParams {
                    status: self.comm.status().device_ptr(),
                    channel: ch,
                    bytes: size as u64,
                    iterations: iters,
                    role: self.rank as u32,
                    flush: 0,
                    reserved: 0,
                    trace: mscclpp::shared::TraceDeviceHandle::OFF,
                };
                let cfg = LaunchConfig::new(1, 1);
                // SAFETY: the channel's memories are live and at least `size` bytes long.
                self.time(&|| Ok(unsafe { self.stream.launch(&k, cfg, p) }?))
            })?;
            rows.push(Row {
                size,
                us: rt / 2.0 * 1e6,
                gbps: 2.0 * size as f64 / rt / 1e9,
            });
        }
        if let Some(e) = svc.error() {
            return Err(e.into());
        }
        svc.stop()?;
        Ok(rows)
    }

    /// `memory-put` (a copy kernel) and `copy-engine` (`cuMemcpyAsync`): rank 0 writes into
    /// rank 1's buffer; rank 1 only keeps time.
    fn one_way_copies(&self, a: &Args, max: usize) -> Result<Vec<Row>, BoxError> {
        let k = self.module.kernel(kernels::COPY)?;
        let dst = self.peer_recv.range(0, max as u64)?;
        let mut rows = Vec::new();
        for size in sizes(a) {
            let copy = || -> Result<(), BoxError> {
                if a.op == Primitive::MemoryPut {
                    let p = CopyParams {
                        status: self.comm.status().device_ptr(),
                        dst,
                        src: self.src.ptr(),
                        bytes: size as u64,
                    };
                    let cfg = if self.gpu.kind() == BackendKind::Cpu {
                        LaunchConfig::new(2, 32)
                    } else {
                        LaunchConfig::new((size / (16 * 1024)).clamp(1, 132) as u32, 1024)
                    };
                    // SAFETY: both buffers are live and `size` bytes long.
                    unsafe { self.stream.launch(&k, cfg, p) }?;
                } else {
                    // SAFETY: as above.
                    unsafe { self.stream.copy_dtod(dst, self.src.ptr(), size) }?;
                }
                Ok(())
            };
            let t1 = self.per_iteration(a, |iters| {
                let mine = if self.rank == 0 { iters } else { 0 };
                self.time(&|| (0..mine).try_for_each(|_| copy()))
            })?;
            rows.push(Row {
                size,
                us: t1 * 1e6,
                gbps: size as f64 / t1 / 1e9,
            });
        }
        Ok(rows)
    }
}

/// Runs `a.op` on this rank (of two); every rank returns its rows.
pub fn bench_rank(comm: &Communicator, a: &Args) -> Result<Vec<Row>, BoxError> {
    if comm.size() != 2 {
        return Err(format!(
            "the {} benchmark runs on exactly 2 ranks, not {}",
            a.op.name(),
            comm.size()
        )
        .into());
    }
    let max = a.max.max(16);
    if a.transport != PortTransport::Local && a.op != Primitive::PortPut {
        return Err(format!("--transport is for port-put only, not {}", a.op.name()).into());
    }
    let pair = Pair::new(comm, max, a.transport)?;
    let rows = match a.op {
        Primitive::Signal | Primitive::Packet => pair.ping_pong(a)?,
        Primitive::Fifo => pair.fifo(a)?,
        Primitive::PortPut => pair.port_put(a)?,
        Primitive::MemoryPut | Primitive::CopyEngine => pair.one_way_copies(a, max)?,
    };
    pair.bs.barrier()?;
    Ok(rows)
}
