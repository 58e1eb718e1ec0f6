//! Device side of a PortChannel: one GPU thread asks the host proxy to move data (copy engine,
//! network) by pushing triggers into the FIFO, and waits on a semaphore the peer's proxy
//! signals. The handle is `mscclpp_shared::PortChannelDeviceHandle`; the FIFO protocol is in
//! `mscclpp_shared::fifo`.
//!
//! Sizes above a trigger's 32-bit size field are split into several DATA triggers (the last
//! carries the FLAG/SYNC bits); an offset beyond 32 bits cannot be expressed and is reported as
//! `InvalidArgument` in the channel's `DeviceStatus` instead of being masked.
//!
//! # A block's writes and the proxy
//!
//! The proxy reads the source memory when it serves a DATA trigger, so the data must be
//! written before the trigger is pushed, not only before the signal. The contract is the one
//! of `crate::memory_channel` ("Signalling a block's writes"): every thread writes the source,
//! the block meets at `sync_threads`, then one thread calls `put` / `put_with_signal` /
//! `signal`. Each trigger is published with one `st.release.sys` of its FIFO slot and the proxy
//! reads the slot with an acquire load (a host thread is inside system scope), so the barrier
//! and that release/acquire pair order every thread's writes before the proxy's read of the
//! trigger; the copy the proxy then starts is enqueued after that read (CUDA: starting the API
//! call that enqueues a task synchronizes with the task's start; CPU backend: the proxy thread
//! copies itself). On the receiving GPU, one thread `wait`s for the peer proxy's signal (acquire)
//! and the block meets at `sync_threads` before any thread reads.

use crate::fifo::FifoDevice;
use crate::semaphore::Host2DeviceSemaphore;
use crate::wait::record_error;
use mscclpp_shared::status::error_detail;
use mscclpp_shared::trigger::{MAX_OFFSET, MAX_SIZE};
use mscclpp_shared::{
    DeviceErrorCode, PortChannelDeviceHandle, ProxyTrigger, TriggerFields, TriggerType, WaitSite,
};

/// Device operations of a PortChannel (`use mscclpp_device::prelude::*`).
pub trait PortChannel {
    /// Asks the proxy to copy `bytes` from local `src + src_off` to remote `dst + dst_off`.
    /// The proxy reads the source when it serves the trigger: other threads' writes to it
    /// must precede this call through a `sync_threads` (module docs).
    fn put(&self, dst_off: u64, src_off: u64, bytes: u64) -> Result<u64, DeviceErrorCode>;
    /// Asks the proxy to signal the peer after the work pushed before (the peer sees the data
    /// of every earlier `put` of this channel once it sees the signal).
    fn signal(&self) -> Result<u64, DeviceErrorCode>;
    /// `put` then `signal`, in one trigger where the size allows.
    fn put_with_signal(
        &self,
        dst_off: u64,
        src_off: u64,
        bytes: u64,
    ) -> Result<u64, DeviceErrorCode>;
    /// `put_with_signal`, then waits until the proxy has completed it.
    fn put_with_signal_and_flush(
        &self,
        dst_off: u64,
        src_off: u64,
        bytes: u64,
    ) -> Result<(), DeviceErrorCode>;
    /// Waits until the proxy has completed every trigger this channel pushed before.
    fn flush(&self) -> Result<(), DeviceErrorCode>;
    /// Takes one token signalled by the peer (bounded, abortable).
    fn wait(&self) -> Result<(), DeviceErrorCode>;
    /// Takes one token if it has arrived.
    fn poll(&self) -> bool;
}

#[inline(always)]
fn trigger(
    ch: &PortChannelDeviceHandle,
    kind: TriggerType,
    dst_off: u64,
    src_off: u64,
    size: u64,
) -> ProxyTrigger {
    ProxyTrigger::pack_unchecked(TriggerFields {
        size,
        src_offset: src_off,
        dst_offset: dst_off,
        src_memory_id: ch.src,
        dst_memory_id: ch.dst,
        kind,
        semaphore_id: ch.semaphore_id,
    })
}

/// Pushes DATA triggers for the whole range (at least one, so a zero-byte put with a signal
/// still signals), the last one with `last_kind` added; returns the last position.
#[inline(always)]
fn push_data(
    ch: &PortChannelDeviceHandle,
    dst_off: u64,
    src_off: u64,
    bytes: u64,
    last_kind: TriggerType,
) -> Result<u64, DeviceErrorCode> {
    let mut done = 0u64;
    loop {
        let chunk = if bytes - done > MAX_SIZE {
            MAX_SIZE
        } else {
            bytes - done
        };
        let (d, s) = (dst_off + done, src_off + done);
        if d > MAX_OFFSET || s > MAX_OFFSET {
            record_error(
                ch.fifo.status,
                DeviceErrorCode::InvalidArgument,
                error_detail(WaitSite::Unknown, if d > s { d } else { s }),
            );
            return Err(DeviceErrorCode::InvalidArgument);
        }
        done += chunk;
        let kind = if done == bytes {
            TriggerType::DATA.union(last_kind)
        } else {
            TriggerType::DATA
        };
        let pos = ch.fifo.push(trigger(ch, kind, d, s, chunk))?;
        if done == bytes {
            return Ok(pos);
        }
    }
}

impl PortChannel for PortChannelDeviceHandle {
    #[inline(always)]
    fn put(&self, dst_off: u64, src_off: u64, bytes: u64) -> Result<u64, DeviceErrorCode> {
        push_data(self, dst_off, src_off, bytes, TriggerType::DATA)
    }
    #[inline(always)]
    fn signal(&self) -> Result<u64, DeviceErrorCode> {
        self.fifo.push(trigger(self, TriggerType::FLAG, 0, 0, 0))
    }
    #[inline(always)]
    fn put_with_signal(
        &self,
        dst_off: u64,
        src_off: u64,
        bytes: u64,
    ) -> Result<u64, DeviceErrorCode> {
        push_data(self, dst_off, src_off, bytes, TriggerType::FLAG)
    }
    #[inline(always)]
    fn put_with_signal_and_flush(
        &self,
        dst_off: u64,
        src_off: u64,
        bytes: u64,
    ) -> Result<(), DeviceErrorCode> {
        let pos = push_data(
            self,
            dst_off,
            src_off,
            bytes,
            TriggerType::FLAG.union(TriggerType::SYNC),
        )?;
        self.fifo.wait_flushed(pos)
    }
    #[inline(always)]
    fn flush(&self) -> Result<(), DeviceErrorCode> {
        let pos = self.fifo.push(trigger(self, TriggerType::SYNC, 0, 0, 0))?;
        self.fifo.wait_flushed(pos)
    }
    #[inline(always)]
    fn wait(&self) -> Result<(), DeviceErrorCode> {
        self.semaphore.wait()
    }
    #[inline(always)]
    fn poll(&self) -> bool {
        self.semaphore.poll()
    }
}
