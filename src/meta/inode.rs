//! The inode table: numbers handed to the kernel, their keys and attributes,
//! and the kernel's lookup counts (an inode is dropped when `forget` brings its
//! count to zero).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Instant, SystemTime};

use super::listing::{EntryKind, ListedEntry};
use crate::telemetry::metrics as m;

/// Inode number of the mount's root directory (FUSE_ROOT_ID in `fuse_kernel.h`).
pub const ROOT_INO: u64 = 1;

/// What the file system knows of one inode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    /// Inode number.
    pub ino: u64,
    /// File or directory.
    pub kind: EntryKind,
    /// For a file its full object key; for a directory its key prefix (`""` or
    /// ending in `/`).
    pub key: String,
    /// Prefix of the parent directory (`""` or ending in `/`); `key` is this
    /// plus the name (plus `/` for a directory).
    pub parent_prefix: String,
    /// Size in bytes (0 for directories).
    pub size: u64,
    /// ETag of the object (empty for directories).
    pub etag: String,
    /// LastModified for files; `None` for directories.
    pub mtime: Option<SystemTime>,
    /// When the attributes were last confirmed by a listing.
    pub validated: Instant,
}

#[derive(Debug)]
struct Inode {
    attr: Attr,
    /// Parent inode and name: the key of this inode in `Table::children`.
    parent: u64,
    name: String,
    nlookup: u64,
    /// The ETag the kernel page cache holds data of (set at open).
    cached_etag: Option<String>,
    /// The object was overwritten: the name now has a new inode (see
    /// [`InodeTable::upsert`]); this one lives on for its holders.
    superseded: bool,
}

#[derive(Debug)]
struct Table {
    inodes: HashMap<u64, Inode>,
    /// (parent inode, name) -> inode.
    children: HashMap<(u64, String), u64>,
    next_ino: u64,
}

/// What the kernel page cache of an inode held before an open
/// ([`InodeTable::swap_cached_etag`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CachedPages {
    /// Nothing: no open of this inode through the page cache was recorded
    /// yet (a staged file's opens are not recorded).
    Nothing,
    /// Data of the ETag being opened.
    Same,
    /// Data of another version, or the inode is gone.
    Other,
}

/// The inode table. All methods take the lock briefly and never across I/O.
#[derive(Debug)]
pub struct InodeTable {
    table: Mutex<Table>,
}

impl InodeTable {
    /// A table holding only the root directory, whose key prefix is `root_prefix`.
    pub fn new(root_prefix: &str) -> Self {
        let root = Inode {
            attr: Attr {
                ino: ROOT_INO,
                kind: EntryKind::Dir,
                key: root_prefix.to_string(),
                parent_prefix: root_prefix.to_string(),
                size: 0,
                etag: String::new(),
                mtime: None,
                validated: Instant::now(),
            },
            parent: ROOT_INO,
            name: String::new(),
            nlookup: 1,
            cached_etag: None,
            superseded: false,
        };
        Self {
            table: Mutex::new(Table {
                inodes: HashMap::from([(ROOT_INO, root)]),
                children: HashMap::new(),
                next_ino: ROOT_INO + 1,
            }),
        }
    }

    /// Attributes of `ino`, or `None` when the kernel has forgotten it.
    pub fn get(&self, ino: u64) -> Option<Attr> {
        self.with(ino, Attr::clone)
    }

    /// `f` of the attributes of `ino`, under the table's lock (so `f` must
    /// not take it): for a caller that needs a field or a comparison, not
    /// a copy of every string. `None` for an unknown inode.
    pub fn with<R>(&self, ino: u64, f: impl FnOnce(&Attr) -> R) -> Option<R> {
        self.table
            .lock()
            .unwrap()
            .inodes
            .get(&ino)
            .map(|i| f(&i.attr))
    }

