//! Upkeep of the disk cache: eviction to make room, the size limit and its
//! free-space reserve, expiry, the restart scan, discarding bad blocks, and
//! the warnings of a failing cache device.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use tracing::{debug, info, warn};

use super::index::{ALLOC_UNIT, Index, PACKED_IDX, alloc_size};
use super::*;

/// Blocks, whole objects and packs taken out of the index, whose disk space
/// [`DiskCache::remove_victims`] then frees.
pub(super) struct Victims {
    /// Blocks, each with whether its object has no block left.
    blocks: Vec<(PieceKey, bool)>,
    /// Objects removed whole.
    whole: Vec<ObjectId>,
    /// Packs removed whole.
    packs: Vec<u64>,
    /// Blocks taken in all.
    count: u64,
}

impl DiskCache {
    /// Whether evicting a block of `obj` must remove the whole object: it was
    /// handed to the kernel for passthrough (its file is never changed in
    /// place), or holes cannot be punched on the cache's file system.
    fn evicts_whole(&self, ix: &Index, obj: ObjectId) -> bool {
        !self.can_punch || ix.objects.get(&obj).is_some_and(|o| o.exported)
    }

    /// Whether some block of `obj` is being written (such an object is not
    /// removed whole now).
    fn writing_any(ix: &Index, obj: ObjectId) -> bool {
        ix.objects.get(&obj).is_some_and(|o| {
            (0..o.blocks()).any(|idx| {
                ix.lru
                    .peek(&PieceKey { obj, idx })
                    .is_some_and(|e| e.writing)
            })
        })
    }

    /// The pack of packed object `obj` (sequence number, bytes) when it may
    /// be evicted whole now: not the active one, not already `chosen`, and
    /// nothing in it read within [`PROTECT`] of `now`.
    fn pack_victim(
        ix: &Index,
        obj: ObjectId,
        chosen: &[u64],
        now: SystemTime,
    ) -> Option<(u64, u64)> {
        let seq = ix.packed.get(&obj)?.pack;
        if chosen.contains(&seq) || ix.active_pack == Some(seq) {
            return None;
        }
        let pack = ix.packs.get(&seq)?;
        (now.duration_since(pack.last_access).unwrap_or_default() >= PROTECT)
            .then_some((seq, pack.bytes))
    }

