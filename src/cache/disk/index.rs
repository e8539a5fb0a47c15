//! The in-memory index of the disk cache: one LRU entry per cached block,
//! and per object its block records, check state and seal; for packed small
//! objects ([`packfile`](super::super::packfile)) one LRU entry per object
//! and where its record is.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lru::LruCache;

use super::super::objfile::{self, MapFile, Rec, Seal};
use super::super::{ObjectId, PieceKey};

/// Allocation unit assumed for accounting: a block occupies its size rounded
/// up to 4 KiB (the block size of ext4/xfs on NVMe by default).
pub(super) const ALLOC_UNIT: u64 = 4096;

/// Block index of the LRU entry of a packed object: no block of a block
/// file ever has it, so an object cached both ways (after a change of
/// `cache.passthrough_min_size`) has two distinct entries.
pub(super) const PACKED_IDX: u64 = u64::MAX;

/// Where a packed object's record is.
#[derive(Clone, Copy, Debug)]
pub(super) struct Packed {
    /// The pack's sequence number.
    pub(super) pack: u64,
    /// Offset of the record's header in the pack, bytes.
    pub(super) off: u64,
    /// Object length, bytes.
    pub(super) len: u32,
    /// CRC32C of the object's bytes.
    pub(super) crc: u32,
}

/// What the index knows of one pack file.
pub(super) struct Pack {
    /// Its length, bytes: all of it counts against the limit (records of
    /// objects dropped one by one stay until the whole pack goes).
    pub(super) bytes: u64,
    /// Objects whose record in this pack the index still serves.
    pub(super) live: u64,
    /// Every object recorded in it (some may have moved on).
    pub(super) objs: Vec<ObjectId>,
    /// The latest last-read time of its objects.
    pub(super) last_access: SystemTime,
}

/// One cached block in the LRU index.
pub(super) struct Entry {
    /// Allocated bytes on disk (the block rounded up to [`ALLOC_UNIT`]).
    pub(super) alloc: u64,
    pub(super) last_access: SystemTime,
    /// The last read time as last written to the block map.
    pub(super) persisted: SystemTime,
    /// Still being written: readers skip it, nobody evicts it.
    pub(super) writing: bool,
}

impl Entry {
    /// Records a read at `now`. Returns whether the last read time is due to
    /// be persisted (last persisted over `persist_every` ago; then it counts
    /// as persisted from now).
    pub(super) fn touch(&mut self, now: SystemTime, persist_every: Duration) -> bool {
        self.last_access = now;
        let due = now.duration_since(self.persisted).unwrap_or_default() > persist_every;
        if due {
            self.persisted = now;
        }
        due
    }
}

/// What the index knows of one cached object version.
pub(super) struct Obj {
    /// Object size, bytes.
    pub(super) size: u64,
    /// One per block: `Some` when present on disk.
    pub(super) recs: Vec<Option<Rec>>,
    /// Blocks whose bytes this process wrote or verified by CRC32C.
    pub(super) checked: Vec<bool>,
    pub(super) present: u64,
    pub(super) checked_n: u64,
    /// The seal in the map, when there is one (see the module doc).
    pub(super) seal: Option<Seal>,
    /// Allocated bytes of the map file.
    pub(super) map_alloc: u64,
    /// Handed to the kernel as a passthrough backing file in this process.
    /// Its data file is then never changed in place (a memory mapping made
    /// by passthrough reads it even after the file is closed): evicting any
    /// of its blocks removes the whole object (unlink; mappings keep the
    /// unlinked file).
    pub(super) exported: bool,
    /// Blocks taken out of the index whose bytes are still being freed on
    /// disk: until then no block of the object is written and it is not sealed.
    pub(super) removing: u64,
}

impl Obj {
    pub(super) fn new(size: u64, blocks: u64) -> Self {
        Self {
            size,
            recs: vec![None; blocks as usize],
            checked: vec![false; blocks as usize],
            present: 0,
            checked_n: 0,
            seal: None,
            map_alloc: alloc_size(objfile::map_len(blocks)),
            exported: false,
            removing: 0,
        }
    }

    pub(super) fn blocks(&self) -> u64 {
        self.recs.len() as u64
    }

    pub(super) fn set_checked(&mut self, idx: usize) {
        if !self.checked[idx] {
            self.checked[idx] = true;
            self.checked_n += 1;
        }
    }

    /// Every block present and checked, nothing being freed, and no seal
    /// yet: time to seal.
    pub(super) fn wants_seal(&self) -> bool {
        self.seal.is_none() && self.whole_and_checked()
    }

