//! Keeping on when ranks die (issue 32): revoke, shrink and grow of `Collectives`, on the CPU
//! backend (and CUDA, one GPU per rank, where there are enough).
//!
//! - `revoke_then_shrink_without_a_rank_that_closed_as_threads`: 4 ranks as threads; rank 3
//!   closes its bootstrap without a goodbye while the others wait inside an all-reduce for it;
//!   they are released with `Error::Remote` naming it, revoke (later calls: `Error::Revoked`),
//!   shrink to 3 ranks and run checked collectives; a shrink whose sets differ is refused on
//!   every member with `Error::MembershipMismatch`.
//! - `killed_mid_collective_{4,8}_ranks`: ranks as processes run checked collectives; one is
//!   SIGKILLed inside one; every survivor gets `Error::Remote` naming it, revokes, shrinks
//!   without it and runs 1000 more checked collectives; then a new process joins through
//!   `grow` (the id handed out by rank 0) and the checked collectives go on at full size. The
//!   time from the kill to the first good collective of the shrunk world is printed
//!   (`RECOVERY …` lines; `cargo test --test recovery -- --nocapture`).
//! - `stopped_rank_is_excluded_after_the_peer_timeout`: the same with a rank that stops
//!   (SIGSTOP), alive but silent: after the bootstrap's peer timeout it is treated as dead.
//! - `killed_node_of_an_emulated_world`: 2 emulated nodes of 2 ranks (Ethernet between them);
//!   both ranks of node 1 are killed; the survivors shrink to node 0 and go on, then two
//!   newcomers on node 1 grow the world back to two nodes.
//!
//! Every collective's data is a hash of (the contributor's identity, the call, the element),
//! outputs are poisoned first and every element is compared with a host reference; each rank's
//! identity is the rank it started with (a newcomer's: its rank in the grown world), so the
//! reference does not depend on how a world numbers its ranks.

mod worlds;

use std::os::unix::process::ExitStatusExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mscclpp::collectives::Collectives;
use mscclpp::host::Error;
use mscclpp::host::bootstrap::Bootstrap;
use mscclpp::host::communicator::Communicator;
use mscclpp::host::gpu::Stream;
use mscclpp::shared::{DataType, ReduceOp};
use worlds::{
    ChildRank, ENV_NODES, ENV_PEER_TIMEOUT, End, child, configure, enough_gpus, now_ns, run_world,
    say, thread_world,
};

// ------------------------------------------------------------------------------------------
// Checked collectives
// ------------------------------------------------------------------------------------------

