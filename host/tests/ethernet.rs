//! The Ethernet transport on the backend users would get (the CPU backend here; CUDA with
//! `MSCCLPP_BACKEND=cuda`), ranks as threads (and as processes) on 127.0.0.1: random writes
//! (1 byte, unaligned, larger than a chunk) checked byte for byte, update_and_sync ordered after
//! the data, flush; 2 and 4 ranks; sender-side range checks; hostile peers that speak the
//! protocol by hand (out-of-range, unknown, unregistered and misaligned destinations, garbage)
//! and are refused without a byte copied; peers that close, die or stall.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

mod bootstrap_util;

use bootstrap_util::Flood;
use mscclpp_host::Error;
use mscclpp_host::auth::{self, Nonce, Role, Secret};
use mscclpp_host::bootstrap::{Bootstrap, BootstrapConfig, TcpBootstrap, UniqueId};
use mscclpp_host::communicator::{Communicator, ENDPOINT_TAG};
use mscclpp_host::connection::ethernet::{
    CHUNK, EndpointInfo, Frame, HANDSHAKE_LEN, HEADER_LEN, Handshake, HandshakeKind,
    handshake_context,
};
use mscclpp_host::connection::{Connection, Endpoint, EndpointConfig};
use mscclpp_host::gpu::DeviceBuffer;
use mscclpp_host::transport::Transport;
use mscclpp_test_support::{gpu, ranks_as_threads as comm_world};

const TIMEOUT: Duration = Duration::from_secs(20);

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn config() -> EndpointConfig {
    let mut c = EndpointConfig::new(Transport::Ethernet);
    c.flush_timeout = TIMEOUT;
    c
}

fn bootstrap(
    r: usize,
    n: usize,
    id: UniqueId,
    root: Option<mscclpp_host::bootstrap::RootListener>,
) -> TcpBootstrap {
    let cfg = BootstrapConfig::new(r, n, id).with_timeout(Duration::from_secs(30));
    match root {
        Some(l) => TcpBootstrap::init_with_root_listener(cfg, l),
        None => TcpBootstrap::init(cfg),
    }
    .expect("bootstrap")
}

fn communicator(bs: TcpBootstrap) -> Communicator {
    let r = bs.rank();
    Communicator::new(Arc::new(bs), gpu(r)).unwrap()
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    (0..len).map(|_| r.next() as u8).collect()
}

fn read_all(buf: &DeviceBuffer) -> Vec<u8> {
    let mut v = vec![0u8; buf.len()];
    buf.copy_to_host(0, &mut v).unwrap();
    v
}

fn read_u64(buf: &DeviceBuffer, off: usize) -> u64 {
    let mut b = [0u8; 8];
    buf.copy_to_host(off, &mut b).unwrap();
    u64::from_le_bytes(b)
}

fn wait_u64(buf: &DeviceBuffer, off: usize, want: u64) {
    let deadline = Instant::now() + TIMEOUT;
    while read_u64(buf, off) != want {
        assert!(
            Instant::now() < deadline,
            "flag at {off} never became {want}"
        );
        thread::sleep(Duration::from_millis(1));
    }
}

/// (src_off, dst_off, size) of the writes one sender makes into a `slot`-byte region:
/// specials (1 byte, unaligned, exactly a chunk, more than a chunk, empty) then random ones.
fn schedule(seed: u64, src_len: u64, slot: u64) -> Vec<(u64, u64, u64)> {
    let mut r = Rng(seed | 1);
    let mut v = vec![
        (0, 0, 1),
        (3, slot - 1, 1),
        (5, 7, 13),
        (1, 9, CHUNK as u64),
        (7, 3, CHUNK as u64 + 12_345),
        (0, 0, 0),
    ];
    for _ in 0..40 {
        let size = match r.below(8) {
            0..=2 => 1 + r.below(16),
            3..=5 => 1 + r.below(4096),
            6 => 1 + r.below(256 << 10),
            _ => 1 + r.below(slot.min(src_len)),
        };
        v.push((r.below(src_len - size + 1), r.below(slot - size + 1), size));
    }
    v.retain(|&(s, d, n)| s + n <= src_len && d + n <= slot);
    v
}

/// What a `slot`-byte region holds after `schedule(seed)` writes from `src` into zeros.
fn model(src: &[u8], seed: u64, slot: u64) -> Vec<u8> {
    let mut m = vec![0u8; slot as usize];
    for (s, d, n) in schedule(seed, src.len() as u64, slot) {
        m[d as usize..(d + n) as usize].copy_from_slice(&src[s as usize..(s + n) as usize]);
    }
    m
}

const SRC_LEN: usize = (CHUNK * 2) + 1000;
const SLOT: u64 = (CHUNK as u64) * 2 + 4096 + 3;

fn seed_of(from: usize, to: usize) -> u64 {
    (from as u64 + 1) * 1000 + to as u64 + 17
}

