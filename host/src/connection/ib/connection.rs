//! [`IbConnection`]: the data path of the `Ib` transport (see the [module docs](super)).

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::setup::{Prepared, QpState, check_compatible, transition};
use super::sys::{self, IbvSendWr, IbvSge, IbvWc};
use super::verbs::{MAX_SEND_WR, Verbs, verb_error};
use super::wire::{MrEntry, QpInfo};
use crate::connection::Connection;
use crate::connection::network::{check_remote, check_word};
use crate::error::{Error, Link, MemoryMisuse, Result, TransportErrorKind};
use crate::registered_memory::RegisteredMemory;
use crate::transport::Transport;

/// Largest RDMA write of one work request (the verbs length is 32 bits; stay well inside).
const MAX_WR_BYTES: u64 = 1 << 30;

struct State {
    verbs: Verbs,
    posted: u64,
    completed: u64,
    next_wr_id: u64,
    /// Sticky: the first failed completion (wr_id, status).
    failed: Option<(u64, u32)>,
}

/// An RC queue pair to one remote rank (see the module docs; not yet run on hardware).
pub struct IbConnection {
    remote_rank: usize,
    index: u8,
    remote_mrs: HashMap<u32, MrEntry>,
    timeout: Duration,
    state: Mutex<State>,
}

impl std::fmt::Debug for IbConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "IbConnection(Ib{} to rank {})",
            self.index, self.remote_rank
        )
    }
}

