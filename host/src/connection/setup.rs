//! Building a connection from the local and the remote endpoint (MSCCL++'s `Context::connect`).
//!
//! The communicator only trades endpoints: it asks this module for the local one
//! ([`LocalEndpoint::prepare`]), sends its [`Endpoint`] to the peer through the bootstrap,
//! receives the peer's, and hands it back ([`LocalEndpoint::connect`]); this module builds the
//! transport:
//!
//! | transport | prepared before the endpoints cross | built from the peer's endpoint |
//! |---|---|---|
//! | `CudaIpc`, `Shm` | nothing | [`P2pConnection`] (peer access enabled first when the peer is a device of this process) |
//! | `Ethernet` | a listener ([`ethernet::Listener`]) | [`EthernetConnection`]: connect, handshake, receiver thread |
//! | `Ib(i)` | a queue pair in INIT and its registrations | `IbConnection`: RTR, RTS; then both sides exchange a ready message ([`Established::exchange_ready`]) |
//! | `Ofi` | the provider's objects, posted receives, registrations (`ofi::Prepared`) | [`OfiConnection`]: the peer's address, the progress thread |
//!
//! `Endpoint::extra` of a network transport is a status byte, then for 0 (ready) the
//! transport's bytes, for 1 (failed) the sender's reason (UTF-8, cut to
//! [`MAX_FAILURE_REASON`] bytes): a side whose preparation failed still sends its endpoint, so
//! the peer fails at once with its reason rather than waiting for one. Same-node transports
//! send no extra bytes.

use std::sync::Arc;

use super::ethernet::{self, EthernetConnection};
use super::ofi::{self, OfiConnection};
use super::p2p::P2pConnection;
use super::{Connection, Endpoint, EndpointConfig};
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::registered_memory::LocalMemories;
use crate::status::StatusBlock;
use crate::transport::Transport;

/// Longest failure reason carried in an endpoint.
pub const MAX_FAILURE_REASON: usize = 512;

/// What a connection of this rank needs from it (the communicator lends it).
pub(crate) struct Context<'a> {
    /// This rank.
    pub rank: usize,
    /// This rank's device.
    pub gpu: &'a Gpu,
    /// This rank's registry of memories (network receivers check destinations against it).
    pub registry: &'a Arc<LocalMemories>,
    /// The communicator's status block (network receivers abort it when the peer fails).
    pub status: &'a Arc<StatusBlock>,
    /// The world's secret (the bootstrap's): network transports authenticate with it.
    pub secret: Option<crate::auth::Secret>,
}

/// What a transport prepared before the endpoints crossed.
enum Prepared {
    /// A same-node transport: nothing.
    Local(Transport),
    /// A bound listener.
    Ethernet(ethernet::Listener),
    /// A queue pair in INIT and its registrations.
    #[cfg(feature = "ib")]
    Ib(Box<super::ib::Prepared>),
    /// libfabric objects, posted receives and registrations.
    Ofi(Box<ofi::Prepared>),
}

/// The local end of a connection being set up: what was prepared, and the endpoint to send.
pub(crate) struct LocalEndpoint {
    config: EndpointConfig,
    remote_rank: usize,
    prepared: Result<Prepared>,
    endpoint: Endpoint,
}

/// A connection built from both endpoints.
pub(crate) struct Established {
    /// The connection.
    pub connection: Arc<dyn Connection>,
    /// Whether both sides must exchange a ready message (through the bootstrap) before either
    /// uses it: `Ib`, so that neither side writes before the other's queue pair can receive.
    pub exchange_ready: bool,
}

impl LocalEndpoint {
    /// Prepares this rank's end of a connection to `remote_rank` over `config.transport`. A
    /// failure is kept and travels in the endpoint; [`connect`](Self::connect) returns it.
    pub(crate) fn prepare(ctx: &Context<'_>, config: EndpointConfig, remote_rank: usize) -> Self {
        let transport = config.transport;
        let prepared = match transport {
            Transport::CudaIpc | Transport::Shm => Ok(Prepared::Local(transport)),
            Transport::Ethernet => ethernet::Listener::bind(remote_rank).map(Prepared::Ethernet),
            #[cfg(feature = "ib")]
            Transport::Ib(i) => super::ib::Prepared::new(i, ctx.registry, remote_rank)
                .map(|p| Prepared::Ib(Box::new(p))),
            #[cfg(not(feature = "ib"))]
            Transport::Ib(_) => Err(crate::error::Link::local(transport).unavailable(
                "this build has no InfiniBand support (enable the `ib` feature)".into(),
            )),
            Transport::Ofi => {
                ofi::Prepared::new(ctx.gpu, ctx.registry).map(|p| Prepared::Ofi(Box::new(p)))
            }
        };
        let extra = match &prepared {
            Ok(Prepared::Local(_)) => Vec::new(),
            Ok(Prepared::Ethernet(l)) => encode_extra(Ok(&l.info().encode())),
            #[cfg(feature = "ib")]
            Ok(Prepared::Ib(p)) => encode_extra(Ok(&p.info().encode())),
            Ok(Prepared::Ofi(p)) => encode_extra(Ok(&p.info().encode())),
            Err(e) => encode_extra(Err(&e.to_string())),
        };
        let endpoint = Endpoint {
            transport: transport.bit(),
            rank: ctx.rank as u32,
            pid: std::process::id(),
            device: ctx.gpu.ordinal() as u32,
            extra,
        };
        Self {
            config,
            remote_rank,
            prepared,
            endpoint,
        }
    }

