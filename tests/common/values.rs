//! Element values of every data type the collectives serve, as bytes: the encoding the data
//! tests fill buffers with and the decoding they check results by. Values are small integers
//! offset for `u32` (shifted by +10), so that sums of a few ranks stay exact in every type.

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
