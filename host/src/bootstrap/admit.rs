//! Admission: the non-blocking handshake of a listener (the root's, or a rank's), run by one
//! thread for every connection at once. [`Admission`] accepts every connection as it comes
//! (the backlog is raised to [`BACKLOG`]), reads each one's frames without blocking, checks the
//! `HELLO` ([`Gate::check_hello`]), answers with its `CHALLENGE`, and checks the connector's
//! tag; a connection that passes is handed to the owner ([`Admitted`]), anything else is
//! answered with a `REJECT` and closed.
//!
//! Why idle, slow or garbage connections cannot keep a real rank out:
//! - nothing blocks: a silent connection costs a file descriptor and a poll slot until its
//!   handshake deadline (measured from accept to the last byte, so a drip does not extend it);
//! - a refused connection is answered without blocking and drained for at most
//!   [`REJECT_LINGER`] in the background ([`Closing`]), so the owner's decisions never wait on a
//!   refusal;
//! - at most `max_pending` handshakes are open at once; a new connection beyond that evicts
//!   the oldest one (silent connections are the oldest; a real rank finishes in a few round
//!   trips and retries a join that was cut), so the listener keeps accepting under a flood.
//!
//! Nothing is handed on, queued or answered beyond the `CHALLENGE` before the connector has
//! proven that it knows the world's secret ([`crate::auth`]).

use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::net::{ControlFail, reject_for};
use super::os::{self, send_whole};
use super::wire::{
    self, Challenge, ControlHeader, HeaderError, Hello, Join, Kind, Proof, Purpose, Reject,
    RejectCode, acceptor_context, connector_context,
};
use crate::auth::{self, Nonce, Role, Secret};
use crate::socket::{IoFail, classify, deadline_in};

/// Accept backlog of every bootstrap listener (std's default of 128 drops the SYNs of a
/// thousand ranks joining at once, which then retry only after a second).
pub(crate) const BACKLOG: i32 = 4096;
/// How long a refused connection is drained after its `REJECT`, so that closing it does not
/// reset the connection before the peer has read why.
pub(crate) const REJECT_LINGER: Duration = Duration::from_millis(300);
/// Fewest handshakes a listener keeps open at once (more for larger worlds: twice the size).
pub(crate) const MIN_PENDING: usize = 1024;
/// Refusals logged as warnings before the rest go to the debug level (a flood of garbage
/// connections must not flood the log).
const LOUD_REFUSALS: u64 = 8;

/// What a listener admits: who it is, for what, and the world's secret.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gate {
    /// This listener's rank ([`wire::ROOT`] for the root).
    pub me: usize,
    /// The only purpose this listener serves.
    pub purpose: Purpose,
    /// Session magic.
    pub magic: u64,
    /// World size.
    pub size: usize,
    /// The world's secret.
    pub secret: Secret,
}

impl Gate {
    /// Checks a `HELLO` before anything is answered: magic, purpose, size, target, sender.
    pub fn check_hello(&self, h: &Hello) -> Result<(), (RejectCode, String)> {
        if h.magic != self.magic {
            return Err((
                RejectCode::BadMagic,
                "wrong session magic (a rank of another job?)".into(),
            ));
        }
        if h.purpose != self.purpose {
            return Err((
                RejectCode::Unexpected,
                format!("{:?} is not served by this listener", h.purpose),
            ));
        }
        if h.size != self.size || h.to != self.me {
            let me = if self.me == wire::ROOT {
                "the root".to_string()
            } else {
                format!("rank {}", self.me)
            };
            return Err((
                RejectCode::Mismatch,
                format!(
                    "rank {} asks for {} of a world of {}; this is {me} of {}",
                    h.from,
                    if h.to == wire::ROOT {
                        "the root".to_string()
                    } else {
                        format!("rank {}", h.to)
                    },
                    h.size,
                    self.size
                ),
            ));
        }
        if h.from >= self.size || h.from == self.me {
            return Err((
                RejectCode::Unexpected,
                format!(
                    "rank {} must not connect here (world of {})",
                    h.from, self.size
                ),
            ));
        }
        Ok(())
    }
}

/// A connection that proved it knows the secret: its hello, its request (for a join) and the
/// stream (blocking mode, nothing unread).
pub(crate) struct Admitted {
    pub hello: Hello,
    pub join: Option<Join>,
    pub stream: TcpStream,
    pub addr: SocketAddr,
}

