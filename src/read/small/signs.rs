//! Asking a silent loader for a sign. On a mount without opens, objects
//! pushed to the page cache count against [`SmallPrefetch::ahead_cap`] until
//! the loader is seen at them, and a loader that sends no request per file
//! (C, Rust, CPython 3.14+) is never seen. When prefetch has waited at that
//! bound for [`SILENCE`] with no sign, the loader is found silent: pushed
//! objects get stale kernel attributes (by the caller of
//! [`SmallPrefetch::on_silent`]), so their reads send a GETATTR or LOOKUP,
//! which count as signs ([`Sign::Kernel`]) while the asking lasts
//! (docs/READAHEAD.md, "A silent loader is asked for a sign").

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{Inner, Placed, SmallPrefetch};
use crate::store::ObjectStore;

/// How long prefetch waits at [`SmallPrefetch::ahead_cap`] with no sign of
/// the loader at a prefetched object before it asks the kernel for one
/// ([`SmallPrefetch::on_silent`]). A loader that sends a request per file
/// (an open, or Python's ioctl) gives one every few milliseconds while it
/// reads; one second of none while prefetch waits is a loader that sends
/// none, or one that paused.
pub const SILENCE: Duration = Duration::from_secs(1);

/// How long prefetch waits at its bound with no sign before the loader is
/// found silent again, after a sign of the loader's own ended the asking: a
/// slow Python loader is not switched back and forth every second.
pub(super) const SILENCE_AFTER_OWN: Duration = Duration::from_secs(60);

/// Objects pushed before the loader was found silent that it does not
/// answer for this long after stop counting against
/// [`SmallPrefetch::ahead_cap`]: it may have read them before it was asked
/// for a sign, and then never sends one for them.
pub(super) const SWITCH_GRACE: Duration = Duration::from_secs(10);

/// Keys answered by a sign the kernel sent while the loader is asked for
/// signs, remembered so that its own sign coming after (Python's `open`
/// makes `fstat`, a GETATTR, before its ioctl) still ends the asking.
pub(super) const ANSWERED: usize = 64;

/// How a loader was seen at a prefetched object
/// ([`SmallPrefetch::consumed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sign {
    /// A request the loader sends of itself for each file it reads: Python's
    /// ioctl (TCGETS, from `isatty`). A loader that sends it is not silent.
    Own,
    /// A request the kernel sends for it: a GETATTR (stale attributes) or a
    /// LOOKUP (an expired entry) of the file.
    Kernel,
}

/// Whether a sign of the loader at a pushed object was asked for (its
/// kernel attributes made stale; [`SmallPrefetch::on_silent`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Asked {
    /// No: pushed while the loader was not found silent.
    Not,
    /// At its push, the loader being found silent.
    AtPush,
    /// When the loader was found silent, after its push: it may have been
    /// read already, so it stops counting at [`Inner::forgive_at`].
    AtFinding,
}

/// What [`SmallPrefetch::on_silent`] registers: called with key, ETag and
/// size in bytes of each object pushed to the page cache and not seen read.
pub(super) type Silenced = Box<dyn Fn(Vec<(String, String, u64)>) + Send + Sync>;

impl<S: ObjectStore> SmallPrefetch<S> {
    /// Registers `f`, called off the prefetcher's lock when prefetch has
    /// waited at [`Self::ahead_cap`] for [`SILENCE`] and the loader was not
    /// seen at a prefetched object meanwhile (a loader that sends no request
    /// per file: C or Rust readers, CPython 3.14+): with every object pushed
    /// to the page cache ([`Self::delivered`]), not seen read and not asked
    /// a sign of yet (key, ETag, size), whose reads should then send the
    /// kernel's request that [`Self::consumed`] is told of ([`Sign::Kernel`]).
    /// From then on [`Self::wants_read_signal`] is true, until the loader
    /// sends a sign of its own ([`Sign::Own`]; the next finding then needs
    /// [`SILENCE_AFTER_OWN`]); those of the listed objects it does not
    /// answer for within [`SWITCH_GRACE`] stop counting. Only the first
    /// registration counts.
    pub fn on_silent(&self, f: impl Fn(Vec<(String, String, u64)>) + Send + Sync + 'static) {
        let _ = self.silenced.set(Box::new(f));
    }

    /// Whether objects pushed to the page cache from now on should make
    /// their reads send a request ([`Self::on_silent`]).
    pub fn wants_read_signal(&self) -> bool {
        self.silent.load(Ordering::Relaxed)
    }

