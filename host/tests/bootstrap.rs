//! Whole-bootstrap tests on 127.0.0.1: ranks as threads and as processes (this binary re-executes
//! itself), failures (missing and dying ranks, closed peers), hostile connections on the root
//! port and on a rank's listener, and the pure parts (unique ids, launcher environments).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

mod bootstrap_util;

use bootstrap_util::{connect_retry, forge, forged, hello, join_by_hand};
use mscclpp_host::Error;
use mscclpp_host::auth::{Passphrase, Secret};
use mscclpp_host::bootstrap::wire::{
    self, ControlHeader, Hello, Kind, Proof, Purpose, Reject, RejectCode,
};
use mscclpp_host::bootstrap::{
    Bootstrap, BootstrapConfig, Launcher, RootSpec, TcpBootstrap, UniqueId, interface_ipv4,
};
use mscclpp_test_support::{Child, TestProcess};

type BsResult = mscclpp_host::Result<TcpBootstrap>;

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// A port that was free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind(loopback())
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs `ranks` (a subset of `0..n`) as threads of one world; each gets its init result.
fn world_of<T: Send>(
    n: usize,
    ranks: &[usize],
    cfg: impl Fn(BootstrapConfig) -> BootstrapConfig + Sync,
    body: impl Fn(usize, BsResult) -> T + Sync,
) -> Vec<T> {
    let (id, listener) = UniqueId::bind(loopback()).unwrap();
    let listener = Mutex::new(Some(listener));
    thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter()
            .map(|&r| {
                let (cfg, body, listener) = (&cfg, &body, &listener);
                s.spawn(move || {
                    let c =
                        cfg(BootstrapConfig::new(r, n, id).with_timeout(Duration::from_secs(20)));
                    let root_listener = if r == 0 {
                        listener.lock().unwrap().take()
                    } else {
                        None
                    };
                    let bs = match root_listener {
                        Some(l) => TcpBootstrap::init_with_root_listener(c, l),
                        None => TcpBootstrap::init(c),
                    };
                    body(r, bs)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn world<T: Send>(n: usize, body: impl Fn(usize, BsResult) -> T + Sync) -> Vec<T> {
    let ranks: Vec<usize> = (0..n).collect();
    world_of(n, &ranks, |c| c, body)
}

fn payload(seed: usize, salt: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31) ^ seed.wrapping_mul(131) ^ salt.wrapping_mul(7919)) as u8)
        .collect()
}

fn shuffle<T>(v: &mut [T], mut seed: u64) {
    for i in (1..v.len()).rev() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        v.swap(i, (seed % (i as u64 + 1)) as usize);
    }
}

const TAGS: [u64; 6] = [0, 1, 2, 7919, 1 << 40, u64::MAX];
const PER_TAG: usize = 3;

/// Every (peer, tag) pair `PER_TAG` times, interleaved in a seeded random order; the third field
/// counts the messages of that pair so far.
fn schedule(n: usize, seed: u64) -> Vec<(usize, u64, usize)> {
    let mut pairs: Vec<(usize, u64)> = (0..n)
        .flat_map(|p| TAGS.iter().map(move |&t| (p, t)))
        .flat_map(|pt| std::iter::repeat_n(pt, PER_TAG))
        .collect();
    shuffle(&mut pairs, seed);
    let mut count: HashMap<(usize, u64), usize> = HashMap::new();
    pairs
        .into_iter()
        .map(|(p, t)| {
            let c = count.entry((p, t)).or_insert(0);
            *c += 1;
            (p, t, *c - 1)
        })
        .collect()
}

fn message(from: usize, to: usize, tag: u64, k: usize) -> Vec<u8> {
    let len = if tag == 1 && k == 0 {
        100_000
    } else {
        (from * 7 + to * 13 + (tag as usize % 97) * 31 + k * 3) % 200
    };
    payload(
        from * 1000 + to,
        (tag as usize).wrapping_mul(10).wrapping_add(k),
        len,
    )
}

/// The whole API on one rank, checked: all-gather, scrambled tagged send/recv (self included),
/// barrier, broadcast from every root with several lengths.
fn exercise(bs: &TcpBootstrap) {
    let (me, n) = (bs.rank(), bs.size());
    assert_eq!(bs.local_rank(), me, "one host: local rank = rank");
    assert_eq!(bs.ranks_per_node(), n);
    assert_eq!(bs.num_nodes(), 1);

    let all = bs.all_gather(&payload(me, 0, 37)).unwrap();
    assert_eq!(all.len(), n);
    for (r, v) in all.iter().enumerate() {
        assert_eq!(v, &payload(r, 0, 37), "all_gather slot {r} on rank {me}");
    }
    assert_eq!(
        bs.all_gather_flat(&[me as u8; 3]).unwrap(),
        (0..n).flat_map(|r| [r as u8; 3]).collect::<Vec<_>>()
    );

    for (peer, tag, k) in schedule(n, 0x9E37_79B9_7F4A_7C15 ^ ((me as u64 + 1) * 0x1234_5678)) {
        bs.send(peer, tag, &message(me, peer, tag, k)).unwrap();
    }
    for (peer, tag, k) in schedule(n, 0xDEAD_BEEF_0BAD_F00D ^ ((me as u64 + 7) * 0x8765_4321)) {
        let got = bs.recv(peer, tag).unwrap();
        assert_eq!(
            got,
            message(peer, me, tag, k),
            "rank {me}: message {k} from {peer} under tag {tag}"
        );
    }

    bs.barrier().unwrap();
    for root in 0..n {
        let len = [0, 1, 1000, 300_000][root % 4];
        let mut data = if me == root {
            payload(root, 1, len)
        } else {
            vec![0xEE; 5]
        };
        bs.broadcast(root, &mut data).unwrap();
        assert_eq!(
            data,
            payload(root, 1, len),
            "broadcast from {root} on rank {me}"
        );
    }
    // Through the trait object, too.
    let dynbs: &dyn Bootstrap = bs;
    dynbs.barrier().unwrap();
    assert_eq!(dynbs.all_gather(&[1, 2]).unwrap().len(), n);
}

fn threads(n: usize) {
    let done = world(n, |_, bs| {
        let bs = bs.unwrap();
        exercise(&bs);
        bs.rank()
    });
    assert_eq!(done, (0..n).collect::<Vec<_>>());
}

#[test]
fn threads_2_ranks() {
    threads(2);
}

#[test]
fn threads_4_ranks() {
    threads(4);
}

#[test]
fn threads_8_ranks() {
    threads(8);
}

#[test]
fn one_rank_world_needs_no_network() {
    let bs = TcpBootstrap::init(BootstrapConfig::new(
        0,
        1,
        "127.0.0.1:1".parse::<SocketAddr>().unwrap(),
    ))
    .unwrap();
    assert_eq!(
        (bs.rank(), bs.size(), bs.local_rank(), bs.ranks_per_node()),
        (0, 1, 0, 1)
    );
    assert_eq!(bs.all_gather(b"x").unwrap(), vec![b"x".to_vec()]);
    bs.send(0, 3, b"self").unwrap();
    assert_eq!(bs.recv(0, 3).unwrap(), b"self");
    bs.barrier().unwrap();
    let mut d = b"keep".to_vec();
    bs.broadcast(0, &mut d).unwrap();
    assert_eq!(d, b"keep");
    // Deadlines saturate instead of overflowing.
    let forever = TcpBootstrap::init(
        BootstrapConfig::new(0, 1, "127.0.0.1:1".parse::<SocketAddr>().unwrap())
            .with_timeout(Duration::MAX),
    )
    .unwrap();
    forever.send(0, 1, b"now").unwrap();
    assert_eq!(forever.recv_timeout(0, 1, Duration::MAX).unwrap(), b"now");
    forever.barrier().unwrap();
}

#[test]
fn init_from_ip_port() {
    let root: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let out: Vec<Vec<Vec<u8>>> = thread::scope(|s| {
        let hs: Vec<_> = (0..3)
            .map(|r| {
                s.spawn(move || {
                    let bs = TcpBootstrap::init(
                        BootstrapConfig::new(r, 3, root).with_timeout(Duration::from_secs(20)),
                    )
                    .unwrap();
                    bs.all_gather(&[r as u8 * 10]).unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for g in out {
        assert_eq!(g, vec![vec![0], vec![10], vec![20]]);
    }
}

#[test]
fn nodes_follow_host_ids() {
    let ids = ["a", "b", "a", "b"];
    let got = world_of(
        4,
        &[0, 1, 2, 3],
        |c| {
            let r = c.rank;
            c.with_host_id(ids[r])
        },
        |_, bs| {
            let bs = bs.unwrap();
            (
                bs.local_rank(),
                bs.ranks_per_node(),
                bs.num_nodes(),
                (0..4).map(|r| bs.node_of(r).unwrap()).collect::<Vec<_>>(),
                bs.ranks_on_node(1).to_vec(),
            )
        },
    );
    let local: Vec<usize> = got.iter().map(|g| g.0).collect();
    assert_eq!(local, vec![0, 0, 1, 1]);
    for g in &got {
        assert_eq!((g.1, g.2), (2, 2));
        assert_eq!(g.3, vec![0, 1, 0, 1]);
        assert_eq!(g.4, vec![1, 3]);
    }
}

#[test]
fn interface_selection() {
    assert_eq!(interface_ipv4("lo").unwrap(), std::net::Ipv4Addr::LOCALHOST);
    assert_eq!(
        interface_ipv4("no-such-if0,lo").unwrap(),
        std::net::Ipv4Addr::LOCALHOST
    );
    assert!(matches!(
        interface_ipv4("no-such-if0"),
        Err(Error::BootstrapInterface { .. })
    ));

    let addrs = world_of(
        2,
        &[0, 1],
        |c| c.with_ifname("lo"),
        |_, bs| bs.unwrap().peer_addr(1).unwrap(),
    );
    assert!(addrs.iter().all(|a| a.ip().is_loopback()));

    let (id, _listener) = UniqueId::bind(loopback()).unwrap();
    let e =
        TcpBootstrap::init(BootstrapConfig::new(1, 2, id).with_ifname("no-such-if0")).unwrap_err();
    assert!(matches!(e, Error::BootstrapInterface { .. }), "{e}");
}

#[test]
fn argument_errors_and_timeouts_name_the_peer() {
    world(2, |me, bs| {
        let bs = bs.unwrap();
        let other = 1 - me;
        assert!(matches!(
            bs.send(5, 0, b"x"),
            Err(Error::BootstrapInvalidPeer {
                peer: 5,
                size: 2,
                ..
            })
        ));
        assert!(matches!(
            bs.recv(2, 0),
            Err(Error::BootstrapInvalidPeer { .. })
        ));
        assert!(matches!(
            bs.broadcast(9, &mut Vec::new()),
            Err(Error::BootstrapInvalidPeer { .. })
        ));

        let t0 = Instant::now();
        let e = bs
            .recv_timeout(other, 42, Duration::from_millis(300))
            .unwrap_err();
        let waited = t0.elapsed();
        match &e {
            Error::BootstrapTimeout {
                rank,
                peer,
                op,
                after,
            } => {
                assert_eq!(
                    (*rank, peer.rank, *op, *after),
                    (me, Some(other), "recv", Duration::from_millis(300))
                );
            }
            other => panic!("expected a timeout, got {other}"),
        }
        assert!(
            waited >= Duration::from_millis(300) && waited < Duration::from_secs(3),
            "{waited:?}"
        );
        assert!(e.to_string().contains(&format!("rank {other}")), "{e}");

        // Unequal all-gather contributions are refused, naming the other rank.
        let e = bs.all_gather(&vec![0u8; 4 * (me + 1)]).unwrap_err();
        assert!(
            matches!(&e, Error::BootstrapMalformed { peer, .. } if peer.rank == Some(other)),
            "{e}"
        );
    });
}

#[test]
fn closed_peer_fails_pending_and_later_receives_at_once() {
    let results = world(3, |me, bs| {
        let bs = bs.unwrap();
        bs.barrier().unwrap();
        match me {
            2 => {
                bs.send(0, 5, b"last words").unwrap();
                drop(bs); // closes its connections
                None
            }
            0 => {
                assert_eq!(
                    bs.recv(2, 5).unwrap(),
                    b"last words",
                    "queued before the close: still delivered"
                );
                let t0 = Instant::now();
                let e = bs.recv_timeout(2, 6, Duration::from_secs(15)).unwrap_err();
                let e2 = bs.recv_timeout(2, 6, Duration::from_secs(15)).unwrap_err();
                let e3 = bs.send(2, 6, b"anyone?").unwrap_err();
                // The survivors still talk.
                bs.send(1, 1, b"still here").unwrap();
                Some((t0.elapsed(), vec![e, e2, e3]))
            }
            _ => {
                let t0 = Instant::now();
                let e = bs.recv_timeout(2, 7, Duration::from_secs(15)).unwrap_err();
                assert_eq!(bs.recv(0, 1).unwrap(), b"still here");
                Some((t0.elapsed(), vec![e]))
            }
        }
    });
    for (waited, errors) in results.into_iter().flatten() {
        assert!(
            waited < Duration::from_secs(5),
            "closed peer noticed only after {waited:?}"
        );
        for e in errors {
            // Rank 0 holds a link to rank 2 and sees it close. Rank 1 has none (rank 2's tree
            // parent is rank 0): its receive opens one, which rank 2's closing bootstrap
            // either completes and then closes, or ends unanswered (gone), or refuses.
            assert!(
                matches!(&e, Error::BootstrapPeerClosed { peer, .. }
                    | Error::BootstrapPeerGone { peer, .. } if peer.rank == Some(2)),
                "{e}"
            );
        }
    }
}

fn names(e: &Error, rank: usize) -> bool {
    match e {
        Error::BootstrapPeerClosed { peer, .. }
        | Error::BootstrapTimeout { peer, .. }
        | Error::BootstrapConnect { peer, .. } => peer.rank == Some(rank),
        Error::BootstrapMissingRanks { missing, .. } => missing.contains(&rank),
        _ => false,
    }
}

#[test]
fn missing_rank_fails_everyone_within_the_timeout_naming_it() {
    let timeout = Duration::from_secs(2);
    let t0 = Instant::now();
    let errors = world_of(
        4,
        &[0, 1, 2],
        |c| c.with_timeout(timeout),
        |_, bs| bs.unwrap_err(),
    );
    let took = t0.elapsed();
    for e in &errors {
        assert!(names(e, 3), "error does not name rank 3: {e}");
        assert!(
            matches!(e, Error::BootstrapMissingRanks { missing, .. } if missing == &vec![3]),
            "{e}"
        );
    }
    assert!(took < timeout + Duration::from_secs(3), "took {took:?}");
}

#[test]
fn wrong_size_and_wrong_magic_ranks_are_refused() {
    let (id, listener) = UniqueId::bind(loopback()).unwrap();
    let timeout = Duration::from_secs(20);
    thread::scope(|s| {
        let root = s.spawn(move || {
            TcpBootstrap::init_with_root_listener(
                BootstrapConfig::new(0, 2, id).with_timeout(timeout),
                listener,
            )
        });
        let e =
            TcpBootstrap::init(BootstrapConfig::new(1, 3, id).with_timeout(timeout)).unwrap_err();
        assert!(
            matches!(&e, Error::BootstrapRejected { peer, .. } if peer.rank == Some(0)),
            "{e}"
        );
        let stranger = UniqueId::from_parts(id.root(), id.magic() ^ 1, *id.secret()).unwrap();
        let e = TcpBootstrap::init(BootstrapConfig::new(1, 2, stranger).with_timeout(timeout))
            .unwrap_err();
        assert!(matches!(&e, Error::BootstrapBadMagic { .. }), "{e}");
        // The right magic and address without the secret: the root's proof does not check
        // out, and the impostor gets nothing (not even a chance to send its own).
        let impostor =
            UniqueId::from_parts(id.root(), id.magic(), Secret::random().unwrap()).unwrap();
        let e = TcpBootstrap::init(BootstrapConfig::new(1, 2, impostor).with_timeout(timeout))
            .unwrap_err();
        assert!(
            matches!(&e, Error::BootstrapAuth { peer, .. } if peer.rank == Some(0)),
            "{e}"
        );
        // The root still serves the real rank 1.
        let bs1 = TcpBootstrap::init(BootstrapConfig::new(1, 2, id).with_timeout(timeout)).unwrap();
        let bs0 = root.join().unwrap().unwrap();
        thread::scope(|s2| {
            s2.spawn(|| bs0.barrier().unwrap());
            bs1.barrier().unwrap();
        });
    });
}

// ---- hostile connections ----

fn connect_send(addr: SocketAddr, bytes: &[u8]) -> TcpStream {
    let mut s = connect_retry(addr);
    s.write_all(bytes).unwrap();
    s
}

/// Reads until EOF (or `limit`): the REJECT the listener sent (after any other frames), if
/// any, and whether it closed.
fn answer(mut s: TcpStream, limit: Duration) -> (Option<Reject>, bool) {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    let closed = loop {
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(_) => break false,
        }
    };
    let mut reject = None;
    let mut at = 0;
    while got.len() >= at + wire::CONTROL_HEADER_LEN {
        let Ok(h) =
            ControlHeader::decode(got[at..at + wire::CONTROL_HEADER_LEN].try_into().unwrap())
        else {
            break;
        };
        let end = at + wire::CONTROL_HEADER_LEN + h.body_len as usize;
        if end > got.len() {
            break;
        }
        if h.kind == Kind::Reject.code() {
            reject = Reject::decode(&got[at + wire::CONTROL_HEADER_LEN..end]).ok();
        }
        at = end;
    }
    (reject, closed)
}

fn random_bytes(n: usize) -> Vec<u8> {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn with_version(mut frame: Vec<u8>, version: u32) -> Vec<u8> {
    frame[8..12].copy_from_slice(&version.to_le_bytes());
    frame
}

fn oversized_header(kind: Kind) -> Vec<u8> {
    ControlHeader {
        version: wire::VERSION,
        kind: kind.code(),
        body_len: u32::MAX,
    }
    .encode()
    .to_vec()
}

/// Sends the marker one byte every 300 ms on `s`: a slow drip must not outlive the handshake
/// deadline.
fn drip(mut s: TcpStream) -> thread::JoinHandle<Duration> {
    thread::spawn(move || {
        let t0 = Instant::now();
        for b in wire::MARKER.iter().chain(&[0u8; 16]) {
            if s.write_all(&[*b]).is_err() {
                break;
            }
            thread::sleep(Duration::from_millis(300));
            if t0.elapsed() > Duration::from_secs(10) {
                break;
            }
        }
        let (_, closed) = answer(s, Duration::from_secs(10));
        assert!(closed);
        t0.elapsed()
    })
}

#[test]
fn hostile_connections_on_the_root_port_are_rejected_while_ranks_join() {
    let (id, listener) = UniqueId::bind(loopback()).unwrap();
    let root = id.root();
    let hs = Duration::from_secs(2);
    let hello_with = |magic: u64, purpose: Purpose, rank: usize, size: usize| {
        Hello {
            magic,
            ..hello(&id, purpose, rank, wire::ROOT, size)
        }
        .encode()
    };

    // The hostile clients connect first; they wait in the root's backlog.
    let garbage = connect_send(root, &random_bytes(64));
    let wrong_magic = connect_send(root, &hello_with(id.magic() ^ 0xdead, Purpose::Join, 1, 3));
    let wrong_version = connect_send(
        root,
        &with_version(hello_with(id.magic(), Purpose::Join, 1, 3), 99),
    );
    let oversized = connect_send(root, &oversized_header(Kind::Hello));
    let wrong_kind = connect_send(root, &Proof { tag: [0; 32] }.encode());
    let wrong_purpose = connect_send(root, &hello_with(id.magic(), Purpose::Link, 1, 3));
    let wrong_size = connect_send(root, &hello_with(id.magic(), Purpose::Join, 1, 99));
    // Needs the root's CHALLENGE: runs while the ranks join (connected now, so that it is in
    // the backlog before the ranks start, however late its thread runs).
    let forger_conn = connect_retry(root);
    let forger = thread::spawn(move || forge(forger_conn, &id, Purpose::Join, (1, wire::ROOT, 3)));
    let silent = connect_retry(root);
    drop(connect_retry(root)); // connects and leaves at once
    let dripper = drip(connect_retry(root));

    let t0 = Instant::now();
    let listener = Mutex::new(Some(listener));
    // The bootstraps stay until the end: rank 0's root answers the forger's late JOIN (its
    // thread may run only after the world formed, on a loaded machine).
    let worlds: Vec<(TcpBootstrap, Vec<Vec<u8>>)> = thread::scope(|s| {
        let hs_list: Vec<_> = (0..3)
            .map(|r| {
                let listener = &listener;
                s.spawn(move || {
                    let c = BootstrapConfig::new(r, 3, id)
                        .with_timeout(Duration::from_secs(20))
                        .with_handshake_timeout(hs);
                    let root_listener = if r == 0 {
                        listener.lock().unwrap().take()
                    } else {
                        None
                    };
                    let bs = match root_listener {
                        Some(l) => TcpBootstrap::init_with_root_listener(c, l),
                        None => TcpBootstrap::init(c),
                    }
                    .unwrap();
                    let gathered = bs.all_gather(&[r as u8]).unwrap();
                    (bs, gathered)
                })
            })
            .collect();
        hs_list.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let setup = t0.elapsed();
    for (_, g) in &worlds {
        assert_eq!(g, &vec![vec![0], vec![1], vec![2]]);
    }
    assert!(
        setup < hs,
        "set-up took {setup:?}; hostile connections must not delay valid ranks"
    );

    let limit = Duration::from_secs(5);
    for (name, conn, code) in [
        ("random bytes", garbage, RejectCode::BadMarker),
        ("wrong magic", wrong_magic, RejectCode::BadMagic),
        ("wrong version", wrong_version, RejectCode::Version),
        ("oversized length", oversized, RejectCode::Malformed),
        ("wrong frame kind", wrong_kind, RejectCode::Unexpected),
        ("link at the root", wrong_purpose, RejectCode::Unexpected),
        ("wrong world size", wrong_size, RejectCode::Mismatch),
        ("forged JOIN", forger.join().unwrap(), RejectCode::Auth),
    ] {
        let (reject, closed) = answer(conn, limit);
        assert!(closed, "{name}: not closed");
        assert_eq!(reject.map(|r| r.code), Some(code), "{name}");
    }
    let t1 = Instant::now();
    let (_, closed) = answer(silent, limit);
    assert!(
        closed && t1.elapsed() < hs + Duration::from_secs(1),
        "silent connection still open after {:?}",
        t1.elapsed()
    );
    let dripped = dripper.join().unwrap();
    assert!(
        dripped < hs + Duration::from_secs(2),
        "dripping connection lasted {dripped:?}"
    );
    drop(worlds);
}

#[test]
fn hostile_connections_on_a_rank_listener_are_rejected_while_the_mesh_forms() {
    let (id, listener) = UniqueId::bind(loopback()).unwrap();
    let rank1: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let hs = Duration::from_secs(2);
    let config = move |r: usize| {
        let c = BootstrapConfig::new(r, 3, id)
            .with_timeout(Duration::from_secs(20))
            .with_handshake_timeout(hs);
        if r == 1 { c.with_listen(rank1) } else { c }
    };
    thread::scope(|s| {
        let r0 =
            s.spawn(move || TcpBootstrap::init_with_root_listener(config(0), listener).unwrap());
        let r1 = s.spawn(move || TcpBootstrap::init(config(1)).unwrap());

        // Rank 1 listens (it cannot finish set-up before rank 2 exists); attack its listener.
        let m = id.magic();
        let link_hello = |magic: u64, purpose: Purpose, from: usize, to: usize| {
            Hello {
                magic,
                ..hello(&id, purpose, from, to, 3)
            }
            .encode()
        };
        let silent = connect_retry(rank1);
        let cases = [
            (
                "random bytes",
                connect_send(rank1, &random_bytes(100)),
                RejectCode::BadMarker,
            ),
            (
                "wrong magic",
                connect_send(rank1, &link_hello(m ^ 1, Purpose::Link, 2, 1)),
                RejectCode::BadMagic,
            ),
            (
                "wrong version",
                connect_send(
                    rank1,
                    &with_version(link_hello(m, Purpose::Link, 2, 1), wire::VERSION + 1),
                ),
                RejectCode::Version,
            ),
            (
                "oversized length",
                connect_send(rank1, &oversized_header(Kind::Hello)),
                RejectCode::Malformed,
            ),
            (
                "JOIN at a rank",
                connect_send(rank1, &link_hello(m, Purpose::Join, 2, 1)),
                RejectCode::Unexpected,
            ),
            (
                "wrong target",
                connect_send(rank1, &link_hello(m, Purpose::Link, 2, 0)),
                RejectCode::Mismatch,
            ),
            (
                "itself",
                connect_send(rank1, &link_hello(m, Purpose::Link, 1, 1)),
                RejectCode::Unexpected,
            ),
            (
                "forged proof",
                forged(rank1, &id, Purpose::Link, (2, 1, 3)),
                RejectCode::Auth,
            ),
        ];
        for (name, conn, code) in cases {
            let (reject, closed) = answer(conn, Duration::from_secs(5));
            assert!(closed, "{name}: not closed");
            assert_eq!(reject.map(|r| r.code), Some(code), "{name}");
        }

        // Now the last rank arrives; the mesh forms around the silent connection.
        let r2 = s.spawn(move || TcpBootstrap::init(config(2)).unwrap());
        let all = [r0.join().unwrap(), r1.join().unwrap(), r2.join().unwrap()];
        thread::scope(|s2| {
            for bs in &all {
                s2.spawn(move || {
                    assert_eq!(
                        bs.all_gather(&[bs.rank() as u8]).unwrap(),
                        vec![vec![0], vec![1], vec![2]]
                    )
                });
            }
        });
        let (_, closed) = answer(silent, hs + Duration::from_secs(1));
        assert!(closed, "the silent connection was left open");
    });
}

// ---- ranks as processes ----

const ROLE: &str = "MSCCLPP_BS_TEST_ROLE";
const EXPECT: &str = "MSCCLPP_BS_TEST_EXPECT";
const CHILD_TEST: &str = "child_process_entry";

/// The body of a child process, started by its parent test with `--ignored --exact` (so a
/// normal run does not count it as a test).
#[test]
#[ignore = "child-process entry point, run by its parent test"]
fn child_process_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        eprintln!(
            "NOT RUN: child_process_entry is a child-process entry point; its parent test runs it"
        );
        return;
    };
    let expect = std::env::var(EXPECT).unwrap_or_default();
    let report = |bs: BsResult| {
        if let Some(k) = expect.strip_prefix("fail-naming:") {
            let k: usize = k.parse().unwrap();
            let e = bs.unwrap_err();
            assert!(names(&e, k), "error does not name rank {k}: {e}");
            println!("CHILD_FAILED_NAMING {k}: {e}");
        } else {
            let bs = bs.unwrap();
            exercise(&bs);
            println!("CHILD_OK {}", bs.rank());
        }
    };
    match role.as_str() {
        "root" => {
            let (id, listener) = UniqueId::bind(loopback()).unwrap();
            println!("UNIQUE_ID {id}");
            std::io::stdout().flush().unwrap();
            let mut vars: HashMap<String, String> = std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
                .collect();
            vars.insert("MSCCLPP_UNIQUE_ID".into(), id.to_hex());
            let cfg = BootstrapConfig::from_vars(&vars).unwrap();
            report(TcpBootstrap::init_with_root_listener(cfg, listener));
        }
        "rank" => report(TcpBootstrap::init(BootstrapConfig::from_env().unwrap())),
        "die-after-join" => {
            // Joins at the root like a real rank, says so, and waits to be killed.
            let cfg = BootstrapConfig::from_env().unwrap();
            let id = cfg.session().unwrap();
            let _s = join_by_hand(&id, cfg.rank, cfg.size, "127.0.0.1:9".parse().unwrap());
            println!("JOINED");
            std::io::stdout().flush().unwrap();
            thread::sleep(Duration::from_secs(60));
        }
        other => panic!("unknown role {other}"),
    }
}

const LAUNCHER_VARS: [&str; 17] = [
    "MSCCLPP_UNIQUE_ID",
    "MSCCLPP_BOOTSTRAP",
    "MSCCLPP_LOCAL_RANK",
    "MSCCLPP_SOCKET_IFNAME",
    "MSCCLPP_HOSTID",
    "MSCCLPP_BOOTSTRAP_OP_TIMEOUT_MS",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
];

/// How long a child may take to print an awaited line, and to exit once awaited.
const CHILD_LINE: Duration = Duration::from_secs(20);
const CHILD_EXIT: Duration = Duration::from_secs(30);

/// This test binary running [`CHILD_TEST`] as `role` (the harness's bounded child process),
/// with none of the launchers' variables of the caller's.
fn spawn_child(
    role: &str,
    rank: usize,
    size: usize,
    expect: &str,
    id: Option<&UniqueId>,
    timeout_ms: u64,
) -> Child {
    let mut p = TestProcess::new(CHILD_TEST).named(format!("{role} rank {rank}"));
    for v in LAUNCHER_VARS {
        p = p.env_remove(v);
    }
    p = p
        .env(ROLE, role)
        .env(EXPECT, expect)
        .env("MSCCLPP_RANK", rank.to_string())
        .env("MSCCLPP_WORLD_SIZE", size.to_string())
        .env("MSCCLPP_BOOTSTRAP_TIMEOUT_MS", timeout_ms.to_string());
    if let Some(id) = id {
        p = p.env("MSCCLPP_UNIQUE_ID", id.to_hex());
    }
    p.spawn()
}

/// Waits (at most [`CHILD_EXIT`]) for a clean exit; returns the child's output.
fn finish(c: Child) -> String {
    let end = c.wait_until(Instant::now() + CHILD_EXIT);
    assert!(end.success(), "{}", end.text());
    end.output()
}

fn processes(n: usize) {
    let root = spawn_child("root", 0, n, "ok", None, 20_000);
    let id: UniqueId = root
        .read_line_with("UNIQUE_ID ", CHILD_LINE)
        .parse()
        .unwrap();
    let others: Vec<Child> = (1..n)
        .map(|r| spawn_child("rank", r, n, "ok", Some(&id), 20_000))
        .collect();
    for (r, c) in std::iter::once(root).chain(others).enumerate() {
        let out = finish(c);
        assert!(
            out.contains(&format!("CHILD_OK {r}")),
            "rank {r} output:\n{out}"
        );
    }
}

#[test]
fn processes_2_ranks() {
    processes(2);
}

#[test]
fn processes_4_ranks() {
    processes(4);
}

#[test]
fn process_killed_after_joining_fails_the_others_naming_it() {
    let timeout_ms = 5_000;
    let t0 = Instant::now();
    let root = spawn_child("root", 0, 4, "fail-naming:3", None, timeout_ms);
    let id: UniqueId = root
        .read_line_with("UNIQUE_ID ", CHILD_LINE)
        .parse()
        .unwrap();
    let mut doomed = spawn_child("die-after-join", 3, 4, "", Some(&id), timeout_ms);
    doomed.read_line_with("JOINED", CHILD_LINE);
    doomed.kill();
    let killed = doomed.wait_for(CHILD_EXIT);
    assert!(!killed.status.success(), "{}", killed.text());
    let others: Vec<Child> = (1..3)
        .map(|r| spawn_child("rank", r, 4, "fail-naming:3", Some(&id), timeout_ms))
        .collect();
    for c in std::iter::once(root).chain(others) {
        let out = finish(c);
        assert!(out.contains("CHILD_FAILED_NAMING 3"), "output:\n{out}");
    }
    assert!(
        t0.elapsed() < Duration::from_millis(timeout_ms) + Duration::from_secs(10),
        "took {:?}",
        t0.elapsed()
    );
}

// ---- pure parts ----

#[test]
fn unique_id_round_trips_and_rejects_malformed_input() {
    let a = UniqueId::new("10.1.2.3:29500".parse().unwrap()).unwrap();
    let b = UniqueId::new("10.1.2.3:29500".parse().unwrap()).unwrap();
    assert_ne!(a.magic(), b.magic(), "magics are random");
    assert_ne!(a.secret(), b.secret(), "secrets are random");
    assert!(a.is_authenticated());
    assert!(!format!("{a:?}").contains(&format!("{:02x}", a.secret().to_bytes()[0]).repeat(2)));
    assert_eq!(a.root(), "10.1.2.3:29500".parse().unwrap());

    let hex = a.to_hex();
    assert_eq!(hex.len(), 144);
    assert!(
        hex.bytes()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
    );
    assert_eq!(UniqueId::from_hex(&hex).unwrap(), a);
    assert_eq!(
        UniqueId::from_hex(&format!("  {}\n", hex.to_uppercase())).unwrap(),
        a
    );
    assert_eq!(hex.parse::<UniqueId>().unwrap(), a);
    assert_eq!(a.to_string(), hex);
    assert_eq!(UniqueId::from_bytes(&a.to_bytes()).unwrap(), a);
    let v6 = UniqueId::new("[fe80::1]:7".parse().unwrap()).unwrap();
    assert_eq!(UniqueId::from_hex(&v6.to_hex()).unwrap(), v6);

    let bad_hex = |s: &str| matches!(UniqueId::from_hex(s), Err(Error::BootstrapUniqueId { .. }));
    assert!(bad_hex(""));
    assert!(bad_hex(&hex[..142]));
    assert!(bad_hex(&format!("{hex}00")));
    assert!(bad_hex(&format!("g{}", &hex[1..])));
    assert!(bad_hex(&format!("{}é", &hex[..142])));

    let bytes = a.to_bytes();
    let bad_bytes = |f: &dyn Fn(&mut [u8; 72])| {
        let mut b = bytes;
        f(&mut b);
        matches!(
            UniqueId::from_bytes(&b),
            Err(Error::BootstrapUniqueId { .. })
        )
    };
    assert!(bad_bytes(&|b| b[0] = 1)); // format 1 (no secret)
    assert!(bad_bytes(&|b| b[1] = 2)); // unknown flag
    assert!(bad_bytes(&|b| b[3] = 1)); // reserved
    assert!(bad_bytes(&|b| b[16] = 5)); // address family
    assert!(bad_bytes(&|b| b[16 + 24 - 1] = 1)); // IPv4 with a scope id
    assert!(bad_bytes(&|b| b[18..20].copy_from_slice(&[0, 0]))); // port 0
    assert!(UniqueId::from_bytes(&bytes[..71]).is_err());
    let mut other_secret = bytes;
    other_secret[50] ^= 1;
    assert_ne!(UniqueId::from_bytes(&other_secret).unwrap(), a);

    assert!(UniqueId::new("10.0.0.1:0".parse().unwrap()).is_err());
    assert!(UniqueId::new("0.0.0.0:5000".parse().unwrap()).is_err());
    assert!(matches!(
        UniqueId::bind("0.0.0.0:0".parse().unwrap()),
        Err(Error::BootstrapConfig(_))
    ));

    let addr: SocketAddr = "10.0.0.1:5000".parse().unwrap();
    assert_eq!(
        UniqueId::for_addr(addr).unwrap(),
        UniqueId::for_addr(addr).unwrap()
    );
    assert_ne!(
        UniqueId::for_addr(addr).unwrap().magic(),
        UniqueId::for_addr("10.0.0.1:5001".parse().unwrap())
            .unwrap()
            .magic()
    );
    // A plain address: authenticated only with a secret, which changes nothing else.
    let open = UniqueId::for_addr(addr).unwrap();
    assert!(!open.is_authenticated());
    let k = Secret::random().unwrap();
    let shut = UniqueId::for_addr_with_secret(addr, k).unwrap();
    assert!(shut.is_authenticated());
    assert_eq!((shut.magic(), shut.root()), (open.magic(), open.root()));
    assert_ne!(shut.secret(), open.secret());
    assert_eq!(UniqueId::from_hex(&open.to_hex()).unwrap(), open);
    assert_eq!(
        BootstrapConfig::new(1, 2, addr)
            .with_secret(k)
            .session()
            .unwrap(),
        shut
    );
}

fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn parse(pairs: &[(&str, &str)]) -> mscclpp_host::Result<BootstrapConfig> {
    BootstrapConfig::from_vars(&vars(pairs))
}

fn config_error(pairs: &[(&str, &str)]) -> bool {
    matches!(parse(pairs), Err(Error::BootstrapConfig(_)))
}

#[test]
fn environment_of_each_launcher() {
    let addr = |s: &str| RootSpec::Addr(s.parse().unwrap());

    let c = parse(&[
        ("MSCCLPP_RANK", "2"),
        ("MSCCLPP_WORLD_SIZE", "4"),
        ("MSCCLPP_LOCAL_RANK", "1"),
        ("MSCCLPP_BOOTSTRAP", "10.0.0.1:5000"),
        ("MSCCLPP_BOOTSTRAP_TIMEOUT_MS", "1500"),
        ("MSCCLPP_SOCKET_IFNAME", "eth0"),
        ("MSCCLPP_HOSTID", "node-a"),
    ])
    .unwrap();
    assert_eq!(
        (c.rank, c.size, c.launcher, c.launcher_local_rank),
        (2, 4, Launcher::Mscclpp, Some(1))
    );
    assert_eq!(c.root, addr("10.0.0.1:5000"));
    assert_eq!(
        (c.timeout, c.op_timeout),
        (Duration::from_millis(1500), Duration::from_millis(1500))
    );
    assert_eq!(
        (c.ifname.as_deref(), c.host_id.as_deref()),
        (Some("eth0"), Some("node-a"))
    );
    assert_eq!(c.secret, None);
    assert!(!c.session().unwrap().is_authenticated());

    // A secret for a plain address, and the queue caps.
    let c = parse(&[
        ("MSCCLPP_RANK", "0"),
        ("MSCCLPP_WORLD_SIZE", "2"),
        ("MSCCLPP_BOOTSTRAP", "10.0.0.1:5000"),
        ("MSCCLPP_SECRET", "correct horse battery staple"),
        ("MSCCLPP_BOOTSTRAP_MAX_QUEUED_BYTES", "1000"),
        ("MSCCLPP_BOOTSTRAP_MAX_QUEUED_FRAMES", "7"),
        ("MSCCLPP_BOOTSTRAP_MAX_PROCESS_QUEUED_BYTES", "5000"),
    ])
    .unwrap();
    assert_eq!(c.secret, None);
    assert_eq!(
        c.passphrase,
        Passphrase::new("correct horse battery staple")
    );
    // Its key is derived at set-up (the root's job nonce): no unique id stands for it.
    assert!(matches!(c.session(), Err(Error::BootstrapConfig(_))));
    assert!(matches!(
        c.clone().with_secret(Secret::random().unwrap()).validate(),
        Err(Error::BootstrapConfig(_))
    ));
    assert_eq!((c.max_queued_bytes, c.max_queued_frames), (1000, 7));
    assert_eq!(c.max_process_queued_bytes, 5000);
    assert!(config_error(&[
        ("MSCCLPP_RANK", "0"),
        ("MSCCLPP_WORLD_SIZE", "2"),
        ("MSCCLPP_BOOTSTRAP", "10.0.0.1:5000"),
        ("MSCCLPP_SECRET", "too short"),
    ]));
    assert!(config_error(&[
        ("MSCCLPP_RANK", "0"),
        ("MSCCLPP_WORLD_SIZE", "2"),
        ("MSCCLPP_BOOTSTRAP", "10.0.0.1:5000"),
        ("MSCCLPP_BOOTSTRAP_MAX_QUEUED_FRAMES", "0"),
    ]));

    // torchrun: the root listens one port above torchrun's own store.
    let c = parse(&[
        ("RANK", "3"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "3"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29500"),
    ])
    .unwrap();
    assert_eq!(
        (c.rank, c.size, c.launcher, c.launcher_local_rank),
        (3, 8, Launcher::Torchrun, Some(3))
    );
    assert_eq!(c.root, addr("127.0.0.1:29501"));
    assert_eq!(c.timeout, mscclpp_host::bootstrap::DEFAULT_TIMEOUT);

    // Open MPI with a unique id.
    let id = UniqueId::new("192.168.0.7:4000".parse().unwrap()).unwrap();
    let hex = id.to_hex();
    let c = parse(&[
        ("OMPI_COMM_WORLD_RANK", "5"),
        ("OMPI_COMM_WORLD_SIZE", "6"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ("MSCCLPP_UNIQUE_ID", &hex),
    ])
    .unwrap();
    assert_eq!(
        (c.rank, c.size, c.launcher, c.launcher_local_rank),
        (5, 6, Launcher::OpenMpi, Some(1))
    );
    assert_eq!(c.root, RootSpec::UniqueId(id));

    // Slurm with MSCCL++'s "interface:ip:port" form.
    let c = parse(&[
        ("SLURM_PROCID", "1"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_LOCALID", "0"),
        ("MSCCLPP_BOOTSTRAP", "eth1:192.168.1.2:7000"),
    ])
    .unwrap();
    assert_eq!(
        (c.rank, c.size, c.launcher, c.launcher_local_rank),
        (1, 2, Launcher::Slurm, Some(0))
    );
    assert_eq!(
        (c.root, c.ifname.as_deref()),
        (addr("192.168.1.2:7000"), Some("eth1"))
    );

    // Precedence: MSCCLPP_* over torchrun over MPI over Slurm; unique id over address;
    // MSCCLPP_SOCKET_IFNAME over the interface in MSCCLPP_BOOTSTRAP.
    let c = parse(&[
        ("MSCCLPP_RANK", "0"),
        ("MSCCLPP_WORLD_SIZE", "2"),
        ("RANK", "1"),
        ("WORLD_SIZE", "9"),
        ("SLURM_PROCID", "3"),
        ("SLURM_NTASKS", "4"),
        ("MSCCLPP_UNIQUE_ID", &hex),
        ("MSCCLPP_BOOTSTRAP", "ib0:10.0.0.1:5000"),
        ("MASTER_ADDR", "10.9.9.9"),
        ("MASTER_PORT", "1"),
        ("MSCCLPP_SOCKET_IFNAME", "eth3"),
        ("MSCCLPP_BOOTSTRAP_TIMEOUT_MS", "1000"),
        ("MSCCLPP_BOOTSTRAP_OP_TIMEOUT_MS", "9000"),
    ])
    .unwrap();
    assert_eq!((c.rank, c.size, c.launcher), (0, 2, Launcher::Mscclpp));
    assert_eq!(
        (c.root, c.ifname.as_deref()),
        (RootSpec::UniqueId(id), Some("eth3"))
    );
    assert_eq!(
        (c.timeout, c.op_timeout),
        (Duration::from_secs(1), Duration::from_secs(9))
    );
    let c = parse(&[
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "4"),
        ("MSCCLPP_BOOTSTRAP", "[::1]:6000"),
    ])
    .unwrap();
    assert_eq!(
        (c.rank, c.size, c.launcher, c.root),
        (1, 2, Launcher::Torchrun, addr("[::1]:6000"))
    );
    let c = parse(&[
        ("MSCCLPP_RANK", "0"),
        ("MSCCLPP_WORLD_SIZE", "1"),
        ("MSCCLPP_BOOTSTRAP", "localhost:5000"),
    ])
    .unwrap();
    assert!(c.root.addr().ip().is_loopback() && c.root.addr().port() == 5000);

    // Errors.
    assert!(config_error(&[]));
    assert!(config_error(&[("MSCCLPP_BOOTSTRAP", "10.0.0.1:5000")]));
    assert!(config_error(&[
        ("RANK", "1"),
        ("MSCCLPP_BOOTSTRAP", "10.0.0.1:5000")
    ]));
    assert!(config_error(&[
        ("RANK", "x"),
        ("WORLD_SIZE", "2"),
        ("MSCCLPP_BOOTSTRAP", "10.0.0.1:5000")
    ]));
    assert!(config_error(&[
        ("RANK", "-1"),
        ("WORLD_SIZE", "2"),
        ("MSCCLPP_BOOTSTRAP", "10.0.0.1:5000")
    ]));
    assert!(config_error(&[
        ("RANK", "2"),
        ("WORLD_SIZE", "2"),
        ("MSCCLPP_BOOTSTRAP", "10.0.0.1:5000")
    ]));
    assert!(config_error(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "0"),
        ("MSCCLPP_BOOTSTRAP", "10.0.0.1:5000")
    ]));
    assert!(config_error(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("LOCAL_RANK", "2"),
        ("MSCCLPP_BOOTSTRAP", "10.0.0.1:5000")
    ]));
    assert!(config_error(&[("RANK", "0"), ("WORLD_SIZE", "2")]));
    assert!(config_error(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "10.0.0.1")
    ]));
    assert!(config_error(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "65535")
    ]));
    assert!(config_error(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "http")
    ]));
    assert!(config_error(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MSCCLPP_BOOTSTRAP", "not an address")
    ]));
    assert!(config_error(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MSCCLPP_BOOTSTRAP", "10.0.0.1:0")
    ]));
    assert!(config_error(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MSCCLPP_BOOTSTRAP", "10.0.0.1:5000"),
        ("MSCCLPP_BOOTSTRAP_TIMEOUT_MS", "0")
    ]));
    assert!(config_error(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MSCCLPP_BOOTSTRAP", "10.0.0.1:5000"),
        ("MSCCLPP_BOOTSTRAP_TIMEOUT_MS", "soon")
    ]));
    assert!(matches!(
        parse(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MSCCLPP_UNIQUE_ID", "abcd")
        ]),
        Err(Error::BootstrapUniqueId { .. })
    ));
}

