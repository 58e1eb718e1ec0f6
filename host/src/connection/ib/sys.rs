//! Raw layer: the few libibverbs structs this transport touches, declared from the verbs ABI
//! (rdma-core `libibverbs/verbs.h`), and the library itself, opened with `dlopen` at run time (the
//! network transports' shared loader).
//!
//! Only the fields we read or write are named; the rest is padding, and every size and offset
//! we rely on is asserted at compile time (x86-64 / aarch64 LP64). Structs that libibverbs
//! allocates (`ibv_context`, `ibv_qp`, `ibv_cq`, `ibv_mr`) are declared as prefixes and only
//! ever used behind pointers it returned.
//!
//! `ibv_post_send` and `ibv_poll_cq` are `static inline` in `verbs.h`: they are not exported
//! symbols but calls through the provider's function table, `qp->context->ops.post_send` and
//! `cq->context->ops.poll_cq`. [`IbvContextOps`] lays out that table (index 11 `poll_cq`,
//! index 25 `post_send`) and `verbs.rs` calls through it exactly as the inline functions do.
//! Likewise `ibv_query_port` is a macro over an inline wrapper; the exported symbol of that name
//! is the compatibility entry point, which fills the old (shorter) `ibv_port_attr`. We pass it a
//! larger zeroed buffer and read only fields of the common prefix.

#![allow(non_camel_case_types, dead_code)]

use std::ffi::{c_char, c_int, c_void};
use std::mem::{offset_of, size_of};
use std::sync::OnceLock;

use crate::connection::network::Library;

/// `ibv_gid`: 16 raw bytes (aligned 8: the union also holds two `__be64`).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IbvGid {
    pub raw: [u8; 16],
}

/// Prefix of `struct ibv_context`: the device pointer and the provider's ops table.
#[repr(C)]
pub struct IbvContext {
    pub device: *mut c_void,
    pub ops: IbvContextOps,
}

/// `struct ibv_context_ops` up to `post_send` (index 25).
#[repr(C)]
pub struct IbvContextOps {
    _compat0_10: [*mut c_void; 11],
    pub poll_cq: Option<unsafe extern "C" fn(*mut IbvCq, c_int, *mut IbvWc) -> c_int>,
    _req_notify_to_compat_destroy_qp: [*mut c_void; 13],
    pub post_send:
        Option<unsafe extern "C" fn(*mut IbvQp, *mut IbvSendWr, *mut *mut IbvSendWr) -> c_int>,
}

/// Prefix of `struct ibv_cq`.
#[repr(C)]
pub struct IbvCq {
    pub context: *mut IbvContext,
}

