//! Buffers the peers know ahead of a call: registered by the caller
//! (`Collectives::register_buffer`, windows, `mem_alloc`), or by the library itself on a
//! call's first sight of an allocation (a hint). Calls on them send no bootstrap message
//! (counted by a wrapper of the bootstrap) and move the right data for every collective of the
//! direct kernel; an allocation travels to the peers once, through their registration services,
//! and a rank whose host is late never blocks another's host; ranks whose registrations differ
//! still agree on the path; deregistration while idle; windows checked across ranks;
//! mismatched calls refused on every rank with nothing written. Ranks as threads and as
//! processes.
//!
//! Ranks as threads and processes: the workspace's test harness (`mscclpp-test-support`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use mscclpp::collectives::{Algorithm, CollectiveConfig, Collectives};
use mscclpp::host::Error;
use mscclpp::host::communicator::Communicator;
use mscclpp::host::gpu::{DeviceBuffer, Stream};
use mscclpp::shared::{DataType, DeviceErrorCode, ReduceOp, RegisteredRefusal};

use mscclpp_test_support::{
    Sends, backend, child_counted_communicator, counted_ranks_as_threads, enough_gpus,
    ranks_as_processes,
};

/// Element `i` of part `p` of rank `r`'s input.
fn value(r: usize, p: usize, i: usize) -> u32 {
    (r as u32 + 1).wrapping_mul(0x9e37_79b9) ^ ((p * 7919 + i) as u32).wrapping_mul(0x85eb_ca6b)
}

/// What marks an output element nobody wrote.
const MARK: u32 = 0xdead_beef;

/// Elements per rank part: above every LL limit of the CPU configuration and the direct
/// threshold, so that the automatic choice takes the direct kernel.
fn part_elems(cfg: &CollectiveConfig) -> usize {
    let bytes = cfg
        .ll_max_bytes
        .max(cfg.ll128_max_bytes)
        .max(cfg.direct_min_bytes)
        + 4096;
    (bytes & !15) / 4
}

fn fill(buf: &DeviceBuffer, at: usize, words: &[u32]) {
    buf.copy_from_host(at * 4, bytemuck::cast_slice(words))
        .expect("copy in");
}

fn read(buf: &DeviceBuffer, at: usize, len: usize) -> Vec<u32> {
    let mut v = vec![0u32; len];
    buf.copy_to_host(at * 4, bytemuck::cast_slice_mut(&mut v))
        .expect("copy out");
    v
}

