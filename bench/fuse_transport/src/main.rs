//! Prices the FUSE transport alone: one trivial read-only tree, served over
//! classic /dev/fuse (fuser 0.18, lakemount's library, with N session
//! threads) or over FUSE over io_uring (fractal-fuse: one ring per CPU, a
//! worker pinned to each, Linux 6.14+ with the fuse module's `enable_uring`).
//! The handlers do no I/O, so what a loader's time and the daemon's CPU show
//! is the transport's cost per request. Driven by `run.py` beside this file.
//!
//! Usage: `fuse_transport classic|uring MOUNTPOINT THREADS DIRS FILES SIZE`.
//! The tree: `dD/fF` for D < DIRS, F < FILES, each file SIZE bytes; byte `i`
//! of the file with inode `ino` is `(ino * 31 + i) % 251`. THREADS: classic
//! session threads (at least 1); for io_uring the workers the per-CPU rings
//! are folded onto, 0 for one per CPU. Opens answer no FOPEN_KEEP_CACHE, so
//! every open of a file sends its read again (as lakemount's opens of small
//! files that are not in the page cache do); flush answers ENOSYS (as
//! lakemount's), ioctl ENOTTY (classic; fractal-fuse answers ENOSYS, which
//! the kernel turns into ENOTTY).

use std::ffi::OsStr;
use std::time::Duration;

/// The tree's shape: inode 1 is the root, directories follow, then files.
#[derive(Clone, Copy)]
struct Tree {
    dirs: u64,
    files: u64,
    size: u64,
}

/// Entries and attributes never expire: a loader's index warms them once.
const TTL: Duration = Duration::from_secs(3600);

impl Tree {
    fn dir_ino(&self, d: u64) -> u64 {
        2 + d
    }

    fn file_ino(&self, d: u64, f: u64) -> u64 {
        2 + self.dirs + d * self.files + f
    }

    /// `Some(true)` for a directory, `Some(false)` for a file.
    fn is_dir(&self, ino: u64) -> Option<bool> {
        if ino == 1 || (2..2 + self.dirs).contains(&ino) {
            Some(true)
        } else if ino < 2 + self.dirs + self.dirs * self.files {
            Some(false)
        } else {
            None
        }
    }

    fn lookup(&self, parent: u64, name: &OsStr) -> Option<u64> {
        let name = name.to_str()?;
        if parent == 1 {
            let d: u64 = name.strip_prefix('d')?.parse().ok()?;
            return (d < self.dirs).then(|| self.dir_ino(d));
        }
        let d = parent.checked_sub(2).filter(|d| *d < self.dirs)?;
        let f: u64 = name.strip_prefix('f')?.parse().ok()?;
        (f < self.files).then(|| self.file_ino(d, f))
    }

    /// Directory `ino`'s entries from index `from`: (inode, is_dir, name).
    fn entries(&self, ino: u64, from: u64) -> Vec<(u64, bool, String)> {
        if ino == 1 {
            (from..self.dirs)
                .map(|d| (self.dir_ino(d), true, format!("d{d}")))
                .collect()
        } else {
            let d = ino - 2;
            (from..self.files)
                .map(|f| (self.file_ino(d, f), false, format!("f{f}")))
                .collect()
        }
    }

    /// Fills `buf` with the bytes of file `ino` from `offset`; returns how
    /// many there were.
    fn read(&self, ino: u64, offset: u64, buf: &mut [u8]) -> usize {
        let n = self.size.saturating_sub(offset).min(buf.len() as u64) as usize;
        for (i, b) in buf[..n].iter_mut().enumerate() {
            *b = ((ino * 31 + offset + i as u64) % 251) as u8;
        }
        n
    }
}

mod classic {
    use super::{TTL, Tree};
    use fuser::{
        Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
        IoctlFlags, LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
        ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen, Request, Session,
    };
    use std::ffi::OsStr;
    use std::time::UNIX_EPOCH;

    struct Fs(Tree);

