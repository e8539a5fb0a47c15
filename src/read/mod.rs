//! The read path of one open file: ranged GETs pinned to the ETag seen at open,
//! with sequential read-ahead.
//!
//! A handle starts with a window of [`ReadConfig::initial_window`] bytes, so a
//! random read costs one small GET. While reads stay sequential (each starts
//! inside the data already fetched or being fetched) the window doubles up to
//! [`ReadConfig::max_window`], split into GETs of at most
//! [`ReadConfig::part_size`] running concurrently. A read outside that range is
//! a seek: the parts in flight are cancelled and the window starts small again.
//! Reads of one handle may run concurrently; the lock is never held across a GET.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use serde::Deserialize;

use crate::store::{ObjectStore, StoreError};

/// Read-path settings (`[read]` in the config file). Sizes in bytes.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ReadConfig {
    /// Largest single ranged GET. 8 MiB keeps per-request overhead under a few
    /// percent at loopback/LAN speeds while one failed part costs little to retry.
    pub part_size: u64,
    /// Window after open or a seek: what a random read fetches at least.
    /// 256 KiB covers one kernel read-ahead request (128 KiB) twice.
    pub initial_window: u64,
    /// Largest read-ahead window per open file. 64 MiB is 8 parts in flight,
    /// enough to fill a 10 Gbit/s link at 50 ms per GET.
    pub max_window: u64,
}

impl Default for ReadConfig {
    fn default() -> Self {
        Self {
            part_size: 8 << 20,
            initial_window: 256 << 10,
            max_window: 64 << 20,
        }
    }
}

type PartFuture = Shared<BoxFuture<'static, Result<Bytes, StoreError>>>;

struct Part {
    start: u64,
    end: u64,
    data: PartFuture,
    abort: tokio::task::AbortHandle,
}

#[derive(Default)]
struct State {
    /// Contiguous parts in offset order: `parts[i].end == parts[i+1].start`.
    parts: VecDeque<Part>,
    /// Current read-ahead window, bytes.
    window: u64,
}

impl Drop for State {
    fn drop(&mut self) {
        for p in &self.parts {
            abort_if_unused(p);
        }
    }
}

/// Cancels the GET of a part nobody awaits any more; a part another read of
/// the same handle is waiting for runs on.
fn abort_if_unused(p: &Part) {
    if p.data.strong_count().unwrap_or(0) <= 1 {
        p.abort.abort();
    }
}

/// The reader of one open file at one ETag.
pub struct Reader<S> {
    store: Arc<S>,
    key: Arc<str>,
    etag: Arc<str>,
    size: u64,
    config: ReadConfig,
    state: Mutex<State>,
}

impl<S: ObjectStore> Reader<S> {
    /// A reader of `key` (`size` bytes) pinned to `etag`.
    pub fn new(store: Arc<S>, key: &str, etag: &str, size: u64, config: ReadConfig) -> Self {
        let window = config.initial_window.max(1);
        Self {
            store,
            key: key.into(),
            etag: etag.into(),
            size,
            config,
            state: Mutex::new(State {
                parts: VecDeque::new(),
                window,
            }),
        }
    }

    /// Object size in bytes as seen at open.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Reads `len` bytes at `offset`. Returns fewer only at end of file, and
    /// none at or past it. Errors: the store's ([`StoreError::PreconditionFailed`]
    /// when the object changed since open).
    pub async fn read(&self, offset: u64, len: u32) -> Result<Bytes, StoreError> {
        if offset >= self.size || len == 0 {
            return Ok(Bytes::new());
        }
        let end = (offset + len as u64).min(self.size);
        let wanted = self.plan(offset, end);
        let mut chunks = Vec::with_capacity(wanted.len());
        for (start, data) in wanted {
            let bytes = data.await?;
            let from = offset.max(start) - start;
            let to = (end.min(start + bytes.len() as u64) - start).max(from);
            chunks.push(bytes.slice(from as usize..to as usize));
        }
        Ok(match chunks.len() {
            1 => chunks.pop().unwrap(),
            _ => {
                let mut buf = BytesMut::with_capacity((end - offset) as usize);
                for c in chunks {
                    buf.extend_from_slice(&c);
                }
                buf.freeze()
            }
        })
    }

