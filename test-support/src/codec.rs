//! Elements of every NCCL data type (`DataType`: i8, u8, i32, u32, i64, u64, f16, bf16, f32,
//! f64, fp8 e4m3 and e5m2) to and from little-endian bytes, written from the formats'
//! definitions: the tests' host references and the tools' data checks decode through this,
//! never through the library's own conversions (`device/src/reduce/convert.rs`), so a wrong
//! conversion in the library cannot agree with its own check.
//!
//! Integers wrap: a value is stored modulo 2^bits (so -1 is an unsigned type's largest value),
//! as the kernels' arithmetic does. Floats round to nearest, ties to the even code; past the
//! largest finite value an IEEE format (f16, bf16, f32, f64, e5m2) gives an infinity, and
//! e4m3, which has none, its NaN (NVIDIA's non-saturating conversion). A NaN code decodes to
//! `f64::NAN`. i64 and u64 decode to the nearest `f64` (exact up to 2^53 in magnitude; use
//! [`int_value`] for every bit).

use mscclpp_shared::DataType;

/// How a type's bits hold a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Two's complement (`signed`) or unsigned, `bits` wide.
    Int {
        /// Width in bits.
        bits: u32,
        /// Two's complement.
        signed: bool,
    },
    /// A binary floating-point format.
    Float(Float),
}

/// A binary floating-point format: a sign bit, `exponent_bits`, `mantissa_bits` (the stored
/// fraction), and whether the all-ones exponent holds the infinities and NaNs (IEEE) or only
/// the NaN of an all-ones mantissa (e4m3, whose other all-ones-exponent codes are finite).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Float {
    /// Exponent field width.
    pub exponent_bits: u32,
    /// Stored fraction width.
    pub mantissa_bits: u32,
    /// Infinities and NaNs in the all-ones exponent (IEEE 754), else only one NaN per sign.
    pub ieee: bool,
}

impl Float {
    /// IEEE binary64.
    pub const F64: Self = Self::new(11, 52, true);
    /// IEEE binary32.
    pub const F32: Self = Self::new(8, 23, true);
    /// IEEE binary16.
    pub const F16: Self = Self::new(5, 10, true);
    /// bfloat16: binary32's exponent, 7 fraction bits.
    pub const BF16: Self = Self::new(8, 7, true);
    /// fp8 e4m3 (OCP FP8 "E4M3FN"): no infinity, NaN = all ones, largest 448.
    pub const E4M3: Self = Self::new(4, 3, false);
    /// fp8 e5m2: IEEE-like, largest 57344.
    pub const E5M2: Self = Self::new(5, 2, true);

    const fn new(exponent_bits: u32, mantissa_bits: u32, ieee: bool) -> Self {
        Self {
            exponent_bits,
            mantissa_bits,
            ieee,
        }
    }

    /// Width of a code in bits.
    pub fn width(self) -> u32 {
        1 + self.exponent_bits + self.mantissa_bits
    }

    /// The exponent bias.
    pub fn bias(self) -> i32 {
        (1 << (self.exponent_bits - 1)) - 1
    }

    /// The unit roundoff: half an ulp of 1, `2^-(mantissa_bits + 1)`.
    pub fn unit_roundoff(self) -> f64 {
        pow2(-(self.mantissa_bits as i32) - 1)
    }

    /// The smallest positive (subnormal) value.
    pub fn smallest_subnormal(self) -> f64 {
        pow2(1 - self.bias() - self.mantissa_bits as i32)
    }

    fn sign_bit(self) -> u64 {
        1 << (self.exponent_bits + self.mantissa_bits)
    }

    fn mantissa_mask(self) -> u64 {
        (1 << self.mantissa_bits) - 1
    }

    fn top_exponent(self) -> u64 {
        (1 << self.exponent_bits) - 1
    }

    /// The code of a NaN (positive; the quiet one of IEEE formats, e4m3's only one).
    pub fn nan(self) -> u64 {
        if self.ieee {
            self.top_exponent() << self.mantissa_bits | 1 << (self.mantissa_bits - 1)
        } else {
            self.top_exponent() << self.mantissa_bits | self.mantissa_mask()
        }
    }

