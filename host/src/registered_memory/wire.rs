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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registered_memory::LocalMemories;

    // Field offsets of the wire form (module docs).
    const FLAGS_AT: usize = 7;
    const RANK_AT: usize = 8;
    const PID_AT: usize = 12;
    const TRANSPORTS_AT: usize = 16;
    const SIZE_AT: usize = 24;
    const ADDR_AT: usize = 32;
    const TOKEN_AT: usize = 40;
    const IPC_AT: usize = 56;

    fn cpu() -> Gpu {
        Gpu::open(BackendKind::Cpu, 0).unwrap()
    }

    fn put(bytes: &[u8], at: usize, v: &[u8]) -> Vec<u8> {
        let mut b = bytes.to_vec();
        b[at..at + v.len()].copy_from_slice(v);
        b
    }

    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
    }

    fn u64_at(b: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
    }

    /// The reason of a `MalformedMemory` from rank 5; anything else fails the test.
    fn refusal(r: Result<RegisteredMemory>) -> String {
        match r {
            Err(Error::MalformedMemory { rank: 5, reason }) => reason,
            other => panic!("expected MalformedMemory from rank 5, got {other:?}"),
        }
    }

    #[test]
    fn the_wire_form_is_pinned_field_by_field() {
        let g = cpu();
        let buf = g.alloc(4096).unwrap();
        let reg = LocalMemories::new(5);
        let _first = reg
            .register_buffer(&buf, Transport::Ethernet.into())
            .unwrap();
        let m = reg
            .register_buffer(
                &buf,
                TransportFlags::from(Transport::Shm).with(Transport::Ofi),
            )
            .unwrap();
        let b = m.serialize();
        assert_eq!(b.len(), WIRE_LEN);
        assert_eq!(&b[..4], b"MSRM");
        assert_eq!(u16::from_le_bytes([b[4], b[5]]), 3);
        assert_eq!(
            (b[6], b[FLAGS_AT]),
            (2, FLAG_HAS_IPC),
            "backend Cpu, handle present"
        );
        assert_eq!(u32_at(&b, RANK_AT), 5);
        assert_eq!(u32_at(&b, PID_AT), std::process::id());
        assert_eq!(u32_at(&b, TRANSPORTS_AT), 2 | 8);
        assert_eq!(u32_at(&b, 20), 1, "the local id");
        assert_eq!(u64_at(&b, SIZE_AT), 4096);
        assert_eq!(u64_at(&b, ADDR_AT), buf.ptr().addr());
        assert_eq!(u64_at(&b, TOKEN_AT), m.inner.token);
        assert_eq!(u64_at(&b, 48), m.key());
        let ipc = m.inner.ipc.unwrap();
        assert_eq!(&b[IPC_AT..], bytemuck::bytes_of(&ipc));
        // Without the same-node transport: no handle, and its bytes all zero.
        let e = reg
            .register_buffer(&buf, Transport::Ethernet.into())
            .unwrap();
        let eb = e.serialize();
        assert_eq!(eb[FLAGS_AT], 0);
        assert!(eb[IPC_AT..].iter().all(|&x| x == 0));

        // The token is read from its place only in a form of the right length and magic.
        assert_eq!(RegisteredMemory::wire_token(&b), Some(m.inner.token));
        assert_ne!(RegisteredMemory::wire_token(&eb), Some(m.inner.token));
        assert_eq!(RegisteredMemory::wire_token(&b[..WIRE_LEN - 1]), None);
        assert_eq!(
            RegisteredMemory::wire_token(&[b.as_slice(), &[0]].concat()),
            None
        );
        for at in 0..4 {
            assert_eq!(RegisteredMemory::wire_token(&put(&b, at, b"X")), None);
        }
    }

    #[test]
    fn a_peer_memory_decodes_to_exactly_what_was_sent() {
        let g = cpu();
        let buf = g.alloc(4096).unwrap();
        let reg = LocalMemories::new(5);
        let _first = reg.register_buffer(&buf, Transport::Shm.into()).unwrap();
        let m = reg
            .register_buffer(
                &buf,
                TransportFlags::from(Transport::Shm).with(Transport::Ethernet),
            )
            .unwrap();
        let b = m.serialize();
        // Not the same node: decoded, not mapped, and only reachable through a connection.
        let d = RegisteredMemory::deserialize(&b, &g, 5, false).unwrap();
        assert_eq!((d.rank(), d.local_id(), d.size()), (5, 1, 4096));
        assert_eq!((d.key(), d.transports()), (m.key(), m.transports()));
        assert_eq!(d.owner_addr(), buf.ptr());
        assert_eq!(d.ptr(), None);
        assert!(matches!(
            d.range(0, 8),
            Err(Error::MemoryNotMapped { rank: 5, id: 1 })
        ));
        assert_eq!(d.serialize(), b);
    }

    #[test]
    fn every_field_is_checked() {
        let g = cpu();
        let buf = g.alloc(4096).unwrap();
        let reg = LocalMemories::new(5);
        let shm = reg.register_buffer(&buf, Transport::Shm.into()).unwrap();
        let eth = reg
            .register_buffer(&buf, Transport::Ethernet.into())
            .unwrap();
        let (s, e) = (shm.serialize(), eth.serialize());
        let decode = |b: &[u8]| RegisteredMemory::deserialize(b, &g, 5, false);
        assert!(decode(&s).is_ok() && decode(&e).is_ok());
        let big = isize::MAX as u64;
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (put(&s, 1, b"X"), "wrong magic"),
            (put(&s, 4, &2u16.to_le_bytes()), "version 2, expected 3"),
            (put(&s, 4, &4u16.to_le_bytes()), "version 4, expected 3"),
            (put(&s, 6, &[0]), "unknown backend 0"),
            (put(&s, 6, &[3]), "unknown backend 3"),
            (put(&s, 6, &[1]), "Cuda memory sent to a Cpu rank"),
            (put(&s, FLAGS_AT, &[3]), "unknown flag bits 0x03"),
            (put(&e, FLAGS_AT, &[2]), "unknown flag bits 0x02"),
            (put(&e, WIRE_LEN - 1, &[1]), "without the flag"),
            (put(&s, RANK_AT, &4u32.to_le_bytes()), "owned by rank 4"),
            (put(&s, RANK_AT, &6u32.to_le_bytes()), "owned by rank 6"),
            (put(&e, TRANSPORTS_AT, &[0]), "transports"),
            (put(&e, TRANSPORTS_AT, &[16]), "unknown transport bits"),
            (put(&e, SIZE_AT, &0u64.to_le_bytes()), "size 0,"),
            (
                put(&e, SIZE_AT, &(big + 1).to_le_bytes()),
                "size 9223372036854775808,",
            ),
            (put(&e, ADDR_AT, &0u64.to_le_bytes()), "address 0x0,"),
            (
                put(&s, SIZE_AT, &4095u64.to_le_bytes()),
                "covers 4096 bytes, not 4095",
            ),
            (s[..WIRE_LEN - 1].to_vec(), ""),
            ([s.as_slice(), &[0]].concat(), ""),
        ];
        for (bad, why) in cases {
            let reason = refusal(decode(&bad));
            assert!(reason.contains(why), "{reason:?} does not say {why:?}");
        }
        // The largest size a peer may describe is accepted (without a handle to cover it).
        let d = decode(&put(&e, SIZE_AT, &big.to_le_bytes())).unwrap();
        assert_eq!(d.size() as u64, big);
    }

    #[test]
    fn memory_of_this_process_is_used_only_as_it_was_registered() {
        let g = cpu();
        let buf = g.alloc(4096).unwrap();
        let reg = LocalMemories::new(5);
        let shm = reg.register_buffer(&buf, Transport::Shm.into()).unwrap();
        let eth = reg
            .register_buffer(&buf, Transport::Ethernet.into())
            .unwrap();
        let (s, e) = (shm.serialize(), eth.serialize());
        // As registered: this very address, even without a load/store transport.
        for b in [&s, &e] {
            let d = RegisteredMemory::deserialize(b, &g, 5, true).unwrap();
            assert_eq!(d.ptr(), Some(buf.ptr()));
        }
        // A token, size or address it never registered together is refused.
        let forged = [
            put(&s, TOKEN_AT, &(shm.inner.token ^ 2).to_le_bytes()),
            put(&e, SIZE_AT, &2048u64.to_le_bytes()),
            put(&e, ADDR_AT, &(buf.ptr().addr() + 64).to_le_bytes()),
        ];
        for b in forged {
            let reason = refusal(RegisteredMemory::deserialize(&b, &g, 5, true));
            assert!(reason.contains("never registered"), "{reason}");
        }
        // Another process of this node: mapped through the handle when the same-node transport
        // was registered, else reachable only through a connection.
        let other = std::process::id().wrapping_add(1).to_le_bytes();
        let mapped = RegisteredMemory::deserialize(&put(&s, PID_AT, &other), &g, 5, true).unwrap();
        let p = mapped.range(100, 1).unwrap();
        // SAFETY: `p` addresses byte 100 of the 4096-byte buffer, mapped into this process.
        unsafe { p.as_ptr().write_volatile(0x5a) };
        let mut back = [0u8; 1];
        buf.copy_to_host(100, &mut back).unwrap();
        assert_eq!(back[0], 0x5a, "the mapping is not the buffer");
        let remote = RegisteredMemory::deserialize(&put(&e, PID_AT, &other), &g, 5, true).unwrap();
        assert_eq!(remote.ptr(), None);
        let far = RegisteredMemory::deserialize(&put(&s, PID_AT, &other), &g, 5, false).unwrap();
        assert_eq!(far.ptr(), None);
    }
}
