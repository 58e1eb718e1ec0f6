//! The set-up messages of the bootstrap's wire (the control frames' bodies; layouts in the
//! [module docs](super)).

use std::net::SocketAddr;

use super::{
    ACCEPT_BODY_LEN, CHALLENGE_BODY_LEN, Cursor, HELLO_BODY_LEN, JOIN_BODY_LEN, Kind,
    MAX_REASON_LEN, frame, get_addr, is_connectable, put_addr, put_u32, put_u64, rank_u32,
    rank_usize, table_body_len,
};
use crate::auth::{NONCE_LEN, Nonce, TAG_LEN};

/// What a connection is for (a [`Hello`]'s purpose).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Purpose {
    /// A rank joins at the root (the root's listener).
    Join,
    /// A rank opens a link to another rank (that rank's listener).
    Link,
}

impl Purpose {
    /// Wire code.
    pub const fn code(self) -> u32 {
        match self {
            Purpose::Join => 1,
            Purpose::Link => 2,
        }
    }

    /// The purpose of a wire code, if it is one.
    pub const fn from_code(code: u32) -> Option<Self> {
        match code {
            1 => Some(Purpose::Join),
            2 => Some(Purpose::Link),
            _ => None,
        }
    }
}

/// The first frame on every set-up connection (connector → acceptor): who connects, whom it
/// wants, for what, and its nonce. Its body is the context both tags of the handshake cover
/// ([`crate::auth`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// Session magic from the [`UniqueId`](crate::bootstrap::UniqueId) (tells jobs apart; not
    /// a secret).
    pub magic: u64,
    /// What the connection is for.
    pub purpose: Purpose,
    /// The connector's rank.
    pub from: usize,
    /// The rank it wants ([`ROOT`](super::ROOT) for the root).
    pub to: usize,
    /// The world size it was configured with.
    pub size: usize,
    /// The connector's nonce.
    pub nonce: Nonce,
}

impl Hello {
    /// The body (the handshake's context).
    pub fn body(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HELLO_BODY_LEN);
        put_u64(&mut b, self.magic);
        put_u32(&mut b, self.purpose.code());
        put_u32(&mut b, rank_u32(self.from));
        put_u32(&mut b, rank_u32(self.to));
        put_u32(&mut b, rank_u32(self.size));
        b.extend_from_slice(&self.nonce.0);
        b
    }

    /// The whole frame.
    pub fn encode(&self) -> Vec<u8> {
        frame(Kind::Hello, self.body())
    }

    /// Parses a body (layout only; the acceptor checks magic, purpose and ranks).
    pub fn decode(body: &[u8]) -> Result<Self, String> {
        let mut c = Cursor::new(body);
        let magic = c.u64()?;
        let raw = c.u32()?;
        let purpose = Purpose::from_code(raw).ok_or_else(|| format!("unknown purpose {raw}"))?;
        let from = rank_usize(c.u32()?);
        let to = rank_usize(c.u32()?);
        let size = rank_usize(c.u32()?);
        let nonce = c.array::<NONCE_LEN>()?;
        c.finish()?;
        Ok(Self {
            magic,
            purpose,
            from,
            to,
            size,
            nonce: Nonce(nonce),
        })
    }
}

/// The acceptor's answer to a [`Hello`]: its nonce, the world's job nonce, and its proof that
/// it knows the world's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Challenge {
    /// The acceptor's nonce.
    pub nonce: Nonce,
    /// The root's job nonce (the salt of a passphrase's key; [module docs](super)).
    pub job: Nonce,
    /// `auth::tag(Acceptor, hello body ‖ job, Nc, Na)`.
    pub tag: [u8; TAG_LEN],
}

impl Challenge {
    /// The whole frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(CHALLENGE_BODY_LEN);
        b.extend_from_slice(&self.nonce.0);
        b.extend_from_slice(&self.job.0);
        b.extend_from_slice(&self.tag);
        frame(Kind::Challenge, b)
    }

    /// Parses a body.
    pub fn decode(body: &[u8]) -> Result<Self, String> {
        let mut c = Cursor::new(body);
        let nonce = Nonce(c.array::<NONCE_LEN>()?);
        let job = Nonce(c.array::<NONCE_LEN>()?);
        let tag = c.array::<TAG_LEN>()?;
        c.finish()?;
        Ok(Self { nonce, job, tag })
    }
}

