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
//! Bodies (sizes exact unless noted; `addr` is the 24-byte address below):
//!
//! | kind | code | from → to | body |
//! |---|---|---|---|
//! | [`Join`] | 1 | rank → root | magic u64, rank u32, size u32, listen addr, host hash u64, ms left of the sender's set-up deadline u64 (56 bytes) |
//! | [`Table`] | 2 | root → rank | magic u64, size u32, reserved u32, then `size` × (listen addr, host hash u64) (16 + 32·size bytes) |
//! | [`Abort`] | 3 | root → rank | code u32, count u32, then `count` ranks u32 (8 + 4·count bytes) |
//! | [`PeerHello`] | 4 | rank → rank | magic u64, from u32, size u32, to u32, reserved u32 (24 bytes) |
//! | [`Accept`] | 5 | rank → rank | magic u64, rank u32, reserved u32 (16 bytes) |
//! | [`Reject`] | 6 | acceptor → connector | code u32, reason length u32, reason (UTF-8, at most [`MAX_REASON_LEN`]) |
//!
//! An address is 24 bytes: family u8 (4 or 6), reserved u8, port u16, 16 address bytes (IPv4 in
//! the first 4, the rest 0), IPv6 scope id u32 (0 for IPv4).
//!
//! # Data frames (after set-up)
//!
//! Once the mesh is up, each pair of ranks shares one connection carrying data frames both ways:
//!
//! | offset | size | field | value |
//! |---|---|---|---|
//! | 0 | 4 | channel | [`CHANNEL_USER`] (user `send`/`recv`), [`CHANNEL_COLLECTIVE`] (barrier, all-gather, broadcast) or [`CHANNEL_GOODBYE`] (the last frame of a rank that finished normally; tag and length 0) |
//! | 4 | 4 | reserved | 0 |
//! | 8 | 8 | tag | user tag, or the collective's (operation, round, sequence) |
//! | 16 | 8 | length | at most [`MAX_DATA_LEN`] |
//! | 24 | length | payload | |

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};

/// First 8 bytes of every control frame.
pub const MARKER: [u8; 8] = *b"MSCLBOOT";
/// Protocol version spoken by this build. Peers of another version are rejected at handshake.
/// 2 (sixth session): the goodbye data frame ([`CHANNEL_GOODBYE`]), which a version-1 peer
/// would take for a malformed frame.
pub const VERSION: u32 = 2;
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
/// Body length of a [`Join`].
pub const JOIN_BODY_LEN: usize = 56;
/// Body length of a [`PeerHello`].
pub const PEER_HELLO_BODY_LEN: usize = 24;
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
    /// A rank registers with the root.
    Join,
    /// The root's answer once every rank joined: the address table.
    Table,
    /// The root's answer when set-up failed: why, and which ranks.
    Abort,
    /// A rank opens its mesh connection to a lower rank.
    PeerHello,
    /// A rank accepts a mesh connection.
    Accept,
    /// An acceptor (root or rank) refuses a connection.
    Reject,
}

impl Kind {
    /// Wire code.
    pub const fn code(self) -> u32 {
        match self {
            Kind::Join => 1,
            Kind::Table => 2,
            Kind::Abort => 3,
            Kind::PeerHello => 4,
            Kind::Accept => 5,
            Kind::Reject => 6,
        }
    }

    /// The kind of a wire code, if it is one.
    pub const fn from_code(code: u32) -> Option<Kind> {
        Some(match code {
            1 => Kind::Join,
            2 => Kind::Table,
            3 => Kind::Abort,
            4 => Kind::PeerHello,
            5 => Kind::Accept,
            6 => Kind::Reject,
            _ => return None,
        })
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

/// An address other ranks can connect to: a concrete IP and a nonzero port.
pub fn is_connectable(addr: &SocketAddr) -> bool {
    addr.port() != 0 && !addr.ip().is_unspecified() && !addr.ip().is_multicast()
}

/// A rank registers with the root (first frame on a rank → root connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Join {
    /// Session magic from the [`UniqueId`](super::UniqueId).
    pub magic: u64,
    /// Sender's rank.
    pub rank: usize,
    /// World size the sender was configured with.
    pub size: usize,
    /// Where the sender's own listener accepts mesh connections.
    pub listen: SocketAddr,
    /// Hash of the sender's host identity (groups ranks into nodes).
    pub host_hash: u64,
    /// Milliseconds left until the sender's set-up deadline; the root gives its verdict by the
    /// earliest deadline it has heard of, so no rank gives up before hearing why.
    pub deadline_ms: u64,
}

impl Join {
    /// The whole frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(JOIN_BODY_LEN);
        put_u64(&mut b, self.magic);
        put_u32(&mut b, rank_u32(self.rank));
        put_u32(&mut b, rank_u32(self.size));
        put_addr(&mut b, &self.listen);
        put_u64(&mut b, self.host_hash);
        put_u64(&mut b, self.deadline_ms);
        frame(Kind::Join, b)
    }

