//! `EthernetConnection`: the `Ethernet` transport — TCP between the two ranks, on any nodes.
//!
//! The sending rank reads its source memory (a copy from device to a host staging buffer on the
//! device runtime) and sends it as frames; a receiver thread on the other rank reads the frames
//! and copies them into its **own** registered memory, after checking every destination against
//! the rank's registry of memories registered there for `Ethernet` (`registered_memory`'s
//! registry). A peer names a destination only by the owner's `local_id`; it never sends an
//! address.
//!
//! | file | holds |
//! |---|---|
//! | `mod.rs` | these docs, the limits, [`EthernetConnection`], the sticky failure both sides share (a `connection::network` failure), `Drop` |
//! | `wire.rs` | [`EndpointInfo`], [`Handshake`], [`Frame`] |
//! | `setup.rs` | [`Listener`], connecting, the handshake, starting the receiver thread |
//! | `sender.rs` | `write`, `update_and_sync`, `flush` (the outbound stream and its answers) |
//! | `receiver.rs` | the receiver thread (the inbound stream) |
//!
//! # Set-up (inside `Communicator::connect`, built by `connection::setup`)
//!
//! 1. Each side binds a listener ([`Listener::bind`]) on an ephemeral port *before* the endpoints
//!    cross, on the address it advertises: `MSCCLPP_SOCKET_IFNAME`'s IPv4 address when that is
//!    set, else the one [`local_ip`](crate::bootstrap::local_ip) picks — never 0.0.0.0, so the
//!    port is not open on other interfaces. It puts an [`EndpointInfo`] {random token, that
//!    address} into its endpoint's `extra`.
//! 2. Each side connects its **outbound stream** to the peer (same node: loopback addresses
//!    first; otherwise loopback addresses are skipped, unless the peer advertised nothing else:
//!    nodes emulated on one host with `MSCCLPP_SOCKET_IFNAME=lo`) and runs the connector's half of the
//!    handshake: `HELLO {its nonce}`, check the peer's `CHALLENGE {nonce, tag}`, `PROOF {tag}`,
//!    read `ACCEPT`.
//! 3. At the same time (a helper thread), each side serves its listener: every connection at
//!    once, without blocking on any (each for at most [`HANDSHAKE_SLICE`]), under the
//!    bootstrap's intake rules (`bootstrap::intake`: a backlog of 4096, at most [`MAX_PENDING`]
//!    and what the process's descriptor budget gives the listener, the least advanced connection
//!    dropped first beyond that once it is 250 ms old, at most 64 accepted per turn after the
//!    handshakes with bytes waiting are read, a 100 ms back-off after a failed `accept`,
//!    rate-limited warnings), until one completes the acceptor's half as the expected rank (`HELLO` →
//!    `CHALLENGE`, then a `PROOF` whose tag checks out → `ACCEPT`); that one is the **inbound
//!    stream**. Garbage, silence, another job or a wrong proof is closed and the others go on,
//!    until the set-up deadline. So hundreds of stray connections cost nothing.
//!
//! The tags are [`crate::auth`]'s, keyed by the world's secret (the bootstrap's,
//! `Bootstrap::secret`; a bootstrap without one, which never leaves its process, gives a
//! public key), over [`handshake_context`]: the protocol, both ranks
//! and both endpoint tokens, which crossed through the bootstrap. A peer without the secret
//! gets no connection; a tag seen on one connection is worth nothing on another.
//!
//! Two streams, one per direction of data: the outbound stream carries this rank's frames to the
//! peer and only small `ACK`/`ERROR` answers back; the inbound stream the reverse. A receiver
//! therefore never waits behind a large write of its own side, so two ranks writing to each
//! other at once cannot deadlock on full socket buffers.
//!
//! # Wire format (little-endian)
//!
//! `Endpoint::extra` (sent through the bootstrap) is the communicator's status byte (0 ready; 1
//! failed, then the reason, so the peer fails at once instead of waiting) followed by an
//! [`EndpointInfo`]: `magic "MSET" | version u16 | token u64 | count u8 (1..=8) | count ×
//! address (24 bytes, `bootstrap::wire` encoding)`.
//!
//! Handshake messages (88 bytes; a field a kind does not use is zero):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | marker [`HANDSHAKE_MARKER`] |
//! | 8 | 4 | version [`PROTOCOL_VERSION`] |
//! | 12 | 4 | kind: 1 `HELLO` (connector), 2 `CHALLENGE` (acceptor), 3 `PROOF` (connector), 4 `ACCEPT` (acceptor) |
//! | 16 | 4 | from (sender's rank) |
//! | 20 | 4 | to (receiver's rank) |
//! | 24 | 32 | nonce (`HELLO`, `CHALLENGE`) |
//! | 56 | 32 | tag (`CHALLENGE`: the acceptor's, `PROOF`: the connector's) |
//!
//! Frames (a 40-byte header, then a payload for `WRITE` and `ERROR`):
//!
//! | op | code | direction | id | word at 8 | word at 16 | word at 24 | word at 32 | payload |
//! |---|---|---|---|---|---|---|---|---|
//! | `WRITE` | 1 | sender → receiver | destination `local_id` | offset | len (1..=[`CHUNK`]) | 0 | the destination's network key | `len` bytes |
//! | `UPDATE` | 2 | sender → receiver | destination `local_id` | offset (8-aligned) | 8 | value | the destination's network key | — |
//! | `FLUSH` | 3 | sender → receiver | 0 | sequence number | 0 | 0 | 0 | — |
//! | `BYE` | 4 | sender → receiver | 0 | 0 | 0 | 0 | 0 | — |
//! | `ACK` | 0x81 | receiver → sender | 0 | sequence number | 0 | 0 | 0 | — |
//! | `ERROR` | 0x82 | receiver → sender | 0 | 0 | len (≤ [`MAX_REASON`]) | 0 | 0 | UTF-8 reason |
//!
//! Who writes and reads what:
//! - The **sender** (the caller of `write`/`update_and_sync`/`flush`, under the outbound lock)
//!   writes `WRITE`, `UPDATE`, `FLUSH` and, when the connection is dropped, `BYE`. A write is
//!   split into chunks of at most [`CHUNK`] bytes. `flush` sends `FLUSH {seq}` and reads the
//!   outbound stream's answers until `ACK {seq}` (older ACKs, left by a flush that timed out, are
//!   skipped).
//! - The **receiver thread** (`eth{rank}-rx{peer}`) reads the inbound stream. It applies each
//!   frame completely (copy on its own device stream, synchronized) before reading the next, so
//!   its `ACK {seq}` means that every earlier frame is visible in the destination memory. An
//!   `UPDATE` is an 8-byte store ordered after the data on the same stream
//!   (`Stream::write_value_u64`: `cuStreamWriteValue64` on CUDA, a release store on the CPU
//!   backend); this is how a semaphore is signalled.
//!
//! # What the receiver checks (nothing read is trusted)
//!
//! The header is checked before any payload is read: known op, reserved words 0, `WRITE` length at
//! most [`CHUNK`], `ERROR` length at most [`MAX_REASON`], a frame kind that belongs to this
//! direction. The destination (checked by the network transports' shared trust boundary,
//! `connection::network`) must be in the registry and registered for `Ethernet`, the frame's key
//! must be the memory's network key (`RegisteredMemory::key`, compared in constant time: a random
//! value per registration that only the ranks the memory was sent to know, so a peer cannot write
//! into memory never sent to it, however it guesses ids), `offset + len` must not overflow and must
//! be at most the registered size, an `UPDATE` word must be 8-byte aligned. The payload is read
//! into a staging buffer first; the lookup is repeated under the registry's read lock, and the copy
//! happens while holding it. A frame that fails a check is not applied: the receiver sends `ERROR
//! {reason}` back, closes, and the connection's later calls return
//! [`Error::Transport`](crate::Error::Transport) of kind `Protocol` (sticky), and the receiving
//! rank's communicator is aborted (a peer that names memory it was never given, or a wrong key, is
//! broken or hostile, and nothing it sends can be trusted after that); the sender's next `flush`
//! returns [`Error::Remote`](crate::Error::Remote) with the receiver's reason.
//!
//! # Failure model
//!
//! - Every set-up step is bounded by the `EndpointConfig`'s `flush_timeout` (one deadline for the
//!   whole set-up); every socket write by the same timeout; `flush` by its argument; reading a
//!   payload once its header arrived by the same timeout (a peer stalling mid-frame is dropped).
//! - A write that times out never tears the byte stream: the unsent rest of a frame that was
//!   partly sent is kept and sent before anything else (a frame not started is dropped). The call
//!   returns [`Error::Transport`](crate::Error::Transport) of kind `Timeout`; its data may or may
//!   not arrive.
//! - Failures are sticky and name the peer: a `BYE` then EOF means the peer dropped the
//!   connection ([`Error::Transport`](crate::Error::Transport) of kind `PeerClosed`); EOF or a
//!   reset without `BYE` means it died ([`Error::Remote`](crate::Error::Remote)); an `ERROR` frame
//!   means it refused our data ([`Error::Remote`](crate::Error::Remote) with its reason); a bad
//!   frame from it is kind `Protocol`. When the receiver thread finds the peer dead or hostile (no
//!   `BYE`, a bad frame, or a local device failure while applying), it also aborts the
//!   communicator's status block, releasing every device wait of this rank.
//! - `Drop` sends `BYE` and, for at most [`LINGER`], keeps applying (and acknowledging) the
//!   peer's frames until the peer's own `BYE`, and waits for the peer to close the outbound
//!   stream; then it closes both streams and joins the receiver thread. When both ranks drop
//!   their ends (the usual teardown) this costs a round trip; a peer that keeps its end delays
//!   the drop by at most [`LINGER`]. It never panics.

