//! The disk tier: one file per cached block ("piece").
//!
//! Layout under `<cache.dir>/lakemount-v1/` (mode 0700):
//! - `pieces/<h2>/<obj>-<idx>`: a piece; `<obj>` is the 32-hex-digit
//!   [`ObjectId`] (bucket, key, ETag), `<h2>` its first two digits, `<idx>` the
//!   block index. The file is a 16-byte header (magic `LMC1`, CRC32C of the
//!   data as u32 LE, data length as u64 LE) followed by the data.
//! - `tmp/`: pieces being written; each is renamed into place when complete,
//!   so a crash leaves at most a stray temporary file (removed at the next start).
//! - `lock`: held (flock) by the running lakemount; a second one is refused.
//!
//! Every read checks the header, the length and the CRC32C: a truncated or
//! corrupted piece is removed and reported as a miss (the block is fetched
//! again), never returned.
//!
//! An in-memory index (LRU order by last access) accounts the bytes held and
//! drives eviction. After a restart the mount does not wait for it: pieces are
//! found by path at once, and the index is rebuilt by a background scan of file
//! sizes and modification times (the last access, refreshed at most every
//! TTL/16 on reads).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use bytes::Bytes;
use lru::LruCache;
use tracing::{debug, info, warn};

use super::{CacheConfig, ObjectId, PieceKey, Size, human};
use crate::telemetry::metrics as m;

/// Magic at the start of every piece file ("LakeMount Cache v1").
const MAGIC: &[u8; 4] = b"LMC1";
/// Header bytes before a piece's data.
pub const HEADER_LEN: u64 = 16;
/// Allocation unit assumed for accounting: a piece occupies its size rounded
/// up to 4 KiB (the block size of ext4/xfs on NVMe by default).
const ALLOC_UNIT: u64 = 4096;
/// A piece read within this long is never evicted to make room: when every
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

struct Entry {
    /// Allocated bytes on disk (header + data rounded up to [`ALLOC_UNIT`]).
    alloc: u64,
    last_access: SystemTime,
    /// The piece file's mtime as last set (the persisted last access).
    persisted: SystemTime,
    /// Still being written: readers skip it, nobody evicts it.
    writing: bool,
}

struct Index {
    lru: LruCache<PieceKey, Entry>,
    /// Sum of `alloc` of all entries, bytes.
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
    /// The restart scan has indexed the pieces already on disk.
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
}

/// Running latency baseline of cache reads, for the failing-device warning.
struct Latency {
    slow: f64,
    fast: f64,
    samples: u64,
    last_warn: Option<Instant>,
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
    next_tmp: AtomicU64,
    _lock: File,
}

