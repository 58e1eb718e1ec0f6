//! Property tests of every decoder of bytes that come from the wire: random inputs, and valid
//! encodings with random mutations and truncations, must give a typed error (or, for a
//! mutation that happens to stay valid, a value that re-encodes to exactly the input) — never
//! a panic. Each decoder's test counts the mutated inputs it accepted and refused and asserts
//! both counts are non-zero: the re-encode check ran, and the mutations reached the checks.
//! A deterministic generator keeps failures reproducible (each test has its own seed).

use mscclpp_host::bootstrap::UniqueId;
use mscclpp_host::bootstrap::wire;
use mscclpp_host::connection::Endpoint;
use mscclpp_host::connection::ethernet::{
    EndpointInfo, Frame, HANDSHAKE_LEN, HEADER_LEN, Handshake,
};
use mscclpp_host::gpu::{BackendKind, Gpu, validate_ipc_handle};
use mscclpp_host::registered_memory::RegisteredMemory;
use mscclpp_host::transport::Transport;
use mscclpp_shared::IpcMemHandle;

/// xorshift64*: small, deterministic, good enough to scramble bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
    /// `valid` with a few random byte flips, or truncated, or extended.
    fn mutate(&mut self, valid: &[u8]) -> Vec<u8> {
        let mut v = valid.to_vec();
        match self.below(4) {
            0 => v.truncate(self.below(valid.len())),
            1 => {
                let n = 1 + self.below(16);
                let extra = self.bytes(n);
                v.extend(extra);
            }
            _ => {
                for _ in 0..1 + self.below(3) {
                    if !v.is_empty() {
                        let i = self.below(v.len());
                        v[i] ^= 1 << self.below(8);
                    }
                }
            }
        }
        v
    }
}

const ROUNDS: usize = 20_000;

/// Decodes [`ROUNDS`] mutations of the `valid` encodings (each of which must decode and
/// re-encode to itself) with `decode` (`None`: refused); every accepted mutation must
/// re-encode with `encode` to exactly the mutated bytes. Returns (accepted, refused) counts of
/// the inputs that differ from their valid source, after asserting both are non-zero.
fn round_trips<T>(
    what: &str,
    rng: &mut Rng,
    valid: &[Vec<u8>],
    decode: impl Fn(&[u8]) -> Option<T>,
    encode: impl Fn(&T) -> Vec<u8>,
) -> (usize, usize) {
    check_round_trips(what, true, rng, valid, decode, encode)
}

/// As [`round_trips`], for a decoder that is lossy by design (a human-readable text decoded
/// with replacement characters): an accepted mutation's re-encoding must decode again and
/// re-encode to itself.
fn round_trips_lossy<T>(
    what: &str,
    rng: &mut Rng,
    valid: &[Vec<u8>],
    decode: impl Fn(&[u8]) -> Option<T>,
    encode: impl Fn(&T) -> Vec<u8>,
) -> (usize, usize) {
    check_round_trips(what, false, rng, valid, decode, encode)
}

fn check_round_trips<T>(
    what: &str,
    exact: bool,
    rng: &mut Rng,
    valid: &[Vec<u8>],
    decode: impl Fn(&[u8]) -> Option<T>,
    encode: impl Fn(&T) -> Vec<u8>,
) -> (usize, usize) {
    for v in valid {
        let d = decode(v).unwrap_or_else(|| panic!("{what}: a valid encoding was refused: {v:?}"));
        assert_eq!(
            &encode(&d),
            v,
            "{what}: a valid encoding did not re-encode to itself"
        );
    }
    let (mut accepted, mut refused) = (0, 0);
    for _ in 0..ROUNDS {
        let source = &valid[rng.below(valid.len())];
        let input = rng.mutate(source);
        if &input == source {
            continue;
        }
        match decode(&input) {
            Some(d) if exact => {
                accepted += 1;
                assert_eq!(
                    encode(&d),
                    input,
                    "{what}: an accepted mutation re-encodes to other bytes"
                );
            }
            Some(d) => {
                // Lossy (text decoded with replacement characters): its encoding is stable.
                accepted += 1;
                let e = encode(&d);
                let again = decode(&e)
                    .unwrap_or_else(|| panic!("{what}: the re-encoding of {input:?} is refused"));
                assert_eq!(encode(&again), e, "{what}: the re-encoding is not stable");
            }
            None => refused += 1,
        }
    }
    assert!(accepted > 0, "{what}: no mutation was ever accepted");
    assert!(refused > 0, "{what}: every mutation was accepted");
    (accepted, refused)
}

