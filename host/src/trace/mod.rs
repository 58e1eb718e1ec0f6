//! A rank's trace: a timeline of its host calls, kernel blocks, proxy work and set-up phases,
//! written to one file per rank and merged into a Chrome / Perfetto trace by `mscclpp-trace`.
//!
//! Tracing is off unless `MSCCLPP_TRACE=dir` is set when a communicator is made (or a program
//! hands one a [`TraceConfig`], `Communicator::traced`). Off, a [`Trace`] holds nothing: every
//! recording call is one test of an `Option` and returns, and every kernel gets
//! [`TraceDeviceHandle::OFF`] (a null pointer its hooks test and nothing else, see
//! `mscclpp_device::trace`). On, a [`Trace::set_enabled`] flag (a relaxed atomic load per
//! call) pauses and resumes it.
//!
//! # What is recorded, on one clock
//!
//! Every host timestamp is the trace clock, [`now_ns`]: the machine's `CLOCK_MONOTONIC`, the
//! same in every process of a machine (and the CPU backend's device clock, so its kernels need
//! no alignment).
//!
//! | source | events | where |
//! |---|---|---|
//! | host calls | one span per collective (op, bytes, type, operator, algorithm, stream, call id; a gather, scatter, all-to-all-v or group end: bytes sent and received, peers, root, algorithm `p2p`) | `mscclpp::collectives` |
//! | launches | one instant per traced kernel launch: its launch id and call id | [`Trace::launch`] |
//! | kernel blocks | `start`, `send`, `recv`, `end` of each block of each traced launch, by thread 0, on the device's clock | `mscclpp_device::trace`, rings read back at dump |
//! | proxy | a span per trigger (pop to done) with the copy (bytes), signal and flush in it | [`crate::port_channel`] |
//! | set-up | the bootstrap's phases, the communicator's and the collectives' set-up | `bootstrap`, `Communicator::new`, `Collectives::new` |
//! | clock pairs | (host ns, device ns) pairs from `trace_clock_kernel`, when attached and at every dump | [`Trace::attach_clock`] |
//!
//! **Bounded.** Each recording thread keeps its own ring of at most
//! [`TraceConfig::host_events`] events; each block index has a ring of launch records in
//! device memory (as many as fit [`TraceConfig::device_bytes`]). When full, the oldest events
//! (launches) are dropped and counted; the file's header says how many.
//!
//! # The per-rank file (format `mscclpp-trace`, version [`FORMAT_VERSION`])
//!
//! `dir/rank<R>.jsonl`, written at [`Trace::dump`] (`Communicator::trace_dump`, and when the
//! communicator is dropped): JSON lines, each an object with a `type`:
//!
//! | `type` | fields |
//! |---|---|
//! | `header` (first line) | `format` = `"mscclpp-trace"`, `version`, `rank`, `nranks`, `pid`, `host`, `boot_id` (equal on one machine: its files share `CLOCK_MONOTONIC`), `backend`, `device`, `device_clock` (`"host"`: the CPU backend's device clock is the trace clock; `"globaltimer"`: a GPU's, mapped by the clock pairs), `monotonic_ns` and `realtime_ns` (one reading of both clocks, to line up machines), `host_events_dropped`, `launches` (handed out), `launch_records` (kept per block), `launches_dropped`, `rings` |
//! | `thread` | `tid`, `name`: a recording host thread |
//! | `span` | `tid`, `cat`, `name`, `start_ns`, `end_ns`, `args` (an object) |
//! | `instant` | `tid`, `cat`, `name`, `start_ns`, `args` |
//! | `clock` | `host_ns`, `device_ns`, `error_ns`: a clock pair |
//! | `block` | `launch`, `block`, `kind` (`start`, `send`, `recv`, `end`), `device_ns` |
//! | `end` (last line) | nothing: the file is complete |
//!
//! Readers must check `format` and `version`, and ignore fields they do not know (later
//! versions may add fields; a change of meaning bumps the version).

mod device;
mod event;
mod ring;

