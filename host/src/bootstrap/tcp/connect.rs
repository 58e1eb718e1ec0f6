//! The connector's side of the bootstrap's handshakes, on the caller's thread with blocking,
//! deadline-bounded I/O: joining at the root (`HELLO`, `CHALLENGE`, `JOIN`, then `TABLE` or the
//! root's verdict) and opening a link to another rank (`HELLO`, `CHALLENGE`, `PROOF`, then
//! `ACCEPT`). Both check the acceptor's tag before they send their own ([`crate::auth`]).
//!
//! An acceptor under a flood of connections sheds handshakes (`bootstrap::intake`): it answers
//! `REJECT Busy`, or just closes. Such an attempt is *cut* ([`Miss::Cut`]) and tried again,
//! with a growing pause, until the deadline; a retry that finds the listener gone (connection
//! refused) means the acceptor's bootstrap is gone.

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::super::keying::{KeyCell, Keying, WorldKey};
use super::super::net::{self, Ctx, read_control};
use super::super::wire::{
    self, Abort, AbortCode, Accept, Challenge, Hello, Join, Kind, Proof, Purpose, Reject,
    RejectCode, Table, acceptor_context, connector_context,
};
use super::{BootstrapConfig, Cancel, Peer, UniqueId};
use crate::auth::{self, Nonce, Role, TAG_LEN};
use crate::error::{Error, Result};
use crate::socket::{later, remaining, write_full};

/// Why a handshake attempt did not complete.
#[derive(Debug)]
pub(super) enum Miss {
    /// The acceptor cut it without an answer (`REJECT Busy`, or closed or reset before
    /// answering): try again until the deadline.
    Cut(Error),
    /// A failure another attempt would not fix.
    Fail(Error),
}

impl Miss {
    /// A socket failure of an attempt: a cut if the acceptor closed or reset it.
    fn of(e: Error) -> Self {
        use std::io::ErrorKind as K;
        let cut = match &e {
            Error::BootstrapPeerClosed { .. } => true,
            Error::BootstrapIo { source, .. } => matches!(
                source.kind(),
                K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe | K::UnexpectedEof
            ),
            _ => false,
        };
        if cut { Miss::Cut(e) } else { Miss::Fail(e) }
    }

    /// A `REJECT`: a cut if it says `Busy`.
    fn rejected(ctx: &Ctx, r: Reject) -> Self {
        if r.code == RejectCode::Busy {
            Miss::Cut(ctx.rejected(r))
        } else {
            Miss::Fail(ctx.rejected(r))
        }
    }
}

impl From<Error> for Miss {
    fn from(e: Error) -> Self {
        Miss::Fail(e)
    }
}

/// Runs `attempt` until it completes, fails for good, or `deadline` passes after a cut (then
/// the cut's error), pausing 10 ms, then longer (up to 200 ms), between attempts. `attempt`
/// learns whether an earlier attempt was cut.
pub(super) fn retry_cut<T>(
    deadline: Instant,
    mut attempt: impl FnMut(bool) -> Result<T, Miss>,
) -> Result<T> {
    let mut pause = Duration::from_millis(10);
    let mut was_cut = false;
    loop {
        match attempt(was_cut) {
            Ok(t) => return Ok(t),
            Err(Miss::Fail(e)) => return Err(e),
            Err(Miss::Cut(e)) => {
                let Some(left) = remaining(deadline) else {
                    return Err(e);
                };
                tracing::debug!("bootstrap: a handshake was cut ({e}); again");
                std::thread::sleep(pause.min(left));
                pause = (pause * 2).min(Duration::from_millis(200));
                was_cut = true;
            }
        }
    }
}

/// The key a connector checks the acceptor's challenge with.
#[derive(Clone, Copy)]
enum Keys<'a> {
    /// Joining: derived from the root's job nonce (`bootstrap::keying`).
    Root(&'a Keying, SocketAddr),
    /// A link: this rank's world key, set when it joined.
    Known(WorldKey),
}

