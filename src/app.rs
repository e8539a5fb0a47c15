//! Composition root: config -> store -> fs -> FUSE session; signals; ordered
//! shutdown. `run_mount` is what `lakemount mount` does.

use crate::cache::Cache;
use crate::store::pool::{BufferPool, MAX_IDLE};
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail};
use fuser::{MountOption, SessionACL};
use tracing::{error, info, warn};

use crate::cli::{MountArgs, Source};
use crate::config::Config;
use crate::daemon;
use crate::fs::Fs;
use crate::fuse::FuseFs;
use crate::store::s3::S3Store;
use crate::store::{ObjectStore, StoreError};
use crate::telemetry;

/// Runs `lakemount mount`: returns when the file system is unmounted (SIGINT,
/// SIGTERM, `umount`). Errors carry a one-line reason: bad config, mount point
/// not a directory, bucket missing, access denied, endpoint unreachable.
pub fn run_mount(args: &MountArgs) -> anyhow::Result<()> {
    let source = Source::parse(&args.source).map_err(anyhow::Error::msg)?;
    let config = args.to_config()?;
    let detached = check_mountpoint(&args.mountpoint)?;
    if args.daemon && !daemon::is_child() {
        if let Some(note) = &detached {
            eprintln!("lakemount: {note}");
        }
        return daemon::spawn_and_wait(args.log_file.as_deref());
    }
    telemetry::init_logging(&config.telemetry.log_level)?;
    if let Some(note) = &detached {
        warn!("{note}");
    }
    raise_open_files_limit();
    // Before any thread of the mount starts: they all inherit the mask.
    let stop = StopSignals::start()?;
    // Absolute in the log, stats and the mount table, as given otherwise.
    let mountpoint = std::path::absolute(&args.mountpoint).unwrap_or(args.mountpoint.clone());
    let result = mount_and_serve(&source, &mountpoint, &config, stop);
    if let Err(e) = &result {
        daemon::report_failure(&format!("{e:#}"));
    }
    result
}

/// Raises the soft limit of open files (RLIMIT_NOFILE) to the hard limit:
/// cache files, connections and FUSE passthrough backing files each hold a
/// descriptor, and the common soft default of 1024 runs out under hundreds
/// of open files, surfacing as EMFILE deep in a read. Logged when it stays
/// low.
fn raise_open_files_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit(2) with a valid rlimit struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return;
    }
    if lim.rlim_cur >= lim.rlim_max {
        return;
    }
    let was = lim.rlim_cur;
    lim.rlim_cur = lim.rlim_max;
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } == 0 {
        tracing::debug!(from = was, to = lim.rlim_max, "open files limit raised");
    } else {
        warn!(
            soft = was,
            hard = lim.rlim_max,
            "could not raise the open files limit: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Checks that `path` is a directory and not a mount point. A FUSE mount
/// left there by a daemon that died (its requests answer ENOTCONN; a `stat`
/// may still succeed from the kernel's attribute cache) is detached first
/// (`umount -l`); the returned note says so, for the log.
fn check_mountpoint(path: &Path) -> anyhow::Result<Option<String>> {
    let mut detached = None;
    let meta = match std::fs::metadata(path) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            detached = Some(detach_dead_fuse_mount(path, &e)?);
            std::fs::metadata(path)
        }
        other => other,
    }
    .with_context(|| format!("mount point {}", path.display()))?;
    if !meta.is_dir() {
        bail!("mount point {} is not a directory", path.display());
    }
    // A second mount stacked on the first would be unmounted together with
    // it, and its shutdown would unmount the other one by path.
    let canonical =
        std::fs::canonicalize(path).with_context(|| format!("mount point {}", path.display()))?;
    if mount_at(&canonical).is_some() {
        if let Err(e) = statfs(&canonical)
            && e.raw_os_error() == Some(libc::ENOTCONN)
            && detached.is_none()
        {
            return Ok(Some(detach_dead_fuse_mount(&canonical, &e)?));
        }
        bail!(
            "mount point {} is already a mount point; unmount it first (umount {})",
            canonical.display(),
            canonical.display()
        );
    }
    Ok(detached)
}

