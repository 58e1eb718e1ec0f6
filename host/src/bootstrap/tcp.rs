//! [`TcpBootstrap`]: set-up (listen, join at the root, build the mesh) and the operations over
//! the mesh (tagged send/receive, barrier, all-gather, broadcast).

use std::collections::HashMap;
use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::mailbox::{LinkDown, Mailbox, RecvFail};
use super::net::{self, Acceptor, Ctx, Handshake, Pending, read_control, reject, reject_for};
use super::root::{RootParams, RootService};
use super::wire::{
    self, Abort, AbortCode, Accept, DataHeader, Join, Kind, PeerHello, Reject, RejectCode, Table,
};
use super::{Bootstrap, BootstrapConfig, Peer, RootListener, UniqueId, WATCH_SLICE, Watch};
use crate::error::{Error, Result};
use crate::socket::{IoFail, deadline_in, later, remaining, write_full};
use crate::sync::lock;

/// Longest a dropped bootstrap waits for its peers to acknowledge the close.
const MAX_LINGER: Duration = Duration::from_secs(2);
/// Payloads up to this size are sent in one write together with their header.
const COALESCE_BYTES: usize = 64 << 10;
/// Largest buffer a reader reserves before the bytes have actually arrived.
const PREALLOC_BYTES: usize = 16 << 20;

// Collective tags: operation (8 bits) | round (8 bits) | sequence number (48 bits).
const OP_BARRIER: u64 = 1;
const OP_ALL_GATHER: u64 = 2;
const OP_BROADCAST: u64 = 3;
const SEQ_MASK: u64 = (1 << 48) - 1;

fn coll_tag(op: u64, round: u64, seq: u64) -> u64 {
    (op << 56) | ((round & 0xff) << 48) | (seq & SEQ_MASK)
}

/// Which ranks share a node (same host hash), in rank order.
#[derive(Debug, Clone)]
struct NodeMap {
    node_of: Vec<usize>,
    local_rank: Vec<usize>,
    members: Vec<Vec<usize>>,
}

impl NodeMap {
    fn new(host_hashes: &[u64]) -> Self {
        let mut index: HashMap<u64, usize> = HashMap::new();
        let mut map = NodeMap {
            node_of: Vec::new(),
            local_rank: Vec::new(),
            members: Vec::new(),
        };
        for (rank, h) in host_hashes.iter().enumerate() {
            let node = *index.entry(*h).or_insert_with(|| {
                map.members.push(Vec::new());
                map.members.len() - 1
            });
            map.local_rank.push(map.members[node].len());
            map.members[node].push(rank);
            map.node_of.push(node);
        }
        map
    }
}

/// One mesh connection: a writer (locked per frame), a handle for shutting the socket down, and
/// the reader thread feeding the mailbox.
struct Link {
    writer: Mutex<Writer>,
    ctl: TcpStream,
    reader: Option<JoinHandle<()>>,
}

struct Writer {
    stream: TcpStream,
    /// Set when a send failed part-way: the byte stream is no longer framed, so the link is cut.
    broken: Option<String>,
}

