//! Unit tests of the disk cache (real files in a temporary directory).

use super::evict::parse_hex;
use super::*;
use crate::cache::packfile;

const BS: u64 = 4096;

fn obj(tag: &str) -> ObjectId {
    ObjectId::new("b", tag, "e")
}

fn pk(o: ObjectId, i: u64) -> PieceKey {
    PieceKey { obj: o, idx: i }
}

fn cfg(dir: &Path, max: u64) -> CacheConfig {
    CacheConfig {
        dir: Some(dir.to_path_buf()),
        max_size: Size::Bytes(max),
        min_free: Size::Bytes(0),
        block_size: BS,
        passthrough_min_size: 0,
        ..CacheConfig::default()
    }
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("lakemount-disk-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn block(i: u64) -> Vec<u8> {
    (0..BS).map(|j| (i * 7 + j * 13) as u8).collect()
}

/// Writes every block of an object of `n` whole blocks.
fn fill(c: &DiskCache, o: ObjectId, n: u64) {
    for i in 0..n {
        assert!(c.write(pk(o, i), n * BS, &block(i)), "block {i} not cached");
    }
}

fn reopen(d: &Path, max: u64) -> Arc<DiskCache> {
    // The scan thread holds an Arc until it finishes; wait for the lock.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match DiskCache::open(d, &cfg(d, max)) {
            Ok(c) => return c,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("{e}"),
        }
    }
}

fn age_all(c: &DiskCache) {
    let mut ix = c.index.lock().unwrap();
    let old = SystemTime::now() - PROTECT * 2;
    for (_, e) in ix.lru.iter_mut() {
        e.last_access = old;
    }
}

#[test]
fn names_round_trip() {
    let o = obj("k");
    assert_eq!(parse_hex(&o.hex()), Some(o));
    assert_eq!(parse_hex("zz"), None);
    assert_eq!(parse_hex(&format!("{}x", &o.hex()[1..])), None);
}

