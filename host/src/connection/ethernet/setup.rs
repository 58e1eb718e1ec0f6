//! Set-up of an Ethernet connection (steps 1–4 of the [module docs](super)): the listener
//! bound before the endpoints cross, the outbound connect, the `HELLO`/`ACCEPT` handshake on
//! both streams, and the start of the receiver thread.

use std::io;
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use super::Shared;
use super::receiver::Receiver;
use super::sender::{BackReader, Out, Wire};
use super::wire::{EndpointInfo, Handshake, HandshakeKind, handshake_context};
use super::{
    ACCEPT_POLL, CONNECT_ATTEMPT, EthernetConnection, HANDSHAKE_LEN, HANDSHAKE_SLICE, MAX_PENDING,
};
use crate::auth::{self, Nonce, Role, Secret};
use crate::bootstrap::intake::{Intake, Notes, Shedding, Ticket};
use crate::bootstrap::os::{self, send_whole};
use crate::bootstrap::{env, interface_ipv4, local_ip};
use crate::error::{Error, Link, Result, TransportErrorKind};
use crate::gpu::Gpu;
use crate::registered_memory::LocalMemories;
use crate::socket::{IoFail, deadline_in, read_full, remaining, write_full};
use crate::status::StatusBlock;
use crate::transport::Transport;

/// A bound listener and what the peer needs to reach it.
pub struct Listener {
    intake: Intake,
    info: EndpointInfo,
    remote_rank: usize,
}

impl Listener {
    /// Binds a listener for a connection to `remote_rank` on the address it advertises (see
    /// the module docs): `MSCCLPP_SOCKET_IFNAME`'s IPv4 address, else the one
    /// [`local_ip`](crate::bootstrap::local_ip) picks; never 0.0.0.0.
    pub fn bind(remote_rank: usize) -> Result<Self> {
        let fail = |op, source| Link::to(Transport::Ethernet, remote_rank).io(op, source);
        let ifname = std::env::var(env::SOCKET_IFNAME)
            .ok()
            .filter(|s| !s.trim().is_empty());
        let ip = match ifname.as_deref() {
            Some(names) => IpAddr::V4(interface_ipv4(names)?),
            None => local_ip(None)?,
        };
        let listener =
            TcpListener::bind(SocketAddr::new(ip, 0)).map_err(|e| fail("bind a listener", e))?;
        let port = listener
            .local_addr()
            .map_err(|e| fail("read the listener's address", e))?
            .port();
        let label = format!("Ethernet listener for rank {remote_rank}");
        let intake = Intake::new(listener, MAX_PENDING, label)
            .map_err(|e| fail("make the listener non-blocking", e))?;
        Ok(Self {
            intake,
            info: EndpointInfo {
                token: crate::random::token(),
                addrs: vec![SocketAddr::new(ip, port)],
            },
            remote_rank,
        })
    }

    /// What goes into this side's `Endpoint::extra`.
    pub fn info(&self) -> &EndpointInfo {
        &self.info
    }

