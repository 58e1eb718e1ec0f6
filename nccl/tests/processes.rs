//! The C API by ranks as processes (each a child process of this test binary that loads the
//! library with `dlopen`), in the patterns of its two biggest users: vLLM's `pynccl`
//! (`ncclGetVersion`, a unique id from rank 0, `ncclCommInitRank`, a one-element warm-up
//! all-reduce, then collectives and lone sends and receives along a pipeline) and PyTorch's
//! watchdog (a thread polling `ncclCommGetAsyncError` that aborts the communicator once a
//! killed rank shows up there, releasing the call that waits for it); and every collective,
//! type and operator (`common::suite`). CPU backend, loopback.

mod common;

use std::ffi::c_int;
use std::time::{Duration, Instant};

use common::buf::Buf;
use common::data;
use common::*;

/// In a child: (rank, size) of its world; `None` in the test process.
fn place() -> Option<(usize, usize)> {
    harness::child_place().map(|p| (p.rank, p.size))
}

/// In a child: this rank's id (rank 0 makes it and announces it to the parent).
fn child_id(rank: usize) -> UniqueId {
    if rank == 0 {
        let id = unique_id();
        harness::announce(&harness::to_hex(&id.0));
        return id;
    }
    let hex = harness::child_place()
        .and_then(|p| p.id)
        .expect("the world's id");
    let bytes = harness::from_hex(&hex).expect("the world's id in hex");
    let mut id = UniqueId([0; 128]);
    id.0.copy_from_slice(&bytes);
    id
}

fn vllm_rank(rank: usize, n: usize) {
    let x = nccl();
    let mut v = 0;
    ok(unsafe { (x.get_version)(&mut v) }, "ncclGetVersion");
    assert_eq!((v / 10000, v / 100 % 100, v % 100), (2, 32, 3));
    let id = child_id(rank);
    let c = init_rank(id, n, rank);
    let s = STREAM;
    // Warm-up: one element.
    let one = Buf::new(&((rank + 1) as f32).to_le_bytes(), false);
    ok(
        unsafe { (x.all_reduce)(one.ptr(), one.ptr(), 1, FLOAT32, SUM, c, s) },
        "warm-up",
    );
    assert_eq!(one.read(), ((n * (n + 1) / 2) as f32).to_le_bytes());
    // Tensor-parallel all-reduce in half precision, on ncclMemAlloc memory.
    let count = 4096;
    let a = Buf::new(&data::bytes(FLOAT16, rank, 0, count), true);
    ok(
        unsafe { (x.all_reduce)(a.ptr(), a.ptr(), count, FLOAT16, SUM, c, s) },
        "fp16 all-reduce",
    );
    let want: Vec<f64> = (0..count)
        .map(|i| data::reduced(FLOAT16, SUM, n, 0, i))
        .collect();
    data::check(FLOAT16, &a.read(), &want, "fp16 all-reduce");
    // All-gather and reduce-scatter in bf16.
    let g_in = Buf::new(&data::bytes(BFLOAT16, rank, 1, 100), false);
    let g_out = Buf::new(&data::marked(n * 200), false);
    ok(
        unsafe { (x.all_gather)(g_in.ptr(), g_out.ptr(), 100, BFLOAT16, c, s) },
        "all-gather",
    );
    let want: Vec<f64> = (0..n)
        .flat_map(|q| (0..100).map(move |i| data::value(q, 1, i)))
        .collect();
    data::check(BFLOAT16, &g_out.read(), &want, "all-gather");
    let rs_in = Buf::new(
        &(0..n)
            .flat_map(|p| data::bytes(BFLOAT16, rank, p, 64))
            .collect::<Vec<_>>(),
        false,
    );
    let rs_out = Buf::new(&data::marked(128), false);
    ok(
        unsafe { (x.reduce_scatter)(rs_in.ptr(), rs_out.ptr(), 64, BFLOAT16, SUM, c, s) },
        "reduce-scatter",
    );
    let want: Vec<f64> = (0..64)
        .map(|i| data::reduced(BFLOAT16, SUM, n, rank, i))
        .collect();
    data::check(BFLOAT16, &rs_out.read(), &want, "reduce-scatter");
    // Broadcast from the last rank.
    let b = Buf::new(&data::bytes(INT32, rank, 2, 33), false);
    ok(
        unsafe { (x.broadcast)(b.ptr(), b.ptr(), 33, INT32, (n - 1) as c_int, c, s) },
        "broadcast",
    );
    data::check(
        INT32,
        &b.read(),
        &(0..33)
            .map(|i| data::value(n - 1, 2, i))
            .collect::<Vec<_>>(),
        "broadcast",
    );
    // Pipeline: lone sends and receives along 0 -> 1 -> ... -> n-1.
    let stage = Buf::new(&data::marked(4 * 500), false);
    if rank == 0 {
        let first = Buf::new(&data::bytes(FLOAT32, 0, 3, 500), false);
        ok(
            unsafe { (x.send)(first.ptr(), 500, FLOAT32, 1, c, s) },
            "send",
        );
    } else {
        ok(
            unsafe { (x.recv)(stage.ptr(), 500, FLOAT32, (rank - 1) as c_int, c, s) },
            "recv",
        );
        data::check(
            FLOAT32,
            &stage.read(),
            &(0..500).map(|i| data::value(0, 3, i)).collect::<Vec<_>>(),
            "pipeline",
        );
        if rank + 1 < n {
            ok(
                unsafe { (x.send)(stage.ptr(), 500, FLOAT32, (rank + 1) as c_int, c, s) },
                "send",
            );
        }
    }
    // PyTorch's barrier.
    ok(
        unsafe { (x.all_reduce)(one.ptr(), one.ptr(), 1, FLOAT32, SUM, c, s) },
        "barrier",
    );
    ok(unsafe { (x.comm_destroy)(c) }, "ncclCommDestroy");
    println!("DONE");
}