/// The top mount whose mount point is `abs` (a later line of
/// `/proc/self/mountinfo` is mounted over an earlier one).
struct MountEntry {
    /// `major:minor`, field 3 (proc(5)). A FUSE mount's device is its own:
    /// it tells this mount from one made at the same path since.
    dev: String,
    /// The file system type, after " - ".
    fstype: String,
    /// The mount source, after the type.
    source: String,
}

/// The top mount at `abs`, `None` when nothing is mounted there.
fn mount_at(abs: &Path) -> Option<MountEntry> {
    let want = abs.to_string_lossy();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    mounts.lines().rev().find_map(|l| {
        let mut f = l.split(' ');
        let dev = f.nth(2)?;
        if f.nth(1).map(unescape_mountinfo).as_deref() != Some(want.as_ref()) {
            return None;
        }
        let mut tail = l.split(" - ").nth(1)?.split(' ');
        Some(MountEntry {
            dev: dev.to_string(),
            fstype: tail.next()?.to_string(),
            source: tail.next()?.to_string(),
        })
    })
}

/// A mountinfo field with its octal escapes decoded: the kernel writes a
/// space, tab, newline and backslash as `\040`, `\011`, `\012`, `\134`
/// (`show_mountinfo`, fs/proc_namespace.c).
fn unescape_mountinfo(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) if b[i] == b'\\' => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            _ => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// statfs(2) of `path`: a FUSE mount sends it to its daemon, so a dead one
/// answers ENOTCONN.
fn statfs(path: &Path) -> std::io::Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(std::io::Error::other)?;
    // SAFETY: a NUL-terminated path and a zeroed out-buffer of the right type.
    let mut buf: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut buf) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Lazily unmounts the dead FUSE mount at `path` (`stat` or `statfs` gave
/// `err`, ENOTCONN): `umount2(MNT_DETACH)` as root, else `fusermount3 -uz` (or
/// `fusermount -uz`). Refuses when `/proc/self/mountinfo` shows no FUSE mount
/// there. Returns the note for the log.
fn detach_dead_fuse_mount(path: &Path, err: &std::io::Error) -> anyhow::Result<String> {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    // Only a lakemount (a FUSE type whose source is lakemount's FSName,
    // "lakemount:..."): another FUSE file system, mergerfs over a dead
    // branch say, can pass ENOTCONN on while it lives.
    let Some(MountEntry { fstype, .. }) = mount_at(&abs).filter(|m| {
        (m.fstype == "fuse" || m.fstype.starts_with("fuse.")) && m.source.starts_with("lakemount:")
    }) else {
        bail!(
            "mount point {}: {err}; if a FUSE daemon died there, unmount it first \
             (umount -l {})",
            path.display(),
            abs.display()
        );
    };
    if unmount_path(&abs, true).is_err() {
        bail!(
            "mount point {} is a {fstype} mount whose daemon is gone ({err}), and \
             unmounting it failed; run `umount -l {}` (or `fusermount3 -uz`) as its owner",
            path.display(),
            abs.display()
        );
    }
    Ok(format!(
        "mount point {} was a {fstype} mount whose daemon is gone ({err}); detached it \
         (umount -l) and mounting again",
        abs.display()
    ))
}

/// Tokio worker threads: every core, at least 2 (one may wait on the disk).
fn worker_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().max(2))
}

