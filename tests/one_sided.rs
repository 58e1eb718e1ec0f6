//! One-sided host calls (issue 32: NCCL's `ncclPutSignal`, `ncclSignal`, `ncclWaitSignal`):
//! `Collectives::put_signal`, `signal` and `wait_signals` on windows of
//! `register_one_sided`, in stream order.
//!
//! - `ring_of_puts_and_signals_as_threads`: 4 ranks as threads (one node: the same-node
//!   transport); an all-gather around the ring made of nothing but puts with signals and waits,
//!   every byte checked; signals alone in every context; refusals (a source outside the
//!   windows, a destination past the peer's window, this rank as the peer, a signal out of
//!   range).
//! - `a_wait_nobody_answers_is_released`: a wait for a signal nobody raises ends at the
//!   one-sided timeout with a sticky error, and one ended by `abort()` ends at once.
//! - `ring_across_emulated_nodes`: the same ring on 2 emulated nodes of 2 ranks (processes,
//!   Ethernet between the nodes, shared memory inside them).

mod worlds;

use std::sync::Arc;
use std::time::{Duration, Instant};

use mscclpp::collectives::{Collectives, SIGNAL_CONTEXTS, SIGNALS, Signal, SignalWait};
use mscclpp::host::Error;
use mscclpp::host::communicator::Communicator;
use mscclpp::host::gpu::{DeviceBuffer, Stream};
use mscclpp::host::transport::Transport;
use worlds::{ENV_NODES, child, enough_gpus, run_world, thread_world};

