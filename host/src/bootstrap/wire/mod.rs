//! The bootstrap's bytes on the wire: the one source of truth for every frame's layout.
//!
//! These are *serialized* messages on a TCP byte stream, not structs mapped into shared or device
//! memory, so they do not live in `mscclpp-shared` (STYLE 1 is about `#[repr(C)]` layouts that two
//! sides map; here only this module writes and parses the bytes). Every integer is
//! little-endian. Nothing read is trusted: every parser checks lengths, reserved fields and ranges
//! and returns a reason instead of panicking.
//!
//! # Control frames (set-up)
//!
//! Every set-up connection starts with a control frame from the connecting side, and every answer
//! is a control frame too. All control frames share one 24-byte header, whose layout is frozen
//! across protocol versions (so that a peer of another version is recognised as such):
//!
//! | offset | size | field | value |
//! |---|---|---|---|
//! | 0 | 8 | marker | [`MARKER`] (`b"MSCLBOOT"`): rejects stray and garbage connections |
//! | 8 | 4 | version | [`VERSION`] of the sender |
//! | 12 | 4 | kind | a [`Kind`] code |
//! | 16 | 4 | body length | checked against the kind's cap before a byte of body is read |
//! | 20 | 4 | reserved | 0 |
//!
//! Bodies (sizes exact unless noted; `addr` is the 24-byte address below; `tag` a 32-byte
//! HMAC-SHA-256 tag of [`crate::auth`]):
//!
//! | kind | code | from → to | body |
//! |---|---|---|---|
//! | [`Hello`] | 1 | connector → acceptor | magic u64, purpose u32 (1 join, 2 link), from u32, to u32 ([`ROOT`] at the root), size u32, nonce (32) (56 bytes) |
//! | [`Challenge`] | 2 | acceptor → connector | nonce (32), job nonce (32), tag (32): the acceptor's proof over the hello body, the job nonce and both nonces (96 bytes) |
//! | [`Join`] | 3 | rank → root | tag (32): the rank's proof over the hello body, the job nonce, both nonces and the rest of this body; listen addr, host hash u64, ms left of the sender's set-up deadline u64 (72 bytes) |
//! | [`Proof`] | 4 | rank → rank | tag (32): the connector's proof over the hello body, the job nonce and both nonces (32 bytes) |
//! | [`Table`] | 5 | root → rank | magic u64, size u32, reserved u32, then `size` × (listen addr, host hash u64) (16 + 32·size bytes) |
//! | [`Abort`] | 6 | root → rank | code u32, count u32, then `count` ranks u32 (8 + 4·count bytes) |
//! | [`Accept`] | 7 | rank → rank | magic u64, rank u32, reserved u32 (16 bytes) |
//! | [`Reject`] | 8 | acceptor → connector | code u32, reason length u32, reason (UTF-8, at most [`MAX_REASON_LEN`]) |
//!
//! A set-up connection is `HELLO`, `CHALLENGE`, then `JOIN` (root: answered by `TABLE` or `ABORT`
//! once every rank has joined) or `PROOF` (rank: answered by `ACCEPT`); any step may be answered by
//! `REJECT` instead. Nothing after `HELLO` is answered before the connector's tag checks out.
//!
//! The *job nonce* is drawn by the root when it starts; every `CHALLENGE` of the world carries
//! it (the root's, and every rank's once it has joined). With a passphrase (`MSCCLPP_SECRET`)
//! the world's key is derived from the passphrase salted with the root address and this nonce
//! (`bootstrap::keying`), so a rank learns it from the root's challenge before it can check
//! the root's tag.
//!
//! An address is 24 bytes: family u8 (4 or 6), reserved u8, port u16, 16 address bytes (IPv4 in
//! the first 4, the rest 0), IPv6 scope id u32 (0 for IPv4).
//!
//! # Data frames (after set-up)
//!
//! Once a link is accepted it carries data frames both ways:
//!
//! | offset | size | field | value |
//! |---|---|---|---|
//! | 0 | 4 | channel | [`CHANNEL_USER`] (user `send`/`recv`), [`CHANNEL_COLLECTIVE`] (barrier, all-gather, broadcast), [`CHANNEL_GOODBYE`] (the last frame of a rank that finished normally; tag and length 0) or [`CHANNEL_NOTICE`] (a [`Notice`]: a rank is gone; tag 0) |
//! | 4 | 4 | reserved | 0 |
//! | 8 | 8 | tag | user tag, or the collective's (operation, round, sequence) |
//! | 16 | 8 | length | at most [`MAX_DATA_LEN`] |
//! | 24 | length | payload | |