fn mount_and_serve(
    source: &Source,
    mountpoint: &Path,
    config: &Config,
    stop: StopSignals,
) -> anyhow::Result<()> {
    let mut mounted = Mounted::start(source, mountpoint, config)?;
    if let Err(e) = wait_answering(mountpoint, READY_WITHIN) {
        // The session is wedged: a plain unmount would wait on it (EBUSY
        // while the probe's statfs is held), so the mount is detached and
        // the process ends here, its parent and systemd told why.
        let msg = format!("{e:#}");
        error!("{msg}");
        daemon::report_failure(&msg);
        let _ = unmount_path(mountpoint, true);
        std::process::exit(1);
    }
    let mut unmounter = Some(mounted.unmounter()?);
    // As mountinfo shows it (symbolic links resolved; the mount answers).
    let path = std::fs::canonicalize(mountpoint).unwrap_or(mountpoint.to_path_buf());
    // Unmounts by path touch only this mount, not one made there since
    // (after an outside `umount -l`).
    let ours = mount_at(&path).map(|m| m.dev);
    let still_ours = move |p: &Path| ours.is_some() && mount_at(p).map(|m| m.dev) == ours;
    // Once the mount answers: a stop signal that came before waits here.
    mounted.runtime().spawn(async move {
        stop.received.notified().await;
        info!("signal received, unmounting");
        UNMOUNT_ASKED.store(true, std::sync::atomic::Ordering::SeqCst);
        daemon::report_stopping();
        // EBUSY can be transient: a path lookup or statfs in flight on the
        // mount (the health probe's, another process's) holds it for a moment.
        // fuser's unmounter gives up its mount at the first attempt, failed
        // or not: later attempts unmount the path themselves.
        for attempt in 1..=UNMOUNT_TRIES {
            let tried = match unmounter.take() {
                Some(mut u) => u.unmount(),
                None if still_ours(&path) => unmount_path(&path, false),
                None => return,
            };
            match tried {
                Ok(()) => return,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) && attempt < UNMOUNT_TRIES => {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => break,
                Err(e) => {
                    warn!("unmount failed: {e}");
                    break;
                }
            }
        }
        if !still_ours(&path) {
            return;
        }
        // Still busy (a process has its working directory or a file open
        // in the mount), or the unmount failed otherwise. Detached, the
        // path is free at once (a restart can mount there) and those
        // processes are served until they let go, when the session ends.
        match unmount_path(&path, true) {
            Ok(()) => warn!(
                "the mount is busy (a process has its working directory or a file open in \
                 it): detached it (umount -l); the daemon exits once those let go of it"
            ),
            Err(e) => warn!("unmount failed, and detaching the mount too: {e}"),
        }
    });
    daemon::report_ready();
    mounted.wait()
}

/// SIGINT and SIGTERM, taken by one thread with sigwait(3) and blocked in
/// every other: a stop signal never meets a thread without a handler, so one
/// that comes right after the kernel mount (`systemctl stop` just after
/// start) no longer kills the daemon by default action, leaving its mount
/// point dead. Before the kernel mount the process just exits (128 + the
/// signal, as a shell reports it): nothing is mounted yet, and the bucket
/// check may take up to `s3.request_deadline_secs`. After it, `received`
/// is notified (a permit is kept until the unmounting task waits).
struct StopSignals {
    received: Arc<tokio::sync::Notify>,
}

/// Set just before the kernel mount: a stop signal from then on unmounts.
static KERNEL_MOUNT_STARTED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

impl StopSignals {
    /// Blocks SIGINT and SIGTERM in the calling thread (and so in every
    /// thread it starts afterwards) and starts the thread that waits for
    /// them. Call it before any other thread of the mount starts.
    /// Errors: the thread could not be started.
    fn start() -> anyhow::Result<Self> {
        // SAFETY: a zeroed sigset_t is then initialised by sigemptyset;
        // pthread_sigmask changes this thread's mask only.
        let set = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            set
        };
        let received = Arc::new(tokio::sync::Notify::new());
        let notify = received.clone();
        std::thread::Builder::new()
            .name("lakemount-signals".into())
            .spawn(move || {
                loop {
                    let mut sig: libc::c_int = 0;
                    // SAFETY: `set` is initialised; sigwait writes `sig`.
                    if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
                        continue;
                    }
                    if !KERNEL_MOUNT_STARTED.load(std::sync::atomic::Ordering::SeqCst) {
                        std::process::exit(128 + sig);
                    }
                    notify.notify_one();
                }
            })
            .context("starting the signal thread")?;
        Ok(Self { received })
    }
}

