//! The disk tier: one sparse **data file** per cached object version, holding
//! the object's bytes at their own offsets, and a **block map** beside it
//! ([`objfile`] has the format).
//!
//! Layout under `<cache.dir>/lakemount-v2/` (mode 0700):
//! - `objects/<h2>/<obj>`: the data file; `<obj>` is the 32-hex-digit
//!   [`ObjectId`] (bucket, key, ETag), `<h2>` its first two digits. Its size
//!   is the object's; block `i` lives at `i x block_size`, missing blocks are
//!   holes. A fully cached object is thus its own FUSE passthrough backing file.
//! - `objects/<h2>/<obj>.map`: which blocks are present, their CRC32C and last
//!   read time, and the seal (see below).
//! - `packs/<seq>.pack`: small objects (below `cache.passthrough_min_size`,
//!   one block), many per file ([`pack`] has how; [`packfile`](super::packfile)
//!   the format).
//! - `lock`: held (flock) by the running lakemount; a second one is refused.
//!
//! A block is written to the data file first and its map record after it, so a
//! killed process never leaves a record for bytes that were not written (after
//! a power loss one may; the CRC32C check catches it). Every read
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
//! an open passthrough handle are pinned: never evicted or expired; an object
//! once handed to the kernel is only ever removed whole (a passthrough memory
//! mapping may read its file after close, and must never see a hole). After a
//! restart the mount does not wait for the index: a block map is loaded on the
//! first access of its object, and a background scan loads the rest.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, FileExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use bytes::Bytes;
use lru::LruCache;
use tracing::{debug, info, warn};

use super::objfile::{self, Header, MapFile, Rec, Seal};
use super::{CacheConfig, ObjectId, PieceKey, Size, human};
use crate::telemetry::metrics as m;
use index::{Index, Obj, alloc_size};
use pack::Packer;

mod adopt;
mod evict;
pub mod health;
pub use evict::statvfs;
mod index;
mod pack;

/// Name of the cache's own directory inside `cache.dir`; the number changes
/// with the on-disk format (`lakemount-v1` held one file per block; it is
/// removed at start).
const FORMAT_DIR: &str = "lakemount-v2";
/// Directories of older formats, removed by the background scan.
const OLD_FORMAT_DIRS: &[&str] = &["lakemount-v1"];
/// Takes the exclusive lock (flock) of file `lock` in `dir`, shown to the
/// user as `shown` (config key `key`): one running lakemount per directory.
/// The file then holds this process's pid, for the error another start
/// gives. Errors, naming the key: the file cannot be opened, or another
/// process holds the lock (`what`: what each mount needs its own of; the
/// holder's pid, and that it may be a mount unmounted moments ago that is
/// still uploading: `umount` returns before the daemon exits).
pub fn lock_dir(dir: &Path, key: &str, shown: &Path, what: &str) -> anyhow::Result<std::fs::File> {
    let lock_path = dir.join("lock");
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .with_context(|| format!("{key}: cannot open {}", lock_path.display()))?;
    match lock.try_lock() {
        Ok(()) => {
            // Only a hint for that error: a failure here costs nothing else.
            let _ = lock.set_len(0).and_then(|()| {
                lock.write_all_at(format!("{}\n", std::process::id()).as_bytes(), 0)
            });
            Ok(lock)
        }
        Err(std::fs::TryLockError::WouldBlock) => {
            let holder = std::fs::read_to_string(&lock_path)
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok())
                .map(|pid| format!(" (pid {pid})"))
                .unwrap_or_default();
            anyhow::bail!(
                "{key}: {} is in use by another running lakemount{holder}: a mount of it, or \
                 one unmounted moments ago that is still uploading its staged files or \
                 writing its cache (`umount` returns before it exits): wait for that \
                 process to exit, or give each mount its own {what}",
                shown.display()
            )
        }
        Err(std::fs::TryLockError::Error(e)) => {
            Err(e).context(format!("{key}: cannot lock {}", lock_path.display()))
        }
    }
}

