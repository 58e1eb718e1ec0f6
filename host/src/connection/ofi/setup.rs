//! Set-up of a libfabric connection (the [module docs](super)' steps): [`Prepared`] is the half
//! made before the endpoints cross — provider, fabric objects, buffers, posted receives, the
//! registrations of the memories peers may write directly, and the [`EndpointInfo`] that goes
//! into this side's endpoint — and [`OfiConnection::establish`](super::OfiConnection) finishes
//! it with the peer's info.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

use super::result::{self, Posted};
use super::safe::{Fi, Iface, Want, select};
use super::sys::{self, FiContext2};
use super::wire::{EndpointInfo, FLAG_DIRECT, FLAG_VIRT_ADDR, MrEntry, TAG_CTRL, TAG_DATA};
use super::{
    CHUNK, CTRL_LEN, CTRL_RX, CTRL_TX, ENV_PROVIDER, ENV_STAGED, MAX_MRS, RMA_OPS, SLOTS, TX_BUFS,
};
use crate::backend::BackendKind;
use crate::error::Result;
use crate::gpu::{Gpu, HostMapped};
use crate::registered_memory::LocalMemories;
use crate::transport::Transport;

/// What an operation's context slot belongs to (slots are laid out in this order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Op {
    /// Receive buffer `i` for data frames.
    RxData(usize),
    /// Receive buffer `i` for control frames.
    RxCtrl(usize),
    /// Send buffer `i` of data frames.
    TxData(usize),
    /// Send buffer `i` of control frames.
    TxCtrl(usize),
    /// RMA write context `i`.
    Rma(usize),
}

impl Op {
    /// Number of context slots.
    pub(super) const COUNT: usize = SLOTS + CTRL_RX + TX_BUFS + CTRL_TX + RMA_OPS;

    /// The slot of this operation.
    pub(super) fn index(self) -> usize {
        match self {
            Op::RxData(i) => i,
            Op::RxCtrl(i) => SLOTS + i,
            Op::TxData(i) => SLOTS + CTRL_RX + i,
            Op::TxCtrl(i) => SLOTS + CTRL_RX + TX_BUFS + i,
            Op::Rma(i) => SLOTS + CTRL_RX + TX_BUFS + CTRL_TX + i,
        }
    }

    /// The operation of slot `i`.
    pub(super) fn from_index(i: usize) -> Option<Self> {
        let mut i = i;
        for (n, make) in [
            (SLOTS, Op::RxData as fn(usize) -> Op),
            (CTRL_RX, Op::RxCtrl),
            (TX_BUFS, Op::TxData),
            (CTRL_TX, Op::TxCtrl),
            (RMA_OPS, Op::Rma),
        ] {
            if i < n {
                return Some(make(i));
            }
            i -= n;
        }
        None
    }
}

/// A buffer of `count` slots of `slot` bytes in host memory the device can reach, with its
/// registration's descriptor (null when the provider needs none).
pub(super) struct Buffers {
    pub mem: HostMapped,
    pub slot: usize,
    pub desc: usize,
}

impl Buffers {
    fn new(gpu: &Gpu, fi: &mut Fi, count: usize, slot: usize, access: u64) -> Result<Self> {
        let mem = gpu.alloc_host_mapped(count * slot)?;
        let desc = if fi.info.mr_mode() & sys::FI_MR_LOCAL != 0 {
            // SAFETY: the buffer lives in the same `Port` as the registration and is dropped
            // after it (field order of `Port`).
            let i =
                unsafe { fi.register(mem.host_ptr() as u64, mem.len(), access, Iface::System) }?;
            fi.mrs[i].desc() as usize
        } else {
            0
        };
        Ok(Self { mem, slot, desc })
    }

    /// Host address of slot `i`.
    pub fn host(&self, i: usize) -> *mut u8 {
        // SAFETY: callers pass `i` below the slot count, so the slot is inside the buffer.
        unsafe { self.mem.host_ptr().add(i * self.slot) }
    }

    /// Device address of slot `i`.
    pub fn device(&self, i: usize) -> mscclpp_shared::DevicePtr<u8> {
        self.mem.device_ptr().byte_add_cast((i * self.slot) as u64)
    }

    /// The registration descriptor operations on it pass.
    pub fn desc(&self) -> *mut c_void {
        self.desc as *mut c_void
    }
}

/// A memory of this rank registered with the provider for direct writes.
#[derive(Clone, Copy, Debug)]
pub(super) struct LocalMr {
    /// Its address when registered.
    pub addr: u64,
    /// Its size.
    pub size: u64,
    /// The registration's descriptor.
    pub desc: usize,
}

/// The fabric objects and buffers of one connection; every libfabric call on them is made under
/// the connection's lock. Field order is drop order: the fabric objects (closing the endpoint
/// cancels what it still has posted) before the buffers they point into.
pub(super) struct Port {
    pub fi: Fi,
    /// The peer's address handle (set by `establish`).
    pub peer: u64,
    /// One context per operation slot ([`Op`]), at stable addresses.
    pub ctx: Box<[FiContext2]>,
    pub rx_data: Buffers,
    pub rx_ctrl: Buffers,
    pub tx_data: Buffers,
    pub tx_ctrl: Buffers,
}

