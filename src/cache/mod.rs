//! The data cache for epochs 2..N: fixed-size blocks of objects, kept in a
//! memory tier (the hottest blocks) and on local disk ([`disk`]), keyed by
//! bucket, key, **ETag** and block index, so a changed object can never be
//! served from old data.
//!
//! A read of `[start, end)` is split into blocks of [`CacheConfig::block_size`]
//! bytes. Blocks found in memory or on disk are served from there; each run of
//! missing blocks is one ranged GET (pinned to the ETag with `If-Match`) of
//! whole blocks, which then fills both tiers. A cache that fails (disk full,
//! I/O error, directory gone) is skipped with a warning: readers only ever see
//! S3's errors, never the cache's.

pub mod disk;
mod flight;
pub mod objfile;
pub mod packfile;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::store::{ObjectStore, Segments, StoreError, Urgency};
use crate::telemetry::metrics as m;
pub use disk::{Backing, DiskCache, lock_dir, statvfs};

/// A size given in bytes or as a percentage of the cache's file system.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(try_from = "SizeRepr")]
pub enum Size {
    /// Bytes.
    Bytes(u64),
    /// Percent (0-100) of the file system's total size.
    Percent(f64),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum SizeRepr {
    Int(u64),
    Str(String),
}

impl TryFrom<SizeRepr> for Size {
    type Error = String;
    fn try_from(r: SizeRepr) -> Result<Self, String> {
        match r {
            SizeRepr::Int(b) => Ok(Size::Bytes(b)),
            SizeRepr::Str(s) => Size::parse(&s),
        }
    }
}

impl Size {
    /// Parses `"12345"` (bytes), `"80%"`, or a number with a binary unit
    /// (`"512MiB"`, `"20GiB"`, `"1TiB"`; also `K`, `M`, `G`, `T`).
    /// Errors: a message naming what is accepted.
    pub fn parse(s: &str) -> Result<Size, String> {
        let t = s.trim();
        let bad = || {
            format!(
                "{s:?}; accepted: bytes (e.g. 10737418240), a size like \"20GiB\", \
                 or a percentage of the file system like \"80%\""
            )
        };
        if let Some(p) = t.strip_suffix('%') {
            let p: f64 = p.trim().parse().map_err(|_| bad())?;
            if !(0.0..=100.0).contains(&p) {
                return Err(format!(
                    "{s:?}: a percentage of the file system is 0% to 100%"
                ));
            }
            return Ok(Size::Percent(p));
        }
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: u64 = num.parse().map_err(|_| bad())?;
        let shift = match unit.trim() {
            "" | "B" => 0,
            "K" | "KiB" => 10,
            "M" | "MiB" => 20,
            "G" | "GiB" => 30,
            "T" | "TiB" => 40,
            _ => return Err(bad()),
        };
        n.checked_mul(1 << shift).map(Size::Bytes).ok_or_else(bad)
    }

