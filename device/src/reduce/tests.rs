//! Unit tests of the element-wise reduction: the conversions (exhaustively where the inputs are
//! few), and every type × operator on edge values, against values written out by hand or
//! computed another way.

use super::*;
use std::vec;
use std::vec::Vec;

/// Lanes of `dtype` (as their bits, little-endian) packed into one unit.
fn unit(dtype: DataType, lanes: &[u64]) -> [u32; 2] {
    let bits = dtype.size() * 8;
    assert_eq!(
        lanes.len() * bits,
        64,
        "{dtype:?}: a unit holds {} lanes",
        64 / bits
    );
    let mask = if bits == 64 {
        u64::MAX
    } else {
        (1 << bits) - 1
    };
    let x = lanes
        .iter()
        .enumerate()
        .fold(0u64, |acc, (k, &v)| acc | (v & mask) << (k * bits));
    [x as u32, (x >> 32) as u32]
}

/// The lanes of a unit.
fn lanes(dtype: DataType, w: [u32; 2]) -> Vec<u64> {
    let bits = dtype.size() * 8;
    let x = w[0] as u64 | (w[1] as u64) << 32;
    let mask = if bits == 64 {
        u64::MAX
    } else {
        (1 << bits) - 1
    };
    (0..64 / bits).map(|k| (x >> (k * bits)) & mask).collect()
}

/// `post(pre(a) ⊕ pre(b))` lane by lane, for lanes given as bits.
fn reduce2(r: Reducer, a: &[u64], b: &[u64]) -> Vec<u64> {
    let d = r.dtype;
    lanes(d, r.post(r.fold(r.pre(unit(d, a)), unit(d, b))))
}

fn plain(dtype: DataType, op: DeviceReduceOp) -> Reducer {
    Reducer::new(dtype, op, 0).expect("served")
}

use DeviceReduceOp::{Max, Min, PreMulSum, Prod, Sum, SumPostDiv};

#[test]
fn half_conversions_round_trip_and_round() {
    for h in 0..=u16::MAX {
        let f = f16_to_f32_soft(h);
        if f.is_nan() {
            assert!(f32_to_f16_soft(f) & 0x7c00 == 0x7c00);
        } else {
            assert_eq!(f32_to_f16_soft(f), h, "{h:#x} -> {f}");
        }
    }
    assert_eq!(f32_to_f16_soft(1.0), 0x3c00);
    assert_eq!(f32_to_f16_soft(65520.0), 0x7c00); // rounds to infinity
    assert_eq!(f32_to_f16_soft(1.0 + 1.0 / 2048.0), 0x3c00); // tie to even
    assert_eq!(f32_to_bf16(1.0), 0x3f80);
    assert_eq!(bf16_to_f32(0x4040), 3.0);
}

/// A half code's value from the format's definition (1 sign, 5 exponent bits of bias 15, 10
/// mantissa bits), in f64; codes 0..=0x7bff are the finite non-negative ones.
fn half_reference(code: u16) -> f64 {
    let (exp, man) = (i32::from(code >> 10 & 0x1f), f64::from(code & 0x3ff));
    if exp == 0 {
        man * 2f64.powi(-24)
    } else {
        (1024.0 + man) * 2f64.powi(exp - 25)
    }
}

/// The half nearest to `x` (not NaN), ties to the even code; past the midpoint between the
/// largest finite half and 2^16, infinity.
fn half_nearest(x: f64, values: &[f64]) -> u16 {
    let sign = if x.is_sign_negative() { 0x8000 } else { 0 };
    let a = x.abs();
    if a >= 65520.0 {
        return sign | 0x7c00;
    }
    // values[k] <= a < values[k + 1]
    let k = values.partition_point(|&v| v <= a) - 1;
    let (below, above) = (a - values[k], values[k + 1] - a);
    let code = if below < above || (below == above && k % 2 == 0) {
        k
    } else {
        k + 1
    };
    sign | code as u16
}

