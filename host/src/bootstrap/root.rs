//! The root service: rank 0 only, on one thread (`bs0-root`). During set-up it admits one
//! authenticated JOIN per rank ([`Admission`]: non-blocking handshakes, however many hostile
//! connections there are) and answers all of them with the address table, or, if a joined rank
//! leaves or ranks are still missing at the deadline, with an ABORT naming them, so every rank
//! fails with the same, specific error. A second JOIN for a rank that has joined is refused
//! with `REJECT Duplicate` without blocking, like every other refusal, naming the address the
//! rank joined from.
//!
//! After the table it keeps serving the root address until rank 0's bootstrap is dropped, and
//! answers every JOIN that proves itself with `REJECT Duplicate` (the world is complete): a
//! rank that arrives late because another process claimed its rank (an impostor in a world
//! without a secret, or the rank started twice) hears so, instead of finding the port closed
//! and timing out.
//!
//! The thread polls the root listener, the handshakes in progress and the joined ranks'
//! connections (a joined rank's connection that closes, or says anything, before the table is
//! that rank leaving).

use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::admit::{Admission, Admitted, Gate, Slot};
use super::keying::{self, WorldKey};
use super::net::POLL_SLICE;
use super::os::{self, Wake};
use super::wire::{self, Abort, AbortCode, Join, Purpose, RejectCode, Table, TableEntry};
use crate::error::{Error, Result};
use crate::socket::{classify, deadline_in, remaining, write_full};
use crate::sync::{lock, wait_timeout};

/// What the root needs to know.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RootParams {
    pub magic: u64,
    pub size: usize,
    /// The world's key and the job nonce this root hands out.
    pub key: WorldKey,
    /// The root's own set-up deadline (moved earlier by JOINs from ranks that started earlier).
    pub deadline: Instant,
    pub handshake_timeout: Duration,
}

struct Stop {
    flag: AtomicBool,
    wake: Wake,
    /// The verdict once given: `Some(true)` when every rank got the table.
    verdict: Mutex<Option<bool>>,
    given: Condvar,
}

impl Stop {
    fn give(&self, table: bool) {
        *lock(&self.verdict) = Some(table);
        self.given.notify_all();
    }
}

/// The running root service.
pub(crate) struct RootService {
    stop: Arc<Stop>,
    thread: Option<JoinHandle<()>>,
}

impl RootService {
    pub fn start(listener: TcpListener, params: RootParams) -> Result<Self> {
        let spawn = |source| Error::BootstrapSpawn {
            rank: 0,
            what: "root thread",
            source,
        };
        let gate = Gate {
            me: wire::ROOT,
            purpose: Purpose::Join,
            magic: params.magic,
            size: params.size,
            key: keying::known(params.key),
        };
        let admission =
            Admission::new(listener, gate, params.handshake_timeout, "root").map_err(|source| {
                Error::BootstrapListen {
                    rank: 0,
                    addr: SocketAddr::from(([0, 0, 0, 0], 0)),
                    source,
                }
            })?;
        let stop = Arc::new(Stop {
            flag: AtomicBool::new(false),
            wake: Wake::new().map_err(spawn)?,
            verdict: Mutex::new(None),
            given: Condvar::new(),
        });
        let s = Arc::clone(&stop);
        let thread = thread::Builder::new()
            .name("bs0-root".into())
            .spawn(move || {
                Root {
                    p: params,
                    admission,
                    members: (0..params.size).map(|_| None).collect(),
                    stop: s,
                }
                .run()
            })
            .map_err(spawn)?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }

    /// With `wait`, waits for the root's verdict (it reaches every rank, or the root's
    /// deadline passes); without, tells the root to stop. A root that sent the table is
    /// returned, to serve late joiners until it is dropped; otherwise its thread is joined.
    pub fn finish(mut self, wait: bool) -> Option<Self> {
        if wait {
            let mut v = lock(&self.stop.verdict);
            while v.is_none() && self.thread.as_ref().is_some_and(|t| !t.is_finished()) {
                v = wait_timeout(&self.stop.given, v, POLL_SLICE);
            }
            if *v == Some(true) {
                drop(v);
                return Some(self);
            }
        } else {
            self.signal();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        None
    }

    fn signal(&self) {
        self.stop.flag.store(true, Ordering::Release);
        self.stop.wake.wake();
    }
}

impl Drop for RootService {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.signal();
            let _ = t.join();
        }
    }
}

