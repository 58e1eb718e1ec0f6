//! Checks that `include/mscclpp/layout.h` describes every shared layout exactly as Rust does.
//!
//! From `mscclpp_shared::layout::{LAYOUTS, TRIGGER_CONSTANTS}` (plus the few constants listed
//! in [`extra_constants`] and the helper cases below) this test writes a C program that includes
//! the header and prints, one fact per line, `KIND KEY VALUE`:
//!
//! ```text
//! size ProxyTrigger 16
//! align ProxyTrigger 16
//! offset ProxyTrigger.snd 8
//! const MSCCLPP_TRIGGER_TYPE_SHIFT 50
//! helper pack.sample.type 5
//! ```
//!
//! It compiles that program with the system C compiler (and, in a second test, as C++17),
//! runs it, and compares every line with the value Rust computes, reporting every mismatch at
//! once. A field missing from the header fails the compile; a field that moved or changed
//! size fails the comparison. A compiler is required: these tests fail, never skip, without one.
//!
//! The header is compiled into this test binary ([`HEADERS`]) and written next to the
//! generated program at run time, so the binary checks the header of the source it was built
//! from wherever it runs (a GPU bundle copied to another machine or directory included).

use std::collections::HashMap;
use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use mscclpp_shared::ipc;
use mscclpp_shared::layout::{LAYOUTS, StructLayout, TRIGGER_CONSTANTS};
use mscclpp_shared::packet::ll128;
use mscclpp_shared::status::error_detail;
use mscclpp_shared::trace::{TraceEventKind, event_slot};
use mscclpp_shared::trigger::{self, ProxyTrigger, TriggerFields, TriggerType, commit_parity};
use mscclpp_shared::{DEFAULT_FIFO_SIZE, DeviceErrorCode, WaitSite};

// ------------------------------------------------------------------------------------------
// What Rust says
// ------------------------------------------------------------------------------------------

/// Constants the header defines beyond `TRIGGER_CONSTANTS`, each with its Rust value.
fn extra_constants() -> Vec<(&'static str, u64)> {
    let all_types = TriggerType::DATA | TriggerType::FLAG | TriggerType::SYNC;
    vec![
        ("MSCCLPP_TRIGGER_MAX_SIZE", trigger::MAX_SIZE),
        ("MSCCLPP_TRIGGER_MAX_OFFSET", trigger::MAX_OFFSET),
        (
            "MSCCLPP_TRIGGER_MAX_MEMORY_ID",
            trigger::MAX_MEMORY_ID.into(),
        ),
        ("MSCCLPP_TRIGGER_MAX_TYPE", all_types.bits().into()),
        (
            "MSCCLPP_TRIGGER_MAX_SEMAPHORE_ID",
            trigger::MAX_SEMAPHORE_ID.into(),
        ),
        ("MSCCLPP_DEFAULT_FIFO_SIZE", DEFAULT_FIFO_SIZE.into()),
        ("MSCCLPP_DEVICE_ERROR_NONE", DeviceErrorCode::None as u64),
        (
            "MSCCLPP_ERROR_DETAIL_SITE_SHIFT",
            error_detail(WaitSite::FifoPush, 0).trailing_zeros().into(),
        ),
        ("MSCCLPP_WAIT_SITE_UNKNOWN", WaitSite::Unknown as u64),
        ("MSCCLPP_WAIT_SITE_FIFO_PUSH", WaitSite::FifoPush as u64),
        ("MSCCLPP_WAIT_SITE_FIFO_SYNC", WaitSite::FifoSync as u64),
        ("MSCCLPP_WAIT_SITE_SEMAPHORE", WaitSite::Semaphore as u64),
        ("MSCCLPP_WAIT_SITE_PACKET", WaitSite::Packet as u64),
        (
            "MSCCLPP_WAIT_SITE_GRID_BARRIER",
            WaitSite::GridBarrier as u64,
        ),
        ("MSCCLPP_IPC_KIND_CUDA", ipc::IPC_KIND_CUDA.into()),
        ("MSCCLPP_IPC_KIND_CPU", ipc::IPC_KIND_CPU.into()),
        ("MSCCLPP_LL128_LINE_BYTES", ll128::LINE_BYTES as u64),
        (
            "MSCCLPP_LL128_LINE_DATA_BYTES",
            ll128::LINE_DATA_BYTES as u64,
        ),
        ("MSCCLPP_LL128_LANES_PER_LINE", ll128::LANES_PER_LINE as u64),
        (
            "MSCCLPP_LL128_WARP_DATA_BYTES",
            ll128::WARP_DATA_BYTES as u64,
        ),
    ]
}

