//! The trust boundary of the network transports, both ends of it: what a receiver checks before
//! it applies a peer's frame to this rank's memory ([`check_destination`]: nothing read from
//! the wire is trusted), and what a sender checks before it sends anything
//! ([`check_remote`], [`check_word`]: a caller's mistake is refused here, with a typed error,
//! instead of by the peer, which would close the connection).

use std::collections::HashMap;

use mscclpp_shared::DevicePtr;
use subtle::ConstantTimeEq;

use crate::error::{Error, Link, MemoryMisuse, Result};
use crate::registered_memory::{LocalMemory, RegisteredMemory};
use crate::transport::Transport;

/// The address of `[offset, offset + len)` of memory `id` in `registry` (this rank's memories
/// registered for a network transport), checked for a frame that arrived over `transport`:
/// registered for `transport`, the right network key (compared in constant time), inside the
/// memory without overflow, and `align`-byte aligned. The error says what is wrong (the reason
/// the receiver sends back and records).
pub(crate) fn check_destination(
    registry: &HashMap<u32, LocalMemory>,
    transport: Transport,
    id: u32,
    key: u64,
    (offset, len, align): (u64, u64, u64),
) -> Result<DevicePtr<u8>, String> {
    let mem = registry.get(&id).ok_or_else(|| {
        format!("memory {id} is not registered here for a network transport (or no longer)")
    })?;
    if !mem.transports.has(transport) {
        return Err(format!("memory {id} is not registered for {transport}"));
    }
    if !bool::from(mem.key.to_le_bytes().ct_eq(&key.to_le_bytes())) {
        return Err(format!(
            "the write into memory {id} carries a wrong network key (this rank never sent that memory to the writer)"
        ));
    }
    match offset.checked_add(len) {
        Some(end) if end <= mem.size as u64 => {}
        _ => {
            return Err(format!(
                "range {offset}+{len} is outside memory {id} of {} bytes",
                mem.size
            ));
        }
    }
    let addr = mem
        .ptr
        .addr()
        .checked_add(offset)
        .ok_or_else(|| format!("memory {id}: address overflow"))?;
    if align > 1 && !addr.is_multiple_of(align) {
        return Err(format!(
            "memory {id}: offset {offset} is not {align}-byte aligned"
        ));
    }
    Ok(DevicePtr::from_addr(addr))
}

/// Checks, on the sending side of `link` (a connection to a peer), that `dst` is the peer's
/// memory, registered for the link's transport, and that `[off, off + len)` lies inside it:
/// [`Error::Transport`] of kind `Memory` for the first two, [`Error::OutOfRange`] for the last.
/// `op` is the caller's operation.
pub(crate) fn check_remote(
    link: Link,
    op: &'static str,
    dst: &RegisteredMemory,
    off: u64,
    len: u64,
) -> Result<()> {
    if link.remote_rank != Some(dst.rank()) {
        return Err(link.memory(op, MemoryMisuse::NotThePeers { owner: dst.rank() }));
    }
    if !dst.transports().has(link.transport) {
        let misuse = MemoryMisuse::NotRegistered {
            id: dst.local_id(),
            transport: link.transport,
        };
        return Err(link.memory(op, misuse));
    }
    match off.checked_add(len) {
        Some(end) if end <= dst.size() as u64 => Ok(()),
        _ => Err(Error::OutOfRange {
            offset: usize::try_from(off).unwrap_or(usize::MAX),
            len: usize::try_from(len).unwrap_or(usize::MAX),
            size: dst.size(),
        }),
    }
}

