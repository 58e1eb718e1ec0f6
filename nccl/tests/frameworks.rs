//! The drop-in under the call patterns of real frameworks (issue 30), through its C symbols
//! (`dlopen`), ranks as threads of a child process on the CPU backend (`common::isolated`):
//! no host rendezvous in a call (a late rank never holds another's host; an allocation travels
//! to the peers once), calls of one communicator in issue order across streams, capture,
//! registration as a hint, destroy and abort, groups, splits, C-ABI hygiene.
//!
//! Calls that must return before their work is done are queued on streams of
//! `mscclppCpuStreamCreate` (the CPU backend's streams for C callers); the others run on the
//! communicator's own stream and are complete when they return.

mod common;

use std::ffi::c_void;
use std::time::{Duration, Instant};

use common::buf::Buf;
use common::data;
use common::*;

const LIMIT: Duration = Duration::from_secs(300);

/// A stream of `mscclppCpuStreamCreate`.
fn cpu_stream() -> *mut c_void {
    let mut s: *mut c_void = std::ptr::null_mut();
    ok(
        unsafe { (nccl().cpu_stream_create)(&mut s) },
        "mscclppCpuStreamCreate",
    );
    assert!(!s.is_null());
    s
}

/// Lines of `text` that the library logged for a one-time message a call sent (a hint, a
/// scratch region: target `mscclpp::collectives::sent`) on rank `r`, containing `what`.
fn sent(text: &str, r: usize, what: &str) -> usize {
    text.lines()
        .filter(|l| {
            l.contains("mscclpp::collectives::sent")
                && l.contains(&format!("rank={r} "))
                && l.contains(what)
        })
        .count()
}

/// Item 1: rank 1's host sleeps 2 s before its first call while rank 0 queues 100
/// all-reduces of 8 MiB (the direct kernel's range) on buffers of `ncclMemAlloc` nobody
/// registered: rank 0's host returns from all of them long before rank 1 wakes; the results
/// are right; each rank sends each allocation to its peer once (2 hints), and at most one
/// scratch region (the staging region of the algorithm queued behind the direct kernel):
/// nothing per call.
#[test]
fn a_late_rank_never_blocks_the_host_and_allocations_travel_once() {
    const TEST: &str = "a_late_rank_never_blocks_the_host_and_allocations_travel_once";
    const CALLS: usize = 100;
    const LATE: Duration = Duration::from_secs(2);
    if is_child(TEST) {
        ranks(2, |r, c| {
            let x = nccl();
            let s = cpu_stream();
            let count = (8 << 20) / 4;
            let send = Buf::new(&data::bytes(FLOAT32, r, 0, count), true);
            let recv = Buf::new(&data::marked(count * 4), true);
            // Meet first (a small call on the communicator's own stream: complete on return).
            let one = Buf::new(&[0u8; 4], false);
            ok(
                unsafe { (x.all_reduce)(one.ptr(), one.ptr(), 1, INT32, SUM, c.0, STREAM) },
                "meeting",
            );
            if r == 1 {
                std::thread::sleep(LATE);
            }
            let start = Instant::now();
            for k in 0..CALLS {
                ok(
                    unsafe { (x.all_reduce)(send.ptr(), recv.ptr(), count, FLOAT32, SUM, c.0, s) },
                    &format!("all-reduce {k}"),
                );
            }
            let queued = start.elapsed();
            eprintln!("rank {r}: {CALLS} calls queued in {queued:?}");
            if r == 0 {
                assert!(
                    queued < LATE / 2,
                    "rank 0's host waited for rank 1: {queued:?}"
                );
            }
            ok(
                unsafe { (x.cpu_stream_synchronize)(s) },
                "mscclppCpuStreamSynchronize",
            );
            let want: Vec<f64> = (0..count)
                .map(|i| data::reduced(FLOAT32, SUM, 2, 0, i))
                .collect();
            data::check(FLOAT32, &recv.read(), &want, "the 100th all-reduce");
            ok(
                unsafe { (x.cpu_stream_destroy)(s) },
                "mscclppCpuStreamDestroy",
            );
        });
        return;
    }
    let out = spawn_test(
        TEST,
        &[("MSCCLPP_LOG", "warn,mscclpp::collectives::sent=debug")],
    )
    .wait_for(LIMIT);
    let text = out.text();
    assert!(out.success(), "{text}");
    for r in 0..2 {
        assert_eq!(
            sent(&text, r, "a hint"),
            2,
            "rank {r}: each allocation sent once:\n{}",
            text
        );
        assert!(
            sent(&text, r, "scratch region") <= 1,
            "rank {r}: at most the staging region, once:\n{}",
            text
        );
    }
    eprintln!("{text}");
}

