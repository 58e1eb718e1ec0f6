//! Property test of the plan parser and verifier (pure host code, no device): valid plans (the
//! repository's, at several rank counts, and MSCCL++'s conformance plans where present) with
//! random mutations of their JSON (numbers changed, keys dropped, types swapped, entries
//! duplicated, dropped or swapped, op names changed) must parse and verify to a plan or a
//! typed error, never a panic or a hang; both outcomes must happen (the mutations reach the
//! checks, and the checks let valid plans through); a plan that verifies must also verify
//! after a round trip through its JSON. A deterministic generator keeps failures
//! reproducible; the failing input is printed. `fuzz/fuzz_targets/execution_plan.rs` runs the
//! same property coverage-guided, apart from CI.

use mscclpp::host::error::PlanError;
use std::time::{Duration, Instant};

use mscclpp::executor::plan::{OpKind, PlanDoc, ReduceKind};
use mscclpp::executor::{ExecutionPlan, Races, plans};
use mscclpp::host::Error;
use mscclpp_test_support::{Rng, package_dir};
use serde_json::{Value, json};

/// Every node of `v` as a path of keys / indexes.
fn paths(v: &Value, at: &mut Vec<PathStep>, out: &mut Vec<Vec<PathStep>>) {
    out.push(at.clone());
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                at.push(PathStep::Key(k.clone()));
                paths(x, at, out);
                at.pop();
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                at.push(PathStep::Index(i));
                paths(x, at, out);
                at.pop();
            }
        }
        _ => {}
    }
}

#[derive(Clone, Debug)]
enum PathStep {
    Key(String),
    Index(usize),
}

fn node<'a>(v: &'a mut Value, path: &[PathStep]) -> &'a mut Value {
    let mut cur = v;
    for s in path {
        cur = match s {
            PathStep::Key(k) => &mut cur[k.as_str()],
            PathStep::Index(i) => &mut cur[*i],
        };
    }
    cur
}

/// One random change somewhere in `v`.
fn mutate(rng: &mut Rng, v: &mut Value) {
    let mut all = Vec::new();
    paths(v, &mut Vec::new(), &mut all);
    let path = all[rng.below(all.len())].clone();
    let numbers = [
        0u64,
        1,
        2,
        3,
        7,
        15,
        16,
        17,
        64,
        1023,
        1 << 20,
        u32::MAX as u64,
        1 << 40,
        u64::MAX,
    ];
    let names: Vec<&str> = OpKind::ALL.iter().map(|k| k.name()).collect();
    let n = node(v, &path);
    match rng.below(9) {
        0 => *n = json!(numbers[rng.below(numbers.len())]),
        1 => *n = json!(-(rng.below(5) as i64) - 1),
        2 => {
            *n = [
                json!(null),
                json!("x"),
                json!([]),
                json!({}),
                json!(true),
                json!(1.5),
            ][rng.below(6)]
            .clone()
        }
        3 => {
            if let Value::Object(m) = n
                && !m.is_empty()
            {
                let k = m
                    .keys()
                    .nth(rng.below(m.len()))
                    .cloned()
                    .unwrap_or_default();
                m.remove(&k);
            }
        }
        4 => {
            if let Value::Array(a) = n
                && !a.is_empty()
            {
                let i = rng.below(a.len());
                let x = a[i].clone();
                a.insert(rng.below(a.len() + 1), x);
            }
        }
        5 => {
            if let Value::Array(a) = n
                && !a.is_empty()
            {
                a.remove(rng.below(a.len()));
            }
        }
        6 => {
            if let Value::Array(a) = n
                && a.len() > 1
            {
                let (i, j) = (rng.below(a.len()), rng.below(a.len()));
                a.swap(i, j);
            }
        }
        7 => {
            if let Value::Object(m) = n
                && m.contains_key("name")
            {
                m.insert("name".into(), json!(names[rng.below(names.len())]));
            }
        }
        _ => {
            if let Some(x) = n.as_u64() {
                *n = json!(x.wrapping_add(1 + rng.below(3) as u64));
            } else if let Some(x) = n.as_u64().or(Some(0)).filter(|_| n.is_number()) {
                *n = json!(x);
            }
        }
    }
}