    /// Accepts until a connection completes the acceptor's side of the handshake as
    /// `remote_rank` (module docs), and returns it. Every connection is served at once, without
    /// blocking on any (a silent or slow one costs a poll slot until its [`HANDSHAKE_SLICE`]),
    /// under the bootstrap's intake rules (backlog, descriptor budget, accept back-off,
    /// rate-limited warnings: `bootstrap::intake`); anything that fails its handshake is
    /// closed, and the loop goes on until `deadline`.
    fn accept_peer(
        &mut self,
        auth: &Auth,
        deadline: Instant,
        after: Duration,
    ) -> Result<TcpStream> {
        let mut pending: Vec<Incoming> = Vec::new();
        loop {
            let now = Instant::now();
            let notes = self.intake.notes();
            pending.retain(|p| {
                let live = p.until > now;
                if !live {
                    let why = format!("no complete handshake within {HANDSHAKE_SLICE:?}");
                    notes.refused(p.addr, &why);
                }
                live
            });
            let Some(left) = remaining(deadline) else {
                let link = Link::to(Transport::Ethernet, self.remote_rank);
                return Err(link.timeout("accept the peer's connection", after));
            };
            let listening = self.intake.poll_fd();
            let mut fds: Vec<libc::pollfd> = listening.into_iter().collect();
            let first = fds.len();
            fds.extend(pending.iter().map(|p| os::pollin(&p.stream)));
            let wait = pending
                .iter()
                .map(|p| p.until)
                .chain(self.intake.wake_at())
                .min()
                .and_then(remaining)
                .map_or(left, |d| d.min(left))
                .min(ACCEPT_POLL * 20);
            if let Err(e) = os::poll(&mut fds, wait) {
                tracing::warn!("Ethernet rank {}: poll failed: {e}", auth.me);
                thread::sleep(ACCEPT_POLL);
            }
            let ready: Vec<usize> = (0..pending.len())
                .filter(|&i| fds.get(first + i).is_some_and(|f| f.revents != 0))
                .collect();
            let mut done = Vec::new();
            for i in ready {
                match pending[i].step(auth, self.remote_rank) {
                    Ok(Some(())) => return Ok(pending.swap_remove(i).stream),
                    Ok(None) => {}
                    Err(why) => {
                        self.intake.notes().refused(pending[i].addr, &why);
                        done.push(i);
                    }
                }
            }
            for i in done.into_iter().rev() {
                let p = pending.swap_remove(i);
                let _ = p.stream.shutdown(Shutdown::Both);
            }
            if first == 1 && fds[0].revents != 0 {
                self.accept_all(&mut pending);
            }
        }
    }

    /// Takes the queued connections within the intake budget, a batch per turn
    /// (`Intake::accept_batch`): while there is no ticket, the oldest connection that has not
    /// sent a valid `HELLO` is dropped once it is old enough, else the oldest one (a real peer
    /// finishes in two round trips).
    fn accept_all(&mut self, pending: &mut Vec<Incoming>) {
        for (stream, addr, ticket) in self.intake.accept_batch(&mut Held(pending)) {
            pending.push(Incoming {
                stream,
                addr,
                accepted: Instant::now(),
                until: deadline_in(HANDSHAKE_SLICE),
                buf: Vec::new(),
                challenge: None,
                _ticket: ticket,
            });
        }
    }
}

/// The handshakes of [`Listener::accept_peer`], for the intake's shedding (`Shedding`).
struct Held<'a>(&'a mut Vec<Incoming>);

impl Held<'_> {
    /// The next to shed: the oldest that has not sent a valid `HELLO`, else the oldest (the
    /// table is not in accept order: swap-removals).
    fn victim(&self) -> Option<usize> {
        let quiet = self
            .0
            .iter()
            .enumerate()
            .filter(|(_, p)| p.challenge.is_none())
            .min_by_key(|(_, p)| p.accepted);
        quiet
            .or_else(|| self.0.iter().enumerate().min_by_key(|(_, p)| p.accepted))
            .map(|(i, _)| i)
    }
}

impl Shedding for Held<'_> {
    fn next_shed(&self, grace: Duration) -> Option<Instant> {
        self.victim().map(|i| self.0[i].accepted + grace)
    }

    fn shed(&mut self, notes: &mut Notes) {
        if let Some(i) = self.victim() {
            let p = self.0.swap_remove(i);
            notes.refused(p.addr, "shed: too many connections at once");
        }
    }
}

/// What both sides' tags are computed from: the key, the ranks and both tokens.
pub(super) struct Auth {
    me: usize,
    peer: usize,
    key: Secret,
    my_token: u64,
    peer_token: u64,
}

impl Auth {
    /// The context of the handshake in which `connector` connects to the other.
    fn context(&self, connector_is_me: bool) -> Vec<u8> {
        let (c, a, ct, at) = if connector_is_me {
            (self.me, self.peer, self.my_token, self.peer_token)
        } else {
            (self.peer, self.me, self.peer_token, self.my_token)
        };
        handshake_context(c as u32, a as u32, ct, at)
    }
}

