//! Set-up of a [`TcpBootstrap`](super::TcpBootstrap)'s mesh: joining at the root (`JOIN`, then
//! `TABLE` or the root's verdict), connecting to every lower rank (`PEER_HELLO`, then `ACCEPT`
//! or `REJECT`), and the handshake this rank's listener runs for every higher rank.

use std::net::{SocketAddr, TcpStream};
use std::sync::Mutex;
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use super::super::net::{self, Ctx, Handshake, Pending, read_control, reject, reject_for};
use super::super::wire::{
    self, Abort, AbortCode, Accept, Join, Kind, PeerHello, Reject, RejectCode, Table,
};
use super::{BootstrapConfig, Peer, UniqueId};
use crate::error::{Error, Result};
use crate::socket::{deadline_in, later, remaining, write_full};
use crate::sync::lock;

/// A mesh connection that passed its handshake on this rank's listener.
pub(super) struct Incoming {
    pub(super) from: usize,
    pub(super) stream: TcpStream,
}

/// Handshake of this rank's listener: only higher ranks of this session connect here.
pub(super) struct PeerHandshake {
    pub(super) magic: u64,
    pub(super) me: usize,
    pub(super) size: usize,
    pub(super) timeout: Duration,
    pub(super) claimed: Mutex<Vec<bool>>,
    pub(super) tx: Sender<Incoming>,
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

/// Connects to the root, sends JOIN and waits for the table (or the root's verdict).
pub(super) fn join_root(
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
pub(super) fn connect_peer(
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
