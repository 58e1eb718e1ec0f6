//! `P2pConnection`: same-node transports over the device runtime — `CudaIpc` (peer memory
//! mapped through CUDA IPC or peer access, copies by the copy engine) and `Shm` (the CPU
//! backend's shared memory, copies by the stream worker).
//!
//! The connection owns one stream. `write` queues a copy into the peer's memory (mapped here
//! when the peer's `RegisteredMemory` was received); `update_and_sync` queues a store of the new
//! value behind it on the same stream, so the peer sees the data before the flag; `flush`
//! polls the stream until it is idle or the timeout passes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::Connection;
use crate::error::{Error, Result};
use crate::gpu::{Gpu, LazyStream};
use crate::registered_memory::RegisteredMemory;
use crate::transport::Transport;

/// A same-node connection driven by a device stream.
pub struct P2pConnection {
    transport: Transport,
    remote_rank: usize,
    /// Made at the first copy or signal (`LazyStream`).
    stream: LazyStream,
}

impl P2pConnection {
    /// A connection to `remote_rank` whose copies run on a new stream of `gpu`.
    pub fn new(gpu: &Gpu, transport: Transport, remote_rank: usize) -> Result<Self> {
        Ok(Self {
            transport,
            remote_rank,
            stream: LazyStream::new(gpu),
        })
    }
}

impl Connection for P2pConnection {
    fn transport(&self) -> Transport {
        self.transport
    }

    fn remote_rank(&self) -> usize {
        self.remote_rank
    }

    fn write(
        &self,
        dst: &RegisteredMemory,
        dst_off: u64,
        src: &RegisteredMemory,
        src_off: u64,
        size: u64,
    ) -> Result<()> {
        let d = dst.range(dst_off, size)?;
        let s = src.range(src_off, size)?;
        if size == 0 {
            return Ok(());
        }
        // SAFETY: both ranges were checked against registered memories that stay alive (their
        // owners keep them registered while a proxy uses them); distinct buffers never overlap.
        unsafe { self.stream.get()?.copy_dtod(d, s, size as usize) }
    }

    fn update_and_sync(
        &self,
        dst: &RegisteredMemory,
        dst_off: u64,
        src: &AtomicU64,
        new_value: u64,
    ) -> Result<()> {
        if !dst_off.is_multiple_of(8) {
            return Err(Error::OutOfRange {
                offset: dst_off as usize,
                len: 8,
                size: dst.size(),
            });
        }
        let d = dst.range(dst_off, 8)?;
        src.store(new_value, Ordering::Release);
        // SAFETY: checked, aligned, inside a live registered memory.
        unsafe { self.stream.get()?.write_value_u64(d.cast(), new_value) }
    }

    fn flush(&self, timeout: Duration) -> Result<()> {
        // Nothing was ever queued: nothing to wait for.
        if !self.stream.is_made() {
            return Ok(());
        }
        if self.stream.get()?.synchronize_timeout(timeout)? {
            Ok(())
        } else {
            Err(Error::FlushTimeout {
                remote_rank: self.remote_rank,
                transport: self.transport,
                after: timeout,
            })
        }
    }
}
