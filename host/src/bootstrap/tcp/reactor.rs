//! A rank's I/O thread (`bs{r}-io`): one thread per rank serves its listener (the non-blocking
//! handshakes of [`Admission`]) and reads every one of its links, with `poll(2)`.
//!
//! For each link it reads data frames without blocking: a frame's length is counted against
//! the peer's caps ([`Mailbox::reserve`]) as soon as its header arrives, before any payload is
//! read; whole frames go to the mailbox. A goodbye marks the peer as leaving; a notice (a rank
//! is gone) is recorded and passed on. When a link ends, the peer is marked down (left after a
//! goodbye, else closed, failed, malformed or flooding), its socket shut down (which answers a
//! closing peer's FIN), and, unless it left, every other linked rank is told
//! ([`wire::Notice`]), so that a death seen by one rank reaches every rank along the links.
//! Notices are written by a short-lived thread (`bs{r}-notice`), never by this one, so the I/O
//! thread never waits on a writer lock.
//!
//! Callers hand it links they opened through a queue and an `eventfd` that wakes its `poll`;
//! `Drop` first lets it settle (what has arrived is handled, the notices it caused are sent:
//! a rank that leaves right after seeing a death still passes the notice on), then stops it
//! the same way and joins it (and the notice threads).

use std::collections::HashSet;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use super::super::admit::{Admission, Admitted, Slot};
use super::super::mailbox::{LinkDown, Mailbox};
use super::super::net::POLL_SLICE;
use super::super::os::{self, Wake, send_whole};
use super::super::wire::{self, Accept, DataHeader, Notice, RejectCode};
use super::links::{LinkConn, Links};
use crate::error::{Error, Result};
use crate::socket::{classify, deadline_in, remaining};
use crate::sync::{lock, wait_timeout};

/// Most payload bytes read from one link per turn (so one busy link does not starve others).
const TURN_BYTES: usize = 256 << 10;
/// Longest a notice thread tries to write a notice to one link.
const NOTICE_TIMEOUT: Duration = Duration::from_secs(1);
/// Stack of the I/O thread (it keeps its buffers on the heap).
const STACK: usize = 256 << 10;

/// What the I/O thread shares with the rest of the rank.
pub(super) struct Shared {
    pub(super) me: usize,
    pub(super) size: usize,
    pub(super) magic: u64,
    pub(super) mailbox: Arc<Mailbox>,
    pub(super) links: Arc<Links>,
}

struct Control {
    stop: AtomicBool,
    /// Set by `Drop` before it closes the links: every link that ends after it is this rank
    /// leaving, not the peer dying (a peer answers our FIN with its own), so nothing is
    /// reported.
    closing: AtomicBool,
    wake: Wake,
    added: Mutex<Vec<Arc<LinkConn>>>,
    /// Turns of the loop completed; `settle` waits for two more.
    turns: Mutex<u64>,
    turned: Condvar,
    /// Notice threads started and not yet joined.
    notices: Mutex<Vec<JoinHandle<()>>>,
}

/// The running I/O thread.
pub(super) struct Reactor {
    control: Arc<Control>,
    thread: Option<JoinHandle<()>>,
}

impl Reactor {
    pub(super) fn start(shared: Arc<Shared>, admission: Admission) -> Result<Self> {
        let me = shared.me;
        let spawn_err = |source| Error::BootstrapSpawn {
            rank: me,
            what: "I/O thread",
            source,
        };
        let control = Arc::new(Control {
            stop: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            wake: Wake::new().map_err(spawn_err)?,
            added: Mutex::new(Vec::new()),
            turns: Mutex::new(0),
            turned: Condvar::new(),
            notices: Mutex::new(Vec::new()),
        });
        let c = Arc::clone(&control);
        let thread = thread::Builder::new()
            .name(format!("bs{me}-io"))
            .stack_size(STACK)
            .spawn(move || {
                Loop {
                    shared,
                    control: c,
                    admission,
                    readers: Vec::new(),
                    goodbye: HashSet::new(),
                }
                .run()
            })
            .map_err(spawn_err)?;
        Ok(Self {
            control,
            thread: Some(thread),
        })
    }

