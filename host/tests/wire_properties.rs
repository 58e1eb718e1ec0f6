//! Property tests of every decoder of bytes that come from the wire: random inputs, and valid
//! encodings with random mutations and truncations, must give a typed error (or, for a
//! mutation that happens to stay valid, a value that re-encodes consistently) — never a panic.
//! A deterministic generator keeps failures reproducible (the seed is printed on failure).

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
    let mut accepted = 0;
    for _ in 0..ROUNDS {
        let n = rng.below(64);
        let input = if rng.below(2) == 0 {
            rng.mutate(&valid)
        } else {
            rng.bytes(n)
        };
        if let Ok(e) = Endpoint::deserialize(&input, 2) {
            accepted += 1;
            // Whatever is accepted re-encodes to exactly the input.
            assert_eq!(e.serialize(), input);
        }
    }
    assert!(
        accepted < ROUNDS / 2,
        "almost everything was accepted: {accepted}"
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
        // Not the same node: decoding only, no mapping attempted.
        let _ = RegisteredMemory::deserialize(&input, &g, 0, false);
    }
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
    let mut rng = Rng(77);
    for _ in 0..ROUNDS {
        let mut raw = [0u8; std::mem::size_of::<IpcMemHandle>()];
        let b = rng.bytes(raw.len());
        raw.copy_from_slice(&b);
        let h: IpcMemHandle = bytemuck::pod_read_unaligned(&raw);
        if validate_ipc_handle(&h, BackendKind::Cpu).is_ok() {
            assert!(
                h.size > 0
                    && h.offset
                        .checked_add(h.size)
                        .is_some_and(|e| e <= h.alloc_size)
            );
        }
    }
}

#[test]
fn unique_ids_never_panic() {
    let valid = UniqueId::new("127.0.0.1:4000".parse().unwrap()).unwrap();
    let bytes = valid.to_bytes();
    let mut rng = Rng(99);
    for _ in 0..ROUNDS {
        let input = rng.mutate(&bytes);
        if let Ok(id) = UniqueId::from_bytes(&input) {
            assert_eq!(id.to_bytes().as_slice(), input.as_slice());
        }
        let n = rng.below(100);
        let hex: String = rng
            .bytes(n)
            .iter()
            .map(|b| (b'0' + b % 75) as char)
            .collect();
        let _ = UniqueId::from_hex(&hex);
    }
}

#[test]
fn bootstrap_frames_never_panic() {
    let mut rng = Rng(4242);
    for _ in 0..ROUNDS {
        let mut h = [0u8; wire::CONTROL_HEADER_LEN];
        let b = rng.bytes(wire::CONTROL_HEADER_LEN);
        h.copy_from_slice(&b);
        let _ = wire::ControlHeader::decode(&h);
        let mut d = [0u8; wire::DATA_HEADER_LEN];
        let b = rng.bytes(wire::DATA_HEADER_LEN);
        d.copy_from_slice(&b);
        let _ = wire::DataHeader::decode(&d);
        let n = rng.below(300);
        let body = rng.bytes(n);
        let _ = wire::Join::decode(&body);
        let _ = wire::Table::decode(&body, 1 + rng.below(8));
        let _ = wire::Abort::decode(&body, 1 + rng.below(8));
        let _ = wire::Hello::decode(&body);
        let _ = wire::Challenge::decode(&body);
        let _ = wire::Proof::decode(&body);
        let _ = wire::Notice::decode(&body, 1 + rng.below(8));
        let _ = wire::Accept::decode(&body);
        let _ = wire::Reject::decode(&body);
        let _ = wire::decode_addr(&body);
    }
}

/// The authenticated handshake's messages: mutations of valid bodies either fail or decode to
/// a value that re-encodes to exactly the mutated bytes (no byte ignored, no second encoding).
#[test]
fn handshake_messages_ignore_no_byte() {
    use mscclpp_host::auth::Nonce;
    let body = |frame: Vec<u8>| frame[wire::CONTROL_HEADER_LEN..].to_vec();
    let hello = wire::Hello {
        magic: 0x1234,
        purpose: wire::Purpose::Link,
        from: 3,
        to: 5,
        size: 8,
        nonce: Nonce([7; 32]),
    };
    let challenge = wire::Challenge {
        nonce: Nonce([1; 32]),
        tag: [2; 32],
    };
    let join = wire::Join {
        tag: [3; 32],
        listen: "10.0.0.1:4000".parse().unwrap(),
        host_hash: 77,
        deadline_ms: 1000,
    };
    let proof = wire::Proof { tag: [4; 32] };
    let notice = wire::Notice {
        rank: 2,
        reason: "killed".into(),
    };
    let mut rng = Rng(5150);
    for _ in 0..ROUNDS {
        let m = rng.mutate(&hello.body());
        if let Ok(h) = wire::Hello::decode(&m) {
            assert_eq!(h.body(), m, "Hello");
        }
        let m = rng.mutate(&body(challenge.encode()));
        if let Ok(c) = wire::Challenge::decode(&m) {
            assert_eq!(body(c.encode()), m, "Challenge");
        }
        let m = rng.mutate(&body(join.encode()));
        if let Ok(j) = wire::Join::decode(&m) {
            assert_eq!(body(j.encode()), m, "Join");
        }
        let m = rng.mutate(&body(proof.encode()));
        if let Ok(p) = wire::Proof::decode(&m) {
            assert_eq!(body(p.encode()), m, "Proof");
        }
        let m = rng.mutate(&notice.encode());
        if let Ok(n) = wire::Notice::decode(&m, 4) {
            assert!(n.rank < 4);
            if std::str::from_utf8(&m[8..]).is_ok() {
                assert_eq!(n.encode(), m, "Notice");
            }
        }
    }
}

#[test]
fn ethernet_frames_never_panic() {
    let mut rng = Rng(31337);
    let valid = Frame::Write {
        id: 3,
        offset: 64,
        len: 4096,
        key: 0x1234_5678,
    }
    .encode();
    for _ in 0..ROUNDS {
        let mut h = [0u8; HEADER_LEN];
        if rng.below(2) == 0 {
            h.copy_from_slice(&rng.bytes(HEADER_LEN));
        } else {
            h = valid;
            let (i, bit) = (rng.below(HEADER_LEN), rng.below(8));
            h[i] ^= 1 << bit;
        }
        let _ = Frame::decode(&h);
        let mut s = [0u8; HANDSHAKE_LEN];
        s.copy_from_slice(&rng.bytes(HANDSHAKE_LEN));
        let _ = Handshake::decode(&s);
        let n = rng.below(200);
        let _ = EndpointInfo::decode(&rng.bytes(n));
    }
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
