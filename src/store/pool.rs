//! Reusable buffers for GET bodies.
//!
//! Read-ahead downloads parts of `read.part_size` bytes (8 MiB) one after
//! another at link speed and drops each soon after the reader consumed it. A
//! fresh buffer per part costs a page fault and a zeroed page for every 4 KiB
//! written into it, and the allocator's purge (`madvise`) when it is freed: on
//! the 10 Gbit/s link profile that was about a third of the daemon's CPU time
//! (`perf`, 2026-12-01, bench/RESULTS.md). Buffers are therefore handed back
//! here when the last [`Bytes`] referring to them is dropped, and the next GET
//! of the same size reuses one whose pages are already mapped.
//!
//! Kept sizes: the part size and every power of two from [`MIN_POOLED`] up to
//! it. Those are the sizes read-ahead parts have: windows grow by doubling
//! from `read.initial_window` and are capped at a power of two when the
//! budget's fair share limits them ([`crate::read::MemoryBudget::fair_share`]).
//! A buffer is only reused for a GET of exactly its size, so the bytes the
//! budget counts are the bytes the buffer holds. Other sizes (the last part of
//! a file, a demand read beyond the budget) are not kept. Freed part buffers
//! of many sizes otherwise stay in the allocator until it returns them
//! (jemalloc's dirty decay, set in src/main.rs).
//!
//! At most `max_idle` bytes wait here unused, the most recently returned ones
//! (the oldest idle buffer is freed first): they are memory outside the
//! read-ahead budget's accounting (docs/READAHEAD.md).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

/// Smallest buffer kept for reuse, bytes. Below 1 MiB the allocator's own
/// size classes serve reuse well, and the cost per byte is in the copy, not in
/// page faults.
pub const MIN_POOLED: usize = 1 << 20;

/// Most idle bytes a pool keeps: eight 8 MiB parts, one full default
/// read-ahead window (`read.max_window`, 64 MiB).
pub const MAX_IDLE: usize = 64 << 20;

/// A pool of byte buffers of a few sizes. Cheap to clone.
#[derive(Clone, Debug)]
pub struct BufferPool {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The buffer sizes kept, bytes, ascending (empty: none).
    sizes: Vec<usize>,
    /// Most idle bytes kept.
    max_idle: usize,
    idle: Mutex<Idle>,
}

#[derive(Debug, Default)]
struct Idle {
    /// Idle buffers, oldest first; each has `len() == 0` and a capacity in
    /// `sizes`.
    bufs: VecDeque<Vec<u8>>,
    /// Sum of their capacities, bytes.
    bytes: usize,
}

impl BufferPool {
    /// A pool keeping buffers of `largest` bytes and of every power of two
    /// from [`MIN_POOLED`] below it, at most `max_idle` bytes of them idle.
    /// `largest` under [`MIN_POOLED`] or `max_idle < MIN_POOLED` keeps none.
    pub fn new(largest: usize, max_idle: usize) -> Self {
        let mut sizes: Vec<usize> = std::iter::successors(Some(MIN_POOLED), |s| s.checked_mul(2))
            .take_while(|&s| s < largest)
            .collect();
        if largest >= MIN_POOLED {
            sizes.push(largest);
        }
        if max_idle < MIN_POOLED {
            sizes.clear();
        }
        Self {
            inner: Arc::new(Inner {
                sizes,
                max_idle,
                idle: Mutex::new(Idle::default()),
            }),
        }
    }

    /// A pool that keeps nothing: every buffer is a new allocation.
    pub fn none() -> Self {
        Self::new(0, 0)
    }

    /// Whether buffers of `len` bytes are kept here.
    fn pools(&self, len: usize) -> bool {
        len <= self.inner.max_idle && self.inner.sizes.binary_search(&len).is_ok()
    }

    /// An empty buffer with capacity for exactly `len` bytes: the most
    /// recently returned idle one of that size when `len` is a kept size (its
    /// pages already mapped), else a new allocation.
    pub fn take(&self, len: usize) -> Vec<u8> {
        if self.pools(len) {
            let mut idle = self.inner.idle.lock().unwrap();
            if let Some(i) = idle.bufs.iter().rposition(|b| b.capacity() == len) {
                let buf = idle.bufs.remove(i).expect("index from rposition");
                idle.bytes -= len;
                return buf;
            }
        }
        Vec::with_capacity(len)
    }

    /// `buf` as [`Bytes`]; a buffer of a kept size comes back to this pool
    /// when the last clone or slice of it is dropped.
    pub fn freeze(&self, buf: Vec<u8>) -> Bytes {
        if !self.pools(buf.capacity()) {
            return Bytes::from(buf);
        }
        Bytes::from_owner(Pooled {
            buf,
            pool: self.clone(),
        })
    }

