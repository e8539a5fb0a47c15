//! Operating a mount: `lakemount stats`, the health endpoint, the control
//! socket and systemd readiness, through a real mount of the test server.

mod common;

use std::os::unix::fs::FileTypeExt;
use std::process::Command;
use std::time::Duration;

use common::*;

/// `lakemount CMD MNT ARGS...` (a `--json` command), its output parsed;
/// panics with its stderr on failure.
fn json_of(cmd: &str, mnt: &std::path::Path, args: &[&str]) -> serde_json::Value {
    let out = Command::new(lakemount_bin())
        .arg(cmd)
        .arg(mnt)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("--json prints one JSON document")
}

/// `lakemount stats MNT --json`, parsed.
fn stats_json(mnt: &std::path::Path) -> serde_json::Value {
    json_of("stats", mnt, &["--json"])
}

/// Reads `path` whole after dropping its pages from the kernel page cache, so
/// the read reaches lakemount.
fn read_uncached(path: &std::path::Path) -> Vec<u8> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: fadvise on a descriptor we own.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    drop(f);
    std::fs::read(path).unwrap()
}

#[test]
fn stats_json_counts_a_known_read_exactly() {
    const LEN: usize = 3_000_000;
    let b = bucket("stats");
    server().put(&b, "shard.bin", data(LEN, 5));
    server().put(&b, "d/x", "x");
    let cache = TempDir::new("stats-cache");
    let m = MountSpec::new(&b)
        .args(&["--cache-dir", cache.0.to_str().unwrap()])
        // Passthrough reads never reach lakemount, and are in no byte count.
        .config("[cache]\npassthrough = false\n")
        .mount();
    assert_eq!(read_uncached(&m.p("shard.bin")), data(LEN, 5));
    let v = stats_json(&m.path());
    assert_eq!(v["mount"]["bucket"], b.as_str());
    assert_eq!(v["read"]["fuse_read_bytes"], LEN, "{v:#}");
    assert_eq!(v["read"]["s3_get_bytes"], LEN, "{v:#}");
    assert_eq!(v["read"]["served_bytes"]["s3"], LEN, "{v:#}");
    assert_eq!(v["read"]["hit_ratio"], 0.0, "{v:#}");
    assert!(v["s3"]["GET"]["requests"].as_u64().unwrap() >= 1, "{v:#}");
    assert_eq!(v["s3"]["GET"]["errors"], 0, "{v:#}");
    assert!(v["s3"]["GET"]["latency_secs"]["p50"].as_f64().unwrap() > 0.0);
    assert!(v["s3"]["GET"]["first_byte_secs"]["count"].as_f64().unwrap() >= 1.0);
    // A directory inside the mount finds the mount's daemon.
    assert_eq!(stats_json(&m.p("d"))["mount"]["bucket"], b.as_str());

    // The same bytes again come from the cache, none from S3.
    assert_eq!(read_uncached(&m.p("shard.bin")), data(LEN, 5));
    let w = stats_json(&m.path());
    let cached = w["read"]["served_bytes"]["memory"].as_u64().unwrap()
        + w["read"]["served_bytes"]["disk"].as_u64().unwrap();
    assert_eq!(w["read"]["fuse_read_bytes"], 2 * LEN, "{w:#}");
    assert_eq!(cached, LEN as u64, "{w:#}");
    assert_eq!(w["read"]["s3_get_bytes"], LEN, "{w:#}");
    assert_eq!(w["read"]["hit_ratio"], 0.5, "{w:#}");

    // The terminal view says the same.
    let out = Command::new(lakemount_bin())
        .arg("stats")
        .arg(m.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("cache hit ratio 50.0%"), "{text}");
    assert!(text.contains("S3 GET"), "{text}");
}

/// Small files a loader reads from the page cache lakemount filled at their
/// open count as read: the read requests' bytes and the fills' add up to
/// the files, none as read-ahead dropped unread; and once they are read and
/// closed the memory budget shows nothing in use, not what the last read
/// held.
#[test]
fn stats_count_page_cache_fills_as_read_and_memory_as_it_is() {
    let b = bucket("stats-fills");
    let n = 8;
    let len = 100_000;
    for i in 0..n {
        server().put(&b, &format!("d/{i}.jpg"), data(len, 40 + i as u64));
    }
    let m = MountSpec::new(&b).mount();
    for i in 0..n {
        assert_eq!(
            std::fs::read(m.p(&format!("d/{i}.jpg"))).unwrap(),
            data(len, 40 + i as u64)
        );
    }
    wait_for(Duration::from_secs(10), || {
        stats_json(&m.path())["read_ahead"]["memory_in_use_bytes"] == 0
    })
    .unwrap_or_else(|| panic!("memory still in use: {:#}", stats_json(&m.path())));
    let v = stats_json(&m.path());
    let r = &v["read"];
    let to_readers =
        r["fuse_read_bytes"].as_u64().unwrap() + r["page_cache_fill_bytes"].as_u64().unwrap();
    assert_eq!(to_readers, (n * len) as u64, "{v:#}");
    assert!(
        r["page_cache_fill_bytes"].as_u64().unwrap() > 0,
        "no fill: {v:#}"
    );
    assert_eq!(v["read_ahead"]["waste_bytes"], 0, "{v:#}");
}

