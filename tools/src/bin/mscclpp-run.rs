//! `mscclpp-run`: starts N copies of a command as the ranks of one job on this machine.
//!
//! ```text
//! mscclpp-run -n 2 -- mscclpp-bench allreduce -c
//! mscclpp-run -n 4 --bootstrap 127.0.0.1:29500 -- ./my-program
//! ```
//! Each copy gets `MSCCLPP_RANK`, `MSCCLPP_WORLD_SIZE`, `MSCCLPP_LOCAL_RANK` and either
//! `MSCCLPP_UNIQUE_ID` (default: a fresh id naming a free loopback port, which rank 0 then
//! listens on, with a fresh random secret) or `MSCCLPP_BOOTSTRAP` (with `--bootstrap
//! ip:port`) and `MSCCLPP_SECRET` (the caller's, if set, else a fresh random one, so the job is
//! authenticated either way), which is what `BootstrapConfig::from_env` reads. `NCCL_NVLS_ENABLE=0` is set unless already set (NVLink
//! multicast stays off on shared machines).
//!
//! Every line a copy prints is prefixed with its rank (`[1] ...`, on the same stream). Each
//! copy runs in its own process group. When a copy fails (non-zero exit or a signal), or
//! `mscclpp-run` gets SIGINT or SIGTERM, the other copies' groups are stopped (SIGTERM, then
//! SIGKILL after a grace period) and `mscclpp-run` exits with the first failure's code (128 +
//! signal for a signal); otherwise with 0. Exit 2 means a bad command line or a copy that
//! could not start. `MSCCLPP_LOG` is passed on to the copies (and shows this tool's own
//! `tracing` events).

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use clap::Parser;
use mscclpp::host::auth::Secret;
use mscclpp::host::bootstrap::UniqueId;
use mscclpp_tools::BoxError;

/// The command line.
#[derive(Parser, Debug)]
#[command(
    name = "mscclpp-run",
    about = "Starts N copies of COMMAND as ranks 0..N-1 of one job on this machine",
    long_about = "Starts N copies of COMMAND as ranks 0..N-1 of one job (MSCCLPP_RANK, \
                  MSCCLPP_WORLD_SIZE, MSCCLPP_LOCAL_RANK, and MSCCLPP_UNIQUE_ID or \
                  MSCCLPP_BOOTSTRAP), prefixes their output with the rank, stops all when one \
                  fails, and exits with the first failure's code.",
    override_usage = "mscclpp-run -n N [--bootstrap IP:PORT] [--no-prefix] [--] COMMAND [ARGS...]"
)]
struct Args {
    /// Ranks: copies of COMMAND (also -np, as mpirun spells it)
    #[arg(short = 'n', long = "np", value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..))]
    n: u64,
    /// Rank 0 listens on IP:PORT (MSCCLPP_BOOTSTRAP) [default: a fresh unique id naming a
    /// free loopback port (MSCCLPP_UNIQUE_ID)]
    #[arg(long, value_name = "IP:PORT")]
    bootstrap: Option<SocketAddr>,
    /// Do not prefix the copies' lines with their rank
    #[arg(long)]
    no_prefix: bool,
    /// The program and its arguments
    #[arg(value_name = "COMMAND", required = true, num_args = 1.., trailing_var_arg = true)]
    command: Vec<OsString>,
}

impl Args {
    /// Parses the command line (program name first).
    fn parse_from(argv: impl IntoIterator<Item = OsString>) -> Result<Self, clap::Error> {
        Self::try_parse_from(spell_np(argv.into_iter().collect()))
    }
}

/// `argv` with mpirun's `-np` (before the command) spelled `--np`, which clap reads.
fn spell_np(argv: Vec<OsString>) -> Vec<OsString> {
    let mut out = Vec::with_capacity(argv.len());
    let mut it = argv.into_iter();
    out.extend(it.next());
    let mut value_next = false;
    for a in it.by_ref() {
        let s = a.to_string_lossy().into_owned();
        if value_next {
            value_next = false;
            out.push(a);
            continue;
        }
        if s == "--" || !s.starts_with('-') {
            out.push(a);
            break;
        }
        value_next = matches!(s.as_str(), "-n" | "-np" | "--np" | "--bootstrap");
        out.push(if s == "-np" { "--np".into() } else { a });
    }
    out.extend(it);
    out
}

/// How long stopped copies get between SIGTERM and SIGKILL.
const GRACE: Duration = Duration::from_secs(3);
/// How long output still in flight may take once every copy has exited (a process the copies
/// left behind may hold their pipes open).
const DRAIN: Duration = Duration::from_secs(2);

/// The signal (SIGINT / SIGTERM) that asked us to stop, or 0.
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop_signal(sig: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP_SIGNAL.store(sig, Ordering::Relaxed);
}

/// A loopback address with a port that was free a moment ago.
fn free_loopback_port() -> Result<SocketAddr, BoxError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("finding a free port: {e}"))?;
    Ok(l.local_addr()?)
}