    /// The value of `bits` (the low [`Float::width`] bits): `f64::NAN` for a NaN code.
    pub fn decode(self, bits: u64) -> f64 {
        if self == Self::F64 {
            return f64::from_bits(bits);
        }
        if self == Self::F32 {
            return f32::from_bits(bits as u32) as f64;
        }
        let m = bits & self.mantissa_mask();
        let e = (bits >> self.mantissa_bits) & self.top_exponent();
        let sign = if bits & self.sign_bit() != 0 {
            -1.0
        } else {
            1.0
        };
        if e == self.top_exponent() {
            if self.ieee {
                return if m == 0 {
                    sign * f64::INFINITY
                } else {
                    f64::NAN
                };
            }
            if m == self.mantissa_mask() {
                return f64::NAN;
            }
        }
        let mb = self.mantissa_bits as i32;
        let magnitude = if e == 0 {
            m as f64 * pow2(1 - self.bias() - mb)
        } else {
            (m | 1 << self.mantissa_bits) as f64 * pow2(e as i32 - self.bias() - mb)
        };
        sign * magnitude
    }

    /// The largest finite value.
    pub fn largest(self) -> f64 {
        let top = self.top_exponent() << self.mantissa_bits;
        self.decode(if self.ieee { top - 1 } else { self.nan() - 1 })
    }

    /// Whether `bits` is a NaN code.
    pub fn is_nan(self, bits: u64) -> bool {
        self.decode(bits).is_nan()
    }

    /// The code of `x` rounded to this format: to nearest, ties to the even code; past the
    /// largest finite value an infinity (IEEE) or the NaN (e4m3); a NaN gives [`Float::nan`].
    pub fn round(self, x: f64) -> u64 {
        if x.is_nan() {
            return self.nan();
        }
        let sign = if x.is_sign_negative() {
            self.sign_bit()
        } else {
            0
        };
        let a = x.abs();
        if a == 0.0 {
            return sign;
        }
        let overflow = sign
            | if self.ieee {
                self.top_exponent() << self.mantissa_bits
            } else {
                self.nan()
            };
        if a.is_infinite() {
            return overflow;
        }
        let mb = self.mantissa_bits as i32;
        let emin = 1 - self.bias();
        // The binade of `a` (the subnormal range counts as emin's), its quantum, and `a` in
        // quanta: power-of-two scaling, exact.
        let e = exponent_of(a).max(emin);
        let quanta = round_half_even(a / pow2(e - mb));
        let one = (1u64 << self.mantissa_bits) as f64;
        if quanta < one {
            // Subnormal (e == emin): the exponent field is 0.
            return sign | quanta as u64;
        }
        // `quanta` is in [2^mb, 2^(mb+1)]; the top rounds into the next binade.
        let (e, quanta) = if quanta >= 2.0 * one {
            (e + 1, one)
        } else {
            (e, quanta)
        };
        let field = (e + self.bias()) as u64;
        let m = quanta as u64 & self.mantissa_mask();
        let code = field << self.mantissa_bits | m;
        let too_big = if self.ieee {
            field >= self.top_exponent()
        } else {
            field > self.top_exponent()
                || (field == self.top_exponent() && m == self.mantissa_mask())
        };
        if too_big { overflow } else { sign | code }
    }

    /// `x` rounded to this format, as a value ([`Float::round`], then [`Float::decode`]).
    pub fn rounded(self, x: f64) -> f64 {
        self.decode(self.round(x))
    }

    /// The code of `±(1.m) · 2^exponent`, `m` the low [`Float::mantissa_bits`] of `mantissa`
    /// (`exponent` within the normal range: `1 - bias ..= bias`).
    pub fn compose(self, negative: bool, exponent: i32, mantissa: u64) -> u64 {
        let sign = if negative { self.sign_bit() } else { 0 };
        sign | ((exponent + self.bias()) as u64) << self.mantissa_bits
            | (mantissa & self.mantissa_mask())
    }
}

