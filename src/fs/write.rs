//! The operations of a writable mount over [`crate::write::Writes`]:
//! create, open for writing, write, setattr (truncate, mtime), fsync,
//! mkdir, unlink, rmdir, rename; and the overlay's part in lookup, getattr
//! and readdir. Every one answers EROFS on a read-only mount.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Instant, SystemTime};

use bytes::Bytes;

use super::{Fs, FsError, Opened, StageGate, Stat};
use crate::meta::names::{BadName, check_name};
use crate::meta::{Attr, DirListing, EntryKind, ListedEntry};
use crate::store::{ObjectStore, StoreError, Urgency, WriteStore};
use crate::write::{Local, LocalChild, Staged, StagedAttr, Writes};

/// An open handle of a staged file.
pub(super) struct LocalHandle {
    /// The inode it was opened as.
    ino: u64,
    file: Arc<Staged>,
    /// Opened for writing (counts as one of the file's writers).
    write: bool,
    /// Served by FUSE passthrough: the kernel reads and writes the data
    /// file itself.
    passthrough: bool,
}

/// Bytes copied per GET when an object is staged for an in-place change.
const STAGE_CHUNK: u64 = 8 << 20;

/// The rename(2) flags lakemount understands (`include/uapi/linux/fs.h`).
const RENAME_NOREPLACE: u32 = 1;

/// What a name is, for write operations.
enum Found {
    Staged,
    Object(ListedEntry),
    Dir,
    Missing,
}

fn entry_of(name: &str, a: &StagedAttr) -> ListedEntry {
    ListedEntry {
        name: name.to_string(),
        kind: EntryKind::File,
        size: a.size,
        etag: a.etag.clone(),
        mtime: Some(a.mtime),
    }
}

fn dir_entry(name: &str) -> ListedEntry {
    ListedEntry {
        name: name.to_string(),
        kind: EntryKind::Dir,
        size: 0,
        etag: String::new(),
        mtime: None,
    }
}

/// A name a write operation may create: UTF-8, a valid path component.
/// Errors: ENAMETOOLONG, EINVAL.
fn new_name(name: &OsStr) -> Result<&str, FsError> {
    let name = std::str::from_utf8(name.as_bytes())
        .map_err(|_| FsError::Invalid("names must be UTF-8 to be S3 keys".into()))?;
    match check_name(name) {
        Ok(()) => Ok(name),
        Err(BadName::TooLong) => Err(FsError::NameTooLong),
        Err(e) => Err(FsError::Invalid(format!("{name:?}: {e:?}"))),
    }
}

/// ENAMETOOLONG for a key S3 would refuse (over
/// [`crate::store::MAX_KEY_BYTES`]): refused when the name is made, not by
/// every later upload attempt.
fn key_fits(key: &str) -> Result<(), FsError> {
    if key.len() > crate::store::MAX_KEY_BYTES {
        return Err(FsError::NameTooLong);
    }
    Ok(())
}

impl<S: ObjectStore + WriteStore> Fs<S> {
    /// Turns writes on over `writes`: uploaded files become ordinary
    /// objects (their directory listed again, their inode pointed at the
    /// new ETag).
    pub fn with_writes(mut self, writes: Option<Arc<Writes<S>>>) -> Self {
        if let Some(w) = &writes {
            let meta = self.meta.clone();
            w.on_uploaded(move |u| {
                let meta = meta.clone();
                Box::pin(async move {
                    for k in std::iter::once(&u.key).chain(&u.deleted) {
                        let (prefix, name) = split_key(k);
                        meta.invalidate(prefix, name).await;
                    }
                })
            });
            let meta = self.meta.clone();
            w.on_handed_over(move |u| {
                for &ino in &u.inos {
                    if meta.inodes.get(ino).is_some_and(|a| a.key == u.key) {
                        meta.inodes
                            .set_file(ino, u.size, &u.etag, SystemTime::now());
                    }
                }
            });
            if let Some(cache) = self.cache.clone() {
                // An uploaded file is an ordinary cached object, not fetched again.
                w.on_kept(move |u, path, keeping| {
                    let cache = cache.clone();
                    tokio::task::spawn_blocking(move || {
                        if cache.adopt_file(&u.key, &u.etag, u.size, &path) {
                            tracing::debug!(key = %u.key, "uploaded file taken into the data cache");
                        }
                        let _ = std::fs::remove_file(&path);
                        drop(keeping);
                    });
                });
            }
        }
        self.writes = writes;
        self
    }

    /// Whether the mount is writable.
    pub fn writable(&self) -> bool {
        self.writes.is_some()
    }

    fn writes(&self) -> Result<&Arc<Writes<S>>, FsError> {
        self.writes.as_ref().ok_or(FsError::ReadOnly)
    }

