//! nvptx64 implementations: every `asm!` of the project lives here.
//!
//! Names spell the PTX instruction: operation, ordering, scope, width. None of the ordering
//! instructions is marked `nomem`/`readonly`/`pure` (the compiler must not move memory accesses
//! across them); only the timer read, `nanosleep` and the `opaque_*` steps are.
//!
//! # Safety (all `unsafe fn` here)
//! Pointers must be valid, suitably aligned device addresses of the named width in the global
//! (or generic-to-global) space, live for the duration of the call.

use core::arch::asm;
use core::arch::nvptx;

// Dynamic shared memory: sized at launch (`shared_mem_bytes`), one region per block.
core::arch::global_asm!(".extern .shared .align 16 .b8 mscclpp_dynamic_smem[];");

/// `%tid.x`.
#[inline(always)]
pub fn thread_idx_x() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_thread_idx_x() as u32 }
}
/// `%ctaid.x`.
#[inline(always)]
pub fn block_idx_x() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_block_idx_x() as u32 }
}
/// `%tid.x` read where it is written: the compiler neither hoists the read nor merges it with
/// another, so no register holds it across the code around (for the trace hooks, see
/// [`opaque_u64`]).
#[inline(always)]
pub fn thread_idx_x_here() -> u32 {
    let t: u32;
    // SAFETY: reads a special register.
    unsafe { asm!("mov.u32 {t}, %tid.x;", t = out(reg32) t, options(nomem, nostack)) };
    t
}
/// `%ctaid.x` read where it is written (see [`thread_idx_x_here`]).
#[inline(always)]
pub fn block_idx_x_here() -> u32 {
    let b: u32;
    // SAFETY: reads a special register.
    unsafe { asm!("mov.u32 {b}, %ctaid.x;", b = out(reg32) b, options(nomem, nostack)) };
    b
}
/// `%ntid.x`.
#[inline(always)]
pub fn block_dim_x() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_block_dim_x() as u32 }
}
/// `%nctaid.x`.
#[inline(always)]
pub fn grid_dim_x() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_grid_dim_x() as u32 }
}

/// `bar.sync 0`: every thread of the block must call it (the usual CUDA rule).
#[inline(always)]
pub fn sync_threads() {
    // SAFETY: a block-wide barrier; the uniform-control-flow rule is the caller's, as in CUDA.
    unsafe { nvptx::_syncthreads() }
}

/// `bar.red.or.pred` on barrier 0: [`sync_threads`] that also tells every thread whether
/// `pred` holds on some thread of the block (CUDA's `__syncthreads_or`). Every thread of the
/// block must call it; it orders memory as `bar.sync` does (PTX memory model: `bar.red`
/// synchronizes with the other threads' `bar.sync`/`bar.red` on the same barrier).
#[inline(always)]
pub fn sync_threads_or(pred: bool) -> bool {
    let r: u32;
    // SAFETY: a block barrier with a reduction over predicates; no operand is an address. Not
    // `nomem`: it orders memory like `bar.sync`. The uniform-control-flow rule is the caller's.
    unsafe {
        asm!("{{ .reg .pred p, q; setp.ne.u32 p, {x}, 0; bar.red.or.pred q, 0, p; selp.u32 {r}, 1, 0, q; }}",
             x = in(reg32) pred as u32, r = out(reg32) r, options(nostack))
    };
    r != 0
}

/// `bar.red.and.pred` on barrier 0: [`sync_threads`] that also tells every thread whether
/// `pred` holds on every thread of the block (CUDA's `__syncthreads_and`). Every thread of the
/// block must call it; it orders memory as `bar.sync` does.
#[inline(always)]
pub fn sync_threads_and(pred: bool) -> bool {
    let r: u32;
    // SAFETY: as in `sync_threads_or`.
    unsafe {
        asm!("{{ .reg .pred p, q; setp.ne.u32 p, {x}, 0; bar.red.and.pred q, 0, p; selp.u32 {r}, 1, 0, q; }}",
             x = in(reg32) pred as u32, r = out(reg32) r, options(nostack))
    };
    r != 0
}

