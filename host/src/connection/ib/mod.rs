//! `IbConnection`: the `Ib` transport — RDMA over InfiniBand or RoCE through libibverbs, which
//! is opened with `dlopen("libibverbs.so.1")` at run time (feature `ib`; no build-time
//! rdma-core, no bindgen).
//!
//! **Status: this code has not run on RDMA hardware.** It builds, its wire format, device
//! selection, queue-pair state logic and error mapping are unit-tested, and connecting without
//! libibverbs (or without a device) is tested to fail with [`Error::IbUnavailable`]. The verbs
//! struct layouts are declared from rdma-core's `verbs.h` and checked at compile time
//! (`sys.rs`), but no work request has been posted to a real HCA. Treat the data path as a
//! reviewed draft until it has run on one.
//!
//! # Layers
//!
//! | file | holds |
//! |---|---|
//! | `sys.rs` | the raw structs (prefixes where libibverbs allocates), constants, the `dlopen`ed function table; `ibv_post_send`/`ibv_poll_cq` are inline in `verbs.h`, so they are called through `context->ops` as the inline functions do |
//! | `verbs.rs` | one `Result` function per verb ([`Error::IbVerb`] names the verb and device) and RAII owners whose `Drop` logs, never panics |
//! | `mod.rs` | device selection, [`QpInfo`] wire format, QP state transitions, [`IbConnection`] |
//!
//! # Set-up (inside `Communicator::connect`)
//!
//! 1. *Prepare* (before the endpoints cross): pick the device and port ([`select_device`]:
//!    `MSCCLPP_IB_DEVICE=name[:port][,name[:port]…]`, entry `i` for `Ib(i)`, a single entry for
//!    all; else the `i`-th device libibverbs lists, port 1), check the port is active, read the
//!    GID at `MSCCLPP_IB_GID_INDEX` (default 0), allocate a PD, a CQ, an RC QP (moved to INIT),
//!    register every memory this communicator registered for `Ib(i)` so far, and put a
//!    [`QpInfo`] (QP number, PSN, LID, GID, MTU, and the memory table: id, address, size, rkey)
//!    into the endpoint's `extra`.
//! 2. *Establish*: decode and check the peer's [`QpInfo`], move the QP to RTR (path to the
//!    peer) and RTS; then a bootstrap round trip, so neither side writes before the other's QP
//!    can receive.
//!
//! # Data path
//!
//! - `write`: one signaled `IBV_WR_RDMA_WRITE` per ≤ 1 GiB piece, from the local region of
//!   `src` (its lkey) to the peer's region of `dst` (its rkey from the peer's table). Both ranges
//!   are checked against the registered sizes first; the HCA enforces the regions again.
//! - `update_and_sync`: `src.swap(new)` gives the old value; one signaled
//!   `IBV_WR_ATOMIC_FETCH_AND_ADD` of `new - old` (wrapping) on the peer's word, as MSCCL++ does.
//!   On an RC QP it executes after the earlier writes of the QP. It assumes the peer's word only
//!   changes through this connection.
//! - `flush(timeout)`: polls the CQ until every posted request has completed, or the timeout
//!   passes ([`Error::FlushTimeout`]). A completion with an error status puts the connection in a
//!   sticky [`Error::IbCompletion`].
//! - The send queue holds 1024 requests (`verbs::MAX_SEND_WR`); a post that finds it full
//!   polls first (bounded by the connection's timeout).
//!
//! # Limits (read before use)
//!
//! - Only memories registered for `Ib(i)` *before* `connect` are known to the connection (their
//!   keys travel in the endpoint, at most [`MAX_MRS`] of them); a later one is refused with
//!   [`Error::IbConnect`]. MSCCL++ carries keys inside the serialized `RegisteredMemory`; doing
//!   that here needs a new `RegisteredMemory` wire version.
//! - Each connection opens its own device context, PD and registrations.
//! - GPU memory needs GPUDirect RDMA (`nvidia-peermem`) for `ibv_reg_mr` to accept it; the CPU
//!   backend's memory is host memory and needs nothing.
//! - Registrations live as long as the connection: a region keeps its pages pinned even if the
//!   `RegisteredMemory` is dropped, so a peer can still write there until the connection drops.

pub(crate) mod sys;
pub(crate) mod verbs;

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use self::sys::{IbvAhAttr, IbvGid, IbvGlobalRoute, IbvQpAttr, IbvSendWr, IbvSge, IbvWc};
use self::verbs::{Context, MAX_SEND_WR, Verbs};
use super::Connection;
use crate::codec::{Reader, Writer};
use crate::error::{Error, Result};
use crate::registered_memory::LocalMemories;
use crate::registered_memory::RegisteredMemory;
use crate::transport::Transport;

/// Environment variable choosing devices (and ports).
pub const ENV_DEVICE: &str = "MSCCLPP_IB_DEVICE";
/// Environment variable choosing the GID index (RoCE).
pub const ENV_GID_INDEX: &str = "MSCCLPP_IB_GID_INDEX";

