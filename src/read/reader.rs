//! The reader of one open file: ranged GETs pinned to the ETag seen at open,
//! with sequential read-ahead for each of several streams.
//!
//! A stream starts with a window of [`ReadConfig::initial_window`] bytes, so a
//! random read costs one small GET plus that margin. While its reads stay
//! sequential the window doubles each time the reader reaches its second half,
//! up to [`ReadConfig::max_window`] and to its fair share of the
//! [`MemoryBudget`] (the budget divided by the open readers, and by the
//! reader's streams), split into GETs of at most [`ReadConfig::part_size`]
//! running concurrently. Every read-ahead part reserves its bytes from the
//! budget first; one that does not fit is not sent and the window shrinks
//! instead.
//!
//! "Sequential" tolerates the reordering kernel read-ahead and multi-threaded
//! FUSE dispatch produce: a read up to one window (and at least 4 reads of its
//! size) behind the first part held or beyond the last one (or, holding none,
//! around where its last read ended) continues the stream (the gap is
//! fetched).
//!
//! One open file may carry several streams at once: workers forked with a
//! shared descriptor each reading their own range, interleaved tar members,
//! Parquet column chunks read in parallel. A read that continues no stream
//! starts a new one (a seek), and the least recently read of
//! [`MAX_STREAMS`] goes, its GETs nobody awaits cancelled. A random reader
//! so starts a stream with the initial window at each read that lands near
//! none of its streams; one landing near one continues it. Reads of one handle may run concurrently; the lock is
//! never held across a GET.
//!
//! Each read is planned in steps, each a function of its own: pick the stream
//! the read continues ([`Streams::pick`]) or start one ([`Streams::start`]),
//! drop failed parts ([`Stream::drop_failed`]), fetch a reordered read's gap
//! (`Reader::fill_gap`), let consumed parts go ([`Stream::trim_behind`]), grow
//! the window ([`Stream::grow`]), and send the GETs the window needs under the
//! budget (`Reader::schedule`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::ReadConfig;
use super::budget::{MemoryBudget, ReaderGuard, Reservation};
use super::part::{Part, PendingRead, Wanted};
use crate::cache::Cache;
use crate::store::{ObjectStore, Segments, StoreError, Urgency};
use crate::telemetry::metrics as m;

/// Reads of the current read's size by which a read may arrive out of order
/// and still count as sequential ([`Stream::continues_stream`]). 4: kernel
/// read-ahead keeps a few 1 MiB reads in flight per file; reordering seen was
/// up to 2 reads.
const REORDER_READS: u64 = 4;

/// Streams one open file keeps at most ([`Streams`]). 8: a DataLoader
/// forks 4 to 8 workers, which share a descriptor opened before the fork;
/// more streams than that are taken for random reads.
pub const MAX_STREAMS: usize = 8;

/// The parts one stream of reads holds and its window.
struct Stream {
    /// Contiguous parts in offset order: `parts[i].end == parts[i+1].start`.
    parts: VecDeque<Part>,
    /// Current read-ahead window, bytes.
    window: u64,
    /// Offset whose read doubles the window: the middle of the window as it
    /// was when last set (start or doubled). Measured from where the window
    /// was set, not from the last part held: every read tops the parts up to
    /// a full window ahead, so "within half a window of the last part" was
    /// never true again once the window exceeded about twice the read size,
    /// and the window stalled at ~8 MiB instead of growing to `max_window`.
    grow_at: u64,
    /// End offset of the stream's last read: where it is, once every part
    /// it held has been read whole and let go.
    last_end: u64,
}

impl Stream {
    /// A stream whose window starts at `window` bytes, at offset 0.
    fn new(window: u64) -> Self {
        Self {
            parts: VecDeque::new(),
            window,
            grow_at: 0,
            last_end: 0,
        }
    }

    /// A stream started by a read of `[offset, end)` that continued none:
    /// the window starts at `initial`, nothing held yet.
    fn started(offset: u64, end: u64, initial: u64) -> Self {
        Self {
            parts: VecDeque::new(),
            window: initial,
            grow_at: offset.saturating_add(initial / 2),
            last_end: end,
        }
    }

    /// Drops every part when one's GET failed: otherwise every later read of
    /// its range on this handle got the same error without asking S3 again,
    /// so a fault that outlasted the retries poisoned the open file for good.
    /// Dropping all parts (contiguity holds) makes the next read a new GET.
    fn drop_failed(&mut self) {
        if self.parts.iter().any(Part::failed) {
            self.parts.clear();
        }
    }

    /// First and end offset of the bytes held or in flight.
    fn coverage(&self) -> Option<(u64, u64)> {
        Some((self.parts.front()?.start, self.parts.back()?.end))
    }

    /// Where the stream is: the bytes it holds, or the end of its last read
    /// when it holds none.
    fn span(&self) -> (u64, u64) {
        self.coverage().unwrap_or((self.last_end, self.last_end))
    }

    /// How far a read at `offset` is from where this stream's last read
    /// ended, bytes. Not from its span: one worker's read-ahead can reach
    /// past the next worker's position, and that worker's reads belong to
    /// its own stream.
    fn distance(&self, offset: u64) -> u64 {
        offset.abs_diff(self.last_end)
    }

    /// Whether a read of `[offset, end)` continues this stream: it lies
    /// within a tolerance before or after its span. The tolerance is a
    /// window (at least `initial`), and at least [`REORDER_READS`] reads of
    /// this size: the kernel sends read-ahead as several async reads of up to
    /// 1 MiB at once and FUSE dispatch runs them on many threads, so while the
    /// window is still small (64 KiB after open) a 1 MiB read two reads ahead
    /// often arrives first, which reset the window without this tolerance
    /// (docs/READAHEAD.md).
    fn continues_stream(&self, offset: u64, end: u64, initial: u64) -> bool {
        let tolerance = self
            .window
            .max(initial)
            .max((end - offset).saturating_mul(REORDER_READS));
        let (a, b) = self.span();
        offset.saturating_add(tolerance) >= a && offset <= b.saturating_add(tolerance)
    }

