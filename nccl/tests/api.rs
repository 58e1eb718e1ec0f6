//! The C API of the drop-in library, through its C symbols (`dlopen`), by ranks as threads of
//! one process: every function, the argument checks and their codes, groups, registration,
//! and every served collective, type and operator checked element by element against a host
//! reference, on 1 to 8 ranks, in place and out of place, at zero and awkward counts. Each
//! scenario runs in a child process of its own on the CPU backend (`common::isolated`).

mod common;

use std::ffi::{CStr, c_int, c_void};
use std::time::{Duration, Instant};

use common::buf::Buf;
use common::data::{self, TYPES};
use common::ffi::{CollConfig, Config, Team, symbol};
use common::suite::every_collective;
use common::*;

const LIMIT: Duration = Duration::from_secs(300);

/// Zero counts: every call succeeds and writes nothing.
fn zero_counts(r: usize, c: Comm) {
    let x = nccl();
    let recv = Buf::new(&data::marked(64), false);
    let p = recv.ptr();
    for (t, _) in TYPES {
        ok(
            unsafe { (x.all_reduce)(p, p, 0, t, SUM, c.0, STREAM) },
            "0 all-reduce",
        );
        ok(
            unsafe { (x.all_gather)(p, p, 0, t, c.0, STREAM) },
            "0 all-gather",
        );
        ok(
            unsafe { (x.reduce_scatter)(p, p, 0, t, MAX, c.0, STREAM) },
            "0 reduce-scatter",
        );
        ok(
            unsafe { (x.broadcast)(p, p, 0, t, 0, c.0, STREAM) },
            "0 broadcast",
        );
        ok(
            unsafe { (x.all_to_all)(p, p, 0, t, c.0, STREAM) },
            "0 all-to-all",
        );
        // Null buffers are fine when nothing moves.
        let null = std::ptr::null_mut();
        ok(
            unsafe { (x.all_reduce)(null, null, 0, t, SUM, c.0, STREAM) },
            "0 all-reduce, null",
        );
    }
    assert_eq!(
        recv.read(),
        data::marked(64),
        "rank {r}: a zero-count call wrote"
    );
}

#[test]
fn collectives_on_one_rank() {
    isolated("collectives_on_one_rank", LIMIT, &[], || {
        ranks(1, |r, c| {
            every_collective(r, 1, c, 37, false);
            every_collective(r, 1, c, 37, true);
            zero_counts(r, c);
        });
    });
}

#[test]
fn collectives_on_two_ranks() {
    isolated("collectives_on_two_ranks", LIMIT, &[], || {
        ranks(2, |r, c| {
            every_collective(r, 2, c, 1, false);
            every_collective(r, 2, c, 37, false);
            // 3000 elements: parts of 6 to 12 KiB, past the CPU backend's zero-copy threshold.
            every_collective(r, 2, c, 3000, true);
            zero_counts(r, c);
        });
    });
}

#[test]
fn collectives_on_three_ranks() {
    isolated("collectives_on_three_ranks", LIMIT, &[], || {
        ranks(3, |r, c| {
            every_collective(r, 3, c, 37, false);
            every_collective(r, 3, c, 1500, true);
        });
    });
}

#[test]
fn collectives_on_four_ranks() {
    isolated("collectives_on_four_ranks", LIMIT, &[], || {
        ranks(4, |r, c| {
            every_collective(r, 4, c, 129, true);
            zero_counts(r, c);
        });
    });
}

#[test]
fn collectives_on_eight_ranks() {
    isolated("collectives_on_eight_ranks", LIMIT, &[], || {
        ranks(8, |r, c| every_collective(r, 8, c, 5, false));
    });
}

/// Large messages (staging in pieces, the copy engines on registered memory): f32 sums.
#[test]
fn large_messages_on_two_ranks() {
    isolated("large_messages_on_two_ranks", LIMIT, &[], || {
        ranks(2, |r, c| {
            let x = nccl();
            let count = 100_000;
            for nccl_mem in [false, true] {
                let send = Buf::new(&data::bytes(FLOAT32, r, 0, count), nccl_mem);
                let recv = Buf::new(&data::marked(count * 4), nccl_mem);
                ok(
                    unsafe {
                        (x.all_reduce)(send.ptr(), recv.ptr(), count, FLOAT32, SUM, c.0, STREAM)
                    },
                    "large all-reduce",
                );
                let want: Vec<f64> = (0..count)
                    .map(|i| data::reduced(FLOAT32, SUM, 2, 0, i))
                    .collect();
                data::check(FLOAT32, &recv.read(), &want, "large all-reduce");
                let all = Buf::new(&data::marked(2 * count * 4), nccl_mem);
                ok(
                    unsafe { (x.all_gather)(send.ptr(), all.ptr(), count, FLOAT32, c.0, STREAM) },
                    "large all-gather",
                );
                let want: Vec<f64> = (0..2)
                    .flat_map(|q| (0..count).map(move |i| data::value(q, 0, i)))
                    .collect();
                data::check(FLOAT32, &all.read(), &want, "large all-gather");
            }
        });
    });
}