/// Copies `from` to our stdout or stderr line by line, each line prefixed.
fn pump(from: impl Read, prefix: String, to_stderr: bool, lock: &Mutex<()>) {
    let mut r = BufReader::new(from);
    let mut line = Vec::new();
    loop {
        line.clear();
        match r.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                if !line.ends_with(b"\n") {
                    line.push(b'\n');
                }
                let _g = mscclpp::host::sync::lock(lock);
                let _ = if to_stderr {
                    let mut e = std::io::stderr().lock();
                    e.write_all(prefix.as_bytes())
                        .and_then(|()| e.write_all(&line))
                } else {
                    let mut o = std::io::stdout().lock();
                    o.write_all(prefix.as_bytes())
                        .and_then(|()| o.write_all(&line))
                        .and_then(|()| o.flush())
                };
            }
        }
    }
}

fn code_of(s: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => c.clamp(1, 255) as u8,
        (None, Some(sig)) => (128 + sig).clamp(1, 255) as u8,
        _ => 1,
    }
}

fn describe(s: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(sig)) => format!("signal {sig}"),
        _ => "an unknown status".into(),
    }
}

/// Sends `sig` to the process group of child `c` (which leads its own group, see `run`).
fn signal_group(c: &Child, sig: libc::c_int) {
    // SAFETY: `kill` with the negated id of a child we started in its own process group and
    // have not reaped (so the id cannot have been reused); no memory is involved.
    unsafe { libc::kill(-(c.id() as libc::pid_t), sig) };
}

