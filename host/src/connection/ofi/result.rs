//! Result layer: one function per libfabric call, returning `Result` with an
//! [`Error::Transport`](crate::Error::Transport) of kind `Call` (the call, the provider,
//! libfabric's code and its `fi_strerror` text: [`call_error`]). Calls that the headers define as
//! inline wrappers go through the ops tables exactly as those wrappers do (see `sys.rs`); a table
//! without the entry is `-FI_ENOSYS`, as `FI_CHECK_OP` would make it.

use std::ffi::{c_int, c_void};

use super::sys::{
    self, FiAvAttr, FiCqAttr, FiCqErrEntry, FiCqTaggedEntry, FiInfo, FiMrAttr, FiOps, FiOpsAv,
    FiOpsCm, FiOpsCq, FiOpsDomain, FiOpsFabric, FiOpsMr, FiOpsRma, FiOpsTagged, Fid, FidAv, FidCq,
    FidDomain, FidEp, FidFabric, FidMr, Lib, op,
};
use crate::error::{Error, Link, Result, TransportErrorKind};
use crate::transport::Transport;

/// `-FI_ENOSYS`: what a missing ops-table entry reads as.
const ENOSYS: isize = -(libc::ENOSYS as isize);

/// The loaded library, or an `Unavailable` error saying why not.
pub(crate) fn lib() -> Result<&'static Lib> {
    sys::lib().map_err(unavailable)
}

/// libfabric cannot be used here, for `reason`.
pub(crate) fn unavailable(reason: String) -> Error {
    Link::local(Transport::Ofi).unavailable(reason)
}

/// The libfabric call `call` of `provider` failed with (negative) `code`, which libfabric
/// explains as `reason`.
pub(crate) fn call_error(call: &'static str, provider: &str, code: isize, reason: &str) -> Error {
    let detail = format!("{call} failed (provider {provider:?}): {reason} ({code})");
    Link::local(Transport::Ofi).error(TransportErrorKind::Call, call, detail)
}

/// `rc` (0 or a negative libfabric code) as a `Result`.
pub(crate) fn check(lib: &Lib, call: &'static str, provider: &str, rc: isize) -> Result<()> {
    if rc >= 0 {
        Ok(())
    } else {
        Err(call_error(call, provider, rc, &sys::strerror(lib, rc)))
    }
}

/// `fi_getinfo(version, NULL, NULL, 0, hints, &info)`: the matching providers' list (owned by
/// the caller, freed with `fi_freeinfo`), or `None` when nothing matches (`-FI_ENODATA`).
///
/// # Safety
/// `hints` is null or a live `fi_info` (from `fi_dupinfo`).
pub(crate) unsafe fn getinfo(
    lib: &Lib,
    version: u32,
    hints: *const FiInfo,
) -> Result<Option<*mut FiInfo>> {
    let mut out: *mut FiInfo = std::ptr::null_mut();
    // SAFETY: valid out-pointer; `hints` per the caller's contract; no node or service.
    let rc = unsafe {
        (lib.getinfo)(
            version,
            std::ptr::null(),
            std::ptr::null(),
            0,
            hints,
            &mut out,
        )
    };
    if rc == -libc::ENODATA {
        return Ok(None);
    }
    check(lib, "fi_getinfo", "", rc as isize)?;
    Ok((!out.is_null()).then_some(out))
}

/// `fi_fabric(info->fabric_attr, &fabric, NULL)`.
///
/// # Safety
/// `info` is a live entry of a `fi_getinfo` list.
pub(crate) unsafe fn fabric(lib: &Lib, info: *mut FiInfo, prov: &str) -> Result<*mut FidFabric> {
    let mut out = std::ptr::null_mut();
    // SAFETY: `info` is live (caller), so is its fabric_attr; valid out-pointer.
    let rc = unsafe { (lib.fabric)((*info).fabric_attr, &mut out, std::ptr::null_mut()) };
    check(lib, "fi_fabric", prov, rc as isize)?;
    Ok(out)
}