struct Member {
    join: Join,
    stream: TcpStream,
    addr: SocketAddr,
}

struct Root {
    p: RootParams,
    admission: Admission,
    members: Vec<Option<Member>>,
    stop: Arc<Stop>,
}

/// What one round of polling brought.
enum Happened {
    Nothing,
    Left(usize, String),
    Stopped,
}

impl Root {
    fn run(mut self) {
        let mut deadline = self.p.deadline;
        let verdict = loop {
            if self.members.iter().all(Option::is_some) {
                let claimed = self.send_tables();
                self.stop.give(true);
                self.serve_late(&claimed);
                return;
            }
            let Some(left) = remaining(deadline) else {
                let missing = (0..self.p.size)
                    .filter(|&r| self.members[r].is_none())
                    .collect();
                break Abort {
                    code: AbortCode::RanksMissing,
                    ranks: missing,
                };
            };
            let (happened, joined) = self.turn(left);
            for a in joined {
                if let Some(d) = self.register(a) {
                    deadline = deadline.min(d);
                }
            }
            match happened {
                Happened::Nothing => {}
                Happened::Left(rank, why) => {
                    tracing::warn!("bootstrap root: rank {rank} {why} before set-up completed");
                    self.members[rank] = None;
                    break Abort {
                        code: AbortCode::RankLeft,
                        ranks: vec![rank],
                    };
                }
                Happened::Stopped => {
                    break Abort {
                        code: AbortCode::RootStopped,
                        ranks: Vec::new(),
                    };
                }
            }
        };
        self.fail(verdict, deadline);
    }

    /// Polls once (at most `left`): admits, watches members, expires handshakes.
    fn turn(&mut self, left: Duration) -> (Happened, Vec<Admitted>) {
        #[derive(Clone, Copy)]
        enum Entry {
            Wake,
            Admission(Slot),
            Member(usize),
        }
        let mut fds = vec![os::pollin(&self.stop.wake)];
        let mut entries = vec![Entry::Wake];
        let mut slots = Vec::new();
        self.admission.poll_fds(&mut fds, &mut slots);
        entries.extend(slots.into_iter().map(Entry::Admission));
        for (r, m) in self.members.iter().enumerate() {
            if let Some(m) = m {
                fds.push(os::pollin(&m.stream));
                entries.push(Entry::Member(r));
            }
        }
        let wait = self
            .admission
            .next_deadline()
            .and_then(remaining)
            .map_or(left, |d| d.min(left))
            .min(POLL_SLICE);
        if let Err(e) = os::poll(&mut fds, wait) {
            tracing::warn!("bootstrap root: poll failed: {e}");
            thread::sleep(POLL_SLICE);
        }
        let mut happened = Happened::Nothing;
        let mut joined = Vec::new();
        for (fd, entry) in fds.iter().zip(entries) {
            if fd.revents == 0 {
                continue;
            }
            match entry {
                Entry::Wake => {
                    self.stop.wake.drain();
                    if self.stop.flag.load(Ordering::Acquire) {
                        happened = Happened::Stopped;
                    }
                }
                Entry::Admission(slot) => joined.extend(self.admission.on_ready(slot)),
                Entry::Member(r) => {
                    if let Some(m) = &self.members[r]
                        && let Some(why) = left_why(&m.stream)
                    {
                        happened = Happened::Left(r, why);
                    }
                }
            }
        }
        self.admission.expire();
        (happened, joined)
    }