/// Every constant the C program prints: the crate's table, then [`extra_constants`].
fn all_constants() -> Vec<(&'static str, u64)> {
    let mut all = TRIGGER_CONSTANTS.to_vec();
    all.extend(extra_constants());
    all
}

/// One call of `mscclpp_trigger_pack` the C program makes, with raw arguments (so that it can
/// also pass values Rust's types cannot hold, such as type bit 8).
#[derive(Clone, Copy)]
struct PackCase {
    name: &'static str,
    size: u64,
    src_offset: u64,
    dst_offset: u64,
    src_memory_id: u32,
    dst_memory_id: u32,
    type_bits: u32,
    semaphore_id: u32,
}

const fn pack_case(name: &'static str, a: (u64, u64, u64, u32, u32, u32, u32)) -> PackCase {
    PackCase {
        name,
        size: a.0,
        src_offset: a.1,
        dst_offset: a.2,
        src_memory_id: a.3,
        dst_memory_id: a.4,
        type_bits: a.5,
        semaphore_id: a.6,
    }
}

const PACK_CASES: &[PackCase] = &[
    pack_case(
        "sample",
        (
            0x1122_3344,
            0x5566_7788,
            0x99aa_bbcc,
            0x1a5,
            0x0c3,
            5,
            0x2b7,
        ),
    ),
    pack_case(
        "maxima",
        (0xffff_ffff, 0xffff_ffff, 0xffff_ffff, 511, 511, 7, 1023),
    ),
    pack_case("signal", (0, 0, 0, 0, 0, 2, 17)),
    pack_case("flush", (0, 0, 0, 0, 0, 4, 1)),
    pack_case("size_too_large", (1 << 32, 0, 0, 0, 0, 1, 0)),
    pack_case("src_offset_too_large", (1, 1 << 32, 0, 0, 0, 1, 0)),
    pack_case("dst_offset_too_large", (1, 0, u64::MAX, 0, 0, 1, 0)),
    pack_case("src_memory_id_too_large", (1, 0, 0, 512, 0, 1, 0)),
    pack_case("dst_memory_id_too_large", (1, 0, 0, 0, 1000, 1, 0)),
    pack_case("empty_type", (1, 0, 0, 0, 0, 0, 0)),
    pack_case("unknown_type_bit", (1, 0, 0, 0, 0, 8, 0)),
    pack_case("semaphore_id_too_large", (0, 0, 0, 0, 0, 2, 1024)),
];

impl PackCase {
    /// What Rust makes of these arguments: the packed trigger, or `None` when it refuses them.
    fn rust(&self) -> Option<ProxyTrigger> {
        let kind = TriggerType::from_bits(u8::try_from(self.type_bits).ok()?)?;
        ProxyTrigger::new(TriggerFields {
            size: self.size,
            src_offset: self.src_offset,
            dst_offset: self.dst_offset,
            src_memory_id: self.src_memory_id,
            dst_memory_id: self.dst_memory_id,
            kind,
            semaphore_id: self.semaphore_id,
        })
        .ok()
    }
}

/// `(pos, log2_size)` arguments of `mscclpp_fifo_commit_parity`.
const PARITY_CASES: &[(u64, u32)] = &[
    (0, 2),
    (3, 2),
    (4, 2),
    (7, 2),
    (8, 2),
    (5, 0),
    (1 << 40, 40),
    (u64::MAX, 9),
];

