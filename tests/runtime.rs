//! The device runtime, end to end, on the backend under test (CPU in CI; CUDA on a GPU machine
//! with `MSCCLPP_BACKEND=cuda`): allocation, host-mapped memory, copies, kernels with shared
//! memory and barriers, events, and IPC between two processes.

use std::io::Write;
use std::time::Duration;

use mscclpp::DEVICE_PTX;
use mscclpp::host::Error;
use mscclpp::host::gpu::{BackendKind, LaunchConfig};
use mscclpp::kernels;
use mscclpp::shared::{BlockSumParams, CopyParams, DevicePtr, IpcMemHandle};
use mscclpp_test_support as harness;
use mscclpp_test_support::MARKER;
use mscclpp_test_support::codec::Float;
use mscclpp_test_support::{from_hex, gpu, module, pattern, to_hex};

#[test]
fn embedded_ptx_has_every_kernel() {
    if mscclpp::DEVICE_PTX.is_empty() {
        // Only a build with MSCCLPP_SKIP_PTX=1 (scripts/mutants.sh) embeds an empty PTX.
        assert_eq!(std::env::var("MSCCLPP_SKIP_PTX").as_deref(), Ok("1"));
        eprintln!("NOT RUN: built with MSCCLPP_SKIP_PTX=1, no device PTX is embedded");
        return;
    }
    for name in kernels::ALL_NAMES {
        assert!(
            mscclpp::DEVICE_PTX.contains(&format!(".entry {name}(")),
            "{name} missing from DEVICE_PTX"
        );
    }
    assert!(mscclpp::DEVICE_PTX.contains(".target sm_"));
}

#[test]
fn alloc_is_zeroed_and_round_trips() {
    let g = gpu(0);
    let buf = g.alloc(1 << 20).unwrap();
    assert_eq!(buf.len(), 1 << 20);
    let mut back = vec![0xffu8; buf.len()];
    buf.copy_to_host(0, &mut back).unwrap();
    assert!(
        back.iter().all(|&b| b == 0),
        "fresh device memory is not zeroed"
    );
    let data = pattern(buf.len() - 3, 7);
    buf.copy_from_host(3, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    buf.copy_to_host(3, &mut back).unwrap();
    assert_eq!(back, data);
    assert!(matches!(
        buf.copy_from_host(buf.len() - 1, &[1, 2]),
        Err(Error::OutOfRange { .. })
    ));
}

#[test]
fn copy_kernel_from_host_mapped_memory() {
    let g = gpu(0);
    let m = module(&g, DEVICE_PTX);
    let copy = m.kernel(kernels::COPY).unwrap();
    let stream = g.stream().unwrap();
    let n = 64 * 1024 + 5;
    let host = g.alloc_host_mapped(n).unwrap();
    let data = pattern(n, 3);
    // SAFETY: `host` holds `n` bytes; no device work uses it yet.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), host.host_ptr(), n) };
    let dev = g.alloc(n + 16).unwrap();
    for (dst_off, src_off) in [(0u64, 0u64), (16, 0), (1, 3)] {
        let bytes = n as u64 - src_off;
        dev.copy_from_host(0, &vec![MARKER; dev.len()]).unwrap();
        let params = CopyParams {
            status: DevicePtr::NULL,
            dst: dev.ptr().byte_add_cast(dst_off),
            src: host.device_ptr().byte_add_cast(src_off),
            bytes,
        };
        // SAFETY: both ranges are inside their live buffers.
        unsafe { stream.launch(&copy, LaunchConfig::new(2, 64), params) }.unwrap();
        stream.synchronize().unwrap();
        let mut want = vec![MARKER; dev.len()];
        want[dst_off as usize..][..bytes as usize].copy_from_slice(&data[src_off as usize..]);
        let mut back = vec![0u8; dev.len()];
        dev.copy_to_host(0, &mut back).unwrap();
        assert_same(&back, &want, &format!("dst+{dst_off} src+{src_off}"));
    }
}

/// Compares `got` with `want` byte by byte, naming the first difference (not 100 KiB of both).
fn assert_same(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        let wrong = (i..got.len()).filter(|&j| got[j] != want[j]).count();
        panic!(
            "{what}: byte {i} is {:#04x}, not {:#04x} ({wrong} bytes wrong from there)",
            got[i], want[i]
        );
    }
}

