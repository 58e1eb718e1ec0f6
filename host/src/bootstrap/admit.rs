//! Admission: the non-blocking handshake of a listener (the root's, or a rank's), run by one
//! thread for every connection at once. [`Admission`] accepts connections under the intake
//! rules ([`super::intake`]: backlog, descriptor budget, accept back-off), reads each one's
//! frames without blocking, checks the `HELLO` ([`Gate::check_hello`]), answers with its
//! `CHALLENGE`, and checks the connector's tag; a connection that passes is handed to the owner
//! ([`Admitted`]), anything else is answered with a `REJECT` and closed.
//!
//! Why idle, slow or garbage connections cannot keep a real rank out:
//! - nothing blocks: a silent connection costs a file descriptor and a poll slot until its
//!   handshake deadline (measured from accept to the last byte, so a drip does not extend it);
//! - a refused connection is answered without blocking and drained for at most
//!   [`REJECT_LINGER`] in the background ([`Closing`]), so the owner's decisions never wait on a
//!   refusal;
//! - at most `max_pending` handshakes are open at once (max([`MIN_PENDING`], 2 × size), and no
//!   more than the process's descriptor budget gives the listener: its guarantee and what it
//!   can borrow from the pool); a new connection beyond that sheds one held connection
//!   ([`Shedding`]): a refused one still lingering, else the oldest that has not sent a valid
//!   `HELLO`, and only when there is none of those the oldest of the rest, each once it is
//!   [`SHED_GRACE`](super::intake::SHED_GRACE) old; while none is, newcomers wait in the
//!   kernel's queue. A shed handshake is told `REJECT Busy` (the connector tries again) and
//!   closed at once;
//! - each turn serves the handshakes with bytes waiting before the listener
//!   ([`Admission::poll_fds`] lists it last), and accepts at most
//!   [`ACCEPT_BATCH`](super::intake::ACCEPT_BATCH) connections: a real rank's `HELLO`, sent
//!   as soon as it connected, is read in the turn after its connection was accepted, before
//!   any stranger can have it shed, and from then on every silent stranger goes before it
//!   (`bootstrap::intake` says why both matter under a flood that reopens what is shed).
//!
//! Nothing is handed on, queued or answered beyond the `CHALLENGE` before the connector has
//! proven that it knows the world's secret ([`crate::auth`]).

use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::intake::{Intake, Notes, Shedding, Ticket};
use super::keying::{KeyCell, WorldKey};
use super::net::{ControlFail, reject_for};
use super::os::{self, send_whole};
use super::wire::{
    self, Challenge, ControlHeader, HeaderError, Hello, Join, Kind, Proof, Purpose, Reject,
    RejectCode, acceptor_context, connector_context,
};
use crate::auth::{self, Nonce, Role};
use crate::socket::{IoFail, classify, deadline_in};

/// How long a refused connection is drained after its `REJECT`, so that closing it does not
/// reset the connection before the peer has read why.
pub(crate) const REJECT_LINGER: Duration = Duration::from_millis(300);
/// Fewest handshakes a listener keeps open at once (more for larger worlds: twice the size).
pub(crate) const MIN_PENDING: usize = 1024;

/// What a listener admits: who it is, for what, and the world's key.
#[derive(Debug, Clone)]
pub(crate) struct Gate {
    /// This listener's rank ([`wire::ROOT`] for the root).
    pub me: usize,
    /// The only purpose this listener serves.
    pub purpose: Purpose,
    /// Session magic.
    pub magic: u64,
    /// World size.
    pub size: usize,
    /// The world's key and job nonce (a rank's: set when it joined; `bootstrap::keying`).
    pub key: KeyCell,
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
    /// A valid `HELLO` at a rank's listener before the rank has its world key (it has not
    /// joined yet): challenged as soon as the key is set (`bootstrap::keying`; a real rank of
    /// the world never connects that early).
    Keyless {
        hello: Hello,
        body: Vec<u8>,
    },
    Proof {
        hello: Hello,
        body: Vec<u8>,
        nonce: Nonce,
    },
}

struct Pending {
    stream: TcpStream,
    addr: SocketAddr,
    accepted: Instant,
    deadline: Instant,
    frame: FrameBuf,
    stage: Stage,
    ticket: Ticket,
}