/// `b` as a fixed-size array, if it has that size.
fn fixed<const N: usize>(b: &[u8]) -> Option<&[u8; N]> {
    b.try_into().ok()
}

fn cpu() -> Gpu {
    Gpu::open(BackendKind::Cpu, 0).unwrap()
}

#[test]
fn endpoints_never_panic() {
    let valid = Endpoint {
        transport: Transport::Ethernet.bit(),
        rank: 2,
        pid: 1234,
        device: 0,
        extra: b"somewhere".to_vec(),
    }
    .serialize();
    let mut rng = Rng(0x1234);
    // Random bytes: refused (they would have to name rank 2) and never a panic.
    for _ in 0..ROUNDS {
        let n = rng.below(64);
        assert!(Endpoint::deserialize(&rng.bytes(n), 2).is_err());
    }
    round_trips(
        "endpoint",
        &mut rng,
        &[valid],
        |b| Endpoint::deserialize(b, 2).ok(),
        |e| e.serialize(),
    );
}

#[test]
fn registered_memory_never_panics_and_never_maps_a_forgery() {
    let g = cpu();
    let buf = g.alloc(4096).unwrap();
    let h = buf.ipc_handle().unwrap();
    // A registration built the public way: through a one-rank communicator.
    let bs =
        mscclpp_host::bootstrap::TcpBootstrap::init(mscclpp_host::bootstrap::BootstrapConfig::new(
            0,
            1,
            "127.0.0.1:1".parse::<std::net::SocketAddr>().unwrap(),
        ))
        .unwrap();
    let comm =
        mscclpp_host::communicator::Communicator::new(std::sync::Arc::new(bs), g.clone()).unwrap();
    let reg = comm.register_buffer(&buf, Transport::Shm).unwrap();
    let valid = reg.serialize();
    assert_eq!(h.size, 4096);
    let mut rng = Rng(0x5eed);
    for i in 0..ROUNDS {
        let n = rng.below(200);
        let input = if i % 3 == 0 {
            rng.bytes(n)
        } else {
            rng.mutate(&valid)
        };
        // Not the same node: decoding only, no mapping attempted; what is accepted describes
        // exactly what it was sent as.
        if let Ok(m) = RegisteredMemory::deserialize(&input, &g, 0, false) {
            assert_eq!(m.serialize(), input, "accepted bytes re-encode to others");
        }
    }
    round_trips(
        "registered memory",
        &mut rng,
        std::slice::from_ref(&valid),
        |b| RegisteredMemory::deserialize(b, &g, 0, false).ok(),
        |m| m.serialize(),
    );
    // Same node: mutations of the IPC handle must be refused or map the real memory only.
    for _ in 0..2_000 {
        let input = rng.mutate(&valid);
        if let Ok(m) = RegisteredMemory::deserialize(&input, &g, 0, true)
            && let Ok(p) = m.range(0, m.size() as u64)
        {
            // Whatever is reachable must be the buffer itself: directly, or mapped again from
            // its memfd (a changed pid takes the IPC path). Prove it by writing through it.
            assert_eq!(m.size(), 4096);
            let mark = rng.next() as u8 | 1;
            // SAFETY: `p` addresses 4096 bytes of the CPU backend's (host) memory.
            unsafe { p.as_ptr().write_volatile(mark) };
            let mut back = [0u8; 1];
            buf.copy_to_host(0, &mut back).unwrap();
            assert_eq!(
                back[0],
                mark,
                "mapped {:#x}, which is not the buffer",
                p.addr()
            );
        }
    }
}

