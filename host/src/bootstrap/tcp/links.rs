//! A rank's links: the connections it holds to other ranks, opened on first use.
//!
//! Each link is one TCP connection ([`LinkConn`]) carrying data frames both ways. The rank's
//! I/O thread reads every link (one thread for all of them, `reactor.rs`); callers write under
//! the link's writer lock, a whole frame at a time. One file descriptor per link end: reader
//! and writers share the socket (the reader never blocks on it, `os::recv_now`).
//!
//! **Which link carries what.** To send to `p`, a rank always uses the same link, its *out*
//! link to `p` (chosen once, never changed), so the frames of one sender reach one receiver in
//! order. The out link is the one this rank opened to `p`, or, if `p` opened one first, that
//! one. If both open a link at the same moment, the pair has two links; each side sends on its
//! own and reads both. A rank accepts at most one link from each peer.
//!
//! Shared state: the table of slots (one mutex; a condition variable wakes callers that wait
//! for another caller's connect to the same peer) and the list of every live link (one mutex),
//! written by callers (links they open) and the I/O thread (links it accepts, links that end),
//! read by both and by `Drop`.

use std::collections::HashMap;
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use super::super::wire::{self, DataHeader};
use crate::socket::{IoFail, remaining, write_full};
use crate::sync::{lock, wait_timeout};

/// Payloads up to this size are sent in one write together with their header.
const COALESCE_BYTES: usize = 64 << 10;

/// One link: the socket and its writer lock.
#[derive(Debug)]
pub(super) struct LinkConn {
    /// The rank at the other end.
    pub(super) peer: usize,
    /// The socket, in blocking mode (writers use deadlines; the reader `MSG_DONTWAIT`).
    pub(super) stream: TcpStream,
    /// Held while a frame is written; `Some(why)` once a write failed part-way (the byte
    /// stream is no longer framed, so the link is cut).
    writer: Mutex<Option<String>>,
}

/// Why a frame could not be sent.
#[derive(Debug)]
pub(super) enum SendFail {
    Io(IoFail),
    /// An earlier send failed part-way.
    Broken(String),
}

impl LinkConn {
    pub(super) fn new(peer: usize, stream: TcpStream) -> Arc<Self> {
        Arc::new(Self {
            peer,
            stream,
            writer: Mutex::new(None),
        })
    }

    /// Writes one whole data frame by `deadline`.
    pub(super) fn send(
        &self,
        channel: u32,
        tag: u64,
        data: &[u8],
        deadline: Instant,
    ) -> Result<(), SendFail> {
        let mut broken = lock(&self.writer);
        if let Some(why) = &*broken {
            return Err(SendFail::Broken(why.clone()));
        }
        let header = DataHeader {
            channel,
            tag,
            len: data.len() as u64,
        }
        .encode();
        let sent = if data.len() <= COALESCE_BYTES {
            let mut frame = Vec::with_capacity(header.len() + data.len());
            frame.extend_from_slice(&header);
            frame.extend_from_slice(data);
            write_full(&self.stream, &frame, deadline)
        } else {
            write_full(&self.stream, &header, deadline)
                .and_then(|()| write_full(&self.stream, data, deadline))
        };
        if let Err(f) = sent {
            *broken = Some(format!("{f:?}"));
            let _ = self.stream.shutdown(Shutdown::Both);
            return Err(SendFail::Io(f));
        }
        Ok(())
    }

