//! Raw layer: the libfabric structs this transport touches, declared by hand from the ABI of
//! `rdma/fabric.h` and its companions (libfabric 1.x, unchanged in layout since 1.10 for every
//! field used here), and the library itself, opened with `dlopen` at run time.
//!
//! Only six libfabric functions are exported symbols (`fi_getinfo`, `fi_freeinfo`,
//! `fi_dupinfo`, `fi_fabric`, `fi_strerror`, `fi_version`). Everything else the headers offer
//! (`fi_domain`, `fi_endpoint`, `fi_cq_open`, `fi_av_open`, `fi_mr_reg`, `fi_ep_bind`,
//! `fi_enable`, `fi_getname`, `fi_av_insert`, `fi_write`, `fi_tsend`, `fi_trecv`,
//! `fi_cq_read`, `fi_cq_readerr`, `fi_close`, …) is a `static inline` wrapper that calls
//! through a provider's ops table, e.g. `fi_write(ep, …)` is `ep->rma->write(ep, …)`. This file
//! lays out those tables (only up to the entries used; a table is never allocated here, only
//! read through a pointer the provider returned) and [`op`] reads an entry the way the
//! headers' `FI_CHECK_OP` does: the table must be non-null, long enough (its `size` word) and
//! the entry set.
//!
//! Every size and offset relied on is asserted at compile time for LP64 targets (x86-64,
//! aarch64), with the values a C compiler gives for the installed headers (checked against
//! libfabric 1.17's headers).

#![allow(non_camel_case_types, dead_code)]

use std::ffi::{CStr, c_char, c_int, c_void};
use std::mem::{offset_of, size_of};
use std::sync::OnceLock;

use crate::connection::network::Library;

/// `FI_VERSION(major, minor)`.
pub const fn fi_version(major: u32, minor: u32) -> u32 {
    (major << 16) | minor
}

// ---- capability and mode bits (fabric.h) ----
pub const FI_MSG: u64 = 1 << 1;
pub const FI_RMA: u64 = 1 << 2;
pub const FI_TAGGED: u64 = 1 << 3;
pub const FI_READ: u64 = 1 << 8;
pub const FI_WRITE: u64 = 1 << 9;
pub const FI_RECV: u64 = 1 << 10;
pub const FI_SEND: u64 = 1 << 11;
pub const FI_TRANSMIT: u64 = FI_SEND;
pub const FI_REMOTE_READ: u64 = 1 << 12;
pub const FI_REMOTE_WRITE: u64 = 1 << 13;
pub const FI_HMEM: u64 = 1 << 47;
pub const FI_CONTEXT: u64 = 1 << 59;
pub const FI_CONTEXT2: u64 = 1 << 52;

// ---- memory registration modes (fabric.h `fi_mr_mode` and its bits) ----
pub const FI_MR_LOCAL: c_int = 1 << 2;
pub const FI_MR_RAW: c_int = 1 << 3;
pub const FI_MR_VIRT_ADDR: c_int = 1 << 4;
pub const FI_MR_ALLOCATED: c_int = 1 << 5;
pub const FI_MR_PROV_KEY: c_int = 1 << 6;
pub const FI_MR_ENDPOINT: c_int = 1 << 9;
pub const FI_MR_HMEM: c_int = 1 << 10;

// ---- message ordering (fabric.h) ----
pub const FI_ORDER_SAW: u64 = 1 << 7;

// ---- enums (fabric.h, fi_eq.h, fi_domain.h) ----
pub const FI_EP_RDM: u32 = 3;
pub const FI_THREAD_DOMAIN: u32 = 3;
pub const FI_AV_TABLE: u32 = 2;
pub const FI_CQ_FORMAT_TAGGED: u32 = 4;
pub const FI_WAIT_NONE: u32 = 0;
pub const FI_HMEM_SYSTEM: u32 = 0;
pub const FI_HMEM_CUDA: u32 = 1;
pub const FI_ENABLE: c_int = 6;
pub const FI_ADDR_UNSPEC: u64 = u64::MAX;

