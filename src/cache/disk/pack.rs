//! Packed small objects: objects below `cache.passthrough_min_size` that fit
//! one block are appended as records to shared **pack** files under
//! `packs/` ([`packfile`] has the format) instead of
//! getting a data file and a block map each. Such objects are never passed
//! through, so they need no file of their own.
//!
//! One pack is appended to at a time (the **active** one, never evicted);
//! past [`DiskCache::pack_target`] bytes the next write starts a new one. A
//! pack is evicted whole, least recently read first, under the same
//! [`PROTECT`] rule as blocks; an object dropped alone (expired, or bad) leaves
//! its record's bytes counted until its pack goes, and a pack with nothing
//! left to serve is removed at once. Reads check each object's CRC32C.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tracing::{info, warn};

use super::index::{Entry, PACKED_IDX, Pack, Packed};
use super::*;
use crate::cache::packfile::{self, HEADER_LEN, RecHeader};

/// Until this long after the cache was opened, reads of small objects wait
/// for the restart scan to index the packs; after it, what the scan has not
/// indexed yet is a miss (fetched from S3).
const PACK_SCAN_WAIT: Duration = Duration::from_secs(5);
/// Pack files kept open for reads.
pub(super) const OPEN_PACKS: usize = 64;
/// How long the pack writer, woken by a first object, lets more gather
/// before it writes: objects arrive one per open at thousands per second in
/// a small-file epoch, and a wakeup per object cost the writer a sleep and a
/// wake each. Admitted objects are served from memory until written.
const LINGER: Duration = Duration::from_millis(5);
/// Objects queued at which the writer stops gathering and writes.
const LINGER_MAX_ITEMS: usize = 256;

/// Packed objects admitted and not yet written: (block key, object size,
/// bytes), for the one pack writer thread ([`writer`]). One thread, because
/// appends to the active pack are one at a time anyway; a blocking-pool task
/// per object cost a thread wake each, and many threads waiting on the pack.
#[derive(Default)]
pub(super) struct PackQueue {
    items: Mutex<VecDeque<(PieceKey, u64, Bytes)>>,
    ready: Condvar,
}

impl PackQueue {
    /// Queues one object for the writer; wakes it only when the queue was
    /// empty (otherwise it is writing or gathering, and drains again) or
    /// has reached [`LINGER_MAX_ITEMS`] (ends its gathering).
    pub(super) fn push(&self, pk: PieceKey, size: u64, data: Bytes) {
        let mut items = self.items.lock().unwrap();
        let was_empty = items.is_empty();
        items.push_back((pk, size, data));
        let wake = was_empty || items.len() == LINGER_MAX_ITEMS;
        drop(items);
        if wake {
            self.ready.notify_one();
        }
    }
}

/// The pack writer thread: writes what `queue` holds, in order, until the
/// cache is gone.
pub(super) fn writer(cache: Weak<DiskCache>, queue: Arc<PackQueue>) {
    loop {
        let batch: Vec<_> = {
            let mut items = queue.items.lock().unwrap();
            if items.is_empty() {
                while items.is_empty() {
                    if cache.strong_count() == 0 {
                        return;
                    }
                    items = queue
                        .ready
                        .wait_timeout(items, Duration::from_secs(1))
                        .unwrap()
                        .0;
                }
                items = queue
                    .ready
                    .wait_timeout_while(items, LINGER, |q| q.len() < LINGER_MAX_ITEMS)
                    .unwrap()
                    .0;
            }
            items.drain(..).collect()
        };
        let Some(c) = cache.upgrade() else { return };
        for (pk, size, data) in batch {
            c.write(pk, size, &data);
            c.pending.lock().unwrap().remove(&pk);
            c.pending_bytes
                .fetch_sub(data.len() as u64, Ordering::Relaxed);
        }
    }
}

/// The pack being appended to.
pub(super) struct Packer {
    /// Its sequence number and file, once the first record was written.
    pub(super) file: Option<(u64, File)>,
    /// Where the next record goes, bytes.
    pub(super) off: u64,
    /// Sequence number of the next pack.
    pub(super) next_seq: u64,
}

