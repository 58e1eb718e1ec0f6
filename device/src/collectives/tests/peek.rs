//! What the host reads and writes of a world's memory between launches (no kernel runs then:
//! the launches have joined), through the pointers the kernels get, so that it needs nothing
//! of [`World`] and [`Buf`] but what every version of them offers.

use super::world::{Buf, STAGE, World};

/// Rank `r`'s scratch buffer: every region, up to the staging region's end (what
/// [`World::new`] allocates).
pub fn scratch(w: &World, r: u32) -> &[u8] {
    let len = (World::stage_offset(w.n) + STAGE) as usize;
    // SAFETY: the world owns rank `r`'s scratch, `len` bytes at that pointer, for as long as
    // it lives; it is read between launches.
    unsafe { core::slice::from_raw_parts(w.params(r, 0, 0).scratch.as_ptr(), len) }
}

/// Writes `data` at byte `at` of `b`'s usable bytes (the host's share of a call, before its
/// launch).
pub fn write(b: &Buf, at: usize, data: &[u8]) {
    assert!(at + data.len() <= b.get().len());
    // SAFETY: inside the buffer's usable bytes (checked); no kernel runs now and no reference
    // to those bytes is held.
    unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), b.ptr().as_ptr().add(at), data.len()) };
}
