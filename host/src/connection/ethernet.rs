//! `EthernetConnection`: the `Ethernet` transport — TCP between the two ranks, on any nodes.
//!
//! The sending rank reads its source memory (a copy from device to a host staging buffer on the
//! device runtime) and sends it as frames; a receiver thread on the other rank reads the frames
//! and copies them into its **own** registered memory, after checking every destination against
//! the communicator's registry of memories registered there for `Ethernet`
//! ([`LocalMemories`](crate::communicator)). A peer names a destination only by the owner's
//! `local_id`; it never sends an address.
//!
//! # Set-up (inside `Communicator::connect`)
//!
//! 1. Each side binds a listener ([`Listener::bind`]) on an ephemeral port *before* the endpoints
//!    cross, and puts an [`EndpointInfo`] {random token, addresses} into its endpoint's `extra`.
//!    It binds `MSCCLPP_SOCKET_IFNAME`'s IPv4 address when that is set (and advertises only it);
//!    otherwise it binds 0.0.0.0 and advertises the address [`local_ip`] picks plus 127.0.0.1.
//! 2. Each side connects its **outbound stream** to the peer (same node: loopback addresses
//!    first; otherwise loopback addresses are skipped) and sends `HELLO {from, to, the peer's
//!    token}`.
//! 3. Each side accepts on its listener until a connection says a valid `HELLO` (its own
//!    token, the expected ranks); anything else — garbage, silence for 2 s, another job — is
//!    closed and the loop keeps waiting, until the set-up deadline. It answers `ACCEPT {from, to,
//!    the peer's token}` on that **inbound stream**.
//! 4. Each side reads the `ACCEPT` on its outbound stream.
//!
//! Both connects happen before either side accepts, and a TCP connect completes in the
//! listener's backlog, so no side waits for the other. The token is a stray-connection filter
//! (it ties the stream to this endpoint exchange), not authentication.
//!
//! Two streams, one per direction of data: the outbound stream carries this rank's frames to the
//! peer and only small `ACK`/`ERROR` answers back; the inbound stream the reverse. A receiver
//! therefore never waits behind a large write of its own side, so two ranks writing to each
//! other at once cannot deadlock on full socket buffers.
//!
//! # Wire format (little-endian)
//!
//! `Endpoint::extra` (sent through the bootstrap) is the communicator's status byte (0 ready; 1
//! failed, then the reason, so the peer fails at once instead of waiting) followed by an
//! [`EndpointInfo`]: `magic "MSET" | version u16 | token u64 | count u8 (1..=8) | count ×
//! address (24 bytes, `bootstrap::wire` encoding)`.
//!
//! Handshake (32 bytes, connector → acceptor `HELLO`, acceptor → connector `ACCEPT`):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | marker [`HANDSHAKE_MARKER`] |
//! | 8 | 4 | version [`PROTOCOL_VERSION`] |
//! | 12 | 4 | kind: 1 `HELLO`, 2 `ACCEPT` |
//! | 16 | 4 | from (sender's rank) |
//! | 20 | 4 | to (receiver's rank) |
//! | 24 | 8 | token: `HELLO` carries the acceptor's token, `ACCEPT` the connector's |
//!
//! Frames (a 32-byte header, then a payload for `WRITE` and `ERROR`):
//!
//! | op | code | direction | id | word at 8 | word at 16 | word at 24 | payload |
//! |---|---|---|---|---|---|---|---|
//! | `WRITE` | 1 | sender → receiver | destination `local_id` | offset | len (1..=[`CHUNK`]) | 0 | `len` bytes |
//! | `UPDATE` | 2 | sender → receiver | destination `local_id` | offset (8-aligned) | 8 | value | — |
//! | `FLUSH` | 3 | sender → receiver | 0 | sequence number | 0 | 0 | — |
//! | `BYE` | 4 | sender → receiver | 0 | 0 | 0 | 0 | — |
//! | `ACK` | 0x81 | receiver → sender | 0 | sequence number | 0 | 0 | — |
//! | `ERROR` | 0x82 | receiver → sender | 0 | 0 | len (≤ [`MAX_REASON`]) | 0 | UTF-8 reason |
//!
//! Who writes and reads what:
//! - The **sender** (the caller of `write`/`update_and_sync`/`flush`, under the outbound lock)
//!   writes `WRITE`, `UPDATE`, `FLUSH` and, when the connection is dropped, `BYE`. A write is
//!   split into chunks of at most [`CHUNK`] bytes. `flush` sends `FLUSH {seq}` and reads the
//!   outbound stream's answers until `ACK {seq}` (older ACKs, left by a flush that timed out, are
//!   skipped).
//! - The **receiver thread** (`eth{rank}-rx{peer}`) reads the inbound stream. It applies each
//!   frame completely (copy on its own device stream, synchronized) before reading the next, so
//!   its `ACK {seq}` means that every earlier frame is visible in the destination memory. An
//!   `UPDATE` is an 8-byte store ordered after the data on the same stream
//!   (`Stream::write_value_u64`: `cuStreamWriteValue64` on CUDA, a release store on the CPU
//!   backend); this is how a semaphore is signalled.
//!
//! # What the receiver checks (nothing read is trusted)
//!
//! The header is checked before any payload is read: known op, reserved words 0, `WRITE` length
//! at most [`CHUNK`], `ERROR` length at most [`MAX_REASON`], a frame kind that belongs to this
//! direction. The destination id must be in the registry and registered for `Ethernet`,
//! `offset + len` must not overflow and must be at most the registered size, an `UPDATE` word
//! must be 8-byte aligned. The payload is read into a staging buffer first; the lookup is
//! repeated under the registry's read lock, and the copy happens while holding it. A frame that
//! fails a check is not applied: the receiver sends `ERROR {reason}` back, closes, and the
//! connection's later calls return [`Error::EthernetProtocol`] (sticky); the sender's next
//! `flush` returns [`Error::Remote`] with the receiver's reason.
//!
//! # Failure model
//!
//! - Every set-up step is bounded by the `EndpointConfig`'s `flush_timeout` (one deadline for the
//!   whole set-up); every socket write by the same timeout; `flush` by its argument; reading a
//!   payload once its header arrived by the same timeout (a peer stalling mid-frame is dropped).
//! - A write that times out never tears the byte stream: the unsent rest of a frame that was
//!   partly sent is kept and sent before anything else (a frame not started is dropped). The
//!   call returns [`Error::EthernetTimeout`]; its data may or may not arrive.
//! - Failures are sticky and name the peer: a `BYE` then EOF means the peer dropped the
//!   connection ([`Error::EthernetPeerClosed`]); EOF or a reset without `BYE` means it died
//!   ([`Error::Remote`]); an `ERROR` frame means it refused our data ([`Error::Remote`] with its
//!   reason); a bad frame from it is [`Error::EthernetProtocol`]. When the receiver thread finds
//!   the peer dead or hostile (no `BYE`, a bad frame, or a local device failure while applying),
//!   it also aborts the communicator's status block, releasing every device wait of this rank.
//! - `Drop` sends `BYE` and, for at most [`LINGER`], keeps applying (and acknowledging) the
//!   peer's frames until the peer's own `BYE`, and waits for the peer to close the outbound
//!   stream; then it closes both streams and joins the receiver thread. When both ranks drop
//!   their ends (the usual teardown) this costs a round trip; a peer that keeps its end delays
//!   the drop by at most [`LINGER`]. It never panics.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use mscclpp_shared::DevicePtr;

