//! Reads of a mount without opens (`read.no_open`): the kernel sends no
//! OPEN or RELEASE, so a read (file handle 0) uses the handle kept for its
//! inode in [`InodeHandles`], opened at the inode's first read; and, with a
//! data cache, small objects read-ahead fetches are pushed into the page
//! cache before they are read.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use fuser::{Notifier, ReplyData};
use tracing::warn;

use super::handles::{self, InodeHandles};
use super::iomode::fill_page_cache;
use super::turns::Turn;
use super::{FuseFs, errno, read_reply};
use crate::fs::{Fs, FsError};
use crate::store::{ObjectStore, WriteStore};

/// The handle table of a mount without opens, and the task that releases
/// its idle handles every [`handles::SWEEP_EVERY`] until the mount ends.
pub(super) fn sweep_handles<S: ObjectStore + WriteStore>(
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

/// How long the push thread rests after emptying its queue: the objects
/// that arrive meanwhile are pushed together, and the runtime threads that
/// queue them need not wake it for each (a wake-up across CPUs is one of the
/// dearest things a small GET costs; docs/READAHEAD.md). A loader that gets
/// to an object before its push reads it from memory, as without the push.
const PUSH_GATHER: Duration = Duration::from_millis(1);

/// What the push thread is given.
enum Push {
    /// A small object fetched whole: its inode, key, ETag, size in bytes
    /// and bytes.
    Object(u64, String, String, u64, bytes::Bytes),
    /// The loader sends no request per file: objects pushed and not seen
    /// read (key, ETag, size), whose attributes to make stale.
    Silent(Vec<(String, String, u64)>),
}

/// A mount without opens with a data cache: each small object read-ahead
/// fetches is put in its inode's page cache (FUSE_NOTIFY_STORE) as it
/// arrives, by a thread of its own, so a loader's read of it needs no
/// request at all. Its own thread: a store waits for page locks a READ of
/// the same file may hold, and that READ's reply must not wait behind it.
///
/// A loader that sends no request per file (no ioctl either) is never seen
/// at pushed objects, and prefetch would wait at its bound
/// ([`crate::read::small::SmallPrefetch::on_silent`]). Once it is found
/// so, pushed objects get their attributes made stale
/// (FUSE_NOTIFY_INVAL_INODE with a negative offset: attributes only, the
/// pages stay), so the loader's stat, or its read up to the end of the
/// file, sends a GETATTR, which is the sign.
pub(super) fn push_prefetched<S: ObjectStore + WriteStore>(
    fs: &Arc<Fs<S>>,
    notifier: &Arc<OnceLock<Notifier>>,
    rt: &tokio::runtime::Handle,
) {
    let (tx, rx) = std::sync::mpsc::channel::<Push>();
    let tx = Arc::new(Mutex::new(tx));
    let objects = tx.clone();
    let registered = fs.on_small_fetched(move |ino, key, etag, size, bytes| {
        let push = Push::Object(ino, key.to_string(), etag.to_string(), size, bytes);
        let _ = objects.lock().unwrap().send(push);
    });
    if !registered {
        return;
    }
    fs.on_small_silent(move |pushed| {
        let _ = tx.lock().unwrap().send(Push::Silent(pushed));
    });
    let (fs, notifier, rt) = (Arc::downgrade(fs), notifier.clone(), rt.clone());
    let spawned = std::thread::Builder::new()
        .name("lakemount-push".into())
        .spawn(move || {
            // Ending a prefetch may send the next GETs.
            let _rt = rt.enter();
            // Objects to make the attributes of stale, a batch per round so
            // that pushes go on meanwhile.
            let mut stale = std::collections::VecDeque::new();
            loop {
                let first = if stale.is_empty() {
                    match rx.recv() {
                        Ok(p) => Some(p),
                        Err(_) => break,
                    }
                } else {
                    None
                };
                for push in first.into_iter().chain(rx.try_iter()) {
                    let (Some(fs), Some(n)) = (fs.upgrade(), notifier.get()) else {
                        continue;
                    };
                    match push {
                        Push::Object(ino, key, etag, size, bytes) => {
                            // Stale before the store when the sign is asked
                            // for already: no stat can come between.
                            let asked = fs.small_wants_read_signal();
                            if asked {
                                stale_attributes(n, ino);
                            }
                            if fill_page_cache(n, ino, &bytes)
                                && fs.small_delivered(&key, &etag, size, asked)
                                && !asked
                            {
                                stale_attributes(n, ino);
                            }
                        }
                        Push::Silent(pushed) => stale.extend(pushed),
                    }
                }
                if let (Some(fs), Some(n)) = (fs.upgrade(), notifier.get()) {
                    let batch = stale.len().min(STALE_BATCH);
                    for (key, etag, size) in stale.drain(..batch) {
                        if let Some(ino) = fs.file_inode(&key, &etag, size) {
                            stale_attributes(n, ino);
                        }
                    }
                } else {
                    stale.clear();
                }
                std::thread::sleep(PUSH_GATHER);
            }
        });
    if let Err(e) = spawned {
        warn!("no page-cache push of prefetched objects: {e}");
    }
}

/// Objects whose attributes the push thread makes stale per round, between
/// its pushes: a loader found silent with a million objects pushed ahead
/// does not stop the pushes for the seconds they all take.
const STALE_BATCH: usize = 4096;

/// Makes the kernel's attributes of `ino` stale, its pages kept (a negative
/// offset, fs/fuse/inode.c `fuse_reverse_inval_inode`): its next stat, or
/// a read reaching past the size the kernel knows, sends a GETATTR. An
/// inode the kernel no longer holds (ENOENT) needs none.
fn stale_attributes(notifier: &Notifier, ino: u64) {
    match notifier.inval_inode(fuser::INodeNo(ino), -1, 0) {
        Ok(()) => {
            metrics::counter!(crate::telemetry::metrics::FUSE_ATTR_INVALIDATIONS).increment(1)
        }
        Err(e) => tracing::debug!(ino, "attribute invalidation refused: {e}"),
    }
}

impl<S: ObjectStore + WriteStore> FuseFs<S> {
    /// A read of a mount without opens (`read.no_open`, file handle 0):
    /// with the handle kept for `ino`, or one opened now
    /// ([`Fs::open_version_now`]; on the runtime when the attributes must
    /// be confirmed first). Needs a runtime context.
    pub(super) fn read_inode(
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
                    return self.answer_read(ino, pending, turn, reply, done);
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