    /// Whether `key` was pushed to the page cache and a sign of the loader
    /// at it is asked for ([`Self::on_silent`]): the kernel should keep its
    /// attributes for no time, so that the loader's stat or open sends one.
    pub fn awaits_sign(&self, key: &str) -> bool {
        self.wants_read_signal()
            && self
                .inner
                .lock()
                .unwrap()
                .placed
                .get(key)
                .is_some_and(|p| p.to == Placed::PageCache)
    }

    /// Whether the loader is found silent now (see [`Self::on_silent`]),
    /// with the queue waiting at [`Self::ahead_cap`] (`capped`): the pushed
    /// objects not seen read, once per finding. While the queue waits and
    /// the loader is not found silent, a task looks again after [`SILENCE`].
    pub(super) fn silence(
        &self,
        inner: &mut Inner,
        capped: bool,
        now: Instant,
    ) -> Option<Vec<(String, String, u64)>> {
        if !capped {
            inner.capped_since = None;
            return None;
        }
        let since = *inner.capped_since.get_or_insert(now);
        if self.silent.load(Ordering::Relaxed) || self.silenced.get().is_none() {
            return None;
        }
        let needed = inner.quiet_needed.unwrap_or(SILENCE);
        let quiet = |t: Instant| now.duration_since(t) >= needed;
        if quiet(since) && inner.seen_at.is_none_or(quiet) && inner.pushed > 0 {
            let mut pushed = Vec::new();
            for (k, p) in inner.placed.iter_mut() {
                if p.to == Placed::PageCache && p.asked == Asked::Not {
                    p.asked = Asked::AtFinding;
                    pushed.push((k.clone(), p.etag.clone(), p.size));
                }
            }
            inner.forgive_at = Some(now + SWITCH_GRACE);
            self.silent.store(true, Ordering::Relaxed);
            self.pump_after(SWITCH_GRACE, |_| ());
            return Some(pushed);
        }
        if tokio::runtime::Handle::try_current().is_ok()
            && !self.rechecking.swap(true, Ordering::Relaxed)
        {
            self.pump_after(SILENCE, |me| me.rechecking.store(false, Ordering::Relaxed));
        }
        None
    }

    /// Calls [`Self::pump`] from a task after `delay`, `first` before it;
    /// nothing without a runtime.
    fn pump_after(&self, delay: Duration, first: fn(&Self)) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let me = self.me.clone();
        rt.spawn(async move {
            tokio::time::sleep(delay).await;
            if let Some(me) = me.upgrade() {
                first(&me);
                me.pump();
            }
        });
    }

    /// Takes `sign` of the loader at `key` into the asking
    /// ([`Self::on_silent`]), under `inner`: false when it counts for
    /// nothing (a sign the kernel sent while none is asked for: anyone's
    /// stat). A sign of the loader's own at a prefetched object, or at one
    /// a kernel's sign answered just before, ends the asking.
    pub(super) fn note_sign(&self, inner: &mut Inner, key: &str, sign: Sign) -> bool {
        let asking = self.silent.load(Ordering::Relaxed);
        if sign == Sign::Kernel && !asking {
            return false;
        }
        let known = inner.placed.contains_key(key) || inner.held.contains_key(key);
        if asking && sign == Sign::Own && (known || inner.answered.iter().any(|k| k == key)) {
            self.silent.store(false, Ordering::Relaxed);
            inner.quiet_needed = Some(SILENCE_AFTER_OWN);
            inner.answered.clear();
            // This loader signs each file: nothing needs forgiving, and the
            // next finding asks again for all it lists.
            inner.forgive_at = None;
            for p in inner.placed.values_mut() {
                p.asked = Asked::Not;
            }
            tracing::info!(
                "small-object read-ahead: the loader sends a request per file again; \
                 pushed files no longer get stale attributes"
            );
        }
        if known {
            inner.seen_at = Some(Instant::now());
            if sign == Sign::Kernel {
                if inner.answered.len() >= ANSWERED {
                    inner.answered.pop_front();
                }
                inner.answered.push_back(key.to_string());
            }
        }
        true
    }
}

/// Objects pushed before the loader was found silent and not answered for
/// within [`SWITCH_GRACE`] stop counting against the bound: the loader may
/// have read them before it was asked for a sign ([`Asked::AtFinding`]).
pub(super) fn forgive(inner: &mut Inner, now: Instant) {
    if inner.forgive_at.is_none_or(|at| now < at) {
        return;
    }
    inner.forgive_at = None;
    let listed: Vec<String> = inner
        .placed
        .iter()
        .filter(|(_, p)| p.asked == Asked::AtFinding)
        .map(|(k, _)| k.clone())
        .collect();
    for key in listed {
        inner.unplace(&key);
    }
}
