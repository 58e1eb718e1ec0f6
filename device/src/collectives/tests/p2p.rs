//! The point-to-point engine (`p2p_kernel`): messages as LL16 packets (at most `ll_bytes`, on
//! lane 0) and in chunks on every lane, each end served by one block or several (each end its
//! own count), sends and receives to several peers in one launch, batches back to back (the
//! header halves and the counters carried over in the region), a sender two messages and two
//! chunks ahead of its receiver, zero bytes and null buffers, count mismatches (reported,
//! nothing written, the pair still in step), one lane and the most lanes, and the refusals.
//!
//! Each rank's point-to-point region lies at [`REGION`] of its scratch, sized as the host
//! sizes it (`P2pLayout::bytes`); the kernel may write nothing of the scratch outside it
//! (which stays 0), nothing of an output but the message, and nothing of an input.

use std::format;
use std::vec;
use std::vec::Vec;

use super::world::{Buf, MARK, World, byte};
use crate::collectives::p2p_kernel;
use mscclpp_shared::status::{count_mismatch_detail, error_detail};
use mscclpp_shared::{
    DeviceErrorCode, DevicePtr, DeviceStatus, P2P_MAX_LANES, P2P_MAX_OPS, P2P_RECV, P2P_SEND,
    P2pLayout, P2pOp, P2pParams, WaitSite,
};

/// Lanes per message (unless a test says otherwise).
const LANES: u32 = 3;
/// Largest message sent as LL16 packets.
const LL: u64 = 256;
/// Bytes of a chunk.
const CHUNK: u64 = 96;
/// Offset of the point-to-point region in every scratch (not 0, so that a kernel that
/// ignores it writes outside the region).
const REGION: u64 = 1024;
/// Threads per block (the host's choice on the CPU backend).
const THREADS: u32 = 16;
/// What every input holds after its message (32 bytes, then the guard): not [`MARK`], so
/// that a kernel that moves more than the message writes something else than a marker.
const TAIL: u8 = !MARK;
/// Most blocks of a launch here.
const MAX_GRID: u32 = 16;

/// A world and the shape of its point-to-point regions.
struct Net {
    w: World,
    lanes: u32,
    /// Threads per block of every launch.
    threads: u32,
}

impl Net {
    /// `n` ranks, messages on `lanes` lanes (launches of up to [`MAX_GRID`] blocks: the
    /// kernel reads only row 0 of the channels, the world asks for a row per block).
    fn new(n: u32, lanes: u32) -> Self {
        let w = World::new(n, MAX_GRID);
        let net = Self {
            w,
            lanes,
            threads: THREADS,
        };
        assert!(REGION + net.layout().bytes() <= net.w.scratch(0).len() as u64);
        net
    }

    fn layout(&self) -> P2pLayout {
        self.params(0).layout()
    }

    /// Rank `r`'s parameters, with no operation yet.
    fn params(&self, r: u32) -> P2pParams {
        let c = self.w.params(r, 0, 0);
        P2pParams {
            status: c.status,
            channels: c.channels,
            scratch: c.scratch,
            region_offset: REGION,
            ll_bytes: LL,
            chunk_bytes: CHUNK,
            rank: r,
            nranks: self.w.n,
            lanes: self.lanes,
            ..Default::default()
        }
    }

    /// The blocks the host gives a message of `bytes`.
    fn blocks_for(&self, bytes: u64) -> u32 {
        if bytes <= LL { 1 } else { self.lanes }
    }

    /// Panics unless every byte of every scratch outside the region is still 0.
    fn check_outside_region(&self, what: &str) {
        let end = (REGION + self.layout().bytes()) as usize;
        for r in 0..self.w.n {
            let s = self.w.scratch(r);
            let bad = (0..REGION as usize)
                .chain(end..s.len())
                .find(|&i| s[i] != 0);
            assert!(
                bad.is_none(),
                "{what}: rank {r}'s scratch written at {bad:?}, outside the region"
            );
        }
    }
}

/// One message: `from` sends `sent` bytes to `to`, which posts a receive of `expected`.
#[derive(Clone, Copy, Debug)]
struct Msg {
    from: u32,
    to: u32,
    sent: u64,
    expected: u64,
    /// Blocks serving it at the sending end and at the receiving end.
    send_blocks: u32,
    recv_blocks: u32,
    /// Null buffers at both ends (zero bytes only, as `P2pOp::buf` allows).
    null: bool,
}

