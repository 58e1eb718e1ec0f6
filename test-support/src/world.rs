//! Ranks as child processes: the test binary re-run once per rank ([`crate::process`]),
//! each child running the same test, which asks [`child_place`] (or [`child_communicator`])
//! first: in a child it is the rank's code, in the parent `None` and the test starts the world
//! ([`Processes`], [`ranks_as_processes`]).
//!
//! The world's id travels as text: rank 0 starts first, makes the id (a bootstrap's
//! `UniqueId`, or anything else, e.g. an NCCL unique id) and [`announce`]s it on a line of its
//! standard output; the parent reads it (bounded) and starts the other ranks with it in their
//! environment. Every child is waited for until the world's bound, and killed by its pid then.

use std::ffi::OsString;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mscclpp_host::bootstrap::{Bootstrap, BootstrapConfig, TcpBootstrap, UniqueId};
use mscclpp_host::communicator::Communicator;

use crate::backend::gpu;
use crate::counting::{Counting, Sends};
use crate::process::{Child, ChildEnd, TestProcess, die_with_parent};
use crate::threads::SETUP_TIMEOUT;

const RANK: &str = "MSCCLPP_TEST_CHILD_RANK";
const SIZE: &str = "MSCCLPP_TEST_CHILD_SIZE";
const ID: &str = "MSCCLPP_TEST_CHILD_ID";
/// What starts rank 0's line that carries the world's id.
const ANNOUNCEMENT: &str = "WORLD_ID ";

/// How long a world of processes may run by default before it is killed (far more than any
/// test needs; a hang fails the test instead of stalling it).
pub const DEFAULT_BOUND: Duration = Duration::from_secs(600);

/// A child's place in its world.
#[derive(Clone, Debug)]
pub struct Place {
    /// This rank.
    pub rank: usize,
    /// Ranks in the world.
    pub size: usize,
    /// The world's id, as rank 0 announced it (`None` on rank 0, which makes it).
    pub id: Option<String>,
}

/// In a child started by [`Processes`]: its place (and `None` in the parent). The child is
/// made to die with its parent ([`die_with_parent`]).
pub fn child_place() -> Option<Place> {
    let get = |k: &str| std::env::var(k).ok()?.parse::<usize>().ok();
    let (rank, size) = (get(RANK)?, get(SIZE)?);
    die_with_parent();
    let id = std::env::var(ID).ok().filter(|_| rank != 0);
    Some(Place { rank, size, id })
}

/// On rank 0 of a world: tells the parent the world's id (one line of standard output).
pub fn announce(id: &str) {
    // A line of its own: the test harness may have started one.
    println!("\n{ANNOUNCEMENT}{id}");
    let _ = std::io::stdout().flush();
}

/// In a child: its bootstrap, its configuration edited by `edit` first (e.g. a host
/// identity); `None` in the parent. Rank 0 serves the root on loopback and announces its id.
pub fn child_bootstrap_with(
    edit: impl FnOnce(BootstrapConfig) -> BootstrapConfig,
) -> Option<TcpBootstrap> {
    let place = child_place()?;
    let bs = match &place.id {
        None => {
            let (id, listener) = UniqueId::bind(([127, 0, 0, 1], 0).into())
                .unwrap_or_else(|e| panic!("rank 0: binding the root on loopback: {e}"));
            announce(&id.to_hex());
            let cfg = edit(BootstrapConfig::new(0, place.size, id).with_timeout(SETUP_TIMEOUT));
            TcpBootstrap::init_with_root_listener(cfg, listener)
        }
        Some(hex) => {
            let id = UniqueId::from_hex(hex)
                .unwrap_or_else(|e| panic!("rank {}: the world's id {hex:?}: {e}", place.rank));
            let cfg = BootstrapConfig::new(place.rank, place.size, id).with_timeout(SETUP_TIMEOUT);
            TcpBootstrap::init(edit(cfg))
        }
    };
    Some(bs.unwrap_or_else(|e| panic!("rank {}: bootstrap: {e}", place.rank)))
}

/// In a child: its bootstrap; `None` in the parent.
pub fn child_bootstrap() -> Option<TcpBootstrap> {
    child_bootstrap_with(|cfg| cfg)
}

fn communicator(rank: usize, bs: Arc<dyn Bootstrap>) -> Communicator {
    Communicator::new(bs, gpu(rank)).unwrap_or_else(|e| panic!("rank {rank}: communicator: {e}"))
}

/// In a child: its communicator on device `rank % devices`; `None` in the parent.
pub fn child_communicator() -> Option<Communicator> {
    let bs = child_bootstrap()?;
    let rank = bs.rank();
    Some(communicator(rank, Arc::new(bs)))
}

/// In a child: its communicator over a bootstrap that counts its sends ([`Counting`]), and
/// the count; `None` in the parent.
pub fn child_counted_communicator() -> Option<(Communicator, Sends)> {
    let bs = child_bootstrap()?;
    let rank = bs.rank();
    let sends = Sends::default();
    let counted = Counting::new(Arc::new(bs), sends.clone());
    Some((communicator(rank, Arc::new(counted)), sends))
}

/// Sees each line of a rank's standard output as it comes: `(rank, line)`.
pub type Watch<'a> = &'a (dyn Fn(usize, &str) + Sync);