use super::Connection;
use crate::bootstrap::net::{IoFail, deadline_in, lock, read_full, remaining, write_full};
use crate::bootstrap::wire::{ADDR_LEN, decode_addr, is_connectable, put_addr};
use crate::bootstrap::{env, interface_ipv4, local_ip};
use crate::codec::{Reader, Writer};
use crate::communicator::{LocalMemories, LocalMemory};
use crate::error::{Error, Result};
use crate::gpu::{Gpu, HostMapped, Stream};
use crate::registered_memory::RegisteredMemory;
use crate::status::StatusBlock;
use crate::transport::Transport;

/// Magic of an [`EndpointInfo`].
pub const INFO_MAGIC: [u8; 4] = *b"MSET";
/// Version of an [`EndpointInfo`].
pub const INFO_VERSION: u16 = 1;
/// Most addresses an [`EndpointInfo`] may carry.
pub const MAX_ADDRS: usize = 8;
/// First 8 bytes of a handshake.
pub const HANDSHAKE_MARKER: [u8; 8] = *b"MSCLETH\0";
/// Version of the handshake and frame protocol.
pub const PROTOCOL_VERSION: u32 = 1;
/// Bytes of a handshake.
pub const HANDSHAKE_LEN: usize = 32;
/// Bytes of a frame header.
pub const HEADER_LEN: usize = 32;
/// Largest `WRITE` payload (larger writes are split; a longer one read is refused).
pub const CHUNK: usize = 4 << 20;
/// Largest `ERROR` reason.
pub const MAX_REASON: usize = 256;
/// Longest an accepted connection may take to say its `HELLO` before it is dropped.
pub const HANDSHAKE_SLICE: Duration = Duration::from_secs(2);
/// Longest `Drop` waits for the peer to close after `BYE`.
pub const LINGER: Duration = Duration::from_secs(1);
/// How long a receiver tries to tell the peer why it refused a frame.
const ERROR_REPORT_TIMEOUT: Duration = Duration::from_millis(500);
/// How long a failed write looks for the peer's `ERROR` frame explaining it.
const WHY_TIMEOUT: Duration = Duration::from_millis(200);
/// Accept-loop poll interval.
const ACCEPT_POLL: Duration = Duration::from_millis(5);
/// Longest a single connect attempt may take.
const CONNECT_ATTEMPT: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------------------------
// Wire format
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// Sticky failure shared by the sender side and the receiver thread
// ---------------------------------------------------------------------------------------------

/// Why a connection stopped working (the first reason wins).
#[derive(Clone, Debug)]
enum Failure {
    /// The peer said `BYE` (it dropped the connection) and then closed.
    Closed,
    /// The peer's stream ended or reset without `BYE`.
    Lost(String),
    /// The peer refused our frames (its `ERROR`).
    Refused(String),
    /// We refused a frame of the peer.
    Protocol(String),
    /// A socket call failed.
    Io(&'static str, io::ErrorKind, String),
    /// The device failed while applying or staging a frame.
    Local(String),
}

impl Failure {
    fn to_error(&self, remote_rank: usize, op: &'static str) -> Error {
        match self {
            Failure::Closed => Error::EthernetPeerClosed { remote_rank, op },
            Failure::Lost(why) => Error::Remote {
                rank: remote_rank,
                reason: format!("its Ethernet connection ended without a goodbye ({why})"),
            },
            Failure::Refused(why) => Error::Remote {
                rank: remote_rank,
                reason: format!("it refused this rank's Ethernet data: {why}"),
            },
            Failure::Protocol(why) => Error::EthernetProtocol {
                remote_rank,
                reason: why.clone(),
            },
            Failure::Io(what, kind, msg) => Error::EthernetIo {
                remote_rank,
                op: what,
                source: io::Error::new(*kind, msg.clone()),
            },
            Failure::Local(why) => Error::EthernetIo {
                remote_rank,
                op: "apply the peer's data on this rank's device",
                source: io::Error::other(why.clone()),
            },
        }
    }

