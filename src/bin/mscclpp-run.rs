//! `mscclpp-run`: starts N copies of a command as the ranks of one job on this machine.
//!
//! ```text
//! mscclpp-run -n 2 -- mscclpp-bench allreduce -c
//! mscclpp-run -n 4 --bootstrap 127.0.0.1:29500 -- ./my-program
//! ```
//! Each copy gets `MSCCLPP_RANK`, `MSCCLPP_WORLD_SIZE`, `MSCCLPP_LOCAL_RANK` and either
//! `MSCCLPP_UNIQUE_ID` (default: a fresh id naming a free loopback port, which rank 0 then
//! listens on) or `MSCCLPP_BOOTSTRAP` (with `--bootstrap ip:port`), which is what
//! `BootstrapConfig::from_env` reads. `NCCL_NVLS_ENABLE=0` is set unless already set (NVLink
//! multicast stays off on shared machines).
//!
//! Every line a copy prints is prefixed with its rank (`[1] ...`, on the same stream). Each
//! copy runs in its own process group. When a copy fails (non-zero exit or a signal), or
//! `mscclpp-run` gets SIGINT or SIGTERM, the other copies' groups are stopped (SIGTERM, then
//! SIGKILL after a grace period) and `mscclpp-run` exits with the first failure's code (128 +
//! signal for a signal); otherwise with 0. Exit 2 means a bad command line or a copy that
//! could not start.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use mscclpp::host::bootstrap::UniqueId;

const USAGE: &str = "\
usage: mscclpp-run -n N [--bootstrap IP:PORT] [--no-prefix] [--] COMMAND [ARGS...]

Starts N copies of COMMAND as ranks 0..N-1 of one job (MSCCLPP_RANK, MSCCLPP_WORLD_SIZE,
MSCCLPP_LOCAL_RANK, and MSCCLPP_UNIQUE_ID or MSCCLPP_BOOTSTRAP), prefixes their output with
the rank, stops all when one fails, and exits with the first failure's code.";

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

type BoxError = Box<dyn std::error::Error + Send + Sync>;

struct Args {
    n: usize,
    bootstrap: Option<SocketAddr>,
    prefix: bool,
    command: Vec<String>,
}

fn parse(argv: &[String]) -> Result<Option<Args>, BoxError> {
    let mut it = argv.iter();
    let (mut n, mut bootstrap, mut prefix) = (None, None, true);
    let mut command = Vec::new();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{a} needs a value"))
        };
        match a.as_str() {
            "-h" | "--help" => return Ok(None),
            "-n" | "--np" | "-np" => {
                let v = value()?;
                let k: usize = v
                    .parse()
                    .map_err(|_| format!("-n {v:?}: not a number of ranks"))?;
                if k == 0 {
                    return Err("-n 0: at least one rank".into());
                }
                n = Some(k);
            }
            "--bootstrap" => {
                let v = value()?;
                bootstrap = Some(
                    v.parse()
                        .map_err(|_| format!("--bootstrap {v:?}: not an ip:port address"))?,
                );
            }
            "--no-prefix" => prefix = false,
            "--" => {
                command.extend(it.by_ref().cloned());
                break;
            }
            s if s.starts_with('-') && command.is_empty() => {
                return Err(format!("unknown option {s:?} (try --help)").into());
            }
            _ => {
                command.push(a.clone());
                command.extend(it.by_ref().cloned());
                break;
            }
        }
    }
    let n = n.ok_or("-n N (the number of ranks) is required")?;
    if command.is_empty() {
        return Err("no command given (mscclpp-run -n N -- COMMAND ...)".into());
    }
    Ok(Some(Args {
        n,
        bootstrap,
        prefix,
        command,
    }))
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
                let _g = lock.lock().unwrap_or_else(|e| e.into_inner());
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

