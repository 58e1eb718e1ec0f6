//! Fuzz target: the Ethernet transport's decoders — frame headers (`Frame::decode`), the
//! connection handshake (`Handshake::decode`) and the endpoint info a peer sends through the
//! bootstrap (`EndpointInfo::decode`). The first byte picks the decoder. Never a panic; a
//! decoded header or handshake re-encodes to exactly its input; decoded info re-encodes too.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mscclpp_host::connection::ethernet::{
    EndpointInfo, Frame, HANDSHAKE_LEN, HEADER_LEN, Handshake,
};

fuzz_target!(|data: &[u8]| {
    let Some((&pick, input)) = data.split_first() else {
        return;
    };
    match pick % 3 {
        0 => {
            if let Ok(h) = <&[u8; HEADER_LEN]>::try_from(input)
                && let Ok(f) = Frame::decode(h)
            {
                assert_eq!(&f.encode(), h, "frame header re-encodes differently");
            }
        }
        1 => {
            if let Ok(h) = <&[u8; HANDSHAKE_LEN]>::try_from(input)
                && let Ok(s) = Handshake::decode(h)
            {
                assert_eq!(&s.encode(), h, "handshake re-encodes differently");
            }
        }
        _ => {
            if let Ok(info) = EndpointInfo::decode(input) {
                assert_eq!(info.encode(), input, "endpoint info re-encodes differently");
            }
        }
    }
});
