//! On-disk format of one cached object version: a **data file** that holds the
//! object's bytes at their own offsets (block `i` at `i x block_size`, missing
//! blocks are holes), and a **block map** beside it that says which blocks are
//! present and their CRC32C.
//!
//! Because the data file is the object itself, a fully cached object can be
//! handed to the kernel as a FUSE passthrough backing file (reads then never
//! reach lakemount). The map makes partial objects and integrity work:
//!
//! ```text
//! <hex>.map: header (48 bytes), then one 16-byte record per block
//!   header  0..4   magic "LMM1"
//!           4..8   CRC32C of bytes 8..48 (u32 LE)
//!           8..16  object size, bytes (u64 LE)
//!          16..24  block size, bytes (u64 LE)
//!          24..48  seal: data file inode (u64), ctime seconds (i64),
//!                  ctime nanoseconds (u32), 1 if sealed else 0 (u32)
//!   record  0..4   CRC32C of the block's bytes (u32 LE)
//!           4..8   block length, bytes (u32 LE); 0 = absent
//!           8..12  last read, seconds since the Unix epoch (u32 LE)
//!          12..16  CRC32C of bytes 0..12 (u32 LE): a torn or stray record
//!                  reads as absent
//! ```
//!
//! A block is written to the data file first and its record after it, so a
//! crash never leaves a record for bytes that were not written (the CRC32C
//! would catch it anyway). The **seal** records the data file's inode and
//! ctime when every block was present and checked; any later change to the
//! data file through the file system (a write, a truncation, a punched hole)
//! changes its ctime, so a seal that still matches means the file holds
//! exactly the checked bytes. Only a sealed object is served by passthrough.

use std::fs::{File, Metadata, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};

/// Magic at the start of every block map ("LakeMount Map v1").
pub const MAP_MAGIC: &[u8; 4] = b"LMM1";
/// Bytes of the map header.
pub const MAP_HEADER_LEN: u64 = 48;
/// Bytes of one block record.
pub const REC_LEN: u64 = 16;

/// One present block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rec {
    /// CRC32C of the block's bytes.
    pub crc: u32,
    /// Block length, bytes (> 0).
    pub len: u32,
    /// Last read, seconds since the Unix epoch (persisted at most every TTL/16).
    pub atime: u32,
}

impl Rec {
    /// The 16 bytes of this record.
    pub fn encode(&self) -> [u8; REC_LEN as usize] {
        let mut b = [0u8; REC_LEN as usize];
        b[0..4].copy_from_slice(&self.crc.to_le_bytes());
        b[4..8].copy_from_slice(&self.len.to_le_bytes());
        b[8..12].copy_from_slice(&self.atime.to_le_bytes());
        let check = crc32c::crc32c(&b[..12]);
        b[12..16].copy_from_slice(&check.to_le_bytes());
        b
    }

    /// A record from its 16 bytes; `None` for an absent (zero length), torn
    /// or garbage record.
    pub fn decode(b: &[u8]) -> Option<Rec> {
        let b: &[u8; REC_LEN as usize] = b.try_into().ok()?;
        let u = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        if u(4) == 0 || crc32c::crc32c(&b[..12]) != u(12) {
            return None;
        }
        Some(Rec {
            crc: u(0),
            len: u(4),
            atime: u(8),
        })
    }
}

/// What identifies the data file's content as checked: inode number and
/// ctime (`st_ino`, `st_ctime`, `st_ctime_nsec`) when it was sealed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seal {
    /// Inode number.
    pub ino: u64,
    /// ctime, seconds.
    pub ctime_sec: i64,
    /// ctime, nanoseconds.
    pub ctime_nsec: u32,
}

impl Seal {
    /// The seal of a file with metadata `md`.
    pub fn of(md: &Metadata) -> Seal {
        Seal {
            ino: md.ino(),
            ctime_sec: md.ctime(),
            ctime_nsec: md.ctime_nsec() as u32,
        }
    }
}

/// The map header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Object size, bytes.
    pub size: u64,
    /// Block size the object was cached with, bytes.
    pub block_size: u64,
    /// Set when every block was present and checked.
    pub seal: Option<Seal>,
}

impl Header {
    /// The 48 bytes of this header.
    pub fn encode(&self) -> [u8; MAP_HEADER_LEN as usize] {
        let mut b = [0u8; MAP_HEADER_LEN as usize];
        b[0..4].copy_from_slice(MAP_MAGIC);
        b[8..16].copy_from_slice(&self.size.to_le_bytes());
        b[16..24].copy_from_slice(&self.block_size.to_le_bytes());
        if let Some(s) = self.seal {
            b[24..32].copy_from_slice(&s.ino.to_le_bytes());
            b[32..40].copy_from_slice(&s.ctime_sec.to_le_bytes());
            b[40..44].copy_from_slice(&s.ctime_nsec.to_le_bytes());
            b[44..48].copy_from_slice(&1u32.to_le_bytes());
        }
        let crc = crc32c::crc32c(&b[8..]);
        b[4..8].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// A header from the start of a map file. Errors: why it is not one.
    pub fn decode(b: &[u8]) -> Result<Header, &'static str> {
        if b.len() < MAP_HEADER_LEN as usize || &b[..4] != MAP_MAGIC {
            return Err("has a bad header");
        }
        let b = &b[..MAP_HEADER_LEN as usize];
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        if crc32c::crc32c(&b[8..]) != u32_at(4) {
            return Err("has a corrupt header");
        }
        let seal = (u32_at(44) == 1).then(|| Seal {
            ino: u64_at(24),
            ctime_sec: u64_at(32) as i64,
            ctime_nsec: u32_at(40),
        });
        Ok(Header {
            size: u64_at(8),
            block_size: u64_at(16),
            seal,
        })
    }

