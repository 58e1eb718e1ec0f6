//! Result layer (one function per verb, returning `Result` with an [`Error::Transport`] of kind
//! `Call` naming the verb and the device: [`verb_error`]) and RAII
//! owners of the verbs objects. `Drop` never panics: a failing destroy is logged.
//!
//! Object lifetimes follow the verbs rules: a QP before the CQ it uses, MRs and QPs before their
//! PD, everything before the device context. [`Verbs`] holds them in that drop order.

use std::collections::HashMap;
use std::ffi::{CStr, c_int, c_void};
use std::io;

use super::sys::{self, IbvContext, IbvCq, IbvGid, IbvMr, IbvQp, IbvQpAttr, IbvQpInitAttr, Lib};
use crate::error::{Error, Link, Result, TransportErrorKind};
use crate::transport::Transport;

/// InfiniBand (for `Ib(index)`) cannot be used here, for `reason`.
pub(crate) fn unavailable(index: u8, reason: String) -> Error {
    Link::local(Transport::Ib(index)).unavailable(reason)
}

/// The loaded library, or an `Unavailable` error (for `Ib(index)`) saying why not.
pub(crate) fn lib(index: u8) -> Result<&'static Lib> {
    sys::lib().map_err(|reason| unavailable(index, reason))
}

/// The verb `verb` failed on `device` (used for `Ib(index)`) with the OS error `source`.
pub(crate) fn verb_error(index: u8, verb: &'static str, device: &str, source: io::Error) -> Error {
    Link::local(Transport::Ib(index)).caused(
        TransportErrorKind::Call,
        verb,
        format!("{verb} failed on {device}"),
        Some(Box::new(source)),
    )
}

impl Context {
    /// A verb of this context returned `rc`: verbs return an errno (positive or negative), or
    /// -1 with errno set.
    fn verb_err(&self, verb: &'static str, rc: c_int) -> Error {
        let source = if rc == -1 || rc == 0 {
            io::Error::last_os_error()
        } else {
            io::Error::from_raw_os_error(rc.abs())
        };
        verb_error(self.index, verb, &self.name, source)
    }

    /// A verb of this context returned NULL (errno set).
    fn null_err(&self, verb: &'static str) -> Error {
        verb_error(self.index, verb, &self.name, io::Error::last_os_error())
    }
}

/// Names of the RDMA devices, in libibverbs' order (looked up for `Ib(index)`).
pub(crate) fn device_names(index: u8) -> Result<Vec<String>> {
    let lib = lib(index)?;
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out-pointer; the returned list is freed below.
    let list = unsafe { (lib.get_device_list)(&mut n) };
    if list.is_null() {
        let why = format!("ibv_get_device_list failed: {}", io::Error::last_os_error());
        return Err(unavailable(index, why));
    }
    let mut names = Vec::new();
    for i in 0..usize::try_from(n).unwrap_or(0) {
        // SAFETY: `list` holds `n` device pointers.
        let dev = unsafe { *list.add(i) };
        if dev.is_null() {
            continue;
        }
        // SAFETY: a device of the live list; the name is a NUL-terminated string it owns.
        let name = unsafe { (lib.get_device_name)(dev) };
        if !name.is_null() {
            // SAFETY: non-null, NUL-terminated, copied before the list is freed.
            names.push(
                unsafe { CStr::from_ptr(name) }
                    .to_string_lossy()
                    .into_owned(),
            );
        }
    }
    // SAFETY: the list came from ibv_get_device_list and is freed once.
    unsafe { (lib.free_device_list)(list) };
    Ok(names)
}

/// What `ibv_query_port` says about a port (the fields we use).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PortInfo {
    pub state: u32,
    pub active_mtu: u32,
    pub lid: u16,
    pub link_layer: u8,
}

/// An open device context (`ibv_open_device` / `ibv_close_device`).
pub(crate) struct Context {
    lib: &'static Lib,
    ctx: *mut IbvContext,
    name: String,
    /// The `Ib(index)` it serves (what its errors name).
    index: u8,
}

