//! Sub-communicators (`Communicator::split`, NCCL's `ncclCommSplit`): groups by color, ranked by
//! key, "no color", nested splits, the group's own bootstrap tags, and collectives on
//! sub-communicators running at the same time as the parent's; ranks as threads and as
//! processes. `split_creation_cost` prints what a split and its collectives cost (time, device
//! memory), asserting nothing about time.
//!
//! Ranks as threads and processes: the workspace's test harness (`mscclpp-test-support`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use mscclpp::collectives::{Algorithm, Collective, CollectiveConfig, Collectives, memory_plan};
use mscclpp::host::gpu::{BackendKind, Stream};
use mscclpp::shared::{DataType, ReduceOp};

use mscclpp_test_support::{
    backend, child_communicator, enough_gpus, ranks_as_processes, try_ranks_as_threads,
};

/// Element `i` of parent rank `r`'s contribution: distinct per rank and index.
fn value(r: usize, i: usize) -> u32 {
    (r as u32 + 1).wrapping_mul(0x9e37_79b9) ^ (i as u32).wrapping_mul(0x85eb_ca6b)
}

/// Sums `count` u32 over `c`'s ranks (whose parent ranks are `members`) on `stream`, and checks
/// every element against the host's sum.
fn check_sum(c: &Collectives, me: usize, members: &[usize], count: usize, stream: &Stream) {
    let g = c.communicator().gpu();
    let buf = g.alloc(count * 4).expect("alloc");
    let mine: Vec<u32> = (0..count).map(|i| value(me, i)).collect();
    buf.copy_from_host(0, bytemuck::cast_slice(&mine))
        .expect("copy in");
    // SAFETY: `buf` holds `count` u32 and outlives the synchronize below.
    unsafe {
        c.all_reduce(
            buf.ptr(),
            buf.ptr(),
            count,
            DataType::U32,
            ReduceOp::Sum,
            stream,
            None,
        )
    }
    .expect("all_reduce");
    stream.synchronize().expect("synchronize");
    let mut got = vec![0u32; count];
    buf.copy_to_host(0, bytemuck::cast_slice_mut(&mut got))
        .expect("copy out");
    for (i, g) in got.iter().enumerate() {
        let want = members
            .iter()
            .fold(0u32, |s, &r| s.wrapping_add(value(r, i)));
        assert_eq!(*g, want, "element {i} of {count} over {members:?}");
    }
    assert!(c.communicator().status().error().is_none());
}

/// Colors 7, 3, 7 and none on 4 ranks, keys putting rank 2 before rank 0: the groups, their
/// ranks, their bootstrap (collectives and tags apart from the parent's), and their collectives
/// while the parent runs its own on another thread.
#[test]
fn colors_keys_and_no_color_on_4_ranks() {
    if !enough_gpus("split on 4 ranks", 4) {
        return;
    }
    try_ranks_as_threads(4, |comm| {
        let r = comm.rank();
        let (color, key) = [(Some(7), 5), (Some(3), 0), (Some(7), 1), (None, 0)][r];
        let sub = comm.split(color, key)?;
        let members: &[usize] = match color {
            Some(7) => &[2, 0],
            Some(_) => &[1],
            None => {
                // No group: only the parent's collectives.
                assert!(sub.is_none(), "rank 3 has no color");
                let parent = Collectives::new(Arc::new(comm))?;
                let st = parent.communicator().gpu().stream()?;
                for count in [5, 1000, 4099] {
                    check_sum(&parent, r, &[0, 1, 2, 3], count, &st);
                }
                return parent.communicator().barrier();
            }
        };
        let sub = sub.expect("a colored rank gets a communicator");
        assert_eq!(sub.size(), members.len());
        assert_eq!(members[sub.rank()], r);
        // The group's collectives see the group only.
        let all = sub.all_gather(&(r as u32).to_le_bytes())?;
        let got: Vec<usize> = all
            .iter()
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
            .collect();
        assert_eq!(got, members);
        let mut root = if sub.rank() == 0 {
            vec![r as u8; 3]
        } else {
            Vec::new()
        };
        sub.broadcast(0, &mut root)?;
        assert_eq!(root, vec![members[0] as u8; 3]);
        // The same tag on the parent and on the group carries different messages.
        if sub.size() == 2 {
            let (peer, parent_peer) = (1 - sub.rank(), members[1 - sub.rank()]);
            sub.bootstrap().send(peer, 5, b"group")?;
            comm.bootstrap().send(parent_peer, 5, b"parent")?;
            assert_eq!(comm.bootstrap().recv(parent_peer, 5)?, b"parent");
            assert_eq!(sub.bootstrap().recv(peer, 5)?, b"group");
        }
        sub.barrier()?;

        // Collectives on the group and on the parent at the same time.
        let parent = Collectives::new(Arc::new(comm))?;
        let group = Collectives::new(Arc::new(sub))?;
        std::thread::scope(|s| {
            let p = s.spawn(|| {
                let st = parent.communicator().gpu().stream().expect("stream");
                for count in [5, 1000, 4099] {
                    check_sum(&parent, r, &[0, 1, 2, 3], count, &st);
                }
            });
            let st = group.communicator().gpu().stream().expect("stream");
            for count in [3, 1000, 2 << 10, 40_000] {
                check_sum(&group, r, members, count, &st);
            }
            p.join().expect("parent thread");
        });
        group.communicator().barrier()?;
        parent.communicator().barrier()
    });
}

