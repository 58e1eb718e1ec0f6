//! Smoke tests of the `cuda` backend. Those marked `#[ignore = "needs CUDA"]` need a GPU (run
//! them with `--include-ignored`, e.g. through `scripts/gpu-bundle.sh`); the others run anywhere.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use super::*;
use crate::gpu::LaunchConfig;

/// `add_one(AddOneParams p)`: `p.ptr[i] += 1` for every `i < p.n` (one thread per element).
const ADD_ONE_PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64

.visible .entry add_one(
	.param .align 8 .b8 add_one_param_0[16]
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<6>;
	.reg .b64 	%rd<7>;

	ld.param.u64 	%rd1, [add_one_param_0];
	ld.param.u64 	%rd2, [add_one_param_0+8];
	mov.u32 	%r1, %ctaid.x;
	mov.u32 	%r2, %ntid.x;
	mov.u32 	%r3, %tid.x;
	mad.lo.u32 	%r4, %r1, %r2, %r3;
	cvt.u64.u32 	%rd3, %r4;
	setp.ge.u64 	%p1, %rd3, %rd2;
	@%p1 bra 	DONE;
	cvta.to.global.u64 	%rd4, %rd1;
	shl.b64 	%rd5, %rd3, 2;
	add.s64 	%rd6, %rd4, %rd5;
	ld.global.u32 	%r5, [%rd6];
	add.s32 	%r5, %r5, 1;
	st.global.u32 	[%rd6], %r5;
DONE:
	ret;
}
"#;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct AddOneParams {
    ptr: u64,
    n: u64,
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
        .collect()
}

fn read_u32s(dev: &Device, ptr: u64, n: usize) -> Vec<u32> {
    let mut bytes = vec![0u8; n * 4];
    dev.copy_dtoh_sync(&mut bytes, ptr).expect("dtoh");
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn launch_add_one(stream: &Stream, f: &Function, ptr: u64, n: usize, shared: u32) {
    let params = AddOneParams { ptr, n: n as u64 };
    let cfg = LaunchConfig::new(n.div_ceil(256) as u32, 256).with_shared_mem(shared);
    // SAFETY: `ptr` addresses `n` live u32s until the stream is synchronised by the caller.
    unsafe { stream.launch(f, cfg, bytemuck::bytes_of(&params)) }.expect("launch");
}

#[test]
fn owners_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Device>();
    check::<DeviceAlloc>();
    check::<HostAlloc>();
    check::<PeerAlloc>();
    check::<Stream>();
    check::<Event>();
    check::<Graph>();
    check::<Module>();
    check::<Function>();
}

/// Runs everywhere: without libcuda the backend reports `NoLibcuda` and never panics.
#[test]
fn missing_libcuda_is_an_error_not_a_panic() {
    // SAFETY: only tries to dlopen the library names.
    let present = unsafe { sys::is_culib_present() };
    let count = device_count();
    if present {
        assert!(
            matches!(count, Ok(_) | Err(Error::CudaInit(_))),
            "libcuda present: {count:?}"
        );
    } else {
        assert!(matches!(count, Err(Error::NoLibcuda)), "{count:?}");
        assert!(matches!(Device::open(0), Err(Error::NoLibcuda)));
        // Asking twice gives the remembered answer.
        assert!(matches!(device_count(), Err(Error::NoLibcuda)));
    }
}

#[test]
#[ignore = "needs CUDA"]
fn devices_open_and_report() {
    let n = device_count().expect("device_count");
    assert!(n >= 1, "no CUDA device");
    let d = Device::open(0).expect("open 0");
    assert!(!d.name().is_empty());
    eprintln!(
        "{n} device(s); 0 = {} on NUMA node {:?}",
        d.name(),
        d.numa_node()
    );
    d.bind_to_thread().expect("bind");
    d.synchronize().expect("synchronize");
    match Device::open(n) {
        Err(Error::NoSuchDevice { ordinal, count, .. }) => assert_eq!((ordinal, count), (n, n)),
        other => panic!("expected NoSuchDevice, got {other:?}"),
    }
}

