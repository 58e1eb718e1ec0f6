//! Why a network connection stopped working, and what each reason becomes: the error its calls
//! return (sticky: the first reason wins, every later call returns it) and whether it aborts
//! the communicator. The Ethernet and libfabric connections record a [`Failure`]; the mapping
//! below is theirs alike.

use std::io;

use crate::error::{Error, Link};

/// Why a connection stopped working (the first reason recorded wins).
#[derive(Clone, Debug)]
pub(crate) enum Failure {
    /// The peer said goodbye (`BYE`) and closed, or this side is closing: the end of a
    /// normal teardown.
    Closed,
    /// The peer's end failed without a goodbye (its stream ended or reset, an operation with
    /// it failed): it died, or the link broke.
    Lost(String),
    /// The peer refused this rank's frames (its `ERROR`, with its reason).
    Refused(String),
    /// This rank refused a frame of the peer.
    Protocol(String),
    /// A socket call failed: the operation, the OS error's kind and text.
    Io(&'static str, io::ErrorKind, String),
    /// A call of the transport's library failed.
    Call(String),
    /// This rank's device failed while staging or applying a frame.
    Local(String),
}

impl Failure {
    /// The error a call `op` of the connection `link` returns once the connection failed so.
    pub(crate) fn to_error(&self, link: Link, op: &'static str) -> Error {
        let name = link.transport.name();
        let rank = link.remote_rank.unwrap_or(usize::MAX);
        match self {
            Failure::Closed => link.peer_closed(op),
            Failure::Lost(why) => Error::Remote {
                rank,
                reason: format!("its {name} connection ended without a goodbye ({why})"),
            },
            Failure::Refused(why) => Error::Remote {
                rank,
                reason: format!("it refused this rank's {name} data: {why}"),
            },
            Failure::Protocol(why) => link.protocol(why),
            Failure::Io(what, kind, msg) => link.io(what, io::Error::new(*kind, msg.clone())),
            Failure::Call(why) => link.call(op, why),
            Failure::Local(why) => link.device(op, why),
        }
    }

    /// Whether the connection aborts the communicator for it, releasing every device wait of
    /// this rank: the peer is gone or hostile, a library call left the connection unusable, or
    /// this rank cannot apply the peer's data. Not for a goodbye, for the peer's refusal (it
    /// is the peer that aborts then), or for a failed socket call of this side.
    pub(crate) fn aborts(&self) -> bool {
        matches!(
            self,
            Failure::Lost(_) | Failure::Protocol(_) | Failure::Call(_) | Failure::Local(_)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::TransportErrorKind;
    use crate::transport::Transport;

    #[test]
    fn each_failure_becomes_its_error() {
        let link = Link::to(Transport::Ethernet, 4);
        let kind = |f: Failure| match f.to_error(link, "flush") {
            Error::Transport {
                kind,
                remote_rank: Some(4),
                transport: Transport::Ethernet,
                ..
            } => Some(kind),
            Error::Remote { rank: 4, .. } => None,
            e => panic!("{e:?}"),
        };
        assert_eq!(kind(Failure::Closed), Some(TransportErrorKind::PeerClosed));
        assert_eq!(kind(Failure::Lost("x".into())), None);
        assert_eq!(kind(Failure::Refused("x".into())), None);
        assert_eq!(
            kind(Failure::Protocol("x".into())),
            Some(TransportErrorKind::Protocol)
        );
        let io = Failure::Io("receive", io::ErrorKind::BrokenPipe, "gone".into());
        assert_eq!(kind(io), Some(TransportErrorKind::Call));
        assert_eq!(
            kind(Failure::Call("x".into())),
            Some(TransportErrorKind::Call)
        );
        assert_eq!(
            kind(Failure::Local("x".into())),
            Some(TransportErrorKind::Device)
        );
        let lost = Failure::Lost("end of stream".into()).to_error(link, "write");
        assert_eq!(
            lost.to_string(),
            "rank 4 failed: its Ethernet connection ended without a goodbye (end of stream)"
        );
        let refused =
            Failure::Refused("bad key".into()).to_error(Link::to(Transport::Ofi, 4), "flush");
        assert_eq!(
            refused.to_string(),
            "rank 4 failed: it refused this rank's libfabric data: bad key"
        );
    }

    #[test]
    fn what_aborts_the_communicator() {
        let aborts = |f: Failure| f.aborts();
        assert!(!aborts(Failure::Closed));
        assert!(!aborts(Failure::Refused("x".into())));
        assert!(!aborts(Failure::Io("x", io::ErrorKind::Other, "x".into())));
        assert!(aborts(Failure::Lost("x".into())));
        assert!(aborts(Failure::Protocol("x".into())));
        assert!(aborts(Failure::Call("x".into())));
        assert!(aborts(Failure::Local("x".into())));
    }
}
