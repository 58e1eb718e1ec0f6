//! Mutual challenge–response authentication over a per-world secret, for every handshake that
//! admits a peer (the bootstrap's JOIN and peer links, the Ethernet transport's HELLO, and any
//! other transport that opens its own connections).
//!
//! A world's key is a [`Secret`]: 32 random bytes (a unique id's), or derived from a
//! [`Passphrase`] (`MSCCLPP_SECRET`) with Argon2id, salted with the world's address and the
//! root's job nonce ([`Passphrase`]: slow on purpose, so that a captured challenge does not
//! let an outsider guess the passphrase offline at speed).
//!
//! Both sides prove that they know the same [`Secret`] without sending it: each draws a fresh
//! random [`Nonce`], and each answers with an HMAC-SHA-256 tag (the `hmac` and `sha2` crates,
//! not hand-rolled crypto) over a *transcript* that binds the protocol, the role of the prover,
//! the identities the caller puts in the context, and both nonces. Tags are compared in
//! constant time ([`verify`]).
//!
//! # The exchange (what a protocol built on this module sends)
//!
//! | step | from → to | carries |
//! |---|---|---|
//! | 1 | connector → acceptor | its nonce `Nc` and the context (who it is, whom it wants, for what) |
//! | 2 | acceptor → connector | its nonce `Na` and `tag(Acceptor, context, Nc, Na)` |
//! | 3 | connector → acceptor | `tag(Connector, context ‖ request, Nc, Na)` and the request |
//!
//! The connector checks step 2 before it sends anything that matters (so a stranger that binds
//! the root's port learns nothing and hands out no forged table); the acceptor checks step 3
//! before it answers, queues, or hands out anything (so a peer without the secret gets nothing:
//! no table, no frames, no connection). A tag covers both nonces, so a tag seen on one
//! connection is worth nothing on another (replay), and the role label makes an acceptor's tag
//! useless as a connector's (reflection).
//!
//! # What this does not do
//!
//! There is no encryption and no per-frame integrity: once a handshake is done, the bytes of
//! that connection are plain TCP. It keeps out peers that do not hold the secret; it does not
//! protect against an attacker that can read or rewrite the traffic on the path (use an
//! isolated network, or a VPN/IPsec between the nodes, for that). Every rank of a world holds
//! the same secret, so a rank can claim to be another rank of its own world.
//!
//! # API
//!
//! ```
//! # use mscclpp_host::auth::{Nonce, Role, Secret, tag, verify};
//! let secret = Secret::random().unwrap();
//! let context = b"example v1 | from 3 | to 5";
//! let (nc, na) = (Nonce::random().unwrap(), Nonce::random().unwrap());
//! let t = tag(&secret, Role::Acceptor, context, &nc, &na);
//! assert!(verify(&secret, Role::Acceptor, context, &nc, &na, &t));
//! assert!(!verify(&secret, Role::Connector, context, &nc, &na, &t));
//! ```

mod passphrase;

use std::fmt;
use std::io;

use hmac::digest::KeyInit;
use hmac::digest::generic_array::GenericArray;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// Bytes of a [`Secret`].
pub const SECRET_LEN: usize = 32;
/// Bytes of a [`Nonce`].
pub const NONCE_LEN: usize = 32;
/// Bytes of a tag ([`tag`]).
pub const TAG_LEN: usize = 32;
pub use passphrase::{
    KDF_MEMORY_KIB, KDF_PASSES, MIN_PASSPHRASE_LEN, Passphrase, STRONG_BITS, STRONG_DISTINCT,
    STRONG_LEN, derive as derive_from_passphrase,
};

type HmacSha256 = Hmac<Sha256>;

/// A world's shared secret: 32 bytes, from the kernel's random source ([`Secret::random`]), a
/// unique id, or derived from a [`Passphrase`] (`MSCCLPP_SECRET`). Its `Debug` form does not
/// show it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Secret([u8; SECRET_LEN]);

impl Secret {
    /// A fresh random secret.
    pub fn random() -> io::Result<Self> {
        let mut k = [0u8; SECRET_LEN];
        crate::random::fill(&mut k)?;
        Ok(Self(k))
    }

    /// The secret of these bytes (as a unique id carries them).
    pub fn from_bytes(bytes: [u8; SECRET_LEN]) -> Self {
        Self(bytes)
    }