    /// Whether the receiver thread aborts the communicator for it (the peer died or is
    /// hostile, or this rank cannot apply its data).
    fn aborts(&self) -> bool {
        matches!(
            self,
            Failure::Lost(_) | Failure::Protocol(_) | Failure::Local(_)
        )
    }
}

struct Shared {
    remote_rank: usize,
    failure: Mutex<Option<Failure>>,
    /// Set by `Drop`: the streams are being closed on purpose.
    closing: AtomicBool,
    /// Set by the receiver when the peer said `BYE` (it is dropping its end).
    peer_bye: AtomicBool,
    status: Arc<StatusBlock>,
}

impl Shared {
    /// Records `f` unless a failure is already recorded; returns the recorded one.
    fn fail(&self, f: Failure) -> Failure {
        let mut slot = lock(&self.failure);
        slot.get_or_insert(f).clone()
    }

    fn failure(&self) -> Option<Failure> {
        lock(&self.failure).clone()
    }

    fn check(&self, op: &'static str) -> Result<()> {
        match self.failure() {
            Some(f) => Err(f.to_error(self.remote_rank, op)),
            None => Ok(()),
        }
    }

    /// Why the outbound stream ended: the peer dropped its end (`BYE` seen, waiting briefly
    /// for the receiver to see it, since it travels on the other stream) or it was lost.
    fn ended(&self, what: String) -> Failure {
        let until = deadline_in(WHY_TIMEOUT);
        loop {
            if self.peer_bye.load(Ordering::Acquire) {
                return Failure::Closed;
            }
            if let Some(f) = self.failure() {
                return f;
            }
            if remaining(until).is_none() {
                return Failure::Lost(what);
            }
            thread::sleep(Duration::from_millis(1));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Set-up
// ---------------------------------------------------------------------------------------------

/// A fresh random-ish 64-bit token (std's per-process random hasher keys, the time and the pid).
fn new_token() -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.finish()
}

/// A bound listener and what the peer needs to reach it.
pub struct Listener {
    listener: TcpListener,
    info: EndpointInfo,
    remote_rank: usize,
}

impl Listener {
    /// Binds a listener for a connection to `remote_rank` (see the module docs for the address).
    pub fn bind(remote_rank: usize) -> Result<Self> {
        let fail = |op, source| Error::EthernetIo {
            remote_rank,
            op,
            source,
        };
        let ifname = std::env::var(env::SOCKET_IFNAME)
            .ok()
            .filter(|s| !s.trim().is_empty());
        let (bind_ip, advertised): (IpAddr, Vec<IpAddr>) = match ifname.as_deref() {
            Some(names) => {
                let ip = IpAddr::V4(interface_ipv4(names)?);
                (ip, vec![ip])
            }
            None => {
                let mut ips = vec![local_ip(None)?];
                let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
                if !ips.contains(&lo) {
                    ips.push(lo);
                }
                (IpAddr::V4(Ipv4Addr::UNSPECIFIED), ips)
            }
        };
        let listener = TcpListener::bind(SocketAddr::new(bind_ip, 0))
            .map_err(|e| fail("bind a listener", e))?;
        let port = listener
            .local_addr()
            .map_err(|e| fail("read the listener's address", e))?
            .port();
        listener
            .set_nonblocking(true)
            .map_err(|e| fail("make the listener non-blocking", e))?;
        Ok(Self {
            listener,
            info: EndpointInfo {
                token: new_token(),
                addrs: advertised
                    .into_iter()
                    .map(|ip| SocketAddr::new(ip, port))
                    .collect(),
            },
            remote_rank,
        })
    }

    /// What goes into this side's `Endpoint::extra`.
    pub fn info(&self) -> &EndpointInfo {
        &self.info
    }

    /// Accepts until a connection says a valid `HELLO` from `remote_rank` to `rank`, answers it
    /// with `ACCEPT`, and returns it. Anything else is closed and the loop continues until
    /// `deadline`.
    fn accept_peer(
        &self,
        rank: usize,
        peer_token: u64,
        deadline: Instant,
        after: Duration,
    ) -> Result<TcpStream> {
        loop {
            match self.listener.accept() {
                Ok((stream, addr)) => match self.check_hello(&stream, rank, peer_token, deadline) {
                    Ok(()) => return Ok(stream),
                    Err(why) => {
                        tracing::warn!(
                            "Ethernet rank {rank}: dropped a connection from {addr} while waiting for rank {}: {why}",
                            self.remote_rank
                        );
                        let _ = stream.shutdown(Shutdown::Both);
                    }
                },
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    if e.kind() != io::ErrorKind::WouldBlock {
                        // EMFILE, ECONNABORTED, …: not fatal to the listener.
                        tracing::warn!("Ethernet rank {rank}: accept failed: {e}");
                    }
                    let Some(left) = remaining(deadline) else {
                        return Err(Error::EthernetTimeout {
                            remote_rank: self.remote_rank,
                            op: "accept the peer's connection",
                            after,
                        });
                    };
                    thread::sleep(ACCEPT_POLL.min(left));
                }
            }
        }
    }

    fn check_hello(
        &self,
        stream: &TcpStream,
        rank: usize,
        peer_token: u64,
        deadline: Instant,
    ) -> Result<(), String> {
        stream
            .set_nonblocking(false)
            .map_err(|e| format!("socket: {e}"))?;
        let hs_deadline = deadline.min(deadline_in(HANDSHAKE_SLICE));
        let mut b = [0u8; HANDSHAKE_LEN];
        read_full(stream, &mut b, hs_deadline).map_err(|f| format!("no HELLO: {f:?}"))?;
        let h = Handshake::decode(&b)?;
        let expected = (
            HandshakeKind::Hello,
            self.remote_rank as u64,
            rank as u64,
            self.info.token,
        );
        if (h.kind, u64::from(h.from), u64::from(h.to), h.token) != expected {
            return Err(format!(
                "{:?} from rank {} to rank {} with another token",
                h.kind, h.from, h.to
            ));
        }
        let accept = Handshake {
            kind: HandshakeKind::Accept,
            from: rank as u32,
            to: self.remote_rank as u32,
            token: peer_token,
        };
        write_full(stream, &accept.encode(), hs_deadline)
            .map_err(|f| format!("sending ACCEPT: {f:?}"))
    }
}

/// What `EthernetConnection::establish` needs besides the listener.
pub(crate) struct Setup<'a> {
    /// This rank.
    pub rank: usize,
    /// The peer.
    pub remote_rank: usize,
    /// Whether the peer runs on this node (loopback addresses are tried first, else skipped).
    pub same_node: bool,
    /// This rank's device (stages copies).
    pub gpu: &'a Gpu,
    /// The communicator's registry of network-writable memories.
    pub registry: Arc<LocalMemories>,
    /// The communicator's status block (aborted when the peer dies or misbehaves).
    pub status: Arc<StatusBlock>,
    /// Set-up deadline, socket write timeout, payload read timeout.
    pub timeout: Duration,
}

fn connect_out(setup: &Setup<'_>, info: &EndpointInfo, deadline: Instant) -> Result<TcpStream> {
    let mut addrs: Vec<SocketAddr> = info
        .addrs
        .iter()
        .copied()
        .filter(|a| setup.same_node || !a.ip().is_loopback())
        .collect();
    if setup.same_node {
        addrs.sort_by_key(|a| !a.ip().is_loopback());
    }
    if addrs.is_empty() {
        return Err(Error::EthernetHandshake {
            remote_rank: setup.remote_rank,
            reason: format!(
                "the peer is on another node and advertised only loopback addresses {:?}",
                info.addrs
            ),
        });
    }
    let mut pause = Duration::from_millis(10);
    loop {
        let mut last = None;
        for a in &addrs {
            let Some(left) = remaining(deadline) else {
                break;
            };
            match TcpStream::connect_timeout(a, left.min(CONNECT_ATTEMPT)) {
                Ok(s) => return Ok(s),
                Err(e) => last = Some((*a, e)),
            }
        }
        let Some(left) = remaining(deadline) else {
            return Err(match last {
                Some((a, e)) => Error::EthernetHandshake {
                    remote_rank: setup.remote_rank,
                    reason: format!("could not connect to {addrs:?} (last, {a}: {e})"),
                },
                None => Error::EthernetTimeout {
                    remote_rank: setup.remote_rank,
                    op: "connect to the peer",
                    after: setup.timeout,
                },
            });
        };
        thread::sleep(pause.min(left));
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

// ---------------------------------------------------------------------------------------------
// Sender side
// ---------------------------------------------------------------------------------------------

/// Answers read back on the outbound stream.
enum Back {
    Ack(u64),
    Error(String),
}

enum BackFail {
    Io(IoFail),
    Malformed(String),
}

/// Reads answers on the outbound stream, keeping a partly read frame across timeouts.
#[derive(Default)]
struct BackReader {
    buf: Vec<u8>,
}

impl BackReader {
    fn next(&mut self, stream: &TcpStream, deadline: Instant) -> Result<Back, BackFail> {
        loop {
            let mut want = HEADER_LEN;
            if self.buf.len() >= HEADER_LEN {
                let mut h = [0u8; HEADER_LEN];
                h.copy_from_slice(&self.buf[..HEADER_LEN]);
                match Frame::decode(&h).map_err(BackFail::Malformed)? {
                    Frame::Ack { seq } => {
                        self.buf.drain(..HEADER_LEN);
                        return Ok(Back::Ack(seq));
                    }
                    // At most MAX_REASON, checked by decode.
                    Frame::Error { len } => want = HEADER_LEN + len as usize,
                    other => {
                        return Err(BackFail::Malformed(format!(
                            "{other:?} sent on the answer direction"
                        )));
                    }
                }
                if self.buf.len() >= want {
                    let reason = String::from_utf8_lossy(&self.buf[HEADER_LEN..want]).into_owned();
                    self.buf.drain(..want);
                    return Ok(Back::Error(reason));
                }
            }
            let left = remaining(deadline).ok_or(BackFail::Io(IoFail::Timeout))?;
            stream
                .set_read_timeout(Some(left))
                .map_err(|e| BackFail::Io(IoFail::Io(e)))?;
            let mut tmp = [0u8; HEADER_LEN + MAX_REASON];
            let need = want - self.buf.len();
            match (&*stream).read(&mut tmp[..need]) {
                Ok(0) => return Err(BackFail::Io(IoFail::Closed)),
                Ok(n) => self.buf.extend_from_slice(&tmp[..n]),
                Err(e) => match classify(e) {
                    None => {}
                    Some(f) => return Err(BackFail::Io(f)),
                },
            }
        }
    }
}

/// `None` for errors that only mean "try again" (the deadline is checked by the caller).
fn classify(e: io::Error) -> Option<IoFail> {
    use io::ErrorKind as K;
    match e.kind() {
        K::Interrupted | K::WouldBlock | K::TimedOut => None,
        K::ConnectionReset
        | K::ConnectionAborted
        | K::BrokenPipe
        | K::UnexpectedEof
        | K::NotConnected => Some(IoFail::Closed),
        _ => Some(IoFail::Io(e)),
    }
}

/// Writes what it can of `buf` before `deadline`; returns the bytes written and why it stopped
/// early, if it did.
fn write_some(stream: &TcpStream, buf: &[u8], deadline: Instant) -> (usize, Option<IoFail>) {
    let mut sent = 0;
    while sent < buf.len() {
        let Some(left) = remaining(deadline) else {
            return (sent, Some(IoFail::Timeout));
        };
        if let Err(e) = stream.set_write_timeout(Some(left)) {
            return (sent, Some(IoFail::Io(e)));
        }
        match (&*stream).write(&buf[sent..]) {
            Ok(0) => return (sent, Some(IoFail::Closed)),
            Ok(n) => sent += n,
            Err(e) => {
                if let Some(f) = classify(e) {
                    return (sent, Some(f));
                }
            }
        }
    }
    (sent, None)
}

/// The outbound stream and the sender's state, under one lock.
struct Out {
    wire: Wire,
    gpu: Gpu,
    /// Device stream and pinned staging buffer (`HEADER_LEN + CHUNK` bytes), made at first use.
    dev: Option<(Stream, HostMapped)>,
}

/// The outbound socket and its framing state.
struct Wire {
    stream: TcpStream,
    /// Unsent rest of a frame whose write timed out part-way; sent before anything else.
    pending: Vec<u8>,
    /// Sequence number of the last `FLUSH`.
    seq: u64,
    back: BackReader,
}

impl Wire {
    /// Sends `frame` whole, after any pending bytes. On a timeout the stream stays framed: the
    /// rest of a partly sent frame becomes pending, a frame not started is dropped.
    fn send(&mut self, frame: &[u8], deadline: Instant) -> Result<(), IoFail> {
        if !self.pending.is_empty() {
            let (n, fail) = write_some(&self.stream, &self.pending, deadline);
            self.pending.drain(..n);
            if let Some(f) = fail {
                return Err(f);
            }
        }
        let (n, fail) = write_some(&self.stream, frame, deadline);
        match fail {
            None => Ok(()),
            Some(f) => {
                if n > 0 {
                    self.pending.extend_from_slice(&frame[n..]);
                }
                Err(f)
            }
        }
    }
}

/// The sender's device stream and staging buffer, made at first use.
fn staging<'a>(
    gpu: &Gpu,
    dev: &'a mut Option<(Stream, HostMapped)>,
) -> Result<&'a (Stream, HostMapped)> {
    if dev.is_none() {
        let stream = gpu.stream()?;
        let staging = gpu.alloc_host_mapped(HEADER_LEN + CHUNK)?;
        *dev = Some((stream, staging));
    }
    dev.as_ref().ok_or_else(|| Error::Unsupported {
        what: "an Ethernet staging buffer",
        backend: gpu.kind(),
    })
}

// ---------------------------------------------------------------------------------------------
// The connection
// ---------------------------------------------------------------------------------------------

/// A TCP connection to one remote rank (see the module docs).
pub struct EthernetConnection {
    shared: Arc<Shared>,
    out: Mutex<Out>,
    /// Clones of the two sockets, to shut them down from `Drop`.
    out_ctl: TcpStream,
    in_ctl: TcpStream,
    receiver: Option<JoinHandle<()>>,
    timeout: Duration,
}

impl std::fmt::Debug for EthernetConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EthernetConnection(to rank {})", self.shared.remote_rank)
    }
}