/// A connection to the listener whose handshake is in progress.
struct Incoming {
    stream: TcpStream,
    addr: SocketAddr,
    accepted: Instant,
    until: Instant,
    buf: Vec<u8>,
    /// After our `CHALLENGE`: the connector's nonce and ours.
    challenge: Option<(Nonce, Nonce)>,
    _ticket: Ticket,
}

impl Incoming {
    /// Reads what is there; `Ok(Some)` once the connector has proven itself and was accepted.
    fn step(&mut self, auth: &Auth, remote_rank: usize) -> Result<Option<()>, String> {
        let mut chunk = [0u8; HANDSHAKE_LEN];
        let want = HANDSHAKE_LEN - self.buf.len();
        match os::recv_now(&self.stream, &mut chunk[..want]) {
            Ok(0) => return Err("closed during the handshake".into()),
            Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(None),
            Err(e) => return Err(format!("socket: {e}")),
        }
        if self.buf.len() < HANDSHAKE_LEN {
            return Ok(None);
        }
        let mut b = [0u8; HANDSHAKE_LEN];
        b.copy_from_slice(&self.buf);
        self.buf.clear();
        let h = Handshake::decode(&b)?;
        let (me, peer) = (auth.me as u32, remote_rank as u32);
        if (h.from, h.to) != (peer, me) {
            return Err(format!(
                "{:?} from rank {} to rank {}, expected from rank {peer} to rank {me}",
                h.kind, h.from, h.to
            ));
        }
        let context = auth.context(false);
        match (h.kind, self.challenge) {
            (HandshakeKind::Hello, None) => {
                let theirs = Nonce(h.nonce);
                let ours = Nonce::random().map_err(|e| format!("no nonce: {e}"))?;
                let tag = auth::tag(&auth.key, Role::Acceptor, &context, &theirs, &ours);
                let c = Handshake {
                    kind: HandshakeKind::Challenge,
                    from: me,
                    to: peer,
                    nonce: ours.0,
                    tag,
                };
                send_whole(&self.stream, &c.encode()).map_err(|e| format!("CHALLENGE: {e}"))?;
                self.challenge = Some((theirs, ours));
                Ok(None)
            }
            (HandshakeKind::Proof, Some((theirs, ours))) => {
                if !auth::verify(&auth.key, Role::Connector, &context, &theirs, &ours, &h.tag) {
                    return Err(
                        "its proof does not match this world's secret (or this connection's endpoints)"
                            .into(),
                    );
                }
                let a = Handshake::new(HandshakeKind::Accept, me, peer);
                send_whole(&self.stream, &a.encode()).map_err(|e| format!("ACCEPT: {e}"))?;
                Ok(Some(()))
            }
            (kind, _) => Err(format!("an unexpected {kind:?}")),
        }
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
    /// The world's secret (from the bootstrap); `None` for a bootstrap without one.
    pub secret: Option<Secret>,
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
        // answers here fails the handshake (the proof), with a typed error.
        addrs = info.addrs.clone();
    }
    let link = Link::to(Transport::Ethernet, setup.remote_rank);
    if addrs.is_empty() {
        let why = format!(
            "the peer is on another node and advertised only loopback addresses {:?}",
            info.addrs
        );
        return Err(link.error(TransportErrorKind::Connect, "connect", why));
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
                Some((last, source)) => link.caused(
                    TransportErrorKind::Connect,
                    "connect",
                    format!("connecting to {addrs:?} failed (the last error, from {last})"),
                    Some(Box::new(source)),
                ),
                None => link.timeout("connect to the peer", setup.timeout),
            });
        };
        thread::sleep(pause.min(left));
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// The connector's half: connect, `HELLO`, check the `CHALLENGE`, `PROOF`, read `ACCEPT`.
fn connect_and_prove(
    setup: &Setup<'_>,
    info: &EndpointInfo,
    auth: &Auth,
    deadline: Instant,
    io_fail: &dyn Fn(&'static str, IoFail) -> Error,
    handshake: &dyn Fn(String) -> Error,
) -> Result<TcpStream> {
    let (me, peer) = (setup.rank as u32, setup.remote_rank as u32);
    let out = connect_out(setup, info, deadline)?;
    let ours = Nonce::random().map_err(|e| handshake(format!("no nonce: {e}")))?;
    let hello = Handshake {
        nonce: ours.0,
        ..Handshake::new(HandshakeKind::Hello, me, peer)
    };
    write_full(&out, &hello.encode(), deadline).map_err(|f| io_fail("send HELLO", f))?;
    let read = |what: &'static str| -> Result<Handshake> {
        let mut b = [0u8; HANDSHAKE_LEN];
        read_full(&out, &mut b, deadline).map_err(|f| match f {
            IoFail::Closed => handshake(format!(
                "the peer closed the connection instead of answering ({what}): a wrong address, or it could not check this rank's proof"
            )),
            f => io_fail(what, f),
        })?;
        let h = Handshake::decode(&b).map_err(|r| handshake(format!("bad {what}: {r}")))?;
        if (h.from, h.to) != (peer, me) {
            return Err(handshake(format!(
                "{what} from rank {} to rank {}",
                h.from, h.to
            )));
        }
        Ok(h)
    };
    let c = read("CHALLENGE")?;
    let context = auth.context(true);
    let theirs = Nonce(c.nonce);
    if c.kind != HandshakeKind::Challenge
        || !auth::verify(&auth.key, Role::Acceptor, &context, &ours, &theirs, &c.tag)
    {
        return Err(handshake(format!(
            "the peer's {:?} does not prove that it knows this world's secret",
            c.kind
        )));
    }
    let proof = Handshake {
        tag: auth::tag(&auth.key, Role::Connector, &context, &ours, &theirs),
        ..Handshake::new(HandshakeKind::Proof, me, peer)
    };
    write_full(&out, &proof.encode(), deadline).map_err(|f| io_fail("send PROOF", f))?;
    let a = read("ACCEPT")?;
    if a.kind != HandshakeKind::Accept {
        return Err(handshake(format!("{:?} instead of ACCEPT", a.kind)));
    }
    Ok(out)
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
        let link = Link::to(Transport::Ethernet, remote_rank);
        let handshake = |reason: String| link.setup(reason);
        let io = |op: &'static str| move |source| link.io(op, source);
        let info = EndpointInfo::decode(peer_extra)
            .map_err(|r| handshake(format!("malformed endpoint: {r}")))?;
        let my_token = listener.info.token;
        let deadline = deadline_in(setup.timeout);
        let timeout_err = |op| link.timeout(op, setup.timeout);
        let io_fail = |op: &'static str, f: IoFail| match f {
            IoFail::Timeout => timeout_err(op),
            IoFail::Closed => handshake(format!("{op}: the connection closed")),
            IoFail::Io(e) => io(op)(e),
        };

        let auth = Auth {
            me: setup.rank,
            peer: remote_rank,
            key: setup
                .secret
                .unwrap_or_else(|| Secret::public(b"mscclpp-rs ethernet without a world secret")),
            my_token,
            peer_token: info.token,
        };
        // 2.–4. Both halves at once (each side is connector and acceptor): the inbound half on
        // a helper thread, so neither side's round trips wait on the other's.
        let mut listener = listener;
        let (out, inbound) = thread::scope(|s| {
            let acceptor = thread::Builder::new()
                .name(format!("eth{}-accept{remote_rank}", setup.rank))
                .spawn_scoped(s, || listener.accept_peer(&auth, deadline, setup.timeout))
                .map_err(io("start the accepting thread"))?;
            let out = connect_and_prove(&setup, &info, &auth, deadline, &io_fail, &handshake);
            let inbound = acceptor
                .join()
                .unwrap_or_else(|_| Err(handshake("the accepting thread panicked".into())));
            Ok::<_, Error>((out?, inbound?))
        })?;
        drop(listener);

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
