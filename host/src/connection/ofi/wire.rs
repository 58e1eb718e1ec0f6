//! The libfabric transport's wire formats (tables in the [module docs](super)). The
//! receiver's destination check, the rest of its trust boundary for messages, is the network
//! transports' shared one (`connection::network`).

use super::{HEADER_LEN, MAX_ADDR, MAX_MRS, MAX_NAME, MAX_REASON};
use crate::codec::{Reader, Writer};

/// Magic of an [`EndpointInfo`].
pub const INFO_MAGIC: [u8; 4] = *b"MSOF";
/// Version of an [`EndpointInfo`].
pub const INFO_VERSION: u16 = 2;
/// Bytes of one [`MrEntry`] on the wire.
pub const MR_ENTRY_LEN: usize = 4 + 8 + 8 + 8;

/// `EndpointInfo::flags`: this side accepts RMA writes into the memories of its table.
pub const FLAG_DIRECT: u8 = 1;
/// `EndpointInfo::flags`: RMA addresses are virtual addresses (`FI_MR_VIRT_ADDR`), not offsets.
pub const FLAG_VIRT_ADDR: u8 = 2;

/// One memory a side registered with its provider: what the peer writes to directly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MrEntry {
    /// The owner's `local_id` of the memory.
    pub id: u32,
    /// Its size in bytes.
    pub size: u64,
    /// The RMA address of its first byte (its address with `FLAG_VIRT_ADDR`, else 0).
    pub addr: u64,
    /// The provider's key (`fi_mr_key`).
    pub key: u64,
}

/// What one side tells the other through the bootstrap (module docs: set-up).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointInfo {
    /// Provider name (both sides must use the same).
    pub provider: String,
    /// Fabric name (both sides must use the same).
    pub fabric: String,
    /// The endpoint's address (`fi_getname`).
    pub addr: Vec<u8>,
    /// [`FLAG_DIRECT`], [`FLAG_VIRT_ADDR`].
    pub flags: u8,
    /// Payload bytes of each posted receive buffer (largest `WRITE` payload it takes).
    pub chunk: u32,
    /// Receive buffers posted for data messages: how many the peer may have in flight.
    pub slots: u16,
    /// The memories the peer may write to directly (empty without [`FLAG_DIRECT`]).
    pub mrs: Vec<MrEntry>,
}