/// Byte `i` of the chunk rank `r` contributes.
fn byte(r: usize, i: usize) -> u8 {
    let x = (r as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (i as u64).wrapping_mul(0xff51_afd7_ed55_8ccd);
    (x ^ (x >> 29) ^ (x >> 47)) as u8
}

/// Bytes per rank's chunk (not a multiple of 16 or of a page: the transfers' edges show).
const CHUNK: usize = 12_345;

/// Waits for `stream`'s work, then reports the communicator's error if it has one.
fn settle(stream: &Stream, comm: &Communicator) -> mscclpp::host::Result<()> {
    stream.synchronize()?;
    match comm.async_error() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The ring all-gather on `c` with puts and signals only (module docs), checked; `steps`
/// rounds of it (each round re-poisons and gathers again, waiting for one more signal).
fn ring(c: &Collectives, rounds: usize) -> mscclpp::host::Result<()> {
    let comm = c.communicator();
    let (me, n) = (comm.rank(), comm.size());
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let g = comm.gpu();
    let buf: DeviceBuffer = g.alloc(n * CHUNK)?;
    // SAFETY: `buf` lives until these collectives are dropped (the end of the rank's body).
    let w = unsafe { c.register_one_sided(buf.ptr(), n * CHUNK) }?;
    let stream = g.stream()?;
    let sig = Signal { index: 1, ctx: 0 };
    for round in 0..rounds {
        let mut host = vec![0xEEu8; n * CHUNK];
        for i in 0..CHUNK {
            host[me * CHUNK + i] = byte(me, i) ^ round as u8;
        }
        buf.copy_from_host(0, &host)?;
        comm.barrier()?;
        for step in 0..n - 1 {
            // Forward the chunk that arrived last (this rank's own first).
            let k = (me + n - step) % n;
            let off = (k * CHUNK) as u64;
            // SAFETY: `buf` holds the chunk until the stream's work completes (below).
            unsafe {
                c.put_signal(
                    buf.ptr().byte_add_cast(off),
                    CHUNK,
                    next,
                    w,
                    off,
                    sig,
                    &stream,
                )
            }?;
            c.wait_signals(
                &[SignalWait {
                    peer: prev,
                    signal: sig,
                    count: 1,
                }],
                &stream,
            )?;
        }
        settle(&stream, comm)?;
        buf.copy_to_host(0, &mut host)?;
        for (k, chunk) in host.chunks(CHUNK).enumerate() {
            for (i, b) in chunk.iter().enumerate() {
                assert_eq!(
                    *b,
                    byte(k, i) ^ round as u8,
                    "rank {me}, round {round}: byte {i} of rank {k}'s chunk"
                );
            }
        }
    }
    // Signals alone, in every context and index, to both neighbours.
    for ctx in 0..SIGNAL_CONTEXTS {
        for index in 0..SIGNALS {
            let s = Signal { index, ctx };
            c.signal(next, s, &stream)?;
            c.signal(prev, s, &stream)?;
            c.wait_signals(
                &[
                    SignalWait {
                        peer: prev,
                        signal: s,
                        count: 1,
                    },
                    SignalWait {
                        peer: next,
                        signal: s,
                        count: 1,
                    },
                ],
                &stream,
            )?;
        }
    }
    settle(&stream, comm)?;
    comm.barrier()?;
    c.deregister_one_sided(w)
}

/// The refusals of the one-sided calls on `c` (no data moves, nothing is queued).
fn refusals(c: &Collectives) -> mscclpp::host::Result<()> {
    let comm = c.communicator();
    let (me, n) = (comm.rank(), comm.size());
    let next = (me + 1) % n;
    let g = comm.gpu();
    let win = g.alloc(256)?;
    let outside = g.alloc(64)?;
    // SAFETY: `win` lives until the collectives are dropped.
    let w = unsafe { c.register_one_sided(win.ptr(), 256) }?;
    let st = g.stream()?;
    let s = Signal { index: 0, ctx: 0 };
    // SAFETY (each): nothing is queued by a refused call.
    let r = unsafe { c.put_signal(outside.ptr(), 16, next, w, 0, s, &st) };
    assert!(matches!(r, Err(Error::NotRegistrable { .. })), "{r:?}");
    let r = unsafe { c.put_signal(win.ptr(), 16, next, w, 250, s, &st) };
    assert!(matches!(r, Err(Error::OutOfRange { .. })), "{r:?}");
    let r = unsafe { c.put_signal(win.ptr(), 16, me, w, 0, s, &st) };
    assert!(matches!(r, Err(Error::PeerIsSelf { .. })), "{r:?}");
    let r = c.signal(n, s, &st);
    assert!(matches!(r, Err(Error::NoSuchRank { .. })), "{r:?}");
    let bad = Signal {
        index: SIGNALS,
        ctx: 0,
    };
    assert!(c.signal(next, bad, &st).is_err());
    let bad = Signal {
        index: 0,
        ctx: SIGNAL_CONTEXTS,
    };
    assert!(c.signal(next, bad, &st).is_err());
    st.synchronize()?;
    comm.barrier()?;
    c.deregister_one_sided(w)?;
    let r = unsafe { c.put_signal(win.ptr(), 16, next, w, 0, s, &st) };
    assert!(r.is_err(), "a window taken back: {r:?}");
    Ok(())
}

#[test]
fn ring_of_puts_and_signals_as_threads() {
    if !enough_gpus("one-sided ring on 4 ranks", 4) {
        return;
    }
    thread_world(4, |comm, _| {
        let c = Collectives::new(Arc::new(comm))?;
        refusals(&c)?;
        ring(&c, 3)
    });
}

/// Rank 0 of a world of two waits for a signal rank 1 never raises; rank 1 stays alive (idle)
/// for 2 s, so that only `end` (a timeout or an abort) can end the wait. Returns how long the
/// wait took.
fn unanswered_wait(timeout: Duration, abort_after: Option<Duration>) -> Duration {
    let took = thread_world(2, |comm, _| -> mscclpp::host::Result<Option<Duration>> {
        let r = comm.rank();
        let c = Collectives::new(Arc::new(comm))?;
        let g = c.communicator().gpu().clone();
        let win = g.alloc(64)?;
        // SAFETY: `win` lives until the collectives are dropped.
        let _w = unsafe { c.register_one_sided(win.ptr(), 64) }?;
        if r == 1 {
            std::thread::sleep(Duration::from_secs(2));
            return Ok(None);
        }
        c.set_one_sided_timeout(timeout)?;
        let st = g.stream()?;
        let wait = SignalWait {
            peer: 1,
            signal: Signal { index: 2, ctx: 1 },
            count: 1,
        };
        let t = Instant::now();
        c.wait_signals(&[wait], &st)?;
        if let Some(after) = abort_after {
            std::thread::sleep(after);
            c.communicator().abort();
        }
        assert!(
            st.synchronize_timeout(Duration::from_secs(20))?,
            "still waiting"
        );
        let took = t.elapsed();
        let e = c.communicator().async_error();
        assert!(matches!(e, Some(Error::Aborted { .. })), "{e:?}");
        let again = c.wait_signals(&[wait], &st);
        assert!(again.is_err(), "the error is sticky: {again:?}");
        Ok(Some(took))
    });
    took.into_iter().flatten().next().expect("rank 0's time")
}

#[test]
fn a_wait_nobody_answers_is_released() {
    if !enough_gpus("one-sided waits on 2 ranks", 2) {
        return;
    }
    let took = unanswered_wait(Duration::from_millis(300), None);
    println!("a wait nobody answers ended after {took:?} (timeout 300 ms)");
    assert!(took >= Duration::from_millis(300), "ended after {took:?}");
    let took = unanswered_wait(Duration::from_secs(600), Some(Duration::from_millis(100)));
    println!("a wait ended by abort() 100 ms in ended after {took:?}");
    assert!(took < Duration::from_secs(10), "ended after {took:?}");
}

#[test]
fn ring_across_emulated_nodes() {
    let test = "ring_across_emulated_nodes";
    if let Some(ch) = child() {
        let c = Collectives::new(Arc::new(ch.comm)).expect("collectives");
        assert_eq!(c.communicator().topology().nodes(), 2);
        let rounds = 2;
        ring(&c, rounds).unwrap_or_else(|e| panic!("{}", mscclpp::ErrorChain(&e)));
        // Ranks 1 and 3 forward every chunk to the other node; 0 and 2 to their own node's
        // peer (shared memory: no data on the network).
        let sent = c.network_bytes_sent(Transport::Ethernet);
        let across = ch.rank % 2 == 1;
        if across {
            let least = (rounds * (ch.size - 1) * CHUNK) as u64;
            assert!(
                sent >= least,
                "{sent} bytes over Ethernet, {least} expected"
            );
        } else {
            assert!(
                sent < CHUNK as u64,
                "{sent} bytes over Ethernet to this node's peer"
            );
        }
        println!(
            "ONE_SIDED_OK rank {} sent {sent} bytes over Ethernet",
            ch.rank
        );
        return;
    }
    if !enough_gpus(test, 4) {
        return;
    }
    let ends = run_world(
        test,
        4,
        &[
            (ENV_NODES, "0,0,1,1".to_string()),
            ("MSCCLPP_NET_TRANSPORT", "ethernet".to_string()),
        ],
    );
    let failed: Vec<String> = ends
        .iter()
        .enumerate()
        .filter(|(_, e)| !(e.status.success() && e.output.contains("ONE_SIDED_OK")))
        .map(|(r, e)| format!("--- rank {r} ({}):\n{}", e.status, e.output))
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