impl Link {
    fn start(
        me: usize,
        peer: usize,
        addr: Option<SocketAddr>,
        stream: TcpStream,
        mailbox: Arc<Mailbox>,
    ) -> Result<Self> {
        let p = Peer {
            rank: Some(peer),
            addr,
        };
        let io = |source| Error::BootstrapIo {
            rank: me,
            peer: p,
            op: "prepare the connection",
            source,
        };
        stream.set_read_timeout(None).map_err(io)?;
        stream.set_write_timeout(None).map_err(io)?;
        stream.set_nodelay(true).map_err(io)?;
        let rd = stream.try_clone().map_err(io)?;
        let ctl = stream.try_clone().map_err(io)?;
        let reader = thread::Builder::new()
            .name(format!("bs{me}-rx{peer}"))
            .spawn(move || read_loop(peer, rd, &mailbox))
            .map_err(|source| Error::BootstrapSpawn {
                rank: me,
                what: "connection reader thread",
                source,
            })?;
        Ok(Self {
            writer: Mutex::new(Writer {
                stream,
                broken: None,
            }),
            ctl,
            reader: Some(reader),
        })
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        // Wakes the reader (a blocked read returns 0) and closes both directions.
        let _ = self.ctl.shutdown(Shutdown::Both);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

fn down_from(e: &io::Error) -> LinkDown {
    use io::ErrorKind as K;
    match e.kind() {
        K::ConnectionReset
        | K::ConnectionAborted
        | K::BrokenPipe
        | K::UnexpectedEof
        | K::NotConnected => LinkDown::Closed,
        k => LinkDown::Io(k, e.to_string()),
    }
}

/// Fills `buf`; `Ok(false)` on a clean EOF before the first byte.
fn read_frame_header(stream: &TcpStream, buf: &mut [u8]) -> Result<bool, LinkDown> {
    let mut filled = 0;
    while filled < buf.len() {
        match (&*stream).read(&mut buf[filled..]) {
            Ok(0) if filled == 0 => return Ok(false),
            Ok(0) => return Err(LinkDown::Closed),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(down_from(&e)),
        }
    }
    Ok(true)
}

/// The reader thread of one connection: frames into the mailbox until EOF or an error, then
/// records why and closes the socket (which also answers a peer's closing FIN, see
/// [`TcpBootstrap`]'s `Drop`). A connection that ends after the peer's goodbye is recorded as
/// [`LinkDown::Left`], however it ends (a reset included), unless a frame was malformed.
fn read_loop(peer: usize, stream: TcpStream, mailbox: &Mailbox) {
    let mut said_goodbye = false;
    let why = loop {
        let mut h = [0u8; wire::DATA_HEADER_LEN];
        match read_frame_header(&stream, &mut h) {
            Ok(true) => {}
            Ok(false) => break LinkDown::Closed,
            Err(d) => break d,
        }
        let header = match DataHeader::decode(&h) {
            Ok(h) => h,
            Err(reason) => break LinkDown::Malformed(reason),
        };
        // At most MAX_DATA_LEN (1 GiB), checked by decode.
        let len = usize::try_from(header.len).unwrap_or(usize::MAX);
        let mut payload = Vec::new();
        if payload.try_reserve_exact(len.min(PREALLOC_BYTES)).is_err() {
            break LinkDown::Malformed(format!("cannot allocate a {len}-byte frame"));
        }
        match (&stream).take(header.len).read_to_end(&mut payload) {
            Ok(_) if header.channel == wire::CHANNEL_GOODBYE => said_goodbye = true,
            Ok(n) if n == len => mailbox.push(peer, header.channel, header.tag, payload),
            Ok(_) => break LinkDown::Closed,
            Err(e) => break down_from(&e),
        }
    };
    if let LinkDown::Malformed(reason) = &why {
        tracing::warn!(
            "bootstrap: rank {peer} sent a malformed frame ({reason}); closing its connection"
        );
    }
    let why = match why {
        LinkDown::Closed | LinkDown::Io(..) if said_goodbye => LinkDown::Left,
        other => other,
    };
    mailbox.set_down(peer, why);
    let _ = stream.shutdown(Shutdown::Both);
}

/// A mesh connection that passed its handshake on this rank's listener.
struct Incoming {
    from: usize,
    stream: TcpStream,
}

/// Handshake of this rank's listener: only higher ranks of this session connect here.
struct PeerHandshake {
    magic: u64,
    me: usize,
    size: usize,
    timeout: Duration,
    claimed: Mutex<Vec<bool>>,
    tx: Sender<Incoming>,
}

impl PeerHandshake {
    fn refuse(&self, stream: &TcpStream, addr: SocketAddr, code: RejectCode, why: &str) {
        tracing::warn!(
            "bootstrap rank {}: refused the connection from {addr}: {why}",
            self.me
        );
        reject(stream, code, why);
    }
}

impl Handshake for PeerHandshake {
    fn handle(&self, stream: TcpStream, addr: SocketAddr, pending: Pending) {
        let deadline = deadline_in(self.timeout);
        let _ = stream.set_nodelay(true);
        let body = match read_control(
            &stream,
            deadline,
            &[(Kind::PeerHello, wire::PEER_HELLO_BODY_LEN)],
        ) {
            Ok((_, body)) => body,
            Err(f) => {
                let (code, why) = reject_for(&f);
                return self.refuse(&stream, addr, code, &why);
            }
        };
        let hello = match PeerHello::decode(&body) {
            Ok(h) => h,
            Err(why) => return self.refuse(&stream, addr, RejectCode::Malformed, &why),
        };
        if hello.magic != self.magic {
            return self.refuse(
                &stream,
                addr,
                RejectCode::BadMagic,
                "wrong session magic (a rank of another job?)",
            );
        }
        if hello.size != self.size || hello.to != self.me {
            let why = format!(
                "hello for rank {} of {}, this is rank {} of {}",
                hello.to, hello.size, self.me, self.size
            );
            return self.refuse(&stream, addr, RejectCode::Mismatch, &why);
        }
        if hello.from <= self.me || hello.from >= self.size {
            let why = format!(
                "rank {} must not connect to rank {} (higher ranks connect to lower ones)",
                hello.from, self.me
            );
            return self.refuse(&stream, addr, RejectCode::Unexpected, &why);
        }
        let fresh = lock(&self.claimed)
            .get_mut(hello.from)
            .is_some_and(|c| !std::mem::replace(c, true));
        if !fresh {
            let why = format!("rank {} is already connected", hello.from);
            return self.refuse(&stream, addr, RejectCode::Duplicate, &why);
        }
        if let Err(f) = write_full(
            &stream,
            &Accept {
                magic: self.magic,
                rank: self.me,
            }
            .encode(),
            deadline,
        ) {
            tracing::warn!(
                "bootstrap rank {}: accepting rank {} failed: {f:?}",
                self.me,
                hello.from
            );
            return;
        }
        if pending.release() {
            let _ = self.tx.send(Incoming {
                from: hello.from,
                stream,
            });
        }
    }
}

/// TCP bootstrap: every rank listens, joins at the root (rank 0), learns every rank's address,
/// and keeps one connection per pair of ranks for tagged messages and small collectives.
/// See the [module docs](super) for the protocol, threads and failure model.
pub struct TcpBootstrap {
    rank: usize,
    size: usize,
    addrs: Vec<SocketAddr>,
    nodes: NodeMap,
    op_timeout: Duration,
    mailbox: Arc<Mailbox>,
    links: Vec<Option<Link>>,
    coll_seq: AtomicU64,
    /// Whether `Drop` says goodbye (cleared by [`Bootstrap::forgo_goodbye`]).
    goodbye: AtomicBool,
}

impl std::fmt::Debug for TcpBootstrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpBootstrap")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("local_rank", &self.local_rank())
            .field("nodes", &self.nodes.members.len())
            .finish_non_exhaustive()
    }
}

