//! File handles of a no-open mount (`read.no_open`). Once an open is
//! answered ENOSYS the kernel sends no FUSE_OPEN or FUSE_RELEASE again for
//! the mount, keeps every file's page cache across opens (FOPEN_KEEP_CACHE),
//! and its reads carry file handle 0 (`fuse_file_open`, fs/fuse/file.c;
//! Linux 4.19+). So lakemount opens a handle per inode at the inode's first
//! read and keeps it here, and releases it when a read reaches the end of
//! a file that this handle also read from its start (the kernel holds the
//! bytes in its page cache then; a reader of a file's tail first, a zip
//! directory or a Parquet footer, keeps its handle), when the kernel
//! forgets the inode, when it has not been read for [`IDLE`] (a sweep every
//! [`SWEEP_EVERY`]), or when more than [`MAX_HANDLES`] are kept (least
//! recently read first).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use lru::LruCache;

use crate::telemetry::metrics as m;

/// Handles kept at most; beyond it the least recently read one is released.
/// Each holds one object's reader (its read-ahead windows count against the
/// memory budget's fair share per open file), so the table stays near the
/// number of files read at once.
pub const MAX_HANDLES: usize = 1024;

/// A handle not read for this long is released. Its file's reads since
/// are in the page cache or done.
pub const IDLE: Duration = Duration::from_secs(30);

/// How often idle handles are looked for.
pub const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// One inode's handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handle {
    /// The file handle [`crate::fs::Fs`] reads with.
    pub fh: u64,
    /// Size of the object version opened, bytes.
    pub size: u64,
    /// A read at offset 0 began with it: a read reaching the end of the
    /// file then releases it.
    from_start: bool,
    /// Last read (or the open).
    used: Instant,
}

/// Inode -> its handle, least recently read last.
pub struct InodeHandles {
    table: Mutex<LruCache<u64, Handle>>,
    max: usize,
    idle: Duration,
}

impl InodeHandles {
    /// At most `max` handles, each released after `idle` without a read.
    pub fn new(max: usize, idle: Duration) -> Self {
        Self {
            table: Mutex::new(LruCache::unbounded()),
            max,
            idle,
        }
    }

    /// The handle of `ino`, marked as read now.
    pub fn get(&self, ino: u64) -> Option<Handle> {
        let mut t = self.table.lock().unwrap();
        let h = t.get_mut(&ino)?;
        h.used = Instant::now();
        Some(*h)
    }

    /// Keeps `fh` (of an object version of `size` bytes) as the handle of
    /// `ino`, unless `ino` has one already (two first reads raced): returns
    /// the handle kept, and the file handles to release: `fh` if not kept,
    /// and those beyond the cap or idle too long.
    pub fn insert(&self, ino: u64, fh: u64, size: u64) -> (Handle, Vec<u64>) {
        let now = Instant::now();
        let mut t = self.table.lock().unwrap();
        if let Some(h) = t.get_mut(&ino) {
            h.used = now;
            return (*h, vec![fh]);
        }
        let h = Handle {
            fh,
            size,
            from_start: false,
            used: now,
        };
        t.put(ino, h);
        let mut released = Vec::new();
        while let Some((_, old)) = t.peek_lru() {
            if t.len() <= self.max && now.duration_since(old.used) < self.idle {
                break;
            }
            if let Some((_, old)) = t.pop_lru() {
                released.push(old.fh);
            }
        }
        metrics::gauge!(m::FUSE_INODE_HANDLES).set(t.len() as f64);
        (h, released)
    }

    /// Notes that a read at offset 0 began with `ino`'s handle `fh`.
    pub fn read_from_start(&self, ino: u64, fh: u64) {
        let mut t = self.table.lock().unwrap();
        if let Some(h) = t.peek_mut(&ino).filter(|h| h.fh == fh) {
            h.from_start = true;
        }
    }

