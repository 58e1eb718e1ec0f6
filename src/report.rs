//! Reporting an error at the end of a program: its message and every cause under it, readable,
//! and a failing exit status. `fn main() -> Result<(), E>` prints the error's `Debug` form
//! (`Error: NoLibcuda`) instead; end `main` with [`exit_code`] to print what went wrong:
//!
//! ```no_run
//! use std::process::ExitCode;
//!
//! type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;
//!
//! fn run() -> Result<()> {
//!     let backend = mscclpp::host::gpu::BackendKind::select()?;
//!     println!("{backend:?} backend");
//!     Ok(())
//! }
//!
//! fn main() -> ExitCode {
//!     mscclpp::exit_code(run())
//! }
//! ```
//!
//! which, for a PTX built for a newer GPU, prints
//!
//! ```text
//! my-app: error: loading module PTX text on device 0 failed
//!   caused by: the CUDA JIT rejected the module: ptxas fatal : …
//! ```
//!
//! [`ErrorChain`] writes the same chain on one line, for messages of your own
//! (`format!("rank {rank}: {}", ErrorChain(&e))`).

use std::error::Error;
use std::fmt;
use std::io::Write;
use std::process::ExitCode;

/// Displays an error and its causes on one line: `what failed: why: root cause`. A cause whose
/// text the line already holds (an error that prints its source in its own message) is not
/// repeated.
#[derive(Clone, Copy)]
pub struct ErrorChain<'a>(pub &'a (dyn Error + 'static));

impl ErrorChain<'_> {
    /// The messages of the error and of each cause, outermost first, without repeats.
    pub fn messages(&self) -> Vec<String> {
        let mut out: Vec<String> = vec![self.0.to_string()];
        let mut cause = self.0.source();
        while let Some(e) = cause {
            let text = e.to_string();
            if !text.is_empty() && !out.iter().any(|m| m.contains(&text)) {
                out.push(text);
            }
            cause = e.source();
        }
        out
    }
}

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.messages().join(": "))
    }
}

impl fmt::Debug for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Writes `program: error: message` and one `  caused by: …` line per cause to `out`.
pub fn write_report(
    out: &mut dyn Write,
    program: &str,
    error: &(dyn Error + 'static),
) -> std::io::Result<()> {
    let messages = ErrorChain(error).messages();
    let mut lines = messages.iter();
    if let Some(first) = lines.next() {
        writeln!(out, "{program}: error: {first}")?;
    }
    for cause in lines {
        writeln!(out, "  caused by: {cause}")?;
    }
    Ok(())
}

/// The end of a `main`: `Ok` is success; an error is reported on standard error (see
/// [`write_report`]; the program's name is its file name) and the status is a failure.
///
/// `E` is anything a `?` turns into a boxed error: `mscclpp::host::Error`, `std::io::Error`,
/// `Box<dyn Error + Send + Sync>`, a `String`.
pub fn exit_code<E>(result: Result<(), E>) -> ExitCode
where
    E: Into<Box<dyn Error + Send + Sync>>,
{
    exit_code_to(&mut std::io::stderr().lock(), result)
}

/// [`exit_code`], reporting to `out`.
fn exit_code_to<E>(out: &mut dyn Write, result: Result<(), E>) -> ExitCode
where
    E: Into<Box<dyn Error + Send + Sync>>,
{
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let e: Box<dyn Error + Send + Sync> = e.into();
            let program = std::env::args_os()
                .next()
                .and_then(|a| {
                    std::path::Path::new(&a)
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                })
                .unwrap_or_else(|| "mscclpp".to_string());
            // Nothing better to do if the report cannot be written than to still fail.
            let _ = write_report(out, &program, &*e);
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mscclpp_host::error::{BackendError, DriverError};

    fn jit_failure() -> mscclpp_host::Error {
        mscclpp_host::Error::ModuleLoad {
            what: "PTX text".into(),
            ordinal: 0,
            source: BackendError::Jit {
                source: DriverError {
                    call: "cuModuleLoadDataEx",
                    code: 218,
                    name: "CUDA_ERROR_INVALID_PTX".into(),
                },
                log: "ptxas fatal: bad".into(),
            },
        }
    }

    #[test]
    fn the_chain_is_every_cause_once() {
        let e = jit_failure();
        assert_eq!(
            ErrorChain(&e).to_string(),
            "loading module PTX text on device 0 failed: the CUDA JIT rejected the module: \
             ptxas fatal: bad: cuModuleLoadDataEx failed: CUDA_ERROR_INVALID_PTX (218)"
        );
        let mut out = Vec::new();
        write_report(&mut out, "my-app", &e).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "my-app: error: loading module PTX text on device 0 failed\n\
             \x20 caused by: the CUDA JIT rejected the module: ptxas fatal: bad\n\
             \x20 caused by: cuModuleLoadDataEx failed: CUDA_ERROR_INVALID_PTX (218)\n"
        );
    }

    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl fmt::Display for Outer {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "reading the id failed: {}", self.0)
            }
        }
        impl Error for Outer {
            fn source(&self) -> Option<&(dyn Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = Outer(std::io::Error::other("disk on fire"));
        assert_eq!(
            ErrorChain(&e).to_string(),
            "reading the id failed: disk on fire"
        );
    }

    #[test]
    fn exit_codes() {
        let mut out = Vec::new();
        assert_eq!(exit_code_to::<String>(&mut out, Ok(())), ExitCode::SUCCESS);
        assert!(out.is_empty());
        assert_eq!(
            exit_code_to(&mut out, Err(jit_failure())),
            ExitCode::FAILURE
        );
        let text = String::from_utf8(std::mem::take(&mut out)).unwrap();
        assert!(text.contains(": error: loading module PTX text"), "{text}");
        assert!(
            text.contains("\n  caused by: the CUDA JIT rejected"),
            "{text}"
        );
        assert_eq!(
            exit_code_to(&mut out, Err("plain text".to_string())),
            ExitCode::FAILURE
        );
        assert!(
            String::from_utf8(out)
                .unwrap()
                .ends_with(": error: plain text\n")
        );
    }
}
