//! The port collective (`port_collective_kernel`) with a test proxy: every mode of its table
//! (the masks as the host sets them, and others: groups, one-way sends, a reduction that
//! receives from no one), data of several pieces (the acknowledgement waits, both receive
//! slots), odd sizes and unaligned buffers, every type and operator of its reductions, launches
//! back to back (the piece counters carried over), and what it refuses.
//!
//! # The test proxy
//!
//! The kernel's thread 0 pushes triggers into its rank's FIFO; the host's `PortChannelService`
//! serves them. This crate cannot use the host crate, so [`Proxy::serve`] stands in for it: a
//! host thread per rank for the duration of each launch, which pops that rank's FIFO in order
//! and serves every trigger at once, on its own thread:
//!
//! - DATA: copies `size` bytes from `src_offset` of the rank's scratch (memory id 0, every
//!   channel's `src`) to `dst_offset` of peer `q`'s (memory id `1 + q`, the `dst` of channels
//!   `2q` and `2q + 1`), offsets and size checked against the scratch. The copy is done when
//!   the trigger is served, so a flush has nothing to wait for.
//! - FLAG: adds a token to the inbound word of the peer's channel back to this rank:
//!   semaphore id `k` is channel `k` of this rank (`2q` data, `2q + 1` acknowledgement to `q`),
//!   and its peer channel is `2 r + (k & 1)` of rank `q`.
//! - SYNC: completes the flush: `flush_done_pos = pos + 1`.
//!
//! Anything else a trigger says (an unknown semaphore or memory, a range outside the scratch,
//! no type) is reported and not served. Who writes and reads each word:
//!
//! | word | written by | read by | ordering |
//! |---|---|---|---|
//! | `triggers[FIFO]` | the kernel's thread 0 (`FifoDevice::push`, one 16-byte release store per slot) | the proxy | acquire load of `snd` (ready when its commit bit is the lap parity of `tail`), then `fst` |
//! | `head`, `tail_cache` | the kernel (`push`) | the kernel; the proxy reads `head` once the kernels ended, to drain | relaxed; the launch's join orders the proxy's read |
//! | `tail` | the proxy: `tail + 1` after serving a trigger | the kernel, when the FIFO is full | release / acquire |
//! | `flush_done_pos` | the proxy: `pos + 1` after a SYNC at `pos` | the kernel's `flush` | release / acquire |
//! | `inbound[k]` | the proxy of the peer of channel `k` (FLAG) | the kernel's waits | `fetch_add` release / `ld.acquire` |
//! | `expected[k]`, `counters` | the kernel only (thread 0) | the kernel; the host between launches | launches are joined |
//!
//! A proxy stops when the launch's kernels have ended and it has served every trigger they
//! pushed (the last acknowledgements are pushed just before a kernel ends), or after
//! [`PROXY_LIMIT`] (a failure); the launch's watchdog bounds the kernels.

use std::boxed::Box;
use std::format;
use std::string::String;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use std::vec;
use std::vec::Vec;

use super::call::{Buffers, Call, EVERY_REDUCTION, buffers};
use super::peek::write;
use super::world::{MARK, World, reduce};
use crate::collectives::port_collective_kernel;
use mscclpp_shared::trigger::commit_parity;
use mscclpp_shared::{
    CollectiveMode as M, DataType, DevicePtr, DeviceReduceOp as Op, DeviceStatus, FifoDeviceHandle,
    Host2DeviceSemaphoreDeviceHandle, PortChannelDeviceHandle, PortCollectiveParams, ProxyTrigger,
    TriggerType,
};

/// Slots of every FIFO: fewer than the triggers of one piece on four ranks (a put and a flush
/// per peer sent to, an acknowledgement per peer received from), so pushes wait for the
/// proxy and the slots wrap.
const FIFO: usize = 8;
const LOG2_FIFO: u32 = 3;
/// Bytes of a slot of the port region: the largest piece.
const SLOT: u64 = 256;
/// Offset of the port region in every scratch (not 0: a kernel that ignores it shows).
const PORT: u64 = 2048;
/// Threads of the kernel's one block.
const THREADS: u32 = 32;
/// Longest a proxy runs (the launch's watchdog stops the kernels well before).
const PROXY_LIMIT: Duration = Duration::from_secs(20);
/// After the kernels ended, longest a proxy waits for a trigger that was counted but not
/// written (a push that gave up).
const DRAIN_LIMIT: Duration = Duration::from_secs(1);
/// What the inputs hold around their data (not [`MARK`]).
const TAIL: u8 = !MARK;
/// Five pieces, the last of 180 bytes; whole f32 (and i32).
const PIECES5: u64 = 4 * 301;

