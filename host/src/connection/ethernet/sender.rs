//! The sending side of an Ethernet connection: `write`, `update_and_sync` and `flush` over
//! the outbound stream, and the answers (`ACK`, `ERROR`) read back on it.

use std::io::Read;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::wire::Frame;
use super::{CHUNK, EthernetConnection, HEADER_LEN, MAX_REASON, WHY_TIMEOUT, staging};
use crate::connection::Connection;
use crate::connection::network::{Failure, check_remote, check_word};
use crate::error::{Error, Result};
use crate::gpu::{Gpu, HostMapped, Stream};
use crate::registered_memory::RegisteredMemory;
use crate::socket::{IoFail, classify, deadline_in, remaining, write_some};
use crate::sync::lock;
use crate::transport::Transport;

/// Answers read back on the outbound stream.
enum Back {
    Ack(u64),
    Error(String),
}

enum BackFail {
    Io(IoFail),
    Malformed(String),
}

/// Reads answers on the outbound stream, keeping a partly read frame across timeouts.
#[derive(Default)]
pub(super) struct BackReader {
    buf: Vec<u8>,
}

impl BackReader {
    fn next(&mut self, stream: &TcpStream, deadline: Instant) -> Result<Back, BackFail> {
        loop {
            let mut want = HEADER_LEN;
            if self.buf.len() >= HEADER_LEN {
                let mut h = [0u8; HEADER_LEN];
                h.copy_from_slice(&self.buf[..HEADER_LEN]);
                match Frame::decode(&h).map_err(BackFail::Malformed)? {
                    Frame::Ack { seq } => {
                        self.buf.drain(..HEADER_LEN);
                        return Ok(Back::Ack(seq));
                    }
                    // At most MAX_REASON, checked by decode.
                    Frame::Error { len } => want = HEADER_LEN + len as usize,
                    other => {
                        return Err(BackFail::Malformed(format!(
                            "{other:?} sent on the answer direction"
                        )));
                    }
                }
                if self.buf.len() >= want {
                    let reason = String::from_utf8_lossy(&self.buf[HEADER_LEN..want]).into_owned();
                    self.buf.drain(..want);
                    return Ok(Back::Error(reason));
                }
            }
            let left = remaining(deadline).ok_or(BackFail::Io(IoFail::Timeout))?;
            stream
                .set_read_timeout(Some(left))
                .map_err(|e| BackFail::Io(IoFail::Io(e)))?;
            let mut tmp = [0u8; HEADER_LEN + MAX_REASON];
            let need = want - self.buf.len();
            match (&*stream).read(&mut tmp[..need]) {
                Ok(0) => return Err(BackFail::Io(IoFail::Closed)),
                Ok(n) => self.buf.extend_from_slice(&tmp[..n]),
                Err(e) => match classify(e) {
                    None => {}
                    Some(f) => return Err(BackFail::Io(f)),
                },
            }
        }
    }
}

/// The outbound stream and the sender's state, under one lock.
pub(super) struct Out {
    pub(super) wire: Wire,
    pub(super) gpu: Gpu,
    /// Device stream and pinned staging buffer (`HEADER_LEN + CHUNK` bytes), made at first use.
    pub(super) dev: Option<(Stream, HostMapped)>,
}

/// The outbound socket and its framing state.
pub(super) struct Wire {
    pub(super) stream: TcpStream,
    /// Unsent rest of a frame whose write timed out part-way; sent before anything else.
    pub(super) pending: Vec<u8>,
    /// Sequence number of the last `FLUSH`.
    pub(super) seq: u64,
    pub(super) back: BackReader,
}

impl Wire {
    /// Sends `frame` whole, after any pending bytes. On a timeout the stream stays framed: the
    /// rest of a partly sent frame becomes pending, a frame not started is dropped.
    pub(super) fn send(&mut self, frame: &[u8], deadline: Instant) -> Result<(), IoFail> {
        if !self.pending.is_empty() {
            let (n, fail) = write_some(&self.stream, &self.pending, deadline);
            self.pending.drain(..n);
            if let Some(f) = fail {
                return Err(f);
            }
        }
        let (n, fail) = write_some(&self.stream, frame, deadline);
        match fail {
            None => Ok(()),
            Some(f) => {
                if n > 0 {
                    self.pending.extend_from_slice(&frame[n..]);
                }
                Err(f)
            }
        }
    }
}

impl EthernetConnection {
    /// Turns a failed send into the connection's (sticky, unless a timeout) error.
    fn send_failed(&self, out: &mut Wire, f: IoFail, op: &'static str) -> Error {
        let failure = match f {
            IoFail::Timeout => return self.shared.link().timeout(op, self.timeout),
            IoFail::Io(e) => Failure::Io(op, e.kind(), e.to_string()),
            IoFail::Closed => {
                // The peer may have said why before closing: look for its ERROR.
                match out.back.next(&out.stream, deadline_in(WHY_TIMEOUT)) {
                    Ok(Back::Error(why)) => Failure::Refused(why),
                    _ => self.shared.ended(format!("{op}: the connection was reset")),
                }
            }
        };
        let f = self.shared.fail(failure);
        let _ = out.stream.shutdown(Shutdown::Both);
        f.to_error(self.shared.link(), op)
    }

