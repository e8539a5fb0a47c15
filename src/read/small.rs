//! Small-object read-ahead: a loader that opens one small object per sample
//! with a few synchronous workers runs at (workers / first-byte latency), far
//! below what the server can serve in parallel. When an open of a small
//! object (at most [`ReadConfig::small_max_size`] bytes) finds nothing
//! prefetched, the other small objects of its directory are fetched in the
//! background, many GETs at once, each pinned to the ETag its listing showed,
//! and held until they are opened ([`SmallPrefetch::take`]): the open then
//! reads them with no GET of its own.
//!
//! Bounds and rules:
//! - Bytes fetched but not opened yet ("unread") never exceed the
//!   small-object budget ([`ReadConfig::small_budget_bytes`]), reserved from
//!   the read-ahead [`MemoryBudget`] too. When it is full, fetching stops
//!   until opens take objects: unread objects are never dropped to make room
//!   for more prefetch, so a data set larger than the budget is not thrashed.
//!   With a data cache, objects leave memory and that budget: on a mount
//!   without opens when pushed to the page cache
//!   ([`SmallPrefetch::delivered`]); with opens, written to the data cache
//!   when memory runs short ([`SmallPrefetch::spill`]). Until the loader is
//!   seen at them they count against a wider bound, half the data cache's
//!   size limit ([`SmallPrefetch::ahead_cap`]). A loader that sends no
//!   request per file is never seen at pushed objects: when prefetch has
//!   waited at that bound for [`SILENCE`] with no sign of the loader, the
//!   kernel is asked for one ([`SmallPrefetch::on_silent`]).
//! - At most [`ReadConfig::small_max_in_flight`] prefetch GETs at once. An
//!   open never waits in the prefetch queue: a queued object it opens leaves
//!   the queue and is fetched by the open's own read; one in flight is shared.
//! - Unread objects are held in memory while the budget has room. With a
//!   data cache they are written to it when opened, as an object read by its
//!   reader would be, or earlier when they leave memory (above).
//! - An object held longer than [`UNREAD_TTL`] without being opened is
//!   dropped and counted as waste (checked at every GET's end and open, and
//!   every minute while the mount is idle); one whose GET failed is dropped
//!   at once (its open reads it itself).
//! - A directory is scanned once per listing snapshot (the metadata TTL) and
//!   per round of reads over it: objects held, queued, opened in the current
//!   round or wholly in the data cache are skipped. A round starts with the
//!   first scan, and again when an object opened in the current round is
//!   read from S3 once more (its page cache is gone and it is read anew: the
//!   next epoch without a data cache), so that epoch is prefetched too.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::ReadConfig;
use super::budget::MemoryBudget;
use super::part::Part;
use crate::cache::Cache;
use crate::meta::{DirListing, EntryKind};
use crate::store::{ObjectStore, Segments, Urgency};
use crate::telemetry::metrics as m;

mod signs;
use signs::{Asked, Silenced, forgive};
pub use signs::{SILENCE, Sign};

/// An object prefetched but not opened for this long is dropped (waste). 10
/// minutes: a shuffled epoch over a directory's objects reads them within
/// one epoch, and an epoch over a data set the budget holds takes minutes;
/// memory of objects a loader never opens comes back.
pub const UNREAD_TTL: Duration = Duration::from_secs(600);

/// How long before a directory's round began an open may have come and
/// still count in that round: opens of several readers racing with the
/// scan of the first ([`SmallPrefetch::first_read`]).
const RACE_WINDOW: Duration = Duration::from_secs(1);

/// Directories remembered as scanned, and keys remembered as opened, at
/// most; the older half is forgotten beyond it (about 100 bytes each).
const MAX_REMEMBERED: usize = 1_000_000;

/// One object to fetch: key, ETag from its listing, size in bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Candidate {
    key: String,
    etag: String,
    size: u64,
}

/// The last scan of one directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Scan {
    /// When the listing it scanned was fetched.
    listing: Instant,
    /// When the current round of reads over the directory began.
    round: Instant,
}

/// What [`SmallPrefetch::take`] found for an open.
pub(crate) enum Taken {
    /// The object's prefetched GET (done or in flight), at the open's ETag.
    Prefetched(Part),
    /// Prefetched and written to the data cache, where the open reads it
    /// (unless the cache evicted it meanwhile).
    Cached,
    /// Nothing usable; when the object was opened before, when that was.
    Missed(Option<Instant>),
}