fn cstr(p: *const std::ffi::c_char) -> String {
    assert!(!p.is_null());
    // SAFETY: the library returns NUL-terminated strings.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

#[test]
fn version_error_strings_and_bad_handles() {
    isolated("version_error_strings_and_bad_handles", LIMIT, &[], || {
        let x = nccl();
        let mut v = 0;
        ok(unsafe { (x.get_version)(&mut v) }, "ncclGetVersion");
        assert_eq!(v, 23203, "NCCL 2.32.3's version code");
        fails(
            unsafe { (x.get_version)(std::ptr::null_mut()) },
            INVALID_ARGUMENT,
            &["ncclGetVersion", "version is null"],
            "ncclGetVersion(NULL)",
        );
        let texts: Vec<String> = (0..10)
            .map(|code| cstr(unsafe { (x.get_error_string)(code) }))
            .collect();
        for (i, t) in texts.iter().enumerate() {
            assert!(!t.is_empty(), "code {i}");
            assert_eq!(texts.iter().filter(|u| *u == t).count(), 1, "{t} twice");
        }
        assert_eq!(texts[0], "no error");
        assert_eq!(
            cstr(unsafe { (x.get_error_string)(-5) }),
            "unknown result code"
        );
        assert_eq!(
            cstr(unsafe { (x.get_error_string)(1000) }),
            "unknown result code"
        );

        // Null, foreign and destroyed communicators.
        let null = std::ptr::null_mut();
        let mut n = 0;
        let foreign = 0x1234 as *mut c_void;
        for comm in [null, foreign] {
            fails(
                unsafe { (x.all_reduce)(null, null, 0, FLOAT32, SUM, comm, STREAM) },
                INVALID_ARGUMENT,
                &["not a live communicator"],
                "ncclAllReduce on a bad communicator",
            );
            fails(
                unsafe { (x.comm_count)(comm, &mut n) },
                INVALID_ARGUMENT,
                &["ncclCommCount"],
                "ncclCommCount on a bad communicator",
            );
        }
        ok(unsafe { (x.comm_destroy)(null) }, "ncclCommDestroy(NULL)");
        ok(unsafe { (x.comm_abort)(null) }, "ncclCommAbort(NULL)");
        let c = init_rank(unique_id(), 1, 0);
        ok(unsafe { (x.comm_destroy)(c) }, "ncclCommDestroy");
        fails(
            unsafe { (x.comm_destroy)(c) },
            INVALID_ARGUMENT,
            &["not a live communicator"],
            "a second ncclCommDestroy",
        );
        fails(
            unsafe { (x.comm_user_rank)(c, &mut n) },
            INVALID_ARGUMENT,
            &[],
            "ncclCommUserRank after destroy",
        );

        // Unique ids made elsewhere are refused; a bad rank or size too.
        let mut bad = unique_id();
        bad.0[100] = 1;
        let mut out = null;
        fails(
            unsafe { (x.comm_init_rank)(&mut out, 1, bad, 0) },
            INVALID_ARGUMENT,
            &["ncclUniqueId"],
            "a foreign id",
        );
        fails(
            unsafe { (x.comm_init_rank)(&mut out, 1, UniqueId([0; 128]), 0) },
            INVALID_ARGUMENT,
            &["ncclUniqueId"],
            "a zero id",
        );
        let id = unique_id();
        fails(
            unsafe { (x.comm_init_rank)(&mut out, 2, id, 2) },
            INVALID_ARGUMENT,
            &["rank is 2"],
            "rank out of range",
        );
        fails(
            unsafe { (x.comm_init_rank)(&mut out, 0, id, 0) },
            INVALID_ARGUMENT,
            &["nranks"],
            "no ranks",
        );
        fails(
            unsafe { (x.comm_init_rank)(std::ptr::null_mut(), 1, id, 0) },
            INVALID_ARGUMENT,
            &["comm is null"],
            "no place for the handle",
        );
        fails(
            unsafe { (x.get_unique_id)(std::ptr::null_mut()) },
            INVALID_ARGUMENT,
            &["uniqueId"],
            "ncclGetUniqueId(NULL)",
        );
        // Groups must balance.
        fails(
            unsafe { (x.group_end)() },
            INVALID_USAGE,
            &["ncclGroupEnd without"],
            "unbalanced",
        );
        // The last error of another thread is seen by a thread without errors of its own.
        std::thread::spawn(|| assert!(last_error().contains("ncclGroupEnd without")))
            .join()
            .unwrap();
    });
}

/// Every exported function NCCL has and this library does not implement refuses with
/// `ncclInvalidUsage` and says why; none succeeds.
#[test]
fn stubs_refuse_and_say_why() {
    isolated("stubs_refuse_and_say_why", LIMIT, &[], || {
        let x = nccl();
        let h = x.handle as *mut c_void;
        let c = init_rank(unique_id(), 1, 0);
        let p = std::ptr::null_mut::<c_void>();
        type F6 = unsafe extern "C" fn(
            *mut c_void,
            *mut c_void,
            *mut c_void,
            *mut c_void,
            *mut c_void,
            *mut c_void,
        ) -> c_int;
        // Called through one prototype, six pointer-sized arguments (the communicator first):
        // a stub reads none of its arguments, and on x86-64 System V (the only target these
        // tests build for) arguments a callee does not read are left in registers or on the
        // caller's stack, which the caller cleans. The C ABI test calls those of nccl.h with
        // their own prototypes.
        let stubs = [
            "ncclCommSuspend",
            "ncclCommResume",
            "ncclCommMemStats",
            "ncclCommQueryProperties",
            "ncclDevCommCreate",
            "ncclDevCommDestroy",
        ];
        for name in stubs {
            for prefix in ["", "p"] {
                let full = format!("{prefix}{name}");
                // SAFETY: every stub returns ncclResult_t (an int) and reads no argument (above).
                let f: F6 = unsafe { std::mem::transmute(symbol(h, &full)) };
                fails(
                    unsafe { f(c, p, p, p, p, p) },
                    INVALID_USAGE,
                    &[name, "not implemented"],
                    &full,
                );
            }
        }
        let no_comm = [
            "ncclSetEncryption",
            "ncclParamBind",
            "ncclParamGetI8",
            "ncclParamGetI16",
            "ncclParamGetI32",
            "ncclParamGetI64",
            "ncclParamGetU8",
            "ncclParamGetU16",
            "ncclParamGetU32",
            "ncclParamGetU64",
            "ncclParamGetStr",
            "ncclParamGet",
            "ncclParamGetParameter",
            "ncclParamGetAllParameterKeys",
            "ncclGetLsaMultimemDevicePointer",
            "ncclGetMultimemDevicePointer",
            "ncclGetLsaDevicePointer",
            "ncclGetPeerDevicePointer",
            "ncclGetMultimemDeviceLeInfo",
            "ncclGetCftDeviceLeInfo",
            "ncclGetPeerDeviceLeInfo",
            "ncclLsaBarrierCreateRequirement",
            "ncclGinBarrierCreateRequirement",
            "ncclCftBarrierCreateRequirement",
            "ncclLLA2ACreateRequirement",
            "ncclGinOutboxCreateRequirement",
            "ncclGinInboxA2ACreateRequirement",
        ];
        for name in no_comm {
            // SAFETY: as above.
            let f: F6 = unsafe { std::mem::transmute(symbol(h, name)) };
            fails(
                unsafe { f(p, p, p, p, p, p) },
                INVALID_USAGE,
                &[name, "not implemented"],
                name,
            );
        }
        // Team functions return an empty team, the slot calculator -1; both say why.
        assert_eq!(unsafe { (x.team_world)(c) }, Team::default());
        assert!(last_error().contains("ncclTeamWorld"), "{}", last_error());
        assert_eq!(unsafe { (x.lla2a_calc_slots)(16, 8) }, -1);
        assert!(
            last_error().contains("ncclLLA2ACalcSlots"),
            "{}",
            last_error()
        );
        for name in ["ncclResetDebugInit", "ncclResetDebugInitInternal"] {
            // SAFETY: `void f(void)`.
            let f: unsafe extern "C" fn() = unsafe { std::mem::transmute(symbol(h, name)) };
            unsafe { f() };
            assert!(last_error().contains(name), "{}", last_error());
        }
        // ncclParamDumpAll logs the settings; it has nothing to refuse.
        // SAFETY: `void f(void)`.
        let dump: unsafe extern "C" fn() =
            unsafe { std::mem::transmute(symbol(h, "ncclParamDumpAll")) };
        unsafe { dump() };
        // Simulating a group closes it, runs nothing and says so.
        ok(unsafe { (x.group_start)() }, "ncclGroupStart");
        let v = Buf::new(&data::bytes(FLOAT32, 0, 0, 4), false);
        ok(
            unsafe { (x.all_reduce)(v.ptr(), v.ptr(), 4, FLOAT32, SUM, c, STREAM) },
            "recorded",
        );
        fails(
            unsafe { (x.group_simulate_end)(p) },
            INVALID_USAGE,
            &["ncclGroupSimulateEnd", "nothing ran"],
            "ncclGroupSimulateEnd",
        );
        fails(
            unsafe { (x.group_end)() },
            INVALID_USAGE,
            &["without ncclGroupStart"],
            "closed",
        );
        ok(unsafe { (x.comm_destroy)(c) }, "ncclCommDestroy");
    });
}

/// Argument checks of the collectives, operators, split and per-call configs, on one rank.
#[test]
fn argument_checks() {
    isolated("argument_checks", LIMIT, &[], || {
        let x = nccl();
        let c = init_rank(unique_id(), 1, 0);
        let b = Buf::new(&data::marked(1024), false);
        let (p, q) = (b.ptr(), b.at(512));
        let null = std::ptr::null_mut();
        // Types and operators.
        for t in [-1, 12, 1000] {
            fails(
                unsafe { (x.all_reduce)(p, q, 4, t, SUM, c, STREAM) },
                INVALID_ARGUMENT,
                &["is not an ncclDataType_t"],
                "bad type",
            );
        }
        // A pre-multiplied sum is for the type it was made for.
        let mut two = 2.0f32;
        let mut op = -1;
        ok(
            unsafe { (x.red_op_create_pre_mul_sum)(&mut op, (&raw mut two).cast(), FLOAT32, 1, c) },
            "ncclRedOpCreatePreMulSum",
        );
        fails(
            unsafe { (x.all_reduce)(p, q, 4, INT32, op, c, STREAM) },
            INVALID_ARGUMENT,
            &["ncclFloat32", "not ncclInt32"],
            "a pre-multiplied sum of another type",
        );
        fails(
            unsafe { (x.reduce)(p, q, 4, FLOAT16, op, 0, c, STREAM) },
            INVALID_ARGUMENT,
            &["ncclFloat32", "not ncclFloat16"],
            "a pre-multiplied sum of another type (reduce)",
        );
        ok(unsafe { (x.red_op_destroy)(op, c) }, "ncclRedOpDestroy");
        fails(
            unsafe { (x.reduce_scatter)(p, q, 4, FLOAT32, op, c, STREAM) },
            INVALID_ARGUMENT,
            &["not a live operator"],
            "a destroyed pre-multiplied sum",
        );
        fails(
            unsafe { (x.all_reduce)(p, q, 4, FLOAT32, -2, c, STREAM) },
            INVALID_ARGUMENT,
            &["not an ncclRedOp_t"],
            "bad op",
        );
        fails(
            unsafe { (x.all_reduce)(p, q, 4, FLOAT32, 77, c, STREAM) },
            INVALID_ARGUMENT,
            &["not a live operator"],
            "unknown dynamic op",
        );
        // Counts that overflow, null buffers, ranks out of range.
        fails(
            unsafe { (x.all_reduce)(p, q, usize::MAX / 2, FLOAT32, SUM, c, STREAM) },
            INVALID_ARGUMENT,
            &["overflow"],
            "count overflow",
        );
        fails(
            unsafe { (x.all_reduce)(null, q, 4, FLOAT32, SUM, c, STREAM) },
            INVALID_ARGUMENT,
            &["sendbuff is null"],
            "null sendbuff",
        );
        fails(
            unsafe { (x.all_gather)(p, null, 4, FLOAT32, c, STREAM) },
            INVALID_ARGUMENT,
            &["recvbuff is null"],
            "null recvbuff",
        );
        fails(
            unsafe { (x.broadcast)(p, q, 4, FLOAT32, 1, c, STREAM) },
            INVALID_ARGUMENT,
            &["root is 1"],
            "root out of range",
        );
        fails(
            unsafe { (x.send)(p, 4, FLOAT32, 1, c, STREAM) },
            INVALID_ARGUMENT,
            &["peer is 1"],
            "peer out of range",
        );
        fails(
            unsafe { (x.send)(p, 4, FLOAT32, 0, c, STREAM) },
            INVALID_USAGE,
            &["itself"],
            "a lone send to itself",
        );
        // Reduce, gather, scatter: roots and the buffers the root needs.
        fails(
            unsafe { (x.reduce)(p, q, 4, FLOAT32, SUM, 3, c, STREAM) },
            INVALID_ARGUMENT,
            &["root is 3"],
            "ncclReduce with a bad root",
        );
        fails(
            unsafe { (x.reduce)(p, null, 4, FLOAT32, SUM, 0, c, STREAM) },
            INVALID_ARGUMENT,
            &["recvbuff is null"],
            "ncclReduce without a result on the root",
        );
        fails(
            unsafe { (x.reduce)(p, q, 4, FLOAT32, 9, 0, c, STREAM) },
            INVALID_ARGUMENT,
            &["not a live operator"],
            "ncclReduce with an unknown operator",
        );
        fails(
            unsafe { (x.gather)(p, null, 4, FLOAT32, 0, c, STREAM) },
            INVALID_ARGUMENT,
            &["recvbuff is null"],
            "ncclGather without a result on the root",
        );
        fails(
            unsafe { (x.gather)(p, q, 4, FLOAT32, -1, c, STREAM) },
            INVALID_ARGUMENT,
            &["root is -1"],
            "ncclGather with a bad root",
        );
        fails(
            unsafe { (x.scatter)(null, q, 4, FLOAT32, 0, c, STREAM) },
            INVALID_ARGUMENT,
            &["sendbuff is null"],
            "ncclScatter without data on the root",
        );
        fails(
            unsafe { (x.scatter)(p, q, usize::MAX / 2 + 1, INT8, 0, c, STREAM) },
            INVALID_ARGUMENT,
            &["overflow"],
            "ncclScatter count overflow",
        );
        // Split: a bad color, no newcomm.
        let mut nc = null;
        fails(
            unsafe { (x.comm_split)(c, -7, 0, &mut nc, std::ptr::null_mut()) },
            INVALID_ARGUMENT,
            &["color"],
            "a bad color",
        );
        fails(
            unsafe { (x.comm_split)(c, 0, 0, std::ptr::null_mut(), std::ptr::null_mut()) },
            INVALID_ARGUMENT,
            &["newcomm is null"],
            "no newcomm",
        );
        // Per-call configs: read by size and magic; a forced NCCL algorithm is refused.
        let v = Buf::new(&data::bytes(FLOAT32, 0, 0, 4), false);
        let o = Buf::new(&data::marked(16), false);
        ok(
            unsafe {
                (x.all_reduce_config)(
                    v.ptr(),
                    o.ptr(),
                    4,
                    FLOAT32,
                    SUM,
                    c,
                    STREAM,
                    std::ptr::null(),
                )
            },
            "ncclAllReduceConfig(NULL)",
        );
        let mut cfg = CollConfig::default();
        ok(
            unsafe { (x.all_reduce_config)(v.ptr(), o.ptr(), 4, FLOAT32, SUM, c, STREAM, &cfg) },
            "ncclAllReduceConfig(initializer)",
        );
        data::check(
            FLOAT32,
            &o.read(),
            &(0..4).map(|i| data::value(0, 0, i)).collect::<Vec<_>>(),
            "config",
        );
        cfg.alg_selection = c"ring".as_ptr();
        fails(
            unsafe { (x.all_gather_config)(v.ptr(), o.ptr(), 4, FLOAT32, c, STREAM, &cfg) },
            INVALID_USAGE,
            &["algSelection"],
            "a forced NCCL algorithm",
        );
        cfg.force_alg_selection = 0;
        ok(
            unsafe { (x.all_gather_config)(v.ptr(), o.ptr(), 4, FLOAT32, c, STREAM, &cfg) },
            "an NCCL algorithm as a hint",
        );
        let bad = CollConfig {
            magic: 1,
            ..CollConfig::default()
        };
        fails(
            unsafe { (x.all_gather_config)(v.ptr(), o.ptr(), 4, FLOAT32, c, STREAM, &bad) },
            INVALID_ARGUMENT,
            &["magic"],
            "an uninitialised config",
        );
        // After ncclCommFinalize only ncclCommDestroy may follow.
        ok(unsafe { (x.comm_finalize)(c) }, "ncclCommFinalize");
        fails(
            unsafe { (x.all_reduce)(v.ptr(), o.ptr(), 4, FLOAT32, SUM, c, STREAM) },
            INVALID_USAGE,
            &["finalized"],
            "a call after finalize",
        );
        ok(unsafe { (x.comm_destroy)(c) }, "ncclCommDestroy");
    });
}

/// `ncclCommCount` and `ncclCommUserRank` of `c`.
fn count_and_rank(c: *mut c_void) -> (usize, usize) {
    let x = nccl();
    let (mut n, mut r) = (-1, -1);
    ok(unsafe { (x.comm_count)(c, &mut n) }, "ncclCommCount");
    ok(unsafe { (x.comm_user_rank)(c, &mut r) }, "ncclCommUserRank");
    (n as usize, r as usize)
}

/// A sum all-reduce of 21 f32 on `c` by the ranks `members` (in their new order), checked.
fn sum_on(c: *mut c_void, members: &[usize], me: usize, part: usize) {
    let x = nccl();
    let b = Buf::new(&data::bytes(FLOAT32, me, part, 21), false);
    ok(
        unsafe { (x.all_reduce)(b.ptr(), b.ptr(), 21, FLOAT32, SUM, c, STREAM) },
        "an all-reduce on a split",
    );
    let want: Vec<f64> = (0..21)
        .map(|i| members.iter().map(|&q| data::value(q, part, i)).sum())
        .collect();
    data::check(FLOAT32, &b.read(), &want, "an all-reduce on a split");
}

/// `ncclCommSplit` by ranks as threads: colors and keys (reversed order), no color, a 2-rank
/// split per send/receive pair (PyTorch's), a split of a split; each new communicator works
/// and lives on after its parent is destroyed.
#[test]
fn splits_as_threads() {
    isolated("splits_as_threads", LIMIT, &[], || {
        let n = 5;
        let subs = ranks(n, |r, c| {
            let cfg = std::ptr::null_mut();
            let x = nccl();
            // Even and odd ranks, ranked by descending parent rank.
            let mut sub = std::ptr::null_mut();
            ok(
                unsafe { (x.comm_split)(c.0, (r % 2) as c_int, -(r as c_int), &mut sub, cfg) },
                "ncclCommSplit by parity",
            );
            let members: Vec<usize> = (0..n).rev().filter(|q| q % 2 == r % 2).collect();
            let at = members.iter().position(|&q| q == r).expect("a member");
            assert_eq!(count_and_rank(sub), (members.len(), at), "rank {r}");
            sum_on(sub, &members, r, 1);
            // A split of the split: its first two members, the rest without a color.
            let color = if at < 2 { 0 } else { -1 };
            let mut subsub = std::ptr::null_mut();
            ok(
                unsafe { (x.comm_split)(sub, color, 0, &mut subsub, cfg) },
                "a split of a split",
            );
            if at < 2 {
                assert_eq!(count_and_rank(subsub), (2, at));
                sum_on(subsub, &members[..2], r, 2);
            } else {
                assert!(subsub.is_null(), "NCCL_SPLIT_NOCOLOR gave a communicator");
            }
            // PyTorch's 2-rank communicator of a send/receive pair (0 and 3): the others take
            // part without a color.
            let pair = [0, 3];
            let color = if pair.contains(&r) { 7 } else { -1 };
            let mut p2p = std::ptr::null_mut();
            ok(
                unsafe { (x.comm_split)(c.0, color, r as c_int, &mut p2p, cfg) },
                "a pair's split",
            );
            if pair.contains(&r) {
                let peer = if r == 0 { 1 } else { 0 };
                let mine = Buf::new(&data::bytes(INT32, r, 3, 40), false);
                let got = Buf::new(&data::marked(160), false);
                ok(unsafe { (x.group_start)() }, "ncclGroupStart");
                ok(
                    unsafe { (x.send)(mine.ptr(), 40, INT32, peer, p2p, STREAM) },
                    "ncclSend on the pair",
                );
                ok(
                    unsafe { (x.recv)(got.ptr(), 40, INT32, peer, p2p, STREAM) },
                    "ncclRecv on the pair",
                );
                ok(unsafe { (x.group_end)() }, "ncclGroupEnd");
                let other = pair[peer as usize];
                let want: Vec<f64> = (0..40).map(|i| data::value(other, 3, i)).collect();
                data::check(INT32, &got.read(), &want, "a send on the pair");
                ok(unsafe { (x.comm_destroy)(p2p) }, "destroy the pair");
            } else {
                assert!(p2p.is_null());
            }
            if !subsub.is_null() {
                ok(
                    unsafe { (x.comm_destroy)(subsub) },
                    "destroy a split of a split",
                );
            }
            (r, Comm(sub))
        });
        // The parents are destroyed: the splits still work.
        std::thread::scope(|s| {
            for (r, sub) in subs {
                s.spawn(move || {
                    let sub = sub; // the whole handle (Send), not its raw field
                    let members: Vec<usize> = (0..n).rev().filter(|q| q % 2 == r % 2).collect();
                    sum_on(sub.0, &members, r, 4);
                    ok(unsafe { (nccl().comm_destroy)(sub.0) }, "destroy a split");
                });
            }
        });
    });
}

/// One thread splits the communicators of four ranks inside a group (the splits run at
/// `ncclGroupEnd`); until then the new handles say they are pending.
#[test]
fn splits_in_a_group() {
    isolated("splits_in_a_group", LIMIT, &[], || {
        let x = nccl();
        let n = 4;
        let mut comms = vec![std::ptr::null_mut(); n];
        ok(
            unsafe { (x.comm_init_all)(comms.as_mut_ptr(), n as c_int, std::ptr::null()) },
            "ncclCommInitAll",
        );
        let mut subs = vec![std::ptr::null_mut(); n];
        ok(unsafe { (x.group_start)() }, "ncclGroupStart");
        for r in 0..n {
            let color = if r == 2 { -1 } else { 0 };
            ok(
                unsafe { (x.comm_split)(comms[r], color, 0, &mut subs[r], std::ptr::null_mut()) },
                "ncclCommSplit in a group",
            );
        }
        let mut count = 0;
        fails(
            unsafe { (x.comm_count)(subs[0], &mut count) },
            INVALID_USAGE,
            &["still being initialised"],
            "the size of a pending split",
        );
        ok(unsafe { (x.group_end)() }, "ncclGroupEnd");
        assert!(subs[2].is_null(), "NCCL_SPLIT_NOCOLOR gave a communicator");
        let members = [0, 1, 3];
        let bufs: Vec<Buf> = members
            .iter()
            .map(|&r| Buf::new(&data::bytes(FLOAT32, r, 5, 21), false))
            .collect();
        ok(unsafe { (x.group_start)() }, "ncclGroupStart");
        for (i, &r) in members.iter().enumerate() {
            assert_eq!(count_and_rank(subs[r]), (3, i));
            ok(
                unsafe {
                    (x.all_reduce)(
                        bufs[i].ptr(),
                        bufs[i].ptr(),
                        21,
                        FLOAT32,
                        SUM,
                        subs[r],
                        STREAM,
                    )
                },
                "a grouped all-reduce on the splits",
            );
        }
        ok(unsafe { (x.group_end)() }, "ncclGroupEnd");
        let want: Vec<f64> = (0..21)
            .map(|i| members.iter().map(|&q| data::value(q, 5, i)).sum())
            .collect();
        for b in &bufs {
            data::check(
                FLOAT32,
                &b.read(),
                &want,
                "grouped all-reduce on the splits",
            );
        }
        for c in subs.into_iter().chain(comms).filter(|c| !c.is_null()) {
            ok(unsafe { (x.comm_destroy)(c) }, "ncclCommDestroy");
        }
    });
}

/// Collectives on buffers registered with `ncclCommRegister` and on windows of
/// `ncclCommWindowRegister` (collective), by 3 ranks as threads; then deregistered, the same
/// buffers still work (the per-call exchange).
#[test]
fn registered_buffers_and_windows() {
    isolated("registered_buffers_and_windows", LIMIT, &[], || {
        let n = 3;
        ranks(n, |r, c| {
            let x = nccl();
            let count = 3000;
            let send = Buf::new(&data::bytes(FLOAT32, r, 0, count), true);
            let recv = Buf::new(&data::marked(n * count * 4), true);
            let (mut hs, mut hr) = (std::ptr::null_mut(), std::ptr::null_mut());
            ok(
                unsafe { (x.comm_register)(c.0, send.ptr(), count * 4, &mut hs) },
                "ncclCommRegister",
            );
            ok(
                unsafe { (x.comm_register)(c.0, recv.ptr(), n * count * 4, &mut hr) },
                "ncclCommRegister",
            );
            let gathered: Vec<f64> = (0..n)
                .flat_map(|q| (0..count).map(move |i| data::value(q, 0, i)))
                .collect();
            let summed: Vec<f64> = (0..count)
                .map(|i| data::reduced(FLOAT32, SUM, n, 0, i))
                .collect();
            let check_both = |what: &str| {
                ok(
                    unsafe { (x.all_gather)(send.ptr(), recv.ptr(), count, FLOAT32, c.0, STREAM) },
                    what,
                );
                data::check(FLOAT32, &recv.read(), &gathered, what);
                ok(
                    unsafe {
                        (x.all_reduce)(send.ptr(), recv.ptr(), count, FLOAT32, SUM, c.0, STREAM)
                    },
                    what,
                );
                data::check(FLOAT32, &recv.read_range(0..count * 4), &summed, what);
            };
            check_both("on registered buffers");
            ok(
                unsafe { (x.comm_deregister)(c.0, hs) },
                "ncclCommDeregister",
            );
            ok(
                unsafe { (x.comm_deregister)(c.0, hr) },
                "ncclCommDeregister",
            );
            check_both("after deregistering");
            let (mut ws, mut wr) = (std::ptr::null_mut(), std::ptr::null_mut());
            ok(
                unsafe { (x.window_register)(c.0, send.ptr(), count * 4, &mut ws, 1) },
                "ncclCommWindowRegister",
            );
            ok(
                unsafe { (x.window_register)(c.0, recv.ptr(), n * count * 4, &mut wr, 1) },
                "ncclCommWindowRegister",
            );
            check_both("on windows");
            ok(
                unsafe { (x.window_deregister)(c.0, wr) },
                "ncclCommWindowDeregister",
            );
            ok(
                unsafe { (x.window_deregister)(c.0, ws) },
                "ncclCommWindowDeregister",
            );
        });
    });
}

/// NCCL's one-sided calls on windows (`ncclPutSignal`, `ncclSignal`, `ncclWaitSignal`), 4
/// ranks: an all-gather around the ring made of nothing but puts with signals and waits,
/// every element checked; signals alone to both neighbours in every context; the refusals of
/// bad arguments.
#[test]
fn one_sided_ring_through_the_c_symbols() {
    isolated("one_sided_ring_through_the_c_symbols", LIMIT, &[], || {
        let n = 4;
        ranks(n, |r, c| {
            let x = nccl();
            let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
            let count = 1001;
            let mut init = data::marked(n * count * 4);
            init[r * count * 4..(r + 1) * count * 4]
                .copy_from_slice(&data::bytes(FLOAT32, r, 0, count));
            let win = Buf::new(&init, true);
            let mut w = std::ptr::null_mut();
            ok(
                unsafe { (x.window_register)(c.0, win.ptr(), n * count * 4, &mut w, 0) },
                "ncclCommWindowRegister",
            );
            for step in 0..n - 1 {
                // Forward the chunk that arrived last (this rank's own first).
                let k = (r + n - step) % n;
                let at = k * count * 4;
                ok(
                    unsafe {
                        (x.put_signal)(
                            win.at(at),
                            count,
                            FLOAT32,
                            next as c_int,
                            w,
                            at,
                            3,
                            1,
                            0,
                            c.0,
                            STREAM,
                        )
                    },
                    "ncclPutSignal",
                );
                let mut d = common::ffi::WaitSignalDesc {
                    op_cnt: 1,
                    peer: prev as c_int,
                    sig_idx: 3,
                    ctx: 1,
                };
                ok(
                    unsafe { (x.wait_signal)(1, &mut d, c.0, STREAM) },
                    "ncclWaitSignal",
                );
            }
            let want: Vec<f64> = (0..n)
                .flat_map(|q| (0..count).map(move |i| data::value(q, 0, i)))
                .collect();
            data::check(FLOAT32, &win.read(), &want, "the ring's all-gather");
            for ctx in 0..4 {
                for peer in [next, prev] {
                    ok(
                        unsafe { (x.signal)(peer as c_int, 7, ctx, 0, c.0, STREAM) },
                        "ncclSignal",
                    );
                }
                let mut d = [prev, next].map(|peer| common::ffi::WaitSignalDesc {
                    op_cnt: 1,
                    peer: peer as c_int,
                    sig_idx: 7,
                    ctx,
                });
                ok(
                    unsafe { (x.wait_signal)(2, d.as_mut_ptr(), c.0, STREAM) },
                    "ncclWaitSignal on both neighbours",
                );
            }
            let put = |count: usize, peer: c_int, off: usize, sig: c_int, ctx: c_int, flags| unsafe {
                (x.put_signal)(
                    win.ptr(),
                    count,
                    FLOAT32,
                    peer,
                    w,
                    off,
                    sig,
                    ctx,
                    flags,
                    c.0,
                    STREAM,
                )
            };
            let nx = next as c_int;
            fails(
                put(1, nx, 0, 8, 0, 0),
                INVALID_ARGUMENT,
                &["sigIdx"],
                "sigIdx 8",
            );
            fails(put(1, nx, 0, 0, 4, 0), INVALID_ARGUMENT, &["ctx"], "ctx 4");
            fails(
                put(1, nx, 0, 0, 0, 1),
                INVALID_ARGUMENT,
                &["flags"],
                "flags 1",
            );
            fails(
                put(1, n as c_int, 0, 0, 0, 0),
                INVALID_ARGUMENT,
                &["peer"],
                "peer n",
            );
            fails(
                put(1, r as c_int, 0, 0, 0, 0),
                INVALID_USAGE,
                &[],
                "this rank as the peer",
            );
            let past = n * count * 4 - 2;
            fails(
                put(1, nx, past, 0, 0, 0),
                INVALID_ARGUMENT,
                &[],
                "past the window",
            );
            fails(
                unsafe { (x.wait_signal)(1, std::ptr::null_mut(), c.0, STREAM) },
                INVALID_ARGUMENT,
                &["signalDescs"],
                "null descriptors",
            );
            ok(
                unsafe { (x.window_deregister)(c.0, w) },
                "ncclCommWindowDeregister",
            );
            fails(
                put(1, nx, 0, 0, 0, 0),
                INVALID_ARGUMENT,
                &["window"],
                "a window taken back",
            );
        });
    });
}

/// A receive of another count than its send: the receiving rank's call fails with
/// `ncclInvalidUsage` and says why, and its buffer is untouched.
#[test]
fn mismatched_counts_are_refused() {
    isolated("mismatched_counts_are_refused", LIMIT, &[], || {
        let out = ranks(2, |r, c| {
            let x = nccl();
            if r == 0 {
                let b = Buf::new(&data::bytes(FLOAT32, 0, 0, 4), false);
                let code = unsafe { (x.send)(b.ptr(), 4, FLOAT32, 1, c.0, STREAM) };
                (code, String::new(), true)
            } else {
                let b = Buf::new(&data::marked(20), false);
                let code = unsafe { (x.recv)(b.ptr(), 5, FLOAT32, 0, c.0, STREAM) };
                (code, last_error(), b.read() == data::marked(20))
            }
        });
        assert_eq!(out[0].0, SUCCESS, "the send");
        assert_eq!(out[1].0, INVALID_USAGE, "the receive: {}", out[1].1);
        assert!(out[1].1.contains("count"), "{}", out[1].1);
        assert!(out[1].2, "the receive wrote its buffer");
    });
}

#[test]
fn memory_registration_and_operators() {
    isolated("memory_registration_and_operators", LIMIT, &[], || {
        let x = nccl();
        let c = init_rank(unique_id(), 1, 0);
        let null = std::ptr::null_mut();
        // ncclMemAlloc / ncclMemFree.
        let mut m: *mut c_void = null;
        ok(unsafe { (x.mem_alloc)(&mut m, 8192) }, "ncclMemAlloc");
        assert!(!m.is_null());
        // SAFETY: CPU backend: 8192 bytes of host memory.
        unsafe { std::ptr::write_bytes(m.cast::<u8>(), 7, 8192) };
        fails(
            unsafe { (x.mem_alloc)(&mut m, 0) },
            INVALID_ARGUMENT,
            &["size"],
            "0 bytes",
        );
        fails(
            unsafe { (x.mem_alloc)(null.cast(), 8) },
            INVALID_ARGUMENT,
            &["ptr is null"],
            "no out",
        );
        let stack = [0u8; 64];
        fails(
            unsafe { (x.mem_free)(stack.as_ptr() as *mut c_void) },
            INVALID_ARGUMENT,
            &["ncclMemAlloc"],
            "freeing foreign memory",
        );
        ok(unsafe { (x.mem_free)(null) }, "ncclMemFree(NULL)");
        // Registrations: a hint, as NCCL's; memory the library cannot share is declined (a
        // handle that does nothing).
        let mut h: *mut c_void = null;
        ok(
            unsafe { (x.comm_register)(c, m, 8192, &mut h) },
            "ncclCommRegister",
        );
        assert!(!h.is_null());
        let (mut h2, mut w0): (*mut c_void, *mut c_void) = (null, null);
        ok(
            unsafe { (x.comm_register)(c, m.cast::<u8>().add(100).cast(), 100, &mut h2) },
            "ncclCommRegister of a part",
        );
        assert_ne!(h, h2);
        let (mut past, mut host) = (null, null);
        ok(
            unsafe { (x.comm_register)(c, m, 8193, &mut past) },
            "ncclCommRegister past the allocation (declined)",
        );
        ok(
            unsafe { (x.comm_register)(c, stack.as_ptr() as *mut c_void, 64, &mut host) },
            "ncclCommRegister of host memory (declined)",
        );
        assert!(!past.is_null() && !host.is_null() && past != host && past != h2);
        fails(
            unsafe { (x.comm_register)(c, null, 64, &mut h2) },
            INVALID_ARGUMENT,
            &["buff is null"],
            "a null buffer",
        );
        for d in [past, host] {
            ok(
                unsafe { (x.comm_deregister)(c, d) },
                "ncclCommDeregister (declined)",
            );
        }
        fails(
            unsafe { (x.window_register)(c, stack.as_ptr() as *mut c_void, 64, &mut w0, 1) },
            INVALID_ARGUMENT,
            &["not inside one allocation"],
            "a window of host memory",
        );
        ok(unsafe { (x.comm_deregister)(c, h) }, "ncclCommDeregister");
        fails(
            unsafe { (x.comm_deregister)(c, h) },
            INVALID_ARGUMENT,
            &["registration"],
            "deregistering twice",
        );
        // Windows.
        let mut w: *mut c_void = null;
        ok(
            unsafe { (x.window_register)(c, m, 4096, &mut w, 1) },
            "ncclCommWindowRegister",
        );
        let mut user: *mut c_void = null;
        ok(
            unsafe { (x.win_get_user_ptr)(c, w, &mut user) },
            "ncclWinGetUserPtr",
        );
        assert_eq!(user, m);
        fails(
            unsafe { (x.window_register)(c, m, 4096, &mut w, 0x100) },
            INVALID_ARGUMENT,
            &["winFlags"],
            "unknown flags",
        );
        ok(
            unsafe { (x.window_deregister)(c, w) },
            "ncclCommWindowDeregister",
        );
        fails(
            unsafe { (x.win_get_user_ptr)(c, w, &mut user) },
            INVALID_ARGUMENT,
            &["window"],
            "a deregistered window",
        );
        // Pre-multiplied sums: made from ncclNumOps up, destroyed, not served in collectives.
        let mut scalar = 0.5f32;
        let mut op = -1;
        let s = (&raw mut scalar).cast();
        ok(
            unsafe { (x.red_op_create_pre_mul_sum)(&mut op, s, FLOAT32, 1, c) },
            "create",
        );
        assert_eq!(op, 5);
        let mut op2 = -1;
        ok(
            unsafe { (x.red_op_create_pre_mul_sum)(&mut op2, m, FLOAT32, 0, c) },
            "create (device)",
        );
        assert_eq!(op2, 6);
        fails(
            unsafe { (x.red_op_create_pre_mul_sum)(&mut op2, s, FLOAT32, 2, c) },
            INVALID_ARGUMENT,
            &["residence"],
            "a bad residence",
        );
        // The host scalar was copied at creation: changing it now changes nothing.
        scalar = 100.0;
        let v = Buf::new(&data::bytes(FLOAT32, 0, 0, 4), false);
        let o = Buf::new(&data::marked(16), false);
        ok(
            unsafe { (x.all_reduce)(v.ptr(), o.ptr(), 4, FLOAT32, op, c, STREAM) },
            "an all-reduce by a pre-multiplied sum",
        );
        let want: Vec<f64> = (0..4).map(|i| 0.5 * data::value(0, 0, i)).collect();
        data::check(FLOAT32, &o.read(), &want, "host scalar 0.5");
        // The device scalar is read by each call.
        for d in [3.0f32, -0.25] {
            // SAFETY: CPU backend: `m` is host memory of 8192 bytes.
            unsafe { m.cast::<f32>().write(d) };
            ok(
                unsafe { (x.all_reduce)(v.ptr(), o.ptr(), 4, FLOAT32, op2, c, STREAM) },
                "an all-reduce by a device pre-multiplied sum",
            );
            let want: Vec<f64> = (0..4).map(|i| d as f64 * data::value(0, 0, i)).collect();
            data::check(FLOAT32, &o.read(), &want, "device scalar");
        }
        assert_eq!(scalar, 100.0);
        ok(unsafe { (x.red_op_destroy)(op, c) }, "ncclRedOpDestroy");
        fails(
            unsafe { (x.red_op_destroy)(op, c) },
            INVALID_ARGUMENT,
            &["not a live operator"],
            "twice",
        );
        fails(
            unsafe { (x.red_op_destroy)(SUM, c) },
            INVALID_ARGUMENT,
            &["built-in"],
            "ncclSum",
        );
        ok(
            unsafe { (x.red_op_create_pre_mul_sum)(&mut op, s, FLOAT32, 1, c) },
            "again",
        );
        assert_eq!(op, 5, "the freed value is used again");
        ok(unsafe { (x.comm_destroy)(c) }, "ncclCommDestroy");
        ok(unsafe { (x.mem_free)(m) }, "ncclMemFree");
        fails(
            unsafe { (x.mem_free)(m) },
            INVALID_ARGUMENT,
            &["ncclMemAlloc"],
            "freeing twice",
        );
    });
}

#[test]
fn configs_nonblocking_init_and_init_all() {
    isolated(
        "configs_nonblocking_init_and_init_all",
        LIMIT,
        &[("NCCL_DEBUG", "INFO")],
        || {
            let x = nccl();
            let null = std::ptr::null_mut();
            // A config of an old NCCL (40 bytes: up to netName) is read by its size.
            let id = unique_id();
            let mut old = Config {
                blocking: 1,
                ..Config::default()
            };
            old.size = 40;
            let mut c = null;
            ok(
                unsafe { (x.comm_init_rank_config)(&mut c, 1, id, 0, &mut old) },
                "old config",
            );
            let (mut n, mut r, mut d) = (0, 0, 0);
            ok(unsafe { (x.comm_count)(c, &mut n) }, "ncclCommCount");
            ok(unsafe { (x.comm_user_rank)(c, &mut r) }, "ncclCommUserRank");
            ok(unsafe { (x.comm_cu_device)(c, &mut d) }, "ncclCommCuDevice");
            assert_eq!((n, r, d), (1, 0, 0));
            ok(unsafe { (x.comm_destroy)(c) }, "destroy");
            let mut bad = Config {
                magic: 3,
                ..Config::default()
            };
            fails(
                unsafe { (x.comm_init_rank_config)(&mut c, 1, unique_id(), 0, &mut bad) },
                INVALID_ARGUMENT,
                &["magic"],
                "a config without its initializer",
            );
            let mut bad = Config {
                blocking: 2,
                ..Config::default()
            };
            fails(
                unsafe { (x.comm_init_rank_config)(&mut c, 1, unique_id(), 0, &mut bad) },
                INVALID_ARGUMENT,
                &["blocking"],
                "blocking = 2",
            );

            // Non-blocking: ncclInProgress, then ncclCommGetAsyncError until done.
            let id = unique_id();
            let name = c"nonblocking-test";
            let comms: Vec<Comm> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..2)
                    .map(|rank| {
                        s.spawn(move || {
                            let mut cfg = Config {
                                blocking: 0,
                                comm_name: name.as_ptr(),
                                ..Config::default()
                            };
                            let mut c = std::ptr::null_mut();
                            let r =
                                unsafe { (x.comm_init_rank_config)(&mut c, 2, id, rank, &mut cfg) };
                            assert_eq!(r, IN_PROGRESS, "{}", last_error());
                            assert!(!c.is_null());
                            let deadline = Instant::now() + Duration::from_secs(60);
                            let mut state = IN_PROGRESS;
                            while state == IN_PROGRESS {
                                assert!(Instant::now() < deadline, "init still in progress");
                                ok(unsafe { (x.comm_get_async_error)(c, &mut state) }, "poll");
                                std::thread::sleep(Duration::from_millis(5));
                            }
                            assert_eq!(state, SUCCESS, "{}", last_error());
                            Comm(c)
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            std::thread::scope(|s| {
                for (rank, c) in comms.iter().copied().enumerate() {
                    s.spawn(move || every_collective(rank, 2, c, 9, false));
                }
            });
            for c in comms {
                ok(unsafe { (x.comm_destroy)(c.0) }, "destroy");
            }

            // ncclCommInitAll: ranks of one process; a device list.
            let mut all = [null; 3];
            let devs = [2, 0, 1];
            ok(
                unsafe { (x.comm_init_all)(all.as_mut_ptr(), 3, devs.as_ptr()) },
                "ncclCommInitAll",
            );
            for (i, c) in all.iter().enumerate() {
                ok(unsafe { (x.comm_user_rank)(*c, &mut r) }, "rank");
                ok(unsafe { (x.comm_cu_device)(*c, &mut d) }, "device");
                assert_eq!((r as usize, d), (i, devs[i]));
            }
            group_all_reduce(&all.map(Comm));
            for c in all {
                ok(unsafe { (x.comm_destroy)(c) }, "destroy");
            }
            let too_big = [0, 9999];
            fails(
                unsafe { (x.comm_init_all)(all.as_mut_ptr(), 2, too_big.as_ptr()) },
                INVALID_ARGUMENT,
                &["devlist"],
                "a device that does not exist",
            );
            // ncclCommInitRankScalable: the first id serves.
            let ids = [unique_id(), unique_id()];
            let mut c = null;
            let mut ids2 = ids;
            ok(
                unsafe {
                    (x.comm_init_rank_scalable)(
                        &mut c,
                        1,
                        0,
                        2,
                        ids2.as_mut_ptr(),
                        std::ptr::null_mut(),
                    )
                },
                "ncclCommInitRankScalable",
            );
            ok(unsafe { (x.comm_destroy)(c) }, "destroy");
        },
    );
}

/// One all-reduce over every communicator of `comms` (ranks of one clique), in one group
/// issued by this thread; checks every result.
fn group_all_reduce(comms: &[Comm]) {
    let x = nccl();
    let n = comms.len();
    let count = 33;
    let bufs: Vec<Buf> = (0..n)
        .map(|r| Buf::new(&data::bytes(FLOAT32, r, 0, count), r % 2 == 0))
        .collect();
    ok(unsafe { (x.group_start)() }, "ncclGroupStart");
    for (c, b) in comms.iter().zip(&bufs) {
        ok(
            unsafe { (x.all_reduce)(b.ptr(), b.ptr(), count, FLOAT32, SUM, c.0, STREAM) },
            "grouped ncclAllReduce",
        );
    }
    ok(unsafe { (x.group_end)() }, "ncclGroupEnd");
    let want: Vec<f64> = (0..count)
        .map(|i| data::reduced(FLOAT32, SUM, n, 0, i))
        .collect();
    for b in &bufs {
        data::check(FLOAT32, &b.read(), &want, "grouped all-reduce");
    }
}

/// One thread initialises four ranks in a group, then drives them with grouped collectives
/// and sends/receives (as a single-process multi-GPU program does).
#[test]
fn one_thread_drives_four_ranks() {
    isolated("one_thread_drives_four_ranks", LIMIT, &[], || {
        let x = nccl();
        let n = 4;
        let id = unique_id();
        let mut comms = vec![std::ptr::null_mut(); n];
        ok(unsafe { (x.group_start)() }, "ncclGroupStart");
        ok(unsafe { (x.group_start)() }, "nested ncclGroupStart");
        for (r, c) in comms.iter_mut().enumerate() {
            ok(
                unsafe { (x.comm_init_rank)(c, n as c_int, id, r as c_int) },
                "init in a group",
            );
            assert!(!c.is_null(), "the handle exists before the group ends");
        }
        ok(unsafe { (x.group_end)() }, "inner ncclGroupEnd");
        // Still inside the outer group: the inits have not run.
        let mut state = 0;
        ok(
            unsafe { (x.comm_get_async_error)(comms[0], &mut state) },
            "poll",
        );
        assert_eq!(state, IN_PROGRESS);
        let early = Buf::new(&data::marked(4), false);
        fails(
            unsafe { (x.all_reduce)(early.ptr(), early.ptr(), 1, FLOAT32, SUM, comms[0], STREAM) },
            INVALID_USAGE,
            &["still being initialised"],
            "a call before the group ended",
        );
        // That failure poisons the group: it runs nothing, its inits fail.
        fails(
            unsafe { (x.group_end)() },
            INVALID_USAGE,
            &["earlier call of this group"],
            "poisoned",
        );
        for c in &comms {
            ok(unsafe { (x.comm_get_async_error)(*c, &mut state) }, "poll");
            assert_eq!(state, INVALID_USAGE);
            ok(unsafe { (x.comm_destroy)(*c) }, "destroy a failed init");
        }

        // Again, properly.
        let id = unique_id();
        ok(unsafe { (x.group_start)() }, "ncclGroupStart");
        for (r, c) in comms.iter_mut().enumerate() {
            ok(
                unsafe { (x.comm_init_rank)(c, n as c_int, id, r as c_int) },
                "init in a group",
            );
        }
        ok(unsafe { (x.group_end)() }, "ncclGroupEnd");
        let comms: Vec<Comm> = comms.into_iter().map(Comm).collect();
        group_all_reduce(&comms);

        // Uneven all-gather as grouped broadcasts (PyTorch's pattern): root q sends q + 3
        // elements.
        let counts: Vec<usize> = (0..n).map(|q| q + 3).collect();
        let total: usize = counts.iter().sum();
        let offsets: Vec<usize> = counts
            .iter()
            .scan(0, |a, &c| {
                let o = *a;
                *a += c;
                Some(o)
            })
            .collect();
        let outs: Vec<Buf> = (0..n)
            .map(|_| Buf::new(&data::marked(total * 4), false))
            .collect();
        let mine: Vec<Buf> = (0..n)
            .map(|r| Buf::new(&data::bytes(FLOAT32, r, 2, counts[r]), false))
            .collect();
        ok(unsafe { (x.group_start)() }, "ncclGroupStart");
        for root in 0..n {
            for r in 0..n {
                let dst = outs[r].at(offsets[root] * 4);
                ok(
                    unsafe {
                        (x.broadcast)(
                            mine[r].ptr(),
                            dst,
                            counts[root],
                            FLOAT32,
                            root as c_int,
                            comms[r].0,
                            STREAM,
                        )
                    },
                    "grouped ncclBroadcast",
                );
            }
        }
        ok(unsafe { (x.group_end)() }, "ncclGroupEnd");
        let want: Vec<f64> = (0..n)
            .flat_map(|q| (0..counts[q]).map(move |i| data::value(q, 2, i)))
            .collect();
        for o in &outs {
            data::check(FLOAT32, &o.read(), &want, "uneven all-gather");
        }

        // All-to-all as sends and receives to every peer and itself, all ranks in one group.
        let count = 6;
        let sends: Vec<Buf> = (0..n)
            .map(|r| {
                Buf::new(
                    &(0..n)
                        .flat_map(|p| data::bytes(INT32, r, p, count))
                        .collect::<Vec<_>>(),
                    true,
                )
            })
            .collect();
        let recvs: Vec<Buf> = (0..n)
            .map(|_| Buf::new(&data::marked(n * count * 4), true))
            .collect();
        ok(unsafe { (x.group_start)() }, "ncclGroupStart");
        for r in 0..n {
            for p in 0..n {
                ok(
                    unsafe {
                        (x.send)(
                            sends[r].at(p * count * 4),
                            count,
                            INT32,
                            p as c_int,
                            comms[r].0,
                            STREAM,
                        )
                    },
                    "grouped ncclSend",
                );
                ok(
                    unsafe {
                        (x.recv)(
                            recvs[r].at(p * count * 4),
                            count,
                            INT32,
                            p as c_int,
                            comms[r].0,
                            STREAM,
                        )
                    },
                    "grouped ncclRecv",
                );
            }
        }
        ok(unsafe { (x.group_end)() }, "ncclGroupEnd");
        for (r, b) in recvs.iter().enumerate() {
            let want: Vec<f64> = (0..n)
                .flat_map(|q| (0..count).map(move |i| data::value(q, r, i)))
                .collect();
            data::check(INT32, &b.read(), &want, "all-to-all by sends and receives");
        }

        // One group of every rank: an uneven reduce-scatter as reduces to each root (root q
        // gets q + 2 elements, averaged, int64: PyTorch's pattern), a gather to rank 1, a
        // scatter from rank 2 (fp8 e4m3) and a ring of uint8 sends, none depending on another.
        let avg = data::Op::Builtin(AVG);
        let rcounts: Vec<usize> = (0..n).map(|q| q + 2).collect();
        let red_in: Vec<Vec<Buf>> = (0..n)
            .map(|r| {
                (0..n)
                    .map(|q| Buf::new(&data::bytes_for(data::I64, avg, r, q, rcounts[q]), false))
                    .collect()
            })
            .collect();
        let red_out: Vec<Buf> = (0..n)
            .map(|r| Buf::new(&data::marked(rcounts[r] * 8), false))
            .collect();
        let g_in: Vec<Buf> = (0..n)
            .map(|r| Buf::new(&data::bytes(data::F16, r, 5, 9), true))
            .collect();
        let g_out = Buf::new(&data::marked(n * 9 * 2), true);
        let s_in = Buf::new(
            &(0..n)
                .flat_map(|p| data::bytes(data::F8E4M3, 2, p, 11))
                .collect::<Vec<_>>(),
            false,
        );
        let s_out: Vec<Buf> = (0..n).map(|_| Buf::new(&data::marked(11), false)).collect();
        let ring_in: Vec<Buf> = (0..n)
            .map(|r| Buf::new(&data::bytes(data::U8, r, 6, 13), false))
            .collect();
        let ring_out: Vec<Buf> = (0..n).map(|_| Buf::new(&data::marked(13), false)).collect();
        let null = std::ptr::null_mut();
        ok(unsafe { (x.group_start)() }, "ncclGroupStart");
        for r in 0..n {
            let c = comms[r].0;
            for q in 0..n {
                let out = if r == q { red_out[r].ptr() } else { null };
                let code = unsafe {
                    (x.reduce)(
                        red_in[r][q].ptr(),
                        out,
                        rcounts[q],
                        data::I64,
                        AVG,
                        q as c_int,
                        c,
                        STREAM,
                    )
                };
                ok(code, "grouped ncclReduce");
            }
            let out = if r == 1 { g_out.ptr() } else { null };
            ok(
                unsafe { (x.gather)(g_in[r].ptr(), out, 9, data::F16, 1, c, STREAM) },
                "grouped ncclGather",
            );
            let from = if r == 2 { s_in.ptr() } else { null };
            ok(
                unsafe { (x.scatter)(from, s_out[r].ptr(), 11, data::F8E4M3, 2, c, STREAM) },
                "grouped ncclScatter",
            );
            let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
            ok(
                unsafe { (x.recv)(ring_out[r].ptr(), 13, data::U8, prev as c_int, c, STREAM) },
                "grouped ncclRecv",
            );
            ok(
                unsafe { (x.send)(ring_in[r].ptr(), 13, data::U8, next as c_int, c, STREAM) },
                "grouped ncclSend",
            );
        }
        ok(unsafe { (x.group_end)() }, "ncclGroupEnd of a mixed group");
        for r in 0..n {
            let want: Vec<(f64, f64)> = (0..rcounts[r])
                .map(|i| data::expected(data::I64, avg, n, r, i))
                .collect();
            data::check_within(data::I64, &red_out[r].read(), &want, "grouped reduce");
            let want: Vec<f64> = (0..11)
                .map(|i| data::moved(data::F8E4M3, 2, r, i))
                .collect();
            data::check(data::F8E4M3, &s_out[r].read(), &want, "grouped scatter");
            let prev = (r + n - 1) % n;
            let want: Vec<f64> = (0..13).map(|i| data::moved(data::U8, prev, 6, i)).collect();
            data::check(data::U8, &ring_out[r].read(), &want, "grouped ring");
        }
        let want: Vec<f64> = (0..n)
            .flat_map(|q| (0..9).map(move |i| data::moved(data::F16, q, 5, i)))
            .collect();
        data::check(data::F16, &g_out.read(), &want, "grouped gather");

        for c in comms {
            ok(unsafe { (x.comm_destroy)(c.0) }, "destroy");
        }
    });
}

/// PyTorch's call patterns, ranks as threads: a barrier (a one-float all-reduce), all-to-all
/// by a group of sends and receives to every peer and itself, a ring exchange
/// (`batch_isend_irecv`), coalesced all-reduces, an uneven all-to-all, and a two-rank
/// communicator per send/recv pair.
#[test]
fn pytorch_patterns_as_threads() {
    isolated("pytorch_patterns_as_threads", LIMIT, &[], || {
        let n = 4;
        let pair_ids: Vec<std::sync::Mutex<Option<UniqueId>>> =
            (0..n / 2).map(|_| std::sync::Mutex::new(None)).collect();
        let ready = std::sync::Barrier::new(n);
        ranks(n, |r, c| {
            let x = nccl();
            // Barrier.
            let one = Buf::new(&1f32.to_le_bytes(), false);
            ok(
                unsafe { (x.all_reduce)(one.ptr(), one.ptr(), 1, FLOAT32, SUM, c.0, STREAM) },
                "barrier",
            );
            assert_eq!(one.read(), (n as f32).to_le_bytes());

            // all_to_all_single as sends and receives.
            let count = 10;
            let send = Buf::new(
                &(0..n)
                    .flat_map(|p| data::bytes(BFLOAT16, r, p, count))
                    .collect::<Vec<_>>(),
                false,
            );
            let recv = Buf::new(&data::marked(n * count * 2), false);
            ok(unsafe { (x.group_start)() }, "ncclGroupStart");
            for p in 0..n {
                ok(
                    unsafe {
                        (x.send)(
                            send.at(p * count * 2),
                            count,
                            BFLOAT16,
                            p as c_int,
                            c.0,
                            STREAM,
                        )
                    },
                    "send",
                );
                ok(
                    unsafe {
                        (x.recv)(
                            recv.at(p * count * 2),
                            count,
                            BFLOAT16,
                            p as c_int,
                            c.0,
                            STREAM,
                        )
                    },
                    "recv",
                );
            }
            ok(unsafe { (x.group_end)() }, "ncclGroupEnd");
            let want: Vec<f64> = (0..n)
                .flat_map(|q| (0..count).map(move |i| data::value(q, r, i)))
                .collect();
            data::check(
                BFLOAT16,
                &recv.read(),
                &want,
                "all-to-all by sends and receives",
            );

            // Ring exchange: send to the next, receive from the previous.
            let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
            let out = Buf::new(&data::bytes(FLOAT16, r, 3, 50), true);
            let inn = Buf::new(&data::marked(100), true);
            ok(unsafe { (x.group_start)() }, "ncclGroupStart");
            ok(
                unsafe { (x.recv)(inn.ptr(), 50, FLOAT16, prev as c_int, c.0, STREAM) },
                "recv",
            );
            ok(
                unsafe { (x.send)(out.ptr(), 50, FLOAT16, next as c_int, c.0, STREAM) },
                "send",
            );
            ok(unsafe { (x.group_end)() }, "ncclGroupEnd");
            let want: Vec<f64> = (0..50).map(|i| data::value(prev, 3, i)).collect();
            data::check(FLOAT16, &inn.read(), &want, "ring exchange");

            // Coalesced all-reduces of two types in one group.
            let a = Buf::new(&data::bytes(INT32, r, 4, 20), false);
            let b = Buf::new(&data::bytes(UINT32, r, 5, 30), false);
            ok(unsafe { (x.group_start)() }, "ncclGroupStart");
            ok(
                unsafe { (x.all_reduce)(a.ptr(), a.ptr(), 20, INT32, MAX, c.0, STREAM) },
                "a",
            );
            ok(
                unsafe { (x.all_reduce)(b.ptr(), b.ptr(), 30, UINT32, SUM, c.0, STREAM) },
                "b",
            );
            ok(unsafe { (x.group_end)() }, "ncclGroupEnd");
            data::check(
                INT32,
                &a.read(),
                &(0..20)
                    .map(|i| data::reduced(INT32, MAX, n, 4, i))
                    .collect::<Vec<_>>(),
                "coalesced a",
            );
            data::check(
                UINT32,
                &b.read(),
                &(0..30)
                    .map(|i| data::reduced(UINT32, SUM, n, 5, i))
                    .collect::<Vec<_>>(),
                "coalesced b",
            );

            // An uneven all-to-all (rank q sends p + 1 elements to rank p), as PyTorch's
            // all_to_all with split sizes.
            let sendv = Buf::new(
                &(0..n)
                    .flat_map(|p| data::bytes(FLOAT32, r, p, p + 1))
                    .collect::<Vec<_>>(),
                false,
            );
            let recvv = Buf::new(&data::marked(n * (r + 1) * 4), false);
            ok(unsafe { (x.group_start)() }, "ncclGroupStart");
            let mut at = 0;
            for p in 0..n {
                ok(
                    unsafe { (x.send)(sendv.at(at * 4), p + 1, FLOAT32, p as c_int, c.0, STREAM) },
                    "send",
                );
                ok(
                    unsafe {
                        (x.recv)(
                            recvv.at(p * (r + 1) * 4),
                            r + 1,
                            FLOAT32,
                            p as c_int,
                            c.0,
                            STREAM,
                        )
                    },
                    "recv",
                );
                at += p + 1;
            }
            ok(unsafe { (x.group_end)() }, "ncclGroupEnd");
            let want: Vec<f64> = (0..n)
                .flat_map(|q| (0..r + 1).map(move |i| data::value(q, r, i)))
                .collect();
            data::check(FLOAT32, &recvv.read(), &want, "uneven all-to-all");

            // A two-rank communicator per send/recv pair (0-1, 2-3): the lower rank makes the
            // id and hands it over.
            let pair = r / 2;
            if r % 2 == 0 {
                *pair_ids[pair].lock().unwrap() = Some(unique_id());
            }
            ready.wait();
            let pid = pair_ids[pair].lock().unwrap().expect("the pair's id");
            let pc = init_rank(pid, 2, r % 2);
            let msg = Buf::new(&data::bytes(FLOAT32, r, 9, 64), false);
            let got = Buf::new(&data::marked(256), false);
            let other = r ^ 1;
            if r % 2 == 0 {
                ok(
                    unsafe { (x.send)(msg.ptr(), 64, FLOAT32, 1, pc, STREAM) },
                    "pair send",
                );
                ok(
                    unsafe { (x.recv)(got.ptr(), 64, FLOAT32, 1, pc, STREAM) },
                    "pair recv",
                );
            } else {
                ok(
                    unsafe { (x.recv)(got.ptr(), 64, FLOAT32, 0, pc, STREAM) },
                    "pair recv",
                );
                ok(
                    unsafe { (x.send)(msg.ptr(), 64, FLOAT32, 0, pc, STREAM) },
                    "pair send",
                );
            }
            let want: Vec<f64> = (0..64).map(|i| data::value(other, 9, i)).collect();
            data::check(FLOAT32, &got.read(), &want, "pair");
            ok(
                unsafe { (x.comm_destroy)(pc) },
                "destroy the pair's communicator",
            );
        });
    });
}

/// `ncclCommAbort` from another thread releases a call that waits for a rank that never
/// comes, within a bounded time, and the waiting call reports an error.
#[test]
fn abort_releases_a_waiting_call() {
    isolated("abort_releases_a_waiting_call", LIMIT, &[], || {
        let x = nccl();
        let id = unique_id();
        let comms: Vec<Comm> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|r| s.spawn(move || Comm(init_rank(id, 2, r))))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let (c0, c1) = (comms[0], comms[1]);
        let buf = Buf::new(&data::bytes(FLOAT32, 0, 0, 4000), false);
        let p = buf.ptr() as usize;
        let c0_raw = c0.0 as usize;
        let started = std::sync::atomic::AtomicBool::new(false);
        let (code, waited) = std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                started.store(true, std::sync::atomic::Ordering::SeqCst);
                let t = Instant::now();
                // Rank 1 never joins this all-reduce.
                let r = unsafe {
                    (x.all_reduce)(
                        p as *mut c_void,
                        p as *mut c_void,
                        4000,
                        FLOAT32,
                        SUM,
                        c0_raw as *mut c_void,
                        STREAM,
                    )
                };
                (r, t.elapsed())
            });
            while !started.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::yield_now();
            }
            std::thread::sleep(Duration::from_millis(300));
            let t = Instant::now();
            ok(unsafe { (x.comm_abort)(c0.0) }, "ncclCommAbort");
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "ncclCommAbort took {:?}",
                t.elapsed()
            );
            waiter.join().unwrap()
        });
        assert_ne!(code, SUCCESS, "the released call reported success");
        assert!(
            waited < Duration::from_secs(30),
            "the call was released only after {waited:?}"
        );
        // The aborted handle is gone; the other rank's communicator sees its peer leave.
        fails(
            unsafe { (x.comm_abort)(c0.0) },
            INVALID_ARGUMENT,
            &["not a live communicator"],
            "twice",
        );
        ok(unsafe { (x.comm_abort)(c1.0) }, "abort rank 1");
    });
}

/// `NCCL_DEBUG=INFO` (or `VERSION`) shows the banner that says which library answers;
/// without it nothing is printed for a call that succeeds.
#[test]
fn nccl_debug_shows_the_banner() {
    let test = "nccl_debug_shows_the_banner";
    if is_child(test) {
        let mut v = 0;
        ok(unsafe { (nccl().get_version)(&mut v) }, "ncclGetVersion");
        return;
    }
    for (debug, shown) in [(Some("INFO"), true), (Some("VERSION"), true), (None, false)] {
        let env: Vec<(&str, &str)> = debug.map(|d| ("NCCL_DEBUG", d)).into_iter().collect();
        let out = spawn_test(test, &env).wait_for(LIMIT);
        assert!(out.success(), "{}", out.text());
        let banner = "drop-in libnccl.so.2 (NCCL API 2.32.3), not NVIDIA's NCCL";
        assert_eq!(
            out.output().contains(banner),
            shown,
            "NCCL_DEBUG={debug:?}:\n{}",
            out.text()
        );
        if shown {
            assert!(out.output().contains("mscclpp-rs"), "{}", out.text());
        }
    }
}
