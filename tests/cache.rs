//! The data cache through a real mount: epoch 2 and restarts (also after
//! `kill -9`) read from disk with no GET, the size limit holds under a data set
//! larger than the cache, an overwrite of the same size is seen, corrupt and
//! truncated blocks are refetched, and a full, vanished or shared cache
//! directory never costs a reader anything but speed.

mod common;

use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use lakemount::cache::objfile::{MapFile, parse_map};
use lakemount::cache::packfile::parse_pack;

/// Every cached object in `dir`: its data file and its parsed block map.
fn objects(dir: &Path) -> Vec<(PathBuf, MapFile)> {
    let mut v = Vec::new();
    let root = dir.join("lakemount-v2/objects");
    for d in std::fs::read_dir(root).into_iter().flatten().flatten() {
        for f in std::fs::read_dir(d.path()).into_iter().flatten().flatten() {
            let p = f.path();
            if p.extension().is_some_and(|e| e == "map")
                && let Ok(bytes) = std::fs::read(&p)
                && let Ok(map) = parse_map(&bytes)
            {
                v.push((p.with_extension(""), map));
            }
        }
    }
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// Objects the packs of the cache in `dir` hold (records that check out).
fn packed(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("lakemount-v2/packs"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|f| std::fs::read(f.path()).ok())
        .map(|b| parse_pack(&b).len())
        .sum()
}

/// Number of blocks the cache in `dir` holds (present records of all maps,
/// and packed objects: one block each).
fn blocks(dir: &Path) -> usize {
    objects(dir)
        .iter()
        .map(|(_, m)| m.recs.iter().flatten().count())
        .sum::<usize>()
        + packed(dir)
}

/// Waits until the cache in `dir` of mount `m` holds `n` blocks (writes are
/// asynchronous).
fn wait_blocks(m: &Mount, dir: &Path, n: usize) {
    let got = wait_for(Duration::from_secs(30), || blocks(dir) >= n);
    assert!(
        got.is_some(),
        "cache holds {} blocks, expected {n}; {}",
        blocks(dir),
        why_not_written(m, dir)
    );
}

/// What a failed wait for cache writes prints: the free space of the
/// cache's file system (the limit follows it) and the mount's log (skipped
/// writes and I/O errors are logged).
fn why_not_written(m: &Mount, dir: &Path) -> String {
    let free = Command::new("df")
        .args(["-B1", "--output=avail"])
        .arg(dir)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).replace('\n', " "))
        .unwrap_or_default();
    format!("df avail: {free}; mount log:\n{}", m.log())
}

/// Waits until `n` objects of the cache in `dir` of mount `m` are sealed
/// (whole and checked: what passthrough serves).
fn wait_sealed(m: &Mount, dir: &Path, n: usize) {
    let sealed = || {
        objects(dir)
            .iter()
            .filter(|(_, map)| map.header.seal.is_some())
            .count()
    };
    let got = wait_for(Duration::from_secs(30), || sealed() >= n);
    assert!(
        got.is_some(),
        "{} objects sealed, expected {n}; {}",
        sealed(),
        why_not_written(m, dir)
    );
}

/// A `[cache]` section for `dir` plus `extra` keys. Unless `extra` sets it,
/// `min_free = 0`: the default 5% reserve depends on how full the host's disk
/// is (a CI disk over 95% full caches nothing, by design), which these tests
/// do not test; `a_cache_at_its_free_space_reserve_says_so_and_resumes` does.
fn cache_toml(dir: &Path, extra: &str) -> String {
    let reserve = if extra.contains("min_free") {
        ""
    } else {
        "min_free = 0\n"
    };
    format!(
        "[cache]\ndir = {:?}\n{reserve}{extra}",
        dir.display().to_string()
    )
}

/// Mounts `bucket` of `srv` with the cache in `dir`.
fn mount_cached(srv: &TestServer, bucket: &str, dir: &Path, extra: &str) -> Mount {
    MountSpec::new(bucket)
        .server(srv)
        .config(&cache_toml(dir, extra))
        .mount()
}

