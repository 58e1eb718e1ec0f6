//! Test data that cannot collude: each element a function of (rank, part, index) with no
//! symmetry and no short period, small integers that every one of NCCL's 12 types holds, and
//! an independent host reference of every operator.
//!
//! Exactness, type by type: integer types are compared exactly, with wrapping arithmetic (a
//! value is stored modulo 2^bits, so -1 is the largest unsigned value; sums and products wrap,
//! which is consistent whatever the order of the reduction). Floating types are compared
//! exactly wherever every partial result of any reduction order is representable, which the
//! value ranges guarantee: sums of at most 8 values in [-9, 26] (fp8: in [-1, 1]), products
//! of values in {-1, 1, 2} (at most 2^8 in magnitude), averages over a power-of-two number of
//! ranks (the factor 1/n and every partial sum exact) and pre-multiplied sums by 2 or -1.
//! Unsigned types get non-negative data (so every value, u64's too, is exact in an `f64`). The
//! one inexact case, a floating average over 3 ranks (NCCL multiplies each value by 1/n rounded
//! to the type), is compared within the bound of its roundings: `n · ε · Σ|x_r · s|` with `s`
//! the rounded factor and `ε` the type's unit roundoff (2^-mantissa bits).
//!
//! Elements go to and from bytes through the harness's codec (`mscclpp_test_support::codec`,
//! written from the formats' definitions), never through the library's conversions.

use std::ffi::c_int;

use mscclpp::shared::DataType;
use mscclpp_test_support::codec::{self, Float};

use super::{AVG, MAX, MIN, PROD, SUM};

/// `ncclDataType_t` values.
pub const I8: c_int = 0;
pub const U8: c_int = 1;
pub const I32: c_int = 2;
pub const U32: c_int = 3;
pub const I64: c_int = 4;
pub const U64: c_int = 5;
pub const F16: c_int = 6;
pub const F32: c_int = 7;
pub const F64: c_int = 8;
pub const BF16: c_int = 9;
pub const F8E4M3: c_int = 10;
pub const F8E5M2: c_int = 11;

/// Every NCCL type: (value, bytes).
pub const TYPES: [(c_int, usize); 12] = [
    (I8, 1),
    (U8, 1),
    (I32, 4),
    (U32, 4),
    (I64, 8),
    (U64, 8),
    (F16, 2),
    (F32, 4),
    (F64, 8),
    (BF16, 2),
    (F8E4M3, 1),
    (F8E5M2, 1),
];

/// An operator of a test: a built-in one, or a pre-multiplied sum (made per type by the test
/// with `ncclRedOpCreatePreMulSum`) by a scalar on the host or on the device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    /// `ncclSum`, `ncclProd`, `ncclMax`, `ncclMin`, `ncclAvg`.
    Builtin(c_int),
    /// `ncclScalarHostImmediate` with the value [`scalar`] gives.
    PreMulHost,
    /// `ncclScalarDevice` with the value [`scalar`] gives.
    PreMulDevice,
}

/// Every operator the tests run: the five built-in ones and a pre-multiplied sum of each
/// residence.
pub const OPS: [Op; 7] = [
    Op::Builtin(SUM),
    Op::Builtin(PROD),
    Op::Builtin(MAX),
    Op::Builtin(MIN),
    Op::Builtin(AVG),
    Op::PreMulHost,
    Op::PreMulDevice,
];

/// The scalar of a pre-multiplied sum on type `t`: 2 on the host; -1 on the device (3 for
/// unsigned types, whose data is non-negative).
pub fn scalar(t: c_int, op: Op) -> f64 {
    match op {
        Op::PreMulHost => 2.0,
        Op::PreMulDevice if unsigned(t) => 3.0,
        Op::PreMulDevice => -1.0,
        Op::Builtin(o) => panic!("operator {o} has no scalar"),
    }
}

/// The library's name of NCCL's type `t`.
pub fn dtype(t: c_int) -> DataType {
    match t {
        I8 => DataType::I8,
        U8 => DataType::U8,
        I32 => DataType::I32,
        U32 => DataType::U32,
        I64 => DataType::I64,
        U64 => DataType::U64,
        F16 => DataType::F16,
        F32 => DataType::F32,
        F64 => DataType::F64,
        BF16 => DataType::BF16,
        F8E4M3 => DataType::F8E4M3,
        F8E5M2 => DataType::F8E5M2,
        _ => panic!("{t} is no ncclDataType_t"),
    }
}

