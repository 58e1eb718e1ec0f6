//! The point-to-point engine (`send`, `recv`, `send_recv`, groups of sends and receives), on
//! the backend under test, 2 to 8 ranks as threads and 3 and 4 as processes: rings, all
//! pairs with uneven counts (zeros included) and this rank itself, several messages to one
//! peer in one group, pairs of equal parity, messages on both sides of the LL limit and of
//! many chunks at unaligned offsets; counts that do not match refused with a typed error,
//! after which both ends are still in step; senders that drop everything right after their
//! last sends, with no barrier. Every output starts as a marker; every byte is
//! compared with the hash the sender filled in.
//!
//! `MSCCLPP_TEST_SURFACE_FULL=1` adds more sizes and rank counts.

mod surface;

use mscclpp::collectives::{Algorithm, CollectiveConfig, Collectives};
use mscclpp::host::Error;
use mscclpp::host::gpu::{DeviceBuffer, Stream};
use mscclpp::shared::{DataType, DevicePtr};
use mscclpp_test_support as harness;
use mscclpp_test_support::enough_gpus;
use surface::{MARKER, buffer, bytes, full_grid, read, same, with_collectives};

/// Sizes around the engine's limits on `c` (bytes): none, one, a prime, the LL limit and one
/// past it, and several chunks per lane with a ragged end.
fn sizes(c: &Collectives) -> Vec<usize> {
    let cfg = c.config();
    let (ll, chunk, lanes) = (
        cfg.p2p_ll_bytes,
        cfg.p2p_chunk_bytes,
        cfg.p2p_lanes as usize,
    );
    let mut s = vec![0, 1, 13, ll, ll + 1, 3 * chunk * lanes + 5];
    if full_grid() {
        s.extend([
            8,
            1009,
            ll.saturating_sub(1),
            chunk,
            chunk * lanes + 16,
            7 * chunk * lanes + 1,
        ]);
    }
    s
}

/// What `from` sends `to` as its `k`-th message (`len` bytes).
fn message(from: usize, to: usize, k: usize, len: usize) -> Vec<u8> {
    bytes(from, to * 64 + k, len, 0x5e_d0)
}

/// One rank's receive: its buffer (the data `at` bytes in, marker around it) and what must
/// land there.
struct Expect {
    buf: DeviceBuffer,
    at: usize,
    want: Vec<u8>,
    what: String,
}

impl Expect {
    fn new(c: &Collectives, len: usize, at: usize, want: Vec<u8>, what: String) -> Self {
        Self {
            buf: buffer(c, at + len + 3, 0, &[]),
            at,
            want,
            what,
        }
    }

    fn ptr(&self) -> DevicePtr<u8> {
        self.buf.ptr().byte_add_cast(self.at as u64)
    }

    /// The data where it belongs and the marker around it.
    fn check(&self) {
        let got = read(&self.buf);
        let mut want = vec![MARKER; got.len()];
        want[self.at..self.at + self.want.len()].copy_from_slice(&self.want);
        same(&got, &want, &|| self.what.clone());
    }
}

/// A send buffer holding `data` `at` bytes in.
fn source(c: &Collectives, data: &[u8], at: usize) -> (DeviceBuffer, DevicePtr<u8>) {
    let b = buffer(c, at + data.len(), at, data);
    let p = b.ptr().byte_add_cast(at as u64);
    (b, p)
}

fn done(c: &Collectives, stream: &Stream) {
    stream.synchronize().unwrap();
    let comm = c.communicator();
    assert!(
        comm.status().error().is_none(),
        "rank {}: {:?}",
        comm.rank(),
        comm.status().error()
    );
    assert_eq!(c.last_algorithm(), Some(Algorithm::P2p));
}