mod receiver;
mod sender;
mod setup;
mod wire;

use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use self::sender::Out;
pub use self::setup::Listener;
pub(crate) use self::setup::Setup;
pub use self::wire::{EndpointInfo, Frame, Handshake, HandshakeKind, handshake_context};
use crate::connection::network::Failure;
use crate::error::{Link, Result};
use crate::gpu::{Gpu, HostMapped, Stream};
use crate::socket::{deadline_in, drain, remaining};
use crate::status::StatusBlock;
use crate::sync::lock;
use crate::transport::Transport;

/// Magic of an [`EndpointInfo`].
pub const INFO_MAGIC: [u8; 4] = *b"MSET";
/// Version of an [`EndpointInfo`].
pub const INFO_VERSION: u16 = 1;
/// Most addresses an [`EndpointInfo`] may carry.
pub const MAX_ADDRS: usize = 8;
/// First 8 bytes of a handshake.
pub const HANDSHAKE_MARKER: [u8; 8] = *b"MSCLETH\0";
/// Version of the handshake and frame protocol. 2: the authenticated handshake, the network
/// key in `WRITE` and `UPDATE`.
pub const PROTOCOL_VERSION: u32 = 2;
/// Bytes of a handshake message.
pub const HANDSHAKE_LEN: usize = 88;
/// Bytes of a frame header.
pub const HEADER_LEN: usize = 40;
/// Largest `WRITE` payload (larger writes are split; a longer one read is refused).
pub const CHUNK: usize = 4 << 20;
/// Largest `ERROR` reason.
pub const MAX_REASON: usize = 256;
/// Longest an accepted connection may take to complete its handshake before it is dropped.
pub const HANDSHAKE_SLICE: Duration = Duration::from_secs(2);
/// Most connections a listener holds in their handshake at once, as the bootstrap's listeners
/// (fewer when the process's descriptor budget gives it less: `bootstrap::intake`); beyond
/// that one is dropped for each new one once it is old enough (`bootstrap::intake`), the
/// oldest that has not sent a valid `HELLO` first.
pub const MAX_PENDING: usize = 1024;
/// Longest `Drop` waits for the peer to close after `BYE`.
pub const LINGER: Duration = Duration::from_secs(1);
/// How long a receiver tries to tell the peer why it refused a frame.
const ERROR_REPORT_TIMEOUT: Duration = Duration::from_millis(500);
/// How long a failed write looks for the peer's `ERROR` frame explaining it.
const WHY_TIMEOUT: Duration = Duration::from_millis(200);
/// Accept-loop poll interval.
const ACCEPT_POLL: Duration = Duration::from_millis(5);
/// Longest a single connect attempt may take.
const CONNECT_ATTEMPT: Duration = Duration::from_secs(5);

