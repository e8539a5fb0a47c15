//! Adoption of a whole local file as a cached object: a file written on a
//! writable mount and just uploaded becomes an ordinary cached object
//! without being fetched again.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use tracing::debug;

use super::index::{Obj, alloc_size};
use super::objfile::{self, Header, Rec};
use super::{DiskCache, mkdir, unix_secs};
use crate::cache::{ObjectId, PieceKey};
use crate::telemetry::metrics as m;

impl DiskCache {
    /// Takes a copy of the local file at `path` (`size` bytes, not
    /// changed while this runs) as object `obj`. The copy is the kernel's
    /// (`copy_file_range`: a reflink where the file system shares blocks),
    /// never the same inode: eviction punches holes in cached files, and
    /// the original may still be open elsewhere. Its blocks are read once
    /// for their CRC32C and checked again when first read, as after a
    /// restart; a packable file is packed. Returns whether the cache now
    /// holds the object: false when it holds some of it already, has no
    /// room without evicting data read lately, or on a local I/O error
    /// (a debug log; nothing is left behind). Blocks on local disk: call
    /// off the async runtime.
    pub fn adopt_file(self: &Arc<Self>, obj: ObjectId, size: u64, path: &Path) -> bool {
        let mut src = match File::open(path) {
            Ok(f) if f.metadata().is_ok_and(|md| md.len() == size) => f,
            _ => return false,
        };
        if size == 0 {
            return false;
        }
        if self.packable(size) {
            let mut data = vec![0u8; size as usize];
            return src.read_exact_at(&mut data, 0).is_ok()
                && self.write(PieceKey { obj, idx: 0 }, size, &data);
        }
        self.load(obj, size);
        if self.index.lock().unwrap().objects.contains_key(&obj) {
            return false;
        }
        let blocks = self.blocks_of(size);
        let need = alloc_size(objfile::map_len(blocks))
            + (0..blocks)
                .map(|i| alloc_size((size - i * self.block_size).min(self.block_size)))
                .sum::<u64>();
        let victims = {
            let mut ix = self.index.lock().unwrap();
            self.refresh_limit(&mut ix, false);
            self.make_room(&mut ix, need)
        };
        let Some(victims) = victims else {
            metrics::counter!(m::CACHE_SKIPPED, "reason" => "full").increment(1);
            return false;
        };
        self.remove_victims(victims);
        {
            // Held while the files are made: a read's block write skips a
            // removing object, so it neither joins nor races the copy.
            let mut ix = self.index.lock().unwrap();
            if ix.objects.contains_key(&obj) {
                return false;
            }
            let mut o = Obj::new(size, blocks);
            o.removing = 1;
            ix.total += o.map_alloc;
            ix.objects.insert(obj, o);
        }
        let data = self.data_path(obj);
        let map_path = self.map_path(obj);
        let tmp = map_path.with_extension(MAP_NEW);
        let r = (|| {
            mkdir(data.parent().unwrap())?;
            // An existing data file: a read cached a block meanwhile.
            let mut dst = new_file(&data)?;
            let r = (|| {
                std::io::copy(&mut src, &mut dst)?;
                let map = block_map(&dst, size, self.block_size)?;
                new_file(&tmp)?.write_all(&map)?;
                std::fs::rename(&tmp, &map_path)
            })();
            if r.is_err() {
                let _ = std::fs::remove_file(&tmp);
                let _ = std::fs::remove_file(&data);
            }
            r
        })();
        {
            let mut ix = self.index.lock().unwrap();
            if let Some(o) = ix.objects.remove(&obj) {
                ix.total -= o.map_alloc;
            }
        }
        match r {
            Ok(()) => {
                // Indexed as a restart would find it.
                self.load(obj, size);
                true
            }
            Err(e) => {
                debug!(path = %path.display(), "written file not taken by the cache: {e}");
                false
            }
        }
    }
}

/// Extension of a block map being written (renamed to `.map` when whole;
/// one left by a crash is removed by the restart scan).
pub(super) const MAP_NEW: &str = "map.new";

/// Creates `path` (mode 0600), which must not exist.
fn new_file(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

/// The bytes of the block map of `file`, an object of `size` bytes in
/// blocks of `block_size`: every block present, last read now, no seal.
fn block_map(file: &File, size: u64, block_size: u64) -> std::io::Result<Vec<u8>> {
    let blocks = size.div_ceil(block_size);
    let now = unix_secs(SystemTime::now());
    let mut map = Vec::with_capacity(objfile::map_len(blocks) as usize);
    let header = Header {
        size,
        block_size,
        seal: None,
    };
    map.extend_from_slice(&header.encode());
    let mut buf = vec![0u8; block_size as usize];
    for idx in 0..blocks {
        let len = header.block_len(idx) as usize;
        file.read_exact_at(&mut buf[..len], idx * block_size)?;
        let rec = Rec {
            crc: crc32c::crc32c(&buf[..len]),
            len: len as u32,
            atime: now,
        };
        map.extend_from_slice(&rec.encode());
    }
    Ok(map)
}