/// A ring in a group (send to the next rank, receive from the previous one), at every size
/// and at offsets 0 and 3; then the same with `send_recv`.
fn ring(c: &Collectives) {
    let comm = c.communicator();
    let (r, n) = (comm.rank(), comm.size());
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let stream = comm.gpu().stream().unwrap();
    for (k, len) in sizes(c).into_iter().enumerate() {
        let at = 3 * (k % 2);
        let (_in, src) = source(c, &message(r, next, k, len), at);
        let what = format!("ring of {len} B on {n} ranks, rank {r} from {prev}");
        let e = Expect::new(c, len, at, message(prev, r, k, len), what);
        let mut g = c.group();
        // SAFETY: both buffers hold `len` bytes until the synchronize in `done`.
        unsafe {
            g.recv(e.ptr(), len, DataType::U8, prev).unwrap();
            g.send(src, len, DataType::U8, next).unwrap();
        }
        g.end(&stream).unwrap();
        done(c, &stream);
        e.check();
        let e = Expect::new(
            c,
            len,
            at,
            message(prev, r, k, len),
            format!("{} (send_recv)", e.what),
        );
        // SAFETY: as above.
        unsafe { c.send_recv(src, next, e.ptr(), prev, len, DataType::U8, &stream) }.unwrap();
        done(c, &stream);
        e.check();
    }
}

/// The bytes `from` sends `to` in the all-pairs pattern: uneven, zero for some pairs, and
/// larger than the LL limit for others.
fn pair_len(c: &Collectives, from: usize, to: usize) -> usize {
    let cfg = c.config();
    let h = surface::mix((from * 31 + to) as u64 ^ 0xa11) as usize;
    match h % 4 {
        0 => 0,
        1 => h % 97 + 1,
        2 => cfg.p2p_ll_bytes + h % 61,
        _ => cfg.p2p_chunk_bytes * 2 + h % 1000,
    }
}

/// Every rank sends every rank (itself included) a message of its own length, in a group
/// whose order differs per rank; two messages to the same peer in one group pair in order.
fn all_pairs(c: &Collectives, element: DataType) {
    let comm = c.communicator();
    let (r, n) = (comm.rank(), comm.size());
    let es = element.size();
    let stream = comm.gpu().stream().unwrap();
    let mut keep = Vec::new();
    let mut expects = Vec::new();
    let mut g = c.group();
    for i in 0..n {
        // Receives and sends interleaved, the peers in an order of each rank's own (even
        // ranks upwards from themselves, odd ones downwards).
        let q = if r % 2 == 0 {
            (r + i) % n
        } else {
            (r + n - i) % n
        };
        for k in 0..2 {
            let len = (pair_len(c, q, r) + k * 7) / es * es;
            let what = format!("all pairs ({element:?}): {len} B from {q} to {r}, message {k}");
            let e = Expect::new(c, len, es * (k + 1), message(q, r, k, len), what);
            // SAFETY: held until `done` below.
            unsafe { g.recv(e.ptr(), len / es, element, q) }.unwrap();
            expects.push(e);
            let out = (pair_len(c, r, q) + k * 7) / es * es;
            let (b, src) = source(c, &message(r, q, k, out), es * k);
            // SAFETY: as above.
            unsafe { g.send(src, out / es, element, q) }.unwrap();
            keep.push(b);
        }
    }
    g.end(&stream).unwrap();
    done(c, &stream);
    for e in &expects {
        e.check();
    }
}

/// On 4 ranks, pairs of equal parity (0 with 2, 1 with 3) exchange with `send_recv`, which a
/// schedule of "even ranks send first" would serialise or deadlock; then every rank receives
/// from a rank of its own parity and sends to the other parity, in one group.
fn equal_parity(c: &Collectives) {
    let comm = c.communicator();
    let (r, n) = (comm.rank(), comm.size());
    let stream = comm.gpu().stream().unwrap();
    let len = c.config().p2p_chunk_bytes * 3 + 11;
    let peer = (r + 2) % n;
    let (_in, src) = source(c, &message(r, peer, 9, len), 0);
    let e = Expect::new(
        c,
        len,
        0,
        message(peer, r, 9, len),
        format!("parity pair {peer}->{r}"),
    );
    // SAFETY: held until `done`.
    unsafe { c.send_recv(src, peer, e.ptr(), peer, len, DataType::U8, &stream) }.unwrap();
    done(c, &stream);
    e.check();
    let to = (r + 1) % n;
    let (_in2, src) = source(c, &message(r, to, 10, len), 5);
    let e2 = Expect::new(
        c,
        len,
        0,
        message(peer, r, 11, len),
        format!("parity {peer}->{r}"),
    );
    let (_in3, src3) = source(c, &message(r, peer, 11, len), 0);
    let from = (r + n - 1) % n;
    let e3 = Expect::new(c, len, 1, message(from, r, 10, len), format!("{from}->{r}"));
    let mut g = c.group();
    // SAFETY: held until `done`.
    unsafe {
        g.recv(e2.ptr(), len, DataType::U8, peer).unwrap();
        g.send(src, len, DataType::U8, to).unwrap();
        g.recv(e3.ptr(), len, DataType::U8, from).unwrap();
        g.send(src3, len, DataType::U8, peer).unwrap();
    }
    g.end(&stream).unwrap();
    done(c, &stream);
    e2.check();
    e3.check();
}

