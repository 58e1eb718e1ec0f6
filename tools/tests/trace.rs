//! Traces of real runs, merged: a two-rank all-reduce through `Collectives` and a PortChannel
//! ping-pong through the proxy, on the backend under test (the CPU backend without a GPU;
//! `MSCCLPP_BACKEND=cuda` on two GPUs). Each run writes one file per rank, `mscclpp_tools`
//! merges them, and the merged JSON (re-read from its text, so it is valid JSON) must show:
//!
//! - every span closed (`dur >= 0`) and no block without its `end` (`incomplete`);
//! - each block's events in order: its `comm` span (`send` to `recv`) inside its own span;
//! - each rank's events inside its host call: every block of a call, and the call's host span
//!   and GPU span, inside the span the test drew around "call + synchronize" on that rank
//!   (which needs the device clock mapped onto the host's);
//! - the set-up phases (bootstrap, collectives), bytes and GB/s on the GPU calls, and the
//!   proxy's trigger spans with their copy (bytes) and signal inside.
//!
//! A third test traces the point-to-point engine (send / recv): its `p2p_kernel` blocks, each
//! with its `recv` event, inside each call.
//! A fourth traces the calls made of sends and receives (a gather, a group's `end`): one
//! `call` span each, named after the public call, around the launches it made.
//! A fifth runs on one rank (so on one GPU too): a pre-multiplied sum, which one rank runs in
//! the staged kernel, with its block events inside the host call.
//!
//! The all-reduce test also runs `mscclpp-trace merge` and `plot` as a user does (found as
//! in `bench_cli.rs`; NOT RUN where the binary is missing).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use mscclpp::collectives::{Algorithm, Collectives, Reduction, Scalar};
use mscclpp::host::communicator::Communicator;
use mscclpp::host::connection::EndpointConfig;
use mscclpp::host::gpu::{BackendKind, LaunchConfig};
use mscclpp::host::port_channel::PortChannelService;
use mscclpp::host::transport::Transport;
use mscclpp::kernels;
use mscclpp::shared::{DataType, PortPingPongParams, ReduceOp};
use mscclpp::trace::{Category, TraceConfig};
use mscclpp_test_support as harness;
use serde_json::Value;

/// The backend under test, or `None` (NOT RUN printed) when it cannot run two ranks.
fn backend(test: &str) -> Option<BackendKind> {
    harness::enough_gpus(test, 2).then(harness::backend)
}

