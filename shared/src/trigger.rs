//! `ProxyTrigger`: the 128-bit FIFO element a GPU thread pushes to the host proxy.
//!
//! Two little-endian `u64` words, `fst` then `snd`, bit-for-bit MSCCL++'s trigger layout (so a
//! CUDA C kernel written against MSCCL++'s format can drive our proxy):
//!
//! | word | bits   | field           |
//! |------|--------|-----------------|
//! | fst  | 0..32  | size (bytes)    |
//! | fst  | 32..64 | src_offset      |
//! | snd  | 0..32  | dst_offset      |
//! | snd  | 32..41 | src_memory_id   |
//! | snd  | 41..50 | dst_memory_id   |
//! | snd  | 50..53 | type (DATA=1, FLAG=2, SYNC=4, any combination) |
//! | snd  | 53..63 | semaphore_id    |
//! | snd  | 63     | commit bit (FIFO lap parity, written by the FIFO push, see `fifo`) |
//!
//! Unlike MSCCL++, a value that does not fit its field is never masked: [`ProxyTrigger::new`]
//! returns a [`TriggerError`] naming the field, the device API splits large sizes before
//! building triggers, and the host proxy re-validates every field it reads.

use core::fmt;

/// Bits of `fst` that hold the transfer size.
pub const SIZE_BITS: u32 = 32;
/// Bits of each offset field.
pub const OFFSET_BITS: u32 = 32;
/// Bits of each memory-id field (up to 512 registered memories per proxy).
pub const MEMORY_ID_BITS: u32 = 9;
/// Bits of the type field.
pub const TYPE_BITS: u32 = 3;
/// Bits of the semaphore-id field (up to 1024 semaphores per proxy).
pub const SEMAPHORE_ID_BITS: u32 = 10;

/// Shift of `src_offset` in `fst`.
pub const SRC_OFFSET_SHIFT: u32 = 32;
/// Shift of `src_memory_id` in `snd`.
pub const SRC_MEMORY_ID_SHIFT: u32 = 32;
/// Shift of `dst_memory_id` in `snd`.
pub const DST_MEMORY_ID_SHIFT: u32 = 41;
/// Shift of the type field in `snd`.
pub const TYPE_SHIFT: u32 = 50;
/// Shift of `semaphore_id` in `snd`.
pub const SEMAPHORE_ID_SHIFT: u32 = 53;
/// Shift of the commit (lap parity) bit in `snd`.
pub const COMMIT_SHIFT: u32 = 63;

/// Largest size one trigger can carry (bytes).
pub const MAX_SIZE: u64 = (1 << SIZE_BITS) - 1;
/// Largest offset one trigger can carry (bytes).
pub const MAX_OFFSET: u64 = (1 << OFFSET_BITS) - 1;
/// Largest memory id.
pub const MAX_MEMORY_ID: u32 = (1 << MEMORY_ID_BITS) - 1;
/// Largest semaphore id.
pub const MAX_SEMAPHORE_ID: u32 = (1 << SEMAPHORE_ID_BITS) - 1;

/// Trigger type bit: copy `size` bytes from `src` to `dst`.
pub const TRIGGER_DATA: u8 = 1;
/// Trigger type bit: signal the semaphore `semaphore_id` after earlier work.
pub const TRIGGER_FLAG: u8 = 2;
/// Trigger type bit: flush; the proxy completes the flush position once earlier work is done.
pub const TRIGGER_SYNC: u8 = 4;

const LOW32: u64 = 0xffff_ffff;
const COMMIT_MASK: u64 = 1 << COMMIT_SHIFT;

/// A set of trigger type bits (`DATA`, `FLAG`, `SYNC`, or a combination).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct TriggerType(u8);

impl TriggerType {
    /// Copy data.
    pub const DATA: Self = Self(TRIGGER_DATA);
    /// Signal.
    pub const FLAG: Self = Self(TRIGGER_FLAG);
    /// Flush.
    pub const SYNC: Self = Self(TRIGGER_SYNC);

