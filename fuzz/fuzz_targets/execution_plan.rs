//! Fuzz target: the execution-plan parser and verifier (`mscclpp::executor`): any bytes, as
//! JSON text, parse to a plan or a typed error, and a parsed plan verifies (at its canonical
//! sizes, as `ExecutionPlan::load` does) to a plan or a typed error: never a panic or a hang.
//! A plan that loads re-parses from its own JSON to the same plan. Seeds: the repository's
//! plans (`cargo run --example seeds`). `tests/executor_properties.rs` checks the same with
//! random mutations in CI.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mscclpp::executor::plan::PlanDoc;
use mscclpp::executor::{ExecutionPlan, Races};
use mscclpp::host::Error;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let doc = match PlanDoc::parse(text, "fuzz") {
        Ok(d) => d,
        Err(Error::PlanMalformed { .. } | Error::PlanUnsupported { .. }) => return,
        Err(e) => panic!("parse: an untyped error {e:?}"),
    };
    match ExecutionPlan::from_doc(doc, Races::Refuse) {
        Ok(plan) => {
            let again = PlanDoc::parse(&plan.doc().to_json().to_string(), "again")
                .expect("a loaded plan re-parses");
            assert_eq!(&again, plan.doc());
        }
        Err(
            Error::PlanMalformed { .. }
            | Error::PlanUnsupported { .. }
            | Error::PlanRefused { .. }
            | Error::PlanCall { .. },
        ) => {}
        Err(e) => panic!("verify: an untyped error {e:?}"),
    }
});
