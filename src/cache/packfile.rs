//! On-disk format of a **pack**: one file holding many small cached objects
//! back to back, each a record of a header and the object's bytes. Small
//! objects (below `cache.passthrough_min_size`, one block) are stored so
//! because two files per object (data file and block map) cost two inode
//! creations on the first read and two opens on every later one, more than
//! reading the object itself (docs/CACHE.md has the measurement).
//!
//! ```text
//! <seq>.pack: records back to back, each
//!   header  0..4   magic "LMR1"
//!           4..8   CRC32C of bytes 8..40 (u32 LE)
//!           8..24  object id (16 bytes)
//!          24..28  object length, bytes (u32 LE, > 0)
//!          28..32  CRC32C of the object's bytes (u32 LE)
//!          32..36  last read, seconds since the Unix epoch (u32 LE)
//!          36..40  0
//!   data    the object's bytes
//! ```
//!
//! A record is written with one `pwrite` at the end of the file. A crash may
//! leave the last record torn: its header or data CRC32C fails, and the walk
//! of the pack stops there.

use std::fs::File;
use std::os::unix::fs::FileExt;

use super::ObjectId;

/// Magic at the start of every record ("LakeMount Record v1").
pub const REC_MAGIC: &[u8; 4] = b"LMR1";
/// Bytes of a record header.
pub const HEADER_LEN: u64 = 40;

/// The header of one record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecHeader {
    /// The object version.
    pub obj: ObjectId,
    /// Object length, bytes (> 0).
    pub len: u32,
    /// CRC32C of the object's bytes.
    pub crc: u32,
    /// Last read, seconds since the Unix epoch (persisted at most every TTL/16).
    pub atime: u32,
}

impl RecHeader {
    /// The 40 bytes of this header.
    pub fn encode(&self) -> [u8; HEADER_LEN as usize] {
        let mut b = [0u8; HEADER_LEN as usize];
        b[0..4].copy_from_slice(REC_MAGIC);
        b[8..24].copy_from_slice(&self.obj.0);
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..32].copy_from_slice(&self.crc.to_le_bytes());
        b[32..36].copy_from_slice(&self.atime.to_le_bytes());
        let check = crc32c::crc32c(&b[8..]);
        b[4..8].copy_from_slice(&check.to_le_bytes());
        b
    }

    /// A header from its 40 bytes; `None` for a torn or garbage one.
    pub fn decode(b: &[u8]) -> Option<RecHeader> {
        let b: &[u8; HEADER_LEN as usize] = b.get(..HEADER_LEN as usize)?.try_into().ok()?;
        let u = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        if &b[..4] != REC_MAGIC || crc32c::crc32c(&b[8..]) != u(4) || u(24) == 0 {
            return None;
        }
        Some(RecHeader {
            obj: ObjectId(b[8..24].try_into().unwrap()),
            len: u(24),
            crc: u(28),
            atime: u(32),
        })
    }

    /// Bytes of the whole record (header and data).
    pub fn record_len(&self) -> u64 {
        HEADER_LEN + self.len as u64
    }
}

/// One record as found in a pack: its header and where it starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found {
    /// Offset of the record's header in the pack, bytes.
    pub off: u64,
    /// Its header.
    pub header: RecHeader,
}

/// Walks the records of the pack `f` (`file_len` bytes) from the start,
/// reading headers only, and stops at the first torn or garbage header or at
/// a record that runs past the end. Errors: a read error (what was found
/// before it is lost; the caller treats the pack as unreadable).
pub fn walk(f: &File, file_len: u64) -> std::io::Result<Vec<Found>> {
    let mut out = Vec::new();
    let mut off = 0;
    let mut b = [0u8; HEADER_LEN as usize];
    while off + HEADER_LEN <= file_len {
        f.read_exact_at(&mut b, off)?;
        let Some(header) = RecHeader::decode(&b) else {
            break;
        };
        if off + header.record_len() > file_len {
            break;
        }
        out.push(Found { off, header });
        off += header.record_len();
    }
    Ok(out)
}

/// Every record of a whole pack held in `bytes` whose header and data check
/// out (for tests and tools; the cache itself checks data when it reads it).
pub fn parse_pack(bytes: &[u8]) -> Vec<Found> {
    let mut out = Vec::new();
    let mut off = 0usize;
    while let Some(header) = bytes.get(off..).and_then(RecHeader::decode) {
        let start = off + HEADER_LEN as usize;
        let Some(data) = bytes.get(start..start + header.len as usize) else {
            break;
        };
        if crc32c::crc32c(data) == header.crc {
            out.push(Found {
                off: off as u64,
                header,
            });
        }
        off = start + header.len as usize;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(tag: u8, len: u32) -> (RecHeader, Vec<u8>) {
        let data = vec![tag; len as usize];
        let h = RecHeader {
            obj: ObjectId([tag; 16]),
            len,
            crc: crc32c::crc32c(&data),
            atime: 1_700_000_000,
        };
        (h, data)
    }

    #[test]
    fn headers_round_trip_and_torn_ones_are_refused() {
        let (h, _) = rec(7, 1234);
        let b = h.encode();
        assert_eq!(RecHeader::decode(&b), Some(h));
        for i in [0, 5, 9, 25, 33] {
            let mut bad = b;
            bad[i] ^= 1;
            assert_eq!(RecHeader::decode(&bad), None, "byte {i} flipped");
        }
        assert_eq!(RecHeader::decode(&b[..39]), None);
    }

    #[test]
    fn a_walk_stops_at_a_torn_tail_and_parse_skips_bad_data() {
        let mut bytes = Vec::new();
        for (tag, len) in [(1, 100), (2, 5000), (3, 7)] {
            let (h, d) = rec(tag, len);
            bytes.extend_from_slice(&h.encode());
            bytes.extend_from_slice(&d);
        }
        let whole = bytes.len() as u64;
        // A torn fourth record: its header only, half of it.
        let (h, _) = rec(4, 900);
        bytes.extend_from_slice(&h.encode()[..20]);
        let p = std::env::temp_dir().join(format!("lakemount-pack-test-{}", std::process::id()));
        std::fs::write(&p, &bytes).unwrap();
        let f = File::open(&p).unwrap();
        let found = walk(&f, bytes.len() as u64).unwrap();
        assert_eq!(found.len(), 3);
        assert_eq!(found[1].off, HEADER_LEN + 100);
        assert_eq!(found[2].header.obj, ObjectId([3; 16]));
        // A record cut short is not found either.
        assert_eq!(walk(&f, whole - 1).unwrap().len(), 2);
        std::fs::remove_file(&p).unwrap();
        // A flipped data byte: the walk (headers only) finds it, parse does not.
        bytes[HEADER_LEN as usize + 100 + HEADER_LEN as usize + 10] ^= 1;
        let parsed = parse_pack(&bytes);
        assert_eq!(parsed.len(), 2);
        assert!(parsed.iter().all(|r| r.header.obj != ObjectId([2; 16])));
    }
}