/// The copy kernel at launch shapes like the GPU's (full warps, several warps per block, more
/// than two blocks) and small ones, at every offset pair of the two ends modulo 16 that
/// matters (both aligned: the 16-byte vector path, with four loads in flight and the tail;
/// otherwise the byte path), at lengths that end inside a vector and inside the four-vector
/// step; the destination starts as [`MARKER`] and must keep it outside the copied range.
#[test]
fn copy_kernel_every_shape_and_offset() {
    let g = gpu(0);
    let m = module(&g, DEVICE_PTX);
    let copy = m.kernel(kernels::COPY).unwrap();
    let stream = g.stream().unwrap();
    let max = 40_000;
    let src = g.alloc(max + 32).unwrap();
    let data = pattern(max + 32, 5);
    src.copy_from_host(0, &data).unwrap();
    let dst = g.alloc(max + 64).unwrap();
    for (grid, block) in [(1u32, 1u32), (3, 64), (4, 96), (5, 32)] {
        let threads = (grid * block) as usize;
        for (dst_off, src_off) in [(0usize, 0usize), (16, 32), (1, 0), (0, 7), (5, 5)] {
            // Less than one vector; two and three vectors a thread and a tail (the first
            // thread's four-vector step would end just past, or exactly at, the last vector);
            // exactly the four-vector step of this grid; three steps, one vector and a tail.
            for bytes in [
                13,
                32 * threads + 7,
                48 * threads + 5,
                64 * threads,
                3 * 64 * threads + 19,
            ] {
                let bytes = bytes.min(max);
                dst.copy_from_host(0, &vec![MARKER; dst.len()]).unwrap();
                let p = CopyParams {
                    status: DevicePtr::NULL,
                    dst: dst.ptr().byte_add_cast(dst_off as u64),
                    src: src.ptr().byte_add_cast(src_off as u64),
                    bytes: bytes as u64,
                };
                // SAFETY: both ranges are inside their live buffers.
                unsafe { stream.launch(&copy, LaunchConfig::new(grid, block), p) }.unwrap();
                stream.synchronize().unwrap();
                let mut want = vec![MARKER; dst.len()];
                want[dst_off..][..bytes].copy_from_slice(&data[src_off..][..bytes]);
                let mut got = vec![0u8; dst.len()];
                dst.copy_to_host(0, &mut got).unwrap();
                assert_same(
                    &got,
                    &want,
                    &format!("{grid}x{block}, {bytes} B, dst+{dst_off} src+{src_off}"),
                );
            }
        }
    }
}

/// The FIFO with many producers at a GPU-like launch shape (3 blocks of 2 warps) and a FIFO
/// smaller than all they push (so they wrap it many times and wait for room): every trigger
/// arrives exactly once, at consecutive positions, with its fields intact, and each thread's
/// in the order it pushed them; the push kernel ends with a clean status.
#[test]
fn fifo_many_producers_wrap_a_small_fifo() {
    use mscclpp::host::fifo::Fifo;
    use mscclpp::host::status::{DEFAULT_SPIN_LIMIT, StatusBlock};
    use mscclpp::shared::{FifoPushParams, TriggerType};
    let g = gpu(0);
    let m = module(&g, DEVICE_PTX);
    let push = m.kernel(kernels::FIFO_PUSH).unwrap();
    let stream = g.stream().unwrap();
    let status = StatusBlock::new(&g, DEFAULT_SPIN_LIMIT).unwrap();
    let (grid, block, per_thread) = (3u32, 64u32, 20u32);
    let threads = (grid * block) as usize;
    // At least as many slots as concurrent producers (the FIFO's contract).
    let mut fifo = Fifo::new(&g, 256).unwrap();
    let p = FifoPushParams {
        status: status.device_ptr(),
        fifo: fifo.device_handle(status.device_ptr()),
        per_thread,
        reserved: 0,
    };
    // SAFETY: the FIFO and the status are live until the stream is synchronized below.
    unsafe { stream.launch(&push, LaunchConfig::new(grid, block), p) }.unwrap();
    let total = threads as u64 * per_thread as u64;
    let mut next = vec![0u64; threads];
    // 0.2 s on an idle machine; the bound only turns a lost trigger into a failure.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut popped = 0u64;
    while popped < total {
        let Some((t, pos)) = fifo.poll() else {
            assert!(
                std::time::Instant::now() < deadline,
                "only {popped} of {total} triggers arrived in 30 s ({:?})",
                status.error()
            );
            std::thread::yield_now();
            continue;
        };
        assert_eq!(pos, popped, "positions are consecutive");
        let f = t.fields();
        let (tid, i) = (f.size as usize, f.src_offset);
        assert!(tid < threads, "trigger {pos} names thread {tid}");
        assert_eq!(
            i, next[tid],
            "thread {tid}'s triggers out of order at {pos}"
        );
        assert_eq!(
            (
                f.dst_offset,
                f.src_memory_id,
                f.dst_memory_id,
                f.semaphore_id
            ),
            (0, 0, 0, 0),
            "trigger {pos}'s other fields"
        );
        assert_eq!(f.kind, TriggerType::DATA, "trigger {pos}'s type");
        next[tid] += 1;
        fifo.pop();
        popped += 1;
    }
    assert!(
        stream
            .synchronize_timeout(std::time::Duration::from_secs(30))
            .unwrap()
    );
    assert!(status.error().is_none(), "{:?}", status.error());
    assert!(next.iter().all(|&n| n == per_thread as u64));
    assert!(fifo.poll().is_none(), "a trigger more than was pushed");
}

