//! The host crate's modules import one way: each top-level module of `host/src` may use only
//! modules of lower layers ([`LAYERS`], the table in `host/src/lib.rs`'s docs). This test reads
//! every source file, finds every path that leaves its top-level module (`crate::…`, and a
//! `super::…` chain that climbs to the crate root), and fails on an import of the same or a
//! higher layer — so an import cycle, or a module that grows an upward dependency, is caught in
//! CI with the file and the path that did it. The scanner and the check are in `layers/`,
//! shared with the root crate's `tests/import_layers.rs` (which checks `src/`, `src/collectives/`
//! and `nccl/src/`).
//!
//! Test code counts too: a test that needs an upper module belongs in `host/tests`.

mod layers;

use std::collections::BTreeSet;

use layers::{Layers, declared_modules, imports_of, read_tree};

/// The layers of `host/src`, lowest first. A module may import modules of lower layers only.
const LAYERS: &[&[&str]] = &[
    // Leaves: no crate imports at all.
    &["backend", "backoff", "codec", "random", "socket", "sync"],
    &["auth", "transport"],
    // The error type names only plain values of the layers below.
    &["error"],
    &["gpu", "numa"],
    &["bootstrap", "status"],
    &["fifo", "health", "registered_memory", "topology", "trace"],
    &["connection", "proxy"],
    &["semaphore"],
    &["memory_channel", "port_channel"],
    &["communicator"],
];

/// Items of the crate root that are re-exports, and the module they come from.
const ROOT_REEXPORTS: &[(&str, &str)] = &[("Error", "error"), ("Result", "error")];

#[test]
fn host_modules_import_only_lower_layers() {
    // The run-time package directory: the GPU bundle runs from a copy of the repository.
    let src = mscclpp_test_support::package_dir(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    read_tree(&src, &src, &mut files);
    let lib = files
        .iter()
        .find(|(rel, _)| rel == "lib.rs")
        .map(|(_, s)| s.clone())
        .unwrap();
    files.retain(|(rel, _)| rel != "lib.rs");
    let declared = declared_modules(&lib);
    let placed: BTreeSet<String> = LAYERS
        .iter()
        .flat_map(|l| l.iter().map(|s| s.to_string()))
        .collect();
    assert_eq!(
        declared, placed,
        "every module lib.rs declares must be placed in exactly one layer of LAYERS"
    );
    let found: usize = files.iter().map(|(r, s)| imports_of(r, s).len()).sum();
    assert!(
        found > 50,
        "only {found} imports found: the scanner is broken"
    );
    let bad = violations(&files, LAYERS);
    assert!(bad.is_empty(), "layering broken:\n{}", bad.join("\n"));
}

/// The violations of `files` (under `src`) against `layers` over the whole crate.
fn violations(files: &[(String, String)], layers: &[&[&str]]) -> Vec<String> {
    Layers {
        scope: &[],
        layers: layers
            .iter()
            .map(|l| l.iter().map(|s| s.to_string()).collect())
            .collect(),
        reexports: ROOT_REEXPORTS,
    }
    .violations(files)
}

#[test]
fn the_checker_sees_cycles_groups_and_climbing_super_paths() {
    let files = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    };
    let layers: &[&[&str]] = &[&["low"], &["mid"], &["high"]];
    // Downward imports, in every form, pass; so do paths in comments and strings.
    let ok = files(&[
        (
            "mid.rs",
            "use crate::low::X;\nfn f() { crate::low::g(); crate::high_macro!(); }",
        ),
        (
            "high/mod.rs",
            "use crate::{low::A, mid::{B, C}};\nuse self::inner::x; // crate::high\n",
        ),
        (
            "high/inner.rs",
            "use super::Y;\nmod tests { use super::super::Z; }\nfn s() { \"crate::high\"; }",
        ),
    ]);
    assert_eq!(violations(&ok, layers), Vec::<String>::new());
    // An upward import is found in each form: a plain path, a group, a climbing `super`.
    for (name, src) in [
        ("low.rs", "use crate::mid::X;"),
        ("low.rs", "use crate::{low::Z, mid::{a, b}};"),
        ("low.rs", "fn f() { let _ = super::high::g(); }"),
        ("low/a.rs", "fn f() { super::super::mid::g(); }"),
        ("mid.rs", "use crate::mid2::X;"),
    ] {
        let v = violations(&files(&[(name, src)]), layers);
        assert_eq!(v.len(), 1, "{name}: {src:?} gave {v:?}");
    }
    // A cycle: each direction is an upward import for one of the two.
    let cycle = files(&[
        ("low.rs", "use crate::mid::A;"),
        ("mid.rs", "use crate::low::B;"),
    ]);
    assert_eq!(violations(&cycle, layers).len(), 1);
    // Same layer counts as upward (no cycles inside a layer).
    let same: &[&[&str]] = &[&["low", "mid"]];
    let pair = files(&[("low.rs", "use crate::mid::A;")]);
    assert_eq!(violations(&pair, same).len(), 1);
    // Characters and lifetimes do not confuse the scanner.
    let chars = files(&[(
        "mid.rs",
        "fn f<'a>(x: &'a str) -> char { let _ = '{'; let _ = '\\''; crate::low::g(); 'x' }",
    )]);
    assert_eq!(violations(&chars, layers), Vec::<String>::new());
    assert_eq!(imports_of("mid.rs", &chars[0].1).len(), 1);
}
