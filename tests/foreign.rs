//! Foreign streams and the typed API: collectives queued on a stream borrowed by its handle (as
//! the C ABI and PyTorch hand one over) run in order with the owner's work and leave it alone;
//! the default-stream handle works on every backend; every typed collective on several element
//! types against a host reference; length, device and device-scalar errors before anything is
//! queued; `Element` maps every Rust type to its `DataType`.
//!
//! Ranks as threads and processes: the workspace's test harness (`mscclpp-test-support`).

use std::sync::Arc;

use mscclpp::collectives::{
    Bf16, Collectives, DeviceVec, Element, F8E4M3, F8E5M2, F16, Reduction, Scalar,
};
use mscclpp::host::Error;
use mscclpp::host::gpu::{BackendKind, Gpu};
use mscclpp::shared::{DataType, DevicePtr, ReduceOp};

use mscclpp_test_support::{backend, enough_gpus, try_ranks_as_threads};

/// Rank `r`'s element `i`, small enough to sum exactly in every type used here.
fn small(r: usize, i: usize) -> u8 {
    ((r * 5 + i * 3) % 11) as u8
}

/// Collectives on a stream borrowed by its handle, between work the owner queues itself: all in
/// one order; dropping the borrowed stream leaves the owner's running. On the CPU backend the
/// default-stream handle (0, the C ABI's NULL stream) also takes collectives.
#[test]
fn collectives_on_a_borrowed_stream() {
    if !enough_gpus("borrowed streams", 2) {
        return;
    }
    try_ranks_as_threads(2, |comm| {
        let r = comm.rank();
        let c = Collectives::new(Arc::new(comm))?;
        let g = c.communicator().gpu().clone();
        let count = 3000;
        let owner = g.stream()?;
        let buf = g.alloc(count * 4)?;
        let copy = g.alloc(count * 4)?;
        let mine: Vec<u32> = (0..count).map(|i| small(r, i) as u32).collect();
        buf.copy_from_host(0, bytemuck::cast_slice(&mine))?;
        // SAFETY: the owner outlives the borrowed stream.
        let borrowed = unsafe { g.borrow_stream(owner.raw()) }?;
        assert!(borrowed.is_borrowed() && !owner.is_borrowed());
        // SAFETY (queued work below): `buf` and `copy` hold `count` u32 until the synchronize.
        unsafe {
            c.all_reduce(
                buf.ptr(),
                buf.ptr(),
                count,
                DataType::U32,
                ReduceOp::Sum,
                &borrowed,
                None,
            )?;
            // Queued by the owner after the collective: it sees the reduced data.
            owner.copy_dtod(copy.ptr(), buf.ptr(), count * 4)?;
        }
        drop(borrowed);
        owner.synchronize()?;
        let mut got = vec![0u32; count];
        copy.copy_to_host(0, bytemuck::cast_slice_mut(&mut got))?;
        for (i, v) in got.iter().enumerate() {
            assert_eq!(*v, (small(0, i) + small(1, i)) as u32, "element {i}");
        }
        if g.kind() == BackendKind::Cpu {
            // SAFETY: 0 names the device's default stream.
            let default = unsafe { g.borrow_stream(0) }?;
            // SAFETY: as above.
            unsafe {
                c.all_reduce(
                    buf.ptr(),
                    buf.ptr(),
                    count,
                    DataType::U32,
                    ReduceOp::Max,
                    &default,
                    None,
                )
            }?;
            default.synchronize()?;
            buf.copy_to_host(0, bytemuck::cast_slice_mut(&mut got))?;
            for (i, v) in got.iter().enumerate() {
                assert_eq!(
                    *v,
                    (small(0, i) + small(1, i)) as u32,
                    "max of equal sums {i}"
                );
            }
        } else {
            eprintln!("NOT RUN: the default stream's handle on CUDA (the CPU backend's only)");
        }
        assert!(c.communicator().status().error().is_none());
        c.communicator().barrier()
    });
}

