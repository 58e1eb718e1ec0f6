//! Test data for `-c`: every rank's input part is a pseudo-random sequence of small integers
//! that depends on the rank, the part and the element index (period [`PERIOD`], a prime, so
//! a block, piece or chunk landing at a wrong offset is caught), and every output element is
//! checked exactly against a host reference. The integers are small enough that sums over
//! all ranks stay exact in every type, bf16, 8-bit integers and fp8 included, in any order of
//! reduction.

use mscclpp::device::reduce::{
    Fp8, bf16_to_f32, f16_to_f32_soft, f32_to_bf16, f32_to_f16_soft, f32_to_fp8, fp8_to_f32,
};
use mscclpp::shared::{DataType, ReduceOp};

/// Elements before a pattern repeats (prime).
pub const PERIOD: usize = 4093;

/// Byte written into output buffers before a checked run: an element made of it is never one
/// of the expected small integers, so untouched output counts as wrong.
pub const SENTINEL: u8 = 0xA5;

fn mix(mut x: u64) -> u64 {
    // splitmix64's finaliser.
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Element `j` of rank `rank`'s part `part` (of `n` ranks): a small integer whose partial sums
/// over the `n` ranks are exact in the type (at most 256 in magnitude, exact in bf16; 127 for
/// 8-bit integers, 16 for e4m3 and 8 for e5m2), non-negative for unsigned types.
pub fn value(dtype: DataType, n: usize, rank: usize, part: usize, j: usize) -> f64 {
    let most = match dtype {
        DataType::I8 | DataType::U8 => 127,
        DataType::F8E4M3 => 16,
        DataType::F8E5M2 => 8,
        _ => 256,
    };
    let span = (most / n.max(1)).clamp(2, 24) as u64;
    let h = mix(((rank as u64) << 44) ^ ((part as u64) << 24) ^ j as u64) % span;
    if matches!(dtype, DataType::U32 | DataType::U8 | DataType::U64) {
        h as f64
    } else {
        h as f64 - (span / 3) as f64
    }
}

/// Appends `v` (an integer that the type holds exactly) in `dtype`'s little-endian encoding.
pub fn encode(dtype: DataType, v: f64, out: &mut Vec<u8>) {
    match dtype {
        DataType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
        DataType::F16 => out.extend_from_slice(&f32_to_f16_soft(v as f32).to_le_bytes()),
        DataType::BF16 => out.extend_from_slice(&f32_to_bf16(v as f32).to_le_bytes()),
        DataType::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
        DataType::U32 => out.extend_from_slice(&(v as u32).to_le_bytes()),
        DataType::I8 => out.push(v as i8 as u8),
        DataType::U8 => out.push(v as u8),
        DataType::I64 => out.extend_from_slice(&(v as i64).to_le_bytes()),
        DataType::U64 => out.extend_from_slice(&(v as u64).to_le_bytes()),
        DataType::F64 => out.extend_from_slice(&v.to_le_bytes()),
        DataType::F8E4M3 => out.push(f32_to_fp8(v as f32, Fp8::E4M3)),
        DataType::F8E5M2 => out.push(f32_to_fp8(v as f32, Fp8::E5M2)),
    }
}

/// The value of one element (`b` holds exactly `dtype.size()` bytes).
pub fn decode(dtype: DataType, b: &[u8]) -> f64 {
    let w2 = || u16::from_le_bytes([b[0], b[1]]);
    let w4 = || [b[0], b[1], b[2], b[3]];
    let w8 = || [b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]];
    match dtype {
        DataType::F32 => f32::from_le_bytes(w4()) as f64,
        DataType::F16 => f16_to_f32_soft(w2()) as f64,
        DataType::BF16 => bf16_to_f32(w2()) as f64,
        DataType::I32 => i32::from_le_bytes(w4()) as f64,
        DataType::U32 => u32::from_le_bytes(w4()) as f64,
        DataType::I8 => b[0] as i8 as f64,
        DataType::U8 => b[0] as f64,
        DataType::I64 => i64::from_le_bytes(w8()) as f64,
        DataType::U64 => u64::from_le_bytes(w8()) as f64,
        DataType::F64 => f64::from_le_bytes(w8()),
        DataType::F8E4M3 => fp8_to_f32(b[0], Fp8::E4M3) as f64,
        DataType::F8E5M2 => fp8_to_f32(b[0], Fp8::E5M2) as f64,
    }
}

/// One period of a part's elements, encoded; element `i` of the part is element `i % PERIOD`.
#[derive(Clone, Debug)]
pub struct Pattern {
    dtype: DataType,
    bytes: Vec<u8>,
}

impl Pattern {
    fn from_values(dtype: DataType, values: impl Iterator<Item = f64>) -> Self {
        let mut bytes = Vec::with_capacity(PERIOD * dtype.size());
        for v in values {
            encode(dtype, v, &mut bytes);
        }
        Self { dtype, bytes }
    }

    /// Rank `rank`'s input part `part`.
    pub fn input(dtype: DataType, n: usize, rank: usize, part: usize) -> Self {
        Self::from_values(dtype, (0..PERIOD).map(|j| value(dtype, n, rank, part, j)))
    }

