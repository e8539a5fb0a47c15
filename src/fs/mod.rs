//! POSIX operations over the metadata and read layers, as async functions
//! returning `Result<T, FsError>`. Knows nothing of fuser: `fuse/` adapts.

pub mod error;
mod write;

use crate::cache::{Backing, Cache};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use serde::Deserialize;

pub use error::FsError;

use crate::meta::names::{BadName, check_name};
use crate::meta::{Attr, CachedPages, DirListing, EntryKind, Meta, MetaConfig, ROOT_INO};
use crate::read::small::{Sign, SmallPrefetch, Taken};
use crate::read::{MemoryBudget, ReadConfig, Reader};
use crate::store::{ObjectStore, StoreError, WriteStore};
use crate::write::Writes;

/// Ownership, permissions and FUSE session settings (`[mount]` in the config file).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MountConfig {
    /// Owner of every file and directory. `None`: the user who mounts.
    pub uid: Option<u32>,
    /// Group of every file and directory. `None`: the group of who mounts.
    pub gid: Option<u32>,
    /// Permission bits of files (on a read-only mount write bits are shown
    /// but writes get EROFS).
    pub file_mode: u16,
    /// Permission bits of directories.
    pub dir_mode: u16,
    /// Let users other than the mounting one access the mount (`-o allow_other`).
    pub allow_other: bool,
    /// Read-only mount (the default). `false`: files and directories can be
    /// created, written, renamed and removed ([`crate::write`]).
    pub read_only: bool,
    /// Threads answering FUSE requests. One reads requests from the kernel
    /// at a time; the others are spares for while a request does slow local
    /// work: staged reads, writes and closes, passthrough opens of cached
    /// files, large read replies (`crate::fuse` module `turns`). Requests
    /// that wait on S3 go to the async runtime, so a few suffice.
    pub fuse_threads: usize,
}

impl Default for MountConfig {
    fn default() -> Self {
        Self {
            uid: None,
            gid: None,
            file_mode: 0o644,
            dir_mode: 0o755,
            allow_other: false,
            read_only: true,
            fuse_threads: 4,
        }
    }
}

/// `stat` of one inode, in the units POSIX uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    /// Inode number.
    pub ino: u64,
    /// File or directory.
    pub kind: EntryKind,
    /// Size in bytes.
    pub size: u64,
    /// 512-byte blocks: ceil(size / 512), so `du` agrees with `du --apparent-size`.
    pub blocks: u64,
    /// Modification time (UTC).
    pub mtime: SystemTime,
    /// Permission bits.
    pub perm: u16,
    /// Hard links: 1 for files, 2 for directories.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
}

/// One entry of a directory read.
#[derive(Clone, Debug)]
pub struct DirEntry {
    /// Offset to resume after this entry (telldir value).
    pub offset: u64,
    /// Name bytes.
    pub name: String,
    /// Attributes; for readdirplus the kernel holds one more lookup of `stat.ino`.
    pub stat: Stat,
}

/// Answer of `open`.
pub struct Opened {
    /// File handle.
    pub fh: u64,
    /// The kernel page cache already holds this ETag's data: keep it (FOPEN_KEEP_CACHE).
    pub keep_cache: bool,
    /// Size of the object version opened, bytes.
    pub size: u64,
    /// When asked for and the data cache holds the whole object, unchanged
    /// since it was checked: its local file, for FUSE passthrough. The object
    /// stays pinned in the cache while this value lives.
    pub backing: Option<Backing>,
    /// A staged file (written on this mount): never direct I/O, no page
    /// cache kept; read and written through lakemount unless `staged` is set.
    pub local: bool,
    /// A staged file whose opens may be served by FUSE passthrough (asked
    /// for and `write.passthrough`). Whoever serves the open that way tells
    /// [`Fs::passthrough_opened`] before the kernel may write.
    pub staged: Option<StagedBacking>,
    /// The whole object (`size` bytes), when it is small (at most
    /// `read.small_max_size` and 1 MiB), the mount is read-only, the bytes
    /// are at hand at the open (prefetched, or in the data cache) and the
    /// kernel page cache held no other version of it:
    /// whoever serves the open through lakemount may put these bytes in the
    /// page cache (FUSE_NOTIFY_STORE) and keep it, so that the reads of this
    /// open need no request.
    pub fill: Option<Bytes>,
}

/// Where an open's page-cache fill ([`Opened::fill`]) may come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fill {
    /// No fill: a mount without opens, whose read replies fill the pages.
    Never,
    /// A finished small-object prefetch only.
    Prefetched,
    /// Also the data cache (memory or disk tier): on a thread that may read
    /// the local disk briefly (a FUSE session thread).
    Any,
}

