//! Every collective, algorithm, data type and operator, checked exactly against a host
//! reference: on 2 to 8 ranks as threads and 3 to 8 as processes, at awkward sizes (1
//! element, primes, pieces larger than the staging buffer) and unaligned offsets, in place and
//! out of place.

mod values;

use std::sync::Arc;

use mscclpp::collectives::{Algorithm, Collective, CollectiveConfig, Collectives};
use mscclpp::host::communicator::Communicator;
use mscclpp::host::gpu::{BackendKind, DeviceBuffer};
use mscclpp::shared::{DataType, DevicePtr, ReduceOp};
use mscclpp_test_support as harness;
use mscclpp_test_support::MARKER;
use mscclpp_test_support::ranks_as_threads;
use values::{REDUCE_OPS as OPS, TYPES, decode, encode, value};

/// `count` elements of part `part` of `rank`'s data ([`value`]: a hash of the three).
fn data(dtype: DataType, rank: usize, count: usize, part: usize) -> Vec<u8> {
    (0..count)
        .flat_map(|i| encode(dtype, value(rank, part, i)))
        .collect()
}

/// A device buffer of `bytes` (at least 1) filled with [`MARKER`].
fn marked(g: &mscclpp::host::gpu::Gpu, bytes: usize) -> DeviceBuffer {
    let b = g.alloc(bytes.max(1)).unwrap();
    b.copy_from_host(0, &vec![MARKER; bytes.max(1)]).unwrap();
    b
}

/// Checks that `buf` still holds [`MARKER`] outside `[start, start + len)` (nothing was written
/// past the output).
fn check_untouched(buf: &DeviceBuffer, start: usize, len: usize, what: &str) {
    let mut all = vec![0u8; buf.len()];
    buf.copy_to_host(0, &mut all).unwrap();
    for (i, &b) in all.iter().enumerate() {
        if i < start || i >= start + len {
            assert_eq!(
                b, MARKER,
                "{what}: byte {i} outside the output [{start}, +{len}) was written"
            );
        }
    }
}

fn reduce(op: ReduceOp, vals: impl Iterator<Item = f64>, dtype: DataType) -> f64 {
    let vals: Vec<f64> = vals.collect();
    match op {
        ReduceOp::Sum => {
            if dtype == DataType::U32 {
                vals.iter().map(|v| v + 10.0).sum::<f64>() - 10.0
            } else {
                vals.iter().sum()
            }
        }
        ReduceOp::Min => vals.iter().cloned().fold(f64::INFINITY, f64::min),
        ReduceOp::Max => vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
    }
}

fn check(dtype: DataType, got: &[u8], want: &[f64], what: &str) {
    let es = dtype.size();
    assert_eq!(got.len(), want.len() * es, "{what}: length");
    for (i, w) in want.iter().enumerate() {
        let g = decode(dtype, &got[i * es..(i + 1) * es]);
        assert_eq!(g, *w, "{what}: element {i} of {}", want.len());
    }
}

/// Runs all-reduce for every type and op at `count` elements with `algo`, in place and out of
/// place with an input 4 bytes into its allocation (16 for the direct path, which needs
/// 16-byte alignment).
fn all_reduce_case(c: &Collectives, count: usize, algo: Option<Algorithm>) {
    all_reduce_ops(c, count, algo, &OPS);
}

/// As [`all_reduce_case`], with the operators `ops` only.
fn all_reduce_ops(c: &Collectives, count: usize, algo: Option<Algorithm>, ops: &[ReduceOp]) {
    all_reduce_types(c, count, algo, ops, &TYPES);
}

/// As [`all_reduce_ops`], with the data types `types` only.
fn all_reduce_types(
    c: &Collectives,
    count: usize,
    algo: Option<Algorithm>,
    ops: &[ReduceOp],
    types: &[DataType],
) {
    let registered = matches!(algo, Some(Algorithm::Direct | Algorithm::CopyEngine));
    let off = if registered { 16 } else { 4 };
    let comm = c.communicator();
    let (rank, n) = (comm.rank(), comm.size());
    let g = comm.gpu();
    let stream = g.stream().unwrap();
    for &dtype in types {
        for &op in ops {
            let es = dtype.size();
            let bytes = count * es;
            let input = marked(g, bytes + off);
            let output = marked(g, bytes);
            input
                .copy_from_host(off, &data(dtype, rank, count, 0))
                .unwrap();
            let want: Vec<f64> = (0..count)
                .map(|i| reduce(op, (0..n).map(|r| value(r, 0, i)), dtype))
                .collect();
            // Out of place, unaligned input.
            // SAFETY: both buffers hold `bytes` (input from offset 4).
            unsafe {
                c.all_reduce(
                    input.ptr().byte_add_cast(off as u64),
                    output.ptr(),
                    count,
                    dtype,
                    op,
                    &stream,
                    algo,
                )
            }
            .unwrap();
            stream.synchronize().unwrap();
            let mut got = vec![0u8; bytes];
            output.copy_to_host(0, &mut got).unwrap();
            let what = format!("all_reduce {dtype:?} {op:?} n={n} count={count} {algo:?}");
            check(dtype, &got, &want, &what);
            // In place.
            output
                .copy_from_host(0, &data(dtype, rank, count, 0))
                .unwrap();
            // SAFETY: as above.
            unsafe { c.all_reduce(output.ptr(), output.ptr(), count, dtype, op, &stream, algo) }
                .unwrap();
            stream.synchronize().unwrap();
            output.copy_to_host(0, &mut got).unwrap();
            check(dtype, &got, &want, &format!("{what} in place"));
        }
    }
    assert!(comm.status().error().is_none());
}

