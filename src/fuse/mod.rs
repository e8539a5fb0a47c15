//! The FUSE adapter: implements `fuser::Filesystem` over [`Fs`]. A handler
//! that may wait (on the network, the disk cache) hands its request to the
//! tokio runtime and replies from there, so no FUSE session thread ever waits
//! on the network; what needs no waiting is answered on the session thread
//! itself: a read whose bytes are already read ahead, an open with fresh
//! attributes, a lookup or getattr from cached metadata. The only module that
//! touches fuser's request and reply types. One session thread reads
//! requests from the kernel at a time ([`turns`]).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use fuser::{
    BackingId, BsdFileFlags, Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation,
    INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, Notifier, OpenAccMode, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty,
    ReplyEntry, ReplyIoctl, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};
use tracing::{debug, info, warn};

use crate::fs::{Fs, FsError, Passthrough, Stat};
use crate::meta::EntryKind;
use crate::store::{ObjectStore, WriteStore};
use crate::telemetry::metrics as m;

mod handles;
mod turns;
use handles::InodeHandles;
use turns::{Turn, Turns};

/// Largest read-ahead the kernel is asked for, bytes. The kernel caps it at its
/// own limit (`fuse_init_out.max_readahead` is clamped in `fuse_dev_do_init`).
pub const MAX_READAHEAD: u32 = 1 << 20;

/// FUSE background requests in flight (async reads included) the kernel allows
/// before it throttles (`max_background`, default 12 in `fs/fuse/inode.c`).
/// 64 keeps many loader workers' reads queued on the runtime at once.
pub const MAX_BACKGROUND: u16 = 64;

/// Bytes assumed for one readdir reply buffer: the kernel sends at least one
/// page (PAGE_SIZE, 4096 on x86-64). fuser does not expose the real size, so
/// entries that do not fit are returned to the table with `forget`.
const READDIR_REPLY_BYTES: usize = 4096;

/// Read replies of at least this many bytes answered on a session thread
/// let a parked thread read meanwhile ([`turns`]): the kernel's copy of a
/// 1 MiB reply into the reader's pages takes long enough for other readers'
/// requests to queue.
const LARGE_REPLY: usize = 128 << 10;

/// `statfs` block size, bytes.
const STATFS_BSIZE: u32 = 4096;
/// `statfs` total blocks: 1 PiB in 4 KiB blocks. S3 has no size; `df` needs a
/// non-zero number.
const STATFS_BLOCKS: u64 = (1 << 50) / STATFS_BSIZE as u64;
/// `statfs` inode count shown, likewise arbitrary and non-zero.
const STATFS_FILES: u64 = 1 << 32;

/// `st_blksize` of files read with FOPEN_DIRECT_IO, bytes: the largest FUSE
/// read request (`max_pages` 256 x 4 KiB pages, `fuse_max_pages_limit`), so
/// buffered readers that size their buffer from it send whole requests.
const DIRECT_IO_BLKSIZE: u32 = 1 << 20;
/// `st_blksize` of every other file, bytes (one page).
const PAGE_BLKSIZE: u32 = 4096;

/// How one open file reads, as told to the kernel in the open reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum IoMode {
    /// Reads come to lakemount, through the page cache or (FOPEN_DIRECT_IO)
    /// past it. Direct-I/O opens count here too: on Linux 6.9+ a MAP_SHARED
    /// mmap of one puts the inode in the kernel's cached I/O mode
    /// (`fuse_file_mmap`, fs/fuse/file.c), which a passthrough open would
    /// conflict with.
    Daemon,
    /// FUSE passthrough: the kernel reads (and for a staged file writes)
    /// the local file itself.
    Passthrough,
}

/// Open files of one inode by I/O mode.
#[derive(Default)]
struct InodeIo {
    /// Opens read through lakemount (page cache or direct I/O).
    daemon: usize,
    passthrough: usize,
    /// While `passthrough > 0`: what every passthrough open of this inode
    /// shares.
    backing: Option<Shared>,
    /// An open of this inode is putting its object in the page cache
    /// ([`fill_page_cache`]); other opens of the inode wait until it is done.
    filling: bool,
}

/// The backing file of an inode's passthrough opens. One inode is one object
/// version, or one staged file, so every open of the inode may share it.
struct Shared {
    id: Arc<BackingId>,
    /// A cached object's: keeps it in the data cache (not evicted) while it
    /// is open. `None` for a staged file's data file.
    _pin: Option<crate::cache::Backing>,
    /// A staged file's data file: which staged file the inode's opens share.
    staged: Option<Arc<std::fs::File>>,
}

/// Per-inode bookkeeping of I/O modes. The kernel fails an open (EIO to the
/// caller) whose mode conflicts with the inode's other open files: a
/// passthrough open while page-cache opens exist, any open but a passthrough
/// one with the same backing file while passthrough opens exist
/// (`fuse_file_io_open` in fs/fuse/iomode.c, Linux 6.9+). So an inode with
/// opens through lakemount (page cache or direct I/O) gets more of them, and
/// one with passthrough opens shares
/// their backing id. An inode never changes version (an overwritten object
/// gets a new inode, [`crate::meta::inode::InodeTable::upsert`]), so sharing
/// never mixes versions.
#[derive(Default)]
struct IoModes {
    inodes: HashMap<u64, InodeIo>,
    /// File handle -> (inode, mode), for release.
    handles: HashMap<u64, (u64, IoMode)>,
}

/// [`IoModes`] behind its lock, with the condition an open waits on while
/// another open of its inode fills the page cache ([`InodeIo::filling`]).
#[derive(Default)]
struct IoTable {
    modes: Mutex<IoModes>,
    fill_ended: Condvar,
}

impl IoTable {
    fn lock(&self) -> MutexGuard<'_, IoModes> {
        self.modes.lock().unwrap()
    }

    /// The table, locked once no open of `ino` is filling its page cache.
    fn lock_unfilled(&self, ino: u64) -> MutexGuard<'_, IoModes> {
        let mut st = self.lock();
        while st.inodes.get(&ino).is_some_and(|e| e.filling) {
            st = self.fill_ended.wait(st).unwrap();
        }
        st
    }

    /// Whether an open of `ino` is filling its page cache now.
    fn filling(&self, ino: u64) -> bool {
        self.lock().inodes.get(&ino).is_some_and(|e| e.filling)
    }

    /// Ends the page-cache fill of `ino` that [`choose_mode`] began.
    fn end_fill(&self, ino: u64) {
        if let Some(e) = self.lock().inodes.get_mut(&ino) {
            e.filling = false;
        }
        self.fill_ended.notify_all();
    }
}