impl TcpBootstrap {
    /// Sets up the bootstrap (collective: every rank calls it). Rank 0 binds the root address
    /// itself; to avoid a race for the port, bind it early with [`UniqueId::bind`] and use
    /// [`init_with_root_listener`](Self::init_with_root_listener).
    pub fn init(config: BootstrapConfig) -> Result<Self> {
        Self::start(config, None)
    }

    /// [`init`](Self::init) for rank 0 with the listener from [`UniqueId::bind`].
    pub fn init_with_root_listener(
        config: BootstrapConfig,
        listener: RootListener,
    ) -> Result<Self> {
        Self::start(config, Some(listener))
    }

    fn start(config: BootstrapConfig, root_listener: Option<RootListener>) -> Result<Self> {
        config.validate()?;
        let id = config.root.unique_id()?;
        let me = config.rank;
        let deadline = deadline_in(config.timeout);
        if config.size == 1 {
            return Ok(Self::solo(&config));
        }
        if me != 0 && root_listener.is_some() {
            return Err(Error::BootstrapConfig(format!(
                "rank {me} was given the root listener; only rank 0 serves the root"
            )));
        }
        let root = match root_listener {
            Some(l) => {
                let bound = l.local_addr().map_err(|source| Error::BootstrapListen {
                    rank: 0,
                    addr: id.root(),
                    source,
                })?;
                if bound != id.root() {
                    return Err(Error::BootstrapConfig(format!(
                        "the root listener is bound to {bound}, but the root address is {}",
                        id.root()
                    )));
                }
                Some(l.into_inner())
            }
            None if me == 0 => Some(net::bind(0, id.root())?),
            None => None,
        };
        let root = match root {
            Some(listener) => {
                let params = RootParams {
                    magic: id.magic(),
                    size: config.size,
                    deadline,
                    handshake_timeout: config.handshake_timeout,
                };
                Some(RootService::start(listener, params)?)
            }
            None => None,
        };
        let mut joined = false;
        let result = Self::set_up(&config, id, deadline, &mut joined);
        if let Some(root) = root {
            root.finish(joined);
        }
        match &result {
            Ok(bs) => tracing::debug!(
                "bootstrap rank {me}/{}: ready ({} node(s))",
                bs.size,
                bs.nodes.members.len()
            ),
            Err(e) => tracing::warn!("bootstrap rank {me}: set-up failed: {e}"),
        }
        result
    }

