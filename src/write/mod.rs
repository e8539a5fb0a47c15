//! The write path of a writable mount: files written through the mount are
//! staged whole on local disk ([`staging`]), visible at once on this node
//! through an overlay of local changes that lookups and readdir consult
//! before the listings, and uploaded in the background ([`upload`]) after
//! their last close (or at once on fsync). docs/WRITES.md has the design.
//!
//! Lock order: the overlay, then one staged file's state.

pub mod staging;
mod task;
pub mod upload;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use tokio::sync::Notify;
use tracing::{debug, error, info, warn};

use crate::cache::Size;
use crate::store::{ObjectStore, WriteStore};
use crate::telemetry::metrics as m;
pub use staging::{Full, Record, Staging};
use task::{early_ok, mark_written};
use upload::Uploader;

/// Write settings (`[write]` in the config file); used by writable mounts
/// only (`mount.read_only = false`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct WriteConfig {
    /// Directory of staged files (local NVMe), one per mount. Unset:
    /// `staging/<bucket>/<prefix>` in the cache directory when one is
    /// configured, else `/var/tmp/lakemount/staging/<bucket>/<prefix>`: a
    /// directory that survives a reboot, so files not uploaded yet are
    /// found again.
    pub staging_dir: Option<PathBuf>,
    /// Most bytes staged files may hold together, bytes or a percentage of
    /// the staging directory's file system; a write past it fails with
    /// ENOSPC. Default `"20%"`: room for the checkpoints of several ranks
    /// while the cache keeps most of a shared volume.
    pub staging_max_size: Size,
    /// Seconds after a file's last close before its upload starts. A
    /// temporary file renamed within this time is uploaded only under its
    /// final name (the temp-file-then-rename save). Default 1.
    pub upload_delay_secs: f64,
    /// First part size of a multipart upload, bytes; files up to this size
    /// go in one PutObject. Parts double every 1,000 parts so 10,000 parts
    /// hold any object S3 takes. Default 8 MiB (S3's minimum is 5 MiB).
    #[serde(deserialize_with = "crate::config::byte_size::deserialize")]
    pub part_size: u64,
    /// Most bytes of part buffers in flight on the mount. Default 256 MiB:
    /// 32 parts of 8 MiB, enough to fill a 10 Gbit/s link at 20 ms per part.
    #[serde(deserialize_with = "crate::config::byte_size::deserialize")]
    pub upload_memory: u64,
    /// Seconds before a failed upload is tried again; doubled after each
    /// failure, at most 15 minutes; also how often S3 is probed (at most
    /// every 5 s) while uploads wait for it to answer again. Default 30.
    pub retry_secs: f64,
    /// Nice value of the threads that upload (0 to 19): uploads are
    /// background work and yield the CPU to the training job and to the
    /// FUSE threads taking its writes, so a checkpoint's close() is not
    /// slowed by the upload of its first parts. Default 10.
    pub upload_nice: i32,
    /// At unmount, how long to wait for staged files to upload, seconds;
    /// what is left is uploaded at the next start. Default 60: within
    /// systemd's default stop timeout (90 s).
    pub shutdown_wait_secs: f64,
    /// Largest object a rename copies with one CopyObject, bytes; a larger
    /// one is copied as a multipart upload of UploadPartCopy parts of this
    /// size. Default 5 GiB, S3's CopyObject and part limit ("Amazon S3
    /// multipart upload limits"); lower it for a server with a lower limit.
    /// Accepted: 5 MiB to 5 GiB.
    #[serde(deserialize_with = "crate::config::byte_size::deserialize")]
    pub max_copy_size: u64,
    /// Let the kernel write staged files itself by FUSE passthrough (Linux
    /// 6.9+, root), at local-disk speed: a checkpoint's close() then costs
    /// what a local write does. Such a file's parts are uploaded after its
    /// close rather than while it is written, and its writes are not held
    /// to `staging_max_size`: a writer is let in only while staging has
    /// room, and what it writes past the limit is accounted afterwards
    /// (the file system's own ENOSPC still stops it). Default true.
    pub passthrough: bool,
}

impl Default for WriteConfig {
    fn default() -> Self {
        Self {
            staging_dir: None,
            staging_max_size: Size::Percent(20.0),
            upload_delay_secs: 1.0,
            part_size: 8 << 20,
            upload_memory: 256 << 20,
            retry_secs: 30.0,
            upload_nice: 10,
            shutdown_wait_secs: 60.0,
            max_copy_size: crate::store::MAX_PART_SIZE,
            passthrough: true,
        }
    }
}

/// The runtime for uploads: `threads` workers (and its blocking pool) at
/// nice `nice` (setpriority(2) of each thread: on Linux nice is per thread).
/// Errors: the runtime cannot start.
pub fn upload_runtime(threads: usize, nice: i32) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .thread_name("lakemount-upload")
        .on_thread_start(move || {
            // SAFETY: setpriority(2) of the calling thread (who = 0) reads
            // and writes no memory of ours. A failure leaves nice 0.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
        })
        .enable_all()
        .build()
}

/// Longest wait between tries of a failing upload.
const MAX_RETRY: Duration = Duration::from_secs(15 * 60);

/// Longest wait between two probes of S3 while uploads wait for it to
/// answer again (`write.retry_secs` when shorter).
const PROBE_EVERY: Duration = Duration::from_secs(5);

/// One staged file. Open handles, the overlay and the upload task share it;
/// once uploaded it leaves the overlay and staging, and handles still open
/// for reading keep reading its local file.
pub struct Staged {
    /// Staging id.
    pub id: u64,
    file: Arc<File>,
    st: Mutex<State>,
    /// An upload attempt ended (fsync waits on it).
    settled: Notify,
    /// Something changed the upload's due time (a close, a fsync).
    wake: Notify,
    /// Held while its journal record is written, so records land in order.
    record: Mutex<()>,
}