impl Msg {
    /// `bytes` from `from` to `to`, with the host's choice of blocks at both ends.
    fn new(net: &Net, from: u32, to: u32, bytes: u64) -> Self {
        let b = net.blocks_for(bytes);
        Self {
            from,
            to,
            sent: bytes,
            expected: bytes,
            send_blocks: b,
            recv_blocks: b,
            null: false,
        }
    }

    fn blocks(self, send_blocks: u32, recv_blocks: u32) -> Self {
        Self {
            send_blocks,
            recv_blocks,
            ..self
        }
    }

    /// The receiver expects `expected` bytes (and serves them with the host's blocks for it).
    fn expect(self, net: &Net, expected: u64) -> Self {
        Self {
            expected,
            recv_blocks: net.blocks_for(expected),
            ..self
        }
    }

    fn null(self) -> Self {
        assert!(self.sent == 0 && self.expected == 0);
        Self { null: true, ..self }
    }
}

/// One end of message `k` of a [`Batch`].
#[derive(Clone, Copy, Debug)]
enum End {
    Send(usize),
    Recv(usize),
}

/// The messages of one test step, their buffers and every sender's data.
struct Batch {
    msgs: Vec<Msg>,
    inputs: Vec<Buf>,
    outputs: Vec<Buf>,
    data: Vec<Vec<u8>>,
}

impl Batch {
    /// Message `k`'s data is a hash of (seed, sender, `64 k + receiver`, byte): no two messages
    /// of a test look alike, even between the same pair.
    fn new(msgs: &[Msg], seed: u32) -> Self {
        let data: Vec<Vec<u8>> = msgs
            .iter()
            .enumerate()
            .map(|(k, m)| {
                (0..m.sent as usize)
                    .map(|i| byte(seed, m.from, 64 * k as u32 + m.to, i))
                    .collect()
            })
            .collect();
        Self {
            msgs: msgs.to_vec(),
            inputs: data
                .iter()
                .map(|d| Buf::from(&[&d[..], &[TAIL; 32]].concat()))
                .collect(),
            outputs: msgs
                .iter()
                .map(|m| Buf::new(m.expected as usize, MARK))
                .collect(),
            data,
        }
    }

    /// Launches `ends` (at most one send and one receive per pair of ranks) on the ranks they
    /// name, each rank's operations in the order given, on consecutive blocks; returns every
    /// rank's status.
    fn post(&self, net: &Net, ends: &[End]) -> Vec<DeviceStatus> {
        let mut params: Vec<P2pParams> = (0..net.w.n).map(|r| net.params(r)).collect();
        let mut used = vec![0u32; net.w.n as usize];
        for &e in ends {
            let (k, kind) = match e {
                End::Send(k) => (k, P2P_SEND),
                End::Recv(k) => (k, P2P_RECV),
            };
            let m = &self.msgs[k];
            let (me, peer, bytes, blocks, buf) = if kind == P2P_SEND {
                (m.from, m.to, m.sent, m.send_blocks, self.inputs[k].ptr())
            } else {
                (
                    m.to,
                    m.from,
                    m.expected,
                    m.recv_blocks,
                    self.outputs[k].ptr(),
                )
            };
            let p = &mut params[me as usize];
            assert!((p.nops as usize) < P2P_MAX_OPS);
            p.ops[p.nops as usize] = P2pOp {
                buf: if m.null { DevicePtr::NULL } else { buf },
                bytes,
                peer,
                kind,
                first_block: used[me as usize],
                blocks,
            };
            p.nops += 1;
            used[me as usize] += blocks;
        }
        let grid = used.iter().copied().max().unwrap_or(0);
        let launched: Vec<P2pParams> = params.into_iter().filter(|p| p.nops > 0).collect();
        net.w
            .try_launch(p2p_kernel, &launched, grid, net.threads, 0)
    }

    /// Every send and receive at once; panics unless every rank's status is what the messages
    /// say (a receiver of a message of another count: `CountMismatch` naming the sender and
    /// its count; nobody else an error), then checks every buffer ([`Batch::check`]).
    fn run(&self, net: &Net) {
        let ends: Vec<End> = (0..self.msgs.len())
            .flat_map(|k| [End::Send(k), End::Recv(k)])
            .collect();
        let st = self.post(net, &ends);
        for (r, s) in st.iter().enumerate() {
            let mismatch = self
                .msgs
                .iter()
                .find(|m| m.to == r as u32 && m.sent != m.expected);
            let (code, detail) = match mismatch {
                Some(m) => (
                    DeviceErrorCode::CountMismatch as u32,
                    count_mismatch_detail(m.from, m.sent),
                ),
                None => (0, 0),
            };
            assert_eq!(
                (s.error_code, s.error_detail),
                (code, detail),
                "rank {r}'s status after {:?}",
                self.msgs
            );
        }
        self.check(net);
    }

