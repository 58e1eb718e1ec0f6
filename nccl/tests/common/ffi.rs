//! The library, opened with `dlopen`, and its C symbols as typed function pointers.

use std::ffi::{CString, c_char, c_int, c_void};
use std::path::PathBuf;
use std::sync::OnceLock;

/// `ncclUniqueId`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId(pub [u8; 128]);

/// `ncclConfig_t` (NCCL 2.32).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Config {
    pub size: usize,
    pub magic: u32,
    pub version: u32,
    pub blocking: c_int,
    pub ints1: [c_int; 3],
    pub net_name: *const c_char,
    pub ints2: [c_int; 2],
    pub comm_name: *const c_char,
    pub ints3: [c_int; 15],
}

impl Default for Config {
    /// `NCCL_CONFIG_INITIALIZER`.
    fn default() -> Self {
        let u = c_int::MIN;
        Config {
            size: size_of::<Config>(),
            magic: 0xcafe_beef,
            version: 23203,
            blocking: u,
            ints1: [u; 3],
            net_name: std::ptr::null(),
            ints2: [u; 2],
            comm_name: std::ptr::null(),
            ints3: [u; 15],
        }
    }
}

/// `ncclCollConfig_t` (NCCL 2.32).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CollConfig {
    pub size: usize,
    pub magic: u32,
    pub version: u32,
    pub ext: *mut c_void,
    pub ctas: [c_int; 4],
    pub alg_selection: *const c_char,
    pub force_alg_selection: c_int,
    pub cta_policy: c_int,
    pub user_profiler_tag: u64,
    pub launch_completion_event: *mut c_void,
}

impl Default for CollConfig {
    /// `NCCL_COLLCONFIG_INITIALIZER`.
    fn default() -> Self {
        CollConfig {
            size: size_of::<CollConfig>(),
            magic: 0xcafe_beef,
            version: 23203,
            ext: std::ptr::null_mut(),
            ctas: [c_int::MIN; 4],
            alg_selection: std::ptr::null(),
            force_alg_selection: 1,
            cta_policy: c_int::MIN,
            user_profiler_tag: 0,
            launch_completion_event: std::ptr::null_mut(),
        }
    }
}

/// `ncclTeam_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Team {
    pub n_ranks: c_int,
    pub rank: c_int,
    pub stride: c_int,
}

/// `ncclWaitSignalDesc_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct WaitSignalDesc {
    pub op_cnt: c_int,
    pub peer: c_int,
    pub sig_idx: c_int,
    pub ctx: c_int,
}

type P = *mut c_void;
type Cp = *const c_void;

macro_rules! symbols {
    ($($field:ident = $sym:literal: fn($($t:ty),*) -> $r:ty;)*) => {
        /// The library's symbols.
        pub struct Nccl {
            /// The `dlopen` handle (as an integer: the struct is shared by rank threads).
            pub handle: usize,
            $(#[doc = $sym] pub $field: unsafe extern "C" fn($($t),*) -> $r,)*
        }

        impl Nccl {
            fn load(path: &std::path::Path) -> Nccl {
                let c = CString::new(path.as_os_str().as_encoded_bytes()).expect("a path");
                // SAFETY: a NUL-terminated path; the library's initialisers are Rust statics.
                let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
                assert!(!h.is_null(), "dlopen {} failed: {}", path.display(), dl_error());
                Nccl {
                    handle: h as usize,
                    $($field: {
                        let p = symbol(h, $sym);
                        // SAFETY: the symbol is the function of this prototype (nccl.h).
                        unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($t),*) -> $r>(p) }
                    },)*
                }
            }
        }
    };
}

fn dl_error() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "no reason given".into()
    } else {
        // SAFETY: as above.
        unsafe { std::ffi::CStr::from_ptr(e) }
            .to_string_lossy()
            .into_owned()
    }
}

/// The address of `name` in the library `h`, or a panic naming it.
pub fn symbol(h: *mut c_void, name: &str) -> *mut c_void {
    let c = CString::new(name).expect("a name");
    // SAFETY: a live handle and a NUL-terminated name.
    let p = unsafe { libc::dlsym(h, c.as_ptr()) };
    assert!(
        !p.is_null(),
        "the library does not export {name}: {}",
        dl_error()
    );
    p
}

