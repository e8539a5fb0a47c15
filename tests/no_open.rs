//! Mounts without FUSE opens (`read.no_open`): files read right, the kernel
//! sends no open or release, pages are kept across opens, a changed object
//! is read anew after the metadata TTL, and per-inode handles are released.
//! With a data cache, prefetched small objects (up to 1 MiB) are pushed to
//! the page cache and hold the small-object budget until the loader's ioctl
//! (or, from a loader that sends none, a GETATTR the mount asks for).

mod common;

use std::os::unix::fs::FileExt;
use std::time::Duration;

use common::*;

const NO_OPEN: &str = "[read]\nno_open = true\n";

/// A server, a bucket of it, and a mount of that bucket without opens with
/// metrics at `addr`. Declared so: dropped in this order, the mount before
/// the server.
struct NoOpen {
    m: Mount,
    addr: String,
    b: String,
    srv: lakemount_testserver::TestServer,
}

/// A private server whose bucket (tagged `tag`) holds `objects`, mounted
/// without opens with `more` config text.
fn mounted(tag: &str, objects: &[(String, Vec<u8>)], more: &str) -> NoOpen {
    let srv = private_server();
    let b = bucket_on(&srv, tag);
    for (k, d) in objects {
        srv.put(&b, k, d.clone());
    }
    let addr = format!("127.0.0.1:{}", free_port());
    let m = MountSpec::new(&b)
        .server(&srv)
        .config(&format!("{NO_OPEN}{more}"))
        .args(&["--metrics-addr", &addr])
        .mount();
    NoOpen { m, addr, b, srv }
}

/// Small objects the mount put in the page cache (`result="ok"`).
fn fills(t: &NoOpen) -> f64 {
    metric(
        &scrape(&t.addr),
        "lakemount_page_cache_fills_total{result=\"ok\"}",
    )
}

/// Pushed objects whose kernel attributes were made stale.
fn stale(t: &NoOpen) -> f64 {
    metric(&scrape(&t.addr), "lakemount_fuse_attr_invalidations_total")
}

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
    let mut files: Vec<(String, Vec<u8>)> = (0..30)
        .map(|i| {
            (
                format!("d/f{i:02}.jpg"),
                data(3_000 + 97 * i, 900 + i as u64),
            )
        })
        .collect();
    files.push(("big.bin".into(), data(5 << 20, 999)));
    let t = mounted("noopen", &files, "");
    for (k, d) in &files {
        assert!(
            std::fs::read(t.m.p(k)).unwrap() == *d,
            "first read: {k} differs"
        );
    }
    let first = scrape(&t.addr);
    assert!(op(&first, "open") <= 1.0, "{first}");
    assert_eq!(op(&first, "release"), 0.0, "{first}");
    assert!(op(&first, "read") >= files.len() as f64, "{first}");
    // Each object once (the small ones prefetched), none again.
    let gets = t.srv.request_count("GetObject");
    assert!(gets <= 31 + 8, "{gets} GETs for 31 objects");
    for (k, d) in &files {
        assert!(
            std::fs::read(t.m.p(k)).unwrap() == *d,
            "second read: {k} differs"
        );
    }
    let second = scrape(&t.addr);
    for name in ["open", "release", "read", "lookup", "getattr"] {
        assert_eq!(
            op(&second, name),
            op(&first, name),
            "{name} requests in the second reading:\n{second}"
        );
    }
    assert_eq!(t.srv.request_count("GetObject"), gets);
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
    let (old, new) = (data(8_000, 1), data(6_500, 2));
    let files = [("x/a.bin".to_string(), old.clone())];
    let t = mounted("noopenttl", &files, "[metadata]\nttl_secs = 1.0\n");
    assert!(std::fs::read(t.m.p("x/a.bin")).unwrap() == old);
    t.srv.put(&t.b, "x/a.bin", new.clone());
    std::thread::sleep(Duration::from_millis(1_500));
    let got = std::fs::read(t.m.p("x/a.bin")).unwrap();
    assert!(got == new, "read {} bytes of the old version", got.len());
}