impl EthernetConnection {
    /// Completes the set-up with the peer whose endpoint `extra` is `peer_extra` (steps 2–4 of
    /// the module docs) and starts the receiver thread.
    pub(crate) fn establish(
        listener: Listener,
        peer_extra: &[u8],
        setup: Setup<'_>,
    ) -> Result<Self> {
        let remote_rank = setup.remote_rank;
        let handshake = |reason: String| Error::EthernetHandshake {
            remote_rank,
            reason,
        };
        let io = |op: &'static str| {
            move |source| Error::EthernetIo {
                remote_rank,
                op,
                source,
            }
        };
        let info = EndpointInfo::decode(peer_extra)
            .map_err(|r| handshake(format!("malformed endpoint: {r}")))?;
        let my_token = listener.info.token;
        let deadline = deadline_in(setup.timeout);
        let timeout_err = |op| Error::EthernetTimeout {
            remote_rank,
            op,
            after: setup.timeout,
        };
        let io_fail = |op: &'static str, f: IoFail| match f {
            IoFail::Timeout => timeout_err(op),
            IoFail::Closed => handshake(format!("{op}: the connection closed")),
            IoFail::Io(e) => io(op)(e),
        };

        // 2. Outbound: connect and say HELLO.
        let out = connect_out(&setup, &info, deadline)?;
        let hello = Handshake {
            kind: HandshakeKind::Hello,
            from: setup.rank as u32,
            to: remote_rank as u32,
            token: info.token,
        };
        write_full(&out, &hello.encode(), deadline).map_err(|f| io_fail("send HELLO", f))?;
        // 3. Inbound: accept the peer's HELLO, answer ACCEPT.
        let inbound = listener.accept_peer(setup.rank, info.token, deadline, setup.timeout)?;
        drop(listener);
        // 4. The peer's ACCEPT on the outbound stream.
        let mut b = [0u8; HANDSHAKE_LEN];
        read_full(&out, &mut b, deadline).map_err(|f| match f {
            IoFail::Closed => handshake(
                "the peer closed the connection instead of accepting it (wrong address or token)"
                    .into(),
            ),
            f => io_fail("read ACCEPT", f),
        })?;
        let acc = Handshake::decode(&b).map_err(|r| handshake(format!("bad ACCEPT: {r}")))?;
        // The connector's own token comes back: the acceptor learnt it from this side's
        // endpoint, the only place it appears.
        if acc.kind != HandshakeKind::Accept
            || acc.from as usize != remote_rank
            || acc.to as usize != setup.rank
            || acc.token != my_token
        {
            return Err(handshake(format!(
                "unexpected answer {:?} from rank {} to rank {} (token {})",
                acc.kind,
                acc.from,
                acc.to,
                if acc.token == my_token {
                    "ours"
                } else {
                    "not ours"
                }
            )));
        }

        for s in [&out, &inbound] {
            s.set_nodelay(true).map_err(io("set TCP_NODELAY"))?;
            s.set_read_timeout(None)
                .map_err(io("clear the read timeout"))?;
        }
        let out_ctl = out.try_clone().map_err(io("clone the outbound socket"))?;
        let in_ctl = inbound
            .try_clone()
            .map_err(io("clone the inbound socket"))?;
        let shared = Arc::new(Shared {
            remote_rank,
            failure: Mutex::new(None),
            closing: AtomicBool::new(false),
            peer_bye: AtomicBool::new(false),
            status: setup.status,
        });
        let rx = Receiver {
            shared: Arc::clone(&shared),
            stream: inbound,
            gpu: setup.gpu.clone(),
            registry: setup.registry,
            dev: None,
            timeout: setup.timeout,
        };
        let receiver = thread::Builder::new()
            .name(format!("eth{}-rx{remote_rank}", setup.rank))
            .spawn(move || rx.run())
            .map_err(io("start the receiver thread"))?;
        Ok(Self {
            shared,
            out: Mutex::new(Out {
                wire: Wire {
                    stream: out,
                    pending: Vec::new(),
                    seq: 0,
                    back: BackReader::default(),
                },
                gpu: setup.gpu.clone(),
                dev: None,
            }),
            out_ctl,
            in_ctl,
            receiver: Some(receiver),
            timeout: setup.timeout,
        })
    }

    fn peer(&self) -> usize {
        self.shared.remote_rank
    }

    /// Checks a destination on the sending side (the receiver checks again).
    fn check_dst(&self, dst: &RegisteredMemory, off: u64, len: u64) -> Result<()> {
        let remote_rank = self.peer();
        if dst.rank() != remote_rank {
            return Err(Error::EthernetMemory {
                remote_rank,
                reason: format!(
                    "the destination {dst:?} belongs to rank {}, not to this connection's peer",
                    dst.rank()
                ),
            });
        }
        if !dst.transports().has(Transport::Ethernet) {
            return Err(Error::EthernetMemory {
                remote_rank,
                reason: format!("the destination {dst:?} is not registered for Ethernet"),
            });
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

    /// Turns a failed send into the connection's (sticky, unless a timeout) error.
    fn send_failed(&self, out: &mut Wire, f: IoFail, op: &'static str) -> Error {
        let failure = match f {
            IoFail::Timeout => {
                return Error::EthernetTimeout {
                    remote_rank: self.peer(),
                    op,
                    after: self.timeout,
                };
            }
            IoFail::Io(e) => Failure::Io(op, e.kind(), e.to_string()),
            IoFail::Closed => {
                // The peer may have said why before closing: look for its ERROR.
                match out.back.next(&out.stream, deadline_in(WHY_TIMEOUT)) {
                    Ok(Back::Error(why)) => Failure::Refused(why),
                    _ => self.shared.ended(format!("{op}: the connection was reset")),
                }
            }
        };
        let f = self.shared.fail(failure);
        let _ = out.stream.shutdown(Shutdown::Both);
        f.to_error(self.peer(), op)
    }

    fn send_frame(
        &self,
        wire: &mut Wire,
        frame: &[u8],
        deadline: Instant,
        op: &'static str,
    ) -> Result<()> {
        wire.send(frame, deadline)
            .map_err(|f| self.send_failed(wire, f, op))
    }
}

impl Connection for EthernetConnection {
    fn transport(&self) -> Transport {
        Transport::Ethernet
    }

    fn remote_rank(&self) -> usize {
        self.peer()
    }

    fn write(
        &self,
        dst: &RegisteredMemory,
        dst_off: u64,
        src: &RegisteredMemory,
        src_off: u64,
        size: u64,
    ) -> Result<()> {
        self.shared.check("write")?;
        self.check_dst(dst, dst_off, size)?;
        let s = src.range(src_off, size)?;
        if size == 0 {
            return Ok(());
        }
        let mut guard = lock(&self.out);
        let Out { wire, gpu, dev } = &mut *guard;
        let deadline = deadline_in(self.timeout);
        let mut done = 0u64;
        while done < size {
            let n = (size - done).min(CHUNK as u64);
            let n_bytes = n as usize; // ≤ CHUNK
            let (stream, buf) = staging(gpu, dev)?;
            // SAFETY: `s + done .. + n` lies inside `src` (checked by `range`), a live local
            // registration; the staging buffer has HEADER_LEN + CHUNK bytes, nothing else uses it
            // while the outbound lock is held, and the two never overlap.
            unsafe {
                stream.copy_dtod(
                    buf.device_ptr().byte_add_cast(HEADER_LEN as u64),
                    s.byte_add_cast(done),
                    n_bytes,
                )
            }?;
            let left = remaining(deadline).unwrap_or(Duration::ZERO);
            if !stream.synchronize_timeout(left)? {
                // The copy may still land in the staging buffer: never reuse or free it.
                std::mem::forget(dev.take());
                return Err(Error::EthernetTimeout {
                    remote_rank: self.peer(),
                    op: "stage a write on the device",
                    after: self.timeout,
                });
            }
            // SAFETY: the staging buffer is live host memory of HEADER_LEN + CHUNK bytes; the
            // device copy into it has completed (synchronized above) and nothing else touches it
            // while the outbound lock is held.
            let frame =
                unsafe { std::slice::from_raw_parts_mut(buf.host_ptr(), HEADER_LEN + n_bytes) };
            let header = Frame::Write {
                id: dst.local_id(),
                offset: dst_off + done,
                len: n,
            };
            frame[..HEADER_LEN].copy_from_slice(&header.encode());
            self.send_frame(wire, frame, deadline, "write")?;
            done += n;
        }
        Ok(())
    }

    fn update_and_sync(
        &self,
        dst: &RegisteredMemory,
        dst_off: u64,
        src: &AtomicU64,
        new_value: u64,
    ) -> Result<()> {
        self.shared.check("update_and_sync")?;
        if !dst_off.is_multiple_of(8) {
            return Err(Error::EthernetMemory {
                remote_rank: self.peer(),
                reason: format!("update_and_sync at offset {dst_off}, which is not 8-byte aligned"),
            });
        }
        self.check_dst(dst, dst_off, 8)?;
        src.store(new_value, Ordering::Release);
        let frame = Frame::Update {
            id: dst.local_id(),
            offset: dst_off,
            value: new_value,
        }
        .encode();
        let mut out = lock(&self.out);
        self.send_frame(
            &mut out.wire,
            &frame,
            deadline_in(self.timeout),
            "update_and_sync",
        )
    }

    fn flush(&self, timeout: Duration) -> Result<()> {
        self.shared.check("flush")?;
        let deadline = deadline_in(timeout);
        let mut out = lock(&self.out);
        let wire = &mut out.wire;
        wire.seq += 1;
        let seq = wire.seq;
        let timed_out = || Error::FlushTimeout {
            remote_rank: self.peer(),
            transport: Transport::Ethernet,
            after: timeout,
        };
        match wire.send(&Frame::Flush { seq }.encode(), deadline) {
            Ok(()) => {}
            Err(IoFail::Timeout) => return Err(timed_out()),
            Err(f) => return Err(self.send_failed(wire, f, "flush")),
        }
        loop {
            let failure = match wire.back.next(&wire.stream, deadline) {
                Ok(Back::Ack(s)) if s == seq => return Ok(()),
                Ok(Back::Ack(s)) if s < seq => continue, // left by a flush that timed out
                Ok(Back::Ack(s)) => Failure::Protocol(format!("ACK {s} for FLUSH {seq}")),
                Ok(Back::Error(why)) => Failure::Refused(why),
                Err(BackFail::Io(IoFail::Timeout)) => return Err(timed_out()),
                Err(BackFail::Io(IoFail::Closed)) => {
                    self.shared.ended("flush: the connection closed".into())
                }
                Err(BackFail::Io(IoFail::Io(e))) => Failure::Io("flush", e.kind(), e.to_string()),
                Err(BackFail::Malformed(why)) => Failure::Protocol(why),
            };
            let f = self.shared.fail(failure);
            let _ = wire.stream.shutdown(Shutdown::Both);
            return Err(f.to_error(self.peer(), "flush"));
        }
    }
}

impl Drop for EthernetConnection {
    fn drop(&mut self) {
        self.shared.closing.store(true, Ordering::Release);
        {
            let mut out = lock(&self.out);
            if self.shared.failure().is_none() {
                let _ = out.wire.send(&Frame::Bye.encode(), deadline_in(LINGER));
            }
        }
        // FIN after BYE. Then, for at most LINGER: keep applying the peer's frames until it
        // says BYE too (so a peer that flushes while this side drops still gets its ACK), and
        // wait for the peer's receiver to close our outbound stream (so that closing it does not
        // reset the connection before the peer has read the BYE).
        let _ = self.out_ctl.shutdown(Shutdown::Write);
        let linger = deadline_in(LINGER);
        let mut pause = Duration::from_micros(100);
        while let (Some(t), Some(left)) = (&self.receiver, remaining(linger)) {
            if t.is_finished() {
                break;
            }
            thread::sleep(pause.min(left));
            pause = (pause * 2).min(Duration::from_millis(10));
        }
        let mut sink = [0u8; 256];
        while let Some(left) = remaining(linger) {
            if self.out_ctl.set_read_timeout(Some(left)).is_err() {
                break;
            }
            match (&self.out_ctl).read(&mut sink) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let _ = self.out_ctl.shutdown(Shutdown::Both);
        let _ = self.in_ctl.shutdown(Shutdown::Both);
        if let Some(t) = self.receiver.take() {
            let _ = t.join();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Receiver thread
// ---------------------------------------------------------------------------------------------

struct Receiver {
    shared: Arc<Shared>,
    stream: TcpStream,
    gpu: Gpu,
    registry: Arc<LocalMemories>,
    /// Device stream and pinned staging buffer (`CHUNK` bytes), made at the first `WRITE`.
    dev: Option<(Stream, HostMapped)>,
    timeout: Duration,
}

enum Step {
    Continue,
    Bye,
}

impl Receiver {
    fn run(mut self) {
        let why = loop {
            match self.read_header() {
                Ok(Some(h)) => match self.handle(&h) {
                    Ok(Step::Continue) => {}
                    Ok(Step::Bye) => {
                        // Not a failure: the peer drops its end; this side's calls fail once
                        // the peer closes our outbound stream (after its linger).
                        self.shared.peer_bye.store(true, Ordering::Release);
                        let _ = self.stream.shutdown(Shutdown::Both);
                        return;
                    }
                    Err(f) => break f,
                },
                Ok(None) => break Failure::Lost("end of stream".into()),
                Err(f) => break f,
            }
        };
        if self.shared.closing.load(Ordering::Acquire) {
            let _ = self.stream.shutdown(Shutdown::Both);
            return;
        }
        // Sticky (and the abort) first: once the peer reads our ERROR, this side already fails.
        let recorded = self.shared.fail(why.clone());
        if why.aborts() {
            tracing::warn!(
                "Ethernet: connection from rank {} failed ({}); aborting the communicator",
                self.shared.remote_rank,
                recorded.to_error(self.shared.remote_rank, "receive")
            );
            self.shared.status.abort();
        }
        if let Failure::Protocol(reason) = &why {
            self.report(reason);
        }
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    /// Tells the peer why its frame was refused (best effort).
    fn report(&self, reason: &str) {
        let mut end = reason.len().min(MAX_REASON);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        let reason = &reason.as_bytes()[..end];
        let mut frame = Frame::Error {
            len: reason.len() as u64,
        }
        .encode()
        .to_vec();
        frame.extend_from_slice(reason);
        let _ = write_full(&self.stream, &frame, deadline_in(ERROR_REPORT_TIMEOUT));
    }

    /// The next header; `None` on a clean end of stream between frames.
    fn read_header(&self) -> Result<Option<[u8; HEADER_LEN]>, Failure> {
        let mut h = [0u8; HEADER_LEN];
        let mut filled = 0;
        if let Err(e) = self.stream.set_read_timeout(None) {
            return Err(Failure::Io("receive", e.kind(), e.to_string()));
        }
        while filled < HEADER_LEN {
            match (&self.stream).read(&mut h[filled..]) {
                Ok(0) if filled == 0 => return Ok(None),
                Ok(0) => return Err(Failure::Lost("end of stream inside a frame header".into())),
                Ok(n) => filled += n,
                Err(e) => match classify(e) {
                    None => {}
                    Some(IoFail::Closed) => return Err(Failure::Lost("connection reset".into())),
                    Some(IoFail::Io(e)) => {
                        return Err(Failure::Io("receive", e.kind(), e.to_string()));
                    }
                    Some(IoFail::Timeout) => {}
                },
            }
        }
        Ok(Some(h))
    }

    fn handle(&mut self, h: &[u8; HEADER_LEN]) -> Result<Step, Failure> {
        let frame = Frame::decode(h).map_err(Failure::Protocol)?;
        match frame {
            Frame::Write { id, offset, len } => {
                // Checked before a byte of payload is read…
                check_destination(&self.registry.read(), id, offset, len, 1)
                    .map_err(Failure::Protocol)?;
                self.apply_write(id, offset, len)?;
                Ok(Step::Continue)
            }
            Frame::Update { id, offset, value } => {
                self.apply_update(id, offset, value)?;
                Ok(Step::Continue)
            }
            Frame::Flush { seq } => {
                // Every earlier frame was applied and synchronized before this one was read.
                write_full(
                    &self.stream,
                    &Frame::Ack { seq }.encode(),
                    deadline_in(self.timeout),
                )
                .map_err(|f| Failure::Lost(format!("sending ACK {seq}: {f:?}")))?;
                Ok(Step::Continue)
            }
            Frame::Bye => Ok(Step::Bye),
            other @ (Frame::Ack { .. } | Frame::Error { .. }) => Err(Failure::Protocol(format!(
                "{other:?} sent on the data direction"
            ))),
        }
    }

    /// Makes the device stream and staging buffer at the first `WRITE`/`UPDATE`.
    fn ensure_dev(&mut self) -> Result<(), Failure> {
        if self.dev.is_none() {
            let local = |e: Error| Failure::Local(e.to_string());
            let stream = self.gpu.stream().map_err(local)?;
            let staging = self.gpu.alloc_host_mapped(CHUNK).map_err(local)?;
            self.dev = Some((stream, staging));
        }
        Ok(())
    }

    /// Waits for the device stream; on a timeout the staging buffer is leaked, never freed,
    /// because a copy from it may still run.
    fn sync(&mut self, what: &str) -> Result<(), Failure> {
        let Some((stream, _)) = &self.dev else {
            return Ok(());
        };
        match stream.synchronize_timeout(self.timeout) {
            Ok(true) => Ok(()),
            Ok(false) => {
                std::mem::forget(self.dev.take());
                Err(Failure::Local(format!(
                    "{what} did not complete on the device within {:?}",
                    self.timeout
                )))
            }
            Err(e) => Err(Failure::Local(e.to_string())),
        }
    }

    fn apply_write(&mut self, id: u32, offset: u64, len: u64) -> Result<(), Failure> {
        let n = len as usize; // ≤ CHUNK, checked by decode
        let timeout = self.timeout;
        self.ensure_dev()?;
        let Some((stream, staging)) = &self.dev else {
            return Err(Failure::Local("no staging buffer".into()));
        };
        // SAFETY: the staging buffer is live host memory of CHUNK ≥ n bytes, used only by this
        // thread, and no device copy from it is in flight (each one is synchronized below).
        let host = unsafe { std::slice::from_raw_parts_mut(staging.host_ptr(), n) };
        read_full(&self.stream, host, deadline_in(timeout)).map_err(|f| match f {
            IoFail::Timeout => Failure::Lost(format!(
                "stalled for {timeout:?} inside a {n}-byte WRITE payload"
            )),
            IoFail::Closed => Failure::Lost("end of stream inside a WRITE payload".into()),
            IoFail::Io(e) => Failure::Io("receive", e.kind(), e.to_string()),
        })?;
        // …and again under the read lock, held until the copy completes, so the memory cannot
        // be deregistered (and freed by its owner) while it is written.
        let registry = Arc::clone(&self.registry);
        let map = registry.read();
        let dst = check_destination(&map, id, offset, len, 1).map_err(Failure::Protocol)?;
        // SAFETY: `dst..dst+n` lies inside a registered local memory (checked under the lock,
        // which is held until the copy completes); the staging buffer is a distinct allocation.
        unsafe { stream.copy_dtod(dst, staging.device_ptr(), n) }
            .map_err(|e| Failure::Local(e.to_string()))?;
        self.sync("a WRITE copy")
    }

    fn apply_update(&mut self, id: u32, offset: u64, value: u64) -> Result<(), Failure> {
        self.ensure_dev()?;
        let registry = Arc::clone(&self.registry);
        let map = registry.read();
        let dst = check_destination(&map, id, offset, 8, 8).map_err(Failure::Protocol)?;
        let Some((stream, _)) = &self.dev else {
            return Err(Failure::Local("no device stream".into()));
        };
        // SAFETY: an 8-byte aligned word inside a registered local memory, kept registered by
        // the read lock until the store completes.
        unsafe { stream.write_value_u64(dst.cast(), value) }
            .map_err(|e| Failure::Local(e.to_string()))?;
        self.sync("an UPDATE store")
    }
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