/// `fi_domain(fabric, info, &domain, NULL)`.
///
/// # Safety
/// `fabric` is live and was opened from `info`'s fabric; `info` is live.
pub(crate) unsafe fn domain(
    lib: &Lib,
    fabric: *mut FidFabric,
    info: *mut FiInfo,
    prov: &str,
) -> Result<*mut FidDomain> {
    let mut out = std::ptr::null_mut();
    // SAFETY: `fabric` is live (caller), its ops table is the provider's.
    let rc = unsafe {
        match op!((*fabric).ops, FiOpsFabric, domain) {
            Some(f) => f(fabric, info, &mut out, std::ptr::null_mut()),
            None => ENOSYS as c_int,
        }
    };
    check(lib, "fi_domain", prov, rc as isize)?;
    Ok(out)
}

/// `fi_endpoint(domain, info, &ep, NULL)`.
///
/// # Safety
/// `domain` and `info` are live; `info` is the entry `domain` was opened from.
pub(crate) unsafe fn endpoint(
    lib: &Lib,
    domain: *mut FidDomain,
    info: *mut FiInfo,
    prov: &str,
) -> Result<*mut FidEp> {
    let mut out = std::ptr::null_mut();
    // SAFETY: `domain` is live (caller).
    let rc = unsafe {
        match op!((*domain).ops, FiOpsDomain, endpoint) {
            Some(f) => f(domain, info, &mut out, std::ptr::null_mut()),
            None => ENOSYS as c_int,
        }
    };
    check(lib, "fi_endpoint", prov, rc as isize)?;
    Ok(out)
}

/// `fi_cq_open(domain, attr, &cq, NULL)`.
///
/// # Safety
/// `domain` is live.
pub(crate) unsafe fn cq_open(
    lib: &Lib,
    domain: *mut FidDomain,
    attr: &mut FiCqAttr,
    prov: &str,
) -> Result<*mut FidCq> {
    let mut out = std::ptr::null_mut();
    // SAFETY: `domain` is live (caller); `attr` is a valid attribute block.
    let rc = unsafe {
        match op!((*domain).ops, FiOpsDomain, cq_open) {
            Some(f) => f(domain, attr, &mut out, std::ptr::null_mut()),
            None => ENOSYS as c_int,
        }
    };
    check(lib, "fi_cq_open", prov, rc as isize)?;
    Ok(out)
}

/// `fi_av_open(domain, attr, &av, NULL)`.
///
/// # Safety
/// `domain` is live.
pub(crate) unsafe fn av_open(
    lib: &Lib,
    domain: *mut FidDomain,
    attr: &mut FiAvAttr,
    prov: &str,
) -> Result<*mut FidAv> {
    let mut out = std::ptr::null_mut();
    // SAFETY: `domain` is live (caller); `attr` is a valid attribute block.
    let rc = unsafe {
        match op!((*domain).ops, FiOpsDomain, av_open) {
            Some(f) => f(domain, attr, &mut out, std::ptr::null_mut()),
            None => ENOSYS as c_int,
        }
    };
    check(lib, "fi_av_open", prov, rc as isize)?;
    Ok(out)
}

/// `fid->ops->bind(fid, bfid, flags)`: `fi_ep_bind`, `fi_mr_bind`.
///
/// # Safety
/// Both objects are live.
pub(crate) unsafe fn bind(
    lib: &Lib,
    call: &'static str,
    fid: *mut Fid,
    bfid: *mut Fid,
    flags: u64,
    prov: &str,
) -> Result<()> {
    // SAFETY: `fid` is live (caller); its ops table is the provider's.
    let rc = unsafe {
        match op!((*fid).ops, FiOps, bind) {
            Some(f) => f(fid, bfid, flags),
            None => ENOSYS as c_int,
        }
    };
    check(lib, call, prov, rc as isize)
}

/// `fid->ops->control(fid, FI_ENABLE, NULL)`: `fi_enable`, `fi_mr_enable`.
///
/// # Safety
/// `fid` is live.
pub(crate) unsafe fn enable(
    lib: &Lib,
    call: &'static str,
    fid: *mut Fid,
    prov: &str,
) -> Result<()> {
    // SAFETY: `fid` is live (caller).
    let rc = unsafe {
        match op!((*fid).ops, FiOps, control) {
            Some(f) => f(fid, sys::FI_ENABLE, std::ptr::null_mut()),
            None => ENOSYS as c_int,
        }
    };
    check(lib, call, prov, rc as isize)
}

