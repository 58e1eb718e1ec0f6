//! Semaphores, MemoryChannel (direct and LL packets) and PortChannel (through the proxy)
//! between two ranks, as threads and as processes, with data checked; an abort releases a
//! waiting kernel; an invalid trigger is refused by the proxy.

use std::sync::Arc;
use std::time::Duration;

use mscclpp::DEVICE_PTX;
use mscclpp::device::packet::packets_for;
use mscclpp::host::communicator::Communicator;
use mscclpp::host::connection::{Connection, EndpointConfig};
use mscclpp::host::gpu::LaunchConfig;
use mscclpp::host::memory_channel::MemoryChannel;
use mscclpp::host::port_channel::PortChannelService;
use mscclpp::host::transport::Transport;
use mscclpp::kernels;
use mscclpp::shared::{DeviceErrorCode, LL16Packet, PingPongParams, PortPingPongParams};
use mscclpp_test_support as harness;
use mscclpp_test_support::MARKER;
use mscclpp_test_support::{module, pattern, ranks_as_processes, ranks_as_threads};

const BYTES: usize = 40 * 1024 + 12;
const ITERS: u32 = 16;

fn connect(comm: &Communicator) -> Arc<dyn Connection> {
    let peer = 1 - comm.rank();
    let t = Transport::local_for(comm.gpu().kind());
    comm.connect(EndpointConfig::new(t), peer, 0)
        .expect("connect")
}

fn memory_and_packet_ping_pong(comm: Communicator) {
    let (rank, peer) = (comm.rank(), 1 - comm.rank());
    let g = comm.gpu().clone();
    let t = Transport::local_for(g.kind());
    let conn = connect(&comm);
    let recv_buf = g.alloc(BYTES).unwrap();
    recv_buf.copy_from_host(0, &[MARKER; BYTES]).unwrap();
    let src = g.alloc(BYTES).unwrap();
    let pkts = g.alloc(packets_for::<LL16Packet>(BYTES) * 16).unwrap();
    src.copy_from_host(0, &pattern(BYTES, rank as u8)).unwrap();
    comm.send_memory(&comm.register_buffer(&recv_buf, t).unwrap(), peer, 0)
        .unwrap();
    comm.send_memory(&comm.register_buffer(&pkts, t).unwrap(), peer, 1)
        .unwrap();
    let peer_buf = comm.recv_memory(peer, 0).unwrap();
    let peer_pkts = comm.recv_memory(peer, 1).unwrap();
    let direct = MemoryChannel::new(
        comm.build_memory_semaphore(conn.as_ref(), 0).unwrap(),
        peer_buf,
        src.ptr(),
        pkts.ptr(),
    )
    .unwrap();
    let packets = MemoryChannel::new(
        comm.build_memory_semaphore(conn.as_ref(), 1).unwrap(),
        peer_pkts,
        src.ptr(),
        pkts.ptr(),
    )
    .unwrap();

    let m = module(&g, DEVICE_PTX);
    let stream = g.stream().unwrap();
    let params = |ch: &MemoryChannel| PingPongParams {
        status: comm.status().device_ptr(),
        channel: ch.device_handle().unwrap(),
        bytes: BYTES as u64,
        iterations: ITERS,
        role: rank as u32,
        flag_base: 0,
        reserved: 0,
    };
    let k = m.kernel(kernels::MEMORY_PING_PONG).unwrap();
    // SAFETY: the channel's buffers are live and BYTES long; 4 bytes of shared memory.
    unsafe {
        stream.launch(
            &k,
            LaunchConfig::new(1, 64).with_shared_mem(4),
            params(&direct),
        )
    }
    .unwrap();
    stream.synchronize().unwrap();
    assert!(
        comm.status().error().is_none(),
        "{:?}",
        comm.status().error()
    );
    let mut got = vec![0u8; BYTES];
    recv_buf.copy_to_host(0, &mut got).unwrap();
    assert_eq!(got, pattern(BYTES, peer as u8), "rank {rank}: direct puts");

    // Packets: rank 1 forwards what it receives, so both end with rank 0's bytes.
    let k = m.kernel(kernels::PACKET_PING_PONG).unwrap();
    // SAFETY: as above; the packet buffers hold packets_for(BYTES) LL16 packets.
    unsafe { stream.launch(&k, LaunchConfig::new(1, 64), params(&packets)) }.unwrap();
    stream.synchronize().unwrap();
    assert!(
        comm.status().error().is_none(),
        "{:?}",
        comm.status().error()
    );
    src.copy_to_host(0, &mut got).unwrap();
    assert_eq!(got, pattern(BYTES, 0), "rank {rank}: packets");
    comm.bootstrap().barrier().unwrap();
}

