//! Metadata at scale through a real mount: lookups answered from batched
//! ListObjectsV2 listings (no HeadObject), single-flight listings shared by
//! concurrent readers, the negative cache and its expiry, tree prefetch.
//! Each test has a private server so its request counts are its own.

mod common;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

fn lists(s: &TestServer) -> u64 {
    s.request_count("ListObjectsV2")
}

fn heads(s: &TestServer) -> u64 {
    s.request_count("HeadObject")
}

#[test]
fn ls_l_and_opening_every_file_cost_one_list_per_1000_and_no_head() {
    let s = private_server();
    let b = bucket_on(&s, "batched");
    for i in 0..2500 {
        s.put(&b, &format!("d/f{i:05}.jpg"), vec![b'x'; 10 + i % 7]);
    }
    let m = MountSpec::new(&b).server(&s).mount();
    s.reset_counts();
    let out = Command::new("ls").arg("-l").arg(m.p("d")).output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().count(),
        2501,
        "total line + 2500"
    );
    // Root listing (lookup of "d") + ceil(2500/1000) pages of "d/".
    assert_eq!(lists(&s), 1 + 3, "LIST requests for ls -l");
    assert_eq!(heads(&s), 0);
    for i in 0..2500 {
        let len = std::fs::read(m.p(&format!("d/f{i:05}.jpg"))).unwrap().len();
        assert_eq!(len, 10 + i % 7);
    }
    assert_eq!(lists(&s), 4, "opening every file listed again");
    assert_eq!(heads(&s), 0, "a HeadObject per file");
}

#[test]
fn find_walk_costs_at_most_1_1_x_pages_plus_directories() {
    let s = private_server();
    let b = bucket_on(&s, "walk");
    let (dirs, per_dir) = (12, 400);
    for d in 0..dirs {
        for f in 0..per_dir {
            s.put(&b, &format!("train/{d:03}/{f:05}.jpg"), "j");
        }
    }
    let m = MountSpec::new(&b).server(&s).mount();
    s.reset_counts();
    let out = Command::new("find")
        .arg(m.path())
        .args(["-type", "f"])
        .output()
        .unwrap();
    let files = String::from_utf8_lossy(&out.stdout).lines().count();
    assert_eq!(files, dirs * per_dir);
    // Directories: root, train, and 12 leaves; each leaf is one page.
    let bound = (1.1 * ((dirs * per_dir) as f64 / 1000.0 + (dirs + 2) as f64)).ceil() as u64;
    assert!(
        lists(&s) <= bound,
        "find made {} LISTs, bound {bound}",
        lists(&s)
    );
    assert_eq!(heads(&s), 0);
}

#[test]
fn missing_name_looked_up_10000_times_costs_one_list_then_expires() {
    let s = private_server();
    let b = bucket_on(&s, "negative");
    s.put(&b, "dir/present", "p");
    let m = MountSpec::new(&b)
        .server(&s)
        .args(&["--metadata-ttl", "3"])
        .mount();
    assert!(m.p("dir/present").exists());
    s.reset_counts();
    let t0 = Instant::now();
    for _ in 0..10_000 {
        assert!(std::fs::metadata(m.p("dir/missing")).is_err());
    }
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "test too slow to be within the TTL"
    );
    assert!(
        lists(&s) <= 1,
        "10,000 lookups of a missing name made {} LISTs",
        lists(&s)
    );
    // Created in S3: still missing within the TTL, visible after it.
    s.put(&b, "dir/missing", "now here");
    if t0.elapsed() < Duration::from_secs(2) {
        assert!(
            !m.p("dir/missing").exists(),
            "visible before the negative TTL ran out"
        );
    }
    wait_for(Duration::from_secs(10), || m.p("dir/missing").exists())
        .expect("new object never became visible after the TTL");
    assert_eq!(
        std::fs::read_to_string(m.p("dir/missing")).unwrap(),
        "now here"
    );
}