use std::borrow::Cow;
use std::cell::RefCell;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use mscclpp_shared::{TraceClockParams, TraceDeviceHandle};

pub use self::device::{BlockEvent, ClockPair};
use self::device::{ClockSync, DeviceRings};
use self::event::json_str;
pub use self::event::{Arg, Category, HostEvent};
use self::ring::Ring;
use crate::bootstrap::SetupPhase;
use crate::error::{Error, Result, TraceError};
use crate::gpu::{BackendKind, Gpu, Kernel};
use crate::sync::lock;

/// The variable that turns tracing on: the directory the per-rank files go to.
pub const TRACE_ENV: &str = "MSCCLPP_TRACE";
/// Events each recording host thread keeps ([`TraceConfig::host_events`]).
pub const HOST_EVENTS_ENV: &str = "MSCCLPP_TRACE_HOST_EVENTS";
/// Device memory for block events ([`TraceConfig::device_bytes`]).
pub const DEVICE_BYTES_ENV: &str = "MSCCLPP_TRACE_DEVICE_BYTES";
/// The `format` of the per-rank files.
pub const FORMAT: &str = "mscclpp-trace";
/// The `version` of the per-rank files this crate writes.
pub const FORMAT_VERSION: u32 = 1;
/// How long a clock sample may take before it is given up.
pub const CLOCK_SYNC_TIMEOUT: Duration = Duration::from_secs(2);

/// The trace clock: the machine's `CLOCK_MONOTONIC` in ns (module docs).
pub fn now_ns() -> u64 {
    mscclpp_device::arch::globaltimer_ns()
}

/// Where a trace goes and how much it keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceConfig {
    /// The directory of the per-rank files (created at dump if missing).
    pub dir: PathBuf,
    /// Events each recording host thread keeps (the oldest are dropped and counted).
    pub host_events: usize,
    /// Device memory for block events, bytes (the launch records per block are what fits,
    /// 16 to 4096 of them).
    pub device_bytes: usize,
}

impl TraceConfig {
    /// Default events per host thread.
    pub const DEFAULT_HOST_EVENTS: usize = 1 << 16;
    /// Default device memory for block events (16 MiB).
    pub const DEFAULT_DEVICE_BYTES: usize = 16 << 20;

    /// A trace into `dir` with the default bounds.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            host_events: Self::DEFAULT_HOST_EVENTS,
            device_bytes: Self::DEFAULT_DEVICE_BYTES,
        }
    }

    /// `MSCCLPP_TRACE=dir` (unset or empty: no trace), with `MSCCLPP_TRACE_HOST_EVENTS` and
    /// `MSCCLPP_TRACE_DEVICE_BYTES` when set. A bound that is not a positive integer is
    /// [`TraceError::Env`](crate::error::TraceError::Env).
    pub fn from_env() -> Result<Option<Self>> {
        let dir = match std::env::var_os(TRACE_ENV) {
            Some(d) if !d.is_empty() => d,
            _ => return Ok(None),
        };
        let mut cfg = Self::new(dir);
        let num = |var: &'static str| -> Result<Option<usize>> {
            match std::env::var(var) {
                Err(_) => Ok(None),
                Ok(v) => match v.trim().parse::<usize>() {
                    Ok(n) if n > 0 => Ok(Some(n)),
                    _ => Err(TraceError::Env { var, value: v }.into()),
                },
            }
        };
        if let Some(n) = num(HOST_EVENTS_ENV)? {
            cfg.host_events = n;
        }
        if let Some(n) = num(DEVICE_BYTES_ENV)? {
            cfg.device_bytes = n;
        }
        Ok(Some(cfg))
    }
}

/// One recording thread's events.
struct ThreadLog {
    tid: u64,
    name: String,
    ring: Mutex<Ring<HostEvent>>,
}

