//! Test data that cannot collude: values are hashes of (rank, part, index), with no symmetry
//! between the three and no period along any of them, and outputs start as [`MARKER`], so an
//! element nobody wrote shows.

/// The byte outputs are filled with before the call under test: as an element of any type it
/// is no small integer the tests' data or a reduction of it makes (`0xa5a5` as f16 and bf16 is
/// a negative fraction, as f32 too; as an integer it is far out of the data's range).
pub const MARKER: u8 = 0xa5;

/// SplitMix64's finaliser: a hash with no short period and no symmetry.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A 64-bit hash of `words`, each word mixed in by a SplitMix64 step: different positions of
/// the same word give different hashes, and no word has a period.
pub fn hash(words: &[u64]) -> u64 {
    words
        .iter()
        .fold(0x6a09_e667_f3bc_c909, |h: u64, &w| mix(h.wrapping_add(w)))
}

/// `len` bytes that depend on `seed` and on each byte's index through [`hash`]: no period (a
/// copy that moves the wrong 16-byte vector, or the right one to the wrong place, shows at any
/// grid stride) and different for every seed.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (hash(&[0x7061_7474, seed as u64, i as u64]) >> 24) as u8)
        .collect()
}

/// Lower-case hex of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of lower-case (or upper-case) hex; `None` for an odd length or a non-hex digit.
pub fn from_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return None;
    }
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_depend_on_position_and_hex_round_trips() {
        assert_ne!(hash(&[1, 2]), hash(&[2, 1]));
        assert_ne!(hash(&[0]), hash(&[0, 0]));
        assert_ne!(pattern(64, 1), pattern(64, 2));
        let p = pattern(300, 7);
        assert_eq!(from_hex(&to_hex(&p)).as_deref(), Some(&p[..]));
        assert_eq!(from_hex("0aF"), None);
        assert_eq!(from_hex("zz"), None);
        // SplitMix64's first output for a zero seed.
        assert_eq!(mix(0), 0xe220_a839_7b1d_cdaf);
    }
}
