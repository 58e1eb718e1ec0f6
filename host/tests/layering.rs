//! The host crate's modules import one way: each top-level module of `host/src` may use only
//! modules of lower layers ([`LAYERS`], the table in `host/src/lib.rs`'s docs). This test reads
//! every source file, finds every path that leaves its top-level module (`crate::…`, and a
//! `super::…` chain that climbs to the crate root), and fails on an import of the same or a
//! higher layer — so an import cycle, or a module that grows an upward dependency, is caught in
//! CI with the file and the path that did it.
//!
//! Test code counts too: a test that needs an upper module belongs in `host/tests`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

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

/// One path that leaves its top-level module.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Import {
    /// The file it is in (relative to `src`).
    file: String,
    /// 1-based line.
    line: usize,
    /// The importing top-level module.
    from: String,
    /// The imported top-level module (or a root item not known to be a module).
    to: String,
}

/// `src` with comments, string and character literals blanked out (newlines kept), so that
/// braces and paths inside them are not seen.
fn strip(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let blank = |ch: char| if ch == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < c.len() {
        let rest = |k: usize| c.get(i + k).copied();
        if c[i] == '/' && rest(1) == Some('/') {
            while i < c.len() && c[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c[i] == '/' && rest(1) == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
        } else if c[i] == 'r'
            && (rest(1) == Some('"') || rest(1) == Some('#'))
            && (i == 0 || !(c[i - 1].is_alphanumeric() || c[i - 1] == '_'))
        {
            // Raw string: r"…", r#"…"#, …
            let mut j = i + 1;
            let mut hashes = 0;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= c.len() {
                    break;
                }
                if c[j] == '"' && (0..hashes).all(|h| c.get(j + 1 + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            for &ch in &c[i..j.min(c.len())] {
                out.push(blank(ch));
            }
            i = j;
        } else if c[i] == '"' {
            out.push(' ');
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < c.len() {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c[i] == '\'' {
            // A character literal ('x', '\n', '\u{…}'), or else a lifetime.
            let end = if rest(1) == Some('\\') {
                (i + 3..c.len().min(i + 13)).find(|&k| c[k] == '\'')
            } else if rest(2) == Some('\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(e) => {
                    for _ in i..=e {
                        out.push(' ');
                    }
                    i = e + 1;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// The top-level module and the module depth of a file under `src` (`a.rs`, `a/mod.rs`: 1;
/// `a/b.rs`, `a/b/mod.rs`: 2; …).
fn module_of(rel: &str) -> (String, usize) {
    let parts: Vec<&str> = rel.split('/').collect();
    let top = parts[0].trim_end_matches(".rs").to_string();
    let depth = if parts.last() == Some(&"mod.rs") {
        parts.len() - 1
    } else {
        parts.len()
    };
    (top, depth)
}

fn is_ident(ch: char) -> bool {
    ch.is_alphanumeric() || ch == '_'
}

/// The names of the top-level items a path group `{a::X, b, c::{…}}` starts with, given the
/// text right after its `{`; also returns how many bytes the group spans.
fn group_heads(s: &str) -> (Vec<String>, usize) {
    let mut heads = Vec::new();
    let (mut depth, mut at_item) = (1, true);
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() && depth > 0 {
        let ch = b[i] as char;
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 1 => at_item = true,
            _ if at_item && depth == 1 && is_ident(ch) => {
                let end = s[i..]
                    .find(|c: char| !is_ident(c))
                    .map_or(s.len(), |e| i + e);
                heads.push(s[i..end].to_string());
                at_item = false;
                i = end;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    (heads, i)
}

/// Every path of one file that leaves its top-level module.
fn imports_of(rel: &str, src: &str) -> Vec<Import> {
    let (from, file_depth) = module_of(rel);
    let code = strip(src);
    let line_of = |pos: usize| code[..pos].matches('\n').count() + 1;
    // Inline `mod name {` blocks add to the depth a `super::` chain must climb.
    let mut inline: Vec<usize> = Vec::new(); // brace depth at each open inline module
    let mut braces = 0usize;
    let mut out = Vec::new();
    let mut push = |to: String, pos: usize| {
        if to != from && to != "self" {
            out.push(Import {
                file: rel.to_string(),
                line: line_of(pos),
                from: from.clone(),
                to,
            });
        }
    };
    let b = code.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let boundary = i == 0 || !is_ident(b[i - 1] as char);
        let word_end = code[i..]
            .find(|c: char| !is_ident(c))
            .map_or(code.len(), |e| i + e);
        let word = if boundary { &code[i..word_end] } else { "" };
        match (b[i] as char, word) {
            ('{', _) => {
                braces += 1;
                i += 1;
            }
            ('}', _) => {
                braces = braces.saturating_sub(1);
                if inline.last() == Some(&braces) {
                    inline.pop();
                }
                i += 1;
            }
            (_, "mod") => {
                let after = code[word_end..].trim_start();
                let name_len = after.find(|c: char| !is_ident(c)).unwrap_or(after.len());
                if after[name_len..].trim_start().starts_with('{') {
                    inline.push(braces);
                }
                i = word_end;
            }
            (_, "crate" | "super") => {
                // Count the chain `super::super::…` (or the one `crate::`).
                let mut j = i;
                let mut climbs = 0;
                let mut root = false;
                loop {
                    let w_end = code[j..]
                        .find(|c: char| !is_ident(c))
                        .map_or(code.len(), |e| j + e);
                    let w = &code[j..w_end];
                    let after = code[w_end..].trim_start();
                    if !after.starts_with("::") || (w != "super" && w != "crate") {
                        break;
                    }
                    if w == "crate" {
                        root = true;
                    } else {
                        climbs += 1;
                    }
                    j = code.len() - after.len() + 2;
                    j += code[j..].len() - code[j..].trim_start().len();
                    if root {
                        break;
                    }
                }
                if climbs >= file_depth + inline.len() {
                    root = true;
                }
                if root && j < code.len() {
                    if code[j..].starts_with('{') {
                        let (heads, _) = group_heads(&code[j + 1..]);
                        for h in heads {
                            push(h, i);
                        }
                    } else {
                        let end = code[j..]
                            .find(|c: char| !is_ident(c))
                            .map_or(code.len(), |e| j + e);
                        // `crate::name!(…)` invokes a macro exported at the crate root
                        // (`#[macro_export]`): no module is imported.
                        if !code[end..].starts_with('!') {
                            push(code[j..end].to_string(), i);
                        }
                    }
                }
                i = word_end.max(i + 1);
            }
            _ => i = if word.is_empty() { i + 1 } else { word_end },
        }
    }
    out
}

/// The layer of each module.
fn layer_index(layers: &[&[&str]]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for (i, layer) in layers.iter().enumerate() {
        for &name in *layer {
            assert!(
                m.insert(name.to_string(), i).is_none(),
                "{name} is in two layers"
            );
        }
    }
    m
}

/// Every import that breaks the layering, as a readable line.
fn violations(files: &[(String, String)], layers: &[&[&str]]) -> Vec<String> {
    let layer = layer_index(layers);
    let mut bad = Vec::new();
    for (rel, src) in files {
        for mut imp in imports_of(rel, src) {
            if let Some((_, m)) = ROOT_REEXPORTS.iter().find(|(item, _)| *item == imp.to) {
                imp.to = m.to_string();
            }
            let (Some(&lf), Some(&lt)) = (layer.get(&imp.from), layer.get(&imp.to)) else {
                bad.push(format!(
                    "{}:{}: `{}` imports `{}`, which is not in the layer table",
                    imp.file, imp.line, imp.from, imp.to
                ));
                continue;
            };
            if lt >= lf && imp.to != imp.from {
                bad.push(format!(
                    "{}:{}: `{}` (layer {lf}) imports `{}` (layer {lt}): imports must point to lower layers",
                    imp.file, imp.line, imp.from, imp.to
                ));
            }
        }
    }
    bad
}

fn read_tree(dir: &Path, base: &Path, out: &mut Vec<(String, String)>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            read_tree(&p, base, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            let rel = p.strip_prefix(base).unwrap().to_string_lossy().into_owned();
            out.push((rel, std::fs::read_to_string(&p).unwrap()));
        }
    }
}

/// The top-level modules `lib.rs` declares.
fn declared_modules(lib: &str) -> BTreeSet<String> {
    strip(lib)
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let l = l.strip_prefix("pub ").unwrap_or(l);
            let name = l.strip_prefix("mod ")?.strip_suffix(';')?;
            Some(name.trim().to_string())
        })
        .collect()
}

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
