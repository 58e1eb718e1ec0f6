//! Fuzz target: `RegisteredMemory::deserialize` (a peer's serialized memory) on the CPU backend,
//! as from a rank of another node (decoding only: no mapping is attempted, which keeps the
//! fuzzer from opening other processes' memory), and `validate_ipc_handle` on the first bytes
//! taken as an `IpcMemHandle`. Never a panic; an accepted memory's every reachable range lies
//! re-serializes to exactly its input; an accepted handle's range lies inside its allocation.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use mscclpp_host::gpu::{BackendKind, Gpu, validate_ipc_handle};
use mscclpp_host::registered_memory::RegisteredMemory;
use mscclpp_shared::IpcMemHandle;

fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| Gpu::open(BackendKind::Cpu, 0).expect("the CPU backend opens"))
}

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = RegisteredMemory::deserialize(data, gpu(), 1, false) {
        assert_eq!(m.serialize(), data, "re-serializes differently");
        assert!(RegisteredMemory::wire_token(data).is_some());
    }
    const N: usize = std::mem::size_of::<IpcMemHandle>();
    if let Some(raw) = data.get(..N) {
        let h: IpcMemHandle = bytemuck::pod_read_unaligned(raw);
        if validate_ipc_handle(&h, BackendKind::Cpu).is_ok() {
            assert!(h.size > 0);
            assert!(
                h.offset
                    .checked_add(h.size)
                    .is_some_and(|e| e <= h.alloc_size)
            );
        }
    }
});