fn run(a: Args) -> Result<u8, BoxError> {
    let root = match a.bootstrap {
        Some(addr) => ("MSCCLPP_BOOTSTRAP", addr.to_string()),
        None => (
            "MSCCLPP_UNIQUE_ID",
            UniqueId::new(free_loopback_port()?)?.to_hex(),
        ),
    };
    let nvls = std::env::var_os("NCCL_NVLS_ENABLE").is_none();
    // The copies are not in our process group, so a Ctrl-C reaches only us: pass it on.
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: installs a handler that only stores to an atomic (async-signal-safe).
        unsafe { libc::signal(sig, on_stop_signal as *const () as libc::sighandler_t) };
    }
    let lock = Arc::new(Mutex::new(()));
    let mut pumps = Vec::new();
    let mut children: Vec<(usize, Child)> = Vec::new();
    for r in 0..a.n {
        let mut cmd = Command::new(&a.command[0]);
        cmd.args(&a.command[1..])
            .env("MSCCLPP_RANK", r.to_string())
            .env("MSCCLPP_WORLD_SIZE", a.n.to_string())
            .env("MSCCLPP_LOCAL_RANK", r.to_string())
            .env_remove("MSCCLPP_UNIQUE_ID")
            .env_remove("MSCCLPP_BOOTSTRAP")
            .env(root.0, &root.1)
            .stdin(if r == 0 {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .process_group(0);
        if nvls {
            cmd.env("NCCL_NVLS_ENABLE", "0");
        }
        if a.prefix {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        match cmd.spawn() {
            Ok(mut c) => {
                let p = format!("[{r}] ");
                if let Some(o) = c.stdout.take() {
                    let (p, lock) = (p.clone(), lock.clone());
                    pumps.push(thread::spawn(move || pump(o, p, false, &lock)));
                }
                if let Some(e) = c.stderr.take() {
                    let lock = lock.clone();
                    pumps.push(thread::spawn(move || pump(e, p, true, &lock)));
                }
                children.push((r, c));
            }
            Err(e) => {
                eprintln!(
                    "mscclpp-run: starting rank {r} ({:?}) failed: {e}",
                    a.command[0]
                );
                stop_all(&mut children, &vec![false; a.n]);
                return Ok(2);
            }
        }
    }
    let mut done = vec![false; a.n];
    let mut first_failure: Option<(usize, ExitStatus)> = None;
    let mut code = None;
    while done.iter().any(|d| !d) {
        let mut progressed = false;
        for (r, c) in children.iter_mut() {
            if done[*r] {
                continue;
            }
            match c.try_wait() {
                Ok(Some(st)) => {
                    done[*r] = true;
                    progressed = true;
                    if !st.success() && first_failure.is_none() {
                        first_failure = Some((*r, st));
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    done[*r] = true;
                    eprintln!("mscclpp-run: waiting for rank {r} failed: {e}");
                    code.get_or_insert(1);
                }
            }
        }
        let sig = STOP_SIGNAL.load(Ordering::Relaxed);
        if sig != 0 {
            eprintln!("mscclpp-run: got signal {sig}; stopping every rank");
            stop_all(&mut children, &done);
            code = Some((128 + sig).clamp(1, 255) as u8);
            break;
        }
        if let Some((r, st)) = first_failure
            && done.iter().any(|d| !d)
        {
            eprintln!(
                "mscclpp-run: rank {r} failed ({}); stopping the other ranks",
                describe(st)
            );
            stop_all(&mut children, &done);
            break;
        }
        if !progressed {
            thread::sleep(Duration::from_millis(20));
        }
    }
    let deadline = Instant::now() + DRAIN;
    while pumps.iter().any(|p| !p.is_finished()) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
    }
    if let Some((r, st)) = first_failure {
        eprintln!(
            "mscclpp-run: exiting with rank {r}'s status ({})",
            describe(st)
        );
        return Ok(code.unwrap_or_else(|| code_of(st)));
    }
    Ok(code.unwrap_or(0))
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = match parse(&argv) {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("mscclpp-run: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(args) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("mscclpp-run: {e}");
            ExitCode::from(2)
        }
    }
}
