//! A passphrase (`MSCCLPP_SECRET`) and the slow, salted derivation of a world's key from it.
//!
//! Anyone who can reach a listener of a world receives a `CHALLENGE`, whose tag is keyed by the
//! world's key: one captured challenge lets an outsider test guesses of the passphrase offline,
//! as fast as it can compute keys. So the key of a passphrase is not a hash of it but
//! **Argon2id** (the `argon2` crate of RustCrypto; RFC 9106) with [`KDF_MEMORY_KIB`] (64 MiB) of
//! memory, [`KDF_PASSES`] passes and one lane: about 0.1 s and 64 MiB for each guess, on any
//! machine a guesser can rent, where an unsalted SHA-256 cost a microsecond. The salt is the
//! world's root address and a random *job nonce* the root draws at start and hands out in
//! every `CHALLENGE` (bootstrap protocol v4): guesses made against one job, or tables computed
//! in advance for one address, are worth nothing against another job.
//!
//! The cost is paid once per process and world ([`Passphrase::derive`] keeps the last few
//! keys; ranks that are threads of one process derive once): by the root when it starts, and
//! by every rank when the root's challenge tells it the job nonce. A unique id carries 32
//! random bytes, which are the key as they are: no derivation, no cost.
//!
//! Even so, a guessable passphrase falls: ten thousand guesses of a common one cost an hour of
//! one core. [`Passphrase::weakness`] says what makes one weak (the set-up warns once per
//! process). What `MSCCLPP_SECRET` should be: 32 random bytes, as 64 hex characters
//! (`mscclpp-run --bootstrap` makes one; `openssl rand -hex 32` too).

use std::fmt;
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use super::{SECRET_LEN, Secret};
use crate::sync::lock;

/// Shortest passphrase accepted at all ([`Passphrase::new`]).
pub const MIN_PASSPHRASE_LEN: usize = 16;
/// Argon2id memory cost, in KiB (64 MiB).
pub const KDF_MEMORY_KIB: u32 = 64 * 1024;
/// Argon2id passes over the memory.
pub const KDF_PASSES: u32 = 2;
/// Shortest passphrase not called weak.
pub const STRONG_LEN: usize = 32;
/// Fewest distinct characters in a passphrase not called weak.
pub const STRONG_DISTINCT: usize = 10;
/// Fewest bits, by the character-class estimate of [`Passphrase::weakness`], of a passphrase
/// not called weak.
pub const STRONG_BITS: f64 = 128.0;
/// Keys [`Passphrase::derive`] keeps for the process.
const KEPT: usize = 8;

/// A key [`Passphrase::derive`] keeps: the passphrase's fingerprint, the salt, the key.
type Kept = ([u8; 32], Vec<u8>, Secret);

/// A world's passphrase. Its `Debug` form does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Passphrase(String);

impl Passphrase {
    /// A passphrase of at least [`MIN_PASSPHRASE_LEN`] bytes (`None` when shorter).
    pub fn new(text: &str) -> Option<Self> {
        (text.len() >= MIN_PASSPHRASE_LEN).then(|| Self(text.to_owned()))
    }

    /// What makes this passphrase weak, if anything: shorter than [`STRONG_LEN`] characters,
    /// fewer than [`STRONG_DISTINCT`] distinct characters, or under [`STRONG_BITS`] bits when
    /// each character counts for the classes it is drawn from (decimal digits alone 3.3 bits,
    /// hex digits 4; else lower-case, upper-case, digits and others together). The estimate is generous to
    /// phrases of words (`correct horse battery staple plus` passes and is guessable): 32
    /// random bytes are what to use.
    pub fn weakness(&self) -> Option<String> {
        let s = &self.0;
        let chars = s.chars().count();
        if chars < STRONG_LEN {
            return Some(format!(
                "it is {chars} characters long, fewer than {STRONG_LEN}"
            ));
        }
        let mut seen: Vec<char> = s.chars().collect();
        seen.sort_unstable();
        seen.dedup();
        if seen.len() < STRONG_DISTINCT {
            return Some(format!(
                "it has only {} distinct characters (fewer than {STRONG_DISTINCT})",
                seen.len()
            ));
        }
        let bits = chars as f64 * alphabet(s).log2();
        if bits < STRONG_BITS {
            return Some(format!(
                "its characters carry about {bits:.0} bits, fewer than {STRONG_BITS:.0}"
            ));
        }
        None
    }