impl Port {
    /// The context pointer of `op`.
    pub fn ctx(&mut self, op: Op) -> *mut c_void {
        std::ptr::from_mut(&mut self.ctx[op.index()]).cast()
    }

    /// The operation a completion's context names.
    pub fn op_of(&self, ctx: *mut c_void) -> Option<Op> {
        let base = self.ctx.as_ptr() as usize;
        let at = (ctx as usize).checked_sub(base)?;
        if at % size_of::<FiContext2>() != 0 {
            return None;
        }
        Op::from_index(at / size_of::<FiContext2>())
    }

    /// Posts the receive of data slot `i`.
    pub fn post_rx_data(&mut self, i: usize) -> Result<Posted> {
        let (buf, len, desc) = (self.rx_data.host(i), self.rx_data.slot, self.rx_data.desc());
        let ctx = self.ctx(Op::RxData(i));
        // SAFETY: slot `i` of the receive buffer and its context are used by this receive
        // only, until its completion is read (the connection reposts it only then).
        unsafe {
            result::trecv(
                self.fi.lib,
                self.fi.ep.raw(),
                buf,
                len,
                desc,
                TAG_DATA,
                ctx,
                &self.fi.prov,
            )
        }
    }

    /// Posts the receive of control slot `i`.
    pub fn post_rx_ctrl(&mut self, i: usize) -> Result<Posted> {
        let (buf, len, desc) = (self.rx_ctrl.host(i), self.rx_ctrl.slot, self.rx_ctrl.desc());
        let ctx = self.ctx(Op::RxCtrl(i));
        // SAFETY: as in `post_rx_data`.
        unsafe {
            result::trecv(
                self.fi.lib,
                self.fi.ep.raw(),
                buf,
                len,
                desc,
                TAG_CTRL,
                ctx,
                &self.fi.prov,
            )
        }
    }

    /// Sends the first `len` bytes of data send slot `i` to the peer.
    pub fn send_data(&mut self, i: usize, len: usize) -> Result<Posted> {
        let (buf, desc) = (self.tx_data.host(i), self.tx_data.desc());
        let (ctx, peer) = (self.ctx(Op::TxData(i)), self.peer);
        // SAFETY: slot `i` and its context belong to this send until its completion is read
        // (the connection returns the slot to its free list only then).
        unsafe {
            result::tsend(
                self.fi.lib,
                self.fi.ep.raw(),
                buf,
                len,
                desc,
                peer,
                TAG_DATA,
                ctx,
                &self.fi.prov,
            )
        }
    }

    /// Sends the first `len` bytes of control send slot `i` to the peer.
    pub fn send_ctrl(&mut self, i: usize, len: usize) -> Result<Posted> {
        let (buf, desc) = (self.tx_ctrl.host(i), self.tx_ctrl.desc());
        let (ctx, peer) = (self.ctx(Op::TxCtrl(i)), self.peer);
        // SAFETY: as in `send_data`.
        unsafe {
            result::tsend(
                self.fi.lib,
                self.fi.ep.raw(),
                buf,
                len,
                desc,
                peer,
                TAG_CTRL,
                ctx,
                &self.fi.prov,
            )
        }
    }
}

/// The half of a connection made before the endpoints cross.
pub(crate) struct Prepared {
    pub(super) port: Port,
    pub(super) info: EndpointInfo,
    /// Memories of this rank registered for direct writes, by `local_id`.
    pub(super) local_mrs: HashMap<u32, LocalMr>,
    /// Whether this side may write directly (its provider orders sends after writes).
    pub(super) direct: bool,
    pub(super) max_msg: usize,
}