/// `Element` names the `DataType` of the same size for every type.
#[test]
fn elements_map_to_their_data_types() {
    fn one<T: Element>(want: DataType) {
        assert_eq!(T::DTYPE, want);
        assert_eq!(std::mem::size_of::<T>(), want.size(), "{want:?}");
    }
    one::<i8>(DataType::I8);
    one::<u8>(DataType::U8);
    one::<i32>(DataType::I32);
    one::<u32>(DataType::U32);
    one::<i64>(DataType::I64);
    one::<u64>(DataType::U64);
    one::<f32>(DataType::F32);
    one::<f64>(DataType::F64);
    one::<F16>(DataType::F16);
    one::<Bf16>(DataType::BF16);
    one::<F8E4M3>(DataType::F8E4M3);
    one::<F8E5M2>(DataType::F8E5M2);
}

/// Every typed collective on 3 ranks, for i8, u64, f64 and (moved, not reduced) f16 and
/// fp8 bits, against a host reference.
#[test]
fn typed_collectives_on_3_ranks() {
    if !enough_gpus("typed collectives", 3) {
        return;
    }
    try_ranks_as_threads(3, |comm| {
        let (r, n) = (comm.rank(), comm.size());
        let c = Collectives::new(Arc::new(comm))?;
        let g = c.communicator().gpu().clone();
        let st = g.stream()?;
        let m = 777;
        // All-reduce, in and out of place, i8 (wrapping product) and f64 (sum).
        let x: Vec<i8> = (0..m).map(|i| small(r, i) as i8 - 5).collect();
        let input = DeviceVec::from_host(&g, &x)?;
        let mut prod = DeviceVec::<i8>::zeroed(&g, m)?;
        c.all_reduce_vec(&input, &mut prod, Reduction::Prod, &st)?;
        let want: Vec<i8> = (0..m)
            .map(|i| (0..n).fold(1i8, |p, q| p.wrapping_mul(small(q, i) as i8 - 5)))
            .collect();
        assert_eq!(prod.to_host()?, want, "i8 product");
        let y: Vec<f64> = (0..m).map(|i| small(r, i) as f64 * 0.5).collect();
        let mut fy = DeviceVec::from_host(&g, &y)?;
        c.all_reduce_vec_in_place(&mut fy, Reduction::Sum, &st)?;
        let want: Vec<f64> = (0..m)
            .map(|i| (0..n).map(|q| small(q, i) as f64 * 0.5).sum())
            .collect();
        assert_eq!(fy.to_host()?, want, "f64 sum in place");
        // All-gather of f16 bits, reduce-scatter of u64, all-to-all of fp8 bits, broadcast.
        let h: Vec<F16> = (0..m).map(|i| F16((r * 1000 + i) as u16)).collect();
        let hv = DeviceVec::from_host(&g, &h)?;
        let mut hg = DeviceVec::<F16>::zeroed(&g, n * m)?;
        c.all_gather_vec(&hv, &mut hg, &st)?;
        let want: Vec<F16> = (0..n * m)
            .map(|k| F16(((k / m) * 1000 + k % m) as u16))
            .collect();
        assert_eq!(hg.to_host()?, want, "f16 all-gather");
        let u: Vec<u64> = (0..n * m).map(|k| (r * 7 + k) as u64).collect();
        let uv = DeviceVec::from_host(&g, &u)?;
        let mut us = DeviceVec::<u64>::zeroed(&g, m)?;
        c.reduce_scatter_vec(&uv, &mut us, ReduceOp::Max, &st)?;
        let want: Vec<u64> = (0..m).map(|i| ((n - 1) * 7 + r * m + i) as u64).collect();
        assert_eq!(us.to_host()?, want, "u64 reduce-scatter max");
        let f: Vec<F8E5M2> = (0..n * m).map(|k| F8E5M2((r * 50 + k / m) as u8)).collect();
        let fv = DeviceVec::from_host(&g, &f)?;
        let mut fa = DeviceVec::<F8E5M2>::zeroed(&g, n * m)?;
        c.all_to_all_vec(&fv, &mut fa, &st)?;
        let want: Vec<F8E5M2> = (0..n * m)
            .map(|k| F8E5M2(((k / m) * 50 + r) as u8))
            .collect();
        assert_eq!(fa.to_host()?, want, "fp8 all-to-all");
        let mut b = DeviceVec::from_host(&g, &y)?;
        c.broadcast_vec(&mut b, 2, &st)?;
        let want: Vec<f64> = (0..m).map(|i| small(2, i) as f64 * 0.5).collect();
        assert_eq!(b.to_host()?, want, "f64 broadcast from rank 2");
        // Point to point: 0 sends to 1; 2 waits at the barrier.
        if r < 2 {
            let mut v = DeviceVec::<u32>::zeroed(&g, m)?;
            if r == 0 {
                v.copy_from_host(&(0..m as u32).collect::<Vec<_>>())?;
                c.send_vec(&v, 1, &st)?;
            } else {
                c.recv_vec(&mut v, 0, &st)?;
            }
            assert_eq!(v.to_host()?, (0..m as u32).collect::<Vec<_>>(), "send/recv");
        }
        assert!(c.communicator().status().error().is_none());
        c.communicator().barrier()
    });
}