/// Sends SIGTERM to the groups of the copies still running, then SIGKILL to those left after
/// [`GRACE`]; reaps them.
fn stop_all(children: &mut [(usize, Child)], done: &[bool]) {
    for (r, c) in children.iter() {
        if !done[*r] {
            signal_group(c, libc::SIGTERM);
        }
    }
    let deadline = Instant::now() + GRACE;
    for (r, c) in children.iter_mut() {
        if done[*r] {
            continue;
        }
        loop {
            match c.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() >= deadline => {
                    signal_group(c, libc::SIGKILL);
                    let _ = c.wait();
                    break;
                }
                Ok(None) => thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

/// The copies that were started, each with its rank, and the threads copying their output.
struct Job {
    children: Vec<(usize, Child)>,
    pumps: Vec<thread::JoinHandle<()>>,
}

/// The environment variables naming rank 0's bootstrap address and the job's secret.
fn bootstrap_root(a: &Args) -> Result<Vec<(&'static str, String)>, BoxError> {
    Ok(match a.bootstrap {
        Some(addr) => {
            let secret = match std::env::var("MSCCLPP_SECRET") {
                Ok(s) if !s.trim().is_empty() => s,
                _ => Secret::random()?
                    .to_bytes()
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect(),
            };
            vec![
                ("MSCCLPP_BOOTSTRAP", addr.to_string()),
                ("MSCCLPP_SECRET", secret),
            ]
        }
        None => vec![(
            "MSCCLPP_UNIQUE_ID",
            UniqueId::new(free_loopback_port()?)?.to_hex(),
        )],
    })
}

/// The command of rank `r`: the rank variables, its own process group, stdin for rank 0 only.
fn rank_command(a: &Args, r: usize, root: &[(&str, String)], nvls: bool) -> Command {
    let n = a.n.to_string();
    let mut cmd = Command::new(&a.command[0]);
    cmd.args(&a.command[1..])
        .env("MSCCLPP_RANK", r.to_string())
        .env("MSCCLPP_WORLD_SIZE", &n)
        .env("MSCCLPP_LOCAL_RANK", r.to_string())
        .env_remove("MSCCLPP_UNIQUE_ID")
        .env_remove("MSCCLPP_BOOTSTRAP")
        .envs(root.iter().map(|(k, v)| (k, v)))
        .stdin(if r == 0 {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .process_group(0);
    if nvls {
        cmd.env("NCCL_NVLS_ENABLE", "0");
    }
    if !a.no_prefix {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    }
    cmd
}

/// Starts every rank; when one cannot start, stops those already running and says which.
fn spawn_ranks(a: &Args) -> Result<Result<Job, usize>, BoxError> {
    let root = bootstrap_root(a)?;
    let nvls = std::env::var_os("NCCL_NVLS_ENABLE").is_none();
    let lock = Arc::new(Mutex::new(()));
    let mut job = Job {
        children: Vec::new(),
        pumps: Vec::new(),
    };
    for r in 0..a.n as usize {
        match rank_command(a, r, &root, nvls).spawn() {
            Ok(mut c) => {
                let p = format!("[{r}] ");
                if let Some(o) = c.stdout.take() {
                    let (p, lock) = (p.clone(), lock.clone());
                    job.pumps
                        .push(thread::spawn(move || pump(o, p, false, &lock)));
                }
                if let Some(e) = c.stderr.take() {
                    let lock = lock.clone();
                    job.pumps
                        .push(thread::spawn(move || pump(e, p, true, &lock)));
                }
                job.children.push((r, c));
            }
            Err(e) => {
                eprintln!(
                    "mscclpp-run: starting rank {r} ({:?}) failed: {e}",
                    a.command[0]
                );
                stop_all(&mut job.children, &vec![false; a.n as usize]);
                return Ok(Err(r));
            }
        }
    }
    Ok(Ok(job))
}

/// How the job ended.
struct Outcome {
    /// The first rank that failed, and how.
    first_failure: Option<(usize, ExitStatus)>,
    /// The exit code decided without a rank's status (a signal to us, a failed wait).
    code: Option<u8>,
}

/// Waits until every rank has exited, or one failed (then stops the others), or we got
/// SIGINT / SIGTERM (then stops all).
fn wait_for_ranks(job: &mut Job, n: usize) -> Outcome {
    let mut done = vec![false; n];
    let mut out = Outcome {
        first_failure: None,
        code: None,
    };
    while done.iter().any(|d| !d) {
        let mut progressed = false;
        for (r, c) in job.children.iter_mut() {
            if done[*r] {
                continue;
            }
            match c.try_wait() {
                Ok(Some(st)) => {
                    done[*r] = true;
                    progressed = true;
                    if !st.success() && out.first_failure.is_none() {
                        out.first_failure = Some((*r, st));
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    done[*r] = true;
                    eprintln!("mscclpp-run: waiting for rank {r} failed: {e}");
                    out.code.get_or_insert(1);
                }
            }
        }
        let sig = STOP_SIGNAL.load(Ordering::Relaxed);
        if sig != 0 {
            eprintln!("mscclpp-run: got signal {sig}; stopping every rank");
            stop_all(&mut job.children, &done);
            out.code = Some((128 + sig).clamp(1, 255) as u8);
            break;
        }
        if let Some((r, st)) = out.first_failure
            && done.iter().any(|d| !d)
        {
            eprintln!(
                "mscclpp-run: rank {r} failed ({}); stopping the other ranks",
                describe(st)
            );
            stop_all(&mut job.children, &done);
            break;
        }
        if !progressed {
            thread::sleep(Duration::from_millis(20));
        }
    }
    out
}

/// Runs the job; returns our exit code.
fn run(a: Args) -> Result<u8, BoxError> {
    // The copies are not in our process group, so a Ctrl-C reaches only us: pass it on.
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: installs a handler that only stores to an atomic (async-signal-safe).
        unsafe { libc::signal(sig, on_stop_signal as *const () as libc::sighandler_t) };
    }
    let mut job = match spawn_ranks(&a)? {
        Ok(job) => job,
        Err(_) => return Ok(2),
    };
    let out = wait_for_ranks(&mut job, a.n as usize);
    let deadline = Instant::now() + DRAIN;
    while job.pumps.iter().any(|p| !p.is_finished()) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
    }
    if let Some((r, st)) = out.first_failure {
        eprintln!(
            "mscclpp-run: exiting with rank {r}'s status ({})",
            describe(st)
        );
        return Ok(out.code.unwrap_or_else(|| code_of(st)));
    }
    Ok(out.code.unwrap_or(0))
}

fn main() -> ExitCode {
    let args = match Args::parse_from(std::env::args_os()) {
        Ok(a) => a,
        Err(e) => e.exit(),
    };
    mscclpp_tools::init_logging("mscclpp-run");
    match run(args) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("mscclpp-run: {}", mscclpp_tools::chain(&*e));
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Args, clap::Error> {
        Args::parse_from(line.split_whitespace().map(OsString::from))
    }

    #[test]
    fn the_command_line_is_consistent() {
        <Args as clap::CommandFactory>::command().debug_assert();
    }

    #[test]
    fn options_then_the_command_and_its_own_flags() {
        let a = parse("mscclpp-run -n 3 --no-prefix -- prog -n 7 --np x").expect("parsed");
        assert_eq!((a.n, a.no_prefix), (3, true));
        assert_eq!(a.command, ["prog", "-n", "7", "--np", "x"]);
        let a = parse("mscclpp-run -np 2 --bootstrap 127.0.0.1:29500 prog -c").expect("parsed");
        assert_eq!(a.n, 2);
        assert_eq!(a.bootstrap, Some("127.0.0.1:29500".parse().unwrap()));
        assert_eq!(a.command, ["prog", "-c"]);
        // `-np` after the command is the command's.
        assert_eq!(
            parse("mscclpp-run -n 1 prog -np 4")
                .expect("parsed")
                .command,
            ["prog", "-np", "4"]
        );
    }

    #[test]
    fn bad_command_lines_say_why() {
        for (line, needle) in [
            ("mscclpp-run -n 2", "<COMMAND>"),
            ("mscclpp-run -- true", "--np <N>"),
            ("mscclpp-run -n 0 true", "invalid value '0'"),
            (
                "mscclpp-run -n 2 --bootstrap nowhere true",
                "invalid value 'nowhere'",
            ),
            ("mscclpp-run -z -n 2 true", "unexpected argument '-z'"),
        ] {
            let e = parse(line).expect_err(line);
            assert_eq!(e.exit_code(), 2, "{line}");
            assert!(e.to_string().contains(needle), "{line}: {e}");
        }
    }
}