    /// Keeps `buf` for reuse, freeing the oldest idle buffers to stay within
    /// `max_idle`.
    fn give_back(&self, mut buf: Vec<u8>) {
        buf.clear();
        let mut idle = self.inner.idle.lock().unwrap();
        idle.bytes += buf.capacity();
        idle.bufs.push_back(buf);
        while idle.bytes > self.inner.max_idle {
            let oldest = idle.bufs.pop_front().expect("bytes > 0 means a buffer");
            idle.bytes -= oldest.capacity();
        }
    }

    /// Bytes of idle buffers held now.
    pub fn idle_bytes(&self) -> usize {
        self.inner.idle.lock().unwrap().bytes
    }
}

/// A pooled buffer lent to [`Bytes`]; goes back to the pool on drop.
struct Pooled {
    buf: Vec<u8>,
    pool: BufferPool,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(pool: &BufferPool, len: usize) -> Bytes {
        let mut b = pool.take(len);
        b.resize(len, 7);
        pool.freeze(b)
    }

    #[test]
    fn a_dropped_buffer_is_reused_for_the_same_size() {
        let pool = BufferPool::new(MIN_POOLED, 4 * MIN_POOLED);
        let bytes = filled(&pool, MIN_POOLED);
        let ptr = bytes.as_ptr();
        let slice = bytes.slice(10..20);
        drop(bytes);
        assert_eq!(pool.idle_bytes(), 0, "a slice still holds it");
        assert_eq!(&slice[..], &[7u8; 10]);
        drop(slice);
        assert_eq!(pool.idle_bytes(), MIN_POOLED);
        let again = pool.take(MIN_POOLED);
        assert_eq!(again.as_ptr(), ptr, "same buffer");
        assert!(again.is_empty());
        assert!(again.capacity() == MIN_POOLED);
        assert_eq!(pool.idle_bytes(), 0);
        // Sizes other than the kept ones are neither served nor kept.
        drop(pool.freeze(again));
        let other = pool.take(2 * MIN_POOLED);
        assert_ne!(other.as_ptr(), ptr);
        drop(other);
        drop(filled(&pool, 2 * MIN_POOLED));
        drop(filled(&pool, 4096));
        drop(filled(&pool, MIN_POOLED + 1));
        assert_eq!(pool.idle_bytes(), MIN_POOLED);
    }

    #[test]
    fn powers_of_two_up_to_the_part_size_are_kept_each_for_its_own_size() {
        // A 6 MiB part size: 1, 2 and 4 MiB (powers of two below it) and 6 MiB.
        let part = 6 * MIN_POOLED;
        let pool = BufferPool::new(part, 64 * MIN_POOLED);
        let sizes = [MIN_POOLED, 2 * MIN_POOLED, 4 * MIN_POOLED, part];
        let ptrs: Vec<_> = sizes
            .iter()
            .map(|&n| {
                let b = filled(&pool, n);
                b.as_ptr()
            })
            .collect();
        assert_eq!(pool.idle_bytes(), sizes.iter().sum::<usize>());
        // 3 MiB and 8 MiB are not kept sizes.
        drop(filled(&pool, 3 * MIN_POOLED));
        drop(filled(&pool, 8 * MIN_POOLED));
        assert_eq!(pool.idle_bytes(), sizes.iter().sum::<usize>());
        for (&n, &ptr) in sizes.iter().zip(&ptrs).rev() {
            let b = pool.take(n);
            assert_eq!(b.as_ptr(), ptr, "{n}-byte buffer reused for its size");
            assert_eq!(b.capacity(), n);
        }
        assert_eq!(pool.idle_bytes(), 0);
    }

    #[test]
    fn idle_bytes_stay_within_the_limit_oldest_freed_first() {
        let pool = BufferPool::new(4 * MIN_POOLED, 3 * MIN_POOLED);
        let held: Vec<Bytes> = (0..5).map(|_| filled(&pool, MIN_POOLED)).collect();
        drop(held);
        assert_eq!(pool.idle_bytes(), 3 * MIN_POOLED);
        // A 2 MiB buffer returned pushes the two oldest 1 MiB ones out.
        let two = filled(&pool, 2 * MIN_POOLED);
        let ptr = two.as_ptr();
        drop(two);
        assert_eq!(pool.idle_bytes(), 3 * MIN_POOLED);
        let again = pool.take(2 * MIN_POOLED);
        assert_eq!(again.as_ptr(), ptr);
        assert_eq!(pool.idle_bytes(), MIN_POOLED);
        drop(again);
        // A buffer larger than the idle limit is never kept.
        drop(filled(&pool, 4 * MIN_POOLED));
        assert_eq!(pool.idle_bytes(), MIN_POOLED);
        for none in [BufferPool::none(), BufferPool::new(4096, 1 << 30)] {
            drop(filled(&none, MIN_POOLED));
            drop(filled(&none, 4096));
            assert_eq!(none.idle_bytes(), 0);
        }
    }
}
