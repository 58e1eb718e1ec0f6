//! The receiving side of an Ethernet connection: the thread (`eth{rank}-rx{peer}`) that reads
//! the inbound stream, checks every frame against the registry, applies it on this rank's
//! device and answers `FLUSH` with `ACK` (see the [module docs](super) for what is checked).

use std::io::Read;
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::wire::Frame;
use super::{CHUNK, ERROR_REPORT_TIMEOUT, HEADER_LEN, MAX_REASON, Shared, staging};
use crate::connection::network::{Failure, check_destination};
use crate::error::Error;
use crate::gpu::{Gpu, HostMapped, Stream};
use crate::registered_memory::LocalMemories;
use crate::socket::{IoFail, classify, deadline_in, read_full, write_full};
use crate::transport::Transport;

pub(super) struct Receiver {
    pub(super) shared: Arc<Shared>,
    pub(super) stream: TcpStream,
    pub(super) gpu: Gpu,
    pub(super) registry: Arc<LocalMemories>,
    /// Device stream and pinned staging buffer (`CHUNK` bytes), made at the first `WRITE`.
    pub(super) dev: Option<(Stream, HostMapped)>,
    pub(super) timeout: Duration,
}

enum Step {
    Continue,
    Bye,
}

impl Receiver {
    pub(super) fn run(mut self) {
        let why = loop {
            match self.read_header() {
                Ok(Some(h)) => match self.handle(&h) {
                    Ok(Step::Continue) => {}
                    Ok(Step::Bye) => {
                        // Not a failure: the peer drops its end; this side's calls fail once
                        // the peer closes our outbound stream (after its linger).
                        self.shared.peer_bye.store(true, Ordering::Release);
                        let _ = self.stream.shutdown(Shutdown::Both);
                        return;
                    }
                    Err(f) => break f,
                },
                Ok(None) => break Failure::Lost("end of stream".into()),
                Err(f) => break f,
            }
        };
        if self.shared.closing.load(Ordering::Acquire) {
            let _ = self.stream.shutdown(Shutdown::Both);
            return;
        }
        // Sticky (and the abort) first: once the peer reads our ERROR, this side already fails.
        let recorded = self.shared.fail(why.clone());
        if why.aborts() {
            tracing::warn!(
                "Ethernet: connection from rank {} failed ({}); aborting the communicator",
                self.shared.remote_rank,
                recorded.to_error(self.shared.link(), "receive")
            );
            self.shared.status.abort();
        }
        if let Failure::Protocol(reason) = &why {
            self.report(reason);
        }
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    /// Tells the peer why its frame was refused (best effort).
    fn report(&self, reason: &str) {
        let mut end = reason.len().min(MAX_REASON);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        let reason = &reason.as_bytes()[..end];
        let mut frame = Frame::Error {
            len: reason.len() as u64,
        }
        .encode()
        .to_vec();
        frame.extend_from_slice(reason);
        let _ = write_full(&self.stream, &frame, deadline_in(ERROR_REPORT_TIMEOUT));
    }

    /// The next header; `None` on a clean end of stream between frames.
    fn read_header(&self) -> Result<Option<[u8; HEADER_LEN]>, Failure> {
        let mut h = [0u8; HEADER_LEN];
        let mut filled = 0;
        if let Err(e) = self.stream.set_read_timeout(None) {
            return Err(Failure::Io("receive", e.kind(), e.to_string()));
        }
        while filled < HEADER_LEN {
            match (&self.stream).read(&mut h[filled..]) {
                Ok(0) if filled == 0 => return Ok(None),
                Ok(0) => return Err(Failure::Lost("end of stream inside a frame header".into())),
                Ok(n) => filled += n,
                Err(e) => match classify(e) {
                    None => {}
                    Some(IoFail::Closed) => return Err(Failure::Lost("connection reset".into())),
                    Some(IoFail::Io(e)) => {
                        return Err(Failure::Io("receive", e.kind(), e.to_string()));
                    }
                    Some(IoFail::Timeout) => {}
                },
            }
        }
        Ok(Some(h))
    }

    fn handle(&mut self, h: &[u8; HEADER_LEN]) -> Result<Step, Failure> {
        let frame = Frame::decode(h).map_err(Failure::Protocol)?;
        match frame {
            Frame::Write {
                id,
                offset,
                len,
                key,
            } => {
                // Checked before a byte of payload is read…
                check_destination(
                    &self.registry.read(),
                    Transport::Ethernet,
                    id,
                    key,
                    (offset, len, 1),
                )
                .map_err(Failure::Protocol)?;
                self.apply_write(id, key, offset, len)?;
                Ok(Step::Continue)
            }
            Frame::Update {
                id,
                offset,
                value,
                key,
            } => {
                self.apply_update(id, key, offset, value)?;
                Ok(Step::Continue)
            }
            Frame::Flush { seq } => {
                // Every earlier frame was applied and synchronized before this one was read.
                write_full(
                    &self.stream,
                    &Frame::Ack { seq }.encode(),
                    deadline_in(self.timeout),
                )
                .map_err(|f| Failure::Lost(format!("sending ACK {seq}: {f:?}")))?;
                Ok(Step::Continue)
            }
            Frame::Bye => Ok(Step::Bye),
            other @ (Frame::Ack { .. } | Frame::Error { .. }) => Err(Failure::Protocol(format!(
                "{other:?} sent on the data direction"
            ))),
        }
    }

    /// Waits for the device stream; on a timeout the staging buffer is leaked, never freed,
    /// because a copy from it may still run.
    fn sync(&mut self, what: &str) -> Result<(), Failure> {
        let Some((stream, _)) = &self.dev else {
            return Ok(());
        };
        match stream.synchronize_timeout(self.timeout) {
            Ok(true) => Ok(()),
            Ok(false) => {
                std::mem::forget(self.dev.take());
                Err(Failure::Local(format!(
                    "{what} did not complete on the device within {:?}",
                    self.timeout
                )))
            }
            Err(e) => Err(Failure::Local(e.to_string())),
        }
    }

    fn apply_write(&mut self, id: u32, key: u64, offset: u64, len: u64) -> Result<(), Failure> {
        let n = len as usize; // ≤ CHUNK, checked by decode
        let timeout = self.timeout;
        let (stream, staging) = staging(&self.gpu, &mut self.dev, CHUNK).map_err(local)?;
        // SAFETY: the staging buffer is live host memory of CHUNK ≥ n bytes, used only by this
        // thread, and no device copy from it is in flight (each one is synchronized below).
        let host = unsafe { std::slice::from_raw_parts_mut(staging.host_ptr(), n) };
        read_full(&self.stream, host, deadline_in(timeout)).map_err(|f| match f {
            IoFail::Timeout => Failure::Lost(format!(
                "stalled for {timeout:?} inside a {n}-byte WRITE payload"
            )),
            IoFail::Closed => Failure::Lost("end of stream inside a WRITE payload".into()),
            IoFail::Io(e) => Failure::Io("receive", e.kind(), e.to_string()),
        })?;
        // …and again under the read lock, held until the copy completes, so the memory cannot
        // be deregistered (and freed by its owner) while it is written.
        let registry = Arc::clone(&self.registry);
        let map = registry.read();
        let dst = check_destination(&map, Transport::Ethernet, id, key, (offset, len, 1))
            .map_err(Failure::Protocol)?;
        // SAFETY: `dst..dst+n` lies inside a registered local memory (checked under the lock,
        // which is held until the copy completes); the staging buffer is a distinct allocation.
        unsafe { stream.copy_dtod(dst, staging.device_ptr(), n) }
            .map_err(|e| Failure::Local(e.to_string()))?;
        self.sync("a WRITE copy")
    }

    fn apply_update(&mut self, id: u32, key: u64, offset: u64, value: u64) -> Result<(), Failure> {
        let (stream, _) = staging(&self.gpu, &mut self.dev, CHUNK).map_err(local)?;
        let registry = Arc::clone(&self.registry);
        let map = registry.read();
        let dst = check_destination(&map, Transport::Ethernet, id, key, (offset, 8, 8))
            .map_err(Failure::Protocol)?;
        // SAFETY: an 8-byte aligned word inside a registered local memory, kept registered by
        // the read lock until the store completes.
        unsafe { stream.write_value_u64(dst.cast(), value) }
            .map_err(|e| Failure::Local(e.to_string()))?;
        self.sync("an UPDATE store")
    }
}

/// A device failure while applying a frame.
fn local(e: Error) -> Failure {
    Failure::Local(e.to_string())
}