// ---- error codes (fi_errno.h: errno values, and libfabric's own from 256) ----
pub const FI_EAGAIN: isize = 11;
pub const FI_EAVAIL: isize = 259;

/// `struct fi_tx_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FiTxAttr {
    pub caps: u64,
    pub mode: u64,
    pub op_flags: u64,
    pub msg_order: u64,
    pub comp_order: u64,
    pub inject_size: usize,
    pub size: usize,
    pub iov_limit: usize,
    pub rma_iov_limit: usize,
    pub tclass: u32,
}

/// `struct fi_rx_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FiRxAttr {
    pub caps: u64,
    pub mode: u64,
    pub op_flags: u64,
    pub msg_order: u64,
    pub comp_order: u64,
    pub total_buffered_recv: usize,
    pub size: usize,
    pub iov_limit: usize,
}

/// `struct fi_ep_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FiEpAttr {
    pub type_: u32,
    pub protocol: u32,
    pub protocol_version: u32,
    pub max_msg_size: usize,
    pub msg_prefix_size: usize,
    pub max_order_raw_size: usize,
    pub max_order_war_size: usize,
    pub max_order_waw_size: usize,
    pub mem_tag_format: u64,
    pub tx_ctx_cnt: usize,
    pub rx_ctx_cnt: usize,
    pub auth_key_size: usize,
    pub auth_key: *mut u8,
}

/// `struct fi_domain_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FiDomainAttr {
    pub domain: *mut c_void,
    pub name: *mut c_char,
    pub threading: u32,
    pub control_progress: u32,
    pub data_progress: u32,
    pub resource_mgmt: u32,
    pub av_type: u32,
    pub mr_mode: c_int,
    pub mr_key_size: usize,
    pub cq_data_size: usize,
    pub cq_cnt: usize,
    pub ep_cnt: usize,
    pub tx_ctx_cnt: usize,
    pub rx_ctx_cnt: usize,
    pub max_ep_tx_ctx: usize,
    pub max_ep_rx_ctx: usize,
    pub max_ep_stx_ctx: usize,
    pub max_ep_srx_ctx: usize,
    pub cntr_cnt: usize,
    pub mr_iov_limit: usize,
    pub caps: u64,
    pub mode: u64,
    pub auth_key: *mut u8,
    pub auth_key_size: usize,
    pub max_err_data: usize,
    pub mr_cnt: usize,
    pub tclass: u32,
}

/// `struct fi_fabric_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FiFabricAttr {
    pub fabric: *mut FidFabric,
    pub name: *mut c_char,
    pub prov_name: *mut c_char,
    pub prov_version: u32,
    pub api_version: u32,
}

/// `struct fi_info` (a list, linked by `next`; allocated and freed by libfabric only).
#[repr(C)]
#[derive(Debug)]
pub struct FiInfo {
    pub next: *mut FiInfo,
    pub caps: u64,
    pub mode: u64,
    pub addr_format: u32,
    pub src_addrlen: usize,
    pub dest_addrlen: usize,
    pub src_addr: *mut c_void,
    pub dest_addr: *mut c_void,
    pub handle: *mut Fid,
    pub tx_attr: *mut FiTxAttr,
    pub rx_attr: *mut FiRxAttr,
    pub ep_attr: *mut FiEpAttr,
    pub domain_attr: *mut FiDomainAttr,
    pub fabric_attr: *mut FiFabricAttr,
    pub nic: *mut c_void,
}

/// `struct fi_ops`: the operations every fabric object has.
#[repr(C)]
pub struct FiOps {
    pub size: usize,
    pub close: Option<unsafe extern "C" fn(*mut Fid) -> c_int>,
    pub bind: Option<unsafe extern "C" fn(*mut Fid, *mut Fid, u64) -> c_int>,
    pub control: Option<unsafe extern "C" fn(*mut Fid, c_int, *mut c_void) -> c_int>,
}