fn read(m: &Mount, rel: &str) -> Vec<u8> {
    std::fs::read(m.p(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}\n{}", m.log()))
}

#[test]
fn epoch_two_and_a_restart_read_from_disk_with_no_get() {
    let srv = private_server();
    let b = bucket_on(&srv, "epoch2");
    let files: Vec<(String, Vec<u8>)> = [
        ("shard-0.tar", 3 * (1 << 20) + 1500),
        ("img/a.jpg", 9_000),
        ("img/b.jpg", 1),
        ("empty", 0),
    ]
    .iter()
    .enumerate()
    .map(|(i, (k, n))| (k.to_string(), data(*n, i as u64 + 10)))
    .collect();
    for (k, d) in &files {
        srv.put(&b, k, d.clone());
    }
    let dir = TempDir::new("cache-epoch2");
    let cache = dir.0.join("c");
    // Memory tier off: epoch 2 must come from the disk.
    let extra = "memory_size = 0\n";
    let m = mount_cached(&srv, &b, &cache, extra);
    for (k, d) in &files {
        assert!(read(&m, k) == *d, "epoch 1: {k} differs");
    }
    // 4 blocks of the shard + 2 small files; the empty file has none.
    wait_blocks(&m, &cache, 6);
    let mode = std::fs::metadata(cache.join("lakemount-v2"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700, "cache directory mode {mode:o}");
    drop(m);
    srv.reset_counts();
    let m = mount_cached(&srv, &b, &cache, extra);
    for (k, d) in &files {
        assert!(read(&m, k) == *d, "epoch 2: {k} differs");
    }
    assert_eq!(srv.request_count("GetObject"), 0, "{}", m.log());
    assert_eq!(srv.request_count("HeadObject"), 0);
}

/// Reads `n` files (file `i` has `size(i)` bytes) through a cached mount,
/// kills it with SIGKILL, remounts within 5 s and reads them all again with
/// no GET.
fn kill_9_then_remount_reads_with_no_get(tag: &str, n: usize, size: fn(usize) -> usize) {
    let srv = private_server();
    let b = bucket_on(&srv, tag);
    let key = |i: usize| format!("d{:02}/f{i:05}.jpg", i % 50);
    for i in 0..n {
        srv.put(&b, &key(i), data(size(i), i as u64));
    }
    let dir = TempDir::new(&format!("cache-{tag}"));
    let cache = dir.0.join("c");
    let read_all = |m: &Mount| {
        std::thread::scope(|s| {
            for t in 0..8 {
                s.spawn(move || {
                    for i in (t..n).step_by(8) {
                        let got = read(m, &key(i));
                        assert!(got == data(size(i), i as u64), "{} differs", key(i));
                    }
                });
            }
        });
    };
    let mut m = mount_cached(&srv, &b, &cache, "");
    read_all(&m);
    let blocks_of = |i: usize| size(i).div_ceil(1 << 20);
    wait_blocks(&m, &cache, (0..n).map(blocks_of).sum());
    let mut child = m.child.take().unwrap();
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let _ = Command::new("umount").arg("-l").arg(m.path()).status();
    srv.reset_counts();
    let started = Instant::now();
    let m = mount_cached(&srv, &b, &cache, "");
    let up = started.elapsed();
    assert!(up < Duration::from_secs(5), "remount took {up:?}");
    read_all(&m);
    assert_eq!(srv.request_count("GetObject"), 0, "{}", m.log());
}

/// Small files: packed records.
#[test]
fn kill_9_then_remount_reuses_10000_pieces_within_5_seconds() {
    kill_9_then_remount_reads_with_no_get("kill9", 10_000, |i| 700 + i % 300);
}

/// Files of their own (data file and block map each).
#[test]
fn kill_9_then_remount_reuses_block_files() {
    kill_9_then_remount_reads_with_no_get("kill9b", 200, |i| 70_000 + i * 37);
}

#[test]
fn size_limit_holds_under_a_data_set_three_times_larger() {
    let srv = private_server();
    let b = bucket_on(&srv, "limit");
    let max = 2u64 << 20;
    let files: Vec<Vec<u8>> = (0..6).map(|i| data(1 << 20, 100 + i)).collect();
    for (i, d) in files.iter().enumerate() {
        srv.put(&b, &format!("f{i}"), d.clone());
    }
    let dir = TempDir::new("cache-limit");
    let cache = dir.0.join("c");
    let m = mount_cached(
        &srv,
        &b,
        &cache,
        &format!("max_size = {max}\nmin_free = 0\nblock_size = 65536\nmemory_size = 0\n"),
    );
    for _epoch in 0..2 {
        for (i, d) in files.iter().enumerate() {
            assert!(read(&m, &format!("f{i}")) == *d, "f{i} differs");
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    // Every file of the cache (data files with their holes, and maps), as
    // allocated on disk.
    let held: u64 = objects(&cache)
        .iter()
        .flat_map(|(p, _)| [p.clone(), p.with_extension("map")])
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|md| md.blocks() * 512)
        .sum();
    assert!(held > 0, "nothing cached");
    assert!(held <= max, "cache holds {held} bytes, limit {max}");
}

#[test]
fn same_size_overwrite_is_read_new_after_the_metadata_ttl() {
    let b = bucket("overwrite");
    let old = data(200_000, 1);
    let new = data(200_000, 2);
    server().put(&b, "x.bin", old.clone());
    let dir = TempDir::new("cache-overwrite");
    let cache = dir.0.join("c");
    let m = MountSpec::new(&b)
        .config(&format!(
            "[metadata]\nttl_secs = 1.0\n{}",
            cache_toml(&cache, "")
        ))
        .mount();
    assert!(read(&m, "x.bin") == old);
    wait_blocks(&m, &cache, 1);
    server().put(&b, "x.bin", new.clone());
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        read(&m, "x.bin") == new,
        "stale bytes served after overwrite"
    );
}

#[test]
fn corrupt_and_truncated_pieces_are_refetched() {
    let srv = private_server();
    let b = bucket_on(&srv, "corrupt");
    let d = data(4 * 65536, 5);
    srv.put(&b, "x.bin", d.clone());
    let dir = TempDir::new("cache-corrupt");
    let cache = dir.0.join("c");
    let extra = "block_size = 65536\nmemory_size = 0\n";
    let m = mount_cached(&srv, &b, &cache, extra);
    assert!(read(&m, "x.bin") == d);
    wait_blocks(&m, &cache, 4);
    drop(m);
    let objs = objects(&cache);
    assert_eq!(objs.len(), 1);
    let file = &objs[0].0;
    // Block 1: one bit flipped in the data. Block 3: cut short.
    let f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
    let mut byte = [0u8];
    std::fs::File::open(file)
        .unwrap()
        .read_exact_at(&mut byte, 65536 + 1000)
        .unwrap();
    f.write_all_at(&[byte[0] ^ 0x10], 65536 + 1000).unwrap();
    f.set_len(3 * 65536 + 30_000).unwrap();
    drop(f);
    srv.reset_counts();
    let m = mount_cached(&srv, &b, &cache, extra);
    assert!(read(&m, "x.bin") == d, "bad piece served");
    assert_eq!(srv.request_count("GetObject"), 2, "{}", m.log());
    let log = m.log();
    assert!(log.contains("failed its CRC32C check"), "{log}");
    assert!(log.contains("truncated"), "{log}");
}

/// Small files live in packs: a corrupt record is fetched again (and only
/// it), and a data set of small files three times the cache keeps the limit.
#[test]
fn packed_small_files_refetch_a_corrupt_one_and_keep_the_limit() {
    let srv = private_server();
    let b = bucket_on(&srv, "packed");
    let n = 300;
    let file = |i: usize| data(9_000 + i, 500 + i as u64);
    for i in 0..n {
        srv.put(&b, &format!("d{}/f{i:03}.jpg", i % 3), file(i));
    }
    let dir = TempDir::new("cache-packed");
    let cache = dir.0.join("c");
    let extra = "memory_size = 0\n";
    // Small-object read-ahead off: every GET here is a cache miss's.
    let mount = |extra: &str| {
        MountSpec::new(&b)
            .server(&srv)
            .config(&format!(
                "[read]\nsmall_max_size = 0\n{}",
                cache_toml(&cache, extra)
            ))
            .mount()
    };
    let m = mount(extra);
    for i in 0..20 {
        assert!(read(&m, &format!("d{}/f{i:03}.jpg", i % 3)) == file(i));
    }
    wait_blocks(&m, &cache, 20);
    drop(m);
    assert!(
        objects(&cache).is_empty(),
        "small files got files of their own"
    );
    // One data byte of f007 flipped in its pack.
    let packs: Vec<PathBuf> = std::fs::read_dir(cache.join("lakemount-v2/packs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(packs.len(), 1);
    let bytes = std::fs::read(&packs[0]).unwrap();
    let rec = parse_pack(&bytes)
        .into_iter()
        .find(|r| r.header.len as usize == file(7).len())
        .unwrap();
    let at = rec.off + 40 + 100;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&packs[0])
        .unwrap();
    f.write_all_at(&[bytes[at as usize] ^ 0x08], at).unwrap();
    drop(f);
    srv.reset_counts();
    let m = mount(extra);
    for i in 0..20 {
        assert!(
            read(&m, &format!("d{}/f{i:03}.jpg", i % 3)) == file(i),
            "f{i:03} differs"
        );
    }
    assert_eq!(srv.request_count("GetObject"), 1, "{}", m.log());
    assert!(m.log().contains("failed its CRC32C check"), "{}", m.log());
    drop(m);
    // About 2.7 MiB of small files through a 1 MiB cache, twice.
    let max = 1u64 << 20;
    let m = mount(&format!("{extra}max_size = {max}\n"));
    for _epoch in 0..2 {
        for i in 0..n {
            assert!(
                read(&m, &format!("d{}/f{i:03}.jpg", i % 3)) == file(i),
                "f{i:03} differs"
            );
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    let held: u64 = std::fs::read_dir(cache.join("lakemount-v2/packs"))
        .unwrap()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .map(|md| md.len())
        .sum();
    assert!(held > 0, "nothing cached");
    assert!(held <= max, "cache holds {held} bytes, limit {max}");
}

#[test]
fn full_tmpfs_and_vanished_dir_still_give_right_bytes() {
    let srv = private_server();
    let b = bucket_on(&srv, "tmpfs");
    // Large files (block files) and small ones (packed).
    let files: Vec<Vec<u8>> = (0..12)
        .map(|i| data(if i < 8 { 1 << 20 } else { 9_000 }, 200 + i))
        .collect();
    for (i, d) in files.iter().enumerate() {
        srv.put(&b, &format!("f{i}"), d.clone());
    }
    let dir = TempDir::new("cache-tmpfs");
    let fs = dir.0.join("fs");
    let _umount = tmpfs(&fs, "2m");
    let cache = fs.join("c");
    let m = mount_cached(
        &srv,
        &b,
        &cache,
        "max_size = \"100%\"\nmin_free = 0\nblock_size = 65536\nmemory_size = 0\n",
    );
    // Someone else fills the file system after the cache measured it: writes
    // hit ENOSPC.
    let filler = fs.join("filler");
    let _ = std::fs::write(&filler, vec![0u8; 1800 << 10]);
    for (i, d) in files.iter().enumerate() {
        assert!(
            read(&m, &format!("f{i}")) == *d,
            "f{i} differs (full cache)"
        );
    }
    // The cache directory vanishes under the mount.
    std::fs::remove_file(&filler).unwrap();
    std::fs::remove_dir_all(&cache).unwrap();
    for (i, d) in files.iter().enumerate() {
        assert!(read(&m, &format!("f{i}")) == *d, "f{i} differs (dir gone)");
    }
    for (i, d) in files.iter().enumerate() {
        assert!(
            read(&m, &format!("f{i}")) == *d,
            "f{i} differs (dir made again)"
        );
    }
    assert!(m.log().contains("reading from S3 instead"), "{}", m.log());
}

/// Mounts a tmpfs of `size` on `at` (unmounted when the guard drops).
fn tmpfs(at: &Path, size: &str) -> impl Drop {
    struct Umount(PathBuf);
    impl Drop for Umount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    std::fs::create_dir_all(at).unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(at)
        .status()
        .unwrap();
    assert!(ok.success(), "mount tmpfs");
    Umount(at.to_path_buf())
}

#[test]
fn a_cache_at_its_free_space_reserve_says_so_and_resumes() {
    let srv = private_server();
    let b = bucket_on(&srv, "reserve");
    let files: Vec<Vec<u8>> = (0..4).map(|i| data(200_000, 400 + i)).collect();
    for (i, d) in files.iter().enumerate() {
        srv.put(&b, &format!("f{i}"), d.clone());
    }
    let dir = TempDir::new("cache-reserve");
    let fs = dir.0.join("fs");
    let _umount = tmpfs(&fs, "4m");
    // Others filled the device: under the default 5% reserve are left.
    let filler = fs.join("filler");
    std::fs::write(&filler, vec![1u8; (4 << 20) - (100 << 10)]).unwrap();
    let cache = fs.join("c");
    let extra = "min_free = \"5%\"\nblock_size = 65536\nmemory_size = 0\n";
    let m = mount_cached(&srv, &b, &cache, extra);
    assert!(read(&m, "f0") == files[0], "f0 differs");
    assert!(
        m.log().contains("data cache is not storing anything new"),
        "{}",
        m.log()
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(blocks(&cache), 0, "cached inside the reserve");
    // Space comes back: the cache stores again (free space is re-read each second).
    std::fs::remove_file(&filler).unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    assert!(read(&m, "f1") == files[1], "f1 differs");
    wait_blocks(&m, &cache, 4);
    assert!(m.log().contains("data cache storing again"), "{}", m.log());
    // The disk fills up again while the cache holds pieces: it keeps serving
    // (and would evict to store), so that is no "not storing" episode.
    let _ = std::fs::write(&filler, vec![1u8; 4 << 20]);
    std::thread::sleep(Duration::from_millis(1200));
    assert!(read(&m, "f2") == files[2], "f2 differs");
    assert!(read(&m, "f0") == files[0], "f0 differs");
    std::thread::sleep(Duration::from_millis(300));
    let log = m.log();
    assert_eq!(log.matches("not storing anything new").count(), 1, "{log}");
}

#[test]
fn a_second_mount_on_the_same_cache_dir_is_refused() {
    let b = bucket("shared-cache");
    server().put(&b, "a", "x");
    let dir = TempDir::new("cache-shared");
    let cache = dir.0.join("c");
    let m = MountSpec::new(&b).config(&cache_toml(&cache, "")).mount();
    let holder = m.child.as_ref().expect("running").id();
    let mnt = TempDir::new("cache-shared-2");
    let o = lakemount_cmd(&server().endpoint())
        .args(["mount", &format!("s3://{b}")])
        .arg(&mnt.0)
        .arg("--cache-dir")
        .arg(&cache)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    // Names the holder: it may be a mount unmounted moments ago, still
    // uploading.
    let named = format!("in use by another running lakemount (pid {holder})");
    assert!(err.contains("cache.dir") && err.contains(&named), "{err}");
}

#[test]
fn warm_fills_the_cache_reports_and_guards_its_size() {
    let srv = private_server();
    let b = bucket_on(&srv, "warm");
    let files: Vec<(String, Vec<u8>)> = (0..12)
        .map(|i| {
            (
                format!("set/d{}/f{i}.bin", i % 3),
                data(100_000 + i * 1000, 300 + i as u64),
            )
        })
        .collect();
    for (k, d) in &files {
        srv.put(&b, k, d.clone());
    }
    let dir = TempDir::new("cache-warm");
    let cache = dir.0.join("c");
    let extra = "memory_size = 0\n";
    let m = mount_cached(&srv, &b, &cache, extra);
    let warm = |args: &[&str]| {
        lakemount_cmd(&srv.endpoint())
            .arg("warm")
            .args(args)
            .output()
            .unwrap()
    };
    let set = m.p("set");
    let set = set.to_str().unwrap();
    // The size guard refuses before reading anything.
    let o = warm(&[set, "--max-bytes", "100000"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--max-bytes"));
    assert_eq!(srv.request_count("GetObject"), 0);
    // Warm one file by name first, then the whole tree.
    let one = m.p(&files[0].0);
    let o = warm(&[one.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("warmed 1 files"));
    wait_blocks(&m, &cache, 1);
    let o = warm(&[set, "-j", "4"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.starts_with("warmed 11 files") && out.contains("already cached: 1 files"),
        "{out}"
    );
    wait_blocks(&m, &cache, 12);
    let o = warm(&[set]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.starts_with("warmed 0 files") && out.contains("already cached: 12 files"),
        "{out}"
    );
    // The cache holds what warm fetched: a fresh mount reads it with no GET.
    drop(m);
    srv.reset_counts();
    let m = mount_cached(&srv, &b, &cache, extra);
    for (k, d) in &files {
        assert!(read(&m, k) == *d, "{k} differs");
    }
    assert_eq!(srv.request_count("GetObject"), 0, "{}", m.log());
    // Not a lakemount mount with a cache: a clear error.
    let o = warm(&[dir.0.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("not on a lakemount mount with a data cache"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Mounts `bucket` of `srv` with the cache in `dir` and a metrics endpoint;
/// returns the mount and the endpoint's address.
fn mount_with_metrics(srv: &TestServer, bucket: &str, toml: &str) -> (Mount, String) {
    let addr = format!("127.0.0.1:{}", free_port());
    let m = MountSpec::new(bucket)
        .server(srv)
        .config(toml)
        .args(&["--metrics-addr", &addr])
        .mount();
    (m, addr)
}

#[test]
fn fully_cached_files_are_read_by_the_kernel_through_passthrough() {
    let srv = private_server();
    let b = bucket_on(&srv, "passthrough");
    let files: Vec<(String, Vec<u8>)> = [("shard.tar", 3 * (1 << 20) + 777), ("a.jpg", 9_000)]
        .iter()
        .enumerate()
        .map(|(i, (k, n))| (k.to_string(), data(*n, i as u64 + 50)))
        .collect();
    for (k, d) in &files {
        srv.put(&b, k, d.clone());
    }
    let dir = TempDir::new("cache-passthrough");
    let cache = dir.0.join("c");
    // Every size is passed through here (the 9 KB file too).
    let toml = cache_toml(&cache, "memory_size = 0\npassthrough_min_size = 0\n");
    let (m, addr) = mount_with_metrics(&srv, &b, &toml);
    for (k, d) in &files {
        assert!(read(&m, k) == *d, "epoch 1: {k} differs");
    }
    wait_sealed(&m, &cache, 2);
    let before = scrape(&addr);
    srv.reset_counts();
    for (k, d) in &files {
        assert!(read(&m, k) == *d, "passthrough: {k} differs");
    }
    let after = scrape(&addr);
    let opens = "lakemount_cache_passthrough_opens_total";
    assert_eq!(
        metric(&after, opens) - metric(&before, opens),
        2.0,
        "{after}"
    );
    // The kernel read the local files itself: no read reached lakemount.
    let fuse = "lakemount_fuse_read_bytes_total";
    assert_eq!(metric(&after, fuse), metric(&before, fuse), "{after}");
    assert_eq!(srv.request_count("GetObject"), 0);
    // After a restart the sealed files are passed through at once.
    drop(m);
    let (m, addr) = mount_with_metrics(&srv, &b, &toml);
    for (k, d) in &files {
        assert!(read(&m, k) == *d, "after restart: {k} differs");
    }
    let body = scrape(&addr);
    assert_eq!(metric(&body, opens), 2.0, "{body}");
    assert_eq!(metric(&body, fuse), 0.0, "{body}");
    assert_eq!(srv.request_count("GetObject"), 0, "{}", m.log());
    // Turned off by config: every read goes through lakemount again.
    drop(m);
    let off = cache_toml(
        &cache,
        "memory_size = 0\npassthrough = false\npassthrough_min_size = 0\n",
    );
    let (m, addr) = mount_with_metrics(&srv, &b, &off);
    for (k, d) in &files {
        assert!(read(&m, k) == *d, "passthrough off: {k} differs");
    }
    let body = scrape(&addr);
    assert_eq!(metric(&body, opens), 0.0, "{body}");
    let total: usize = files.iter().map(|(_, d)| d.len()).sum();
    assert_eq!(metric(&body, fuse), total as f64, "{body}");
    assert_eq!(srv.request_count("GetObject"), 0, "{}", m.log());
}

#[test]
fn an_overwrite_while_a_passthrough_handle_is_open_is_read_new_by_new_opens() {
    use std::io::{Read, Seek};
    let srv = private_server();
    let b = bucket_on(&srv, "pt-overwrite");
    let old = data(300_000, 61);
    let new = data(300_000, 62);
    srv.put(&b, "x.bin", old.clone());
    let dir = TempDir::new("cache-pt-overwrite");
    let cache = dir.0.join("c");
    // The kernel keeps its entry for the name far longer than lakemount's
    // metadata TTL: the open after the overwrite reaches the old inode, which
    // answers ESTALE, and the kernel's retry looks the name up again.
    let toml = format!(
        "[metadata]\nttl_secs = 1.0\nkernel_ttl_secs = 60.0\n{}",
        cache_toml(&cache, "memory_size = 0\n")
    );
    let (m, addr) = mount_with_metrics(&srv, &b, &toml);
    assert!(read(&m, "x.bin") == old);
    wait_sealed(&m, &cache, 1);
    // A reader holds the old version open by passthrough...
    let mut a = std::fs::File::open(m.p("x.bin")).unwrap();
    let body = scrape(&addr);
    assert_eq!(
        metric(&body, "lakemount_cache_passthrough_opens_total"),
        1.0
    );
    // ...while the object is overwritten with content of the same size.
    srv.put(&b, "x.bin", new.clone());
    std::thread::sleep(Duration::from_millis(1500));
    // A new open sees the new version: an overwritten object is a new inode
    // (the kernel allows only opens sharing the old backing file on the old one).
    assert!(read(&m, "x.bin") == new, "stale bytes after overwrite");
    assert!(
        scrape(&addr).contains("lakemount_fuse_errors_total{op=\"open\",errno=\"116\"}"),
        "the open did not go through the ESTALE retry:\n{}",
        scrape(&addr)
    );
    let mut got = Vec::new();
    a.read_to_end(&mut got).unwrap();
    assert!(got == old, "the open handle lost its version");
    a.rewind().unwrap();
    drop(a);
    // With the old handle closed, the new version reads as usual.
    assert!(read(&m, "x.bin") == new);
}

/// Direct-I/O opens and passthrough opens of one file never meet in the
/// kernel (which fails a conflicting open or mmap with EIO): while a
/// direct-I/O handle is open, a new open reads through lakemount even once
/// the file is fully cached; once it is closed, opens go passthrough and share
/// one backing file; both kinds mmap.
#[test]
fn direct_io_and_passthrough_opens_of_one_file_never_conflict() {
    use std::io::Read;
    let srv = private_server();
    let b = bucket_on(&srv, "pt-direct");
    let d = data(3 * (1 << 20) + 999, 71);
    srv.put(&b, "shard.tar", d.clone());
    let dir = TempDir::new("cache-pt-direct");
    let cache = dir.0.join("c");
    let toml = format!(
        "[read]\ndirect_io_min_size = 1048576\n{}",
        cache_toml(&cache, "memory_size = 0\n")
    );
    let (m, addr) = mount_with_metrics(&srv, &b, &toml);
    if m.log().contains("lacks FUSE_DIRECT_IO_ALLOW_MMAP") {
        eprintln!("skipped: the kernel has no FUSE_DIRECT_IO_ALLOW_MMAP (Linux 6.6+)");
        return;
    }
    let (direct, pt) = (
        "lakemount_fuse_direct_io_opens_total",
        "lakemount_cache_passthrough_opens_total",
    );
    let mut h1 = std::fs::File::open(m.p("shard.tar")).unwrap();
    let mut got = Vec::new();
    h1.read_to_end(&mut got).unwrap();
    assert!(got == d, "direct read differs");
    wait_sealed(&m, &cache, 1);
    let mut h2 = std::fs::File::open(m.p("shard.tar")).unwrap();
    let body = scrape(&addr);
    assert_eq!(
        (metric(&body, direct), metric(&body, pt)),
        (2.0, 0.0),
        "{body}"
    );
    got.clear();
    h2.read_to_end(&mut got).unwrap();
    assert!(got == d, "second direct read differs");
    assert!(
        mmap_read(&h1, d.len()) == d,
        "mmap of a direct-I/O handle differs"
    );
    drop((h1, h2));
    // The kernel sends RELEASE in the background: until lakemount has seen
    // both, a new open still reads through lakemount (and must, to not
    // conflict). Open until one goes passthrough.
    let mut opens = 0;
    let h3 = loop {
        let h = std::fs::File::open(m.p("shard.tar")).unwrap();
        opens += 1;
        if metric(&scrape(&addr), pt) == 1.0 {
            break h;
        }
        drop(h);
        assert!(
            opens < 100,
            "no passthrough open after the direct-I/O handles closed"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut h4 = std::fs::File::open(m.p("shard.tar")).unwrap();
    let body = scrape(&addr);
    assert_eq!(
        metric(&body, pt),
        2.0,
        "the second open shares the backing file\n{body}"
    );
    got.clear();
    h4.read_to_end(&mut got).unwrap();
    assert!(got == d, "passthrough read differs");
    assert!(
        mmap_read(&h3, d.len()) == d,
        "mmap of a passthrough handle differs"
    );
}

/// With the default `cache.passthrough_min_size` (64 KiB), a small fully
/// cached file is not sealed and is served by lakemount from the disk cache
/// (no GET, no passthrough open: its open puts it in the page cache, so no
/// read request either), while a large one is passed through.
#[test]
fn small_files_are_read_through_lakemount_not_passed_through() {
    let srv = private_server();
    let b = bucket_on(&srv, "ptmin");
    let small = data(9_000, 81);
    let large = data(3 << 20, 82);
    srv.put(&b, "a.jpg", small.clone());
    srv.put(&b, "shard.tar", large.clone());
    let dir = TempDir::new("cache-ptmin");
    let cache = dir.0.join("c");
    let toml = cache_toml(&cache, "memory_size = 0\n");
    let (m, _) = mount_with_metrics(&srv, &b, &toml);
    assert!(read(&m, "a.jpg") == small);
    assert!(read(&m, "shard.tar") == large);
    wait_sealed(&m, &cache, 1);
    wait_blocks(&m, &cache, 4);
    drop(m);
    let (m, addr) = mount_with_metrics(&srv, &b, &toml);
    srv.reset_counts();
    assert!(read(&m, "a.jpg") == small, "small file differs");
    assert!(read(&m, "shard.tar") == large, "large file differs");
    let body = scrape(&addr);
    assert_eq!(
        metric(&body, "lakemount_cache_passthrough_opens_total"),
        1.0,
        "{body}"
    );
    assert_eq!(
        metric(&body, "lakemount_page_cache_fills_total{result=\"ok\"}"),
        1.0,
        "the small file's open fills the page cache:\n{body}"
    );
    assert_eq!(
        metric(&body, "lakemount_fuse_read_bytes_total"),
        0.0,
        "no read reaches lakemount:\n{body}"
    );
    assert_eq!(srv.request_count("GetObject"), 0, "{}", m.log());
    // Sealed: the large object only.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        objects(&cache)
            .iter()
            .filter(|(_, o)| o.header.seal.is_some())
            .count(),
        1
    );
}

/// Keys of the stale-if-error tests: a 1 s metadata TTL, two attempts per
/// request, and no small-object read-ahead (it would fetch the file that is
/// meant to stay uncached).
const STALE_TEST_KEYS: &str =
    "\n[metadata]\nttl_secs = 1.0\n[s3]\nmax_attempts = 2\n[read]\nsmall_max_size = 0\n";

/// Reading `rel` fails with EIO, within 15 s (its attempts and backoff).
fn assert_eio_soon(m: &Mount, rel: &str) {
    let t = Instant::now();
    let err = std::fs::read(m.p(rel)).map(|d| d.len()).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{rel}: {err}");
    let took = t.elapsed();
    assert!(took < Duration::from_secs(15), "{rel}: EIO took {took:?}");
}

/// Stale-if-error: while S3 answers every request with 503, files whose
/// bytes are in the data cache keep opening and reading past the metadata
/// TTL; a file that is not cached fails with EIO (not ENOENT); once S3
/// answers again, everything reads and listings are fresh again.
#[test]
fn cached_files_keep_reading_while_s3_fails() {
    let srv = private_server();
    let b = bucket_on(&srv, "stalefail");
    let files = [
        ("d/big", data(300_000, 61)),
        ("d/small", data(5_000, 62)),
        ("d/uncached", data(300_000, 63)),
    ];
    for (k, d) in &files {
        srv.put(&b, k, d.clone());
    }
    let dir = TempDir::new("cache-stalefail");
    let cache = dir.0.join("c");
    let m = mount_cached(&srv, &b, &cache, STALE_TEST_KEYS);
    assert!(read(&m, "d/big") == files[0].1);
    assert!(read(&m, "d/small") == files[1].1);
    wait_blocks(&m, &cache, 2);
    std::thread::sleep(Duration::from_millis(1500));
    for op in ["ListObjectsV2", "GetObject", "HeadObject"] {
        srv.fail_next(op, 503, 100_000);
    }
    for (k, d) in &files[..2] {
        drop_page_cache(&m.p(k));
        assert!(read(&m, k) == *d, "{k} while S3 fails");
    }
    assert_eio_soon(&m, "d/uncached");
    // A name the stale listing lacks is not reported missing: S3 may have it.
    let err = std::fs::metadata(m.p("d/never-listed")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert!(m.log().contains("serving the last listings"), "{}", m.log());
    for op in ["ListObjectsV2", "GetObject", "HeadObject"] {
        srv.fail_next(op, 0, 0);
    }
    std::thread::sleep(Duration::from_millis(1100));
    assert!(read(&m, "d/uncached") == files[2].1);
    srv.put(&b, "d/new", "after the outage");
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(read(&m, "d/new"), b"after the outage");
    let log = m.log();
    assert!(log.contains("stale listings no longer served"), "{log}");
}

/// The same with the server gone (connections refused): cached files keep
/// reading, an uncached one is EIO within a few seconds.
#[test]
fn cached_files_keep_reading_after_s3_stops() {
    let srv = private_server();
    let b = bucket_on(&srv, "stalestop");
    srv.put(&b, "d/big", data(300_000, 71));
    srv.put(&b, "d/uncached", data(300_000, 72));
    let dir = TempDir::new("cache-stalestop");
    let cache = dir.0.join("c");
    let m = mount_cached(&srv, &b, &cache, STALE_TEST_KEYS);
    assert!(read(&m, "d/big") == data(300_000, 71));
    wait_blocks(&m, &cache, 1);
    srv.shutdown();
    std::thread::sleep(Duration::from_millis(1500));
    drop_page_cache(&m.p("d/big"));
    assert!(read(&m, "d/big") == data(300_000, 71));
    assert_eio_soon(&m, "d/uncached");
}

/// The same with a server that takes connections and answers nothing
/// (frozen, or a load balancer before a dead backend): a cached file
/// still opens within the wait for a LIST page (5 s), not after the
/// request deadline, every TTL again; once S3 answers, listings are fresh.
#[test]
fn cached_files_keep_reading_while_s3_hangs() {
    let srv = private_server();
    let b = bucket_on(&srv, "stalehang");
    srv.put(&b, "d/big", data(300_000, 81));
    let dir = TempDir::new("cache-stalehang");
    let cache = dir.0.join("c");
    let m = mount_cached(&srv, &b, &cache, STALE_TEST_KEYS);
    assert!(read(&m, "d/big") == data(300_000, 81));
    wait_blocks(&m, &cache, 1);
    srv.set_delay("ListObjectsV2", "", Duration::from_secs(12));
    for round in 0..2 {
        std::thread::sleep(Duration::from_millis(1500));
        drop_page_cache(&m.p("d/big"));
        let t = Instant::now();
        assert!(read(&m, "d/big") == data(300_000, 81), "round {round}");
        let took = t.elapsed();
        assert!(
            took < Duration::from_secs(9),
            "round {round}: {took:?} to read a cached file:\n{}",
            m.log()
        );
    }
    assert!(m.log().contains("serving the last listings"), "{}", m.log());
    // Once S3 answers again, listings are fresh again: a file put
    // meanwhile shows.
    srv.put(&b, "d/new", "listed late");
    srv.set_delay("ListObjectsV2", "", Duration::ZERO);
    let listed = wait_for(Duration::from_secs(20), || {
        std::fs::read(m.p("d/new")).is_ok_and(|d| d == b"listed late")
    });
    assert!(listed.is_some(), "{}", m.log());
}

/// The byte ranges GET asked for `key`, checked to be disjoint (no byte
/// asked twice); their total.
fn bytes_asked(srv: &TestServer, key: &str, size: u64) -> u64 {
    let mut ranges: Vec<(u64, u64)> = srv
        .get_ranges()
        .into_iter()
        .filter(|(k, _)| k == key)
        .map(
            |(_, r)| match r.as_deref().and_then(|r| r.strip_prefix("bytes=")) {
                Some(r) => {
                    let (a, b) = r.split_once('-').unwrap();
                    let b = if b.is_empty() {
                        size - 1
                    } else {
                        b.parse().unwrap()
                    };
                    (a.parse().unwrap(), b + 1)
                }
                None => (0, size),
            },
        )
        .collect();
    ranges.sort();
    for w in ranges.windows(2) {
        assert!(w[0].1 <= w[1].0, "{key}: GETs overlap: {ranges:?}");
    }
    ranges.iter().map(|(a, b)| b - a).sum()
}

#[test]
fn a_cached_block_is_fetched_once_by_read_ahead_and_concurrent_readers() {
    let srv = private_server();
    let b = bucket_on(&srv, "flights");
    let size = 9 * (1 << 20) + 1500;
    for (k, seed) in [("seq", 41), ("shared", 42)] {
        srv.put(&b, k, data(size, seed));
    }
    let dir = TempDir::new("cache-flights");
    // No hedged GET: each GET the server sees is one the cache sent.
    let m = mount_cached(&srv, &b, &dir.0.join("c"), "[s3]\nhedged_gets = false\n");
    // A sequential reader in 128 KiB reads, as `dd` or `cmp` read: the
    // read-ahead parts grow past block edges and meet inside blocks.
    srv.reset_counts();
    let mut f = std::fs::File::open(m.p("seq")).unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 128 << 10];
    loop {
        let n = std::io::Read::read(&mut f, &mut buf).unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got == data(size, 41), "seq: bytes differ");
    assert_eq!(bytes_asked(&srv, "seq", size as u64), size as u64);
    // Four readers of one cold file at once.
    srv.reset_counts();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| assert!(read(&m, "shared") == data(size, 42), "shared: bytes differ"));
        }
    });
    assert_eq!(
        bytes_asked(&srv, "shared", size as u64),
        size as u64,
        "{}",
        m.log()
    );
}
