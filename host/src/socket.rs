//! Deadline-bounded TCP socket I/O: the one module through which the bootstrap and the
//! `Ethernet` transport read and write their sockets.
//!
//! Every read and write here has a deadline (an [`Instant`]), and each system call gets only the
//! time that is left, so a peer that drips one byte at a time cannot stretch it. Failures come
//! back as an [`IoFail`] — the deadline passed, the peer closed, or another socket error — and
//! each caller turns that into its own error variant (bootstrap or Ethernet), naming the peer
//! ([`Peer`]) and the operation.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Longest wait any deadline stands for (about 30 years): "no deadline" without overflowing
/// `Instant` arithmetic, whatever a configuration or a peer asks for.
pub(crate) const FOREVER: Duration = Duration::from_secs(1 << 30);

/// `from` + `d`, saturating at [`FOREVER`] from `from`.
pub(crate) fn later(from: Instant, d: Duration) -> Instant {
    let d = d.min(FOREVER);
    from.checked_add(d).unwrap_or(from)
}

/// The instant `d` from now (saturating).
pub(crate) fn deadline_in(d: Duration) -> Instant {
    later(Instant::now(), d)
}

/// Time left until `deadline`, or `None` once it has passed.
pub(crate) fn remaining(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
}

/// The other end of a connection, as far as it is known: its rank (once it said, or from the
/// bootstrap's table) and its address. Bootstrap errors name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Peer {
    /// Its rank, if known.
    pub rank: Option<usize>,
    /// Its address, if known.
    pub addr: Option<SocketAddr>,
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.rank, self.addr) {
            (Some(r), Some(a)) => write!(f, "rank {r} ({a})"),
            (Some(r), None) => write!(f, "rank {r}"),
            (None, Some(a)) => write!(f, "the peer at {a}"),
            (None, None) => f.write_str("an unknown peer"),
        }
    }
}

/// Why a deadline-bounded read or write stopped.
#[derive(Debug)]
pub(crate) enum IoFail {
    /// The deadline passed.
    Timeout,
    /// The peer closed (EOF, reset or broken pipe).
    Closed,
    /// Another socket error.
    Io(io::Error),
}

/// What a failed socket call means: `None` for "try again" (interrupted, or a socket timeout:
/// the caller checks its own deadline), else [`IoFail::Closed`] for a peer that went away, else
/// the error itself.
pub(crate) fn classify(e: io::Error) -> Option<IoFail> {
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

/// Reads exactly `buf.len()` bytes before `deadline`. Each `read` gets the time that is left.
pub(crate) fn read_full(
    stream: &TcpStream,
    buf: &mut [u8],
    deadline: Instant,
) -> Result<(), IoFail> {
    let mut filled = 0;
    while filled < buf.len() {
        let left = remaining(deadline).ok_or(IoFail::Timeout)?;
        stream.set_read_timeout(Some(left)).map_err(IoFail::Io)?;
        match (&*stream).read(&mut buf[filled..]) {
            Ok(0) => return Err(IoFail::Closed),
            Ok(n) => filled += n,
            Err(e) => {
                if let Some(f) = classify(e) {
                    return Err(f);
                }
            }
        }
    }
    Ok(())
}

/// Writes what it can of `buf` before `deadline`; returns the bytes written and why it stopped
/// early, if it did (a caller that must keep its byte stream framed sends the rest later).
pub(crate) fn write_some(
    stream: &TcpStream,
    buf: &[u8],
    deadline: Instant,
) -> (usize, Option<IoFail>) {
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

/// Writes all of `buf` before `deadline`.
pub(crate) fn write_full(stream: &TcpStream, buf: &[u8], deadline: Instant) -> Result<(), IoFail> {
    match write_some(stream, buf, deadline) {
        (_, None) => Ok(()),
        (_, Some(f)) => Err(f),
    }
}

/// Reads and discards what the peer still sends until it closes or `deadline` passes (so that
/// closing our side does not reset the connection before the peer has read our last frame).
pub(crate) fn drain(stream: &TcpStream, deadline: Instant) {
    let mut sink = [0u8; 512];
    while let Some(left) = remaining(deadline) {
        if stream.set_read_timeout(Some(left)).is_err() {
            break;
        }
        match (&*stream).read(&mut sink) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Shutdown, TcpListener};

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    #[test]
    fn reads_time_out_and_see_the_peer_close() {
        let (a, b) = pair();
        write_full(&a, b"hello", deadline_in(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 5];
        read_full(&b, &mut buf, deadline_in(Duration::from_secs(5))).unwrap();
        assert_eq!(&buf, b"hello");
        let start = Instant::now();
        let r = read_full(&b, &mut buf, deadline_in(Duration::from_millis(50)));
        assert!(matches!(r, Err(IoFail::Timeout)), "{r:?}");
        assert!(start.elapsed() < Duration::from_secs(5));
        a.shutdown(Shutdown::Both).unwrap();
        let r = read_full(&b, &mut buf, deadline_in(Duration::from_secs(5)));
        assert!(matches!(r, Err(IoFail::Closed)), "{r:?}");
    }

    #[test]
    fn deadlines_saturate() {
        let now = Instant::now();
        assert!(later(now, Duration::MAX) >= now + FOREVER);
        assert!(remaining(now).is_none());
        assert!(remaining(deadline_in(Duration::from_secs(60))).is_some());
        assert!(classify(io::ErrorKind::WouldBlock.into()).is_none());
        assert!(matches!(
            classify(io::ErrorKind::BrokenPipe.into()),
            Some(IoFail::Closed)
        ));
        assert!(matches!(
            classify(io::ErrorKind::PermissionDenied.into()),
            Some(IoFail::Io(_))
        ));
    }
}