    /// Parses a body (no range checks beyond the layout; the root checks ranks and magic).
    pub fn decode(body: &[u8]) -> Result<Self, String> {
        let mut c = Cursor::new(body);
        let j = Join {
            magic: c.u64()?,
            rank: rank_usize(c.u32()?),
            size: rank_usize(c.u32()?),
            listen: get_addr(&mut c)?,
            host_hash: c.u64()?,
            deadline_ms: c.u64()?,
        };
        c.finish()?;
        Ok(j)
    }
}

/// One rank's row of the [`Table`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableEntry {
    /// The rank's listen address.
    pub listen: SocketAddr,
    /// The rank's host hash.
    pub host_hash: u64,
}

/// The root's answer once every rank has joined: every rank's listen address and host hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    /// Session magic.
    pub magic: u64,
    /// One entry per rank, in rank order.
    pub entries: Vec<TableEntry>,
}

impl Table {
    /// The whole frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(table_body_len(self.entries.len()));
        put_u64(&mut b, self.magic);
        put_u32(&mut b, rank_u32(self.entries.len()));
        put_u32(&mut b, 0);
        for e in &self.entries {
            put_addr(&mut b, &e.listen);
            put_u64(&mut b, e.host_hash);
        }
        frame(Kind::Table, b)
    }

    /// Parses a body, which must describe exactly `size` ranks with connectable addresses.
    pub fn decode(body: &[u8], size: usize) -> Result<Self, String> {
        if body.len() != table_body_len(size) {
            return Err(format!(
                "table of {} bytes, expected {} for {size} ranks",
                body.len(),
                table_body_len(size)
            ));
        }
        let mut c = Cursor::new(body);
        let magic = c.u64()?;
        let n = rank_usize(c.u32()?);
        c.zero_u32("table.reserved")?;
        if n != size {
            return Err(format!("table for {n} ranks, expected {size}"));
        }
        let mut entries = Vec::with_capacity(n);
        for r in 0..n {
            let listen = get_addr(&mut c)?;
            if !is_connectable(&listen) {
                return Err(format!(
                    "table entry of rank {r} has unusable address {listen}"
                ));
            }
            entries.push(TableEntry {
                listen,
                host_hash: c.u64()?,
            });
        }
        c.finish()?;
        Ok(Self { magic, entries })
    }
}

/// Why the root gave up on set-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AbortCode {
    /// Ranks that had joined closed their connection before the table was sent.
    RankLeft,
    /// Ranks did not join before the deadline.
    RanksMissing,
    /// The root itself stopped (its own rank failed).
    RootStopped,
}

impl AbortCode {
    /// Wire code.
    pub const fn code(self) -> u32 {
        match self {
            AbortCode::RankLeft => 1,
            AbortCode::RanksMissing => 2,
            AbortCode::RootStopped => 3,
        }
    }

    fn from_code(code: u32) -> Option<Self> {
        Some(match code {
            1 => AbortCode::RankLeft,
            2 => AbortCode::RanksMissing,
            3 => AbortCode::RootStopped,
            _ => return None,
        })
    }
}

/// The root's answer when set-up failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Abort {
    /// Why.
    pub code: AbortCode,
    /// The ranks concerned (sorted).
    pub ranks: Vec<usize>,
}

impl Abort {
    /// The whole frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(8 + 4 * self.ranks.len());
        put_u32(&mut b, self.code.code());
        put_u32(&mut b, rank_u32(self.ranks.len()));
        for &r in &self.ranks {
            put_u32(&mut b, rank_u32(r));
        }
        frame(Kind::Abort, b)
    }

    /// Parses a body; every rank must be below `size`.
    pub fn decode(body: &[u8], size: usize) -> Result<Self, String> {
        let mut c = Cursor::new(body);
        let raw = c.u32()?;
        let code = AbortCode::from_code(raw).ok_or_else(|| format!("unknown abort code {raw}"))?;
        let n = rank_usize(c.u32()?);
        if n > size {
            return Err(format!("abort names {n} ranks in a world of {size}"));
        }
        let mut ranks = Vec::with_capacity(n);
        for _ in 0..n {
            let r = rank_usize(c.u32()?);
            if r >= size {
                return Err(format!("abort names rank {r} in a world of {size}"));
            }
            ranks.push(r);
        }
        c.finish()?;
        Ok(Self { code, ranks })
    }
}

/// A rank opens its mesh connection to a lower rank (first frame on a rank → rank connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerHello {
    /// Session magic.
    pub magic: u64,
    /// Connecting rank.
    pub from: usize,
    /// World size.
    pub size: usize,
    /// Rank the connector believes it reached.
    pub to: usize,
}