fn unsigned(t: c_int) -> bool {
    matches!(int(t), Some((_, false)))
}

/// Whether `t` is an integer type; its bits and signedness.
fn int(t: c_int) -> Option<(u32, bool)> {
    match codec::format(dtype(t)) {
        codec::Format::Int { bits, signed } => Some((bits, signed)),
        codec::Format::Float(_) => None,
    }
}

/// The format of floating type `t`.
fn float(t: c_int) -> Float {
    codec::float(dtype(t)).unwrap_or_else(|| panic!("type {t} is not a floating type"))
}

fn is_fp8(t: c_int) -> bool {
    t == F8E4M3 || t == F8E5M2
}

/// `x` wrapped into integer type `t` (modulo 2^bits, in the type's range).
fn wrap(t: c_int, x: i128) -> i128 {
    let (bits, signed) = int(t).expect("an integer type");
    codec::int_value(codec::wrap(x, bits), bits, signed)
}

/// Element `i` of part `part` of rank `rank` for operator `op` on type `t`: an integer in
/// [-9, 26] (unsigned types: in [0, 30]; fp8: in [-1, 1]; products: in {-1, 1, 2}, unsigned
/// types {1, 2, 3}).
pub fn value_for(t: c_int, op: Op, rank: usize, part: usize, i: usize) -> f64 {
    let h = (rank * 7919 + part * 104_729 + i * 31 + (i * i) % 17) % 31;
    if op == Op::Builtin(PROD) {
        let first = if unsigned(t) { 3.0 } else { -1.0 };
        return [first, 1.0, 2.0, 1.0, 1.0][h % 5];
    }
    if is_fp8(t) {
        return h as f64 % 3.0 - 1.0;
    }
    if unsigned(t) {
        return h as f64;
    }
    h as f64
        - if (rank + i).is_multiple_of(3) {
            9.0
        } else {
            0.0
        }
}

/// The value of moved data (no operator) of type `t`, as the type holds it.
pub fn moved(t: c_int, rank: usize, part: usize, i: usize) -> f64 {
    stored(t, value_for(t, Op::Builtin(SUM), rank, part, i))
}

/// [`moved`] for the signed types whose data is in [-9, 26] (every one but the unsigned and
/// fp8 types).
pub fn value(rank: usize, part: usize, i: usize) -> f64 {
    value_for(F32, Op::Builtin(SUM), rank, part, i)
}

/// `v` as type `t` holds it (integers wrapped; floats as they are, exact here).
pub fn stored(t: c_int, v: f64) -> f64 {
    match int(t) {
        Some(_) => wrap(t, v as i128) as f64,
        None => v,
    }
}

/// `x` rounded to floating type `t` (to nearest, ties to even).
pub fn round_to(t: c_int, x: f64) -> f64 {
    float(t).rounded(x)
}

/// The bytes of `v` (exactly representable, or an integer already wrapped) in type `t`.
pub fn encode(t: c_int, v: f64) -> Vec<u8> {
    let b = codec::encode(dtype(t), v);
    if int(t).is_none() && t != F32 {
        assert_eq!(
            codec::decode(dtype(t), &b),
            v,
            "{v} is not exact in type {t}"
        );
    }
    b
}

/// The value of the bytes `b` of type `t`.
pub fn decode(t: c_int, b: &[u8]) -> f64 {
    codec::decode(dtype(t), b)
}

/// `count` elements of part `part` of rank `rank` for `op` in type `t`.
pub fn bytes_for(t: c_int, op: Op, rank: usize, part: usize, count: usize) -> Vec<u8> {
    (0..count)
        .flat_map(|i| encode(t, stored(t, value_for(t, op, rank, part, i))))
        .collect()
}

/// `count` elements of moved data (no operator).
pub fn bytes(t: c_int, rank: usize, part: usize, count: usize) -> Vec<u8> {
    bytes_for(t, Op::Builtin(SUM), rank, part, count)
}

/// [`expected`] of a built-in operator whose result is exact.
pub fn reduced(t: c_int, op: c_int, n: usize, part: usize, i: usize) -> f64 {
    let (v, tol) = expected(t, Op::Builtin(op), n, part, i);
    assert_eq!(tol, 0.0, "an inexact reference");
    v
}

