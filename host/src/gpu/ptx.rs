//! What the host reads from PTX text without a driver: the architecture it was built for
//! (`.target`) and its kernel entry points (`.entry`) with the bytes of their parameters.
//!
//! Two checks rest on it:
//! - the CPU backend checks a kernel's name and parameter size against the PTX the program
//!   loads, as the CUDA driver does, so that a misspelt [`KernelSpec`](super::KernelSpec)
//!   name fails on a machine without a GPU too ([`Error::MissingKernel`](crate::Error), not a
//!   surprise on the first GPU run);
//! - the CUDA backend refuses PTX built for a newer GPU than the device with an error that
//!   names both architectures and the fix (`MSCCLPP_CUDA_ARCH`), where the driver says only
//!   that the JIT failed.
//!
//! The text is the program's own (embedded at build time or read from the user's file), but
//! it is still not trusted: whatever does not parse is simply not found (an unknown target,
//! a parameter size of `None`), never a panic.

use std::collections::HashMap;
use std::fmt;

/// A PTX `.target` architecture: `sm_90`, `sm_80`, `sm_90a`, `sm_100f`, …
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmArch {
    /// `10 * major + minor` of the compute capability: 90 for `sm_90`, 100 for `sm_100`.
    pub number: u32,
    /// `a` (architecture-specific: runs on exactly this compute capability), `f` (family:
    /// this major version, this minor or newer), or none (this compute capability or newer).
    pub suffix: Option<char>,
}

impl SmArch {
    /// The architecture of a device of compute capability `major.minor`.
    pub fn of_device(major: u32, minor: u32) -> Self {
        Self {
            number: 10 * major + minor,
            suffix: None,
        }
    }

    /// Parses `sm_XY`, `sm_XYa`, `sm_XYf` (`None` for anything else).
    pub fn parse(s: &str) -> Option<Self> {
        let digits = s.strip_prefix("sm_")?;
        let (digits, suffix) = match digits.char_indices().last()? {
            (i, c @ ('a' | 'f')) => (&digits[..i], Some(c)),
            _ => (digits, None),
        };
        if digits.len() < 2 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(Self {
            number: digits.parse().ok()?,
            suffix,
        })
    }

    /// Whether code built for `self` runs on a device of architecture `device` (PTX is
    /// forward compatible, never backward; `a` targets run on their own architecture only,
    /// `f` targets on their family).
    pub fn runs_on(self, device: SmArch) -> bool {
        let d = device.number;
        match self.suffix {
            Some('a') => d == self.number,
            Some('f') => d / 10 == self.number / 10 && d >= self.number,
            _ => d >= self.number,
        }
    }
}

impl fmt::Display for SmArch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sm_{}", self.number)?;
        match self.suffix {
            Some(c) => write!(f, "{c}"),
            None => Ok(()),
        }
    }
}

/// What a PTX module declares.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PtxInfo {
    /// The `.target` architecture, if the text has one that parses.
    pub target: Option<SmArch>,
    /// Every `.entry` by name, with the bytes of its parameters (the last parameter's offset
    /// plus its size, as `cuFuncGetParamInfo` reports them; `None` where a parameter does not
    /// parse).
    pub entries: HashMap<String, Option<usize>>,
}

impl PtxInfo {
    /// Reads `.target` and every `.entry` of `ptx`.
    pub fn parse(ptx: &str) -> Self {
        let text = strip_comments(ptx);
        let target = directive_operand(&text, ".target").and_then(SmArch::parse);
        let mut entries = HashMap::new();
        let mut rest = text.as_str();
        while let Some(at) = find_directive(rest, ".entry") {
            rest = &rest[at + ".entry".len()..];
            let after = rest.trim_start();
            let name_len = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '$'))
                .unwrap_or(after.len());
            if name_len == 0 {
                continue;
            }
            let name = &after[..name_len];
            let tail = after[name_len..].trim_start();
            let bytes = match tail.strip_prefix('(') {
                Some(params) => params.find(')').and_then(|end| param_bytes(&params[..end])),
                None => Some(0),
            };
            entries.insert(name.to_string(), bytes);
        }
        Self { target, entries }
    }
}