/// Unmounts the file system at `path` with umount(2) (`lazy`: MNT_DETACH,
/// the mount goes at once and ends once nothing uses it), falling back to
/// `fusermount3 -u` (or `fusermount`; `-z` when lazy), which unmount a
/// mount of the calling user without privilege: when umount(2) was refused
/// (EPERM), or failed in any way when lazy. Errors: umount(2)'s (EBUSY while
/// a request is in flight on the mount); EBUSY when the tools failed after
/// EPERM.
fn unmount_path(path: &Path, lazy: bool) -> std::io::Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: umount2 of a NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    let refused = e.raw_os_error() == Some(libc::EPERM);
    if !(lazy || refused) {
        return Err(e);
    }
    let args: &[&str] = if lazy { &["-u", "-z"] } else { &["-u"] };
    let by_tool = ["fusermount3", "fusermount"].iter().any(|tool| {
        std::process::Command::new(tool)
            .args(args)
            .arg(path)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    match (by_tool, refused) {
        (true, _) => Ok(()),
        (false, true) => Err(std::io::Error::from_raw_os_error(libc::EBUSY)),
        (false, false) => Err(e),
    }
}

/// Unmount attempts at a signal while the mount is busy, 100 ms apart.
const UNMOUNT_TRIES: u32 = 50;

/// Set once this process asked for its own unmount (a signal, or
/// [`Mounted::unmount`]): the session's end is then expected.
static UNMOUNT_ASKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Longest wait for a new mount's first answer before start fails.
const READY_WITHIN: std::time::Duration = std::time::Duration::from_secs(30);

/// Waits until the mount at `mountpoint` answers a `statfs` (which the
/// kernel always sends to the daemon, after FUSE_INIT), so that readiness
/// (the parent's wait, systemd's `READY=1`) means the mount serves
/// requests. Errors: the `statfs` failed, or no answer within `within`
/// (the probing thread stays blocked in the wedged session).
fn wait_answering(mountpoint: &Path, within: std::time::Duration) -> anyhow::Result<()> {
    let (tx, rx) = std::sync::mpsc::channel();
    let path = mountpoint.to_path_buf();
    std::thread::Builder::new()
        .name("lakemount-ready".into())
        .spawn(move || {
            let _ = tx.send(statfs(&path));
        })
        .context("starting the readiness probe")?;
    match rx.recv_timeout(within) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(anyhow::anyhow!(
            "the new mount at {} did not answer statfs: {e}",
            mountpoint.display()
        )),
        Err(_) => Err(anyhow::anyhow!(
            "the new mount at {} did not answer statfs within {} s",
            mountpoint.display(),
            within.as_secs()
        )),
    }
}

/// A mounted file system served by its own threads: FUSE session threads
/// plus a tokio runtime. Unmounts on [`Mounted::unmount`] or drop. The
/// embedded demo and the CLI both use it.
pub struct Mounted {
    /// The control socket and metrics endpoint (stopped at unmount).
    control: Option<telemetry::control::Control>,
    session_thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
    unmounter: Option<fuser::SessionUnmounter>,
    extra_unmounter: Option<fuser::SessionUnmounter>,
    rt: Option<tokio::runtime::Runtime>,
    mountpoint: std::path::PathBuf,
    cache: Option<Arc<Cache>>,
    /// The write path of a writable mount, and how long unmount waits for
    /// its uploads.
    writes: Option<(Arc<crate::write::Writes<S3Store>>, std::time::Duration)>,
    /// The runtime uploads run on (writable mounts).
    upload_rt: Option<tokio::runtime::Runtime>,
}

/// Longest wait at unmount for blocks still queued for the disk cache, and for
/// the seal of objects they complete (an fdatasync of the whole data file),
/// seconds. At most `MAX_PENDING_BYTES` (1 GiB) are queued: at a few hundred
/// MiB/s of local disk this is seconds; past it the rest is dropped (the next
/// mount fetches those blocks again).
const CACHE_FLUSH_SECS: u64 = 60;

