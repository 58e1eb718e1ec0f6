//! Helpers of the bootstrap tests: a rank's side of the authenticated handshakes done by hand
//! (to join like a real rank, or to forge a proof), and connecting with retries.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use mscclpp_host::auth::{self, Nonce, Role, Secret};
use mscclpp_host::bootstrap::UniqueId;
use mscclpp_host::bootstrap::wire::{
    self, Challenge, ControlHeader, Hello, Join, Kind, Proof, Purpose,
};

/// Connects to `addr`, retrying (attempts of at most 2 s) for up to 30 s while it is refused
/// or slow (a loaded machine).
pub fn connect_retry(addr: SocketAddr) -> TcpStream {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Ok(s) => return s,
            Err(e) if Instant::now() < until => {
                let _ = e;
                thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("cannot connect to {addr}: {e}"),
        }
    }
}

/// Connects to `addr` while `alive()` holds, retrying (attempts of at most 2 s) for up to
/// 30 s while it is refused or slow; `None` once `alive()` is false (the listener's owner is
/// gone, so a refusal is expected). Panics only after 30 s of refusals while alive.
pub fn connect_while(addr: SocketAddr, alive: impl Fn() -> bool) -> Option<TcpStream> {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        if !alive() {
            return None;
        }
        match TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
            Ok(s) => return Some(s),
            Err(_) if Instant::now() < until => thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("cannot connect to {addr}: {e}"),
        }
    }
}

/// A HELLO of this session.
pub fn hello(id: &UniqueId, purpose: Purpose, from: usize, to: usize, size: usize) -> Hello {
    Hello {
        magic: id.magic(),
        purpose,
        from,
        to,
        size,
        nonce: Nonce::random().unwrap(),
    }
}

/// Reads one control frame (blocking, bounded).
pub fn read_frame(s: &mut TcpStream) -> (u32, Vec<u8>) {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut h = [0u8; wire::CONTROL_HEADER_LEN];
    s.read_exact(&mut h).unwrap();
    let h = ControlHeader::decode(&h).unwrap();
    let mut body = vec![0u8; h.body_len as usize];
    s.read_exact(&mut body).unwrap();
    (h.kind, body)
}

/// Sends `hello` and returns the acceptor's challenge, checked against `secret`.
pub fn challenged(s: &mut TcpStream, hello: &Hello, secret: &Secret) -> Challenge {
    s.write_all(&hello.encode()).unwrap();
    let (kind, body) = read_frame(s);
    assert_eq!(kind, Kind::Challenge.code(), "expected a CHALLENGE");
    let c = Challenge::decode(&body).unwrap();
    assert!(
        auth::verify(
            secret,
            Role::Acceptor,
            &wire::acceptor_context(&hello.body(), &c.job),
            &hello.nonce,
            &c.nonce,
            &c.tag
        ),
        "the acceptor's proof does not check out"
    );
    c
}

/// Does what a rank does at the root, by hand: a complete, authenticated JOIN.
pub fn join_by_hand(id: &UniqueId, rank: usize, size: usize, listen: SocketAddr) -> TcpStream {
    let mut s = connect_retry(id.root());
    let h = hello(id, Purpose::Join, rank, wire::ROOT, size);
    let c = challenged(&mut s, &h, id.secret());
    let mut join = Join {
        tag: [0; 32],
        listen,
        host_hash: 0,
        deadline_ms: 20_000,
    };
    join.tag = auth::tag(
        id.secret(),
        Role::Connector,
        &wire::connector_context(&h.body(), &c.job, &join.request()),
        &h.nonce,
        &c.nonce,
    );
    s.write_all(&join.encode()).unwrap();
    s
}

/// A HELLO, then a JOIN or PROOF whose tag was made with the wrong secret.
pub fn forged(
    addr: SocketAddr,
    id: &UniqueId,
    purpose: Purpose,
    ranks: (usize, usize, usize),
) -> TcpStream {
    forge(connect_retry(addr), id, purpose, ranks)
}

/// [`forged`] on a connection made earlier (it may wait in the listener's backlog).
pub fn forge(
    mut s: TcpStream,
    id: &UniqueId,
    purpose: Purpose,
    (from, to, size): (usize, usize, usize),
) -> TcpStream {
    let h = hello(id, purpose, from, to, size);
    let c = challenged(&mut s, &h, id.secret());
    let wrong = Secret::random().unwrap();
    let frame = match purpose {
        Purpose::Join => {
            let mut j = Join {
                tag: [0; 32],
                listen: "127.0.0.1:9".parse().unwrap(),
                host_hash: 0,
                deadline_ms: 1000,
            };
            j.tag = auth::tag(
                &wrong,
                Role::Connector,
                &wire::connector_context(&h.body(), &c.job, &j.request()),
                &h.nonce,
                &c.nonce,
            );
            j.encode()
        }
        _ => Proof {
            tag: auth::tag(
                &wrong,
                Role::Connector,
                &wire::connector_context(&h.body(), &c.job, &[]),
                &h.nonce,
                &c.nonce,
            ),
        }
        .encode(),
    };
    s.write_all(&frame).unwrap();
    s
}
