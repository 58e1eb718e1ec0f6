//! A rank's inbox. The rank's I/O thread pushes every data frame here, keyed by
//! (peer, channel, tag); receivers take the oldest frame of their key, so messages of other keys
//! wait in their queues instead of being dropped, and any order of receives works. When a
//! peer's link ends, or another rank reports it gone, the reason is recorded; every pending and
//! later receive from that peer fails at once with that reason (frames already queued are still
//! delivered first). A link that ends after the peer's goodbye is recorded as
//! [`LinkDown::Left`]: receives from that peer fail the same way, but it is not a failure to
//! blame ([`Mailbox::first_down`] skips it; [`Mailbox::first_left`] tells when it left).
//!
//! **Bounded memory.** Each peer may have at most [`Caps::bytes`] bytes and [`Caps::frames`]
//! frames queued (taken by no receive yet, the frame being read included), and the whole
//! process at most [`Caps::process_bytes`] bytes, over every peer of every bootstrap in it
//! (ranks as threads share it): the I/O thread asks [`Mailbox::reserve`] for a frame's length
//! as soon as its header arrives, before it reads or allocates a byte of payload; a frame over
//! a cap marks its sender down with [`LinkDown::Flood`], which fails its receives with
//! `Error::BootstrapQueueFull` and makes a communicator on this bootstrap abort (its health
//! monitor sees a dead peer). Over the process's cap, the sender of the frame that does not fit
//! is the one cut, whoever queued the rest.
//!
//! One mutex guards the queues, counters and link states; one condition variable wakes
//! receivers on every push and every state change; every wait is bounded by its deadline. The
//! process's count ([`PROCESS_QUEUED`]) is an atomic added to by `reserve` and subtracted from
//! by receives and by a mailbox's `Drop` (what it still held), under each mailbox's own mutex
//! (`Relaxed`: a count against a cap; nothing is published through it).

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Instant;

use super::net::Ctx;
use crate::error::Error;
use crate::socket::remaining;
use crate::sync::{lock, wait_timeout};

/// Why a peer is down.
#[derive(Debug, Clone)]
pub(crate) enum LinkDown {
    /// EOF or reset without a goodbye (the peer died, or closed its bootstrap after a failure).
    Closed,
    /// EOF after the peer's goodbye: it finished normally and closed its bootstrap.
    Left,
    /// A socket error.
    Io(io::ErrorKind, String),
    /// The peer sent a frame that does not parse; the connection was cut.
    Malformed(String),
    /// The peer queued more than the caps allow; the connection was cut.
    Flood {
        /// Bytes that would have been queued with the refused frame (by this peer; by the
        /// whole process when `process`).
        bytes: u64,
        /// Frames this peer would have had queued with it.
        frames: u64,
        /// The caps.
        caps: Caps,
        /// The process's cap was hit, not the peer's.
        process: bool,
    },
    /// Another rank reported it gone (a notice, passed on along the links).
    Reported {
        /// Who told this rank.
        by: usize,
        /// Why, as reported.
        reason: String,
    },
    /// Its listener could not be reached to open a link (its bootstrap is gone).
    Unreachable(String),
    /// Nothing came from it on a link for longer than the peer timeout (it is stopped or
    /// hung: its process does not run, though its sockets are open); the link was cut.
    Silent(std::time::Duration),
}

impl LinkDown {
    pub fn to_error(&self, ctx: &Ctx) -> Error {
        match self {
            LinkDown::Closed | LinkDown::Left => Error::BootstrapPeerClosed {
                rank: ctx.rank,
                peer: ctx.peer,
                op: ctx.op,
            },
            LinkDown::Io(kind, msg) => Error::BootstrapIo {
                rank: ctx.rank,
                peer: ctx.peer,
                op: ctx.op,
                source: io::Error::new(*kind, msg.clone()),
            },
            LinkDown::Malformed(reason) => ctx.malformed(reason.clone()),
            LinkDown::Flood {
                bytes,
                frames,
                caps,
                process,
            } => Error::BootstrapQueueFull {
                rank: ctx.rank,
                peer: ctx.peer,
                bytes: *bytes,
                frames: *frames,
                max_bytes: if *process {
                    caps.process_bytes
                } else {
                    caps.bytes
                },
                max_frames: caps.frames,
                process: *process,
            },
            LinkDown::Reported { .. } | LinkDown::Unreachable(_) | LinkDown::Silent(_) => {
                Error::BootstrapPeerGone {
                    rank: ctx.rank,
                    peer: ctx.peer,
                    op: ctx.op,
                    reason: self.describe(),
                }
            }
        }
    }