/// `struct fid`: the head of every fabric object.
#[repr(C)]
pub struct Fid {
    pub fclass: usize,
    pub context: *mut c_void,
    pub ops: *mut FiOps,
}

/// `struct fi_ops_fabric` up to `domain`.
#[repr(C)]
pub struct FiOpsFabric {
    pub size: usize,
    pub domain: Option<
        unsafe extern "C" fn(
            *mut FidFabric,
            *mut FiInfo,
            *mut *mut FidDomain,
            *mut c_void,
        ) -> c_int,
    >,
}

/// `struct fid_fabric`.
#[repr(C)]
pub struct FidFabric {
    pub fid: Fid,
    pub ops: *mut FiOpsFabric,
    pub api_version: u32,
}

/// `struct fi_ops_domain` up to `endpoint`.
#[repr(C)]
pub struct FiOpsDomain {
    pub size: usize,
    pub av_open: Option<
        unsafe extern "C" fn(*mut FidDomain, *mut FiAvAttr, *mut *mut FidAv, *mut c_void) -> c_int,
    >,
    pub cq_open: Option<
        unsafe extern "C" fn(*mut FidDomain, *mut FiCqAttr, *mut *mut FidCq, *mut c_void) -> c_int,
    >,
    pub endpoint: Option<
        unsafe extern "C" fn(*mut FidDomain, *mut FiInfo, *mut *mut FidEp, *mut c_void) -> c_int,
    >,
}

/// `struct fi_ops_mr` up to `regattr`.
#[repr(C)]
pub struct FiOpsMr {
    pub size: usize,
    pub reg: *mut c_void,
    pub regv: *mut c_void,
    pub regattr:
        Option<unsafe extern "C" fn(*mut Fid, *const FiMrAttr, u64, *mut *mut FidMr) -> c_int>,
}

/// `struct fid_domain`.
#[repr(C)]
pub struct FidDomain {
    pub fid: Fid,
    pub ops: *mut FiOpsDomain,
    pub mr: *mut FiOpsMr,
}

/// `struct iovec`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct IoVec {
    pub base: *mut c_void,
    pub len: usize,
}

/// `struct fi_mr_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FiMrAttr {
    pub mr_iov: *const IoVec,
    pub iov_count: usize,
    pub access: u64,
    pub offset: u64,
    pub requested_key: u64,
    pub context: *mut c_void,
    pub auth_key_size: usize,
    pub auth_key: *mut u8,
    pub iface: u32,
    /// The `device` union (`int cuda` in its low bytes).
    pub device: u64,
}

/// `struct fid_mr`.
#[repr(C)]
pub struct FidMr {
    pub fid: Fid,
    pub mem_desc: *mut c_void,
    pub key: u64,
}

/// `struct fi_av_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FiAvAttr {
    pub type_: u32,
    pub rx_ctx_bits: c_int,
    pub count: usize,
    pub ep_per_node: usize,
    pub name: *const c_char,
    pub map_addr: *mut c_void,
    pub flags: u64,
}

/// `struct fi_ops_av` up to `insert`.
#[repr(C)]
pub struct FiOpsAv {
    pub size: usize,
    pub insert: Option<
        unsafe extern "C" fn(*mut FidAv, *const c_void, usize, *mut u64, u64, *mut c_void) -> c_int,
    >,
}

/// `struct fid_av`.
#[repr(C)]
pub struct FidAv {
    pub fid: Fid,
    pub ops: *mut FiOpsAv,
}

/// `struct fi_cq_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FiCqAttr {
    pub size: usize,
    pub flags: u64,
    pub format: u32,
    pub wait_obj: u32,
    pub signaling_vector: c_int,
    pub wait_cond: u32,
    pub wait_set: *mut c_void,
}

/// `struct fi_cq_tagged_entry` (the format this transport opens its CQ with).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FiCqTaggedEntry {
    pub op_context: *mut c_void,
    pub flags: u64,
    pub len: usize,
    pub buf: *mut c_void,
    pub data: u64,
    pub tag: u64,
}