/// An open file whose object was overwritten keeps reading its own version
/// (from the data cache) after the name shows the new one: with no open the
/// kernel would not look the name up again, so ESTALE would reach the reader.
#[test]
fn an_open_file_keeps_its_version_after_an_overwrite() {
    let (old, new) = (data(200_000, 3), data(150_000, 4));
    let dir = TempDir::new("noopen-ver");
    let more = format!(
        "[metadata]\nttl_secs = 1.0\n[cache]\ndir = \"{}\"\n",
        dir.0.join("c").display()
    );
    let t = mounted("noopenver", &[("v/a.bin".to_string(), old.clone())], &more);
    let f = std::fs::File::open(t.m.p("v/a.bin")).unwrap();
    assert!(std::fs::read(t.m.p("v/a.bin")).unwrap() == old);
    t.srv.put(&t.b, "v/a.bin", new.clone());
    std::thread::sleep(Duration::from_millis(1_500));
    let now = std::fs::read(t.m.p("v/a.bin")).unwrap();
    assert!(now == new, "the name shows the old version");
    // The old inode's pages gone: its reads come to lakemount again.
    use std::os::fd::AsRawFd;
    // SAFETY: posix_fadvise(2) on an open descriptor.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(r, 0, "posix_fadvise");
    let reads = op(&scrape(&t.addr), "read");
    let mut got = vec![0u8; old.len()];
    f.read_exact_at(&mut got, 0).unwrap();
    assert!(got == old, "the open file changed version");
    let after = op(&scrape(&t.addr), "read");
    assert!(after > reads, "not read from lakemount");
}

/// A reader of a file's tail first (a zip directory, a Parquet footer)
/// keeps its handle past that read of the end, for the reads from the start
/// that follow; a file read from its start to its end gives its handle back.
#[test]
fn a_read_of_the_tail_first_keeps_the_handle() {
    let body = data(300_000, 5);
    let small = data(20_000, 6);
    let files = [
        ("z/a.zip".to_string(), body.clone()),
        ("z/b.bin".to_string(), small.clone()),
    ];
    let t = mounted("noopentail", &files, "");
    let handles = || metric(&scrape(&t.addr), "lakemount_fuse_inode_handles");
    let f = std::fs::File::open(t.m.p("z/a.zip")).unwrap();
    let mut tail = vec![0u8; 4096];
    f.read_exact_at(&mut tail, body.len() as u64 - 4096)
        .unwrap();
    assert!(tail[..] == body[body.len() - 4096..]);
    assert_eq!(handles(), 1.0, "the tail's handle was released");
    let mut all = vec![0u8; body.len()];
    f.read_exact_at(&mut all, 0).unwrap();
    assert!(all == body);
    assert!(std::fs::read(t.m.p("z/b.bin")).unwrap() == small);
    assert_eq!(handles(), 1.0, "b.bin was read whole: only a.zip's is kept");
}