/// One control frame read without blocking, exactly (never a byte past its end).
#[derive(Default)]
struct FrameBuf {
    buf: Vec<u8>,
    /// Bytes the current frame needs in all (header, then header + body).
    need: usize,
    /// The frame's kind, once its header has been checked.
    kind: Option<Kind>,
}

impl FrameBuf {
    /// Reads what is there; `Ok(Some)` once a whole frame of one of `expected` arrived.
    fn feed(
        &mut self,
        stream: &TcpStream,
        expected: &[(Kind, usize)],
    ) -> Result<Option<(Kind, Vec<u8>)>, ControlFail> {
        loop {
            if self.need == 0 {
                self.need = wire::CONTROL_HEADER_LEN;
            }
            if self.buf.len() == self.need {
                let kind = match self.kind {
                    Some(k) => k,
                    None => {
                        let mut h = [0u8; wire::CONTROL_HEADER_LEN];
                        h.copy_from_slice(&self.buf);
                        let header = ControlHeader::decode(&h).map_err(ControlFail::Header)?;
                        let Some(&(kind, max)) =
                            expected.iter().find(|(k, _)| k.code() == header.kind)
                        else {
                            return Err(ControlFail::Unexpected(header.kind));
                        };
                        if header.body_len as usize > max {
                            return Err(ControlFail::TooLong {
                                len: header.body_len,
                                max,
                            });
                        }
                        self.kind = Some(kind);
                        self.need += header.body_len as usize;
                        if header.body_len > 0 {
                            continue;
                        }
                        kind
                    }
                };
                let body = self.buf.split_off(wire::CONTROL_HEADER_LEN);
                *self = Self::default();
                return Ok(Some((kind, body)));
            }
            let mut chunk = [0u8; 512];
            let want = (self.need - self.buf.len()).min(chunk.len());
            match os::recv_now(stream, &mut chunk[..want]) {
                Ok(0) => return Err(ControlFail::Io(IoFail::Closed)),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    let m = self.buf.len().min(8);
                    if self.buf[..m] != wire::MARKER[..m] {
                        return Err(ControlFail::Header(HeaderError::BadMarker));
                    }
                }
                Err(e) => match classify(e) {
                    None => return Ok(None),
                    Some(f) => return Err(ControlFail::Io(f)),
                },
            }
        }
    }
}

enum Stage {
    Hello,
    Proof {
        hello: Hello,
        body: Vec<u8>,
        nonce: Nonce,
    },
}

struct Pending {
    stream: TcpStream,
    addr: SocketAddr,
    deadline: Instant,
    frame: FrameBuf,
    stage: Stage,
}

/// A refused connection, drained until the peer closes or [`REJECT_LINGER`] passes.
struct Closing {
    stream: TcpStream,
    until: Instant,
}

/// Which part of an [`Admission`] a poll entry belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    Listener,
    Pending(usize),
    Closing(usize),
}

/// A listener and its handshakes in progress (module docs).
pub(crate) struct Admission {
    listener: Option<TcpListener>,
    gate: Gate,
    pending: Vec<Option<Pending>>,
    closing: Vec<Option<Closing>>,
    max_pending: usize,
    handshake_timeout: Duration,
    refusals: u64,
    label: &'static str,
}

impl Admission {
    /// Serves `listener` (made non-blocking here) for `gate`.
    pub fn new(
        listener: TcpListener,
        gate: Gate,
        handshake_timeout: Duration,
        label: &'static str,
    ) -> io::Result<Self> {
        listener.set_nonblocking(true)?;
        if let Err(e) = os::set_backlog(&listener, BACKLOG) {
            tracing::debug!("bootstrap {label}: keeping the default backlog: {e}");
        }
        Ok(Self {
            listener: Some(listener),
            gate,
            pending: Vec::new(),
            closing: Vec::new(),
            max_pending: MIN_PENDING.max(gate.size.saturating_mul(2)),
            handshake_timeout,
            refusals: 0,
            label,
        })
    }

    /// Stops accepting: closes the listener (handshakes in progress go on).
    pub fn close_listener(&mut self) {
        self.listener = None;
    }