#[test]
fn floats_round_to_the_nearest_half() {
    // Every finite half, then 2^16 (where rounding up from the largest one leads).
    let mut values: Vec<f64> = (0..=0x7bffu16).map(half_reference).collect();
    values.push(65536.0);
    // Floats at, just above and just below every half and every midpoint (subnormals,
    // normals, the underflow to zero and the overflow to infinity), and hashed ones.
    let mut xs = Vec::new();
    for k in 0..values.len() - 1 {
        let (v, next) = (values[k] as f32, values[k + 1] as f32);
        for x in [v, (v + next) / 2.0, next, v / 2.0] {
            xs.extend([
                x,
                f32::from_bits(x.to_bits() + 1),
                f32::from_bits(x.to_bits().max(1) - 1),
            ]);
        }
    }
    let mut s = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..200_000 {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        xs.push(f32::from_bits(s as u32));
    }
    xs.extend([
        f32::MAX,
        f32::INFINITY,
        f32::MIN_POSITIVE,
        2f32.powi(-25),
        2f32.powi(-26),
    ]);
    for &x in &xs {
        for x in [x, -x] {
            if x.is_nan() {
                continue;
            }
            assert_eq!(
                f32_to_f16_soft(x),
                half_nearest(f64::from(x), &values),
                "{x:e} ({:#x})",
                x.to_bits()
            );
        }
    }
    // A NaN stays a NaN of the same sign (quiet: its payload may not fit).
    for nan in [
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7f80_0001),
        f32::from_bits(0xffbf_ffff),
    ] {
        let h = f32_to_f16_soft(nan);
        assert!(h & 0x7fff > 0x7c00, "{:#x} -> {h:#x}", nan.to_bits());
        assert_eq!(h & 0x8000 != 0, nan.is_sign_negative());
    }
}

#[test]
fn bfloat16_keeps_nans_and_rounds_to_nearest_even() {
    for nan in [
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7f80_0001),
        f32::from_bits(0xffc1_2345),
    ] {
        let b = f32_to_bf16(nan);
        assert!(b & 0x7fff > 0x7f80, "{:#x} -> {b:#x}", nan.to_bits());
        assert_eq!(b & 0x8000 != 0, nan.is_sign_negative());
        assert!(bf16_to_f32(b).is_nan());
    }
    // The payload's high bits are kept.
    assert_eq!(f32_to_bf16(f32::from_bits(0x7fd5_0000)), 0x7fd5);
    assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80); // tie: even
    assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82); // tie: even
    assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
    assert_eq!(f32_to_bf16(f32::from_bits(0xbf80_7fff)), 0xbf80);
    assert_eq!(f32_to_bf16(f32::MAX), 0x7f80); // rounds to infinity
    assert_eq!(f32_to_bf16(f32::NEG_INFINITY), 0xff80);
}

/// (format, exponent bits, mantissa bits, bias) of both fp8 formats.
const FP8: [(Fp8, u32, u32, i32); 2] = [(Fp8::E4M3, 4, 3, 7), (Fp8::E5M2, 5, 2, 15)];

/// An fp8 code's value computed from the format's definition in f64 (`None`: NaN).
fn fp8_reference(code: u8, f: Fp8) -> Option<f64> {
    let (_, e_bits, m_bits, bias) = FP8.iter().copied().find(|x| x.0 == f).unwrap();
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((code >> m_bits) & ((1 << e_bits) - 1)) as i32;
    let m = (code & ((1 << m_bits) - 1)) as f64 / (1 << m_bits) as f64;
    let all_ones = e == (1 << e_bits) - 1;
    match f {
        Fp8::E4M3 if all_ones && m == 0.875 => None,
        Fp8::E5M2 if all_ones && m != 0.0 => None,
        Fp8::E5M2 if all_ones => Some(sign * f64::INFINITY),
        _ if e == 0 => Some(sign * m * 2f64.powi(1 - bias)),
        _ => Some(sign * (1.0 + m) * 2f64.powi(e - bias)),
    }
}

#[test]
fn fp8_decodes_every_code() {
    for (f, ..) in FP8 {
        for code in 0..=255u8 {
            let got = fp8_to_f32(code, f);
            match fp8_reference(code, f) {
                None => {
                    assert!(got.is_nan() && f.is_nan(code), "{f:?} {code:#x}");
                    assert_eq!(fp8_to_f16_soft(code, f), 0x7fff);
                }
                Some(v) => {
                    assert!(!f.is_nan(code));
                    assert_eq!(got.to_bits(), (v as f32).to_bits(), "{f:?} {code:#x}");
                    let h = fp8_to_f16_soft(code, f);
                    assert_eq!(
                        f16_to_f32_soft(h).to_bits(),
                        got.to_bits(),
                        "{f:?} {code:#x}"
                    );
                }
            }
        }
    }
    // A few by hand.
    assert_eq!(fp8_to_f32(0x7e, Fp8::E4M3), 448.0);
    assert_eq!(fp8_to_f32(0x38, Fp8::E4M3), 1.0);
    assert_eq!(fp8_to_f32(0x01, Fp8::E4M3), 2f32.powi(-9));
    assert_eq!(fp8_to_f32(0x08, Fp8::E4M3), 2f32.powi(-6));
    assert_eq!(fp8_to_f32(0xfe, Fp8::E4M3), -448.0);
    assert_eq!(fp8_to_f32(0x7b, Fp8::E5M2), 57344.0);
    assert_eq!(fp8_to_f32(0x3c, Fp8::E5M2), 1.0);
    assert_eq!(fp8_to_f32(0x01, Fp8::E5M2), 2f32.powi(-16));
    assert_eq!(fp8_to_f32(0x7c, Fp8::E5M2), f32::INFINITY);
    assert_eq!(fp8_to_f32(0x80, Fp8::E5M2).to_bits(), (-0.0f32).to_bits());
}