/// The SDK's own retries (a LIST answered 503 once) count in the stats as
/// a GET's do; they used to show 0 for every request type but GET.
#[test]
fn stats_count_the_retries_of_listings_too() {
    let srv = private_server();
    let b = bucket_on(&srv, "stats-retries");
    srv.put(&b, "d/a", "x");
    let m = MountSpec::new(&b).server(&srv).mount();
    srv.fail_next("ListObjectsV2", 503, 1);
    assert_eq!(names(&m.p("d")), vec!["a"]);
    let v = stats_json(&m.path());
    assert_eq!(v["s3"]["LIST"]["retries"], 1.0, "{v:#}");
}

#[test]
fn stats_watch_refreshes_with_rates_and_ends_when_its_reader_goes() {
    use std::io::Read;
    const LEN: usize = 2_000_000;
    let b = bucket("stats-watch");
    server().put(&b, "a.bin", data(LEN, 6));
    let m = MountSpec::new(&b).mount();
    let mut child = Command::new(lakemount_bin())
        .arg("stats")
        .arg(m.path())
        .arg("--watch=0.2")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut text = String::new();
    let mut buf = [0u8; 4096];
    let mut read_done = false;
    // Screens start with the terminal clear; from the second on they carry
    // the rates since the one before.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while text.matches("\x1b[2J\x1b[H").count() < 3 || !text.contains("1.91 MiB by read requests") {
        assert!(std::time::Instant::now() < deadline, "{text}");
        let n = stdout.read(&mut buf).unwrap();
        assert!(n > 0, "stats --watch ended early: {text}");
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
        if !read_done && text.contains("rate ") {
            assert_eq!(read_uncached(&m.p("a.bin")), data(LEN, 6));
            read_done = true;
        }
    }
    let screens: Vec<&str> = text.split("\x1b[2J\x1b[H").skip(1).collect();
    assert!(!screens[0].contains("rate "), "{}", screens[0]);
    assert!(screens[1].contains("rate "), "{}", screens[1]);
    // The 2 MB read shows in a later screen's totals (the loop waited for it).
    assert!(read_done);
    // Its reader gone (as `stats --watch | head`), it ends quietly and well.
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn stats_of_a_path_that_is_not_a_mount_names_the_socket() {
    let dir = TempDir::new("not-a-mount");
    let out = Command::new(lakemount_bin())
        .arg("stats")
        .arg(&dir.0)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("no lakemount control socket answered at"),
        "{err}"
    );
    assert!(err.contains(".sock"), "{err}");
}

#[test]
fn health_endpoint_and_control_socket_live_as_long_as_the_mount() {
    let b = bucket("health");
    server().put(&b, "a", "x");
    let addr = format!("127.0.0.1:{}", free_port());
    let mut m = Mount::new(&b, &["--metrics-addr", &addr]);
    let (status, body) = http_get(&addr, "/healthz");
    assert_eq!(status, 200, "{body}");
    assert!(body.ends_with("ok\n"), "{body}");
    // Ready once the first statfs probe came back (it runs at start).
    let ready = wait_for(Duration::from_secs(10), || {
        http_get(&addr, "/readyz").0 == 200
    });
    assert!(ready.is_some(), "{}", http_get(&addr, "/readyz").1);
    let (status, body) = http_get(&addr, "/metrics");
    assert_eq!(status, 200);
    assert!(body.contains("lakemount_s3_requests_total"), "{body}");
    // /stats names buckets and paths: the control socket's only.
    let (status, body) = http_get(&addr, "/stats");
    assert_eq!(status, 404);
    assert!(body.contains("control socket only"), "{body}");
    assert!(!http_get(&addr, "/nope").1.contains("/stats"));
    assert_eq!(http_get(&addr, "/nope").0, 404);

    let socket = lakemount::telemetry::control::socket_path(&m.path());
    let meta = std::fs::metadata(&socket).expect("control socket exists while mounted");
    assert!(meta.file_type().is_socket());
    let (status, log) = m.stop();
    assert!(status.success(), "{log}");
    assert!(!socket.exists(), "control socket left after unmount");
    assert!(std::net::TcpStream::connect(&addr).is_err());
}

