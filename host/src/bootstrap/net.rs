//! Blocking control-frame I/O over [`crate::socket`]'s deadline-bounded sockets (the
//! connector's side of a handshake), error context, and address selection.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::thread;
use std::time::{Duration, Instant};

use super::wire::{self, ControlHeader, HeaderError, Kind, Reject, RejectCode};
use super::{Peer, os};
use crate::error::{Error, Result};
use crate::socket::{IoFail, read_full, remaining};

/// Longest a bootstrap I/O thread sleeps in `poll` before it looks at its deadlines again.
pub(crate) const POLL_SLICE: Duration = Duration::from_millis(50);

/// Why a control frame could not be read.
#[derive(Debug)]
pub(crate) enum ControlFail {
    /// Socket-level failure.
    Io(IoFail),
    /// Header refused.
    Header(HeaderError),
    /// A frame kind not expected here (its body is not read).
    Unexpected(u32),
    /// Body length over the cap of its kind.
    TooLong { len: u32, max: usize },
}

/// Reads one control frame of one of the `expected` kinds, each with its body cap. The marker is
/// checked as soon as its 8 bytes arrive; version, kind and length before any body byte is read.
pub(crate) fn read_control(
    stream: &TcpStream,
    deadline: Instant,
    expected: &[(Kind, usize)],
) -> Result<(Kind, Vec<u8>), ControlFail> {
    let mut h = [0u8; wire::CONTROL_HEADER_LEN];
    read_full(stream, &mut h[..8], deadline).map_err(ControlFail::Io)?;
    if h[..8] != wire::MARKER {
        return Err(ControlFail::Header(HeaderError::BadMarker));
    }
    read_full(stream, &mut h[8..], deadline).map_err(ControlFail::Io)?;
    let header = ControlHeader::decode(&h).map_err(ControlFail::Header)?;
    let Some(&(kind, max_body)) = expected.iter().find(|(k, _)| k.code() == header.kind) else {
        return Err(ControlFail::Unexpected(header.kind));
    };
    let len = header.body_len as usize;
    if len > max_body {
        return Err(ControlFail::TooLong {
            len: header.body_len,
            max: max_body,
        });
    }
    let mut body = vec![0u8; len];
    read_full(stream, &mut body, deadline).map_err(ControlFail::Io)?;
    Ok((kind, body))
}

/// The context in which errors are reported: this rank, the peer, the operation and its timeout.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ctx {
    pub rank: usize,
    pub peer: Peer,
    pub op: &'static str,
    pub timeout: Duration,
}

impl Ctx {
    pub fn io(&self, fail: IoFail) -> Error {
        match fail {
            IoFail::Timeout => self.timeout_error(),
            IoFail::Closed => Error::BootstrapPeerClosed {
                rank: self.rank,
                peer: self.peer,
                op: self.op,
            },
            IoFail::Io(source) => Error::BootstrapIo {
                rank: self.rank,
                peer: self.peer,
                op: self.op,
                source,
            },
        }
    }

    pub fn control(&self, fail: ControlFail) -> Error {
        match fail {
            ControlFail::Io(f) => self.io(f),
            ControlFail::Header(HeaderError::BadMarker) => self.bad_magic("protocol marker"),
            ControlFail::Header(HeaderError::Version(got)) => Error::BootstrapVersion {
                rank: self.rank,
                peer: self.peer,
                got,
                want: wire::VERSION,
            },
            ControlFail::Header(HeaderError::Reserved) => {
                self.malformed(format!("{}: reserved header word is not 0", self.op))
            }
            ControlFail::TooLong { len, max } => self.malformed(format!(
                "{}: frame body of {len} bytes exceeds {max}",
                self.op
            )),
            ControlFail::Unexpected(kind) => {
                self.malformed(format!("{}: unexpected frame kind {kind}", self.op))
            }
        }
    }

    pub fn timeout_error(&self) -> Error {
        Error::BootstrapTimeout {
            rank: self.rank,
            peer: self.peer,
            op: self.op,
            after: self.timeout,
        }
    }

    pub fn malformed(&self, reason: String) -> Error {
        Error::BootstrapMalformed {
            rank: self.rank,
            peer: self.peer,
            reason,
        }
    }

    pub fn bad_magic(&self, what: &'static str) -> Error {
        Error::BootstrapBadMagic {
            rank: self.rank,
            peer: self.peer,
            what,
        }
    }

    /// The connector's error for a [`Reject`] it received.
    pub fn rejected(&self, r: Reject) -> Error {
        match r.code {
            RejectCode::Auth => {
                self.auth(format!("the peer refused this rank's proof: {}", r.reason))
            }
            RejectCode::BadMagic => self.bad_magic("session magic (the peer rejected ours)"),
            RejectCode::BadMarker => self.bad_magic("protocol marker (the peer rejected ours)"),
            _ => Error::BootstrapRejected {
                rank: self.rank,
                peer: self.peer,
                reason: format!("{:?}: {}", r.code, r.reason),
            },
        }
    }

    pub fn auth(&self, reason: String) -> Error {
        Error::BootstrapAuth {
            rank: self.rank,
            peer: self.peer,
            reason,
        }
    }

    pub fn connect(&self, source: io::Error) -> Error {
        if source.kind() == io::ErrorKind::TimedOut {
            self.timeout_error()
        } else {
            Error::BootstrapConnect {
                rank: self.rank,
                peer: self.peer,
                source,
            }
        }
    }
}

