//! The C API by ranks as processes (each a child process of this test binary that loads the
//! library with `dlopen`), in the patterns of its two biggest users: vLLM's `pynccl`
//! (`ncclGetVersion`, a unique id from rank 0, `ncclCommInitRank`, a one-element warm-up
//! all-reduce, then collectives and lone sends and receives along a pipeline) and PyTorch's
//! watchdog (a thread polling `ncclCommGetAsyncError` that aborts the communicator once a
//! killed rank shows up there, releasing the call that waits for it), which then goes on
//! without the dead rank (`ncclCommShrink` with `NCCL_SHRINK_ABORT`) and grows back with a
//! new process (`ncclCommGetUniqueId`, `ncclCommGrow`); and every collective, type and
//! operator (`common::suite`). CPU backend, loopback.

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

/// A child's checked all-reduce of `count` f32 on `c` (`n` ranks, this one `rank`): every
/// element against the host's sum of every rank's values.
fn checked_all_reduce(c: *mut std::ffi::c_void, rank: usize, n: usize, part: usize, what: &str) {
    let x = nccl();
    let count = 1000;
    let b = Buf::new(&data::bytes(FLOAT32, rank, part, count), false);
    ok(
        unsafe { (x.all_reduce)(b.ptr(), b.ptr(), count, FLOAT32, SUM, c, STREAM) },
        what,
    );
    let want: Vec<f64> = (0..count)
        .map(|i| data::reduced(FLOAT32, SUM, n, part, i))
        .collect();
    data::check(FLOAT32, &b.read(), &want, what);
}

/// The C pattern of PyTorch's `shrink_group` after a death: a survivor's calls fail once the
/// victim (the last rank) is killed, `ncclCommGetAsyncError` says `ncclRemoteError`,
/// `ncclCommShrink(NCCL_SHRINK_ABORT)` without it gives a communicator of the survivors
/// (same ranks), whose all-reduces are checked; the old one refuses calls (revoked). Then rank
/// 0 makes a grow id (`ncclCommGetUniqueId`), a new process joins with it
/// (`ncclCommGrow(NULL, …, rank)`) and every rank checks all-reduces of the grown world.
fn shrinking_rank(rank: usize, n: usize) {
    let x = nccl();
    let c = init_rank(child_id(rank), n, rank);
    checked_all_reduce(c, rank, n, 0, "warm-up");
    println!("READY");
    if rank == n - 1 {
        std::thread::sleep(Duration::from_secs(120));
        panic!("rank {rank} was not killed");
    }
    let big = Buf::new(&data::bytes(FLOAT32, rank, 0, 4000), false);
    let t = Instant::now();
    while unsafe { (x.all_reduce)(big.ptr(), big.ptr(), 4000, FLOAT32, SUM, c, STREAM) } == SUCCESS
    {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "all-reduces kept succeeding"
        );
    }
    let mut state = SUCCESS;
    while state == SUCCESS {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no asynchronous error"
        );
        ok(unsafe { (x.comm_get_async_error)(c, &mut state) }, "poll");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(state, REMOTE, "ncclCommGetAsyncError: {}", last_error());
    // Shrink without the victim, revoking the old communicator's work first.
    let mut dead = [(n - 1) as c_int];
    let mut shrunk: *mut std::ffi::c_void = std::ptr::null_mut();
    let flags = 1; // NCCL_SHRINK_ABORT
    ok(
        unsafe {
            (x.comm_shrink)(
                c,
                dead.as_mut_ptr(),
                1,
                &mut shrunk,
                std::ptr::null_mut(),
                flags,
            )
        },
        "ncclCommShrink",
    );
    println!("SHRUNK after {} ms", t.elapsed().as_millis());
    let (mut size, mut me) = (0, -1);
    ok(
        unsafe { (x.comm_count)(shrunk, &mut size) },
        "ncclCommCount",
    );
    ok(
        unsafe { (x.comm_user_rank)(shrunk, &mut me) },
        "ncclCommUserRank",
    );
    assert_eq!((size, me), ((n - 1) as c_int, rank as c_int));
    for part in 1..4 {
        checked_all_reduce(
            shrunk,
            rank,
            n - 1,
            part,
            "an all-reduce of the shrunk world",
        );
    }
    fails(
        unsafe { (x.all_reduce)(big.ptr(), big.ptr(), 4000, FLOAT32, SUM, c, STREAM) },
        INVALID_USAGE,
        &["revoked"],
        "a call on the revoked communicator",
    );
    ok(unsafe { (x.comm_revoke)(c, 0) }, "ncclCommRevoke (again)");
    fails(
        unsafe { (x.comm_revoke)(c, 1) },
        INVALID_ARGUMENT,
        &["revokeFlags"],
        "ncclCommRevoke with a flag",
    );
    ok(
        unsafe { (x.comm_abort)(c) },
        "ncclCommAbort of the old communicator",
    );
    // Grow back: rank 0 makes the id; the parent starts a newcomer with it.
    let mut id = UniqueId([0; 128]);
    let gid = if rank == 0 {
        ok(
            unsafe { (x.comm_get_unique_id)(shrunk, &mut id) },
            "ncclCommGetUniqueId",
        );
        fails(
            unsafe { (x.comm_get_unique_id)(shrunk, &mut UniqueId([0; 128])) },
            INVALID_USAGE,
            &["not been consumed"],
            "a second ncclCommGetUniqueId",
        );
        println!("GROW {}", harness::to_hex(&id.0));
        &id as *const UniqueId
    } else {
        std::ptr::null()
    };
    let mut grown: *mut std::ffi::c_void = std::ptr::null_mut();
    ok(
        unsafe {
            (x.comm_grow)(
                shrunk,
                n as c_int,
                gid,
                -1,
                &mut grown,
                std::ptr::null_mut(),
            )
        },
        "ncclCommGrow",
    );
    ok(
        unsafe { (x.comm_user_rank)(grown, &mut me) },
        "ncclCommUserRank",
    );
    assert_eq!(me, rank as c_int);
    checked_all_reduce(grown, rank, n, 7, "an all-reduce of the grown world");
    for h in [grown, shrunk] {
        ok(unsafe { (x.comm_destroy)(h) }, "ncclCommDestroy");
    }
    println!("DONE");
}

