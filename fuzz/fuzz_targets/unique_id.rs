//! Fuzz target: `UniqueId::from_bytes` and `UniqueId::from_hex`. Never a panic; an accepted id
//! re-encodes to exactly its input (bytes), or to its input in lower case (hex).
#![no_main]

use libfuzzer_sys::fuzz_target;
use mscclpp_host::bootstrap::UniqueId;

fuzz_target!(|data: &[u8]| {
    if let Ok(id) = UniqueId::from_bytes(data) {
        assert_eq!(
            id.to_bytes().as_slice(),
            data,
            "bytes re-encode differently"
        );
    }
    if let Ok(s) = std::str::from_utf8(data)
        && let Ok(id) = UniqueId::from_hex(s)
    {
        assert_eq!(
            id.to_hex(),
            s.trim().to_ascii_lowercase(),
            "hex re-encodes differently"
        );
    }
});