/// Sends `hello`, checks the acceptor's `CHALLENGE`, and returns this side's tag over
/// `request` (what the next frame carries) and the world key it checked the challenge with.
fn prove(
    ctx: &Ctx,
    stream: &TcpStream,
    hello: &Hello,
    keys: Keys<'_>,
    request: &[u8],
    deadline: Instant,
) -> Result<([u8; TAG_LEN], WorldKey), Miss> {
    write_full(stream, &hello.encode(), deadline).map_err(|f| Miss::of(ctx.io(f)))?;
    let expected = [
        (Kind::Challenge, wire::CHALLENGE_BODY_LEN),
        (Kind::Reject, wire::MAX_REJECT_BODY),
    ];
    let (kind, body) =
        read_control(stream, deadline, &expected).map_err(|f| Miss::of(ctx.control(f)))?;
    if kind != Kind::Challenge {
        let r = Reject::decode(&body).map_err(|r| ctx.malformed(r))?;
        return Err(Miss::rejected(ctx, r));
    }
    let c = Challenge::decode(&body).map_err(|r| ctx.malformed(r))?;
    let world = match keys {
        Keys::Root(keying, root) => WorldKey {
            key: keying
                .key(root, &c.job)
                .map_err(|e| ctx.auth(format!("deriving the world key: {e}")))?,
            job: c.job,
        },
        Keys::Known(w) => w,
    };
    let hello_body = hello.body();
    // A listener of another job hands out another job nonce: its tag does not check out.
    if c.job != world.job
        || !auth::verify(
            &world.key,
            Role::Acceptor,
            &acceptor_context(&hello_body, &c.job),
            &hello.nonce,
            &c.nonce,
            &c.tag,
        )
    {
        return Err(Miss::Fail(ctx.auth(
            "its proof does not match this rank's secret (a listener of another job, or a different unique id or MSCCLPP_SECRET)".into(),
        )));
    }
    let tag = auth::tag(
        &world.key,
        Role::Connector,
        &connector_context(&hello_body, &world.job, request),
        &hello.nonce,
        &c.nonce,
    );
    Ok((tag, world))
}

fn nonce(ctx: &Ctx) -> Result<Nonce> {
    Nonce::random().map_err(|source| Error::BootstrapIo {
        rank: ctx.rank,
        peer: ctx.peer,
        op: "draw a nonce",
        source,
    })
}

/// Connects to the root, proves this rank, sends its registration and waits for the table (or
/// the root's verdict). Retries a join the root cut without an answer (it shed the handshake
/// under a flood of connections), until `deadline`.
///
/// The root's challenge gives the job nonce: the world key is derived (for a passphrase) and
/// stored in `key` before the `JOIN` goes out (`bootstrap::keying`).
pub(super) fn join_root(
    cfg: &BootstrapConfig,
    me: &Joiner<'_>,
    deadline: Instant,
    joined: &mut bool,
) -> Result<Table> {
    retry_cut(deadline, |again| {
        join_once(cfg, me, deadline, joined, again)
    })
}

/// Who joins, and what with.
#[derive(Clone, Copy)]
pub(super) struct Joiner<'a> {
    pub id: &'a UniqueId,
    pub keying: &'a Keying,
    /// Set from the root's challenge.
    pub key: &'a KeyCell,
    pub listen: SocketAddr,
    pub host_hash: u64,
}