    /// Bytes this size stands for on a file system of `fs_total` bytes.
    pub fn bytes(&self, fs_total: u64) -> u64 {
        match *self {
            Size::Bytes(b) => b,
            Size::Percent(p) => (fs_total as f64 * p / 100.0) as u64,
        }
    }
}

/// `[cache]` of the config file.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Directory of the disk cache (local NVMe). `None`: no data cache at all
    /// (neither tier). Created with mode 0700 when missing.
    pub dir: Option<PathBuf>,
    /// Most bytes the disk cache may hold (pieces' allocated size), or a
    /// percentage of the cache's file system. Default `"80%"`.
    pub max_size: Size,
    /// Free space always left on the cache's file system for others, bytes or
    /// percent; the cache shrinks when others fill the disk. Default `"5%"`.
    pub min_free: Size,
    /// A cached block not read for this long is removed, seconds. Default
    /// 259200 (3 days): longer than an epoch of any training job we know of
    /// (hours), and a job paused over a weekend still finds its data; data of
    /// jobs that ended does not stay forever.
    pub ttl_secs: u64,
    /// Block size, bytes: the unit of caching and of GETs while the cache is
    /// on. 1 MiB (what Mountpoint for S3 uses too): a random 4 KiB read costs
    /// one 1 MiB GET, a sequential stream is not slowed by per-block overhead.
    #[serde(deserialize_with = "crate::config::byte_size::deserialize")]
    pub block_size: u64,
    /// Memory tier for the hottest blocks, bytes. Default 256 MiB. 0: none.
    #[serde(deserialize_with = "crate::config::byte_size::deserialize")]
    pub memory_size: u64,
    /// Serve fully cached, unchanged files by FUSE passthrough (Linux 6.9+,
    /// root): the kernel reads the cache's local file directly, at local-disk
    /// speed. Each such file was checked by CRC32C once and is served only
    /// while nothing changed it since (see docs/CACHE.md). Default true.
    pub passthrough: bool,
    /// Files smaller than this many bytes are never served by passthrough:
    /// read through lakemount, a file that fits one FUSE read costs less
    /// than registering and dropping a backing file for each open. Their
    /// cached copies are not sealed (no `fdatasync` per object), and those
    /// that fit one block are stored many per file ([`packfile`]). 64 KiB:
    /// one FUSE read; the measurements are in docs/CACHE.md. 0: every fully
    /// cached file may be passed through, and nothing is packed.
    #[serde(deserialize_with = "crate::config::byte_size::deserialize")]
    pub passthrough_min_size: u64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            dir: None,
            max_size: Size::Percent(80.0),
            min_free: Size::Percent(5.0),
            ttl_secs: 3 * 24 * 3600,
            block_size: 1 << 20,
            memory_size: 256 << 20,
            passthrough: true,
            passthrough_min_size: 64 << 10,
        }
    }
}

/// Identity of one object version: the first 16 bytes of
/// SHA-256(bucket NUL key NUL etag).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectId(pub [u8; 16]);

impl ObjectId {
    /// The id of `key` at `etag` in `bucket`.
    pub fn new(bucket: &str, key: &str, etag: &str) -> Self {
        let mut h = Sha256::new();
        h.update(bucket.as_bytes());
        h.update([0]);
        h.update(key.as_bytes());
        h.update([0]);
        h.update(etag.as_bytes());
        let d = h.finalize();
        let mut id = [0; 16];
        id.copy_from_slice(&d[..16]);
        ObjectId(id)
    }

    /// 32 lowercase hex digits.
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// One cached block: an object version and a block index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PieceKey {
    /// The object version.
    pub obj: ObjectId,
    /// Block index (offset / block size).
    pub idx: u64,
}

/// Where the bytes of a read came from (metric label `source`).
const SRC_MEMORY: &str = "memory";
const SRC_DISK: &str = "disk";
const SRC_S3: &str = "s3";

/// The blocks one read of an object version covers, from block `first`.
struct BlockSpan<'a> {
    key: &'a str,
    etag: &'a str,
    /// Object size, bytes.
    size: u64,
    obj: ObjectId,
    first: u64,
}

impl BlockSpan<'_> {
    /// The block of slot `i`.
    fn piece(&self, i: usize) -> PieceKey {
        PieceKey {
            obj: self.obj,
            idx: self.first + i as u64,
        }
    }

    /// The slot of block `pk`.
    fn slot(&self, pk: &PieceKey) -> usize {
        (pk.idx - self.first) as usize
    }
}

/// The data cache of one mount: memory tier plus disk tier.
pub struct Cache {
    bucket: String,
    block_size: u64,
    memory: Option<moka::sync::Cache<PieceKey, Bytes>>,
    disk: Arc<DiskCache>,
    /// Blocks being fetched now: a read that needs one waits for it.
    flights: flight::Flights,
}

impl Cache {
    /// Opens (creating) the cache for `bucket` in `config.dir`. Errors: the
    /// directory cannot be created or is used by another running lakemount.
    pub fn open(bucket: &str, config: &CacheConfig) -> anyhow::Result<Option<Arc<Self>>> {
        let Some(dir) = &config.dir else {
            return Ok(None);
        };
        let disk = DiskCache::open(dir, config)?;
        let memory = (config.memory_size > 0).then(|| {
            moka::sync::Cache::builder()
                .max_capacity(config.memory_size)
                .weigher(|_: &PieceKey, v: &Bytes| v.len().try_into().unwrap_or(u32::MAX))
                .build()
        });
        Ok(Some(Arc::new(Self {
            bucket: bucket.to_string(),
            block_size: config.block_size,
            memory,
            disk,
            flights: flight::Flights::default(),
        })))
    }