/// Wrong lengths, a vector of another device and a device scalar are refused with typed errors
/// before anything is queued (no rank waits for another in a refused call: each refuses on
/// its own).
#[test]
fn typed_calls_refuse_before_queuing() {
    if !enough_gpus("typed refusals", 2) {
        return;
    }
    try_ranks_as_threads(2, |comm| {
        let c = Collectives::new(Arc::new(comm))?;
        let g = c.communicator().gpu().clone();
        let st = g.stream()?;
        let a = DeviceVec::<f32>::zeroed(&g, 100)?;
        let mut b = DeviceVec::<f32>::zeroed(&g, 99)?;
        let length = |r: mscclpp::host::Result<()>, what: &str| match r {
            Err(Error::LengthMismatch { .. }) => {}
            other => panic!("{what}: {other:?}"),
        };
        length(
            c.all_reduce_vec(&a, &mut b, Reduction::Sum, &st),
            "all_reduce",
        );
        length(c.all_gather_vec(&a, &mut b, &st), "all_gather");
        length(
            c.reduce_scatter_vec(&a, &mut b, Reduction::Sum, &st),
            "reduce_scatter",
        );
        let mut odd = DeviceVec::<f32>::zeroed(&g, 101)?;
        let odd_in = DeviceVec::<f32>::zeroed(&g, 101)?;
        length(
            c.all_to_all_vec(&odd_in, &mut odd, &st),
            "all_to_all of odd parts",
        );
        let mut v = vec![0f32; 7];
        length(b.copy_from_host(&v), "copy_from_host");
        v.resize(99, 1.0);
        b.copy_from_host(&v)?;
        let scalar = Reduction::PreMulSum(Scalar::Device(DevicePtr::from_addr(16)));
        match c.all_reduce_vec_in_place(&mut b, scalar, &st) {
            Err(Error::Unsupported { .. }) => {}
            other => panic!("a device scalar: {other:?}"),
        }
        if g.kind() == BackendKind::Cpu {
            let other = Gpu::open(BackendKind::Cpu, (g.ordinal() + 1) % 8)?;
            let mut elsewhere = DeviceVec::<f32>::zeroed(&other, 100)?;
            match c.all_reduce_vec(&a, &mut elsewhere, Reduction::Sum, &st) {
                Err(Error::Unsupported { .. }) => {}
                other => panic!("another device's vector: {other:?}"),
            }
        }
        // Still usable: a right call.
        let mut a = a;
        c.all_reduce_vec_in_place(&mut a, Reduction::Sum, &st)?;
        assert_eq!(a.to_host()?, vec![0.0; 100]);
        assert_eq!(b.to_host()?, v, "the refused call wrote nothing");
        let _ = backend();
        c.communicator().barrier()
    });
}
