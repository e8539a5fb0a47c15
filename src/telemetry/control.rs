//! The control endpoint of a running mount: a small HTTP/1.1 server on the
//! mount's control socket (always) and on `telemetry.metrics_addr` (when set).
//!
//! - `GET /metrics`: the Prometheus text of every metric.
//! - `GET /stats`: the JSON of [`super::stats::stats`] (`lakemount stats`);
//!   on the control socket only (it names buckets, paths and the pid).
//! - `GET /healthz`: 200 while the FUSE session answers (a `statfs` of the mount
//!   point, which the kernel always sends to the daemon, succeeded within the
//!   last [`HEALTHY_WITHIN`]); 503 with the reason otherwise.
//! - `GET /readyz`: as `/healthz`, and 503 until the first probe succeeded.
//!
//! The socket is `/run/lakemount/<mount point, systemd-escaped>.sock` for root,
//! `$XDG_RUNTIME_DIR/lakemount/...` (else `/tmp/lakemount-<uid>/...`) for other
//! users: [`socket_path`], so `lakemount stats MOUNTPOINT` finds it from the
//! mount point alone. Mode 0600: the daemon's user (root, usually) only.

use std::convert::Infallible;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};

use super::stats::MountInfo;

/// Time between two health probes.
const PROBE_EVERY: Duration = Duration::from_secs(5);
/// A mount is healthy while a probe succeeded this recently: three probes,
/// so one slow answer under load is not a failure.
pub const HEALTHY_WITHIN: Duration = Duration::from_secs(15);
/// `sun_path` of `struct sockaddr_un` is 108 bytes with its NUL (unix(7)).
const SUN_PATH_MAX: usize = 107;

/// The control socket of the mount at `mountpoint` (absolute, or relative to
/// the current directory; symlinks in its parent resolved when it exists).
pub fn socket_path(mountpoint: &Path) -> PathBuf {
    let dir = runtime_dir().join("lakemount");
    let name = escape(&canonical(mountpoint));
    let path = dir.join(format!("{name}.sock"));
    if path.as_os_str().len() <= SUN_PATH_MAX {
        return path;
    }
    // Too long for a socket address: a digest of the path instead.
    use sha2::Digest;
    let digest = sha2::Sha256::digest(canonical(mountpoint).as_os_str().as_encoded_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    dir.join(format!("mnt-{hex}.sock"))
}

/// The mount point holding `p` (`p` itself, or the last ancestor on the same
/// device), so that a directory inside a mount finds the mount's socket.
pub fn mount_root(p: &Path) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let Ok(mut cur) = std::fs::canonicalize(p) else {
        return p.to_path_buf();
    };
    let Ok(dev) = std::fs::metadata(&cur).map(|m| m.dev()) else {
        return cur;
    };
    while let Some(parent) = cur.parent() {
        match std::fs::metadata(parent) {
            Ok(m) if m.dev() == dev => cur = parent.to_path_buf(),
            _ => break,
        }
    }
    cur
}

/// `/run` for root, `$XDG_RUNTIME_DIR` or `/tmp/lakemount-<uid>` otherwise.
fn runtime_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        return PathBuf::from("/run");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(format!("/tmp/lakemount-{uid}")),
    }
}

/// The absolute mount point with its parent's symlinks resolved (the mount
/// point itself is not touched: a dead FUSE mount answers ENOTCONN).
fn canonical(p: &Path) -> PathBuf {
    let abs = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    match (abs.parent(), abs.file_name()) {
        (Some(parent), Some(name)) => std::fs::canonicalize(parent)
            .unwrap_or_else(|_| parent.to_path_buf())
            .join(name),
        _ => abs,
    }
}

/// systemd's path escaping (`systemd-escape --path`): `/mnt/ai-data` becomes
/// `mnt-ai\x2ddata`, `/` becomes `-`.
pub fn escape(p: &Path) -> String {
    let s = p.as_os_str().as_encoded_bytes();
    let trimmed: Vec<&[u8]> = s.split(|b| *b == b'/').filter(|c| !c.is_empty()).collect();
    if trimmed.is_empty() {
        return "-".into();
    }
    let mut out = String::new();
    for (i, comp) in trimmed.iter().enumerate() {
        if i > 0 {
            out.push('-');
        }
        for (j, &b) in comp.iter().enumerate() {
            let plain = b.is_ascii_alphanumeric()
                || b == b':'
                || b == b'_'
                || (b == b'.' && (i > 0 || j > 0));
            if plain {
                out.push(b as char);
            } else {
                out.push_str(&format!("\\x{b:02x}"));
            }
        }
    }
    out
}

