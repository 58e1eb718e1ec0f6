//! One-sided host calls on windows (NCCL's `ncclPutSignal`, `ncclSignal`, `ncclWaitSignal`;
//! MSCCL++'s PortChannel model driven from the host): a rank writes into a peer's window and
//! raises one of the peer's signals, or waits until its own signals from a peer reach a count,
//! each in the order of the caller's stream, over the connections the collectives already
//! hold to every peer (CUDA IPC or shared memory in a node; libfabric, InfiniBand or Ethernet
//! between nodes).
//!
//! # Windows and signals
//!
//! [`OneSided::register`] is collective: every rank passes a buffer (any size, in the same
//! order), registered for the transport of each peer (the whole allocation, exported, for the
//! peers of this node; the range itself for the network transports) and traded with every
//! peer under its own tag. The first registration also sets up the signals: a table of
//! `ranks × SIGNAL_CONTEXTS × SIGNALS` u64 words in this rank's device memory, registered for
//! every transport in use and traded the same way. Word `(p, ctx, sig)` of rank `r`'s table
//! counts the signals `p` raised on `r` with index `sig` in context `ctx`: only `p` writes it
//! (through its connection's `update_and_sync`, which orders it after `p`'s earlier writes to
//! `r`), with the count itself, so no atomic is needed across the network; `r`'s streams read
//! it (a stream wait for a value).
//!
//! # How a call follows the stream
//!
//! A host thread (`mscclpp-rma`, the service) does the transfers; the stream only tells it when
//! to and waits for it, with two words per operation in host-mapped memory (a ring of
//! [`RING`] slots; slot `seq % RING` of operation `seq`): `put_signal` / `signal` queue on the
//! stream a write of `seq` into the slot's *go* word, then a wait until its *done* word
//! reaches `seq`. The service finds the go word set (it polls the go words of the operations
//! queued to it, backing off when idle), writes the data through the peer's connection, raises
//! the signal (`update_and_sync` of the next count), flushes (bounded by the connection), and
//! stores `seq` into the done word: the stream goes on, and its later work may reuse the
//! source buffer. `wait_signals` queues, per descriptor, a go word, a stream wait until the
//! signal word reaches the count awaited so far (`Stream::wait_value_u64`), and a done word;
//! the service watches it from its go word to its done word.
//!
//! Shared words: the go and done words (host-mapped; go written by the stream, read by the
//! service with acquire; done written by the service with release, read by the stream's
//! wait); the signal words (device memory; written by the peers' connections, read by this
//! rank's streams, and by the service only to release a wait); the counts of signals raised
//! and awaited per (peer, context, index) (host atomics and a mutex, written by the calling
//! threads in call order).
//!
//! # Bounded and abortable
//!
//! The service ends every wait it watches by writing `u64::MAX` into its signal word (the stream
//! goes on; the call is lost) when the communicator is aborted (a dead peer, `abort()`, a
//! revoke) or when the wait has run longer than the timeout (`MSCCLPP_ONE_SIDED_TIMEOUT_MS`,
//! 300 s by default); and ends every transfer it has not made when the communicator is
//! aborted. Either records the error (sticky: every later call returns it), aborts the
//! communicator if it was not, and still stores the done word, so no stream waits for ever.
//! The CPU backend's stream wait is bounded by itself as well (`WAIT_VALUE_LIMIT`).
//!
//! Windows are never freed while the collectives live (their registrations are held here), so
//! a transfer queued before a deregistration still finds its memory (NCCL's contract is that
//! no queued work uses a deregistered window anyway).

use mscclpp_host::error::ProxyError;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mscclpp_host::communicator::Communicator;
use mscclpp_host::connection::Connection;
use mscclpp_host::gpu::cpu::WAIT_VALUE_LIMIT;
use mscclpp_host::gpu::{DeviceBuffer, HostMapped, Stream};
use mscclpp_host::registered_memory::RegisteredMemory;
use mscclpp_host::transport::{Transport, TransportFlags};
use mscclpp_host::{Error, Result};
use mscclpp_shared::DevicePtr;

/// Signal indices per context.
pub const SIGNALS: usize = 8;
/// Signal contexts.
pub const SIGNAL_CONTEXTS: usize = 4;
/// Slots of the go / done ring (operations queued and not yet done, at most).
pub const RING: u64 = 1024;
/// Default of the waits' and transfers' timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// Environment variable of the timeout, in milliseconds.
pub const ENV_TIMEOUT: &str = "MSCCLPP_ONE_SIDED_TIMEOUT_MS";

