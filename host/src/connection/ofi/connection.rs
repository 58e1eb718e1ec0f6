//! [`OfiConnection`]: the data path of the `Ofi` transport (see the [module docs](super)) —
//! the sending calls (`write`, `update_and_sync`, `flush`), the progress thread that reads the
//! completion queue and applies the peer's frames, and the teardown.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::result::{Polled, Posted};
use super::setup::{LocalMr, Op, Port, Prepared};
use super::sys::{FiCqErrEntry, FiCqTaggedEntry};
use super::wire::{EndpointInfo, FLAG_DIRECT, Frame, MrEntry};
use super::{CTRL_TX, HEADER_LEN, LINGER, MAX_REASON, RMA_OPS, SLOTS, TX_BUFS, result};
use crate::backoff::Backoff;
use crate::connection::Connection;
use crate::connection::network::{Failure, check_destination, check_remote, check_word};
use crate::error::{Error, Link, Result, TransportErrorKind};
use crate::gpu::{Gpu, Stream};
use crate::registered_memory::{LocalMemories, RegisteredMemory};
use crate::socket::{deadline_in, remaining};
use crate::status::StatusBlock;
use crate::sync::{lock, wait_timeout};
use crate::transport::Transport;

/// Longest a waiting sender goes without looking at the communicator's abort flag.
const WAIT_SLICE: Duration = Duration::from_millis(10);
/// Idle time after which the progress thread polls every millisecond instead of spinning.
const IDLE_AFTER: Duration = Duration::from_millis(20);

// SAFETY: `Port` holds the connection's fabric objects (`Send` by their owners' contract), host
// buffers, and the operations' context slots, which are plain memory the provider scribbles on;
// every use is under the connection's port lock.
unsafe impl Send for Port {}

/// What the sender and the progress thread share (under `Shared::st`).
struct State {
    failure: Option<Failure>,
    /// Sequence number of the next data frame this side sends.
    next_seq: u64,
    /// Data frames of this side the peer has applied (its last `CREDIT`).
    credited: u64,
    free_tx: Vec<usize>,
    free_ctrl: Vec<usize>,
    free_rma: Vec<usize>,
    rma_posted: u64,
    rma_done: u64,
    /// Sequence number of the next data frame of the peer to apply.
    next_apply: u64,
    /// The peer's data frames that arrived ahead of their turn: seq → (slot, bytes).
    arrived: BTreeMap<u64, (usize, usize)>,
    /// The peer has applied frames it was not told about yet.
    credit_owed: bool,
    peer_bye: bool,
}

struct Shared {
    rank: usize,
    remote_rank: usize,
    port: Mutex<Port>,
    st: Mutex<State>,
    cv: Condvar,
    status: Arc<StatusBlock>,
    registry: Arc<LocalMemories>,
    closing: AtomicBool,
    stop: AtomicBool,
    /// Payload bytes of our receive slots, and of the peer's.
    chunk: u64,
    peer_chunk: u64,
    peer_slots: u64,
    /// The peer's memories this side writes directly (empty when either side cannot).
    peer_mrs: HashMap<u32, MrEntry>,
    local_mrs: HashMap<u32, LocalMr>,
    max_msg: u64,
    timeout: Duration,
    bytes: AtomicU64,
    /// The progress thread, woken after every post (its sends progress only when it reads the
    /// completion queue).
    progress: std::sync::OnceLock<thread::Thread>,
}

/// A connection to one remote rank over libfabric (see the module docs).
pub struct OfiConnection {
    shared: Arc<Shared>,
    /// The sender's device stream for staging.
    stage: Mutex<Option<Stream>>,
    gpu: Gpu,
    progress: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for OfiConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "OfiConnection(to rank {}, {} direct memories)",
            self.shared.remote_rank,
            self.shared.peer_mrs.len()
        )
    }
}

/// What `OfiConnection::establish` needs besides the prepared half.
pub(crate) struct Setup<'a> {
    /// This rank.
    pub rank: usize,
    /// The peer.
    pub remote_rank: usize,
    /// This rank's device (stages copies).
    pub gpu: &'a Gpu,
    /// The communicator's registry of network-writable memories.
    pub registry: Arc<LocalMemories>,
    /// The communicator's status block (aborted when the peer dies or misbehaves).
    pub status: Arc<StatusBlock>,
    /// Bound of every wait of the connection.
    pub timeout: Duration,
}

