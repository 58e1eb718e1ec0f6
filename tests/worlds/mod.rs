//! Worlds of ranks for the tests of recovery and one-sided calls, over the workspace's test
//! harness (`mscclpp-test-support`): ranks as threads that hold their own bootstrap (to close
//! it as a crash would), and ranks as processes whose world changes while it runs: a child can
//! ask for a newcomer (`GROW_ID <hex> <rank> <size>`) or stop itself (`RECOVERY_STOPPED`), with
//! emulated nodes (`ENV_NODES`) and a bootstrap peer timeout (`ENV_PEER_TIMEOUT`).

#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use mscclpp::host::bootstrap::{Bootstrap, BootstrapConfig, TcpBootstrap, UniqueId};
use mscclpp::host::communicator::Communicator;
use mscclpp_test_support::{self as harness, Child, ChildEnd, Processes, TestProcess};

pub use mscclpp_test_support::{enough_gpus, gpu};

// ------------------------------------------------------------------------------------------
// Ranks as threads
// ------------------------------------------------------------------------------------------

/// Runs `body(communicator, its bootstrap)` on `n` ranks as threads over loopback bootstraps
/// (the body may close its bootstrap as a crash would); every rank's value, or a panic naming
/// the ranks that failed.
pub fn thread_world<T: Send>(
    n: usize,
    body: impl Fn(Communicator, Arc<TcpBootstrap>) -> mscclpp::host::Result<T> + Sync,
) -> Vec<T> {
    harness::ranks_as_threads_over(
        n,
        |bs| {
            let bs = Arc::new(bs);
            (Arc::clone(&bs) as Arc<dyn Bootstrap>, bs)
        },
        body,
    )
    .into_iter()
    .enumerate()
    .map(|(r, v)| v.unwrap_or_else(|e| panic!("rank {r}: {}", mscclpp::ErrorChain(&e))))
    .collect()
}

// ------------------------------------------------------------------------------------------
// Ranks as processes
// ------------------------------------------------------------------------------------------

/// A newcomer's place: `<grow id hex> <rank> <size>`, as its `GROW_ID` line said.
const ENV_JOIN: &str = "MSCCLPP_WORLD_TEST_JOIN";
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
    /// Whether the parent killed it because it had stopped itself (`RECOVERY_STOPPED`).
    pub killed: bool,
    /// Whether it was killed for overrunning [`WORLD_BOUND`].
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

/// The variables every child gets: loopback, and no host identity or network transport of the
/// caller's (the tests choose them).
fn child_env<T>(p: T, env: &[(&str, String)], set: impl Fn(T, &str, &str) -> T) -> T {
    env.iter()
        .fold(set(p, "MSCCLPP_SOCKET_IFNAME", "lo"), |p, (k, v)| {
            set(p, k, v)
        })
}

/// Runs the test `test` as a world of `n` processes on loopback, with `env` in every child
/// (`harness::Processes`: rank 0 announces the world's id, the others join). A child that
/// prints `GROW_ID <hex> <rank> <size>` has a newcomer started as rank `rank` of `size` with
/// that id; a child that prints `RECOVERY_STOPPED` (and stops) is killed once every other
/// child has ended. Every child is waited for; a world still running after [`WORLD_BOUND`] is
/// killed.
pub fn run_world(test: &str, n: usize, env: &[(&str, String)]) -> Vec<End> {
    let deadline = Instant::now() + WORLD_BOUND;
    let world = Processes::new(test, n)
        .bound(WORLD_BOUND)
        .env_remove("MSCCLPP_HOSTID")
        .env_remove("MSCCLPP_NET_TRANSPORT");
    let world = child_env(world, env, |w, k, v| w.env(k, v));
    // (child, stopped itself, killed by us)
    let mut children: Vec<(Child, bool, bool)> = world
        .spawn()
        .into_iter()
        .map(|c| (c, false, false))
        .collect();
    loop {
        let mut newcomers = Vec::new();
        for (c, stopped, _) in children.iter_mut() {
            while let Some(line) = c.next_line(Instant::now()) {
                if let Some(at) = line.find("GROW_ID ") {
                    let join = line[at + 8..].trim();
                    let rank = join.split_whitespace().nth(1).unwrap_or("?");
                    let p = TestProcess::new(test)
                        .named(format!("newcomer rank {rank} of {test}"))
                        .env_remove("MSCCLPP_HOSTID")
                        .env_remove("MSCCLPP_NET_TRANSPORT")
                        .env(ENV_JOIN, join);
                    newcomers.push((
                        child_env(p, env, |p, k, v| p.env(k, v)).spawn(),
                        false,
                        false,
                    ));
                } else if line.contains("RECOVERY_STOPPED") {
                    *stopped = true;
                }
            }
        }
        children.extend(newcomers);
        let running: Vec<usize> = (0..children.len())
            .filter(|&i| !children[i].0.has_ended())
            .collect();
        if running.is_empty() || Instant::now() > deadline {
            break;
        }
        if running.iter().all(|&i| children[i].1) {
            for i in running {
                children[i].0.kill();
                children[i].2 = true;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    children
        .into_iter()
        .map(|(c, _, killed)| {
            let end: ChildEnd = c.wait_until(deadline);
            End {
                status: end.status,
                output: end.output(),
                killed,
                overran: end.overran,
            }
        })
        .collect()
}

/// What a child process is.
pub struct ChildRank {
    pub rank: usize,
    pub size: usize,
    /// Whether it joins a grown world (started for a `GROW_ID` line).
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

/// In a child: its rank and communicator; `None` in the parent.
pub fn child() -> Option<ChildRank> {
    let (bs, newcomer) = match std::env::var(ENV_JOIN) {
        Ok(join) => {
            harness::die_with_parent();
            let f: Vec<&str> = join.split_whitespace().collect();
            let (Some(hex), Some(rank), Some(size)) = (f.first(), f.get(1), f.get(2)) else {
                panic!("{ENV_JOIN}={join:?}: not <hex> <rank> <size>");
            };
            let id = UniqueId::from_hex(hex).expect("grow id");
            let (rank, size) = (rank.parse().expect("rank"), size.parse().expect("size"));
            let bs = TcpBootstrap::init(configure(BootstrapConfig::new(rank, size, id)));
            (bs.expect("a newcomer's bootstrap"), true)
        }
        Err(_) => (harness::child_bootstrap_with(configure)?, false),
    };
    let (rank, size) = (bs.rank(), bs.size());
    let comm = Communicator::new(Arc::new(bs), gpu(rank)).expect("communicator");
    Some(ChildRank {
        rank,
        size,
        newcomer,
        comm,
    })
}
