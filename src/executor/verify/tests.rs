//! The verifier: the repository's plans and MSCCL++'s conformance plans pass at every size it
//! tries; each kind of broken plan is refused at the op at fault.

use mscclpp_host::Error;
use mscclpp_host::error::PlanError;

use super::super::lower::{Geometry, Sizes};
use super::super::plan::tests::{RUNNABLE, conformance_dir};
use super::super::plan::{BufferKind, Op, OpKind, PlanDoc, ReduceKind};
use super::super::plans::{self, data, local};
use super::*;

/// Verifies `doc` at every canonical size.
fn check(doc: &PlanDoc) -> Result<Vec<Summary>> {
    canonical_sizes(doc)?
        .into_iter()
        .map(|s| {
            let g = Geometry::new(doc, s)?;
            verify(doc, &g, &declared_aliasing(doc, s), Races::Refuse)
        })
        .collect()
}

/// Expects `doc` refused at (rank, block, op path) with a problem containing `says`.
#[track_caller]
fn refused(doc: &PlanDoc, at: (usize, usize, &str), says: &str) {
    match check(doc) {
        Err(Error::Plan(PlanError::Refused {
            rank,
            block,
            op,
            problem,
            ..
        })) => {
            assert_eq!((rank, block, op.as_str()), at, "{problem}");
            assert!(problem.contains(says), "{problem:?} lacks {says:?}");
        }
        other => panic!("expected a refusal at {at:?}, got {other:?}"),
    }
}

fn ops(doc: &mut PlanDoc, r: usize, b: usize) -> &mut Vec<Op> {
    &mut doc.gpus[r].threadblocks[b].ops
}

#[test]
fn the_repository_plans_verify_at_2_3_4_and_8_ranks() {
    for n in [2, 3, 4, 8] {
        for doc in plans::all(n, 256) {
            let s = check(&doc).unwrap_or_else(|e| panic!("{} at {n} ranks: {e}", doc.name));
            assert!(!s.is_empty());
            assert_eq!(s[0].ranks, n);
            assert!(s[0].sent.iter().all(|&b| b > 0), "{}: {s:?}", doc.name);
        }
        for rot in 1..4 {
            check(&plans::allreduce_packets(n, rot)).unwrap();
        }
        for op in [ReduceKind::Min, ReduceKind::Max] {
            check(&plans::allreduce_read(n, op)).unwrap();
        }
    }
}

#[test]
fn canonical_sizes_cut_groups_evenly_and_not_and_loop_pipelines() {
    let doc = plans::allreduce_get(3);
    let s = canonical_sizes(&doc).unwrap();
    assert_eq!(
        s[0].input,
        3 * 2 * 16,
        "chunks of 2 units: a group of 2 shares evenly"
    );
    assert_eq!(s.len(), 2);
    assert_eq!(s[1].input % (3 * 16), 0);
    assert_ne!(
        (s[1].input / 3 / 16) % 2,
        0,
        "an odd number of units per chunk"
    );
    let doc = plans::allreduce_pipeline(2, 256);
    let s = canonical_sizes(&doc).unwrap();
    let g = Geometry::new(&doc, *s.last().unwrap()).unwrap();
    assert!(g.iterations(1, 256) >= 2, "{g:?}");
}

#[test]
fn conformance_plans_verify_at_32_mib_and_more() {
    let Some(dir) = conformance_dir() else {
        println!("NOT RUN: ../shared/mscclpp-plans is absent (MSCCL++'s conformance plans)");
        return;
    };
    for f in RUNNABLE {
        let doc = PlanDoc::parse(&std::fs::read_to_string(dir.join(f)).unwrap(), f).unwrap();
        check(&doc).unwrap_or_else(|e| panic!("{f}: {e}"));
        let m = 32 << 20;
        let sizes = if doc.collective == "allgather" {
            Sizes {
                input: m / 2,
                output: m,
            }
        } else {
            Sizes {
                input: m,
                output: m,
            }
        };
        let g = Geometry::new(&doc, sizes).unwrap();
        let s = verify(&doc, &g, &declared_aliasing(&doc, sizes), Races::Refuse)
            .unwrap_or_else(|e| panic!("{f}: {e}"));
        assert!(s.sent.iter().all(|&b| b > 0), "{f}");
        assert!(s.races.is_empty(), "{f}");
    }
}

#[test]
fn a_wait_nobody_signals_hangs() {
    let mut doc = plans::allreduce_read(2, ReduceKind::Sum);
    ops(&mut doc, 1, 0).remove(0); // rank 1's first signal
    // Rank 0's waits take rank 1's later signals, so the last wait is the one left short.
    refused(&doc, (0, 0, "ops[8]"), "which rank 1 never sends");
}