    /// Under the lock: decides sequential vs. seek, schedules GETs, and returns
    /// the parts covering `[offset, end)`.
    ///
    /// "Sequential" tolerates the reordering that kernel read-ahead and
    /// multi-threaded FUSE dispatch produce: a read up to one window behind the
    /// first part or beyond the last one continues the stream (the gap is
    /// fetched) instead of resetting it.
    fn plan(&self, offset: u64, end: u64) -> Vec<(u64, PartFuture)> {
        let mut st = self.state.lock().unwrap();
        let tolerance = st.window.max(self.config.initial_window);
        let coverage = st
            .parts
            .front()
            .map(|p| p.start)
            .zip(st.parts.back().map(|p| p.end));
        let sequential = coverage.is_some_and(|(a, b)| {
            offset.saturating_add(tolerance) >= a && offset <= b.saturating_add(tolerance)
        });
        if let (true, Some((a, b))) = (sequential, coverage) {
            // Fetch a gap in front (a late, reordered read).
            let mut gap_end = a;
            while offset < gap_end {
                let start = gap_end
                    .saturating_sub(self.config.part_size.max(1))
                    .max(offset);
                let part = self.spawn_get(start, gap_end);
                st.parts.push_front(part);
                gap_end = start;
            }
            // Drop parts the reader is more than a window past.
            while st
                .parts
                .front()
                .is_some_and(|p| p.end.saturating_add(tolerance) <= offset)
            {
                let p = st.parts.pop_front().unwrap();
                abort_if_unused(&p);
            }
            // The reader keeps up: it reached the last half of the window.
            if end.saturating_add(st.window / 2) >= b {
                st.window = (st.window.saturating_mul(2)).min(self.config.max_window.max(1));
            }
        } else {
            for p in st.parts.drain(..) {
                abort_if_unused(&p);
            }
            st.window = self.config.initial_window.max(1);
        }
        let target = end.max(offset + st.window).min(self.size);
        let mut next = st.parts.back().map_or(offset, |p| p.end);
        while next < target {
            let len = self
                .config
                .part_size
                .max(1)
                .min(st.window.max(end.saturating_sub(next)));
            let part_end = (next + len).min(self.size);
            let part = self.spawn_get(next, part_end);
            st.parts.push_back(part);
            next = part_end;
        }
        st.parts
            .iter()
            .filter(|p| p.start < end && p.end > offset)
            .map(|p| (p.start, p.data.clone()))
            .collect()
    }

    fn spawn_get(&self, start: u64, end: u64) -> Part {
        let store = self.store.clone();
        let key = self.key.clone();
        let etag = self.etag.clone();
        let task = tokio::spawn(async move { store.get_range(&key, start..end, &etag).await });
        let abort = task.abort_handle();
        let data = async move {
            task.await
                .unwrap_or_else(|e| Err(StoreError::Other(format!("GET task ended: {e}"))))
        }
        .boxed()
        .shared();
        Part {
            start,
            end,
            data,
            abort,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::mem::MemStore;
    use std::sync::atomic::Ordering;

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 % 251) as u8).collect()
    }

    fn cfg() -> ReadConfig {
        ReadConfig {
            part_size: 1000,
            initial_window: 100,
            max_window: 4000,
        }
    }

    #[tokio::test]
    async fn sequential_reads_are_exact_and_grow_window() {
        let store = Arc::new(MemStore::default());
        let d = data(50_000);
        let etag = store.put("k", d.clone());
        let r = Reader::new(store.clone(), "k", &etag, d.len() as u64, cfg());
        let mut got = Vec::new();
        let mut off = 0;
        loop {
            let b = r.read(off, 333).await.unwrap();
            if b.is_empty() {
                break;
            }
            off += b.len() as u64;
            got.extend_from_slice(&b);
        }
        assert_eq!(got, d);
        // 50 000 bytes in parts of at most 1000: at least 50 GETs, and far fewer
        // than one per 333-byte read (151 reads) once the window has grown.
        let gets = store.gets.load(Ordering::Relaxed);
        assert!((50..=70).contains(&gets), "gets = {gets}");
    }

    #[tokio::test]
    async fn seeks_and_eof() {
        let store = Arc::new(MemStore::default());
        let d = data(10_000);
        let etag = store.put("k", d.clone());
        let r = Reader::new(store.clone(), "k", &etag, d.len() as u64, cfg());
        for (off, len) in [(9_990, 100), (5, 10), (4_000, 2_500), (0, 1), (9_999, 1)] {
            let b = r.read(off, len).await.unwrap();
            let end = (off as usize + len as usize).min(d.len());
            assert_eq!(&b[..], &d[off as usize..end], "read {off}+{len}");
        }
        assert!(r.read(10_000, 10).await.unwrap().is_empty());
        assert!(r.read(20_000, 10).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn changed_object_is_an_error_not_new_bytes() {
        let store = Arc::new(MemStore::default());
        let etag = store.put("k", data(5_000));
        let r = Reader::new(store.clone(), "k", &etag, 5_000, cfg());
        assert_eq!(r.read(0, 10).await.unwrap().len(), 10);
        store.put("k", vec![0u8; 5_000]);
        let e = r.read(3_000, 10).await.unwrap_err();
        assert_eq!(e, StoreError::PreconditionFailed);
    }
}