/// One FIFO's words (host memory standing in for the pinned and device words).
#[repr(C, align(16))]
struct Fifo {
    /// `FIFO` triggers, as (`fst`, `snd`) pairs.
    triggers: [AtomicU64; 2 * FIFO],
    head: AtomicU64,
    tail_cache: AtomicU64,
    tail: AtomicU64,
    flush_done: AtomicU64,
}

/// One rank's port words.
struct Rank {
    fifo: Box<Fifo>,
    /// Per channel (`2q` data, `2q + 1` acknowledgement): tokens the peer's proxy added.
    inbound: Vec<AtomicU64>,
    /// Per channel: tokens this rank's kernel took.
    expected: Vec<AtomicU64>,
    /// The kernel's piece counters (`2q` sent to `q`, `2q + 1` received from `q`).
    counters: Vec<AtomicU64>,
    table: Vec<PortChannelDeviceHandle>,
    /// What the counters must say: pieces sent to and received from every peer so far.
    tally: Vec<u64>,
}

fn zeros(n: usize) -> Vec<AtomicU64> {
    (0..n).map(|_| AtomicU64::new(0)).collect()
}

/// A world with a FIFO, channels, semaphores and counters per rank, as the host's multi-node
/// set-up builds them.
struct Ports {
    w: World,
    /// The ranks the kernels are told of (`PortCollectiveParams::common.nranks`): the
    /// world's, or more (the kernels then meet only the world's, as the masks say).
    nranks: u32,
    ranks: Vec<Rank>,
}

/// What the proxies of one launch use: every rank's port words and scratch (not the world,
/// which its raw pointers keep on the test's thread).
struct Proxy<'a> {
    ranks: &'a [Rank],
    /// Every rank's scratch, [`Proxy::len`] bytes each.
    scratch: Vec<DevicePtr<u8>>,
    len: u64,
}

impl Proxy<'_> {
    /// Serves rank `r`'s FIFO (module docs) until `stop` and drained; returns the triggers
    /// served, or what went wrong (a trigger it refused is reported at once on stderr too:
    /// the kernel then waits until the watchdog, whose panic would hide it).
    fn serve(&self, r: usize, stop: &AtomicBool, errors: &Mutex<Vec<String>>) -> u64 {
        let f = &self.ranks[r].fifo;
        let mut tail = f.tail.load(Ordering::Relaxed);
        let (mut served, mut idle) = (0u64, 0u32);
        let start = Instant::now();
        let mut stopped: Option<Instant> = None;
        let fail = |e: String| {
            std::eprintln!("test proxy: {e}");
            errors.lock().unwrap().push(e);
        };
        loop {
            let slot = (tail as usize) & (FIFO - 1);
            let snd = f.triggers[2 * slot + 1].load(Ordering::Acquire);
            if snd >> 63 == commit_parity(tail, LOG2_FIFO) {
                let fst = f.triggers[2 * slot].load(Ordering::Relaxed);
                if let Err(e) = self.apply(r, ProxyTrigger { fst, snd }, tail) {
                    fail(format!("rank {r}, trigger {tail}: {e}"));
                }
                tail += 1;
                f.tail.store(tail, Ordering::Release);
                served += 1;
                idle = 0;
                continue;
            }
            if stop.load(Ordering::Acquire) {
                if tail >= f.head.load(Ordering::Relaxed) {
                    return served;
                }
                let since = *stopped.get_or_insert_with(Instant::now);
                if since.elapsed() > DRAIN_LIMIT {
                    fail(format!(
                        "rank {r}: trigger {tail} counted but never written"
                    ));
                    return served;
                }
            }
            if start.elapsed() > PROXY_LIMIT {
                fail(format!("rank {r}: still serving after {PROXY_LIMIT:?}"));
                return served;
            }
            idle += 1;
            if idle < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }

    /// Serves trigger `t` popped at `pos` of rank `r`'s FIFO (module docs).
    fn apply(&self, r: usize, t: ProxyTrigger, pos: u64) -> Result<(), String> {
        let n = self.scratch.len();
        let f = t.fields();
        let k = f.semaphore_id as usize;
        let q = k / 2;
        if k >= 2 * n || q == r {
            return Err(format!("semaphore {k}: no channel of rank {r}: {f:?}"));
        }
        if f.src_memory_id != 0 || f.dst_memory_id != 1 + q as u32 {
            return Err(format!("memories {f:?} on channel {k}"));
        }
        if f.kind.is_empty() {
            return Err(format!("no type: {f:?}"));
        }
        if f.kind.contains(TriggerType::DATA) {
            let len = self.len;
            if f.src_offset + f.size > len || f.dst_offset + f.size > len {
                return Err(format!("outside the scratch of {len} bytes: {f:?}"));
            }
            let (src, dst) = (self.scratch[r].as_ptr(), self.scratch[q].as_ptr());
            // SAFETY: both ranges lie inside live scratch buffers of different ranks (checked
            // above), which the kernels only touch in the regions the protocol gives them.
            unsafe {
                core::ptr::copy_nonoverlapping(
                    src.add(f.src_offset as usize),
                    dst.add(f.dst_offset as usize),
                    f.size as usize,
                )
            };
        }
        if f.kind.contains(TriggerType::FLAG) {
            self.ranks[q].inbound[2 * r + (k & 1)].fetch_add(1, Ordering::Release);
        }
        if f.kind.contains(TriggerType::SYNC) {
            self.ranks[r]
                .fifo
                .flush_done
                .store(pos + 1, Ordering::Release);
        }
        Ok(())
    }
}