    /// Every block present and checked, and nothing being freed.
    pub(super) fn whole_and_checked(&self) -> bool {
        self.checked_n == self.blocks() && self.present == self.blocks() && self.removing == 0
    }
}

pub(super) struct Index {
    pub(super) lru: LruCache<PieceKey, Entry>,
    pub(super) objects: HashMap<ObjectId, Obj>,
    /// Open passthrough handles per object: such objects are never evicted.
    pub(super) pins: HashMap<ObjectId, usize>,
    /// Sum of `alloc` of all blocks plus `map_alloc` of all objects, bytes.
    pub(super) total: u64,
    /// The size limit in force, bytes (see [`super::DiskCache::refresh_limit`]).
    pub(super) limit: u64,
    pub(super) limit_checked: Option<Instant>,
    /// Free bytes of the file system at the last check.
    pub(super) free: u64,
    /// Free space was at or below the `min_free` reserve at the last check
    /// and the limit left no room for one block: the cache could store
    /// nothing new (warned once per episode).
    pub(super) at_reserve: bool,
    /// The restart scan has indexed the objects already on disk.
    pub(super) scanned: bool,
    /// Packed objects.
    pub(super) packed: HashMap<ObjectId, Packed>,
    /// Pack files by sequence number.
    pub(super) packs: HashMap<u64, Pack>,
    /// The pack being appended to: never evicted.
    pub(super) active_pack: Option<u64>,
    /// The restart scan has indexed the packs already on disk (reads of
    /// small objects wait for it).
    pub(super) packs_scanned: bool,
}

impl Index {
    /// Adds `pk` as most recently used, last read at `at`, counting its bytes.
    pub(super) fn insert(&mut self, pk: PieceKey, alloc: u64, at: SystemTime, writing: bool) {
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
    pub(super) fn adopt(
        &mut self,
        obj: ObjectId,
        map: MapFile,
    ) -> Vec<(SystemTime, PieceKey, u64)> {
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
    pub(super) fn drop_block(&mut self, pk: PieceKey) -> bool {
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
        o.removing += 1;
        false
    }

    /// Bytes that removing the whole object `obj` frees: its blocks' and its
    /// map's allocation.
    pub(super) fn object_alloc(&self, obj: ObjectId) -> u64 {
        let Some(o) = self.objects.get(&obj) else {
            return 0;
        };
        let blocks: u64 = (0..o.blocks())
            .filter_map(|idx| self.lru.peek(&PieceKey { obj, idx }))
            .map(|e| e.alloc)
            .sum();
        blocks + o.map_alloc
    }

    /// Takes every block of `obj` out of the index.
    pub(super) fn drop_object(&mut self, obj: ObjectId) {
        if let Some(o) = self.objects.remove(&obj) {
            self.total -= o.map_alloc;
            for idx in 0..o.blocks() {
                if let Some(e) = self.lru.pop(&PieceKey { obj, idx }) {
                    self.total -= e.alloc;
                }
            }
        }
    }

    /// Takes packed object `obj` out of the index. Returns its pack when that
    /// has nothing left to serve and is not being appended to: the caller
    /// removes its file with [`Index::drop_pack`].
    pub(super) fn drop_packed(&mut self, obj: ObjectId) -> Option<u64> {
        let p = self.packed.remove(&obj)?;
        self.lru.pop(&PieceKey {
            obj,
            idx: PACKED_IDX,
        });
        let pack = self.packs.get_mut(&p.pack)?;
        pack.live -= 1;
        (pack.live == 0 && self.active_pack != Some(p.pack)).then_some(p.pack)
    }

    /// Takes pack `seq` and every object it serves out of the index; returns
    /// the number of objects taken. Its file is the caller's to remove.
    pub(super) fn drop_pack(&mut self, seq: u64) -> u64 {
        let Some(pack) = self.packs.remove(&seq) else {
            return 0;
        };
        self.total -= pack.bytes;
        let mut n = 0;
        for obj in pack.objs {
            if self.packed.get(&obj).is_some_and(|p| p.pack == seq) {
                self.packed.remove(&obj);
                self.lru.pop(&PieceKey {
                    obj,
                    idx: PACKED_IDX,
                });
                n += 1;
            }
        }
        n
    }

    pub(super) fn evictable(&self, k: &PieceKey, e: &Entry) -> bool {
        !e.writing && !self.pins.contains_key(&k.obj)
    }
}

/// Allocated size of a file of `len` bytes (see [`ALLOC_UNIT`]).
pub(super) fn alloc_size(len: u64) -> u64 {
    len.div_ceil(ALLOC_UNIT) * ALLOC_UNIT
}