    /// The endpoint the peer needs.
    pub(crate) fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Builds the connection from this end and the peer's endpoint `theirs` (already checked
    /// to come from the peer). `same_node` says whether the peer runs on this node.
    pub(crate) fn connect(
        self,
        ctx: &Context<'_>,
        theirs: &Endpoint,
        same_node: bool,
    ) -> Result<Established> {
        let (transport, remote_rank) = (self.config.transport, self.remote_rank);
        if theirs.transport != transport.bit() {
            return Err(Error::TransportMismatch {
                remote_rank,
                transport,
                theirs: theirs.transport,
            });
        }
        let ready = |connection: Arc<dyn Connection>| Established {
            connection,
            exchange_ready: false,
        };
        match self.prepared? {
            Prepared::Local(transport) => {
                let backend = ctx.gpu.kind();
                if transport != Transport::local_for(backend) {
                    return Err(Error::TransportUnavailable {
                        remote_rank,
                        transport,
                        backend,
                    });
                }
                if !same_node {
                    return Err(Error::CrossNode {
                        remote_rank,
                        what: "a same-node transport (CudaIpc, Shm)",
                    });
                }
                if theirs.pid == std::process::id() && theirs.device as usize != ctx.gpu.ordinal() {
                    // Ranks of one process reach each other's memory by peer access.
                    let peer = Gpu::open(backend, theirs.device as usize)?;
                    ctx.gpu.enable_peer_access(&peer)?;
                }
                let conn = P2pConnection::new(ctx.gpu, transport, remote_rank)?;
                Ok(ready(Arc::new(conn)))
            }
            Prepared::Ethernet(listener) => {
                let peer_extra = decode_extra(&theirs.extra, remote_rank)?;
                let conn = EthernetConnection::establish(
                    listener,
                    peer_extra,
                    ethernet::Setup {
                        rank: ctx.rank,
                        remote_rank,
                        same_node,
                        gpu: ctx.gpu,
                        registry: Arc::clone(ctx.registry),
                        status: Arc::clone(ctx.status),
                        timeout: self.config.flush_timeout,
                        secret: ctx.secret,
                    },
                )?;
                Ok(ready(Arc::new(conn)))
            }
            #[cfg(feature = "ib")]
            Prepared::Ib(prep) => {
                let peer_extra = decode_extra(&theirs.extra, remote_rank)?;
                let conn = super::ib::IbConnection::establish(
                    *prep,
                    peer_extra,
                    remote_rank,
                    self.config.flush_timeout,
                )?;
                Ok(Established {
                    connection: Arc::new(conn),
                    exchange_ready: true,
                })
            }
            Prepared::Ofi(prep) => {
                let peer_extra = decode_extra(&theirs.extra, remote_rank)?;
                let conn = OfiConnection::establish(
                    *prep,
                    peer_extra,
                    ofi::Setup {
                        rank: ctx.rank,
                        remote_rank,
                        gpu: ctx.gpu,
                        registry: Arc::clone(ctx.registry),
                        status: Arc::clone(ctx.status),
                        timeout: self.config.flush_timeout,
                    },
                )?;
                Ok(ready(Arc::new(conn)))
            }
        }
    }
}

/// `Endpoint::extra` of a network transport (module docs).
fn encode_extra(body: std::result::Result<&[u8], &str>) -> Vec<u8> {
    match body {
        Ok(b) => {
            let mut v = Vec::with_capacity(1 + b.len());
            v.push(0);
            v.extend_from_slice(b);
            v
        }
        Err(reason) => {
            let mut end = reason.len().min(MAX_FAILURE_REASON);
            while !reason.is_char_boundary(end) {
                end -= 1;
            }
            let mut v = Vec::with_capacity(1 + end);
            v.push(1);
            v.extend_from_slice(&reason.as_bytes()[..end]);
            v
        }
    }
}

/// The transport's bytes of a peer's `extra`, or the peer's failure as [`Error::Remote`].
fn decode_extra(extra: &[u8], from_rank: usize) -> Result<&[u8]> {
    match extra.split_first() {
        Some((0, body)) => Ok(body),
        Some((1, reason)) => Err(Error::Remote {
            rank: from_rank,
            reason: format!(
                "it could not prepare its end of the connection: {}",
                String::from_utf8_lossy(reason)
            ),
        }),
        Some((s, _)) => Err(Error::MalformedEndpoint {
            rank: from_rank,
            reason: format!("transport status byte {s}"),
        }),
        None => Err(Error::MalformedEndpoint {
            rank: from_rank,
            reason: "no transport bytes".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_carries_the_bytes_or_the_reason() {
        let ok = encode_extra(Ok(b"abc"));
        assert_eq!(decode_extra(&ok, 2).unwrap(), b"abc");
        let long = "é".repeat(MAX_FAILURE_REASON); // two bytes each: the cut falls mid-char
        let failed = encode_extra(Err(&long));
        assert!(failed.len() <= 1 + MAX_FAILURE_REASON);
        match decode_extra(&failed, 2) {
            Err(Error::Remote { rank: 2, reason }) => {
                assert!(reason.ends_with('é'), "{reason}");
                assert!(
                    !reason.contains('\u{fffd}'),
                    "cut inside a character: {reason}"
                );
            }
            other => panic!("{other:?}"),
        }
        for bad in [&[][..], &[2, 0][..]] {
            assert!(matches!(
                decode_extra(bad, 2),
                Err(Error::MalformedEndpoint { rank: 2, .. })
            ));
        }
    }
}
