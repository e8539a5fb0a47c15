//! Mounts without FUSE opens (`read.no_open`): files read right, the kernel
//! sends no open or release, pages are kept across opens, a changed object
//! is read anew after the metadata TTL, and per-inode handles are released.

mod common;

use std::time::Duration;

use common::*;

const NO_OPEN: &str = "[read]\nno_open = true\n";

fn op(body: &str, op: &str) -> f64 {
    metric(
        body,
        &format!("lakemount_fuse_requests_total{{op=\"{op}\"}}"),
    )
}

/// Small objects (prefetched) and a large one read twice: right bytes,
/// no open or release request past the first open (answered ENOSYS), the
/// second reading served from the kept page cache with no request, and
/// every per-inode handle released once its file was read to its end.
#[test]
fn files_are_read_with_no_open_or_release_requests() {
    let srv = private_server();
    let b = bucket_on(&srv, "noopen");
    let mut files: Vec<(String, Vec<u8>)> = (0..30)
        .map(|i| {
            let d = data(3_000 + 97 * i, 900 + i as u64);
            let k = format!("d/f{i:02}.jpg");
            srv.put(&b, &k, d.clone());
            (k, d)
        })
        .collect();
    let large = data(5 << 20, 999);
    srv.put(&b, "big.bin", large.clone());
    files.push(("big.bin".into(), large));
    let addr = format!("127.0.0.1:{}", free_port());
    let m = MountSpec::new(&b)
        .server(&srv)
        .config(NO_OPEN)
        .args(&["--metrics-addr", &addr])
        .mount();
    for (k, d) in &files {
        assert!(
            std::fs::read(m.p(k)).unwrap() == *d,
            "first read: {k} differs"
        );
    }
    let first = scrape(&addr);
    assert!(op(&first, "open") <= 1.0, "{first}");
    assert_eq!(op(&first, "release"), 0.0, "{first}");
    assert!(op(&first, "read") >= files.len() as f64, "{first}");
    // Each object once (the small ones prefetched), none again.
    let gets = srv.request_count("GetObject");
    assert!(gets <= 31 + 8, "{gets} GETs for 31 objects");
    for (k, d) in &files {
        assert!(
            std::fs::read(m.p(k)).unwrap() == *d,
            "second read: {k} differs"
        );
    }
    let second = scrape(&addr);
    for name in ["open", "release", "read", "lookup", "getattr"] {
        assert_eq!(
            op(&second, name),
            op(&first, name),
            "{name} requests in the second reading:\n{second}"
        );
    }
    assert_eq!(srv.request_count("GetObject"), gets);
    assert_eq!(
        metric(&second, "lakemount_fuse_inode_handles"),
        0.0,
        "{second}"
    );
}

/// Pages are kept across opens, but an inode is one object version: an
/// overwritten object is read with its new bytes once the metadata TTL has
/// passed, never the old pages.
#[test]
fn an_overwritten_object_is_read_anew_after_the_ttl() {
    let srv = private_server();
    let b = bucket_on(&srv, "noopenttl");
    let old = data(8_000, 1);
    let new = data(6_500, 2);
    srv.put(&b, "x/a.bin", old.clone());
    let m = MountSpec::new(&b)
        .server(&srv)
        .config(&format!("{NO_OPEN}[metadata]\nttl_secs = 1.0\n"))
        .mount();
    assert!(std::fs::read(m.p("x/a.bin")).unwrap() == old);
    srv.put(&b, "x/a.bin", new.clone());
    std::thread::sleep(Duration::from_millis(1_500));
    let got = std::fs::read(m.p("x/a.bin")).unwrap();
    assert!(got == new, "read {} bytes of the old version", got.len());
}

/// An open file whose object was overwritten keeps reading its own version
/// (from the data cache) after the name shows the new one: with no open the
/// kernel would not look the name up again, so ESTALE would reach the reader.
#[test]
fn an_open_file_keeps_its_version_after_an_overwrite() {
    let srv = private_server();
    let b = bucket_on(&srv, "noopenver");
    let old = data(200_000, 3);
    let new = data(150_000, 4);
    srv.put(&b, "v/a.bin", old.clone());
    let dir = TempDir::new("noopen-ver");
    let m = MountSpec::new(&b)
        .server(&srv)
        .config(&format!(
            "{NO_OPEN}[metadata]\nttl_secs = 1.0\n[cache]\ndir = \"{}\"\n",
            dir.0.join("c").display()
        ))
        .mount();
    let f = std::fs::File::open(m.p("v/a.bin")).unwrap();
    assert!(std::fs::read(m.p("v/a.bin")).unwrap() == old);
    srv.put(&b, "v/a.bin", new.clone());
    std::thread::sleep(Duration::from_millis(1_500));
    assert!(
        std::fs::read(m.p("v/a.bin")).unwrap() == new,
        "name not anew"
    );
    // The old inode's pages gone: its reads come to lakemount again.
    use std::os::fd::AsRawFd;
    // SAFETY: posix_fadvise(2) on an open descriptor.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(r, 0, "posix_fadvise");
    let mut got = vec![0u8; old.len()];
    use std::os::unix::fs::FileExt;
    f.read_exact_at(&mut got, 0).unwrap();
    assert!(got == old, "the open file changed version");
}
