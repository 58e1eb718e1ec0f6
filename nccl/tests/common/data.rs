//! Test data that cannot collude: each element a function of (rank, part, index) with no
//! symmetry and no short period, small integers so that every served type holds them and
//! their sums over 8 ranks exactly, and an independent host reference.

use std::ffi::c_int;

use super::{BFLOAT16, FLOAT16, FLOAT32, INT32, MAX, MIN, SUM, UINT32};

/// The served types: (NCCL value, bytes).
pub const TYPES: [(c_int, usize); 5] = [
    (INT32, 4),
    (UINT32, 4),
    (FLOAT16, 2),
    (FLOAT32, 4),
    (BFLOAT16, 2),
];
/// The served operators.
pub const OPS: [c_int; 3] = [SUM, MIN, MAX];

/// Element `i` of part `part` of rank `rank`: an integer in [-9, 26].
pub fn value(rank: usize, part: usize, i: usize) -> f64 {
    let h = (rank * 7919 + part * 104_729 + i * 31 + (i * i) % 17) % 31;
    h as f64
        - if (rank + i).is_multiple_of(3) {
            9.0
        } else {
            0.0
        }
}

/// `value` as stored in type `t` (unsigned types hold it shifted by 10).
pub fn stored(t: c_int, v: f64) -> f64 {
    if t == UINT32 { v + 10.0 } else { v }
}

/// The bytes of `v` in type `t`.
pub fn encode(t: c_int, v: f64) -> Vec<u8> {
    match t {
        INT32 => (v as i32).to_le_bytes().to_vec(),
        UINT32 => (v as u32).to_le_bytes().to_vec(),
        FLOAT32 => (v as f32).to_le_bytes().to_vec(),
        BFLOAT16 => (((v as f32).to_bits() >> 16) as u16).to_le_bytes().to_vec(),
        FLOAT16 => f16_bits(v as f32).to_le_bytes().to_vec(),
        _ => panic!("type {t} is not served"),
    }
}

/// The value of the bytes `b` of type `t`.
pub fn decode(t: c_int, b: &[u8]) -> f64 {
    match t {
        INT32 => i32::from_le_bytes(b.try_into().unwrap()) as f64,
        UINT32 => u32::from_le_bytes(b.try_into().unwrap()) as f64,
        FLOAT32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
        BFLOAT16 => f32::from_bits((u16::from_le_bytes(b.try_into().unwrap()) as u32) << 16) as f64,
        FLOAT16 => f16_value(u16::from_le_bytes(b.try_into().unwrap())) as f64,
        _ => panic!("type {t} is not served"),
    }
}

/// IEEE half bits of `x`, exact for the integers used here (|x| < 2048).
fn f16_bits(x: f32) -> u16 {
    if x == 0.0 {
        return 0;
    }
    let sign = if x < 0.0 { 0x8000 } else { 0 };
    let a = x.abs();
    let e = a.log2().floor() as i32;
    let mant = ((a / 2f32.powi(e) - 1.0) * 1024.0).round() as u16;
    sign | (((e + 15) as u16) << 10) | mant
}

fn f16_value(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let e = ((h >> 10) & 0x1f) as i32;
    let m = (h & 0x3ff) as f32;
    match e {
        0 => sign * m * 2f32.powi(-24),
        _ => sign * (1.0 + m / 1024.0) * 2f32.powi(e - 15),
    }
}

/// `count` elements of part `part` of rank `rank` in type `t`.
pub fn bytes(t: c_int, rank: usize, part: usize, count: usize) -> Vec<u8> {
    (0..count)
        .flat_map(|i| encode(t, stored(t, value(rank, part, i))))
        .collect()
}

/// The reduction by `op` of part `part` over `n` ranks, element `i`, as type `t` stores it.
pub fn reduced(t: c_int, op: c_int, n: usize, part: usize, i: usize) -> f64 {
    let vals = (0..n).map(|r| value(r, part, i));
    let v = match op {
        SUM => vals.sum::<f64>(),
        MIN => vals.fold(f64::INFINITY, f64::min),
        MAX => vals.fold(f64::NEG_INFINITY, f64::max),
        _ => panic!("operator {op} is not served"),
    };
    // A sum of shifted unsigned values is shifted n times.
    if t == UINT32 {
        if op == SUM {
            v + 10.0 * n as f64
        } else {
            v + 10.0
        }
    } else {
        v
    }
}

/// Checks `got` (type `t`) against `want`, element by element.
#[track_caller]
pub fn check(t: c_int, got: &[u8], want: &[f64], what: &str) {
    let es = got.len() / want.len().max(1);
    assert_eq!(got.len(), want.len() * es, "{what}: length");
    for (i, w) in want.iter().enumerate() {
        let g = decode(t, &got[i * es..(i + 1) * es]);
        assert_eq!(g, *w, "{what}: element {i} of {}", want.len());
    }
}

/// A host buffer of `bytes` filled with the marker 0xa5 (what a call must overwrite).
pub fn marked(bytes: usize) -> Vec<u8> {
    vec![0xa5; bytes]
}
