//! A rank killed (SIGKILL of itself, as a crash would end it) at the worst moments: during
//! set-up, during a PortChannel transfer, inside an all-reduce of each algorithm. Ranks run as
//! processes. Every survivor must get an
//! error, or have its kernel released with `Error::Remote` naming the victim, within
//! [`RELEASE_WITHIN`], and then exit cleanly; the parent waits for every child (none is left
//! behind). Every step's error is checked for its type (and the rank it names).
//!
//! Memory: the CPU backend's device memory is one memfd per allocation (nothing ever appears
//! in `/dev/shm`, so a check there could not fail); what a failed communicator could leak is
//! its mappings and descriptors of its own and the dead rank's memory. So on the CPU backend
//! each survivor checks, once its case has dropped everything, that no `memfd:mscclpp-`
//! mapping or descriptor is left in its process (and, in the cases that queue work, that it
//! had some while it waited, so the check sees what it looks for).
//!
//! Each test prints the survivors' release times (`cargo test --test faults -- --nocapture`).
//!
//! The backend is the one `MSCCLPP_BACKEND` selects (`cpu`, or `cuda`; unset: CUDA when a GPU
//! is present, else the CPU backend), in the parent and every child alike. On CUDA each rank
//! takes its own GPU, rank `r` device `r % devices`; a case needing more ranks than there are
//! GPUs (times `MSCCLPP_RANKS_PER_GPU`, the harness's count) is not run (it says `NOT RUN` on
//! stderr), so on 2 GPUs the 2-rank cases run:
//! `MSCCLPP_BACKEND=cuda cargo test --release --test faults -- --nocapture` (or through the GPU
//! bundle: `bash gpu-bundle/run-tests.sh faults`).

use std::os::unix::process::ExitStatusExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mscclpp::DEVICE_PTX;
use mscclpp::collectives::{Algorithm, Collectives};
use mscclpp::host::Error;
use mscclpp::host::bootstrap::{Bootstrap, TcpBootstrap, Watch};
use mscclpp::host::communicator::Communicator;
use mscclpp::host::connection::EndpointConfig;
use mscclpp::host::gpu::{BackendKind, LaunchConfig, Stream};
use mscclpp::host::port_channel::PortChannelService;
use mscclpp::host::transport::Transport;
use mscclpp::kernels;
use mscclpp::shared::{DataType, PortPingPongParams, ReduceOp};
use mscclpp_test_support as harness;
use mscclpp_test_support::{module, pattern};

/// How long a survivor may take to learn of the death.
const RELEASE_WITHIN: Duration = Duration::from_secs(10);
/// The parent's hang guard: a child still running after this is killed and the test fails.
const HANG_GUARD: Duration = Duration::from_secs(40);
/// How long the victim lets the survivor wait inside the operation before it dies.
const DIE_AFTER: Duration = Duration::from_millis(200);

/// How long a survivor stays alive after its error (set-up failures, and rank 0 of the slow-peer
/// cases), so that the other survivors see the victim die before they see this rank leave.
const SURVIVOR_LINGER: Duration = Duration::from_millis(500);

/// The cases share two cores; run one at a time so the release times mean something.
static SERIAL: Mutex<()> = Mutex::new(());

/// This process's mappings and descriptors of CPU-backend device memory (`memfd:mscclpp-…`,
/// its own allocations and those of peers it opened), as lines naming each.
fn memfds() -> Vec<String> {
    const NAME: &str = "memfd:mscclpp-";
    let mut found: Vec<String> = std::fs::read_to_string("/proc/self/maps")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(NAME))
        .map(|l| format!("mapping {l}"))
        .collect();
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        for e in fds.flatten() {
            if let Ok(link) = std::fs::read_link(e.path())
                && link.to_string_lossy().contains(NAME)
            {
                found.push(format!(
                    "fd {} -> {}",
                    e.file_name().to_string_lossy(),
                    link.display()
                ));
            }
        }
    }
    found
}