#[test]
fn ttl_zero_shows_creates_and_deletes_at_once() {
    let b = bucket("ttl0");
    let srv = server();
    srv.put(&b, "a", "1");
    let m = MountSpec::new(&b).args(&["--metadata-ttl", "0"]).mount();
    assert!(!m.p("b").exists());
    srv.put(&b, "b", "2");
    assert_eq!(std::fs::read_to_string(m.p("b")).unwrap(), "2");
    srv.delete(&b, "a");
    assert!(
        !m.p("a").exists(),
        "deleted object still visible with TTL 0"
    );
    assert_eq!(names(&m.path()), ["b"]);
}

#[test]
fn sixteen_processes_list_a_5000_entry_directory_identically() {
    let s = private_server();
    let b = bucket_on(&s, "concurrent");
    let expected: BTreeSet<String> = (0..5000).map(|i| format!("img-{i:05}.jpg")).collect();
    for n in &expected {
        s.put(&b, &format!("big/{n}"), "x");
    }
    let m = MountSpec::new(&b).server(&s).mount();
    s.reset_counts();
    let children: Vec<_> = (0..16)
        .map(|_| {
            Command::new("ls")
                .arg("-1")
                .arg("-f")
                .arg(m.p("big"))
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        let got: Vec<&str> = text.lines().filter(|l| *l != "." && *l != "..").collect();
        let set: BTreeSet<String> = got.iter().map(|s| s.to_string()).collect();
        assert_eq!(got.len(), set.len(), "duplicates in a listing");
        assert_eq!(set, expected, "incomplete listing");
    }
    // One shared listing: root (lookup of "big") + 5 pages.
    assert!(
        lists(&s) <= 6,
        "16 concurrent listings made {} LISTs",
        lists(&s)
    );
}

#[test]
fn prefetch_tree_lists_everything_once_at_mount() {
    let s = private_server();
    let b = bucket_on(&s, "tree");
    for d in 0..20 {
        for f in 0..50 {
            s.put(&b, &format!("set/{d:02}/sub/{f:03}.bin"), "y");
        }
    }
    s.put(&b, "top.txt", "t");
    s.reset_counts();
    let m = MountSpec::new(&b)
        .server(&s)
        .config("[metadata]\nprefetch_tree = true\n")
        .mount();
    // Probe (1) + root listing (1) + one stream for "set/" (1 page: 1000 keys).
    wait_for(Duration::from_secs(10), || m.log().contains("tree listed"))
        .expect("tree prefetch did not finish");
    let after_prefetch = lists(&s);
    assert!(after_prefetch <= 4, "prefetch made {after_prefetch} LISTs");
    let out = Command::new("find")
        .arg(m.path())
        .args(["-type", "f"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 1001);
    assert_eq!(
        lists(&s),
        after_prefetch,
        "the walk listed again after the prefetch"
    );
}

/// The number after `key=` in the last log line containing `marker`.
fn logged(log: &str, marker: &str, key: &str) -> u64 {
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("no {marker:?} in the log:\n{log}"));
    let at = line
        .find(&format!("{key}="))
        .unwrap_or_else(|| panic!("no {key} in {line:?}"));
    line[at + key.len() + 1..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn prefetch_tree_lists_a_flat_directory_in_parallel_key_ranges() {
    let s = private_server();
    let b = bucket_on(&s, "flatsplit");
    let n = 90_000;
    for i in 0..n {
        s.put(&b, &format!("flat/f{i:06}.jpg"), "j");
    }
    // Names that sort before '/' and after ASCII, and control characters
    // (carried by encoding-type=url), land in the ranges too.
    let odd = [
        "flat/\u{1}ctl",
        "flat/a+b%2F",
        "flat/!bang",
        "flat/ sp",
        "flat/\u{e9}t\u{e9}",
        "flat/\u{65e5}\u{672c}",
        "flat/~",
    ];
    for k in odd {
        s.put(&b, k, "o");
    }
    s.reset_counts();
    let m = MountSpec::new(&b)
        .server(&s)
        .config("[metadata]\nprefetch_tree = true\n")
        .mount();
    wait_for(Duration::from_secs(30), || m.log().contains("tree listed"))
        .unwrap_or_else(|| panic!("tree prefetch did not finish:\n{}", m.log()));
    let log = m.log();
    let (pages, ranges, depth) = (
        logged(&log, "tree listed", "list_pages"),
        logged(&log, "tree listed", "key_ranges"),
        logged(&log, "tree listed", "depth_pages"),
    );
    assert_eq!(
        logged(&log, "tree listed", "objects"),
        (n + odd.len()) as u64
    );
    let after_prefetch = lists(&s);
    // The mount's probe is the one LIST not in `pages`.
    assert_eq!(after_prefetch, pages + 1, "LISTs counted by the server");
    let sequential = (n + odd.len()).div_ceil(1000) as u64;
    eprintln!(
        "prefetch: {pages} LIST pages in {ranges} key ranges, {depth} deep; one stream: {sequential}"
    );
    assert!(ranges >= 8, "only {ranges} key ranges");
    assert!(
        depth * 3 <= sequential,
        "{depth} pages one after the other; one stream is {sequential}"
    );
    assert!(
        pages <= sequential * 13 / 10 + 3,
        "{pages} LIST pages for {sequential} pages of keys"
    );
    assert_eq!(heads(&s), 0);
    // Everything is known: a full readdir and a stat of each odd name list nothing.
    let listed = readdir_names(&m.p("flat"));
    assert_eq!(listed.len(), n + odd.len());
    for k in odd {
        assert!(m.p(k).exists(), "{k:?}");
    }
    assert_eq!(lists(&s), after_prefetch, "listed again after the prefetch");
}

#[test]
fn lookups_in_a_directory_over_max_dir_entries_list_one_name_not_the_directory() {
    let s = private_server();
    let b = bucket_on(&s, "huge");
    for i in 0..5000 {
        s.put(&b, &format!("big/f{i:05}"), vec![b'x'; i % 11]);
    }
    s.put(&b, "big/sub/inner", "i");
    s.put(&b, "big/shadow", "file under a directory of the same name");
    s.put(&b, "big/shadow/x", "x");
    // Keys that extend a name with a byte below `/` come between the
    // object and its directory: 40 of them take the lookup past one page.
    for i in 0..40 {
        s.put(&b, &format!("big/sub.{i:02}"), "dot");
    }
    let m = MountSpec::new(&b)
        .server(&s)
        // Request counts exactly: no hedged LIST (one in twenty of 200
        // LISTs on a loaded machine) may add to them.
        .config("[metadata]\nmax_dir_entries = 2500\n[s3]\nhedged_gets = false\n")
        .mount();
    s.reset_counts();
    // First lookup: the root listing (for "big"), the listing of big/ given up
    // after 3 pages (3000 > 2500 entries), then one LIST of the name.
    assert_eq!(
        std::fs::metadata(m.p("big/f01234")).unwrap().len(),
        1234 % 11
    );
    assert_eq!((lists(&s), heads(&s)), (1 + 3 + 1, 0), "first lookup");
    assert!(m.log().contains("directory too large to cache"));
    // 200 more lookups: 1 LIST each, never the 5-page listing again.
    for i in 0..200 {
        let len = std::fs::metadata(m.p(&format!("big/f{:05}", 3 + i * 24)))
            .unwrap()
            .len();
        assert_eq!(len as usize, (3 + i * 24) % 11);
    }
    assert_eq!((lists(&s), heads(&s)), (5 + 200, 0), "200 lookups");
    // A directory past 40 keys of its name's (the first page, then a LIST
    // of `sub/`), a shadowed file,
    // a missing name (then negative-cached).
    let before = lists(&s);
    assert!(std::fs::metadata(m.p("big/sub")).unwrap().is_dir());
    assert_eq!(
        lists(&s),
        before + 2,
        "big/sub: a page of 32 keys, then sub/"
    );
    assert_eq!(std::fs::read_to_string(m.p("big/sub.07")).unwrap(), "dot");
    assert!(std::fs::metadata(m.p("big/shadow")).unwrap().is_dir());
    assert_eq!(std::fs::read_to_string(m.p("big/sub/inner")).unwrap(), "i");
    let before = lists(&s);
    assert_errno(
        std::fs::metadata(m.p("big/missing")),
        libc::ENOENT,
        "missing",
    );
    assert_eq!(lists(&s), before + 1);
    for _ in 0..100 {
        assert!(std::fs::metadata(m.p("big/missing")).is_err());
    }
    assert_eq!(lists(&s), before + 1, "negative cache");
    // readdir still shows everything (listed for the handle, not cached).
    let names = readdir_names(&m.p("big"));
    assert_eq!(names.len(), 5000 + 2 + 40);
    assert_eq!(heads(&s), 0, "a lookup sent HeadObject");
}

/// With a TTL of 0 nothing is cached, so a lookup asks for its name alone:
/// a stat costs a LIST of one name for each time the kernel asks (its
/// lookup and its getattr), not a listing of the whole directory each, and
/// still sees every change.
#[test]
fn a_ttl_of_0_looks_each_name_up_with_one_request() {
    let s = private_server();
    let b = bucket_on(&s, "ttl0-ls");
    let n = 1500;
    for i in 0..n {
        s.put(&b, &format!("d/f{i:05}"), vec![b'x'; i % 7]);
    }
    s.put(&b, "d/sub/inner", "i");
    let m = MountSpec::new(&b)
        .server(&s)
        .args(&["--metadata-ttl", "0"])
        .config("[s3]\nhedged_gets = false\n")
        .mount();
    assert!(m.p("d").is_dir());
    s.reset_counts();
    let stats = 100;
    for i in 0..stats {
        let len = std::fs::metadata(m.p(&format!("d/f{:05}", i * 13)))
            .unwrap()
            .len();
        assert_eq!(len as usize, (i * 13) % 7);
    }
    // Each stat: the kernel's lookups of `d` and of the name and its
    // getattr, one LIST each (a listing of `d` would be two pages each).
    assert!(
        lists(&s) <= 3 * stats as u64,
        "{} LISTs for {stats} stats",
        lists(&s)
    );
    assert_eq!(heads(&s), 0);
    assert!(m.p("d/sub").is_dir());
    assert_eq!(readdir_names(&m.p("d")).len(), n + 1);
    // Changes show at once.
    s.put(&b, "d/f00003", "new");
    assert_eq!(std::fs::read_to_string(m.p("d/f00003")).unwrap(), "new");
    s.delete(&b, "d/f00004");
    assert!(!m.p("d/f00004").exists());
}

/// The value of metric `name` (no labels) from `GET http://addr/metrics`;
/// panics when the endpoint does not show it.
fn metric_at(addr: &str, name: &str) -> f64 {
    let body = scrape(addr);
    assert!(
        body.lines().any(|l| l.starts_with(&format!("{name} "))),
        "{name} missing from /metrics:\n{body}"
    );
    metric(&body, name)
}

#[test]
fn forget_from_the_kernel_shrinks_the_inode_table() {
    let s = private_server();
    let b = bucket_on(&s, "forget");
    let n = 2000;
    for i in 0..n {
        s.put(&b, &format!("d/f{i:04}"), "x");
    }
    let addr = format!("127.0.0.1:{}", free_port());
    let m = MountSpec::new(&b)
        .server(&s)
        .args(&["--metrics-addr", &addr, "--metadata-ttl", "1"])
        .mount();
    for i in 0..n {
        assert!(m.p(&format!("d/f{i:04}")).exists());
    }
    let held = metric_at(&addr, "lakemount_meta_inodes");
    assert!(held >= (n + 2) as f64, "{held} inodes after {n} lookups");
    // Deleted in S3: once the TTL is over, the kernel's revalidating lookup
    // gets ENOENT, drops the dentry and the inode, and sends FORGET.
    for i in 0..n {
        s.delete(&b, &format!("d/f{i:04}"));
    }
    std::thread::sleep(Duration::from_millis(1500));
    for i in 0..n {
        assert!(!m.p(&format!("d/f{i:04}")).exists());
    }
    wait_for(Duration::from_secs(10), || {
        metric_at(&addr, "lakemount_meta_inodes") <= 10.0
    })
    .unwrap_or_else(|| {
        panic!(
            "inode table still holds {} inodes after the kernel dropped them",
            metric_at(&addr, "lakemount_meta_inodes")
        )
    });
}