impl OfiConnection {
    /// Completes the set-up with the peer whose endpoint `extra` is `peer_extra`: checks that
    /// both use the same provider and fabric, inserts the peer's address, and starts the
    /// progress thread.
    pub(crate) fn establish(prep: Prepared, peer_extra: &[u8], setup: Setup<'_>) -> Result<Self> {
        let remote_rank = setup.remote_rank;
        let refuse = |reason: String| Link::to(Transport::Ofi, remote_rank).setup(reason);
        let theirs = EndpointInfo::decode(peer_extra)
            .map_err(|r| refuse(format!("malformed endpoint: {r}")))?;
        let ours = &prep.info;
        if theirs.provider != ours.provider || theirs.fabric != ours.fabric {
            return Err(refuse(format!(
                "the peer uses provider {:?} on fabric {:?}, this rank {:?} on {:?} (set MSCCLPP_OFI_PROVIDER alike on every rank)",
                theirs.provider, theirs.fabric, ours.provider, ours.fabric
            )));
        }
        let Prepared {
            mut port,
            local_mrs,
            direct,
            max_msg,
            ..
        } = prep;
        port.peer = port.fi.insert_peer(&theirs.addr)?;
        let peer_mrs = if direct && theirs.flags & FLAG_DIRECT != 0 {
            theirs.mrs.iter().map(|m| (m.id, *m)).collect()
        } else {
            HashMap::new()
        };
        let shared = Arc::new(Shared {
            rank: setup.rank,
            remote_rank,
            port: Mutex::new(port),
            st: Mutex::new(State {
                failure: None,
                next_seq: 0,
                credited: 0,
                free_tx: (0..TX_BUFS).collect(),
                free_ctrl: (0..CTRL_TX).collect(),
                free_rma: (0..RMA_OPS).collect(),
                rma_posted: 0,
                rma_done: 0,
                next_apply: 0,
                arrived: BTreeMap::new(),
                credit_owed: false,
                peer_bye: false,
            }),
            cv: Condvar::new(),
            status: setup.status,
            registry: setup.registry,
            closing: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            chunk: u64::from(ours.chunk),
            peer_chunk: u64::from(theirs.chunk),
            peer_slots: u64::from(theirs.slots),
            peer_mrs,
            local_mrs,
            max_msg: max_msg as u64,
            timeout: setup.timeout,
            bytes: AtomicU64::new(0),
            progress: std::sync::OnceLock::new(),
        });
        let s = Arc::clone(&shared);
        let gpu = setup.gpu.clone();
        let progress = thread::Builder::new()
            .name(format!("ofi{}-p{remote_rank}", setup.rank))
            .spawn(move || {
                Progress {
                    s,
                    gpu,
                    stream: None,
                }
                .run()
            })
            .map_err(|e| refuse(format!("starting the progress thread: {e}")))?;
        Ok(Self {
            shared,
            stage: Mutex::new(None),
            gpu: setup.gpu.clone(),
            progress: Some(progress),
        })
    }

    /// Payload bytes this connection has sent (frames and direct writes).
    pub fn bytes_sent(&self) -> u64 {
        self.shared.bytes.load(Ordering::Relaxed)
    }

    /// How many of the peer's memories this side writes directly (RMA).
    pub fn direct_memories(&self) -> usize {
        self.shared.peer_mrs.len()
    }
}

impl Shared {
    /// Records `f` unless a failure is already recorded (aborting the communicator when it
    /// says so); returns the recorded one.
    fn fail(&self, f: Failure) -> Failure {
        let mut st = lock(&self.st);
        let first = st.failure.is_none();
        let recorded = st.failure.get_or_insert(f).clone();
        drop(st);
        self.cv.notify_all();
        if first && recorded.aborts() && !self.closing.load(Ordering::Acquire) {
            tracing::warn!(
                "libfabric: connection of rank {} to rank {} failed ({}); aborting the communicator",
                self.rank,
                self.remote_rank,
                recorded.to_error(self.link(), "progress")
            );
            self.status.abort();
        }
        recorded
    }

    fn check(&self, op: &'static str) -> Result<()> {
        match &lock(&self.st).failure {
            Some(f) => Err(f.to_error(self.link(), op)),
            None => Ok(()),
        }
    }