#[test]
fn waiting_before_signalling_on_both_sides_hangs() {
    let mut doc = plans::allreduce_read(2, ReduceKind::Sum);
    for r in 0..2 {
        ops(&mut doc, r, 0).swap(0, 1);
    }
    refused(&doc, (0, 0, "ops[0]"), "hangs in launch 1");
}

#[test]
fn a_missing_wait_leaves_signals_unbalanced() {
    let mut doc = plans::allreduce_read(2, ReduceKind::Sum);
    ops(&mut doc, 1, 0).remove(1); // rank 1's first wait
    refused(&doc, (1, 0, "ops[7]"), "must balance");
}

#[test]
fn an_unsynchronised_write_into_a_peer_is_refused() {
    // Without the last handshake, nothing orders a rank's reads of the peers' inputs and puts
    // into their outputs before the peers' launches end.
    let mut doc = plans::allreduce_get(2);
    for r in 0..2 {
        let o = ops(&mut doc, r, 0);
        o.truncate(o.len() - 2);
    }
    match check(&doc) {
        Err(Error::Plan(PlanError::Refused { problem, name, .. })) => {
            assert!(problem.contains("may end before that"), "{problem}");
            assert!(matches!(name, "get" | "put" | "res"), "{name}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_write_before_the_peer_starts_is_refused() {
    // Without the first handshake, a rank's proxy may write a peer's output before the peer's
    // launch starts (while its caller still reads the last results).
    let mut doc = plans::allgather_port(2);
    for r in 0..2 {
        let o = ops(&mut doc, r, 0);
        o.remove(2);
        o.remove(2);
    }
    match check(&doc) {
        Err(Error::Plan(PlanError::Refused { problem, .. })) => {
            assert!(problem.contains("launch starts"), "{problem}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_threadblock_group_short_of_shares_is_refused() {
    let mut doc = plans::allreduce_get(2);
    ops(&mut doc, 0, 1).retain(|o| o.kind != OpKind::Get);
    refused(&doc, (0, 0, "ops[3]"), "hold shares [0]");
}

#[test]
fn relaxed_signals_publish_nothing() {
    let mut doc = plans::allreduce_read(2, ReduceKind::Sum);
    for r in 0..2 {
        let o = ops(&mut doc, r, 0);
        o[5].kind = OpKind::RelaxedSignal;
        o[6].kind = OpKind::RelaxedWait;
    }
    refused(&doc, (1, 0, "ops[3]"), "may end before that");
}

#[test]
fn two_writers_of_a_chunk_race() {
    let mut doc = plans::allreduce_get(2);
    // Block 1 of rank 0 writes its output chunk 1 too, unordered with the peer's put there.
    let stray = data(
        OpKind::Copy,
        vec![local(BufferKind::Input, 1, 1)],
        vec![local(BufferKind::Output, 1, 1)],
        None,
    );
    ops(&mut doc, 0, 1).insert(1, stray);
    match check(&doc) {
        Err(Error::Plan(PlanError::Refused { problem, .. })) => {
            assert!(problem.contains("nothing orders the two"), "{problem}");
            assert!(problem.contains("output"), "{problem}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn packets_nobody_writes_hang() {
    let mut doc = plans::allreduce_packets(2, 0);
    ops(&mut doc, 0, 0).clear();
    refused(&doc, (1, 1, "ops[0]"), "reads packets");
}

#[test]
fn a_source_the_proxy_may_still_read_is_refused() {
    let mut doc = plans::allgather_port(2);
    ops(&mut doc, 0, 0).retain(|o| o.kind != OpKind::Flush);
    refused(&doc, (0, 0, "ops[0]"), "(put) reads them");
}

#[test]
fn semaphores_need_their_releases_and_one_block_each_side() {
    let mut doc = plans::allreduce_pipeline(2, 256);
    ops(&mut doc, 1, 0).retain(|o| o.kind != OpKind::SemRelease);
    refused(&doc, (1, 1, "ops[0]"), "semaphore 0");
    let mut doc = plans::allreduce_pipeline(2, 256);
    let rel = ops(&mut doc, 0, 0)[1].clone();
    ops(&mut doc, 0, 1).push(rel);
    refused(&doc, (0, 1, "ops[6]"), "depend on timing");
}

#[test]
fn a_barrier_short_of_blocks_is_refused() {
    let mut doc = plans::allreduce_get(2);
    ops(&mut doc, 1, 1).retain(|o| o.kind != OpKind::Barrier);
    refused(&doc, (1, 0, "ops[2]"), "threadblocks [0] use it");
}
