//! The one selection table: which algorithm a call takes when the caller forces none, from
//! the collective, its size, the number of ranks and whether the callers' buffers can be
//! shared; and the check of a forced algorithm. The planner (`plan.rs`) asks it; the rules
//! are the rows below, next to the table and nowhere else.
//!
//! The table is read top to bottom; the first row of the call's collective whose condition
//! holds and whose algorithm serves the call (its rank count, type and operator, and, on the
//! first pass, nothing more) wins. An algorithm on the callers' registered buffers can decline
//! the call after its exchange (some rank's buffers cannot be shared); the call then takes the
//! first row whose algorithm needs no registration. Every collective's rows end with one that
//! always holds. Every rank holds the same configuration (checked at set-up) and makes the same
//! call, so every rank chooses alike.

use super::algorithm::{Algorithm, Collective};
use super::config::CollectiveConfig;
use super::context::Lowered;

/// One row of the table.
struct Row {
    collective: Collective,
    /// For `SendRecv`: a row of `send` / `recv` alone.
    one_way: bool,
    algorithm: Algorithm,
    when: fn(&CollectiveConfig, &Lowered) -> bool,
}

const fn row(
    collective: Collective,
    algorithm: Algorithm,
    when: fn(&CollectiveConfig, &Lowered) -> bool,
) -> Row {
    Row {
        collective,
        one_way: false,
        algorithm,
        when,
    }
}

const fn one_way(algorithm: Algorithm, when: fn(&CollectiveConfig, &Lowered) -> bool) -> Row {
    Row {
        collective: SendRecv,
        one_way: true,
        algorithm,
        when,
    }
}

fn always(_: &CollectiveConfig, _: &Lowered) -> bool {
    true
}

use Algorithm::*;
use Collective::*;

/// The selection table (module docs). Sizes are a call's `bytes` (per part for all-gather,
/// reduce-scatter and all-to-all).
const TABLE: &[Row] = &[
    // Worlds of several nodes (the single-node algorithms do not serve them, so these rows
    // are the only ones that fit there; the port and hierarchical algorithms serve no world
    // of one node): the hierarchical all-reduce when every node has as many ranks, else and
    // for everything else the port collective.
    row(AllReduce, Hierarchical, always),
    row(AllReduce, Port, always),
    row(Reduce, Port, always),
    row(AllGather, Port, always),
    row(ReduceScatter, Port, always),
    row(Broadcast, Port, always),
    row(AllToAll, Port, always),
    row(SendRecv, Port, always),
    one_way(Port, always),
    // All-reduce: LL128 in its range on few ranks; on more, the two-shot LL, which sends
    // 2 (n - 1) / n of the data where the one-shot kernels send n - 1 copies; LL16 below;
    // beyond the LL sizes the copy engines, the direct kernel, staging.
    row(AllReduce, Ll128, |c, x| {
        x.ranks < c.ll_two_shot_min_ranks
            && (c.ll128_min_bytes..=c.ll128_max_bytes).contains(&x.bytes)
    }),
    row(AllReduce, LlTwoShot, |c, x| {
        x.ranks >= c.ll_two_shot_min_ranks
            && (c.ll_two_shot_min_bytes..=c.ll_max_bytes).contains(&x.bytes)
    }),
    row(AllReduce, LlOneShot, |c, x| x.bytes <= c.ll_max_bytes),
    row(AllReduce, CopyEngine, |c, x| {
        x.bytes >= c.ce_all_reduce_min_bytes
    }),
    row(AllReduce, Direct, |c, x| x.bytes >= c.direct_min_bytes),
    row(AllReduce, Staged, always),
    // All-gather.
    row(AllGather, Ll128, |c, x| {
        x.ranks > 1 && (c.ll128_part_min_bytes..=c.ll128_max_bytes).contains(&x.bytes)
    }),
    row(AllGather, LlOneShot, |c, x| x.bytes <= c.ll_part_max_bytes),
    row(AllGather, CopyEngine, |c, x| x.bytes >= c.ce_min_bytes),
    row(AllGather, Direct, |c, x| x.bytes >= c.direct_min_bytes),
    row(AllGather, Staged, always),
    // Reduce-scatter: LL up to a whole slot (the direct kernel loads its parts over NVLink,
    // which is slower than packets up to 1 MiB parts: 0.8x NCCL at 1 MiB on 2xH200); no copy
    // engine (they do not reduce).
    row(ReduceScatter, Ll128, |c, x| {
        x.ranks > 1 && (c.ll128_part_min_bytes..=c.ll128_max_bytes).contains(&x.bytes)
    }),
    row(ReduceScatter, LlOneShot, |c, x| {
        x.ranks > 1 && x.bytes <= c.ll_max_bytes || x.bytes <= c.ll_part_max_bytes
    }),
    row(ReduceScatter, Direct, |c, x| x.bytes >= c.direct_min_bytes),
    row(ReduceScatter, Staged, always),
    // Broadcast.
    row(Broadcast, LlOneShot, |c, x| x.bytes <= c.ll_part_max_bytes),
    row(Broadcast, CopyEngine, |c, x| x.bytes >= c.ce_min_bytes),
    row(Broadcast, Direct, |c, x| x.bytes >= c.direct_min_bytes),
    row(Broadcast, Staged, always),
    // All-to-all.
    row(AllToAll, LlOneShot, |c, x| x.bytes <= c.ll_part_max_bytes),
    row(AllToAll, CopyEngine, |c, x| x.bytes >= c.ce_min_bytes),
    row(AllToAll, Direct, |c, x| x.bytes >= c.direct_min_bytes),
    row(AllToAll, Staged, always),
    // Reduce (to a root): as a broadcast's sizes, without copy engines (they do not reduce).
    row(Reduce, LlOneShot, |c, x| x.bytes <= c.ll_part_max_bytes),
    row(Reduce, Direct, |c, x| x.bytes >= c.direct_min_bytes),
    row(Reduce, Staged, always),
    // send_recv, send and recv: the point-to-point engine, always (one path, so that any send
    // pairs with any receive, whatever call made each, and a count mismatch is always found).
    row(SendRecv, P2p, always),
    one_way(P2p, always),
];