    /// Records that `entry` is the child `name` of `parent` as a listing of
    /// `parent_prefix` just showed it, and returns its attributes. The same
    /// (parent, name, kind) keeps its inode number; a changed kind gets a new
    /// one, and so does a file whose ETag changed (an overwrite is a new
    /// inode, as a file replaced by rename is on a local file system: open
    /// handles of the old one keep reading their version, and FUSE passthrough,
    /// bound to one backing file per inode, stays consistent), unless the
    /// listing is older than what the inode holds (`as_of`: when the listing
    /// was taken; a directory handle reads an old snapshot): then the inode
    /// is kept as it is. `count_lookup` adds one to the kernel's lookup count (lookup and
    /// readdirplus do; plain readdir does not).
    pub fn upsert(
        &self,
        parent: u64,
        parent_prefix: &str,
        entry: &ListedEntry,
        count_lookup: bool,
        as_of: Instant,
    ) -> Attr {
        let mut t = self.table.lock().unwrap();
        let key = match entry.kind {
            EntryKind::File => format!("{parent_prefix}{}", entry.name),
            EntryKind::Dir => format!("{parent_prefix}{}/", entry.name),
        };
        let name_key = (parent, entry.name.clone());
        if let Some(&ino) = t.children.get(&name_key)
            && let Some(i) = t.inodes.get_mut(&ino)
            && i.attr.kind == entry.kind
            && !i.superseded
            && i.attr.etag != entry.etag
            && i.attr.validated > as_of
        {
            // An older listing than the inode's: keep the inode as it is.
            if count_lookup {
                i.nlookup += 1;
            }
            return i.attr.clone();
        }
        let existing = t.children.get(&name_key).copied().filter(|ino| {
            t.inodes.get(ino).is_some_and(|i| {
                i.attr.kind == entry.kind
                    && !i.superseded
                    && (entry.kind == EntryKind::Dir || i.attr.etag == entry.etag)
            })
        });
        if existing.is_none()
            && let Some(old) = t.children.get(&name_key).copied()
            && let Some(i) = t.inodes.get_mut(&old)
        {
            i.superseded = true;
        }
        let ino = match existing {
            Some(ino) => ino,
            None => {
                let ino = t.next_ino;
                t.next_ino += 1;
                t.children.insert(name_key, ino);
                ino
            }
        };
        let new = !t.inodes.contains_key(&ino);
        let attr = Attr {
            ino,
            kind: entry.kind,
            key,
            parent_prefix: parent_prefix.to_string(),
            size: entry.size,
            etag: entry.etag.clone(),
            mtime: entry.mtime,
            validated: Instant::now(),
        };
        let inode = t.inodes.entry(ino).or_insert_with(|| Inode {
            attr: attr.clone(),
            parent,
            name: entry.name.clone(),
            nlookup: 0,
            cached_etag: None,
            superseded: false,
        });
        inode.attr = attr.clone();
        if count_lookup {
            inode.nlookup += 1;
        }
        if new {
            metrics::gauge!(m::META_INODES).set(t.inodes.len() as f64);
        }
        attr
    }

    /// Whether `ino`'s object was overwritten since it was looked up (the name
    /// has, or will get at its next lookup, a new inode).
    pub fn superseded(&self, ino: u64) -> bool {
        let t = self.table.lock().unwrap();
        t.inodes.get(&ino).is_some_and(|i| i.superseded)
    }

    /// Marks `ino` superseded (its object changed or vanished in S3):
    /// the next lookup of its name gets a new inode. Returns whether it was
    /// not already.
    pub fn supersede(&self, ino: u64) -> bool {
        let mut t = self.table.lock().unwrap();
        t.inodes
            .get_mut(&ino)
            .is_some_and(|i| !std::mem::replace(&mut i.superseded, true))
    }

    /// The inode of file `key` (walked from the root, under one lock) when
    /// the table holds it, and every directory on the way, at `etag` and
    /// `size` bytes.
    pub fn file_at(&self, key: &str, etag: &str, size: u64) -> Option<u64> {
        let t = self.table.lock().unwrap();
        let root = &t.inodes.get(&ROOT_INO)?.attr.key;
        let mut ino = ROOT_INO;
        for name in key.strip_prefix(root.as_str())?.split('/') {
            ino = *t.children.get(&(ino, name.to_string()))?;
        }
        let a = &t.inodes.get(&ino)?.attr;
        (a.kind == EntryKind::File && a.etag == etag && a.size == size).then_some(ino)
    }