/// 8 ranks in four pairs, and a nested split (halves of 4, each split again in 2 by key): every
/// group's collectives, and a split of a split.
#[test]
fn pairs_and_nested_splits_on_8_ranks() {
    if !enough_gpus("split on 8 ranks", 8) {
        return;
    }
    try_ranks_as_threads(8, |comm| {
        let r = comm.rank();
        let pair = comm.split(Some((r / 2) as u32), 0)?.expect("pair");
        assert_eq!((pair.size(), pair.rank()), (2, r % 2));
        let half = comm
            .split(Some((r % 2) as u32), -(r as i64))?
            .expect("half");
        // Keys are minus the rank: the highest rank comes first.
        let halves: Vec<usize> = (0..8).rev().filter(|q| q % 2 == r % 2).collect();
        assert_eq!(half.size(), 4);
        assert_eq!(halves[half.rank()], r);
        let quarter = half
            .split(Some((half.rank() / 2) as u32), 0)?
            .expect("quarter");
        let q_members: Vec<usize> = halves[(half.rank() / 2) * 2..][..2].to_vec();
        assert_eq!(q_members[quarter.rank()], r);
        let stream = comm.gpu().stream()?;
        let pair_members = [r / 2 * 2, r / 2 * 2 + 1];
        let pc = Collectives::new(Arc::new(pair))?;
        check_sum(&pc, r, &pair_members, 777, &stream);
        let hc = Collectives::new(Arc::new(half))?;
        check_sum(&hc, r, &halves, 5000, &stream);
        let qc = Collectives::new(Arc::new(quarter))?;
        check_sum(&qc, r, &q_members, 123, &stream);
        for c in [&pc, &hc, &qc] {
            c.communicator().barrier()?;
        }
        comm.barrier()
    });
}

/// The same split with ranks as processes (the groups' collectives over memory mapped across
/// processes).
#[test]
fn split_as_processes() {
    const TEST: &str = "split_as_processes";
    if let Some(comm) = child_communicator() {
        let r = comm.rank();
        let color = if r == 3 { None } else { Some((r % 2) as u32) };
        let sub = comm.split(color, 0).expect("split");
        if let Some(sub) = sub {
            let members: Vec<usize> = (0..3).filter(|q| q % 2 == r % 2).collect();
            let c = Collectives::new(Arc::new(sub)).expect("collectives");
            let s = c.communicator().gpu().stream().expect("stream");
            check_sum(&c, r, &members, 3001, &s);
            c.communicator().barrier().expect("barrier");
        }
        comm.barrier().expect("barrier");
        return;
    }
    if !enough_gpus("split as processes", 4) {
        return;
    }
    ranks_as_processes(4, TEST);
}

/// One rank's figures in [`split_creation_cost`]: split time, split + set-up time, bytes at
/// creation, bytes the first call of each algorithm added.
type Row = (Duration, Duration, usize, Vec<(Algorithm, usize)>);

