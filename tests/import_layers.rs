//! Imports point one way in the root crate and in the drop-in library: every module may use only
//! modules of lower layers, as the tables in their docs say (each written once, there, and read
//! here): the root crate's modules (`src/lib.rs`, "Modules"), the collectives' (`src/collectives/
//! mod.rs`, "Layers": the algorithms are one layer, so no unit imports a sibling), and the
//! drop-in library's (`nccl/src/lib.rs`). The checker is the host crate's
//! (`host/tests/layers/`); test code counts too.

#[path = "../host/tests/layers/mod.rs"]
mod layers;

use std::collections::BTreeSet;
use std::path::Path;

use layers::{Layers, declared_modules, imports_of, layers_from_docs, read_tree};

/// The `.rs` files under `dir` (relative to it), and the text of `dir/root`.
fn tree(dir: &Path, root: &str) -> (Vec<(String, String)>, String) {
    let mut files = Vec::new();
    read_tree(dir, dir, &mut files);
    let text = files
        .iter()
        .find(|(rel, _)| rel == root)
        .map(|(_, s)| s.clone())
        .unwrap_or_else(|| panic!("no {root} in {}", dir.display()));
    (files, text)
}

/// Checks `files` against the table of `docs` over `scope`, after checking that the table
/// places exactly the modules `declared` (`None`: not checked).
fn check(
    what: &str,
    files: &[(String, String)],
    docs: &str,
    scope: &[&str],
    declared: Option<BTreeSet<String>>,
    reexports: &[(&str, &str)],
) {
    let layers = layers_from_docs(docs);
    if let Some(declared) = declared {
        let placed: BTreeSet<String> = layers
            .iter()
            .flatten()
            .filter(|n| !n.contains("::"))
            .cloned()
            .collect();
        assert_eq!(
            declared, placed,
            "{what}: every module declared must be placed in exactly one layer of the table"
        );
    }
    let found: usize = files.iter().map(|(r, s)| imports_of(r, s).len()).sum();
    assert!(
        found > 20,
        "{what}: only {found} imports found: the scanner is broken"
    );
    let bad = Layers {
        scope,
        layers,
        reexports,
    }
    .violations(files);
    assert!(
        bad.is_empty(),
        "{what}: layering broken:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_root_crates_modules_import_only_lower_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (files, lib) = tree(&src, "lib.rs");
    let files: Vec<_> = files
        .into_iter()
        .filter(|(rel, _)| !rel.starts_with("bin/"))
        .collect();
    // `DEVICE_PTX`, defined in `lib.rs` beside the kernels' registry, counts as `kernels`;
    // `ErrorChain` is `report`'s.
    let reexports = [("DEVICE_PTX", "kernels"), ("ErrorChain", "report")];
    check(
        "src",
        &files,
        &lib,
        &[],
        Some(declared_modules(&lib)),
        &reexports,
    );
}

#[test]
fn the_collectives_import_only_lower_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (files, _) = tree(&src, "lib.rs");
    let docs = &files
        .iter()
        .find(|(rel, _)| rel == "collectives/mod.rs")
        .expect("src/collectives/mod.rs")
        .1;
    let units = files
        .iter()
        .find(|(rel, _)| rel == "collectives/algo/mod.rs")
        .expect("src/collectives/algo/mod.rs");
    let mut declared = declared_modules(docs);
    declared.extend(
        declared_modules(&units.1)
            .into_iter()
            .map(|u| format!("algo::{u}")),
    );
    let placed: BTreeSet<String> = layers_from_docs(docs).into_iter().flatten().collect();
    assert_eq!(
        declared, placed,
        "every module of src/collectives (and every unit of algo/) must be in its table"
    );
    check("src/collectives", &files, docs, &["collectives"], None, &[]);
}

#[test]
fn the_drop_in_librarys_modules_import_only_lower_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("nccl/src");
    let (files, lib) = tree(&src, "lib.rs");
    check(
        "nccl/src",
        &files,
        &lib,
        &[],
        Some(declared_modules(&lib)),
        &[],
    );
}

/// The table reader and the scoped check: a module of a subtree may not import its parent's
/// items (they re-export), a sibling in its own layer, or a higher layer; nested components
/// (`algo::ll`) are told apart from their parent (`algo`).
#[test]
fn the_scoped_check_sees_siblings_and_parents() {
    let docs = "//! | layer | modules | what |\n//! |---|---|---|\n\
                //! | 0 | `low` | x |\n//! | 1 | `algo::a`, `algo::b` | y |\n//! | 2 | `algo` | z |\n";
    let layers = layers_from_docs(docs);
    assert_eq!(layers[1], ["algo::a", "algo::b"]);
    let check = |rel: &str, src: &str| {
        Layers {
            scope: &["c"],
            layers: layers.clone(),
            reexports: &[],
        }
        .violations(&[(rel.to_string(), src.to_string())])
    };
    assert!(
        check(
            "c/algo/a.rs",
            "use crate::c::low::X; use super::super::low::Y;"
        )
        .is_empty()
    );
    assert!(check("c/algo/mod.rs", "use self::a::X; fn f() { b::g(); }").is_empty());
    assert!(check("c/algo/mod.rs", "mod tests { use super::super::low::Z; }").is_empty());
    for (rel, src) in [
        ("c/algo/a.rs", "use super::b::X;"),
        ("c/algo/a.rs", "use super::Unit;"),
        ("c/algo/a.rs", "use crate::c::Collectives;"),
        ("c/low.rs", "use crate::c::algo::a::X;"),
        ("c/algo/b/inner.rs", "use super::super::a::X;"),
    ] {
        assert_eq!(check(rel, src).len(), 1, "{rel}: {src}");
    }
}
