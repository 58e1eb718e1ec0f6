//! The core the network transports share (Ethernet, libfabric, InfiniBand), so each holds only
//! what is its own (its wire format, its set-up, its data path):
//!
//! | file | holds | used by |
//! |---|---|---|
//! | `trust.rs` | the trust boundary: the receiver's check of every destination a peer names ([`check_destination`]: registered here for the transport, the network key in constant time, the range, the alignment), and the sender's check of its caller's destination ([`check_remote`], [`check_word`]) | receivers: Ethernet, libfabric (InfiniBand has none: the HCA checks its keys); senders: all three |
//! | `failure.rs` | why a connection stopped working ([`Failure`]), the error its calls return then, and whether it aborts the communicator | Ethernet, libfabric |
//! | `dl.rs` | the `dlopen` loader ([`Library`]) of the transports' libraries | libfabric, InfiniBand (Ethernet needs none) |
//!
//! Their errors are [`Error::Transport`](crate::Error::Transport), built with
//! [`Link`](crate::error::Link) (one form for every transport).

mod dl;
mod failure;
mod trust;

pub(crate) use self::dl::Library;
pub(crate) use self::failure::Failure;
pub(crate) use self::trust::{check_destination, check_remote, check_word};