// SAFETY: libibverbs objects may be used from any thread (the library and providers lock
// internally); this crate additionally serializes every use of one connection's objects.
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl Context {
    /// Opens the device called `name`, for `Ib(index)`.
    pub fn open(name: &str, index: u8) -> Result<Self> {
        let lib = lib(index)?;
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer; the list is freed below, after the device was opened (an
        // opened device stays valid after the list is freed).
        let list = unsafe { (lib.get_device_list)(&mut n) };
        if list.is_null() {
            let source = io::Error::last_os_error();
            return Err(verb_error(index, "ibv_get_device_list", name, source));
        }
        let mut ctx = std::ptr::null_mut();
        let mut found = false;
        for i in 0..usize::try_from(n).unwrap_or(0) {
            // SAFETY: `list` holds `n` device pointers.
            let dev = unsafe { *list.add(i) };
            if dev.is_null() {
                continue;
            }
            // SAFETY: live device of the list; NUL-terminated name.
            let dn = unsafe { (lib.get_device_name)(dev) };
            // SAFETY: non-null, NUL-terminated.
            if !dn.is_null() && unsafe { CStr::from_ptr(dn) }.to_bytes() == name.as_bytes() {
                found = true;
                // SAFETY: a live device of the list.
                ctx = unsafe { (lib.open_device)(dev) };
                break;
            }
        }
        let open_error = io::Error::last_os_error();
        // SAFETY: freed once; `ctx` (if any) does not depend on the list.
        unsafe { (lib.free_device_list)(list) };
        if !found {
            return Err(unavailable(
                index,
                format!("no RDMA device called {name:?}"),
            ));
        }
        if ctx.is_null() {
            return Err(verb_error(index, "ibv_open_device", name, open_error));
        }
        Ok(Self {
            lib,
            ctx,
            name: name.to_owned(),
            index,
        })
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ibv_query_port`.
    pub fn query_port(&self, port: u8) -> Result<PortInfo> {
        let mut buf = [0u64; sys::PORT_ATTR_BUF / 8];
        // SAFETY: live context; `buf` is zeroed, 8-aligned and larger than any ibv_port_attr
        // the compatibility entry point writes.
        let rc = unsafe { (self.lib.query_port)(self.ctx, port, buf.as_mut_ptr().cast()) };
        if rc != 0 {
            return Err(self.verb_err("ibv_query_port", rc));
        }
        let b: &[u8] = bytemuck::cast_slice(&buf);
        let u32_at = |o: usize| u32::from_ne_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        Ok(PortInfo {
            state: u32_at(sys::PORT_ATTR_STATE),
            active_mtu: u32_at(sys::PORT_ATTR_ACTIVE_MTU),
            lid: u16::from_ne_bytes([b[sys::PORT_ATTR_LID], b[sys::PORT_ATTR_LID + 1]]),
            link_layer: b[sys::PORT_ATTR_LINK_LAYER],
        })
    }

    /// `ibv_query_gid`.
    pub fn query_gid(&self, port: u8, index: u8) -> Result<[u8; 16]> {
        let mut gid = IbvGid::default();
        // SAFETY: live context, valid out-pointer.
        let rc = unsafe { (self.lib.query_gid)(self.ctx, port, c_int::from(index), &mut gid) };
        if rc != 0 {
            return Err(self.verb_err("ibv_query_gid", rc));
        }
        Ok(gid.raw)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: opened by us, closed once, after every object made from it (see `Verbs`).
        let rc = unsafe { (self.lib.close_device)(self.ctx) };
        if rc != 0 {
            tracing::warn!("ibv_close_device({}) failed: {rc}", self.name);
        }
    }
}

/// A protection domain.
pub(crate) struct Pd {
    lib: &'static Lib,
    pd: *mut c_void,
}

// SAFETY: see `Context`.
unsafe impl Send for Pd {}
// SAFETY: see `Context`.
unsafe impl Sync for Pd {}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: allocated by us, freed once after its QPs and MRs.
        let rc = unsafe { (self.lib.dealloc_pd)(self.pd) };
        if rc != 0 {
            tracing::warn!("ibv_dealloc_pd failed: {rc}");
        }
    }
}

/// A completion queue.
pub(crate) struct Cq {
    lib: &'static Lib,
    pub(crate) cq: *mut IbvCq,
}

// SAFETY: see `Context`.
unsafe impl Send for Cq {}
// SAFETY: see `Context`.
unsafe impl Sync for Cq {}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: created by us, destroyed once after its QP.
        let rc = unsafe { (self.lib.destroy_cq)(self.cq) };
        if rc != 0 {
            tracing::warn!("ibv_destroy_cq failed: {rc}");
        }
    }
}

/// A queue pair.
pub(crate) struct Qp {
    lib: &'static Lib,
    pub(crate) qp: *mut IbvQp,
}

// SAFETY: see `Context`.
unsafe impl Send for Qp {}
// SAFETY: see `Context`.
unsafe impl Sync for Qp {}

impl Qp {
    /// The QP number.
    pub fn num(&self) -> u32 {
        // SAFETY: a live QP returned by ibv_create_qp; `qp_num` is set at creation.
        unsafe { (*self.qp).qp_num }
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: created by us, destroyed once, first of all objects.
        let rc = unsafe { (self.lib.destroy_qp)(self.qp) };
        if rc != 0 {
            tracing::warn!("ibv_destroy_qp failed: {rc}");
        }
    }
}

/// A registered memory region.
pub(crate) struct Mr {
    lib: &'static Lib,
    mr: *mut IbvMr,
}

// SAFETY: see `Context`.
unsafe impl Send for Mr {}
// SAFETY: see `Context`.
unsafe impl Sync for Mr {}

impl Mr {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        // SAFETY: a live MR returned by ibv_reg_mr.
        unsafe { (*self.mr).lkey }
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.mr).rkey }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered by us, deregistered once before its PD.
        let rc = unsafe { (self.lib.dereg_mr)(self.mr) };
        if rc != 0 {
            tracing::warn!("ibv_dereg_mr failed: {rc}");
        }
    }
}

/// Every verbs object of one connection, declared in drop order (QP, MRs, CQ, PD, context).
pub(crate) struct Verbs {
    pub qp: Qp,
    /// Local memories by `local_id`: (region, address, size).
    pub mrs: HashMap<u32, (Mr, u64, u64)>,
    /// The 8-byte buffer that receives fetch-and-add results, and its region.
    pub atomic_mr: Mr,
    pub atomic_buf: Box<std::sync::atomic::AtomicU64>,
    pub cq: Cq,
    /// Kept for the drop order.
    pub _pd: Pd,
    pub ctx: Context,
}

/// Send queue depth (outstanding signaled work requests).
pub(crate) const MAX_SEND_WR: u32 = 1024;

impl Context {
    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&self) -> Result<Pd> {
        // SAFETY: live context.
        let pd = unsafe { (self.lib.alloc_pd)(self.ctx) };
        if pd.is_null() {
            return Err(self.null_err("ibv_alloc_pd"));
        }
        Ok(Pd { lib: self.lib, pd })
    }

    /// `ibv_create_cq` with `cqe` entries, no channel.
    pub fn create_cq(&self, cqe: c_int) -> Result<Cq> {
        let null = std::ptr::null_mut();
        // SAFETY: live context; no completion channel, no user context.
        let cq = unsafe { (self.lib.create_cq)(self.ctx, cqe, null, null, 0) };
        if cq.is_null() {
            return Err(self.null_err("ibv_create_cq"));
        }
        Ok(Cq { lib: self.lib, cq })
    }

    /// `ibv_create_qp`: an RC queue pair on `cq` (send and receive), every WR signaled.
    pub fn create_qp(&self, pd: &Pd, cq: &Cq) -> Result<Qp> {
        let mut attr = IbvQpInitAttr {
            qp_context: std::ptr::null_mut(),
            send_cq: cq.cq,
            recv_cq: cq.cq,
            srq: std::ptr::null_mut(),
            cap: sys::IbvQpCap {
                max_send_wr: MAX_SEND_WR,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: sys::IBV_QPT_RC,
            sq_sig_all: 1,
        };
        // SAFETY: live PD and CQ of this context; `attr` is a valid init attr.
        let qp = unsafe { (self.lib.create_qp)(pd.pd, &mut attr) };
        if qp.is_null() {
            return Err(self.null_err("ibv_create_qp"));
        }
        Ok(Qp { lib: self.lib, qp })
    }

    /// `ibv_modify_qp`.
    pub fn modify_qp(
        &self,
        qp: &Qp,
        verb: &'static str,
        mut attr: IbvQpAttr,
        mask: c_int,
    ) -> Result<()> {
        // SAFETY: live QP; `attr` valid for the fields `mask` names.
        let rc = unsafe { (self.lib.modify_qp)(qp.qp, &mut attr, mask) };
        if rc != 0 {
            return Err(self.verb_err(verb, rc));
        }
        Ok(())
    }

    /// `ibv_reg_mr` for local write, remote write/read/atomic.
    ///
    /// # Safety
    /// `[addr, addr + len)` must stay valid memory until the region is deregistered.
    pub unsafe fn reg_mr(&self, pd: &Pd, addr: u64, len: usize) -> Result<Mr> {
        let access = sys::IBV_ACCESS_LOCAL_WRITE
            | sys::IBV_ACCESS_REMOTE_WRITE
            | sys::IBV_ACCESS_REMOTE_READ
            | sys::IBV_ACCESS_REMOTE_ATOMIC;
        // SAFETY: live PD; the caller keeps the range valid.
        let mr = unsafe { (self.lib.reg_mr)(pd.pd, addr as *mut c_void, len, access) };
        if mr.is_null() {
            return Err(self.null_err("ibv_reg_mr"));
        }
        Ok(Mr { lib: self.lib, mr })
    }
}