    /// The connection, as its errors name it.
    fn link(&self) -> Link {
        Link::to(Transport::Ofi, self.remote_rank)
    }

    /// Waits (bounded by `deadline`, ended by a failure or an abort) until `take` gives a
    /// value.
    fn wait_for<T>(
        &self,
        op: &'static str,
        deadline: Instant,
        mut take: impl FnMut(&mut State) -> Option<T>,
    ) -> Result<T> {
        let mut st = lock(&self.st);
        loop {
            if let Some(f) = &st.failure {
                return Err(f.to_error(self.link(), op));
            }
            if let Some(v) = take(&mut st) {
                return Ok(v);
            }
            if self.status.is_aborted() {
                return Err(Error::Aborted {
                    reason: format!(
                        "the communicator was aborted while a libfabric {op} to rank {} waited",
                        self.remote_rank
                    ),
                });
            }
            let Some(left) = remaining(deadline) else {
                return Err(self.link().timeout(op, self.timeout));
            };
            st = wait_timeout(&self.cv, st, left.min(WAIT_SLICE));
        }
    }

    /// Posts with `post` until the provider takes it (it may say its queue is full: the
    /// progress thread drains it), bounded by `deadline`.
    fn post(
        &self,
        op: &'static str,
        deadline: Instant,
        mut post: impl FnMut(&mut Port) -> Result<Posted>,
    ) -> Result<()> {
        let mut backoff = Backoff::new();
        loop {
            let posted = post(&mut lock(&self.port));
            match posted {
                Ok(Posted::Yes) => {
                    self.kick();
                    return Ok(());
                }
                Ok(Posted::Again) => {}
                Err(e) => {
                    self.fail(Failure::Call(e.to_string()));
                    return Err(e);
                }
            }
            self.check(op)?;
            if self.status.is_aborted() {
                return Err(Error::Aborted {
                    reason: format!(
                        "the communicator was aborted while a libfabric {op} to rank {} waited for room",
                        self.remote_rank
                    ),
                });
            }
            if remaining(deadline).is_none() {
                return Err(self.link().timeout(op, self.timeout));
            }
            backoff.snooze();
        }
    }

    /// Wakes the progress thread: a posted operation moves only when the completion queue is
    /// read (manual progress), so it should not wait out the thread's idle sleep.
    fn kick(&self) {
        if let Some(t) = self.progress.get() {
            t.unpark();
        }
    }

    /// Reserves a data send slot and the next sequence number (waiting for a free slot and for
    /// room in the peer's receive slots; one of those is kept for `BYE` unless `last`).
    fn reserve(&self, op: &'static str, deadline: Instant, last: bool) -> Result<(usize, u64)> {
        let room = self.peer_slots - u64::from(!last);
        self.wait_for(op, deadline, |st| {
            if st.next_seq - st.credited < room
                && let Some(i) = st.free_tx.pop()
            {
                st.next_seq += 1;
                Some((i, st.next_seq - 1))
            } else {
                None
            }
        })
    }

    /// Sends a header-only data frame (`UPDATE`, `FLUSH`, `BYE`) in slot `i`.
    fn send_header(
        &self,
        op: &'static str,
        i: usize,
        frame: Frame,
        deadline: Instant,
    ) -> Result<()> {
        {
            let port = lock(&self.port);
            // SAFETY: slot `i` is reserved for this frame (taken from the free list) and has
            // room for a header.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    frame.encode().as_ptr(),
                    port.tx_data.host(i),
                    HEADER_LEN,
                )
            };
        }
        self.post(op, deadline, |p| p.send_data(i, HEADER_LEN))
    }
}

impl OfiConnection {
    fn peer(&self) -> usize {
        self.shared.remote_rank
    }

    /// The direct route of a write, if both memories have one: the peer's registration of
    /// `dst` and this side's of `src` (still registered at the same place).
    fn direct_route(
        &self,
        dst: &RegisteredMemory,
        src: &RegisteredMemory,
    ) -> Option<(MrEntry, LocalMr)> {
        let s = &self.shared;
        let m = *s.peer_mrs.get(&dst.local_id())?;
        if src.rank() != s.rank {
            return None;
        }
        let l = *s.local_mrs.get(&src.local_id())?;
        let live = s.registry.read().get(&src.local_id()).copied()?;
        (live.ptr.addr() == l.addr && live.size as u64 == l.size).then_some((m, l))
    }