mod set_up;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};

use crate::auth::Nonce;

pub use self::set_up::{
    Abort, AbortCode, Accept, Challenge, Hello, Join, Notice, Proof, Purpose, Reject, RejectCode,
    Table, TableEntry,
};

/// First 8 bytes of every control frame.
pub const MARKER: [u8; 8] = *b"MSCLBOOT";
/// Protocol version spoken by this build. Peers of another version are rejected at handshake.
/// 2 (sixth session): the goodbye data frame ([`CHANNEL_GOODBYE`]), which a version-1 peer
/// would take for a malformed frame. 3: authenticated handshakes (`HELLO`, `CHALLENGE`,
/// `JOIN`/`PROOF`), links opened on first use instead of a mesh, notices ([`CHANNEL_NOTICE`]).
/// 4: the job nonce in `CHALLENGE` (the salt of a passphrase's key), covered by both tags. A
/// peer of another version gets `REJECT Version` naming both (`Error::BootstrapVersion` on
/// the connector's side), since the header's layout never changes.
pub const VERSION: u32 = 4;
/// Bytes in a control frame header.
pub const CONTROL_HEADER_LEN: usize = 24;
/// Bytes in a data frame header.
pub const DATA_HEADER_LEN: usize = 24;
/// Largest data frame payload (1 GiB). Longer `send`s are refused; a longer header read from the
/// wire marks the connection as malformed.
pub const MAX_DATA_LEN: u64 = 1 << 30;
/// Largest number of ranks the protocol accepts.
pub const MAX_RANKS: usize = 1 << 20;
/// Largest reason text in a [`Reject`].
pub const MAX_REASON_LEN: usize = 256;
/// Bytes of an encoded socket address.
pub const ADDR_LEN: usize = 24;
/// The `to` of a [`Hello`] addressed to the root.
pub const ROOT: usize = u32::MAX as usize;
/// Body length of a [`Hello`].
pub const HELLO_BODY_LEN: usize = 24 + crate::auth::NONCE_LEN;
/// Body length of a [`Challenge`].
pub const CHALLENGE_BODY_LEN: usize = 2 * crate::auth::NONCE_LEN + crate::auth::TAG_LEN;
/// Body length of a [`Join`].
pub const JOIN_BODY_LEN: usize = crate::auth::TAG_LEN + ADDR_LEN + 16;
/// Body length of a [`Proof`].
pub const PROOF_BODY_LEN: usize = crate::auth::TAG_LEN;
/// Largest payload of a [`Notice`].
pub const MAX_NOTICE_LEN: usize = 8 + MAX_REASON_LEN;
/// Body length of an [`Accept`].
pub const ACCEPT_BODY_LEN: usize = 16;
/// Bytes per [`Table`] entry.
pub const TABLE_ENTRY_LEN: usize = ADDR_LEN + 8;
/// Largest body of a [`Reject`].
pub const MAX_REJECT_BODY: usize = 8 + MAX_REASON_LEN;

/// Data frame channel of user `send`/`recv`.
pub const CHANNEL_USER: u32 = 0;
/// Data frame channel of the bootstrap's own collectives.
pub const CHANNEL_COLLECTIVE: u32 = 1;
/// Data frame channel of the goodbye: the last frame a rank sends on each connection when it
/// closes its bootstrap after finishing normally (no payload, tag 0). A connection that ends
/// without it is a rank that died or failed.
pub const CHANNEL_GOODBYE: u32 = 2;
/// Data frame channel of notices ([`Notice`]: a rank is gone), passed on from rank to rank.
pub const CHANNEL_NOTICE: u32 = 3;

/// Body length of a [`Table`] for `size` ranks.
pub const fn table_body_len(size: usize) -> usize {
    16 + TABLE_ENTRY_LEN * size
}

/// Largest body of an [`Abort`] in a world of `size` ranks.
pub const fn max_abort_body(size: usize) -> usize {
    8 + 4 * size
}

/// What a control frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Kind {
    /// A connector says who it is, what it wants, and its nonce.
    Hello,
    /// The acceptor's nonce and proof.
    Challenge,
    /// A rank's proof and registration at the root.
    Join,
    /// A rank's proof for a link.
    Proof,
    /// The root's answer once every rank joined: the address table.
    Table,
    /// The root's answer when set-up failed: why, and which ranks.
    Abort,
    /// A rank accepts a link.
    Accept,
    /// An acceptor (root or rank) refuses a connection.
    Reject,
}

