//! The NCCL baseline: NCCL loaded at run time, one communicator per rank, on our streams and
//! our buffers.
//!
//! Three layers, as for the CUDA driver (STYLE item 3):
//! 1. the C declarations: the types come from cudarc's `nccl::sys` (version level 2.28), the
//!    entry points are looked up here with `dlsym` ([`Nccl::load`]). cudarc's own loader is not
//!    used because it only tries names like `libnccl.so` and `libnccl.so.13` and panics when
//!    none loads, while NCCL 2.x's file is `libnccl.so.2` (the PyTorch wheel ships only that);
//! 2. [`Nccl`]'s methods: one per NCCL call, returning a [`NcclError`] that names the call;
//! 3. [`Comm`]: the RAII owner of an `ncclComm_t` (`ncclCommDestroy` on drop, logged on
//!    failure).
//!
//! Where the library is searched, in order: `MSCCLPP_NCCL_LIB` (the file, or a folder holding
//! `libnccl.so.2`); `libnccl.so.2` and `libnccl.so` on the loader's path (`LD_LIBRARY_PATH`,
//! the ld cache); `nvidia/*/lib/libnccl.so*` under the site-packages of `python3` (where the
//! `nvidia-nccl-cu*` wheels that PyTorch depends on put it).
//!
//! NVLink SHARP (multicast) must stay off on shared machines: the bench sets
//! `NCCL_NVLS_ENABLE=0` at start unless it is set, before any NCCL call.

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

use cudarc::nccl::sys;
use mscclpp::collectives::{Call, Reduction, Scalar};
use mscclpp::host::communicator::Communicator;
use mscclpp::host::gpu::{Gpu, Stream};
use mscclpp::shared::{DataType, DevicePtr};

use super::BoxError;

/// Environment variable naming the NCCL library (file or folder).
pub const NCCL_LIB_ENV: &str = "MSCCLPP_NCCL_LIB";

/// `ncclResult_t` as a plain integer (a value NCCL adds later must not be undefined behaviour).
type NcclResult = c_uint;

/// An NCCL call that failed.
#[derive(Debug)]
pub struct NcclError {
    /// The entry point.
    pub call: &'static str,
    /// The `ncclResult_t`.
    pub code: u32,
    /// `ncclGetErrorString`.
    pub message: String,
}

impl std::fmt::Display for NcclError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} failed: {} ({})", self.call, self.message, self.code)
    }
}

impl std::error::Error for NcclError {}

type Stream_ = sys::cudaStream_t;

// The entry points' C signatures (nccl.h, with cudarc's `nccl::sys` types).
type GetVersion = unsafe extern "C" fn(*mut c_int) -> NcclResult;
type GetErrorString = unsafe extern "C" fn(NcclResult) -> *const c_char;
type GetUniqueId = unsafe extern "C" fn(*mut sys::ncclUniqueId) -> NcclResult;
type CommInitRank =
    unsafe extern "C" fn(*mut sys::ncclComm_t, c_int, sys::ncclUniqueId, c_int) -> NcclResult;
type CommDestroy = unsafe extern "C" fn(sys::ncclComm_t) -> NcclResult;
type Group = unsafe extern "C" fn() -> NcclResult;
type Reduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    sys::ncclDataType_t,
    sys::ncclRedOp_t,
    sys::ncclComm_t,
    Stream_,
) -> NcclResult;
type Gather = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    sys::ncclDataType_t,
    sys::ncclComm_t,
    Stream_,
) -> NcclResult;
type ReduceRoot = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    sys::ncclDataType_t,
    sys::ncclRedOp_t,
    c_int,
    sys::ncclComm_t,
    Stream_,
) -> NcclResult;
type RedOpCreatePreMulSum = unsafe extern "C" fn(
    *mut sys::ncclRedOp_t,
    *mut c_void,
    sys::ncclDataType_t,
    sys::ncclScalarResidence_t,
    sys::ncclComm_t,
) -> NcclResult;
type RedOpDestroy = unsafe extern "C" fn(sys::ncclRedOp_t, sys::ncclComm_t) -> NcclResult;
type Broadcast = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    sys::ncclDataType_t,
    c_int,
    sys::ncclComm_t,
    Stream_,
) -> NcclResult;
type Send = unsafe extern "C" fn(
    *const c_void,
    usize,
    sys::ncclDataType_t,
    c_int,
    sys::ncclComm_t,
    Stream_,
) -> NcclResult;
type Recv = unsafe extern "C" fn(
    *mut c_void,
    usize,
    sys::ncclDataType_t,
    c_int,
    sys::ncclComm_t,
    Stream_,
) -> NcclResult;

