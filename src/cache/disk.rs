//! The disk tier: one sparse **data file** per cached object version, holding
//! the object's bytes at their own offsets, and a **block map** beside it
//! ([`objfile`](super::objfile) has the format).
//!
//! Layout under `<cache.dir>/lakemount-v2/` (mode 0700):
//! - `objects/<h2>/<obj>`: the data file; `<obj>` is the 32-hex-digit
//!   [`ObjectId`] (bucket, key, ETag), `<h2>` its first two digits. Its size
//!   is the object's; block `i` lives at `i x block_size`, missing blocks are
//!   holes. A fully cached object is thus its own FUSE passthrough backing file.
//! - `objects/<h2>/<obj>.map`: which blocks are present, their CRC32C and last
//!   read time, and the seal (see below).
//! - `lock`: held (flock) by the running lakemount; a second one is refused.
//!
//! A block is written to the data file first and its map record after it, so a
//! crash never leaves a record for bytes that were not written. Every read
//! through lakemount checks the block's CRC32C: a truncated or corrupted block
//! is discarded (its hole punched, its record cleared) and fetched again,
//! never returned.
//!
//! **Seal.** When every block of an object is present and was checked by this
//! process (written from S3's bytes, or read back and verified), the data file
//! is flushed (`fdatasync`) and its inode number and ctime are stored in the
//! map. A seal that still matches the file means nothing changed the file since
//! (a write, truncation or punched hole sets ctime), so the object may be served
//! by FUSE passthrough, where the kernel reads the file and lakemount sees no
//! read to check. Anything else is read through the CRC32C checks.
//!
//! An in-memory index (LRU order by last read, one entry per block) accounts
//! the bytes held and drives eviction; an evicted block's hole is punched
//! (`fallocate`), an object with no block left loses both files. Objects with
//! an open passthrough handle are pinned: never evicted or expired. After a
//! restart the mount does not wait for the index: a block map is loaded on the
//! first access of its object, and a background scan loads the rest.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, FileExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use bytes::Bytes;
use lru::LruCache;
use tracing::{debug, info, warn};

use super::objfile::{self, Header, MapFile, Rec, Seal};
use super::{CacheConfig, ObjectId, PieceKey, Size, human};
use crate::telemetry::metrics as m;

/// Name of the cache's own directory inside `cache.dir`; the number changes
/// with the on-disk format (`lakemount-v1` held one file per block; it is
/// removed at start).
const FORMAT_DIR: &str = "lakemount-v2";
/// Directories of older formats, removed by the background scan.
const OLD_FORMAT_DIRS: &[&str] = &["lakemount-v1"];
/// Allocation unit assumed for accounting: a block occupies its size rounded
/// up to 4 KiB (the block size of ext4/xfs on NVMe by default).
const ALLOC_UNIT: u64 = 4096;
/// A block read within this long is never evicted to make room: when every
/// candidate is this young, the new block is not cached instead. Without it two
/// readers of a data set larger than the cache evict each other's blocks before
/// they are read again and re-download forever (LRU on a cyclic scan hits 0%).
pub const PROTECT: Duration = Duration::from_secs(30);
/// Most bytes of blocks waiting to be written; beyond it new blocks are not
/// cached (reads never wait for the cache disk).
const MAX_PENDING_BYTES: u64 = 256 << 20;
/// How often the file system's size and free space are re-read (statvfs).
const STATVFS_INTERVAL: Duration = Duration::from_secs(1);
/// Cache-device warnings and write-failure warnings: at most one per this.
const WARN_INTERVAL: Duration = Duration::from_secs(60);
/// A data file without a block map older than this is a leftover of a crash
/// (the map is created first) and is removed by the scan.
const ORPHAN_AGE: Duration = Duration::from_secs(60);

/// One cached block in the LRU index.
struct Entry {
    /// Allocated bytes on disk (the block rounded up to [`ALLOC_UNIT`]).
    alloc: u64,
    last_access: SystemTime,
    /// The last read time as last written to the block map.
    persisted: SystemTime,
    /// Still being written: readers skip it, nobody evicts it.
    writing: bool,
}

/// What the index knows of one cached object version.
struct Obj {
    /// Object size, bytes.
    size: u64,
    /// One per block: `Some` when present on disk.
    recs: Vec<Option<Rec>>,
    /// Blocks whose bytes this process wrote or verified by CRC32C.
    checked: Vec<bool>,
    present: u64,
    checked_n: u64,
    /// The seal in the map, when there is one (see the module doc).
    seal: Option<Seal>,
    /// Allocated bytes of the map file.
    map_alloc: u64,
}

impl Obj {
    fn new(size: u64, blocks: u64) -> Self {
        Self {
            size,
            recs: vec![None; blocks as usize],
            checked: vec![false; blocks as usize],
            present: 0,
            checked_n: 0,
            seal: None,
            map_alloc: alloc_size(objfile::map_len(blocks)),
        }
    }

    fn blocks(&self) -> u64 {
        self.recs.len() as u64
    }

    fn set_checked(&mut self, idx: usize) {
        if !self.checked[idx] {
            self.checked[idx] = true;
            self.checked_n += 1;
        }
    }

    /// Every block present and checked, and no seal yet: time to seal.
    fn wants_seal(&self) -> bool {
        self.seal.is_none() && self.checked_n == self.blocks() && self.present == self.blocks()
    }
}

