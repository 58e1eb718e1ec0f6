//! What the host writes into a buffer between launches (no kernel runs then: the launches
//! have joined), through the pointer the kernels get.

use super::world::Buf;

/// Writes `data` at byte `at` of `b`'s usable bytes (the host's share of a call, before its
/// launch).
pub fn write(b: &Buf, at: usize, data: &[u8]) {
    assert!(at + data.len() <= b.get().len());
    // SAFETY: inside the buffer's usable bytes (checked); no kernel runs now and no reference
    // to those bytes is held.
    unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), b.ptr().as_ptr().add(at), data.len()) };
}
