//! Several ranks on one GPU (issue 29), on the backend under test: every rank of these worlds
//! runs on device 0, as threads of this process.
//!
//! - A kernel whose module was loaded before a peer's kernel started spinning runs, whatever
//!   the driver's module loading mode (lazily loaded code would wait for the spinning kernel,
//!   which waits for it: `host/src/gpu/cuda/module.rs`).
//! - Without the mode, collectives refuse a second rank on a GPU; with it
//!   (`CollectiveConfig::ranks_per_gpu`, `MSCCLPP_RANKS_PER_GPU`), they run on 2, 4 and 8
//!   ranks, every launch within the rank's share of the multiprocessors.
//!
//! On the CPU backend the ranks share its one device anyway (no GPU to share, no caps): the
//! same calls run and are checked, which is what CI sees.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mscclpp::collectives::{Algorithm, CollectiveConfig, Collectives, ENV_RANKS_PER_GPU};
use mscclpp::host::communicator::Communicator;
use mscclpp::host::connection::EndpointConfig;
use mscclpp::host::gpu::{BackendKind, LaunchConfig};
use mscclpp::host::memory_channel::MemoryChannel;
use mscclpp::host::status::StatusBlock;
use mscclpp::host::transport::Transport;
use mscclpp::host::{Error, Result};
use mscclpp::kernels;
use mscclpp::shared::{DataType, DevicePtr, PingPongParams, ReduceOp};
use mscclpp::world::run_local_ranks_on;
use mscclpp_test_support::{backend, pattern};

