//! Set-up of an Ethernet connection (steps 1–4 of the [module docs](super)): the listener
//! bound before the endpoints cross, the outbound connect, the `HELLO`/`ACCEPT` handshake on
//! both streams, and the start of the receiver thread.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use super::Shared;
use super::receiver::Receiver;
use super::sender::{BackReader, Out, Wire};
use super::wire::{EndpointInfo, Handshake, HandshakeKind};
use super::{ACCEPT_POLL, CONNECT_ATTEMPT, EthernetConnection, HANDSHAKE_LEN, HANDSHAKE_SLICE};
use crate::bootstrap::{env, interface_ipv4, local_ip};
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::registered_memory::LocalMemories;
use crate::socket::{IoFail, deadline_in, read_full, remaining, write_full};
use crate::status::StatusBlock;

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
                token: crate::random::token(),
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
        // The peer advertised loopback only (its `MSCCLPP_SOCKET_IFNAME` is the loopback
        // interface: nodes emulated on one host). If it really is on another host, whatever
        // answers here fails the handshake (the token), with a typed error.
        addrs = info.addrs.clone();
    }
    if addrs.is_empty() {
        return Err(Error::EthernetNoRoute {
            remote_rank: setup.remote_rank,
            addrs: info.addrs.clone(),
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
                Some((last, source)) => Error::EthernetConnect {
                    remote_rank: setup.remote_rank,
                    addrs,
                    last,
                    source,
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
            bytes: std::sync::atomic::AtomicU64::new(0),
        })
    }
}