impl PeerHello {
    /// The whole frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(PEER_HELLO_BODY_LEN);
        put_u64(&mut b, self.magic);
        put_u32(&mut b, rank_u32(self.from));
        put_u32(&mut b, rank_u32(self.size));
        put_u32(&mut b, rank_u32(self.to));
        put_u32(&mut b, 0);
        frame(Kind::PeerHello, b)
    }

    /// Parses a body.
    pub fn decode(body: &[u8]) -> Result<Self, String> {
        let mut c = Cursor::new(body);
        let h = PeerHello {
            magic: c.u64()?,
            from: rank_usize(c.u32()?),
            size: rank_usize(c.u32()?),
            to: rank_usize(c.u32()?),
        };
        c.zero_u32("hello.reserved")?;
        c.finish()?;
        Ok(h)
    }
}

/// A rank accepts a mesh connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accept {
    /// Session magic.
    pub magic: u64,
    /// Accepting rank.
    pub rank: usize,
}

impl Accept {
    /// The whole frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(ACCEPT_BODY_LEN);
        put_u64(&mut b, self.magic);
        put_u32(&mut b, rank_u32(self.rank));
        put_u32(&mut b, 0);
        frame(Kind::Accept, b)
    }

    /// Parses a body.
    pub fn decode(body: &[u8]) -> Result<Self, String> {
        let mut c = Cursor::new(body);
        let a = Accept {
            magic: c.u64()?,
            rank: rank_usize(c.u32()?),
        };
        c.zero_u32("accept.reserved")?;
        c.finish()?;
        Ok(a)
    }
}

/// Why an acceptor refused a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RejectCode {
    /// The first bytes were not [`MARKER`].
    BadMarker,
    /// Wrong session magic (a peer of another job).
    BadMagic,
    /// Another protocol version.
    Version,
    /// A frame that does not parse, or a length over its cap.
    Malformed,
    /// The rank already has a connection.
    Duplicate,
    /// World size or target rank does not match.
    Mismatch,
    /// Nothing complete arrived within the handshake deadline.
    Timeout,
    /// A frame kind this listener does not take, or a rank that should not connect here.
    Unexpected,
    /// A code this build does not know.
    Other(u32),
}

impl RejectCode {
    /// Wire code.
    pub const fn code(self) -> u32 {
        match self {
            RejectCode::BadMarker => 1,
            RejectCode::BadMagic => 2,
            RejectCode::Version => 3,
            RejectCode::Malformed => 4,
            RejectCode::Duplicate => 5,
            RejectCode::Mismatch => 6,
            RejectCode::Timeout => 7,
            RejectCode::Unexpected => 8,
            RejectCode::Other(c) => c,
        }
    }

    /// The code's meaning.
    pub const fn from_code(code: u32) -> Self {
        match code {
            1 => RejectCode::BadMarker,
            2 => RejectCode::BadMagic,
            3 => RejectCode::Version,
            4 => RejectCode::Malformed,
            5 => RejectCode::Duplicate,
            6 => RejectCode::Mismatch,
            7 => RejectCode::Timeout,
            8 => RejectCode::Unexpected,
            c => RejectCode::Other(c),
        }
    }
}

/// An acceptor refuses a connection, saying why, then closes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    /// Why (machine-readable).
    pub code: RejectCode,
    /// Why (for people); cut to [`MAX_REASON_LEN`] bytes.
    pub reason: String,
}

impl Reject {
    /// The whole frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut end = self.reason.len().min(MAX_REASON_LEN);
        while !self.reason.is_char_boundary(end) {
            end -= 1;
        }
        let reason = &self.reason.as_bytes()[..end];
        let mut b = Vec::with_capacity(8 + reason.len());
        put_u32(&mut b, self.code.code());
        put_u32(&mut b, rank_u32(reason.len()));
        b.extend_from_slice(reason);
        frame(Kind::Reject, b)
    }

    /// Parses a body.
    pub fn decode(body: &[u8]) -> Result<Self, String> {
        let mut c = Cursor::new(body);
        let code = RejectCode::from_code(c.u32()?);
        let n = rank_usize(c.u32()?);
        if n > MAX_REASON_LEN {
            return Err(format!("reject reason of {n} bytes"));
        }
        let reason = String::from_utf8_lossy(c.bytes(n)?).into_owned();
        c.finish()?;
        Ok(Self { code, reason })
    }
}