    /// The world key for `salt` (the bootstrap's: its label, the root's address and the job
    /// nonce): Argon2id (module docs). Keys are kept for the process (the last few), so ranks
    /// of one process derive a world's key once; the others wait for it.
    pub fn derive(&self, salt: &[u8]) -> Result<Secret, String> {
        static KEPT_KEYS: Mutex<Vec<Kept>> = Mutex::new(Vec::new());
        let fingerprint: [u8; 32] = Sha256::new()
            .chain_update(b"mscclpp-rs passphrase fingerprint ")
            .chain_update(self.0.as_bytes())
            .finalize()
            .into();
        // Held while deriving: a second rank of this process waits for the first's key.
        let mut kept = lock(&KEPT_KEYS);
        if let Some((_, _, k)) = kept.iter().find(|(f, s, _)| *f == fingerprint && s == salt) {
            return Ok(*k);
        }
        let key = derive(self.0.as_bytes(), salt)?;
        if kept.len() >= KEPT {
            kept.remove(0);
        }
        kept.push((fingerprint, salt.to_vec(), key));
        Ok(key)
    }
}

impl fmt::Debug for Passphrase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Passphrase(..)")
    }
}

/// Argon2id of `password` and `salt` with the module's parameters (no cache).
pub fn derive(password: &[u8], salt: &[u8]) -> Result<Secret, String> {
    let params = argon2::Params::new(KDF_MEMORY_KIB, KDF_PASSES, 1, Some(SECRET_LEN))
        .map_err(|e| format!("Argon2 parameters: {e}"))?;
    let kdf = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
    let mut out = [0u8; SECRET_LEN];
    kdf.hash_password_into(password, salt, &mut out)
        .map_err(|e| format!("Argon2id: {e}"))?;
    Ok(Secret::from_bytes(out))
}

/// How many symbols the characters of `s` are drawn from, by class.
fn alphabet(s: &str) -> f64 {
    if s.chars().all(|c| c.is_ascii_digit()) {
        return 10.0;
    }
    let hex = |c: char| c.is_ascii_digit() || ('a'..='f').contains(&c);
    let hex_upper = |c: char| c.is_ascii_digit() || ('A'..='F').contains(&c);
    if s.chars().all(hex) || s.chars().all(hex_upper) {
        return 16.0;
    }
    let mut n = 0.0;
    if s.chars().any(|c| c.is_ascii_lowercase()) {
        n += 26.0;
    }
    if s.chars().any(|c| c.is_ascii_uppercase()) {
        n += 26.0;
    }
    if s.chars().any(|c| c.is_ascii_digit()) {
        n += 10.0;
    }
    if s.chars().any(|c| !c.is_ascii_alphanumeric()) {
        n += 33.0;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_depend_on_passphrase_and_salt_and_repeat() {
        let p = Passphrase::new("a passphrase that is long enough").unwrap();
        let q = Passphrase::new("another passphrase, long enough").unwrap();
        let t = std::time::Instant::now();
        let k = derive(b"a passphrase that is long enough", b"salt of job 1").unwrap();
        println!(
            "KDF Argon2id m={KDF_MEMORY_KIB} KiB t={KDF_PASSES}: {:?}",
            t.elapsed()
        );
        assert_eq!(
            p.derive(b"salt of job 1").unwrap(),
            k,
            "the cache changes nothing"
        );
        assert_eq!(p.derive(b"salt of job 1").unwrap(), k, "a kept key");
        assert_ne!(p.derive(b"salt of job 2").unwrap(), k, "another job nonce");
        assert_ne!(q.derive(b"salt of job 1").unwrap(), k, "another passphrase");
        assert_ne!(k, Secret::public(b"a passphrase that is long enough"));
        assert_eq!(format!("{p:?}"), "Passphrase(..)");
        assert!(
            derive(b"x", b"short").is_err(),
            "a salt under 8 bytes is refused"
        );
    }

    #[test]
    fn short_repetitive_and_low_entropy_passphrases_are_weak() {
        assert!(Passphrase::new("fifteen chars!!").is_none());
        let weak = |s: &str| Passphrase::new(s).unwrap().weakness();
        assert!(weak("sixteen chars ok").unwrap().contains("fewer than 32"));
        assert!(weak(&"ab".repeat(20)).unwrap().contains("distinct"));
        // 32 hex digits: 128 bits, just enough; 31 lower-case letters and a digit: not.
        assert_eq!(weak("0123456789abcdef0123456789abcdef"), None);
        assert!(weak("0123456789abcdef0123456789abcde").is_some());
        assert!(
            weak("11111111112222222222333333333344")
                .unwrap()
                .contains("distinct")
        );
        // 32 random bytes as hex (what mscclpp-run makes), and as mixed text.
        assert_eq!(
            weak("9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"),
            None
        );
        assert_eq!(weak("Tr0ub4dor&3-Tr0ub4dor&3-xkcd-936!"), None);
        assert!(
            weak("0123456789012345678901234567890123")
                .unwrap()
                .contains("bits")
        );
    }
}