/// A rank's proof and request at the root (connector → root, after the [`Challenge`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Join {
    /// `auth::tag(Connector, hello body ‖ job ‖ request, Nc, Na)`, where the request is the
    /// rest of this body.
    pub tag: [u8; TAG_LEN],
    /// Where the sender's own listener accepts links.
    pub listen: SocketAddr,
    /// Hash of the sender's host identity (groups ranks into nodes).
    pub host_hash: u64,
    /// Milliseconds left until the sender's set-up deadline; the root gives its verdict by the
    /// earliest deadline it has heard of, so no rank gives up before hearing why.
    pub deadline_ms: u64,
}

impl Join {
    /// The request part (what the tag covers after the hello body).
    pub fn request(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(JOIN_BODY_LEN - TAG_LEN);
        put_addr(&mut b, &self.listen);
        put_u64(&mut b, self.host_hash);
        put_u64(&mut b, self.deadline_ms);
        b
    }

    /// The whole frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(JOIN_BODY_LEN);
        b.extend_from_slice(&self.tag);
        b.extend_from_slice(&self.request());
        frame(Kind::Join, b)
    }

    /// Parses a body (layout only; the root checks the tag and the address).
    pub fn decode(body: &[u8]) -> Result<Self, String> {
        let mut c = Cursor::new(body);
        let tag = c.array::<TAG_LEN>()?;
        let j = Join {
            tag,
            listen: get_addr(&mut c)?,
            host_hash: c.u64()?,
            deadline_ms: c.u64()?,
        };
        c.finish()?;
        Ok(j)
    }
}

/// A rank's proof for a link (connector → rank, after the [`Challenge`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proof {
    /// `auth::tag(Connector, hello body ‖ job, Nc, Na)`.
    pub tag: [u8; TAG_LEN],
}

impl Proof {
    /// The whole frame.
    pub fn encode(&self) -> Vec<u8> {
        frame(Kind::Proof, self.tag.to_vec())
    }

    /// Parses a body.
    pub fn decode(body: &[u8]) -> Result<Self, String> {
        let mut c = Cursor::new(body);
        let tag = c.array::<TAG_LEN>()?;
        c.finish()?;
        Ok(Self { tag })
    }
}

/// A rank tells the others, through its links, that a rank is gone (payload of a
/// [`CHANNEL_NOTICE`](super::CHANNEL_NOTICE) data frame): each rank that hears it first passes it
/// on, so a death seen by one rank reaches every rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// The rank that is gone.
    pub rank: usize,
    /// Why (for people); cut to [`MAX_REASON_LEN`] bytes.
    pub reason: String,
}

impl Notice {
    /// The payload.
    pub fn encode(&self) -> Vec<u8> {
        let reason = cut(&self.reason);
        let mut b = Vec::with_capacity(8 + reason.len());
        put_u32(&mut b, rank_u32(self.rank));
        put_u32(&mut b, rank_u32(reason.len()));
        b.extend_from_slice(reason);
        b
    }

    /// Parses a payload; the rank must be below `size`.
    pub fn decode(body: &[u8], size: usize) -> Result<Self, String> {
        let mut c = Cursor::new(body);
        let rank = rank_usize(c.u32()?);
        if rank >= size {
            return Err(format!("notice about rank {rank} in a world of {size}"));
        }
        let n = rank_usize(c.u32()?);
        if n > MAX_REASON_LEN {
            return Err(format!("notice reason of {n} bytes"));
        }
        let reason = String::from_utf8_lossy(c.bytes(n)?).into_owned();
        c.finish()?;
        Ok(Self { rank, reason })
    }
}

/// `reason` cut to at most [`MAX_REASON_LEN`] bytes at a character boundary.
fn cut(reason: &str) -> &[u8] {
    let mut end = reason.len().min(MAX_REASON_LEN);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    &reason.as_bytes()[..end]
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

/// A rank accepts a link (after checking the connector's [`Proof`]).
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
    /// The first bytes were not [`MARKER`](super::MARKER).
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
    /// The connector's proof does not match this world's secret.
    Auth,
    /// The acceptor shed the connection (too many unauthenticated ones at once) or cannot
    /// serve it yet: the connector tries again until its deadline.
    Busy,
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
            RejectCode::Auth => 9,
            RejectCode::Busy => 10,
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
            9 => RejectCode::Auth,
            10 => RejectCode::Busy,
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
        let reason = cut(&self.reason);
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