/// A newcomer's grow id (hex), in its environment.
const GROW_ID: &str = "MSCCLPP_NCCL_TEST_GROW_ID";

/// Ranks of the shrink-and-grow world (the last one is killed, a newcomer takes its place).
const SHRINK_RANKS: usize = 4;

/// The newcomer of [`shrinking_rank`]'s world: joins with the grow id in its environment as
/// the last rank (`ncclCommGrow(NULL, …, rank)`) and checks an all-reduce of the grown world.
fn newcomer() {
    let x = nccl();
    let hex = std::env::var(GROW_ID).expect("the grow id");
    let bytes = harness::from_hex(&hex).expect("the grow id in hex");
    let mut id = UniqueId([0; 128]);
    id.0.copy_from_slice(&bytes);
    let (rank, n) = (SHRINK_RANKS - 1, SHRINK_RANKS);
    let mut grown: *mut std::ffi::c_void = std::ptr::null_mut();
    ok(
        unsafe {
            (x.comm_grow)(
                std::ptr::null_mut(),
                n as c_int,
                &id,
                rank as c_int,
                &mut grown,
                std::ptr::null_mut(),
            )
        },
        "ncclCommGrow (a newcomer)",
    );
    checked_all_reduce(grown, rank, n, 7, "an all-reduce of the grown world");
    ok(unsafe { (x.comm_destroy)(grown) }, "ncclCommDestroy");
    println!("DONE");
}