#[test]
#[ignore = "needs CUDA"]
fn alloc_is_zeroed_and_copies_round_trip() {
    let d = std::sync::Arc::new(Device::open(0).expect("open"));
    let len = (1 << 20) + 3;
    let a = d.alloc(len).expect("alloc");
    assert_eq!(a.len(), len);
    let mut back = vec![0xffu8; len];
    d.copy_dtoh_sync(&mut back, a.ptr()).expect("dtoh");
    assert!(
        back.iter().all(|&b| b == 0),
        "cuMemAlloc memory was not zeroed"
    );

    let data = pattern(len, 11);
    d.copy_htod_sync(a.ptr(), &data).expect("htod");
    d.copy_dtoh_sync(&mut back, a.ptr()).expect("dtoh");
    assert_eq!(back, data);

    // A device-to-device copy on a stream, queued from another thread (context binding).
    let b = d.alloc(len).expect("alloc b");
    let (d2, src, dst) = (d.clone(), a.ptr(), b.ptr());
    std::thread::spawn(move || {
        let s = d2.create_stream().expect("stream");
        // SAFETY: both allocations outlive the synchronised copy.
        unsafe { s.copy_dtod(dst, src, len) }.expect("dtod");
        s.synchronize().expect("sync");
    })
    .join()
    .expect("thread");
    let mut back2 = vec![0u8; len];
    d.copy_dtoh_sync(&mut back2, b.ptr()).expect("dtoh b");
    assert_eq!(back2, data);

    let empty = d.alloc(0).expect("alloc 0");
    assert_eq!(empty.len(), 0);
    assert_ne!(empty.ptr(), 0);
    // Dropping frees (from another thread, too).
    std::thread::spawn(move || drop(b))
        .join()
        .expect("drop thread");
}

#[test]
#[ignore = "needs CUDA"]
fn host_mapped_memory_is_seen_by_the_device() {
    let d = Device::open(0).expect("open");
    let len = 4096;
    let h = d.alloc_host_mapped(len).expect("host alloc");
    assert_eq!(h.len(), len);
    assert_ne!(h.device_ptr(), 0);
    // SAFETY: `h` is `len` bytes of host memory nothing else touches now.
    let host = unsafe { std::slice::from_raw_parts_mut(h.host_ptr(), len) };
    assert!(
        host.iter().all(|&b| b == 0),
        "host-mapped memory was not zeroed"
    );
    let data = pattern(len, 5);
    host.copy_from_slice(&data);

    // Host-mapped -> device, then read the device copy back.
    let a = d.alloc(len).expect("alloc");
    let s = d.create_stream().expect("stream");
    // SAFETY: both live until the stream is synchronised.
    unsafe { s.copy_dtod(a.ptr(), h.device_ptr(), len) }.expect("dtod");
    s.synchronize().expect("sync");
    let mut back = vec![0u8; len];
    d.copy_dtoh_sync(&mut back, a.ptr()).expect("dtoh");
    assert_eq!(back, data);

    // Device -> host-mapped, read on the host.
    let other = pattern(len, 77);
    d.copy_htod_sync(a.ptr(), &other).expect("htod");
    // SAFETY: as above.
    unsafe { s.copy_dtod(h.device_ptr(), a.ptr(), len) }.expect("dtod back");
    s.synchronize().expect("sync");
    // SAFETY: the copy is complete; `h` is live.
    let seen: Vec<u8> = (0..len)
        .map(|i| unsafe { std::ptr::read_volatile(h.host_ptr().add(i)) })
        .collect();
    assert_eq!(seen, other);
}

#[test]
#[ignore = "needs CUDA"]
fn events_time_and_order_streams() {
    let d = Device::open(0).expect("open");
    let len = 64 << 20;
    let (a, b) = (d.alloc(len).expect("a"), d.alloc(len).expect("b"));
    let (s1, s2) = (
        d.create_stream().expect("s1"),
        d.create_stream().expect("s2"),
    );
    let (start, end) = (
        d.create_event().expect("start"),
        d.create_event().expect("end"),
    );
    s1.record(&start).expect("record start");
    // SAFETY: both live until synchronised below.
    unsafe { s1.copy_dtod(b.ptr(), a.ptr(), len) }.expect("copy");
    s1.record(&end).expect("record end");
    s2.wait_event(&end).expect("wait_event");
    s2.synchronize().expect("s2 sync");
    end.synchronize().expect("event sync");
    let ms = end.elapsed_ms(&start).expect("elapsed");
    eprintln!("64 MiB device copy: {ms:.3} ms");
    assert!(ms > 0.0 && ms < 10_000.0, "{ms}");
    assert_ne!(s1.raw(), 0);
}