    /// Stat of a staged file as inode `ino`.
    pub(super) fn staged_stat(&self, ino: u64, a: &StagedAttr) -> Stat {
        Stat {
            ino,
            kind: EntryKind::File,
            size: a.size,
            blocks: a.size.div_ceil(512),
            mtime: a.mtime,
            perm: self.file_mode,
            nlink: 1,
            uid: self.uid,
            gid: self.gid,
        }
    }

    /// Gives staged file `f` (child `name` of `parent`) its inode.
    fn upsert_staged(
        &self,
        parent: u64,
        prefix: &str,
        name: &str,
        f: &Staged,
        count: bool,
    ) -> Stat {
        let a = f.attr();
        let attr =
            self.meta
                .inodes
                .upsert(parent, prefix, &entry_of(name, &a), count, Instant::now());
        f.set_ino(attr.ino);
        self.staged_stat(attr.ino, &a)
    }

    /// The overlay's answer to a lookup of `name` in `dir`: `None` to ask
    /// the listing.
    pub(super) fn lookup_local(
        &self,
        parent: u64,
        dir: &Attr,
        name: &str,
    ) -> Option<Result<Stat, FsError>> {
        let w = self.writes.as_ref()?;
        match w.find(&format!("{}{name}", dir.key))? {
            Local::File(f) => Some(Ok(self.upsert_staged(parent, &dir.key, name, &f, true))),
            Local::Dir => Some(Ok(self.stat(&self.meta.inodes.upsert(
                parent,
                &dir.key,
                &dir_entry(name),
                true,
                Instant::now(),
            )))),
            Local::Hidden => Some(Err(FsError::NotFound)),
        }
    }

    /// Records `attr`'s inode with its staged file, when it is one (a
    /// readdirplus entry), so the hand-over to S3 updates it.
    pub(super) fn note_staged_ino(&self, attr: &Attr) {
        if let Some(f) = self.writes.as_ref().and_then(|w| w.staged(&attr.key))
            && f.attr().etag == attr.etag
        {
            f.set_ino(attr.ino);
        }
    }

    /// The data file of the file staged under `ino`'s name now, if any.
    pub fn staged_data_file(&self, ino: u64) -> Option<Arc<std::fs::File>> {
        let key = self.meta.inodes.get(ino)?.key;
        Some(self.writes.as_ref()?.staged(&key)?.data_file().clone())
    }

    /// The staged file an open handle of inode `ino` holds after it left
    /// its name (unlinked, or replaced by a rename or an O_TRUNC create)
    /// without reaching S3. fstat and futimens send no handle
    /// (`fuse_getattr` in fs/fuse/dir.c, `vfs_utimes` in fs/utimes.c), and
    /// the name leads elsewhere or nowhere now. `None` on read-only mounts
    /// and for an inode still at its name (the usual case: no handle is
    /// looked at).
    fn orphan_file(&self, ino: u64) -> Option<Arc<Staged>> {
        self.writes.as_ref()?;
        if !self.meta.inodes.superseded(ino) {
            return None;
        }
        let files = self.local_files.lock().unwrap();
        let h = files
            .values()
            .find(|h| h.ino == ino && h.file.is_orphaned())?;
        Some(h.file.clone())
    }

    /// Stat of the file an open handle of `ino` holds after it left its
    /// name ([`Self::orphan_file`]).
    pub(super) fn orphan_stat(&self, ino: u64) -> Option<Stat> {
        self.open_stat(ino, &*self.orphan_file(ino)?)
    }

    /// The staged file of write handle `fh`, when it is one.
    pub fn write_handle_file(&self, fh: u64) -> Option<Arc<Staged>> {
        let files = self.local_files.lock().unwrap();
        let h = files.get(&fh)?;
        h.write.then(|| h.file.clone())
    }

    /// Stat of the staged file open as `fh`, when it is one (fstat of a
    /// file unlinked while open still answers).
    pub fn local_stat(&self, ino: u64, fh: u64) -> Option<Stat> {
        let f = self.local_files.lock().unwrap().get(&fh)?.file.clone();
        self.open_stat(ino, &f)
    }

    /// Stat of staged file `f` as inode `ino`, with what its passthrough
    /// writers did taken in. `None` on read-only mounts.
    fn open_stat(&self, ino: u64, f: &Staged) -> Option<Stat> {
        self.writes.as_ref()?.sync_passthrough(f);
        Some(self.staged_stat(ino, &f.attr()))
    }

    /// `attr` as the staged file at its key shows it now, when `attr` is
    /// that staged file's inode.
    pub(super) fn staged_attr(&self, attr: &Attr) -> Option<Attr> {
        let w = self.writes.as_ref()?;
        let f = w.staged(&attr.key)?;
        w.sync_passthrough(&f);
        let a = f.attr();
        (a.etag == attr.etag).then(|| Attr {
            size: a.size,
            mtime: Some(a.mtime),
            validated: Instant::now(),
            ..attr.clone()
        })
    }

