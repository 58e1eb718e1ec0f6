//! Sub-worlds over a world's bootstrap links (`SubBootstrap`): the bare sub-bootstrap and both
//! kinds of communicator over it, a split's and the node group of a world of several nodes
//! (`Communicator::node_group`).
//! Every contribution to a sub-world's all-gather (and barrier) must be as long as this rank's
//! in both; a node group is bound to its world (a world abort fails it) while a split is not.
//! Ranks as threads on 127.0.0.1, the backend users would get (the CPU backend here).

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use mscclpp_host::Error;
use mscclpp_host::bootstrap::{Bootstrap, SUB_TAG, SubBootstrap};
use mscclpp_host::communicator::Communicator;
use mscclpp_test_support::{ranks_as_threads as world, ranks_as_threads_over};

/// Runs `n` ranks as threads over loopback TCP bootstraps; rank `r` returns `body(bootstrap)`
/// (each rank's communicator is made too, and left alone).
fn bootstraps<T: Send>(
    n: usize,
    body: impl Fn(Arc<dyn Bootstrap>) -> mscclpp_host::Result<T> + Sync,
) -> Vec<mscclpp_host::Result<T>> {
    ranks_as_threads_over(
        n,
        |bs| {
            let bs: Arc<dyn Bootstrap> = Arc::new(bs);
            (Arc::clone(&bs), bs)
        },
        |_comm, bs| body(bs),
    )
}

/// The member a malformed contribution came from, as the error names it.
fn malformed_from(e: &Error) -> Option<usize> {
    match e {
        Error::BootstrapMalformed { peer, .. } => peer.rank,
        _ => None,
    }
}

/// What a sub-world's member sees: its all-gather of equal lengths, then the errors of an
/// all-gather and of a barrier whose contributions differ in length.
type Seen = (Vec<Vec<u8>>, Error, Error);

/// Member 0 contributes 4 bytes, member 1 eight; then member 0 contributes a byte to a barrier
/// (an all-gather of nothing on member 1).
fn exchange(sub: &dyn Bootstrap) -> mscclpp_host::Result<Seen> {
    let all = sub.all_gather(&[sub.rank() as u8 + 10; 2])?;
    let mine = vec![7u8; if sub.rank() == 0 { 4 } else { 8 }];
    let refused = sub.all_gather(&mine).unwrap_err();
    let barrier = if sub.rank() == 0 {
        sub.all_gather(&[1]).map(|_| ())
    } else {
        sub.barrier()
    };
    Ok((all, refused, barrier.unwrap_err()))
}

fn check(member: usize, (all, refused, barrier): &Seen) {
    assert_eq!(all, &vec![vec![10u8; 2], vec![11u8; 2]], "member {member}");
    let other = 1 - member;
    assert_eq!(malformed_from(refused), Some(other), "{refused}");
    let (theirs, mine) = if member == 0 { (8, 4) } else { (4, 8) };
    let text = format!("contribution of {theirs} bytes, {mine} expected");
    assert!(refused.to_string().contains(&text), "{refused}");
    assert_eq!(malformed_from(barrier), Some(other), "{barrier}");
}

#[test]
fn node_groups_check_every_contribution() {
    // Two "nodes" of two ranks, the second in reverse order: groups [0, 1] and [3, 2].
    let got = world(4, |comm| {
        let members = if comm.rank() < 2 {
            vec![0, 1]
        } else {
            vec![3, 2]
        };
        let node = comm.node_group(members).unwrap();
        let seen = exchange(node.bootstrap().as_ref()).unwrap();
        comm.barrier().unwrap();
        (comm.rank(), node.rank(), seen)
    });
    for (rank, member, seen) in &got {
        assert_eq!(*member, [0, 1, 1, 0][*rank], "rank {rank}");
        check(*member, seen);
    }
}

#[test]
fn splits_check_every_contribution() {
    // Colors by parity, keys reversing the order: groups [2, 0] and [3, 1].
    let got = world(4, |comm| {
        let r = comm.rank();
        let sub = comm
            .split(Some(r as u32 % 2), -(r as i64))
            .unwrap()
            .unwrap();
        let seen = exchange(sub.bootstrap().as_ref()).unwrap();
        comm.barrier().unwrap();
        (r, sub.rank(), seen)
    });
    for (rank, member, seen) in &got {
        assert_eq!(*member, [1, 1, 0, 0][*rank], "rank {rank}");
        check(*member, seen);
    }
}