/// A trace that is on.
struct Inner {
    /// Tells this trace's thread logs from other traces' in a thread's cache.
    id: u64,
    rank: usize,
    nranks: usize,
    config: TraceConfig,
    on: AtomicBool,
    threads: Mutex<Vec<Arc<ThreadLog>>>,
    next_tid: AtomicU64,
    calls: AtomicU64,
    launches: AtomicU32,
    gpu: OnceLock<(BackendKind, String)>,
    rings: OnceLock<DeviceRings>,
    clock: Mutex<Option<ClockSync>>,
    pairs: Mutex<Vec<ClockPair>>,
}

thread_local! {
    /// This thread's logs, by trace id (a thread records into few traces).
    static LOGS: RefCell<Vec<(u64, Weak<ThreadLog>)>> = const { RefCell::new(Vec::new()) };
}

/// A rank's trace (module docs): cheap to clone (clones record into the same trace); off by
/// default.
#[derive(Clone, Default)]
pub struct Trace {
    inner: Option<Arc<Inner>>,
}

impl std::fmt::Debug for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            None => write!(f, "Trace(off)"),
            Some(i) => write!(f, "Trace(rank {} -> {})", i.rank, i.config.dir.display()),
        }
    }
}

impl Trace {
    /// A trace that records nothing.
    pub fn off() -> Self {
        Self { inner: None }
    }

    /// A trace of rank `rank` of `nranks`, on.
    pub fn new(rank: usize, nranks: usize, config: TraceConfig) -> Self {
        static IDS: AtomicU64 = AtomicU64::new(1);
        Self {
            inner: Some(Arc::new(Inner {
                id: IDS.fetch_add(1, Ordering::Relaxed),
                rank,
                nranks,
                config,
                on: AtomicBool::new(true),
                threads: Mutex::new(Vec::new()),
                next_tid: AtomicU64::new(1),
                calls: AtomicU64::new(0),
                launches: AtomicU32::new(0),
                gpu: OnceLock::new(),
                rings: OnceLock::new(),
                clock: Mutex::new(None),
                pairs: Mutex::new(Vec::new()),
            })),
        }
    }

    /// `Trace::new` from [`TraceConfig::from_env`], or off.
    pub fn from_env(rank: usize, nranks: usize) -> Result<Self> {
        Ok(match TraceConfig::from_env()? {
            Some(cfg) => Self::new(rank, nranks, cfg),
            None => Self::off(),
        })
    }

    /// The recording state, when on and not paused (one relaxed load).
    fn live(&self) -> Option<&Arc<Inner>> {
        self.inner.as_ref().filter(|i| i.on.load(Ordering::Relaxed))
    }

    /// Whether this trace records.
    pub fn is_on(&self) -> bool {
        self.live().is_some()
    }

    /// Pauses (`false`) or resumes (`true`) recording (a trace made off stays off).
    pub fn set_enabled(&self, on: bool) {
        if let Some(i) = &self.inner {
            i.on.store(on, Ordering::Relaxed);
        }
    }

    /// Its configuration, when it was made on.
    pub fn config(&self) -> Option<&TraceConfig> {
        self.inner.as_ref().map(|i| &i.config)
    }

    /// Records `event` on the calling thread's ring.
    pub fn record(&self, event: HostEvent) {
        if let Some(i) = self.live() {
            let log = i.thread_log();
            lock(&log.ring).push(event);
        }
    }