impl Default for FiCqTaggedEntry {
    fn default() -> Self {
        Self {
            op_context: std::ptr::null_mut(),
            flags: 0,
            len: 0,
            buf: std::ptr::null_mut(),
            data: 0,
            tag: 0,
        }
    }
}

/// `struct fi_cq_err_entry`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FiCqErrEntry {
    pub op_context: *mut c_void,
    pub flags: u64,
    pub len: usize,
    pub buf: *mut c_void,
    pub data: u64,
    pub tag: u64,
    pub olen: usize,
    pub err: c_int,
    pub prov_errno: c_int,
    pub err_data: *mut c_void,
    pub err_data_size: usize,
}

impl Default for FiCqErrEntry {
    fn default() -> Self {
        Self {
            op_context: std::ptr::null_mut(),
            flags: 0,
            len: 0,
            buf: std::ptr::null_mut(),
            data: 0,
            tag: 0,
            olen: 0,
            err: 0,
            prov_errno: 0,
            err_data: std::ptr::null_mut(),
            err_data_size: 0,
        }
    }
}

/// `struct fi_ops_cq` up to `strerror`.
#[repr(C)]
pub struct FiOpsCq {
    pub size: usize,
    pub read: Option<unsafe extern "C" fn(*mut FidCq, *mut c_void, usize) -> isize>,
    pub readfrom: *mut c_void,
    pub readerr: Option<unsafe extern "C" fn(*mut FidCq, *mut FiCqErrEntry, u64) -> isize>,
    pub sread: *mut c_void,
    pub sreadfrom: *mut c_void,
    pub signal: *mut c_void,
    pub strerror: Option<
        unsafe extern "C" fn(*mut FidCq, c_int, *const c_void, *mut c_char, usize) -> *const c_char,
    >,
}

/// `struct fid_cq`.
#[repr(C)]
pub struct FidCq {
    pub fid: Fid,
    pub ops: *mut FiOpsCq,
}

/// `struct fi_ops_cm` up to `getname`.
#[repr(C)]
pub struct FiOpsCm {
    pub size: usize,
    pub setname: *mut c_void,
    pub getname: Option<unsafe extern "C" fn(*mut Fid, *mut c_void, *mut usize) -> c_int>,
}

/// `struct fi_ops_rma` up to `write`.
#[repr(C)]
pub struct FiOpsRma {
    pub size: usize,
    pub read: *mut c_void,
    pub readv: *mut c_void,
    pub readmsg: *mut c_void,
    #[allow(clippy::type_complexity)]
    pub write: Option<
        unsafe extern "C" fn(
            *mut FidEp,
            *const c_void,
            usize,
            *mut c_void,
            u64,
            u64,
            u64,
            *mut c_void,
        ) -> isize,
    >,
}

/// `struct fi_ops_tagged` up to `send`.
#[repr(C)]
pub struct FiOpsTagged {
    pub size: usize,
    #[allow(clippy::type_complexity)]
    pub recv: Option<
        unsafe extern "C" fn(
            *mut FidEp,
            *mut c_void,
            usize,
            *mut c_void,
            u64,
            u64,
            u64,
            *mut c_void,
        ) -> isize,
    >,
    pub recvv: *mut c_void,
    pub recvmsg: *mut c_void,
    #[allow(clippy::type_complexity)]
    pub send: Option<
        unsafe extern "C" fn(
            *mut FidEp,
            *const c_void,
            usize,
            *mut c_void,
            u64,
            u64,
            *mut c_void,
        ) -> isize,
    >,
}

/// `struct fid_ep`.
#[repr(C)]
pub struct FidEp {
    pub fid: Fid,
    pub ops: *mut c_void,
    pub cm: *mut FiOpsCm,
    pub msg: *mut c_void,
    pub rma: *mut FiOpsRma,
    pub tagged: *mut FiOpsTagged,
    pub atomic: *mut c_void,
    pub collective: *mut c_void,
}

