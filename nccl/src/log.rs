//! Logging for C callers: on the first call into the library, one `tracing` subscriber
//! (`mscclpp_log`, the tools' subscriber: one line per event on standard error) is installed,
//! filtered by `MSCCLPP_LOG` when set, else by NCCL's own `NCCL_DEBUG` ([`filter_for`]), and
//! the banner says which library answers: with `NCCL_DEBUG=INFO` (or `VERSION`) a line such
//! as `mscclpp-rs 0.1.0: drop-in libnccl.so.2 (NCCL API 2.32.3)` appears, which is how a user
//! tells that this library, not NVIDIA's, is loaded.

use std::sync::Once;

use crate::abi::{NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH};

/// The `tracing` target of the banner.
pub const BANNER_TARGET: &str = "mscclpp_nccl::version";

/// The `mscclpp_log` filter for `NCCL_DEBUG`'s value: `VERSION` shows the banner and the
/// warnings, `WARN` warnings, `INFO` information (banner included), `TRACE` everything; unset
/// (or anything else) keeps the library's default (warnings).
pub fn filter_for(nccl_debug: Option<&str>) -> Option<String> {
    let level = nccl_debug?.trim().to_ascii_uppercase();
    match level.as_str() {
        "VERSION" => Some(format!("warn,{BANNER_TARGET}=info")),
        "WARN" => Some("warn".into()),
        "INFO" => Some("info".into()),
        "ABORT" => Some("error".into()),
        "TRACE" => Some("trace".into()),
        _ => None,
    }
}

/// The banner's text.
pub fn banner() -> String {
    format!(
        "mscclpp-rs {}: drop-in libnccl.so.2 (NCCL API {NCCL_MAJOR}.{NCCL_MINOR}.{NCCL_PATCH}), not NVIDIA's NCCL",
        env!("CARGO_PKG_VERSION")
    )
}

/// Installs the subscriber and logs the banner, once per process. A program that already
/// installed a `tracing` subscriber of this library's copy of `tracing` keeps it.
pub fn ensure_init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let mscclpp = std::env::var(mscclpp_log::ENV)
            .ok()
            .filter(|v| !v.trim().is_empty());
        let nccl = std::env::var("NCCL_DEBUG").ok();
        let filter = mscclpp.or_else(|| filter_for(nccl.as_deref()));
        match mscclpp_log::init_with(filter.as_deref()) {
            Ok(()) | Err(mscclpp_log::Error::AlreadyInstalled { .. }) => {}
            Err(e) => eprintln!("mscclpp-nccl: {e}"),
        }
        tracing::info!(target: BANNER_TARGET, "{}", banner());
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_debug_levels_map_to_filters() {
        assert_eq!(filter_for(None), None);
        assert_eq!(filter_for(Some("info")).as_deref(), Some("info"));
        assert_eq!(filter_for(Some("WARN")).as_deref(), Some("warn"));
        assert_eq!(
            filter_for(Some("VERSION")).as_deref(),
            Some("warn,mscclpp_nccl::version=info")
        );
        assert_eq!(filter_for(Some("whatever")), None);
        for level in ["VERSION", "WARN", "INFO", "ABORT", "TRACE"] {
            let f = filter_for(Some(level)).unwrap();
            assert!(mscclpp_log::filter(Some(&f)).is_ok(), "{f}");
        }
        assert!(banner().contains("mscclpp-rs") && banner().contains("2.32.3"));
    }
}