/// What creating a sub-communicator costs on this backend (1, 2 and 8 ranks): the split alone, its
/// collectives' set-up, and the device memory the collectives allocate at creation and after
/// the first call of each algorithm; and the same figures for the CUDA defaults
/// (`memory_plan`). Printed (`--nocapture`), not asserted: no timing is a test result here.
#[test]
fn split_creation_cost() {
    // One rank too: what one GPU can show (two ranks need two GPUs).
    for n in [1, 2, 8] {
        if !enough_gpus("split creation cost", n) {
            continue;
        }
        let rows = try_ranks_as_threads(n, |comm| {
            let comm = Arc::new(comm);
            // Warm: the parent's own collectives (the module load, first threads).
            let _parent = Collectives::new(comm.clone())?;
            comm.barrier()?;
            let t0 = Instant::now();
            let sub = comm.split(Some(0), 0)?.expect("one group");
            let t_split = t0.elapsed();
            let before = sub.gpu().allocated_bytes();
            let sub = Arc::new(sub);
            let c = Collectives::new(sub.clone())?;
            let t_total = t0.elapsed();
            let at_creation = sub.gpu().allocated_bytes() - before;
            let stream = sub.gpu().stream()?;
            let mut firsts = Vec::new();
            let bytes = 8 << 10;
            let buf = sub.gpu().alloc(bytes)?;
            for a in Algorithm::ALL
                .into_iter()
                .filter(|a| a.serves(Collective::AllReduce))
            {
                let held = sub.gpu().allocated_bytes();
                // SAFETY: `buf` holds `bytes` until the synchronize.
                let r = unsafe {
                    c.all_reduce(
                        buf.ptr(),
                        buf.ptr(),
                        bytes / 4,
                        DataType::F32,
                        ReduceOp::Sum,
                        &stream,
                        Some(a),
                    )
                };
                if r.is_ok() {
                    stream.synchronize()?;
                }
                firsts.push((a, sub.gpu().allocated_bytes().saturating_sub(held)));
            }
            sub.barrier()?;
            Ok((t_split, t_total, at_creation, firsts))
        });
        let worst = |f: fn(&Row) -> Duration| rows.iter().map(f).max().unwrap_or_default();
        let (split, total) = (worst(|r| r.0), worst(|r| r.1));
        let mem = rows.iter().map(|r| r.2).max().unwrap_or(0);
        println!(
            "split_creation_cost {:?} {n} ranks: split {:.2} ms, split + Collectives::new {:.2} \
             ms (slowest rank); device memory at creation {} KiB per rank",
            backend(),
            split.as_secs_f64() * 1e3,
            total.as_secs_f64() * 1e3,
            mem >> 10
        );
        for (a, bytes) in &rows[0].3 {
            println!("  first {:>6} all-reduce: +{} KiB", a.name(), bytes >> 10);
        }
        let plan = memory_plan(&CollectiveConfig::for_backend(BackendKind::Cuda), n);
        println!(
            "  CUDA defaults, {n} ranks: {:.2} MiB at creation",
            plan.at_creation as f64 / (1 << 20) as f64
        );
        for (region, who, bytes) in plan.on_first_use {
            println!(
                "    + {:.2} MiB {region} on the first {who} call",
                bytes as f64 / (1 << 20) as f64
            );
        }
    }
}