/// On the CPU backend a device wait that nobody ends gives up after `MSCCLPP_SPIN_TIMEOUT_MS`
/// (the test hook of `scripts/mutants.sh`) with a timeout recorded in the status: a FIFO push
/// into a full FIFO that no proxy drains. Runs in a child process, because the variable is read
/// once per process; the parent checks the child's verdict.
#[test]
fn spin_timeout_ends_a_lost_wait_on_the_cpu_backend() {
    const CHILD: &str = "MSCCLPP_TEST_SPIN_TIMEOUT_CHILD";
    if harness::backend() != BackendKind::Cpu {
        eprintln!("NOT RUN: MSCCLPP_SPIN_TIMEOUT_MS bounds the CPU backend's waits only");
        return;
    }
    if std::env::var_os(CHILD).is_some() {
        harness::die_with_parent();
        use mscclpp::host::fifo::Fifo;
        use mscclpp::host::status::{DEFAULT_SPIN_LIMIT, StatusBlock};
        use mscclpp::shared::{DeviceErrorCode, FifoPushParams, WaitSite};
        let g = gpu(0);
        let m = module(&g, DEVICE_PTX);
        let push = m.kernel(kernels::FIFO_PUSH).unwrap();
        let stream = g.stream().unwrap();
        let status = StatusBlock::new(&g, DEFAULT_SPIN_LIMIT).unwrap();
        let fifo = Fifo::new(&g, 4).unwrap();
        let p = FifoPushParams {
            status: status.device_ptr(),
            fifo: fifo.device_handle(status.device_ptr()),
            per_thread: 5, // one more than fits
            reserved: 0,
        };
        let start = std::time::Instant::now();
        // SAFETY: the FIFO and the status are live until the stream is synchronized.
        unsafe { stream.launch(&push, LaunchConfig::new(1, 1), p) }.unwrap();
        assert!(
            stream
                .synchronize_timeout(std::time::Duration::from_secs(30))
                .unwrap(),
            "the push still waits after 30 s"
        );
        let took = start.elapsed();
        match status.error() {
            Some(Error::Device {
                code: DeviceErrorCode::Timeout,
                site: WaitSite::FifoPush,
                ..
            }) => {}
            other => panic!("expected a FIFO push timeout, got {other:?}"),
        }
        assert!(fifo.poll().is_some(), "the first four pushes did not land");
        println!("SPIN TIMEOUT after {} ms", took.as_millis());
        return;
    }
    let end = harness::TestProcess::new("spin_timeout_ends_a_lost_wait_on_the_cpu_backend")
        .env(CHILD, "1")
        .env("MSCCLPP_SPIN_TIMEOUT_MS", "300")
        .spawn()
        .wait_for(Duration::from_secs(120));
    assert!(end.success(), "child failed:\n{}", end.text());
    let text = end.output();
    let ms: u64 = text
        .lines()
        .find_map(|l| l.split_once("SPIN TIMEOUT after ").map(|(_, r)| r))
        .and_then(|r| r.trim_end_matches(" ms").trim().parse().ok())
        .unwrap_or_else(|| panic!("the child ran no check:\n{text}"));
    // At least the bound; well under the 30 s the child allows (a loaded machine may be slow).
    assert!((300..20_000).contains(&ms), "timed out after {ms} ms");
}

