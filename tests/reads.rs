//! Read semantics through the real `lakemount` binary and a real FUSE mount:
//! exact bytes at block boundaries, EOF, ETag pinning, read-only, concurrency,
//! server faults. Each test proves one rule of docs/SEMANTICS.md.
//!
//! Tests that inject failures or count requests use a private server: those
//! hooks are global to a server and tests of this file run in parallel. Delays
//! are per key prefix, so each test that sets one uses a prefix of its own.

mod common;

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::*;

/// Small read parts (64 KiB) so boundary objects stay small.
const SMALL_PARTS: &str =
    "[read]\npart_size = 65536\ninitial_window = 65536\nmax_window = 262144\n";

/// Removes a GET delay rule when dropped (also when the test panics).
struct DelayGuard<'a> {
    server: &'a TestServer,
    prefix: &'static str,
}

impl<'a> DelayGuard<'a> {
    fn set(server: &'a TestServer, prefix: &'static str, delay: Duration) -> Self {
        server.set_delay("GetObject", prefix, delay);
        Self { server, prefix }
    }
}

impl Drop for DelayGuard<'_> {
    fn drop(&mut self) {
        self.server
            .set_delay("GetObject", self.prefix, Duration::ZERO);
    }
}

/// Reads `f` sequentially in `chunk`-byte reads until EOF or the first error.
fn read_chunks(f: &mut File, chunk: usize) -> (Vec<u8>, Option<std::io::Error>) {
    let mut got = Vec::new();
    let mut buf = vec![0u8; chunk];
    loop {
        match f.read(&mut buf) {
            Ok(0) => return (got, None),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => return (got, Some(e)),
        }
    }
}

/// Sizes around each "block size": 4 KiB pages, the 64 KiB read part of
/// [`SMALL_PARTS`], 128 KiB kernel read requests.
fn boundary_sizes() -> Vec<usize> {
    let mut v = vec![0, 1];
    for bs in [4096usize, 65536, 131072] {
        v.extend([bs - 1, bs, bs + 1]);
    }
    v
}

#[test]
fn boundary_sized_objects_read_back_exactly() {
    let b = bucket("boundary");
    let s = server();
    for size in boundary_sizes() {
        s.put(&b, &format!("whole/f{size}"), data(size, size as u64));
        s.put(&b, &format!("chunked/f{size}"), data(size, size as u64));
        s.put(&b, &format!("pread/f{size}"), data(size, size as u64));
    }
    let m = MountSpec::new(&b).config(SMALL_PARTS).mount();
    for size in boundary_sizes() {
        let want = data(size, size as u64);
        let whole = std::fs::read(m.p(&format!("whole/f{size}"))).unwrap();
        assert!(
            whole == want,
            "whole read of f{size}: {} bytes",
            whole.len()
        );
        // Odd-sized reads that straddle every boundary.
        let mut f = File::open(m.p(&format!("chunked/f{size}"))).unwrap();
        let (got, err) = read_chunks(&mut f, 1000);
        assert!(err.is_none(), "f{size}: {err:?}");
        assert!(got == want, "chunked read of f{size}: {} bytes", got.len());
        // Reads that start just before a part boundary and end after it.
        let f = File::open(m.p(&format!("pread/f{size}"))).unwrap();
        for at in [65530usize, 131066, 4090, 0] {
            if at >= size {
                continue;
            }
            let mut buf = [0u8; 12];
            let n = f.read_at(&mut buf, at as u64).unwrap();
            let end = (at + 12).min(size);
            assert_eq!(&buf[..n], &want[at..end], "f{size} pread at {at}");
        }
    }
}

#[test]
fn default_part_size_boundaries_read_back_exactly() {
    let b = bucket("part8m");
    let s = server();
    let part = 8 << 20;
    let sizes = [part - 1, part, part + 1];
    for size in sizes {
        s.put(&b, &format!("f{size}"), data(size, size as u64));
    }
    let m = Mount::new(&b, &[]);
    for size in sizes {
        let got = std::fs::read(m.p(&format!("f{size}"))).unwrap();
        assert!(
            got == data(size, size as u64),
            "f{size}: {} bytes",
            got.len()
        );
    }
}

#[test]
fn reads_at_or_past_eof_return_zero_bytes() {
    let b = bucket("eof");
    let s = server();
    let sizes = [0usize, 1, 4096, 70_000];
    for size in sizes {
        s.put(&b, &format!("f{size}"), data(size, 7));
    }
    let m = MountSpec::new(&b).config(SMALL_PARTS).mount();
    for size in sizes {
        let want = data(size, 7);
        let f = File::open(m.p(&format!("f{size}"))).unwrap();
        let mut buf = vec![0u8; 8192];
        for at in [size, size + 1, size + 4096, size + (1 << 30)] {
            assert_eq!(
                f.read_at(&mut buf, at as u64).unwrap(),
                0,
                "f{size} at {at}"
            );
        }
        if size > 0 {
            // The last byte: one byte, then nothing.
            assert_eq!(f.read_at(&mut buf, size as u64 - 1).unwrap(), 1);
            assert_eq!(buf[0], want[size - 1]);
        }
        // read(2) to the end, then again: 0 bytes each time.
        let mut f = File::open(m.p(&format!("f{size}"))).unwrap();
        let mut all = Vec::new();
        f.read_to_end(&mut all).unwrap();
        assert!(all == want, "f{size}");
        assert_eq!(f.read(&mut buf).unwrap(), 0);
        assert_eq!(f.read(&mut buf).unwrap(), 0);
    }
}

