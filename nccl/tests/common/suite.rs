//! The collective suite both ranks-as-threads (`api.rs`) and ranks-as-processes
//! (`processes.rs`) run: [`every_collective`], every collective of the C API with every type
//! and operator, checked against `data`'s reference.

use std::ffi::{c_int, c_void};

use super::buf::Buf;
use super::data::{self, OPS, TYPES};
use super::{Comm, STREAM, nccl, ok};

/// NCCL's operator values of every [`data::OPS`] entry for type `t` on `c` (pre-multiplied
/// sums made here, destroyed on drop; the device scalar's buffer kept until then).
struct TypeOps {
    ops: Vec<(data::Op, c_int)>,
    c: Comm,
    _scalar: Buf,
}

impl TypeOps {
    fn new(t: c_int, c: Comm, nccl_mem: bool) -> TypeOps {
        let x = nccl();
        let host = data::encode(t, data::stored(t, data::scalar(t, data::Op::PreMulHost)));
        let dev = data::encode(t, data::stored(t, data::scalar(t, data::Op::PreMulDevice)));
        let scalar = Buf::new(&dev, nccl_mem);
        let ops = OPS
            .iter()
            .map(|&op| {
                let (residence, p) = match op {
                    data::Op::Builtin(v) => return (op, v),
                    data::Op::PreMulHost => (1, host.as_ptr() as *mut c_void),
                    data::Op::PreMulDevice => (0, scalar.ptr()),
                };
                let mut v = -1;
                ok(
                    unsafe { (x.red_op_create_pre_mul_sum)(&mut v, p, t, residence, c.0) },
                    &format!("ncclRedOpCreatePreMulSum type {t} residence {residence}"),
                );
                assert!(v >= 5, "a pre-multiplied sum of value {v}");
                (op, v)
            })
            .collect();
        TypeOps {
            ops,
            c,
            _scalar: scalar,
        }
    }
}

impl Drop for TypeOps {
    fn drop(&mut self) {
        for &(op, v) in &self.ops {
            if !matches!(op, data::Op::Builtin(_)) {
                let r = unsafe { (nccl().red_op_destroy)(v, self.c.0) };
                if !std::thread::panicking() {
                    ok(r, "ncclRedOpDestroy");
                }
            }
        }
    }
}