    /// The directory listing `listing` of `prefix` with this mount's
    /// changes: staged files and new directories added, removed names left
    /// out. The same `Arc` when nothing here changed under `prefix`.
    pub(super) fn merge_local(&self, prefix: &str, listing: Arc<DirListing>) -> Arc<DirListing> {
        let Some(w) = &self.writes else {
            return listing;
        };
        let (local, hidden) = w.children(prefix);
        if local.is_empty() && hidden.is_empty() {
            return listing;
        }
        let mut entries: std::collections::BTreeMap<String, ListedEntry> = listing
            .entries
            .iter()
            .filter(|e| !hidden.contains(&e.name))
            .map(|e| (e.name.clone(), e.clone()))
            .collect();
        for (name, c) in local {
            let e = match &c {
                LocalChild::File(a) => entry_of(&name, a),
                LocalChild::Dir => dir_entry(&name),
            };
            entries.insert(name, e);
        }
        Arc::new(DirListing::like(&listing, entries.into_values().collect()))
    }

    /// What `name` in directory `dir` is now: staged, an object, a
    /// directory, or nothing.
    async fn resolve(&self, dir: &Attr, name: &str) -> Result<Found, FsError> {
        if let Some(local) = self.resolve_local(dir, name)? {
            return Ok(local);
        }
        Ok(match self.meta.find(&dir.key, name).await? {
            Some(e) if e.kind == EntryKind::Dir => Found::Dir,
            Some(e) => Found::Object(e),
            None => Found::Missing,
        })
    }

    /// What the overlay says `name` in `dir` is, if it knows: staged, a
    /// local directory, or removed here.
    fn resolve_local(&self, dir: &Attr, name: &str) -> Result<Option<Found>, FsError> {
        Ok(match self.writes()?.find(&format!("{}{name}", dir.key)) {
            Some(Local::File(_)) => Some(Found::Staged),
            Some(Local::Dir) => Some(Found::Dir),
            Some(Local::Hidden) => Some(Found::Missing),
            None => None,
        })
    }

    /// [`Self::resolve`] for a name about to be made (create, mkdir, a
    /// rename's target): `None` when S3 cannot be asked now (a server or
    /// network fault, after the retries) and no listing it gave last holds
    /// the name, so that a checkpoint need not wait for S3 to come back
    /// (docs/WRITES.md, "While S3 is unreachable").
    async fn resolve_new(&self, dir: &Attr, name: &str) -> Result<Option<Found>, FsError> {
        if self.unlisted.contains_key(&dir.key) {
            return self.resolve_local(dir, name);
        }
        match self.resolve(dir, name).await {
            Err(FsError::Store(StoreError::Transient(why))) => {
                self.unlisted.insert(dir.key.clone(), ());
                tracing::debug!(key = %format!("{}{name}", dir.key).escape_debug(), %why,
                    "made without asking S3, which cannot be asked now");
                Ok(None)
            }
            r => r.map(Some),
        }
    }