/// The 24-byte header of a data frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataHeader {
    /// [`CHANNEL_USER`], [`CHANNEL_COLLECTIVE`] or [`CHANNEL_GOODBYE`].
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
        if channel != CHANNEL_USER && channel != CHANNEL_COLLECTIVE && channel != CHANNEL_GOODBYE {
            return Err(format!("unknown data channel {channel}"));
        }
        if channel == CHANNEL_GOODBYE && (tag != 0 || len != 0) {
            return Err(format!("a goodbye with tag {tag} and {len} bytes"));
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
mod tests {
    use super::*;

    fn body(frame: &[u8]) -> &[u8] {
        &frame[CONTROL_HEADER_LEN..]
    }

    #[test]
    fn control_frames_round_trip() {
        let v4: SocketAddr = "10.1.2.3:4567".parse().unwrap();
        let v6 = SocketAddr::V6(SocketAddrV6::new("fe80::1".parse().unwrap(), 80, 0, 3));
        let j = Join {
            magic: 7,
            rank: 3,
            size: 8,
            listen: v4,
            host_hash: 9,
            deadline_ms: 1000,
        };
        let f = j.encode();
        assert_eq!(f.len(), CONTROL_HEADER_LEN + JOIN_BODY_LEN);
        let h = ControlHeader::decode(f[..24].try_into().unwrap()).unwrap();
        assert_eq!(
            (h.kind, h.body_len as usize),
            (Kind::Join.code(), JOIN_BODY_LEN)
        );
        assert_eq!(Join::decode(body(&f)).unwrap(), j);

        let t = Table {
            magic: 1,
            entries: vec![
                TableEntry {
                    listen: v4,
                    host_hash: 2,
                },
                TableEntry {
                    listen: v6,
                    host_hash: 3,
                },
            ],
        };
        assert_eq!(Table::decode(body(&t.encode()), 2).unwrap(), t);
        assert!(Table::decode(body(&t.encode()), 3).is_err());

        let a = Abort {
            code: AbortCode::RankLeft,
            ranks: vec![1, 3],
        };
        assert_eq!(Abort::decode(body(&a.encode()), 4).unwrap(), a);
        assert!(Abort::decode(body(&a.encode()), 3).is_err());

        let p = PeerHello {
            magic: 5,
            from: 2,
            size: 4,
            to: 1,
        };
        assert_eq!(PeerHello::decode(body(&p.encode())).unwrap(), p);
        let acc = Accept { magic: 5, rank: 1 };
        assert_eq!(Accept::decode(body(&acc.encode())).unwrap(), acc);
        let r = Reject {
            code: RejectCode::Version,
            reason: "x".repeat(1000),
        };
        let back = Reject::decode(body(&r.encode())).unwrap();
        assert_eq!(
            (back.code, back.reason.len()),
            (RejectCode::Version, MAX_REASON_LEN)
        );
    }

    #[test]
    fn headers_reject_garbage() {
        let mut h = ControlHeader::new(Kind::Join, 56).encode();
        h[20] = 1;
        assert_eq!(ControlHeader::decode(&h), Err(HeaderError::Reserved));
        h[8] = 9;
        assert_eq!(ControlHeader::decode(&h), Err(HeaderError::Version(9)));
        h[0] = b'X';
        assert_eq!(ControlHeader::decode(&h), Err(HeaderError::BadMarker));

        let d = DataHeader {
            channel: CHANNEL_USER,
            tag: 3,
            len: MAX_DATA_LEN + 1,
        }
        .encode();
        assert!(DataHeader::decode(&d).is_err());
        let d = DataHeader {
            channel: 7,
            tag: 3,
            len: 1,
        }
        .encode();
        assert!(DataHeader::decode(&d).is_err());
        let d = DataHeader {
            channel: CHANNEL_COLLECTIVE,
            tag: 3,
            len: 1,
        }
        .encode();
        assert_eq!(DataHeader::decode(&d).unwrap().tag, 3);
        // A goodbye carries nothing: a tag or a payload makes it malformed.
        let bye = |tag, len| {
            DataHeader::decode(
                &DataHeader {
                    channel: CHANNEL_GOODBYE,
                    tag,
                    len,
                }
                .encode(),
            )
        };
        assert!(bye(0, 0).is_ok());
        assert!(bye(1, 0).is_err());
        assert!(bye(0, 8).is_err());
    }

    #[test]
    fn bodies_reject_truncation_and_padding() {
        let j = Join {
            magic: 1,
            rank: 0,
            size: 1,
            listen: "1.2.3.4:5".parse().unwrap(),
            host_hash: 0,
            deadline_ms: 0,
        }
        .encode();
        for cut in 0..JOIN_BODY_LEN {
            assert!(Join::decode(&body(&j)[..cut]).is_err());
        }
        let mut long = body(&j).to_vec();
        long.push(0);
        assert!(Join::decode(&long).is_err());
        let mut bad = body(&j).to_vec();
        bad[16] = 5; // address family
        assert!(Join::decode(&bad).is_err());
        let mut bad = body(&j).to_vec();
        bad[16 + 10] = 1; // IPv4 padding
        assert!(Join::decode(&bad).is_err());
    }
}
