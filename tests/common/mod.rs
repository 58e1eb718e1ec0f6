//! Helpers shared by the integration tests. The backend is chosen as users get it:
//! `MSCCLPP_BACKEND=cuda|cpu`, else CUDA when a GPU is present, else the CPU backend.

#![allow(dead_code)]

pub mod rng;
pub mod values;

use mscclpp::host::gpu::{BackendKind, Gpu, Module};

/// The backend under test.
pub fn backend() -> BackendKind {
    BackendKind::select().expect("backend selection")
}

/// Device `ordinal` of the backend under test (wrapping around when it has fewer devices).
pub fn gpu(ordinal: usize) -> Gpu {
    let kind = backend();
    let count = kind.device_count().expect("device count");
    assert!(count > 0, "the {kind:?} backend has no device");
    Gpu::open(kind, ordinal % count).expect("open device")
}

/// Whether the backend under test gives each of `ranks` ranks a device of its own (always on
/// the CPU backend, whose ranks may share its one device; on CUDA, one GPU per rank: kernels of
/// ranks sharing a GPU wait for each other behind the driver's device-wide synchronisation).
/// Says `NOT RUN` on stderr, naming `test`, when not.
pub fn enough_gpus(test: &str, ranks: usize) -> bool {
    let kind = backend();
    let devices = kind.device_count().expect("device count");
    let enough = kind == BackendKind::Cpu || devices >= ranks;
    if !enough {
        eprintln!(
            "NOT RUN: {test} needs {ranks} GPUs (one per rank), the {kind:?} backend has {devices}"
        );
    }
    enough
}

/// The built-in kernels loaded on `gpu`.
pub fn module(gpu: &Gpu) -> Module {
    gpu.load_ptx(mscclpp::DEVICE_PTX)
        .expect("load the embedded PTX")
}

/// `len` bytes that depend on `seed` and on each byte's index through a hash
/// ([`values::hash`]): no period (a copy that moves the wrong 16-byte vector, or the right
/// one to the wrong place, shows at any grid stride) and different for every seed.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (values::hash(&[0x7061_7474, seed as u64, i as u64]) >> 24) as u8)
        .collect()
}

/// Lower-case hex of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Bytes of lower-case hex.
pub fn from_hex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use mscclpp::host::bootstrap::{BootstrapConfig, TcpBootstrap, UniqueId};
use mscclpp::host::communicator::Communicator;

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// Runs `n` ranks as threads of this process, rank `r` on device `r` (wrapping); returns their
/// results in rank order. This is `mscclpp::world::run_local_ranks`: if a rank panics (a failed
/// assertion), every rank's communicator is aborted first, so kernels of the others waiting for
/// it return instead of hanging the test, and the test fails naming the rank.
pub fn ranks_as_threads<T: Send>(n: usize, body: impl Fn(Communicator) -> T + Sync) -> Vec<T> {
    mscclpp::world::run_local_ranks(backend(), n, |comm| Ok(body(comm)))
        .into_iter()
        .enumerate()
        .map(|(r, res)| res.unwrap_or_else(|e| panic!("rank {r}: {e}")))
        .collect()
}

const CHILD_RANK: &str = "MSCCLPP_TEST_CHILD_RANK";
const CHILD_SIZE: &str = "MSCCLPP_TEST_CHILD_SIZE";
const CHILD_ID: &str = "MSCCLPP_TEST_CHILD_ID";

/// In a child process of a test: dies (SIGKILL) when the thread of the test that started it
/// ends, so that a parent killed by a test runner's timeout (a mutation run's, say) leaves no
/// rank running on (one whose kernel loops, in a mutant, would run for ever). Exits at once if
/// the parent is already gone.
pub fn die_with_parent() {
    // SAFETY: `prctl(PR_SET_PDEATHSIG, SIGKILL)` takes no pointers.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    if std::os::unix::process::parent_id() == 1 {
        std::process::exit(1);
    }
}

/// In a child started by [`ranks_as_processes`]: its communicator (and `None` in the parent).
pub fn child_communicator() -> Option<Communicator> {
    let rank: usize = std::env::var(CHILD_RANK).ok()?.parse().ok()?;
    let size: usize = std::env::var(CHILD_SIZE).ok()?.parse().ok()?;
    die_with_parent();
    let bs = if rank == 0 {
        let (id, listener) = UniqueId::bind(loopback()).unwrap();
        println!("\nUNIQUE_ID {}", id.to_hex());
        let cfg = BootstrapConfig::new(0, size, id).with_timeout(Duration::from_secs(30));
        TcpBootstrap::init_with_root_listener(cfg, listener)
    } else {
        let id = UniqueId::from_hex(&std::env::var(CHILD_ID).ok()?).expect("unique id");
        TcpBootstrap::init(
            BootstrapConfig::new(rank, size, id).with_timeout(Duration::from_secs(30)),
        )
    }
    .expect("bootstrap");
    Some(Communicator::new(Arc::new(bs), gpu(rank)).expect("communicator"))
}

/// How long a world of child processes may run before [`ranks_as_processes_status`] kills it
/// (far more than any test here needs; a hang fails the test instead of stalling it).
pub const PROCESS_BOUND: Duration = Duration::from_secs(600);