    fn send_frame(
        &self,
        wire: &mut Wire,
        frame: &[u8],
        deadline: Instant,
        op: &'static str,
    ) -> Result<()> {
        wire.send(frame, deadline)
            .map_err(|f| self.send_failed(wire, f, op))
    }
}

impl Connection for EthernetConnection {
    fn transport(&self) -> Transport {
        Transport::Ethernet
    }

    fn remote_rank(&self) -> usize {
        self.peer()
    }

    fn write(
        &self,
        dst: &RegisteredMemory,
        dst_off: u64,
        src: &RegisteredMemory,
        src_off: u64,
        size: u64,
    ) -> Result<()> {
        self.shared.check("write")?;
        check_remote(self.shared.link(), "write", dst, dst_off, size)?;
        let s = src.range(src_off, size)?;
        if size == 0 {
            return Ok(());
        }
        let mut guard = lock(&self.out);
        let Out { wire, gpu, dev } = &mut *guard;
        let deadline = deadline_in(self.timeout);
        let mut done = 0u64;
        while done < size {
            let n = (size - done).min(CHUNK as u64);
            let n_bytes = n as usize; // ≤ CHUNK
            let (stream, buf) = staging(gpu, dev, HEADER_LEN + CHUNK)?;
            // SAFETY: `s + done .. + n` lies inside `src` (checked by `range`), a live local
            // registration; the staging buffer has HEADER_LEN + CHUNK bytes, nothing else uses it
            // while the outbound lock is held, and the two never overlap.
            unsafe {
                stream.copy_dtod(
                    buf.device_ptr().byte_add_cast(HEADER_LEN as u64),
                    s.byte_add_cast(done),
                    n_bytes,
                )
            }?;
            let left = remaining(deadline).unwrap_or(Duration::ZERO);
            if !stream.synchronize_timeout(left)? {
                // The copy may still land in the staging buffer: never reuse or free it.
                std::mem::forget(dev.take());
                let op = "stage a write on the device";
                return Err(self.shared.link().timeout(op, self.timeout));
            }
            // SAFETY: the staging buffer is live host memory of HEADER_LEN + CHUNK bytes; the
            // device copy into it has completed (synchronized above) and nothing else touches it
            // while the outbound lock is held.
            let frame =
                unsafe { std::slice::from_raw_parts_mut(buf.host_ptr(), HEADER_LEN + n_bytes) };
            let header = Frame::Write {
                id: dst.local_id(),
                offset: dst_off + done,
                len: n,
                key: dst.key(),
            };
            frame[..HEADER_LEN].copy_from_slice(&header.encode());
            self.send_frame(wire, frame, deadline, "write")?;
            self.bytes.fetch_add(n, Ordering::Relaxed);
            done += n;
        }
        Ok(())
    }

    fn update_and_sync(
        &self,
        dst: &RegisteredMemory,
        dst_off: u64,
        src: &AtomicU64,
        new_value: u64,
    ) -> Result<()> {
        self.shared.check("update_and_sync")?;
        check_word(self.shared.link(), dst, dst_off)?;
        src.store(new_value, Ordering::Release);
        let frame = Frame::Update {
            id: dst.local_id(),
            offset: dst_off,
            value: new_value,
            key: dst.key(),
        }
        .encode();
        let mut out = lock(&self.out);
        self.send_frame(
            &mut out.wire,
            &frame,
            deadline_in(self.timeout),
            "update_and_sync",
        )
    }

    fn flush(&self, timeout: Duration) -> Result<()> {
        self.shared.check("flush")?;
        let deadline = deadline_in(timeout);
        let mut out = lock(&self.out);
        let wire = &mut out.wire;
        wire.seq += 1;
        let seq = wire.seq;
        let timed_out = || Error::FlushTimeout {
            remote_rank: self.peer(),
            transport: Transport::Ethernet,
            after: timeout,
        };
        match wire.send(&Frame::Flush { seq }.encode(), deadline) {
            Ok(()) => {}
            Err(IoFail::Timeout) => return Err(timed_out()),
            Err(f) => return Err(self.send_failed(wire, f, "flush")),
        }
        loop {
            let failure = match wire.back.next(&wire.stream, deadline) {
                Ok(Back::Ack(s)) if s == seq => return Ok(()),
                Ok(Back::Ack(s)) if s < seq => continue, // left by a flush that timed out
                Ok(Back::Ack(s)) => Failure::Protocol(format!("ACK {s} for FLUSH {seq}")),
                Ok(Back::Error(why)) => Failure::Refused(why),
                Err(BackFail::Io(IoFail::Timeout)) => return Err(timed_out()),
                Err(BackFail::Io(IoFail::Closed)) => {
                    self.shared.ended("flush: the connection closed".into())
                }
                Err(BackFail::Io(IoFail::Io(e))) => Failure::Io("flush", e.kind(), e.to_string()),
                Err(BackFail::Malformed(why)) => Failure::Protocol(why),
            };
            let f = self.shared.fail(failure);
            let _ = wire.stream.shutdown(Shutdown::Both);
            return Err(f.to_error(self.shared.link(), "flush"));
        }
    }

    fn bytes_sent(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}
