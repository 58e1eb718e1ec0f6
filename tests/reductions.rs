//! Every data type × reduction × algorithm of `all_reduce` and `reduce_scatter`, on 2 and 3
//! ranks as threads, checked element by element against a reference computed here, from the
//! types' definitions (nothing of `mscclpp::device::reduce` is used).
//!
//! - Inputs are a hash of (rank, index): integers use all their bits (so sums, products and
//!   pre-multiplications wrap around); floats are built from a random sign, an exponent in a
//!   range that keeps every result finite and normal, and random mantissa bits.
//! - Reductions: sum, product, min, max, average, and pre-multiplied sums with the scalar by
//!   value and in device memory (NCCL's `ncclScalarHostImmediate` / `ncclScalarDevice`).
//! - Tolerances: integers, min and max exact (which also proves every contribution is
//!   pre-multiplied exactly once and an integer average divided exactly once: twice would
//!   change the bits). Floating sums, averages and pre-multiplied sums: the reduction rounds
//!   at every step in the element type in an order of its own, so the result lies within
//!   `(n − 1 + m)·u·Σ|t_r| + n·tiny` of the exact `Σ t_r` (`t_r` the contributions after any
//!   multiplication, `m` 1 when they were multiplied and 0 otherwise, `u` the type's unit
//!   roundoff, `tiny` its smallest subnormal); products within `(n − 1)·u·|Π x_r|` (the test's
//!   own f64 arithmetic adds its 2⁻⁵³ share for f64). A contribution multiplied twice or not
//!   at all misses these bounds by far (the scalars are 1.5 and −2.5).
//! - Counts: 1, 1009 (a prime), 37 (a byte count no multiple of 16) and 1040 (whole 8-byte
//!   words of every type: the LL kernels' word path) for the packet and staged algorithms,
//!   whole 16-byte vectors (1040 elements, and 16) for the registered ones (direct, copy
//!   engine), which serve nothing else. Inputs sit one element into their allocation (16
//!   bytes for the registered paths); outputs start as a marker.
//!
//! By default each (type, reduction, algorithm) runs at one of the counts, rotating, so that
//! every count meets every type, reduction and algorithm across the grid (under a minute on
//! two cores on the CPU backend); `MSCCLPP_TEST_REDUCTIONS_FULL=1` runs every count of every
//! combination.

mod surface;

use surface::mix;

use std::sync::Arc;

use mscclpp::collectives::{Algorithm, CollectiveConfig, Collectives};
use mscclpp::host::communicator::Communicator;
use mscclpp::host::gpu::{DeviceBuffer, Gpu, Stream};
use mscclpp::shared::DataType;
use mscclpp_test_support as harness;
use mscclpp_test_support::ranks_as_threads;

// The types, their reductions and the host reference: `tests/surface/types.rs` (shared with
// the NCCL-surface tests).
use surface::types::{
    OPS, Op, TYPES, bytes_of, check, element as input, element_at as read, reduction,
    reference_scaled, scale as factor,
};

// ------------------------------------------------------------------------------------------
// Running
// ------------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Debug)]
enum Coll {
    AllReduce,
    ReduceScatter,
}

/// Every algorithm that reduces, per collective.
fn algorithms(coll: Coll) -> &'static [Algorithm] {
    match coll {
        Coll::AllReduce => &[
            Algorithm::LlOneShot,
            Algorithm::Ll128,
            Algorithm::LlTwoShot,
            Algorithm::Staged,
            Algorithm::TwoShotPut,
            Algorithm::Direct,
            Algorithm::CopyEngine,
        ],
        Coll::ReduceScatter => &[
            Algorithm::LlOneShot,
            Algorithm::Ll128,
            Algorithm::Staged,
            Algorithm::Direct,
        ],
    }
}

/// Whether `algo` works on the callers' registered buffers (whole 16-byte vectors only).
fn registered(algo: Algorithm) -> bool {
    matches!(algo, Algorithm::Direct | Algorithm::CopyEngine)
}

/// The counts `algo` is checked at.
fn counts(algo: Algorithm) -> &'static [usize] {
    if registered(algo) {
        &[1040, 16]
    } else {
        &[1, 1009, 37, 1040]
    }
}

fn full_grid() -> bool {
    std::env::var("MSCCLPP_TEST_REDUCTIONS_FULL").is_ok_and(|v| v == "1")
}

/// One rank's buffers, allocated once and reused by every case (the registered paths cache
/// each allocation they see, and a bounded number of them).
struct Buffers {
    stream: Stream,
    input: DeviceBuffer,
    output: DeviceBuffer,
    scalar: DeviceBuffer,
}

