//! Fuzz target: every decoder of the bootstrap's wire frames (`mscclpp_host::bootstrap::wire`),
//! the authenticated handshake's (`Hello`, `Challenge`, `Join`, `Proof`) and notices included.
//! The first byte picks the decoder (and a world size for the size-dependent ones); the rest
//! is the input. Decoders must never panic; a body that decodes must re-encode to exactly the
//! bytes it came from (no two encodings of one value, nothing ignored).
#![no_main]

use libfuzzer_sys::fuzz_target;
use mscclpp_host::bootstrap::wire;

/// `frame` (header + body, from an `encode`) without its control header.
fn body_of(frame: &[u8]) -> &[u8] {
    &frame[wire::CONTROL_HEADER_LEN..]
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, input)) = data.split_first() else {
        return;
    };
    let size = 1 + usize::from(pick >> 4);
    match pick & 0x0f {
        0 => {
            if let Ok(h) = <&[u8; wire::CONTROL_HEADER_LEN]>::try_from(input) {
                let _ = wire::ControlHeader::decode(h);
            }
        }
        1 => {
            if let Ok(h) = <&[u8; wire::DATA_HEADER_LEN]>::try_from(input)
                && let Ok(d) = wire::DataHeader::decode(h)
            {
                assert_eq!(&d.encode(), h, "DataHeader re-encodes differently");
            }
        }
        2 => {
            if let Ok(j) = wire::Join::decode(input) {
                assert_eq!(body_of(&j.encode()), input, "Join re-encodes differently");
            }
        }
        3 => {
            if let Ok(t) = wire::Table::decode(input, size) {
                assert_eq!(t.entries.len(), size);
                assert_eq!(body_of(&t.encode()), input, "Table re-encodes differently");
            }
        }
        4 => {
            if let Ok(a) = wire::Abort::decode(input, size) {
                assert!(a.ranks.iter().all(|&r| r < size), "Abort names rank ≥ size");
            }
        }
        5 => {
            if let Ok(h) = wire::Hello::decode(input) {
                assert_eq!(h.body(), input, "Hello re-encodes differently");
            }
        }
        6 => {
            if let Ok(a) = wire::Accept::decode(input) {
                assert_eq!(body_of(&a.encode()), input, "Accept re-encodes differently");
            }
        }
        7 => {
            let _ = wire::Reject::decode(input);
        }
        8 => {
            if let Ok(c) = wire::Challenge::decode(input) {
                assert_eq!(
                    body_of(&c.encode()),
                    input,
                    "Challenge re-encodes differently"
                );
            }
        }
        9 => {
            if let Ok(p) = wire::Proof::decode(input) {
                assert_eq!(body_of(&p.encode()), input, "Proof re-encodes differently");
            }
        }
        10 => {
            if let Ok(n) = wire::Notice::decode(input, size) {
                assert!(n.rank < size, "Notice names rank ≥ size");
                if std::str::from_utf8(&input[8..]).is_ok() {
                    assert_eq!(n.encode(), input, "Notice re-encodes differently");
                }
            }
        }
        _ => {
            let _ = wire::decode_addr(input);
        }
    }
});