    fn solo(config: &BootstrapConfig) -> Self {
        Self {
            rank: 0,
            size: 1,
            addrs: Vec::new(),
            nodes: NodeMap::new(&[0]),
            op_timeout: config.op_timeout,
            mailbox: Arc::new(Mailbox::new(1)),
            links: Vec::new(),
            coll_seq: AtomicU64::new(0),
            goodbye: AtomicBool::new(true),
        }
    }

    fn set_up(
        cfg: &BootstrapConfig,
        id: UniqueId,
        deadline: Instant,
        joined: &mut bool,
    ) -> Result<Self> {
        let (me, size) = (cfg.rank, cfg.size);

        // 1. This rank's listener, serving handshakes from the start.
        let want = match cfg.listen {
            Some(a) => a,
            None => SocketAddr::new(net::advertised_ip(cfg.ifname.as_deref(), id.root())?, 0),
        };
        let listener = net::bind(me, want)?;
        let mut listen = listener
            .local_addr()
            .map_err(|source| Error::BootstrapListen {
                rank: me,
                addr: want,
                source,
            })?;
        if listen.ip().is_unspecified() {
            listen.set_ip(net::advertised_ip(cfg.ifname.as_deref(), id.root())?);
        }
        let (tx, rx) = mpsc::channel();
        let handshake = PeerHandshake {
            magic: id.magic(),
            me,
            size,
            timeout: cfg.handshake_timeout,
            claimed: Mutex::new(vec![false; size]),
            tx,
        };
        let mut acceptor = Acceptor::start(me, listener, "mesh", Arc::new(handshake))?;

        // 2. Join at the root; learn every rank's address and host.
        let host_hash = net::host_hash(cfg.host_id.as_deref());
        let table = join_root(cfg, id, listen, host_hash, deadline, joined)?;
        let hashes: Vec<u64> = table.entries.iter().map(|e| e.host_hash).collect();
        let nodes = NodeMap::new(&hashes);
        if let Some(l) = cfg.launcher_local_rank
            && l != nodes.local_rank[me]
        {
            tracing::warn!(
                "bootstrap rank {me}: the launcher says local rank {l}, host identities say {} (set MSCCLPP_HOSTID to group differently)",
                nodes.local_rank[me]
            );
        }
        let addrs: Vec<SocketAddr> = table.entries.iter().map(|e| e.listen).collect();

        // 3. Mesh: connect to every lower rank; take connections from every higher rank.
        let mut streams: Vec<Option<TcpStream>> = (0..size).map(|_| None).collect();
        for (j, slot) in streams.iter_mut().enumerate().take(me) {
            *slot = Some(connect_peer(cfg, id, j, addrs[j], deadline)?);
        }
        let mut waiting = size - 1 - me;
        while waiting > 0 {
            let timed_out = match remaining(deadline) {
                None => true,
                Some(left) => match rx.recv_timeout(left) {
                    Ok(Incoming { from, stream }) => {
                        if let Some(slot) = streams.get_mut(from).filter(|s| s.is_none()) {
                            *slot = Some(stream);
                            waiting -= 1;
                        }
                        false
                    }
                    Err(RecvTimeoutError::Timeout) => false,
                    Err(RecvTimeoutError::Disconnected) => true,
                },
            };
            if timed_out {
                let missing = (me + 1..size).filter(|&r| streams[r].is_none()).collect();
                return Err(Error::BootstrapMissingRanks {
                    rank: me,
                    missing,
                    op: "mesh set-up (waiting for higher ranks to connect)",
                    after: cfg.timeout,
                });
            }
        }
        acceptor.stop();

        // 4. A reader thread per connection; then a barrier, so that no rank returns before
        //    every rank is connected.
        let mut bs = TcpBootstrap {
            rank: me,
            size,
            addrs,
            nodes,
            op_timeout: cfg.op_timeout,
            mailbox: Arc::new(Mailbox::new(size)),
            links: Vec::with_capacity(size),
            coll_seq: AtomicU64::new(0),
            goodbye: AtomicBool::new(true),
        };
        for (p, s) in streams.into_iter().enumerate() {
            let link = match s {
                Some(s) => Some(Link::start(
                    me,
                    p,
                    bs.addrs.get(p).copied(),
                    s,
                    Arc::clone(&bs.mailbox),
                )?),
                None => None,
            };
            bs.links.push(link);
        }
        bs.barrier_until(deadline, cfg.timeout, "set-up barrier", None)?;
        Ok(bs)
    }

    /// Number of nodes.
    pub fn num_nodes(&self) -> usize {
        self.nodes.members.len()
    }