/// The [`RejectCode`] and reason for a handshake that failed to read.
pub(crate) fn reject_for(fail: &ControlFail) -> (RejectCode, String) {
    match fail {
        ControlFail::Io(IoFail::Timeout) => (
            RejectCode::Timeout,
            "no complete handshake before the deadline".into(),
        ),
        ControlFail::Io(IoFail::Closed) => {
            (RejectCode::Malformed, "closed during the handshake".into())
        }
        ControlFail::Io(IoFail::Io(e)) => (RejectCode::Malformed, format!("socket error: {e}")),
        ControlFail::Header(HeaderError::BadMarker) => (
            RejectCode::BadMarker,
            "not an mscclpp-rs bootstrap peer".into(),
        ),
        ControlFail::Header(HeaderError::Version(v)) => (
            RejectCode::Version,
            format!(
                "protocol version {v} is not this listener's {}",
                wire::VERSION
            ),
        ),
        ControlFail::Header(HeaderError::Reserved) => (
            RejectCode::Malformed,
            "reserved header word is not 0".into(),
        ),
        ControlFail::TooLong { len, max } => (
            RejectCode::Malformed,
            format!("handshake body of {len} bytes exceeds {max}"),
        ),
        ControlFail::Unexpected(kind) => (
            RejectCode::Unexpected,
            format!("frame kind {kind} is not taken by this listener"),
        ),
    }
}

/// Binds a listener at `addr`.
pub(crate) fn bind(rank: usize, addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr).map_err(|source| Error::BootstrapListen { rank, addr, source })
}

/// The IPv4 address of the first interface in `ifnames` (comma-separated) that has one.
pub fn interface_ipv4(ifnames: &str) -> Result<Ipv4Addr> {
    let list = os::ipv4_interfaces().map_err(|source| Error::BootstrapInterface {
        ifname: ifnames.to_owned(),
        source,
    })?;
    ifnames
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .find_map(|name| list.iter().find(|i| i.name == name).map(|i| i.addr))
        .ok_or_else(|| Error::BootstrapInterface {
            ifname: ifnames.to_owned(),
            source: io::Error::new(
                io::ErrorKind::NotFound,
                "no such interface with an IPv4 address",
            ),
        })
}

/// An address for a root to listen on when nothing says which: `ifname`'s IPv4 address if given;
/// else the first interface that is up, not loopback and not a container bridge (`docker*`,
/// `virbr*`, `veth*`); else 127.0.0.1.
pub fn local_ip(ifname: Option<&str>) -> Result<IpAddr> {
    if let Some(names) = ifname {
        return Ok(IpAddr::V4(interface_ipv4(names)?));
    }
    let skip = |n: &str| {
        ["docker", "virbr", "veth", "br-"]
            .iter()
            .any(|p| n.starts_with(p))
    };
    let list = os::ipv4_interfaces().unwrap_or_default();
    Ok(list
        .iter()
        .find(|i| i.up && !i.loopback && !skip(&i.name))
        .map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |i| IpAddr::V4(i.addr)))
}

/// The local address this rank advertises: `ifname`'s IPv4 address if given, else the address
/// the kernel would use to reach `root` (a UDP `connect` sends nothing), else loopback.
pub(crate) fn advertised_ip(ifname: Option<&str>, root: SocketAddr) -> Result<IpAddr> {
    if let Some(names) = ifname {
        return Ok(IpAddr::V4(interface_ipv4(names)?));
    }
    let (any, loopback): (IpAddr, IpAddr) = if root.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED.into(), Ipv4Addr::LOCALHOST.into())
    } else {
        (Ipv6Addr::UNSPECIFIED.into(), Ipv6Addr::LOCALHOST.into())
    };
    let routed = UdpSocket::bind(SocketAddr::new(any, 0))
        .and_then(|s| s.connect(root).and_then(|()| s.local_addr()))
        .map(|a| a.ip())
        .ok()
        .filter(|ip| !ip.is_unspecified());
    Ok(routed.unwrap_or(loopback))
}

/// This host's identity hash: of `host_id` if given, else of host name and kernel boot id (so
/// two containers with one kernel count as one node only if they also share a host name).
pub(crate) fn host_hash(host_id: Option<&str>) -> u64 {
    let mut h = super::Fnv1a::new();
    match host_id {
        Some(id) => {
            h.write(b"id:");
            h.write(id.as_bytes());
        }
        None => {
            h.write(b"host:");
            h.write(os::hostname().unwrap_or_default().as_bytes());
            h.write(b"\0");
            let boot =
                std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
            h.write(boot.trim().as_bytes());
        }
    }
    h.finish()
}

/// Connects to `addr` before `deadline`, retrying refused connections (the root may not be up
/// yet) with a growing pause.
pub(crate) fn connect_retry(
    ctx: &Ctx,
    addr: SocketAddr,
    deadline: Instant,
    cancel: Option<&super::Cancel>,
) -> Result<TcpStream> {
    let mut pause = Duration::from_millis(10);
    loop {
        if cancel.is_some_and(super::Cancel::is_cancelled) {
            return Err(super::Cancel::error());
        }
        let Some(left) = remaining(deadline) else {
            return Err(ctx.timeout_error());
        };
        match TcpStream::connect_timeout(&addr, left) {
            Ok(s) => return Ok(s),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionRefused
                        | io::ErrorKind::ConnectionReset
                        | io::ErrorKind::Interrupted
                ) =>
            {
                let Some(left) = remaining(deadline) else {
                    return Err(ctx.connect(e));
                };
                thread::sleep(pause.min(left));
                pause = (pause * 2).min(Duration::from_millis(200));
            }
            Err(e) => return Err(ctx.connect(e)),
        }
    }
}