/// An open's page-cache fill of inode `ino` under way: ends it when
/// dropped, on every path (a panic too), so no open of the inode waits for
/// good.
struct Filling<'a> {
    io: &'a IoTable,
    ino: u64,
}

impl Drop for Filling<'_> {
    fn drop(&mut self) {
        self.io.end_fill(self.ino);
    }
}

/// The adapter. Cheap to share: the session threads each hold an `Arc` of it.
pub struct FuseFs<S> {
    fs: Arc<Fs<S>>,
    rt: tokio::runtime::Handle,
    /// What FUSE passthrough is asked of the kernel for (`cache.passthrough`
    /// with a cache; `write.passthrough` on a writable mount).
    want_passthrough: Passthrough,
    /// Passthrough was negotiated at init and backing files can be opened.
    passthrough: Arc<PassthroughOn>,
    io: Arc<IoTable>,
    /// Files of at least this many bytes are opened with FOPEN_DIRECT_IO
    /// (`read.direct_io_min_size`); 0 when off, or when the kernel cannot
    /// mmap such files (no FUSE_DIRECT_IO_ALLOW_MMAP).
    direct_io_min_size: u64,
    /// Which session threads read /dev/fuse: one at a time ([`turns`]).
    turns: Turns,
    /// The session's notifier, set once the session exists
    /// ([`FuseFs::notifier_slot`]).
    notifier: Arc<OnceLock<Notifier>>,
    /// `read.no_open`: opens are answered ENOSYS, and reads (file handle 0)
    /// use a handle per inode kept here.
    no_open: Option<Arc<InodeHandles>>,
}

impl<S: ObjectStore + WriteStore> FuseFs<S> {
    /// Serves `fs`, running every request on `rt`. What `passthrough` names
    /// (fully cached files, staged files) is served by FUSE passthrough when
    /// the kernel allows it.
    /// Files of at least `direct_io_min_size` bytes (0: none) bypass the page
    /// cache when the kernel allows it ([`crate::read::ReadConfig::direct_io_min_size`]).
    /// `session_threads`: how many threads the session reads requests with
    /// (`mount.fuse_threads`). `no_open` (`read.no_open`, read-only mounts):
    /// the kernel is told to send no opens ([`handles`]); no passthrough and
    /// no direct I/O then.
    pub fn new(
        fs: Arc<Fs<S>>,
        rt: tokio::runtime::Handle,
        passthrough: Passthrough,
        direct_io_min_size: u64,
        session_threads: usize,
        no_open: bool,
    ) -> Self {
        let no_open = no_open.then(|| sweep_handles(&fs, &rt));
        let notifier = Arc::new(OnceLock::new());
        if no_open.is_some() {
            push_prefetched(&fs, &notifier, &rt);
        }
        Self {
            fs,
            rt,
            want_passthrough: passthrough,
            passthrough: Arc::new(PassthroughOn::default()),
            io: Arc::new(IoTable::default()),
            direct_io_min_size,
            turns: Turns::new(session_threads, turns::PATIENCE),
            notifier,
            no_open,
        }
    }

    /// Where the session's notifier goes once the session is created
    /// (`fuser::Session::notifier`); until then opens do not fill the page
    /// cache.
    pub fn notifier_slot(&self) -> Arc<OnceLock<Notifier>> {
        self.notifier.clone()
    }