    /// The raw bits. Values read from a FIFO may be 0 (invalid) until validated.
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// From raw bits; `None` when a bit outside the 3-bit field is set.
    pub const fn from_bits(bits: u8) -> Option<Self> {
        if bits >> TYPE_BITS == 0 {
            Some(Self(bits))
        } else {
            None
        }
    }

    /// Both sets together.
    #[must_use]
    pub const fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// Whether every bit of `other` is set in `self`.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether no bit is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl core::ops::BitOr for TriggerType {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        self.union(rhs)
    }
}

/// A trigger field that does not fit its bits. Nothing is ever masked silently.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum TriggerError {
    /// `size` exceeds 32 bits (split the transfer).
    SizeTooLarge(u64),
    /// `src_offset` exceeds 32 bits.
    SrcOffsetTooLarge(u64),
    /// `dst_offset` exceeds 32 bits.
    DstOffsetTooLarge(u64),
    /// `src_memory_id` exceeds 9 bits.
    SrcMemoryIdTooLarge(u32),
    /// `dst_memory_id` exceeds 9 bits.
    DstMemoryIdTooLarge(u32),
    /// The type is empty.
    EmptyType,
    /// `semaphore_id` exceeds 10 bits.
    SemaphoreIdTooLarge(u32),
}

impl fmt::Display for TriggerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::SizeTooLarge(v) => write!(f, "trigger size {v} does not fit 32 bits"),
            Self::SrcOffsetTooLarge(v) => write!(f, "trigger src_offset {v} does not fit 32 bits"),
            Self::DstOffsetTooLarge(v) => write!(f, "trigger dst_offset {v} does not fit 32 bits"),
            Self::SrcMemoryIdTooLarge(v) => {
                write!(f, "trigger src_memory_id {v} exceeds {MAX_MEMORY_ID}")
            }
            Self::DstMemoryIdTooLarge(v) => {
                write!(f, "trigger dst_memory_id {v} exceeds {MAX_MEMORY_ID}")
            }
            Self::EmptyType => write!(f, "trigger type has no bit set"),
            Self::SemaphoreIdTooLarge(v) => {
                write!(f, "trigger semaphore_id {v} exceeds {MAX_SEMAPHORE_ID}")
            }
        }
    }
}

impl core::error::Error for TriggerError {}

/// The fields of a trigger, unpacked.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct TriggerFields {
    /// Bytes to copy (DATA).
    pub size: u64,
    /// Byte offset into the source memory.
    pub src_offset: u64,
    /// Byte offset into the destination memory.
    pub dst_offset: u64,
    /// Proxy-local id of the source memory.
    pub src_memory_id: u32,
    /// Proxy-local id of the destination memory.
    pub dst_memory_id: u32,
    /// What to do.
    pub kind: TriggerType,
    /// Proxy-local id of the semaphore/channel.
    pub semaphore_id: u32,
}

/// The 16-byte FIFO element. `fst` holds size and source offset, `snd` the rest (module docs).
#[repr(C, align(16))]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ProxyTrigger {
    /// size | src_offset << 32
    pub fst: u64,
    /// dst_offset | src_memory_id << 32 | dst_memory_id << 41 | type << 50 | semaphore_id << 53 | commit << 63
    pub snd: u64,
}

static_assertions::assert_eq_size!(ProxyTrigger, [u64; 2]);
static_assertions::const_assert_eq!(core::mem::align_of::<ProxyTrigger>(), 16);