#[derive(Debug)]
struct State {
    key: String,
    size: u64,
    mtime: SystemTime,
    /// The inodes the kernel knows this file as (one, unless it forgot
    /// one and looked the name up again).
    inos: Vec<u64>,
    /// Handles open for writing.
    writers: u32,
    /// Bumped by every change (write, truncate, rename).
    version: u64,
    /// The version S3 holds (0: none yet), and its ETag.
    uploaded: u64,
    etag: String,
    /// The version whose upload failed last, and why.
    failed: Option<(u64, String)>,
    /// A fsync asked for S3 to hold this version.
    urgent: u64,
    /// The upload is due from then (set at the last close).
    ready_at: Option<Instant>,
    /// An upload task runs for this file.
    task: bool,
    /// Unlinked, or uploaded and handed over to S3: out of the overlay.
    gone: bool,
    /// Gone without its upload: unlinked or replaced ([`Staged::is_orphaned`]).
    orphaned: bool,
    /// An object (maybe an older version) is at `key` in S3: an unlink
    /// must delete it.
    in_s3: bool,
    /// Keys of objects this file replaces that must be deleted once it is
    /// uploaded (its names before renames), hidden meanwhile.
    stale_keys: Vec<String>,
    /// Consecutive failed tries.
    failures: u32,
    /// The last try failed because S3 could not be reached or answered
    /// 503 ([`crate::store::StoreError::Transient`] or `Throttled`): S3's
    /// return, seen by [`Writes::watch_for_return`], retries it at once.
    unreachable: bool,
    /// The multipart upload under way (parts sent while the file is still
    /// written, or by an upload interrupted by a change).
    mpu: Option<Mpu>,
    /// Per part (index: number - 1): the version of the last change to its
    /// bytes, so a part sent before a change is sent again.
    part_written: Vec<u64>,
    /// Parts are not sent while writing any more (a part upload failed, or
    /// the file is written by passthrough).
    no_early: bool,
    /// Handles open for writing by FUSE passthrough: the kernel writes the
    /// data file itself, so `size`, `mtime` and `version` follow the file
    /// only when [`Writes::sync_passthrough`] looks at it.
    pt_writers: u32,
    /// The data file as the last look at it found it.
    pt_seen: Option<FileStamp>,
    /// That look came [`SETTLE`] or more after the file's last change, so
    /// any later write changes the stamp; otherwise a write in the same
    /// clock tick may not have, and the next forced look takes a new
    /// version whatever the stamp says.
    pt_trusted: bool,
}

/// How long after a data file's last change a look at its stamp is trusted
/// to reveal every later write: more than a coarse file time tick (one
/// jiffy, at most 10 ms at HZ=100; Linux 6.13+ gives a queried file finer
/// times anyway).
const SETTLE: Duration = Duration::from_millis(20);

/// What tells a change of a data file written behind lakemount's back: its
/// size, and its modification and change times (nanoseconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileStamp {
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileStamp {
    /// How long ago the file last changed, by its ctime, which no caller
    /// can set (zero if it is ahead of the clock).
    fn age(&self) -> Duration {
        SystemTime::now()
            .duration_since(time_of(self.ctime))
            .unwrap_or_default()
    }

    /// The modification time.
    fn modified(&self) -> SystemTime {
        time_of(self.mtime)
    }

    fn of(file: &File) -> std::io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let m = file.metadata()?;
        Ok(Self {
            size: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }
}

/// The time of (seconds, nanoseconds) since the Unix epoch, as stat gives
/// them (times before the epoch count as the epoch).
fn time_of((secs, nsecs): (i64, i64)) -> SystemTime {
    std::time::UNIX_EPOCH + Duration::new(secs.max(0) as u64, nsecs.clamp(0, 999_999_999) as u32)
}

/// A multipart upload of a staged file not completed yet.
#[derive(Debug)]
struct Mpu {
    key: String,
    id: String,
    /// Parts sent, by number.
    parts: BTreeMap<u32, SentPart>,
}

/// One part sent: its ETag, and what it held (the part's version and length).
#[derive(Debug)]
struct SentPart {
    etag: String,
    written: u64,
    len: u64,
}

impl State {
    /// A file of `size` bytes to be uploaded as `key`, not open, at version 1.
    fn new(key: String, size: u64) -> Self {
        Self {
            key,
            size,
            mtime: SystemTime::now(),
            inos: Vec::new(),
            writers: 0,
            version: 1,
            uploaded: 0,
            etag: String::new(),
            failed: None,
            urgent: 0,
            ready_at: None,
            task: false,
            gone: false,
            orphaned: false,
            in_s3: false,
            stale_keys: Vec::new(),
            failures: 0,
            unreachable: false,
            mpu: None,
            part_written: Vec::new(),
            no_early: false,
            pt_writers: 0,
            pt_seen: None,
            pt_trusted: false,
        }
    }
}

/// What the file system shows of a staged file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagedAttr {
    /// Full object key.
    pub key: String,
    /// Size, bytes.
    pub size: u64,
    /// Last write (or `touch`).
    pub mtime: SystemTime,
    /// A pseudo-ETag unique to this staged file, never a real S3 ETag, so a
    /// listing's version of the name is another inode.
    pub etag: String,
}

impl Staged {
    /// Attributes now.
    pub fn attr(&self) -> StagedAttr {
        let st = self.st.lock().unwrap();
        let (mut size, mut mtime) = (st.size, st.mtime);
        if st.pt_writers > 0
            && let Ok(now) = FileStamp::of(&self.file)
        {
            // Written by the kernel meanwhile: the file itself knows.
            size = now.size;
            mtime = now.modified();
        }
        StagedAttr {
            key: st.key.clone(),
            size,
            mtime,
            etag: staged_etag(self.id),
        }
    }

    /// Whether it left its name without reaching S3: unlinked, or replaced
    /// by another file at its name. Its open handles still read and write
    /// it; nothing of it is uploaded.
    pub fn is_orphaned(&self) -> bool {
        self.st.lock().unwrap().orphaned
    }

    /// The data file, for FUSE passthrough of this file's opens.
    pub fn data_file(&self) -> &Arc<File> {
        &self.file
    }

    /// Records an inode the kernel knows this file as.
    pub fn set_ino(&self, ino: u64) {
        let mut st = self.st.lock().unwrap();
        if !st.inos.contains(&ino) {
            st.inos.push(ino);
        }
    }