/// Bootstrap tags of the set-up (windows and the signal table).
const TAG: u64 = 0x05e1_0000_0000;

/// A signal: its index and context (NCCL's `sigIdx`, `ctx`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Signal {
    /// Index, below [`SIGNALS`].
    pub index: usize,
    /// Context, below [`SIGNAL_CONTEXTS`].
    pub ctx: usize,
}

/// What [`OneSided::wait`] waits for: `count` more signals from `peer` on `signal`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SignalWait {
    /// The rank that raises them.
    pub peer: usize,
    /// Which signal.
    pub signal: Signal,
    /// How many more.
    pub count: u64,
}

/// A window of [`OneSided::register`], the same number on every rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Window(pub usize);

/// This rank's part of a window and the peers'.
struct WindowState {
    ptr: DevicePtr<u8>,
    len: usize,
    /// For the peers of this node: the whole allocation (exported) and the window's offset in it.
    local: Option<(RegisteredMemory, u64)>,
    /// For the peers across the network: the range itself.
    net: Option<RegisteredMemory>,
    /// Each peer's part: its memory, the window's offset in it, its length (`None`: this rank).
    peers: Vec<Option<(RegisteredMemory, u64, u64)>>,
}

/// The signal tables.
struct Signals {
    _table: DeviceBuffer,
    mine: RegisteredMemory,
    /// Each peer's table (`None`: this rank).
    peers: Vec<Option<RegisteredMemory>>,
}

/// A transfer the service makes.
struct Put {
    conn: Arc<dyn Connection>,
    /// (destination, offset, source, offset, bytes); `None` for a signal alone.
    data: Option<(RegisteredMemory, u64, RegisteredMemory, u64, u64)>,
    /// The peer's signal table, the word's offset, the count to store, and the local copy of
    /// the word (`update_and_sync`'s source).
    signal: (RegisteredMemory, u64, u64, usize),
}

enum Work {
    Put(Put),
    /// A stream waits on this signal word (its address) from go to done.
    Wait(DevicePtr<u64>),
}

struct Pending {
    seq: u64,
    work: Work,
    /// When the service saw its go word.
    started: Option<Instant>,
}

/// What the calling threads and the service share.
struct Shared {
    comm: Arc<Communicator>,
    /// `RING` go words, then `RING` done words.
    ring: HostMapped,
    pending: Mutex<Vec<Pending>>,
    wake: Condvar,
    stop: AtomicBool,
    error: Mutex<Option<Error>>,
    /// The timeout of waits and transfers, in milliseconds (relaxed: a setting).
    timeout_ms: AtomicU64,
    /// The local copies of the signal words this rank raised on each peer, per (peer, ctx,
    /// index): `update_and_sync`'s source, written by the service only.
    shadow: Vec<AtomicU64>,
    /// The stream the service releases waits with (CUDA: device memory is written by a copy).
    release: Stream,
}

/// One-sided calls of a `Collectives` (module docs).
pub(crate) struct OneSided {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    conns: Vec<Option<Arc<dyn Connection>>>,
    same_node: Vec<bool>,
    net: TransportFlags,
    signals: Signals,
    windows: Mutex<Vec<Option<WindowState>>>,
    /// Windows taken back, kept until the collectives are dropped (module docs).
    retired: Mutex<Vec<WindowState>>,
    /// Signals raised so far per (peer, ctx, index), counted by the calling threads.
    raised: Vec<AtomicU64>,
    /// Signals awaited so far per (peer, ctx, index).
    awaited: Mutex<Vec<u64>>,
    next_seq: AtomicU64,
}