    /// The inode number of child `name` of `parent`, if the kernel holds one.
    pub fn child(&self, parent: u64, name: &str) -> Option<u64> {
        let t = self.table.lock().unwrap();
        t.children.get(&(parent, name.to_string())).copied()
    }

    /// Marks `ino`'s attributes as confirmed now (a listing still shows them).
    /// A file whose listing shows another ETag keeps its attributes and is
    /// marked superseded instead (the next lookup of its name gets a new
    /// inode; [`Self::superseded`] then says so). `None`: the kernel forgot `ino`.
    pub fn refresh(&self, ino: u64, entry: &ListedEntry) -> Option<Attr> {
        let mut t = self.table.lock().unwrap();
        let inode = t.inodes.get_mut(&ino)?;
        if inode.superseded || (inode.attr.kind == EntryKind::File && inode.attr.etag != entry.etag)
        {
            inode.superseded = true;
            let key = (inode.parent, inode.name.clone());
            let attr = inode.attr.clone();
            if t.children.get(&key) == Some(&ino) {
                t.children.remove(&key);
            }
            return Some(attr);
        }
        inode.attr.size = entry.size;
        inode.attr.etag = entry.etag.clone();
        inode.attr.mtime = entry.mtime;
        inode.attr.validated = Instant::now();
        Some(inode.attr.clone())
    }

    /// Sets file `ino`'s size, ETag and mtime (written on this mount: staged,
    /// or just uploaded), confirmed now. `None`: the kernel forgot `ino`.
    pub fn set_file(&self, ino: u64, size: u64, etag: &str, mtime: SystemTime) -> Option<Attr> {
        let mut t = self.table.lock().unwrap();
        let i = t.inodes.get_mut(&ino)?;
        i.attr.size = size;
        i.attr.etag = etag.to_string();
        i.attr.mtime = Some(mtime);
        i.attr.validated = Instant::now();
        i.superseded = false;
        Some(i.attr.clone())
    }

    /// Objects a rename copied to new keys: every file inode whose key is in
    /// `etags` (new key -> the copy's ETag) gets that ETag and `mtime`,
    /// confirmed now, so its reads are pinned to the copy (a copy's ETag
    /// differs from its source's when either is a multipart upload).
    pub fn set_copied(&self, etags: &std::collections::HashMap<String, String>, mtime: SystemTime) {
        if etags.is_empty() {
            return;
        }
        let mut t = self.table.lock().unwrap();
        for i in t.inodes.values_mut() {
            // Superseded inodes (the target's old file) keep their ETag.
            if i.attr.kind == EntryKind::File
                && !i.superseded
                && let Some(etag) = etags.get(&i.attr.key)
            {
                i.attr.etag = etag.clone();
                i.attr.mtime = Some(mtime);
                i.attr.validated = Instant::now();
            }
        }
    }

    /// The name `name` of `parent` is gone (unlink, rmdir): the next entry
    /// of that name gets a new inode; open handles of the old one keep it.
    pub fn unlink(&self, parent: u64, name: &str) {
        let mut t = self.table.lock().unwrap();
        if let Some(ino) = t.children.remove(&(parent, name.to_string()))
            && let Some(i) = t.inodes.get_mut(&ino)
        {
            i.superseded = true;
        }
    }

