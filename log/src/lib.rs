//! # mscclpp-log
//!
//! The libraries of mscclpp-rs (`mscclpp-host`, `mscclpp`) report through [`tracing`] events
//! and never install a subscriber: which one, and where it writes, is the application's
//! choice. A program that has no Rust host of its own to make that choice calls [`init`] once
//! at start: the tools (`mscclpp-bench`, `mscclpp-run`, `mscclpp-info`) do, and so will the
//! drop-in C library (`nccl/`), whose callers are C programs. It installs one process-wide
//! subscriber that writes each event as one line on standard error, filtered by
//! `MSCCLPP_LOG` ([`ENV`]).
//!
//! `MSCCLPP_LOG` takes `tracing-subscriber`'s `EnvFilter` directives:
//!
//! | `MSCCLPP_LOG` | shows |
//! |---|---|
//! | unset or empty | warnings and errors ([`DEFAULT`]): a CUDA resource that failed to free, a peer that left, … |
//! | `off` | nothing |
//! | `info`, `debug`, `trace` (any case) | every crate's events at that level and above |
//! | `mscclpp_host=trace` | one crate (or module: `mscclpp_host::bootstrap=debug`) at a level; the rest off |
//! | `warn,mscclpp_host::proxy=trace` | comma-separated: a default level and exceptions |
//!
//! A bare word that is not a level names a target (`mscclpp_host` shows all of its events),
//! as with `RUST_LOG`.
//!
//! ```no_run
//! if let Err(e) = mscclpp_log::init() {
//!     eprintln!("my-tool: {e}"); // a bad MSCCLPP_LOG: the default filter is installed
//! }
//! tracing::warn!("shown unless MSCCLPP_LOG=off or MSCCLPP_LOG=error");
//! ```

use tracing::subscriber::SetGlobalDefaultError;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::ParseError;

/// The environment variable that selects what is shown.
pub const ENV: &str = "MSCCLPP_LOG";

/// The filter when [`ENV`] is unset or empty: warnings and errors, which the libraries emit
/// only when something went wrong that they could not return as an error (a `Drop` that
/// failed, a peer that left).
pub const DEFAULT: &str = "warn";

/// Why [`init`] or [`init_with`] did not install the requested filter.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The filter text is not a list of `EnvFilter` directives.
    #[error(
        "{ENV}={value:?} is not a log filter (a level such as `debug`, or `target=level` pairs \
         such as `mscclpp_host=trace`); logging at `{DEFAULT}`"
    )]
    Filter {
        /// The text that was rejected.
        value: String,
        /// What the parser said.
        #[source]
        source: ParseError,
    },
    /// The process already has a global `tracing` subscriber (installed by the program, or by
    /// an earlier call): it stays, and this one is not installed.
    #[error("a tracing subscriber is already installed in this process; {ENV} is not applied")]
    AlreadyInstalled {
        /// What `tracing` said.
        #[source]
        source: SetGlobalDefaultError,
    },
}

/// The filter for the value of [`ENV`] (`None` or blank: [`DEFAULT`]). Pure: installs
/// nothing.
pub fn filter(value: Option<&str>) -> Result<EnvFilter, Error> {
    let text = value.map(str::trim).filter(|v| !v.is_empty());
    EnvFilter::try_new(text.unwrap_or(DEFAULT)).map_err(|source| Error::Filter {
        value: text.unwrap_or_default().to_string(),
        source,
    })
}

/// Installs the subscriber filtered by the environment's [`ENV`]; see [`init_with`].
pub fn init() -> Result<(), Error> {
    init_with(std::env::var(ENV).ok().as_deref())
}

/// Installs the process-wide subscriber (one line per event on standard error, no colours)
/// with the filter `value` (as [`ENV`] would hold it).
///
/// An invalid `value` still installs a subscriber, with [`DEFAULT`], and returns
/// [`Error::Filter`] so that the caller can say why its setting was not used. When a global
/// subscriber already exists it is left alone and [`Error::AlreadyInstalled`] is returned.
/// Never panics.
pub fn init_with(value: Option<&str>) -> Result<(), Error> {
    let (filter, rejected) = match filter(value) {
        Ok(f) => (f, None),
        Err(e) => (EnvFilter::new(DEFAULT), Some(e)),
    };
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .finish();
    tracing::subscriber::set_global_default(subscriber)
        .map_err(|source| Error::AlreadyInstalled { source })?;
    match rejected {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;
    use tracing_subscriber::filter::LevelFilter;

    fn max(value: Option<&str>) -> Option<LevelFilter> {
        filter(value).expect("a valid filter").max_level_hint()
    }

    #[test]
    fn unset_or_blank_means_warnings() {
        assert_eq!(max(None), Some(LevelFilter::WARN));
        assert_eq!(max(Some("")), Some(LevelFilter::WARN));
        assert_eq!(max(Some("  ")), Some(LevelFilter::WARN));
    }

    #[test]
    fn levels_and_targets_are_accepted() {
        assert_eq!(max(Some("debug")), Some(LevelFilter::DEBUG));
        assert_eq!(max(Some("TRACE")), Some(LevelFilter::TRACE));
        assert_eq!(max(Some("off")), Some(LevelFilter::OFF));
        assert_eq!(max(Some("mscclpp_host=trace")), Some(LevelFilter::TRACE));
        assert_eq!(
            max(Some("warn,mscclpp_host::bootstrap=debug")),
            Some(LevelFilter::DEBUG)
        );
        assert!(
            Level::INFO > Level::WARN,
            "tracing orders levels by verbosity"
        );
    }

    #[test]
    fn bad_filters_are_refused_with_their_text() {
        for bad in ["mscclpp_host=loud", "=debug", "a[b=c"] {
            match filter(Some(bad)) {
                Err(e @ Error::Filter { .. }) => {
                    let msg = e.to_string();
                    assert!(msg.contains(ENV) && msg.contains(bad), "{msg}");
                    assert!(std::error::Error::source(&e).is_some());
                }
                Err(other) => panic!("{bad}: {other}"),
                Ok(f) => panic!("{bad}: accepted as {f}"),
            }
        }
    }
}