    /// Reads up to `len` bytes at `off` (short at end of file). Errors:
    /// local disk I/O.
    pub fn read(&self, off: u64, len: u32) -> std::io::Result<Bytes> {
        let size = self.st.lock().unwrap().size;
        let n = (len as u64).min(size.saturating_sub(off)) as usize;
        let mut buf = BytesMut::zeroed(n);
        let mut done = 0;
        while done < n {
            match self.file.read_at(&mut buf[done..], off + done as u64)? {
                0 => break,
                k => done += k,
            }
        }
        buf.truncate(done);
        Ok(buf.freeze())
    }
}

/// The pseudo-ETag of staged file `id`.
pub fn staged_etag(id: u64) -> String {
    format!("\"lakemount-staged-{id}\"")
}

/// Whether `etag` is a staged file's pseudo-ETag ([`staged_etag`]): no
/// object in S3 has it, so attributes carrying it are read through the
/// staged file only.
pub fn is_staged_etag(etag: &str) -> bool {
    etag.starts_with("\"lakemount-staged-")
}

/// What the overlay says about one name.
pub enum Local {
    /// A staged file.
    File(Arc<Staged>),
    /// A directory created on this mount (or holding staged files).
    Dir,
    /// Removed on this mount; S3 may still list it for a moment.
    Hidden,
}

/// A child of a directory as the overlay adds it to a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LocalChild {
    /// A staged file.
    File(StagedAttr),
    /// A directory.
    Dir,
}

#[derive(Default)]
struct Overlay {
    /// Staged files by key.
    files: BTreeMap<String, Arc<Staged>>,
    /// Directories created here, by prefix (ending in `/`).
    dirs: BTreeSet<String>,
    /// Keys removed or renamed away here whose objects may still be listed.
    hidden: HashSet<String>,
}

/// A staged file that S3 now holds: the file system drops its cached
/// listing and points the inode at the new object.
#[derive(Clone, Debug)]
pub struct Uploaded {
    /// The key uploaded.
    pub key: String,
    /// Keys deleted with it (its names before renames).
    pub deleted: Vec<String>,
    /// The new object's ETag and size.
    pub etag: String,
    /// Bytes.
    pub size: u64,
    /// The inodes the kernel knew the file as.
    pub inos: Vec<u64>,
}

type OnUploaded = Box<dyn Fn(Uploaded) -> futures::future::BoxFuture<'static, ()> + Send + Sync>;
type OnHandedOver = Box<dyn Fn(&Uploaded) + Send + Sync>;
type OnKept = Box<dyn Fn(Uploaded, std::path::PathBuf, Keeping) + Send + Sync>;