    /// A secret that anyone can compute from `public` (for worlds started without one: the
    /// handshakes run the same way, but prove nothing; see the bootstrap's docs).
    pub fn public(public: &[u8]) -> Self {
        let mut h = Sha256::new();
        h.update(b"mscclpp-rs public secret v1");
        h.update((public.len() as u64).to_le_bytes());
        h.update(public);
        Self(h.finalize().into())
    }

    /// The 32 bytes (to put into a unique id).
    pub fn to_bytes(&self) -> [u8; SECRET_LEN] {
        self.0
    }

    /// A secret for one purpose, derived from this one (so that keys of different protocols
    /// never coincide): HMAC(secret, label).
    pub fn derive_for(&self, label: &[u8]) -> Secret {
        let mut m = self.mac();
        m.update(b"derive ");
        m.update(label);
        Secret(m.finalize().into_bytes().into())
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC pads a key shorter than SHA-256's 64-byte block with zeros; doing it here gives
        // the same MAC through the infallible fixed-size constructor.
        let mut block = [0u8; 64];
        block[..SECRET_LEN].copy_from_slice(&self.0);
        <HmacSha256 as KeyInit>::new(GenericArray::from_slice(&block))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// A fresh random value of one handshake side.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Nonce(pub [u8; NONCE_LEN]);

impl Nonce {
    /// A nonce from the kernel's random source.
    pub fn random() -> io::Result<Self> {
        let mut n = [0u8; NONCE_LEN];
        crate::random::fill(&mut n)?;
        Ok(Self(n))
    }
}

/// Which side a tag proves.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Role {
    /// The side that opened the connection.
    Connector,
    /// The side that accepted it.
    Acceptor,
}

/// The tag by which `role` proves that it knows `secret`, over `context` (the caller's
/// identities and request, in its own fixed encoding) and both nonces.
pub fn tag(
    secret: &Secret,
    role: Role,
    context: &[u8],
    connector: &Nonce,
    acceptor: &Nonce,
) -> [u8; TAG_LEN] {
    transcript(secret, role, context, connector, acceptor)
        .finalize()
        .into_bytes()
        .into()
}

/// Whether `got` is `role`'s tag over this transcript; compares in constant time.
pub fn verify(
    secret: &Secret,
    role: Role,
    context: &[u8],
    connector: &Nonce,
    acceptor: &Nonce,
    got: &[u8],
) -> bool {
    transcript(secret, role, context, connector, acceptor)
        .verify_slice(got)
        .is_ok()
}

fn transcript(
    secret: &Secret,
    role: Role,
    context: &[u8],
    connector: &Nonce,
    acceptor: &Nonce,
) -> HmacSha256 {
    let mut m = secret.mac();
    m.update(b"mscclpp-rs auth v1 ");
    m.update(match role {
        Role::Connector => b"connector",
        Role::Acceptor => b"acceptor\0",
    });
    m.update(&(context.len() as u64).to_le_bytes());
    m.update(context);
    m.update(&connector.0);
    m.update(&acceptor.0);
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_bind_secret_role_context_and_both_nonces() {
        let s = Secret::random().unwrap();
        let other = Secret::random().unwrap();
        let (a, b) = (Nonce::random().unwrap(), Nonce::random().unwrap());
        let t = tag(&s, Role::Connector, b"ctx", &a, &b);
        assert!(verify(&s, Role::Connector, b"ctx", &a, &b, &t));
        assert!(!verify(&other, Role::Connector, b"ctx", &a, &b, &t));
        assert!(!verify(&s, Role::Acceptor, b"ctx", &a, &b, &t));
        assert!(!verify(&s, Role::Connector, b"ctx2", &a, &b, &t));
        assert!(!verify(&s, Role::Connector, b"ctx", &b, &a, &t));
        assert!(!verify(&s, Role::Connector, b"ctx", &a, &b, &t[..31]));
        let mut flipped = t;
        flipped[7] ^= 1;
        assert!(!verify(&s, Role::Connector, b"ctx", &a, &b, &flipped));
        assert_ne!(a, b, "two nonces were equal");
    }

    #[test]
    fn public_secrets_and_labels() {
        let p = Secret::public(b"a long enough passphrase");
        assert_eq!(p, Secret::public(b"a long enough passphrase"));
        assert_ne!(p, Secret::public(b"another long passphrase"));
        assert_ne!(p.derive_for(b"x"), p.derive_for(b"y"));
        assert_eq!(format!("{p:?}"), "Secret(..)");
        let b = Secret::from_bytes(p.to_bytes());
        assert_eq!(b, p);
    }
}