    /// For people (what `Bootstrap::dead_peer` says).
    pub fn describe(&self) -> String {
        match self {
            LinkDown::Closed => "closed its bootstrap connection".into(),
            LinkDown::Left => "left after its goodbye".into(),
            LinkDown::Io(kind, msg) => format!("bootstrap link failed: {kind:?} {msg}"),
            LinkDown::Malformed(m) => format!("sent a malformed frame: {m}"),
            LinkDown::Flood {
                bytes,
                frames,
                caps,
                process: false,
            } => format!(
                "sent more than this rank queues for a peer ({bytes} bytes in {frames} frames; at most {} bytes, {} frames)",
                caps.bytes, caps.frames
            ),
            LinkDown::Flood {
                bytes,
                caps,
                process: true,
                ..
            } => format!(
                "sent a frame over what this process queues for all its peers ({bytes} bytes with it; at most {} bytes)",
                caps.process_bytes
            ),
            LinkDown::Reported { by, reason } => format!("{reason} (reported by rank {by})"),
            LinkDown::Unreachable(why) => format!("its bootstrap listener is gone ({why})"),
            LinkDown::Silent(after) => format!(
                "sent nothing for {:.1} s, over the peer timeout (stopped or hung?); its link was cut",
                after.as_secs_f64()
            ),
        }
    }
}

/// Why a receive returned nothing.
#[derive(Debug)]
pub(crate) enum RecvFail {
    Timeout,
    Down(LinkDown),
}

/// Caps on what waits in the mailbox (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Caps {
    /// Bytes per peer.
    pub bytes: u64,
    /// Frames per peer.
    pub frames: u64,
    /// Bytes in the whole process (every peer of every mailbox).
    pub process_bytes: u64,
}

/// Bytes queued in every mailbox of the process (module docs).
pub(crate) static PROCESS_QUEUED: AtomicU64 = AtomicU64::new(0);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    peer: usize,
    channel: u32,
    tag: u64,
}

/// What one peer has queued.
#[derive(Debug, Default, Clone, Copy)]
struct Queued {
    bytes: u64,
    frames: u64,
}

#[derive(Debug)]
struct State {
    queues: HashMap<Key, VecDeque<Vec<u8>>>,
    queued: HashMap<usize, Queued>,
    down: HashMap<usize, LinkDown>,
    /// The peers that went down without a goodbye, in the order they did: the first is the one
    /// a health monitor should blame, since links of ranks that merely gave up after it follow.
    downs: Vec<usize>,
    /// The first peer that left after its goodbye, and when.
    first_left: Option<(usize, Instant)>,
}

#[derive(Debug)]
pub(crate) struct Mailbox {
    state: Mutex<State>,
    cv: Condvar,
    caps: Caps,
}

impl Mailbox {
    pub fn new(caps: Caps) -> Self {
        Self {
            state: Mutex::new(State {
                queues: HashMap::new(),
                queued: HashMap::new(),
                down: HashMap::new(),
                downs: Vec::new(),
                first_left: None,
            }),
            cv: Condvar::new(),
            caps,
        }
    }

    /// Counts a frame of `len` bytes from `peer` against the caps, before its payload is
    /// read. On `Err`, nothing was counted: the caller cuts the link ([`LinkDown::Flood`]).
    pub fn reserve(&self, peer: usize, len: u64) -> Result<(), LinkDown> {
        let mut st = lock(&self.state);
        let q = st.queued.entry(peer).or_default();
        let (bytes, frames) = (q.bytes.saturating_add(len), q.frames + 1);
        if bytes > self.caps.bytes || frames > self.caps.frames {
            return Err(LinkDown::Flood {
                bytes,
                frames,
                caps: self.caps,
                process: false,
            });
        }
        let before = PROCESS_QUEUED.fetch_add(len, Ordering::Relaxed);
        let total = before.saturating_add(len);
        if total > self.caps.process_bytes {
            PROCESS_QUEUED.fetch_sub(len, Ordering::Relaxed);
            return Err(LinkDown::Flood {
                bytes: total,
                frames,
                caps: self.caps,
                process: true,
            });
        }
        *q = Queued { bytes, frames };
        Ok(())
    }

    /// Queues a frame whose length was [`reserve`](Self::reserve)d.
    pub fn push(&self, peer: usize, channel: u32, tag: u64, data: Vec<u8>) {
        lock(&self.state)
            .queues
            .entry(Key { peer, channel, tag })
            .or_default()
            .push_back(data);
        self.cv.notify_all();
    }