fn port_ping_pong(comm: Communicator) {
    let (rank, peer) = (comm.rank(), 1 - comm.rank());
    let g = comm.gpu().clone();
    let t = Transport::local_for(g.kind());
    let conn = connect(&comm);
    let recv_buf = g.alloc(BYTES).unwrap();
    recv_buf.copy_from_host(0, &[MARKER; BYTES]).unwrap();
    let src = g.alloc(BYTES).unwrap();
    src.copy_from_host(0, &pattern(BYTES, 10 + rank as u8))
        .unwrap();
    let mut svc = PortChannelService::builder(comm.gpu(), comm.status(), 64).unwrap();
    let sem = svc
        .add_semaphore(comm.build_semaphore(conn, 7).unwrap())
        .unwrap();
    comm.send_memory(&comm.register_buffer(&recv_buf, t).unwrap(), peer, 3)
        .unwrap();
    let dst = svc.add_memory(comm.recv_memory(peer, 3).unwrap()).unwrap();
    let srcid = svc
        .add_memory(comm.register_buffer(&src, t).unwrap())
        .unwrap();
    let ch = svc.port_channel(sem, dst, srcid).unwrap();
    let svc = svc.start().unwrap();
    let m = module(&g, DEVICE_PTX);
    let k = m.kernel(kernels::PORT_PING_PONG).unwrap();
    let stream = g.stream().unwrap();
    for flush in [0, 1] {
        let p = PortPingPongParams {
            status: comm.status().device_ptr(),
            channel: ch,
            bytes: BYTES as u64,
            iterations: ITERS,
            role: rank as u32,
            flush,
            reserved: 0,
            trace: mscclpp::shared::TraceDeviceHandle::OFF,
        };
        // SAFETY: the channel's memories are live and BYTES long.
        unsafe { stream.launch(&k, LaunchConfig::new(1, 1), p) }.unwrap();
        stream.synchronize().unwrap();
        assert!(
            comm.status().error().is_none(),
            "{:?}",
            comm.status().error()
        );
        assert_eq!(svc.error(), None);
        let mut got = vec![0u8; BYTES];
        recv_buf.copy_to_host(0, &mut got).unwrap();
        assert_eq!(
            got,
            pattern(BYTES, 10 + peer as u8),
            "rank {rank} flush {flush}"
        );
        recv_buf.copy_from_host(0, &[MARKER; BYTES]).unwrap();
        comm.bootstrap().barrier().unwrap();
    }
    svc.stop().unwrap();
    comm.bootstrap().barrier().unwrap();
}

fn abort_releases_a_waiting_kernel(comm: Communicator) {
    let peer = 1 - comm.rank();
    let g = comm.gpu().clone();
    let t = Transport::local_for(g.kind());
    let conn = connect(&comm);
    let buf = g.alloc(4096).unwrap();
    comm.send_memory(&comm.register_buffer(&buf, t).unwrap(), peer, 0)
        .unwrap();
    let ch = MemoryChannel::new(
        comm.build_memory_semaphore(conn.as_ref(), 0).unwrap(),
        comm.recv_memory(peer, 0).unwrap(),
        buf.ptr(),
        buf.ptr(),
    )
    .unwrap();
    let m = module(&g, DEVICE_PTX);
    let k = m.kernel(kernels::MEMORY_PING_PONG).unwrap();
    let stream = g.stream().unwrap();
    // Role 1 on both ranks: each waits for a signal nobody sends.
    let p = PingPongParams {
        status: comm.status().device_ptr(),
        channel: ch.device_handle().unwrap(),
        bytes: 16,
        iterations: 1,
        role: 1,
        flag_base: 0,
        reserved: 0,
    };
    // SAFETY: the buffers are live and 4096 bytes long.
    unsafe { stream.launch(&k, LaunchConfig::new(1, 32).with_shared_mem(4), p) }.unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !stream.query().unwrap(),
        "the kernel returned without a signal"
    );
    // Both ranks have seen their kernel waiting before either aborts: an abort reaches the
    // peer through the bootstrap and would release its kernel before its check above.
    comm.bootstrap().barrier().unwrap();
    comm.abort();
    assert!(
        stream.synchronize_timeout(Duration::from_secs(20)).unwrap(),
        "abort did not release the kernel"
    );
    match comm.status().error() {
        Some(mscclpp::host::Error::Device { code, .. }) => {
            assert_eq!(code, DeviceErrorCode::Aborted)
        }
        other => panic!("expected an abort record, got {other:?}"),
    }
    assert!(
        comm.recv_memory(peer, 9).is_err(),
        "an aborted communicator kept working"
    );
}