    /// The disk tier.
    pub fn disk(&self) -> &Arc<DiskCache> {
        &self.disk
    }

    /// Block size, bytes.
    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// The id of `key` at `etag` in this mount's bucket.
    pub fn object_id(&self, key: &str, etag: &str) -> ObjectId {
        ObjectId::new(&self.bucket, key, etag)
    }

    /// Bytes of block `idx` of an object of `size` bytes.
    fn block_len(&self, size: u64, idx: u64) -> u64 {
        (size - idx * self.block_size).min(self.block_size)
    }

    /// Bytes of `key` at `etag` (`size` bytes) held on disk or in memory now.
    pub fn cached_bytes(&self, key: &str, etag: &str, size: u64) -> u64 {
        let obj = self.object_id(key, etag);
        let blocks = size.div_ceil(self.block_size);
        (0..blocks)
            .filter(|&idx| {
                let pk = PieceKey { obj, idx };
                self.memory.as_ref().is_some_and(|m| m.contains_key(&pk))
                    || self.disk.contains(pk, size)
            })
            .map(|idx| self.block_len(size, idx))
            .sum()
    }

    /// Whether an object of `size` bytes can be passed through at all
    /// ([`DiskCache::may_back`]); false means [`Cache::backing`] would
    /// return `None` without touching the disk.
    pub fn may_back(&self, size: u64) -> bool {
        self.disk.may_back(size)
    }

    /// The cached data file of `key` at `etag` (`size` bytes) for FUSE
    /// passthrough, when it is complete and unchanged since its bytes were
    /// checked ([`DiskCache::backing`]); pinned against eviction while the
    /// returned value lives.
    pub fn backing(self: &Arc<Self>, key: &str, etag: &str, size: u64) -> Option<Backing> {
        self.disk.backing(self.object_id(key, etag), size)
    }

    /// Takes a copy of local file `path` (`size` bytes, unchanged while
    /// this runs) as the whole object `key` at `etag`, in the disk tier
    /// ([`DiskCache::adopt_file`]): a file written on this mount is then an
    /// ordinary cached object. Blocks on local disk.
    pub fn adopt_file(self: &Arc<Self>, key: &str, etag: &str, size: u64, path: &Path) -> bool {
        self.disk.adopt_file(self.object_id(key, etag), size, path)
    }

    /// Puts the whole object `key` at `etag` (`segs`, `size` bytes) into
    /// both tiers, block by block, as a GET through [`Cache::get_range`]
    /// would have (small-object read-ahead fetched it itself). A short
    /// `segs` is not cached. `read`: a reader has these bytes now, so they
    /// count as cache misses served from S3; otherwise (written ahead of
    /// any read) its later read counts them, as cache hits.
    pub fn admit_object(
        self: &Arc<Self>,
        key: &str,
        etag: &str,
        size: u64,
        segs: &Segments,
        read: bool,
    ) {
        if segs.len() as u64 != size {
            return;
        }
        let obj = self.object_id(key, etag);
        for idx in 0..size.div_ceil(self.block_size) {
            let from = idx * self.block_size;
            let block = segs.slice(from as usize, (from + self.block_len(size, idx)) as usize);
            let pk = PieceKey { obj, idx };
            if read {
                metrics::counter!(m::CACHE_MISSES).increment(1);
                served(SRC_S3, block.len() as u64, None);
            }
            if let Some(mem) = &self.memory {
                mem.insert(pk, block.clone());
            }
            self.disk.admit(pk, size, block);
        }
    }