/// `(site, addr)` arguments of `mscclpp_error_detail`.
const ERROR_DETAIL_CASES: &[(WaitSite, u64)] = &[
    (WaitSite::FifoSync, 0xdead_beef),
    (WaitSite::GridBarrier, u64::MAX),
    (WaitSite::Unknown, 0x1234),
];

/// `event_slot` cases: (block, launch, kind, log2 records), the launch wrapping its ring.
const TRACE_SLOT_CASES: &[(u32, u32, TraceEventKind, u32)] = &[
    (0, 1, TraceEventKind::Start, 0),
    (3, 9, TraceEventKind::Recv, 3),
    (1023, u32::MAX, TraceEventKind::End, 12),
];

/// Every line the C program must print, as `(key, value)`, from the given tables.
fn expected_lines(layouts: &[StructLayout], constants: &[(&str, u64)]) -> Vec<(String, u64)> {
    let mut lines = Vec::new();
    for l in layouts {
        lines.push((format!("size {}", l.name), l.size as u64));
        lines.push((format!("align {}", l.name), l.align as u64));
        for &(field, offset) in l.fields {
            lines.push((format!("offset {}.{field}", l.name), offset as u64));
        }
    }
    for &(name, value) in constants {
        lines.push((format!("const {name}"), value));
    }
    for case in PACK_CASES {
        let key = |what: &str| format!("helper pack.{}.{what}", case.name);
        let Some(t) = case.rust() else {
            lines.push((key("ok"), 0));
            continue;
        };
        let committed = t.with_commit_bit(3);
        lines.extend([
            (key("ok"), 1),
            (key("fst"), t.fst),
            (key("snd"), t.snd),
            (key("size"), t.size()),
            (key("src_offset"), t.src_offset()),
            (key("dst_offset"), t.dst_offset()),
            (key("src_memory_id"), t.src_memory_id().into()),
            (key("dst_memory_id"), t.dst_memory_id().into()),
            (key("type"), t.kind().bits().into()),
            (key("semaphore_id"), t.semaphore_id().into()),
            (key("commit"), t.commit_bit()),
            (key("committed.snd"), committed.snd),
            (key("committed.commit"), committed.commit_bit()),
            (
                key("committed.semaphore_id"),
                committed.semaphore_id().into(),
            ),
            (key("cleared.snd"), committed.with_commit_bit(0).snd),
        ]);
    }
    for (i, &(pos, log2)) in PARITY_CASES.iter().enumerate() {
        lines.push((format!("helper parity.{i}"), commit_parity(pos, log2)));
    }
    for (i, &(site, addr)) in ERROR_DETAIL_CASES.iter().enumerate() {
        lines.push((format!("helper error_detail.{i}"), error_detail(site, addr)));
    }
    for (i, &(block, launch, kind, log2)) in TRACE_SLOT_CASES.iter().enumerate() {
        lines.push((
            format!("helper trace_slot.{i}"),
            event_slot(block, launch, kind, log2),
        ));
    }
    lines
}

// ------------------------------------------------------------------------------------------
// The C program
// ------------------------------------------------------------------------------------------

/// The fixed start of the generated program: includes, print helpers and `main`'s opening.
const PRELUDE: &str = r#"/* Generated by shared/tests/c_header.rs from the Rust layout tables. */
#include <stdio.h>
#include <stddef.h>
#include "mscclpp/layout.h"

#ifdef __cplusplus
#define ALIGNOF(type) alignof(type)
#else
#define ALIGNOF(type) _Alignof(type)
#endif
#define SHOW(key, value) printf("%s %llu\n", key, (unsigned long long)(value))

