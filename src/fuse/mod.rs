//! The FUSE adapter: implements `fuser::Filesystem` over [`Fs`]. A handler
//! that may wait (on the network, the disk cache) hands its request to the
//! tokio runtime and replies from there, so no FUSE session thread ever waits
//! on the network; what needs no waiting is answered on the session thread
//! itself: a read whose bytes are already read ahead, an open with fresh
//! attributes, a lookup or getattr from cached metadata. This module and its
//! submodules are the only ones that touch fuser's request and reply types:
//! [`iomode`] (the I/O mode of each open file and the open replies),
//! [`noopen`] (reads of a mount without opens), [`handles`] (its handle per
//! inode) and [`turns`] (one session thread reads requests from the kernel
//! at a time).

use std::ffi::OsStr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use fuser::{
    BsdFileFlags, Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo,
    InitFlags, IoctlFlags, KernelConfig, LockOwner, Notifier, OpenAccMode, OpenFlags, RenameFlags,
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyIoctl, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use tracing::{debug, info, warn};

use crate::fs::{Fs, FsError, Passthrough, Stat};
use crate::meta::EntryKind;
use crate::read::small::Sign;
use crate::store::{ObjectStore, WriteStore};
use crate::telemetry::metrics as m;

mod handles;
mod iomode;
mod noopen;
mod turns;
use handles::InodeHandles;
use iomode::{IoTable, PassthroughOn, Served, Serving, SharedBacking, choose_mode, open_reply};
use noopen::{push_prefetched, sweep_handles};
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

/// How long an open, create or truncate waits for the releases of closed
/// opens that would refuse it ([`write_conflicts`], [`stage_gate`],
/// [`IoTable::refuses`]) before it fails with ETXTBSY. The kernel queues a
/// RELEASE as a background request, behind at most [`MAX_BACKGROUND`]
/// others (READs waiting on S3 among them); a reader still holding the file
/// open is refused after this wait.
const RELEASE_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

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

    /// The answer to a request for what S3 has no place for (`op` of
    /// `name` at inode `ino`): `errno`, and one debug log line where
    /// fuser's defaults log a multi-line warning each time (every `ln` or
    /// `cp -a` would print one).
    fn refused(&self, op: &'static str, ino: u64, name: &OsStr, why: &str, errno: Errno) -> Errno {
        let _turn = self.turn(op);
        debug!(ino, ?name, "{op} refused: {why}");
        errno
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

/// Whether an open for writing (or a truncate) of `ino` would need another
/// backing file than the one its passthrough opens share: a cached
/// object's, or a staged file's that is no longer the one staged under its
/// name (uploaded since). Such a change is refused (ETXTBSY) before staging
/// touches anything, once [`released`] has waited for those opens.
fn write_conflicts<S: ObjectStore + WriteStore>(io: &IoTable, fs: &Fs<S>, ino: u64) -> bool {
    match io.shared_backing(ino) {
        None => false,
        Some(SharedBacking::Cached) => true,
        Some(SharedBacking::Staged(mine)) => fs
            .staged_data_file(ino)
            .is_none_or(|now| !Arc::ptr_eq(&mine, &now)),
    }
}

/// Waits up to [`RELEASE_GRACE`] while `conflicts` holds: for the releases
/// of closed opens that make a write of an inode conflict
/// ([`write_conflicts`]), or that refuse an open ([`IoTable::refuses`]).
/// Returns whether it stopped holding. close(2) returns before the kernel
/// sends a handle's RELEASE (in the background: `fuse_file_put` in
/// fs/fuse/file.c), so a file reopened for writing right after a reader
/// closed it (its passthrough open of a staged file since uploaded) would
/// otherwise meet that closed handle. On the runtime: the RELEASE needs a
/// session thread.
async fn released(conflicts: impl Fn() -> bool) -> bool {
    let until = tokio::time::Instant::now() + RELEASE_GRACE;
    while conflicts() {
        if tokio::time::Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    true
}

/// The [`crate::fs::StageGate`] of a write, create or truncate: an object is staged
/// anew only once the opens that make writing its inode conflict
/// ([`write_conflicts`]) are released ([`released`]). The check before the
/// request reaches `fs` cannot see a staged file uploaded meanwhile.
fn stage_gate<S: ObjectStore + WriteStore>(
    io: &Arc<IoTable>,
    fs: &Arc<Fs<S>>,
) -> impl Fn(u64) -> futures::future::BoxFuture<'static, bool> + Send + Sync + use<S> {
    let (io, fs) = (io.clone(), fs.clone());
    move |ino| {
        let (io, fs) = (io.clone(), fs.clone());
        Box::pin(async move { released(|| write_conflicts(&io, &fs, ino)).await })
    }
}

impl<S: ObjectStore + WriteStore> FuseFs<S> {
    /// Answers a started read of `ino`: on this session thread when its
    /// bytes are ready, else from a runtime task once they are. `done` sees
    /// the outcome before the reply goes out. A read that finds the object
    /// changed or gone in S3 tells the file system ([`Fs::object_changed`]).
    fn answer_read(
        &self,
        ino: u64,
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
            if r.as_ref().is_err_and(FsError::is_changed_object) {
                self.fs.object_changed(ino);
            }
            done(&self.fs, &r);
            return read_reply(reply, r);
        }
        let fs = self.fs.clone();
        self.rt.spawn(async move {
            let r = crate::fs::read_result(pending.finish().await);
            if r.as_ref().is_err_and(FsError::is_changed_object) {
                fs.object_changed(ino);
            }
            done(&fs, &r);
            read_reply(reply, r)
        });
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
        if self.no_open.is_some() {
            // Only once the kernel keeps page caches across opens: with
            // opens, a push would be dropped at the next open.
            push_prefetched(&self.fs, &self.notifier, &self.rt);
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
        let no_open = self.no_open.is_some();
        run_here_or_spawn(&self.rt, async move {
            match fs.lookup(parent.0, &name).await {
                Ok(stat) => {
                    if no_open && fs.small_wants_read_signal() {
                        // An expired entry: the loader opens the file by
                        // name, and the reply refreshes its attributes, so
                        // no GETATTR follows; this is the sign.
                        fs.small_consumed(stat.ino, Sign::Kernel);
                    }
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
        if self.no_open.is_some() && self.fs.small_wants_read_signal() {
            // A pushed object's attributes are made stale when the loader
            // sends no other request per file (noopen.rs): this is its sign.
            let _rt = self.rt.enter();
            self.fs.small_consumed(ino.0, Sign::Kernel);
        }
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
        if write && !self.fs.writable() {
            return reply.error(errno("open", &FsError::ReadOnly));
        }
        // Waited for on the runtime (below).
        let conflicts = write && write_conflicts(&self.io, &self.fs, ino.0);
        // Answered here, on the session thread, when the attributes are
        // fresh (no listing to wait for): a loader opens each small file
        // once, and a hop to the runtime and back was most of an open's cost.
        let _rt = self.rt.enter();
        let want = self.passthrough_now();
        if let Some(r) = (!conflicts)
            .then(|| {
                self.fs
                    .try_open_now(ino.0, write, want.cached, || turn.may_block())
            })
            .flatten()
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
            if conflicts && !released(|| write_conflicts(&io, &fs, ino.0)).await {
                return reply.error(errno("open", &FsError::Busy));
            }
            let gate = stage_gate(&io, &fs);
            match fs.open(ino.0, write, truncate, want, &gate).await {
                Ok(o) => {
                    // A staged file uploaded since `conflicts` was checked
                    // is staged anew by this open: the closed opens of the
                    // uploaded one may not be released yet.
                    released(|| io.refuses(ino.0, &o)).await;
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
            Ok(pending) => self.answer_read(ino.0, pending, &turn, reply, |_, _| ()),
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
        self.io.release(fh.0);
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
                let kernel_ttl = self.fs.kernel_ttl();
                let mut full = false;
                for e in entries {
                    let counted = e.name != "." && e.name != "..";
                    if !full {
                        // One TTL for entry and attributes: a pushed file
                        // whose sign is asked for gets none, so its open
                        // sends a LOOKUP (noopen.rs).
                        let ttl = match &self.no_open {
                            Some(_) if counted => self.fs.attr_ttl(e.stat.ino),
                            _ => kernel_ttl,
                        };
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
            self.fs.small_consumed(ino.0, Sign::Own);
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
            let gate = stage_gate(&io, &fs);
            match fs.create(parent.0, &name, flags, want, &gate).await {
                Ok((stat, mut o)) => {
                    // An existing name opened (its entry was not cached)
                    // may meet closed opens not released yet, as in `open`.
                    released(|| io.refuses(stat.ino, &o)).await;
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
        fh: Option<FileHandle>,
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
        // Through a write handle (ftruncate) the change is to that
        // handle's file, which its passthrough opens share already.
        // (An orphaned file, `Fs::setattr`, has no other opens to wait for.)
        let fh = fh.map(|f| f.0);
        let own = fh.is_some_and(|fh| self.fs.write_handle_file(fh).is_some());
        let conflicts = size.is_some() && !own && write_conflicts(&self.io, &self.fs, ino.0);
        let mtime = mtime.map(|t| match t {
            TimeOrNow::SpecificTime(t) => t,
            TimeOrNow::Now => std::time::SystemTime::now(),
        });
        let fs = self.fs.clone();
        let io = self.io.clone();
        self.rt.spawn(async move {
            if conflicts && !released(|| write_conflicts(&io, &fs, ino.0)).await {
                return reply.error(errno("setattr", &FsError::Busy));
            }
            let gate = stage_gate(&io, &fs);
            match fs.setattr(ino.0, fh, size, mtime, &gate).await {
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

    // Refusals of what S3 has no place for ([`FuseFs::refused`]).

    /// Device files and FIFOs: EPERM.
    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(self.refused(
            "mknod",
            parent.0,
            name,
            "no special files in S3",
            Errno::EPERM,
        ));
    }

    /// Symbolic links: EPERM.
    fn symlink(
        &self,
        _req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        _target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        reply.error(self.refused(
            "symlink",
            parent.0,
            link_name,
            "no links in S3",
            Errno::EPERM,
        ));
    }

    /// Hard links: EPERM.
    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        _newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(self.refused("link", ino.0, newname, "no links in S3", Errno::EPERM));
    }

    /// Extended attributes cannot be set: ENOSYS, which the kernel keeps
    /// for the mount and answers EOPNOTSUPP itself from then on (`no_setxattr`
    /// in fs/fuse/xattr.c).
    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(self.refused(
            "setxattr",
            ino.0,
            name,
            "extended attributes are read-only",
            Errno::ENOSYS,
        ));
    }

    /// Likewise ENOSYS (`no_removexattr` in fs/fuse/xattr.c).
    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply.error(self.refused(
            "removexattr",
            ino.0,
            name,
            "extended attributes are read-only",
            Errno::ENOSYS,
        ));
    }
}
