//! Property tests of the proxy's trigger validator (`port_channel::validate_trigger`, which
//! `PortChannelService` applies to every 128-bit trigger it pops before acting on it): random
//! triggers, valid triggers with random bit flips, and valid triggers pushed to the edges of
//! their memories, against random tables. Every verdict is compared with an independent oracle
//! that unpacks the two words by the layout table of `mscclpp_shared::trigger` (not by the
//! accessors the validator uses): an out-of-range trigger (unknown semaphore or memory id,
//! `offset + size` beyond a registered size, no type bit) is never accepted, a valid one is
//! always accepted with exactly its fields, and nothing panics. A deterministic generator keeps
//! failures reproducible (the case is printed on failure).

use mscclpp_host::Error;
use mscclpp_host::error::ProxyError;
use mscclpp_host::port_channel::{TriggerCopy, validate_trigger};
use mscclpp_shared::trigger::{MAX_MEMORY_ID, MAX_OFFSET, MAX_SEMAPHORE_ID, MAX_SIZE};
use mscclpp_shared::{ProxyTrigger, TriggerFields, TriggerType};

/// xorshift64*: small, deterministic, good enough to scramble bits.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A proxy's tables: registered memory sizes by id, and the semaphore count.
struct Tables {
    sizes: Vec<u64>,
    semaphores: usize,
}

impl Tables {
    /// A random table: up to 6 memories (sizes from empty to beyond what 32-bit fields reach)
    /// and up to 4 semaphores; sometimes a full table of 512 memories and 1024 semaphores.
    fn random(rng: &mut Rng) -> Self {
        let size = |rng: &mut Rng| match rng.below(6) {
            0 => 0,
            1 => 1 + rng.below(64),
            2 => 4096,
            3 => MAX_OFFSET,
            4 => 1 << 33,
            _ => rng.below(1 << 34),
        };
        if rng.below(20) == 0 {
            return Self {
                sizes: (0..=MAX_MEMORY_ID).map(|_| size(rng)).collect(),
                semaphores: MAX_SEMAPHORE_ID as usize + 1,
            };
        }
        let n = rng.below(7) as usize;
        Self {
            sizes: (0..n).map(|_| size(rng)).collect(),
            semaphores: rng.below(5) as usize,
        }
    }
}

/// The fields of `t`, unpacked by the layout table (independently of the accessors).
fn unpack(t: ProxyTrigger) -> TriggerFields {
    let (fst, snd) = (t.fst, t.snd);
    TriggerFields {
        size: fst & 0xffff_ffff,
        src_offset: fst >> 32,
        dst_offset: snd & 0xffff_ffff,
        src_memory_id: ((snd >> 32) & 0x1ff) as u32,
        dst_memory_id: ((snd >> 41) & 0x1ff) as u32,
        kind: TriggerType::from_bits(((snd >> 50) & 0x7) as u8).expect("3 bits"),
        semaphore_id: ((snd >> 53) & 0x3ff) as u32,
    }
}

/// The oracle: whether the proxy may act on `t` with `tables`.
fn acceptable(t: ProxyTrigger, tables: &Tables) -> bool {
    let f = unpack(t);
    let registered = |id: u32| tables.sizes.get(id as usize).copied();
    let inside = |id: u32, offset: u64| {
        registered(id).is_some_and(|len| u128::from(offset) + u128::from(f.size) <= len.into())
    };
    !f.kind.is_empty()
        && (f.semaphore_id as usize) < tables.semaphores
        && (!f.kind.contains(TriggerType::DATA)
            || (inside(f.src_memory_id, f.src_offset) && inside(f.dst_memory_id, f.dst_offset)))
}