    /// `range` (bytes, end exclusive, within `size`) of `key` at `etag` when
    /// the cache holds it and reading it takes no wait: every block in the
    /// memory tier, or a packed small object in its pack file (one `pread`
    /// of the local disk, [`DiskCache::read_now`]), so that a read can be
    /// answered on the thread that asked. Call it from a thread that may
    /// block that long (a FUSE session thread, which does not announce it:
    /// one `pread` of a small object is shorter than waking another thread),
    /// not a runtime worker.
    /// `None`: read it with [`Cache::get_range`].
    pub fn range_now(
        &self,
        key: &str,
        etag: &str,
        size: u64,
        range: std::ops::Range<u64>,
    ) -> Option<Segments> {
        debug_assert!(range.start < range.end && range.end <= size);
        let obj = self.object_id(key, etag);
        let first = range.start / self.block_size;
        let last = (range.end - 1) / self.block_size;
        let blocks = match self.memory.as_ref().and_then(|mem| {
            (first..=last)
                .map(|idx| mem.get(&PieceKey { obj, idx }))
                .collect::<Option<Vec<Bytes>>>()
        }) {
            Some(blocks) => {
                let bytes: u64 = blocks.iter().map(|b| b.len() as u64).sum();
                metrics::counter!(m::CACHE_HITS, "tier" => SRC_MEMORY)
                    .increment(blocks.len() as u64);
                served(SRC_MEMORY, bytes, None);
                blocks
            }
            // Not copied into the memory tier: the pack file's pages are in
            // the kernel's page cache already.
            None => {
                let block = self.disk.read_now(PieceKey { obj, idx: 0 }, size)?;
                metrics::counter!(m::CACHE_HITS, "tier" => SRC_DISK).increment(1);
                vec![block]
            }
        };
        let out = self.slice_blocks(blocks, first, &range);
        (out.len() as u64 == range.end - range.start).then_some(out)
    }

    /// The bytes of `range` out of consecutive `blocks` starting at block
    /// `first`, as segments: whole blocks are shared, not copied. A block used
    /// only in part is copied, so the caller holds just the bytes it asked for
    /// (and reserved in the read-ahead budget), not the rest of an edge block.
    fn slice_blocks(
        &self,
        blocks: Vec<Bytes>,
        first: u64,
        range: &std::ops::Range<u64>,
    ) -> Segments {
        let mut out = Segments::new();
        for (i, b) in blocks.into_iter().enumerate() {
            let bstart = (first + i as u64) * self.block_size;
            let from = range.start.saturating_sub(bstart) as usize;
            let to = ((range.end - bstart) as usize).min(b.len());
            if from < to {
                out.push(if to - from == b.len() {
                    b
                } else {
                    Bytes::copy_from_slice(&b[from..to])
                });
            }
        }
        out
    }

    /// Reads `range` (bytes, end exclusive, within `size`) of `key` at `etag`
    /// through the cache; the GETs of missing blocks carry `urgency`
    /// ([`ObjectStore::get_range_ahead`]). A block another read fetches now
    /// is waited for, not fetched twice. Errors: only the store's (a
    /// failing cache falls back to the store);
    /// [`StoreError::PreconditionFailed`] when the object changed.
    pub async fn get_range<S: ObjectStore>(
        self: &Arc<Self>,
        store: &S,
        key: &str,
        etag: &str,
        size: u64,
        range: std::ops::Range<u64>,
        urgency: &Urgency,
    ) -> Result<Segments, StoreError> {
        debug_assert!(range.start < range.end && range.end <= size);
        let span = BlockSpan {
            key,
            etag,
            size,
            obj: self.object_id(key, etag),
            first: range.start / self.block_size,
        };
        let count = ((range.end - 1) / self.block_size - span.first + 1) as usize;
        let mut blocks = self.cached_blocks(&span, count).await;
        let missing: Vec<PieceKey> = (0..count)
            .filter(|&i| blocks[i].is_none())
            .map(|i| span.piece(i))
            .collect();
        let (mut fetching, claims) = self.flights.claim(&missing, urgency);
        let mut mine = vec![false; count];
        let mut waits = Vec::new();
        for (pk, claim) in missing.iter().zip(claims) {
            let i = span.slot(pk);
            match claim {
                flight::Claim::Wait(f) => waits.push((i, f)),
                // Fetched and cached by another read since the look above.
                flight::Claim::Mine
                    if let Some(b) = self.memory.as_ref().and_then(|m| m.get(pk)) =>
                {
                    fetching.done(*pk, Ok(b.clone()));
                    blocks[i] = Some(b);
                }
                flight::Claim::Mine => mine[i] = true,
            }
        }
        // On an error the blocks not handed over leave the table with
        // `fetching`: their waiters fetch them themselves.
        self.fetch_runs(store, &span, &mine, &mut fetching, &mut blocks, urgency)
            .await?;
        drop(fetching);
        for (i, f) in waits {
            blocks[i] = Some(self.wait_for(store, &span, i, f, urgency).await?);
        }
        let blocks = blocks
            .into_iter()
            .collect::<Option<Vec<Bytes>>>()
            .ok_or_else(|| StoreError::Other("cache: block missing".into()))?;
        let out = self.slice_blocks(blocks, span.first, &range);
        if out.len() as u64 != range.end - range.start {
            return Err(StoreError::Transient(format!(
                "GET {key}: got {} bytes for {}..{}",
                out.len(),
                range.start,
                range.end
            )));
        }
        Ok(out)
    }