/// The values of the finite non-negative codes `0..=max_code`, in code order (increasing).
fn finite_values(f: Fp8) -> Vec<f64> {
    (0..=f.max_code())
        .map(|c| fp8_reference(c, f).unwrap())
        .collect()
}

/// What `cvt.rn.satfinite` must give for `x`, found by brute force over `values`
/// ([`finite_values`]): the finite code of `x`'s sign nearest to it, ties to the even code
/// (beyond the largest finite, infinities included: that one); NaN to 0x7f.
fn fp8_nearest(x: f64, values: &[f64]) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let max = values.len() as u8 - 1;
    if x.abs() > values[max as usize] {
        return sign | max;
    }
    let mut best = (f64::INFINITY, 0u8);
    for (c, &v) in values.iter().enumerate() {
        let d = (x.abs() - v).abs();
        if d < best.0 || (d == best.0 && c & 1 == 0) {
            best = (d, c as u8);
        } else if v > x.abs() {
            break; // increasing values: only farther ones follow
        }
    }
    sign | best.1
}

#[test]
fn fp8_encodes_every_half_to_the_nearest_finite_value() {
    for (f, ..) in FP8 {
        let values = finite_values(f);
        for h in 0..=u16::MAX {
            let x = f16_to_f32_soft(h) as f64;
            assert_eq!(
                f16_to_fp8_soft(h, f),
                fp8_nearest(x, &values),
                "{f:?} half {h:#x} = {x}"
            );
        }
    }
}

#[test]
fn fp8_encodes_floats_to_the_nearest_finite_value() {
    // Floats around every code and midpoint (exact, just above, just below), and a spread of
    // hashed ones over the whole range.
    let mut xs = Vec::new();
    for (f, ..) in FP8 {
        for c in 0..=f.max_code() {
            let v = fp8_reference(c, f).unwrap() as f32;
            let next = fp8_reference(c + 1, f).map_or(v * 2.0, |n| n as f32);
            let mid = (v + next) / 2.0;
            for x in [v, mid, next] {
                xs.extend([
                    x,
                    f32::from_bits(x.to_bits() + 1),
                    f32::from_bits(x.to_bits().max(1) - 1),
                ]);
            }
        }
    }
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..200_000 {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        xs.push(f32::from_bits(s as u32));
    }
    for (f, ..) in FP8 {
        let values = finite_values(f);
        for &x in &xs {
            for x in [x, -x] {
                assert_eq!(
                    f32_to_fp8(x, f),
                    fp8_nearest(x as f64, &values),
                    "{f:?} {x:e}"
                );
            }
        }
    }
}

#[test]
fn fp8_rounding_and_saturation_by_hand() {
    let e4 = |x: f32| f32_to_fp8(x, Fp8::E4M3);
    let e5 = |x: f32| f32_to_fp8(x, Fp8::E5M2);
    assert_eq!(e4(448.0), 0x7e);
    assert_eq!(e4(464.0), 0x7e); // the midpoint to the (NaN) code above: even, 448
    assert_eq!(e4(464.5), 0x7e); // would round to the NaN code: saturates
    assert_eq!(e4(1e30), 0x7e);
    assert_eq!(e4(f32::INFINITY), 0x7e);
    assert_eq!(e4(f32::NEG_INFINITY), 0xfe);
    assert_eq!(e4(f32::NAN), 0x7f);
    assert_eq!(e4(-f32::NAN), 0x7f);
    assert_eq!(e4(2f32.powi(-10)), 0x00); // half the smallest subnormal: ties to zero
    assert_eq!(e4(2f32.powi(-10) * 1.001), 0x01);
    assert_eq!(e4(-2f32.powi(-11)), 0x80); // a negative zero
    assert_eq!(e4(1.0625), 0x38); // 1 + 1/16: tie between 1.0 (0x38) and 1.125 (0x39)
    assert_eq!(e4(1.1875), 0x3a); // tie between 0x39 and 0x3a
    assert_eq!(e5(57344.0), 0x7b);
    assert_eq!(e5(61440.0), 0x7b); // rounds to infinity without saturation
    assert_eq!(e5(f32::INFINITY), 0x7b);
    assert_eq!(e5(-1e10), 0xfb);
    assert_eq!(e5(f32::NAN), 0x7f);
    assert_eq!(e5(2f32.powi(-17)), 0x00);
    assert_eq!(e5(1.125), 0x3c); // tie between 1.0 and 1.25: even
}

