//! The libfabric transport on the backend users would get (the CPU backend here), over
//! libfabric's `tcp` provider on loopback (`FI_PROVIDER=tcp`, `FI_TCP_IFACE=lo`): ranks as
//! threads of a child process that each test starts with that environment (libfabric reads it
//! once per process). Writes of every size class land byte for byte — direct RMA writes into
//! memories registered before the connection, frames for memories registered after it and for
//! every memory with `MSCCLPP_OFI_STAGED=1` — with the signal ordered after the data and
//! `flush` covering both; sender-side refusals; a destination the receiver no longer has is
//! refused there, reported back and aborts the receiver; a missing library is a typed error.
//!
//! libfabric comes from the project's set-up (`scripts/test.sh` installs Debian's
//! `libfabric1`). Without it each test prints NOT RUN and why, and fails instead when
//! `MSCCLPP_REQUIRE_OFI=1` (as CI sets it).

use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use mscclpp_host::Error;
use mscclpp_host::connection::EndpointConfig;
use mscclpp_host::connection::ofi::{self, CHUNK, SLOTS};
use mscclpp_host::gpu::DeviceBuffer;
use mscclpp_host::transport::Transport;
use mscclpp_test_support::{TestProcess, in_isolated, ranks_as_threads as comm_world};

const TIMEOUT: Duration = Duration::from_secs(20);
/// How long a test's child process may run before it is killed.
const CHILD_BOUND: Duration = Duration::from_secs(300);

/// In the test process: runs test `name` again in a child with the `tcp` provider on loopback
/// (and `env`), checks that it passed, and returns false. In that child: true, unless
/// libfabric is not usable (then it prints NOT RUN and returns false; with
/// `MSCCLPP_REQUIRE_OFI=1` it fails).
fn in_child(name: &str, env: &[(&str, &str)]) -> bool {
    if in_isolated(name) {
        return match ofi::usable() {
            Ok(_) => true,
            Err(e) => {
                assert!(
                    std::env::var("MSCCLPP_REQUIRE_OFI").as_deref() != Ok("1"),
                    "libfabric is required here (MSCCLPP_REQUIRE_OFI=1): {e}"
                );
                println!(
                    "NOT RUN: {name}: libfabric is not usable here ({e}); scripts/test.sh installs it"
                );
                false
            }
        };
    }
    let end = TestProcess::isolated(name)
        .env("FI_PROVIDER", "tcp")
        .env("FI_TCP_IFACE", "lo")
        .env_remove("MSCCLPP_OFI_PROVIDER")
        .env_remove("MSCCLPP_OFI_STAGED")
        .envs(env.iter().copied())
        .spawn()
        .wait_for(CHILD_BOUND);
    assert!(end.success(), "{name} failed in its child:\n{}", end.text());
    let text = end.output();
    for line in text
        .lines()
        .filter(|l| l.contains("NOT RUN") || l.contains("OFI_FIGURE"))
    {
        println!("{line}");
    }
    false
}

fn config() -> EndpointConfig {
    let mut c = EndpointConfig::new(Transport::Ofi);
    c.flush_timeout = TIMEOUT;
    c
}

/// Bytes that depend on (seed, index) with no short period.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn read_all(buf: &DeviceBuffer) -> Vec<u8> {
    let mut v = vec![0u8; buf.len()];
    buf.copy_to_host(0, &mut v).unwrap();
    v
}

/// The writes every test issues, as (offset, length): 1 byte, unaligned, a few KiB, more than
/// a chunk, and more than every receive slot together (credits must come back in between).
fn writes(size: usize) -> Vec<(usize, usize)> {
    vec![
        (0, 1),
        (3, 5),
        (17, 4093),
        (8192, CHUNK + 777),
        (size - (SLOTS + 2) * CHUNK - 8, (SLOTS + 2) * CHUNK + 8),
    ]
}