/// The collectives of the direct kernel on `input` / `output` (each `n * m` words at
/// `in_at` / `out_at`), every result checked; `expect` is the algorithm each must run.
#[allow(clippy::too_many_arguments)]
fn every_collective(
    c: &Collectives,
    st: &Stream,
    input: &DeviceBuffer,
    in_at: usize,
    output: &DeviceBuffer,
    out_at: usize,
    m: usize,
    expect: Algorithm,
    direct: Option<bool>,
) {
    let comm = c.communicator();
    let (r, n) = (comm.rank(), comm.size());
    let (ip, op) = (
        input.ptr().byte_add_cast::<u8>(in_at as u64 * 4),
        output.ptr().byte_add_cast::<u8>(out_at as u64 * 4),
    );
    let mine = |p: usize| (0..m).map(|i| value(r, p, i)).collect::<Vec<u32>>();
    let reset = || {
        for p in 0..n {
            fill(input, in_at + p * m, &mine(p));
        }
        fill(output, out_at, &vec![MARK; n * m]);
        comm.barrier().expect("barrier");
    };
    let done = |what: &str| {
        st.synchronize().expect("synchronize");
        assert!(
            comm.status().error().is_none(),
            "{what}: {:?}",
            comm.status().error()
        );
        assert_eq!(c.last_algorithm(), Some(expect), "{what}");
        if let Some(d) = direct {
            let declined = c.last_call_declined().expect("the verdict");
            assert_eq!(!declined, d, "{what}: ran on the direct kernel");
        }
    };
    let sum = |p: usize, i: usize| (0..n).fold(0u32, |s, q| s.wrapping_add(value(q, p, i)));

    reset();
    // SAFETY (every call below): `input` and `output` hold `n * m` words from their offsets and
    // outlive the synchronize in `done`.
    unsafe { c.all_reduce(ip, op, m, DataType::U32, ReduceOp::Sum, st, None) }.expect("ar");
    done("all_reduce");
    let got = read(output, out_at, m);
    assert!(
        got.iter().enumerate().all(|(i, &g)| g == sum(0, i)),
        "all_reduce data"
    );

    reset();
    unsafe { c.all_gather(ip, op, m, DataType::U32, st, None) }.expect("ag");
    done("all_gather");
    let got = read(output, out_at, n * m);
    for q in 0..n {
        let want: Vec<u32> = (0..m).map(|i| value(q, 0, i)).collect();
        assert_eq!(&got[q * m..(q + 1) * m], &want[..], "all_gather part {q}");
    }

    reset();
    unsafe { c.reduce_scatter(ip, op, m, DataType::U32, ReduceOp::Sum, st, None) }.expect("rs");
    done("reduce_scatter");
    let got = read(output, out_at, m);
    assert!(
        got.iter().enumerate().all(|(i, &g)| g == sum(r, i)),
        "reduce_scatter data"
    );

    reset();
    unsafe { c.broadcast(ip, op, m, DataType::U32, 1 % n, st, None) }.expect("bc");
    done("broadcast");
    let want: Vec<u32> = (0..m).map(|i| value(1 % n, 0, i)).collect();
    assert_eq!(read(output, out_at, m), want, "broadcast data");

    reset();
    unsafe { c.all_to_all(ip, op, m, DataType::U32, st, None) }.expect("a2a");
    done("all_to_all");
    let got = read(output, out_at, n * m);
    for q in 0..n {
        let want: Vec<u32> = (0..m).map(|i| value(q, r, i)).collect();
        assert_eq!(&got[q * m..(q + 1) * m], &want[..], "all_to_all part {q}");
    }

    reset();
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    unsafe { c.send_recv(ip, next, op, prev, m, DataType::U32, st) }.expect("send_recv");
    st.synchronize().expect("synchronize");
    assert!(comm.status().error().is_none());
    let want: Vec<u32> = (0..m).map(|i| value(prev, 0, i)).collect();
    assert_eq!(read(output, out_at, m), want, "send_recv data");
}