    /// Starts a request of `op` on this session thread: counted, and its
    /// thread's turn taken until the returned value is dropped.
    fn turn(&self, op: &'static str) -> Turn<'_> {
        requested(op);
        self.turns.take()
    }

    fn attr(stat: &Stat, direct_io_min_size: u64) -> FileAttr {
        FileAttr {
            ino: INodeNo(stat.ino),
            size: stat.size,
            blocks: stat.blocks,
            atime: stat.mtime,
            mtime: stat.mtime,
            ctime: stat.mtime,
            crtime: stat.mtime,
            kind: file_type(stat.kind),
            perm: stat.perm,
            nlink: stat.nlink,
            uid: stat.uid,
            gid: stat.gid,
            rdev: 0,
            blksize: if stat.kind == EntryKind::File && is_direct_io(direct_io_min_size, stat.size)
            {
                DIRECT_IO_BLKSIZE
            } else {
                PAGE_BLKSIZE
            },
            flags: 0,
        }
    }
}

impl<S: ObjectStore + WriteStore> FuseFs<S> {
    /// Whether an open for writing (or a truncate) of `ino` would need
    /// another backing file than the one its passthrough opens share: a
    /// cached object's, or a staged file's that is no longer the one staged
    /// under its name (uploaded since). Such a change is refused (ETXTBSY)
    /// before staging touches anything.
    fn write_conflicts(&self, ino: u64) -> bool {
        let shared = {
            let io = self.io.lock();
            match io.inodes.get(&ino).and_then(|e| e.backing.as_ref()) {
                None => return false,
                Some(b) => b.staged.clone(),
            }
        };
        match (shared, self.fs.staged_data_file(ino)) {
            (Some(mine), Some(now)) => !Arc::ptr_eq(&mine, &now),
            _ => true,
        }
    }
}

/// The handle table of a mount without opens, and the task that releases
/// its idle handles every [`handles::SWEEP_EVERY`] until the mount ends.
fn sweep_handles<S: ObjectStore + WriteStore>(
    fs: &Arc<Fs<S>>,
    rt: &tokio::runtime::Handle,
) -> Arc<InodeHandles> {
    let handles = Arc::new(InodeHandles::new(handles::MAX_HANDLES, handles::IDLE));
    let (weak_fs, weak_handles) = (Arc::downgrade(fs), Arc::downgrade(&handles));
    rt.spawn(async move {
        loop {
            tokio::time::sleep(handles::SWEEP_EVERY).await;
            let (Some(fs), Some(handles)) = (weak_fs.upgrade(), weak_handles.upgrade()) else {
                return;
            };
            for fh in handles.sweep() {
                fs.release(fh, || ());
            }
        }
    });
    handles
}

/// A mount without opens with a data cache: each small object read-ahead
/// fetches is put in its inode's page cache (FUSE_NOTIFY_STORE) as it
/// arrives, by a thread of its own, so a loader's read of it needs no
/// request at all. Its own thread: a store waits for page locks a READ of
/// the same file may hold, and that READ's reply must not wait behind it.
fn push_prefetched<S: ObjectStore + WriteStore>(
    fs: &Arc<Fs<S>>,
    notifier: &Arc<OnceLock<Notifier>>,
    rt: &tokio::runtime::Handle,
) {
    let (tx, rx) = std::sync::mpsc::channel::<(u64, String, String, u64, bytes::Bytes)>();
    let tx = Mutex::new(tx);
    let registered = fs.on_small_fetched(move |ino, key, etag, size, bytes| {
        let _ = tx
            .lock()
            .unwrap()
            .send((ino, key.to_string(), etag.to_string(), size, bytes));
    });
    if !registered {
        return;
    }
    let (fs, notifier, rt) = (Arc::downgrade(fs), notifier.clone(), rt.clone());
    let spawned = std::thread::Builder::new()
        .name("lakemount-push".into())
        .spawn(move || {
            // Ending a prefetch may send the next GETs.
            let _rt = rt.enter();
            for (ino, key, etag, size, bytes) in rx {
                let (Some(fs), Some(n)) = (fs.upgrade(), notifier.get()) else {
                    continue;
                };
                if fill_page_cache(n, ino, &bytes) {
                    fs.small_delivered(&key, &etag, size);
                }
            }
        });
    if let Err(e) = spawned {
        warn!("no page-cache push of prefetched objects: {e}");
    }
}

impl<S: ObjectStore + WriteStore> FuseFs<S> {
    /// Answers a started read: on this session thread when its bytes are
    /// ready, else from a runtime task once they are. `done` sees the
    /// outcome before the reply goes out.
    fn answer_read(
        &self,
        pending: crate::read::PendingRead,
        turn: &Turn<'_>,
        reply: ReplyData,
        done: impl FnOnce(&Fs<S>, &Result<bytes::Bytes, FsError>) + Send + 'static,
    ) {
        if let Some(r) = pending.ready().map(crate::fs::read_result) {
            // The kernel copies the reply into the reader's pages on this
            // thread: a large one lets another thread read meanwhile.
            if r.as_ref().is_ok_and(|b| b.len() >= LARGE_REPLY) {
                turn.may_block();
            }
            done(&self.fs, &r);
            return read_reply(reply, r);
        }
        let fs = self.fs.clone();
        self.rt.spawn(async move {
            let r = crate::fs::read_result(pending.finish().await);
            done(&fs, &r);
            read_reply(reply, r)
        });
    }

    /// A read of a mount without opens (`read.no_open`, file handle 0):
    /// with the handle kept for `ino`, or one opened now
    /// ([`Fs::open_version_now`]; on the runtime when the attributes must
    /// be confirmed first). Needs a runtime context.
    fn read_inode(
        &self,
        handles: &Arc<InodeHandles>,
        ino: u64,
        offset: u64,
        size: u32,
        turn: &Turn<'_>,
        reply: ReplyData,
    ) {
        // A read that reached the end of the file may release the handle
        // between its lookup and this read's start: open another.
        loop {
            let h = match handles.get(ino) {
                Some(h) => h,
                None => match self.fs.open_version_now(ino) {
                    Some(Ok(o)) => keep_handle(&self.fs, handles, ino, &o),
                    Some(Err(e)) => return reply.error(errno("read", &e)),
                    None => return self.read_after_open(handles, ino, offset, size, reply),
                },
            };
            match self.fs.begin_read(h.fh, offset, size) {
                Ok(pending) => {
                    if offset == 0 {
                        handles.read_from_start(ino, h.fh);
                    }
                    let handles = handles.clone();
                    let done = move |fs: &Fs<S>, r: &Result<bytes::Bytes, FsError>| {
                        release_at_end(fs, &handles, ino, h, offset, r)
                    };
                    return self.answer_read(pending, turn, reply, done);
                }
                Err(FsError::BadHandle) => continue,
                Err(e) => return reply.error(errno("read", &e)),
            }
        }
    }