/// Every collective but all-reduce at `count` elements with `algo` (forced where given; the
/// all-gather output is 2 bytes into its allocation for odd counts unless a registered path is
/// forced, and aligned for even counts, which the LL kernel's word path serves).
fn others_case(c: &Collectives, count: usize, algo: Option<Algorithm>) {
    let registered = matches!(algo, Some(Algorithm::Direct | Algorithm::CopyEngine));
    let ag_off = if registered || count.is_multiple_of(2) {
        0
    } else {
        2
    };
    // Reduce-scatter has no copy-engine variant; LL128 serves all-gather and reduce-scatter
    // only (the others take the automatic choice then).
    let rs_algo = if algo == Some(Algorithm::CopyEngine) {
        Some(Algorithm::Direct)
    } else {
        algo
    };
    let rest_algo = if algo == Some(Algorithm::Ll128) {
        None
    } else {
        algo
    };
    let comm = c.communicator();
    let (rank, n) = (comm.rank(), comm.size());
    let g = comm.gpu();
    let stream = g.stream().unwrap();
    for dtype in [DataType::F16, DataType::U32] {
        let es = dtype.size();
        let part = count * es;
        // all_gather (output unaligned by 2 bytes for odd counts)
        let input = g.alloc(part.max(1)).unwrap();
        input
            .copy_from_host(0, &data(dtype, rank, count, 0))
            .unwrap();
        let out = marked(g, n * part + 2);
        // SAFETY: sizes as documented.
        unsafe {
            c.all_gather(
                input.ptr(),
                out.ptr().byte_add_cast(ag_off),
                count,
                dtype,
                &stream,
                algo,
            )
        }
        .unwrap();
        stream.synchronize().unwrap();
        let mut got = vec![0u8; n * part];
        out.copy_to_host(ag_off as usize, &mut got).unwrap();
        let want: Vec<f64> = (0..n)
            .flat_map(|r| (0..count).map(move |i| value(r, 0, i)))
            .collect();
        let what = format!("all_gather {dtype:?} n={n} count={count} {algo:?}");
        check(dtype, &got, &want, &what);
        check_untouched(&out, ag_off as usize, n * part, &what);

        // reduce_scatter: every operator for u32, the sum for f16
        let rs_in = g.alloc(n * part).unwrap();
        let input_all: Vec<u8> = (0..n).flat_map(|p| data(dtype, rank, count, p)).collect();
        rs_in.copy_from_host(0, &input_all).unwrap();
        let rs_ops: &[ReduceOp] = if dtype == DataType::U32 {
            &OPS
        } else {
            &[ReduceOp::Sum]
        };
        for &op in rs_ops {
            let rs_out = marked(g, part);
            // SAFETY: as above.
            unsafe {
                c.reduce_scatter(
                    rs_in.ptr(),
                    rs_out.ptr(),
                    count,
                    dtype,
                    op,
                    &stream,
                    rs_algo,
                )
            }
            .unwrap();
            stream.synchronize().unwrap();
            let mut got = vec![0u8; part];
            rs_out.copy_to_host(0, &mut got).unwrap();
            // Part `rank` of every rank's input, reduced.
            let want: Vec<f64> = (0..count)
                .map(|i| reduce(op, (0..n).map(|r| value(r, rank, i)), dtype))
                .collect();
            check(
                dtype,
                &got,
                &want,
                &format!("reduce_scatter {dtype:?} {op:?} n={n} count={count} {rs_algo:?}"),
            );
        }
        let mut got = vec![0u8; part];

        // broadcast from the last rank, in place
        let root = n - 1;
        let b = g.alloc(part.max(1)).unwrap();
        b.copy_from_host(0, &data(dtype, rank, count, 0)).unwrap();
        // SAFETY: as above.
        unsafe { c.broadcast(b.ptr(), b.ptr(), count, dtype, root, &stream, rest_algo) }.unwrap();
        stream.synchronize().unwrap();
        b.copy_to_host(0, &mut got).unwrap();
        let want: Vec<f64> = (0..count).map(|i| value(root, 0, i)).collect();
        check(
            dtype,
            &got,
            &want,
            &format!("broadcast {dtype:?} n={n} count={count}"),
        );

        // all_to_all
        let a_out = marked(g, n * part);
        // SAFETY: as above.
        unsafe { c.all_to_all(rs_in.ptr(), a_out.ptr(), count, dtype, &stream, rest_algo) }
            .unwrap();
        stream.synchronize().unwrap();
        let mut got = vec![0u8; n * part];
        a_out.copy_to_host(0, &mut got).unwrap();
        // Part p of my output is part `rank` of rank p's input.
        let want: Vec<f64> = (0..n)
            .flat_map(|p| (0..count).map(move |i| value(p, rank, i)))
            .collect();
        check(
            dtype,
            &got,
            &want,
            &format!("all_to_all {dtype:?} n={n} count={count}"),
        );

        // send / recv around a ring: even ranks send first.
        let next = (rank + 1) % n;
        let prev = (rank + n - 1) % n;
        let recv_buf = marked(g, part);
        // SAFETY: as above.
        unsafe {
            if rank % 2 == 0 {
                c.send(input.ptr(), count, dtype, next, &stream).unwrap();
                c.recv(recv_buf.ptr(), count, dtype, prev, &stream).unwrap();
            } else {
                c.recv(recv_buf.ptr(), count, dtype, prev, &stream).unwrap();
                c.send(input.ptr(), count, dtype, next, &stream).unwrap();
            }
        }
        stream.synchronize().unwrap();
        let mut got = vec![0u8; part];
        recv_buf.copy_to_host(0, &mut got).unwrap();
        let want: Vec<f64> = (0..count).map(|i| value(prev, 0, i)).collect();
        check(
            dtype,
            &got,
            &want,
            &format!("send/recv {dtype:?} n={n} count={count}"),
        );

        // send_recv: both directions at once.
        let sr_out = marked(g, part);
        // SAFETY: as above.
        unsafe { c.send_recv(input.ptr(), next, sr_out.ptr(), prev, count, dtype, &stream) }
            .unwrap();
        stream.synchronize().unwrap();
        sr_out.copy_to_host(0, &mut got).unwrap();
        check(
            dtype,
            &got,
            &want,
            &format!("send_recv {dtype:?} n={n} count={count}"),
        );
        // Every point-to-point call runs on the point-to-point engine.
        assert_eq!(
            c.last_algorithm(),
            Some(Algorithm::P2p),
            "send_recv of {part} B"
        );
    }
    assert!(comm.status().error().is_none());
}