    /// The ranks on `node`, in rank order (empty if there is no such node).
    pub fn ranks_on_node(&self, node: usize) -> &[usize] {
        self.nodes.members.get(node).map_or(&[], Vec::as_slice)
    }

    /// The address `rank` listened on during set-up (diagnostics).
    pub fn peer_addr(&self, rank: usize) -> Option<SocketAddr> {
        self.addrs.get(rank).copied()
    }

    /// Changes the deadline of each later operation.
    pub fn set_op_timeout(&mut self, timeout: Duration) {
        self.op_timeout = timeout;
    }

    fn peer(&self, rank: usize) -> Peer {
        Peer {
            rank: Some(rank),
            addr: self.addrs.get(rank).copied(),
        }
    }

    fn ctx(&self, peer: usize, op: &'static str, timeout: Duration) -> Ctx {
        Ctx {
            rank: self.rank,
            peer: self.peer(peer),
            op,
            timeout,
        }
    }

    fn check_peer(&self, peer: usize) -> Result<()> {
        if peer < self.size {
            Ok(())
        } else {
            Err(Error::BootstrapInvalidPeer {
                rank: self.rank,
                peer,
                size: self.size,
            })
        }
    }

    fn send_frame(
        &self,
        peer: usize,
        channel: u32,
        tag: u64,
        data: &[u8],
        deadline: Instant,
        ctx: Ctx,
    ) -> Result<()> {
        self.check_peer(peer)?;
        if data.len() as u64 > wire::MAX_DATA_LEN {
            return Err(Error::BootstrapMessageTooLarge {
                rank: self.rank,
                len: data.len(),
                max: wire::MAX_DATA_LEN,
            });
        }
        if peer == self.rank {
            self.mailbox.push(peer, channel, tag, data.to_vec());
            return Ok(());
        }
        let Some(link) = self.links.get(peer).and_then(Option::as_ref) else {
            return Err(ctx.io(IoFail::Closed));
        };
        if let Some(down) = self.mailbox.down(peer) {
            return Err(down.to_error(&ctx));
        }
        let mut w = lock(&link.writer);
        if let Some(why) = &w.broken {
            let source = io::Error::new(
                io::ErrorKind::BrokenPipe,
                format!("the connection was cut after an earlier send failed: {why}"),
            );
            return Err(Error::BootstrapIo {
                rank: self.rank,
                peer: ctx.peer,
                op: ctx.op,
                source,
            });
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
            write_full(&w.stream, &frame, deadline)
        } else {
            write_full(&w.stream, &header, deadline)
                .and_then(|()| write_full(&w.stream, data, deadline))
        };
        if let Err(f) = sent {
            w.broken = Some(format!("{f:?}"));
            let _ = link.ctl.shutdown(Shutdown::Both);
            return Err(ctx.io(f));
        }
        Ok(())
    }

    /// The oldest frame of (peer, channel, tag) by `deadline`. With a `watch`, waits in slices
    /// of at most [`WATCH_SLICE`] and calls it after each empty one (a frame that has arrived is
    /// always taken first).
    fn recv_frame(
        &self,
        peer: usize,
        channel: u32,
        tag: u64,
        deadline: Instant,
        ctx: Ctx,
        watch: Option<Watch<'_>>,
    ) -> Result<Vec<u8>> {
        self.check_peer(peer)?;
        loop {
            let until = match watch {
                Some(_) => deadline.min(Instant::now() + WATCH_SLICE),
                None => deadline,
            };
            match self.mailbox.recv(peer, channel, tag, until) {
                Ok(m) => return Ok(m),
                Err(RecvFail::Timeout) if until < deadline => {
                    if let Some(w) = watch {
                        w()?;
                    }
                }
                Err(RecvFail::Timeout) => return Err(ctx.timeout_error()),
                Err(RecvFail::Down(d)) => return Err(d.to_error(&ctx)),
            }
        }
    }

