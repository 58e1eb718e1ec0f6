//! The serialized form of a [`RegisteredMemory`] and its checks.
//!
//! Wire form (little-endian, version [`WIRE_VERSION`]):
//! `magic "MSRM" | version u16 | backend u8 | flags u8 | owner_rank u32 | owner_pid u32 |
//!  transports u32 | local_id u32 | size u64 | owner_addr u64 | token u64 | key u64 |
//!  ipc IpcMemHandle (112 bytes)`.
//! `key` is the memory's network key ([`RegisteredMemory::key`]): a network transport's write
//! or signal into the memory must carry it, so only ranks this form was sent to can write.
//! A memory claimed by this very process is used directly only if its token names a
//! registration this process made, of exactly that address and size.
//! The receiver checks the magic, the version, the exact length, the transport bits, that the
//! size is non-zero and matches the IPC handle, and the handle itself (`validate_ipc_handle`).

use std::sync::Arc;

use mscclpp_shared::IpcMemHandle;

use super::{Inner, Mapping, RegisteredMemory, live};
use crate::codec::{Reader, Writer};
use crate::error::{Error, Result};
use crate::gpu::{BackendKind, Gpu};
use crate::transport::{Transport, TransportFlags};

/// Magic of a serialized registered memory.
pub const WIRE_MAGIC: [u8; 4] = *b"MSRM";
/// Version of the serialized form. 3: the network key.
pub const WIRE_VERSION: u16 = 3;
const FLAG_HAS_IPC: u8 = 1;
/// Length of the serialized form.
pub const WIRE_LEN: usize = 4 + 2 + 1 + 1 + 4 + 4 + 4 + 4 + 8 + 8 + 8 + 8 + 112;

impl RegisteredMemory {
    /// The serialized form.
    pub fn serialize(&self) -> Vec<u8> {
        let i = &self.inner;
        let mut w = Writer::default();
        w.bytes(&WIRE_MAGIC)
            .u16(WIRE_VERSION)
            .u8(match i.backend {
                BackendKind::Cuda => 1,
                BackendKind::Cpu => 2,
            })
            .u8(if i.ipc.is_some() { FLAG_HAS_IPC } else { 0 })
            .u32(i.owner_rank as u32)
            .u32(i.owner_pid)
            .u32(i.transports.bits())
            .u32(i.local_id)
            .u64(i.size as u64)
            .u64(i.owner_addr)
            .u64(i.token)
            .u64(i.key)
            .bytes(bytemuck::bytes_of(&i.ipc.unwrap_or_default()));
        debug_assert_eq!(w.0.len(), WIRE_LEN);
        w.0
    }

    /// The token of a serialized memory (random per registration), without decoding or mapping
    /// it: a receiver that caches mapped memories looks it up first. `None` unless `bytes` has
    /// the wire length and magic; the full checks happen in [`RegisteredMemory::deserialize`].
    pub fn wire_token(bytes: &[u8]) -> Option<u64> {
        const TOKEN_AT: usize = 4 + 2 + 1 + 1 + 4 + 4 + 4 + 4 + 8 + 8;
        if bytes.len() != WIRE_LEN || bytes[..4] != WIRE_MAGIC {
            return None;
        }
        let t: [u8; 8] = bytes[TOKEN_AT..TOKEN_AT + 8].try_into().ok()?;
        Some(u64::from_le_bytes(t))
    }

    /// Decodes a peer's memory and maps it when `same_node` and a load/store transport allow.
    /// `from_rank` is the rank it came from (it must be the owner).
    pub fn deserialize(bytes: &[u8], gpu: &Gpu, from_rank: usize, same_node: bool) -> Result<Self> {
        let bad = |reason: String| Error::MalformedMemory {
            rank: from_rank,
            reason,
        };
        let mut r = Reader::new(bytes, "registered memory");
        if r.take(4).map_err(bad)? != WIRE_MAGIC {
            return Err(bad("wrong magic".into()));
        }
        let version = r.u16().map_err(bad)?;
        if version != WIRE_VERSION {
            return Err(bad(format!("version {version}, expected {WIRE_VERSION}")));
        }
        let backend = match r.u8().map_err(bad)? {
            1 => BackendKind::Cuda,
            2 => BackendKind::Cpu,
            b => return Err(bad(format!("unknown backend {b}"))),
        };
        let flags = r.u8().map_err(bad)?;
        let owner_rank = r.u32().map_err(bad)? as usize;
        let owner_pid = r.u32().map_err(bad)?;
        let transports = TransportFlags::from_bits(r.u32().map_err(bad)?)
            .ok_or_else(|| bad("unknown transport bits".into()))?;
        let local_id = r.u32().map_err(bad)?;
        let size = r.u64().map_err(bad)?;
        let owner_addr = r.u64().map_err(bad)?;
        let token = r.u64().map_err(bad)?;
        let key = r.u64().map_err(bad)?;
        let ipc: IpcMemHandle = bytemuck::pod_read_unaligned(r.take(112).map_err(bad)?);
        r.finish().map_err(bad)?;
        if owner_rank != from_rank {
            return Err(bad(format!("claims to be owned by rank {owner_rank}")));
        }
        if size == 0 || size > isize::MAX as u64 || owner_addr == 0 || transports.is_empty() {
            return Err(bad(format!(
                "size {size}, address {owner_addr:#x}, transports {transports:?}"
            )));
        }
        if backend != gpu.kind() {
            return Err(bad(format!(
                "{backend:?} memory sent to a {:?} rank",
                gpu.kind()
            )));
        }
        if flags & !FLAG_HAS_IPC != 0 {
            return Err(bad(format!("unknown flag bits {flags:#04x}")));
        }
        if flags & FLAG_HAS_IPC == 0 && bytemuck::bytes_of(&ipc).iter().any(|&b| b != 0) {
            // Nothing on the wire is ignored: an absent handle is all zero (found by the
            // `registered_memory` fuzz target).
            return Err(bad(
                "an IPC handle without the flag that says it is there".into()
            ));
        }
        let ipc = if flags & FLAG_HAS_IPC != 0 {
            crate::gpu::validate_ipc_handle(&ipc, backend)?;
            if ipc.size != size {
                return Err(bad(format!(
                    "IPC handle covers {} bytes, not {size}",
                    ipc.size
                )));
            }
            Some(ipc)
        } else {
            None
        };
        let local_transport = Transport::local_for(backend);
        let mapping = if same_node && owner_pid == std::process::id() {
            // Ranks that share this process share its address space (peer access is enabled
            // by the connection) — for memory this process really registered.
            let known = live().as_ref().and_then(|m| m.get(&token).copied());
            if known != Some((owner_addr, size)) {
                return Err(bad(format!(
                    "claims {size} bytes at {owner_addr:#x} of this process, which it never registered"
                )));
            }
            Mapping::Direct
        } else if same_node && transports.has(local_transport) {
            match &ipc {
                Some(h) => Mapping::Mapped(gpu.open_ipc(h)?),
                None => Mapping::Remote,
            }
        } else {
            Mapping::Remote
        };
        Ok(Self {
            inner: Arc::new(Inner {
                owner_rank,
                owner_pid,
                local_id,
                backend,
                size: size as usize,
                transports,
                owner_addr,
                ipc,
                mapping,
                token,
                key,
                _registration: None,
            }),
        })
    }
}