struct Fns {
    get_version: GetVersion,
    get_error_string: GetErrorString,
    get_unique_id: GetUniqueId,
    comm_init_rank: CommInitRank,
    comm_destroy: CommDestroy,
    group_start: Group,
    group_end: Group,
    all_reduce: Reduce,
    all_gather: Gather,
    reduce_scatter: Reduce,
    broadcast: Broadcast,
    send: Send,
    recv: Recv,
    reduce: ReduceRoot,
    red_op_create_pre_mul_sum: RedOpCreatePreMulSum,
    red_op_destroy: RedOpDestroy,
    /// `ncclGather` / `ncclScatter` (root-taking, as `ncclBroadcast`): NCCL 2.28 and newer.
    gather: Option<Broadcast>,
    scatter: Option<Broadcast>,
}

/// The loaded library (loaded once per process, never unloaded).
pub struct Nccl {
    fns: Fns,
    /// Where it was found.
    pub path: String,
    /// `major.minor.patch` from `ncclGetVersion`.
    pub version: String,
}

fn dlerror() -> String {
    // SAFETY: `dlerror` returns null or a NUL-terminated string owned by libc, valid until the
    // next dl* call on this thread; it is copied at once.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".to_string()
    } else {
        // SAFETY: as above.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// `dlopen(name)`; the handle is never closed (the library stays for the process).
fn open(name: &str) -> Result<*mut c_void, String> {
    let c = CString::new(name).map_err(|_| format!("{name:?}: contains a NUL byte"))?;
    // SAFETY: `c` is NUL-terminated; loading runs the library's initialisers, which is what
    // loading NCCL is for.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() { Err(dlerror()) } else { Ok(h) }
}

/// `nvidia/*/lib/libnccl.so*` under python3's site-packages, if python3 runs and finds one.
fn from_python() -> Option<String> {
    const SCRIPT: &str = "import glob, os, site, sys\n\
        dirs = list(getattr(site, 'getsitepackages', lambda: [])()) + [site.getusersitepackages()] + sys.path\n\
        for d in dirs:\n\
        \x20   hits = sorted(glob.glob(os.path.join(d, 'nvidia', '*', 'lib', 'libnccl.so*')))\n\
        \x20   if hits:\n\
        \x20       print(hits[0]); break\n";
    let out = std::process::Command::new("python3")
        .args(["-c", SCRIPT])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let path = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!path.is_empty()).then_some(path)
}