    fn attr(t: &Tree, ino: u64) -> FileAttr {
        let dir = t.is_dir(ino) == Some(true);
        FileAttr {
            ino: INodeNo(ino),
            size: if dir { 0 } else { t.size },
            blocks: 1,
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            crtime: UNIX_EPOCH,
            kind: if dir {
                FileType::Directory
            } else {
                FileType::RegularFile
            },
            perm: if dir { 0o755 } else { 0o444 },
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    impl Filesystem for Fs {
        fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
            match self.0.lookup(parent.0, name) {
                Some(ino) => reply.entry(&TTL, &attr(&self.0, ino), Generation(0)),
                None => reply.error(Errno::ENOENT),
            }
        }

        fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
            match self.0.is_dir(ino.0) {
                Some(_) => reply.attr(&TTL, &attr(&self.0, ino.0)),
                None => reply.error(Errno::ENOENT),
            }
        }

        fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
            reply.opened(FileHandle(1), FopenFlags::empty())
        }

        fn read(
            &self,
            _req: &Request,
            ino: INodeNo,
            _fh: FileHandle,
            offset: u64,
            size: u32,
            _flags: OpenFlags,
            _lock_owner: Option<LockOwner>,
            reply: ReplyData,
        ) {
            let mut buf = vec![0; size as usize];
            let n = self.0.read(ino.0, offset, &mut buf);
            reply.data(&buf[..n])
        }

        fn flush(
            &self,
            _req: &Request,
            _ino: INodeNo,
            _fh: FileHandle,
            _lock_owner: LockOwner,
            reply: ReplyEmpty,
        ) {
            reply.error(Errno::ENOSYS)
        }

        fn release(
            &self,
            _req: &Request,
            _ino: INodeNo,
            _fh: FileHandle,
            _flags: OpenFlags,
            _lock_owner: Option<LockOwner>,
            _flush: bool,
            reply: ReplyEmpty,
        ) {
            reply.ok()
        }

        #[allow(clippy::too_many_arguments)]
        fn ioctl(
            &self,
            _req: &Request,
            _ino: INodeNo,
            _fh: FileHandle,
            _flags: IoctlFlags,
            _cmd: u32,
            _in_data: &[u8],
            _out_size: u32,
            reply: ReplyIoctl,
        ) {
            reply.error(Errno::ENOTTY)
        }

        fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
            reply.opened(FileHandle(0), FopenFlags::empty())
        }

        fn readdir(
            &self,
            _req: &Request,
            ino: INodeNo,
            _fh: FileHandle,
            offset: u64,
            mut reply: ReplyDirectory,
        ) {
            for (i, (ino, dir, name)) in self.0.entries(ino.0, offset).into_iter().enumerate() {
                let kind = if dir {
                    FileType::Directory
                } else {
                    FileType::RegularFile
                };
                if reply.add(INodeNo(ino), offset + i as u64 + 1, kind, name) {
                    break;
                }
            }
            reply.ok()
        }

        fn releasedir(
            &self,
            _req: &Request,
            _ino: INodeNo,
            _fh: FileHandle,
            _flags: OpenFlags,
            reply: ReplyEmpty,
        ) {
            reply.ok()
        }
    }

    pub fn run(tree: Tree, mountpoint: &str, threads: usize) -> std::io::Result<()> {
        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::RO,
            MountOption::FSName("fuse_transport".into()),
        ];
        config.n_threads = Some(threads);
        config.clone_fd = true;
        Session::new(Fs(tree), mountpoint, &config)?.run()
    }
}

mod uring {
    use super::{TTL, Tree};
    use fractal_fuse::{
        DirectoryEntry, ENOENT, FileAttr, FileHandleId, FileType, Filesystem, FsResult, InodeId,
        MountOptions, ReplyAttr, ReplyEntry, ReplyOpen, Request, Session, Timestamp,
    };
    use std::ffi::OsStr;

    /// Entries per readdir reply.
    const READDIR_BATCH: usize = 200;

    struct Fs(Tree);

    fn attr(t: &Tree, ino: u64) -> FileAttr {
        let dir = t.is_dir(ino) == Some(true);
        let epoch = Timestamp::new(0, 0);
        FileAttr {
            ino,
            size: if dir { 0 } else { t.size },
            blocks: 1,
            atime: epoch,
            mtime: epoch,
            ctime: epoch,
            mode: if dir {
                FileType::Directory.to_mode() | 0o755
            } else {
                FileType::RegularFile.to_mode() | 0o444
            },
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
        }
    }

