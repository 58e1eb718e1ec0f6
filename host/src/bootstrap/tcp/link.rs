//! One mesh connection of a [`TcpBootstrap`](super::TcpBootstrap): the writer (locked per
//! frame) and the reader thread (`bs{r}-rx{p}`) that moves data frames into the mailbox.

use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};

use super::super::mailbox::{LinkDown, Mailbox};
use super::super::wire::{self, DataHeader};
use super::Peer;
use crate::error::{Error, Result};

/// Largest buffer a reader reserves before the bytes have actually arrived.
const PREALLOC_BYTES: usize = 16 << 20;

/// One mesh connection: a writer (locked per frame), a handle for shutting the socket down, and
/// the reader thread feeding the mailbox.
pub(super) struct Link {
    pub(super) writer: Mutex<Writer>,
    pub(super) ctl: TcpStream,
    reader: Option<JoinHandle<()>>,
}

pub(super) struct Writer {
    pub(super) stream: TcpStream,
    /// Set when a send failed part-way: the byte stream is no longer framed, so the link is cut.
    pub(super) broken: Option<String>,
}

impl Link {
    pub(super) fn start(
        me: usize,
        peer: usize,
        addr: Option<SocketAddr>,
        stream: TcpStream,
        mailbox: Arc<Mailbox>,
    ) -> Result<Self> {
        let p = Peer {
            rank: Some(peer),
            addr,
        };
        let io = |source| Error::BootstrapIo {
            rank: me,
            peer: p,
            op: "prepare the connection",
            source,
        };
        stream.set_read_timeout(None).map_err(io)?;
        stream.set_write_timeout(None).map_err(io)?;
        stream.set_nodelay(true).map_err(io)?;
        let rd = stream.try_clone().map_err(io)?;
        let ctl = stream.try_clone().map_err(io)?;
        let reader = thread::Builder::new()
            .name(format!("bs{me}-rx{peer}"))
            .spawn(move || read_loop(peer, rd, &mailbox))
            .map_err(|source| Error::BootstrapSpawn {
                rank: me,
                what: "connection reader thread",
                source,
            })?;
        Ok(Self {
            writer: Mutex::new(Writer {
                stream,
                broken: None,
            }),
            ctl,
            reader: Some(reader),
        })
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        // Wakes the reader (a blocked read returns 0) and closes both directions.
        let _ = self.ctl.shutdown(Shutdown::Both);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

fn down_from(e: &io::Error) -> LinkDown {
    use io::ErrorKind as K;
    match e.kind() {
        K::ConnectionReset
        | K::ConnectionAborted
        | K::BrokenPipe
        | K::UnexpectedEof
        | K::NotConnected => LinkDown::Closed,
        k => LinkDown::Io(k, e.to_string()),
    }
}

/// Fills `buf`; `Ok(false)` on a clean EOF before the first byte.
fn read_frame_header(stream: &TcpStream, buf: &mut [u8]) -> Result<bool, LinkDown> {
    let mut filled = 0;
    while filled < buf.len() {
        match (&*stream).read(&mut buf[filled..]) {
            Ok(0) if filled == 0 => return Ok(false),
            Ok(0) => return Err(LinkDown::Closed),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(down_from(&e)),
        }
    }
    Ok(true)
}

/// The reader thread of one connection: frames into the mailbox until EOF or an error, then
/// records why and closes the socket (which also answers a peer's closing FIN, see
/// [`TcpBootstrap`]'s `Drop`). A connection that ends after the peer's goodbye is recorded as
/// [`LinkDown::Left`], however it ends (a reset included), unless a frame was malformed.
fn read_loop(peer: usize, stream: TcpStream, mailbox: &Mailbox) {
    let mut said_goodbye = false;
    let why = loop {
        let mut h = [0u8; wire::DATA_HEADER_LEN];
        match read_frame_header(&stream, &mut h) {
            Ok(true) => {}
            Ok(false) => break LinkDown::Closed,
            Err(d) => break d,
        }
        let header = match DataHeader::decode(&h) {
            Ok(h) => h,
            Err(reason) => break LinkDown::Malformed(reason),
        };
        // At most MAX_DATA_LEN (1 GiB), checked by decode.
        let len = usize::try_from(header.len).unwrap_or(usize::MAX);
        let mut payload = Vec::new();
        if payload.try_reserve_exact(len.min(PREALLOC_BYTES)).is_err() {
            break LinkDown::Malformed(format!("cannot allocate a {len}-byte frame"));
        }
        match (&stream).take(header.len).read_to_end(&mut payload) {
            Ok(_) if header.channel == wire::CHANNEL_GOODBYE => said_goodbye = true,
            Ok(n) if n == len => mailbox.push(peer, header.channel, header.tag, payload),
            Ok(_) => break LinkDown::Closed,
            Err(e) => break down_from(&e),
        }
    };
    if let LinkDown::Malformed(reason) = &why {
        tracing::warn!(
            "bootstrap: rank {peer} sent a malformed frame ({reason}); closing its connection"
        );
    }
    let why = match why {
        LinkDown::Closed | LinkDown::Io(..) if said_goodbye => LinkDown::Left,
        other => other,
    };
    mailbox.set_down(peer, why);
    let _ = stream.shutdown(Shutdown::Both);
}