impl Nccl {
    /// Finds and loads NCCL (see the module docs for where); the same answer for the whole
    /// process.
    pub fn load() -> Result<&'static Nccl, String> {
        static LIB: OnceLock<Result<Nccl, String>> = OnceLock::new();
        LIB.get_or_init(Self::find).as_ref().map_err(Clone::clone)
    }

    fn find() -> Result<Nccl, String> {
        let mut tried = Vec::new();
        let mut candidates: Vec<String> = Vec::new();
        if let Ok(p) = std::env::var(NCCL_LIB_ENV)
            && !p.trim().is_empty()
        {
            let path = std::path::Path::new(p.trim());
            candidates.push(if path.is_dir() {
                path.join("libnccl.so.2").display().to_string()
            } else {
                path.display().to_string()
            });
        }
        candidates.push("libnccl.so.2".into());
        candidates.push("libnccl.so".into());
        for name in &candidates {
            match open(name) {
                Ok(h) => return Self::bind(h, name),
                Err(e) => tried.push(format!("{name}: {e}")),
            }
        }
        match from_python() {
            Some(p) => match open(&p) {
                Ok(h) => return Self::bind(h, &p),
                Err(e) => tried.push(format!("{p}: {e}")),
            },
            None => tried.push("python3 site-packages: no nvidia/*/lib/libnccl.so*".into()),
        }
        Err(format!(
            "the NCCL baseline needs libnccl, which could not be loaded (set {NCCL_LIB_ENV}=/path/to/libnccl.so.2 \
             or add its folder to LD_LIBRARY_PATH); tried:\n  {}",
            tried.join("\n  ")
        ))
    }

    fn bind(h: *mut c_void, path: &str) -> Result<Nccl, String> {
        let sym = |name: &str| -> Result<*mut c_void, String> {
            let c = CString::new(name).map_err(|_| "bad symbol name".to_string())?;
            // SAFETY: `h` is a live handle from `dlopen`; `c` is NUL-terminated.
            let p = unsafe { libc::dlsym(h, c.as_ptr()) };
            if p.is_null() {
                Err(format!("{path} has no {name} (NCCL older than 2.7?)"))
            } else {
                Ok(p)
            }
        };
        macro_rules! f {
            ($name:literal, $t:ty) => {
                // SAFETY: the symbol is NCCL's entry point of that name, whose C signature (from
                // nccl.h, as bound by cudarc's `nccl::sys`) is `$t`; fn pointers and data
                // pointers have the same size on the platforms NCCL supports.
                unsafe { std::mem::transmute::<*mut c_void, $t>(sym($name)?) }
            };
        }
        let fns = Fns {
            get_version: f!("ncclGetVersion", GetVersion),
            get_error_string: f!("ncclGetErrorString", GetErrorString),
            get_unique_id: f!("ncclGetUniqueId", GetUniqueId),
            comm_init_rank: f!("ncclCommInitRank", CommInitRank),
            comm_destroy: f!("ncclCommDestroy", CommDestroy),
            group_start: f!("ncclGroupStart", Group),
            group_end: f!("ncclGroupEnd", Group),
            all_reduce: f!("ncclAllReduce", Reduce),
            all_gather: f!("ncclAllGather", Gather),
            reduce_scatter: f!("ncclReduceScatter", Reduce),
            broadcast: f!("ncclBroadcast", Broadcast),
            send: f!("ncclSend", Send),
            recv: f!("ncclRecv", Recv),
            reduce: f!("ncclReduce", ReduceRoot),
            red_op_create_pre_mul_sum: f!("ncclRedOpCreatePreMulSum", RedOpCreatePreMulSum),
            red_op_destroy: f!("ncclRedOpDestroy", RedOpDestroy),
            gather: sym("ncclGather").ok().map(|p| {
                // SAFETY: as in `f!` (NCCL 2.28's ncclGather has ncclBroadcast's signature).
                unsafe { std::mem::transmute::<*mut c_void, Broadcast>(p) }
            }),
            scatter: sym("ncclScatter").ok().map(|p| {
                // SAFETY: as above, for ncclScatter.
                unsafe { std::mem::transmute::<*mut c_void, Broadcast>(p) }
            }),
        };
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid out-pointer.
        let r = unsafe { (fns.get_version)(&mut v) };
        let version = if r == 0 {
            format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100)
        } else {
            "unknown".into()
        };
        Ok(Nccl {
            fns,
            path: path.to_string(),
            version,
        })
    }

    fn check(&self, call: &'static str, r: NcclResult) -> Result<(), NcclError> {
        if r == 0 {
            return Ok(());
        }
        // SAFETY: NCCL returns a static NUL-terminated string for any code.
        let s = unsafe { (self.fns.get_error_string)(r) };
        let message = if s.is_null() {
            "unknown error".into()
        } else {
            // SAFETY: as above.
            unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
        };
        Err(NcclError {
            call,
            code: r,
            message,
        })
    }
}

fn nccl_type(d: DataType) -> sys::ncclDataType_t {
    use sys::ncclDataType_t as T;
    match d {
        DataType::F32 => T::ncclFloat32,
        DataType::F16 => T::ncclFloat16,
        DataType::BF16 => T::ncclBfloat16,
        DataType::I32 => T::ncclInt32,
        DataType::U32 => T::ncclUint32,
        DataType::I8 => T::ncclInt8,
        DataType::U8 => T::ncclUint8,
        DataType::I64 => T::ncclInt64,
        DataType::U64 => T::ncclUint64,
        DataType::F64 => T::ncclFloat64,
        DataType::F8E4M3 => T::ncclFloat8e4m3,
        DataType::F8E5M2 => T::ncclFloat8e5m2,
    }
}

