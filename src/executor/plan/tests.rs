//! The parser: MSCCL++'s conformance plans, a round trip through `to_json`, and one malformed
//! plan per check, each refused with the field it names.

use mscclpp_host::error::PlanError;
use std::path::PathBuf;

use mscclpp_host::Error;
use serde_json::{Value, json};

use super::*;

/// `../shared/mscclpp-plans/` beside the checkout (CI has it; a user's clone may not), found
/// from the package's directory at run time (`cargo test`'s, or the GPU bundle's copy).
pub(crate) fn conformance_dir() -> Option<PathBuf> {
    let d = mscclpp_test_support::package_dir(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/mscclpp-plans");
    d.is_dir().then_some(d)
}

/// The six plans that run, and the two that are refused (NVLink multicast).
pub(crate) const RUNNABLE: [&str; 6] = [
    "reduce.json",
    "reduce_tbg.json",
    "reduce_pack.json",
    "reduce_pack_tbg.json",
    "transfer_pack.json",
    "transfer_pack_tbg.json",
];
pub(crate) const NVLS: [&str; 2] = ["reduce_nvls.json", "reduce_nvls_pipeline.json"];

/// A small valid plan: two ranks, one block each, every rank copies its input chunk 0 to its
/// output, puts it into the peer's output chunk 1 and signals; then waits.
fn small() -> Value {
    let gpu = |r: usize| {
        json!({
            "id": r, "input_chunks": 1, "output_chunks": 2, "scratch_chunks": 1,
            "threadblocks": [{
                "id": 0,
                "ops": [
                    {"name": "copy", "src_buff": [{"type": "i", "index": 0, "size": 1}],
                     "dst_buff": [{"type": "o", "index": r, "size": 1}]},
                    {"name": "nop"},
                    {"name": "put", "src_buff": [{"type": "i", "index": 0, "size": 1}],
                     "dst_buff": [{"buffer_id": 0, "index": r, "size": 1}],
                     "channel_type": "memory"},
                    {"name": "signal", "channel_ids": [0], "channel_type": "memory"},
                    {"name": "wait", "channel_ids": [0], "channel_type": "memory"},
                ],
                "channels": [{"channel_type": "memory", "channel_ids": [0]}],
                "remote_buffer_refs": [{"access_channel_type": "memory", "remote_buffer_ids": [0]}],
            }],
            "channels": [{"channel_type": "memory", "connected_to": [1 - r]}],
            "remote_buffers": [{"rank": 1 - r, "type": "o", "access_channel_types": ["memory"]}],
            "semaphores": [],
        })
    };
    json!({
        "name": "small", "collective": "allgather", "protocol": "Simple", "inplace": false,
        "gpus": [gpu(0), gpu(1)],
        "num_threads_per_block": 256, "buffer_alignment": 16,
    })
}

fn parse(v: &Value) -> Result<PlanDoc> {
    PlanDoc::parse(&v.to_string(), "test")
}

/// Parses `v` after `edit`, expecting a malformed-plan error at `field` whose message contains
/// `says`.
#[track_caller]
fn refused(edit: impl FnOnce(&mut Value), field: &str, says: &str) {
    let mut v = small();
    edit(&mut v);
    match parse(&v) {
        Err(Error::Plan(PlanError::Malformed {
            field: f, problem, ..
        })) => {
            assert_eq!(f, field, "{problem}");
            assert!(
                problem.contains(says),
                "{field}: {problem:?} lacks {says:?}"
            );
        }
        other => panic!("{field}: expected a malformed-plan error, got {other:?}"),
    }
}

fn op0(v: &mut Value) -> &mut Value {
    &mut v["gpus"][0]["threadblocks"][0]["ops"]
}

#[test]
fn the_small_plan_parses() {
    let p = parse(&small()).unwrap();
    assert_eq!(p.gpus.len(), 2);
    assert_eq!(p.num_threads_per_block, 256);
    assert_eq!(p.max_message_size, u64::MAX, "default");
    assert_eq!(p.gpus[1].threadblocks[0].ops[2].kind, OpKind::Put);
    assert_eq!(
        p.gpus[1].threadblocks[0].ops[2].dst[0],
        Slice {
            target: Target::Remote(0),
            index: 1,
            size: 1
        }
    );
}

#[test]
fn conformance_plans_parse_and_round_trip() {
    let Some(dir) = conformance_dir() else {
        println!("NOT RUN: ../shared/mscclpp-plans is absent (MSCCL++'s conformance plans)");
        return;
    };
    for f in RUNNABLE {
        let text = std::fs::read_to_string(dir.join(f)).unwrap();
        let p = PlanDoc::parse(&text, f).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert_eq!(p.gpus.len(), 2, "{f}");
        let again = PlanDoc::parse(&p.to_json().to_string(), f).unwrap();
        assert_eq!(again, p, "{f} round trip");
        // And the JSON we write is MSCCL++'s, key for key, where the file spells them all.
        let orig: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            orig["gpus"][0]["threadblocks"][0]["ops"][0],
            p.to_json()["gpus"][0]["threadblocks"][0]["ops"][0],
            "{f}"
        );
    }
    for f in NVLS {
        let text = std::fs::read_to_string(dir.join(f)).unwrap();
        match PlanDoc::parse(&text, f) {
            Err(Error::Plan(PlanError::Unsupported { field, what, .. })) => {
                assert!(what.contains("multicast"), "{f}: {what}");
                assert!(field.starts_with("gpus[0]"), "{f}: {field}");
            }
            other => panic!("{f}: expected PlanUnsupported, got {other:?}"),
        }
    }
}