/// How long a node group may take to see its world's abort (its health monitor polls every
/// 20 ms; generous for a loaded machine).
const NOTICE: Duration = Duration::from_secs(10);

/// Whether `comm`'s health monitor aborted it within [`NOTICE`].
fn aborted_soon(comm: &Communicator) -> bool {
    let until = Instant::now() + NOTICE;
    while Instant::now() < until {
        if comm.status().is_aborted() {
            return true;
        }
        thread::sleep(Duration::from_millis(5));
    }
    false
}

#[test]
fn a_node_group_fails_with_its_world_and_a_split_does_not() {
    let got = world(2, |comm| {
        let node = comm.node_group(vec![0, 1]).unwrap();
        let split = comm.split(Some(0), 0).unwrap().unwrap();
        node.barrier().unwrap();
        split.barrier().unwrap();
        if comm.rank() == 0 {
            comm.abort();
        }
        let node_aborted = comm.rank() == 0 && aborted_soon(&node);
        let why = node.async_error().map(|e| e.to_string());
        // The split is not bound to the world: it still works, on both ranks.
        let split_alive = split.barrier().is_ok() && !split.status().is_aborted();
        // The node group's waits watch the world: rank 0's fail at once.
        let node_wait = (comm.rank() == 0).then(|| node.barrier().unwrap_err().to_string());
        split.barrier().unwrap();
        (node_aborted, why, split_alive, node_wait)
    });
    let (aborted, why, split_alive, node_wait) = &got[0];
    assert!(aborted, "rank 0's node group did not fail with its world");
    let why = why.as_deref().unwrap_or_default();
    assert!(
        why.contains("world communicator of this rank was aborted"),
        "{why}"
    );
    assert!(split_alive, "rank 0's split failed with the world");
    let node_wait = node_wait.as_deref().unwrap_or_default();
    assert!(node_wait.contains("aborted"), "{node_wait}");
    assert!(got[1].2, "rank 1's split failed");
}

#[test]
fn a_sub_bootstrap_checks_every_contribution() {
    // The bare sub-bootstrap over TCP: members 0 and 1 are parent ranks 2 and 0; parent rank 1
    // is not a member and only passes the parent's barrier at the end.
    let got = bootstraps(3, |parent| {
        let me = parent.rank();
        if me == 1 {
            return parent.barrier().map(|()| None);
        }
        let sub = SubBootstrap::new(Arc::clone(&parent), vec![2, 0], 5)?;
        let seen = exchange(&sub)?;
        parent.barrier()?;
        Ok(Some((sub.rank(), seen)))
    });
    let mut members = Vec::new();
    for r in got {
        if let Some((member, seen)) = r.unwrap() {
            check(member, &seen);
            members.push(member);
        }
    }
    members.sort_unstable();
    assert_eq!(members, vec![0, 1]);
}

#[test]
fn a_sub_bootstrap_frame_shorter_than_its_tag_is_refused() {
    let got = bootstraps(2, |parent| {
        let sub = SubBootstrap::new(Arc::clone(&parent), vec![0, 1], 3)?;
        if parent.rank() == 0 {
            // A frame of the group's user channel without a whole inner tag, then a good one.
            parent.send(1, SUB_TAG | 3 << 1, &[1, 2, 3])?;
            sub.send(1, 9, b"ok")?;
            return parent.barrier().map(|()| None);
        }
        let short = sub.recv(0, 9).unwrap_err();
        let next = sub.recv(0, 9)?;
        parent.barrier()?;
        Ok(Some((short, next)))
    });
    let (short, next) = got.into_iter().find_map(|r| r.unwrap()).unwrap();
    assert_eq!(malformed_from(&short), Some(0), "{short}");
    assert!(short.to_string().contains("3 bytes"), "{short}");
    assert_eq!(next, b"ok");
}