/// Name of pack `seq`'s file.
pub(super) fn pack_name(seq: u64) -> String {
    format!("{seq:016x}.pack")
}

/// The sequence number of a pack file's name.
pub(super) fn parse_pack_name(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(".pack")?;
    (hex.len() == 16).then(|| u64::from_str_radix(hex, 16).ok())?
}

/// Highest sequence number among the pack files in `dir`, if any.
pub(super) fn last_pack(dir: &std::path::Path) -> Option<u64> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| parse_pack_name(e.file_name().to_str()?))
        .max()
}

impl DiskCache {
    /// Whether an object of `size` bytes is packed: never passed through
    /// (below `cache.passthrough_min_size`) and one block.
    pub(super) fn packable(&self, size: u64) -> bool {
        size > 0 && size < self.seal_min_size && size <= self.block_size
    }

    fn packs_dir(&self) -> PathBuf {
        self.root.join("packs")
    }

    /// Path of pack `seq`.
    pub fn pack_path(&self, seq: u64) -> PathBuf {
        self.packs_dir().join(pack_name(seq))
    }

    /// The index, once the restart scan has indexed the packs: waited for
    /// until [`PACK_SCAN_WAIT`] after the cache was opened, not longer (one
    /// deadline for all callers, so a slow scan delays reads once, not each).
    fn scanned_index(&self) -> std::sync::MutexGuard<'_, Index> {
        let ix = self.index.lock().unwrap();
        if ix.packs_scanned {
            return ix;
        }
        let left = (self.opened_at + PACK_SCAN_WAIT).saturating_duration_since(Instant::now());
        self.packs_ready
            .wait_timeout_while(ix, left, |ix| !ix.packs_scanned)
            .unwrap()
            .0
    }

    /// Whether packed object `obj` is on disk. Before the restart scan has
    /// indexed the packs, waits for it ([`PACK_SCAN_WAIT`]).
    pub(super) fn contains_packed(&self, obj: ObjectId) -> bool {
        self.scanned_index().packed.contains_key(&obj)
    }

    /// The open pack `seq` for reading (kept among [`OPEN_PACKS`]). A pack
    /// whose file is gone is taken out of the index.
    fn pack_file(&self, seq: u64) -> Option<Arc<File>> {
        if let Some(f) = self.pack_files.lock().unwrap().get(&seq) {
            return Some(f.clone());
        }
        let path = self.pack_path(seq);
        match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(f) => {
                let f = Arc::new(f);
                let mut open = self.pack_files.lock().unwrap();
                // Removed meanwhile (remove_packs pops before it unlinks):
                // read this once, keep no descriptor of it.
                if self.index.lock().unwrap().packs.contains_key(&seq) {
                    open.put(seq, f.clone());
                }
                Some(f)
            }
            Err(e) => {
                if e.kind() == std::io::ErrorKind::NotFound {
                    self.index.lock().unwrap().drop_pack(seq);
                } else {
                    self.warn_io("reading", &path, &e);
                }
                None
            }
        }
    }

    /// Reads packed object `obj` (`len` bytes). `None`: not cached, expired
    /// or bad (a bad one is dropped and counted). Before the restart scan has
    /// indexed the packs, waits for it ([`PACK_SCAN_WAIT`]).
    pub(super) fn read_packed(&self, obj: ObjectId, len: u64) -> Option<Bytes> {
        let key = PieceKey {
            obj,
            idx: PACKED_IDX,
        };
        let now = SystemTime::now();
        let loc = {
            let mut ix = self.scanned_index();
            let loc = *ix.packed.get(&obj)?;
            if loc.len as u64 != len {
                return None;
            }
            let e = ix.lru.peek(&key)?;
            if now.duration_since(e.last_access).unwrap_or_default() > self.ttl {
                let empty = ix.drop_packed(obj);
                drop(ix);
                metrics::counter!(m::CACHE_EXPIRATIONS).increment(1);
                self.remove_packs(empty.into_iter().collect());
                return None;
            }
            loc
        };
        if self.health.bypass(super::health::ReadKind::Packed) {
            return None;
        }
        let started = Instant::now();
        let f = self.pack_file(loc.pack)?;
        let mut buf = vec![0u8; len as usize];
        let device = super::health::read_exact_at_counting(&f, &mut buf, loc.off + HEADER_LEN);
        if let Err(e) = &device {
            if e.kind() != std::io::ErrorKind::UnexpectedEof {
                self.warn_io("reading", &self.pack_path(loc.pack), e);
            }
            self.discard_packed(obj, loc, "is truncated or unreadable");
            return None;
        }
        if crc32c::crc32c(&buf) != loc.crc {
            self.discard_packed(obj, loc, "failed its CRC32C check");
            return None;
        }
        let device = matches!(device, Ok(true));
        if device {
            self.health.sample(
                super::health::ReadKind::Packed,
                started.elapsed(),
                &self.root,
            );
        }
        let persist = {
            let mut ix = self.index.lock().unwrap();
            let persist = ix
                .lru
                .get_mut(&key)
                .is_some_and(|e| e.touch(now, self.ttl / 16));
            if let Some(p) = ix.packs.get_mut(&loc.pack) {
                p.last_access = p.last_access.max(now);
            }
            persist
        };
        if persist {
            let h = RecHeader {
                obj,
                len: loc.len,
                crc: loc.crc,
                atime: unix_secs(now),
            };
            let _ = f.write_all_at(&h.encode(), loc.off);
        }
        // Latency only of reads the device served, not the page cache.
        let device = device.then_some(started);
        super::super::served(super::super::SRC_DISK, len, device);
        Some(Bytes::from(buf))
    }

    /// Drops packed object `obj` found bad at `loc` (counted, warned), unless
    /// it moved meanwhile; the next read fetches it again.
    fn discard_packed(&self, obj: ObjectId, loc: Packed, why: &str) {
        let empty = {
            let mut ix = self.index.lock().unwrap();
            if !ix
                .packed
                .get(&obj)
                .is_some_and(|p| p.pack == loc.pack && p.off == loc.off)
            {
                return;
            }
            ix.drop_packed(obj)
        };
        warn!(
            file = %self.pack_path(loc.pack).display(),
            offset = loc.off,
            "cache block {why}: discarded, fetching the block again"
        );
        metrics::counter!(m::CACHE_BAD_PIECES).increment(1);
        self.remove_packs(empty.into_iter().collect());
    }

    /// Appends object `obj` (`data`, one block) to the active pack, evicting
    /// to make room first. Returns whether it is cached. Failures are
    /// warnings, never errors.
    pub(super) fn write_packed(&self, obj: ObjectId, data: &[u8]) -> bool {
        let rec_len = HEADER_LEN + data.len() as u64;
        let mut w = self.packer.lock().unwrap();
        let (active_gone, target) = {
            let ix = self.index.lock().unwrap();
            if ix.packed.contains_key(&obj) {
                return true;
            }
            // Its file was found gone (the cache directory vanished).
            let gone = w
                .file
                .as_ref()
                .is_some_and(|(seq, _)| !ix.packs.contains_key(seq));
            // The limit may have shrunk since the open (others filled the disk).
            (gone, self.pack_target.min((ix.limit / 16).max(64 << 10)))
        };
        let full = w.off > 0 && w.off + rec_len > target;
        if (w.file.is_none() || full || active_gone)
            && let Err(e) = self.start_pack(&mut w)
        {
            self.warn_io("writing", &self.packs_dir(), &e);
            metrics::counter!(m::CACHE_SKIPPED, "reason" => "io_error").increment(1);
            return false;
        }
        let mut victims = None;
        for attempt in 0..2 {
            let Some((seq, _)) = &w.file else {
                return false;
            };
            let seq = *seq;
            let mut ix = self.index.lock().unwrap();
            self.refresh_limit(&mut ix, false);
            if let Some(v) = self.make_room(&mut ix, rec_len) {
                ix.total += rec_len;
                if let Some(p) = ix.packs.get_mut(&seq) {
                    p.bytes += rec_len;
                }
                victims = Some(v);
                break;
            }
            drop(ix);
            // Full: the active pack may be all there is, and it is never
            // evicted. Close it (it becomes evictable) and try once more.
            if attempt > 0 || w.off == 0 || self.start_pack(&mut w).is_err() {
                break;
            }
        }
        let Some(victims) = victims else {
            metrics::counter!(m::CACHE_SKIPPED, "reason" => "full").increment(1);
            return false;
        };
        let Some((seq, file)) = &w.file else {
            return false;
        };
        let seq = *seq;
        self.remove_victims(victims);
        let now = SystemTime::now();
        let h = RecHeader {
            obj,
            len: data.len() as u32,
            crc: crc32c::crc32c(data),
            atime: unix_secs(now),
        };
        let mut rec = Vec::with_capacity(rec_len as usize);
        rec.extend_from_slice(&h.encode());
        rec.extend_from_slice(data);
        let off = w.off;
        let written = file.write_all_at(&rec, off);
        let mut ix = self.index.lock().unwrap();
        let mut emptied = None;
        match written {
            // Its pack was dropped meanwhile (its file found gone, bytes and
            // all): the record is not indexed, and nothing is counted twice.
            Ok(()) if !ix.packs.contains_key(&seq) => w.off += rec_len,
            Ok(()) => {
                w.off += rec_len;
                let old = ix.packed.insert(
                    obj,
                    Packed {
                        pack: seq,
                        off,
                        len: h.len,
                        crc: h.crc,
                    },
                );
                // The restart scan indexed it meanwhile from an older pack:
                // that record no longer counts as served.
                if let Some(old) = old.filter(|o| o.pack != seq)
                    && let Some(p) = ix.packs.get_mut(&old.pack)
                {
                    p.live -= 1;
                    if p.live == 0 {
                        emptied = Some(old.pack);
                    }
                }
                ix.lru.push(
                    PieceKey {
                        obj,
                        idx: PACKED_IDX,
                    },
                    Entry {
                        alloc: 0,
                        last_access: now,
                        persisted: now,
                        writing: false,
                    },
                );
                if let Some(p) = ix.packs.get_mut(&seq) {
                    p.live += 1;
                    p.objs.push(obj);
                    p.last_access = p.last_access.max(now);
                }
                ix.free = ix.free.saturating_sub(rec_len);
            }
            Err(e) => {
                self.warn_io("writing", &self.pack_path(seq), &e);
                metrics::counter!(m::CACHE_SKIPPED, "reason" => "io_error").increment(1);
                if let Some(p) = ix.packs.get_mut(&seq) {
                    p.bytes -= rec_len;
                    ix.total -= rec_len;
                }
                // Re-read free space at the next write (ENOSPC: someone filled the disk).
                ix.limit_checked = None;
            }
        }
        metrics::gauge!(m::CACHE_DISK_BYTES).set(ix.total as f64);
        let cached =
            ix.packs.contains_key(&seq) && ix.packed.get(&obj).is_some_and(|p| p.pack == seq);
        drop(ix);
        self.remove_packs(emptied.into_iter().collect());
        cached
    }

    /// Closes the active pack (if any; it becomes evictable, or is removed
    /// when nothing in it is served) and creates the next one.
    fn start_pack(&self, w: &mut Packer) -> std::io::Result<()> {
        let dir = self.packs_dir();
        let seq = w.next_seq;
        let path = dir.join(pack_name(seq));
        let open = || {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
        };
        let file = match open() {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // The cache directory vanished: make it again.
                mkdir(&dir)?;
                open()?
            }
            r => r?,
        };
        w.next_seq += 1;
        let old = w.file.replace((seq, file)).map(|(s, _)| s);
        w.off = 0;
        let empty = {
            let mut ix = self.index.lock().unwrap();
            ix.active_pack = Some(seq);
            ix.packs.insert(
                seq,
                Pack {
                    bytes: 0,
                    live: 0,
                    objs: Vec::new(),
                    last_access: SystemTime::now(),
                },
            );
            old.filter(|s| ix.packs.get(s).is_some_and(|p| p.live == 0))
        };
        if let Some(s) = empty {
            self.index.lock().unwrap().drop_pack(s);
            self.remove_packs(vec![s]);
        }
        Ok(())
    }

    /// Removes the files of packs already taken out of the index.
    pub(super) fn remove_packs(&self, seqs: Vec<u64>) {
        if seqs.is_empty() {
            return;
        }
        let mut ix = self.index.lock().unwrap();
        for &seq in &seqs {
            if ix.packs.get(&seq).is_some_and(|p| p.live == 0) {
                ix.drop_pack(seq);
            }
        }
        drop(ix);
        let mut open = self.pack_files.lock().unwrap();
        for seq in seqs {
            open.pop(&seq);
            let path = self.pack_path(seq);
            if let Err(e) = std::fs::remove_file(&path)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                self.warn_io("removing", &path, &e);
            }
        }
    }

    /// The restart scan's part for packs: indexes every record of the packs
    /// older than this process's (`first_pack`), then lets waiting reads go.
    /// Returns the objects indexed.
    pub(super) fn scan_packs(&self) -> usize {
        let mut found = Vec::new();
        let mut packs = Vec::new();
        let mut remove = Vec::new();
        for e in std::fs::read_dir(self.packs_dir())
            .into_iter()
            .flatten()
            .flatten()
        {
            let Some(seq) = e.file_name().to_str().and_then(parse_pack_name) else {
                continue;
            };
            if seq >= self.first_pack {
                continue;
            }
            let recs = File::open(e.path()).and_then(|f| {
                let len = f.metadata()?.len();
                Ok((len, packfile::walk(&f, len)?))
            });
            match recs {
                Ok((_, recs)) if recs.is_empty() => remove.push(seq),
                Ok((len, recs)) => {
                    packs.push((seq, len));
                    found.extend(recs.into_iter().map(|r| (seq, r)));
                }
                Err(err) => self.warn_io("reading", &e.path(), &err),
            }
        }
        let n = {
            let mut ix = self.index.lock().unwrap();
            for &(seq, bytes) in &packs {
                ix.total += bytes;
                ix.packs.insert(
                    seq,
                    Pack {
                        bytes,
                        live: 0,
                        objs: Vec::new(),
                        last_access: UNIX_EPOCH,
                    },
                );
            }
            // Newest first, each demoted to the LRU end: the oldest ends up evicted first.
            found.sort_by_key(|(_, r)| std::cmp::Reverse(r.header.atime));
            let mut n = 0;
            for (seq, r) in found {
                let obj = r.header.obj;
                if ix.packed.contains_key(&obj) {
                    continue;
                }
                let at = UNIX_EPOCH + Duration::from_secs(r.header.atime as u64);
                let key = PieceKey {
                    obj,
                    idx: PACKED_IDX,
                };
                ix.packed.insert(
                    obj,
                    Packed {
                        pack: seq,
                        off: r.off,
                        len: r.header.len,
                        crc: r.header.crc,
                    },
                );
                ix.lru.push(
                    key,
                    Entry {
                        alloc: 0,
                        last_access: at,
                        persisted: at,
                        writing: false,
                    },
                );
                ix.lru.demote(&key);
                let p = ix.packs.get_mut(&seq).unwrap();
                p.live += 1;
                p.objs.push(obj);
                p.last_access = p.last_access.max(at);
                n += 1;
            }
            // Packs whose every object is indexed elsewhere serve nothing.
            for &(seq, _) in &packs {
                if ix.packs.get(&seq).is_some_and(|p| p.live == 0) {
                    ix.drop_pack(seq);
                    remove.push(seq);
                }
            }
            ix.packs_scanned = true;
            n
        };
        self.packs_ready.notify_all();
        if !remove.is_empty() {
            info!(
                packs = remove.len(),
                "cache packs with no valid record removed"
            );
        }
        self.remove_packs(remove);
        n
    }
}