#[test]
fn systemd_hears_ready_once_mounted_and_stopping_at_sigterm() {
    let dir = TempDir::new("notify");
    let sock_path = dir.0.join("notify.sock");
    let sock = std::os::unix::net::UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let b = bucket("notify");
    server().put(&b, "a", "x");
    let mut m = MountSpec::new(&b)
        .env("NOTIFY_SOCKET", sock_path.to_str().unwrap())
        .mount();
    let mut buf = [0u8; 256];
    let n = sock.recv(&mut buf).expect("no READY=1 within 20 s");
    let msg = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(msg.lines().any(|l| l == "READY=1"), "{msg:?}");
    // READY=1 comes after the mount answers.
    assert_eq!(std::fs::read(m.p("a")).unwrap(), b"x");
    let (status, log) = m.stop();
    assert!(status.success(), "{log}");
    let n = sock.recv(&mut buf).expect("no STOPPING=1 at SIGTERM");
    let msg = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(msg.lines().any(|l| l == "STOPPING=1"), "{msg:?}");
}

/// Waits (10 s at most) for the daemon behind `mnt` to be gone after `umount`.
fn unmount_and_wait(mnt: &std::path::Path) {
    let st = Command::new("umount").arg(mnt).status().unwrap();
    assert!(st.success());
    let socket = lakemount::telemetry::control::socket_path(mnt);
    let gone = wait_for(Duration::from_secs(10), || !socket.exists());
    assert!(
        gone.is_some(),
        "the daemon of {} did not exit",
        mnt.display()
    );
}