    /// A span of `name` from now until the guard drops (arguments with [`Span::arg`]).
    pub fn span(&self, cat: Category, name: impl Into<Cow<'static, str>>) -> Span<'_> {
        Span {
            trace: self,
            event: self.live().map(|_| HostEvent {
                cat,
                name: name.into(),
                start_ns: now_ns(),
                end_ns: None,
                args: Vec::new(),
            }),
        }
    }

    /// A new call id (0 when off): what `Trace::launch` ties a launch to.
    pub fn next_call(&self) -> u64 {
        self.live()
            .map_or(0, |i| i.calls.fetch_add(1, Ordering::Relaxed) + 1)
    }

    /// The device handle of a new traced launch for call `call` (recording the launch), or
    /// [`TraceDeviceHandle::OFF`] when off or when no rings are attached
    /// ([`attach_device`](Self::attach_device)).
    pub fn launch(&self, call: u64) -> TraceDeviceHandle {
        let Some(i) = self.live() else {
            return TraceDeviceHandle::OFF;
        };
        let Some(rings) = i.rings.get() else {
            return TraceDeviceHandle::OFF;
        };
        let mut launch = i.launches.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        if launch == 0 {
            // Wrapped: 0 marks a slot never written.
            launch = i.launches.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        }
        self.record(HostEvent {
            cat: Category::Launch,
            name: Cow::Borrowed("launch"),
            start_ns: now_ns(),
            end_ns: None,
            args: vec![("launch", launch.into()), ("call", call.into())],
        });
        rings.handle(launch)
    }

    /// Notes the backend and device the trace's rank runs on (for the file's header).
    pub fn note_gpu(&self, gpu: &Gpu) {
        if let Some(i) = &self.inner {
            let _ = i.gpu.set((gpu.kind(), gpu.name()));
        }
    }

    /// Gives the trace block-event rings on `gpu` for blocks `0..rings` (once: later calls
    /// keep the first rings; blocks beyond them record nothing). Does nothing when off.
    pub fn attach_device(&self, gpu: &Gpu, rings: u32) -> Result<()> {
        let Some(i) = &self.inner else {
            return Ok(());
        };
        self.note_gpu(gpu);
        if let Some(have) = i.rings.get() {
            if have.rings() < rings {
                tracing::warn!(
                    "trace: rank {}: rings for {} blocks already attached; blocks {}..{rings} record nothing",
                    i.rank,
                    have.rings(),
                    have.rings()
                );
            }
            return Ok(());
        }
        let r = DeviceRings::new(gpu, rings, i.config.device_bytes)?;
        let _ = i.rings.set(r);
        Ok(())
    }

    /// Gives the trace the clock-sync kernel (`trace_clock_kernel` of the built-in PTX) and
    /// takes a first clock pair (later ones at every dump). Does nothing when off, or when a
    /// kernel is attached already.
    pub fn attach_clock(&self, gpu: &Gpu, kernel: Kernel<TraceClockParams>) -> Result<()> {
        let Some(i) = &self.inner else {
            return Ok(());
        };
        self.note_gpu(gpu);
        let mut clock = lock(&i.clock);
        if clock.is_some() {
            return Ok(());
        }
        let sync = ClockSync::new(gpu, kernel, i.rank)?;
        let pair = sync.sample(CLOCK_SYNC_TIMEOUT)?;
        lock(&i.pairs).push(pair);
        *clock = Some(sync);
        Ok(())
    }

    /// Records the bootstrap's set-up phases (on the calling thread).
    pub fn record_setup(&self, phases: &[SetupPhase]) {
        for p in phases {
            self.record(HostEvent {
                cat: Category::Setup,
                name: Cow::Borrowed(p.name),
                start_ns: p.start_ns,
                end_ns: Some(p.end_ns),
                args: Vec::new(),
            });
        }
    }

    /// Writes this rank's file into the configured directory (module docs); `None` when off.
    /// Takes a clock pair first when a clock kernel is attached (a failed one is logged and
    /// left out). Kernels still running may be missing events or show partial ones.
    pub fn dump(&self) -> Result<Option<PathBuf>> {
        let Some(i) = &self.inner else {
            return Ok(None);
        };
        let path = i.config.dir.join(format!("rank{}.jsonl", i.rank));
        self.write_to(&path)?;
        Ok(Some(path))
    }

    /// Writes this rank's file to `path` (replacing it). Nothing when off.
    pub fn write_to(&self, path: &Path) -> Result<()> {
        let Some(i) = &self.inner else {
            return Ok(());
        };
        if let Some(sync) = lock(&i.clock).as_ref() {
            match sync.sample(CLOCK_SYNC_TIMEOUT) {
                Ok(pair) => lock(&i.pairs).push(pair),
                Err(e) => tracing::warn!("trace: rank {}: {e}", i.rank),
            }
        }
        let text = i.render()?;
        let fail = |source| -> Error {
            TraceError::Write {
                path: path.to_path_buf(),
                source,
            }
            .into()
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(fail)?;
        }
        let tmp = path.with_extension("jsonl.partial");
        let mut f = std::fs::File::create(&tmp).map_err(fail)?;
        f.write_all(text.as_bytes()).map_err(fail)?;
        f.sync_all().map_err(fail)?;
        drop(f);
        std::fs::rename(&tmp, path).map_err(fail)
    }
}

impl Inner {
    /// The calling thread's log in this trace (made on first use).
    fn thread_log(&self) -> Arc<ThreadLog> {
        LOGS.with(|logs| {
            let mut logs = logs.borrow_mut();
            if let Some(log) = logs
                .iter()
                .find(|(id, _)| *id == self.id)
                .and_then(|(_, w)| w.upgrade())
            {
                return log;
            }
            logs.retain(|(_, w)| w.strong_count() > 0);
            let tid = self.next_tid.fetch_add(1, Ordering::Relaxed);
            let name = std::thread::current()
                .name()
                .map_or_else(|| format!("host thread {tid}"), str::to_string);
            let log = Arc::new(ThreadLog {
                tid,
                name,
                ring: Mutex::new(Ring::new(self.config.host_events)),
            });
            lock(&self.threads).push(log.clone());
            logs.push((self.id, Arc::downgrade(&log)));
            log
        })
    }