/// Sets the flag when dropped: the proxies stop even when the launch panics.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Pointer to a word the kernel reads and writes.
fn dev(a: &AtomicU64) -> DevicePtr<u64> {
    DevicePtr::from_ptr(a.as_ptr())
}

impl Ports {
    fn new(n: u32) -> Self {
        Self::with_ranks(n, n)
    }

    /// `n` ranks that tell the kernel of `nranks`.
    fn with_ranks(n: u32, nranks: u32) -> Self {
        let w = World::new(n, 1);
        assert!(PORT + (3 * nranks as u64 + 1) * SLOT <= w.scratch(0).len() as u64);
        let cells = 2 * nranks as usize;
        let mut ranks: Vec<Rank> = (0..n)
            .map(|_| Rank {
                fifo: Box::new(Fifo {
                    triggers: core::array::from_fn(|_| AtomicU64::new(0)),
                    head: AtomicU64::new(0),
                    tail_cache: AtomicU64::new(0),
                    tail: AtomicU64::new(0),
                    flush_done: AtomicU64::new(0),
                }),
                inbound: zeros(cells),
                expected: zeros(cells),
                counters: zeros(cells),
                table: Vec::new(),
                tally: vec![0; cells],
            })
            .collect();
        for (r, rank) in ranks.iter_mut().enumerate() {
            let status = w.params(r as u32, 0, 0).status;
            let f = &rank.fifo;
            let fifo = FifoDeviceHandle {
                triggers: DevicePtr::from_ptr(f.triggers[0].as_ptr() as *mut ProxyTrigger),
                tail: dev(&f.tail),
                head: dev(&f.head),
                tail_cache: dev(&f.tail_cache),
                flush_done_pos: dev(&f.flush_done),
                status,
                size: FIFO as u32,
                log2_size: LOG2_FIFO,
            };
            rank.table = (0..cells)
                .map(|k| PortChannelDeviceHandle {
                    semaphore_id: k as u32,
                    dst: 1 + k as u32 / 2,
                    src: 0,
                    reserved: 0,
                    semaphore: Host2DeviceSemaphoreDeviceHandle {
                        inbound: dev(&rank.inbound[k]),
                        expected: dev(&rank.expected[k]),
                        status,
                    },
                    fifo,
                })
                .collect();
        }
        Self { w, nranks, ranks }
    }