impl Mounted {
    /// Checks the bucket with one LIST, mounts `source` at `mountpoint` and
    /// starts serving. Returns once the mount is usable. Errors: one-line
    /// reasons (bucket missing, access denied, endpoint unreachable, mount failed).
    pub fn start(source: &Source, mountpoint: &Path, config: &Config) -> anyhow::Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(worker_threads())
            .thread_name("lakemount-rt")
            .enable_all()
            .build()
            .context("starting the async runtime")?;
        let store = rt.block_on(async {
            telemetry::metrics::install();
            // Whole read-ahead parts reuse their buffers; idle ones are at
            // most 1/8 of the budget, MAX_IDLE (64 MiB) at most.
            let pool = BufferPool::new(
                config.read.part_size as usize,
                (config.read.budget_bytes() / 8).min(MAX_IDLE as u64) as usize,
            );
            let mut s3 = config.s3.clone();
            let mut store = S3Store::new(&source.bucket, &s3).await?;
            let mut listed = probe_list(&store, source).await;
            // Signed for a region the server refused, and none was given:
            // the one its answer names.
            if s3.region.is_none()
                && let Err(StoreError::WrongRegion { expected, .. }) = &listed
            {
                info!(region = %expected,
                    "the bucket's region, as the server named it (--region {expected} saves this request)");
                s3.region = Some(expected.clone());
                store = S3Store::new(&source.bucket, &s3).await?;
                listed = probe_list(&store, source).await;
            }
            listed.map_err(|e| probe_failure(e, source, config, store.region()))?;
            anyhow::Ok(store.with_buffer_pool(pool))
        })?;
        let cache = {
            let _rt = rt.enter();
            Cache::open(&source.bucket, &config.cache)?
        };
        if let Some(c) = &cache {
            info!(
                dir = %c.disk().root().display(),
                block_size = c.block_size(),
                "data cache on"
            );
        }
        let listeners = telemetry::control::bind(mountpoint, config.telemetry.metrics_addr)?;
        let store = Arc::new(store);
        let upload_rt = if config.mount.read_only {
            None
        } else {
            Some(
                crate::write::upload_runtime(worker_threads(), config.write.upload_nice)
                    .context("starting the upload runtime")?,
            )
        };
        let writes = if let Some(up) = &upload_rt {
            let writes = open_writes(&store, source, config, up.handle().clone())?;
            let found = rt.block_on(writes.recover(&source.prefix))?;
            if found > 0 {
                info!(
                    files = found,
                    "staged files of a previous run found: uploading them"
                );
            }
            Some(writes)
        } else {
            None
        };
        let pending = writes.clone().map(|w| {
            let wait = std::time::Duration::from_secs_f64(config.write.shutdown_wait_secs);
            (w, wait)
        });
        let fs = Arc::new(
            Fs::new(
                store,
                &source.prefix,
                &config.mount,
                config.metadata.clone(),
                config.read.clone(),
            )
            .with_cache(cache.clone())
            .with_writes(writes),
        );
        if config.metadata.prefetch_tree {
            let fs = fs.clone();
            rt.spawn(async move {
                let start = std::time::Instant::now();
                match fs.prefetch_tree().await {
                    Ok(n) => info!(
                        objects = n.objects,
                        list_pages = n.pages,
                        key_ranges = n.ranges,
                        depth_pages = n.depth,
                        secs = start.elapsed().as_secs_f64(),
                        "tree listed"
                    ),
                    Err(e) => {
                        warn!("listing the whole tree failed: {e}; directories list on demand")
                    }
                }
            });
        }
        let passthrough = crate::fs::Passthrough {
            cached: config.cache.dir.is_some() && config.cache.passthrough,
            staged: !config.mount.read_only && config.write.passthrough,
        };
        // Without opens the kernel is never told of passthrough or direct I/O.
        let no_open = config.read.no_open;
        let (passthrough, direct_io_min_size) = if no_open {
            (crate::fs::Passthrough::default(), 0)
        } else {
            (passthrough, config.read.direct_io_min_size)
        };
        let adapter = FuseFs::new(
            fs,
            rt.handle().clone(),
            passthrough,
            direct_io_min_size,
            config.mount.fuse_threads,
            no_open,
        );
        let notifier = adapter.notifier_slot();
        KERNEL_MOUNT_STARTED.store(true, std::sync::atomic::Ordering::SeqCst);
        let mut session = fuser::Session::new(adapter, mountpoint, &fuse_config(source, config))
            .with_context(|| format!("mounting at {}", mountpoint.display()))?;
        let _ = notifier.set(session.notifier());
        let unmounter = session.unmount_callable();
        let extra_unmounter = session.unmount_callable();
        let session_thread = std::thread::Builder::new()
            .name("fuse-session".into())
            .spawn(move || session.run())
            .context("starting the FUSE session thread")?;
        info!(
            bucket = %source.bucket,
            prefix = %source.prefix,
            mountpoint = %mountpoint.display(),
            mode = if config.mount.read_only { "read-only" } else { "read-write" },
            "mounted"
        );
        if config.read.kernel_read_ahead > 0 {
            set_kernel_read_ahead(mountpoint, config.read.kernel_read_ahead);
        }
        telemetry::metrics::register_alarm_series(cache.is_some(), !config.mount.read_only);
        let info = telemetry::stats::MountInfo {
            mountpoint: mountpoint.display().to_string(),
            bucket: source.bucket.clone(),
            prefix: source.prefix.clone(),
            read_only: config.mount.read_only,
            cache_dir: config.cache.dir.as_ref().map(|d| d.display().to_string()),
            memory_budget_bytes: config.read.budget_bytes(),
            version: env!("CARGO_PKG_VERSION"),
            pid: std::process::id(),
        };
        // Mounted already: a control endpoint that cannot start is not worth
        // failing the mount for.
        let control = telemetry::control::start(rt.handle(), listeners, mountpoint, info)
            .map_err(|e| warn!("control endpoint not started: {e:#}"))
            .ok();
        Ok(Self {
            control,
            session_thread: Some(session_thread),
            unmounter: Some(unmounter),
            extra_unmounter: Some(extra_unmounter),
            rt: Some(rt),
            mountpoint: mountpoint.to_path_buf(),
            cache,
            writes: pending,
            upload_rt,
        })
    }

    /// The runtime serving requests.
    pub fn runtime(&self) -> &tokio::runtime::Runtime {
        self.rt.as_ref().expect("runtime lives until drop")
    }

    /// A second handle that unmounts (for a signal handler). Only one is given out.
    pub fn unmounter(&mut self) -> anyhow::Result<fuser::SessionUnmounter> {
        self.extra_unmounter
            .take()
            .ok_or_else(|| anyhow::anyhow!("the extra unmounter was already taken"))
    }

    /// Waits until the file system is unmounted (by `umount`, a signal handler,
    /// or [`Mounted::unmount`] elsewhere), then logs the S3 request counts.
    pub fn wait(mut self) -> anyhow::Result<()> {
        self.join()
    }

    /// Unmounts and waits for the session to end.
    pub fn unmount(mut self) -> anyhow::Result<()> {
        UNMOUNT_ASKED.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(mut u) = self.unmounter.take() {
            u.unmount()
                .with_context(|| format!("unmounting {}", self.mountpoint.display()))?;
        }
        self.join()
    }

    fn join(&mut self) -> anyhow::Result<()> {
        let Some(thread) = self.session_thread.take() else {
            return Ok(());
        };
        let served = thread
            .join()
            .map_err(|_| anyhow::anyhow!("FUSE session thread panicked"))?;
        drop(self.control.take());
        if let (Some((w, wait)), Some(rt)) = (self.writes.take(), &self.rt) {
            // Every handle is closed now: upload what is staged, for a while.
            let left = rt.block_on(w.upload_all(wait));
            if left.staged > 0 {
                warn!(
                    files = left.staged,
                    dir = %w.staging().dir().display(),
                    "unmounted with staged files not yet in S3: they stay in staging and \
                     are uploaded at the next start"
                );
            }
            if left.uncached > 0 {
                info!(
                    files = left.uncached,
                    "unmounted before every uploaded file was copied into the data cache: \
                     the next mount reads those from S3"
                );
            }
        }
        if let Some(up) = self.upload_rt.take() {
            up.shutdown_timeout(std::time::Duration::from_secs(2));
        }
        for line in telemetry::metrics::s3_request_summary() {
            info!("{line}");
        }
        if let Some(cache) = self.cache.take() {
            // Blocks fetched in the last seconds are still being written: let
            // them land (and complete objects be sealed), so the next mount
            // finds them.
            let left = cache
                .disk()
                .flush(std::time::Duration::from_secs(CACHE_FLUSH_SECS));
            if left > 0 {
                warn!(
                    "unmounted with {} of blocks not yet written to the data cache \
                     (the next mount fetches them again)",
                    crate::cache::human(left)
                );
            }
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(std::time::Duration::from_secs(2));
        }
        match served {
            // Requests still in flight when the unmount was asked for can
            // leave the kernel's side aborted rather than closed: the
            // session read then fails with ECONNABORTED instead of ENODEV.
            Err(e)
                if e.kind() == std::io::ErrorKind::ConnectionAborted
                    && UNMOUNT_ASKED.load(std::sync::atomic::Ordering::SeqCst) =>
            {
                warn!("the FUSE connection ended aborted after the unmount was asked for: {e}");
            }
            other => other.context("FUSE session")?,
        }
        info!(mountpoint = %self.mountpoint.display(), "unmounted");
        Ok(())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.session_thread.is_some() {
            if let Some(mut u) = self.unmounter.take()
                && let Err(e) = u.unmount()
            {
                warn!("unmount of {} failed: {e}", self.mountpoint.display());
            }
            let _ = self.join();
        }
    }
}

