//! Fixture for end-to-end tests: one in-process S3 server per test binary, and
//! the real `lakemount` binary mounting a bucket of it through real FUSE.
#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub use lakemount_testserver::{ACCESS_KEY, SECRET_KEY, TestServer};

/// The server shared by every test of one test binary.
pub fn server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| TestServer::start_background().expect("start test S3 server"))
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A fresh, empty bucket with a name unique in this process.
pub fn bucket(tag: &str) -> String {
    let tag: String = tag
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(40)
        .collect();
    let name = format!("t-{tag}-{}", NEXT.fetch_add(1, Ordering::Relaxed));
    server().create_bucket(&name);
    name
}

/// A scratch directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// Creates `/tmp/lakemount-test-<pid>-<n>-<tag>`.
    pub fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!(
            "lakemount-test-{}-{}-{tag}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The `lakemount` binary under test.
pub fn lakemount_bin() -> &'static str {
    env!("CARGO_BIN_EXE_lakemount")
}

/// Copies the `lakemount` binary to `to`, and returns once it can be run.
/// A test thread forking while the copy's file is open hands the write
/// descriptor to its child until that child execs, and an exec of the
/// copy fails with ETXTBSY meanwhile: this runs the copy until it starts.
pub fn copy_lakemount_bin(to: &Path) {
    std::fs::copy(lakemount_bin(), to).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let run = Command::new(to)
            .arg("--help")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        match run {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                assert!(Instant::now() < deadline, "{} stays busy", to.display());
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("running {}: {e}", to.display()),
            Ok(_) => return,
        }
    }
}

/// A `lakemount` command with the test server's endpoint and credentials.
pub fn lakemount_cmd(endpoint: &str) -> Command {
    let mut cmd = Command::new(lakemount_bin());
    cmd.env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("LAKEMOUNT_ENDPOINT_URL", endpoint)
        .env("RUST_LOG", "lakemount=debug,fuser=warn,info")
        .env_remove("LAKEMOUNT_CONFIG");
    cmd
}

/// Whether `path` is a mount point now (per /proc/self/mountinfo).
pub fn is_mounted(path: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let want = path.to_str().unwrap();
    info.lines().any(|l| l.split(' ').nth(4) == Some(want))
}

/// A fresh, empty bucket on `server` (e.g. a private server of one test).
pub fn bucket_on(server: &TestServer, tag: &str) -> String {
    let name = format!("t-{tag}-{}", NEXT.fetch_add(1, Ordering::Relaxed));
    server.create_bucket(&name);
    name
}

/// A server of its own, for a test whose hooks are global to a server
/// (`fail_next`, `request_count`) and must not touch tests running in parallel.
/// Drop the [`Mount`] before the server (declare the server first).
pub fn private_server() -> TestServer {
    TestServer::start_background().expect("start private test S3 server")
}

/// How to mount: which server, source, config file text, extra arguments and
/// environment. `Mount::new` / `Mount::with_source` cover the common case.
pub struct MountSpec<'a> {
    server: &'a TestServer,
    bucket: String,
    source: String,
    config: Option<String>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    unset: Vec<String>,
}

