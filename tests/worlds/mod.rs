//! Worlds of ranks for the tests of recovery and one-sided calls: ranks as threads over
//! loopback bootstraps, and ranks as processes of the test binary (rank 0 prints its unique
//! id; a child can ask for a newcomer, `GROW_ID`, or stop itself, `RECOVERY_STOPPED`), with
//! emulated nodes (`ENV_NODES`) and a bootstrap peer timeout (`ENV_PEER_TIMEOUT`).

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use mscclpp::host::bootstrap::{BootstrapConfig, TcpBootstrap, UniqueId};
use mscclpp::host::communicator::Communicator;
use mscclpp::host::gpu::{BackendKind, Gpu};

/// The backend under test (`MSCCLPP_BACKEND`, else CUDA when a GPU is present).
pub fn backend() -> BackendKind {
    BackendKind::select().expect("backend")
}

/// Whether `n` ranks can run here (CUDA: a GPU each); prints NOT RUN if not.
pub fn enough_devices(n: usize, what: &str) -> bool {
    let kind = backend();
    let have = kind.device_count().unwrap_or(0);
    if kind == BackendKind::Cuda && have < n {
        eprintln!("NOT RUN: {what}: {n} ranks need {n} GPUs ({have} here)");
        return false;
    }
    true
}

// ------------------------------------------------------------------------------------------
// Ranks as threads
// ------------------------------------------------------------------------------------------

/// Runs `body(rank, bootstrap)` on `n` ranks as threads over loopback bootstraps (no
/// communicator made: the body makes its own, and may close its bootstrap as a crash would).
pub fn thread_world<T: Send>(
    n: usize,
    body: impl Fn(usize, Arc<TcpBootstrap>) -> T + Sync,
) -> Vec<T> {
    let (id, listener) = UniqueId::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let mut listener = Some(listener);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let root = if r == 0 { listener.take() } else { None };
                let body = &body;
                s.spawn(move || {
                    let cfg = BootstrapConfig::new(r, n, id).with_timeout(Duration::from_secs(60));
                    let bs = match root {
                        Some(l) => TcpBootstrap::init_with_root_listener(cfg, l),
                        None => TcpBootstrap::init(cfg),
                    };
                    body(r, Arc::new(bs.expect("bootstrap")))
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(r, h)| h.join().unwrap_or_else(|_| panic!("rank {r} panicked")))
            .collect()
    })
}

pub fn gpu(rank: usize) -> Gpu {
    let kind = backend();
    Gpu::open(kind, rank % kind.device_count().unwrap_or(1).max(1)).expect("gpu")
}

// ------------------------------------------------------------------------------------------
// Ranks as processes
// ------------------------------------------------------------------------------------------

pub const ENV_RANK: &str = "MSCCLPP_WORLD_TEST_RANK";
pub const ENV_SIZE: &str = "MSCCLPP_WORLD_TEST_SIZE";
pub const ENV_ID: &str = "MSCCLPP_WORLD_TEST_ID";
/// A newcomer's grow id (hex).
pub const ENV_JOIN: &str = "MSCCLPP_WORLD_TEST_JOIN";
/// Each rank's emulated node (`ENV_NODES` = the nodes of ranks 0, 1, … comma-separated).
pub const ENV_NODES: &str = "MSCCLPP_WORLD_TEST_NODES";
/// The bootstrap's peer timeout in milliseconds (the stopped-rank case).
pub const ENV_PEER_TIMEOUT: &str = "MSCCLPP_WORLD_TEST_PEER_TIMEOUT_MS";

/// How long a world of processes may run before the parent kills it (a hang fails the test).
pub const WORLD_BOUND: Duration = Duration::from_secs(400);

/// One child's end.
pub struct End {
    pub status: std::process::ExitStatus,
    pub output: String,
    /// Whether the parent killed it: it had stopped itself (`RECOVERY_STOPPED`), or it overran
    /// [`WORLD_BOUND`].
    pub killed: bool,
    pub overran: bool,
}

pub fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// Prints a line the parent reads, at once.
pub fn say(line: &str) {
    use std::io::Write;
    println!("\n{line}");
    let _ = std::io::stdout().flush();
}