/// Validates `t` and checks the verdict (and, when accepted, every field) against the oracle.
/// Returns whether it was accepted.
fn check(t: ProxyTrigger, tables: &Tables, case: &str) -> bool {
    let got = validate_trigger(t, &tables.sizes, tables.semaphores, 7);
    let want = acceptable(t, tables);
    let f = unpack(t);
    match got {
        Ok(v) => {
            assert!(
                want,
                "{case}: accepted {t:?} ({f:?}) with memories {:?} and {} semaphores",
                tables.sizes, tables.semaphores
            );
            assert_eq!(v.kind, f.kind, "{case}");
            assert_eq!(v.semaphore, f.semaphore_id as usize, "{case}");
            let copy = f.kind.contains(TriggerType::DATA).then_some(TriggerCopy {
                dst: f.dst_memory_id as usize,
                dst_offset: f.dst_offset,
                src: f.src_memory_id as usize,
                src_offset: f.src_offset,
                size: f.size,
            });
            assert_eq!(v.copy, copy, "{case}");
            true
        }
        Err(Error::Proxy(ProxyError::InvalidTrigger { pos, fault })) => {
            assert!(
                !want,
                "{case}: refused the valid {t:?} ({f:?}): {fault}; memories {:?}, {} semaphores",
                tables.sizes, tables.semaphores
            );
            assert_eq!(pos, 7, "{case}: the error names another FIFO position");
            false
        }
        Err(e) => panic!("{case}: not an InvalidTrigger error: {e}"),
    }
}

/// A valid trigger for `tables`, if it has a semaphore (and, for DATA, a memory).
fn valid(rng: &mut Rng, tables: &Tables) -> Option<ProxyTrigger> {
    if tables.semaphores == 0 {
        return None;
    }
    let mut kind = TriggerType::from_bits(1 + rng.below(7) as u8)?;
    let semaphore_id = rng.below(tables.semaphores as u64) as u32;
    let mut f = TriggerFields {
        kind,
        semaphore_id,
        ..TriggerFields::default()
    };
    if tables.sizes.is_empty() {
        kind = TriggerType::from_bits(kind.bits() & !1).filter(|k| !k.is_empty())?;
        f.kind = kind;
    }
    if kind.contains(TriggerType::DATA) {
        let (src, dst) = (
            rng.below(tables.sizes.len() as u64) as usize,
            rng.below(tables.sizes.len() as u64) as usize,
        );
        let room = tables.sizes[src].min(tables.sizes[dst]).min(MAX_SIZE);
        let size = if rng.below(4) == 0 {
            room // as large as fits
        } else {
            rng.below(room + 1)
        };
        let at = |rng: &mut Rng, len: u64| {
            let slack = (len - size).min(MAX_OFFSET);
            if rng.below(3) == 0 {
                slack // ends exactly at the end of the memory
            } else {
                rng.below(slack + 1)
            }
        };
        f.src_memory_id = src as u32;
        f.dst_memory_id = dst as u32;
        f.size = size;
        f.src_offset = at(rng, tables.sizes[src]);
        f.dst_offset = at(rng, tables.sizes[dst]);
    } else {
        // Fields a FLAG/SYNC trigger does not use may hold anything.
        f.size = rng.below(MAX_SIZE + 1);
        f.src_offset = rng.below(MAX_OFFSET + 1);
        f.src_memory_id = rng.below(u64::from(MAX_MEMORY_ID) + 1) as u32;
    }
    let t = ProxyTrigger::new(f).expect("the fields fit");
    Some(t.with_commit_bit(rng.below(2)))
}

const ROUNDS: usize = 20_000;

#[test]
fn random_triggers_are_judged_like_the_oracle() {
    let mut rng = Rng(0x7419_9e37);
    let (mut accepted, mut refused) = (0, 0);
    for i in 0..ROUNDS {
        let tables = Tables::random(&mut rng);
        // Mostly small fields, so that some random triggers are valid.
        let mask = |rng: &mut Rng, bits: u32| rng.next() & ((1u64 << bits) - 1);
        let t = match rng.below(3) {
            0 => ProxyTrigger {
                fst: rng.next(),
                snd: rng.next(),
            },
            _ => {
                let size_bits = 1 + rng.below(13) as u32;
                let (size, off) = (mask(&mut rng, size_bits), mask(&mut rng, 12));
                let snd = mask(&mut rng, 12)
                    | (rng.below(8) << 32)
                    | (rng.below(8) << 41)
                    | (rng.below(8) << 50)
                    | (rng.below(6) << 53)
                    | (rng.below(2) << 63);
                ProxyTrigger {
                    fst: size | (off << 32),
                    snd,
                }
            }
        };
        if check(t, &tables, &format!("random case {i}")) {
            accepted += 1;
        } else {
            refused += 1;
        }
    }
    println!("random: {accepted} accepted, {refused} refused");
    assert!(accepted > ROUNDS / 50, "too few valid cases: {accepted}");
    assert!(refused > ROUNDS / 2, "too few invalid cases: {refused}");
}