/// A prefetched object, in flight or done.
struct HeldObject {
    etag: String,
    size: u64,
    part: Part,
    since: Instant,
    /// The loader was seen at it ([`SmallPrefetch::consumed`]) before its
    /// push: a push that lands later frees its budget at once, as no later
    /// sign of the loader would.
    seen: bool,
}

#[derive(Default)]
struct Inner {
    /// Prefetched objects not opened yet, by key.
    held: HashMap<String, HeldObject>,
    /// Keys of `held` in the order they were sent, with when (the oldest
    /// first, for [`expire`]); stale pairs are skipped.
    order: VecDeque<(Instant, String)>,
    /// Bytes of `held` (in flight or done): in memory.
    unread: u64,
    /// Objects waiting for a prefetch GET, in scan order. A candidate whose
    /// key has left `queued` (opened meanwhile) is skipped.
    queue: VecDeque<Candidate>,
    /// Keys waiting in `queue`.
    queued: HashSet<String>,
    /// Key -> when it was last opened: a scan skips objects opened in the
    /// current round of its directory, since an epoch reads each once.
    opened: HashMap<String, Instant>,
    /// Directory prefix -> its last scan.
    scanned: HashMap<String, Scan>,
    /// Objects no longer in memory here and not seen read yet: put in the
    /// page cache ([`SmallPrefetch::delivered`]) or written to the data
    /// cache (a mount with opens), by key. At most [`MAX_REMEMBERED`]:
    /// prefetch waits beyond that.
    placed: HashMap<String, PlacedObject>,
    /// Bytes of `placed`.
    placed_bytes: u64,
    /// When the loader was last seen at a prefetched object (an open of
    /// one, or [`SmallPrefetch::consumed`] of one); not at others.
    seen_at: Option<Instant>,
    /// Since when the queue has waited at [`SmallPrefetch::ahead_cap`].
    capped_since: Option<Instant>,
    /// Objects of `placed` in the page cache ([`Placed::PageCache`]).
    pushed: usize,
    /// When objects listed at the last finding of a silent loader
    /// ([`Asked::AtFinding`]) stop counting ([`signs::SWITCH_GRACE`]).
    forgive_at: Option<Instant>,
    /// The last [`signs::ANSWERED`] keys answered by a sign the kernel sent.
    answered: VecDeque<String>,
    /// How long prefetch waits at its bound with no sign before the loader
    /// is found silent: [`signs::SILENCE`], or [`signs::SILENCE_AFTER_OWN`] once a sign of
    /// its own ended the asking. `None`: [`signs::SILENCE`].
    quiet_needed: Option<Duration>,
}

/// A prefetched object no longer in memory, not seen read yet.
struct PlacedObject {
    etag: String,
    size: u64,
    /// When its GET was sent, as in `order`.
    since: Instant,
    to: Placed,
    /// Whether a sign of the loader at it was asked for.
    asked: Asked,
}

impl Inner {
    /// Records `key` as placed outside memory; a copy placed before (the
    /// same key fetched again by a later scan) stops counting.
    fn place(&mut self, key: &str, obj: PlacedObject) {
        self.placed_bytes += obj.size;
        self.pushed += usize::from(obj.to == Placed::PageCache);
        if let Some(old) = self.placed.insert(key.to_string(), obj) {
            self.placed_bytes -= old.size;
            self.pushed -= usize::from(old.to == Placed::PageCache);
        }
    }

    /// Forgets placed object `key`, its bytes no longer counted.
    fn unplace(&mut self, key: &str) -> Option<PlacedObject> {
        let obj = self.placed.remove(key)?;
        self.placed_bytes -= obj.size;
        self.pushed -= usize::from(obj.to == Placed::PageCache);
        Some(obj)
    }
}

/// Where a prefetched object went when it left memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Placed {
    /// Its inode's page cache, and the data cache (a mount without opens).
    PageCache,
    /// The data cache only: its open reads it from there.
    DataCache,
}

