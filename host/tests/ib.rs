//! The `Ib` transport where it can be tested without RDMA hardware: connecting fails on every rank
//! with a typed [`Error::Transport`] of kind `Unavailable` (no libibverbs, no device, or a build
//! without the `ib` feature), at once and without a panic, and the communicator stays usable.
//! On a machine with an active RDMA port the same test instead moves data and checks it.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use mscclpp_host::Error;
use mscclpp_host::bootstrap::{BootstrapConfig, TcpBootstrap, UniqueId};
use mscclpp_host::communicator::Communicator;
use mscclpp_host::connection::EndpointConfig;
use mscclpp_host::error::TransportErrorKind;
use mscclpp_host::gpu::{BackendKind, Gpu};
use mscclpp_host::transport::Transport;

fn world<T: Send>(n: usize, body: impl Fn(Communicator) -> T + Sync) -> Vec<T> {
    let (id, listener) = UniqueId::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = Mutex::new(Some(listener));
    thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (body, listener) = (&body, &listener);
                s.spawn(move || {
                    let cfg = BootstrapConfig::new(r, n, id).with_timeout(Duration::from_secs(30));
                    let root = if r == 0 {
                        listener.lock().unwrap().take()
                    } else {
                        None
                    };
                    let bs = match root {
                        Some(l) => TcpBootstrap::init_with_root_listener(cfg, l),
                        None => TcpBootstrap::init(cfg),
                    }
                    .unwrap();
                    let kind = BackendKind::select().unwrap();
                    let gpu = Gpu::open(kind, r % kind.device_count().unwrap().max(1)).unwrap();
                    body(Communicator::new(Arc::new(bs), gpu).unwrap())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn connecting_without_rdma_is_a_typed_error_or_works() {
    world(2, |comm| {
        let me = comm.rank();
        let peer = 1 - me;
        let buf = comm.gpu().alloc(4096).unwrap();
        buf.copy_from_host(0, &[0u8; 4096]).unwrap();
        buf.copy_from_host(0, &[me as u8 + 1; 8]).unwrap();
        let reg = comm
            .register_buffer(&buf, [Transport::Ib(0), Transport::Ethernet])
            .unwrap();
        comm.send_memory(&reg, peer, 0).unwrap();
        let theirs = comm.recv_memory(peer, 0).unwrap();
        let t = Instant::now();
        let mut cfg = EndpointConfig::new(Transport::Ib(0));
        cfg.flush_timeout = Duration::from_secs(10);
        match comm.connect(cfg, peer, 0) {
            Err(Error::Transport {
                kind: TransportErrorKind::Unavailable,
                detail,
                ..
            }) => {
                println!("rank {me}: Ib unavailable as expected: {detail}");
                assert!(
                    t.elapsed() < Duration::from_secs(5),
                    "took {:?}",
                    t.elapsed()
                );
                // The communicator is not poisoned: another transport still connects.
                let eth = comm
                    .connect(EndpointConfig::new(Transport::Ethernet), peer, 1)
                    .unwrap();
                eth.write(&theirs, 0, &reg, 0, 8).unwrap();
                eth.flush(Duration::from_secs(10)).unwrap();
            }
            Err(e) => panic!("rank {me}: expected an Unavailable error, got {e}"),
            Ok(conn) => {
                // Real hardware: move data both ways and check it after the barrier.
                conn.write(&theirs, 64, &reg, 0, 8).unwrap();
                let word = AtomicU64::new(0);
                conn.update_and_sync(&theirs, 128, &word, 5).unwrap();
                conn.flush(Duration::from_secs(10)).unwrap();
                comm.bootstrap().barrier().unwrap();
                let mut got = [0u8; 136];
                buf.copy_to_host(0, &mut got).unwrap();
                assert_eq!(got[64..72], [peer as u8 + 1; 8]);
                assert_eq!(u64::from_le_bytes(got[128..136].try_into().unwrap()), 5);
            }
        }
        comm.bootstrap().barrier().unwrap();
    });
}
