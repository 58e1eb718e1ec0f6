//! The world's key: where it comes from ([`Keying`]) and where a bootstrap keeps it once it is
//! known ([`KeyCell`]).
//!
//! The root draws a random *job nonce* when it starts and hands it out in every `CHALLENGE`
//! (wire protocol v4). A world's key is its unique id's secret as it is (32 random bytes), or,
//! for a plain root address with `MSCCLPP_SECRET`, Argon2id of the passphrase salted with
//! [`salt`]: the root address and the job nonce (`crate::auth::Passphrase`). The root knows
//! both at start; a rank learns the job nonce from the root's challenge when it joins, derives
//! the key, checks the root's tag with it, and stores the key in its [`KeyCell`] *before* it
//! sends its `JOIN`. Every rank's `JOIN` reaches the root before any rank gets the table, and
//! a rank opens links only after the table: so every link handshake finds the key of the rank
//! it connects to already set. (A connection that arrives before is a stranger's, and is told
//! `REJECT Busy`.)
//!
//! Shared word: the [`KeyCell`] (a `OnceLock`), set once by the thread that joins, read by the
//! rank's I/O thread (its listener's challenges) and by callers that open links; the lock's
//! own ordering publishes the key.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use super::wire;
use crate::auth::{Nonce, Passphrase, Secret};

/// Where a world's key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Keying {
    /// 32 bytes used as they are: a unique id's random secret, a secret set in code, or the
    /// public one of a world without a secret.
    Fixed(Secret),
    /// `MSCCLPP_SECRET`: the key is derived at set-up from it and the root's job nonce.
    Passphrase(Passphrase),
}

impl Keying {
    /// The key of the world whose root listens at `root` and handed out `job` (derived for
    /// a passphrase: about 0.1 s the first time in this process).
    pub fn key(&self, root: SocketAddr, job: &Nonce) -> Result<Secret, String> {
        match self {
            Keying::Fixed(s) => Ok(*s),
            Keying::Passphrase(p) => p.derive(&salt(root, job)),
        }
    }
}

/// The key every handshake of a world is keyed with, and the job nonce of its root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WorldKey {
    /// The key.
    pub key: Secret,
    /// The root's job nonce (every `CHALLENGE` carries it).
    pub job: Nonce,
}

/// A bootstrap's world key, set once it is known (module docs).
pub(crate) type KeyCell = Arc<OnceLock<WorldKey>>;

/// A cell holding `key` from the start (the root's; a one-rank world's).
pub(crate) fn known(key: WorldKey) -> KeyCell {
    let cell = KeyCell::default();
    let _ = cell.set(key);
    cell
}

/// The key of a world whose root listens at `root`, handed out the job nonce `job` (in its
/// `CHALLENGE`s) and was started with `passphrase` (`MSCCLPP_SECRET`): Argon2id salted with a
/// label, the root address and the job nonce (`crate::auth::Passphrase`; about 0.1 s). What a
/// rank derives when it joins; public for tools and tests that check a captured challenge.
pub fn passphrase_key(
    passphrase: &Passphrase,
    root: SocketAddr,
    job: &Nonce,
) -> crate::Result<Secret> {
    passphrase
        .derive(&salt(root, job))
        .map_err(|e| crate::Error::BootstrapConfig(format!("deriving the world key: {e}")))
}

/// The salt of a passphrase's key: a label, the root's address (24 bytes, as on the wire) and
/// the job nonce.
pub(crate) fn salt(root: SocketAddr, job: &Nonce) -> Vec<u8> {
    let mut s = b"mscclpp-rs world key v1 ".to_vec();
    wire::put_addr(&mut s, &root);
    s.extend_from_slice(&job.0);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_passphrase_key_depends_on_the_address_and_the_job_nonce() {
        let p = Keying::Passphrase(Passphrase::new("a passphrase long enough for this").unwrap());
        let (a, b): (SocketAddr, SocketAddr) = (
            "10.0.0.1:5000".parse().unwrap(),
            "10.0.0.1:5001".parse().unwrap(),
        );
        let (j1, j2) = (Nonce([1; 32]), Nonce([2; 32]));
        let k = p.key(a, &j1).unwrap();
        assert_eq!(p.key(a, &j1).unwrap(), k);
        assert_ne!(p.key(a, &j2).unwrap(), k, "another job");
        assert_ne!(p.key(b, &j1).unwrap(), k, "another address");
        let fixed = Secret::random().unwrap();
        assert_eq!(Keying::Fixed(fixed).key(a, &j1).unwrap(), fixed);
        assert_eq!(Keying::Fixed(fixed).key(b, &j2).unwrap(), fixed);
        assert_ne!(salt(a, &j1), salt(a, &j2));
        let cell = known(WorldKey { key: k, job: j1 });
        assert_eq!(cell.get().map(|w| w.job), Some(j1));
    }
}
