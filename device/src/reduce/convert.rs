//! The conversions of the reduction: half, bfloat16 and fp8 to and from f32 (software, exact
//! where the value is representable, round to nearest even otherwise; fp8 as NVIDIA's
//! `cuda_fp8.hpp` emulation and `cvt.rn.satfinite`), and the fp8 pair conversions through the
//! GPU instructions where they exist (`crate::arch`). See the parent module's docs.

use crate::arch;
use mscclpp_shared::DataType;

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

/// The two 8-bit float formats (OCP FP8, as NVIDIA's `__nv_fp8_e4m3` / `__nv_fp8_e5m2`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Fp8 {
    /// 4 exponent bits (bias 7), 3 mantissa bits; no infinities, NaN `0x7f` / `0xff`, largest
    /// finite 448.
    E4M3,
    /// 5 exponent bits (bias 15), 2 mantissa bits; infinities `0x7c` / `0xfc`, NaN above them,
    /// largest finite 57344.
    E5M2,
}

impl Fp8 {
    /// Mantissa bits.
    #[inline(always)]
    const fn mantissa_bits(self) -> u32 {
        match self {
            Self::E4M3 => 3,
            Self::E5M2 => 2,
        }
    }

    /// Exponent bias.
    #[inline(always)]
    const fn bias(self) -> i32 {
        match self {
            Self::E4M3 => 7,
            Self::E5M2 => 15,
        }
    }

    /// The code of the largest finite value.
    #[inline(always)]
    pub const fn max_code(self) -> u8 {
        match self {
            Self::E4M3 => 0x7e,
            Self::E5M2 => 0x7b,
        }
    }

    /// Whether `code` is a NaN.
    #[inline(always)]
    pub const fn is_nan(self, code: u8) -> bool {
        match self {
            Self::E4M3 => code & 0x7f == 0x7f,
            Self::E5M2 => code & 0x7f > 0x7c,
        }
    }
}

/// 2^e as an f32 (`-149 <= e <= 127`), exactly.
#[inline(always)]
fn pow2(e: i32) -> f32 {
    if e >= -126 {
        f32::from_bits(((e + 127) as u32) << 23)
    } else {
        f32::from_bits(1 << (e + 149))
    }
}

/// An fp8 value as a float, exactly (NaN to a NaN, e5m2 infinities to infinities).
pub fn fp8_to_f32(code: u8, f: Fp8) -> f32 {
    let m_bits = f.mantissa_bits();
    let exp = ((code & 0x7f) >> m_bits) as i32;
    let man = (code & ((1 << m_bits) - 1)) as u32;
    let magnitude = if f.is_nan(code) {
        f32::NAN
    } else if f == Fp8::E5M2 && code & 0x7f == 0x7c {
        f32::INFINITY
    } else if exp == 0 {
        man as f32 * pow2(1 - f.bias() - m_bits as i32)
    } else {
        ((1 << m_bits) | man) as f32 * pow2(exp - f.bias() - m_bits as i32)
    };
    if code & 0x80 != 0 {
        -magnitude
    } else {
        magnitude
    }
}

/// A float to fp8, as `cvt.rn.satfinite`: round to nearest even; a magnitude that rounds
/// beyond the largest finite value (an infinity included) saturates to it; one below half the
/// smallest subnormal becomes a zero of the same sign; NaN becomes `0x7f`.
pub fn f32_to_fp8(x: f32, f: Fp8) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let abs = bits & 0x7fff_ffff;
    if abs > 0x7f80_0000 {
        return 0x7f;
    }
    let m_bits = f.mantissa_bits() as i32;
    // The smallest normal's exponent, and the quantum of the subnormals.
    let emin = 1 - f.bias();
    let sub_quantum = emin - m_bits;
    // abs = sig * 2^exp2; `lead` is the exponent of its leading bit (f32 subnormals are far
    // below every fp8 value and round to zero whatever `lead` says).
    let (sig, exp2, lead) = if abs >= 0x0080_0000 {
        let e = (abs >> 23) as i32;
        ((abs & 0x7f_ffff) | 0x80_0000, e - 150, e - 127)
    } else {
        (abs, -149, -127)
    };
    // The result is a whole number `k` of quanta 2^qexp.
    let qexp = lead.max(emin) - m_bits;
    let shift = qexp - exp2; // >= 1: a quantum is coarser than f32's last bit
    let k = if shift >= 26 {
        0 // below a quarter quantum
    } else {
        let s = shift as u32;
        let q = sig >> s;
        let rem = sig & ((1 << s) - 1);
        let half = 1 << (s - 1);
        if rem > half || (rem == half && q & 1 == 1) {
            q + 1
        } else {
            q
        }
    };
    // Codes are monotonic: `k` quanta at `qexp` is code `((qexp - sub_quantum) << m) + k`
    // (a carry into the next binade included); saturate at the largest finite value.
    let code = (((qexp - sub_quantum) as u32) << m_bits) + k;
    sign | code.min(f.max_code() as u32) as u8
}