fn invalid_trigger_is_refused(comm: Communicator) {
    let (rank, peer) = (comm.rank(), 1 - comm.rank());
    let g = comm.gpu().clone();
    let t = Transport::local_for(g.kind());
    let conn = connect(&comm);
    let buf = g.alloc(4096).unwrap();
    let mut svc = PortChannelService::builder(comm.gpu(), comm.status(), 16).unwrap();
    let sem = svc
        .add_semaphore(comm.build_semaphore(conn, 0).unwrap())
        .unwrap();
    comm.send_memory(&comm.register_buffer(&buf, t).unwrap(), peer, 0)
        .unwrap();
    let dst = svc.add_memory(comm.recv_memory(peer, 0).unwrap()).unwrap();
    let src = svc
        .add_memory(comm.register_buffer(&buf, t).unwrap())
        .unwrap();
    let mut ch = svc.port_channel(sem, dst, src).unwrap();
    comm.bootstrap().barrier().unwrap();
    if rank == 0 {
        ch.dst = 7; // never registered
        let svc = svc.start().unwrap();
        let m = module(&g, DEVICE_PTX);
        let k = m.kernel(kernels::PORT_PING_PONG).unwrap();
        let stream = g.stream().unwrap();
        let p = PortPingPongParams {
            status: comm.status().device_ptr(),
            channel: ch,
            bytes: 64,
            iterations: 1,
            role: 0,
            flush: 1,
            reserved: 0,
            trace: mscclpp::shared::TraceDeviceHandle::OFF,
        };
        // SAFETY: the buffers are live; the proxy refuses the bad id before any copy.
        unsafe { stream.launch(&k, LaunchConfig::new(1, 1), p) }.unwrap();
        assert!(
            stream.synchronize_timeout(Duration::from_secs(20)).unwrap(),
            "the kernel hung"
        );
        let err = svc.error().expect("the proxy accepted an invalid trigger");
        assert!(err.contains("memory id 7"), "{err}");
        assert!(comm.status().is_aborted());
        assert!(svc.stop().is_err());
        // The communicator is aborted now, so its bootstrap waits fail at once; a send still
        // goes through and tells rank 1 that it may drop its end.
        assert!(matches!(
            comm.bootstrap().barrier(),
            Err(mscclpp::host::Error::Aborted { .. })
        ));
        comm.bootstrap().send(1, DONE_TAG, b"").unwrap();
    } else {
        comm.bootstrap().recv(0, DONE_TAG).unwrap();
    }
}

/// Tag of `invalid_trigger_is_refused`'s all-clear from rank 0.
const DONE_TAG: u64 = 99;

#[test]
fn memory_channel_threads() {
    if harness::enough_gpus("memory_channel_threads", 2) {
        ranks_as_threads(2, memory_and_packet_ping_pong);
    }
}

#[test]
fn memory_channel_processes() {
    match harness::child_communicator() {
        Some(c) => memory_and_packet_ping_pong(c),
        None => ranks_as_processes(2, "memory_channel_processes"),
    }
}

#[test]
fn port_channel_threads() {
    if harness::enough_gpus("port_channel_threads", 2) {
        ranks_as_threads(2, port_ping_pong);
    }
}

#[test]
fn port_channel_processes() {
    match harness::child_communicator() {
        Some(c) => port_ping_pong(c),
        None => ranks_as_processes(2, "port_channel_processes"),
    }
}

#[test]
fn abort_releases_waiters() {
    if harness::enough_gpus("abort_releases_waiters", 2) {
        ranks_as_threads(2, abort_releases_a_waiting_kernel);
    }
}

#[test]
fn invalid_trigger_threads() {
    ranks_as_threads(2, invalid_trigger_is_refused);
}