    /// The reduction with `op` of part `part` over all `n` ranks.
    pub fn reduced(dtype: DataType, op: ReduceOp, n: usize, part: usize) -> Self {
        Self::from_values(
            dtype,
            (0..PERIOD).map(|j| {
                let vals = (0..n).map(|r| value(dtype, n, r, part, j));
                match op {
                    ReduceOp::Sum => vals.sum(),
                    ReduceOp::Min => vals.fold(f64::INFINITY, f64::min),
                    ReduceOp::Max => vals.fold(f64::NEG_INFINITY, f64::max),
                }
            }),
        )
    }

    fn es(&self) -> usize {
        self.dtype.size()
    }

    /// Calls `f(range of out, range of the pattern)` for the runs of `len` elements starting
    /// at element `first` of the part.
    fn runs(
        &self,
        first: usize,
        len: usize,
        mut f: impl FnMut(std::ops::Range<usize>, std::ops::Range<usize>),
    ) {
        let es = self.es();
        let (mut i, end) = (first, first + len);
        while i < end {
            let j = i % PERIOD;
            let take = (PERIOD - j).min(end - i);
            let o = (i - first) * es;
            f(o..o + take * es, j * es..(j + take) * es);
            i += take;
        }
    }

    /// Writes elements `first ..` of the part into `out` (a whole number of elements).
    pub fn fill(&self, first: usize, out: &mut [u8]) {
        let len = out.len() / self.es();
        self.runs(first, len, |o, p| out[o].copy_from_slice(&self.bytes[p]));
    }

    /// How many elements of `got` (elements `first ..` of the part) differ from the pattern.
    /// Values are compared, so `-0.0` equals `0.0`; NaN never matches.
    pub fn count_wrong(&self, first: usize, got: &[u8]) -> u64 {
        let es = self.es();
        let mut wrong = 0;
        self.runs(first, got.len() / es, |o, p| {
            let (g, w) = (&got[o], &self.bytes[p]);
            if g != w {
                wrong += g
                    .chunks_exact(es)
                    .zip(w.chunks_exact(es))
                    .filter(|(a, b)| decode(self.dtype, a) != decode(self.dtype, b))
                    .count() as u64;
            }
        });
        wrong
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TYPES: [DataType; 5] = [
        DataType::F32,
        DataType::F16,
        DataType::BF16,
        DataType::I32,
        DataType::U32,
    ];

    #[test]
    fn values_are_exact_and_encode_round_trip() {
        for dtype in TYPES {
            for n in [1, 2, 3, 8, 16, 64] {
                for op in [ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max] {
                    let p = Pattern::reduced(dtype, op, n, 1);
                    for (j, e) in p.bytes.chunks_exact(dtype.size()).enumerate() {
                        let vals: Vec<f64> = (0..n).map(|r| value(dtype, n, r, 1, j)).collect();
                        let want = match op {
                            ReduceOp::Sum => vals.iter().sum(),
                            ReduceOp::Min => vals.iter().cloned().fold(f64::INFINITY, f64::min),
                            ReduceOp::Max => vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
                        };
                        assert!(want.abs() <= 256.0 && want.fract() == 0.0);
                        assert_eq!(decode(dtype, e), want, "{dtype:?} n={n} {op:?} j={j}");
                    }
                }
            }
        }
    }

    #[test]
    fn data_depends_on_rank_part_and_index() {
        let a = Pattern::input(DataType::F16, 2, 0, 0);
        assert_ne!(a.bytes, Pattern::input(DataType::F16, 2, 1, 0).bytes);
        assert_ne!(a.bytes, Pattern::input(DataType::F16, 2, 0, 1).bytes);
        // Not periodic with any power of two below the period.
        for shift in [1, 2, 4, 8, 16, 64, 1024] {
            assert_ne!(a.bytes[..2 * 512], a.bytes[2 * shift..2 * (shift + 512)]);
        }
    }

    #[test]
    fn fill_and_check_tile_the_period() {
        for dtype in TYPES {
            let es = dtype.size();
            let p = Pattern::input(dtype, 4, 3, 2);
            let first = PERIOD - 5;
            let mut buf = vec![0u8; (2 * PERIOD + 17) * es];
            p.fill(first, &mut buf);
            assert_eq!(&buf[..5 * es], &p.bytes[(PERIOD - 5) * es..]);
            assert_eq!(&buf[5 * es..6 * es], &p.bytes[..es]);
            assert_eq!(p.count_wrong(first, &buf), 0);
            buf[7 * es] ^= 0x40;
            buf[(PERIOD + 9) * es + es - 1] ^= 0x01;
            assert_eq!(p.count_wrong(first, &buf), 2);
            // The sentinel is never an expected value.
            let sentinel = vec![SENTINEL; 64 * es];
            assert_eq!(p.count_wrong(0, &sentinel), 64);
            // Shifted by one element: nearly everything is wrong.
            assert!(p.count_wrong(first + 1, &buf) > PERIOD as u64);
        }
    }
}