/// The regions allocated on first use (`scratch.rs`): none but the LL16 region at set-up, the
/// staging region with the first staged call (any rank's: the peers' services allocate theirs
/// when it arrives), every region with `prepare` (once), and the results right throughout.
#[test]
fn scratch_regions_are_allocated_on_first_use() {
    if !enough_gpus("scratch regions", 3) {
        return;
    }
    try_ranks_as_threads(3, |comm| {
        let r = comm.rank();
        let cfg = CollectiveConfig::for_backend(comm.gpu().kind());
        let plan = memory_plan(&cfg, 3);
        let c = Collectives::with_config(Arc::new(comm), cfg)?;
        let st = c.communicator().gpu().stream()?;
        let set_up = c.scratch_bytes();
        assert!(set_up < plan.at_creation, "{set_up} {plan:?}");
        let ranks = [0, 1, 2];
        check_sum(&c, r, &ranks, 100, &st);
        assert_eq!(c.last_algorithm(), Some(Algorithm::LlOneShot));
        assert_eq!(c.scratch_bytes(), set_up, "LL allocates nothing");
        // Before any rank's first staged call: a peer's region, once sent, makes this rank's
        // registration service allocate this rank's own (regions.rs).
        c.communicator().barrier()?;
        let staging = plan
            .on_first_use
            .iter()
            .find(|(name, _, _)| *name == "staging")
            .map(|&(_, _, b)| b)
            .expect("a staging region");
        let buf = c.communicator().gpu().alloc(4096)?;
        // SAFETY: `buf` holds 1024 u32 until the synchronize.
        unsafe {
            c.all_reduce(
                buf.ptr(),
                buf.ptr(),
                1024,
                DataType::U32,
                ReduceOp::Sum,
                &st,
                Some(Algorithm::Staged),
            )
        }?;
        st.synchronize()?;
        let table = staging - cfg.stage_bytes - 16 * 3;
        assert_eq!(
            c.scratch_bytes(),
            set_up + staging - table,
            "the staging region"
        );
        // Before any rank's `prepare`, which sends the peers every region (their services
        // then allocate theirs).
        c.communicator().barrier()?;
        c.prepare()?;
        let after = c.scratch_bytes();
        assert!(after > set_up + staging - table, "LL128 region by prepare");
        c.prepare()?;
        assert_eq!(c.scratch_bytes(), after, "prepare allocates once");
        check_sum(&c, r, &ranks, 3000, &st);
        c.communicator().barrier()
    });
}

/// `Bootstrap::recv_any` on a split's bootstrap (which waits on every peer at once through its
/// parent's `recv_any`): a split receives only while someone waits, so a receiver that only
/// looked would never see a message (the registration service of a split's collectives did
/// not, before). Each member sends every other member two messages; each receives all of them,
/// each sender's in order.
#[test]
fn recv_any_on_a_split_receives_every_message() {
    if !enough_gpus("recv_any on a split", 4) {
        return;
    }
    const TAG: u64 = 0x5eed;
    try_ranks_as_threads(4, |comm| {
        let r = comm.rank();
        let Some(sub) = comm.split(Some(1).filter(|_| r < 3), 0)? else {
            return Ok(());
        };
        let bs = sub.bootstrap();
        let (me, n) = (bs.rank(), bs.size());
        for q in (0..n).filter(|&q| q != me) {
            for k in 0..2u8 {
                bs.send(q, TAG, &[me as u8, k])?;
            }
        }
        let everyone: Vec<usize> = (0..n).collect();
        let mut next = vec![0u8; n];
        for _ in 0..2 * (n - 1) {
            let (from, m) = bs.recv_any(&everyone, TAG, Duration::from_secs(30))?;
            assert_eq!(m, [from as u8, next[from]], "rank {r}: from {from}");
            next[from] += 1;
        }
        sub.barrier()?;
        Ok(())
    });
}

/// `recv_any` on a split beside a receiver of one peer under another tag, on another thread
/// (both pull their parent's frames from the same peers): every message arrives where it is
/// waited for, each sender's in order.
#[test]
fn recv_any_beside_a_receiver_of_one_peer() {
    if !enough_gpus("recv_any beside a receiver", 3) {
        return;
    }
    const ANY: u64 = 0x5eed;
    const ONE: u64 = 0x5eee;
    const EACH: u8 = 20;
    try_ranks_as_threads(3, |comm| {
        let sub = comm.split(Some(0), 0)?.expect("one group");
        let bs = sub.bootstrap();
        let (me, n) = (bs.rank(), bs.size());
        let others: Vec<usize> = (0..n).filter(|&q| q != me).collect();
        for k in 0..EACH {
            for &q in &others {
                bs.send(q, ANY, &[me as u8, k])?;
                bs.send(q, ONE, &[me as u8, k])?;
            }
        }
        std::thread::scope(|s| {
            let one = s.spawn(|| -> mscclpp::host::Result<()> {
                for &q in &others {
                    for k in 0..EACH {
                        assert_eq!(bs.recv(q, ONE)?, [q as u8, k], "rank {me}: from {q}");
                    }
                }
                Ok(())
            });
            let mut next = vec![0u8; n];
            for _ in 0..EACH as usize * others.len() {
                let (from, m) = bs.recv_any(&others, ANY, Duration::from_secs(30))?;
                assert_eq!(m, [from as u8, next[from]], "rank {me}: from {from}");
                next[from] += 1;
            }
            one.join().expect("the receiver of one peer")
        })?;
        sub.barrier()
    });
}