impl IbConnection {
    /// Moves the prepared QP to RTR/RTS towards the peer described by `peer_extra`.
    pub(crate) fn establish(
        prep: Prepared,
        peer_extra: &[u8],
        remote_rank: usize,
        timeout: Duration,
    ) -> Result<Self> {
        let refuse =
            |reason: String| Link::to(Transport::Ib(prep.index), remote_rank).setup(reason);
        let remote = QpInfo::decode(peer_extra)
            .map_err(|r| refuse(format!("malformed queue pair info: {r}")))?;
        check_compatible(&prep.info, &remote).map_err(refuse)?;
        let mut state = QpState::Init;
        while let Some((next, attr, mask)) = transition(state, &prep.info, &remote, prep.gid_index)
        {
            let verb = match next {
                QpState::Rtr => "ibv_modify_qp(RTR)",
                _ => "ibv_modify_qp(RTS)",
            };
            prep.verbs.ctx.modify_qp(&prep.verbs.qp, verb, attr, mask)?;
            state = next;
        }
        Ok(Self {
            remote_rank,
            index: prep.index,
            remote_mrs: remote.mrs.iter().map(|m| (m.id, *m)).collect(),
            timeout,
            state: Mutex::new(State {
                verbs: prep.verbs,
                posted: 0,
                completed: 0,
                next_wr_id: 0,
                failed: None,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        crate::sync::lock(&self.state)
    }

    /// The connection, as its errors name it.
    fn link(&self) -> Link {
        Link::to(Transport::Ib(self.index), self.remote_rank)
    }

    fn failed(&self, (wr_id, status): (u64, u32)) -> Error {
        let name = sys::wc_status_name(status);
        let detail = format!("work request {wr_id} completed with status {status} ({name})");
        self.link()
            .error(TransportErrorKind::Completion, "completion", detail)
    }

    /// The peer's region of `dst` for `[off, off + len)`, already checked on the sending side
    /// (`check_remote`, `check_word`): known to this connection, the range inside it.
    fn remote_region(
        &self,
        op: &'static str,
        dst: &RegisteredMemory,
        off: u64,
        len: u64,
    ) -> Result<MrEntry> {
        let id = dst.local_id();
        let m = *self.remote_mrs.get(&id).ok_or_else(|| {
            let misuse = MemoryMisuse::AfterConnect {
                side: "destination",
                id,
                transport: Transport::Ib(self.index),
            };
            self.link().memory(op, misuse)
        })?;
        match off.checked_add(len) {
            Some(end) if end <= m.size => Ok(m),
            _ => Err(Error::OutOfRange {
                offset: usize::try_from(off).unwrap_or(usize::MAX),
                len: usize::try_from(len).unwrap_or(usize::MAX),
                size: usize::try_from(m.size).unwrap_or(usize::MAX),
            }),
        }
    }

    /// Polls the CQ once; records completions and the first failure.
    fn poll(&self, st: &mut State) -> Result<()> {
        let mut wcs = [IbvWc::default(); 16];
        let cq = st.verbs.cq.cq;
        // SAFETY: `cq` is a live CQ whose context's ops table has `poll_cq` (this is what the
        // inline `ibv_poll_cq` of verbs.h does); `wcs` has room for 16 completions.
        let n = unsafe {
            let ctx = (*cq).context;
            match (*ctx).ops.poll_cq {
                Some(f) => f(cq, wcs.len() as c_int, wcs.as_mut_ptr()),
                None => -1,
            }
        };
        if n < 0 {
            let source = std::io::Error::other(format!("returned {n}"));
            let device = st.verbs.ctx.name();
            return Err(verb_error(self.index, "ibv_poll_cq", device, source));
        }
        for wc in &wcs[..n as usize] {
            st.completed += 1;
            if wc.status != 0 && st.failed.is_none() {
                st.failed = Some((wc.wr_id, wc.status));
            }
        }
        Ok(())
    }

    /// Posts one signaled work request (waiting for room in the send queue first).
    fn post(&self, st: &mut State, mut wr: IbvSendWr, mut sge: IbvSge) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        while st.posted - st.completed >= u64::from(MAX_SEND_WR) {
            self.poll(st)?;
            if let Some(f) = st.failed {
                return Err(self.failed(f));
            }
            if Instant::now() >= deadline {
                return Err(Error::FlushTimeout {
                    remote_rank: self.remote_rank,
                    transport: Transport::Ib(self.index),
                    after: self.timeout,
                });
            }
            std::thread::yield_now();
        }
        wr.wr_id = st.next_wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.send_flags = sys::IBV_SEND_SIGNALED;
        let qp = st.verbs.qp.qp;
        let mut bad: *mut IbvSendWr = std::ptr::null_mut();
        // SAFETY: `qp` is a live RTS queue pair; `wr` and `sge` live across the call (the
        // provider copies them into the send queue before returning); the local address is in a
        // registered region; calling through `context->ops.post_send` is what the inline
        // `ibv_post_send` of verbs.h does.
        let rc = unsafe {
            let ctx = (*qp).context;
            match (*ctx).ops.post_send {
                Some(f) => f(qp, &mut wr, &mut bad),
                None => -1,
            }
        };
        if rc != 0 {
            let source = std::io::Error::from_raw_os_error(rc.abs());
            let device = st.verbs.ctx.name();
            return Err(verb_error(self.index, "ibv_post_send", device, source));
        }
        st.next_wr_id += 1;
        st.posted += 1;
        Ok(())
    }
}

impl Connection for IbConnection {
    fn transport(&self) -> Transport {
        Transport::Ib(self.index)
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
        check_remote(self.link(), "write", dst, dst_off, size)?;
        let remote = self.remote_region("write", dst, dst_off, size)?;
        let s = src.range(src_off, size)?;
        if size == 0 {
            return Ok(());
        }
        let mut st = self.lock();
        if let Some(f) = st.failed {
            return Err(self.failed(f));
        }
        let lkey = st
            .verbs
            .mrs
            .get(&src.local_id())
            .filter(|_| src.transports().has(Transport::Ib(self.index)))
            .map(|(mr, _, _)| mr.lkey())
            .ok_or_else(|| {
                let misuse = MemoryMisuse::AfterConnect {
                    side: "source",
                    id: src.local_id(),
                    transport: Transport::Ib(self.index),
                };
                self.link().memory("write", misuse)
            })?;
        let mut done = 0;
        while done < size {
            let n = (size - done).min(MAX_WR_BYTES);
            let mut wr = IbvSendWr::zeroed();
            wr.opcode = sys::IBV_WR_RDMA_WRITE;
            wr.wr.rdma = sys::IbvWrRdma {
                remote_addr: remote.addr + dst_off + done,
                rkey: remote.rkey,
            };
            let sge = IbvSge {
                addr: s.addr() + done,
                length: n as u32, // ≤ 1 GiB
                lkey,
            };
            self.post(&mut st, wr, sge)?;
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
        check_word(self.link(), dst, dst_off)?;
        let remote = self.remote_region("update_and_sync", dst, dst_off, 8)?;
        let mut st = self.lock();
        if let Some(f) = st.failed {
            return Err(self.failed(f));
        }
        let old = src.swap(new_value, Ordering::AcqRel);
        let mut wr = IbvSendWr::zeroed();
        wr.opcode = sys::IBV_WR_ATOMIC_FETCH_AND_ADD;
        wr.wr.atomic = sys::IbvWrAtomic {
            remote_addr: remote.addr + dst_off,
            compare_add: new_value.wrapping_sub(old),
            swap: 0,
            rkey: remote.rkey,
        };
        let sge = IbvSge {
            addr: st.verbs.atomic_buf.as_ptr() as u64,
            length: 8,
            lkey: st.verbs.atomic_mr.lkey(),
        };
        self.post(&mut st, wr, sge)
    }

    fn flush(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        loop {
            if let Some(f) = st.failed {
                return Err(self.failed(f));
            }
            if st.completed >= st.posted {
                return Ok(());
            }
            self.poll(&mut st)?;
            if st.completed < st.posted && Instant::now() >= deadline {
                return Err(Error::FlushTimeout {
                    remote_rank: self.remote_rank,
                    transport: Transport::Ib(self.index),
                    after: timeout,
                });
            }
            std::hint::spin_loop();
        }
    }
}