/// What a slot's stream work is (`OneSided::queue`).
enum Stage {
    /// The service writes the done word; the stream waits for it.
    Service,
    /// The stream waits for the signal word to reach the count, then writes the done word.
    Signal(DevicePtr<u64>, u64),
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The word of `(peer, signal)` in a table.
fn word(peer: usize, s: Signal) -> usize {
    (peer * SIGNAL_CONTEXTS + s.ctx) * SIGNALS + s.index
}

impl OneSided {
    /// Sets up the signals (collective): `conns[q]` reaches rank `q` (`None` for this rank),
    /// `transports[q]` is its transport.
    pub fn new(
        comm: Arc<Communicator>,
        conns: Vec<Option<Arc<dyn Connection>>>,
        transports: Vec<Option<Transport>>,
    ) -> Result<Self> {
        let (me, n) = (comm.rank(), comm.size());
        let g = comm.gpu().clone();
        let local = Transport::local_for(g.kind());
        let same_node: Vec<bool> = (0..n).map(|q| comm.same_node(q)).collect();
        let all = transports
            .iter()
            .flatten()
            .fold(TransportFlags::empty(), |f, t| f.with(*t));
        let net = transports
            .iter()
            .flatten()
            .filter(|&&t| t != local)
            .fold(TransportFlags::empty(), |f, t| f.with(*t));
        let words = n * SIGNAL_CONTEXTS * SIGNALS;
        let table = g.alloc(words * 8)?;
        table.copy_from_host(0, &vec![0u8; words * 8])?;
        let mine = comm.register_buffer(&table, all.with(local))?;
        for q in (0..n).filter(|&q| q != me) {
            comm.send_memory(&mine, q, TAG)?;
        }
        let mut peers = vec![None; n];
        for (q, p) in peers.iter_mut().enumerate().filter(|(q, _)| *q != me) {
            *p = Some(comm.recv_memory(q, TAG)?);
        }
        let ring = g.alloc_host_mapped(2 * RING as usize * 8)?;
        // SAFETY: the mapping holds 2 RING u64, just allocated, written by nobody yet.
        unsafe { std::ptr::write_bytes(ring.host_ptr(), 0, ring.len()) };
        let timeout = std::env::var(ENV_TIMEOUT)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|&ms| ms > 0)
            .unwrap_or(DEFAULT_TIMEOUT.as_millis() as u64);
        let shared = Arc::new(Shared {
            release: g.stream()?,
            comm,
            ring,
            pending: Mutex::new(Vec::new()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            error: Mutex::new(None),
            timeout_ms: AtomicU64::new(timeout),
            shadow: (0..words).map(|_| AtomicU64::new(0)).collect(),
        });
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("mscclpp-rma".into())
            .spawn(move || s.serve_guarded())
            .map_err(|source| Error::Proxy(ProxyError::ProxyStart { source }))?;
        Ok(Self {
            shared,
            thread: Some(thread),
            conns,
            same_node,
            net,
            signals: Signals {
                _table: table,
                mine,
                peers,
            },
            windows: Mutex::new(Vec::new()),
            retired: Mutex::new(Vec::new()),
            raised: (0..words).map(|_| AtomicU64::new(0)).collect(),
            awaited: Mutex::new(vec![0; words]),
            next_seq: AtomicU64::new(1),
        })
    }