    /// What `peer` has queued: (bytes, frames).
    pub fn queued(&self, peer: usize) -> (u64, u64) {
        let st = lock(&self.state);
        st.queued.get(&peer).map_or((0, 0), |q| (q.bytes, q.frames))
    }

    /// Records why `peer` is down (the first reason wins) and wakes its receivers. `true` if
    /// this call recorded it (the caller then tells the other ranks, unless it left).
    pub fn set_down(&self, peer: usize, why: LinkDown) -> bool {
        let mut st = lock(&self.state);
        if st.down.contains_key(&peer) {
            return false;
        }
        if matches!(why, LinkDown::Left) {
            st.first_left.get_or_insert((peer, Instant::now()));
        } else {
            st.downs.push(peer);
        }
        st.down.insert(peer, why);
        drop(st);
        self.cv.notify_all();
        true
    }

    /// The peer that went down first, and why. (Not the lowest-numbered one: when a rank dies,
    /// the survivors that give up and exit close their links after it, and a monitor polling
    /// later must still blame the rank that died.)
    pub fn first_down(&self) -> Option<(usize, LinkDown)> {
        self.all_down().into_iter().next()
    }

    /// Every peer that went down without a goodbye, and why, in the order they did.
    pub fn all_down(&self) -> Vec<(usize, LinkDown)> {
        let st = lock(&self.state);
        st.downs
            .iter()
            .filter_map(|p| st.down.get(p).cloned().map(|d| (*p, d)))
            .collect()
    }

    /// The first peer that left after its goodbye, and when.
    pub fn first_left(&self) -> Option<(usize, Instant)> {
        lock(&self.state).first_left
    }

    pub fn down(&self, peer: usize) -> Option<LinkDown> {
        lock(&self.state).down.get(&peer).cloned()
    }

    /// The oldest frame of (peer, channel, tag), waiting until `deadline`.
    pub fn recv(
        &self,
        peer: usize,
        channel: u32,
        tag: u64,
        deadline: Instant,
    ) -> Result<Vec<u8>, RecvFail> {
        self.recv_any(&[peer], channel, tag, deadline)
            .map(|(_, m)| m)
            .map_err(|(_, f)| f)
    }

    /// The oldest frame of (peer, channel, tag) for the first peer of `peers` that has one,
    /// waiting until `deadline`; a peer that is down with nothing queued ends the wait
    /// (`Err((peer, Down))`).
    pub fn recv_any(
        &self,
        peers: &[usize],
        channel: u32,
        tag: u64,
        deadline: Instant,
    ) -> Result<(usize, Vec<u8>), (usize, RecvFail)> {
        let mut st = lock(&self.state);
        loop {
            for &peer in peers {
                if let Some(m) = take(&mut st, Key { peer, channel, tag }) {
                    return Ok((peer, m));
                }
            }
            for &peer in peers {
                if let Some(d) = st.down.get(&peer).cloned() {
                    return Err((peer, RecvFail::Down(d)));
                }
            }
            let Some(left) = remaining(deadline) else {
                return Err((peers.first().copied().unwrap_or(0), RecvFail::Timeout));
            };
            st = wait_timeout(&self.cv, st, left);
        }
    }

    /// Waits until every peer in `peers` is down, or `deadline`. `true` if all are.
    pub fn wait_down(&self, peers: &[usize], deadline: Instant) -> bool {
        let mut st = lock(&self.state);
        loop {
            if peers.iter().all(|p| st.down.contains_key(p)) {
                return true;
            }
            let Some(left) = remaining(deadline) else {
                return false;
            };
            st = wait_timeout(&self.cv, st, left);
        }
    }
}

impl Drop for Mailbox {
    /// Gives the process's count back what this mailbox still held (frames nobody received,
    /// frames cut half-read).
    fn drop(&mut self) {
        let st = lock(&self.state);
        let held: u64 = st.queued.values().map(|q| q.bytes).sum();
        PROCESS_QUEUED.fetch_sub(held, Ordering::Relaxed);
    }
}

