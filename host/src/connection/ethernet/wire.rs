//! The Ethernet transport's wire formats (tables in the [module docs](super)) and the
//! receiver's destination check, the whole of its trust boundary.

use std::collections::HashMap;
use std::net::SocketAddr;

use mscclpp_shared::DevicePtr;

use super::{CHUNK, HANDSHAKE_LEN, HANDSHAKE_MARKER, HEADER_LEN, INFO_MAGIC, INFO_VERSION};
use super::{MAX_ADDRS, MAX_REASON, PROTOCOL_VERSION};
use crate::bootstrap::wire::{ADDR_LEN, decode_addr, is_connectable, put_addr};
use crate::codec::{Reader, Writer};
use crate::registered_memory::LocalMemory;
use crate::transport::Transport;

/// What one side tells the other through the bootstrap: where it listens, and its token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointInfo {
    /// Random value the peer must echo in its `HELLO` (stray-connection filter).
    pub token: u64,
    /// Addresses the listener can be reached at, in order of preference.
    pub addrs: Vec<SocketAddr>,
}

impl EndpointInfo {
    /// Serialized form (see the module docs).
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        let n = self.addrs.len().min(MAX_ADDRS);
        w.bytes(&INFO_MAGIC)
            .u16(INFO_VERSION)
            .u64(self.token)
            .u8(n as u8);
        for a in &self.addrs[..n] {
            put_addr(&mut w.0, a);
        }
        w.0
    }

    /// Parses and checks a peer's info: magic, version, 1..=[`MAX_ADDRS`] connectable
    /// addresses, exact length.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let mut r = Reader::new(bytes, "Ethernet endpoint");
        if r.take(4)? != INFO_MAGIC {
            return Err("wrong magic".into());
        }
        let version = r.u16()?;
        if version != INFO_VERSION {
            return Err(format!("version {version}, expected {INFO_VERSION}"));
        }
        let token = r.u64()?;
        let n = usize::from(r.u8()?);
        if n == 0 || n > MAX_ADDRS {
            return Err(format!("{n} addresses (1 to {MAX_ADDRS} allowed)"));
        }
        let mut addrs = Vec::with_capacity(n);
        for _ in 0..n {
            let a = decode_addr(r.take(ADDR_LEN)?)?;
            if !is_connectable(&a) {
                return Err(format!("address {a} cannot be connected to"));
            }
            addrs.push(a);
        }
        r.finish()?;
        Ok(Self { token, addrs })
    }
}

/// Kind of a handshake message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandshakeKind {
    /// Connector → acceptor.
    Hello,
    /// Acceptor → connector.
    Accept,
}

/// A `HELLO` or `ACCEPT` (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handshake {
    /// Which message.
    pub kind: HandshakeKind,
    /// Sender's rank.
    pub from: u32,
    /// Receiver's rank.
    pub to: u32,
    /// The receiver's token (from its endpoint).
    pub token: u64,
}

impl Handshake {
    /// The 32 bytes.
    pub fn encode(&self) -> [u8; HANDSHAKE_LEN] {
        let mut b = [0u8; HANDSHAKE_LEN];
        b[0..8].copy_from_slice(&HANDSHAKE_MARKER);
        b[8..12].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        let kind: u32 = match self.kind {
            HandshakeKind::Hello => 1,
            HandshakeKind::Accept => 2,
        };
        b[12..16].copy_from_slice(&kind.to_le_bytes());
        b[16..20].copy_from_slice(&self.from.to_le_bytes());
        b[20..24].copy_from_slice(&self.to.to_le_bytes());
        b[24..32].copy_from_slice(&self.token.to_le_bytes());
        b
    }