#[test]
fn reciprocal_division_is_exact() {
    let mut xs = vec![0, 1, 2, 3, 7, 255, 256, 1 << 31, u32::MAX as u64, 1 << 63];
    xs.extend([u64::MAX, u64::MAX - 1, (1 << 63) - 1, (1 << 63) + 1]);
    let mut s = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..2000 {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        xs.push(s);
        xs.push(s >> 32);
        xs.push(s >> 56);
    }
    for d in 1..=1024u64 {
        let recip = u64::MAX / d;
        for &x in xs.iter().chain(&[d - 1, d, d + 1, 3 * d - 1, 3 * d]) {
            assert_eq!(div_u64(x, d, recip), x / d, "{x} / {d}");
        }
    }
}

#[test]
fn integers_wrap_and_compare_by_sign() {
    use DataType::*;
    let r = plain;
    // 8 lanes of 8 bits: sums and products wrap, min/max by sign.
    let a = [250, 127, 0x80, 0xff, 1, 2, 3, 4];
    let b = [10, 1, 0xff, 1, 0xff, 0x80, 5, 0];
    assert_eq!(
        reduce2(r(U8, Sum), &a, &b),
        [4, 128, 0x7f, 0, 0, 0x82, 8, 4]
    );
    assert_eq!(
        reduce2(r(I8, Sum), &a, &b),
        [4, 0x80, 0x7f, 0, 0, 0x82, 8, 4]
    );
    assert_eq!(
        reduce2(r(U8, Prod), &a, &b),
        [0xc4, 127, 0x80, 0xff, 0xff, 0, 15, 0]
    );
    assert_eq!(
        reduce2(r(I8, Prod), &a, &b),
        [0xc4, 127, 0x80, 0xff, 0xff, 0, 15, 0]
    );
    assert_eq!(reduce2(r(U8, Min), &a, &b), [10, 1, 0x80, 1, 1, 2, 3, 0]);
    assert_eq!(
        reduce2(r(I8, Min), &a, &b),
        [250, 1, 0x80, 0xff, 0xff, 0x80, 3, 0]
    );
    assert_eq!(
        reduce2(r(U8, Max), &a, &b),
        [250, 127, 0xff, 0xff, 0xff, 0x80, 5, 4]
    );
    assert_eq!(reduce2(r(I8, Max), &a, &b), [10, 127, 0xff, 1, 1, 2, 5, 4]);
    // 32 bits.
    let (max, min) = (i32::MAX as u32 as u64, i32::MIN as u32 as u64);
    assert_eq!(
        reduce2(r(I32, Sum), &[max, 5], &[1, u32::MAX as u64]),
        [min, 4]
    );
    assert_eq!(
        reduce2(r(U32, Sum), &[u32::MAX as u64, 5], &[2, 7]),
        [1, 12]
    );
    assert_eq!(
        reduce2(r(U32, Prod), &[0x1_0001, 3], &[0x1_0001, 5]),
        [0x2_0001, 15]
    );
    assert_eq!(
        reduce2(r(I32, Min), &[min, 1], &[0, u32::MAX as u64]),
        [min, u32::MAX as u64]
    );
    assert_eq!(
        reduce2(r(U32, Min), &[min, 1], &[0, u32::MAX as u64]),
        [0, 1]
    );
    assert_eq!(
        reduce2(r(I32, Max), &[min, 1], &[0, u32::MAX as u64]),
        [0, 1]
    );
    // 64 bits.
    assert_eq!(reduce2(r(U64, Sum), &[u64::MAX], &[2]), [1]);
    assert_eq!(
        reduce2(r(I64, Sum), &[i64::MAX as u64], &[1]),
        [i64::MIN as u64]
    );
    assert_eq!(
        reduce2(r(U64, Prod), &[1 << 32 | 1], &[1 << 32 | 1]),
        [(1 << 33) | 1]
    );
    assert_eq!(
        reduce2(r(I64, Min), &[i64::MIN as u64], &[0]),
        [i64::MIN as u64]
    );
    assert_eq!(reduce2(r(U64, Min), &[i64::MIN as u64], &[0]), [0]);
    assert_eq!(reduce2(r(I64, Max), &[u64::MAX], &[0]), [0]);
    assert_eq!(reduce2(r(U64, Max), &[u64::MAX], &[0]), [u64::MAX]);
}