    /// [`Self::read_inode`] of an inode whose attributes a listing must
    /// confirm before its handle opens: all of it on the runtime.
    fn read_after_open(
        &self,
        handles: &Arc<InodeHandles>,
        ino: u64,
        offset: u64,
        size: u32,
        reply: ReplyData,
    ) {
        let (fs, handles) = (self.fs.clone(), handles.clone());
        self.rt.spawn(async move {
            // As in `read_inode`: the handle may be released meanwhile.
            loop {
                let h = match handles.get(ino) {
                    Some(h) => h,
                    None => match fs.open_version(ino).await {
                        Ok(o) => keep_handle(&fs, &handles, ino, &o),
                        Err(e) => return reply.error(errno("read", &e)),
                    },
                };
                if offset == 0 {
                    handles.read_from_start(ino, h.fh);
                }
                let r = match fs.read(h.fh, offset, size).await {
                    Err(FsError::BadHandle) => continue,
                    r => r,
                };
                release_at_end(&fs, &handles, ino, h, offset, &r);
                return read_reply(reply, r);
            }
        });
    }
}

/// Keeps the handle `o` opened for `ino`, releasing those it pushes out.
fn keep_handle<S: ObjectStore + WriteStore>(
    fs: &Fs<S>,
    handles: &InodeHandles,
    ino: u64,
    o: &crate::fs::Opened,
) -> handles::Handle {
    let (h, out) = handles.insert(ino, o.fh, o.size);
    for fh in out {
        fs.release(fh, || ());
    }
    h
}

/// After a read of `ino` at `offset` with its kept handle `h`: a read that
/// reached the end of a file the handle also began a read at its start with
/// (the bytes are in the page cache now) or that failed (the next read opens
/// anew, with fresh attributes) releases it.
fn release_at_end<S: ObjectStore + WriteStore>(
    fs: &Fs<S>,
    handles: &InodeHandles,
    ino: u64,
    h: handles::Handle,
    offset: u64,
    r: &Result<bytes::Bytes, FsError>,
) {
    let out = match r {
        Ok(b) if offset + b.len() as u64 >= h.size => handles.remove_at_end(ino, h.fh),
        Ok(_) => None,
        Err(_) => handles.remove(ino, Some(h.fh)),
    };
    if let Some(fh) = out {
        fs.release(fh, || ());
    }
}

impl<S> FuseFs<S> {
    /// What may be served by passthrough now: what was asked, once the
    /// kernel agreed at init.
    fn passthrough_now(&self) -> Passthrough {
        let on = &self.passthrough;
        Passthrough {
            cached: self.want_passthrough.cached && on.cached.load(Ordering::Relaxed),
            staged: self.want_passthrough.staged && on.staged.load(Ordering::Relaxed),
        }
    }
}

/// Logs an error at the level its kind deserves, counts it, and gives the errno.
fn errno(op: &'static str, e: &FsError) -> Errno {
    let code = e.errno();
    if e.is_expected() {
        debug!(op, error = %e, "request failed");
    } else {
        warn!(op, error = %e, "request failed");
    }
    metrics::counter!(m::FUSE_ERRORS, "op" => op, "errno" => code.to_string()).increment(1);
    Errno::from_i32(code)
}

/// Runs `fut` to its end here, on the FUSE session thread, when it needs no
/// waiting (e.g. a lookup answered from a cached listing), else hands it to
/// the runtime `rt`. A hop to a runtime thread and back cost more than such
/// a request itself; a loader sends one lookup per small file.
fn run_here_or_spawn<F>(rt: &tokio::runtime::Handle, fut: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    use futures::FutureExt;
    let _rt = rt.enter();
    let mut fut = Box::pin(fut);
    if fut.as_mut().now_or_never().is_none() {
        // Polled once already: the task's first poll registers its waker.
        rt.spawn(fut);
    }
}

/// Runs `fut` on `rt` and answers `reply` with its outcome (errors counted
/// and logged as `op`).
fn reply_empty<F>(rt: &tokio::runtime::Handle, op: &'static str, reply: ReplyEmpty, fut: F)
where
    F: std::future::Future<Output = Result<(), FsError>> + Send + 'static,
{
    rt.spawn(async move {
        match fut.await {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(op, &e)),
        }
    });
}

/// Counts one FUSE request of `op` (lookup, getattr, open, read, flush,
/// release, ...).
fn requested(op: &'static str) {
    metrics::counter!(m::FUSE_REQUESTS, "op" => op).increment(1);
}

/// Answers a read with its bytes (counted) or its error.
fn read_reply(reply: ReplyData, r: Result<bytes::Bytes, FsError>) {
    match r {
        Ok(data) => {
            metrics::counter!(m::FUSE_READ_BYTES).increment(data.len() as u64);
            reply.data(&data)
        }
        Err(e) => reply.error(errno("read", &e)),
    }
}

/// Answers an xattr request: the size when `size` is 0, the bytes when they
/// fit, ERANGE otherwise (getxattr(2)).
fn xattr_reply(reply: ReplyXattr, value: &[u8], size: u32) {
    if size == 0 {
        reply.size(value.len() as u32);
    } else if value.len() <= size as usize {
        reply.data(value);
    } else {
        reply.error(Errno::ERANGE);
    }
}

/// Whether a file of `size` bytes is read with FOPEN_DIRECT_IO under
/// `read.direct_io_min_size` = `min` (0: never).
fn is_direct_io(min: u64, size: u64) -> bool {
    min > 0 && size >= min
}

/// The kernel's file type of an entry kind.
fn file_type(kind: EntryKind) -> FileType {
    match kind {
        EntryKind::File => FileType::RegularFile,
        EntryKind::Dir => FileType::Directory,
    }
}

/// How the kernel is to serve one open.
enum Served<'a> {
    /// Through lakemount; with `fill`, this open may put `Opened::fill` in
    /// the page cache, and other opens of the inode wait until it is dropped.
    Daemon {
        fill: Option<Filling<'a>>,
    },
    Passthrough(Arc<BackingId>),
    /// The inode's passthrough opens are of another file: this open cannot
    /// join them, nor be served by lakemount beside them (the kernel would
    /// fail it with EIO, `fuse_file_io_open` in fs/fuse/iomode.c). ETXTBSY.
    /// Writers are refused before they stage anything
    /// ([`FuseFs::write_conflicts`]); this is the answer to a race with it.
    Busy,
}

/// Chooses the I/O mode [`IoModes`] allows for open `o` of `ino` and
/// records it; `open_backing` registers a backing file with the kernel. A
/// passthrough open of a staged file is told to `fs` before the reply. A
/// refused open ([`Served::Busy`]) is released in `fs`. Waits while another
/// open of `ino` fills its page cache. `may_fill`: the open would put its
/// object in the page cache; it may when no other open of the inode is
/// live, so that no read of it holds page locks the store would wait for
/// (that read may be waiting for the very thread storing).
fn choose_mode<'a, S: ObjectStore + WriteStore>(
    fs: &Fs<S>,
    ino: u64,
    o: &mut crate::fs::Opened,
    io: &'a IoTable,
    on: &PassthroughOn,
    may_fill: bool,
    open_backing: impl FnOnce(&std::fs::File) -> std::io::Result<BackingId>,
) -> Served<'a> {
    let mut st = io.lock_unfilled(ino);
    let e = st.inodes.entry(ino).or_default();
    let cached = o.backing.take();
    let staged = o.staged.take();
    let shared = match (&e.backing, o.local) {
        _ if e.daemon > 0 => None,
        (None, false) => cached.and_then(|b| {
            let id = registered(open_backing(&b.file), &on.cached, "cache")?;
            Some(e.share(id, Some(b), None))
        }),
        (None, true) => staged.filter(|s| s.may_start).and_then(|s| {
            let id = registered(open_backing(&s.file), &on.staged, "staging")?;
            Some(e.share(id, None, Some(s.file)))
        }),
        // One inode is one object version: its cached file, or the staged
        // file it was uploaded from (unchanged since: no writer is left).
        (Some(b), false) => Some(b.id.clone()),
        (Some(b), true) => match (&b.staged, &staged) {
            (Some(mine), Some(s)) if Arc::ptr_eq(mine, &s.file) => Some(b.id.clone()),
            _ => {
                drop(st);
                fs.release(o.fh, || {});
                return Served::Busy;
            }
        },
    };
    let mode = if shared.is_some() {
        e.passthrough += 1;
        IoMode::Passthrough
    } else {
        e.daemon += 1;
        IoMode::Daemon
    };
    let fill = may_fill && e.daemon == 1 && e.passthrough == 0;
    if fill {
        e.filling = true;
    }
    st.handles.insert(o.fh, (ino, mode));
    metrics::gauge!(m::FUSE_OPEN_FILES).set(st.handles.len() as f64);
    drop(st);
    let fill = fill.then_some(Filling { io, ino });
    match shared {
        Some(id) => {
            if o.local {
                fs.passthrough_opened(o.fh);
                metrics::counter!(m::WRITE_PASSTHROUGH_OPENS).increment(1);
                debug!(ino, "open: FUSE passthrough to the staged file");
            } else {
                metrics::counter!(m::CACHE_PASSTHROUGH_OPENS).increment(1);
                debug!(ino, "open: FUSE passthrough to the cached file");
            }
            Served::Passthrough(id)
        }
        None => Served::Daemon { fill },
    }
}