/// The most elements a case uses per part.
const MAX_COUNT: usize = 1040;

impl Buffers {
    fn new(g: &Gpu, n: usize) -> Self {
        Self {
            stream: g.stream().unwrap(),
            input: g.alloc(16 + n * MAX_COUNT * 8).unwrap(),
            output: g.alloc(MAX_COUNT * 8).unwrap(),
            scalar: g.alloc(8).unwrap(),
        }
    }
}

/// One call of `coll` by `algo` with `op` on `count` elements of `d`, checked on this rank.
fn one_case(
    c: &Collectives,
    b: &Buffers,
    coll: Coll,
    algo: Algorithm,
    d: DataType,
    op: Op,
    count: usize,
) {
    let comm = c.communicator();
    let (rank, n) = (comm.rank(), comm.size());
    let (stream, scalar, inp, out) = (&b.stream, &b.scalar, &b.input, &b.output);
    let es = d.size();
    let parts = if coll == Coll::ReduceScatter { n } else { 1 };
    let off = if registered(algo) { 16 } else { es };
    let salt = (count as u64) << 16 ^ (algo as u64) << 24 ^ op as u64;
    // Element j of part p of rank r's input.
    let x = |r: usize, p: usize, j: usize| input(d, op, r, p * count + j, salt);
    let mine = bytes_of(
        (0..parts * count).map(|k| x(rank, k / count, k % count)),
        es,
    );
    inp.copy_from_host(off, &mine).unwrap();
    out.copy_from_host(0, &vec![0xa5; count * es]).unwrap();
    let red = reduction(d, op, scalar);
    let src = inp.ptr().byte_add_cast(off as u64);
    // SAFETY: `src` holds `parts * count` elements and `out` `count`, until the synchronize
    // below; the device scalar lives in `scalar` for the whole test.
    let r = unsafe {
        match coll {
            Coll::AllReduce => c.all_reduce(src, out.ptr(), count, d, red, stream, Some(algo)),
            Coll::ReduceScatter => {
                c.reduce_scatter(src, out.ptr(), count, d, red, stream, Some(algo))
            }
        }
    };
    let what = || format!("{coll:?} by {algo:?}, {op:?} of {d:?}, {count} elements on {n} ranks");
    r.unwrap_or_else(|e| panic!("{}: {e}", what()));
    stream.synchronize().unwrap();
    let mut got = vec![0u8; count * es];
    out.copy_to_host(0, &mut got).unwrap();
    // This rank's part: the whole buffer (all-reduce) or part `rank` (reduce-scatter).
    let part = if coll == Coll::ReduceScatter { rank } else { 0 };
    let scale = factor(d, op, n);
    for j in 0..count {
        let xs: Vec<u64> = (0..n).map(|r| x(r, part, j)).collect();
        let want = reference_scaled(d, op, &xs, scale);
        check(d, read(&got, es, j), &want, &|| {
            format!("{}, element {j}", what())
        });
    }
}

/// The grid on `n` ranks: every collective, algorithm, type and reduction, at the counts the
/// rotation (or the full grid) picks.
fn grid(n: usize) {
    if !harness::enough_gpus(&format!("the reduction grid on {n} ranks"), n) {
        return;
    }
    let full = full_grid();
    ranks_as_threads(n, |comm: Communicator| {
        let cfg = CollectiveConfig::for_backend(comm.gpu().kind());
        let c = Collectives::with_config(Arc::new(comm), cfg).expect("collectives");
        let b = Buffers::new(c.communicator().gpu(), n);
        let mut k = n;
        for coll in [Coll::AllReduce, Coll::ReduceScatter] {
            for &algo in algorithms(coll) {
                for d in TYPES {
                    for op in OPS {
                        let all = counts(algo);
                        k += 1;
                        let picked: &[usize] = if full {
                            all
                        } else {
                            &all[k % all.len()..][..1]
                        };
                        for &count in picked {
                            one_case(&c, &b, coll, algo, d, op, count);
                        }
                    }
                }
            }
        }
        assert!(c.communicator().status().error().is_none());
        c.communicator().bootstrap().barrier().unwrap();
    });
}

#[test]
fn every_type_reduction_and_algorithm_on_2_ranks() {
    grid(2);
}

#[test]
fn every_type_reduction_and_algorithm_on_3_ranks() {
    grid(3);
}