/// On the CPU backend, a survivor's check once its case returned (everything it made
/// dropped): within a few seconds (threads that held the communicator wind down) no
/// mapping or descriptor of device memory is left.
fn expect_memory_released() {
    if harness::backend() != BackendKind::Cpu {
        println!("FAULT memory check NOT RUN: it reads the CPU backend's memfd mappings");
        return;
    }
    let start = Instant::now();
    loop {
        let left = memfds();
        if left.is_empty() {
            println!("FAULT_MEMORY_RELEASED");
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "device memory still mapped 5 s after the case dropped it:\n{}",
            left.join("\n")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Parent side: runs `n` ranks of `test`, where rank `victim` kills itself; checks every
/// survivor exited successfully within the bound, the victim died of SIGKILL, every child was
/// reaped and no shared-memory file was left.
fn run_fault(test: &str, n: usize, victim: usize) {
    if !harness::enough_gpus(test, n) {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let t0 = Instant::now();
    let ends = harness::Processes::new(test, n).bound(HANG_GUARD).run();
    let took = t0.elapsed();
    let all = |ends: &[harness::ChildEnd]| {
        ends.iter()
            .enumerate()
            .map(|(r, e)| format!("--- rank {r} ({}):\n{}", e.status, e.output()))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(ends.len(), n, "not every rank started\n{}", all(&ends));
    for (r, e) in ends.iter().enumerate() {
        assert!(
            !e.overran,
            "rank {r} hung (killed after {HANG_GUARD:?})\n{}",
            all(&ends)
        );
        if r == victim {
            assert_eq!(
                e.status.signal(),
                Some(libc::SIGKILL),
                "the victim (rank {r}) did not die of SIGKILL\n{}",
                all(&ends)
            );
        } else {
            assert!(
                e.status.success(),
                "survivor rank {r} failed\n{}",
                all(&ends)
            );
        }
        // Reaped: the pid no longer names a child of ours (it may have been reused by now).
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{}/stat", e.pid)) {
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            assert_ne!(ppid, Some(std::process::id()), "rank {r} was left behind");
        }
        for line in e.output().lines() {
            if let Some(at) = line.find("FAULT ") {
                println!("{test}: rank {r}: {}", &line[at + 6..]);
            }
        }
    }
    // Release times measured against the victim's own clock reading just before it died (one
    // machine, one wall clock).
    let stamp = |e: &harness::ChildEnd, key: &str| -> Vec<u128> {
        e.output()
            .lines()
            .filter_map(|l| l.find(key).map(|at| &l[at + key.len()..]))
            .filter_map(|v| v.trim().parse().ok())
            .collect()
    };
    let died = stamp(&ends[victim], "FAULT_DIED_AT_NS ");
    let died = *died.first().expect("the victim printed no time of death");
    for (r, e) in ends.iter().enumerate().filter(|(r, _)| *r != victim) {
        let released = stamp(e, "FAULT_RELEASED_AT_NS ");
        let released = *released
            .first()
            .unwrap_or_else(|| panic!("survivor rank {r} printed no release time"));
        let after = Duration::from_nanos(released.saturating_sub(died) as u64);
        println!("{test}: rank {r} got its error {after:?} after the victim died");
        assert!(
            after < RELEASE_WITHIN,
            "survivor rank {r} got its error only {after:?} after the victim died (bound \
             {RELEASE_WITHIN:?}); its output says what it was blocked on:\n{}",
            e.output()
        );
    }
    if harness::backend() == BackendKind::Cpu {
        for (r, e) in ends.iter().enumerate().filter(|(r, _)| *r != victim) {
            assert!(
                e.output().contains("FAULT_MEMORY_RELEASED"),
                "survivor rank {r} did not report its memory released:\n{}",
                e.output()
            );
        }
    }
    println!("{test}: whole case {took:?}");
}

fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// A survivor's record of when it got its error (read by [`run_fault`]).
fn mark_released() {
    println!("\nFAULT_RELEASED_AT_NS {}", now_ns());
}

/// Ends this process at once, as a crash would.
fn die_now() -> ! {
    use std::io::Write;
    println!("\nFAULT_DIED_AT_NS {}", now_ns());
    let _ = std::io::stdout().flush();
    // SAFETY: SIGKILL of ourselves; nothing after it runs.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    unreachable!("SIGKILL returned");
}

/// Kills this process `after` from now, whatever its main thread is doing.
fn die_in(after: Duration) {
    std::thread::spawn(move || {
        std::thread::sleep(after);
        die_now()
    });
}

/// Waits (bounded by `deadline`) until the communicator reports `Error::Remote` naming
/// `victim`.
fn expect_remote(comm: &Communicator, victim: usize, deadline: Instant) {
    loop {
        match comm.async_error() {
            Some(Error::Remote { rank, .. }) if rank == victim => return,
            Some(Error::Remote { rank, reason }) => {
                panic!("Error::Remote names rank {rank} ({reason}), not the victim {victim}")
            }
            other if Instant::now() >= deadline => {
                panic!("no Error::Remote naming rank {victim} within the bound: {other:?}")
            }
            _ => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Whether `e` is what a survivor may get from work that waited for the dead `victim`: the
/// communicator's verdict naming it, or a device wait that the abort released.
fn released_error(e: &Error, victim: usize) -> bool {
    match e {
        Error::Remote { rank, .. } => *rank == victim,
        Error::Device { code, .. } => *code == mscclpp::shared::DeviceErrorCode::Aborted,
        _ => false,
    }
}

/// Whether `e` is what a survivor's collective call may be refused with once `victim` died:
/// as [`released_error`] (the communicator's first recorded error, a released device wait),
/// or the registered paths' per-call exchange finding the victim's bootstrap link closed.
fn refused_error(e: &Error, victim: usize) -> bool {
    released_error(e, victim)
        || matches!(e, Error::BootstrapPeerClosed { peer, .. } if peer.rank == Some(victim))
}

/// Whether `e` is what `Collectives::new` may fail with once `victim` died: the
/// communicator's verdict naming it, a send to the victim's closed bootstrap link (before the
/// verdict), or (the victim died after sending its buffers' handles) opening the victim's
/// memory, which died with it.
fn setup_error(e: &Error, victim: usize) -> bool {
    match e {
        Error::Remote { rank, .. } => *rank == victim,
        Error::BootstrapPeerClosed { peer, .. } => peer.rank == Some(victim),
        // Another survivor's notice of the death can reach this rank before its own link to
        // the victim closes (bootstrap v3).
        Error::BootstrapPeerGone { peer, .. } => peer.rank == Some(victim),
        // The tree bootstrap opens a link on first use: a link to the victim opened after its
        // death is refused.
        Error::BootstrapConnect { peer, .. } => peer.rank == Some(victim),
        // Opening the victim's memory fails once it is gone: named by its device, or (CPU
        // backend, where ranks may share a device) by its process, which is dead. Or another
        // survivor's memory: that survivor's set-up already failed for the death and freed
        // it (a cascade; the caller then checks that the communicator names the victim).
        Error::IpcOpen {
            owner_device,
            owner_pid,
            source,
            ..
        } => {
            *owner_device as usize == victim
                || (*owner_pid != 0 && process_gone(*owner_pid))
                || format!("{source:?}").contains("NotFound")
        }
        _ => false,
    }
}

/// Whether process `pid` has exited (no `/proc` entry, or a zombie not yet reaped).
fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the command name, which is in parentheses and may hold spaces.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| state == 'Z' || state == 'X'),
    }
}

/// The survivor's check after queuing work that waits for the victim: the stream finishes (or
/// fails) within the bound and the communicator names the victim.
fn expect_released(comm: &Communicator, stream: &Stream, start: Instant, victim: usize) {
    let done = stream.synchronize_timeout(RELEASE_WITHIN);
    let waited = start.elapsed();
    mark_released();
    match done {
        Ok(true) => {}
        Ok(false) => panic!("the kernel still waits for dead rank {victim} after {waited:?}"),
        Err(e) => {
            assert!(released_error(&e, victim), "the stream reported {e:?}");
            println!("FAULT the stream reported: {e}")
        }
    }
    assert!(waited < RELEASE_WITHIN, "released only after {waited:?}");
    expect_remote(comm, victim, start + RELEASE_WITHIN);
    assert!(
        matches!(comm.recv_memory(victim, 77), Err(Error::Remote { rank, .. }) if rank == victim),
        "a set-up call still works after rank {victim} died"
    );
    println!("FAULT released after {} ms", waited.as_millis());
}

/// (a) The victim dies right after bootstrap, before its `Collectives::new`: the survivor's
/// `Collectives::new` fails.
fn setup_before(comm: Communicator, victim: usize) {
    if comm.rank() == victim {
        die_now();
    }
    let comm = Arc::new(comm);
    let start = Instant::now();
    let got = Collectives::new(comm.clone());
    let waited = start.elapsed();
    mark_released();
    match got {
        Ok(_) => panic!("Collectives::new succeeded with rank {victim} dead"),
        Err(e) => {
            assert!(setup_error(&e, victim), "Collectives::new gave {e:?}");
            println!("FAULT Collectives::new failed after {waited:?}: {e}")
        }
    }
    assert!(waited < RELEASE_WITHIN, "Collectives::new took {waited:?}");
    expect_remote(&comm, victim, start + RELEASE_WITHIN);
}

/// A bootstrap that kills its process at the start of its `ops`-th send or receive (counting
/// from 1): a rank that dies in the middle of the set-up exchanges, after some of its messages
/// went out and before the rest.
struct DieAtOp {
    inner: TcpBootstrap,
    ops: AtomicUsize,
}

impl DieAtOp {
    fn step(&self) {
        if self.ops.fetch_sub(1, Ordering::Relaxed) == 1 {
            die_now();
        }
    }
}

impl Bootstrap for DieAtOp {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn local_rank(&self) -> usize {
        self.inner.local_rank()
    }
    fn ranks_per_node(&self) -> usize {
        self.inner.ranks_per_node()
    }
    fn node_of(&self, rank: usize) -> Option<usize> {
        self.inner.node_of(rank)
    }
    fn send(&self, peer: usize, tag: u64, data: &[u8]) -> mscclpp::host::Result<()> {
        self.step();
        self.inner.send(peer, tag, data)
    }
    fn recv_watched(
        &self,
        peer: usize,
        tag: u64,
        timeout: Duration,
        watch: Watch<'_>,
    ) -> mscclpp::host::Result<Vec<u8>> {
        self.step();
        self.inner.recv_watched(peer, tag, timeout, watch)
    }
    fn all_gather_watched(
        &self,
        data: &[u8],
        watch: Watch<'_>,
    ) -> mscclpp::host::Result<Vec<Vec<u8>>> {
        self.step();
        self.inner.all_gather_watched(data, watch)
    }
    fn barrier_watched(&self, watch: Watch<'_>) -> mscclpp::host::Result<()> {
        self.step();
        self.inner.barrier_watched(watch)
    }
    fn broadcast_watched(
        &self,
        root: usize,
        data: &mut Vec<u8>,
        watch: Watch<'_>,
    ) -> mscclpp::host::Result<()> {
        self.step();
        self.inner.broadcast_watched(root, data, watch)
    }
    fn op_timeout(&self) -> Duration {
        self.inner.op_timeout()
    }
    fn dead_peer(&self) -> Option<(usize, String)> {
        self.inner.dead_peer()
    }
}

/// (a) The victim dies in the middle of `Collectives::new`'s exchanges (at its `at_op`-th
/// bootstrap operation): every survivor's `Collectives::new` fails.
fn setup_during(bs: TcpBootstrap, victim: usize, at_op: usize, linger: Duration) {
    let rank = bs.rank();
    let bs: Arc<dyn Bootstrap> = if rank == victim {
        Arc::new(DieAtOp {
            inner: bs,
            ops: AtomicUsize::new(at_op),
        })
    } else {
        Arc::new(bs)
    };
    let comm = Arc::new(Communicator::new(bs, harness::gpu(rank)).expect("communicator"));
    let start = Instant::now();
    let got = Collectives::new(comm.clone());
    let waited = start.elapsed();
    if rank == victim {
        panic!(
            "the victim finished set-up ({:?}) without reaching op {at_op}",
            got.err()
        );
    }
    mark_released();
    match got {
        Ok(_) => panic!("Collectives::new succeeded with rank {victim} dead"),
        Err(e) => {
            assert!(setup_error(&e, victim), "Collectives::new gave {e:?}");
            println!("FAULT Collectives::new failed after {waited:?}: {e}")
        }
    }
    assert!(waited < RELEASE_WITHIN, "Collectives::new took {waited:?}");
    expect_remote(&comm, victim, start + RELEASE_WITHIN);
    // Stay alive a while: no survivor may depend on another survivor exiting to learn of the
    // death (a survivor blocked on a live one would wait out the bootstrap's op timeout).
    std::thread::sleep(linger);
}

/// (b) Both ranks run a long PortChannel ping-pong; the victim dies in the middle of it.
fn port_transfer(comm: Communicator, victim: usize) {
    const BYTES: usize = 16 * 1024;
    let (rank, peer) = (comm.rank(), 1 - comm.rank());
    let g = comm.gpu().clone();
    let t = Transport::local_for(g.kind());
    let conn = comm.connect(EndpointConfig::new(t), peer, 0).unwrap();
    let recv_buf = g.alloc(BYTES).unwrap();
    let src = g.alloc(BYTES).unwrap();
    src.copy_from_host(0, &pattern(BYTES, rank as u8)).unwrap();
    let mut svc = PortChannelService::builder(comm.gpu(), comm.status(), 64).unwrap();
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
    let m = module(&g, DEVICE_PTX);
    let k = m.kernel(kernels::PORT_PING_PONG).unwrap();
    let stream = g.stream().unwrap();
    comm.bootstrap().barrier().unwrap();
    let p = PortPingPongParams {
        status: comm.status().device_ptr(),
        channel: ch,
        bytes: BYTES as u64,
        iterations: u32::MAX, // far more than fit before the victim dies
        role: rank as u32,
        flush: 1,
        reserved: 0,
        trace: mscclpp::shared::TraceDeviceHandle::OFF,
    };
    if rank == victim {
        die_in(DIE_AFTER);
    }
    let start = Instant::now();
    // SAFETY: the channel's memories are live and BYTES long until the stream is done.
    unsafe { stream.launch(&k, LaunchConfig::new(1, 1), p) }.unwrap();
    if rank == victim {
        std::thread::sleep(Duration::from_secs(60));
        unreachable!("the killer thread did not fire");
    }
    expect_released(&comm, &stream, start, victim);
    let t_stop = Instant::now();
    let stopped = svc.stop();
    let stop_took = t_stop.elapsed();
    println!(
        "FAULT proxy stopped in {} ms: {stopped:?}",
        stop_took.as_millis()
    );
    assert!(
        stop_took < RELEASE_WITHIN,
        "stopping the proxy took {stop_took:?}"
    );
    // The proxy's own sticky error, if it had one, is about the dead rank.
    if let Err(e) = &stopped {
        assert!(refused_error(e, victim), "stopping the proxy gave {e:?}");
    }
}

/// (c) A few good all-reduces of `algo`; then both ranks queue the next one, but the
/// victim's stream is held by a gate kernel that never finishes, so its part never runs and
/// the survivor's waits inside its own part (a kernel, or the copy engines' barriers) for it;
/// the victim dies while the survivor is in there (checked: its work cannot have finished).
fn all_reduce_inside(comm: Communicator, victim: usize, algo: Algorithm, count: usize) {
    let comm = Arc::new(comm);
    let c = Collectives::new(comm.clone()).expect("collectives");
    let g = comm.gpu();
    let stream = g.stream().unwrap();
    let bytes = count * 4;
    let buf = g.alloc(bytes).unwrap();
    let n = comm.size() as u32;
    // The test's in-place all-reduce, queued (not waited for).
    let queue = || {
        // SAFETY: `buf` holds `count` u32 and outlives every wait on the stream below.
        unsafe {
            c.all_reduce(
                buf.ptr(),
                buf.ptr(),
                count,
                DataType::U32,
                ReduceOp::Sum,
                &stream,
                Some(algo),
            )
        }
    };
    for _ in 0..2 {
        buf.copy_from_host(0, bytemuck::cast_slice(&vec![1u32; count]))
            .unwrap();
        queue().unwrap();
        assert!(
            stream.synchronize_timeout(RELEASE_WITHIN).unwrap(),
            "a good all-reduce hung"
        );
        let mut got = vec![0u8; bytes];
        buf.copy_to_host(0, &mut got).unwrap();
        let got: &[u32] = bytemuck::cast_slice(&got);
        assert!(got.iter().all(|&v| v == n), "a good all-reduce was wrong");
    }
    comm.bootstrap().barrier().unwrap();
    if comm.rank() == victim {
        let _gate = hold_stream(&stream);
        // Its host part (the registered paths' per-call exchange) runs with the survivors'.
        queue().expect("the victim's all-reduce was refused");
        std::thread::sleep(DIE_AFTER);
        die_now();
    }
    let start = Instant::now();
    queue().expect("the survivor's all-reduce was refused while every rank was alive");
    assert!(
        !stream.query().unwrap(),
        "the survivor's all-reduce finished without the victim's part"
    );
    expect_released(&comm, &stream, start, victim);
    assert!(
        !memfds().is_empty() || harness::backend() != BackendKind::Cpu,
        "no device memory seen"
    );
    // Later calls fail at once (naming the victim) or are released at once; none hangs.
    let again = Instant::now();
    match queue() {
        Err(e) => {
            assert!(refused_error(&e, victim), "a later all-reduce gave {e:?}");
            println!(
                "FAULT a later all-reduce was refused in {} ms: {e}",
                again.elapsed().as_millis()
            );
        }
        Ok(()) => {
            match stream.synchronize_timeout(RELEASE_WITHIN) {
                Ok(true) => {}
                Ok(false) => panic!("a later all-reduce hung"),
                Err(e) => assert!(released_error(&e, victim), "a later all-reduce gave {e:?}"),
            }
            println!(
                "FAULT a later all-reduce was released in {} ms",
                again.elapsed().as_millis()
            );
        }
    }
}

/// Holds `stream` with a kernel that never finishes by itself (a FIFO push into a full FIFO
/// that nobody drains, with no spin limit): what is queued behind it does not run. For a
/// victim, which dies with it; the returned owners keep the FIFO and its status alive.
fn hold_stream(
    stream: &Stream,
) -> (
    mscclpp::host::fifo::Fifo,
    mscclpp::host::status::StatusBlock,
) {
    use mscclpp::host::fifo::Fifo;
    use mscclpp::host::status::StatusBlock;
    let g = stream.gpu();
    let status = StatusBlock::new(g, 0).unwrap();
    let fifo = Fifo::new(g, 2).unwrap();
    let m = module(g, DEVICE_PTX);
    let k = m.kernel(kernels::FIFO_PUSH).unwrap();
    let p = mscclpp::shared::FifoPushParams {
        status: status.device_ptr(),
        fifo: fifo.device_handle(status.device_ptr()),
        per_thread: 3,
        reserved: 0,
    };
    // SAFETY: the FIFO and the status live until the process dies (returned to the caller).
    unsafe { stream.launch(&k, LaunchConfig::new(1, 1), p) }.unwrap();
    (fifo, status)
}

macro_rules! fault_case {
    ($(#[$m:meta])* $name:ident, $n:expr, $victim:expr, $body:expr) => {
        $(#[$m])*
        #[test]
        fn $name() {
            match harness::child_communicator() {
                Some(comm) => {
                    ($body)(comm, $victim);
                    expect_memory_released();
                }
                None => run_fault(stringify!($name), $n, $victim),
            }
        }
    };
}

fault_case!(
    /// (a) The victim dies after bootstrap, before set-up exchanges.
    killed_before_collectives_setup, 2, 1, setup_before
);
fault_case!(
    /// (a) The bootstrap root (rank 0) dies after bootstrap, before set-up exchanges.
    root_killed_before_collectives_setup, 2, 0, setup_before
);
macro_rules! setup_case {
    ($(#[$m:meta])* $name:ident, $at:expr, $linger:expr) => {
        $(#[$m])*
        #[test]
        fn $name() {
            match harness::child_bootstrap() {
                Some(bs) => {
                    setup_during(bs, 2, $at, $linger);
                    expect_memory_released();
                }
                None => run_fault(stringify!($name), 3, 2),
            }
        }
    };
}

setup_case!(
    /// (a) The victim (rank 2 of 3) dies at its 2nd bootstrap operation of set-up.
    killed_during_collectives_setup_op2, 2, SURVIVOR_LINGER
);
setup_case!(
    /// (a) The victim (rank 2 of 3) dies at its 5th bootstrap operation of set-up.
    killed_during_collectives_setup_op5, 5, SURVIVOR_LINGER
);
setup_case!(
    /// (a) The victim (rank 2 of 3) dies at its 9th bootstrap operation of set-up.
    killed_during_collectives_setup_op9, 9, SURVIVOR_LINGER
);
/// (a) Rank 2 dies right after bootstrap; rank 1 is alive but slow (it has not reached
/// `Collectives::new` yet, 12 s); rank 0 calls `Collectives::new`, whose first exchange is
/// with rank 1, and must still be released at once.
fn setup_with_a_slow_peer(comm: Communicator, victim: usize) {
    match comm.rank() {
        r if r == victim => die_now(),
        1 => {
            // Not blocked: just slow. Its own view of the death is prompt.
            expect_remote(&comm, victim, Instant::now() + RELEASE_WITHIN);
            mark_released();
            std::thread::sleep(Duration::from_secs(12));
        }
        _ => setup_before(comm, victim),
    }
}

fault_case!(
    /// (a) Rank 2 dies while rank 0 waits in `Collectives::new` for rank 1 (alive, slow): the
    /// health monitor aborts the communicator and the set-up receive, which waits in slices
    /// checking it (`Communicator::recv_checked`), returns at once.
    killed_before_setup_survivor_blocked_on_slow_peer,
    3,
    2,
    setup_with_a_slow_peer
);
/// Which bootstrap collective [`collective_with_a_slow_peer`] runs.
#[derive(Clone, Copy, Debug)]
enum BootstrapOp {
    Barrier,
    AllGather,
}

/// How long the slow rank of [`collective_with_a_slow_peer`] stays away (it never joins).
const SLOW_PEER: Duration = Duration::from_secs(6);
/// How soon after the death the survivor blocked on the slow rank must have its error: well
/// below [`SLOW_PEER`] and the bootstrap's 30 s operation timeout.
const WATCHED_WITHIN: Duration = Duration::from_secs(2);

/// (a) After a barrier of all three ranks, rank 0 enters a bootstrap collective (through
/// `Communicator::bootstrap()`, as `Collectives::new` ends), whose first wait is for rank 2
/// (alive, slow: it never joins); rank 1 (the victim) dies while rank 0 waits. Rank 0 must get
/// `Error::Remote` naming rank 1 within [`WATCHED_WITHIN`], not when rank 2 arrives or leaves
/// ([`SLOW_PEER`]) or at the 30 s operation timeout.
fn collective_with_a_slow_peer(comm: Communicator, victim: usize, op: BootstrapOp) {
    comm.barrier()
        .expect("the first barrier, with every rank alive");
    match comm.rank() {
        r if r == victim => {
            std::thread::sleep(DIE_AFTER);
            die_now()
        }
        2 => {
            expect_remote(&comm, victim, Instant::now() + RELEASE_WITHIN);
            mark_released();
            std::thread::sleep(SLOW_PEER);
        }
        _ => {
            let start = Instant::now();
            let got = match op {
                BootstrapOp::Barrier => comm.bootstrap().barrier(),
                BootstrapOp::AllGather => comm.bootstrap().all_gather(&[7; 8]).map(drop),
            };
            let waited = start.elapsed();
            mark_released();
            match got {
                Err(Error::Remote { rank, reason }) if rank == victim => {
                    println!("FAULT {op:?} failed after {waited:?}: rank {rank} {reason}")
                }
                other => panic!("{op:?} gave {other:?}, not Error::Remote naming rank {victim}"),
            }
            assert!(
                waited < DIE_AFTER + WATCHED_WITHIN,
                "{op:?} returned only after {waited:?} (the victim died after {DIE_AFTER:?})"
            );
            // Stay until rank 2 has seen the victim's death: leaving at once closes this
            // rank's bootstrap link too, and rank 2 could see that first (a CI run did).
            std::thread::sleep(SURVIVOR_LINGER);
        }
    }
}

fault_case!(
    /// (a) Rank 1 dies while rank 0 waits in a bootstrap barrier for rank 2 (alive, slow).
    killed_during_bootstrap_barrier_survivor_blocked_on_slow_peer,
    3,
    1,
    |c, v| collective_with_a_slow_peer(c, v, BootstrapOp::Barrier)
);
fault_case!(
    /// (a) Rank 1 dies while rank 0 waits in a bootstrap all-gather for rank 2 (alive, slow).
    killed_during_bootstrap_all_gather_survivor_blocked_on_slow_peer,
    3,
    1,
    |c, v| collective_with_a_slow_peer(c, v, BootstrapOp::AllGather)
);

/// `abort()` from another thread ends a bootstrap barrier that waits for a rank that never
/// comes (ranks as threads): `Error::Aborted` within [`WATCHED_WITHIN`].
#[test]
fn abort_ends_a_bootstrap_barrier() {
    if !harness::enough_gpus("abort_ends_a_bootstrap_barrier", 2) {
        return;
    }
    harness::ranks_as_threads(2, |comm| {
        if comm.rank() == 1 {
            // Alive but never joins; stays until rank 0 is done.
            comm.bootstrap().recv(0, 1).expect("rank 0's all-clear");
            return;
        }
        let start = Instant::now();
        let got = std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(DIE_AFTER);
                comm.abort();
            });
            comm.barrier()
        });
        let waited = start.elapsed();
        println!("barrier after abort(): {got:?} after {waited:?}");
        assert!(
            matches!(got, Err(Error::Aborted { .. })),
            "the barrier gave {got:?}"
        );
        assert!(
            waited < DIE_AFTER + WATCHED_WITHIN,
            "released only after {waited:?}"
        );
        // Sends still pass through an aborted communicator's bootstrap.
        comm.bootstrap().send(1, 1, b"").unwrap();
    });
}

fault_case!(
    /// (b) The victim dies in the middle of a PortChannel ping-pong with flushes.
    killed_during_port_channel_transfer, 2, 1, port_transfer
);
fault_case!(
    /// (c) The victim dies while the survivor is inside an LL one-shot all-reduce.
    killed_inside_all_reduce_ll, 2, 1,
    |c, v| all_reduce_inside(c, v, Algorithm::LlOneShot, 1024)
);
fault_case!(
    /// (c) The victim dies while the survivor is inside an LL128 all-reduce (its warps wait
    /// for lines together and must leave together).
    killed_inside_all_reduce_ll128, 2, 1,
    |c, v| all_reduce_inside(c, v, Algorithm::Ll128, 2048)
);
fault_case!(
    /// (c) The victim dies while both survivors are inside a two-shot LL all-reduce (they
    /// wait in its reduce-scatter half for the victim's part, or in its all-gather half).
    killed_inside_all_reduce_ll_two_shot, 3, 1,
    |c, v| all_reduce_inside(c, v, Algorithm::LlTwoShot, 1024)
);
fault_case!(
    /// (c) The victim dies while the survivor is inside a staged all-reduce.
    killed_inside_all_reduce_staged, 2, 1,
    |c, v| all_reduce_inside(c, v, Algorithm::Staged, 64 * 1024)
);
fault_case!(
    /// (c) The victim dies while the survivor is inside a two-shot put all-reduce.
    killed_inside_all_reduce_two_shot_put, 2, 1,
    |c, v| all_reduce_inside(c, v, Algorithm::TwoShotPut, 64 * 1024)
);
fault_case!(
    /// (c) The victim dies while the survivor is inside the pipelined copy-engine all-reduce:
    /// past its per-call exchange (the victim made it too), its three streams wait at the copy
    /// engines' barriers for the victim's part, which the victim's gate kernel holds back.
    killed_inside_all_reduce_copy_engine, 2, 1,
    |c, v| all_reduce_inside(c, v, Algorithm::CopyEngine, 64 * 1024)
);
fault_case!(
    /// (c) As above with 3 ranks: both survivors are released and name the victim.
    killed_inside_all_reduce_3_ranks, 3, 1,
    |c, v| all_reduce_inside(c, v, Algorithm::Staged, 4099)
);