    /// Rank `r`'s port parameters for `common`.
    fn params(
        &self,
        common: mscclpp_shared::CollectiveParams,
        send: u64,
        recv: u64,
    ) -> PortCollectiveParams {
        let rank = &self.ranks[common.rank as usize];
        PortCollectiveParams {
            common: mscclpp_shared::CollectiveParams {
                nranks: self.nranks,
                ..common
            },
            port_channels: DevicePtr::from_ptr(rank.table.as_ptr() as *mut PortChannelDeviceHandle),
            counters: dev(&rank.counters[0]),
            send_mask: send,
            recv_mask: recv,
            port_offset: PORT,
            slot_bytes: SLOT,
        }
    }

    /// Launches `params` (one rank each) with every rank's proxy running, and returns every
    /// rank's status; panics if a proxy refused a trigger, or unless every counter and
    /// semaphore says what the launches so far did (`pieces`: what each launched rank moves
    /// per peer in its masks; 0 for a launch that must do nothing).
    fn launch(&mut self, params: &[PortCollectiveParams], pieces: u64) -> Vec<DeviceStatus> {
        let stop = AtomicBool::new(false);
        let errors = Mutex::new(Vec::new());
        let proxy = Proxy {
            ranks: &self.ranks,
            scratch: (0..self.w.n)
                .map(|r| self.w.params(r, 0, 0).scratch)
                .collect(),
            len: self.w.scratch(0).len() as u64,
        };
        let st = std::thread::scope(|s| {
            for r in 0..self.w.n as usize {
                let (proxy, stop, errors) = (&proxy, &stop, &errors);
                s.spawn(move || proxy.serve(r, stop, errors));
            }
            let _stop = StopOnDrop(&stop);
            self.w
                .try_launch(port_collective_kernel, params, 1, THREADS, 0)
        });
        // No kernel wrote a scratch outside its port region.
        let end = (PORT + (3 * self.nranks as u64 + 1) * SLOT) as usize;
        for r in 0..self.w.n {
            let s = self.w.scratch(r);
            let bad = (0..PORT as usize).chain(end..s.len()).find(|&i| s[i] != 0);
            assert!(
                bad.is_none(),
                "rank {r}'s scratch written at {bad:?}, outside the port region"
            );
        }
        let errors = errors.into_inner().unwrap();
        assert!(
            errors.is_empty(),
            "the test proxy refused triggers: {errors:?}"
        );
        let n = self.w.n as usize;
        for p in params {
            let r = p.common.rank as usize;
            for q in (0..n).filter(|&q| q != r) {
                if p.send_mask >> q & 1 == 1 {
                    self.ranks[r].tally[2 * q] += pieces;
                }
                if p.recv_mask >> q & 1 == 1 {
                    self.ranks[r].tally[2 * q + 1] += pieces;
                }
            }
        }
        for (r, rank) in self.ranks.iter().enumerate() {
            let load = |v: &[AtomicU64]| -> Vec<u64> {
                v.iter().map(|a| a.load(Ordering::Relaxed)).collect()
            };
            let (inb, exp) = (load(&rank.inbound), load(&rank.expected));
            assert_eq!(
                load(&rank.counters),
                rank.tally,
                "rank {r}'s piece counters"
            );
            for q in (0..n).filter(|&q| q != r) {
                // Every data signal was taken, once; every piece sent was acknowledged, and
                // the sender took all acknowledgements but those of its last two pieces.
                assert_eq!(inb[2 * q], exp[2 * q], "rank {r}: data tokens from {q}");
                let sent = rank.tally[2 * q];
                assert_eq!(inb[2 * q + 1], sent, "rank {r}: acknowledgements from {q}");
                assert_eq!(
                    exp[2 * q + 1],
                    sent.saturating_sub(2),
                    "rank {r}: acknowledgements taken from {q}"
                );
            }
        }
        st
    }
}

/// The distance of `c`'s parts.
fn stride_of(c: &Call) -> usize {
    (if c.stride == 0 { c.bytes } else { c.stride }) as usize
}

/// Part `p` of rank `r`'s input data in `b` (the inputs are never written: `Buffers::check`).
fn part(b: &Buffers, c: &Call, r: u32, p: u32) -> Vec<u8> {
    let at = c.offset as usize + p as usize * stride_of(c);
    b.inputs[r as usize].get()[at..at + c.bytes as usize].to_vec()
}