impl Kind {
    const ALL: [Kind; 8] = [
        Kind::Hello,
        Kind::Challenge,
        Kind::Join,
        Kind::Proof,
        Kind::Table,
        Kind::Abort,
        Kind::Accept,
        Kind::Reject,
    ];

    /// Wire code.
    pub const fn code(self) -> u32 {
        match self {
            Kind::Hello => 1,
            Kind::Challenge => 2,
            Kind::Join => 3,
            Kind::Proof => 4,
            Kind::Table => 5,
            Kind::Abort => 6,
            Kind::Accept => 7,
            Kind::Reject => 8,
        }
    }

    /// The kind of a wire code, if it is one.
    pub fn from_code(code: u32) -> Option<Kind> {
        Self::ALL.into_iter().find(|k| k.code() == code)
    }
}

/// The parsed 24-byte control frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControlHeader {
    /// Sender's protocol version.
    pub version: u32,
    /// [`Kind`] code (unchecked).
    pub kind: u32,
    /// Body length (unchecked against any cap).
    pub body_len: u32,
}

/// Why a control header was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderError {
    /// The first 8 bytes are not [`MARKER`].
    BadMarker,
    /// Another protocol version (the sender's).
    Version(u32),
    /// The reserved word is not 0.
    Reserved,
}

impl ControlHeader {
    /// A header of this build's version.
    pub fn new(kind: Kind, body_len: usize) -> Self {
        Self {
            version: VERSION,
            kind: kind.code(),
            body_len: u32::try_from(body_len).unwrap_or(u32::MAX),
        }
    }

    /// The 24 header bytes.
    pub fn encode(&self) -> [u8; CONTROL_HEADER_LEN] {
        let mut b = [0u8; CONTROL_HEADER_LEN];
        b[0..8].copy_from_slice(&MARKER);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&self.kind.to_le_bytes());
        b[16..20].copy_from_slice(&self.body_len.to_le_bytes());
        b
    }

    /// Parses a header: marker first, then version (so a peer of another version is named as
    /// such whatever follows), then the reserved word.
    pub fn decode(b: &[u8; CONTROL_HEADER_LEN]) -> Result<Self, HeaderError> {
        if b[0..8] != MARKER {
            return Err(HeaderError::BadMarker);
        }
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let version = word(8);
        if version != VERSION {
            return Err(HeaderError::Version(version));
        }
        if word(20) != 0 {
            return Err(HeaderError::Reserved);
        }
        Ok(Self {
            version,
            kind: word(12),
            body_len: word(16),
        })
    }
}

/// Header followed by body: one whole control frame.
fn frame(kind: Kind, body: Vec<u8>) -> Vec<u8> {
    let mut out = Vec::with_capacity(CONTROL_HEADER_LEN + body.len());
    out.extend_from_slice(&ControlHeader::new(kind, body.len()).encode());
    out.extend_from_slice(&body);
    out
}

/// Little-endian reader over a body; every getter fails instead of reading past the end.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    fn bytes(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let end = end.ok_or_else(|| {
            format!(
                "body of {} bytes ends early (needed {n} at offset {})",
                self.buf.len(),
                self.pos
            )
        })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.bytes(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, String> {
        let b = self.bytes(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, String> {
        let b = self.bytes(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, String> {
        let b = self.bytes(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }

    fn zero_u32(&mut self, what: &str) -> Result<(), String> {
        match self.u32()? {
            0 => Ok(()),
            v => Err(format!("reserved field {what} is {v}, not 0")),
        }
    }

    fn finish(&self) -> Result<(), String> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(format!(
                "{} trailing bytes after the body",
                self.buf.len() - self.pos
            ))
        }
    }
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn rank_u32(rank: usize) -> u32 {
    u32::try_from(rank).unwrap_or(u32::MAX)
}

fn rank_usize(rank: u32) -> usize {
    // u32 always fits in usize on the 32- and 64-bit targets this crate builds for.
    rank as usize
}

/// Appends the 24-byte encoding of `addr`.
pub fn put_addr(out: &mut Vec<u8>, addr: &SocketAddr) {
    let (family, ip, scope): (u8, [u8; 16], u32) = match addr {
        SocketAddr::V4(a) => {
            let mut ip = [0u8; 16];
            ip[..4].copy_from_slice(&a.ip().octets());
            (4, ip, 0)
        }
        SocketAddr::V6(a) => (6, a.ip().octets(), a.scope_id()),
    };
    out.push(family);
    out.push(0);
    out.extend_from_slice(&addr.port().to_le_bytes());
    out.extend_from_slice(&ip);
    put_u32(out, scope);
}

fn get_addr(c: &mut Cursor<'_>) -> Result<SocketAddr, String> {
    let family = c.u8()?;
    if c.u8()? != 0 {
        return Err("address: reserved byte is not 0".into());
    }
    let port = c.u16()?;
    let mut ip = [0u8; 16];
    ip.copy_from_slice(c.bytes(16)?);
    let scope = c.u32()?;
    match family {
        4 => {
            if ip[4..].iter().any(|&b| b != 0) || scope != 0 {
                return Err("IPv4 address with nonzero padding".into());
            }
            Ok(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3])),
                port,
            ))
        }
        6 => Ok(SocketAddr::V6(SocketAddrV6::new(
            Ipv6Addr::from(ip),
            port,
            0,
            scope,
        ))),
        f => Err(format!("address family {f} is neither 4 nor 6")),
    }
}