#[test]
fn shrink_after_a_killed_rank_and_grow_back_through_the_c_api() {
    let test = "shrink_after_a_killed_rank_and_grow_back_through_the_c_api";
    if let Some((rank, n)) = place() {
        return shrinking_rank(rank, n);
    }
    if is_child(test) {
        return newcomer();
    }
    let mut children = spawn_world(test, SHRINK_RANKS);
    for c in children.iter_mut() {
        c.read_line_with("READY", Duration::from_secs(60));
    }
    let mut victim = children.pop().expect("the last rank");
    victim.kill();
    let _ = victim.wait_for(Duration::from_secs(10));
    let id = children[0].read_line_with("GROW ", Duration::from_secs(90));
    children.push(spawn_test(test, &[(GROW_ID, id.as_str())]));
    for child in children {
        let out = child.wait_for(Duration::from_secs(120));
        assert!(
            out.success() && out.stdout.contains("DONE"),
            "{}",
            out.text()
        );
        for line in out.stdout.lines().filter(|l| l.contains("SHRUNK")) {
            eprintln!("{line}");
        }
    }
}

/// Issue 30, item 9: on a world of three nodes (each rank a process told its node by
/// `MSCCLPP_HOSTID`, the Ethernet transport between them on loopback), `ncclCommRegister` and
/// `ncclCommWindowRegister` return handles that do no harm: the library registers nothing
/// across nodes, the handles are valid, all-reduces and all-gathers on the buffers are right,
/// and the handles deregister; a lone send and receive, grouped sends and receives around the
/// ring, gather, scatter and reduce are served ([`point_to_point_across_nodes`]).
#[test]
fn across_nodes_registration_does_no_harm_and_point_to_point_is_served() {
    let test = "across_nodes_registration_does_no_harm_and_point_to_point_is_served";
    if let Some((rank, n)) = place() {
        // SAFETY: the child's one test thread sets them before the library is loaded or any
        // thread of it reads the environment.
        unsafe {
            std::env::set_var("MSCCLPP_HOSTID", format!("node{rank}"));
            std::env::set_var("MSCCLPP_NET_TRANSPORT", "ethernet");
        }
        let x = nccl();
        let id = child_id(rank);
        let c = init_rank(id, n, rank);
        let count = 4096;
        let send = Buf::new(&data::bytes(FLOAT32, rank, 0, count), true);
        let recv = Buf::new(&data::marked(n * count * 4), true);
        let sum: Vec<f64> = (0..count)
            .map(|i| data::reduced(FLOAT32, SUM, n, 0, i))
            .collect();
        let gathered: Vec<f64> = (0..n)
            .flat_map(|q| (0..count).map(move |i| data::value(q, 0, i)))
            .collect();
        let both = |what: &str| {
            ok(
                unsafe { (x.all_reduce)(send.ptr(), recv.ptr(), count, FLOAT32, SUM, c, STREAM) },
                what,
            );
            data::check(FLOAT32, &recv.read_range(0..count * 4), &sum, what);
            ok(
                unsafe { (x.all_gather)(send.ptr(), recv.ptr(), count, FLOAT32, c, STREAM) },
                what,
            );
            data::check(FLOAT32, &recv.read(), &gathered, what);
        };
        let (mut hs, mut hr) = (std::ptr::null_mut(), std::ptr::null_mut());
        ok(
            unsafe { (x.comm_register)(c, send.ptr(), count * 4, &mut hs) },
            "ncclCommRegister across nodes",
        );
        ok(
            unsafe { (x.comm_register)(c, recv.ptr(), n * count * 4, &mut hr) },
            "ncclCommRegister across nodes",
        );
        assert!(!hs.is_null() && !hr.is_null() && hs != hr);
        both("on registered buffers across nodes");
        let mut w = std::ptr::null_mut();
        ok(
            unsafe { (x.window_register)(c, recv.ptr(), n * count * 4, &mut w, 0) },
            "ncclCommWindowRegister across nodes",
        );
        both("on a window across nodes");
        ok(
            unsafe { (x.window_deregister)(c, w) },
            "ncclCommWindowDeregister",
        );
        for h in [hs, hr] {
            ok(unsafe { (x.comm_deregister)(c, h) }, "ncclCommDeregister");
        }
        both("after deregistering");
        point_to_point_across_nodes(c, rank, n);
        ok(unsafe { (x.comm_destroy)(c) }, "ncclCommDestroy");
        println!("DONE");
        return;
    }
    for child in spawn_world(test, 3) {
        let out = child.wait_for(Duration::from_secs(120));
        assert!(
            out.success() && out.stdout.contains("DONE"),
            "{}",
            out.text()
        );
    }
}

