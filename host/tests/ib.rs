//! The `Ib` transport where it can be tested without RDMA hardware: connecting fails on every
//! rank with a typed [`Error::IbUnavailable`] (no libibverbs, no device, or a build without the
//! `ib` feature), at once and without a panic, and the communicator stays usable.
//! On a machine with an active RDMA port the same test instead moves data and checks it.

use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use mscclpp_host::Error;
use mscclpp_host::connection::EndpointConfig;
use mscclpp_host::transport::Transport;
use mscclpp_test_support::ranks_as_threads;

#[test]
fn connecting_without_rdma_is_a_typed_error_or_works() {
    ranks_as_threads(2, |comm| {
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
            Err(Error::IbUnavailable { reason }) => {
                println!("rank {me}: Ib unavailable as expected: {reason}");
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
            Err(e) => panic!("rank {me}: expected IbUnavailable, got {e}"),
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