    /// Panics unless every output holds its message (when both counts agree) or only markers
    /// (when they do not), every guard holds, no input changed and no scratch was written
    /// outside its region.
    fn check(&self, net: &Net) {
        for (k, m) in self.msgs.iter().enumerate() {
            let what = format!("message {k} {m:?}");
            let got = self.outputs[k].get();
            if m.sent == m.expected {
                if let Some(i) = (0..got.len()).find(|&i| got[i] != self.data[k][i]) {
                    panic!(
                        "{what}: byte {i} is {:#04x}, the sender's is {:#04x}",
                        got[i], self.data[k][i]
                    );
                }
            } else {
                assert!(
                    got.iter().all(|&x| x == MARK),
                    "{what}: a message of another count was written"
                );
            }
            self.outputs[k].check_slack(&what);
            self.inputs[k].check_slack(&what);
            let input = self.inputs[k].get();
            assert_eq!(
                &input[..m.sent as usize],
                &self.data[k][..],
                "{what}: input changed"
            );
            assert!(
                input[m.sent as usize..].iter().all(|&x| x == TAIL),
                "{what}: input changed"
            );
        }
        net.check_outside_region(&format!("{:?}", self.msgs));
    }
}

/// Runs `msgs` in one batch and checks it.
fn run(net: &Net, msgs: &[Msg], seed: u32) {
    Batch::new(msgs, seed).run(net);
}

#[test]
fn small_messages_travel_as_packets_any_size_with_sends_and_receives_at_once() {
    let net = Net::new(3, LANES);
    for (k, bytes) in [1u64, 7, 8, 15, 16, 100, 255, LL].into_iter().enumerate() {
        // Rank 2 sends to 1 while it receives from 0; rank 1 receives from 2 and sends to 0.
        let msgs = [
            Msg::new(&net, 0, 2, bytes),
            Msg::new(&net, 2, 1, LL + 1 - bytes),
            Msg::new(&net, 1, 0, bytes.div_ceil(2)),
        ];
        run(&net, &msgs, k as u32);
    }
    // A small message served by one block at one end and by a block per lane at the other
    // (every lane carries a header): each end decides its blocks alone.
    for (k, (s, r)) in [(3, 1), (1, 3), (2, 3)].into_iter().enumerate() {
        let m = Msg::new(&net, 1, 2, 200).blocks(s, r);
        run(
            &net,
            &[m, Msg::new(&net, 2, 1, 40).blocks(r, s)],
            20 + k as u32,
        );
    }
}

#[test]
fn large_messages_travel_in_chunks_on_every_lane_each_end_with_its_blocks() {
    let net = Net::new(3, LANES);
    // Just above the packets' limit (three chunks, the last of one byte), whole chunks on
    // whole lanes, a ragged last chunk, and many chunks per lane (each slot reused).
    let sizes = [LL + 1, 4 * LANES as u64 * CHUNK, 1003, 4001];
    let shapes = [(3, 3), (1, 3), (3, 1), (2, 1), (2, 3), (1, 1)];
    let mut seed = 100;
    for bytes in sizes {
        for (s, r) in shapes {
            seed += 1;
            // A pair exchanging both ways at once, and a third rank sending to one of them.
            let msgs = [
                Msg::new(&net, 0, 1, bytes).blocks(s, r),
                Msg::new(&net, 1, 0, bytes - 1).blocks(r, s),
                Msg::new(&net, 2, 0, 2 * bytes).blocks(1, s),
            ];
            run(&net, &msgs, seed);
        }
    }
}

#[test]
fn every_rank_sends_to_and_receives_from_every_other_batch_after_batch() {
    let net = Net::new(3, LANES);
    // Sizes change from batch to batch (small and large on one pair by turns), so that every
    // header half and chunk slot is reused with another message.
    let sizes = [
        [40u64, 700, 0, 2000],
        [1500, 8, 333, 96],
        [97, 1111, 256, 12],
    ];
    for (b, size) in sizes.iter().enumerate() {
        let mut msgs = Vec::new();
        for from in 0..3u32 {
            for to in (0..3u32).filter(|&to| to != from) {
                let bytes = size[(from + 2 * to + b as u32) as usize % 4];
                // Large ones on two blocks (one serves two lanes), small ones on one.
                let blocks = if bytes > LL { 2 } else { 1 };
                msgs.push(Msg::new(&net, from, to, bytes).blocks(blocks, blocks));
            }
        }
        run(&net, &msgs, 200 + b as u32);
    }
}

