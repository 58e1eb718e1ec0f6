//! The Ethernet transport's wire formats (tables in the [module docs](super)). The receiver's
//! destination check, the rest of its trust boundary, is the network transports' shared one
//! (`connection::network`).

use std::net::SocketAddr;

use super::{CHUNK, HANDSHAKE_LEN, HANDSHAKE_MARKER, HEADER_LEN, INFO_MAGIC, INFO_VERSION};
use super::{MAX_ADDRS, MAX_REASON, PROTOCOL_VERSION};
use crate::auth::{NONCE_LEN, TAG_LEN};
use crate::bootstrap::wire::{ADDR_LEN, decode_addr, is_connectable, put_addr};
use crate::codec::{Reader, Writer};

/// What one side tells the other through the bootstrap: where it listens, and its token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointInfo {
    /// Random per connection set-up: both sides' tokens go into the context of the
    /// handshake's tags, tying them to this one connection.
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

/// Kind of a handshake message (see the module docs for the exchange).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandshakeKind {
    /// Connector → acceptor: who, and its nonce.
    Hello,
    /// Acceptor → connector: its nonce and its tag.
    Challenge,
    /// Connector → acceptor: its tag.
    Proof,
    /// Acceptor → connector: the connection is accepted.
    Accept,
}

impl HandshakeKind {
    const fn code(self) -> u32 {
        match self {
            HandshakeKind::Hello => 1,
            HandshakeKind::Challenge => 2,
            HandshakeKind::Proof => 3,
            HandshakeKind::Accept => 4,
        }
    }
}

/// One handshake message (see the module docs). Fields a kind does not use are zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handshake {
    /// Which message.
    pub kind: HandshakeKind,
    /// Sender's rank.
    pub from: u32,
    /// Receiver's rank.
    pub to: u32,
    /// The sender's nonce (`HELLO`, `CHALLENGE`).
    pub nonce: [u8; NONCE_LEN],
    /// The sender's tag (`CHALLENGE`, `PROOF`).
    pub tag: [u8; TAG_LEN],
}

impl Handshake {
    /// A message of `kind` with no nonce and no tag.
    pub fn new(kind: HandshakeKind, from: u32, to: u32) -> Self {
        Self {
            kind,
            from,
            to,
            nonce: [0; NONCE_LEN],
            tag: [0; TAG_LEN],
        }
    }

    /// The bytes.
    pub fn encode(&self) -> [u8; HANDSHAKE_LEN] {
        let mut b = [0u8; HANDSHAKE_LEN];
        b[0..8].copy_from_slice(&HANDSHAKE_MARKER);
        b[8..12].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.kind.code().to_le_bytes());
        b[16..20].copy_from_slice(&self.from.to_le_bytes());
        b[20..24].copy_from_slice(&self.to.to_le_bytes());
        b[24..56].copy_from_slice(&self.nonce);
        b[56..88].copy_from_slice(&self.tag);
        b
    }

    /// Parses the bytes: marker, version, kind, and zero where the kind carries nothing.
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
            2 => HandshakeKind::Challenge,
            3 => HandshakeKind::Proof,
            4 => HandshakeKind::Accept,
            k => return Err(format!("unknown handshake kind {k}")),
        };
        let from = r.u32()?;
        let to = r.u32()?;
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(r.take(NONCE_LEN)?);
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(r.take(TAG_LEN)?);
        r.finish()?;
        let (has_nonce, has_tag) = match kind {
            HandshakeKind::Hello => (true, false),
            HandshakeKind::Challenge => (true, true),
            HandshakeKind::Proof => (false, true),
            HandshakeKind::Accept => (false, false),
        };
        if (!has_nonce && nonce != [0; NONCE_LEN]) || (!has_tag && tag != [0; TAG_LEN]) {
            return Err(format!("{kind:?} with bytes where it carries nothing"));
        }
        Ok(Self {
            kind,
            from,
            to,
            nonce,
            tag,
        })
    }
}