struct Index {
    lru: LruCache<PieceKey, Entry>,
    objects: HashMap<ObjectId, Obj>,
    /// Open passthrough handles per object: such objects are never evicted.
    pins: HashMap<ObjectId, usize>,
    /// Sum of `alloc` of all blocks plus `map_alloc` of all objects, bytes.
    total: u64,
    /// The size limit in force, bytes (see [`DiskCache::refresh_limit`]).
    limit: u64,
    limit_checked: Option<Instant>,
    /// Free bytes of the file system at the last check.
    free: u64,
    /// Free space was at or below the `min_free` reserve at the last check
    /// and the limit left no room for one block: the cache could store
    /// nothing new (warned once per episode).
    at_reserve: bool,
    /// The restart scan has indexed the objects already on disk.
    scanned: bool,
}

impl Index {
    /// Adds `pk` as most recently used, last read at `at`, counting its bytes.
    fn insert(&mut self, pk: PieceKey, alloc: u64, at: SystemTime, writing: bool) {
        self.total += alloc;
        self.lru.push(
            pk,
            Entry {
                alloc,
                last_access: at,
                persisted: at,
                writing,
            },
        );
    }

    /// Adds object `obj` (not yet known) as `map` describes it; returns its
    /// present blocks as (last read, key, allocated bytes) for the caller to
    /// put into the LRU order.
    fn adopt(&mut self, obj: ObjectId, map: MapFile) -> Vec<(SystemTime, PieceKey, u64)> {
        let mut o = Obj::new(map.header.size, map.recs.len() as u64);
        o.seal = map.header.seal;
        self.total += o.map_alloc;
        let mut blocks = Vec::new();
        for (i, r) in map.recs.into_iter().enumerate() {
            if let Some(r) = r {
                o.present += 1;
                o.recs[i] = Some(r);
                let at = UNIX_EPOCH + Duration::from_secs(r.atime as u64);
                blocks.push((
                    at,
                    PieceKey { obj, idx: i as u64 },
                    alloc_size(r.len as u64),
                ));
            }
        }
        self.objects.insert(obj, o);
        blocks
    }

    /// Takes block `pk` out of the index (its entry and its record). Returns
    /// whether its object has no block left (and so was removed too).
    fn drop_block(&mut self, pk: PieceKey) -> bool {
        if let Some(e) = self.lru.pop(&pk) {
            self.total -= e.alloc;
        }
        let Some(o) = self.objects.get_mut(&pk.obj) else {
            return true;
        };
        let i = pk.idx as usize;
        if o.recs.get(i).is_some_and(|r| r.is_some()) {
            o.recs[i] = None;
            o.present -= 1;
        }
        if o.checked.get(i).copied().unwrap_or(false) {
            o.checked[i] = false;
            o.checked_n -= 1;
        }
        o.seal = None;
        if o.present == 0 {
            let o = self.objects.remove(&pk.obj).unwrap();
            self.total -= o.map_alloc;
            return true;
        }
        false
    }

    /// Takes every block of `obj` out of the index.
    fn drop_object(&mut self, obj: ObjectId) {
        if let Some(o) = self.objects.remove(&obj) {
            self.total -= o.map_alloc;
            for idx in 0..o.blocks() {
                if let Some(e) = self.lru.pop(&PieceKey { obj, idx }) {
                    self.total -= e.alloc;
                }
            }
        }
    }

    fn evictable(&self, k: &PieceKey, e: &Entry) -> bool {
        !e.writing && !self.pins.contains_key(&k.obj)
    }
}

/// Running latency baseline of cache reads, for the failing-device warning.
struct Latency {
    slow: f64,
    fast: f64,
    samples: u64,
    last_warn: Option<Instant>,
}

/// A fully cached, sealed object handed out for FUSE passthrough: the open
/// data file, and a pin that keeps the object from eviction until dropped.
pub struct Backing {
    /// The data file, open read-only; its bytes are the object's.
    pub file: File,
    _pin: Pin,
}

/// Keeps an object from eviction and expiry while alive.
struct Pin {
    cache: Arc<DiskCache>,
    obj: ObjectId,
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut ix = self.cache.index.lock().unwrap();
        if let Some(n) = ix.pins.get_mut(&self.obj) {
            *n -= 1;
            if *n == 0 {
                ix.pins.remove(&self.obj);
            }
        }
    }
}

/// The disk tier of the cache. All methods block: call them off the async
/// runtime (`spawn_blocking`).
pub struct DiskCache {
    root: PathBuf,
    max_size: Size,
    min_free: Size,
    ttl: Duration,
    /// Bytes of one block (`cache.block_size`).
    block_size: u64,
    index: Mutex<Index>,
    pending: Mutex<HashMap<PieceKey, Bytes>>,
    pending_bytes: AtomicU64,
    latency: Mutex<Latency>,
    last_write_warn: Mutex<Option<Instant>>,
    _lock: File,
}

fn mkdir(p: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(p)
}

