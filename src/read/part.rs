//! One ranged GET of read-ahead ([`Part`]) and a read waiting on parts
//! ([`PendingRead`]): what the per-file [`super::Reader`] and the small-object
//! prefetcher ([`super::small`]) share.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};

use super::budget::Reservation;
use crate::store::{Segments, StoreError, Urgency};
use crate::telemetry::metrics as m;

/// Resolves when a part's GET has ended: `Ok` once its bytes are in
/// [`Held::result`], the error otherwise.
pub(crate) type PartFuture = Shared<BoxFuture<'static, Result<(), StoreError>>>;

/// What a read needs of one part: its first byte's offset, the future that
/// resolves when its GET has ended, and the part's bytes.
pub(crate) type Wanted = (u64, PartFuture, Arc<Held>);

/// The bytes of one GET with their budget reservation: the reservation goes
/// back only when the last holder of the part (the reader's list, or a read
/// still waiting on or slicing it) lets go, not when the part leaves the
/// reader's list while a read is still waiting on it. The GET's task holds it
/// weakly, so a part nobody holds any more gives its reservation back at once,
/// even before the cancelled task has been dropped.
pub(crate) struct Held {
    /// The GET's outcome, set by its task as soon as it ends. Unlike
    /// [`Shared::peek`], which sees a result only once some reader has polled
    /// the future, this shows a finished read-ahead part nobody has waited
    /// for yet.
    result: OnceLock<Result<Segments, StoreError>>,
    /// Marked when a read waits for the GET (it may then be hedged).
    urgency: Urgency,
    _reservation: Reservation,
}

impl Held {
    /// The GET's outcome, once it has ended.
    pub(crate) fn result(&self) -> Option<&Result<Segments, StoreError>> {
        self.result.get()
    }
}

/// One ranged GET `[start, end)` of an object, in flight or done.
pub(crate) struct Part {
    pub(crate) start: u64,
    pub(crate) end: u64,
    data: PartFuture,
    /// The part's bytes once its GET ends (before anyone awaits `data`).
    held: Arc<Held>,
    /// The GET's task; `None` for a part whose bytes were at hand ([`Part::ready`]).
    abort: Option<tokio::task::AbortHandle>,
    /// Bytes of this part returned to readers so far.
    pub(crate) delivered: u64,
}

impl Part {
    /// Spawns `fetch` (the GET of `[start, end)`) on the runtime, holding
    /// `reservation` with its bytes; `urgency` is the GET's, marked when a
    /// read waits for the part. Panics outside a tokio runtime context.
    pub(crate) fn spawn<F>(
        start: u64,
        end: u64,
        reservation: Reservation,
        urgency: Urgency,
        fetch: F,
    ) -> Part
    where
        F: Future<Output = Result<Segments, StoreError>> + Send + 'static,
    {
        let held = Arc::new(Held {
            result: OnceLock::new(),
            urgency,
            _reservation: reservation,
        });
        let weak = Arc::downgrade(&held);
        // Boxed: a task's allocation is sized for its future and lives as
        // long as its JoinHandle (here, until the part is dropped), while a
        // boxed future is freed as soon as the GET ends, so a held part does
        // not keep the S3 client's request state (docs/OPERATIONS.md).
        let task = tokio::spawn(Box::pin(async move {
            let got = fetch.await;
            if let Some(h) = weak.upgrade() {
                let _ = h.result.set(got);
            }
        }));
        let abort = task.abort_handle();
        let data = async move {
            task.await
                .map_err(|e| StoreError::Other(format!("GET task ended: {e}")))
        }
        .boxed()
        .shared();
        Part {
            start,
            end,
            data,
            held,
            abort: Some(abort),
            delivered: 0,
        }
    }

    /// A part of `[start, end)` whose bytes `segs` are already at hand (the
    /// memory tier of the cache): no task, so a read of it is answered at once.
    pub(crate) fn ready(start: u64, end: u64, reservation: Reservation, segs: Segments) -> Part {
        let held = Arc::new(Held {
            result: OnceLock::from(Ok(segs)),
            urgency: Urgency::now(),
            _reservation: reservation,
        });
        Part {
            start,
            end,
            data: futures::future::ready(Ok(())).boxed().shared(),
            held,
            abort: None,
            delivered: 0,
        }
    }

    /// The GET has ended (bytes or error are in).
    pub(crate) fn is_finished(&self) -> bool {
        self.abort.as_ref().is_none_or(|a| a.is_finished())
    }