/// Every rank writes `schedule(seed_of(me, p))` into its slot of every peer's buffer, signals
/// the peer's flag with update_and_sync, flushes; then checks its own buffer against the model
/// of every peer's writes, after the flag (so the data was there before the flag).
fn all_pairs(comm: &Communicator) {
    let (me, n) = (comm.rank(), comm.size());
    let gpu = comm.gpu();
    let src = gpu.alloc(SRC_LEN).unwrap();
    let src_bytes = pattern(SRC_LEN, me as u64 + 1);
    src.copy_from_host(0, &src_bytes).unwrap();
    let dst = gpu.alloc(SLOT as usize * n).unwrap();
    dst.copy_from_host(0, &vec![0u8; dst.len()]).unwrap();
    let flags = gpu.alloc(8 * n).unwrap();
    flags.copy_from_host(0, &vec![0u8; flags.len()]).unwrap();
    let src_reg = comm.register_buffer(&src, Transport::Ethernet).unwrap();
    let dst_reg = comm.register_buffer(&dst, Transport::Ethernet).unwrap();
    let flags_reg = comm.register_buffer(&flags, Transport::Ethernet).unwrap();

    let peers: Vec<usize> = (0..n).filter(|&p| p != me).collect();
    for &p in &peers {
        comm.send_memory(&dst_reg, p, 0).unwrap();
        comm.send_memory(&flags_reg, p, 1).unwrap();
    }
    let mut remote = Vec::new();
    for &p in &peers {
        let d = comm.recv_memory(p, 0).unwrap();
        let f = comm.recv_memory(p, 1).unwrap();
        remote.push((p, d, f));
    }
    let conns: Vec<Arc<dyn Connection>> = peers
        .iter()
        .map(|&p| comm.connect(config(), p, 0).unwrap())
        .collect();
    for (conn, (p, d, f)) in conns.iter().zip(&remote) {
        assert_eq!(
            (conn.transport(), conn.remote_rank()),
            (Transport::Ethernet, *p)
        );
        let base = me as u64 * SLOT;
        for (s, dd, size) in schedule(seed_of(me, *p), SRC_LEN as u64, SLOT) {
            conn.write(d, base + dd, &src_reg, s, size).unwrap();
        }
        let word = AtomicU64::new(0);
        conn.update_and_sync(f, 8 * me as u64, &word, 0xf1a9_0000 + me as u64)
            .unwrap();
        assert_eq!(
            word.load(std::sync::atomic::Ordering::Acquire),
            0xf1a9_0000 + me as u64
        );
        conn.flush(TIMEOUT).unwrap();
    }
    let got_all = |check_flags: bool| {
        if check_flags {
            for &p in &peers {
                wait_u64(&flags, 8 * p, 0xf1a9_0000 + p as u64);
            }
        }
        let all = read_all(&dst);
        for &p in &peers {
            let want = model(&pattern(SRC_LEN, p as u64 + 1), seed_of(p, me), SLOT);
            let at = p * SLOT as usize;
            let got = &all[at..at + SLOT as usize];
            if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
                panic!("rank {me}: slot of rank {p} differs at byte {i}");
            }
        }
    };
    got_all(true);
    comm.bootstrap().barrier().unwrap();
    // After every sender's flush (and the barrier), a second look must agree.
    got_all(false);
    assert_eq!(
        read_all(&dst)[me * SLOT as usize..][..SLOT as usize],
        vec![0u8; SLOT as usize][..]
    );
    comm.bootstrap().barrier().unwrap();
    drop(conns);
}

#[test]
fn two_ranks_random_writes() {
    comm_world(2, |c| all_pairs(&c));
}

#[test]
fn four_ranks_all_pairs() {
    comm_world(4, |c| all_pairs(&c));
}

#[test]
fn sender_refuses_bad_destinations_and_stays_usable() {
    comm_world(2, |comm| {
        let me = comm.rank();
        let peer = 1 - me;
        let gpu = comm.gpu();
        let buf = gpu.alloc(4096).unwrap();
        buf.copy_from_host(0, &vec![0u8; 4096]).unwrap();
        let shm_only = gpu.alloc(4096).unwrap();
        let reg = comm.register_buffer(&buf, Transport::Ethernet).unwrap();
        let shm_reg = comm.register_buffer(&shm_only, Transport::Shm).unwrap();
        comm.send_memory(&reg, peer, 0).unwrap();
        comm.send_memory(&shm_reg, peer, 1).unwrap();
        let theirs = comm.recv_memory(peer, 0).unwrap();
        let theirs_shm = comm.recv_memory(peer, 1).unwrap();
        let conn = comm.connect(config(), peer, 0).unwrap();
        let word = AtomicU64::new(0);
        let oor = |r: mscclpp_host::Result<()>| {
            assert!(matches!(r, Err(Error::OutOfRange { .. })), "{r:?}");
        };
        oor(conn.write(&theirs, 4000, &reg, 0, 97));
        oor(conn.write(&theirs, u64::MAX, &reg, 0, 2));
        oor(conn.write(&theirs, 0, &reg, 4090, 7));
        oor(conn.write(&theirs, 0, &reg, 1, u64::MAX));
        let mem = |r: mscclpp_host::Result<()>| match r {
            Err(Error::EthernetMemory { remote_rank, .. }) => assert_eq!(remote_rank, peer),
            other => panic!("{other:?}"),
        };
        mem(conn.write(&reg, 0, &reg, 0, 8)); // our own memory is not the peer's
        mem(conn.write(&theirs_shm, 0, &reg, 0, 8)); // not registered for Ethernet
        mem(conn.update_and_sync(&theirs, 4, &word, 1)); // misaligned
        oor(conn.update_and_sync(&theirs, 4096, &word, 1));
        assert_eq!(
            word.load(std::sync::atomic::Ordering::Relaxed),
            0,
            "refused update stored"
        );
        // Nothing was sent, so the connection still works.
        conn.update_and_sync(&theirs, 4088, &word, 7).unwrap();
        conn.flush(TIMEOUT).unwrap();
        comm.bootstrap().barrier().unwrap();
        assert_eq!(read_u64(&buf, 4088), 7);
        assert!(read_all(&buf)[..4088].iter().all(|&b| b == 0));
        comm.bootstrap().barrier().unwrap();
    });
}