/// Two ranks: each writes its pattern (from a memory registered before `connect`) into the
/// peer's `early` memory (registered for `Ofi` before `connect`: direct RMA unless staged) and
/// `late` memory (registered after: frames),
/// signals with `update_and_sync`, flushes; each checks what landed, byte for byte, and the
/// connection's byte count.
fn exchange() {
    let size = (SLOTS + 4) * CHUNK;
    comm_world(2, |comm| {
        let (me, peer) = (comm.rank(), 1 - comm.rank());
        let g = comm.gpu().clone();
        let early = g.alloc(size).unwrap();
        early.copy_from_host(0, &vec![0xee; size]).unwrap();
        let early_reg = comm.register_buffer(&early, Transport::Ofi).unwrap();
        let src = g.alloc(size).unwrap();
        src.copy_from_host(0, &pattern(size, me as u64 + 1))
            .unwrap();
        let src_reg = comm.register_buffer(&src, Transport::Ofi).unwrap();
        let conn = comm.connect(config(), peer, 0).unwrap();
        let late = g.alloc(size).unwrap();
        late.copy_from_host(0, &vec![0xee; size]).unwrap();
        let late_reg = comm.register_buffer(&late, Transport::Ofi).unwrap();
        let flag = g.alloc(16).unwrap();
        flag.copy_from_host(0, &[0; 16]).unwrap();
        let flag_reg = comm.register_buffer(&flag, Transport::Ofi).unwrap();
        for (i, m) in [&early_reg, &late_reg, &flag_reg].into_iter().enumerate() {
            comm.send_memory(m, peer, i as u64).unwrap();
        }
        let theirs: Vec<_> = (0..3).map(|i| comm.recv_memory(peer, i).unwrap()).collect();
        let mut sent = 0u64;
        for dst in &theirs[..2] {
            for (off, len) in writes(size) {
                conn.write(dst, off as u64, &src_reg, off as u64, len as u64)
                    .unwrap();
                sent += len as u64;
            }
        }
        let word = AtomicU64::new(0);
        conn.update_and_sync(&theirs[2], 8, &word, 0xfeed_0000 + me as u64)
            .unwrap();
        assert_eq!(word.load(Ordering::Acquire), 0xfeed_0000 + me as u64);
        conn.flush(TIMEOUT).unwrap();
        assert_eq!(conn.bytes_sent(), sent, "bytes counted");
        comm.barrier().unwrap();
        let want = pattern(size, peer as u64 + 1);
        for (what, buf) in [("early", &early), ("late", &late)] {
            let got = read_all(buf);
            let mut expect = vec![0xeeu8; size];
            for (off, len) in writes(size) {
                expect[off..off + len].copy_from_slice(&want[off..off + len]);
            }
            if let Some(i) = (0..size).find(|&i| got[i] != expect[i]) {
                panic!(
                    "rank {me} {what}: byte {i} is {:#x}, expected {:#x}",
                    got[i], expect[i]
                );
            }
        }
        let mut w = [0u8; 16];
        flag.copy_to_host(0, &mut w).unwrap();
        assert_eq!(
            u64::from_le_bytes(w[8..].try_into().unwrap()),
            0xfeed_0000 + peer as u64
        );
        assert_eq!(u64::from_le_bytes(w[..8].try_into().unwrap()), 0);
        comm.barrier().unwrap();
    });
}

#[test]
fn ofi_writes_land_byte_for_byte_direct_and_in_frames() {
    if in_child("ofi_writes_land_byte_for_byte_direct_and_in_frames", &[]) {
        exchange();
    }
}

#[test]
fn ofi_writes_land_byte_for_byte_all_in_frames() {
    if in_child(
        "ofi_writes_land_byte_for_byte_all_in_frames",
        &[("MSCCLPP_OFI_STAGED", "1")],
    ) {
        exchange();
    }
}

