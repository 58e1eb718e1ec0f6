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

mod common;

use std::sync::Arc;

use common::ranks_as_threads;
use mscclpp::collectives::{Algorithm, CollectiveConfig, Collectives, Reduction, Scalar};
use mscclpp::host::communicator::Communicator;
use mscclpp::host::gpu::{BackendKind, DeviceBuffer, Gpu, Stream};
use mscclpp::shared::DataType;

// ------------------------------------------------------------------------------------------
// The types, from their definitions
// ------------------------------------------------------------------------------------------

/// A floating-point format: exponent bits, mantissa bits, and whether its all-ones exponent
/// holds infinities and NaNs (IEEE) or only a NaN with an all-ones mantissa (e4m3).
#[derive(Clone, Copy, Debug)]
struct Float {
    ebits: u32,
    mbits: u32,
    ieee: bool,
}

impl Float {
    fn bias(self) -> i32 {
        (1 << (self.ebits - 1)) - 1
    }
    /// Unit roundoff: half an ulp of 1.
    fn u(self) -> f64 {
        2f64.powi(-(self.mbits as i32) - 1)
    }
    /// The smallest subnormal.
    fn tiny(self) -> f64 {
        2f64.powi(1 - self.bias() - self.mbits as i32)
    }
    /// The value of `bits` (NaN: `None`).
    fn decode(self, bits: u64) -> Option<f64> {
        let m = bits & ((1 << self.mbits) - 1);
        let e = ((bits >> self.mbits) & ((1 << self.ebits) - 1)) as i32;
        let sign = if (bits >> (self.mbits + self.ebits)) & 1 == 1 {
            -1.0
        } else {
            1.0
        };
        let top = (1 << self.ebits) - 1;
        let frac = m as f64 / 2f64.powi(self.mbits as i32);
        if self.ieee && e == top {
            return if m == 0 {
                Some(sign * f64::INFINITY)
            } else {
                None
            };
        }
        if !self.ieee && e == top && m == (1 << self.mbits) - 1 {
            return None;
        }
        Some(if e == 0 {
            sign * frac * 2f64.powi(1 - self.bias())
        } else {
            sign * (1.0 + frac) * 2f64.powi(e - self.bias())
        })
    }
    /// A value of `2^e` times a mantissa of `mant` bits (`1 <= 1.m < 2`), signed.
    fn encode(self, negative: bool, e: i32, mant: u64) -> u64 {
        let m = mant & ((1 << self.mbits) - 1);
        let s = (negative as u64) << (self.mbits + self.ebits);
        s | ((e + self.bias()) as u64) << self.mbits | m
    }
}

/// How the test sees a data type.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Int { bits: u32, signed: bool },
    Float(Float),
}

fn kind(d: DataType) -> Kind {
    let f = |ebits, mbits, ieee| Kind::Float(Float { ebits, mbits, ieee });
    let int = |bits, signed| Kind::Int { bits, signed };
    match d {
        DataType::F32 => f(8, 23, true),
        DataType::F64 => f(11, 52, true),
        DataType::F16 => f(5, 10, true),
        DataType::BF16 => f(8, 7, true),
        DataType::F8E4M3 => f(4, 3, false),
        DataType::F8E5M2 => f(5, 2, true),
        DataType::I8 => int(8, true),
        DataType::U8 => int(8, false),
        DataType::I32 => int(32, true),
        DataType::U32 => int(32, false),
        DataType::I64 => int(64, true),
        DataType::U64 => int(64, false),
    }
}

/// Every type.
const TYPES: [DataType; 12] = [
    DataType::F32,
    DataType::F16,
    DataType::BF16,
    DataType::I32,
    DataType::U32,
    DataType::I8,
    DataType::U8,
    DataType::I64,
    DataType::U64,
    DataType::F64,
    DataType::F8E4M3,
    DataType::F8E5M2,
];