/// The context both tags of one connection's handshake cover: the protocol, both ranks (the
/// connector's first) and both endpoint tokens (the connector's first), which crossed through
/// the bootstrap, so a tag is worth nothing for another connection.
pub fn handshake_context(
    connector: u32,
    acceptor: u32,
    connector_token: u64,
    acceptor_token: u64,
) -> Vec<u8> {
    let mut w = Writer::default();
    w.bytes(b"mscclpp-rs ethernet v2 ")
        .u32(connector)
        .u32(acceptor)
        .u64(connector_token)
        .u64(acceptor_token);
    w.0
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
        /// The destination's network key.
        key: u64,
    },
    /// Store `value` into the 8-byte word at `offset` of memory `id`, after earlier frames.
    Update {
        /// Destination `local_id`.
        id: u32,
        /// Destination offset (8-aligned).
        offset: u64,
        /// The value.
        value: u64,
        /// The destination's network key.
        key: u64,
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
    /// The 40 header bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let (op, id, a, b, c, k) = match *self {
            Frame::Write {
                id,
                offset,
                len,
                key,
            } => (OP_WRITE, id, offset, len, 0, key),
            Frame::Update {
                id,
                offset,
                value,
                key,
            } => (OP_UPDATE, id, offset, 8, value, key),
            Frame::Flush { seq } => (OP_FLUSH, 0, seq, 0, 0, 0),
            Frame::Bye => (OP_BYE, 0, 0, 0, 0, 0),
            Frame::Ack { seq } => (OP_ACK, 0, seq, 0, 0, 0),
            Frame::Error { len } => (OP_ERROR, 0, 0, len, 0, 0),
        };
        let mut h = [0u8; HEADER_LEN];
        h[0..4].copy_from_slice(&op.to_le_bytes());
        h[4..8].copy_from_slice(&id.to_le_bytes());
        h[8..16].copy_from_slice(&a.to_le_bytes());
        h[16..24].copy_from_slice(&b.to_le_bytes());
        h[24..32].copy_from_slice(&c.to_le_bytes());
        h[32..40].copy_from_slice(&k.to_le_bytes());
        h
    }

    /// Parses a header: known op, unused fields 0, lengths within their caps.
    pub fn decode(h: &[u8; HEADER_LEN]) -> Result<Self, String> {
        let mut r = Reader::new(h, "Ethernet frame header");
        let (op, id, a, b, c, key) = (r.u32()?, r.u32()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?);
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
                    key,
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
                    key,
                }
            }
            OP_FLUSH | OP_ACK => {
                zero("key", key)?;
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
                    ("key", key),
                ] {
                    zero(what, v)?;
                }
                Frame::Bye
            }
            OP_ERROR => {
                zero("key", key)?;
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

#[cfg(test)]
mod tests {
    use super::*;

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
            kind: HandshakeKind::Challenge,
            from: 3,
            to: 1,
            nonce: [5; NONCE_LEN],
            tag: [6; TAG_LEN],
        };
        let b = h.encode();
        assert_eq!(Handshake::decode(&b).unwrap(), h);
        let a = Handshake::new(HandshakeKind::Accept, 1, 3);
        assert_eq!(Handshake::decode(&a.encode()).unwrap(), a);
        let mut bad = b;
        bad[0] = b'X';
        assert!(Handshake::decode(&bad).is_err());
        let mut bad = b;
        bad[8] = 1; // version 1
        assert!(Handshake::decode(&bad).is_err());
        let mut bad = b;
        bad[12] = 7; // kind
        assert!(Handshake::decode(&bad).is_err());
        let mut bad = a.encode();
        bad[60] = 1; // a tag on an ACCEPT
        assert!(Handshake::decode(&bad).is_err());
        let mut bad = Handshake::new(HandshakeKind::Proof, 1, 3).encode();
        bad[30] = 1; // a nonce on a PROOF
        assert!(Handshake::decode(&bad).is_err());
        assert_ne!(
            handshake_context(1, 3, 10, 20),
            handshake_context(3, 1, 10, 20)
        );
        assert_ne!(
            handshake_context(1, 3, 10, 20),
            handshake_context(1, 3, 20, 10)
        );
    }

    #[test]
    fn frames_round_trip_and_rejection() {
        let frames = [
            Frame::Write {
                id: 7,
                offset: 1 << 40,
                len: CHUNK as u64,
                key: 0xfeed,
            },
            Frame::Write {
                id: 0,
                offset: 0,
                len: 1,
                key: 0,
            },
            Frame::Update {
                id: 2,
                offset: 64,
                value: u64::MAX,
                key: u64::MAX,
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
        let mut keyed_flush = enc(OP_FLUSH, 0, 3, 0, 0);
        keyed_flush[32] = 1;
        assert!(Frame::decode(&keyed_flush).is_err(), "a key on a flush");
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
}
