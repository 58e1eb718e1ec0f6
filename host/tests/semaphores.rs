//! Semaphores built from their two halves: a local `SemaphoreStub` and the peer's
//! `RemoteSemaphoreStub`, traded by the communicator. Host-to-host semaphores carry tokens both
//! ways over each transport the CPU backend has here (`Shm`, `Ethernet` on loopback), and the
//! constructors refuse halves that do not fit (words too short, words of another rank).
//! Ranks are threads on the CPU backend (host-to-host semaphores need host-readable words).

use std::time::{Duration, Instant};

use mscclpp_host::Error;
use mscclpp_host::communicator::Communicator;
use mscclpp_host::connection::EndpointConfig;
use mscclpp_host::gpu::BackendKind;
use mscclpp_host::semaphore::{Host2DeviceSemaphore, RemoteSemaphoreStub, SemaphoreStub};
use mscclpp_host::transport::Transport;
use mscclpp_test_support::ranks_as_threads_on;

const TIMEOUT: Duration = Duration::from_secs(20);

/// `n` ranks as threads on the CPU backend (these are tests of the host's side).
fn world<T: Send>(n: usize, body: impl Fn(Communicator) -> T + Sync) -> Vec<T> {
    ranks_as_threads_on(BackendKind::Cpu, n, body)
}

/// Rank 0 gives rank 1 three tokens, then rank 1 gives rank 0 two; nothing more arrives.
fn tokens_both_ways(comm: &Communicator, transport: Transport, tag: u64) {
    let (me, peer) = (comm.rank(), 1 - comm.rank());
    let conn = comm
        .connect(EndpointConfig::new(transport), peer, tag)
        .unwrap();
    let mut sem = comm.build_host_semaphore(conn, tag).unwrap();
    let (give, take) = if me == 0 { (3, 2) } else { (2, 3) };
    if me == 0 {
        for _ in 0..give {
            sem.signal().unwrap();
        }
    }
    for i in 0..take {
        sem.wait(TIMEOUT)
            .unwrap_or_else(|e| panic!("{transport}: rank {me}, token {i}: {e}"));
    }
    if me == 1 {
        for _ in 0..give {
            sem.signal().unwrap();
        }
    }
    comm.barrier().unwrap();
    assert!(
        !sem.poll(),
        "{transport}: rank {me} got a token nobody gave"
    );
    let start = Instant::now();
    match sem.wait(Duration::from_millis(50)) {
        Err(Error::SemaphoreTimeout { expected, .. }) => {
            assert_eq!(expected, take as u64 + 1, "{transport}")
        }
        other => panic!("{transport}: rank {me}: a wait for no token gave {other:?}"),
    }
    assert!(start.elapsed() < TIMEOUT);
    comm.barrier().unwrap();
}

#[test]
fn host_semaphores_carry_tokens_over_shm_and_ethernet() {
    world(2, |comm| {
        tokens_both_ways(&comm, Transport::Shm, 1);
        tokens_both_ways(&comm, Transport::Ethernet, 2);
    });
}

#[test]
fn semaphore_halves_that_do_not_fit_are_refused() {
    world(2, |comm| {
        let (me, peer) = (comm.rank(), 1 - comm.rank());
        let conn = comm
            .connect(EndpointConfig::new(Transport::Shm), peer, 0)
            .unwrap();
        // Words of this very rank are not the peer's words.
        let local: SemaphoreStub = comm.semaphore_stub(Transport::Shm).unwrap();
        let mine =
            RemoteSemaphoreStub::deserialize(&local.serialize(), comm.gpu(), me, true).unwrap();
        assert_eq!(mine.rank(), me);
        let other = comm.semaphore_stub(Transport::Shm).unwrap();
        match Host2DeviceSemaphore::new(other, mine, conn.clone(), comm.status().clone()) {
            Err(Error::SemaphorePeer {
                stub_rank,
                connection_rank,
            }) => assert_eq!((stub_rank, connection_rank), (me, peer)),
            Err(e) => panic!("rank {me}: {e}"),
            Ok(_) => panic!("rank {me}: a semaphore over its own words"),
        }
        // A registered memory shorter than the two words is not a semaphore's.
        let short = comm.gpu().alloc(SemaphoreStub::BYTES / 2).unwrap();
        let reg = comm.register_buffer(&short, Transport::Shm).unwrap();
        match RemoteSemaphoreStub::deserialize(&reg.serialize(), comm.gpu(), me, true) {
            Err(Error::MalformedMemory { rank, reason }) => {
                assert_eq!(rank, me);
                assert!(reason.contains("semaphore"), "{reason}");
            }
            other => panic!("rank {me}: short words gave {other:?}"),
        }
        // The communicator's trade still works afterwards.
        let sem = comm.build_semaphore(conn, 9).unwrap();
        assert_eq!(sem.connection().remote_rank(), peer);
        comm.barrier().unwrap();
    });
}
