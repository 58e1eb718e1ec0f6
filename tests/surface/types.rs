//! Every data type as the reduce tests see it (from the formats' definitions), the reductions
//! under test, hash-based inputs and the reference of a reduction with its tolerance:
//! integers, minima and maxima exactly; floating sums within `(n − 1 + m)·u·Σ|t| + n·tiny`
//! (`m` 1 when every contribution was multiplied first), products within `(n − 1)·u·|Π|`
//! (`u` the type's unit roundoff, `tiny` its smallest subnormal): a contribution left out,
//! counted twice or multiplied twice misses these by far.

use mscclpp::collectives::{Reduction, Scalar};
use mscclpp::host::gpu::DeviceBuffer;
use mscclpp::shared::DataType;

use super::mix;

/// Every type.
pub const TYPES: [DataType; 12] = [
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

/// How the tests see a type: the harness's codec (from the formats' definitions).
pub use mscclpp_test_support::codec::{Float, Format as Kind, format as kind, int_value, wrap};
// Not every test binary that includes `surface/` uses these.
#[allow(unused_imports)]
pub use mscclpp_test_support::codec::{bytes_of_words as bytes_of, word_at as element_at};

/// The value of the float code `bits` (`None` for a NaN).
fn value(f: Float, bits: u64) -> Option<f64> {
    Some(f.decode(bits)).filter(|v| !v.is_nan())
}

/// The reductions under test.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Op {
    Sum,
    Prod,
    Min,
    Max,
    Avg,
    PreMulHost,
    PreMulDevice,
}

/// Every reduction.
pub const OPS: [Op; 7] = [
    Op::Sum,
    Op::Prod,
    Op::Min,
    Op::Max,
    Op::Avg,
    Op::PreMulHost,
    Op::PreMulDevice,
];

/// The pre-multiplication scalars: 3 and −7 for integers, 1.5 and −2.5 for floats (exact in
/// every format).
pub fn scalar_bits(d: DataType, op: Op) -> u64 {
    let device = op == Op::PreMulDevice;
    match kind(d) {
        Kind::Int { bits, .. } => wrap(if device { -7 } else { 3 }, bits),
        Kind::Float(f) => {
            let mant = if device {
                1 << (f.mantissa_bits - 2)
            } else {
                1 << (f.mantissa_bits - 1)
            };
            f.compose(device, device as i32, mant)
        }
    }
}

/// `op` as the library takes it (a device scalar goes into `scalar`).
pub fn reduction(d: DataType, op: Op, scalar: &DeviceBuffer) -> Reduction {
    match op {
        Op::Sum => Reduction::Sum,
        Op::Prod => Reduction::Prod,
        Op::Min => Reduction::Min,
        Op::Max => Reduction::Max,
        Op::Avg => Reduction::Avg,
        Op::PreMulHost => Reduction::PreMulSum(Scalar::Host(scalar_bits(d, op))),
        Op::PreMulDevice => {
            let bits = scalar_bits(d, op).to_le_bytes();
            scalar.copy_from_host(0, &bits[..d.size()]).unwrap();
            Reduction::PreMulSum(Scalar::Device(scalar.ptr()))
        }
    }
}

/// Element `i` of `rank`'s contribution for `op` on `d`: integers use every bit (sums,
/// products and multiplications wrap); floats have a random sign and mantissa and an
/// exponent that keeps every result finite and normal (products: magnitudes in [1/2, 2)).
pub fn element(d: DataType, op: Op, rank: usize, i: usize, salt: u64) -> u64 {
    let h = mix((rank as u64) << 40 ^ (i as u64) << 8 ^ salt ^ (d as u64) << 56);
    match kind(d) {
        Kind::Int { bits, .. } => wrap(h as i128, bits),
        Kind::Float(f) => {
            let (lo, span) = if op == Op::Prod { (-1, 2) } else { (-4, 7) };
            f.compose(h & 1 == 1, lo + (h >> 60) as i32 % span, h >> 8)
        }
    }
}

/// What one element must be.
pub enum Want {
    /// Exactly these bits.
    Bits(u64),
    /// Within `tol` of `value`.
    Near { value: f64, tol: f64 },
}

/// The factor a floating-point `op` over `n` ranks multiplies every contribution by (`None`
/// when it multiplies nothing), found once per case: the average's is a search over codes.
pub fn scale(d: DataType, op: Op, n: usize) -> Option<f64> {
    let Kind::Float(f) = kind(d) else {
        return None;
    };
    match op {
        Op::Avg => Some(one_over(n, d, f)),
        Op::PreMulHost | Op::PreMulDevice => value(f, scalar_bits(d, op)),
        _ => None,
    }
}

/// The reduction by `op` of `xs` (every rank's element).
pub fn reference(d: DataType, op: Op, xs: &[u64]) -> Want {
    reference_scaled(d, op, xs, scale(d, op, xs.len()))
}