#[test]
fn blocks_live_at_their_offsets_and_bad_ones_are_discarded() {
    let d = tmpdir("wr");
    let c = DiskCache::open(&d, &cfg(&d, 1 << 30)).unwrap();
    let o = obj("k");
    fill(&c, o, 3);
    // The data file is the object itself.
    let file = std::fs::read(c.data_path(o)).unwrap();
    assert_eq!(file, [block(0), block(1), block(2)].concat());
    assert_eq!(c.read(pk(o, 1), 3 * BS, BS).unwrap(), &block(1)[..]);
    // Wrong expected length: not served.
    assert!(c.read(pk(o, 1), 3 * BS, BS - 1).is_none());
    // One bit flipped in block 1: discarded, never served.
    let f = OpenOptions::new().write(true).open(c.data_path(o)).unwrap();
    f.write_all_at(&[block(1)[100] ^ 1], BS + 100).unwrap();
    assert!(
        c.read(pk(o, 1), 3 * BS, BS).is_none(),
        "corrupt block served"
    );
    assert!(!c.contains(pk(o, 1), 3 * BS), "corrupt block kept");
    // Cut short inside block 2.
    f.set_len(2 * BS + 100).unwrap();
    assert!(
        c.read(pk(o, 2), 3 * BS, BS).is_none(),
        "truncated block served"
    );
    assert_eq!(c.read(pk(o, 0), 3 * BS, BS).unwrap(), &block(0)[..]);
    // Written again, block 1 reads back.
    assert!(c.write(pk(o, 1), 3 * BS, &block(1)));
    assert_eq!(c.read(pk(o, 1), 3 * BS, BS).unwrap(), &block(1)[..]);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn limit_is_kept_and_young_blocks_are_protected() {
    let d = tmpdir("limit");
    // Ten blocks and the map of their object (20 records fit in 4 KiB).
    let c = DiskCache::open(&d, &cfg(&d, 10 * BS + 4096)).unwrap();
    let o = obj("k");
    let size = 20 * BS;
    for i in 0..10 {
        assert!(c.write(pk(o, i), size, &block(i)));
    }
    assert_eq!(c.total_bytes(), 10 * BS + 4096);
    // Full of blocks read just now: the 11th is refused, nothing evicted.
    assert!(!c.write(pk(o, 10), size, &block(10)));
    assert_eq!(c.total_bytes(), 10 * BS + 4096);
    assert!(c.read(pk(o, 0), size, BS).is_some());
    // Age every block past PROTECT: now the least recently used (block 1,
    // block 0 was just read) goes, and its bytes become a hole.
    age_all(&c);
    assert!(c.write(pk(o, 10), size, &block(10)));
    assert_eq!(c.total_bytes(), 10 * BS + 4096);
    assert!(c.read(pk(o, 10), size, BS).is_some());
    assert!(!c.contains(pk(o, 1), size));
    assert!(c.contains(pk(o, 0), size));
    let mut b = vec![0u8; BS as usize];
    File::open(c.data_path(o))
        .unwrap()
        .read_exact_at(&mut b, BS)
        .unwrap();
    assert!(b.iter().all(|&x| x == 0), "evicted block's bytes kept");
    // ... and its space is given back: 10 blocks allocated, not 11.
    use std::os::unix::fs::MetadataExt;
    let allocated = std::fs::metadata(c.data_path(o)).unwrap().blocks() * 512;
    assert_eq!(allocated, 10 * BS, "evicted block's space kept");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn an_object_with_no_block_left_loses_its_files() {
    let d = tmpdir("gone");
    let c = DiskCache::open(&d, &cfg(&d, 2 * BS + 2 * 4096)).unwrap();
    let (a, b) = (obj("a"), obj("b"));
    fill(&c, a, 1);
    age_all(&c);
    fill(&c, b, 1);
    age_all(&c);
    // A third object needs the room of the oldest: `a` goes entirely.
    fill(&c, obj("c"), 1);
    assert!(!c.data_path(a).exists() && !c.map_path(a).exists());
    assert!(c.data_path(b).exists());
    assert_eq!(c.total_bytes(), 2 * BS + 2 * 4096);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_whole_checked_object_is_sealed_for_passthrough_until_its_file_changes() {
    let d = tmpdir("seal");
    let c = DiskCache::open(&d, &cfg(&d, 1 << 30)).unwrap();
    let o = obj("k");
    let size = 3 * BS;
    assert!(c.write(pk(o, 0), size, &block(0)));
    assert!(c.backing(o, size).is_none(), "partial object offered");
    fill(&c, o, 3);
    let b = c.backing(o, size).expect("whole object not offered");
    let mut got = Vec::new();
    std::io::Read::read_to_end(&mut &b.file, &mut got).unwrap();
    assert_eq!(got, [block(0), block(1), block(2)].concat());
    drop(b);
    // The seal survives a restart: offered with no read at all.
    drop(c);
    let c = reopen(&d, 1 << 30);
    assert!(c.backing(o, size).is_some(), "seal lost over a restart");
    // Someone writes into the data file (after another restart, so that it
    // was never handed out in this process): not offered any more; the
    // CRC32C path finds the bad block; once refetched and every block was
    // checked again, it is sealed anew.
    drop(c);
    let c = reopen(&d, 1 << 30);
    let f = OpenOptions::new().write(true).open(c.data_path(o)).unwrap();
    f.write_all_at(&[block(2)[5] ^ 0xff], 2 * BS + 5).unwrap();
    assert!(c.backing(o, size).is_none(), "changed file offered");
    assert!(c.read(pk(o, 0), size, BS).is_some());
    assert!(c.read(pk(o, 1), size, BS).is_some());
    assert!(c.read(pk(o, 2), size, BS).is_none(), "corrupt block served");
    assert!(c.backing(o, size).is_none());
    assert!(c.write(pk(o, 2), size, &block(2)));
    assert!(c.backing(o, size).is_some(), "not sealed again");
    // Handed out now: a bad block found later takes the whole object away
    // (its file is never changed in place once the kernel had it).
    f.write_all_at(&[block(0)[9] ^ 0xff], 9).unwrap();
    assert!(c.backing(o, size).is_none(), "changed file offered");
    assert!(c.read(pk(o, 0), size, BS).is_none(), "corrupt block served");
    assert!(!c.data_path(o).exists(), "handed-out file changed in place");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn after_a_restart_reading_every_block_seals_an_unsealed_object() {
    let d = tmpdir("reseal");
    let c = DiskCache::open(&d, &cfg(&d, 1 << 30)).unwrap();
    let o = obj("k");
    fill(&c, o, 2);
    // Break the seal by changing the file's metadata (ctime), not its bytes.
    let f = OpenOptions::new().write(true).open(c.data_path(o)).unwrap();
    f.set_modified(SystemTime::now()).unwrap();
    drop(c);
    let c = reopen(&d, 1 << 30);
    assert!(c.backing(o, 2 * BS).is_none(), "changed file offered");
    assert!(c.read(pk(o, 0), 2 * BS, BS).is_some());
    assert!(
        c.backing(o, 2 * BS).is_none(),
        "offered before every block was checked"
    );
    assert!(c.read(pk(o, 1), 2 * BS, BS).is_some());
    assert!(
        c.backing(o, 2 * BS).is_some(),
        "not sealed after a full check"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_pinned_object_is_never_evicted_and_an_exported_one_goes_whole() {
    let d = tmpdir("pin");
    let c = DiskCache::open(&d, &cfg(&d, 2 * BS + 2 * 4096)).unwrap();
    let a = obj("a");
    fill(&c, a, 2);
    let pin = c.backing(a, 2 * BS).unwrap();
    // Older than the TTL and than PROTECT: only the pin keeps it.
    {
        let mut ix = c.index.lock().unwrap();
        let old = SystemTime::now() - c.ttl - Duration::from_secs(1);
        for (_, e) in ix.lru.iter_mut() {
            e.last_access = old;
        }
    }
    assert!(
        !c.write(pk(obj("b"), 0), BS, &block(0)),
        "pinned object evicted"
    );
    assert_eq!(c.sweep(), 0, "pinned object expired");
    assert!(c.data_path(a).exists());
    drop(pin);
    // Once handed to the kernel, its data file is never changed in place
    // (a passthrough mapping may still read it): room for one block of
    // another object takes the whole object away, files and all.
    assert!(c.write(pk(obj("b"), 0), BS, &block(0)));
    assert!(!c.contains(pk(a, 0), 2 * BS) && !c.contains(pk(a, 1), 2 * BS));
    assert!(!c.data_path(a).exists() && !c.map_path(a).exists());
    assert_eq!(c.total_bytes(), BS + 4096);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn concurrent_writes_of_one_new_object_all_count_and_seal_it() {
    let d = tmpdir("concurrent");
    let c = DiskCache::open(&d, &cfg(&d, 1 << 30)).unwrap();
    let n = 16u64;
    for round in 0..20 {
        let o = obj(&format!("k{round}"));
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let c = &c;
                s.spawn(move || {
                    for i in (t..n).step_by(4) {
                        assert!(c.write(pk(o, i), n * BS, &block(i)));
                    }
                });
            }
        });
        for i in 0..n {
            assert!(
                c.contains(pk(o, i), n * BS),
                "round {round}: block {i} lost"
            );
        }
        assert!(c.backing(o, n * BS).is_some(), "round {round}: not sealed");
    }
    // 20 objects of 16 blocks, each with a 4 KiB map.
    assert_eq!(c.total_bytes(), 20 * (n * BS + 4096));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn second_open_is_refused_and_restart_reindexes() {
    let d = tmpdir("lock");
    let c = DiskCache::open(&d, &cfg(&d, 1 << 30)).unwrap();
    let o = obj("k");
    for i in 0..5 {
        assert!(c.write(pk(o, i), 8 * BS, &block(i)));
    }
    let e = DiskCache::open(&d, &cfg(&d, 1 << 30)).err().unwrap();
    assert!(e.to_string().contains("cache.dir"), "{e}");
    // An old-format directory is removed by the scan.
    std::fs::create_dir_all(d.join("lakemount-v1/pieces/ab")).unwrap();
    drop(c);
    let c = reopen(&d, 1 << 30);
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.total_bytes() < 5 * BS + 4096 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(c.total_bytes(), 5 * BS + 4096);
    assert_eq!(c.read(pk(o, 3), 8 * BS, BS).unwrap(), &block(3)[..]);
    assert!(c.read(pk(o, 5), 8 * BS, BS).is_none());
    while d.join("lakemount-v1").exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!d.join("lakemount-v1").exists(), "old format kept");
    std::fs::remove_dir_all(&d).unwrap();
}

/// Like [`cfg`], with objects below 64 KiB (one block here) packed.
fn pcfg(dir: &Path, max: u64) -> CacheConfig {
    CacheConfig {
        passthrough_min_size: 64 << 10,
        ..cfg(dir, max)
    }
}

fn small(i: u64, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i * 31 + j as u64 * 7) as u8).collect()
}

fn popen(d: &Path, max: u64) -> Arc<DiskCache> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match DiskCache::open(d, &pcfg(d, max)) {
            Ok(c) => return c,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("{e}"),
        }
    }
}

