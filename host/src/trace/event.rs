//! Host events as a trace records them, and how one is written as a line of the per-rank file.

use std::borrow::Cow;
use std::fmt::Write as _;

/// What part of the library an event comes from (the `cat` of a trace event).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Category {
    /// A host API call (a collective: entry to return).
    Call,
    /// A kernel launch queued for a call (`launch` and `call` ids).
    Launch,
    /// The proxy's work on a trigger (pop, copy, signal, flush).
    Proxy,
    /// A set-up phase (bootstrap, communicator, collectives).
    Setup,
    /// Something the program marked itself ([`Trace::span`](super::Trace::span)).
    User,
}

impl Category {
    /// Its name in trace files.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Call => "call",
            Self::Launch => "launch",
            Self::Proxy => "proxy",
            Self::Setup => "setup",
            Self::User => "user",
        }
    }
}

/// The value of an event argument.
#[derive(Clone, Debug, PartialEq)]
pub enum Arg {
    /// An unsigned integer (ids, bytes, positions).
    U64(u64),
    /// A number with a fraction.
    F64(f64),
    /// Text (names, types, algorithms).
    Str(Cow<'static, str>),
}

impl From<u64> for Arg {
    fn from(v: u64) -> Self {
        Self::U64(v)
    }
}
impl From<usize> for Arg {
    fn from(v: usize) -> Self {
        Self::U64(v as u64)
    }
}
impl From<u32> for Arg {
    fn from(v: u32) -> Self {
        Self::U64(v.into())
    }
}
impl From<f64> for Arg {
    fn from(v: f64) -> Self {
        Self::F64(v)
    }
}
impl From<&'static str> for Arg {
    fn from(v: &'static str) -> Self {
        Self::Str(Cow::Borrowed(v))
    }
}
impl From<String> for Arg {
    fn from(v: String) -> Self {
        Self::Str(Cow::Owned(v))
    }
}

/// One host event: a span (`end_ns` set) or an instant.
#[derive(Clone, Debug, PartialEq)]
pub struct HostEvent {
    /// Where it comes from.
    pub cat: Category,
    /// What it is (`all_reduce`, `copy`, `join root`, …).
    pub name: Cow<'static, str>,
    /// Trace-clock ns at its start (or at the instant).
    pub start_ns: u64,
    /// Trace-clock ns at its end; `None` for an instant.
    pub end_ns: Option<u64>,
    /// Its arguments, in order.
    pub args: Vec<(&'static str, Arg)>,
}

/// Appends `s` to `out` as a JSON string.
pub(crate) fn json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Appends `args` as a JSON object.
fn json_args(out: &mut String, args: &[(&'static str, Arg)]) {
    out.push('{');
    for (i, (k, v)) in args.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        json_str(out, k);
        out.push(':');
        match v {
            Arg::U64(n) => {
                let _ = write!(out, "{n}");
            }
            // JSON has no NaN or infinity: those are written as null.
            Arg::F64(x) if x.is_finite() => {
                let _ = write!(out, "{x}");
            }
            Arg::F64(_) => out.push_str("null"),
            Arg::Str(s) => json_str(out, s),
        }
    }
    out.push('}');
}

impl HostEvent {
    /// The event as one line of the per-rank file (no newline), on thread `tid`.
    pub(crate) fn to_json_line(&self, tid: u64) -> String {
        let mut out = String::with_capacity(128);
        let kind = if self.end_ns.is_some() {
            "span"
        } else {
            "instant"
        };
        let _ = write!(out, "{{\"type\":\"{kind}\",\"tid\":{tid},\"cat\":");
        json_str(&mut out, self.cat.name());
        out.push_str(",\"name\":");
        json_str(&mut out, &self.name);
        let _ = write!(out, ",\"start_ns\":{}", self.start_ns);
        if let Some(end) = self.end_ns {
            let _ = write!(out, ",\"end_ns\":{end}");
        }
        out.push_str(",\"args\":");
        json_args(&mut out, &self.args);
        out.push('}');
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_is_one_json_object_with_escaped_text() {
        let e = HostEvent {
            cat: Category::User,
            name: Cow::Owned("a \"quoted\"\nname".into()),
            start_ns: 5,
            end_ns: Some(9),
            args: vec![
                ("bytes", 4096u64.into()),
                ("gbps", 1.5f64.into()),
                ("nan", f64::NAN.into()),
                ("algo", "ll".into()),
            ],
        };
        assert_eq!(
            e.to_json_line(3),
            r#"{"type":"span","tid":3,"cat":"user","name":"a \"quoted\"\nname","start_ns":5,"end_ns":9,"args":{"bytes":4096,"gbps":1.5,"nan":null,"algo":"ll"}}"#
        );
        let i = HostEvent {
            end_ns: None,
            args: vec![],
            ..e
        };
        assert!(
            i.to_json_line(1)
                .starts_with(r#"{"type":"instant","tid":1,"#)
        );
        assert!(!i.to_json_line(1).contains("end_ns"));
    }
}