#[test]
fn integer_averages_divide_once_truncating_toward_zero() {
    use DataType::*;
    let avg = |d: DataType, n: u64| Reducer::new(d, SumPostDiv, n).unwrap();
    // The sum wraps in the type first (as NCCL's does), then divides.
    let neg = |v: i64| v as u64;
    assert_eq!(
        reduce2(
            avg(I8, 2),
            &[100, neg(-7) & 0xff, 7, 0x80, 1, 0, 0, 0],
            &[100, 0, 0, 0, 0, 0, 0, 0]
        ),
        [
            neg(-28) & 0xff,
            neg(-3) & 0xff,
            3,
            neg(-64) & 0xff,
            0,
            0,
            0,
            0
        ]
    );
    assert_eq!(
        reduce2(
            avg(U8, 3),
            &[255, 200, 2, 0, 0, 0, 0, 0],
            &[0, 100, 0, 0, 0, 0, 0, 0]
        ),
        [85, 14, 0, 0, 0, 0, 0, 0] // (200 + 100) mod 256 = 44, / 3
    );
    assert_eq!(
        reduce2(avg(I32, 3), &[neg(-128) & 0xffff_ffff, 9], &[0, 0]),
        [neg(-42) & 0xffff_ffff, 3]
    );
    assert_eq!(
        reduce2(avg(U32, 7), &[u32::MAX as u64, 6], &[0, 0]),
        [613566756, 0]
    );
    assert_eq!(
        reduce2(avg(I64, 3), &[i64::MIN as u64], &[0]),
        [neg(i64::MIN / 3)]
    );
    assert_eq!(reduce2(avg(I64, 2), &[neg(-5)], &[0]), [neg(-2)]);
    assert_eq!(reduce2(avg(U64, 8), &[u64::MAX], &[0]), [u64::MAX / 8]);
    // No division for floats.
    assert_eq!(Reducer::new(F32, SumPostDiv, 2), None);
    assert_eq!(Reducer::new(F8E4M3, SumPostDiv, 2), None);
}

/// The bits of an f32 / f64, for the float cases.
fn b32(x: f32) -> u64 {
    x.to_bits() as u64
}
fn b64(x: f64) -> u64 {
    x.to_bits()
}

#[test]
fn wide_floats_follow_nccl_on_nan_zero_and_infinity() {
    use DataType::*;
    let (nan, inf) = (f32::NAN, f32::INFINITY);
    let f = |op| plain(F32, op);
    assert_eq!(
        reduce2(f(Sum), &[b32(1.5), b32(1e-45)], &[b32(2.25), b32(1e-45)]),
        [b32(3.75), b32(3e-45)]
    );
    assert!(f32::from_bits(reduce2(f(Sum), &[b32(inf), 0], &[b32(-inf), 0])[0] as u32).is_nan());
    assert_eq!(
        reduce2(f(Prod), &[b32(1e38), b32(-3.0)], &[b32(10.0), b32(0.5)]),
        [b32(inf), b32(-1.5)]
    );
    assert_eq!(
        reduce2(f(Min), &[b32(nan), b32(1.0)], &[b32(1.0), b32(nan)]),
        [b32(1.0), b32(1.0)]
    );
    assert_eq!(
        reduce2(f(Max), &[b32(nan), b32(-inf)], &[b32(-2.0), b32(nan)]),
        [b32(-2.0), b32(-inf)]
    );
    assert_eq!(
        reduce2(f(Max), &[b32(nan), 0], &[b32(nan), 0])[0],
        0x7fff_ffff
    );
    assert_eq!(
        reduce2(f(Min), &[b32(-0.0), b32(0.0)], &[b32(0.0), b32(-0.0)]),
        [b32(-0.0), b32(-0.0)]
    );
    assert_eq!(
        reduce2(f(Max), &[b32(-0.0), b32(0.0)], &[b32(0.0), b32(-0.0)]),
        [b32(0.0), b32(0.0)]
    );
    let d = |op| plain(F64, op);
    assert_eq!(reduce2(d(Sum), &[b64(0.1)], &[b64(0.2)]), [b64(0.1 + 0.2)]);
    assert_eq!(
        reduce2(d(Prod), &[b64(1e300)], &[b64(1e10)]),
        [b64(f64::INFINITY)]
    );
    assert_eq!(reduce2(d(Min), &[b64(f64::NAN)], &[b64(-1.0)]), [b64(-1.0)]);
    assert_eq!(reduce2(d(Max), &[b64(5e-324)], &[b64(-0.0)]), [b64(5e-324)]);
    assert_eq!(reduce2(d(Min), &[b64(0.0)], &[b64(-0.0)]), [b64(-0.0)]);
    assert_eq!(reduce2(d(Min), &[b64(-0.0)], &[b64(0.0)]), [b64(-0.0)]);
    assert_eq!(reduce2(d(Max), &[b64(-0.0)], &[b64(0.0)]), [b64(0.0)]);
    // Ordinary values, the smaller first and second (each comparison decides once).
    let (lo, hi) = (&[b32(1.0), b32(-5.0)], &[b32(2.0), b32(-3.0)]);
    assert_eq!(reduce2(f(Min), lo, hi), [b32(1.0), b32(-5.0)]);
    assert_eq!(reduce2(f(Min), hi, lo), [b32(1.0), b32(-5.0)]);
    assert_eq!(reduce2(f(Max), lo, hi), [b32(2.0), b32(-3.0)]);
    assert_eq!(reduce2(f(Max), hi, lo), [b32(2.0), b32(-3.0)]);
    for (a, b) in [(-7.5, 3.25), (3.25, -7.5)] {
        assert_eq!(reduce2(d(Min), &[b64(a)], &[b64(b)]), [b64(-7.5)]);
        assert_eq!(reduce2(d(Max), &[b64(a)], &[b64(b)]), [b64(3.25)]);
    }
}