/// [`buffers`] of `c`, every input's usable bytes before and after its data set to [`TAIL`],
/// so that a copy longer than a part carries something else than a marker into the output.
fn call_buffers(w: &World, c: &Call) -> Buffers {
    let b = buffers(w, c, false);
    let parts = match c.mode {
        M::ReduceScatter | M::AllToAll => w.n as usize,
        _ => 1,
    };
    let (start, end) = (
        c.offset as usize,
        c.offset as usize + stride_of(c) * (parts - 1) + c.bytes as usize,
    );
    for input in &b.inputs {
        let len = input.get().len();
        write(input, 0, &vec![TAIL; start]);
        write(input, end, &vec![TAIL; len - end]);
    }
    b
}

/// The host's share of call `c` on rank `r` before the launch: a rank's own part of an
/// all-gather or all-to-all, a broadcast root's output (`algo/port.rs` copies them).
fn host_share(b: &Buffers, c: &Call, r: u32) {
    let stride = stride_of(c);
    let (at, p) = match c.mode {
        M::AllGather => (r as usize * stride, 0),
        M::AllToAll => (r as usize * stride, r),
        M::Broadcast if r == c.root => (0, 0),
        _ => return,
    };
    write(
        &b.outputs[r as usize],
        c.offset as usize + at,
        &part(b, c, r, p),
    );
}

/// The masks the host gives rank `r` of `n` for `c`'s mode: everyone, or a broadcast's root
/// sends and the others receive from it.
fn masks(c: &Call, n: u32, r: u32) -> (u64, u64) {
    let all = ((1u64 << n) - 1) & !(1 << r);
    match c.mode {
        M::Broadcast if r == c.root => (all, 0),
        M::Broadcast => (0, 1 << c.root),
        _ => (all, all),
    }
}

/// Pieces of a call of `bytes` per peer.
fn pieces(bytes: u64) -> u64 {
    bytes.div_ceil(SLOT)
}

/// Runs `c` on every rank with the host's masks and checks every output (`Buffers::check`).
fn run(ports: &mut Ports, c: Call) {
    let n = ports.w.n;
    let b = call_buffers(&ports.w, &c);
    for r in 0..n {
        host_share(&b, &c, r);
    }
    let params: Vec<PortCollectiveParams> = (0..n)
        .map(|r| {
            let (s, v) = masks(&c, n, r);
            ports.params(b.params[r as usize], s, v)
        })
        .collect();
    let st = ports.launch(&params, pieces(c.bytes));
    assert!(st.iter().all(|s| s.error_code == 0), "{c:?}: {st:?}");
    let all: Vec<u32> = (0..n).collect();
    b.check(&ports.w, &c, &all);
}

#[test]
fn every_mode_of_the_table_on_three_and_four_ranks() {
    for n in [3, 4] {
        let mut ports = Ports::new(n);
        let mut seed = 10 * n;
        // One piece, a short piece, five pieces; odd sizes where nothing reduces.
        for (bytes, odd) in [(PIECES5, 1001), (64, 13), (SLOT, SLOT + 3)] {
            for (mode, bytes) in [
                (M::AllReduce, bytes),
                (M::ReduceScatter, bytes),
                (M::AllGather, odd),
                (M::AllToAll, odd),
            ] {
                for stride in [0, bytes.next_multiple_of(16) + 40] {
                    seed += 1;
                    let stride = if mode == M::AllReduce { 0 } else { stride };
                    run(&mut ports, Call::new(mode, bytes).stride(stride).seed(seed));
                }
            }
            for root in 0..n {
                seed += 1;
                run(
                    &mut ports,
                    Call::new(M::Broadcast, odd).root(root).seed(seed),
                );
            }
        }
    }
}

#[test]
fn unaligned_buffers() {
    let mut ports = Ports::new(3);
    for (k, offset) in [1u64, 4, 12].into_iter().enumerate() {
        for mode in [M::AllReduce, M::AllGather, M::AllToAll, M::ReduceScatter] {
            let c = Call::new(mode, 4 * 150).offset(offset).seed(k as u32 + 40);
            run(&mut ports, c);
        }
    }
}