struct Shared {
    remote_rank: usize,
    failure: Mutex<Option<Failure>>,
    /// Set by `Drop`: the streams are being closed on purpose.
    closing: AtomicBool,
    /// Set by the receiver when the peer said `BYE` (it is dropping its end).
    peer_bye: AtomicBool,
    status: Arc<StatusBlock>,
}

impl Shared {
    /// Records `f` unless a failure is already recorded; returns the recorded one.
    fn fail(&self, f: Failure) -> Failure {
        let mut slot = lock(&self.failure);
        slot.get_or_insert(f).clone()
    }

    fn failure(&self) -> Option<Failure> {
        lock(&self.failure).clone()
    }

    fn check(&self, op: &'static str) -> Result<()> {
        match self.failure() {
            Some(f) => Err(f.to_error(self.link(), op)),
            None => Ok(()),
        }
    }

    /// The connection, as its errors name it.
    fn link(&self) -> Link {
        Link::to(Transport::Ethernet, self.remote_rank)
    }

    /// Why the outbound stream ended: the peer dropped its end (`BYE` seen, waiting briefly
    /// for the receiver to see it, since it travels on the other stream) or it was lost.
    fn ended(&self, what: String) -> Failure {
        let until = deadline_in(WHY_TIMEOUT);
        loop {
            if self.peer_bye.load(Ordering::Acquire) {
                return Failure::Closed;
            }
            if let Some(f) = self.failure() {
                return f;
            }
            if remaining(until).is_none() {
                return Failure::Lost(what);
            }
            thread::sleep(Duration::from_millis(1));
        }
    }
}