    fn new_local_handle(&self, ino: u64, file: Arc<Staged>, write: bool) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.local_files.lock().unwrap().insert(
            fh,
            LocalHandle {
                ino,
                file,
                write,
                passthrough: false,
            },
        );
        fh
    }

    /// The answer to an open of staged file `f` as handle `fh`; with
    /// `passthrough`, its data file when `write.passthrough` allows.
    fn local_opened(&self, fh: u64, f: &Staged, write: bool, passthrough: bool) -> Opened {
        let staged = match &self.writes {
            Some(w) if passthrough && w.passthrough_ok(false) => Some(super::StagedBacking {
                file: f.data_file().clone(),
                may_start: w.passthrough_ok(write),
            }),
            _ => None,
        };
        Opened {
            fh,
            keep_cache: false,
            size: f.attr().size,
            backing: None,
            local: true,
            staged,
            fill: None,
        }
    }

    /// Handle `fh` of a staged file is served by FUSE passthrough: called
    /// before the open's reply, since from then on the kernel writes the
    /// data file behind lakemount's back. A no-op for other handles.
    pub fn passthrough_opened(&self, fh: u64) {
        let Some(w) = &self.writes else { return };
        let mut files = self.local_files.lock().unwrap();
        let Some(h) = files.get_mut(&fh) else { return };
        if h.write && !h.passthrough {
            w.passthrough_writer(&h.file);
        }
        h.passthrough = true;
    }

    /// Creates and opens file `name` in `parent` (open with O_CREAT of a
    /// name the kernel believes missing, `flags` its open flags): its stat
    /// and handle. A name that exists after all (a stale negative entry) is
    /// EEXIST with O_EXCL, emptied with O_TRUNC, else opened as it is.
    /// With `passthrough`, [`Opened::staged`] as [`Fs::open`] gives it; an
    /// existing object is staged only once `gate` allows.
    /// Errors: EROFS, EEXIST, EISDIR, ENAMETOOLONG, EINVAL, ENOSPC, ETXTBSY,
    /// local disk.
    pub async fn create(
        &self,
        parent: u64,
        name: &OsStr,
        flags: i32,
        passthrough: bool,
        gate: StageGate<'_>,
    ) -> Result<(Stat, Opened), FsError> {
        let w = self.writes()?.clone();
        let dir = self.dir_attr(parent)?;
        let name = new_name(name)?;
        key_fits(&format!("{}{name}", dir.key))?;
        let Some(found) = self.resolve_new(&dir, name).await? else {
            // Unknown to this mount and S3 cannot say: an open that replaces
            // whatever is there (O_TRUNC) or says the name is new (O_EXCL)
            // is staged as the key's next version; any other would keep the
            // bytes of an object it cannot see, so it waits for S3.
            if flags & (libc::O_TRUNC | libc::O_EXCL) == 0 {
                return Err(FsError::Store(StoreError::Transient(
                    "S3 cannot be asked now, and an open that keeps a file's bytes needs it".into(),
                )));
            }
            let f = w.create(&format!("{}{name}", dir.key), true)?;
            let stat = self.upsert_staged(parent, &dir.key, name, &f, true);
            let fh = self.new_local_handle(stat.ino, f.clone(), true);
            return Ok((stat, self.local_opened(fh, &f, true, passthrough)));
        };
        if flags & libc::O_EXCL != 0 && !matches!(found, Found::Missing) {
            return Err(FsError::Exists);
        }
        let in_s3 = match found {
            Found::Dir => return Err(FsError::IsDir),
            Found::Object(_) | Found::Staged if flags & libc::O_TRUNC == 0 => {
                // It exists: open it for writing as it is.
                let stat = self.lookup(parent, OsStr::new(name)).await?;
                let o = match self
                    .open_local(stat.ino, true, false, passthrough, gate)
                    .await
                {
                    Some(r) => r?,
                    None => return Err(FsError::NotFound),
                };
                let stat = self.getattr(stat.ino).await?;
                return Ok((stat, o));
            }
            Found::Object(_) => true,
            Found::Staged | Found::Missing => false,
        };
        let f = w.create(&format!("{}{name}", dir.key), in_s3)?;
        let stat = self.upsert_staged(parent, &dir.key, name, &f, true);
        let fh = self.new_local_handle(stat.ino, f.clone(), true);
        Ok((stat, self.local_opened(fh, &f, true, passthrough)))
    }

    /// Opens `ino` on a writable mount when it is staged or `write` is
    /// asked (O_WRONLY, O_RDWR, O_TRUNC, O_APPEND): `None` for a read of an
    /// object, which the read path opens. An object opened for writing is
    /// staged whole first (emptied instead with `truncate`). With
    /// `passthrough`, [`Opened::staged`] as [`Fs::open`] gives it; an
    /// object is staged only once `gate` allows.
    /// Errors: EISDIR, ENOENT, ENOSPC, ETXTBSY, the store's.
    pub(super) async fn open_local(
        &self,
        ino: u64,
        write: bool,
        truncate: bool,
        passthrough: bool,
        gate: StageGate<'_>,
    ) -> Option<Result<Opened, FsError>> {
        let w = self.writes.as_ref()?;
        let attr = match self.meta.inodes.get(ino) {
            None => return Some(Err(FsError::NotFound)),
            Some(a) if a.kind == EntryKind::Dir => return Some(Err(FsError::IsDir)),
            Some(a) => a,
        };
        if let Some(f) = w.staged(&attr.key) {
            if !write {
                let fh = self.new_local_handle(ino, f.clone(), false);
                return Some(Ok(self.local_opened(fh, &f, false, passthrough)));
            }
            match w.open_writer(&f, truncate) {
                Some(Ok(())) => {
                    let fh = self.new_local_handle(ino, f.clone(), true);
                    return Some(Ok(self.local_opened(fh, &f, true, passthrough)));
                }
                Some(Err(e)) => return Some(Err(e.into())),
                None => {} // Uploaded meanwhile: an object now.
            }
        }
        if !write {
            return None;
        }
        Some(
            self.stage_object(ino, &attr, truncate, u64::MAX, passthrough, gate)
                .await,
        )
    }

    /// Stages object `attr` (inode `ino`) for writing: empty with
    /// `truncate`, else its first `limit` bytes (all of it when shorter:
    /// a truncate that shrinks it fetches only what it keeps) copied in by
    /// ranged GETs pinned to its ETag, before the file is shown (one copy
    /// of a name at a time); once `gate` allows (else ETXTBSY).
    async fn stage_object(
        &self,
        ino: u64,
        attr: &Attr,
        truncate: bool,
        limit: u64,
        passthrough: bool,
        gate: StageGate<'_>,
    ) -> Result<Opened, FsError> {
        let w = self.writes()?;
        if !gate(ino).await {
            return Err(FsError::Busy);
        }
        // A copy is one at a time per name; an empty file needs no wait
        // behind another open's copy (its publish then opens this file).
        let _one = if truncate {
            None
        } else {
            Some(w.stage_lock(&attr.key).await)
        };
        let f = match w
            .staged(&attr.key)
            .and_then(|f| w.open_writer(&f, truncate).map(|r| (f, r)))
        {
            // Staged by another open (or a rename) while this one waited:
            // replacing that file would drop its writer's bytes.
            Some((f, r)) => {
                r?;
                f
            }
            None if truncate => w.create(&attr.key, true)?,
            None => {
                let attr = self.fresh_attr(ino).await?;
                let f = w.create_unpublished(&attr.key)?;
                let len = attr.size.min(limit);
                if let Err(e) = self.copy_in(w, &f, &attr, len).await {
                    w.discard(&f);
                    return Err(e);
                }
                w.publish(f, (len == attr.size).then_some(attr.etag.as_str()))?
            }
        };
        let a = f.attr();
        self.meta.inodes.set_file(ino, a.size, &a.etag, a.mtime);
        f.set_ino(ino);
        let fh = self.new_local_handle(ino, f.clone(), true);
        Ok(self.local_opened(fh, &f, true, passthrough))
    }

    /// Copies the first `len` bytes of object `attr` into staged file `f`
    /// (ranged GETs of [`STAGE_CHUNK`] through the data cache, pinned to
    /// its ETag).
    async fn copy_in(
        &self,
        w: &Arc<Writes<S>>,
        f: &Arc<Staged>,
        attr: &Attr,
        len: u64,
    ) -> Result<(), FsError> {
        let mut off = 0;
        while off < len {
            let end = (off + STAGE_CHUNK).min(len);
            let got = match &self.cache {
                Some(c) => c
                    .get_range(
                        &*self.store,
                        &attr.key,
                        &attr.etag,
                        attr.size,
                        off..end,
                        &Urgency::now(),
                    )
                    .await
                    .map(|segs| segs.slice(0, segs.len())),
                None => self.store.get_range(&attr.key, off..end, &attr.etag).await,
            };
            let b = got.map_err(|e| match e {
                StoreError::NotFound => FsError::Stale,
                e => e.into(),
            })?;
            w.write(f, off, &b)?;
            off = end;
        }
        Ok(())
    }

    /// Reads of a staged file's handle: `None` when `fh` is not one. Calls
    /// `before_disk` before it reads the local disk. Errors: local disk.
    pub fn read_local(
        &self,
        fh: u64,
        offset: u64,
        size: u32,
        before_disk: impl FnOnce(),
    ) -> Option<Result<Bytes, FsError>> {
        self.writes.as_ref()?;
        let f = self.local_files.lock().unwrap().get(&fh)?.file.clone();
        before_disk();
        Some(
            f.read(offset, size)
                .map_err(|e| FsError::Local(e.raw_os_error().unwrap_or(libc::EIO), e.to_string())),
        )
    }

    /// Writes `data` at `offset` through handle `fh`: the bytes written.
    /// Errors: EBADF (not open for writing), ENOSPC, local disk.
    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> Result<u32, FsError> {
        let w = self.writes()?;
        let f = match self.local_files.lock().unwrap().get(&fh) {
            Some(h) if h.write => h.file.clone(),
            _ => return Err(FsError::BadHandle),
        };
        w.write(&f, offset, data)?;
        Ok(data.len() as u32)
    }

    /// Closes a staged file's handle: `false` when `fh` is not one. The
    /// last writer's close queues the upload; `before_disk` is called
    /// before a writer's close writes its staging record.
    pub(super) fn release_local(&self, fh: u64, before_disk: impl FnOnce()) -> bool {
        let Some(h) = self.local_files.lock().unwrap().remove(&fh) else {
            return false;
        };
        if h.write
            && let Some(w) = &self.writes
        {
            before_disk();
            if h.passthrough {
                w.close_passthrough_writer(&h.file);
            } else {
                w.close_writer(&h.file);
            }
        }
        true
    }

    /// fsync: S3 holds the file as it is now once this returns Ok. A handle
    /// of an object not written here has nothing to sync. Errors: EIO when
    /// the upload failed (the file stays staged, tried again later).
    pub async fn fsync(&self, fh: u64) -> Result<(), FsError> {
        let Some(w) = &self.writes else {
            return Ok(());
        };
        let f = match self.local_files.lock().unwrap().get(&fh) {
            Some(h) => h.file.clone(),
            None => return Ok(()),
        };
        Ok(w.fsync(&f).await?)
    }

    /// setattr: `size` truncates or extends (staging the object first when
    /// it is not staged); `mtime` sets a staged file's time. Through write
    /// handle `fh` (ftruncate), or for an inode whose open file left its
    /// name ([`Self::orphan_file`]: futimens), both apply to that open
    /// file, whatever its name leads to now. Mode and ownership are fixed
    /// by the mount (`mount.file_mode`, `uid`, `gid`) and silently kept. An
    /// object is staged only once `gate` allows. Errors: EROFS for a size
    /// change on a read-only mount, EISDIR, ENOSPC, ETXTBSY, the store's.
    pub async fn setattr(
        &self,
        ino: u64,
        fh: Option<u64>,
        size: Option<u64>,
        mtime: Option<SystemTime>,
        gate: StageGate<'_>,
    ) -> Result<Stat, FsError> {
        let open_file = fh
            .and_then(|fh| self.write_handle_file(fh))
            .or_else(|| self.orphan_file(ino));
        if let Some(f) = open_file {
            let w = self.writes()?;
            if let Some(size) = size {
                w.truncate_open(&f, size)?;
            }
            if let Some(t) = mtime {
                w.set_mtime(&f, t);
            }
            return self.open_stat(ino, &f).ok_or(FsError::ReadOnly);
        }
        let attr = self.meta.inodes.get(ino).ok_or(FsError::NotFound)?;
        if let Some(size) = size {
            if attr.kind == EntryKind::Dir {
                return Err(FsError::IsDir);
            }
            let w = self.writes()?.clone();
            // A staged file uploaded meanwhile is gone: stage the object again.
            match w.staged(&attr.key).and_then(|f| w.truncate(&f, size)) {
                Some(r) => r?,
                None => {
                    let o = self
                        .stage_object(ino, &attr, size == 0, size, false, gate)
                        .await?;
                    let f = self
                        .local_files
                        .lock()
                        .unwrap()
                        .get(&o.fh)
                        .map(|h| h.file.clone());
                    if let Some(f) = f {
                        // `None`: replaced by a newer file meanwhile, which
                        // this truncate came before.
                        let r = w.truncate(&f, size);
                        self.release_local(o.fh, || {});
                        r.transpose()?;
                    }
                }
            }
        }
        if let (Some(t), Some(w)) = (mtime, &self.writes)
            && let Some(f) = w.staged(&attr.key)
            && self
                .meta
                .inodes
                .get(ino)
                .is_some_and(|a| a.etag == f.attr().etag)
        {
            w.set_mtime(&f, t);
        }
        self.getattr(ino).await
    }

    /// Creates directory `name` in `parent`. It exists on this mount until
    /// a file is written in it (S3 has no empty directories). Errors:
    /// EROFS, EEXIST, ENAMETOOLONG, EINVAL.
    pub async fn mkdir(&self, parent: u64, name: &OsStr) -> Result<Stat, FsError> {
        let w = self.writes()?.clone();
        let dir = self.dir_attr(parent)?;
        let name = new_name(name)?;
        key_fits(&format!("{}{name}/", dir.key))?;
        // Unknown while S3 cannot be asked: made here, a directory in S3 of
        // the same name is the same directory.
        if !matches!(
            self.resolve_new(&dir, name).await?,
            None | Some(Found::Missing)
        ) {
            return Err(FsError::Exists);
        }
        w.mkdir(&format!("{}{name}/", dir.key));
        Ok(self.stat(&self.meta.inodes.upsert(
            parent,
            &dir.key,
            &dir_entry(name),
            true,
            Instant::now(),
        )))
    }

    /// Removes file `name` of `parent`: a staged file at once, an object by
    /// DeleteObject. Errors: EROFS, ENOENT, EISDIR, the store's.
    pub async fn unlink(&self, parent: u64, name: &OsStr) -> Result<(), FsError> {
        let w = self.writes()?.clone();
        let dir = self.dir_attr(parent)?;
        let name = std::str::from_utf8(name.as_bytes()).map_err(|_| FsError::NotFound)?;
        let key = format!("{}{name}", dir.key);
        let delete = match self.resolve(&dir, name).await? {
            Found::Missing => return Err(FsError::NotFound),
            Found::Dir => return Err(FsError::IsDir),
            // Handed over to S3 meanwhile: an object now.
            Found::Staged => w.unlink(&key).unwrap_or(true),
            Found::Object(_) => true,
        };
        if delete {
            self.delete_object(&key).await?;
        }
        self.meta.inodes.unlink(parent, name);
        Ok(())
    }

    /// Deletes the object at `key`, hidden from listings meanwhile.
    async fn delete_object(&self, key: &str) -> Result<(), FsError> {
        let w = self.writes()?;
        w.hide(key);
        let res = self.store.delete(key).await;
        let (prefix, name) = split_key(key);
        self.meta.invalidate(prefix, name).await;
        w.unhide(key);
        Ok(res?)
    }

    /// Removes directory `name` of `parent`, which must be empty (a
    /// directory marker object `name/`, if any, is deleted). Errors: EROFS,
    /// ENOENT, ENOTDIR, ENOTEMPTY, the store's.
    pub async fn rmdir(&self, parent: u64, name: &OsStr) -> Result<(), FsError> {
        let w = self.writes()?.clone();
        let dir = self.dir_attr(parent)?;
        let name = std::str::from_utf8(name.as_bytes()).map_err(|_| FsError::NotFound)?;
        match self.resolve(&dir, name).await? {
            Found::Dir => {}
            Found::Missing => return Err(FsError::NotFound),
            _ => return Err(FsError::NotDir),
        }
        let prefix = format!("{}{name}/", dir.key);
        let listing = self.merge_local(&prefix, self.meta.listing(&prefix).await?);
        if !listing.entries.is_empty() {
            return Err(FsError::NotEmpty);
        }
        self.store.delete(&prefix).await?;
        w.rmdir(&prefix);
        self.meta.invalidate(&dir.key, name).await;
        self.meta.inodes.unlink(parent, name);
        Ok(())
    }

    /// Renames `name` of `parent` to `new_name` of `new_parent`, replacing
    /// a file there. A staged file moves in staging (no S3 request); an
    /// object is copied (CopyObject pinned to its ETag) then deleted; a
    /// directory moves key by key. An object over `write.max_copy_size` is
    /// copied part by part (UploadPartCopy). Errors: EROFS, ENOENT, EISDIR,
    /// ENOTDIR, ENOTEMPTY, EEXIST (RENAME_NOREPLACE), EINVAL (other flags),
    /// the store's.
    pub async fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name_os: &OsStr,
        flags: u32,
    ) -> Result<(), FsError> {
        let w = self.writes()?.clone();
        if flags & !RENAME_NOREPLACE != 0 {
            return Err(FsError::Invalid(format!("rename flags {flags:#x}")));
        }
        let (dir, new_dir) = (self.dir_attr(parent)?, self.dir_attr(new_parent)?);
        let name = std::str::from_utf8(name.as_bytes()).map_err(|_| FsError::NotFound)?;
        let to_name = new_name(new_name_os)?;
        let (from, to) = (
            format!("{}{name}", dir.key),
            format!("{}{to_name}", new_dir.key),
        );
        if from == to {
            return Ok(());
        }
        key_fits(&to)?;
        let src = self.resolve(&dir, name).await?;
        // A name S3 cannot be asked about now takes a staged file (a
        // checkpoint written under a temporary name): it moves in staging,
        // and its upload replaces whatever may be there (with
        // RENAME_NOREPLACE too, as `mv` asks: the name is in no listing).
        let (dst, dst_unknown) = match self.resolve_new(&new_dir, to_name).await? {
            Some(dst) => (dst, false),
            None if matches!(src, Found::Staged) => (Found::Missing, true),
            None => {
                return Err(FsError::Store(StoreError::Transient(
                    "S3 cannot be asked now about the target; only a staged file moves there"
                        .into(),
                )));
            }
        };
        if flags & RENAME_NOREPLACE != 0 && !matches!(dst, Found::Missing) {
            return Err(FsError::Exists);
        }
        match (&src, &dst) {
            (Found::Missing, _) => return Err(FsError::NotFound),
            (Found::Dir, Found::Staged | Found::Object(_)) => return Err(FsError::NotDir),
            (Found::Staged | Found::Object(_), Found::Dir) => return Err(FsError::IsDir),
            (Found::Dir, Found::Dir) => {
                let p = format!("{to}/");
                if !self
                    .merge_local(&p, self.meta.listing(&p).await?)
                    .entries
                    .is_empty()
                {
                    return Err(FsError::NotEmpty);
                }
            }
            _ => {}
        }
        if format!("{to}/").starts_with(&format!("{from}/")) && matches!(src, Found::Dir) {
            return Err(FsError::Invalid(
                "a directory cannot move into itself".into(),
            ));
        }
        let to_in_s3 = dst_unknown || matches!(dst, Found::Object(_));
        let src = match src {
            Found::Staged if !w.rename(&from, &to, to_in_s3)? => {
                // Handed over to S3 between the lookup and now: an object.
                match self.meta.find(&dir.key, name).await? {
                    Some(e) if e.kind == EntryKind::File => Found::Object(e),
                    _ => return Err(FsError::NotFound),
                }
            }
            other => other,
        };
        // New key -> the ETag of its copy, for the renamed inodes.
        let mut copied = HashMap::new();
        match src {
            Found::Staged => {}
            Found::Object(e) => {
                w.hide(&from);
                let res = self
                    .move_object(&from, &e.etag, e.size, &to, w.max_copy_size())
                    .await;
                w.unhide(&from);
                copied.insert(to.clone(), res?);
                if matches!(dst, Found::Staged) {
                    // Replaced by the copy, once it succeeded.
                    w.unlink(&to);
                }
            }
            Found::Dir => {
                copied = self
                    .rename_dir(&w, &format!("{from}/"), &format!("{to}/"))
                    .await?
            }
            Found::Missing => unreachable!("checked above"),
        }
        self.meta
            .inodes
            .rename(parent, name, new_parent, to_name, &new_dir.key);
        self.meta.inodes.set_copied(&copied, SystemTime::now());
        Ok(())
    }

    /// Copies `from` (at `etag`, `size` bytes; [`crate::store::copy_object`])
    /// to `to`, then DeleteObject `from`; both directories' listings are
    /// dropped. Returns the copy's ETag.
    async fn move_object(
        &self,
        from: &str,
        etag: &str,
        size: u64,
        to: &str,
        max_copy: u64,
    ) -> Result<String, FsError> {
        let res = async {
            let etag =
                crate::store::copy_object(&*self.store, from, etag, size, to, max_copy).await?;
            self.store.delete(from).await?;
            Ok::<_, StoreError>(etag)
        }
        .await;
        for k in [from, to] {
            let (prefix, name) = split_key(k);
            self.meta.invalidate(prefix, name).await;
        }
        Ok(res?)
    }

    /// Moves directory `from` to `to` (prefixes ending in `/`): every
    /// object under it by copy and delete, staged files and local
    /// directories in staging. Returns each copied object's new key and ETag.
    async fn rename_dir(
        &self,
        w: &Arc<Writes<S>>,
        from: &str,
        to: &str,
    ) -> Result<HashMap<String, String>, FsError> {
        let mut objects = Vec::new();
        let mut token = None;
        loop {
            let page = self
                .store
                .list_page(from, None, token, None, crate::store::MAX_KEYS_PER_PAGE)
                .await?;
            objects.extend(page.objects);
            token = page.next_token;
            if token.is_none() {
                break;
            }
        }
        // Every key under the directory gets longer by as much as its
        // prefix does: refused whole before anything moves.
        let longest = objects
            .iter()
            .map(|o| o.key.len())
            .chain(w.longest_key_under(from))
            .max()
            .unwrap_or(from.len());
        key_fits_under(longest - from.len(), to)?;
        for o in &objects {
            w.hide(&o.key);
        }
        // The directory's own marker (`from` itself) last: an undo below
        // never deletes a marker the new name had before.
        objects.sort_by_key(|o| o.key == from);
        let res = async {
            let mut copied = HashMap::new();
            for o in &objects {
                let target = format!("{to}{}", &o.key[from.len()..]);
                let copy = crate::store::copy_object(
                    &*self.store,
                    &o.key,
                    &o.etag,
                    o.size,
                    &target,
                    w.max_copy_size(),
                )
                .await;
                match copy {
                    Ok(etag) => {
                        copied.insert(target, etag);
                    }
                    Err(e) => {
                        // The failed copy may have landed (its answer
                        // lost): its key is deleted too, unless it is the
                        // marker.
                        let failed = (o.key != from).then_some(&target);
                        self.undo_copies(copied.keys().chain(failed)).await;
                        return Err(e);
                    }
                }
            }
            for o in &objects {
                self.store.delete(&o.key).await?;
            }
            Ok::<_, StoreError>(copied)
        }
        .await;
        for o in &objects {
            w.unhide(&o.key);
        }
        self.meta.invalidate_all();
        let copied = res?;
        w.rename_dir(from, to)?;
        Ok(copied)
    }

    /// Deletes the copies a directory rename made before one failed, so
    /// that the failed rename leaves S3 as it was (the new name had no keys
    /// but maybe its marker, which is copied last and never deleted here:
    /// it was missing or an empty directory). A delete that fails is
    /// logged: that copy stays, and listings show it under the new name.
    async fn undo_copies(&self, copies: impl Iterator<Item = &String>) {
        for key in copies {
            if let Err(e) = self.store.delete(key).await {
                tracing::warn!(key = %key.escape_debug(),
                    "a directory rename failed and the copy it made could not be deleted: {e}");
            }
        }
    }
}

/// [`key_fits`] for a key of `rest` bytes after directory prefix `to`.
fn key_fits_under(rest: usize, to: &str) -> Result<(), FsError> {
    if to.len() + rest > crate::store::MAX_KEY_BYTES {
        return Err(FsError::NameTooLong);
    }
    Ok(())
}

/// (parent prefix, name) of a key.
fn split_key(key: &str) -> (&str, &str) {
    match key.rfind('/') {
        Some(i) => (&key[..=i], &key[i + 1..]),
        None => ("", key),
    }
}
