//! Host implementations of the `arch` primitives, used when the device crate is compiled for the
//! CPU (the CPU backend runs kernels on OS threads, one per GPU thread, see [`grid`]).
//!
//! Each function uses the `core::sync::atomic` operation with the ordering its PTX twin spells;
//! "sys" scope is what any atomic is on the host. 16-byte stores are split into two 8-byte
//! atomic stores, and every protocol that uses them is built so that a split store is harmless:
//! the FIFO writes `fst` then publishes `snd` (which carries the commit bit) with release; an
//! LL16 packet carries a flag in each 8-byte half.
//!
//! Spin loops back off (a few pure spins, then `yield_now`, then short sleeps): hundreds of
//! emulated GPU threads share two cores in CI, and a busy spin starves the thread it waits for.
//!
//! # Safety (all `unsafe fn` here)
//! As on the device: pointers valid, aligned for their width, and live for the call.

pub mod grid;

pub use grid::{
    block_dim_x, block_idx_x, dynamic_shared_mem, dynamic_shared_mem_size, grid_dim_x,
    sync_threads, sync_threads_and, sync_threads_count, sync_threads_or, sync_warp, thread_idx_x,
    vote_all_sync, vote_any_sync,
};

/// Whether a warp's 16-byte stores to one aligned 128-byte line reach memory as one write
/// (LL128's premise). Not on the host: emulated lanes store one by one, so LL128 orders the
/// flag's store after its line's data (see `crate::ll128`).
pub const WARP_LINE_STORES_WHOLE: bool = false;

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

/// # Safety
/// `p` valid and 8-byte aligned for the program's lifetime of the returned reference's use.
#[inline(always)]
unsafe fn a64<'a>(p: *const u64) -> &'a AtomicU64 {
    // SAFETY: the caller's contract (module docs); `AtomicU64` has `u64`'s layout.
    unsafe { AtomicU64::from_ptr(p as *mut u64) }
}

/// A GPU faults on a vector access that is not aligned to its width; the host twin traps
/// (a panic of the emulated thread, which the grid emulator reports), so that the CPU backend
/// catches an access that would fault on the GPU instead of doing it unaligned.
#[inline(always)]
fn check_vector_alignment(p: *const u8, width: usize) {
    if !(p as usize).is_multiple_of(width) {
        panic!("device trap: {width}-byte vector access at {p:p} is not {width}-byte aligned");
    }
}