/// How often held objects are checked for [`UNREAD_TTL`] while nothing else
/// happens (an idle mount gives their memory back).
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// The small-object prefetcher of one mount. Cheap to share (`Arc`).
pub struct SmallPrefetch<S> {
    store: Arc<S>,
    max_size: u64,
    max_in_flight: usize,
    unread_budget: u64,
    budget: MemoryBudget,
    cache: Option<Arc<Cache>>,
    inner: Mutex<Inner>,
    /// Prefetch GETs in flight. Outside `inner`: a GET's end is counted by a
    /// guard that may be dropped while `inner` is held (a task cancelled
    /// inline as the runtime shuts down).
    in_flight: AtomicUsize,
    /// The expiry sweeper runs (started by the first scan).
    sweeping: AtomicBool,
    /// Told of every object a prefetch GET fetched whole ([`Self::on_fetched`]).
    fetched: OnceLock<Fetched>,
    /// Told when the loader is found silent ([`Self::on_silent`]).
    silenced: OnceLock<Silenced>,
    /// The loader was found silent: pushed objects need a sign asked for.
    /// Set and cleared under `inner`.
    silent: AtomicBool,
    /// A task calls [`Self::pump`] again after [`SILENCE`].
    rechecking: AtomicBool,
    me: Weak<Self>,
}

/// What [`SmallPrefetch::on_fetched`] registers: called with key, ETag, size
/// in bytes and the object's bytes; returns whether it took the object.
type Fetched = Box<dyn Fn(&str, &str, u64, Bytes) -> bool + Send + Sync>;

impl<S: ObjectStore> SmallPrefetch<S> {
    /// The prefetcher over `store` with the `[read]` settings, drawing memory
    /// from `budget`; `None` when `read.small_max_size` is 0 (off).
    pub fn new(
        store: Arc<S>,
        config: &ReadConfig,
        budget: MemoryBudget,
        cache: Option<Arc<Cache>>,
    ) -> Option<Arc<Self>> {
        if config.small_max_size == 0 || config.small_max_in_flight == 0 {
            return None;
        }
        let unread_budget = config.small_budget_bytes(budget.total());
        if unread_budget == 0 {
            return None;
        }
        Some(Arc::new_cyclic(|me| Self {
            store,
            max_size: config.small_max_size,
            max_in_flight: config.small_max_in_flight,
            unread_budget,
            budget,
            cache,
            inner: Mutex::new(Inner::default()),
            in_flight: AtomicUsize::new(0),
            sweeping: AtomicBool::new(false),
            fetched: OnceLock::new(),
            silenced: OnceLock::new(),
            silent: AtomicBool::new(false),
            rechecking: AtomicBool::new(false),
            me: me.clone(),
        }))
    }

    /// Registers `f`, called on the GET's task with each object a prefetch
    /// GET fetched whole (key, ETag, size, bytes); it stays held until taken
    /// ([`Self::take`]) or delivered ([`Self::delivered`]). An object `f`
    /// does not take (it returns false) may leave memory for the data cache
    /// ([`Self::spill`]). Only the first registration counts.
    pub fn on_fetched(&self, f: impl Fn(&str, &str, u64, Bytes) -> bool + Send + Sync + 'static) {
        let _ = self.fetched.set(Box::new(f));
    }

    /// Whether an object of `size` bytes is small enough to prefetch.
    pub fn is_small(&self, size: u64) -> bool {
        size > 0 && size <= self.max_size
    }