// ---- a rank claimed by another process ----

/// In a world without a secret (a plain root address, no `MSCCLPP_SECRET`), a process that
/// joins as rank 1 first shuts the real rank 1 out. The real one fails at once saying that
/// another process claimed its rank: while the world is still forming (the root refuses a
/// second JOIN) and after it formed without it (the root keeps answering late JOINs), where it
/// used to find the root's port closed and fail with "connect to the root timed out".
#[test]
fn a_rank_shut_out_by_an_impostor_is_told_that_its_rank_was_claimed() {
    let timeout = Duration::from_secs(8);
    let claimed = |e: &Error| match e {
        Error::BootstrapRankTaken {
            rank: 1,
            peer,
            reason,
        } => {
            peer.rank == Some(0)
                && reason.contains("no secret")
                && reason.contains("MSCCLPP_SECRET")
        }
        _ => false,
    };

    // Forming: a world of 3 whose rank 2 never comes; the impostor joins as rank 1 by hand
    // (anyone can compute the handshake of a world without a secret).
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let open = UniqueId::for_addr(addr).unwrap();
    thread::scope(|s| {
        let root = s.spawn(move || {
            TcpBootstrap::init(
                BootstrapConfig::new(0, 3, addr).with_timeout(Duration::from_secs(4)),
            )
        });
        let _impostor = join_by_hand(&open, 1, 3, "127.0.0.1:9".parse().unwrap());
        let t0 = Instant::now();
        let e =
            TcpBootstrap::init(BootstrapConfig::new(1, 3, addr).with_timeout(timeout)).unwrap_err();
        println!("CLAIMED while forming, after {:?}: {e}", t0.elapsed());
        assert!(claimed(&e), "{e}");
        assert!(t0.elapsed() < timeout / 2, "took {:?}", t0.elapsed());
        assert!(root.join().unwrap().is_err(), "rank 2 never came");
    });

    // Formed: the impostor runs the library as rank 1 of a world of 2; the world forms with
    // it; the real rank 1 comes late.
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let cfg = move |r: usize| BootstrapConfig::new(r, 2, addr).with_timeout(timeout);
    thread::scope(|s| {
        let root = s.spawn(move || TcpBootstrap::init(cfg(0)).unwrap());
        let impostor = TcpBootstrap::init(cfg(1)).unwrap();
        let root = root.join().unwrap();
        let t0 = Instant::now();
        let e = TcpBootstrap::init(cfg(1)).unwrap_err();
        println!(
            "CLAIMED after the world formed, after {:?}: {e}",
            t0.elapsed()
        );
        assert!(claimed(&e), "{e}");
        assert!(e.to_string().contains("formed without this process"), "{e}");
        assert!(t0.elapsed() < timeout / 2, "took {:?}", t0.elapsed());
        // The world itself is unharmed.
        thread::scope(|s2| {
            s2.spawn(|| impostor.barrier().unwrap());
            root.barrier().unwrap();
        });
    });
}