/// `bar.red.popc.u32` on barrier 0: [`sync_threads`] that also tells every thread on how many
/// threads of the block `pred` holds (CUDA's `__syncthreads_count`). Every thread of the block
/// must call it; it orders memory as `bar.sync` does.
#[inline(always)]
pub fn sync_threads_count(pred: bool) -> u32 {
    let r: u32;
    // SAFETY: as in `sync_threads_or`.
    unsafe {
        asm!("{{ .reg .pred p; setp.ne.u32 p, {x}, 0; bar.red.popc.u32 {r}, 0, p; }}",
             x = in(reg32) pred as u32, r = out(reg32) r, options(nostack))
    };
    r
}

/// `bar.warp.sync 0xffffffff`: every lane of the warp must call it.
#[inline(always)]
pub fn sync_warp() {
    // SAFETY: a warp barrier over the full mask; the uniform-control-flow rule is the caller's.
    unsafe { asm!("bar.warp.sync 0xffffffff;", options(nostack)) };
}

/// `vote.sync.all.pred` over the full warp: whether `pred` holds on every lane. Every lane must
/// call it.
#[inline(always)]
pub fn vote_all_sync(pred: bool) -> bool {
    let r: u32;
    // SAFETY: a warp vote over the full mask; no memory access.
    unsafe {
        asm!("{{ .reg .pred p, q; setp.ne.u32 p, {x}, 0; vote.sync.all.pred q, p, 0xffffffff; selp.u32 {r}, 1, 0, q; }}",
             x = in(reg32) pred as u32, r = out(reg32) r, options(nostack))
    };
    r != 0
}

/// `vote.sync.any.pred` over the full warp: whether `pred` holds on some lane. Every lane must
/// call it.
#[inline(always)]
pub fn vote_any_sync(pred: bool) -> bool {
    let r: u32;
    // SAFETY: a warp vote over the full mask; no memory access.
    unsafe {
        asm!("{{ .reg .pred p, q; setp.ne.u32 p, {x}, 0; vote.sync.any.pred q, p, 0xffffffff; selp.u32 {r}, 1, 0, q; }}",
             x = in(reg32) pred as u32, r = out(reg32) r, options(nostack))
    };
    r != 0
}

/// Whether a warp's 16-byte stores to one aligned 128-byte line reach memory (local or over
/// NVLink) as one write, so that a reader never sees part of the line (LL128's premise, which
/// NCCL's LL128 protocol rests on too; the PTX memory model does not promise it).
pub const WARP_LINE_STORES_WHOLE: bool = true;

/// Generic address of this block's dynamic shared memory: [`dynamic_shared_mem_size`] bytes,
/// 16-byte aligned. With none given at launch, any access through it is out of bounds (an
/// illegal-address fault, which ends the CUDA context); the CPU backend's emulator traps
/// already at this call then.
#[inline(always)]
pub fn dynamic_shared_mem() -> *mut u8 {
    let p: u64;
    // SAFETY: converts the address of the module's extern shared symbol; no memory access.
    unsafe {
        asm!("cvta.shared.u64 {p}, mscclpp_dynamic_smem;", p = out(reg64) p, options(nomem, nostack, pure));
    }
    p as *mut u8
}

/// `%dynamic_smem_size`: bytes of dynamic shared memory this launch gave each block
/// (`LaunchConfig::with_shared_mem`), so that a kernel can check what it needs before it uses
/// [`dynamic_shared_mem`].
#[inline(always)]
pub fn dynamic_shared_mem_size() -> u32 {
    let r: u32;
    // SAFETY: reads a special register that is constant for the launch.
    unsafe {
        asm!("mov.u32 {r}, %dynamic_smem_size;", r = out(reg32) r, options(nomem, nostack, pure))
    };
    r
}