    /// Records an admitted JOIN (refusing a second one for a rank); the rank's own deadline.
    fn register(&mut self, a: Admitted) -> Option<Instant> {
        let rank = a.hello.from;
        let join = a.join?;
        if let Some(m) = &self.members[rank] {
            let why = format!("rank {rank} has already joined (from {})", m.addr);
            self.admission
                .refuse(a.stream, a.addr, RejectCode::Duplicate, &why);
            return None;
        }
        self.members[rank] = Some(Member {
            join,
            stream: a.stream,
            addr: a.addr,
        });
        Some(deadline_in(Duration::from_millis(join.deadline_ms)))
    }

    /// Sends every rank the table and closes the members' connections; where each rank joined
    /// from.
    fn send_tables(&mut self) -> Vec<SocketAddr> {
        let entries = self
            .members
            .iter()
            .flatten()
            .map(|m| TableEntry {
                listen: m.join.listen,
                host_hash: m.join.host_hash,
            })
            .collect();
        let table = Table {
            magic: self.p.magic,
            entries,
        }
        .encode();
        let mut claimed = Vec::with_capacity(self.p.size);
        for (r, m) in self.members.iter_mut().enumerate() {
            if let Some(m) = m.take() {
                answer(r, &m.stream, &table, &self.p);
                claimed.push(m.addr);
            }
        }
        tracing::debug!(
            "bootstrap root: all {} ranks joined; table sent",
            self.p.size
        );
        claimed
    }

    /// After the table, until stopped: every JOIN that proves itself is a rank claimed
    /// already (module docs); it is told so, with the address the rank joined from.
    fn serve_late(mut self, claimed: &[SocketAddr]) {
        while !self.stop.flag.load(Ordering::Acquire) {
            let (_, joined) = self.turn(POLL_SLICE);
            for a in joined {
                let r = a.hello.from;
                let from = claimed.get(r).map_or("?".into(), ToString::to_string);
                let why = format!(
                    "rank {r} joined from {from} and the world has formed without this process"
                );
                self.admission
                    .refuse(a.stream, a.addr, RejectCode::Duplicate, &why);
            }
        }
    }

    /// Set-up failed: tell every rank that has joined, and, if a rank left, every rank that
    /// joins later, until all know or the deadline passes.
    fn fail(mut self, verdict: Abort, deadline: Instant) {
        tracing::warn!(
            "bootstrap root: set-up failed: {:?} {:?}",
            verdict.code,
            verdict.ranks
        );
        let frame = verdict.encode();
        let mut told = vec![false; self.p.size];
        for r in &verdict.ranks {
            told[*r] = true;
        }
        for (r, m) in self.members.iter_mut().enumerate() {
            if let Some(m) = m.take() {
                answer(r, &m.stream, &frame, &self.p);
                told[r] = true;
            }
        }
        self.stop.give(false);
        if verdict.code == AbortCode::RankLeft {
            while !told.iter().all(|&t| t) && !self.stop.flag.load(Ordering::Acquire) {
                let Some(left) = remaining(deadline) else {
                    break;
                };
                let (_, joined) = self.turn(left);
                for a in joined {
                    let r = a.hello.from;
                    answer(r, &a.stream, &frame, &self.p);
                    told[r] = true;
                }
            }
        }
    }
}

/// Why a joined rank's connection is over, if it is: closed, failed, or said something.
fn left_why(stream: &TcpStream) -> Option<String> {
    let mut b = [0u8; 64];
    match os::recv_now(stream, &mut b) {
        Ok(0) => Some("closed its connection".into()),
        Ok(_) => Some("sent bytes after its JOIN".into()),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
        Err(e) => classify(e).map(|f| format!("connection failed: {f:?}")),
    }
}

/// Sends a whole answer frame to a rank and closes our writing side.
fn answer(rank: usize, stream: &TcpStream, frame: &[u8], p: &RootParams) {
    if let Err(e) = write_full(stream, frame, deadline_in(p.handshake_timeout)) {
        tracing::warn!("bootstrap root: answering rank {rank} failed: {e:?}");
    }
    let _ = stream.shutdown(Shutdown::Write);
}