/// Item 4: one communicator's calls run in the order they were issued, whatever streams they
/// are queued on. Each rank issues in-place all-reduces of one buffer, each depending on the
/// last one's result, alternately on two streams (and, in between, on the communicator's own
/// stream, which completes on return), at sizes of the LL, LL128 or staged, and direct paths:
/// run together, two of them would share LL slots, flags and scratch, and the data would come
/// out wrong. Every element must be `n^(k-1)` times the sum of the ranks' first values.
#[test]
fn calls_run_in_issue_order_across_streams() {
    const TEST: &str = "calls_run_in_issue_order_across_streams";
    const ROUNDS: usize = 12;
    if is_child(TEST) {
        for n in [2, 3] {
            ranks(n, |r, c| {
                let x = nccl();
                let streams = [cpu_stream(), cpu_stream()];
                for count in [256usize, 64 << 10, 300 << 10] {
                    let first = |q: usize, i: usize| ((q * 31 + i * 7) % 97) as u32;
                    let init: Vec<u8> =
                        (0..count).flat_map(|i| first(r, i).to_le_bytes()).collect();
                    let buf = Buf::new(&init, true);
                    for k in 0..ROUNDS {
                        let s = match k % 3 {
                            0 => streams[0],
                            1 => streams[1],
                            _ => STREAM,
                        };
                        ok(
                            unsafe {
                                (x.all_reduce)(buf.ptr(), buf.ptr(), count, UINT32, SUM, c.0, s)
                            },
                            &format!("all-reduce {k} of {count}"),
                        );
                    }
                    for s in streams {
                        ok(unsafe { (x.cpu_stream_synchronize)(s) }, "synchronize");
                    }
                    let got = buf.read();
                    let scale = (n as u32).wrapping_pow(ROUNDS as u32 - 1);
                    for i in 0..count {
                        let sum = (0..n).fold(0u32, |a, q| a.wrapping_add(first(q, i)));
                        let g = u32::from_le_bytes(got[4 * i..4 * i + 4].try_into().unwrap());
                        assert_eq!(
                            g,
                            sum.wrapping_mul(scale),
                            "{n} ranks, {count} elements: element {i}"
                        );
                    }
                }
                for s in streams {
                    ok(unsafe { (x.cpu_stream_destroy)(s) }, "destroy");
                }
            });
        }
        return;
    }
    isolated(TEST, LIMIT, &[], || {});
}

/// Item 10: a destroyed communicator's handle never names one made later (each of 50
/// communicators made after it is told from it: the old handle stays `ncclInvalidArgument`,
/// and no handle value comes back); `ncclGetLastError` returns the newest error of the
/// process, also to a thread whose own last error is older.
#[test]
fn destroyed_handles_never_alias_and_the_last_error_is_the_newest() {
    const TEST: &str = "destroyed_handles_never_alias_and_the_last_error_is_the_newest";
    if is_child(TEST) {
        let x = nccl();
        let mut seen = std::collections::HashSet::new();
        let first = init_rank(unique_id(), 1, 0);
        seen.insert(first as usize);
        ok(unsafe { (x.comm_destroy)(first) }, "ncclCommDestroy");
        let mut n = 0;
        for k in 0..50 {
            let c = init_rank(unique_id(), 1, 0);
            assert!(
                seen.insert(c as usize),
                "communicator {k}: a handle value came back"
            );
            fails(
                unsafe { (x.comm_count)(first, &mut n) },
                INVALID_ARGUMENT,
                &["not a live communicator"],
                "ncclCommCount on the destroyed handle",
            );
            ok(unsafe { (x.comm_count)(c, &mut n) }, "ncclCommCount");
            assert_eq!(n, 1);
            ok(unsafe { (x.comm_destroy)(c) }, "ncclCommDestroy");
        }

        // Thread A fails, then thread B fails later: A reads B's error (the newest), and its
        // own again once it fails again.
        let (a_failed_tx, a_failed) = std::sync::mpsc::channel::<()>();
        let (b_failed_tx, b_failed) = std::sync::mpsc::channel::<()>();
        let a = std::thread::spawn(move || {
            let x = nccl();
            let mut n = 0;
            fails(
                unsafe { (x.comm_count)(std::ptr::null_mut(), &mut n) },
                INVALID_ARGUMENT,
                &["ncclCommCount"],
                "thread A's error",
            );
            assert!(last_error().contains("ncclCommCount"), "{}", last_error());
            a_failed_tx.send(()).expect("main waits");
            b_failed.recv().expect("main tells");
            let newest = last_error();
            assert!(newest.contains("ncclCommUserRank"), "A reads: {newest}");
            fails(
                unsafe { (x.comm_count)(std::ptr::null_mut(), &mut n) },
                INVALID_ARGUMENT,
                &["ncclCommCount"],
                "thread A's second error",
            );
            assert!(last_error().contains("ncclCommCount"), "{}", last_error());
        });
        a_failed.recv().expect("thread A fails");
        std::thread::spawn(|| {
            let mut r = 0;
            fails(
                unsafe { (nccl().comm_user_rank)(std::ptr::null_mut(), &mut r) },
                INVALID_ARGUMENT,
                &["ncclCommUserRank"],
                "thread B's error",
            );
        })
        .join()
        .expect("thread B");
        b_failed_tx.send(()).expect("thread A waits");
        a.join().expect("thread A");
        return;
    }
    isolated(TEST, LIMIT, &[], || {});
}