/// Every collective on rank `r` of `n`, at `count` elements (parts of `count` for
/// all-gather, reduce-scatter, gather, scatter and all-to-all), every type and operator (the
/// pre-multiplied sums with a host and a device scalar), in place and out of place, on
/// buffers from `ncclMemAlloc` when `nccl_mem`; then a group of sends and receives (a ring,
/// this rank itself, a zero count).
pub fn every_collective(r: usize, n: usize, c: Comm, count: usize, nccl_mem: bool) {
    let x = nccl();
    let null = std::ptr::null_mut();
    let what = |s: &str, t: c_int| format!("{s} type {t} rank {r}/{n} count {count}");
    for (t, es) in TYPES {
        let b = count * es;
        let ops = TypeOps::new(t, c, nccl_mem);
        for (k, &(op, v)) in ops.ops.iter().enumerate() {
            let what = |s: &str| format!("{} op {op:?}", what(s, t));
            // All-reduce, out of place and in place.
            let send = Buf::new(&data::bytes_for(t, op, r, 0, count), nccl_mem);
            let recv = Buf::new(&data::marked(b), nccl_mem);
            let want: Vec<(f64, f64)> =
                (0..count).map(|i| data::expected(t, op, n, 0, i)).collect();
            ok(
                unsafe { (x.all_reduce)(send.ptr(), recv.ptr(), count, t, v, c.0, STREAM) },
                &what("ncclAllReduce"),
            );
            data::check_within(t, &recv.read(), &want, &what("ncclAllReduce"));
            ok(
                unsafe { (x.all_reduce)(send.ptr(), send.ptr(), count, t, v, c.0, STREAM) },
                &what("in-place ncclAllReduce"),
            );
            data::check_within(t, &send.read(), &want, &what("in-place ncclAllReduce"));

            // Reduce to a root that changes with the operator; other ranks pass no recvbuff;
            // in place on every other operator.
            let root = (t as usize + k) % n;
            let send = Buf::new(&data::bytes_for(t, op, r, 0, count), nccl_mem);
            let recv = Buf::new(&data::marked(b), nccl_mem);
            let in_place = k % 2 == 1;
            let out = match (r == root, in_place) {
                (false, _) => null,
                (true, true) => send.ptr(),
                (true, false) => recv.ptr(),
            };
            ok(
                unsafe { (x.reduce)(send.ptr(), out, count, t, v, root as c_int, c.0, STREAM) },
                &what("ncclReduce"),
            );
            if r == root {
                let got = if in_place { send.read() } else { recv.read() };
                data::check_within(t, &got, &want, &what("ncclReduce"));
            } else {
                assert_eq!(
                    recv.read(),
                    data::marked(b),
                    "{}: wrote",
                    what("ncclReduce")
                );
                assert_eq!(
                    send.read(),
                    data::bytes_for(t, op, r, 0, count),
                    "{}: wrote the send buffer",
                    what("ncclReduce")
                );
            }

            // Reduce-scatter: part p of every rank reduces into rank p.
            let parts: Vec<u8> = (0..n)
                .flat_map(|p| data::bytes_for(t, op, r, p, count))
                .collect();
            let want: Vec<(f64, f64)> =
                (0..count).map(|i| data::expected(t, op, n, r, i)).collect();
            let send = Buf::new(&parts, nccl_mem);
            let recv = Buf::new(&data::marked(b), nccl_mem);
            ok(
                unsafe { (x.reduce_scatter)(send.ptr(), recv.ptr(), count, t, v, c.0, STREAM) },
                &what("ncclReduceScatter"),
            );
            data::check_within(t, &recv.read(), &want, &what("ncclReduceScatter"));
            let own = send.at(r * b);
            ok(
                unsafe { (x.reduce_scatter)(send.ptr(), own, count, t, v, c.0, STREAM) },
                &what("in-place ncclReduceScatter"),
            );
            data::check_within(
                t,
                &send.read_range(r * b..(r + 1) * b),
                &want,
                &what("in-place ncclReduceScatter"),
            );
        }
        drop(ops);

        // All-gather: rank q's part lands at q.
        let want: Vec<f64> = (0..n)
            .flat_map(|q| (0..count).map(move |i| data::moved(t, q, 0, i)))
            .collect();
        let send = Buf::new(&data::bytes(t, r, 0, count), nccl_mem);
        let recv = Buf::new(&data::marked(n * b), nccl_mem);
        ok(
            unsafe { (x.all_gather)(send.ptr(), recv.ptr(), count, t, c.0, STREAM) },
            &what("ncclAllGather", t),
        );
        data::check(t, &recv.read(), &want, &what("ncclAllGather", t));
        let mut inplace = data::marked(n * b);
        inplace[r * b..(r + 1) * b].copy_from_slice(&data::bytes(t, r, 0, count));
        let buf = Buf::new(&inplace, nccl_mem);
        ok(
            unsafe { (x.all_gather)(buf.at(r * b), buf.ptr(), count, t, c.0, STREAM) },
            &what("in-place ncclAllGather", t),
        );
        data::check(t, &buf.read(), &want, &what("in-place ncclAllGather", t));

        // Gather to a root (other ranks pass no recvbuff), out of place and in place.
        let root = t as usize % n;
        let send = Buf::new(&data::bytes(t, r, 0, count), nccl_mem);
        let recv = Buf::new(&data::marked(n * b), nccl_mem);
        let out = if r == root { recv.ptr() } else { null };
        ok(
            unsafe { (x.gather)(send.ptr(), out, count, t, root as c_int, c.0, STREAM) },
            &what("ncclGather", t),
        );
        if r == root {
            data::check(t, &recv.read(), &want, &what("ncclGather", t));
        }
        let buf = Buf::new(&inplace, nccl_mem);
        let out = if r == root { buf.ptr() } else { null };
        ok(
            unsafe { (x.gather)(buf.at(r * b), out, count, t, root as c_int, c.0, STREAM) },
            &what("in-place ncclGather", t),
        );
        if r == root {
            data::check(t, &buf.read(), &want, &what("in-place ncclGather", t));
        } else {
            assert_eq!(buf.read(), inplace, "{}: wrote", what("ncclGather", t));
        }

        // Scatter from a root (other ranks pass no sendbuff): part p lands on rank p.
        let root = (t as usize + 1) % n;
        let parts: Vec<u8> = (0..n).flat_map(|p| data::bytes(t, r, p, count)).collect();
        let want: Vec<f64> = (0..count).map(|i| data::moved(t, root, r, i)).collect();
        let send = Buf::new(&parts, nccl_mem);
        let recv = Buf::new(&data::marked(b), nccl_mem);
        let from = if r == root { send.ptr() } else { null };
        ok(
            unsafe { (x.scatter)(from, recv.ptr(), count, t, root as c_int, c.0, STREAM) },
            &what("ncclScatter", t),
        );
        data::check(t, &recv.read(), &want, &what("ncclScatter", t));
        let from = if r == root { send.ptr() } else { null };
        let into = if r == root {
            send.at(r * b)
        } else {
            recv.ptr()
        };
        ok(
            unsafe { (x.scatter)(from, into, count, t, root as c_int, c.0, STREAM) },
            &what("in-place ncclScatter", t),
        );
        let got = if r == root {
            send.read_range(r * b..(r + 1) * b)
        } else {
            recv.read()
        };
        data::check(t, &got, &want, &what("in-place ncclScatter", t));

        // Broadcast from every root, out of place (ncclBroadcast) and in place (ncclBcast).
        for root in 0..n {
            let want: Vec<f64> = (0..count).map(|i| data::moved(t, root, 7, i)).collect();
            let mine = data::bytes(t, r, 7, count);
            let send = Buf::new(&mine, nccl_mem);
            let recv = Buf::new(&data::marked(b), nccl_mem);
            ok(
                unsafe {
                    (x.broadcast)(send.ptr(), recv.ptr(), count, t, root as c_int, c.0, STREAM)
                },
                &what("ncclBroadcast", t),
            );
            data::check(t, &recv.read(), &want, &what("ncclBroadcast", t));
            let buf = Buf::new(&mine, nccl_mem);
            ok(
                unsafe { (x.bcast)(buf.ptr(), count, t, root as c_int, c.0, STREAM) },
                &what("ncclBcast", t),
            );
            data::check(t, &buf.read(), &want, &what("ncclBcast", t));
        }

        // All-to-all: part p of rank q lands as part q of rank p.
        let parts: Vec<u8> = (0..n).flat_map(|p| data::bytes(t, r, p, count)).collect();
        let want: Vec<f64> = (0..n)
            .flat_map(|q| (0..count).map(move |i| data::moved(t, q, r, i)))
            .collect();
        let send = Buf::new(&parts, nccl_mem);
        let recv = Buf::new(&data::marked(n * b), nccl_mem);
        ok(
            unsafe { (x.all_to_all)(send.ptr(), recv.ptr(), count, t, c.0, STREAM) },
            &what("ncclAlltoAll", t),
        );
        data::check(t, &recv.read(), &want, &what("ncclAlltoAll", t));
        let recv = Buf::new(&data::marked(n * b), nccl_mem);
        ok(
            unsafe { (x.all_to_all_alias)(send.ptr(), recv.ptr(), count, t, c.0, STREAM) },
            &what("ncclAllToAll", t),
        );
        data::check(t, &recv.read(), &want, &what("ncclAllToAll", t));

        // One group: a ring (send to the next rank, receive from the previous), a send to and
        // a receive from this rank itself, and a zero-count send and receive around the ring.
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        let ring = Buf::new(&data::bytes(t, r, 3, count), nccl_mem);
        let me = Buf::new(&data::bytes(t, r, 4, count), nccl_mem);
        let from_prev = Buf::new(&data::marked(b), nccl_mem);
        let from_me = Buf::new(&data::marked(b), nccl_mem);
        ok(unsafe { (x.group_start)() }, "ncclGroupStart");
        let calls = [
            unsafe { (x.send)(ring.ptr(), count, t, next as c_int, c.0, STREAM) },
            unsafe { (x.recv)(from_prev.ptr(), count, t, prev as c_int, c.0, STREAM) },
            unsafe { (x.recv)(from_me.ptr(), count, t, r as c_int, c.0, STREAM) },
            unsafe { (x.send)(me.ptr(), count, t, r as c_int, c.0, STREAM) },
            unsafe { (x.send)(null, 0, t, next as c_int, c.0, STREAM) },
            unsafe { (x.recv)(null, 0, t, prev as c_int, c.0, STREAM) },
        ];
        for (i, code) in calls.into_iter().enumerate() {
            ok(code, &what(&format!("grouped send/recv {i}"), t));
        }
        ok(
            unsafe { (x.group_end)() },
            &what("ncclGroupEnd of sends", t),
        );
        let want: Vec<f64> = (0..count).map(|i| data::moved(t, prev, 3, i)).collect();
        data::check(t, &from_prev.read(), &want, &what("a ring of sends", t));
        let want: Vec<f64> = (0..count).map(|i| data::moved(t, r, 4, i)).collect();
        data::check(t, &from_me.read(), &want, &what("a send to itself", t));
    }
}
