//! Memory and registrations: `ncclMemAlloc` / `ncclMemFree` (device memory of the current
//! device from the library's exportable allocator, kept in a process-wide table until freed),
//! `ncclCommRegister` / `ncclCommDeregister` and the windows of `ncclCommWindowRegister`
//! (recorded per communicator; a window must lie in one allocation of the communicator's
//! device), and the operators of `ncclRedOpCreatePreMulSum` (recorded per communicator
//! from `ncclNumOps` up, each with its data type and scalar: a host scalar copied at creation,
//! as NCCL does, a device one by address, read by every call that uses it; [`reduce_op`]
//! turns one into the library's `Reduction::PreMulSum`, refusing a call of another type).
//!
//! What a registration does: `ncclCommRegister` is the library's
//! `Collectives::register_buffer` (the buffer sent to every peer once, returning without
//! waiting for them: calls on it then send no bootstrap message and wait for nothing on the
//! host, eagerly or under CUDA-graph capture). It is a hint, as NCCL's: memory no peer can map
//! (host memory, a range that is not inside one allocation of the device, memory of
//! `cuMemCreate`, which CUDA's IPC cannot export), a registration past the library's table of
//! buffers and every registration on a world of several nodes are declined (the handle is valid and
//! does nothing; calls on the buffer take the paths of unregistered buffers), and a call the
//! registered path cannot take (a size or an address not a multiple of 16, ranks that
//! registered different things) is declined alike on every rank, on the device, for that call
//! only. `ncclCommWindowRegister` is its `register_window` (collective, as NCCL's: every
//! rank registers a window of the same size in the same order; inside a group, a window's
//! registration and deregistration run at `ncclGroupEnd`, so that one thread can register the
//! windows of every rank it drives: the handle is written at once, usable after the group).
//! Calls on unregistered buffers hint their allocations (the library's `registry.rs`). A window
//! is also registered for the one-sided calls (`one_sided.rs`: the library's
//! `register_one_sided`, one more exchange). NCCL's device API over windows is not implemented
//! (`stubs.rs`).
//! `ncclMemAlloc` takes no communicator, so its memory is the device's exportable allocation,
//! registered by the program as NCCL's is (`ncclCommRegister` / a window).
//!
//! Shared state: the allocation table and each communicator's registrations and operators are
//! behind mutexes; the handle counter is an atomic incremented relaxed (only uniqueness
//! matters).

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use mscclpp::collectives::{Reduction, Registration, Scalar};
use mscclpp::host::gpu::DeviceBuffer;
use mscclpp::shared::DevicePtr;

use crate::abi::{self, ncclNumOps, ncclScalarDevice, ncclScalarHostImmediate};
use crate::args;
use crate::comm::{self, Comm};
use crate::error::NcclError;
use crate::registry::Registered;
use crate::sync::lock;

/// `ncclMemAlloc`'s buffers, by address.
static ALLOCATIONS: Mutex<Option<HashMap<usize, DeviceBuffer>>> = Mutex::new(None);

/// `ncclMemAlloc`: `size` bytes of device memory on the current device.
pub fn mem_alloc(ptr: *mut *mut c_void, size: usize) -> Result<(), NcclError> {
    if ptr.is_null() {
        return Err(NcclError::Null { what: "ptr" });
    }
    if size == 0 {
        return Err(NcclError::OutOfRange {
            what: "size",
            value: 0,
            expected: "at least 1 byte".into(),
        });
    }
    let kind = comm::backend()?;
    let g = comm::gpu(kind, comm::current_device(kind)?)?;
    let buf = g
        .alloc(size)
        .map_err(NcclError::library("allocating device memory"))?;
    let addr = buf.ptr().addr() as usize;
    lock(&ALLOCATIONS)
        .get_or_insert_with(HashMap::new)
        .insert(addr, buf);
    // SAFETY: checked non-null; NCCL's contract: it points to a writable `void*`.
    unsafe { ptr.write(addr as *mut c_void) };
    Ok(())
}

