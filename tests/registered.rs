//! Registered buffers (`Collectives::register_buffer`, windows, `mem_alloc`): calls on them send
//! no bootstrap message (counted by a wrapper of the bootstrap), move the right data for every
//! collective of the direct kernel, and leave the per-call exchange to unregistered buffers;
//! deregistration while idle; windows checked across ranks; mismatched registered calls
//! refused on every rank with nothing written. Ranks as threads and as processes.
//!
//! Ranks as threads and processes: the workspace's test harness (`mscclpp-test-support`).

use std::sync::Arc;

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

/// Every collective of the direct kernel on registered buffers (`register_buffer`, at an
/// offset inside larger allocations) sends no bootstrap message, and moves the right data; the
/// same calls on unregistered buffers do send (so the count can fail); after deregistration
/// the buffers take the exchange again. 2 and 3 ranks.
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

            // Unregistered: every call exchanges its buffers.
            let before = sends.get();
            every_collective(&c, &st, &input, 4, &output, 8, m, Algorithm::Direct);
            let unregistered = sends.get() - before;
            // (the helper's own barriers: 6)
            assert!(
                unregistered > 6,
                "the exchange sends messages: {unregistered}"
            );

            // SAFETY (every registration below): the buffers outlive the collectives.
            let ri = unsafe { c.register_buffer(input.ptr().byte_add_cast(16), n * m * 4 + 32) }?;
            let ro = unsafe { c.register_buffer(output.ptr(), n * m * 4 + 64) }?;
            assert_eq!(c.registrations().0, 2);
            comm.barrier()?;
            assert_eq!(
                c.registrations().1,
                2 * (n - 1),
                "every peer's two, mapped here"
            );
            let before = sends.get();
            every_collective(&c, &st, &input, 4, &output, 8, m, Algorithm::Direct);
            assert_eq!(
                sends.get() - before,
                6,
                "registered calls send nothing (6 = the helper's barriers)"
            );

            // Deregistered while idle: the exchange again, data still right.
            c.deregister(ri)?;
            c.deregister(ro)?;
            assert!(matches!(
                c.deregister(ro),
                Err(Error::UnknownRegistration { .. })
            ));
            comm.barrier()?;
            assert_eq!(c.registrations(), (0, 0));
            let before = sends.get();
            every_collective(&c, &st, &input, 4, &output, 8, m, Algorithm::Direct);
            assert!(
                sends.get() - before > 6,
                "deregistered buffers exchange again"
            );
            comm.barrier()
        });
    }
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
        comm.barrier()?;
        let r = comm.rank();
        // A `DeviceBuffer` view is not available for library memory: copy through a staging
        // buffer of our own.
        let x: Vec<u32> = (0..m).map(|i| value(r, 0, i)).collect();
        let stage = comm.gpu().alloc(n * m * 4)?;
        fill(&stage, 0, &x);
        // SAFETY: both hold `m` words.
        unsafe { st.copy_dtod(a.ptr(), stage.ptr(), m * 4) }?;
        let before = sends.get();
        // SAFETY: `a` and `b` hold `n * m` words until the synchronize.
        unsafe { c.all_gather(a.ptr(), b.ptr(), m, DataType::U32, &st, None) }?;
        st.synchronize()?;
        assert_eq!(sends.get(), before, "mem_alloc memory sends nothing");
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
        // The first meeting of two ranks on the point-to-point engine trades its regions (one
        // message to each of `next` and `prev`); later calls send nothing.
        for (round, sent) in [(0, 2), (1, 0)] {
            let before = sends.get();
            // SAFETY: as above (the output at offset 0 of its window on every rank).
            unsafe { c.send_recv(ci.ptr(), next, co.ptr(), prev, big, DataType::U32, &st) }?;
            st.synchronize()?;
            assert_eq!(c.last_algorithm(), Some(Algorithm::P2p));
            assert_eq!(sends.get() - before, sent, "p2p call {round}");
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
        comm.barrier().expect("barrier");
        let before = sends.get();
        every_collective(&c, &st, &input, 0, &output, 0, m, Algorithm::Direct);
        // The helper's 6 barriers, and its send_recv's first meeting of this rank with its
        // next and previous ranks, which trades the point-to-point regions (one message each).
        assert_eq!(sends.get() - before, 6 + 2, "registered calls send nothing");
        comm.barrier().expect("barrier");
        return;
    }
    if !enough_gpus("registered buffers as processes", 3) {
        return;
    }
    ranks_as_processes(3, TEST);
}

/// CUDA graphs (2 GPUs): calls captured on a stream borrowed by its handle (as PyTorch's is)
/// send no bootstrap message: registered buffers take the direct
/// kernel, unregistered ones (after `prepare`) LL or staging, never the exchange; the graph
/// replays right.
#[test]
fn captured_calls_neither_allocate_nor_exchange() {
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
        // Above LL128's and below the copy engines' sizes: the direct kernel's on the table.
        let m = (cfg.direct_min_bytes.max(cfg.ll128_max_bytes) * 2) / 4;
        let c = Collectives::with_config(Arc::new(comm), cfg)?;
        let comm = c.communicator().clone();
        c.prepare()?;
        let owner = comm.gpu().stream()?;
        // SAFETY: the owner outlives the borrowed stream.
        let st = unsafe { comm.gpu().borrow_stream(owner.raw()) }?;
        let (reg_in, reg_out) = (comm.gpu().alloc(m * 4)?, comm.gpu().alloc(n * m * 4)?);
        let (raw_in, raw_out) = (comm.gpu().alloc(m * 4)?, comm.gpu().alloc(n * m * 4)?);
        // SAFETY: the buffers outlive the collectives' use of them.
        unsafe { c.register_buffer(reg_out.ptr(), n * m * 4) }?;
        let r = comm.rank();
        let x: Vec<u32> = (0..m).map(|i| value(r, 0, i)).collect();
        fill(&reg_in, 0, &x);
        fill(&raw_in, 0, &x);
        comm.barrier()?;
        let before = sends.get();
        let mut ran = Vec::new();
        let graph = st.capture(|| -> mscclpp::host::Result<()> {
            // SAFETY: the buffers outlive the graph's replays below.
            unsafe { c.all_gather(reg_in.ptr(), reg_out.ptr(), m, DataType::U32, &st, None) }?;
            ran.push(c.last_algorithm());
            // SAFETY: as above.
            unsafe { c.all_gather(raw_in.ptr(), raw_out.ptr(), m, DataType::U32, &st, None) }?;
            ran.push(c.last_algorithm());
            Ok(())
        })?;
        assert_eq!(sends.get(), before, "capture sent nothing");
        assert_eq!(ran[0], Some(Algorithm::Direct), "registered: direct");
        assert!(
            matches!(
                ran[1],
                Some(Algorithm::Staged | Algorithm::LlOneShot | Algorithm::Ll128)
            ),
            "unregistered under capture: {:?}",
            ran[1]
        );
        for _ in 0..3 {
            // SAFETY: as above.
            unsafe { graph.launch(&st) }?;
        }
        st.synchronize()?;
        assert!(comm.status().error().is_none());
        for out in [&reg_out, &raw_out] {
            let got = read(out, 0, n * m);
            for q in 0..n {
                let want: Vec<u32> = (0..m).map(|i| value(q, 0, i)).collect();
                assert_eq!(&got[q * m..(q + 1) * m], &want[..], "part {q}");
            }
        }
        comm.barrier()
    });
}
