//! The test binary re-run as a child process that runs one test (`--exact <test>`, ignored
//! tests included, one test thread, output not captured), for what needs a process of its own:
//! a rank of a world of processes ([`crate::world`]), a scenario that needs the library's
//! process-wide state to itself ([`isolated`]), a process to kill.
//!
//! Nothing here waits without a bound: a child's output is read by one thread per stream
//! (so neither side blocks on a full pipe), a line is awaited for at most a given time, and a
//! child still running at its bound is killed by its pid and reaped, and reported as overrun.
//! A child inherits the parent's environment, `MSCCLPP_RANKS_PER_GPU` included (set again
//! explicitly, so that no caller's `env_remove` can drop the mode); the child calls
//! [`die_with_parent`] where it must not outlive the test.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::backend::RANKS_PER_GPU;

/// The environment variable that names the test an [`isolated`] child runs.
const ISOLATED: &str = "MSCCLPP_TEST_ISOLATED";

/// How long the output of a child that ended may stay open before it is reported as such.
const READER_GRACE: Duration = Duration::from_secs(10);

/// The longest output a failure message quotes (its start and its end).
const QUOTE_LIMIT: usize = 60_000;

/// A child process of this test binary, to be configured, then [`TestProcess::spawn`]ed.
pub struct TestProcess {
    cmd: Command,
    name: String,
}

