//! Set-up of an IB connection: device and port selection, the queue pair's state transitions
//! (Reset → INIT → RTR → RTS), and [`Prepared`], the half made before the endpoints cross.

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::atomic::AtomicU64;

use super::sys::{self, IbvAhAttr, IbvGid, IbvGlobalRoute, IbvQpAttr};
use super::verbs::{self, Context, MAX_SEND_WR, Verbs};
use super::wire::{MAX_MRS, MrEntry, QpInfo};
use super::{ENV_DEVICE, ENV_GID_INDEX};
use crate::error::{Link, Result};
use crate::registered_memory::LocalMemories;
use crate::transport::Transport;

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

/// A random 24-bit packet sequence number.
fn random_psn() -> u32 {
    (crate::random::token() as u32) & 0x00ff_ffff
}

/// The local half of an IB connection, made before the endpoints cross.
pub struct Prepared {
    pub(super) verbs: Verbs,
    pub(super) info: QpInfo,
    pub(super) gid_index: u8,
    pub(super) index: u8,
}

impl Prepared {
    /// Opens the device for `Ib(index)`, creates the QP (INIT) and registers the memories of
    /// `registry` registered for `Ib(index)`, for a connection to `remote_rank`.
    pub(crate) fn new(index: u8, registry: &LocalMemories, remote_rank: usize) -> Result<Self> {
        let unavailable = |reason: String| verbs::unavailable(index, reason);
        let names = verbs::device_names(index)?;
        let (name, port) = select_device(&names, std::env::var(ENV_DEVICE).ok().as_deref(), index)
            .map_err(unavailable)?;
        let gid_index =
            gid_index(std::env::var(ENV_GID_INDEX).ok().as_deref()).map_err(unavailable)?;
        let ctx = Context::open(&name, index)?;
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
                let why = format!("more than {MAX_MRS} memories registered for Ib({index})");
                return Err(Link::to(Transport::Ib(index), remote_rank).setup(why));
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