impl DiskCache {
    /// Opens the cache in `dir` (created, mode 0700), takes its lock and starts
    /// the background index scan and the sweeper. Errors: the directory cannot be
    /// created or written, or another lakemount holds it (names `cache.dir`).
    pub fn open(dir: &Path, config: &CacheConfig) -> anyhow::Result<Arc<Self>> {
        let root = dir.join("lakemount-v1");
        let mk = |p: &Path| {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(p)
                .with_context(|| format!("cache.dir: cannot create {}", p.display()))
        };
        mk(&root)?;
        mk(&root.join("pieces"))?;
        mk(&root.join("tmp"))?;
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
        // Leftovers of writes a crash interrupted.
        if let Ok(rd) = std::fs::read_dir(root.join("tmp")) {
            for e in rd.flatten() {
                let _ = std::fs::remove_file(e.path());
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
            next_tmp: AtomicU64::new(0),
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

    /// The directory holding pieces and state (`<cache.dir>/lakemount-v1`).
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn piece_path(&self, pk: PieceKey) -> PathBuf {
        let hex = pk.obj.hex();
        self.root
            .join("pieces")
            .join(&hex[..2])
            .join(format!("{hex}-{}", pk.idx))
    }

    /// Whether `pk` is on disk (indexed or present as a file) or being written.
    pub fn contains(&self, pk: PieceKey) -> bool {
        if self.pending.lock().unwrap().contains_key(&pk) {
            return true;
        }
        if self.index.lock().unwrap().lru.peek(&pk).is_some() {
            return true;
        }
        self.piece_path(pk).exists()
    }

    /// Bytes held (allocated size of all indexed pieces).
    pub fn total_bytes(&self) -> u64 {
        self.index.lock().unwrap().total
    }

    /// The size limit in force, bytes: `min(max_size, held + free - min_free)`.
    pub fn limit_bytes(&self) -> u64 {
        let mut ix = self.index.lock().unwrap();
        self.refresh_limit(&mut ix, false);
        ix.limit
    }

    /// Reads piece `pk`, which must hold `len` data bytes. `None`: not cached,
    /// expired, or bad (a bad piece is removed and counted).
    pub fn read(&self, pk: PieceKey, len: u64) -> Option<Bytes> {
        if let Some(b) = self.pending.lock().unwrap().get(&pk) {
            return Some(b.clone());
        }
        let now = SystemTime::now();
        {
            let mut ix = self.index.lock().unwrap();
            if let Some(e) = ix.lru.peek(&pk) {
                if e.writing {
                    return None;
                }
                if now.duration_since(e.last_access).unwrap_or_default() > self.ttl {
                    let e = ix.lru.pop(&pk).unwrap();
                    ix.total -= e.alloc;
                    drop(ix);
                    metrics::counter!(m::CACHE_EXPIRATIONS).increment(1);
                    let _ = std::fs::remove_file(self.piece_path(pk));
                    return None;
                }
            }
        }
        let path = self.piece_path(pk);
        let started = Instant::now();
        let mut f = match File::open(&path) {
            Ok(f) => f,
            Err(e) => {
                if e.kind() != std::io::ErrorKind::NotFound {
                    self.warn_io("reading", &path, &e);
                }
                self.forget(pk);
                return None;
            }
        };
        let mut buf = Vec::with_capacity((HEADER_LEN + len) as usize);
        if let Err(e) = Read::by_ref(&mut f)
            .take(HEADER_LEN + len + 1)
            .read_to_end(&mut buf)
        {
            self.warn_io("reading", &path, &e);
            self.discard(pk, &path, "unreadable");
            return None;
        }
        if let Err(why) = check_piece(&buf, len) {
            self.discard(pk, &path, why);
            return None;
        }
        self.sample_latency(started.elapsed());
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
            None => {
                // Found by path before the scan indexed it.
                ix.insert(pk, alloc_size(buf.len() as u64), now, false);
                true
            }
        };
        drop(ix);
        if persist {
            let _ = f.set_modified(now);
        }
        let data = Bytes::from(buf).slice(HEADER_LEN as usize..);
        super::served(super::SRC_DISK, data.len() as u64, Some(started));
        Some(data)
    }

    /// Queues block `pk` (`data`) for writing, unless the write queue is full.
    /// Must be called inside a tokio runtime (the write runs on its blocking pool).
    pub fn admit(self: &Arc<Self>, pk: PieceKey, data: Bytes) {
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
            me.write(pk, &data);
            me.pending.lock().unwrap().remove(&pk);
            me.pending_bytes.fetch_sub(len, Ordering::Relaxed);
        });
    }

    /// Writes piece `pk` now (temporary file, then rename). Returns whether it
    /// is cached. Failures are warnings, never errors.
    pub fn write(&self, pk: PieceKey, data: &[u8]) -> bool {
        let alloc = alloc_size(HEADER_LEN + data.len() as u64);
        let victims = {
            let mut ix = self.index.lock().unwrap();
            if ix.lru.peek(&pk).is_some() {
                return true;
            }
            self.refresh_limit(&mut ix, false);
            let Some(victims) = self.make_room(&mut ix, alloc) else {
                metrics::counter!(m::CACHE_SKIPPED, "reason" => "full").increment(1);
                return false;
            };
            ix.insert(pk, alloc, SystemTime::now(), true);
            victims
        };
        self.remove_files(victims);
        let path = self.piece_path(pk);
        match self.write_file(&path, data) {
            Ok(()) => {
                let mut ix = self.index.lock().unwrap();
                if let Some(e) = ix.lru.peek_mut(&pk) {
                    e.writing = false;
                }
                ix.free = ix.free.saturating_sub(alloc);
                metrics::gauge!(m::CACHE_DISK_BYTES).set(ix.total as f64);
                true
            }
            Err(e) => {
                self.warn_io("writing", &path, &e);
                metrics::counter!(m::CACHE_SKIPPED, "reason" => "io_error").increment(1);
                let mut ix = self.index.lock().unwrap();
                if let Some(e) = ix.lru.pop(&pk) {
                    ix.total -= e.alloc;
                }
                // Re-read free space at the next write (ENOSPC: someone filled the disk).
                ix.limit_checked = None;
                false
            }
        }
    }

