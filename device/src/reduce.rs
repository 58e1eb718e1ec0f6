//! Element-wise reduction of 32-bit words holding one `f32`/`i32`/`u32` or two `f16`/`bf16`
//! lanes, for every `DataType` × `ReduceOp` of the collectives.

use crate::arch;
use mscclpp_shared::{DataType, ReduceOp};

/// Half to float in software (subnormals, infinities and NaN included).
pub fn f16_to_f32_soft(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = if exp == 0 {
        if man == 0 {
            sign
        } else {
            let mut e: u32 = 127 - 15 + 1;
            let mut m = man;
            while m & 0x400 == 0 {
                m <<= 1;
                e -= 1;
            }
            sign | (e << 23) | ((m & 0x3ff) << 13)
        }
    } else if exp == 31 {
        sign | 0x7f80_0000 | (man << 13)
    } else {
        sign | ((exp + 127 - 15) << 23) | (man << 13)
    };
    f32::from_bits(bits)
}

/// Float to half in software, round to nearest even.
pub fn f32_to_f16_soft(f: f32) -> u16 {
    let x = f.to_bits();
    let sign = ((x >> 16) & 0x8000) as u16;
    let exp = ((x >> 23) & 0xff) as i32;
    let man = x & 0x7f_ffff;
    if exp == 255 {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 31 {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let mut r = m >> shift;
        let rem = m & ((1 << shift) - 1);
        if rem > half || (rem == half && r & 1 == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (man >> 13);
    let rem = man & 0x1fff;
    if rem > 0x1000 || (rem == 0x1000 && r & 1 == 1) {
        r += 1;
    }
    sign | r as u16
}

/// bfloat16 to float.
#[inline(always)]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Float to bfloat16, round to nearest even (NaN stays NaN).
#[inline(always)]
pub fn f32_to_bf16(f: f32) -> u16 {
    let b = f.to_bits();
    if f.is_nan() {
        return ((b >> 16) as u16) | 0x40;
    }
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

#[inline(always)]
fn op_f32(a: f32, b: f32, op: ReduceOp) -> f32 {
    match op {
        ReduceOp::Sum => a + b,
        ReduceOp::Min => {
            if b < a {
                b
            } else {
                a
            }
        }
        ReduceOp::Max => {
            if b > a {
                b
            } else {
                a
            }
        }
    }
}

/// `op(a, b)` lane by lane, for words of `dtype`. Sums of f16 and bf16 pairs use the GPU's
/// packed adds (`add.rn.f16x2` / `add.rn.bf16x2`, correctly rounded); the soft path (the CPU
/// backend, min and max) rounds through f32, which can differ from them in the last bit when a
/// sum is not exact in f32 (operands more than 13 (f16) or 16 (bf16) binades apart).
#[inline(always)]
pub fn reduce_word(a: u32, b: u32, dtype: DataType, op: ReduceOp) -> u32 {
    match dtype {
        DataType::F32 => op_f32(f32::from_bits(a), f32::from_bits(b), op).to_bits(),
        DataType::I32 => {
            let (x, y) = (a as i32, b as i32);
            (match op {
                ReduceOp::Sum => x.wrapping_add(y),
                ReduceOp::Min => x.min(y),
                ReduceOp::Max => x.max(y),
            }) as u32
        }
        DataType::U32 => match op {
            ReduceOp::Sum => a.wrapping_add(b),
            ReduceOp::Min => a.min(b),
            ReduceOp::Max => a.max(b),
        },
        DataType::F16 => {
            if op == ReduceOp::Sum
                && let Some(r) = arch::add_f16x2(a, b)
            {
                return r;
            }
            let lane = |x: u32, y: u32| {
                let r = op_f32(arch::cvt_f32_f16(x as u16), arch::cvt_f32_f16(y as u16), op);
                arch::cvt_rn_f16_f32(r) as u32
            };
            lane(a & 0xffff, b & 0xffff) | (lane(a >> 16, b >> 16) << 16)
        }
        DataType::BF16 => {
            if op == ReduceOp::Sum
                && let Some(r) = arch::add_bf16x2(a, b)
            {
                return r;
            }
            let lane = |x: u32, y: u32| {
                let r = op_f32(bf16_to_f32(x as u16), bf16_to_f32(y as u16), op);
                f32_to_bf16(r) as u32
            };
            lane(a & 0xffff, b & 0xffff) | (lane(a >> 16, b >> 16) << 16)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn words_reduce_lane_by_lane() {
        let h = |x: f32| f32_to_f16_soft(x) as u32;
        let a = h(1.5) | (h(-2.0) << 16);
        let b = h(2.0) | (h(3.0) << 16);
        assert_eq!(
            reduce_word(a, b, DataType::F16, ReduceOp::Sum),
            h(3.5) | (h(1.0) << 16)
        );
        assert_eq!(
            reduce_word(a, b, DataType::F16, ReduceOp::Max),
            h(2.0) | (h(3.0) << 16)
        );
        assert_eq!(
            reduce_word(a, b, DataType::F16, ReduceOp::Min),
            h(1.5) | (h(-2.0) << 16)
        );
        assert_eq!(reduce_word(u32::MAX, 2, DataType::U32, ReduceOp::Sum), 1);
        assert_eq!(
            reduce_word(-5i32 as u32, 3, DataType::I32, ReduceOp::Min),
            -5i32 as u32
        );
        assert_eq!(
            reduce_word(
                1.5f32.to_bits(),
                2.25f32.to_bits(),
                DataType::F32,
                ReduceOp::Sum
            ),
            3.75f32.to_bits()
        );
        let bf = |x: f32| f32_to_bf16(x) as u32;
        assert_eq!(
            reduce_word(
                bf(1.0) | (bf(4.0) << 16),
                bf(2.0) | (bf(-1.0) << 16),
                DataType::BF16,
                ReduceOp::Sum
            ),
            bf(3.0) | (bf(3.0) << 16)
        );
    }
}
