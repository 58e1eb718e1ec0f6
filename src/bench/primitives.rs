//! The primitive benchmarks (two ranks): MemoryChannel signal and LL16 packet round trips, FIFO
//! push-to-pop, PortChannel and MemoryChannel puts, and copy-engine copies into peer memory.
//!
//! ```text
//! signal      MemoryChannel signal+wait round trip (µs)
//! packet      LL16 packet round trip of SIZE bytes (µs)
//! fifo        FIFO push->pop per trigger (µs), 1 GPU thread, host consumer
//! port-put    PortChannel put_with_signal ping-pong: one-way GB/s per SIZE
//! memory-put  MemoryChannel put (SM copy into peer memory): GB/s per SIZE
//! copy-engine cuMemcpyAsync into peer memory (the copy-engine line): GB/s per SIZE
//! ```

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use mscclpp::host::communicator::Communicator;
use mscclpp::host::connection::EndpointConfig;
use mscclpp::host::fifo::Fifo;
use mscclpp::host::gpu::{BackendKind, LaunchConfig};
use mscclpp::host::memory_channel::MemoryChannel;
use mscclpp::host::port_channel::PortChannelService;
use mscclpp::host::status::StatusBlock;
use mscclpp::host::transport::Transport;
use mscclpp::kernels;
use mscclpp::shared::{CopyParams, FifoPushParams, PingPongParams, PortPingPongParams};

use super::BoxError;
use super::args::PrimArgs as Args;

/// One size: time and bandwidth.
pub struct Row {
    /// Bytes.
    pub size: usize,
    /// µs (per round trip, push or copy, as the op defines).
    pub us: f64,
    /// GB/s.
    pub gbps: f64,
}

/// The table, and the JSON lines for `--json`.
pub fn report(a: &Args, rows: &[Row]) -> (String, String) {
    let (mut table, mut json) = (String::new(), String::new());
    let _ = writeln!(table, "{:>12} {:>12} {:>10}", "size(B)", "time(us)", "GB/s");
    for r in rows {
        let _ = writeln!(table, "{:>12} {:>12.2} {:>10.2}", r.size, r.us, r.gbps);
        let _ = writeln!(
            json,
            "{{\"op\":\"{}\",\"size\":{},\"time_us\":{:.3},\"gbps\":{:.3}}}",
            a.op, r.size, r.us, r.gbps
        );
    }
    (table, json)
}

fn sizes(a: &Args) -> Vec<usize> {
    let mut v = Vec::new();
    let mut s = a.min;
    while s <= a.max {
        v.push(s);
        s *= a.factor;
    }
    v
}

/// Per-size median of `reps` timed runs of `f` (each returns seconds for `a.iters` repetitions).
fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[xs.len() / 2]
}