/// Runs the test `test` as a world of `n` processes on loopback, with `env` in every child.
/// Rank 0 prints its unique id, then the others start; a child that prints `GROW_ID <hex>
/// <rank> <size>` has a newcomer started as rank `rank` of `size` with that id; a child that
/// prints `RECOVERY_STOPPED` (and stops) is killed once every other child has ended. Every
/// child is waited for; a world still running after [`WORLD_BOUND`] is killed.
pub fn run_world(test: &str, n: usize, env: &[(&str, String)]) -> Vec<End> {
    let exe = std::env::current_exe().unwrap();
    let spawn = |rank: usize, size: usize, id: &str, join: Option<&str>| -> Child {
        let mut cmd = Command::new(&exe);
        cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env(ENV_RANK, rank.to_string())
            .env(ENV_SIZE, size.to_string())
            .env(ENV_ID, id)
            .env("MSCCLPP_SOCKET_IFNAME", "lo")
            .env_remove("MSCCLPP_HOSTID")
            .env_remove("MSCCLPP_NET_TRANSPORT")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(j) = join {
            cmd.env(ENV_JOIN, j);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.spawn().unwrap()
    };
    let (tx, rx) = mpsc::channel::<(usize, String)>();
    let mut children: Vec<Child> = Vec::new();
    let mut readers = Vec::new();
    let mut watch = |c: &mut Child, i: usize| {
        let (out, err) = (c.stdout.take().unwrap(), c.stderr.take().unwrap());
        let tx = tx.clone();
        readers.push(std::thread::spawn(move || {
            let mut text = String::new();
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send((i, line.clone()));
                text.push_str(&line);
                text.push('\n');
            }
            text
        }));
        readers.push(std::thread::spawn(move || {
            let mut text = String::new();
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                text.push_str(&line);
                text.push('\n');
            }
            text
        }));
    };
    children.push(spawn(0, n, "", None));
    watch(&mut children[0], 0);
    let start = Instant::now();
    let mut ended: Vec<Option<(std::process::ExitStatus, bool, bool)>> = vec![None];
    let mut stopped: Vec<bool> = vec![false];
    loop {
        while let Ok((i, line)) = rx.recv_timeout(Duration::from_millis(5)) {
            if i == 0 && children.len() == 1 && line.contains("UNIQUE_ID ") {
                let id = line[line.find("UNIQUE_ID ").unwrap() + 10..]
                    .trim()
                    .to_string();
                for r in 1..n {
                    let mut c = spawn(r, n, &id, None);
                    watch(&mut c, r);
                    children.push(c);
                    ended.push(None);
                    stopped.push(false);
                }
            } else if let Some(at) = line.find("GROW_ID ") {
                let f: Vec<&str> = line[at + 8..].split_whitespace().collect();
                let (rank, size) = (f[1].parse().unwrap(), f[2].parse().unwrap());
                let mut c = spawn(rank, size, "", Some(f[0]));
                let i = children.len();
                watch(&mut c, i);
                children.push(c);
                ended.push(None);
                stopped.push(false);
            } else if line.contains("RECOVERY_STOPPED") {
                stopped[i] = true;
            }
        }
        for (i, c) in children.iter_mut().enumerate() {
            if ended[i].is_none()
                && let Some(st) = c.try_wait().unwrap()
            {
                ended[i] = Some((st, false, false));
            }
        }
        let running: Vec<usize> = (0..children.len())
            .filter(|&i| ended[i].is_none())
            .collect();
        if running.is_empty() {
            break;
        }
        let overran = start.elapsed() > WORLD_BOUND;
        if overran || running.iter().all(|&i| stopped[i]) {
            for i in running {
                let _ = children[i].kill();
                ended[i] = Some((children[i].wait().unwrap(), true, overran));
            }
        }
    }
    drop(tx);
    let texts: Vec<String> = readers.into_iter().map(|h| h.join().unwrap()).collect();
    ended
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            let (status, killed, overran) = e.unwrap();
            End {
                status,
                output: format!("{}{}", texts[2 * i], texts[2 * i + 1]),
                killed,
                overran,
            }
        })
        .collect()
}

/// What a child process is.
pub struct ChildRank {
    pub rank: usize,
    pub size: usize,
    /// Whether it joins a grown world (its id came from a `GROW_ID` line).
    pub newcomer: bool,
    pub comm: Communicator,
}

/// The host identity of `rank`'s emulated node, if the world has nodes.
pub fn host_of(rank: usize) -> Option<String> {
    let nodes = std::env::var(ENV_NODES).ok()?;
    let node = nodes.split(',').nth(rank)?;
    Some(format!("mscclpp-recovery-node-{node}"))
}

/// The bootstrap configuration every rank of a test world uses (node, peer timeout).
pub fn configure(mut cfg: BootstrapConfig) -> BootstrapConfig {
    cfg = cfg.with_timeout(Duration::from_secs(60));
    if let Some(h) = host_of(cfg.rank) {
        cfg = cfg.with_host_id(h);
    }
    if let Some(ms) = std::env::var(ENV_PEER_TIMEOUT)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        cfg = cfg.with_peer_timeout(Some(Duration::from_millis(ms)));
    }
    cfg
}

/// In a child: its rank and communicator (rank 0 prints the unique id); `None` in the parent.
pub fn child() -> Option<ChildRank> {
    let rank: usize = std::env::var(ENV_RANK).ok()?.parse().ok()?;
    let size: usize = std::env::var(ENV_SIZE).ok()?.parse().ok()?;
    // SAFETY: `prctl(PR_SET_PDEATHSIG, SIGKILL)` takes no pointers.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    let join = std::env::var(ENV_JOIN).ok();
    let bs = if let Some(hex) = &join {
        let id = UniqueId::from_hex(hex).expect("grow id");
        TcpBootstrap::init(configure(BootstrapConfig::new(rank, size, id)))
    } else if rank == 0 {
        let (id, listener) = UniqueId::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        say(&format!("UNIQUE_ID {}", id.to_hex()));
        let cfg = configure(BootstrapConfig::new(0, size, id));
        TcpBootstrap::init_with_root_listener(cfg, listener)
    } else {
        let id = UniqueId::from_hex(&std::env::var(ENV_ID).ok()?).expect("unique id");
        TcpBootstrap::init(configure(BootstrapConfig::new(rank, size, id)))
    }
    .expect("bootstrap");
    let comm = Communicator::new(Arc::new(bs), gpu(rank)).expect("communicator");
    Some(ChildRank {
        rank,
        size,
        newcomer: join.is_some(),
        comm,
    })
}
