//! `--daemon`: the parent re-executes itself as a detached child (new session,
//! no stdin; stderr to `--log-file`, or the parent's until the child reports,
//! then `/dev/null`) and waits on a pipe until the child reports
//! "ready" or an error, so `lakemount mount --daemon` exits 0 only once the
//! mount is usable. Re-executing, not `fork`, because forking a process that
//! already runs threads is unsafe.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

/// Environment variable carrying the child's end of the readiness pipe.
const READY_FD_ENV: &str = "LAKEMOUNT_DAEMON_READY_FD";

/// Set (to `1`) for a child started without `--log-file`: its stderr is the
/// parent's terminal until it reports, then `/dev/null`.
const SHARED_STDERR_ENV: &str = "LAKEMOUNT_DAEMON_SHARED_STDERR";

/// The command line the child is started with, when not this process's own
/// (`mount.lakemount` translates its arguments first). `argv[0]` included.
static COMMAND_LINE: std::sync::OnceLock<Vec<std::ffi::OsString>> = std::sync::OnceLock::new();

/// Makes [`spawn_and_wait`] start the child with `argv` (`argv[0]` included)
/// instead of this process's arguments. Only the first call counts.
pub fn set_command_line(argv: Vec<std::ffi::OsString>) {
    let _ = COMMAND_LINE.set(argv);
}

/// Whether this process is the detached child.
pub fn is_child() -> bool {
    std::env::var_os(READY_FD_ENV).is_some()
}

/// Whether this is a child writing to its parent's stderr, which prints the
/// child's failure itself (so the child must not print it again).
pub fn shares_parent_stderr() -> bool {
    is_child() && std::env::var_os(SHARED_STDERR_ENV).is_some()
}

/// Starts the child and waits for its word. Errors: the child's own reason.
pub fn spawn_and_wait(log_file: Option<&Path>) -> anyhow::Result<()> {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe(2) to fill.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        bail!("pipe: {}", std::io::Error::last_os_error());
    }
    // SAFETY: pipe(2) just returned these descriptors; we own them.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: F_SETFD on a descriptor we own; the read end must not leak into the child.
    unsafe { libc::fcntl(fds[0], libc::F_SETFD, libc::FD_CLOEXEC) };
    let log = match log_file {
        Some(p) => Stdio::from(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .with_context(|| format!("--log-file {}", p.display()))?,
        ),
        // Without a log file, what the child logs while it starts (warnings
        // such as an empty prefix) still reaches the admin's terminal.
        None => Stdio::inherit(),
    };
    let mut cmd = Command::new(std::env::current_exe().context("locating own executable")?);
    if log_file.is_none() {
        cmd.env(SHARED_STDERR_ENV, "1");
    }
    let args: Vec<std::ffi::OsString> = match COMMAND_LINE.get() {
        Some(a) => a.iter().skip(1).cloned().collect(),
        None => std::env::args_os().skip(1).collect(),
    };
    cmd.args(args)
        .env(READY_FD_ENV, fds[1].to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    // SAFETY: setsid is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let child = cmd.spawn().context("starting the daemon process")?;
    drop(write_end);
    let mut line = String::new();
    BufReader::new(std::fs::File::from(read_end))
        .read_line(&mut line)
        .context("waiting for the daemon")?;
    match line.trim_end().split_once(' ') {
        _ if line.trim_end() == "ready" => {
            // Under systemd with --daemon (Type=notify, NotifyAccess=main):
            // the main process says the child is the service now.
            let _ = sd_notify::notify(
                false,
                &[
                    sd_notify::NotifyState::MainPid(child.id()),
                    sd_notify::NotifyState::Ready,
                ],
            );
            eprintln!(
                "lakemount: mounted, running in the background as pid {}",
                child.id()
            );
            Ok(())
        }
        Some(("error", reason)) => bail!("{reason}"),
        _ if log_file.is_some() => {
            bail!("the daemon process exited before mounting (see --log-file)")
        }
        _ => bail!("the daemon process exited before mounting (see the messages above)"),
    }
}

/// Set once the parent got its one message.
static SENT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether this process already sent its parent a message (ready or failure).
pub fn message_sent() -> bool {
    SENT.load(std::sync::atomic::Ordering::SeqCst)
}

fn send(msg: &str) {
    if SENT.swap(true, std::sync::atomic::Ordering::SeqCst) {
        return;
    }
    let Some(fd) = std::env::var(READY_FD_ENV)
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
    else {
        return;
    };
    // SAFETY: the parent passed us this descriptor; we use it once and close it.
    let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
    let _ = writeln!(f, "{msg}");
}

/// Tells a waiting parent the mount is ready (no-op in the foreground), and
/// systemd with `READY=1` when `$NOTIFY_SOCKET` is set. A
/// child sharing the parent's stderr then points its stderr at `/dev/null`:
/// the terminal it started from may close at any time.
pub fn report_ready() {
    send("ready");
    // Under systemd (`Type=notify`): the unit is active from here.
    if let Err(e) = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]) {
        tracing::warn!("sd_notify READY=1: {e}");
    }
    if shares_parent_stderr()
        && let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null")
    {
        use std::os::fd::AsRawFd;
        loop {
            // SAFETY: dup2 of a descriptor we own onto stderr.
            if unsafe { libc::dup2(null.as_raw_fd(), 2) } >= 0 {
                break;
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                tracing::warn!("cannot detach stderr from the terminal: {e}");
                break;
            }
        }
    }
}

/// Tells systemd (`$NOTIFY_SOCKET`, if set) that the daemon is unmounting.
pub fn report_stopping() {
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
}

/// Tells a waiting parent why mounting failed (no-op in the foreground).
pub fn report_failure(reason: &str) {
    send(&format!("error {}", reason.replace('\n', " ")));
}
