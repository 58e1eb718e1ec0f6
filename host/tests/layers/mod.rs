//! The layering checker, shared by the crates' layering tests (`host/tests/layering.rs`, and
//! the root crate's `tests/import_layers.rs` through `#[path]`): a scanner that finds every path of a
//! source tree that names a module of the crate (`crate::…`, `super::…`, `self::…`), resolved to
//! the module path it names, and a check of those paths against a table of layers: within a
//! scope (the crate, or one module's subtree), each component (a module, `a::b` for a nested
//! one, together with everything inside it) may import only components of lower layers.
//!
//! Paths inside comments, strings and character literals are not seen; bare paths (`child::x`,
//! a module's own children) are not checked: they never leave the module.

#![allow(dead_code)] // each test uses part of it

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One path of a file that names a module of the crate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Import {
    /// The file it is in (relative to `src`).
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// The module the path is written in (from the crate root; inline modules included).
    pub from: Vec<String>,
    /// The path it names (from the crate root).
    pub to: Vec<String>,
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

/// The module path of a file under `src` (`lib.rs`: `[]`; `a.rs`, `a/mod.rs`: `[a]`; `a/b.rs`:
/// `[a, b]`; …).
pub fn module_of(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel.split('/').map(str::to_string).collect();
    if let Some(last) = parts.pop() {
        match last.as_str() {
            "mod.rs" | "lib.rs" | "main.rs" => {}
            other => parts.push(other.trim_end_matches(".rs").to_string()),
        }
    }
    parts
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

/// The identifier at the start of `s`, if any.
fn ident_at(s: &str) -> &str {
    &s[..s.find(|c: char| !is_ident(c)).unwrap_or(s.len())]
}

/// Every path of one file that names a module of the crate, resolved (module docs).
pub fn imports_of(rel: &str, src: &str) -> Vec<Import> {
    let file_module = module_of(rel);
    let code = strip(src);
    let line_of = |pos: usize| code[..pos].matches('\n').count() + 1;
    // Inline `mod name {` blocks: (name, brace depth at which it opened).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut braces = 0usize;
    let mut out = Vec::new();
    let b = code.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let boundary = i == 0 || !is_ident(b[i - 1] as char);
        let word = if boundary { ident_at(&code[i..]) } else { "" };
        let word_end = i + word.len();
        match (b[i] as char, word) {
            ('{', _) => {
                braces += 1;
                i += 1;
            }
            ('}', _) => {
                braces = braces.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d == braces) {
                    inline.pop();
                }
                i += 1;
            }
            (_, "mod") => {
                let after = code[word_end..].trim_start();
                let name = ident_at(after);
                if after[name.len()..].trim_start().starts_with('{') {
                    inline.push((name.to_string(), braces));
                }
                i = word_end;
            }
            (_, "crate" | "super" | "self") if code[word_end..].trim_start().starts_with("::") => {
                let mut at: Vec<String> = file_module.clone();
                at.extend(inline.iter().map(|(n, _)| n.clone()));
                // Walk the chain `crate::` / `self::` / `super::super::…`, then the names.
                let mut j = i;
                let mut path: Vec<String> = Vec::new();
                let mut first = true;
                loop {
                    let w = ident_at(&code[j..]);
                    if w.is_empty() {
                        break;
                    }
                    let w_end = j + w.len();
                    match (first, w) {
                        (true, "crate") => at.clear(),
                        (_, "super") if path.is_empty() => {
                            at.pop();
                        }
                        (true, "self") => {}
                        _ => path.push(w.to_string()),
                    }
                    first = false;
                    let after = code[w_end..].trim_start();
                    if !after.starts_with("::") {
                        // `crate::name!(…)` invokes a macro exported at the crate root
                        // (`#[macro_export]`): no module is named.
                        if after.starts_with('!') {
                            path.clear();
                            at = vec!["!".into()];
                        }
                        j = w_end;
                        break;
                    }
                    j = code.len() - after.len() + 2;
                    j += code[j..].len() - code[j..].trim_start().len();
                    if code[j..].starts_with('{') {
                        let (heads, _) = group_heads(&code[j + 1..]);
                        for h in heads {
                            if h == "self" {
                                continue;
                            }
                            let mut to = at.clone();
                            to.extend(path.iter().cloned());
                            to.push(h);
                            out.push(Import {
                                file: rel.to_string(),
                                line: line_of(i),
                                from: file_module.clone(),
                                to,
                            });
                        }
                        path.clear();
                        at = vec!["!".into()];
                        break;
                    }
                }
                if at.first().map(String::as_str) != Some("!") {
                    let mut to = at;
                    to.extend(path);
                    out.push(Import {
                        file: rel.to_string(),
                        line: line_of(i),
                        from: file_module.clone(),
                        to,
                    });
                }
                i = j.max(word_end).max(i + 1);
            }
            _ => i = if word.is_empty() { i + 1 } else { word_end },
        }
    }
    out
}