/// NCCL's operator for `o`: a built-in one, or (`Err`) the scalar of a pre-multiplied sum by
/// value, which is created per call; `None` for what the baseline does not serve (a scalar in
/// device memory, an operator added to the library later).
fn nccl_op(o: Reduction) -> Option<Result<sys::ncclRedOp_t, u64>> {
    use sys::ncclRedOp_t as R;
    Some(Ok(match o {
        Reduction::Sum => R::ncclSum,
        Reduction::Prod => R::ncclProd,
        Reduction::Min => R::ncclMin,
        Reduction::Max => R::ncclMax,
        Reduction::Avg => R::ncclAvg,
        Reduction::PreMulSum(Scalar::Host(bits)) => return Some(Err(bits)),
        _ => return None,
    }))
}

/// One rank's NCCL communicator, on its [`Communicator`]'s device.
pub struct Comm {
    nccl: &'static Nccl,
    raw: sys::ncclComm_t,
    gpu: Gpu,
    nranks: usize,
}

impl Comm {
    /// Creates the communicator of this rank (collective: every rank calls it): rank 0 makes
    /// the NCCL unique id, our bootstrap broadcasts it, each rank calls `ncclCommInitRank` with
    /// its device current.
    pub fn new(comm: &Communicator) -> Result<Self, BoxError> {
        // Every rank learns whether every rank has NCCL before any blocks inside NCCL (a rank
        // waiting in ncclCommInitRank for one that never comes would wait forever).
        let loaded = Nccl::load();
        let all = comm.bootstrap().all_gather(&[u8::from(loaded.is_ok())])?;
        let nccl = loaded?;
        if let Some(r) = all.iter().position(|v| v.first() != Some(&1)) {
            return Err(format!("rank {r} could not load NCCL").into());
        }
        comm.gpu().bind_to_thread()?;
        let mut id = sys::ncclUniqueId { internal: [0; 128] };
        let mut bytes = Vec::new();
        let mut id_err = None;
        if comm.rank() == 0 {
            // SAFETY: `id` is a valid out-pointer.
            match nccl.check("ncclGetUniqueId", unsafe {
                (nccl.fns.get_unique_id)(&mut id)
            }) {
                Ok(()) => bytes = id.internal.iter().map(|&c| c as u8).collect(),
                Err(e) => id_err = Some(e),
            }
        }
        // Rank 0 sends nothing when it has no id, so that the others fail too.
        comm.bootstrap().broadcast(0, &mut bytes)?;
        if let Some(e) = id_err {
            return Err(e.into());
        }
        if bytes.len() != id.internal.len() {
            return Err("rank 0 could not make an NCCL unique id".into());
        }
        for (d, s) in id.internal.iter_mut().zip(&bytes) {
            *d = *s as c_char;
        }
        let mut raw: sys::ncclComm_t = std::ptr::null_mut();
        let (n, r) = (comm.size() as c_int, comm.rank() as c_int);
        // SAFETY: `raw` is a valid out-pointer; `id` is rank 0's id; the calling thread's
        // current device is this rank's.
        nccl.check("ncclCommInitRank", unsafe {
            (nccl.fns.comm_init_rank)(&mut raw, n, id, r)
        })?;
        Ok(Self {
            nccl,
            raw,
            gpu: comm.gpu().clone(),
            nranks: comm.size(),
        })
    }

    /// Calls `f` with NCCL's operator for `op` on `dtype`: a built-in one, or a pre-multiplied
    /// sum by the operator's scalar created for the call and destroyed once it is queued (NCCL
    /// allows that as soon as the last call given the operator has returned).
    fn with_op(
        &self,
        op: Reduction,
        dtype: DataType,
        f: impl FnOnce(sys::ncclRedOp_t) -> Result<(), NcclError>,
    ) -> Result<(), BoxError> {
        let bits = match nccl_op(op) {
            Some(Ok(o)) => return Ok(f(o)?),
            Some(Err(bits)) => bits,
            None => return Err(format!("the NCCL baseline does not serve {op:?}").into()),
        };
        let fns = &self.nccl.fns;
        let mut scalar = bits.to_le_bytes();
        let mut o = sys::ncclRedOp_t::ncclSum;
        // SAFETY: `o` is a valid out-pointer; `scalar` holds one element of `dtype` (and more
        // bytes), read during the call (host-immediate); `self.raw` is live.
        self.nccl.check("ncclRedOpCreatePreMulSum", unsafe {
            (fns.red_op_create_pre_mul_sum)(
                &mut o,
                scalar.as_mut_ptr().cast(),
                nccl_type(dtype),
                sys::ncclScalarResidence_t::ncclScalarHostImmediate,
                self.raw,
            )
        })?;
        let r = f(o);
        // SAFETY: `o` was created above on `self.raw`; the call that used it has returned.
        let d = self.nccl.check("ncclRedOpDestroy", unsafe {
            (fns.red_op_destroy)(o, self.raw)
        });
        r?;
        Ok(d?)
    }