    /// An open of `key` at `etag` (`size` bytes): the prefetched GET of the
    /// whole object when there is one at that ETag (done or in flight), for
    /// the reader to read from. A queued object leaves the queue (the open's
    /// own read fetches it); one held at another ETag is dropped.
    pub(crate) fn take(&self, key: &str, etag: &str, size: u64) -> Taken {
        let mut inner = self.inner.lock().unwrap();
        let now = Instant::now();
        let placed = inner.unplace(key);
        inner.queued.remove(key);
        let before = remember(&mut inner.opened, key, now);
        let held = inner.held.remove(key);
        if let Some(h) = &held {
            inner.unread -= h.size;
        }
        if placed.is_some() || held.is_some() {
            inner.seen_at = Some(now);
        }
        drop(inner);
        let Some(held) = held else {
            let Some(placed) = placed else {
                return Taken::Missed(before);
            };
            // Its budget is free: the next queued GETs may go.
            self.pump();
            if placed.to == Placed::PageCache {
                return Taken::Missed(before);
            }
            if placed.etag != etag || placed.size != size {
                metrics::counter!(m::SMALL_PREFETCH_DROPPED, "reason" => "changed").increment(1);
                return Taken::Missed(before);
            }
            metrics::counter!(m::SMALL_PREFETCH_HITS, "state" => "cached").increment(1);
            return Taken::Cached;
        };
        self.pump();
        let usable = held.etag == etag && held.size == size && !held.part.failed();
        if !usable {
            let label = if held.part.failed() {
                "failed"
            } else {
                "changed"
            };
            metrics::counter!(m::SMALL_PREFETCH_DROPPED, "reason" => label).increment(1);
            return Taken::Missed(before);
        }
        let state = if held.part.is_finished() {
            "ready"
        } else {
            "in_flight"
        };
        metrics::counter!(m::SMALL_PREFETCH_HITS, "state" => state).increment(1);
        self.admit(key, etag, size, &held.part);
        Taken::Prefetched(held.part)
    }

    /// Writes a prefetched object to the data cache once opened, as a
    /// reader's own GET would have been: here when the GET has ended (no
    /// task to wake), else by a task once it does. Needs a runtime context.
    fn admit(&self, key: &str, etag: &str, size: u64, part: &Part) {
        let Some(cache) = &self.cache else { return };
        let (_, ended, bytes) = part.wanted();
        match bytes.result() {
            Some(Ok(segs)) => cache.admit_object(key, etag, size, segs, true),
            Some(Err(_)) => {}
            None => {
                let (cache, key, etag) = (cache.clone(), key.to_string(), etag.to_string());
                tokio::spawn(async move {
                    if ended.await.is_ok()
                        && let Some(Ok(segs)) = bytes.result()
                    {
                        cache.admit_object(&key, &etag, size, segs, true);
                    }
                });
            }
        }
    }

    /// Object `key` (at `etag`, `size` bytes), fetched by a prefetch GET,
    /// was put in the kernel page cache of its inode (a mount without
    /// opens): it is written to the data cache as an open's take would
    /// write it, and its memory goes back to the unread budget. It stays
    /// counted against [`Self::ahead_cap`] until the loader is seen at it
    /// ([`Self::consumed`], or a read of it: [`Self::take`]) or
    /// [`UNREAD_TTL`] passes, so that bound still limits how far prefetch
    /// runs ahead of the loader. Counted as a hit now (state `pushed`), and
    /// none of its bytes as unused: whether the page cache kept it until the
    /// loader read it is not known here. `asked`: its attributes were made
    /// stale before the store. Returns whether a sign of the loader at it
    /// is to be asked for ([`Self::wants_read_signal`] as it was when the
    /// object was placed). Needs a runtime context.
    pub(crate) fn delivered(&self, key: &str, etag: &str, size: u64, asked: bool) -> bool {
        let mut inner = self.inner.lock().unwrap();
        let ask = self.silent.load(Ordering::Relaxed);
        match inner.held.get(key) {
            Some(h) if h.etag == etag && h.size == size && !h.part.failed() => {}
            _ => return false,
        }
        let mut held = inner.held.remove(key).expect("held above");
        inner.unread -= held.size;
        if !held.seen {
            let obj = PlacedObject {
                etag: held.etag.clone(),
                size: held.size,
                since: held.since,
                to: Placed::PageCache,
                // Found silent between its store and now: it may have been
                // read meanwhile, with fresh attributes.
                asked: match (ask, asked) {
                    (false, _) => Asked::Not,
                    (true, true) => Asked::AtPush,
                    (true, false) => Asked::AtFinding,
                },
            };
            inner.place(key, obj);
        }
        drop(inner);
        // Handed to the kernel whole: none of it is unused read-ahead.
        let _ = held.part.deliver(0, u64::MAX);
        metrics::counter!(m::SMALL_PREFETCH_HITS, "state" => "pushed").increment(1);
        self.admit(key, etag, size, &held.part);
        // Its memory comes back (dropping `held`), seen or not.
        drop(held);
        self.pump();
        ask
    }