#[test]
#[ignore = "needs CUDA"]
fn ptx_module_loads_and_launches() {
    let d = Device::open(0).expect("open");
    let m = d.load_ptx(ADD_ONE_PTX).expect("load ptx");
    let f = m.function("add_one").expect("add_one");
    assert_eq!(f.name(), "add_one");
    assert_eq!(
        f.param_bytes(),
        Some(16),
        "cuFuncGetParamInfo (driver >= 12.4)"
    );
    match m.function("no_such_kernel") {
        Err(Error::MissingKernel { name }) => assert_eq!(name, "no_such_kernel"),
        other => panic!("expected MissingKernel, got {other:?}"),
    }

    let n = 1000;
    let a = d.alloc(n * 4).expect("alloc");
    let init: Vec<u8> = (0..n as u32).flat_map(|i| i.to_le_bytes()).collect();
    d.copy_htod_sync(a.ptr(), &init).expect("htod");
    let s = d.create_stream().expect("stream");
    launch_add_one(&s, &f, a.ptr(), n, 0);
    // Above 48 KiB of dynamic shared memory: the kernel is opted in first.
    launch_add_one(&s, &f, a.ptr(), n, 64 * 1024);
    s.synchronize().expect("sync");
    let got = read_u32s(&d, a.ptr(), n);
    assert!(
        got.iter().enumerate().all(|(i, &v)| v == i as u32 + 2),
        "{:?}",
        &got[..8]
    );

    // A parameter block of the wrong size is refused before the driver sees it.
    let short = [0u8; 8];
    // SAFETY: refused before launch.
    let r = unsafe { s.launch(&f, LaunchConfig::new(1, 1), &short) };
    assert!(matches!(r, Err(BackendError::Invalid(_))), "{r:?}");

    // Functions keep their module alive.
    drop(m);
    launch_add_one(&s, &f, a.ptr(), n, 0);
    s.synchronize().expect("sync");
    assert_eq!(read_u32s(&d, a.ptr(), 1), vec![3]);

    // The same PTX from a file.
    let path = std::env::temp_dir().join(format!("mscclpp-add-one-{}.ptx", std::process::id()));
    std::fs::write(&path, ADD_ONE_PTX).expect("write ptx");
    let m2 = d.load_module_file(&path).expect("load file");
    let _ = std::fs::remove_file(&path);
    m2.function("add_one").expect("add_one from file");
    match d.load_module_file(std::path::Path::new("/nonexistent/x.cubin")) {
        Err(Error::ReadFile { .. }) => {}
        other => panic!("expected ReadFile, got {other:?}"),
    }

    // Broken PTX: the error carries the JIT log.
    let bad =
        ".version 7.0\n.target sm_70\n.address_size 64\n.visible .entry bad() { bogus.op; ret; }\n";
    match d.load_ptx(bad) {
        Err(e @ Error::ModuleLoad { .. }) => {
            let chain = format!("{e}: {:?}", std::error::Error::source(&e));
            eprintln!("bad PTX: {chain}");
            assert!(
                matches!(&e, Error::ModuleLoad { source: BackendError::Jit { log, .. }, .. } if !log.is_empty()),
                "no JIT log: {chain}"
            );
        }
        other => panic!("expected ModuleLoad, got {other:?}"),
    }
}