/// With a data cache, the objects small-object read-ahead fetches are put
/// in their inodes' page cache as they arrive: a loader's reads of them
/// then send no request at all, and no GET. Without a data cache nothing is
/// pushed (a page the kernel dropped would cost a GET again).
#[test]
fn prefetched_objects_are_in_the_page_cache_before_they_are_read() {
    let files: Vec<(String, Vec<u8>)> = (0..30)
        .map(|i| {
            (
                format!("p/s{i:02}.jpg"),
                data(4_000 + 61 * i, 700 + i as u64),
            )
        })
        .collect();
    let dir = TempDir::new("noopen-push");
    let more = format!("[cache]\ndir = \"{}\"\n", dir.0.join("c").display());
    let t = mounted("noopenpush", &files, &more);
    // `ls` first, as a loader's index does: the kernel then holds every inode.
    assert_eq!(names(&t.m.p("p")).len(), 30);
    assert!(std::fs::read(t.m.p(&files[0].0)).unwrap() == files[0].1);
    let pushed = wait_for(Duration::from_secs(10), || fills(&t) >= 29.0);
    assert!(pushed.is_some(), "{} pushed:\n{}", fills(&t), t.m.log());
    let reads = op(&scrape(&t.addr), "read");
    for (k, d) in &files[1..] {
        assert!(std::fs::read(t.m.p(k)).unwrap() == *d, "{k} differs");
    }
    assert_eq!(
        op(&scrape(&t.addr), "read"),
        reads,
        "reads came to lakemount"
    );
    assert_eq!(t.srv.request_count("GetObject"), 30);
    // Pushed objects are hits, not unused read-ahead.
    let hits = |t: &NoOpen| {
        metric(
            &scrape(&t.addr),
            "lakemount_small_prefetch_hits_total{state=\"pushed\"}",
        )
    };
    let counted = wait_for(Duration::from_secs(5), || hits(&t) >= fills(&t));
    assert!(counted.is_some(), "{} hits, {} pushed", hits(&t), fills(&t));
    let unused = metric(&scrape(&t.addr), "lakemount_prefetch_unused_bytes_total");
    assert_eq!(unused, 0.0, "pushed bytes counted as unused");

    let t = mounted("noopenpush2", &files, "");
    assert_eq!(names(&t.m.p("p")).len(), 30);
    assert!(std::fs::read(t.m.p(&files[0].0)).unwrap() == files[0].1);
    wait_for(Duration::from_secs(10), || {
        t.srv.request_count("GetObject") >= 30
    });
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(fills(&t), 0.0, "pushed without a data cache");
}

/// Objects over 1 MiB are not pushed, even when `read.small_max_size`
/// makes them small: their reads come to lakemount, with the right bytes.
#[test]
fn objects_over_one_mib_are_not_pushed() {
    let mut files: Vec<(String, Vec<u8>)> = (0..6)
        .map(|i| (format!("l/s{i}.jpg"), data(5_000, 900 + i as u64)))
        .collect();
    files.push(("l/z-big.bin".into(), data(1_572_864, 999)));
    let dir = TempDir::new("noopen-pushbig");
    let more = format!(
        "small_max_size = 2097152\n[cache]\ndir = \"{}\"\n",
        dir.0.join("c").display()
    );
    let t = mounted("noopenpushbig", &files, &more);
    assert_eq!(names(&t.m.p("l")).len(), 7);
    assert!(std::fs::read(t.m.p(&files[0].0)).unwrap() == files[0].1);
    // The first read's own GET, then the other five small ones and the
    // large one, prefetched.
    let fetched = wait_for(Duration::from_secs(10), || {
        t.srv.request_count("GetObject") >= 7
    });
    assert!(
        fetched.is_some(),
        "{} GETs",
        t.srv.request_count("GetObject")
    );
    // Counted as fetched before the push is asked for: by then a push of
    // the large object would be under way.
    let prefetched = || metric(&scrape(&t.addr), "lakemount_small_prefetch_objects_total");
    let all = wait_for(Duration::from_secs(10), || prefetched() >= 6.0);
    assert!(all.is_some(), "{} prefetched", prefetched());
    wait_for(Duration::from_secs(5), || fills(&t) >= 5.0);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(fills(&t), 5.0, "pushed other than the five small objects");
    let reads = op(&scrape(&t.addr), "read");
    let (k, d) = files.last().unwrap();
    assert!(std::fs::read(t.m.p(k)).unwrap() == *d, "{k} differs");
    assert!(
        op(&scrape(&t.addr), "read") > reads,
        "the large object was in the page cache"
    );
    assert_eq!(t.srv.request_count("GetObject"), 7, "read from S3 again");
}