/// A TCP connection to one remote rank (see the module docs).
pub struct EthernetConnection {
    shared: Arc<Shared>,
    out: Mutex<Out>,
    /// Clones of the two sockets, to shut them down from `Drop`.
    out_ctl: TcpStream,
    in_ctl: TcpStream,
    receiver: Option<JoinHandle<()>>,
    timeout: Duration,
    /// Payload bytes sent by `write` (`Connection::bytes_sent`).
    bytes: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for EthernetConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EthernetConnection(to rank {})", self.shared.remote_rank)
    }
}

/// A side's device stream and pinned staging buffer of `bytes`, made at first use (kept in
/// `dev`; the same size every time for one side).
fn staging<'a>(
    gpu: &Gpu,
    dev: &'a mut Option<(Stream, HostMapped)>,
    bytes: usize,
) -> Result<&'a (Stream, HostMapped)> {
    let made = match dev.take() {
        Some(d) => d,
        None => (gpu.stream()?, gpu.alloc_host_mapped(bytes)?),
    };
    Ok(dev.insert(made))
}

impl EthernetConnection {
    fn peer(&self) -> usize {
        self.shared.remote_rank
    }
}

impl Drop for EthernetConnection {
    fn drop(&mut self) {
        self.shared.closing.store(true, Ordering::Release);
        {
            let mut out = lock(&self.out);
            if self.shared.failure().is_none() {
                let _ = out.wire.send(&Frame::Bye.encode(), deadline_in(LINGER));
            }
        }
        // FIN after BYE. Then, for at most LINGER: keep applying the peer's frames until it
        // says BYE too (so a peer that flushes while this side drops still gets its ACK), and
        // wait for the peer's receiver to close our outbound stream (so that closing it does not
        // reset the connection before the peer has read the BYE).
        let _ = self.out_ctl.shutdown(Shutdown::Write);
        let linger = deadline_in(LINGER);
        let mut pause = Duration::from_micros(100);
        while let (Some(t), Some(left)) = (&self.receiver, remaining(linger)) {
            if t.is_finished() {
                break;
            }
            thread::sleep(pause.min(left));
            pause = (pause * 2).min(Duration::from_millis(10));
        }
        drain(&self.out_ctl, linger);
        let _ = self.out_ctl.shutdown(Shutdown::Both);
        let _ = self.in_ctl.shutdown(Shutdown::Both);
        if let Some(t) = self.receiver.take() {
            let _ = t.join();
        }
    }
}