/// Acquire load.
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn ld_acquire_sys_u64(p: *const u64) -> u64 {
    // SAFETY: the caller's contract (module docs).
    unsafe { a64(p) }.load(Ordering::Acquire)
}
/// Acquire load (the host has one scope).
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn ld_acquire_gpu_u64(p: *const u64) -> u64 {
    // SAFETY: the caller's contract (module docs).
    unsafe { a64(p) }.load(Ordering::Acquire)
}
/// Relaxed load.
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn ld_relaxed_sys_u64(p: *const u64) -> u64 {
    // SAFETY: the caller's contract (module docs).
    unsafe { a64(p) }.load(Ordering::Relaxed)
}
/// Relaxed load.
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn ld_relaxed_sys_u32(p: *const u32) -> u32 {
    // SAFETY: the caller's contract (module docs).
    unsafe { AtomicU32::from_ptr(p as *mut u32) }.load(Ordering::Relaxed)
}
/// Release store.
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn st_release_sys_u64(p: *mut u64, v: u64) {
    // SAFETY: the caller's contract (module docs).
    unsafe { a64(p) }.store(v, Ordering::Release)
}
/// Relaxed store.
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn st_relaxed_sys_u64(p: *mut u64, v: u64) {
    // SAFETY: the caller's contract (module docs).
    unsafe { a64(p) }.store(v, Ordering::Relaxed)
}
/// 16-byte release store as two 8-byte stores: `lo` relaxed, then `hi` with release, so a
/// reader that acquires `hi` sees `lo` (see the module docs for why that suffices).
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn st_release_sys_v2_u64(p: *mut u64, lo: u64, hi: u64) {
    check_vector_alignment(p as *const u8, 16);
    // SAFETY: the caller's contract (module docs); `p + 1` is inside the 16-byte slot.
    unsafe {
        a64(p).store(lo, Ordering::Relaxed);
        a64(p.add(1)).store(hi, Ordering::Release);
    }
}
/// Release add.
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn red_add_release_sys_u64(p: *mut u64, v: u64) {
    // SAFETY: the caller's contract (module docs).
    unsafe { a64(p) }.fetch_add(v, Ordering::Release);
}
/// Release add (the host has one scope).
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn red_add_release_gpu_u64(p: *mut u64, v: u64) {
    // SAFETY: the caller's contract (module docs).
    unsafe { a64(p) }.fetch_add(v, Ordering::Release);
}
/// Relaxed add.
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn red_add_relaxed_sys_u64(p: *mut u64, v: u64) {
    // SAFETY: the caller's contract (module docs).
    unsafe { a64(p) }.fetch_add(v, Ordering::Relaxed);
}
/// Relaxed fetch-add; returns the old value.
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn atom_add_relaxed_gpu_u64(p: *mut u64, v: u64) -> u64 {
    // SAFETY: the caller's contract (module docs).
    unsafe { a64(p) }.fetch_add(v, Ordering::Relaxed)
}
/// Relaxed compare-and-swap; returns the old value.
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn atom_cas_relaxed_sys_u32(p: *mut u32, compare: u32, new: u32) -> u32 {
    // SAFETY: the caller's contract (module docs).
    match unsafe { AtomicU32::from_ptr(p) }.compare_exchange(
        compare,
        new,
        Ordering::Relaxed,
        Ordering::Relaxed,
    ) {
        Ok(old) | Err(old) => old,
    }
}
/// Sequentially consistent fence.
#[inline(always)]
pub fn fence_sc_sys() {
    fence(Ordering::SeqCst)
}
/// Acquire-release fence.
#[inline(always)]
pub fn fence_acq_rel_sys() {
    fence(Ordering::AcqRel)
}
/// Acquire-release fence (the host has one scope).
#[inline(always)]
pub fn fence_acq_rel_gpu() {
    fence(Ordering::AcqRel)
}
/// LL16 read: two relaxed 8-byte loads (each half carries its own flag).
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn ld_volatile_v4_u32(p: *const u32) -> [u32; 4] {
    check_vector_alignment(p as *const u8, 16);
    // SAFETY: the caller's contract (module docs); 16-byte aligned slot.
    let (lo, hi) = unsafe {
        (
            a64(p as *const u64).load(Ordering::Relaxed),
            a64((p as *const u64).add(1)).load(Ordering::Relaxed),
        )
    };
    [lo as u32, (lo >> 32) as u32, hi as u32, (hi >> 32) as u32]
}
/// LL16 write: two relaxed 8-byte stores (each half carries its own flag).
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn st_volatile_v4_u32(p: *mut u32, v: [u32; 4]) {
    check_vector_alignment(p as *const u8, 16);
    let lo = v[0] as u64 | ((v[1] as u64) << 32);
    let hi = v[2] as u64 | ((v[3] as u64) << 32);
    // SAFETY: the caller's contract (module docs); 16-byte aligned slot.
    unsafe {
        a64(p as *const u64).store(lo, Ordering::Relaxed);
        a64((p as *const u64).add(1)).store(hi, Ordering::Relaxed);
    }
}
/// LL8 read: one relaxed 8-byte load.
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn ld_volatile_v2_u32(p: *const u32) -> [u32; 2] {
    check_vector_alignment(p as *const u8, 8);
    // SAFETY: the caller's contract (module docs).
    let w = unsafe { a64(p as *const u64) }.load(Ordering::Relaxed);
    [w as u32, (w >> 32) as u32]
}
/// LL8 write: one relaxed 8-byte store.
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn st_volatile_v2_u32(p: *mut u32, v: [u32; 2]) {
    check_vector_alignment(p as *const u8, 8);
    // SAFETY: the caller's contract (module docs).
    unsafe { a64(p as *const u64) }.store(v[0] as u64 | ((v[1] as u64) << 32), Ordering::Relaxed)
}
/// Plain 16-byte load.
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn ld_v4_u32(p: *const u32) -> [u32; 4] {
    check_vector_alignment(p as *const u8, 16);
    // SAFETY: the caller's contract (module docs).
    unsafe { (p as *const [u32; 4]).read() }
}
/// Plain 16-byte store.
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn st_v4_u32(p: *mut u32, v: [u32; 4]) {
    check_vector_alignment(p as *const u8, 16);
    // SAFETY: the caller's contract (module docs).
    unsafe { (p as *mut [u32; 4]).write(v) }
}
/// `CLOCK_MONOTONIC` in nanoseconds (the twin of `%globaltimer`; see `grid::monotonic_ns`).
#[inline(always)]
pub fn globaltimer_ns() -> u64 {
    grid::monotonic_ns()
}
/// This thread's index (the device twin reads it where it is written).
#[inline(always)]
pub fn thread_idx_x_here() -> u32 {
    thread_idx_x()
}
/// This block's index (the device twin reads it where it is written).
#[inline(always)]
pub fn block_idx_x_here() -> u32 {
    block_idx_x()
}
/// `v` (the device twin hides it from the optimiser; the host build needs no such care).
#[inline(always)]
pub fn opaque_u64(v: u64) -> u64 {
    v
}
/// `v` (see [`opaque_u64`]).
#[inline(always)]
pub fn opaque_u32(v: u32) -> u32 {
    v
}
/// Sleeps about `ns` nanoseconds.
#[inline(always)]
pub fn nanosleep(ns: u32) {
    std::thread::sleep(core::time::Duration::from_nanos(ns as u64));
}
/// One step of a spin loop: pure spins first, then yields, then 50 µs sleeps.
#[inline(always)]
pub fn spin_step(iteration: u64) {
    if iteration < 16 {
        core::hint::spin_loop();
    } else if iteration < 64 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(core::time::Duration::from_micros(50));
    }
}
/// Environment variable that bounds every device wait of the host build in time (the CPU
/// backend's kernels): a whole number of milliseconds, read once per process. Unset, `0` or not
/// a number: no time bound (the status word's iteration limit and the abort flag only). Meant
/// for tests and mutation runs, where a lost signal must fail in seconds: the iteration limit
/// ([`DeviceStatus::spin_limit`](mscclpp_shared::DeviceStatus)) counts polls, and a poll of the
/// host build sleeps, so that limit is days of wall time here. The nvptx build has no such
/// bound (its [`SpinDeadline`] never passes).
pub const SPIN_TIMEOUT_ENV: &str = "MSCCLPP_SPIN_TIMEOUT_MS";