/// The bits of an integer value (wrapped to the type).
fn wrap(v: i128, bits: u32) -> u64 {
    (v as u128 & ((1u128 << bits) - 1)) as u64
}

/// An integer element's value.
fn int_value(bits_of: u64, bits: u32, signed: bool) -> i128 {
    let v = bits_of as u128 & ((1u128 << bits) - 1);
    if signed && v >> (bits - 1) == 1 {
        v as i128 - (1i128 << bits)
    } else {
        v as i128
    }
}

/// The element of `fmt` nearest to `x` (ties to the even code), by brute force over every
/// code: for 8- and 16-bit formats.
fn nearest_small(x: f64, fmt: Float) -> u64 {
    let width = 1 + fmt.ebits + fmt.mbits;
    let mut best: Option<(f64, u64)> = None;
    for code in 0..(1u64 << width) {
        let Some(v) = fmt.decode(code) else {
            continue;
        };
        if v.is_infinite() {
            continue;
        }
        let d = (v - x).abs();
        if best.is_none_or(|(bd, bc)| d < bd || (d == bd && code & 1 == 0 && bc & 1 == 1)) {
            best = Some((d, code));
        }
    }
    best.expect("a finite code").1
}

/// `1/n` as the element NCCL's average multiplies by: `1/n` rounded to the type (through f32,
/// as NCCL's `float(1.0/n)`: for n = 2, 3 f32 rounding first changes nothing here).
fn one_over(n: usize, d: DataType, fmt: Float) -> u64 {
    let x = 1.0 / n as f64;
    match d {
        DataType::F64 => x.to_bits(),
        DataType::F32 => (x as f32).to_bits() as u64,
        _ => nearest_small((x as f32) as f64, fmt),
    }
}

// ------------------------------------------------------------------------------------------
// Inputs and reductions
// ------------------------------------------------------------------------------------------

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The reductions under test.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Op {
    Sum,
    Prod,
    Min,
    Max,
    Avg,
    PreMulHost,
    PreMulDevice,
}

const OPS: [Op; 7] = [
    Op::Sum,
    Op::Prod,
    Op::Min,
    Op::Max,
    Op::Avg,
    Op::PreMulHost,
    Op::PreMulDevice,
];

/// The scalars of the pre-multiplied sums: (by value, in device memory).
fn scalar_bits(d: DataType, op: Op) -> u64 {
    let device = op == Op::PreMulDevice;
    match kind(d) {
        // 3 and -7 (wrapped).
        Kind::Int { bits, .. } => wrap(if device { -7 } else { 3 }, bits),
        // 1.5 and -2.5, exact in every format.
        Kind::Float(f) => f.encode(
            device,
            if device { 1 } else { 0 },
            if device {
                1 << (f.mbits - 2)
            } else {
                1 << (f.mbits - 1)
            },
        ),
    }
}

/// Element `i` of rank `rank`'s input for `op` on `d` (a different stream per `salt`).
fn input(d: DataType, op: Op, rank: usize, i: usize, salt: u64) -> u64 {
    let h = mix((rank as u64) << 40 ^ (i as u64) << 8 ^ salt ^ (d as u64) << 56);
    match kind(d) {
        Kind::Int { bits, .. } => wrap(h as i128, bits),
        Kind::Float(f) => {
            // Products: magnitudes in [1/2, 2); everything else in [1/16, 8).
            let (lo, span) = if op == Op::Prod { (-1, 2) } else { (-4, 7) };
            let e = lo + (h >> 60) as i32 % span;
            f.encode(h & 1 == 1, e, h >> 8)
        }
    }
}

/// What one rank must find: the exact reduction of `xs` (every rank's element) and, for
/// floats, how far the result may be from it.
enum Want {
    Bits(u64),
    Near { value: f64, tol: f64 },
}

