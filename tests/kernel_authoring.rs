//! What a kernel author runs into, on the backend under test (CPU in CI; CUDA with
//! `MSCCLPP_BACKEND=cuda`): kernel names and parameter sizes checked against the PTX on every
//! backend, `kernel_spec!`, the block-wide votes and the dynamic shared-memory size a kernel
//! sees, a kernel that uses shared memory its launch did not give, and pairwise set-up calls
//! made in a different order on the two ends.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use mscclpp::DEVICE_PTX;
use mscclpp::host::Error;
use mscclpp::host::bootstrap::{BootstrapConfig, TcpBootstrap, UniqueId};
use mscclpp::host::communicator::Communicator;
use mscclpp::host::connection::EndpointConfig;
use mscclpp::host::gpu::{BackendKind, KernelSpec, LaunchConfig};
use mscclpp::host::transport::Transport;
use mscclpp::kernels;
use mscclpp::shared::{BlockSumParams, BlockVoteParams, CopyParams, DevicePtr};
use mscclpp_test_support::{backend, gpu, module};

#[test]
fn a_misspelt_kernel_name_fails_on_every_backend() {
    let m = module(&gpu(0), DEVICE_PTX);
    let typo = KernelSpec::<CopyParams>::new("copy_kernl", mscclpp::device::kernels::copy_kernel);
    match m.kernel(typo) {
        Err(Error::MissingKernel { name }) => assert_eq!(name, "copy_kernl"),
        Err(e) => panic!("expected MissingKernel, got {e}"),
        Ok(_) => panic!("a kernel the PTX does not have was found"),
    }
    // Every registered kernel is there, under the name its spec gives.
    m.kernel(kernels::COPY).expect("copy_kernel");
    m.kernel(kernels::BLOCK_VOTE).expect("block_vote_kernel");
}

#[test]
fn a_wrong_parameter_struct_fails_on_every_backend() {
    let m = module(&gpu(0), DEVICE_PTX);
    // copy_kernel takes a CopyParams (32 bytes); a BlockVoteParams is 24.
    let wrong = KernelSpec::<BlockVoteParams>::new(
        "copy_kernel",
        mscclpp::device::kernels::block_vote_kernel,
    );
    match m.kernel(wrong) {
        Err(Error::ParamSize {
            name,
            expected,
            got,
        }) => assert_eq!((name.as_str(), expected, got), ("copy_kernel", 32, 24)),
        Err(e) => panic!("expected ParamSize, got {e}"),
        // The CUDA driver reports parameter sizes from CUDA 12.4 on; the CPU backend always.
        Ok(_) if backend() == BackendKind::Cuda => {
            eprintln!("NOT RUN: this CUDA driver does not report parameter sizes (before 12.4)")
        }
        Ok(_) => panic!("the CPU backend did not check the parameter size"),
    }
}

#[test]
fn kernel_spec_names_the_entry_point_after_the_function() {
    const COPY: KernelSpec<CopyParams> =
        mscclpp::kernel_spec!(mscclpp::device::kernels::copy_kernel);
    const VOTE: KernelSpec<BlockVoteParams> =
        mscclpp::kernel_spec!(mscclpp::device::kernels::block_vote_kernel);
    assert_eq!(
        (COPY.name, VOTE.name),
        (kernels::COPY.name, "block_vote_kernel")
    );
    let m = module(&gpu(0), DEVICE_PTX);
    m.kernel(COPY).expect("copy_kernel by kernel_spec!");
    m.kernel(VOTE).expect("block_vote_kernel by kernel_spec!");
}

/// `block_vote_kernel` on 3 blocks of 70 threads (two full warps and a short one): every
/// thread gets its block's or / and / count, and the shared-memory size its launch gave.
#[test]
fn block_votes_and_the_shared_memory_size() {
    let g = gpu(0);
    let m = module(&g, DEVICE_PTX);
    let k = m.kernel(kernels::BLOCK_VOTE).unwrap();
    let stream = g.stream().unwrap();
    let (grid, block) = (3usize, 70usize);
    // Block 0: nobody; block 1: everybody; block 2: every seventh thread, from thread 3.
    let input: Vec<u32> = (0..grid * block)
        .map(|g| match g / block {
            0 => 0,
            1 => 1 + g as u32,
            _ => u32::from(g % block % 7 == 3),
        })
        .collect();
    let inp = g.alloc(input.len() * 4).unwrap();
    inp.copy_from_host(0, bytemuck::cast_slice(&input)).unwrap();
    let out = g.alloc(input.len() * 16).unwrap();
    for smem in [0u32, 48] {
        out.copy_from_host(0, &vec![0xa5; input.len() * 16])
            .unwrap();
        let params = BlockVoteParams {
            status: DevicePtr::NULL,
            input: inp.ptr().cast(),
            output: out.ptr().cast(),
        };
        let cfg = LaunchConfig::new(grid as u32, block as u32).with_shared_mem(smem);
        // SAFETY: `input` holds grid*block u32, `output` four times as many.
        unsafe { stream.launch(&k, cfg, params) }.unwrap();
        stream.synchronize().unwrap();
        let mut got = vec![0u32; input.len() * 4];
        out.copy_to_host(0, bytemuck::cast_slice_mut(&mut got))
            .unwrap();
        for (b, preds) in input.chunks(block).enumerate() {
            let count = preds.iter().filter(|&&p| p != 0).count() as u32;
            let want = [
                u32::from(count > 0),
                u32::from(count == block as u32),
                count,
                smem,
            ];
            for t in 0..block {
                let g = b * block + t;
                assert_eq!(
                    got[4 * g..4 * g + 4],
                    want,
                    "block {b} thread {t} (or, and, count, smem) with {smem} B shared"
                );
            }
        }
    }
}