/// Asked with an inode before its object is staged anew for writing (an
/// open for writing, or a truncate, of a file not staged now): waits until
/// the inode's open files allow that, and says whether they do. When it
/// says no, the open or truncate fails with ETXTBSY ([`FsError::Busy`])
/// with nothing staged. The FUSE layer's: passthrough opens of the file's
/// earlier version (a cached object, or a staged file since uploaded)
/// would otherwise keep reading that version.
pub type StageGate<'a> =
    &'a (dyn Fn(u64) -> futures::future::BoxFuture<'static, bool> + Send + Sync);

/// A staged file's data file, for FUSE passthrough.
pub struct StagedBacking {
    /// The data file; the same `Arc` for every open of one staged file.
    pub file: Arc<std::fs::File>,
    /// Whether this open may be the first passthrough open of the file: a
    /// writer only while staging has room, since the kernel's writes are
    /// not held to `write.staging_max_size`.
    pub may_start: bool,
}

/// Which opens may be served by FUSE passthrough; both false when the
/// kernel did not agree to passthrough at init.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Passthrough {
    /// Objects whole and checked in the data cache (`cache.passthrough`).
    pub cached: bool,
    /// Staged files of a writable mount (`write.passthrough`).
    pub staged: bool,
}

struct DirHandle {
    ino: u64,
    prefix: String,
    listing: Arc<DirListing>,
}

/// An open file: its reader, and for a small object that was not
/// prefetched its key and when it was opened before: its first read asks
/// small-object read-ahead for the rest of its directory (taken by that read).
struct OpenFile<S> {
    reader: Arc<Reader<S>>,
    prefetch_dir: Option<PrefetchMiss>,
}

/// A small object read without prefetch: key, directory prefix, previous open.
type PrefetchMiss = (String, String, Option<std::time::Instant>);

/// The file system.
pub struct Fs<S> {
    store: Arc<S>,
    meta: Arc<Meta<S>>,
    read_config: ReadConfig,
    budget: MemoryBudget,
    cache: Option<Arc<Cache>>,
    /// Small-object read-ahead; `None` when off (`read.small_max_size` 0).
    small: Option<Arc<SmallPrefetch<S>>>,
    uid: u32,
    gid: u32,
    file_mode: u16,
    dir_mode: u16,
    /// Directory mtime: the mount time.
    mounted_at: SystemTime,
    files: Mutex<HashMap<u64, OpenFile<S>>>,
    /// The write path; `None` on a read-only mount.
    writes: Option<Arc<Writes<S>>>,
    /// Open handles of staged files (written on this mount).
    local_files: Mutex<HashMap<u64, write::LocalHandle>>,
    dirs: Mutex<HashMap<u64, Arc<DirHandle>>>,
    next_fh: AtomicU64,
    /// Directories (key prefixes) whose lookup just found S3 unreachable
    /// on a writable mount ([`FsError::Unlisted`]), for
    /// [`UNLISTED_MEMO`]: the create, mkdir or rename that follows does
    /// not wait out the store's retries a second time.
    unlisted: moka::sync::Cache<String, ()>,
}

/// How long [`Fs::lookup`]'s finding that S3 cannot be asked about a
/// directory holds for the operation that makes a name in it: the kernel
/// sends that right after the lookup.
const UNLISTED_MEMO: std::time::Duration = std::time::Duration::from_secs(1);

/// Extended attribute: bytes of this file's current version held by the data
/// cache (memory or disk), decimal. `lakemount warm` reads it.
pub const XATTR_CACHED: &str = "user.lakemount.cached";
/// Extended attribute: bytes the disk cache holds now, decimal.
pub const XATTR_CACHE_USED: &str = "user.lakemount.cache_used";
/// Extended attribute: the disk cache's size limit in force, bytes, decimal.
pub const XATTR_CACHE_LIMIT: &str = "user.lakemount.cache_limit";

/// `.` and `..` take offsets 1 and 2; entry `i` of a listing takes `i + 3`.
const FIRST_ENTRY_OFFSET: u64 = 3;
/// Largest object put in the page cache by lakemount itself, bytes: by an
/// open ([`Opened::fill`]), where the store is a copy made before the open
/// is answered, and by the push of a mount without opens
/// ([`Fs::on_small_fetched`]), one thread storing for the whole mount. Kept
/// to what small-object read-ahead handles by default (`read.small_max_size`,
/// which may be set up to 64 MiB); larger objects are read as usual.
const MAX_FILL: u64 = 1 << 20;

