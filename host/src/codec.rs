//! Little-endian byte writer and bounds-checked reader for the communicator's wire structs
//! (registered memory, endpoints, semaphores). Every read checks the remaining length, so a
//! truncated or corrupted message is an error, never a panic.

/// Appends little-endian fields.
#[derive(Default)]
pub struct Writer(pub Vec<u8>);

impl Writer {
    /// A `u8`.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    /// A `u16`.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A `u32`.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A `u64`.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Raw bytes.
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
}

/// Reads little-endian fields; every read fails cleanly past the end.
pub struct Reader<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    /// A reader over `buf`, decoding a `what` (named in errors).
    pub fn new(buf: &'a [u8], what: &'static str) -> Self {
        Self { buf, what }
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.buf.len() < n {
            return Err(format!(
                "{} truncated: needed {n} more bytes, {} left",
                self.what,
                self.buf.len()
            ));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }
    /// A `u8`.
    pub fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    /// A `u16`.
    pub fn u16(&mut self) -> Result<u16, String> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    /// A `u32`.
    pub fn u32(&mut self) -> Result<u32, String> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }
    /// A `u64`.
    pub fn u64(&mut self) -> Result<u64, String> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    /// Fails unless every byte was read.
    pub fn finish(self) -> Result<(), String> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{} has {} trailing bytes",
                self.what,
                self.buf.len()
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_truncation() {
        let mut w = Writer::default();
        w.u8(1).u16(2).u32(3).u64(4).bytes(b"xy");
        let mut r = Reader::new(&w.0, "test");
        assert_eq!(
            (r.u8(), r.u16(), r.u32(), r.u64()),
            (Ok(1), Ok(2), Ok(3), Ok(4))
        );
        assert_eq!(r.take(2), Ok(&b"xy"[..]));
        assert!(r.finish().is_ok());
        for cut in 0..w.0.len() {
            let mut r = Reader::new(&w.0[..cut], "test");
            let all = (|| {
                r.u8()?;
                r.u16()?;
                r.u32()?;
                r.u64()?;
                r.take(2)?;
                Ok::<_, String>(())
            })();
            assert!(all.is_err(), "cut at {cut} decoded");
        }
    }
}
