//! Helpers of the bootstrap tests: a rank's side of the authenticated handshakes done by hand
//! (to join like a real rank, or to forge a proof), connecting with retries, child processes
//! (this test binary run again on one of its ignored entry tests), and a flood of strangers'
//! connections.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
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

/// A child process whose standard output and error are collected (stdout line by line too).
pub struct ChildProc {
    pub name: String,
    pub child: Child,
    lines: Receiver<String>,
    output: Arc<Mutex<String>>,
}

impl ChildProc {
    /// Starts `cmd` (its stdout and stderr must be piped).
    pub fn spawn(mut cmd: Command, name: String) -> Self {
        let mut child = cmd.spawn().unwrap();
        let (tx, lines) = mpsc::channel();
        let output = Arc::new(Mutex::new(String::new()));
        let out = child.stdout.take().unwrap();
        let err = child.stderr.take().unwrap();
        let (o1, o2) = (Arc::clone(&output), Arc::clone(&output));
        thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                o1.lock().unwrap().push_str(&format!("{line}\n"));
                let _ = tx.send(line);
            }
        });
        thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                o2.lock().unwrap().push_str(&format!("[stderr] {line}\n"));
            }
        });
        Self {
            name,
            child,
            lines,
            output,
        }
    }

    /// Everything it has written so far.
    pub fn output(&self) -> String {
        self.output.lock().unwrap().clone()
    }
}

impl ChildProc {
    /// The first output line containing `marker`, from the marker on (the test harness may
    /// print its own text before it on the same line).
    pub fn wait_line(&self, marker: &str) -> String {
        let until = Instant::now() + Duration::from_secs(20);
        while let Some(left) = until.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(l) if l.contains(marker) => return l[l.find(marker).unwrap_or(0)..].to_string(),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        panic!(
            "{}: no {marker:?} line; output:\n{}",
            self.name,
            self.output.lock().unwrap()
        );
    }

    /// Waits for a clean exit, killing the child if it takes longer than 30 s.
    pub fn finish(mut self) -> String {
        let until = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            if Instant::now() > until {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "{} hung; output:\n{}",
                    self.name,
                    self.output.lock().unwrap()
                );
            }
            thread::sleep(Duration::from_millis(20));
        };
        thread::sleep(Duration::from_millis(50)); // let the pipe readers finish
        let out = self.output.lock().unwrap().clone();
        assert!(
            status.success(),
            "{} exited with {status}; output:\n{out}",
            self.name
        );
        out
    }
}

/// Strangers' connections: `n` to `addr`, each reopened as soon as it is closed; one in eight
/// sends garbage (refused at once), the others stay silent (until the handshake deadline, or
/// until shed).
pub struct Flood {
    stop: Arc<AtomicBool>,
    held: Vec<Arc<AtomicUsize>>,
    peak: Arc<AtomicUsize>,
    cut: Arc<AtomicUsize>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Flood {
    pub fn start(targets: &[(SocketAddr, usize)]) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let held: Vec<_> = targets
            .iter()
            .map(|_| Arc::new(AtomicUsize::new(0)))
            .collect();
        let peak = Arc::new(AtomicUsize::new(0));
        let cut = Arc::new(AtomicUsize::new(0));
        let threads = targets
            .iter()
            .zip(&held)
            .map(|(&(addr, n), mine)| {
                let (stop, mine, all) = (Arc::clone(&stop), Arc::clone(mine), held.clone());
                let (peak, cut) = (Arc::clone(&peak), Arc::clone(&cut));
                thread::spawn(move || flood(addr, n, &stop, (&mine, &all, &peak), &cut))
            })
            .collect();
        Self {
            stop,
            held,
            peak,
            cut,
            threads,
        }
    }

    pub fn held(&self) -> usize {
        self.held.iter().map(|h| h.load(Ordering::Relaxed)).sum()
    }

    /// Stops; (most held at once, closed by the listeners).
    pub fn stop(self) -> (usize, usize) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        (
            self.peak.load(Ordering::Relaxed),
            self.cut.load(Ordering::Relaxed),
        )
    }
}

fn flood(
    addr: SocketAddr,
    n: usize,
    stop: &AtomicBool,
    (mine, all, peak): (&AtomicUsize, &[Arc<AtomicUsize>], &AtomicUsize),
    cut: &AtomicUsize,
) {
    let mut conns: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
    let mut made = 0usize;
    let mut buf = [0u8; 512];
    let until = Instant::now() + Duration::from_secs(120);
    while !stop.load(Ordering::Relaxed) && Instant::now() < until {
        for slot in conns.iter_mut().filter(|c| c.is_none()) {
            let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(100)) else {
                break; // its queue is full: later
            };
            made += 1;
            if made.is_multiple_of(8) {
                let _ = s.write_all(&[0xEE; 64]);
            }
            s.set_nonblocking(true).unwrap();
            *slot = Some(s);
        }
        mine.store(conns.iter().flatten().count(), Ordering::Relaxed);
        peak.fetch_max(
            all.iter().map(|h| h.load(Ordering::Relaxed)).sum(),
            Ordering::Relaxed,
        );
        let mut fds: Vec<libc::pollfd> = conns
            .iter()
            .flatten()
            .map(|s| libc::pollfd {
                fd: s.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a valid, writable slice of pollfd for the whole call.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 20) };
        let ready: Vec<i32> = fds
            .iter()
            .filter(|f| f.revents != 0)
            .map(|f| f.fd)
            .collect();
        for slot in conns.iter_mut() {
            let closed = match slot {
                Some(s) if ready.contains(&s.as_raw_fd()) => loop {
                    match s.read(&mut buf) {
                        Ok(0) => break true,
                        Ok(_) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
                        Err(_) => break true,
                    }
                },
                _ => false,
            };
            if closed {
                *slot = None;
                cut.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