impl<S: ObjectStore + WriteStore> Fs<S> {
    /// A file system over `store` rooted at `root_prefix` (`""` or ending in `/`).
    pub fn new(
        store: Arc<S>,
        root_prefix: &str,
        mount: &MountConfig,
        meta: MetaConfig,
        read: ReadConfig,
    ) -> Self {
        // SAFETY: getuid/getgid cannot fail and touch no memory.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let budget = MemoryBudget::new(read.budget_bytes());
        Self {
            meta: Arc::new(Meta::new(store.clone(), meta, root_prefix)),
            small: SmallPrefetch::new(store.clone(), &read, budget.clone(), None),
            store,
            budget,
            read_config: read,
            cache: None,
            uid: mount.uid.unwrap_or(uid),
            gid: mount.gid.unwrap_or(gid),
            file_mode: mount.file_mode & 0o7777,
            dir_mode: mount.dir_mode & 0o7777,
            mounted_at: SystemTime::now(),
            files: Mutex::new(HashMap::new()),
            writes: None,
            local_files: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            unlisted: moka::sync::Cache::builder()
                .max_capacity(1024)
                .time_to_live(UNLISTED_MEMO)
                .build(),
        }
    }

    /// Reads go through the data cache `cache` (memory and disk tiers).
    pub fn with_cache(mut self, cache: Option<Arc<Cache>>) -> Self {
        self.small = SmallPrefetch::new(
            self.store.clone(),
            &self.read_config,
            self.budget.clone(),
            cache.clone(),
        );
        self.cache = cache;
        self
    }

    /// The data cache, when one is configured.
    pub fn cache(&self) -> Option<&Arc<Cache>> {
        self.cache.as_ref()
    }

    /// How long the kernel may cache entries and attributes.
    pub fn kernel_ttl(&self) -> Duration {
        self.meta.config().kernel_ttl()
    }

    /// How long the kernel may cache a "no such name" answer.
    pub fn negative_ttl(&self) -> Duration {
        self.meta.config().negative_ttl()
    }

    /// Lists the whole tree under the mount in concurrent key ranges and caches
    /// every directory's listing ([`Meta::prefetch_tree`]).
    pub async fn prefetch_tree(&self) -> Result<crate::meta::tree::RangeStats, FsError> {
        let root = self
            .meta
            .inodes
            .get(ROOT_INO)
            .expect("root is never forgotten");
        Ok(self.meta.prefetch_tree(&root.key).await?)
    }

    fn stat(&self, a: &Attr) -> Stat {
        match a.kind {
            EntryKind::File => Stat {
                ino: a.ino,
                kind: a.kind,
                size: a.size,
                blocks: a.size.div_ceil(512),
                mtime: a.mtime.unwrap_or(self.mounted_at),
                perm: self.file_mode,
                nlink: 1,
                uid: self.uid,
                gid: self.gid,
            },
            EntryKind::Dir => Stat {
                ino: a.ino,
                kind: a.kind,
                size: 0,
                blocks: 0,
                mtime: self.mounted_at,
                perm: self.dir_mode,
                nlink: 2,
                uid: self.uid,
                gid: self.gid,
            },
        }
    }

    fn dir_attr(&self, ino: u64) -> Result<Attr, FsError> {
        let attr = self.meta.inodes.get(ino).ok_or(FsError::NotFound)?;
        if attr.kind != EntryKind::Dir {
            return Err(FsError::NotDir);
        }
        Ok(attr)
    }

    /// Looks up `name` in directory `parent`; the kernel then holds one more
    /// lookup of the returned inode. Errors: ENOENT (also a name S3 cannot
    /// be asked about on a writable mount: [`FsError::Unlisted`]), ENOTDIR,
    /// ENAMETOOLONG (name over 255 bytes), EIO/EACCES from the store.
    pub async fn lookup(&self, parent: u64, name: &OsStr) -> Result<Stat, FsError> {
        let dir = self.dir_attr(parent)?;
        let name = std::str::from_utf8(name.as_bytes()).map_err(|_| FsError::NotFound)?;
        match check_name(name) {
            Ok(()) => {}
            Err(BadName::TooLong) => return Err(FsError::NameTooLong),
            Err(_) => return Err(FsError::NotFound),
        }
        if let Some(local) = self.lookup_local(parent, &dir, name) {
            return local;
        }
        let entry = match self.meta.find(&dir.key, name).await {
            // So that it can be created meanwhile (FsError::Unlisted).
            Err(StoreError::Transient(why)) if self.writable() => {
                self.unlisted.insert(dir.key.clone(), ());
                return Err(FsError::Unlisted(why));
            }
            found => found?.ok_or(FsError::NotFound)?,
        };
        Ok(self.stat(&self.meta.inodes.upsert(
            parent,
            &dir.key,
            &entry,
            true,
            std::time::Instant::now(),
        )))
    }

    /// Attributes of `ino`, confirmed by a listing when older than the TTL;
    /// of the open file when a write handle holds it after it left its name
    /// ([`Self::orphan_stat`]). Errors: ENOENT, the store's.
    pub async fn getattr(&self, ino: u64) -> Result<Stat, FsError> {
        if let Some(stat) = self.orphan_stat(ino) {
            return Ok(stat);
        }
        let attr = self.fresh_attr(ino).await?;
        Ok(self.stat(&attr))
    }