    /// Adds a poll entry for everything that waits for bytes.
    pub fn poll_fds(&self, fds: &mut Vec<libc::pollfd>, slots: &mut Vec<Slot>) {
        if let Some(l) = &self.listener {
            fds.push(os::pollin(l));
            slots.push(Slot::Listener);
        }
        for (i, p) in self.pending.iter().enumerate() {
            if let Some(p) = p {
                fds.push(os::pollin(&p.stream));
                slots.push(Slot::Pending(i));
            }
        }
        for (i, c) in self.closing.iter().enumerate() {
            if let Some(c) = c {
                fds.push(os::pollin(&c.stream));
                slots.push(Slot::Closing(i));
            }
        }
    }

    /// The earliest handshake or linger deadline.
    pub fn next_deadline(&self) -> Option<Instant> {
        let p = self.pending.iter().flatten().map(|p| p.deadline);
        let c = self.closing.iter().flatten().map(|c| c.until);
        p.chain(c).min()
    }

    /// Serves one ready poll entry; a connection that completed its handshake is returned.
    pub fn on_ready(&mut self, slot: Slot) -> Option<Admitted> {
        match slot {
            Slot::Listener => {
                self.accept_all();
                None
            }
            Slot::Pending(i) => self.advance(i),
            Slot::Closing(i) => {
                if let Some(c) = &self.closing[i] {
                    let mut sink = [0u8; 512];
                    loop {
                        match os::recv_now(&c.stream, &mut sink) {
                            Ok(0) => break self.closing[i] = None,
                            Ok(_) => {}
                            Err(e) => match classify(e) {
                                None => break,
                                Some(_) => break self.closing[i] = None,
                            },
                        }
                    }
                }
                None
            }
        }
    }

    /// Ends handshakes and lingers whose deadline passed, and compacts the tables.
    pub fn expire(&mut self) {
        let now = Instant::now();
        for slot in &mut self.pending {
            if slot.as_ref().is_some_and(|p| p.deadline <= now)
                && let Some(p) = slot.take()
            {
                let (code, why) = reject_for(&ControlFail::Io(IoFail::Timeout));
                self.refusals += 1;
                note(self.label, self.refusals, p.addr, &why);
                push_closing(&mut self.closing, p.stream, code, &why, self.max_pending);
            }
        }
        for slot in &mut self.closing {
            if slot.as_ref().is_some_and(|c| c.until <= now) {
                *slot = None;
            }
        }
        self.pending.retain(Option::is_some);
        self.closing.retain(Option::is_some);
    }

    /// Refuses an admitted connection after all (a duplicate, a stopping owner): `REJECT`
    /// without blocking, then drained in the background.
    pub fn refuse(&mut self, stream: TcpStream, addr: SocketAddr, code: RejectCode, why: &str) {
        self.refusals += 1;
        note(self.label, self.refusals, addr, why);
        push_closing(&mut self.closing, stream, code, why, self.max_pending);
    }

