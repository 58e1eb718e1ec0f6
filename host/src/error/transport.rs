//! The network transports' failures in one structured form, [`Error::Transport`]: which
//! transport, which peer, what kind of failure ([`TransportErrorKind`], what programs match on,
//! in the style of [`std::io::ErrorKind`]), the operation, a sentence for people, and the OS or
//! driver error as the source where there is one. A new transport adds no variant anywhere: it
//! builds its errors with [`Link`].
//!
//! Messages read `"{transport} connection to rank {r}: {detail}"` (`"{transport}: {detail}"`
//! outside a connection, `"{transport} is not available: {detail}"` when it cannot be used),
//! where the transport is named as people know it (`Ethernet`, `libfabric`, `InfiniBand`).

use std::time::Duration;

use super::{Error, MemoryMisuse};
use crate::transport::Transport;

/// What kind of failure an [`Error::Transport`] is, whatever the transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TransportErrorKind {
    /// The transport cannot be used here: its library could not be loaded, or it offers no
    /// provider or device this transport can use.
    Unavailable,
    /// The set-up with the peer failed: a malformed or mismatched endpoint (another provider,
    /// another port type), a handshake the peer failed or refused.
    Setup,
    /// The peer's listener could not be reached (every address failed until the deadline, or
    /// none is reachable from here).
    Connect,
    /// A call of the OS or of the transport's library failed (a socket call, an `fi_*` or
    /// `ibv_*` call); the source or the message says why.
    Call,
    /// An operation did not complete before its deadline.
    Timeout,
    /// The peer closed its end (it dropped the connection or exited after saying goodbye).
    PeerClosed,
    /// The peer sent something this rank refused (a malformed frame, a destination outside
    /// the memories it was given): nothing of it was applied, and the connection is closed.
    Protocol,
    /// A memory cannot be used on this connection (not the peer's, not registered for this
    /// transport, unknown to the connection, a misaligned word).
    Memory,
    /// This rank's device failed while staging or applying the connection's data.
    Device,
    /// The hardware completed a posted operation with an error status (the connection is in
    /// error).
    Completion,
}

/// The message of an [`Error::Transport`] (module docs).
pub(super) fn describe(
    transport: &Transport,
    remote_rank: &Option<usize>,
    kind: &TransportErrorKind,
    detail: &str,
) -> String {
    let t = transport.name();
    match (kind, remote_rank) {
        (TransportErrorKind::Unavailable, _) => format!("{t} is not available: {detail}"),
        (_, Some(r)) => format!("{t} connection to rank {r}: {detail}"),
        (_, None) => format!("{t}: {detail}"),
    }
}

/// Where a transport failure happens: the transport, and the peer of the connection (none for
/// what happens outside one: loading the library, opening a device). Its methods build the
/// [`Error::Transport`] of each kind with the wording every transport shares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Link {
    /// The transport.
    pub transport: Transport,
    /// The peer, if the failure is a connection's.
    pub remote_rank: Option<usize>,
}

impl Link {
    /// The connection to `remote_rank` over `transport`.
    pub fn to(transport: Transport, remote_rank: usize) -> Self {
        Self {
            transport,
            remote_rank: Some(remote_rank),
        }
    }

    /// `transport` outside any connection.
    pub fn local(transport: Transport) -> Self {
        Self {
            transport,
            remote_rank: None,
        }
    }

    /// An error of `kind` while doing `op`, described by `detail`, without a source.
    pub fn error(self, kind: TransportErrorKind, op: &'static str, detail: String) -> Error {
        self.caused(kind, op, detail, None)
    }

