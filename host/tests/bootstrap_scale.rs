//! The bootstrap at scale and under load, on 127.0.0.1 with ranks as threads of this process:
//! 64, 256 and 1024 ranks set up, all-gather and meet at a barrier, each holding a handful of
//! descriptors (the tree's links, its listener, its I/O thread's wake-up) instead of one socket
//! per peer; a set-up completes in normal time while hundreds of silent, garbage and forged
//! connections are held open against the root and a rank; a peer that floods a rank is cut
//! off at the caps with a typed error; a dead rank's notice reaches ranks with no link to it.
//!
//! The figures (set-up time, descriptors per rank) are printed (`--nocapture`) and recorded in
//! RELIABILITY.md; only structure is asserted (every value, every rank, the descriptor bound),
//! never a time, except the normal-time bound of the admission test, which is the point of it.

mod bootstrap_util;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use bootstrap_util::{connect_retry, connect_while, forged, join_by_hand};
use mscclpp_host::Error;
use mscclpp_host::bootstrap::wire::{self, ControlHeader, Kind, Purpose, Reject, RejectCode};
use mscclpp_host::bootstrap::{Bootstrap, BootstrapConfig, TcpBootstrap, UniqueId};
use mscclpp_host::communicator::Communicator;
use mscclpp_host::gpu::{BackendKind, Gpu};

/// The tests of this file run one at a time: the descriptor count is the process's, and the
/// thousand-rank world needs the two cores to itself.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// Open descriptors of this process.
fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Runs `n` ranks as threads (small stacks); `body` gets each rank's bootstrap after every rank
/// has one; returns the bodies' results in rank order, the set-up time (the slowest rank's)
/// and the descriptors all ranks hold together once set up.
fn world<T: Send>(
    n: usize,
    cfg: impl Fn(BootstrapConfig) -> BootstrapConfig + Sync,
    body: impl Fn(&TcpBootstrap) -> T + Sync,
) -> (Vec<T>, Duration, usize) {
    let before = fds();
    let (id, listener) = UniqueId::bind(loopback()).unwrap();
    let listener = Mutex::new(Some(listener));
    let ready = std::sync::Barrier::new(n + 1);
    let counted = std::sync::Barrier::new(n + 1);
    let t0 = Instant::now();
    let setup = Mutex::new(Duration::ZERO);
    let mut held = 0;
    let out = thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let (cfg, body, listener, ready, counted, setup) =
                    (&cfg, &body, &listener, &ready, &counted, &setup);
                thread::Builder::new()
                    .stack_size(256 << 10)
                    .spawn_scoped(s, move || {
                        let c =
                            cfg(BootstrapConfig::new(r, n, id)
                                .with_timeout(Duration::from_secs(120)));
                        let root = if r == 0 {
                            listener.lock().unwrap().take()
                        } else {
                            None
                        };
                        let bs = match root {
                            Some(l) => TcpBootstrap::init_with_root_listener(c, l),
                            None => TcpBootstrap::init(c),
                        }
                        .unwrap_or_else(|e| panic!("rank {r}: {e}"));
                        {
                            let mut t = setup.lock().unwrap();
                            *t = (*t).max(t0.elapsed());
                        }
                        ready.wait();
                        counted.wait();
                        body(&bs)
                    })
                    .unwrap()
            })
            .collect();
        ready.wait();
        held = fds().saturating_sub(before);
        counted.wait();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    let t = *setup.lock().unwrap();
    (out, t, held)
}

/// A value of (rank, index) with no symmetry.
fn item(rank: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((rank * 2_654_435_761 + i * 40_503) >> 3) as u8)
        .collect()
}

fn scale(n: usize) {
    let (gathered, setup, held) = world(
        n,
        |c| c,
        |bs| {
            let me = bs.rank();
            let all = bs.all_gather(&item(me, 16)).unwrap();
            bs.barrier().unwrap();
            let mut b = if me == n - 1 { item(n, 40) } else { Vec::new() };
            bs.broadcast(n - 1, &mut b).unwrap();
            assert_eq!(b, item(n, 40), "broadcast on rank {me}");
            (all, bs.link_count())
        },
    );
    for (r, (all, _)) in gathered.iter().enumerate() {
        assert_eq!(all.len(), n, "rank {r}");
        for (k, v) in all.iter().enumerate() {
            assert_eq!(v, &item(k, 16), "rank {r}: item of rank {k}");
        }
    }
    let links: usize = gathered.iter().map(|(_, l)| l).sum();
    let per_rank = held as f64 / n as f64;
    println!(
        "SCALE {n} ranks: set-up {:.3} s, {held} descriptors held ({per_rank:.2} per rank), {:.2} links per rank",
        setup.as_secs_f64(),
        links as f64 / n as f64
    );
    // A listener, the I/O thread's wake-up, and at most three tree links (one end each), on
    // average two: far below one socket per peer.
    assert!(per_rank <= 5.0, "{per_rank} descriptors per rank");
    assert!(
        gathered.iter().all(|(_, l)| *l <= 3),
        "a rank holds more than its tree links"
    );
}

