//! [`UniqueId`]: what every rank needs to find the others (the root's address), to tell its job
//! from others (a random session magic) and to prove that it belongs (a random 32-byte secret,
//! [`crate::auth`]), in 72 bytes that travel as 144 hex characters through any launcher (NCCL's
//! `ncclUniqueId` has room for 128 bytes). Whoever holds the id can join the world: hand it to
//! the ranks the way you would hand them a password.
//!
//! Byte layout (little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | format (2; format 1 had no secret) |
//! | 1 | 1 | flags: bit 0 set when the secret is a real one (random or `MSCCLPP_SECRET`), clear when anyone can derive it from the root address |
//! | 2 | 6 | reserved, 0 |
//! | 8 | 8 | session magic |
//! | 16 | 24 | root address, encoded as in [`wire`](super::wire) |
//! | 40 | 32 | secret |

use std::fmt;
use std::net::{SocketAddr, TcpListener};
use std::str::FromStr;

use super::wire;
use crate::auth::{SECRET_LEN, Secret};
use crate::error::{Error, Result};

/// Bytes in an encoded [`UniqueId`].
pub const UNIQUE_ID_BYTES: usize = 72;
const FORMAT: u8 = 2;
const FLAG_SECRET: u8 = 1;

/// The root's address, a random session magic and the world's secret. Rank 0 creates it
/// ([`UniqueId::bind`] or [`UniqueId::new`]) and hands it to every other rank
/// (`MSCCLPP_UNIQUE_ID`, a file, MPI, …). Its `Debug` form does not show the secret.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct UniqueId {
    magic: u64,
    root: SocketAddr,
    secret: Secret,
    authenticated: bool,
}

impl UniqueId {
    /// A fresh id for a root that will listen at `root` (a concrete IP and a nonzero port), with
    /// a magic and a secret from the kernel's random source.
    pub fn new(root: SocketAddr) -> Result<Self> {
        let random = |e: std::io::Error| Error::BootstrapUniqueId {
            reason: format!("reading random bytes failed: {e}"),
        };
        let mut b = [0u8; 8];
        crate::random::fill(&mut b).map_err(random)?;
        let secret = Secret::random().map_err(random)?;
        Self::from_parts(root, u64::from_le_bytes(b), secret)
    }

    /// Binds the root's listener at `addr` (port 0 picks a free port) and returns the id naming
    /// it, with a fresh magic. Pass the listener to
    /// [`TcpBootstrap::init_with_root_listener`](super::TcpBootstrap::init_with_root_listener)
    /// on rank 0: no other process can take the port in between.
    pub fn bind(addr: SocketAddr) -> Result<(Self, RootListener)> {
        if addr.ip().is_unspecified() {
            return Err(Error::BootstrapConfig(format!(
                "the root must bind a concrete IP that other ranks can reach, not {addr} (see bootstrap::local_ip)"
            )));
        }
        let listener = TcpListener::bind(addr).map_err(|source| Error::BootstrapListen {
            rank: 0,
            addr,
            source,
        })?;
        // Room for a thousand ranks (and any other connection) queued before rank 0 serves.
        if let Err(e) = super::os::set_backlog(&listener, super::intake::BACKLOG) {
            tracing::debug!("bootstrap root: keeping the default backlog: {e}");
        }
        let bound = listener
            .local_addr()
            .map_err(|source| Error::BootstrapListen {
                rank: 0,
                addr,
                source,
            })?;
        Ok((Self::new(bound)?, RootListener { listener }))
    }

    /// The id every rank derives from a plain `ip:port` root and the world's secret (from
    /// `MSCCLPP_SECRET`): the magic is a hash of the address, so ranks that were only given
    /// the address agree on it.
    pub fn for_addr_with_secret(root: SocketAddr, secret: Secret) -> Result<Self> {
        Self::from_parts(root, Self::addr_magic(root), secret)
    }

    /// The id of a plain `ip:port` root **without authentication**: the secret is derived from
    /// the address, so anyone who knows the port can join.
    /// [`BootstrapConfig::session`](super::BootstrapConfig::session) uses it only when no
    /// `MSCCLPP_SECRET` is set, and says so.
    pub fn for_addr(root: SocketAddr) -> Result<Self> {
        let mut id = Self::for_addr_with_secret(
            root,
            Secret::public(format!("mscclpp-rs bootstrap root {root}").as_bytes()),
        )?;
        id.authenticated = false;
        Ok(id)
    }

    fn addr_magic(root: SocketAddr) -> u64 {
        let mut h = super::Fnv1a::new();
        h.write(b"mscclpp-rs bootstrap root ");
        h.write(root.to_string().as_bytes());
        h.finish()
    }