    async fn fresh_attr(&self, ino: u64) -> Result<Attr, FsError> {
        let mut attr = self.meta.inodes.get(ino).ok_or(FsError::NotFound)?;
        if let Some(staged) = self.staged_attr(&attr) {
            return Ok(staged);
        }
        if crate::write::is_staged_etag(&attr.etag) {
            // Handed over to S3 since they were read: the hand-over sets the
            // object's ETag under the overlay's lock, as the file leaves
            // staging.
            attr = self.meta.inodes.get(ino).ok_or(FsError::NotFound)?;
        }
        // Still a staged pseudo-ETag (an inode the hand-over did not know
        // of): only the listing tells the object's.
        if attr.kind == EntryKind::Dir
            || (self.is_fresh(&attr) && !crate::write::is_staged_etag(&attr.etag))
        {
            return Ok(attr);
        }
        let name = &attr.key[attr.parent_prefix.len()..];
        match self.meta.find(&attr.parent_prefix, name).await? {
            // A changed ETag leaves the old attributes (for the handles that
            // read the old version) and marks the inode superseded.
            Some(e) if e.kind == EntryKind::File => {
                self.meta.inodes.refresh(ino, &e).ok_or(FsError::NotFound)
            }
            _ => Err(FsError::NotFound),
        }
    }