    /// Writes by RMA into the peer's registration (module docs: direct writes).
    fn write_direct(
        &self,
        m: MrEntry,
        l: LocalMr,
        dst_off: u64,
        src_off: u64,
        size: u64,
    ) -> Result<()> {
        let s = &self.shared;
        if dst_off.checked_add(size).is_none_or(|e| e > m.size)
            || src_off.checked_add(size).is_none_or(|e| e > l.size)
        {
            return Err(Error::OutOfRange {
                offset: usize::try_from(dst_off).unwrap_or(usize::MAX),
                len: usize::try_from(size).unwrap_or(usize::MAX),
                size: usize::try_from(m.size).unwrap_or(usize::MAX),
            });
        }
        let deadline = deadline_in(s.timeout);
        let mut done = 0u64;
        while done < size {
            let n = (size - done).min(s.max_msg);
            let i = s.wait_for("write", deadline, |st| {
                let i = st.free_rma.pop()?;
                st.rma_posted += 1;
                Some(i)
            })?;
            let (buf, raddr) = (l.addr + src_off + done, m.addr + dst_off + done);
            s.post("write", deadline, |p| {
                let (ctx, peer) = (p.ctx(Op::Rma(i)), p.peer);
                // SAFETY: `buf..buf+n` lies inside this rank's registration `l` (checked
                // above; the memory is still registered at that place), which stays valid
                // until the write completes (flush waits for it); `raddr..raddr+n` lies inside
                // the peer's registration `m`; the context slot is reserved for this write.
                unsafe {
                    result::write(
                        p.fi.lib,
                        p.fi.ep.raw(),
                        buf as *const u8,
                        n as usize,
                        l.desc as *mut std::ffi::c_void,
                        peer,
                        raddr,
                        m.key,
                        ctx,
                        &p.fi.prov,
                    )
                }
            })?;
            s.bytes.fetch_add(n, Ordering::Relaxed);
            done += n;
        }
        Ok(())
    }

    /// Writes in `WRITE` frames, staged through this side's send slots.
    fn write_frames(
        &self,
        dst: &RegisteredMemory,
        dst_off: u64,
        src: &RegisteredMemory,
        src_off: u64,
        size: u64,
    ) -> Result<()> {
        let s = &self.shared;
        let from = src.range(src_off, size)?;
        let deadline = deadline_in(s.timeout);
        let mut done = 0u64;
        while done < size {
            let n = (size - done).min(s.peer_chunk);
            let (i, seq) = s.reserve("write", deadline, false)?;
            let (dev, host) = {
                let port = lock(&s.port);
                (port.tx_data.device(i), port.tx_data.host(i))
            };
            let mut stage = lock(&self.stage);
            let stream = match stage.take() {
                Some(st) => st,
                None => self.gpu.stream()?,
            };
            let stream = stage.insert(stream);
            // SAFETY: `from + done .. + n` lies inside `src` (checked by `range`); send slot
            // `i` (HEADER_LEN + chunk ≥ HEADER_LEN + n bytes) is reserved for this frame and
            // not in flight; the two never overlap.
            unsafe {
                stream.copy_dtod(
                    dev.byte_add_cast(HEADER_LEN as u64),
                    from.byte_add_cast(done),
                    n as usize,
                )
            }?;
            let left = remaining(deadline).unwrap_or(Duration::ZERO);
            if !stream.synchronize_timeout(left)? {
                // The copy may still land in the slot: it is never returned to the free list.
                std::mem::forget(stage.take());
                let f = s.fail(Failure::Local(format!(
                    "staging a write did not complete within {:?}",
                    s.timeout
                )));
                return Err(f.to_error(s.link(), "write"));
            }
            drop(stage);
            let header = Frame::Write {
                seq,
                id: dst.local_id(),
                key: dst.key(),
                offset: dst_off + done,
                len: n,
            };
            // SAFETY: the slot is reserved (above) and has room for the header.
            unsafe { std::ptr::copy_nonoverlapping(header.encode().as_ptr(), host, HEADER_LEN) };
            let len = HEADER_LEN + n as usize;
            s.post("write", deadline, |p| p.send_data(i, len))?;
            s.bytes.fetch_add(n, Ordering::Relaxed);
            done += n;
        }
        Ok(())
    }
}

