//! The connector's side of the bootstrap's handshakes, on the caller's thread with blocking,
//! deadline-bounded I/O: joining at the root (`HELLO`, `CHALLENGE`, `JOIN`, then `TABLE` or the
//! root's verdict) and opening a link to another rank (`HELLO`, `CHALLENGE`, `PROOF`, then
//! `ACCEPT`). Both check the acceptor's tag before they send their own ([`crate::auth`]).

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::super::net::{self, Ctx, read_control};
use super::super::wire::{
    self, Abort, AbortCode, Accept, Challenge, Hello, Join, Kind, Proof, Purpose, Reject, Table,
    acceptor_context, connector_context,
};
use super::{BootstrapConfig, Peer, UniqueId};
use crate::auth::{self, Nonce, Role, TAG_LEN};
use crate::error::{Error, Result};
use crate::socket::{later, remaining, write_full};

/// Sends `hello`, checks the acceptor's `CHALLENGE`, and returns this side's tag over
/// `request` (what the next frame carries).
fn prove(
    ctx: &Ctx,
    stream: &TcpStream,
    hello: &Hello,
    id: &UniqueId,
    request: &[u8],
    deadline: Instant,
) -> Result<[u8; TAG_LEN]> {
    write_full(stream, &hello.encode(), deadline).map_err(|f| ctx.io(f))?;
    let expected = [
        (Kind::Challenge, wire::CHALLENGE_BODY_LEN),
        (Kind::Reject, wire::MAX_REJECT_BODY),
    ];
    let (kind, body) = read_control(stream, deadline, &expected).map_err(|f| ctx.control(f))?;
    if kind != Kind::Challenge {
        return Err(ctx.rejected(Reject::decode(&body).map_err(|r| ctx.malformed(r))?));
    }
    let c = Challenge::decode(&body).map_err(|r| ctx.malformed(r))?;
    let hello_body = hello.body();
    if !auth::verify(
        id.secret(),
        Role::Acceptor,
        &acceptor_context(&hello_body),
        &hello.nonce,
        &c.nonce,
        &c.tag,
    ) {
        return Err(ctx.auth(
            "its proof does not match this rank's secret (a listener of another job, or a different unique id or MSCCLPP_SECRET)".into(),
        ));
    }
    Ok(auth::tag(
        id.secret(),
        Role::Connector,
        &connector_context(&hello_body, request),
        &hello.nonce,
        &c.nonce,
    ))
}

fn nonce(ctx: &Ctx) -> Result<Nonce> {
    Nonce::random().map_err(|source| Error::BootstrapIo {
        rank: ctx.rank,
        peer: ctx.peer,
        op: "draw a nonce",
        source,
    })
}

/// What joining at the root gave.
pub(super) enum Joined {
    Table(Table),
    /// The root closed the connection before answering (it evicted an idle-looking handshake
    /// under a flood of connections, or it is stopping): try again.
    Cut(Error),
}

/// Connects to the root, proves this rank, sends its registration and waits for the table (or
/// the root's verdict). Retries a join the root cut without an answer, until `deadline`.
pub(super) fn join_root(
    cfg: &BootstrapConfig,
    id: &UniqueId,
    listen: SocketAddr,
    host_hash: u64,
    deadline: Instant,
    joined: &mut bool,
) -> Result<Table> {
    loop {
        match join_once(cfg, id, listen, host_hash, deadline, joined)? {
            Joined::Table(t) => return Ok(t),
            Joined::Cut(e) => {
                if remaining(deadline).is_none() {
                    return Err(e);
                }
                tracing::debug!("bootstrap rank {}: join cut ({e}); again", cfg.rank);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

fn join_once(
    cfg: &BootstrapConfig,
    id: &UniqueId,
    listen: SocketAddr,
    host_hash: u64,
    deadline: Instant,
    joined: &mut bool,
) -> Result<Joined> {
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
    let hello = Hello {
        magic: id.magic(),
        purpose: Purpose::Join,
        from: me,
        to: wire::ROOT,
        size,
        nonce: nonce(&ctx)?,
    };
    let deadline_ms =
        remaining(deadline).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let mut join = Join {
        tag: [0; TAG_LEN],
        listen,
        host_hash,
        deadline_ms,
    };
    let cut = |e: Error| match e {
        Error::BootstrapPeerClosed { .. } => Ok(Joined::Cut(e)),
        e => Err(e),
    };
    join.tag = match prove(&ctx, &stream, &hello, id, &join.request(), deadline) {
        Ok(t) => t,
        Err(e) => return cut(e),
    };
    if let Err(f) = write_full(&stream, &join.encode(), deadline) {
        return cut(ctx.io(f));
    }
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
    let (kind, body) = match read_control(&stream, later(deadline, grace), &expected) {
        Ok(f) => f,
        Err(f) => return Err(ctx.control(f)),
    };
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
            Ok(Joined::Table(table))
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

/// Opens a link to rank `to` at `addr` and completes its handshake.
pub(super) fn open_link(
    ctx: &Ctx,
    id: &UniqueId,
    size: usize,
    to: usize,
    addr: SocketAddr,
    deadline: Instant,
) -> Result<TcpStream> {
    let left = remaining(deadline).ok_or_else(|| ctx.timeout_error())?;
    let stream = TcpStream::connect_timeout(&addr, left).map_err(|e| ctx.connect(e))?;
    let _ = stream.set_nodelay(true);
    let hello = Hello {
        magic: id.magic(),
        purpose: Purpose::Link,
        from: ctx.rank,
        to,
        size,
        nonce: nonce(ctx)?,
    };
    let tag = prove(ctx, &stream, &hello, id, &[], deadline)?;
    write_full(&stream, &Proof { tag }.encode(), deadline).map_err(|f| ctx.io(f))?;
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
            if a.rank != to {
                return Err(
                    ctx.malformed(format!("rank {to}'s address answered as rank {}", a.rank))
                );
            }
            Ok(stream)
        }
        _ => Err(ctx.rejected(Reject::decode(&body).map_err(|r| ctx.malformed(r))?)),
    }
}