// ---- passphrases (MSCCLPP_SECRET) ----

const PASSPHRASE: &str = "6e1f0b3c2a9d4e5f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f";

/// A world started with a passphrase sets up (every rank derives the key from the root's job
/// nonce); a rank with another passphrase is refused, and the root still serves the real one.
#[test]
fn a_passphrase_world_sets_up_and_a_wrong_passphrase_is_refused() {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let right = Passphrase::new(PASSPHRASE).unwrap();
    let wrong = Passphrase::new("this passphrase is long but it is the wrong one").unwrap();
    let cfg = |r: usize, p: &Passphrase| {
        BootstrapConfig::new(r, 3, addr)
            .with_timeout(Duration::from_secs(30))
            .with_passphrase(p.clone())
    };
    let (right, cfg) = (&right, &cfg);
    thread::scope(|s| {
        let root = s.spawn(move || TcpBootstrap::init(cfg(0, right)).unwrap());
        let e = TcpBootstrap::init(cfg(1, &wrong)).unwrap_err();
        assert!(
            matches!(&e, Error::BootstrapAuth { peer, .. } if peer.rank == Some(0)),
            "{e}"
        );
        let others: Vec<_> = (1..3)
            .map(|r| s.spawn(move || TcpBootstrap::init(cfg(r, right)).unwrap()))
            .collect();
        let all: Vec<TcpBootstrap> = std::iter::once(root)
            .chain(others)
            .map(|h| h.join().unwrap())
            .collect();
        // Every rank holds the same key (the Ethernet transport's), and it is not the public
        // one of a world without a secret.
        let key = all[0].secret().unwrap();
        assert!(all.iter().all(|b| b.secret() == Some(key)));
        assert_ne!(
            Some(key),
            UniqueId::for_addr(addr).ok().map(|i| *i.secret())
        );
        thread::scope(|s2| {
            for bs in &all {
                s2.spawn(move || {
                    assert_eq!(
                        bs.all_gather(&[bs.rank() as u8, 0xA5]).unwrap(),
                        vec![vec![0, 0xA5], vec![1, 0xA5], vec![2, 0xA5]]
                    )
                });
            }
        });
    });
}