#[test]
fn every_type_and_operator_of_the_reductions() {
    let mut ports = Ports::new(3);
    let cases = EVERY_REDUCTION;
    for (k, (dtype, op, scalar)) in cases.into_iter().enumerate() {
        for mode in [M::AllReduce, M::ReduceScatter] {
            let c = Call::new(mode, PIECES5)
                .with(dtype, op)
                .scalar(scalar)
                .seed(k as u32 + 50);
            run(&mut ports, c);
        }
    }
}

/// Launches `c` with `masks[r]` on every rank that has one; returns the buffers.
fn run_masked(ports: &mut Ports, c: Call, masks: &[Option<(u64, u64)>]) -> Buffers {
    let b = call_buffers(&ports.w, &c);
    let params: Vec<PortCollectiveParams> = masks
        .iter()
        .enumerate()
        .filter_map(|(r, m)| m.map(|(s, v)| ports.params(b.params[r], s, v)))
        .collect();
    let st = ports.launch(&params, pieces(c.bytes));
    assert!(st.iter().all(|s| s.error_code == 0), "{c:?}: {st:?}");
    b
}

/// Panics unless rank `r`'s output holds `want` and nothing else was written.
fn expect(b: &Buffers, r: u32, want: &[u8], what: &str) {
    let got = b.output(r);
    got.check_slack(what);
    let got = got.get();
    assert_eq!(&got[..want.len()], want, "{what}: rank {r}");
    let end = want.len().next_multiple_of(16).min(got.len());
    assert!(
        got[end..].iter().all(|&x| x == MARK),
        "{what}: rank {r} written past its part"
    );
}

#[test]
fn the_masks_choose_the_peers() {
    let mut ports = Ports::new(4);
    let bit = |q: u32| 1u64 << q;
    for (k, (dtype, op, scalar)) in [
        (DataType::F32, Op::Sum, 0),
        (DataType::F32, Op::PreMulSum, 0.5f32.to_bits()),
        (DataType::I32, Op::Max, 0),
    ]
    .into_iter()
    .enumerate()
    {
        let c = Call::new(M::AllReduce, PIECES5)
            .with(dtype, op)
            .scalar(scalar)
            .seed(60 + k as u32);
        // Two groups, {0, 2} and {1, 3} (the hierarchical all-reduce's network phase).
        let b = run_masked(
            &mut ports,
            c,
            &[0, 1, 2, 3].map(|r| Some((bit(r ^ 2), bit(r ^ 2)))),
        );
        for r in 0..4 {
            let want = reduce(
                dtype,
                op,
                scalar,
                &[&part(&b, &c, r & 1, 0), &part(&b, &c, r & 1 | 2, 0)],
            );
            expect(&b, r, &want, "groups");
        }
        // Ranks 1-3 send to 0 and receive from no one: 0 reduces all, each other its own.
        let c = c.seed(70 + k as u32);
        let to0 = Some((bit(0), 0));
        let b = run_masked(&mut ports, c, &[Some((0, 0b1110)), to0, to0, to0]);
        let all: Vec<Vec<u8>> = (0..4).map(|q| part(&b, &c, q, 0)).collect();
        let all: Vec<&[u8]> = all.iter().map(|p| &p[..]).collect();
        expect(&b, 0, &reduce(dtype, op, scalar, &all), "to one");
        for r in 1..4 {
            expect(
                &b,
                r,
                &reduce(dtype, op, scalar, &[&part(&b, &c, r, 0)]),
                "to one",
            );
        }
    }
    // A ring of sends (each receives from the one before), one way from 0 to 2 (1 and 3 not
    // launched, as the host does), a pair exchanging.
    for (k, bytes) in [PIECES5 + 3, 100].into_iter().enumerate() {
        let c = Call::new(M::Send, bytes).seed(80 + k as u32);
        let ring = [0u32, 1, 2, 3].map(|r| Some((bit((r + 1) % 4), bit((r + 3) % 4))));
        let b = run_masked(&mut ports, c, &ring);
        for r in 0..4 {
            expect(&b, r, &part(&b, &c, (r + 3) % 4, 0), "ring");
        }
        let mut c = c.seed(90 + k as u32);
        let b = {
            let mut b = call_buffers(&ports.w, &c);
            b.params[2].mode = M::Recv as u32;
            let params = [
                ports.params(b.params[0], bit(2), 0),
                ports.params(b.params[2], 0, bit(0)),
            ];
            let st = ports.launch(&params, pieces(bytes));
            assert!(st.iter().all(|s| s.error_code == 0), "{st:?}");
            b
        };
        expect(&b, 2, &part(&b, &c, 0, 0), "one way");
        for r in [0, 1, 3] {
            expect(&b, r, &[], "one way");
        }
        c = c.seed(95 + k as u32);
        let b = run_masked(
            &mut ports,
            c,
            &[None, Some((bit(3), bit(3))), None, Some((bit(1), bit(1)))],
        );
        expect(&b, 1, &part(&b, &c, 3, 0), "pair");
        expect(&b, 3, &part(&b, &c, 1, 0), "pair");
    }
}