/// `struct fi_context2`: the per-operation scratch a provider in `FI_CONTEXT2` mode may use;
/// every operation this transport posts gets one of its own as its context.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FiContext2 {
    pub internal: [*mut c_void; 8],
}

impl Default for FiContext2 {
    fn default() -> Self {
        Self {
            internal: [std::ptr::null_mut(); 8],
        }
    }
}

/// The entry `$field` of the ops table `$table` (a pointer to `$ty`), as `FI_CHECK_OP` reads
/// it: `None` when the table is null, shorter than the entry, or the entry is unset.
///
/// # Safety
/// `$table` is null or points at a live ops table of type `$ty` whose `size` word is correct.
macro_rules! op {
    ($table:expr, $ty:ty, $field:ident) => {{
        let t: *const $ty = $table;
        if t.is_null() || (*t).size <= ::std::mem::offset_of!($ty, $field) {
            None
        } else {
            (*t).$field
        }
    }};
}
pub(crate) use op;

// The libfabric ABI as laid out on LP64 targets (values from a C compiler on the headers).
#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(size_of::<FiTxAttr>() == 80 && offset_of!(FiTxAttr, tclass) == 72);
    assert!(size_of::<FiRxAttr>() == 64);
    assert!(size_of::<FiEpAttr>() == 96 && offset_of!(FiEpAttr, max_msg_size) == 16);
    assert!(offset_of!(FiEpAttr, auth_key) == 88);
    assert!(size_of::<FiDomainAttr>() == 192);
    assert!(offset_of!(FiDomainAttr, threading) == 16 && offset_of!(FiDomainAttr, mr_mode) == 36);
    assert!(offset_of!(FiDomainAttr, mr_key_size) == 40);
    assert!(offset_of!(FiDomainAttr, cq_data_size) == 48);
    assert!(offset_of!(FiDomainAttr, caps) == 136 && offset_of!(FiDomainAttr, mode) == 144);
    assert!(offset_of!(FiDomainAttr, mr_cnt) == 176 && offset_of!(FiDomainAttr, tclass) == 184);
    assert!(size_of::<FiFabricAttr>() == 32);
    assert!(size_of::<FiInfo>() == 120 && offset_of!(FiInfo, addr_format) == 24);
    assert!(offset_of!(FiInfo, src_addrlen) == 32 && offset_of!(FiInfo, tx_attr) == 72);
    assert!(offset_of!(FiInfo, domain_attr) == 96 && offset_of!(FiInfo, fabric_attr) == 104);
    assert!(offset_of!(FiInfo, nic) == 112);
    assert!(size_of::<Fid>() == 24 && offset_of!(FiOps, control) == 24);
    assert!(size_of::<FidFabric>() == 40 && offset_of!(FiOpsFabric, domain) == 8);
    assert!(size_of::<FidDomain>() == 40 && offset_of!(FiOpsDomain, endpoint) == 24);
    assert!(offset_of!(FiOpsMr, regattr) == 24);
    assert!(size_of::<FidMr>() == 40 && offset_of!(FidMr, key) == 32);
    assert!(size_of::<FiMrAttr>() == 80 && offset_of!(FiMrAttr, iface) == 64);
    assert!(offset_of!(FiMrAttr, device) == 72);
    assert!(size_of::<FidAv>() == 32 && size_of::<FiAvAttr>() == 48);
    assert!(offset_of!(FiOpsAv, insert) == 8);
    assert!(size_of::<FidCq>() == 32 && size_of::<FiCqAttr>() == 40);
    assert!(offset_of!(FiOpsCq, read) == 8 && offset_of!(FiOpsCq, readerr) == 24);
    assert!(offset_of!(FiOpsCq, strerror) == 56);
    assert!(size_of::<FiCqTaggedEntry>() == 48 && size_of::<FiCqErrEntry>() == 80);
    assert!(offset_of!(FiCqErrEntry, err) == 56 && offset_of!(FiCqErrEntry, err_data) == 64);
    assert!(size_of::<FidEp>() == 80 && offset_of!(FidEp, cm) == 32);
    assert!(offset_of!(FidEp, rma) == 48 && offset_of!(FidEp, tagged) == 56);
    assert!(offset_of!(FiOpsCm, getname) == 16);
    assert!(offset_of!(FiOpsRma, write) == 32);
    assert!(offset_of!(FiOpsTagged, recv) == 8 && offset_of!(FiOpsTagged, send) == 32);
    assert!(size_of::<FiContext2>() == 64);
};