#[test]
fn ipc_handles_are_validated() {
    use mscclpp_shared::ipc::{IPC_KIND_CPU, IPC_KIND_CUDA};
    let mut rng = Rng(77);
    let (mut accepted, mut refused) = (0, 0);
    for _ in 0..ROUNDS {
        let mut raw = [0u8; std::mem::size_of::<IpcMemHandle>()];
        let b = rng.bytes(raw.len());
        raw.copy_from_slice(&b);
        let mut h: IpcMemHandle = bytemuck::pod_read_unaligned(&raw);
        // Mostly plausible handles (this backend's kind, ranges near the allocation's end,
        // sums that overflow), so that both answers come up often; random ones too.
        let near = |rng: &mut Rng, x: u64| x.wrapping_add(rng.below(5) as u64).wrapping_sub(2);
        match rng.below(4) {
            0 => {}
            k => {
                h.kind = if k == 3 { IPC_KIND_CUDA } else { IPC_KIND_CPU };
                h.alloc_size = [0, 1, 4096, u64::MAX][rng.below(4)];
                h.offset = match rng.below(3) {
                    0 => 0,
                    1 => near(&mut rng, h.alloc_size / 2),
                    _ => u64::MAX - rng.below(3) as u64,
                };
                h.size = match rng.below(3) {
                    0 => rng.below(2) as u64,
                    _ => near(&mut rng, h.alloc_size.wrapping_sub(h.offset)),
                };
            }
        }
        let in_range = h.size > 0
            && h.offset
                .checked_add(h.size)
                .is_some_and(|e| e <= h.alloc_size);
        let ok = validate_ipc_handle(&h, BackendKind::Cpu).is_ok();
        assert_eq!(
            ok,
            h.kind == IPC_KIND_CPU && in_range,
            "kind {} offset {} size {} of {}",
            h.kind,
            h.offset,
            h.size,
            h.alloc_size
        );
        if ok { accepted += 1 } else { refused += 1 }
    }
    assert!(
        accepted > ROUNDS / 20 && refused > ROUNDS / 20,
        "{accepted} accepted, {refused} refused"
    );
}

#[test]
fn unique_ids_never_panic() {
    let valid = UniqueId::new("127.0.0.1:4000".parse().unwrap()).unwrap();
    let mut rng = Rng(99);
    for _ in 0..ROUNDS {
        let n = rng.below(100);
        let hex: String = rng
            .bytes(n)
            .iter()
            .map(|b| (b'0' + b % 75) as char)
            .collect();
        if let Ok(id) = UniqueId::from_hex(&hex) {
            assert_eq!(id.to_hex(), hex.to_lowercase());
        }
    }
    round_trips(
        "unique id",
        &mut rng,
        &[valid.to_bytes().to_vec()],
        |b| UniqueId::from_bytes(b).ok(),
        |id| id.to_bytes().to_vec(),
    );
}

/// A body without its control header (the encoders frame what they encode).
fn body(framed: Vec<u8>) -> Vec<u8> {
    framed[wire::CONTROL_HEADER_LEN..].to_vec()
}