fn pack_files(d: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(d.join("lakemount-v2/packs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    v.sort();
    v
}

#[test]
fn small_objects_are_packed_read_back_and_found_after_a_restart() {
    let d = tmpdir("pack");
    let c = popen(&d, 1 << 30);
    let len = |i: u64| 500 + i as usize * 10;
    for i in 0..100 {
        let o = obj(&format!("s{i}"));
        assert!(c.write(pk(o, 0), len(i) as u64, &small(i, len(i))));
    }
    // No file of their own: one pack holds them all.
    assert!(!c.data_path(obj("s0")).exists() && !c.map_path(obj("s0")).exists());
    assert_eq!(pack_files(&d).len(), 1);
    let recs: u64 = (0..100).map(|i| packfile::HEADER_LEN + len(i) as u64).sum();
    assert_eq!(c.total_bytes(), recs);
    for i in 0..100 {
        let o = obj(&format!("s{i}"));
        assert!(c.contains(pk(o, 0), len(i) as u64));
        assert_eq!(
            c.read(pk(o, 0), len(i) as u64, len(i) as u64).unwrap(),
            small(i, len(i))
        );
    }
    drop(c);
    let c = popen(&d, 1 << 30);
    for i in 0..100 {
        let o = obj(&format!("s{i}"));
        let got = c.read(pk(o, 0), len(i) as u64, len(i) as u64);
        assert_eq!(
            got.as_deref(),
            Some(&small(i, len(i))[..]),
            "s{i} after restart"
        );
    }
    assert_eq!(c.total_bytes(), recs);
    // New records go to a pack of their own, never appended to an old one.
    assert!(c.write(pk(obj("new"), 0), 300, &small(7, 300)));
    assert_eq!(pack_files(&d).len(), 2);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_corrupt_or_torn_packed_object_is_dropped_and_the_others_kept() {
    let d = tmpdir("packbad");
    let c = popen(&d, 1 << 30);
    for i in 0..10 {
        assert!(c.write(pk(obj(&format!("s{i}")), 0), 1000, &small(i, 1000)));
    }
    drop(c);
    let pack = pack_files(&d).pop().unwrap();
    let f = OpenOptions::new().write(true).open(&pack).unwrap();
    // Object 5: one data byte flipped. Object 9 (the last): cut short.
    let rec = packfile::HEADER_LEN + 1000;
    let at = 5 * rec + packfile::HEADER_LEN + 17;
    let mut b = [0u8];
    File::open(&pack)
        .unwrap()
        .read_exact_at(&mut b, at)
        .unwrap();
    f.write_all_at(&[b[0] ^ 0x40], at).unwrap();
    f.set_len(10 * rec - 1).unwrap();
    drop(f);
    let c = popen(&d, 1 << 30);
    assert!(
        c.read(pk(obj("s5"), 0), 1000, 1000).is_none(),
        "corrupt object served"
    );
    assert!(!c.contains(pk(obj("s5"), 0), 1000));
    assert!(!c.contains(pk(obj("s9"), 0), 1000), "torn record indexed");
    for i in [0, 4, 6, 8] {
        assert_eq!(
            c.read(pk(obj(&format!("s{i}")), 0), 1000, 1000).unwrap(),
            small(i, 1000)
        );
    }
    // Written again, object 5 reads back (from a new pack).
    assert!(c.write(pk(obj("s5"), 0), 1000, &small(5, 1000)));
    assert_eq!(
        c.read(pk(obj("s5"), 0), 1000, 1000).unwrap(),
        small(5, 1000)
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn packs_are_evicted_whole_least_recent_first_and_young_ones_protected() {
    let d = tmpdir("packlimit");
    // 1 MiB limit: packs of 64 KiB, 21 records of 3,000 bytes each.
    let max = 1 << 20;
    let c = popen(&d, max);
    let rec = packfile::HEADER_LEN + 3000;
    let mut n = 0;
    while c.write(pk(obj(&format!("s{n}")), 0), 3000, &small(n, 3000)) {
        n += 1;
        assert!(n < 1000, "limit not kept");
    }
    // Full of objects read just now: refused, nothing evicted.
    assert!(n * rec <= max && (n + 1) * rec > max, "{n} objects fit");
    assert!(c.total_bytes() <= max);
    assert!(c.contains(pk(obj("s0"), 0), 3000));
    age_all(&c);
    {
        let mut ix = c.index.lock().unwrap();
        let old = SystemTime::now() - PROTECT * 2;
        ix.packs.values_mut().for_each(|p| p.last_access = old);
    }
    // s1 read now: its pack (the first) is young again, so the second goes.
    assert!(c.read(pk(obj("s1"), 0), 3000, 3000).is_some());
    let before = pack_files(&d);
    assert!(c.write(pk(obj("new"), 0), 3000, &small(999, 3000)));
    assert!(c.total_bytes() <= max);
    assert!(
        c.contains(pk(obj("s0"), 0), 3000),
        "a young pack was evicted"
    );
    assert!(
        !c.contains(pk(obj("s21"), 0), 3000),
        "the least recent pack stayed"
    );
    assert!(!c.contains(pk(obj("s41"), 0), 3000));
    assert!(c.contains(pk(obj(&format!("s{}", n - 1)), 0), 3000));
    let after = pack_files(&d);
    assert!(
        !after.contains(&before[1]),
        "the evicted pack's file stayed"
    );
    assert!(after.contains(&before[0]));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn expired_packed_objects_go_and_a_pack_left_empty_is_removed() {
    let d = tmpdir("packttl");
    let c = popen(&d, 1 << 20);
    // Two packs: 21 objects fill the first (64 KiB), the 22nd starts the second.
    for i in 0..22 {
        assert!(c.write(pk(obj(&format!("s{i}")), 0), 3000, &small(i, 3000)));
    }
    let packs = pack_files(&d);
    assert_eq!(packs.len(), 2);
    {
        let mut ix = c.index.lock().unwrap();
        let old = SystemTime::now() - Duration::from_secs(c.ttl.as_secs() + 10);
        for (_, e) in ix.lru.iter_mut() {
            e.last_access = old;
        }
    }
    assert_eq!(c.sweep(), 22);
    // The first pack served nothing any more: gone. The second is being
    // appended to: kept, its space still counted.
    assert_eq!(pack_files(&d), vec![packs[1].clone()]);
    assert_eq!(c.total_bytes(), packfile::HEADER_LEN + 3000);
    assert!(!c.contains(pk(obj("s0"), 0), 3000) && !c.contains(pk(obj("s21"), 0), 3000));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_cache_smaller_than_a_pack_still_evicts_once_its_pack_is_closed() {
    let d = tmpdir("packsmall");
    // 48 KiB: less than the smallest pack target (64 KiB), so the active
    // pack alone fills the cache and is never evicted while active.
    let c = popen(&d, 48 << 10);
    let mut n = 0;
    while c.write(pk(obj(&format!("s{n}")), 0), 3000, &small(n, 3000)) {
        n += 1;
        assert!(n < 100, "limit not kept");
    }
    assert!(n > 0 && c.total_bytes() <= 48 << 10);
    age_all(&c);
    {
        let mut ix = c.index.lock().unwrap();
        let old = SystemTime::now() - PROTECT * 2;
        ix.packs.values_mut().for_each(|p| p.last_access = old);
    }
    // Full again, but the full pack is closed and goes: the new object fits.
    assert!(c.write(pk(obj("new"), 0), 3000, &small(999, 3000)));
    assert!(c.read(pk(obj("new"), 0), 3000, 3000).is_some());
    assert!(!c.contains(pk(obj("s0"), 0), 3000));
    assert!(c.total_bytes() <= 48 << 10);
    std::fs::remove_dir_all(&d).unwrap();
}

/// Blocks admitted faster than the disk takes them are written by at most
/// MAX_BLOCK_WRITERS threads at once, and every one of them is written.
#[test]
fn admitted_blocks_are_written_by_a_bounded_pool() {
    let d = tmpdir("pool");
    let c = reopen(&d, 1 << 30);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let n = 300;
    let o = obj("pool");
    rt.block_on(async {
        for i in 0..n {
            c.admit(pk(o, i), n * BS, Bytes::from(block(i)));
        }
    });
    assert_eq!(c.flush(Duration::from_secs(30)), 0, "blocks still queued");
    let peak = c.peak_writers.load(Ordering::Relaxed);
    assert!(
        (1..=MAX_BLOCK_WRITERS).contains(&peak),
        "{peak} writers ran at once"
    );
    for i in 0..n {
        let got = c.read(pk(o, i), n * BS, BS).expect("block cached");
        assert!(got == block(i), "block {i} differs");
    }
    drop(c);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn an_adopted_file_is_a_copy_read_like_any_cached_object() {
    let d = tmpdir("adopt");
    let c = DiskCache::open(&d, &cfg(&d, 5 * BS + 4096)).unwrap();
    let src = d.join("written");
    let bytes = [block(0), block(1), block(2)].concat();
    std::fs::write(&src, &bytes).unwrap();
    let size = 2 * BS + 100;
    // The wrong size (the file changed meanwhile): refused.
    assert!(!c.adopt_file(obj("k"), size, &src));
    std::fs::write(&src, &bytes[..size as usize]).unwrap();
    let o = obj("k");
    assert!(c.adopt_file(o, size, &src));
    // Held already: not taken twice.
    assert!(!c.adopt_file(o, size, &src));
    assert_eq!(c.read(pk(o, 0), size, BS).unwrap(), &block(0)[..]);
    assert_eq!(c.read(pk(o, 2), size, 100).unwrap(), &block(2)[..100]);
    use std::os::unix::fs::MetadataExt;
    let (a, b) = (
        std::fs::metadata(&src).unwrap(),
        std::fs::metadata(c.data_path(o)).unwrap(),
    );
    assert_ne!((a.dev(), a.ino()), (b.dev(), b.ino()), "not a copy");
    // Evicted like any object; the original is untouched.
    age_all(&c);
    fill(&c, obj("other"), 3);
    assert!(!c.contains(pk(o, 0), size));
    assert_eq!(std::fs::read(&src).unwrap(), &bytes[..size as usize]);
    // No room without evicting what was read lately: refused, no file left.
    let o2 = obj("k2");
    assert!(!c.adopt_file(o2, size, &src));
    assert!(!c.data_path(o2).exists() && !c.map_path(o2).exists());
    // A restart finds an adopted object as it was left.
    let o3 = obj("k3");
    age_all(&c);
    assert!(c.adopt_file(o3, size, &src));
    drop(c);
    let c = reopen(&d, 5 * BS + 4096);
    assert_eq!(c.read(pk(o3, 1), size, BS).unwrap(), &block(1)[..]);
    std::fs::remove_dir_all(&d).unwrap();
}