/// One uploaded file's bytes being taken (into the data cache) by the
/// [`Writes::on_kept`] callback: counted until dropped, so that
/// [`Writes::upload_all`] waits for them too.
pub struct Keeping(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Keeping {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// What [`Writes::upload_all`] left undone when it returned.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Unflushed {
    /// Staged files not in S3 yet: uploaded at the next start.
    pub staged: usize,
    /// Uploaded files not yet in the data cache: the next mount reads them
    /// from S3.
    pub uncached: usize,
}

/// The write path of one mount.
pub struct Writes<S> {
    staging: Staging,
    up: Uploader<S>,
    delay: Duration,
    retry: Duration,
    max_copy: u64,
    /// `write.passthrough`.
    passthrough: bool,
    ov: Mutex<Overlay>,
    /// The runtime upload tasks run on (its threads at `write.upload_nice`).
    rt: tokio::runtime::Handle,
    /// Per key: held by the upload (or delete) of that key, so uploads of
    /// one name land in the order they were made.
    upload_locks: KeyLocks,
    /// Per key: held while an object is copied into staging for a change.
    stage_locks: KeyLocks,
    on_uploaded: OnceLock<OnUploaded>,
    on_handed_over: OnceLock<OnHandedOver>,
    on_kept: OnceLock<OnKept>,
    /// [`Keeping`]s not dropped yet.
    keeping: Arc<std::sync::atomic::AtomicUsize>,
    /// A task probes S3 for uploads that could not reach it.
    probing: Mutex<bool>,
}

/// Async locks by key, created on first use and dropped with their last user.
#[derive(Default)]
struct KeyLocks(Mutex<std::collections::HashMap<String, std::sync::Weak<tokio::sync::Mutex<()>>>>);

impl KeyLocks {
    /// The lock of `key`, held once this returns.
    async fn lock(&self, key: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let m = {
            let mut map = self.0.lock().unwrap();
            if map.len() > 1024 {
                map.retain(|_, w| w.strong_count() > 0);
            }
            match map.get(key).and_then(std::sync::Weak::upgrade) {
                Some(m) => m,
                None => {
                    let m = Arc::new(tokio::sync::Mutex::new(()));
                    map.insert(key.to_string(), Arc::downgrade(&m));
                    m
                }
            }
        };
        m.lock_owned().await
    }
}

/// Errors of the write path, mapped to errno by the file system.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// Staging is full (ENOSPC).
    #[error(transparent)]
    Full(#[from] Full),
    /// Local disk I/O failed (its errno).
    #[error("staging: {0}")]
    Io(#[from] std::io::Error),
    /// The upload failed (EIO); the file stays staged.
    #[error("upload failed: {0}")]
    Upload(String),
}

impl<S: ObjectStore + WriteStore> Writes<S> {
    /// The write path over `store` with staged files in `staging`, its
    /// uploads run on `rt` ([`upload_runtime`]).
    pub fn new(
        store: Arc<S>,
        staging: Staging,
        config: &WriteConfig,
        rt: tokio::runtime::Handle,
    ) -> Arc<Self> {
        Arc::new(Self {
            rt,
            staging,
            up: Uploader::new(store, config.part_size, config.upload_memory),
            delay: Duration::from_secs_f64(config.upload_delay_secs.max(0.0)),
            retry: Duration::from_secs_f64(config.retry_secs.max(0.001)),
            max_copy: config.max_copy_size,
            passthrough: config.passthrough,
            ov: Mutex::new(Overlay::default()),
            upload_locks: KeyLocks::default(),
            stage_locks: KeyLocks::default(),
            on_uploaded: OnceLock::new(),
            on_handed_over: OnceLock::new(),
            on_kept: OnceLock::new(),
            keeping: Arc::default(),
            probing: Mutex::new(false),
        })
    }

    /// Sets what runs when a staged file has been uploaded, before it leaves
    /// the overlay (so that no lookup in between finds neither): at most once.
    pub fn on_uploaded(
        &self,
        f: impl Fn(Uploaded) -> futures::future::BoxFuture<'static, ()> + Send + Sync + 'static,
    ) {
        let _ = self.on_uploaded.set(Box::new(f));
    }

    /// Sets what runs as a staged file leaves the overlay (at most once).
    /// It runs under the overlay's lock, so no open of the name comes in
    /// between: it must not call back into this value.
    pub fn on_handed_over(&self, f: impl Fn(&Uploaded) + Send + Sync + 'static) {
        let _ = self.on_handed_over.set(Box::new(f));
    }

    /// Calls `f` after each hand-over with the uploaded bytes: a hard link
    /// of the staged data file, not counted in staging, that `f` takes (it
    /// removes the path when done, then drops the [`Keeping`]; one left by
    /// a crash is removed at the next start). Without it the bytes go with
    /// the staged file.
    pub fn on_kept(
        &self,
        f: impl Fn(Uploaded, std::path::PathBuf, Keeping) + Send + Sync + 'static,
    ) {
        let _ = self.on_kept.set(Box::new(f));
    }

    /// A new [`Keeping`], counted until dropped.
    fn keep(&self) -> Keeping {
        self.keeping
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Keeping(self.keeping.clone())
    }

    /// `write.max_copy_size`: the largest object one CopyObject copies, bytes.
    pub fn max_copy_size(&self) -> u64 {
        self.max_copy
    }

    /// The staging area.
    pub fn staging(&self) -> &Staging {
        &self.staging
    }

    /// Staged files a previous run left, queued for upload now; uploads
    /// pending in S3 for their keys (parts of a crashed run) are aborted.
    /// `root` is the mount prefix. Needs a tokio runtime. Returns how many
    /// files were found.
    pub async fn recover(self: &Arc<Self>, root: &str) -> anyhow::Result<usize> {
        let found = self.staging.recover()?;
        if found.is_empty() {
            return Ok(0);
        }
        let keys: HashSet<String> = found.iter().map(|(_, r, _)| r.key.clone()).collect();
        match self.up.store.list_multipart(root).await {
            Ok(pending) => {
                for u in pending.into_iter().filter(|u| keys.contains(&u.key)) {
                    info!(key = %u.key.escape_debug(), upload_id = %u.upload_id,
                        "aborting the multipart upload a previous run left; the file is uploaded again");
                    if let Err(e) = self.up.store.abort_multipart(&u.key, &u.upload_id).await {
                        warn!(key = %u.key.escape_debug(), "abort failed: {e}");
                    }
                }
            }
            Err(e) => warn!("listing pending multipart uploads failed: {e}"),
        }
        let mut n = 0;
        for (id, record, file) in found {
            let size = file.metadata()?.len();
            if !record.closed {
                // Its writer never closed it: not a whole file, so it must
                // not replace the object; kept for an admin to look at.
                error!(key = %record.key.escape_debug(), size,
                    staged = %self.staging.data_path(id).display(),
                    "a file was open for writing when lakemount stopped: kept in staging, not uploaded");
                continue;
            }
            info!(key = %record.key.escape_debug(), size, "staged file of a previous run: uploading it");
            let f = self.insert(id, record.key, file, size);
            let mut st = f.st.lock().unwrap();
            // Whatever was at its key (or its old names) is not known now.
            st.in_s3 = true;
            st.ready_at = Some(Instant::now());
            self.ensure_task(&f, &mut st);
            n += 1;
        }
        Ok(n)
    }

    /// At unmount: uploads every staged file now (delays and retry waits
    /// cut short) and waits up to `limit` for S3 to hold them all, and for
    /// the uploaded ones to be kept ([`Self::on_kept`]). The FUSE session
    /// has ended, so no handle can write any more, whether or not its
    /// RELEASE arrived before the unmount; what passthrough writers wrote
    /// is taken in first.
    pub async fn upload_all(self: &Arc<Self>, limit: Duration) -> Unflushed {
        let keeping = self.keeping.clone();
        let files: Vec<Arc<Staged>> = self.ov.lock().unwrap().files.values().cloned().collect();
        for f in &files {
            let mut st = f.st.lock().unwrap();
            // What passthrough writers wrote, their RELEASE unseen.
            self.sync_locked(f, &mut st, true);
            st.pt_writers = 0;
            st.pt_seen = None;
            st.pt_trusted = false;
            st.writers = 0;
            st.ready_at = Some(Instant::now());
            st.urgent = st.version;
            self.ensure_task(f, &mut st);
            drop(st);
            f.wake.notify_waiters();
        }
        let deadline = Instant::now() + limit;
        loop {
            let left = Unflushed {
                staged: self.ov.lock().unwrap().files.len(),
                // Uploaded files still being taken into the data cache: the
                // next mount would fetch them from S3 again.
                uncached: keeping.load(std::sync::atomic::Ordering::Acquire),
            };
            if left == Unflushed::default() || Instant::now() >= deadline {
                return left;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn insert(&self, id: u64, key: String, file: File, size: u64) -> Arc<Staged> {
        let f = Self::new_staged(id, key.clone(), file, size);
        let mut ov = self.ov.lock().unwrap();
        let in_s3 = self.claim(&mut ov, &key, &f);
        drop(ov);
        f.st.lock().unwrap().in_s3 |= in_s3;
        self.gauges();
        f
    }

    fn new_staged(id: u64, key: String, file: File, size: u64) -> Arc<Staged> {
        Arc::new(Staged {
            id,
            file: Arc::new(file),
            st: Mutex::new(State::new(key, size)),
            settled: Notify::new(),
            wake: Notify::new(),
            record: Mutex::new(()),
        })
    }

    /// Writes `f`'s journal record as its state is now (key; closed when no
    /// writer holds it). Concurrent callers each write the state as of
    /// their turn, so the last record written is the latest state.
    fn save_record(&self, f: &Staged) {
        let _turn = f.record.lock().unwrap();
        let record = {
            let st = f.st.lock().unwrap();
            if st.gone {
                return;
            }
            Record {
                key: st.key.clone(),
                closed: st.writers == 0,
            }
        };
        if let Err(e) = self.staging.write_record(f.id, &record) {
            // The bytes are safe; a restart would use the older record.
            warn!(key = %record.key.escape_debug(), "writing the staging record failed: {e}");
        }
        // Unlinked or handed over while the record was written: its
        // removal may have come first, so this record must go too.
        if f.st.lock().unwrap().gone {
            self.staging.remove_record(f.id);
        }
    }

    /// Waits for the right to copy the object at `key` into staging (one
    /// copy of a name at a time); held until the guard drops.
    pub async fn stage_lock(&self, key: &str) -> tokio::sync::OwnedMutexGuard<()> {
        self.stage_locks.lock(key).await
    }

    /// A staged file for `key` not yet in the overlay, open for writing once:
    /// the object's bytes are copied into it, then [`Self::publish`]ed (or
    /// [`Self::discard`]ed). Errors: local disk.
    pub fn create_unpublished(&self, key: &str) -> Result<Arc<Staged>, WriteError> {
        let (id, file) = self.staging.create(key)?;
        let f = Self::new_staged(id, key.to_string(), file, 0);
        let mut st = f.st.lock().unwrap();
        st.writers = 1;
        // The copy sends no parts: it is the object already.
        st.no_early = true;
        drop(st);
        Ok(f)
    }

    /// Drops an unpublished staged file (its copy failed).
    pub fn discard(&self, f: &Arc<Staged>) {
        self.drop_staged(f);
    }

    /// Puts `f`, a copy of the object at its key, in the overlay, and
    /// gives the file to open for writing: `f`, or a file staged at that
    /// key meanwhile (then `f` is dropped and the other one opened for
    /// writing). A whole copy (`etag`: the object's ETag) counts as
    /// uploaded: closed unchanged, it goes back to being the object without
    /// an upload. A partial one (`None`: the part a shrinking truncate
    /// keeps) is a new version to upload.
    pub fn publish(
        self: &Arc<Self>,
        f: Arc<Staged>,
        etag: Option<&str>,
    ) -> Result<Arc<Staged>, WriteError> {
        let key = f.st.lock().unwrap().key.clone();
        let mut ov = self.ov.lock().unwrap();
        if let Some(other) = ov.files.get(&key).cloned() {
            drop(ov);
            self.drop_staged(&f);
            return match self.open_writer(&other, false) {
                Some(r) => r.map(|()| other),
                None => Err(WriteError::Io(std::io::Error::from_raw_os_error(
                    libc::EAGAIN,
                ))),
            };
        }
        self.claim(&mut ov, &key, &f);
        let mut st = f.st.lock().unwrap();
        st.in_s3 = true;
        if let Some(etag) = etag {
            st.uploaded = st.version;
            st.etag = etag.to_string();
        }
        st.no_early = false;
        drop(st);
        drop(ov);
        self.gauges();
        Ok(f)
    }

    /// `f` takes `key` in the overlay (under its lock, `ov`): a staged file
    /// there is replaced (gone; its old names to delete pass to `f`), no
    /// other file deletes `key` as an old name any more (the upload of `f`
    /// replaces that object), and the name is shown again. Returns whether
    /// an object may be at `key` in S3 now.
    fn claim(&self, ov: &mut Overlay, key: &str, f: &Arc<Staged>) -> bool {
        let mut in_s3 = ov.hidden.remove(key);
        // Every old name waiting for its delete is hidden: only then can
        // another file hold `key` as one.
        let was_hidden = in_s3;
        for other in ov.files.values().filter(|_| was_hidden) {
            let mut st = other.st.lock().unwrap();
            if let Some(i) = st.stale_keys.iter().position(|k| k == key) {
                st.stale_keys.remove(i);
                in_s3 = true;
            }
        }
        {
            let mut st = f.st.lock().unwrap();
            if let Some(i) = st.stale_keys.iter().position(|k| k == key) {
                st.stale_keys.remove(i);
                in_s3 = true;
            }
        }
        if let Some(old) = ov.files.insert(key.to_string(), f.clone())
            && !Arc::ptr_eq(&old, f)
        {
            let stale = {
                let mut st = old.st.lock().unwrap();
                in_s3 |= st.in_s3 || st.uploaded > 0;
                std::mem::take(&mut st.stale_keys)
            };
            f.st.lock().unwrap().stale_keys.extend(stale);
            self.drop_staged(&old);
        }
        in_s3
    }

    /// Marks `old` gone and removes its staged bytes (it was replaced or
    /// unlinked). Open handles keep reading its file.
    fn drop_staged(&self, old: &Arc<Staged>) {
        let mut st = old.st.lock().unwrap();
        if !st.gone {
            st.gone = true;
            st.orphaned = true;
            self.staging.remove(old.id, st.size);
        }
        drop(st);
        old.wake.notify_waiters();
        old.settled.notify_waiters();
    }

    /// What the overlay holds at `key` (a file) or `key/` (a directory).
    pub fn find(&self, key: &str) -> Option<Local> {
        let ov = self.ov.lock().unwrap();
        if let Some(f) = ov.files.get(key) {
            return Some(Local::File(f.clone()));
        }
        let dir = format!("{key}/");
        if ov.dirs.contains(&dir)
            || ov
                .files
                .range(dir.clone()..)
                .next()
                .is_some_and(|(k, _)| k.starts_with(&dir))
        {
            return Some(Local::Dir);
        }
        ov.hidden.contains(key).then_some(Local::Hidden)
    }

    /// The staged file at `key`, if any.
    pub fn staged(&self, key: &str) -> Option<Arc<Staged>> {
        self.ov.lock().unwrap().files.get(key).cloned()
    }

    /// Whether `key` was removed here and must not be shown from a listing.
    pub fn is_hidden(&self, key: &str) -> bool {
        self.ov.lock().unwrap().hidden.contains(key)
    }

    /// The overlay's direct children of directory `prefix` (`""` or ending
    /// in `/`), by name: staged files, directories created here or holding
    /// staged files; and the hidden names to leave out of its listing.
    pub fn children(&self, prefix: &str) -> (BTreeMap<String, LocalChild>, HashSet<String>) {
        let ov = self.ov.lock().unwrap();
        let mut out = BTreeMap::new();
        for (k, f) in ov.files.range(prefix.to_string()..) {
            let Some(rest) = k.strip_prefix(prefix) else {
                break;
            };
            match rest.split_once('/') {
                Some((d, _)) => out.insert(d.to_string(), LocalChild::Dir),
                None => out.insert(rest.to_string(), LocalChild::File(f.attr())),
            };
        }
        for d in ov.dirs.range(prefix.to_string()..) {
            let Some(rest) = d.strip_prefix(prefix) else {
                break;
            };
            if let Some(name) = rest.strip_suffix('/')
                && !name.is_empty()
                && !name.contains('/')
            {
                out.entry(name.to_string()).or_insert(LocalChild::Dir);
            }
        }
        let hidden = ov
            .hidden
            .iter()
            .filter_map(|k| k.strip_prefix(prefix))
            .filter(|n| !n.contains('/'))
            .map(str::to_string)
            .collect();
        (out, hidden)
    }

    /// A new empty staged file for `key`, open for writing once (release it
    /// with [`Self::close_writer`]). A staged file already at `key` is
    /// replaced; so is an object at `key` (`in_s3`), by the upload.
    /// Errors: local disk.
    pub fn create(&self, key: &str, in_s3: bool) -> Result<Arc<Staged>, WriteError> {
        let (id, file) = self.staging.create(key)?;
        let f = self.insert(id, key.to_string(), file, 0);
        let mut st = f.st.lock().unwrap();
        st.writers = 1;
        st.in_s3 = in_s3;
        drop(st);
        Ok(f)
    }

    /// A staged file for `key` holding `data` (an object opened for writing
    /// without O_TRUNC), open for writing once. Errors: ENOSPC, local disk.
    pub fn create_from(&self, key: &str, data: &[u8]) -> Result<Arc<Staged>, WriteError> {
        self.staging.resize(0, data.len() as u64)?;
        let created = self.staging.create(key).and_then(|(id, file)| {
            file.write_all_at(data, 0)?;
            Ok((id, file))
        });
        let (id, file) = match created {
            Ok(x) => x,
            Err(e) => {
                self.staging.resize(data.len() as u64, 0).ok();
                return Err(e.into());
            }
        };
        let f = self.insert(id, key.to_string(), file, data.len() as u64);
        let mut st = f.st.lock().unwrap();
        st.writers = 1;
        st.in_s3 = true;
        drop(st);
        Ok(f)
    }

    /// Opens `f` for writing once more; `truncate`: to size 0 (O_TRUNC).
    /// `None` when it is no longer staged (uploaded meanwhile: open the
    /// object instead).
    pub fn open_writer(&self, f: &Arc<Staged>, truncate: bool) -> Option<Result<(), WriteError>> {
        let ov = self.ov.lock().unwrap();
        let mut st = f.st.lock().unwrap();
        if st.gone {
            return None;
        }
        drop(ov);
        st.writers += 1;
        st.ready_at = None;
        let first = st.writers == 1;
        let r = if truncate && st.size > 0 {
            self.set_len(f, &mut st, 0)
        } else {
            Ok(())
        };
        drop(st);
        if first {
            self.save_record(f);
        }
        Some(r)
    }

    /// Whether an open of a staged file (for writing: `write`) may start
    /// FUSE passthrough: `write.passthrough` is on and, for a writer,
    /// staging has room left (a passthrough writer's bytes are not checked
    /// against the limit).
    pub fn passthrough_ok(&self, write: bool) -> bool {
        self.passthrough && (!write || self.staging.has_room())
    }

    /// A handle of `f` open for writing is served by FUSE passthrough: from
    /// now on the kernel writes the data file itself. Its parts are not sent
    /// while it is written (no write tells which bytes changed).
    pub fn passthrough_writer(&self, f: &Staged) {
        let mut st = f.st.lock().unwrap();
        st.pt_writers += 1;
        st.no_early = true;
        if st.pt_seen.is_none() {
            st.pt_seen = FileStamp::of(&f.file).ok();
            st.pt_trusted = st.pt_seen.is_some_and(|s| s.age() >= SETTLE);
        }
    }

    /// A passthrough writer of `f` closed: its writes are taken in (a new
    /// version unless the stamp is unchanged since a trusted look), then as
    /// [`Self::close_writer`].
    pub fn close_passthrough_writer(self: &Arc<Self>, f: &Arc<Staged>) {
        {
            let mut st = f.st.lock().unwrap();
            self.sync_locked(f, &mut st, true);
            st.pt_writers = st.pt_writers.saturating_sub(1);
            if st.pt_writers == 0 {
                st.pt_seen = None;
                st.pt_trusted = false;
            }
        }
        self.close_writer(f);
    }

    /// Takes in what passthrough writers did to `f`'s data file so far (a
    /// getattr looks): its size is accounted in staging, even past its limit
    /// (the kernel has written it already), and a change of size or times is
    /// a new version. A no-op without passthrough writers.
    pub fn sync_passthrough(&self, f: &Staged) {
        let mut st = f.st.lock().unwrap();
        self.sync_locked(f, &mut st, false);
    }

    /// [`Self::sync_passthrough`] under `f`'s lock; with `force` (close,
    /// fsync), also a new version when the stamp is unchanged but the last
    /// look was not trusted ([`State::pt_trusted`]).
    fn sync_locked(&self, f: &Staged, st: &mut State, force: bool) {
        if st.pt_writers == 0 {
            return;
        }
        let now = match FileStamp::of(&f.file) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(key = %st.key, "cannot stat a staged file: {e}");
                return;
            }
        };
        let unchanged = st.pt_seen == Some(now);
        let trusted_now = now.age() >= SETTLE;
        // Unchanged since a trusted look: nothing was written. Unchanged
        // since an untrusted one: a write may hide in its clock tick, so a
        // look that would trust the file (or a forced one) takes a version.
        if unchanged && (st.pt_trusted || (!force && !trusted_now)) {
            return;
        }
        st.pt_seen = Some(now);
        st.pt_trusted = trusted_now;
        if !st.gone {
            self.staging.resize_over(st.size, now.size);
        }
        st.size = now.size;
        st.mtime = now.modified();
        st.version += 1;
        st.part_written.clear();
        mark_written(self.up.part_size, st, 0, now.size);
    }

    /// One writer of `f` closed; after the last the upload is due in
    /// `write.upload_delay_secs`.
    pub fn close_writer(self: &Arc<Self>, f: &Arc<Staged>) {
        let mut st = f.st.lock().unwrap();
        st.writers = st.writers.saturating_sub(1);
        if st.writers == 0 && !st.gone {
            drop(st);
            // Closed: a restart may upload it (a file never closed is not).
            self.save_record(f);
            let mut st = f.st.lock().unwrap();
            if st.writers == 0 && !st.gone {
                st.ready_at = Some(Instant::now() + self.delay);
                self.ensure_task(f, &mut st);
            }
            drop(st);
            f.wake.notify_waiters();
        }
    }

    /// Writes `data` at `off` of `f`. Errors: ENOSPC past the staging
    /// limit, local disk I/O.
    pub fn write(
        self: &Arc<Self>,
        f: &Arc<Staged>,
        off: u64,
        data: &[u8],
    ) -> Result<(), WriteError> {
        let mut st = f.st.lock().unwrap();
        let end = off + data.len() as u64;
        // A file unlinked or replaced while open is out of staging's
        // accounting; it still takes writes, as an unlinked local file does.
        let counted = end > st.size && !st.gone;
        if counted {
            self.staging.resize(st.size, end)?;
        }
        if let Err(e) = f.file.write_all_at(data, off) {
            if counted {
                self.staging.resize(end, st.size).ok();
            }
            return Err(e.into());
        }
        let first = self.up.part_size;
        let crossed =
            end > st.size && upload::part_at(first, st.size).0 != upload::part_at(first, end).0;
        st.size = st.size.max(end);
        st.version += 1;
        mark_written(first, &mut st, off, end);
        st.mtime = SystemTime::now();
        if crossed
            && st.writers > 0
            && !st.no_early
            && st.size > first
            && !st.gone
            && early_ok(&st.key)
        {
            // A part was filled: send it while the writer goes on.
            self.ensure_task(f, &mut st);
        }
        Ok(())
    }

    /// Truncates or extends `f` to `size` bytes (a new upload is due as after
    /// a close when no writer holds it). `None` when `f` is gone (uploaded
    /// and handed over to S3, or replaced) meanwhile, as with
    /// [`Self::open_writer`]: the name is to be staged again. Errors: ENOSPC,
    /// local disk.
    pub fn truncate(
        self: &Arc<Self>,
        f: &Arc<Staged>,
        size: u64,
    ) -> Option<Result<(), WriteError>> {
        let mut st = f.st.lock().unwrap();
        if st.gone {
            return None;
        }
        Some(self.truncate_locked(f, &mut st, size))
    }

    /// Truncates or extends `f`, which an open handle holds, to `size`
    /// bytes (ftruncate): a file still staged as [`Self::truncate`], a file
    /// that left its name meanwhile (unlinked or replaced) for its open
    /// handles only, as its writes do. Errors: ENOSPC, local disk.
    pub fn truncate_open(self: &Arc<Self>, f: &Arc<Staged>, size: u64) -> Result<(), WriteError> {
        let mut st = f.st.lock().unwrap();
        self.truncate_locked(f, &mut st, size)
    }

    fn truncate_locked(
        self: &Arc<Self>,
        f: &Arc<Staged>,
        st: &mut State,
        size: u64,
    ) -> Result<(), WriteError> {
        self.set_len(f, st, size)?;
        if st.writers == 0 && !st.gone {
            st.ready_at = Some(Instant::now() + self.delay);
            self.ensure_task(f, st);
        }
        Ok(())
    }

    fn set_len(&self, f: &Staged, st: &mut State, size: u64) -> Result<(), WriteError> {
        // Accounted from the size the file has now.
        self.sync_locked(f, st, false);
        let counted = !st.gone;
        if counted {
            self.staging.resize(st.size, size)?;
        }
        if let Err(e) = f.file.set_len(size) {
            if counted {
                self.staging.resize(size, st.size).ok();
            }
            return Err(e.into());
        }
        let old = st.size;
        st.size = size;
        st.version += 1;
        mark_written(self.up.part_size, st, old.min(size), old.max(size));
        st.mtime = SystemTime::now();
        Ok(())
    }

    /// Sets the modification time of `f` (`touch`, utimensat): also on its
    /// data file, where a passthrough writer's file takes its times from.
    pub fn set_mtime(&self, f: &Staged, mtime: SystemTime) {
        let mut st = f.st.lock().unwrap();
        if let Err(e) = f.file.set_modified(mtime) {
            warn!(key = %st.key.escape_debug(), "setting a staged file's mtime failed: {e}");
        }
        st.mtime = mtime;
    }

    /// Makes S3 hold `f` as it is now and waits for it: Ok once it does.
    /// Errors: [`WriteError::Upload`] when the upload failed (the file stays
    /// staged and is tried again later).
    pub async fn fsync(self: &Arc<Self>, f: &Arc<Staged>) -> Result<(), WriteError> {
        // A passthrough-written file is looked at once its last change has
        // settled, so that the look can be trusted at its close (no second
        // upload of a file fsynced, then closed).
        let wait = {
            let st = f.st.lock().unwrap();
            (st.pt_writers > 0)
                .then(|| FileStamp::of(&f.file).ok())
                .flatten()
                .map_or(Duration::ZERO, |s| SETTLE.saturating_sub(s.age()))
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        let target = {
            let mut st = f.st.lock().unwrap();
            self.sync_locked(f, &mut st, true);
            if st.gone || st.uploaded >= st.version {
                return Ok(());
            }
            st.urgent = st.version;
            st.failed = None;
            self.ensure_task(f, &mut st);
            st.version
        };
        f.wake.notify_waiters();
        loop {
            let settled = f.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            {
                let st = f.st.lock().unwrap();
                if st.uploaded >= target || st.gone {
                    return Ok(());
                }
                if let Some((v, e)) = &st.failed
                    && *v >= target
                {
                    return Err(WriteError::Upload(e.clone()));
                }
            }
            settled.await;
        }
    }

    /// Removes the staged file at `key` (unlink). Returns whether an object
    /// of it may be in S3 (uploaded before, or renamed from a key that had
    /// one): the caller deletes it. `None`: nothing staged at `key`.
    pub fn unlink(self: &Arc<Self>, key: &str) -> Option<bool> {
        let mut ov = self.ov.lock().unwrap();
        let f = ov.files.remove(key)?;
        let (uploaded, stale) = {
            let mut st = f.st.lock().unwrap();
            (
                st.in_s3 || st.uploaded > 0,
                std::mem::take(&mut st.stale_keys),
            )
        };
        // Old names stay hidden: the caller deletes their objects too.
        for k in &stale {
            ov.hidden.insert(k.clone());
        }
        drop(ov);
        self.drop_staged(&f);
        self.gauges();
        if !stale.is_empty() {
            let this = self.clone();
            self.rt.spawn(async move {
                for k in stale {
                    this.delete_unclaimed(&k).await.ok();
                    let mut ov = this.ov.lock().unwrap();
                    if !ov.files.contains_key(&k) {
                        ov.hidden.remove(&k);
                    }
                }
            });
        }
        Some(uploaded)
    }

    /// Deletes the object at `key` unless a staged file took the name
    /// meanwhile (its upload replaces it), after any upload of `key` in
    /// flight. Errors: the store's (logged).
    async fn delete_unclaimed(&self, key: &str) -> Result<(), ()> {
        let _order = self.upload_locks.lock(key).await;
        if self.ov.lock().unwrap().files.contains_key(key) {
            return Ok(());
        }
        self.up.store.delete(key).await.map_err(|e| {
            warn!(key = %key.escape_debug(), "deleting the object of a renamed or removed file failed: {e}");
        })
    }

    /// Renames the staged file at `from` to `to` (no S3 request; a staged
    /// file at `to` is replaced). An object at `from` in S3 is deleted once
    /// the file is uploaded as `to`, and hidden meanwhile; `to_in_s3`: an
    /// object is at `to`. False: nothing staged at `from`. A journal record
    /// that cannot be written is logged (the file keeps its old name for
    /// a restart).
    pub fn rename(
        self: &Arc<Self>,
        from: &str,
        to: &str,
        to_in_s3: bool,
    ) -> Result<bool, WriteError> {
        let mut ov = self.ov.lock().unwrap();
        let Some(f) = ov.files.get(from).cloned() else {
            return Ok(false);
        };
        ov.files.remove(from);
        let to_has = self.claim(&mut ov, to, &f);
        let mut st = f.st.lock().unwrap();
        if st.in_s3 || st.uploaded > 0 {
            st.stale_keys.push(from.to_string());
            ov.hidden.insert(from.to_string());
        }
        st.in_s3 = to_in_s3 || to_has;
        st.key = to.to_string();
        st.version += 1;
        st.uploaded = 0;
        drop(ov);
        if st.writers == 0 {
            // A file renamed after its close (temp file then rename) is
            // uploaded after the delay, under its new name only.
            st.ready_at = Some(Instant::now() + self.delay);
            self.ensure_task(&f, &mut st);
        }
        drop(st);
        // The new name in the journal (two fsyncs), outside the overlay's lock.
        self.save_record(&f);
        Ok(true)
    }

    /// Hides `key` while its object is deleted or moved.
    pub fn hide(&self, key: &str) {
        self.ov.lock().unwrap().hidden.insert(key.to_string());
    }

    /// Shows `key` from listings again (its object is gone, listings dropped).
    pub fn unhide(&self, key: &str) {
        self.ov.lock().unwrap().hidden.remove(key);
    }

    /// Records directory `prefix` (ending in `/`) as created here.
    pub fn mkdir(&self, prefix: &str) {
        let mut ov = self.ov.lock().unwrap();
        ov.hidden.remove(prefix.trim_end_matches('/'));
        ov.dirs.insert(prefix.to_string());
    }

    /// Forgets directory `prefix` created here (rmdir). The caller checked
    /// it is empty.
    pub fn rmdir(&self, prefix: &str) {
        self.ov.lock().unwrap().dirs.remove(prefix);
    }

    /// The length in bytes of the longest key staged (a file or a local
    /// directory) under directory prefix `prefix`, if any.
    pub fn longest_key_under(&self, prefix: &str) -> Option<usize> {
        let ov = self.ov.lock().unwrap();
        let files = ov
            .files
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, _)| k.len());
        let dirs = ov
            .dirs
            .range(prefix.to_string()..)
            .take_while(|k| k.starts_with(prefix))
            .map(|k| k.len());
        files.chain(dirs).max()
    }

    /// Moves every staged file and local directory under `from` (a
    /// directory prefix) to the same names under `to`. Errors: local disk.
    pub fn rename_dir(self: &Arc<Self>, from: &str, to: &str) -> Result<(), WriteError> {
        let keys: Vec<String> = {
            let ov = self.ov.lock().unwrap();
            ov.files
                .range(from.to_string()..)
                .take_while(|(k, _)| k.starts_with(from))
                .map(|(k, _)| k.clone())
                .collect()
        };
        for k in keys {
            // The directory move may have copied an object to that name.
            self.rename(&k, &format!("{to}{}", &k[from.len()..]), true)?;
        }
        let mut ov = self.ov.lock().unwrap();
        let dirs: Vec<String> = ov
            .dirs
            .range(from.to_string()..)
            .take_while(|d| d.starts_with(from))
            .cloned()
            .collect();
        for d in dirs {
            ov.dirs.remove(&d);
            ov.dirs.insert(format!("{to}{}", &d[from.len()..]));
        }
        ov.dirs.insert(to.to_string());
        Ok(())
    }

    fn gauges(&self) {
        let ov = self.ov.lock().unwrap();
        metrics::gauge!(m::WRITE_STAGED_FILES).set(ov.files.len() as f64);
        metrics::gauge!(m::WRITE_STAGED_BYTES).set(self.staging.used() as f64);
    }
}