    /// Object `key` (at `etag`, `size` bytes), fetched whole by a prefetch
    /// GET and not pushed to the page cache, with a data cache, when keeping
    /// it would leave no room in the unread budget for an object of the
    /// largest small size and the cache's write queue has room for it (else
    /// it would be dropped unwritten): written to the data cache now and
    /// dropped from memory, so that budget (memory) does not bound how far
    /// prefetch runs ahead of the loader; it counts against
    /// [`Self::ahead_cap`] until its open ([`Taken::Cached`]) or
    /// [`UNREAD_TTL`]. Otherwise it stays in memory until opened (an open
    /// served from memory costs less than one served from the cache), and
    /// what stays never keeps the next object out. Called on the task of the
    /// GET sent at `since`.
    fn spill(&self, key: &str, etag: &str, size: u64, since: Instant, bytes: &Bytes) {
        let Some(cache) = &self.cache else { return };
        let mut held = {
            let mut inner = self.inner.lock().unwrap();
            if inner.unread + self.max_size <= self.unread_budget || !cache.disk().may_queue(size) {
                return;
            }
            match inner.held.get(key) {
                Some(h) if h.since == since && h.etag == etag && h.size == size => {}
                _ => return,
            }
            let held = inner.held.remove(key).expect("held above");
            inner.unread -= held.size;
            let obj = PlacedObject {
                etag: held.etag.clone(),
                size: held.size,
                since,
                to: Placed::DataCache,
                asked: Asked::Not,
            };
            inner.place(key, obj);
            held
        };
        cache.admit_object(key, etag, size, &Segments::from(bytes.clone()), false);
        // Not unused read-ahead: the cache has it whole. Dropping the part
        // cannot cancel this task, which ends without yielding again.
        let _ = held.part.deliver(0, u64::MAX);
        drop(held);
        self.pump();
    }

    /// The loader was seen at `key` (`sign`: Python's `open` sends an
    /// ioctl; a loader asked for a sign sends a GETATTR or LOOKUP): an
    /// object put in the page cache for it no longer counts as unread, and
    /// one still being fetched or pushed stops counting when its push lands.
    /// A sign the kernel sent counts only while signs are asked for
    /// ([`Self::on_silent`]): before, it may be anyone's stat (`ls -l`,
    /// `du`). A sign of the loader's own at a prefetched object, or at one a
    /// kernel's sign answered just before, ends the asking.
    pub(crate) fn consumed(&self, key: &str, sign: Sign) {
        let mut inner = self.inner.lock().unwrap();
        if !self.note_sign(&mut inner, key, sign) {
            return;
        }
        if inner
            .placed
            .get(key)
            .is_some_and(|p| p.to == Placed::DataCache)
        {
            // Its open reads it from the data cache: that is the sign.
            return;
        }
        if inner.unplace(key).is_none() {
            // Not pushed yet (its GET or its push under way): the push, if
            // it lands before the loader's read, frees the budget then.
            if let Some(h) = inner.held.get_mut(key) {
                h.seen = true;
            }
            return;
        }
        drop(inner);
        self.pump();
    }

    /// The first read of an open of small object `key` in directory
    /// `prefix` that found nothing prefetched (`opened_before` from
    /// [`Taken::Missed`]). A copy of `key` queued or fetched since that open
    /// was put there by another reader's scan racing with it (the open took
    /// any earlier one out): it is dropped, as the opener reads `key`
    /// itself; and when `key` was opened shortly before the directory's
    /// round began, the round is moved back to that open, so a scan still
    /// running skips `key` too. Returns whether the miss may lead
    /// [`SmallPrefetch::missed`] to scan: not while the directory's last
    /// scan, in the current round, is of a listing fetched less than `ttl`
    /// (the metadata TTL) ago, which is the case of every open after a
    /// directory's first in a round. Called on the opening thread, to spare
    /// those opens a task each. (A listing fetched anew within its TTL is
    /// then scanned at the next round.)
    pub fn first_read(
        &self,
        key: &str,
        prefix: &str,
        opened_before: Option<Instant>,
        ttl: Duration,
    ) -> bool {
        let mut inner = self.inner.lock().unwrap();
        let duplicate = racing_copy(&mut inner, key, prefix);
        let scan = match inner.scanned.get(prefix) {
            Some(s) => opened_before.is_some_and(|t| t >= s.round) || s.listing.elapsed() >= ttl,
            None => true,
        };
        drop(inner);
        // Dropped after the lock: dropping a part may cancel its GET.
        drop(duplicate);
        scan
    }