    /// Lets parts go that a reader at `offset` has moved past: those more
    /// than `keep_behind` bytes behind it, and every part wholly behind it
    /// whose bytes have all been handed out, with the parts before it.
    ///
    /// Kernel reads arrive at most a few MiB out of order; a later read behind
    /// what is kept is still sequential (within the tolerance) and fetches its
    /// gap again. Keeping a whole window behind held up to `max_window` (64
    /// MiB) of consumed data per open file. A part read whole goes at once:
    /// the kernel's page cache asks for each byte once, and a stream read
    /// with direct I/O moves forward, so nothing is likely to read it again (a
    /// reread costs one GET of its range; `delivered` counts reread bytes
    /// again, so a part read partly twice can go before its last bytes were
    /// asked for, which costs the same). Keeping it until the reader was a
    /// part past it held one part per open file beyond what the stream needs:
    /// with 200 open files and a 256 MiB budget, ~250 MiB of consumed data.
    /// Bytes a forward skip passed over in earlier parts are not waited for.
    fn trim_behind(&mut self, offset: u64, keep_behind: u64) {
        let done = self
            .parts
            .iter()
            .take_while(|p| p.end <= offset)
            .enumerate()
            .filter(|(_, p)| {
                p.delivered >= p.end - p.start || p.end.saturating_add(keep_behind) <= offset
            })
            .map(|(i, _)| i + 1)
            .last()
            .unwrap_or(0);
        self.parts.drain(..done);
    }

    /// Doubles the window (up to `cap`) when a read of `[offset, end)`
    /// reached the second half of it: the reader keeps up.
    fn grow(&mut self, offset: u64, end: u64, cap: u64) {
        if end >= self.grow_at {
            self.window = self.window.saturating_mul(2).min(cap);
            self.grow_at = offset.saturating_add(self.window / 2);
        }
    }

    /// Lets the leading parts go whose every byte was handed out: what the
    /// read just planned took whole (it holds what it waits on). Parts
    /// behind them that were not read whole stay for a late, reordered read.
    fn drop_taken(&mut self) {
        while self
            .parts
            .front()
            .is_some_and(|p| p.delivered >= p.end - p.start)
        {
            self.parts.pop_front();
        }
    }

    /// GETs in flight.
    fn in_flight(&self) -> usize {
        self.parts.iter().filter(|p| !p.is_finished()).count()
    }

    /// What a read of `[offset, end)` waits on: `detached` first, then the
    /// held parts it overlaps (counted as delivered).
    fn wanted(&mut self, detached: Option<&Part>, offset: u64, end: u64) -> Vec<Wanted> {
        debug_assert!(
            self.parts
                .iter()
                .zip(self.parts.iter().skip(1))
                .all(|(p, q)| p.end == q.start),
            "parts are contiguous"
        );
        detached
            .map(Part::wanted)
            .into_iter()
            .chain(
                self.parts
                    .iter_mut()
                    .filter(|p| p.start < end && p.end > offset)
                    .map(|p| p.deliver(offset, end)),
            )
            .collect()
    }
}

/// The streams of one open file, the most recently read first; at most
/// [`MAX_STREAMS`].
#[derive(Default)]
struct Streams(VecDeque<Stream>);

impl Streams {
    /// Moves the stream a read of `[offset, end)` continues to the front:
    /// of those it continues, the one whose last read ended nearest.
    /// `false`: it continues none (a seek).
    fn pick(&mut self, offset: u64, end: u64, initial: u64) -> bool {
        let Some((i, _)) = self
            .0
            .iter()
            .enumerate()
            .filter(|(_, s)| s.continues_stream(offset, end, initial))
            .min_by_key(|(_, s)| s.distance(offset))
        else {
            return false;
        };
        if let Some(s) = self.0.remove(i) {
            self.0.push_front(s);
        }
        true
    }

    /// Starts a stream at a read of `[offset, end)` that continued none,
    /// in front; the least recently read goes beyond [`MAX_STREAMS`] (its
    /// parts nobody awaits are cancelled).
    fn start(&mut self, offset: u64, end: u64, initial: u64) {
        if !self.0.is_empty() {
            metrics::counter!(m::PREFETCH_WINDOW_RESETS).increment(1);
            tracing::debug!(
                offset,
                end,
                streams = self.0.len(),
                "read-ahead: new stream"
            );
        }
        if self.0.len() >= MAX_STREAMS {
            self.0.pop_back();
        }
        self.0.push_front(Stream::started(offset, end, initial));
    }

    /// Streams holding parts (at least 1): those the fair share is split
    /// among. A stream whose parts were all read and let go (a random read's,
    /// one a reader left) takes no share.
    fn holding(&self) -> usize {
        self.0.iter().filter(|s| !s.parts.is_empty()).count().max(1)
    }

    /// Drops the parts of each stream one of whose GETs failed
    /// ([`Stream::drop_failed`]).
    fn drop_failed(&mut self) {
        self.0.iter_mut().for_each(Stream::drop_failed);
    }
}

/// The reader of one open file at one ETag.
pub struct Reader<S> {
    store: Arc<S>,
    key: Arc<str>,
    etag: Arc<str>,
    size: u64,
    config: ReadConfig,
    budget: MemoryBudget,
    cache: Option<Arc<Cache>>,
    streams: Mutex<Streams>,
    _guard: ReaderGuard,
}

impl<S: ObjectStore> Reader<S> {
    /// A reader of `key` (`size` bytes) pinned to `etag`, drawing read-ahead
    /// memory from `budget`.
    pub fn new(
        store: Arc<S>,
        key: &str,
        etag: &str,
        size: u64,
        config: ReadConfig,
        budget: MemoryBudget,
    ) -> Self {
        Self {
            store,
            key: key.into(),
            etag: etag.into(),
            size,
            config,
            _guard: budget.register_reader(),
            budget,
            cache: None,
            streams: Mutex::default(),
        }
    }

    /// Reads go through the data cache `cache` when given (memory and disk
    /// tiers, then S3).
    pub fn with_cache(mut self, cache: Option<Arc<Cache>>) -> Self {
        self.cache = cache;
        self
    }

    /// Starts the reader with `part`, a GET of the whole object at this
    /// reader's ETag sent before the open (small-object read-ahead): reads
    /// are answered from it.
    pub(crate) fn with_whole_object(self, part: Part) -> Self {
        debug_assert!(part.start == 0 && part.end == self.size);
        let mut stream = Stream::new(self.initial());
        stream.parts.push_back(part);
        self.streams.lock().unwrap().0.push_front(stream);
        self
    }

    /// Object size in bytes as seen at open.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Reads `len` bytes at `offset`. Returns fewer only at end of file, and
    /// none at or past it. Errors: the store's ([`StoreError::PreconditionFailed`]
    /// when the object changed since open).
    pub async fn read(&self, offset: u64, len: u32) -> Result<Bytes, StoreError> {
        self.begin_read(offset, len).finish().await
    }

    /// Starts a read of `len` bytes at `offset`: moves the window and sends
    /// the GETs it needs now, without waiting. [`PendingRead::ready`] then
    /// gives the bytes at once when they are all here, else
    /// [`PendingRead::finish`] waits for them. May block on one `pread` of
    /// the disk cache ([`Cache::range_now`]): call it from a FUSE session
    /// thread, not a runtime worker. Panics outside a tokio runtime context
    /// (GETs are spawned with `tokio::spawn`).
    pub fn begin_read(&self, offset: u64, len: u32) -> PendingRead {
        if offset >= self.size || len == 0 {
            return PendingRead::new(offset, offset, Vec::new());
        }
        let end = (offset + len as u64).min(self.size);
        PendingRead::new(offset, end, self.plan(offset, end))
    }