#[test]
fn bootstrap_frames_never_panic() {
    use wire::{
        Abort, AbortCode, Accept, Challenge, ControlHeader, DataHeader, Hello, Join, Kind, Notice,
        Proof, Purpose, Reject, RejectCode, Table, TableEntry,
    };
    let mut rng = Rng(4242);
    // Random bytes: never a panic.
    for _ in 0..ROUNDS {
        let mut h = [0u8; wire::CONTROL_HEADER_LEN];
        let b = rng.bytes(wire::CONTROL_HEADER_LEN);
        h.copy_from_slice(&b);
        let _ = ControlHeader::decode(&h);
        let mut d = [0u8; wire::DATA_HEADER_LEN];
        let b = rng.bytes(wire::DATA_HEADER_LEN);
        d.copy_from_slice(&b);
        let _ = DataHeader::decode(&d);
        let n = rng.below(300);
        let body = rng.bytes(n);
        let _ = Join::decode(&body);
        let _ = Table::decode(&body, 1 + rng.below(8));
        let _ = Abort::decode(&body, 1 + rng.below(8));
        let _ = Hello::decode(&body);
        let _ = Challenge::decode(&body);
        let _ = Proof::decode(&body);
        let _ = Notice::decode(&body, 1 + rng.below(8));
        let _ = Accept::decode(&body);
        let _ = Reject::decode(&body);
        let _ = wire::decode_addr(&body);
    }
    // Mutations of valid encodings: refused, or re-encoded to exactly the input.
    let v4: std::net::SocketAddr = "10.1.2.3:4000".parse().unwrap();
    let v6: std::net::SocketAddr = "[fe80::1%3]:4001".parse().unwrap();
    round_trips(
        "control header",
        &mut rng,
        &[ControlHeader::new(Kind::Join, 64).encode().to_vec()],
        |b| ControlHeader::decode(fixed(b)?).ok(),
        |h| h.encode().to_vec(),
    );
    round_trips(
        "data header",
        &mut rng,
        &[DataHeader {
            channel: 1,
            tag: 77,
            len: 4096,
        }
        .encode()
        .to_vec()],
        |b| DataHeader::decode(fixed(b)?).ok(),
        |h| h.encode().to_vec(),
    );
    round_trips(
        "address",
        &mut rng,
        &[v4, v6].map(|a| {
            let mut b = Vec::new();
            wire::put_addr(&mut b, &a);
            b
        }),
        |b| wire::decode_addr(b).ok(),
        |a| {
            let mut b = Vec::new();
            wire::put_addr(&mut b, a);
            b
        },
    );
    let join = Join {
        tag: [3; 32],
        listen: v4,
        host_hash: 99,
        deadline_ms: 30_000,
    };
    round_trips(
        "join",
        &mut rng,
        &[body(join.encode())],
        |b| Join::decode(b).ok(),
        |j| body(j.encode()),
    );
    let table = Table {
        magic: 5,
        entries: vec![
            TableEntry {
                listen: v4,
                host_hash: 1,
            },
            TableEntry {
                listen: v6,
                host_hash: 2,
            },
        ],
    };
    round_trips(
        "table",
        &mut rng,
        &[body(table.encode())],
        |b| Table::decode(b, 2).ok(),
        |t| body(t.encode()),
    );
    let abort = Abort {
        code: AbortCode::RanksMissing,
        ranks: vec![1, 6],
    };
    round_trips(
        "abort",
        &mut rng,
        &[body(abort.encode())],
        |b| Abort::decode(b, 8).ok(),
        |a| body(a.encode()),
    );
    // The authenticated handshake's messages.
    let hellos = [Purpose::Join, Purpose::Link].map(|purpose| Hello {
        magic: 0x1234,
        purpose,
        from: 3,
        to: 5,
        size: 8,
        nonce: mscclpp_host::auth::Nonce([7; 32]),
    });
    round_trips(
        "hello",
        &mut rng,
        &hellos.map(|h| h.body()),
        |b| Hello::decode(b).ok(),
        |h| h.body(),
    );
    let challenge = Challenge {
        nonce: mscclpp_host::auth::Nonce([1; 32]),
        job: mscclpp_host::auth::Nonce([5; 32]),
        tag: [2; 32],
    };
    round_trips(
        "challenge",
        &mut rng,
        &[body(challenge.encode())],
        |b| Challenge::decode(b).ok(),
        |c| body(c.encode()),
    );
    round_trips(
        "proof",
        &mut rng,
        &[body(Proof { tag: [4; 32] }.encode())],
        |b| Proof::decode(b).ok(),
        |p| body(p.encode()),
    );
    let notice = Notice {
        rank: 2,
        reason: "killed".into(),
    };
    // The reason is text for people, decoded lossily.
    round_trips_lossy(
        "notice",
        &mut rng,
        &[notice.encode()],
        |b| Notice::decode(b, 4).ok(),
        |n| n.encode(),
    );
    round_trips(
        "accept",
        &mut rng,
        &[body(Accept { magic: 7, rank: 2 }.encode())],
        |b| Accept::decode(b).ok(),
        |a| body(a.encode()),
    );
    let reject = Reject {
        code: RejectCode::Mismatch,
        reason: "world size 4, expected 8".into(),
    };
    // The reason is text for people, decoded lossily (invalid UTF-8 becomes U+FFFD).
    round_trips_lossy(
        "reject",
        &mut rng,
        &[body(reject.encode())],
        |b| Reject::decode(b).ok(),
        |r| body(r.encode()),
    );
}