/// `2^k`, exact for every `k` an `f64` holds (subnormals included).
fn pow2(k: i32) -> f64 {
    if k >= -1022 {
        f64::from_bits(((k + 1023) as u64) << 52)
    } else {
        f64::from_bits(1u64 << (k + 1074))
    }
}

/// `floor(log2(a))` of a finite `a > 0`, from its bits (exact, unlike `log2`).
fn exponent_of(a: f64) -> i32 {
    let bits = a.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i32;
    if biased == 0 {
        let fraction = bits & ((1 << 52) - 1);
        -1074 + (63 - fraction.leading_zeros() as i32)
    } else {
        biased - 1023
    }
}

/// `k` rounded to an integer, ties to even (`k` non-negative, below 2^53).
fn round_half_even(k: f64) -> f64 {
    let f = k.floor();
    let d = k - f;
    if d > 0.5 || (d == 0.5 && f % 2.0 != 0.0) {
        f + 1.0
    } else {
        f
    }
}

/// How `d`'s bits hold a value.
pub fn format(d: DataType) -> Format {
    let int = |bits, signed| Format::Int { bits, signed };
    match d {
        DataType::F32 => Format::Float(Float::F32),
        DataType::F64 => Format::Float(Float::F64),
        DataType::F16 => Format::Float(Float::F16),
        DataType::BF16 => Format::Float(Float::BF16),
        DataType::F8E4M3 => Format::Float(Float::E4M3),
        DataType::F8E5M2 => Format::Float(Float::E5M2),
        DataType::I8 => int(8, true),
        DataType::U8 => int(8, false),
        DataType::I32 => int(32, true),
        DataType::U32 => int(32, false),
        DataType::I64 => int(64, true),
        DataType::U64 => int(64, false),
    }
}

/// The float format of `d`, `None` for an integer type.
pub fn float(d: DataType) -> Option<Float> {
    match format(d) {
        Format::Float(f) => Some(f),
        Format::Int { .. } => None,
    }
}

/// The unit roundoff of `d` (0 for integers, which are exact).
pub fn unit_roundoff(d: DataType) -> f64 {
    float(d).map_or(0.0, Float::unit_roundoff)
}

/// `v` modulo `2^bits`, as the low `bits` of a word.
pub fn wrap(v: i128, bits: u32) -> u64 {
    (v as u128 & ((1u128 << bits) - 1)) as u64
}

/// The integer the low `bits` of `word` hold (two's complement when `signed`).
pub fn int_value(word: u64, bits: u32, signed: bool) -> i128 {
    let v = word as u128 & ((1u128 << bits) - 1);
    if signed && v >> (bits - 1) == 1 {
        v as i128 - (1i128 << bits)
    } else {
        v as i128
    }
}

/// The code of `v` in `d`: an integer type wraps `v`'s integer part, a float type rounds
/// (module docs).
pub fn bits_of(d: DataType, v: f64) -> u64 {
    match format(d) {
        Format::Int { bits, .. } => wrap(v as i128, bits),
        Format::Float(f) => f.round(v),
    }
}

/// The value of the code `bits` of `d` (module docs).
pub fn value_of(d: DataType, bits: u64) -> f64 {
    match format(d) {
        Format::Int { bits: w, signed } => int_value(bits, w, signed) as f64,
        Format::Float(f) => f.decode(bits),
    }
}

/// Appends `v` as one element of `d` ([`bits_of`]), little-endian.
pub fn encode_into(d: DataType, v: f64, out: &mut Vec<u8>) {
    out.extend_from_slice(&bits_of(d, v).to_le_bytes()[..d.size()]);
}

/// `v` as one element of `d`.
pub fn encode(d: DataType, v: f64) -> Vec<u8> {
    let mut out = Vec::with_capacity(d.size());
    encode_into(d, v, &mut out);
    out
}

/// The value of one element of `d` (`b` holds at least `d.size()` bytes; the first are read).
pub fn decode(d: DataType, b: &[u8]) -> f64 {
    value_of(d, word(&b[..d.size()]))
}