#[test]
fn isatty_on_a_file_is_enotty_without_a_warning() {
    // Python's open() asks isatty() (ioctl TCGETS) of every file it opens.
    let b = bucket("ioctl");
    server().put(&b, "f", "x");
    let m = MountSpec::new(&b).mount();
    let f = File::open(m.p("f")).unwrap();
    // SAFETY: a valid open descriptor.
    let tty = unsafe { libc::isatty(std::os::fd::AsRawFd::as_raw_fd(&f)) };
    let err = std::io::Error::last_os_error().raw_os_error();
    assert_eq!((tty, err), (0, Some(libc::ENOTTY)));
    // The kernel turns ENOSYS from the daemon into ENOTTY too, so the errno
    // alone would pass with fuser's default handler: the log check is the test.
    let log = m.log();
    assert!(!log.contains("Not Implemented"), "{log}");
}

#[test]
fn overwrite_during_read_gives_old_bytes_or_error_never_a_mix() {
    let b = bucket("pin");
    let s = server();
    let old = data(4 << 20, 1);
    let new = data((4 << 20) + 5, 2);
    s.put(&b, "pin/obj", old.clone());
    let m = MountSpec::new(&b)
        .config("[read]\npart_size = 65536\ninitial_window = 65536\nmax_window = 65536\n")
        .args(&["--metadata-ttl", "0"])
        .mount();

    let mut f = File::open(m.p("pin/obj")).unwrap();
    let mut first = vec![0u8; 65536];
    f.read_exact(&mut first).unwrap();
    assert!(first[..] == old[..65536]);
    s.put(&b, "pin/obj", new.clone());
    let (rest, err) = read_chunks(&mut f, 65536);
    let mut got = first;
    got.extend_from_slice(&rest);
    // Whatever was read is the old version's bytes, in place.
    assert!(
        got.len() <= old.len() && got[..] == old[..got.len()],
        "read {} bytes that are not a prefix of the old version",
        got.len()
    );
    match err {
        // 4 MiB at 64 KiB per GET is far more than the kernel's read-ahead
        // (1 MiB at most) fetched before the overwrite: the rest needs GETs
        // pinned to the old ETag, which the server refuses.
        None => panic!("read all {} old bytes: expected an error", got.len()),
        Some(e) => {
            let code = errno(&e);
            assert!(
                code == libc::ESTALE || code == libc::EIO,
                "error {e} ({code}), want ESTALE or EIO"
            );
        }
    }
    drop(f);
    // A reopen sees the new version, size and bytes.
    assert_eq!(
        std::fs::metadata(m.p("pin/obj")).unwrap().len(),
        new.len() as u64
    );
    let again = std::fs::read(m.p("pin/obj")).unwrap();
    assert!(again == new, "reopen read {} bytes", again.len());
}

#[test]
fn an_overwritten_object_is_a_new_inode_and_old_handles_keep_theirs() {
    use std::os::unix::fs::MetadataExt;
    let b = bucket("new-inode");
    let s = server();
    let old = data(10_000, 5);
    let new = data(20_000, 6);
    s.put(&b, "v/obj", old.clone());
    let m = Mount::new(&b, &["--metadata-ttl", "0"]);
    let f = File::open(m.p("v/obj")).unwrap();
    let ino = f.metadata().unwrap().ino();
    assert_eq!(std::fs::metadata(m.p("v/obj")).unwrap().ino(), ino);
    s.put(&b, "v/obj", new.clone());
    // By name: the new version, under a new inode number.
    let md = std::fs::metadata(m.p("v/obj")).unwrap();
    assert_ne!(md.ino(), ino, "an overwritten object kept its inode");
    assert_eq!(md.len(), new.len() as u64);
    assert!(std::fs::read(m.p("v/obj")).unwrap() == new);
    // The handle opened before still describes the old version.
    let held = f.metadata().unwrap();
    assert_eq!((held.ino(), held.len()), (ino, old.len() as u64));
    // Unchanged objects keep their inode.
    let again = std::fs::metadata(m.p("v/obj")).unwrap();
    assert_eq!(again.ino(), md.ino());
}

#[test]
fn overwrite_while_get_in_flight_is_an_error_not_new_bytes() {
    let b = bucket("pin-inflight");
    let s = server();
    let old = data(100_000, 3);
    let new = data(100_000, 4);
    s.put(&b, "inflight-pin/obj", old.clone());
    let m = Mount::new(&b, &["--metadata-ttl", "0"]);
    let mut f = File::open(m.p("inflight-pin/obj")).unwrap();
    let _delay = DelayGuard::set(s, "inflight-pin/", Duration::from_millis(600));
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        f.read_to_end(&mut buf).map(|_| buf)
    });
    std::thread::sleep(Duration::from_millis(200));
    // Overwritten while the first GET (If-Match: old ETag) waits at the server.
    s.put(&b, "inflight-pin/obj", new.clone());
    match reader.join().unwrap() {
        Ok(bytes) => panic!(
            "read {} bytes (old: {}, new: {})",
            bytes.len(),
            bytes == old,
            bytes == new
        ),
        Err(e) => {
            let code = errno(&e);
            assert!(
                code == libc::ESTALE || code == libc::EIO,
                "error {e} ({code}), want ESTALE or EIO"
            );
        }
    }
    drop(_delay);
    assert!(std::fs::read(m.p("inflight-pin/obj")).unwrap() == new);
}