/// Takes the oldest frame of `key`, uncounting it.
fn take(st: &mut State, key: Key) -> Option<Vec<u8>> {
    let q = st.queues.get_mut(&key)?;
    let m = q.pop_front()?;
    if q.is_empty() {
        st.queues.remove(&key);
    }
    if let Some(c) = st.queued.get_mut(&key.peer) {
        let len = (m.len() as u64).min(c.bytes);
        c.bytes -= len;
        c.frames = c.frames.saturating_sub(1);
        PROCESS_QUEUED.fetch_sub(len, Ordering::Relaxed);
    }
    Some(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAPS: Caps = Caps {
        bytes: 100,
        frames: 3,
        process_bytes: u64::MAX,
    };

    #[test]
    fn frames_over_the_caps_are_refused_and_receives_free_room() {
        let m = Mailbox::new(CAPS);
        m.reserve(1, 60).unwrap();
        m.push(1, 0, 1, vec![0; 60]);
        assert!(matches!(
            m.reserve(1, 41),
            Err(LinkDown::Flood { bytes: 101, .. })
        ));
        m.reserve(1, 40).unwrap();
        m.push(1, 0, 2, vec![0; 40]);
        assert_eq!(m.queued(1), (100, 2));
        assert_eq!(m.queued(2), (0, 0), "caps are per peer");
        m.reserve(2, 100).unwrap();
        let soon = Instant::now() + std::time::Duration::from_secs(1);
        assert_eq!(m.recv(1, 0, 1, soon).unwrap().len(), 60);
        assert_eq!(m.queued(1), (40, 1));
        m.reserve(1, 0).unwrap();
        m.reserve(1, 0).unwrap();
        assert!(matches!(
            m.reserve(1, 0),
            Err(LinkDown::Flood { frames: 4, .. })
        ));
    }

    #[test]
    fn the_process_cap_counts_every_peer_of_every_mailbox_and_is_given_back() {
        // Other tests of this binary queue a few hundred bytes at most meanwhile: the sizes
        // here are far above that, and the cap sits above what was queued at the start.
        const K: u64 = 100_000;
        let base = PROCESS_QUEUED.load(Ordering::Relaxed);
        let caps = Caps {
            bytes: 10 * K,
            frames: 100,
            process_bytes: base + 15 * K,
        };
        let a = Mailbox::new(caps);
        let b = Mailbox::new(caps);
        a.reserve(1, 7 * K).unwrap();
        a.push(1, 0, 1, vec![0; 7 * K as usize]);
        b.reserve(2, 7 * K).unwrap();
        b.push(2, 0, 1, vec![0; 7 * K as usize]);
        // Under a's cap for peer 3, over the process's: peer 3 is the one cut.
        match a.reserve(3, 2 * K) {
            Err(LinkDown::Flood {
                process: true,
                frames: 1,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(a.queued(3), (0, 0), "nothing counted for the refused frame");
        let soon = Instant::now() + std::time::Duration::from_secs(1);
        assert_eq!(a.recv(1, 0, 1, soon).unwrap().len(), 7 * K as usize);
        a.reserve(3, 2 * K).unwrap();
        // Dropping a mailbox gives back what it held (b's frame, a's reservation).
        drop(b);
        drop(a);
        let c = Mailbox::new(caps);
        c.reserve(4, 10 * K).unwrap();
        c.reserve(5, 4 * K).unwrap();
    }

    #[test]
    fn first_down_is_the_first_in_time_not_the_lowest_rank() {
        let m = Mailbox::new(CAPS);
        assert!(m.first_down().is_none());
        m.set_down(2, LinkDown::Closed);
        m.set_down(1, LinkDown::Malformed("x".into()));
        m.set_down(2, LinkDown::Malformed("later".into()));
        let (peer, why) = m.first_down().unwrap();
        assert_eq!(peer, 2);
        assert!(matches!(why, LinkDown::Closed), "{why:?}");
        assert!(matches!(m.down(1), Some(LinkDown::Malformed(_))));
        // Every one, in the order they went down; one that left is not among them.
        m.set_down(0, LinkDown::Left);
        m.set_down(3, LinkDown::Silent(std::time::Duration::from_secs(2)));
        let all: Vec<usize> = m.all_down().into_iter().map(|(p, _)| p).collect();
        assert_eq!(all, [2, 1, 3]);
    }

    #[test]
    fn a_peer_that_left_is_not_blamed_but_its_receives_fail() {
        let m = Mailbox::new(CAPS);
        m.push(1, 0, 5, b"queued".to_vec());
        m.set_down(1, LinkDown::Left);
        assert!(m.first_down().is_none());
        assert_eq!(m.first_left().map(|(p, _)| p), Some(1));
        let soon = Instant::now() + std::time::Duration::from_secs(5);
        assert_eq!(m.recv(1, 0, 5, soon).unwrap(), b"queued");
        let t = Instant::now();
        assert!(matches!(
            m.recv(1, 0, 5, soon),
            Err(RecvFail::Down(LinkDown::Left))
        ));
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        // A later failure of another peer is blamed.
        m.set_down(2, LinkDown::Closed);
        assert_eq!(m.first_down().map(|(p, _)| p), Some(2));
    }
}