#[test]
fn rings_all_pairs_and_parity_2_to_8_ranks() {
    // 10 ranks: distances 1 to 9, so that a round runs in two launches.
    let ranks: &[usize] = if full_grid() {
        &[2, 3, 4, 5, 6, 7, 8, 10]
    } else {
        &[2, 3, 4, 8]
    };
    for &n in ranks {
        if !enough_gpus("the point-to-point patterns", n) {
            continue;
        }
        with_collectives(
            n,
            |_| {},
            |c| {
                ring(c);
                all_pairs(c, DataType::U8);
                all_pairs(c, DataType::F64);
                if n == 4 {
                    equal_parity(c);
                }
            },
        );
    }
}

/// Ten ranks (more peers than one launch's table holds: every round runs in two launches, by
/// distance), all pairs.
#[test]
fn ten_ranks_all_pairs() {
    if enough_gpus("the point-to-point patterns", 10) {
        with_collectives(10, |_| {}, |c| all_pairs(c, DataType::U8));
    }
}

/// One lane, an LL limit of 0 (every message, however small, in chunks) and chunks of 16
/// bytes: the engine's extreme shapes.
#[test]
fn extreme_shapes() {
    if !enough_gpus("the point-to-point patterns", 3) {
        return;
    }
    let tune = |cfg: &mut CollectiveConfig| {
        cfg.p2p_lanes = 1;
        cfg.p2p_ll_bytes = 0;
        cfg.p2p_chunk_bytes = 16;
    };
    with_collectives(3, tune, |c| {
        ring(c);
        all_pairs(c, DataType::I32);
    });
}

/// A receive whose count differs from its send's, in every combination of paths (LL or
/// chunks on either side, zero on either side): the receiver gets `Error::CountMismatch`
/// naming the sender and the bytes it sent, its output is untouched, and the sender's call
/// succeeds; after the receiver clears its status, a matched exchange is correct.
#[test]
fn mismatched_counts_are_refused_with_a_typed_error() {
    if !enough_gpus("the count-mismatch test", 2) {
        return;
    }
    with_collectives(
        2,
        |_| {},
        |c| {
            let comm = c.communicator();
            let r = comm.rank();
            let stream = comm.gpu().stream().unwrap();
            let cfg = c.config();
            let (small, large) = (cfg.p2p_ll_bytes / 2, cfg.p2p_chunk_bytes * 5 + 3);
            let cases = [
                (small, small + 8),
                (small + 8, small),
                (small, large),
                (large, small),
                (large, large + 16),
                (large + 16, large),
                (0, small),
                (small, 0),
                (0, large),
                (large, 0),
            ];
            for (k, &(sent, posted)) in cases.iter().enumerate() {
                let what = format!("case {k}: {sent} B sent, {posted} B posted");
                if r == 0 {
                    let (_b, src) = source(c, &message(0, 1, k, sent), 0);
                    // SAFETY: held until `done`.
                    unsafe { c.send(src, sent, DataType::U8, 1, &stream) }.unwrap();
                    done(c, &stream);
                } else {
                    let e = Expect::new(c, posted, 0, vec![MARKER; posted], what.clone());
                    // SAFETY: as above.
                    unsafe { c.recv(e.ptr(), posted, DataType::U8, 0, &stream) }.unwrap();
                    stream.synchronize().unwrap();
                    match comm.status().error() {
                        Some(Error::CountMismatch {
                            peer: 0,
                            sent_bytes,
                        }) => {
                            assert_eq!(sent_bytes, sent as u64, "{what}")
                        }
                        other => panic!("{what}: {other:?}"),
                    }
                    e.check();
                    // The next call refuses to run on a failed communicator, with that error.
                    let again = unsafe { c.recv(e.ptr(), posted, DataType::U8, 0, &stream) };
                    assert!(
                        matches!(again, Err(Error::CountMismatch { .. })),
                        "{again:?}"
                    );
                    comm.status().reset();
                }
                comm.bootstrap().barrier().unwrap();
                // Still in step: a matched message of the larger size.
                let len = sent.max(posted);
                if r == 0 {
                    let (_b, src) = source(c, &message(0, 1, 100 + k, len), 0);
                    // SAFETY: as above.
                    unsafe { c.send(src, len, DataType::U8, 1, &stream) }.unwrap();
                    done(c, &stream);
                } else {
                    let e = Expect::new(c, len, 0, message(0, 1, 100 + k, len), what);
                    // SAFETY: as above.
                    unsafe { c.recv(e.ptr(), len, DataType::U8, 0, &stream) }.unwrap();
                    done(c, &stream);
                    e.check();
                }
                comm.bootstrap().barrier().unwrap();
            }
        },
    );
}