static void show_pack(const char* name, uint64_t size, uint64_t src_offset, uint64_t dst_offset,
                      uint32_t src_memory_id, uint32_t dst_memory_id, uint32_t type,
                      uint32_t semaphore_id) {
  ProxyTrigger t;
  int ok;
  t.fst = 0;
  t.snd = 0;
  ok = mscclpp_trigger_pack(&t, size, src_offset, dst_offset, src_memory_id, dst_memory_id, type,
                            semaphore_id);
  printf("helper pack.%s.ok %d\n", name, ok);
  if (!ok) return;
#define SHOW_FIELD(what, value) \
  printf("helper pack.%s.%s %llu\n", name, what, (unsigned long long)(value))
  SHOW_FIELD("fst", t.fst);
  SHOW_FIELD("snd", t.snd);
  SHOW_FIELD("size", mscclpp_trigger_size(&t));
  SHOW_FIELD("src_offset", mscclpp_trigger_src_offset(&t));
  SHOW_FIELD("dst_offset", mscclpp_trigger_dst_offset(&t));
  SHOW_FIELD("src_memory_id", mscclpp_trigger_src_memory_id(&t));
  SHOW_FIELD("dst_memory_id", mscclpp_trigger_dst_memory_id(&t));
  SHOW_FIELD("type", mscclpp_trigger_type(&t));
  SHOW_FIELD("semaphore_id", mscclpp_trigger_semaphore_id(&t));
  SHOW_FIELD("commit", mscclpp_trigger_commit_bit(&t));
  mscclpp_trigger_set_commit_bit(&t, 3);
  SHOW_FIELD("committed.snd", t.snd);
  SHOW_FIELD("committed.commit", mscclpp_trigger_commit_bit(&t));
  SHOW_FIELD("committed.semaphore_id", mscclpp_trigger_semaphore_id(&t));
  mscclpp_trigger_set_commit_bit(&t, 0);
  SHOW_FIELD("cleared.snd", t.snd);
#undef SHOW_FIELD
}

int main(void) {
"#;

/// A C (and C++) program that prints, through the header, every fact [`expected_lines`] lists.
fn c_program(layouts: &[StructLayout], constants: &[(&str, u64)]) -> String {
    let mut c = String::from(PRELUDE);
    // `write!` into a String cannot fail; the results are ignored on purpose.
    for l in layouts {
        let n = l.name;
        let _ = writeln!(c, "  SHOW(\"size {n}\", sizeof({n}));");
        let _ = writeln!(c, "  SHOW(\"align {n}\", ALIGNOF({n}));");
        for &(f, _) in l.fields {
            let _ = writeln!(c, "  SHOW(\"offset {n}.{f}\", offsetof({n}, {f}));");
        }
    }
    for &(name, _) in constants {
        let _ = writeln!(c, "  SHOW(\"const {name}\", {name});");
    }
    for p in PACK_CASES {
        let _ = writeln!(
            c,
            "  show_pack(\"{}\", {:#x}ULL, {:#x}ULL, {:#x}ULL, {}u, {}u, {}u, {}u);",
            p.name,
            p.size,
            p.src_offset,
            p.dst_offset,
            p.src_memory_id,
            p.dst_memory_id,
            p.type_bits,
            p.semaphore_id
        );
    }
    for (i, &(pos, log2)) in PARITY_CASES.iter().enumerate() {
        let _ = writeln!(
            c,
            "  SHOW(\"helper parity.{i}\", mscclpp_fifo_commit_parity({pos:#x}ULL, {log2}u));"
        );
    }
    for (i, &(site, addr)) in ERROR_DETAIL_CASES.iter().enumerate() {
        let _ = writeln!(
            c,
            "  SHOW(\"helper error_detail.{i}\", mscclpp_error_detail({}u, {addr:#x}ULL));",
            site as u8
        );
    }
    for (i, &(block, launch, kind, log2)) in TRACE_SLOT_CASES.iter().enumerate() {
        let _ = writeln!(
            c,
            "  SHOW(\"helper trace_slot.{i}\", mscclpp_trace_event_slot({block}u, {launch}u, {}u, {log2}u));",
            kind as u16
        );
    }
    c.push_str("  return 0;\n}\n");
    c
}

// ------------------------------------------------------------------------------------------
// The comparison
// ------------------------------------------------------------------------------------------

/// Compares the C program's `output` with what `expected` says, listing every difference:
/// wrong values, lines missing from the output, lines nobody expected, duplicated and garbled
/// lines. Empty means equal.
fn compare(expected: &[(String, u64)], output: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mut printed: HashMap<&str, u64> = HashMap::new();
    for line in output.lines() {
        let parsed = line
            .rsplit_once(' ')
            .and_then(|(key, value)| Some((key, value.parse::<u64>().ok()?)));
        match parsed {
            Some((key, value)) => {
                if printed.insert(key, value).is_some() {
                    problems.push(format!("{key}: printed more than once by the C program"));
                }
            }
            None => problems.push(format!("unreadable line from the C program: {line:?}")),
        }
    }
    for (key, want) in expected {
        match printed.remove(key.as_str()) {
            Some(got) if got == *want => {}
            Some(got) => problems.push(format!("{key}: C says {got}, Rust says {want}")),
            None => problems.push(format!(
                "{key}: expected by Rust, not printed by the C program"
            )),
        }
    }
    let mut unexpected: Vec<_> = printed.into_iter().collect();
    unexpected.sort_unstable();
    for (key, value) in unexpected {
        problems.push(format!(
            "{key}: printed by the C program ({value}), not expected by Rust"
        ));
    }
    problems
}

/// [`compare`] against the given Rust tables; `Err` holds a report of every difference.
fn check_against(
    layouts: &[StructLayout],
    constants: &[(&str, u64)],
    output: &str,
) -> Result<(), String> {
    let problems = compare(&expected_lines(layouts, constants), output);
    if problems.is_empty() {
        return Ok(());
    }
    let mut report = format!(
        "include/mscclpp/layout.h and the Rust layouts disagree in {} place(s):\n",
        problems.len()
    );
    for p in &problems {
        let _ = writeln!(report, "  - {p}");
    }
    Err(report)
}

// ------------------------------------------------------------------------------------------
// Compiling and running
// ------------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Lang {
    C11,
    Cxx17,
}