#[test]
fn block_sum_uses_shared_memory_and_barriers() {
    let g = gpu(0);
    let m = module(&g, DEVICE_PTX);
    let k = m.kernel(kernels::BLOCK_SUM).unwrap();
    let stream = g.stream().unwrap();
    // A block size that is not a power of two exercises the tree's edge.
    for (grid, block, n) in [(4u32, 64u32, 1000u32), (3, 48, 777)] {
        let input: Vec<u32> = (0..grid * n)
            .map(|i| i.wrapping_mul(2_654_435_761))
            .collect();
        let inp = g.alloc(input.len() * 4).unwrap();
        inp.copy_from_host(0, bytemuck::cast_slice(&input)).unwrap();
        let out = g.alloc(grid as usize * 4).unwrap();
        let params = BlockSumParams {
            status: DevicePtr::NULL,
            input: inp.ptr().cast(),
            output: out.ptr().cast(),
            n_per_block: n,
            reserved: 0,
        };
        let cfg = LaunchConfig::new(grid, block).with_shared_mem(block * 4);
        // SAFETY: `input` holds grid*n u32, `output` grid u32, shared memory block*4 bytes.
        unsafe { stream.launch(&k, cfg, params) }.unwrap();
        stream.synchronize().unwrap();
        let mut got = vec![0u32; grid as usize];
        out.copy_to_host(0, bytemuck::cast_slice_mut(&mut got))
            .unwrap();
        let want: Vec<u32> = input
            .chunks(n as usize)
            .map(|c| c.iter().fold(0u32, |a, &x| a.wrapping_add(x)))
            .collect();
        assert_eq!(got, want, "grid {grid} block {block}");
    }
}

#[test]
fn events_order_and_time_work() {
    let g = gpu(0);
    let m = module(&g, DEVICE_PTX);
    let copy = m.kernel(kernels::COPY).unwrap();
    let s1 = g.stream().unwrap();
    let s2 = g.stream().unwrap();
    let (start, mid, end) = (g.event().unwrap(), g.event().unwrap(), g.event().unwrap());
    let n = 1 << 20;
    let a = g.alloc(n).unwrap();
    let b = g.alloc(n).unwrap();
    let c = g.alloc(n).unwrap();
    let data = pattern(n, 11);
    a.copy_from_host(0, &data).unwrap();
    let p = |dst: DevicePtr<u8>, src: DevicePtr<u8>| CopyParams {
        status: DevicePtr::NULL,
        dst,
        src,
        bytes: n as u64,
    };
    s1.record(&start).unwrap();
    // SAFETY: all three buffers are live and `n` bytes long.
    unsafe { s1.launch(&copy, LaunchConfig::new(4, 128), p(b.ptr(), a.ptr())) }.unwrap();
    s1.record(&mid).unwrap();
    // s2's copy b -> c must see s1's copy a -> b.
    s2.wait_event(&mid).unwrap();
    // SAFETY: as above.
    unsafe { s2.launch(&copy, LaunchConfig::new(4, 128), p(c.ptr(), b.ptr())) }.unwrap();
    s2.record(&end).unwrap();
    end.synchronize().unwrap();
    let mut back = vec![0u8; n];
    c.copy_to_host(0, &mut back).unwrap();
    assert_eq!(back, data);
    let ms = end.elapsed_ms(&start).unwrap();
    assert!(ms >= 0.0 && ms.is_finite(), "elapsed {ms}");
    g.synchronize().unwrap();
}

#[test]
fn unknown_kernel_is_a_typed_error() {
    let g = gpu(0);
    let m = module(&g, DEVICE_PTX);
    let spec = mscclpp::host::gpu::KernelSpec::<CopyParams>::ptx_only("no_such_kernel");
    // Both backends look the name up in the PTX (the CPU backend in its text); only a build
    // without PTX (`MSCCLPP_SKIP_PTX=1`, mutation runs) cannot, and then the CPU backend has
    // no function to run for a kernel declared PTX-only.
    let no_ptx = mscclpp::DEVICE_PTX.trim().is_empty();
    match (g.kind(), m.kernel(spec)) {
        (_, Err(Error::MissingKernel { name })) if !no_ptx => {
            assert_eq!(name, "no_such_kernel")
        }
        (
            BackendKind::Cpu,
            Err(Error::Unsupported {
                what: "a kernel with no host function",
                backend: BackendKind::Cpu,
            }),
        ) if no_ptx => {}
        (kind, Err(e)) => panic!("unexpected error on {kind:?}: {e:?}"),
        (_, Ok(_)) => panic!("a kernel that does not exist was found"),
    }
}