/// The driver's answers to PTX built for a newer GPU map to `Error::PtxTarget`; other failures
/// do not.
#[test]
fn too_new_ptx_targets_are_recognised() {
    use super::module::is_target_too_new;
    use sys::CUresult as R;
    let err = |code: R| DriverError {
        call: "cuModuleLoadDataEx",
        code: code as u32,
        name: format!("{code:?}"),
    };
    let arch = |s| SmArch::parse(s).expect("arch");
    let (a100, h200) = (SmArch::of_device(8, 0), SmArch::of_device(9, 0));
    // What the JIT writes for `.target sm_90` on an sm_80 GPU (ptxas's message).
    let log = "ptxas application ptx input, line 5; fatal   : SM version specified by .target \
               is higher than default SM version assumed";
    assert!(is_target_too_new(
        &err(R::CUDA_ERROR_INVALID_PTX),
        log,
        None,
        a100
    ));
    assert!(is_target_too_new(
        &err(R::CUDA_ERROR_INVALID_PTX),
        "",
        Some(arch("sm_90")),
        a100
    ));
    assert!(is_target_too_new(
        &err(R::CUDA_ERROR_NO_BINARY_FOR_GPU),
        "",
        Some(arch("sm_90a")),
        SmArch::of_device(10, 0)
    ));
    // A JIT failure of PTX that fits the device is something else (a bad instruction).
    let syntax = "ptxas application ptx input, line 4; error   : Unknown symbol 'bogus'";
    assert!(!is_target_too_new(
        &err(R::CUDA_ERROR_INVALID_PTX),
        syntax,
        Some(arch("sm_90")),
        h200
    ));
    assert!(!is_target_too_new(
        &err(R::CUDA_ERROR_INVALID_PTX),
        syntax,
        None,
        a100
    ));
    // Another failing call is not a target mismatch, whatever the target.
    assert!(!is_target_too_new(
        &err(R::CUDA_ERROR_OUT_OF_MEMORY),
        log,
        Some(arch("sm_90")),
        a100
    ));

    let e = Error::PtxTarget {
        what: "PTX text".into(),
        ordinal: 0,
        target: arch("sm_90").to_string(),
        device: a100.to_string(),
    };
    assert_eq!(
        e.to_string(),
        "PTX text was built for sm_90; device 0 is sm_80: rebuild with MSCCLPP_CUDA_ARCH=sm_80"
    );
}

/// PTX for a GPU newer than the device: the library refuses it with the fix named, and what
/// the driver itself answers (loaded past that check) is what `is_target_too_new` maps.
#[test]
#[ignore = "needs CUDA"]
fn ptx_for_a_newer_gpu_is_a_readable_error() {
    let d = Device::open(0).expect("open");
    let device = d.arch();
    // The next architecture after the device's (sm_90 -> sm_100), with a PTX ISA that knows it.
    let newer = SmArch {
        number: (device.number / 10 + 1) * 10,
        suffix: None,
    };
    let ptx = ADD_ONE_PTX
        .replace(".version 7.0", ".version 8.6")
        .replace(".target sm_70", &format!(".target {newer}"));
    match d.load_ptx(&ptx) {
        Err(e @ Error::PtxTarget { .. }) => {
            eprintln!("library: {e}");
            assert!(
                e.to_string()
                    .contains(&format!("MSCCLPP_CUDA_ARCH={device}")),
                "{e}"
            );
        }
        other => panic!("expected PtxTarget, got {other:?}"),
    }
    let text = std::ffi::CString::new(ptx).expect("no NUL");
    d.ctx.bind().expect("bind");
    // SAFETY: `text` is NUL-terminated PTX that outlives the call.
    match unsafe { result::cu_module_load_data_ex(text.as_ptr().cast()) } {
        Ok(m) => {
            // SAFETY: just loaded, unloaded once, nothing of it in use.
            let _ = unsafe { result::cu_module_unload(m) };
            panic!("the driver loaded PTX for {newer} on a {device} device");
        }
        Err((e, _)) if e.code == sys::CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION as u32 => {
            eprintln!("NOT RUN: the driver's half: this driver does not know PTX ISA 8.6 ({e})");
        }
        Err((e, log)) => {
            eprintln!("driver: {e}; JIT log: {log}");
            assert!(
                super::module::is_target_too_new(&e, &log, Some(newer), device),
                "the driver answered {e} ({log:?}) for PTX built for {newer} on {device}: map it"
            );
        }
    }
}