    fn opened(fh: u64) -> ReplyOpen {
        ReplyOpen {
            fh: FileHandleId(fh),
            flags: 0,
            backing_id: 0,
        }
    }

    impl Filesystem for Fs {
        async fn lookup(
            &self,
            _req: Request,
            parent: InodeId,
            name: &OsStr,
        ) -> FsResult<ReplyEntry> {
            let ino = self.0.lookup(parent.0, name).ok_or(ENOENT)?;
            Ok(ReplyEntry {
                ttl: TTL,
                attr: attr(&self.0, ino),
                generation: 0,
            })
        }

        async fn getattr(
            &self,
            _req: Request,
            ino: InodeId,
            _fh: Option<FileHandleId>,
            _flags: u32,
        ) -> FsResult<ReplyAttr> {
            self.0.is_dir(ino.0).ok_or(ENOENT)?;
            Ok(ReplyAttr {
                ttl: TTL,
                attr: attr(&self.0, ino.0),
            })
        }

        async fn open(&self, _req: Request, _ino: InodeId, _flags: u32) -> FsResult<ReplyOpen> {
            Ok(opened(1))
        }

        async fn read(
            &self,
            _req: Request,
            ino: InodeId,
            _fh: FileHandleId,
            offset: u64,
            buf: &mut [u8],
        ) -> FsResult<usize> {
            Ok(self.0.read(ino.0, offset, buf))
        }

        async fn release(
            &self,
            _req: Request,
            _ino: InodeId,
            _fh: FileHandleId,
            _flags: u32,
            _lock_owner: u64,
            _flush: bool,
            _flock_release: bool,
        ) -> FsResult<()> {
            Ok(())
        }

        async fn opendir(&self, _req: Request, _ino: InodeId, _flags: u32) -> FsResult<ReplyOpen> {
            Ok(opened(0))
        }

        async fn readdir(
            &self,
            _req: Request,
            ino: InodeId,
            _fh: FileHandleId,
            offset: u64,
            _size: u32,
        ) -> FsResult<Vec<DirectoryEntry>> {
            let entries = self
                .0
                .entries(ino.0, offset)
                .into_iter()
                .take(READDIR_BATCH);
            Ok(entries
                .enumerate()
                .map(|(i, (ino, dir, name))| DirectoryEntry {
                    ino,
                    offset: offset + i as u64 + 1,
                    kind: if dir {
                        FileType::Directory
                    } else {
                        FileType::RegularFile
                    },
                    name: name.into_bytes(),
                })
                .collect())
        }

        async fn releasedir(
            &self,
            _req: Request,
            _ino: InodeId,
            _fh: FileHandleId,
            _flags: u32,
        ) -> FsResult<()> {
            Ok(())
        }
    }

    pub fn run(tree: Tree, mountpoint: &str, workers: usize) -> std::io::Result<()> {
        let options = MountOptions::new()
            .read_only(true)
            .fs_name("fuse_transport");
        let mut session = Session::new(mountpoint.into(), options)?;
        if workers > 0 {
            session = session.with_worker_count(workers);
        }
        session.run(Fs(tree))
    }
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: fuse_transport classic|uring MOUNTPOINT THREADS DIRS FILES SIZE";
    let [_, transport, mountpoint, threads, dirs, files, size] = &args[..] else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let number = |s: &str| -> u64 {
        s.parse().unwrap_or_else(|_| {
            eprintln!("{usage}: {s:?} is not a number");
            std::process::exit(2)
        })
    };
    let tree = Tree {
        dirs: number(dirs),
        files: number(files),
        size: number(size),
    };
    let threads = number(threads) as usize;
    match transport.as_str() {
        "classic" => classic::run(tree, mountpoint, threads.max(1)),
        "uring" => uring::run(tree, mountpoint, threads),
        _ => {
            eprintln!("{usage}");
            std::process::exit(2)
        }
    }
}