    /// Number of blocks of the object.
    pub fn blocks(&self) -> u64 {
        self.size.div_ceil(self.block_size)
    }

    /// Length of block `idx`, bytes.
    pub fn block_len(&self, idx: u64) -> u64 {
        (self.size - idx * self.block_size).min(self.block_size)
    }
}

/// A whole block map as read from disk.
#[derive(Debug)]
pub struct MapFile {
    /// Its header.
    pub header: Header,
    /// One entry per block: `Some` when present.
    pub recs: Vec<Option<Rec>>,
}

/// Parses a whole map file. A record whose length does not fit its block is
/// treated as absent. Errors: a bad header or a block size of 0.
pub fn parse_map(bytes: &[u8]) -> Result<MapFile, &'static str> {
    let header = Header::decode(bytes)?;
    if header.block_size == 0 {
        return Err("has a block size of 0");
    }
    let n = header.blocks();
    let recs = (0..n)
        .map(|i| {
            let at = (MAP_HEADER_LEN + i * REC_LEN) as usize;
            bytes
                .get(at..at + REC_LEN as usize)
                .and_then(Rec::decode)
                .filter(|r| r.len as u64 == header.block_len(i))
        })
        .collect();
    Ok(MapFile { header, recs })
}

/// Offset of block `idx`'s record in the map file.
pub fn rec_offset(idx: u64) -> u64 {
    MAP_HEADER_LEN + idx * REC_LEN
}

/// Bytes of the map file of an object of `blocks` blocks.
pub fn map_len(blocks: u64) -> u64 {
    MAP_HEADER_LEN + blocks * REC_LEN
}

/// Opens the block map `path` for reading and writing, creating it (mode
/// 0600) when missing. Returns the file and whether this call created it.
pub fn open_map(path: &std::path::Path) -> std::io::Result<(File, bool)> {
    let created = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path);
    match created {
        Ok(f) => Ok((f, true)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let f = OpenOptions::new().read(true).write(true).open(path)?;
            Ok((f, false))
        }
        Err(e) => Err(e),
    }
}

/// Whether the file system of directory `dir` can punch holes (tried on a
/// scratch file that is removed again).
pub fn probe_punch_hole(dir: &std::path::Path) -> bool {
    let path = dir.join(".punch-probe");
    let ok = (|| {
        let (f, _) = open_rw(&path)?;
        f.write_all_at(&[1u8; 8192], 0)?;
        punch_hole(&f, 0, 4096)
    })()
    .is_ok();
    let _ = std::fs::remove_file(&path);
    ok
}

/// Opens `path` for reading and writing, creating it (mode 0600) when missing.
/// Returns the file and whether it was empty (new).
pub fn open_rw(path: &std::path::Path) -> std::io::Result<(File, bool)> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)?;
    let empty = f.metadata()?.len() == 0;
    Ok((f, empty))
}

/// Writes a record (or, with `None`, an absent one) for block `idx`.
pub fn write_rec(map: &File, idx: u64, rec: Option<Rec>) -> std::io::Result<()> {
    let b = rec.map(|r| r.encode()).unwrap_or([0; REC_LEN as usize]);
    map.write_all_at(&b, rec_offset(idx))
}

/// Frees `len` bytes at `offset` of `f` (a hole; the size stays), so an
/// evicted block gives its disk space back. `fallocate(2)` with
/// `FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE` (ext4, xfs, btrfs, tmpfs).
pub fn punch_hole(f: &File, offset: u64, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain syscall on an open descriptor; no memory is passed.
    let r = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_torn_ones_are_absent() {
        let r = Rec {
            crc: 0xdead_beef,
            len: 4096,
            atime: 1_700_000_000,
        };
        let b = r.encode();
        assert_eq!(Rec::decode(&b), Some(r));
        for i in 0..16 {
            let mut t = b;
            t[i] ^= 1;
            assert_eq!(Rec::decode(&t), None, "flipped byte {i} accepted");
        }
        assert_eq!(Rec::decode(&[0; 16]), None);
        assert_eq!(Rec::decode(&b[..15]), None);
    }

    #[test]
    fn headers_round_trip_and_corruption_is_refused() {
        for seal in [
            None,
            Some(Seal {
                ino: 77,
                ctime_sec: 1_700_000_001,
                ctime_nsec: 999,
            }),
        ] {
            let h = Header {
                size: 3 << 20,
                block_size: 1 << 20,
                seal,
            };
            let b = h.encode();
            assert_eq!(Header::decode(&b), Ok(h));
            let mut t = b;
            t[30] ^= 4;
            assert!(Header::decode(&t).is_err());
        }
        assert!(Header::decode(b"LMM0").is_err());
    }

    #[test]
    fn a_map_keeps_only_records_that_fit_their_block() {
        let h = Header {
            size: 2500,
            block_size: 1000,
            seal: None,
        };
        let mut bytes = h.encode().to_vec();
        bytes.resize(map_len(3) as usize, 0);
        let rec = |len| Rec {
            crc: 1,
            len,
            atime: 2,
        };
        bytes[rec_offset(0) as usize..][..16].copy_from_slice(&rec(1000).encode());
        // Block 1 claims 999 bytes: not its length, so absent.
        bytes[rec_offset(1) as usize..][..16].copy_from_slice(&rec(999).encode());
        bytes[rec_offset(2) as usize..][..16].copy_from_slice(&rec(500).encode());
        let m = parse_map(&bytes).unwrap();
        assert_eq!(m.recs, vec![Some(rec(1000)), None, Some(rec(500))]);
        // A map cut short: the missing records are absent.
        let m = parse_map(&bytes[..rec_offset(1) as usize + 3]).unwrap();
        assert_eq!(m.recs, vec![Some(rec(1000)), None, None]);
    }
}