    /// Under the lock: takes least-recently-used blocks (or whole objects,
    /// see [`Self::evicts_whole`], or whole packs) out of the index until
    /// `need` more bytes fit under the limit, and returns them for
    /// [`Self::remove_victims`]. `None`: they cannot fit without evicting a
    /// block or packed object read within [`PROTECT`] (or `need` exceeds the
    /// limit); then nothing is taken.
    pub(super) fn make_room(&self, ix: &mut Index, need: u64) -> Option<Victims> {
        if need > ix.limit {
            return None;
        }
        let now = SystemTime::now();
        let mut blocks = Vec::new();
        let mut whole = Vec::new();
        let mut packs = Vec::new();
        let mut freed = 0;
        // Victims per object: taking all of an object's blocks frees its map too.
        let mut per_obj: HashMap<ObjectId, u64> = HashMap::new();
        // Check first, evict after: a refusal must not evict anything.
        for (k, e) in ix.lru.iter().rev() {
            if ix.total - freed + need <= ix.limit {
                break;
            }
            if !ix.evictable(k, e) || whole.contains(&k.obj) {
                continue;
            }
            if now.duration_since(e.last_access).unwrap_or_default() < PROTECT {
                return None;
            }
            if k.idx == PACKED_IDX {
                // An old object in a pack read lately: that pack stays.
                if let Some((seq, bytes)) = Self::pack_victim(ix, k.obj, &packs, now) {
                    freed += bytes;
                    packs.push(seq);
                }
                continue;
            }
            if self.evicts_whole(ix, k.obj) {
                if !Self::writing_any(ix, k.obj) {
                    freed += ix.object_alloc(k.obj);
                    whole.push(k.obj);
                }
                continue;
            }
            blocks.push(*k);
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
        let v = Self::take(ix, blocks, whole, packs);
        metrics::counter!(m::CACHE_EVICTIONS).increment(v.count);
        Some(v)
    }

    /// Takes `blocks`, the objects `whole` and the packs `packs` out of the index.
    fn take(
        ix: &mut Index,
        blocks: Vec<PieceKey>,
        whole: Vec<ObjectId>,
        packs: Vec<u64>,
    ) -> Victims {
        let mut count = blocks.len() as u64;
        for obj in &whole {
            count += ix.objects.get(obj).map_or(0, |o| o.present);
            ix.drop_object(*obj);
        }
        for &seq in &packs {
            count += ix.drop_pack(seq);
        }
        let blocks = blocks.into_iter().map(|k| (k, ix.drop_block(k))).collect();
        Victims {
            blocks,
            whole,
            packs,
            count,
        }
    }

    /// Takes block `pk` out of the index and frees it on disk (or its whole
    /// object, see [`Self::evicts_whole`]): for a bad or expired block.
    pub(super) fn drop_and_free(&self, pk: PieceKey) {
        let v = {
            let mut ix = self.index.lock().unwrap();
            if self.evicts_whole(&ix, pk.obj) {
                Self::take(&mut ix, Vec::new(), vec![pk.obj], Vec::new())
            } else {
                Self::take(&mut ix, vec![pk], Vec::new(), Vec::new())
            }
        };
        self.remove_victims(v);
    }

    /// Frees the disk space of what [`Self::make_room`] or [`Self::sweep`]
    /// took out of the index.
    pub(super) fn remove_victims(&self, v: Victims) {
        self.remove_packs(v.packs);
        for obj in v.whole {
            // A write may have started the object again meanwhile: keep it then.
            if !self.index.lock().unwrap().objects.contains_key(&obj) {
                self.remove_object_files(obj);
            }
        }
        let mut by_obj: HashMap<ObjectId, (Vec<u64>, bool)> = HashMap::new();
        for (k, gone) in v.blocks {
            let e = by_obj.entry(k.obj).or_default();
            e.0.push(k.idx);
            e.1 |= gone;
        }
        for (obj, (idxs, gone)) in by_obj {
            self.remove_blocks(obj, &idxs, gone);
        }
    }

    /// Frees blocks `idxs` of `obj` on disk: the whole object's files when it
    /// has no block left (`gone`), else their records and their bytes (holes),
    /// then lets writes and the seal of the object go on.
    fn remove_blocks(&self, obj: ObjectId, idxs: &[u64], gone: bool) {
        if gone {
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
        let mut ix = self.index.lock().unwrap();
        if let Some(o) = ix.objects.get_mut(&obj) {
            o.removing = o.removing.saturating_sub(idxs.len() as u64);
        }
    }

    /// Re-reads size and free space of the cache's file system (statvfs) when
    /// `force` or older than [`STATVFS_INTERVAL`], and sets the limit:
    /// `min(max_size, held + free - min_free)`.
    pub(super) fn refresh_limit(&self, ix: &mut Index, force: bool) {
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
            let mut blocks = Vec::new();
            let mut whole = Vec::new();
            let mut packs = Vec::new();
            let mut expired_packed = Vec::new();
            for (k, e) in ix.lru.iter().rev() {
                if !ix.evictable(k, e) || whole.contains(&k.obj) {
                    continue;
                }
                let idle = now.duration_since(e.last_access).unwrap_or_default();
                let expire = idle > self.ttl;
                if !(expire || (over > 0 && idle >= PROTECT)) {
                    break;
                }
                if k.idx == PACKED_IDX {
                    if expire {
                        expired_packed.push(k.obj);
                    } else if let Some((seq, bytes)) = Self::pack_victim(ix, k.obj, &packs, now) {
                        over = over.saturating_sub(bytes);
                        packs.push(seq);
                    }
                    continue;
                }
                if self.evicts_whole(ix, k.obj) {
                    if !Self::writing_any(ix, k.obj) {
                        over = over.saturating_sub(ix.object_alloc(k.obj));
                        if expire {
                            expired += ix.objects.get(&k.obj).map_or(0, |o| o.present);
                        }
                        whole.push(k.obj);
                    }
                    continue;
                }
                expired += u64::from(expire);
                over = over.saturating_sub(e.alloc);
                blocks.push(*k);
            }
            let mut v = Self::take(ix, blocks, whole, packs);
            // Expired packed objects go one by one; a pack left with nothing goes whole.
            for obj in expired_packed {
                if ix.packed.contains_key(&obj) {
                    expired += 1;
                    v.count += 1;
                    v.packs.extend(ix.drop_packed(obj));
                }
            }
            metrics::gauge!(m::CACHE_DISK_BYTES).set(ix.total as f64);
            v
        };
        let n = victims.count;
        metrics::counter!(m::CACHE_EXPIRATIONS).increment(expired.min(n));
        metrics::counter!(m::CACHE_EVICTIONS).increment(n.saturating_sub(expired));
        self.remove_victims(victims);
        n as usize
    }

    /// Rebuilds the index from the block maps on disk (runs once, in the
    /// background), removes leftovers of crashes and of older formats.
    pub(super) fn scan(self: Arc<Self>) {
        let started = Instant::now();
        // First: reads of small objects wait for it.
        let packed = self.scan_packs();
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
                } else if name.ends_with(super::adopt::MAP_NEW) {
                    // A copy in (DiskCache::adopt_file) cut off by a crash,
                    // unless one is running now.
                    let old = f
                        .metadata()
                        .and_then(|md| md.modified())
                        .is_ok_and(|t| now.duration_since(t).unwrap_or_default() > ORPHAN_AGE);
                    if old {
                        let _ = std::fs::remove_file(f.path());
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
            packed,
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
    /// its bytes freed (or its whole object, [`Self::evicts_whole`]), so the
    /// next read fetches it again. `crc` is what the read expected: when the
    /// block was replaced or evicted meanwhile (a race with eviction, not a bad
    /// block), nothing is said.
    pub(super) fn discard(&self, pk: PieceKey, crc: u32, why: &str) {
        {
            let ix = self.index.lock().unwrap();
            let same = ix
                .objects
                .get(&pk.obj)
                .and_then(|o| o.recs.get(pk.idx as usize).copied().flatten())
                .is_some_and(|r| r.crc == crc);
            if !same || ix.lru.peek(&pk).is_none_or(|e| e.writing) {
                return;
            }
        }
        warn!(
            file = %self.data_path(pk.obj).display(),
            block = pk.idx,
            "cache block {why}: discarded, fetching the block again"
        );
        metrics::counter!(m::CACHE_BAD_PIECES).increment(1);
        self.drop_and_free(pk);
    }

    pub(super) fn warn_io(&self, what: &str, path: &Path, e: &std::io::Error) {
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
}

/// (total bytes, bytes available to unprivileged users) of the file system at `p`.
pub fn statvfs(p: &Path) -> Option<(u64, u64)> {
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

/// 32 lowercase hex digits to an object id.
pub(super) fn parse_hex(hex: &str) -> Option<ObjectId> {
    if hex.len() != 32 {
        return None;
    }
    let mut obj = [0u8; 16];
    for (i, b) in obj.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(ObjectId(obj))
}
