//! Writes a seed corpus for every fuzz target: valid encodings made by the encoders, so the
//! fuzzer starts past the magics and versions. Run from `fuzz/` (not under the fuzzer):
//! `cargo run --example seeds` — files go to `corpus/<target>/seed-*`.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use mscclpp_host::auth::Nonce;
use mscclpp_host::bootstrap::wire::{
    self, Abort, AbortCode, Accept, Challenge, DataHeader, Hello, Join, Notice, Proof, Purpose,
    Reject, RejectCode, Table, TableEntry,
};
use mscclpp_host::bootstrap::{BootstrapConfig, TcpBootstrap, UniqueId};
use mscclpp_host::communicator::Communicator;
use mscclpp_host::connection::Endpoint;
use mscclpp_host::connection::ethernet::{EndpointInfo, Frame, Handshake, HandshakeKind};
use mscclpp_host::gpu::{BackendKind, Gpu};
use mscclpp_host::transport::Transport;
use mscclpp_shared::{ProxyTrigger, TriggerFields, TriggerType};

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new("corpus").join(target);
    std::fs::create_dir_all(&dir).expect("corpus folder");
    std::fs::write(dir.join(format!("seed-{name}")), bytes).expect("seed file");
}

/// `pick` byte, then `body`.
fn picked(pick: u8, body: &[u8]) -> Vec<u8> {
    let mut v = vec![pick];
    v.extend_from_slice(body);
    v
}

fn main() -> mscclpp_host::Result<()> {
    let v4: SocketAddr = "10.1.2.3:4000".parse().expect("address");
    let v6: SocketAddr = "[fe80::1]:5000".parse().expect("address");
    let body = |frame: Vec<u8>| frame[wire::CONTROL_HEADER_LEN..].to_vec();

    // bootstrap_frames: pick & 0x0f chooses the decoder, pick >> 4 the world size - 1.
    let join = Join {
        tag: [0x5a; 32],
        listen: v4,
        host_hash: 99,
        deadline_ms: 30_000,
    }
    .encode();
    write(
        "bootstrap_frames",
        "control",
        &picked(0, &join[..wire::CONTROL_HEADER_LEN]),
    );
    let data = DataHeader {
        channel: wire::CHANNEL_USER,
        tag: 5,
        len: 16,
    };
    write("bootstrap_frames", "data", &picked(1, &data.encode()));
    write("bootstrap_frames", "join", &picked(2, &body(join)));
    let table = Table {
        magic: 7,
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
    write(
        "bootstrap_frames",
        "table",
        &picked(0x13, &body(table.encode())),
    );
    let abort = Abort {
        code: AbortCode::RanksMissing,
        ranks: vec![1, 2],
    };
    write(
        "bootstrap_frames",
        "abort",
        &picked(0x34, &body(abort.encode())),
    );
    let hello = Hello {
        magic: 7,
        purpose: Purpose::Link,
        from: 2,
        to: 0,
        size: 3,
        nonce: Nonce([0x11; 32]),
    };
    write("bootstrap_frames", "hello", &picked(5, &hello.body()));
    let challenge = Challenge {
        nonce: Nonce([0x22; 32]),
        job: Nonce([0x55; 32]),
        tag: [0x33; 32],
    };
    write(
        "bootstrap_frames",
        "challenge",
        &picked(8, &body(challenge.encode())),
    );
    let proof = Proof { tag: [0x44; 32] };
    write(
        "bootstrap_frames",
        "proof",
        &picked(9, &body(proof.encode())),
    );
    let notice = Notice {
        rank: 2,
        reason: "closed its bootstrap connection".into(),
    };
    write(
        "bootstrap_frames",
        "notice",
        &picked(0x3a, &notice.encode()),
    );
    let accept = Accept { magic: 7, rank: 0 };
    write(
        "bootstrap_frames",
        "accept",
        &picked(6, &body(accept.encode())),
    );
    let reject = Reject {
        code: RejectCode::Mismatch,
        reason: "no".into(),
    };
    write(
        "bootstrap_frames",
        "reject",
        &picked(7, &body(reject.encode())),
    );

    // unique_id: bytes and hex.
    let id = UniqueId::new(v4)?;
    write("unique_id", "bytes", &id.to_bytes());
    write("unique_id", "hex", id.to_hex().as_bytes());

    // endpoint
    let ep = Endpoint {
        transport: Transport::Ethernet.bit(),
        rank: 3,
        pid: 1234,
        device: 0,
        extra: b"somewhere".to_vec(),
    };
    write("endpoint", "ethernet", &ep.serialize());

    // registered_memory: one registration, built the public way (a one-rank communicator).
    let gpu = Gpu::open(BackendKind::Cpu, 0)?;
    let buf = gpu.alloc(4096)?;
    let bs = TcpBootstrap::init(BootstrapConfig::new(
        0,
        1,
        "127.0.0.1:1".parse::<SocketAddr>().expect("address"),
    ))?;
    let comm = Communicator::new(Arc::new(bs), gpu.clone())?;
    let shm = comm.register_buffer(&buf, Transport::Shm)?;
    write("registered_memory", "shm", &shm.serialize());
    let eth = comm.register_buffer(&buf, Transport::Ethernet)?;
    write("registered_memory", "ethernet", &eth.serialize());

    // ethernet_frames: pick % 3 chooses the decoder.
    let frames = [
        Frame::Write {
            id: 3,
            offset: 64,
            len: 4096,
            key: 0x0123_4567_89ab_cdef,
        },
        Frame::Update {
            id: 1,
            offset: 8,
            value: 5,
            key: 0xfedc_ba98_7654_3210,
        },
        Frame::Flush { seq: 9 },
        Frame::Ack { seq: 9 },
        Frame::Bye,
        Frame::Error { len: 10 },
    ];
    for (i, f) in frames.iter().enumerate() {
        write(
            "ethernet_frames",
            &format!("frame{i}"),
            &picked(0, &f.encode()),
        );
    }
    let hs = Handshake {
        kind: HandshakeKind::Challenge,
        from: 1,
        to: 0,
        nonce: [0x55; 32],
        tag: [0x66; 32],
    };
    write("ethernet_frames", "handshake", &picked(1, &hs.encode()));
    let info = EndpointInfo {
        token: 42,
        addrs: vec![v4, v6],
    };
    write("ethernet_frames", "info", &picked(2, &info.encode()));

    // trigger: memory count, semaphore count, fst, snd, then 5-byte sizes.
    let t = ProxyTrigger::new(TriggerFields {
        size: 64,
        src_offset: 0,
        dst_offset: 4032,
        src_memory_id: 0,
        dst_memory_id: 1,
        kind: TriggerType::DATA | TriggerType::FLAG,
        semaphore_id: 1,
    })
    .expect("fits");
    let mut seed = vec![2, 2];
    seed.extend_from_slice(&t.fst.to_le_bytes());
    seed.extend_from_slice(&t.snd.to_le_bytes());
    for size in [4096u64, 4096] {
        seed.extend_from_slice(&size.to_le_bytes()[..5]);
    }
    write("trigger", "data", &seed);

    // execution_plan: the repository's plans (every op but the switch ops), as JSON text.
    for n in [2, 3] {
        for doc in mscclpp::executor::plans::all(n, 256) {
            let name = format!("{}-{n}", doc.name);
            write("execution_plan", &name, doc.to_json().to_string().as_bytes());
        }
    }
    println!("seeds written under corpus/");
    Ok(())
}