/// Runs `body` on `n` ranks. On the CUDA backend with fewer GPUs than ranks and no
/// `MSCCLPP_RANKS_PER_GPU` that lets them share, the collectives refuse, as NCCL does, and this
/// checks that every rank gets that typed error; with it, the ranks share the GPUs.
fn run(n: usize, body: impl Fn(&Collectives) + Sync) {
    run_with(n, CollectiveConfig::for_backend, body)
}

/// As [`run`], with the configuration `config` gives for the backend.
fn run_with(
    n: usize,
    config: impl Fn(BackendKind) -> CollectiveConfig + Sync,
    body: impl Fn(&Collectives) + Sync,
) {
    if !harness::gpus_suffice(n) {
        let devices = harness::device_count();
        eprintln!("{n} ranks on {devices} GPUs: checking that the collectives refuse");
        ranks_as_threads(n, |comm: Communicator| {
            let cfg = CollectiveConfig::for_backend(comm.gpu().kind());
            let r = Collectives::with_config(Arc::new(comm), cfg);
            assert!(
                matches!(r, Err(mscclpp::host::Error::DuplicateGpu { .. })),
                "ranks sharing a GPU: {:?}",
                r.err()
            );
        });
        return;
    }
    ranks_as_threads(n, |comm: Communicator| {
        let cfg = config(comm.gpu().kind());
        let c = Collectives::with_config(Arc::new(comm), cfg).expect("collectives");
        body(&c);
        c.communicator().bootstrap().barrier().unwrap();
    });
}

#[test]
fn all_reduce_2_ranks_every_type_op_and_algorithm() {
    run(2, |c| {
        for count in [1, 7, 1031] {
            all_reduce_case(c, count, None);
            all_reduce_case(c, count, Some(Algorithm::Staged));
            all_reduce_case(c, count, Some(Algorithm::TwoShotPut));
        }
        // 1031 elements (2 or 4 KiB) are in the LL128 range of the CPU backend's defaults.
        all_reduce_case(c, 1031, None);
        let cfg = c.config();
        if (cfg.ll128_min_bytes..=cfg.ll128_max_bytes).contains(&(1031 * 4)) {
            assert_eq!(c.last_algorithm(), Some(Algorithm::Ll128));
        }
        // LL128: less than one line, exactly one warp step of f16 (480 B), and many steps
        // with a partial last one (out of place from an unaligned input, then in place).
        for count in [1, 7, 240, 1031, 4001] {
            all_reduce_case(c, count, Some(Algorithm::Ll128));
        }
        // LL128 all-gather and reduce-scatter: less than one line, many warp steps with a
        // partial last one.
        for count in [7, 4001] {
            others_case(c, count, Some(Algorithm::Ll128));
        }
        // Whole 8-byte words (the LL kernel's word path; 6 elements are whole words only for
        // 4-byte types).
        for count in [6, 1024] {
            all_reduce_case(c, count, Some(Algorithm::LlOneShot));
        }
        // The direct path: forced, at sizes every type splits into 16-byte chunks (and a
        // chunk per rank that is not a multiple of the block count), and picked automatically.
        for count in [8, 1024, 24_592] {
            all_reduce_case(c, count, Some(Algorithm::Direct));
            all_reduce_case(c, count, Some(Algorithm::CopyEngine));
        }
    });
}

#[test]
fn all_reduce_large_runs_in_pieces() {
    // 300 007 u32 = 1.2 MB > the CPU backend's 1 MiB staging buffer.
    run(2, |c| {
        all_reduce_case(c, 300_007, Some(Algorithm::Staged));
        all_reduce_case(c, 300_007, Some(Algorithm::TwoShotPut));
    });
}

/// The count an all-reduce by `algo` is checked at on more than two ranks: odd or prime for
/// the packet and staged paths, whole 16-byte vectors of every type for the registered ones.
fn awkward_count(algo: Option<Algorithm>) -> usize {
    match algo {
        None | Some(Algorithm::LlTwoShot) => 1031,
        Some(Algorithm::LlOneShot) => 13,
        Some(Algorithm::Ll128) => 613,
        Some(Algorithm::Staged) => 997,
        Some(Algorithm::TwoShotPut) => 1999,
        Some(Algorithm::Direct | Algorithm::CopyEngine) => 1040,
        // Worlds of several nodes only (tests/multinode.rs).
        Some(Algorithm::Port | Algorithm::Hierarchical) => 1031,
        // Serves no collective (forcing it is refused); the point-to-point calls use it.
        Some(Algorithm::P2p) => 13,
        // `Algorithm` is non-exhaustive: a new algorithm gets its case here.
        Some(a) => panic!("{a:?}: a new algorithm, without an awkward count here yet"),
    }
}