impl ProxyTrigger {
    /// Packs `fields`; every value is range-checked, none is masked. The commit bit is left 0:
    /// the FIFO push sets it.
    pub const fn new(fields: TriggerFields) -> Result<Self, TriggerError> {
        if fields.size > MAX_SIZE {
            return Err(TriggerError::SizeTooLarge(fields.size));
        }
        if fields.src_offset > MAX_OFFSET {
            return Err(TriggerError::SrcOffsetTooLarge(fields.src_offset));
        }
        if fields.dst_offset > MAX_OFFSET {
            return Err(TriggerError::DstOffsetTooLarge(fields.dst_offset));
        }
        if fields.src_memory_id > MAX_MEMORY_ID {
            return Err(TriggerError::SrcMemoryIdTooLarge(fields.src_memory_id));
        }
        if fields.dst_memory_id > MAX_MEMORY_ID {
            return Err(TriggerError::DstMemoryIdTooLarge(fields.dst_memory_id));
        }
        if fields.kind.is_empty() {
            return Err(TriggerError::EmptyType);
        }
        if fields.semaphore_id > MAX_SEMAPHORE_ID {
            return Err(TriggerError::SemaphoreIdTooLarge(fields.semaphore_id));
        }
        Ok(Self::pack_unchecked(fields))
    }

    /// Packs fields already known to fit (device hot path; debug builds assert).
    #[inline(always)]
    pub const fn pack_unchecked(f: TriggerFields) -> Self {
        debug_assert!(f.size <= MAX_SIZE && f.src_offset <= MAX_OFFSET);
        debug_assert!(f.dst_offset <= MAX_OFFSET);
        debug_assert!(f.src_memory_id <= MAX_MEMORY_ID && f.dst_memory_id <= MAX_MEMORY_ID);
        debug_assert!(f.semaphore_id <= MAX_SEMAPHORE_ID);
        Self {
            fst: f.size | (f.src_offset << SRC_OFFSET_SHIFT),
            snd: f.dst_offset
                | ((f.src_memory_id as u64) << SRC_MEMORY_ID_SHIFT)
                | ((f.dst_memory_id as u64) << DST_MEMORY_ID_SHIFT)
                | ((f.kind.bits() as u64) << TYPE_SHIFT)
                | ((f.semaphore_id as u64) << SEMAPHORE_ID_SHIFT),
        }
    }

    /// A signal-only trigger for `semaphore_id`.
    pub const fn signal(semaphore_id: u32) -> Result<Self, TriggerError> {
        Self::new(TriggerFields {
            size: 0,
            src_offset: 0,
            dst_offset: 0,
            src_memory_id: 0,
            dst_memory_id: 0,
            kind: TriggerType::FLAG,
            semaphore_id,
        })
    }

    /// A flush-only trigger for `semaphore_id`.
    pub const fn flush(semaphore_id: u32) -> Result<Self, TriggerError> {
        Self::new(TriggerFields {
            size: 0,
            src_offset: 0,
            dst_offset: 0,
            src_memory_id: 0,
            dst_memory_id: 0,
            kind: TriggerType::SYNC,
            semaphore_id,
        })
    }

    /// Bytes to copy.
    pub const fn size(&self) -> u64 {
        self.fst & LOW32
    }
    /// Source byte offset.
    pub const fn src_offset(&self) -> u64 {
        self.fst >> SRC_OFFSET_SHIFT
    }
    /// Destination byte offset.
    pub const fn dst_offset(&self) -> u64 {
        self.snd & LOW32
    }
    /// Source memory id.
    pub const fn src_memory_id(&self) -> u32 {
        ((self.snd >> SRC_MEMORY_ID_SHIFT) as u32) & MAX_MEMORY_ID
    }
    /// Destination memory id.
    pub const fn dst_memory_id(&self) -> u32 {
        ((self.snd >> DST_MEMORY_ID_SHIFT) as u32) & MAX_MEMORY_ID
    }
    /// Type bits (may be empty in a trigger read from a FIFO: validate before use).
    pub const fn kind(&self) -> TriggerType {
        TriggerType(((self.snd >> TYPE_SHIFT) as u8) & ((1 << TYPE_BITS) - 1))
    }
    /// Semaphore id.
    pub const fn semaphore_id(&self) -> u32 {
        ((self.snd >> SEMAPHORE_ID_SHIFT) as u32) & MAX_SEMAPHORE_ID
    }
    /// The commit bit (FIFO lap parity).
    pub const fn commit_bit(&self) -> u64 {
        self.snd >> COMMIT_SHIFT
    }
    /// This trigger with the commit bit set to `parity & 1`.
    #[inline(always)]
    #[must_use]
    pub const fn with_commit_bit(self, parity: u64) -> Self {
        Self {
            fst: self.fst,
            snd: (self.snd & !COMMIT_MASK) | ((parity & 1) << COMMIT_SHIFT),
        }
    }

