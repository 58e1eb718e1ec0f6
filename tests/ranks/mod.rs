//! Helpers of the tests of sub-communicators, registered buffers, foreign streams and the
//! typed API: ranks as threads (plain, or over a bootstrap that counts its messages) and as
//! processes. This wave's own (the shared `tests/common` is being rewritten).

#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use mscclpp::host::Result;
use mscclpp::host::bootstrap::{
    Bootstrap, BootstrapConfig, Decorator, TcpBootstrap, UniqueId, Watch,
};
use mscclpp::host::communicator::Communicator;
use mscclpp::host::gpu::{BackendKind, Gpu};

/// The backend under test (`MSCCLPP_BACKEND`, else CUDA when a GPU is present).
pub fn backend() -> BackendKind {
    BackendKind::select().expect("backend")
}

/// Runs `body` on `n` ranks as threads; panics naming the first rank that failed.
pub fn threads<T: Send>(n: usize, body: impl Fn(Communicator) -> Result<T> + Sync) -> Vec<T> {
    mscclpp::world::run_local_ranks(backend(), n, body)
        .into_iter()
        .enumerate()
        .map(|(r, x)| x.unwrap_or_else(|e| panic!("rank {r}: {}", mscclpp::ErrorChain(&e))))
        .collect()
}

/// Whether `n` ranks can run on this backend (CUDA: one GPU each); prints NOT RUN if not.
pub fn enough_devices(n: usize, what: &str) -> bool {
    let kind = backend();
    let have = kind.device_count().unwrap_or(0);
    if kind == BackendKind::Cuda && have < n {
        eprintln!("NOT RUN: {what}: {n} ranks need {n} GPUs ({have} here)");
        return false;
    }
    true
}

/// How many messages a rank's program has sent through its bootstrap (every `send` and
/// collective made on the thread that made the [`Counting`] bootstrap: the rank's own thread;
/// the registration service's answers to other ranks' registrations, on its own thread, are
/// not the rank's calls).
#[derive(Clone, Default)]
pub struct Sends(Arc<AtomicU64>);

impl Sends {
    /// Messages sent so far.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// A bootstrap that counts what it sends and otherwise is `inner`.
pub struct Counting {
    inner: Arc<dyn Bootstrap>,
    sends: Sends,
    thread: std::thread::ThreadId,
}

impl Counting {
    /// `inner`, counted in `sends` when sent from the calling thread.
    pub fn new(inner: Arc<dyn Bootstrap>, sends: Sends) -> Self {
        Self {
            inner,
            sends,
            thread: std::thread::current().id(),
        }
    }