/// A refused connection, drained until the peer closes or [`REJECT_LINGER`] passes.
struct Closing {
    stream: TcpStream,
    until: Instant,
    _ticket: Ticket,
}

/// What an [`Admission`] holds, for the intake's shedding ([`Shedding`]; module docs). Tables
/// are in accept order, so the first match is the oldest.
struct Held<'a> {
    pending: &'a mut Vec<Option<Pending>>,
    closing: &'a mut Vec<Option<Closing>>,
}

/// What [`Held`] sheds next.
enum Victim {
    Closing(usize),
    /// A handshake, accepted at that instant.
    Pending(usize, Instant),
}

impl Held<'_> {
    fn victim(&self) -> Option<Victim> {
        if let Some(i) = self.closing.iter().position(Option::is_some) {
            return Some(Victim::Closing(i));
        }
        let quiet = self
            .pending
            .iter()
            .position(|p| p.as_ref().is_some_and(|p| matches!(p.stage, Stage::Hello)));
        let i = quiet.or_else(|| self.pending.iter().position(Option::is_some))?;
        let p = self.pending[i].as_ref()?;
        Some(Victim::Pending(i, p.accepted))
    }
}

impl Shedding for Held<'_> {
    fn next_shed(&self, grace: Duration) -> Option<Instant> {
        match self.victim()? {
            Victim::Closing(_) => Some(Instant::now()),
            Victim::Pending(_, accepted) => Some(accepted + grace),
        }
    }

    fn shed(&mut self, notes: &mut Notes) {
        match self.victim() {
            Some(Victim::Closing(i)) => self.closing[i] = None,
            Some(Victim::Pending(i, _)) => {
                if let Some(p) = self.pending[i].take() {
                    let why = "shed: too many connections at once; try again";
                    let frame = Reject {
                        code: RejectCode::Busy,
                        reason: why.into(),
                    }
                    .encode();
                    let _ = os::send_now(&p.stream, &frame);
                    notes.refused(p.addr, why);
                }
            }
            None => {}
        }
    }
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
    intake: Intake,
    gate: Gate,
    pending: Vec<Option<Pending>>,
    closing: Vec<Option<Closing>>,
    handshake_timeout: Duration,
}

impl Admission {
    /// Serves `listener` (made non-blocking here) for `gate`; `label` names it in the log.
    pub fn new(
        listener: TcpListener,
        gate: Gate,
        handshake_timeout: Duration,
        label: &'static str,
    ) -> io::Result<Self> {
        let max_pending = MIN_PENDING.max(gate.size.saturating_mul(2));
        Ok(Self {
            intake: Intake::new(listener, max_pending, format!("bootstrap {label}"))?,
            gate,
            pending: Vec::new(),
            closing: Vec::new(),
            handshake_timeout,
        })
    }

    /// Stops accepting: closes the listener (handshakes in progress go on).
    pub fn close_listener(&mut self) {
        self.intake.close();
    }

    /// Adds a poll entry for everything that waits for bytes. The listener goes last: its owner serves the entries in order, so the handshakes with
    /// bytes waiting are read before new connections can shed them (module docs).
    pub fn poll_fds(&self, fds: &mut Vec<libc::pollfd>, slots: &mut Vec<Slot>) {
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
        if let Some(fd) = self.intake.poll_fd() {
            fds.push(fd);
            slots.push(Slot::Listener);
        }
    }

