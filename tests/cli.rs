//! The command line as an admin meets it: help, config errors, clear one-line
//! reasons for every way mounting can fail, daemon mode, metrics, custom CA.

mod common;

use std::io::{Read, Write};
use std::process::{Command, Output, Stdio};

use common::*;

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().expect("run lakemount")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The last line of stderr: the one-line reason.
fn reason(o: &Output) -> String {
    stderr(o).lines().last().unwrap_or("").to_string()
}

#[test]
fn help_lists_the_options() {
    let o = run(Command::new(lakemount_bin()).args(["mount", "--help"]));
    assert!(o.status.success());
    let help = String::from_utf8_lossy(&o.stdout);
    for opt in [
        "--endpoint-url",
        "--region",
        "--profile",
        "--force-path-style",
        "--no-sign-request",
        "--ca-bundle",
        "-o <OPTIONS>",
        "--allow-other",
        "--uid",
        "--gid",
        "--file-mode",
        "--dir-mode",
        "--read-only",
        "--config",
        "--log-level",
        "--metrics-addr",
        "--daemon",
        "--metadata-ttl",
    ] {
        assert!(help.contains(opt), "--help lacks {opt}:\n{help}");
    }
}

#[test]
fn unknown_config_key_is_named() {
    let dir = TempDir::new("badcfg");
    let cfg = dir.0.join("c.toml");
    std::fs::write(&cfg, "[read]\npart_size = 1048576\nread_ahead_mb = 64\n").unwrap();
    let o = run(lakemount_cmd(&server().endpoint())
        .args([
            "mount",
            "s3://whatever",
            dir.0.to_str().unwrap(),
            "--config",
        ])
        .arg(&cfg));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("read_ahead_mb") && err.contains("line 3"),
        "{err}"
    );
    assert!(
        err.contains("expected one of `part_size`"),
        "accepted keys not listed: {err}"
    );
}

#[test]
fn bad_value_is_named() {
    let dir = TempDir::new("badval");
    let cfg = dir.0.join("c.toml");
    std::fs::write(
        &cfg,
        "[read]\ninitial_window = 1048576\nmax_window = 1024\n",
    )
    .unwrap();
    let o = run(lakemount_cmd(&server().endpoint())
        .args([
            "mount",
            "s3://whatever",
            dir.0.to_str().unwrap(),
            "--config",
        ])
        .arg(&cfg));
    assert_eq!(o.status.code(), Some(1));
    assert!(reason(&o).contains("read.max_window"), "{}", stderr(&o));
    let o = run(lakemount_cmd(&server().endpoint()).args([
        "mount",
        "s3://whatever",
        dir.0.to_str().unwrap(),
        "-o",
        "nosuchopt",
    ]));
    assert_eq!(o.status.code(), Some(1));
    assert!(reason(&o).contains("nosuchopt"), "{}", stderr(&o));
}

#[test]
fn missing_bucket_fails_with_reason() {
    let dir = TempDir::new("nobucket");
    let o = run(lakemount_cmd(&server().endpoint())
        .args(["mount", "s3://no-such-bucket-here"])
        .arg(&dir.0));
    assert_eq!(o.status.code(), Some(1));
    assert!(
        reason(&o).contains("bucket \"no-such-bucket-here\" does not exist"),
        "{}",
        stderr(&o)
    );
    assert!(!is_mounted(&dir.0));
}

#[test]
fn access_denied_fails_with_reason() {
    let b = bucket("denied");
    let dir = TempDir::new("denied");
    let o = run(lakemount_cmd(&server().endpoint())
        .env("AWS_SECRET_ACCESS_KEY", "not-the-secret")
        .args(["mount", &format!("s3://{b}")])
        .arg(&dir.0));
    assert_eq!(o.status.code(), Some(1));
    let r = reason(&o);
    assert!(r.contains("access denied"), "{}", stderr(&o));
    assert!(
        !stderr(&o).contains("not-the-secret"),
        "secret leaked into the log"
    );
}