    /// The GET ended with an error.
    pub(crate) fn failed(&self) -> bool {
        matches!(self.held.result(), Some(Err(_)))
    }

    /// What a read of this part waits on.
    pub(crate) fn wanted(&self) -> Wanted {
        (self.start, self.data.clone(), self.held.clone())
    }

    /// Counts `[from, to)` (clamped to the part) as handed to a reader and
    /// gives what the read waits on.
    pub(crate) fn deliver(&mut self, from: u64, to: u64) -> Wanted {
        self.delivered += to.min(self.end).saturating_sub(from.max(self.start));
        self.wanted()
    }

    /// The part's bytes as one buffer for the kernel's page cache, when its
    /// GET has ended with all `size` of them (a copy only when they came in
    /// several segments): counted as handed to a reader, since the reader
    /// reads them from there.
    pub(crate) fn whole_for_page_cache(&mut self, size: u64) -> Option<Bytes> {
        let segs = self.bytes()?;
        let whole = (segs.len() as u64 == size).then(|| segs.slice(0, segs.len()))?;
        self.delivered = size;
        Some(whole)
    }

    /// Bytes of the part's finished GET, if it succeeded.
    pub(crate) fn bytes(&self) -> Option<&Segments> {
        self.held.result()?.as_ref().ok()
    }
}

impl Drop for Part {
    fn drop(&mut self) {
        if let Some(abort) = &self.abort
            && self.data.strong_count().unwrap_or(0) <= 1
        {
            abort.abort();
        }
        if let Some(segs) = self.bytes() {
            let unused = (segs.len() as u64).saturating_sub(self.delivered);
            if unused > 0 {
                metrics::counter!(m::PREFETCH_UNUSED_BYTES).increment(unused);
            }
        }
    }
}

/// A read whose GETs are sent ([`super::Reader::begin_read`]): the parts
/// covering `[offset, end)`.
pub struct PendingRead {
    offset: u64,
    end: u64,
    wanted: Vec<Wanted>,
}

impl PendingRead {
    /// A read of `[offset, end)` out of `wanted` (in offset order, covering it).
    pub(crate) fn new(offset: u64, end: u64, wanted: Vec<Wanted>) -> Self {
        Self {
            offset,
            end,
            wanted,
        }
    }

    /// The bytes, when every part they come from is already here (no wait):
    /// what a sequential reader finds most of the time, answered without a
    /// hop to another thread. `None`: some part is still being fetched.
    pub fn ready(&self) -> Option<Result<Bytes, StoreError>> {
        let bytes = self.assemble()?;
        if !self.wanted.is_empty() {
            metrics::histogram!(m::READ_WAIT_SECONDS).record(0.0);
        }
        Some(bytes)
    }

    /// Waits for the parts and gives the bytes. Errors: the store's.
    pub async fn finish(self) -> Result<Bytes, StoreError> {
        let waited = Instant::now();
        for (_, _, part) in &self.wanted {
            if part.result().is_none() {
                part.urgency.mark();
            }
        }
        for (_, ended, _) in &self.wanted {
            ended.clone().await?;
        }
        if !self.wanted.is_empty() {
            metrics::histogram!(m::READ_WAIT_SECONDS).record(waited.elapsed().as_secs_f64());
        }
        self.assemble().unwrap_or_else(|| {
            // The GET task ended (`ended` was Ok) without a result: only when
            // the part was let go meanwhile, which a waiting read prevents.
            Err(StoreError::Other("GET ended without its bytes".into()))
        })
    }

    /// `[offset, end)` out of the parts (one slice, or one copy when the read
    /// spans parts); the first failed part's error; `None` while a part's GET
    /// has not ended.
    fn assemble(&self) -> Option<Result<Bytes, StoreError>> {
        let (offset, end) = (self.offset, self.end);
        let mut chunks = Vec::with_capacity(self.wanted.len());
        for (start, _, part) in &self.wanted {
            let segs = match part.result()? {
                Ok(segs) => segs,
                Err(e) => return Some(Err(e.clone())),
            };
            let from = offset.max(*start) - start;
            let to = (end.min(start + segs.len() as u64) - start).max(from);
            chunks.push(segs.slice(from as usize, to as usize));
        }
        Some(Ok(match chunks.len() {
            0 => Bytes::new(),
            1 => chunks.pop().unwrap(),
            _ => {
                let mut buf = BytesMut::with_capacity((end - offset) as usize);
                for c in chunks {
                    buf.extend_from_slice(&c);
                }
                buf.freeze()
            }
        }))
    }
}