/// What an outsider gets from a passphrase world: one CHALLENGE (anyone who reaches the port
/// can ask). Guessing the passphrase from it offline costs one Argon2id derivation per guess;
/// the rates (printed, not asserted) against the unsalted SHA-256 of protocol v3. Asserted:
/// the right guess checks out and the wrong ones do not; a key derived for another job nonce
/// or another address does not; a second world on the same address hands out another nonce.
#[test]
fn an_offline_guesser_pays_the_kdf_for_every_guess() {
    use hmac::{Hmac, Mac};
    use mscclpp_host::auth::{self, Nonce, Role};
    use mscclpp_host::bootstrap::passphrase_key;
    use sha2::{Digest, Sha256};

    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let right = Passphrase::new(PASSPHRASE).unwrap();
    let open = UniqueId::for_addr(addr).unwrap(); // its magic: anyone can compute it
    // Rank 0 of a world of 2 (rank 1 never comes): its root serves challenges meanwhile.
    let capture = || {
        let mut s = connect_retry(addr);
        let h = hello(&open, Purpose::Join, 1, wire::ROOT, 2);
        s.write_all(&h.encode()).unwrap();
        let (kind, body) = bootstrap_util::read_frame(&mut s);
        assert_eq!(kind, Kind::Challenge.code());
        (h, wire::Challenge::decode(&body).unwrap())
    };
    let start = || {
        let p = right.clone();
        thread::spawn(move || {
            let c = BootstrapConfig::new(0, 2, addr)
                .with_timeout(Duration::from_secs(3))
                .with_passphrase(p);
            TcpBootstrap::init(c).unwrap_err()
        })
    };
    let root = start();
    let (h, c) = capture();
    let checks = |key: &Secret| {
        auth::verify(
            key,
            Role::Acceptor,
            &wire::acceptor_context(&h.body(), &c.job),
            &h.nonce,
            &c.nonce,
            &c.tag,
        )
    };

    // Offline, with the KDF: a few wrong guesses, then the right one.
    let guesses: Vec<Passphrase> = (0..6)
        .map(|i| Passphrase::new(&format!("guess number {i} of the offline guesser")).unwrap())
        .chain(std::iter::once(right.clone()))
        .collect();
    let t0 = Instant::now();
    let found: Vec<bool> = guesses
        .iter()
        .map(|g| checks(&passphrase_key(g, addr, &c.job).unwrap()))
        .collect();
    let kdf_rate = guesses.len() as f64 / t0.elapsed().as_secs_f64();
    assert_eq!(found, [false, false, false, false, false, false, true]);

    // The same guesser against protocol v3's key (an unsalted SHA-256 of the passphrase,
    // keying the same HMAC): how fast it went before.
    let v3_key = |p: &str| {
        let mut d = Sha256::new();
        d.update(b"mscclpp-rs secret v1");
        d.update((p.len() as u64).to_le_bytes());
        d.update(p.as_bytes());
        Secret::from_bytes(d.finalize().into())
    };
    let n = 20_000;
    let t0 = Instant::now();
    let mut hits = 0;
    for i in 0..n {
        let k = v3_key(&format!("guess number {i} of the offline guesser"));
        let mut m = Hmac::<Sha256>::new_from_slice(&k.to_bytes()).unwrap();
        m.update(&c.tag);
        hits += usize::from(m.finalize().into_bytes()[0] == 0xFF);
    }
    let v3_rate = f64::from(n) / t0.elapsed().as_secs_f64();
    println!(
        "GUESSER: {kdf_rate:.1} guesses/s with Argon2id (m={} KiB, t={}), {v3_rate:.0} guesses/s against v3's SHA-256 key ({:.0}x fewer; debug build, one core; {hits})",
        auth::KDF_MEMORY_KIB,
        auth::KDF_PASSES,
        v3_rate / kdf_rate
    );

    // A key is worth one job of one address.
    let other_job = Nonce([0x5A; 32]);
    assert!(!checks(&passphrase_key(&right, addr, &other_job).unwrap()));
    let elsewhere: SocketAddr = format!("127.0.0.1:{}", addr.port() ^ 1).parse().unwrap();
    assert!(!checks(&passphrase_key(&right, elsewhere, &c.job).unwrap()));
    assert!(matches!(
        root.join().unwrap(),
        Error::BootstrapMissingRanks { .. }
    ));
    let root = start();
    let (_, again) = capture();
    assert_ne!(
        again.job, c.job,
        "a new world on the same address, the same job nonce"
    );
    assert!(!checks(&passphrase_key(&right, addr, &again.job).unwrap()));
    root.join().unwrap();
}