/// The text with `//` and `/* */` comments replaced by spaces, in one pass (the embedded PTX
/// is a megabyte with thousands of comments).
fn strip_comments(ptx: &str) -> String {
    let bytes = ptx.as_bytes();
    let mut out = String::with_capacity(ptx.len());
    // Start of the text not yet copied; comments are skipped in whole, so `copied` always
    // sits on a character boundary (`/`, `*` and `\n` are ASCII).
    let (mut i, mut copied) = (0, 0);
    while i + 1 < bytes.len() {
        let end = match (bytes[i], bytes[i + 1]) {
            (b'/', b'/') => find_from(bytes, i + 2, b"\n").unwrap_or(bytes.len()),
            (b'/', b'*') => find_from(bytes, i + 2, b"*/").map_or(bytes.len(), |e| e + 2),
            _ => {
                i += 1;
                continue;
            }
        };
        out.push_str(&ptx[copied..i]);
        out.push(' ');
        (i, copied) = (end, end);
    }
    out.push_str(&ptx[copied.min(ptx.len())..]);
    out
}

/// Index of the first `needle` in `hay` at or after `from`.
fn find_from(hay: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    hay.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| from + p)
}

/// Byte offset of the next `directive` in `text` that stands as a word of its own.
fn find_directive(text: &str, directive: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = text[from..].find(directive) {
        let at = from + i;
        let before_ok = text[..at]
            .chars()
            .next_back()
            .is_none_or(char::is_whitespace);
        let after_ok = text[at + directive.len()..]
            .chars()
            .next()
            .is_none_or(char::is_whitespace);
        if before_ok && after_ok {
            return Some(at);
        }
        from = at + directive.len();
    }
    None
}

/// The first operand of the first `directive` (`.target sm_90, debug` gives `sm_90`).
fn directive_operand<'a>(text: &'a str, directive: &str) -> Option<&'a str> {
    let at = find_directive(text, directive)?;
    text[at + directive.len()..]
        .split(|c: char| c.is_whitespace() || c == ',')
        .find(|s| !s.is_empty())
}

/// Bytes of a parameter list (`.param .align 8 .b8 k_param_0[256], .param .u32 k_param_1`):
/// each parameter aligned, the last one's end. `None` if one does not parse.
fn param_bytes(list: &str) -> Option<usize> {
    let mut end = 0usize;
    for param in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let words: Vec<&str> = param.split_whitespace().collect();
        if words.first() != Some(&".param") {
            return None;
        }
        let elem = words.iter().find_map(|w| scalar_bytes(w))?;
        let align = match words.iter().position(|w| *w == ".align") {
            Some(i) => words.get(i + 1)?.parse::<usize>().ok()?,
            None => elem,
        };
        let name = words.last()?;
        let count = match name.find('[') {
            Some(open) => name[open + 1..].strip_suffix(']')?.trim().parse().ok()?,
            None => 1,
        };
        if align == 0 || !align.is_power_of_two() {
            return None;
        }
        end = end.checked_next_multiple_of(align)?;
        end = end.checked_add(elem.checked_mul(count)?)?;
    }
    Some(end)
}