/// A rank that dies (SIGKILL) while its peer's kernel waits for it: the survivor's health
/// monitor sees the bootstrap link close, aborts the communicator, the kernel returns, and the
/// communicator reports `Error::Remote` naming the dead rank — within 10 s.
#[test]
fn dead_peer_releases_the_survivor() {
    let Some(comm) = harness::child_communicator() else {
        let ends = harness::Processes::new("dead_peer_releases_the_survivor", 2).run();
        assert_eq!(
            ends.len(),
            2,
            "rank 0 did not start the world: {}",
            ends[0].text()
        );
        assert!(ends[0].success(), "the survivor failed: {}", ends[0].text());
        assert!(
            !ends[1].status.success() && !ends[1].overran,
            "the victim was not killed: {}",
            ends[1].text()
        );
        return;
    };
    let peer = 1 - comm.rank();
    let g = comm.gpu().clone();
    let t = Transport::local_for(g.kind());
    let conn = connect(&comm);
    let buf = g.alloc(4096).unwrap();
    comm.send_memory(&comm.register_buffer(&buf, t).unwrap(), peer, 0)
        .unwrap();
    let ch = MemoryChannel::new(
        comm.build_memory_semaphore(conn.as_ref(), 0).unwrap(),
        comm.recv_memory(peer, 0).unwrap(),
        buf.ptr(),
        buf.ptr(),
    )
    .unwrap();
    comm.bootstrap().barrier().unwrap();
    if comm.rank() == 1 {
        std::thread::sleep(Duration::from_millis(200));
        // SAFETY: ends this process at once, as a crash would.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        unreachable!();
    }
    let m = module(&g, DEVICE_PTX);
    let k = m.kernel(kernels::MEMORY_PING_PONG).unwrap();
    let stream = g.stream().unwrap();
    let p = PingPongParams {
        status: comm.status().device_ptr(),
        channel: ch.device_handle().unwrap(),
        bytes: 16,
        iterations: 1,
        role: 1,
        flag_base: 0,
        reserved: 0,
    };
    let start = std::time::Instant::now();
    // SAFETY: the buffers are live and 4096 bytes long.
    unsafe { stream.launch(&k, LaunchConfig::new(1, 32).with_shared_mem(4), p) }.unwrap();
    assert!(
        stream.synchronize_timeout(Duration::from_secs(10)).unwrap(),
        "the kernel still waits for a dead peer"
    );
    let waited = start.elapsed();
    match comm.async_error() {
        Some(mscclpp::host::Error::Remote { rank, .. }) => assert_eq!(rank, 1),
        other => panic!("expected Error::Remote naming rank 1, got {other:?}"),
    }
    assert!(matches!(
        comm.recv_memory(peer, 5),
        Err(mscclpp::host::Error::Remote { rank: 1, .. })
    ));
    println!("survivor released after {waited:?}");
}

/// The end of a program: the rank that finishes its last collective first closes its
/// bootstrap with a goodbye, and the others, still finishing theirs, do not fail for it; what
/// they still want from it fails at once; only after the leave grace do they abort, naming it.
#[test]
fn a_rank_that_finishes_first_does_not_fail_the_others() {
    const TAG: u64 = 77;
    ranks_as_threads(3, |comm: Communicator| {
        comm.set_leave_grace(Duration::from_secs(3));
        comm.bootstrap().barrier().unwrap();
        if comm.rank() == 0 {
            return; // drops the communicator and its bootstrap, with a goodbye
        }
        // Once rank 0's connections have closed, and a few health-monitor polls (20 ms) later.
        let t = std::time::Instant::now();
        while comm.bootstrap().left_peer().is_none() {
            assert!(t.elapsed() < Duration::from_secs(20), "rank 0 never left");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(comm.bootstrap().left_peer().map(|(r, _)| r), Some(0));
        std::thread::sleep(Duration::from_millis(200));
        assert!(comm.async_error().is_none(), "{:?}", comm.async_error());
        let other = 3 - comm.rank();
        comm.bootstrap().send(other, TAG, b"still here").unwrap();
        assert_eq!(comm.bootstrap().recv(other, TAG).unwrap(), b"still here");
        let t = std::time::Instant::now();
        let e = comm.bootstrap().recv(0, TAG).unwrap_err();
        assert!(
            matches!(e, mscclpp::host::Error::BootstrapPeerClosed { .. }),
            "{e}"
        );
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        // After the grace: aborted, blaming rank 0.
        let t = std::time::Instant::now();
        while !comm.status().is_aborted() {
            assert!(t.elapsed() < Duration::from_secs(20), "never aborted");
            std::thread::sleep(Duration::from_millis(20));
        }
        match comm.async_error() {
            Some(mscclpp::host::Error::Remote { rank: 0, reason }) => {
                assert!(reason.contains("finished"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    });
}

/// A rank whose communicator failed (here: aborted) closes without a goodbye, so the others
/// abort at once, as for a rank that died, not after the leave grace.
#[test]
fn a_rank_that_failed_leaves_without_goodbye() {
    ranks_as_threads(3, |comm: Communicator| {
        comm.set_leave_grace(Duration::from_secs(600));
        comm.bootstrap().barrier().unwrap();
        if comm.rank() == 0 {
            comm.abort();
            return;
        }
        let t = std::time::Instant::now();
        while !comm.status().is_aborted() {
            assert!(t.elapsed() < Duration::from_secs(20), "never aborted");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(matches!(
            comm.async_error(),
            Some(mscclpp::host::Error::Remote { rank: 0, .. })
        ));
    });
}