/// Health of the FUSE session as the prober last saw it.
struct Health {
    started: Instant,
    /// Milliseconds after `started` of the last successful probe, 0: none yet.
    last_ok_ms: AtomicU64,
    /// The last probe's error, for the 503 body.
    last_error: std::sync::Mutex<Option<String>>,
    stop: AtomicBool,
}

impl Health {
    /// `Ok` when healthy (and, with `ready`, probed at least once), else the reason.
    fn check(&self, ready: bool) -> Result<(), String> {
        let last = self.last_ok_ms.load(Ordering::Relaxed);
        let now = self.started.elapsed();
        if last == 0 {
            if ready || now > HEALTHY_WITHIN {
                return Err(self.reason("the mount has not answered a probe yet"));
            }
            return Ok(());
        }
        let age = now.saturating_sub(Duration::from_millis(last));
        if age > HEALTHY_WITHIN {
            return Err(self.reason(&format!(
                "the mount has not answered statfs for {:.0} s",
                age.as_secs_f64()
            )));
        }
        Ok(())
    }

    fn reason(&self, what: &str) -> String {
        match &*self.last_error.lock().unwrap() {
            Some(e) => format!("{what} (last error: {e})"),
            None => what.to_string(),
        }
    }
}

/// A running control endpoint. Dropping it stops the prober and removes the
/// socket file.
pub struct Control {
    socket: PathBuf,
    /// (dev, ino) of the socket file this process bound: only that file is
    /// removed at drop, not a newer daemon's at the same path (a lazily
    /// unmounted session that ends after the next mount started).
    socket_id: Option<(u64, u64)>,
    health: Arc<Health>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Listeners bound before mounting, so a taken address fails the mount early.
/// Dropped unused (the mount failed), it removes the socket file.
pub struct Listeners {
    unix: Option<std::os::unix::net::UnixListener>,
    socket: PathBuf,
    socket_id: Option<(u64, u64)>,
    tcp: Option<std::net::TcpListener>,
}

impl Drop for Listeners {
    fn drop(&mut self) {
        if self.unix.is_some() {
            remove_own(&self.socket, self.socket_id);
        }
    }
}

/// (dev, ino) of the file at `p`.
fn file_id(p: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(p)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// Removes the socket file at `p` if it is still the one bound (`id`).
fn remove_own(p: &Path, id: Option<(u64, u64)>) {
    if id.is_some() && file_id(p) == id {
        let _ = std::fs::remove_file(p);
    }
}

/// Binds the control socket of `mountpoint` and, with `tcp`, that address.
/// Errors: the address is taken (names `telemetry.metrics_addr`), or the
/// socket's directory cannot be created.
pub fn bind(mountpoint: &Path, tcp: Option<std::net::SocketAddr>) -> anyhow::Result<Listeners> {
    let tcp = tcp
        .map(|a| {
            let l = std::net::TcpListener::bind(a)
                .with_context(|| format!("telemetry.metrics_addr: cannot listen on {a}"))?;
            l.set_nonblocking(true)?;
            anyhow::Ok(l)
        })
        .transpose()?;
    let socket = socket_path(mountpoint);
    let dir = socket.parent().expect("socket path has a directory");
    std::fs::create_dir_all(dir)
        .with_context(|| format!("control socket directory {}", dir.display()))?;
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755));
    // A socket left by a daemon that was killed: this process holds the mount
    // point now (a live mount there was refused before), so it is stale.
    let _ = std::fs::remove_file(&socket);
    let unix = std::os::unix::net::UnixListener::bind(&socket)
        .with_context(|| format!("control socket {}", socket.display()))?;
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))?;
    unix.set_nonblocking(true)?;
    let socket_id = file_id(&socket);
    Ok(Listeners {
        unix: Some(unix),
        socket_id,
        socket,
        tcp,
    })
}