/// [`reference`] with the factor of [`scale`] already found.
pub fn reference_scaled(d: DataType, op: Op, xs: &[u64], scale: Option<f64>) -> Want {
    let n = xs.len();
    match kind(d) {
        Kind::Int { bits, signed } => {
            let v: Vec<i128> = xs.iter().map(|&x| int_value(x, bits, signed)).collect();
            let m = |x: i128| int_value(wrap(x, bits), bits, signed);
            let s = int_value(scalar_bits(d, op), bits, signed);
            let r = match op {
                Op::Sum => v.iter().fold(0, |a, &x| m(a + x)),
                Op::Prod => v.iter().fold(1, |a: i128, &x| m(a.wrapping_mul(x))),
                Op::Min => v.iter().copied().min().unwrap_or(0),
                Op::Max => v.iter().copied().max().unwrap_or(0),
                Op::Avg => v.iter().fold(0, |a, &x| m(a + x)) / n as i128,
                Op::PreMulHost | Op::PreMulDevice => {
                    v.iter().fold(0, |a, &x| m(a + m(x.wrapping_mul(s))))
                }
            };
            Want::Bits(wrap(r, bits))
        }
        Kind::Float(f) => {
            let v: Vec<f64> = xs.iter().map(|&x| f.decode(x)).collect();
            let slack = if d == DataType::F64 {
                2f64.powi(-52)
            } else {
                0.0
            };
            match op {
                Op::Min | Op::Max => {
                    let pick = if op == Op::Min { f64::min } else { f64::max };
                    let first = if op == Op::Min {
                        f64::INFINITY
                    } else {
                        f64::NEG_INFINITY
                    };
                    Want::Near {
                        value: v.iter().copied().fold(first, pick),
                        tol: 0.0,
                    }
                }
                Op::Prod => {
                    let p: f64 = v.iter().product();
                    let steps = (n - 1) as f64;
                    Want::Near {
                        value: p,
                        tol: (steps * f.unit_roundoff() + n as f64 * slack) * p.abs()
                            + f.smallest_subnormal(),
                    }
                }
                _ => {
                    let t: Vec<f64> = v.iter().map(|x| x * scale.unwrap_or(1.0)).collect();
                    let steps = (n - 1) as f64 + if scale.is_some() { 1.0 } else { 0.0 };
                    let mass: f64 = t.iter().map(|x| x.abs()).sum();
                    Want::Near {
                        value: t.iter().sum(),
                        tol: (steps * f.unit_roundoff() + n as f64 * slack) * mass
                            + n as f64 * f.smallest_subnormal(),
                    }
                }
            }
        }
    }
}

/// `1/n` as NCCL's average multiplies by: rounded to the type (through f32).
fn one_over(n: usize, d: DataType, f: Float) -> f64 {
    let x = (1.0 / n as f64) as f32 as f64;
    match d {
        DataType::F64 => 1.0 / n as f64,
        DataType::F32 => x,
        _ => f.rounded(x),
    }
}

/// Checks one element's bits against `want`.
pub fn check(d: DataType, got: u64, want: &Want, what: &dyn Fn() -> String) {
    match (want, kind(d)) {
        (Want::Bits(w), _) => assert_eq!(got, *w, "{}: got {got:#x}, want {w:#x}", what()),
        (Want::Near { value, tol }, Kind::Float(f)) => {
            let g = f.decode(got);
            assert!(
                (g - value).abs() <= *tol,
                "{}: got {g:e} ({got:#x}), want {value:e} ± {tol:e}",
                what()
            );
        }
        (Want::Near { .. }, Kind::Int { .. }) => panic!("integers compare exactly"),
    }
}

#[test]
fn the_reference_agrees_with_values_worked_out_by_hand() {
    let Kind::Float(e4m3) = kind(DataType::F8E4M3) else {
        unreachable!()
    };
    assert_eq!(value(e4m3, 0x7e), Some(448.0));
    assert_eq!(value(e4m3, 0x7f), None);
    assert_eq!(value(e4m3, 0x01), Some(2f64.powi(-9)));
    assert_eq!(one_over(3, DataType::F8E4M3, e4m3), 0.34375);
    let Kind::Float(f16) = kind(DataType::F16) else {
        unreachable!()
    };
    assert_eq!(Some(one_over(3, DataType::F16, f16)), value(f16, 0x3555));
    assert_eq!(value(f16, 0x7c00), Some(f64::INFINITY));
    // i32 minimum of -1 and 1.
    assert!(matches!(
        reference(DataType::I32, Op::Min, &[0xffff_ffff, 1]),
        Want::Bits(0xffff_ffff)
    ));
    for d in TYPES {
        if let Kind::Float(f) = kind(d) {
            assert_eq!(value(f, scalar_bits(d, Op::PreMulHost)), Some(1.5), "{d:?}");
            assert_eq!(
                value(f, scalar_bits(d, Op::PreMulDevice)),
                Some(-2.5),
                "{d:?}"
            );
        }
    }
    // i8: 100 + 100 wraps to -56; averaged over 2: -28 (0xe4).
    assert!(matches!(
        reference(DataType::I8, Op::Avg, &[100, 100]),
        Want::Bits(0xe4)
    ));
    // u8 pre-multiplied by 3: 3 * 200 + 3 * 100 = 900 = 132 (mod 256).
    assert!(matches!(
        reference(DataType::U8, Op::PreMulHost, &[200, 100]),
        Want::Bits(132)
    ));
    // f32: 1.5 + 2.25 exactly, within the sum's bound.
    let (a, b) = (1.5f32.to_bits() as u64, 2.25f32.to_bits() as u64);
    match reference(DataType::F32, Op::Sum, &[a, b]) {
        Want::Near { value, tol } => assert!(value == 3.75 && tol < 1e-5),
        Want::Bits(_) => panic!("a float sum compares within a bound"),
    }
}