#[test]
fn writes_to_a_dropped_registration_are_refused() {
    // Once the receiver refuses the frame both communicators are aborted on purpose, and an
    // aborted communicator's bootstrap refuses to wait (it returned `Aborted` in a CI run where
    // the abort landed before rank 0's barrier message): the ranks are threads, so they meet
    // at a plain thread barrier after that point.
    let after_refusal = std::sync::Barrier::new(2);
    comm_world(2, |comm| {
        let me = comm.rank();
        let peer = 1 - me;
        let buf = comm.gpu().alloc(1024).unwrap();
        buf.copy_from_host(0, &[0x5a; 1024]).unwrap();
        let mut reg = Some(comm.register_buffer(&buf, Transport::Ethernet).unwrap());
        comm.send_memory(reg.as_ref().unwrap(), peer, 0).unwrap();
        let theirs = comm.recv_memory(peer, 0).unwrap();
        let conn = comm.connect(config(), peer, 0).unwrap();
        if me == 1 {
            reg = None; // the buffer lives on, but peers may no longer write it
        }
        comm.bootstrap().barrier().unwrap();
        if me == 0 {
            conn.write(&theirs, 0, reg.as_ref().unwrap(), 0, 16)
                .unwrap();
            match conn.flush(TIMEOUT) {
                Err(Error::Remote { rank: 1, reason }) => {
                    assert!(reason.contains("not registered"), "{reason}");
                }
                other => panic!("{other:?}"),
            }
        }
        after_refusal.wait();
        if me == 1 {
            assert!(
                read_all(&buf).iter().all(|&b| b == 0x5a),
                "a refused write landed"
            );
            // The receiver refused the frame: sticky on this side too, and the rank aborted.
            assert!(matches!(
                conn.flush(TIMEOUT),
                Err(Error::EthernetProtocol { remote_rank: 0, .. })
            ));
            assert!(comm.status().is_aborted());
        }
    });
}

#[test]
fn peer_that_drops_its_connection_is_reported() {
    comm_world(2, |comm| {
        let me = comm.rank();
        let peer = 1 - me;
        let buf = comm.gpu().alloc(64).unwrap();
        let reg = comm.register_buffer(&buf, Transport::Ethernet).unwrap();
        comm.send_memory(&reg, peer, 0).unwrap();
        let theirs = comm.recv_memory(peer, 0).unwrap();
        let conn = comm.connect(config(), peer, 0).unwrap();
        conn.write(&theirs, 0, &reg, 0, 64).unwrap();
        conn.flush(TIMEOUT).unwrap();
        comm.bootstrap().barrier().unwrap();
        if me == 1 {
            drop(conn);
            comm.bootstrap().barrier().unwrap();
            // Stay until rank 0 has checked that its communicator is not aborted: a rank that
            // ends closes its bootstrap link, and a closed link does abort the survivor.
            comm.bootstrap().barrier().unwrap();
            return;
        }
        comm.bootstrap().barrier().unwrap();
        let t = Instant::now();
        let word = AtomicU64::new(0);
        let mut result = Ok(());
        while result.is_ok() && t.elapsed() < TIMEOUT {
            result = conn
                .update_and_sync(&theirs, 0, &word, 1)
                .and_then(|()| conn.flush(Duration::from_secs(2)));
        }
        match result {
            Err(Error::EthernetPeerClosed { remote_rank: 1, .. }) => {}
            other => panic!("{other:?}"),
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "took {:?}",
            t.elapsed()
        );
        // Sticky, and a goodbye does not abort the communicator.
        assert!(matches!(
            conn.write(&theirs, 0, &reg, 0, 1),
            Err(Error::EthernetPeerClosed { remote_rank: 1, .. })
        ));
        assert!(!comm.status().is_aborted());
        comm.bootstrap().barrier().unwrap();
    });
}

// ---- hostile peers: rank 1 speaks the protocol by hand ----

/// Rank 1's half of a connection, done by hand: endpoint through the bootstrap, then both
/// halves of the authenticated handshake. With `strays`, it first opens connections to rank
/// 0's listener that say garbage, a HELLO from a rank it does not wait for, a PROOF made with
/// another secret, and nothing at all; they are held open while the real handshake runs.
struct FakePeer {
    /// Rank 1 → rank 0 frames (and rank 0's answers back).
    out: TcpStream,
    /// Rank 0 → rank 1 frames.
    inbound: TcpStream,
    _strays: Vec<TcpStream>,
}

fn read_handshake(s: &mut TcpStream) -> Handshake {
    let mut b = [0u8; HANDSHAKE_LEN];
    s.read_exact(&mut b).unwrap();
    Handshake::decode(&b).unwrap()
}