/// Starts serving on `listeners` (on `rt`) and the health prober of
/// `mountpoint` (its own thread).
pub fn start(
    rt: &tokio::runtime::Handle,
    mut listeners: Listeners,
    mountpoint: &Path,
    info: MountInfo,
) -> anyhow::Result<Control> {
    let health = Arc::new(Health {
        started: Instant::now(),
        last_ok_ms: AtomicU64::new(0),
        last_error: std::sync::Mutex::new(None),
        stop: AtomicBool::new(false),
    });
    spawn_prober(mountpoint.to_path_buf(), health.clone())?;
    let state = Arc::new(State {
        info,
        started: Instant::now(),
        health: health.clone(),
    });
    let _rt = rt.enter();
    let mut tasks = Vec::new();
    let unix = listeners.unix.take().expect("bound in bind()");
    let socket = listeners.socket.clone();
    let socket_id = listeners.socket_id;
    let unix = tokio::net::UnixListener::from_std(unix)?;
    let st = state.clone();
    tasks.push(rt.spawn(async move {
        loop {
            match unix.accept().await {
                Ok((stream, _)) => serve(stream, st.clone(), true),
                Err(e) => {
                    tracing::warn!("control socket: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }));
    if let Some(tcp) = listeners.tcp.take() {
        let tcp = tokio::net::TcpListener::from_std(tcp)?;
        let st = state.clone();
        tasks.push(rt.spawn(async move {
            loop {
                match tcp.accept().await {
                    Ok((stream, _)) => serve(stream, st.clone(), false),
                    Err(e) => {
                        tracing::warn!("metrics endpoint: accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        }));
    }
    // Histogram samples are drained into summaries only by upkeep.
    tasks.push(rt.spawn(async {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            super::metrics::upkeep();
        }
    }));
    Ok(Control {
        socket,
        socket_id,
        health,
        tasks,
    })
}

impl Control {
    /// The control socket's path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        self.health.stop.store(true, Ordering::Relaxed);
        for t in &self.tasks {
            t.abort();
        }
        remove_own(&self.socket, self.socket_id);
    }
}

/// Probes the mount with `statfs` every [`PROBE_EVERY`]. A probe that hangs
/// (a wedged session) leaves `last_ok_ms` old, which is the failure signal.
fn spawn_prober(mountpoint: PathBuf, health: Arc<Health>) -> anyhow::Result<()> {
    let path = std::ffi::CString::new(mountpoint.as_os_str().as_encoded_bytes())
        .context("mount point contains a NUL byte")?;
    std::thread::Builder::new()
        .name("lakemount-health".into())
        .spawn(move || {
            while !health.stop.load(Ordering::Relaxed) {
                // SAFETY: `path` is NUL-terminated; `buf` is a valid statfs to fill.
                let mut buf: libc::statfs = unsafe { std::mem::zeroed() };
                let rc = unsafe { libc::statfs(path.as_ptr(), &mut buf) };
                if health.stop.load(Ordering::Relaxed) {
                    break;
                }
                if rc == 0 {
                    let ms = health.started.elapsed().as_millis().max(1) as u64;
                    health.last_ok_ms.store(ms, Ordering::Relaxed);
                } else {
                    let e = std::io::Error::last_os_error();
                    *health.last_error.lock().unwrap() = Some(format!("statfs: {e}"));
                }
                std::thread::sleep(PROBE_EVERY);
            }
        })
        .context("starting the health prober")?;
    Ok(())
}

struct State {
    info: MountInfo,
    started: Instant,
    health: Arc<Health>,
}

/// Serves one connection; `local` (the control socket) also gets `/stats`,
/// which names buckets, paths and the pid: not for a TCP port.
fn serve<IO>(stream: IO, state: Arc<State>, local: bool)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let svc = hyper::service::service_fn(move |req| {
            let state = state.clone();
            async move { Ok::<_, Infallible>(route(&req, &state, local)) }
        });
        let io = hyper_util::rt::TokioIo::new(stream);
        // A client that sends no request head in time is dropped, so idle
        // connections cannot pile up.
        let _ = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(Duration::from_secs(10))
            .serve_connection(io, svc)
            .await;
    });
}

fn route<B>(req: &Request<B>, state: &State, local: bool) -> Response<Full<Bytes>> {
    let text = |status: StatusCode, ctype: &'static str, body: String| {
        Response::builder()
            .status(status)
            .header(hyper::header::CONTENT_TYPE, ctype)
            .body(Full::new(Bytes::from(body)))
            .expect("static response parts")
    };
    if req.method() != hyper::Method::GET && req.method() != hyper::Method::HEAD {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".into(),
        );
    }
    let health = |ready: bool| match state.health.check(ready) {
        Ok(()) => text(StatusCode::OK, "text/plain", "ok\n".into()),
        Err(why) => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            format!("unhealthy: {why}\n"),
        ),
    };
    match req.uri().path() {
        "/metrics" => text(
            StatusCode::OK,
            "text/plain; version=0.0.4",
            super::metrics::render().unwrap_or_default(),
        ),
        "/stats" if local => {
            let v = super::stats::stats(
                &super::metrics::render().unwrap_or_default(),
                &state.info,
                state.started.elapsed().as_secs_f64(),
            );
            text(StatusCode::OK, "application/json", format!("{v}\n"))
        }
        "/healthz" => health(false),
        "/readyz" => health(true),
        "/stats" => text(
            StatusCode::NOT_FOUND,
            "text/plain",
            "/stats is served on the control socket only (it names buckets, paths and the \
             pid): `lakemount stats MOUNTPOINT`\n"
                .into(),
        ),
        _ => text(
            StatusCode::NOT_FOUND,
            "text/plain",
            if local {
                "not found; try /metrics, /stats, /healthz, /readyz\n"
            } else {
                "not found; try /metrics, /healthz, /readyz\n"
            }
            .into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_like_systemd() {
        assert_eq!(escape(Path::new("/mnt/ai-data")), "mnt-ai\\x2ddata");
        assert_eq!(escape(Path::new("/")), "-");
        assert_eq!(escape(Path::new("/a//b/.c")), "a-b-.c");
        assert_eq!(escape(Path::new("/.a")), "\\x2ea");
        assert_eq!(escape(Path::new("/x y")), "x\\x20y");
    }

    fn state(started_ago: Duration, last_ok_ago: Option<Duration>, error: Option<&str>) -> State {
        let now = Instant::now();
        let started = now - started_ago;
        let last_ok_ms = last_ok_ago.map_or(0, |ago| (started_ago - ago).as_millis() as u64);
        State {
            info: MountInfo {
                mountpoint: "/mnt/x".into(),
                bucket: "b".into(),
                prefix: String::new(),
                read_only: true,
                cache_dir: None,
                memory_budget_bytes: 0,
                version: "0",
                pid: 1,
            },
            started,
            health: Arc::new(Health {
                started,
                last_ok_ms: AtomicU64::new(last_ok_ms),
                last_error: std::sync::Mutex::new(error.map(String::from)),
                stop: AtomicBool::new(false),
            }),
        }
    }

    fn get(state: &State, path: &str) -> (StatusCode, String) {
        let req = Request::get(path).body(()).unwrap();
        let resp = route(&req, state, false);
        let status = resp.status();
        let body = resp.into_body();
        let bytes = futures::executor::block_on(http_body_util::BodyExt::collect(body))
            .unwrap()
            .to_bytes();
        (status, String::from_utf8(bytes.to_vec()).unwrap())
    }

    #[test]
    fn a_session_silent_past_the_window_is_unhealthy_with_its_last_error() {
        let s = state(
            Duration::from_secs(60),
            Some(HEALTHY_WITHIN + Duration::from_secs(5)),
            Some("statfs: Transport endpoint is not connected (os error 107)"),
        );
        for path in ["/healthz", "/readyz"] {
            let (status, body) = get(&s, path);
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{path}: {body}");
            assert!(body.contains("has not answered statfs for 20 s"), "{body}");
            assert!(body.contains("not connected"), "{body}");
        }
        // Within the window it is healthy, whatever an older probe said.
        let s = state(
            Duration::from_secs(60),
            Some(Duration::from_secs(5)),
            Some("old"),
        );
        assert_eq!(get(&s, "/healthz"), (StatusCode::OK, "ok\n".into()));
    }

    #[test]
    fn not_ready_before_the_first_probe_and_unhealthy_when_it_never_comes() {
        let fresh = state(Duration::from_secs(1), None, None);
        assert_eq!(get(&fresh, "/healthz").0, StatusCode::OK);
        let (status, body) = get(&fresh, "/readyz");
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("has not answered a probe yet"), "{body}");
        let stuck = state(HEALTHY_WITHIN + Duration::from_secs(1), None, None);
        assert_eq!(get(&stuck, "/healthz").0, StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn long_mount_points_get_a_digest() {
        let long = format!("/{}", "d".repeat(200));
        let p = socket_path(Path::new(&long));
        assert!(p.as_os_str().len() <= SUN_PATH_MAX, "{}", p.display());
        assert!(p.file_name().unwrap().to_str().unwrap().starts_with("mnt-"));
        assert_ne!(p, socket_path(Path::new(&format!("{long}e"))));
    }
}