    fn count(&self) {
        if std::thread::current().id() == self.thread {
            self.sends.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Decorator for Counting {
    fn inner(&self) -> &dyn Bootstrap {
        self.inner.as_ref()
    }
    fn send(&self, peer: usize, tag: u64, data: &[u8]) -> Result<()> {
        self.count();
        self.inner.send(peer, tag, data)
    }
    fn barrier_watched(&self, watch: Watch<'_>) -> Result<()> {
        self.count();
        self.inner.barrier_watched(watch)
    }
    fn all_gather_watched(&self, data: &[u8], watch: Watch<'_>) -> Result<Vec<Vec<u8>>> {
        self.count();
        self.inner.all_gather_watched(data, watch)
    }
    fn broadcast_watched(&self, root: usize, data: &mut Vec<u8>, watch: Watch<'_>) -> Result<()> {
        self.count();
        self.inner.broadcast_watched(root, data, watch)
    }
}

/// Runs `body` on `n` ranks as threads over loopback bootstraps that count their messages
/// ([`Counting`]); panics naming the first rank that failed (a failing rank aborts the
/// others' communicators first, so none waits for it).
pub fn counted_threads<T: Send>(
    n: usize,
    body: impl Fn(Communicator, Sends) -> Result<T> + Sync,
) -> Vec<T> {
    let (id, listener) = UniqueId::bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
    let listener = std::sync::Mutex::new(Some(listener));
    let statuses = std::sync::Mutex::new(Vec::new());
    let devices = backend().device_count().unwrap_or(1).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let (body, listener, statuses) = (&body, &listener, &statuses);
                s.spawn(move || -> Result<T> {
                    let cfg = BootstrapConfig::new(r, n, id).with_timeout(Duration::from_secs(60));
                    let root = if r == 0 {
                        listener.lock().unwrap_or_else(|e| e.into_inner()).take()
                    } else {
                        None
                    };
                    let bs = match root {
                        Some(l) => TcpBootstrap::init_with_root_listener(cfg, l)?,
                        None => TcpBootstrap::init(cfg)?,
                    };
                    let sends = Sends::default();
                    let counted = Counting::new(Arc::new(bs), sends.clone());
                    let gpu = Gpu::open(backend(), r % devices)?;
                    let comm = Communicator::new(Arc::new(counted), gpu)?;
                    statuses
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(comm.status().clone());
                    let out = body(comm, sends);
                    if out.is_err() {
                        for st in statuses.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                            st.abort();
                        }
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(r, h)| match h.join() {
                Ok(Ok(v)) => v,
                Ok(Err(e)) => panic!("rank {r}: {}", mscclpp::ErrorChain(&e)),
                Err(_) => panic!("rank {r} panicked"),
            })
            .collect()
    })
}

/// Ranks as child processes of the calling test binary.
pub mod child {
    use std::io::{BufRead, BufReader, Read};
    use std::process::{Command, Stdio};
    use std::sync::Arc;
    use std::time::Duration;

    use super::{BootstrapConfig, Communicator, Gpu, TcpBootstrap, UniqueId, backend};

    /// In a child: its communicator (rank 0 prints the unique id); `None` in the parent.
    pub fn communicator() -> Option<Communicator> {
        counted().map(|(c, _)| c)
    }

    const RANK: &str = "MSCCLPP_SPLIT_TEST_RANK";
    const SIZE: &str = "MSCCLPP_SPLIT_TEST_SIZE";
    const ID: &str = "MSCCLPP_SPLIT_TEST_ID";

    /// In a child: its communicator over a bootstrap that counts its sends
    /// ([`super::Counting`]), and the count; `None` in the parent.
    pub fn counted() -> Option<(Communicator, super::Sends)> {
        let rank: usize = std::env::var(RANK).ok()?.parse().ok()?;
        let size: usize = std::env::var(SIZE).ok()?.parse().ok()?;
        let timeout = Duration::from_secs(60);
        let bs = if rank == 0 {
            let (id, l) = UniqueId::bind("127.0.0.1:0".parse().ok()?).expect("bind");
            println!("\nUNIQUE_ID {}", id.to_hex());
            let cfg = BootstrapConfig::new(0, size, id).with_timeout(timeout);
            TcpBootstrap::init_with_root_listener(cfg, l)
        } else {
            let id = UniqueId::from_hex(&std::env::var(ID).ok()?).expect("id");
            TcpBootstrap::init(BootstrapConfig::new(rank, size, id).with_timeout(timeout))
        }
        .expect("bootstrap");
        let devices = backend().device_count().expect("devices").max(1);
        let gpu = Gpu::open(backend(), rank % devices).expect("gpu");
        let sends = super::Sends::default();
        let counted = super::Counting::new(Arc::new(bs), sends.clone());
        let comm = Communicator::new(Arc::new(counted), gpu).expect("communicator");
        Some((comm, sends))
    }

    /// Runs `n` children of `test`; every child must succeed within two minutes (a child
    /// still running then is killed by its pid, and the test fails).
    pub fn run(n: usize, test: &str) {
        let exe = std::env::current_exe().expect("exe");
        let spawn = |r: usize, id: &str| {
            Command::new(&exe)
                .args(["--exact", test, "--nocapture", "--test-threads=1"])
                .env(RANK, r.to_string())
                .env(SIZE, n.to_string())
                .env(ID, id)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn")
        };
        let mut root = spawn(0, "");
        let mut out = BufReader::new(root.stdout.take().expect("stdout"));
        let mut line = String::new();
        let mut id = None;
        while out.read_line(&mut line).unwrap_or(0) > 0 {
            if let Some(at) = line.find("UNIQUE_ID ") {
                id = Some(line[at + 10..].trim().to_string());
                break;
            }
            line.clear();
        }
        let id = id.expect("rank 0 printed no unique id");
        let mut first = Some(Box::new(out) as Box<dyn Read + Send>);
        let mut children = vec![root];
        children.extend((1..n).map(|r| spawn(r, &id)));
        let drains: Vec<_> = children
            .iter_mut()
            .map(|c| {
                // Rank 0's stdout is read on from where the id was found.
                let mut o = first
                    .take()
                    .or_else(|| c.stdout.take().map(|o| Box::new(o) as Box<dyn Read + Send>));
                let mut e = c.stderr.take().map(|e| Box::new(e) as Box<dyn Read + Send>);
                std::thread::spawn(move || {
                    let mut s = String::new();
                    if let Some(o) = o.as_mut() {
                        let _ = o.read_to_string(&mut s);
                    }
                    if let Some(e) = e.as_mut() {
                        let _ = e.read_to_string(&mut s);
                    }
                    s
                })
            })
            .collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        let mut failures = Vec::new();
        for (r, (mut c, d)) in children.into_iter().zip(drains).enumerate() {
            let status = loop {
                match c.try_wait().expect("wait") {
                    Some(st) => break Some(st),
                    None if std::time::Instant::now() >= deadline => {
                        let _ = c.kill();
                        let _ = c.wait();
                        break None;
                    }
                    None => std::thread::sleep(Duration::from_millis(20)),
                }
            };
            let text = d.join().unwrap_or_default();
            match status {
                Some(st) if st.success() => {}
                Some(st) => failures.push(format!("rank {r}: {st}\n{text}")),
                None => failures.push(format!("rank {r}: killed after 120 s\n{text}")),
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}