/// The factor a floating-point `op` multiplies each contribution by, if any (found once per
/// case: the average's is a brute-force search).
fn factor(d: DataType, op: Op, n: usize) -> Option<f64> {
    let Kind::Float(f) = kind(d) else {
        return None;
    };
    match op {
        Op::Avg => f.decode(one_over(n, d, f)),
        Op::PreMulHost | Op::PreMulDevice => f.decode(scalar_bits(d, op)),
        _ => None,
    }
}

/// The reference for `op` over the ranks' elements `xs` (`scale`: [`factor`]).
fn reference(d: DataType, op: Op, xs: &[u64], n: usize, scale: Option<f64>) -> Want {
    match kind(d) {
        Kind::Int { bits, signed } => {
            let v: Vec<i128> = xs.iter().map(|&x| int_value(x, bits, signed)).collect();
            let m = |x: i128| int_value(wrap(x, bits), bits, signed);
            let s = int_value(scalar_bits(d, op), bits, signed);
            let r = match op {
                Op::Sum => v.iter().fold(0, |a, &x| m(a + x)),
                Op::Prod => v.iter().fold(1i128, |a, &x| m(a.wrapping_mul(x))),
                Op::Min => *v.iter().min().unwrap(),
                Op::Max => *v.iter().max().unwrap(),
                // The sum wraps in the type, then one division truncating toward zero.
                Op::Avg => v.iter().fold(0, |a, &x| m(a + x)) / n as i128,
                Op::PreMulHost | Op::PreMulDevice => {
                    v.iter().fold(0, |a, &x| m(a + m(x.wrapping_mul(s))))
                }
            };
            Want::Bits(wrap(r, bits))
        }
        Kind::Float(f) => {
            let v: Vec<f64> = xs
                .iter()
                .map(|&x| f.decode(x).expect("finite input"))
                .collect();
            let f64_slack = if d == DataType::F64 {
                2f64.powi(-52)
            } else {
                0.0
            };
            match op {
                Op::Min => Want::Near {
                    value: v.iter().cloned().fold(f64::INFINITY, f64::min),
                    tol: 0.0,
                },
                Op::Max => Want::Near {
                    value: v.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
                    tol: 0.0,
                },
                Op::Prod => {
                    let p: f64 = v.iter().product();
                    let steps = (n - 1) as f64;
                    Want::Near {
                        value: p,
                        tol: (steps * f.u() + n as f64 * f64_slack) * p.abs() + f.tiny(),
                    }
                }
                _ => {
                    let t: Vec<f64> = v.iter().map(|x| x * scale.unwrap_or(1.0)).collect();
                    let steps = (n - 1) as f64 + if scale.is_some() { 1.0 } else { 0.0 };
                    let mass: f64 = t.iter().map(|x| x.abs()).sum();
                    Want::Near {
                        value: t.iter().sum(),
                        tol: (steps * f.u() + n as f64 * f64_slack) * mass + n as f64 * f.tiny(),
                    }
                }
            }
        }
    }
}

/// Checks `got` (one element's bits) against `want`.
fn check(d: DataType, got: u64, want: &Want, what: &dyn Fn() -> String) {
    match (want, kind(d)) {
        (Want::Bits(w), _) => assert_eq!(got, *w, "{}: got {got:#x}, want {w:#x}", what()),
        (Want::Near { value, tol }, Kind::Float(f)) => {
            let g = f.decode(got).unwrap_or(f64::NAN);
            assert!(
                (g - value).abs() <= *tol,
                "{}: got {g:e} ({got:#x}), want {value:e} ± {tol:e}",
                what()
            );
        }
        (Want::Near { .. }, Kind::Int { .. }) => unreachable!("integers compare exactly"),
    }
}

fn read(bytes: &[u8], es: usize, i: usize) -> u64 {
    let mut b = [0u8; 8];
    b[..es].copy_from_slice(&bytes[i * es..(i + 1) * es]);
    u64::from_le_bytes(b)
}