/// Sets the mount's kernel read-ahead (`/sys/class/bdi/MAJOR:MINOR/read_ahead_kb`).
/// FUSE starts every mount at 128 KiB and offers no init option to raise it.
/// Needs root; otherwise logs a warning and leaves the default.
fn set_kernel_read_ahead(mountpoint: &Path, bytes: u64) {
    use std::os::unix::fs::MetadataExt;
    // The stat is answered by the session thread, which is running by now.
    let dev = match std::fs::metadata(mountpoint) {
        Ok(m) => m.dev(),
        Err(e) => {
            return warn!(
                "kernel read-ahead left unchanged: stat {}: {e}",
                mountpoint.display()
            );
        }
    };
    let path = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        libc::major(dev),
        libc::minor(dev)
    );
    match std::fs::write(&path, format!("{}\n", bytes.div_ceil(1024))) {
        Ok(()) => tracing::debug!(path, kib = bytes.div_ceil(1024), "kernel read-ahead set"),
        Err(e) => warn!("kernel read-ahead left at the FUSE default: writing {path}: {e}"),
    }
}

/// The staging directory of a writable mount: `write.staging_dir`, else one
/// per bucket and prefix under `staging` in the cache directory, else under
/// `/var/tmp/lakemount/staging` (kept across reboots, so files not yet
/// uploaded are found again).
pub fn staging_dir(source: &Source, config: &Config) -> std::path::PathBuf {
    if let Some(d) = &config.write.staging_dir {
        return d.clone();
    }
    let mut d = match &config.cache.dir {
        Some(c) => c.join("staging"),
        None => Path::new("/var/tmp/lakemount/staging").to_path_buf(),
    };
    d.push(&source.bucket);
    let prefix = source.prefix.trim_end_matches('/');
    if !prefix.is_empty() {
        d.push(prefix.replace('/', "%2F"));
    }
    d
}