    /// The extended attributes lakemount shows (read-only, only with a data
    /// cache): [`XATTR_CACHED`] on files, [`XATTR_CACHE_USED`] and
    /// [`XATTR_CACHE_LIMIT`] on every inode. Empty without a cache.
    pub fn xattr_names(&self, ino: u64) -> Vec<&'static str> {
        let Some(attr) = self.meta.inodes.get(ino) else {
            return Vec::new();
        };
        if self.cache.is_none() {
            return Vec::new();
        }
        let mut v = vec![XATTR_CACHE_USED, XATTR_CACHE_LIMIT];
        if attr.kind == EntryKind::File {
            v.insert(0, XATTR_CACHED);
        }
        v
    }

    /// The value of extended attribute `name` of `ino`: a decimal number of
    /// bytes. Errors: ENODATA for any other name or without a cache, ENOENT.
    pub async fn xattr(&self, ino: u64, name: &str) -> Result<String, FsError> {
        let cache = self.cache.as_ref().ok_or(FsError::NoAttr)?;
        match name {
            XATTR_CACHED => {
                let attr = self.fresh_attr(ino).await?;
                if attr.kind != EntryKind::File {
                    return Err(FsError::NoAttr);
                }
                let cache = cache.clone();
                let n = tokio::task::spawn_blocking(move || {
                    cache.cached_bytes(&attr.key, &attr.etag, attr.size)
                })
                .await
                .unwrap_or(0);
                Ok(n.to_string())
            }
            XATTR_CACHE_USED => Ok(cache.disk().total_bytes().to_string()),
            XATTR_CACHE_LIMIT => Ok(cache.disk().limit_bytes().to_string()),
            _ => Err(FsError::NoAttr),
        }
    }

    /// Forgets `n` kernel lookups of `ino`.
    pub fn forget(&self, ino: u64, n: u64) {
        self.meta.inodes.forget(ino, n);
    }

    /// Opens a file. For reading an object: pinned to the ETag current now;
    /// with `passthrough.cached`, also looks for the whole object in the data
    /// cache ([`Opened::backing`]). On a writable mount a staged file, or
    /// any file opened with `write` (O_WRONLY, O_RDWR, O_APPEND), is opened
    /// in staging (emptied with `truncate`, O_TRUNC; [`Opened::staged`] with
    /// `passthrough.staged`; an object is staged only once `gate` allows).
    /// Errors: EISDIR, ENOENT, EROFS for a write open of a read-only mount,
    /// ENOSPC, ETXTBSY.
    pub async fn open(
        &self,
        ino: u64,
        write: bool,
        truncate: bool,
        passthrough: Passthrough,
        gate: StageGate<'_>,
    ) -> Result<Opened, FsError> {
        if let Some(local) = self
            .open_local(ino, write, truncate, passthrough.staged, gate)
            .await
        {
            return local;
        }
        let passthrough = passthrough.cached;
        if write {
            return Err(FsError::ReadOnly);
        }
        let attr = self.fresh_attr(ino).await?;
        self.check_open(ino, &attr)?;
        let backing = match &self.cache {
            // A small object is never passed through: no blocking task.
            Some(cache) if passthrough && cache.may_back(attr.size) => {
                let (cache, key, etag) = (cache.clone(), attr.key.clone(), attr.etag.clone());
                tokio::task::spawn_blocking(move || cache.backing(&key, &etag, attr.size))
                    .await
                    .ok()
                    .flatten()
            }
            _ => None,
        };
        Ok(self.open_file(ino, &attr, backing, Fill::Prefetched))
    }

    /// [`Fs::open`] without waiting on the network: `None` when the
    /// attributes are older than the metadata TTL (the caller then awaits
    /// `open`, which confirms them by a listing). A passthrough open may read
    /// the cache's block map from local disk: `before_disk` is called first.
    /// Needs a tokio runtime context.
    pub fn try_open_now(
        &self,
        ino: u64,
        write: bool,
        passthrough: bool,
        before_disk: impl FnOnce(),
    ) -> Option<Result<Opened, FsError>> {
        if write {
            return if self.writable() {
                None
            } else {
                Some(Err(FsError::ReadOnly))
            };
        }
        let staged = |a: &Attr| {
            self.writes
                .as_ref()
                .is_some_and(|w| w.staged(&a.key).is_some())
        };
        // A staged pseudo-ETag on a file no longer staged: attributes read
        // before its hand-over to S3 (which sets the object's ETag under the
        // overlay's lock, as the file leaves staging); the open path reads
        // them again.
        let usable =
            |a: &Attr| !staged(a) && !crate::write::is_staged_etag(&a.etag) && self.is_fresh(a);
        let attr = match self.file_attr_now(ino, usable)? {
            Ok(a) => a,
            Err(e) => return Some(Err(e)),
        };
        if let Err(e) = self.check_open(ino, &attr) {
            return Some(Err(e));
        }
        let backing = match &self.cache {
            // A small object is never passed through: no disk to wait on,
            // so no reason to wake another session thread.
            Some(cache) if passthrough && cache.may_back(attr.size) => {
                before_disk();
                cache.backing(&attr.key, &attr.etag, attr.size)
            }
            _ => None,
        };
        Some(Ok(self.open_file(ino, &attr, backing, Fill::Any)))
    }

    /// For a mount without opens (`read.no_open`) with a data cache: `f`
    /// is called, on the GET's task, with each object small-object
    /// read-ahead fetched whole whose inode the kernel holds at that version
    /// (inode, key, ETag, size in bytes, the object's bytes), to put in the
    /// page cache; [`Fs::small_delivered`] is then told. Objects over 1 MiB
    /// are not given: they are read as usual (or, when memory runs short,
    /// from the data cache). Without a
    /// data cache an object the kernel dropped from its page cache before
    /// it was read would be fetched again, so nothing is registered: returns
    /// whether `f` was.
    pub fn on_small_fetched(
        &self,
        f: impl Fn(u64, &str, &str, u64, Bytes) + Send + Sync + 'static,
    ) -> bool {
        let (Some(small), Some(_)) = (&self.small, &self.cache) else {
            return false;
        };
        let meta = self.meta.clone();
        small.on_fetched(move |key, etag, size, bytes| {
            if size <= MAX_FILL
                && let Some(ino) = meta.inodes.file_at(key, etag, size)
            {
                f(ino, key, etag, size, bytes);
                return true;
            }
            false
        });
        true
    }

    /// A small object [`Fs::on_small_fetched`] gave is in the page cache:
    /// it is written to the data cache, and counts against the small-object
    /// budget until [`Fs::small_consumed`] (or its read) says the loader got
    /// to it. `asked`: its attributes were made stale before it was put
    /// there. Returns whether the kernel's attributes of it are to be made
    /// stale (as [`Fs::small_wants_read_signal`] was when it was counted).
    /// Needs a runtime context.
    pub fn small_delivered(&self, key: &str, etag: &str, size: u64, asked: bool) -> bool {
        self.small
            .as_ref()
            .is_some_and(|small| small.delivered(key, etag, size, asked))
    }

    /// For a mount without opens that pushes prefetched objects
    /// ([`Fs::on_small_fetched`]): `f` is called, with key, ETag and size
    /// of each object pushed, not seen read and not asked about yet, each
    /// time the loader is found to send no request per file while prefetch
    /// waits for it ([`crate::read::small::SmallPrefetch::on_silent`]).
    /// From then on [`Fs::small_wants_read_signal`] is true, until the
    /// loader sends a request of its own.
    pub fn on_small_silent(&self, f: impl Fn(Vec<(String, String, u64)>) + Send + Sync + 'static) {
        if let Some(small) = &self.small {
            small.on_silent(f);
        }
    }

    /// Whether a pushed object's attributes should be made stale in the
    /// kernel, so that the loader's stat or read to its end sends a GETATTR
    /// ([`Fs::small_consumed`]): the loader was found to send no other
    /// request per file.
    pub fn small_wants_read_signal(&self) -> bool {
        self.small.as_ref().is_some_and(|s| s.wants_read_signal())
    }

    /// How long the kernel may keep the entry and attributes of `ino` it is
    /// sent in a directory listing: [`Fs::kernel_ttl`], or no time for a
    /// pushed object a sign of the loader is asked for
    /// ([`Fs::small_wants_read_signal`]), so that a listing made meanwhile
    /// does not make stale attributes fresh again and the open sends a
    /// LOOKUP.
    pub fn attr_ttl(&self, ino: u64) -> Duration {
        if let Some(small) = self.small.as_ref().filter(|s| s.wants_read_signal())
            && let Some(key) = self.meta.inodes.with(ino, |a| a.key.clone())
            && small.awaits_sign(&key)
        {
            return Duration::ZERO;
        }
        self.kernel_ttl()
    }

    /// The inode the kernel holds for file `key` at `etag` and `size`
    /// bytes, if any.
    pub fn file_inode(&self, key: &str, etag: &str, size: u64) -> Option<u64> {
        self.meta.inodes.file_at(key, etag, size)
    }

    /// An ioctl, GETATTR or LOOKUP of `ino` (on a mount without opens, the
    /// sign of a loader at a file, `sign`: Python's `open` sends an ioctl;
    /// a file whose attributes are stale or whose entry expired a GETATTR or
    /// a LOOKUP): what [`Fs::small_delivered`] put in the page cache for it
    /// stops counting against the small-object budget, now or when its push
    /// lands.
    pub fn small_consumed(&self, ino: u64, sign: Sign) {
        if let Some(small) = &self.small
            && let Some(key) = self.meta.inodes.with(ino, |a| a.key.clone())
        {
            small.consumed(&key, sign);
        }
    }

    /// Opens a handle of `ino` for a mount without opens (`read.no_open`):
    /// read-only, no passthrough, no page-cache fill (the read's reply fills
    /// it). An inode whose object was overwritten since keeps reading its
    /// own version, pinned to its ETag, instead of failing ESTALE: with no
    /// open the kernel would not look its name up again. `None` when the
    /// attributes are older than the metadata TTL ([`Fs::open_version`]
    /// confirms them). Errors: ENOENT, EISDIR.
    pub fn open_version_now(&self, ino: u64) -> Option<Result<Opened, FsError>> {
        let superseded = || self.meta.inodes.superseded(ino);
        Some(
            self.file_attr_now(ino, |a| self.is_fresh(a) || superseded())?
                .map(|attr| self.open_file(ino, &attr, None, Fill::Never)),
        )
    }

    /// The attributes of file `ino` when `usable` accepts them as they are
    /// (no listing to wait for); `None` when it does not. Errors: ENOENT,
    /// EISDIR.
    fn file_attr_now(
        &self,
        ino: u64,
        usable: impl FnOnce(&Attr) -> bool,
    ) -> Option<Result<Attr, FsError>> {
        match self.meta.inodes.get(ino) {
            None => Some(Err(FsError::NotFound)),
            Some(a) if a.kind == EntryKind::Dir => Some(Err(FsError::IsDir)),
            Some(a) if usable(&a) => Some(Ok(a)),
            Some(_) => None,
        }
    }

    /// Whether `a` was confirmed by a listing within the metadata TTL.
    fn is_fresh(&self, a: &Attr) -> bool {
        a.validated.elapsed() < self.meta.config().ttl()
    }

    /// [`Fs::open_version_now`] after confirming stale attributes by a
    /// listing. Errors: ENOENT (gone from its listing), EISDIR, EIO.
    pub async fn open_version(&self, ino: u64) -> Result<Opened, FsError> {
        let attr = self.fresh_attr(ino).await?;
        if attr.kind == EntryKind::Dir {
            return Err(FsError::IsDir);
        }
        Ok(self.open_file(ino, &attr, None, Fill::Never))
    }

    /// Errors of an open of `ino` with fresh attributes `attr`: EISDIR, or
    /// ESTALE when the object was overwritten (the kernel then looks the
    /// name up again, which gives the new version's inode).
    fn check_open(&self, ino: u64, attr: &Attr) -> Result<(), FsError> {
        if attr.kind == EntryKind::Dir {
            return Err(FsError::IsDir);
        }
        if self.meta.inodes.superseded(ino) {
            return Err(FsError::Superseded);
        }
        Ok(())
    }

    /// Opens a file handle of `ino` at `attr`'s ETag; with `backing`, for
    /// passthrough. A small object takes what small-object read-ahead
    /// fetched of it. `fill`: where the page-cache fill ([`Opened::fill`])
    /// may come from.
    fn open_file(&self, ino: u64, attr: &Attr, backing: Option<Backing>, fill: Fill) -> Opened {
        let from = fill;
        let pages = self.meta.inodes.swap_cached_etag(ino, &attr.etag);
        // Not on a writable mount: a truncate racing with the store would
        // get the old bytes back (the store also sets the file's size).
        let may_fill = from != Fill::Never
            && backing.is_none()
            && !self.writable()
            && pages != CachedPages::Other
            && attr.size > 0
            && attr.size <= self.read_config.small_max_size.min(MAX_FILL);
        let mut reader = Reader::new(
            self.store.clone(),
            &attr.key,
            &attr.etag,
            attr.size,
            self.read_config.clone(),
            self.budget.clone(),
        )
        .with_cache(self.cache.clone());
        let mut prefetch_dir = None;
        let mut fill = None;
        if let Some(small) = self.small.as_ref().filter(|s| s.is_small(attr.size)) {
            match small.take(&attr.key, &attr.etag, attr.size) {
                Taken::Prefetched(mut part) => {
                    if may_fill {
                        fill = part.whole_for_page_cache(attr.size);
                    }
                    reader = reader.with_whole_object(part);
                }
                // Read from the data cache, filled from it below when it may.
                Taken::Cached => {}
                Taken::Missed(before) => {
                    prefetch_dir = Some((attr.key.clone(), attr.parent_prefix.clone(), before))
                }
            }
        }
        if may_fill
            && from == Fill::Any
            && fill.is_none()
            && let Some(cache) = &self.cache
        {
            fill = cache
                .range_now(&attr.key, &attr.etag, attr.size, 0..attr.size)
                .map(|segs| segs.slice(0, segs.len()));
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let file = OpenFile {
            reader: Arc::new(reader),
            prefetch_dir,
        };
        self.files.lock().unwrap().insert(fh, file);
        Opened {
            fh,
            keep_cache: pages == CachedPages::Same,
            size: attr.size,
            backing,
            local: false,
            staged: None,
            fill,
        }
    }

    /// Reads up to `size` bytes at `offset`; empty at or past end of file.
    /// Errors: EBADF, ESTALE when the object changed or vanished since open, EIO.
    pub async fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Bytes, FsError> {
        read_result(self.begin_read(fh, offset, size)?.finish().await)
    }

    /// Starts a read ([`Reader::begin_read`]): sends the GETs it needs; the
    /// bytes may be ready at once (`PendingRead::ready`, its outcome through
    /// [`read_result`]). Panics outside a tokio runtime context. Errors: EBADF.
    pub fn begin_read(
        &self,
        fh: u64,
        offset: u64,
        size: u32,
    ) -> Result<crate::read::part::PendingRead, FsError> {
        let (reader, prefetch_dir) = {
            let mut files = self.files.lock().unwrap();
            let file = files.get_mut(&fh).ok_or(FsError::BadHandle)?;
            (file.reader.clone(), file.prefetch_dir.take())
        };
        let pending = reader.begin_read(offset, size);
        if let (Some((key, prefix, before)), Some(small)) = (prefetch_dir, &self.small)
            && small.first_read(&key, &prefix, before, self.meta.config().ttl())
        {
            // This small object is read through lakemount without having
            // been prefetched: fetch its directory's others, from the
            // listing the lookup cached (never a LIST of its own).
            let (meta, small) = (self.meta.clone(), small.clone());
            tokio::spawn(async move {
                if let Some(listing) = meta.listing_if_cached(&prefix).await {
                    small.missed(&key, &prefix, listing, before).await;
                }
            });
        }
        Ok(pending)
    }

    /// The object of `ino` changed or vanished in S3 since its listing (a
    /// read's GET, pinned to the listed ETag, got 412 or 404): the inode is
    /// superseded, so its next open is ESTALE and the kernel looks the name
    /// up again, and its directory's listing is dropped, so that lookup
    /// lists afresh and finds the new version or none. Without it every
    /// open failed ESTALE until the metadata TTL. Call within a tokio
    /// runtime.
    pub fn object_changed(&self, ino: u64) {
        let Some(attr) = self.meta.inodes.get(ino) else {
            return;
        };
        if !self.meta.inodes.supersede(ino) {
            return;
        }
        tracing::debug!(key = %attr.key.escape_debug(), "changed in S3 since listed: listing again");
        let meta = self.meta.clone();
        tokio::spawn(async move {
            let name = &attr.key[attr.parent_prefix.len()..];
            meta.invalidate(&attr.parent_prefix, name).await;
        });
    }

    /// Closes a file handle. Calls `before_disk` before it writes to the
    /// local disk (the staging record of a written file, synced).
    pub fn release(&self, fh: u64, before_disk: impl FnOnce()) {
        // Dropped after the lock: dropping a reader frees its parts, which
        // session threads starting reads should not wait behind.
        let reader = self.files.lock().unwrap().remove(&fh);
        if reader.is_none() {
            self.release_local(fh, before_disk);
        }
        drop(reader);
    }

    /// Opens a directory: takes one listing snapshot that every readdir of this
    /// handle reads, so offsets stay valid across rewind and seekdir.
    pub async fn opendir(&self, ino: u64) -> Result<u64, FsError> {
        let dir = self.dir_attr(ino)?;
        let listing = self.merge_local(&dir.key, self.meta.listing(&dir.key).await?);
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.dirs.lock().unwrap().insert(
            fh,
            Arc::new(DirHandle {
                ino,
                prefix: dir.key,
                listing,
            }),
        );
        Ok(fh)
    }

    /// Entries after `offset` (0: from the start) that fit in `buf_size` bytes of
    /// a FUSE reply. With `plus`, each returned entry other than `.`/`..` counts
    /// one kernel lookup (readdirplus).
    pub fn readdir(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        buf_size: usize,
        plus: bool,
    ) -> Result<Vec<DirEntry>, FsError> {
        let handle = self
            .dirs
            .lock()
            .unwrap()
            .get(&fh)
            .cloned()
            .ok_or(FsError::BadHandle)?;
        if handle.ino != ino {
            return Err(FsError::BadHandle);
        }
        let mut out = Vec::new();
        let mut used = 0usize;
        let fits = |used: &mut usize, name: &str| {
            let size = dirent_size(name.len(), plus);
            *used += size;
            *used <= buf_size
        };
        let dir_stat = self.stat(&self.dir_attr(ino)?);
        let parent_ino = ino; // `..` is resolved by the kernel; any directory ino serves.
        for (off, name, ino) in [(1, ".", ino), (2, "..", parent_ino)] {
            if offset < off {
                if !fits(&mut used, name) {
                    return Ok(out);
                }
                let mut stat = dir_stat.clone();
                stat.ino = ino;
                out.push(DirEntry {
                    offset: off,
                    name: name.to_string(),
                    stat,
                });
            }
        }
        let start = offset.saturating_sub(FIRST_ENTRY_OFFSET - 1) as usize;
        for (i, e) in handle.listing.entries.iter().enumerate().skip(start) {
            if !fits(&mut used, &e.name) {
                break;
            }
            let stat = if plus {
                let attr =
                    self.meta
                        .inodes
                        .upsert(ino, &handle.prefix, e, true, handle.listing.fetched);
                self.note_staged_ino(&attr);
                self.stat(&attr)
            } else {
                let ino = self
                    .meta
                    .inodes
                    .child(ino, &e.name)
                    .unwrap_or_else(|| unknown_ino(&handle.prefix, &e.name));
                let mut s = self.stat(&Attr {
                    ino,
                    kind: e.kind,
                    key: String::new(),
                    parent_prefix: String::new(),
                    size: e.size,
                    etag: String::new(),
                    mtime: e.mtime,
                    validated: std::time::Instant::now(),
                });
                s.ino = ino;
                s
            };
            out.push(DirEntry {
                offset: i as u64 + FIRST_ENTRY_OFFSET,
                name: e.name.clone(),
                stat,
            });
        }
        Ok(out)
    }

    /// Closes a directory handle.
    pub fn releasedir(&self, fh: u64) {
        self.dirs.lock().unwrap().remove(&fh);
    }

    /// Number of inodes the table holds (root included).
    pub fn inode_count(&self) -> usize {
        self.meta.inodes.len()
    }

    /// The root's attributes.
    pub fn root_stat(&self) -> Stat {
        self.stat(
            &self
                .meta
                .inodes
                .get(ROOT_INO)
                .expect("root is never forgotten"),
        )
    }
}

/// Bytes one entry takes in a FUSE readdir reply: `struct fuse_dirent` (24
/// bytes) or `struct fuse_direntplus` (128 + 24 bytes) plus the name, padded to
/// 8 bytes (`FUSE_DIRENT_ALIGN` in `include/uapi/linux/fuse.h`).
pub fn dirent_size(name_len: usize, plus: bool) -> usize {
    let header = if plus { 128 + 24 } else { 24 };
    (header + name_len).next_multiple_of(8)
}

/// `d_ino` for a plain-readdir entry the kernel has not looked up: a hash with
/// the top bit set, outside the range of allocated inode numbers. `stat` of the
/// entry gives its real inode number.
fn unknown_ino(prefix: &str, name: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    prefix.hash(&mut h);
    name.hash(&mut h);
    h.finish() | (1 << 63)
}

/// A read's outcome as the file system reports it: a vanished object is ESTALE.
pub fn read_result(r: Result<Bytes, crate::store::StoreError>) -> Result<Bytes, FsError> {
    match r {
        Ok(b) => Ok(b),
        Err(crate::store::StoreError::NotFound) => Err(FsError::Stale),
        Err(e) => Err(e.into()),
    }
}