#[test]
fn zero_bytes_with_null_buffers_still_advance_every_lane() {
    let net = Net::new(2, LANES);
    for k in 0..3 {
        let blocks = [1, LANES, 2][k];
        let zero = Msg::new(&net, 0, 1, 0).blocks(blocks, 1).null();
        let back = Msg::new(&net, 1, 0, 0).blocks(1, blocks);
        run(&net, &[zero, back], 300 + k as u32);
        // The next messages on the same lanes (a header each, and chunks).
        let msgs = [Msg::new(&net, 0, 1, 50), Msg::new(&net, 1, 0, 800)];
        run(&net, &msgs, 310 + k as u32);
    }
}

#[test]
fn one_lane_and_the_most_lanes_and_a_mismatch_on_them() {
    for (lanes, blocks) in [(1, 1), (P2P_MAX_LANES, 2), (P2P_MAX_LANES, P2P_MAX_LANES)] {
        let net = Net::new(2, lanes);
        for (k, bytes) in [1000u64, 30, 5 * CHUNK * lanes as u64 + 5]
            .into_iter()
            .enumerate()
        {
            let b = if bytes > LL { blocks } else { 1 };
            let msgs = [
                Msg::new(&net, 0, 1, bytes).blocks(b, 1),
                Msg::new(&net, 1, 0, bytes + 16).blocks(1, b),
            ];
            run(&net, &msgs, 400 + lanes + 10 * k as u32);
        }
        // A mismatch is reported by lane 0 (the only one here, or one of eight).
        let m = Msg::new(&net, 0, 1, 700)
            .expect(&net, 699)
            .blocks(blocks, 1);
        run(&net, &[m], 450 + lanes);
    }
}

#[test]
fn a_count_mismatch_is_reported_writes_nothing_and_keeps_the_pair_in_step() {
    let net = Net::new(3, LANES);
    // (sent, expected): packets against packets, chunks against packets and back, chunks
    // against chunks, nothing against something and back.
    let cases = [
        (100u64, 96u64),
        (1000, 100),
        (100, 1000),
        (2000, 1999),
        (0, 16),
        (16, 0),
        (LL + 1, LL),
    ];
    for (k, (sent, expected)) in cases.into_iter().enumerate() {
        let seed = 500 + 10 * k as u32;
        // Rank 2 receives the wrong count from 0 while 1 and 2 exchange correctly.
        let msgs = [
            Msg::new(&net, 0, 2, sent).expect(&net, expected),
            Msg::new(&net, 1, 2, 300),
            Msg::new(&net, 2, 1, 30),
        ];
        run(&net, &msgs, seed);
        // The pair is still in step: the next messages both ways arrive whole.
        let msgs = [
            Msg::new(&net, 0, 2, expected + 8),
            Msg::new(&net, 2, 0, sent + 24),
        ];
        run(&net, &msgs, seed + 1);
    }
}

#[test]
fn a_sender_runs_two_messages_and_two_chunks_ahead_of_its_receiver() {
    let net = Net::new(2, LANES);
    // m0: two chunks on every lane (the slots of both parities); m1: packets (the other
    // header half); m2: two chunks per lane again, whose slots m0 still holds until received.
    let m0 = Msg::new(&net, 0, 1, (2 * LANES as u64 - 1) * CHUNK + 10);
    let m1 = Msg::new(&net, 0, 1, 77);
    let m2 = Msg::new(&net, 0, 1, 2 * LANES as u64 * CHUNK);
    for m in [m0, m2] {
        assert_eq!(m.sent.div_ceil(CHUNK), 2 * LANES as u64);
    }
    let b = Batch::new(&[m0, m1, m2], 600);
    let ok = |st: Vec<DeviceStatus>, what: &str| {
        for (r, s) in st.iter().enumerate() {
            assert_eq!(s.error_code, 0, "{what}: rank {r}: {s:?}");
        }
    };
    // The receiver has posted nothing: the first two sends need no acknowledgement.
    ok(b.post(&net, &[End::Send(0)]), "m0 sent alone");
    ok(b.post(&net, &[End::Send(1)]), "m1 sent alone");
    // The third needs m0's header half and chunk slots: it waits for m0's receive.
    ok(
        b.post(&net, &[End::Send(2), End::Recv(0)]),
        "m2 sent, m0 received",
    );
    ok(b.post(&net, &[End::Recv(1)]), "m1 received");
    ok(b.post(&net, &[End::Recv(2)]), "m2 received");
    b.check(&net);
    // Everything acknowledged: the next exchange starts from a pair in step.
    run(
        &net,
        &[Msg::new(&net, 0, 1, 900), Msg::new(&net, 1, 0, 9)],
        601,
    );
}

