//! A rank's inbox. Connection reader threads push every data frame here, keyed by
//! (peer, channel, tag); receivers take the oldest frame of their key, so messages of other keys
//! wait in their queues instead of being dropped, and any order of receives works. When a
//! connection ends, its reader records why; every pending and later receive from that peer
//! fails at once with that reason (frames already queued are still delivered first).
//!
//! One mutex guards the queues and the link states; one condition variable wakes receivers on
//! every push and every link failure; every wait is bounded by its deadline.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::{Condvar, Mutex};
use std::time::Instant;

use super::net::{Ctx, lock, remaining};
use crate::error::Error;

/// Why a peer's connection is down.
#[derive(Debug, Clone)]
pub(crate) enum LinkDown {
    /// EOF or reset (the peer exited or dropped its bootstrap).
    Closed,
    /// A socket error.
    Io(io::ErrorKind, String),
    /// The peer sent a frame that does not parse; the connection was cut.
    Malformed(String),
}

impl LinkDown {
    pub fn to_error(&self, ctx: &Ctx) -> Error {
        match self {
            LinkDown::Closed => Error::BootstrapPeerClosed {
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
        }
    }
}

/// Why a receive returned nothing.
#[derive(Debug)]
pub(crate) enum RecvFail {
    Timeout,
    Down(LinkDown),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    peer: usize,
    channel: u32,
    tag: u64,
}

#[derive(Debug)]
struct State {
    queues: HashMap<Key, VecDeque<Vec<u8>>>,
    down: Vec<Option<LinkDown>>,
}

#[derive(Debug)]
pub(crate) struct Mailbox {
    state: Mutex<State>,
    cv: Condvar,
}

impl Mailbox {
    pub fn new(size: usize) -> Self {
        Self {
            state: Mutex::new(State {
                queues: HashMap::new(),
                down: vec![None; size],
            }),
            cv: Condvar::new(),
        }
    }

    pub fn push(&self, peer: usize, channel: u32, tag: u64, data: Vec<u8>) {
        lock(&self.state)
            .queues
            .entry(Key { peer, channel, tag })
            .or_default()
            .push_back(data);
        self.cv.notify_all();
    }

    /// Records why `peer`'s link ended (the first reason wins) and wakes its receivers.
    pub fn set_down(&self, peer: usize, why: LinkDown) {
        let mut st = lock(&self.state);
        if let Some(slot) = st.down.get_mut(peer) {
            slot.get_or_insert(why);
        }
        drop(st);
        self.cv.notify_all();
    }

    /// The lowest peer whose link is down, and why.
    pub fn first_down(&self) -> Option<(usize, LinkDown)> {
        let st = lock(&self.state);
        st.down
            .iter()
            .enumerate()
            .find_map(|(peer, d)| d.clone().map(|d| (peer, d)))
    }

    pub fn down(&self, peer: usize) -> Option<LinkDown> {
        lock(&self.state).down.get(peer).cloned().flatten()
    }

    /// The oldest frame of (peer, channel, tag), waiting until `deadline`.
    pub fn recv(
        &self,
        peer: usize,
        channel: u32,
        tag: u64,
        deadline: Instant,
    ) -> Result<Vec<u8>, RecvFail> {
        let key = Key { peer, channel, tag };
        let mut st = lock(&self.state);
        loop {
            if let Some(q) = st.queues.get_mut(&key)
                && let Some(m) = q.pop_front()
            {
                if q.is_empty() {
                    st.queues.remove(&key);
                }
                return Ok(m);
            }
            if let Some(d) = st.down.get(peer).cloned().flatten() {
                return Err(RecvFail::Down(d));
            }
            let Some(left) = remaining(deadline) else {
                return Err(RecvFail::Timeout);
            };
            st = self
                .cv
                .wait_timeout(st, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    /// Waits until every link in `peers` is down, or `deadline`. `true` if all are.
    pub fn wait_down(&self, peers: &[usize], deadline: Instant) -> bool {
        let mut st = lock(&self.state);
        loop {
            if peers
                .iter()
                .all(|&p| st.down.get(p).is_none_or(Option::is_some))
            {
                return true;
            }
            let Some(left) = remaining(deadline) else {
                return false;
            };
            st = self
                .cv
                .wait_timeout(st, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }
}