/// Prefix of `struct ibv_qp` (up to `qp_type`).
#[repr(C)]
pub struct IbvQp {
    pub context: *mut IbvContext,
    pub qp_context: *mut c_void,
    pub pd: *mut c_void,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
    pub state: u32,
    pub qp_type: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct IbvMr {
    pub context: *mut IbvContext,
    pub pd: *mut c_void,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvQpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub struct IbvQpInitAttr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut c_void,
    pub cap: IbvQpCap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvGlobalRoute {
    pub dgid: IbvGid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvAhAttr {
    pub grh: IbvGlobalRoute,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvQpAttr {
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    pub cap: IbvQpCap,
    pub ah_attr: IbvAhAttr,
    pub alt_ah_attr: IbvAhAttr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvSge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `wr.rdma` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvWrRdma {
    pub remote_addr: u64,
    pub rkey: u32,
}

/// `wr.atomic` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvWrAtomic {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

/// The `wr` union of `struct ibv_send_wr` (`ud` is not used).
#[repr(C)]
#[derive(Clone, Copy)]
pub union IbvWrUnion {
    pub rdma: IbvWrRdma,
    pub atomic: IbvWrAtomic,
}

/// `struct ibv_send_wr`.
#[repr(C)]
pub struct IbvSendWr {
    pub wr_id: u64,
    pub next: *mut IbvSendWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
    pub opcode: u32,
    pub send_flags: u32,
    pub imm_data: u32,
    pub wr: IbvWrUnion,
    _qp_type: u32,
    _bind_mw_or_tso: [u64; 6],
}

impl IbvSendWr {
    /// A zeroed work request.
    pub fn zeroed() -> Self {
        Self {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
            opcode: 0,
            send_flags: 0,
            imm_data: 0,
            wr: IbvWrUnion {
                atomic: IbvWrAtomic {
                    remote_addr: 0,
                    compare_add: 0,
                    swap: 0,
                    rkey: 0,
                },
            },
            _qp_type: 0,
            _bind_mw_or_tso: [0; 6],
        }
    }
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvWc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

// Offsets of `struct ibv_port_attr` (common prefix of the old and new layouts).
/// `state` (u32).
pub const PORT_ATTR_STATE: usize = 0;
/// `active_mtu` (u32).
pub const PORT_ATTR_ACTIVE_MTU: usize = 8;
/// `lid` (u16).
pub const PORT_ATTR_LID: usize = 34;
/// `link_layer` (u8).
pub const PORT_ATTR_LINK_LAYER: usize = 46;
/// Bytes we hand to `ibv_query_port` (the struct is 52 bytes today; room to grow).
pub const PORT_ATTR_BUF: usize = 256;

// Constants of verbs.h.
pub const IBV_QPT_RC: u32 = 2;
pub const IBV_QPS_RESET: u32 = 0;
pub const IBV_QPS_INIT: u32 = 1;
pub const IBV_QPS_RTR: u32 = 2;
pub const IBV_QPS_RTS: u32 = 3;
pub const IBV_QPS_ERR: u32 = 6;
pub const IBV_QP_STATE: c_int = 1;
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
pub const IBV_QP_AV: c_int = 1 << 7;
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;
pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_int = 1 << 1;
pub const IBV_ACCESS_REMOTE_READ: c_int = 1 << 2;
pub const IBV_ACCESS_REMOTE_ATOMIC: c_int = 1 << 3;
pub const IBV_WR_RDMA_WRITE: u32 = 0;
pub const IBV_WR_ATOMIC_FETCH_AND_ADD: u32 = 6;
pub const IBV_SEND_SIGNALED: u32 = 1 << 1;
pub const IBV_PORT_ACTIVE: u32 = 4;
pub const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;

/// Name of an `ibv_wc_status` value.
pub fn wc_status_name(status: u32) -> &'static str {
    const NAMES: [&str; 24] = [
        "IBV_WC_SUCCESS",
        "IBV_WC_LOC_LEN_ERR",
        "IBV_WC_LOC_QP_OP_ERR",
        "IBV_WC_LOC_EEC_OP_ERR",
        "IBV_WC_LOC_PROT_ERR",
        "IBV_WC_WR_FLUSH_ERR",
        "IBV_WC_MW_BIND_ERR",
        "IBV_WC_BAD_RESP_ERR",
        "IBV_WC_LOC_ACCESS_ERR",
        "IBV_WC_REM_INV_REQ_ERR",
        "IBV_WC_REM_ACCESS_ERR",
        "IBV_WC_REM_OP_ERR",
        "IBV_WC_RETRY_EXC_ERR",
        "IBV_WC_RNR_RETRY_EXC_ERR",
        "IBV_WC_LOC_RDD_VIOL_ERR",
        "IBV_WC_REM_INV_RD_REQ_ERR",
        "IBV_WC_REM_ABORT_ERR",
        "IBV_WC_INV_EECN_ERR",
        "IBV_WC_INV_EEC_STATE_ERR",
        "IBV_WC_FATAL_ERR",
        "IBV_WC_RESP_TIMEOUT_ERR",
        "IBV_WC_GENERAL_ERR",
        "IBV_WC_TM_ERR",
        "IBV_WC_TM_RNDV_INCOMPLETE",
    ];
    NAMES
        .get(status as usize)
        .copied()
        .unwrap_or("unknown status")
}

// The verbs ABI, as laid out on LP64 targets (what verbs.h gives with GCC/Clang).
#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(size_of::<IbvGid>() == 16);
    assert!(offset_of!(IbvContext, ops) == 8);
    assert!(offset_of!(IbvContextOps, poll_cq) == 11 * 8);
    assert!(offset_of!(IbvContextOps, post_send) == 25 * 8);
    assert!(offset_of!(IbvQp, qp_num) == 52);
    assert!(offset_of!(IbvMr, lkey) == 36 && offset_of!(IbvMr, rkey) == 40);
    assert!(size_of::<IbvMr>() == 48);
    assert!(offset_of!(IbvQpInitAttr, cap) == 32 && offset_of!(IbvQpInitAttr, qp_type) == 52);
    assert!(size_of::<IbvQpInitAttr>() == 64);
    assert!(size_of::<IbvGlobalRoute>() == 24 && size_of::<IbvAhAttr>() == 32);
    assert!(offset_of!(IbvAhAttr, dlid) == 24 && offset_of!(IbvAhAttr, port_num) == 30);
    assert!(offset_of!(IbvQpAttr, cap) == 36 && offset_of!(IbvQpAttr, ah_attr) == 56);
    assert!(offset_of!(IbvQpAttr, alt_ah_attr) == 88 && offset_of!(IbvQpAttr, pkey_index) == 120);
    assert!(offset_of!(IbvQpAttr, max_rd_atomic) == 126);
    assert!(offset_of!(IbvQpAttr, min_rnr_timer) == 128 && offset_of!(IbvQpAttr, port_num) == 129);
    assert!(offset_of!(IbvQpAttr, timeout) == 130 && offset_of!(IbvQpAttr, rnr_retry) == 132);
    assert!(offset_of!(IbvQpAttr, rate_limit) == 136 && size_of::<IbvQpAttr>() == 144);
    assert!(size_of::<IbvSge>() == 16);
    assert!(offset_of!(IbvSendWr, sg_list) == 16 && offset_of!(IbvSendWr, opcode) == 28);
    assert!(offset_of!(IbvSendWr, send_flags) == 32 && offset_of!(IbvSendWr, wr) == 40);
    assert!(size_of::<IbvWrUnion>() == 32 && size_of::<IbvSendWr>() == 128);
    assert!(offset_of!(IbvWrAtomic, rkey) == 24 && offset_of!(IbvWrRdma, rkey) == 8);
    assert!(offset_of!(IbvWc, status) == 8 && offset_of!(IbvWc, vendor_err) == 16);
    assert!(size_of::<IbvWc>() == 48);
};

type GetDeviceList = unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void;
type FreeDeviceList = unsafe extern "C" fn(*mut *mut c_void);
type GetDeviceName = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type OpenDevice = unsafe extern "C" fn(*mut c_void) -> *mut IbvContext;
type CloseDevice = unsafe extern "C" fn(*mut IbvContext) -> c_int;
type QueryPort = unsafe extern "C" fn(*mut IbvContext, u8, *mut c_void) -> c_int;
type QueryGid = unsafe extern "C" fn(*mut IbvContext, u8, c_int, *mut IbvGid) -> c_int;
type AllocPd = unsafe extern "C" fn(*mut IbvContext) -> *mut c_void;
type DeallocPd = unsafe extern "C" fn(*mut c_void) -> c_int;
type RegMr = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int) -> *mut IbvMr;
type DeregMr = unsafe extern "C" fn(*mut IbvMr) -> c_int;
type CreateCq =
    unsafe extern "C" fn(*mut IbvContext, c_int, *mut c_void, *mut c_void, c_int) -> *mut IbvCq;
type DestroyCq = unsafe extern "C" fn(*mut IbvCq) -> c_int;
type CreateQp = unsafe extern "C" fn(*mut c_void, *mut IbvQpInitAttr) -> *mut IbvQp;
type ModifyQp = unsafe extern "C" fn(*mut IbvQp, *mut IbvQpAttr, c_int) -> c_int;
type DestroyQp = unsafe extern "C" fn(*mut IbvQp) -> c_int;

/// The functions of libibverbs this transport calls (all exported symbols of `IBVERBS_1.1`;
/// signatures as in verbs.h).
pub struct Lib {
    pub get_device_list: GetDeviceList,
    pub free_device_list: FreeDeviceList,
    pub get_device_name: GetDeviceName,
    pub open_device: OpenDevice,
    pub close_device: CloseDevice,
    pub query_port: QueryPort,
    pub query_gid: QueryGid,
    pub alloc_pd: AllocPd,
    pub dealloc_pd: DeallocPd,
    pub reg_mr: RegMr,
    pub dereg_mr: DeregMr,
    pub create_cq: CreateCq,
    pub destroy_cq: DestroyCq,
    pub create_qp: CreateQp,
    pub modify_qp: ModifyQp,
    pub destroy_qp: DestroyQp,
}

/// The shared object we open.
pub const LIBRARY: &str = "libibverbs.so.1";

impl Lib {
    fn open() -> Result<Self, String> {
        let lib = Library::open(LIBRARY)?;
        // SAFETY (every `function` below): the type named is the C signature of that exported
        // verbs function in verbs.h. The library is never closed (the loader's contract), so
        // the pointers stay valid for the whole process.
        unsafe {
            Ok(Self {
                get_device_list: lib.function::<GetDeviceList>("ibv_get_device_list")?,
                free_device_list: lib.function::<FreeDeviceList>("ibv_free_device_list")?,
                get_device_name: lib.function::<GetDeviceName>("ibv_get_device_name")?,
                open_device: lib.function::<OpenDevice>("ibv_open_device")?,
                close_device: lib.function::<CloseDevice>("ibv_close_device")?,
                query_port: lib.function::<QueryPort>("ibv_query_port")?,
                query_gid: lib.function::<QueryGid>("ibv_query_gid")?,
                alloc_pd: lib.function::<AllocPd>("ibv_alloc_pd")?,
                dealloc_pd: lib.function::<DeallocPd>("ibv_dealloc_pd")?,
                reg_mr: lib.function::<RegMr>("ibv_reg_mr")?,
                dereg_mr: lib.function::<DeregMr>("ibv_dereg_mr")?,
                create_cq: lib.function::<CreateCq>("ibv_create_cq")?,
                destroy_cq: lib.function::<DestroyCq>("ibv_destroy_cq")?,
                create_qp: lib.function::<CreateQp>("ibv_create_qp")?,
                modify_qp: lib.function::<ModifyQp>("ibv_modify_qp")?,
                destroy_qp: lib.function::<DestroyQp>("ibv_destroy_qp")?,
            })
        }
    }
}

/// libibverbs, loaded at the first call; the reason it is not available otherwise.
pub fn lib() -> Result<&'static Lib, String> {
    static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();
    LIB.get_or_init(Lib::open).as_ref().map_err(Clone::clone)
}
