//! Element values of every data type the collectives serve, as bytes: the encoding the data
//! tests fill buffers with and the decoding they check results by. Values are small integers
//! offset for `u32` (shifted by +10), so that sums of a few ranks stay exact in every type.
//!
//! Which value an element gets is a hash of (rank, part, index) ([`value`]): no symmetry
//! between the three (rank r's part p differs from rank p's part r, so an exchange that sends
//! nothing or sends the wrong part shows) and no period along any of them. [`MARKER`] is the
//! byte outputs are filled with before a call, so an element nobody wrote shows too.

use mscclpp::device::reduce::{bf16_to_f32, f16_to_f32_soft, f32_to_bf16, f32_to_f16_soft};
use mscclpp::shared::{DataType, ReduceOp};

/// Every data type.
pub const TYPES: [DataType; 5] = [
    DataType::F32,
    DataType::F16,
    DataType::BF16,
    DataType::I32,
    DataType::U32,
];

/// Every reduction operator.
pub const REDUCE_OPS: [ReduceOp; 3] = [ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max];

/// The byte every output is filled with before the call under test: as an element of any
/// type it is no value [`value`] gives or a reduction of them makes (`0xa5a5` as f16 and bf16
/// is a negative fraction, as f32 too; as i32/u32 it is far out of range).
pub const MARKER: u8 = 0xa5;

/// A 64-bit hash of `words`, each word mixed in by a splitmix64 step: different positions of
/// the same word give different hashes, and no word has a period.
pub fn hash(words: &[u64]) -> u64 {
    let mut h: u64 = 0x6a09_e667_f3bc_c909;
    for &w in words {
        h = h.wrapping_add(w).wrapping_add(0x9e37_79b9_7f4a_7c15);
        h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        h ^= h >> 31;
    }
    h
}

/// The value of element `index` of part `part` of `rank`'s data: an integer in [-10, 13] from
/// [`hash`]`(rank, part, index)`. Exact in every type, and so are sums of up to 9 ranks
/// (|sum| <= 117 < 256, the largest integer bf16 holds exactly).
pub fn value(rank: usize, part: usize, index: usize) -> f64 {
    (hash(&[rank as u64, part as u64, index as u64]) % 24) as f64 - 10.0
}

/// Appends `v` as `dtype` to `out`.
pub fn encode_into(dtype: DataType, v: f64, out: &mut Vec<u8>) {
    match dtype {
        DataType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
        DataType::F16 => out.extend_from_slice(&f32_to_f16_soft(v as f32).to_le_bytes()),
        DataType::BF16 => out.extend_from_slice(&f32_to_bf16(v as f32).to_le_bytes()),
        DataType::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
        // Unsigned: shifted into range.
        DataType::U32 => out.extend_from_slice(&((v + 10.0) as u32).to_le_bytes()),
        other => panic!("{other:?} is not in TYPES (tests/reductions.rs covers every type)"),
    }
}

/// `v` as `dtype`.
pub fn encode(dtype: DataType, v: f64) -> Vec<u8> {
    let mut out = Vec::with_capacity(dtype.size());
    encode_into(dtype, v, &mut out);
    out
}

/// The value of one element (`b` holds exactly `dtype.size()` bytes).
pub fn decode(dtype: DataType, b: &[u8]) -> f64 {
    match dtype {
        DataType::F32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
        DataType::F16 => f16_to_f32_soft(u16::from_le_bytes(b.try_into().unwrap())) as f64,
        DataType::BF16 => bf16_to_f32(u16::from_le_bytes(b.try_into().unwrap())) as f64,
        DataType::I32 => i32::from_le_bytes(b.try_into().unwrap()) as f64,
        DataType::U32 => u32::from_le_bytes(b.try_into().unwrap()) as f64 - 10.0,
        other => panic!("{other:?} is not in TYPES (tests/reductions.rs covers every type)"),
    }
}