/// Empty PTX (what a build with `MSCCLPP_SKIP_PTX=1` embeds) is refused before the driver
/// sees it, with a cause that names the variable.
#[test]
#[ignore = "needs CUDA"]
fn empty_ptx_is_refused_naming_the_skip_variable() {
    let d = Device::open(0).expect("open");
    for empty in ["", "\n  \n"] {
        match d.load_ptx(empty) {
            Err(Error::ModuleLoad {
                source: BackendError::Invalid(why),
                ..
            }) => assert!(why.contains("MSCCLPP_SKIP_PTX=1"), "{why}"),
            other => panic!("empty PTX {empty:?}: {other:?}"),
        }
    }
}

#[test]
#[ignore = "needs CUDA"]
fn graphs_capture_and_replay() {
    let d = Device::open(0).expect("open");
    let m = d.load_ptx(ADD_ONE_PTX).expect("load ptx");
    let f = m.function("add_one").expect("add_one");
    let n = 1000;
    let a = d.alloc(n * 4).expect("alloc");
    let s = d.create_stream().expect("stream");
    assert!(!s.is_capturing().expect("is capturing"));
    s.begin_capture().expect("begin capture");
    assert!(s.is_capturing().expect("is capturing"));
    for _ in 0..3 {
        launch_add_one(&s, &f, a.ptr(), n, 0);
    }
    let g = s.end_capture().expect("end capture");
    assert!(!s.is_capturing().expect("is capturing"));
    // Captured, not run.
    s.synchronize().expect("sync");
    assert_eq!(read_u32s(&d, a.ptr(), 1), vec![0]);
    for _ in 0..2 {
        // SAFETY: `a` outlives the synchronised replays.
        unsafe { g.launch(&s) }.expect("graph launch");
    }
    s.synchronize().expect("sync");
    assert!(read_u32s(&d, a.ptr(), n).iter().all(|&v| v == 6));
    // Ending a capture that never began is an error, and the stream still works.
    assert!(s.end_capture().is_err());
    launch_add_one(&s, &f, a.ptr(), n, 0);
    s.synchronize().expect("sync");
    assert_eq!(read_u32s(&d, a.ptr(), 1), vec![7]);
}

#[test]
#[ignore = "needs CUDA"]
fn borrowed_streams_run_work_and_stay_alive() {
    let d = Device::open(0).expect("open");
    d.bind_to_thread().expect("bind");
    assert_eq!(current_device().expect("current device"), Some(0));
    let m = d.load_ptx(ADD_ONE_PTX).expect("load ptx");
    let f = m.function("add_one").expect("add_one");
    let n = 256;
    let a = d.alloc(n * 4).expect("alloc");
    let owner = d.create_stream().expect("stream");
    for raw in [owner.raw(), 0, 1, 2] {
        // SAFETY: `owner` outlives the borrowed stream; 0, 1 and 2 are the default streams.
        let s = unsafe { d.borrow_stream(raw) }.expect("borrow");
        launch_add_one(&s, &f, a.ptr(), n, 0);
        s.synchronize().expect("sync");
        drop(s);
    }
    // Dropping the borrowed streams destroyed nothing: the owner still queues work.
    launch_add_one(&owner, &f, a.ptr(), n, 0);
    owner.synchronize().expect("sync");
    assert!(read_u32s(&d, a.ptr(), n).iter().all(|&v| v == 5));
    if device_count().expect("count") >= 2 {
        let other = Device::open(1).expect("open 1");
        let theirs = other.create_stream().expect("stream on 1");
        // SAFETY: `theirs` is live; it is refused before any use.
        match unsafe { d.borrow_stream(theirs.raw()) } {
            Err(Error::StreamDevice { ordinal: 0, .. }) => {}
            other => panic!("expected StreamDevice, got {other:?}"),
        }
    } else {
        eprintln!("NOT RUN: a stream of another device (needs 2 GPUs)");
    }
}