const ROLE_ENV: &str = "MSCCLPP_TEST_IPC_CHILD";

/// Child of `ipc_between_processes`: exports a buffer, then checks what the parent wrote.
fn ipc_child() {
    harness::die_with_parent();
    let g = gpu(0);
    let n: usize = std::env::var(ROLE_ENV).unwrap().parse().unwrap();
    let buf = g.alloc(n).unwrap();
    buf.copy_from_host(0, &pattern(n, 42)).unwrap();
    let h = buf.ipc_handle().unwrap();
    println!("HANDLE {}", to_hex(bytemuck::bytes_of(&h)));
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "CHECK");
    let mut back = vec![0u8; n];
    buf.copy_to_host(0, &mut back).unwrap();
    assert_eq!(back, pattern(n, 99), "the parent's write did not land");
    println!("CHILD OK");
}

#[test]
fn ipc_between_processes() {
    if std::env::var_os(ROLE_ENV).is_some() {
        return ipc_child();
    }
    let n = 3 * 1024 * 1024 + 40;
    let mut child = harness::TestProcess::new("ipc_between_processes")
        .env(ROLE_ENV, n.to_string())
        .stdin_piped()
        .spawn();
    let hex = child.read_line_with("HANDLE ", Duration::from_secs(120));
    let handle = from_hex(&hex).map(|b| bytemuck::pod_read_unaligned::<IpcMemHandle>(&b));
    let handle = handle.expect("the child printed no handle");

    // The parent uses the second device when there is one: IPC across GPUs.
    let g = gpu(1);
    let m = module(&g, DEVICE_PTX);
    let copy = m.kernel(kernels::COPY).unwrap();
    let stream = g.stream().unwrap();
    let peer = g.open_ipc(&handle).unwrap();
    assert_eq!(peer.len(), n);
    let local = g.alloc(n).unwrap();
    let p = |dst: DevicePtr<u8>, src: DevicePtr<u8>| CopyParams {
        status: DevicePtr::NULL,
        dst,
        src,
        bytes: n as u64,
    };
    // Read the child's memory with a kernel.
    // SAFETY: `peer` maps `n` bytes of the child's buffer, `local` is `n` bytes.
    unsafe { stream.launch(&copy, LaunchConfig::new(8, 128), p(local.ptr(), peer.ptr())) }.unwrap();
    stream.synchronize().unwrap();
    let mut back = vec![0u8; n];
    local.copy_to_host(0, &mut back).unwrap();
    assert_eq!(back, pattern(n, 42), "reading peer memory through IPC");
    // Write into the child's memory with a kernel, then let it check.
    local.copy_from_host(0, &pattern(n, 99)).unwrap();
    // SAFETY: as above.
    unsafe { stream.launch(&copy, LaunchConfig::new(8, 128), p(peer.ptr(), local.ptr())) }.unwrap();
    stream.synchronize().unwrap();
    // A tampered handle is refused before any backend call.
    let mut bad = handle;
    bad.size = bad.alloc_size + 1;
    assert!(matches!(g.open_ipc(&bad), Err(Error::IpcInvalid { .. })));

    child.write_line("CHECK");
    let end = child.wait_for(Duration::from_secs(120));
    assert!(end.success(), "child failed: {}", end.text());
    assert!(
        end.stdout.contains("CHILD OK"),
        "child output: {}",
        end.text()
    );
    drop(peer);
}