/// The connector's half against rank 0's listener at `addr`, with `key`; the stream after the
/// PROOF, our nonce, and the CHALLENGE it answered.
fn prove_to_rank0(addr: SocketAddr, key: &Secret, context: &[u8]) -> (TcpStream, Nonce, Handshake) {
    let mut out = TcpStream::connect(addr).unwrap();
    out.set_read_timeout(Some(TIMEOUT)).unwrap();
    let ours = Nonce::random().unwrap();
    let hello = Handshake {
        nonce: ours.0,
        ..Handshake::new(HandshakeKind::Hello, 1, 0)
    };
    out.write_all(&hello.encode()).unwrap();
    let c = read_handshake(&mut out);
    assert_eq!((c.kind, c.from, c.to), (HandshakeKind::Challenge, 0, 1));
    let proof = Handshake {
        tag: auth::tag(key, Role::Connector, context, &ours, &Nonce(c.nonce)),
        ..Handshake::new(HandshakeKind::Proof, 1, 0)
    };
    out.write_all(&proof.encode()).unwrap();
    (out, ours, c)
}

fn fake_connect(bs: &TcpBootstrap, tag: u64, strays: bool) -> FakePeer {
    fake_connect_past(bs, tag, strays, 0, &|_| ())
}

/// [`fake_connect`], holding `silent` more connections that say nothing (opened first), and
/// calling `before` with rank 0's listener address before its own handshake.
fn fake_connect_past(
    bs: &TcpBootstrap,
    tag: u64,
    strays: bool,
    silent: usize,
    before: &dyn Fn(SocketAddr),
) -> FakePeer {
    let key = bs.secret().unwrap();
    let listener = TcpListener::bind(loopback()).unwrap();
    let my_token = 0x0123_4567_89ab_cdef_u64;
    let info = EndpointInfo {
        token: my_token,
        addrs: vec![listener.local_addr().unwrap()],
    };
    let mut extra = vec![0u8];
    extra.extend_from_slice(&info.encode());
    let mine = Endpoint {
        transport: Transport::Ethernet.bit(),
        rank: 1,
        pid: std::process::id(),
        device: 1,
        extra,
    };
    bs.send(0, ENDPOINT_TAG | tag, &mine.serialize()).unwrap();
    let theirs = Endpoint::deserialize(&bs.recv(0, ENDPOINT_TAG | tag).unwrap(), 0).unwrap();
    assert_eq!(theirs.extra[0], 0);
    let their = EndpointInfo::decode(&theirs.extra[1..]).unwrap();
    assert_eq!(
        their.addrs.len(),
        1,
        "one advertised address: the bound one"
    );
    assert!(!their.addrs[0].ip().is_unspecified());
    let addr = their.addrs[0];
    // Rank 1 connects to rank 0 (rank 1's tokens first), and rank 0 to rank 1.
    let out_ctx = handshake_context(1, 0, my_token, their.token);
    let in_ctx = handshake_context(0, 1, their.token, my_token);
    before(addr);
    let mut stray_conns: Vec<TcpStream> = (0..silent)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    if strays {
        let mut garbage = TcpStream::connect(addr).unwrap();
        garbage.write_all(&[0xee; HANDSHAKE_LEN]).unwrap();
        let mut wrong = TcpStream::connect(addr).unwrap();
        let bad = Handshake::new(HandshakeKind::Hello, 3, 0);
        wrong.write_all(&bad.encode()).unwrap();
        let (forged, ..) = prove_to_rank0(addr, &Secret::random().unwrap(), &out_ctx);
        let silent = TcpStream::connect(addr).unwrap();
        stray_conns.extend([garbage, wrong, forged, silent]);
    }
    let (mut out, nonce, c) = prove_to_rank0(addr, &key, &out_ctx);
    assert!(
        auth::verify(
            &key,
            Role::Acceptor,
            &out_ctx,
            &nonce,
            &Nonce(c.nonce),
            &c.tag
        ),
        "rank 0's proof does not check out"
    );
    // Rank 0's own connection: check its HELLO, challenge it, check its proof, accept.
    let (mut inbound, _) = listener.accept().unwrap();
    inbound.set_read_timeout(Some(TIMEOUT)).unwrap();
    let h = read_handshake(&mut inbound);
    assert_eq!((h.kind, h.from, h.to), (HandshakeKind::Hello, 0, 1));
    let ours = Nonce::random().unwrap();
    let challenge = Handshake {
        nonce: ours.0,
        tag: auth::tag(&key, Role::Acceptor, &in_ctx, &Nonce(h.nonce), &ours),
        ..Handshake::new(HandshakeKind::Challenge, 1, 0)
    };
    inbound.write_all(&challenge.encode()).unwrap();
    let p = read_handshake(&mut inbound);
    assert_eq!(p.kind, HandshakeKind::Proof);
    assert!(auth::verify(
        &key,
        Role::Connector,
        &in_ctx,
        &Nonce(h.nonce),
        &ours,
        &p.tag
    ));
    inbound
        .write_all(&Handshake::new(HandshakeKind::Accept, 1, 0).encode())
        .unwrap();
    // Rank 0 checked our proof: ACCEPT (the strays got nothing).
    let a = read_handshake(&mut out);
    assert_eq!((a.kind, a.from, a.to), (HandshakeKind::Accept, 0, 1));
    for s in &mut stray_conns {
        s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
    }
    FakePeer {
        out,
        inbound,
        _strays: stray_conns,
    }
}