/// Element `i` of call `call` from the rank whose identity is `id`.
fn value(id: u32, call: u64, i: usize) -> u32 {
    let mut x = (u64::from(id) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ call.wrapping_mul(0xbf58_476d_1ce4_e5b9)
        ^ (i as u64).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    x = x.wrapping_mul(0xd6e8_feb8_6659_fd93);
    (x ^ (x >> 29)) as u32
}

/// A rank's collectives and what checking them needs: its identity and every rank's, in the
/// world's rank order.
struct World {
    c: Collectives,
    ids: Vec<u32>,
    me: u32,
    stream: Stream,
    /// Input and output of every call (allocated once: the largest call's).
    input: mscclpp::host::gpu::DeviceBuffer,
    output: mscclpp::host::gpu::DeviceBuffer,
}

/// Element counts of the calls, by the call's number.
const COUNTS: [usize; 6] = [1, 7, 64, 300, 1024, 4099];

impl World {
    /// `c` with this rank's identity `me` (every rank's learnt by one all-gather).
    fn new(c: Collectives, me: u32) -> mscclpp::host::Result<Self> {
        let all = c.communicator().all_gather(&me.to_le_bytes())?;
        let ids = all
            .iter()
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let g = c.communicator().gpu();
        let stream = g.stream()?;
        let most = COUNTS[COUNTS.len() - 1] * 4;
        let (input, output) = (g.alloc(most)?, g.alloc(most * all.len())?);
        Ok(Self {
            c,
            ids,
            me,
            stream,
            input,
            output,
        })
    }

    /// Call `call`: an all-reduce (sum of u32) or an all-gather, of a size drawn from the
    /// call's number; checked element by element. A failure of the library (the call, the
    /// stream, a device wait) is returned; wrong data panics.
    fn checked(&self, call: u64) -> mscclpp::host::Result<()> {
        let n = self.ids.len();
        let count = COUNTS[(call % COUNTS.len() as u64) as usize];
        let gather = call % 3 == 2;
        let out_len = if gather { n * count } else { count };
        let (input, output) = (&self.input, &self.output);
        let mine: Vec<u32> = (0..count).map(|i| value(self.me, call, i)).collect();
        input.copy_from_host(0, bytemuck::cast_slice(&mine))?;
        output.copy_from_host(0, &vec![0xA5; out_len * 4])?;
        // SAFETY: both buffers hold what the call moves and outlive the synchronize below.
        unsafe {
            if gather {
                self.c.all_gather(
                    input.ptr(),
                    output.ptr(),
                    count,
                    DataType::U32,
                    &self.stream,
                    None,
                )
            } else {
                self.c.all_reduce(
                    input.ptr(),
                    output.ptr(),
                    count,
                    DataType::U32,
                    ReduceOp::Sum,
                    &self.stream,
                    None,
                )
            }
        }?;
        self.stream.synchronize()?;
        // A communicator that failed during the call may have left its output incomplete (a
        // world of several nodes: a proxy that lost its connection aborts the communicator;
        // kernels that were not waiting record nothing): the call is lost.
        let comm = self.c.communicator();
        if let Some(e) = comm.status().error().or_else(|| comm.async_error()) {
            return Err(e);
        }
        let mut got = vec![0u32; out_len];
        output.copy_to_host(0, bytemuck::cast_slice_mut(&mut got))?;
        for (k, g) in got.iter().enumerate() {
            let want = if gather {
                value(self.ids[k / count], call, k % count)
            } else {
                self.ids
                    .iter()
                    .fold(0u32, |s, &id| s.wrapping_add(value(id, call, k)))
            };
            assert_eq!(
                *g,
                want,
                "{} of {count} u32, call {call}, element {k}, world {:?}",
                if gather { "all-gather" } else { "all-reduce" },
                self.ids
            );
        }
        Ok(())
    }
}

/// Waits (bounded) until `comm` reports `Error::Remote` naming one of `dead`; returns it.
fn expect_remote(comm: &Communicator, dead: &[usize], within: Duration) -> usize {
    let deadline = Instant::now() + within;
    loop {
        match comm.async_error() {
            Some(Error::Remote { rank, .. }) if dead.contains(&rank) => return rank,
            Some(Error::Remote { rank, reason }) => {
                panic!("Error::Remote names rank {rank} ({reason}), not one of {dead:?}")
            }
            other if Instant::now() >= deadline => {
                panic!("no Error::Remote naming one of {dead:?} within {within:?}: {other:?}")
            }
            _ => std::thread::sleep(Duration::from_millis(2)),
        }
    }
}

/// Whether `e` is what a call of a survivor may fail with once a rank it waited for died:
/// the communicator's verdict, a device wait released by the abort, the abort itself (a
/// proxy that lost its connection to the dead rank aborts before the health monitor names
/// it), or the bootstrap's word on the dead rank (a per-call exchange that met its closed
/// link). The caller then checks that the communicator names a dead rank.
fn failure_of_a_dead_rank(e: &Error, dead: &[usize]) -> bool {
    match e {
        Error::Remote { rank, .. } => dead.contains(rank),
        Error::Device { code, .. } => *code == mscclpp::shared::DeviceErrorCode::Aborted,
        Error::Aborted { .. } => true,
        Error::BootstrapPeerClosed { peer, .. } | Error::BootstrapPeerGone { peer, .. } => {
            peer.rank.is_some_and(|r| dead.contains(&r))
        }
        _ => false,
    }
}

#[test]
fn revoke_then_shrink_without_a_rank_that_closed_as_threads() {
    if !enough_gpus("revoke and shrink on 4 ranks", 4) {
        return;
    }
    let dead = 3;
    thread_world(4, |comm, bs| {
        let r = comm.rank();
        let w = World::new(
            Collectives::new(Arc::new(comm)).expect("collectives"),
            r as u32,
        )
        .expect("world");
        for call in 0..6 {
            w.checked(call).expect("a good call");
        }
        if r == dead {
            // Closes without a goodbye, as a crash would, while the others wait for it.
            bs.forgo_goodbye();
            std::thread::sleep(Duration::from_millis(100));
            drop(w);
            drop(bs);
            return Ok(());
        }
        // Rank 3 never makes this call: the others wait inside it until it is gone.
        let t = Instant::now();
        let err = w
            .checked(6)
            .expect_err("a call that waits for a dead rank fails");
        assert!(failure_of_a_dead_rank(&err, &[dead]), "{err:?}");
        let comm = w.c.communicator();
        assert_eq!(expect_remote(comm, &[dead], Duration::from_secs(10)), dead);
        println!("rank {r}: released after {:?} by {err}", t.elapsed());
        assert_eq!(comm.failed_ranks(), vec![dead]);

        w.c.revoke().expect("revoke");
        match w.checked(7) {
            Err(Error::Revoked { rank, .. }) => assert_eq!(rank, r),
            other => panic!("a call after revoke: {other:?}"),
        }
        // Every survivor must pass the same set: rank 1 also names rank 2. Each rank sends its
        // set to its members and to the live ranks it excludes, so all three hear a
        // disagreement at once (ranks 0 and 2 from rank 1, rank 1 from rank 0).
        if r != 2 {
            let bad: &[usize] = if r == 1 { &[2, 3] } else { &[3] };
            match w.c.shrink(bad) {
                Err(Error::MembershipMismatch { what, .. }) => {
                    assert_eq!(what, "excluded ranks")
                }
                Err(e) => panic!("rank {r}: a shrink over different sets: {e}"),
                Ok(_) => panic!("rank {r}: a shrink over different sets succeeded"),
            }
        } else {
            match w.c.shrink(&[3]) {
                Err(Error::MembershipMismatch { rank, .. }) => assert_eq!(rank, 1),
                other => panic!("rank 2: {:?}", other.err()),
            }
        }
        let shrunk = w.c.shrink(&[dead]).expect("shrink");
        // Set up from the configuration asked for, not the one fitted to the old world (they
        // differ when ranks share a GPU: a newcomer of a grown world passes the one asked for).
        assert_eq!(shrunk.requested_config(), w.c.requested_config());
        assert_eq!(shrunk.communicator().size(), 3);
        assert_eq!(shrunk.communicator().rank(), r);
        drop(w);
        let w = World::new(shrunk, r as u32).expect("world");
        assert_eq!(w.ids, [0, 1, 2]);
        for call in 100..160 {
            w.checked(call).expect("a call of the shrunk world");
        }
        assert!(w.c.communicator().async_error().is_none());
        w.c.communicator().barrier()
    });
}

/// How a victim leaves.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// SIGKILL of itself.
    Kill,
    /// SIGSTOP of itself (the parent kills it at the end).
    Stop,
}