/// A fresh directory for one test's trace.
fn trace_dir(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mscclpp-trace-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Runs `body` on two ranks with their traces on, into `dir`; every rank's error is reported.
fn run_traced(dir: &Path, body: impl Fn(Arc<Communicator>) + Sync) {
    run_traced_on(2, dir, body)
}

/// [`run_traced`] on `ranks` ranks.
fn run_traced_on(ranks: usize, dir: &Path, body: impl Fn(Arc<Communicator>) + Sync) {
    harness::try_ranks_as_threads(ranks, |comm| {
        let comm = Arc::new(comm.traced(TraceConfig::new(dir)));
        body(comm.clone());
        let written = comm.trace_dump()?;
        assert!(written.is_some_and(|p| p.exists()));
        Ok(())
    });
}

/// The merged trace of `dir`, re-parsed from its JSON text.
fn merged(dir: &Path) -> (Vec<Value>, Vec<String>) {
    let m = mscclpp_tools::trace::merge_dir(dir).expect("merge");
    let text = serde_json::to_string(&m.json).unwrap();
    let back: Value = serde_json::from_str(&text).expect("the merged trace is valid JSON");
    (back["traceEvents"].as_array().unwrap().clone(), m.notes)
}

/// A complete event, as the checks see it.
#[derive(Debug, Clone)]
struct X {
    pid: u64,
    tid: u64,
    name: String,
    cat: String,
    start: f64,
    end: f64,
    args: Value,
}

/// Every complete event; checks that each has a start and a non-negative duration.
fn spans(events: &[Value]) -> Vec<X> {
    events
        .iter()
        .filter(|e| e["ph"] == "X")
        .map(|e| {
            let ts = e["ts"].as_f64().expect("ts");
            let dur = e["dur"].as_f64().expect("dur");
            assert!(dur >= 0.0, "a span that ends before it starts: {e}");
            X {
                pid: e["pid"].as_u64().unwrap(),
                tid: e["tid"].as_u64().unwrap(),
                name: e["name"].as_str().unwrap().to_string(),
                cat: e["cat"].as_str().unwrap_or_default().to_string(),
                start: ts,
                end: ts + dur,
                args: e["args"].clone(),
            }
        })
        .collect()
}

/// Whether `inner` lies inside `outer` (µs, with `slack` for the clock mapping's error).
fn inside(inner: &X, outer: &X, slack: f64) -> bool {
    inner.start >= outer.start - slack && inner.end <= outer.end + slack
}

/// The checks every merged trace passes: closed spans, no incomplete block, each block's
/// `comm` inside its block span. Returns the block spans (not `comm`).
fn check_blocks(all: &[X]) -> Vec<X> {
    let blocks: Vec<X> = all
        .iter()
        .filter(|x| x.cat == "kernel" && x.name != "comm")
        .cloned()
        .collect();
    for b in &blocks {
        assert!(
            b.args.get("incomplete").is_none(),
            "a block without its end: {b:?}"
        );
    }
    for c in all.iter().filter(|x| x.cat == "kernel" && x.name == "comm") {
        let owner = blocks
            .iter()
            .find(|b| b.pid == c.pid && b.tid == c.tid && b.args["launch"] == c.args["launch"]);
        let owner = owner.unwrap_or_else(|| panic!("comm without its block: {c:?}"));
        assert!(
            c.start >= owner.start && c.end <= owner.end,
            "block events out of order (start <= send <= recv <= end): {owner:?} {c:?}"
        );
    }
    blocks
}

/// Every thread named `name` on rank `pid`.
fn tids_named(events: &[Value], pid: u64, name: &str) -> Vec<u64> {
    events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name" && e["pid"] == pid)
        .filter(|e| e["args"]["name"] == name)
        .filter_map(|e| e["tid"].as_u64())
        .collect()
}

/// Clock slack of the checks, µs: the CPU backend's device clock is the host's; a GPU's is
/// mapped through clock pairs, good to a few µs.
fn slack(backend: BackendKind) -> f64 {
    if backend == BackendKind::Cpu {
        0.0
    } else {
        20.0
    }
}

#[test]
fn a_traced_two_rank_all_reduce_merges_into_one_consistent_timeline() {
    let Some(backend) = backend("all-reduce trace") else {
        return;
    };
    let dir = trace_dir("allreduce");
    let sizes = [(4096usize, None), (65536, Some(Algorithm::Staged))];
    run_traced(&dir, |comm| {
        let coll = Collectives::new(comm.clone()).expect("collectives");
        let g = comm.gpu().clone();
        let stream = g.stream().unwrap();
        for (bytes, algo) in sizes {
            let count = bytes / 4;
            let input = g.alloc(bytes).unwrap();
            let output = g.alloc(bytes).unwrap();
            let mine: Vec<f32> = (0..count)
                .map(|i| (i % 97) as f32 + comm.rank() as f32 * 1000.0)
                .collect();
            input
                .copy_from_host(0, bytemuck::cast_slice(&mine))
                .unwrap();
            {
                let _step = comm
                    .trace()
                    .span(Category::User, "step")
                    .arg("bytes", bytes);
                // SAFETY: both buffers hold `count` f32 and outlive the synchronize below.
                unsafe {
                    coll.all_reduce(
                        input.ptr(),
                        output.ptr(),
                        count,
                        DataType::F32,
                        ReduceOp::Sum,
                        &stream,
                        algo,
                    )
                }
                .expect("all_reduce");
                stream.synchronize().unwrap();
            }
            let mut got = vec![0f32; count];
            output
                .copy_to_host(0, bytemuck::cast_slice_mut(&mut got))
                .unwrap();
            for (i, v) in got.iter().enumerate() {
                assert_eq!(*v, 2.0 * (i % 97) as f32 + 1000.0, "element {i}");
            }
        }
        comm.barrier().unwrap();
    });
    let (events, notes) = merged(&dir);
    assert!(notes.iter().all(|n| !n.contains("cut short")), "{notes:?}");
    let all = spans(&events);
    let blocks = check_blocks(&all);
    let slack = slack(backend);
    for rank in 0..2u64 {
        let of = |cat: &str| -> Vec<&X> {
            all.iter()
                .filter(|x| x.pid == rank && x.cat == cat)
                .collect()
        };
        let steps: Vec<&X> = of("user")
            .into_iter()
            .filter(|x| x.name == "step")
            .collect();
        let calls: Vec<&X> = of("call")
            .into_iter()
            .filter(|x| x.name == "all_reduce")
            .collect();
        let gpu_calls = of("gpu call");
        assert_eq!(steps.len(), sizes.len(), "rank {rank}: steps");
        assert_eq!(calls.len(), sizes.len(), "rank {rank}: host calls");
        assert_eq!(gpu_calls.len(), sizes.len(), "rank {rank}: GPU calls");
        for (call, (bytes, algo)) in calls.iter().zip(sizes) {
            let id = &call.args["call"];
            assert_eq!(call.args["bytes"], bytes, "rank {rank}: {call:?}");
            if let Some(a) = algo {
                assert_eq!(call.args["algorithm"], a.name());
            }
            let step = steps
                .iter()
                .find(|s| inside(call, s, 0.0))
                .unwrap_or_else(|| panic!("rank {rank}: call {id} outside every step"));
            let mine: Vec<&X> = blocks
                .iter()
                .filter(|b| b.pid == rank && &b.args["call"] == id)
                .collect();
            assert!(
                !mine.is_empty(),
                "rank {rank}: call {id} has no block events"
            );
            for b in &mine {
                assert!(
                    inside(b, step, slack),
                    "rank {rank}: a block of call {id} outside its host call: {b:?} {step:?}"
                );
            }
            let gpu = gpu_calls
                .iter()
                .find(|g| &g.args["call"] == id)
                .unwrap_or_else(|| panic!("rank {rank}: no GPU span of call {id}"));
            assert!(inside(gpu, step, slack), "{gpu:?} outside {step:?}");
            assert_eq!(gpu.args["bytes"], bytes);
            assert!(
                gpu.args["GB/s"].as_f64().is_some_and(|v| v > 0.0),
                "{gpu:?}"
            );
        }
        let setup: Vec<&str> = of("setup").iter().map(|x| x.name.as_str()).collect();
        for phase in [
            "join root",
            "tree",
            "barrier",
            "communicator",
            "collectives",
            "connect",
        ] {
            assert!(
                setup.contains(&phase),
                "rank {rank}: no set-up phase {phase:?}: {setup:?}"
            );
        }
        assert!(
            !tids_named(&events, rank, "GPU block 0").is_empty(),
            "rank {rank}: no track of block 0"
        );
    }

    // The same through the tool, as a user runs it.
    let Some(tool) = tool_path() else {
        println!("NOT RUN: mscclpp-trace merge/plot: the binary is not built here");
        let _ = std::fs::remove_dir_all(&dir);
        return;
    };
    let json = dir.join("trace.json");
    let png = dir.join("timeline.png");
    let out = std::process::Command::new(&tool)
        .args([
            "merge".as_ref(),
            dir.as_os_str(),
            "-o".as_ref(),
            json.as_os_str(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&json).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        v["traceEvents"].as_array().map(Vec::len),
        Some(events.len())
    );
    let out = std::process::Command::new(&tool)
        .args([
            "plot".as_ref(),
            json.as_os_str(),
            "-o".as_ref(),
            png.as_os_str(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::fs::read(&png).unwrap().starts_with(b"\x89PNG"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// One rank, on any backend (one GPU is enough): a pre-multiplied sum is the one collective
/// a single rank runs in a kernel (on a count that is not whole 16-byte vectors, the staged
/// one; every other collective is a copy), so this is where a
/// GPU's own block events (`%globaltimer`) and the clock pairs that map them onto the host's
/// clock are checked when only one GPU is lent: every call has blocks, each block's `send`
/// inside its span, every block and the GPU span inside the host span drawn around "call +
/// synchronize"; the data is right.
#[test]
fn a_traced_one_rank_kernel_puts_its_blocks_inside_the_host_call() {
    let backend = harness::backend();
    let dir = trace_dir("onerank");
    const CALLS: usize = 3;
    // Not whole 16-byte vectors: staged (on whole vectors one rank runs the direct kernel's
    // local reduction, which records no `send`).
    let count = (16 << 10) + 3;
    run_traced_on(1, &dir, |comm| {
        let coll = Collectives::new(comm.clone()).expect("collectives");
        let g = comm.gpu().clone();
        let stream = g.stream().unwrap();
        let (input, output) = (g.alloc(count * 4).unwrap(), g.alloc(count * 4).unwrap());
        let mine: Vec<f32> = (0..count).map(|i| (i % 251) as f32).collect();
        input
            .copy_from_host(0, bytemuck::cast_slice(&mine))
            .unwrap();
        for k in 0..CALLS {
            let _step = comm.trace().span(Category::User, "step").arg("k", k);
            let half = Reduction::PreMulSum(Scalar::host(0.5, DataType::F32));
            // SAFETY: both buffers hold `count` f32 and outlive the synchronize below.
            unsafe {
                coll.all_reduce(
                    input.ptr(),
                    output.ptr(),
                    count,
                    DataType::F32,
                    half,
                    &stream,
                    None,
                )
            }
            .expect("all_reduce");
            stream.synchronize().unwrap();
        }
        let mut got = vec![0f32; count];
        output
            .copy_to_host(0, bytemuck::cast_slice_mut(&mut got))
            .unwrap();
        for (i, v) in got.iter().enumerate() {
            assert_eq!(*v, 0.5 * (i % 251) as f32, "element {i}");
        }
    });
    let (events, notes) = merged(&dir);
    assert!(notes.iter().all(|n| !n.contains("cut short")), "{notes:?}");
    let all = spans(&events);
    let blocks = check_blocks(&all);
    let slack = slack(backend);
    let steps: Vec<&X> = all.iter().filter(|x| x.name == "step").collect();
    let calls: Vec<&X> = all
        .iter()
        .filter(|x| x.cat == "call" && x.name == "all_reduce")
        .collect();
    assert_eq!((steps.len(), calls.len()), (CALLS, CALLS));
    for call in calls {
        let id = &call.args["call"];
        assert_eq!(call.args["algorithm"], Algorithm::Staged.name(), "{call:?}");
        let step = steps
            .iter()
            .find(|s| inside(call, s, 0.0))
            .unwrap_or_else(|| panic!("call {id} outside every step"));
        let mine: Vec<&X> = blocks.iter().filter(|b| &b.args["call"] == id).collect();
        assert!(!mine.is_empty(), "call {id} has no block events");
        for b in &mine {
            assert!(
                inside(b, step, slack),
                "a block of call {id} outside its host call: {b:?} {step:?}"
            );
        }
        // The staged kernel records `send` (an instant: it records no `recv`), inside its
        // block's span.
        for b in &mine {
            let send = events
                .iter()
                .filter(|e| e["ph"] == "i" && e["name"] == "send")
                .filter(|e| e["tid"] == b.tid && e["args"]["launch"] == b.args["launch"])
                .find_map(|e| e["ts"].as_f64())
                .unwrap_or_else(|| panic!("call {id}: a block without its send: {b:?}"));
            assert!(b.start <= send && send <= b.end, "{send} outside {b:?}");
        }
        let gpu = all
            .iter()
            .find(|x| x.cat == "gpu call" && &x.args["call"] == id)
            .unwrap_or_else(|| panic!("no GPU span of call {id}"));
        assert!(inside(gpu, step, slack), "{gpu:?} outside {step:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `mscclpp-trace`: cargo's path, else a GPU bundle's `bin/` (as in `bench_cli.rs`).
fn tool_path() -> Option<PathBuf> {
    let cargo = PathBuf::from(env!("CARGO_BIN_EXE_mscclpp-trace"));
    if cargo.exists() {
        return Some(cargo);
    }
    let exe = std::env::current_exe().ok()?;
    let bundled = exe.parent()?.parent()?.join("bin").join("mscclpp-trace");
    bundled.exists().then_some(bundled)
}

const PING_BYTES: usize = 4096;
const ROUNDS: u32 = 4;

#[test]
fn a_traced_port_channel_ping_pong_shows_the_proxy_inside_the_call() {
    let Some(backend) = backend("port-channel ping-pong trace") else {
        return;
    };
    let dir = trace_dir("portpingpong");
    run_traced(&dir, |comm| {
        let (rank, peer) = (comm.rank(), 1 - comm.rank());
        let g = comm.gpu().clone();
        let t = Transport::local_for(g.kind());
        mscclpp::trace::attach(&comm, 1);
        let conn = comm
            .connect(EndpointConfig::new(t), peer, 0)
            .expect("connect");
        let recv_buf = g.alloc(PING_BYTES).unwrap();
        let src = g.alloc(PING_BYTES).unwrap();
        src.copy_from_host(0, &vec![rank as u8 + 1; PING_BYTES])
            .unwrap();
        let mut svc = PortChannelService::builder(comm.gpu(), comm.status(), 64).unwrap();
        svc.trace(comm.trace());
        let sem = svc
            .add_semaphore(comm.build_semaphore(conn, 7).unwrap())
            .unwrap();
        comm.send_memory(&comm.register_buffer(&recv_buf, t).unwrap(), peer, 3)
            .unwrap();
        let dst = svc.add_memory(comm.recv_memory(peer, 3).unwrap()).unwrap();
        let srcid = svc
            .add_memory(comm.register_buffer(&src, t).unwrap())
            .unwrap();
        let ch = svc.port_channel(sem, dst, srcid).unwrap();
        let svc = svc.start().unwrap();
        let module = g.load_ptx(mscclpp::DEVICE_PTX).unwrap();
        let k = module.kernel(kernels::PORT_PING_PONG).unwrap();
        let stream = g.stream().unwrap();
        comm.barrier().unwrap();
        {
            let call = comm.trace().next_call();
            let _span = comm
                .trace()
                .span(Category::User, "ping_pong")
                .arg("call", call)
                .arg("bytes", PING_BYTES);
            let p = PortPingPongParams {
                status: comm.status().device_ptr(),
                channel: ch,
                bytes: PING_BYTES as u64,
                iterations: ROUNDS,
                role: rank as u32,
                flush: 1,
                reserved: 0,
                trace: comm.trace().launch(call),
            };
            assert!(p.trace.is_on(), "no device rings attached");
            // SAFETY: the channel's memories are live and PING_BYTES long until synchronized.
            unsafe { stream.launch(&k, LaunchConfig::new(1, 1), p) }.unwrap();
            stream.synchronize().unwrap();
        }
        assert!(
            comm.status().error().is_none(),
            "{:?}",
            comm.status().error()
        );
        let mut got = vec![0u8; PING_BYTES];
        recv_buf.copy_to_host(0, &mut got).unwrap();
        assert!(
            got.iter().all(|&b| b == peer as u8 + 1),
            "rank {rank}: data"
        );
        comm.barrier().unwrap();
        svc.stop().unwrap();
    });
    let (events, notes) = merged(&dir);
    assert!(notes.iter().all(|n| !n.contains("cut short")), "{notes:?}");
    let all = spans(&events);
    let blocks = check_blocks(&all);
    let slack = slack(backend);
    for rank in 0..2u64 {
        let call = all
            .iter()
            .find(|x| x.pid == rank && x.cat == "user" && x.name == "ping_pong")
            .unwrap_or_else(|| panic!("rank {rank}: no ping_pong span"));
        let mine: Vec<&X> = blocks.iter().filter(|b| b.pid == rank).collect();
        assert_eq!(
            mine.len(),
            1,
            "rank {rank}: one block of one launch: {mine:?}"
        );
        assert_eq!(mine[0].args["call"], call.args["call"]);
        assert!(
            inside(mine[0], call, slack),
            "{:?} outside {call:?}",
            mine[0]
        );
        let proxy = tids_named(&events, rank, "mscclpp-proxy");
        assert_eq!(proxy.len(), 1, "rank {rank}: one proxy thread");
        let on_proxy: Vec<&X> = all
            .iter()
            .filter(|x| x.pid == rank && x.tid == proxy[0])
            .collect();
        let triggers: Vec<&&X> = on_proxy.iter().filter(|x| x.name == "trigger").collect();
        // Each round: one put-with-signal-and-flush trigger (DATA | FLAG | SYNC), and the last
        // flush of the kernel.
        assert!(
            triggers.len() > ROUNDS as usize,
            "rank {rank}: {} triggers",
            triggers.len()
        );
        for name in ["copy", "signal", "flush"] {
            let inner: Vec<&&X> = on_proxy.iter().filter(|x| x.name == name).collect();
            assert!(!inner.is_empty(), "rank {rank}: no proxy {name}");
            for i in inner {
                assert!(
                    triggers.iter().any(|t| inside(i, t, 0.0)),
                    "rank {rank}: a {name} outside every trigger: {i:?}"
                );
                assert!(
                    inside(i, call, 0.0),
                    "rank {rank}: proxy {name} outside the call"
                );
                if name == "copy" {
                    assert_eq!(i.args["bytes"], PING_BYTES);
                    assert!(i.args["GB/s"].as_f64().is_some());
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The point-to-point engine traced: a send and a receive each way (`send` then `recv` on rank
/// 0, the other order on rank 1), 64 KiB (several lanes) and 256 bytes (one LL lane). Every
/// call has its host span, its GPU span and its `p2p_kernel` blocks, complete, with a `recv`
/// event (every lane served), inside the test's span around call + synchronize.
#[test]
fn a_traced_point_to_point_exchange_shows_its_blocks_inside_each_call() {
    let Some(backend) = backend("point-to-point trace") else {
        return;
    };
    let dir = trace_dir("p2p");
    let sizes = [65536usize, 256];
    run_traced(&dir, |comm| {
        let coll = Collectives::new(comm.clone()).expect("collectives");
        let (rank, peer) = (comm.rank(), 1 - comm.rank());
        let g = comm.gpu().clone();
        let stream = g.stream().unwrap();
        for bytes in sizes {
            let src = g.alloc(bytes).unwrap();
            let dst = g.alloc(bytes).unwrap();
            src.copy_from_host(0, &vec![rank as u8 + 1; bytes]).unwrap();
            for first in [true, false] {
                let sending = first == (rank == 0);
                let _step = comm
                    .trace()
                    .span(Category::User, "step")
                    .arg("bytes", bytes);
                // SAFETY: both buffers hold `bytes` and outlive the synchronize below.
                unsafe {
                    if sending {
                        coll.send(src.ptr(), bytes, DataType::U8, peer, &stream)
                    } else {
                        coll.recv(dst.ptr(), bytes, DataType::U8, peer, &stream)
                    }
                }
                .expect("send / recv");
                stream.synchronize().unwrap();
            }
            let mut got = vec![0u8; bytes];
            dst.copy_to_host(0, &mut got).unwrap();
            assert!(
                got.iter().all(|&b| b == peer as u8 + 1),
                "rank {rank}: data"
            );
        }
        comm.barrier().unwrap();
    });
    let (events, _) = merged(&dir);
    let all = spans(&events);
    let blocks = check_blocks(&all);
    let slack = slack(backend);
    for rank in 0..2u64 {
        let steps: Vec<&X> = all
            .iter()
            .filter(|x| x.pid == rank && x.cat == "user" && x.name == "step")
            .collect();
        let calls: Vec<&X> = all
            .iter()
            .filter(|x| x.pid == rank && x.cat == "call")
            .filter(|x| x.name == "send" || x.name == "recv")
            .collect();
        assert_eq!(steps.len(), 2 * sizes.len(), "rank {rank}: steps");
        assert_eq!(calls.len(), 2 * sizes.len(), "rank {rank}: calls");
        for call in calls {
            let id = &call.args["call"];
            assert_eq!(call.args["algorithm"], "p2p", "{call:?}");
            let step = steps
                .iter()
                .find(|s| inside(call, s, 0.0))
                .unwrap_or_else(|| panic!("rank {rank}: call {id} outside every step"));
            let mine: Vec<&X> = blocks
                .iter()
                .filter(|b| b.pid == rank && &b.args["call"] == id)
                .collect();
            assert!(!mine.is_empty(), "rank {rank}: call {id} has no block");
            for b in &mine {
                assert!(inside(b, step, slack), "{b:?} outside {step:?}");
                let launch = &b.args["launch"];
                let recv = events.iter().any(|e| {
                    e["ph"] == "i"
                        && e["name"] == "recv"
                        && e["pid"] == rank
                        && e["tid"] == b.tid
                        && &e["args"]["launch"] == launch
                });
                assert!(
                    recv,
                    "rank {rank}: a block of call {id} without its recv: {b:?}"
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The calls made of sends and receives traced: a gather to rank 0 (4 KiB per rank) and a
/// group of one send and one receive each way (4 KiB). Each is one `call` span named after the
/// public call (`gather`, `group`), algorithm `p2p`, with its bytes (and root); every launch it
/// made (the host's `launch` instant carrying its call id) lies inside that span, and every
/// block of those launches, complete, inside the test's span around call + synchronize.
#[test]
fn a_traced_gather_and_group_are_call_spans_around_their_p2p_launches() {
    let Some(backend) = backend("gather / group trace") else {
        return;
    };
    let dir = trace_dir("gather-group");
    let bytes = 4096usize;
    run_traced(&dir, |comm| {
        let coll = Collectives::new(comm.clone()).expect("collectives");
        let (rank, peer) = (comm.rank(), 1 - comm.rank());
        let g = comm.gpu().clone();
        let stream = g.stream().unwrap();
        let src = g.alloc(bytes).unwrap();
        let dst = g.alloc(2 * bytes).unwrap();
        src.copy_from_host(0, &vec![rank as u8 + 1; bytes]).unwrap();
        {
            let _step = comm.trace().span(Category::User, "step");
            // SAFETY: `src` holds `bytes`, `dst` twice that; both outlive the synchronize.
            unsafe { coll.gather(src.ptr(), dst.ptr(), bytes, DataType::U8, 0, &stream) }
                .expect("gather");
            stream.synchronize().unwrap();
        }
        if rank == 0 {
            let mut got = vec![0u8; 2 * bytes];
            dst.copy_to_host(0, &mut got).unwrap();
            assert!(
                got[..bytes].iter().all(|&b| b == 1),
                "gather: rank 0's part"
            );
            assert!(
                got[bytes..].iter().all(|&b| b == 2),
                "gather: rank 1's part"
            );
        }
        {
            let _step = comm.trace().span(Category::User, "step");
            let mut group = coll.group();
            // SAFETY: `src` and `dst` hold `bytes` and outlive the synchronize below; the
            // receive touches nothing else of the group.
            unsafe {
                group.send(src.ptr(), bytes, DataType::U8, peer).unwrap();
                group.recv(dst.ptr(), bytes, DataType::U8, peer).unwrap();
            }
            group.end(&stream).expect("group");
            stream.synchronize().unwrap();
        }
        let mut got = vec![0u8; bytes];
        dst.copy_to_host(0, &mut got).unwrap();
        assert!(
            got.iter().all(|&b| b == peer as u8 + 1),
            "rank {rank}: group data"
        );
        comm.barrier().unwrap();
    });
    let (events, _) = merged(&dir);
    let all = spans(&events);
    let blocks = check_blocks(&all);
    let slack = slack(backend);
    for rank in 0..2u64 {
        let steps: Vec<&X> = all
            .iter()
            .filter(|x| x.pid == rank && x.cat == "user" && x.name == "step")
            .collect();
        assert_eq!(steps.len(), 2, "rank {rank}: steps");
        for (name, step) in ["gather", "group"].into_iter().zip(steps) {
            let calls: Vec<&X> = all
                .iter()
                .filter(|x| x.pid == rank && x.cat == "call" && x.name == name)
                .collect();
            assert_eq!(calls.len(), 1, "rank {rank}: {name} calls: {calls:?}");
            let call = calls[0];
            let id = &call.args["call"];
            assert_eq!(call.args["algorithm"], "p2p", "{call:?}");
            assert!(call.args.get("error").is_none(), "{call:?}");
            assert!(
                inside(call, step, 0.0),
                "rank {rank}: {call:?} outside {step:?}"
            );
            // Bytes this rank sends: its part of the gather (to the root, itself included),
            // the group's one send.
            assert_eq!(call.args["bytes"], bytes, "{call:?}");
            let received = match (name, rank) {
                ("gather", 0) => 2 * bytes,
                ("gather", _) => 0,
                _ => bytes,
            };
            assert_eq!(call.args["recv_bytes"], received, "{call:?}");
            if name == "gather" {
                assert_eq!(call.args["root"], 0, "{call:?}");
            }
            let launches: Vec<f64> = events
                .iter()
                .filter(|e| e["ph"] == "i" && e["cat"] == "launch" && e["pid"] == rank)
                .filter(|e| &e["args"]["call"] == id)
                .map(|e| e["ts"].as_f64().expect("ts"))
                .collect();
            assert!(!launches.is_empty(), "rank {rank}: {name} has no launch");
            for ts in launches {
                assert!(
                    ts >= call.start && ts <= call.end,
                    "rank {rank}: a launch of {name} at {ts} outside {call:?}"
                );
            }
            let mine: Vec<&X> = blocks
                .iter()
                .filter(|b| b.pid == rank && &b.args["call"] == id)
                .collect();
            assert!(!mine.is_empty(), "rank {rank}: {name} has no block");
            for b in mine {
                assert!(inside(b, step, slack), "{b:?} outside {step:?}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