/// Every all-reduce algorithm (and the automatic choice), then every other collective by each
/// algorithm that serves it, on however many ranks `c` has. Each all-reduce runs every type
/// with one operator, which rotates with the rank count and the algorithm, so that the rank
/// counts together run every operator by every algorithm (the two-rank test runs every
/// type with every operator by every algorithm).
fn every_algorithm(c: &Collectives) {
    let n = c.communicator().size();
    let one_node = Algorithm::ALL
        .into_iter()
        .filter(|a| a.serves_world(1, true));
    let forcible = one_node.clone().filter(|a| a.serves(Collective::AllReduce));
    let algos = std::iter::once(None).chain(forcible.map(Some));
    for (k, algo) in algos.enumerate() {
        all_reduce_ops(c, awkward_count(algo), algo, &[OPS[(n + k) % OPS.len()]]);
    }
    // 1 element and a prime through the automatic choice, whole vectors by every algorithm
    // that moves them (LL128 serves all-reduce only).
    others_case(c, 1, None);
    others_case(c, 1013, None);
    for algo in one_node {
        match algo {
            Algorithm::TwoShotPut | Algorithm::LlTwoShot | Algorithm::P2p => {
                broadcast_refuses(c, algo)
            }
            Algorithm::Port | Algorithm::Hierarchical => {}
            Algorithm::Ll128 => {
                others_case(c, 333, Some(algo));
                broadcast_refuses(c, algo);
            }
            Algorithm::LlOneShot | Algorithm::Staged => others_case(c, 333, Some(algo)),
            Algorithm::Direct | Algorithm::CopyEngine => others_case(c, 1040, Some(algo)),
            a => panic!("{a:?}: a new algorithm, without a case here yet"),
        }
    }
}

/// An algorithm forced on a collective it does not serve (here: a broadcast by an all-reduce,
/// all-gather or reduce-scatter algorithm) is a typed error on every rank, with nothing queued
/// and the communicator still usable.
fn broadcast_refuses(c: &Collectives, algo: Algorithm) {
    let g = c.communicator().gpu();
    let stream = g.stream().unwrap();
    let buf = g.alloc(64).unwrap();
    // SAFETY: `buf` holds 16 u32; nothing is queued on refusal.
    let r = unsafe {
        c.broadcast(
            buf.ptr(),
            buf.ptr(),
            16,
            DataType::U32,
            0,
            &stream,
            Some(algo),
        )
    };
    assert!(
        matches!(r, Err(mscclpp::host::Error::Unsupported { .. })),
        "broadcast by {algo:?}: {r:?}"
    );
    assert!(!c.communicator().status().is_aborted());
}

/// 2 to 8 ranks as threads, every algorithm of every collective (odd and even counts).
#[test]
fn every_algorithm_2_to_8_ranks() {
    for n in 2..=8 {
        run(n, every_algorithm);
    }
}

/// The CPU backend's defaults launch 16-thread blocks and at most two of them (one OS thread
/// per GPU thread); these are launch shapes like the GPU's, only smaller: whole 32-thread
/// warps, two warps a block, three blocks (four for LL128), small LL calls in one block of up
/// to 64 packets and larger ones over blocks, the direct kernel's blocks of 1 KiB, and a
/// staging buffer that takes three staged blocks. On CUDA: the backend's own defaults.
fn gpu_like(kind: BackendKind) -> CollectiveConfig {
    let base = CollectiveConfig::for_backend(kind);
    if kind == BackendKind::Cuda {
        return base;
    }
    CollectiveConfig {
        threads: 64,
        max_blocks: 3,
        staged_blocks: 3,
        stage_bytes: 4 << 20,
        direct_blocks: 3,
        direct_threads: 64,
        direct_block_bytes: 1 << 10,
        ll_blocks: 3,
        ll_threads: 64,
        ll_single_block_packets: 64,
        ll128_threads: 64,
        ll128_blocks: 3,
        ll128_max_blocks: 4,
        ..base
    }
}

/// Every algorithm of every collective at GPU-like launch shapes ([`gpu_like`]), on 3 ranks
/// (and a staged all-reduce large enough for three blocks).
#[test]
fn every_algorithm_at_gpu_like_launch_shapes_3_ranks() {
    run_with(3, gpu_like, |c| {
        if c.communicator().gpu().kind() == BackendKind::Cpu {
            assert_eq!((c.config().threads, c.config().ll128_threads), (64, 64));
        }
        // As `every_algorithm`, with the types that take different kernel paths (f16's
        // packed halves, u32) to keep the launch count down.
        let types = [DataType::F16, DataType::U32];
        let forcible = Algorithm::ALL
            .into_iter()
            .filter(|a| a.serves(Collective::AllReduce) && a.serves_world(1, true));
        let algos = std::iter::once(None).chain(forcible.map(Some));
        for (k, algo) in algos.enumerate() {
            all_reduce_types(c, awkward_count(algo), algo, &[OPS[k % OPS.len()]], &types);
        }
        for algo in Algorithm::ALL {
            match algo {
                Algorithm::TwoShotPut | Algorithm::LlTwoShot | Algorithm::P2p => {}
                // Worlds of several nodes only (tests/multinode.rs).
                Algorithm::Port | Algorithm::Hierarchical => {}
                Algorithm::Ll128 | Algorithm::LlOneShot | Algorithm::Staged => {
                    others_case(c, 333, Some(algo))
                }
                Algorithm::Direct | Algorithm::CopyEngine => others_case(c, 1040, Some(algo)),
                a => panic!("{a:?}: a new algorithm, without a case here yet"),
            }
        }
        // 3 MiB and 12 bytes of u32: three staged blocks of 1 MiB (and a partial fourth's
        // worth in the last).
        all_reduce_types(
            c,
            (3 << 20) / 4 + 3,
            Some(Algorithm::Staged),
            &[ReduceOp::Sum],
            &[DataType::U32],
        );
    });
}