impl Lang {
    /// Environment variable that overrides the compiler, then the compilers tried in order.
    fn compilers(self) -> (&'static str, &'static [&'static str]) {
        match self {
            Lang::C11 => ("CC", &["cc", "gcc", "clang"]),
            Lang::Cxx17 => ("CXX", &["c++", "g++", "clang++"]),
        }
    }

    /// Flags in gcc/clang syntax: every common warning as an error, `-Wextra -Wpedantic`
    /// included, so that users who build that way are never the first to find a problem.
    fn flags(self) -> &'static [&'static str] {
        match self {
            Lang::C11 => &["-std=c11", "-Wall", "-Wextra", "-Wpedantic", "-Werror"],
            Lang::Cxx17 => &[
                "-std=c++17",
                "-Wall",
                "-Wextra",
                "-Wpedantic",
                "-Werror",
                "-x",
                "c++",
            ],
        }
    }

    fn what(self) -> &'static str {
        match self {
            Lang::C11 => "C compiler",
            Lang::Cxx17 => "C++ compiler",
        }
    }
}

/// The compiler command (program and leading arguments, as in `CC="ccache gcc"`). Panics with
/// install instructions when there is none: this check must never be skipped silently.
fn find_compiler(lang: Lang) -> Vec<String> {
    let (var, candidates) = lang.compilers();
    let runs = |cmd: &[String]| {
        Command::new(&cmd[0])
            .args(&cmd[1..])
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if let Ok(value) = env::var(var)
        && !value.trim().is_empty()
    {
        let cmd: Vec<String> = value.split_whitespace().map(str::to_owned).collect();
        assert!(
            runs(&cmd),
            "${var} is set to {value:?}, but `{value} --version` does not run. \
             Point ${var} at a working {}, or unset it to use {candidates:?}.",
            lang.what()
        );
        return cmd;
    }
    for &name in candidates {
        let cmd = vec![name.to_owned()];
        if runs(&cmd) {
            return cmd;
        }
    }
    panic!(
        "tests/c_header.rs needs a {what} to check include/mscclpp/layout.h against the Rust \
         layouts, and found none (tried ${var}, then {candidates:?}). This check is never \
         skipped. Install one (Debian/Ubuntu: `sudo apt-get install build-essential`; \
         Fedora/RHEL: `sudo dnf install gcc gcc-c++`; macOS: `xcode-select --install`) \
         or set ${var} to one.",
        what = lang.what()
    );
}

/// A fresh, empty directory under the system temp dir, unique to this process and call.
fn scratch_dir(tag: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = env::temp_dir().join(format!(
        "mscclpp-shared-c-header-{}-{tag}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    // A leftover from an earlier process with the same id is stale; start clean.
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("cannot create scratch directory {}: {e}", dir.display()));
    dir
}

/// The headers the generated program includes, as they were when this test was built:
/// `(path under the include directory, contents)`.
const HEADERS: &[(&str, &str)] = &[(
    "mscclpp/layout.h",
    include_str!("../include/mscclpp/layout.h"),
)];

/// Writes [`HEADERS`] under `dir/include` and returns that include directory.
fn write_headers(dir: &std::path::Path) -> PathBuf {
    let include = dir.join("include");
    for (path, text) in HEADERS {
        let file = include.join(path);
        if let Some(parent) = file.parent() {
            fs::create_dir_all(parent)
                .unwrap_or_else(|e| panic!("cannot create {}: {e}", parent.display()));
        }
        fs::write(&file, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", file.display()));
    }
    include
}

/// Compiles `program` as `lang` against the header, runs it and returns its output. The
/// scratch directory is removed on success and kept (and named) on failure.
fn compile_and_run(lang: Lang, program: &str) -> String {
    let compiler = find_compiler(lang);
    let dir = scratch_dir(match lang {
        Lang::C11 => "c11",
        Lang::Cxx17 => "cxx17",
    });
    let source = dir.join("layout_check.c");
    let exe = dir.join("layout_check");
    let include = write_headers(&dir);
    fs::write(&source, program)
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", source.display()));

    let mut cmd = Command::new(&compiler[0]);
    cmd.args(&compiler[1..])
        .args(lang.flags())
        .arg("-I")
        .arg(&include)
        .arg(&source)
        .arg("-o")
        .arg(&exe);
    let built = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot start the {} ({cmd:?}): {e}", lang.what()));
    assert!(
        built.status.success(),
        "include/mscclpp/layout.h does not compile as {lang:?} ({}).\ncommand: {cmd:?}\n\
         program kept at {}\n--- compiler output ---\n{}{}",
        built.status,
        source.display(),
        String::from_utf8_lossy(&built.stdout),
        String::from_utf8_lossy(&built.stderr),
    );

    let ran = Command::new(&exe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", exe.display()));
    assert!(
        ran.status.success(),
        "{} failed ({}); program kept at {}\n{}",
        exe.display(),
        ran.status,
        source.display(),
        String::from_utf8_lossy(&ran.stderr),
    );
    let output = String::from_utf8(ran.stdout).expect("the layout program prints ASCII");
    let _ = fs::remove_dir_all(&dir);
    output
}

/// Output of the C11 program for the real tables, built once and shared by the tests below.
fn c11_output() -> &'static str {
    static OUTPUT: OnceLock<String> = OnceLock::new();
    OUTPUT.get_or_init(|| compile_and_run(Lang::C11, &c_program(LAYOUTS, &all_constants())))
}

// ------------------------------------------------------------------------------------------
// Tests
// ------------------------------------------------------------------------------------------

#[test]
fn c11_header_matches_rust_layouts() {
    if let Err(report) = check_against(LAYOUTS, &all_constants(), c11_output()) {
        panic!("{report}");
    }
}

#[test]
fn cxx17_header_matches_rust_layouts() {
    let output = compile_and_run(Lang::Cxx17, &c_program(LAYOUTS, &all_constants()));
    if let Err(report) = check_against(LAYOUTS, &all_constants(), &output) {
        panic!("{report}");
    }
}

/// The comparison is not vacuous: the real program's output, checked against a table in which
/// one offset and one constant were changed, yields exactly those two differences.
#[test]
fn altered_rust_table_is_reported() {
    let output = c11_output();
    let constants = all_constants();
    check_against(LAYOUTS, &constants, output).expect("the unaltered tables match");

    let mut layouts = LAYOUTS.to_vec();
    let port = layouts
        .iter_mut()
        .find(|l| l.name == "PortChannelDeviceHandle")
        .expect("LAYOUTS lists PortChannelDeviceHandle");
    let mut fields = port.fields.to_vec();
    let fifo = fields
        .iter_mut()
        .find(|(name, _)| *name == "fifo")
        .expect("PortChannelDeviceHandle has a fifo field");
    fifo.1 += 8;
    port.fields = fields.leak();

    let mut altered_constants = constants.clone();
    let shift = altered_constants
        .iter_mut()
        .find(|(name, _)| *name == "MSCCLPP_TRIGGER_TYPE_SHIFT")
        .expect("TRIGGER_CONSTANTS has MSCCLPP_TRIGGER_TYPE_SHIFT");
    shift.1 += 1;

    let problems = compare(&expected_lines(&layouts, &altered_constants), output);
    assert_eq!(
        problems,
        [
            "offset PortChannelDeviceHandle.fifo: C says 40, Rust says 48",
            "const MSCCLPP_TRIGGER_TYPE_SHIFT: C says 50, Rust says 51",
        ],
    );
    let report = check_against(&layouts, &altered_constants, output)
        .expect_err("an altered table must not pass");
    assert!(report.contains("disagree in 2 place(s)"), "{report}");

    // A struct Rust stops listing shows up as lines nobody expected.
    let fewer: Vec<StructLayout> = LAYOUTS
        .iter()
        .copied()
        .filter(|l| l.name != "LL8Packet")
        .collect();
    let problems = compare(&expected_lines(&fewer, &constants), output);
    assert_eq!(problems.len(), 4, "{problems:#?}");
    assert!(
        problems
            .iter()
            .all(|p| p.contains("LL8Packet") && p.ends_with("not expected by Rust")),
        "{problems:#?}"
    );
}

/// The embedded header is the one a user compiles: the copy written for the compiler is
/// byte-for-byte the file in the source tree (the run-time package directory, as `cargo test`
/// and the GPU bundle's `run-tests.sh` set it; without the tree only the embedded copy, which
/// cargo rebuilt from that file, is checked).
#[test]
fn embedded_header_is_written_verbatim() {
    let dir = scratch_dir("headers");
    let include = write_headers(&dir);
    for (path, text) in HEADERS {
        let written = fs::read_to_string(include.join(path)).expect("the header was written");
        assert_eq!(written, *text, "{path}");
        let in_tree = mscclpp_test_support::package_dir(env!("CARGO_MANIFEST_DIR"))
            .join("include")
            .join(path);
        if let Ok(source) = fs::read_to_string(&in_tree) {
            assert_eq!(
                source,
                written,
                "{} differs from the embedded copy",
                in_tree.display()
            );
        }
    }
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn comparison_reports_missing_duplicate_and_unreadable_lines() {
    let expected = vec![("size A".to_owned(), 8), ("size B".to_owned(), 16)];
    assert!(compare(&expected, "size A 8\nsize B 16\n").is_empty());
    assert_eq!(
        compare(&expected, "size A 8\nsize A 8\nsize B sixteen\n"),
        [
            "size A: printed more than once by the C program",
            "unreadable line from the C program: \"size B sixteen\"",
            "size B: expected by Rust, not printed by the C program",
        ],
    );
}