impl EndpointInfo {
    /// Serialized form (see the module docs).
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        let cut = |s: &str| -> Vec<u8> { s.as_bytes()[..s.len().min(MAX_NAME)].to_vec() };
        let (prov, fabric) = (cut(&self.provider), cut(&self.fabric));
        let addr = &self.addr[..self.addr.len().min(MAX_ADDR)];
        let mrs = &self.mrs[..self.mrs.len().min(MAX_MRS)];
        w.bytes(&INFO_MAGIC)
            .u16(INFO_VERSION)
            .u8(prov.len() as u8)
            .bytes(&prov)
            .u8(fabric.len() as u8)
            .bytes(&fabric)
            .u16(addr.len() as u16)
            .bytes(addr)
            .u8(self.flags)
            .u32(self.chunk)
            .u16(self.slots)
            .u16(mrs.len() as u16);
        for m in mrs {
            w.u32(m.id).u64(m.size).u64(m.addr).u64(m.key);
        }
        w.0
    }

    /// Parses and checks a peer's info: magic, version, lengths, flags, a chunk of at least
    /// one byte and at most [`CHUNK`](super::CHUNK), at least two slots, at most [`MAX_MRS`]
    /// memories of non-zero size with distinct ids, and the exact length.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let mut r = Reader::new(bytes, "libfabric endpoint");
        if r.take(4)? != INFO_MAGIC {
            return Err("wrong magic".into());
        }
        let version = r.u16()?;
        if version != INFO_VERSION {
            return Err(format!("version {version}, expected {INFO_VERSION}"));
        }
        let n = usize::from(r.u8()?);
        if n > MAX_NAME {
            return Err(format!("provider name of {n} bytes"));
        }
        let provider =
            String::from_utf8(r.take(n)?.to_vec()).map_err(|_| "provider name is not UTF-8")?;
        let n = usize::from(r.u8()?);
        if n > MAX_NAME {
            return Err(format!("fabric name of {n} bytes"));
        }
        let fabric =
            String::from_utf8(r.take(n)?.to_vec()).map_err(|_| "fabric name is not UTF-8")?;
        let n = usize::from(r.u16()?);
        if n == 0 || n > MAX_ADDR {
            return Err(format!("address of {n} bytes (1 to {MAX_ADDR} allowed)"));
        }
        let addr = r.take(n)?.to_vec();
        let flags = r.u8()?;
        if flags & !(FLAG_DIRECT | FLAG_VIRT_ADDR) != 0 {
            return Err(format!("unknown flag bits {flags:#04x}"));
        }
        let chunk = r.u32()?;
        if chunk == 0 || chunk as usize > super::CHUNK {
            return Err(format!(
                "chunk of {chunk} bytes (1 to {} allowed)",
                super::CHUNK
            ));
        }
        let slots = r.u16()?;
        if slots < 2 {
            return Err(format!("{slots} receive slots (at least 2)"));
        }
        let count = usize::from(r.u16()?);
        if count > MAX_MRS {
            return Err(format!("{count} memories (at most {MAX_MRS})"));
        }
        if count > 0 && flags & FLAG_DIRECT == 0 {
            return Err("a memory table without the direct flag".into());
        }
        let mut mrs: Vec<MrEntry> = Vec::with_capacity(count);
        for _ in 0..count {
            let m = MrEntry {
                id: r.u32()?,
                size: r.u64()?,
                addr: r.u64()?,
                key: r.u64()?,
            };
            if m.size == 0 || m.addr.checked_add(m.size).is_none() {
                return Err(format!(
                    "memory {} of {} bytes at {:#x}",
                    m.id, m.size, m.addr
                ));
            }
            if mrs.iter().any(|o| o.id == m.id) {
                return Err(format!("memory {} twice", m.id));
            }
            mrs.push(m);
        }
        r.finish()?;
        Ok(Self {
            provider,
            fabric,
            addr,
            flags,
            chunk,
            slots,
            mrs,
        })
    }
}

/// A message between the two sides (the 40-byte header; `WRITE` and `ERROR` carry a payload
/// after it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame {
    /// `len` bytes follow, for memory `id` of the receiver at `offset`.
    Write {
        /// Sequence number.
        seq: u64,
        /// Destination `local_id`.
        id: u32,
        /// The destination's network key (`RegisteredMemory::key`).
        key: u64,
        /// Offset in the destination.
        offset: u64,
        /// Payload bytes.
        len: u64,
    },
    /// Store `value` into the 8-byte word at `offset` of memory `id`, after every earlier frame.
    Update {
        /// Sequence number.
        seq: u64,
        /// Destination `local_id`.
        id: u32,
        /// The destination's network key (`RegisteredMemory::key`).
        key: u64,
        /// Offset of the word (8-byte aligned).
        offset: u64,
        /// The value.
        value: u64,
    },
    /// Answer with a credit once every earlier frame is applied.
    Flush {
        /// Sequence number.
        seq: u64,
    },
    /// The sender is dropping the connection.
    Bye {
        /// Sequence number.
        seq: u64,
    },
    /// The receiver has applied `applied` data frames (all of sequence numbers below it).
    Credit {
        /// Data frames applied.
        applied: u64,
    },
    /// The receiver refused a frame; `len` bytes of UTF-8 reason follow.
    Error {
        /// Bytes of the reason.
        len: u64,
    },
}

/// Tag of data frames (`WRITE`, `UPDATE`, `FLUSH`, `BYE`): matched to the large receive buffers.
pub const TAG_DATA: u64 = 0x4d53_4f46_0000_0001;
/// Tag of control frames (`CREDIT`, `ERROR`): matched to the small receive buffers.
pub const TAG_CTRL: u64 = 0x4d53_4f46_0000_0002;