/// Magic of a [`QpInfo`].
pub const QP_INFO_MAGIC: [u8; 4] = *b"MSIB";
/// Version of a [`QpInfo`].
pub const QP_INFO_VERSION: u16 = 1;
/// Bytes of a [`QpInfo`] before its memory table.
pub const QP_INFO_HEADER: usize = 4 + 2 + 1 + 1 + 1 + 1 + 2 + 4 + 4 + 16 + 2;
/// Bytes per memory table entry.
pub const MR_ENTRY_LEN: usize = 4 + 8 + 8 + 4;
/// Most memories one endpoint can describe (it must fit `Endpoint::MAX_EXTRA` with the
/// communicator's status byte).
pub const MAX_MRS: usize = (super::Endpoint::MAX_EXTRA - 1 - QP_INFO_HEADER) / MR_ENTRY_LEN;
/// Largest RDMA write of one work request (the verbs length is 32 bits; stay well inside).
const MAX_WR_BYTES: u64 = 1 << 30;

// ---------------------------------------------------------------------------------------------
// Device selection
// ---------------------------------------------------------------------------------------------

/// Picks the device and port for `Ib(index)` from the devices present and `MSCCLPP_IB_DEVICE`
/// (see the module docs).
pub fn select_device(
    present: &[String],
    env: Option<&str>,
    index: u8,
) -> Result<(String, u8), String> {
    let index = usize::from(index);
    match env.map(str::trim).filter(|s| !s.is_empty()) {
        Some(spec) => {
            let entries: Vec<&str> = spec
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .collect();
            let entry = match entries.as_slice() {
                [one] => *one,
                many => many.get(index).copied().ok_or_else(|| {
                    format!("{ENV_DEVICE}={spec:?} names no device for Ib({index})")
                })?,
            };
            let (name, port) = match entry.rsplit_once(':') {
                Some((n, p)) => {
                    let port = p
                        .parse::<u8>()
                        .ok()
                        .filter(|&p| p > 0)
                        .ok_or_else(|| format!("{ENV_DEVICE}: bad port {p:?} in {entry:?}"))?;
                    (n, port)
                }
                None => (entry, 1),
            };
            if !present.iter().any(|d| d == name) {
                return Err(format!(
                    "{ENV_DEVICE} names {name:?}, which is not among the RDMA devices {present:?}"
                ));
            }
            Ok((name.to_owned(), port))
        }
        None => present.get(index).map(|n| (n.clone(), 1)).ok_or_else(|| {
            if present.is_empty() {
                "libibverbs lists no RDMA device".to_owned()
            } else {
                format!("no RDMA device #{index} (present: {present:?})")
            }
        }),
    }
}

/// The GID index from `MSCCLPP_IB_GID_INDEX` (default 0).
pub fn gid_index(env: Option<&str>) -> Result<u8, String> {
    match env.map(str::trim).filter(|s| !s.is_empty()) {
        None => Ok(0),
        Some(s) => s
            .parse::<u8>()
            .map_err(|_| format!("{ENV_GID_INDEX}={s:?} is not a GID index (0..=255)")),
    }
}

// ---------------------------------------------------------------------------------------------
// Wire format
// ---------------------------------------------------------------------------------------------

/// A memory the peer may write: its owner's `local_id`, address and size, and the region's
/// rkey.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MrEntry {
    /// Owner's `local_id`.
    pub id: u32,
    /// Owner's address of the memory (the region's start).
    pub addr: u64,
    /// Bytes.
    pub size: u64,
    /// Remote key.
    pub rkey: u32,
}

/// What one end of an IB connection tells the other (in `Endpoint::extra`), little-endian:
/// `magic "MSIB" | version u16 | link_layer u8 | port u8 | mtu u8 | reserved u8 | lid u16 |
/// qpn u32 | psn u32 | gid [16] | count u16 | count × (id u32, addr u64, size u64, rkey u32)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QpInfo {
    /// `IBV_LINK_LAYER_INFINIBAND` (1) or `IBV_LINK_LAYER_ETHERNET` (2, RoCE).
    pub link_layer: u8,
    /// Port number.
    pub port: u8,
    /// Active MTU (`ibv_mtu`, 1..=5).
    pub mtu: u8,
    /// Port LID (InfiniBand).
    pub lid: u16,
    /// QP number (24 bits).
    pub qpn: u32,
    /// Initial packet sequence number (24 bits).
    pub psn: u32,
    /// GID at the chosen index (RoCE needs it; InfiniBand may leave it 0).
    pub gid: [u8; 16],
    /// Memories the peer may write.
    pub mrs: Vec<MrEntry>,
}