    fn stream(s: &Stream) -> Result<Stream_, BoxError> {
        s.cuda_raw()
            .map(|r| r as Stream_)
            .ok_or_else(|| "the NCCL baseline needs the CUDA backend".into())
    }

    /// Queues `call` on NCCL, on our buffers and stream (what `Collectives::queue` queues on
    /// ours): each collective by its NCCL function (gather and scatter need NCCL 2.28 or
    /// newer: an older one is an error that says so); all-to-all, all-to-all-v and the
    /// point-to-point calls as one group of sends and receives (as nccl-tests does).
    ///
    /// # Safety
    /// As [`Collectives::queue`](mscclpp::collectives::Collectives::queue).
    pub unsafe fn queue(&self, call: &Call, stream: &Stream) -> Result<(), BoxError> {
        let s = Self::stream(stream)?;
        let (f, raw, nccl) = (&self.nccl.fns, self.raw, self.nccl);
        let p = |p: DevicePtr<u8>| p.addr() as *mut c_void;
        let dt = nccl_type(call.dtype());
        let at = |b: DevicePtr<u8>, elements: usize| {
            b.byte_add_cast::<u8>((elements * call.dtype().size()) as u64)
        };
        // SAFETY (every NCCL call below): the caller's contract for the buffers; `self.raw` is
        // live.
        match call {
            &Call::AllReduce {
                input,
                output,
                count,
                dtype,
                op,
            } => self.with_op(op, dtype, |op| {
                let r = unsafe { (f.all_reduce)(p(input), p(output), count, dt, op, raw, s) };
                nccl.check("ncclAllReduce", r)
            }),
            &Call::Reduce {
                input,
                output,
                count,
                dtype,
                op,
                root,
            } => self.with_op(op, dtype, |op| {
                let root = root as c_int;
                let r = unsafe { (f.reduce)(p(input), p(output), count, dt, op, root, raw, s) };
                nccl.check("ncclReduce", r)
            }),
            &Call::ReduceScatter {
                input,
                output,
                count,
                dtype,
                op,
            } => self.with_op(op, dtype, |op| {
                let r = unsafe { (f.reduce_scatter)(p(input), p(output), count, dt, op, raw, s) };
                nccl.check("ncclReduceScatter", r)
            }),
            &Call::AllGather {
                input,
                output,
                count,
                ..
            } => {
                let r = unsafe { (f.all_gather)(p(input), p(output), count, dt, raw, s) };
                Ok(nccl.check("ncclAllGather", r)?)
            }
            &Call::Broadcast {
                input,
                output,
                count,
                root,
                ..
            } => {
                let root = root as c_int;
                let r = unsafe { (f.broadcast)(p(input), p(output), count, dt, root, raw, s) };
                Ok(nccl.check("ncclBroadcast", r)?)
            }
            &Call::Gather {
                input,
                output,
                count,
                root,
                ..
            }
            | &Call::Scatter {
                input,
                output,
                count,
                root,
                ..
            } => {
                let (g, name) = match call {
                    Call::Gather { .. } => (f.gather, "ncclGather"),
                    _ => (f.scatter, "ncclScatter"),
                };
                let Some(g) = g else {
                    let v = &nccl.version;
                    return Err(
                        format!("NCCL {v} has no {name} (NCCL 2.28 and newer have it)").into(),
                    );
                };
                let r = unsafe { g(p(input), p(output), count, dt, root as c_int, raw, s) };
                Ok(nccl.check(name, r)?)
            }
            &Call::AllToAll {
                input,
                output,
                count,
                dtype,
            } => {
                let parts = |b| (0..self.nranks).map(move |q| (at(b, q * count), count, q));
                let (sends, recvs): (Vec<_>, Vec<_>) =
                    (parts(input).collect(), parts(output).collect());
                // SAFETY: the caller's contract.
                unsafe { self.exchange(&sends, &recvs, dtype, stream) }
            }
            Call::AllToAllv {
                input,
                output,
                send_counts,
                send_displs,
                recv_counts,
                recv_displs,
                dtype,
            } => {
                let each = |b, counts: &[usize], displs: &[usize]| -> Vec<_> {
                    (0..counts.len())
                        .map(|q| (at(b, displs[q]), counts[q], q))
                        .collect()
                };
                let sends = each(*input, send_counts, send_displs);
                let recvs = each(*output, recv_counts, recv_displs);
                // SAFETY: the caller's contract.
                unsafe { self.exchange(&sends, &recvs, *dtype, stream) }
            }
            &Call::Send {
                input,
                count,
                dtype,
                peer,
            } => {
                // SAFETY: the caller's contract.
                unsafe { self.exchange(&[(input, count, peer)], &[], dtype, stream) }
            }
            &Call::Recv {
                output,
                count,
                dtype,
                peer,
            } => {
                // SAFETY: the caller's contract.
                unsafe { self.exchange(&[], &[(output, count, peer)], dtype, stream) }
            }
            &Call::SendRecv {
                input,
                next,
                output,
                prev,
                count,
                dtype,
            } => {
                let (sends, recvs) = ([(input, count, next)], [(output, count, prev)]);
                // SAFETY: the caller's contract.
                unsafe { self.exchange(&sends, &recvs, dtype, stream) }
            }
            other => Err(format!("the NCCL baseline does not serve {}", other.name()).into()),
        }
    }