impl Connection for OfiConnection {
    fn transport(&self) -> Transport {
        Transport::Ofi
    }

    fn remote_rank(&self) -> usize {
        self.peer()
    }

    fn write(
        &self,
        dst: &RegisteredMemory,
        dst_off: u64,
        src: &RegisteredMemory,
        src_off: u64,
        size: u64,
    ) -> Result<()> {
        self.shared.check("write")?;
        check_remote(self.shared.link(), "write", dst, dst_off, size)?;
        src.range(src_off, size)?;
        if size == 0 {
            return Ok(());
        }
        match self.direct_route(dst, src) {
            Some((m, l)) => self.write_direct(m, l, dst_off, src_off, size),
            None => self.write_frames(dst, dst_off, src, src_off, size),
        }
    }

    fn update_and_sync(
        &self,
        dst: &RegisteredMemory,
        dst_off: u64,
        src: &AtomicU64,
        new_value: u64,
    ) -> Result<()> {
        let s = &self.shared;
        s.check("update_and_sync")?;
        check_word(s.link(), dst, dst_off)?;
        src.store(new_value, Ordering::Release);
        let deadline = deadline_in(s.timeout);
        let (i, seq) = s.reserve("update_and_sync", deadline, false)?;
        let frame = Frame::Update {
            seq,
            id: dst.local_id(),
            key: dst.key(),
            offset: dst_off,
            value: new_value,
        };
        s.send_header("update_and_sync", i, frame, deadline)
    }

    fn flush(&self, timeout: Duration) -> Result<()> {
        let s = &self.shared;
        s.check("flush")?;
        let deadline = deadline_in(timeout);
        let timed_out = |e: Error| match e {
            Error::Transport {
                kind: TransportErrorKind::Timeout,
                ..
            } => Error::FlushTimeout {
                remote_rank: self.peer(),
                transport: Transport::Ofi,
                after: timeout,
            },
            e => e,
        };
        let (i, seq) = s.reserve("flush", deadline, false).map_err(timed_out)?;
        s.send_header("flush", i, Frame::Flush { seq }, deadline)
            .map_err(timed_out)?;
        s.wait_for("flush", deadline, |st| {
            (st.credited > seq && st.rma_done == st.rma_posted).then_some(())
        })
        .map_err(timed_out)
    }

    fn bytes_sent(&self) -> u64 {
        OfiConnection::bytes_sent(self)
    }
}

impl Drop for OfiConnection {
    fn drop(&mut self) {
        let s = &self.shared;
        s.closing.store(true, Ordering::Release);
        let linger = deadline_in(LINGER);
        // BYE, then (for at most LINGER) wait until the peer applied it and said its own, and
        // every operation of ours completed; the progress thread keeps applying the peer's
        // frames meanwhile.
        let bye = (|| -> Result<()> {
            s.check("close")?;
            let (i, seq) = s.reserve("close", linger, true)?;
            s.send_header("close", i, Frame::Bye { seq }, linger)?;
            s.wait_for("close", linger, |st| {
                (st.credited > seq
                    && st.peer_bye
                    && st.free_tx.len() == TX_BUFS
                    && st.rma_done == st.rma_posted)
                    .then_some(())
            })
        })();
        if let Err(e) = bye {
            tracing::debug!(
                "libfabric: closing the connection to rank {}: {e}",
                s.remote_rank
            );
        }
        s.stop.store(true, Ordering::Release);
        if let Some(t) = self.progress.take() {
            let _ = t.join();
        }
    }
}

/// The progress thread (`ofi{rank}-p{peer}`): reads the completion queue, applies the peer's
/// data frames in sequence order, answers with credits.
struct Progress {
    s: Arc<Shared>,
    gpu: Gpu,
    /// Device stream for applying frames, made at the first one.
    stream: Option<Stream>,
}