impl QpInfo {
    /// Serialized form.
    pub fn encode(&self) -> Vec<u8> {
        let n = self.mrs.len().min(MAX_MRS);
        let mut w = Writer::default();
        w.bytes(&QP_INFO_MAGIC)
            .u16(QP_INFO_VERSION)
            .u8(self.link_layer)
            .u8(self.port)
            .u8(self.mtu)
            .u8(0)
            .u16(self.lid)
            .u32(self.qpn)
            .u32(self.psn)
            .bytes(&self.gid)
            .u16(n as u16);
        for m in &self.mrs[..n] {
            w.u32(m.id).u64(m.addr).u64(m.size).u32(m.rkey);
        }
        w.0
    }

    /// Parses and checks a peer's info: magic, version, link layer, MTU, 24-bit QPN and PSN, a
    /// nonzero GID on RoCE, at most [`MAX_MRS`] non-empty, non-wrapping regions with distinct
    /// ids, exact length.
    pub fn decode(b: &[u8]) -> Result<Self, String> {
        let mut r = Reader::new(b, "IB queue pair info");
        if r.take(4)? != QP_INFO_MAGIC {
            return Err("wrong magic".into());
        }
        let version = r.u16()?;
        if version != QP_INFO_VERSION {
            return Err(format!("version {version}, expected {QP_INFO_VERSION}"));
        }
        let link_layer = r.u8()?;
        let port = r.u8()?;
        let mtu = r.u8()?;
        if r.u8()? != 0 {
            return Err("reserved byte is not 0".into());
        }
        let lid = r.u16()?;
        let qpn = r.u32()?;
        let psn = r.u32()?;
        let mut gid = [0u8; 16];
        gid.copy_from_slice(r.take(16)?);
        let n = usize::from(r.u16()?);
        if !matches!(
            link_layer,
            sys::IBV_LINK_LAYER_INFINIBAND | sys::IBV_LINK_LAYER_ETHERNET
        ) {
            return Err(format!("link layer {link_layer}"));
        }
        if port == 0 || !(1..=5).contains(&mtu) {
            return Err(format!("port {port}, MTU code {mtu}"));
        }
        if qpn >= 1 << 24 || psn >= 1 << 24 {
            return Err(format!("QPN {qpn:#x} or PSN {psn:#x} over 24 bits"));
        }
        if link_layer == sys::IBV_LINK_LAYER_ETHERNET && gid == [0; 16] {
            return Err("RoCE peer without a GID".into());
        }
        if n > MAX_MRS {
            return Err(format!("{n} memories (at most {MAX_MRS})"));
        }
        let mut mrs = Vec::with_capacity(n);
        for _ in 0..n {
            let m = MrEntry {
                id: r.u32()?,
                addr: r.u64()?,
                size: r.u64()?,
                rkey: r.u32()?,
            };
            if m.size == 0 || m.addr.checked_add(m.size).is_none() {
                return Err(format!(
                    "memory {} at {:#x} of {} bytes",
                    m.id, m.addr, m.size
                ));
            }
            if mrs.iter().any(|e: &MrEntry| e.id == m.id) {
                return Err(format!("memory {} listed twice", m.id));
            }
            mrs.push(m);
        }
        r.finish()?;
        Ok(Self {
            link_layer,
            port,
            mtu,
            lid,
            qpn,
            psn,
            gid,
            mrs,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Queue pair state transitions
// ---------------------------------------------------------------------------------------------

/// The states this transport moves a QP through, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum QpState {
    /// Just created.
    Reset,
    /// `ibv_modify_qp(INIT)`: port and access flags set.
    Init,
    /// Ready to receive: path to the peer set.
    Rtr,
    /// Ready to send.
    Rts,
}

/// The attributes and mask that move a QP from `from` to the next state; `None` for anything
/// but Reset→Init→Rtr→Rts. `local`/`remote` describe the two ends (RTR needs the peer's path,
/// RTS our PSN).
pub(crate) fn transition(
    from: QpState,
    local: &QpInfo,
    remote: &QpInfo,
    gid_index: u8,
) -> Option<(QpState, IbvQpAttr, c_int)> {
    let mut a = IbvQpAttr::default();
    match from {
        QpState::Reset => {
            a.qp_state = sys::IBV_QPS_INIT;
            a.pkey_index = 0;
            a.port_num = local.port;
            a.qp_access_flags = (sys::IBV_ACCESS_LOCAL_WRITE
                | sys::IBV_ACCESS_REMOTE_WRITE
                | sys::IBV_ACCESS_REMOTE_READ
                | sys::IBV_ACCESS_REMOTE_ATOMIC) as u32;
            let mask = sys::IBV_QP_STATE
                | sys::IBV_QP_PKEY_INDEX
                | sys::IBV_QP_PORT
                | sys::IBV_QP_ACCESS_FLAGS;
            Some((QpState::Init, a, mask))
        }
        QpState::Init => {
            a.qp_state = sys::IBV_QPS_RTR;
            a.path_mtu = u32::from(local.mtu.min(remote.mtu));
            a.dest_qp_num = remote.qpn;
            a.rq_psn = remote.psn;
            a.max_dest_rd_atomic = 1;
            a.min_rnr_timer = 12;
            let global = local.link_layer == sys::IBV_LINK_LAYER_ETHERNET;
            a.ah_attr = IbvAhAttr {
                grh: IbvGlobalRoute {
                    dgid: IbvGid { raw: remote.gid },
                    flow_label: 0,
                    sgid_index: gid_index,
                    hop_limit: if global { 255 } else { 0 },
                    traffic_class: 0,
                },
                dlid: remote.lid,
                sl: 0,
                src_path_bits: 0,
                static_rate: 0,
                is_global: u8::from(global),
                port_num: local.port,
            };
            let mask = sys::IBV_QP_STATE
                | sys::IBV_QP_AV
                | sys::IBV_QP_PATH_MTU
                | sys::IBV_QP_DEST_QPN
                | sys::IBV_QP_RQ_PSN
                | sys::IBV_QP_MAX_DEST_RD_ATOMIC
                | sys::IBV_QP_MIN_RNR_TIMER;
            Some((QpState::Rtr, a, mask))
        }
        QpState::Rtr => {
            a.qp_state = sys::IBV_QPS_RTS;
            a.sq_psn = local.psn;
            a.timeout = 18;
            a.retry_cnt = 7;
            a.rnr_retry = 7;
            a.max_rd_atomic = 1;
            let mask = sys::IBV_QP_STATE
                | sys::IBV_QP_TIMEOUT
                | sys::IBV_QP_RETRY_CNT
                | sys::IBV_QP_RNR_RETRY
                | sys::IBV_QP_SQ_PSN
                | sys::IBV_QP_MAX_QP_RD_ATOMIC;
            Some((QpState::Rts, a, mask))
        }
        QpState::Rts => None,
    }
}

/// Checks that two ends can talk: same link layer; InfiniBand ends need LIDs, RoCE ends GIDs.
pub(crate) fn check_compatible(local: &QpInfo, remote: &QpInfo) -> Result<(), String> {
    if local.link_layer != remote.link_layer {
        return Err(format!(
            "link layers differ (this end {}, the peer {})",
            local.link_layer, remote.link_layer
        ));
    }
    if local.link_layer == sys::IBV_LINK_LAYER_INFINIBAND && (local.lid == 0 || remote.lid == 0) {
        return Err("an InfiniBand port without a LID (is a subnet manager running?)".into());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Set-up
// ---------------------------------------------------------------------------------------------

/// A random 24-bit packet sequence number.
fn random_psn() -> u32 {
    (crate::random::token() as u32) & 0x00ff_ffff
}

/// The local half of an IB connection, made before the endpoints cross.
pub struct Prepared {
    verbs: Verbs,
    info: QpInfo,
    gid_index: u8,
    index: u8,
}

impl Prepared {
    /// Opens the device for `Ib(index)`, creates the QP (INIT) and registers the memories of
    /// `registry` registered for `Ib(index)`, for a connection to `remote_rank`.
    pub(crate) fn new(index: u8, registry: &LocalMemories, remote_rank: usize) -> Result<Self> {
        let unavailable = |reason: String| Error::IbUnavailable { reason };
        let names = verbs::device_names()?;
        let (name, port) = select_device(&names, std::env::var(ENV_DEVICE).ok().as_deref(), index)
            .map_err(unavailable)?;
        let gid_index =
            gid_index(std::env::var(ENV_GID_INDEX).ok().as_deref()).map_err(unavailable)?;
        let ctx = Context::open(&name)?;
        let p = ctx.query_port(port)?;
        if p.state != sys::IBV_PORT_ACTIVE {
            return Err(unavailable(format!(
                "port {port} of {name} is not active (state {})",
                p.state
            )));
        }
        let gid = ctx.query_gid(port, gid_index)?;
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(MAX_SEND_WR as c_int * 2)?;
        let qp = ctx.create_qp(&pd, &cq)?;
        let mut mrs = HashMap::new();
        let mut table = Vec::new();
        for (&id, m) in registry.read().iter() {
            if !m.transports.has(Transport::Ib(index)) {
                continue;
            }
            if table.len() == MAX_MRS {
                return Err(Error::IbConnect {
                    remote_rank,
                    reason: format!("more than {MAX_MRS} memories registered for Ib({index})"),
                });
            }
            // SAFETY: a memory registered with the communicator (live while registered; the
            // region pins its pages for the connection's lifetime, see the module docs).
            let mr = unsafe { ctx.reg_mr(&pd, m.ptr.addr(), m.size) }?;
            table.push(MrEntry {
                id,
                addr: m.ptr.addr(),
                size: m.size as u64,
                rkey: mr.rkey(),
            });
            mrs.insert(id, (mr, m.ptr.addr(), m.size as u64));
        }
        // The HCA writes fetch-and-add results here; Rust never reads it.
        let atomic_buf = Box::new(AtomicU64::new(0));
        let atomic_addr = atomic_buf.as_ptr() as u64;
        // SAFETY: the box lives in `Verbs` next to (and is dropped after) its region.
        let atomic_mr = unsafe { ctx.reg_mr(&pd, atomic_addr, 8) }?;
        let info = QpInfo {
            link_layer: p.link_layer,
            port,
            mtu: u8::try_from(p.active_mtu).unwrap_or(1).clamp(1, 5),
            lid: p.lid,
            qpn: qp.num(),
            psn: random_psn(),
            gid,
            mrs: table,
        };
        let verbs = Verbs {
            qp,
            mrs,
            atomic_mr,
            atomic_buf,
            cq,
            _pd: pd,
            ctx,
        };
        let (_, attr, mask) = transition(QpState::Reset, &info, &info, gid_index)
            .ok_or_else(|| unavailable("no INIT transition".into()))?;
        verbs
            .ctx
            .modify_qp(&verbs.qp, "ibv_modify_qp(INIT)", attr, mask)?;
        Ok(Self {
            verbs,
            info,
            gid_index,
            index,
        })
    }

    /// This end's bytes for `Endpoint::extra`.
    pub fn info(&self) -> &QpInfo {
        &self.info
    }
}

// ---------------------------------------------------------------------------------------------
// The connection
// ---------------------------------------------------------------------------------------------

struct State {
    verbs: Verbs,
    posted: u64,
    completed: u64,
    next_wr_id: u64,
    /// Sticky: the first failed completion (wr_id, status).
    failed: Option<(u64, u32)>,
}

/// An RC queue pair to one remote rank (see the module docs; not yet run on hardware).
pub struct IbConnection {
    remote_rank: usize,
    index: u8,
    remote_mrs: HashMap<u32, MrEntry>,
    timeout: Duration,
    state: Mutex<State>,
}

impl std::fmt::Debug for IbConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "IbConnection(Ib{} to rank {})",
            self.index, self.remote_rank
        )
    }
}

impl IbConnection {
    /// Moves the prepared QP to RTR/RTS towards the peer described by `peer_extra`.
    pub(crate) fn establish(
        prep: Prepared,
        peer_extra: &[u8],
        remote_rank: usize,
        timeout: Duration,
    ) -> Result<Self> {
        let refuse = |reason: String| Error::IbConnect {
            remote_rank,
            reason,
        };
        let remote = QpInfo::decode(peer_extra)
            .map_err(|r| refuse(format!("malformed queue pair info: {r}")))?;
        check_compatible(&prep.info, &remote).map_err(refuse)?;
        let mut state = QpState::Init;
        while let Some((next, attr, mask)) = transition(state, &prep.info, &remote, prep.gid_index)
        {
            let verb = match next {
                QpState::Rtr => "ibv_modify_qp(RTR)",
                _ => "ibv_modify_qp(RTS)",
            };
            prep.verbs.ctx.modify_qp(&prep.verbs.qp, verb, attr, mask)?;
            state = next;
        }
        Ok(Self {
            remote_rank,
            index: prep.index,
            remote_mrs: remote.mrs.iter().map(|m| (m.id, *m)).collect(),
            timeout,
            state: Mutex::new(State {
                verbs: prep.verbs,
                posted: 0,
                completed: 0,
                next_wr_id: 0,
                failed: None,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        crate::sync::lock(&self.state)
    }

    fn failed(&self, (wr_id, status): (u64, u32)) -> Error {
        Error::IbCompletion {
            remote_rank: self.remote_rank,
            wr_id,
            status,
            name: sys::wc_status_name(status),
        }
    }

    /// The peer's region of `dst`, checked: owned by the peer, registered for this `Ib(i)`,
    /// known to this connection, `[off, off + len)` inside it.
    fn remote_region(&self, dst: &RegisteredMemory, off: u64, len: u64) -> Result<MrEntry> {
        let refuse = |reason: String| Error::IbConnect {
            remote_rank: self.remote_rank,
            reason,
        };
        if dst.rank() != self.remote_rank {
            return Err(refuse(format!("{dst:?} does not belong to the peer")));
        }
        if !dst.transports().has(Transport::Ib(self.index)) {
            return Err(refuse(format!(
                "{dst:?} is not registered for Ib{}",
                self.index
            )));
        }
        let m = *self.remote_mrs.get(&dst.local_id()).ok_or_else(|| {
            refuse(format!(
                "{dst:?} was registered after this connection was made (IB keys are exchanged at connect)"
            ))
        })?;
        match off.checked_add(len) {
            Some(end) if end <= m.size && end <= dst.size() as u64 => Ok(m),
            _ => Err(Error::OutOfRange {
                offset: usize::try_from(off).unwrap_or(usize::MAX),
                len: usize::try_from(len).unwrap_or(usize::MAX),
                size: dst.size(),
            }),
        }
    }

    /// Polls the CQ once; records completions and the first failure.
    fn poll(&self, st: &mut State) -> Result<()> {
        let mut wcs = [IbvWc::default(); 16];
        let cq = st.verbs.cq.cq;
        // SAFETY: `cq` is a live CQ whose context's ops table has `poll_cq` (this is what the
        // inline `ibv_poll_cq` of verbs.h does); `wcs` has room for 16 completions.
        let n = unsafe {
            let ctx = (*cq).context;
            match (*ctx).ops.poll_cq {
                Some(f) => f(cq, wcs.len() as c_int, wcs.as_mut_ptr()),
                None => -1,
            }
        };
        if n < 0 {
            return Err(Error::IbVerb {
                verb: "ibv_poll_cq",
                device: st.verbs.ctx.name().to_owned(),
                source: std::io::Error::other(format!("returned {n}")),
            });
        }
        for wc in &wcs[..n as usize] {
            st.completed += 1;
            if wc.status != 0 && st.failed.is_none() {
                st.failed = Some((wc.wr_id, wc.status));
            }
        }
        Ok(())
    }

    /// Posts one signaled work request (waiting for room in the send queue first).
    fn post(&self, st: &mut State, mut wr: IbvSendWr, mut sge: IbvSge) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        while st.posted - st.completed >= u64::from(MAX_SEND_WR) {
            self.poll(st)?;
            if let Some(f) = st.failed {
                return Err(self.failed(f));
            }
            if Instant::now() >= deadline {
                return Err(Error::FlushTimeout {
                    remote_rank: self.remote_rank,
                    transport: Transport::Ib(self.index),
                    after: self.timeout,
                });
            }
            std::thread::yield_now();
        }
        wr.wr_id = st.next_wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.send_flags = sys::IBV_SEND_SIGNALED;
        let qp = st.verbs.qp.qp;
        let mut bad: *mut IbvSendWr = std::ptr::null_mut();
        // SAFETY: `qp` is a live RTS queue pair; `wr` and `sge` live across the call (the
        // provider copies them into the send queue before returning); the local address is in a
        // registered region; calling through `context->ops.post_send` is what the inline
        // `ibv_post_send` of verbs.h does.
        let rc = unsafe {
            let ctx = (*qp).context;
            match (*ctx).ops.post_send {
                Some(f) => f(qp, &mut wr, &mut bad),
                None => -1,
            }
        };
        if rc != 0 {
            return Err(Error::IbVerb {
                verb: "ibv_post_send",
                device: st.verbs.ctx.name().to_owned(),
                source: std::io::Error::from_raw_os_error(rc.abs()),
            });
        }
        st.next_wr_id += 1;
        st.posted += 1;
        Ok(())
    }
}

impl Connection for IbConnection {
    fn transport(&self) -> Transport {
        Transport::Ib(self.index)
    }

    fn remote_rank(&self) -> usize {
        self.remote_rank
    }

    fn write(
        &self,
        dst: &RegisteredMemory,
        dst_off: u64,
        src: &RegisteredMemory,
        src_off: u64,
        size: u64,
    ) -> Result<()> {
        let remote = self.remote_region(dst, dst_off, size)?;
        let s = src.range(src_off, size)?;
        if size == 0 {
            return Ok(());
        }
        let mut st = self.lock();
        if let Some(f) = st.failed {
            return Err(self.failed(f));
        }
        let lkey = st
            .verbs
            .mrs
            .get(&src.local_id())
            .filter(|_| src.transports().has(Transport::Ib(self.index)))
            .map(|(mr, _, _)| mr.lkey())
            .ok_or_else(|| Error::IbConnect {
                remote_rank: self.remote_rank,
                reason: format!(
                    "source {src:?} is not a memory registered for Ib{} before connect",
                    self.index
                ),
            })?;
        let mut done = 0;
        while done < size {
            let n = (size - done).min(MAX_WR_BYTES);
            let mut wr = IbvSendWr::zeroed();
            wr.opcode = sys::IBV_WR_RDMA_WRITE;
            wr.wr.rdma = sys::IbvWrRdma {
                remote_addr: remote.addr + dst_off + done,
                rkey: remote.rkey,
            };
            let sge = IbvSge {
                addr: s.addr() + done,
                length: n as u32, // ≤ 1 GiB
                lkey,
            };
            self.post(&mut st, wr, sge)?;
            done += n;
        }
        Ok(())
    }

    fn update_and_sync(
        &self,
        dst: &RegisteredMemory,
        dst_off: u64,
        src: &AtomicU64,
        new_value: u64,
    ) -> Result<()> {
        if !dst_off.is_multiple_of(8) {
            return Err(Error::IbConnect {
                remote_rank: self.remote_rank,
                reason: format!("update_and_sync at offset {dst_off}, not 8-byte aligned"),
            });
        }
        let remote = self.remote_region(dst, dst_off, 8)?;
        let mut st = self.lock();
        if let Some(f) = st.failed {
            return Err(self.failed(f));
        }
        let old = src.swap(new_value, Ordering::AcqRel);
        let mut wr = IbvSendWr::zeroed();
        wr.opcode = sys::IBV_WR_ATOMIC_FETCH_AND_ADD;
        wr.wr.atomic = sys::IbvWrAtomic {
            remote_addr: remote.addr + dst_off,
            compare_add: new_value.wrapping_sub(old),
            swap: 0,
            rkey: remote.rkey,
        };
        let sge = IbvSge {
            addr: st.verbs.atomic_buf.as_ptr() as u64,
            length: 8,
            lkey: st.verbs.atomic_mr.lkey(),
        };
        self.post(&mut st, wr, sge)
    }

    fn flush(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        loop {
            if let Some(f) = st.failed {
                return Err(self.failed(f));
            }
            if st.completed >= st.posted {
                return Ok(());
            }
            self.poll(&mut st)?;
            if st.completed < st.posted && Instant::now() >= deadline {
                return Err(Error::FlushTimeout {
                    remote_rank: self.remote_rank,
                    transport: Transport::Ib(self.index),
                    after: timeout,
                });
            }
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> QpInfo {
        QpInfo {
            link_layer: sys::IBV_LINK_LAYER_ETHERNET,
            port: 1,
            mtu: 5,
            lid: 0,
            qpn: 0x12_3456,
            psn: 0xab_cdef,
            gid: [0xfe; 16],
            mrs: vec![
                MrEntry {
                    id: 0,
                    addr: 0x7f00_0000_0000,
                    size: 4096,
                    rkey: 7,
                },
                MrEntry {
                    id: 3,
                    addr: 0x1000,
                    size: 1,
                    rkey: 9,
                },
            ],
        }
    }

    #[test]
    fn qp_info_round_trip_and_rejection() {
        let i = info();
        let b = i.encode();
        assert_eq!(b.len(), QP_INFO_HEADER + 2 * MR_ENTRY_LEN);
        assert_eq!(QpInfo::decode(&b).unwrap(), i);
        for cut in 0..b.len() {
            assert!(QpInfo::decode(&b[..cut]).is_err(), "truncated at {cut}");
        }
        let mut long = b.clone();
        long.push(0);
        assert!(QpInfo::decode(&long).is_err());
        let bad = |f: &dyn Fn(&mut QpInfo)| {
            let mut x = info();
            f(&mut x);
            QpInfo::decode(&x.encode())
        };
        assert!(bad(&|x| x.link_layer = 3).is_err());
        assert!(bad(&|x| x.mtu = 0).is_err());
        assert!(bad(&|x| x.mtu = 6).is_err());
        assert!(bad(&|x| x.port = 0).is_err());
        assert!(bad(&|x| x.qpn = 1 << 24).is_err());
        assert!(bad(&|x| x.psn = u32::MAX).is_err());
        assert!(bad(&|x| x.gid = [0; 16]).is_err(), "RoCE without GID");
        assert!(
            bad(&|x| {
                x.gid = [0; 16];
                x.link_layer = sys::IBV_LINK_LAYER_INFINIBAND;
                x.lid = 5;
            })
            .is_ok()
        );
        assert!(bad(&|x| x.mrs[1].size = 0).is_err());
        assert!(bad(&|x| x.mrs[1].addr = u64::MAX).is_err());
        assert!(bad(&|x| x.mrs[1].id = 0).is_err(), "duplicate id");
        let mut b2 = info().encode();
        b2[0] = b'X';
        assert!(QpInfo::decode(&b2).is_err());
        let mut b3 = info().encode();
        b3[4] = 9; // version
        assert!(QpInfo::decode(&b3).is_err());
        let mut b4 = info().encode();
        b4[9] = 1; // reserved
        assert!(QpInfo::decode(&b4).is_err());
        // A full table fits an endpoint (with the communicator's status byte).
        let mut full = info();
        full.mrs = (0..MAX_MRS as u32)
            .map(|id| MrEntry {
                id,
                addr: 4096 * u64::from(id + 1),
                size: 4096,
                rkey: id,
            })
            .collect();
        let enc = full.encode();
        assert!(
            enc.len() < super::super::Endpoint::MAX_EXTRA,
            "room for the status byte"
        );
        assert_eq!(QpInfo::decode(&enc).unwrap(), full);
        let mut over = enc;
        let count_at = QP_INFO_HEADER - 2;
        over[count_at..count_at + 2].copy_from_slice(&(MAX_MRS as u16 + 1).to_le_bytes());
        assert!(QpInfo::decode(&over).is_err());
    }

    #[test]
    fn device_selection() {
        let present = vec!["mlx5_0".to_string(), "mlx5_1".to_string()];
        assert_eq!(select_device(&present, None, 0), Ok(("mlx5_0".into(), 1)));
        assert_eq!(select_device(&present, None, 1), Ok(("mlx5_1".into(), 1)));
        assert!(select_device(&present, None, 2).is_err());
        assert!(
            select_device(&[], None, 0)
                .unwrap_err()
                .contains("no RDMA device")
        );
        assert_eq!(
            select_device(&present, Some("mlx5_1:2"), 0),
            Ok(("mlx5_1".into(), 2))
        );
        assert_eq!(
            select_device(&present, Some("mlx5_1:2"), 5),
            Ok(("mlx5_1".into(), 2)),
            "one entry serves every index"
        );
        assert_eq!(
            select_device(&present, Some(" mlx5_1 , mlx5_0:1 "), 1),
            Ok(("mlx5_0".into(), 1))
        );
        assert!(select_device(&present, Some("mlx5_1,mlx5_0"), 2).is_err());
        assert!(select_device(&present, Some("mlx5_9"), 0).is_err());
        assert!(select_device(&present, Some("mlx5_0:0"), 0).is_err());
        assert!(select_device(&present, Some("mlx5_0:x"), 0).is_err());
        assert_eq!(
            select_device(&present, Some(""), 0),
            Ok(("mlx5_0".into(), 1))
        );
        assert_eq!(gid_index(None), Ok(0));
        assert_eq!(gid_index(Some(" 3 ")), Ok(3));
        assert!(gid_index(Some("-1")).is_err());
        assert!(gid_index(Some("256")).is_err());
    }

    #[test]
    fn qp_transitions_go_reset_init_rtr_rts_and_stop() {
        let local = info();
        let mut remote = info();
        remote.qpn = 77;
        remote.psn = 55;
        remote.mtu = 3;
        remote.gid = [1; 16];
        let mut s = QpState::Reset;
        let mut seen = vec![];
        while let Some((next, attr, mask)) = transition(s, &local, &remote, 3) {
            assert!(next > s);
            assert_ne!(mask & sys::IBV_QP_STATE, 0);
            match next {
                QpState::Init => {
                    assert_eq!(attr.qp_state, sys::IBV_QPS_INIT);
                    assert_eq!(attr.port_num, 1);
                    assert_ne!(
                        attr.qp_access_flags & sys::IBV_ACCESS_REMOTE_ATOMIC as u32,
                        0
                    );
                }
                QpState::Rtr => {
                    assert_eq!(attr.qp_state, sys::IBV_QPS_RTR);
                    assert_eq!((attr.dest_qp_num, attr.rq_psn), (77, 55));
                    assert_eq!(attr.path_mtu, 3, "the smaller MTU");
                    assert_eq!(attr.ah_attr.is_global, 1, "RoCE routes by GID");
                    assert_eq!(attr.ah_attr.grh.dgid.raw, [1; 16]);
                    assert_eq!(attr.ah_attr.grh.sgid_index, 3);
                    assert_ne!(mask & sys::IBV_QP_AV, 0);
                }
                QpState::Rts => {
                    assert_eq!(attr.qp_state, sys::IBV_QPS_RTS);
                    assert_eq!(attr.sq_psn, local.psn);
                    assert_ne!(mask & sys::IBV_QP_SQ_PSN, 0);
                }
                QpState::Reset => unreachable!(),
            }
            seen.push(next);
            s = next;
        }
        assert_eq!(seen, [QpState::Init, QpState::Rtr, QpState::Rts]);
        let mut ib = info();
        ib.link_layer = sys::IBV_LINK_LAYER_INFINIBAND;
        ib.lid = 4;
        let (_, rtr, _) = transition(QpState::Init, &ib, &ib, 0).unwrap();
        assert_eq!((rtr.ah_attr.is_global, rtr.ah_attr.dlid), (0, 4));
        assert!(check_compatible(&ib, &info()).is_err(), "IB vs RoCE");
        let mut no_lid = ib.clone();
        no_lid.lid = 0;
        assert!(check_compatible(&ib, &no_lid).is_err());
        assert!(check_compatible(&info(), &info()).is_ok());
    }

    #[test]
    fn completion_status_names() {
        assert_eq!(sys::wc_status_name(0), "IBV_WC_SUCCESS");
        assert_eq!(sys::wc_status_name(12), "IBV_WC_RETRY_EXC_ERR");
        assert_eq!(sys::wc_status_name(10), "IBV_WC_REM_ACCESS_ERR");
        assert_eq!(sys::wc_status_name(999), "unknown status");
    }

    #[test]
    fn missing_library_is_a_typed_error() {
        // Where libibverbs is absent (CI), every entry point says so; where it is present but
        // has no device, device selection says that instead. Neither panics.
        match verbs::device_names() {
            // No library ("libibverbs.so.1 could not be loaded"), or a library without kernel
            // support ("ibv_get_device_list failed: Function not implemented").
            Err(Error::IbUnavailable { reason }) => assert!(!reason.is_empty()),
            Ok(names) => {
                let sel = select_device(&names, None, 0);
                assert!(names.is_empty() == sel.is_err());
            }
            Err(e) => panic!("{e}"),
        }
    }
}
