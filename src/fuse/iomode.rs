//! The I/O mode of each open file (through lakemount: page cache or direct
//! I/O; or FUSE passthrough), kept per inode so that no open conflicts with
//! the inode's others, and the open replies that choose it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use fuser::{BackingId, FileHandle, FopenFlags, INodeNo, Notifier, ReplyOpen};
use tracing::{debug, info};

use super::turns::Turn;
use super::{errno, is_direct_io};
use crate::fs::{Fs, FsError};
use crate::store::{ObjectStore, WriteStore};
use crate::telemetry::metrics as m;

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

/// The backing file an inode's passthrough opens share
/// ([`IoTable::shared_backing`]).
pub(super) enum SharedBacking {
    /// A cached object's file in the data cache.
    Cached,
    /// A staged file's data file.
    Staged(Arc<std::fs::File>),
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
pub(super) struct IoTable {
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

    /// What the passthrough opens of `ino` share; `None` when it has none.
    pub(super) fn shared_backing(&self, ino: u64) -> Option<SharedBacking> {
        let io = self.lock();
        let b = io.inodes.get(&ino)?.backing.as_ref()?;
        Some(match &b.staged {
            Some(f) => SharedBacking::Staged(f.clone()),
            None => SharedBacking::Cached,
        })
    }

    /// Whether [`choose_mode`] would refuse open `o` of `ino` now
    /// ([`Served::Busy`]): until the inode's other opens are released.
    pub(super) fn refuses(&self, ino: u64, o: &crate::fs::Opened) -> bool {
        let staged = o.staged.as_ref().map(|s| &s.file);
        let io = self.lock();
        io.inodes
            .get(&ino)
            .is_some_and(|e| e.refuses(o.local, staged))
    }

    /// Forgets open file `fh` at its release.
    pub(super) fn release(&self, fh: u64) {
        let mut io = self.lock();
        if let Some((ino, mode)) = io.handles.remove(&fh)
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
pub(super) struct Filling<'a> {
    io: &'a IoTable,
    ino: u64,
}

impl Drop for Filling<'_> {
    fn drop(&mut self) {
        self.io.end_fill(self.ino);
    }
}

/// How the kernel is to serve one open.
pub(super) enum Served<'a> {
    /// Through lakemount; with `fill`, this open may put `Opened::fill` in
    /// the page cache, and other opens of the inode wait until it is dropped.
    Daemon {
        fill: Option<Filling<'a>>,
    },
    Passthrough(Arc<BackingId>),
    /// The inode's passthrough opens are of another file: this open cannot
    /// join them, nor be served by lakemount beside them (the kernel would
    /// fail it with EIO, `fuse_file_io_open` in fs/fuse/iomode.c). ETXTBSY.
    /// An open gets it once it has waited for the inode's closed opens to
    /// be released ([`IoTable::refuses`]). Writers wait before they stage
    /// anything ([`super::write_conflicts`], [`crate::fs::StageGate`]), so
    /// a writer that gets it lost a race with another open, after staging
    /// (with O_TRUNC, an empty file, which is uploaded).
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
pub(super) fn choose_mode<'a, S: ObjectStore + WriteStore>(
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
    if e.refuses(o.local, staged.as_ref().map(|s| &s.file)) {
        drop(st);
        fs.release(o.fh, || {});
        return Served::Busy;
    }
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
        // file it was uploaded from (unchanged since: no writer is left). A
        // staged open shares only its own data file (not refused above).
        (Some(b), _) => Some(b.id.clone()),
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
pub(super) struct Serving<'a> {
    /// The inodes' I/O modes.
    pub(super) io: &'a IoTable,
    /// Whether passthrough is on.
    pub(super) on: &'a PassthroughOn,
    /// [`super::FuseFs::direct_io_min_size`].
    pub(super) direct_io_min_size: u64,
    /// Fills the page cache with a small object's bytes ([`fill_page_cache`]).
    pub(super) notifier: Option<&'a Notifier>,
    /// On a session thread: lets a parked thread read while this open waits
    /// for another's page-cache fill ([`Turn::may_block`]).
    pub(super) turn: Option<&'a Turn<'a>>,
}

/// Answers an open with the I/O mode [`IoModes`] allows, and records it.
pub(super) fn open_reply<S: ObjectStore + WriteStore>(
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
/// (FUSE_NOTIFY_STORE), so that its reads need no request. Called before an
/// open is answered, for an open that no other open of the inode shares
/// ([`choose_mode`]), and on a mount without opens by the push of prefetched
/// objects ([`super::noopen::push_prefetched`]). Returns whether the kernel
/// took them all. On an error an open keeps the page cache only if it held
/// this same version already (`Opened::keep_cache`); else the open drops
/// whatever part was stored. fuser reports the kernel's ENOENT (no such
/// inode in its cache) as success: an inode being opened is in it, and the
/// push only stores into inodes the kernel was told of and has not
/// forgotten at the time it checks (a race with a FORGET counts as stored).
pub(super) fn fill_page_cache(notifier: &Notifier, ino: u64, bytes: &bytes::Bytes) -> bool {
    let ok = match notifier.store(INodeNo(ino), 0, bytes) {
        Ok(()) => true,
        Err(e) => {
            debug!(ino, "page cache fill refused: {e}");
            false
        }
    };
    let result = if ok { "ok" } else { "failed" };
    metrics::counter!(m::PAGE_CACHE_FILLS, "result" => result).increment(1);
    if ok {
        metrics::counter!(m::PAGE_CACHE_FILL_BYTES).increment(bytes.len() as u64);
    }
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
    /// Whether an open of a staged file (`local`; offering `staged` as its
    /// passthrough file, if any) cannot join this inode's opens: they are
    /// passthrough opens, and not of that same staged file (a cached
    /// object's, a staged file's that was uploaded since, or the open
    /// offers none), so the kernel would fail it with EIO.
    fn refuses(&self, local: bool, staged: Option<&Arc<std::fs::File>>) -> bool {
        let same =
            |b: &Shared| matches!((&b.staged, staged), (Some(m), Some(s)) if Arc::ptr_eq(m, s));
        local && self.daemon == 0 && self.backing.as_ref().is_some_and(|b| !same(b))
    }

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
pub(super) struct PassthroughOn {
    /// Fully cached files.
    pub(super) cached: AtomicBool,
    /// Staged files.
    pub(super) staged: AtomicBool,
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