    /// Sets the timeout of waits and transfers (module docs; at least 1 ms).
    pub fn set_timeout(&self, timeout: Duration) {
        let ms = u64::try_from(timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        self.shared.timeout_ms.store(ms, Ordering::Relaxed);
    }

    /// Registers `[ptr, ptr + len)` as window number `windows so far` (collective: module
    /// docs).
    pub fn register(&self, ptr: DevicePtr<u8>, len: usize) -> Result<Window> {
        let comm = &self.shared.comm;
        let (me, n) = (comm.rank(), comm.size());
        let mut windows = locked(&self.windows);
        let id = windows.len();
        let tag = TAG + 1 + id as u64;
        let any_local = (0..n).any(|q| q != me && self.same_node[q]);
        let local = if any_local {
            let a = comm.gpu().allocation_of(ptr)?;
            let off = ptr.addr() - a.base.addr();
            Some((comm.register_allocation(&a)?, off))
        } else {
            None
        };
        let net = if self.net.is_empty() {
            None
        } else {
            Some(comm.register_raw(ptr, len, self.net)?)
        };
        for q in (0..n).filter(|&q| q != me) {
            let (mem, off) = match (&local, &net) {
                (Some((m, off)), _) if self.same_node[q] => (m, *off),
                (_, Some(m)) => (m, 0),
                (Some((m, off)), None) => (m, *off),
                (None, None) => {
                    return Err(Error::RegisterNoTransport {
                        addr: ptr.addr(),
                        size: len,
                    });
                }
            };
            comm.send_memory(mem, q, tag)?;
            let mut word = [0u8; 16];
            word[..8].copy_from_slice(&off.to_le_bytes());
            word[8..].copy_from_slice(&(len as u64).to_le_bytes());
            comm.bootstrap().send(q, TAG | 1 << 40 | id as u64, &word)?;
        }
        let mut peers = vec![None; n];
        for (q, p) in peers.iter_mut().enumerate().filter(|(q, _)| *q != me) {
            let mem = comm.recv_memory(q, tag)?;
            let word = comm.recv_checked(q, TAG | 1 << 40 | id as u64)?;
            let field = |at: usize| {
                word.get(at..at + 8)
                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .map(u64::from_le_bytes)
            };
            let (Some(off), Some(l)) = (field(0), field(8)) else {
                return Err(Error::MalformedMemory {
                    rank: q,
                    reason: format!("a window's offset and length in {} bytes", word.len()),
                });
            };
            // The peer's part must lie inside what it registered (checked by size: memory of
            // another node is not mapped here).
            if off.checked_add(l).is_none_or(|end| end > mem.size() as u64) {
                return Err(Error::MalformedMemory {
                    rank: q,
                    reason: format!(
                        "a window of {l} bytes at {off} in a registration of {} bytes",
                        mem.size()
                    ),
                });
            }
            *p = Some((mem, off, l));
        }
        windows.push(Some(WindowState {
            ptr,
            len,
            local,
            net,
            peers,
        }));
        Ok(Window(id))
    }

    /// Takes back a window (collective, ends with a barrier): later calls naming it are
    /// refused. Its registrations are kept until these collectives are dropped (module docs).
    pub fn deregister(&self, w: Window) -> Result<()> {
        let taken = locked(&self.windows)
            .get_mut(w.0)
            .and_then(Option::take)
            .ok_or(self.unknown(w))?;
        // Kept alive: a transfer already queued may still name it.
        locked(&self.retired).push(taken);
        self.shared.comm.barrier()
    }

    fn unknown(&self, w: Window) -> Error {
        Error::UnknownRegistration {
            slot: w.0,
            generation: 0,
        }
    }

    /// The sticky error of the service, or the communicator's.
    fn check(&self) -> Result<()> {
        if let Some(e) = locked(&self.shared.error).as_ref() {
            return Err(Error::Aborted {
                reason: format!("an earlier one-sided call failed: {e}"),
            });
        }
        match self.shared.comm.async_error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn check_signal(&self, peer: usize, s: Signal) -> Result<()> {
        let n = self.shared.comm.size();
        if peer >= n {
            return Err(Error::NoSuchRank {
                rank: peer,
                size: n,
            });
        }
        if peer == self.shared.comm.rank() {
            return Err(Error::PeerIsSelf { rank: peer });
        }
        if s.index >= SIGNALS || s.ctx >= SIGNAL_CONTEXTS {
            return Err(Error::OutOfRange {
                offset: word(0, s),
                len: 1,
                size: SIGNALS * SIGNAL_CONTEXTS,
            });
        }
        Ok(())
    }

    /// Queues on `stream`: `bytes` from `src` (inside one of this rank's windows) into
    /// `peer`'s part of `window` at `offset`, then one signal `signal` on `peer` (NCCL's
    /// `ncclPutSignal`; `bytes` 0: the signal alone, `ncclSignal`).
    ///
    /// # Safety
    /// `src` holds `bytes` until the work queued on `stream` completes.
    pub unsafe fn put_signal(
        &self,
        src: DevicePtr<u8>,
        bytes: usize,
        peer: usize,
        window: Option<(Window, u64)>,
        signal: Signal,
        stream: &Stream,
    ) -> Result<()> {
        self.check()?;
        self.check_signal(peer, signal)?;
        let conn = self.conns[peer].clone().ok_or(Error::NoSuchRank {
            rank: peer,
            size: self.conns.len(),
        })?;
        let data = match window {
            Some((w, offset)) if bytes > 0 => Some(self.transfer(src, bytes, peer, w, offset)?),
            _ => None,
        };
        let me = self.shared.comm.rank();
        let theirs = self.signals.peers[peer].clone().ok_or(Error::NoSuchRank {
            rank: peer,
            size: self.conns.len(),
        })?;
        let at = word(me, signal);
        let raised = word(peer, signal);
        let count = self.raised[raised].fetch_add(1, Ordering::Relaxed) + 1;
        let put = Put {
            conn,
            data,
            signal: (theirs, at as u64 * 8, count, raised),
        };
        self.queue(Work::Put(put), stream, Stage::Service)
    }

    /// The destination and source of a transfer (checked against both windows).
    fn transfer(
        &self,
        src: DevicePtr<u8>,
        bytes: usize,
        peer: usize,
        w: Window,
        offset: u64,
    ) -> Result<(RegisteredMemory, u64, RegisteredMemory, u64, u64)> {
        let windows = locked(&self.windows);
        let dst = windows
            .get(w.0)
            .and_then(Option::as_ref)
            .ok_or(self.unknown(w))?;
        let (dmem, doff, dlen) = dst.peers[peer].clone().ok_or(self.unknown(w))?;
        let end = offset.checked_add(bytes as u64);
        if end.is_none_or(|e| e > dlen) {
            return Err(Error::OutOfRange {
                offset: offset as usize,
                len: bytes,
                size: dlen as usize,
            });
        }
        let inside = |s: &WindowState| {
            src.addr() >= s.ptr.addr() && src.addr() + bytes as u64 <= s.ptr.addr() + s.len as u64
        };
        let mine = windows
            .iter()
            .flatten()
            .find(|s| inside(s))
            .ok_or(Error::NotRegistrable {
                ptr: src.addr(),
                len: bytes,
                reason: "a one-sided call's source must lie inside one window of this rank \
                         (ncclCommWindowRegister)"
                    .into(),
            })?;
        let within = src.addr() - mine.ptr.addr();
        let (smem, soff) = match (&mine.local, &mine.net) {
            (Some((m, off)), _) if self.same_node[peer] => (m.clone(), off + within),
            (_, Some(m)) => (m.clone(), within),
            (Some((m, off)), None) => (m.clone(), off + within),
            (None, None) => {
                return Err(Error::RegisterNoTransport {
                    addr: src.addr(),
                    size: bytes,
                });
            }
        };
        Ok((dmem, doff + offset, smem, soff, bytes as u64))
    }

    /// Queues on `stream` a wait until every descriptor's signals have come (NCCL's
    /// `ncclWaitSignal`: each waits for `count` more than the waits before it).
    pub fn wait(&self, waits: &[SignalWait], stream: &Stream) -> Result<()> {
        self.check()?;
        for w in waits {
            self.check_signal(w.peer, w.signal)?;
        }
        let table = self
            .signals
            .mine
            .range(0, self.signals.mine.size() as u64)?;
        for w in waits {
            let i = word(w.peer, w.signal);
            let expected = {
                let mut a = locked(&self.awaited);
                a[i] = a[i].saturating_add(w.count);
                a[i]
            };
            let addr: DevicePtr<u64> = table.byte_add_cast(i as u64 * 8);
            self.queue(Work::Wait(addr), stream, Stage::Signal(addr, expected))?;
        }
        Ok(())
    }

    /// Queues `work` on `stream` as ring slot `seq % RING`: the go word, then what `stage`
    /// says (module docs).
    fn queue(&self, work: Work, stream: &Stream, stage: Stage) -> Result<()> {
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let deadline = Instant::now() + self.shared.timeout();
        let mut pending = locked(&self.shared.pending);
        while pending.iter().any(|p| seq.saturating_sub(p.seq) >= RING) {
            if Instant::now() > deadline {
                return Err(Error::Aborted {
                    reason: format!("{RING} one-sided calls are still queued"),
                });
            }
            pending = self
                .shared
                .wake
                .wait_timeout(pending, Duration::from_millis(10))
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        pending.push(Pending {
            seq,
            work,
            started: None,
        });
        drop(pending);
        self.shared.wake.notify_all();
        let (go, done) = self.shared.slot_words(seq);
        // SAFETY: both words lie in the ring and the signal word in this rank's table, alive
        // while `self` is (the service and `self` keep them).
        unsafe {
            stream.write_value_u64(go, seq)?;
            match stage {
                Stage::Service => stream.wait_value_u64(done, seq, WAIT_VALUE_LIMIT),
                Stage::Signal(word, count) => {
                    stream.wait_value_u64(word, count, WAIT_VALUE_LIMIT)?;
                    stream.write_value_u64(done, seq)
                }
            }
        }
    }
}

impl Drop for OneSided {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Shared {
    /// The device addresses of slot `seq % RING`'s go and done words.
    fn slot_words(&self, seq: u64) -> (DevicePtr<u64>, DevicePtr<u64>) {
        let base = self.ring.device_ptr();
        let i = seq % RING;
        (
            base.byte_add_cast(i * 8),
            base.byte_add_cast((RING + i) * 8),
        )
    }

    /// The host view of word `i` of the ring.
    fn ring_word(&self, i: u64) -> &AtomicU64 {
        // SAFETY: `i < 2 RING`, inside the mapping (8-byte aligned, alive while `self` is);
        // the words are only ever accessed atomically by the host.
        unsafe { AtomicU64::from_ptr((self.ring.host_ptr() as *mut u64).add(i as usize)) }
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed))
    }

    /// Records the first failure and aborts the communicator.
    fn fail(&self, e: Error) {
        let mut err = locked(&self.error);
        if err.is_none() {
            tracing::error!("one-sided calls of rank {}: {e}", self.comm.rank());
            *err = Some(e);
        }
        drop(err);
        self.comm.abort();
    }

    /// [`serve`](Self::serve); should it panic (a bug), the failure is recorded, the
    /// communicator aborted and every stream that waits for this thread released, so nothing
    /// waits for a thread that is gone.
    fn serve_guarded(&self) {
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.serve()));
        if run.is_ok() {
            return;
        }
        self.fail(Error::Aborted {
            reason: "the one-sided calls' service thread panicked".into(),
        });
        let pending = std::mem::take(&mut *locked(&self.pending));
        for p in pending {
            match p.work {
                Work::Wait(word) => self.release(word, false),
                Work::Put(_) => self
                    .ring_word(RING + p.seq % RING)
                    .store(p.seq, Ordering::Release),
            }
        }
    }

