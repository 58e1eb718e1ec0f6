//! Thin safe wrappers over the few libc calls the bootstrap needs (host name, interface
//! addresses, `poll`, non-blocking `recv`/`send` on a blocking socket, the listen backlog,
//! `eventfd`, the descriptor limit), also used by the Ethernet transport's set-up. All of the
//! bootstrap's `unsafe` is in this file.

use std::ffi::CStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// This machine's host name (`gethostname(2)`).
pub(crate) fn hostname() -> io::Result<String> {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is writable for `buf.len()` bytes; gethostname writes at most that many.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// One IPv4 address of a network interface, as `getifaddrs(3)` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceAddr {
    /// Interface name, e.g. `eth0`.
    pub name: String,
    /// Its IPv4 address.
    pub addr: Ipv4Addr,
    /// `IFF_UP` is set.
    pub up: bool,
    /// `IFF_LOOPBACK` is set.
    pub loopback: bool,
}

/// Every IPv4 address of every interface, in the order `getifaddrs(3)` returns them.
pub(crate) fn ipv4_interfaces() -> io::Result<Vec<InterfaceAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid out-pointer; on success the list it receives is freed below
    // with freeifaddrs, exactly once.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a non-null node of the list getifaddrs returned; the list stays alive
        // until freeifaddrs below and nothing else mutates it.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() && !ifa.ifa_name.is_null() {
            // SAFETY: a non-null `ifa_addr` points to a sockaddr, whose family field every
            // sockaddr variant starts with.
            let family = unsafe { (*ifa.ifa_addr).sa_family };
            if i32::from(family) == libc::AF_INET {
                // SAFETY: family AF_INET means the address is a `sockaddr_in`; read_unaligned
                // because the list only guarantees `sockaddr` alignment.
                let sin =
                    unsafe { std::ptr::read_unaligned(ifa.ifa_addr.cast::<libc::sockaddr_in>()) };
                // SAFETY: `ifa_name` is a NUL-terminated string owned by the list.
                let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
                    .to_string_lossy()
                    .into_owned();
                let flags = ifa.ifa_flags;
                out.push(InterfaceAddr {
                    name,
                    addr: Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                    up: flags & libc::IFF_UP.unsigned_abs() != 0,
                    loopback: flags & libc::IFF_LOOPBACK.unsigned_abs() != 0,
                });
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed once; no reference into the
    // list outlives this point (names were copied).
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// Waits up to `timeout` for events on `fds` (`poll(2)`); the number of ready entries, 0 on
/// timeout or interruption.
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout: Duration) -> io::Result<usize> {
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    let n = libc::nfds_t::try_from(fds.len()).unwrap_or(libc::nfds_t::MAX);
    // SAFETY: `fds` is a valid, writable slice of `fds.len()` pollfd entries for the whole call.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), n, ms) };
    if rc < 0 {
        let err = io::Error::last_os_error();
        return if err.kind() == io::ErrorKind::Interrupted {
            Ok(0)
        } else {
            Err(err)
        };
    }
    Ok(rc.unsigned_abs() as usize)
}

/// A `pollfd` asking for readability of `fd`.
pub(crate) fn pollin(fd: &impl AsRawFd) -> libc::pollfd {
    libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }
}

/// Reads what is there without blocking, whatever the socket's blocking mode (`recv(2)` with
/// `MSG_DONTWAIT`): `Ok(0)` is end of stream, `WouldBlock` means nothing to read yet.
pub(crate) fn recv_now(stream: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is writable for `buf.len()` bytes for the whole call; recv writes at most
    // that many; the descriptor is owned by `stream`, alive for the call.
    let n = unsafe {
        libc::recv(
            stream.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n.unsigned_abs())
}

/// Writes what fits without blocking (`send(2)` with `MSG_DONTWAIT | MSG_NOSIGNAL`).
pub(crate) fn send_now(stream: &TcpStream, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: `buf` is readable for `buf.len()` bytes for the whole call; the descriptor is
    // owned by `stream`, alive for the call.
    let n = unsafe {
        libc::send(
            stream.as_raw_fd(),
            buf.as_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n.unsigned_abs())
}

/// Sends a small frame without blocking; it must go out whole (a fresh connection's send
/// buffer always has room for a handshake frame).
pub(crate) fn send_whole(stream: &TcpStream, frame: &[u8]) -> io::Result<()> {
    match send_now(stream, frame) {
        Ok(n) if n == frame.len() => Ok(()),
        Ok(n) => Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("only {n} of {} bytes fit", frame.len()),
        )),
        Err(e) => Err(e),
    }
}

/// Sets a listening socket's accept backlog (`listen(2)` again on a listening socket changes
/// it; std binds with 128, too few for a thousand ranks joining at once).
pub(crate) fn set_backlog(listener: &TcpListener, backlog: i32) -> io::Result<()> {
    // SAFETY: the descriptor is owned by `listener`, alive and listening for the call.
    if unsafe { libc::listen(listener.as_raw_fd(), backlog) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The process's descriptor limit (`RLIMIT_NOFILE`): (soft, hard); `RLIM_INFINITY` is the
/// type's largest value.
pub(crate) fn nofile_limit() -> io::Result<(libc::rlim_t, libc::rlim_t)> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid, writable rlimit for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((r.rlim_cur, r.rlim_max))
}

/// Raises the soft descriptor limit to the hard one (or, when the hard one is unlimited, to
/// the kernel's `fs.nr_open`): `Ok(Some((from, to)))` when it raised it, `Ok(None)` when the
/// soft limit already was the hard one.
pub(crate) fn raise_nofile_limit() -> io::Result<Option<(libc::rlim_t, libc::rlim_t)>> {
    let (soft, hard) = nofile_limit()?;
    let ceiling = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<libc::rlim_t>().ok())
        .unwrap_or(1 << 20);
    let target = hard.min(ceiling);
    if soft >= target {
        return Ok(None);
    }
    let r = libc::rlimit {
        rlim_cur: target,
        rlim_max: hard,
    };
    // SAFETY: `r` is a valid rlimit, read by the call only.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Some((soft, target)))
}

/// An `eventfd(2)`: a thread blocked in [`poll`] on it wakes when another calls [`Wake::wake`].
#[derive(Debug)]
pub(crate) struct Wake(File);

impl Wake {
    pub fn new() -> io::Result<Self> {
        // SAFETY: plain system call with flags; no pointers.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by eventfd, is open, and nothing else owns it.
        Ok(Self(File::from(unsafe { OwnedFd::from_raw_fd(fd) })))
    }

    /// Makes the descriptor readable (best effort: a full counter is readable anyway).
    pub fn wake(&self) {
        let _ = (&self.0).write(&1u64.to_ne_bytes());
    }

    /// Resets it to not readable.
    pub fn drain(&self) {
        let mut b = [0u8; 8];
        let _ = (&self.0).read(&mut b);
    }
}

impl AsRawFd for Wake {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.as_raw_fd()
    }
}