    fn next_seq(&self) -> u64 {
        self.coll_seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Dissemination barrier: in round k, send to rank + 2^k and hear from rank − 2^k.
    fn barrier_until(
        &self,
        deadline: Instant,
        timeout: Duration,
        op: &'static str,
        watch: Option<Watch<'_>>,
    ) -> Result<()> {
        let (n, me) = (self.size, self.rank);
        let seq = self.next_seq();
        let (mut dist, mut round) = (1usize, 0u64);
        while dist < n {
            let tag = coll_tag(OP_BARRIER, round, seq);
            let (to, from) = ((me + dist) % n, (me + n - dist) % n);
            self.send_frame(
                to,
                wire::CHANNEL_COLLECTIVE,
                tag,
                &[],
                deadline,
                self.ctx(to, op, timeout),
            )?;
            let got = self.recv_frame(
                from,
                wire::CHANNEL_COLLECTIVE,
                tag,
                deadline,
                self.ctx(from, op, timeout),
                watch,
            )?;
            if !got.is_empty() {
                return Err(self.ctx(from, op, timeout).malformed(format!(
                    "{op}: a barrier message carries {} bytes",
                    got.len()
                )));
            }
            dist *= 2;
            round += 1;
        }
        Ok(())
    }

    fn all_gather_with(&self, data: &[u8], watch: Option<Watch<'_>>) -> Result<Vec<Vec<u8>>> {
        const OP: &str = "all_gather";
        let (n, me) = (self.size, self.rank);
        let deadline = deadline_in(self.op_timeout);
        let tag = coll_tag(OP_ALL_GATHER, 0, self.next_seq());
        for k in 1..n {
            let to = (me + k) % n;
            self.send_frame(
                to,
                wire::CHANNEL_COLLECTIVE,
                tag,
                data,
                deadline,
                self.ctx(to, OP, self.op_timeout),
            )?;
        }
        let mut out = vec![Vec::new(); n];
        out[me] = data.to_vec();
        for k in 1..n {
            let from = (me + n - k) % n;
            let ctx = self.ctx(from, OP, self.op_timeout);
            let got = self.recv_frame(from, wire::CHANNEL_COLLECTIVE, tag, deadline, ctx, watch)?;
            if got.len() != data.len() {
                return Err(ctx.malformed(format!(
                    "all_gather: rank {from} contributed {} bytes, this rank {}",
                    got.len(),
                    data.len()
                )));
            }
            out[from] = got;
        }
        Ok(out)
    }

    /// [`all_gather`](Bootstrap::all_gather) into one buffer of `size × data.len()` bytes.
    pub fn all_gather_flat(&self, data: &[u8]) -> Result<Vec<u8>> {
        Ok(self.all_gather(data)?.concat())
    }

    fn broadcast_with(
        &self,
        root: usize,
        data: &mut Vec<u8>,
        watch: Option<Watch<'_>>,
    ) -> Result<()> {
        const OP: &str = "broadcast";
        self.check_peer(root)?;
        let (n, me) = (self.size, self.rank);
        let deadline = deadline_in(self.op_timeout);
        let tag = coll_tag(OP_BROADCAST, 0, self.next_seq());
        if me == root {
            for k in 1..n {
                let to = (me + k) % n;
                self.send_frame(
                    to,
                    wire::CHANNEL_COLLECTIVE,
                    tag,
                    data,
                    deadline,
                    self.ctx(to, OP, self.op_timeout),
                )?;
            }
        } else {
            *data = self.recv_frame(
                root,
                wire::CHANNEL_COLLECTIVE,
                tag,
                deadline,
                self.ctx(root, OP, self.op_timeout),
                watch,
            )?;
        }
        Ok(())
    }
}

impl Drop for TcpBootstrap {
    /// Closes every connection gracefully without waiting on anyone for long: first our FIN
    /// (after everything already sent); each peer's reader answers with its own as soon as it
    /// reads ours, so our readers see EOF with nothing left unread (closing a socket with unread
    /// bytes would reset it and could discard what we sent last). After at most
    /// min(op deadline, 2 s) the sockets are shut down regardless and the reader threads joined.
    ///
    /// Unless a communicator on it failed ([`Bootstrap::forgo_goodbye`]) or the thread is
    /// panicking, a goodbye frame goes first on every connection: the peers then know that this
    /// rank finished rather than died, and do not abort their communicators for it (see
    /// [`Bootstrap::left_peer`]).
    fn drop(&mut self) {
        let peers: Vec<usize> = self
            .links
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_some())
            .map(|(p, _)| p)
            .collect();
        if self.goodbye.load(Ordering::Acquire) && !std::thread::panicking() {
            let deadline = deadline_in(self.op_timeout.min(MAX_LINGER));
            for &p in &peers {
                let ctx = self.ctx(p, "goodbye", MAX_LINGER);
                // Best effort: a peer already gone needs no goodbye.
                let _ = self.send_frame(p, wire::CHANNEL_GOODBYE, 0, &[], deadline, ctx);
            }
        }
        for l in self.links.iter().flatten() {
            let _ = l.ctl.shutdown(Shutdown::Write);
        }
        self.mailbox
            .wait_down(&peers, deadline_in(self.op_timeout.min(MAX_LINGER)));
        self.links.clear();
    }
}