/// Decodes one address (24 bytes exactly).
pub fn decode_addr(b: &[u8]) -> Result<SocketAddr, String> {
    let mut c = Cursor::new(b);
    let a = get_addr(&mut c)?;
    c.finish()?;
    Ok(a)
}

/// The label every handshake tag of the bootstrap starts its context with.
const AUTH_LABEL: &[u8] = b"mscclpp-rs bootstrap v4 ";

/// The context the acceptor's tag (in a [`Challenge`]) covers: the [`Hello`]'s body and the
/// job nonce.
pub fn acceptor_context(hello_body: &[u8], job: &Nonce) -> Vec<u8> {
    [AUTH_LABEL, hello_body, &job.0].concat()
}

/// The context the connector's tag (in a [`Join`] or [`Proof`]) covers: the [`Hello`]'s body,
/// the job nonce and the request ([`Join::request`]; empty for a [`Proof`]).
pub fn connector_context(hello_body: &[u8], job: &Nonce, request: &[u8]) -> Vec<u8> {
    [AUTH_LABEL, hello_body, &job.0, request].concat()
}

/// An address other ranks can connect to: a concrete IP and a nonzero port.
pub fn is_connectable(addr: &SocketAddr) -> bool {
    addr.port() != 0 && !addr.ip().is_unspecified() && !addr.ip().is_multicast()
}

/// The 24-byte header of a data frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataHeader {
    /// [`CHANNEL_USER`], [`CHANNEL_COLLECTIVE`], [`CHANNEL_GOODBYE`] or [`CHANNEL_NOTICE`].
    pub channel: u32,
    /// Tag.
    pub tag: u64,
    /// Payload bytes that follow.
    pub len: u64,
}

impl DataHeader {
    /// The 24 header bytes.
    pub fn encode(&self) -> [u8; DATA_HEADER_LEN] {
        let mut b = [0u8; DATA_HEADER_LEN];
        b[0..4].copy_from_slice(&self.channel.to_le_bytes());
        b[8..16].copy_from_slice(&self.tag.to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Parses a header; the channel must be known, the length at most [`MAX_DATA_LEN`] (and 0
    /// with tag 0 for a goodbye).
    pub fn decode(b: &[u8; DATA_HEADER_LEN]) -> Result<Self, String> {
        let mut c = Cursor::new(b);
        let channel = c.u32()?;
        c.zero_u32("data.reserved")?;
        let tag = c.u64()?;
        let len = c.u64()?;
        if ![
            CHANNEL_USER,
            CHANNEL_COLLECTIVE,
            CHANNEL_GOODBYE,
            CHANNEL_NOTICE,
        ]
        .contains(&channel)
        {
            return Err(format!("unknown data channel {channel}"));
        }
        if channel == CHANNEL_GOODBYE && (tag != 0 || len != 0) {
            return Err(format!("a goodbye with tag {tag} and {len} bytes"));
        }
        if channel == CHANNEL_NOTICE && (tag != 0 || len > MAX_NOTICE_LEN as u64) {
            return Err(format!("a notice with tag {tag} and {len} bytes"));
        }
        if len > MAX_DATA_LEN {
            return Err(format!(
                "data frame of {len} bytes exceeds the {MAX_DATA_LEN}-byte cap"
            ));
        }
        Ok(Self { channel, tag, len })
    }
}

#[cfg(test)]
mod tests;