/// The open flags of an open served through lakemount: an object of at
/// least `direct_io_min_size` bytes gets FOPEN_DIRECT_IO.
fn daemon_flags(o: &crate::fs::Opened, direct_io_min_size: u64) -> FopenFlags {
    let mut flags = FopenFlags::empty();
    if !o.local && is_direct_io(direct_io_min_size, o.size) {
        metrics::counter!(m::FUSE_DIRECT_IO_OPENS).increment(1);
        flags |= FopenFlags::FOPEN_DIRECT_IO;
    }
    // With direct I/O too: without it the open would drop the file's pages,
    // unmapping them from live mmaps of this version. (An mmap of a
    // direct-I/O file drops them itself, at each mmap: `fuse_file_mmap`
    // calls invalidate_inode_pages2.)
    if o.keep_cache {
        flags |= FopenFlags::FOPEN_KEEP_CACHE;
    }
    flags
}

/// What serving an open needs besides the file system.
struct Serving<'a> {
    /// The inodes' I/O modes.
    io: &'a IoTable,
    /// Whether passthrough is on.
    on: &'a PassthroughOn,
    /// [`FuseFs::direct_io_min_size`].
    direct_io_min_size: u64,
    /// Fills the page cache with a small object's bytes ([`fill_page_cache`]).
    notifier: Option<&'a Notifier>,
    /// On a session thread: lets a parked thread read while this open waits
    /// for another's page-cache fill ([`Turn::may_block`]).
    turn: Option<&'a Turn<'a>>,
}

/// Answers an open with the I/O mode [`IoModes`] allows, and records it.
fn open_reply<S: ObjectStore + WriteStore>(
    fs: &Fs<S>,
    reply: ReplyOpen,
    ino: u64,
    mut o: crate::fs::Opened,
    how: &Serving<'_>,
) {
    let fh = FileHandle(o.fh);
    // Not for direct I/O: its reads bypass the page cache.
    let fill = match (how.notifier, o.fill.take()) {
        (Some(n), Some(bytes)) if !is_direct_io(how.direct_io_min_size, o.size) => Some((n, bytes)),
        _ => None,
    };
    let open_backing = |f: &std::fs::File| reply.open_backing(f);
    // The open is about to wait for another's store: let a parked session
    // thread read meanwhile.
    if let Some(t) = how.turn.filter(|_| how.io.filling(ino)) {
        t.may_block();
    }
    match choose_mode(
        fs,
        ino,
        &mut o,
        how.io,
        how.on,
        fill.is_some(),
        open_backing,
    ) {
        Served::Passthrough(id) => reply.opened_passthrough(fh, FopenFlags::empty(), &id),
        Served::Daemon { fill: filling } => {
            let mut flags = daemon_flags(&o, how.direct_io_min_size);
            if let (Some(filling), Some((n, bytes))) = (filling, &fill) {
                if fill_page_cache(n, ino, bytes) {
                    flags |= FopenFlags::FOPEN_KEEP_CACHE;
                }
                drop(filling);
            }
            reply.opened(fh, flags)
        }
        Served::Busy => reply.error(errno("open", &FsError::Busy)),
    }
}

/// Puts all of a small object's `bytes` in the kernel page cache of `ino`
/// (FUSE_NOTIFY_STORE) before its open is answered, so that the open may keep
/// the page cache and its reads need no request. Only for an open that no
/// other open of the inode shares ([`choose_mode`]). Returns whether the
/// kernel took them all. On an error the open keeps the page cache only if
/// it held this same version already (`Opened::keep_cache`); else the open
/// drops whatever part was stored. fuser reports the kernel's ENOENT (no
/// such inode in its cache) as success; an inode being opened is in it.
fn fill_page_cache(notifier: &Notifier, ino: u64, bytes: &bytes::Bytes) -> bool {
    let ok = match notifier.store(INodeNo(ino), 0, bytes) {
        Ok(()) => true,
        Err(e) => {
            debug!(ino, "page cache fill refused: {e}");
            false
        }
    };
    let result = if ok { "ok" } else { "failed" };
    metrics::counter!(m::PAGE_CACHE_FILLS, "result" => result).increment(1);
    ok
}

/// The backing id of a registered backing file, or `None` (said by
/// [`backing_failed`]) when it could not be.
fn registered(r: std::io::Result<BackingId>, on: &AtomicBool, dir: &str) -> Option<Arc<BackingId>> {
    r.map_err(|err| backing_failed(&err, on, dir))
        .ok()
        .map(Arc::new)
}

impl InodeIo {
    /// Makes `id` the backing every passthrough open of this inode shares.
    fn share(
        &mut self,
        id: Arc<BackingId>,
        pin: Option<crate::cache::Backing>,
        staged: Option<Arc<std::fs::File>>,
    ) -> Arc<BackingId> {
        self.backing = Some(Shared {
            id: id.clone(),
            _pin: pin,
            staged,
        });
        id
    }
}