/// `ld.acquire.sys.u64`.
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn ld_acquire_sys_u64(p: *const u64) -> u64 {
    let v: u64;
    // SAFETY: the caller guarantees `p` (module docs).
    unsafe {
        asm!("ld.acquire.sys.u64 {v}, [{p}];", v = out(reg64) v, p = in(reg64) p, options(nostack))
    };
    v
}
/// `ld.acquire.gpu.u64`: an acquire load for readers on this GPU only.
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn ld_acquire_gpu_u64(p: *const u64) -> u64 {
    let v: u64;
    // SAFETY: the caller guarantees `p` (module docs).
    unsafe {
        asm!("ld.acquire.gpu.u64 {v}, [{p}];", v = out(reg64) v, p = in(reg64) p, options(nostack))
    };
    v
}
/// `ld.relaxed.sys.u64`.
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn ld_relaxed_sys_u64(p: *const u64) -> u64 {
    let v: u64;
    // SAFETY: the caller guarantees `p` (module docs).
    unsafe {
        asm!("ld.relaxed.sys.u64 {v}, [{p}];", v = out(reg64) v, p = in(reg64) p, options(nostack))
    };
    v
}
/// `ld.relaxed.sys.u32`.
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn ld_relaxed_sys_u32(p: *const u32) -> u32 {
    let v: u32;
    // SAFETY: the caller guarantees `p` (module docs).
    unsafe {
        asm!("ld.relaxed.sys.u32 {v}, [{p}];", v = out(reg32) v, p = in(reg64) p, options(nostack))
    };
    v
}
/// `st.release.sys.u64`.
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn st_release_sys_u64(p: *mut u64, v: u64) {
    // SAFETY: the caller guarantees `p` (module docs).
    unsafe {
        asm!("st.release.sys.u64 [{p}], {v};", p = in(reg64) p, v = in(reg64) v, options(nostack))
    };
}
/// `st.relaxed.sys.u64`.
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn st_relaxed_sys_u64(p: *mut u64, v: u64) {
    // SAFETY: the caller guarantees `p` (module docs).
    unsafe {
        asm!("st.relaxed.sys.u64 [{p}], {v};", p = in(reg64) p, v = in(reg64) v, options(nostack))
    };
}
/// `st.release.sys.global.v2.u64`: one 16-byte store of `(lo, hi)`; `p` 16-byte aligned.
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn st_release_sys_v2_u64(p: *mut u64, lo: u64, hi: u64) {
    // SAFETY: the caller guarantees `p` (module docs) and 16-byte alignment.
    unsafe {
        asm!("st.release.sys.global.v2.u64 [{p}], {{{a}, {b}}};",
             p = in(reg64) p, a = in(reg64) lo, b = in(reg64) hi, options(nostack))
    };
}
/// `red.release.sys.global.add.u64`.
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn red_add_release_sys_u64(p: *mut u64, v: u64) {
    // SAFETY: the caller guarantees `p` (module docs).
    unsafe {
        asm!("red.release.sys.global.add.u64 [{p}], {v};", p = in(reg64) p, v = in(reg64) v, options(nostack))
    };
}
/// `red.release.gpu.global.add.u64`: a release add for readers on this GPU only.
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn red_add_release_gpu_u64(p: *mut u64, v: u64) {
    // SAFETY: the caller guarantees `p` (module docs).
    unsafe {
        asm!("red.release.gpu.global.add.u64 [{p}], {v};", p = in(reg64) p, v = in(reg64) v, options(nostack))
    };
}
/// `red.relaxed.sys.global.add.u64`.
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn red_add_relaxed_sys_u64(p: *mut u64, v: u64) {
    // SAFETY: the caller guarantees `p` (module docs).
    unsafe {
        asm!("red.relaxed.sys.global.add.u64 [{p}], {v};", p = in(reg64) p, v = in(reg64) v, options(nostack))
    };
}
/// `atom.add.relaxed.gpu.global.u64`; returns the old value.
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn atom_add_relaxed_gpu_u64(p: *mut u64, v: u64) -> u64 {
    let old: u64;
    // SAFETY: the caller guarantees `p` (module docs).
    unsafe {
        asm!("atom.add.relaxed.gpu.global.u64 {o}, [{p}], {v};",
             o = out(reg64) old, p = in(reg64) p, v = in(reg64) v, options(nostack))
    };
    old
}
/// `atom.cas.relaxed.sys.global.b32`; returns the old value.
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn atom_cas_relaxed_sys_u32(p: *mut u32, compare: u32, new: u32) -> u32 {
    let old: u32;
    // SAFETY: the caller guarantees `p` (module docs).
    unsafe {
        asm!("atom.cas.relaxed.sys.global.b32 {o}, [{p}], {c}, {n};",
             o = out(reg32) old, p = in(reg64) p, c = in(reg32) compare, n = in(reg32) new, options(nostack))
    };
    old
}
/// `fence.sc.sys`.
#[inline(always)]
pub fn fence_sc_sys() {
    // SAFETY: a fence has no operands.
    unsafe { asm!("fence.sc.sys;", options(nostack)) };
}
/// `fence.acq_rel.sys`.
#[inline(always)]
pub fn fence_acq_rel_sys() {
    // SAFETY: a fence has no operands.
    unsafe { asm!("fence.acq_rel.sys;", options(nostack)) };
}
/// `fence.acq_rel.gpu`: orders this thread's accesses for the other threads of this GPU only
/// (cheaper than the system-scope fence when nothing outside the GPU reads the data).
#[inline(always)]
pub fn fence_acq_rel_gpu() {
    // SAFETY: a fence has no operands.
    unsafe { asm!("fence.acq_rel.gpu;", options(nostack)) };
}
/// `ld.volatile.global.v4.u32` (LL16 packet read).
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn ld_volatile_v4_u32(p: *const u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees `p` (module docs) and 16-byte alignment.
    unsafe {
        asm!("ld.volatile.global.v4.u32 {{{a}, {b}, {c}, {d}}}, [{p}];",
             a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
             p = in(reg64) p, options(nostack))
    };
    [a, b, c, d]
}
/// `st.volatile.global.v4.u32` (LL16 packet write).
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn st_volatile_v4_u32(p: *mut u32, v: [u32; 4]) {
    // SAFETY: the caller guarantees `p` (module docs) and 16-byte alignment.
    unsafe {
        asm!("st.volatile.global.v4.u32 [{p}], {{{a}, {b}, {c}, {d}}};",
             p = in(reg64) p, a = in(reg32) v[0], b = in(reg32) v[1], c = in(reg32) v[2], d = in(reg32) v[3],
             options(nostack))
    };
}
/// `ld.volatile.global.v2.u32` (LL8 packet read).
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn ld_volatile_v2_u32(p: *const u32) -> [u32; 2] {
    let (a, b): (u32, u32);
    // SAFETY: the caller guarantees `p` (module docs) and 8-byte alignment.
    unsafe {
        asm!("ld.volatile.global.v2.u32 {{{a}, {b}}}, [{p}];",
             a = out(reg32) a, b = out(reg32) b, p = in(reg64) p, options(nostack))
    };
    [a, b]
}
/// `st.volatile.global.v2.u32` (LL8 packet write).
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn st_volatile_v2_u32(p: *mut u32, v: [u32; 2]) {
    // SAFETY: the caller guarantees `p` (module docs) and 8-byte alignment.
    unsafe {
        asm!("st.volatile.global.v2.u32 [{p}], {{{a}, {b}}};",
             p = in(reg64) p, a = in(reg32) v[0], b = in(reg32) v[1], options(nostack))
    };
}
/// `ld.global.v4.u32`: a plain 16-byte load (bulk copies).
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn ld_v4_u32(p: *const u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees `p` (module docs) and 16-byte alignment.
    unsafe {
        asm!("ld.global.v4.u32 {{{a}, {b}, {c}, {d}}}, [{p}];",
             a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
             p = in(reg64) p, options(nostack, readonly))
    };
    [a, b, c, d]
}
/// `st.global.v4.u32`: a plain 16-byte store (bulk copies).
///
/// # Safety
/// The pointer arguments are valid and aligned for their width (module docs).
#[inline(always)]
pub unsafe fn st_v4_u32(p: *mut u32, v: [u32; 4]) {
    // SAFETY: the caller guarantees `p` (module docs) and 16-byte alignment.
    unsafe {
        asm!("st.global.v4.u32 [{p}], {{{a}, {b}, {c}, {d}}};",
             p = in(reg64) p, a = in(reg32) v[0], b = in(reg32) v[1], c = in(reg32) v[2], d = in(reg32) v[3],
             options(nostack))
    };
}
/// `%globaltimer` in nanoseconds (coarse: updates about every microsecond).
#[inline(always)]
pub fn globaltimer_ns() -> u64 {
    let t: u64;
    // SAFETY: reads a special register.
    unsafe { asm!("mov.u64 {t}, %globaltimer;", t = out(reg64) t, options(nomem, nostack)) };
    t
}
/// `v`, through an empty `asm!` the compiler may neither hoist, merge with another, nor see
/// through: what a value computed from it, and a branch on it, stay where they are written.
/// For the trace hooks, which test a kernel parameter and compute an address from a few more:
/// when LLVM knew those values, it hoisted the addresses out of loops (live registers across
/// the whole kernel) and duplicated loops and kernel bodies into a traced and an untraced copy,
/// which cost registers and stack on the untraced path. `nomem`: it touches no memory.
#[inline(always)]
pub fn opaque_u64(mut v: u64) -> u64 {
    // SAFETY: no instruction.
    unsafe { asm!("// opaque {0}", inout(reg64) v, options(nomem, nostack)) };
    v
}
/// [`opaque_u64`] for a u32.
#[inline(always)]
pub fn opaque_u32(mut v: u32) -> u32 {
    // SAFETY: no instruction.
    unsafe { asm!("// opaque {0}", inout(reg32) v, options(nomem, nostack)) };
    v
}
/// `nanosleep.u32`: a hint; the thread sleeps for up to about `ns` nanoseconds.
#[inline(always)]
pub fn nanosleep(ns: u32) {
    // SAFETY: a scheduling hint with no memory effects.
    unsafe { asm!("nanosleep.u32 {n};", n = in(reg32) ns, options(nomem, nostack)) };
}
/// Polls a waiting thread makes before it backs off.
const SPIN_BACKOFF_AFTER: u64 = 64;
/// One step of a spin loop: nothing for the first [`SPIN_BACKOFF_AFTER`] polls (a wait that
/// ends within microseconds, the common case, is not slowed), then a `nanosleep` of about
/// 100 ns between polls, so that a long wait of many threads (an LL kernel of 512 blocks all
/// polling their packets) does not flood the memory system the awaited stores must cross.
#[inline(always)]
pub fn spin_step(iteration: u64) {
    if iteration >= SPIN_BACKOFF_AFTER {
        nanosleep(100);
    }
}
/// A wait's time bound: none on the GPU (the status word's iteration limit and the abort flag
/// bound every wait; the host build's twin reads `MSCCLPP_SPIN_TIMEOUT_MS`). A unit type whose
/// [`SpinDeadline::passed`] is constant `false`, so the waits compile as if it were not there.
#[derive(Clone, Copy, Debug)]
pub struct SpinDeadline;