    /// Small object `key` in directory `prefix` was read through lakemount
    /// with nothing prefetched (`opened_before`: its previous open, from
    /// [`Taken::Missed`]): queues the directory's other small objects
    /// (`listing`) and starts fetching, unless this listing snapshot was
    /// scanned already in the current round. Skipped: objects held, queued,
    /// opened in the current round or wholly in the data cache. A new round
    /// starts at `key`'s open, so `key` is not fetched again.
    pub async fn missed(
        &self,
        key: &str,
        prefix: &str,
        listing: Arc<DirListing>,
        opened_before: Option<Instant>,
    ) {
        if !self.sweeping.swap(true, Ordering::Relaxed) {
            let me = self.me.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(SWEEP_EVERY).await;
                    let Some(me) = me.upgrade() else { break };
                    me.pump();
                }
            });
        }
        let (round, duplicate) = {
            let mut inner = self.inner.lock().unwrap();
            let now = inner.opened.get(key).copied().unwrap_or_else(Instant::now);
            // A scan of another reader's first read may have run since
            // this key's first read looked.
            let duplicate = racing_copy(&mut inner, key, prefix);
            let scan = match inner.scanned.get(prefix).copied() {
                // Read again in this round: the next round (epoch) began.
                Some(s) if opened_before.is_some_and(|t| t >= s.round) => Scan {
                    listing: listing.fetched,
                    round: now,
                },
                Some(s) if s.listing == listing.fetched => {
                    drop(inner);
                    drop(duplicate);
                    self.pump();
                    return;
                }
                Some(s) => Scan {
                    listing: listing.fetched,
                    round: s.round.min(now),
                },
                None => Scan {
                    listing: listing.fetched,
                    round: now,
                },
            };
            remember(&mut inner.scanned, prefix, scan);
            (scan.round, duplicate)
        };
        drop(duplicate);
        let candidates: Vec<Candidate> = listing
            .entries
            .iter()
            .filter(|e| e.kind == EntryKind::File && self.is_small(e.size))
            .map(|e| Candidate {
                key: format!("{prefix}{}", e.name),
                etag: e.etag.clone(),
                size: e.size,
            })
            .collect();
        // Objects wholly in the data cache need no GET (looking that up may
        // read block maps from disk).
        let candidates = match &self.cache {
            Some(cache) => {
                let cache = cache.clone();
                tokio::task::spawn_blocking(move || {
                    candidates
                        .into_iter()
                        .filter(|c| cache.cached_bytes(&c.key, &c.etag, c.size) < c.size)
                        .collect()
                })
                .await
                .unwrap_or_default()
            }
            None => candidates,
        };
        {
            let mut inner = self.inner.lock().unwrap();
            // A racing open may have moved the round's start earlier.
            let round = inner
                .scanned
                .get(prefix)
                .map_or(round, |s| s.round.min(round));
            for c in candidates {
                let opened_this_round = inner.opened.get(&c.key).is_some_and(|t| *t >= round);
                if !opened_this_round
                    && !inner.held.contains_key(&c.key)
                    && !inner.placed.contains_key(&c.key)
                    && inner.queued.insert(c.key.clone())
                {
                    inner.queue.push_back(c);
                }
            }
        }
        self.pump();
    }

    /// Sends queued GETs while fewer than `max_in_flight` are in flight and
    /// the next object fits the unread budget (and the memory budget); drops
    /// objects unread for [`UNREAD_TTL`] first.
    fn pump(&self) {
        // Before `inner`: it may look at the cache's file system.
        let ahead_cap = self.ahead_cap();
        let mut inner = self.inner.lock().unwrap();
        let now = Instant::now();
        // Dropped after the lock: dropping a part may cancel its GET.
        let expired = expire(&mut inner, now);
        forgive(&mut inner, now);
        let mut capped = false;
        while self.in_flight.load(Ordering::Relaxed) < self.max_in_flight {
            let Some(c) = inner.queue.front() else { break };
            if !inner.queued.contains(&c.key)
                || inner.held.contains_key(&c.key)
                || inner.placed.contains_key(&c.key)
            {
                inner.queue.pop_front();
                continue;
            }
            capped = inner.unread + inner.placed_bytes + c.size > ahead_cap
                || inner.placed.len() >= MAX_REMEMBERED;
            if capped || inner.unread + c.size > self.unread_budget {
                break;
            }
            let Some(reservation) = self.budget.try_reserve(c.size) else {
                metrics::counter!(m::PREFETCH_BUDGET_REFUSALS).increment(1);
                break;
            };
            let c = inner.queue.pop_front().expect("front exists");
            inner.queued.remove(&c.key);
            self.in_flight.fetch_add(1, Ordering::Relaxed);
            inner.unread += c.size;
            metrics::gauge!(m::SMALL_PREFETCH_IN_FLIGHT).increment(1.0);
            let mut ended = InFlight {
                me: self.me.clone(),
                key: c.key.clone(),
                since: now,
                failed: true,
            };
            let store = self.store.clone();
            let (key, etag, size) = (c.key.clone(), c.etag.clone(), c.size);
            let urgency = Urgency::ahead();
            let u = urgency.clone();
            let me = self.me.clone();
            let part = Part::spawn(0, size, reservation, urgency, async move {
                let got = store.get_range_ahead(&key, 0..size, &etag, u).await;
                if got.is_ok() {
                    metrics::counter!(m::SMALL_PREFETCH_OBJECTS).increment(1);
                    metrics::counter!(m::SMALL_PREFETCH_BYTES).increment(size);
                }
                ended.failed = got.is_err();
                drop(ended);
                if let (Ok(bytes), Some(me)) = (&got, me.upgrade()) {
                    let taken = me
                        .fetched
                        .get()
                        .is_some_and(|f| f(&key, &etag, size, bytes.clone()));
                    if !taken {
                        me.spill(&key, &etag, size, now, bytes);
                    }
                }
                got.map(Segments::from)
            });
            inner.order.push_back((now, c.key.clone()));
            inner.held.insert(
                c.key,
                HeldObject {
                    etag: c.etag,
                    size: c.size,
                    part,
                    since: now,
                    seen: false,
                },
            );
        }
        metrics::gauge!(m::SMALL_PREFETCH_UNREAD_BYTES)
            .set((inner.unread + inner.placed_bytes) as f64);
        let silenced = self.silence(&mut inner, capped, now);
        drop(inner);
        drop(expired);
        if let (Some(pushed), Some(f)) = (silenced, self.silenced.get()) {
            tracing::info!(
                objects = pushed.len(),
                "small-object read-ahead: no sign of the loader at prefetched files while it \
                 waits at its bound; their reads now send one (a GETATTR each)"
            );
            f(pushed);
        }
    }

    /// Most bytes prefetch may run ahead of the loader, in memory and placed
    /// out of it together: the unread budget; with a data cache, at least
    /// half the cache's size limit, since a placed object is held by the
    /// data cache (and the page cache, when pushed), not in memory. Half:
    /// what prefetch adds while the other half holds what the loader read
    /// leaves older entries to evict first. A loader that sends no request
    /// per file (C or Rust readers, CPython 3.14+ whose `open` skips
    /// `isatty` on regular files) is not seen at pushed objects until the
    /// kernel is asked for a sign ([`Self::on_silent`]), so prefetch runs up
    /// to this bound and waits there [`SILENCE`] first.
    fn ahead_cap(&self) -> u64 {
        let cache_half = self
            .cache
            .as_ref()
            .map_or(0, |c| c.disk().limit_bytes() / 2);
        self.unread_budget.max(cache_half)
    }

    /// Bytes fetched (or being fetched) and not opened yet, placed ones
    /// included.
    #[cfg(test)]
    fn unread_bytes(&self) -> u64 {
        let inner = self.inner.lock().unwrap();
        inner.unread + inner.placed_bytes
    }

    /// Objects waiting for a prefetch GET.
    #[cfg(test)]
    fn queued(&self) -> usize {
        self.inner.lock().unwrap().queue.len()
    }
}