#[test]
fn valid_triggers_are_accepted_and_mutations_judged_like_the_oracle() {
    let mut rng = Rng(0xdead_beef_f00d);
    let (mut valid_seen, mut mutated_refused, mut mutated_accepted) = (0, 0, 0);
    for i in 0..ROUNDS {
        let tables = Tables::random(&mut rng);
        let Some(t) = valid(&mut rng, &tables) else {
            continue;
        };
        valid_seen += 1;
        assert!(
            check(t, &tables, &format!("valid case {i}")),
            "a valid trigger was refused"
        );
        // One to three flipped bits anywhere in the 128 (the commit bit included).
        let mut m = t;
        for _ in 0..1 + rng.below(3) {
            let bit = rng.below(128);
            if bit < 64 {
                m.fst ^= 1 << bit;
            } else {
                m.snd ^= 1 << (bit - 64);
            }
        }
        if check(m, &tables, &format!("mutated case {i}")) {
            mutated_accepted += 1;
        } else {
            mutated_refused += 1;
        }
    }
    println!(
        "valid: {valid_seen} accepted; mutated: {mutated_accepted} accepted, {mutated_refused} refused"
    );
    assert!(valid_seen > ROUNDS / 2, "too few valid cases: {valid_seen}");
    assert!(
        mutated_refused > valid_seen / 10,
        "mutations hardly ever made a trigger invalid: {mutated_refused}"
    );
}

#[test]
fn edges_of_every_field() {
    // One memory of 4096 bytes and one of 2^32 - 1, two semaphores.
    let tables = Tables {
        sizes: vec![4096, MAX_OFFSET],
        semaphores: 2,
    };
    let data = |size, src_offset, dst_offset, src, dst, sem| {
        ProxyTrigger::new(TriggerFields {
            size,
            src_offset,
            dst_offset,
            src_memory_id: src,
            dst_memory_id: dst,
            kind: TriggerType::DATA | TriggerType::FLAG,
            semaphore_id: sem,
        })
        .expect("fits")
    };
    let cases = [
        (data(4096, 0, 0, 0, 0, 1), true),
        (data(1, 4095, 4095, 0, 0, 0), true),
        (data(0, 4096, 4096, 0, 0, 0), true),
        (data(1, 4096, 0, 0, 0, 0), false),
        (data(1, 0, 4096, 0, 0, 0), false),
        (data(4097, 0, 0, 0, 1, 0), false),
        (data(MAX_SIZE, 0, 0, 1, 1, 0), true),
        (data(MAX_SIZE, 1, 0, 1, 1, 0), false),
        (data(1, MAX_OFFSET, 0, 1, 1, 0), false),
        (data(MAX_SIZE, MAX_OFFSET, MAX_OFFSET, 1, 1, 0), false),
        (data(1, 0, 0, 2, 0, 0), false),
        (data(1, 0, 0, 0, MAX_MEMORY_ID, 0), false),
        (data(1, 0, 0, 0, 0, 2), false),
        (data(1, 0, 0, 0, 0, MAX_SEMAPHORE_ID), false),
        (ProxyTrigger::signal(1).expect("fits"), true),
        (ProxyTrigger::flush(2).expect("fits"), false),
        (ProxyTrigger::default(), false),
        (
            ProxyTrigger {
                fst: u64::MAX,
                snd: u64::MAX,
            },
            false,
        ),
    ];
    for (i, (t, want)) in cases.into_iter().enumerate() {
        assert_eq!(
            acceptable(t, &tables),
            want,
            "the oracle is wrong on edge {i}"
        );
        assert_eq!(check(t, &tables, &format!("edge {i}")), want, "edge {i}");
    }
}