impl Bootstrap for TcpBootstrap {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    /// This rank's index among the ranks of its node (ranks with the same host identity, in
    /// rank order).
    fn local_rank(&self) -> usize {
        self.nodes.local_rank.get(self.rank).copied().unwrap_or(0)
    }

    fn ranks_per_node(&self) -> usize {
        self.node_of(self.rank)
            .map_or(1, |n| self.nodes.members[n].len())
    }

    /// The node of `rank` (nodes are numbered in order of their lowest rank).
    fn node_of(&self, rank: usize) -> Option<usize> {
        self.nodes.node_of.get(rank).copied()
    }

    fn send(&self, peer: usize, tag: u64, data: &[u8]) -> Result<()> {
        let ctx = self.ctx(peer, "send", self.op_timeout);
        self.send_frame(
            peer,
            wire::CHANNEL_USER,
            tag,
            data,
            deadline_in(self.op_timeout),
            ctx,
        )
    }

    fn recv_watched(
        &self,
        peer: usize,
        tag: u64,
        timeout: Duration,
        watch: Watch<'_>,
    ) -> Result<Vec<u8>> {
        let ctx = self.ctx(peer, "recv", timeout);
        let deadline = deadline_in(timeout);
        self.recv_frame(peer, wire::CHANNEL_USER, tag, deadline, ctx, Some(watch))
    }

    fn barrier_watched(&self, watch: Watch<'_>) -> Result<()> {
        watch()?;
        let deadline = deadline_in(self.op_timeout);
        self.barrier_until(deadline, self.op_timeout, "barrier", Some(watch))
    }

    fn all_gather_watched(&self, data: &[u8], watch: Watch<'_>) -> Result<Vec<Vec<u8>>> {
        watch()?;
        self.all_gather_with(data, Some(watch))
    }

    fn broadcast_watched(&self, root: usize, data: &mut Vec<u8>, watch: Watch<'_>) -> Result<()> {
        watch()?;
        self.broadcast_with(root, data, Some(watch))
    }

    fn op_timeout(&self) -> Duration {
        self.op_timeout
    }

    fn left_peer(&self) -> Option<(usize, Duration)> {
        self.mailbox
            .first_left()
            .map(|(peer, at)| (peer, at.elapsed()))
    }
    fn forgo_goodbye(&self) {
        self.goodbye.store(false, Ordering::Release);
    }
    fn dead_peer(&self) -> Option<(usize, String)> {
        self.mailbox.first_down().map(|(peer, why)| {
            let reason = match why {
                super::mailbox::LinkDown::Closed => "closed its bootstrap connection".to_string(),
                // `first_down` never names a peer that left.
                super::mailbox::LinkDown::Left => "left after its goodbye".to_string(),
                super::mailbox::LinkDown::Io(kind, msg) => {
                    format!("bootstrap link failed: {kind:?} {msg}")
                }
                super::mailbox::LinkDown::Malformed(m) => format!("sent a malformed frame: {m}"),
            };
            (peer, reason)
        })
    }
}