    /// The largest window one of this reader's streams may have now, bytes,
    /// when `streams` of them hold parts: `max_window`, or less while other
    /// readers share the budget: its fair share, divided among them, rounded down to a
    /// power of two, so that parts keep the sizes whose buffers are reused
    /// ([`crate::store::pool`]). The rounding can leave up to half of a
    /// reader's share unused (7.5 MiB with 200 readers of a 1,504 MiB budget
    /// gives 4 MiB windows).
    fn window_cap(&self, streams: usize) -> u64 {
        let share = self.budget.fair_share() / streams.max(1) as u64;
        self.config
            .max_window
            .min(floor_pow2(share))
            .max(self.initial())
    }

    fn initial(&self) -> u64 {
        self.config.initial_window.max(1)
    }

    fn part_size(&self) -> u64 {
        self.config.part_size.max(1)
    }

    /// Under the lock: finds the stream the read continues or starts one,
    /// schedules GETs, and returns the parts covering `[offset, end)`.
    fn plan(&self, offset: u64, end: u64) -> Vec<Wanted> {
        let mut streams = self.streams.lock().unwrap();
        streams.drop_failed();
        let initial = self.initial();
        let mut detached = None;
        let cap = self.window_cap(streams.holding());
        let continued = streams.pick(offset, end, initial);
        if !continued {
            streams.start(offset, end, initial);
        }
        let st = &mut streams.0[0];
        if continued {
            detached = self.fill_gap(st, offset, end);
            let keep_behind = st.window.max(initial).min(self.part_size());
            st.trim_behind(offset, keep_behind);
            st.grow(offset, end, cap);
        }
        self.schedule(st, offset, end);
        let wanted = st.wanted(detached.as_ref(), offset, end);
        // Parts this read took whole go now: a stream left for another keeps
        // no bytes nobody will ask for.
        st.drop_taken();
        st.last_end = end;
        // While demand is held beyond the budget, the other streams let go
        // of what they handed out behind their last reads: a demand part is
        // read whole, so none keeps overdraft nobody waits on, and a handle
        // holds one read's overdraft (per read in flight) however many
        // streams it has. Within the budget they keep their parts for a
        // late, reordered read (forked workers interleave on one handle).
        if self.budget.overdrawn() {
            for s in streams.0.iter_mut().skip(1) {
                let keep_behind = s.window.max(initial).min(self.part_size());
                s.trim_behind(s.last_end, keep_behind);
            }
        }
        wanted
    }

    /// A late, reordered read in front of what is held: fetches the gap
    /// between `offset` and the first part held (at most the tolerance), from
    /// the budget, as parts put in front. Reservations first, GETs only once
    /// the whole gap fits. Beyond the budget only the bytes this read asks for
    /// are fetched, as a part of its own that is not kept (returned): what is
    /// held stays contiguous and is not thrown away.
    fn fill_gap(&self, st: &mut Stream, offset: u64, end: u64) -> Option<Part> {
        let (a, _) = st.coverage()?;
        let mut gap_end = a;
        let mut gap = Vec::new();
        while offset < gap_end {
            let start = gap_end.saturating_sub(self.part_size()).max(offset);
            let reservation = match self.budget.try_reserve(gap_end - start) {
                Some(r) => r,
                None if gap_end <= end => self.budget.reserve_demand(gap_end - start),
                None => break,
            };
            gap.push((start, gap_end, reservation));
            gap_end = start;
        }
        if offset < gap_end {
            metrics::counter!(m::PREFETCH_BUDGET_REFUSALS).increment(1);
            drop(gap);
            let to = end.min(a);
            return Some(self.spawn_get(offset, to, self.budget.reserve_demand(to - offset)));
        }
        for (start, end, reservation) in gap {
            st.parts.push_front(self.spawn_get(start, end, reservation));
        }
        None
    }

    /// Sends the GETs that cover `[offset, end)` and the window after it, in
    /// parts of at most `part_size`, each reserved from the budget, at most
    /// `max_concurrent_gets` in flight. The bytes a read waits for are always
    /// sent (beyond the budget as demand); read-ahead that does not fit
    /// shrinks the window instead.
    fn schedule(&self, st: &mut Stream, offset: u64, end: u64) {
        let initial = self.initial();
        let part_size = self.part_size();
        let target = end.max(offset + st.window).min(self.size);
        let mut next = st.parts.back().map_or(offset, |p| p.end);
        let max_gets = self.config.max_concurrent_gets.max(1);
        let mut in_flight = st.in_flight();
        while next < target {
            if in_flight >= max_gets {
                if next >= end {
                    // Read-ahead waits for a GET of this file to finish; a
                    // later read tops the window up.
                    break;
                }
                if next < offset {
                    // A forward skip would send GETs for bytes nobody asked
                    // for past the cap: let what is held go, start at the read.
                    st.parts.clear();
                    next = offset;
                    in_flight = 0;
                }
            }
            in_flight += 1;
            let len = part_size.min(st.window.max(end.saturating_sub(next)));
            let mut part_end = (next + len).min(self.size);
            let reservation = if let Some(r) = self.budget.try_reserve(part_end - next) {
                r
            } else if next < end {
                // The reader waits for these bytes: never refused, but beyond
                // the budget only the bytes asked for (at most one kernel
                // read, 1 MiB), not the window-sized part around them, nor
                // bytes a forward skip passed over (what is held is let go
                // so the parts stay contiguous).
                if next < offset {
                    st.parts.clear();
                    next = offset;
                }
                part_end = (next + part_size).min(end);
                self.budget.reserve_demand(part_end - next)
            } else {
                // Budget exhausted: shrink to what is already in flight ahead.
                metrics::counter!(m::PREFETCH_BUDGET_REFUSALS).increment(1);
                st.window = floor_pow2(next - offset).max(initial);
                break;
            };
            let part = self.spawn_get(next, part_end, reservation);
            st.parts.push_back(part);
            next = part_end;
        }
    }

    /// The part `[start, end)`: at once when the cache holds it without a
    /// wait ([`Cache::range_now`]), else a GET (through the cache when there
    /// is one).
    fn spawn_get(&self, start: u64, end: u64, reservation: Reservation) -> Part {
        if let Some(segs) = self
            .cache
            .as_ref()
            .and_then(|c| c.range_now(&self.key, &self.etag, self.size, start..end))
        {
            return Part::ready(start, end, reservation, segs);
        }
        let store = self.store.clone();
        let key = self.key.clone();
        let etag = self.etag.clone();
        let cache = self.cache.clone();
        let size = self.size;
        let urgency = Urgency::ahead();
        let u = urgency.clone();
        Part::spawn(start, end, reservation, urgency, async move {
            match cache {
                Some(c) => {
                    c.get_range(&*store, &key, &etag, size, start..end, &u)
                        .await
                }
                None => store
                    .get_range_ahead(&key, start..end, &etag, u)
                    .await
                    .map(Segments::from),
            }
        })
    }
}