/// Runs `a.op` on this rank (of two); every rank returns its rows.
pub fn bench_rank(comm: &Communicator, a: &Args) -> Result<Vec<Row>, BoxError> {
    if comm.size() != 2 {
        return Err(format!(
            "the {} benchmark runs on exactly 2 ranks, not {}",
            a.op,
            comm.size()
        )
        .into());
    }
    let (rank, peer) = (comm.rank(), 1 - comm.rank());
    let g = comm.gpu().clone();
    let t = Transport::local_for(g.kind());
    let max = a.max.max(16);
    let m = g.load_ptx(mscclpp::DEVICE_PTX)?;
    let stream = g.stream()?;
    let (e0, e1) = (g.event()?, g.event()?);
    let conn = comm.connect(EndpointConfig::new(t), peer, 0)?;
    let recv = g.alloc(max)?;
    let src = g.alloc(max)?;
    let pkts = g.alloc(max.div_ceil(8) * 16)?;
    comm.send_memory(&comm.register_buffer(&recv, t)?, peer, 0)?;
    comm.send_memory(&comm.register_buffer(&pkts, t)?, peer, 1)?;
    let peer_recv = comm.recv_memory(peer, 0)?;
    let peer_pkts = comm.recv_memory(peer, 1)?;
    let bs = comm.bootstrap().clone();
    let mut rows = Vec::new();
    let time = |f: &dyn Fn() -> Result<(), BoxError>| -> Result<f64, BoxError> {
        bs.barrier()?;
        stream.record(&e0)?;
        f()?;
        stream.record(&e1)?;
        e1.synchronize()?;
        Ok(e1.elapsed_ms(&e0)? as f64 * 1e-3)
    };
    match a.op.as_str() {
        "signal" | "packet" => {
            let packet = a.op == "packet";
            let ch = MemoryChannel::new(
                comm.build_memory_semaphore(conn.as_ref(), 0)?,
                if packet { peer_pkts } else { peer_recv },
                src.ptr(),
                pkts.ptr(),
            )?;
            let spec = if packet {
                kernels::PACKET_PING_PONG
            } else {
                kernels::MEMORY_PING_PONG
            };
            let k = m.kernel(spec)?;
            let mut flag_base = 0u32;
            for size in if packet { sizes(a) } else { vec![0] } {
                let mut samples = Vec::new();
                for rep in 0..5 {
                    let iters = if rep == 0 { a.warmup.max(1) } else { a.iters };
                    let p = PingPongParams {
                        status: comm.status().device_ptr(),
                        channel: ch.device_handle()?,
                        bytes: size as u64,
                        iterations: iters,
                        role: rank as u32,
                        flag_base,
                        reserved: 0,
                    };
                    flag_base += iters;
                    let cfg =
                        LaunchConfig::new(1, if packet { 256 } else { 32 }).with_shared_mem(4);
                    // SAFETY: the channel's buffers are live and at least `size` bytes long.
                    let s = time(&|| Ok(unsafe { stream.launch(&k, cfg, p) }?))?;
                    if rep > 0 {
                        samples.push(s / iters as f64);
                    }
                }
                if let Some(e) = comm.status().error() {
                    return Err(e.into());
                }
                let rt = median(samples);
                rows.push(Row {
                    size,
                    us: rt * 1e6,
                    gbps: 2.0 * size as f64 / rt / 1e9,
                });
            }
        }
        "fifo" => {
            // One GPU thread pushes; a host thread pops (no proxy work): push->pop per trigger.
            let status = StatusBlock::new(&g, 0)?;
            let mut fifo = Fifo::new(&g, 512)?;
            let h = fifo.device_handle(status.device_ptr());
            let k = m.kernel(kernels::FIFO_PUSH)?;
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
                bs.barrier()?;
                let t0 = Instant::now();
                // SAFETY: the FIFO is live and served by the consumer thread.
                let launched = unsafe { stream.launch(&k, LaunchConfig::new(1, 1), p) };
                let synced = launched.and_then(|_| stream.synchronize());
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
            rows.push(Row {
                size: 16,
                us: secs / n as f64 * 1e6,
                gbps: 16.0 * n as f64 / secs / 1e9,
            });
        }
        "port-put" => {
            let mut svc = PortChannelService::builder(comm.gpu(), comm.status(), 512)?;
            let sem = svc.add_semaphore(comm.build_semaphore(conn.clone(), 1)?)?;
            let dst = svc.add_memory(peer_recv)?;
            let s_id = svc.add_memory(comm.register_buffer(&src, t)?)?;
            let ch = svc.port_channel(sem, dst, s_id)?;
            let svc = svc.start()?;
            let k = m.kernel(kernels::PORT_PING_PONG)?;
            for size in sizes(a) {
                let mut samples = Vec::new();
                for rep in 0..5 {
                    let iters = if rep == 0 { a.warmup.max(1) } else { a.iters };
                    let p = PortPingPongParams {
                        status: comm.status().device_ptr(),
                        channel: ch,
                        bytes: size as u64,
                        iterations: iters,
                        role: rank as u32,
                        flush: 0,
                        reserved: 0,
                    };
                    // SAFETY: the channel's memories are live and at least `size` bytes long.
                    let s =
                        time(&|| Ok(unsafe { stream.launch(&k, LaunchConfig::new(1, 1), p) }?))?;
                    if rep > 0 {
                        samples.push(s / iters as f64);
                    }
                }
                let rt = median(samples);
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
        }
        "memory-put" | "copy-engine" => {
            let k = m.kernel(kernels::COPY)?;
            let dst = peer_recv.range(0, max as u64)?;
            for size in sizes(a) {
                let mut samples = Vec::new();
                for rep in 0..5 {
                    let iters = if rep == 0 { a.warmup.max(1) } else { a.iters };
                    // One direction: rank 0 writes into rank 1; rank 1 only keeps time.
                    let s = time(&|| {
                        for _ in 0..if rank == 0 { iters } else { 0 } {
                            if a.op == "memory-put" {
                                let p = CopyParams {
                                    status: comm.status().device_ptr(),
                                    dst,
                                    src: src.ptr(),
                                    bytes: size as u64,
                                };
                                let cfg = if g.kind() == BackendKind::Cpu {
                                    LaunchConfig::new(2, 32)
                                } else {
                                    LaunchConfig::new(
                                        (size / (16 * 1024)).clamp(1, 132) as u32,
                                        1024,
                                    )
                                };
                                // SAFETY: both buffers are live and `size` bytes long.
                                unsafe { stream.launch(&k, cfg, p) }?;
                            } else {
                                // SAFETY: as above.
                                unsafe { stream.copy_dtod(dst, src.ptr(), size) }?;
                            }
                        }
                        Ok(())
                    })?;
                    if rep > 0 {
                        samples.push(s / iters as f64);
                    }
                }
                let t1 = median(samples);
                rows.push(Row {
                    size,
                    us: t1 * 1e6,
                    gbps: size as f64 / t1 / 1e9,
                });
            }
        }
        other => return Err(format!("unknown op {other}").into()),
    }
    bs.barrier()?;
    Ok(rows)
}