    /// Writes a keepalive frame unless a frame is being written or the socket has no room for
    /// it now (`beat.rs`): only the rest of a keepalive written in part is waited for, until
    /// `deadline`; failing then breaks the link as in [`send`](Self::send) (the stream would
    /// no longer be framed).
    pub(super) fn beat(&self, deadline: Instant) {
        use std::os::fd::AsRawFd;
        let Ok(mut broken) = self.writer.try_lock() else {
            return;
        };
        if broken.is_some() {
            return;
        }
        let header = DataHeader {
            channel: wire::CHANNEL_KEEPALIVE,
            tag: 0,
            len: 0,
        }
        .encode();
        // SAFETY: a live socket of this link; the buffer is `header`, valid for its length.
        let first = unsafe {
            libc::send(
                self.stream.as_raw_fd(),
                header.as_ptr().cast(),
                header.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        // Nothing written (no room: the peer has not read what came before, and hears that
        // when it does; or an error the next send or the reader meets): skipped, still framed.
        let Ok(sent @ 1..) = usize::try_from(first) else {
            return;
        };
        if let Some(rest) = header.get(sent..).filter(|r| !r.is_empty())
            && let Err(f) = write_full(&self.stream, rest, deadline)
        {
            *broken = Some(format!("{f:?}"));
            let _ = self.stream.shutdown(Shutdown::Both);
        }
    }

    /// Sends the goodbye frame (best effort) and closes this side for writing.
    pub(super) fn close(&self, goodbye: bool, deadline: Instant) {
        if goodbye {
            let _ = self.send(wire::CHANNEL_GOODBYE, 0, &[], deadline);
        }
        let _ = self.stream.shutdown(Shutdown::Write);
    }
}

#[derive(Default)]
struct Slot {
    out: Option<Arc<LinkConn>>,
    /// A caller is opening a link to this peer.
    connecting: bool,
    /// The peer opened a link to this rank.
    incoming: bool,
}

/// What [`Links::begin`] found.
pub(super) enum Begin {
    /// The out link.
    Ready(Arc<LinkConn>),
    /// None yet, and no one is opening one: the caller opens it, then calls [`Links::end`].
    Open,
    /// Another caller is still opening it at the deadline.
    Timeout,
}

/// A rank's links (module docs).
#[derive(Default)]
pub(super) struct Links {
    slots: Mutex<HashMap<usize, Slot>>,
    cv: Condvar,
    all: Mutex<Vec<Arc<LinkConn>>>,
}

impl Links {
    /// The out link to `peer`, or the caller's turn to open it, waiting until `deadline` for
    /// another caller's attempt.
    pub(super) fn begin(&self, peer: usize, deadline: Instant) -> Begin {
        let mut slots = lock(&self.slots);
        loop {
            let slot = slots.entry(peer).or_default();
            if let Some(l) = &slot.out {
                return Begin::Ready(Arc::clone(l));
            }
            if !slot.connecting {
                slot.connecting = true;
                return Begin::Open;
            }
            let Some(left) = remaining(deadline) else {
                return Begin::Timeout;
            };
            slots = wait_timeout(&self.cv, slots, left);
        }
    }

    /// Ends the caller's attempt: the link it opened becomes the out link, or (on failure) the
    /// next caller may try.
    pub(super) fn end(&self, peer: usize, opened: Option<Arc<LinkConn>>) {
        let mut slots = lock(&self.slots);
        let slot = slots.entry(peer).or_default();
        slot.connecting = false;
        if let Some(l) = opened {
            lock(&self.all).push(Arc::clone(&l));
            slot.out.get_or_insert(l);
        }
        drop(slots);
        self.cv.notify_all();
    }

    /// The out link to `peer`, if there is one.
    pub(super) fn out(&self, peer: usize) -> Option<Arc<LinkConn>> {
        lock(&self.slots).get(&peer).and_then(|s| s.out.clone())
    }

    /// Records a link `peer` opened; it becomes the out link unless there is one or a caller
    /// is opening one.
    pub(super) fn add_incoming(&self, conn: &Arc<LinkConn>) {
        let mut slots = lock(&self.slots);
        let slot = slots.entry(conn.peer).or_default();
        slot.incoming = true;
        if slot.out.is_none() && !slot.connecting {
            slot.out = Some(Arc::clone(conn));
        }
        lock(&self.all).push(Arc::clone(conn));
        drop(slots);
        self.cv.notify_all();
    }

    /// Whether `peer` opened a link to this rank.
    pub(super) fn has_incoming(&self, peer: usize) -> bool {
        lock(&self.slots).get(&peer).is_some_and(|s| s.incoming)
    }

    /// Every live link.
    pub(super) fn all(&self) -> Vec<Arc<LinkConn>> {
        lock(&self.all).clone()
    }

    /// Forgets a link that ended (the I/O thread's; the out slot keeps it, so that sends
    /// report the peer's state).
    pub(super) fn remove(&self, conn: &Arc<LinkConn>) {
        lock(&self.all).retain(|c| !Arc::ptr_eq(c, conn));
    }

    /// How many links are live (diagnostics).
    pub(super) fn count(&self) -> usize {
        lock(&self.all).len()
    }
}