#[test]
fn writes_creates_mkdir_unlink_give_erofs() {
    let b = bucket("readonly");
    let s = server();
    s.put(&b, "d/f", "content");
    let m = Mount::new(&b, &[]);
    let f = m.p("d/f");
    let new = m.p("d/new");
    let erofs = |r: std::io::Result<()>, what: &str| assert_errno(r, libc::EROFS, what);
    erofs(
        OpenOptions::new().write(true).open(&f).map(drop),
        "open O_WRONLY",
    );
    erofs(
        OpenOptions::new().read(true).write(true).open(&f).map(drop),
        "open O_RDWR",
    );
    erofs(
        OpenOptions::new().append(true).open(&f).map(drop),
        "open O_APPEND",
    );
    erofs(File::create(&f).map(drop), "create (truncate) existing");
    erofs(File::create(&new).map(drop), "create new");
    erofs(std::fs::write(&new, "x"), "write new");
    erofs(std::fs::create_dir(m.p("d/newdir")), "mkdir");
    erofs(std::fs::remove_file(&f), "unlink");
    erofs(std::fs::remove_dir(m.p("d")), "rmdir");
    erofs(std::fs::rename(&f, m.p("d/g")), "rename");
    erofs(std::fs::hard_link(&f, m.p("d/h")), "link");
    erofs(std::os::unix::fs::symlink("f", m.p("d/s")), "symlink");
    use std::os::unix::fs::PermissionsExt;
    erofs(
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)),
        "chmod",
    );
    for cmd in [
        vec!["touch", "d/new"],
        vec!["mkdir", "d/x"],
        vec!["rm", "-f", "d/f"],
    ] {
        let out = std::process::Command::new(cmd[0])
            .args(&cmd[1..])
            .current_dir(m.path())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{cmd:?} succeeded");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("Read-only file system"),
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Nothing changed: the file reads as before, no entry appeared.
    assert_eq!(std::fs::read(&f).unwrap(), b"content");
    assert_eq!(names(&m.p("d")), ["f"]);
    assert_eq!(s.get(&b, "d/f").unwrap(), "content");
    assert!(s.get(&b, "d/new").is_none());
}

#[test]
fn slow_get_never_blocks_other_files() {
    let b = bucket("slowget");
    let s = server();
    let big = data(1 << 20, 5);
    s.put(&b, "conc/slow-one", big.clone());
    for i in 0..8 {
        s.put(&b, &format!("conc/fast-{i}"), data(10_000, i));
        s.put(&b, &format!("other/x{i}"), data(10_000, 100 + i));
    }
    let m = Mount::new(&b, &[]);
    let _delay = DelayGuard::set(s, "conc/slow-", Duration::from_secs(3));
    let path = m.p("conc/slow-one");
    let slow = std::thread::spawn(move || {
        let t = Instant::now();
        let got = std::fs::read(path).unwrap();
        (got, t.elapsed())
    });
    std::thread::sleep(Duration::from_millis(300));

    // While that GET waits, other files of the same directory and of another
    // directory (which needs a LIST of its own) are looked up and read.
    let start = Instant::now();
    for i in 0..8 {
        let p = m.p(&format!("conc/fast-{i}"));
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 10_000);
        assert!(std::fs::read(&p).unwrap() == data(10_000, i));
    }
    assert_eq!(names(&m.p("other")).len(), 8);
    for i in 0..8 {
        let p = m.p(&format!("other/x{i}"));
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 10_000);
        assert!(std::fs::read(&p).unwrap() == data(10_000, 100 + i));
    }
    assert_eq!(names(&m.p("conc")).len(), 9);
    let others = start.elapsed();
    eprintln!("other files while one GET was slow: {others:?}");

    let (got, slow_took) = slow.join().unwrap();
    assert!(got == big, "slow file bytes");
    assert!(
        slow_took >= Duration::from_secs(3),
        "the slow GET was not delayed ({slow_took:?})"
    );
    assert!(
        others < Duration::from_millis(1500),
        "other files took {others:?} while one GET was slow"
    );
}

