//! `ProxyService`: the host thread that serves one FIFO.
//!
//! The thread polls its FIFO (a bounded spin, then yields, then short sleeps when idle, see
//! [`Backoff`]), hands each trigger to a [`ProxyHandler`], pops it, and for a SYNC trigger
//! completes the flush position once the handler returned (the handler finishes the trigger's
//! connection work before returning). The thread is bound to the CPUs of the GPU's NUMA node.
//!
//! Traced ([`start_traced`](ProxyService::start_traced) with a trace that is on), each
//! trigger is a `trigger` span on the proxy thread, from its pop (position, type bits) to the
//! end of its work, around the handler's own spans (a port channel's copy, signal, flush).
//!
//! Failure model: a handler error (an invalid trigger, a failed copy) is sticky. The proxy
//! records it, sets the abort flag of its `StatusBlock` (releasing every GPU waiter), and
//! stops serving; [`ProxyService::error`] and [`ProxyService::stop`] return it. The FIFO and
//! the handler (with the device words GPU threads push to and poll) live until `stop` or drop
//! joins the thread, never less: a kernel may touch them until the abort reaches it. Stopping
//! the service also sets the abort flag, so no GPU thread waits for a proxy that is gone.

use crate::error::ProxyError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mscclpp_shared::{ProxyTrigger, TriggerType};

use crate::backoff::Backoff;
use crate::error::{Error, Result};
use crate::fifo::Fifo;
use crate::status::StatusBlock;
use crate::sync::lock;
use crate::trace::{Category, Trace};

/// What serves triggers. `handle` is called on the proxy thread, in FIFO order.
pub trait ProxyHandler: Send {
    /// Carries out `trigger` (pushed at FIFO position `pos`). For a trigger with the SYNC bit,
    /// return only once the work of the trigger's connection pushed before it is complete.
    fn handle(&mut self, trigger: ProxyTrigger, pos: u64) -> Result<()>;
}

impl<F: FnMut(ProxyTrigger, u64) -> Result<()> + Send> ProxyHandler for F {
    fn handle(&mut self, trigger: ProxyTrigger, pos: u64) -> Result<()> {
        self(trigger, pos)
    }
}

/// One proxy thread serving one FIFO.
pub struct ProxyService {
    stop: Arc<AtomicBool>,
    error: Arc<Mutex<Option<Error>>>,
    status: Arc<StatusBlock>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ProxyService {
    /// Starts serving `fifo` with `handler`. Waits on `fifo` report through `status`, whose
    /// abort flag the proxy sets on error and on stop; on error it also aborts every status in
    /// `also_abort` (e.g. the communicator's, so that semaphore waiters are released too).
    /// `numa_node` (from `Gpu::numa_node`) binds the thread to that node's CPUs when given.
    pub fn start(
        fifo: Fifo,
        handler: Box<dyn ProxyHandler>,
        status: Arc<StatusBlock>,
        also_abort: Vec<Arc<StatusBlock>>,
        numa_node: Option<u32>,
    ) -> Result<Self> {
        Self::start_traced(fifo, handler, status, also_abort, numa_node, Trace::off())
    }

    /// [`start`](Self::start), recording each trigger into `trace` (module docs).
    pub fn start_traced(
        mut fifo: Fifo,
        mut handler: Box<dyn ProxyHandler>,
        status: Arc<StatusBlock>,
        also_abort: Vec<Arc<StatusBlock>>,
        numa_node: Option<u32>,
        trace: Trace,
    ) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let error = Arc::new(Mutex::new(None));
        let (stop2, error2, status2) = (stop.clone(), error.clone(), status.clone());
        let thread = std::thread::Builder::new()
            .name("mscclpp-proxy".into())
            .spawn(move || {
                if let Some(node) = numa_node
                    && let Err(e) = crate::numa::bind_current_thread(node)
                {
                    tracing::warn!("proxy: could not bind to NUMA node {node}: {e}");
                }
                let mut backoff = Backoff::new();
                while !stop2.load(Ordering::Acquire) {
                    let Some((trigger, pos)) = fifo.poll() else {
                        backoff.snooze();
                        continue;
                    };
                    backoff.reset();
                    let span = trace
                        .span(Category::Proxy, "trigger")
                        .arg("pos", pos)
                        .arg("type", u64::from(trigger.kind().bits()));
                    if let Err(e) = handler.handle(trigger, pos) {
                        drop(span.arg("failed", 1u64));
                        tracing::error!("proxy: trigger at {pos} failed: {e}");
                        *lock(&error2) = Some(e);
                        status2.abort();
                        for s in &also_abort {
                            s.abort();
                        }
                        // Kernels may still push to the FIFO and poll the handler's semaphore
                        // words until the abort reaches them: both stay alive (serving
                        // nothing) until `stop` or drop, which join this thread.
                        while !stop2.load(Ordering::Acquire) {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        return;
                    }
                    fifo.pop();
                    if trigger.kind().contains(TriggerType::SYNC) {
                        fifo.complete_flush(pos);
                    }
                    drop(span);
                }
            })
            .map_err(|source| Error::Proxy(ProxyError::ProxyStart { source }))?;
        Ok(Self {
            stop,
            error,
            status,
            thread: Some(thread),
        })
    }

    /// The sticky error of the proxy thread, if it failed (it is kept: later calls see it too).
    pub fn error(&self) -> Option<String> {
        lock(&self.error).as_ref().map(|e| e.to_string())
    }

    /// Whether the proxy thread has stopped because of an error.
    pub fn failed(&self) -> bool {
        lock(&self.error).is_some()
    }

    /// Stops the thread (setting the abort flag so no GPU waiter is left waiting for it) and
    /// returns its error, if it had one.
    pub fn stop(mut self) -> Result<()> {
        self.shutdown();
        match lock(&self.error).take() {
            Some(e) => Err(Error::Proxy(ProxyError::ProxyFailed {
                source: Box::new(e),
            })),
            None => Ok(()),
        }
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.status.abort();
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            tracing::error!("proxy thread panicked");
        }
    }
}