/// Reads rank 0's answer on the fake's outbound stream: `Ok(seq)` for an ACK, `Err(reason)`
/// for an ERROR.
fn answer(out: &mut TcpStream) -> Result<u64, String> {
    let mut h = [0u8; HEADER_LEN];
    out.read_exact(&mut h).unwrap();
    match Frame::decode(&h).unwrap() {
        Frame::Ack { seq } => Ok(seq),
        Frame::Error { len } => {
            let mut r = vec![0u8; len as usize];
            out.read_exact(&mut r).unwrap();
            Err(String::from_utf8(r).unwrap())
        }
        f => panic!("unexpected {f:?}"),
    }
}

fn raw_header(op: u32, id: u32, a: u64, b: u64, c: u64) -> [u8; HEADER_LEN] {
    // The key word (at 32) stays 0.
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&op.to_le_bytes());
    h[4..8].copy_from_slice(&id.to_le_bytes());
    h[8..16].copy_from_slice(&a.to_le_bytes());
    h[16..24].copy_from_slice(&b.to_le_bytes());
    h[24..32].copy_from_slice(&c.to_le_bytes());
    h
}

/// Builds a hostile frame from (the Ethernet memory's id, a Shm-only memory's id, the Ethernet
/// memory's network key).
type HostileFrame = dyn Fn(u32, u32, u64) -> Vec<u8> + Sync;

/// A WRITE frame for memory `id` at `offset` with `len` bytes of 0xcc payload.
fn write_frame(id: u32, key: u64, offset: u64, len: u64) -> Vec<u8> {
    let mut v = Frame::Write {
        id,
        offset,
        len,
        key,
    }
    .encode()
    .to_vec();
    v.extend_from_slice(&vec![0xcc; len as usize]);
    v
}