    /// Moves child `name` of `parent` to `new_name` of `new_parent`, whose
    /// prefix is `new_prefix`; a directory's descendants get their new keys
    /// too. An inode at the target name is unlinked first.
    pub fn rename(
        &self,
        parent: u64,
        name: &str,
        new_parent: u64,
        new_name: &str,
        new_prefix: &str,
    ) {
        let mut t = self.table.lock().unwrap();
        let Some(ino) = t.children.remove(&(parent, name.to_string())) else {
            return;
        };
        if let Some(old) = t.children.insert((new_parent, new_name.to_string()), ino)
            && old != ino
            && let Some(i) = t.inodes.get_mut(&old)
        {
            i.superseded = true;
        }
        let Some(i) = t.inodes.get_mut(&ino) else {
            return;
        };
        let old_key = i.attr.key.clone();
        i.parent = new_parent;
        i.name = new_name.to_string();
        i.attr.parent_prefix = new_prefix.to_string();
        i.attr.key = match i.attr.kind {
            EntryKind::File => format!("{new_prefix}{new_name}"),
            EntryKind::Dir => format!("{new_prefix}{new_name}/"),
        };
        if i.attr.kind == EntryKind::Dir {
            let new_key = i.attr.key.clone();
            for d in t.inodes.values_mut() {
                if d.attr.ino != ino && d.attr.key.starts_with(&old_key) {
                    d.attr.key = format!("{new_key}{}", &d.attr.key[old_key.len()..]);
                    d.attr.parent_prefix =
                        format!("{new_key}{}", &d.attr.parent_prefix[old_key.len()..]);
                }
            }
        }
    }

    /// Notes that the kernel page cache of `ino` now holds data of `etag`,
    /// and says what it held before (the open may keep the page cache when
    /// it held the same ETag's).
    pub fn swap_cached_etag(&self, ino: u64, etag: &str) -> CachedPages {
        let mut t = self.table.lock().unwrap();
        let Some(inode) = t.inodes.get_mut(&ino) else {
            return CachedPages::Other;
        };
        let before = match inode.cached_etag.as_deref() {
            None => CachedPages::Nothing,
            Some(e) if e == etag => CachedPages::Same,
            Some(_) => CachedPages::Other,
        };
        inode.cached_etag = Some(etag.to_string());
        before
    }

    /// The kernel forgets `n` lookups of `ino`; at zero the inode is dropped.
    pub fn forget(&self, ino: u64, n: u64) {
        if ino == ROOT_INO {
            return;
        }
        let mut t = self.table.lock().unwrap();
        let Some(inode) = t.inodes.get_mut(&ino) else {
            return;
        };
        inode.nlookup = inode.nlookup.saturating_sub(n);
        if inode.nlookup == 0 {
            let name_key = (inode.parent, std::mem::take(&mut inode.name));
            t.inodes.remove(&ino);
            if t.children.get(&name_key) == Some(&ino) {
                t.children.remove(&name_key);
            }
            metrics::gauge!(m::META_INODES).set(t.inodes.len() as f64);
        }
    }

    /// Number of inodes held (root included).
    pub fn len(&self) -> usize {
        self.table.lock().unwrap().inodes.len()
    }

    /// Always false: the root is always held.
    pub fn is_empty(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, kind: EntryKind, size: u64, etag: &str) -> ListedEntry {
        ListedEntry {
            name: name.into(),
            kind,
            size,
            etag: etag.into(),
            mtime: None,
        }
    }

    /// A file is found by its key at its own version only; names of
    /// directories and keys outside the root are not files.
    #[test]
    fn a_file_is_found_by_key_at_its_version() {
        let t = InodeTable::new("pre/");
        let now = Instant::now();
        let d = t.upsert(
            ROOT_INO,
            "pre/",
            &entry("d", EntryKind::Dir, 0, ""),
            true,
            now,
        );
        let f = t.upsert(
            d.ino,
            "pre/d/",
            &entry("f.jpg", EntryKind::File, 5, "e1"),
            true,
            now,
        );
        assert_eq!(t.file_at("pre/d/f.jpg", "e1", 5), Some(f.ino));
        assert_eq!(t.file_at("pre/d/f.jpg", "e2", 5), None);
        assert_eq!(t.file_at("pre/d/f.jpg", "e1", 6), None);
        assert_eq!(t.file_at("pre/d/g.jpg", "e1", 5), None);
        assert_eq!(t.file_at("other/d/f.jpg", "e1", 5), None);
        assert_eq!(t.file_at("pre/d", "", 0), None);
    }
}