/// `ncclMemFree`: frees what `ncclMemAlloc` returned (null: nothing).
pub fn mem_free(ptr: *mut c_void) -> Result<(), NcclError> {
    if ptr.is_null() {
        return Ok(());
    }
    let buf = lock(&ALLOCATIONS)
        .as_mut()
        .and_then(|m| m.remove(&(ptr as usize)))
        .ok_or(NcclError::UnknownBuffer { ptr: ptr as usize })?;
    drop(buf);
    Ok(())
}

/// Handles are unique in the process (never 0).
fn next_handle() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(1);
    // Aligned like a pointer, so no program mistakes one for a small integer.
    NEXT.fetch_add(1, Ordering::Relaxed) << 4
}

/// Checks that `[ptr, ptr + size)` lies in one allocation of `comm`'s device.
fn check_range(comm: &Comm, ptr: *mut c_void, size: usize) -> Result<Registered, NcclError> {
    if ptr.is_null() {
        return Err(NcclError::Null { what: "buff" });
    }
    let (p, device) = (ptr as usize, comm.device);
    let not_device = |source| NcclError::NotDeviceMemory {
        ptr: p,
        size,
        device,
        source,
    };
    if size == 0 {
        return Err(not_device(None));
    }
    let a = comm
        .gpu()
        .allocation_of(DevicePtr::from_addr(p as u64))
        .map_err(|e| not_device(Some(Box::new(e))))?;
    let base = a.base.addr() as usize;
    match p.checked_add(size) {
        Some(end) if p >= base && end <= base + a.size => Ok(Registered {
            ptr: p,
            size,
            flags: 0,
            reg: None,
            one_sided: None,
        }),
        _ => Err(not_device(None)),
    }
}

/// `ncclCommRegister`.
pub fn register(
    comm: &Comm,
    buff: *mut c_void,
    size: usize,
    handle: *mut *mut c_void,
) -> Result<(), NcclError> {
    if handle.is_null() {
        return Err(NcclError::Null { what: "handle" });
    }
    let r = match check_range(comm, buff, size) {
        Ok(mut r) => {
            // SAFETY: NCCL's contract: the buffer stays allocated until it is deregistered.
            let reg = unsafe {
                comm.coll
                    .register_buffer(DevicePtr::from_addr(r.ptr as u64), r.size)
            };
            r.reg = declined_across_nodes(reg)
                .map_err(NcclError::library("registering the buffer with the peers"))?;
            r
        }
        Err(e @ NcclError::Null { .. }) => return Err(e),
        // A hint, as NCCL's (which records any range and registers it, or not, when a call
        // uses it): memory the library cannot share is declined, the handle does nothing.
        Err(e) => {
            tracing::debug!("{}: registration declined: {}", comm.name, e.text());
            Registered {
                ptr: buff as usize,
                size,
                flags: 0,
                reg: None,
                one_sided: None,
            }
        }
    };
    let h = next_handle();
    tracing::debug!(
        "{}: registered [{:#x}, +{}) as {h:#x}",
        comm.name,
        r.ptr,
        r.size
    );
    lock(&comm.registrations).buffers.insert(h, r);
    // SAFETY: checked non-null; NCCL's contract: a writable `void*`.
    unsafe { handle.write(h as *mut c_void) };
    Ok(())
}