/// The largest power of two at most `x` (0 for 0).
fn floor_pow2(x: u64) -> u64 {
    if x == 0 { 0 } else { 1 << x.ilog2() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::mem::MemStore;
    use proptest::strategy::{Just, Strategy};
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 % 251) as u8).collect()
    }

    fn cfg() -> ReadConfig {
        ReadConfig {
            part_size: 1000,
            initial_window: 100,
            max_window: 4000,
            ..ReadConfig::default()
        }
    }

    fn budget() -> MemoryBudget {
        MemoryBudget::new(1 << 20)
    }

    /// A part `[start, end)` whose GET has already ended with `ok` (zeros)
    /// or an error.
    async fn done_part(start: u64, end: u64, ok: bool) -> Part {
        let p = Part::spawn(
            start,
            end,
            budget().reserve_demand(0),
            Urgency::now(),
            async move {
                if ok {
                    Ok(Segments::from(Bytes::from(vec![
                        0u8;
                        (end - start) as usize
                    ])))
                } else {
                    Err(StoreError::Transient("injected".into()))
                }
            },
        );
        while !p.is_finished() {
            tokio::task::yield_now().await;
        }
        p
    }

    async fn stream_with(parts: &[(u64, u64)], window: u64) -> Stream {
        let mut st = Stream::new(window);
        for &(a, b) in parts {
            st.parts.push_back(done_part(a, b, true).await);
        }
        st
    }

    /// The stream continues within a tolerance of a window and of 4 reads
    /// of the read's size, before or after what is held; nothing held is a
    /// seek.
    #[tokio::test]
    async fn a_stream_continues_within_the_reorder_tolerance() {
        let st = stream_with(&[(1000, 2000)], 100).await;
        // 100-byte reads: tolerance max(window 100, 4 x 100) = 400.
        for (offset, yes) in [
            (2000, true),
            (2400, true),
            (2401, false),
            (600, true),
            (599, false),
        ] {
            assert_eq!(
                st.continues_stream(offset, offset + 100, 100),
                yes,
                "read at {offset}"
            );
        }
        // A window wider than 4 reads widens it.
        let wide = stream_with(&[(1000, 2000)], 1000).await;
        assert!(wide.continues_stream(3000, 3100, 100));
        // Nothing held: the end of the stream's last read is where it is.
        let mut empty = Stream::started(5000, 5100, 100);
        assert!(empty.continues_stream(5100, 5200, 100));
        assert!(!empty.continues_stream(0, 100, 100));
        empty.last_end = 100;
        assert!(empty.continues_stream(100, 200, 100));
    }

    /// Parts read whole go at once with every part before them; a part read
    /// in part goes only once the reader is `keep_behind` past its end.
    #[tokio::test]
    async fn consumed_parts_behind_the_reader_go() {
        let mut st = stream_with(&[(0, 100), (100, 200), (200, 300), (300, 400)], 100).await;
        st.parts[1].delivered = 100; // [100, 200) read whole, [0, 100) not
        st.trim_behind(250, 1000);
        assert_eq!(st.coverage(), Some((200, 400)));
        st.parts[0].delivered = 10; // [200, 300) read in part
        st.trim_behind(350, 100);
        assert_eq!(st.coverage(), Some((200, 400)), "50 bytes behind: kept");
        st.trim_behind(400, 100);
        assert_eq!(st.coverage(), Some((300, 400)), "100 bytes behind: gone");
    }

    /// The window doubles when a read reaches its second half, never past
    /// the cap.
    #[tokio::test]
    async fn the_window_grows_at_its_middle() {
        let mut st = stream_with(&[(0, 100)], 100).await;
        st.grow_at = 50;
        st.grow(0, 40, 1000);
        assert_eq!(st.window, 100, "first half: no growth");
        st.grow(40, 60, 1000);
        assert_eq!((st.window, st.grow_at), (200, 140));
        for i in 0..10 {
            st.grow(i * 1000, i * 1000 + 1000, 1000);
        }
        assert_eq!(st.window, 1000, "capped");
    }

    /// A read that continues no stream starts one in front with the initial
    /// window; the least recently read stream goes beyond `MAX_STREAMS`; a
    /// read picks the nearest stream it continues and moves it to the front.
    #[tokio::test]
    async fn streams_start_on_a_seek_and_the_oldest_goes() {
        let mut ss = Streams::default();
        for i in 0..MAX_STREAMS as u64 + 2 {
            assert!(!ss.pick(i * 10_000, i * 10_000 + 100, 100));
            ss.start(i * 10_000, i * 10_000 + 100, 100);
            assert_eq!((ss.0[0].window, ss.0[0].grow_at), (100, i * 10_000 + 50));
        }
        assert_eq!(ss.0.len(), MAX_STREAMS);
        let ends: Vec<u64> = ss.0.iter().map(|s| s.last_end).collect();
        assert_eq!(ends.last(), Some(&20_100), "the two oldest went");
        assert!(ss.pick(50_100, 50_200, 100));
        assert_eq!(ss.0[0].last_end, 50_100, "moved to the front");
        assert_eq!(ss.0.len(), MAX_STREAMS);
        // Two streams a read continues: the nearer one.
        let mut two = Streams::default();
        two.start(0, 1000, 100);
        two.start(1300, 1400, 100);
        assert!(two.pick(1250, 1350, 100));
        assert_eq!(two.0[0].last_end, 1400);
        assert!(two.pick(1050, 1150, 100));
        assert_eq!(two.0[0].last_end, 1000);
    }

    /// One worker's read-ahead reaching past the next worker's position does
    /// not take that worker's reads: the stream whose last read ended there
    /// does, even when the other was read more recently.
    #[tokio::test]
    async fn a_read_goes_to_the_stream_it_follows_not_one_whose_window_covers_it() {
        let mut ss = Streams::default();
        ss.start(5000, 5100, 100); // worker B, nothing held
        let mut a = stream_with(&[(0, 10_000)], 10_000).await; // worker A's window
        a.last_end = 1000;
        ss.0.push_front(a);
        assert!(ss.pick(5100, 5200, 100));
        assert_eq!(ss.0[0].last_end, 5100, "B's stream");
        assert!(ss.pick(1000, 1100, 100));
        assert_eq!(ss.0[0].coverage(), Some((0, 10_000)), "A's stream");
    }

    /// Streams that hold nothing (random reads done, streams left) take no
    /// share of the budget from the one that streams.
    #[tokio::test]
    async fn only_streams_holding_parts_split_the_share() {
        let mut ss = Streams::default();
        assert_eq!(ss.holding(), 1, "at least one");
        for i in 0..7 {
            ss.start(i * 10_000, i * 10_000 + 100, 100);
        }
        ss.0.push_front(stream_with(&[(100_000, 101_000)], 1000).await);
        assert_eq!(ss.holding(), 1);
        ss.0[3]
            .parts
            .push_back(done_part(30_100, 30_200, true).await);
        assert_eq!(ss.holding(), 2);
    }

    /// The parts a read took whole go at once, up to the first one it did
    /// not; those behind the reader stay for late reads.
    #[tokio::test]
    async fn parts_taken_whole_go_up_to_the_first_that_was_not() {
        let mut st = stream_with(&[(0, 100), (100, 200), (200, 300)], 100).await;
        st.parts[0].delivered = 100;
        st.parts[1].delivered = 50;
        st.parts[2].delivered = 100;
        st.drop_taken();
        assert_eq!(st.coverage(), Some((100, 300)));
    }

    /// One failed part makes the reader drop everything it holds.
    #[tokio::test]
    async fn a_failed_part_drops_everything_held() {
        let mut st = stream_with(&[(0, 100)], 100).await;
        st.parts.push_back(done_part(100, 200, false).await);
        st.parts.push_back(done_part(200, 300, true).await);
        st.drop_failed();
        assert!(st.parts.is_empty());
        let mut ok = stream_with(&[(0, 100), (100, 200)], 100).await;
        ok.drop_failed();
        assert_eq!(ok.coverage(), Some((0, 200)));
    }

    #[tokio::test]
    async fn sequential_reads_are_exact_and_grow_window() {
        let store = Arc::new(MemStore::default());
        let d = data(50_000);
        let etag = store.put("k", d.clone());
        let r = Reader::new(store.clone(), "k", &etag, d.len() as u64, cfg(), budget());
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

    /// A read of what the cache's memory tier holds is answered at once
    /// (no task to wait for) and sends no GET.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn reads_from_the_memory_tier_are_ready_at_once() {
        let dir = std::env::temp_dir().join(format!("lakemount-ready-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let config = crate::cache::CacheConfig {
            dir: Some(dir.clone()),
            min_free: crate::cache::Size::Bytes(0),
            block_size: 4096,
            ..Default::default()
        };
        let cache = Cache::open("b", &config).unwrap().unwrap();
        let store = Arc::new(MemStore::default());
        let d = data(10_000);
        let etag = store.put("k", d.clone());
        let size = d.len() as u64;
        let reader = || {
            Reader::new(store.clone(), "k", &etag, size, cfg(), budget())
                .with_cache(Some(cache.clone()))
        };
        // Not in memory yet: a GET (the in-memory store may answer it before
        // the read is looked at, so whether it is ready yet is not asked).
        let first = reader().begin_read(0, 10_000);
        assert_eq!(first.finish().await.unwrap(), d);
        let gets = store.gets.load(Ordering::Relaxed);
        assert!(gets > 0);
        // Every block in memory now: ready without a wait, no GET.
        let again = reader().begin_read(0, 10_000).ready().unwrap().unwrap();
        assert_eq!(again, d);
        let part = reader().begin_read(5000, 100).ready().unwrap().unwrap();
        assert_eq!(part, d[5000..5100]);
        assert_eq!(store.gets.load(Ordering::Relaxed), gets);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// With no memory tier, a small object packed on disk is read at once on
    /// the asking thread too (no task, no GET).
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn packed_objects_on_disk_are_ready_at_once() {
        let dir = std::env::temp_dir().join(format!("lakemount-packed-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let config = crate::cache::CacheConfig {
            dir: Some(dir.clone()),
            min_free: crate::cache::Size::Bytes(0),
            memory_size: 0,
            block_size: 1 << 20,
            ..Default::default()
        };
        let cache = Cache::open("b", &config).unwrap().unwrap();
        let store = Arc::new(MemStore::default());
        let (small, large) = (data(5_000), data(200_000));
        let small_etag = store.put("small", small.clone());
        let large_etag = store.put("large", large.clone());
        let reader = |key: &str, etag: &str, size: usize| {
            Reader::new(store.clone(), key, etag, size as u64, cfg(), budget())
                .with_cache(Some(cache.clone()))
        };
        for (key, etag, d) in [
            ("small", &small_etag, &small),
            ("large", &large_etag, &large),
        ] {
            let first = reader(key, etag, d.len()).begin_read(0, d.len() as u32);
            assert_eq!(&first.finish().await.unwrap(), d);
        }
        let gets = store.gets.load(Ordering::Relaxed);
        // Ready once the restart scan (of an empty cache) has run.
        let deadline = Instant::now() + Duration::from_secs(10);
        let got = loop {
            let r = reader("small", &small_etag, small.len());
            if let Some(got) = r.begin_read(0, 5_000).ready() {
                break got.unwrap();
            }
            assert!(
                Instant::now() < deadline,
                "packed object never ready at once"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert_eq!(got, small);
        let part = reader("small", &small_etag, small.len())
            .begin_read(1_000, 100)
            .ready()
            .unwrap()
            .unwrap();
        assert_eq!(part, small[1_000..1_100]);
        let big = reader("large", &large_etag, large.len()).begin_read(0, 1_000);
        assert_eq!(big.finish().await.unwrap(), large[..1_000]);
        assert_eq!(store.gets.load(Ordering::Relaxed), gets);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The window keeps doubling up to `max_window` while reads stay
    /// sequential, also when it is many reads wide (it used to stop growing at
    /// about twice the read size plus a part: 8 MiB for 1 MiB kernel reads, so
    /// one 8 MiB GET in flight instead of `max_window / part_size`).
    #[tokio::test]
    async fn window_grows_to_max_window_with_small_reads() {
        let store = Arc::new(MemStore::default());
        let d = data(200_000);
        let etag = store.put("k", d.clone());
        let c = ReadConfig {
            max_window: 16_000,
            max_concurrent_gets: 64,
            ..cfg()
        };
        let r = Reader::new(store.clone(), "k", &etag, d.len() as u64, c, budget());
        let mut off = 0;
        while off < 100_000 {
            let b = r.read(off, 333).await.unwrap();
            assert_eq!(&b[..], &d[off as usize..off as usize + b.len()]);
            off += b.len() as u64;
        }
        let ss = r.streams.lock().unwrap();
        let st = &ss.0[0];
        assert_eq!(st.window, 16_000, "window after 100 000 sequential bytes");
        let ahead = st.parts.back().unwrap().end - off;
        assert!(ahead >= 15_000, "only {ahead} bytes read ahead");
    }

    /// A store over [`MemStore`] whose GETs wait while `closed` is set, and
    /// whose next `fail` GETs fail with a transient error.
    #[derive(Default)]
    struct Faulty {
        inner: MemStore,
        closed: std::sync::atomic::AtomicBool,
        fail: std::sync::atomic::AtomicU32,
        /// GETs sent (counted before they wait).
        started: std::sync::atomic::AtomicU64,
    }

    impl ObjectStore for Faulty {
        async fn list_page(
            &self,
            prefix: &str,
            delimiter: Option<&str>,
            continuation: Option<String>,
            start_after: Option<&str>,
            max_keys: i32,
        ) -> Result<crate::store::ListPage, StoreError> {
            self.inner
                .list_page(prefix, delimiter, continuation, start_after, max_keys)
                .await
        }

        async fn head(&self, key: &str) -> Result<crate::store::ObjectMeta, StoreError> {
            self.inner.head(key).await
        }

        async fn get_range(
            &self,
            key: &str,
            range: std::ops::Range<u64>,
            etag: &str,
        ) -> Result<Bytes, StoreError> {
            self.started.fetch_add(1, Ordering::Relaxed);
            while self.closed.load(Ordering::Relaxed) {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            let left = self.fail.load(Ordering::Relaxed);
            if left > 0 {
                self.fail.store(left - 1, Ordering::Relaxed);
                return Err(StoreError::Transient("injected".into()));
            }
            self.inner.get_range(key, range, etag).await
        }
    }

    /// Read-ahead keeps at most `max_concurrent_gets` GETs of one file in
    /// flight, however wide the window.
    #[tokio::test]
    async fn read_ahead_gets_in_flight_are_capped() {
        let store = Arc::new(Faulty::default());
        let d = data(200_000);
        let etag = store.inner.put("k", d.clone());
        let c = ReadConfig {
            max_window: 16_000,
            max_concurrent_gets: 3,
            ..cfg()
        };
        let r = Reader::new(store.clone(), "k", &etag, d.len() as u64, c, budget());
        let mut off = 0;
        while off < 50_000 {
            let b = r.read(off, 1000).await.unwrap();
            assert_eq!(&b[..], &d[off as usize..off as usize + 1000]);
            off += 1000;
        }
        // Hold every GET back, and read on from what is done: read-ahead
        // never has more than 3 GETs out (the window wants 16).
        store.closed.store(true, Ordering::Relaxed);
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        let mut reads = 0;
        loop {
            let next = r.read(off, 1000);
            let Ok(b) = tokio::time::timeout(std::time::Duration::from_millis(20), next).await
            else {
                break;
            };
            let b = b.unwrap();
            assert_eq!(&b[..], &d[off as usize..off as usize + 1000]);
            off += 1000;
            reads += 1;
            let ss = r.streams.lock().unwrap();
            let st = &ss.0[0];
            assert_eq!(st.window, 16_000);
            let in_flight = st.parts.iter().filter(|p| !p.is_finished()).count();
            assert!(in_flight <= 3, "{in_flight} GETs in flight at {off}");
        }
        assert!(reads >= 1, "parts done before the gate closed were served");
        store.closed.store(false, Ordering::Relaxed);
        let b = r.read(off, 1000).await.unwrap();
        assert_eq!(&b[..], &d[off as usize..off as usize + 1000]);
    }

    /// At the cap, a read still sends its own GET (the cap holds back
    /// read-ahead, never a waiting read), and a forward skip sends no GET for
    /// the bytes it skipped.
    #[tokio::test]
    async fn a_waiting_read_is_never_held_back_by_the_cap() {
        let store = Arc::new(Faulty::default());
        let d = data(20_000);
        let etag = store.inner.put("k", d.clone());
        let c = ReadConfig {
            max_concurrent_gets: 1,
            initial_window: 1000,
            ..cfg()
        };
        let r = Reader::new(store.clone(), "k", &etag, d.len() as u64, c, budget());
        store.closed.store(true, Ordering::Relaxed);
        let wait = std::time::Duration::from_millis(20);
        assert!(tokio::time::timeout(wait, r.read(0, 500)).await.is_err());
        assert_eq!(store.started.load(Ordering::Relaxed), 1);
        // 100 bytes past what is held (the part [0, 1000), half read and
        // still downloading): a skip within the reorder tolerance.
        assert!(
            tokio::time::timeout(wait, r.read(1100, 1000))
                .await
                .is_err()
        );
        assert_eq!(
            store.started.load(Ordering::Relaxed),
            2,
            "the second read's GET"
        );
        {
            // Its part [1100, 2100) went to the read whole, which holds it.
            let ss = r.streams.lock().unwrap();
            assert!(ss.0[0].parts.is_empty());
            assert_eq!((ss.0.len(), ss.0[0].last_end), (1, 2100));
        }
        store.closed.store(false, Ordering::Relaxed);
        for off in [0usize, 1100] {
            let b = r.read(off as u64, 1000).await.unwrap();
            assert_eq!(&b[..], &d[off..off + 1000]);
        }
    }

    /// A read-ahead part whose GET has finished is ready for the next read
    /// at once, before any read has waited on it (the FUSE session thread
    /// answers such reads itself); one still in flight is not.
    #[tokio::test]
    async fn finished_read_ahead_is_ready_before_anyone_waits() {
        let store = Arc::new(MemStore::default());
        let d = data(20_000);
        let etag = store.put("k", d.clone());
        let r = Reader::new(store.clone(), "k", &etag, d.len() as u64, cfg(), budget());
        // Grow the window so parts beyond the reads are in flight.
        let mut off = 0u64;
        while off < 4_000 {
            off += r.read(off, 500).await.unwrap().len() as u64;
        }
        let next = r.begin_read(off, 500);
        // Wait for the GETs without awaiting any part's future.
        for _ in 0..1000 {
            if next.ready().is_some() {
                break;
            }
            tokio::task::yield_now().await;
        }
        let b = next
            .ready()
            .expect("finished part not seen as ready")
            .unwrap();
        assert_eq!(&b[..], &d[off as usize..off as usize + 500]);
        // Far ahead of everything read: a new GET, not ready at once.
        assert!(r.begin_read(15_000, 500).ready().is_none());
        let empty = r.begin_read(20_000, 10);
        assert!(empty.ready().unwrap().unwrap().is_empty());
    }

    #[test]
    fn fair_share_windows_are_powers_of_two() {
        assert_eq!(floor_pow2(0), 0);
        assert_eq!(floor_pow2(1), 1);
        assert_eq!(floor_pow2((15 << 20) / 2), 4 << 20);
        assert_eq!(floor_pow2(8 << 20), 8 << 20);
        assert_eq!(floor_pow2(u64::MAX), 1 << 63);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let _g = rt.enter();
        let store = Arc::new(MemStore::default());
        let b = MemoryBudget::new(1_504 << 20);
        let c = ReadConfig {
            max_window: 64 << 20,
            ..ReadConfig::default()
        };
        let one = Reader::new(store.clone(), "k", "e", 1 << 30, c.clone(), b.clone());
        assert_eq!(
            one.window_cap(1),
            64 << 20,
            "a lone reader reaches max_window"
        );
        let others: Vec<_> = (0..199)
            .map(|_| Reader::new(store.clone(), "k", "e", 1 << 30, c.clone(), b.clone()))
            .collect();
        // 1,504 MiB / 200 = 7.52 MiB: 4 MiB windows, a pooled part size.
        assert_eq!(one.window_cap(1), 4 << 20);
        // Its 4 streams share it: 1.88 MiB each, 1 MiB windows.
        assert_eq!(one.window_cap(4), 1 << 20);
        drop(others);
    }

    #[tokio::test]
    async fn seeks_and_eof() {
        let store = Arc::new(MemStore::default());
        let d = data(10_000);
        let etag = store.put("k", d.clone());
        let r = Reader::new(store.clone(), "k", &etag, d.len() as u64, cfg(), budget());
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
        let r = Reader::new(store.clone(), "k", &etag, 5_000, cfg(), budget());
        assert_eq!(r.read(0, 10).await.unwrap().len(), 10);
        store.put("k", vec![0u8; 5_000]);
        let e = r.read(3_000, 10).await.unwrap_err();
        assert_eq!(e, StoreError::PreconditionFailed);
    }

    #[tokio::test]
    async fn random_reads_fetch_only_a_small_margin() {
        let store = Arc::new(MemStore::default());
        let d = data(1 << 20);
        let etag = store.put("k", d.clone());
        let c = ReadConfig {
            part_size: 64 << 10,
            initial_window: 8 << 10,
            max_window: 256 << 10,
            ..ReadConfig::default()
        };
        let r = Reader::new(store.clone(), "k", &etag, d.len() as u64, c, budget());
        // Offsets far apart: every read is a seek.
        for i in 0..20u64 {
            let off = (i * 7919 * 4099) % ((1 << 20) - 4096);
            let off = off - off % 4096;
            let b = r.read(off, 4096).await.unwrap();
            assert_eq!(&b[..], &d[off as usize..off as usize + 4096]);
        }
        let fetched = store.get_bytes.load(Ordering::Relaxed);
        assert!(
            fetched <= 20 * (8 << 10),
            "random 4 KiB reads fetched {fetched} bytes"
        );
    }

    #[tokio::test]
    async fn many_readers_stay_within_budget_plus_demand() {
        let store = Arc::new(MemStore::default());
        let d = data(2 << 20);
        let etag = store.put("k", d.clone());
        let c = ReadConfig {
            part_size: 64 << 10,
            initial_window: 16 << 10,
            max_window: 1 << 20,
            ..ReadConfig::default()
        };
        let budget = MemoryBudget::new(512 << 10);
        let readers: Vec<_> = (0..50)
            .map(|_| {
                Reader::new(
                    store.clone(),
                    "k",
                    &etag,
                    d.len() as u64,
                    c.clone(),
                    budget.clone(),
                )
            })
            .collect();
        let read_len = 32u64 << 10;
        let mut peak = 0;
        for step in 0..64u64 {
            for r in &readers {
                let off = step * read_len;
                let b = r.read(off, read_len as u32).await.unwrap();
                assert_eq!(&b[..], &d[off as usize..(off + read_len) as usize]);
                peak = peak.max(budget.in_use());
            }
        }
        // Read-ahead within the budget; beyond it each reader holds at most
        // the bytes of its one read (demand).
        let bound = budget.total() + 50 * read_len;
        assert!(peak <= bound, "peak {peak} > bound {bound}");
        drop(readers);
        assert_eq!(budget.in_use(), 0, "reservations leaked");
    }

    #[tokio::test]
    async fn a_failed_get_is_not_remembered() {
        let store = Arc::new(Faulty::default());
        let d = data(10_000);
        let etag = store.inner.put("k", d.clone());
        let r = Reader::new(store.clone(), "k", &etag, 10_000, cfg(), budget());
        store.fail.store(100, Ordering::Relaxed);
        assert!(r.read(0, 50).await.is_err());
        store.fail.store(0, Ordering::Relaxed);
        // The same range and the next one, on the same reader, are fetched anew.
        assert_eq!(&r.read(0, 50).await.unwrap()[..], &d[..50]);
        assert_eq!(&r.read(50, 50).await.unwrap()[..], &d[50..100]);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
        /// Any mix of sequential reads, small reorderings and seeks returns the
        /// exact bytes, and returns every reservation when the reader is dropped.
        #[test]
        fn any_read_pattern_is_exact(
            steps in proptest::collection::vec((0u8..4, 1u32..20_000, 0u64..60_000), 1..60)
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let store = Arc::new(MemStore::default());
                let d = data(50_000);
                let etag = store.put("k", d.clone());
                let budget = MemoryBudget::new(16 << 10);
                let r = Reader::new(store.clone(), "k", &etag, d.len() as u64, cfg(), budget.clone());
                let mut pos = 0u64;
                for (kind, len, jump) in steps {
                    pos = match kind {
                        0 | 1 => pos,                         // sequential
                        2 => pos.saturating_sub(len as u64),  // small step back
                        _ => jump,                            // seek
                    };
                    let b = r.read(pos, len).await.unwrap();
                    let start = (pos as usize).min(d.len());
                    let end = (pos as usize + len as usize).min(d.len());
                    assert_eq!(&b[..], &d[start..end]);
                    pos += b.len() as u64;
                }
                drop(r);
                assert_eq!(budget.in_use(), 0);
            });
        }

        /// A stream read in fixed-size reads that arrive out of order by up to
        /// two reads (as kernel read-ahead dispatched on many threads does)
        /// is never taken for a seek: the window never shrinks and reaches
        /// `max_window`; every byte is right. A real seek afterwards resets it.
        #[test]
        fn reordered_stream_grows_and_never_resets(
            perms in proptest::collection::vec(0usize..6, 67),
            read_len in 500u64..2_000,
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let store = Arc::new(MemStore::default());
                let d = data(400_000);
                let etag = store.put("k", d.clone());
                let c = ReadConfig { max_window: 32_000, max_concurrent_gets: 64, ..cfg() };
                let r = Reader::new(store.clone(), "k", &etag, d.len() as u64, c, budget());
                // Each run of 3 reads arrives in one of its 6 orders.
                const ORDERS: [[usize; 3]; 6] =
                    [[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]];
                let order: Vec<usize> = perms
                    .iter()
                    .enumerate()
                    .flat_map(|(b, &p)| ORDERS[p].map(|k| 3 * b + k))
                    .filter(|&i| i < 200)
                    .collect();
                let mut last_window = 0;
                for i in order {
                    let off = i as u64 * read_len;
                    let b = r.read(off, read_len as u32).await.unwrap();
                    assert_eq!(&b[..], &d[off as usize..(off + read_len) as usize]);
                    let w = r.streams.lock().unwrap().0[0].window;
                    assert!(w >= last_window, "window shrank from {last_window} to {w} at read {i}");
                    last_window = w;
                }
                assert_eq!(last_window, 32_000);
                // A jump far back is a seek: back to the initial window.
                r.read(1_000, 100).await.unwrap();
                assert_eq!(r.streams.lock().unwrap().0[0].window, 100);
            });
        }

        /// Streams read in turn through one open file (workers forked with a
        /// shared descriptor, each on its own range), in any interleaving:
        /// every byte is right, each stream keeps its own window, which never
        /// shrinks and reaches `max_window`, and the GETs are a few per
        /// window, not one per read.
        #[test]
        fn interleaved_streams_keep_their_windows(
            streams in 2usize..=MAX_STREAMS,
            read_len in 100u64..300,
            order in proptest::collection::vec(0usize..MAX_STREAMS, 400),
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let store = Arc::new(MemStore::default());
                let region = 200_000u64;
                let d = data(region as usize * streams);
                let etag = store.put("k", d.clone());
                let c = ReadConfig { max_window: 16_000, max_concurrent_gets: 64, ..cfg() };
                let r = Reader::new(store.clone(), "k", &etag, d.len() as u64, c, budget());
                let mut pos: Vec<u64> = (0..streams as u64).map(|k| k * region).collect();
                let mut windows = vec![0u64; streams];
                // `order` interleaves the streams, then each reads 40,000 bytes
                // more (enough to grow any window to the cap), in turn.
                let more = (40_000 / read_len) as usize;
                let turns = order
                    .iter()
                    .map(|&k| k % streams)
                    .chain((0..more).flat_map(|_| 0..streams))
                    .collect::<Vec<_>>();
                for k in turns {
                    let off = pos[k];
                    let b = r.read(off, read_len as u32).await.unwrap();
                    assert_eq!(&b[..], &d[off as usize..(off + read_len) as usize]);
                    pos[k] += read_len;
                    let ss = r.streams.lock().unwrap();
                    assert_eq!(ss.0.len(), streams.min(pos.iter().enumerate().filter(|&(i, &p)| p > i as u64 * region).count()));
                    let w = ss.0[0].window;
                    assert!(w >= windows[k], "stream {k}: window shrank from {} to {w}", windows[k]);
                    windows[k] = w;
                }
                assert!(windows.iter().all(|&w| w == 16_000), "windows {windows:?}");
                let read: u64 = pos.iter().enumerate().map(|(i, &p)| p - i as u64 * region).sum();
                let gets = store.gets.load(Ordering::Relaxed);
                let reads = read / read_len;
                assert!(gets * 2 <= reads, "{gets} GETs for {reads} reads of {read_len} bytes");
            });
        }

        /// A reader that never reads where a stream of its is: each read
        /// starts a stream with the initial window, which never grows; at
        /// most `MAX_STREAMS` are kept, and they hold at most their margins.
        #[test]
        fn a_random_reader_starts_a_stream_per_read(
            slots in Just((0u64..200).collect::<Vec<_>>()).prop_shuffle(),
            read_len in 1u64..1_000,
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let store = Arc::new(MemStore::default());
                let d = data(2_000_000);
                let etag = store.put("k", d.clone());
                let budget = budget();
                let r = Reader::new(store.clone(), "k", &etag, d.len() as u64, cfg(), budget.clone());
                for (n, slot) in slots.into_iter().take(60).enumerate() {
                    let off = slot * 10_000;
                    let b = r.read(off, read_len as u32).await.unwrap();
                    assert_eq!(&b[..], &d[off as usize..(off + read_len) as usize]);
                    let ss = r.streams.lock().unwrap();
                    assert_eq!(ss.0.len(), (n + 1).min(MAX_STREAMS));
                    assert!(ss.0.iter().all(|s| s.window == 100), "a window grew");
                    // A read shorter than the window holds its part, its margin
                    // unread (1 KiB: the budget's unit); one as long is read
                    // whole and let go.
                    let part = if read_len < 100 { 1024 } else { 0 };
                    assert!(budget.in_use() <= MAX_STREAMS as u64 * part, "{} bytes held", budget.in_use());
                }
                assert_eq!(store.gets.load(Ordering::Relaxed), 60, "one GET per read");
            });
        }

        /// Many readers on one budget, each reading forward (on, skipping
        /// ahead, or seeking anywhere): what they hold never exceeds the
        /// budget plus, per reader, the bytes of one read (the demand that is
        /// never refused), and all of it is returned when they are dropped.
        #[test]
        fn budget_bounds_many_readers(
            budget_kib in 8u64..128,
            readers in 1usize..24,
            steps in proptest::collection::vec((0usize..24, 0u8..4, 1u32..4_000, 0u64..200_000), 1..200)
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let store = Arc::new(MemStore::default());
                let d = data(200_000);
                let etag = store.put("k", d.clone());
                let budget = MemoryBudget::new(budget_kib << 10);
                let c = ReadConfig { part_size: 16_000, initial_window: 1_000, max_window: 64_000, ..ReadConfig::default() };
                let rs: Vec<_> = (0..readers)
                    .map(|_| Reader::new(store.clone(), "k", &etag, d.len() as u64, c.clone(), budget.clone()))
                    .collect();
                let mut pos = vec![0u64; readers];
                let max_len = 4_000u64;
                for (who, kind, len, jump) in steps {
                    let i = who % readers;
                    pos[i] = match kind {
                        0 | 1 => pos[i],                      // sequential
                        2 => pos[i] + (jump % 3_000),         // small skip ahead
                        _ => jump,                            // seek
                    };
                    let b = rs[i].read(pos[i], len).await.unwrap();
                    let start = (pos[i] as usize).min(d.len());
                    let end = (pos[i] as usize + len as usize).min(d.len());
                    assert_eq!(&b[..], &d[start..end]);
                    pos[i] += b.len() as u64;
                    let bound = budget.total() + readers as u64 * max_len;
                    assert!(budget.in_use() <= bound, "in use {} > {bound}", budget.in_use());
                }
                drop(rs);
                assert_eq!(budget.in_use(), 0);
            });
        }
    }
}