#[test]
fn hostile_frames_are_refused_without_copying() {
    let (id, listener) = UniqueId::bind(loopback()).unwrap();
    // id (the Ethernet one), id of a Shm-only memory; the hostile frames to try.
    let cases: Vec<(&str, Box<HostileFrame>)> = vec![
        (
            "past the end",
            Box::new(|e, _, k| write_frame(e, k, 4000, 200)),
        ),
        (
            "offset overflow",
            Box::new(|e, _, k| write_frame(e, k, u64::MAX - 3, 8)),
        ),
        ("unknown id", Box::new(|_, _, k| write_frame(9999, k, 0, 8))),
        (
            "not registered for Ethernet",
            Box::new(|_, s, k| write_frame(s, k, 0, 8)),
        ),
        ("wrong key", Box::new(|e, _, k| write_frame(e, k ^ 1, 0, 8))),
        ("no key", Box::new(|e, _, _| write_frame(e, 0, 0, 8))),
        (
            "signal with a wrong key",
            Box::new(|e, _, k| {
                Frame::Update {
                    id: e,
                    offset: 0,
                    value: 7,
                    key: k.rotate_left(1),
                }
                .encode()
                .to_vec()
            }),
        ),
        (
            "misaligned update",
            Box::new(|e, _, k| {
                Frame::Update {
                    id: e,
                    offset: 4,
                    value: u64::MAX,
                    key: k,
                }
                .encode()
                .to_vec()
            }),
        ),
        (
            "update past the end",
            Box::new(|e, _, k| {
                Frame::Update {
                    id: e,
                    offset: 4096,
                    value: u64::MAX,
                    key: k,
                }
                .encode()
                .to_vec()
            }),
        ),
        (
            "oversized write",
            Box::new(|e, _, _| raw_header(1, e, 0, CHUNK as u64 + 1, 0).to_vec()),
        ),
        (
            "unknown op",
            Box::new(|_, _, _| raw_header(0x77, 0, 0, 0, 0).to_vec()),
        ),
        (
            "answer sent as data",
            Box::new(|_, _, _| Frame::Ack { seq: 1 }.encode().to_vec()),
        ),
    ];
    let ncases = cases.len() as u64;
    let listener = Mutex::new(Some(listener));
    let cases = &cases;
    thread::scope(|s| {
        let real = s.spawn(|| {
            // Test-control messages go through the raw bootstrap: each case aborts the
            // communicator on purpose (and resets it), and the communicator's own bootstrap
            // waits refuse to run on an aborted communicator, racing with the receiver that
            // sets the abort.
            let bs = Arc::new(bootstrap(0, 2, id, listener.lock().unwrap().take()));
            let comm = Communicator::new(bs.clone(), gpu(0)).unwrap();
            let buf = comm.gpu().alloc(4096).unwrap();
            buf.copy_from_host(0, &[0xaa; 4096]).unwrap();
            let shm = comm.gpu().alloc(4096).unwrap();
            shm.copy_from_host(0, &[0xbb; 4096]).unwrap();
            let reg = comm.register_buffer(&buf, Transport::Ethernet).unwrap();
            let shm_reg = comm.register_buffer(&shm, Transport::Shm).unwrap();
            // The memory itself, as a real peer would get it: its id and network key.
            bs.send(1, 99, &reg.serialize()).unwrap();
            let mut ids = reg.local_id().to_le_bytes().to_vec();
            ids.extend_from_slice(&shm_reg.local_id().to_le_bytes());
            bs.send(1, 100, &ids).unwrap();
            for (k, (name, _)) in cases.iter().enumerate() {
                // Strays on the listener are dropped while it waits for the real peer.
                let conn = comm.connect(config(), 1, k as u64).unwrap();
                bs.recv(1, 101).unwrap(); // the fake got its ERROR
                match conn.flush(TIMEOUT) {
                    Err(Error::EthernetProtocol { remote_rank: 1, .. }) => {}
                    other => panic!("case {name}: {other:?}"),
                }
                assert!(comm.status().is_aborted(), "case {name}: not aborted");
                comm.status().reset();
                let mut b = vec![0u8; 4096];
                buf.copy_to_host(0, &mut b).unwrap();
                assert!(b.iter().all(|&x| x == 0xaa), "case {name}: memory changed");
                shm.copy_to_host(0, &mut b).unwrap();
                assert!(b.iter().all(|&x| x == 0xbb), "case {name}: memory changed");
            }
            // A valid frame before a hostile one is applied; the hostile one is not.
            let conn = comm.connect(config(), 1, ncases).unwrap();
            bs.recv(1, 101).unwrap();
            assert!(conn.flush(TIMEOUT).is_err());
            let mut b = vec![0u8; 4096];
            buf.copy_to_host(0, &mut b).unwrap();
            assert_eq!(&b[..4], &[1, 2, 3, 4]);
            assert!(b[4..].iter().all(|&x| x == 0xaa));
        });
        let fake = s.spawn(|| {
            let bs = bootstrap(1, 2, id, None);
            let mem = mscclpp_host::registered_memory::RegisteredMemory::deserialize(
                &bs.recv(0, 99).unwrap(),
                &gpu(1),
                0,
                false,
            )
            .unwrap();
            let key = mem.key();
            let ids = bs.recv(0, 100).unwrap();
            let eth = u32::from_le_bytes(ids[0..4].try_into().unwrap());
            assert_eq!(eth, mem.local_id());
            let shm = u32::from_le_bytes(ids[4..8].try_into().unwrap());
            for (k, (name, frame)) in cases.iter().enumerate() {
                let mut p = fake_connect(&bs, k as u64, k == 0);
                // Some payloads are refused before they are read: the peer may close while
                // they are still being sent.
                let _ = p.out.write_all(&frame(eth, shm, key));
                let why = answer(&mut p.out).expect_err(name);
                println!("case {name}: refused: {why}");
                bs.send(0, 101, b"").unwrap();
                let mut rest = Vec::new();
                let _ = p.inbound.read_to_end(&mut rest); // closed by rank 0
            }
            let mut p = fake_connect(&bs, ncases, false);
            let mut v = Frame::Write {
                id: eth,
                offset: 0,
                len: 4,
                key,
            }
            .encode()
            .to_vec();
            v.extend_from_slice(&[1, 2, 3, 4]);
            v.extend_from_slice(&Frame::Flush { seq: 1 }.encode());
            v.extend_from_slice(
                &Frame::Write {
                    id: eth,
                    offset: 4093,
                    len: 4,
                    key,
                }
                .encode(),
            );
            v.extend_from_slice(&[9, 9, 9, 9]);
            p.out.write_all(&v).unwrap();
            assert_eq!(answer(&mut p.out), Ok(1));
            assert!(answer(&mut p.out).is_err());
            bs.send(0, 101, b"").unwrap();
        });
        real.join().unwrap();
        fake.join().unwrap();
    });
}

/// The real rank 0 of a test against a fake rank 1: sends rank 1 a registration of 64 zeroed
/// bytes (tag 99), connects over Ethernet, waits for the fake's word (tag 101) and checks that
/// `expect` arrived at the start of the buffer. How long `connect` took.
fn real_rank0_connects(
    id: UniqueId,
    listener: &Mutex<Option<mscclpp_host::bootstrap::RootListener>>,
    expect: &[u8; 8],
) -> Duration {
    let bs = Arc::new(bootstrap(0, 2, id, listener.lock().unwrap().take()));
    let comm = Communicator::new(bs.clone(), gpu(0)).unwrap();
    let buf = comm.gpu().alloc(64).unwrap();
    buf.copy_from_host(0, &[0u8; 64]).unwrap();
    let reg = comm.register_buffer(&buf, Transport::Ethernet).unwrap();
    bs.send(1, 99, &reg.serialize()).unwrap();
    let t0 = Instant::now();
    let conn = comm.connect(config(), 1, 0).unwrap();
    let took = t0.elapsed();
    bs.recv(1, 101).unwrap(); // the fake wrote and flushed
    let mut b = vec![0u8; 64];
    buf.copy_to_host(0, &mut b).unwrap();
    assert_eq!(&b[..8], expect);
    drop(conn);
    took
}

/// The fake rank 1's bootstrap and the registration [`real_rank0_connects`] sent it.
fn fake_rank1_memory(
    id: UniqueId,
) -> (
    TcpBootstrap,
    mscclpp_host::registered_memory::RegisteredMemory,
) {
    let bs = bootstrap(1, 2, id, None);
    let mem = mscclpp_host::registered_memory::RegisteredMemory::deserialize(
        &bs.recv(0, 99).unwrap(),
        &gpu(1),
        0,
        false,
    )
    .unwrap();
    (bs, mem)
}