/// A rank of the previous protocol (v4: no keepalives; v3 had no job nonce either) is told
/// `REJECT Version` naming both versions; a rank of this one that meets a listener of the
/// previous one fails with `Error::BootstrapVersion` naming it (the header's layout never
/// changes).
#[test]
fn a_peer_of_the_previous_protocol_is_refused_with_both_versions_named() {
    assert_eq!(wire::VERSION, 5);
    let old = wire::VERSION - 1;
    let (id, listener) = UniqueId::bind(loopback()).unwrap();
    let root = thread::spawn(move || {
        let c = BootstrapConfig::new(0, 2, id).with_timeout(Duration::from_secs(3));
        TcpBootstrap::init_with_root_listener(c, listener).unwrap_err()
    });
    let v4 = with_version(hello(&id, Purpose::Join, 1, wire::ROOT, 2).encode(), old);
    let (reject, closed) = answer(connect_send(id.root(), &v4), Duration::from_secs(5));
    let reject = reject.expect("a REJECT");
    assert!(closed);
    assert_eq!(reject.code, RejectCode::Version);
    assert!(
        reject.reason.contains("version 4") && reject.reason.contains('5'),
        "{}",
        reject.reason
    );
    assert!(matches!(
        root.join().unwrap(),
        Error::BootstrapMissingRanks { .. }
    ));

    // A listener that speaks v4: it refuses our HELLO with a frame of its version.
    let fake = TcpListener::bind(loopback()).unwrap();
    let at = fake.local_addr().unwrap();
    let server = thread::spawn(move || {
        let (mut s, _) = fake.accept().unwrap();
        let mut hello = vec![0u8; wire::CONTROL_HEADER_LEN + wire::HELLO_BODY_LEN];
        s.read_exact(&mut hello).unwrap();
        let r = Reject {
            code: RejectCode::Version,
            reason: "protocol version 5 is not this listener's 4".into(),
        };
        s.write_all(&with_version(r.encode(), old)).unwrap();
    });
    let id = UniqueId::new(at).unwrap();
    let e = TcpBootstrap::init(BootstrapConfig::new(1, 2, id).with_timeout(Duration::from_secs(5)))
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::BootstrapVersion {
                got: 4,
                want: 5,
                ..
            }
        ),
        "{e}"
    );
    server.join().unwrap();
}