#[test]
fn scale_64_ranks() {
    let _serial = serial();
    scale(64);
}

#[test]
fn scale_256_ranks() {
    let _serial = serial();
    scale(256);
}

#[test]
fn scale_1024_ranks() {
    let _serial = serial();
    scale(1024);
}

// ---- admission under load ----

/// Reads what the listener answers until it closes (bounded); the REJECT code, if any.
fn rejected_with(mut s: TcpStream) -> Option<RejectCode> {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    let mut at = 0;
    let mut code = None;
    while got.len() >= at + wire::CONTROL_HEADER_LEN {
        let h =
            ControlHeader::decode(got[at..at + wire::CONTROL_HEADER_LEN].try_into().ok()?).ok()?;
        let end = at + wire::CONTROL_HEADER_LEN + h.body_len as usize;
        if h.kind == Kind::Reject.code() {
            code = Reject::decode(got.get(at + wire::CONTROL_HEADER_LEN..end)?)
                .ok()
                .map(|r| r.code);
        }
        at = end;
    }
    code
}

fn garbage(i: usize) -> Vec<u8> {
    (0..64).map(|k| (i * 131 + k * 7 + 1) as u8).collect()
}

/// Sets up `n` ranks; rank `early` starts (and joins) first, the others when `go` says so.
/// Returns every rank's all-gather of its rank and the time from `go` to the last set-up.
#[allow(clippy::type_complexity)]
fn staged_world(
    n: usize,
    id: UniqueId,
    root: mscclpp_host::bootstrap::RootListener,
    listen: &[(usize, SocketAddr)],
    early: usize,
    go: &std::sync::Barrier,
) -> (Vec<Vec<Vec<u8>>>, Duration) {
    let root = Mutex::new(Some(root));
    let started = Mutex::new(None::<Instant>);
    let out = thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (root, started) = (&root, &started);
                let at = listen.iter().find(|(k, _)| *k == r).map(|(_, a)| *a);
                s.spawn(move || {
                    if r != early {
                        go.wait();
                        started.lock().unwrap().get_or_insert_with(Instant::now);
                    }
                    let mut c =
                        BootstrapConfig::new(r, n, id).with_timeout(Duration::from_secs(30));
                    if let Some(a) = at {
                        c = c.with_listen(a);
                    }
                    let l = if r == 0 {
                        root.lock().unwrap().take()
                    } else {
                        None
                    };
                    let bs = match l {
                        Some(l) => TcpBootstrap::init_with_root_listener(c, l),
                        None => TcpBootstrap::init(c),
                    }
                    .unwrap_or_else(|e| panic!("rank {r}: {e}"));
                    let t = started.lock().unwrap().map(|t| t.elapsed());
                    let all = bs.all_gather(&[r as u8, (r >> 8) as u8]).unwrap();
                    bs.barrier().unwrap();
                    (all, t)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    let took = out.iter().filter_map(|(_, t)| *t).max().unwrap_or_default();
    (out.into_iter().map(|(a, _)| a).collect(), took)
}

#[test]
fn set_up_completes_in_normal_time_under_hundreds_of_hostile_connections() {
    let _serial = serial();
    const N: usize = 16;
    const EARLY: usize = 0; // its root service takes the load from the start
    let free = || TcpListener::bind(loopback()).unwrap().local_addr().unwrap();
    let check = |all: &[Vec<Vec<u8>>]| {
        for (r, a) in all.iter().enumerate() {
            for (k, v) in a.iter().enumerate() {
                assert_eq!(v, &vec![k as u8, (k >> 8) as u8], "rank {r}, item {k}");
            }
        }
    };

    // The same world without any load first: what "normal time" is here, now.
    let (id, root) = UniqueId::bind(loopback()).unwrap();
    let go = std::sync::Barrier::new(N);
    let (all, quiet) = thread::scope(|s| {
        let h = s.spawn(|| staged_world(N, id, root, &[], EARLY, &go));
        go.wait();
        h.join().unwrap()
    });
    check(&all);

    let (id, root) = UniqueId::bind(loopback()).unwrap();
    let rank1 = free();
    let go = std::sync::Barrier::new(N);
    let held = Mutex::new(Vec::new());
    let (all, loaded, duplicates, forgeries) = thread::scope(|s| {
        let world = s.spawn(|| staged_world(N, id, root, &[(1, rank1)], EARLY, &go));
        // Rank 1 listens from its start; rank EARLY joins before the others start.
        let mut h = held.lock().unwrap();
        for i in 0..300 {
            h.push(connect_retry(id.root())); // silent at the root
            if i < 100 {
                let mut g = connect_retry(id.root());
                let _ = g.write_all(&garbage(i));
                h.push(g);
            }
        }
        drop(h);
        // Authenticated duplicates of a rank that has joined (rank EARLY joins within a few
        // milliseconds of its start; two seconds leave room for a loaded machine), and forged
        // proofs, each on its own connection; all answered before the others start, while
        // the root serves the silent and garbage connections above.
        thread::sleep(Duration::from_secs(2));
        let dups: Vec<_> = (0..100)
            .map(|_| {
                s.spawn(move || {
                    rejected_with(join_by_hand(&id, EARLY, N, "127.0.0.1:9".parse().unwrap()))
                })
            })
            .collect();
        let forgers: Vec<_> = (0..20)
            .map(|i| {
                s.spawn(move || {
                    let s = if i % 2 == 0 {
                        forged(id.root(), &id, Purpose::Join, (2, wire::ROOT, N))
                    } else {
                        forged(id.root(), &id, Purpose::Join, (7, wire::ROOT, N))
                    };
                    rejected_with(s)
                })
            })
            .collect();
        let d: Vec<_> = dups.into_iter().map(|h| h.join().unwrap()).collect();
        let f: Vec<_> = forgers.into_iter().map(|h| h.join().unwrap()).collect();
        go.wait(); // the other ranks start
        let mut h = held.lock().unwrap();
        // Rank 1's listener: silent and garbage connections while the world sets up. On a
        // fast machine the world may finish (and rank 1 close its listener) before all 200
        // are made: then the rest are not attempted.
        for i in 0..200 {
            let Some(mut c) = connect_while(rank1, || !world.is_finished()) else {
                break;
            };
            if i % 2 == 1 {
                let _ = c.write_all(&garbage(i));
            }
            h.push(c);
        }
        drop(h);
        let (all, took) = world.join().unwrap();
        (all, took, d, f)
    });
    let held = held.into_inner().unwrap().len();
    check(&all);
    println!(
        "ADMISSION {N} ranks: set-up {:.3} s quiet, {:.3} s with {held} hostile connections held, 100 duplicate JOINs and 20 forged ones",
        quiet.as_secs_f64(),
        loaded.as_secs_f64()
    );
    assert!(
        duplicates.iter().all(|c| *c == Some(RejectCode::Duplicate)),
        "{duplicates:?}"
    );
    assert!(
        forgeries.iter().all(|c| *c == Some(RejectCode::Auth)),
        "{forgeries:?}"
    );
    // The handshake deadline (5 s) is what silent connections could cost each rank if they
    // delayed it; normal time is well under it.
    assert!(
        loaded < quiet + Duration::from_secs(3),
        "set-up took {loaded:?} under load, {quiet:?} without"
    );
}

// ---- bounded memory ----

#[test]
fn a_flooding_peer_is_cut_off_at_the_caps_and_the_communicator_aborts() {
    let _serial = serial();
    const CAP: u64 = 4 << 20;
    const FRAMES: u64 = 1000;
    let (id, root) = UniqueId::bind(loopback()).unwrap();
    let root = Mutex::new(Some(root));
    let flood_done = std::sync::Barrier::new(2);
    thread::scope(|s| {
        for r in 0..2 {
            let (root, flood_done) = (&root, &flood_done);
            s.spawn(move || {
                let c = BootstrapConfig::new(r, 2, id)
                    .with_timeout(Duration::from_secs(20))
                    .with_queue_caps(CAP, FRAMES);
                let l = if r == 0 { root.lock().unwrap().take() } else { None };
                let bs = match l {
                    Some(l) => TcpBootstrap::init_with_root_listener(c, l),
                    None => TcpBootstrap::init(c),
                }
                .unwrap();
                if r == 1 {
                    // 512 frames of 1 MiB on distinct tags, never received: 512 MiB if
                    // nothing stopped it.
                    let chunk = vec![0xA5u8; 1 << 20];
                    let mut sent = 0;
                    for tag in 0..512u64 {
                        if bs.send(0, 1000 + tag, &chunk).is_err() {
                            break;
                        }
                        sent += 1;
                    }
                    println!("FLOOD rank 1 sent {sent} MiB before its link was cut");
                    assert!(sent < 512, "the flood was never cut");
                    flood_done.wait();
                    return;
                }
                let gpu = Gpu::open(BackendKind::Cpu, 0).unwrap();
                let bs = Arc::new(bs);
                let comm = Communicator::new(bs.clone(), gpu).unwrap();
                flood_done.wait();
                let until = Instant::now() + Duration::from_secs(10);
                let e = loop {
                    if let Some(e) = comm.async_error() {
                        break e;
                    }
                    assert!(Instant::now() < until, "no abort for the flood");
                    thread::sleep(Duration::from_millis(5));
                };
                assert!(
                    matches!(&e, Error::Remote { rank: 1, reason } if reason.contains("queues")),
                    "{e}"
                );
                let (bytes, frames) = bs.queued_from(1);
                assert!(bytes <= CAP && frames <= FRAMES, "{bytes} bytes, {frames} frames");
                assert!(bytes >= CAP - (1 << 20), "cut before the cap: {bytes} bytes");
                println!("FLOOD rank 0 holds {bytes} bytes in {frames} frames (cap {CAP}): {e}");
                // The communicator's waits fail at once; the bootstrap itself still hands out
                // what was queued, then the typed error.
                assert!(matches!(
                    comm.bootstrap().recv(1, 1000),
                    Err(Error::Remote { rank: 1, .. })
                ));
                let got = bs.recv(1, 1000).unwrap();
                assert_eq!(got.len(), 1 << 20);
                let e = bs.recv(1, 99).unwrap_err();
                assert!(
                    matches!(&e, Error::BootstrapQueueFull { peer, max_bytes: CAP, .. } if peer.rank == Some(1)),
                    "{e}"
                );
            });
        }
    });
}

/// Each peer stays under its own cap (256 MiB), but together they would make the process hold
/// more than its cap (6 MiB here): the sender of the frame that does not fit is cut with the
/// same typed error and abort as a peer over its own cap.
#[test]
fn the_process_cap_cuts_the_peer_whose_frame_does_not_fit() {
    let _serial = serial();
    const CAP: u64 = 6 << 20;
    let (id, root) = UniqueId::bind(loopback()).unwrap();
    let root = Mutex::new(Some(root));
    let done = std::sync::Barrier::new(3);
    thread::scope(|s| {
        for r in 0..3 {
            let (root, done) = (&root, &done);
            s.spawn(move || {
                let c = BootstrapConfig::new(r, 3, id)
                    .with_timeout(Duration::from_secs(20))
                    .with_process_queue_cap(CAP);
                let l = if r == 0 { root.lock().unwrap().take() } else { None };
                let bs = match l {
                    Some(l) => TcpBootstrap::init_with_root_listener(c, l),
                    None => TcpBootstrap::init(c),
                }
                .unwrap();
                if r != 0 {
                    // 4 MiB each in 1 MiB frames, never received: 8 MiB in all.
                    let chunk = vec![r as u8; 1 << 20];
                    let sent = (0..4u64)
                        .take_while(|t| bs.send(0, 500 + t, &chunk).is_ok())
                        .count();
                    println!("PROCESS CAP rank {r} sent {sent} MiB");
                    done.wait();
                    return;
                }
                let gpu = Gpu::open(BackendKind::Cpu, 0).unwrap();
                let bs = Arc::new(bs);
                let comm = Communicator::new(bs.clone(), gpu).unwrap();
                let until = Instant::now() + Duration::from_secs(10);
                let e = loop {
                    if let Some(e) = comm.async_error() {
                        break e;
                    }
                    assert!(Instant::now() < until, "no abort for the process cap");
                    thread::sleep(Duration::from_millis(5));
                };
                let Error::Remote { rank: cut, reason } = &e else {
                    panic!("{e}");
                };
                assert!(reason.contains("this process queues"), "{reason}");
                let held = bs.queued_from(1).0 + bs.queued_from(2).0;
                println!("PROCESS CAP rank 0 holds {held} bytes (cap {CAP}): {e}");
                assert!(held <= CAP, "{held} bytes held");
                assert!(held >= CAP - (2 << 20), "cut well before the cap: {held} bytes");
                // What was queued from the cut rank is still handed out, then the typed error.
                let _ = bs.recv(*cut, 500);
                let e = (501..504)
                    .find_map(|t| bs.recv(*cut, t).err())
                    .expect("a receive from the cut rank fails");
                assert!(
                    matches!(&e, Error::BootstrapQueueFull { peer, process: true, max_bytes: CAP, .. }
                        if peer.rank == Some(*cut)),
                    "{e}"
                );
                done.wait();
            });
        }
    });
}

// ---- a death reaches every rank ----

#[test]
fn a_dead_rank_is_reported_to_ranks_without_a_link_to_it() {
    let _serial = serial();
    const N: usize = 15;
    const VICTIM: usize = 13; // a leaf: only its tree parent, rank 6, holds a link to it
    let (reports, _, _) = world(
        N,
        |c| c,
        |bs| {
            bs.barrier().unwrap();
            if bs.rank() == VICTIM {
                // Closes its links without a goodbye: what a crash looks like to the others.
                bs.forgo_goodbye();
                return None;
            }
            let t0 = Instant::now();
            let got = loop {
                if let Some(d) = bs.dead_peer() {
                    break d;
                }
                assert!(t0.elapsed() < Duration::from_secs(10), "no report");
                thread::sleep(Duration::from_millis(2));
            };
            // Sends to it fail at once, and so do receives.
            assert!(bs.send(VICTIM, 1, b"x").is_err());
            assert!(bs.recv_timeout(VICTIM, 1, Duration::from_secs(10)).is_err());
            // Keep the links up until every survivor has heard (the others may still be
            // passing the notice on through this rank).
            bs.barrier().unwrap_err();
            Some((bs.rank(), got, t0.elapsed()))
        },
    );
    for (rank, (dead, reason), after) in reports.into_iter().flatten() {
        assert_eq!(dead, VICTIM, "rank {rank}: {reason}");
        if rank != 6 {
            assert!(reason.contains("reported by rank"), "rank {rank}: {reason}");
        }
        println!("NOTICE rank {rank} after {after:?}: {reason}");
    }
}

/// The same through communicators: every survivor's health monitor aborts its communicator
/// with `Error::Remote` naming the dead rank, also where no link to it exists.
#[test]
fn every_communicator_aborts_for_a_dead_rank_it_has_no_link_to() {
    let _serial = serial();
    const N: usize = 7;
    const VICTIM: usize = 5; // tree: 0 → {1, 2}, 1 → {3, 4}, 2 → {5, 6}
    let (id, root) = UniqueId::bind(loopback()).unwrap();
    let root = Mutex::new(Some(root));
    let made = std::sync::Barrier::new(N);
    let out: Vec<Option<(usize, Duration)>> = thread::scope(|s| {
        let hs: Vec<_> = (0..N)
            .map(|r| {
                let (root, made) = (&root, &made);
                s.spawn(move || {
                    let c = BootstrapConfig::new(r, N, id).with_timeout(Duration::from_secs(30));
                    let l = if r == 0 {
                        root.lock().unwrap().take()
                    } else {
                        None
                    };
                    let bs = match l {
                        Some(l) => TcpBootstrap::init_with_root_listener(c, l),
                        None => TcpBootstrap::init(c),
                    }
                    .unwrap();
                    let gpu = Gpu::open(BackendKind::Cpu, 0).unwrap();
                    let comm = Communicator::new(Arc::new(bs), gpu).unwrap();
                    comm.barrier().unwrap();
                    made.wait();
                    if r == VICTIM {
                        // A crash, as the others see it: links closed without a goodbye.
                        comm.bootstrap().forgo_goodbye();
                        return None;
                    }
                    let t0 = Instant::now();
                    let e = loop {
                        if let Some(e) = comm.async_error() {
                            break e;
                        }
                        assert!(t0.elapsed() < Duration::from_secs(10), "rank {r}: no abort");
                        thread::sleep(Duration::from_millis(2));
                    };
                    let Error::Remote { rank, reason } = &e else {
                        panic!("rank {r}: {e}");
                    };
                    assert_eq!(*rank, VICTIM, "rank {r}: {reason}");
                    assert!(comm.status().is_aborted());
                    // Stay until the others have heard too (they may hear it through us).
                    let _ = comm.bootstrap().barrier();
                    Some((r, t0.elapsed()))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let survivors = out.iter().flatten().count();
    assert_eq!(survivors, N - 1);
    for (r, after) in out.into_iter().flatten() {
        println!("ABORT rank {r} after {after:?}");
    }
}