/// The reduction by `op` of element `i` of part `part` over `n` ranks, as type `t` holds it,
/// and the tolerance it is compared with (module docs).
pub fn expected(t: c_int, op: Op, n: usize, part: usize, i: usize) -> (f64, f64) {
    let xs: Vec<f64> = (0..n)
        .map(|r| stored(t, value_for(t, op, r, part, i)))
        .collect();
    if int(t).is_some() {
        let v: Vec<i128> = xs.iter().map(|&x| x as i128).collect();
        let sum = wrap(t, v.iter().sum());
        let r = match op {
            Op::Builtin(SUM) => sum,
            Op::Builtin(PROD) => v.iter().fold(1, |a, &x| wrap(t, a * x)),
            Op::Builtin(MAX) => *v.iter().max().expect("ranks"),
            Op::Builtin(MIN) => *v.iter().min().expect("ranks"),
            Op::Builtin(AVG) => sum / n as i128,
            Op::PreMulHost | Op::PreMulDevice => wrap(t, sum * scalar(t, op) as i128),
            Op::Builtin(o) => panic!("operator {o}"),
        };
        return (r as f64, 0.0);
    }
    let r = match op {
        Op::Builtin(SUM) => xs.iter().sum(),
        Op::Builtin(PROD) => xs.iter().product(),
        Op::Builtin(MAX) => xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        Op::Builtin(MIN) => xs.iter().copied().fold(f64::INFINITY, f64::min),
        Op::Builtin(AVG) => {
            let s = round_to(t, 1.0 / n as f64);
            let want = xs.iter().map(|x| x * s).sum::<f64>();
            let tol = if n.is_power_of_two() {
                0.0
            } else {
                let eps = 2f64.powi(-(float(t).mantissa_bits as i32));
                n as f64 * eps * xs.iter().map(|x| (x * s).abs()).sum::<f64>()
            };
            return (want, tol);
        }
        Op::PreMulHost | Op::PreMulDevice => xs.iter().map(|x| x * scalar(t, op)).sum(),
        Op::Builtin(o) => panic!("operator {o}"),
    };
    (r, 0.0)
}

/// Checks `got` (type `t`) against `want` (value, tolerance), element by element.
#[track_caller]
pub fn check_within(t: c_int, got: &[u8], want: &[(f64, f64)], what: &str) {
    let es = got.len() / want.len().max(1);
    assert_eq!(got.len(), want.len() * es, "{what}: length");
    for (i, &(w, tol)) in want.iter().enumerate() {
        let g = decode(t, &got[i * es..(i + 1) * es]);
        assert!(
            (g - w).abs() <= tol,
            "{what}: element {i} of {} is {g}, not {w} (tolerance {tol})",
            want.len()
        );
    }
}

/// Checks `got` (type `t`) against `want` exactly, element by element.
#[track_caller]
pub fn check(t: c_int, got: &[u8], want: &[f64], what: &str) {
    let w: Vec<(f64, f64)> = want.iter().map(|&v| (v, 0.0)).collect();
    check_within(t, got, &w, what);
}

/// A host buffer of `bytes` filled with the marker 0xa5 (what a call must overwrite).
pub fn marked(bytes: usize) -> Vec<u8> {
    vec![0xa5; bytes]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_round_trip_and_match_known_bits() {
        for (t, _) in TYPES {
            for v in [-9.0f64, -1.0, 0.0, 1.0, 2.0, 0.125, 26.0, 208.0] {
                if (is_fp8(t) && v.abs() > 2.0)
                    || (int(t).is_some() && v.fract() != 0.0)
                    || (unsigned(t) && v < 0.0)
                {
                    continue;
                }
                let v = stored(t, v);
                assert_eq!(decode(t, &encode(t, v)), v, "type {t} value {v}");
            }
        }
        assert_eq!(encode(F16, 1.0), 0x3c00u16.to_le_bytes());
        assert_eq!(encode(BF16, -2.0), 0xc000u16.to_le_bytes());
        assert_eq!(encode(F8E4M3, 1.0), [0x38]);
        assert_eq!(encode(F8E5M2, -1.0), [0xbc]);
        assert_eq!(encode(U8, stored(U8, -1.0)), [0xff]);
        assert_eq!(round_to(F16, 1.0 / 3.0), 1365.0 / 4096.0);
        assert_eq!(round_to(F8E4M3, 1.0 / 3.0), 0.34375);
        assert_eq!(round_to(F8E5M2, 1.0 / 3.0), 0.3125);
    }
}