#[test]
fn ofi_sender_refuses_what_it_cannot_write() {
    if !in_child("ofi_sender_refuses_what_it_cannot_write", &[]) {
        return;
    }
    comm_world(2, |comm| {
        let peer = 1 - comm.rank();
        let g = comm.gpu().clone();
        let conn = comm.connect(config(), peer, 0).unwrap();
        let buf = g.alloc(64).unwrap();
        let ofi_reg = comm.register_buffer(&buf, Transport::Ofi).unwrap();
        let shm_reg = comm.register_buffer(&buf, Transport::Shm).unwrap();
        comm.send_memory(&ofi_reg, peer, 0).unwrap();
        comm.send_memory(&shm_reg, peer, 1).unwrap();
        let theirs = comm.recv_memory(peer, 0).unwrap();
        let shm = comm.recv_memory(peer, 1).unwrap();
        assert!(matches!(
            conn.write(&shm, 0, &ofi_reg, 0, 8),
            Err(Error::OfiMemory { .. })
        ));
        assert!(matches!(
            conn.write(&theirs, 60, &ofi_reg, 0, 8),
            Err(Error::OutOfRange { .. })
        ));
        assert!(
            matches!(
                conn.write(&ofi_reg, 0, &ofi_reg, 0, 8),
                Err(Error::OfiMemory { .. })
            ),
            "our own memory is not the peer's"
        );
        let w = AtomicU64::new(0);
        assert!(matches!(
            conn.update_and_sync(&theirs, 4, &w, 1),
            Err(Error::OfiMemory { .. })
        ));
        // Nothing was sent: the connection still works.
        conn.write(&theirs, 0, &ofi_reg, 8, 8).unwrap();
        conn.flush(TIMEOUT).unwrap();
        comm.barrier().unwrap();
    });
}

/// Rank 1 drops the memory rank 0 writes into (it leaves the registry): rank 0's frame is
/// refused by rank 1, which aborts its communicator and tells rank 0, whose flush fails with
/// rank 1's reason.
#[test]
fn ofi_receiver_refuses_a_destination_it_no_longer_has() {
    if !in_child("ofi_receiver_refuses_a_destination_it_no_longer_has", &[]) {
        return;
    }
    comm_world(2, |comm| {
        let (me, peer) = (comm.rank(), 1 - comm.rank());
        let g = comm.gpu().clone();
        let conn = comm.connect(config(), peer, 0).unwrap();
        let buf = g.alloc(4096).unwrap();
        buf.copy_from_host(0, &[0x55; 4096]).unwrap();
        let mut reg = Some(comm.register_buffer(&buf, Transport::Ofi).unwrap());
        comm.send_memory(reg.as_ref().unwrap(), peer, 0).unwrap();
        let theirs = comm.recv_memory(peer, 0).unwrap();
        if me == 1 {
            drop(reg.take());
        }
        comm.barrier().unwrap();
        if let Some(reg) = &reg {
            conn.write(&theirs, 0, reg, 0, 4096).unwrap();
            let start = Instant::now();
            match conn.flush(TIMEOUT) {
                Err(Error::Remote { rank: 1, reason }) => {
                    assert!(reason.contains("not registered"), "{reason}")
                }
                other => panic!("flush after a refused frame: {other:?}"),
            }
            assert!(start.elapsed() < TIMEOUT / 2, "{:?}", start.elapsed());
            println!(
                "OFI_FIGURE the refused frame failed the sender's flush after {:.1} ms",
                start.elapsed().as_secs_f64() * 1e3
            );
            // Sticky.
            assert!(conn.write(&theirs, 0, reg, 0, 8).is_err());
        } else {
            let start = Instant::now();
            while !comm.status().is_aborted() {
                assert!(start.elapsed() < TIMEOUT, "rank 1 was never aborted");
                thread::sleep(Duration::from_millis(1));
            }
            let got = read_all(&buf);
            assert!(
                got.iter().all(|&b| b == 0x55),
                "a byte of the refused frame landed"
            );
        }
        drop(conn);
    });
}