/// A kernel that uses dynamic shared memory launched without any: on the CPU backend a typed
/// launch error that names the fix (it was a crash on a null pointer).
#[test]
fn a_kernel_without_its_shared_memory_is_a_typed_error() {
    if backend() == BackendKind::Cuda {
        eprintln!(
            "NOT RUN: on a GPU the kernel's shared-memory access faults, which would end the \
             CUDA context this test binary shares (the CPU backend's check is what is tested)"
        );
        return;
    }
    let g = gpu(0);
    let m = module(&g, DEVICE_PTX);
    let k = m.kernel(kernels::BLOCK_SUM).unwrap();
    let stream = g.stream().unwrap();
    let inp = g.alloc(64 * 4).unwrap();
    let out = g.alloc(4).unwrap();
    let params = BlockSumParams {
        status: DevicePtr::NULL,
        input: inp.ptr().cast(),
        output: out.ptr().cast(),
        n_per_block: 64,
        reserved: 0,
    };
    // block_sum_kernel needs block_dim * 4 bytes of shared memory; none is given.
    // SAFETY: the buffers hold what the kernel reads and writes; the kernel stops at its first
    // use of the missing shared memory.
    let launched = unsafe { stream.launch(&k, LaunchConfig::new(1, 32), params) };
    let err = launched
        .and_then(|()| stream.synchronize())
        .expect_err("a launch without its shared memory succeeded");
    let text = mscclpp::ErrorChain(&err).to_string();
    assert!(
        text.contains("with_shared_mem") && text.contains("block_sum_kernel"),
        "{text}"
    );
    // The stream still works afterwards.
    let ok = LaunchConfig::new(1, 32).with_shared_mem(32 * 4);
    // SAFETY: as above, now with the shared memory the kernel needs.
    unsafe { stream.launch(&k, ok, params) }.unwrap();
    stream.synchronize().unwrap();
}

/// Rank 0 connects first and exchanges memories second; rank 1 the other way round. Each
/// waits for the other's half of another call until the bootstrap's deadline, and the error
/// says which call, peer and tag (it used to be a bare "recv timed out").
#[test]
fn set_up_calls_in_another_order_time_out_naming_the_call() {
    const TAG: u64 = 7;
    let (id, listener) = UniqueId::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let mut listener = Some(listener);
    let both_done = Barrier::new(2);
    let results: Vec<Error> = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..2)
            .map(|r| {
                let root = if r == 0 { listener.take() } else { None };
                let both_done = &both_done;
                s.spawn(move || {
                    let cfg = BootstrapConfig::new(r, 2, id)
                        .with_timeout(Duration::from_secs(30))
                        .with_op_timeout(Duration::from_secs(2));
                    let bootstrap = match root {
                        Some(l) => TcpBootstrap::init_with_root_listener(cfg, l),
                        None => TcpBootstrap::init(cfg),
                    }
                    .expect("bootstrap");
                    let comm = Communicator::new(Arc::new(bootstrap), gpu(r)).expect("comm");
                    let peer = 1 - r;
                    let transport = Transport::local_for(comm.gpu().kind());
                    let buf = comm.gpu().alloc(64).expect("alloc");
                    let mem = comm.register_buffer(&buf, transport).expect("register");
                    let connect = || comm.connect(EndpointConfig::new(transport), peer, TAG);
                    let exchange = || {
                        comm.send_memory(&mem, peer, TAG)?;
                        comm.recv_memory(peer, TAG)
                    };
                    let err = if r == 0 {
                        connect().and_then(|_| exchange().map(drop))
                    } else {
                        exchange().and_then(|_| connect().map(drop))
                    }
                    .expect_err("the set-up completed in mismatched orders");
                    // Stay until both have their error: an early exit would close the
                    // bootstrap and turn the other's timeout into "peer closed".
                    both_done.wait();
                    err
                })
            })
            .collect();
        ranks.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, (err, want_op)) in results.iter().zip(["connect", "recv_memory"]).enumerate() {
        match err {
            Error::SetupTimeout {
                rank,
                peer,
                op,
                tag,
                ..
            } => {
                assert_eq!((*rank, *peer, *op, *tag), (r, 1 - r, want_op, TAG), "{err}");
            }
            other => panic!("rank {r}: expected SetupTimeout, got {other}"),
        }
        let text = err.to_string();
        assert!(
            text.contains("(tag 7)") && text.contains("same order"),
            "{text}"
        );
    }
}