/// More of the automatic choice on 2, 4 and 8 ranks: every type and operator of all-reduce,
/// and the other collectives at the sizes where the automatic choice changes path.
#[test]
fn automatic_choice_2_4_and_8_ranks() {
    for n in [2, 4, 8] {
        run(n, |c| {
            all_reduce_case(c, 7, None);
            all_reduce_case(c, 1024, None);
            // 16-byte multiples: the registered paths for broadcast and all-to-all
            // (automatic from 4 KiB on the CPU backend), LL128 for all-gather and
            // reduce-scatter (2-16 KiB parts there).
            others_case(c, 4096, None);
            // Between the LL limit and the copy engines (and the point-to-point engine's
            // chunks).
            others_case(c, 24_000, None);
            others_case(c, 1024, Some(Algorithm::LlOneShot));
            others_case(c, 7, Some(Algorithm::LlOneShot));
            two_shot_choice(c);
            ll128_parts_choice(c);
        });
    }
}

/// All-gather and reduce-scatter take LL128 for parts from `ll128_part_min_bytes` to
/// `ll128_max_bytes` (on any number of ranks) and LL16 just below; results checked.
fn ll128_parts_choice(c: &Collectives) {
    let cfg = c.config();
    let n = c.communicator().size();
    let g = c.communicator().gpu();
    let stream = g.stream().unwrap();
    for (count, want) in [
        (cfg.ll128_part_min_bytes / 4, Algorithm::Ll128),
        (cfg.ll128_part_min_bytes / 4 - 1, Algorithm::LlOneShot),
    ] {
        let input = marked(g, count * 4);
        let output = marked(g, n * count * 4);
        let rank = c.communicator().rank();
        input
            .copy_from_host(0, &data(DataType::U32, rank, count, 0))
            .unwrap();
        // SAFETY: `input` holds `count` u32, `output` `n` times as many.
        unsafe {
            c.all_gather(
                input.ptr(),
                output.ptr(),
                count,
                DataType::U32,
                &stream,
                None,
            )
        }
        .unwrap();
        assert_eq!(c.last_algorithm(), Some(want), "all_gather of {count} u32");
        // SAFETY: as above.
        let r = unsafe {
            c.reduce_scatter(
                output.ptr(),
                input.ptr(),
                count,
                DataType::U32,
                ReduceOp::Max,
                &stream,
                None,
            )
        };
        r.unwrap();
        assert_eq!(
            c.last_algorithm(),
            Some(want),
            "reduce_scatter of {count} u32"
        );
        stream.synchronize().unwrap();
        // The reduce-scatter's input was the gathered data: part `rank` of it is every
        // rank's input, and their maximum is what it leaves here.
        let mut got = vec![0u8; count * 4];
        input.copy_to_host(0, &mut got).unwrap();
        let want: Vec<f64> = (0..count)
            .map(|i| {
                reduce(
                    ReduceOp::Max,
                    (0..n).map(|_| value(rank, 0, i)),
                    DataType::U32,
                )
            })
            .collect();
        check(
            DataType::U32,
            &got,
            &want,
            &format!("gather then scatter of {count} u32"),
        );
    }
}

/// The two-shot LL all-reduce: chosen from `ll_two_shot_min_bytes` on `ll_two_shot_min_ranks`
/// ranks or more (not below either), and a forced call too small for every rank to own a part
/// runs one-shot; every result checked (the last of the types, u32, decides the size).
fn two_shot_choice(c: &Collectives) {
    let cfg = c.config();
    let n = c.communicator().size();
    let ops = [ReduceOp::Max];
    let count = cfg.ll_two_shot_min_bytes / 4 + 3;
    all_reduce_ops(c, count, None, &ops);
    let many = n >= cfg.ll_two_shot_min_ranks;
    assert_eq!(
        c.last_algorithm() == Some(Algorithm::LlTwoShot),
        many,
        "{n} ranks, {count} u32"
    );
    all_reduce_ops(c, count - 8, None, &ops);
    assert_ne!(
        c.last_algorithm(),
        Some(Algorithm::LlTwoShot),
        "below the minimum"
    );
    all_reduce_ops(c, count, Some(Algorithm::LlTwoShot), &ops);
    assert_eq!(c.last_algorithm(), Some(Algorithm::LlTwoShot), "forced");
    all_reduce_ops(c, 2, Some(Algorithm::LlTwoShot), &ops);
    assert_eq!(
        c.last_algorithm(),
        Some(Algorithm::LlOneShot),
        "forced, 8 bytes"
    );
}