#[test]
#[ignore = "needs CUDA"]
fn relaxed_capture_mode_is_restored() {
    use sys::CUstreamCaptureMode::*;
    let _d = Device::open(0).expect("open");
    let mode_now = || {
        // Reads the mode by exchanging it with itself.
        let m = result::cu_thread_exchange_stream_capture_mode(CU_STREAM_CAPTURE_MODE_GLOBAL)
            .expect("exchange");
        result::cu_thread_exchange_stream_capture_mode(m).expect("exchange back");
        m
    };
    assert_eq!(mode_now(), CU_STREAM_CAPTURE_MODE_GLOBAL);
    {
        let _relaxed = RelaxedCapture::new().expect("relax");
        assert_eq!(mode_now(), CU_STREAM_CAPTURE_MODE_RELAXED);
    }
    assert_eq!(mode_now(), CU_STREAM_CAPTURE_MODE_GLOBAL);
}

#[test]
#[ignore = "needs CUDA"]
fn peer_access_between_two_gpus() {
    let n = device_count().expect("count");
    if n < 2 {
        eprintln!("SKIPPED: peer access needs 2 GPUs, found {n}");
        return;
    }
    let (d0, d1) = (Device::open(0).expect("0"), Device::open(1).expect("1"));
    d0.enable_peer_access(&d1).expect("0 -> 1");
    d0.enable_peer_access(&d1)
        .expect("0 -> 1 again (already enabled)");
    d1.enable_peer_access(&d0).expect("1 -> 0");
    d0.enable_peer_access(&d0).expect("0 -> 0");

    let len = 1 << 20;
    let data = pattern(len, 42);
    let a1 = d1.alloc(len).expect("alloc on 1");
    d1.copy_htod_sync(a1.ptr(), &data).expect("htod 1");
    let a0 = d0.alloc(len).expect("alloc on 0");
    let s0 = d0.create_stream().expect("stream 0");
    // SAFETY: both live until synchronised.
    unsafe { s0.copy_dtod(a0.ptr(), a1.ptr(), len) }.expect("peer copy");
    s0.synchronize().expect("sync");
    let mut back = vec![0u8; len];
    d0.copy_dtoh_sync(&mut back, a0.ptr()).expect("dtoh");
    assert_eq!(back, data);

    // A kernel on device 0 writes device 1's memory directly.
    let m = d0.load_ptx(ADD_ONE_PTX).expect("load");
    let f = m.function("add_one").expect("fn");
    let words = 4096;
    let b1 = d1.alloc(words * 4).expect("b1");
    launch_add_one(&s0, &f, b1.ptr(), words, 0);
    s0.synchronize().expect("sync");
    assert!(read_u32s(&d1, b1.ptr(), words).iter().all(|&v| v == 1));
}

const IPC_CHILD_ENV: &str = "MSCCLPP_TEST_CUDA_IPC_CHILD";
const IPC_LEN: usize = 1 << 20;

fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn from_hex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

/// Prints a timestamped step of the IPC test to stderr (the child's stderr is inherited).
fn step(who: &str, t0: std::time::Instant, what: &str) {
    eprintln!("[ipc {who} +{:.3}s] {what}", t0.elapsed().as_secs_f64());
}

/// Where each thread of process `pid` is blocked (for a test that timed out).
fn blocked_threads(pid: u32) -> String {
    let mut out = String::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return format!("pid {pid}: gone\n");
    };
    for t in tasks.flatten() {
        let p = t.path();
        let read = |f: &str| std::fs::read_to_string(p.join(f)).unwrap_or_default();
        out += &format!(
            "pid {pid} tid {:?} {} wchan={} syscall={}\n",
            t.file_name(),
            read("comm").trim(),
            read("wchan").trim(),
            read("syscall").trim()
        );
    }
    out
}