fn join_once(
    cfg: &BootstrapConfig,
    joiner: &Joiner<'_>,
    deadline: Instant,
    joined: &mut bool,
    again: bool,
) -> Result<Table, Miss> {
    let Joiner {
        id,
        keying,
        key,
        listen,
        host_hash,
    } = *joiner;
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
    if cfg.cancel.as_ref().is_some_and(Cancel::is_cancelled) {
        return Err(Miss::Fail(Cancel::error()));
    }
    // The first attempt waits for a root that is not up yet; after a cut, the root was up a
    // moment ago, so a refusal means it is gone.
    let stream = if again {
        let left = remaining(deadline).ok_or_else(|| ctx.timeout_error())?;
        TcpStream::connect_timeout(&id.root(), left).map_err(|e| ctx.connect(e))?
    } else {
        net::connect_retry(&ctx, id.root(), deadline, cfg.cancel.as_ref())?
    };
    // Until the table comes: a cancel shuts the socket down, ending every wait on it.
    let _watch = cfg.cancel.as_ref().map(|c| c.watch(&stream));
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
    let (tag, world) = prove(
        &ctx,
        &stream,
        &hello,
        Keys::Root(keying, id.root()),
        &join.request(),
        deadline,
    )?;
    match key.get() {
        None => {
            let _ = key.set(world);
        }
        Some(k) if *k == world => {}
        Some(_) => {
            let why = "the root's job nonce changed between two attempts to join (did it restart?)";
            return Err(ctx.auth(why.into()).into());
        }
    }
    join.tag = tag;
    write_full(&stream, &join.encode(), deadline).map_err(|f| Miss::of(ctx.io(f)))?;
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
    // A root that has our JOIN answers it; closing without an answer is a root that failed
    // (a cut would follow a shed handshake, which the root tells with REJECT Busy).
    let (kind, body) =
        read_control(&stream, later(deadline, grace), &expected).map_err(|f| ctx.control(f))?;
    match kind {
        Kind::Table => {
            let table = Table::decode(&body, size).map_err(|r| ctx.malformed(r))?;
            if table.magic != id.magic() {
                return Err(ctx.bad_magic("session magic in the address table").into());
            }
            if table.entries[me].listen != listen {
                let got = table.entries[me].listen;
                return Err(ctx
                    .malformed(format!(
                        "the table lists {got} for this rank, which listens at {listen}"
                    ))
                    .into());
            }
            Ok(table)
        }
        Kind::Abort => {
            let abort = Abort::decode(&body, size).map_err(|r| ctx.malformed(r))?;
            Err(Miss::Fail(match (abort.code, abort.ranks.first()) {
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
            }))
        }
        _ => {
            let r = Reject::decode(&body).map_err(|r| ctx.malformed(r))?;
            if r.code == RejectCode::Duplicate {
                return Err(Miss::Fail(rank_taken(me, root, id, &r.reason)));
            }
            Err(Miss::rejected(&ctx, r))
        }
    }
}

/// The error of a rank whose JOIN the root refused because another process joined as it.
fn rank_taken(me: usize, root: Peer, id: &UniqueId, said: &str) -> Error {
    let check = if id.is_authenticated() {
        format!(
            "the other process knew this world's secret: is rank {me} started twice (two launchers, or a restarted rank)?"
        )
    } else {
        format!(
            "this world has no secret (no {} with the plain root address, no unique id), so any process that reaches the root can join as any rank: set {} to the same 32 random bytes on every rank, or use a unique id",
            super::super::env::SECRET,
            super::super::env::SECRET
        )
    };
    Error::BootstrapRankTaken {
        rank: me,
        peer: root,
        reason: format!("the root says \"{said}\"; {check}"),
    }
}

/// Opens a link to rank `to` at `addr` and completes its handshake (one attempt; the caller
/// retries a cut one with [`retry_cut`]). `world` is this rank's key, set when it joined.
pub(super) fn open_link(
    ctx: &Ctx,
    (id, world): (&UniqueId, WorldKey),
    size: usize,
    to: usize,
    addr: SocketAddr,
    deadline: Instant,
) -> Result<TcpStream, Miss> {
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
    let (tag, _) = prove(ctx, &stream, &hello, Keys::Known(world), &[], deadline)?;
    write_full(&stream, &Proof { tag }.encode(), deadline).map_err(|f| Miss::of(ctx.io(f)))?;
    let expected = [
        (Kind::Accept, wire::ACCEPT_BODY_LEN),
        (Kind::Reject, wire::MAX_REJECT_BODY),
    ];
    let (kind, body) =
        read_control(&stream, deadline, &expected).map_err(|f| Miss::of(ctx.control(f)))?;
    match kind {
        Kind::Accept => {
            let a = Accept::decode(&body).map_err(|r| ctx.malformed(r))?;
            if a.magic != id.magic() {
                return Err(ctx.bad_magic("session magic in ACCEPT").into());
            }
            if a.rank != to {
                let why = format!("rank {to}'s address answered as rank {}", a.rank);
                return Err(ctx.malformed(why).into());
            }
            Ok(stream)
        }
        _ => {
            let r = Reject::decode(&body).map_err(|r| ctx.malformed(r))?;
            Err(Miss::rejected(ctx, r))
        }
    }
}