/// Opens staging and the write path of a writable mount.
fn open_writes(
    store: &Arc<S3Store>,
    source: &Source,
    config: &Config,
    upload_rt: tokio::runtime::Handle,
) -> anyhow::Result<Arc<crate::write::Writes<S3Store>>> {
    let dir = staging_dir(source, config);
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("write.staging_dir: cannot create {}", dir.display()))?;
    let total = crate::cache::statvfs(&dir).map_or(0, |(total, _)| total);
    let limit = config.write.staging_max_size.bytes(total);
    let origin = format!("s3://{}/{}", source.bucket, source.prefix);
    let staging = crate::write::Staging::open(&dir, &origin, limit)?;
    info!(dir = %dir.display(), limit_bytes = limit, "staging for writes");
    Ok(crate::write::Writes::new(
        store.clone(),
        staging,
        &config.write,
        upload_rt,
    ))
}

fn fuse_config(source: &Source, config: &Config) -> fuser::Config {
    let mut options = vec![
        MountOption::FSName(format!("lakemount:{}/{}", source.bucket, source.prefix)),
        MountOption::Subtype("lakemount".into()),
        if config.mount.read_only {
            MountOption::RO
        } else {
            MountOption::RW
        },
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::NoAtime,
    ];
    if config.mount.allow_other {
        options.push(MountOption::CUSTOM("allow_other".into()));
    }
    let mut fuse_config = fuser::Config::default();
    fuse_config.mount_options = options;
    fuse_config.acl = if config.mount.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    fuse_config.n_threads = Some(config.mount.fuse_threads);
    fuse_config.clone_fd = true;
    fuse_config
}