impl Drop for ProxyService {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{BackendKind, Gpu};
    use mscclpp_device::fifo::FifoDevice;
    use mscclpp_shared::TriggerFields;
    use std::time::Instant;

    /// Fails every trigger; records when it is dropped.
    struct Failing(Arc<AtomicBool>);

    impl ProxyHandler for Failing {
        fn handle(&mut self, _: ProxyTrigger, pos: u64) -> Result<()> {
            Err(Error::Proxy(ProxyError::InvalidTrigger {
                pos,
                fault: crate::error::TriggerFault::NoType,
            }))
        }
    }

    impl Drop for Failing {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }

    /// After a handler error the FIFO and the handler stay alive (a kernel may still push and
    /// poll) until `stop`, which frees them and returns the error.
    #[test]
    fn a_failed_proxy_keeps_its_fifo_and_handler_until_stopped() {
        let g = Gpu::open(BackendKind::Cpu, 0).unwrap();
        let status = Arc::new(StatusBlock::new(&g, 0).unwrap());
        let fifo = Fifo::new(&g, 4).unwrap();
        let h = fifo.device_handle(status.device_ptr());
        let dropped = Arc::new(AtomicBool::new(false));
        let handler = Box::new(Failing(dropped.clone()));
        let svc = ProxyService::start(fifo, handler, status.clone(), vec![], None).unwrap();
        let trigger = ProxyTrigger::new(TriggerFields {
            kind: TriggerType::DATA,
            ..Default::default()
        })
        .unwrap();
        h.push(trigger).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !svc.failed() {
            assert!(Instant::now() < deadline, "the proxy never failed");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(status.is_aborted());
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !dropped.load(Ordering::Acquire),
            "the failed proxy freed its handler while kernels may still use it"
        );
        // The FIFO's memory is still there: a kernel's next push lands in it.
        assert!(h.push(trigger).is_ok());
        match svc.stop() {
            Err(Error::Proxy(ProxyError::ProxyFailed { source })) => {
                assert!(
                    matches!(
                        *source,
                        Error::Proxy(ProxyError::InvalidTrigger { pos: 0, .. })
                    ),
                    "{source}"
                )
            }
            other => panic!("stop returned {other:?}, not the handler's error"),
        }
        assert!(
            dropped.load(Ordering::Acquire),
            "stop did not free the handler"
        );
    }

    /// A closure serves as a handler (called once per trigger, in order, with its position);
    /// its error is the service's sticky `error()`, by message.
    #[test]
    fn a_closure_handler_serves_in_order_and_its_error_is_reported() {
        let g = Gpu::open(BackendKind::Cpu, 0).unwrap();
        let status = Arc::new(StatusBlock::new(&g, 0).unwrap());
        let fifo = Fifo::new(&g, 4).unwrap();
        let h = fifo.device_handle(status.device_ptr());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let handler = move |t: ProxyTrigger, pos: u64| -> Result<()> {
            lock(&log).push((t.fields().size, pos));
            if pos == 2 {
                return Err(Error::Proxy(ProxyError::InvalidTrigger {
                    pos,
                    fault: crate::error::TriggerFault::NoType,
                }));
            }
            Ok(())
        };
        let svc =
            ProxyService::start(fifo, Box::new(handler), status.clone(), vec![], None).unwrap();
        assert_eq!(svc.error(), None, "no error before any trigger");
        for size in [11u64, 22, 33] {
            let t = ProxyTrigger::new(TriggerFields {
                kind: TriggerType::DATA,
                size,
                ..Default::default()
            })
            .unwrap();
            h.push(t).unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while !svc.failed() {
            assert!(Instant::now() < deadline, "the third trigger never failed");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(*lock(&seen), vec![(11, 0), (22, 1), (33, 2)]);
        let reported = svc.error().expect("the sticky error");
        let handler_said = Error::Proxy(ProxyError::InvalidTrigger {
            pos: 2,
            fault: crate::error::TriggerFault::NoType,
        })
        .to_string();
        assert_eq!(reported, handler_said);
        assert!(status.is_aborted());
    }

    /// Dropping a running service (no `stop`) stops its thread: the abort flag is set for the
    /// GPU waiters, and the handler is dropped (the thread was joined).
    #[test]
    fn dropping_a_running_service_stops_it() {
        let g = Gpu::open(BackendKind::Cpu, 0).unwrap();
        let status = Arc::new(StatusBlock::new(&g, 0).unwrap());
        let fifo = Fifo::new(&g, 4).unwrap();
        let dropped = Arc::new(AtomicBool::new(false));
        let handler = Box::new(Failing(dropped.clone()));
        let svc = ProxyService::start(fifo, handler, status.clone(), vec![], None).unwrap();
        assert!(!status.is_aborted());
        drop(svc);
        assert!(status.is_aborted(), "drop sets the abort flag");
        assert!(dropped.load(Ordering::Acquire), "drop joined the thread");
    }
}
