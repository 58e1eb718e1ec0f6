//! Owners: the provider choice ([`Info`], [`select`]) and RAII owners of the fabric objects
//! ([`Object`]: fabric, domain, endpoint, completion queue, address vector, memory
//! registration). `Drop` closes an object and never panics: a failing close is logged.
//!
//! Lifetimes follow libfabric's rules: memory registrations and the endpoint before the address
//! vector and completion queue they are bound to, those before their domain, the domain before
//! its fabric. [`Fi`] holds them in that drop order.

use std::ffi::{CString, c_void};

use super::result::{self, lib, unavailable};
use super::sys::{
    self, FiAvAttr, FiCqAttr, FiInfo, FiMrAttr, Fid, FidAv, FidCq, FidDomain, FidEp, FidFabric,
    FidMr, IoVec, Lib,
};
use crate::error::Result;

/// The oldest libfabric API this transport asks for (1.10: `fi_mr_attr::iface`, `FI_HMEM`).
pub const MIN_API: u32 = sys::fi_version(1, 10);

/// One provider entry (`fi_info`), owned: a copy of the chosen entry of a `fi_getinfo` list.
pub(crate) struct Info {
    lib: &'static Lib,
    ptr: *mut FiInfo,
}

// SAFETY: an `fi_info` is plain data owned by this value; libfabric keeps no reference to it.
unsafe impl Send for Info {}
// SAFETY: as above; shared access only reads it.
unsafe impl Sync for Info {}

impl Drop for Info {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from fi_dupinfo and is freed once, here.
        unsafe { (self.lib.freeinfo)(self.ptr) };
    }
}

impl Info {
    /// The raw entry (for the calls that take it).
    pub(crate) fn raw(&self) -> *mut FiInfo {
        self.ptr
    }

    /// The provider's name (`tcp;ofi_rxm`, `verbs;ofi_rxm`, `efa`, `cxi`, …).
    pub(crate) fn provider(&self) -> String {
        // SAFETY: a live entry with its fabric attributes (fi_dupinfo copies them).
        unsafe { sys::c_str((*(*self.ptr).fabric_attr).prov_name) }
    }

    /// The fabric's name (e.g. `127.0.0.1/32`).
    pub(crate) fn fabric_name(&self) -> String {
        // SAFETY: as in `provider`.
        unsafe { sys::c_str((*(*self.ptr).fabric_attr).name) }
    }

    /// The domain's name (e.g. `lo`, `mlx5_0`).
    pub(crate) fn domain_name(&self) -> String {
        // SAFETY: a live entry with its domain attributes.
        unsafe { sys::c_str((*(*self.ptr).domain_attr).name) }
    }

    /// Capabilities.
    pub(crate) fn caps(&self) -> u64 {
        // SAFETY: a live entry.
        unsafe { (*self.ptr).caps }
    }

    /// Memory registration mode bits.
    pub(crate) fn mr_mode(&self) -> i32 {
        // SAFETY: a live entry with its domain attributes.
        unsafe { (*(*self.ptr).domain_attr).mr_mode }
    }

    /// Bytes of a memory key.
    pub(crate) fn mr_key_size(&self) -> usize {
        // SAFETY: as above.
        unsafe { (*(*self.ptr).domain_attr).mr_key_size }
    }

    /// The transmit side's message ordering.
    pub(crate) fn tx_msg_order(&self) -> u64 {
        // SAFETY: a live entry with its tx attributes.
        unsafe { (*(*self.ptr).tx_attr).msg_order }
    }

    /// Largest message.
    pub(crate) fn max_msg_size(&self) -> usize {
        // SAFETY: a live entry with its endpoint attributes.
        unsafe { (*(*self.ptr).ep_attr).max_msg_size }
    }
}

/// What a provider must offer, and which one to take.
#[derive(Clone, Debug, Default)]
pub struct Want {
    /// Only this provider (`MSCCLPP_OFI_PROVIDER`, e.g. `tcp`, `verbs`, `efa`, `cxi`; a
    /// layered name such as `tcp;ofi_rxm` works too); else the first usable one libfabric
    /// lists, leaving out `shm` (one node only) and the `sockets`, `udp` and `rxd` test
    /// providers, and fabrics of the loopback interface unless there is nothing else.
    pub provider: Option<String>,
    /// Registration of device (GPU) memory (`FI_HMEM`).
    pub hmem: bool,
}

/// Providers an automatic choice leaves out (module docs of [`Want::provider`]).
fn left_out(prov: &str) -> bool {
    prov == "shm" || prov.contains("sockets") || prov.contains("udp") || prov.contains("rxd")
}

