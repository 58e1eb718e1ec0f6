//! [`UniqueId`]: what every rank needs to find the others (the root's address) and to recognise
//! them (a random session magic), in 40 bytes that travel as 80 hex characters through any
//! launcher.
//!
//! Byte layout (little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | format (1) |
//! | 1 | 7 | reserved, 0 |
//! | 8 | 8 | session magic |
//! | 16 | 24 | root address, encoded as in [`wire`](super::wire) |

use std::fmt;
use std::net::{SocketAddr, TcpListener};
use std::str::FromStr;

use super::wire;
use crate::error::{Error, Result};

/// Bytes in an encoded [`UniqueId`].
pub const UNIQUE_ID_BYTES: usize = 40;
const FORMAT: u8 = 1;

/// The root's address plus a random session magic. Rank 0 creates it ([`UniqueId::bind`] or
/// [`UniqueId::new`]) and hands it to every other rank (`MSCCLPP_UNIQUE_ID`, a file, MPI, …).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct UniqueId {
    magic: u64,
    root: SocketAddr,
}

impl UniqueId {
    /// A fresh id for a root that will listen at `root` (a concrete IP and a nonzero port), with
    /// a magic from the kernel's random source.
    pub fn new(root: SocketAddr) -> Result<Self> {
        let mut b = [0u8; 8];
        crate::random::fill(&mut b).map_err(|e| Error::BootstrapUniqueId {
            reason: format!("reading random bytes failed: {e}"),
        })?;
        Self::from_parts(root, u64::from_le_bytes(b))
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
        let bound = listener
            .local_addr()
            .map_err(|source| Error::BootstrapListen {
                rank: 0,
                addr,
                source,
            })?;
        Ok((Self::new(bound)?, RootListener { listener }))
    }

    /// The id every rank derives from a plain `ip:port` root: the magic is a hash of the address,
    /// so ranks that were only given the address agree on it.
    pub fn for_addr(root: SocketAddr) -> Result<Self> {
        let mut h = super::Fnv1a::new();
        h.write(b"mscclpp-rs bootstrap root ");
        h.write(root.to_string().as_bytes());
        Self::from_parts(root, h.finish())
    }

    /// An id from its two parts; `root` must be connectable (concrete IP, nonzero port).
    pub fn from_parts(root: SocketAddr, magic: u64) -> Result<Self> {
        if !wire::is_connectable(&root) {
            return Err(Error::BootstrapUniqueId {
                reason: format!(
                    "root address {root} is not connectable (needs a concrete IP and a nonzero port)"
                ),
            });
        }
        Ok(Self { magic, root })
    }

    /// Where rank 0 listens.
    pub fn root(&self) -> SocketAddr {
        self.root
    }

    /// The session magic every handshake carries.
    pub fn magic(&self) -> u64 {
        self.magic
    }

    /// The 40-byte encoding.
    pub fn to_bytes(&self) -> [u8; UNIQUE_ID_BYTES] {
        let mut b = [0u8; UNIQUE_ID_BYTES];
        b[0] = FORMAT;
        b[8..16].copy_from_slice(&self.magic.to_le_bytes());
        let mut addr = Vec::with_capacity(wire::ADDR_LEN);
        wire::put_addr(&mut addr, &self.root);
        b[16..].copy_from_slice(&addr);
        b
    }

    /// Parses the 40-byte encoding, checking format, reserved bytes and the address.
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
        if b[1..8].iter().any(|&x| x != 0) {
            return Err(bad("reserved bytes are not 0".into()));
        }
        let mut m = [0u8; 8];
        m.copy_from_slice(&b[8..16]);
        let root = wire::decode_addr(&b[16..]).map_err(bad)?;
        Self::from_parts(root, u64::from_le_bytes(m))
    }

    /// 80 lowercase hex characters.
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
            .finish()
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