/// Sends to this rank itself pair with its receives from itself in order; sizes that differ
/// (or a send with no receive) are refused with `Error::SelfMismatch` before anything of the
/// group is queued; arguments naming no rank are refused as they are recorded.
#[test]
fn self_transfers_and_bad_arguments() {
    if !enough_gpus("the self-transfer test", 1) {
        return;
    }
    with_collectives(
        1,
        |_| {},
        |c| {
            let stream = c.communicator().gpu().stream().unwrap();
            let data = message(0, 0, 0, 301);
            let (_b, src) = source(c, &data, 1);
            let e = Expect::new(c, 301, 2, data.clone(), "self".into());
            let e0 = Expect::new(c, 0, 0, Vec::new(), "self, none".into());
            let mut g = c.group();
            // SAFETY: held until the synchronize.
            unsafe {
                g.send(src, 0, DataType::U8, 0).unwrap();
                g.send(src, 301, DataType::U8, 0).unwrap();
                g.recv(e0.ptr(), 0, DataType::U8, 0).unwrap();
                g.recv(e.ptr(), 301, DataType::U8, 0).unwrap();
            }
            g.end(&stream).unwrap();
            stream.synchronize().unwrap();
            e.check();
            e0.check();
            let mut g = c.group();
            // SAFETY: nothing is queued (refused).
            unsafe {
                g.send(src, 300, DataType::U8, 0).unwrap();
                g.recv(e.ptr(), 301, DataType::U8, 0).unwrap();
                g.send(src, 1, DataType::U8, 0).unwrap();
            }
            let r = g.end(&stream);
            assert!(
                matches!(
                    r,
                    Err(Error::SelfMismatch {
                        index: 0,
                        sent_bytes: Some(300),
                        recv_bytes: Some(301)
                    })
                ),
                "{r:?}"
            );
            let mut g = c.group();
            // SAFETY: as above.
            let bad = unsafe { g.send(src, 1, DataType::U8, 1) };
            assert!(
                matches!(bad, Err(Error::NoSuchRank { rank: 1, size: 1 })),
                "{bad:?}"
            );
            // SAFETY: as above.
            let bad = unsafe { c.send(src, 1, DataType::U8, 0, &stream) };
            assert!(matches!(bad, Err(Error::PeerIsSelf { rank: 0 })), "{bad:?}");
            // SAFETY: as above.
            let bad = unsafe {
                c.all_to_allv(
                    src,
                    &[1, 2],
                    &[0],
                    e.ptr(),
                    &[1],
                    &[0],
                    DataType::U8,
                    &stream,
                )
            };
            assert!(
                matches!(
                    bad,
                    Err(Error::PerRankLength {
                        what: "send_counts",
                        len: 2,
                        ranks: 1
                    })
                ),
                "{bad:?}"
            );
            assert!(g.is_empty());
            drop(g);
            assert!(c.communicator().status().error().is_none());
        },
    );
}