/// 30 objects of 5,000 bytes in directory `d`, mounted without opens with
/// memory for one of them (`small_budget`) and a data cache (`cache_more`
/// added to its section), listed, and the first read: its directory's
/// small-object read-ahead has begun. Returns the cache's directory, the
/// mount and the objects (bound in that order, the mount is dropped before
/// its cache directory).
fn one_in_memory(d: &str, cache_more: &str) -> (TempDir, NoOpen, Vec<(String, Vec<u8>)>) {
    let files: Vec<(String, Vec<u8>)> = (0..30)
        .map(|i| (format!("{d}/s{i:02}.jpg"), data(5_000, 800 + i as u64)))
        .collect();
    let dir = TempDir::new(&format!("noopen-push-{d}"));
    let more = format!(
        "small_budget = 8000\nsmall_max_size = 8000\n[cache]\ndir = \"{}\"\n{cache_more}",
        dir.0.join("c").display()
    );
    let t = mounted(&format!("noopenpush{d}"), &files, &more);
    assert_eq!(names(&t.m.p(d)).len(), 30);
    assert!(std::fs::read(t.m.p(&files[0].0)).unwrap() == files[0].1);
    (dir, t, files)
}

/// Objects pushed to the page cache leave memory, but count against half
/// the data cache's size limit until the loader is seen at them (Python's
/// `open` sends an ioctl, TCGETS, for each file): prefetch does not run
/// ahead of the loader by more than that.
#[test]
fn pushed_objects_hold_the_budget_until_the_loader_gets_to_them() {
    // Half of 32 KiB: room for three objects of 5,000 bytes ahead.
    let (_dir, t, files) = one_in_memory("q", "max_size = \"32KiB\"\n");
    wait_for(Duration::from_secs(5), || fills(&t) >= 3.0);
    std::thread::sleep(Duration::from_millis(300));
    let held = fills(&t);
    assert!((1.0..=3.0).contains(&held), "{held} pushed with room for 3");
    // Opened as Python opens: TCGETS (isatty) first, then read. Each file
    // the loader gets to gives its budget to the next object, which is
    // fetched and pushed before the loader reads on.
    for (i, (k, d)) in files.iter().enumerate().skip(1) {
        let f = std::fs::File::open(t.m.p(k)).unwrap();
        use std::os::fd::AsRawFd;
        let mut tio = std::mem::MaybeUninit::<libc::termios>::uninit();
        // SAFETY: TCGETS into a termios buffer of the right size.
        let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::TCGETS, tio.as_mut_ptr()) };
        assert_eq!(r, -1, "a regular file is no terminal");
        let want = (held + i as f64).min(29.0);
        let next = wait_for(Duration::from_secs(5), || fills(&t) >= want);
        assert!(
            next.is_some(),
            "{} pushed after {i} files, want {want}; refused: {}\n{}",
            fills(&t),
            metric(
                &scrape(&t.addr),
                "lakemount_page_cache_fills_total{result=\"failed\"}"
            ),
            t.m.log()
        );
        let mut got = Vec::new();
        use std::io::Read;
        (&f).read_to_end(&mut got).unwrap();
        assert!(got == *d, "{k} differs");
    }
    assert_eq!(fills(&t), 29.0, "pushed other than each object once");
}

/// A loader that sends no request for the files it reads (C or Rust
/// readers, CPython 3.14+ whose `open` asks no `isatty` of a regular file)
/// is never seen at pushed objects: they leave memory when pushed, so
/// prefetch still runs past the small-object budget, up to half the data
/// cache's size limit, and the loader's reads need no request and no GET.
#[test]
fn a_loader_that_sends_no_request_per_file_gets_prefetch_past_the_budget() {
    // The cache's limit leaves room for all.
    let (_dir, t, files) = one_in_memory("r", "");
    let all = wait_for(Duration::from_secs(10), || fills(&t) >= 29.0);
    assert!(all.is_some(), "{} of 29 pushed:\n{}", fills(&t), t.m.log());
    let reads = op(&scrape(&t.addr), "read");
    for (k, d) in &files[1..] {
        assert!(std::fs::read(t.m.p(k)).unwrap() == *d, "{k} differs");
    }
    let after = scrape(&t.addr);
    assert_eq!(op(&after, "read"), reads, "reads came to lakemount");
    assert_eq!(op(&after, "ioctl"), 0.0, "{after}");
    assert_eq!(t.srv.request_count("GetObject"), 30);
}