#[test]
fn bad_json_names_line_and_column() {
    match PlanDoc::parse("{\"name\": \"x\",\n  \"gpus\": [}", "f.json") {
        Err(Error::Plan(PlanError::Malformed { plan, field, .. })) => {
            assert_eq!(plan, "f.json");
            assert!(field.starts_with("JSON at line 2, column"), "{field}");
        }
        other => panic!("{other:?}"),
    }
    refused(|v| *v = json!([1]), "(the plan)", "expected an object");
}

#[test]
fn every_malformed_field_is_named() {
    refused(
        |v| op0(v)[0]["name"] = json!("teleport"),
        "gpus[0].threadblocks[0].ops[0].name",
        "not an op",
    );
    refused(
        |v| {
            op0(v)[0].as_object_mut().unwrap().remove("name");
        },
        "gpus[0].threadblocks[0].ops[0].name",
        "missing",
    );
    refused(
        |v| v["gpus"][1]["id"] = json!(0),
        "gpus[1].id",
        "must equal positions",
    );
    refused(
        |v| v["gpus"][0]["threadblocks"][0]["id"] = json!(3),
        "gpus[0].threadblocks[0].id",
        "must equal positions",
    );
    refused(
        |v| op0(v)[0]["src_buff"][0]["index"] = json!(1),
        "gpus[0].threadblocks[0].ops[0].src_buff[0]",
        "which has 1",
    );
    refused(
        |v| op0(v)[0]["src_buff"][0]["index"] = json!("zero"),
        "gpus[0].threadblocks[0].ops[0].src_buff[0].index",
        "invalid type",
    );
    refused(
        |v| op0(v)[0]["src_buff"][0]["size"] = json!(0),
        "gpus[0].threadblocks[0].ops[0].src_buff[0].size",
        "0 chunks",
    );
    refused(
        |v| op0(v)[2]["dst_buff"][0]["buffer_id"] = json!(1),
        "gpus[0].threadblocks[0].ops[2].dst_buff[0].buffer_id",
        "out of range",
    );
    refused(
        |v| op0(v)[3]["channel_ids"] = json!([1]),
        "gpus[0].threadblocks[0].ops[3].channel_ids[0]",
        "out of range",
    );
    refused(
        |v| v["gpus"][0]["threadblocks"][0]["channels"][0]["channel_ids"] = json!([2]),
        "gpus[0].threadblocks[0].channels[0].channel_ids[0]",
        "out of range",
    );
    refused(
        |v| v["gpus"][0]["channels"][0]["connected_to"] = json!([0]),
        "gpus[0].channels[0].connected_to[0]",
        "to itself",
    );
    refused(
        |v| v["gpus"][0]["channels"][0]["connected_to"] = json!([2]),
        "gpus[0].channels[0].connected_to[0]",
        "out of range",
    );
    refused(
        |v| v["gpus"][0]["remote_buffers"][0]["rank"] = json!(0),
        "gpus[0].remote_buffers[0].rank",
        "the rank itself",
    );
    refused(
        |v| v["gpus"][0]["remote_buffers"][0]["type"] = json!("x"),
        "gpus[0].remote_buffers[0].type",
        "not a buffer type",
    );
    refused(
        |v| *op0(v) = json!(vec![json!({"name": "nop"}); 65]),
        "gpus[0].threadblocks[0].ops",
        "at most 64",
    );
    refused(
        |v| {
            v["gpus"][0]["channels"][0]["connected_to"] = json!(vec![1; 17]);
            v["gpus"][0]["threadblocks"][0]["channels"][0]["channel_ids"] =
                json!((0..17).collect::<Vec<_>>());
        },
        "gpus[0].threadblocks[0].channels",
        "at most 16",
    );
    refused(
        |v| v["num_threads_per_block"] = json!(2048),
        "num_threads_per_block",
        "1 to 1024",
    );
    refused(
        |v| v["buffer_alignment"] = json!(8),
        "buffer_alignment",
        "multiple of 16",
    );
    refused(
        |v| v["protocol"] = json!("LL128"),
        "protocol",
        "not a protocol",
    );
    refused(
        |v| v["gpus"][0]["input_chunks"] = json!(0),
        "gpus[0].input_chunks",
        "0 chunks",
    );
    refused(
        |v| op0(v)[0]["tbg_info"] = json!({"tb_id": 2, "tbg_size": 2}),
        "gpus[0].threadblocks[0].ops[0].tbg_info",
        "share 2 of 2",
    );
    refused(
        |v| op0(v)[2]["channel_type"] = json!("none"),
        "gpus[0].threadblocks[0].ops[2].channel_type",
        "to reach a peer",
    );
    refused(
        |v| op0(v)[0]["name"] = json!("upkt"),
        "gpus[0].threadblocks[0].ops[0].name",
        "Simple plan",
    );
    refused(
        |v| {
            op0(v)[0]["dst_buff"][0] = json!({"buffer_id": 0, "index": 0, "size": 1});
            op0(v)[0]["channel_type"] = json!("memory");
        },
        "gpus[0].threadblocks[0].ops[0].dst_buff[0]",
        "takes a local one",
    );
    refused(
        |v| op0(v)[3]["src_buff"] = json!([{"type": "i", "index": 0, "size": 1}]),
        "gpus[0].threadblocks[0].ops[3].src_buff",
        "takes no buffers",
    );
    refused(
        |v| {
            op0(v)[2]["dst_buff"][0]["index"] = json!(1);
            op0(v)[2]["dst_buff"][0]["size"] = json!(2);
        },
        "gpus[0].threadblocks[0].ops[2].dst_buff[0]",
        "which has 2",
    );
    refused(
        |v| op0(v)[2]["dst_buff"][0]["size"] = json!(2),
        "gpus[0].threadblocks[0].ops[2].dst_buff[0].size",
        "spans the same number",
    );
    refused(
        |v| op0(v)[0]["reduce_op"] = json!("sum"),
        "gpus[0].threadblocks[0].ops[0].reduce_op",
        "does not reduce",
    );
    refused(
        |v| op0(v)[0] = json!({"name": "barrier", "barrier_id": 0, "num_threadblocks": 2}),
        "gpus[0].threadblocks[0].ops[0].num_threadblocks",
        "the rank has 1",
    );
    refused(
        |v| op0(v)[0] = json!({"name": "sem_release", "semaphore_ids": [0]}),
        "gpus[0].threadblocks[0].ops[0].semaphore_ids[0]",
        "out of range",
    );
    refused(
        |v| {
            op0(v)[0] = json!({"name": "pipeline", "iter_context": {"unit_size": 1000, "num_chunks": 1},
                               "ops": [{"name": "nop"}]})
        },
        "gpus[0].threadblocks[0].ops[0].iter_context.unit_size",
        "multiple of 16",
    );
    refused(
        |v| {
            op0(v)[0] = json!({"name": "pipeline", "iter_context": {"unit_size": 1024, "num_chunks": 1},
                               "ops": [{"name": "pipeline"}]})
        },
        "gpus[0].threadblocks[0].ops[0].ops[0].name",
        "inside a pipeline",
    );
    refused(
        |v| {
            let copy = op0(v)[0].clone();
            v["gpus"][0]["input_chunks"] = json!(2);
            let mut inner = copy;
            inner["src_buff"][0]["size"] = json!(2);
            inner["dst_buff"][0]["size"] = json!(2);
            inner["dst_buff"][0]["index"] = json!(0);
            op0(v)[0] = json!({"name": "pipeline", "iter_context": {"unit_size": 1024, "num_chunks": 1},
                               "ops": [inner]});
        },
        "gpus[0].threadblocks[0].ops[0].ops[0].src_buff[0].size",
        "in a pipeline over 1",
    );
}

#[test]
fn switch_channels_are_unsupported() {
    let mut v = small();
    v["gpus"][0]["channels"]
        .as_array_mut()
        .unwrap()
        .push(json!({"channel_type": "switch", "buffer_type": "i",
                     "rank_groups": [{"size": 2, "ranks": [0, 1]}]}));
    match parse(&v) {
        Err(Error::Plan(PlanError::Unsupported { field, what, .. })) => {
            assert_eq!(field, "gpus[0].channels[1]");
            assert!(what.contains("multicast"), "{what}");
        }
        other => panic!("{other:?}"),
    }
    let mut v = small();
    op0(&mut v)[0]["name"] = json!("glres");
    assert!(matches!(
        parse(&v),
        Err(Error::Plan(PlanError::Unsupported { field, .. })) if field == "gpus[0].threadblocks[0].ops[0].name"
    ));
}

#[test]
fn every_op_name_is_known_both_ways() {
    for k in OpKind::ALL {
        assert_eq!(OpKind::from_name(k.name()), Some(*k));
    }
    assert_eq!(OpKind::ALL.len(), 29, "MSCCL++'s parser knows 29 op names");
}
