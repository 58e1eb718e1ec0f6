//! The device runtime, end to end, on the backend under test (CPU in CI; CUDA on a GPU machine
//! with `MSCCLPP_BACKEND=cuda`): allocation, host-mapped memory, copies, kernels with shared
//! memory and barriers, events, and IPC between two processes.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use common::values::MARKER;
use common::{from_hex, gpu, module, pattern, to_hex};
use mscclpp::host::Error;
use mscclpp::host::gpu::{BackendKind, LaunchConfig};
use mscclpp::kernels;
use mscclpp::shared::{BlockSumParams, CopyParams, DevicePtr, IpcMemHandle};

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
    let m = module(&g);
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
    let m = module(&g);
    let copy = m.kernel(kernels::COPY).unwrap();
    let stream = g.stream().unwrap();
    let max = 3 * 4096 + 64;
    let src = g.alloc(max + 32).unwrap();
    let data = pattern(max + 32, 5);
    src.copy_from_host(0, &data).unwrap();
    let dst = g.alloc(max + 64).unwrap();
    for (grid, block) in [(1u32, 1u32), (3, 64), (4, 96), (5, 32)] {
        let threads = (grid * block) as usize;
        for (dst_off, src_off) in [(0usize, 0usize), (16, 32), (1, 0), (0, 7), (5, 5)] {
            // Less than one vector, exactly the four-vector step of this grid, and one vector
            // and three bytes more than three steps (a partial step and a byte tail).
            for bytes in [13, 64 * threads, 3 * 64 * threads + 19] {
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

/// On the CPU backend a device wait that nobody ends gives up after `MSCCLPP_SPIN_TIMEOUT_MS`
/// (the test hook of `scripts/mutants.sh`) with a timeout recorded in the status: a FIFO push
/// into a full FIFO that no proxy drains. Runs in a child process, because the variable is read
/// once per process; the parent checks the child's verdict.
#[test]
fn spin_timeout_ends_a_lost_wait_on_the_cpu_backend() {
    const CHILD: &str = "MSCCLPP_TEST_SPIN_TIMEOUT_CHILD";
    if common::backend() != BackendKind::Cpu {
        eprintln!("NOT RUN: MSCCLPP_SPIN_TIMEOUT_MS bounds the CPU backend's waits only");
        return;
    }
    if std::env::var_os(CHILD).is_some() {
        use mscclpp::host::fifo::Fifo;
        use mscclpp::host::status::{DEFAULT_SPIN_LIMIT, StatusBlock};
        use mscclpp::shared::{DeviceErrorCode, FifoPushParams, WaitSite};
        let g = gpu(0);
        let m = module(&g);
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
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "spin_timeout_ends_a_lost_wait_on_the_cpu_backend",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("MSCCLPP_SPIN_TIMEOUT_MS", "300")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child failed:\n{text}");
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
    let m = module(&g);
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
    let m = module(&g);
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
    let m = module(&g);
    let spec = mscclpp::host::gpu::KernelSpec::<CopyParams>::ptx_only("no_such_kernel");
    // CUDA looks the name up in the PTX; the CPU backend has no function to run for a kernel
    // declared PTX-only.
    match (g.kind(), m.kernel(spec)) {
        (BackendKind::Cuda, Err(Error::MissingKernel { name })) => {
            assert_eq!(name, "no_such_kernel")
        }
        (
            BackendKind::Cpu,
            Err(Error::Unsupported {
                what: "a kernel with no host function",
                backend: BackendKind::Cpu,
            }),
        ) => {}
        (kind, Err(e)) => panic!("unexpected error on {kind:?}: {e:?}"),
        (_, Ok(_)) => panic!("a kernel that does not exist was found"),
    }
}

const ROLE_ENV: &str = "MSCCLPP_TEST_IPC_CHILD";

/// Child of `ipc_between_processes`: exports a buffer, then checks what the parent wrote.
fn ipc_child() {
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
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "ipc_between_processes",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE_ENV, n.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut handle = None;
    let mut line = String::new();
    while out.read_line(&mut line).unwrap() > 0 {
        // libtest may have printed "test name ... " on the same line first.
        if let Some(at) = line.find("HANDLE ") {
            let hex = line[at + "HANDLE ".len()..].trim();
            handle = Some(bytemuck::pod_read_unaligned::<IpcMemHandle>(&from_hex(hex)));
            break;
        }
        line.clear();
    }
    let handle = handle.expect("the child printed no handle");

    // The parent uses the second device when there is one: IPC across GPUs.
    let g = gpu(1);
    let m = module(&g);
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

    child.stdin.as_mut().unwrap().write_all(b"CHECK\n").unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "child failed: {rest}");
    assert!(rest.contains("CHILD OK"), "child output: {rest}");
    drop(peer);
}