/// Parses and verifies `text` as the executor's load does.
fn load(text: &str) -> mscclpp::host::Result<ExecutionPlan> {
    let doc = PlanDoc::parse(text, "mutant")?;
    let plan = ExecutionPlan::from_doc(doc, Races::Refuse)?;
    // What verified once verifies again from its own JSON.
    let again = PlanDoc::parse(&plan.doc().to_json().to_string(), "again")?;
    assert_eq!(&again, plan.doc(), "round trip");
    Ok(plan)
}

fn seeds() -> Vec<Value> {
    let mut out = Vec::new();
    for n in [2, 3, 5] {
        for doc in plans::all(n, 64) {
            out.push(doc.to_json());
        }
        out.push(plans::allreduce_read(n, ReduceKind::Max).to_json());
    }
    let dir = package_dir(env!("CARGO_MANIFEST_DIR")).join("../shared/mscclpp-plans");
    if let Ok(rd) = std::fs::read_dir(&dir) {
        for e in rd.flatten() {
            if e.path().extension().is_some_and(|x| x == "json")
                && let Ok(t) = std::fs::read_to_string(e.path())
                && let Ok(v) = serde_json::from_str(&t)
            {
                out.push(v);
            }
        }
    }
    out
}

const ROUNDS: usize = 2500;
const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn mutated_plans_load_or_give_typed_errors() {
    let mut rng = Rng(0x005e_ed0f_9a11);
    let seeds = seeds();
    for s in &seeds {
        let nvls = s.to_string().contains("\"switch\"");
        match load(&s.to_string()) {
            Ok(_) => assert!(!nvls),
            Err(Error::Plan(PlanError::Unsupported { .. })) if nvls => {}
            Err(e) => panic!("a seed plan must load: {e}"),
        }
    }
    let (mut accepted, mut refused) = (0usize, 0usize);
    let start = Instant::now();
    let mut rounds = 0;
    while rounds < ROUNDS && start.elapsed() < LIMIT {
        rounds += 1;
        let mut v = seeds[rng.below(seeds.len())].clone();
        for _ in 0..1 + rng.below(3) {
            mutate(&mut rng, &mut v);
        }
        let text = v.to_string();
        let t = Instant::now();
        let r = std::panic::catch_unwind(|| load(&text));
        match r {
            Ok(Ok(_)) => accepted += 1,
            Ok(Err(
                Error::Plan(PlanError::Malformed { .. })
                | Error::Plan(PlanError::Unsupported { .. })
                | Error::Plan(PlanError::Refused { .. })
                | Error::Plan(PlanError::Call { .. }),
            )) => refused += 1,
            Ok(Err(e)) => panic!("an untyped error {e:?} for:\n{text}"),
            Err(_) => panic!("a panic for:\n{text}"),
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "one plan took {:?}:\n{text}",
            t.elapsed()
        );
    }
    println!("{rounds} mutants: {accepted} loaded, {refused} refused with a typed error");
    assert!(rounds >= 300, "only {rounds} mutants in {LIMIT:?}");
    assert!(
        accepted > 0 && refused > 0,
        "{accepted} loaded, {refused} refused"
    );
}

#[test]
fn arbitrary_bytes_give_typed_errors() {
    let mut rng = Rng(0xb17e5);
    for _ in 0..2000 {
        let len = rng.below(200);
        let bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        let text = String::from_utf8_lossy(&bytes);
        match PlanDoc::parse(&text, "bytes") {
            Err(Error::Plan(PlanError::Malformed { .. })) => {}
            other => panic!("{other:?} for {text:?}"),
        }
    }
}