/// The fake writes `bytes` into `mem`, flushes, tells rank 0 (tag 101) and says goodbye.
fn write_and_leave(
    bs: &TcpBootstrap,
    mut p: FakePeer,
    mem: &mscclpp_host::registered_memory::RegisteredMemory,
    bytes: &[u8; 8],
) {
    let mut v = Frame::Write {
        id: mem.local_id(),
        offset: 0,
        len: 8,
        key: mem.key(),
    }
    .encode()
    .to_vec();
    v.extend_from_slice(bytes);
    v.extend_from_slice(&Frame::Flush { seq: 1 }.encode());
    p.out.write_all(&v).unwrap();
    assert_eq!(answer(&mut p.out), Ok(1));
    bs.send(0, 101, b"").unwrap();
    p.out.write_all(&Frame::Bye.encode()).unwrap();
    let mut rest = Vec::new();
    let _ = p.inbound.read_to_end(&mut rest);
}

/// Rank 0's `connect` completes while a dozen silent connections (each allowed 2 s for its
/// handshake: 24 s if they were served one after the other, past the 20 s set-up deadline), a
/// forged proof, a wrong rank and garbage are held open on its listener; data then flows.
#[test]
fn connect_completes_past_silent_and_forged_connections() {
    let (id, listener) = UniqueId::bind(loopback()).unwrap();
    let listener = Mutex::new(Some(listener));
    thread::scope(|s| {
        let real = s.spawn(|| {
            let took = real_rank0_connects(id, &listener, &[1, 2, 3, 4, 5, 6, 7, 8]);
            println!("connect past 16 hostile connections: {took:?}");
            assert!(took < Duration::from_secs(5), "connect took {took:?}");
        });
        let fake = s.spawn(|| {
            let (bs, mem) = fake_rank1_memory(id);
            let mut p = fake_connect_past(&bs, 0, true, 12, &|_| ());
            // The forged proof got its CHALLENGE (already read) and then nothing: no ACCEPT.
            let forged = &mut p._strays[14];
            forged.set_read_timeout(Some(TIMEOUT)).unwrap();
            let mut rest = Vec::new();
            let _ = forged.read_to_end(&mut rest);
            assert!(
                rest.is_empty(),
                "a forged proof got {} more bytes",
                rest.len()
            );
            write_and_leave(&bs, p, &mem, &[1, 2, 3, 4, 5, 6, 7, 8]);
        });
        real.join().unwrap();
        fake.join().unwrap();
    });
}

/// Strangers hold and reopen 600 connections to rank 0's Ethernet listener while rank 1
/// connects: every one of 20 connects of the real peer is taken at once (under 900 ms: a
/// dropped SYN is retried only after a second), and the set-up and a write go through. The
/// listener has the bootstrap's backlog (4096) and admission rules; before, with std's 128,
/// strays filled its accept queue and a real peer's connect took 1–1.4 s.
#[test]
fn a_real_peer_connects_at_once_while_strays_hold_the_ethernet_listener() {
    let (id, listener) = UniqueId::bind(loopback()).unwrap();
    let listener = Mutex::new(Some(listener));
    let flood: Mutex<Option<Flood>> = Mutex::new(None);
    thread::scope(|s| {
        let real = s.spawn(|| {
            let took = real_rank0_connects(id, &listener, &[8, 7, 6, 5, 4, 3, 2, 1]);
            println!("ETHERNET rank 0's connect under the strays: {took:?}");
        });
        let fake = s.spawn(|| {
            let (bs, mem) = fake_rank1_memory(id);
            let strays = |addr: SocketAddr| {
                let f = Flood::start(&[(addr, 300), (addr, 300)]);
                let until = Instant::now() + Duration::from_secs(20);
                while f.held() < 500 && Instant::now() < until {
                    thread::sleep(Duration::from_millis(10));
                }
                let held = f.held();
                *flood.lock().unwrap() = Some(f);
                let times: Vec<Option<Duration>> = (0..20)
                    .map(|_| {
                        let t0 = Instant::now();
                        let c = TcpStream::connect_timeout(&addr, Duration::from_millis(900));
                        c.ok().map(|_| t0.elapsed())
                    })
                    .collect();
                let slow = times.iter().filter(|t| t.is_none()).count();
                let worst = times.iter().flatten().max().copied().unwrap_or_default();
                println!(
                    "ETHERNET strays: {held} held; 20 connects of the real peer: {slow} over 900 ms, the slowest of the others {worst:?}"
                );
                assert_eq!(slow, 0, "the listener dropped a real peer's SYN");
            };
            let t0 = Instant::now();
            let p = fake_connect_past(&bs, 0, false, 0, &strays);
            println!("ETHERNET set-up of the real peer under the strays: {:?}", t0.elapsed());
            write_and_leave(&bs, p, &mem, &[8, 7, 6, 5, 4, 3, 2, 1]);
        });
        real.join().unwrap();
        fake.join().unwrap();
    });
    let (peak, cut) = flood.into_inner().unwrap().expect("the strays ran").stop();
    println!("ETHERNET strays: {peak} held at most, {cut} closed by the listener and reopened");
}