impl SpinDeadline {
    /// Never: the GPU has no time bound.
    #[inline(always)]
    pub fn passed(&self) -> bool {
        false
    }
}

/// The deadline of a wait that starts now (none on the GPU).
#[inline(always)]
pub fn spin_deadline() -> SpinDeadline {
    SpinDeadline
}
/// Stops the kernel (the panic handler and failed invariants).
#[inline(always)]
pub fn trap() -> ! {
    // SAFETY: `trap` aborts the kernel; nothing after it runs.
    unsafe { nvptx::trap() }
}
/// `add.rn.f16x2`: two half sums in one instruction (`None`: use the soft path).
#[inline(always)]
pub fn add_f16x2(a: u32, b: u32) -> Option<u32> {
    let r: u32;
    // SAFETY: a register operation.
    unsafe {
        asm!("add.rn.f16x2 {r}, {a}, {b};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b, options(nomem, nostack, pure))
    };
    Some(r)
}
/// `add.rn.bf16x2` (sm_90 and newer): two bfloat16 sums in one instruction (`None`: use the
/// soft path, as on targets before sm_90, which lack the instruction).
#[inline(always)]
pub fn add_bf16x2(a: u32, b: u32) -> Option<u32> {
    #[cfg(target_feature = "sm_90")]
    {
        let r: u32;
        // SAFETY: a register operation.
        unsafe {
            asm!("add.rn.bf16x2 {r}, {a}, {b};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b, options(nomem, nostack, pure))
        };
        Some(r)
    }
    #[cfg(not(target_feature = "sm_90"))]
    {
        let _ = (a, b);
        None
    }
}
/// `mul.rn.f16x2`: two half products in one instruction (`None`: use the soft path).
#[inline(always)]
pub fn mul_f16x2(a: u32, b: u32) -> Option<u32> {
    let r: u32;
    // SAFETY: a register operation.
    unsafe {
        asm!("mul.rn.f16x2 {r}, {a}, {b};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b, options(nomem, nostack, pure))
    };
    Some(r)
}
/// `mul.rn.bf16x2` (sm_90 and newer): two bfloat16 products in one instruction (`None`: use
/// the soft path, as on targets before sm_90, which lack the instruction).
#[inline(always)]
pub fn mul_bf16x2(a: u32, b: u32) -> Option<u32> {
    #[cfg(target_feature = "sm_90")]
    {
        let r: u32;
        // SAFETY: a register operation.
        unsafe {
            asm!("mul.rn.bf16x2 {r}, {a}, {b};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b, options(nomem, nostack, pure))
        };
        Some(r)
    }
    #[cfg(not(target_feature = "sm_90"))]
    {
        let _ = (a, b);
        None
    }
}
/// `cvt.rn.f16x2.e4m3x2` (sm_90 builds; the soft conversion before): two fp8 e4m3 (low byte
/// first) to two halves (low half first), exactly.
#[inline(always)]
pub fn cvt_f16x2_e4m3x2(v: u16) -> u32 {
    #[cfg(target_feature = "sm_90")]
    {
        let r: u32;
        // SAFETY: a register conversion.
        unsafe {
            asm!("cvt.rn.f16x2.e4m3x2 {r}, {v};", r = out(reg32) r, v = in(reg16) v, options(nomem, nostack, pure))
        };
        r
    }
    #[cfg(not(target_feature = "sm_90"))]
    {
        crate::reduce::fp8x2_to_f16x2_soft(v, crate::reduce::Fp8::E4M3)
    }
}
/// `cvt.rn.f16x2.e5m2x2` (sm_90 builds; the soft conversion before): as
/// [`cvt_f16x2_e4m3x2`], for e5m2.
#[inline(always)]
pub fn cvt_f16x2_e5m2x2(v: u16) -> u32 {
    #[cfg(target_feature = "sm_90")]
    {
        let r: u32;
        // SAFETY: a register conversion.
        unsafe {
            asm!("cvt.rn.f16x2.e5m2x2 {r}, {v};", r = out(reg32) r, v = in(reg16) v, options(nomem, nostack, pure))
        };
        r
    }
    #[cfg(not(target_feature = "sm_90"))]
    {
        crate::reduce::fp8x2_to_f16x2_soft(v, crate::reduce::Fp8::E5M2)
    }
}
/// `cvt.rn.satfinite.e4m3x2.f16x2` (sm_90 builds; the soft conversion before): two halves to
/// two fp8 e4m3, rounded to nearest even, beyond the largest finite value (infinities
/// included) to it, NaN to NaN.
#[inline(always)]
pub fn cvt_rn_satfinite_e4m3x2_f16x2(v: u32) -> u16 {
    #[cfg(target_feature = "sm_90")]
    {
        let r: u16;
        // SAFETY: a register conversion.
        unsafe {
            asm!("cvt.rn.satfinite.e4m3x2.f16x2 {r}, {v};", r = out(reg16) r, v = in(reg32) v, options(nomem, nostack, pure))
        };
        r
    }
    #[cfg(not(target_feature = "sm_90"))]
    {
        crate::reduce::f16x2_to_fp8x2_soft(v, crate::reduce::Fp8::E4M3)
    }
}
/// `cvt.rn.satfinite.e5m2x2.f16x2` (sm_90 builds; the soft conversion before): as
/// [`cvt_rn_satfinite_e4m3x2_f16x2`], for e5m2.
#[inline(always)]
pub fn cvt_rn_satfinite_e5m2x2_f16x2(v: u32) -> u16 {
    #[cfg(target_feature = "sm_90")]
    {
        let r: u16;
        // SAFETY: a register conversion.
        unsafe {
            asm!("cvt.rn.satfinite.e5m2x2.f16x2 {r}, {v};", r = out(reg16) r, v = in(reg32) v, options(nomem, nostack, pure))
        };
        r
    }
    #[cfg(not(target_feature = "sm_90"))]
    {
        crate::reduce::f16x2_to_fp8x2_soft(v, crate::reduce::Fp8::E5M2)
    }
}
/// `cvt.f32.f16`: half to float.
#[inline(always)]
pub fn cvt_f32_f16(h: u16) -> f32 {
    let f: f32;
    // SAFETY: a register conversion.
    unsafe {
        asm!("cvt.f32.f16 {f}, {h};", f = out(reg32) f, h = in(reg16) h, options(nomem, nostack, pure))
    };
    f
}
/// `cvt.rn.f16.f32`: float to half, round to nearest even.
#[inline(always)]
pub fn cvt_rn_f16_f32(f: f32) -> u16 {
    let h: u16;
    // SAFETY: a register conversion.
    unsafe {
        asm!("cvt.rn.f16.f32 {h}, {f};", h = out(reg16) h, f = in(reg32) f, options(nomem, nostack, pure))
    };
    h
}