/// A backing file could not be registered (`FUSE_DEV_IOC_BACKING_OPEN`): this
/// open reads through lakemount. Unless the cause is passing (out of file
/// descriptors or memory), passthrough of files of that directory (`dir`:
/// cache, staging) is turned off for the mount, said once.
fn backing_failed(err: &std::io::Error, on: &AtomicBool, dir: &str) {
    let passing = matches!(
        err.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM)
    );
    if passing {
        debug!("FUSE passthrough not possible for this open ({err}): read through lakemount");
    } else if on.swap(false, Ordering::Relaxed) {
        info!(
            "FUSE passthrough unavailable for the {dir} directory's files ({err}; it needs \
             CAP_SYS_ADMIN, and the directory on a local file system that is not itself \
             stacked, e.g. not overlayfs): they are served through lakemount"
        );
    }
}

/// Which kinds of FUSE passthrough are in force: both set at init when the
/// kernel agrees; each turned off for good when its backing files cannot be
/// registered (its directory on a stacked file system, say).
#[derive(Default)]
struct PassthroughOn {
    /// Fully cached files.
    cached: AtomicBool,
    /// Staged files.
    staged: AtomicBool,
}

impl<S: ObjectStore + WriteStore> fuser::Filesystem for FuseFs<S> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if self.no_open.is_some()
            && !config
                .capabilities()
                .contains(InitFlags::FUSE_NO_OPEN_SUPPORT)
        {
            // An ENOSYS open would fail every open on this kernel.
            warn!(
                "read.no_open: the kernel lacks FUSE no-open support (Linux 4.19+); opens stay on"
            );
            self.no_open = None;
        }
        let _ = config.set_max_readahead(MAX_READAHEAD);
        let _ = config.set_max_background(MAX_BACKGROUND);
        // READDIRPLUS on every readdir call, not READDIRPLUS_AUTO: with AUTO
        // the kernel falls back to plain readdir after a directory's first
        // batch unless lookups came in between, and a loader that lists
        // first and opens later then sends one lookup per file.
        if self.fs.writable()
            && let Err(missing) = config.add_capabilities(InitFlags::FUSE_ATOMIC_O_TRUNC)
        {
            // Without it the kernel sends open then setattr(size 0): an
            // object opened with O_TRUNC would be copied in first.
            debug!(?missing, "kernel lacks FUSE_ATOMIC_O_TRUNC");
        }
        // The daemon kills suid/sgid and capabilities itself: it has none to
        // kill (modes are the mount's, setattr ignores chmod, no security
        // xattrs). Without it the kernel asks for `security.capability` (a
        // getxattr round trip) before every write; with it the superblock is
        // SB_NOSEC and the kernel stops asking after a file's first write
        // (process_init_reply, fs/fuse/inode.c).
        if self.fs.writable()
            && let Err(missing) = config.add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2)
        {
            debug!(?missing, "kernel lacks FUSE_HANDLE_KILLPRIV_V2");
        }
        for cap in [
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_PARALLEL_DIROPS,
        ] {
            if let Err(missing) = config.add_capabilities(cap) {
                debug!(?missing, "kernel lacks FUSE capability");
            }
        }
        if self.direct_io_min_size > 0
            && config
                .add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
                .is_err()
        {
            // MAP_SHARED of an FOPEN_DIRECT_IO file fails with ENODEV
            // without it (fuse_file_mmap), and loaders mmap shards.
            self.direct_io_min_size = 0;
            info!(
                "kernel lacks FUSE_DIRECT_IO_ALLOW_MMAP (Linux 6.6+): every file is read \
                 through the page cache (read.direct_io_min_size ignored)"
            );
        }
        if self.want_passthrough != Passthrough::default() {
            // Backing files on a plain local file system: stack depth 1
            // (FILESYSTEM_MAX_STACK_DEPTH is 2, include/linux/fs.h).
            match config.add_capabilities(InitFlags::FUSE_PASSTHROUGH) {
                Ok(()) if config.set_max_stack_depth(1).is_ok() => {
                    self.passthrough.cached.store(true, Ordering::Relaxed);
                    self.passthrough.staged.store(true, Ordering::Relaxed);
                    debug!(want = ?self.want_passthrough, "FUSE passthrough on");
                }
                _ => info!(
                    "kernel lacks FUSE passthrough (Linux 6.9+, CONFIG_FUSE_PASSTHROUGH): \
                     cached and staged files are served through lakemount"
                ),
            }
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _turn = self.turn("lookup");
        let fs = self.fs.clone();
        let name = name.to_owned();
        let direct = self.direct_io_min_size;
        run_here_or_spawn(&self.rt, async move {
            match fs.lookup(parent.0, &name).await {
                Ok(stat) => {
                    reply.entry(&fs.kernel_ttl(), &Self::attr(&stat, direct), Generation(0))
                }
                Err(FsError::NotFound) if !fs.negative_ttl().is_zero() => {
                    // Node id 0 is a negative entry: the kernel answers ENOENT
                    // itself for the TTL (fuse_lookup_name in fs/fuse/dir.c).
                    let mut attr = Self::attr(&fs.root_stat(), direct);
                    attr.ino = INodeNo(0);
                    reply.entry(&fs.negative_ttl(), &attr, Generation(0))
                }
                Err(e) => reply.error(errno("lookup", &e)),
            }
        });
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        // No turn: a batch forget calls this once per inode, and a thread
        // must park only at the end of its request.
        requested("forget");
        self.fs.forget(ino.0, nlookup);
        if let Some(fh) = self.no_open.as_ref().and_then(|h| h.remove(ino.0, None)) {
            self.fs.release(fh, || ());
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let _turn = self.turn("getattr");
        if let Some(stat) = fh.and_then(|fh| self.fs.local_stat(ino.0, fh.0)) {
            return reply.attr(&self.fs.kernel_ttl(), &Self::attr(&stat, 0));
        }
        let fs = self.fs.clone();
        let direct = self.direct_io_min_size;
        run_here_or_spawn(&self.rt, async move {
            match fs.getattr(ino.0).await {
                Ok(stat) => reply.attr(&fs.kernel_ttl(), &Self::attr(&stat, direct)),
                Err(e) => reply.error(errno("getattr", &e)),
            }
        });
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let turn = self.turn("open");
        let write = flags.acc_mode() != OpenAccMode::O_RDONLY
            || flags.0 & (libc::O_TRUNC | libc::O_APPEND) != 0;
        let truncate = flags.0 & libc::O_TRUNC != 0;
        if self.no_open.is_some() && !write {
            // The kernel sends no open or release again, and keeps the page
            // cache of every file across opens: an inode is one object
            // version, so kept pages are never of another one.
            return reply.error(Errno::ENOSYS);
        }
        if write && self.write_conflicts(ino.0) {
            return reply.error(errno("open", &FsError::Busy));
        }
        // Answered here, on the session thread, when the attributes are
        // fresh (no listing to wait for): a loader opens each small file
        // once, and a hop to the runtime and back was most of an open's cost.
        let _rt = self.rt.enter();
        let want = self.passthrough_now();
        if let Some(r) = self
            .fs
            .try_open_now(ino.0, write, want.cached, || turn.may_block())
        {
            return match r {
                Ok(o) => {
                    let how = Serving {
                        io: &self.io,
                        on: &self.passthrough,
                        direct_io_min_size: self.direct_io_min_size,
                        notifier: self.notifier.get(),
                        turn: Some(&turn),
                    };
                    open_reply(&self.fs, reply, ino.0, o, &how)
                }
                Err(e) => reply.error(errno("open", &e)),
            };
        }
        let fs = self.fs.clone();
        let passthrough = self.passthrough.clone();
        let io = self.io.clone();
        let direct = self.direct_io_min_size;
        let notifier = self.notifier.clone();
        self.rt.spawn(async move {
            match fs.open(ino.0, write, truncate, want).await {
                Ok(o) => {
                    let how = Serving {
                        io: &io,
                        on: &passthrough,
                        direct_io_min_size: direct,
                        notifier: notifier.get(),
                        turn: None,
                    };
                    open_reply(&fs, reply, ino.0, o, &how)
                }
                Err(e) => reply.error(errno("open", &e)),
            }
        });
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let turn = self.turn("read");
        let _rt = self.rt.enter();
        if let (Some(handles), 0) = (&self.no_open, fh.0) {
            return self.read_inode(handles, ino.0, offset, size, &turn, reply);
        }
        // Planned here, on the session thread: when the bytes are already
        // read ahead (the usual case of a sequential reader) the reply goes
        // out at once, without waking a runtime thread; otherwise a task
        // waits for them. A staged file is read from local disk here.
        if let Some(r) = self.fs.read_local(fh.0, offset, size, || turn.may_block()) {
            return read_reply(reply, r);
        }
        match self.fs.begin_read(fh.0, offset, size) {
            Ok(pending) => self.answer_read(pending, &turn, reply, |_, _| ()),
            Err(e) => reply.error(errno("read", &e)),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let turn = self.turn("release");
        // The last writer's close queues an upload task.
        let _rt = self.rt.enter();
        self.fs.release(fh.0, || turn.may_block());
        let mut io = self.io.lock();
        if let Some((ino, mode)) = io.handles.remove(&fh.0)
            && let Some(e) = io.inodes.get_mut(&ino)
        {
            match mode {
                IoMode::Daemon => e.daemon -= 1,
                IoMode::Passthrough => {
                    e.passthrough -= 1;
                    if e.passthrough == 0 {
                        e.backing = None;
                    }
                }
            }
            if e.daemon == 0 && e.passthrough == 0 {
                io.inodes.remove(&ino);
            }
        }
        metrics::gauge!(m::FUSE_OPEN_FILES).set(io.handles.len() as f64);
        drop(io);
        reply.ok();
    }

    /// Nothing to flush on a read-only mount: ENOSYS tells the kernel so,
    /// and it sends no FLUSH again for the life of the mount (`no_flush` in
    /// `fuse_flush`, fs/fuse/file.c): one round trip fewer per close, which
    /// a loader makes once per small file.
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let _turn = self.turn("flush");
        reply.error(Errno::ENOSYS);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _turn = self.turn("opendir");
        let fs = self.fs.clone();
        self.rt.spawn(async move {
            match fs.opendir(ino.0).await {
                Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
                Err(e) => reply.error(errno("opendir", &e)),
            }
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _turn = self.turn("readdir");
        match self
            .fs
            .readdir(ino.0, fh.0, offset, READDIR_REPLY_BYTES, false)
        {
            Ok(entries) => {
                for e in entries {
                    let kind = file_type(e.stat.kind);
                    if reply.add(INodeNo(e.stat.ino), e.offset, kind, &e.name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(errno("readdir", &e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let _turn = self.turn("readdirplus");
        match self
            .fs
            .readdir(ino.0, fh.0, offset, READDIR_REPLY_BYTES, true)
        {
            Ok(entries) => {
                let ttl = self.fs.kernel_ttl();
                let mut full = false;
                for e in entries {
                    let counted = e.name != "." && e.name != "..";
                    if !full {
                        full = reply.add(
                            INodeNo(e.stat.ino),
                            e.offset,
                            &e.name,
                            &ttl,
                            &Self::attr(&e.stat, self.direct_io_min_size),
                            Generation(0),
                        );
                    }
                    if full && counted {
                        // Not sent: the kernel will not count this lookup.
                        self.fs.forget(e.stat.ino, 1);
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(errno("readdirplus", &e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let _turn = self.turn("releasedir");
        self.fs.releasedir(fh.0);
        reply.ok();
    }

    /// No ioctl is supported: ENOTTY, the answer of a regular file on any
    /// local file system. Python's `open()` asks `isatty()` (TCGETS) of every
    /// file it opens; fuser's default answer logged a warning each time.
    #[allow(clippy::too_many_arguments)]
    fn ioctl(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        let _turn = self.turn("ioctl");
        if self.no_open.is_some() {
            // Ending a push may send the next prefetch GETs.
            let _rt = self.rt.enter();
            self.fs.small_consumed(ino.0);
        }
        debug!(ino = ino.0, cmd, "ioctl: not supported (ENOTTY)");
        reply.error(Errno::ENOTTY);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _turn = self.turn("getxattr");
        let fs = self.fs.clone();
        let name = name.to_string_lossy().into_owned();
        self.rt.spawn(async move {
            match fs.xattr(ino.0, &name).await {
                Ok(v) => xattr_reply(reply, v.as_bytes(), size),
                Err(e) => reply.error(errno("getxattr", &e)),
            }
        });
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _turn = self.turn("listxattr");
        let mut buf = Vec::new();
        for n in self.fs.xattr_names(ino.0) {
            buf.extend_from_slice(n.as_bytes());
            buf.push(0);
        }
        xattr_reply(reply, &buf, size);
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let _turn = self.turn("create");
        let fs = self.fs.clone();
        let name = name.to_owned();
        let io = self.io.clone();
        let passthrough = self.passthrough.clone();
        let want = self.passthrough_now().staged;
        self.rt.spawn(async move {
            match fs.create(parent.0, &name, flags, want).await {
                Ok((stat, mut o)) => {
                    let (ttl, attr) = (fs.kernel_ttl(), Self::attr(&stat, 0));
                    let fh = FileHandle(o.fh);
                    let open_backing = |f: &std::fs::File| reply.open_backing(f);
                    match choose_mode(
                        &fs,
                        stat.ino,
                        &mut o,
                        &io,
                        &passthrough,
                        false,
                        open_backing,
                    ) {
                        Served::Passthrough(id) => reply.created_passthrough(
                            &ttl,
                            &attr,
                            Generation(0),
                            fh,
                            FopenFlags::empty(),
                            &id,
                        ),
                        Served::Daemon { .. } => {
                            reply.created(&ttl, &attr, Generation(0), fh, FopenFlags::empty())
                        }
                        Served::Busy => reply.error(errno("create", &FsError::Busy)),
                    }
                }
                Err(e) => reply.error(errno("create", &e)),
            }
        });
    }

    /// Written on the session thread: a write is one pwrite to staging on
    /// local disk, cheaper than a hop to the runtime.
    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let turn = self.turn("write");
        turn.may_block();
        // A filled part may start its upload task.
        let _rt = self.rt.enter();
        match self.fs.write(fh.0, offset, data) {
            Ok(n) => {
                metrics::counter!(m::FUSE_WRITE_BYTES).increment(n as u64);
                reply.written(n)
            }
            Err(e) => reply.error(errno("write", &e)),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _turn = self.turn("fsync");
        let fs = self.fs.clone();
        reply_empty(
            &self.rt,
            "fsync",
            reply,
            async move { fs.fsync(fh.0).await },
        );
    }

    /// Directories hold nothing to sync: every change is in S3 or staging
    /// as soon as it is answered.
    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _turn = self.turn("fsyncdir");
        reply.ok();
    }

    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _turn = self.turn("setattr");
        if !self.fs.writable() {
            return reply.error(errno("setattr", &FsError::ReadOnly));
        }
        if size.is_some() && self.write_conflicts(ino.0) {
            return reply.error(errno("setattr", &FsError::Busy));
        }
        let mtime = mtime.map(|t| match t {
            TimeOrNow::SpecificTime(t) => t,
            TimeOrNow::Now => std::time::SystemTime::now(),
        });
        let fs = self.fs.clone();
        self.rt.spawn(async move {
            match fs.setattr(ino.0, size, mtime).await {
                Ok(stat) => reply.attr(&fs.kernel_ttl(), &Self::attr(&stat, 0)),
                Err(e) => reply.error(errno("setattr", &e)),
            }
        });
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let _turn = self.turn("mkdir");
        let fs = self.fs.clone();
        let name = name.to_owned();
        self.rt.spawn(async move {
            match fs.mkdir(parent.0, &name).await {
                Ok(stat) => reply.entry(&fs.kernel_ttl(), &Self::attr(&stat, 0), Generation(0)),
                Err(e) => reply.error(errno("mkdir", &e)),
            }
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _turn = self.turn("unlink");
        let fs = self.fs.clone();
        let name = name.to_owned();
        reply_empty(&self.rt, "unlink", reply, async move {
            fs.unlink(parent.0, &name).await
        });
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _turn = self.turn("rmdir");
        let fs = self.fs.clone();
        let name = name.to_owned();
        reply_empty(&self.rt, "rmdir", reply, async move {
            fs.rmdir(parent.0, &name).await
        });
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _turn = self.turn("rename");
        let fs = self.fs.clone();
        let (name, newname) = (name.to_owned(), newname.to_owned());
        reply_empty(&self.rt, "rename", reply, async move {
            fs.rename(parent.0, &name, newparent.0, &newname, flags.bits())
                .await
        });
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let _turn = self.turn("statfs");
        reply.statfs(
            STATFS_BLOCKS,
            STATFS_BLOCKS,
            STATFS_BLOCKS,
            STATFS_FILES,
            STATFS_FILES,
            STATFS_BSIZE,
            crate::meta::names::NAME_MAX as u32,
            STATFS_BSIZE,
        );
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        let _turn = self.turn("access");
        reply.ok();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    /// An open of an inode whose page cache another open is filling waits
    /// until that fill ends, however it ends (a panic too); opens of other
    /// inodes do not wait.
    #[test]
    fn an_open_waits_for_another_opens_fill_of_its_inode() {
        let io = IoTable::default();
        io.lock().inodes.entry(7).or_default().filling = true;
        let through = AtomicBool::new(false);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                drop(io.lock_unfilled(7));
                through.store(true, Ordering::SeqCst);
            });
            assert!(io.filling(7) && !io.filling(8));
            drop(io.lock_unfilled(8));
            std::thread::sleep(Duration::from_millis(100));
            assert!(!through.load(Ordering::SeqCst), "went on during the fill");
            let filler = s.spawn(|| {
                let _fill = Filling { io: &io, ino: 7 };
                panic!("the store panicked");
            });
            assert!(filler.join().is_err());
            waiter.join().unwrap();
        });
        assert!(through.load(Ordering::SeqCst));
        assert!(!io.lock().inodes[&7].filling);
    }
}