#[test]
fn half_floats_round_in_the_type() {
    use DataType::*;
    let h = |x: f32| f32_to_f16_soft(x) as u64;
    let f = |op| plain(F16, op);
    // Subnormals add exactly; the largest half plus a little stays, plus more overflows.
    assert_eq!(
        reduce2(
            f(Sum),
            &[1, h(65504.0), h(65504.0), h(1.0)],
            &[1, h(8.0), h(32.0), h(1.0 / 2048.0)]
        ),
        [2, h(65504.0), 0x7c00, h(1.0)]
    );
    assert_eq!(
        reduce2(
            f(Prod),
            &[h(3.0), h(-0.5), h(256.0), h(1e-3)],
            &[h(5.0), h(3.0), h(256.0), h(1e-3)]
        ),
        [h(15.0), h(-1.5), 0x7c00, h(1e-6)]
    );
    assert_eq!(
        reduce2(
            f(Min),
            &[0x7e00, h(-0.0), h(2.0), 0x7e00],
            &[h(1.0), h(0.0), h(-3.0), 0x7e00]
        ),
        [h(1.0), h(-0.0), h(-3.0), 0x7fff]
    );
    assert_eq!(
        reduce2(
            f(Max),
            &[0x7e00, h(-0.0), h(2.0), 0xfc00],
            &[h(1.0), h(0.0), h(-3.0), 0x7e00]
        ),
        [h(1.0), h(0.0), h(2.0), 0xfc00]
    );
    let bf = |x: f32| f32_to_bf16(x) as u64;
    let g = |op| plain(BF16, op);
    assert_eq!(
        reduce2(
            g(Sum),
            &[bf(1.0), bf(4.0), bf(1.0), bf(-1.0)],
            &[bf(1.0 / 256.0), bf(-1.0), bf(3.0 / 256.0), bf(1.0)]
        ),
        [bf(1.0), bf(3.0), bf(1.015625), bf(0.0)]
    );
    assert_eq!(
        reduce2(
            g(Prod),
            &[bf(3.0), bf(1e38), bf(0.5), bf(-2.0)],
            &[bf(3.0), bf(10.0), bf(0.5), bf(2.0)]
        ),
        [bf(9.0), 0x7f80, bf(0.25), bf(-4.0)]
    );
    assert_eq!(
        reduce2(
            g(Min),
            &[0x7fc0, bf(2.0), bf(-0.0), 0x7fc0],
            &[bf(1.0), bf(-3.0), bf(0.0), 0x7fc0]
        ),
        [bf(1.0), bf(-3.0), bf(-0.0), 0x7fff]
    );
    assert_eq!(
        reduce2(
            g(Max),
            &[0x7fc0, bf(2.0), bf(-0.0), bf(1.0)],
            &[bf(1.0), bf(-3.0), bf(0.0), 0x7fc0]
        ),
        [bf(1.0), bf(2.0), bf(0.0), bf(1.0)]
    );
}

