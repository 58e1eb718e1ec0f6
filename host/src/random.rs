//! Random bytes: the one place the crate asks the kernel for randomness.
//!
//! Used for the world's secret and the handshakes' nonces ([`crate::auth`]; these fail when the
//! kernel has no randomness to give), session magics ([`UniqueId`](crate::bootstrap::UniqueId)),
//! shared-memory names, registration tokens, the memories' network keys and the endpoint
//! tokens of the network transports ([`token`]: these fall back to std's per-process random
//! hasher keys, themselves from the kernel, mixed with the time and the process id, rather
//! than fail).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Read};

/// Fills `buf` with random bytes from the kernel: `getrandom(2)`, or `/dev/urandom` where the
/// system call does not exist.
pub(crate) fn fill(buf: &mut [u8]) -> io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let rest = &mut buf[filled..];
        // SAFETY: `rest` is a live, writable buffer of `rest.len()` bytes for the whole call;
        // getrandom writes at most that many bytes into it.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::ENOSYS) => return std::fs::File::open("/dev/urandom")?.read_exact(rest),
                _ => return Err(err),
            }
        }
        filled += n.unsigned_abs();
    }
    Ok(())
}

/// A random 64-bit value from the kernel ([`fill`]).
pub(crate) fn u64() -> io::Result<u64> {
    let mut v = [0u8; 8];
    fill(&mut v)?;
    Ok(u64::from_le_bytes(v))
}

/// A 64-bit value for uses that must not fail (tokens that filter stray connections, keys that
/// tell registrations apart): the kernel's randomness ([`u64`]), or, if the kernel has none to
/// give, std's per-process random hasher keys mixed with the time and the process id.
pub(crate) fn token() -> u64 {
    if let Ok(v) = u64() {
        return v;
    }
    let mut h = RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_differ() {
        let mut a = [0u8; 64];
        let mut b = [0u8; 64];
        fill(&mut a).unwrap();
        fill(&mut b).unwrap();
        assert_ne!(a, b, "two 64-byte draws were equal");
        assert_ne!(u64().unwrap(), u64().unwrap());
        assert_ne!(token(), token());
        fill(&mut []).unwrap();
    }
}