    /// Removes `ino`'s handle if it is `fh` and a read at offset 0 began
    /// with it ([`Self::read_from_start`]): a read of it reached the end
    /// of the file. Gives the file handle removed, to release.
    pub fn remove_at_end(&self, ino: u64, fh: u64) -> Option<u64> {
        let mut t = self.table.lock().unwrap();
        match t.peek(&ino) {
            Some(h) if h.fh == fh && h.from_start => {
                t.pop(&ino);
                metrics::gauge!(m::FUSE_INODE_HANDLES).set(t.len() as f64);
                Some(fh)
            }
            _ => None,
        }
    }

    /// Removes the handles not read for the idle time; gives their file
    /// handles, to release.
    pub fn sweep(&self) -> Vec<u64> {
        let now = Instant::now();
        let mut t = self.table.lock().unwrap();
        let mut released = Vec::new();
        while let Some((_, h)) = t.peek_lru() {
            if now.duration_since(h.used) < self.idle {
                break;
            }
            if let Some((_, h)) = t.pop_lru() {
                released.push(h.fh);
            }
        }
        metrics::gauge!(m::FUSE_INODE_HANDLES).set(t.len() as f64);
        released
    }

    /// Removes the handle of `ino` if it is `fh` (`None`: whichever it is);
    /// gives the file handle removed, to release.
    pub fn remove(&self, ino: u64, fh: Option<u64>) -> Option<u64> {
        let mut t = self.table.lock().unwrap();
        match t.peek(&ino) {
            Some(h) if fh.is_none_or(|f| f == h.fh) => {
                let fh = t.pop(&ino).map(|h| h.fh);
                metrics::gauge!(m::FUSE_INODE_HANDLES).set(t.len() as f64);
                fh
            }
            _ => None,
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.table.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_beyond_the_cap_go_least_recently_read_first() {
        let t = InodeHandles::new(2, IDLE);
        assert!(t.insert(1, 10, 5).1.is_empty());
        assert!(t.insert(2, 20, 5).1.is_empty());
        assert_eq!(t.get(1).map(|h| h.fh), Some(10));
        // Inode 2 was read least recently.
        assert_eq!(t.insert(3, 30, 5).1, vec![20]);
        assert_eq!(t.len(), 2);
        assert_eq!(t.get(2), None);
    }

    #[test]
    fn a_racing_second_open_is_released_and_the_first_kept() {
        let t = InodeHandles::new(8, IDLE);
        assert!(t.insert(1, 10, 5).1.is_empty());
        let (kept, out) = t.insert(1, 11, 5);
        assert_eq!((kept.fh, out), (10, vec![11]));
        assert_eq!(t.get(1).map(|h| h.fh), Some(10));
    }

    #[test]
    fn idle_handles_are_released_by_the_sweep_or_the_next_open() {
        let t = InodeHandles::new(8, Duration::from_millis(50));
        assert!(t.insert(1, 10, 5).1.is_empty());
        assert!(t.insert(2, 20, 5).1.is_empty());
        std::thread::sleep(Duration::from_millis(80));
        t.get(2);
        assert_eq!(t.sweep(), vec![10]);
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(t.insert(3, 30, 5).1, vec![20]);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn only_a_handle_read_from_its_start_is_removed_at_the_end() {
        let t = InodeHandles::new(8, IDLE);
        t.insert(1, 10, 5);
        assert_eq!(t.remove_at_end(1, 10), None);
        t.read_from_start(1, 11);
        assert_eq!(t.remove_at_end(1, 10), None);
        t.read_from_start(1, 10);
        assert_eq!(t.remove_at_end(1, 11), None);
        assert_eq!(t.remove_at_end(1, 10), Some(10));
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn removal_only_of_the_handle_named() {
        let t = InodeHandles::new(8, IDLE);
        t.insert(1, 10, 5);
        assert_eq!(t.remove(1, Some(11)), None);
        assert_eq!(t.remove(1, Some(10)), Some(10));
        t.insert(1, 12, 5);
        assert_eq!(t.remove(1, None), Some(12));
        assert_eq!(t.remove(1, None), None);
    }
}