/// An fp8 value as a half, exactly (NaN to `0x7fff`).
pub fn fp8_to_f16_soft(code: u8, f: Fp8) -> u16 {
    if f.is_nan(code) {
        0x7fff
    } else {
        f32_to_f16_soft(fp8_to_f32(code, f))
    }
}

/// A half to fp8, as `cvt.rn.satfinite` ([`f32_to_fp8`]; every half is exact in f32).
pub fn f16_to_fp8_soft(h: u16, f: Fp8) -> u8 {
    f32_to_fp8(f16_to_f32_soft(h), f)
}

/// Two fp8 (low byte first) to two halves (low half first): the software `cvt.rn.f16x2.*x2`.
pub fn fp8x2_to_f16x2_soft(v: u16, f: Fp8) -> u32 {
    fp8_to_f16_soft(v as u8, f) as u32 | (fp8_to_f16_soft((v >> 8) as u8, f) as u32) << 16
}

/// Two halves to two fp8: the software `cvt.rn.satfinite.*x2.f16x2`.
pub fn f16x2_to_fp8x2_soft(v: u32, f: Fp8) -> u16 {
    f16_to_fp8_soft(v as u16, f) as u16 | (f16_to_fp8_soft((v >> 16) as u16, f) as u16) << 8
}

/// The fp8 format of `dtype`, if it has one.
#[inline(always)]
pub const fn fp8_format(dtype: DataType) -> Option<Fp8> {
    match dtype {
        DataType::F8E4M3 => Some(Fp8::E4M3),
        DataType::F8E5M2 => Some(Fp8::E5M2),
        _ => None,
    }
}

/// Two fp8 to two halves (the GPU instruction where it exists).
#[inline(always)]
pub(super) fn widen(v: u16, f: Fp8) -> u32 {
    match f {
        Fp8::E4M3 => arch::cvt_f16x2_e4m3x2(v),
        Fp8::E5M2 => arch::cvt_f16x2_e5m2x2(v),
    }
}

/// Two halves to two fp8, saturating (the GPU instruction where it exists).
#[inline(always)]
pub(super) fn narrow(v: u32, f: Fp8) -> u16 {
    match f {
        Fp8::E4M3 => arch::cvt_rn_satfinite_e4m3x2_f16x2(v),
        Fp8::E5M2 => arch::cvt_rn_satfinite_e5m2x2_f16x2(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn powers_of_two_are_exact_over_the_whole_promised_range() {
        // The subnormal powers (below -126) included, which the fp8 decoders never ask for.
        for e in -149..=127 {
            assert_eq!(f64::from(pow2(e)), 2f64.powi(e), "2^{e}");
        }
    }

    #[test]
    fn only_the_fp8_data_types_have_an_fp8_format() {
        use DataType::*;
        assert_eq!(fp8_format(F8E4M3), Some(Fp8::E4M3));
        assert_eq!(fp8_format(F8E5M2), Some(Fp8::E5M2));
        for d in [F32, F16, BF16, I32, U32, I8, U8, I64, U64, F64] {
            assert_eq!(fp8_format(d), None, "{d:?}");
        }
    }
}