/// On one rank an all-reduce is a copy (an average too: `x · 1` is `x`), except that a
/// pre-multiplied sum still multiplies, as NCCL's does: by the direct kernel's local
/// reduction on whole vectors from `alone_direct_min_bytes`, else through staging.
#[test]
fn one_rank_still_multiplies() {
    ranks_as_threads(1, |comm: Communicator| {
        let mut cfg = CollectiveConfig::for_backend(comm.gpu().kind());
        // Every whole vector takes the direct kernel's local reduction (the CUDA default
        // starts at 8 MiB), so that both paths run on both backends.
        cfg.alone_direct_min_bytes = 16;
        let c = Collectives::with_config(Arc::new(comm), cfg).expect("collectives");
        let b = Buffers::new(c.communicator().gpu(), 1);
        for d in TYPES {
            for op in OPS {
                // Whole 16-byte vectors: the direct kernel's local reduction; 37 elements at
                // an element's offset: staging. (One rank takes no forced algorithm: the
                // argument only picks the input's offset.)
                // (A one-rank average is a copy: `x · 1` is `x`.)
                let scales = matches!(op, Op::PreMulHost | Op::PreMulDevice);
                for (algo, count, by) in [
                    (Algorithm::Direct, 64, Algorithm::Direct),
                    (Algorithm::Staged, 37, Algorithm::Staged),
                ] {
                    one_case(&c, &b, Coll::AllReduce, algo, d, op, count);
                    if scales {
                        let what = format!("{op:?} of {d:?}, {count} elements");
                        assert_eq!(c.last_algorithm(), Some(by), "{what}");
                    }
                }
            }
        }
    });
}

/// The host and the kernels agree on which kernel reduces what: a main kernel launched for a
/// reduction only its `_any` twin serves (here the staged kernel, a u32 minimum on one rank)
/// records `InvalidArgument` and writes nothing, and the twin reduces it.
#[test]
fn main_kernels_refuse_what_their_twins_serve() {
    use mscclpp::host::gpu::LaunchConfig;
    use mscclpp::shared::{CollectiveMode, CollectiveParams, DeviceErrorCode, DeviceReduceOp};
    ranks_as_threads(1, |comm: Communicator| {
        let g = comm.gpu().clone();
        let module = g.load_ptx(mscclpp::DEVICE_PTX).unwrap();
        let main = module.kernel(mscclpp::kernels::STAGED_COLLECTIVE).unwrap();
        let any = module
            .kernel(mscclpp::kernels::STAGED_COLLECTIVE_ANY)
            .unwrap();
        let stream = g.stream().unwrap();
        let count = 37;
        let values: Vec<u64> = (0..count).map(|i| mix(i as u64) & 0xffff_ffff).collect();
        let input = g.alloc(count * 4).unwrap();
        input
            .copy_from_host(0, &bytes_of(values.iter().copied(), 4))
            .unwrap();
        let output = g.alloc(count * 4).unwrap();
        let scratch = g.alloc(1 << 12).unwrap();
        let channels = g.alloc(64).unwrap();
        let marker = vec![0xa5u8; count * 4];
        output.copy_from_host(0, &marker).unwrap();
        let p = CollectiveParams {
            status: comm.status().device_ptr(),
            channels: channels.ptr().cast(),
            input: input.ptr(),
            output: output.ptr(),
            scratch: scratch.ptr(),
            bytes: (count * 4) as u64,
            dtype: DataType::U32 as u32,
            op: DeviceReduceOp::Min as u32,
            mode: CollectiveMode::AllReduce as u32,
            nranks: 1,
            max_blocks: 1,
            ..Default::default()
        };
        let cfg = LaunchConfig::new(1, 16).with_shared_mem(16);
        // SAFETY: one rank (no peer is touched), buffers of `bytes` and a staging area of
        // 4 KiB at offset 0 of the scratch.
        unsafe { stream.launch(&any, cfg, p) }.unwrap();
        stream.synchronize().unwrap();
        let mut got = vec![0u8; count * 4];
        output.copy_to_host(0, &mut got).unwrap();
        assert_eq!(
            got,
            bytes_of(values.iter().copied(), 4),
            "the twin's one-rank minimum"
        );
        assert!(comm.status().error().is_none());
        output.copy_from_host(0, &marker).unwrap();
        // SAFETY: as above.
        unsafe { stream.launch(&main, cfg, p) }.unwrap();
        stream.synchronize().unwrap();
        output.copy_to_host(0, &mut got).unwrap();
        assert_eq!(got, marker, "the main kernel wrote nothing");
        match comm.status().error() {
            Some(mscclpp::host::Error::Device { code, addr, .. }) => {
                assert_eq!(code, DeviceErrorCode::InvalidArgument);
                assert_eq!(
                    addr,
                    (DataType::U32 as u64) << 8 | DeviceReduceOp::Min as u64
                );
            }
            other => panic!("the main kernel recorded {other:?}"),
        }
    });
}