/// Ends one prefetch GET when dropped (its task finished or was cancelled):
/// one fewer in flight; on the runtime, a failed object's entry goes (it
/// would hold budget until it expired) and the next queued GETs are sent.
/// Never takes `inner` itself: it may be dropped while `inner` is held.
struct InFlight<S: ObjectStore> {
    me: Weak<SmallPrefetch<S>>,
    key: String,
    since: Instant,
    failed: bool,
}

impl<S: ObjectStore> Drop for InFlight<S> {
    fn drop(&mut self) {
        metrics::gauge!(m::SMALL_PREFETCH_IN_FLIGHT).decrement(1.0);
        let Some(me) = self.me.upgrade() else { return };
        me.in_flight.fetch_sub(1, Ordering::Relaxed);
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (key, since, failed) = (std::mem::take(&mut self.key), self.since, self.failed);
        rt.spawn(async move {
            let dropped = failed.then(|| me.forget_failed(&key, since)).flatten();
            me.pump();
            drop(dropped);
        });
    }
}

impl<S: ObjectStore> SmallPrefetch<S> {
    /// Removes held object `key` sent at `since` (its GET failed) and
    /// returns it, for the caller to drop outside the lock.
    fn forget_failed(&self, key: &str, since: Instant) -> Option<HeldObject> {
        let mut inner = self.inner.lock().unwrap();
        if inner.held.get(key).is_none_or(|h| h.since != since) {
            return None;
        }
        let h = inner.held.remove(key)?;
        inner.unread -= h.size;
        metrics::counter!(m::SMALL_PREFETCH_DROPPED, "reason" => "failed").increment(1);
        Some(h)
    }
}

