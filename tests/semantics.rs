//! Namespace and stat semantics, through the real `lakemount` binary and a real
//! FUSE mount. Each test proves one rule of docs/SEMANTICS.md.

mod common;

use std::collections::BTreeSet;
use std::ffi::{CStr, CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::*;

/// Runs a command and returns its stdout, trimmed; panics when it fails.
fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The daemon log without terminal colour codes (`ESC [ ... m`).
fn plain_log(m: &Mount) -> String {
    let log = m.log();
    let mut out = String::with_capacity(log.len());
    let mut it = log.chars();
    while let Some(c) = it.next() {
        if c == '\u{1b}' {
            for c in it.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Lines of the daemon log that contain every one of `parts`.
fn log_lines_with(m: &Mount, parts: &[&str]) -> usize {
    plain_log(m)
        .lines()
        .filter(|l| parts.iter().all(|p| l.contains(p)))
        .count()
}

#[test]
fn implicit_directories_and_markers() {
    let b = bucket("implicit");
    let s = server();
    s.put(&b, "implicit/sub/a.txt", "a");
    s.put(&b, "marker/", "");
    s.put(&b, "nested/", "");
    s.put(&b, "nested/inner/", "");
    s.put(&b, "withfiles/", "");
    s.put(&b, "withfiles/f", "f");
    let m = Mount::new(&b, &[]);

    assert_eq!(
        names(&m.path()),
        ["implicit", "marker", "nested", "withfiles"]
    );
    for d in [
        "implicit",
        "implicit/sub",
        "marker",
        "nested",
        "nested/inner",
        "withfiles",
    ] {
        let md = std::fs::metadata(m.p(d)).unwrap();
        assert!(md.is_dir(), "{d} is not a directory");
    }
    // Common prefixes make directories without any marker object.
    assert_eq!(names(&m.p("implicit")), ["sub"]);
    assert_eq!(names(&m.p("implicit/sub")), ["a.txt"]);
    // A zero-byte `dir/` marker is a directory, never a file called `dir/`,
    // and a directory holding only markers is empty.
    assert!(names(&m.p("marker")).is_empty());
    assert_eq!(names(&m.p("nested")), ["inner"]);
    assert!(names(&m.p("nested/inner")).is_empty());
    // The marker is not an entry of its own directory.
    assert_eq!(names(&m.p("withfiles")), ["f"]);
    assert_errno(std::fs::read(m.p("marker")), libc::EISDIR, "read marker");
}

#[test]
fn shadowed_file_is_a_directory() {
    let b = bucket("shadow");
    let s = server();
    s.put(&b, "x", "I am the file x");
    s.put(&b, "x/y", "y");
    s.put(&b, "x.txt", "x.txt");
    // The same across a ListObjectsV2 page boundary: 999 keys, then `p/z` as
    // the 1000th entry of page 1 and the prefix `p/z/` on page 2.
    for i in 0..999 {
        s.put(&b, &format!("p/k{i:04}"), "");
    }
    s.put(&b, "p/z", "I am the file p/z");
    s.put(&b, "p/z/1", "1");
    let m = Mount::new(&b, &[]);

    let root = names(&m.path());
    assert_eq!(root, ["p", "x", "x.txt"], "x listed once");
    assert!(std::fs::metadata(m.p("x")).unwrap().is_dir());
    assert_eq!(names(&m.p("x")), ["y"]);
    assert_eq!(std::fs::read(m.p("x/y")).unwrap(), b"y");
    assert_eq!(std::fs::read(m.p("x.txt")).unwrap(), b"x.txt");
    // `cat x` gives EISDIR.
    assert_errno(std::fs::read(m.p("x")), libc::EISDIR, "read x");
    let cat = Command::new("cat").arg(m.p("x")).output().unwrap();
    assert!(!cat.status.success());
    assert!(
        String::from_utf8_lossy(&cat.stderr).contains("Is a directory"),
        "cat x: {}",
        String::from_utf8_lossy(&cat.stderr)
    );

    let p = names(&m.p("p"));
    assert_eq!(p.len(), 1000, "999 files and z");
    assert_eq!(p.iter().filter(|n| *n == "z").count(), 1, "z listed once");
    assert!(std::fs::metadata(m.p("p/z")).unwrap().is_dir());
    assert_eq!(names(&m.p("p/z")), ["1"]);
    assert_errno(std::fs::read(m.p("p/z")), libc::EISDIR, "read p/z");

    // Each shadowed file is logged as a warning naming its key.
    assert_eq!(log_lines_with(&m, &["WARN", "shadowed", "key=p/z"]), 1);
    let log = plain_log(&m);
    let shadowed: Vec<&str> = log.lines().filter(|l| l.contains("shadowed")).collect();
    assert_eq!(shadowed.len(), 2, "one warning for x, one for p/z:\n{log}");
    assert!(
        shadowed
            .iter()
            .any(|l| l.contains("WARN") && l.ends_with("key=x")),
        "{log}"
    );
}

#[test]
fn invalid_names_are_hidden_never_merged() {
    let b = bucket("badnames");
    let s = server();
    s.put(&b, "a//b", "double slash");
    s.put(&b, "m//b", "double slash");
    s.put(&b, "m/b", "single slash");
    s.put(&b, "./c", "dot");
    s.put(&b, "../c", "dotdot");
    s.put(&b, "c", "the real c");
    s.put(&b, "f/./g", "dot inside");
    s.put(&b, "h/../i", "dotdot inside");
    s.put(&b, "/lead", "leading slash");
    let m = Mount::new(&b, &[]);

    assert_eq!(names(&m.path()), ["a", "c", "f", "h", "m"]);
    // `a//b`: `a` is a common prefix, so it is shown, but it is empty.
    assert!(std::fs::metadata(m.p("a")).unwrap().is_dir());
    assert!(names(&m.p("a")).is_empty());
    assert!(names(&m.p("f")).is_empty());
    assert!(names(&m.p("h")).is_empty());
    // Never merged with a valid name: `m//b` does not become `m/b`, `./c` not `c`.
    assert_eq!(names(&m.p("m")), ["b"]);
    assert_eq!(std::fs::read(m.p("m/b")).unwrap(), b"single slash");
    assert_eq!(std::fs::read(m.p("c")).unwrap(), b"the real c");
    // Looking the keys up gives ENOENT.
    for path in ["a//b", "a/b", "f/./g", "f/g", "h/../i", "i", "lead"] {
        assert_errno(std::fs::metadata(m.p(path)), libc::ENOENT, path);
    }
    // Each hidden key is logged.
    for reason in ["empty path component", "'.' or '..' path component"] {
        assert!(
            log_lines_with(&m, &["WARN", "key not shown", reason]) >= 1,
            "no warning {reason:?}:\n{}",
            m.log()
        );
    }
    // A key hidden behind a common prefix is logged as that prefix.
    for key in [
        "key=a// ",
        "key=m// ",
        "key=./ ",
        "key=../ ",
        "key=f/./ ",
        "key=h/../ ",
        "key=/ ",
    ] {
        assert_eq!(
            log_lines_with(&m, &["WARN", "key not shown", key]),
            1,
            "{key}:\n{}",
            plain_log(&m)
        );
    }
}

#[test]
fn long_names_are_hidden_never_truncated() {
    let b = bucket("longnames");
    let s = server();
    let n255 = "n".repeat(255);
    let n256 = "n".repeat(256);
    let e254 = "é".repeat(127); // 254 bytes
    let e256 = "é".repeat(128); // 256 bytes, 128 characters
    s.put(&b, &n255, "255");
    s.put(&b, &n256, "256");
    s.put(&b, &e254, "254 bytes");
    s.put(&b, &e256, "256 bytes");
    s.put(&b, &format!("long/{n256}/z"), "z");
    s.put(&b, &format!("deep/{n255}/ok"), "ok");
    let m = Mount::new(&b, &[]);

    let mut want = vec![
        "deep".to_string(),
        "long".into(),
        n255.clone(),
        e254.clone(),
    ];
    want.sort();
    assert_eq!(names(&m.path()), want);
    // The 255-byte name is its own object, not the 256-byte one cut short.
    assert_eq!(std::fs::read(m.p(&n255)).unwrap(), b"255");
    assert_eq!(std::fs::read(m.p(&e254)).unwrap(), b"254 bytes");
    assert_eq!(
        std::fs::read(m.p(&format!("deep/{n255}/ok"))).unwrap(),
        b"ok"
    );
    assert!(names(&m.p("long")).is_empty());
    // A name over 255 bytes is ENAMETOOLONG.
    for path in [n256.clone(), e256.clone(), format!("long/{n256}")] {
        assert_errno(
            std::fs::metadata(m.p(&path)),
            libc::ENAMETOOLONG,
            &format!("stat {} bytes", path.len()),
        );
    }
    assert!(
        log_lines_with(
            &m,
            &["WARN", "key not shown", "longer than 255 bytes", &n256]
        ) >= 2,
        "{}",
        m.log()
    );
}

/// Names with characters that URL encoding, form encoding or XML could change.
const ODD_NAMES: &[&str] = &[
    "a b",
    "a+b",
    "a%20b",
    "a%2Fb",
    "100%",
    "#hash#",
    "(paren)",
    "[sq]{curly}",
    "q?x=1&y=2",
    "semi;colon,comma'quote\"",
    "star*back\\slash",
    "~tilde!@$^",
    " lead and trail ",
    "<lt>&amp;",
    "ümlaut é",
    "日本語.txt",
    "emoji 🎉",
    "\u{e9}",   // é, one code point (NFC)
    "e\u{301}", // é, e + combining accent (NFD): another name
    // Control characters: XML 1.0 cannot carry U+0001..U+001F except tab, LF
    // and CR, and XML parsers turn CR into LF; listings must ask for
    // encoding-type=url.
    "ctl\u{1}x",
    "bell\u{7}",
    "tab\tx",
    "cr\rx",
    "lf\nx",
    "del\u{7f}",
    "a%2Bb",
    "dir a+b%20(c)", // a directory, see below
];

#[test]
fn names_are_exact_utf8_bytes() {
    let b = bucket("names");
    let s = server();
    for (i, n) in ODD_NAMES.iter().enumerate() {
        let key = if n.starts_with("dir ") {
            format!("odd/{n}/file #1+2 (x)")
        } else {
            format!("odd/{n}")
        };
        s.put(&b, &key, format!("object {i}: {key}"));
    }
    let m = Mount::new(&b, &[]);

    let mut want: Vec<String> = ODD_NAMES.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(names(&m.p("odd")), want);
    for (i, n) in ODD_NAMES.iter().enumerate() {
        let (path, key) = if n.starts_with("dir ") {
            (
                format!("odd/{n}/file #1+2 (x)"),
                format!("odd/{n}/file #1+2 (x)"),
            )
        } else {
            (format!("odd/{n}"), format!("odd/{n}"))
        };
        assert_eq!(
            std::fs::read_to_string(m.p(&path)).unwrap(),
            format!("object {i}: {key}"),
            "{path:?}"
        );
    }
    // `a b` and `a+b` stay two files.
    assert_ne!(
        std::fs::read(m.p("odd/a b")).unwrap(),
        std::fs::read(m.p("odd/a+b")).unwrap()
    );
    // A name that is not UTF-8 cannot be a key.
    let bad = m.p("odd").join(OsStr::from_bytes(b"\xff\xfe"));
    assert_errno(std::fs::metadata(bad), libc::ENOENT, "non-UTF-8 name");
}

#[test]
fn servers_that_ignore_or_refuse_encoding_type_list_the_same_names() {
    // Names a decoder would change if it decoded what was never encoded.
    let odd = ["a b", "a+b", "a%20b", "a%2Bb", "100%", "\u{e9}t\u{e9}"];
    for mode in ["ignore", "reject"] {
        let s = private_server();
        s.set_list_encoding(mode);
        let b = bucket_on(&s, &format!("enc-{mode}"));
        for (i, n) in odd.iter().enumerate() {
            s.put(&b, &format!("d/{n}"), format!("{i}"));
        }
        let m = MountSpec::new(&b).server(&s).mount();
        let mut want: Vec<String> = odd.iter().map(|n| n.to_string()).collect();
        want.sort();
        assert_eq!(names(&m.p("d")), want, "{mode}\n{}", m.log());
        for (i, n) in odd.iter().enumerate() {
            assert_eq!(
                std::fs::read_to_string(m.p(&format!("d/{n}"))).unwrap(),
                format!("{i}"),
                "{mode}: {n}"
            );
        }
        if mode == "reject" {
            assert!(m.log().contains("refused encoding-type=url"), "{}", m.log());
        }
    }
}

#[test]
fn a_key_with_a_nul_byte_is_skipped_and_logged() {
    let b = bucket("nul");
    let s = server();
    s.put(&b, "d/nul\u{0}x", "n");
    s.put(&b, "d/ok", "k");
    let m = Mount::new(&b, &[]);
    assert_eq!(names(&m.p("d")), vec!["ok".to_string()]);
    assert!(
        log_lines_with(&m, &["WARN", "key not shown", "NUL byte"]) >= 1,
        "{}",
        m.log()
    );
}

#[test]
fn large_directories_list_completely_every_time() {
    let b = bucket("bigdirs");
    let s = server();
    let sizes = [999usize, 1000, 1001, 5000];
    for n in sizes {
        for i in 0..n {
            s.put(&b, &format!("d{n}/f{i:05}"), "");
        }
    }
    // TTL 0: every opendir lists (and paginates) again.
    let m = Mount::new(&b, &["--metadata-ttl", "0"]);
    for n in sizes {
        let want: Vec<String> = (0..n).map(|i| format!("f{i:05}")).collect();
        for pass in 0..3 {
            let got = readdir_names(&m.p(&format!("d{n}")));
            let unique: BTreeSet<&String> = got.iter().collect();
            assert_eq!(unique.len(), got.len(), "d{n} pass {pass}: duplicates");
            assert_eq!(got.len(), n, "d{n} pass {pass}: count");
            assert!(
                unique.into_iter().eq(want.iter()),
                "d{n} pass {pass}: names"
            );
        }
    }
}

/// A libc directory stream (opendir/readdir/telldir/seekdir/rewinddir),
/// closed on drop so a failing test does not keep the mount busy.
struct Dir(*mut libc::DIR);

impl Dir {
    fn open(path: &Path) -> Dir {
        let c = CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        let dir = unsafe { libc::opendir(c.as_ptr()) };
        assert!(
            !dir.is_null(),
            "opendir {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
        Dir(dir)
    }

    /// The next entry's name, `None` at the end.
    fn next(&mut self) -> Option<String> {
        // SAFETY: an open stream; the entry is copied before the next call.
        unsafe {
            let e = libc::readdir(self.0);
            (!e.is_null()).then(|| {
                CStr::from_ptr((*e).d_name.as_ptr())
                    .to_str()
                    .unwrap()
                    .to_string()
            })
        }
    }

    fn tell(&mut self) -> libc::c_long {
        // SAFETY: an open stream.
        unsafe { libc::telldir(self.0) }
    }

    fn seek(&mut self, pos: libc::c_long) {
        // SAFETY: an open stream and a position telldir gave for this directory.
        unsafe { libc::seekdir(self.0, pos) }
    }

    fn rewind(&mut self) {
        // SAFETY: an open stream.
        unsafe { libc::rewinddir(self.0) }
    }

    /// The rest of the stream: (name, telldir after it).
    fn rest(&mut self) -> Vec<(String, libc::c_long)> {
        let mut out = Vec::new();
        while let Some(name) = self.next() {
            out.push((name, self.tell()));
            assert!(out.len() <= MAX_TEST_DIR_ENTRIES, "readdir does not end");
        }
        out
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        // SAFETY: opened by `Dir::open`, closed once.
        unsafe { libc::closedir(self.0) };
    }
}

fn names_of(v: &[(String, libc::c_long)]) -> Vec<&str> {
    v.iter().map(|(n, _)| n.as_str()).collect()
}

#[test]
fn readdir_rewind_and_seekdir_have_no_gaps_or_duplicates() {
    let b = bucket("seekdir");
    let s = server();
    let n = 2500;
    for i in 0..n {
        s.put(&b, &format!("big/entry-{i:05}"), "");
    }
    let m = Mount::new(&b, &[]);
    let want: BTreeSet<String> = (0..n).map(|i| format!("entry-{i:05}")).collect();

    let mut dir = Dir::open(&m.p("big"));
    let first = dir.rest();
    assert_eq!(first.len(), n + 2, "entries with . and ..");
    let entries: Vec<&str> = names_of(&first)
        .into_iter()
        .filter(|n| *n != "." && *n != "..")
        .collect();
    assert_eq!(entries.len(), n, "count");
    let set: BTreeSet<String> = entries.iter().map(|s| s.to_string()).collect();
    assert_eq!(set, want, "first read: names (no duplicates, no gaps)");

    // Rewound: the same sequence again.
    dir.rewind();
    let again = dir.rest();
    assert_eq!(names_of(&again), names_of(&first), "after rewinddir");

    // Resumed at saved offsets, including across readdir reply and listing
    // page boundaries: exactly the entries after the saved one.
    for k in [0, 1, 2, 3, 50, 997, 999, 1000, 1001, 1002, 2001, 2500, 2501] {
        let k = k.min(first.len() - 1);
        dir.seek(first[k].1);
        let rest = dir.rest();
        assert_eq!(
            names_of(&rest),
            names_of(&first[k + 1..]),
            "seekdir after entry {k} ({})",
            first[k].0
        );
    }
    // Back to a saved offset after reading partway.
    dir.rewind();
    for _ in 0..700 {
        assert!(dir.next().is_some());
    }
    let saved = dir.tell();
    let tail = dir.rest();
    dir.seek(saved);
    assert_eq!(names_of(&dir.rest()), names_of(&tail), "seek back");
    drop(dir);

    // A new stream of the unchanged directory accepts the same offsets.
    let mut dir = Dir::open(&m.p("big"));
    dir.seek(first[1200].1);
    assert_eq!(names_of(&dir.rest()), names_of(&first[1201..]));
}

#[test]
fn size_and_blocks_are_exact_and_du_agrees() {
    let b = bucket("blocks");
    let s = server();
    let sizes = [0u64, 1, 511, 512, 513, 1000, 4096, 12288, 100_000];
    for size in sizes {
        s.put(&b, &format!("s/f{size}"), data(size as usize, size));
    }
    for size in [512u64, 1024, 12288] {
        s.put(&b, &format!("du/f{size}"), data(size as usize, size));
    }
    let m = Mount::new(&b, &[]);
    for size in sizes {
        let md = std::fs::metadata(m.p(&format!("s/f{size}"))).unwrap();
        assert_eq!(md.len(), size, "st_size of f{size}");
        assert_eq!(md.blocks(), size.div_ceil(512), "st_blocks of f{size}");
    }
    let du = |args: &[&str], p: &Path| {
        let out = run(Command::new("du").args(args).arg(p));
        out.split_whitespace()
            .next()
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    let f = m.p("du/f12288");
    assert_eq!(du(&["-B1"], &f), 12288);
    assert_eq!(du(&["-B1", "--apparent-size"], &f), 12288);
    let d = m.p("du");
    assert_eq!(du(&["-sB1"], &d), 512 + 1024 + 12288);
    assert_eq!(du(&["-sB1", "--apparent-size"], &d), 512 + 1024 + 12288);
}

#[test]
fn mtime_is_last_modified_in_utc_whatever_the_time_zone() {
    let b = bucket("mtime");
    // 2020-09-13T12:26:40Z, 21:26:40 in Tokyo (+09:00).
    let epoch: i64 = 1_600_000_000;
    server().put_with_mtime(
        &b,
        "t/file",
        "x",
        UNIX_EPOCH + Duration::from_secs(epoch as u64),
    );
    // The daemon runs in another time zone than UTC.
    let m = MountSpec::new(&b).env("TZ", "Asia/Tokyo").mount();
    let f = m.p("t/file");
    let md = std::fs::metadata(&f).unwrap();
    assert_eq!(md.mtime(), epoch);
    assert_eq!((md.atime(), md.ctime()), (epoch, epoch), "atime, ctime");
    assert_eq!(
        md.modified().unwrap(),
        UNIX_EPOCH + Duration::from_secs(epoch as u64)
    );
    for tz in ["Asia/Tokyo", "UTC", "America/Los_Angeles"] {
        let secs = run(Command::new("stat")
            .env("TZ", tz)
            .args(["-c", "%Y"])
            .arg(&f));
        assert_eq!(secs, epoch.to_string(), "stat -c %Y in {tz}");
    }
    let local = run(Command::new("stat")
        .env("TZ", "Asia/Tokyo")
        .args(["-c", "%y"])
        .arg(&f));
    assert!(
        local.starts_with("2020-09-13 21:26:40") && local.ends_with("+0900"),
        "{local}"
    );
    let utc = run(Command::new("date")
        .env("TZ", "Asia/Tokyo")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ", "-r"])
        .arg(&f));
    assert_eq!(utc, "2020-09-13T12:26:40Z");
}

#[test]
fn directories_have_the_mount_time_as_mtime() {
    let b = bucket("dirmtime");
    let old = UNIX_EPOCH + Duration::from_secs(1_500_000_000);
    server().put_with_mtime(&b, "d/sub/f", "x", old);
    let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
    let before = secs(SystemTime::now());
    let m = Mount::new(&b, &[]);
    let after = secs(SystemTime::now());
    for d in ["", "d", "d/sub"] {
        let t = std::fs::metadata(m.p(d)).unwrap().mtime();
        assert!(
            (before..=after).contains(&t),
            "{d:?}: mtime {t} not in mount window {before}..={after}"
        );
    }
    assert_eq!(
        std::fs::metadata(m.p("d/sub/f")).unwrap().mtime(),
        1_500_000_000
    );
}

#[test]
fn default_mode_and_owner() {
    let b = bucket("mode-default");
    server().put(&b, "d/f", "x");
    let m = Mount::new(&b, &[]);
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let f = std::fs::metadata(m.p("d/f")).unwrap();
    assert_eq!(f.mode(), libc::S_IFREG | 0o644, "file mode {:o}", f.mode());
    assert_eq!((f.uid(), f.gid()), (uid, gid));
    for d in ["", "d"] {
        let md = std::fs::metadata(m.p(d)).unwrap();
        assert_eq!(md.mode(), libc::S_IFDIR | 0o755, "dir mode {:o}", md.mode());
        assert_eq!((md.uid(), md.gid()), (uid, gid));
    }
}

#[test]
fn mode_and_owner_from_options() {
    let b = bucket("mode-options");
    server().put(&b, "d/f", "x");
    let check = |m: &Mount, fmode: u32, dmode: u32, uid: u32, gid: u32| {
        let f = std::fs::metadata(m.p("d/f")).unwrap();
        assert_eq!(f.mode(), libc::S_IFREG | fmode, "file mode {:o}", f.mode());
        assert_eq!((f.uid(), f.gid()), (uid, gid));
        let d = std::fs::metadata(m.p("d")).unwrap();
        assert_eq!(d.mode(), libc::S_IFDIR | dmode, "dir mode {:o}", d.mode());
        assert_eq!((d.uid(), d.gid()), (uid, gid));
    };
    let m = Mount::new(
        &b,
        &[
            "--uid",
            "1234",
            "--gid",
            "5678",
            "--file-mode",
            "600",
            "--dir-mode",
            "700",
        ],
    );
    check(&m, 0o600, 0o700, 1234, 5678);
    drop(m);
    let m = Mount::new(&b, &["-o", "uid=42,gid=43,file_mode=0440,dir_mode=0550"]);
    check(&m, 0o440, 0o550, 42, 43);
    drop(m);
    let m = MountSpec::new(&b)
        .config("[mount]\nuid = 7\ngid = 8\nfile_mode = 0o640\ndir_mode = 0o750\n")
        .mount();
    check(&m, 0o640, 0o750, 7, 8);
}

#[test]
fn statfs_reports_non_zero_sizes() {
    let b = bucket("statfs");
    server().put(&b, "f", "x");
    let m = Mount::new(&b, &[]);
    let path = CString::new(m.path().as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid C path and a zeroed out-parameter.
    let st = unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        assert_eq!(libc::statvfs(path.as_ptr(), &mut st), 0);
        st
    };
    assert!(st.f_bsize > 0 && st.f_frsize > 0);
    assert!(st.f_blocks > 0 && st.f_bavail > 0 && st.f_files > 0);
    // The documented fixed values: 1 PiB, all free, 2^32 inodes.
    assert_eq!(st.f_blocks * st.f_frsize, 1 << 50);
    assert_eq!(st.f_bavail, st.f_blocks);
    assert_eq!(st.f_files, 1 << 32);
    assert_eq!(st.f_namemax, 255);
    assert_ne!(st.f_flag & libc::ST_RDONLY, 0, "read-only flag");
    let df = run(Command::new("df")
        .args(["-B1", "--output=size,avail"])
        .arg(m.path()));
    let nums: Vec<u64> = df
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    assert_eq!(nums, [1 << 50, 1 << 50], "df: {df}");
}

#[test]
fn metadata_ttl_governs_when_changes_show() {
    let b = bucket("ttl");
    let s = server();
    s.put(&b, "ttl/old", "old");
    s.put(&b, "ttl/gone", "gone");
    let ttl = 2.0;
    let m = Mount::new(&b, &["--metadata-ttl", "2"]);
    assert_eq!(names(&m.p("ttl")), ["gone", "old"]);
    assert_eq!(std::fs::metadata(m.p("ttl/old")).unwrap().len(), 3);
    let listed = Instant::now();
    s.put(&b, "ttl/new", "new");
    s.delete(&b, "ttl/gone");
    s.put(&b, "ttl/old", "old, now longer");
    // Within the TTL the cached listing still answers.
    let checked_fresh = listed.elapsed() < Duration::from_secs_f64(ttl * 0.75);
    if checked_fresh {
        assert_errno(std::fs::metadata(m.p("ttl/new")), libc::ENOENT, "new");
        assert!(m.p("ttl/gone").exists());
        assert_eq!(std::fs::metadata(m.p("ttl/old")).unwrap().len(), 3);
    }
    // After it, each change shows: the listing and the kernel's copy of an
    // entry each live up to one TTL, so the bound is two TTLs.
    let limit = Duration::from_secs_f64(2.0 * ttl + 1.0);
    assert!(wait_for(limit, || m.p("ttl/new").exists()).is_some());
    assert!(wait_for(limit, || !m.p("ttl/gone").exists()).is_some());
    assert!(
        wait_for(limit, || std::fs::metadata(m.p("ttl/old"))
            .is_ok_and(|md| md.len() == 15))
        .is_some()
    );
    assert_eq!(std::fs::read(m.p("ttl/old")).unwrap(), b"old, now longer");
    assert_eq!(names(&m.p("ttl")), ["new", "old"]);
    assert!(checked_fresh, "too slow to check the cached view");
}

#[test]
fn metadata_ttl_zero_shows_changes_at_once() {
    let b = bucket("ttl0");
    let s = server();
    s.put(&b, "z/old", "old");
    s.put(&b, "z/gone", "gone");
    let m = Mount::new(&b, &["--metadata-ttl", "0"]);
    assert_eq!(names(&m.p("z")), ["gone", "old"]);
    assert_eq!(std::fs::metadata(m.p("z/old")).unwrap().len(), 3);
    s.put(&b, "z/new", "new");
    s.delete(&b, "z/gone");
    s.put(&b, "z/old", "old, now longer");
    assert_eq!(std::fs::read(m.p("z/new")).unwrap(), b"new");
    assert_errno(std::fs::metadata(m.p("z/gone")), libc::ENOENT, "gone");
    assert_eq!(std::fs::metadata(m.p("z/old")).unwrap().len(), 15);
    assert_eq!(std::fs::read(m.p("z/old")).unwrap(), b"old, now longer");
    assert_eq!(names(&m.p("z")), ["new", "old"]);
}

/// An object replaced or deleted in S3 within the metadata TTL: the read
/// that finds it (a GET pinned to the listed ETag, 412 or 404) fails ESTALE
/// once, and the next open reads the new version, or is ENOENT, without
/// waiting for the TTL (a DataLoader worker would otherwise fail on that
/// file until then).
#[test]
fn a_read_that_finds_the_object_changed_lets_the_next_open_see_the_change() {
    let b = bucket("changed");
    let s = server();
    s.put(&b, "c/replaced", data(300_000, 1));
    s.put(&b, "c/deleted", data(300_000, 2));
    let m = Mount::new(&b, &["--metadata-ttl", "3600"]);
    assert_eq!(std::fs::metadata(m.p("c/replaced")).unwrap().len(), 300_000);
    assert_eq!(std::fs::metadata(m.p("c/deleted")).unwrap().len(), 300_000);
    s.put(&b, "c/replaced", data(200_000, 3));
    s.delete(&b, "c/deleted");
    // The first reads may fail ESTALE (the kernel's entries name the old
    // version); a few later opens see the change, long before the TTL.
    let read_new = wait_for(Duration::from_secs(10), || {
        std::fs::read(m.p("c/replaced")).is_ok_and(|d| d == data(200_000, 3))
    });
    assert!(
        read_new.is_some(),
        "still not the new version:\n{}",
        m.log()
    );
    let gone = wait_for(Duration::from_secs(10), || {
        std::fs::read(m.p("c/deleted")).is_err_and(|e| e.raw_os_error() == Some(libc::ENOENT))
    });
    assert!(gone.is_some(), "still not ENOENT:\n{}", m.log());
}