    /// Parses 32 bytes: marker, version, kind.
    pub fn decode(b: &[u8; HANDSHAKE_LEN]) -> Result<Self, String> {
        let mut r = Reader::new(b, "Ethernet handshake");
        if r.take(8)? != HANDSHAKE_MARKER {
            return Err("not an mscclpp-rs Ethernet peer (wrong marker)".into());
        }
        let version = r.u32()?;
        if version != PROTOCOL_VERSION {
            return Err(format!(
                "protocol version {version}, this build speaks {PROTOCOL_VERSION}"
            ));
        }
        let kind = match r.u32()? {
            1 => HandshakeKind::Hello,
            2 => HandshakeKind::Accept,
            k => return Err(format!("unknown handshake kind {k}")),
        };
        let from = r.u32()?;
        let to = r.u32()?;
        let token = r.u64()?;
        r.finish()?;
        Ok(Self {
            kind,
            from,
            to,
            token,
        })
    }
}

const OP_WRITE: u32 = 1;
const OP_UPDATE: u32 = 2;
const OP_FLUSH: u32 = 3;
const OP_BYE: u32 = 4;
const OP_ACK: u32 = 0x81;
const OP_ERROR: u32 = 0x82;

/// A frame header (see the module docs for the layout).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame {
    /// `len` payload bytes for `[offset, offset + len)` of memory `id` follow.
    Write {
        /// Destination `local_id`.
        id: u32,
        /// Destination offset.
        offset: u64,
        /// Payload bytes (1..=[`CHUNK`]).
        len: u64,
    },
    /// Store `value` into the 8-byte word at `offset` of memory `id`, after earlier frames.
    Update {
        /// Destination `local_id`.
        id: u32,
        /// Destination offset (8-aligned).
        offset: u64,
        /// The value.
        value: u64,
    },
    /// Answer `ACK {seq}` once every earlier frame is applied.
    Flush {
        /// Sequence number.
        seq: u64,
    },
    /// The sender drops the connection; nothing follows.
    Bye,
    /// Every frame before `FLUSH {seq}` is applied.
    Ack {
        /// Sequence number of the `FLUSH`.
        seq: u64,
    },
    /// The receiver refused a frame; `len` bytes of UTF-8 reason follow, then it closes.
    Error {
        /// Reason bytes (≤ [`MAX_REASON`]).
        len: u64,
    },
}

impl Frame {
    /// The 32 header bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let (op, id, a, b, c) = match *self {
            Frame::Write { id, offset, len } => (OP_WRITE, id, offset, len, 0),
            Frame::Update { id, offset, value } => (OP_UPDATE, id, offset, 8, value),
            Frame::Flush { seq } => (OP_FLUSH, 0, seq, 0, 0),
            Frame::Bye => (OP_BYE, 0, 0, 0, 0),
            Frame::Ack { seq } => (OP_ACK, 0, seq, 0, 0),
            Frame::Error { len } => (OP_ERROR, 0, 0, len, 0),
        };
        let mut h = [0u8; HEADER_LEN];
        h[0..4].copy_from_slice(&op.to_le_bytes());
        h[4..8].copy_from_slice(&id.to_le_bytes());
        h[8..16].copy_from_slice(&a.to_le_bytes());
        h[16..24].copy_from_slice(&b.to_le_bytes());
        h[24..32].copy_from_slice(&c.to_le_bytes());
        h
    }

    /// Parses a header: known op, unused fields 0, lengths within their caps.
    pub fn decode(h: &[u8; HEADER_LEN]) -> Result<Self, String> {
        let mut r = Reader::new(h, "Ethernet frame header");
        let (op, id, a, b, c) = (r.u32()?, r.u32()?, r.u64()?, r.u64()?, r.u64()?);
        let zero = |what: &str, v: u64| {
            if v == 0 {
                Ok(())
            } else {
                Err(format!("op {op:#x}: {what} is {v}, not 0"))
            }
        };
        Ok(match op {
            OP_WRITE => {
                zero("word 24", c)?;
                if b == 0 || b > CHUNK as u64 {
                    return Err(format!("WRITE of {b} bytes (1 to {CHUNK} allowed)"));
                }
                Frame::Write {
                    id,
                    offset: a,
                    len: b,
                }
            }
            OP_UPDATE => {
                if b != 8 {
                    return Err(format!("UPDATE of {b} bytes (8 expected)"));
                }
                Frame::Update {
                    id,
                    offset: a,
                    value: c,
                }
            }
            OP_FLUSH | OP_ACK => {
                zero("id", id.into())?;
                zero("word 16", b)?;
                zero("word 24", c)?;
                if op == OP_FLUSH {
                    Frame::Flush { seq: a }
                } else {
                    Frame::Ack { seq: a }
                }
            }
            OP_BYE => {
                for (what, v) in [
                    ("id", u64::from(id)),
                    ("word 8", a),
                    ("word 16", b),
                    ("word 24", c),
                ] {
                    zero(what, v)?;
                }
                Frame::Bye
            }
            OP_ERROR => {
                zero("id", id.into())?;
                zero("word 8", a)?;
                zero("word 24", c)?;
                if b > MAX_REASON as u64 {
                    return Err(format!("ERROR reason of {b} bytes (at most {MAX_REASON})"));
                }
                Frame::Error { len: b }
            }
            _ => return Err(format!("unknown op {op:#x}")),
        })
    }
}