    /// One group of sends and receives, each (buffer, count, peer).
    ///
    /// # Safety
    /// Every buffer holds its count of elements until the queued work completes.
    unsafe fn exchange(
        &self,
        sends: &[(DevicePtr<u8>, usize, usize)],
        recvs: &[(DevicePtr<u8>, usize, usize)],
        dtype: DataType,
        stream: &Stream,
    ) -> Result<(), BoxError> {
        let s = Self::stream(stream)?;
        let f = &self.nccl.fns;
        // SAFETY: no arguments.
        self.nccl
            .check("ncclGroupStart", unsafe { (f.group_start)() })?;
        let mut first_err = Ok(());
        for &(p, count, to) in sends {
            // SAFETY: the caller's contract; `self.raw` is live.
            let r = unsafe {
                (f.send)(
                    p.addr() as *const c_void,
                    count,
                    nccl_type(dtype),
                    to as c_int,
                    self.raw,
                    s,
                )
            };
            if first_err.is_ok() {
                first_err = self.nccl.check("ncclSend", r);
            }
        }
        for &(p, count, from) in recvs {
            // SAFETY: as above.
            let r = unsafe {
                (f.recv)(
                    p.addr() as *mut c_void,
                    count,
                    nccl_type(dtype),
                    from as c_int,
                    self.raw,
                    s,
                )
            };
            if first_err.is_ok() {
                first_err = self.nccl.check("ncclRecv", r);
            }
        }
        // The group is always closed, even after a failed call inside it.
        // SAFETY: no arguments.
        let end = self.nccl.check("ncclGroupEnd", unsafe { (f.group_end)() });
        first_err?;
        Ok(end?)
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if let Err(e) = self.gpu.bind_to_thread() {
            eprintln!("mscclpp-bench: before ncclCommDestroy: {e}");
        }
        // SAFETY: `self.raw` is owned by `self` and destroyed only here.
        let r = unsafe { (self.nccl.fns.comm_destroy)(self.raw) };
        if let Err(e) = self.nccl.check("ncclCommDestroy", r) {
            eprintln!("mscclpp-bench: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs anywhere: NCCL loads (GPU machines) or the error says where it looked and what to
    /// set, and never panics.
    #[test]
    fn loading_nccl_never_panics() {
        match Nccl::load() {
            Ok(n) => {
                eprintln!("NCCL {} from {}", n.version, n.path);
                assert!(n.version.starts_with("2."), "{}", n.version);
            }
            Err(e) => {
                eprintln!("{e}");
                assert!(
                    e.contains(NCCL_LIB_ENV) && e.contains("libnccl.so.2"),
                    "{e}"
                );
            }
        }
    }
}
