//! Fuzz target: `Endpoint::deserialize` (the connection endpoint a peer sends through the
//! bootstrap). Never a panic; an accepted endpoint re-serializes to exactly its input, and its
//! transport-specific bytes stay within `Endpoint::MAX_EXTRA`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mscclpp_host::connection::Endpoint;

fuzz_target!(|data: &[u8]| {
    if let Ok(e) = Endpoint::deserialize(data, 3) {
        assert!(e.extra.len() <= Endpoint::MAX_EXTRA);
        assert_eq!(e.serialize(), data, "re-serializes differently");
    }
});