impl Progress {
    fn run(mut self) {
        let mut entries = [FiCqTaggedEntry::default(); 16];
        let mut backoff = Backoff::new();
        let mut idle_since = Instant::now();
        while !self.s.stop.load(Ordering::Acquire) {
            let polled = {
                let p = lock(&self.s.port);
                // SAFETY: the CQ is live and of the tagged format.
                unsafe { result::cq_read(p.fi.lib, p.fi.cq.raw(), &mut entries, &p.fi.prov) }
            };
            match polled {
                Ok(Polled::Entries(n)) => {
                    for e in &entries[..n] {
                        self.complete(e);
                    }
                    self.apply_arrived();
                    backoff.reset();
                    idle_since = Instant::now();
                }
                Ok(Polled::Empty) => {
                    self.send_credit();
                    // Parked, not slept: a sender's post unparks it at once (`kick`).
                    if idle_since.elapsed() > IDLE_AFTER {
                        thread::park_timeout(Duration::from_millis(1));
                    } else if backoff.is_sleeping() {
                        thread::park_timeout(Backoff::SLEEP);
                    } else {
                        backoff.snooze();
                    }
                }
                Ok(Polled::Failed(err, reason)) => self.failed(&err, &reason),
                Err(e) => {
                    self.s.fail(Failure::Call(e.to_string()));
                    thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }

    /// One successful completion.
    fn complete(&mut self, e: &FiCqTaggedEntry) {
        let op = lock(&self.s.port).op_of(e.op_context);
        match op {
            Some(Op::RxData(i)) => self.arrived(i, e.len),
            Some(Op::RxCtrl(i)) => self.control(i, e.len),
            Some(Op::TxData(i)) => lock(&self.s.st).free_tx.push(i),
            Some(Op::TxCtrl(i)) => lock(&self.s.st).free_ctrl.push(i),
            Some(Op::Rma(i)) => {
                let mut st = lock(&self.s.st);
                st.free_rma.push(i);
                st.rma_done += 1;
            }
            None => {
                self.protocol(format!(
                    "a completion names an unknown context {:p}",
                    e.op_context
                ));
                return;
            }
        }
        self.s.cv.notify_all();
    }

    /// A failed operation: the peer is gone (or the link), unless this is the teardown.
    fn failed(&mut self, err: &FiCqErrEntry, reason: &str) {
        let op = lock(&self.s.port).op_of(err.op_context);
        let ending = self.s.closing.load(Ordering::Acquire) || lock(&self.s.st).peer_bye;
        let f = if ending {
            Failure::Closed
        } else {
            Failure::Lost(format!(
                "{op:?} failed: {reason} (error {}, provider error {})",
                err.err, err.prov_errno
            ))
        };
        self.s.fail(f);
    }

    /// A data frame arrived in receive slot `i` (`len` bytes).
    fn arrived(&mut self, i: usize, len: usize) {
        let header = {
            let port = lock(&self.s.port);
            let mut h = [0u8; HEADER_LEN];
            if len >= HEADER_LEN {
                // SAFETY: the receive completed into slot `i`, which has at least HEADER_LEN
                // bytes; nothing else touches it until it is reposted.
                unsafe {
                    std::ptr::copy_nonoverlapping(port.rx_data.host(i), h.as_mut_ptr(), HEADER_LEN)
                };
            }
            h
        };
        if len < HEADER_LEN {
            return self.protocol(format!("a data message of {len} bytes"));
        }
        let frame = match Frame::decode(&header, self.s.chunk) {
            Ok(f) => f,
            Err(why) => return self.protocol(why),
        };
        let payload = match frame {
            Frame::Write { len, .. } => len as usize,
            Frame::Update { .. } | Frame::Flush { .. } | Frame::Bye { .. } => 0,
            Frame::Credit { .. } | Frame::Error { .. } => {
                return self.protocol(format!("{frame:?} sent as a data frame"));
            }
        };
        if len != HEADER_LEN + payload {
            return self.protocol(format!("{frame:?} in a message of {len} bytes"));
        }
        let seq = frame.seq().unwrap_or(0);
        let mut st = lock(&self.s.st);
        if seq < st.next_apply
            || seq >= st.next_apply + SLOTS as u64
            || st.arrived.contains_key(&seq)
        {
            let next = st.next_apply;
            drop(st);
            return self.protocol(format!("data frame {seq} while expecting {next}"));
        }
        st.arrived.insert(seq, (i, len));
    }

    /// A control frame arrived in control slot `i`.
    fn control(&mut self, i: usize, len: usize) {
        let (header, reason) = {
            let port = lock(&self.s.port);
            let mut h = [0u8; HEADER_LEN];
            let n = len.min(HEADER_LEN + MAX_REASON);
            let mut body = vec![0u8; n.saturating_sub(HEADER_LEN)];
            if len >= HEADER_LEN {
                // SAFETY: the receive completed into control slot `i` (HEADER_LEN +
                // MAX_REASON bytes); `n` is at most that.
                unsafe {
                    std::ptr::copy_nonoverlapping(port.rx_ctrl.host(i), h.as_mut_ptr(), HEADER_LEN);
                    std::ptr::copy_nonoverlapping(
                        port.rx_ctrl.host(i).add(HEADER_LEN),
                        body.as_mut_ptr(),
                        body.len(),
                    );
                }
            }
            (h, body)
        };
        let frame = if len < HEADER_LEN {
            Err(format!("a control message of {len} bytes"))
        } else {
            Frame::decode(&header, self.s.chunk)
        };
        match frame {
            Ok(Frame::Credit { applied }) if len == HEADER_LEN => {
                let mut st = lock(&self.s.st);
                if applied > st.next_seq {
                    let sent = st.next_seq;
                    drop(st);
                    return self.protocol(format!("credit for {applied} frames, {sent} sent"));
                }
                st.credited = st.credited.max(applied);
            }
            Ok(Frame::Error { len: n }) if len == HEADER_LEN + n as usize => {
                let why = String::from_utf8_lossy(&reason).into_owned();
                self.s.fail(Failure::Refused(why));
            }
            Ok(f) => return self.protocol(format!("{f:?} in a control message of {len} bytes")),
            Err(why) => return self.protocol(why),
        }
        let posted = lock(&self.s.port).post_rx_ctrl(i);
        self.reposted(posted);
    }

    fn reposted(&mut self, posted: Result<Posted>) {
        match posted {
            Ok(Posted::Yes) => {}
            // The slot's own receive just completed, so the queue has room for it.
            Ok(Posted::Again) => {
                self.s.fail(Failure::Call(
                    "reposting a receive found the queue full".into(),
                ));
            }
            Err(e) => {
                self.s.fail(Failure::Call(e.to_string()));
            }
        }
    }

    /// Applies the peer's frames that are next in sequence.
    fn apply_arrived(&mut self) {
        loop {
            let next = {
                let mut st = lock(&self.s.st);
                if st.failure.is_some() {
                    return;
                }
                let n = st.next_apply;
                st.arrived.remove(&n).map(|slot| (n, slot))
            };
            let Some((_, (i, _len))) = next else { break };
            let header = {
                let port = lock(&self.s.port);
                let mut h = [0u8; HEADER_LEN];
                // SAFETY: slot `i` holds a completed receive of at least HEADER_LEN bytes
                // (checked on arrival) and is not reposted yet.
                unsafe {
                    std::ptr::copy_nonoverlapping(port.rx_data.host(i), h.as_mut_ptr(), HEADER_LEN)
                };
                h
            };
            let applied = match Frame::decode(&header, self.s.chunk) {
                Ok(Frame::Write {
                    id,
                    key,
                    offset,
                    len,
                    ..
                }) => self.apply_write(i, id, key, offset, len),
                Ok(Frame::Update {
                    id,
                    key,
                    offset,
                    value,
                    ..
                }) => self.apply_update(id, key, offset, value),
                Ok(Frame::Bye { .. }) => {
                    lock(&self.s.st).peer_bye = true;
                    Ok(())
                }
                Ok(_) => Ok(()),
                Err(why) => Err(Failure::Protocol(why)),
            };
            if let Err(f) = applied {
                if let Failure::Protocol(why) = &f {
                    self.report(why);
                }
                self.s.fail(f);
                return;
            }
            let posted = lock(&self.s.port).post_rx_data(i);
            self.reposted(posted);
            {
                let mut st = lock(&self.s.st);
                st.next_apply += 1;
                st.credit_owed = true;
            }
            self.s.cv.notify_all();
        }
        self.send_credit();
    }

    /// Waits for the device stream; on a timeout the frame counts as not applied.
    fn sync(&mut self, what: &str) -> Result<(), Failure> {
        let Some(stream) = &self.stream else {
            return Ok(());
        };
        match stream.synchronize_timeout(self.s.timeout) {
            Ok(true) => Ok(()),
            Ok(false) => {
                // A copy out of a receive slot may still run: the slot is never reposted
                // (the failure stops everything).
                std::mem::forget(self.stream.take());
                Err(Failure::Local(format!(
                    "{what} did not complete on the device within {:?}",
                    self.s.timeout
                )))
            }
            Err(e) => Err(Failure::Local(e.to_string())),
        }
    }

    fn stream(&mut self) -> Result<&Stream, Failure> {
        if self.stream.is_none() {
            self.stream = Some(
                self.gpu
                    .stream()
                    .map_err(|e| Failure::Local(e.to_string()))?,
            );
        }
        self.stream
            .as_ref()
            .ok_or_else(|| Failure::Local("no device stream".into()))
    }

    fn apply_write(
        &mut self,
        i: usize,
        id: u32,
        key: u64,
        offset: u64,
        len: u64,
    ) -> Result<(), Failure> {
        let src = lock(&self.s.port)
            .rx_data
            .device(i)
            .byte_add_cast(HEADER_LEN as u64);
        let registry = Arc::clone(&self.s.registry);
        // Checked under the read lock, held until the copy completes, so the memory cannot be
        // deregistered (and freed by its owner) while it is written.
        let map = registry.read();
        let dst = check_destination(&map, Transport::Ofi, id, key, (offset, len, 1))
            .map_err(Failure::Protocol)?;
        let stream = self.stream()?;
        // SAFETY: `dst..dst+len` lies inside a registered local memory (checked under the lock,
        // held until the copy completes); the receive slot holds `len` payload bytes after the
        // header (checked on arrival) and is a distinct allocation.
        unsafe { stream.copy_dtod(dst, src, len as usize) }
            .map_err(|e| Failure::Local(e.to_string()))?;
        self.sync("a WRITE copy")
    }

    fn apply_update(&mut self, id: u32, key: u64, offset: u64, value: u64) -> Result<(), Failure> {
        let registry = Arc::clone(&self.s.registry);
        let map = registry.read();
        let dst = check_destination(&map, Transport::Ofi, id, key, (offset, 8, 8))
            .map_err(Failure::Protocol)?;
        let stream = self.stream()?;
        // SAFETY: an 8-byte aligned word inside a registered local memory, kept registered by
        // the read lock until the store completes.
        unsafe { stream.write_value_u64(dst.cast(), value) }
            .map_err(|e| Failure::Local(e.to_string()))?;
        self.sync("an UPDATE store")
    }

    /// Tells the peer how many of its frames are applied, if it was not told yet and a control
    /// send slot is free (otherwise later: credits are cumulative).
    fn send_credit(&mut self) {
        let (i, applied) = {
            let mut st = lock(&self.s.st);
            if !st.credit_owed || st.failure.is_some() {
                return;
            }
            let Some(i) = st.free_ctrl.pop() else { return };
            st.credit_owed = false;
            (i, st.next_apply)
        };
        let posted = {
            let mut port = lock(&self.s.port);
            // SAFETY: control slot `i` is ours (taken from the free list) and has room.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    Frame::Credit { applied }.encode().as_ptr(),
                    port.tx_ctrl.host(i),
                    HEADER_LEN,
                )
            };
            port.send_ctrl(i, HEADER_LEN)
        };
        match posted {
            Ok(Posted::Yes) => {}
            Ok(Posted::Again) => {
                let mut st = lock(&self.s.st);
                st.free_ctrl.push(i);
                st.credit_owed = true;
            }
            Err(e) => {
                self.s.fail(Failure::Call(e.to_string()));
            }
        }
    }

    /// Tells the peer why its frame was refused (best effort: one try).
    fn report(&mut self, reason: &str) {
        let Some(i) = lock(&self.s.st).free_ctrl.pop() else {
            return;
        };
        let mut end = reason.len().min(MAX_REASON);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        let body = &reason.as_bytes()[..end];
        let mut port = lock(&self.s.port);
        let frame = Frame::Error {
            len: body.len() as u64,
        }
        .encode();
        // SAFETY: control slot `i` is ours and has HEADER_LEN + MAX_REASON bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(frame.as_ptr(), port.tx_ctrl.host(i), HEADER_LEN);
            std::ptr::copy_nonoverlapping(
                body.as_ptr(),
                port.tx_ctrl.host(i).add(HEADER_LEN),
                body.len(),
            );
        }
        let _ = port.send_ctrl(i, HEADER_LEN + body.len());
    }

    /// A frame of the peer broke the protocol: tell it, fail, abort.
    fn protocol(&mut self, why: String) {
        self.report(&why);
        self.s.fail(Failure::Protocol(why));
    }
}