/// A registration of the library, or none where it declines registrations on a world of
/// several nodes (`Error::Unsupported`, the same on every rank): the handle then does nothing
/// (calls on the buffer take the paths of unregistered buffers), as NCCL's registration is a
/// hint.
fn declined_across_nodes(
    reg: mscclpp::host::Result<Registration>,
) -> mscclpp::host::Result<Option<Registration>> {
    match reg {
        Ok(reg) => Ok(Some(reg)),
        Err(mscclpp::host::Error::Unsupported { what, .. }) => {
            tracing::debug!("registration declined: {what}");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// `ncclCommDeregister`.
pub fn deregister(comm: &Comm, handle: *mut c_void) -> Result<(), NcclError> {
    let r = lock(&comm.registrations)
        .buffers
        .remove(&(handle as usize))
        .ok_or(NcclError::UnknownHandle {
            what: "registration",
            ptr: handle as usize,
        })?;
    match r.reg {
        Some(reg) => comm
            .coll
            .deregister(reg)
            .map_err(NcclError::library("deregistering the buffer")),
        None => Ok(()),
    }
}

/// Every `NCCL_WIN_*` flag of NCCL 2.32.
pub const WINDOW_FLAGS: c_int = 0x0f;

/// The collective part of a window's registration or deregistration: run at once, or at the
/// end of the caller's group (`group.rs`: one thread may drive every rank's).
pub type WindowJob = Box<dyn Fn(&Comm) -> Result<(), NcclError> + Send + Sync>;

/// `ncclCommWindowRegister`: checks the arguments and returns the window's handle and the job
/// that registers it under that handle (collective, as NCCL's: every rank registers a window
/// of the same size in the same order). The caller writes the handle to `win` (not null:
/// checked here) once the job ran, or at once inside a group.
pub fn window_register(
    comm: &Comm,
    buff: *mut c_void,
    size: usize,
    win: *mut *mut c_void,
    flags: c_int,
) -> Result<(usize, WindowJob), NcclError> {
    if win.is_null() {
        return Err(NcclError::Null { what: "win" });
    }
    if flags & !WINDOW_FLAGS != 0 {
        return Err(NcclError::OutOfRange {
            what: "winFlags",
            value: flags.into(),
            expected: format!("a combination of NCCL_WIN_* flags ({WINDOW_FLAGS:#x})"),
        });
    }
    let r = check_range(comm, buff, size)?;
    let h = next_handle();
    Ok((
        h,
        Box::new(move |comm| register_window_as(comm, r, flags, h)),
    ))
}

/// Registers the window `r` (checked by [`window_register`]) with the peers, as handle `h`.
fn register_window_as(comm: &Comm, r: Registered, flags: c_int, h: usize) -> Result<(), NcclError> {
    // SAFETY: NCCL's contract: the buffer stays allocated until the window is deregistered;
    // every rank registers its window in the same order (collective, as NCCL's).
    let reg = declined_across_nodes(unsafe {
        comm.coll
            .register_window(DevicePtr::from_addr(r.ptr as u64), r.size)
    })
    .map_err(NcclError::library("registering the window with the peers"))?;
    // SAFETY: as above; the one-sided calls' registration is kept until the communicator ends.
    let one_sided = unsafe {
        comm.coll
            .register_one_sided(DevicePtr::from_addr(r.ptr as u64), r.size)
    }
    .map_err(NcclError::library(
        "registering the window for one-sided calls",
    ))?;
    let r = Registered {
        flags,
        reg,
        one_sided: Some(one_sided),
        ..r
    };
    tracing::debug!(
        "{}: window [{:#x}, +{}) flags {:#x} as {h:#x}",
        comm.name,
        r.ptr,
        r.size,
        r.flags
    );
    lock(&comm.registrations).windows.insert(h, r);
    Ok(())
}

/// `ncclCommWindowDeregister`: the job that takes the window back (collective: run at once or
/// at the end of the caller's group, as [`window_register`]'s).
pub fn window_deregister(win: *mut c_void) -> WindowJob {
    let w = win as usize;
    Box::new(move |comm| deregister_window_now(comm, w))
}

fn deregister_window_now(comm: &Comm, win: usize) -> Result<(), NcclError> {
    let r = lock(&comm.registrations)
        .windows
        .remove(&win)
        .ok_or(NcclError::UnknownHandle {
            what: "window",
            ptr: win,
        })?;
    // Both are taken back, even when the first fails (a revoked communicator refuses it).
    let one_sided = r.one_sided.map_or(Ok(()), |w| {
        comm.coll
            .deregister_one_sided(w)
            .map_err(NcclError::library(
                "deregistering the window's one-sided calls",
            ))
    });
    let window = match r.reg {
        Some(reg) => comm
            .coll
            .deregister_window(reg)
            .map_err(NcclError::library("deregistering the window")),
        None => Ok(()),
    };
    window.and(one_sided)
}

/// `ncclWinGetUserPtr`: the first byte of the window.
pub fn window_user_ptr(comm: &Comm, win: *mut c_void) -> Result<usize, NcclError> {
    window(comm, win).map(|r| r.ptr)
}

/// The live window `win` of `comm`.
pub fn window(comm: &Comm, win: *mut c_void) -> Result<Registered, NcclError> {
    lock(&comm.registrations)
        .windows
        .get(&(win as usize))
        .copied()
        .ok_or(NcclError::UnknownHandle {
            what: "window",
            ptr: win as usize,
        })
}

/// `ncclRedOpCreatePreMulSum`: records the operator; returns its value (the smallest free
/// one from `ncclNumOps`).
#[allow(non_upper_case_globals)] // NCCL's names of the residences, as patterns
pub fn create_pre_mul_sum(
    comm: &Comm,
    scalar: *mut c_void,
    datatype: c_int,
    residence: c_int,
) -> Result<c_int, NcclError> {
    if scalar.is_null() {
        return Err(NcclError::Null { what: "scalar" });
    }
    let (_, size) = abi::type_info(datatype).ok_or(NcclError::BadType { value: datatype })?;
    let s = match residence {
        ncclScalarHostImmediate => {
            // Copied now, as NCCL does: the caller's variable may change or die after this.
            let mut b = [0u8; 8];
            // SAFETY: NCCL's contract: a host scalar of the data type (`size` <= 8 bytes),
            // read before returning.
            unsafe { std::ptr::copy_nonoverlapping(scalar.cast::<u8>(), b.as_mut_ptr(), size) };
            Scalar::Host(u64::from_le_bytes(b))
        }
        ncclScalarDevice => Scalar::Device(DevicePtr::from_addr(scalar as u64)),
        other => {
            return Err(NcclError::OutOfRange {
                what: "residence",
                value: other.into(),
                expected: "ncclScalarDevice (0) or ncclScalarHostImmediate (1)".into(),
            });
        }
    };
    let mut t = lock(&comm.premul);
    let mut v = ncclNumOps;
    while t.ops.contains_key(&v) {
        v = v.checked_add(1).ok_or(NcclError::OutOfRange {
            what: "live pre-multiplied sums",
            value: t.ops.len() as i64,
            expected: "fewer than ncclMaxRedOp - ncclNumOps".into(),
        })?;
    }
    t.ops.insert(v, (datatype, s));
    Ok(v)
}

/// `ncclRedOpDestroy`.
pub fn destroy_op(comm: &Comm, op: c_int) -> Result<(), NcclError> {
    if op < ncclNumOps {
        return Err(NcclError::OutOfRange {
            what: "op",
            value: op.into(),
            expected:
                "an operator made by ncclRedOpCreatePreMulSum (built-in ones are not destroyed)"
                    .into(),
        });
    }
    lock(&comm.premul)
        .ops
        .remove(&op)
        .map(drop)
        .ok_or(NcclError::UnknownOp { value: op })
}

/// The library's operator for `op` on `comm` in a call of NCCL type `dtype`: a live
/// pre-multiplied sum of `comm` (made for `dtype`, else [`NcclError::OpTypeMismatch`]) with
/// its scalar, a dead or foreign one [`NcclError::UnknownOp`], a built-in one as
/// [`args::reduce_op`] maps it.
pub fn reduce_op(comm: &Comm, op: c_int, dtype: c_int) -> Result<Reduction, NcclError> {
    if op < ncclNumOps {
        return args::reduce_op(op);
    }
    let (made_for, scalar) = *lock(&comm.premul)
        .ops
        .get(&op)
        .ok_or(NcclError::UnknownOp { value: op })?;
    if made_for != dtype {
        let name = |t| abi::type_info(t).map_or("(not a type)", |(n, _)| n);
        return Err(NcclError::OpTypeMismatch {
            op,
            made_for: name(made_for),
            called_with: name(dtype),
        });
    }
    Ok(Reduction::PreMulSum(scalar))
}