#[test]
fn a_bad_value_from_the_environment_names_the_variable_and_key() {
    let dir = TempDir::new("badenv");
    let o = run(lakemount_cmd(&server().endpoint())
        .env("LAKEMOUNT_METADATA_TTL", "abc")
        .args(["mount", "s3://whatever"])
        .arg(&dir.0));
    assert_ne!(o.status.code(), Some(0));
    let e = stderr(&o);
    assert!(
        e.contains("environment variable LAKEMOUNT_METADATA_TTL")
            && e.contains("metadata.ttl_secs"),
        "{e}"
    );
    // Typed on the command line (the variable set too): clap's message alone.
    let o = run(lakemount_cmd(&server().endpoint())
        .env("LAKEMOUNT_METADATA_TTL", "abc")
        .args(["mount", "s3://whatever", "--metadata-ttl", "abc"])
        .arg(&dir.0));
    assert!(
        !stderr(&o).contains("environment variable"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn missing_credentials_fail_with_one_clear_reason() {
    let b = bucket("nocreds");
    let dir = TempDir::new("nocreds");
    let home = TempDir::new("nocreds-home");
    let o = run(lakemount_cmd(&server().endpoint())
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_PROFILE")
        .env_remove("RUST_LOG")
        .env("HOME", &home.0)
        .args(["mount", &format!("s3://{b}")])
        .arg(&dir.0));
    assert_eq!(o.status.code(), Some(1));
    let r = reason(&o);
    assert!(
        r.contains("no AWS credentials found") && r.contains("--profile"),
        "{}",
        stderr(&o)
    );
    // The credential chain's own long warnings stay out of the default log.
    assert!(!stderr(&o).contains("WARN aws_config"), "{}", stderr(&o));
}

#[test]
fn unsigned_requests_to_a_private_bucket_say_to_drop_the_flag() {
    let b = bucket("unsigned");
    let dir = TempDir::new("unsigned");
    let o = run(lakemount_cmd(&server().endpoint())
        .args(["mount", &format!("s3://{b}"), "--no-sign-request"])
        .arg(&dir.0));
    assert_eq!(o.status.code(), Some(1));
    let r = reason(&o);
    assert!(r.contains("drop --no-sign-request"), "{}", stderr(&o));
}

/// An HTTP server that is not S3 (another service on the port given) is
/// named as such, whatever it answers: a 404 is not called a missing bucket,
/// a 200 or 400 with a body that is no S3 answer is not a bare status.
#[test]
fn a_server_that_is_not_s3_is_named_as_such_whatever_its_status() {
    for (answer, status) in [
        (
            &b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n"[..],
            "404",
        ),
        (
            &b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 13\r\n"[..],
            "200",
        ),
        (
            &b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n"[..],
            "400",
        ),
    ] {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for mut c in listener.incoming().flatten().take(20) {
                let mut buf = [0u8; 8192];
                let _ = c.read(&mut buf);
                let _ = c.write_all(answer);
                let body: &[u8] = if status == "200" {
                    b"<html></html>"
                } else {
                    b""
                };
                let _ = c.write_all(b"Connection: close\r\n\r\n");
                let _ = c.write_all(body);
            }
        });
        let dir = TempDir::new("not-s3");
        let o = run(lakemount_cmd(&format!("http://127.0.0.1:{port}"))
            .args(["mount", "s3://some-bucket"])
            .arg(&dir.0));
        assert_eq!(o.status.code(), Some(1));
        let r = reason(&o);
        assert!(
            r.contains(status) && r.contains("check that it is an S3 endpoint"),
            "{status}: {}",
            stderr(&o)
        );
    }
}

#[test]
fn unreachable_endpoint_fails_with_reason() {
    // Bind then drop a listener: nothing listens on that port now.
    let port = free_port();
    let dir = TempDir::new("unreach");
    let o = run(lakemount_cmd(&format!("http://127.0.0.1:{port}"))
        .args(["mount", "s3://some-bucket", "--config"])
        .arg(write_cfg(&dir, "[s3]\nmax_attempts = 2\n"))
        .arg(&dir.0));
    assert_eq!(o.status.code(), Some(1));
    assert!(
        reason(&o).contains("cannot reach S3 endpoint"),
        "{}",
        stderr(&o)
    );
}

fn write_cfg(dir: &TempDir, text: &str) -> std::path::PathBuf {
    let p = dir.0.join("extra.toml");
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn mountpoint_must_be_a_directory() {
    let b = bucket("notdir");
    let dir = TempDir::new("notdir");
    let file = dir.0.join("file");
    std::fs::write(&file, "x").unwrap();
    let o = run(lakemount_cmd(&server().endpoint())
        .args(["mount", &format!("s3://{b}")])
        .arg(&file));
    assert_eq!(o.status.code(), Some(1));
    assert!(reason(&o).contains("is not a directory"), "{}", stderr(&o));
    let o = run(lakemount_cmd(&server().endpoint())
        .args(["mount", &format!("s3://{b}")])
        .arg(dir.0.join("missing")));
    assert_eq!(o.status.code(), Some(1));
    assert!(
        reason(&o).contains("No such file or directory"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn daemon_returns_once_mounted_and_umount_stops_it() {
    let b = bucket("daemon");
    server().put(&b, "f.txt", "daemon data");
    let dir = TempDir::new("daemon");
    let log = dir.0.join("log");
    let mnt = dir.0.join("m");
    std::fs::create_dir(&mnt).unwrap();
    let o = run(lakemount_cmd(&server().endpoint())
        .args(["mount", &format!("s3://{b}")])
        .arg(&mnt)
        .arg("--daemon")
        .arg("--log-file")
        .arg(&log));
    assert!(o.status.success(), "{}", stderr(&o));
    // No polling: the mount is usable the moment the command returns.
    assert!(is_mounted(&mnt));
    assert_eq!(
        std::fs::read_to_string(mnt.join("f.txt")).unwrap(),
        "daemon data"
    );
    assert!(Command::new("umount").arg(&mnt).status().unwrap().success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("unmounted")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "daemon did not log its exit"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // A daemon that cannot mount makes the command fail with the reason.
    let o = run(lakemount_cmd(&server().endpoint())
        .args(["mount", "s3://no-such-bucket-daemon"])
        .arg(&mnt)
        .arg("--daemon"));
    assert_eq!(o.status.code(), Some(1));
    assert!(reason(&o).contains("does not exist"), "{}", stderr(&o));
    assert_eq!(
        stderr(&o).matches("does not exist").count(),
        1,
        "{}",
        stderr(&o)
    );
    // Without --log-file, a warning logged while the daemon starts reaches the
    // terminal (here: an empty prefix), and the daemon lets go of that
    // terminal once mounted: its stderr pipe reaches EOF while it runs.
    let mut child = lakemount_cmd(&server().endpoint())
        .args(["mount", &format!("s3://{b}/no-such-prefix")])
        .arg(&mnt)
        .arg("--daemon")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pipe = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        let _ = tx.send(text);
    });
    let text = rx.recv_timeout(std::time::Duration::from_secs(30));
    let status = child.wait().unwrap();
    let mounted = is_mounted(&mnt);
    // Retried: right after the mount the kernel may still call it busy, and
    // a mount left behind outlives the test run (seen once in a CI run).
    for _ in 0..50 {
        let _ = Command::new("umount").arg(&mnt).status();
        if !is_mounted(&mnt) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let text = text.expect("the daemon kept the terminal's stderr open after mounting");
    assert!(status.success(), "{text}");
    assert!(mounted, "{text}");
    assert!(text.contains("holds no objects"), "{text}");
}

#[test]
fn metrics_endpoint_counts_s3_requests() {
    let b = bucket("metrics");
    server().put(&b, "a.bin", data(10_000, 3));
    // A host name, as an admin writes it; served on its IPv4 address.
    let port = free_port();
    let m = Mount::new(&b, &["--metrics-addr", &format!("localhost:{port}")]);
    assert_eq!(std::fs::read(m.p("a.bin")).unwrap(), data(10_000, 3));
    let body = scrape(&format!("127.0.0.1:{port}"));
    for want in [
        "lakemount_s3_requests_total{op=\"LIST\",status=\"200\"}",
        "lakemount_s3_requests_total{op=\"GET\",status=\"206\"}",
        "lakemount_fuse_read_bytes_total 10000",
    ] {
        assert!(body.contains(want), "{want} missing from /metrics:\n{body}");
    }
}

/// TCP ports process `pid` listens on (from /proc/PID/fd and /proc/net/tcp{,6}).
fn listening_ports(pid: u32) -> Vec<u16> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.to_str()?.to_string();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let mut ports = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // Columns: sl local_address rem_address st ... inode (10th); 0A = LISTEN.
            if f.len() > 9 && f[3] == "0A" && inodes.iter().any(|i| i == f[9]) {
                let port = f[1].rsplit(':').next().unwrap();
                ports.push(u16::from_str_radix(port, 16).unwrap());
            }
        }
    }
    ports
}

#[test]
fn no_listening_socket_without_metrics_addr() {
    // 9000 is the default port of the metrics library's listener and of MinIO:
    // a mount must come up while something else holds it (CI failed on this
    // when two mounts started at once).
    let _held = std::net::TcpListener::bind("0.0.0.0:9000");
    let b = bucket("nolisten");
    server().put(&b, "a", "x");
    let m = Mount::new(&b, &[]);
    assert_eq!(std::fs::read(m.p("a")).unwrap(), b"x");
    let pid = m.child.as_ref().unwrap().id();
    assert_eq!(listening_ports(pid), Vec::<u16>::new(), "{}", m.log());
}

#[test]
fn custom_ca_bundle_for_https_endpoint() {
    let (tls, ca) = TestServer::start_tls_background().unwrap();
    tls.create_bucket("tls-bucket");
    tls.put("tls-bucket", "secret.txt", "over https");
    // The machine's AWS_CA_BUNDLE (system roots) does not know the test CA.
    let dir = TempDir::new("tls-fail");
    let o = run(lakemount_cmd(&tls.endpoint())
        .env("AWS_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
        .args(["mount", "s3://tls-bucket", "--config"])
        .arg(write_cfg(&dir, "[s3]\nmax_attempts = 1\n"))
        .arg(&dir.0));
    assert_eq!(o.status.code(), Some(1));
    assert!(
        reason(&o).contains("cannot reach S3 endpoint"),
        "{}",
        stderr(&o)
    );
    // --ca-bundle trusts it.
    let m = Mount::with_source(
        "tls-bucket",
        "s3://tls-bucket",
        &[
            "--endpoint-url",
            &tls.endpoint(),
            "--ca-bundle",
            ca.to_str().unwrap(),
        ],
    );
    assert_eq!(
        std::fs::read_to_string(m.p("secret.txt")).unwrap(),
        "over https"
    );
    drop(m);
    // So does AWS_CA_BUNDLE, as with the AWS CLI.
    let dir = TempDir::new("tls-env");
    let mnt = dir.0.join("m");
    std::fs::create_dir(&mnt).unwrap();
    let o = run(lakemount_cmd(&tls.endpoint())
        .env("AWS_CA_BUNDLE", &ca)
        .args(["mount", "s3://tls-bucket"])
        .arg(&mnt)
        .arg("--daemon"));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        std::fs::read_to_string(mnt.join("secret.txt")).unwrap(),
        "over https"
    );
    assert!(Command::new("umount").arg(&mnt).status().unwrap().success());
}

#[test]
fn plain_http_works_with_aws_ca_bundle_set() {
    let b = bucket("plainhttp");
    server().put(&b, "x", "plain");
    let dir = TempDir::new("cafile");
    let ca = dir.0.join("ca.pem");
    // Any PEM will do: the endpoint is http.
    std::fs::copy("/etc/ssl/certs/ca-certificates.crt", &ca).unwrap();
    let m = Mount::new(&b, &["--ca-bundle", ca.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(m.p("x")).unwrap(), "plain");
    drop(m);
    // A bundle that cannot be read is not needed for http: a warning
    // naming where it came from, and the mount works.
    let m = MountSpec::new(&b)
        .env("AWS_CA_BUNDLE", "/nonexistent/ca.pem")
        .mount();
    assert_eq!(std::fs::read_to_string(m.p("x")).unwrap(), "plain");
    let log = m.log();
    assert!(
        log.lines()
            .any(|l| l.contains("WARN")
                && l.contains("AWS_CA_BUNDLE: cannot read /nonexistent/ca.pem")),
        "{log}"
    );
    // For an https endpoint it stops the mount, named the same way.
    let o = run(lakemount_cmd("https://127.0.0.1:9")
        .env("AWS_CA_BUNDLE", "/nonexistent/ca.pem")
        .args(["mount", &format!("s3://{b}")])
        .arg(&dir.0));
    assert_eq!(o.status.code(), Some(1));
    assert!(
        reason(&o).contains("AWS_CA_BUNDLE: cannot read /nonexistent/ca.pem"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn second_mount_on_the_same_directory_is_refused() {
    let b = bucket("twice");
    server().put(&b, "f", "first");
    let m = Mount::new(&b, &[]);
    let o = run(lakemount_cmd(&server().endpoint())
        .args(["mount", &format!("s3://{b}")])
        .arg(m.path()));
    assert_eq!(o.status.code(), Some(1));
    assert!(
        reason(&o).contains("already a mount point"),
        "{}",
        stderr(&o)
    );
    // The first mount is untouched.
    assert_eq!(std::fs::read_to_string(m.p("f")).unwrap(), "first");
}

/// After `kill -9` of the daemon its mount point answers ENOTCONN; the next
/// `lakemount mount` at the same path detaches the dead mount, says so, and
/// mounts: no manual `umount` needed (a restart policy can bring it back).
#[test]
fn mount_over_a_dead_mount_of_a_killed_daemon_detaches_it() {
    let b = bucket("deadmount");
    server().put(&b, "f", "alive again");
    let mut m = Mount::new(&b, &[]);
    assert_eq!(std::fs::read_to_string(m.p("f")).unwrap(), "alive again");
    let mut child = m.child.take().unwrap();
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    // (A stat of the root may still be answered from the kernel's cache.)
    let err = std::fs::read_dir(m.path()).map(drop).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTCONN), "{err}");
    let o = run(lakemount_cmd(&server().endpoint())
        .args(["mount", &format!("s3://{b}")])
        .arg(m.path())
        .arg("--daemon"));
    let mounted = is_mounted(&m.path());
    let read = std::fs::read_to_string(m.p("f"));
    let _ = Command::new("umount").arg(m.path()).status();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(mounted, "{}", stderr(&o));
    assert_eq!(read.unwrap(), "alive again");
    assert!(
        stderr(&o).contains("whose daemon is gone") && stderr(&o).contains("detached"),
        "{}",
        stderr(&o)
    );
}

/// The daemon raises its soft open-files limit (RLIMIT_NOFILE) to the hard
/// one: it was started with a soft limit of 256 here.
#[test]
fn the_open_files_limit_is_raised_to_the_hard_limit() {
    use std::os::unix::process::CommandExt;
    let b = bucket("nofile");
    server().put(&b, "f", "x");
    let dir = TempDir::new("nofile");
    let mnt = dir.0.join("m");
    std::fs::create_dir(&mnt).unwrap();
    let mut cmd = lakemount_cmd(&server().endpoint());
    cmd.args(["mount", &format!("s3://{b}")]).arg(&mnt);
    // SAFETY: only setrlimit(2), async-signal-safe, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let mut lim = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
            lim.rlim_cur = lim.rlim_cur.min(256);
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            Ok(())
        });
    }
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !is_mounted(&mnt) {
        assert!(std::time::Instant::now() < deadline, "mount timed out");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", child.id())).unwrap();
    // Right after mounting the kernel may still call into the mount (EBUSY):
    // a failed umount would leave the daemon serving and `wait` hanging.
    let unmounted = wait_for(std::time::Duration::from_secs(20), || {
        Command::new("umount")
            .arg(&mnt)
            .status()
            .is_ok_and(|s| s.success())
    });
    if unmounted.is_none() {
        let _ = child.kill();
    }
    let _ = child.wait();
    assert!(unmounted.is_some(), "umount kept failing");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("Max open files line");
    let f: Vec<&str> = line.split_whitespace().collect();
    // "Max open files  SOFT  HARD  files"
    let (soft, hard) = (f[3], f[4]);
    assert!(
        hard == "unlimited" || hard.parse::<u64>().unwrap() > 256,
        "{line}"
    );
    assert_eq!(soft, hard, "{line}");
}

#[test]
fn decimal_file_mode_in_toml_is_refused_with_the_octal_spelling() {
    let dir = TempDir::new("decmode");
    let cfg = write_cfg(&dir, "[mount]\nfile_mode = 644\n");
    let o = run(lakemount_cmd(&server().endpoint())
        .args(["mount", "s3://whatever", "--config"])
        .arg(&cfg)
        .arg(&dir.0));
    assert_eq!(o.status.code(), Some(1));
    let r = reason(&o);
    assert!(
        r.contains("mount.file_mode") && r.contains("0o644"),
        "{}",
        stderr(&o)
    );
}

/// Credentials from a profile file: neither the secret nor the access key
/// ID appears in the daemon's log at the default level.
#[test]
fn profile_credentials_stay_out_of_the_log() {
    let b = bucket("profile-log");
    server().put(&b, "a.txt", "x");
    let dir = TempDir::new("profile");
    let creds = dir.0.join("credentials");
    std::fs::write(
        &creds,
        "[default]\naws_access_key_id = lakemount-test\naws_secret_access_key = lakemount-test-secret\n",
    )
    .unwrap();
    let m = MountSpec::new(&b)
        .unset_env("AWS_ACCESS_KEY_ID")
        .unset_env("AWS_SECRET_ACCESS_KEY")
        .env("AWS_SHARED_CREDENTIALS_FILE", creds.to_str().unwrap())
        .env("AWS_CONFIG_FILE", dir.0.join("none").to_str().unwrap())
        // The default level (the tests' RUST_LOG would override it).
        .unset_env("RUST_LOG")
        .mount();
    assert_eq!(std::fs::read_to_string(m.p("a.txt")).unwrap(), "x");
    let log = m.log();
    assert!(
        !log.contains("lakemount-test-secret"),
        "secret in the log:\n{log}"
    );
    assert!(!log.contains("access_key_id"), "key ID in the log:\n{log}");
}

/// A strict server refuses requests signed for another region than its
/// own and names that one: with no region given, the mount takes it (as
/// for a Garage or an AWS bucket elsewhere); with a wrong one given, the
/// mount fails and says which to set.
#[test]
fn the_region_a_strict_server_names_is_used_when_none_is_given() {
    let srv = private_server();
    let b = bucket_on(&srv, "region");
    srv.put(&b, "dir/a", "from eu-test-1");
    srv.require_region(Some("eu-test-1"));
    let m = MountSpec::new(&b).server(&srv).mount();
    assert_eq!(
        std::fs::read_to_string(m.p("dir/a")).unwrap(),
        "from eu-test-1",
        "{}",
        m.log()
    );
    assert!(m.log().contains("the bucket's region"), "{}", m.log());
    drop(m);
    let dir = TempDir::new("region");
    let o = run(lakemount_cmd(&srv.endpoint())
        .args(["mount", &format!("s3://{b}"), "--region", "us-west-2"])
        .arg(&dir.0));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let r = reason(&o);
    assert!(
        r.contains("\"eu-test-1\"") && r.contains("--region eu-test-1"),
        "{}",
        stderr(&o)
    );
}