/// Bytes of a PTX scalar type (`.b8`, `.u32`, `.f64`, …).
fn scalar_bytes(word: &str) -> Option<usize> {
    let bits = word
        .strip_prefix(".b")
        .or_else(|| word.strip_prefix(".u"))
        .or_else(|| word.strip_prefix(".s"))
        .or_else(|| word.strip_prefix(".f"))?;
    match bits {
        "8" => Some(1),
        "16" => Some(2),
        "32" => Some(4),
        "64" => Some(8),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PTX: &str = r#"
//
// Generated by LLVM NVPTX Back-End
//
.version 7.8
.target sm_90
.address_size 64
.extern .shared .align 16 .b8 mscclpp_dynamic_smem[];
	// .globl	copy_kernel // -- Begin function copy_kernel
.func record_error(.param .b64 record_error_param_0);
/* .entry commented_out( .param .u32 x ) */
.visible .entry copy_kernel(
	.param .align 8 .b8 copy_kernel_param_0[32]
)
{
	ret;
}
.visible .entry two_params(
	.param .u32 two_params_param_0,
	.param .u64 .ptr .global .align 8 two_params_param_1
)
{ ret; }
.entry no_params()
{ ret; }
.entry $weird_1 { ret; }
.visible .entry broken( .param .b8 broken_param_0[oops] ) { ret; }
"#;

    #[test]
    fn entries_and_their_parameter_bytes() {
        let info = PtxInfo::parse(PTX);
        let get = |n: &str| info.entries.get(n).copied();
        assert_eq!(get("copy_kernel"), Some(Some(32)));
        // u32 at 0, then a u64 aligned to 8: 8 + 8.
        assert_eq!(get("two_params"), Some(Some(16)));
        assert_eq!(get("no_params"), Some(Some(0)));
        assert_eq!(get("$weird_1"), Some(Some(0)));
        assert_eq!(get("broken"), Some(None));
        // Comments, `.func`s and the shared symbol are not entry points.
        assert_eq!(get("commented_out"), None);
        assert_eq!(get("record_error"), None);
        assert_eq!(info.entries.len(), 5);
        assert_eq!(info.target, Some(SmArch::parse("sm_90").unwrap()));
    }

    #[test]
    fn targets_parse_and_say_where_they_run() {
        let arch = |s| SmArch::parse(s).unwrap();
        let dev = |maj, min| SmArch::of_device(maj, min);
        assert_eq!(arch("sm_90").to_string(), "sm_90");
        assert_eq!(arch("sm_90a").to_string(), "sm_90a");
        assert_eq!(arch("sm_100f").number, 100);
        assert_eq!(dev(8, 6).to_string(), "sm_86");
        for bad in ["", "sm_", "sm_9", "sm_9x", "compute_90", "sm_90b", "sm_a"] {
            assert_eq!(SmArch::parse(bad), None, "{bad:?}");
        }
        // Plain targets run on their architecture and newer.
        assert!(arch("sm_90").runs_on(dev(9, 0)));
        assert!(arch("sm_90").runs_on(dev(10, 0)));
        assert!(arch("sm_80").runs_on(dev(8, 6)));
        assert!(!arch("sm_90").runs_on(dev(8, 0)));
        assert!(!arch("sm_86").runs_on(dev(8, 0)));
        // `a`: exactly its architecture; `f`: its family from its minor version on.
        assert!(arch("sm_90a").runs_on(dev(9, 0)));
        assert!(!arch("sm_90a").runs_on(dev(10, 0)));
        assert!(arch("sm_100f").runs_on(dev(10, 3)));
        assert!(!arch("sm_100f").runs_on(dev(12, 0)));
        assert!(!arch("sm_103f").runs_on(dev(10, 0)));
        // Extra operands after the target.
        let info = PtxInfo::parse(".version 8.0\n.target sm_80, debug\n");
        assert_eq!(info.target, Some(arch("sm_80")));
        assert!(info.entries.is_empty());
        assert_eq!(PtxInfo::parse("not ptx at all").target, None);
    }

    #[test]
    fn the_embedded_ptx_shape_parses() {
        // What rustc's NVPTX back end writes for a kernel taking one struct by value.
        let ptx =
            ".target sm_90\n.visible .entry k(\n\t.param .align 8 .b8 k_param_0[256]\n)\n{\n}\n";
        let info = PtxInfo::parse(ptx);
        assert_eq!(info.entries.get("k"), Some(&Some(256)));
    }

    /// Thousands of line comments and a block comment (the embedded PTX's shape) are all
    /// skipped, and only comments.
    #[test]
    fn many_comments_parse_quickly() {
        let mut ptx = String::from(".target sm_90\n");
        for i in 0..20_000 {
            ptx.push_str(&format!("\tmov.u32 %r{i}, 0; // @comment {i}\n"));
        }
        ptx.push_str("/* one block */ .visible .entry k(.param .u64 k_param_0) { ret; }\n");
        let info = PtxInfo::parse(&ptx);
        assert_eq!(info.entries.get("k"), Some(&Some(8)));
        assert_eq!(strip_comments("a // b\nc /* d */ e /* f"), "a  \nc   e  ");
        assert_eq!(strip_comments("/"), "/");
        assert_eq!(strip_comments("é//x"), "é ");
    }

    #[test]
    fn unterminated_text_never_panics() {
        for text in [
            ".entry",
            ".entry k(",
            ".entry k( .param .align",
            ".entry k( .param .align 3 .b8 x[2] )",
            "/* never closed .entry k()",
            ".target",
            "// only a comment",
            ".entry k( .param .b8 x[99999999999999999999999] )",
        ] {
            let _ = PtxInfo::parse(text);
        }
        assert_eq!(
            PtxInfo::parse(".entry k( .param .align 3 .b8 x[2] )").entries["k"],
            None
        );
    }
}