/// `fi_close(fid)`.
///
/// # Safety
/// `fid` is live and not used again after this call.
pub(crate) unsafe fn close(lib: &Lib, call: &'static str, fid: *mut Fid, prov: &str) -> Result<()> {
    // SAFETY: `fid` is live (caller).
    let rc = unsafe {
        match op!((*fid).ops, FiOps, close) {
            Some(f) => f(fid),
            None => ENOSYS as c_int,
        }
    };
    check(lib, call, prov, rc as isize)
}

/// `fi_getname(&ep->fid, …)`: the endpoint's address (at most 256 bytes).
///
/// # Safety
/// `ep` is live and enabled.
pub(crate) unsafe fn getname(lib: &Lib, ep: *mut FidEp, prov: &str) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; 256];
    let mut len = buf.len();
    // SAFETY: `ep` is live (caller); `buf` has `len` bytes.
    let rc = unsafe {
        match op!((*ep).cm, FiOpsCm, getname) {
            Some(f) => f(&mut (*ep).fid, buf.as_mut_ptr().cast(), &mut len),
            None => ENOSYS as c_int,
        }
    };
    check(lib, "fi_getname", prov, rc as isize)?;
    buf.truncate(len.min(256));
    Ok(buf)
}

/// `fi_av_insert(av, addr, 1, &fi_addr, 0, NULL)`: the handle of one peer address.
///
/// # Safety
/// `av` is live; `addr` is an address in the format of the endpoints of its domain.
pub(crate) unsafe fn av_insert(lib: &Lib, av: *mut FidAv, addr: &[u8], prov: &str) -> Result<u64> {
    let mut out: u64 = sys::FI_ADDR_UNSPEC;
    // SAFETY: `av` is live (caller); `addr` is readable; one output slot.
    let rc = unsafe {
        match op!((*av).ops, FiOpsAv, insert) {
            Some(f) => f(
                av,
                addr.as_ptr().cast(),
                1,
                &mut out,
                0,
                std::ptr::null_mut(),
            ),
            None => ENOSYS as c_int,
        }
    };
    // fi_av_insert returns the number of addresses inserted.
    if rc != 1 || out == sys::FI_ADDR_UNSPEC {
        let code = if rc < 0 {
            rc as isize
        } else {
            -(libc::EINVAL as isize)
        };
        return check(lib, "fi_av_insert", prov, code).map(|()| out);
    }
    Ok(out)
}

/// `fi_mr_regattr(domain, attr, 0, &mr)`.
///
/// # Safety
/// `domain` is live; `attr` describes memory that stays valid while the registration lives.
pub(crate) unsafe fn mr_regattr(
    lib: &Lib,
    domain: *mut FidDomain,
    attr: &FiMrAttr,
    prov: &str,
) -> Result<*mut FidMr> {
    let mut out = std::ptr::null_mut();
    // SAFETY: `domain` is live (caller); `attr` is valid.
    let rc = unsafe {
        match op!((*domain).mr, FiOpsMr, regattr) {
            Some(f) => f(&mut (*domain).fid, attr, 0, &mut out),
            None => ENOSYS as c_int,
        }
    };
    check(lib, "fi_mr_regattr", prov, rc as isize)?;
    Ok(out)
}

/// What posting an operation gave: posted, or the queue is full (`-FI_EAGAIN`: progress the
/// completion queue and try again).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Posted {
    Yes,
    Again,
}

fn posted(lib: &Lib, call: &'static str, prov: &str, rc: isize) -> Result<Posted> {
    if rc == -sys::FI_EAGAIN {
        Ok(Posted::Again)
    } else {
        check(lib, call, prov, rc).map(|()| Posted::Yes)
    }
}

/// `fi_tsend(ep, buf, len, desc, dest, tag, context)`.
///
/// # Safety
/// `ep` is live; `buf..buf+len` stays valid and unchanged, and `context` stays valid and unused
/// by anything else, until the operation's completion is read.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn tsend(
    lib: &Lib,
    ep: *mut FidEp,
    buf: *const u8,
    len: usize,
    desc: *mut c_void,
    dest: u64,
    tag: u64,
    context: *mut c_void,
    prov: &str,
) -> Result<Posted> {
    // SAFETY: the caller's contract.
    let rc = unsafe {
        match op!((*ep).tagged, FiOpsTagged, send) {
            Some(f) => f(ep, buf.cast(), len, desc, dest, tag, context),
            None => ENOSYS,
        }
    };
    posted(lib, "fi_tsend", prov, rc)
}