impl DiskCache {
    /// Opens the cache in `dir` (created, mode 0700), takes its lock and starts
    /// the background index scan and the sweeper. Errors: the directory cannot be
    /// created or written, or another lakemount holds it (names `cache.dir`).
    pub fn open(dir: &Path, config: &CacheConfig) -> anyhow::Result<Arc<Self>> {
        let root = dir.join(FORMAT_DIR);
        for p in [root.clone(), root.join("objects")] {
            mkdir(&p).with_context(|| format!("cache.dir: cannot create {}", p.display()))?;
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("cache.dir: cannot chmod {}", root.display()))?;
        let lock_path = root.join("lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .with_context(|| format!("cache.dir: cannot open {}", lock_path.display()))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => anyhow::bail!(
                "cache.dir: {} is in use by another running lakemount; give each mount its own cache directory",
                dir.display()
            ),
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(e).context(format!("cache.dir: cannot lock {}", lock_path.display()));
            }
        }
        let cache = Arc::new(Self {
            root,
            max_size: config.max_size,
            min_free: config.min_free,
            ttl: Duration::from_secs(config.ttl_secs),
            block_size: config.block_size,
            index: Mutex::new(Index {
                lru: LruCache::unbounded(),
                objects: HashMap::new(),
                pins: HashMap::new(),
                total: 0,
                limit: 0,
                limit_checked: None,
                free: 0,
                at_reserve: false,
                scanned: false,
            }),
            pending: Mutex::new(HashMap::new()),
            pending_bytes: AtomicU64::new(0),
            latency: Mutex::new(Latency {
                slow: 0.0,
                fast: 0.0,
                samples: 0,
                last_warn: None,
            }),
            last_write_warn: Mutex::new(None),
            _lock: lock,
        });
        {
            let mut ix = cache.index.lock().unwrap();
            cache.refresh_limit(&mut ix, true);
        }
        let scan = cache.clone();
        std::thread::Builder::new()
            .name("lakemount-cache-scan".into())
            .spawn(move || scan.scan())
            .context("starting the cache index scan")?;
        let weak = Arc::downgrade(&cache);
        let every = (cache.ttl / 16).clamp(Duration::from_secs(1), Duration::from_secs(60));
        std::thread::Builder::new()
            .name("lakemount-cache-sweep".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(every);
                    match weak.upgrade() {
                        Some(c) => {
                            c.sweep();
                        }
                        None => return,
                    }
                }
            })
            .context("starting the cache sweeper")?;
        Ok(cache)
    }

    /// The directory holding the objects and state (`<cache.dir>/lakemount-v2`).
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn obj_dir(&self, obj: ObjectId) -> PathBuf {
        self.root.join("objects").join(&obj.hex()[..2])
    }

    /// Path of the data file of `obj`.
    pub fn data_path(&self, obj: ObjectId) -> PathBuf {
        self.obj_dir(obj).join(obj.hex())
    }

    /// Path of the block map of `obj`.
    pub fn map_path(&self, obj: ObjectId) -> PathBuf {
        self.obj_dir(obj).join(format!("{}.map", obj.hex()))
    }

    fn blocks_of(&self, size: u64) -> u64 {
        size.div_ceil(self.block_size)
    }

    /// Makes sure the index knows `obj` if it is on disk: loads its block map
    /// on first use (before the restart scan got to it). A map of another
    /// block size or object size, or a bad one, is removed with its data.
    fn load(&self, obj: ObjectId, size: u64) {
        if self.index.lock().unwrap().objects.contains_key(&obj) {
            return;
        }
        let path = self.map_path(obj);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) => {
                if e.kind() != std::io::ErrorKind::NotFound {
                    self.warn_io("reading", &path, &e);
                }
                return;
            }
        };
        let parsed = self.check_map(obj, &bytes, Some(size));
        let mut ix = self.index.lock().unwrap();
        if ix.objects.contains_key(&obj) {
            return;
        }
        if let Some(map) = parsed {
            let now = SystemTime::now();
            for (_, pk, alloc) in ix.adopt(obj, map) {
                // In use right now: most recently used.
                ix.insert(pk, alloc, now, false);
            }
        }
    }

    /// Parses the map `bytes` of `obj`; `None` (and the object's files
    /// removed) when it is bad or does not fit this cache.
    fn check_map(&self, obj: ObjectId, bytes: &[u8], size: Option<u64>) -> Option<MapFile> {
        match objfile::parse_map(bytes) {
            Ok(m)
                if m.header.block_size == self.block_size
                    && size.is_none_or(|s| s == m.header.size) =>
            {
                Some(m)
            }
            Ok(_) => {
                // Cached with another block size: its layout does not fit.
                debug!(obj = %obj.hex(), "cached object of another block size removed");
                self.remove_object_files(obj);
                None
            }
            Err(_) if bytes.is_empty() => {
                // Created, then a crash before its header was written.
                self.remove_object_files(obj);
                None
            }
            Err(why) => {
                warn!(map = %self.map_path(obj).display(), "cache block map {why}: discarded with its data, fetching again");
                metrics::counter!(m::CACHE_BAD_PIECES).increment(1);
                self.remove_object_files(obj);
                None
            }
        }
    }

    fn remove_object_files(&self, obj: ObjectId) {
        let _ = std::fs::remove_file(self.map_path(obj));
        let _ = std::fs::remove_file(self.data_path(obj));
    }

    /// Whether block `pk` of an object of `size` bytes is on disk or being written.
    pub fn contains(&self, pk: PieceKey, size: u64) -> bool {
        if self.pending.lock().unwrap().contains_key(&pk) {
            return true;
        }
        self.load(pk.obj, size);
        let ix = self.index.lock().unwrap();
        ix.objects
            .get(&pk.obj)
            .and_then(|o| o.recs.get(pk.idx as usize))
            .is_some_and(|r| r.is_some())
    }

    /// Bytes held (allocated size of all blocks and block maps).
    pub fn total_bytes(&self) -> u64 {
        self.index.lock().unwrap().total
    }

    /// The size limit in force, bytes: `min(max_size, held + free - min_free)`.
    pub fn limit_bytes(&self) -> u64 {
        let mut ix = self.index.lock().unwrap();
        self.refresh_limit(&mut ix, false);
        ix.limit
    }

    /// Reads block `pk` of an object of `size` bytes; the block holds `len`
    /// bytes. `None`: not cached, expired, or bad (a bad block is discarded
    /// and counted).
    pub fn read(&self, pk: PieceKey, size: u64, len: u64) -> Option<Bytes> {
        if let Some(b) = self.pending.lock().unwrap().get(&pk) {
            return Some(b.clone());
        }
        self.load(pk.obj, size);
        let now = SystemTime::now();
        let crc = {
            let mut ix = self.index.lock().unwrap();
            let rec = ix
                .objects
                .get(&pk.obj)
                .and_then(|o| o.recs.get(pk.idx as usize).copied().flatten())?;
            let e = ix.lru.peek(&pk)?;
            if e.writing || rec.len as u64 != len {
                return None;
            }
            if now.duration_since(e.last_access).unwrap_or_default() > self.ttl
                && !ix.pins.contains_key(&pk.obj)
            {
                let gone = ix.drop_block(pk);
                drop(ix);
                metrics::counter!(m::CACHE_EXPIRATIONS).increment(1);
                self.remove_blocks(pk.obj, &[pk.idx], gone);
                return None;
            }
            rec.crc
        };
        let path = self.data_path(pk.obj);
        let started = Instant::now();
        let f = match File::open(&path) {
            Ok(f) => f,
            Err(e) => {
                if e.kind() == std::io::ErrorKind::NotFound {
                    // The files are gone (the directory vanished): forget it all.
                    self.index.lock().unwrap().drop_object(pk.obj);
                    let _ = std::fs::remove_file(self.map_path(pk.obj));
                } else {
                    self.warn_io("reading", &path, &e);
                }
                return None;
            }
        };
        let mut buf = vec![0u8; len as usize];
        if let Err(e) = f.read_exact_at(&mut buf, pk.idx * self.block_size) {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                self.discard(pk, crc, "is truncated or has the wrong length");
            } else {
                self.warn_io("reading", &path, &e);
                self.discard(pk, crc, "unreadable");
            }
            return None;
        }
        if crc32c::crc32c(&buf) != crc {
            self.discard(pk, crc, "failed its CRC32C check");
            return None;
        }
        self.sample_latency(started.elapsed());
        let (persist, seal) = {
            let mut ix = self.index.lock().unwrap();
            let persist = match ix.lru.get_mut(&pk) {
                Some(e) => {
                    e.last_access = now;
                    let stale = now.duration_since(e.persisted).unwrap_or_default() > self.ttl / 16;
                    if stale {
                        e.persisted = now;
                    }
                    stale
                }
                None => false,
            };
            let seal = match ix.objects.get_mut(&pk.obj) {
                Some(o) if o.recs[pk.idx as usize].is_some_and(|r| r.crc == crc) => {
                    o.set_checked(pk.idx as usize);
                    o.wants_seal()
                }
                _ => false,
            };
            (persist, seal)
        };
        if persist {
            let rec = Rec {
                crc,
                len: len as u32,
                atime: unix_secs(now),
            };
            if let Ok(map) = OpenOptions::new().write(true).open(self.map_path(pk.obj)) {
                let _ = objfile::write_rec(&map, pk.idx, Some(rec));
            }
        }
        if seal {
            self.seal(pk.obj);
        }
        super::served(super::SRC_DISK, len, Some(started));
        Some(Bytes::from(buf))
    }

    /// Queues block `pk` (`data`) of an object of `size` bytes for writing,
    /// unless the write queue is full. Must be called inside a tokio runtime
    /// (the write runs on its blocking pool).
    pub fn admit(self: &Arc<Self>, pk: PieceKey, size: u64, data: Bytes) {
        let len = data.len() as u64;
        if self.pending_bytes.load(Ordering::Relaxed) + len > MAX_PENDING_BYTES {
            metrics::counter!(m::CACHE_SKIPPED, "reason" => "queue_full").increment(1);
            return;
        }
        {
            let mut p = self.pending.lock().unwrap();
            if p.contains_key(&pk) {
                return;
            }
            p.insert(pk, data.clone());
        }
        self.pending_bytes.fetch_add(len, Ordering::Relaxed);
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            me.write(pk, size, &data);
            me.pending.lock().unwrap().remove(&pk);
            me.pending_bytes.fetch_sub(len, Ordering::Relaxed);
        });
    }

    /// Writes block `pk` of an object of `size` bytes now. Returns whether it
    /// is cached. Failures are warnings, never errors.
    pub fn write(&self, pk: PieceKey, size: u64, data: &[u8]) -> bool {
        let blocks = self.blocks_of(size);
        debug_assert!(pk.idx < blocks && !data.is_empty());
        let alloc = alloc_size(data.len() as u64);
        self.load(pk.obj, size);
        let now = SystemTime::now();
        let victims = {
            let mut ix = self.index.lock().unwrap();
            if ix.lru.peek(&pk).is_some() {
                return true;
            }
            self.refresh_limit(&mut ix, false);
            let map_need = if ix.objects.contains_key(&pk.obj) {
                0
            } else {
                alloc_size(objfile::map_len(blocks))
            };
            let Some(victims) = self.make_room(&mut ix, alloc + map_need) else {
                metrics::counter!(m::CACHE_SKIPPED, "reason" => "full").increment(1);
                return false;
            };
            if !ix.objects.contains_key(&pk.obj) {
                let o = Obj::new(size, blocks);
                ix.total += o.map_alloc;
                ix.objects.insert(pk.obj, o);
            }
            ix.insert(pk, alloc, now, true);
            victims
        };
        self.remove_victims(victims);
        let rec = Rec {
            crc: crc32c::crc32c(data),
            len: data.len() as u32,
            atime: unix_secs(now),
        };
        match self.store_block(pk, size, data, rec) {
            Ok(fresh_map) => {
                let mut ix = self.index.lock().unwrap();
                if let Some(e) = ix.lru.peek_mut(&pk) {
                    e.writing = false;
                }
                if fresh_map {
                    // A new map file while the index knew blocks of this
                    // object: its files vanished; so did those blocks.
                    let stale: Vec<u64> = ix.objects.get(&pk.obj).map_or(Vec::new(), |o| {
                        (0..o.blocks())
                            .filter(|&i| i != pk.idx && o.recs[i as usize].is_some())
                            .collect()
                    });
                    for idx in stale {
                        ix.drop_block(PieceKey { obj: pk.obj, idx });
                    }
                }
                if !ix.objects.contains_key(&pk.obj) {
                    let o = Obj::new(size, blocks);
                    ix.total += o.map_alloc;
                    ix.objects.insert(pk.obj, o);
                }
                let o = ix.objects.get_mut(&pk.obj).unwrap();
                let i = pk.idx as usize;
                if o.recs[i].is_none() {
                    o.present += 1;
                }
                o.recs[i] = Some(rec);
                o.set_checked(i);
                let seal = o.wants_seal();
                ix.free = ix.free.saturating_sub(alloc);
                metrics::gauge!(m::CACHE_DISK_BYTES).set(ix.total as f64);
                drop(ix);
                if seal {
                    self.seal(pk.obj);
                }
                true
            }
            Err(e) => {
                self.warn_io("writing", &self.data_path(pk.obj), &e);
                metrics::counter!(m::CACHE_SKIPPED, "reason" => "io_error").increment(1);
                let mut ix = self.index.lock().unwrap();
                if let Some(e) = ix.lru.pop(&pk) {
                    ix.total -= e.alloc;
                }
                if ix.objects.get(&pk.obj).is_some_and(|o| o.present == 0) {
                    ix.drop_object(pk.obj);
                }
                // Re-read free space at the next write (ENOSPC: someone filled the disk).
                ix.limit_checked = None;
                false
            }
        }
    }

    /// Writes the block's bytes into the data file, then its record into the
    /// map (both created when missing, the map first). Returns whether the map
    /// was created now.
    fn store_block(&self, pk: PieceKey, size: u64, data: &[u8], rec: Rec) -> std::io::Result<bool> {
        let map_path = self.map_path(pk.obj);
        let (map, fresh) = match objfile::open_rw(&map_path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // The cache directory (or this object's) vanished: make it again.
                mkdir(map_path.parent().unwrap())?;
                objfile::open_rw(&map_path)?
            }
            r => r?,
        };
        if fresh {
            let h = Header {
                size,
                block_size: self.block_size,
                seal: None,
            };
            map.write_all_at(&h.encode(), 0)?;
        }
        let (df, _) = objfile::open_rw(&self.data_path(pk.obj))?;
        if df.metadata()?.len() != size {
            df.set_len(size)?;
        }
        df.write_all_at(data, pk.idx * self.block_size)?;
        objfile::write_rec(&map, pk.idx, Some(rec))?;
        Ok(fresh)
    }

    /// Seals `obj` (every block present and checked): flushes the data file
    /// and stores its inode and ctime in the map. A failure leaves it unsealed.
    fn seal(&self, obj: ObjectId) {
        let data = self.data_path(obj);
        let stat = (|| {
            let f = File::open(&data)?;
            f.sync_data()?;
            f.metadata()
        })();
        let md = match stat {
            Ok(md) => md,
            Err(e) => {
                self.warn_io("sealing", &data, &e);
                return;
            }
        };
        let seal = Seal::of(&md);
        let header = {
            let ix = self.index.lock().unwrap();
            match ix.objects.get(&obj) {
                Some(o) if o.wants_seal() && o.size == md.len() => Header {
                    size: o.size,
                    block_size: self.block_size,
                    seal: Some(seal),
                },
                _ => return,
            }
        };
        let written = OpenOptions::new()
            .write(true)
            .open(self.map_path(obj))
            .and_then(|map| map.write_all_at(&header.encode(), 0));
        if let Err(e) = written {
            self.warn_io("sealing", &self.map_path(obj), &e);
            return;
        }
        let mut ix = self.index.lock().unwrap();
        if let Some(o) = ix.objects.get_mut(&obj)
            && o.checked_n == o.blocks()
            && o.present == o.blocks()
        {
            o.seal = Some(seal);
        }
    }

    /// The data file of `obj` (`size` bytes) for FUSE passthrough, when every
    /// block is present and the seal matches the file (nothing changed it since
    /// its bytes were checked). The object stays pinned (not evicted) while the
    /// returned value lives. A seal that does not match is dropped: the object
    /// is then read through the CRC32C checks, and sealed again once all of its
    /// blocks passed them.
    pub fn backing(self: &Arc<Self>, obj: ObjectId, size: u64) -> Option<Backing> {
        if size == 0 {
            return None;
        }
        self.load(obj, size);
        let seal = {
            let ix = self.index.lock().unwrap();
            let o = ix.objects.get(&obj)?;
            if o.present != o.blocks() || o.size != size {
                return None;
            }
            o.seal?
        };
        let path = self.data_path(obj);
        let file = File::open(&path).ok()?;
        let md = file.metadata().ok()?;
        let mut ix = self.index.lock().unwrap();
        if Seal::of(&md) != seal || md.len() != size {
            info!(
                file = %path.display(),
                "cache data file changed since it was checked: reading it through the CRC32C \
                 checks instead of passthrough"
            );
            if let Some(o) = ix.objects.get_mut(&obj) {
                o.seal = None;
                o.checked.iter_mut().for_each(|c| *c = false);
                o.checked_n = 0;
            }
            return None;
        }
        *ix.pins.entry(obj).or_insert(0) += 1;
        let now = SystemTime::now();
        for idx in 0..self.blocks_of(size) {
            if let Some(e) = ix.lru.get_mut(&PieceKey { obj, idx }) {
                e.last_access = now;
            }
        }
        drop(ix);
        Some(Backing {
            file,
            _pin: Pin {
                cache: self.clone(),
                obj,
            },
        })
    }

    /// Under the lock: takes least-recently-used blocks out of the index until
    /// `need` more bytes fit under the limit, and returns them (their holes are
    /// punched by [`Self::remove_victims`]). `None`: they cannot fit without
    /// evicting a block read within [`PROTECT`] (or `need` exceeds the limit).
    fn make_room(&self, ix: &mut Index, need: u64) -> Option<Vec<(PieceKey, bool)>> {
        if need > ix.limit {
            return None;
        }
        let now = SystemTime::now();
        let mut victims = Vec::new();
        let mut freed = 0;
        // Victims per object: taking all of an object's blocks frees its map too.
        let mut per_obj: HashMap<ObjectId, u64> = HashMap::new();
        // Check first, evict after: a refusal must not evict anything.
        for (k, e) in ix.lru.iter().rev() {
            if ix.total - freed + need <= ix.limit {
                break;
            }
            if !ix.evictable(k, e) {
                continue;
            }
            if now.duration_since(e.last_access).unwrap_or_default() < PROTECT {
                return None;
            }
            victims.push(*k);
            freed += e.alloc;
            let n = per_obj.entry(k.obj).or_default();
            *n += 1;
            if let Some(o) = ix.objects.get(&k.obj)
                && *n == o.present
            {
                freed += o.map_alloc;
            }
        }
        if ix.total.saturating_sub(freed) + need > ix.limit {
            return None;
        }
        metrics::counter!(m::CACHE_EVICTIONS).increment(victims.len() as u64);
        Some(victims.into_iter().map(|k| (k, ix.drop_block(k))).collect())
    }

    /// Frees the disk space of blocks taken out of the index, given as (key,
    /// whether its object has no block left).
    fn remove_victims(&self, victims: Vec<(PieceKey, bool)>) {
        let mut by_obj: HashMap<ObjectId, (Vec<u64>, bool)> = HashMap::new();
        for (k, gone) in victims {
            let e = by_obj.entry(k.obj).or_default();
            e.0.push(k.idx);
            e.1 |= gone;
        }
        for (obj, (idxs, gone)) in by_obj {
            self.remove_blocks(obj, &idxs, gone);
        }
    }

    /// Frees blocks `idxs` of `obj` on disk: the whole object's files when it
    /// has no block left (`gone`), else their records and their bytes (holes).
    fn remove_blocks(&self, obj: ObjectId, idxs: &[u64], gone: bool) {
        if gone {
            // A write may have started the object again meanwhile: keep it then.
            if !self.index.lock().unwrap().objects.contains_key(&obj) {
                self.remove_object_files(obj);
            }
            return;
        }
        if let Ok(map) = OpenOptions::new().write(true).open(self.map_path(obj)) {
            for &idx in idxs {
                let _ = objfile::write_rec(&map, idx, None);
            }
        }
        if let Ok(df) = OpenOptions::new().write(true).open(self.data_path(obj)) {
            for &idx in idxs {
                if let Err(e) = objfile::punch_hole(&df, idx * self.block_size, self.block_size) {
                    self.warn_io("freeing a block of", &self.data_path(obj), &e);
                    break;
                }
            }
        }
    }

    /// Re-reads size and free space of the cache's file system (statvfs) when
    /// `force` or older than [`STATVFS_INTERVAL`], and sets the limit:
    /// `min(max_size, held + free - min_free)`.
    fn refresh_limit(&self, ix: &mut Index, force: bool) {
        if !force
            && ix
                .limit_checked
                .is_some_and(|t| t.elapsed() < STATVFS_INTERVAL)
        {
            return;
        }
        ix.limit_checked = Some(Instant::now());
        let Some((fs_total, free)) = statvfs(&self.root) else {
            return;
        };
        ix.free = free;
        let max = self.max_size.bytes(fs_total);
        let reserve = self.min_free.bytes(fs_total);
        ix.limit = max.min(ix.total + free.saturating_sub(reserve));
        // A cache that silently stores nothing looks like a slow S3: say why,
        // once when it starts and once when it ends. "Nothing": the limit leaves
        // no room for one block even after evicting everything. A warm cache
        // held at the reserve is fine (it evicts to store), and before the
        // restart scan has counted the blocks on disk `total` is not known.
        let block = alloc_size(self.block_size) + ALLOC_UNIT;
        let at_reserve = if !ix.scanned {
            false
        } else if ix.at_reserve {
            // Hysteresis: stay until there is room for two blocks.
            ix.limit < 2 * block
        } else {
            ix.limit < block && free <= reserve && max >= block
        };
        if at_reserve && !ix.at_reserve {
            warn!(
                dir = %self.root.display(),
                "data cache is not storing anything new: its file system has {} free, not more \
                 than the cache.min_free reserve of {}; reading from S3 until space is freed \
                 (free space on the device or lower cache.min_free)",
                human(free),
                human(reserve),
            );
        } else if !at_reserve && ix.at_reserve {
            info!(
                dir = %self.root.display(),
                "data cache storing again: {} free above the cache.min_free reserve",
                human(free - reserve.min(free)),
            );
        }
        ix.at_reserve = at_reserve;
        metrics::gauge!(m::CACHE_FS_FREE_BYTES).set(free as f64);
        metrics::gauge!(m::CACHE_LIMIT_BYTES).set(ix.limit as f64);
    }

    /// Removes expired blocks and shrinks to the limit (when others filled the
    /// disk). Pinned objects are skipped. Returns the number of blocks removed.
    pub fn sweep(&self) -> usize {
        let now = SystemTime::now();
        let mut expired = 0u64;
        let victims = {
            let mut guard = self.index.lock().unwrap();
            self.refresh_limit(&mut guard, true);
            let ix = &mut *guard;
            let mut over = ix.total.saturating_sub(ix.limit);
            let mut gone = Vec::new();
            for (k, e) in ix.lru.iter().rev() {
                if !ix.evictable(k, e) {
                    continue;
                }
                let idle = now.duration_since(e.last_access).unwrap_or_default();
                if idle > self.ttl {
                    expired += 1;
                } else if !(over > 0 && idle >= PROTECT) {
                    break;
                }
                over = over.saturating_sub(e.alloc);
                gone.push(*k);
            }
            let victims: Vec<(PieceKey, bool)> =
                gone.into_iter().map(|k| (k, ix.drop_block(k))).collect();
            metrics::gauge!(m::CACHE_DISK_BYTES).set(ix.total as f64);
            victims
        };
        let n = victims.len();
        metrics::counter!(m::CACHE_EXPIRATIONS).increment(expired);
        metrics::counter!(m::CACHE_EVICTIONS).increment(n as u64 - expired);
        self.remove_victims(victims);
        n
    }

    /// Rebuilds the index from the block maps on disk (runs once, in the
    /// background), removes leftovers of crashes and of older formats.
    fn scan(self: Arc<Self>) {
        let started = Instant::now();
        if let Some(parent) = self.root.parent() {
            for old in OLD_FORMAT_DIRS {
                let p = parent.join(old);
                if p.is_dir() {
                    match std::fs::remove_dir_all(&p) {
                        Ok(()) => {
                            info!(dir = %p.display(), "removed a data cache of an older format")
                        }
                        Err(e) => {
                            warn!(dir = %p.display(), "cannot remove a data cache of an older format: {e}")
                        }
                    }
                }
            }
        }
        let mut maps: Vec<(ObjectId, MapFile)> = Vec::new();
        let now = SystemTime::now();
        let objects = self.root.join("objects");
        for d in std::fs::read_dir(&objects).into_iter().flatten().flatten() {
            for f in std::fs::read_dir(d.path()).into_iter().flatten().flatten() {
                let name = f.file_name();
                let Some(name) = name.to_str() else { continue };
                if let Some(hex) = name.strip_suffix(".map") {
                    let Some(obj) = parse_hex(hex) else { continue };
                    if self.index.lock().unwrap().objects.contains_key(&obj) {
                        continue;
                    }
                    if !self.data_path(obj).exists() {
                        let _ = std::fs::remove_file(f.path());
                        continue;
                    }
                    let Ok(bytes) = std::fs::read(f.path()) else {
                        continue;
                    };
                    if let Some(map) = self.check_map(obj, &bytes, None) {
                        maps.push((obj, map));
                    }
                } else if let Some(obj) = parse_hex(name) {
                    // A data file whose map was never written: a crash between
                    // the two creates (the map comes first, so give it time).
                    let old = f
                        .metadata()
                        .and_then(|md| md.modified())
                        .is_ok_and(|t| now.duration_since(t).unwrap_or_default() > ORPHAN_AGE);
                    if old && !self.map_path(obj).exists() {
                        let _ = std::fs::remove_file(f.path());
                    }
                }
            }
        }
        let (n, bytes) = {
            let mut ix = self.index.lock().unwrap();
            let mut found = Vec::new();
            let n = maps.len();
            for (obj, map) in maps {
                if !ix.objects.contains_key(&obj) {
                    found.extend(ix.adopt(obj, map));
                }
            }
            // Newest first, each demoted to the LRU end: the oldest ends up evicted first.
            found.sort_by_key(|f| std::cmp::Reverse(f.0));
            for (at, pk, alloc) in found {
                if ix.lru.peek(&pk).is_none() {
                    ix.insert(pk, alloc, at, false);
                    ix.lru.demote(&pk);
                }
            }
            ix.scanned = true;
            self.refresh_limit(&mut ix, true);
            metrics::gauge!(m::CACHE_DISK_BYTES).set(ix.total as f64);
            (n, ix.total)
        };
        info!(
            objects = n,
            bytes,
            secs = started.elapsed().as_secs_f64(),
            dir = %self.root.display(),
            "cache index rebuilt"
        );
        // Expired blocks (last read over the TTL ago) and any excess go now.
        let removed = self.sweep();
        if removed > 0 {
            debug!(
                removed,
                "cache expired or shrunk to its limit after the scan"
            );
        }
    }

    /// Discards block `pk` (found bad): counted, warned, its record cleared and
    /// its bytes freed, so the next read fetches it again. `crc` is what the
    /// read expected: when the block was replaced or evicted meanwhile (a race
    /// with eviction, not a bad block), nothing is said.
    fn discard(&self, pk: PieceKey, crc: u32, why: &str) {
        let mut ix = self.index.lock().unwrap();
        let same = ix
            .objects
            .get(&pk.obj)
            .and_then(|o| o.recs.get(pk.idx as usize).copied().flatten())
            .is_some_and(|r| r.crc == crc);
        if !same || ix.lru.peek(&pk).is_none_or(|e| e.writing) {
            return;
        }
        let gone = ix.drop_block(pk);
        drop(ix);
        warn!(
            file = %self.data_path(pk.obj).display(),
            block = pk.idx,
            "cache block {why}: discarded, fetching the block again"
        );
        metrics::counter!(m::CACHE_BAD_PIECES).increment(1);
        self.remove_blocks(pk.obj, &[pk.idx], gone);
    }

    fn warn_io(&self, what: &str, path: &Path, e: &std::io::Error) {
        let mut last = self.last_write_warn.lock().unwrap();
        if last.is_none_or(|t| t.elapsed() >= WARN_INTERVAL) {
            *last = Some(Instant::now());
            warn!(
                path = %path.display(),
                "cache {what} failed: {e}; reading from S3 instead (further cache I/O errors \
                 are counted in lakemount_cache_skipped_total, warned once a minute)"
            );
        }
    }

    /// Keeps a slow (long-run) and a fast moving average of read latency and
    /// warns when the fast one exceeds twice the slow one: a failing SSD slows
    /// down before it fails.
    fn sample_latency(&self, took: Duration) {
        let t = took.as_secs_f64();
        let mut l = self.latency.lock().unwrap();
        l.samples += 1;
        if l.samples == 1 {
            l.slow = t;
            l.fast = t;
            return;
        }
        l.slow += (t - l.slow) * 0.001;
        l.fast += (t - l.fast) * 0.05;
        if l.samples > 1000
            && l.fast > 2.0 * l.slow
            && l.last_warn.is_none_or(|w| w.elapsed() >= WARN_INTERVAL)
        {
            l.last_warn = Some(Instant::now());
            warn!(
                recent_ms = l.fast * 1e3,
                baseline_ms = l.slow * 1e3,
                dir = %self.root.display(),
                "cache device reads are more than twice as slow as their baseline; \
                 check the device (a failing SSD slows down before it fails)"
            );
        }
    }
}