    /// All fields, unpacked.
    pub const fn fields(&self) -> TriggerFields {
        TriggerFields {
            size: self.size(),
            src_offset: self.src_offset(),
            dst_offset: self.dst_offset(),
            src_memory_id: self.src_memory_id(),
            dst_memory_id: self.dst_memory_id(),
            kind: self.kind(),
            semaphore_id: self.semaphore_id(),
        }
    }
}

/// The commit bit a trigger pushed at FIFO position `pos` carries, for a FIFO of `2^log2_size`
/// slots: `((pos >> log2_size) & 1) ^ 1`, so a zeroed slot never looks committed on lap 0.
#[inline(always)]
pub const fn commit_parity(pos: u64, log2_size: u32) -> u64 {
    ((pos >> log2_size) & 1) ^ 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> TriggerFields {
        TriggerFields {
            size: 0x1122_3344,
            src_offset: 0x5566_7788,
            dst_offset: 0x99aa_bbcc,
            src_memory_id: 0x1a5, // 0b1_1010_0101
            dst_memory_id: 0x0c3, // 0b0_1100_0011
            kind: TriggerType::DATA | TriggerType::SYNC,
            semaphore_id: 0x2b7, // 0b10_1011_0111
        }
    }

    #[test]
    fn bit_positions_are_pinned() {
        let t = ProxyTrigger::new(sample()).unwrap();
        assert_eq!(t.fst, 0x5566_7788_1122_3344);
        let expect_snd: u64 =
            0x99aa_bbcc | (0x1a5u64 << 32) | (0x0c3u64 << 41) | (0b101u64 << 50) | (0x2b7u64 << 53);
        assert_eq!(t.snd, expect_snd);
        // The same value spelled as one literal, so a shift constant typo cannot cancel out.
        assert_eq!(t.snd, 0x56F5_87A5_99AA_BBCC);
        assert_eq!(t.commit_bit(), 0);
        let c = t.with_commit_bit(1);
        assert_eq!(c.snd, 0xD6F5_87A5_99AA_BBCC);
        assert_eq!(c.fields(), sample());
        assert_eq!(c.with_commit_bit(0), t);
    }

    #[test]
    fn little_endian_word_order() {
        let t = ProxyTrigger::new(sample()).unwrap();
        let bytes = bytemuck::bytes_of(&t);
        assert_eq!(&bytes[0..4], &0x1122_3344u32.to_le_bytes());
        assert_eq!(&bytes[4..8], &0x5566_7788u32.to_le_bytes());
        assert_eq!(&bytes[8..12], &0x99aa_bbccu32.to_le_bytes());
    }

    #[test]
    fn maxima_round_trip() {
        let f = TriggerFields {
            size: MAX_SIZE,
            src_offset: MAX_OFFSET,
            dst_offset: MAX_OFFSET,
            src_memory_id: MAX_MEMORY_ID,
            dst_memory_id: MAX_MEMORY_ID,
            kind: TriggerType::DATA | TriggerType::FLAG | TriggerType::SYNC,
            semaphore_id: MAX_SEMAPHORE_ID,
        };
        let t = ProxyTrigger::new(f).unwrap();
        assert_eq!(t.fst, u64::MAX);
        assert_eq!(t.snd, u64::MAX >> 1);
        assert_eq!(t.fields(), f);
    }

    #[test]
    fn out_of_range_is_an_error_not_a_mask() {
        let base = sample();
        let cases = [
            (
                TriggerFields {
                    size: 1 << 32,
                    ..base
                },
                TriggerError::SizeTooLarge(1 << 32),
            ),
            (
                TriggerFields {
                    src_offset: 1 << 32,
                    ..base
                },
                TriggerError::SrcOffsetTooLarge(1 << 32),
            ),
            (
                TriggerFields {
                    dst_offset: u64::MAX,
                    ..base
                },
                TriggerError::DstOffsetTooLarge(u64::MAX),
            ),
            (
                TriggerFields {
                    src_memory_id: 512,
                    ..base
                },
                TriggerError::SrcMemoryIdTooLarge(512),
            ),
            (
                TriggerFields {
                    dst_memory_id: 1000,
                    ..base
                },
                TriggerError::DstMemoryIdTooLarge(1000),
            ),
            (
                TriggerFields {
                    kind: TriggerType::default(),
                    ..base
                },
                TriggerError::EmptyType,
            ),
            (
                TriggerFields {
                    semaphore_id: 1024,
                    ..base
                },
                TriggerError::SemaphoreIdTooLarge(1024),
            ),
        ];
        for (fields, err) in cases {
            assert_eq!(ProxyTrigger::new(fields), Err(err));
        }
        assert_eq!(TriggerType::from_bits(8), None);
        assert_eq!(TriggerType::from_bits(7), Some(TriggerType(7)));
    }

    #[test]
    fn every_field_is_refused_one_past_its_maximum() {
        let base = sample();
        let cases = [
            (
                TriggerFields {
                    dst_offset: MAX_OFFSET + 1,
                    ..base
                },
                TriggerError::DstOffsetTooLarge(MAX_OFFSET + 1),
            ),
            (
                TriggerFields {
                    dst_memory_id: MAX_MEMORY_ID + 1,
                    ..base
                },
                TriggerError::DstMemoryIdTooLarge(MAX_MEMORY_ID + 1),
            ),
        ];
        for (fields, err) in cases {
            assert_eq!(ProxyTrigger::new(fields), Err(err));
        }
        assert_eq!(
            (MAX_SIZE, MAX_OFFSET, MAX_MEMORY_ID, MAX_SEMAPHORE_ID),
            (0xffff_ffff, 0xffff_ffff, 511, 1023)
        );
    }

    #[test]
    fn type_sets_combine_and_compare_by_bits() {
        let (data, flag, sync) = (TriggerType::DATA, TriggerType::FLAG, TriggerType::SYNC);
        assert_eq!((data.bits(), flag.bits(), sync.bits()), (1, 2, 4));
        let df = data | flag;
        assert_eq!(df.bits(), 0b011);
        // A union with a set that shares bits keeps them (an exclusive or would drop them).
        assert_eq!(df.union(flag), df);
        assert_eq!((df | data | sync).bits(), 0b111);
        assert!(df.contains(data) && df.contains(flag) && df.contains(df));
        assert!((df | sync).contains(data | sync));
        assert!(!df.contains(sync));
        assert!(!data.contains(df), "a subset contains its superset");
        assert!(df.contains(TriggerType::default()));
        assert!(TriggerType::default().is_empty());
        assert!(!data.is_empty() && !sync.is_empty());
        // Exactly the 3-bit values are types.
        for b in 0..=u8::MAX {
            assert_eq!(
                TriggerType::from_bits(b).map(TriggerType::bits),
                (b < 8).then_some(b),
                "bits {b:#x}"
            );
        }
    }

    #[test]
    fn signal_and_flush_carry_only_their_type_and_semaphore() {
        let only = |kind, semaphore_id| TriggerFields {
            kind,
            semaphore_id,
            ..TriggerFields::default()
        };
        let s = ProxyTrigger::signal(MAX_SEMAPHORE_ID).unwrap();
        assert_eq!(s.fields(), only(TriggerType::FLAG, MAX_SEMAPHORE_ID));
        assert_eq!(s.fst, 0);
        let f = ProxyTrigger::flush(0x155).unwrap();
        assert_eq!(f.fields(), only(TriggerType::SYNC, 0x155));
        assert_eq!(f.fst, 0);
        let too_big = TriggerError::SemaphoreIdTooLarge(MAX_SEMAPHORE_ID + 1);
        assert_eq!(ProxyTrigger::signal(MAX_SEMAPHORE_ID + 1), Err(too_big));
        assert_eq!(ProxyTrigger::flush(MAX_SEMAPHORE_ID + 1), Err(too_big));
    }

    #[test]
    fn the_commit_bit_is_bit_63_alone() {
        // Every other bit set: the commit bit still reads 0, and setting it touches nothing else.
        let t = ProxyTrigger {
            fst: u64::MAX,
            snd: u64::MAX >> 1,
        };
        assert_eq!(t.commit_bit(), 0);
        let c = t.with_commit_bit(3); // only the parity's lowest bit counts
        assert_eq!((c.fst, c.snd), (u64::MAX, u64::MAX));
        assert_eq!(c.commit_bit(), 1);
        assert_eq!(c.fields(), t.fields());
        assert_eq!(c.with_commit_bit(2), t);
        // And with every other bit clear.
        let z = ProxyTrigger::default().with_commit_bit(1);
        assert_eq!((z.fst, z.snd), (0, 1 << 63));
        assert_eq!(z.commit_bit(), 1);
        assert_eq!(z.fields(), TriggerFields::default());
    }

    #[test]
    fn errors_name_the_field_and_the_value() {
        use core::fmt::Write;
        /// A fixed buffer, enough for one message (`shared` has no allocator).
        struct Buf([u8; 96], usize);
        impl Write for Buf {
            fn write_str(&mut self, s: &str) -> fmt::Result {
                let end = self.1 + s.len();
                self.0
                    .get_mut(self.1..end)
                    .ok_or(fmt::Error)?
                    .copy_from_slice(s.as_bytes());
                self.1 = end;
                Ok(())
            }
        }
        let cases = [
            (TriggerError::SizeTooLarge(1 << 32), "size 4294967296 "),
            (
                TriggerError::SrcOffsetTooLarge(1 << 33),
                "src_offset 8589934592 ",
            ),
            (
                TriggerError::DstOffsetTooLarge(1 << 34),
                "dst_offset 17179869184 ",
            ),
            (
                TriggerError::SrcMemoryIdTooLarge(600),
                "src_memory_id 600 exceeds 511",
            ),
            (
                TriggerError::DstMemoryIdTooLarge(700),
                "dst_memory_id 700 exceeds 511",
            ),
            (TriggerError::EmptyType, "type has no bit set"),
            (
                TriggerError::SemaphoreIdTooLarge(2000),
                "semaphore_id 2000 exceeds 1023",
            ),
        ];
        for (err, want) in cases {
            let mut b = Buf([0; 96], 0);
            write!(b, "{err}").unwrap();
            let text = core::str::from_utf8(&b.0[..b.1]).unwrap();
            assert!(text.contains(want), "{err:?} reads {text:?}");
        }
    }

    #[test]
    fn commit_parity_alternates_per_lap() {
        // 4-slot FIFO: positions 0..4 are lap 0 (parity 1), 4..8 lap 1 (parity 0).
        let p: [u64; 9] = core::array::from_fn(|i| commit_parity(i as u64, 2));
        assert_eq!(p, [1, 1, 1, 1, 0, 0, 0, 0, 1]);
    }
}