#[test]
fn the_fstab_helper_mounts_in_the_background_and_umount_stops_it() {
    let b = bucket("fstab");
    server().put(&b, "d/a.bin", data(5000, 9));
    let dir = TempDir::new("fstab");
    let helper = dir.0.join(lakemount::fstab::HELPER_NAME);
    // A copy, not a symlink: the daemon child, re-executed from this very
    // file (named mount.lakemount), must not take itself for the helper.
    // (mount_8_runs_the_helper_for_an_fstab_line uses a symlink.)
    copy_lakemount_bin(&helper);
    let mnt = dir.0.join("m");
    std::fs::create_dir(&mnt).unwrap();
    let log = dir.0.join("log");
    // As mount(8) runs it for `s3://B DIR lakemount _netdev,... 0 0`.
    let opts = format!(
        "rw,_netdev,nofail,endpoint_url={},region=us-east-1,log_file={},metadata.ttl_secs=5,uid=1234",
        server().endpoint(),
        log.display()
    );
    let out = Command::new(&helper)
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .arg(format!("s3://{b}"))
        .arg(&mnt)
        .args(["-o", &opts])
        .output()
        .unwrap();
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        log_text()
    );
    // Returned only once mounted: no wait needed.
    assert!(is_mounted(&mnt), "{}", log_text());
    assert_eq!(std::fs::read(mnt.join("d/a.bin")).unwrap(), data(5000, 9));
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(mnt.join("d/a.bin")).unwrap().uid(), 1234);
    // `rw` (which mount(8) always passes) did not make it writable.
    let e = std::fs::write(mnt.join("new"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    unmount_and_wait(&mnt);
    assert!(log_text().contains("mounted"), "{}", log_text());

    // A bad option stops it before anything is mounted, naming the option.
    let out = Command::new(&helper)
        .arg(format!("s3://{b}"))
        .arg(&mnt)
        .args(["-o", "rw,frobnicate"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown option \"frobnicate\""), "{err}");
    assert!(!is_mounted(&mnt));
}

#[test]
fn mount_8_runs_the_helper_for_an_fstab_line() {
    // mount(8) looks for helpers in /sbin only: the test installs its symlink
    // there when no other mount.lakemount is installed.
    let installed = std::path::Path::new("/sbin").join(lakemount::fstab::HELPER_NAME);
    if let Ok(target) = std::fs::read_link(&installed) {
        assert_eq!(
            target,
            std::path::Path::new(lakemount_bin()),
            "another mount.lakemount is installed in /sbin"
        );
    } else {
        std::os::unix::fs::symlink(lakemount_bin(), &installed).unwrap();
    }
    struct Remove(std::path::PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _remove = Remove(installed);
    let b = bucket("fstab8");
    server().put(&b, "x", "hello");
    let dir = TempDir::new("fstab8");
    let mnt = dir.0.join("m");
    std::fs::create_dir(&mnt).unwrap();
    let fstab = dir.0.join("fstab");
    let log = dir.0.join("log");
    std::fs::write(
        &fstab,
        format!(
            "# test\ns3://{b} {} lakemount _netdev,nofail,endpoint_url={},region=us-east-1,log_file={} 0 0\n",
            mnt.display(),
            server().endpoint(),
            log.display()
        ),
    )
    .unwrap();
    let out = Command::new("mount")
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .arg("--fstab")
        .arg(&fstab)
        .arg(&mnt)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert_eq!(std::fs::read(mnt.join("x")).unwrap(), b"hello");
    unmount_and_wait(&mnt);
}

#[test]
fn the_fstab_helper_reads_a_root_profile_without_home() {
    // mount(8) gives its helpers no HOME. The helper must still find
    // root's ~/.aws/credentials: a private mount namespace puts an empty
    // tmpfs over /root holding just that profile, and the helper runs with
    // no environment but PATH, the whole mount's life in that namespace.
    let b = bucket("fstab-home");
    server().put(&b, "x", "from a profile");
    let dir = TempDir::new("fstab-home");
    let mnt = dir.0.join("m");
    std::fs::create_dir(&mnt).unwrap();
    let helper = dir.0.join(lakemount::fstab::HELPER_NAME);
    copy_lakemount_bin(&helper);
    let log = dir.0.join("log");
    let script = format!(
        r#"set -e
mount -t tmpfs -o size=1m lakemount-test-home /root
mkdir /root/.aws
printf '[default]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n' > /root/.aws/credentials
printf '[default]\nregion = us-east-1\n' > /root/.aws/config
env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin AWS_EC2_METADATA_DISABLED=true \
    {helper} s3://{b} {mnt} -o _netdev,endpoint_url={endpoint},log_file={log}
cat {mnt}/x
umount {mnt}
"#,
        key = ACCESS_KEY,
        secret = SECRET_KEY,
        helper = helper.display(),
        mnt = mnt.display(),
        endpoint = server().endpoint(),
        log = log.display(),
    );
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "from a profile");
}

/// The `lakemount.toml: |` block of a ConfigMap manifest, unindented.
fn configmap_toml(yaml: &str) -> String {
    let mut lines = yaml.lines().skip_while(|l| l.trim() != "lakemount.toml: |");
    lines.next().expect("a `lakemount.toml: |` block");
    let body: Vec<&str> = lines
        .take_while(|l| l.is_empty() || l.starts_with("    "))
        .collect();
    body.iter()
        .map(|l| l.strip_prefix("    ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_kubernetes_config_map_holds_a_valid_config() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let yaml = std::fs::read_to_string(format!("{dir}/deploy/kubernetes/configmap.yaml")).unwrap();
    let text = configmap_toml(&yaml);
    assert!(text.contains("[cache]"), "{text}");
    let c = lakemount::config::Config::from_toml(&text, "configmap.yaml").unwrap();
    c.validate().unwrap();
    assert!(c.mount.allow_other);
    // The probes and the Prometheus annotation use this port.
    assert_eq!(c.telemetry.metrics_addr.unwrap().port(), 9464);
    let ds = std::fs::read_to_string(format!("{dir}/deploy/kubernetes/daemonset.yaml")).unwrap();
    assert!(ds.contains("containerPort: 9464"));
    assert_eq!(
        c.cache.dir.as_deref(),
        Some(std::path::Path::new("/var/cache/lakemount"))
    );
}

/// A small ext4 file system on a loop device, for a cache whose device the
/// test can slow down; removed on drop.
struct LoopFs {
    img: TempDir,
    dev: String,
    mnt: std::path::PathBuf,
}

impl LoopFs {
    fn new(mib: u64) -> Self {
        let img = TempDir::new("loopfs");
        let file = img.0.join("fs.img");
        std::fs::File::create(&file)
            .unwrap()
            .set_len(mib << 20)
            .unwrap();
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "losetup (a loop device is needed to slow a cache device down): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let dev = String::from_utf8(out.stdout).unwrap().trim().to_string();
        let ok = Command::new("mkfs.ext4")
            .args(["-q", "-F", &dev])
            .status()
            .unwrap();
        assert!(ok.success(), "mkfs.ext4 {dev}");
        let mnt = img.0.join("m");
        std::fs::create_dir(&mnt).unwrap();
        let ok = Command::new("mount").arg(&dev).arg(&mnt).status().unwrap();
        assert!(ok.success(), "mount {dev}");
        Self { img, dev, mnt }
    }

    /// `MAJOR:MINOR` of the loop device.
    fn dev_numbers(&self) -> String {
        use std::os::unix::fs::MetadataExt;
        let rdev = std::fs::metadata(&self.dev).unwrap().rdev();
        format!("{}:{}", libc::major(rdev), libc::minor(rdev))
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
        let _ = &self.img;
    }
}

/// A block-I/O cgroup that limits reads of one device to `limit` per second,
/// reads (`Limit::Iops`) or bytes (`Limit::Bps`), for the processes moved
/// into it (cgroup v1 blkio or v2 io); removed on drop.
struct ReadThrottle {
    dir: std::path::PathBuf,
    root_procs: std::path::PathBuf,
    pids: Vec<u32>,
}

#[derive(Clone, Copy)]
enum Limit {
    Iops(u64),
    Bps(u64),
}

impl ReadThrottle {
    fn new(dev: &str, limit: Limit) -> Self {
        let (v1_file, v2_key, n) = match limit {
            Limit::Iops(n) => ("blkio.throttle.read_iops_device", "riops", n),
            Limit::Bps(n) => ("blkio.throttle.read_bps_device", "rbps", n),
        };
        let name = format!("lakemount-test-{}", std::process::id());
        let v1 = std::path::Path::new("/sys/fs/cgroup/blkio");
        if v1.join("blkio.throttle.read_iops_device").exists() {
            let dir = v1.join(name);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(v1_file), format!("{dev} {n}")).unwrap();
            return Self {
                dir,
                root_procs: v1.join("cgroup.procs"),
                pids: Vec::new(),
            };
        }
        let v2 = std::path::Path::new("/sys/fs/cgroup");
        let _ = std::fs::write(v2.join("cgroup.subtree_control"), "+io");
        let dir = v2.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("io.max"), format!("{dev} {v2_key}={n}"))
            .expect("neither cgroup v1 blkio nor v2 io throttling is available");
        Self {
            dir,
            root_procs: v2.join("cgroup.procs"),
            pids: Vec::new(),
        }
    }

    fn add(&mut self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).unwrap();
        self.pids.push(pid);
    }
}