    /// An error of `kind` while doing `op`, described by `detail`, caused by `source`.
    pub fn caused(
        self,
        kind: TransportErrorKind,
        op: &'static str,
        detail: String,
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Error {
        Error::Transport {
            transport: self.transport,
            remote_rank: self.remote_rank,
            kind,
            op,
            detail,
            source,
        }
    }

    /// The transport cannot be used here, for `reason`.
    pub fn unavailable(self, reason: String) -> Error {
        self.error(TransportErrorKind::Unavailable, "open", reason)
    }

    /// The set-up with the peer failed, for `reason`.
    pub fn setup(self, reason: String) -> Error {
        self.error(
            TransportErrorKind::Setup,
            "set-up",
            format!("set-up failed: {reason}"),
        )
    }

    /// The OS call `op` failed with `source`.
    pub fn io(self, op: &'static str, source: std::io::Error) -> Error {
        self.caused(
            TransportErrorKind::Call,
            op,
            format!("{op} failed"),
            Some(Box::new(source)),
        )
    }

    /// The library call `op` failed, for `reason`.
    pub fn call(self, op: &'static str, reason: &str) -> Error {
        self.error(
            TransportErrorKind::Call,
            op,
            format!("{op} failed: {reason}"),
        )
    }

    /// `op` did not complete within `after`.
    pub fn timeout(self, op: &'static str, after: Duration) -> Error {
        self.error(
            TransportErrorKind::Timeout,
            op,
            format!("{op} did not complete within {after:?}"),
        )
    }

    /// The peer closed its end; this rank found out during `op`.
    pub fn peer_closed(self, op: &'static str) -> Error {
        self.error(
            TransportErrorKind::PeerClosed,
            op,
            format!("the peer closed it ({op})"),
        )
    }

    /// This rank refused a frame of the peer, for `reason`.
    pub fn protocol(self, reason: &str) -> Error {
        self.error(
            TransportErrorKind::Protocol,
            "receive",
            format!("refused a frame from the peer: {reason}"),
        )
    }

    /// `op` was asked of a memory this connection cannot use.
    pub fn memory(self, op: &'static str, misuse: MemoryMisuse) -> Error {
        self.error(TransportErrorKind::Memory, op, misuse.to_string())
    }

    /// This rank's device failed while staging or applying the connection's data, for
    /// `reason`; `op` is the call that reports it.
    pub fn device(self, op: &'static str, reason: &str) -> Error {
        self.error(
            TransportErrorKind::Device,
            op,
            format!("this rank's device failed while staging or applying data: {reason}"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_transport_the_peer_and_the_failure() {
        let eth = Link::to(Transport::Ethernet, 3);
        let e = eth.timeout("flush", Duration::from_secs(2));
        assert_eq!(
            e.to_string(),
            "Ethernet connection to rank 3: flush did not complete within 2s"
        );
        assert!(matches!(
            e,
            Error::Transport {
                transport: Transport::Ethernet,
                remote_rank: Some(3),
                kind: TransportErrorKind::Timeout,
                op: "flush",
                ..
            }
        ));
        let e = Link::local(Transport::Ofi).unavailable("no provider".into());
        assert_eq!(e.to_string(), "libfabric is not available: no provider");
        let e = Link::local(Transport::Ib(1)).call("ibv_open_device", "on mlx5_1");
        assert_eq!(
            e.to_string(),
            "InfiniBand: ibv_open_device failed: on mlx5_1"
        );
        let e = Link::to(Transport::Ofi, 0).peer_closed("write");
        assert_eq!(
            e.to_string(),
            "libfabric connection to rank 0: the peer closed it (write)"
        );
        let misuse = MemoryMisuse::Misaligned { offset: 4 };
        let e = Link::to(Transport::Ib(0), 1).memory("update_and_sync", misuse);
        assert!(
            e.to_string()
                .ends_with("offset 4, which is not 8-byte aligned"),
            "{e}"
        );
    }

    #[test]
    fn the_os_error_is_the_source() {
        use std::error::Error as _;
        let e = Link::to(Transport::Ethernet, 1).io(
            "bind a listener",
            std::io::Error::from(std::io::ErrorKind::AddrInUse),
        );
        assert_eq!(
            e.to_string(),
            "Ethernet connection to rank 1: bind a listener failed"
        );
        let source = e.source().expect("a source");
        let io = source
            .downcast_ref::<std::io::Error>()
            .expect("an io::Error");
        assert_eq!(io.kind(), std::io::ErrorKind::AddrInUse);
        assert!(
            Link::to(Transport::Ethernet, 1)
                .protocol("x")
                .source()
                .is_none()
        );
    }
}