/// Whether `i` is a fabric of the loopback interface.
fn loopback(i: &Info) -> bool {
    let (fabric, domain) = (i.fabric_name(), i.domain_name());
    domain == "lo" || fabric.starts_with("127.") || fabric.starts_with("::1")
}

/// `fi_getinfo` for an RDM endpoint with tagged messages and RMA writes (and what `want`
/// asks), once with send-after-write ordering and once without; returns the entries.
fn query(lib: &'static Lib, want: &Want) -> Result<Vec<Info>> {
    let version = (unsafe { (lib.version)() }).max(MIN_API);
    let mut found = Vec::new();
    for ordered in [true, false] {
        // SAFETY: fi_dupinfo(NULL) is fi_allocinfo: a zeroed entry with every attribute block
        // allocated; freed below with fi_freeinfo.
        let hints = unsafe { (lib.dupinfo)(std::ptr::null()) };
        if hints.is_null() {
            return Err(unavailable("fi_allocinfo failed (out of memory)".into()));
        }
        let prov = match &want.provider {
            // SAFETY: strdup'ed so that fi_freeinfo, which frees `prov_name`, frees memory
            // from malloc.
            Some(p) => CString::new(p.as_str())
                .ok()
                .map(|c| unsafe { libc::strdup(c.as_ptr()) }),
            None => None,
        };
        // SAFETY: `hints` is a fresh entry with all attribute blocks (see above).
        unsafe {
            let h = &mut *hints;
            h.caps = sys::FI_TAGGED
                | sys::FI_RMA
                | sys::FI_WRITE
                | sys::FI_REMOTE_WRITE
                | sys::FI_SEND
                | sys::FI_RECV
                | if want.hmem { sys::FI_HMEM } else { 0 };
            h.mode = sys::FI_CONTEXT | sys::FI_CONTEXT2;
            (*h.ep_attr).type_ = sys::FI_EP_RDM;
            let d = &mut *h.domain_attr;
            d.mr_mode = sys::FI_MR_LOCAL
                | sys::FI_MR_VIRT_ADDR
                | sys::FI_MR_ALLOCATED
                | sys::FI_MR_PROV_KEY
                | sys::FI_MR_ENDPOINT
                | sys::FI_MR_HMEM;
            d.threading = sys::FI_THREAD_DOMAIN;
            if ordered {
                (*h.tx_attr).msg_order = sys::FI_ORDER_SAW;
                (*h.rx_attr).msg_order = sys::FI_ORDER_SAW;
            }
            if let Some(p) = prov {
                (*h.fabric_attr).prov_name = p;
            }
        }
        // SAFETY: `hints` is live.
        let list = unsafe { result::getinfo(lib, version, hints) };
        // SAFETY: allocated by fi_dupinfo above, freed once.
        unsafe { (lib.freeinfo)(hints) };
        let Some(list) = list? else { continue };
        let mut e = list;
        while !e.is_null() {
            // SAFETY: `e` is an entry of the live list; fi_dupinfo copies one entry.
            let copy = unsafe { (lib.dupinfo)(e) };
            if !copy.is_null() {
                found.push(Info { lib, ptr: copy });
            }
            // SAFETY: `e` is live.
            e = unsafe { (*e).next };
        }
        // SAFETY: the list from fi_getinfo, freed once (the copies are independent).
        unsafe { (lib.freeinfo)(list) };
        if !found.is_empty() {
            break;
        }
    }
    Ok(found)
}

/// The provider this rank uses (see [`Want`]), or an `Unavailable` error saying why there
/// is none.
pub(crate) fn select(want: &Want) -> Result<Info> {
    let lib = lib()?;
    let mut all = query(lib, want)?;
    let n = all.len();
    // A fabric on the loopback interface reaches this host only: last, unless it is all there
    // is (FI_TCP_IFACE=lo, nodes emulated on one host).
    all.sort_by_key(loopback);
    all.into_iter()
        .find(|i| want.provider.is_some() || !left_out(&i.provider()))
        .ok_or_else(|| {
            unavailable(match &want.provider {
                Some(p) => format!(
                    "libfabric ({}) has no provider {p:?} with RDM endpoints, tagged messages and RMA writes{}",
                    lib.path(),
                    if want.hmem { " on device memory (FI_HMEM)" } else { "" }
                ),
                None => format!(
                    "libfabric ({}) lists {n} providers with RDM endpoints, tagged messages and RMA writes, none usable between nodes (shm, sockets, udp and rxd are left out unless MSCCLPP_OFI_PROVIDER names them)",
                    lib.path()
                ),
            })
        })
}