    /// The earliest handshake or linger deadline, or the end of an accept back-off.
    pub fn next_deadline(&self) -> Option<Instant> {
        let p = self.pending.iter().flatten().map(|p| p.deadline);
        let c = self.closing.iter().flatten().map(|c| c.until);
        p.chain(c).chain(self.intake.wake_at()).min()
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

    /// Challenges the handshakes that waited for the world key if it is set now, ends
    /// handshakes and lingers whose deadline passed, and compacts the tables.
    pub fn expire(&mut self) {
        if let Some(world) = self.gate.key.get() {
            for slot in &mut self.pending {
                let Some(p) = slot else { continue };
                if !matches!(p.stage, Stage::Keyless { .. }) {
                    continue;
                }
                let Stage::Keyless { hello, body } = std::mem::replace(&mut p.stage, Stage::Hello)
                else {
                    continue;
                };
                match challenge(&p.stream, world, hello, body) {
                    Ok(next) => p.stage = next,
                    Err((code, why)) => {
                        if let Some(p) = slot.take() {
                            self.intake.notes().refused(p.addr, &why);
                            push_closing(&mut self.closing, p.stream, code, &why, p.ticket);
                        }
                    }
                }
            }
        }
        let now = Instant::now();
        for slot in &mut self.pending {
            if slot.as_ref().is_some_and(|p| p.deadline <= now)
                && let Some(p) = slot.take()
            {
                let (code, why) = reject_for(&ControlFail::Io(IoFail::Timeout));
                self.intake.notes().refused(p.addr, &why);
                push_closing(&mut self.closing, p.stream, code, &why, p.ticket);
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
        self.intake.notes().refused(addr, why);
        let ticket = self.intake.ticket();
        push_closing(&mut self.closing, stream, code, why, ticket);
    }

    fn accept_all(&mut self) {
        let mut held = Held {
            pending: &mut self.pending,
            closing: &mut self.closing,
        };
        for (stream, addr, ticket) in self.intake.accept_batch(&mut held) {
            self.pending.push(Some(Pending {
                stream,
                addr,
                accepted: Instant::now(),
                deadline: deadline_in(self.handshake_timeout),
                frame: FrameBuf::default(),
                stage: Stage::Hello,
                ticket,
            }));
        }
    }

    fn advance(&mut self, i: usize) -> Option<Admitted> {
        let p = self.pending.get_mut(i)?.as_mut()?;
        let expected: &[(Kind, usize)] = match (&p.stage, self.gate.purpose) {
            (Stage::Hello, _) => &[(Kind::Hello, wire::HELLO_BODY_LEN)],
            (Stage::Keyless { .. }, _) => &[],
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
                self.intake.notes().refused(p.addr, &why);
                push_closing(&mut self.closing, p.stream, code, &why, p.ticket);
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
        let gate = self.gate.clone();
        let malformed = |why: String| (RejectCode::Malformed, why);
        let Some(p) = self.pending.get_mut(i).and_then(Option::as_mut) else {
            return Ok(None);
        };
        match std::mem::replace(&mut p.stage, Stage::Hello) {
            Stage::Hello => {
                let hello = Hello::decode(&body).map_err(malformed)?;
                gate.check_hello(&hello)?;
                p.stage = match gate.key.get() {
                    Some(world) => challenge(&p.stream, world, hello, body)?,
                    None => Stage::Keyless { hello, body },
                };
                Ok(None)
            }
            // Nothing is read in this stage (advance expects no frame).
            Stage::Keyless { .. } => Err((
                RejectCode::Unexpected,
                "a frame before the CHALLENGE".into(),
            )),
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
                let Some(world) = gate.key.get() else {
                    return Err(malformed("no world key after a CHALLENGE".into()));
                };
                let context = connector_context(&hello_body, &world.job, &request);
                if !auth::verify(
                    &world.key,
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

/// Answers a valid `HELLO` with this listener's `CHALLENGE`; the connection's next stage.
fn challenge(
    stream: &TcpStream,
    world: &WorldKey,
    hello: Hello,
    body: Vec<u8>,
) -> Result<Stage, (RejectCode, String)> {
    let nonce = Nonce::random().map_err(|e| {
        (
            RejectCode::Busy,
            format!("no random bytes for a nonce: {e}"),
        )
    })?;
    let tag = auth::tag(
        &world.key,
        Role::Acceptor,
        &acceptor_context(&body, &world.job),
        &hello.nonce,
        &nonce,
    );
    let c = Challenge {
        nonce,
        job: world.job,
        tag,
    };
    send_whole(stream, &c.encode())
        .map_err(|e| (RejectCode::Malformed, format!("sending CHALLENGE: {e}")))?;
    Ok(Stage::Proof { hello, body, nonce })
}

/// Sends a REJECT without blocking, closes our side for writing and keeps the connection for
/// [`REJECT_LINGER`] (it keeps its ticket: a lingering refusal is the first to be shed).
fn push_closing(
    closing: &mut Vec<Option<Closing>>,
    stream: TcpStream,
    code: RejectCode,
    why: &str,
    ticket: Ticket,
) {
    let frame = Reject {
        code,
        reason: why.to_owned(),
    }
    .encode();
    let _ = os::send_now(&stream, &frame);
    let _ = stream.shutdown(Shutdown::Write);
    closing.push(Some(Closing {
        stream,
        until: deadline_in(REJECT_LINGER),
        _ticket: ticket,
    }));
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;
    use crate::auth::Secret;
    use crate::bootstrap::intake::ACCEPT_BATCH;
    use crate::bootstrap::keying::{self, WorldKey};

    /// Serves the admission as the I/O thread does, for `d`; what it admitted.
    fn pump(adm: &mut Admission, d: Duration) -> Vec<Admitted> {
        let until = Instant::now() + d;
        let mut out = Vec::new();
        while Instant::now() < until {
            let (mut fds, mut slots) = (Vec::new(), Vec::new());
            adm.poll_fds(&mut fds, &mut slots);
            os::poll(&mut fds, Duration::from_millis(5)).unwrap();
            for (fd, slot) in fds.iter().zip(&slots) {
                if fd.revents != 0 {
                    out.extend(adm.on_ready(*slot));
                }
            }
            adm.expire();
        }
        out
    }

    /// What the listener sent before closing (bounded): the code of its REJECT, if any, and
    /// whether it closed.
    fn refusal(s: &mut TcpStream) -> (Option<RejectCode>, bool) {
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut got = Vec::new();
        let closed = s.read_to_end(&mut got).is_ok();
        let code = (got.len() > wire::CONTROL_HEADER_LEN)
            .then(|| Reject::decode(&got[wire::CONTROL_HEADER_LEN..]).ok())
            .flatten()
            .map(|r| r.code);
        (code, closed)
    }

    #[test]
    fn a_full_listener_sheds_refused_then_silent_connections_oldest_first() {
        let world = WorldKey {
            key: Secret::random().unwrap(),
            job: Nonce([1; 32]),
        };
        let gate = Gate {
            me: wire::ROOT,
            purpose: Purpose::Join,
            magic: 7,
            size: 2,
            key: keying::known(world),
        };
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let mut adm = Admission::new(l, gate, Duration::from_secs(20), "test").unwrap();
        adm.intake.set_max(4);
        let step = Duration::from_millis(50);

        let mut quiet: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(addr).unwrap()).collect();
        pump(&mut adm, step);
        let hello = Hello {
            magic: 7,
            purpose: Purpose::Join,
            from: 1,
            to: wire::ROOT,
            size: 2,
            nonce: Nonce([9; 32]),
        };
        let mut valid = TcpStream::connect(addr).unwrap();
        valid.write_all(&hello.encode()).unwrap();
        pump(&mut adm, step);
        let mut challenge = [0u8; wire::CONTROL_HEADER_LEN + wire::CHALLENGE_BODY_LEN];
        valid.read_exact(&mut challenge).unwrap();
        let c = Challenge::decode(&challenge[wire::CONTROL_HEADER_LEN..]).unwrap();
        // Refused at once, it lingers (REJECT_LINGER, 300 ms) holding its descriptor.
        let mut garbage = TcpStream::connect(addr).unwrap();
        garbage.write_all(&[0xEE; 64]).unwrap();
        let until = Instant::now() + Duration::from_secs(5);
        while adm.closing.iter().flatten().count() == 0 && Instant::now() < until {
            pump(&mut adm, Duration::from_millis(2));
        }
        assert_eq!(
            adm.intake.held(),
            4,
            "two silent, one challenged, a refusal lingering"
        );

        // Four newcomers: the refusal goes first, then the silent ones, oldest first, each
        // once it is SHED_GRACE old (the newcomer waits in the accept queue until then).
        let mut newcomers = Vec::new();
        for _ in 0..4 {
            newcomers.push(TcpStream::connect(addr).unwrap());
            pump(&mut adm, super::super::intake::SHED_GRACE + step);
        }
        assert_eq!(adm.intake.held(), 4);
        assert_eq!(refusal(&mut garbage), (Some(RejectCode::BadMarker), true));
        for q in &mut quiet {
            assert_eq!(
                refusal(q),
                (Some(RejectCode::Busy), true),
                "shed with REJECT Busy"
            );
        }
        assert_eq!(refusal(&mut newcomers[0]), (Some(RejectCode::Busy), true));
        for n in &mut newcomers[1..] {
            assert_eq!(refusal(n), (None, false), "a newer one was shed");
        }

        // The challenged connection was kept: its JOIN is admitted.
        let mut join = Join {
            tag: [0; 32],
            listen: "127.0.0.1:9".parse().unwrap(),
            host_hash: 0,
            deadline_ms: 1000,
        };
        join.tag = auth::tag(
            &world.key,
            Role::Connector,
            &connector_context(&hello.body(), &c.job, &join.request()),
            &hello.nonce,
            &c.nonce,
        );
        valid.write_all(&join.encode()).unwrap();
        let admitted = pump(&mut adm, step);
        assert_eq!(admitted.len(), 1);
        assert_eq!(admitted[0].hello, hello);
        assert_eq!(
            adm.intake.held(),
            3,
            "an admitted connection gives its ticket back"
        );
    }

    /// A gate of the root of a world of two, with a random key.
    fn root_gate() -> Gate {
        let world = WorldKey {
            key: Secret::random().unwrap(),
            job: Nonce([1; 32]),
        };
        Gate {
            me: wire::ROOT,
            purpose: Purpose::Join,
            magic: 7,
            size: 2,
            key: keying::known(world),
        }
    }

    #[test]
    fn a_full_listener_sheds_nothing_younger_than_the_grace_and_queues_newcomers() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let mut adm = Admission::new(l, root_gate(), Duration::from_secs(20), "test").unwrap();
        adm.intake.set_max(4);
        adm.intake.set_grace(Duration::from_secs(3600));
        let mut quiet: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(addr).unwrap()).collect();
        pump(&mut adm, Duration::from_millis(50));
        assert_eq!(adm.intake.held(), 4);
        let mut newcomer = TcpStream::connect(addr).unwrap();
        pump(&mut adm, Duration::from_millis(100));
        assert_eq!(adm.intake.held(), 4);
        assert!(
            adm.intake.wake_at().is_some(),
            "a listener with nothing old enough to shed stops accepting for a while"
        );
        // Neither shed nor turned away: the newcomer waits in the kernel's queue.
        assert_eq!(refusal(&mut quiet[0]), (None, false));
        assert_eq!(refusal(&mut newcomer), (None, false));
        // Of age: the oldest silent one makes room for the newcomer, which waited.
        adm.intake.set_grace(Duration::ZERO);
        pump(&mut adm, Duration::from_millis(100));
        assert_eq!(refusal(&mut quiet[0]), (Some(RejectCode::Busy), true));
        for q in &mut quiet[1..] {
            assert_eq!(refusal(q), (None, false));
        }
        assert_eq!(refusal(&mut newcomer), (None, false));
        assert_eq!(adm.intake.held(), 4);
    }

    #[test]
    fn a_turn_accepts_at_most_a_batch() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let mut adm = Admission::new(l, root_gate(), Duration::from_secs(20), "test").unwrap();
        let n = ACCEPT_BATCH + 10;
        let _conns: Vec<TcpStream> = (0..n).map(|_| TcpStream::connect(addr).unwrap()).collect();
        // The kernel queues each connection once the connector's last ACK is processed.
        std::thread::sleep(Duration::from_millis(100));
        assert!(adm.on_ready(Slot::Listener).is_none());
        assert_eq!(adm.intake.held(), ACCEPT_BATCH);
        let (mut fds, mut slots) = (Vec::new(), Vec::new());
        adm.poll_fds(&mut fds, &mut slots);
        assert_eq!(
            slots.last(),
            Some(&Slot::Listener),
            "the listener is served after the handshakes"
        );
        assert_eq!(slots.len(), ACCEPT_BATCH + 1);
        let until = Instant::now() + Duration::from_secs(5);
        while adm.intake.held() < n && Instant::now() < until {
            let before = adm.intake.held();
            adm.on_ready(Slot::Listener);
            assert!(adm.intake.held() - before <= ACCEPT_BATCH);
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(adm.intake.held(), n, "the rest in the next turns");
    }
}
