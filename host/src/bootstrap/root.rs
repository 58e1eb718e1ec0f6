//! The root service: rank 0 only, during set-up. It collects one JOIN per rank and answers all of
//! them with the address table, or, if a joined rank leaves or ranks are still missing at the
//! deadline, with an ABORT naming them, so every rank fails with the same, specific error.
//!
//! Threads: the root thread (decisions, in [`run`]), the root listener's accept thread, and one
//! thread per accepted connection, which checks the JOIN and then watches the connection until
//! the root is done with it (a close before the table is the rank leaving).

use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::net::{Acceptor, Handshake, POLL_SLICE, Pending, read_control, reject, reject_for};
use super::wire::{self, Abort, AbortCode, Join, Kind, RejectCode, Table, TableEntry};
use crate::error::{Error, Result};
use crate::socket::{deadline_in, remaining, write_full};

/// What the root needs to know.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RootParams {
    pub magic: u64,
    pub size: usize,
    /// The root's own set-up deadline (moved earlier by JOINs from ranks that started earlier).
    pub deadline: Instant,
    pub handshake_timeout: Duration,
}

enum Event {
    Joined {
        conn: u64,
        join: Join,
        stream: TcpStream,
    },
    Left {
        conn: u64,
        rank: usize,
        why: String,
    },
    Stop,
}

/// The running root service.
pub(crate) struct RootService {
    tx: Sender<Event>,
    thread: Option<JoinHandle<()>>,
}

impl RootService {
    pub fn start(listener: TcpListener, params: RootParams) -> Result<Self> {
        let (tx, rx) = mpsc::channel();
        let closing = Arc::new(AtomicBool::new(false));
        let handshake = JoinHandshake {
            params,
            tx: tx.clone(),
            next_conn: AtomicU64::new(0),
            closing: Arc::clone(&closing),
        };
        let acceptor = Acceptor::start(0, listener, "root", Arc::new(handshake))?;
        let thread = thread::Builder::new()
            .name("bs0-rootsvc".into())
            .spawn(move || run(rx, params, acceptor, closing))
            .map_err(|source| Error::BootstrapSpawn {
                rank: 0,
                what: "root thread",
                source,
            })?;
        Ok(Self {
            tx,
            thread: Some(thread),
        })
    }

    /// Waits for the root thread. With `wait`, the root finishes its work (its verdict reaches
    /// every rank, or its deadline passes); without, it is told to stop first.
    pub fn finish(mut self, wait: bool) {
        if !wait {
            let _ = self.tx.send(Event::Stop);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for RootService {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = self.tx.send(Event::Stop);
            let _ = t.join();
        }
    }
}

struct JoinHandshake {
    params: RootParams,
    tx: Sender<Event>,
    next_conn: AtomicU64,
    /// Set once the root has answered: watchers stop watching.
    closing: Arc<AtomicBool>,
}

impl JoinHandshake {
    fn refuse(&self, stream: &TcpStream, addr: SocketAddr, code: RejectCode, why: &str) {
        tracing::warn!("bootstrap root: refused the connection from {addr}: {why}");
        reject(stream, code, why);
    }