/// Allocated size of a file of `len` bytes (see [`ALLOC_UNIT`]).
fn alloc_size(len: u64) -> u64 {
    len.div_ceil(ALLOC_UNIT) * ALLOC_UNIT
}

/// (total bytes, bytes available to unprivileged users) of the file system at `p`.
fn statvfs(p: &Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).ok()?;
    // SAFETY: `c` is a valid NUL-terminated path; `st` is written by the call.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    // f_blocks and f_bavail count fragments; a file system that leaves
    // f_frsize 0 means its block size (statvfs(3)).
    let unit = if st.f_frsize > 0 {
        st.f_frsize as u64
    } else {
        st.f_bsize as u64
    };
    Some((st.f_blocks as u64 * unit, st.f_bavail as u64 * unit))
}

/// Seconds since the Unix epoch of `t` (0 before it), as a map record keeps them.
fn unix_secs(t: SystemTime) -> u32 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs().min(u32::MAX as u64) as u32)
}

/// 32 lowercase hex digits to an object id.
fn parse_hex(hex: &str) -> Option<ObjectId> {
    if hex.len() != 32 {
        return None;
    }
    let mut obj = [0u8; 16];
    for (i, b) in obj.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(ObjectId(obj))
}

#[cfg(test)]
mod tests {
    use super::*;

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
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
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
        // Someone writes into the data file: not offered any more; the
        // CRC32C path finds the bad block; once refetched and every block was
        // checked again, it is sealed anew.
        let f = OpenOptions::new().write(true).open(c.data_path(o)).unwrap();
        f.write_all_at(&[block(2)[5] ^ 0xff], 2 * BS + 5).unwrap();
        assert!(c.backing(o, size).is_none(), "changed file offered");
        assert!(c.read(pk(o, 0), size, BS).is_some());
        assert!(c.read(pk(o, 1), size, BS).is_some());
        assert!(c.read(pk(o, 2), size, BS).is_none(), "corrupt block served");
        assert!(c.backing(o, size).is_none());
        assert!(c.write(pk(o, 2), size, &block(2)));
        assert!(c.backing(o, size).is_some(), "not sealed again");
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
    fn a_pinned_object_is_never_evicted() {
        let d = tmpdir("pin");
        let c = DiskCache::open(&d, &cfg(&d, 2 * BS + 2 * 4096)).unwrap();
        let a = obj("a");
        fill(&c, a, 2);
        let pin = c.backing(a, 2 * BS).unwrap();
        age_all(&c);
        assert!(
            !c.write(pk(obj("b"), 0), BS, &block(0)),
            "pinned object evicted"
        );
        assert_eq!(c.sweep(), 0);
        drop(pin);
        assert!(c.write(pk(obj("b"), 0), BS, &block(0)));
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
}