/// Runs `body` on `n` ranks as threads, every rank on device 0; panics naming the rank that
/// failed. A watchdog aborts every rank's communicator after `bound` (releasing any kernel
/// still waiting), so a lost wake-up fails the test instead of hanging it.
fn on_device_0<T: Send>(
    n: usize,
    bound: Duration,
    body: impl Fn(Communicator) -> Result<T> + Sync,
) -> Vec<T> {
    let statuses: std::sync::Mutex<Vec<Arc<StatusBlock>>> = std::sync::Mutex::new(Vec::new());
    let done = AtomicBool::new(false);
    let results = std::thread::scope(|s| {
        s.spawn(|| {
            let start = Instant::now();
            while !done.load(Ordering::Acquire) {
                if start.elapsed() > bound {
                    for st in statuses.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                        st.abort();
                    }
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let r = run_local_ranks_on(
            backend(),
            n,
            |_| 0,
            |comm| {
                let status = comm.status().clone();
                statuses
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(status.clone());
                match (body(comm), status.error()) {
                    (Ok(v), None) => Ok(v),
                    (Ok(_), Some(e)) | (Err(e), _) => Err(e),
                }
            },
        );
        done.store(true, Ordering::Release);
        r
    });
    results
        .into_iter()
        .enumerate()
        .map(|(r, x)| x.unwrap_or_else(|e| panic!("rank {r}: {e}")))
        .collect()
}

/// Whether the environment already opts in to the mode (then a refusal cannot be seen).
fn mode_in_env() -> bool {
    std::env::var(ENV_RANKS_PER_GPU)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .is_some_and(|n| n > 1)
}

/// A memory-channel ping-pong between two ranks on device 0; `late` (rank 1 or 0, or none)
/// starts after the other's kernel has been spinning for a while, doing `before_launch` first.
/// `before_launch` is given a second module of the late rank's, loaded before either kernel ran
/// (loading code while a kernel of the context spins waits for that kernel: load modules first).
/// Returns each rank's time from its launch decision to the end of its kernel.
fn ping_pong_on_device_0(
    late: usize,
    before_launch: impl Fn(&Communicator, mscclpp::host::gpu::Module) -> Result<()> + Sync,
) -> Vec<Duration> {
    const BYTES: usize = 64 << 10;
    let threads = match backend() {
        BackendKind::Cuda => 256,
        BackendKind::Cpu => 16,
    };
    on_device_0(2, Duration::from_secs(60), |comm| {
        let (rank, peer) = (comm.rank(), 1 - comm.rank());
        let gpu = comm.gpu().clone();
        let t = Transport::local_for(gpu.kind());
        let conn = comm.connect(EndpointConfig::new(t), peer, 0)?;
        let inbox = gpu.alloc(BYTES)?;
        let outbox = gpu.alloc(BYTES)?;
        outbox.copy_from_host(0, &pattern(BYTES, rank as u8))?;
        comm.send_memory(&comm.register_buffer(&inbox, t)?, peer, 0)?;
        let channel = MemoryChannel::new(
            comm.build_memory_semaphore(conn.as_ref(), 0)?,
            comm.recv_memory(peer, 0)?,
            outbox.ptr(),
            DevicePtr::NULL,
        )?;
        // Each rank its own module, loaded before either kernel runs.
        let module = gpu.load_ptx(mscclpp::DEVICE_PTX)?;
        let spare = if rank == late {
            Some(gpu.load_ptx(mscclpp::DEVICE_PTX)?)
        } else {
            None
        };
        let stream = gpu.stream()?;
        let params = PingPongParams {
            status: comm.status().device_ptr(),
            channel: channel.device_handle()?,
            bytes: BYTES as u64,
            iterations: 10,
            role: rank as u32,
            flag_base: 0,
            reserved: 0,
        };
        comm.bootstrap().barrier()?;
        if rank == late {
            std::thread::sleep(Duration::from_millis(300));
        }
        let start = Instant::now();
        if let Some(spare) = spare {
            before_launch(&comm, spare)?;
        }
        let kernel = module.kernel(kernels::MEMORY_PING_PONG)?;
        // SAFETY: both buffers are BYTES long and outlive the launch (synchronized below).
        unsafe { stream.launch(&kernel, LaunchConfig::new(1, threads), params)? };
        stream.synchronize()?;
        let took = start.elapsed();
        if let Some(e) = comm.status().error() {
            return Err(e);
        }
        let mut got = vec![0u8; BYTES];
        inbox.copy_to_host(0, &mut got)?;
        if got != pattern(BYTES, peer as u8) {
            return Err(Error::Aborted {
                reason: format!("rank {rank}: the peer's bytes did not arrive"),
            });
        }
        comm.bootstrap().barrier()?;
        Ok(took)
    })
}

/// Rank 1 takes its ping-pong kernel only after rank 0's has been spinning for a while: the
/// code of every kernel of a module is loaded with the module, so it runs. (Before, a lazily
/// loaded kernel's `cuFuncLoad` waited for rank 0's kernel, which waited for it until the
/// watchdog.)
#[test]
fn a_kernel_taken_after_its_peer_started_spinning_runs() {
    let times = ping_pong_on_device_0(1, |_, _| Ok(()));
    eprintln!(
        "ping-pong on one device: rank 0 {:?}, rank 1 {:?}",
        times[0], times[1]
    );
}

/// While rank 1's kernel waits for rank 0's, rank 0 frees memory (a device buffer, host-mapped
/// memory, a module loaded before) and allocates again: on CUDA each free would wait for every kernel of the
/// context, rank 1's included, which waits for rank 0; they are held back while both ranks
/// live (`host/src/gpu/cuda/release.rs`), so rank 0 goes on at once.
#[test]
fn a_rank_frees_while_its_peers_kernel_waits_for_it() {
    let took = std::sync::Mutex::new(Duration::ZERO);
    ping_pong_on_device_0(0, |comm, spare| {
        let g = comm.gpu();
        if g.kind() == BackendKind::Cuda && comm.ranks_on_device() != 2 {
            return Err(Error::Aborted {
                reason: format!(
                    "{} ranks counted on the device, not 2",
                    comm.ranks_on_device()
                ),
            });
        }
        let start = Instant::now();
        drop(spare);
        for _ in 0..3 {
            let b = g.alloc(8 << 20)?;
            b.copy_from_host(0, &[7u8; 4096])?;
            drop(b);
            drop(g.alloc_host_mapped(1 << 20)?);
            // A buffer of a held size is handed out again, zeroed.
            let again = g.alloc(8 << 20)?;
            let mut first = [1u8; 4096];
            again.copy_to_host(0, &mut first)?;
            if first.iter().any(|&b| b != 0) {
                return Err(Error::Aborted {
                    reason: "a reused allocation was not zeroed".into(),
                });
            }
        }
        *took.lock().unwrap_or_else(|e| e.into_inner()) = start.elapsed();
        Ok(())
    });
    // Had a free waited for rank 1's kernel, the watchdog would have ended both and the
    // ping-pong failed.
    let took = *took.lock().unwrap_or_else(|e| e.into_inner());
    eprintln!(
        "a module unloaded, three frees and allocations while the peer's kernel waited: {took:?}"
    );
}

#[test]
fn a_second_rank_on_a_gpu_is_refused_without_the_mode() {
    if backend() == BackendKind::Cpu {
        eprintln!(
            "NOT RUN: the CPU backend's ranks share no GPU (sharing.rs's unit tests check the rule)"
        );
        return;
    }
    if mode_in_env() {
        eprintln!("NOT RUN: {ENV_RANKS_PER_GPU} is set, so two ranks on a GPU are allowed");
        return;
    }
    on_device_0(2, Duration::from_secs(60), |comm| {
        let cfg = CollectiveConfig::for_backend(comm.gpu().kind());
        match Collectives::with_config(Arc::new(comm), cfg) {
            Err(Error::DuplicateGpu {
                first: 0,
                second: 1,
                ranks: 2,
                allowed: 1,
                ..
            }) => Ok(()),
            other => Err(Error::Aborted {
                reason: format!("expected DuplicateGpu, got {:?}", other.err()),
            }),
        }
    });
}

/// `count` f32 values of `rank`'s part `part`: small integers, so every sum is exact.
fn values(rank: usize, part: usize, count: usize) -> Vec<f32> {
    (0..count)
        .map(|i| ((rank * 131 + part * 17 + i * 7) % 61) as f32 - 30.0)
        .collect()
}

/// The element-wise sum over the `n` ranks of their part `part` of `count` values (each
/// rank's part made once: the copy-engine sizes hold millions of elements).
fn sum_of_parts(n: usize, part: usize, count: usize) -> Vec<f32> {
    let mut sum = vec![0f32; count];
    for r in 0..n {
        for (s, v) in sum.iter_mut().zip(values(r, part, count)) {
            *s += v;
        }
    }
    sum
}

fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn from_bytes(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// All-reduce (every size class the selection table has on this backend, every algorithm that
/// serves it forced once), all-gather, reduce-scatter, broadcast, all-to-all and a send/receive
/// ring on `n` ranks sharing device 0, checked against host sums.
fn collectives_on_one_device(n: usize) {
    on_device_0(n, Duration::from_secs(600), |comm| {
        let (rank, g) = (comm.rank(), comm.gpu().clone());
        let mut cfg = CollectiveConfig::for_backend(g.kind());
        cfg.ranks_per_gpu = n;
        let c = Collectives::with_config(Arc::new(comm), cfg)?;
        let comm = c.communicator();
        let used = c.config();
        if let (Some(sms), BackendKind::Cuda) = (g.multiprocessors(), g.kind()) {
            let share = sms / n as u32;
            let within = used.direct_blocks <= share
                && used.staged_blocks <= share
                && used.ll_blocks < share
                && used.ll128_max_blocks < share
                && used.p2p_lanes * 16 <= share;
            if !within {
                return Err(Error::Aborted {
                    reason: format!("launch shapes beyond a share of {share} blocks: {used:?}"),
                });
            }
        }
        let stream = g.stream()?;
        let fail = |what: String| Error::Aborted { reason: what };
        // All-reduce: sizes across the table (LL, LL128 / two-shot, direct, copy engines; the
        // CPU backend's grid emulator stops below the copy engines' size, which
        // `tests/collectives.rs` covers there).
        let gpu = g.kind() == BackendKind::Cuda;
        let mut sizes = vec![
            1usize,
            1000,
            used.ll128_min_bytes / 4 + 3,
            used.direct_min_bytes / 4 + 16,
        ];
        if gpu {
            sizes.push(used.ce_all_reduce_min_bytes / 4 + 16);
        }
        let mut runs: Vec<(usize, Option<Algorithm>)> = sizes.iter().map(|&s| (s, None)).collect();
        for a in [
            Algorithm::LlOneShot,
            Algorithm::Staged,
            Algorithm::TwoShotPut,
            Algorithm::Direct,
            Algorithm::CopyEngine,
            Algorithm::Ll128,
            Algorithm::LlTwoShot,
        ] {
            runs.push((if gpu { 4096 } else { 1024 }, Some(a)));
        }
        for (count, algo) in runs {
            let bytes = count * 4;
            let input = g.alloc(bytes)?;
            let output = g.alloc(bytes)?;
            input.copy_from_host(0, &to_bytes(&values(rank, 0, count)))?;
            // SAFETY: both buffers hold `count` f32 until the synchronize.
            unsafe {
                c.all_reduce(
                    input.ptr(),
                    output.ptr(),
                    count,
                    DataType::F32,
                    ReduceOp::Sum,
                    &stream,
                    algo,
                )?
            };
            stream.synchronize()?;
            let mut got = vec![0u8; bytes];
            output.copy_to_host(0, &mut got)?;
            let want = sum_of_parts(n, 0, count);
            if from_bytes(&got) != want {
                return Err(fail(format!(
                    "all_reduce of {count} on {n} ranks ({algo:?}, ran {:?}) differs",
                    c.last_algorithm()
                )));
            }
        }
        // All-gather and reduce-scatter, 3000 elements a part (300 on the CPU backend).
        let part = if gpu { 3000 } else { 300 };
        let mine = g.alloc(part * 4)?;
        let all = g.alloc(n * part * 4)?;
        mine.copy_from_host(0, &to_bytes(&values(rank, 1, part)))?;
        // SAFETY: `mine` holds a part, `all` n parts, until the synchronize.
        unsafe { c.all_gather(mine.ptr(), all.ptr(), part, DataType::F32, &stream, None)? };
        stream.synchronize()?;
        let mut got = vec![0u8; n * part * 4];
        all.copy_to_host(0, &mut got)?;
        let want: Vec<f32> = (0..n).flat_map(|r| values(r, 1, part)).collect();
        if from_bytes(&got) != want {
            return Err(fail(format!("all_gather on {n} ranks differs")));
        }
        let input = g.alloc(n * part * 4)?;
        let whole: Vec<f32> = (0..n).flat_map(|p| values(rank, p + 2, part)).collect();
        input.copy_from_host(0, &to_bytes(&whole))?;
        // SAFETY: as above.
        unsafe {
            c.reduce_scatter(
                input.ptr(),
                mine.ptr(),
                part,
                DataType::F32,
                ReduceOp::Sum,
                &stream,
                None,
            )?
        };
        stream.synchronize()?;
        let mut got = vec![0u8; part * 4];
        mine.copy_to_host(0, &mut got)?;
        let want = sum_of_parts(n, rank + 2, part);
        if from_bytes(&got) != want {
            return Err(fail(format!("reduce_scatter on {n} ranks differs")));
        }
        // Broadcast from the last rank, then all-to-all.
        let root = n - 1;
        mine.copy_from_host(0, &to_bytes(&values(rank, 9, part)))?;
        // SAFETY: `mine` holds a part.
        unsafe {
            c.broadcast(
                mine.ptr(),
                mine.ptr(),
                part,
                DataType::F32,
                root,
                &stream,
                None,
            )?
        };
        stream.synchronize()?;
        mine.copy_to_host(0, &mut got)?;
        if from_bytes(&got) != values(root, 9, part) {
            return Err(fail(format!("broadcast on {n} ranks differs")));
        }
        let sent: Vec<f32> = (0..n).flat_map(|p| values(rank, 20 + p, part)).collect();
        input.copy_from_host(0, &to_bytes(&sent))?;
        // SAFETY: both hold n parts.
        unsafe { c.all_to_all(input.ptr(), all.ptr(), part, DataType::F32, &stream, None)? };
        stream.synchronize()?;
        let mut got = vec![0u8; n * part * 4];
        all.copy_to_host(0, &mut got)?;
        let want: Vec<f32> = (0..n).flat_map(|p| values(p, 20 + rank, part)).collect();
        if from_bytes(&got) != want {
            return Err(fail(format!("all_to_all on {n} ranks differs")));
        }
        // A ring of send/receive pairs.
        let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
        mine.copy_from_host(0, &to_bytes(&values(rank, 40, part)))?;
        let inbox = g.alloc(part * 4)?;
        // SAFETY: both hold a part and do not overlap.
        unsafe {
            c.send_recv(
                mine.ptr(),
                next,
                inbox.ptr(),
                prev,
                part,
                DataType::F32,
                &stream,
            )?
        };
        stream.synchronize()?;
        inbox.copy_to_host(0, &mut got[..part * 4])?;
        if from_bytes(&got[..part * 4]) != values(prev, 40, part) {
            return Err(fail(format!("send_recv ring on {n} ranks differs")));
        }
        comm.bootstrap().barrier()?;
        Ok(())
    });
}

#[test]
fn collectives_on_two_ranks_of_one_gpu() {
    collectives_on_one_device(2);
}

#[test]
fn collectives_on_four_ranks_of_one_gpu() {
    collectives_on_one_device(4);
}

#[test]
fn collectives_on_eight_ranks_of_one_gpu() {
    collectives_on_one_device(8);
}