#[test]
fn refuses_what_the_host_never_sends_and_touches_nothing() {
    let net = Net::new(2, LANES);
    let out = Buf::new(64, MARK);
    // (an operation, a change to the parameters); the detail names the op's peer and kind.
    let op = |peer: u32, kind: u32| P2pOp {
        buf: out.ptr(),
        bytes: 64,
        peer,
        kind,
        first_block: 0,
        blocks: 1,
    };
    type Edit = fn(&mut P2pParams);
    let cases: [(P2pOp, Edit); 9] = [
        (op(0, P2P_SEND), |_| {}),
        (op(2, P2P_RECV), |_| {}),
        (op(1, 2), |_| {}),
        // (The detail is `peer << 8 | kind`, whatever the kind holds.)
        (op(1, 0x102), |_| {}),
        (op(1, P2P_SEND), |p| p.lanes = 0),
        (op(1, P2P_RECV), |p| p.lanes = P2P_MAX_LANES + 1),
        (op(1, P2P_SEND), |p| p.chunk_bytes = 0),
        (op(1, P2P_RECV), |p| p.chunk_bytes = 24),
        (op(1, P2P_SEND), |p| p.rank = 1),
    ];
    for (k, (o, edit)) in cases.into_iter().enumerate() {
        let mut p = net.params(0);
        p.ops[0] = o;
        p.nops = 1;
        edit(&mut p);
        // Blocks of one thread by turns: the one that records is thread 0.
        let threads = if k % 2 == 0 { 1 } else { THREADS };
        let st = net.w.try_launch(p2p_kernel, &[p], 1, threads, 0);
        let what = (o.peer as u64) << 8 | o.kind as u64;
        assert_eq!(
            (st[0].error_code, st[0].error_detail),
            (
                DeviceErrorCode::InvalidArgument as u32,
                error_detail(WaitSite::Unknown, what)
            ),
            "case {k}: {o:?}"
        );
        assert!(out.get().iter().all(|&x| x == MARK), "case {k}");
        for r in 0..2 {
            assert!(
                net.w.scratch(r).iter().all(|&x| x == 0),
                "case {k}: rank {r}'s scratch was written"
            );
        }
    }
    // Entries past `nops` are not operations, whatever they hold; nothing was sent above, so
    // the pair starts in step.
    let b = Batch::new(&[Msg::new(&net, 0, 1, 40), Msg::new(&net, 1, 0, 24)], 700);
    let p: Vec<P2pParams> = (0..2usize)
        .map(|r| {
            let mut p = net.params(r as u32);
            p.ops[0] = P2pOp {
                buf: b.inputs[r].ptr(),
                bytes: b.msgs[r].sent,
                peer: 1 - r as u32,
                kind: P2P_SEND,
                first_block: 0,
                blocks: 1,
            };
            p.ops[1] = P2pOp {
                buf: b.outputs[1 - r].ptr(),
                bytes: b.msgs[1 - r].sent,
                peer: 1 - r as u32,
                kind: P2P_RECV,
                first_block: 1,
                blocks: 1,
            };
            // Block 2 is idle: a stale entry naming it must stay unread.
            p.ops[2] = P2pOp {
                first_block: 2,
                ..op(r as u32, 7)
            };
            p.nops = 2;
            p
        })
        .collect();
    let st = net.w.try_launch(p2p_kernel, &p, 3, THREADS, 0);
    assert!(st.iter().all(|s| s.error_code == 0), "{st:?}");
    b.check(&net);
}

#[test]
fn blocks_of_one_thread_and_of_two_warps() {
    for threads in [1, 64] {
        let mut net = Net::new(3, LANES);
        net.threads = threads;
        for (k, bytes) in [100u64, 1003].into_iter().enumerate() {
            let msgs = [
                Msg::new(&net, 0, 1, bytes).blocks(1, 2),
                Msg::new(&net, 1, 2, bytes + 8),
                Msg::new(&net, 2, 0, bytes + 1).expect(&net, bytes),
            ];
            run(&net, &msgs, 800 + threads + k as u32);
        }
    }
}
