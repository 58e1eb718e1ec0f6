//! Element values of the collectives and soak tests, as bytes: small integers, so that sums of
//! a few ranks stay exact in every type; unsigned types hold them shifted by
//! [`UNSIGNED_SHIFT`]. Encoded and decoded by the harness's codec
//! (`mscclpp_test_support::codec`), written from the formats' definitions, never by the
//! library's conversions.
//!
//! Which value an element gets is a hash of (rank, part, index) ([`value`]): no symmetry
//! between the three (rank r's part p differs from rank p's part r, so an exchange that sends
//! nothing or sends the wrong part shows) and no period along any of them. Outputs start as
//! `mscclpp_test_support::MARKER`, so an element nobody wrote shows too.

#![allow(dead_code)]

use mscclpp::shared::{DataType, ReduceOp};
use mscclpp_test_support::{codec, hash};

/// The types these tests run (`tests/reductions.rs` covers every type).
pub const TYPES: [DataType; 5] = [
    DataType::F32,
    DataType::F16,
    DataType::BF16,
    DataType::I32,
    DataType::U32,
];

/// Every reduction operator these tests run.
pub const REDUCE_OPS: [ReduceOp; 3] = [ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max];

/// What an unsigned type adds to a value (the smallest, -10, then holds 0).
pub const UNSIGNED_SHIFT: f64 = 10.0;

fn unsigned(dtype: DataType) -> bool {
    matches!(
        codec::format(dtype),
        codec::Format::Int { signed: false, .. }
    )
}

/// The value of element `index` of part `part` of `rank`'s data: an integer in [-10, 13] from
/// `hash(rank, part, index)`. Exact in every type, and so are sums of up to 9 ranks
/// (|sum| <= 117 < 256, the largest integer bf16 holds exactly).
pub fn value(rank: usize, part: usize, index: usize) -> f64 {
    (hash(&[rank as u64, part as u64, index as u64]) % 24) as f64 - 10.0
}

/// Appends `v` as `dtype` to `out` (shifted for unsigned types).
pub fn encode_into(dtype: DataType, v: f64, out: &mut Vec<u8>) {
    let shift = if unsigned(dtype) { UNSIGNED_SHIFT } else { 0.0 };
    codec::encode_into(dtype, v + shift, out)
}

/// `v` as `dtype`.
pub fn encode(dtype: DataType, v: f64) -> Vec<u8> {
    let mut out = Vec::with_capacity(dtype.size());
    encode_into(dtype, v, &mut out);
    out
}

/// The value of one element (`b` holds exactly `dtype.size()` bytes; unshifted).
pub fn decode(dtype: DataType, b: &[u8]) -> f64 {
    let shift = if unsigned(dtype) { UNSIGNED_SHIFT } else { 0.0 };
    codec::decode(dtype, b) - shift
}
