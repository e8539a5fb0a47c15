//! Bytes of one range held as consecutive segments (e.g. the blocks of the
//! data cache), joined only when a reader asks for bytes that span two.

use bytes::{Bytes, BytesMut};

/// Consecutive byte segments forming one range. Cloning is cheap (reference
/// counts); [`Segments::slice`] copies only when its range crosses a segment
/// boundary. FUSE reads are at most 1 MiB and the cache's blocks are
/// block-aligned, so a read of a cached range is usually one slice, no copy.
#[derive(Clone, Debug, Default)]
pub struct Segments {
    segs: Vec<Bytes>,
    len: usize,
}

impl Segments {
    /// An empty range.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `b` after the bytes held (empty segments are dropped).
    pub fn push(&mut self, b: Bytes) {
        if !b.is_empty() {
            self.len += b.len();
            self.segs.push(b);
        }
    }

    /// Total length, bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no bytes are held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes `[from, to)` of the range (clamped to its length): a zero-copy
    /// slice when they lie in one segment, else a copy joining them.
    pub fn slice(&self, from: usize, to: usize) -> Bytes {
        let to = to.min(self.len);
        if from >= to {
            return Bytes::new();
        }
        let mut at = 0usize;
        let mut out: Option<BytesMut> = None;
        for s in &self.segs {
            let (s_start, s_end) = (at, at + s.len());
            at = s_end;
            if s_end <= from {
                continue;
            }
            if s_start >= to {
                break;
            }
            let part = s.slice(from.max(s_start) - s_start..to.min(s_end) - s_start);
            if out.is_none() && s_start <= from && to <= s_end {
                return part;
            }
            out.get_or_insert_with(|| BytesMut::with_capacity(to - from))
                .extend_from_slice(&part);
        }
        out.map(BytesMut::freeze).unwrap_or_default()
    }
}

impl From<Bytes> for Segments {
    fn from(b: Bytes) -> Self {
        let mut s = Segments::new();
        s.push(b);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_within_and_across_segments() {
        let mut s = Segments::new();
        for part in [&b"abc"[..], b"", b"defg", b"h"] {
            s.push(Bytes::copy_from_slice(part));
        }
        assert_eq!(s.len(), 8);
        let all = b"abcdefgh";
        for from in 0..=9 {
            for to in 0..=9 {
                let want: &[u8] = if from < to.min(8) {
                    &all[from..to.min(8)]
                } else {
                    b""
                };
                assert_eq!(&s.slice(from, to)[..], want, "{from}..{to}");
            }
        }
        // Within one segment: the same memory, no copy.
        let seg = s.slice(3, 7);
        assert_eq!(seg.as_ptr(), s.segs[1].as_ptr());
    }
}