/// One ListObjectsV2 of at most one key under the prefix: proves the endpoint
/// answers, the bucket exists and listing is allowed, before mounting (an
/// empty answer is warned about). Errors: the store's.
async fn probe_list(store: &S3Store, source: &Source) -> Result<(), StoreError> {
    let page = store
        .list_page(&source.prefix, Some("/"), None, None, 1)
        .await?;
    if page.objects.is_empty() && page.common_prefixes.is_empty() {
        warn!(
            "s3://{}/{} holds no objects: the mount will be empty (is the prefix right?)",
            source.bucket, source.prefix
        );
    }
    Ok(())
}

/// Why the mount cannot start, from the error of [`probe_list`] with
/// requests signed for `region`: what failed and what to check.
fn probe_failure(err: StoreError, source: &Source, config: &Config, region: &str) -> anyhow::Error {
    let endpoint = config
        .s3
        .endpoint_url
        .clone()
        .unwrap_or_else(|| "AWS S3".to_string());
    match err {
        StoreError::NoSuchBucket => {
            anyhow::anyhow!("bucket {:?} does not exist at {endpoint}", source.bucket)
        }
        // A 404 without S3's NoSuchBucket code: often not an S3 endpoint at all.
        StoreError::ListNotFound(_) => anyhow::anyhow!(
            "{endpoint} answered 404 Not Found to ListObjectsV2 of bucket {:?}, without the S3 \
             error code NoSuchBucket: check that it is an S3 endpoint (--endpoint-url) and the \
             bucket name",
            source.bucket
        ),
        StoreError::NoCredentials(m) => anyhow::anyhow!(
            "no AWS credentials found for {endpoint} (looked in AWS_ACCESS_KEY_ID/\
             AWS_SECRET_ACCESS_KEY, the shared profile, web identity, instance metadata: {m}); \
             set them, pass --profile, or use --no-sign-request for a public bucket"
        ),
        StoreError::AccessDenied(m) if config.s3.no_sign_request => anyhow::anyhow!(
            "access denied listing s3://{}/{} at {endpoint} with unsigned requests \
             (--no-sign-request) ({m}): the bucket is not public; drop --no-sign-request and \
             give credentials",
            source.bucket,
            source.prefix
        ),
        StoreError::AccessDenied(m) => anyhow::anyhow!(
            "access denied listing s3://{}/{} at {endpoint} ({m}); check the credentials \
             (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, --profile) or use --no-sign-request \
             for a public bucket",
            source.bucket,
            source.prefix
        ),
        StoreError::Transient(m) if m.starts_with("loading AWS credentials") => {
            anyhow::anyhow!(
                "{m} (listing s3://{}/{} at {endpoint})",
                source.bucket,
                source.prefix
            )
        }
        StoreError::Transient(m) | StoreError::Throttled(m) => {
            anyhow::anyhow!("cannot reach S3 endpoint {endpoint}: {m}")
        }
        // An answer that is no S3 answer at all: another service on that port.
        StoreError::Other(m) if m.contains("no S3 error code") => anyhow::anyhow!(
            "listing s3://{}/{} at {endpoint}: {m}: check that it is an S3 endpoint \
             (--endpoint-url)",
            source.bucket,
            source.prefix
        ),
        StoreError::WrongRegion { expected, message } if expected != region => anyhow::anyhow!(
            "listing s3://{}/{} at {endpoint}: the server expects requests signed for region \
             {expected:?}, not {region:?} ({message}): set --region {expected} (or [s3] region)",
            source.bucket,
            source.prefix,
        ),
        e => anyhow::anyhow!(
            "listing s3://{}/{} at {endpoint}: {e}",
            source.bucket,
            source.prefix
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::{mount_at, unescape_mountinfo};

    #[test]
    fn the_device_of_a_mount_point_is_found_and_of_other_paths_not() {
        let root = mount_at(std::path::Path::new("/")).expect("/ is mounted");
        assert!(root.dev.contains(':'), "{}", root.dev);
        assert!(mount_at(std::path::Path::new("/no/such/mount")).is_none());
    }

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape_mountinfo(r"/mnt/ai\040data"), "/mnt/ai data");
        assert_eq!(unescape_mountinfo(r"/a\134b\011c"), "/a\\b\tc");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
        assert_eq!(unescape_mountinfo(r"/odd\9"), r"/odd\9");
    }
}