/// Calls of the shrunk world checked after the first good one.
const AFTER_SHRINK: u64 = 1000;
/// Calls of the grown world.
const AFTER_GROW: u64 = 100;
/// Identities of newcomers start here (apart from every original rank's).
const NEWCOMER_ID: u32 = 1000;

/// A rank of a recovery world: checked calls until `victims` leave by `fate` (inside a call),
/// then revoke, shrink without them, [`AFTER_SHRINK`] checked calls; then, if `grow`, rank 0
/// hands out a grow id, one newcomer per victim joins and the grown world runs
/// [`AFTER_GROW`] checked calls.
fn recovery_rank(ch: ChildRank, victims: &[usize], fate: Fate, grow: bool) {
    let (rank, n) = (ch.rank, ch.size);
    if ch.newcomer {
        return newcomer(ch);
    }
    let w = World::new(
        Collectives::new(Arc::new(ch.comm)).expect("collectives"),
        rank as u32,
    )
    .expect("world");
    for call in 0..10 {
        w.checked(call).expect("a good call before any failure");
    }
    if victims.contains(&rank) {
        // Leaves from another thread while this one is inside a collective (most of a call's
        // time is spent waiting inside it).
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(150));
            say(&format!("RECOVERY_DIED_AT_NS {}", now_ns()));
            let sig = match fate {
                Fate::Kill => libc::SIGKILL,
                Fate::Stop => {
                    say("RECOVERY_STOPPED");
                    libc::SIGSTOP
                }
            };
            // SAFETY: a signal to this process; nothing is passed.
            unsafe { libc::kill(libc::getpid(), sig) };
        });
        for call in 10.. {
            let _ = w.checked(call);
        }
        unreachable!();
    }
    // A survivor: calls until one fails because a victim has gone.
    let t0 = Instant::now();
    let mut call = 10;
    let err = loop {
        match w.checked(call) {
            Ok(()) => call += 1,
            Err(e) => break e,
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "no call failed after the victims left"
        );
    };
    let failed_at = now_ns();
    assert!(
        failure_of_a_dead_rank(&err, victims),
        "call {call}: {err:?}"
    );
    let named = expect_remote(w.c.communicator(), victims, Duration::from_secs(60));
    say(&format!(
        "RECOVERY_ERROR_AT_NS {failed_at} call {call} names rank {named}: {err}"
    ));
    w.c.revoke().expect("revoke");
    // The detector's set, once every victim is in it (a node's ranks die together; their
    // notices arrive within milliseconds of each other).
    let comm = w.c.communicator().clone();
    let deadline = Instant::now() + Duration::from_secs(30);
    let failed = loop {
        let f = comm.failed_ranks();
        if victims.iter().all(|v| f.contains(v)) || Instant::now() > deadline {
            break f;
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    assert_eq!(failed, victims, "the failure detector's set");
    let shrunk = w.c.shrink(&failed).expect("shrink");
    let me = rank as u32;
    let w2 = World::new(shrunk, me).expect("shrunk world");
    // The revoked collectives: nothing of theirs runs any more.
    let nodes = comm.topology().nodes();
    drop((w, comm));
    w2.checked(AFTER_SHRINK * 10)
        .expect("the first call of the shrunk world");
    say(&format!("RECOVERY_FIRST_GOOD_AT_NS {}", now_ns()));
    let t = Instant::now();
    for call in 1..AFTER_SHRINK {
        w2.checked(AFTER_SHRINK * 10 + call)
            .expect("a call of the shrunk world");
    }
    say(&format!(
        "RECOVERY_SHRUNK_CALLS {AFTER_SHRINK} in {} ms on {} ranks",
        t.elapsed().as_millis(),
        w2.ids.len()
    ));
    if !grow {
        return w2.c.communicator().barrier().expect("barrier");
    }
    let shrunk_size = w2.ids.len();
    let t = Instant::now();
    let ticket = (w2.c.communicator().rank() == 0).then(|| {
        let t =
            w2.c.communicator()
                .grow_ticket("127.0.0.1:0".parse().unwrap())
                .expect("grow ticket");
        for r in shrunk_size..n {
            say(&format!("GROW_ID {} {r} {n}", t.id().to_hex()));
        }
        t
    });
    let grown = w2.c.grow(n, ticket, configure).expect("grow");
    let w3 = World::new(grown, me).expect("grown world");
    assert_eq!(
        w3.c.communicator().topology().nodes(),
        nodes,
        "the grown world's nodes"
    );
    say(&format!(
        "RECOVERY_GROWN in {} ms to {:?} on {nodes} node(s)",
        t.elapsed().as_millis(),
        w3.ids
    ));
    drop(w2);
    for call in 0..AFTER_GROW {
        w3.checked(AFTER_SHRINK * 100 + call)
            .expect("a call of the grown world");
    }
    w3.c.communicator().barrier().expect("barrier");
}

/// A newcomer of a grown world: the same calls as the others.
fn newcomer(ch: ChildRank) {
    let me = NEWCOMER_ID + ch.rank as u32;
    let w = World::new(
        Collectives::new(Arc::new(ch.comm)).expect("collectives"),
        me,
    )
    .expect("world");
    for call in 0..AFTER_GROW {
        w.checked(AFTER_SHRINK * 100 + call)
            .expect("a call of the grown world");
    }
    w.c.communicator().barrier().expect("barrier");
}

/// The parent's checks of a recovery world: every survivor and newcomer passed, every victim
/// died of SIGKILL (its own, or the parent's after it stopped), and the times, printed.
fn expect_recovered(test: &str, ends: &[End], victims: &[usize]) {
    let all = || {
        ends.iter()
            .enumerate()
            .map(|(i, e)| format!("--- child {i} ({}):\n{}", e.status, e.output))
            .collect::<Vec<_>>()
            .join("\n")
    };
    for (i, e) in ends.iter().enumerate() {
        assert!(!e.overran, "child {i} hung\n{}", all());
        if victims.contains(&i) {
            assert_eq!(
                e.status.signal(),
                Some(libc::SIGKILL),
                "victim {i}\n{}",
                all()
            );
        } else {
            assert!(
                e.status.success() && !e.killed,
                "child {i} failed\n{}",
                all()
            );
        }
    }
    let stamp = |e: &End, key: &str| -> Option<u128> {
        e.output.lines().find_map(|l| {
            let at = l.find(key)?;
            l[at + key.len()..].split_whitespace().next()?.parse().ok()
        })
    };
    let died = victims
        .iter()
        .filter_map(|&v| stamp(&ends[v], "RECOVERY_DIED_AT_NS "))
        .min()
        .expect("a victim printed when it left");
    let ms = |t: u128| t.saturating_sub(died) as f64 / 1e6;
    let survivors: Vec<usize> = (0..ends.len())
        .filter(|i| {
            !victims.contains(i) && stamp(&ends[*i], "RECOVERY_FIRST_GOOD_AT_NS ").is_some()
        })
        .collect();
    let error: Vec<f64> = survivors
        .iter()
        .map(|&r| ms(stamp(&ends[r], "RECOVERY_ERROR_AT_NS ").unwrap()))
        .collect();
    let good: Vec<f64> = survivors
        .iter()
        .map(|&r| ms(stamp(&ends[r], "RECOVERY_FIRST_GOOD_AT_NS ").unwrap()))
        .collect();
    let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    println!(
        "RECOVERY {test}: {} ranks, victims {victims:?}: kill -> error on every survivor within \
         {:.0} ms; kill -> first good collective of the shrunk world within {:.0} ms (each: \
         {good:.0?})",
        survivors.len() + victims.len(),
        max(&error),
        max(&good),
    );
    for (i, e) in ends.iter().enumerate() {
        for l in e.output.lines() {
            for key in [
                "RECOVERY_SHRUNK_CALLS",
                "RECOVERY_GROWN",
                "RECOVERY_ERROR_AT_NS",
            ] {
                if let Some(at) = l.find(key) {
                    println!("  child {i}: {}", &l[at..]);
                }
            }
        }
    }
}

/// The world of `n` ranks with `victims` leaving by `fate`: parent and children.
fn recovery_case(test: &str, n: usize, victims: &[usize], fate: Fate, env: &[(&str, String)]) {
    if let Some(ch) = child() {
        return recovery_rank(ch, victims, fate, true);
    }
    if !enough_gpus(test, n) {
        return;
    }
    let t = Instant::now();
    let ends = run_world(test, n, env);
    expect_recovered(test, &ends, victims);
    println!("RECOVERY {test}: whole case {:?}", t.elapsed());
}

#[test]
fn killed_mid_collective_4_ranks() {
    recovery_case("killed_mid_collective_4_ranks", 4, &[2], Fate::Kill, &[]);
}

#[test]
fn killed_mid_collective_8_ranks() {
    recovery_case("killed_mid_collective_8_ranks", 8, &[5], Fate::Kill, &[]);
}

/// The peer timeout of the stopped-rank case: long enough that no rank of a loaded 2-core
/// machine goes unscheduled for it, short enough for CI.
const STOP_TIMEOUT_MS: u64 = 3000;

#[test]
fn stopped_rank_is_excluded_after_the_peer_timeout() {
    recovery_case(
        "stopped_rank_is_excluded_after_the_peer_timeout",
        4,
        &[1],
        Fate::Stop,
        &[(ENV_PEER_TIMEOUT, STOP_TIMEOUT_MS.to_string())],
    );
}

#[test]
fn killed_node_of_an_emulated_world() {
    recovery_case(
        "killed_node_of_an_emulated_world",
        4,
        &[2, 3],
        Fate::Kill,
        &[
            (ENV_NODES, "0,0,1,1".to_string()),
            ("MSCCLPP_NET_TRANSPORT", "ethernet".to_string()),
        ],
    );
}