/// Checks a destination named by a peer against the registry: registered here for `Ethernet`,
/// `[offset, offset + len)` inside it, and (for `align` > 1) the address aligned. Returns the
/// destination address. This is the receiver's whole trust boundary.
pub(crate) fn check_destination(
    registry: &HashMap<u32, LocalMemory>,
    id: u32,
    offset: u64,
    len: u64,
    align: u64,
) -> Result<DevicePtr<u8>, String> {
    let mem = registry.get(&id).ok_or_else(|| {
        format!("memory {id} is not registered here for a network transport (or no longer)")
    })?;
    if !mem.transports.has(Transport::Ethernet) {
        return Err(format!("memory {id} is not registered for Ethernet"));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::TransportFlags;

    #[test]
    fn endpoint_info_round_trip_and_rejection() {
        let info = EndpointInfo {
            token: 0x1234_5678_9abc_def0,
            addrs: vec![
                "10.0.0.1:4000".parse().unwrap(),
                "127.0.0.1:4000".parse().unwrap(),
            ],
        };
        let b = info.encode();
        assert_eq!(EndpointInfo::decode(&b).unwrap(), info);
        for cut in 0..b.len() {
            assert!(
                EndpointInfo::decode(&b[..cut]).is_err(),
                "truncated at {cut}"
            );
        }
        let mut long = b.clone();
        long.push(0);
        assert!(EndpointInfo::decode(&long).is_err());
        let mut wrong = b.clone();
        wrong[0] ^= 1;
        assert!(EndpointInfo::decode(&wrong).is_err());
        let mut zero = b.clone();
        zero[14] = 0; // address count
        assert!(EndpointInfo::decode(&zero).is_err());
        let unconnectable = EndpointInfo {
            token: 1,
            addrs: vec!["0.0.0.0:4000".parse().unwrap()],
        };
        assert!(EndpointInfo::decode(&unconnectable.encode()).is_err());
        let no_port = EndpointInfo {
            token: 1,
            addrs: vec!["10.0.0.1:0".parse().unwrap()],
        };
        assert!(EndpointInfo::decode(&no_port.encode()).is_err());
    }

    #[test]
    fn handshake_round_trip_and_rejection() {
        let h = Handshake {
            kind: HandshakeKind::Accept,
            from: 3,
            to: 1,
            token: 99,
        };
        let b = h.encode();
        assert_eq!(Handshake::decode(&b).unwrap(), h);
        let mut bad = b;
        bad[0] = b'X';
        assert!(Handshake::decode(&bad).is_err());
        let mut bad = b;
        bad[8] = 2; // version
        assert!(Handshake::decode(&bad).is_err());
        let mut bad = b;
        bad[12] = 7; // kind
        assert!(Handshake::decode(&bad).is_err());
    }

    #[test]
    fn frames_round_trip_and_rejection() {
        let frames = [
            Frame::Write {
                id: 7,
                offset: 1 << 40,
                len: CHUNK as u64,
            },
            Frame::Write {
                id: 0,
                offset: 0,
                len: 1,
            },
            Frame::Update {
                id: 2,
                offset: 64,
                value: u64::MAX,
            },
            Frame::Flush { seq: 5 },
            Frame::Bye,
            Frame::Ack { seq: 5 },
            Frame::Error {
                len: MAX_REASON as u64,
            },
        ];
        for f in frames {
            assert_eq!(Frame::decode(&f.encode()).unwrap(), f);
        }
        let enc = |op: u32, id: u32, a: u64, b: u64, c: u64| {
            let mut h = [0u8; HEADER_LEN];
            h[0..4].copy_from_slice(&op.to_le_bytes());
            h[4..8].copy_from_slice(&id.to_le_bytes());
            h[8..16].copy_from_slice(&a.to_le_bytes());
            h[16..24].copy_from_slice(&b.to_le_bytes());
            h[24..32].copy_from_slice(&c.to_le_bytes());
            h
        };
        for bad in [
            enc(OP_WRITE, 1, 0, 0, 0),                     // empty write
            enc(OP_WRITE, 1, 0, CHUNK as u64 + 1, 0),      // over the cap
            enc(OP_WRITE, 1, 0, 8, 1),                     // reserved word
            enc(OP_UPDATE, 1, 0, 4, 1),                    // not 8 bytes
            enc(OP_FLUSH, 1, 3, 0, 0),                     // id on a flush
            enc(OP_BYE, 0, 1, 0, 0),                       // payload word on a bye
            enc(OP_ERROR, 0, 0, MAX_REASON as u64 + 1, 0), // reason too long
            enc(0, 0, 0, 0, 0),                            // unknown op
            enc(0xdead, 0, 0, 0, 0),                       // unknown op
        ] {
            assert!(Frame::decode(&bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn destinations_are_checked_against_the_registry() {
        let mut map = HashMap::new();
        let eth = TransportFlags::from(Transport::Ethernet);
        map.insert(
            1,
            LocalMemory {
                ptr: DevicePtr::from_addr(0x1000),
                size: 100,
                transports: eth,
            },
        );
        map.insert(
            2,
            LocalMemory {
                ptr: DevicePtr::from_addr(0x2000),
                size: 100,
                transports: TransportFlags::from(Transport::Shm),
            },
        );
        map.insert(
            3,
            LocalMemory {
                ptr: DevicePtr::from_addr(0x3004),
                size: 64,
                transports: eth,
            },
        );
        assert_eq!(
            check_destination(&map, 1, 0, 100, 1).unwrap().addr(),
            0x1000
        );
        assert_eq!(
            check_destination(&map, 1, 99, 1, 1).unwrap().addr(),
            0x1000 + 99
        );
        assert!(check_destination(&map, 1, 99, 2, 1).is_err());
        assert!(check_destination(&map, 1, 100, 1, 1).is_err());
        assert!(check_destination(&map, 1, u64::MAX, 2, 1).is_err());
        assert!(check_destination(&map, 1, 1, u64::MAX, 1).is_err());
        assert!(
            check_destination(&map, 2, 0, 8, 1).is_err(),
            "not registered for Ethernet"
        );
        assert!(check_destination(&map, 9, 0, 8, 1).is_err(), "unknown id");
        assert!(check_destination(&map, 1, 8, 8, 8).is_ok());
        assert!(
            check_destination(&map, 1, 4, 8, 8).is_err(),
            "misaligned offset"
        );
        assert!(
            check_destination(&map, 3, 0, 8, 8).is_err(),
            "misaligned base"
        );
        assert!(check_destination(&map, 3, 4, 8, 8).is_ok());
    }
}
