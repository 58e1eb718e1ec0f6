//! Resource hygiene: many create/destroy cycles of a 4-rank world (threads of this process:
//! bootstrap, communicator, a connection, a registered buffer sent to the peer and mapped
//! there) leave the process's open file descriptors, threads and resident memory where they
//! were. Prints the figures (`cargo test --test hygiene -- --nocapture`).

use std::time::{Duration, Instant};

use mscclpp::host::communicator::Communicator;
use mscclpp::host::connection::EndpointConfig;
use mscclpp::host::transport::Transport;
use mscclpp_test_support as harness;
use mscclpp_test_support::ranks_as_threads;

const RANKS: usize = 4;
/// Cycles asked for; fewer run if they do not fit [`TIME_BUDGET`] (the count is printed).
const CYCLES: usize = 200;
/// Wall time the cycles may take (2 slow cores must still finish in reasonable time).
const TIME_BUDGET: Duration = Duration::from_secs(20);
/// Fewest cycles that make the check meaningful.
const MIN_CYCLES: usize = 20;

const MAX_FD_GROWTH: i64 = 8;
const MAX_THREAD_GROWTH: i64 = 4;
const MAX_RSS_GROWTH_KIB: i64 = 64 * 1024;

#[derive(Clone, Copy, Debug)]
struct Usage {
    fds: i64,
    threads: i64,
    rss_kib: i64,
}

fn usage() -> Usage {
    let fds = std::fs::read_dir("/proc/self/fd").unwrap().count() as i64;
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |name: &str| -> i64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/self/status"))
    };
    Usage {
        fds,
        threads: field("Threads:"),
        rss_kib: field("VmRSS:"),
    }
}

/// One world: every rank connects to its partner (0-1, 2-3), registers a buffer, sends it and
/// maps the partner's; everything is dropped at the end.
fn cycle() {
    ranks_as_threads(RANKS, |comm: Communicator| {
        let peer = comm.rank() ^ 1;
        let g = comm.gpu().clone();
        let t = Transport::local_for(g.kind());
        let conn = comm
            .connect(EndpointConfig::new(t), peer, 0)
            .expect("connect");
        let buf = g.alloc(64 * 1024).expect("alloc");
        let mem = comm.register_buffer(&buf, t).expect("register");
        comm.send_memory(&mem, peer, 0).expect("send memory");
        let remote = comm.recv_memory(peer, 0).expect("recv memory");
        comm.bootstrap().barrier().expect("barrier");
        drop((remote, mem, conn, buf));
    });
}

#[test]
fn create_destroy_cycles_do_not_leak() {
    // One handle per device for the whole test, as an application holds its devices: on CUDA
    // the driver's primary context then lives across cycles instead of being created and torn
    // down by each (the driver keeps memory from every context it created), so what is
    // measured is this library's own growth.
    let _devices: Vec<_> = (0..harness::device_count()).map(harness::gpu).collect();
    cycle(); // warm-up: lazily created process-wide state
    let before = usage();
    let start = Instant::now();
    let mut cycles = 0;
    while cycles < CYCLES && start.elapsed() < TIME_BUDGET {
        cycle();
        cycles += 1;
    }
    let took = start.elapsed();
    // Threads that end asynchronously (a joined thread's exit is visible at once, a detached
    // one's a moment later): give them a short, bounded while.
    let settle = Instant::now() + Duration::from_secs(2);
    let mut after = usage();
    while after.threads > before.threads && Instant::now() < settle {
        std::thread::sleep(Duration::from_millis(20));
        after = usage();
    }
    println!(
        "{cycles} cycles of a {RANKS}-rank world in {took:?} ({:?} each): fds {} -> {}, \
         threads {} -> {}, VmRSS {} -> {} KiB",
        took / cycles.max(1) as u32,
        before.fds,
        after.fds,
        before.threads,
        after.threads,
        before.rss_kib,
        after.rss_kib
    );
    assert!(
        cycles >= MIN_CYCLES,
        "only {cycles} cycles fit in {TIME_BUDGET:?}"
    );
    assert!(
        after.fds - before.fds <= MAX_FD_GROWTH,
        "open file descriptors grew from {} to {} over {cycles} cycles",
        before.fds,
        after.fds
    );
    assert!(
        after.threads - before.threads <= MAX_THREAD_GROWTH,
        "threads grew from {} to {} over {cycles} cycles",
        before.threads,
        after.threads
    );
    assert!(
        after.rss_kib - before.rss_kib <= MAX_RSS_GROWTH_KIB,
        "resident memory grew from {} to {} KiB over {cycles} cycles",
        before.rss_kib,
        after.rss_kib
    );
}