impl Frame {
    /// The 40-byte header: `op u8 | 0 u8 ×3 | id u32 | seq u64 | offset u64 | len/value u64 |
    /// key u64`.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let (op, id, seq, offset, last, key) = match *self {
            Frame::Write {
                seq,
                id,
                key,
                offset,
                len,
            } => (1u8, id, seq, offset, len, key),
            Frame::Update {
                seq,
                id,
                key,
                offset,
                value,
            } => (2, id, seq, offset, value, key),
            Frame::Flush { seq } => (3, 0, seq, 0, 0, 0),
            Frame::Bye { seq } => (4, 0, seq, 0, 0, 0),
            Frame::Credit { applied } => (0x81, 0, applied, 0, 0, 0),
            Frame::Error { len } => (0x82, 0, 0, 0, len, 0),
        };
        let mut b = [0u8; HEADER_LEN];
        b[0] = op;
        b[4..8].copy_from_slice(&id.to_le_bytes());
        b[8..16].copy_from_slice(&seq.to_le_bytes());
        b[16..24].copy_from_slice(&offset.to_le_bytes());
        b[24..32].copy_from_slice(&last.to_le_bytes());
        b[32..40].copy_from_slice(&key.to_le_bytes());
        b
    }

    /// Parses a header: a known op, reserved bytes zero, words that op leaves zero zero, a
    /// `WRITE` of 1 to `chunk` bytes, an `ERROR` of at most [`MAX_REASON`] bytes.
    pub fn decode(b: &[u8; HEADER_LEN], chunk: u64) -> Result<Self, String> {
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        if b[1..4] != [0, 0, 0] {
            return Err("reserved header bytes are not zero".into());
        }
        let id = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        let (seq, offset, last, key) = (u64_at(8), u64_at(16), u64_at(24), u64_at(32));
        let zero = |what: &str, v: u64| {
            if v == 0 {
                Ok(())
            } else {
                Err(format!("{what} carries a non-zero unused word"))
            }
        };
        match b[0] {
            1 => {
                if last == 0 || last > chunk {
                    return Err(format!("WRITE of {last} bytes (1 to {chunk} allowed)"));
                }
                Ok(Frame::Write {
                    seq,
                    id,
                    key,
                    offset,
                    len: last,
                })
            }
            2 => Ok(Frame::Update {
                seq,
                id,
                key,
                offset,
                value: last,
            }),
            3 => {
                zero("FLUSH", u64::from(id) | offset | last | key)?;
                Ok(Frame::Flush { seq })
            }
            4 => {
                zero("BYE", u64::from(id) | offset | last | key)?;
                Ok(Frame::Bye { seq })
            }
            0x81 => {
                zero("CREDIT", u64::from(id) | offset | last | key)?;
                Ok(Frame::Credit { applied: seq })
            }
            0x82 => {
                zero("ERROR", u64::from(id) | seq | offset | key)?;
                if last > MAX_REASON as u64 {
                    return Err(format!("ERROR reason of {last} bytes"));
                }
                Ok(Frame::Error { len: last })
            }
            op => Err(format!("unknown frame op {op:#04x}")),
        }
    }

    /// The sequence number of a data frame.
    pub fn seq(&self) -> Option<u64> {
        match *self {
            Frame::Write { seq, .. }
            | Frame::Update { seq, .. }
            | Frame::Flush { seq }
            | Frame::Bye { seq } => Some(seq),
            Frame::Credit { .. } | Frame::Error { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> EndpointInfo {
        EndpointInfo {
            provider: "tcp;ofi_rxm".into(),
            fabric: "127.0.0.1/32".into(),
            addr: vec![2, 0, 0x1f, 0x90, 127, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0],
            flags: FLAG_DIRECT,
            chunk: 1 << 16,
            slots: 8,
            mrs: vec![
                MrEntry {
                    id: 3,
                    size: 4096,
                    addr: 0,
                    key: 77,
                },
                MrEntry {
                    id: 9,
                    size: 16,
                    addr: 0,
                    key: u64::MAX,
                },
            ],
        }
    }

    #[test]
    fn endpoint_info_round_trip_and_rejection() {
        let i = info();
        let b = i.encode();
        assert_eq!(EndpointInfo::decode(&b).unwrap(), i);
        for cut in 0..b.len() {
            assert!(
                EndpointInfo::decode(&b[..cut]).is_err(),
                "truncated at {cut}"
            );
        }
        let mut long = b.clone();
        long.push(0);
        assert!(EndpointInfo::decode(&long).is_err());
        let reencode = |f: &dyn Fn(&mut EndpointInfo)| {
            let mut i = info();
            f(&mut i);
            EndpointInfo::decode(&i.encode())
        };
        assert!(
            reencode(&|i| i.flags = 0).is_err(),
            "a table without the direct flag"
        );
        assert!(reencode(&|i| i.flags = 0x80).is_err());
        assert!(reencode(&|i| i.chunk = 0).is_err());
        assert!(reencode(&|i| i.chunk = super::super::CHUNK as u32 + 1).is_err());
        assert!(reencode(&|i| i.slots = 1).is_err());
        assert!(reencode(&|i| i.addr.clear()).is_err());
        assert!(reencode(&|i| i.mrs[1].id = 3).is_err(), "duplicate id");
        assert!(reencode(&|i| i.mrs[0].size = 0).is_err());
        assert!(
            reencode(&|i| i.mrs[0].addr = u64::MAX).is_err(),
            "range wraps"
        );
        assert!(reencode(&|i| i.mrs.clear()).is_ok());
        let mut wrong = b;
        wrong[0] ^= 1;
        assert!(EndpointInfo::decode(&wrong).is_err());
    }

    #[test]
    fn frames_round_trip_and_rejection() {
        let frames = [
            Frame::Write {
                seq: 5,
                id: 2,
                key: 0x1234_5678_9abc_def0,
                offset: 64,
                len: 100,
            },
            Frame::Update {
                seq: 6,
                id: 1,
                key: 3,
                offset: 8,
                value: u64::MAX,
            },
            Frame::Flush { seq: 7 },
            Frame::Bye { seq: 8 },
            Frame::Credit { applied: 9 },
            Frame::Error { len: 12 },
        ];
        for f in frames {
            assert_eq!(Frame::decode(&f.encode(), 100).unwrap(), f);
        }
        assert_eq!(frames[0].seq(), Some(5));
        assert_eq!(frames[4].seq(), None);
        assert!(
            Frame::decode(
                &Frame::Write {
                    seq: 0,
                    id: 0,
                    key: 0,
                    offset: 0,
                    len: 101
                }
                .encode(),
                100
            )
            .is_err()
        );
        assert!(
            Frame::decode(
                &Frame::Write {
                    seq: 0,
                    id: 0,
                    key: 0,
                    offset: 0,
                    len: 0
                }
                .encode(),
                100
            )
            .is_err()
        );
        assert!(
            Frame::decode(
                &Frame::Error {
                    len: MAX_REASON as u64 + 1
                }
                .encode(),
                100
            )
            .is_err()
        );
        for (i, f) in frames.iter().enumerate() {
            let mut b = f.encode();
            b[2] = 1;
            assert!(
                Frame::decode(&b, 100).is_err(),
                "reserved byte of frame {i}"
            );
        }
        let mut b = Frame::Flush { seq: 1 }.encode();
        b[20] = 1;
        assert!(Frame::decode(&b, 100).is_err(), "FLUSH with an offset");
        let mut b = Frame::Bye { seq: 1 }.encode();
        b[39] = 1;
        assert!(Frame::decode(&b, 100).is_err(), "BYE with a key");
        let mut b = Frame::Credit { applied: 1 }.encode();
        b[4] = 1;
        assert!(Frame::decode(&b, 100).is_err(), "CREDIT with an id");
        let mut b = [0u8; HEADER_LEN];
        b[0] = 5;
        assert!(Frame::decode(&b, 100).is_err(), "unknown op");
    }
}