/// One provider as `mscclpp-info` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderInfo {
    /// Provider name.
    pub provider: String,
    /// Fabric name.
    pub fabric: String,
    /// Domain name.
    pub domain: String,
    /// Whether it registers device memory (`FI_HMEM`).
    pub hmem: bool,
    /// Whether its sends are ordered after earlier RMA writes (`FI_ORDER_SAW`: RMA writes go
    /// straight into registered memory; otherwise every write travels in messages).
    pub ordered: bool,
    /// Whether an automatic choice would leave it out (`shm`, `sockets`, `udp`, `rxd`).
    pub left_out: bool,
}

/// Every provider libfabric offers for this transport (RDM, tagged messages, RMA writes), in
/// libfabric's order, without repeats; or an `Unavailable` error when libfabric is missing.
pub fn providers() -> Result<Vec<ProviderInfo>> {
    let lib = lib()?;
    let mut out: Vec<ProviderInfo> = Vec::new();
    for i in query(lib, &Want::default())? {
        let p = ProviderInfo {
            provider: i.provider(),
            fabric: i.fabric_name(),
            domain: i.domain_name(),
            hmem: i.caps() & sys::FI_HMEM != 0,
            ordered: i.tx_msg_order() & sys::FI_ORDER_SAW != 0,
            left_out: left_out(&i.provider()),
        };
        if !out.contains(&p) {
            out.push(p);
        }
    }
    Ok(out)
}

/// A fabric object of type `T` (whose first field is its `struct fid`), closed on drop.
pub(crate) struct Object<T> {
    lib: &'static Lib,
    ptr: *mut T,
    what: &'static str,
    prov: String,
}

// SAFETY: the provider allows its objects to be used from any thread; this transport serializes
// every use of one connection's objects (`FI_THREAD_DOMAIN`, one lock per connection).
unsafe impl<T> Send for Object<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Object<T> {}

impl<T> Object<T> {
    fn new(lib: &'static Lib, ptr: *mut T, what: &'static str, prov: &str) -> Self {
        Self {
            lib,
            ptr,
            what,
            prov: prov.to_owned(),
        }
    }

    /// The raw object.
    pub(crate) fn raw(&self) -> *mut T {
        self.ptr
    }

    /// Its `struct fid`.
    pub(crate) fn fid(&self) -> *mut Fid {
        self.ptr.cast()
    }
}

impl<T> Drop for Object<T> {
    fn drop(&mut self) {
        // SAFETY: `ptr` is a live object whose first field is its fid, closed once, here;
        // objects bound to it were closed before (field order of `Fi`).
        if let Err(e) = unsafe { result::close(self.lib, self.what, self.fid(), &self.prov) } {
            tracing::warn!("libfabric: closing a {} failed: {e}", self.what);
        }
    }
}

impl Object<FidMr> {
    /// The key a peer names this registration by (`fi_mr_key`).
    pub(crate) fn key(&self) -> u64 {
        // SAFETY: a live registration; `key` is a plain field (what fi_mr_key reads).
        unsafe { (*self.ptr).key }
    }

    /// The local descriptor operations on it pass (`fi_mr_desc`).
    pub(crate) fn desc(&self) -> *mut c_void {
        // SAFETY: as above.
        unsafe { (*self.ptr).mem_desc }
    }
}

/// Where registered memory lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Iface {
    /// Host memory (the CPU backend's device memory included).
    System,
    /// CUDA device memory of this device ordinal.
    Cuda(i32),
}

/// The objects of one connection, in drop order (module docs).
pub(crate) struct Fi {
    /// Registrations, by an index the owner keeps.
    pub mrs: Vec<Object<FidMr>>,
    pub ep: Object<FidEp>,
    pub av: Object<FidAv>,
    pub cq: Object<FidCq>,
    pub domain: Object<FidDomain>,
    /// Kept open until everything above is closed.
    #[allow(dead_code)]
    pub fabric: Object<FidFabric>,
    pub info: Info,
    pub lib: &'static Lib,
    pub prov: String,
    /// `FI_MR_ENDPOINT`: registrations are bound to the endpoint and enabled.
    mr_endpoint: bool,
    /// Keys this side asks for when the provider does not pick them (`FI_MR_PROV_KEY` unset).
    next_key: u64,
}

