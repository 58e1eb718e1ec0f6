//! The host crate's one error type. Each variant names the operation that failed and carries its
//! context and, where there is one, its source. Sections follow the crate's modules.

use std::path::PathBuf;

use crate::gpu::BackendKind;

/// Result with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A CUDA driver call that returned an error (the source of the GPU variants).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} failed: {name} ({code})")]
pub struct DriverError {
    /// The driver function, e.g. `cuIpcOpenMemHandle_v2`.
    pub call: &'static str,
    /// The `CUresult` value.
    pub code: u32,
    /// The `CUresult` name, e.g. `CUDA_ERROR_INVALID_VALUE`.
    pub name: String,
}

/// Errors of mscclpp-host.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ---- backend selection and devices (gpu) ----
    /// `MSCCLPP_BACKEND` holds something other than `cuda` or `cpu`.
    #[error("MSCCLPP_BACKEND={0:?} is not a backend (use `cuda` or `cpu`)")]
    UnknownBackend(String),
    /// The CUDA driver library (libcuda.so) could not be loaded.
    #[error("the CUDA backend needs the NVIDIA driver's libcuda.so, which could not be loaded")]
    NoLibcuda,
    /// `cuInit` or another driver query failed while opening the backend.
    #[error("initialising the CUDA driver failed")]
    CudaInit(#[source] DriverError),
    /// Device `ordinal` does not exist.
    #[error("{backend:?} device {ordinal} does not exist ({count} present)")]
    NoSuchDevice {
        /// Backend asked.
        backend: BackendKind,
        /// Ordinal asked for.
        ordinal: usize,
        /// Devices present.
        count: usize,
    },
    /// Opening a device (context creation) failed.
    #[error("opening CUDA device {ordinal} failed")]
    DeviceOpen {
        /// Device ordinal.
        ordinal: usize,
        /// Driver error.
        #[source]
        source: DriverError,
    },
    /// Device memory allocation failed.
    #[error("allocating {bytes} bytes of device memory on device {ordinal} failed")]
    Alloc {
        /// Device ordinal.
        ordinal: usize,
        /// Bytes asked for.
        bytes: usize,
        /// Driver or OS error.
        #[source]
        source: BackendError,
    },
    /// Host-pinned, device-mapped allocation failed.
    #[error("allocating {bytes} bytes of host-mapped memory for device {ordinal} failed")]
    HostAlloc {
        /// Device ordinal.
        ordinal: usize,
        /// Bytes asked for.
        bytes: usize,
        /// Driver or OS error.
        #[source]
        source: BackendError,
    },
    /// Exporting an IPC handle failed.
    #[error("exporting an IPC handle of a {bytes}-byte buffer on device {ordinal} failed")]
    IpcExport {
        /// Device ordinal.
        ordinal: usize,
        /// Buffer size.
        bytes: usize,
        /// Driver or OS error.
        #[source]
        source: BackendError,
    },
    /// An address is not in device memory of this device allocated by this process (asked
    /// when a collective registers a caller's buffer).
    #[error("address {addr:#x} is not in memory of device {ordinal} allocated by this process")]
    UnknownAddress {
        /// Device ordinal.
        ordinal: usize,
        /// The address asked about.
        addr: u64,
        /// Driver or backend error.
        #[source]
        source: BackendError,
    },
    /// A received IPC handle is malformed (unknown kind, range outside the allocation, …).
    #[error("invalid IPC handle: {reason}")]
    IpcInvalid {
        /// What is wrong with it.
        reason: String,
    },
    /// Opening (mapping) a peer's IPC handle failed.
    #[error(
        "opening an IPC handle of device {owner_device} (pid {owner_pid}) on device {ordinal} failed"
    )]
    IpcOpen {
        /// Local device ordinal.
        ordinal: usize,
        /// Owner's device ordinal.
        owner_device: u32,
        /// Owner's process (CPU backend; 0 if unknown).
        owner_pid: u32,
        /// Driver or OS error.
        #[source]
        source: BackendError,
    },
    /// Enabling peer access between two devices failed.
    #[error("enabling peer access from device {ordinal} to device {peer} failed")]
    PeerAccess {
        /// Local device.
        ordinal: usize,
        /// Peer device.
        peer: usize,
        /// Driver error.
        #[source]
        source: DriverError,
    },
    /// A stream or event operation failed.
    #[error("{op} on device {ordinal} failed")]
    Stream {
        /// What was done (`create stream`, `synchronize`, `record event`, …).
        op: &'static str,
        /// Device ordinal.
        ordinal: usize,
        /// Driver or emulator error.
        #[source]
        source: BackendError,
    },
    /// A memory copy failed or was out of range.
    #[error("copy of {bytes} bytes ({direction}) on device {ordinal} failed")]
    Copy {
        /// `htod`, `dtoh`, `dtod`.
        direction: &'static str,
        /// Bytes.
        bytes: usize,
        /// Device ordinal.
        ordinal: usize,
        /// Driver error.
        #[source]
        source: BackendError,
    },
    /// A copy or view would reach outside its buffer.
    #[error("range {offset}+{len} is outside a buffer of {size} bytes")]
    OutOfRange {
        /// Start.
        offset: usize,
        /// Length.
        len: usize,
        /// Buffer size.
        size: usize,
    },
    /// Loading a module (PTX text or a PTX/cubin file) failed.
    #[error("loading module {what} on device {ordinal} failed")]
    ModuleLoad {
        /// `embedded PTX` or the file's path.
        what: String,
        /// Device ordinal.
        ordinal: usize,
        /// Driver or I/O error.
        #[source]
        source: BackendError,
    },
    /// PTX built for a newer GPU architecture than the device's (PTX runs on its `.target`
    /// and newer; the embedded PTX is `sm_90` unless `MSCCLPP_CUDA_ARCH` said otherwise at
    /// build time).
    #[error(
        "{what} was built for {target}; device {ordinal} is {device}: rebuild with MSCCLPP_CUDA_ARCH={device}"
    )]
    PtxTarget {
        /// `PTX text` or the file's path.
        what: String,
        /// Device ordinal.
        ordinal: usize,
        /// The PTX's `.target`, e.g. `sm_90`.
        target: String,
        /// The device's architecture, e.g. `sm_80`.
        device: String,
    },
    /// A kernel's entry point is not in its module.
    #[error("kernel {name:?} is not in the module")]
    MissingKernel {
        /// Entry point.
        name: String,
    },
    /// A kernel's parameter struct does not match the entry point's parameter size.
    #[error("kernel {name:?} takes {expected} bytes of parameters, the launch passes {got}")]
    ParamSize {
        /// Entry point.
        name: String,
        /// What the module says.
        expected: usize,
        /// `size_of` of the parameter struct.
        got: usize,
    },
    /// A kernel launch failed.
    #[error(
        "launching kernel {name:?} ({grid}x{block}, {shared_mem} B shared) on device {ordinal} failed"
    )]
    Launch {
        /// Entry point.
        name: String,
        /// Blocks.
        grid: u32,
        /// Threads per block.
        block: u32,
        /// Dynamic shared memory.
        shared_mem: u32,
        /// Device ordinal.
        ordinal: usize,
        /// Driver or emulator error.
        #[source]
        source: BackendError,
    },
    /// The operation does not exist on this backend.
    #[error("{what} is not supported on the {backend:?} backend")]
    Unsupported {
        /// The operation.
        what: &'static str,
        /// The backend.
        backend: BackendKind,
    },
    /// A file could not be read.
    #[error("reading {path} failed")]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// I/O error.
        #[source]
        source: std::io::Error,
    },
    // ---- bootstrap ----
    /// A bootstrap configuration value or environment variable is invalid.
    #[error("bootstrap configuration: {0}")]
    BootstrapConfig(String),
    /// A [`UniqueId`](crate::bootstrap::UniqueId) (hex or bytes) does not parse.
    #[error("malformed bootstrap unique id: {reason}")]
    BootstrapUniqueId {
        /// What is wrong with it.
        reason: String,
    },
    /// The requested network interface has no IPv4 address (or interfaces cannot be listed).
    #[error("network interface {ifname:?} has no usable IPv4 address")]
    BootstrapInterface {
        /// The name(s) asked for (`MSCCLPP_SOCKET_IFNAME`).
        ifname: String,
        /// OS error, or `NotFound`.
        #[source]
        source: std::io::Error,
    },
    /// Binding a bootstrap listener (the root's or a rank's) failed.
    #[error("bootstrap rank {rank}: listening on {addr} failed")]
    BootstrapListen {
        /// This rank.
        rank: usize,
        /// Address asked for.
        addr: std::net::SocketAddr,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// Connecting to a peer or to the root failed (refused until the deadline, unreachable, …).
    #[error("bootstrap rank {rank}: connecting to {peer} failed")]
    BootstrapConnect {
        /// This rank.
        rank: usize,
        /// Who.
        peer: crate::bootstrap::Peer,
        /// OS error (the last one, after retries).
        #[source]
        source: std::io::Error,
    },
    /// A bootstrap operation's deadline passed while waiting on a peer.
    #[error("bootstrap rank {rank}: {op} timed out after {after:?} waiting for {peer}")]
    BootstrapTimeout {
        /// This rank.
        rank: usize,
        /// Who it waited for.
        peer: crate::bootstrap::Peer,
        /// The operation.
        op: &'static str,
        /// The deadline that passed.
        after: std::time::Duration,
    },
    /// Ranks never showed up during set-up.
    #[error("bootstrap rank {rank}: {op}: ranks {missing:?} did not show up within {after:?}")]
    BootstrapMissingRanks {
        /// This rank.
        rank: usize,
        /// The ranks that did not join or connect.
        missing: Vec<usize>,
        /// The set-up step.
        op: &'static str,
        /// The deadline that passed.
        after: std::time::Duration,
    },
    /// A peer's connection closed (it exited, crashed or dropped its bootstrap).
    #[error("bootstrap rank {rank}: {peer} closed its connection ({op})")]
    BootstrapPeerClosed {
        /// This rank.
        rank: usize,
        /// Who.
        peer: crate::bootstrap::Peer,
        /// What this rank was doing.
        op: &'static str,
    },
    /// A peer is not of this protocol or this session (marker or session magic differ).
    #[error("bootstrap rank {rank}: {peer} sent a wrong {what}")]
    BootstrapBadMagic {
        /// This rank.
        rank: usize,
        /// Who.
        peer: crate::bootstrap::Peer,
        /// Which magic.
        what: &'static str,
    },
    /// A peer speaks another bootstrap protocol version.
    #[error(
        "bootstrap rank {rank}: {peer} speaks bootstrap protocol version {got}, this build {want}"
    )]
    BootstrapVersion {
        /// This rank.
        rank: usize,
        /// Who.
        peer: crate::bootstrap::Peer,
        /// Its version.
        got: u32,
        /// Ours.
        want: u32,
    },
    /// A peer sent a frame that does not parse or does not fit the protocol.
    #[error("bootstrap rank {rank}: malformed message from {peer}: {reason}")]
    BootstrapMalformed {
        /// This rank.
        rank: usize,
        /// Who.
        peer: crate::bootstrap::Peer,
        /// What is wrong.
        reason: String,
    },
    /// A peer or the root refused this rank's handshake (duplicate rank, world size mismatch, …).
    #[error("bootstrap rank {rank}: {peer} refused this rank: {reason}")]
    BootstrapRejected {
        /// This rank.
        rank: usize,
        /// Who refused.
        peer: crate::bootstrap::Peer,
        /// Its reason.
        reason: String,
    },
    /// A socket operation with a peer failed.
    #[error("bootstrap rank {rank}: {op} with {peer} failed")]
    BootstrapIo {
        /// This rank.
        rank: usize,
        /// Who.
        peer: crate::bootstrap::Peer,
        /// The operation.
        op: &'static str,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// A peer or root argument is not a rank of this world.
    #[error("bootstrap rank {rank}: {peer} is not a rank of this world of {size}")]
    BootstrapInvalidPeer {
        /// This rank.
        rank: usize,
        /// The argument.
        peer: usize,
        /// World size.
        size: usize,
    },
    /// A message is larger than a data frame may be.
    #[error("bootstrap rank {rank}: a {len}-byte message exceeds the {max}-byte frame cap")]
    BootstrapMessageTooLarge {
        /// This rank.
        rank: usize,
        /// Message length.
        len: usize,
        /// The cap.
        max: u64,
    },
    /// A bootstrap thread could not be started.
    #[error("bootstrap rank {rank}: starting the {what} failed")]
    BootstrapSpawn {
        /// This rank.
        rank: usize,
        /// Which thread.
        what: &'static str,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    // ---- end bootstrap ----
    // ---- communicator, registered memory, connections ----
    /// A buffer cannot be registered.
    #[error("cannot register memory: {reason}")]
    RegisterMemory {
        /// Why.
        reason: String,
    },
    /// A peer's serialized registered memory is invalid.
    #[error("registered memory from rank {rank} is malformed: {reason}")]
    MalformedMemory {
        /// The sender.
        rank: usize,
        /// What is wrong.
        reason: String,
    },
    /// A peer's serialized endpoint is invalid.
    #[error("endpoint from rank {rank} is malformed: {reason}")]
    MalformedEndpoint {
        /// The sender.
        rank: usize,
        /// What is wrong.
        reason: String,
    },
    /// Two ranks on one node drive the same GPU, which the collectives do not support (as
    /// NCCL: a kernel of one rank would wait for the other's, queued behind it or behind a
    /// device-wide synchronisation of the driver).
    #[error("ranks {first} and {second} both use GPU {device}; collectives need one GPU per rank")]
    DuplicateGpu {
        /// The lower rank.
        first: usize,
        /// The higher rank.
        second: usize,
        /// The GPU's PCI bus id.
        device: String,
    },
    /// A setting that every rank must share differs between two ranks (the collectives'
    /// configuration: the sizes of the buffers peers write into, the thresholds that pick each
    /// call's algorithm, the launch shapes whose blocks meet across ranks). Refused at set-up,
    /// where it would otherwise write past a peer's buffer or leave a kernel waiting.
    #[error(
        "{what} is {mine} on this rank but {theirs} on rank {rank}; every rank must use the same"
    )]
    ConfigMismatch {
        /// The setting.
        what: &'static str,
        /// This rank's value.
        mine: u64,
        /// The other rank.
        rank: usize,
        /// Its value.
        theirs: u64,
    },
    /// Memory of another node was used where a local mapping is needed.
    #[error("memory {id} of rank {rank} is not mapped in this process")]
    MemoryNotMapped {
        /// Owner.
        rank: usize,
        /// Owner's id.
        id: u32,
    },
    /// A pairwise set-up call (`connect`, a semaphore's set-up, `recv_memory`) waited for the
    /// peer's half until the bootstrap's deadline: the peer never made the matching call, or
    /// made its calls in another order or with another tag.
    #[error(
        "rank {rank}: {op} with rank {peer} (tag {tag}) got no answer within {after:?}: \
         both ranks must make their pairwise set-up calls (connect, semaphores, \
         send_memory/recv_memory) in the same order with the same tags"
    )]
    SetupTimeout {
        /// This rank.
        rank: usize,
        /// The peer it waited for.
        peer: usize,
        /// The call: `connect`, `semaphore set-up`, `recv_memory` or `set-up receive`.
        op: &'static str,
        /// The tag the caller passed (without the call's tag range).
        tag: u64,
        /// The deadline that passed.
        after: std::time::Duration,
        /// The bootstrap's timeout.
        #[source]
        source: Box<Error>,
    },
    /// The two ends of a connection cannot use the transport asked for.
    #[error("cannot connect to rank {remote_rank} over {transport}: {reason}")]
    Connect {
        /// The peer.
        remote_rank: usize,
        /// The transport.
        transport: crate::transport::Transport,
        /// Why.
        reason: String,
    },
    /// A connection's flush did not complete in time.
    #[error(
        "flush of the {transport} connection to rank {remote_rank} did not complete within {after:?}"
    )]
    FlushTimeout {
        /// The peer.
        remote_rank: usize,
        /// The transport.
        transport: crate::transport::Transport,
        /// The timeout.
        after: std::time::Duration,
    },
    /// A semaphore wait on the host did not complete in time.
    #[error("semaphore wait (expecting {expected}) timed out after {after:?}")]
    SemaphoreTimeout {
        /// The token awaited.
        expected: u64,
        /// The timeout.
        after: std::time::Duration,
    },
    /// The communicator was aborted (by `abort()`, a failed proxy or a dead peer).
    #[error("the communicator was aborted: {reason}")]
    Aborted {
        /// Why.
        reason: String,
    },

    // ---- ethernet / ib ----
    /// A peer failed, died, or refused what this rank sent it (its receiver said why, or its
    /// connection ended without a goodbye).
    #[error("rank {rank} failed: {reason}")]
    Remote {
        /// The peer.
        rank: usize,
        /// What happened, as far as this rank knows.
        reason: String,
    },
    /// The peer closed its end of an Ethernet connection (it dropped the connection or exited).
    #[error("rank {remote_rank} closed its Ethernet connection ({op})")]
    EthernetPeerClosed {
        /// The peer.
        remote_rank: usize,
        /// What this rank was doing.
        op: &'static str,
    },
    /// A socket call of an Ethernet connection failed.
    #[error("Ethernet connection to rank {remote_rank}: {op} failed")]
    EthernetIo {
        /// The peer.
        remote_rank: usize,
        /// The operation.
        op: &'static str,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// An Ethernet set-up step or socket write did not finish before its deadline.
    #[error("Ethernet connection to rank {remote_rank}: {op} did not complete within {after:?}")]
    EthernetTimeout {
        /// The peer.
        remote_rank: usize,
        /// The operation.
        op: &'static str,
        /// The deadline that passed.
        after: std::time::Duration,
    },
    /// The Ethernet set-up with a peer failed (malformed endpoint, no reachable address, …).
    #[error("Ethernet connection to rank {remote_rank}: set-up failed: {reason}")]
    EthernetHandshake {
        /// The peer.
        remote_rank: usize,
        /// Why.
        reason: String,
    },
    /// A memory cannot be used on an Ethernet connection (another owner, not registered for
    /// Ethernet, misaligned word).
    #[error("Ethernet connection to rank {remote_rank}: {reason}")]
    EthernetMemory {
        /// The peer.
        remote_rank: usize,
        /// Why.
        reason: String,
    },
    /// The peer sent a frame that breaks the protocol or names memory outside what this rank
    /// registered; nothing of it was applied and the connection was closed (sticky).
    #[error("Ethernet connection to rank {remote_rank}: refused a frame from the peer: {reason}")]
    EthernetProtocol {
        /// The peer.
        remote_rank: usize,
        /// What was wrong.
        reason: String,
    },
    /// InfiniBand cannot be used here: libibverbs is missing, has no device, or lacks a symbol.
    #[error("InfiniBand is not available: {reason}")]
    IbUnavailable {
        /// Why.
        reason: String,
    },
    /// A verbs call failed.
    #[error("{verb} failed on {device}")]
    IbVerb {
        /// The verb, e.g. `ibv_modify_qp(RTR)`.
        verb: &'static str,
        /// The RDMA device name.
        device: String,
        /// The errno it returned or set.
        #[source]
        source: std::io::Error,
    },
    /// The InfiniBand set-up with a peer failed (malformed queue pair info, mismatched port, …).
    #[error("InfiniBand connection to rank {remote_rank}: {reason}")]
    IbConnect {
        /// The peer.
        remote_rank: usize,
        /// Why.
        reason: String,
    },
    /// A work request completed with an error status (sticky: the queue pair is in error).
    #[error(
        "InfiniBand connection to rank {remote_rank}: work request {wr_id} completed with status {status} ({name})"
    )]
    IbCompletion {
        /// The peer.
        remote_rank: usize,
        /// The work request id.
        wr_id: u64,
        /// `ibv_wc_status` value.
        status: u32,
        /// Its name.
        name: &'static str,
    },
    // ---- end ethernet / ib ----

    // ---- FIFO and proxy ----
    /// A FIFO size that is not a power of two.
    #[error("FIFO size {size} is not a power of two")]
    FifoSize {
        /// Size asked for.
        size: u32,
    },
    /// The proxy thread could not be started.
    #[error("starting the proxy thread failed")]
    ProxyStart {
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// The proxy thread stopped on an error (sticky; the abort flag was set).
    #[error("the proxy failed")]
    ProxyFailed {
        /// What failed.
        #[source]
        source: Box<Error>,
    },
    /// A trigger read from a FIFO names something that was not registered (never served).
    #[error("invalid trigger at FIFO position {pos}: {reason}")]
    InvalidTrigger {
        /// FIFO position.
        pos: u64,
        /// What is out of range.
        reason: String,
    },
    /// Binding a thread to a NUMA node failed.
    #[error("binding to NUMA node {node} failed: {reason}")]
    NumaBind {
        /// The node.
        node: u32,
        /// Why.
        reason: String,
    },
    /// A kernel stopped waiting and recorded why in its `DeviceStatus`.
    #[error("a device wait gave up: {code:?} at {site:?} (address {addr:#x})")]
    Device {
        /// The recorded code.
        code: mscclpp_shared::DeviceErrorCode,
        /// What it waited on.
        site: mscclpp_shared::WaitSite,
        /// The watched address.
        addr: u64,
    },
}

/// The lower-level cause of a GPU-layer error: the CUDA driver, the OS, or the grid emulator.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// A CUDA driver call failed.
    #[error(transparent)]
    Driver(#[from] DriverError),
    /// An OS call failed (CPU backend).
    #[error("{call} failed")]
    Os {
        /// The call, e.g. `memfd_create`.
        call: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The grid emulator failed (CPU backend).
    #[error(transparent)]
    Grid(#[from] mscclpp_device::arch::host::grid::GridError),
    /// A kernel failed on the grid emulator (CPU backend): a trap, a failed assertion, or
    /// shared memory its launch did not give.
    #[error("kernel {name:?} failed")]
    Kernel {
        /// Its entry point.
        name: &'static str,
        /// What the emulator saw.
        #[source]
        source: mscclpp_device::arch::host::grid::GridError,
    },
    /// The driver's JIT rejected a module (CUDA); `log` is its error log.
    #[error("the CUDA JIT rejected the module: {log}")]
    Jit {
        /// The failing load call.
        #[source]
        source: DriverError,
        /// The JIT error log.
        log: String,
    },
    /// A check of ours failed (the message says which).
    #[error("{0}")]
    Invalid(String),
}
