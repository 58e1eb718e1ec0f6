//! A rank's inbox. Connection reader threads push every data frame here, keyed by
//! (peer, channel, tag); receivers take the oldest frame of their key, so messages of other keys
//! wait in their queues instead of being dropped, and any order of receives works. When a
//! connection ends, its reader records why; every pending and later receive from that peer
//! fails at once with that reason (frames already queued are still delivered first). A link
//! that ends after the peer's goodbye is recorded as [`LinkDown::Left`]: receives from that
//! peer fail the same way, but it is not a failure to blame ([`Mailbox::first_down`] skips it;
//! [`Mailbox::first_left`] tells when it left).
//!
//! One mutex guards the queues and the link states; one condition variable wakes receivers on
//! every push and every link failure; every wait is bounded by its deadline.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::{Condvar, Mutex};
use std::time::Instant;

use super::net::Ctx;
use crate::error::Error;
use crate::socket::remaining;
use crate::sync::{lock, wait_timeout};

/// Why a peer's connection is down.
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
    /// The peer whose link went down first (in time) without a goodbye: the one a health
    /// monitor should blame, since links of ranks that merely gave up after it follow.
    first_down: Option<usize>,
    /// The first peer that left after its goodbye, and when.
    first_left: Option<(usize, Instant)>,
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
                first_down: None,
                first_left: None,
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
        if let Some(slot) = st.down.get_mut(peer)
            && slot.is_none()
        {
            let left = matches!(why, LinkDown::Left);
            *slot = Some(why);
            if left {
                st.first_left.get_or_insert((peer, Instant::now()));
            } else {
                st.first_down.get_or_insert(peer);
            }
        }
        drop(st);
        self.cv.notify_all();
    }

    /// The peer whose link went down first, and why. (Not the lowest-numbered one: when a
    /// rank dies, the survivors that give up and exit close their links after it, and a
    /// monitor polling later must still blame the rank that died.)
    pub fn first_down(&self) -> Option<(usize, LinkDown)> {
        let st = lock(&self.state);
        let peer = st.first_down?;
        st.down.get(peer).cloned().flatten().map(|d| (peer, d))
    }

    /// The first peer that left after its goodbye, and when.
    pub fn first_left(&self) -> Option<(usize, Instant)> {
        lock(&self.state).first_left
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
            st = wait_timeout(&self.cv, st, left);
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
            st = wait_timeout(&self.cv, st, left);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_down_is_the_first_in_time_not_the_lowest_rank() {
        let m = Mailbox::new(4);
        assert!(m.first_down().is_none());
        m.set_down(2, LinkDown::Closed);
        m.set_down(1, LinkDown::Malformed("x".into()));
        m.set_down(2, LinkDown::Malformed("later".into()));
        let (peer, why) = m.first_down().unwrap();
        assert_eq!(peer, 2);
        assert!(matches!(why, LinkDown::Closed), "{why:?}");
        assert!(matches!(m.down(1), Some(LinkDown::Malformed(_))));
    }

    #[test]
    fn a_peer_that_left_is_not_blamed_but_its_receives_fail() {
        let m = Mailbox::new(3);
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