impl Drop for ReadThrottle {
    fn drop(&mut self) {
        for pid in &self.pids {
            let _ = std::fs::write(&self.root_procs, pid.to_string());
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The value of the first sample of `/metrics` that starts with `series`.
fn metric(addr: &str, series: &str) -> Option<f64> {
    scrape(addr)
        .lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// A mount of `b` with `config` whose disk cache is on a fresh loop-device
/// file system; also its metrics address.
fn mount_loop_cache(b: &str, config: &str) -> (LoopFs, Mount, String) {
    let fs = LoopFs::new(256);
    let addr = format!("127.0.0.1:{}", free_port());
    let cache = fs.mnt.join("cache");
    let m = MountSpec::new(b)
        .args(&[
            "--cache-dir",
            cache.to_str().unwrap(),
            "--metrics-addr",
            &addr,
        ])
        .config(config)
        .mount();
    (fs, m, addr)
}

/// A mount of `b` whose disk cache is on a fresh loop-device file system
/// (no memory tier, no passthrough: every cached read is a device read),
/// after `path` (`len` bytes of `data(len, seed)`) was read once and reached
/// the disk cache. Returns the file system, the mount and its metrics address.
fn mount_on_loop_cache(b: &str, path: &str, len: usize, seed: u64) -> (LoopFs, Mount, String) {
    let (fs, m, addr) = mount_loop_cache(b, "[cache]\nmemory_size = 0\npassthrough = false\n");
    assert_eq!(read_uncached(&m.p(path)), data(len, seed));
    let cached = wait_for(Duration::from_secs(20), || {
        metric(&addr, "lakemount_cache_disk_bytes").unwrap_or(0.0) >= len as f64
    });
    assert!(cached.is_some(), "{path} never reached the disk cache");
    (fs, m, addr)
}

#[test]
fn a_slowed_cache_device_raises_the_alarm_and_reads_go_to_s3() {
    let _serial = measuring();
    const LEN: usize = 16 << 20;
    let b = bucket("slowdev");
    server().put(&b, "shard.bin", data(LEN, 11));
    let (fs, m, addr) = mount_on_loop_cache(&b, "shard.bin", LEN, 11);
    let file = m.p("shard.bin");
    // The reference: reads of the healthy device (its pages dropped each time).
    for _ in 0..16 {
        std::fs::write("/proc/sys/vm/drop_caches", "1").unwrap();
        assert_eq!(read_uncached(&file), data(LEN, 11));
    }
    assert_eq!(
        metric(&addr, "lakemount_cache_device_slow{kind=\"block\"}"),
        Some(0.0),
        "healthy device called slow:\n{}",
        m.log()
    );
    // Device read latency in `stats` counts device reads only: read again
    // with the cache file's pages still in the page cache, the disk tier
    // serves every byte and the latency count stays.
    let reads = |v: &serde_json::Value| v["cache"]["device_read_secs"]["count"].as_f64().unwrap();
    let disk = |v: &serde_json::Value| v["read"]["served_bytes"]["disk"].as_u64().unwrap();
    let before = stats_json(&m.path());
    assert!(reads(&before) > 0.0, "{before:#}");
    assert_eq!(read_uncached(&file), data(LEN, 11));
    let after = stats_json(&m.path());
    assert_eq!(disk(&after), disk(&before) + LEN as u64, "{after:#}");
    // 16 blocks re-read; some pages may have left the page cache (a DAMON
    // pageout scheme, as on the bench machine, evicts cold page cache) or
    // be locked, and those reads do reach the device. Counting page-cache
    // reads would add all 16.
    assert!(
        reads(&after) - reads(&before) <= 8.0,
        "page-cache reads counted as device reads: {} -> {}",
        reads(&before),
        reads(&after)
    );
    let s3_before = metric(&addr, "lakemount_s3_get_bytes_total").unwrap();

    // 4 MiB/s: a device read (a read-ahead window of the data file, ~1-3
    // MiB) takes most of a second against milliseconds before.
    let mut throttle = ReadThrottle::new(&fs.dev_numbers(), Limit::Bps(4 << 20));
    throttle.add(m.child.as_ref().unwrap().id());
    let slow = wait_for(Duration::from_secs(30), || {
        std::fs::write("/proc/sys/vm/drop_caches", "1").unwrap();
        assert_eq!(read_uncached(&file), data(LEN, 11));
        metric(&addr, "lakemount_cache_device_slow{kind=\"block\"}") == Some(1.0)
    });
    assert!(
        slow.is_some(),
        "no alarm for a throttled device:\n{}\n{}",
        scrape(&addr)
            .lines()
            .filter(|l| l.contains("cache_") && !l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n"),
        m.log()
    );
    assert!(
        m.log()
            .contains("cache device reads are more than twice as slow"),
        "{}",
        m.log()
    );
    // Slower than the (loopback) S3 server: reads go there instead, right bytes.
    std::fs::write("/proc/sys/vm/drop_caches", "1").unwrap();
    assert_eq!(read_uncached(&file), data(LEN, 11));
    let bypassed = metric(
        &addr,
        "lakemount_cache_device_bypassed_total{kind=\"block\"}",
    );
    assert!(bypassed.unwrap_or(0.0) > 0.0, "{}", scrape(&addr));
    assert!(metric(&addr, "lakemount_s3_get_bytes_total").unwrap() > s3_before);
    drop(throttle);
    drop(m);
}

/// With passthrough the kernel reads cached files without lakemount, so the
/// alarm watches them by probe reads at open; once the probes are slow, opens
/// are no longer passed through and the reads come back to lakemount (where
/// they are measured, and sent to S3 while the device is slower than S3).
#[test]
fn a_slowed_device_under_passthrough_is_probed_and_passthrough_stops() {
    let _serial = measuring();
    const LEN: usize = 4 << 20;
    let b = bucket("slowpt");
    server().put(&b, "shard.bin", data(LEN, 12));
    let (fs, m, addr) = mount_loop_cache(&b, "[cache]\nmemory_size = 0\n");
    let file = m.p("shard.bin");
    let opens = || metric(&addr, "lakemount_cache_passthrough_opens_total").unwrap_or(0.0);
    // Read through lakemount until the object is whole and sealed, then
    // passed through.
    let passed = wait_for(Duration::from_secs(30), || {
        assert_eq!(read_uncached(&file), data(LEN, 12));
        opens() > 0.0
    });
    assert!(passed.is_some(), "never passed through:\n{}", m.log());
    let probe_slow = "lakemount_cache_device_slow{kind=\"probe\"}";
    // The reference: probes of the healthy device, pages dropped each time
    // (a probe the page cache answers is no sample), at most one per 100 ms.
    for _ in 0..60 {
        std::fs::write("/proc/sys/vm/drop_caches", "1").unwrap();
        assert_eq!(
            &std::fs::read(&file).unwrap()[..4096],
            &data(LEN, 12)[..4096]
        );
        std::thread::sleep(Duration::from_millis(110));
    }
    assert_eq!(
        metric(&addr, probe_slow),
        Some(0.0),
        "healthy device called slow:\n{}",
        m.log()
    );
    let ratio = "lakemount_cache_device_latency_ratio{kind=\"probe\"}";
    assert!(
        metric(&addr, ratio).is_some(),
        "no probe was sampled:\n{}",
        scrape(&addr)
    );

    let mut throttle = ReadThrottle::new(&fs.dev_numbers(), Limit::Bps(1 << 20));
    throttle.add(m.child.as_ref().unwrap().id());
    let slow = wait_for(Duration::from_secs(60), || {
        std::fs::write("/proc/sys/vm/drop_caches", "1").unwrap();
        let _ = std::fs::File::open(&file).unwrap();
        std::thread::sleep(Duration::from_millis(110));
        metric(&addr, probe_slow) == Some(1.0)
    });
    assert!(
        slow.is_some(),
        "no alarm from the probes:\n{}\n{}",
        scrape(&addr),
        m.log()
    );
    // Opens now go through lakemount, with the right bytes.
    let before = opens();
    assert_eq!(read_uncached(&file), data(LEN, 12));
    assert_eq!(
        opens(),
        before,
        "still passed through while the device is slow"
    );
    // Probes go on without passthrough: once the device is fast again,
    // the alarm clears and files are passed through again.
    drop(throttle);
    let recovered = wait_for(Duration::from_secs(60), || {
        std::fs::write("/proc/sys/vm/drop_caches", "1").unwrap();
        let _ = std::fs::File::open(&file).unwrap();
        std::thread::sleep(Duration::from_millis(110));
        metric(&addr, probe_slow) == Some(0.0) && opens() > before
    });
    assert!(
        recovered.is_some(),
        "no recovery:\n{}\n{}",
        scrape(&addr),
        m.log()
    );
    drop(m);
}

/// Held by the tests that measure (doctor) or read hard (the slowed device),
/// so that one's reads are not the others' busy CPU.
static MEASURING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn measuring() -> std::sync::MutexGuard<'static, ()> {
    MEASURING.lock().unwrap_or_else(|e| e.into_inner())
}

/// `lakemount doctor MNT --json`, parsed.
fn doctor(mnt: &std::path::Path) -> serde_json::Value {
    json_of("doctor", mnt, &["--json", "--seq-bytes", "32MiB"])
}

/// 40 small files in two directories and one 32 MiB shard.
fn doctor_data(server: &TestServer, b: &str) {
    for i in 0..40 {
        server.put(
            b,
            &format!("small/d{}/f{i:02}", i % 2),
            data(6000 + i, i as u64),
        );
    }
    server.put(b, "shards/s0.bin", data(32 << 20, 77));
}

#[test]
fn doctor_names_s3_latency_when_the_server_answers_slowly() {
    let _serial = measuring();
    let srv = private_server();
    let b = "doctor-latency";
    srv.create_bucket(b);
    doctor_data(&srv, b);
    for op in ["GetObject", "ListObjectsV2"] {
        srv.set_delay(op, "", Duration::from_millis(40));
    }
    let m = MountSpec::new(b).server(&srv).mount();
    let v = doctor(&m.path());
    assert_eq!(v["bottleneck"], "s3-latency-bound", "{v:#}");
    assert_eq!(v["sequential"]["bytes"], 32 << 20);
    assert_eq!(v["small_files"]["files"], 40);
}

#[test]
fn doctor_names_s3_bandwidth_when_the_server_sends_slowly() {
    let _serial = measuring();
    let srv = private_server();
    let b = "doctor-bandwidth";
    srv.create_bucket(b);
    doctor_data(&srv, b);
    // Quick answers, slow bodies: 40 MB/s for all of them.
    srv.set_body_rate(40_000_000);
    let m = MountSpec::new(b).server(&srv).mount();
    let v = doctor(&m.path());
    assert_eq!(v["bottleneck"], "s3-bandwidth-bound", "{v:#}");
    let secs = v["sequential"]["secs"].as_f64().unwrap();
    assert!(secs >= 0.7, "32 MiB at 40 MB/s in {secs} s");
}

#[test]
fn doctor_names_a_tiny_memory_budget() {
    let _serial = measuring();
    let b = bucket("doctor-budget");
    doctor_data(server(), &b);
    let m = MountSpec::new(&b)
        .config("[read]\npart_size = 1048576\nmemory_budget = \"2MiB\"\n")
        .mount();
    let v = doctor(&m.path());
    assert_eq!(v["bottleneck"], "memory-budget-too-small", "{v:#}");
}

#[test]
fn doctor_names_a_slow_cache_device() {
    let _serial = measuring();
    let b = bucket("doctor-device");
    doctor_data(server(), &b);
    let (fs, m, _addr) = mount_on_loop_cache(&b, "shards/s0.bin", 32 << 20, 77);
    std::fs::write("/proc/sys/vm/drop_caches", "1").unwrap();
    let mut throttle = ReadThrottle::new(&fs.dev_numbers(), Limit::Iops(50));
    throttle.add(m.child.as_ref().unwrap().id());
    let v = doctor(&m.path());
    drop(throttle);
    assert_eq!(v["bottleneck"], "cache-device-slow", "{v:#}");
}

#[test]
fn alarm_series_exist_at_zero_from_the_start() {
    let b = bucket("alarms");
    server().put(&b, "a", "x");
    let cache = TempDir::new("alarm-cache");
    let staging = TempDir::new("alarm-staging");
    let addr = format!("127.0.0.1:{}", free_port());
    let _m = Mount::new(
        &b,
        &[
            "--cache-dir",
            cache.0.to_str().unwrap(),
            "--read-write",
            "--staging-dir",
            staging.0.to_str().unwrap(),
            "--metrics-addr",
            &addr,
        ],
    );
    for series in [
        "lakemount_cache_bad_pieces_total",
        "lakemount_prefetch_budget_refusals_total",
        "lakemount_prefetch_unused_bytes_total",
        "lakemount_write_upload_failures_total",
        "lakemount_cache_device_slow{kind=\"block\"}",
        "lakemount_cache_device_slow{kind=\"packed\"}",
        "lakemount_cache_device_slow{kind=\"probe\"}",
    ] {
        assert_eq!(
            metric(&addr, series),
            Some(0.0),
            "{series}:\n{}",
            scrape(&addr)
        );
    }
}

/// SIGTERM sent the moment the mount appears (as `systemctl stop` right
/// after start, or a test tearing down at once) unmounts cleanly, every
/// time: exit status 0 and nothing left mounted. The signal handler used
/// to be installed by a task that might not have run yet, and such a
/// SIGTERM killed the daemon by default action with its mount point dead.
#[test]
fn sigterm_at_once_after_the_mount_appears_unmounts_cleanly() {
    let b = bucket("sigterm");
    server().put(&b, "a", "x");
    for round in 0..10 {
        let mut m = Mount::new(&b, &[]);
        let path = m.path();
        let (status, log) = m.stop();
        assert!(
            status.success(),
            "round {round}: exited with {status}:\n{log}"
        );
        assert!(!is_mounted(&path), "round {round}: still mounted:\n{log}");
    }
}

/// SIGTERM while a process keeps the mount busy (its working directory in
/// it) detaches the mount after the 5 s of retries: the path is no longer a
/// mount point, the process still reads through it, and the daemon exits 0
/// once the process leaves. It used to log "unmount failed" and then ignore
/// every later signal, the mount serving on.
#[test]
fn sigterm_on_a_busy_mount_detaches_it_and_exits_when_it_is_let_go() {
    let b = bucket("sigterm-busy");
    server().put(&b, "d/a", "inside");
    let mut m = Mount::new(&b, &[]);
    let path = m.path();
    let dir = path.join("d");
    // A shell whose working directory is in the mount, reading a file
    // there when told to.
    let mut sh = Command::new("sh")
        .arg("-c")
        .arg("read _; cat a; echo; read _")
        .current_dir(&dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = m.child.as_ref().unwrap().id() as i32;
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let detached = wait_for(Duration::from_secs(15), || !is_mounted(&path));
    assert!(detached.is_some(), "still mounted:\n{}", m.log());
    assert!(
        m.child.as_mut().unwrap().try_wait().unwrap().is_none(),
        "the daemon exited while its mount was in use:\n{}",
        m.log()
    );
    let mut stdin = sh.stdin.take().unwrap();
    use std::io::Write;
    writeln!(stdin).unwrap();
    let mut out = String::new();
    {
        use std::io::BufRead;
        let mut r = std::io::BufReader::new(sh.stdout.as_mut().unwrap());
        r.read_line(&mut out).unwrap();
    }
    assert_eq!(
        out,
        "inside\n",
        "read through the detached mount:\n{}",
        m.log()
    );
    writeln!(stdin).unwrap();
    drop(stdin);
    assert!(sh.wait().unwrap().success());
    let (status, log) = m.stop();
    assert!(status.success(), "{log}");
    assert!(log.contains("detached it"), "{log}");
}