    /// The blocks of `span` found in memory or on disk, `None` for the
    /// others; `count` slots.
    async fn cached_blocks(&self, span: &BlockSpan<'_>, count: usize) -> Vec<Option<Bytes>> {
        let mut blocks: Vec<Option<Bytes>> = vec![None; count];
        let mut on_disk = Vec::new();
        for (i, slot) in blocks.iter_mut().enumerate() {
            let pk = span.piece(i);
            if let Some(b) = self.memory.as_ref().and_then(|m| m.get(&pk)) {
                metrics::counter!(m::CACHE_HITS, "tier" => SRC_MEMORY).increment(1);
                served(SRC_MEMORY, b.len() as u64, None);
                *slot = Some(b);
            } else {
                on_disk.push((i, pk));
            }
        }
        if on_disk.is_empty() {
            return blocks;
        }
        let disk = self.disk.clone();
        let size = span.size;
        let want: Vec<(usize, PieceKey, u64)> = on_disk
            .iter()
            .map(|&(i, pk)| (i, pk, self.block_len(size, pk.idx)))
            .collect();
        let found = tokio::task::spawn_blocking(move || {
            want.into_iter()
                .map(|(i, pk, len)| (i, pk, disk.read(pk, size, len)))
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        for (i, pk, got) in found {
            if let Some(b) = got {
                metrics::counter!(m::CACHE_HITS, "tier" => SRC_DISK).increment(1);
                if let Some(mem) = &self.memory {
                    mem.insert(pk, b.clone());
                }
                blocks[i] = Some(b);
            }
        }
        blocks
    }

    /// Fetches the slots of `span` marked in `mine`: one ranged GET for
    /// each run of adjacent ones, concurrently; each block is cached and
    /// handed to the reads waiting for it as its GET ends. The first error
    /// ends the fetch (the GETs still in flight are dropped).
    async fn fetch_runs<S: ObjectStore>(
        &self,
        store: &S,
        span: &BlockSpan<'_>,
        mine: &[bool],
        fetching: &mut flight::Fetching<'_>,
        blocks: &mut [Option<Bytes>],
        urgency: &Urgency,
    ) -> Result<(), StoreError> {
        let bs = self.block_size;
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for (i, &m) in mine.iter().enumerate() {
            if m {
                match runs.last_mut() {
                    Some((_, end)) if *end == i => *end = i + 1,
                    _ => runs.push((i, i + 1)),
                }
            }
        }
        let fetches = runs.iter().map(|&(a, b)| {
            let start = span.piece(a).idx * bs;
            let end = (span.piece(b).idx * bs).min(span.size);
            async move {
                let started = Instant::now();
                let res = store
                    .get_range_ahead(span.key, start..end, span.etag, urgency.clone())
                    .await;
                if res.is_ok() {
                    let blocks = (b - a) as u64;
                    self.disk.health().sample_s3(started.elapsed(), blocks);
                }
                (a, res)
            }
        });
        // Handed over run by run as each GET ends: a read waiting for one
        // block does not wait for this read's other runs.
        let mut fetches: futures::stream::FuturesUnordered<_> = fetches.collect();
        while let Some((a, res)) = futures::StreamExt::next(&mut fetches).await {
            let data = res?;
            let mut off = 0usize;
            let mut i = a;
            while off < data.len() {
                let pk = span.piece(i);
                let len = self.block_len(span.size, pk.idx) as usize;
                let piece = data.slice(off..(off + len).min(data.len()));
                self.admit_fetched(span, pk, &piece);
                fetching.done(pk, Ok(piece.clone()));
                blocks[i] = Some(piece);
                off += len;
                i += 1;
            }
        }
        Ok(())
    }

    /// Slot `i` of `span`, which another read fetches (`flight`): its
    /// outcome, counted as a memory hit, or fetched here when that read
    /// ended without it.
    async fn wait_for<S: ObjectStore>(
        &self,
        store: &S,
        span: &BlockSpan<'_>,
        i: usize,
        flight: flight::Flight,
        urgency: &Urgency,
    ) -> Result<Bytes, StoreError> {
        if let Some(outcome) = flight::wait(flight, urgency).await {
            let piece = outcome?;
            metrics::counter!(m::CACHE_HITS, "tier" => SRC_MEMORY).increment(1);
            served(SRC_MEMORY, piece.len() as u64, None);
            return Ok(piece);
        }
        let pk = span.piece(i);
        let start = pk.idx * self.block_size;
        let end = (start + self.block_len(span.size, pk.idx)).min(span.size);
        let piece = store
            .get_range_ahead(span.key, start..end, span.etag, urgency.clone())
            .await?;
        self.admit_fetched(span, pk, &piece);
        Ok(piece)
    }

    /// Counts a block fetched from S3 and puts it in both tiers.
    fn admit_fetched(&self, span: &BlockSpan<'_>, pk: PieceKey, piece: &Bytes) {
        metrics::counter!(m::CACHE_MISSES).increment(1);
        served(SRC_S3, piece.len() as u64, None);
        if let Some(mem) = &self.memory {
            mem.insert(pk, piece.clone());
        }
        self.disk.admit(pk, span.size, piece.clone());
    }
}

/// Records `bytes` served from `source` and, for a read the cache device
/// served (`started`: when it began; `None` for memory, S3, and disk-tier
/// reads the page cache answered), its latency.
pub(crate) fn served(source: &'static str, bytes: u64, started: Option<Instant>) {
    metrics::counter!(m::CACHE_SERVED_BYTES, "source" => source).increment(bytes);
    if let Some(t) = started {
        metrics::histogram!(m::CACHE_READ_SECONDS).record(t.elapsed().as_secs_f64());
    }
}

/// `bytes` in binary units for messages ("1.50 GiB").
pub(crate) fn human(bytes: u64) -> String {
    indicatif::HumanBytes(bytes).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(Size::parse("80%").unwrap(), Size::Percent(80.0));
        assert_eq!(Size::parse("512MiB").unwrap(), Size::Bytes(512 << 20));
        assert_eq!(Size::parse("20G").unwrap(), Size::Bytes(20 << 30));
        assert_eq!(Size::parse("4096").unwrap(), Size::Bytes(4096));
        for bad in ["", "12 apples", "150%", "-1", "1.5GiB", "%"] {
            assert!(Size::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(Size::parse("180%").unwrap_err().contains("0% to 100%"));
        assert_eq!(Size::Percent(50.0).bytes(1000), 500);
    }

    #[test]
    fn object_ids_differ_by_etag_and_key() {
        let a = ObjectId::new("b", "k", "\"1\"");
        assert_ne!(a, ObjectId::new("b", "k", "\"2\""));
        assert_ne!(a, ObjectId::new("b", "k2", "\"1\""));
        assert_ne!(a, ObjectId::new("c", "k", "\"1\""));
        // The NUL separator: ("ab", "c") and ("a", "bc") are different objects.
        assert_ne!(ObjectId::new("b", "ab", "c"), ObjectId::new("b", "a", "bc"));
        assert_eq!(a.hex().len(), 32);
    }
}