#[test]
fn fp8_reduces_through_half_and_saturates() {
    use DataType::*;
    let e4 = |x: f32| f32_to_fp8(x, Fp8::E4M3) as u64;
    let e5 = |x: f32| f32_to_fp8(x, Fp8::E5M2) as u64;
    let f = |op| plain(F8E4M3, op);
    let a = [
        e4(448.0),
        e4(1.0),
        0x7f,
        e4(-448.0),
        e4(2.0),
        e4(16.0),
        e4(0.0),
        e4(-0.0),
    ];
    let b = [
        e4(448.0),
        e4(0.0625),
        e4(1.0),
        e4(-448.0),
        0x7f,
        e4(32.0),
        e4(-0.0),
        e4(-0.0),
    ];
    assert_eq!(
        reduce2(f(Sum), &a, &b),
        [0x7e, e4(1.0), 0x7f, 0xfe, 0x7f, e4(48.0), e4(0.0), e4(-0.0)]
    );
    assert_eq!(
        reduce2(f(Prod), &a, &b),
        [0x7e, e4(0.0625), 0x7f, 0x7e, 0x7f, 0x7e, e4(-0.0), e4(0.0)]
    );
    assert_eq!(
        reduce2(f(Min), &a, &b),
        [
            0x7e,
            e4(0.0625),
            e4(1.0),
            0xfe,
            e4(2.0),
            e4(16.0),
            e4(-0.0),
            e4(-0.0)
        ]
    );
    assert_eq!(
        reduce2(f(Max), &a, &b),
        [
            0x7e,
            e4(1.0),
            e4(1.0),
            0xfe,
            e4(2.0),
            e4(32.0),
            e4(0.0),
            e4(-0.0)
        ]
    );
    let g = |op| plain(F8E5M2, op);
    let a = [
        e5(57344.0),
        0x7c,
        0x7c,
        0x7e,
        e5(1.0),
        e5(3.0),
        e5(2f32.powi(-16)),
        e5(-1.0),
    ];
    let b = [
        e5(57344.0),
        e5(1.0),
        0xfc,
        e5(1.0),
        e5(0.25),
        e5(0.5),
        e5(2f32.powi(-16)),
        e5(1.0),
    ];
    // Infinities saturate on the way back (cvt.rn.satfinite), whatever the operator; inf +
    // -inf is a NaN.
    assert_eq!(
        reduce2(g(Sum), &a, &b),
        [
            0x7b,
            0x7b,
            0x7f,
            0x7f,
            e5(1.25),
            e5(3.5),
            e5(2f32.powi(-15)),
            e5(0.0)
        ]
    );
    assert_eq!(
        reduce2(g(Min), &a, &b),
        [
            0x7b,
            e5(1.0),
            0xfb,
            e5(1.0),
            e5(0.25),
            e5(0.5),
            e5(2f32.powi(-16)),
            e5(-1.0)
        ]
    );
}

#[test]
fn pre_multiplied_sums_multiply_each_contribution_once_in_the_type() {
    use DataType::*;
    let pms = |d, s| Reducer::new(d, PreMulSum, s).unwrap();
    // f32: 0.5 * 3 + 0.5 * 5.
    assert_eq!(
        reduce2(
            pms(F32, b32(0.5)),
            &[b32(3.0), b32(-1.0)],
            &[b32(5.0), b32(1e-45)]
        ),
        [b32(4.0), b32(-0.5)]
    );
    assert_eq!(
        reduce2(pms(F64, b64(0.25)), &[b64(8.0)], &[b64(4.0)]),
        [b64(3.0)]
    );
    // f16 with NCCL's 1/3 (0x3555 = 0.33325): each product rounds to half.
    let h = |x: f32| f32_to_f16_soft(x) as u64;
    let third = h(1.0 / 3.0);
    assert_eq!(third, 0x3555);
    let prod =
        |x: u64| f32_to_f16_soft(f16_to_f32_soft(x as u16) * f16_to_f32_soft(third as u16)) as u64;
    let sum = |x: u64, y: u64| {
        f32_to_f16_soft(f16_to_f32_soft(x as u16) + f16_to_f32_soft(y as u16)) as u64
    };
    let (a, b) = (
        [h(3.0), h(1000.0), h(-6.0), h(0.1)],
        [h(3.0), h(7.0), h(6.0), h(0.2)],
    );
    let want: Vec<u64> = a
        .iter()
        .zip(&b)
        .map(|(&x, &y)| sum(prod(x), prod(y)))
        .collect();
    assert_eq!(reduce2(pms(F16, third), &a, &b), want);
    // bf16 scalar 2: exact doubling.
    let bf = |x: f32| f32_to_bf16(x) as u64;
    assert_eq!(
        reduce2(
            pms(BF16, bf(2.0)),
            &[bf(1.5), bf(-3.0), bf(0.0), bf(1e38)],
            &[bf(1.0), bf(1.0), bf(-0.0), bf(1e38)]
        ),
        [bf(5.0), bf(-4.0), bf(0.0), 0x7f80]
    );
    // e4m3 with NCCL's 1/3 (0.34375): 3 * 0.34375 = 1.03125 rounds to 1.0 in e4m3, twice.
    let e4 = |x: f32| f32_to_fp8(x, Fp8::E4M3) as u64;
    let s = e4(1.0 / 3.0);
    assert_eq!(fp8_to_f32(s as u8, Fp8::E4M3), 0.34375);
    assert_eq!(
        reduce2(
            pms(F8E4M3, s),
            &[e4(3.0), e4(448.0), 0, 0, 0, 0, 0, 0],
            &[e4(3.0), e4(448.0), 0, 0, 0, 0, 0, 0]
        ),
        [e4(2.0), e4(320.0), 0, 0, 0, 0, 0, 0]
    ); // 448 * 0.34375 = 154 -> 160; 160 + 160
    let e5 = |x: f32| f32_to_fp8(x, Fp8::E5M2) as u64;
    assert_eq!(
        reduce2(
            pms(F8E5M2, e5(4.0)),
            &[e5(57344.0), e5(0.5), 0, 0, 0, 0, 0, 0],
            &[e5(1.0), e5(0.5), 0, 0, 0, 0, 0, 0]
        ),
        [0x7b, e5(4.0), 0, 0, 0, 0, 0, 0]
    );
    // Integers wrap: i8 * 3, u64 * 2^63.
    // Every byte lane is multiplied (3 * x + 3 * y mod 256).
    let (a, b) = (
        [100, 0xff, 1, 2, 3, 4, 5, 0x80],
        [1, 1, 2, 3, 4, 5, 6, 0x80],
    );
    let want: Vec<u64> = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (3 * x + 3 * y) % 256)
        .collect();
    assert_eq!(reduce2(pms(I8, 3), &a, &b), want);
    assert_eq!(reduce2(pms(U8, 3), &a, &b), want);
    assert_eq!(reduce2(pms(U64, 1 << 63), &[3], &[1]), [0]);
    assert_eq!(
        reduce2(pms(I32, u32::MAX as u64), &[5, 1], &[6, 2]),
        [(-11i64 as u64) & 0xffff_ffff, (-3i64 as u64) & 0xffff_ffff]
    );
    // No pre-multiplication for the other operators.
    assert_eq!(
        plain(F32, Sum).pre(unit(F32, &[b32(3.0), b32(4.0)])),
        unit(F32, &[b32(3.0), b32(4.0)])
    );
}