impl Prepared {
    /// Chooses the provider, opens the fabric objects, allocates and registers the buffers,
    /// posts every receive, registers this rank's memories for `Ofi` (up to [`MAX_MRS`]) for
    /// direct writes where the provider allows, and describes it all in an [`EndpointInfo`].
    pub(crate) fn new(gpu: &Gpu, registry: &Arc<LocalMemories>) -> Result<Self> {
        let provider = std::env::var(ENV_PROVIDER)
            .ok()
            .filter(|p| !p.trim().is_empty());
        let cuda = gpu.kind() == BackendKind::Cuda;
        let info = match select(&Want {
            provider: provider.clone(),
            hmem: cuda,
        }) {
            Ok(i) => i,
            // Without FI_HMEM, device memory is staged through host memory.
            Err(_) if cuda => select(&Want {
                provider,
                hmem: false,
            })?,
            Err(e) => return Err(e),
        };
        let staged_only = std::env::var(ENV_STAGED).is_ok_and(|v| v.trim() == "1");
        let mr_mode = info.mr_mode();
        let ordered = info.tx_msg_order() & sys::FI_ORDER_SAW != 0;
        let direct =
            ordered && !staged_only && mr_mode & sys::FI_MR_RAW == 0 && info.mr_key_size() <= 8;
        let virt = mr_mode & sys::FI_MR_VIRT_ADDR != 0;
        let iface = match gpu.kind() {
            BackendKind::Cpu => Some(Iface::System),
            BackendKind::Cuda if info.caps() & sys::FI_HMEM != 0 => {
                Some(Iface::Cuda(gpu.ordinal() as i32))
            }
            BackendKind::Cuda => None,
        };
        let max_msg = info.max_msg_size().clamp(1, 1 << 30);
        let cq_size = Op::COUNT * 2;
        let mut fi = Fi::open(info, cq_size)?;
        let chunk = CHUNK.min(max_msg.saturating_sub(super::HEADER_LEN)).max(1);
        let slot = super::HEADER_LEN + chunk;
        let rx_data = Buffers::new(gpu, &mut fi, SLOTS, slot, sys::FI_RECV)?;
        let rx_ctrl = Buffers::new(gpu, &mut fi, CTRL_RX, CTRL_LEN, sys::FI_RECV)?;
        let tx_data = Buffers::new(gpu, &mut fi, TX_BUFS, slot, sys::FI_SEND)?;
        let tx_ctrl = Buffers::new(gpu, &mut fi, CTRL_TX, CTRL_LEN, sys::FI_SEND)?;
        let mut local_mrs = HashMap::new();
        let mut mrs = Vec::new();
        if let (true, Some(iface)) = (direct, iface) {
            let map = registry.read();
            let mut ids: Vec<u32> = map
                .iter()
                .filter(|(_, m)| m.transports.has(Transport::Ofi))
                .map(|(id, _)| *id)
                .collect();
            ids.sort_unstable();
            for id in ids.into_iter().take(MAX_MRS) {
                let m = map[&id];
                // SAFETY: the memory is registered in the registry (alive while registered);
                // the registration lives as long as this connection (module docs: limits).
                let registered = unsafe {
                    fi.register(
                        m.ptr.addr(),
                        m.size,
                        sys::FI_REMOTE_WRITE | sys::FI_WRITE,
                        iface,
                    )
                };
                // A memory the provider will not register (device memory it claims but cannot
                // map, a limit) goes in frames instead.
                let i = match registered {
                    Ok(i) => i,
                    Err(e) => {
                        tracing::debug!("libfabric: memory {id} goes in frames: {e}");
                        continue;
                    }
                };
                let mr = &fi.mrs[i];
                local_mrs.insert(
                    id,
                    LocalMr {
                        addr: m.ptr.addr(),
                        size: m.size as u64,
                        desc: mr.desc() as usize,
                    },
                );
                mrs.push(MrEntry {
                    id,
                    size: m.size as u64,
                    addr: if virt { m.ptr.addr() } else { 0 },
                    key: mr.key(),
                });
            }
        }
        let info = EndpointInfo {
            provider: fi.prov.clone(),
            fabric: fi.info.fabric_name(),
            addr: fi.name()?,
            flags: if direct {
                FLAG_DIRECT | if virt { FLAG_VIRT_ADDR } else { 0 }
            } else {
                0
            },
            chunk: chunk as u32,
            slots: SLOTS as u16,
            mrs,
        };
        let mut port = Port {
            fi,
            peer: sys::FI_ADDR_UNSPEC,
            ctx: vec![FiContext2::default(); Op::COUNT].into_boxed_slice(),
            rx_data,
            rx_ctrl,
            tx_data,
            tx_ctrl,
        };
        for i in 0..SLOTS {
            expect_posted(port.post_rx_data(i)?, "fi_trecv", &port.fi.prov)?;
        }
        for i in 0..CTRL_RX {
            expect_posted(port.post_rx_ctrl(i)?, "fi_trecv", &port.fi.prov)?;
        }
        Ok(Self {
            port,
            info,
            local_mrs,
            direct,
            max_msg,
        })
    }

    /// What goes into this side's `Endpoint::extra`.
    pub(crate) fn info(&self) -> &EndpointInfo {
        &self.info
    }
}

/// A receive posted at set-up must not find the queue full (it is sized for them).
fn expect_posted(p: Posted, call: &'static str, prov: &str) -> Result<()> {
    match p {
        Posted::Yes => Ok(()),
        Posted::Again => Err(result::call_error(
            call,
            prov,
            -sys::FI_EAGAIN,
            "the receive queue is full at set-up",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_slots_are_distinct_and_round_trip() {
        let ops: Vec<Op> = (0..SLOTS)
            .map(Op::RxData)
            .chain((0..CTRL_RX).map(Op::RxCtrl))
            .chain((0..TX_BUFS).map(Op::TxData))
            .chain((0..CTRL_TX).map(Op::TxCtrl))
            .chain((0..RMA_OPS).map(Op::Rma))
            .collect();
        assert_eq!(ops.len(), Op::COUNT);
        for (i, op) in ops.iter().enumerate() {
            assert_eq!(op.index(), i);
            assert_eq!(Op::from_index(i), Some(*op));
        }
        assert_eq!(Op::from_index(Op::COUNT), None);
    }
}