/// Nine ranks: one more than the registered paths serve (`MAX_DIRECT_RANKS`), so the sizes
/// that take them on fewer ranks stage, with correct results, and forcing them is a typed
/// error on every rank that leaves the communicator usable.
#[test]
fn nine_ranks_stage_where_the_registered_paths_stop() {
    run(9, |c| {
        let cfg = c.config();
        let n = c.communicator().size();
        assert!(n > mscclpp::shared::MAX_DIRECT_RANKS);
        // An all-reduce above the LL sizes, and parts above the LL part size.
        let count = (cfg.ll_max_bytes.max(cfg.direct_min_bytes) / 4 + 100).next_multiple_of(4);
        assert!(count * 4 < cfg.ce_all_reduce_min_bytes);
        all_reduce_ops(c, count, None, &[ReduceOp::Sum]);
        assert_eq!(c.last_algorithm(), Some(Algorithm::Staged));
        let part = (cfg.ll_part_max_bytes.max(cfg.direct_min_bytes) / 4 + 4).next_multiple_of(4);
        others_case(c, part, None);
        let g = c.communicator().gpu();
        let stream = g.stream().unwrap();
        let buf = g.alloc(n * part * 4).unwrap();
        // Input and output at the same address: in place only for rank 0, so the ranks
        // differ in whether their buffers could go direct, which must not make them wait
        // apart (it did: rank 0 returned at once, the others waited for its exchange).
        for algo in [Algorithm::Direct, Algorithm::CopyEngine] {
            // SAFETY: `buf` holds `n` parts of `part` u32; nothing is queued on refusal.
            let r = unsafe {
                c.all_gather(
                    buf.ptr(),
                    buf.ptr(),
                    part,
                    DataType::U32,
                    &stream,
                    Some(algo),
                )
            };
            assert!(
                matches!(r, Err(mscclpp::host::Error::Unsupported { .. })),
                "{algo:?} on {n} ranks: {r:?}"
            );
        }
        assert!(!c.communicator().status().is_aborted());
        // Still usable.
        all_reduce_ops(c, 5, None, &[ReduceOp::Max]);
    });
}

/// Ranks as separate processes (the collectives over memory mapped across processes): every
/// algorithm on 3 to 8 ranks, as [`every_algorithm_2_to_8_ranks`] does with threads.
#[test]
fn every_algorithm_as_processes_3_to_8_ranks() {
    const TEST: &str = "every_algorithm_as_processes_3_to_8_ranks";
    match harness::child_communicator() {
        Some(comm) => {
            let c = Collectives::new(Arc::new(comm)).expect("collectives");
            every_algorithm(&c);
            c.communicator().bootstrap().barrier().unwrap();
        }
        None => {
            for n in 3..=8 {
                if harness::enough_gpus(&format!("{TEST} on {n} ranks"), n) {
                    harness::ranks_as_processes(n, TEST);
                }
            }
        }
    }
}