    /// An id from its parts; `root` must be connectable (concrete IP, nonzero port).
    pub fn from_parts(root: SocketAddr, magic: u64, secret: Secret) -> Result<Self> {
        if !wire::is_connectable(&root) {
            return Err(Error::BootstrapUniqueId {
                reason: format!(
                    "root address {root} is not connectable (needs a concrete IP and a nonzero port)"
                ),
            });
        }
        Ok(Self {
            magic,
            root,
            secret,
            authenticated: true,
        })
    }

    /// The world's secret (every handshake proves knowledge of it).
    pub fn secret(&self) -> &Secret {
        &self.secret
    }

    /// Whether the secret is a real one; `false` for [`for_addr`](Self::for_addr), whose
    /// secret anyone can derive.
    pub fn is_authenticated(&self) -> bool {
        self.authenticated
    }

    /// Where rank 0 listens.
    pub fn root(&self) -> SocketAddr {
        self.root
    }

    /// The session magic every handshake carries.
    pub fn magic(&self) -> u64 {
        self.magic
    }

    /// The 72-byte encoding.
    pub fn to_bytes(&self) -> [u8; UNIQUE_ID_BYTES] {
        let mut b = [0u8; UNIQUE_ID_BYTES];
        b[0] = FORMAT;
        b[1] = if self.authenticated { FLAG_SECRET } else { 0 };
        b[8..16].copy_from_slice(&self.magic.to_le_bytes());
        let mut addr = Vec::with_capacity(wire::ADDR_LEN);
        wire::put_addr(&mut addr, &self.root);
        b[16..40].copy_from_slice(&addr);
        b[40..].copy_from_slice(&self.secret.to_bytes());
        b
    }

    /// Parses the 72-byte encoding, checking format, flags, reserved bytes and the address.
    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        let bad = |reason: String| Error::BootstrapUniqueId { reason };
        if b.len() != UNIQUE_ID_BYTES {
            return Err(bad(format!(
                "{} bytes, expected {UNIQUE_ID_BYTES}",
                b.len()
            )));
        }
        if b[0] != FORMAT {
            return Err(bad(format!("format {} is not {FORMAT}", b[0])));
        }
        if b[1] & !FLAG_SECRET != 0 {
            return Err(bad(format!("unknown flags {:#04x}", b[1])));
        }
        if b[2..8].iter().any(|&x| x != 0) {
            return Err(bad("reserved bytes are not 0".into()));
        }
        let mut m = [0u8; 8];
        m.copy_from_slice(&b[8..16]);
        let root = wire::decode_addr(&b[16..40]).map_err(bad)?;
        let mut k = [0u8; SECRET_LEN];
        k.copy_from_slice(&b[40..]);
        let mut id = Self::from_parts(root, u64::from_le_bytes(m), Secret::from_bytes(k))?;
        id.authenticated = b[1] & FLAG_SECRET != 0;
        Ok(id)
    }

    /// 144 lowercase hex characters.
    pub fn to_hex(&self) -> String {
        use fmt::Write;
        let mut s = String::with_capacity(2 * UNIQUE_ID_BYTES);
        for byte in self.to_bytes() {
            // Writing to a String cannot fail.
            let _ = write!(s, "{byte:02x}");
        }
        s
    }

    /// Parses [`to_hex`](Self::to_hex)'s form (either case; surrounding whitespace ignored).
    pub fn from_hex(s: &str) -> Result<Self> {
        let s = s.trim();
        let bad = |reason: String| Error::BootstrapUniqueId { reason };
        if s.len() != 2 * UNIQUE_ID_BYTES {
            return Err(bad(format!(
                "{} hex characters, expected {}",
                s.len(),
                2 * UNIQUE_ID_BYTES
            )));
        }
        let digit = |c: u8| -> Result<u8> {
            match c {
                b'0'..=b'9' => Ok(c - b'0'),
                b'a'..=b'f' => Ok(c - b'a' + 10),
                b'A'..=b'F' => Ok(c - b'A' + 10),
                _ => Err(bad(format!("{:?} is not a hex digit", char::from(c)))),
            }
        };
        let mut b = [0u8; UNIQUE_ID_BYTES];
        for (i, pair) in s.as_bytes().chunks_exact(2).enumerate() {
            b[i] = (digit(pair[0])? << 4) | digit(pair[1])?;
        }
        Self::from_bytes(&b)
    }
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UniqueId")
            .field("root", &self.root)
            .field("magic", &format_args!("{:#018x}", self.magic))
            .field("authenticated", &self.authenticated)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl FromStr for UniqueId {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Self::from_hex(s)
    }
}

/// The root's bound listener, from [`UniqueId::bind`]; rank 0 passes it to
/// [`TcpBootstrap::init_with_root_listener`](super::TcpBootstrap::init_with_root_listener).
#[derive(Debug)]
pub struct RootListener {
    listener: TcpListener,
}

impl RootListener {
    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub(crate) fn into_inner(self) -> TcpListener {
        self.listener
    }
}