/// Whether `a` serves `call`'s ranks, type and operator (and point-to-point calls, for
/// `send_recv` / `send` / `recv`), and, unless `registered`, needs no callers' buffers.
fn fits(a: Algorithm, call: &Lowered, registered: bool) -> bool {
    let u = a.unit();
    (registered || !u.registered)
        && (call.collective != SendRecv || u.point_to_point)
        && (u.serves_ranks)(call.ranks).is_ok()
        && (u.serves_nodes)(call.nodes, call.uniform).is_ok()
        && (u.serves_data)(call.dtype, call.op).is_ok()
}

/// What `call` takes: `forced` if that algorithm serves it (else `Err` with what it cannot
/// do), or the algorithm of the first row that holds, among the algorithms that need no
/// callers' buffers unless `registered`. Only algorithms `usable` says can run now are taken
/// (under CUDA-graph capture: those that neither allocate nor wait on the host; on buffers
/// registered ahead: those that take them).
pub(crate) fn choose(
    cfg: &CollectiveConfig,
    call: &Lowered,
    forced: Option<Algorithm>,
    registered: bool,
    usable: &dyn Fn(Algorithm) -> bool,
) -> Result<Algorithm, &'static str> {
    if let Some(a) = forced {
        let u = a.unit();
        if call.collective == SendRecv || !u.serves.contains(&call.collective) {
            return Err(u.not_served);
        }
        (u.serves_ranks)(call.ranks)?;
        (u.serves_nodes)(call.nodes, call.uniform)?;
        (u.serves_data)(call.dtype, call.op)?;
        if !usable(a) {
            return Err(UNUSABLE_IN_CAPTURE);
        }
        return Ok(a);
    }
    TABLE
        .iter()
        .filter(|r| r.collective == call.collective && r.one_way == call.one_way)
        .filter(|r| fits(r.algorithm, call, registered) && usable(r.algorithm))
        .find(|r| (r.when)(cfg, call))
        .map(|r| r.algorithm)
        .ok_or(if usable(Staged) {
            "a call no algorithm serves"
        } else {
            UNUSABLE_IN_CAPTURE
        })
}

/// What a call is refused as when the algorithm it needs cannot take it now: under CUDA-graph
/// capture, an algorithm that would allocate or exchange buffers with the peers on the host;
/// on registered buffers, the copy engines unless the outputs are windows.
pub(crate) const UNUSABLE_IN_CAPTURE: &str = "this algorithm on this call now (under CUDA-graph \
     capture nothing that allocates or exchanges buffers with the peers: run one call eagerly \
     or Collectives::prepare before capturing, or register the buffers; on registered \
     buffers the copy engines need windows, for all-gather and broadcast)";

#[cfg(test)]
mod tests {
    use super::TABLE;

    /// Every row's algorithm serves its collective (forced), or, for the point-to-point rows,
    /// says it may be picked there; and every collective ends with a row that always holds.
    #[test]
    fn rows_name_algorithms_that_serve_them() {
        for r in TABLE {
            let (a, u) = (r.algorithm, r.algorithm.unit());
            if r.collective == super::SendRecv {
                assert!(u.point_to_point, "{a:?} in a send/recv row");
            } else {
                assert!(u.serves.contains(&r.collective), "{a:?} {:?}", r.collective);
            }
        }
        let cfg = crate::collectives::config::CollectiveConfig::for_backend(
            mscclpp_host::gpu::BackendKind::Cuda,
        );
        for (c, one_way) in [
            (super::AllReduce, false),
            (super::AllGather, false),
            (super::ReduceScatter, false),
            (super::Broadcast, false),
            (super::AllToAll, false),
            (super::Reduce, false),
            (super::SendRecv, false),
            (super::SendRecv, true),
        ] {
            let last = TABLE
                .iter()
                .rfind(|r| r.collective == c && r.one_way == one_way);
            let Some(last) = last else {
                panic!("{c:?} ({one_way}) has no rows");
            };
            let a = last.algorithm;
            let ok = a == super::Algorithm::Staged || (c == super::SendRecv && a == super::P2p);
            assert!(ok, "{c:?} ({one_way}) ends with {a:?}");
            for bytes in [1, 1 << 10, 1 << 20, 1 << 30] {
                for ranks in [1, 2, 8, 64] {
                    let call = super::Lowered {
                        collective: c,
                        one_way,
                        bytes,
                        ranks,
                        nodes: 1,
                        uniform: true,
                        dtype: mscclpp_shared::DataType::F32,
                        op: crate::collectives::reduction::KernelOp::from(
                            mscclpp_shared::ReduceOp::Sum,
                        ),
                    };
                    assert!(
                        (last.when)(&cfg, &call),
                        "{c:?} ({one_way}) {bytes} {ranks}"
                    );
                }
            }
        }
    }
}