type GetInfo = unsafe extern "C" fn(
    u32,
    *const c_char,
    *const c_char,
    u64,
    *const FiInfo,
    *mut *mut FiInfo,
) -> c_int;
type FreeInfo = unsafe extern "C" fn(*mut FiInfo);
type DupInfo = unsafe extern "C" fn(*const FiInfo) -> *mut FiInfo;
type Fabric = unsafe extern "C" fn(*mut FiFabricAttr, *mut *mut FidFabric, *mut c_void) -> c_int;
type StrError = unsafe extern "C" fn(c_int) -> *const c_char;
type Version = unsafe extern "C" fn() -> u32;

/// The exported functions of libfabric this transport calls (`FABRIC_1.0` and later; signatures
/// as in fabric.h).
pub struct Lib {
    pub getinfo: GetInfo,
    pub freeinfo: FreeInfo,
    pub dupinfo: DupInfo,
    pub fabric: Fabric,
    pub strerror: StrError,
    pub version: Version,
    /// The library (never closed: the functions above stay valid).
    lib: Library,
}

/// The shared object opened unless [`ENV_LIBRARY`](super::ENV_LIBRARY) names another.
pub const LIBRARY: &str = "libfabric.so.1";

impl Lib {
    fn open(path: &str) -> Result<Self, String> {
        let lib = Library::open(path)?;
        // SAFETY (every `function` below): the type named is the C signature of that exported
        // libfabric function in fabric.h.
        unsafe {
            Ok(Self {
                getinfo: lib.function::<GetInfo>("fi_getinfo")?,
                freeinfo: lib.function::<FreeInfo>("fi_freeinfo")?,
                dupinfo: lib.function::<DupInfo>("fi_dupinfo")?,
                fabric: lib.function::<Fabric>("fi_fabric")?,
                strerror: lib.function::<StrError>("fi_strerror")?,
                version: lib.function::<Version>("fi_version")?,
                lib,
            })
        }
    }

    /// Where it was loaded from (the name given to `dlopen`).
    pub fn path(&self) -> &str {
        self.lib.name()
    }
}

/// libfabric, loaded at the first call (from [`ENV_LIBRARY`](super::ENV_LIBRARY) when set,
/// else [`LIBRARY`]); the reason it is not available otherwise.
pub fn lib() -> Result<&'static Lib, String> {
    static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();
    LIB.get_or_init(|| {
        let path = std::env::var(super::ENV_LIBRARY)
            .ok()
            .filter(|p| !p.trim().is_empty())
            .unwrap_or_else(|| LIBRARY.to_owned());
        Lib::open(&path)
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// `fi_strerror(code)` as a string (`code` positive or negative).
pub fn strerror(lib: &Lib, code: isize) -> String {
    let c = c_int::try_from(code.unsigned_abs()).unwrap_or(c_int::MAX);
    // SAFETY: fi_strerror returns a pointer to a static NUL-terminated string for any value.
    let p = unsafe { (lib.strerror)(c) };
    if p.is_null() {
        format!("error {code}")
    } else {
        // SAFETY: non-null, NUL-terminated, static.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// A NUL-terminated C string owned by libfabric (or null) as a Rust string.
///
/// # Safety
/// `p` is null or a NUL-terminated string that stays valid for the call.
pub unsafe fn c_str(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: the caller's contract.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}