/// `reduce_word` of the device (the GPU's packed `add.rn.f16x2` / `add.rn.bf16x2` sums on
/// CUDA; the host twin's soft path on the CPU backend) over arrays of words, against a
/// reference built from the formats' bit layouts (the harness's codec): sums correctly
/// rounded from the exact sum (the packed instructions round once), or, for the soft path and for bf16 on a PTX target
/// without `add.rn.bf16x2` (before sm_90), rounded through f32 first; min and max give the
/// operand of the smaller (larger) value. Data: every special value against every other,
/// halfway cases, overflow, and hashed bit patterns.
///
/// fp8 (e4m3, e5m2): when those types land, add a row to `formats` below (their bit layout and
/// saturation rule) and their packed conversions get the same check.
#[test]
fn packed_half_reductions_match_a_bit_level_reference() {
    use mscclpp::shared::{DataType, ReduceOp, TestKernelParams};
    let g = gpu(0);
    let m = module(&g, DEVICE_PTX);
    let k = m.kernel(kernels::TEST_REDUCE_WORDS).unwrap();
    let stream = g.stream().unwrap();
    let cuda = g.kind() == BackendKind::Cuda;
    // The PTX's target (".target sm_90"): add.rn.bf16x2 needs sm_90.
    let sm: u32 = mscclpp::DEVICE_PTX
        .split(".target sm_")
        .nth(1)
        .and_then(|r| r.get(..2))
        .and_then(|d| d.parse().ok())
        .unwrap_or(0);
    let formats = [
        (DataType::F16, Float::F16, cuda),
        (DataType::BF16, Float::BF16, cuda && sm >= 90),
    ];
    for (dtype, f, packed) in formats {
        // The format's codes as u16 (the harness's codec works on u64 words).
        let (man_bits, sign_bit) = (f.mantissa_bits, 1u16 << (f.width() - 1));
        let inf = f.round(f64::INFINITY) as u16;
        let decode = |code: u16| f.decode(code.into());
        let round = |x: f64| f.round(x) as u16;
        let is_nan = |code: u16| f.is_nan(code.into());
        let one = round(1.0);
        let max = inf - 1;
        let specials: Vec<u16> = [
            0,
            1,
            (1 << man_bits) - 1,
            1 << man_bits,
            one,
            one + 1,
            one - (1 << man_bits), // 0.5
            max,
            max - 1,
            inf,
        ]
        .into_iter()
        .flat_map(|b| [b, b | sign_bit])
        .collect();
        // Pairs of lanes: every special with every special, then hashed bit patterns (NaNs
        // left out: which NaN comes back is not specified).
        let mut pairs: Vec<(u16, u16)> = Vec::new();
        for &x in &specials {
            for &y in &specials {
                pairs.push((x, y));
            }
        }
        // Halfway between 1 and its successor: ties to even.
        let half_ulp = one - ((man_bits as u16 + 1) << man_bits);
        pairs.extend([(one, half_ulp), (one + 1, half_ulp), (max, max)]);
        for i in 0..4096u64 {
            let h = harness::hash(&[dtype as u64, i]);
            let (x, y) = (h as u16, (h >> 16) as u16);
            if !is_nan(x) && !is_nan(y) {
                pairs.push((x, y));
            }
        }
        if pairs.len() % 2 == 1 {
            pairs.push((0, 0));
        }
        let words = pairs.len() / 2;
        let a: Vec<u32> = (0..words)
            .map(|w| pairs[2 * w].0 as u32 | (pairs[2 * w + 1].0 as u32) << 16)
            .collect();
        let b: Vec<u32> = (0..words)
            .map(|w| pairs[2 * w].1 as u32 | (pairs[2 * w + 1].1 as u32) << 16)
            .collect();
        let (da, db, dout) = (
            g.alloc(words * 4).unwrap(),
            g.alloc(words * 4).unwrap(),
            g.alloc(words * 4).unwrap(),
        );
        da.copy_from_host(0, bytemuck::cast_slice(&a)).unwrap();
        db.copy_from_host(0, bytemuck::cast_slice(&b)).unwrap();
        for op in [ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max] {
            dout.copy_from_host(0, &vec![MARKER; words * 4]).unwrap();
            let p = TestKernelParams {
                status: DevicePtr::NULL,
                a: da.ptr(),
                b: db.ptr(),
                out: dout.ptr(),
                count: words as u64,
                dtype: dtype as u32,
                op: op as u32,
                flag: 0,
                reserved: 0,
            };
            // SAFETY: the three buffers hold `words` words.
            unsafe { stream.launch(&k, LaunchConfig::new(3, 64), p) }.unwrap();
            stream.synchronize().unwrap();
            let mut got = vec![0u32; words];
            dout.copy_to_host(0, bytemuck::cast_slice_mut(&mut got))
                .unwrap();
            let mut through_f32 = 0;
            for (i, &(x, y)) in pairs.iter().enumerate() {
                let r = (got[i / 2] >> (16 * (i % 2))) as u16;
                let (vx, vy) = (decode(x), decode(y));
                let what = format!("{dtype:?} {op:?} {x:#06x} {y:#06x} gave {r:#06x}");
                match op {
                    ReduceOp::Sum => {
                        let exact = vx + vy; // exact, or (bf16, far apart) as good
                        if exact.is_nan() {
                            assert!(is_nan(r), "{what}: not NaN");
                            continue;
                        }
                        let once = round(exact);
                        let twice = round(((vx as f32) + (vy as f32)) as f64);
                        through_f32 += (once != twice) as usize;
                        let want = if packed { once } else { twice };
                        assert_eq!(r, want, "{what}, want {want:#06x} (packed: {packed})");
                    }
                    ReduceOp::Min | ReduceOp::Max => {
                        let want = if (op == ReduceOp::Min) == (vy < vx) {
                            vy
                        } else {
                            vx
                        };
                        assert!(r == x || r == y, "{what}: not an operand");
                        assert_eq!(decode(r), want, "{what}");
                    }
                }
            }
            if op == ReduceOp::Sum {
                println!(
                    "{dtype:?}: {} sums, {through_f32} of them rounded differently through f32",
                    pairs.len()
                );
            }
        }
    }
}