    fn write_file(&self, path: &Path, data: &[u8]) -> std::io::Result<()> {
        let tmp = self.root.join("tmp").join(format!(
            "{}-{}",
            std::process::id(),
            self.next_tmp.fetch_add(1, Ordering::Relaxed)
        ));
        let mut header = [0u8; HEADER_LEN as usize];
        header[..4].copy_from_slice(MAGIC);
        header[4..8].copy_from_slice(&crc32c::crc32c(data).to_le_bytes());
        header[8..16].copy_from_slice(&(data.len() as u64).to_le_bytes());
        let result = (|| {
            let mut f = match OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)
            {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    // The cache directory vanished: make it again.
                    std::fs::DirBuilder::new()
                        .recursive(true)
                        .mode(0o700)
                        .create(tmp.parent().unwrap())?;
                    OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o600)
                        .open(&tmp)?
                }
                Err(e) => return Err(e),
            };
            f.write_all(&header)?;
            f.write_all(data)?;
            drop(f);
            let dir = path.parent().unwrap();
            match std::fs::rename(&tmp, path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    std::fs::DirBuilder::new()
                        .recursive(true)
                        .mode(0o700)
                        .create(dir)?;
                    std::fs::rename(&tmp, path)
                }
                r => r,
            }
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }

    /// Under the lock: evicts least-recently-used pieces until `need` more bytes
    /// fit under the limit. `None`: they cannot fit without evicting a piece
    /// read within [`PROTECT`] (or `need` exceeds the whole limit).
    fn make_room(&self, ix: &mut Index, need: u64) -> Option<Vec<PieceKey>> {
        if need > ix.limit {
            return None;
        }
        let now = SystemTime::now();
        let mut victims = Vec::new();
        let mut freed = 0;
        // Check first, evict after: a refusal must not evict anything.
        for (k, e) in ix.lru.iter().rev() {
            if ix.total - freed + need <= ix.limit {
                break;
            }
            if e.writing {
                continue;
            }
            if now.duration_since(e.last_access).unwrap_or_default() < PROTECT {
                return None;
            }
            victims.push(*k);
            freed += e.alloc;
        }
        if ix.total - freed + need > ix.limit {
            return None;
        }
        for k in &victims {
            let e = ix.lru.pop(k).unwrap();
            ix.total -= e.alloc;
        }
        metrics::counter!(m::CACHE_EVICTIONS).increment(victims.len() as u64);
        Some(victims)
    }

    fn remove_files(&self, keys: Vec<PieceKey>) {
        for k in keys {
            let _ = std::fs::remove_file(self.piece_path(k));
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
        // restart scan has counted the pieces on disk `total` is not known.
        let block = alloc_size(HEADER_LEN + self.block_size);
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

    /// Removes expired pieces and shrinks to the limit (when others filled the
    /// disk). Returns the number of pieces removed.
    pub fn sweep(&self) -> usize {
        let now = SystemTime::now();
        let mut gone = Vec::new();
        let mut expired = 0u64;
        {
            let mut ix = self.index.lock().unwrap();
            self.refresh_limit(&mut ix, true);
            while let Some((k, e)) = ix.lru.peek_lru() {
                let idle = now.duration_since(e.last_access).unwrap_or_default();
                if e.writing {
                    break;
                }
                if idle > self.ttl {
                    expired += 1;
                } else if !(ix.total > ix.limit && idle >= PROTECT) {
                    break;
                }
                let k = *k;
                let e = ix.lru.pop(&k).unwrap();
                ix.total -= e.alloc;
                gone.push(k);
            }
            metrics::gauge!(m::CACHE_DISK_BYTES).set(ix.total as f64);
        }
        metrics::counter!(m::CACHE_EXPIRATIONS).increment(expired);
        metrics::counter!(m::CACHE_EVICTIONS).increment(gone.len() as u64 - expired);
        let n = gone.len();
        self.remove_files(gone);
        n
    }

    /// Rebuilds the index from the files on disk (runs once, in the background).
    fn scan(self: Arc<Self>) {
        let started = Instant::now();
        let mut found: Vec<(SystemTime, PieceKey, u64)> = Vec::new();
        let mut stale = 0usize;
        let now = SystemTime::now();
        let pieces = self.root.join("pieces");
        for d in std::fs::read_dir(&pieces).into_iter().flatten().flatten() {
            for f in std::fs::read_dir(d.path()).into_iter().flatten().flatten() {
                let Some(pk) = f.file_name().to_str().and_then(parse_piece_name) else {
                    continue;
                };
                let Ok(md) = f.metadata() else { continue };
                let mtime = md.modified().unwrap_or(UNIX_EPOCH_FALLBACK);
                if now.duration_since(mtime).unwrap_or_default() > self.ttl {
                    let _ = std::fs::remove_file(f.path());
                    stale += 1;
                    continue;
                }
                found.push((mtime, pk, alloc_size(md.len())));
            }
        }
        // Newest first, each demoted to the LRU end: the oldest ends up evicted first.
        found.sort_by_key(|f| std::cmp::Reverse(f.0));
        let n = found.len();
        let bytes: u64 = found.iter().map(|f| f.2).sum();
        {
            let mut ix = self.index.lock().unwrap();
            for (mtime, pk, alloc) in found {
                if ix.lru.peek(&pk).is_some() {
                    continue;
                }
                ix.insert(pk, alloc, mtime, false);
                ix.lru.demote(&pk);
            }
            ix.scanned = true;
            self.refresh_limit(&mut ix, true);
            metrics::gauge!(m::CACHE_DISK_BYTES).set(ix.total as f64);
        }
        metrics::counter!(m::CACHE_EXPIRATIONS).increment(stale as u64);
        info!(
            pieces = n,
            bytes,
            expired = stale,
            secs = started.elapsed().as_secs_f64(),
            dir = %self.root.display(),
            "cache index rebuilt"
        );
        let removed = self.sweep();
        if removed > 0 {
            debug!(removed, "cache shrunk to its limit after the scan");
        }
    }

    fn forget(&self, pk: PieceKey) {
        let mut ix = self.index.lock().unwrap();
        if ix.lru.peek(&pk).is_some_and(|e| !e.writing) {
            let e = ix.lru.pop(&pk).unwrap();
            ix.total -= e.alloc;
        }
    }

    fn discard(&self, pk: PieceKey, path: &Path, why: &str) {
        warn!(piece = %path.display(), "cache piece {why}: discarded, fetching the block again");
        metrics::counter!(m::CACHE_BAD_PIECES).increment(1);
        let _ = std::fs::remove_file(path);
        self.forget(pk);
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

const UNIX_EPOCH_FALLBACK: SystemTime = SystemTime::UNIX_EPOCH;

/// Allocated size of a file of `len` bytes (see [`ALLOC_UNIT`]).
fn alloc_size(len: u64) -> u64 {
    len.div_ceil(ALLOC_UNIT) * ALLOC_UNIT
}

/// Checks a whole piece file (`buf`) holding `len` data bytes.
fn check_piece(buf: &[u8], len: u64) -> Result<(), &'static str> {
    if buf.len() < HEADER_LEN as usize || &buf[..4] != MAGIC {
        return Err("has a bad header");
    }
    let crc = u32::from_le_bytes(buf[4..8].try_into().unwrap());
    let stored_len = u64::from_le_bytes(buf[8..16].try_into().unwrap());
    if stored_len != len || buf.len() as u64 != HEADER_LEN + len {
        return Err("is truncated or has the wrong length");
    }
    if crc32c::crc32c(&buf[HEADER_LEN as usize..]) != crc {
        return Err("failed its CRC32C check");
    }
    Ok(())
}

/// `<32 hex>-<idx>` to a key.
fn parse_piece_name(name: &str) -> Option<PieceKey> {
    let (hex, idx) = name.split_once('-')?;
    if hex.len() != 32 {
        return None;
    }
    let mut obj = [0u8; 16];
    for (i, b) in obj.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(PieceKey {
        obj: ObjectId(obj),
        idx: idx.parse().ok()?,
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pk(i: u64) -> PieceKey {
        PieceKey {
            obj: ObjectId::new("b", "k", "e"),
            idx: i,
        }
    }

    fn cfg(dir: &Path, max: u64) -> CacheConfig {
        CacheConfig {
            dir: Some(dir.to_path_buf()),
            max_size: Size::Bytes(max),
            min_free: Size::Bytes(0),
            ..CacheConfig::default()
        }
    }

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("lakemount-disk-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn names_round_trip() {
        let k = pk(42);
        let name = format!("{}-42", k.obj.hex());
        assert_eq!(parse_piece_name(&name), Some(k));
        assert_eq!(parse_piece_name("zz-1"), None);
        assert_eq!(parse_piece_name(&format!("{}-x", k.obj.hex())), None);
    }

    #[test]
    fn write_read_corrupt_truncate() {
        let d = tmpdir("wr");
        let c = DiskCache::open(&d, &cfg(&d, 1 << 30)).unwrap();
        let data = vec![7u8; 10_000];
        assert!(c.write(pk(0), &data));
        assert_eq!(c.read(pk(0), 10_000).unwrap(), &data[..]);
        // Wrong expected length: not served.
        assert!(c.read(pk(0), 9_999).is_none());
        assert!(c.write(pk(1), &data));
        let p = c.piece_path(pk(1));
        let mut bytes = std::fs::read(&p).unwrap();
        bytes[100] ^= 1;
        std::fs::write(&p, &bytes).unwrap();
        assert!(c.read(pk(1), 10_000).is_none(), "corrupt piece served");
        assert!(!p.exists(), "corrupt piece kept");
        assert!(c.write(pk(2), &data));
        let p = c.piece_path(pk(2));
        let f = OpenOptions::new().write(true).open(&p).unwrap();
        f.set_len(5_000).unwrap();
        assert!(c.read(pk(2), 10_000).is_none(), "truncated piece served");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn limit_is_kept_and_young_pieces_are_protected() {
        let d = tmpdir("limit");
        let c = DiskCache::open(&d, &cfg(&d, 10 * 8192)).unwrap();
        let data = vec![1u8; 5000]; // 8 KiB allocated with the header
        for i in 0..10 {
            assert!(c.write(pk(i), &data));
        }
        assert_eq!(c.total_bytes(), 10 * 8192);
        // Full of pieces read just now: the 11th is refused, nothing evicted.
        assert!(!c.write(pk(10), &data));
        assert_eq!(c.total_bytes(), 10 * 8192);
        assert!(c.read(pk(0), 5000).is_some());
        // Age every piece past PROTECT: now the least recently used go.
        {
            let mut ix = c.index.lock().unwrap();
            let old = SystemTime::now() - PROTECT * 2;
            for (_, e) in ix.lru.iter_mut() {
                e.last_access = old;
            }
        }
        assert!(c.write(pk(10), &data));
        assert_eq!(c.total_bytes(), 10 * 8192);
        assert!(c.read(pk(10), 5000).is_some());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn second_open_is_refused_and_restart_reindexes() {
        let d = tmpdir("lock");
        let c = DiskCache::open(&d, &cfg(&d, 1 << 30)).unwrap();
        for i in 0..5 {
            assert!(c.write(pk(i), &[i as u8; 3000]));
        }
        let e = DiskCache::open(&d, &cfg(&d, 1 << 30)).err().unwrap();
        assert!(e.to_string().contains("cache.dir"), "{e}");
        drop(c);
        // The scan thread holds an Arc until it finishes; wait for the lock.
        let deadline = Instant::now() + Duration::from_secs(10);
        let c = loop {
            match DiskCache::open(&d, &cfg(&d, 1 << 30)) {
                Ok(c) => break c,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => panic!("{e}"),
            }
        };
        while c.total_bytes() < 5 * 4096 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(c.total_bytes(), 5 * 4096);
        assert_eq!(c.read(pk(3), 3000).unwrap(), &[3u8; 3000][..]);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