#[test]
fn sixteen_readers_make_progress_concurrently() {
    let b = bucket("par16");
    let s = server();
    let size = 64 << 10;
    for i in 0..16u64 {
        s.put(&b, &format!("par16/f{i:02}"), data(size, 1000 + i));
    }
    let m = Mount::new(&b, &[]);
    // Lookups first (one LIST), so only the GETs are timed.
    for i in 0..16 {
        assert_eq!(
            std::fs::metadata(m.p(&format!("par16/f{i:02}")))
                .unwrap()
                .len(),
            size as u64
        );
    }
    let delay = Duration::from_millis(300);
    let _delay = DelayGuard::set(s, "par16/", delay);
    let barrier = Arc::new(Barrier::new(16));
    let start = Instant::now();
    let threads: Vec<_> = (0..16u64)
        .map(|i| {
            let p = m.p(&format!("par16/f{i:02}"));
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                let got = std::fs::read(&p).unwrap();
                assert!(got == data(size, 1000 + i), "f{i:02}");
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let took = start.elapsed();
    eprintln!("16 readers with 300 ms GETs: {took:?}");
    assert!(took >= delay, "GETs were not delayed ({took:?})");
    // One after another would take 16 x 300 ms = 4.8 s.
    assert!(
        took < Duration::from_millis(1600),
        "16 readers took {took:?}: not concurrent"
    );
}

#[test]
fn throttling_and_5xx_are_retried_then_read_succeeds() {
    let srv = private_server();
    let b = bucket_on(&srv, "retry");
    // One directory each: a read of one would prefetch the other
    // (small-object read-ahead), and those GETs would take the failures.
    srv.put(&b, "r1/throttled", data(100_000, 11));
    srv.put(&b, "r2/internal", data(100_000, 12));
    let m = MountSpec::new(&b).server(&srv).mount();
    assert_eq!(names(&m.p("r1")), ["throttled"]);
    assert_eq!(names(&m.p("r2")), ["internal"]);
    for (name, status, seed) in [("r1/throttled", 503, 11), ("r2/internal", 500, 12)] {
        srv.reset_counts();
        srv.fail_next("GetObject", status, 2);
        let got = std::fs::read(m.p(name)).unwrap();
        assert!(got == data(100_000, seed), "{name} bytes");
        assert!(
            srv.request_count("GetObject") >= 3,
            "{status}: {} GETs, want 2 failed + 1 good",
            srv.request_count("GetObject")
        );
    }
}

/// A GET body that breaks part way (the connection cut, or no byte for the
/// attempt timeout) is continued from its first missing byte: the file reads
/// back exactly, with one more GET, and the server sends not one byte more
/// than for an unbroken read.
#[test]
fn a_broken_get_body_is_resumed_from_its_first_missing_byte() {
    let srv = private_server();
    let b = bucket_on(&srv, "bodycut");
    for (dir, seed) in [("plain", 31), ("cut", 31), ("stall", 31)] {
        srv.put(&b, &format!("{dir}/big"), data(3 << 20, seed));
        srv.put(&b, &format!("{dir}/small"), data(9_000, seed + 1));
    }
    let m = MountSpec::new(&b)
        .server(&srv)
        .config("[s3]\nstall_timeout_secs = 2.0\n")
        .mount();
    // What reading each file costs when nothing breaks.
    let mut plain = Vec::new();
    for name in ["big", "small"] {
        srv.reset_counts();
        std::fs::read(m.p(&format!("plain/{name}"))).unwrap();
        plain.push((srv.request_count("GetObject"), srv.get_body_bytes()));
    }
    for (dir, stall) in [("cut", false), ("stall", true)] {
        for ((name, size, seed), (gets, got)) in [("big", 3 << 20, 31), ("small", 9_000, 32)]
            .into_iter()
            .zip(&plain)
        {
            srv.reset_counts();
            srv.break_bodies(&format!("{dir}/{name}"), 4_000, stall, 1);
            let t = Instant::now();
            let read = std::fs::read(m.p(&format!("{dir}/{name}"))).unwrap();
            assert!(read == data(size, seed), "{dir}/{name}: bytes differ");
            assert_eq!(
                srv.request_count("GetObject"),
                gets + 1,
                "{dir}/{name}: GETs {:?}",
                srv.get_ranges()
            );
            assert_eq!(srv.get_body_bytes(), *got, "{dir}/{name}: bytes sent");
            // The GET after the break asks for the rest of the broken one.
            let ranges = srv.get_ranges();
            let first = ranges[0].1.clone().unwrap_or_default();
            let end = first.rsplit('-').next().unwrap_or_default().to_string();
            assert!(first.starts_with("bytes=0-"), "{dir}/{name}: {ranges:?}");
            assert!(
                ranges[1..]
                    .iter()
                    .any(|(_, r)| r.as_deref() == Some(&format!("bytes=4000-{end}"))),
                "{dir}/{name}: no GET resumed at byte 4000: {ranges:?}"
            );
            if stall {
                // The stall timeout (2 s) plus at most one backoff (1 s).
                assert!(t.elapsed() < Duration::from_secs(10), "{dir}/{name}");
            }
        }
    }
}

/// An object overwritten while its GET body is stalled: the resumed GET is
/// pinned to the old ETag, so the read fails with ESTALE instead of joining
/// bytes of two versions.
#[test]
fn an_object_changed_while_its_body_stalls_is_estale_not_mixed() {
    let srv = private_server();
    let b = bucket_on(&srv, "bodychange");
    srv.put(&b, "c/f", data(20_000, 51));
    let m = MountSpec::new(&b)
        .server(&srv)
        .config("[s3]\nstall_timeout_secs = 2.0\n")
        .mount();
    assert_eq!(names(&m.p("c")), ["f"]);
    srv.reset_counts();
    srv.break_bodies("c/f", 4_000, true, 1);
    let path = m.p("c/f");
    let reader = std::thread::spawn(move || std::fs::read(path));
    std::thread::sleep(Duration::from_millis(500));
    srv.put(&b, "c/f", data(20_000, 52));
    assert_errno(
        reader.join().unwrap(),
        libc::ESTALE,
        "read across an overwrite",
    );
    let ranges = srv.get_ranges();
    assert!(
        ranges
            .iter()
            .any(|(_, r)| r.as_deref().is_some_and(|r| r.starts_with("bytes=4000-"))),
        "no resumed GET: {ranges:?}"
    );
}

/// A body that breaks on every attempt ends in EIO, never in short or
/// mixed bytes.
#[test]
fn a_body_broken_on_every_attempt_is_eio() {
    let srv = private_server();
    let b = bucket_on(&srv, "bodycuteio");
    srv.put(&b, "e/f", data(200_000, 41));
    let m = MountSpec::new(&b)
        .server(&srv)
        .config("[s3]\nmax_attempts = 2\n")
        .mount();
    assert_eq!(names(&m.p("e")), ["f"]);
    srv.break_bodies("e/", 1_000, false, 100);
    assert_errno(std::fs::read(m.p("e/f")), libc::EIO, "read of a cut body");
    srv.break_bodies("e/", 0, false, 0);
    assert!(std::fs::read(m.p("e/f")).unwrap() == data(200_000, 41));
}

/// 503 SlowDown on the first 3 requests of every key (GETs of each object,
/// LISTs of each directory): every lookup, open and read still succeeds
/// with the right bytes (5 attempts by default).
#[test]
fn three_503s_on_every_key_still_read_every_file() {
    let srv = private_server();
    let b = bucket_on(&srv, "slowdown3");
    let files: Vec<(String, Vec<u8>)> = (0..16)
        .map(|i| {
            (
                format!("d{}/f{i:02}", i % 2),
                data(20_000 + i * 999, 80 + i as u64),
            )
        })
        .collect();
    for (k, d) in &files {
        srv.put(&b, k, d.clone());
    }
    let m = MountSpec::new(&b).server(&srv).mount();
    srv.fail_first_per_key(503, 3);
    std::thread::scope(|s| {
        for t in 0..8 {
            let (m, files) = (&m, &files);
            s.spawn(move || {
                for (k, d) in files.iter().skip(t).step_by(8) {
                    match std::fs::read(m.p(k)) {
                        Ok(got) => assert!(got == *d, "{k}: wrong bytes"),
                        Err(e) => panic!("{k}: {e}\n{}", m.log()),
                    }
                }
            });
        }
    });
    srv.fail_first_per_key(0, 0);
}

#[test]
fn get_failing_past_retries_is_eio_not_enoent() {
    let srv = private_server();
    let b = bucket_on(&srv, "geteio");
    srv.put(&b, "e/f", data(100_000, 21));
    srv.put(&b, "e/g", data(100_000, 22));
    let m = MountSpec::new(&b)
        .server(&srv)
        .config("[s3]\nmax_attempts = 2\n")
        .mount();
    assert_eq!(names(&m.p("e")), ["f", "g"]);

    srv.fail_next("GetObject", 503, 100);
    assert_errno(std::fs::read(m.p("e/f")), libc::EIO, "read under 503");
    srv.fail_next("GetObject", 500, 100);
    assert_errno(std::fs::read(m.p("e/g")), libc::EIO, "read under 500");
    srv.fail_next("GetObject", 0, 0);
    // The failure is not remembered: the same open file reads once S3 recovers.
    let f = File::open(m.p("e/f")).unwrap();
    let mut buf = vec![0u8; 1000];
    srv.fail_next("GetObject", 503, 100);
    assert_errno(f.read_at(&mut buf, 0), libc::EIO, "read_at under 503");
    srv.fail_next("GetObject", 0, 0);
    let n = f.read_at(&mut buf, 0).unwrap();
    assert!(
        n > 0 && buf[..n] == data(100_000, 21)[..n],
        "read_at after recovery"
    );
    assert!(std::fs::read(m.p("e/f")).unwrap() == data(100_000, 21));
    assert!(std::fs::read(m.p("e/g")).unwrap() == data(100_000, 22));
}

#[test]
fn list_failing_past_retries_is_eio_not_enoent() {
    let srv = private_server();
    let b = bucket_on(&srv, "listeio");
    srv.put(&b, "l/a/f", "f");
    srv.put(&b, "l/b/g", "g");
    let m = MountSpec::new(&b)
        .server(&srv)
        .config("[s3]\nmax_attempts = 2\n")
        .mount();

    srv.fail_next("ListObjectsV2", 503, 100);
    // The root was never listed: looking up `l` needs a LIST.
    assert_errno(std::fs::metadata(m.p("l")), libc::EIO, "lookup l");
    srv.fail_next("ListObjectsV2", 0, 0);
    assert_eq!(names(&m.p("l")), ["a", "b"]);
    srv.fail_next("ListObjectsV2", 503, 100);
    // A lookup in the new directory `l/a`, and reading `l/b`.
    assert_errno(std::fs::metadata(m.p("l/a/f")), libc::EIO, "lookup l/a/f");
    assert_errno(
        std::fs::read_dir(m.p("l/b")).map(drop),
        libc::EIO,
        "opendir l/b",
    );
    srv.fail_next("ListObjectsV2", 500, 100);
    assert_errno(
        std::fs::read(m.p("l/a/f")),
        libc::EIO,
        "open l/a/f under 500",
    );
    // A LIST can find nothing "not found": a 404 to it is a fault.
    srv.fail_next("ListObjectsV2", 404, 100);
    assert_errno(
        std::fs::read(m.p("l/a/f")),
        libc::EIO,
        "open l/a/f under a LIST 404",
    );
    srv.fail_next("ListObjectsV2", 0, 0);
    // Failures are not cached as "no such file".
    assert_eq!(std::fs::read(m.p("l/a/f")).unwrap(), b"f");
    assert_eq!(names(&m.p("l/b")), ["g"]);
    assert_errno(std::fs::metadata(m.p("l/a/nope")), libc::ENOENT, "missing");
}

#[test]
fn missing_object_is_enoent_not_eio() {
    let b = bucket("missing");
    let s = server();
    s.put(&b, "miss/a", "a");
    s.put(&b, "miss/b", data(100_000, 31));
    let m = Mount::new(&b, &["--metadata-ttl", "0"]);
    assert_errno(std::fs::metadata(m.p("miss/nope")), libc::ENOENT, "stat");
    assert_errno(std::fs::read(m.p("miss/nope")), libc::ENOENT, "open");
    assert_errno(std::fs::metadata(m.p("nodir/x")), libc::ENOENT, "stat");
    assert_eq!(names(&m.p("miss")), ["a", "b"]);
    // Deleted after it was listed: gone at the next open.
    s.delete(&b, "miss/a");
    assert_errno(std::fs::read(m.p("miss/a")), libc::ENOENT, "open deleted");
    // Deleted after it was opened: the open file is stale, never EIO.
    let mut f = File::open(m.p("miss/b")).unwrap();
    s.delete(&b, "miss/b");
    let mut buf = Vec::new();
    assert_errno(f.read_to_end(&mut buf), libc::ESTALE, "read deleted");
    assert!(buf.is_empty());
}

/// Metric of hedged GETs the hedge answered first.
const HEDGE_WON: &str = "lakemount_s3_hedges_total{op=\"GET\",won=\"hedge\"}";

/// A mount of bucket `b` on `srv` with `config` (TOML: at most 4
/// prefetch GETs at once unless it sets `[read]`, and a metrics endpoint
/// added) that knows the server's latencies: 200 small files under `warm/`
/// read through it, 4 at a time. Few GETs at once: a burst that queues at
/// the server is hedged too, and would spend the hedge budget (20 at once,
/// then 1 per 10 GETs). Returns the mount and its metrics address.
fn mount_knowing_latencies(srv: &TestServer, b: &str, config: &str) -> (Mount, String) {
    let warm: Vec<(String, Vec<u8>)> = (0..200)
        .map(|i| (format!("warm/f{i:03}"), data(3_000 + i, i as u64)))
        .collect();
    for (k, d) in &warm {
        srv.put(b, k, d.clone());
    }
    let addr = format!("127.0.0.1:{}", free_port());
    let read = if config.contains("[read]") {
        ""
    } else {
        "[read]\nsmall_max_in_flight = 4\n"
    };
    let m = MountSpec::new(b)
        .server(srv)
        .config(&format!(
            "{config}{read}[telemetry]\nmetrics_addr = \"{addr}\"\n"
        ))
        .mount();
    assert!(read_all_4(&m, &warm).is_empty());
    (m, addr)
}

/// Hedged GETs so far, whichever request answered first, from the metrics
/// endpoint at `addr`.
fn hedges(addr: &str) -> f64 {
    let body = scrape(addr);
    metric(&body, HEDGE_WON) + metric(&body, "lakemount_s3_hedges_total{op=\"GET\",won=\"first\"}")
}

/// GETs the server holds (their answers 30 s late, with a 60 s attempt
/// timeout) are answered by their hedges once the mount knows the server's
/// latencies: byte-exact, in a fraction of the hold, and counted.
#[test]
fn gets_the_server_holds_are_answered_by_their_hedges() {
    let srv = private_server();
    let b = bucket_on(&srv, "hedge");
    let held: Vec<(String, Vec<u8>)> = (0..12)
        .map(|i| {
            (
                format!("held/f{i:02}"),
                data(40_000 + i * 77, 500 + i as u64),
            )
        })
        .collect();
    for (k, d) in &held {
        srv.put(&b, k, d.clone());
    }
    let (m, addr) = mount_knowing_latencies(&srv, &b, "[s3]\nattempt_timeout_secs = 60.0\n");
    // The listing of held/ before its keys are held.
    assert_eq!(names(&m.p("held")).len(), held.len());
    srv.hold_first_per_key(Duration::from_secs(30), 1);
    let t = Instant::now();
    let bad = read_all_4(&m, &held);
    let took = t.elapsed();
    srv.hold_first_per_key(Duration::ZERO, 0);
    assert!(bad.is_empty(), "{bad:?}\n{}", m.log());
    assert!(
        took < Duration::from_secs(15),
        "held GETs were waited out: {took:?}\n{}",
        m.log()
    );
    let body = scrape(&addr);
    let won = metric(&body, HEDGE_WON);
    // A held prefetch GET of a key opened in a race with its scan is
    // dropped, and the opener's own GET (not held: the second of its key)
    // needs no hedge.
    let dropped = metric(
        &body,
        "lakemount_small_prefetch_dropped_total{reason=\"opened\"}",
    );
    assert!(
        won + dropped >= held.len() as f64,
        "{won} hedges won, {dropped} racing copies dropped"
    );
}

/// Prefetch GETs the server holds while no reader waits for them are not
/// hedged: a hedge spends server capacity to cut a reader's wait, and a
/// busy server only gets busier. The one file the reader waited for is.
#[test]
fn prefetch_gets_nobody_waits_for_are_not_hedged() {
    let srv = private_server();
    let b = bucket_on(&srv, "hedgeahead");
    let ahead: Vec<(String, Vec<u8>)> = (0..16)
        .map(|i| {
            (
                format!("ahead/f{i:02}"),
                data(9_000 + i * 31, 700 + i as u64),
            )
        })
        .collect();
    for (k, d) in &ahead {
        srv.put(&b, k, d.clone());
    }
    let (m, addr) = mount_knowing_latencies(&srv, &b, "[read]\nsmall_max_in_flight = 8\n");
    assert_eq!(names(&m.p("ahead")).len(), ahead.len());
    let before = hedges(&addr);
    srv.hold_first_per_key(Duration::from_secs(1), 1);
    srv.reset_counts();
    // The first open waits for its own GET (hedged) and starts the prefetch
    // of the other 15, which the server holds 1 s each, 8 at a time.
    let t = Instant::now();
    assert_eq!(std::fs::read(m.p(&ahead[0].0)).unwrap(), ahead[0].1);
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    std::thread::sleep(Duration::from_millis(3_500));
    srv.hold_first_per_key(Duration::ZERO, 0);
    assert!(read_all_4(&m, &ahead[1..]).is_empty());
    let hedged = hedges(&addr) - before;
    assert_eq!(hedged, 1.0, "hedges: {hedged}\n{}", m.log());
    assert_eq!(
        srv.request_count("GetObject"),
        ahead.len() as u64 + 1,
        "{:?}",
        srv.request_counts()
    );
}

/// A body that stops part way (the stall timeout set to 60 s) is continued
/// by a hedged GET of its rest, pinned to its ETag, long before the stall
/// timeout: the file reads back exactly, and the hedge asked for the bytes
/// after the break only.
#[test]
fn a_body_that_stops_is_continued_by_a_hedge_before_the_stall_timeout() {
    let srv = private_server();
    let b = bucket_on(&srv, "hedgebody");
    srv.put(&b, "stop/big", data(2 << 20, 77));
    let (m, addr) = mount_knowing_latencies(&srv, &b, "[s3]\nstall_timeout_secs = 60.0\n");
    assert_eq!(names(&m.p("stop")), ["big"]);
    srv.reset_counts();
    srv.break_bodies("stop/big", 100_000, true, 1);
    let t = Instant::now();
    let got = std::fs::read(m.p("stop/big")).unwrap();
    let took = t.elapsed();
    assert!(got == data(2 << 20, 77), "bytes differ");
    assert!(
        took < Duration::from_secs(20),
        "the stalled body was waited out: {took:?}\n{}\n{}",
        scrape(&addr)
            .lines()
            .filter(|l| l.contains("hedge"))
            .collect::<Vec<_>>()
            .join("\n"),
        m.log()
    );
    let ranges = srv.get_ranges();
    let stopped = ranges
        .iter()
        .filter_map(|(_, r)| r.as_deref()?.strip_prefix("bytes="))
        .find(|r| r.starts_with("0-"))
        .expect("a GET from byte 0")
        .to_string();
    let end = stopped.rsplit('-').next().unwrap();
    assert!(
        ranges
            .iter()
            .any(|(_, r)| r.as_deref() == Some(&format!("bytes=100000-{end}"))),
        "no GET of the rest after byte 100000: {ranges:?}"
    );
}

/// A prefetch GET whose body stops part way while no reader waits for it
/// (the stall timeout set to 60 s) is not hedged then, and is hedged as soon
/// as a reader opens the file and waits: the file reads back exactly, long
/// before the stall timeout.
#[test]
fn a_prefetch_body_that_stops_is_hedged_once_a_reader_waits() {
    let srv = private_server();
    let b = bucket_on(&srv, "hedgepause");
    srv.put(&b, "pause/a", data(5_000, 41));
    srv.put(&b, "pause/z", data(600_000, 42));
    let (m, addr) = mount_knowing_latencies(&srv, &b, "[s3]\nstall_timeout_secs = 60.0\n");
    assert_eq!(names(&m.p("pause")), ["a", "z"]);
    srv.break_bodies("pause/z", 100_000, true, 1);
    // Reading `a` starts the prefetch of `z`, whose body stops after
    // 100,000 bytes; nobody waits for it yet.
    assert_eq!(std::fs::read(m.p("pause/a")).unwrap(), data(5_000, 41));
    // Reads waited for until here may have been hedged on a busy machine.
    let before = hedges(&addr);
    std::thread::sleep(Duration::from_millis(1_500));
    assert_eq!(hedges(&addr) - before, 0.0, "hedged while nobody waited");
    let t = Instant::now();
    let got = std::fs::read(m.p("pause/z")).unwrap();
    let took = t.elapsed();
    assert!(got == data(600_000, 42), "bytes differ");
    assert!(
        took < Duration::from_secs(20),
        "the stopped body was waited out: {took:?}\n{}",
        m.log()
    );
    assert_eq!(hedges(&addr) - before, 1.0);
}

/// A server that sends a GET's headers at once and its body late (every
/// GET of the key, a hedge's too) gets a hedge, not one per hedge delay:
/// a hedge wins only with body bytes. Had its headers won, its body would
/// have paused in turn and been hedged again, until the hedge budget ran
/// out: a GET per hedge delay (21 here), all adding to the server's load.
/// (At most 3: a pause of the first body's later chunks on a busy machine
/// may be hedged too.)
#[test]
fn a_body_sent_late_after_its_headers_is_hedged_once() {
    let srv = private_server();
    let b = bucket_on(&srv, "hedgelate");
    srv.put(&b, "late/x", data(50_000, 43));
    let (m, addr) = mount_knowing_latencies(&srv, &b, "");
    assert_eq!(names(&m.p("late")), ["x"]);
    srv.set_delay("GetObjectBody", "late/", Duration::from_millis(400));
    srv.reset_counts();
    let before = hedges(&addr);
    assert!(std::fs::read(m.p("late/x")).unwrap() == data(50_000, 43));
    let gets = srv.request_count("GetObject");
    let hedged = hedges(&addr) - before;
    assert!(
        gets <= 3 && hedged <= 2.0,
        "{gets} GETs, {hedged} hedges for one late body:\n{}",
        scrape(&addr)
            .lines()
            .filter(|l| l.contains("hedge"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Credentials from a `credential_process` that expire every few seconds,
/// and whose process fails twice in a row on its second and third runs (a
/// provider that is down for a moment), are refreshed while files are read:
/// every read succeeds (a failed provider is retried, never EACCES), and the
/// process ran again after the failures.
#[test]
fn expiring_credentials_are_refreshed_during_reads_without_a_failed_read() {
    let srv = private_server();
    let b = bucket_on(&srv, "credproc");
    let files: Vec<(String, Vec<u8>)> = (0..40)
        .map(|i| {
            (
                format!("d{}/f{i:02}", i % 4),
                data(30_000 + i * 13, 900 + i as u64),
            )
        })
        .collect();
    for (k, d) in &files {
        srv.put(&b, k, d.clone());
    }
    let dir = TempDir::new("credproc");
    let count = dir.0.join("runs");
    let script = dir.0.join("creds.sh");
    // Expiration 62 s out: lakemount refreshes a minute early, so every
    // ~2 s; the AWS SDK's own cache (listings) after ~52 s.
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nn=$(cat {c} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {c}\n\
             case $n in 2|3) echo 'provider down' >&2; exit 1;; esac\n\
             exp=$(date -u -d '+62 seconds' +%Y-%m-%dT%H:%M:%SZ)\n\
             printf '{{\"Version\":1,\"AccessKeyId\":\"{ACCESS_KEY}\",\"SecretAccessKey\":\"{SECRET_KEY}\",\"Expiration\":\"%s\"}}' \"$exp\"\n",
            c = count.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let profile = dir.0.join("aws-config");
    std::fs::write(
        &profile,
        format!("[profile lm]\ncredential_process = {}\n", script.display()),
    )
    .unwrap();
    let m = MountSpec::new(&b)
        .server(&srv)
        .unset_env("AWS_ACCESS_KEY_ID")
        .unset_env("AWS_SECRET_ACCESS_KEY")
        .env("AWS_CONFIG_FILE", profile.to_str().unwrap())
        .env("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
        .env("AWS_PROFILE", "lm")
        .mount();
    let t = Instant::now();
    let mut rounds = 0;
    while t.elapsed() < Duration::from_secs(8) {
        for (k, _) in &files {
            drop_page_cache(&m.p(k));
        }
        let bad = read_all_4(&m, &files);
        assert!(bad.is_empty(), "round {rounds}: {bad:?}\n{}", m.log());
        rounds += 1;
        std::thread::sleep(Duration::from_millis(300));
    }
    let runs: u32 = std::fs::read_to_string(&count)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Reads the kernel issued itself (read-ahead) are retried by it; the
    // log shows every failed FUSE request.
    let log = m.log();
    assert!(
        !log.contains("request failed"),
        "a FUSE request failed:\n{log}"
    );
    assert!(
        runs >= 5,
        "credential_process ran {runs} times in {rounds} rounds"
    );
}