    fn accept_all(&mut self) {
        let Some(listener) = &self.listener else {
            return;
        };
        loop {
            let (stream, addr) = match listener.accept() {
                Ok(c) => c,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    // EMFILE, ECONNABORTED, …: not fatal to the listener.
                    tracing::warn!("bootstrap {}: accept failed: {e}", self.label);
                    return;
                }
            };
            if stream.set_nonblocking(false).is_err() {
                continue;
            }
            let _ = stream.set_nodelay(true);
            let live = self.pending.iter().filter(|p| p.is_some()).count();
            if live >= self.max_pending
                && let Some(oldest) = self
                    .pending
                    .iter_mut()
                    .filter(|p| p.is_some())
                    .min_by_key(|p| p.as_ref().map(|p| p.deadline))
                && let Some(p) = oldest.take()
            {
                self.refusals += 1;
                note(
                    self.label,
                    self.refusals,
                    p.addr,
                    "evicted: too many handshakes at once",
                );
                let _ = p.stream.shutdown(Shutdown::Both);
            }
            self.pending.push(Some(Pending {
                stream,
                addr,
                deadline: deadline_in(self.handshake_timeout),
                frame: FrameBuf::default(),
                stage: Stage::Hello,
            }));
        }
    }

    fn advance(&mut self, i: usize) -> Option<Admitted> {
        let p = self.pending.get_mut(i)?.as_mut()?;
        let expected: &[(Kind, usize)] = match (&p.stage, self.gate.purpose) {
            (Stage::Hello, _) => &[(Kind::Hello, wire::HELLO_BODY_LEN)],
            (Stage::Proof { .. }, Purpose::Join) => &[(Kind::Join, wire::JOIN_BODY_LEN)],
            (Stage::Proof { .. }, Purpose::Link) => &[(Kind::Proof, wire::PROOF_BODY_LEN)],
        };
        let verdict = match p.frame.feed(&p.stream, expected) {
            Ok(None) => return None,
            Ok(Some((kind, body))) => self.step(i, kind, body),
            Err(f) => Err(reject_for(&f)),
        };
        match verdict {
            Ok(done) => done,
            Err((code, why)) => {
                let p = self.pending[i].take()?;
                self.refuse(p.stream, p.addr, code, &why);
                None
            }
        }
    }

    /// One whole frame of pending connection `i`.
    fn step(
        &mut self,
        i: usize,
        kind: Kind,
        body: Vec<u8>,
    ) -> Result<Option<Admitted>, (RejectCode, String)> {
        let gate = self.gate;
        let malformed = |why: String| (RejectCode::Malformed, why);
        let Some(p) = self.pending.get_mut(i).and_then(Option::as_mut) else {
            return Ok(None);
        };
        match std::mem::replace(&mut p.stage, Stage::Hello) {
            Stage::Hello => {
                let hello = Hello::decode(&body).map_err(malformed)?;
                gate.check_hello(&hello)?;
                let nonce = Nonce::random().map_err(|e| {
                    (
                        RejectCode::Busy,
                        format!("no random bytes for a nonce: {e}"),
                    )
                })?;
                let tag = auth::tag(
                    &gate.secret,
                    Role::Acceptor,
                    &acceptor_context(&body),
                    &hello.nonce,
                    &nonce,
                );
                send_whole(&p.stream, &Challenge { nonce, tag }.encode())
                    .map_err(|e| (RejectCode::Malformed, format!("sending CHALLENGE: {e}")))?;
                p.stage = Stage::Proof { hello, body, nonce };
                Ok(None)
            }
            Stage::Proof {
                hello,
                body: hello_body,
                nonce,
            } => {
                let (tag, request, join) = match kind {
                    Kind::Join => {
                        let j = Join::decode(&body).map_err(malformed)?;
                        (j.tag, j.request(), Some(j))
                    }
                    _ => (
                        Proof::decode(&body).map_err(malformed)?.tag,
                        Vec::new(),
                        None,
                    ),
                };
                let context = connector_context(&hello_body, &request);
                if !auth::verify(
                    &gate.secret,
                    Role::Connector,
                    &context,
                    &hello.nonce,
                    &nonce,
                    &tag,
                ) {
                    return Err((
                        RejectCode::Auth,
                        "the proof does not match this world's secret".into(),
                    ));
                }
                if let Some(j) = &join
                    && !wire::is_connectable(&j.listen)
                {
                    return Err(malformed(format!(
                        "rank {} with listen address {} is not usable",
                        hello.from, j.listen
                    )));
                }
                let p = self.pending[i]
                    .take()
                    .ok_or_else(|| malformed(String::new()))?;
                Ok(Some(Admitted {
                    hello,
                    join,
                    stream: p.stream,
                    addr: p.addr,
                }))
            }
        }
    }
}

/// Logs a refusal: the first few as warnings, then every hundredth.
fn note(label: &str, count: u64, addr: SocketAddr, why: &str) {
    if count <= LOUD_REFUSALS || count.is_multiple_of(100) {
        tracing::warn!(
            "bootstrap {label}: refused the connection from {addr}: {why} ({count} refused so far)"
        );
    } else {
        tracing::debug!("bootstrap {label}: refused the connection from {addr}: {why}");
    }
}

/// Sends a REJECT without blocking, closes our side for writing and keeps the connection for
/// [`REJECT_LINGER`] (fewer than `cap` lingering; beyond that the oldest is closed at once).
fn push_closing(
    closing: &mut Vec<Option<Closing>>,
    stream: TcpStream,
    code: RejectCode,
    why: &str,
    cap: usize,
) {
    let frame = Reject {
        code,
        reason: why.to_owned(),
    }
    .encode();
    let _ = os::send_now(&stream, &frame);
    let _ = stream.shutdown(Shutdown::Write);
    if closing.iter().filter(|c| c.is_some()).count() >= cap
        && let Some(oldest) = closing.iter_mut().find(|c| c.is_some())
    {
        *oldest = None;
    }
    closing.push(Some(Closing {
        stream,
        until: deadline_in(REJECT_LINGER),
    }));
}
