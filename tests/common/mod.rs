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
        Self::with_source(bucket, &format!("s3://{bucket}"), extra)
    }

    /// Mounts `source` (e.g. `s3://bucket/prefix`) and waits until usable.
    /// Panics with the daemon's log when it does not come up in 20 s.
    pub fn with_source(bucket: &str, source: &str, extra: &[&str]) -> Self {
        let dir = TempDir::new("mnt");
        let mnt = dir.0.join("m");
        std::fs::create_dir(&mnt).unwrap();
        let log = dir.0.join("lakemount.log");
        let child = lakemount_cmd(&server().endpoint())
            .arg("mount")
            .arg(source)
            .arg(&mnt)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn lakemount");
        let mut m = Self {
            bucket: bucket.to_string(),
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

/// Sorted names in a directory (via readdir).
pub fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

/// The errno of an io::Error.
pub fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}