    /// The service's loop (module docs).
    fn serve(&self) {
        let mut backoff = mscclpp_host::backoff::Backoff::new();
        while !self.stop.load(Ordering::Acquire) {
            let mut pending = locked(&self.pending);
            if pending.is_empty() {
                let (g, _) = self
                    .wake
                    .wait_timeout(pending, Duration::from_millis(50))
                    .unwrap_or_else(|p| p.into_inner());
                drop(g);
                continue;
            }
            let aborted = self.comm.status().is_aborted();
            let timeout = self.timeout();
            let mut taken = Vec::new();
            let mut kept = Vec::with_capacity(pending.len());
            for mut p in pending.drain(..) {
                let i = p.seq % RING;
                let go = self.ring_word(i).load(Ordering::Acquire) == p.seq;
                if go && p.started.is_none() {
                    p.started = Some(Instant::now());
                }
                let take = match &p.work {
                    // Made (or, aborted, given up) by this thread below.
                    Work::Put(_) => go || aborted,
                    Work::Wait(word) => {
                        let done = self.ring_word(RING + i).load(Ordering::Acquire) == p.seq;
                        let late = p.started.is_some_and(|t| t.elapsed() > timeout);
                        if !done && go && (aborted || late) {
                            self.release(*word, late);
                        }
                        done || (go && (aborted || late))
                    }
                };
                if take {
                    taken.push(p);
                } else {
                    kept.push(p);
                }
            }
            *pending = kept;
            let idle = taken.is_empty();
            drop(pending);
            for p in taken {
                if let Work::Put(put) = p.work {
                    self.put(put, aborted);
                    self.ring_word(RING + p.seq % RING)
                        .store(p.seq, Ordering::Release);
                }
            }
            self.wake.notify_all();
            if idle {
                backoff.snooze();
            } else {
                backoff = mscclpp_host::backoff::Backoff::new();
            }
        }
    }

