//! The [`QpInfo`] one end of an IB connection puts into its endpoint: its queue pair, path and
//! memory table.

use super::sys;
use crate::codec::{Reader, Writer};

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
pub const MAX_MRS: usize =
    (crate::connection::Endpoint::MAX_EXTRA - 1 - QP_INFO_HEADER) / MR_ENTRY_LEN;

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