/// An allocation is registered with the peers once (a hint) and reused; a rank whose buffer
/// cannot take the direct path (misaligned) makes every rank's direct kernel hand the call on,
/// with correct data; forcing the direct path on such a buffer is refused by every rank's
/// kernel (the communicator's error, which `status().reset()` clears).
#[test]
fn direct_registration_cache_and_fallback() {
    run(2, |c| {
        let comm = c.communicator();
        let (rank, n) = (comm.rank(), comm.size());
        let g = comm.gpu();
        let stream = g.stream().unwrap();
        let dtype = DataType::U32;
        // Above the LL and LL128 limits and the direct threshold, so the direct path is the
        // automatic one.
        let cfg = c.config();
        let bytes = (cfg
            .ll_max_bytes
            .max(cfg.ll128_max_bytes)
            .max(cfg.direct_min_bytes)
            + 4096)
            & !15;
        let count = bytes / 4;
        let want: Vec<f64> = (0..count)
            .map(|i| reduce(ReduceOp::Sum, (0..n).map(|r| value(r, 0, i)), dtype))
            .collect();
        let buf = g.alloc(bytes + 16).unwrap();
        // An in-place sum of `count` elements at `p`, waited for.
        let sum_in_place = |p: DevicePtr<u8>, algo: Option<Algorithm>| {
            // SAFETY: every `p` below holds `bytes`.
            unsafe { c.all_reduce(p, p, count, dtype, ReduceOp::Sum, &stream, algo) }
                .map(|()| stream.synchronize().unwrap())
        };
        // Counted before any rank's first call: a faster peer's hint would otherwise be mapped
        // here (by this rank's registration service) before the count.
        comm.barrier().unwrap();
        let before = c.registered_buffers();
        comm.barrier().unwrap();
        for round in 0..5 {
            buf.copy_from_host(0, &data(dtype, rank, count, 0)).unwrap();
            sum_in_place(buf.ptr(), None).unwrap();
            assert_eq!(c.last_algorithm(), Some(Algorithm::Direct), "round {round}");
            let mut got = vec![0u8; bytes];
            buf.copy_to_host(0, &mut got).unwrap();
            check(dtype, &got, &want, &format!("cached direct round {round}"));
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !c.registrations_settled() {
            assert!(std::time::Instant::now() < deadline, "hints answered");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        comm.barrier().unwrap();
        let after = c.registered_buffers();
        assert_eq!(after.0, before.0 + 1, "one allocation registered once");
        assert_eq!(
            after.1,
            before.1 + n - 1,
            "each peer's allocation mapped once"
        );
        sum_in_place(buf.ptr(), None).unwrap();
        assert!(
            !c.last_call_declined().unwrap(),
            "direct once every peer has it"
        );

        // Rank 1's buffer is 4 bytes off alignment: every rank hands the call on, data still
        // right.
        let off = if rank == 1 { 4 } else { 0 };
        buf.copy_from_host(off, &data(dtype, rank, count, 0))
            .unwrap();
        let p = buf.ptr().byte_add_cast(off as u64);
        sum_in_place(p, None).unwrap();
        assert_eq!(c.last_algorithm(), Some(Algorithm::Direct));
        assert!(c.last_call_declined().unwrap(), "handed on, on every rank");
        let mut got = vec![0u8; bytes];
        buf.copy_to_host(off, &mut got).unwrap();
        check(dtype, &got, &want, "fallback to staging");

        // Forced: refused by every rank's kernel, nothing written.
        buf.copy_from_host(off, &data(dtype, rank, count, 0))
            .unwrap();
        sum_in_place(p, Some(Algorithm::Direct)).unwrap();
        match comm.status().error() {
            Some(mscclpp::host::Error::Device {
                code: mscclpp::shared::DeviceErrorCode::InvalidArgument,
                ..
            }) => {}
            other => panic!("forced direct on a misaligned buffer: {other:?}"),
        }
        buf.copy_to_host(off, &mut got).unwrap();
        assert_eq!(got, data(dtype, rank, count, 0), "nothing written");
        // The communicator is usable again once its error is cleared.
        comm.barrier().unwrap();
        comm.status().reset();
        buf.copy_from_host(0, &data(dtype, rank, count, 0)).unwrap();
        sum_in_place(buf.ptr(), None).unwrap();
        buf.copy_to_host(0, &mut got).unwrap();
        check(dtype, &got, &want, "after the refused call");

        // A new allocation gets registered (and mapped) anew.
        let other = g.alloc(bytes).unwrap();
        other
            .copy_from_host(0, &data(dtype, rank, count, 0))
            .unwrap();
        sum_in_place(other.ptr(), None).unwrap();
        other.copy_to_host(0, &mut got).unwrap();
        check(dtype, &got, &want, "second allocation");
        assert_eq!(c.registered_buffers().0, after.0 + 1);
        assert!(comm.status().error().is_none());
    });
}

/// LL calls of every mode (and LL128 all-reduces, all-gathers and reduce-scatters and two-shot
/// LL all-reduces, which share the LL flag; the two-shot also the LL region, split another way)
/// queued back to back
/// with no host synchronisation in between (so a
/// fast rank may run ahead of a slow one), broadcasts with rotating roots among them; every
/// result checked once the stream drains. (The race the broadcast's acks prevent, a root two
/// calls ahead of a slot's reader, needs a reader slower than this backend makes it: with the
/// acks removed this test still passed, so it checks the modes and their mixing, not that.)
#[test]
fn ll_modes_back_to_back_3_and_4_ranks() {
    for n in [3, 4] {
        run(n, |c| {
            let comm = c.communicator();
            let rank = comm.rank();
            let g = comm.gpu();
            let stream = g.stream().unwrap();
            let dtype = DataType::U32;
            let count = 37;
            let part = count * 4;
            let ll = Some(Algorithm::LlOneShot);
            let input = g.alloc(n * part).unwrap();
            let all_in: Vec<u8> = (0..n).flat_map(|p| data(dtype, rank, count, p)).collect();
            input.copy_from_host(0, &all_in).unwrap();
            let ll128 = Some(Algorithm::Ll128);
            let rounds = 27;
            // (kind, output buffer, root)
            let mut outs = Vec::new();
            for k in 0..rounds {
                let out = marked(g, n * part);
                let kind = k % 9;
                // LL128 for kinds 5 (all-reduce), 7 (all-gather) and 8 (reduce-scatter).
                let by = if kind >= 7 { ll128 } else { ll };
                let root = k % n;
                // SAFETY: `input` and `out` hold `n * part` bytes, alive until the checks.
                unsafe {
                    match kind {
                        0 | 5 | 6 => c.all_reduce(
                            input.ptr(),
                            out.ptr(),
                            count,
                            dtype,
                            ReduceOp::Sum,
                            &stream,
                            match kind {
                                0 => ll,
                                5 => Some(Algorithm::Ll128),
                                _ => Some(Algorithm::LlTwoShot),
                            },
                        ),
                        1 => c.broadcast(input.ptr(), out.ptr(), count, dtype, root, &stream, ll),
                        2 | 7 => c.all_gather(input.ptr(), out.ptr(), count, dtype, &stream, by),
                        3 => c.all_to_all(input.ptr(), out.ptr(), count, dtype, &stream, ll),
                        _ => c.reduce_scatter(
                            input.ptr(),
                            out.ptr(),
                            count,
                            dtype,
                            ReduceOp::Sum,
                            &stream,
                            by,
                        ),
                    }
                }
                .unwrap();
                outs.push((kind, out, root));
            }
            stream.synchronize().unwrap();
            for (k, (kind, out, root)) in outs.iter().enumerate() {
                let v = value;
                let want: Vec<f64> = match kind {
                    0 | 5 | 6 => (0..count)
                        .map(|i| reduce(ReduceOp::Sum, (0..n).map(|r| v(r, 0, i)), dtype))
                        .collect(),
                    1 => (0..count).map(|i| v(*root, 0, i)).collect(),
                    2 | 7 => (0..n)
                        .flat_map(|r| (0..count).map(move |i| v(r, 0, i)))
                        .collect(),
                    3 => (0..n)
                        .flat_map(|p| (0..count).map(move |i| v(p, rank, i)))
                        .collect(),
                    _ => (0..count)
                        .map(|i| reduce(ReduceOp::Sum, (0..n).map(|r| v(r, rank, i)), dtype))
                        .collect(),
                };
                let mut got = vec![0u8; want.len() * 4];
                out.copy_to_host(0, &mut got).unwrap();
                check(
                    dtype,
                    &got,
                    &want,
                    &format!("LL round {k} (kind {kind}) n={n}"),
                );
            }
            assert!(comm.status().error().is_none());
        });
    }
}

/// A receive of fewer elements than its send is refused by the receiving kernel: the
/// receiver's output is untouched and its status holds `Error::CountMismatch` naming the
/// sender and the bytes it sent; the sender's call succeeds. Both ends stay in step: once the
/// receiver clears its status, the next exchange is correct.
#[test]
fn send_larger_than_the_peers_recv_is_refused() {
    if !harness::enough_gpus("send_larger_than_the_peers_recv_is_refused", 2) {
        return;
    }
    ranks_as_threads(2, |comm: Communicator| {
        let cfg = CollectiveConfig::for_backend(comm.gpu().kind());
        let c = Collectives::with_config(Arc::new(comm), cfg).expect("collectives");
        let comm = c.communicator();
        let g = comm.gpu();
        let stream = g.stream().unwrap();
        let count = 4096;
        let buf = g.alloc(count * 4).unwrap();
        let data: Vec<u8> = (0..count * 4).map(|i| (i * 31 + 7) as u8).collect();
        let marker = vec![0xa5u8; count * 4];
        if comm.rank() == 0 {
            buf.copy_from_host(0, &data).unwrap();
            // SAFETY: `buf` holds `count` u32.
            unsafe { c.send(buf.ptr(), count, DataType::U32, 1, &stream) }.unwrap();
            stream.synchronize().unwrap();
            assert!(comm.status().error().is_none());
        } else {
            buf.copy_from_host(0, &marker).unwrap();
            // SAFETY: as above (half of it).
            unsafe { c.recv(buf.ptr(), count / 2, DataType::U32, 0, &stream) }.unwrap();
            stream.synchronize().unwrap();
            match comm.status().error() {
                Some(mscclpp::host::Error::CountMismatch {
                    peer: 0,
                    sent_bytes,
                }) => assert_eq!(sent_bytes, (count * 4) as u64),
                other => panic!("a recv of half a send: {other:?}"),
            }
            let mut got = vec![0u8; count * 4];
            buf.copy_to_host(0, &mut got).unwrap();
            assert_eq!(got, marker, "the refused recv wrote into its output");
            comm.status().reset();
        }
        comm.bootstrap().barrier().unwrap();
        // In step: the same message again, with matching counts.
        // SAFETY: as above.
        unsafe {
            if comm.rank() == 0 {
                c.send(buf.ptr(), count, DataType::U32, 1, &stream)
            } else {
                c.recv(buf.ptr(), count, DataType::U32, 0, &stream)
            }
        }
        .unwrap();
        stream.synchronize().unwrap();
        assert!(comm.status().error().is_none());
        let mut got = vec![0u8; count * 4];
        buf.copy_to_host(0, &mut got).unwrap();
        assert_eq!(got, data);
        comm.bootstrap().barrier().unwrap();
    });
}

/// Ranks that make the same direct all-reduce with different element counts (a caller's
/// mistake; configurations that differ are refused earlier, at set-up) would have the larger
/// one write past the smaller one's buffer: every rank's kernel sees the peer's descriptor name
/// another call and refuses it (`RegisteredRefusal::OtherCall`, the communicator's error),
/// writing nothing.
#[test]
fn mismatched_all_reduce_lengths_are_refused() {
    if !harness::enough_gpus("mismatched_all_reduce_lengths_are_refused", 2) {
        return;
    }
    ranks_as_threads(2, |comm: Communicator| {
        let cfg = CollectiveConfig::for_backend(comm.gpu().kind());
        let c = Collectives::with_config(Arc::new(comm), cfg).expect("collectives");
        let g = c.communicator().gpu();
        let stream = g.stream().unwrap();
        let count = 1024 << c.communicator().rank();
        let buf = g.alloc(count * 4).unwrap();
        // SAFETY: `buf` holds `count` u32.
        let r = unsafe {
            c.all_reduce(
                buf.ptr(),
                buf.ptr(),
                count,
                DataType::U32,
                ReduceOp::Sum,
                &stream,
                Some(Algorithm::Direct),
            )
        };
        r.expect("queued");
        stream.synchronize().unwrap();
        match c.communicator().status().error() {
            Some(mscclpp::host::Error::Device {
                code: mscclpp::shared::DeviceErrorCode::InvalidArgument,
                addr,
                ..
            }) => assert_eq!(
                mscclpp::shared::RegisteredRefusal::from_u32((addr & 0xff) as u32),
                Some(mscclpp::shared::RegisteredRefusal::OtherCall)
            ),
            other => panic!("mismatched all-reduce lengths: {other:?}"),
        }
        drop(stream);
        (c, buf)
    });
}

/// A rank configured differently from its peer (here the LL128 range, which picks each call's
/// algorithm; a different buffer size would make a peer write past the buffer) is refused at
/// set-up on both ranks, naming the setting and the other rank, instead of hanging or
/// corrupting later.
#[test]
fn mismatched_configs_are_refused_at_setup() {
    if !harness::enough_gpus("mismatched_configs_are_refused_at_setup", 2) {
        return;
    }
    ranks_as_threads(2, |comm: Communicator| {
        let rank = comm.rank();
        let mut cfg = CollectiveConfig::for_backend(comm.gpu().kind());
        if rank == 1 {
            cfg.ll128_min_bytes += 16;
        }
        let r = Collectives::with_config(Arc::new(comm), cfg);
        match r {
            Err(mscclpp::host::Error::ConfigMismatch {
                what, rank: other, ..
            }) => {
                assert_eq!(what, "ll128_min_bytes");
                assert_eq!(other, 1 - rank);
            }
            other => panic!("rank {rank}: {:?}", other.err()),
        }
    });
}