impl<'a> MountSpec<'a> {
    /// `s3://bucket` on the shared server, no config file, no extra arguments.
    pub fn new(bucket: &str) -> MountSpec<'static> {
        MountSpec {
            server: server(),
            bucket: bucket.to_string(),
            source: format!("s3://{bucket}"),
            config: None,
            args: Vec::new(),
            env: Vec::new(),
            unset: Vec::new(),
        }
    }

    /// Mounts from `server` instead of the shared one.
    pub fn server<'b>(self, server: &'b TestServer) -> MountSpec<'b> {
        MountSpec {
            server,
            bucket: self.bucket,
            source: self.source,
            config: self.config,
            args: self.args,
            env: self.env,
            unset: self.unset,
        }
    }

    /// Mounts `source` (e.g. `s3://bucket/prefix`).
    pub fn source(mut self, source: &str) -> Self {
        self.source = source.to_string();
        self
    }

    /// Passes `--config FILE` with this TOML text.
    pub fn config(mut self, toml: &str) -> Self {
        self.config = Some(toml.to_string());
        self
    }

    /// Extra command-line arguments.
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// An environment variable of the daemon.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// An environment variable the daemon does not get (e.g. the test
    /// credentials, for another credentials source).
    pub fn unset_env(mut self, key: &str) -> Self {
        self.unset.push(key.to_string());
        self
    }

    /// Starts `lakemount mount` and waits until the mount is usable.
    /// Panics with the daemon's log when it does not come up in 20 s.
    pub fn mount(self) -> Mount {
        let dir = TempDir::new("mnt");
        let mnt = dir.0.join("m");
        std::fs::create_dir(&mnt).unwrap();
        let log = dir.0.join("lakemount.log");
        let mut cmd = lakemount_cmd(&self.server.endpoint());
        cmd.arg("mount").arg(&self.source).arg(&mnt);
        if let Some(text) = &self.config {
            let file = dir.0.join("lakemount.toml");
            std::fs::write(&file, text).unwrap();
            cmd.arg("--config").arg(file);
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        for k in &self.unset {
            cmd.env_remove(k);
        }
        // The default cache.min_free reserve (5% of the file system) turns
        // the disk cache off on a full enough host; tests that test the
        // reserve set it themselves.
        let sets_reserve = self.args.iter().any(|a| a.contains("min_free"))
            || self
                .config
                .as_deref()
                .is_some_and(|c| c.contains("min_free"));
        if self.args.iter().any(|a| a == "--cache-dir") && !sets_reserve {
            cmd.args(["-o", "cache.min_free=0"]);
        }
        let child = cmd
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn lakemount");
        let mut m = Mount {
            bucket: self.bucket,
            dir,
            child: Some(child),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !is_mounted(&m.path()) {
            if let Some(status) = m.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "lakemount exited with {status} before mounting:\n{}",
                    m.log()
                );
            }
            assert!(Instant::now() < deadline, "mount timed out:\n{}", m.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        m
    }
}

/// A running `lakemount mount` process and its mount point.
pub struct Mount {
    pub bucket: String,
    pub dir: TempDir,
    pub child: Option<Child>,
    log: PathBuf,
}

impl Mount {
    /// Mounts `s3://bucket` (plus `extra` arguments) and waits until usable.
    pub fn new(bucket: &str, extra: &[&str]) -> Self {
        MountSpec::new(bucket).args(extra).mount()
    }

    /// Mounts `source` (e.g. `s3://bucket/prefix`) and waits until usable.
    /// Panics with the daemon's log when it does not come up in 20 s.
    pub fn with_source(bucket: &str, source: &str, extra: &[&str]) -> Self {
        MountSpec::new(bucket).source(source).args(extra).mount()
    }

    /// The mount point.
    pub fn path(&self) -> PathBuf {
        self.dir.0.join("m")
    }

    /// `path()/rel`.
    pub fn p(&self, rel: &str) -> PathBuf {
        self.path().join(rel)
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    /// Sends SIGTERM and waits for exit; returns the exit status and the log.
    pub fn stop(&mut self) -> (std::process::ExitStatus, String) {
        let mut child = self.child.take().expect("running");
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return (status, self.log());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = Command::new("umount").arg("-l").arg(self.path()).status();
                let status = child.wait().unwrap();
                if std::thread::panicking() {
                    // Already failing (perhaps with a file still open on the
                    // mount): a second panic would abort every test of the binary.
                    return (status, self.log());
                }
                panic!("lakemount did not exit on SIGTERM:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.child.is_some() {
            let (status, log) = self.stop();
            if !std::thread::panicking() {
                assert!(status.success(), "lakemount exited with {status}:\n{log}");
            }
        }
        if is_mounted(&self.path()) {
            let _ = Command::new("umount").arg("-l").arg(self.path()).status();
        }
    }
}

/// Deterministic pseudo-random bytes (xorshift), different per `seed`.
pub fn data(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Most entries a test directory holds; a readdir that yields more is looping.
pub const MAX_TEST_DIR_ENTRIES: usize = 100_000;

/// Names in a directory in readdir order (without `.` and `..`). Panics when
/// the stream yields more than [`MAX_TEST_DIR_ENTRIES`], so a readdir that
/// never ends fails the test instead of hanging it.
pub fn readdir_names(dir: &Path) -> Vec<String> {
    let v: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .take(MAX_TEST_DIR_ENTRIES + 1)
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        v.len() <= MAX_TEST_DIR_ENTRIES,
        "readdir of {} does not end",
        dir.display()
    );
    v
}

/// Sorted names in a directory (via readdir).
pub fn names(dir: &Path) -> Vec<String> {
    let mut v = readdir_names(dir);
    v.sort();
    v
}

/// The errno of an io::Error.
pub fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

/// The errno of a failed operation; panics (with `what`) when it succeeded.
pub fn err_of<T: std::fmt::Debug>(r: std::io::Result<T>, what: &str) -> i32 {
    match r {
        Ok(v) => panic!("{what}: expected an error, got Ok({v:?})"),
        Err(e) => errno(&e),
    }
}

/// Name of an errno value, for readable assertion messages.
pub fn errno_name(e: i32) -> String {
    std::io::Error::from_raw_os_error(e).to_string()
}

/// Asserts `r` failed with errno `want`.
#[track_caller]
pub fn assert_errno<T: std::fmt::Debug>(r: std::io::Result<T>, want: i32, what: &str) {
    let got = err_of(r, what);
    assert_eq!(
        got,
        want,
        "{what}: got {} ({got}), want {} ({want})",
        errno_name(got),
        errno_name(want)
    );
}

/// Polls `f` every 50 ms until it returns true or `limit` passes; returns the
/// time it took, or `None` on timeout.
pub fn wait_for(limit: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    loop {
        if f() {
            return Some(start.elapsed());
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A free TCP port on 127.0.0.1 (bound and released; fine for tests).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The body of `GET /metrics` from a mount's Prometheus endpoint at `addr`.
pub fn scrape(addr: &str) -> String {
    use std::io::Write;
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        conn,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut body = String::new();
    conn.read_to_string(&mut body).unwrap();
    body
}

/// The value of metric line `name` (with its labels, if any) in `body`; 0
/// when absent.
pub fn metric(body: &str, name: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The bytes of a shared read-only mmap of all of `f` (`len` bytes).
pub fn mmap_read(f: &std::fs::File, len: usize) -> Vec<u8> {
    use std::os::fd::AsRawFd;
    // SAFETY: a fresh read-only shared mapping of `len` bytes of an open
    // file, copied out and unmapped before returning.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(
            p,
            libc::MAP_FAILED,
            "mmap: {}",
            std::io::Error::last_os_error()
        );
        let copy = std::slice::from_raw_parts(p as *const u8, len).to_vec();
        assert_eq!(libc::munmap(p, len), 0);
        copy
    }
}

/// Drops the page cache of the file at `path` (so its next read reaches
/// lakemount).
pub fn drop_page_cache(path: &Path) {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: posix_fadvise(2) on an open descriptor.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(r, 0, "posix_fadvise");
}

/// Reads every file of `files` through `m` with 4 threads; the names of
/// those that failed or differ.
pub fn read_all_4(m: &Mount, files: &[(String, Vec<u8>)]) -> Vec<String> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|t| {
                s.spawn(move || {
                    let mut bad = Vec::new();
                    for (k, d) in files.iter().skip(t).step_by(4) {
                        match std::fs::read(m.p(k)) {
                            Ok(got) if got == *d => {}
                            Ok(got) => bad.push(format!("{k}: {} bytes, wrong", got.len())),
                            Err(e) => bad.push(format!("{k}: {e}")),
                        }
                    }
                    bad
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    })
}

/// `GET path` from a mount's HTTP endpoint at `addr`: the status code and the
/// whole response (headers and body).
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::Write;
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    conn.read_to_string(&mut text).unwrap();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}
