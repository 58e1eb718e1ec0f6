//! `mscclpp-bench`: measures the primitives (and, as they land, the collectives) on all local
//! GPUs from one process, in the style of nccl-tests / mscclpp-test.
//!
//! ```text
//! mscclpp-bench <op> [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP] [--json FILE]
//! ops: signal      MemoryChannel signal+wait round trip (µs)
//!      packet      LL16 packet round trip of SIZE bytes (µs)
//!      fifo        FIFO push->pop per trigger (µs), 1 GPU thread, host consumer
//!      port-put    PortChannel put_with_signal ping-pong: one-way GB/s per SIZE
//!      memory-put  MemoryChannel put (SM copy into peer memory): GB/s per SIZE
//!      copy-engine cuMemcpyAsync into peer memory (the copy-engine line): GB/s per SIZE
//! ```
//! Without a GPU it runs on the CPU backend (and says so); its numbers then mean nothing.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use mscclpp::host::communicator::Communicator;
use mscclpp::host::connection::EndpointConfig;
use mscclpp::host::fifo::Fifo;
use mscclpp::host::gpu::{BackendKind, LaunchConfig};
use mscclpp::host::memory_channel::MemoryChannel;
use mscclpp::host::port_channel::PortChannelService;
use mscclpp::host::semaphore::MemoryDevice2DeviceSemaphore;
use mscclpp::host::status::StatusBlock;
use mscclpp::host::transport::Transport;
use mscclpp::kernels;
use mscclpp::shared::{CopyParams, FifoPushParams, PingPongParams, PortPingPongParams};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Clone, Debug)]
struct Args {
    op: String,
    min: usize,
    max: usize,
    factor: usize,
    iters: u32,
    warmup: u32,
    json: Option<String>,
}

fn parse_size(s: &str) -> Result<usize, BoxError> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    Ok(num.parse::<usize>().map_err(|e| format!("size {s:?}: {e}"))? * mult)
}

fn parse_args() -> Result<Args, BoxError> {
    let mut it = std::env::args().skip(1);
    let op = it.next().ok_or("usage: mscclpp-bench <op> [options] (see --help)")?;
    if op == "--help" || op == "-h" {
        return Err("ops: signal packet fifo port-put memory-put copy-engine; options: -b -e -f -n -w --json".into());
    }
    let mut a = Args {
        op,
        min: 8,
        max: 8,
        factor: 2,
        iters: 100,
        warmup: 10,
        json: None,
    };
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "-b" => a.min = parse_size(&val()?)?,
            "-e" => a.max = parse_size(&val()?)?,
            "-f" => a.factor = val()?.parse()?,
            "-n" => a.iters = val()?.parse()?,
            "-w" => a.warmup = val()?.parse()?,
            "--json" => a.json = Some(val()?),
            other => return Err(format!("unknown option {other}").into()),
        }
    }
    if a.max < a.min || a.factor < 2 {
        return Err("need -e >= -b and -f >= 2".into());
    }
    Ok(a)
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

struct Row {
    size: usize,
    us: f64,
    gbps: f64,
}

fn main() -> ExitCode {
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("mscclpp-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    match run(&a) {
        Ok(rows) => {
            let mut json = String::new();
            println!("{:>12} {:>12} {:>10}", "size(B)", "time(us)", "GB/s");
            for r in &rows {
                println!("{:>12} {:>12.2} {:>10.2}", r.size, r.us, r.gbps);
                let _ = writeln!(
                    json,
                    "{{\"op\":\"{}\",\"size\":{},\"time_us\":{:.3},\"gbps\":{:.3}}}",
                    a.op, r.size, r.us, r.gbps
                );
            }
            if let Some(path) = &a.json
                && let Err(e) = std::fs::write(path, json)
            {
                eprintln!("mscclpp-bench: writing {path}: {e}");
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("mscclpp-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(a: &Args) -> Result<Vec<Row>, BoxError> {
    let backend = BackendKind::select()?;
    if backend == BackendKind::Cpu {
        println!("# CPU backend (no GPU found): the same kernels on threads; times are not GPU times");
    }
    let results = mscclpp::world::run_local_ranks(backend, 2, |comm| {
        bench_rank(&comm, a).map_err(|e| mscclpp::host::Error::Aborted {
            reason: e.to_string(),
        })
    });
    let mut rows = None;
    for (r, res) in results.into_iter().enumerate() {
        match res {
            Ok(v) if r == 0 => rows = Some(v),
            Ok(_) => {}
            Err(e) => return Err(format!("rank {r}: {e}").into()),
        }
    }
    rows.ok_or_else(|| "no result".into())
}

/// Per-size median of `reps` timed runs of `f` (each returns seconds for `a.iters` repetitions).
fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[xs.len() / 2]
}

fn bench_rank(comm: &Communicator, a: &Args) -> Result<Vec<Row>, BoxError> {
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
                MemoryDevice2DeviceSemaphore::new(comm, conn.as_ref(), 0)?,
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
                    let cfg = LaunchConfig::new(1, if packet { 256 } else { 32 }).with_shared_mem(4);
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
                rows.push(Row { size, us: rt * 1e6, gbps: 2.0 * size as f64 / rt / 1e9 });
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
                let p = FifoPushParams { status: status.device_ptr(), fifo: h, per_thread: n, reserved: 0 };
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
            rows.push(Row { size: 16, us: secs / n as f64 * 1e6, gbps: 16.0 * n as f64 / secs / 1e9 });
        }
        "port-put" => {
            let mut svc = PortChannelService::new(comm, 512)?;
            let sem = svc.build_and_add_semaphore(comm, conn.clone(), 1)?;
            let dst = svc.add_memory(peer_recv)?;
            let s_id = svc.add_memory(comm.register_buffer(&src, t)?)?;
            let ch = svc.port_channel(sem, dst, s_id)?;
            svc.start()?;
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
                    let s = time(&|| Ok(unsafe { stream.launch(&k, LaunchConfig::new(1, 1), p) }?))?;
                    if rep > 0 {
                        samples.push(s / iters as f64);
                    }
                }
                let rt = median(samples);
                rows.push(Row { size, us: rt / 2.0 * 1e6, gbps: 2.0 * size as f64 / rt / 1e9 });
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
                                let p = CopyParams { status: comm.status().device_ptr(), dst, src: src.ptr(), bytes: size as u64 };
                                let cfg = if g.kind() == BackendKind::Cpu {
                                    LaunchConfig::new(2, 32)
                                } else {
                                    LaunchConfig::new((size / (16 * 1024)).clamp(1, 132) as u32, 1024)
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
                rows.push(Row { size, us: t1 * 1e6, gbps: size as f64 / t1 / 1e9 });
            }
        }
        other => return Err(format!("unknown op {other}").into()),
    }
    bs.barrier()?;
    Ok(rows)
}