/// Waits until every peer answered every registration of this rank (at most 30 s), then
/// meets the other ranks.
fn settle(c: &Collectives) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !c.registrations_settled() {
        assert!(
            Instant::now() < deadline,
            "registrations not answered in 30 s"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    c.communicator().barrier().expect("barrier");
}

/// Every collective of the direct kernel on buffers nobody registered: the first calls send
/// each allocation to the peers once (and are handed on by the direct kernel, on every rank
/// alike, until the peers have them), the calls after send no bootstrap message and run on the
/// direct kernel; then on registered buffers (`register_buffer`, at an offset inside the
/// allocations), the same; deregistered, the allocations' hints serve again, still without a
/// message. Right data throughout. 2 and 3 ranks.
#[test]
fn registered_calls_send_no_bootstrap_message() {
    for n in [2, 3] {
        if !enough_gpus("registered buffers", n) {
            continue;
        }
        counted_ranks_as_threads(n, |comm: Communicator, sends: Sends| {
            let cfg = CollectiveConfig::for_backend(comm.gpu().kind());
            let m = part_elems(&cfg);
            let c = Collectives::with_config(Arc::new(comm), cfg)?;
            let comm = c.communicator().clone();
            let st = comm.gpu().stream()?;
            let (input, output) = (
                comm.gpu().alloc(n * m * 4 + 64)?,
                comm.gpu().alloc(n * m * 4 + 64)?,
            );

            // Unregistered, first sight: each allocation goes to every peer once.
            let before = sends.get();
            every_collective(&c, &st, &input, 4, &output, 8, m, Algorithm::Direct, None);
            let first = sends.get() - before;
            // (the helper's own barriers: 6)
            assert!(first > 6, "the allocations travel: {first}");
            settle(&c);
            assert_eq!(
                c.hints(),
                (2, 2),
                "one hint per allocation, every peer has it"
            );
            let before = sends.get();
            every_collective(
                &c,
                &st,
                &input,
                4,
                &output,
                8,
                m,
                Algorithm::Direct,
                Some(true),
            );
            assert_eq!(
                sends.get() - before,
                6,
                "calls after the first sight send nothing (6 = the helper's barriers)"
            );

            // SAFETY (every registration below): the buffers outlive the collectives.
            let ri = unsafe { c.register_buffer(input.ptr().byte_add_cast(16), n * m * 4 + 32) }?;
            let ro = unsafe { c.register_buffer(output.ptr(), n * m * 4 + 64) }?;
            assert!(ri.is_shared() && ro.is_shared());
            assert_eq!(c.registrations().0, 2);
            settle(&c);
            let before = sends.get();
            every_collective(
                &c,
                &st,
                &input,
                4,
                &output,
                8,
                m,
                Algorithm::Direct,
                Some(true),
            );
            assert_eq!(
                sends.get() - before,
                6,
                "registered calls send nothing (6 = the helper's barriers)"
            );

            // Deregistered while idle: the hints serve again, with no message.
            c.deregister(ri)?;
            c.deregister(ro)?;
            assert!(matches!(
                c.deregister(ro),
                Err(Error::UnknownRegistration { .. })
            ));
            comm.barrier()?;
            assert_eq!(c.registrations().0, 0);
            let before = sends.get();
            every_collective(
                &c,
                &st,
                &input,
                4,
                &output,
                8,
                m,
                Algorithm::Direct,
                Some(true),
            );
            assert_eq!(sends.get() - before, 6, "the hints serve again");
            comm.barrier()
        });
    }
}

/// Issue 30, item 1 (no host rendezvous per call): rank 1's host sleeps 2 s before its first
/// call while rank 0 queues 100 all-reduces of 8 MiB on buffers nobody registered (the direct
/// kernel's range): rank 0's host returns from all of them long before rank 1 wakes, the
/// results are right, and after the allocations' first sight no call sends a bootstrap
/// message.
#[test]
fn a_late_rank_never_blocks_the_host_and_allocations_travel_once() {
    const CALLS: usize = 100;
    const BYTES: usize = 8 << 20;
    const LATE: Duration = Duration::from_secs(2);
    if !enough_gpus("a late rank", 2) {
        return;
    }
    counted_ranks_as_threads(2, |comm, sends| {
        let cfg = CollectiveConfig::for_backend(comm.gpu().kind());
        assert!(BYTES >= cfg.direct_min_bytes && BYTES > cfg.ll128_max_bytes);
        let c = Collectives::with_config(Arc::new(comm), cfg)?;
        let comm = c.communicator().clone();
        let r = comm.rank();
        let st = comm.gpu().stream()?;
        let m = BYTES / 4;
        let (input, output) = (comm.gpu().alloc(BYTES)?, comm.gpu().alloc(BYTES)?);
        fill(
            &input,
            0,
            &(0..m).map(|i| value(r, 0, i)).collect::<Vec<_>>(),
        );
        comm.barrier()?;
        if r == 1 {
            std::thread::sleep(LATE);
        }
        let (start, before) = (Instant::now(), sends.get());
        let mut first = 0;
        for k in 0..CALLS {
            // SAFETY: both hold `m` words until the synchronize.
            unsafe {
                c.all_reduce(
                    input.ptr(),
                    output.ptr(),
                    m,
                    DataType::U32,
                    ReduceOp::Sum,
                    &st,
                    None,
                )
            }?;
            if k == 0 {
                first = sends.get() - before;
            }
        }
        let queued = start.elapsed();
        let later = sends.get() - before - first;
        if r == 0 {
            assert!(
                queued < LATE / 2,
                "rank 0's host waited for rank 1: {queued:?} for {CALLS} calls"
            );
        }
        assert!(first > 0, "the first call sends the allocations");
        assert_eq!(later, 0, "calls after the first sight send nothing");
        st.synchronize()?;
        assert!(
            comm.status().error().is_none(),
            "{:?}",
            comm.status().error()
        );
        let got = read(&output, 0, m);
        for (i, g) in got.iter().enumerate() {
            assert_eq!(
                *g,
                value(0, 0, i).wrapping_add(value(1, 0, i)),
                "element {i}"
            );
        }
        eprintln!(
            "rank {r}: {CALLS} calls of {BYTES} bytes queued in {queued:?}; {first} messages \
             at the first, {later} after"
        );
        comm.barrier()
    });
}

/// Memory of `mem_alloc` is registered already: calls on it send nothing; `mem_free` takes it
/// back. Windows: symmetric, the same slot everywhere, calls on them send nothing (the direct
/// kernel, and the copy engines at their sizes).
#[test]
fn mem_alloc_and_windows_send_nothing() {
    if !enough_gpus("registered buffers", 3) {
        return;
    }
    counted_ranks_as_threads(3, |comm, sends| {
        let cfg = CollectiveConfig::for_backend(comm.gpu().kind());
        let (n, m) = (3, part_elems(&cfg));
        let c = Collectives::with_config(Arc::new(comm), cfg)?;
        let comm = c.communicator().clone();
        let st = comm.gpu().stream()?;
        let a = c.mem_alloc(n * m * 4)?;
        let b = c.mem_alloc(n * m * 4)?;
        settle(&c);
        let r = comm.rank();
        // A `DeviceBuffer` view is not available for library memory: copy through a staging
        // buffer of our own.
        let x: Vec<u32> = (0..m).map(|i| value(r, 0, i)).collect();
        let stage = comm.gpu().alloc(n * m * 4)?;
        fill(&stage, 0, &x);
        // SAFETY: both hold `m` words.
        unsafe { st.copy_dtod(a.ptr(), stage.ptr(), m * 4) }?;
        // The first call trades the staging region of the algorithm queued behind the direct
        // kernel (in case it declines); the second sends nothing.
        for round in 0..2 {
            let before = sends.get();
            // SAFETY: `a` and `b` hold `n * m` words until the synchronize.
            unsafe { c.all_gather(a.ptr(), b.ptr(), m, DataType::U32, &st, None) }?;
            st.synchronize()?;
            assert!(!c.last_call_declined()?, "ran on the direct kernel");
            if round == 1 {
                assert_eq!(sends.get(), before, "mem_alloc memory sends nothing");
            }
        }
        assert_eq!(c.last_algorithm(), Some(Algorithm::Direct));
        // SAFETY: as above.
        unsafe { st.copy_dtod(stage.ptr(), b.ptr(), n * m * 4) }?;
        st.synchronize()?;
        let got = read(&stage, 0, n * m);
        for q in 0..n {
            let want: Vec<u32> = (0..m).map(|i| value(q, 0, i)).collect();
            assert_eq!(&got[q * m..(q + 1) * m], &want[..], "part {q}");
        }
        c.mem_free(a.ptr())?;
        c.mem_free(b.ptr())?;
        assert!(c.mem_free(b.ptr()).is_err(), "freed twice");

        // Windows: collective, same size everywhere.
        let wi = comm.gpu().alloc(m * 4)?;
        let wo = comm.gpu().alloc(m * 4)?;
        // SAFETY (every window below): the buffers outlive the collectives.
        let w1 = unsafe { c.register_window(wi.ptr(), m * 4) }?;
        let w2 = unsafe { c.register_window(wo.ptr(), m * 4) }?;
        assert!(w1.is_window() && w2.is_window());
        fill(&wi, 0, &x);
        let before = sends.get();
        // SAFETY: the windows hold `m` words until the synchronize.
        unsafe {
            c.all_reduce(
                wi.ptr(),
                wo.ptr(),
                m,
                DataType::U32,
                ReduceOp::Sum,
                &st,
                None,
            )
        }?;
        st.synchronize()?;
        assert_eq!(sends.get(), before, "calls on windows send nothing");
        let got = read(&wo, 0, m);
        for (i, g) in got.iter().enumerate() {
            let want = (0..n).fold(0u32, |s, q| s.wrapping_add(value(q, 0, i)));
            assert_eq!(*g, want, "element {i}");
        }
        c.deregister_window(w2)?;
        c.deregister_window(w1)?;
        // Windows at the copy engines' sizes: all-gather by copy engine, the peers' addresses
        // from the windows, still no message; send_recv on the point-to-point engine (through
        // the scratch, whatever the buffers), no message either.
        let big = (cfg.ce_min_bytes + 4096) / 4;
        let (ci, co) = (comm.gpu().alloc(big * 4)?, comm.gpu().alloc(n * big * 4)?);
        // SAFETY: the buffers outlive the windows.
        let (w3, w4) = unsafe {
            (
                c.register_window(ci.ptr(), big * 4)?,
                c.register_window(co.ptr(), n * big * 4)?,
            )
        };
        let xb: Vec<u32> = (0..big).map(|i| value(r, 1, i)).collect();
        fill(&ci, 0, &xb);
        comm.barrier()?;
        let before = sends.get();
        // SAFETY: the windows hold what the calls move until the synchronize.
        unsafe { c.all_gather(ci.ptr(), co.ptr(), big, DataType::U32, &st, None) }?;
        st.synchronize()?;
        assert_eq!(c.last_algorithm(), Some(Algorithm::CopyEngine));
        let got = read(&co, 0, n * big);
        for q in 0..n {
            let want: Vec<u32> = (0..big).map(|i| value(q, 1, i)).collect();
            assert_eq!(
                &got[q * big..(q + 1) * big],
                &want[..],
                "window all-gather part {q}"
            );
        }
        assert_eq!(sends.get(), before, "copy engines on windows send nothing");
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        // The first meeting of two ranks on the point-to-point engine trades its regions (at
        // most one message to each of `next` and `prev`: the one whose service answered first
        // has this rank's already); later calls send nothing.
        for (round, most) in [(0, 2), (1, 0)] {
            let before = sends.get();
            // SAFETY: as above (the output at offset 0 of its window on every rank).
            unsafe { c.send_recv(ci.ptr(), next, co.ptr(), prev, big, DataType::U32, &st) }?;
            st.synchronize()?;
            assert_eq!(c.last_algorithm(), Some(Algorithm::P2p));
            assert!(sends.get() - before <= most, "p2p call {round}");
        }
        let want: Vec<u32> = (0..big).map(|i| value(prev, 1, i)).collect();
        assert_eq!(read(&co, 0, big), want, "window send_recv");
        comm.barrier()?;
        c.deregister_window(w4)?;
        c.deregister_window(w3)?;
        // A window of another size on one rank: refused on every rank, nothing kept.
        let len = if r == 1 { m * 4 - 16 } else { m * 4 };
        match unsafe { c.register_window(wi.ptr(), len) } {
            Err(Error::WindowMismatch { .. }) => {}
            other => panic!("rank {r}: a window of another size: {other:?}"),
        }
        assert_eq!(c.registrations().0, 0);
        comm.barrier()
    });
}

/// A registered call that does not match on every rank is refused by every rank's kernel
/// (recorded as the communicator's error), and writes nothing: another count on one rank, and
/// a misaligned buffer on one rank.
#[test]
fn mismatched_registered_calls_write_nothing() {
    if !enough_gpus("registered buffers", 2) {
        return;
    }
    for case in ["count", "alignment"] {
        counted_ranks_as_threads(2, |comm, _| {
            let cfg = CollectiveConfig::for_backend(comm.gpu().kind());
            let m = part_elems(&cfg);
            let c = Collectives::with_config(Arc::new(comm), cfg)?;
            let comm = c.communicator().clone();
            let r = comm.rank();
            let st = comm.gpu().stream()?;
            let (input, output) = (
                comm.gpu().alloc(2 * m * 4 + 64)?,
                comm.gpu().alloc(2 * m * 4 + 64)?,
            );
            // SAFETY: the buffers outlive the collectives.
            unsafe { c.register_buffer(input.ptr(), 2 * m * 4 + 64) }?;
            // SAFETY: as above.
            unsafe { c.register_buffer(output.ptr(), 2 * m * 4 + 64) }?;
            fill(&output, 0, &vec![MARK; 2 * m + 16]);
            comm.barrier()?;
            let (count, at) = match (case, r) {
                ("count", 1) => (m + 4, 0),
                ("alignment", 1) => (m, 1),
                _ => (m, 0),
            };
            let out = output.ptr().byte_add_cast::<u8>(at * 4);
            // SAFETY: both hold `2 * m + 16` words; the kernel refuses before touching any.
            unsafe {
                c.all_gather(
                    input.ptr(),
                    out,
                    count,
                    DataType::U32,
                    &st,
                    Some(Algorithm::Direct),
                )
            }?;
            st.synchronize()?;
            let e = comm.status().error();
            let why = match e {
                Some(Error::Device {
                    code: DeviceErrorCode::InvalidArgument,
                    addr,
                    ..
                }) => RegisteredRefusal::from_u32((addr & 0xff) as u32),
                _ => None,
            };
            let want = match case {
                "count" => RegisteredRefusal::OtherCall,
                _ => RegisteredRefusal::NotOk,
            };
            assert_eq!(
                why,
                Some(want),
                "rank {r} ({case}): the kernel refuses: {e:?}"
            );
            assert!(
                read(&output, 0, 2 * m + 16).iter().all(|&w| w == MARK),
                "rank {r} ({case}): nothing written"
            );
            Ok(())
        });
    }
}

/// Registered calls as processes (buffers mapped across processes by the peers' registration
/// services): no bootstrap message, right data.
#[test]
fn registered_as_processes() {
    const TEST: &str = "registered_as_processes";
    if let Some((comm, sends)) = child_counted_communicator() {
        let cfg = CollectiveConfig::for_backend(comm.gpu().kind());
        let (n, m) = (comm.size(), part_elems(&cfg));
        let c = Collectives::with_config(Arc::new(comm), cfg).expect("collectives");
        let comm = c.communicator().clone();
        let st = comm.gpu().stream().expect("stream");
        let input = comm.gpu().alloc(n * m * 4).expect("alloc");
        let output = comm.gpu().alloc(n * m * 4).expect("alloc");
        // SAFETY: the buffers outlive the collectives.
        unsafe { c.register_buffer(input.ptr(), n * m * 4) }.expect("register");
        // SAFETY: as above.
        unsafe { c.register_buffer(output.ptr(), n * m * 4) }.expect("register");
        settle(&c);
        // The first round trades the point-to-point regions (its `send_recv`).
        every_collective(
            &c,
            &st,
            &input,
            0,
            &output,
            0,
            m,
            Algorithm::Direct,
            Some(true),
        );
        let before = sends.get();
        every_collective(
            &c,
            &st,
            &input,
            0,
            &output,
            0,
            m,
            Algorithm::Direct,
            Some(true),
        );
        // The helper's 6 barriers.
        assert_eq!(sends.get() - before, 6, "registered calls send nothing");
        comm.barrier().expect("barrier");
        return;
    }
    if !enough_gpus("registered buffers as processes", 3) {
        return;
    }
    ranks_as_processes(3, TEST);
}

/// Issue 30, item 3 (CUDA graphs, 2 GPUs): calls captured on a stream borrowed by its handle
/// (as PyTorch's is), with no eager call and no `prepare` before: every size and path
/// (LL, LL128 and staging, whose regions are traded at the first capture; the direct kernel on
/// registered buffers and on buffers nobody registered, whose allocations travel once at the
/// capture; a send and receive, whose point-to-point region too). The capture sends only those
/// one-time messages, the replays none; the graph replays right.
#[test]
fn captured_calls_at_every_size_need_no_eager_call() {
    use mscclpp::host::gpu::BackendKind;
    if backend() != BackendKind::Cuda {
        eprintln!("NOT RUN: captured calls need the CUDA backend");
        return;
    }
    if !enough_gpus("captured_calls_neither_allocate_nor_exchange", 2) {
        return;
    }
    counted_ranks_as_threads(2, |comm, sends| {
        let cfg = CollectiveConfig::for_backend(comm.gpu().kind());
        let n = 2;
        let c = Collectives::with_config(Arc::new(comm), cfg)?;
        let comm = c.communicator().clone();
        let r = comm.rank();
        let owner = comm.gpu().stream()?;
        // SAFETY: the owner outlives the borrowed stream.
        let st = unsafe { comm.gpu().borrow_stream(owner.raw()) }?;
        // Sizes (bytes per part) of LL, LL128, staging (below the direct threshold, above
        // LL128), and the direct kernel.
        let sizes = [
            (cfg.ll_part_max_bytes / 2) & !15,
            ((cfg.ll128_part_min_bytes + cfg.ll128_max_bytes) / 2) & !15,
            (cfg.ll128_max_bytes + 4096).min(cfg.direct_min_bytes.max(16) - 16) & !15,
            cfg.direct_min_bytes.max(cfg.ll128_max_bytes) * 2,
        ];
        let mut bufs = Vec::new();
        for (k, &bytes) in sizes.iter().enumerate() {
            let m = bytes / 4;
            let (inp, out) = (comm.gpu().alloc(m * 4)?, comm.gpu().alloc(n * m * 4)?);
            fill(&inp, 0, &(0..m).map(|i| value(r, k, i)).collect::<Vec<_>>());
            bufs.push((m, inp, out));
        }
        let (reg_in, reg_out) = (
            comm.gpu().alloc(bufs[3].0 * 4)?,
            comm.gpu().alloc(n * bufs[3].0 * 4)?,
        );
        fill(
            &reg_in,
            0,
            &(0..bufs[3].0).map(|i| value(r, 9, i)).collect::<Vec<_>>(),
        );
        // SAFETY: the buffers outlive the collectives' use of them.
        unsafe { c.register_buffer(reg_out.ptr(), n * bufs[3].0 * 4) }?;
        let (p2p_in, p2p_out) = (comm.gpu().alloc(4096)?, comm.gpu().alloc(4096)?);
        fill(
            &p2p_in,
            0,
            &(0..1024).map(|i| value(r, 7, i)).collect::<Vec<_>>(),
        );
        comm.barrier()?;
        let graph = st.capture(|| -> mscclpp::host::Result<()> {
            for (m, inp, out) in &bufs {
                // SAFETY: the buffers outlive the graph's replays below.
                unsafe { c.all_gather(inp.ptr(), out.ptr(), *m, DataType::U32, &st, None) }?;
            }
            let m = bufs[3].0;
            // SAFETY: as above.
            unsafe { c.all_gather(reg_in.ptr(), reg_out.ptr(), m, DataType::U32, &st, None) }?;
            // SAFETY: as above.
            unsafe {
                c.send_recv(
                    p2p_in.ptr(),
                    1 - r,
                    p2p_out.ptr(),
                    1 - r,
                    1024,
                    DataType::U32,
                    &st,
                )
            }?;
            Ok(())
        })?;
        let before = sends.get();
        for _ in 0..3 {
            // SAFETY: as above.
            unsafe { graph.launch(&st) }?;
        }
        st.synchronize()?;
        assert_eq!(sends.get(), before, "replays send nothing");
        assert!(
            comm.status().error().is_none(),
            "{:?}",
            comm.status().error()
        );
        for (k, (m, _, out)) in bufs.iter().enumerate() {
            let got = read(out, 0, n * m);
            for q in 0..n {
                let want: Vec<u32> = (0..*m).map(|i| value(q, k, i)).collect();
                assert_eq!(&got[q * m..(q + 1) * m], &want[..], "size {k}, part {q}");
            }
        }
        let m = bufs[3].0;
        let got = read(&reg_out, 0, n * m);
        for q in 0..n {
            let want: Vec<u32> = (0..m).map(|i| value(q, 9, i)).collect();
            assert_eq!(&got[q * m..(q + 1) * m], &want[..], "registered, part {q}");
        }
        let want: Vec<u32> = (0..1024).map(|i| value(1 - r, 7, i)).collect();
        assert_eq!(read(&p2p_out, 0, 1024), want, "send_recv");
        comm.barrier()
    });
}