/// The time bound of [`SPIN_TIMEOUT_ENV`] for `value` (the variable's text), in nanoseconds; 0
/// for none.
pub fn spin_timeout_ns(value: Option<&str>) -> u64 {
    value
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(0, |ms| ms.saturating_mul(1_000_000))
}

/// When a wait that started at [`spin_deadline`] gives up on time alone (host build: from
/// [`SPIN_TIMEOUT_ENV`]).
#[derive(Clone, Copy, Debug)]
pub struct SpinDeadline {
    /// [`grid::monotonic_ns`] at which the wait gives up; `u64::MAX` for never.
    at_ns: u64,
}

impl SpinDeadline {
    /// Whether the wait has run past its time bound.
    #[inline(always)]
    pub fn passed(&self) -> bool {
        self.at_ns != u64::MAX && grid::monotonic_ns() >= self.at_ns
    }
}

/// The deadline of a wait that starts now.
#[inline(always)]
pub fn spin_deadline() -> SpinDeadline {
    static TIMEOUT_NS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let timeout = *TIMEOUT_NS
        .get_or_init(|| spin_timeout_ns(std::env::var(SPIN_TIMEOUT_ENV).ok().as_deref()));
    SpinDeadline {
        at_ns: if timeout == 0 {
            u64::MAX
        } else {
            grid::monotonic_ns().saturating_add(timeout)
        },
    }
}
/// A GPU trap: on the host, a panic of the emulated thread (the grid emulator reports it).
#[inline(always)]
pub fn trap() -> ! {
    panic!("device trap")
}
/// `add.rn.f16x2` where the hardware has it: never on the host.
#[inline(always)]
pub fn add_f16x2(_a: u32, _b: u32) -> Option<u32> {
    None
}
/// `add.rn.bf16x2` where the hardware has it: never on the host.
#[inline(always)]
pub fn add_bf16x2(_a: u32, _b: u32) -> Option<u32> {
    None
}
/// `mul.rn.f16x2` where the hardware has it: never on the host.
#[inline(always)]
pub fn mul_f16x2(_a: u32, _b: u32) -> Option<u32> {
    None
}
/// `mul.rn.bf16x2` where the hardware has it: never on the host.
#[inline(always)]
pub fn mul_bf16x2(_a: u32, _b: u32) -> Option<u32> {
    None
}
/// Two fp8 e4m3 to two halves (the software twin of `cvt.rn.f16x2.e4m3x2`).
#[inline(always)]
pub fn cvt_f16x2_e4m3x2(v: u16) -> u32 {
    crate::reduce::fp8x2_to_f16x2_soft(v, crate::reduce::Fp8::E4M3)
}
/// Two fp8 e5m2 to two halves (the software twin of `cvt.rn.f16x2.e5m2x2`).
#[inline(always)]
pub fn cvt_f16x2_e5m2x2(v: u16) -> u32 {
    crate::reduce::fp8x2_to_f16x2_soft(v, crate::reduce::Fp8::E5M2)
}
/// Two halves to two fp8 e4m3, saturating (the software twin of
/// `cvt.rn.satfinite.e4m3x2.f16x2`).
#[inline(always)]
pub fn cvt_rn_satfinite_e4m3x2_f16x2(v: u32) -> u16 {
    crate::reduce::f16x2_to_fp8x2_soft(v, crate::reduce::Fp8::E4M3)
}
/// Two halves to two fp8 e5m2, saturating (the software twin of
/// `cvt.rn.satfinite.e5m2x2.f16x2`).
#[inline(always)]
pub fn cvt_rn_satfinite_e5m2x2_f16x2(v: u32) -> u16 {
    crate::reduce::f16x2_to_fp8x2_soft(v, crate::reduce::Fp8::E5M2)
}
/// Half to float (the software twin of `cvt.f32.f16`).
#[inline(always)]
pub fn cvt_f32_f16(h: u16) -> f32 {
    crate::reduce::f16_to_f32_soft(h)
}
/// Float to half, round to nearest even (the software twin of `cvt.rn.f16.f32`).
#[inline(always)]
pub fn cvt_rn_f16_f32(f: f32) -> u16 {
    crate::reduce::f32_to_f16_soft(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spin_timeout_reads_whole_milliseconds() {
        assert_eq!(spin_timeout_ns(None), 0);
        assert_eq!(spin_timeout_ns(Some("")), 0);
        assert_eq!(spin_timeout_ns(Some("0")), 0);
        assert_eq!(spin_timeout_ns(Some("ten")), 0);
        assert_eq!(spin_timeout_ns(Some("-5")), 0);
        assert_eq!(spin_timeout_ns(Some("1500")), 1_500_000_000);
        assert_eq!(spin_timeout_ns(Some(" 7 ")), 7_000_000);
        assert_eq!(spin_timeout_ns(Some("18446744073709551615")), u64::MAX);
    }

    #[test]
    fn misaligned_vector_accesses_trap_as_on_the_gpu() {
        let words = [1u64, 2, 3, 4, 5];
        let base = words.as_ptr() as *const u8;
        let at16 = if (base as usize).is_multiple_of(16) {
            0
        } else {
            8
        };
        // SAFETY: 16 bytes inside `words`, 16-byte aligned.
        let v = unsafe { ld_v4_u32(base.add(at16) as *const u32) };
        assert_eq!(v[0] as u64 | (v[1] as u64) << 32, words[at16 / 8]);
        for off in [4, 8] {
            let p = base.wrapping_add(at16 + off) as *const u32;
            // SAFETY: inside `words`; the twin traps before the access.
            let r = std::panic::catch_unwind(|| unsafe { ld_v4_u32(p) });
            assert!(r.is_err(), "a 16-byte load at +{off} did not trap");
        }
        // SAFETY: as above (8 bytes, misaligned by 4).
        let r =
            std::panic::catch_unwind(|| unsafe { ld_volatile_v2_u32(base.add(4) as *const u32) });
        assert!(r.is_err(), "an 8-byte load at +4 did not trap");
    }

    #[test]
    fn a_deadline_far_away_has_not_passed() {
        let d = SpinDeadline {
            at_ns: grid::monotonic_ns() + 3_600_000_000_000,
        };
        assert!(!d.passed());
        assert!(SpinDeadline { at_ns: 0 }.passed());
        assert!(!SpinDeadline { at_ns: u64::MAX }.passed());
    }
}
