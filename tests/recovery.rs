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
//!   both ranks of node 1 are killed; the survivors shrink to node 0 and go on.
//!
//! Every collective's data is a hash of (the contributor's identity, the call, the element),
//! outputs are poisoned first and every element is compared with a host reference; each rank's
//! identity is the rank it started with (a newcomer's: its rank in the grown world), so the
//! reference does not depend on how a world numbers its ranks.

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use mscclpp::collectives::Collectives;
use mscclpp::host::Error;
use mscclpp::host::bootstrap::{Bootstrap, BootstrapConfig, TcpBootstrap, UniqueId};
use mscclpp::host::communicator::Communicator;
use mscclpp::host::gpu::{BackendKind, Gpu, Stream};
use mscclpp::shared::{DataType, ReduceOp};

// ------------------------------------------------------------------------------------------
// Checked collectives
// ------------------------------------------------------------------------------------------

/// The backend under test (`MSCCLPP_BACKEND`, else CUDA when a GPU is present).
fn backend() -> BackendKind {
    BackendKind::select().expect("backend")
}

/// Whether `n` ranks can run here (CUDA: a GPU each); prints NOT RUN if not.
fn enough_devices(n: usize, what: &str) -> bool {
    let kind = backend();
    let have = kind.device_count().unwrap_or(0);
    if kind == BackendKind::Cuda && have < n {
        eprintln!("NOT RUN: {what}: {n} ranks need {n} GPUs ({have} here)");
        return false;
    }
    true
}

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
}

impl World {
    /// `c` with this rank's identity `me` (every rank's learnt by one all-gather).
    fn new(c: Collectives, me: u32) -> mscclpp::host::Result<Self> {
        let all = c.communicator().all_gather(&me.to_le_bytes())?;
        let ids = all
            .iter()
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let stream = c.communicator().gpu().stream()?;
        Ok(Self { c, ids, me, stream })
    }

    /// Call `call`: an all-reduce (sum of u32) or an all-gather, of a size drawn from the
    /// call's number; checked element by element. A failure of the library (the call, the
    /// stream, a device wait) is returned; wrong data panics.
    fn checked(&self, call: u64) -> mscclpp::host::Result<()> {
        let n = self.ids.len();
        let count = [1usize, 7, 64, 300, 1024, 4099][(call % 6) as usize];
        let gather = call % 3 == 2;
        let g = self.c.communicator().gpu();
        let out_len = if gather { n * count } else { count };
        let input = g.alloc(count * 4)?;
        let output = g.alloc(out_len * 4)?;
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
        if let Some(e) = self.c.communicator().status().error() {
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
/// the communicator's verdict, a device wait released by the abort, or the bootstrap's
/// word on the dead rank (a per-call exchange that met its closed link).
fn failure_of_a_dead_rank(e: &Error, dead: &[usize]) -> bool {
    match e {
        Error::Remote { rank, .. } => dead.contains(rank),
        Error::Device { code, .. } => *code == mscclpp::shared::DeviceErrorCode::Aborted,
        Error::BootstrapPeerClosed { peer, .. } | Error::BootstrapPeerGone { peer, .. } => {
            peer.rank.is_some_and(|r| dead.contains(&r))
        }
        _ => false,
    }
}

// ------------------------------------------------------------------------------------------
// Ranks as threads
// ------------------------------------------------------------------------------------------

/// Runs `body(rank, bootstrap)` on `n` ranks as threads over loopback bootstraps (no
/// communicator made: the body makes its own, and may close its bootstrap as a crash would).
fn thread_world<T: Send>(n: usize, body: impl Fn(usize, Arc<TcpBootstrap>) -> T + Sync) -> Vec<T> {
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

fn gpu(rank: usize) -> Gpu {
    let kind = backend();
    Gpu::open(kind, rank % kind.device_count().unwrap_or(1).max(1)).expect("gpu")
}

#[test]
fn revoke_then_shrink_without_a_rank_that_closed_as_threads() {
    if !enough_devices(4, "revoke and shrink on 4 ranks") {
        return;
    }
    let dead = 3;
    thread_world(4, |r, bs| {
        let comm = Communicator::new(bs.clone(), gpu(r)).expect("communicator");
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
            return;
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
        assert_eq!(shrunk.communicator().size(), 3);
        assert_eq!(shrunk.communicator().rank(), r);
        drop(w);
        let w = World::new(shrunk, r as u32).expect("world");
        assert_eq!(w.ids, [0, 1, 2]);
        for call in 100..160 {
            w.checked(call).expect("a call of the shrunk world");
        }
        assert!(w.c.communicator().async_error().is_none());
        w.c.communicator().barrier().expect("barrier");
    });
}