/// The patterns with ranks as processes (memory mapped across processes).
#[test]
fn patterns_as_processes_3_and_4_ranks() {
    const TEST: &str = "patterns_as_processes_3_and_4_ranks";
    match harness::child_communicator() {
        Some(comm) => {
            let c = Collectives::new(std::sync::Arc::new(comm)).expect("collectives");
            ring(&c);
            all_pairs(&c, DataType::U8);
            if c.communicator().size() == 4 {
                equal_parity(&c);
            }
            c.communicator().bootstrap().barrier().unwrap();
        }
        None => {
            for n in [3, 4] {
                if enough_gpus("the point-to-point patterns as processes", n) {
                    harness::ranks_as_processes(n, TEST);
                }
            }
        }
    }
}

/// Dropping right after the last sends (a receiver acknowledges in its *sender's* scratch,
/// possibly after the sender's call returned, so a sender that freed its scratch at once had
/// that store land in freed memory: SIGSEGV with ranks as threads). On 2 and 8 ranks, 20
/// rounds each, a new `Collectives` per round: half of the ranks (alternating by round) send
/// their next rank (and, on 8 ranks, the third next) an LL message at the LL limit and a
/// message of two chunks on each of 4 lanes, synchronize their stream and drop their
/// `Collectives` and communicator at once, with no barrier; the receivers post their receives
/// a little late (a slow peer), check every byte, and drop too. The senders' drop must wait
/// for the acknowledgements their sends are owed (`algo::p2p::drain`); without that this
/// crashes.
#[test]
fn dropping_right_after_sends_is_safe() {
    for (n, rounds) in [(2, 20), (8, 20)] {
        if !enough_gpus("the drop-after-sends test", n) {
            continue;
        }
        for round in 0..rounds {
            harness::ranks_as_threads(n, |comm| {
                let mut cfg = CollectiveConfig::for_backend(comm.gpu().kind());
                cfg.p2p_lanes = 4;
                let c = Collectives::with_config(std::sync::Arc::new(comm), cfg).unwrap();
                let r = c.communicator().rank();
                let stream = c.communicator().gpu().stream().unwrap();
                let (ll, chunk) = (c.config().p2p_ll_bytes, c.config().p2p_chunk_bytes);
                // Two messages per pair: within the window of two header halves and two
                // chunk slots per lane, so a sender never waits for its receiver and is done
                // (and gone) before its receiver even starts.
                let lens = [ll, (2 * 4 - 1) * chunk + 24];
                let sends = (r + round).is_multiple_of(2);
                let dists: &[usize] = if n > 2 { &[1, 3] } else { &[1] };
                let mut keep = Vec::new();
                let mut expect = Vec::new();
                if !sends {
                    std::thread::sleep(std::time::Duration::from_millis(30));
                }
                let mut g = c.group();
                for (&d, (k, &len)) in dists
                    .iter()
                    .flat_map(|d| std::iter::repeat(d).zip(lens.iter().enumerate()))
                {
                    let (to, from) = ((r + d) % n, (r + n - d) % n);
                    if sends {
                        let (b, src) = source(&c, &message(r, to, k + round, len), 0);
                        // SAFETY: `b` holds `len` bytes until the synchronize below.
                        unsafe { g.send(src, len, DataType::U8, to).unwrap() };
                        keep.push(b);
                    } else {
                        let what = format!("round {round}, rank {r} from {from}, {len} B");
                        let e = Expect::new(&c, len, 0, message(from, r, k + round, len), what);
                        // SAFETY: as above.
                        unsafe { g.recv(e.ptr(), len, DataType::U8, from).unwrap() };
                        expect.push(e);
                    }
                }
                g.end(&stream).unwrap();
                done(&c, &stream);
                for e in &expect {
                    e.check();
                }
                // No barrier: the collectives, the communicator and the buffers go now.
                drop(keep);
                drop(stream);
                drop(c);
            });
        }
    }
}