/// A table of layers over one scope (module docs).
pub struct Layers<'a> {
    /// The scope: a module path from the crate root (`[]`: the whole crate).
    pub scope: &'a [&'a str],
    /// Components, lowest layer first; each name relative to the scope (`a`, or `a::b`).
    pub layers: Vec<Vec<String>>,
    /// Items of the scope's root file that re-export another component's: (item, component).
    pub reexports: &'a [(&'a str, &'a str)],
}

impl Layers<'_> {
    /// The component a path relative to the scope lies in: the longest table name it starts
    /// with.
    fn component(&self, rel: &[String]) -> Option<String> {
        let names: BTreeSet<&str> = self.layers.iter().flatten().map(String::as_str).collect();
        (1..=rel.len())
            .rev()
            .map(|k| rel[..k].join("::"))
            .find(|n| names.contains(n.as_str()))
    }

    fn layer_of(&self) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for (i, layer) in self.layers.iter().enumerate() {
            for name in layer {
                assert!(
                    m.insert(name.clone(), i).is_none(),
                    "{name} is in two layers"
                );
            }
        }
        m
    }

    /// The path relative to the scope, if `p` lies inside it.
    fn inside<'p>(&self, p: &'p [String]) -> Option<&'p [String]> {
        (p.len() >= self.scope.len() && p.iter().zip(self.scope).all(|(a, b)| a == b))
            .then(|| &p[self.scope.len()..])
    }

    /// Every import of `files` that breaks the layering, as a readable line.
    pub fn violations(&self, files: &[(String, String)]) -> Vec<String> {
        let layer = self.layer_of();
        let mut bad = Vec::new();
        for (rel, src) in files {
            for imp in imports_of(rel, src) {
                let Some(from_rel) = self.inside(&imp.from) else {
                    continue;
                };
                if from_rel.is_empty() {
                    continue; // the scope's root file declares and re-exports
                }
                let Some(to_rel) = self.inside(&imp.to) else {
                    continue;
                };
                let at = format!("{}:{}", imp.file, imp.line);
                let Some(from) = self.component(from_rel) else {
                    bad.push(format!(
                        "{at}: `{}` is not in the layer table",
                        from_rel.join("::")
                    ));
                    continue;
                };
                let to = match self.component(to_rel) {
                    Some(c) => c,
                    None => match to_rel
                        .first()
                        .and_then(|item| self.reexports.iter().find(|(i, _)| i == item))
                    {
                        Some((_, m)) => m.to_string(),
                        None => {
                            bad.push(format!(
                                "{at}: `{from}` imports `{}`, which is not in the layer table \
                                 (an item of the root file: import the module that defines it)",
                                to_rel.join("::")
                            ));
                            continue;
                        }
                    },
                };
                if to == from {
                    continue;
                }
                let (lf, lt) = (layer[&from], layer[&to]);
                if lt >= lf {
                    bad.push(format!(
                        "{at}: `{from}` (layer {lf}) imports `{to}` (layer {lt}): imports must point to lower layers"
                    ));
                }
            }
        }
        bad
    }
}

/// The layers of a table in a module's docs (lines starting with `//!`): the rows after a
/// header row `| layer | modules | … |`, each `| N | `a`, `b` | … |`, lowest first; the names
/// in backticks of the second column. Panics (the test fails) on a malformed table.
pub fn layers_from_docs(src: &str) -> Vec<Vec<String>> {
    let rows: Vec<&str> = src
        .lines()
        .map(str::trim)
        .filter_map(|l| l.strip_prefix("//!"))
        .map(str::trim)
        .skip_while(|l| !l.starts_with("| layer | modules |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .collect();
    assert!(
        !rows.is_empty(),
        "no `| layer | modules |` table in the docs"
    );
    rows.iter()
        .enumerate()
        .map(|(i, row)| {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            assert_eq!(
                cells.get(1),
                Some(&i.to_string().as_str()),
                "row {i}: {row}"
            );
            let names: Vec<String> = cells[2]
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect();
            assert!(!names.is_empty(), "row {i} names no module: {row}");
            names
        })
        .collect()
}

/// The `.rs` files under `dir`, with their paths relative to `base`.
pub fn read_tree(dir: &Path, base: &Path, out: &mut Vec<(String, String)>) {
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

/// The modules a file declares (`mod x;`, `pub mod x;`, `pub(crate) mod x;`, with or
/// without a `#[cfg]` line before).
pub fn declared_modules(lib: &str) -> BTreeSet<String> {
    strip(lib)
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let l = l
                .strip_prefix("pub(crate) ")
                .or_else(|| l.strip_prefix("pub "))
                .unwrap_or(l);
            let name = l.strip_prefix("mod ")?.strip_suffix(';')?;
            Some(name.trim().to_string())
        })
        .collect()
}