/// Item 9's point-to-point calls across nodes, every element checked: a lone `ncclSend` from
/// rank 0 to the last rank and its `ncclRecv`; a group of `ncclSend` to the next rank and
/// `ncclRecv` from the previous one; `ncclGather` to, `ncclScatter` from and `ncclReduce` to
/// the last rank.
fn point_to_point_across_nodes(c: *mut std::ffi::c_void, rank: usize, n: usize) {
    let x = nccl();
    let count = 1000;
    let input = Buf::new(&data::bytes(FLOAT32, rank, 0, n * count), false);
    let want = |q: usize, at: usize| -> Vec<f64> {
        (0..count).map(|i| data::value(q, 0, at + i)).collect()
    };
    let last = n - 1;
    let out = Buf::new(&data::marked(count * 4), false);
    if rank == 0 {
        ok(
            unsafe { (x.send)(input.ptr(), count, FLOAT32, last as c_int, c, STREAM) },
            "a lone ncclSend across nodes",
        );
    } else if rank == last {
        ok(
            unsafe { (x.recv)(out.ptr(), count, FLOAT32, 0, c, STREAM) },
            "a lone ncclRecv across nodes",
        );
        data::check(FLOAT32, &out.read(), &want(0, 0), "a lone send and receive");
    }
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    ok(unsafe { (x.group_start)() }, "ncclGroupStart");
    ok(
        unsafe { (x.send)(input.ptr(), count, FLOAT32, next as c_int, c, STREAM) },
        "ncclSend in a group",
    );
    ok(
        unsafe { (x.recv)(out.ptr(), count, FLOAT32, prev as c_int, c, STREAM) },
        "ncclRecv in a group",
    );
    ok(
        unsafe { (x.group_end)() },
        "ncclGroupEnd of sends and receives across nodes",
    );
    data::check(
        FLOAT32,
        &out.read(),
        &want(prev, 0),
        "grouped sends and receives",
    );
    let all = Buf::new(&data::marked(n * count * 4), false);
    ok(
        unsafe {
            (x.gather)(
                input.ptr(),
                all.ptr(),
                count,
                FLOAT32,
                last as c_int,
                c,
                STREAM,
            )
        },
        "ncclGather across nodes",
    );
    if rank == last {
        let w: Vec<f64> = (0..n).flat_map(|q| want(q, 0)).collect();
        data::check(FLOAT32, &all.read(), &w, "gather across nodes");
    }
    ok(
        unsafe {
            (x.scatter)(
                input.ptr(),
                out.ptr(),
                count,
                FLOAT32,
                last as c_int,
                c,
                STREAM,
            )
        },
        "ncclScatter across nodes",
    );
    data::check(
        FLOAT32,
        &out.read(),
        &want(last, rank * count),
        "scatter across nodes",
    );
    // A reduce to the last rank; the others pass no output.
    let sum = Buf::new(&data::marked(count * 4), false);
    let to = if rank == last {
        sum.ptr()
    } else {
        std::ptr::null_mut()
    };
    ok(
        unsafe {
            (x.reduce)(
                input.ptr(),
                to,
                count,
                FLOAT32,
                SUM,
                last as c_int,
                c,
                STREAM,
            )
        },
        "ncclReduce across nodes",
    );
    if rank == last {
        let w: Vec<f64> = (0..count)
            .map(|i| data::reduced(FLOAT32, SUM, n, 0, i))
            .collect();
        data::check(FLOAT32, &sum.read(), &w, "reduce across nodes");
    }
}