/// LL128 lines between two blocks of one launch on one GPU: block 0's warps write lines (on
/// the GPU each lane one 16-byte volatile store, the line one write), block 1's warps wait for
/// the flag and read the data, at sizes of less than a line, a warp step, one byte more, and
/// many steps that the warps loop over; then the same line buffer again with the next flag
/// (its stale lines must not be taken). Outputs start as [`MARKER`] and keep it past the data.
#[test]
fn ll128_lines_between_blocks_of_one_gpu() {
    use mscclpp::host::status::{DEFAULT_SPIN_LIMIT, StatusBlock};
    use mscclpp::shared::TestKernelParams;
    use mscclpp::shared::packet::ll128;
    let g = gpu(0);
    let m = module(&g, DEVICE_PTX);
    let k = m.kernel(kernels::TEST_LL128_BLOCKS).unwrap();
    let stream = g.stream().unwrap();
    let status = StatusBlock::new(&g, DEFAULT_SPIN_LIMIT).unwrap();
    let step = ll128::WARP_DATA_BYTES;
    let most = 40 * step + 17;
    let input = pattern(most, 9);
    let a = g.alloc(most).unwrap();
    a.copy_from_host(0, &input).unwrap();
    let lines = g.alloc(ll128::line_bytes_for(most)).unwrap();
    let out = g.alloc(most + 64).unwrap();
    let mut flag = 0u32;
    for warps in [1u32, 2] {
        for bytes in [1, 119, step, step + 1, 5 * step + 17, most] {
            // The same lines twice: the second time they hold the first one's flag.
            for _ in 0..2 {
                flag += 1;
                out.copy_from_host(0, &vec![MARKER; out.len()]).unwrap();
                let p = TestKernelParams {
                    status: status.device_ptr(),
                    a: a.ptr(),
                    b: lines.ptr(),
                    out: out.ptr(),
                    count: bytes as u64,
                    dtype: 0,
                    op: 0,
                    flag,
                    reserved: 0,
                };
                // SAFETY: `a` and `out` hold `bytes`, `lines` the lines for `most` bytes.
                unsafe { stream.launch(&k, LaunchConfig::new(2, 32 * warps), p) }.unwrap();
                assert!(
                    stream
                        .synchronize_timeout(std::time::Duration::from_secs(60))
                        .unwrap(),
                    "LL128 between blocks hung ({bytes} B, flag {flag})"
                );
                assert!(status.error().is_none(), "{:?}", status.error());
                let mut want = vec![MARKER; out.len()];
                want[..bytes].copy_from_slice(&input[..bytes]);
                let mut got = vec![0u8; out.len()];
                out.copy_to_host(0, &mut got).unwrap();
                assert_same(
                    &got,
                    &want,
                    &format!("{bytes} B, {warps} warps a block, flag {flag}"),
                );
            }
        }
    }
}