#[test]
fn peer_that_dies_without_goodbye_aborts_and_is_named() {
    let (id, listener) = UniqueId::bind(loopback()).unwrap();
    let listener = Mutex::new(Some(listener));
    thread::scope(|s| {
        let real = s.spawn(|| {
            let comm = communicator(bootstrap(0, 2, id, listener.lock().unwrap().take()));
            let conn = comm.connect(config(), 1, 0).unwrap();
            // The fake says it closed its sockets; the abort that their closing causes may
            // end this (watched) receive first (3 of 20 runs).
            match comm.bootstrap().recv(1, 101) {
                Ok(_) | Err(Error::Aborted { .. }) | Err(Error::Remote { rank: 1, .. }) => {}
                Err(e) => panic!("{e}"),
            }
            let t = Instant::now();
            while !comm.status().is_aborted() {
                assert!(
                    t.elapsed() < TIMEOUT,
                    "the lost peer did not abort the communicator"
                );
                thread::sleep(Duration::from_millis(2));
            }
            match conn.flush(TIMEOUT) {
                Err(Error::Remote { rank: 1, reason }) => {
                    assert!(reason.contains("goodbye"), "{reason}")
                }
                other => panic!("{other:?}"),
            }
        });
        let fake = s.spawn(|| {
            let bs = bootstrap(1, 2, id, None);
            let p = fake_connect(&bs, 0, false);
            drop(p); // no BYE: a crash
            bs.send(0, 101, b"").unwrap();
        });
        real.join().unwrap();
        fake.join().unwrap();
    });
}

#[test]
fn flush_to_a_stalled_peer_times_out() {
    let (id, listener) = UniqueId::bind(loopback()).unwrap();
    let listener = Mutex::new(Some(listener));
    thread::scope(|s| {
        let real = s.spawn(|| {
            let comm = communicator(bootstrap(0, 2, id, listener.lock().unwrap().take()));
            let conn = comm.connect(config(), 1, 0).unwrap();
            for _ in 0..2 {
                let t = Instant::now();
                match conn.flush(Duration::from_millis(300)) {
                    Err(Error::FlushTimeout { remote_rank: 1, .. }) => {}
                    other => panic!("{other:?}"),
                }
                assert!(
                    t.elapsed() < Duration::from_secs(3),
                    "took {:?}",
                    t.elapsed()
                );
            }
            comm.bootstrap().send(1, 101, b"").unwrap();
            // The peer answers late: the stale ACKs are skipped and the next flush succeeds.
            conn.flush(TIMEOUT).unwrap();
        });
        let fake = s.spawn(|| {
            let bs = bootstrap(1, 2, id, None);
            let mut p = fake_connect(&bs, 0, false);
            bs.recv(0, 101).unwrap();
            // Rank 0 sent FLUSH 1, 2 and (soon) 3 on its outbound = our inbound; answer them.
            let mut h = [0u8; HEADER_LEN];
            for want in 1..=3 {
                p.inbound.read_exact(&mut h).unwrap();
                assert_eq!(Frame::decode(&h).unwrap(), Frame::Flush { seq: want });
                p.inbound
                    .write_all(&Frame::Ack { seq: want }.encode())
                    .unwrap();
            }
            let _ = p.out.flush();
            // Stay until rank 0 drops (BYE then EOF).
            p.inbound.read_exact(&mut h).unwrap();
            assert_eq!(Frame::decode(&h).unwrap(), Frame::Bye);
        });
        real.join().unwrap();
        fake.join().unwrap();
    });
}

#[test]
fn mismatched_peer_failure_is_reported_not_waited_for() {
    // Rank 1 sends an endpoint saying it could not prepare: rank 0 fails at once, naming it.
    let (id, listener) = UniqueId::bind(loopback()).unwrap();
    let listener = Mutex::new(Some(listener));
    thread::scope(|s| {
        let real = s.spawn(|| {
            let comm = communicator(bootstrap(0, 2, id, listener.lock().unwrap().take()));
            let t = Instant::now();
            match comm.connect(config(), 1, 0) {
                Err(Error::Remote { rank: 1, reason }) => {
                    assert!(reason.contains("no NIC"), "{reason}")
                }
                Err(e) => panic!("{e}"),
                Ok(_) => panic!("connected"),
            }
            assert!(t.elapsed() < Duration::from_secs(5));
        });
        let fake = s.spawn(|| {
            let bs = bootstrap(1, 2, id, None);
            let mut extra = vec![1u8];
            extra.extend_from_slice(b"no NIC here");
            let e = Endpoint {
                transport: Transport::Ethernet.bit(),
                rank: 1,
                pid: 1,
                device: 0,
                extra,
            };
            bs.send(0, ENDPOINT_TAG, &e.serialize()).unwrap();
            let _ = bs.recv(0, ENDPOINT_TAG).unwrap();
        });
        real.join().unwrap();
        fake.join().unwrap();
    });
}

// ---- ranks as processes ----

/// Two ranks as child processes (the harness's world) exchange over every pair of
/// transports.
#[test]
fn two_ranks_as_processes() {
    match mscclpp_test_support::child_communicator() {
        Some(comm) => all_pairs(&comm),
        None => mscclpp_test_support::ranks_as_processes(2, "two_ranks_as_processes"),
    }
}