/// [`check_remote`] for the 8-byte word at `off` of `dst` that an `update_and_sync` stores:
/// also 8-byte aligned.
pub(crate) fn check_word(link: Link, dst: &RegisteredMemory, off: u64) -> Result<()> {
    const OP: &str = "update_and_sync";
    if !off.is_multiple_of(8) {
        return Err(link.memory(OP, MemoryMisuse::Misaligned { offset: off }));
    }
    check_remote(link, OP, dst, off, 8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::TransportErrorKind;
    use crate::transport::TransportFlags;

    const K: u64 = 0x5eed_1234_abcd_0042;

    fn mem(addr: u64, size: usize, t: Transport) -> LocalMemory {
        LocalMemory {
            ptr: DevicePtr::from_addr(addr),
            size,
            transports: TransportFlags::from(t),
            key: K,
        }
    }

    #[test]
    fn destinations_are_checked_for_each_transport() {
        for t in [Transport::Ethernet, Transport::Ofi] {
            let other = if t == Transport::Ofi {
                Transport::Ethernet
            } else {
                Transport::Ofi
            };
            let mut map = HashMap::new();
            map.insert(1, mem(0x1000, 100, t));
            map.insert(2, mem(0x2000, 100, other));
            map.insert(3, mem(0x3004, 64, t));
            let check = |id, key, range| check_destination(&map, t, id, key, range);
            assert_eq!(check(1, K, (0, 100, 1)).unwrap().addr(), 0x1000);
            assert_eq!(check(1, K, (99, 1, 1)).unwrap().addr(), 0x1000 + 99);
            assert!(check(1, K, (99, 2, 1)).is_err(), "past the end");
            assert!(check(1, K, (100, 1, 1)).is_err(), "past the end");
            assert!(check(1, K, (u64::MAX, 2, 1)).is_err(), "wraps");
            assert!(check(1, K, (1, u64::MAX, 1)).is_err(), "wraps");
            let e = check(2, K, (0, 8, 1)).unwrap_err();
            assert!(e.contains(&format!("not registered for {t}")), "{e}");
            assert!(check(9, K, (0, 8, 1)).is_err(), "unknown id");
            assert!(check(1, K, (8, 8, 8)).is_ok());
            assert!(check(1, K, (4, 8, 8)).is_err(), "misaligned offset");
            assert!(check(3, K, (0, 8, 8)).is_err(), "misaligned base");
            assert!(check(3, K, (4, 8, 8)).is_ok());
            let wrong = check(1, K ^ 1, (0, 8, 1)).unwrap_err();
            assert!(wrong.contains("network key"), "{wrong}");
            assert!(check(1, 0, (0, 8, 1)).is_err(), "no key");
        }
    }

    /// A registered memory of rank `owner` as a peer received it.
    fn remote(owner: usize, size: usize, t: Transport) -> RegisteredMemory {
        RegisteredMemory::remote_for_test(owner, 5, size, TransportFlags::from(t), K)
    }

    fn kind(e: &Error) -> Option<TransportErrorKind> {
        match e {
            Error::Transport { kind, .. } => Some(*kind),
            _ => None,
        }
    }

    #[test]
    fn a_sender_refuses_memory_the_peer_cannot_take() {
        let link = Link::to(Transport::Ofi, 2);
        let dst = remote(2, 64, Transport::Ofi);
        assert!(check_remote(link, "write", &dst, 0, 64).is_ok());
        assert!(check_remote(link, "write", &dst, 64, 0).is_ok());
        let e = check_remote(link, "write", &dst, 1, 64).unwrap_err();
        assert!(matches!(e, Error::OutOfRange { size: 64, .. }), "{e}");
        let e = check_remote(link, "write", &dst, u64::MAX, 2).unwrap_err();
        assert!(matches!(e, Error::OutOfRange { .. }), "{e}");
        let e = check_remote(link, "write", &remote(1, 64, Transport::Ofi), 0, 8).unwrap_err();
        assert_eq!(kind(&e), Some(TransportErrorKind::Memory));
        assert!(e.to_string().contains("belongs to rank 1"), "{e}");
        let eth = remote(2, 64, Transport::Ethernet);
        let e = check_remote(link, "write", &eth, 0, 8).unwrap_err();
        assert_eq!(kind(&e), Some(TransportErrorKind::Memory));
        assert!(e.to_string().contains("not registered for Ofi"), "{e}");
        assert!(check_word(link, &dst, 56).is_ok());
        let e = check_word(link, &dst, 4).unwrap_err();
        assert!(e.to_string().contains("not 8-byte aligned"), "{e}");
        assert!(matches!(
            check_word(link, &dst, 64),
            Err(Error::OutOfRange { .. })
        ));
    }
}
