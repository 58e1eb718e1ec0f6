//! Helpers shared by the integration tests. The backend is chosen as users get it:
//! `MSCCLPP_BACKEND=cuda|cpu`, else CUDA when a GPU is present, else the CPU backend.

#![allow(dead_code)]

use mscclpp::host::gpu::{BackendKind, Gpu, Module};

/// The backend under test.
pub fn backend() -> BackendKind {
    BackendKind::select().expect("backend selection")
}

/// Device `ordinal` of the backend under test (wrapping around when it has fewer devices).
pub fn gpu(ordinal: usize) -> Gpu {
    let kind = backend();
    let count = kind.device_count().expect("device count");
    assert!(count > 0, "the {kind:?} backend has no device");
    Gpu::open(kind, ordinal % count).expect("open device")
}

/// The built-in kernels loaded on `gpu`.
pub fn module(gpu: &Gpu) -> Module {
    gpu.load_ptx(mscclpp::DEVICE_PTX).expect("load the embedded PTX")
}

/// Bytes `0, 1, 2, …` offset by `seed` (wrapping), never all zero.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Lower-case hex of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Bytes of lower-case hex.
pub fn from_hex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}