    /// The whole file.
    fn render(&self) -> Result<String> {
        let launches = self.launches.load(Ordering::Relaxed);
        let (records, rings) = self
            .rings
            .get()
            .map_or((0, 0), |r| (r.records(), r.rings()));
        let first = launches.saturating_sub(records) + 1;
        let blocks = match self.rings.get() {
            Some(r) if launches > 0 => r.read(first, launches)?,
            _ => Vec::new(),
        };
        let threads: Vec<Arc<ThreadLog>> = lock(&self.threads).clone();
        let mut dropped = 0;
        let mut body = String::new();
        for t in &threads {
            let ring = lock(&t.ring);
            dropped += ring.dropped();
            let mut line = format!("{{\"type\":\"thread\",\"tid\":{},\"name\":", t.tid);
            json_str(&mut line, &t.name);
            line.push('}');
            body.push_str(&line);
            body.push('\n');
            for e in ring.iter() {
                body.push_str(&e.to_json_line(t.tid));
                body.push('\n');
            }
        }
        for p in lock(&self.pairs).iter() {
            let _ = writeln!(
                body,
                "{{\"type\":\"clock\",\"host_ns\":{},\"device_ns\":{},\"error_ns\":{}}}",
                p.host_ns, p.device_ns, p.error_ns
            );
        }
        for b in &blocks {
            let _ = writeln!(
                body,
                "{{\"type\":\"block\",\"launch\":{},\"block\":{},\"kind\":\"{}\",\"device_ns\":{}}}",
                b.launch,
                b.block,
                b.kind.name(),
                b.device_ns
            );
        }
        let (backend, device) = self.gpu.get().map_or(("none", String::new()), |(k, name)| {
            (
                match k {
                    BackendKind::Cuda => "cuda",
                    BackendKind::Cpu => "cpu",
                },
                name.clone(),
            )
        });
        let device_clock = if backend == "cuda" {
            "globaltimer"
        } else {
            "host"
        };
        let realtime_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let monotonic_ns = now_ns();
        let mut out = String::with_capacity(body.len() + 512);
        let _ = write!(
            out,
            "{{\"type\":\"header\",\"format\":\"{FORMAT}\",\"version\":{FORMAT_VERSION},\"rank\":{},\"nranks\":{},\"pid\":{},\"host\":",
            self.rank,
            self.nranks,
            std::process::id()
        );
        json_str(&mut out, &host_name());
        out.push_str(",\"boot_id\":");
        json_str(&mut out, &boot_id());
        let _ = write!(out, ",\"backend\":\"{backend}\",\"device\":");
        json_str(&mut out, &device);
        let _ = writeln!(
            out,
            ",\"device_clock\":\"{device_clock}\",\"monotonic_ns\":{monotonic_ns},\"realtime_ns\":{realtime_ns},\"host_events_dropped\":{dropped},\"launches\":{launches},\"launch_records\":{records},\"launches_dropped\":{},\"rings\":{rings}}}",
            launches.saturating_sub(records)
        );
        out.push_str(&body);
        out.push_str("{\"type\":\"end\"}\n");
        Ok(out)
    }
}

/// The machine's host name (empty if it cannot be read).
fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `gethostname` writes at most `buf.len()` bytes into the buffer we own.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if rc != 0 {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`; empty if unreadable): files with the
/// same one share `CLOCK_MONOTONIC`.
fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// A span being recorded ([`Trace::span`]); recorded when dropped.
#[must_use = "the span ends when this guard is dropped"]
pub struct Span<'a> {
    trace: &'a Trace,
    event: Option<HostEvent>,
}

impl Span<'_> {
    /// Adds an argument (nothing when the trace is off).
    pub fn arg(mut self, key: &'static str, value: impl Into<Arg>) -> Self {
        self.set(key, value);
        self
    }

    /// Adds an argument to a span under way.
    pub fn set(&mut self, key: &'static str, value: impl Into<Arg>) {
        if let Some(e) = &mut self.event {
            e.args.push((key, value.into()));
        }
    }

    /// Whether this span records (the trace is on).
    pub fn is_on(&self) -> bool {
        self.event.is_some()
    }
}

impl Drop for Span<'_> {
    fn drop(&mut self) {
        if let Some(mut e) = self.event.take() {
            e.end_ns = Some(now_ns());
            self.trace.record(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_off_trace_records_nothing_and_hands_out_off_handles() {
        let t = Trace::off();
        assert!(!t.is_on());
        assert_eq!(t.next_call(), 0);
        assert_eq!(t.launch(1), TraceDeviceHandle::OFF);
        let s = t.span(Category::User, "x").arg("a", 1u64);
        assert!(!s.is_on());
        assert!(t.dump().unwrap().is_none());
    }

    #[test]
    fn threads_record_into_their_own_bounded_rings() {
        let dir = std::env::temp_dir().join(format!("mscclpp-trace-unit-{}", std::process::id()));
        let mut cfg = TraceConfig::new(&dir);
        cfg.host_events = 4;
        let t = Trace::new(3, 4, cfg);
        for k in 0..6u64 {
            let _s = t.span(Category::User, "main").arg("k", k);
        }
        std::thread::Builder::new()
            .name("other".into())
            .spawn({
                let t = t.clone();
                move || drop(t.span(Category::Proxy, "work"))
            })
            .unwrap()
            .join()
            .unwrap();
        t.set_enabled(false);
        drop(t.span(Category::User, "paused"));
        t.set_enabled(true);
        let path = t.dump().unwrap().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with(
            r#"{"type":"header","format":"mscclpp-trace","version":1,"rank":3,"nranks":4,"#
        ));
        assert!(
            lines[0].contains(r#""host_events_dropped":2,"#),
            "{}",
            lines[0]
        );
        assert_eq!(lines.last(), Some(&r#"{"type":"end"}"#));
        let main: Vec<&&str> = lines
            .iter()
            .filter(|l| l.contains(r#""name":"main""#))
            .collect();
        assert_eq!(main.len(), 4, "{main:?}");
        assert!(
            main[0].contains(r#""args":{"k":2}"#),
            "the oldest two were dropped"
        );
        assert!(
            text.contains(r#"{"type":"thread","tid":2,"name":"other"}"#),
            "{text}"
        );
        assert!(text.contains(r#""tid":2,"cat":"proxy","name":"work""#));
        assert!(!text.contains("paused"));
    }
}