/// `fi_trecv(ep, buf, len, desc, FI_ADDR_UNSPEC, tag, 0, context)`.
///
/// # Safety
/// As [`tsend`], with `buf` writable.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn trecv(
    lib: &Lib,
    ep: *mut FidEp,
    buf: *mut u8,
    len: usize,
    desc: *mut c_void,
    tag: u64,
    context: *mut c_void,
    prov: &str,
) -> Result<Posted> {
    // SAFETY: the caller's contract.
    let rc = unsafe {
        match op!((*ep).tagged, FiOpsTagged, recv) {
            Some(f) => f(
                ep,
                buf.cast(),
                len,
                desc,
                sys::FI_ADDR_UNSPEC,
                tag,
                0,
                context,
            ),
            None => ENOSYS,
        }
    };
    posted(lib, "fi_trecv", prov, rc)
}

/// `fi_write(ep, buf, len, desc, dest, addr, key, context)`.
///
/// # Safety
/// As [`tsend`]; `addr`/`key` name a region the peer registered for remote writes.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn write(
    lib: &Lib,
    ep: *mut FidEp,
    buf: *const u8,
    len: usize,
    desc: *mut c_void,
    dest: u64,
    addr: u64,
    key: u64,
    context: *mut c_void,
    prov: &str,
) -> Result<Posted> {
    // SAFETY: the caller's contract.
    let rc = unsafe {
        match op!((*ep).rma, FiOpsRma, write) {
            Some(f) => f(ep, buf.cast(), len, desc, dest, addr, key, context),
            None => ENOSYS,
        }
    };
    posted(lib, "fi_write", prov, rc)
}

/// What one read of a completion queue gave.
#[derive(Debug)]
pub(crate) enum Polled {
    /// This many entries were written to the buffer.
    Entries(usize),
    /// Nothing completed.
    Empty,
    /// An operation failed: its error entry and the provider's text for it.
    Failed(FiCqErrEntry, String),
}

/// `fi_cq_read(cq, entries, len)`, and `fi_cq_readerr` + `fi_cq_strerror` when it says an
/// error entry is waiting (`-FI_EAVAIL`).
///
/// # Safety
/// `cq` is live and was opened with `FI_CQ_FORMAT_TAGGED`.
pub(crate) unsafe fn cq_read(
    lib: &Lib,
    cq: *mut FidCq,
    entries: &mut [FiCqTaggedEntry],
    prov: &str,
) -> Result<Polled> {
    // SAFETY: `cq` is live (caller) and of the tagged format, so `entries` has room for
    // `entries.len()` of them.
    let rc = unsafe {
        match op!((*cq).ops, FiOpsCq, read) {
            Some(f) => f(cq, entries.as_mut_ptr().cast(), entries.len()),
            None => ENOSYS,
        }
    };
    if rc > 0 {
        return Ok(Polled::Entries(rc as usize));
    }
    if rc == 0 || rc == -sys::FI_EAGAIN {
        return Ok(Polled::Empty);
    }
    if rc != -sys::FI_EAVAIL {
        check(lib, "fi_cq_read", prov, rc)?;
        return Ok(Polled::Empty);
    }
    let mut err = FiCqErrEntry::default();
    // SAFETY: `cq` is live; `err` is a zeroed error entry (err_data_size 0: the provider keeps
    // its own error data, valid until the next read of this CQ, which is below).
    let rc = unsafe {
        match op!((*cq).ops, FiOpsCq, readerr) {
            Some(f) => f(cq, &mut err, 0),
            None => ENOSYS,
        }
    };
    if rc < 0 {
        check(lib, "fi_cq_readerr", prov, rc)?;
    }
    let mut text = [0 as std::ffi::c_char; 256];
    // SAFETY: `cq` is live; `err` came from it just now (its err_data is still valid); `text`
    // has 256 bytes. The returned string is the provider's or `text`, NUL-terminated.
    let reason = unsafe {
        match op!((*cq).ops, FiOpsCq, strerror) {
            Some(f) => sys::c_str(f(
                cq,
                err.prov_errno,
                err.err_data,
                text.as_mut_ptr(),
                text.len(),
            )),
            None => String::new(),
        }
    };
    let reason = if reason.is_empty() {
        sys::strerror(lib, err.err as isize)
    } else {
        reason
    };
    Ok(Polled::Failed(err, reason))
}