/// Waits until three objects are pushed ahead of a loader not seen yet
/// (room for three) and, after `SILENCE` (1 s), the loader is found silent
/// and they get stale attributes; returns how many were pushed.
fn found_silent(t: &NoOpen) -> f64 {
    wait_for(Duration::from_secs(5), || fills(t) >= 3.0);
    let held = fills(t);
    assert!((1.0..=3.0).contains(&held), "{held} pushed with room for 3");
    let asked = wait_for(Duration::from_secs(10), || stale(t) >= held);
    assert!(asked.is_some(), "{} made stale\n{}", stale(t), t.m.log());
    held
}

/// Reads `files` after the first in order with `std::fs::read` (no ioctl),
/// `before` each, and checks that each read gives its room to the next
/// object's push (`held` pushed ahead at the start).
fn read_each_giving_room(t: &NoOpen, files: &[(String, Vec<u8>)], held: f64, before: impl Fn()) {
    for (i, (k, d)) in files.iter().enumerate().skip(1) {
        before();
        assert!(std::fs::read(t.m.p(k)).unwrap() == *d, "{k} differs");
        let want = (held + i as f64).min(29.0);
        let next = wait_for(Duration::from_secs(5), || fills(t) >= want);
        assert!(
            next.is_some(),
            "{} pushed after {i} files, want {want}\n{}",
            fills(t),
            t.m.log()
        );
    }
}

/// A loader that sends no request per file is not seen at pushed objects,
/// so prefetch waits at half the data cache's size limit. Once it has
/// waited there a second with no sign, pushed objects get stale attributes
/// in the kernel: the loader's stat (or read to the end) of each sends a
/// GETATTR, which gives its room to the next object, as Python's ioctl
/// does. Every object is pushed and fetched once.
#[test]
fn a_silent_loader_is_asked_for_a_sign_when_prefetch_waits_for_it() {
    // Half of 32 KiB: room for three objects of 5,000 bytes ahead.
    let (_dir, t, files) = one_in_memory("s", "max_size = \"32KiB\"\n");
    let held = found_silent(&t);
    // `std::fs::read` stats the file, then reads it: no ioctl.
    read_each_giving_room(&t, &files, held, || ());
    let after = scrape(&t.addr);
    assert_eq!(fills(&t), 29.0, "pushed other than each object once");
    assert_eq!(op(&after, "ioctl"), 0.0, "{after}");
    assert!(op(&after, "getattr") >= 26.0, "{after}");
    assert_eq!(t.srv.request_count("GetObject"), 30);
}

/// A silent loader whose entries expired opens each file by name: the
/// kernel sends a LOOKUP, whose reply makes stale attributes fresh again,
/// so that no GETATTR follows. The LOOKUP is the sign then. (The test
/// fails when it is not.)
#[test]
fn a_silent_loader_whose_entries_expired_still_gives_its_sign() {
    let (_dir, t, files) = one_in_memory(
        "l",
        "max_size = \"32KiB\"\n[metadata]\nkernel_ttl_secs = 1.0\n",
    );
    let held = found_silent(&t);
    // The entries the listing gave expire.
    std::thread::sleep(Duration::from_millis(1_500));
    let lookups = op(&scrape(&t.addr), "lookup");
    read_each_giving_room(&t, &files, held, || ());
    let after = scrape(&t.addr);
    assert!(op(&after, "lookup") - lookups >= 26.0, "{after}");
    assert_eq!(t.srv.request_count("GetObject"), 30);
}

/// A directory listed again while a silent loader is asked for signs gives
/// its pushed files an entry and attributes valid for no time: otherwise
/// the listing would make their stale attributes fresh again, and their
/// opens would send nothing. (The test fails with the full TTL there.)
#[test]
fn a_listing_made_while_signs_are_asked_for_keeps_them_asked() {
    let (_dir, t, files) = one_in_memory("v", "max_size = \"32KiB\"\n");
    let held = found_silent(&t);
    // The loader's index lists the directory again (a READDIRPLUS) before
    // each read.
    read_each_giving_room(&t, &files, held, || {
        assert_eq!(names(&t.m.p("v")).len(), 30);
    });
    assert_eq!(t.srv.request_count("GetObject"), 30);
}