symbols! {
    get_version = "ncclGetVersion": fn(*mut c_int) -> c_int;
    get_unique_id = "ncclGetUniqueId": fn(*mut UniqueId) -> c_int;
    comm_init_rank = "ncclCommInitRank": fn(*mut P, c_int, UniqueId, c_int) -> c_int;
    comm_init_rank_config = "ncclCommInitRankConfig": fn(*mut P, c_int, UniqueId, c_int, *mut Config) -> c_int;
    comm_init_rank_scalable = "ncclCommInitRankScalable": fn(*mut P, c_int, c_int, c_int, *mut UniqueId, *mut Config) -> c_int;
    comm_init_all = "ncclCommInitAll": fn(*mut P, c_int, *const c_int) -> c_int;
    comm_split = "ncclCommSplit": fn(P, c_int, c_int, *mut P, *mut Config) -> c_int;
    comm_revoke = "ncclCommRevoke": fn(P, c_int) -> c_int;
    comm_shrink = "ncclCommShrink": fn(P, *mut c_int, c_int, *mut P, *mut Config, c_int) -> c_int;
    comm_get_unique_id = "ncclCommGetUniqueId": fn(P, *mut UniqueId) -> c_int;
    comm_grow = "ncclCommGrow": fn(P, c_int, *const UniqueId, c_int, *mut P, *mut Config) -> c_int;
    comm_finalize = "ncclCommFinalize": fn(P) -> c_int;
    comm_destroy = "ncclCommDestroy": fn(P) -> c_int;
    comm_abort = "ncclCommAbort": fn(P) -> c_int;
    comm_get_async_error = "ncclCommGetAsyncError": fn(P, *mut c_int) -> c_int;
    comm_count = "ncclCommCount": fn(P, *mut c_int) -> c_int;
    comm_cu_device = "ncclCommCuDevice": fn(P, *mut c_int) -> c_int;
    comm_user_rank = "ncclCommUserRank": fn(P, *mut c_int) -> c_int;
    get_error_string = "ncclGetErrorString": fn(c_int) -> *const c_char;
    get_last_error = "ncclGetLastError": fn(P) -> *const c_char;
    mem_alloc = "ncclMemAlloc": fn(*mut P, usize) -> c_int;
    mem_free = "ncclMemFree": fn(P) -> c_int;
    comm_register = "ncclCommRegister": fn(P, P, usize, *mut P) -> c_int;
    comm_deregister = "ncclCommDeregister": fn(P, P) -> c_int;
    window_register = "ncclCommWindowRegister": fn(P, P, usize, *mut P, c_int) -> c_int;
    window_deregister = "ncclCommWindowDeregister": fn(P, P) -> c_int;
    win_get_user_ptr = "ncclWinGetUserPtr": fn(P, P, *mut P) -> c_int;
    put_signal = "ncclPutSignal": fn(Cp, usize, c_int, c_int, P, usize, c_int, c_int, u32, P, P) -> c_int;
    signal = "ncclSignal": fn(c_int, c_int, c_int, u32, P, P) -> c_int;
    wait_signal = "ncclWaitSignal": fn(c_int, *mut WaitSignalDesc, P, P) -> c_int;
    red_op_create_pre_mul_sum = "ncclRedOpCreatePreMulSum": fn(*mut c_int, P, c_int, c_int, P) -> c_int;
    red_op_destroy = "ncclRedOpDestroy": fn(c_int, P) -> c_int;
    all_reduce = "ncclAllReduce": fn(Cp, P, usize, c_int, c_int, P, P) -> c_int;
    all_gather = "ncclAllGather": fn(Cp, P, usize, c_int, P, P) -> c_int;
    reduce_scatter = "ncclReduceScatter": fn(Cp, P, usize, c_int, c_int, P, P) -> c_int;
    broadcast = "ncclBroadcast": fn(Cp, P, usize, c_int, c_int, P, P) -> c_int;
    bcast = "ncclBcast": fn(P, usize, c_int, c_int, P, P) -> c_int;
    all_to_all = "ncclAlltoAll": fn(Cp, P, usize, c_int, P, P) -> c_int;
    all_to_all_alias = "ncclAllToAll": fn(Cp, P, usize, c_int, P, P) -> c_int;
    reduce = "ncclReduce": fn(Cp, P, usize, c_int, c_int, c_int, P, P) -> c_int;
    gather = "ncclGather": fn(Cp, P, usize, c_int, c_int, P, P) -> c_int;
    scatter = "ncclScatter": fn(Cp, P, usize, c_int, c_int, P, P) -> c_int;
    all_reduce_config = "ncclAllReduceConfig": fn(Cp, P, usize, c_int, c_int, P, P, *const CollConfig) -> c_int;
    all_gather_config = "ncclAllGatherConfig": fn(Cp, P, usize, c_int, P, P, *const CollConfig) -> c_int;
    send = "ncclSend": fn(Cp, usize, c_int, c_int, P, P) -> c_int;
    recv = "ncclRecv": fn(P, usize, c_int, c_int, P, P) -> c_int;
    group_start = "ncclGroupStart": fn() -> c_int;
    group_end = "ncclGroupEnd": fn() -> c_int;
    group_simulate_end = "ncclGroupSimulateEnd": fn(P) -> c_int;
    team_world = "ncclTeamWorld": fn(P) -> Team;
    lla2a_calc_slots = "ncclLLA2ACalcSlots": fn(c_int, c_int) -> c_int;
    cpu_stream_create = "mscclppCpuStreamCreate": fn(*mut P) -> c_int;
    cpu_stream_synchronize = "mscclppCpuStreamSynchronize": fn(P) -> c_int;
    cpu_stream_destroy = "mscclppCpuStreamDestroy": fn(P) -> c_int;
}

/// Where the library is: `MSCCLPP_NCCL_LIB`, else the `cdylib` cargo built next to this test
/// binary (`target/<profile>/deps/` or its parent).
pub fn lib_path() -> PathBuf {
    if let Some(p) = std::env::var_os("MSCCLPP_NCCL_LIB") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("the test binary's directory");
    for dir in [Some(deps), deps.parent()].into_iter().flatten() {
        let p = dir.join("libmscclpp_nccl.so");
        if p.exists() {
            return p;
        }
    }
    panic!(
        "libmscclpp_nccl.so is not next to {} (cargo builds it with this test; or set MSCCLPP_NCCL_LIB)",
        exe.display()
    )
}

/// The library, loaded once per process.
pub fn nccl() -> &'static Nccl {
    static LIB: OnceLock<Nccl> = OnceLock::new();
    LIB.get_or_init(|| Nccl::load(&lib_path()))
}