#[test]
fn ethernet_frames_never_panic() {
    use mscclpp_host::connection::ethernet::HandshakeKind;
    let mut rng = Rng(31337);
    // Random bytes: never a panic.
    for _ in 0..ROUNDS {
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&rng.bytes(HEADER_LEN));
        let _ = Frame::decode(&h);
        let mut s = [0u8; HANDSHAKE_LEN];
        s.copy_from_slice(&rng.bytes(HANDSHAKE_LEN));
        let _ = Handshake::decode(&s);
        let n = rng.below(200);
        let _ = EndpointInfo::decode(&rng.bytes(n));
    }
    let frames = [
        Frame::Write {
            id: 3,
            offset: 64,
            len: 4096,
            key: 0x1234_5678,
        },
        Frame::Update {
            id: 1,
            offset: 8,
            value: 5,
            key: 0x8765_4321,
        },
        Frame::Flush { seq: 9 },
        Frame::Bye,
        Frame::Ack { seq: 9 },
        Frame::Error { len: 12 },
    ];
    round_trips(
        "ethernet frame",
        &mut rng,
        &frames.map(|f| f.encode().to_vec()),
        |b| Frame::decode(fixed(b)?).ok(),
        |f| f.encode().to_vec(),
    );
    let shakes = [
        Handshake {
            nonce: [9; 32],
            ..Handshake::new(HandshakeKind::Hello, 1, 0)
        },
        Handshake {
            nonce: [5; 32],
            tag: [6; 32],
            ..Handshake::new(HandshakeKind::Challenge, 0, 1)
        },
        Handshake {
            tag: [7; 32],
            ..Handshake::new(HandshakeKind::Proof, 1, 0)
        },
    ];
    round_trips(
        "ethernet handshake",
        &mut rng,
        &shakes.map(|h| h.encode().to_vec()),
        |b| Handshake::decode(fixed(b)?).ok(),
        |h| h.encode().to_vec(),
    );
    let info = EndpointInfo {
        token: 42,
        addrs: vec![
            "127.0.0.1:5000".parse().unwrap(),
            "[::1]:5001".parse().unwrap(),
        ],
    };
    round_trips(
        "ethernet endpoint info",
        &mut rng,
        &[info.encode()],
        |b| EndpointInfo::decode(b).ok(),
        |i| i.encode(),
    );
}

#[test]
fn registered_memory_ignores_no_byte() {
    // Found by the `registered_memory` fuzz target: a memory without an IPC handle was
    // accepted whatever the handle's bytes held, and unknown flag bits were ignored.
    let g = cpu();
    let buf = g.alloc(4096).unwrap();
    let bs =
        mscclpp_host::bootstrap::TcpBootstrap::init(mscclpp_host::bootstrap::BootstrapConfig::new(
            0,
            1,
            "127.0.0.1:1".parse::<std::net::SocketAddr>().unwrap(),
        ))
        .unwrap();
    let comm =
        mscclpp_host::communicator::Communicator::new(std::sync::Arc::new(bs), g.clone()).unwrap();
    let reg = comm.register_buffer(&buf, Transport::Ethernet).unwrap();
    let valid = reg.serialize();
    assert!(RegisteredMemory::deserialize(&valid, &g, 0, false).is_ok());
    let handle_at = valid.len() - std::mem::size_of::<IpcMemHandle>();
    for i in handle_at..valid.len() {
        let mut bad = valid.clone();
        bad[i] = 1;
        assert!(
            RegisteredMemory::deserialize(&bad, &g, 0, false).is_err(),
            "a handle byte ({i}) was ignored"
        );
    }
    for bit in 1..8 {
        let mut bad = valid.clone();
        bad[7] |= 1 << bit; // the flags byte
        assert!(
            RegisteredMemory::deserialize(&bad, &g, 0, false).is_err(),
            "flag bit {bit} was ignored"
        );
    }
}
