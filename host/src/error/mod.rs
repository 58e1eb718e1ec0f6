//! The host crate's one error type. Each variant names the operation that failed and carries its
//! context and, where there is one, its source. Sections follow the crate's modules; the typed
//! details some variants carry (driver and backend causes, trigger faults, memory misuse) are in
//! `detail.rs`; the network transports' failures are one structured variant,
//! [`Error::Transport`], whose kind and builder ([`TransportErrorKind`], [`Link`]) are in
//! `transport.rs`; the host's own services' failures ([`Error::Numa`], [`Error::Trace`]) are
//! kinds of their own in `host.rs`.

mod detail;
mod host;
mod plan;
mod proxy;
mod transport;

use std::path::PathBuf;

pub use self::detail::{BackendError, DriverError, MemoryMisuse, TriggerFault};
pub use self::host::{NumaError, TraceError};
pub use self::plan::PlanError;
pub use self::proxy::ProxyError;
pub use self::transport::{Link, TransportErrorKind};
use crate::backend::BackendKind;
use crate::transport::Transport;

/// Result with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

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
    /// A caller's stream ([`Gpu::borrow_cuda_stream`](crate::gpu::Gpu::borrow_cuda_stream))
    /// belongs to another context than this device's primary context (another device, or a
    /// context of the caller's own).
    #[error("stream {stream:#x} does not belong to device {ordinal}'s primary context")]
    StreamDevice {
        /// The stream handle.
        stream: u64,
        /// The device it was to be used with.
        ordinal: usize,
    },
    /// The calling thread's current CUDA device could not be read.
    #[error("reading the calling thread's current CUDA device failed")]
    CurrentDevice {
        /// Driver error.
        #[source]
        source: DriverError,
    },
    /// The calling thread's stream-capture mode could not be changed.
    #[error("changing the thread's stream-capture mode failed")]
    CaptureMode {
        /// Driver error.
        #[source]
        source: DriverError,
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
    /// Reading an attribute of a kernel (its largest block) failed.
    #[error("reading an attribute of kernel {name:?} failed")]
    KernelAttribute {
        /// Entry point.
        name: String,
        /// Driver error.
        #[source]
        source: DriverError,
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
    /// A rank's request in a [`split`](crate::communicator::Communicator::split) could not be
    /// read (a peer of another version, or a corrupted message).
    #[error("rank {rank}'s split request is malformed: {reason}")]
    MalformedSplit {
        /// The rank that sent it.
        rank: usize,
        /// What is wrong.
        reason: String,
    },
    /// A scratch region the collectives allocate on first use could not be allocated on some
    /// rank (every rank of the call gets this error; the region stays unallocated).
    #[error("the collectives' {region} region could not be allocated on rank {rank}")]
    RegionUnavailable {
        /// The region.
        region: &'static str,
        /// The first rank that could not allocate it.
        rank: usize,
    },
    /// A buffer cannot be registered with the collectives (empty, not device memory of this
    /// process's device, not inside one allocation, or not exportable to the peers).
    #[error("the buffer [{ptr:#x}, +{len}) cannot be registered: {reason}")]
    NotRegistrable {
        /// Its first byte.
        ptr: u64,
        /// Its length.
        len: usize,
        /// Why.
        reason: String,
    },
    /// The collectives' registration service thread could not be started.
    #[error("starting the registration service thread failed")]
    RegistrationServiceStart {
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// Every registration slot of this rank is in use (deregister some first).
    #[error("all {slots} registration slots of this rank are in use ({what})")]
    RegistryFull {
        /// Slots of the kind asked for.
        slots: usize,
        /// Which kind: buffers or windows.
        what: &'static str,
    },
    /// A peer could not map this rank's registration (or answered something else).
    #[error("rank {rank} refused registration slot {slot}: {reason}")]
    RegistrationRefused {
        /// The peer.
        rank: usize,
        /// The registration slot.
        slot: usize,
        /// Why.
        reason: String,
    },
    /// A registration handle this communicator does not hold (deregistered already, or of
    /// another communicator).
    #[error("no registration in slot {slot} with generation {generation} on this communicator")]
    UnknownRegistration {
        /// The slot.
        slot: usize,
        /// The generation.
        generation: u32,
    },
    /// A collective window registration differs between ranks (NCCL's windows are symmetric:
    /// every rank registers the same size, in the same order).
    #[error("window registration: rank {rank}'s {what} is {theirs}, this rank's {mine}")]
    WindowMismatch {
        /// The rank that differs.
        rank: usize,
        /// What differs.
        what: &'static str,
        /// This rank's value.
        mine: u64,
        /// Theirs.
        theirs: u64,
    },
    /// A typed collective's buffers do not hold what the call needs.
    #[error("{what}: {got} elements where the call needs {need}")]
    LengthMismatch {
        /// Which buffer of which call.
        what: &'static str,
        /// Elements it holds.
        got: usize,
        /// Elements the call needs.
        need: usize,
    },
    /// No live stream of this process has the handle a caller passed
    /// ([`Gpu::borrow_stream`](crate::gpu::Gpu::borrow_stream) on the CPU backend, whose
    /// handles are its own).
    #[error("no live {backend:?} stream has the handle {stream:#x}")]
    UnknownStream {
        /// The handle.
        stream: u64,
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
        peer: crate::socket::Peer,
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
        peer: crate::socket::Peer,
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
        peer: crate::socket::Peer,
        /// What this rank was doing.
        op: &'static str,
    },
    /// A peer is not of this protocol or this session (marker or session magic differ).
    #[error("bootstrap rank {rank}: {peer} sent a wrong {what}")]
    BootstrapBadMagic {
        /// This rank.
        rank: usize,
        /// Who.
        peer: crate::socket::Peer,
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
        peer: crate::socket::Peer,
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
        peer: crate::socket::Peer,
        /// What is wrong.
        reason: String,
    },
    /// A peer or the root refused this rank's handshake (duplicate rank, world size mismatch, …).
    #[error("bootstrap rank {rank}: {peer} refused this rank: {reason}")]
    BootstrapRejected {
        /// This rank.
        rank: usize,
        /// Who refused.
        peer: crate::socket::Peer,
        /// Its reason.
        reason: String,
    },
    /// A socket operation with a peer failed.
    #[error("bootstrap rank {rank}: {op} with {peer} failed")]
    BootstrapIo {
        /// This rank.
        rank: usize,
        /// Who.
        peer: crate::socket::Peer,
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
    /// A peer could not prove that it knows this world's secret, or refused this rank's proof
    /// (a peer of another job, a wrong `MSCCLPP_SECRET`, or a stranger on the port).
    #[error("bootstrap rank {rank}: authentication with {peer} failed: {reason}")]
    BootstrapAuth {
        /// This rank.
        rank: usize,
        /// Who.
        peer: crate::socket::Peer,
        /// What did not match.
        reason: String,
    },
    /// Another process has joined the world as this rank, and the root refused this one (an
    /// impostor: in a world without a secret anyone who reaches the root can claim a rank; or
    /// this rank was started twice).
    #[error(
        "bootstrap rank {rank}: another process has claimed rank {rank} at the root {peer}: {reason}"
    )]
    BootstrapRankTaken {
        /// This rank.
        rank: usize,
        /// The root.
        peer: crate::socket::Peer,
        /// What the root said, and what to check.
        reason: String,
    },
    /// A peer queued more bytes or frames at this rank than the caps allow
    /// (`BootstrapConfig::max_queued_bytes`, `max_queued_frames`), or its frame did not fit
    /// under the process's cap (`max_process_queued_bytes`, over every peer of every bootstrap
    /// of the process); its link was cut.
    #[error(
        "bootstrap rank {rank}: {peer} queued {bytes} bytes in {frames} frames, over {}",
        detail::queue_caps(*process, *max_bytes, *max_frames)
    )]
    BootstrapQueueFull {
        /// This rank.
        rank: usize,
        /// Who.
        peer: crate::socket::Peer,
        /// Bytes that would have been queued.
        bytes: u64,
        /// Frames that would have been queued.
        frames: u64,
        /// Byte cap.
        max_bytes: u64,
        /// Frame cap.
        max_frames: u64,
        /// The process's byte cap was hit: `bytes` and `max_bytes` are the process's (every
        /// peer of every bootstrap in it), `frames` the peer's.
        process: bool,
    },
    /// A peer is gone: another rank reported it dead, or its listener can no longer be reached.
    #[error("bootstrap rank {rank}: {peer} is gone ({op}): {reason}")]
    BootstrapPeerGone {
        /// This rank.
        rank: usize,
        /// Who.
        peer: crate::socket::Peer,
        /// What this rank was doing.
        op: &'static str,
        /// Why.
        reason: String,
    },
    // ---- communicator, registered memory, connections ----
    /// A buffer to register is empty or at address 0.
    #[error("cannot register {size} bytes at {addr:#x}: an empty or null buffer")]
    RegisterEmpty {
        /// Its address.
        addr: u64,
        /// Its size.
        size: usize,
    },
    /// A buffer was registered for no transport.
    #[error("cannot register {size} bytes at {addr:#x} for no transport")]
    RegisterNoTransport {
        /// Its address.
        addr: u64,
        /// Its size.
        size: usize,
    },
    /// A rank argument is not a rank of the communicator's world.
    #[error("rank {rank} is not a rank of this world of {size}")]
    NoSuchRank {
        /// The argument.
        rank: usize,
        /// World size.
        size: usize,
    },
    /// A point-to-point operation named this rank as its peer.
    #[error("rank {rank} cannot be its own peer")]
    PeerIsSelf {
        /// This rank.
        rank: usize,
    },
    /// A point-to-point receive got a message of another byte count than it was posted with
    /// (detected by the receiving kernel, which consumed the message and wrote nothing; the
    /// count travels with the data, so no host round trip is needed to find it).
    #[error(
        "a receive from rank {peer} got a message of {sent_bytes} bytes, which is not the \
         count it was posted with (every send must match its receive's count and type)"
    )]
    CountMismatch {
        /// The sending rank.
        peer: usize,
        /// The bytes it sent.
        sent_bytes: u64,
    },
    /// A per-rank argument (the counts or displacements of an all-to-all-v) does not hold one
    /// entry per rank.
    #[error("{what} holds {len} entries for {ranks} ranks")]
    PerRankLength {
        /// Which argument.
        what: &'static str,
        /// Its entries.
        len: usize,
        /// Ranks of the communicator.
        ranks: usize,
    },
    /// A collective's element count times the element size (times the parts a buffer holds)
    /// does not fit in the address space (`isize::MAX` bytes, the most any buffer holds).
    #[error("{count} elements of {elem_bytes} bytes{} overflow the address space", if *.parts > 1 { format!(" times {} parts", .parts) } else { String::new() })]
    CountOverflow {
        /// The element count.
        count: usize,
        /// Bytes per element.
        elem_bytes: usize,
        /// How many such parts the largest buffer of the call holds.
        parts: usize,
    },
    /// A collective that moves data was given a null buffer this rank reads or writes.
    #[error("{what} is null (the call moves data through it on this rank)")]
    NullBuffer {
        /// Which buffer (`input`, `output`).
        what: &'static str,
    },
    /// A group's sends to this rank itself and its receives from itself do not pair up: the
    /// `index`-th send to self and the `index`-th receive from self differ in size, or one of
    /// them is missing (`None`).
    #[error(
        "send {index} to this rank itself ({sent_bytes:?} bytes) does not match receive {index} \
         from itself ({recv_bytes:?} bytes)"
    )]
    SelfMismatch {
        /// Which pair (0-based, in the order the group recorded them).
        index: usize,
        /// The send's bytes, if there is one.
        sent_bytes: Option<u64>,
        /// The receive's bytes, if there is one.
        recv_bytes: Option<u64>,
    },
    /// Something that needs a peer on this node was asked of a peer on another node.
    #[error("{what} needs rank {remote_rank} on this node, but it runs on another")]
    CrossNode {
        /// The peer.
        remote_rank: usize,
        /// What was asked (a same-node transport, a collective, …).
        what: &'static str,
    },
    /// Two ranks on different nodes offer no network transport in common (one forced another
    /// with `MSCCLPP_NET_TRANSPORT`, or lacks libfabric or InfiniBand the other requires).
    #[error(
        "no network transport reaches rank {remote_rank}: this rank offers {mine:#x}, it offers {theirs:#x} (Transport bits: Ethernet 0x4, Ofi 0x8, Ib 0x100..; MSCCLPP_NET_TRANSPORT must agree on every rank)"
    )]
    NoCommonTransport {
        /// The peer.
        remote_rank: usize,
        /// This rank's offer (`TransportFlags` bits).
        mine: u32,
        /// The peer's offer.
        theirs: u32,
    },
    /// `MSCCLPP_NET_TRANSPORT` names no transport.
    #[error("MSCCLPP_NET_TRANSPORT={value:?} is not a network transport (use ofi, ib or ethernet)")]
    UnknownNetTransport {
        /// The value.
        value: String,
    },
    /// The bootstrap cannot say which node a rank runs on (`Bootstrap::node_of`).
    #[error("the bootstrap knows no node of rank {rank}, so the node layout is unknown")]
    NoNodeLayout {
        /// The rank without a node.
        rank: usize,
    },
    /// Something that needs the same number of ranks on every node (the hierarchical
    /// collectives) was asked of a world whose nodes differ.
    #[error(
        "the nodes run different numbers of ranks ({sizes:?}, in node order), but this needs the same number on every node"
    )]
    UnevenNodes {
        /// Ranks of every node, in node order.
        sizes: Vec<usize>,
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
    /// More ranks of one node drive the same GPU than the collectives' `ranks_per_gpu` allows
    /// (by default one, as NCCL: a kernel of one rank could wait for another's that cannot be
    /// scheduled). `MSCCLPP_RANKS_PER_GPU` (or `CollectiveConfig::ranks_per_gpu`) opts in to
    /// sharing a GPU.
    #[error(
        "ranks {first} and {second} both use GPU {device} ({ranks} ranks on it); the \
         collectives allow {allowed} rank(s) per GPU: set MSCCLPP_RANKS_PER_GPU={ranks} on \
         every rank to share it (each rank then gets its share of the GPU's multiprocessors)"
    )]
    DuplicateGpu {
        /// The lower rank.
        first: usize,
        /// The higher rank.
        second: usize,
        /// The GPU's PCI bus id.
        device: String,
        /// Ranks on that GPU.
        ranks: usize,
        /// Ranks per GPU allowed (`ranks_per_gpu`).
        allowed: usize,
    },
    /// Ranks sharing a GPU would each get fewer multiprocessors than the collectives' kernels
    /// need resident at once (the point-to-point engine's launch meets up to 16 peers' worth
    /// of blocks): fewer ranks on that GPU.
    #[error(
        "{ranks} ranks share GPU {device}, whose {multiprocessors} multiprocessors give each \
         {share}; the collectives need {needed} per rank: put at most {most} ranks on it"
    )]
    GpuShareTooSmall {
        /// The GPU's PCI bus id.
        device: String,
        /// Ranks on it.
        ranks: usize,
        /// Its multiprocessors.
        multiprocessors: u32,
        /// Each rank's share.
        share: u32,
        /// What a rank needs.
        needed: u32,
        /// Most ranks the GPU can take.
        most: u32,
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
    /// The two ends of a connection asked for different transports.
    #[error(
        "cannot connect to rank {remote_rank} over {transport}: it asked for transport bit {theirs:#x}"
    )]
    TransportMismatch {
        /// The peer.
        remote_rank: usize,
        /// This end's transport.
        transport: Transport,
        /// The peer's transport bit (as received).
        theirs: u32,
    },
    /// A same-node transport of the other backend was asked for (`CudaIpc` on the CPU
    /// backend, `Shm` on CUDA).
    #[error(
        "cannot connect to rank {remote_rank} over {transport}: not available on the {backend:?} backend"
    )]
    TransportUnavailable {
        /// The peer.
        remote_rank: usize,
        /// The transport asked for.
        transport: Transport,
        /// This rank's backend.
        backend: BackendKind,
    },
    /// A connection's flush did not complete in time.
    #[error(
        "flush of the {transport} connection to rank {remote_rank} did not complete within {after:?}"
    )]
    FlushTimeout {
        /// The peer.
        remote_rank: usize,
        /// The transport.
        transport: Transport,
        /// The timeout.
        after: std::time::Duration,
    },
    /// A semaphore's remote half belongs to another rank than its connection's peer.
    #[error("semaphore words of rank {stub_rank} used over a connection to rank {connection_rank}")]
    SemaphorePeer {
        /// The owner of the remote half.
        stub_rank: usize,
        /// The connection's peer.
        connection_rank: usize,
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
    /// The communicator (or its collectives) was revoked: its work was ended and drained, and
    /// it takes no more calls. Shrink it (`Communicator::shrink`) or drop it.
    #[error(
        "rank {rank}: the communicator was revoked (it takes no more calls: {what}); shrink it or drop it"
    )]
    Revoked {
        /// This rank.
        rank: usize,
        /// The call refused.
        what: &'static str,
    },
    /// The ranks that make a new world from this one (a shrink's, a grow's) do not agree on
    /// it: `rank` (of the parent world) passed `theirs` where this rank passed `mine`.
    #[error(
        "rank {rank} disagrees on the {what} of the new world: it has {theirs}, this rank {mine}"
    )]
    MembershipMismatch {
        /// The rank that disagrees (in the parent world).
        rank: usize,
        /// What (`excluded ranks`, `size`, `grow id`, …).
        what: &'static str,
        /// This rank's.
        mine: String,
        /// Theirs.
        theirs: String,
    },

    // ---- network transports ----
    /// A peer failed, died, or refused what this rank sent it (its receiver said why, or its
    /// connection ended without a goodbye).
    #[error("rank {rank} failed: {reason}")]
    Remote {
        /// The peer.
        rank: usize,
        /// What happened, as far as this rank knows.
        reason: String,
    },
    /// A network transport (Ethernet, libfabric, InfiniBand) failed: which one, with which
    /// peer (none outside a connection), what kind of failure (what programs match on), the
    /// operation, what went wrong in words, and the OS or driver error where there is one
    /// (`transport.rs`; built with [`Link`]).
    #[error("{}", transport::describe(.transport, .remote_rank, .kind, .detail))]
    Transport {
        /// The transport.
        transport: Transport,
        /// The peer of the connection, if the failure is a connection's.
        remote_rank: Option<usize>,
        /// What kind of failure.
        kind: TransportErrorKind,
        /// The operation (`write`, `flush`, `set-up`, `fi_domain`, `ibv_post_send`, …).
        op: &'static str,
        /// What went wrong, in words (the message after the transport and the peer).
        detail: String,
        /// The OS or driver error, if any.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },

    // ---- FIFO and proxy ----
    /// A FIFO, a proxy or a port-channel service failed ([`ProxyError`]).
    #[error(transparent)]
    Proxy(#[from] ProxyError),
    /// Reading a NUMA node's CPUs or binding a thread to them failed.
    #[error(transparent)]
    Numa(#[from] NumaError),
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

    // ---- execution plans (the root crate's `executor`) ----
    /// An execution plan was refused or a call does not fit it ([`PlanError`]: malformed,
    /// unsupported, refused by verification, or a call that does not fit). Nothing was set up
    /// or launched.
    #[error(transparent)]
    Plan(#[from] PlanError),

    // ---- trace ----
    /// Setting up, taking or writing a rank's trace failed.
    #[error(transparent)]
    Trace(#[from] TraceError),
}