/// Connects to the root, sends JOIN and waits for the table (or the root's verdict).
fn join_root(
    cfg: &BootstrapConfig,
    id: UniqueId,
    listen: SocketAddr,
    host_hash: u64,
    deadline: Instant,
    joined: &mut bool,
) -> Result<Table> {
    let (me, size) = (cfg.rank, cfg.size);
    let root = Peer {
        rank: Some(0),
        addr: Some(id.root()),
    };
    let ctx = Ctx {
        rank: me,
        peer: root,
        op: "connect to the root",
        timeout: cfg.timeout,
    };
    let stream = net::connect_retry(&ctx, id.root(), deadline)?;
    let _ = stream.set_nodelay(true);

    let ctx = Ctx {
        op: "join at the root",
        ..ctx
    };
    let deadline_ms =
        remaining(deadline).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let join = Join {
        magic: id.magic(),
        rank: me,
        size,
        listen,
        host_hash,
        deadline_ms,
    };
    write_full(&stream, &join.encode(), deadline).map_err(|f| ctx.io(f))?;
    *joined = true;

    // The root answers by the earliest deadline among the ranks that joined (ours included), so
    // a little grace lets its verdict arrive before we give up on our own.
    let ctx = Ctx {
        op: "wait for the address table from the root",
        ..ctx
    };
    let grace = (cfg.timeout / 2).min(Duration::from_secs(2));
    let expected = [
        (Kind::Table, wire::table_body_len(size)),
        (Kind::Abort, wire::max_abort_body(size)),
        (Kind::Reject, wire::MAX_REJECT_BODY),
    ];
    let (kind, body) =
        read_control(&stream, later(deadline, grace), &expected).map_err(|f| ctx.control(f))?;
    match kind {
        Kind::Table => {
            let table = Table::decode(&body, size).map_err(|r| ctx.malformed(r))?;
            if table.magic != id.magic() {
                return Err(ctx.bad_magic("session magic in the address table"));
            }
            if table.entries[me].listen != listen {
                let got = table.entries[me].listen;
                return Err(ctx.malformed(format!(
                    "the table lists {got} for this rank, which listens at {listen}"
                )));
            }
            Ok(table)
        }
        Kind::Abort => {
            let abort = Abort::decode(&body, size).map_err(|r| ctx.malformed(r))?;
            Err(match (abort.code, abort.ranks.first()) {
                (AbortCode::RankLeft, Some(&r)) => Error::BootstrapPeerClosed {
                    rank: me,
                    peer: Peer {
                        rank: Some(r),
                        addr: None,
                    },
                    op: "set-up: the root saw it leave before every rank joined",
                },
                (AbortCode::RanksMissing, _) => Error::BootstrapMissingRanks {
                    rank: me,
                    missing: abort.ranks,
                    op: "set-up (joining at the root)",
                    after: cfg.timeout,
                },
                _ => Error::BootstrapRejected {
                    rank: me,
                    peer: root,
                    reason: "the root stopped before set-up completed".into(),
                },
            })
        }
        _ => Err(ctx.rejected(Reject::decode(&body).map_err(|r| ctx.malformed(r))?)),
    }
}

/// Opens the mesh connection to lower rank `j` and completes its handshake.
fn connect_peer(
    cfg: &BootstrapConfig,
    id: UniqueId,
    j: usize,
    addr: SocketAddr,
    deadline: Instant,
) -> Result<TcpStream> {
    let ctx = Ctx {
        rank: cfg.rank,
        peer: Peer {
            rank: Some(j),
            addr: Some(addr),
        },
        op: "connect to a peer",
        timeout: cfg.timeout,
    };
    let left = remaining(deadline).ok_or_else(|| ctx.timeout_error())?;
    let stream = TcpStream::connect_timeout(&addr, left).map_err(|e| ctx.connect(e))?;
    let _ = stream.set_nodelay(true);
    let ctx = Ctx {
        op: "mesh handshake",
        ..ctx
    };
    let hello = PeerHello {
        magic: id.magic(),
        from: cfg.rank,
        size: cfg.size,
        to: j,
    };
    write_full(&stream, &hello.encode(), deadline).map_err(|f| ctx.io(f))?;
    let expected = [
        (Kind::Accept, wire::ACCEPT_BODY_LEN),
        (Kind::Reject, wire::MAX_REJECT_BODY),
    ];
    let (kind, body) = read_control(&stream, deadline, &expected).map_err(|f| ctx.control(f))?;
    match kind {
        Kind::Accept => {
            let a = Accept::decode(&body).map_err(|r| ctx.malformed(r))?;
            if a.magic != id.magic() {
                return Err(ctx.bad_magic("session magic in ACCEPT"));
            }
            if a.rank != j {
                return Err(
                    ctx.malformed(format!("rank {j}'s address answered as rank {}", a.rank))
                );
            }
            Ok(stream)
        }
        _ => Err(ctx.rejected(Reject::decode(&body).map_err(|r| ctx.malformed(r))?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_map_groups_by_hash_in_rank_order() {
        let m = NodeMap::new(&[7, 9, 7, 9, 5]);
        assert_eq!(m.node_of, vec![0, 1, 0, 1, 2]);
        assert_eq!(m.local_rank, vec![0, 0, 1, 1, 0]);
        assert_eq!(m.members, vec![vec![0, 2], vec![1, 3], vec![4]]);
    }

    #[test]
    fn collective_tags_do_not_collide() {
        assert_ne!(coll_tag(OP_BARRIER, 1, 5), coll_tag(OP_BARRIER, 0, 5));
        assert_ne!(coll_tag(OP_BARRIER, 0, 5), coll_tag(OP_ALL_GATHER, 0, 5));
        assert_ne!(coll_tag(OP_BROADCAST, 0, 5), coll_tag(OP_BROADCAST, 0, 6));
    }
}