/// Environment of one rank: `rank -> [(key, value)]`.
pub type PerRank<'a> = &'a (dyn Fn(usize) -> Vec<(String, String)> + Sync);

/// A world of `n` ranks as child processes running test `test` (module docs).
pub struct Processes<'a> {
    test: String,
    n: usize,
    bound: Duration,
    env: Vec<(OsString, OsString)>,
    remove: Vec<OsString>,
    per_rank: Option<PerRank<'a>>,
    watch: Option<Watch<'a>>,
}

impl<'a> Processes<'a> {
    /// `n` ranks of `test`, bounded by [`DEFAULT_BOUND`].
    pub fn new(test: &str, n: usize) -> Self {
        Self {
            test: test.to_string(),
            n,
            bound: DEFAULT_BOUND,
            env: Vec::new(),
            remove: Vec::new(),
            per_rank: None,
            watch: None,
        }
    }

    /// How long the world may run, from the first spawn, before every child still running is
    /// killed.
    pub fn bound(mut self, bound: Duration) -> Self {
        self.bound = bound;
        self
    }

    /// Sets `key` to `value` for every rank.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Removes `key` from every rank's environment.
    pub fn env_remove(mut self, key: impl Into<OsString>) -> Self {
        self.remove.push(key.into());
        self
    }

    /// Sets what `per_rank(r)` gives for rank `r` (after [`Processes::env`]).
    pub fn per_rank(mut self, per_rank: PerRank<'a>) -> Self {
        self.per_rank = Some(per_rank);
        self
    }

    /// Shows every line of every rank's standard output to `watch` as it comes (the lines stay
    /// in the ends' output too).
    pub fn watch(mut self, watch: Watch<'a>) -> Self {
        self.watch = Some(watch);
        self
    }

    fn spawn_rank(&self, rank: usize, id: &str) -> Child {
        let mut p = TestProcess::new(&self.test)
            .named(format!("rank {rank} of {}", self.test))
            .env(RANK, rank.to_string())
            .env(SIZE, self.n.to_string())
            .env(ID, id);
        for k in &self.remove {
            p = p.env_remove(k);
        }
        p = p.envs(self.env.iter().map(|(k, v)| (k, v)));
        if let Some(f) = self.per_rank {
            p = p.envs(f(rank));
        }
        p.spawn()
    }

    /// Starts rank 0, waits (until `deadline`) for its announcement, showing its lines to
    /// `watch0`, then starts the others with the id. Only rank 0 when it announced nothing.
    fn start(&self, deadline: Instant, mut watch0: impl FnMut(&str)) -> Vec<Child> {
        let root = self.spawn_rank(0, "");
        let mut id = None;
        while let Some(line) = root.next_line(deadline) {
            watch0(&line);
            if let Some(at) = line.find(ANNOUNCEMENT) {
                id = Some(line[at + ANNOUNCEMENT.len()..].trim().to_string());
                break;
            }
        }
        let mut children = vec![root];
        if let Some(id) = id {
            children.extend((1..self.n).map(|r| self.spawn_rank(r, &id)));
        }
        children
    }

    /// Starts the world and returns its running ranks (for a test that talks to them, kills
    /// one, waits for each with a limit of its own); panics when rank 0 announced no id within
    /// the bound.
    pub fn spawn(&self) -> Vec<Child> {
        let children = self.start(Instant::now() + self.bound, |_| {});
        assert_eq!(
            children.len(),
            self.n,
            "rank 0 of {} announced no world id within {:?}",
            self.test,
            self.bound
        );
        children
    }

    /// Runs the world: every rank waited for until the bound (then killed and reported as
    /// overrun). Returns the ends in rank order: only rank 0's when it announced no id.
    pub fn run(self) -> Vec<ChildEnd> {
        let deadline = Instant::now() + self.bound;
        let watch = self.watch;
        let show = |r: usize, line: &str| {
            if let Some(w) = watch {
                w(r, line)
            }
        };
        let children = self.start(deadline, |line| show(0, line));
        std::thread::scope(|s| {
            let waits: Vec<_> = children
                .into_iter()
                .enumerate()
                .map(|(r, c)| {
                    let show = &show;
                    s.spawn(move || {
                        if watch.is_some() {
                            while let Some(line) = c.next_line(deadline) {
                                show(r, &line);
                            }
                        }
                        c.wait_until(deadline)
                    })
                })
                .collect();
            waits
                .into_iter()
                .map(|h| match h.join() {
                    Ok(end) => end,
                    Err(_) => panic!("a watcher of the world of {} panicked", self.test),
                })
                .collect()
        })
    }

    /// Runs the world; panics unless every rank ended successfully within the bound, quoting
    /// each failing rank's output.
    pub fn run_ok(self) -> Vec<ChildEnd> {
        let (test, n, bound) = (self.test.clone(), self.n, self.bound);
        let ends = self.run();
        assert_eq!(
            ends.len(),
            n,
            "rank 0 of {test} announced no world id within {bound:?}:\n{}",
            ends[0].text()
        );
        let failures: Vec<String> = ends
            .iter()
            .filter(|e| !e.success())
            .map(ChildEnd::text)
            .collect();
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        ends
    }
}

/// Runs `n` ranks of `test` as child processes; panics unless every one succeeds
/// ([`Processes::run_ok`] with the default bound).
pub fn ranks_as_processes(n: usize, test: &str) {
    Processes::new(test, n).run_ok();
}