impl Fi {
    /// Opens a fabric, domain, completion queue (tagged format, `cq_size` entries), address
    /// vector and RDM endpoint on `info`, binds and enables them.
    pub(crate) fn open(info: Info, cq_size: usize) -> Result<Self> {
        let lib = lib()?;
        let prov = info.provider();
        let p = prov.as_str();
        // SAFETY: `info` is a live entry; each object is opened from the one before, as
        // libfabric requires, and owned at once.
        unsafe {
            let fabric = Object::new(lib, result::fabric(lib, info.raw(), p)?, "fabric", p);
            let domain = Object::new(
                lib,
                result::domain(lib, fabric.raw(), info.raw(), p)?,
                "domain",
                p,
            );
            let mut cq_attr = FiCqAttr {
                size: cq_size,
                flags: 0,
                format: sys::FI_CQ_FORMAT_TAGGED,
                wait_obj: sys::FI_WAIT_NONE,
                signaling_vector: 0,
                wait_cond: 0,
                wait_set: std::ptr::null_mut(),
            };
            let cq = Object::new(
                lib,
                result::cq_open(lib, domain.raw(), &mut cq_attr, p)?,
                "completion queue",
                p,
            );
            let mut av_attr = FiAvAttr {
                type_: sys::FI_AV_TABLE,
                rx_ctx_bits: 0,
                count: 4,
                ep_per_node: 0,
                name: std::ptr::null(),
                map_addr: std::ptr::null_mut(),
                flags: 0,
            };
            let av = Object::new(
                lib,
                result::av_open(lib, domain.raw(), &mut av_attr, p)?,
                "address vector",
                p,
            );
            let ep = Object::new(
                lib,
                result::endpoint(lib, domain.raw(), info.raw(), p)?,
                "endpoint",
                p,
            );
            result::bind(
                lib,
                "fi_ep_bind(cq)",
                ep.fid(),
                cq.fid(),
                sys::FI_TRANSMIT | sys::FI_RECV,
                p,
            )?;
            result::bind(lib, "fi_ep_bind(av)", ep.fid(), av.fid(), 0, p)?;
            result::enable(lib, "fi_enable", ep.fid(), p)?;
            let mr_endpoint = info.mr_mode() & sys::FI_MR_ENDPOINT != 0;
            Ok(Self {
                mrs: Vec::new(),
                ep,
                av,
                cq,
                domain,
                fabric,
                info,
                lib,
                prov,
                mr_endpoint,
                next_key: 1,
            })
        }
    }

    /// The endpoint's address (what the peer inserts into its address vector).
    pub(crate) fn name(&self) -> Result<Vec<u8>> {
        // SAFETY: the endpoint is live and enabled.
        unsafe { result::getname(self.lib, self.ep.raw(), &self.prov) }
    }

    /// Inserts the peer's address; returns its handle.
    pub(crate) fn insert_peer(&self, addr: &[u8]) -> Result<u64> {
        // SAFETY: the address vector is live; `addr` is the peer's endpoint name, of the same
        // provider and fabric (checked by the caller).
        unsafe { result::av_insert(self.lib, self.av.raw(), addr, &self.prov) }
    }

    /// Registers `len` bytes at `addr` (in `iface`) for `access`; returns its index in `mrs`.
    ///
    /// # Safety
    /// The memory stays valid while the registration lives (as long as this `Fi`).
    pub(crate) unsafe fn register(
        &mut self,
        addr: u64,
        len: usize,
        access: u64,
        iface: Iface,
    ) -> Result<usize> {
        let iov = IoVec {
            base: addr as *mut c_void,
            len,
        };
        let (iface, device) = match iface {
            Iface::System => (sys::FI_HMEM_SYSTEM, 0),
            Iface::Cuda(d) => (sys::FI_HMEM_CUDA, d as u32 as u64),
        };
        let attr = FiMrAttr {
            mr_iov: &iov,
            iov_count: 1,
            access,
            offset: 0,
            requested_key: self.next_key,
            context: std::ptr::null_mut(),
            auth_key_size: 0,
            auth_key: std::ptr::null_mut(),
            iface,
            device,
        };
        self.next_key += 1;
        // SAFETY: the domain is live; `attr` describes memory the caller keeps valid.
        let mr = unsafe { result::mr_regattr(self.lib, self.domain.raw(), &attr, &self.prov) }?;
        let mr = Object::new(self.lib, mr, "memory registration", &self.prov);
        if self.mr_endpoint {
            // SAFETY: both live; FI_MR_ENDPOINT asks for exactly this before use.
            unsafe {
                result::bind(
                    self.lib,
                    "fi_mr_bind",
                    mr.fid(),
                    self.ep.fid(),
                    0,
                    &self.prov,
                )?;
                result::enable(self.lib, "fi_mr_enable", mr.fid(), &self.prov)?;
            }
        }
        self.mrs.push(mr);
        Ok(self.mrs.len() - 1)
    }
}