/// Every collective, type and operator (`common::suite`) by ranks as processes.
#[test]
fn every_collective_as_processes() {
    let test = "every_collective_as_processes";
    if let Some((rank, n)) = place() {
        let c = init_rank(child_id(rank), n, rank);
        common::suite::every_collective(rank, n, Comm(c), 37, false);
        common::suite::every_collective(rank, n, Comm(c), 5, true);
        // The same on the communicator of the even or the odd ranks (ncclCommSplit).
        let mut sub = std::ptr::null_mut();
        ok(
            unsafe {
                (nccl().comm_split)(c, (rank % 2) as c_int, 0, &mut sub, std::ptr::null_mut())
            },
            "ncclCommSplit",
        );
        let (mine, subn) = (rank / 2, n.div_ceil(2) - (rank % 2) * (n % 2));
        common::suite::every_collective(mine, subn, Comm(sub), 7, false);
        ok(unsafe { (nccl().comm_destroy)(sub) }, "destroy the split");
        ok(unsafe { (nccl().comm_destroy)(c) }, "ncclCommDestroy");
        println!("DONE");
        return;
    }
    for n in [2, 3, 4] {
        for child in spawn_world(test, n) {
            let out = child.wait_for(Duration::from_secs(240));
            assert!(
                out.success() && out.stdout.contains("DONE"),
                "{}",
                out.text()
            );
        }
    }
}

#[test]
fn vllm_and_pytorch_patterns_as_processes() {
    let test = "vllm_and_pytorch_patterns_as_processes";
    if let Some((rank, n)) = place() {
        return vllm_rank(rank, n);
    }
    for n in [2, 3] {
        for child in spawn_world(test, n) {
            let out = child.wait_for(Duration::from_secs(120));
            assert!(
                out.success() && out.stdout.contains("DONE"),
                "{}",
                out.text()
            );
        }
    }
}

fn watched_rank(rank: usize, n: usize) {
    let x = nccl();
    let id = child_id(rank);
    let c = init_rank(id, n, rank);
    let one = Buf::new(&1f32.to_le_bytes(), false);
    ok(
        unsafe { (x.all_reduce)(one.ptr(), one.ptr(), 1, FLOAT32, SUM, c, STREAM) },
        "warm-up",
    );
    let mut state = -1;
    ok(unsafe { (x.comm_get_async_error)(c, &mut state) }, "poll");
    assert_eq!(state, SUCCESS, "no error before the kill");
    if rank == n - 1 {
        // The victim: waits to be killed.
        println!("READY");
        std::thread::sleep(Duration::from_secs(120));
        panic!("rank {rank} was not killed");
    }
    let cc = Comm(c);
    std::thread::scope(|s| {
        // The watchdog.
        let watchdog = s.spawn(move || {
            let cc = cc;
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut state = SUCCESS;
            while state == SUCCESS {
                assert!(
                    Instant::now() < deadline,
                    "no asynchronous error within 60 s"
                );
                ok(
                    unsafe { (x.comm_get_async_error)(cc.0, &mut state) },
                    "poll",
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            let text = last_error();
            let t = Instant::now();
            ok(unsafe { (x.comm_abort)(cc.0) }, "ncclCommAbort");
            let took = t.elapsed();
            assert!(took < Duration::from_secs(5), "ncclCommAbort took {took:?}");
            (state, text)
        });
        println!("READY");
        // The training loop: all-reduces until one fails (the one that waits for the dead
        // rank is released by the abort).
        let big = Buf::new(&data::bytes(FLOAT32, rank, 0, 4000), false);
        let t = Instant::now();
        loop {
            let r =
                unsafe { (x.all_reduce)(big.ptr(), big.ptr(), 4000, FLOAT32, SUM, cc.0, STREAM) };
            if r != SUCCESS {
                println!("CALL {r}: {}", last_error());
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "all-reduces kept succeeding"
            );
        }
        let (state, text) = watchdog.join().expect("the watchdog");
        assert_eq!(state, REMOTE, "ncclCommGetAsyncError: {text}");
        assert!(text.contains("rank"), "{text}");
        println!("ASYNC {state}: {text}");
        // Sticky and gone: the handle is no longer valid after the abort.
        let mut again = 0;
        fails(
            unsafe { (x.comm_get_async_error)(cc.0, &mut again) },
            INVALID_ARGUMENT,
            &["not a live"],
            "after abort",
        );
    });
    println!("DONE");
}

#[test]
fn watchdog_sees_a_killed_rank_and_aborts() {
    let test = "watchdog_sees_a_killed_rank_and_aborts";
    if let Some((rank, n)) = place() {
        return watched_rank(rank, n);
    }
    let n = 3;
    let mut children = spawn_world(test, n);
    for c in children.iter_mut() {
        c.read_line_with("READY", Duration::from_secs(60));
    }
    let mut victim = children.pop().expect("the last rank");
    victim.kill();
    let _ = victim.wait_for(Duration::from_secs(10));
    for child in children {
        let out = child.wait_for(Duration::from_secs(90));
        assert!(
            out.success() && out.stdout.contains("DONE"),
            "{}",
            out.text()
        );
        assert!(out.stdout.contains("ASYNC 6"), "{}", out.text());
        for line in out
            .stdout
            .lines()
            .filter(|l| l.contains("ASYNC") || l.contains("CALL"))
        {
            eprintln!("{line}");
        }
    }
}