/// Removes held objects sent at or before `now - UNREAD_TTL` and returns
/// them (counted as dropped; their bytes as unused read-ahead). Placed
/// objects stop counting against the bound: pushed ones the loader was
/// never seen at were counted as hits when pushed, so nothing else counts
/// them; ones in the data cache never opened count as dropped.
fn expire(inner: &mut Inner, now: Instant) -> Vec<HeldObject> {
    let mut out = Vec::new();
    while let Some((since, key)) = inner.order.front() {
        let current = inner.held.get(key).is_some_and(|h| h.since == *since);
        let placed = inner.placed.get(key).is_some_and(|p| p.since == *since);
        if (current || placed) && now.duration_since(*since) < UNREAD_TTL {
            break;
        }
        let (_, key) = inner.order.pop_front().expect("front exists");
        if current && let Some(h) = inner.held.remove(&key) {
            inner.unread -= h.size;
            metrics::counter!(m::SMALL_PREFETCH_DROPPED, "reason" => "expired").increment(1);
            out.push(h);
        } else if placed && let Some(obj) = inner.unplace(&key) {
            // Out of memory, never seen read: its budget comes back. One
            // in the data cache and never opened was fetched for nothing.
            if obj.to == Placed::DataCache {
                metrics::counter!(m::SMALL_PREFETCH_DROPPED, "reason" => "expired").increment(1);
            }
        }
    }
    out
}

/// `key`, opened with nothing prefetched, is read by its opener: a copy a
/// racing scan queued or fetched since that open (the open took any earlier
/// one out) is taken out and returned, to be dropped outside the lock; and
/// when `key` was opened shortly before the round of `prefix` began, the
/// round is moved back to that open, so a scan still running skips `key`.
fn racing_copy(inner: &mut Inner, key: &str, prefix: &str) -> Option<HeldObject> {
    inner.queued.remove(key);
    let copy = inner.held.remove(key);
    if let Some(h) = &copy {
        inner.unread -= h.size;
        metrics::counter!(m::SMALL_PREFETCH_DROPPED, "reason" => "opened").increment(1);
    }
    if let (Some(t), Some(s)) = (
        inner.opened.get(key).copied(),
        inner.scanned.get(prefix).copied(),
    ) && t < s.round
        && s.round - t <= RACE_WINDOW
    {
        remember(&mut inner.scanned, prefix, Scan { round: t, ..s });
    }
    copy
}

/// Records `key` -> `v` in a map of at most [`MAX_REMEMBERED`] entries (an
/// arbitrary half goes when it is full); returns the value it replaces.
fn remember<V>(map: &mut HashMap<String, V>, key: &str, v: V) -> Option<V> {
    if map.len() >= MAX_REMEMBERED && !map.contains_key(key) {
        let mut n = 0usize;
        map.retain(|_, _| {
            n += 1;
            n.is_multiple_of(2)
        });
    }
    map.insert(key.to_string(), v)
}

#[cfg(test)]
mod tests;