impl TestProcess {
    /// This test binary running test `test` alone: stdin closed, stdout and stderr read.
    pub fn new(test: &str) -> Self {
        let exe = std::env::current_exe()
            .unwrap_or_else(|e| panic!("the test binary's path (to re-run {test}): {e}"));
        let mut cmd = Command::new(exe);
        cmd.args([
            "--exact",
            test,
            "--nocapture",
            "--test-threads=1",
            "--include-ignored",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        Self {
            cmd,
            name: test.to_string(),
        }
    }

    /// This test binary running test `test` as an [`isolated`] child: in it,
    /// [`in_isolated`]`(test)` holds.
    pub fn isolated(test: &str) -> Self {
        Self::new(test).env(ISOLATED, test)
    }

    /// Sets `key` to `value` in the child's environment.
    pub fn env(
        mut self,
        key: impl AsRef<std::ffi::OsStr>,
        value: impl AsRef<std::ffi::OsStr>,
    ) -> Self {
        self.cmd.env(key, value);
        self
    }

    /// Sets every pair of `vars`.
    pub fn envs<K: AsRef<std::ffi::OsStr>, V: AsRef<std::ffi::OsStr>>(
        mut self,
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.cmd.envs(vars);
        self
    }

    /// Removes `key` from the child's environment.
    pub fn env_remove(mut self, key: impl AsRef<std::ffi::OsStr>) -> Self {
        self.cmd.env_remove(key);
        self
    }

    /// Gives the child a stdin the parent writes to ([`Child::write_line`]).
    pub fn stdin_piped(mut self) -> Self {
        self.cmd.stdin(Stdio::piped());
        self
    }

    /// The name its reports carry (default: the test's).
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Starts the child; its output is read from now on.
    pub fn spawn(mut self) -> Child {
        if let Some(v) = std::env::var_os(RANKS_PER_GPU) {
            self.cmd.env(RANKS_PER_GPU, v);
        }
        let mut child = self
            .cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawning a child process for {}: {e}", self.name));
        let (tx, lines) = channel();
        let (done_tx, done) = channel();
        let stdout_text = Arc::new(Mutex::new(String::new()));
        let stderr_text = Arc::new(Mutex::new(String::new()));
        let mut readers = 0;
        if let Some(o) = child.stdout.take() {
            let (text, done_tx) = (Arc::clone(&stdout_text), done_tx.clone());
            readers += 1;
            std::thread::spawn(move || {
                for line in BufReader::new(o).lines().map_while(std::io::Result::ok) {
                    let mut t = text.lock().unwrap_or_else(PoisonError::into_inner);
                    t.push_str(&line);
                    t.push('\n');
                    drop(t);
                    let _ = tx.send(line);
                }
                let _ = done_tx.send(());
            });
        }
        if let Some(mut e) = child.stderr.take() {
            let text = Arc::clone(&stderr_text);
            readers += 1;
            std::thread::spawn(move || {
                let mut bytes = Vec::new();
                let _ = e.read_to_end(&mut bytes);
                *text.lock().unwrap_or_else(PoisonError::into_inner) =
                    String::from_utf8_lossy(&bytes).into_owned();
                let _ = done_tx.send(());
            });
        }
        Child {
            child,
            name: self.name,
            started: Instant::now(),
            lines,
            stdout_text,
            stderr_text,
            readers,
            done,
            reaped: false,
        }
    }
}

/// A running child process of this test binary (see [`TestProcess`]).
pub struct Child {
    child: std::process::Child,
    name: String,
    started: Instant,
    lines: Receiver<String>,
    stdout_text: Arc<Mutex<String>>,
    stderr_text: Arc<Mutex<String>>,
    /// Output readers still running; each says so on `done` when its stream ends.
    readers: usize,
    done: Receiver<()>,
    /// Waited for: dropping it then kills nothing.
    reaped: bool,
}

impl Drop for Child {
    /// A child dropped without being waited for (its test failed first) is killed and reaped,
    /// so that no rank runs on after its test.
    fn drop(&mut self) {
        if !self.reaped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Child {
    /// The child's process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The name its reports carry.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The next line of its standard output, waiting at most until `deadline`: `None` when
    /// none came by then or the output ended.
    pub fn next_line(&self, deadline: Instant) -> Option<String> {
        let left = deadline.saturating_duration_since(Instant::now());
        self.lines.recv_timeout(left).ok()
    }

    /// Reads standard output up to the first line holding `marker` (at most `limit` from now);
    /// returns what follows the marker on that line, trimmed. Panics (failing the test) when no
    /// such line comes in time, saying what the child printed.
    pub fn read_line_with(&self, marker: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        while let Some(line) = self.next_line(deadline) {
            // The test harness may have printed on the same line before it.
            if let Some(at) = line.find(marker) {
                return line[at + marker.len()..].trim().to_string();
            }
        }
        panic!(
            "{}: no line {marker:?} within {limit:?} (the output ended or the time ran out); its output so far:\n{}",
            self.name,
            self.stdout_text
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
        )
    }

    /// Writes `line` and a newline to the child's stdin ([`TestProcess::stdin_piped`]).
    pub fn write_line(&mut self, line: &str) {
        let stdin = self.child.stdin.as_mut().unwrap_or_else(|| {
            panic!(
                "{}: its stdin is not piped (TestProcess::stdin_piped)",
                self.name
            )
        });
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .unwrap_or_else(|e| panic!("{}: writing to its stdin: {e}", self.name));
    }

    /// Kills the child (SIGKILL, by its pid); it is reaped by [`Child::wait_until`].
    pub fn kill(&mut self) {
        let _ = self.child.kill();
    }

    /// Waits for the child to end, at most `limit` from its start, killing it then.
    pub fn wait_for(self, limit: Duration) -> ChildEnd {
        let deadline = self.started + limit;
        self.wait_until(deadline)
    }

    /// Waits for the child to end until `deadline`, killing it then (reported as overrun);
    /// returns its status and output.
    pub fn wait_until(mut self, deadline: Instant) -> ChildEnd {
        let mut overran = false;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(st)) => {
                    self.reaped = true;
                    break st;
                }
                Ok(None) if Instant::now() >= deadline => {
                    overran = true;
                    let _ = self.child.kill();
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => panic!("{}: waiting for it: {e}", self.name),
            }
        };
        // The pipes close with the child, unless a grandchild holds them (one that does not
        // die with it): the readers are waited for [`READER_GRACE`] at most.
        let grace = Instant::now() + READER_GRACE;
        let mut open = false;
        for _ in 0..self.readers {
            let left = grace.saturating_duration_since(Instant::now());
            open |= self.done.recv_timeout(left).is_err();
        }
        let take = |t: &Mutex<String>| {
            std::mem::take(&mut *t.lock().unwrap_or_else(PoisonError::into_inner))
        };
        let mut stderr = take(&self.stderr_text);
        if open {
            stderr.push_str(&format!(
                "\n(its output was still open {READER_GRACE:?} after it ended: a process it started holds it)\n"
            ));
        }
        let stdout = take(&self.stdout_text);
        ChildEnd {
            name: self.name.clone(),
            status,
            stdout,
            stderr,
            pid: self.child.id(),
            overran,
        }
    }
}

/// How a child ended.
pub struct ChildEnd {
    /// The name it was spawned with.
    pub name: String,
    /// Its exit status (a child killed for overrunning reads as killed by SIGKILL).
    pub status: ExitStatus,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
    /// Its process id (reaped: no longer names a process of ours).
    pub pid: u32,
    /// Whether it was killed for overrunning its bound.
    pub overran: bool,
}

impl ChildEnd {
    /// Exited successfully, within its bound.
    pub fn success(&self) -> bool {
        self.status.success() && !self.overran
    }

    /// Its standard output and error, one after the other.
    pub fn output(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }

    /// A report for a failure message: name, status, stdout and stderr (a long output is cut
    /// in the middle).
    pub fn text(&self) -> String {
        let text = format!(
            "--- {} ({}{}) stdout:\n{}--- stderr:\n{}",
            self.name,
            self.status,
            if self.overran {
                ", killed after its time limit"
            } else {
                ""
            },
            self.stdout,
            self.stderr
        );
        if text.len() <= QUOTE_LIMIT {
            return text;
        }
        let head = floor_char_boundary(&text, QUOTE_LIMIT / 3);
        let tail = ceil_char_boundary(&text, text.len() - QUOTE_LIMIT / 2);
        format!("{}\n…\n{}", &text[..head], &text[tail..])
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn ceil_char_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

/// Runs `body` in a fresh child process of this test binary (so it has the library's
/// process-wide state to itself, and a hung one is killed after `limit`): the test named
/// `test` calls `isolated(test, …)`, which in the parent spawns the child (configured by
/// `configure`), checks that it succeeded and prints its output, and in the child runs `body`.
pub fn isolated(
    test: &str,
    limit: Duration,
    configure: impl FnOnce(TestProcess) -> TestProcess,
    body: impl FnOnce(),
) {
    if in_isolated(test) {
        body();
        return;
    }
    let end = configure(TestProcess::isolated(test))
        .spawn()
        .wait_for(limit);
    assert!(
        end.success(),
        "{test} failed in its child process:\n{}",
        end.text()
    );
    eprintln!("{}", end.text());
}

/// Whether this process is the [`isolated`] child running `test`.
pub fn in_isolated(test: &str) -> bool {
    std::env::var(ISOLATED).as_deref() == Ok(test)
}

/// In a child process of a test: dies (SIGKILL) when the thread of the test that started it
/// ends, so that a parent killed by a test runner's timeout (a mutation run's, say) leaves no
/// rank running on (one whose kernel loops, in a mutant, would run for ever). Exits at once if
/// the parent is already gone.
pub fn die_with_parent() {
    // SAFETY: `prctl(PR_SET_PDEATHSIG, SIGKILL)` takes no pointers.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    if std::os::unix::process::parent_id() == 1 {
        std::process::exit(1);
    }
}