/// A block read within this long is never evicted to make room: when every
/// candidate is this young, the new block is not cached instead. Without it two
/// readers of a data set larger than the cache evict each other's blocks before
/// they are read again and re-download forever (LRU on a cyclic scan hits 0%).
pub const PROTECT: Duration = Duration::from_secs(30);
/// Most bytes of blocks waiting to be written; beyond it new blocks are not
/// cached (reads never wait for the cache disk). 1 GiB: two sequential
/// readers at full read-ahead (64 MiB windows of 8 MiB parts) admit blocks in
/// bursts of over 100 MiB, and the disk stalls for a second or two while a
/// completed object is flushed for its seal; with 256 MiB, 2 of 5 epoch-1
/// runs of the cache benchmark dropped blocks (48-67 GETs in epoch 2). The
/// queued blocks mostly share their buffers with read-ahead parts still held;
/// beyond that they cost memory only while the disk lags.
const MAX_PENDING_BYTES: u64 = 1 << 30;
/// Queued block writes and the writers taking them.
#[derive(Default)]
struct Backlog {
    jobs: std::collections::VecDeque<(PieceKey, u64, Bytes)>,
    writers: usize,
}

/// Block files written at once, each by one blocking-pool thread: enough
/// to keep an NVMe drive's queue busy with writes of a block each; more
/// only hold threads (and two descriptors each) while the disk lags.
const MAX_BLOCK_WRITERS: usize = 8;
/// How often the file system's size and free space are re-read (statvfs).
const STATVFS_INTERVAL: Duration = Duration::from_secs(1);
/// Cache-device warnings and write-failure warnings: at most one per this.
const WARN_INTERVAL: Duration = Duration::from_secs(60);
/// A data file without a block map older than this is a leftover of a crash
/// (the map is created first) and is removed by the scan.
const ORPHAN_AGE: Duration = Duration::from_secs(60);

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
    /// Objects smaller than this are never sealed, so never passed through
    /// (`cache.passthrough_min_size`).
    seal_min_size: u64,
    index: Mutex<Index>,
    pending: Mutex<HashMap<PieceKey, Bytes>>,
    pending_bytes: AtomicU64,
    /// Block writes waiting for a writer, and the writers running now (at
    /// most [`MAX_BLOCK_WRITERS`], each on a blocking-pool thread): one lock,
    /// so that a block is never queued with every writer on its way out.
    backlog: Mutex<Backlog>,
    /// Most writers that ran at once.
    #[cfg(test)]
    peak_writers: std::sync::atomic::AtomicUsize,
    /// Read latency against its reference (the slow-device alarm).
    health: health::DeviceHealth,
    /// Probe reads of passthrough files so far (picks the next one's block).
    probes: AtomicU64,
    last_write_warn: Mutex<Option<Instant>>,
    /// The cache's file system frees a block's space by punching a hole
    /// (probed at open); without it objects are evicted whole.
    can_punch: bool,
    /// The pack being appended to.
    packer: Mutex<Packer>,
    /// Packs open for reads, by sequence number.
    pack_files: Mutex<LruCache<u64, Arc<File>>>,
    /// A pack is closed past this many bytes (or 1/16 of the limit in force,
    /// when smaller): 1/16 of the limit at start (eviction frees a pack at a
    /// time), within 64 KiB..64 MiB.
    pack_target: u64,
    /// Packs with a sequence number below this are from earlier runs (the
    /// restart scan's); this process writes the others.
    first_pack: u64,
    /// Signalled when the restart scan has indexed the packs.
    packs_ready: Condvar,
    /// When the cache was opened: reads wait for the packs' scan until
    /// a deadline counted from it.
    opened_at: Instant,
    /// Packed objects waiting for the pack writer thread.
    pack_queue: Arc<pack::PackQueue>,
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
        for p in [root.clone(), root.join("objects"), root.join("packs")] {
            mkdir(&p).with_context(|| format!("cache.dir: cannot create {}", p.display()))?;
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("cache.dir: cannot chmod {}", root.display()))?;
        let lock = lock_dir(&root, "cache.dir", dir, "cache directory")?;
        let can_punch = objfile::probe_punch_hole(&root);
        if !can_punch {
            info!(
                dir = %root.display(),
                "the cache's file system cannot punch holes: objects are evicted whole"
            );
        }
        let first_pack = pack::last_pack(&root.join("packs")).map_or(0, |s| s + 1);
        let limit = match evict::statvfs(&root) {
            Some((total, free)) => config.max_size.bytes(total).min(free),
            None => config.max_size.bytes(0),
        };
        let pack_target = (limit / 16).clamp(64 << 10, 64 << 20);
        let cache = Arc::new(Self {
            packer: Mutex::new(Packer {
                file: None,
                off: 0,
                next_seq: first_pack,
            }),
            pack_files: Mutex::new(LruCache::new(
                std::num::NonZeroUsize::new(pack::OPEN_PACKS).unwrap(),
            )),
            pack_target,
            first_pack,
            packs_ready: Condvar::new(),
            opened_at: Instant::now(),
            pack_queue: Arc::new(pack::PackQueue::default()),
            can_punch,
            root,
            max_size: config.max_size,
            min_free: config.min_free,
            ttl: Duration::from_secs(config.ttl_secs),
            block_size: config.block_size,
            seal_min_size: config.passthrough_min_size,
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
                packed: HashMap::new(),
                packs: HashMap::new(),
                active_pack: None,
                packs_scanned: false,
            }),
            pending: Mutex::new(HashMap::new()),
            pending_bytes: AtomicU64::new(0),
            backlog: Mutex::new(Backlog::default()),
            #[cfg(test)]
            peak_writers: std::sync::atomic::AtomicUsize::new(0),
            health: health::DeviceHealth::default(),
            probes: AtomicU64::new(0),
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
        let (weak, queue) = (Arc::downgrade(&cache), cache.pack_queue.clone());
        std::thread::Builder::new()
            .name("lakemount-cache-pack".into())
            .spawn(move || pack::writer(weak, queue))
            .context("starting the cache pack writer")?;
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
                if ix.lru.peek(&pk).is_none() {
                    ix.insert(pk, alloc, now, false);
                }
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
        if self.packable(size) {
            return self.contains_packed(pk.obj);
        }
        self.load(pk.obj, size);
        let ix = self.index.lock().unwrap();
        ix.objects
            .get(&pk.obj)
            .and_then(|o| o.recs.get(pk.idx as usize))
            .is_some_and(|r| r.is_some())
    }

    /// Bytes held (allocated size of all blocks and block maps, and the
    /// length of all packs).
    pub fn total_bytes(&self) -> u64 {
        self.index.lock().unwrap().total
    }

    /// The size limit in force, bytes: `min(max_size, held + free - min_free)`.
    pub fn limit_bytes(&self) -> u64 {
        let mut ix = self.index.lock().unwrap();
        self.refresh_limit(&mut ix, false);
        ix.limit
    }

    /// Read latency of this cache's device (the slow-device alarm).
    pub fn health(&self) -> &health::DeviceHealth {
        &self.health
    }

    /// [`DiskCache::read`] of a packed object (`size` below
    /// `cache.passthrough_min_size` and one block), without waiting for
    /// anything but one `pread` of a pack file (and, at most once per
    /// `ttl / 16`, a record header write): for a thread that may block on
    /// the local disk that long, e.g. a FUSE session thread. `None` also when
    /// `size` is not packed or the restart scan has not indexed the packs
    /// yet: then read with [`DiskCache::read`].
    pub fn read_now(&self, pk: PieceKey, size: u64) -> Option<Bytes> {
        if !self.packable(size) {
            return None;
        }
        if let Some(b) = self.pending.lock().unwrap().get(&pk) {
            return Some(b.clone());
        }
        if !self.index.lock().unwrap().packs_scanned {
            return None;
        }
        self.read_packed(pk.obj, size)
    }

    /// Reads block `pk` of an object of `size` bytes; the block holds `len`
    /// bytes. `None`: not cached, expired, or bad (a bad block is discarded
    /// and counted).
    pub fn read(&self, pk: PieceKey, size: u64, len: u64) -> Option<Bytes> {
        if let Some(b) = self.pending.lock().unwrap().get(&pk) {
            return Some(b.clone());
        }
        if self.packable(size) {
            return self.read_packed(pk.obj, len);
        }
        self.load(pk.obj, size);
        let now = SystemTime::now();
        let crc = {
            let ix = self.index.lock().unwrap();
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
                drop(ix);
                metrics::counter!(m::CACHE_EXPIRATIONS).increment(1);
                self.drop_and_free(pk);
                return None;
            }
            rec.crc
        };
        // Cached, so a bypass is a read S3 serves instead of the device.
        if self.health.bypass(health::ReadKind::Block) {
            return None;
        }
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
        let device = health::read_exact_at_counting(&f, &mut buf, pk.idx * self.block_size);
        if let Err(e) = &device {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                self.discard(pk, crc, "is truncated or has the wrong length");
            } else {
                self.warn_io("reading", &path, e);
                self.discard(pk, crc, "unreadable");
            }
            return None;
        }
        if crc32c::crc32c(&buf) != crc {
            self.discard(pk, crc, "failed its CRC32C check");
            return None;
        }
        let device = matches!(device, Ok(true));
        if device {
            self.health
                .sample(health::ReadKind::Block, started.elapsed(), &self.root);
        }
        let (persist, seal) = {
            let mut ix = self.index.lock().unwrap();
            let persist = ix
                .lru
                .get_mut(&pk)
                .is_some_and(|e| e.touch(now, self.ttl / 16));
            let seal = match ix.objects.get_mut(&pk.obj) {
                Some(o) if o.recs[pk.idx as usize].is_some_and(|r| r.crc == crc) => {
                    o.set_checked(pk.idx as usize);
                    o.wants_seal() && o.size >= self.seal_min_size
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
        // Latency only of reads the device served, not the page cache.
        let device = device.then_some(started);
        super::served(super::SRC_DISK, len, device);
        Some(Bytes::from(buf))
    }

    /// Waits until every queued block is written (and what it completes is
    /// sealed), at most `limit`. Returns the bytes still queued then (0: all
    /// written).
    pub fn flush(&self, limit: Duration) -> u64 {
        let deadline = Instant::now() + limit;
        loop {
            let left = self.pending_bytes.load(Ordering::Relaxed);
            if left == 0 || Instant::now() >= deadline {
                return left;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether [`Self::admit`] would queue `len` more bytes now, not skip
    /// them because the write queue holds [`MAX_PENDING_BYTES`].
    pub fn may_queue(&self, len: u64) -> bool {
        self.pending_bytes.load(Ordering::Relaxed) + len <= MAX_PENDING_BYTES
    }

    /// Queues block `pk` (`data`) of an object of `size` bytes for writing,
    /// unless the write queue is full. Must be called inside a tokio runtime
    /// (a block file's write runs on its blocking pool; packed objects go to
    /// the pack writer thread, which appends them one after the other).
    pub fn admit(self: &Arc<Self>, pk: PieceKey, size: u64, data: Bytes) {
        let len = data.len() as u64;
        if !self.may_queue(len) {
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
        if self.packable(size) {
            self.pack_queue.push(pk, size, data);
            return;
        }
        let start = {
            let mut b = self.backlog.lock().unwrap();
            b.jobs.push_back((pk, size, data));
            let start = b.writers < MAX_BLOCK_WRITERS;
            if start {
                b.writers += 1;
                #[cfg(test)]
                self.peak_writers
                    .fetch_max(b.writers, std::sync::atomic::Ordering::Relaxed);
            }
            start
        };
        if start {
            let me = self.clone();
            tokio::task::spawn_blocking(move || me.write_backlog());
        }
    }

    /// One block writer: writes the backlog's blocks one after the other
    /// until it is empty, then counts itself out (under the same lock).
    fn write_backlog(&self) {
        loop {
            let job = {
                let mut b = self.backlog.lock().unwrap();
                let job = b.jobs.pop_front();
                if job.is_none() {
                    b.writers -= 1;
                }
                job
            };
            let Some((pk, size, data)) = job else {
                return;
            };
            self.write(pk, size, &data);
            self.pending.lock().unwrap().remove(&pk);
            self.pending_bytes
                .fetch_sub(data.len() as u64, Ordering::Relaxed);
        }
    }

    /// Writes block `pk` of an object of `size` bytes now. Returns whether it
    /// is cached. Failures are warnings, never errors.
    pub fn write(&self, pk: PieceKey, size: u64, data: &[u8]) -> bool {
        if self.packable(size) {
            return self.write_packed(pk.obj, data);
        }
        let blocks = self.blocks_of(size);
        debug_assert!(pk.idx < blocks && !data.is_empty());
        let alloc = alloc_size(data.len() as u64);
        self.load(pk.obj, size);
        let now = SystemTime::now();
        let (victims, had) = {
            let mut ix = self.index.lock().unwrap();
            if ix.lru.peek(&pk).is_some() {
                return true;
            }
            if ix.objects.get(&pk.obj).is_some_and(|o| o.removing > 0) {
                // Blocks of this object are being freed on disk right now.
                metrics::counter!(m::CACHE_SKIPPED, "reason" => "busy").increment(1);
                return false;
            }
            // The blocks the index holds of this object now: if its files turn
            // out to have vanished, so have they.
            let had: Vec<u64> = ix.objects.get(&pk.obj).map_or(Vec::new(), |o| {
                (0..o.blocks())
                    .filter(|&i| o.recs[i as usize].is_some())
                    .collect()
            });
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
            (victims, had)
        };
        self.remove_victims(victims);
        let rec = Rec {
            crc: crc32c::crc32c(data),
            len: data.len() as u32,
            atime: unix_secs(now),
        };
        match self.store_block(pk, size, data, rec) {
            Ok(created_map) => {
                let mut ix = self.index.lock().unwrap();
                match ix.lru.peek_mut(&pk) {
                    Some(e) => e.writing = false,
                    // Taken out meanwhile (its object's files were found gone).
                    None => ix.insert(pk, alloc, now, false),
                }
                if created_map {
                    // This write made the map while the index held blocks of
                    // the object: its files vanished, and those blocks too.
                    for idx in had {
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
                let seal = o.wants_seal() && o.size >= self.seal_min_size;
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
    /// map (both created when missing, the map first). Returns whether this
    /// call created the map.
    fn store_block(&self, pk: PieceKey, size: u64, data: &[u8], rec: Rec) -> std::io::Result<bool> {
        let map_path = self.map_path(pk.obj);
        let (map, created) = match objfile::open_map(&map_path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // The cache directory (or this object's) vanished: make it again.
                mkdir(map_path.parent().unwrap())?;
                objfile::open_map(&map_path)?
            }
            r => r?,
        };
        if created {
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
        Ok(created)
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
        // In memory first: this process checked every block, so it may pass
        // the file through at once; the map keeps the seal for restarts.
        let header = {
            let mut ix = self.index.lock().unwrap();
            match ix.objects.get_mut(&obj) {
                Some(o) if o.wants_seal() && o.size == md.len() => {
                    o.seal = Some(seal);
                    Header {
                        size: o.size,
                        block_size: self.block_size,
                        seal: Some(seal),
                    }
                }
                _ => return,
            }
        };
        let written = OpenOptions::new()
            .write(true)
            .open(self.map_path(obj))
            .and_then(|map| map.write_all_at(&header.encode(), 0));
        if let Err(e) = written {
            self.warn_io("sealing", &self.map_path(obj), &e);
        }
    }

    /// One timed read of [`health::PROBE_LEN`] bytes of `file` (the data file
    /// of `obj`, `size` bytes) at a block picked by a counter, sampled as a
    /// [`health::ReadKind::Probe`] when it reached the device.
    fn probe(&self, file: &File, obj: ObjectId, size: u64) {
        let n = self.probes.fetch_add(1, Ordering::Relaxed);
        let blocks = self.blocks_of(size).max(1);
        // Successive probes of a file land on different blocks.
        let idx = n.wrapping_mul(0x9E37_79B9) % blocks;
        let off = idx * self.block_size;
        let len = (size - off).min(health::PROBE_LEN as u64) as usize;
        let mut buf = vec![0u8; len];
        // Its pages leave the page cache first (clean ones: these are never
        // written), so the read reaches the device even when lakemount's or
        // an earlier probe's reads cached them.
        // SAFETY: fadvise on a descriptor we own; it reads no memory of ours.
        unsafe {
            libc::posix_fadvise(
                std::os::fd::AsRawFd::as_raw_fd(file),
                off as libc::off_t,
                len as libc::off_t,
                libc::POSIX_FADV_DONTNEED,
            )
        };
        let started = Instant::now();
        match health::read_exact_at_counting(file, &mut buf, off) {
            Ok(true) => self
                .health
                .sample(health::ReadKind::Probe, started.elapsed(), &self.root),
            Ok(false) => {}
            Err(e) => self.warn_io("probing", &self.data_path(obj), &e),
        }
    }

    /// Whether an object of `size` bytes can ever be passed through
    /// ([`DiskCache::backing`]): not when empty or smaller than
    /// `cache.passthrough_min_size` (such objects are packed, never sealed).
    /// Answered without touching the disk.
    pub fn may_back(&self, size: u64) -> bool {
        size > 0 && size >= self.seal_min_size
    }

    /// The data file of `obj` (`size` bytes) for FUSE passthrough, when every
    /// block is present and the seal matches the file (nothing changed it since
    /// its bytes were checked). The object stays pinned (not evicted) while the
    /// returned value lives. A seal that does not match is dropped: the object
    /// is then read through the CRC32C checks, and sealed again once all of its
    /// blocks passed them. None either while the device's reads are slow
    /// ([`health::DeviceHealth::passthrough_ok`]): lakemount then reads the file
    /// itself, each read timed for the alarm. A whole file is probed now and
    /// then, handed out or
    /// not (one timed read of [`health::PROBE_LEN`] bytes;
    /// [`health::DeviceHealth::probe_due`]), so that a device the kernel alone reads
    /// is still watched and one that recovers gets passthrough back.
    pub fn backing(self: &Arc<Self>, obj: ObjectId, size: u64) -> Option<Backing> {
        if !self.may_back(size) {
            return None;
        }
        self.load(obj, size);
        let whole = |o: &Obj| o.present == o.blocks() && o.removing == 0 && o.size == size;
        let seal = {
            let ix = self.index.lock().unwrap();
            let o = ix.objects.get(&obj)?;
            if !whole(o) {
                return None;
            }
            o.seal?
        };
        let path = self.data_path(obj);
        let file = File::open(&path).ok()?;
        if !self.health.passthrough_ok() {
            // Probes go on while the file is read through lakemount, so
            // that a device whose probes were slow is seen to recover.
            if self.health.probe_due() {
                self.probe(&file, obj, size);
            }
            return None;
        }
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
        // Unchanged while the file was opened and checked?
        match ix.objects.get_mut(&obj) {
            Some(o) if whole(o) && o.seal == Some(seal) => o.exported = true,
            _ => return None,
        }
        *ix.pins.entry(obj).or_insert(0) += 1;
        // The kernel's reads are not seen: the open counts as a read of every
        // block, persisted as reads are (at most every TTL/16).
        let now = SystemTime::now();
        let mut persist = Vec::new();
        for idx in 0..self.blocks_of(size) {
            if let Some(e) = ix.lru.get_mut(&PieceKey { obj, idx })
                && e.touch(now, self.ttl / 16)
            {
                persist.push(idx);
            }
        }
        let recs: Vec<(u64, Rec)> = ix.objects.get(&obj).map_or(Vec::new(), |o| {
            persist
                .iter()
                .filter_map(|&i| o.recs[i as usize].map(|r| (i, r)))
                .collect()
        });
        drop(ix);
        if self.health.probe_due() {
            self.probe(&file, obj, size);
        }
        if !recs.is_empty()
            && let Ok(map) = OpenOptions::new().write(true).open(self.map_path(obj))
        {
            for (idx, r) in recs {
                let rec = Rec {
                    atime: unix_secs(now),
                    ..r
                };
                let _ = objfile::write_rec(&map, idx, Some(rec));
            }
        }
        Some(Backing {
            file,
            _pin: Pin {
                cache: self.clone(),
                obj,
            },
        })
    }
}

/// Seconds since the Unix epoch of `t` (0 before it), as a map record keeps them.
fn unix_secs(t: SystemTime) -> u32 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs().min(u32::MAX as u64) as u32)
}

#[cfg(test)]
mod tests;
