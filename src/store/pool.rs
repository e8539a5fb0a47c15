//! Reusable buffers for GET bodies.
//!
//! Read-ahead downloads parts of `read.part_size` bytes (8 MiB) one after
//! another at link speed and drops each soon after the reader consumed it. A
//! fresh buffer per part costs a page fault and a zeroed page for every 4 KiB
//! written into it, and the allocator's purge (`madvise`) when it is freed: on
//! the 10 Gbit/s link profile that was about a third of the daemon's CPU time
//! (`perf`, 2026-12-01, bench/RESULTS.md). Buffers of exactly the part size
//! are therefore handed back here when the last [`Bytes`] referring to them is
//! dropped, and the next GET of a whole part reuses one whose pages are
//! already mapped. Only that one size is kept: parts of other sizes (the first
//! parts of a growing window, windows capped by the budget's fair share, the
//! last part of a file) are rarer and would only churn through the pool.
//!
//! At most `max_idle` bytes wait here unused: they are memory outside the
//! read-ahead budget's accounting (docs/OPERATIONS.md, "Memory").

use std::sync::{Arc, Mutex};

use bytes::Bytes;

/// Smallest buffer kept for reuse, bytes. Below 1 MiB the allocator's own
/// size classes serve reuse well, and the cost per byte is in the copy, not in
/// page faults.
pub const MIN_POOLED: usize = 1 << 20;

/// Most idle bytes a pool keeps: eight 8 MiB parts, one full default
/// read-ahead window (`read.max_window`, 64 MiB).
pub const MAX_IDLE: usize = 64 << 20;

/// A pool of byte buffers of one size. Cheap to clone.
#[derive(Clone, Debug)]
pub struct BufferPool {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The one buffer size kept, bytes (0: none).
    size: usize,
    /// Most idle buffers kept.
    max_bufs: usize,
    /// Idle buffers; each has `len() == 0` and capacity `size`.
    idle: Mutex<Vec<Vec<u8>>>,
}

impl BufferPool {
    /// A pool keeping buffers of exactly `size` bytes, at most `max_idle`
    /// bytes of them idle. Sizes under [`MIN_POOLED`] and `max_idle < size`
    /// keep none.
    pub fn new(size: usize, max_idle: usize) -> Self {
        let size = if size >= MIN_POOLED { size } else { 0 };
        Self {
            inner: Arc::new(Inner {
                size,
                max_bufs: max_idle.checked_div(size).unwrap_or(0),
                idle: Mutex::new(Vec::new()),
            }),
        }
    }

    /// A pool that keeps nothing: every buffer is a new allocation.
    pub fn none() -> Self {
        Self::new(0, 0)
    }

    /// Whether buffers of `len` bytes are kept here.
    fn pools(&self, len: usize) -> bool {
        self.inner.max_bufs > 0 && len == self.inner.size
    }

    /// An empty buffer with capacity for exactly `len` bytes: an idle one when
    /// `len` is the pooled size and one is idle (its pages already mapped),
    /// else a new allocation.
    pub fn take(&self, len: usize) -> Vec<u8> {
        if self.pools(len)
            && let Some(buf) = self.inner.idle.lock().unwrap().pop()
        {
            return buf;
        }
        Vec::with_capacity(len)
    }

    /// `buf` as [`Bytes`]; a buffer of the pooled size comes back to this
    /// pool when the last clone or slice of it is dropped.
    pub fn freeze(&self, buf: Vec<u8>) -> Bytes {
        if !self.pools(buf.capacity()) {
            return Bytes::from(buf);
        }
        Bytes::from_owner(Pooled {
            buf,
            pool: self.clone(),
        })
    }

    /// Keeps `buf` for reuse unless the pool is full (then it is freed).
    fn give_back(&self, mut buf: Vec<u8>) {
        buf.clear();
        let mut idle = self.inner.idle.lock().unwrap();
        if idle.len() < self.inner.max_bufs {
            idle.push(buf);
        }
    }

    /// Bytes of idle buffers held now.
    pub fn idle_bytes(&self) -> usize {
        self.inner.idle.lock().unwrap().len() * self.inner.size
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
        // Other sizes are neither served from the pool nor kept in it.
        drop(pool.freeze(again));
        let other = pool.take(2 * MIN_POOLED);
        assert_ne!(other.as_ptr(), ptr);
        drop(other);
        drop(filled(&pool, 2 * MIN_POOLED));
        drop(filled(&pool, 4096));
        assert_eq!(pool.idle_bytes(), MIN_POOLED);
    }

    #[test]
    fn idle_bytes_stay_within_the_limit() {
        let pool = BufferPool::new(MIN_POOLED, 3 * MIN_POOLED);
        let held: Vec<Bytes> = (0..5).map(|_| filled(&pool, MIN_POOLED)).collect();
        drop(held);
        assert_eq!(pool.idle_bytes(), 3 * MIN_POOLED);
        for none in [BufferPool::none(), BufferPool::new(4096, 1 << 30)] {
            drop(filled(&none, MIN_POOLED));
            drop(filled(&none, 4096));
            assert_eq!(none.idle_bytes(), 0);
        }
    }
}