/// Runs `n` ranks as child processes re-running the test `test_name` of this binary (which
/// calls [`child_communicator`] first); returns each rank's exit status and output. Bounded by
/// [`PROCESS_BOUND`]: a world still running then is killed and the test fails.
pub fn ranks_as_processes_status(
    n: usize,
    test_name: &str,
) -> Vec<(std::process::ExitStatus, String)> {
    ranks_as_processes_bounded(n, test_name, PROCESS_BOUND)
        .into_iter()
        .enumerate()
        .map(|(r, e)| {
            assert!(
                !e.overran,
                "rank {r} of {test_name} still ran after {PROCESS_BOUND:?} (killed):\n{}",
                e.output
            );
            (e.status, e.output)
        })
        .collect()
}

/// As [`ranks_as_processes_status`]; panics unless every child exits successfully.
pub fn ranks_as_processes(n: usize, test_name: &str) {
    let failures: Vec<String> = ranks_as_processes_status(n, test_name)
        .into_iter()
        .enumerate()
        .filter(|(_, (st, _))| !st.success())
        .map(|(r, (st, text))| format!("rank {r}: {st}\n{text}"))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// One child rank's end, as [`ranks_as_processes_bounded`] saw it.
pub struct ChildEnd {
    /// Its exit status (a child killed for overrunning the bound reads as killed by SIGKILL).
    pub status: std::process::ExitStatus,
    /// Its stdout and stderr.
    pub output: String,
    /// Its process id (reaped: no longer names a process of ours).
    pub pid: u32,
    /// Whether the parent had to kill it because it overran `bound`.
    pub overran: bool,
}

/// As [`ranks_as_processes_status`], but no wait is unbounded: a child still running `bound`
/// after the start is killed (by its pid) and reaped, and reported with `overran`. Every child
/// is waited for before this returns. Children run the test even when it is `#[ignore]`d (the
/// parent only runs when asked to).
pub fn ranks_as_processes_bounded(n: usize, test_name: &str, bound: Duration) -> Vec<ChildEnd> {
    use std::io::Read;
    let start = std::time::Instant::now();
    let exe = std::env::current_exe().unwrap();
    let spawn = |r: usize, id: &str| {
        Command::new(&exe)
            .args([
                "--exact",
                test_name,
                "--nocapture",
                "--test-threads=1",
                "--include-ignored",
            ])
            .env(CHILD_RANK, r.to_string())
            .env(CHILD_SIZE, n.to_string())
            .env(CHILD_ID, id)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // Each pipe is drained by a thread of its own, so a child never blocks on a full pipe and
    // the parent never blocks on a read.
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let mut bytes = Vec::new();
            r.read_to_end(&mut bytes).ok();
            s.push_str(&String::from_utf8_lossy(&bytes));
            s
        })
    };
    let mut children = vec![spawn(0, "")];
    let (id_tx, id_rx) = std::sync::mpsc::channel();
    let root_out = children[0].stdout.take().unwrap();
    let root_drain = std::thread::spawn(move || {
        let mut out = BufReader::new(root_out);
        let mut text = String::new();
        let mut line = String::new();
        let mut sent = false;
        while out.read_line(&mut line).unwrap_or(0) > 0 {
            if !sent && let Some(at) = line.find("UNIQUE_ID ") {
                let _ = id_tx.send(line[at + 10..].trim().to_string());
                sent = true;
            }
            text.push_str(&line);
            line.clear();
        }
        text
    });
    let mut drains = vec![(
        root_drain,
        drain(Box::new(children[0].stderr.take().unwrap())),
    )];
    if let Ok(id) = id_rx.recv_timeout(bound) {
        for r in 1..n {
            let mut c = spawn(r, &id);
            let o = drain(Box::new(c.stdout.take().unwrap()));
            let e = drain(Box::new(c.stderr.take().unwrap()));
            children.push(c);
            drains.push((o, e));
        }
    }
    let mut ends = Vec::new();
    for (mut c, (o, e)) in children.into_iter().zip(drains) {
        let mut overran = false;
        let status = loop {
            if let Some(st) = c.try_wait().unwrap() {
                break st;
            }
            if start.elapsed() > bound {
                overran = true;
                let _ = c.kill();
                break c.wait().unwrap();
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let output = format!("{}{}", o.join().unwrap(), e.join().unwrap());
        ends.push(ChildEnd {
            status,
            output,
            pid: c.id(),
            overran,
        });
    }
    ends
}

/// In a child started by [`ranks_as_processes_bounded`] (or [`ranks_as_processes_status`]):
/// its bootstrap, before any communicator is made (and `None` in the parent). For tests that
/// wrap the bootstrap.
pub fn child_bootstrap() -> Option<TcpBootstrap> {
    let rank: usize = std::env::var(CHILD_RANK).ok()?.parse().ok()?;
    let size: usize = std::env::var(CHILD_SIZE).ok()?.parse().ok()?;
    die_with_parent();
    let bs = if rank == 0 {
        let (id, listener) = UniqueId::bind(loopback()).unwrap();
        println!("\nUNIQUE_ID {}", id.to_hex());
        let cfg = BootstrapConfig::new(0, size, id).with_timeout(Duration::from_secs(30));
        TcpBootstrap::init_with_root_listener(cfg, listener)
    } else {
        let id = UniqueId::from_hex(&std::env::var(CHILD_ID).ok()?).expect("unique id");
        TcpBootstrap::init(
            BootstrapConfig::new(rank, size, id).with_timeout(Duration::from_secs(30)),
        )
    }
    .expect("bootstrap");
    Some(bs)
}