    /// Watches a joined rank's connection until the root is done with it; `Some(why)` if it
    /// ended before.
    fn watch(&self, stream: &TcpStream) -> Option<String> {
        if let Err(e) = stream.set_read_timeout(Some(POLL_SLICE)) {
            return Some(format!("connection failed: {e}"));
        }
        let mut buf = [0u8; 64];
        loop {
            if self.closing.load(Ordering::Acquire) {
                return None;
            }
            match (&*stream).read(&mut buf) {
                Ok(0) => return Some("closed its connection".into()),
                Ok(_) => return Some("sent bytes after its JOIN".into()),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Some(format!("connection failed: {e}")),
            }
        }
    }
}

impl Handshake for JoinHandshake {
    fn handle(&self, stream: TcpStream, addr: SocketAddr, pending: Pending) {
        let p = self.params;
        let deadline = deadline_in(p.handshake_timeout);
        let _ = stream.set_nodelay(true);
        let body = match read_control(&stream, deadline, &[(Kind::Join, wire::JOIN_BODY_LEN)]) {
            Ok((_, body)) => body,
            Err(f) => {
                let (code, why) = reject_for(&f);
                return self.refuse(&stream, addr, code, &why);
            }
        };
        let join = match Join::decode(&body) {
            Ok(j) => j,
            Err(why) => return self.refuse(&stream, addr, RejectCode::Malformed, &why),
        };
        if join.magic != p.magic {
            return self.refuse(
                &stream,
                addr,
                RejectCode::BadMagic,
                "wrong session magic (a rank of another job?)",
            );
        }
        if join.size != p.size {
            let why = format!(
                "rank {} says the world has {} ranks; the root says {}",
                join.rank, join.size, p.size
            );
            return self.refuse(&stream, addr, RejectCode::Mismatch, &why);
        }
        if join.rank >= p.size || !wire::is_connectable(&join.listen) {
            let why = format!(
                "rank {} with listen address {} is not usable",
                join.rank, join.listen
            );
            return self.refuse(&stream, addr, RejectCode::Malformed, &why);
        }
        let Ok(clone) = stream.try_clone() else {
            return;
        };
        if !pending.release() {
            return;
        }
        let conn = self.next_conn.fetch_add(1, Ordering::Relaxed);
        if self
            .tx
            .send(Event::Joined {
                conn,
                join,
                stream: clone,
            })
            .is_err()
        {
            return;
        }
        if let Some(why) = self.watch(&stream) {
            let _ = self.tx.send(Event::Left {
                conn,
                rank: join.rank,
                why,
            });
        }
    }
}

struct Member {
    conn: u64,
    join: Join,
    stream: TcpStream,
}

/// Sends a whole answer frame to a rank and closes our writing side.
fn answer(rank: usize, stream: &TcpStream, frame: &[u8], p: &RootParams) {
    if let Err(e) = write_full(stream, frame, deadline_in(p.handshake_timeout)) {
        tracing::warn!("bootstrap root: answering rank {rank} failed: {e:?}");
    }
    let _ = stream.shutdown(Shutdown::Write);
}

fn run(rx: Receiver<Event>, p: RootParams, mut acceptor: Acceptor, closing: Arc<AtomicBool>) {
    let mut deadline = p.deadline;
    let mut members: Vec<Option<Member>> = (0..p.size).map(|_| None).collect();
    let verdict = loop {
        if members.iter().all(Option::is_some) {
            closing.store(true, Ordering::Release);
            let entries = members
                .iter()
                .flatten()
                .map(|m| TableEntry {
                    listen: m.join.listen,
                    host_hash: m.join.host_hash,
                })
                .collect();
            let table = Table {
                magic: p.magic,
                entries,
            }
            .encode();
            for (r, m) in members.iter().enumerate() {
                if let Some(m) = m {
                    answer(r, &m.stream, &table, &p);
                }
            }
            tracing::debug!("bootstrap root: all {} ranks joined; table sent", p.size);
            acceptor.stop();
            return;
        }
        let Some(left) = remaining(deadline) else {
            let missing = members
                .iter()
                .enumerate()
                .filter(|(_, m)| m.is_none())
                .map(|(r, _)| r)
                .collect();
            break Abort {
                code: AbortCode::RanksMissing,
                ranks: missing,
            };
        };
        match rx.recv_timeout(left) {
            Ok(Event::Joined { conn, join, stream }) => {
                if members[join.rank].is_some() {
                    let why = format!("rank {} has already joined", join.rank);
                    tracing::warn!("bootstrap root: {why}; refusing the second JOIN");
                    reject(&stream, RejectCode::Duplicate, &why);
                } else {
                    let theirs = deadline_in(Duration::from_millis(join.deadline_ms));
                    deadline = deadline.min(theirs);
                    members[join.rank] = Some(Member { conn, join, stream });
                }
            }
            Ok(Event::Left { conn, rank, why }) => {
                if members[rank].as_ref().is_some_and(|m| m.conn == conn) {
                    tracing::warn!("bootstrap root: rank {rank} {why} before set-up completed");
                    members[rank] = None;
                    break Abort {
                        code: AbortCode::RankLeft,
                        ranks: vec![rank],
                    };
                }
            }
            Ok(Event::Stop) | Err(RecvTimeoutError::Disconnected) => {
                break Abort {
                    code: AbortCode::RootStopped,
                    ranks: Vec::new(),
                };
            }
            Err(RecvTimeoutError::Timeout) => {}
        }
    };

    // Set-up failed: tell every rank that has joined, and, if a rank left, every rank that joins
    // later, until all know or the deadline passes.
    closing.store(true, Ordering::Release);
    tracing::warn!(
        "bootstrap root: set-up failed: {:?} {:?}",
        verdict.code,
        verdict.ranks
    );
    let frame = verdict.encode();
    let mut told = vec![false; p.size];
    for r in &verdict.ranks {
        told[*r] = true;
    }
    for (r, m) in members.iter().enumerate() {
        if let Some(m) = m {
            answer(r, &m.stream, &frame, &p);
            told[r] = true;
        }
    }
    if verdict.code == AbortCode::RankLeft {
        while !told.iter().all(|&t| t) {
            let Some(left) = remaining(deadline) else {
                break;
            };
            match rx.recv_timeout(left) {
                Ok(Event::Joined { join, stream, .. }) => {
                    answer(join.rank, &stream, &frame, &p);
                    told[join.rank] = true;
                }
                Ok(Event::Left { .. }) | Err(RecvTimeoutError::Timeout) => {}
                Ok(Event::Stop) | Err(RecvTimeoutError::Disconnected) => break,
            }
        }
    }
    acceptor.stop();
    // Streams of joined ranks close when `members` drops, after the answers were flushed.
    drop(members);
}