/// Rank 0 writes into rank 1's memory named with a network key that is not the memory's (its
/// serialized form altered): rank 1 refuses the frame, writes nothing, aborts, and rank 0's
/// flush fails with rank 1's reason. (The memory is registered after the connection, so the
/// write travels in frames, which carry the key.)
#[test]
fn ofi_receiver_refuses_a_wrong_network_key() {
    if !in_child("ofi_receiver_refuses_a_wrong_network_key", &[]) {
        return;
    }
    comm_world(2, |comm| {
        let (me, peer) = (comm.rank(), 1 - comm.rank());
        let g = comm.gpu().clone();
        let conn = comm.connect(config(), peer, 0).unwrap();
        let buf = g.alloc(4096).unwrap();
        buf.copy_from_host(0, &[0x55; 4096]).unwrap();
        let reg = comm.register_buffer(&buf, Transport::Ofi).unwrap();
        comm.send_memory(&reg, peer, 0).unwrap();
        let theirs = comm.recv_memory(peer, 0).unwrap();
        comm.barrier().unwrap();
        if me == 0 {
            let mut bytes = theirs.serialize();
            let key = theirs.key().to_le_bytes();
            let at = bytes
                .windows(8)
                .position(|w| w == key)
                .expect("the key in the serialized memory");
            bytes[at] ^= 1;
            let forged = mscclpp_host::registered_memory::RegisteredMemory::deserialize(
                &bytes, &g, 1, false,
            )
            .unwrap();
            assert_ne!(forged.key(), theirs.key());
            conn.write(&forged, 0, &reg, 0, 4096).unwrap();
            match conn.flush(TIMEOUT) {
                Err(Error::Remote { rank: 1, reason }) => {
                    assert!(reason.contains("wrong network key"), "{reason}")
                }
                other => panic!("flush after a frame with a wrong key: {other:?}"),
            }
        } else {
            let start = Instant::now();
            while !comm.status().is_aborted() {
                assert!(start.elapsed() < TIMEOUT, "rank 1 was never aborted");
                thread::sleep(Duration::from_millis(1));
            }
            let got = read_all(&buf);
            assert!(
                got.iter().all(|&b| b == 0x55),
                "a byte of the refused frame landed"
            );
        }
        drop(conn);
    });
}

#[test]
fn ofi_missing_library_is_a_typed_error() {
    let test = "ofi_missing_library_is_a_typed_error";
    if !in_isolated(test) {
        let end = TestProcess::isolated(test)
            .env("MSCCLPP_OFI_LIBRARY", "/nonexistent/libfabric.so.1")
            .spawn()
            .wait_for(CHILD_BOUND);
        assert!(end.success(), "{}", end.text());
        return;
    }
    match ofi::usable() {
        Err(Error::OfiUnavailable { reason }) => {
            assert!(reason.contains("/nonexistent/libfabric.so.1"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        ofi::providers(),
        Err(Error::OfiUnavailable { .. })
    ));
    let results = comm_world(2, |comm| {
        let peer = 1 - comm.rank();
        comm.connect(config(), peer, 0).map(|_| ())
    });
    for r in results {
        match r {
            Err(Error::OfiUnavailable { .. }) | Err(Error::Remote { .. }) => {}
            other => panic!("connect without libfabric: {other:?}"),
        }
    }
}

#[test]
fn ofi_lists_the_tcp_provider() {
    if !in_child("ofi_lists_the_tcp_provider", &[]) {
        return;
    }
    let all = ofi::providers().unwrap();
    let tcp = all
        .iter()
        .find(|p| p.provider.starts_with("tcp"))
        .unwrap_or_else(|| panic!("no tcp provider in {all:?}"));
    assert!(
        tcp.fabric.contains("127.0.0.1") || tcp.domain == "lo",
        "{tcp:?}"
    );
    assert!(ofi::usable().unwrap().starts_with("tcp"));
}