/// The exporting side of [`ipc_between_processes`]; does nothing unless started by it.
#[test]
#[ignore = "needs CUDA"]
fn ipc_child_exporter() {
    if std::env::var_os(IPC_CHILD_ENV).is_none() {
        return;
    }
    let t0 = std::time::Instant::now();
    let d = Device::open(0).expect("child open");
    step("child", t0, "opened device 0");
    let a = d.alloc(IPC_LEN).expect("child alloc");
    d.copy_htod_sync(a.ptr(), &pattern(IPC_LEN, 9))
        .expect("child htod");
    let h = a.ipc_handle(0).expect("ipc_handle");
    assert_eq!(
        (h.size, h.alloc_size, h.offset),
        (IPC_LEN as u64, IPC_LEN as u64, 0)
    );
    println!("IPC_HANDLE={}", to_hex(bytemuck::bytes_of(&h)));
    std::io::stdout().flush().expect("flush");
    step("child", t0, "exported; waiting for the parent");
    // Keep the allocation until the parent is done, then check what it wrote.
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).expect("read parent");
    step("child", t0, &format!("parent said {:?}", line.trim()));
    let mut head = [0u8; 16];
    d.copy_dtoh_sync(&mut head, a.ptr()).expect("child dtoh");
    assert_eq!(head, [0xab; 16], "parent's write not visible");
    println!("CHILD_OK");
    std::io::stdout().flush().expect("flush");
    step("child", t0, "done");
}

#[test]
#[ignore = "needs CUDA"]
fn ipc_between_processes() {
    use std::sync::mpsc;
    use std::time::Duration;
    const STEP_TIMEOUT: Duration = Duration::from_secs(30);

    let t0 = std::time::Instant::now();
    let n = device_count().expect("count");
    let exe = std::env::current_exe().expect("current_exe");
    let mut child = Command::new(exe)
        .args([
            "gpu::cuda::tests::ipc_child_exporter",
            "--exact",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(IPC_CHILD_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn child");
    let pid = child.id();
    step("parent", t0, &format!("spawned child {pid}"));

    // Every wait below is bounded: a watchdog reports where both processes are stuck and kills
    // the child, which unblocks the parent's reads.
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if done_rx.recv_timeout(3 * STEP_TIMEOUT).is_err() {
            eprintln!(
                "[ipc watchdog] timed out; blocked threads:\n{}{}",
                blocked_threads(std::process::id()),
                blocked_threads(pid)
            );
            // SAFETY: plain kill(2) of our own child.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    });

    let stdout = child.stdout.take().expect("stdout");
    let (line_tx, line_rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if line_tx.send(line).is_err() {
                break;
            }
        }
    });
    let handle = loop {
        match line_rx.recv_timeout(STEP_TIMEOUT) {
            Ok(line) => {
                // libtest prints `test <name> ... ` before the test's own output, on one line.
                if let Some(hex) = line.split_once("IPC_HANDLE=").map(|(_, h)| h.trim()) {
                    break bytemuck::pod_read_unaligned::<IpcMemHandle>(&from_hex(hex));
                }
            }
            Err(e) => {
                let _ = child.kill();
                panic!("the child printed no IPC handle ({e:?})");
            }
        }
    };
    step("parent", t0, "got the handle");
    assert_eq!(handle.kind, mscclpp_shared::ipc::IPC_KIND_CUDA);
    assert_ne!(handle.owner_pid, std::process::id());

    // Open it on the other GPU when there is one (NVLink / P2P), else on the same GPU.
    let d = Device::open(if n >= 2 { 1 } else { 0 }).expect("open");
    let peer = d.open_ipc(&handle).expect("open_ipc");
    step("parent", t0, &format!("opened on device {}", d.ordinal()));
    let mut back = vec![0u8; IPC_LEN];
    d.copy_dtoh_sync(&mut back, peer.base() + handle.offset)
        .expect("dtoh from peer");
    assert_eq!(back, pattern(IPC_LEN, 9));
    d.copy_htod_sync(peer.base(), &[0xab; 16])
        .expect("htod to peer");
    drop(peer);
    step("parent", t0, "read, wrote and closed the mapping");

    let mut stdin = child.stdin.take().expect("stdin");
    writeln!(stdin, "done").expect("tell child");
    drop(stdin);
    let mut child_ok = false;
    while let Ok(line) = line_rx.recv_timeout(STEP_TIMEOUT) {
        child_ok |= line.contains("CHILD_OK");
        if child_ok {
            break;
        }
    }
    step("parent", t0, &format!("child reported ok: {child_ok}"));
    let status = child.wait().expect("wait child");
    step("parent", t0, &format!("child exited: {status:?}"));
    let _ = done_tx.send(());
    let _ = watchdog.join();
    let _ = reader.join();
    assert!(child_ok && status.success(), "child: {status:?}");
}