#[test]
fn reducers_come_from_the_parameters() {
    let mut p = CollectiveParams {
        dtype: DataType::F32 as u32,
        op: PreMulSum as u32,
        scalar: b32(0.5),
        ..Default::default()
    };
    let r = Reducer::from_params(&p).unwrap();
    assert_eq!(r.pre([3.0f32.to_bits(), 0]), [1.5f32.to_bits(), 0]);
    // The scalar in memory wins over `scalar`, read byte by byte (here: unaligned).
    let mem = [0u8, 0, 0, 0x80, 0x40]; // 4.0f32 at offset 1
    p.scalar_ptr = mscclpp_shared::DevicePtr::from_addr(mem.as_ptr() as u64 + 1);
    let r = Reducer::from_params(&p).unwrap();
    assert_eq!(r.pre([3.0f32.to_bits(), 0]), [12.0f32.to_bits(), 0]);
    p.op = SumPostDiv as u32;
    assert_eq!(Reducer::from_params(&p), None); // floats never post-divide
    p.dtype = DataType::I32 as u32;
    p.scalar = 4;
    assert_eq!(Reducer::from_params(&p).unwrap().post([9, 0]), [2, 0]); // no pointer read
    p.dtype = 99;
    assert_eq!(Reducer::from_params(&p), None);
    p.dtype = 0;
    p.op = 17;
    assert_eq!(Reducer::from_params(&p), None);
    // Vectors are two units.
    let r = plain(DataType::U32, Sum);
    assert_eq!(r.fold_v4([1, 2, 3, 4], [10, 20, 30, 40]), [11, 22, 33, 44]);
    assert_eq!(CommonSum::COPY.pre_v4([1, 2, 3, 4]), [1, 2, 3, 4]);
    assert_eq!(CommonSum::COPY.post_v4([1, 2, 3, 4]), [1, 2, 3, 4]);
    // The common sums reduce alike inline and through the out-of-line path.
    for d in [DataType::F16, DataType::BF16, DataType::F32] {
        let (a, b) = ([0x3c00_4000, 0x3f80_0001], [0x4000_3c00, 0xbf80_4000]);
        let generic = split(combine_unit(plain(d, Sum), join(a), join(b)));
        assert_eq!(CommonSum(d).fold(a, b), generic, "{d:?}");
        assert_eq!(plain(d, Sum).fold(a, b), generic, "{d:?}");
    }
}