/// The little-endian word of `b` (at most 8 bytes).
pub fn word(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w[..b.len()].copy_from_slice(b);
    u64::from_le_bytes(w)
}

/// Element `i` of `bytes`, elements of `size` bytes, as a word.
pub fn word_at(bytes: &[u8], size: usize, i: usize) -> u64 {
    word(&bytes[i * size..(i + 1) * size])
}

/// The bytes of `words` as elements of `size` bytes.
pub fn bytes_of_words(words: impl IntoIterator<Item = u64>, size: usize) -> Vec<u8> {
    words
        .into_iter()
        .flat_map(|w| w.to_le_bytes().into_iter().take(size))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: [Float; 4] = [Float::F16, Float::BF16, Float::E4M3, Float::E5M2];

    /// The code nearest to `x` (finite, within the largest value) found among every
    /// non-negative finite code, sorted (ties to the even code): the definition
    /// [`Float::round`] must agree with. `codes` is [`sorted_codes`]`(f)`.
    fn nearest_by_search(f: Float, codes: &[(f64, u64)], x: f64) -> u64 {
        let sign = if x < 0.0 { f.sign_bit() } else { 0 };
        let a = x.abs();
        let at = codes.partition_point(|&(v, _)| v <= a);
        let (lo, lo_code) = codes[at - 1];
        let Some(&(hi, hi_code)) = codes.get(at) else {
            return sign | lo_code;
        };
        let code = match (a - lo).total_cmp(&(hi - a)) {
            std::cmp::Ordering::Less => lo_code,
            std::cmp::Ordering::Greater => hi_code,
            std::cmp::Ordering::Equal if lo_code & 1 == 0 => lo_code,
            std::cmp::Ordering::Equal => hi_code,
        };
        sign | code
    }

    /// Every non-negative finite code of `f` with its value, ascending.
    fn sorted_codes(f: Float) -> Vec<(f64, u64)> {
        let mut codes: Vec<(f64, u64)> = (0..f.sign_bit())
            .map(|c| (f.decode(c), c))
            .filter(|(v, _)| v.is_finite())
            .collect();
        codes.sort_by(|a, b| a.0.total_cmp(&b.0));
        codes
    }

    #[test]
    fn every_code_of_the_small_formats_round_trips() {
        for f in SMALL {
            for code in 0..(1u64 << f.width()) {
                let v = f.decode(code);
                if v.is_nan() {
                    assert!(f.is_nan(f.round(v)), "{f:?} {code:#x}");
                    continue;
                }
                assert_eq!(f.round(v), code, "{f:?} code {code:#x} = {v}");
            }
        }
    }

    #[test]
    fn rounding_agrees_with_a_search_and_ties_go_to_even() {
        for f in SMALL {
            let largest = f.largest();
            let codes = sorted_codes(f);
            let mut x = f.smallest_subnormal() / 3.0;
            let step = 1.0 + 1.0 / 37.0;
            while x < largest {
                for v in [x, -x] {
                    assert_eq!(f.round(v), nearest_by_search(f, &codes, v), "{f:?} {v}");
                }
                x *= step;
            }
            // Every midpoint between two neighbouring positive codes goes to the even one.
            let top = if f.ieee {
                f.top_exponent() << f.mantissa_bits
            } else {
                f.nan()
            };
            for code in 0..top - 1 {
                let mid = (f.decode(code) + f.decode(code + 1)) / 2.0;
                let even = if code & 1 == 0 { code } else { code + 1 };
                assert_eq!(
                    f.round(mid),
                    even,
                    "{f:?} between {code:#x} and {:#x}",
                    code + 1
                );
            }
        }
    }

    #[test]
    fn known_codes_and_limits() {
        assert_eq!(Float::F16.round(1.0), 0x3c00);
        assert_eq!(Float::F16.round(-2.0), 0xc000);
        assert_eq!(Float::F16.round(65504.0), 0x7bff);
        assert_eq!(
            Float::F16.round(65520.0),
            0x7c00,
            "rounds past the largest: infinity"
        );
        assert_eq!(Float::F16.decode(0x0001), 2f64.powi(-24));
        assert_eq!(Float::F16.rounded(1.0 / 3.0), 1365.0 / 4096.0);
        assert_eq!(Float::BF16.round(-2.0), 0xc000);
        assert_eq!(Float::BF16.round(1.0), 0x3f80);
        assert_eq!(Float::E4M3.round(1.0), 0x38);
        assert_eq!(Float::E4M3.decode(0x7e), 448.0);
        assert!(Float::E4M3.decode(0x7f).is_nan());
        assert_eq!(Float::E4M3.decode(0x01), 2f64.powi(-9));
        assert_eq!(
            Float::E4M3.round(464.0),
            0x7e,
            "a tie below the top goes to even 448"
        );
        assert_eq!(Float::E4M3.round(500.0), 0x7f, "past 448: e4m3's NaN");
        assert_eq!(Float::E4M3.round(-1e9), 0xff);
        assert_eq!(Float::E4M3.rounded(1.0 / 3.0), 0.34375);
        assert_eq!(Float::E5M2.round(-1.0), 0xbc);
        assert_eq!(Float::E5M2.decode(0x7b), 57344.0);
        assert_eq!(Float::E5M2.round(f64::INFINITY), 0x7c);
        assert_eq!(Float::E5M2.rounded(1.0 / 3.0), 0.3125);
        assert_eq!(Float::F32.round(-0.0), 0x8000_0000);
        assert_eq!(Float::F16.compose(true, 1, 1 << 9), 0xc200);
        assert_eq!(Float::F16.decode(0xc200), -3.0);
        assert_eq!(Float::BF16.unit_roundoff(), 2f64.powi(-8));
    }

    #[test]
    fn f32_and_f64_agree_with_the_language() {
        let mut x = 1e-42f64;
        while x < 1e39 {
            for v in [x, -x, x * (1.0 + 1e-9)] {
                let by_cast = (v as f32).to_bits() as u64;
                assert_eq!(Float::F32.round(v), by_cast, "{v}");
                assert_eq!(Float::F32.decode(by_cast), v as f32 as f64);
            }
            assert_eq!(Float::F64.round(x), x.to_bits());
            x *= 1.7;
        }
        assert_eq!(Float::F32.round(1e39), f32::INFINITY.to_bits() as u64);
    }

    #[test]
    fn integers_wrap_and_every_type_round_trips_small_values() {
        assert_eq!(encode(DataType::U8, -1.0), [0xff]);
        assert_eq!(encode(DataType::I8, 200.0), [200]);
        assert_eq!(decode(DataType::I8, &[200]), -56.0);
        assert_eq!(encode(DataType::U32, -1.0), [0xff; 4]);
        assert_eq!(decode(DataType::I64, &(-5i64).to_le_bytes()), -5.0);
        assert_eq!(int_value(u64::MAX, 64, false), u64::MAX as i128);
        assert_eq!(int_value(0x80, 8, true), -128);
        assert_eq!(encode(DataType::F64, 0.1), 0.1f64.to_le_bytes());
        for d in DataType::ALL {
            assert_eq!(encode(d, 3.0).len(), d.size());
            // Values every float format holds exactly.
            for v in [0.0, 1.0, 2.0, 3.0, 12.0, -1.0, -6.0, -12.0] {
                let want = match format(d) {
                    Format::Int {
                        signed: false,
                        bits,
                    } => int_value(wrap(v as i128, bits), bits, false) as f64,
                    _ => v,
                };
                assert_eq!(decode(d, &encode(d, v)), want, "{d:?} {v}");
            }
        }
        let words = [1u64, 0xfffe, 3];
        assert_eq!(
            decode(DataType::F8E5M2, &encode(DataType::F8E5M2, 100.0)),
            96.0
        );
        let b = bytes_of_words(words, 2);
        assert_eq!(b, [1, 0, 0xfe, 0xff, 3, 0]);
        assert_eq!(word_at(&b, 2, 1), 0xfffe);
    }
}