    /// Makes one transfer and its signal, unless the communicator is aborted.
    fn put(&self, p: Put, aborted: bool) {
        if aborted || locked(&self.error).is_some() {
            self.fail(Error::Aborted {
                reason: "a one-sided transfer was not made: the communicator was aborted".into(),
            });
            return;
        }
        let peer = p.conn.remote_rank();
        let done = (|| -> Result<()> {
            if let Some((dst, doff, src, soff, bytes)) = &p.data {
                p.conn.write(dst, *doff, src, *soff, *bytes)?;
            }
            let (table, at, count, i) = &p.signal;
            p.conn
                .update_and_sync(table, *at, &self.shadow[*i], *count)?;
            p.conn.flush(self.timeout())
        })();
        if let Err(e) = done {
            self.fail(Error::Remote {
                rank: peer,
                reason: format!("a one-sided transfer to it failed: {e}"),
            });
        }
    }

    /// Ends a stream's wait on `word` (module docs).
    fn release(&self, word: DevicePtr<u64>, late: bool) {
        // SAFETY: the word lies in this rank's signal table, alive while the service runs.
        let r = unsafe { self.release.write_value_u64(word, u64::MAX) };
        if let Err(e) = r {
            tracing::error!("one-sided calls: releasing a stream's wait failed: {e}");
        }
        self.fail(if late {
            Error::Aborted {
                reason: format!(
                    "a one-sided wait for signals ran longer than {:?} ({ENV_TIMEOUT})",
                    self.timeout()
                ),
            }
        } else {
            Error::Aborted {
                reason: "a one-sided wait was ended: the communicator was aborted".into(),
            }
        });
    }
}