fn bytes_of(vals: impl Iterator<Item = u64>, es: usize) -> Vec<u8> {
    vals.flat_map(|v| v.to_le_bytes().into_iter().take(es))
        .collect()
}

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

/// The reduction `op` on `d`, with `scalar` holding the device scalar.
fn reduction(d: DataType, op: Op, scalar: &DeviceBuffer) -> Reduction {
    match op {
        Op::Sum => Reduction::Sum,
        Op::Prod => Reduction::Prod,
        Op::Min => Reduction::Min,
        Op::Max => Reduction::Max,
        Op::Avg => Reduction::Avg,
        Op::PreMulHost => Reduction::PreMulSum(Scalar::Host(scalar_bits(d, op))),
        Op::PreMulDevice => {
            let bits = scalar_bits(d, op);
            scalar
                .copy_from_host(0, &bits.to_le_bytes()[..d.size()])
                .unwrap();
            Reduction::PreMulSum(Scalar::Device(scalar.ptr()))
        }
    }
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
        let want = reference(d, op, &xs, n, scale);
        check(d, read(&got, es, j), &want, &|| {
            format!("{}, element {j}", what())
        });
    }
}

/// The grid on `n` ranks: every collective, algorithm, type and reduction, at the counts the
/// rotation (or the full grid) picks.
fn grid(n: usize) {
    let kind = common::backend();
    let devices = kind.device_count().unwrap_or(0);
    if kind == BackendKind::Cuda && devices < n {
        eprintln!(
            "NOT RUN: {n} ranks need {n} GPUs (one per rank), the CUDA backend has {devices}"
        );
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

/// The test's own reference agrees with values worked out by hand (so a wrong reference
/// cannot pass a wrong library).
#[test]
fn reference_by_hand() {
    let e4m3 = match kind(DataType::F8E4M3) {
        Kind::Float(f) => f,
        _ => unreachable!(),
    };
    assert_eq!(e4m3.decode(0x7e), Some(448.0));
    assert_eq!(e4m3.decode(0x7f), None);
    assert_eq!(e4m3.decode(0x01), Some(2f64.powi(-9)));
    assert_eq!(one_over(3, DataType::F8E4M3, e4m3), 0x2b); // 0.34375
    assert_eq!(
        e4m3.decode(scalar_bits(DataType::F8E4M3, Op::PreMulHost)),
        Some(1.5)
    );
    assert_eq!(
        e4m3.decode(scalar_bits(DataType::F8E4M3, Op::PreMulDevice)),
        Some(-2.5)
    );
    let f16 = match kind(DataType::F16) {
        Kind::Float(f) => f,
        _ => unreachable!(),
    };
    assert_eq!(one_over(3, DataType::F16, f16), 0x3555);
    assert_eq!(f16.decode(0x7c00), Some(f64::INFINITY));
    for d in TYPES {
        if let Kind::Float(f) = kind(d) {
            assert_eq!(f.decode(scalar_bits(d, Op::PreMulHost)), Some(1.5), "{d:?}");
            assert_eq!(
                f.decode(scalar_bits(d, Op::PreMulDevice)),
                Some(-2.5),
                "{d:?}"
            );
        }
    }
    // i8: 100 + 100 wraps to -56, averaged over 2: -28 (two's complement 0xe4).
    let avg = reference(DataType::I8, Op::Avg, &[100, 100], 2, None);
    assert!(matches!(avg, Want::Bits(0xe4)));
    // u8 pre-multiplied by 3: 3 * 200 + 3 * 100 = 900 = 132 (mod 256).
    let pms = reference(DataType::U8, Op::PreMulHost, &[200, 100], 2, None);
    assert!(matches!(pms, Want::Bits(132)));
    // i32 minimum of -1 and 1.
    let min = reference(DataType::I32, Op::Min, &[0xffff_ffff, 1], 2, None);
    assert!(matches!(min, Want::Bits(0xffff_ffff)));
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