    /// Starts reading a link a caller opened.
    pub(super) fn add(&self, conn: Arc<LinkConn>) {
        lock(&self.control.added).push(conn);
        self.control.wake.wake();
    }

    /// Lets what has arrived be handled and every notice it caused be sent (bounded by
    /// `timeout`): `Drop` calls it before closing the links, so that a rank that leaves right
    /// after seeing a death still passes the notice on.
    pub(super) fn settle(&self, timeout: Duration) {
        let deadline = deadline_in(timeout);
        let c = &self.control;
        let mut turns = lock(&c.turns);
        let want = *turns + 2;
        while *turns < want && self.thread.as_ref().is_some_and(|t| !t.is_finished()) {
            let Some(left) = remaining(deadline) else {
                break;
            };
            c.wake.wake(); // each turn ends at once instead of sleeping in `poll`
            turns = wait_timeout(&c.turned, turns, left.min(POLL_SLICE));
        }
        drop(turns);
        let pending = std::mem::take(&mut *lock(&c.notices));
        for h in pending {
            let _ = h.join();
        }
    }

    /// This rank is closing its links: what ends from now on is not reported.
    pub(super) fn closing(&self) {
        self.control.closing.store(true, Ordering::Release);
    }

    /// Stops the thread and joins it.
    pub(super) fn stop(&mut self) {
        self.control.stop.store(true, Ordering::Release);
        self.control.wake.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Reactor {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One link being read: the frame in progress.
struct Reader {
    conn: Arc<LinkConn>,
    header: [u8; wire::DATA_HEADER_LEN],
    got: usize,
    frame: Option<(DataHeader, Vec<u8>)>,
}

enum Event {
    Data(u32, u64, Vec<u8>),
    Goodbye,
    Notice(Vec<u8>),
}

impl Reader {
    fn new(conn: Arc<LinkConn>) -> Self {
        Self {
            conn,
            header: [0; wire::DATA_HEADER_LEN],
            got: 0,
            frame: None,
        }
    }

    /// Reads what is there (at most a turn's worth); whole frames go to `out`. `Err` when the
    /// link ended.
    fn feed(&mut self, mailbox: &Mailbox, out: &mut Vec<Event>) -> Result<(), LinkDown> {
        let mut budget = TURN_BYTES;
        loop {
            let n = match &mut self.frame {
                None => {
                    let r = os::recv_now(&self.conn.stream, &mut self.header[self.got..]);
                    match r {
                        Ok(0) if self.got == 0 => return Err(LinkDown::Closed),
                        Ok(0) => return Err(LinkDown::Closed),
                        Ok(n) => {
                            self.got += n;
                            if self.got == wire::DATA_HEADER_LEN {
                                let h = DataHeader::decode(&self.header)
                                    .map_err(LinkDown::Malformed)?;
                                if h.channel == wire::CHANNEL_USER
                                    || h.channel == wire::CHANNEL_COLLECTIVE
                                {
                                    mailbox.reserve(self.conn.peer, h.len)?;
                                }
                                let first = usize::try_from(h.len).unwrap_or(usize::MAX);
                                self.frame = Some((h, Vec::with_capacity(first.min(TURN_BYTES))));
                                self.got = 0;
                            }
                            n
                        }
                        Err(e) => return Self::io(e),
                    }
                }
                Some((h, payload)) => {
                    let len = usize::try_from(h.len).unwrap_or(usize::MAX);
                    let have = payload.len();
                    let want = (len - have).min(TURN_BYTES);
                    if want > 0 {
                        payload.resize(have + want, 0);
                        match os::recv_now(&self.conn.stream, &mut payload[have..]) {
                            Ok(0) => return Err(LinkDown::Closed),
                            Ok(n) => payload.truncate(have + n),
                            Err(e) => {
                                payload.truncate(have);
                                return Self::io(e);
                            }
                        }
                    }
                    payload.len() - have
                }
            };
            if let Some((h, payload)) = &self.frame
                && payload.len() as u64 == h.len
                && let Some((h, payload)) = self.frame.take()
            {
                out.push(match h.channel {
                    wire::CHANNEL_GOODBYE => Event::Goodbye,
                    wire::CHANNEL_NOTICE => Event::Notice(payload),
                    c => Event::Data(c, h.tag, payload),
                });
            }
            budget = budget.saturating_sub(n.max(1));
            if budget == 0 {
                return Ok(());
            }
        }
    }

    /// `Ok` for "nothing more now", else why the link ended.
    fn io(e: std::io::Error) -> Result<(), LinkDown> {
        let kind = e.kind();
        let msg = e.to_string();
        match classify(e) {
            None => Ok(()),
            Some(crate::socket::IoFail::Closed) => Err(LinkDown::Closed),
            Some(_) => Err(LinkDown::Io(kind, msg)),
        }
    }
}

struct Loop {
    shared: Arc<Shared>,
    control: Arc<Control>,
    admission: Admission,
    readers: Vec<Reader>,
    /// Peers that said goodbye on some link: their links' ends are departures, not deaths.
    goodbye: HashSet<usize>,
}

#[derive(Clone, Copy)]
enum Entry {
    Wake,
    Admission(Slot),
    Reader(usize),
}

impl Loop {
    fn run(mut self) {
        let mut fds: Vec<libc::pollfd> = Vec::new();
        let mut entries: Vec<Entry> = Vec::new();
        while !self.control.stop.load(Ordering::Acquire) {
            fds.clear();
            entries.clear();
            fds.push(os::pollin(&self.control.wake));
            entries.push(Entry::Wake);
            let mut slots = Vec::new();
            self.admission.poll_fds(&mut fds, &mut slots);
            entries.extend(slots.into_iter().map(Entry::Admission));
            for (i, r) in self.readers.iter().enumerate() {
                fds.push(os::pollin(&r.conn.stream));
                entries.push(Entry::Reader(i));
            }
            let wait = self
                .admission
                .next_deadline()
                .and_then(remaining)
                .map_or(POLL_SLICE, |d| d.min(POLL_SLICE));
            match os::poll(&mut fds, wait) {
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!("bootstrap rank {}: poll failed: {e}", self.shared.me);
                    thread::sleep(POLL_SLICE);
                    continue;
                }
            }
            let mut ended = Vec::new();
            for (fd, entry) in fds.iter().zip(entries.iter()) {
                if fd.revents == 0 {
                    continue;
                }
                match *entry {
                    Entry::Wake => {
                        self.control.wake.drain();
                        let added = std::mem::take(&mut *lock(&self.control.added));
                        self.readers.extend(added.into_iter().map(Reader::new));
                    }
                    Entry::Admission(slot) => {
                        if let Some(a) = self.admission.on_ready(slot) {
                            self.admit(a);
                        }
                    }
                    Entry::Reader(i) => {
                        if i < self.readers.len()
                            && let Err(why) = self.read(i)
                        {
                            ended.push((Arc::clone(&self.readers[i].conn), why));
                        }
                    }
                }
            }
            for (conn, why) in ended {
                self.readers.retain(|r| !Arc::ptr_eq(&r.conn, &conn));
                self.link_ended(&conn, why);
            }
            self.admission.expire();
            *lock(&self.control.turns) += 1;
            self.control.turned.notify_all();
        }
        self.admission.close_listener();
        let pending = std::mem::take(&mut *lock(&self.control.notices));
        for h in pending {
            let _ = h.join();
        }
    }

    /// Reads link `i`; `Err` when it ended.
    fn read(&mut self, i: usize) -> Result<(), LinkDown> {
        let mut events = Vec::new();
        let peer = self.readers[i].conn.peer;
        let result = self.readers[i].feed(&self.shared.mailbox, &mut events);
        for e in events {
            match e {
                Event::Data(channel, tag, data) => {
                    self.shared.mailbox.push(peer, channel, tag, data)
                }
                Event::Goodbye => {
                    self.goodbye.insert(peer);
                }
                Event::Notice(body) => match Notice::decode(&body, self.shared.size) {
                    Ok(n) => self.noticed(peer, n),
                    Err(why) => return Err(LinkDown::Malformed(format!("notice: {why}"))),
                },
            }
        }
        result
    }

    fn admit(&mut self, a: Admitted) {
        let from = a.hello.from;
        if self.shared.mailbox.down(from).is_some() {
            // Not `Busy`: a connector tries a busy listener again.
            let why = format!("rank {from} is already down here");
            return self
                .admission
                .refuse(a.stream, a.addr, RejectCode::Unexpected, &why);
        }
        if self.shared.links.has_incoming(from) {
            let why = format!("rank {from} already has a link here");
            return self
                .admission
                .refuse(a.stream, a.addr, RejectCode::Duplicate, &why);
        }
        let accept = Accept {
            magic: self.shared.magic,
            rank: self.shared.me,
        }
        .encode();
        if let Err(e) = send_whole(&a.stream, &accept) {
            tracing::warn!(
                "bootstrap rank {}: accepting rank {from} failed: {e}",
                self.shared.me
            );
            return;
        }
        let conn = LinkConn::new(from, a.stream);
        // Only this thread adds incoming links, so the check above still holds.
        self.shared.links.add_incoming(&conn);
        self.readers.push(Reader::new(conn));
    }

    fn link_ended(&mut self, conn: &Arc<LinkConn>, why: LinkDown) {
        let peer = conn.peer;
        let _ = conn.stream.shutdown(Shutdown::Both);
        self.shared.links.remove(conn);
        let closing = self.control.closing.load(Ordering::Acquire);
        let why = match why {
            LinkDown::Closed | LinkDown::Io(..) if closing || self.goodbye.contains(&peer) => {
                LinkDown::Left
            }
            other => other,
        };
        if let LinkDown::Malformed(m) = &why {
            tracing::warn!(
                "bootstrap rank {}: rank {peer} sent a malformed frame ({m}); cutting its link",
                self.shared.me
            );
        }
        if matches!(why, LinkDown::Flood { .. }) {
            tracing::warn!(
                "bootstrap rank {}: rank {peer} {}; cutting its link",
                self.shared.me,
                why.describe()
            );
        }
        let reason = why.describe();
        let left = matches!(why, LinkDown::Left);
        if self.shared.mailbox.set_down(peer, why) && !left && !closing {
            self.tell_others(peer, reason, None);
        }
    }

    fn noticed(&mut self, by: usize, n: Notice) {
        if n.rank == self.shared.me {
            return;
        }
        let why = LinkDown::Reported {
            by,
            reason: n.reason.clone(),
        };
        if self.shared.mailbox.set_down(n.rank, why)
            && !self.control.closing.load(Ordering::Acquire)
        {
            tracing::warn!(
                "bootstrap rank {}: rank {by} reports rank {} gone: {}",
                self.shared.me,
                n.rank,
                n.reason
            );
            self.tell_others(n.rank, n.reason, Some(by));
        }
    }

    /// Passes a notice about `gone` to every linked rank but `except` (on its own thread).
    fn tell_others(&mut self, gone: usize, reason: String, except: Option<usize>) {
        let me = self.shared.me;
        let targets: Vec<Arc<LinkConn>> = self
            .shared
            .links
            .all()
            .into_iter()
            .filter(|c| c.peer != gone && Some(c.peer) != except)
            .filter(|c| self.shared.mailbox.down(c.peer).is_none())
            .collect();
        if targets.is_empty() {
            return;
        }
        let body = Notice { rank: gone, reason }.encode();
        lock(&self.control.notices).retain(|h| !h.is_finished());
        let spawned = thread::Builder::new()
            .name(format!("bs{me}-notice"))
            .stack_size(STACK)
            .spawn(move || {
                let deadline = deadline_in(NOTICE_TIMEOUT);
                for c in targets {
                    let _ = c.send(wire::CHANNEL_NOTICE, 0, &body, deadline);
                }
            });
        match spawned {
            Ok(h) => lock(&self.control.notices).push(h),
            Err(e) => tracing::warn!(
                "bootstrap rank {me}: no thread to tell the others that rank {gone} is gone: {e}"
            ),
        }
    }
}
