//! Fuzz target: the proxy's trigger validator (`port_channel::validate_trigger`). The input is
//! a table (memory count, semaphore count, memory sizes) and a 128-bit trigger. Never a panic;
//! an accepted trigger has a type bit, a registered semaphore and, for DATA, registered
//! memories whose ranges hold `offset + size`; a refused one breaks one of those rules.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mscclpp_host::port_channel::validate_trigger;
use mscclpp_shared::{ProxyTrigger, TriggerType};

fuzz_target!(|data: &[u8]| {
    let (Some(&n_mem), Some(&n_sem)) = (data.first(), data.get(1)) else {
        return;
    };
    let mut rest = &data[2..];
    let mut word = |len: usize| -> Option<u64> {
        let (head, tail) = rest.split_at_checked(len)?;
        rest = tail;
        let mut b = [0u8; 8];
        b[..len].copy_from_slice(head);
        Some(u64::from_le_bytes(b))
    };
    let (Some(fst), Some(snd)) = (word(8), word(8)) else {
        return;
    };
    // Sizes of up to 5 bytes each: from empty to beyond what the 32-bit fields reach.
    let sizes: Vec<u64> = (0..n_mem % 8).map_while(|_| word(5)).collect();
    let semaphores = usize::from(n_sem % 8);
    let t = ProxyTrigger { fst, snd };
    let (size, so, d) = (fst & 0xffff_ffff, fst >> 32, snd & 0xffff_ffff);
    let (src, dst) = (
        ((snd >> 32) & 0x1ff) as usize,
        ((snd >> 41) & 0x1ff) as usize,
    );
    let kind = TriggerType::from_bits(((snd >> 50) & 7) as u8).expect("3 bits");
    let sem = ((snd >> 53) & 0x3ff) as usize;
    let fits = |id: usize, off: u64| sizes.get(id).is_some_and(|&len| off + size <= len);
    let want = !kind.is_empty()
        && sem < semaphores
        && (!kind.contains(TriggerType::DATA) || (fits(src, so) && fits(dst, d)));
    match validate_trigger(t, &sizes, semaphores, 0) {
        Ok(v) => {
            assert!(
                want,
                "accepted {t:?} with memories {sizes:?}, {semaphores} semaphores"
            );
            assert_eq!((v.kind, v.semaphore), (kind, sem));
            if let Some(c) = v.copy {
                assert!(c.src_offset + c.size <= sizes[c.src]);
                assert!(c.dst_offset + c.size <= sizes[c.dst]);
            }
        }
        Err(_) => assert!(
            !want,
            "refused {t:?} with memories {sizes:?}, {semaphores} semaphores"
        ),
    }
});