#[test]
fn refuses_or_skips_what_it_cannot_do_and_moves_nothing() {
    let mut ports = Ports::new(3);
    type Edit = fn(&mut PortCollectiveParams);
    let cases: [(Call, Edit); 5] = [
        // No slot.
        (Call::new(M::AllGather, 64), |p| p.slot_bytes = 0),
        // More ranks than the masks have bits (the kernel reads no table entry).
        (Call::new(M::AllToAll, 64), |p| p.common.nranks = 65),
        // A reduction no type serves, and a type that does not exist.
        (
            Call::new(M::AllReduce, 64)
                .with(DataType::F32, Op::SumPostDiv)
                .scalar(2),
            |_| {},
        ),
        (Call::new(M::ReduceScatter, 64), |p| p.common.dtype = 99),
        // Nothing to move.
        (Call::new(M::AllReduce, 0), |_| {}),
    ];
    for (k, (c, edit)) in cases.into_iter().enumerate() {
        let n = ports.w.n;
        let b = call_buffers(&ports.w, &c);
        let params: Vec<PortCollectiveParams> = (0..n)
            .map(|r| {
                let (s, v) = masks(&c, n, r);
                let mut p = ports.params(b.params[r as usize], s, v);
                edit(&mut p);
                p
            })
            .collect();
        let st = ports.launch(&params, 0);
        for r in 0..n {
            assert_eq!(st[r as usize].error_code, 0, "case {k}");
            expect(&b, r, &[], &format!("case {k}"));
            let head = ports.ranks[r as usize].fifo.head.load(Ordering::Relaxed);
            assert_eq!(head, 0, "case {k}: rank {r} pushed triggers");
        }
        let s = ports.w.scratch(0);
        assert!(
            s.iter().all(|&x| x == 0),
            "case {k}: the scratch was written"
        );
    }
    // Nothing happened: the next call works from counters at 0.
    run(&mut ports, Call::new(M::AllReduce, PIECES5).seed(99));
}

#[test]
fn as_many_ranks_as_the_masks_have_bits() {
    // Two ranks of a world of 64 (`MAX_PORT_RANKS`) meet: the others' slots and channels are
    // laid out, never used.
    let n = mscclpp_shared::MAX_PORT_RANKS as u64;
    let mut ports = Ports::with_ranks(2, n as u32);
    for (k, mode) in [M::AllReduce, M::AllToAll, M::AllGather]
        .into_iter()
        .enumerate()
    {
        run(&mut ports, Call::new(mode, PIECES5).seed(110 + k as u32));
    }
    // Only the slots of ranks 0 and 1 were used: their send slots, their receive slots (both
    // parities) and the accumulator.
    let slot = |i: u64| (PORT + i * SLOT) as usize..(PORT + (i + 1) * SLOT) as usize;
    let used = [
        slot(0),
        slot(1),
        slot(n),
        slot(n + 1),
        slot(n + 2),
        slot(n + 3),
        slot(3 * n),
    ];
    for r in 0..2 {
        let s = ports.w.scratch(r);
        let bad = (0..s.len()).find(|&i| s[i] != 0 && !used.iter().any(|u| u.contains(&i)));
        assert!(bad.is_none(), "rank {r}'s scratch written at {bad:?}");
    }
}
